//! Consumer threads (docs/softq-threads.md): `NVSHMEM_EFA_SOFT_THREADS` = T threads, each a
//! [`Consumer`] with its own slots, copy queue, copy kernel, bounce ring, ordering bookkeeping and
//! counters, sharing [`Inner`].
//!
//! * Ring `r` belongs to thread `r % T`, for good: only its owner reads its SQ and doorbell,
//!   writes its CQ and host words, and keeps its ordering streams, so a WQE's guarantees (data,
//!   then count, per (ring, PE)) are those of one thread. An owner claims each ring
//!   ([`RingClaim`]); a second claim is a panic (the queue fails) rather than a broken order.
//! * Thread 0 alone touches the endpoint: its CQ, the receives and the RX ring, staged messages
//!   and their replies, bounce buffers for SENDs. Another thread executes copies itself and hands
//!   every other WQE (SEND and AMO messages, RDMA through the provider, staged RDMA) to thread 0
//!   ([`Mailbox::work`]), keeping it in flight in its own slot; thread 0 posts it like its own and
//!   hands its completion status back ([`Mailbox::done`]), and the owner writes the CQE. An
//!   announcing AMO is held by its owner until the WQEs before it on its stream completed, before
//!   it is handed over, exactly as thread 0 holds its own.
//! * Stop: every thread drains what it has in flight; thread 0 keeps serving the others until they
//!   all left, then stops, and logs the totals of every thread's summary.
use super::*;

/// Most consumer threads (`NVSHMEM_EFA_SOFT_THREADS`).
pub const MAX_SOFT_THREADS: usize = 16;

/// A ring owner's claim, in the ring's shared state: the thread that serves it (`usize::MAX`: none).
pub(super) struct RingClaim(std::sync::atomic::AtomicUsize);

impl Default for RingClaim {
    fn default() -> RingClaim {
        RingClaim(std::sync::atomic::AtomicUsize::new(usize::MAX))
    }
}

impl RingClaim {
    /// Claims the ring for thread `me`. Two threads serving one ring would break its ordering
    /// guarantees: a second claim panics (the queue fails with the message).
    pub(super) fn claim(&self, ring: usize, me: usize) {
        if let Err(other) =
            self.0
                .compare_exchange(usize::MAX, me, Ordering::AcqRel, Ordering::Acquire)
        {
            if other != me {
                panic!(
                    "software queue: ring {ring} claimed by consumer thread {me} while thread \
                     {other} serves it (a ring has one consumer)"
                );
            }
        }
    }
}

/// Where a WQE handed to thread 0 came from: the owner thread and the slot it holds there
/// (packed: thread in the high 8 bits, slot + 1 in the low 24; a thread has at most 32768 slots),
/// so that a [`Pending`] stays small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Origin(std::num::NonZeroU32);

impl Origin {
    pub(super) fn new(thread: usize, slot: u32) -> Origin {
        debug_assert!(thread < MAX_SOFT_THREADS && slot < (1 << 24) - 1);
        let v = ((thread as u32) << 24) | (slot + 1);
        Origin(std::num::NonZeroU32::new(v).expect("slot + 1 is not zero"))
    }

    pub(super) fn thread(self) -> usize {
        (self.0.get() >> 24) as usize
    }

    pub(super) fn slot(self) -> u32 {
        (self.0.get() & 0xff_ffff) - 1
    }
}

/// One thread's mailbox. Thread 0's `work` receives the WQEs other threads hand over; each
/// thread's `done` receives the completions of the ones it handed over.
#[derive(Default)]
pub(super) struct Mailbox {
    pub(super) work: Mutex<Vec<Pending>>,
    pub(super) done: Mutex<Vec<(u32, CqStatus)>>,
    /// Items in `work` and `done` together (a look without the lock).
    pub(super) count: AtomicU64,
    /// The thread left (stopped, or died): what it handed over and thread 0 has not posted yet is
    /// dropped, not posted after its owner completed it as flushed.
    pub(super) gone: AtomicBool,
    /// The thread's loop passes so far (`watchdog.rs` reports a thread whose count stops).
    pub(super) beat: Beat,
}

