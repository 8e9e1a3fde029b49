//! Same-host RDMA as copy-engine copies (the peer's heap mapped into this process), the null
//! consumer, and TX completions written in bulk.
use super::*;
use crate::mover::kcopy::{Done, KernelCopies};
use crate::mover::queue::{CopyEngine, CopyQueue, CudaEngine, HostEngine};
use crate::mover::{MResult, MoverError};

/// How long batches go the copy engine's way after a copy kernel launch was taken over.
const KERNEL_HOLD: Duration = Duration::from_millis(100);

/// The copy kernel of a queue whose route is [`CopyRoute::Kernel`]: the GPU's, loaded into context
/// `ctx` and checked with one launch the host claimed beforehand (so the driver has compiled and
/// loaded it before any kernel of the application runs), or the host's stand-in where CUDA is not
/// usable. `None` (logged) where it cannot be had: the route then works as [`CopyRoute::Host`].
pub(super) fn kernel_copies(cfg: &SoftQueueConfig, ctx: usize) -> Option<KernelCopies<Hops>> {
    if cfg.ipc != CopyRoute::Kernel || cfg.null_consumer {
        return None;
    }
    let made = if mem::cuda_usable() {
        (|| {
            let kernel = Arc::new(crate::cuda::kernel::CopyKernel::load(ctx)?);
            let mut k = KernelCopies::cuda(kernel, cfg.kernel_stuck, KERNEL_HOLD)?;
            k.check_claimed_launch(Instant::now() + Duration::from_secs(10))?;
            Ok(k)
        })()
    } else {
        KernelCopies::host(cfg.kernel_host_delay, cfg.kernel_stuck, KERNEL_HOLD)
    };
    match made {
        Ok(k) => Some(k),
        Err(e) => {
            let e: MoverError = e;
            tracing::warn!(
                "software queue: no copy kernel ({e}): NVSHMEM_EFA_SOFT_IPC=kernel moves every copy \
                 as two copy-engine hops (host)"
            );
            None
        }
    }
}

/// Where a peer's memory is reachable in this process (the transport's CUDA IPC mappings of
/// same-host peers' heaps).
pub trait PeerMemory: Send + Sync {
    /// The address in this process of PE `pe`'s `[addr, addr + len)` (`addr` in the peer's address
    /// space), when the whole range is mapped here; `None` otherwise.
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64>;
}

/// How the copy route moves the bytes (`NVSHMEM_EFA_SOFT_IPC`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyRoute {
    /// No copy route: every RDMA WQE takes the message path.
    Off,
    /// Two copy-engine hops through a pinned host bounce ring: device to host into the ring, then
    /// host to device into the destination, in stream order. Host<->device copies always run on
    /// the copy engines, so they progress while a kernel holds every SM.
    Host,
    /// A round's small copies (up to 128 of at most 64 KiB, GPU memory) as one launch of the
    /// library's copy kernel, one hop; a launch that has not started within the stuck limit is
    /// taken over and its copies go [`CopyRoute::Host`]'s way, as does everything else
    /// ([`crate::mover::kcopy`]). The default: on the GPU node it moved 1.2-2.2x the host route's
    /// messages up to 16 KiB (results/gpu-2026-11-28).
    #[default]
    Kernel,
}

impl CopyRoute {
    /// The route a value of `NVSHMEM_EFA_SOFT_IPC` names: `0` (and the other false spellings),
    /// `kernel` (the default, and `1`/`on`/`true`/`yes`), `host`; case and surrounding blanks are
    /// ignored.
    pub fn parse(v: &str) -> Option<CopyRoute> {
        match v.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" | "n" => Some(CopyRoute::Off),
            "host" => Some(CopyRoute::Host),
            "kernel" | "1" | "on" | "true" | "yes" | "y" => Some(CopyRoute::Kernel),
            _ => None,
        }
    }

    /// Whether the route is on.
    pub fn enabled(self) -> bool {
        self != CopyRoute::Off
    }

    /// Whether copies (all of them, or those the kernel does not take) go through the bounce ring.
    pub fn bounces(self) -> bool {
        matches!(self, CopyRoute::Host | CopyRoute::Kernel)
    }
}

/// Default size of the bounce ring of [`CopyRoute::Host`] (`NVSHMEM_EFA_SOFT_IPC_BOUNCE`).
pub const DEFAULT_BOUNCE_BYTES: usize = 32 << 20;

/// Smallest bounce ring accepted.
pub const MIN_BOUNCE_BYTES: usize = 4096;

/// Reservations in the bounce ring start at multiples of this.
const BOUNCE_ALIGN: u64 = 256;

/// The memory behind a [`BounceRing`]: pinned host memory for the copy engine, or plain memory
/// where copies are `memcpy`.
enum BounceMem {
    Pinned(crate::cuda::MappedHostBuffer),
    Plain(Vec<u8>),
}

