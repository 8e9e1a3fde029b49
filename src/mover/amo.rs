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
//! who applies it with the handshake of [`crate::mover::claim`] (Dekker's two flags), under
//! [`POLICY`]: each launch timed from when it was made, and an operation found in a state the
//! protocol rules out is dropped (never applied twice), with an error.
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cuda::kernel::{AmoKernel, AmoOp};
use crate::cuda::stream::{CopyStream, Event};
use crate::cuda::MappedHostBuffer;

use super::claim::{warn_first, Decided, Ledger, OnBroken, Policy, Slots, Timing, SLOT_BYTES};
use super::{MResult, MoverError};

/// Slots per endpoint: at most this many kernel atomics pending on one endpoint (the next one
/// waits until a settle frees a slot).
pub const SLOTS: usize = 256;

/// The claim protocol's parameters for kernel atomics: a launch waits behind the copy queue's work
/// (the event) as well as behind the lane's earlier launches, and the stuck limit bounds that whole
/// wait, so each is timed from when it was made (a take-over still takes every younger one with
/// it); an atomic found in an impossible state may have been applied already, so it is dropped
/// rather than carried again.
pub const POLICY: Policy = Policy {
    timing: Timing::FromLaunch,
    on_broken: OnBroken::Drop,
    what: "kernel atomics",
};

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