/// A pass count on a cache line of its own: its thread stores it every pass, and the mailbox's
/// other words are written by the other threads.
#[derive(Default)]
#[repr(align(64))]
pub(super) struct Beat(pub(super) AtomicU64);

impl Mailbox {
    fn has_mail(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }
}

/// One consumer thread's account, written when it stops ([`SoftQueue::consumer_summaries`]) and
/// summed over the threads in the queue's stop summary (debug level).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerSummary {
    /// The thread (0 owns the endpoint).
    pub thread: usize,
    /// The rings it served, each with the WQEs it took from it.
    pub rings: Vec<(usize, u64)>,
    /// WQEs taken, rejected among them, TX completions written.
    pub taken: u64,
    pub rejected: u64,
    pub completed: u64,
    /// WQEs it handed to thread 0 (threads other than 0), or took from the other threads (0).
    pub handed: u64,
    /// WQEs executed as copies.
    pub ipc_copies: u64,
    /// Loop passes, and those that took WQEs.
    pub loops: u64,
    pub rounds: u64,
}

/// Counters a thread adds to the queue's shared ones: what it published last, so that each
/// publication adds the difference.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Published {
    pub(super) ipc_copies: u64,
    pub(super) ipc_ring_waits: u64,
    pub(super) order: [u64; 2],
    pub(super) kernel: [u64; 3],
}

/// Adds `now - *last` to `shared` and remembers `now`.
pub(super) fn publish(shared: &AtomicU64, last: &mut u64, now: u64) {
    if now > *last {
        shared.fetch_add(now - *last, Ordering::AcqRel);
        *last = now;
    }
}

/// The threads a configuration runs: `threads` as asked (checked 1..=MAX by the configuration).
pub(super) fn thread_count(cfg: &SoftQueueConfig) -> usize {
    cfg.threads.clamp(1, MAX_SOFT_THREADS)
}

impl Consumer {
    /// Whether this thread owns the endpoint.
    pub(super) fn owns_endpoint(&self) -> bool {
        self.id == 0
    }

    /// Hands validated WQE `p` (its slot taken in this thread) to thread 0, which executes it on
    /// the endpoint; it stays in flight here until its completion comes back.
    pub(super) fn hand_over(&mut self, p: Pending) {
        let slot = p.slot.expect("slot taken before the hand-over");
        self.occupy(slot, InFlight::of(&p, None, None));
        self.handed += 1;
        let m = &self.inner.mail[0];
        m.work.lock().push(Pending {
            slot: None,
            bounce: None,
            from: Some(Origin::new(self.id, slot)),
            ..p
        });
        m.count.fetch_add(1, Ordering::AcqRel);
    }

    /// Sends the completion of a WQE another thread handed over back to it.
    pub(super) fn hand_back(&self, o: Origin, status: CqStatus) {
        let m = &self.inner.mail[o.thread()];
        m.done.lock().push((o.slot(), status));
        m.count.fetch_add(1, Ordering::AcqRel);
    }

    /// Thread 0: takes the WQEs other threads handed over and posts them (in the order handed
    /// over; one the provider refuses for now waits, with those after it, for the next pass).
    pub(super) fn serve_handed(&mut self) -> usize {
        let m = &self.inner.mail[0];
        if m.has_mail() {
            let mut w = m.work.lock();
            m.count.fetch_sub(w.len() as u64, Ordering::AcqRel);
            self.handed += w.len() as u64;
            self.handed_in.extend(w.drain(..));
        }
        let mut n = 0;
        while let Some(p) = self.handed_in.pop_front() {
            if p.from
                .is_some_and(|o| self.inner.mail[o.thread()].gone.load(Ordering::Acquire))
            {
                // Its owner left (stopping past the drain limit, or failed): never post it.
                n += 1;
                continue;
            }
            match self.post(p) {
                Ok(()) => n += 1,
                Err(p) => {
                    self.handed_in.push_front(p);
                    break;
                }
            }
        }
        n
    }

