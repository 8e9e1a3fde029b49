//! Atomics on same-host GPU memory by a one-thread kernel, with the host as the way out.
//!
//! An atomic (every NVSHMEM op, fetching or not) to GPU memory that this process has open through
//! CUDA IPC is one launch of [`crate::cuda::kernel`]'s kernel on a stream of the endpoint's own,
//! ordered after the copies already on the endpoint's copy queue (an event recorded there, waited
//! for by that stream). The kernel's atomic is the GPU's own, so it is atomic against the target
//! GPU's atomics on the word and against the same kernel of any other PE; the provider's atomic it
//! replaces is a read-modify-write from the host, which is not. So, once on, every atomic to such
//! memory goes this way; a fetched value lands where NVSHMEM asked (GPU memory: stored by the
//! kernel; host memory: through the slot, written by the host when it settles the operation).
//!
//! A kernel needs an SM. When the application's kernels hold every SM while they wait for this very
//! atomic, the launch would never run. So each launch has a slot of pinned host memory, and an
//! operation pending longer than the stuck limit is taken over by the host, which carries it the
//! way it went before (the transport's provider or target-applied atomic). Host and kernel decide
//! who applies it with Dekker's two flags:
//!
//! - kernel: write its flag, `fence.sc.sys`, read the host's flag; clear: apply, fence, outcome
//!   [`APPLIED`]; set: outcome [`LEFT`] without touching the target.
//! - host: write its flag, sequentially consistent fence, read the kernel's flag; clear: the host
//!   owns the operation (the kernel, when it runs, will see the host's flag); set: the kernel is
//!   running and its outcome, written within microseconds, says whether the host must apply it.
//!
//! Both reads cannot see the other's flag clear (the store-buffer case that the two fences
//! forbid), so the operation is applied exactly once. A slot the host took over stays in use until
//! the kernel has written [`LEFT`], so a late kernel never writes into a reused slot.
//! The tests below race the host's half against a thread running the kernel's half.
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cuda::kernel::{AmoKernel, AmoOp};
use crate::cuda::stream::{CopyStream, Event};
use crate::cuda::MappedHostBuffer;

use super::{MResult, MoverError};

/// Bytes per slot: host flag, kernel flag, outcome, a spare word, the fetched value (8 bytes), 8
/// spare.
pub const SLOT_BYTES: usize = 32;
/// Slots per endpoint: at most this many kernel atomics pending on one endpoint (the next one
/// waits until a settle frees a slot).
pub const SLOTS: usize = 256;
/// The outcome a kernel writes after applying the operation.
pub const APPLIED: u32 = 1;
/// The outcome a kernel writes when it found the host's flag set and left the target alone.
pub const LEFT: u32 = 2;

const HOST_FLAG: usize = 0;
const KERNEL_FLAG: usize = 1;
const OUTCOME: usize = 2;
/// Byte offset of the fetched value in a slot.
const RESULT_BYTE: usize = 16;

/// What the host's claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The kernel had not started: the host owns the operation.
    Host,
    /// The kernel had started: its outcome decides.
    Racing,
}

/// The host's half of the slot protocol over slots of shared memory (`SLOTS` of them for the
/// atomics, [`crate::mover::kcopy`] has its own count).
pub struct Slots {
    base: *const AtomicU32,
    count: usize,
    free: Vec<u16>,
}

// SAFETY: the slot memory is plain shared memory accessed only through atomics; the owner keeps it
// alive.
unsafe impl Send for Slots {}

impl Slots {
    /// Slots over `SLOTS * SLOT_BYTES` bytes at `base`, 8-byte aligned.
    ///
    /// # Safety
    /// The memory stays valid, and is touched by nobody but this table and the kernels (or test
    /// threads) it hands slots to, for the table's life.
    pub unsafe fn new(base: *mut u8) -> Slots {
        // SAFETY: forwarded contract.
        unsafe { Slots::with_count(base, SLOTS) }
    }