/// The bounce ring of [`CopyRoute::Host`]: each copy WQE reserves one contiguous range (wrapping
/// to the start when the tail of the ring is too short), released in completion order (copies
/// complete in submission order, so the oldest reservation is always released first).
pub(super) struct BounceRing {
    mem: BounceMem,
    cap: u64,
    /// Bytes reserved since creation (padding at a wrap included).
    head: u64,
    /// Bytes released since creation.
    tail: u64,
}

impl BounceRing {
    /// A ring of `bytes` (rounded down to the alignment) in plain memory.
    pub(super) fn plain(bytes: usize) -> BounceRing {
        let cap = (bytes as u64 / BOUNCE_ALIGN).max(1) * BOUNCE_ALIGN;
        BounceRing {
            mem: BounceMem::Plain(vec![0u8; (cap + BOUNCE_ALIGN) as usize]),
            cap,
            head: 0,
            tail: 0,
        }
    }

    /// A ring of `bytes` (rounded down to the alignment) in pinned host memory of context `ctx`.
    pub(super) fn pinned(ctx: usize, bytes: usize) -> crate::cuda::CudaResult<BounceRing> {
        let cap = (bytes as u64 / BOUNCE_ALIGN).max(1) * BOUNCE_ALIGN;
        let _g = crate::cuda::ContextGuard::enter(ctx)?;
        Ok(BounceRing {
            mem: BounceMem::Pinned(crate::cuda::MappedHostBuffer::new(cap as usize)?),
            cap,
            head: 0,
            tail: 0,
        })
    }

    /// The ring's size in bytes.
    pub(super) fn capacity(&self) -> u64 {
        self.cap
    }

    /// The ring's first byte (aligned).
    fn base(&self) -> u64 {
        match &self.mem {
            BounceMem::Pinned(m) => m.host() as u64,
            BounceMem::Plain(v) => (v.as_ptr() as u64).next_multiple_of(BOUNCE_ALIGN),
        }
    }

    /// Whether the memory is pinned (the copy engine's).
    fn is_pinned(&self) -> bool {
        matches!(self.mem, BounceMem::Pinned(_))
    }

    /// Reserves `len` contiguous bytes: `(address, release mark)`, or `None` when the ring has no
    /// room now (or `len` exceeds the ring). The release mark goes to [`BounceRing::release`] once
    /// the copies through the range completed.
    pub(super) fn reserve(&mut self, len: u64) -> Option<(u64, u64)> {
        let need = len.max(1).next_multiple_of(BOUNCE_ALIGN);
        if need > self.cap {
            return None;
        }
        if self.head == self.tail {
            // Empty: start over at the ring's first byte, so that any reservation up to the
            // ring's size fits.
            self.head = self.head.next_multiple_of(self.cap);
            self.tail = self.head;
        }
        let off = self.head % self.cap;
        let pad = if off + need > self.cap {
            self.cap - off
        } else {
            0
        };
        if self.head + pad + need - self.tail > self.cap {
            return None;
        }
        let start = (self.head + pad) % self.cap;
        self.head += pad + need;
        Some((self.base() + start, self.head))
    }

    /// Releases every reservation up to release mark `mark` (the oldest ones first).
    pub(super) fn release(&mut self, mark: u64) {
        debug_assert!(mark <= self.head);
        self.tail = self.tail.max(mark.min(self.head));
    }

    /// Releases everything (no copy through the ring is outstanding any more).
    pub(super) fn reset(&mut self) {
        self.tail = self.head;
    }
}

/// A shared [`PeerMemory`] as the queue's tables hold it.
#[derive(Clone)]
pub struct PeerMap(pub Arc<dyn PeerMemory>);

impl std::fmt::Debug for PeerMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerMap")
    }
}

/// The copy route of an RDMA write or read: the address in this process of the peer's range, when
/// the route is on (`enabled`: `NVSHMEM_EFA_SOFT_IPC` and a copy queue), the WQE carries no
/// immediate (an immediate needs the peer's consumer: it stays on the message path) and `pm` maps
/// the whole range of PE `pe` at `addr`.
pub fn ipc_route(
    enabled: bool,
    pm: Option<&dyn PeerMemory>,
    pe: i32,
    addr: u64,
    len: u64,
    has_imm: bool,
) -> Option<u64> {
    if !enabled || has_imm {
        return None;
    }
    pm?.local_addr(pe, addr, len)
}

/// The copy engine of a queue's own copy queue: CUDA's copy engine on a non-blocking stream in the
/// queue's context, or `memcpy` where CUDA is not usable (host memory only).
pub(super) enum Engine {
    Cuda(CudaEngine),
    Host(HostEngine),
}