    /// Another thread: completes the WQEs thread 0 finished for it.
    pub(super) fn take_done(&mut self) -> usize {
        let inner = self.inner.clone();
        let m = &inner.mail[self.id];
        if !m.has_mail() {
            return 0;
        }
        let done: Vec<(u32, CqStatus)> = std::mem::take(&mut *m.done.lock());
        m.count.fetch_sub(done.len() as u64, Ordering::AcqRel);
        for &(slot, status) in &done {
            self.complete_tx(u64::from(slot), status);
        }
        done.len()
    }

    /// This thread's account.
    pub(super) fn summary(&self) -> ConsumerSummary {
        ConsumerSummary {
            thread: self.id,
            rings: self.rings.iter().map(|r| (r.id, r.ci)).collect(),
            taken: self.taken(),
            rejected: self.rejected,
            completed: self.completed,
            handed: self.handed,
            ipc_copies: self.ipc_copies,
            loops: self.rounds.loops,
            rounds: self.rounds.rounds,
        }
    }

    /// Publishes this thread's counters into the queue's shared ones.
    pub(super) fn publish_counts(&mut self) {
        let i = self.inner.clone();
        let p = &mut self.published;
        publish(&i.ipc_copies, &mut p.ipc_copies, self.ipc_copies);
        publish(
            &i.ipc_ring_waits,
            &mut p.ipc_ring_waits,
            self.ipc_ring_waits,
        );
        let order = [self.order.announced, self.order.waited];
        for ((s, l), v) in i.order_counts.iter().zip(&mut p.order).zip(order) {
            publish(s, l, v);
        }
        if let Some(k) = &self.kcopies {
            let kc = [k.launched, k.applied, k.taken_over];
            for ((s, l), v) in i.kernel_counts.iter().zip(&mut p.kernel).zip(kc) {
                publish(s, l, v);
            }
        }
    }
}

/// Makes the queue's consumers (thread 0 with `slots0` slots, the others with a ring's worth), posts
/// thread 0's receives and starts them, thread 0 first. A thread that cannot start stops the
/// ones started (joined) and fails the creation.
pub(super) fn start_consumers(
    inner: &Arc<Inner>,
    cfg: &SoftQueueConfig,
    slots0: usize,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let n = inner.mail.len();
    let mut consumers = Vec::with_capacity(n);
    for id in 0..n {
        let slots = if id == 0 {
            slots0
        } else {
            inner.sq_entries as usize
        };
        let mut c = Consumer::new(inner.clone(), id, slots);
        c.kcopies = kernel_copies(cfg, inner.cuda_ctx);
        consumers.push(c);
    }
    consumers[0].post_all_receives()?;
    if n > 1 {
        tracing::info!(
            "software queue: {n} consumer threads (NVSHMEM_EFA_SOFT_THREADS): ring r on thread \
             r % {n}, for good; thread 0 alone uses the endpoint (the other threads execute their \
             copies and hand it their SENDs, AMOs and RDMA through the provider)"
        );
    }
    let mut threads = Vec::with_capacity(n);
    for c in consumers {
        let spawned = std::thread::Builder::new()
            .name(format!("nvshmem-efa-softq{}", c.id))
            .spawn(move || c.run_guarded());
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                // Thread 0 does not wait for helpers that never started.
                let missing = (n - threads.len()).min(n - 1) as u64;
                inner.helpers_live.fetch_sub(missing, Ordering::AcqRel);
                inner.stop.store(true, Ordering::Release);
                for h in threads.into_iter().rev() {
                    let _ = h.join();
                }
                return Err(GdaError::io(format!(
                    "cannot start the software queue's consumer threads: {e}"
                )));
            }
        }
    }
    Ok(threads)
}