    /// Slots over `count * SLOT_BYTES` bytes at `base`, 8-byte aligned.
    ///
    /// # Safety
    /// As for [`Slots::new`], over `count` slots.
    pub unsafe fn with_count(base: *mut u8, count: usize) -> Slots {
        assert_eq!(base as usize % 8, 0, "slot memory must be 8-byte aligned");
        assert!(count <= usize::from(u16::MAX), "at most 65535 slots");
        Slots {
            base: base as *const AtomicU32,
            count,
            free: (0..count as u16).rev().collect(),
        }
    }

    /// The word `w` of slot `s`.
    fn word(&self, s: u16, w: usize) -> &AtomicU32 {
        debug_assert!((s as usize) < self.count && w < SLOT_BYTES / 4);
        // SAFETY: inside the table's memory (new's contract); AtomicU32 has u32's layout.
        unsafe { &*self.base.add(s as usize * (SLOT_BYTES / 4) + w) }
    }

    /// A free slot, zeroed; `None` when every slot is in use.
    pub fn take(&mut self) -> Option<u16> {
        let s = self.free.pop()?;
        for w in 0..SLOT_BYTES / 4 {
            self.word(s, w).store(0, Ordering::SeqCst);
        }
        Some(s)
    }

    /// Returns slot `s` to the free list (its kernel has written its outcome).
    pub fn give_back(&mut self, s: u16) {
        debug_assert!(!self.free.contains(&s));
        self.free.push(s);
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.count - self.free.len()
    }

    /// The slot's outcome: 0 while its kernel has not decided, else [`APPLIED`] or [`LEFT`].
    pub fn outcome(&self, s: u16) -> u32 {
        self.word(s, OUTCOME).load(Ordering::SeqCst)
    }

    /// The value slot `s`'s kernel fetched into the slot (read once the outcome is [`APPLIED`]).
    pub fn result(&self, s: u16) -> u64 {
        // SAFETY: 8-byte aligned inside slot `s` (32-byte slots from an 8-byte-aligned base);
        // AtomicU64 has u64's layout.
        let w = unsafe {
            &*((self.base as *const u8).add(s as usize * SLOT_BYTES + RESULT_BYTE)
                as *const std::sync::atomic::AtomicU64)
        };
        w.load(Ordering::SeqCst)
    }

    /// The device address of slot `s`'s fetched-value word.
    pub fn result_addr(device_base: u64, s: u16) -> u64 {
        Self::device_addr(device_base, s) + RESULT_BYTE as u64
    }

    /// The host's claim: its flag, a full fence, the kernel's flag.
    pub fn claim(&self, s: u16) -> Claim {
        self.word(s, HOST_FLAG).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.word(s, KERNEL_FLAG).load(Ordering::SeqCst) == 0 {
            Claim::Host
        } else {
            Claim::Racing
        }
    }

    /// The device address of slot `s` for a table whose memory the device sees at `device_base`.
    pub fn device_addr(device_base: u64, s: u16) -> u64 {
        device_base + (s as u64) * SLOT_BYTES as u64
    }

