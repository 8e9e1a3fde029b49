//! Per-stage counters and a debug timeline of the data paths, to see where a transfer waits.
//!
//! Counters (always on, a few relaxed atomics per chunk): per [`Stage`], how often it happened, the
//! bytes, and — when target `nvshmem_efa_gda::stages` logs at debug level — the total and longest
//! time spent in it.
//! [`Stats::summary`] renders them; the transport logs the summary when a quiet is still waiting
//! after 2 s and at finalize (debug).
//!
//! Timeline (debug level, target `nvshmem_efa_gda::timeline`): for sampled operations (the first
//! of at least [`TIMELINE_MIN_BYTES`] and every [`TIMELINE_EVERY`]-th one after it) one line per
//! stage event with microseconds since the process's first stamp, the pid, the chunk's token (its
//! waiting context at the initiator) and the chunk's remote address. Initiator and target lines of
//! a chunk carry the same token and address (the flag travels in the staged message), so merging
//! both PEs' logs by time shows one large put: chunk posted → send completed → target copy
//! start/end → response queued/sent → response received. The clocks of two processes on one host
//! are the same monotonic clock, but each log counts from its own first stamp: compare durations
//! within a PE, and order across PEs by the token/address pairs.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Operations of at least this many bytes are candidates for the timeline.
pub const TIMELINE_MIN_BYTES: u64 = 1 << 20;
/// Every this-many-th candidate is traced (the first one included).
pub const TIMELINE_EVERY: u64 = 64;

/// A stage of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Stage {
    /// Initiator: waiting for a free send slot.
    SlotWait,
    /// Initiator: copying a put chunk out of its source into a send slot.
    CopyOut,
    /// Initiator: a chunk's message posted to the provider (retries included).
    ChunkPost,
    /// Initiator: a chunk's send completion reaped (time since its post).
    SendDone,
    /// Target: copying a received put chunk into place.
    TargetCopy,
    /// Target: a response (or get data) queued for sending.
    Response,
    /// Target: a response left the pending queue (time spent queued).
    ResponseSent,
    /// Initiator: a chunk's response received (time since its post); target-applied AMOs'
    /// responses are counted here too, untimed.
    ResponseRecv,
    /// Initiator: copying get data into place.
    CopyIn,
    /// A same-host copy enqueued on the copy engine.
    IpcSubmit,
    /// Waiting for the copy engine in quiet.
    IpcQuiet,
    /// A quiet of the transport (whole wait).
    Quiet,
    /// A kernel atomic launched (ordering event, stream wait, launch).
    KernelAmo,
}

const STAGES: usize = 13;
const NAMES: [&str; STAGES] = [
    "slot_wait",
    "copy_out",
    "chunk_post",
    "send_done",
    "target_copy",
    "response",
    "response_sent",
    "response_recv",
    "copy_in",
    "ipc_submit",
    "ipc_quiet",
    "quiet",
    "kernel_amo",
];

#[derive(Default)]
struct Counter {
    count: AtomicU64,
    bytes: AtomicU64,
    ns: AtomicU64,
    max_ns: AtomicU64,
}