impl CopyEngine for Engine {
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Engine::Cuda(e) => e.submit(dst, src, len),
                Engine::Host(e) => e.submit(dst, src, len),
            }
        }
    }
    unsafe fn submit_many(&mut self, copies: &[(u64, u64, usize)]) -> (usize, Option<MoverError>) {
        // SAFETY: forwarded contract. Forwarded so that a round's copies reach CUDA's engine as
        // one batch call (the trait's default would submit them one by one).
        unsafe {
            match self {
                Engine::Cuda(e) => e.submit_many(copies),
                Engine::Host(e) => e.submit_many(copies),
            }
        }
    }
    fn mark(&mut self) -> MResult<()> {
        match self {
            Engine::Cuda(e) => e.mark(),
            Engine::Host(e) => e.mark(),
        }
    }
    fn oldest_done(&mut self) -> MResult<bool> {
        match self {
            Engine::Cuda(e) => e.oldest_done(),
            Engine::Host(e) => e.oldest_done(),
        }
    }
    fn all_done(&mut self) -> MResult<bool> {
        match self {
            Engine::Cuda(e) => e.all_done(),
            Engine::Host(e) => e.all_done(),
        }
    }
    fn inline_ring(&mut self) -> MResult<u64> {
        match self {
            Engine::Cuda(e) => e.inline_ring(),
            Engine::Host(e) => e.inline_ring(),
        }
    }
}

/// The copies of the WQEs taken in one consumer round, enqueued together by
/// [`Consumer::flush_copies`].
#[derive(Debug, Default)]
pub(super) struct CopyRound {
    /// First hops (GPU to the bounce ring) of the host route.
    pub(super) first: Vec<(u64, u64, usize)>,
    /// Second hops (of the host route), or the copies the kernel makes in one hop.
    pub(super) last: Vec<(u64, u64, usize)>,
    /// The WQEs: slot, bounce ring release mark, and whether it has a copy in `first` / `last`
    /// (a zero-length WQE has none), in the order taken.
    pub(super) waits: Vec<(u32, Option<u64>, bool)>,
    /// Some copy's local range is host memory, which the copy kernel may not reach.
    pub(super) host_memory: bool,
}

/// The two hops of a kernel launch's copies, kept to move them through the copy engine if the host
/// takes the launch over.
#[derive(Debug, Default)]
pub(super) struct Hops {
    first: Vec<(u64, u64, usize)>,
    last: Vec<(u64, u64, usize)>,
}

/// The part of a round (`waits`, the WQEs in the order taken; `first`, the copies of those with
/// one) that one copy kernel launch takes: the longest prefix of copies within
/// [`crate::cuda::kernel::COPY_MAX`] copies of at most [`crate::mover::kcopy::MAX_COPY_BYTES`]
/// each and [`crate::mover::kcopy::MAX_LAUNCH_BYTES`] in all. Returns (copies, WQEs): the WQEs
/// up to the last copy taken, zero-length ones among them riding along, and every trailing
/// zero-length WQE when all copies are taken.
pub(super) fn launch_prefix(
    waits: &[(u32, Option<u64>, bool)],
    first: &[(u64, u64, usize)],
) -> (usize, usize) {
    let (mut copies, mut bytes, mut n) = (0usize, 0usize, 0usize);
    for &(_, _, has_copy) in waits {
        if has_copy {
            let Some(&(_, _, len)) = first.get(copies) else {
                break;
            };
            if copies == crate::cuda::kernel::COPY_MAX
                || len > crate::mover::kcopy::MAX_COPY_BYTES
                || bytes + len > crate::mover::kcopy::MAX_LAUNCH_BYTES
            {
                break;
            }
            copies += 1;
            bytes += len;
        }
        n += 1;
    }
    if copies == 0 {
        return (0, 0);
    }
    if copies == first.len() {
        n = waits.len();
    }
    (copies, n)
}

/// A WQE executed as a copy, waiting for its copy: the queue's submission count once it was
/// enqueued (its last hop) or the copy kernel launch that makes it, its slot, whether enqueueing
/// reported an error (its completion then says so) and the bounce ring range it holds.
#[derive(Clone, Copy, Debug)]
pub(super) struct CopyWait {
    pub(super) seq: u64,
    /// The copy kernel launch (then `seq` is unused), until it is settled.
    pub(super) kernel: Option<u64>,
    pub(super) slot: u32,
    pub(super) failed: bool,
    /// Release mark of the WQE's bounce ring range ([`CopyRoute::Host`]).
    pub(super) bounce: Option<u64>,
}