    /// The check each kernel of the library gets where it is loaded: takes a slot, claims it,
    /// `launch`es one launch over the slot's device address (`device_base` as for
    /// [`Slots::device_addr`]) that must find the claim, leave everything alone and answer
    /// [`LEFT`], and waits for that answer until `deadline`. `what` names the kernel in errors.
    pub fn check_claimed_launch(
        &mut self,
        device_base: u64,
        deadline: Instant,
        what: &str,
        launch: impl FnOnce(u64) -> MResult<()>,
    ) -> MResult<()> {
        let s = self
            .take()
            .ok_or_else(|| MoverError::Invalid(format!("{what}: no free slot")))?;
        let claim = self.claim(s);
        let started = Instant::now();
        if let Err(e) = launch(Self::device_addr(device_base, s)) {
            // Nothing will write the slot.
            self.give_back(s);
            return Err(e);
        }
        let outcome = loop {
            let o = self.outcome(s);
            if o != 0 || Instant::now() > deadline {
                break o;
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        // The slot is safe to reuse only once the kernel has written it.
        if outcome != 0 {
            self.give_back(s);
        }
        match (claim, outcome) {
            (Claim::Host, LEFT) => Ok(()),
            (_, 0) => Err(MoverError::Timeout {
                outstanding: 1,
                waited: started.elapsed(),
            }),
            (c, o) => Err(MoverError::Cuda(format!(
                "{what}: a claimed launch answered {o} (claim {c:?}); the slot protocol does not \
                 hold here"
            ))),
        }
    }
}

/// Logs a take-over: the first one (per `warned`) as a warning, later ones at debug level.
pub(super) fn warn_first(warned: &mut bool, msg: &str) {
    if *warned {
        tracing::debug!("{msg}");
    } else {
        *warned = true;
        tracing::warn!("{msg} (logged once; later ones at debug level)");
    }
}

/// What the transport needs to carry a taken-over atomic the other way: the operation as NVSHMEM
/// gave it (plain integers, so that it may wait in another thread's hands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmoRequest {
    /// Target PE.
    pub pe: i32,
    /// NVSHMEM's op code.
    pub op: i32,
    /// Operand size in bytes (4 or 8).
    pub elembytes: i32,
    /// Operand, as NVSHMEM gave it.
    pub val: u64,
    /// Compare value (compare-and-swap).
    pub cmp: u64,
    /// Where a fetched value goes (0: not a fetching op).
    pub retptr: u64,
    /// The result buffer's memory handle, as NVSHMEM gave it.
    pub ret_handle: u64,
    /// The fetched value is the host's to write at `retptr` (host memory), from the slot.
    pub ret_by_host: bool,
    /// The remote descriptor's address, offset and handle (NVSHMEM keeps the handle alive while the
    /// operation is outstanding).
    pub remote: (u64, u64, u64),
    /// Endpoint.
    pub ep: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Launched; the kernel has not decided.
    Launched,
    /// The host set its flag and saw the kernel's: waiting for the kernel's outcome.
    Racing,
    /// The host owns the operation (handed back to the transport); the slot waits for the kernel's
    /// [`LEFT`].
    HostOwns,
}

struct Pending {
    slot: u16,
    at: Instant,
    state: State,
    req: AmoRequest,
}

impl Pending {
    /// An operation just launched on `slot` at `at`.
    fn launched(slot: u16, at: Instant, req: AmoRequest) -> Pending {
        Pending {
            slot,
            at,
            state: State::Launched,
            req,
        }
    }
}

/// Kernel atomics of one endpoint: their stream, slots and pending operations.
pub struct KernelAmos {
    kernel: Arc<AmoKernel>,
    stream: CopyStream,
    /// Recorded on the copy queue's stream; this stream waits for it before a launch.
    order: Event,
    /// The slots' memory; kept (leaked) at drop while a launch is still queued.
    mem: std::mem::ManuallyDrop<MappedHostBuffer>,
    slots: Slots,
    pending: VecDeque<Pending>,
    /// Set when the host took an operation over: until [`KernelAmos::end_host_mode`] (the
    /// transport's next full quiet, when the host's operations have completed), launches are
    /// declined, so that no kernel atomic runs beside one the host carries.
    host_mode: bool,
    /// The first take-over was logged as a warning (later ones at debug level).
    warned: bool,
    /// Applied by kernels (for the log).
    pub applied: u64,
    /// Taken over by the host.
    pub taken_over: u64,
}

/// What one round of [`KernelAmos::settle`] found.
#[derive(Debug, Default)]
pub struct Settled {
    /// Operations the host now owns: the caller carries them another way.
    pub take_over: Vec<AmoRequest>,
    /// Operations still undecided (launched, or racing).
    pub undecided: usize,
    /// Applied operations whose fetched value the caller writes at `retptr` (host memory).
    pub results: Vec<(AmoRequest, u64)>,
}

/// What [`KernelAmos::launch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Launched; decided by a later settle.
    Launched,
    /// Every slot is in use: settle, then try again.
    NoSlot,
    /// The lane is in host mode (operations taken over, no quiet since): the host carries it.
    HostMode,
    /// Not for kernel atomics here (off, memory not open, no native atomics, a result buffer the
    /// kernel cannot reach): the host carries it.
    NotHere,
}

