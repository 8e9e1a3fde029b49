//! The staged path's small GPU copies as launches of the library's copy kernel.
//!
//! A staged put of a few bytes out of GPU memory cost one copy-engine copy into its send slot at
//! the sender and one out of the receive buffer at the target, about 4 us of driver time each even
//! in one batch call: small puts to another host ran at 0.14 M/s against raw libfabric's 0.33 M/s
//! (results/gpu-2026-11-28e). The records of one coalesced message ([`super::wire::AM_PUT_MULTI`])
//! go instead as one launch of the copy kernel ([`crate::mover::kcopy`]) each way: at the sender
//! from GPU memory into the send slot when the message closes (posted once the launch is seen
//! applied), at the target from the receive buffer into GPU memory (waited for, as the copy-engine
//! batch was). Both slabs are registered with the driver as mapped memory
//! (`cuMemHostRegister(DEVICEMAP)`) at the same address on both sides, so the kernel addresses
//! them directly.
//!
//! A launch that has not started within the stuck limit (a kernel of the application holds every
//! SM) is taken over by the host (the claim protocol) and its copies go through the copy engine,
//! which needs no SM; for a while after that, messages go the copy engine's way at once.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Connected, Transport};
use crate::cuda;
use crate::cuda::kernel::CopyKernel;
use crate::mover::kcopy::{Done, KernelCopies};
use crate::mover::MResult;

/// (destination, source, length) of one copy.
pub(super) type Copy3 = (u64, u64, usize);

/// How long a launch may stay unstarted before the host takes its copies over.
const STUCK: Duration = Duration::from_millis(2);
/// How long messages go the copy engine's way after a take-over.
const HOLD: Duration = Duration::from_millis(100);
/// Largest copy sent through the kernel: one block reading host memory over PCIe moves a few GB/s,
/// so larger records are the copy engine's (records of coalesced messages are at most 16 KiB).
pub(super) const KERNEL_COPY_MAX: usize = 16 << 10;

/// How a launch ended, as [`KStage::take`] reports it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Not decided yet.
    Pending,
    /// The kernel made every copy.
    Applied,
    /// The host owns the launch: these copies were not made; the caller makes them.
    TakenOver(Vec<Copy3>),
}

/// One endpoint's copy kernel launches for the staged path.
pub(super) struct KStage {
    k: KernelCopies<Vec<Copy3>>,
    /// Decided launches not yet asked about: `None` applied, `Some` taken over (the copies).
    decided: HashMap<u64, Option<Vec<Copy3>>>,
    scratch: Vec<Done<Vec<Copy3>>>,
}

impl KStage {
    /// Launches of `kernel` on a stream of their own, checked with one launch the host claimed
    /// beforehand (so the module is loaded and runs before any kernel of the application).
    pub(super) fn cuda(kernel: Arc<CopyKernel>) -> MResult<KStage> {
        let mut k = KernelCopies::cuda(kernel, STUCK, HOLD)?;
        k.check_claimed_launch(Instant::now() + Duration::from_secs(10))?;
        Ok(KStage::with(k))
    }

