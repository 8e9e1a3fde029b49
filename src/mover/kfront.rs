//! The copy kernel in front of the copy engine, for the transport's same-host copy queues.
//!
//! A small copy on the copy engine costs about 4 us of driver time even inside one
//! `cuMemcpyBatchAsync` (results/gpu-2026-11-24d), so a stream of small puts through NVSHMEM's
//! proxy ran at about 0.14 M puts/s (7 us each) while the proxy alone reaches 0.67 M/s. A
//! submission of small copies between device-accessible ranges goes instead as one launch of the
//! library's copy kernel ([`crate::mover::kcopy`]: up to 128 copies of at most 64 KiB, one launch).
//! Everything else (large copies, host memory the kernel cannot reach, batches while a take-over
//! holds the kernel off) goes to the copy engine as before.
//!
//! Kernel launches run on the kernel's stream, copy-engine copies on the engine's; the host keeps
//! the [`CopyEngine`] promise (submissions complete in order; a copy runs after every copy of an
//! earlier submission) by issuing submissions in order and never letting one pass the other route:
//!
//! - a launch goes once every earlier copy-engine submission has completed (stream order among
//!   launches does the rest);
//! - a copy-engine submission goes once every earlier launch has been seen applied;
//! - a launch the kernel has not started within the stuck limit (an application kernel holds every
//!   SM, possibly waiting for these very copies) is taken over by the host through the claim
//!   protocol and its copies go to the copy engine, in order, with every younger launch's.
//!
//! Nothing is queued on a stream behind an undecided launch, so a kernel that never starts holds
//! up nothing but its own copies, which the host then makes. Submissions that cannot go yet wait
//! in this engine (accepted, counted by the queue, issued at the next look: `mark`, `oldest_done`,
//! `all_done`, a later submission); a mark completes once every submission before it has.
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::kcopy::{Done, KernelCopies, NotLaunched};
use super::queue::{CopyEngine, CopyQueue, CudaEngine, INLINE_BYTES, INLINE_SLOTS};
use super::{MResult, MoverError};
use crate::cuda::kernel;

/// (destination, source, length) of one copy.
type Copy3 = (u64, u64, usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not issued yet; `kernel`: it may go as a launch.
    Waiting { kernel: bool },
    /// Launched as kernel launch `id`, not yet seen applied.
    Launched(u64),
    /// On the copy engine, with an inner mark behind it.
    Engine,
    /// Complete.
    Done,
}

struct Entry {
    seq: u64,
    copies: Vec<Copy3>,
    state: State,
}

/// Counts for the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontCounts {
    /// Submissions issued as kernel launches and seen applied.
    pub applied: u64,
    /// Copies those launches made.
    pub kernel_copies: u64,
    /// Launches taken over by the host (their copies went to the copy engine).
    pub taken_over: u64,
    /// Submissions issued to the copy engine (taken-over launches included).
    pub engine: u64,
}

/// A [`CopyEngine`] that sends submissions of small device copies through the copy kernel and the
/// rest through `inner`.
pub struct KernelFront<E: CopyEngine> {
    inner: E,
    kernel: Option<KernelCopies<Vec<Copy3>>>,
    fifo: VecDeque<Entry>,
    next_seq: u64,
    /// Inner marks placed, oldest first: each covers every copy-engine submission up to the
    /// sequence number it holds. Marks are placed only when something waits for those
    /// submissions (a launch behind them, a mark of the queue), not one per submission: a mark
    /// and its queries cost driver calls that a stream of large copies felt.
    engine_marks: VecDeque<u64>,
    /// The newest copy-engine submission, and whether an inner mark covers it.
    last_engine: Option<u64>,
    last_covered: bool,
    /// The queue's marks: each completes once every submission with a smaller sequence number has.
    marks: VecDeque<u64>,
    /// Issued entries not yet complete, by route (issue is in order, so they all precede every
    /// waiting entry).
    launched: usize,
    on_engine: usize,
    /// The inline ring (host address, device address) once created.
    ring: Option<(u64, u64)>,
    /// An error of a submission made after it was accepted (reported by the next query).
    error: Option<MoverError>,
    decided: Vec<Done<Vec<Copy3>>>,
    counts: FrontCounts,
}