/// Kernel atomics of one endpoint: their stream, slots and pending operations.
pub struct KernelAmos {
    kernel: Arc<AmoKernel>,
    stream: CopyStream,
    /// Recorded on the copy queue's stream; this stream waits for it before a launch.
    order: Event,
    /// The slots' memory; kept (leaked) at drop while a launch is still queued.
    mem: std::mem::ManuallyDrop<MappedHostBuffer>,
    /// The claim protocol's host side over the slots.
    ledger: Ledger<AmoRequest>,
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
        let slots = unsafe { Slots::with_count(mem.host(), SLOTS) };
        Ok(KernelAmos {
            kernel,
            stream,
            order,
            mem: std::mem::ManuallyDrop::new(mem),
            ledger: Ledger::new(slots, POLICY),
            host_mode: false,
            warned: false,
            applied: 0,
            taken_over: 0,
        })
    }

    /// Operations launched and not yet decided, plus slots still waiting for a late kernel.
    pub fn in_flight(&self) -> usize {
        self.ledger.pending()
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
        let Some(s) = self.ledger.take_slot() else {
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
                self.ledger.launched(s, now, req);
                Ok(Launch::Launched)
            }
            Err(e) => {
                self.ledger.unlaunched(s);
                Err(e)
            }
        }
    }

    /// One look at every pending operation at time `now`: retires the decided ones, and takes over
    /// those pending for `stuck` or longer. Never blocks.
    pub fn settle(&mut self, now: Instant, stuck: Duration) -> Settled {
        let r = settle(&mut self.ledger, now, stuck);
        self.applied = self.ledger.counts.applied;
        self.taken_over = self.ledger.counts.taken_over;
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
        if self.ledger.undecided() == 0 {
            self.host_mode = false;
        }
        !self.host_mode
    }

    /// One launch the host has claimed beforehand, waited for until `deadline`: the kernel must
    /// leave its (null) target alone and answer [`LEFT`]. Loads and checks everything a real
    /// launch needs.
    pub fn check_claimed_launch(&mut self, deadline: Instant) -> MResult<()> {
        let (kernel, stream) = (&self.kernel, &self.stream);
        let device = self.mem.device();
        self.ledger
            .slots_mut()
            .check_claimed_launch(device, deadline, "kernel atomics", |slot| {
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

/// [`KernelAmos::settle`] over the lane's ledger (separate for the tests): the claim protocol's
/// round, its outcomes sorted for the transport.
fn settle(ledger: &mut Ledger<AmoRequest>, now: Instant, stuck: Duration) -> Settled {
    let mut decided = Vec::new();
    let round = ledger.settle(now, stuck, &mut decided);
    let mut out = Settled {
        undecided: round.undecided,
        ..Settled::default()
    };
    for d in decided {
        match d {
            Decided::Applied {
                payload: req,
                result,
                ..
            } => {
                if req.ret_by_host {
                    out.results.push((req, result));
                }
            }
            Decided::TakenOver { payload: req, .. } => {
                tracing::debug!(
                    "atomic to PE {} (op {}): its kernel did not apply it (not started after \
                     {stuck:?}, or it lost the race); the host carries it",
                    req.pe,
                    req.op
                );
                out.take_over.push(req);
            }
        }
    }
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
                self.ledger.pending()
            );
            std::mem::forget(self.kernel.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    //! How a lane sorts the claim protocol's outcomes for the transport (the protocol itself:
    //! `claim::tests`; on the GPU: `gpu_tests`).
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::*;
    use crate::mover::claim::{Phase, APPLIED, LEFT};

    /// Slot memory for the tests: 8-byte aligned like the lane's pinned buffer.
    fn table() -> (Vec<AtomicU64>, Ledger<AmoRequest>) {
        let mem: Vec<AtomicU64> = (0..SLOTS * SLOT_BYTES / 8)
            .map(|_| AtomicU64::new(0))
            .collect();
        // SAFETY: the memory is returned with the ledger and lives as long as it in every test;
        // the ledger touches it only in calls made while both are alive (not on drop).
        let slots = unsafe { Slots::with_count(mem.as_ptr() as *mut u8, SLOTS) };
        (mem, Ledger::new(slots, POLICY))
    }

    /// Word `w` of slot `s` (0 host flag, 1 kernel flag, 2 outcome, 4-5 fetched value).
    fn word(mem: &[AtomicU64], s: u16, w: usize) -> &AtomicU32 {
        // SAFETY: inside `mem` (slot s of SLOTS), 4-aligned; AtomicU32 has u32's layout.
        unsafe { &*((mem.as_ptr() as *const AtomicU32).add(s as usize * SLOT_BYTES / 4 + w)) }
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
    fn the_policy_times_each_launch_and_never_applies_twice() {
        assert_eq!(POLICY.timing, Timing::FromLaunch);
        assert_eq!(POLICY.on_broken, OnBroken::Drop);
    }

    #[test]
    fn settle_sorts_fetched_values_take_overs_and_undecided_operations() {
        let (mem, mut l) = table();
        let t0 = Instant::now();
        let fetch = AmoRequest {
            retptr: 0xdead_0000,
            ret_by_host: true,
            ..req(3)
        };
        let plain = req(4);
        let s0 = l.take_slot().unwrap();
        l.launched(s0, t0, fetch);
        let s1 = l.take_slot().unwrap();
        l.launched(s1, t0, plain);
        let s2 = l.take_slot().unwrap();
        l.launched(s2, t0 + Duration::from_millis(5), req(5));
        // The fetch's kernel stores the old value in the slot, then APPLIED; the plain one's
        // kernel applied too (no value for the host); the third has not run.
        word(&mem, s0, 4).store(0x89ab_cdef, Ordering::SeqCst);
        word(&mem, s0, 5).store(0x0123_4567, Ordering::SeqCst);
        word(&mem, s0, 2).store(APPLIED, Ordering::SeqCst);
        word(&mem, s1, 2).store(APPLIED, Ordering::SeqCst);
        let r = settle(
            &mut l,
            t0 + Duration::from_millis(5),
            Duration::from_millis(1),
        );
        assert_eq!(r.results, vec![(fetch, 0x0123_4567_89ab_cdef)]);
        assert!(r.take_over.is_empty());
        assert_eq!(r.undecided, 1);
        // Past its limit the third is taken over; its slot waits for the late kernel.
        let r = settle(
            &mut l,
            t0 + Duration::from_millis(6),
            Duration::from_millis(1),
        );
        assert_eq!(r.take_over, vec![req(5)]);
        assert_eq!((r.undecided, l.pending()), (0, 1));
        assert_eq!(l.phases().collect::<Vec<_>>(), vec![Phase::HostOwns]);
        word(&mem, s2, 2).store(LEFT, Ordering::SeqCst);
        settle(
            &mut l,
            t0 + Duration::from_millis(6),
            Duration::from_millis(1),
        );
        assert_eq!((l.pending(), l.slots().in_use()), (0, 0));
        assert_eq!((l.counts.applied, l.counts.taken_over), (2, 1));
    }

    /// `LEFT` on a launch the host never claimed: the kernel may have seen a stale flag; the
    /// atomic is neither applied by the host nor reported applied (an error is logged).
    #[test]
    fn an_impossible_outcome_retires_the_slot_without_taking_over() {
        for outcome in [LEFT, 9] {
            let (mem, mut l) = table();
            let t0 = Instant::now();
            let s = l.take_slot().unwrap();
            l.launched(s, t0, req(1));
            word(&mem, s, 2).store(outcome, Ordering::SeqCst);
            let r = settle(&mut l, t0, Duration::from_secs(1));
            assert!(r.take_over.is_empty() && r.results.is_empty(), "{outcome}");
            assert_eq!(
                (l.pending(), l.slots().in_use(), l.counts.broken),
                (0, 0, 1)
            );
        }
    }
}