impl KernelAmos {
    /// A lane in `kernel`'s context: a new non-blocking stream, an event, and the slots.
    pub fn new(kernel: Arc<AmoKernel>) -> MResult<KernelAmos> {
        let ctx = kernel.context();
        let stream = CopyStream::new(ctx, false)?;
        let order = Event::new(ctx)?;
        let mem = MappedHostBuffer::new(SLOTS * SLOT_BYTES)?;
        // SAFETY: the buffer is SLOTS * SLOT_BYTES bytes, page aligned and owned by this lane;
        // Drop frees it only once the lane's stream has run every launch (else keeps it), and the
        // slots are not touched after that.
        let slots = unsafe { Slots::new(mem.host()) };
        Ok(KernelAmos {
            kernel,
            stream,
            order,
            mem: std::mem::ManuallyDrop::new(mem),
            slots,
            pending: VecDeque::new(),
            host_mode: false,
            warned: false,
            applied: 0,
            taken_over: 0,
        })
    }

    /// Operations launched and not yet decided, plus slots still waiting for a late kernel.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Launches one operation on `target` (device-accessible, aligned), after everything on the
    /// copy queue (recorded there by `record_order`, which returns whether it recorded: the copy
    /// queue's stream has work). `val` is the operand as the kernel takes it; a fetched value goes
    /// to `result` (device-accessible), or into the slot when `req.ret_by_host`.
    ///
    /// # Safety
    /// `target` and `result` stay valid (mapped) until the operation is decided and its kernel
    /// has run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &mut self,
        record_order: impl FnOnce(&Event) -> MResult<bool>,
        target: u64,
        op: AmoOp,
        size: u32,
        val: u64,
        result: u64,
        req: AmoRequest,
        now: Instant,
    ) -> MResult<Launch> {
        if self.host_mode {
            return Ok(Launch::HostMode);
        }
        let Some(s) = self.slots.take() else {
            return Ok(Launch::NoSlot);
        };
        let launched = (|| {
            if record_order(&self.order)? {
                self.stream.wait(&self.order)?;
            }
            let slot = Slots::device_addr(self.mem.device(), s);
            let result = if req.ret_by_host {
                Slots::result_addr(self.mem.device(), s)
            } else {
                result
            };
            // SAFETY: the caller vouches for the target and the result; the slot is zeroed, 32
            // bytes of this lane's mapped buffer, which outlives the launch (Drop waits for the
            // stream).
            unsafe {
                self.kernel
                    .launch(&self.stream, target, val, req.cmp, result, op, size, slot)
            }
            .map_err(MoverError::from)
        })();
        match launched {
            Ok(()) => {
                self.pending.push_back(Pending::launched(s, now, req));
                Ok(Launch::Launched)
            }
            Err(e) => {
                self.slots.give_back(s);
                Err(e)
            }
        }
    }

    /// One look at every pending operation at time `now`: retires the decided ones, and takes over
    /// those pending for `stuck` or longer. Never blocks.
    pub fn settle(&mut self, now: Instant, stuck: Duration) -> Settled {
        let r = settle(&mut self.slots, &mut self.pending, now, stuck, |applied| {
            if applied {
                self.applied += 1
            } else {
                self.taken_over += 1
            }
        });
        if !r.take_over.is_empty() && !self.host_mode {
            self.host_mode = true;
            let msg = format!(
                "kernel atomics: {} atomic(s) whose kernel had not started after {stuck:?} go the \
                 provider's way (a read-modify-write from the host), and so does every atomic of \
                 this endpoint until its next quiet; an atomic of another PE's kernel on the same \
                 word meanwhile is not atomic against them",
                r.take_over.len()
            );
            warn_first(&mut self.warned, &msg);
        }
        r
    }

    /// Whether launches are declined because the host took operations over (see `host_mode`).
    pub fn in_host_mode(&self) -> bool {
        self.host_mode
    }

    /// Allows launches again once no operation is undecided; call when every operation the host
    /// took over has completed. Returns whether the lane launches again.
    pub fn end_host_mode(&mut self) -> bool {
        if self
            .pending
            .iter()
            .all(|p| matches!(p.state, State::HostOwns))
        {
            self.host_mode = false;
        }
        !self.host_mode
    }

    /// One launch the host has claimed beforehand, waited for until `deadline`: the kernel must
    /// leave its (null) target alone and answer [`LEFT`]. Loads and checks everything a real
    /// launch needs.
    pub fn check_claimed_launch(&mut self, deadline: Instant) -> MResult<()> {
        let (kernel, stream) = (&self.kernel, &self.stream);
        self.slots
            .check_claimed_launch(self.mem.device(), deadline, "kernel atomics", |slot| {
                // SAFETY: the kernel finds the host's flag set and touches neither the (null)
                // target nor anything but the slot, which this lane owns.
                unsafe { kernel.launch(stream, 0, 0, 0, 0, AmoOp::Add, 8, slot) }
                    .map_err(Into::into)
            })
    }

    /// Whether the lane's stream has run everything launched on it.
    pub fn idle(&self) -> bool {
        self.stream.idle().unwrap_or(false)
    }
}

