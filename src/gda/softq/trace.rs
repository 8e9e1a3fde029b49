//! The consumer's event trace, for finding where a round's time goes (`NVSHMEM_EFA_SOFT_TRACE=PREFIX`):
//! every consumer thread records its events (WQEs taken, copies launched and done, SENDs posted and
//! completed, CQ reads, AMO batches applied, answers sent) with a wall-clock time in nanoseconds,
//! up to a fixed count, and writes them when it stops to `PREFIX.pe<PE>.t<THREAD>.csv`
//! (`unix_ns,event,a,b`; what `a` and `b` are is [`Event`]'s). Processes of one host share the
//! clock, so the traces of two PEs line up. Off by default; a benchmark-only aid (one clock read
//! per event), loud in the log when on. `tests/bench/softq_trace.py` prints a trace's timeline.
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Events a trace holds, each with two numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// A consumer pass took WQEs: `a` WQEs.
    Take,
    /// The copies of a pass were enqueued: `a` copies, `b` 1 for a copy-kernel launch, 0 else.
    CopyLaunch,
    /// Copy WQEs completed: `a` of them.
    CopyDone,
    /// A SEND (an AMO message) was handed to the provider: `a` its ring, `b` its PE.
    Send,
    /// The provider refused a SEND for now (`-FI_EAGAIN`): `a` its ring, `b` its PE (a packed
    /// SEND: `a` its AMOs, `b` 1 << 31).
    SendRefused,
    /// A packed SEND (answered AMOs to one PE) was handed to the provider: `a` its AMOs.
    SendPacked,
    /// The consumer loop was away 50 us or more between two passes (its idle backoff, or the
    /// thread was not running): `a` microseconds.
    Gap,
    /// A SEND's WQE completed (answered): `a` its ring, `b` microseconds since it was posted.
    SendDone,
    /// A read of the provider's CQ returned `a` entries.
    Cq,
    /// An AMO batch was applied: `a` AMOs, `b` microseconds it took.
    AmoBatch,
    /// A received SEND was answered: `a` the sender's PE.
    Answer,
    /// A consumer pass took 50 us or more: `a` microseconds, `b` the part that took longest (0
    /// the provider's CQ, 1 copies and held AMOs, 2 hand-overs, receive batch and outbox, 3 taking
    /// WQEs).
    SlowPass,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Take => "take",
            Event::CopyLaunch => "copy_launch",
            Event::CopyDone => "copy_done",
            Event::Send => "send",
            Event::SendRefused => "send_refused",
            Event::SendPacked => "send_packed",
            Event::Gap => "gap",
            Event::SendDone => "send_done",
            Event::Cq => "cq",
            Event::AmoBatch => "amo_batch",
            Event::Answer => "answer",
            Event::SlowPass => "slow_pass",
        }
    }
}

/// Most events one thread records (then it stops recording and says so in the file's last line).
const CAP: usize = 1 << 20;

pub(super) struct Trace {
    prefix: String,
    start: Instant,
    start_unix_ns: u64,
    events: Vec<(u64, Event, u32, u32)>,
    dropped: u64,
}

impl Trace {
    /// The trace `NVSHMEM_EFA_SOFT_TRACE` asks for (None when unset or empty).
    pub(super) fn from_env() -> Option<Box<Trace>> {
        let prefix = std::env::var("NVSHMEM_EFA_SOFT_TRACE").ok()?;
        if prefix.is_empty() {
            return None;
        }
        tracing::warn!(
            "software queue: event trace on (NVSHMEM_EFA_SOFT_TRACE={prefix}): a clock read per \
             event, for finding where time goes, not for production"
        );
        Some(Box::new(Trace::new(prefix)))
    }

    pub(super) fn new(prefix: String) -> Trace {
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Trace {
            prefix,
            start: Instant::now(),
            start_unix_ns,
            events: Vec::with_capacity(4096),
            dropped: 0,
        }
    }

    pub(super) fn note(&mut self, e: Event, a: u32, b: u32) {
        if self.events.len() >= CAP {
            self.dropped += 1;
            return;
        }
        let ns = self.start_unix_ns + self.start.elapsed().as_nanos() as u64;
        self.events.push((ns, e, a, b));
    }

    /// The file of PE `pe`'s thread `thread`.
    pub(super) fn path(&self, pe: i32, thread: usize) -> String {
        format!("{}.pe{pe}.t{thread}.csv", self.prefix)
    }

    /// The CSV text.
    pub(super) fn csv(&self) -> String {
        let mut s = String::with_capacity(32 * (self.events.len() + 2));
        s.push_str("unix_ns,event,a,b\n");
        for &(ns, e, a, b) in &self.events {
            s.push_str(&format!("{ns},{},{a},{b}\n", e.name()));
        }
        if self.dropped > 0 {
            s.push_str(&format!(
                "# {} later events not recorded (cap {CAP})\n",
                self.dropped
            ));
        }
        s
    }

    /// Writes the trace of PE `pe`'s thread `thread` (logged; an error is logged, not raised).
    pub(super) fn write(&self, pe: i32, thread: usize) {
        let path = self.path(pe, thread);
        match std::fs::write(&path, self.csv()) {
            Ok(()) => tracing::info!(
                "software queue trace: {} events -> {path}",
                self.events.len()
            ),
            Err(e) => tracing::warn!("software queue trace: cannot write {path}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_in_order_and_writes_csv_rows() {
        let mut t = Trace::new("/tmp/x".into());
        t.note(Event::Take, 3, 0);
        t.note(Event::AmoBatch, 20, 45);
        let csv = t.csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "unix_ns,event,a,b");
        assert_eq!(lines.len(), 3);
        assert!(lines[1].ends_with(",take,3,0"), "{}", lines[1]);
        assert!(lines[2].ends_with(",amo_batch,20,45"), "{}", lines[2]);
        let ns = |l: &str| l.split(',').next().unwrap().parse::<u64>().unwrap();
        assert!(ns(lines[1]) <= ns(lines[2]));
        assert!(
            ns(lines[1]) > 1_600_000_000_000_000_000,
            "wall-clock nanoseconds"
        );
        assert_eq!(t.path(1, 2), "/tmp/x.pe1.t2.csv");
    }

    #[test]
    fn stops_recording_at_the_cap_and_says_so() {
        let mut t = Trace::new("/tmp/x".into());
        for _ in 0..CAP + 5 {
            t.note(Event::Cq, 1, 0);
        }
        assert_eq!(t.events.len(), CAP);
        assert!(t
            .csv()
            .ends_with("# 5 later events not recorded (cap 1048576)\n"));
    }
}