/// The counters of one transport.
#[derive(Default)]
pub struct Stats {
    c: [Counter; STAGES],
    candidates: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Durations are measured when `nvshmem_efa_gda::stages` logs at debug level (e.g.
/// `NVSHMEM_EFA_LOG=nvshmem_efa_gda=debug`, or `warn,nvshmem_efa_gda::stages=debug`).
fn timed() -> bool {
    tracing::enabled!(target: "nvshmem_efa_gda::stages", tracing::Level::DEBUG)
}

impl Stats {
    /// A start time when durations are measured (debug logging on), else `None` (no clock read).
    pub fn start(&self) -> Option<Instant> {
        timed().then(Instant::now)
    }

    /// Counts one event of `stage` with `bytes`, and its duration since `start` if measured.
    pub fn record(&self, stage: Stage, start: Option<Instant>, bytes: u64) {
        let c = &self.c[stage as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(t) = start {
            let ns = t.elapsed().as_nanos() as u64;
            c.ns.fetch_add(ns, Ordering::Relaxed);
            c.max_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }

    /// A timestamp to keep with an operation (nanoseconds since the first stamp, plus one), or 0
    /// when durations are not measured.
    pub fn stamp(&self) -> u64 {
        if timed() {
            epoch().elapsed().as_nanos() as u64 + 1
        } else {
            0
        }
    }

    /// Counts one event of `stage` with `bytes`, timed from `stamp` (from [`Stats::stamp`]; 0: untimed).
    pub fn record_since(&self, stage: Stage, stamp: u64, bytes: u64) {
        if stamp == 0 {
            self.record(stage, None, bytes);
        } else {
            let now = epoch().elapsed().as_nanos() as u64 + 1;
            self.record_ns(stage, now.saturating_sub(stamp), bytes);
        }
    }

    /// Counts a duration measured elsewhere (e.g. from a timestamp kept with a send slot).
    pub fn record_ns(&self, stage: Stage, ns: u64, bytes: u64) {
        let c = &self.c[stage as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.ns.fetch_add(ns, Ordering::Relaxed);
        c.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// (count, bytes, total ns, max ns) of `stage`.
    pub fn get(&self, stage: Stage) -> (u64, u64, u64, u64) {
        let c = &self.c[stage as usize];
        (
            c.count.load(Ordering::Relaxed),
            c.bytes.load(Ordering::Relaxed),
            c.ns.load(Ordering::Relaxed),
            c.max_ns.load(Ordering::Relaxed),
        )
    }

    /// Whether an operation of `len` bytes is traced on the timeline (decided once per operation).
    pub fn sample(&self, len: u64) -> bool {
        if len < TIMELINE_MIN_BYTES
            || !tracing::enabled!(target: "nvshmem_efa_gda::timeline", tracing::Level::DEBUG)
        {
            return false;
        }
        self.candidates.fetch_add(1, Ordering::Relaxed) % TIMELINE_EVERY == 0
    }

    /// One timeline line (call only for sampled operations); `event` qualifies the stage
    /// (`start`, `end`, or empty).
    pub fn timeline(&self, stage: Stage, event: &str, token: u64, addr: u64, bytes: u64) {
        let us = epoch().elapsed().as_secs_f64() * 1e6;
        tracing::debug!(
            target: "nvshmem_efa_gda::timeline",
            "t_us={us:.1} pid={} stage={}{}{event} token={token:#x} addr={addr:#x} bytes={bytes}",
            std::process::id(),
            NAMES[stage as usize],
            if event.is_empty() { "" } else { ":" },
        );
    }

    /// One line per stage that happened: `name count bytes [avg_us max_us]`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for (i, name) in NAMES.iter().enumerate() {
            let (n, b, ns, max) = self.get(STAGE_LIST[i]);
            if n == 0 {
                continue;
            }
            if !s.is_empty() {
                s.push_str("; ");
            }
            s += &format!("{name} n={n} bytes={b}");
            if ns > 0 {
                s += &format!(
                    " avg_us={:.1} max_us={:.1}",
                    ns as f64 / n as f64 / 1e3,
                    max as f64 / 1e3
                );
            }
        }
        if s.is_empty() {
            s.push_str("no transfers");
        }
        s
    }
}

const STAGE_LIST: [Stage; STAGES] = [
    Stage::SlotWait,
    Stage::CopyOut,
    Stage::ChunkPost,
    Stage::SendDone,
    Stage::TargetCopy,
    Stage::Response,
    Stage::ResponseSent,
    Stage::ResponseRecv,
    Stage::CopyIn,
    Stage::IpcSubmit,
    Stage::IpcQuiet,
    Stage::Quiet,
    Stage::KernelAmo,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_tables_agree() {
        for (i, s) in STAGE_LIST.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        assert_eq!(NAMES[Stage::TargetCopy as usize], "target_copy");
        assert_eq!(NAMES[Stage::Quiet as usize], "quiet");
    }

    #[test]
    fn counters_add_up_and_render() {
        let s = Stats::default();
        assert_eq!(s.summary(), "no transfers");
        s.record(Stage::ChunkPost, None, 65472);
        s.record(Stage::ChunkPost, None, 100);
        s.record_ns(Stage::SendDone, 2_000, 0);
        s.record_ns(Stage::SendDone, 6_000, 0);
        assert_eq!(s.get(Stage::ChunkPost), (2, 65572, 0, 0));
        assert_eq!(s.get(Stage::SendDone), (2, 0, 8_000, 6_000));
        let text = s.summary();
        assert!(text.contains("chunk_post n=2 bytes=65572"), "{text}");
        assert!(
            text.contains("send_done n=2 bytes=0 avg_us=4.0 max_us=6.0"),
            "{text}"
        );
        assert!(!text.contains("target_copy"), "{text}");
    }

    #[test]
    fn small_operations_are_never_sampled() {
        let s = Stats::default();
        assert!(!s.sample(TIMELINE_MIN_BYTES - 1));
        let on = tracing::enabled!(target: "nvshmem_efa_gda::timeline", tracing::Level::DEBUG);
        let picked: Vec<bool> = (0..2 * TIMELINE_EVERY)
            .map(|_| s.sample(TIMELINE_MIN_BYTES))
            .collect();
        let n = picked.iter().filter(|&&p| p).count();
        if on {
            assert!(
                picked[0] && picked[TIMELINE_EVERY as usize] && n == 2,
                "{n}"
            );
        } else {
            assert_eq!(n, 0, "nothing is sampled without debug logging");
        }
    }
}
