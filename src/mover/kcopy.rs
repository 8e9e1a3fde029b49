//! Batches of small copies as one launch of the library's copy kernel, with the host as the way out.
//!
//! A small copy on the copy engine costs about a microsecond of engine time, and the software
//! queue's host route makes two of them per RDMA WQE (into a pinned bounce ring and out again):
//! a consumer round of 64 eight-byte puts spent about 140 us there. One launch of
//! [`crate::cuda::kernel`]'s copy kernel moves a whole round (up to [`COPY_MAX`] copies of at most
//! [`MAX_COPY_BYTES`] each) in one hop, GPU memory to GPU memory.
//!
//! A kernel needs an SM. When the application's kernels hold every SM while they wait for these
//! very copies, the launch would never run. So each launch has a slot of pinned host memory, and a
//! launch that has not started within the stuck limit is taken over: the caller gets its payload
//! back and moves the copies the way it did before (the copy engine's two hops, which need no SM).
//! Host and kernel decide who moves them with the handshake of [`crate::mover::claim`] (Dekker's
//! two flags: each side writes its flag, a sequentially consistent system-scope fence, reads the
//! other's), so a launch's copies are made exactly once, by one side. A late kernel finds the
//! host's flag set, leaves every destination alone and answers [`LEFT`]; its slot stays in use
//! until then.
//!
//! Launches run in stream order ([`POLICY`]: only the oldest undecided launch is timed), so once
//! one is taken over the younger ones still waiting are taken over with it, and for `hold`
//! afterwards batches go the copy engine's way (a grid that holds every SM usually holds them for
//! a while). A launch found in a state the protocol rules out is handed back to the host with an
//! error: copies of unchanged sources are harmless to make twice, and must not be lost.
//!
//! Where CUDA is not usable, [`HostLauncher`] plays the kernel's half on a thread (plain memory,
//! `memmove`), so the protocol runs in the tests as it does on the GPU.
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::cuda::kernel::{desc_len, AmoOp, CopyKernel, COPY_MAX, DESC_AMO};
use crate::cuda::stream::CopyStream;
use crate::cuda::MappedHostBuffer;

use super::claim::{
    warn_first, Decided, Ledger, OnBroken, Policy, Slots, Timing, APPLIED, LEFT, SLOT_BYTES,
};
use super::MResult;

/// The claim protocol's parameters for the copy kernel: launches wait for each other on one
/// stream, and copies found in an impossible state go to the host (never lost; making a copy of
/// an unchanged source twice is harmless).
pub const POLICY: Policy = Policy {
    timing: Timing::StreamOrder,
    on_broken: OnBroken::HandBack,
    what: "copy kernel",
};

/// Launches that may be undecided (or waiting for a late kernel) at once.
pub const KSLOTS: usize = 64;
/// Largest copy a launch takes (larger ones go to the copy engine).
pub const MAX_COPY_BYTES: usize = 64 << 10;
/// Most bytes one launch moves (its one block copies at a few tens of GB/s).
pub const MAX_LAUNCH_BYTES: usize = 1 << 20;
/// Bytes of the slots.
const MEM_BYTES: usize = KSLOTS * SLOT_BYTES;

/// What runs the kernel's half of a launch.
pub trait Launcher: Send {
    /// Launches the copy kernel over the slot at device address `slot` (zeroed) and `copies`
    /// ((destination, source, length), at most [`COPY_MAX`]).
    ///
    /// # Safety
    /// The slot and every range of `copies` stay valid until the launch has run.
    unsafe fn launch(&mut self, slot: u64, copies: &[(u64, u64, usize)]) -> MResult<()>;
    /// Whether every launch so far has run.
    fn idle(&mut self) -> bool;
}

/// The GPU's copy kernel on a non-blocking stream of its own.
pub struct CudaLauncher {
    kernel: Arc<CopyKernel>,
    stream: CopyStream,
}

impl CudaLauncher {
    /// A launcher of `kernel` on a new non-blocking stream of its context.
    pub fn new(kernel: Arc<CopyKernel>) -> MResult<CudaLauncher> {
        let stream = CopyStream::new(kernel.context(), false)?;
        Ok(CudaLauncher { kernel, stream })
    }
}