impl<E: CopyEngine> KernelFront<E> {
    /// `inner` alone (every submission goes to it at once) when `kernel` is `None`.
    pub fn new(inner: E, kernel: Option<KernelCopies<Vec<Copy3>>>) -> KernelFront<E> {
        KernelFront {
            inner,
            kernel,
            fifo: VecDeque::new(),
            next_seq: 0,
            engine_marks: VecDeque::new(),
            last_engine: None,
            last_covered: true,
            marks: VecDeque::new(),
            launched: 0,
            on_engine: 0,
            ring: None,
            error: None,
            decided: Vec::new(),
            counts: FrontCounts::default(),
        }
    }

    /// The engine behind the kernel.
    pub fn inner(&mut self) -> &mut E {
        &mut self.inner
    }

    /// Whether submissions may go through the kernel.
    pub fn has_kernel(&self) -> bool {
        self.kernel.is_some()
    }

    /// Counts for the log.
    pub fn counts(&self) -> FrontCounts {
        self.counts
    }

    /// Submissions accepted and not yet complete (waiting, launched or on the copy engine).
    pub fn pending(&self) -> usize {
        self.fifo.len()
    }

    /// Submissions not yet issued, or launched and not yet seen applied: work that the copy
    /// engine's stream does not order.
    pub fn off_engine(&self) -> usize {
        self.fifo
            .iter()
            .filter(|e| matches!(e.state, State::Waiting { .. } | State::Launched(_)))
            .count()
    }

    fn accept(&mut self, copies: &[Copy3], kernel: bool) {
        let kernel = kernel && self.kernel.is_some() && KernelCopies::<()>::fits(copies);
        self.fifo.push_back(Entry {
            seq: self.next_seq,
            copies: copies.to_vec(),
            state: State::Waiting { kernel },
        });
        self.next_seq += 1;
        self.pump();
    }

    /// The copies as the kernel addresses them: sources in the inline ring by its device address.
    fn for_kernel(&self, copies: &[Copy3]) -> Vec<Copy3> {
        let Some((host, dev)) = self.ring else {
            return copies.to_vec();
        };
        let end = host + (INLINE_SLOTS * INLINE_BYTES) as u64;
        copies
            .iter()
            .map(|&(d, s, n)| {
                if (host..end).contains(&s) {
                    (d, s - host + dev, n)
                } else {
                    (d, s, n)
                }
            })
            .collect()
    }

    /// Issues `copies` to the copy engine with one inner mark behind them.
    fn issue_engine(&mut self, seq: u64, copies: &[Copy3]) -> MResult<()> {
        // SAFETY: every entry was accepted from a caller that vouched for its ranges until the
        // queue's quiet, which waits for this submission.
        let (n, err) = unsafe { self.inner.submit_many(copies) };
        if let Some(e) = err {
            tracing::error!(
                "copy queue: {} of {} copies not enqueued on the copy engine: {e}",
                copies.len() - n,
                copies.len()
            );
            return Err(e);
        }
        self.last_engine = Some(seq);
        self.last_covered = false;
        self.counts.engine += 1;
        Ok(())
    }

    /// Entry `i` (sequence number `seq`) goes to the copy engine with `copies`: then on the
    /// engine, or done with the error (its copies will not run; quiet reports it).
    fn entry_to_engine(&mut self, i: usize, seq: u64, copies: &[Copy3]) -> MResult<()> {
        match self.issue_engine(seq, copies) {
            Ok(()) => {
                self.fifo[i].state = State::Engine;
                self.on_engine += 1;
                Ok(())
            }
            Err(e) => {
                self.fifo[i].state = State::Done;
                Err(e)
            }
        }
    }

    /// Places an inner mark behind the copy-engine submissions no mark covers yet.
    fn cover_engine(&mut self) -> MResult<()> {
        if let (Some(seq), false) = (self.last_engine, self.last_covered) {
            self.inner.mark()?;
            self.engine_marks.push_back(seq);
            self.last_covered = true;
        }
        Ok(())
    }

    /// Every copy-engine submission up to `seq` has completed.
    fn engine_done_upto(&mut self, seq: u64) {
        for e in self.fifo.iter_mut() {
            if e.seq > seq {
                break;
            }
            if e.state == State::Engine {
                e.state = State::Done;
                self.on_engine -= 1;
            }
        }
    }

