//! A queue of copies with counted completion: copies are enqueued without waiting, completion is
//! marked once per group of copies (one event for many copies), polled without blocking, and
//! waited for with a deadline that turns into an error instead of a hang.
//!
//! The engine underneath is CUDA's copy engine on a non-blocking stream ([`CudaEngine`]) or plain
//! `memcpy` ([`HostEngine`]); the bookkeeping does not depend on which, so it is tested on the host.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{MResult, MoverError};
use crate::cuda::stream::{CopyStream, Event};

/// What executes copies. Copies complete in submission order; a mark completes once every copy
/// submitted before it has. A wrapper around engines forwards every method, the ones with
/// defaults included: the defaults are correct but slow (one driver call per copy, no whole-engine
/// query).
pub trait CopyEngine: Send {
    /// Enqueues a copy.
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until the copy has completed.
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()>;
    /// Enqueues copies that may run in any order among themselves (none reads or writes what
    /// another of them writes); each is ordered after every copy submitted before the call and
    /// before every copy submitted after it. Returns how many it enqueued (a prefix of `copies`)
    /// and the error that stopped it. The default submits them one by one.
    ///
    /// # Safety
    /// As [`CopyEngine::submit`] for every entry `(dst, src, len)`.
    unsafe fn submit_many(&mut self, copies: &[(u64, u64, usize)]) -> (usize, Option<MoverError>) {
        for (i, &(dst, src, len)) in copies.iter().enumerate() {
            // SAFETY: the caller's guarantee, entry by entry.
            if let Err(e) = unsafe { self.submit(dst, src, len) } {
                return (i, Some(e));
            }
        }
        (copies.len(), None)
    }
    /// [`CopyEngine::submit_many`] for copies whose every range is memory the GPU can address
    /// (device memory of this context, peer memory mapped into it, the inline ring): an engine may
    /// then move them with a kernel ([`super::kfront::KernelFront`]). The default submits them as
    /// any other.
    ///
    /// # Safety
    /// As [`CopyEngine::submit_many`], and every range device-accessible.
    unsafe fn submit_many_device(
        &mut self,
        copies: &[(u64, u64, usize)],
    ) -> (usize, Option<MoverError>) {
        // SAFETY: the caller's guarantee.
        unsafe { self.submit_many(copies) }
    }
    /// Places a mark after every copy submitted so far.
    fn mark(&mut self) -> MResult<()>;
    /// Whether the oldest outstanding mark has completed; a completed mark is retired (the next
    /// call asks about the next one). Never blocks.
    fn oldest_done(&mut self) -> MResult<bool>;
    /// Whether every copy submitted so far has completed, asked without a mark (`Ok(false)` where
    /// the engine cannot tell that way: the queue then waits through marks). When `Ok(true)`,
    /// every outstanding mark has completed too and the engine retires them all. Never blocks.
    fn all_done(&mut self) -> MResult<bool> {
        Ok(false)
    }
    /// Host memory of [`INLINE_SLOTS`] x [`INLINE_BYTES`] bytes that the engine copies from
    /// asynchronously (pinned for the copy engine), created at first use; its address.
    fn inline_ring(&mut self) -> MResult<u64>;
    /// The inline ring's address as the GPU addresses it (the default: the host address).
    fn inline_ring_device(&mut self) -> MResult<u64> {
        self.inline_ring()
    }
}

/// Slots of the inline ring: small puts whose source the caller may reuse at once are copied here
/// first (at most this many in flight per queue).
pub const INLINE_SLOTS: usize = 1024;
/// Bytes per inline slot: the largest put taken inline.
pub const INLINE_BYTES: usize = 256;

/// Whole-engine queries ([`CopyEngine::all_done`]) a quiet makes before it places a mark on
/// copies that are not marked yet.
const QUIET_UNMARKED_SPINS: u32 = 16;

/// Copies between every `MARK_EVERY`-th submission get one mark (so a long burst shows progress
/// before quiet); quiet and poll mark whatever is unmarked.
pub const MARK_EVERY: u64 = 32;

/// Copies held back by a batching queue ([`CopyQueue::with_batch`]) are handed to the engine
/// once they add up to this many bytes (a large copy starts at once, with whatever is held).
pub const BATCH_FLUSH_BYTES: usize = 256 << 10;

/// Copies held back by a batching queue go to the engine at the next [`CopyQueue::flush_stale`]
/// once the oldest of them has waited this long (a put nobody quiets still lands).
pub const BATCH_FLUSH_AGE: Duration = Duration::from_micros(20);