impl Launcher for CudaLauncher {
    unsafe fn launch(&mut self, slot: u64, copies: &[(u64, u64, usize)]) -> MResult<()> {
        // SAFETY: forwarded contract (the slot is mapped pinned memory of the caller's).
        unsafe { self.kernel.launch(&self.stream, slot, copies) }.map_err(Into::into)
    }

    fn idle(&mut self) -> bool {
        self.stream.idle().unwrap_or(false)
    }
}

/// The kernel's half on a host thread, for memory the host can address: launches run in order,
/// each `delay` after it was made (a kernel slow to start).
/// A launch as the stand-in's thread gets it: slot, copies, when it was made.
type HostLaunch = (u64, Vec<(u64, u64, usize)>, Instant);

pub struct HostLauncher {
    tx: Option<mpsc::Sender<HostLaunch>>,
    queued: u64,
    ran: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostLauncher {
    /// A launcher whose launches start `delay` after they were made.
    pub fn new(delay: Duration) -> std::io::Result<HostLauncher> {
        let (tx, rx) = mpsc::channel::<HostLaunch>();
        let ran = Arc::new(AtomicU64::new(0));
        let r = ran.clone();
        let thread = std::thread::Builder::new()
            .name("nvshmem-efa-kcopy".into())
            .spawn(move || {
                for (slot, copies, at) in rx {
                    if let Some(wait) = (at + delay).checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    // SAFETY: the launch contract: the slot and the ranges are valid host memory
                    // until this launch has run (counted below).
                    unsafe { kernel_half(slot, &copies) };
                    r.fetch_add(1, Ordering::Release);
                }
            })?;
        Ok(HostLauncher {
            tx: Some(tx),
            queued: 0,
            ran,
            thread: Some(thread),
        })
    }
}

impl Launcher for HostLauncher {
    unsafe fn launch(&mut self, slot: u64, copies: &[(u64, u64, usize)]) -> MResult<()> {
        let tx = self.tx.as_ref().expect("launcher open");
        tx.send((slot, copies.to_vec(), Instant::now()))
            .map_err(|_| super::MoverError::Invalid("host launcher thread gone".into()))?;
        self.queued += 1;
        Ok(())
    }