    /// Every copy-engine submission has completed (the engine's stream is idle): `Ok(true)`.
    fn engine_idle(&mut self) -> MResult<bool> {
        if self.on_engine == 0 {
            return Ok(true);
        }
        if !self.inner.all_done()? {
            return Ok(false);
        }
        // The inner engine retired every mark with it.
        self.engine_marks.clear();
        self.last_covered = true;
        if let Some(seq) = self.last_engine {
            self.engine_done_upto(seq);
        }
        Ok(true)
    }

    /// One look: kernel launches decided, copy-engine submissions completed, then waiting entries
    /// issued in order as far as the rules allow. Never blocks. An error is kept for the next query.
    fn pump(&mut self) {
        if let Err(e) = self.pump_inner() {
            self.error.get_or_insert(e);
        }
    }

    fn pump_inner(&mut self) -> MResult<()> {
        let now = Instant::now();
        if let Some(k) = self.kernel.as_mut() {
            if k.undecided() > 0 {
                k.settle(now, &mut self.decided);
            }
        }
        let decided = std::mem::take(&mut self.decided);
        let mut first_err = None;
        for d in decided {
            match d {
                Done::Applied(id) => {
                    if let Some(e) = self
                        .fifo
                        .iter_mut()
                        .find(|e| e.state == State::Launched(id))
                    {
                        e.state = State::Done;
                        self.launched -= 1;
                        self.counts.applied += 1;
                        self.counts.kernel_copies += e.copies.len() as u64;
                    }
                }
                Done::TakenOver(id, copies) => {
                    let Some(i) = self
                        .fifo
                        .iter()
                        .position(|e| e.state == State::Launched(id))
                    else {
                        continue;
                    };
                    self.launched -= 1;
                    self.counts.taken_over += 1;
                    let seq = self.fifo[i].seq;
                    // Launches are decided oldest first and a taken-over one takes every younger
                    // one with it, so no launch after this one has made copies: in order on the
                    // copy engine they keep the promise.
                    if let Err(e) = self.entry_to_engine(i, seq, &copies) {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        while let Some(&seq) = self.engine_marks.front() {
            match self.inner.oldest_done() {
                Ok(true) => {
                    self.engine_marks.pop_front();
                    self.engine_done_upto(seq);
                }
                Ok(false) => break,
                Err(e) => return Err(e),
            }
        }
        while self.fifo.front().is_some_and(|e| e.state == State::Done) {
            self.fifo.pop_front();
        }
        // Issue in order.
        let mut i = self
            .fifo
            .iter()
            .position(|e| matches!(e.state, State::Waiting { .. }))
            .unwrap_or(self.fifo.len());
        while i < self.fifo.len() {
            let State::Waiting { kernel } = self.fifo[i].state else {
                // Issue is in order: every entry after the first waiting one waits too.
                debug_assert!(false, "an issued entry after a waiting one");
                break;
            };
            if kernel {
                if self.on_engine > 0 {
                    // Known complete only through a mark behind them (or the idle stream).
                    if !self.engine_idle()? {
                        self.cover_engine()?;
                        break;
                    }
                }
                let copies = self.for_kernel(&self.fifo[i].copies);
                let payload = self.fifo[i].copies.clone();
                let k = self
                    .kernel
                    .as_mut()
                    .expect("kernel entries only with a kernel");
                // SAFETY: the ranges are device-accessible (the caller of submit_many_device
                // vouched) and valid until the queue's quiet, which waits for this launch.
                match unsafe { k.launch(&copies, payload, Instant::now()) } {
                    Ok(id) => {
                        self.fifo[i].state = State::Launched(id);
                        self.launched += 1;
                        i += 1;
                        continue;
                    }
                    // Slots free as launches of this queue are decided: wait for them. With
                    // none undecided, every slot waits for a late kernel of a taken-over launch,
                    // which may wait for these very copies: the copy engine takes it.
                    Err((NotLaunched::NoSlot, _)) if self.launched > 0 => break,
                    Err((_, _)) => {
                        // Held off after a take-over, no slot (above), or the launch failed
                        // (logged): the copy engine takes it.
                        self.fifo[i].state = State::Waiting { kernel: false };
                    }
                }
            }
            if self.launched > 0 {
                break;
            }
            let seq = self.fifo[i].seq;
            let copies = std::mem::take(&mut self.fifo[i].copies);
            if let Err(e) = self.entry_to_engine(i, seq, &copies) {
                first_err.get_or_insert(e);
            }
            self.fifo[i].copies = copies;
            i += 1;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Looks until nothing is waiting or launched (only copy-engine work left, which the engine's
    /// stream orders), or `deadline` (an error). A launch that does not start is taken over at the
    /// stuck limit, so this ends within about that limit.
    pub fn drain_off_engine(&mut self, deadline: Instant) -> MResult<()> {
        let started = Instant::now();
        loop {
            self.pump();
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            if self.off_engine() == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(MoverError::Timeout {
                    outstanding: self.off_engine() as u64,
                    waited: started.elapsed(),
                });
            }
            std::thread::yield_now();
        }
    }

    fn take_error(&mut self) -> MResult<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<E: CopyEngine> CopyEngine for KernelFront<E> {
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        if self.kernel.is_none() {
            // SAFETY: the caller's guarantee.
            return unsafe { self.inner.submit(dst, src, len) };
        }
        self.accept(&[(dst, src, len)], false);
        self.take_error()
    }

    unsafe fn submit_many(&mut self, copies: &[Copy3]) -> (usize, Option<MoverError>) {
        if self.kernel.is_none() {
            // SAFETY: the caller's guarantee.
            return unsafe { self.inner.submit_many(copies) };
        }
        self.accept(copies, false);
        (copies.len(), self.error.take())
    }

    unsafe fn submit_many_device(&mut self, copies: &[Copy3]) -> (usize, Option<MoverError>) {
        if self.kernel.is_none() {
            // SAFETY: the caller's guarantee.
            return unsafe { self.inner.submit_many(copies) };
        }
        self.accept(copies, true);
        (copies.len(), self.error.take())
    }

    fn mark(&mut self) -> MResult<()> {
        if self.kernel.is_none() {
            return self.inner.mark();
        }
        self.marks.push_back(self.next_seq);
        self.pump();
        if let Err(e) = self.cover_engine() {
            self.error.get_or_insert(e);
        }
        self.take_error()
    }

    fn oldest_done(&mut self) -> MResult<bool> {
        if self.kernel.is_none() {
            return self.inner.oldest_done();
        }
        let Some(&m) = self.marks.front() else {
            return Err(MoverError::Invalid("no mark outstanding".into()));
        };
        self.pump();
        self.take_error()?;
        let complete_below = self.fifo.front().map_or(self.next_seq, |e| e.seq);
        if m <= complete_below {
            self.marks.pop_front();
            return Ok(true);
        }
        Ok(false)
    }

    fn all_done(&mut self) -> MResult<bool> {
        if self.kernel.is_none() {
            return self.inner.all_done();
        }
        self.pump();
        self.take_error()?;
        if self.off_engine() == 0 && self.on_engine > 0 {
            // Only copy-engine work left: the idle stream says it at once where the engine can
            // tell; else a mark behind it, looked at now and by the next query.
            if !self.engine_idle()? {
                self.cover_engine()?;
            }
            self.pump();
            self.take_error()?;
        }
        if self.fifo.is_empty() {
            self.marks.clear();
            return Ok(true);
        }
        Ok(false)
    }

    fn inline_ring(&mut self) -> MResult<u64> {
        let host = self.inner.inline_ring()?;
        if self.ring.is_none() {
            let dev = self.inner.inline_ring_device()?;
            self.ring = Some((host, dev));
        }
        Ok(host)
    }

    fn inline_ring_device(&mut self) -> MResult<u64> {
        self.inline_ring()?;
        Ok(self.ring.expect("set above").1)
    }
}

impl<E: CopyEngine> Drop for KernelFront<E> {
    fn drop(&mut self) {
        let c = self.counts;
        if c.applied + c.taken_over > 0 {
            tracing::debug!(
                "copy queue: {} kernel launches applied ({} copies), {} taken over, {} copy-engine \
                 submissions",
                c.applied,
                c.kernel_copies,
                c.taken_over,
                c.engine
            );
        }
        if let Some(k) = self.kernel.as_mut() {
            let mut out = Vec::new();
            if !k.close(Instant::now() + std::time::Duration::from_secs(1), &mut out) {
                tracing::warn!("copy queue: copy kernel launches still pending at close");
            }
            // A queue is dropped once quiet (finalize): a launch claimed only now was never
            // waited for, and its copies are not made.
            let lost = out
                .iter()
                .filter(|d| matches!(d, Done::TakenOver(..)))
                .count();
            if lost > 0 || self.fifo.iter().any(|e| e.state != State::Done) {
                tracing::error!(
                    "copy queue closed with copies not complete ({lost} launch(es) claimed at \
                     close, {} submission(s) pending): a quiet was missing",
                    self.fifo.len()
                );
            }
        }
    }
}

/// How long a copy kernel launch of a transport queue may stay unstarted before the host takes
/// its copies over (the software queue's limit, `NVSHMEM_EFA_SOFT_KERNEL_STUCK_US`'s default).
const COPY_KERNEL_STUCK: std::time::Duration = std::time::Duration::from_millis(2);
/// How long a queue's copies go to the copy engine after a take-over (an application kernel that
/// holds every SM usually holds them for a while).
const COPY_KERNEL_HOLD: std::time::Duration = std::time::Duration::from_millis(100);

impl super::engine::Mover {
    /// Creates every endpoint's copy queue now, with the copy kernel in front where it is on
    /// (`NVSHMEM_EFA_COPY_KERNEL` and a copy batch of more than 1): the kernel is loaded and each
    /// queue's launches checked with one launch the host claimed beforehand. Called at connect,
    /// before any kernel of the application runs: loading a module while a kernel runs may wait
    /// for that kernel, which may be waiting for these very copies. A queue created later (not
    /// prepared) uses the copy engine alone. Errors are logged; those queues then use the copy
    /// engine alone.
    pub fn prepare_queues(&self) {
        let ctx = self.ctx.load(Ordering::Relaxed);
        if ctx == 0 {
            // No CUDA context known: no GPU memory to copy, queues stay uncreated.
            return;
        }
        let kernel = if self.copy_batch > 1 {
            self.load_copy_kernel()
        } else {
            None
        };
        for (ep, q) in self.queues.iter().enumerate() {
            let mut q = q.lock();
            if q.is_some() {
                continue;
            }
            let kc = kernel.clone().and_then(|k| {
                KernelCopies::cuda(k, COPY_KERNEL_STUCK, COPY_KERNEL_HOLD)
                    .and_then(|mut kc| {
                        kc.check_claimed_launch(Instant::now() + std::time::Duration::from_secs(10))?;
                        Ok(kc)
                    })
                    .map_err(|e| {
                        tracing::warn!(
                            "copy queue {ep}: no copy kernel ({e}); its copies go to the copy engine"
                        )
                    })
                    .ok()
            });
            let on = kc.is_some();
            match CudaEngine::new(ctx, self.policy.copy_overlap) {
                Ok(inner) => {
                    *q = Some(
                        CopyQueue::new(KernelFront::new(inner, kc)).with_batch(self.copy_batch),
                    );
                    tracing::debug!("copy queue {ep}: created at connect, copy kernel {on}");
                }
                Err(e) => tracing::warn!("copy queue {ep}: not created at connect ({e})"),
            }
        }
    }

    /// The copy kernel in the mover's context, loaded at the first call (`None` when
    /// `NVSHMEM_EFA_COPY_KERNEL=0`, no context is known, or it did not load: logged once, not tried
    /// again). Call it at
    /// connect only, before any kernel of the application runs: loading a module while a kernel
    /// runs may wait for that kernel.
    pub fn load_copy_kernel(&self) -> Option<Arc<kernel::CopyKernel>> {
        let ctx = self.ctx.load(Ordering::Relaxed);
        if !self.copy_kernel || ctx == 0 {
            return None;
        }
        self.kernel
            .lock()
            .get_or_insert_with(|| match kernel::CopyKernel::load(ctx) {
                Ok(loaded) => Some(Arc::new(loaded)),
                Err(e) => {
                    tracing::warn!("no copy kernel ({e}): small copies go to the copy engine");
                    None
                }
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mover::queue::{CopyQueue, HostEngine};
    use std::time::Duration;

    fn front(delay: Duration, stuck: Duration) -> KernelFront<HostEngine> {
        let k = KernelCopies::host(delay, stuck, Duration::from_secs(60)).unwrap();
        KernelFront::new(HostEngine::default(), Some(k))
    }

    /// `n` copies of `len` bytes from `src` to `dst` at the same offsets.
    fn copies(dst: &mut [u8], src: &[u8], n: usize, len: usize) -> Vec<Copy3> {
        (0..n)
            .map(|i| {
                (
                    dst.as_mut_ptr() as u64 + (i * len) as u64,
                    src.as_ptr() as u64 + (i * len) as u64,
                    len,
                )
            })
            .collect()
    }

    #[test]
    fn small_device_copies_go_as_one_launch_and_quiet_waits_for_it() {
        // The stand-in kernel starts 20 ms late: quiet must wait for it.
        let mut q =
            CopyQueue::new(front(Duration::from_millis(20), Duration::from_secs(5))).with_batch(64);
        let src: Vec<u8> = (0..64 * 8).map(|i| i as u8 ^ 0x5a).collect();
        let mut dst = vec![0u8; 64 * 8];
        for c in copies(&mut dst, &src, 64, 8) {
            // SAFETY: both buffers outlive the quiet below.
            unsafe { q.submit_device(c.0, c.1, c.2).unwrap() };
        }
        q.quiet(Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(dst, src);
        let c = q.engine_mut().counts();
        assert_eq!((c.applied, c.kernel_copies, c.engine), (1, 64, 0));
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn an_engine_submission_waits_for_the_launch_before_it() {
        // Launch first (device copies, kernel 30 ms late), then a host-memory copy of other bytes
        // to the same place: it must land after, so its bytes are the ones left.
        let mut e = front(Duration::from_millis(30), Duration::from_secs(5));
        let first = [1u8; 64];
        let second = [2u8; 64];
        let mut dst = vec![0u8; 64];
        let d = dst.as_mut_ptr() as u64;
        // SAFETY: the buffers outlive every copy (all_done polled below).
        unsafe {
            assert_eq!(e.submit_many_device(&[(d, first.as_ptr() as u64, 64)]).0, 1);
            assert_eq!(e.submit_many(&[(d, second.as_ptr() as u64, 64)]).0, 1);
        }
        assert_eq!(e.pending(), 2, "the engine submission waits");
        assert_eq!(dst, vec![0u8; 64], "nothing may land before the launch");
        let end = Instant::now() + Duration::from_secs(5);
        while !e.all_done().unwrap() {
            assert!(Instant::now() < end, "never done");
            std::thread::yield_now();
        }
        assert_eq!(dst, second.to_vec());
        let c = e.counts();
        assert_eq!((c.applied, c.engine), (1, 1));
    }

    #[test]
    fn a_stuck_launch_is_made_by_the_engine_in_order_and_the_late_kernel_copies_nothing() {
        // The kernel starts 300 ms late; the stuck limit is 5 ms.
        let mut q = CopyQueue::new(front(Duration::from_millis(300), Duration::from_millis(5)))
            .with_batch(8);
        let src_a = vec![7u8; 8 * 16];
        let src_b = [9u8; 16];
        let mut dst = vec![0u8; 8 * 16];
        let cs = copies(&mut dst, &src_a, 8, 16);
        for c in &cs {
            // SAFETY: the buffers outlive the quiet and the launcher (dropped with q).
            unsafe { q.submit_device(c.0, c.1, c.2).unwrap() };
        }
        // Then an engine copy over the first 16 bytes: lands after the taken-over copies.
        // SAFETY: as above.
        unsafe { q.submit(cs[0].0, src_b.as_ptr() as u64, 16).unwrap() };
        let t = Instant::now();
        q.quiet(Instant::now() + Duration::from_secs(5)).unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "quiet waited for the late kernel"
        );
        assert_eq!(&dst[..16], &src_b[..]);
        assert_eq!(&dst[16..], &src_a[16..]);
        let c = q.engine_mut().counts();
        assert_eq!((c.applied, c.taken_over, c.engine), (0, 1, 2));
        // The late kernel finds the host's claim and leaves the destination alone.
        dst.fill(0);
        drop(q);
        assert!(dst.iter().all(|&b| b == 0), "a taken-over launch copied");
    }

    #[test]
    fn large_copies_and_host_memory_go_to_the_engine() {
        let mut e = front(Duration::ZERO, Duration::from_secs(5));
        let big = vec![3u8; 128 << 10];
        let mut dst = vec![0u8; 128 << 10];
        // SAFETY: the buffers outlive the copies (the host engine copies at once).
        unsafe {
            e.submit_many_device(&[(dst.as_mut_ptr() as u64, big.as_ptr() as u64, big.len())]);
        }
        assert!(e.all_done().unwrap());
        assert_eq!(dst, big);
        assert_eq!((e.counts().applied, e.counts().engine), (0, 1));
    }

    #[test]
    fn a_run_of_engine_submissions_places_no_mark_until_one_is_needed() {
        let mut e = front(Duration::ZERO, Duration::from_secs(5));
        let big = vec![4u8; 100 << 10];
        let mut dst = vec![0u8; 20 * (100 << 10)];
        for i in 0..20 {
            let d = dst.as_mut_ptr() as u64 + (i * (100 << 10)) as u64;
            // SAFETY: both buffers outlive the copies (the host engine copies at once).
            unsafe { e.submit_many_device(&[(d, big.as_ptr() as u64, big.len())]) };
        }
        assert!(e.engine_marks.is_empty(), "a mark per submission");
        assert_eq!(e.counts().engine, 20);
        // Quiet's question: the host engine cannot tell at once, so one mark covers all 20.
        let end = Instant::now() + Duration::from_secs(5);
        while !e.all_done().unwrap() {
            assert!(Instant::now() < end, "never done");
        }
        assert!(dst.iter().all(|&b| b == 4));
        // A launch behind engine work waits for it through one mark as well.
        let small = [6u8; 8];
        // SAFETY: as above.
        unsafe {
            e.submit_many_device(&[(dst.as_mut_ptr() as u64, big.as_ptr() as u64, big.len())]);
            e.submit_many_device(&[(dst.as_mut_ptr() as u64, small.as_ptr() as u64, 8)]);
        }
        while !e.all_done().unwrap() {
            assert!(Instant::now() < end, "never done");
            std::thread::yield_now();
        }
        assert_eq!(
            &dst[..8],
            &small,
            "the launch ran before the engine copy it follows"
        );
        assert_eq!(e.counts().applied, 1);
    }

    #[test]
    fn without_a_kernel_everything_goes_straight_to_the_engine() {
        let mut e = KernelFront::new(HostEngine::default(), None);
        let src = [5u8; 8];
        let mut dst = [0u8; 8];
        // SAFETY: both live through the call (the host engine copies at once).
        unsafe { e.submit_many_device(&[(dst.as_mut_ptr() as u64, src.as_ptr() as u64, 8)]) };
        assert_eq!(dst, src);
        assert_eq!(e.pending(), 0);
        assert_eq!(e.counts(), FrontCounts::default());
    }

    #[test]
    fn inline_copies_reach_the_kernel_and_marks_complete_in_order() {
        let mut q =
            CopyQueue::new(front(Duration::from_millis(5), Duration::from_secs(5))).with_batch(16);
        let mut dst = vec![0u64; 40];
        for (i, d) in dst.iter_mut().enumerate() {
            let v = (i as u64 + 1) * 0x0101;
            // SAFETY: `dst` outlives the quiet; the value is taken at once.
            unsafe {
                q.submit_inline(
                    d as *mut u64 as u64,
                    &v.to_le_bytes(),
                    Instant::now() + Duration::from_secs(5),
                )
                .unwrap()
            };
        }
        q.quiet(Instant::now() + Duration::from_secs(5)).unwrap();
        for (i, d) in dst.iter().enumerate() {
            assert_eq!(*d, (i as u64 + 1) * 0x0101, "copy {i}");
        }
        let c = q.engine_mut().counts();
        assert_eq!(c.kernel_copies, 40, "{c:?}");
        assert_eq!(q.counts().0, 40);
    }
}