impl Consumer {
    /// Whether WQEs may take the copy route now (creates the copy queue, and for
    /// [`CopyRoute::Host`] its bounce ring, at first need).
    pub(super) fn copy_route_ready(&mut self) -> bool {
        if !self.inner.ipc.enabled() || self.tables.peer_memory.is_none() {
            return false;
        }
        if self.copyq.is_none() && !self.copyq_failed {
            match self.new_copy_queue() {
                Ok((e, ring)) => {
                    let what = match (&e, self.inner.ipc) {
                        (Engine::Host(_), _) => "host (memcpy)".to_string(),
                        (Engine::Cuda(_), CopyRoute::Kernel) if self.kcopies.is_some() => format!(
                            "copy-kernel launches (a round's copies of up to {} KiB in one launch; \
                             the rest, and launches taken over after {:?}, as two copy-engine hops \
                             through a {} KiB pinned bounce ring)",
                            crate::mover::kcopy::MAX_COPY_BYTES >> 10,
                            self.inner.kernel_stuck,
                            ring.as_ref().map_or(0, |r| r.capacity() >> 10),
                        ),
                        (Engine::Cuda(_), _) => format!(
                            "two copy-engine hops through a {} KiB {} bounce ring",
                            ring.as_ref().map_or(0, |r| r.capacity() >> 10),
                            if ring.as_ref().is_some_and(|r| r.is_pinned()) {
                                "pinned"
                            } else {
                                "plain"
                            }
                        ),
                    };
                    let line = format!(
                        "software queue: RDMA to same-host peers whose heap is mapped here runs as \
                         {what} copies (NVSHMEM_EFA_SOFT_IPC: 0 off, host, kernel)"
                    );
                    // Every consumer thread has a copy queue of its own.
                    if self.inner.mail.len() > 1 {
                        tracing::info!("{line} (consumer thread {})", self.id);
                    } else {
                        tracing::info!("{line}");
                    }
                    self.copyq = Some(CopyQueue::new(e));
                    self.bounce = ring;
                }
                Err(e) => {
                    tracing::warn!(
                        "software queue: no copy queue ({e}): RDMA to mapped peers takes the \
                         message path"
                    );
                    self.copyq_failed = true;
                }
            }
        }
        self.copyq.is_some()
    }

    /// The copy queue's engine and, for [`CopyRoute::Host`], the bounce ring (pinned where the
    /// engine is CUDA's).
    fn new_copy_queue(&self) -> std::result::Result<(Engine, Option<BounceRing>), String> {
        let host = self.inner.ipc.bounces();
        let bytes = self.inner.ipc_bounce;
        if mem::cuda_usable() {
            let e = CudaEngine::new(self.inner.cuda_ctx, self.inner.copy_overlap)
                .map_err(|e| format!("copy stream: {e}"))?;
            let ring = if host {
                Some(
                    BounceRing::pinned(self.inner.cuda_ctx, bytes)
                        .map_err(|e| format!("bounce ring of {bytes} bytes: {e}"))?,
                )
            } else {
                None
            };
            Ok((Engine::Cuda(e), ring))
        } else {
            let ring = host.then(|| BounceRing::plain(bytes));
            Ok((Engine::Host(HostEngine::default()), ring))
        }
    }

    /// Whether a copy WQE of `len` bytes fits the route ([`CopyRoute::Host`]: the bounce ring;
    /// a larger one takes the message path).
    pub(super) fn copy_fits(&self, len: u64) -> bool {
        !self.inner.ipc.bounces()
            || self
                .bounce
                .as_ref()
                .is_some_and(|r| len.max(1).next_multiple_of(BOUNCE_ALIGN) <= r.capacity())
    }

    /// Enqueues the copy of a validated copy WQE (its slot taken); the completion follows once the
    /// copy is done ([`Consumer::poll_copies`]). `Err` hands the WQE back when the bounce ring has
    /// no room now (it is retried on a later turn, after completions released space).
    // The WQE comes back by value to wait for a retry: no allocation on the hot path.
    #[allow(clippy::result_large_err)]
    pub(super) fn post_copy(
        &mut self,
        p: Pending,
        dst: u64,
        src: u64,
        len: usize,
        device: bool,
    ) -> std::result::Result<(), Pending> {
        let slot = p.slot.expect("slot taken before the copy");
        if self.copyq.is_none() {
            self.finish_failed(p, CqStatus::LocalQpInternalError, "no copy queue");
            return Ok(());
        }
        let mut bounce = None;
        if len == 0 {
            // Nothing moves: the WQE completes with the copies of its round.
        } else if let Some(ring) = self.bounce.as_mut() {
            let Some((mid, mark)) = ring.reserve(len as u64) else {
                if self.ring_wait_pc != Some((p.q, p.pc)) {
                    self.ring_wait_pc = Some((p.q, p.pc));
                    self.ipc_ring_waits += 1;
                    self.publish_counts();
                }
                return Err(p);
            };
            // `[mid, mid + len)` is this WQE's range of the bounce ring, which no other
            // outstanding copy uses, released only once the second hop completed.
            self.round.first.push((mid, src, len));
            self.round.last.push((dst, mid, len));
            bounce = Some(mark);
        } else {
            self.round.last.push((dst, src, len));
        }
        self.occupy(slot, InFlight::of(&p, None, None));
        self.ipc_copies += 1;
        self.round.waits.push((slot, bounce, len > 0));
        self.round.host_memory |= len > 0 && !device;
        Ok(())
    }