    fn idle(&mut self) -> bool {
        self.ran.load(Ordering::Acquire) == self.queued
    }
}

impl Drop for HostLauncher {
    fn drop(&mut self) {
        // The thread runs what was queued, then sees the channel closed.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What `copy.ptx` does, on the host: announce, fence, look at the host's flag; apply every
/// descriptor in order (copies, and atomics: [`DESC_AMO`]; on one thread every
/// [`crate::cuda::kernel::DESC_FENCE`] is kept) and answer [`APPLIED`], or answer [`LEFT`].
///
/// # Safety
/// `slot` (32 bytes, 8-aligned) is live host memory, and so is every range of `copies`.
unsafe fn kernel_half(slot: u64, copies: &[(u64, u64, usize)]) {
    use std::sync::atomic::AtomicU32;
    // SAFETY: slot words inside the live slot (contract); AtomicU32 has u32's layout.
    let word = |w: usize| unsafe { &*((slot as *const AtomicU32).add(w)) };
    word(1).store(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if word(0).load(Ordering::SeqCst) != 0 {
        word(2).store(LEFT, Ordering::SeqCst);
        return;
    }
    for &(dst, src, word) in copies {
        if word & DESC_AMO != 0 {
            // SAFETY: an aligned word of live host memory (contract).
            unsafe { host_atomic(dst, src, word) };
            continue;
        }
        // One thread applies the descriptors in order: every fence is kept.
        // SAFETY: ranges named by the caller (contract); they may overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, desc_len(word)) };
    }
    fence(Ordering::SeqCst);
    word(2).store(APPLIED, Ordering::SeqCst);
}

/// An atomic descriptor ([`DESC_AMO`]) applied on the host.
///
/// # Safety
/// `dst` is an aligned 4- or 8-byte word of live host memory.
unsafe fn host_atomic(dst: u64, val: u64, word: usize) {
    use std::sync::atomic::AtomicU32;
    let op = (word >> 8) & 0xff;
    let ops = [AmoOp::Add, AmoOp::And, AmoOp::Or, AmoOp::Xor, AmoOp::Set];
    let Some(&op) = ops.iter().find(|o| **o as usize == op) else {
        return;
    };
    if word & 0xff == 4 {
        // SAFETY: the caller's guarantee; AtomicU32 has u32's layout.
        let a = unsafe { &*(dst as *const AtomicU32) };
        let v = val as u32;
        let _ = match op {
            AmoOp::Add => a.fetch_add(v, Ordering::SeqCst),
            AmoOp::And => a.fetch_and(v, Ordering::SeqCst),
            AmoOp::Or => a.fetch_or(v, Ordering::SeqCst),
            AmoOp::Xor => a.fetch_xor(v, Ordering::SeqCst),
            _ => a.swap(v, Ordering::SeqCst),
        };
    } else {
        // SAFETY: as above.
        let a = unsafe { &*(dst as *const AtomicU64) };
        let _ = match op {
            AmoOp::Add => a.fetch_add(val, Ordering::SeqCst),
            AmoOp::And => a.fetch_and(val, Ordering::SeqCst),
            AmoOp::Or => a.fetch_or(val, Ordering::SeqCst),
            AmoOp::Xor => a.fetch_xor(val, Ordering::SeqCst),
            _ => a.swap(val, Ordering::SeqCst),
        };
    }
}

/// The slots' memory.
enum Mem {
    /// Pinned and mapped into the device (the GPU's kernel).
    Pinned(MappedHostBuffer),
    /// Plain memory, 8-aligned (the host's stand-in).
    Plain(Vec<u64>),
}

impl Mem {
    fn host(&mut self) -> *mut u8 {
        match self {
            Mem::Pinned(m) => m.host(),
            Mem::Plain(v) => v.as_mut_ptr() as *mut u8,
        }
    }

    fn device(&mut self) -> u64 {
        match self {
            Mem::Pinned(m) => m.device(),
            Mem::Plain(v) => v.as_mut_ptr() as u64,
        }
    }
}

/// How a launch ended, from [`KernelCopies::settle`].
#[derive(Debug, PartialEq, Eq)]
pub enum Done<T> {
    /// The kernel made every copy of launch `id`.
    Applied(u64),
    /// The host owns launch `id`: none of its copies was made; the caller makes them with the
    /// payload it gave.
    TakenOver(u64, T),
}

/// Why [`KernelCopies::launch`] did not launch (the payload comes back with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotLaunched {
    /// Empty, more than [`COPY_MAX`] copies, or one larger than [`MAX_COPY_BYTES`].
    NotFit,
    /// A take-over happened less than `hold` ago.
    Holding,
    /// Every slot is in use.
    NoSlot,
    /// The launch failed (logged).
    Failed,
}

/// Copy launches of one queue: their slots and pending launches. `T` is what the caller
/// needs to make a launch's copies itself if the host takes it over.
pub struct KernelCopies<T> {
    launcher: Option<Box<dyn Launcher>>,
    mem: Mem,
    /// The claim protocol's host side over the slots; the payload comes back on a take-over.
    ledger: Ledger<T>,
    stuck: Duration,
    hold: Duration,
    host_until: Option<Instant>,
    warned: bool,
    /// Launches made, applied by the kernel, and taken over by the host (for the log).
    pub launched: u64,
    pub applied: u64,
    pub taken_over: u64,
    /// Time spent in the launcher's launch calls, and from launch to being seen applied, summed
    /// (for the log).
    pub launch_time: Duration,
    pub applied_time: Duration,
}

// SAFETY: the slot memory is touched through atomics; the launcher is Send.
unsafe impl<T: Send> Send for KernelCopies<T> {}

impl<T> KernelCopies<T> {
    /// The GPU's copy kernel over pinned memory of its context: launches undecided for `stuck` are
    /// taken over, and batches go the copy engine's way for `hold` after a take-over.
    pub fn cuda(kernel: Arc<CopyKernel>, stuck: Duration, hold: Duration) -> MResult<Self> {
        let _g = crate::cuda::ContextGuard::enter(kernel.context())?;
        let mem = Mem::Pinned(MappedHostBuffer::new(MEM_BYTES)?);
        let launcher = CudaLauncher::new(kernel)?;
        Ok(Self::with(Box::new(launcher), mem, stuck, hold))
    }

    /// The host's stand-in ([`HostLauncher`], launches starting `delay` after they are made) over
    /// plain memory.
    pub fn host(delay: Duration, stuck: Duration, hold: Duration) -> MResult<Self> {
        let launcher = HostLauncher::new(delay)
            .map_err(|e| super::MoverError::Invalid(format!("host launcher thread: {e}")))?;
        let mem = Mem::Plain(vec![0u64; MEM_BYTES / 8]);
        Ok(Self::with(Box::new(launcher), mem, stuck, hold))
    }

    fn with(launcher: Box<dyn Launcher>, mut mem: Mem, stuck: Duration, hold: Duration) -> Self {
        // SAFETY: the first KSLOTS * SLOT_BYTES bytes of memory this value owns (8-aligned), freed
        // only at drop, once no launch can touch them (else kept).
        let slots = unsafe { Slots::with_count(mem.host(), KSLOTS) };
        KernelCopies {
            launcher: Some(launcher),
            mem,
            ledger: Ledger::new(slots, POLICY),
            stuck,
            hold,
            host_until: None,
            warned: false,
            launched: 0,
            applied: 0,
            taken_over: 0,
            launch_time: Duration::ZERO,
            applied_time: Duration::ZERO,
        }
    }

    /// Whether `copies` ((destination, source, length) of device-accessible memory) fit one launch.
    pub fn fits(copies: &[(u64, u64, usize)]) -> bool {
        !copies.is_empty()
            && copies.len() <= COPY_MAX
            && copies.iter().all(|c| desc_len(c.2) <= MAX_COPY_BYTES)
            && copies.iter().map(|c| desc_len(c.2)).sum::<usize>() <= MAX_LAUNCH_BYTES
    }

    /// Launches `copies` as one kernel at time `now`; returns the launch's id, or why not with the
    /// payload.
    ///
    /// # Safety
    /// Every range of `copies` is device-accessible memory (the host's for [`HostLauncher`]) that
    /// stays valid until the launch is settled and the launcher has run it.
    pub unsafe fn launch(
        &mut self,
        copies: &[(u64, u64, usize)],
        payload: T,
        now: Instant,
    ) -> Result<u64, (NotLaunched, T)> {
        if !Self::fits(copies) {
            return Err((NotLaunched::NotFit, payload));
        }
        match self.host_until {
            Some(t) if now < t => return Err((NotLaunched::Holding, payload)),
            Some(_) => self.host_until = None,
            None => {}
        }
        let Some(s) = self.ledger.take_slot() else {
            return Err((NotLaunched::NoSlot, payload));
        };
        let slot_dev = Slots::device_addr(self.mem.device(), s);
        let launcher = self.launcher.as_mut().expect("launcher open");
        let t = Instant::now();
        // SAFETY: slot zeroed by take; the caller vouches for the ranges; the memory outlives the
        // launch (drop keeps it while launches are queued).
        let r = unsafe { launcher.launch(slot_dev, copies) };
        self.launch_time += t.elapsed();
        if let Err(e) = r {
            // Nothing will write the slot.
            self.ledger.unlaunched(s);
            tracing::warn!("copy kernel: launch of {} copies failed: {e}", copies.len());
            return Err((NotLaunched::Failed, payload));
        }
        self.launched += 1;
        Ok(self.ledger.launched(s, now, payload))
    }

    /// One look at every pending launch at time `now`: pushes the decided ones to `out`, and takes
    /// over the oldest undecided one once it could have started for the stuck limit (and every
    /// younger one with it). Launches wait for each other in stream order, so a younger one's
    /// clock starts only when every older one is decided (as seen here). Never blocks.
    pub fn settle(&mut self, now: Instant, out: &mut Vec<Done<T>>) {
        let stuck = self.stuck;
        let mut decided = Vec::new();
        let round = self.ledger.settle(now, stuck, &mut decided);
        for d in decided {
            out.push(match d {
                Decided::Applied { id, waited, .. } => {
                    self.applied_time += waited;
                    Done::Applied(id)
                }
                Decided::TakenOver { id, payload } => Done::TakenOver(id, payload),
            });
        }
        self.applied = self.ledger.counts.applied;
        self.taken_over = self.ledger.counts.taken_over + self.ledger.counts.broken;
        if round.claimed > 0 {
            self.host_until = Some(now + self.hold);
            let msg = format!(
                "copy kernel: {} launch(es) had not started after {stuck:?} (a kernel holding \
                 every SM?): the host moves their copies through the copy engine, and so it does \
                 for {:?}",
                round.claimed, self.hold
            );
            warn_first(&mut self.warned, &msg);
        }
    }

    /// Whether the launches reach host memory too (the host's stand-in); the GPU's kernel is
    /// given GPU memory only.
    pub fn reaches_host_memory(&self) -> bool {
        matches!(self.mem, Mem::Plain(_))
    }

    /// One launch the host has claimed beforehand, waited for until `deadline`: the kernel must
    /// leave everything alone and answer [`LEFT`]. Makes the driver load the kernel now, and
    /// checks the slot protocol end to end.
    pub fn check_claimed_launch(&mut self, deadline: Instant) -> MResult<()> {
        let device = self.mem.device();
        let launcher = self.launcher.as_mut().expect("launcher open");
        self.ledger
            .slots_mut()
            .check_claimed_launch(device, deadline, "copy kernel", |slot| {
                // SAFETY: no copies, and the kernel finds the host's flag set: it touches nothing
                // but the slot, which this value owns.
                unsafe { launcher.launch(slot, &[]) }
            })
    }

    /// Launches not yet decided (their copies may still be made by the kernel).
    pub fn undecided(&self) -> usize {
        self.ledger.undecided()
    }

    /// Launches pending, taken-over ones whose late kernel has not answered included.
    pub fn pending(&self) -> usize {
        self.ledger.pending()
    }

    /// Stops: claims every undecided launch, and waits until `deadline` for those racing and for
    /// late kernels of taken-over ones. Pushes the decided launches to `out` as settle does (a
    /// taken-over launch's copies were not made). Returns whether nothing is left pending.
    pub fn close(&mut self, deadline: Instant, out: &mut Vec<Done<T>>) -> bool {
        let now = Instant::now();
        self.stuck = Duration::ZERO;
        self.settle(now, out);
        while self.ledger.pending() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
            self.settle(Instant::now(), out);
        }
        self.ledger.pending() == 0
    }
}

impl<T> Drop for KernelCopies<T> {
    fn drop(&mut self) {
        let mut launcher = self.launcher.take().expect("launcher open");
        let quiet = launcher.idle();
        match &mut self.mem {
            // The stand-in's thread runs what was queued before it ends: then the memory is free.
            Mem::Plain(_) => drop(launcher),
            Mem::Pinned(_) if quiet => drop(launcher),
            Mem::Pinned(_) => {
                drop(launcher);
                tracing::warn!(
                    "copy kernel: {} launch(es) still queued at close; their {MEM_BYTES} bytes of \
                     slots are kept (leaked) so that a late kernel writes into live \
                     memory",
                    self.ledger.pending().max(1)
                );
                let m = std::mem::replace(&mut self.mem, Mem::Plain(Vec::new()));
                std::mem::forget(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn settle_until<T>(k: &mut KernelCopies<T>, out: &mut Vec<Done<T>>, n: usize, limit: Duration) {
        let end = Instant::now() + limit;
        while out.len() < n && Instant::now() < end {
            k.settle(Instant::now(), out);
            std::thread::yield_now();
        }
    }

    /// (destination, source, length) of one copy.
    type Copy3 = (u64, u64, usize);

    /// Source and destination buffers; copies of `len` bytes at offsets `i * len`.
    fn bufs(n: usize, len: usize) -> (Vec<u8>, Vec<u8>, Vec<Copy3>) {
        let src: Vec<u8> = (0..n * len).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; n * len];
        let copies = (0..n)
            .map(|i| {
                (
                    dst.as_mut_ptr() as u64 + (i * len) as u64,
                    src.as_ptr() as u64 + (i * len) as u64,
                    len,
                )
            })
            .collect();
        (src, dst, copies)
    }

    /// Atomic descriptors and fences as `copy.ptx` applies them (the host's half: one thread, in
    /// order): every op on 4- and 8-byte words, copies beside them, the flags' bits kept out of the
    /// lengths.
    #[test]
    fn atomics_and_fences_in_a_launch() {
        use crate::cuda::kernel::{amo_desc, DESC_FENCE};
        let mut k = KernelCopies::<u32>::host(Duration::ZERO, Duration::from_secs(5), MS).unwrap();
        let mut w64 = [10u64, 0b1100, 0b1100, 0b1100, 7];
        let mut w32 = [10u32, 0b1100, 0b1100, 0b1100, 7];
        let src = [9u8; 40];
        let mut dst = [0u8; 40];
        let ops = [AmoOp::Add, AmoOp::And, AmoOp::Or, AmoOp::Xor, AmoOp::Set];
        let mut descs: Vec<Copy3> = vec![(dst.as_mut_ptr() as u64, src.as_ptr() as u64, 24)];
        for (i, op) in ops.iter().enumerate() {
            descs.push(amo_desc(&mut w64[i] as *mut u64 as u64, *op, 8, 0b1010));
            let (d, s, w) = amo_desc(
                &mut w32[i] as *mut u32 as u64,
                *op,
                4,
                0xffff_0000_0000_1010,
            );
            descs.push((d, s, w | DESC_FENCE));
        }
        descs.push((
            dst.as_mut_ptr() as u64 + 24,
            src.as_ptr() as u64,
            16 | DESC_FENCE,
        ));
        assert!(KernelCopies::<u32>::fits(&descs));
        // SAFETY: every range outlives the launch (settled below, launcher joined at drop).
        unsafe { k.launch(&descs, 1, Instant::now()) }.unwrap();
        let mut out = Vec::new();
        settle_until(&mut k, &mut out, 1, Duration::from_secs(5));
        assert_eq!(out, vec![Done::Applied(0)]);
        drop(k);
        assert_eq!(w64, [20, 0b1000, 0b1110, 0b0110, 0b1010]);
        // A 4-byte atomic takes the operand's low half.
        assert_eq!(w32, [0x101a, 0, 0x101c, 0x101c, 0x1010]);
        assert_eq!(dst, src);
    }

    #[test]
    fn a_claimed_launch_leaves_everything_alone() {
        let mut k = KernelCopies::<u32>::host(Duration::ZERO, MS, MS).unwrap();
        k.check_claimed_launch(Instant::now() + Duration::from_secs(5))
            .unwrap();
        assert_eq!(k.ledger.slots().in_use(), 0);
        assert!(k.reaches_host_memory());
    }

    #[test]
    fn a_launch_that_runs_makes_every_copy_once() {
        let mut k = KernelCopies::<u32>::host(Duration::ZERO, Duration::from_secs(5), MS).unwrap();
        let (src, dst, copies) = bufs(100, 24);
        // SAFETY: the buffers outlive the launch (settled below, then the launcher joined).
        let id = unsafe { k.launch(&copies, 7, Instant::now()) }.unwrap();
        let mut out = Vec::new();
        settle_until(&mut k, &mut out, 1, Duration::from_secs(5));
        assert_eq!(out, vec![Done::Applied(id)]);
        assert_eq!(dst, src);
        assert_eq!((k.launched, k.applied, k.taken_over), (1, 1, 0));
        assert_eq!(k.pending(), 0);
    }

    #[test]
    fn a_stuck_launch_is_taken_over_with_every_younger_one_and_never_copies() {
        // Launches start 300 ms late; the stuck limit is 5 ms.
        let mut k = KernelCopies::<u32>::host(
            Duration::from_millis(300),
            Duration::from_millis(5),
            Duration::from_secs(60),
        )
        .unwrap();
        let (_src, dst, copies) = bufs(8, 16);
        let t0 = Instant::now();
        // SAFETY: as above.
        let a = unsafe { k.launch(&copies[..4], 1, t0) }.unwrap();
        // SAFETY: as above.
        let b = unsafe { k.launch(&copies[4..], 2, t0 + Duration::from_millis(4)) }.unwrap();
        let mut out = Vec::new();
        // At 4.5 ms neither is stuck yet.
        k.settle(t0 + Duration::from_micros(4500), &mut out);
        assert!(out.is_empty());
        // At 5 ms the first is, and the second goes with it although its own limit is 9 ms.
        k.settle(t0 + Duration::from_millis(5), &mut out);
        assert_eq!(out, vec![Done::TakenOver(a, 1), Done::TakenOver(b, 2)]);
        assert_eq!(k.undecided(), 0);
        assert_eq!(k.pending(), 2, "slots wait for the late kernels");
        // Held: the next batch is declined.
        let r = unsafe { k.launch(&copies[..1], 3, t0 + Duration::from_millis(6)) };
        assert_eq!(r, Err((NotLaunched::Holding, 3)));
        // The late kernels answer LEFT and touch nothing.
        let end = Instant::now() + Duration::from_secs(5);
        while k.pending() > 0 && Instant::now() < end {
            k.settle(Instant::now(), &mut out);
            std::thread::sleep(MS);
        }
        assert_eq!(k.pending(), 0);
        assert_eq!(out.len(), 2, "nothing more is reported");
        assert!(dst.iter().all(|&b| b == 0), "a taken-over launch copied");
        assert_eq!((k.applied, k.taken_over), (0, 2));
    }

    #[test]
    fn a_launch_waiting_behind_an_older_one_is_timed_from_when_that_one_was_decided() {
        // Launches start 100 ms after they are made; the stuck limit is 30 ms.
        let mut k = KernelCopies::<u32>::host(
            Duration::from_millis(100),
            Duration::from_millis(30),
            Duration::from_secs(60),
        )
        .unwrap();
        let (_src, _dst, copies) = bufs(2, 8);
        let t0 = Instant::now();
        // SAFETY: the buffers outlive the launcher (dropped at the end of the test).
        let a = unsafe { k.launch(&copies[..1], 1, t0) }.unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let t1 = Instant::now();
        // SAFETY: as above.
        let b = unsafe { k.launch(&copies[1..], 2, t1) }.unwrap();
        let mut out = Vec::new();
        // 60 ms after b was made (clock of the test), a is seen decided only now: b's clock
        // starts here, so it is not stuck yet, nor 29 ms later.
        k.settle(t1 + Duration::from_millis(60), &mut out);
        assert_eq!(out, vec![Done::Applied(a)]);
        k.settle(t1 + Duration::from_millis(89), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        // 30 ms after a was seen decided, b is stuck (its kernel starts 100 ms after t1).
        k.settle(t1 + Duration::from_millis(90), &mut out);
        assert_eq!(out, vec![Done::Applied(a), Done::TakenOver(b, 2)]);
        assert!(
            t1.elapsed() < Duration::from_millis(100),
            "too slow to test this"
        );
    }

    #[test]
    fn after_the_hold_launches_go_to_the_kernel_again() {
        let mut k = KernelCopies::<u32>::host(Duration::from_millis(50), MS, 10 * MS).unwrap();
        let (src, dst, copies) = bufs(2, 8);
        let t0 = Instant::now();
        // SAFETY: as above.
        unsafe { k.launch(&copies[..1], 1, t0) }.unwrap();
        let mut out = Vec::new();
        k.settle(t0 + 2 * MS, &mut out);
        assert!(matches!(out[..], [Done::TakenOver(_, 1)]));
        let later = t0 + 13 * MS;
        // SAFETY: as above.
        let id = unsafe { k.launch(&copies[1..], 2, later) }.unwrap();
        // Its kernel starts 50 ms late: settle with a clock that does not make it stuck.
        let end = Instant::now() + Duration::from_secs(5);
        while !out.contains(&Done::Applied(id)) && Instant::now() < end {
            k.settle(later, &mut out);
            std::thread::sleep(MS);
        }
        assert!(out.contains(&Done::Applied(id)));
        assert_eq!(dst[8..], src[8..]);
        assert_eq!(dst[..8], [0u8; 8]);
    }

    #[test]
    fn batches_that_do_not_fit_and_full_slots_are_declined() {
        let mut k =
            KernelCopies::<usize>::host(Duration::from_secs(1), Duration::from_secs(60), MS)
                .unwrap();
        let (_s, _d, copies) = bufs(COPY_MAX + 1, 1);
        let (_s1, _d1, wide) = bufs(MAX_LAUNCH_BYTES / MAX_COPY_BYTES + 1, MAX_COPY_BYTES);
        let now = Instant::now();
        // SAFETY: declined before any launch.
        unsafe {
            assert_eq!(k.launch(&[], 0, now), Err((NotLaunched::NotFit, 0)));
            assert_eq!(k.launch(&copies, 1, now), Err((NotLaunched::NotFit, 1)));
            let big = [(copies[0].0, copies[0].1, MAX_COPY_BYTES + 1)];
            assert_eq!(k.launch(&big, 2, now), Err((NotLaunched::NotFit, 2)));
            assert_eq!(k.launch(&wide, 3, now), Err((NotLaunched::NotFit, 3)));
            assert!(KernelCopies::<u8>::fits(&wide[1..]));
        }
        let (_s2, _d2, one) = bufs(KSLOTS + 1, 1);
        for i in 0..KSLOTS {
            // SAFETY: the buffers outlive the launcher (dropped at the end of the test).
            unsafe { k.launch(&one[i..=i], i, now) }.unwrap();
        }
        // SAFETY: as above.
        let r = unsafe { k.launch(&one[KSLOTS..], 99, now) };
        assert_eq!(r, Err((NotLaunched::NoSlot, 99)));
        // Close claims them all (their kernels start a second late).
        let mut out = Vec::new();
        assert!(k.close(Instant::now() + Duration::from_secs(5), &mut out));
        assert_eq!(out.len(), KSLOTS);
        assert!(out.iter().all(|d| matches!(d, Done::TakenOver(..))));
    }

    /// The host's claim against the kernel's half, racing on another thread: every launch is
    /// made by exactly one side.
    #[test]
    fn claim_races_decide_each_launch_once() {
        let mut k =
            KernelCopies::<u32>::host(Duration::ZERO, Duration::ZERO, Duration::ZERO).unwrap();
        let mut src = [0u8; 8];
        let mut dst = [0u8; 8];
        let (mut kernel, mut host) = (0, 0);
        for round in 1..=2000u32 {
            src[0] = round as u8;
            dst[0] = 0;
            let c = [(dst.as_mut_ptr() as u64, src.as_ptr() as u64, 1usize)];
            // SAFETY: the buffers outlive the launch (waited for below).
            unsafe { k.launch(&c, round, Instant::now()) }.unwrap();
            let mut out = Vec::new();
            // Stuck limit 0: the first settle claims while the thread may be starting.
            k.settle(Instant::now(), &mut out);
            let end = Instant::now() + Duration::from_secs(5);
            while (out.is_empty() || k.pending() > 0) && Instant::now() < end {
                k.settle(Instant::now(), &mut out);
                std::hint::spin_loop();
            }
            assert_eq!(k.pending(), 0);
            match out[..] {
                [Done::Applied(_)] => {
                    kernel += 1;
                    assert_eq!(dst[0], round as u8, "applied but not copied");
                }
                [Done::TakenOver(_, r)] => {
                    host += 1;
                    assert_eq!(r, round);
                    assert_eq!(dst[0], 0, "taken over, yet the kernel copied");
                }
                ref o => panic!("round {round}: {o:?}"),
            }
            // Holding is zero: launches go on.
            k.host_until = None;
        }
        assert_eq!(kernel + host, 2000);
    }
}