/// [`KernelAmos::settle`] over a slot table and its pending list (separate for the tests). `count`
/// hears `true` for an operation a kernel applied and `false` for one the host took over.
fn settle(
    slots: &mut Slots,
    pending: &mut VecDeque<Pending>,
    now: Instant,
    stuck: Duration,
    mut count: impl FnMut(bool),
) -> Settled {
    let mut out = Settled::default();
    // Once one operation is taken over, every younger one still undecided is too: they wait
    // behind it on the lane's stream, and a kernel of theirs must not run while the host carries
    // the older one (same word: the host's read-modify-write is not atomic against it).
    let mut taking = false;
    pending.retain_mut(|p| {
        let outcome = slots.outcome(p.slot);
        match (p.state, outcome) {
            (State::Launched | State::Racing, APPLIED) => {
                count(true);
                if p.req.ret_by_host {
                    out.results.push((p.req, slots.result(p.slot)));
                }
                slots.give_back(p.slot);
                false
            }
            (State::Racing, LEFT) => {
                count(false);
                out.take_over.push(p.req);
                slots.give_back(p.slot);
                false
            }
            (State::Launched, 0) if taking || now.saturating_duration_since(p.at) >= stuck => {
                match slots.claim(p.slot) {
                    Claim::Host => {
                        count(false);
                        taking = true;
                        out.take_over.push(p.req);
                        p.state = State::HostOwns;
                        tracing::debug!(
                            "atomic to PE {} (op {}): its kernel had not run after {stuck:?}; the \
                             host carries it",
                            p.req.pe,
                            p.req.op
                        );
                    }
                    Claim::Racing => {
                        p.state = State::Racing;
                        out.undecided += 1;
                    }
                }
                true
            }
            (State::HostOwns, LEFT) => {
                slots.give_back(p.slot);
                false
            }
            (State::HostOwns, 0) => true,
            (State::HostOwns, other) | (State::Launched, other @ LEFT) | (_, other @ 3..) => {
                // The protocol rules these out; say so loudly rather than guess.
                tracing::error!(
                    "atomic to PE {} (op {}): slot {} in state {:?} reads outcome {other}; the \
                     slot is retired",
                    p.req.pe,
                    p.req.op,
                    p.slot,
                    p.state
                );
                slots.give_back(p.slot);
                false
            }
            _ => {
                out.undecided += 1;
                true
            }
        }
    });
    out
}