    fn with(k: KernelCopies<Vec<Copy3>>) -> KStage {
        KStage {
            k,
            decided: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Whether `copies` go through the kernel: one launch's worth of small copies.
    pub(super) fn fits(copies: &[Copy3]) -> bool {
        KernelCopies::<()>::fits(copies)
            && copies
                .iter()
                .all(|c| cuda::kernel::desc_len(c.2) <= KERNEL_COPY_MAX)
    }

    /// Launches `copies`; `None` when they go the copy engine's way (do not fit, held after a
    /// take-over, no slot, or the launch failed: logged by the launcher).
    ///
    /// # Safety
    /// Every range is device-accessible (GPU memory, a mapped slab) and stays valid until the
    /// launch is decided ([`KStage::take`] answers other than `Pending`) and, when taken over,
    /// until the kernel has run (the claim keeps it from touching them).
    pub(super) unsafe fn launch(&mut self, copies: &[Copy3]) -> Option<u64> {
        if !Self::fits(copies) {
            return None;
        }
        // SAFETY: the caller's guarantee.
        unsafe { self.k.launch(copies, copies.to_vec(), Instant::now()) }.ok()
    }

    /// One look at the pending launches (takes over those stuck). Never blocks.
    pub(super) fn poll(&mut self) {
        if self.k.undecided() == 0 {
            return;
        }
        self.k.settle(Instant::now(), &mut self.scratch);
        for d in self.scratch.drain(..) {
            match d {
                Done::Applied(id) => {
                    self.decided.insert(id, None);
                }
                Done::TakenOver(id, copies) => {
                    self.decided.insert(id, Some(copies));
                }
            }
        }
    }

    /// How launch `id` ended (forgotten once reported).
    pub(super) fn take(&mut self, id: u64) -> Outcome {
        match self.decided.remove(&id) {
            None => Outcome::Pending,
            Some(None) => Outcome::Applied,
            Some(Some(c)) => Outcome::TakenOver(c),
        }
    }

    /// Launches `copies` and waits until the launch is decided: `true` when the kernel made them,
    /// `false` when the caller must (not launched, or taken over at the stuck limit). Bounded by the
    /// stuck limit: an undecided launch is taken over then.
    ///
    /// # Safety
    /// As [`KStage::launch`].
    pub(super) unsafe fn copy_now(&mut self, copies: &[Copy3]) -> bool {
        // SAFETY: the caller's guarantee.
        let Some(id) = (unsafe { self.launch(copies) }) else {
            return false;
        };
        loop {
            self.poll();
            match self.take(id) {
                Outcome::Pending => std::hint::spin_loop(),
                Outcome::Applied => return true,
                Outcome::TakenOver(_) => return false,
            }
        }
    }

    /// Launches made, applied by the kernel, taken over by the host (for the log).
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        (self.k.launched, self.k.applied, self.k.taken_over)
    }
}

/// A host slab page-locked for the driver: mapped for the GPU at its own address, or only
/// page-locked where the driver does not map it so.
pub(super) enum SlabPin {
    /// Mapped (`DEVICEMAP`) at its own address; the registration lives as long as this value.
    Mapped { _reg: cuda::HostRegistration },
    /// Page-locked only.
    Pinned { _pin: cuda::HostPin },
}

impl SlabPin {
    /// Registers `[ptr, ptr + len)` mapped (`DEVICEMAP`), keeping it only when the GPU sees it at
    /// the same address (unified addressing); else page-locks it as before. `None` when CUDA is
    /// not usable from this thread or the driver refuses (copies then take the pageable path).
    pub(super) fn new(ptr: *mut u8, len: usize) -> Option<SlabPin> {
        if !cuda::available() || cuda::current_context() == 0 || len == 0 {
            return None;
        }
        // SAFETY: the slab is owned by the endpoint state next to this value and outlives it
        // (field order: the pins drop before the slabs).
        match unsafe {
            cuda::HostRegistration::new(ptr as *mut c_void, len, cuda::HostMapping::ReadWrite)
        } {
            Ok(r) if r.device() == ptr as u64 => return Some(SlabPin::Mapped { _reg: r }),
            Ok(r) => {
                tracing::debug!(
                    "slab {ptr:p} maps at {:#x} on the GPU, not at its own address: page-locked only",
                    r.device()
                );
            }
            Err(e) => tracing::debug!("slab {ptr:p}+{len} not mapped for the GPU ({e})"),
        }
        cuda::HostPin::new(ptr, len).map(|p| SlabPin::Pinned { _pin: p })
    }

    pub(super) fn mapped(&self) -> bool {
        matches!(self, SlabPin::Mapped { .. })
    }
}

impl Drop for KStage {
    fn drop(&mut self) {
        // Launches still undecided are claimed (their kernels then touch nothing) and late
        // kernels waited for, before the slabs they name go (the endpoint drops this first).
        let mut out = Vec::new();
        if !self
            .k
            .close(Instant::now() + Duration::from_secs(1), &mut out)
        {
            tracing::warn!("staged copies: copy kernel launches still pending at close");
        }
        if out.iter().any(|d| matches!(d, Done::TakenOver(..))) {
            tracing::error!(
                "staged copies: a copy kernel launch was still undecided at close: its copies \
                 were not made (a quiet was missing)"
            );
        }
        let (launched, applied, taken_over) = self.counts();
        if launched > 0 {
            tracing::debug!(
                "staged copies: {launched} copy kernel launches, {applied} applied, {taken_over} taken over"
            );
        }
    }
}

impl Transport {
    /// At connect, before any kernel of the application runs (the copy kernel's module loads
    /// here): the same-host copy queues with the kernel in front where `peers_here` PEs share
    /// this host, and the staged path's launches where GPU memory is staged (software providers)
    /// to some peer.
    pub(super) fn prepare_copy_kernels(&self, my_pe: i32, n_pes: i32, peers_here: usize) {
        if self.mover.policy().ipc && peers_here > 0 {
            self.mover.prepare_queues();
        }
        let staged_peers = (0..n_pes)
            .filter(|&p| p != my_pe && (!self.mover.same_host(p) || !self.mover.policy().ipc))
            .count();
        if self.mover.policy().staging && staged_peers > 0 {
            if let Ok(c) = self.conn() {
                self.prepare_kstage(c);
            }
        }
    }