    /// Enqueues the copies of the WQEs taken since the last call: as one copy kernel launch when
    /// the route is [`CopyRoute::Kernel`] and they fit one; else with the bounce ring every first
    /// hop in one submission, then every second hop in another (stream order puts each second hop
    /// after its first), otherwise one submission. Two driver calls per round instead of one or
    /// two per WQE. Every WQE of the round completes once the copies up to the round's last are
    /// done (or its launch is); an error fails the round's WQEs (logged).
    pub(super) fn flush_copies(&mut self) {
        if self.round.waits.is_empty() || self.copyq.is_none() || self.round_gathers() {
            return;
        }
        // As many copy kernel launches as the round fills (each up to COPY_MAX copies and
        // MAX_LAUNCH_BYTES), in the order taken; what no launch takes goes to the copy engine.
        while let Some((id, n)) = self.launch_round() {
            self.note(super::trace::Event::CopyLaunch, n as u32, 1);
            for (slot, bounce, _) in self.round.waits.drain(..n) {
                self.copy_waits.push_back(CopyWait {
                    seq: 0,
                    kernel: Some(id),
                    slot,
                    failed: false,
                    bounce,
                });
            }
        }
        if self.round.waits.is_empty() {
            self.round.host_memory = false;
            return;
        }
        self.note(
            super::trace::Event::CopyLaunch,
            self.round.waits.len() as u32,
            0,
        );
        let q = self.copyq.as_mut().expect("checked above");
        // SAFETY: the local ranges lie in registrations the queue keeps, the remote ones in peer
        // regions the transport keeps mapped until GDA is shut down (before its mappings close),
        // the bounce ranges (one per WQE, disjoint) are held until the copies completed. The
        // copies of one submission may run in any order: they belong to WQEs of one round, which
        // are unordered as EFA WQEs are (ordering two WQEs takes the first one's completion, so
        // they land in different rounds).
        let r = unsafe {
            q.submit_many(&self.round.first)
                .and_then(|()| q.submit_many(&self.round.last))
        };
        let failed = match r {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(
                    "software queue: copies of {} WQEs not (all) enqueued: {e}; they complete \
                     with an error",
                    self.round.waits.len()
                );
                true
            }
        };
        let seq = q.counts().0;
        for (slot, bounce, _) in self.round.waits.drain(..) {
            self.copy_waits.push_back(CopyWait {
                seq,
                kernel: None,
                slot,
                failed,
                bounce,
            });
        }
        self.round.first.clear();
        self.round.last.clear();
        self.round.host_memory = false;
    }

    /// Whether the round waits for more copies: it would be a copy kernel launch, `kernel_ahead`
    /// launches are undecided (`NVSHMEM_EFA_SOFT_KERNEL_AHEAD`), and it has room for another
    /// consumer pass (half a launch). A launch costs the consumer a driver call, so rounds grow
    /// while kernels run instead of going out a few WQEs at a time. The round goes out once one
    /// of them is decided (within the stuck limit: a launch that cannot start is taken over then).
    fn round_gathers(&self) -> bool {
        let Some(k) = &self.kcopies else {
            return false;
        };
        if k.undecided() < self.inner.kernel_ahead
            || self.round.first.is_empty()
            || (self.round.host_memory && !k.reaches_host_memory())
            || self.round.first.len() >= crate::cuda::kernel::COPY_MAX / 2
        {
            return false;
        }
        let bytes: usize = self.round.first.iter().map(|c| c.2).sum();
        bytes < crate::mover::kcopy::MAX_LAUNCH_BYTES / 2
    }

    /// The next copy kernel launch of the round ([`CopyRoute::Kernel`]): the longest prefix of its
    /// copies, in the order taken, that fits one launch ([`crate::mover::kcopy::KernelCopies::fits`]),
    /// with the zero-length WQEs among them. Returns the launch's id and how many of the round's
    /// WQEs (`waits`) it carries, which the caller drains; `None` when nothing (more) can be
    /// launched: the rest takes the copy engine. Each copy goes in one hop, from the source of its
    /// first hop to the destination of its second; the hops are kept for a take-over.
    fn launch_round(&mut self) -> Option<(u64, usize)> {
        let k = self.kcopies.as_mut()?;
        if self.round.first.is_empty() || (self.round.host_memory && !k.reaches_host_memory()) {
            return None;
        }
        let (copies, n) = launch_prefix(&self.round.waits, &self.round.first);
        if copies == 0 {
            return None;
        }
        let first: Vec<_> = self.round.first.drain(..copies).collect();
        let last: Vec<_> = self.round.last.drain(..copies).collect();
        let direct: Vec<(u64, u64, usize)> = first
            .iter()
            .zip(&last)
            .map(|(first, last)| (last.0, first.1, first.2))
            .collect();
        let hops = Hops { first, last };
        // SAFETY: the ranges as in flush_copies (GPU memory, or host memory for the host's
        // stand-in); they stay valid until the launch is settled: the consumer settles or closes
        // every launch before it stops, and the transport's mappings outlive the consumer.
        match unsafe { k.launch(&direct, hops, Instant::now()) } {
            Ok(id) => Some((id, n)),
            Err((_, hops)) => {
                // Back in front, in order: the copy engine takes them with the rest.
                self.round.first.splice(0..0, hops.first);
                self.round.last.splice(0..0, hops.last);
                None
            }
        }
    }

    /// Settles the copy kernel's launches: an applied one completes its WQEs (in order, by
    /// [`Consumer::poll_copies`]); the copies of one the host took over go to the copy engine now,
    /// in their two hops through the bounce ring ranges their WQEs still hold.
    fn settle_launches(&mut self) {
        let Some(k) = self.kcopies.as_mut() else {
            return;
        };
        if k.pending() == 0 {
            return;
        }
        let mut done = Vec::new();
        k.settle(Instant::now(), &mut done);
        for d in done {
            match d {
                Done::Applied(id) => {
                    self.kdone.insert(id);
                }
                Done::TakenOver(id, hops) => self.carry_launch(id, hops),
            }
        }
    }

    /// Moves the copies of launch `id`, taken over by the host, through the copy engine.
    fn carry_launch(&mut self, id: u64, hops: Hops) {
        let Some(q) = self.copyq.as_mut() else {
            return;
        };
        // SAFETY: as in flush_copies; the kernel of this launch leaves every range alone (the
        // host owns it).
        let r = unsafe {
            q.submit_many(&hops.first)
                .and_then(|()| q.submit_many(&hops.last))
        };
        if let Err(e) = &r {
            tracing::warn!(
                "software queue: copies of a copy kernel launch taken over not (all) enqueued: \
                 {e}; their WQEs complete with an error"
            );
        }
        let seq = q.counts().0;
        for w in self.copy_waits.iter_mut().filter(|w| w.kernel == Some(id)) {
            w.kernel = None;
            w.seq = seq;
            w.failed |= r.is_err();
        }
    }

    /// Marks what was enqueued since the last call (one event for the batch), settles copy kernel
    /// launches, retires finished copies and completes their WQEs in order. Returns the WQEs
    /// completed.
    pub(super) fn poll_copies(&mut self) -> usize {
        self.flush_copies();
        if self.copyq.is_none() || self.copy_waits.is_empty() {
            return 0;
        }
        self.settle_launches();
        // Counted before the WQEs complete: whoever sees a completion sees its launch (and its
        // copy) counted.
        self.publish_counts();
        let q = self.copyq.as_mut().expect("checked above");
        q.poll();
        let (_, completed, _) = q.counts();
        // A failed query counts every copy complete and keeps the error for quiet: the WQEs retired
        // with it get an error status.
        let error = if q.outstanding() == 0 {
            q.quiet(Instant::now()).err()
        } else {
            None
        };
        if let Some(e) = &error {
            tracing::warn!("software queue: copy failed: {e}");
        }
        let mut n = 0;
        while let Some(w) = self.copy_waits.front().copied() {
            match w.kernel {
                Some(id) if !self.kdone.contains(&id) => break,
                None if w.seq > completed => break,
                _ => {}
            }
            self.copy_waits.pop_front();
            if let Some(id) = w.kernel {
                // The launch's last WQE: forget it.
                if self.copy_waits.front().and_then(|n| n.kernel) != Some(id) {
                    self.kdone.remove(&id);
                }
            }
            if let (Some(mark), Some(ring)) = (w.bounce, self.bounce.as_mut()) {
                ring.release(mark);
            }
            let status = if w.failed || (w.kernel.is_none() && error.is_some()) {
                CqStatus::LocalQpInternalError
            } else {
                CqStatus::Ok
            };
            self.complete_tx(u64::from(w.slot), status);
            n += 1;
        }
        if n > 0 {
            self.note(super::trace::Event::CopyDone, n as u32, 0);
        }
        n
    }

    /// Forgets the copy waits of flushed WQEs (their slots were completed as flushed), after a
    /// bounded wait for the copies themselves (they write into memory the caller frees next).
    pub(super) fn drop_copy_waits(&mut self) {
        // Copies taken this round but not enqueued yet: nothing to wait for (their WQEs are
        // completed as flushed with the rest).
        self.round = CopyRound::default();
        if let Some(k) = self.kcopies.as_mut() {
            let mut out = Vec::new();
            if !k.close(Instant::now() + Duration::from_secs(1), &mut out) {
                tracing::warn!(
                    "software queue stopping: {} copy kernel launch(es) still undecided after 1 s",
                    k.pending()
                );
            }
        }
        self.kdone.clear();
        if let Some(q) = self.copyq.as_mut() {
            if let Err(e) = q.quiet_for(Duration::from_secs(1)) {
                tracing::warn!("software queue stopping: {e}");
            }
        }
        self.copy_waits.clear();
        if let Some(ring) = self.bounce.as_mut() {
            ring.reset();
        }
    }

    /// The null consumer (`NVSHMEM_EFA_SOFT_NULL=1`, benchmarks only): takes every announced WQE the
    /// flow control allows, checks its request id and phase, and completes it with success without
    /// reading the rest or moving data; the completions of the batch are written together.
    pub(super) fn consume_null(&mut self) -> usize {
        let q = self.cur;
        let db = self.doorbell();
        let ci = self.rings[q].ci;
        let avail = db.wrapping_sub(ci as u32);
        if avail == 0 {
            return 0;
        }
        if avail > self.inner.sq_entries {
            if self.rings[q].bad_doorbell != Some(db) {
                tracing::error!(
                    "software queue (null consumer): doorbell {db} of ring {q} announces {avail} \
                     WQEs past the {ci} consumed: ignored until it makes sense"
                );
                self.rings[q].bad_doorbell = Some(db);
            }
            return 0;
        }
        let sq = u64::from(self.inner.sq_entries);
        let mut room = (self.rings[q].cached_done + sq).saturating_sub(ci);
        if room < u64::from(avail) && self.refresh_done() {
            room = (self.rings[q].cached_done + sq).saturating_sub(ci);
        }
        let take = room.min(u64::from(avail));
        if take == 0 {
            return 0;
        }
        let es = self.inner.sq_entry_size as usize;
        let mut batch = std::mem::take(&mut self.null_batch);
        batch.clear();
        let ring_sq = self.rings[q].sq;
        for pc in ci..ci + take {
            let slot = (pc & (sq - 1)) as usize;
            // SAFETY: the first 8 bytes of a slot inside the SQ ring (8-byte aligned).
            let head: [u8; 8] = unsafe { mem::read_shared(ring_sq.add(slot * es)) };
            let op = OpType::from_raw(head[2] & wqe::CTRL1_OP_TYPE_MASK).unwrap_or(OpType::Send);
            let req_id = u16::from_le_bytes([head[0], head[1]]);
            let phase = head[3] & wqe::CTRL2_PHASE;
            let status = if req_id != pc as u16
                || phase != wqe::phase_for(pc, self.inner.sq_entries)
            {
                self.rejected += 1;
                self.rings[q].rejected += 1;
                if self.rejected <= WARN_REJECTS {
                    tracing::warn!(
                        "software queue (null consumer): WQE {pc} rejected: request id {req_id:#06x}, \
                         phase {phase} (expected {:#06x}, {})",
                        pc as u16,
                        wqe::phase_for(pc, self.inner.sq_entries)
                    );
                }
                CqStatus::LocalQpInternalError
            } else {
                CqStatus::Ok
            };
            batch.push((pc as u16, status, op));
        }
        let r = &mut self.rings[q];
        r.ci += take;
        r.host_word(HC_CONSUMED).store(r.ci, Ordering::Release);
        r.host_word(HC_REJECTED)
            .store(r.rejected, Ordering::Release);
        self.push_tx_cqes(q, &batch);
        self.null_batch = batch;
        take as usize
    }

    /// Writes the TX completions of a batch, in order: every entry's other bytes first, one release
    /// fence, then the flags bytes (what a poller polls), so the batch costs one fence.
    pub(super) fn push_tx_cqes(&mut self, q: usize, batch: &[(u16, CqStatus, OpType)]) {
        let mut flags = Vec::with_capacity(batch.len());
        let cq_pc = self.rings[q].cq_pc;
        for (i, &(req_id, status, op)) in batch.iter().enumerate() {
            let pc = cq_pc + i as u64;
            let bytes = self.tx_cqe_bytes(pc, req_id, status, op);
            let p = self.cq_slot(q, pc);
            // SAFETY: the slot lies inside the CQ ring; the flags byte (3) is written below.
            unsafe {
                mem::write_shared(p, &bytes[..3]);
                mem::write_shared(p.add(4), &bytes[4..]);
            }
            flags.push((p, bytes[3]));
        }
        fence(Ordering::Release);
        for (p, f) in flags {
            // SAFETY: the flags byte of a slot inside the CQ ring.
            unsafe { mem::atomic_u8(p.add(3)) }.store(f, Ordering::Relaxed);
        }
        self.advance_cq(q, batch.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl PeerMemory for Fake {
        fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
            (pe == 1 && addr >= 0x1000 && addr + len <= 0x2000).then_some(addr + 0x10_0000)
        }
    }

    #[test]
    fn copy_route_spellings() {
        for (v, want) in [
            ("0", Some(CopyRoute::Off)),
            ("no", Some(CopyRoute::Off)),
            ("host", Some(CopyRoute::Host)),
            ("kernel", Some(CopyRoute::Kernel)),
            ("1", Some(CopyRoute::Kernel)),
            ("ON", Some(CopyRoute::Kernel)),
            ("true", Some(CopyRoute::Kernel)),
            ("direct", None),
            ("d2d", None),
            ("", None),
        ] {
            assert_eq!(CopyRoute::parse(v), want, "{v:?}");
        }
        assert_eq!(CopyRoute::default(), CopyRoute::Kernel);
        assert!(
            !CopyRoute::Off.enabled() && CopyRoute::Host.enabled() && CopyRoute::Kernel.enabled()
        );
    }

    #[test]
    fn bounce_ring_reserves_wraps_and_releases_in_order() {
        let mut r = BounceRing::plain(4096 + 100);
        assert_eq!(r.capacity(), 4096, "rounded down to the alignment");
        let base = r.base();
        assert_eq!(base % BOUNCE_ALIGN, 0);
        let (a, ma) = r.reserve(1000).unwrap();
        let (b, mb) = r.reserve(1).unwrap();
        assert_eq!((a, b), (base, base + 1024), "aligned, contiguous");
        let (c, mc) = r.reserve(2048).unwrap();
        assert_eq!(c, base + 1280);
        assert_eq!(
            r.reserve(1024),
            None,
            "768 bytes left at the end, none at the start"
        );
        assert_eq!(r.reserve(4097), None, "larger than the ring");
        r.release(ma);
        // The tail (768 bytes) is too short: the reservation wraps to the start.
        let (d, md) = r.reserve(1000).unwrap();
        assert_eq!(d, base);
        assert_eq!(
            r.reserve(1),
            None,
            "the ring is full up to the oldest reservation"
        );
        r.release(mb);
        r.release(mc);
        let (e, _) = r.reserve(256).unwrap();
        assert_eq!(e, base + 1024);
        r.release(md);
        r.reset();
        assert_eq!(r.head, r.tail);
        let (f, _) = r.reserve(4096).unwrap();
        assert_eq!(f, base, "a ring-sized reservation wraps to the start");
    }

    #[test]
    fn route_needs_switch_mapping_and_no_immediate() {
        let f = Fake;
        let pm: Option<&dyn PeerMemory> = Some(&f);
        assert_eq!(ipc_route(true, pm, 1, 0x1000, 8, false), Some(0x10_1000));
        assert_eq!(ipc_route(true, pm, 1, 0x1ff8, 8, false), Some(0x10_1ff8));
        assert_eq!(
            ipc_route(true, pm, 1, 0x1ff9, 8, false),
            None,
            "range leaves the map"
        );
        assert_eq!(
            ipc_route(true, pm, 0, 0x1000, 8, false),
            None,
            "PE not mapped"
        );
        assert_eq!(ipc_route(true, pm, 1, 0x1000, 8, true), None, "immediate");
        assert_eq!(
            ipc_route(false, pm, 1, 0x1000, 8, false),
            None,
            "switched off"
        );
        assert_eq!(ipc_route(true, None, 1, 0x1000, 8, false), None, "no map");
    }
}