/// The queue: counts copies submitted and completed, in marked groups.
///
/// A batching queue ([`CopyQueue::with_batch`]) holds copies back and hands them to the engine
/// as one submission ([`CopyEngine::submit_many`]: one `cuMemcpyBatchAsync` for the copy engine)
/// when `batch` are held, when they add up to [`BATCH_FLUSH_BYTES`], at every poll and quiet, and
/// from progress once the oldest has waited [`BATCH_FLUSH_AGE`]. Copies of one batch run in no
/// particular order among themselves: the queue's ordering promise is then the one NVSHMEM makes
/// for non-blocking operations (complete at quiet, ordered by fence, which waits for the queue).
pub struct CopyQueue<E: CopyEngine> {
    engine: E,
    /// Copies held back for one submission (batching queues only), and since when.
    held: Vec<(u64, u64, usize)>,
    held_bytes: usize,
    held_since: Option<Instant>,
    /// Every held copy is between device-accessible ranges ([`CopyQueue::submit_device`]).
    held_device: bool,
    /// Copies per submission (0 or 1: every copy is handed to the engine at once).
    batch: usize,
    /// Copies covered by each outstanding mark, oldest first.
    groups: VecDeque<u64>,
    /// Copies submitted after the newest mark.
    unmarked: u64,
    submitted: u64,
    completed: u64,
    marks: u64,
    /// The first error since the last quiet (reported once, by quiet).
    error: Option<MoverError>,
}

impl<E: CopyEngine> CopyQueue<E> {
    /// A queue over `engine`.
    pub fn new(engine: E) -> CopyQueue<E> {
        CopyQueue {
            engine,
            held: Vec::new(),
            held_bytes: 0,
            held_since: None,
            held_device: true,
            batch: 0,
            groups: VecDeque::new(),
            unmarked: 0,
            submitted: 0,
            completed: 0,
            marks: 0,
            error: None,
        }
    }

    /// The queue holding up to `batch` copies back for one submission (0 or 1: none held).
    pub fn with_batch(mut self, batch: usize) -> CopyQueue<E> {
        self.batch = batch;
        self
    }