    /// Creates each endpoint's launches of the copy kernel for the staged path (at connect, before
    /// any kernel of the application runs), where `NVSHMEM_EFA_COPY_KERNEL` is on and both of the
    /// endpoint's slabs are mapped for the GPU. Logged either way.
    pub(super) fn prepare_kstage(&self, c: &Connected) {
        let Some(kernel) = self.mover.load_copy_kernel() else {
            return;
        };
        for (i, e) in c.eps.iter().enumerate() {
            if !e.slabs_mapped {
                tracing::debug!(
                    "endpoint {i}: slabs not mapped for the GPU: staged copies go to the copy engine"
                );
                continue;
            }
            match KStage::cuda(kernel.clone()) {
                Ok(ks) => {
                    *e.kstage.lock() = Some(ks);
                    tracing::debug!("endpoint {i}: small staged copies through the copy kernel");
                }
                Err(err) => tracing::warn!(
                    "endpoint {i}: no copy kernel for staged copies ({err}): the copy engine moves them"
                ),
            }
        }
    }

    /// Copies `copies` (receive buffer to GPU memory) now: one launch of the copy kernel where the
    /// endpoint has it, they fit and every destination is GPU memory registered here
    /// (`registered`, as the caller found it: this PE's GPU; a get's buffer may be other device
    /// memory, which the copy engine reaches and a kernel may not), else (or when the launch was
    /// taken over) the copy engine's batch, waited for.
    pub(super) fn copy_in_now(
        &self,
        e: &super::endpoints::EpState,
        copies: &[Copy3],
        registered: bool,
    ) -> super::TResult<()> {
        if registered && KStage::fits(copies) {
            if let Some(ks) = e.kstage.lock().as_mut() {
                // SAFETY: the receive buffer is a mapped slab and the destinations GPU memory
                // registered here; copy_now returns once the launch is decided (a taken-over one
                // never touches them).
                if unsafe { ks.copy_now(copies) } {
                    return Ok(());
                }
            }
        }
        super::memory::copy_many(copies, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(delay: Duration, stuck: Duration) -> KStage {
        KStage::with(KernelCopies::host(delay, stuck, Duration::from_secs(60)).unwrap())
    }

    #[test]
    fn copy_now_makes_the_copies_or_hands_them_back_at_the_stuck_limit() {
        let src: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; 256];
        let copies: Vec<Copy3> = (0..8)
            .map(|i| {
                (
                    dst.as_mut_ptr() as u64 + i * 32,
                    src.as_ptr() as u64 + i * 32,
                    32,
                )
            })
            .collect();
        let mut ks = host(Duration::from_millis(2), Duration::from_secs(5));
        // SAFETY: both buffers outlive the launch (copy_now waits for it).
        assert!(unsafe { ks.copy_now(&copies) });
        assert_eq!(dst, src);
        // A kernel that starts 300 ms late: the host takes it over at 5 ms and the copies are not
        // made; the late kernel leaves them alone.
        dst.fill(0);
        let mut ks = host(Duration::from_millis(300), Duration::from_millis(5));
        let t = Instant::now();
        // SAFETY: as above; the launcher is joined when `ks` drops, before the buffers go.
        assert!(!unsafe { ks.copy_now(&copies) });
        assert!(t.elapsed() < Duration::from_millis(250));
        drop(ks);
        assert!(dst.iter().all(|&b| b == 0), "a taken-over launch copied");
    }

    #[test]
    fn launches_are_reported_once_by_id_and_large_copies_do_not_fit() {
        let src = [7u8; 64];
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        let mut ks = host(Duration::ZERO, Duration::from_secs(5));
        // SAFETY: the buffers outlive the launches (polled until applied; launcher joined at drop).
        let ia = unsafe { ks.launch(&[(a.as_mut_ptr() as u64, src.as_ptr() as u64, 64)]) }.unwrap();
        let ib = unsafe { ks.launch(&[(b.as_mut_ptr() as u64, src.as_ptr() as u64, 64)]) }.unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        let (mut got_a, mut got_b) = (false, false);
        while !(got_a && got_b) {
            assert!(Instant::now() < end, "never applied");
            ks.poll();
            got_a |= ks.take(ia) == Outcome::Applied;
            got_b |= ks.take(ib) == Outcome::Applied;
        }
        assert_eq!(ks.take(ia), Outcome::Pending, "reported twice");
        assert_eq!((a, b), (src, src));
        assert_eq!(ks.counts(), (2, 2, 0));
        let big = vec![0u8; KERNEL_COPY_MAX + 1];
        assert!(!KStage::fits(&[(0, big.as_ptr() as u64, big.len())]));
        assert!(!KStage::fits(&[]));
    }
}