#[cfg(test)]
mod launch_tests {
    use super::launch_prefix;
    use crate::cuda::kernel::COPY_MAX;
    use crate::mover::kcopy::{MAX_COPY_BYTES, MAX_LAUNCH_BYTES};

    type Waits = Vec<(u32, Option<u64>, bool)>;
    type Copies = Vec<(u64, u64, usize)>;

    fn round(lens: &[usize]) -> (Waits, Copies) {
        let waits = lens.iter().map(|&l| (0, None, l > 0)).collect();
        let first = lens
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| (0, 0, l))
            .collect();
        (waits, first)
    }

    #[test]
    fn a_round_that_fits_is_one_launch_with_its_zero_length_wqes() {
        let (w, f) = round(&[0, 8, 0, 100, 0]);
        assert_eq!(launch_prefix(&w, &f), (2, 5));
    }

    #[test]
    fn many_copies_split_at_copy_max_and_the_rest_is_the_next_launch() {
        let (w, f) = round(&vec![64; COPY_MAX * 2 + 3]);
        assert_eq!(launch_prefix(&w, &f), (COPY_MAX, COPY_MAX));
        let (w2, f2) = (&w[COPY_MAX..], &f[COPY_MAX..]);
        assert_eq!(launch_prefix(w2, f2), (COPY_MAX, COPY_MAX));
        assert_eq!(launch_prefix(&w2[COPY_MAX..], &f2[COPY_MAX..]), (3, 3));
    }

    #[test]
    fn bytes_split_at_the_launch_limit_and_a_large_copy_goes_to_the_engine() {
        let fit = MAX_LAUNCH_BYTES / MAX_COPY_BYTES;
        let mut lens = vec![MAX_COPY_BYTES; fit];
        lens.extend([0, MAX_COPY_BYTES, 8]);
        let (w, f) = round(&lens);
        // `fit` fill the launch (the zero-length WQE after them rides along); the next starts
        // the next launch.
        assert_eq!(launch_prefix(&w, &f), (fit, fit + 1));
        assert_eq!(launch_prefix(&w[fit + 1..], &f[fit..]), (2, 2));
        let (w, f) = round(&[MAX_COPY_BYTES + 1, 8]);
        assert_eq!(
            launch_prefix(&w, &f),
            (0, 0),
            "a copy too large for the kernel: engine"
        );
        let (w, f) = round(&[8, MAX_COPY_BYTES + 1]);
        assert_eq!(launch_prefix(&w, &f), (1, 1));
        let (w, f) = round(&[0, 0]);
        assert_eq!(launch_prefix(&w, &f), (0, 0));
    }
}