    /// Copies held back, not yet handed to the engine.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Enqueues one copy (non-blocking). An error is returned here and not counted (a batching
    /// queue: the error of the submission this copy completed, whose copies are counted complete
    /// and whose error quiet reports too).
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until [`CopyQueue::quiet`] returned.
    pub unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { self.push(dst, src, len, false) }
    }

    /// [`CopyQueue::submit`] for a copy between device-accessible ranges (see
    /// [`CopyEngine::submit_many_device`]).
    ///
    /// # Safety
    /// As [`CopyQueue::submit`], and both ranges device-accessible.
    pub unsafe fn submit_device(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { self.push(dst, src, len, true) }
    }

    /// The engine (for its counts).
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }

    unsafe fn push(&mut self, dst: u64, src: u64, len: usize, device: bool) -> MResult<()> {
        if self.batch > 1 {
            if self.held.is_empty() {
                self.held_since = Some(Instant::now());
                self.held_device = true;
            }
            self.held_device &= device;
            self.held.push((dst, src, len));
            self.held_bytes += len;
            self.submitted += 1;
            if self.held.len() >= self.batch || self.held_bytes >= BATCH_FLUSH_BYTES {
                return self.flush();
            }
            return Ok(());
        }
        // SAFETY: the caller's guarantee is the engine's.
        unsafe { self.engine.submit(dst, src, len)? };
        self.submitted += 1;
        self.unmarked += 1;
        if self.unmarked >= MARK_EVERY {
            self.mark()?;
        }
        Ok(())
    }

    /// Enqueues copies that may run in any order among themselves, as one submission where the
    /// engine can (see [`CopyEngine::submit_many`]). The ones enqueued are counted; the error that
    /// stopped the rest is returned.
    ///
    /// # Safety
    /// As [`CopyQueue::submit`] for every entry `(dst, src, len)`.
    pub unsafe fn submit_many(&mut self, copies: &[(u64, u64, usize)]) -> MResult<()> {
        // SAFETY: the caller's guarantee is the engine's.
        let (n, err) = unsafe { self.engine.submit_many(copies) };
        self.submitted += n as u64;
        self.unmarked += n as u64;
        if self.unmarked >= MARK_EVERY {
            self.mark()?;
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Hands the held copies to the engine as one submission. Copies the engine refused are
    /// counted complete and their error kept for quiet (and returned).
    pub fn flush(&mut self) -> MResult<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        self.held_since = None;
        // SAFETY: every held copy came through `submit`, whose caller vouched for its ranges until
        // quiet.
        let (n, err) = if self.held_device {
            // SAFETY: as above, and every held copy came through `submit_device`.
            unsafe { self.engine.submit_many_device(&held) }
        } else {
            // SAFETY: as above.
            unsafe { self.engine.submit_many(&held) }
        };
        self.unmarked += n as u64;
        let mut r = Ok(());
        if let Some(e) = err {
            // The refused ones never run: counted complete, the error waits for quiet.
            tracing::error!(
                "copy queue: {} of {} copies not enqueued: {e}",
                held.len() - n,
                held.len()
            );
            self.completed += (held.len() - n) as u64;
            self.error.get_or_insert(e.clone());
            r = Err(e);
        }
        let mut held = held;
        held.clear();
        self.held = held;
        if self.unmarked >= MARK_EVERY {
            self.mark()?;
        }
        r
    }

    /// Flushes the held copies when the oldest has waited [`BATCH_FLUSH_AGE`] (for progress);
    /// an error is kept for quiet.
    pub fn flush_stale(&mut self) {
        if self
            .held_since
            .is_some_and(|t| t.elapsed() >= BATCH_FLUSH_AGE)
        {
            let _ = self.flush();
        }
    }

    fn mark(&mut self) -> MResult<()> {
        if self.unmarked == 0 {
            return Ok(());
        }
        self.engine.mark()?;
        self.marks += 1;
        self.groups.push_back(self.unmarked);
        self.unmarked = 0;
        Ok(())
    }

    /// Enqueues a copy of `bytes` (at most [`INLINE_BYTES`]) to `dst`, taken from the caller at
    /// once: they go through a slot of the inline ring, reused only after the copy that last used it
    /// completed (waiting, up to `deadline`, when [`INLINE_SLOTS`] copies are in flight).
    ///
    /// The copy goes as one between device-accessible ranges ([`CopyQueue::submit_device`]): the
    /// ring is, and `dst` is a peer's mapped memory.
    ///
    /// # Safety
    /// `[dst, dst + bytes.len())` must be valid until [`CopyQueue::quiet`] returned, and
    /// device-accessible where the engine may use a kernel.
    pub unsafe fn submit_inline(
        &mut self,
        dst: u64,
        bytes: &[u8],
        deadline: Instant,
    ) -> MResult<()> {
        if bytes.len() > INLINE_BYTES {
            return Err(MoverError::Invalid(format!(
                "inline copy of {} bytes (at most {INLINE_BYTES})",
                bytes.len()
            )));
        }
        let ring = self.engine.inline_ring()?;
        // Slot `submitted % SLOTS` was last used by copy `submitted - SLOTS`; copies complete in
        // order, so it is free once fewer than SLOTS copies are outstanding.
        let started = Instant::now();
        while self.outstanding() >= INLINE_SLOTS as u64 {
            self.poll();
            if self.outstanding() < INLINE_SLOTS as u64 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(MoverError::Timeout {
                    outstanding: self.outstanding(),
                    waited: started.elapsed(),
                });
            }
            std::thread::yield_now();
        }
        let slot = ring + (self.submitted % INLINE_SLOTS as u64) * INLINE_BYTES as u64;
        // SAFETY: the slot lies in the engine's ring and no outstanding copy reads it (above).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot as *mut u8, bytes.len());
            // The ring is device-accessible; the destination is a peer's (mapped) memory.
            self.push(dst, slot, bytes.len(), true)
        }
    }

    /// Marks what is unmarked and retires every completed group; returns the copies completed by
    /// this call. Errors are kept for quiet (and the affected copies counted complete).
    pub fn poll(&mut self) -> u64 {
        let before = self.completed;
        // A flush error is kept for quiet (its copies counted complete).
        let _ = self.flush();
        if let Err(e) = self.mark() {
            self.fail(e);
        }
        while let Some(&n) = self.groups.front() {
            match self.engine.oldest_done() {
                Ok(true) => {
                    self.groups.pop_front();
                    self.completed += n;
                }
                Ok(false) => break,
                Err(e) => {
                    self.fail(e);
                    break;
                }
            }
        }
        self.completed - before
    }

    /// A failed mark or query: nothing outstanding can be vouched for any more, so every copy is
    /// counted complete and the error waits for quiet.
    fn fail(&mut self, e: MoverError) {
        tracing::error!("copy queue: {e}");
        self.completed = self.submitted - self.held.len() as u64;
        self.groups.clear();
        self.unmarked = 0;
        self.error.get_or_insert(e);
    }

    /// Everything submitted is complete when the engine says so as a whole: count it all
    /// complete (marks included). `false` when not yet, or when the engine cannot tell (an error
    /// is kept for quiet, as a failed query of a mark is).
    fn retire_all_if_done(&mut self) -> bool {
        match self.engine.all_done() {
            Ok(true) => {
                // Held copies are not in the engine yet (quiet flushes before it asks).
                self.completed = self.submitted - self.held.len() as u64;
                self.groups.clear();
                self.unmarked = 0;
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.fail(e);
                true
            }
        }
    }

    /// Copies submitted and not yet seen complete.
    pub fn outstanding(&self) -> u64 {
        self.submitted - self.completed
    }

    /// (submitted, completed, marks) since creation.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.submitted, self.completed, self.marks)
    }

    /// The error quiet will report (a copy failed since the last quiet), left in place.
    pub fn pending_error(&self) -> Option<&MoverError> {
        self.error.as_ref()
    }

    /// Waits until every copy submitted before the call has completed, or `deadline` passes
    /// (error, the copies stay counted as outstanding). Returns the first error since the last
    /// quiet, once.
    ///
    /// Asked of the engine as a whole first ([`CopyEngine::all_done`]): a quiet after a lone copy
    /// then costs no mark (one driver call less, and no wait for the mark to pass the copy).
    pub fn quiet(&mut self, deadline: Instant) -> MResult<()> {
        let started = Instant::now();
        // Held copies go now (an error is kept for the end of this quiet).
        let _ = self.flush();
        let mut spins = 0u32;
        loop {
            if self.outstanding() > 0 && self.retire_all_if_done() {
                break;
            }
            if self.groups.is_empty() && self.unmarked > 0 && spins < QUIET_UNMARKED_SPINS {
                // Not yet complete, not yet marked: ask again a few times before placing a mark.
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            self.poll();
            if self.outstanding() == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(MoverError::Timeout {
                    outstanding: self.outstanding(),
                    waited: started.elapsed(),
                });
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`CopyQueue::quiet`] with a timeout instead of a deadline.
    pub fn quiet_for(&mut self, timeout: Duration) -> MResult<()> {
        self.quiet(Instant::now() + timeout)
    }
}

/// `memcpy` at submission: every mark is complete at once. For copies between host memory of this
/// process, and to test the queue.
#[derive(Default)]
pub struct HostEngine {
    marks: u64,
    ring: Vec<u8>,
}

impl CopyEngine for HostEngine {
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller guarantees both ranges; host ranges of this process (copy semantics
        // of memmove, so overlap is harmless).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }
    fn mark(&mut self) -> MResult<()> {
        self.marks += 1;
        Ok(())
    }
    fn oldest_done(&mut self) -> MResult<bool> {
        if self.marks == 0 {
            return Err(MoverError::Invalid("no mark outstanding".into()));
        }
        self.marks -= 1;
        Ok(true)
    }
    fn inline_ring(&mut self) -> MResult<u64> {
        if self.ring.is_empty() {
            self.ring = vec![0u8; INLINE_SLOTS * INLINE_BYTES];
        }
        Ok(self.ring.as_mut_ptr() as u64)
    }
}

/// CUDA's copy engine: `cuMemcpyAsync` on a non-blocking stream of the transport's context,
/// marks are events (pooled), completion is `cuEventQuery`.
pub struct CudaEngine {
    stream: CopyStream,
    inflight: VecDeque<Event>,
    free: Vec<Event>,
    ring: Option<crate::cuda::MappedHostBuffer>,
}

impl CudaEngine {
    /// An engine with a new stream in context `ctx` (0: the current context); `overlap` as for
    /// [`CopyStream::new`].
    pub fn new(ctx: usize, overlap: bool) -> MResult<CudaEngine> {
        Ok(CudaEngine {
            stream: CopyStream::new(ctx, overlap)?,
            inflight: VecDeque::new(),
            free: Vec::new(),
            ring: None,
        })
    }
}

impl CopyQueue<super::kfront::KernelFront<CudaEngine>> {
    /// Records `ev` on the copy engine's stream after every copy submitted so far, when some may
    /// still be running (`Ok(false)`, nothing recorded, when none is outstanding): work that waits
    /// for `ev` runs after them. Copies still waiting or on the copy kernel are seen applied (or
    /// taken over onto that stream) first, up to `deadline`.
    pub fn record_order(&mut self, ev: &Event, deadline: Instant) -> MResult<bool> {
        self.flush()?;
        self.engine.drain_off_engine(deadline)?;
        self.poll();
        if self.outstanding() == 0 {
            return Ok(false);
        }
        self.engine.inner().stream.record(ev)?;
        Ok(true)
    }
}

impl CopyEngine for CudaEngine {
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { self.stream.copy(dst, src, len) }.map_err(MoverError::from)
    }
    unsafe fn submit_many(&mut self, copies: &[(u64, u64, usize)]) -> (usize, Option<MoverError>) {
        // SAFETY: the caller's guarantee.
        let (n, e) = unsafe { self.stream.copy_many(copies) };
        (n, e.map(MoverError::from))
    }
    fn mark(&mut self) -> MResult<()> {
        let ev = match self.free.pop() {
            Some(e) => e,
            None => Event::new(self.stream.context())?,
        };
        if let Err(e) = self.stream.record(&ev) {
            self.free.push(ev);
            return Err(e.into());
        }
        self.inflight.push_back(ev);
        Ok(())
    }
    fn all_done(&mut self) -> MResult<bool> {
        if !self.stream.idle()? {
            return Ok(false);
        }
        // Every event recorded on the stream has passed.
        self.free.extend(self.inflight.drain(..));
        Ok(true)
    }
    fn oldest_done(&mut self) -> MResult<bool> {
        let Some(ev) = self.inflight.front() else {
            return Err(MoverError::Invalid("no mark outstanding".into()));
        };
        if !ev.done()? {
            return Ok(false);
        }
        let ev = self.inflight.pop_front().expect("front exists");
        self.free.push(ev);
        Ok(true)
    }
    fn inline_ring(&mut self) -> MResult<u64> {
        if self.ring.is_none() {
            let _g = crate::cuda::ContextGuard::enter(self.stream.context())?;
            self.ring = Some(crate::cuda::MappedHostBuffer::new(
                INLINE_SLOTS * INLINE_BYTES,
            )?);
        }
        Ok(self.ring.as_ref().expect("created above").host() as u64)
    }
    fn inline_ring_device(&mut self) -> MResult<u64> {
        self.inline_ring()?;
        Ok(self.ring.as_ref().expect("created above").device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// An engine whose marks complete when the test says so (`release` marks may complete), and
    /// which can be told to fail.
    #[derive(Default)]
    struct Gate {
        submitted: Vec<(u64, u64, usize)>,
        marks: VecDeque<u64>,
        release: Arc<AtomicU64>,
        retired: u64,
        fail_query: bool,
        fail_submit: bool,
        ring: Vec<u8>,
        /// What `all_done` answers: `None` cannot tell (the trait's default), `Some(Ok(b))` says
        /// b, `Some(Err(()))` fails.
        whole: Option<Result<bool, ()>>,
        /// `all_done` calls made.
        whole_asked: u64,
        /// `submit_many` calls made.
        many_calls: u64,
    }

    /// A queue on a gate engine whose marks up to `release` may complete, and that count.
    fn gated(release: u64) -> (Arc<AtomicU64>, CopyQueue<Gate>) {
        let release = Arc::new(AtomicU64::new(release));
        let q = CopyQueue::new(Gate {
            release: release.clone(),
            ..Default::default()
        });
        (release, q)
    }

    impl CopyEngine for Gate {
        unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
            if self.fail_submit {
                return Err(MoverError::Cuda("cuMemcpyAsync: CUDA error 1".into()));
            }
            self.submitted.push((dst, src, len));
            Ok(())
        }
        unsafe fn submit_many(
            &mut self,
            copies: &[(u64, u64, usize)],
        ) -> (usize, Option<MoverError>) {
            self.many_calls += 1;
            for (i, &(d, s, n)) in copies.iter().enumerate() {
                // SAFETY: the gate only records.
                if let Err(e) = unsafe { self.submit(d, s, n) } {
                    return (i, Some(e));
                }
            }
            (copies.len(), None)
        }
        fn mark(&mut self) -> MResult<()> {
            self.marks.push_back(self.submitted.len() as u64);
            Ok(())
        }
        fn oldest_done(&mut self) -> MResult<bool> {
            if self.fail_query {
                return Err(MoverError::Cuda("cuEventQuery: CUDA error 700".into()));
            }
            if self.marks.is_empty() {
                return Err(MoverError::Invalid("no mark".into()));
            }
            if self.retired < self.release.load(Ordering::Acquire) {
                self.retired += 1;
                self.marks.pop_front();
                return Ok(true);
            }
            Ok(false)
        }
        fn inline_ring(&mut self) -> MResult<u64> {
            if self.ring.is_empty() {
                self.ring = vec![0u8; INLINE_SLOTS * INLINE_BYTES];
            }
            Ok(self.ring.as_ptr() as u64)
        }
        fn all_done(&mut self) -> MResult<bool> {
            self.whole_asked += 1;
            match self.whole {
                None => Ok(false),
                Some(Ok(true)) => {
                    self.marks.clear();
                    Ok(true)
                }
                Some(Ok(false)) => Ok(false),
                Some(Err(())) => Err(MoverError::Cuda("cuStreamQuery: CUDA error 700".into())),
            }
        }
    }

    #[test]
    fn quiet_after_a_lone_copy_asks_the_engine_and_places_no_mark() {
        let (_release, mut q) = gated(0);
        q.engine.whole = Some(Ok(true));
        // SAFETY: the gate engine never touches the addresses.
        unsafe { q.submit(0x1000, 0x2000, 8) }.unwrap();
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(q.counts(), (1, 1, 0), "complete, and no mark placed");
        assert!(q.engine.marks.is_empty());
        assert_eq!(q.engine.whole_asked, 1);
        // Nothing outstanding: quiet asks nothing.
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(q.engine.whole_asked, 1);
    }

    #[test]
    fn quiet_marks_when_the_engine_stays_busy_and_retires_marks_the_engine_vouches_for() {
        // The engine says "not yet" as a whole; the mark completes: quiet ends through the mark.
        let (_release, mut q) = gated(1);
        q.engine.whole = Some(Ok(false));
        // SAFETY: as above.
        unsafe { q.submit(0x1000, 0x2000, 8) }.unwrap();
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(
            q.counts(),
            (1, 1, 1),
            "one mark placed after the whole-engine asks"
        );
        assert!(q.engine.whole_asked > QUIET_UNMARKED_SPINS as u64);
        // Marks outstanding (none released) and the engine then says done: all retired at once.
        let (_release, mut q) = gated(0);
        for i in 0..(MARK_EVERY + 3) {
            // SAFETY: as above.
            unsafe { q.submit(0x1000 + i, 0x2000, 8) }.unwrap();
        }
        assert_eq!(q.counts().2, 1, "a mark after MARK_EVERY copies");
        q.engine.whole = Some(Ok(true));
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(q.outstanding(), 0);
        assert!(q.engine.marks.is_empty(), "the engine retired the marks");
    }

    #[test]
    fn a_failed_whole_engine_query_is_reported_by_quiet_once() {
        let (_release, mut q) = gated(0);
        q.engine.whole = Some(Err(()));
        // SAFETY: as above.
        unsafe { q.submit(0x1000, 0x2000, 8) }.unwrap();
        let e = q.quiet_for(Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("cuStreamQuery"), "{e}");
        assert_eq!(
            q.outstanding(),
            0,
            "copies counted complete after the failure"
        );
        q.quiet_for(Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn host_engine_copies_and_quiet_returns() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = vec![0u8; 256];
        let mut q = CopyQueue::new(HostEngine::default());
        for i in 0..4 {
            // SAFETY: both ranges are live for the queue's lifetime.
            unsafe {
                q.submit(
                    dst.as_mut_ptr() as u64 + i * 64,
                    src.as_ptr() as u64 + i * 64,
                    64,
                )
                .unwrap()
            };
        }
        assert_eq!(q.outstanding(), 4);
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(q.outstanding(), 0);
        assert_eq!(dst, src);
        assert_eq!(q.counts(), (4, 4, 1), "four copies, one mark");
    }

    #[test]
    fn submit_many_counts_what_was_enqueued() {
        let (_release, mut q) = gated(u64::MAX);
        let copies: Vec<(u64, u64, usize)> = (0..40u64)
            .map(|i| (0x1000 + i * 8, 0x9000 + i * 8, 8))
            .collect();
        // SAFETY: the gate engine only records the ranges.
        unsafe { q.submit_many(&copies) }.unwrap();
        assert_eq!(q.counts().0, 40, "every copy counted");
        assert_eq!(
            q.counts().2,
            1,
            "one mark once MARK_EVERY copies stand unmarked"
        );
        assert_eq!(q.engine.submitted, copies, "in order, all of them");
        q.engine.fail_submit = true;
        // SAFETY: as above.
        let e = unsafe { q.submit_many(&copies[..3]) }.unwrap_err();
        assert!(e.to_string().contains("CUDA error 1"), "{e}");
        assert_eq!(
            q.counts().0,
            40,
            "nothing more counted after a refused submission"
        );
        q.engine.fail_submit = false;
        // SAFETY: as above.
        unsafe { q.submit_many(&[]) }.unwrap();
        assert_eq!(q.counts().0, 40);
        q.quiet_for(Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn many_copies_share_few_marks() {
        let (_, mut q) = gated(u64::MAX);
        for i in 0..100u64 {
            // SAFETY: the gate engine never touches memory.
            unsafe { q.submit(i, i, 8).unwrap() };
        }
        // 3 marks placed on the way (every 32 copies), the rest marked by quiet.
        assert_eq!(q.counts().2, 3);
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(q.counts(), (100, 100, 4));
        assert_eq!(q.engine.submitted.len(), 100);
    }

    #[test]
    fn poll_counts_completed_groups_in_order() {
        let (release, mut q) = gated(0);
        for i in 0..40u64 {
            // SAFETY: the gate engine never touches memory.
            unsafe { q.submit(i, i, 8).unwrap() };
        }
        assert_eq!(q.poll(), 0);
        assert_eq!(q.outstanding(), 40);
        release.store(1, Ordering::Release);
        assert_eq!(q.poll(), 32, "the first group of 32 completes");
        release.store(2, Ordering::Release);
        assert_eq!(q.poll(), 8);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn quiet_fails_at_its_deadline_and_never_hangs() {
        let mut q = CopyQueue::new(Gate::default()); // marks never complete
                                                     // SAFETY: the gate engine never touches memory.
        unsafe { q.submit(1, 2, 3).unwrap() };
        let t = Instant::now();
        let e = q.quiet_for(Duration::from_millis(50)).unwrap_err();
        let waited = t.elapsed();
        assert!(
            matches!(e, MoverError::Timeout { outstanding: 1, .. }),
            "{e:?}"
        );
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // Still outstanding: a later quiet fails again rather than pretending success.
        assert!(q.quiet_for(Duration::from_millis(1)).is_err());
    }

    #[test]
    fn engine_errors_reach_quiet_once() {
        let mut q = CopyQueue::new(Gate {
            fail_query: true,
            ..Default::default()
        });
        // SAFETY: the gate engine never touches memory.
        unsafe { q.submit(1, 2, 3).unwrap() };
        let e = q.quiet_for(Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(e, MoverError::Cuda(ref m) if m.contains("700")),
            "{e:?}"
        );
        assert_eq!(q.outstanding(), 0);
        q.quiet_for(Duration::from_secs(1))
            .expect("the error is reported once");

        let mut q = CopyQueue::new(Gate {
            fail_submit: true,
            ..Default::default()
        });
        // SAFETY: as above.
        assert!(unsafe { q.submit(1, 2, 3) }.is_err());
        assert_eq!(q.counts(), (0, 0, 0), "a refused copy is not counted");
        q.quiet_for(Duration::from_millis(10)).unwrap();
    }

    #[test]
    fn inline_copies_take_the_bytes_at_once() {
        let mut q = CopyQueue::new(HostEngine::default());
        let mut dst = [0u64; 4];
        for (i, d) in dst.iter_mut().enumerate() {
            let v = (i as u64 + 1) * 0x0101_0101;
            // SAFETY: dst lives until quiet below; the value is copied before submit_inline returns.
            unsafe {
                q.submit_inline(
                    d as *mut u64 as u64,
                    &v.to_le_bytes(),
                    Instant::now() + Duration::from_secs(1),
                )
                .unwrap()
            };
        }
        q.quiet_for(Duration::from_secs(1)).unwrap();
        assert_eq!(dst, [0x0101_0101, 0x0202_0202, 0x0303_0303, 0x0404_0404]);
        // SAFETY: rejected before any copy.
        let big = unsafe { q.submit_inline(0, &[0u8; INLINE_BYTES + 1], Instant::now()) };
        assert!(matches!(big, Err(MoverError::Invalid(_))));
    }

    #[test]
    fn inline_slots_are_reused_only_after_completion() {
        let (release, mut q) = gated(0);
        let soon = || Instant::now() + Duration::from_millis(30);
        for i in 0..INLINE_SLOTS as u64 {
            // SAFETY: the gate engine never touches memory.
            unsafe { q.submit_inline(i, &[i as u8; 8], soon()).unwrap() };
        }
        // Every slot is in flight: the next one times out instead of overwriting slot 0.
        let ring = q.engine.ring.as_ptr();
        // SAFETY: as above.
        let e = unsafe { q.submit_inline(7, &[0xff; 8], soon()) }.unwrap_err();
        assert!(matches!(e, MoverError::Timeout { .. }), "{e:?}");
        // SAFETY: reading the gate's own ring.
        assert_eq!(unsafe { *ring }, 0, "slot 0 untouched");
        // Once the first group (32 copies) completes, slot 0 is reused.
        release.store(1, Ordering::Release);
        // SAFETY: as above.
        unsafe { q.submit_inline(7, &[0xff; 8], soon()).unwrap() };
        // SAFETY: as above.
        assert_eq!(unsafe { *ring }, 0xff);
        assert_eq!(q.engine.submitted.last(), Some(&(7, ring as u64, 8)));
    }

    #[test]
    fn a_batching_queue_holds_copies_until_the_batch_is_full_and_submits_them_once() {
        let (_r, q) = gated(u64::MAX);
        let mut q = q.with_batch(8);
        for i in 0..7u64 {
            // SAFETY: the gate only records.
            unsafe { q.submit(0x1000 + i, 0x2000 + i, 8) }.unwrap();
        }
        assert!(q.engine.submitted.is_empty(), "held back");
        assert_eq!((q.held(), q.outstanding()), (7, 7));
        // SAFETY: as above.
        unsafe { q.submit(0x1007, 0x2007, 8) }.unwrap();
        assert_eq!(q.held(), 0);
        assert_eq!(q.engine.many_calls, 1, "one submission for the eight");
        assert_eq!(q.engine.submitted.len(), 8);
        assert_eq!(q.engine.submitted[7], (0x1007, 0x2007, 8), "in order");
        q.quiet_for(Duration::from_secs(5)).unwrap();
        assert_eq!(q.outstanding(), 0);
        assert_eq!(q.engine.many_calls, 1, "quiet had nothing left to submit");
    }

    #[test]
    fn k_copies_in_flight_then_one_quiet_land_every_byte() {
        // The stream pattern: k non-blocking copies, then one quiet, on a batching queue.
        let mut q = CopyQueue::new(HostEngine::default()).with_batch(64);
        let k = 200usize;
        let src: Vec<u64> = (0..k as u64).map(|i| i * 0x0101_0101).collect();
        let mut dst = vec![0u64; k];
        for i in 0..k {
            // SAFETY: both elements live until quiet returns below.
            unsafe {
                q.submit(
                    &mut dst[i] as *mut u64 as u64,
                    &src[i] as *const u64 as u64,
                    8,
                )
            }
            .unwrap();
        }
        assert_eq!(q.held(), k % 64, "full batches went, the rest is held");
        q.quiet_for(Duration::from_secs(5)).unwrap();
        assert_eq!(dst, src);
        assert_eq!(q.counts().0, k as u64);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn a_large_copy_goes_at_once_with_what_is_held() {
        let (_r, q) = gated(u64::MAX);
        let mut q = q.with_batch(64);
        // SAFETY: the gate only records.
        unsafe { q.submit(1, 2, 8) }.unwrap();
        assert_eq!(q.held(), 1);
        // SAFETY: as above.
        unsafe { q.submit(3, 4, BATCH_FLUSH_BYTES) }.unwrap();
        assert_eq!(q.held(), 0);
        assert_eq!(
            q.engine.submitted,
            vec![(1, 2, 8), (3, 4, BATCH_FLUSH_BYTES)]
        );
    }

    #[test]
    fn held_copies_go_from_progress_once_the_oldest_has_waited() {
        let (_r, q) = gated(u64::MAX);
        let mut q = q.with_batch(64);
        // SAFETY: the gate only records.
        unsafe { q.submit(1, 2, 8) }.unwrap();
        std::thread::sleep(BATCH_FLUSH_AGE * 5);
        q.flush_stale();
        assert_eq!(q.held(), 0);
        assert_eq!(q.engine.submitted, vec![(1, 2, 8)]);
        // Nothing held: nothing to do.
        q.flush_stale();
        assert_eq!(q.engine.many_calls, 1);
    }

    #[test]
    fn a_refused_batch_is_counted_complete_and_reported_by_quiet_once() {
        let (_r, q) = gated(u64::MAX);
        let mut q = q.with_batch(4);
        q.engine.fail_submit = true;
        for i in 0..3 {
            // SAFETY: the gate only records.
            unsafe { q.submit(i, i, 8) }.unwrap();
        }
        // SAFETY: as above.
        let e = unsafe { q.submit(3, 3, 8) }.unwrap_err();
        assert!(e.to_string().contains("CUDA error 1"), "{e}");
        assert_eq!(q.outstanding(), 0, "the refused copies never run");
        let e = q.quiet_for(Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("CUDA error 1"), "{e}");
        q.quiet_for(Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn cuda_engine_needs_a_driver() {
        if crate::cuda::available() {
            return; // covered on the GPU node
        }
        assert!(matches!(CudaEngine::new(0, true), Err(MoverError::Cuda(_))));
    }
}