impl SoftQueue {
    /// Consumer threads serving the queue (`NVSHMEM_EFA_SOFT_THREADS`).
    pub fn threads(&self) -> usize {
        self.inner.mail.len()
    }

    /// The accounts of the consumer threads that stopped (all of them after
    /// [`SoftQueue::stop`]; a thread that panicked leaves none), by thread.
    pub fn consumer_summaries(&self) -> Vec<ConsumerSummary> {
        let mut v = self.inner.summaries.lock().clone();
        v.sort_by_key(|s| s.thread);
        v
    }
}

/// Logs the totals of every thread's summary (debug level), once the last thread stopped.
pub(super) fn log_totals(all: &[ConsumerSummary]) {
    if let Some(line) = totals(all) {
        tracing::debug!("{line}");
    }
}

/// The line of [`log_totals`]: the threads' accounts summed, then each thread's share (`None` for
/// one thread: its own summary says it all).
pub(super) fn totals(all: &[ConsumerSummary]) -> Option<String> {
    if all.len() < 2 {
        return None;
    }
    let sum = |f: fn(&ConsumerSummary) -> u64| all.iter().map(f).sum::<u64>();
    let per: Vec<String> = all
        .iter()
        .map(|s| {
            format!(
                "thread {}: {} WQEs from {} ring(s), {} handed over",
                s.thread,
                s.taken,
                s.rings.len(),
                s.handed
            )
        })
        .collect();
    Some(format!(
        "software queue, {} consumer threads together: {} WQEs taken ({} rejected), {} TX \
         completions written, {} copies, {} rings, {} loop passes ({} took WQEs); {}",
        all.len(),
        sum(|s| s.taken),
        sum(|s| s.rejected),
        sum(|s| s.completed),
        sum(|s| s.ipc_copies),
        all.iter().map(|s| s.rings.len()).sum::<usize>(),
        sum(|s| s.loops),
        sum(|s| s.rounds),
        per.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_adds_differences() {
        let shared = AtomicU64::new(0);
        let (mut a, mut b) = (0, 0);
        publish(&shared, &mut a, 3);
        publish(&shared, &mut b, 5);
        publish(&shared, &mut a, 4);
        publish(&shared, &mut a, 4);
        assert_eq!(shared.load(Ordering::Acquire), 9);
    }

    #[test]
    fn origin_packs_thread_and_slot() {
        for (t, s) in [(0, 0), (15, 32767), (3, 1 << 20)] {
            let o = Origin::new(t, s);
            assert_eq!((o.thread(), o.slot()), (t, s));
        }
    }

    #[test]
    fn the_stop_summary_sums_the_threads() {
        let one = ConsumerSummary {
            thread: 0,
            rings: vec![(0, 5), (2, 7)],
            taken: 12,
            rejected: 1,
            completed: 12,
            handed: 3,
            ipc_copies: 4,
            loops: 100,
            rounds: 10,
        };
        assert_eq!(totals(std::slice::from_ref(&one)), None);
        let two = ConsumerSummary {
            thread: 1,
            rings: vec![(1, 3)],
            taken: 3,
            rejected: 0,
            completed: 3,
            handed: 3,
            ipc_copies: 0,
            loops: 50,
            rounds: 2,
        };
        let line = totals(&[one, two]).unwrap();
        assert!(
            line.contains(
                "2 consumer threads together: 15 WQEs taken (1 rejected), 15 TX \
                 completions written, 4 copies, 3 rings, 150 loop passes (12 took WQEs)"
            ),
            "{line}"
        );
        assert!(
            line.contains("thread 1: 3 WQEs from 1 ring(s), 3 handed over"),
            "{line}"
        );
    }

    #[test]
    fn a_ring_has_one_owner() {
        let c = RingClaim::default();
        c.claim(3, 1);
        c.claim(3, 1);
        let r = std::panic::catch_unwind(|| c.claim(3, 2));
        assert!(r.is_err(), "a second thread's claim must fail");
    }
}