impl Drop for KernelAmos {
    fn drop(&mut self) {
        // A kernel still queued would write into the slots after they are freed: wait for the
        // stream a while, and keep the memory (leak it) if it does not drain.
        let t = Instant::now();
        while !self.idle() && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.idle() {
            // SAFETY: dropped once, here; no launch is left to touch it.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.mem) };
        } else {
            tracing::warn!(
                "kernel atomics: {} launch(es) still queued at finalize; their slot memory and \
                 the kernel's module are kept",
                self.pending.len()
            );
            std::mem::forget(self.kernel.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's half of the protocol, as `amo.ptx` does it, with `apply` for the atomic.
    fn kernel_side(words: &[AtomicU32], apply: impl FnOnce()) -> bool {
        words[KERNEL_FLAG].store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if words[HOST_FLAG].load(Ordering::SeqCst) != 0 {
            words[OUTCOME].store(LEFT, Ordering::SeqCst);
            return false;
        }
        apply();
        fence(Ordering::SeqCst);
        words[OUTCOME].store(APPLIED, Ordering::SeqCst);
        true
    }

    /// The four flag words of slot `s` in a test table's memory.
    fn words(mem: &[AtomicU32], s: u16) -> &[AtomicU32] {
        let b = s as usize * SLOT_BYTES / 4;
        &mem[b..b + 4]
    }

    /// Slot memory for the tests: 8-byte aligned like the lane's pinned buffer, seen as words.
    struct TestMem(Vec<std::sync::atomic::AtomicU64>);

    impl TestMem {
        fn new() -> TestMem {
            TestMem(
                (0..SLOTS * SLOT_BYTES / 8)
                    .map(|_| std::sync::atomic::AtomicU64::new(0))
                    .collect(),
            )
        }
    }

    impl std::ops::Deref for TestMem {
        type Target = [AtomicU32];
        fn deref(&self) -> &[AtomicU32] {
            // SAFETY: two AtomicU32 per AtomicU64, same memory, alignment 8 >= 4; the view lives
            // as long as the borrow of the vector.
            unsafe {
                std::slice::from_raw_parts(self.0.as_ptr() as *const AtomicU32, self.0.len() * 2)
            }
        }
    }

    fn table() -> (TestMem, Slots) {
        let mem = TestMem::new();
        // SAFETY: the memory outlives the table in every test (returned together, dropped after).
        let slots = unsafe { Slots::new(mem.as_ptr() as *mut u8) };
        (mem, slots)
    }

    fn req(pe: i32) -> AmoRequest {
        AmoRequest {
            pe,
            op: 10,
            elembytes: 8,
            val: 1,
            cmp: 0,
            retptr: 0,
            ret_handle: 0,
            ret_by_host: false,
            remote: (0x1000, 0, 0),
            ep: 0,
        }
    }

    #[test]
    fn host_and_kernel_racing_apply_each_operation_exactly_once() {
        // A thread plays the kernel; each round both sides start together on a fresh slot, the
        // host claiming at once, and exactly one of them applies.
        const ROUNDS: u32 = 20_000;
        let mem = Arc::new(TestMem::new());
        // SAFETY: `mem` outlives the table (dropped at the end of the test, after the thread).
        let mut slots = unsafe { Slots::new(mem.as_ptr() as *mut u8) };
        let round = Arc::new(AtomicU32::new(0));
        let decided = Arc::new(AtomicU32::new(0));
        let slot_of_round = Arc::new(AtomicU32::new(0));
        let applied = Arc::new(AtomicU32::new(0));
        let kernel = {
            let (mem, round, decided, slot_of_round, applied) = (
                mem.clone(),
                round.clone(),
                decided.clone(),
                slot_of_round.clone(),
                applied.clone(),
            );
            std::thread::spawn(move || {
                let mut by_kernel = 0u32;
                for r in 1..=ROUNDS {
                    while round.load(Ordering::SeqCst) != r {
                        std::hint::spin_loop();
                    }
                    let s = slot_of_round.load(Ordering::SeqCst) as usize;
                    if kernel_side(words(&mem, s as u16), || {
                        applied.fetch_add(1, Ordering::SeqCst);
                    }) {
                        by_kernel += 1;
                    }
                    decided.store(r, Ordering::SeqCst);
                }
                by_kernel
            })
        };
        let (mut by_host, mut racing) = (0u32, 0u32);
        for r in 1..=ROUNDS {
            let s = slots.take().unwrap();
            applied.store(0, Ordering::SeqCst);
            slot_of_round.store(s as u32, Ordering::SeqCst);
            round.store(r, Ordering::SeqCst);
            // A varying head start for the kernel, so that every interleaving comes up.
            for _ in 0..(r % 512) {
                std::hint::spin_loop();
            }
            let claim = slots.claim(s);
            racing += u32::from(claim == Claim::Racing);
            while decided.load(Ordering::SeqCst) != r {
                std::hint::spin_loop();
            }
            let outcome = slots.outcome(s);
            let host_applies = claim == Claim::Host || outcome == LEFT;
            if claim == Claim::Host {
                assert_eq!(
                    outcome, LEFT,
                    "round {r}: the host owned it, the kernel must leave it"
                );
            }
            if host_applies {
                applied.fetch_add(1, Ordering::SeqCst);
                by_host += 1;
            }
            assert_eq!(
                applied.load(Ordering::SeqCst),
                1,
                "round {r}: applied exactly once"
            );
            slots.give_back(s);
        }
        let by_kernel = kernel.join().unwrap();
        assert_eq!(by_kernel + by_host, ROUNDS);
        eprintln!("kernel applied {by_kernel}, host {by_host}; the host's claim met a started kernel {racing} times");
    }

    #[test]
    fn settle_retires_applied_and_takes_over_stuck_operations() {
        let (mem, mut slots) = table();
        let mut pending = VecDeque::new();
        let t0 = Instant::now();
        let stuck = Duration::from_millis(1);
        for pe in 0..3 {
            let s = slots.take().unwrap();
            pending.push_back(Pending::launched(s, t0, req(pe)));
        }
        let words = |s: u16| words(&mem, s);
        // PE 0's kernel ran.
        assert!(kernel_side(words(pending[0].slot), || {}));
        let (mut applied, mut over) = (0, 0);
        let mut count = |a: bool| if a { applied += 1 } else { over += 1 };
        // Before the stuck limit: one retired, two undecided, nothing taken over.
        let r = settle(&mut slots, &mut pending, t0, stuck, &mut count);
        assert_eq!((r.take_over.len(), r.undecided, pending.len()), (0, 2, 2));
        assert_eq!(slots.in_use(), 2);
        // Past it: the host owns both; their slots stay in use.
        let r = settle(&mut slots, &mut pending, t0 + stuck, stuck, &mut count);
        assert_eq!(r.take_over, vec![req(1), req(2)]);
        assert_eq!((r.undecided, pending.len(), slots.in_use()), (0, 2, 2));
        // The late kernels run, see the host's flag and leave the target alone.
        let (s1, s2) = (pending[0].slot, pending[1].slot);
        assert!(!kernel_side(words(s1), || panic!("applied twice")));
        let r = settle(&mut slots, &mut pending, t0 + stuck, stuck, &mut count);
        assert_eq!((r.take_over.len(), r.undecided, pending.len()), (0, 0, 1));
        assert!(!kernel_side(words(s2), || panic!("applied twice")));
        settle(&mut slots, &mut pending, t0 + stuck, stuck, &mut count);
        assert!(pending.is_empty());
        assert_eq!(slots.in_use(), 0);
        assert_eq!((applied, over), (1, 2));
    }

    #[test]
    fn a_take_over_takes_every_younger_undecided_operation_too() {
        let (mem, mut slots) = table();
        let mut pending = VecDeque::new();
        let t0 = Instant::now();
        let stuck = Duration::from_millis(5);
        for (pe, age) in [(0, 10), (1, 1), (2, 0)] {
            let s = slots.take().unwrap();
            pending.push_back(Pending::launched(
                s,
                t0 + Duration::from_millis(10 - age),
                req(pe),
            ));
        }
        // Only PE 0's is past the limit, but the younger two wait behind it: all three go.
        let now = t0 + Duration::from_millis(10);
        let r = settle(&mut slots, &mut pending, now, stuck, |_| {});
        assert_eq!(r.take_over, vec![req(0), req(1), req(2)]);
        assert!(pending.iter().all(|p| p.state == State::HostOwns));
        for p in &pending {
            let w = words(&mem, p.slot);
            assert!(!kernel_side(w, || panic!(
                "a younger kernel applied it too"
            )));
        }
        settle(&mut slots, &mut pending, now, stuck, |_| {});
        assert!(pending.is_empty());
    }

    #[test]
    fn a_running_kernel_decides_and_a_left_outcome_goes_to_the_host() {
        let (mem, mut slots) = table();
        let mut pending = VecDeque::new();
        let t0 = Instant::now();
        let s = slots.take().unwrap();
        pending.push_back(Pending::launched(s, t0, req(7)));
        let w = words(&mem, s);
        // The kernel has announced itself but not decided yet when the host claims.
        w[KERNEL_FLAG].store(1, Ordering::SeqCst);
        let r = settle(&mut slots, &mut pending, t0, Duration::ZERO, |_| {});
        assert_eq!((r.take_over.len(), r.undecided), (0, 1));
        assert_eq!(pending[0].state, State::Racing);
        // It saw the host's flag: outcome LEFT, the host carries it.
        w[OUTCOME].store(LEFT, Ordering::SeqCst);
        let r = settle(&mut slots, &mut pending, t0, Duration::ZERO, |_| {});
        assert_eq!(r.take_over, vec![req(7)]);
        assert!(pending.is_empty());
        assert_eq!(slots.in_use(), 0);
    }

    #[test]
    fn an_applied_fetch_for_host_memory_hands_its_value_back() {
        let (mem, mut slots) = table();
        let mut pending = VecDeque::new();
        let t0 = Instant::now();
        let s = slots.take().unwrap();
        let fetch = AmoRequest {
            retptr: 0xdead_0000,
            ret_by_host: true,
            ..req(3)
        };
        pending.push_back(Pending::launched(s, t0, fetch));
        let w = words(&mem, s);
        // The kernel stores the old value in the slot, then its outcome.
        assert!(kernel_side(w, || {
            let r = &mem[s as usize * SLOT_BYTES / 4 + RESULT_BYTE / 4..];
            r[0].store(0x89ab_cdef, Ordering::SeqCst);
            r[1].store(0x0123_4567, Ordering::SeqCst);
        }));
        let r = settle(&mut slots, &mut pending, t0, Duration::from_secs(1), |_| {});
        assert_eq!(r.results, vec![(fetch, 0x0123_4567_89ab_cdef)]);
        assert!(r.take_over.is_empty() && pending.is_empty());
    }

    #[test]
    fn slots_run_out_and_come_back_zeroed() {
        let (mem, mut slots) = table();
        let taken: Vec<u16> = (0..SLOTS).map(|_| slots.take().unwrap()).collect();
        assert!(slots.take().is_none(), "every slot in use");
        words(&mem, taken[5])[OUTCOME].store(APPLIED, Ordering::SeqCst);
        slots.give_back(taken[5]);
        let again = slots.take().unwrap();
        assert_eq!(again, taken[5]);
        assert_eq!(slots.outcome(again), 0, "zeroed when taken");
        assert_eq!(Slots::device_addr(0x1000, 3), 0x1000 + 96);
        assert_eq!(Slots::result_addr(0x1000, 3), 0x1000 + 112);
    }

    #[test]
    fn an_impossible_outcome_retires_the_slot_without_taking_over() {
        let (mem, mut slots) = table();
        let mut pending = VecDeque::new();
        let s = slots.take().unwrap();
        let t0 = Instant::now();
        pending.push_back(Pending::launched(s, t0, req(1)));
        words(&mem, s)[OUTCOME].store(9, Ordering::SeqCst);
        let r = settle(&mut slots, &mut pending, t0, Duration::from_secs(1), |_| {});
        assert!(r.take_over.is_empty() && pending.is_empty());
        assert_eq!(slots.in_use(), 0);
    }
}
