//! The mover itself: registration (memory kind decided once, IPC export: legacy CUDA IPC, or CUDA
//! VMM through this process's fd server), peers' regions opened lazily and cached, copies submitted
//! per endpoint queue, polled and waited for with a deadline.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use super::amo::{AmoRequest, Launch};
use super::amo_lanes::AmoLanes;
use super::fdshare::{self, FdServer};
use super::handle::{Export, HostId, IpcDesc};
use super::kfront::KernelFront;
use super::queue::{CopyQueue, CudaEngine, INLINE_BYTES};
use super::stats::{Stage, Stats};
use super::{choose, Kind, MResult, Means, MoverError, Peer, Policy};
use crate::cuda::kernel::{self, AmoOp};
use crate::cuda::{self, ipc, vmm, PtrKind};

/// The engine of a transport copy queue: the copy kernel in front of the copy engine.
pub(super) type Engine = KernelFront<CudaEngine>;

/// What registration decided about a local region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The memory kind, carried with the registration from now on.
    pub kind: Kind,
    /// The IPC export to put into the memory handle (GPU memory that legacy IPC can export).
    pub ipc: Option<IpcDesc>,
    /// Why GPU memory has no export (logged; peers then use the staged or provider path).
    pub no_ipc: Option<String>,
}

/// A peer's allocation opened in this process.
#[derive(Debug)]
enum Opened {
    /// Through legacy CUDA IPC.
    Legacy(ipc::Mapping),
    /// CUDA VMM allocations imported from the peer's fd server and mapped here.
    Vmm(vmm::VmmMapping),
}

impl Opened {
    fn base(&self) -> u64 {
        match self {
            Opened::Legacy(m) => m.base(),
            Opened::Vmm(m) => m.base(),
        }
    }
}

/// A peer's allocation: open (with the registered regions resolved in it, for [`Mover::lookup`]),
/// or known not to open (not retried).
#[derive(Debug)]
struct MapSlot {
    open: Option<Arc<Opened>>,
    /// The allocation's base in the peer's address space.
    alloc_base: u64,
    /// The peer's registered regions (base, length) resolved through this slot.
    regions: Vec<(u64, u64)>,
    /// This context's GPU atomics on the allocation are atomic against its own GPU's (the same
    /// device, or peers with native atomics): kernel atomics may target it.
    atomics: bool,
}

/// The data mover of one transport.
pub struct Mover {
    pub(super) policy: Policy,
    /// The CUDA context copies run in (the application's, captured at connect).
    pub(super) ctx: AtomicUsize,
    my_pe: AtomicUsize,
    hosts: RwLock<Vec<HostId>>,
    /// Opened peer allocations by (peer, export): the driver gives a new allocation a new legacy
    /// handle even at a reused address, and every VMM registration gets a new export id, so a freed
    /// and reallocated heap is opened afresh.
    maps: Mutex<HashMap<(i32, Export), MapSlot>>,
    /// This process's fd server, started at the first VMM export; stopped by `close_peers`.
    fds: Mutex<Option<FdServer>>,
    /// VMM exports of this process by registered (base, length), for `unregister`.
    vmm_exports: Mutex<HashMap<(u64, u64), u64>>,
    /// One copy queue per endpoint (created at first use: needs the context).
    pub(super) queues: Vec<Mutex<Option<CopyQueue<Engine>>>>,
    /// Small device copies as copy-kernel launches in front of the copy engine
    /// (`NVSHMEM_EFA_COPY_KERNEL`; batching queues created by [`Mover::prepare_queues`] only).
    pub(super) copy_kernel: bool,
    /// The copy kernel loaded into the context ([`Mover::load_copy_kernel`]).
    /// (`None`: not tried yet; `Some(None)`: it did not load, logged once.)
    pub(super) kernel: Mutex<Option<Option<Arc<kernel::CopyKernel>>>>,
    stats: Arc<Stats>,
    /// How long a submission may wait for a free inline slot.
    timeout: std::time::Duration,
    /// Copies a queue holds back for one submission ([`CopyQueue::with_batch`]).
    pub(super) copy_batch: usize,
    /// The device of the mover's context (for [`MapSlot::atomics`] and kernel results).
    device: std::sync::atomic::AtomicI32,
    /// Kernel atomics, one lane per endpoint (loaded at connect by
    /// [`Mover::prepare_kernel_amos`]).
    amos: AmoLanes,
}

impl Mover {
    /// A mover with `queues` copy queues (one per transport endpoint).
    pub fn new(policy: Policy, queues: usize) -> Mover {
        Mover {
            policy,
            ctx: AtomicUsize::new(0),
            my_pe: AtomicUsize::new(usize::MAX),
            hosts: RwLock::new(Vec::new()),
            maps: Mutex::new(HashMap::new()),
            fds: Mutex::new(None),
            vmm_exports: Mutex::new(HashMap::new()),
            queues: (0..queues).map(|_| Mutex::new(None)).collect(),
            stats: Arc::new(Stats::default()),
            timeout: std::time::Duration::from_secs(60),
            copy_batch: 0,
            copy_kernel: false,
            kernel: Mutex::new(None),
            device: std::sync::atomic::AtomicI32::new(-1),
            amos: AmoLanes::new(queues),
        }
    }

    /// Sets how long a submission may wait for resources (the transport's quiet timeout).
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Mover {
        self.timeout = timeout;
        self
    }

    /// Sets how many copies an endpoint's queue holds back for one submission
    /// (`NVSHMEM_EFA_COPY_BATCH`; 0 or 1: each copy is submitted at once).
    pub fn with_copy_batch(mut self, batch: usize) -> Mover {
        self.copy_batch = batch;
        self
    }

    /// Sends batches of small device copies through the copy kernel (`NVSHMEM_EFA_COPY_KERNEL`;
    /// takes effect with a copy batch of more than 1).
    pub fn with_copy_kernel(mut self, on: bool) -> Mover {
        self.copy_kernel = on;
        self
    }

    /// The policy fixed at initialisation.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The per-stage counters (shared with the transport's staged path).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The CUDA context for copies and IPC mappings (0: none known yet).
    pub fn set_context(&self, ctx: usize) {
        if ctx != 0 {
            self.ctx.store(ctx, Ordering::Relaxed);
            // Known before any peer allocation opens (MapSlot::atomics is decided then).
            if let Ok(d) = kernel::context_device(ctx) {
                self.device.store(d, Ordering::Relaxed);
            }
        }
    }

    /// Every PE's host identity, in PE order, as exchanged at connect.
    pub fn set_peers(&self, my_pe: i32, hosts: Vec<HostId>) {
        let same = hosts.iter().filter(|h| h.same_as(HostId::local())).count();
        tracing::debug!(
            "PE {my_pe}: {same} of {} PEs on this host (host id {:#018x})",
            hosts.len(),
            HostId::local().0
        );
        self.my_pe.store(my_pe as usize, Ordering::Relaxed);
        *self.hosts.write() = hosts;
    }

    /// Whether `pe` runs on this host.
    pub fn same_host(&self, pe: i32) -> bool {
        usize::try_from(pe)
            .ok()
            .and_then(|p| self.hosts.read().get(p).copied())
            .is_some_and(|h| h.same_as(HostId::local()))
    }

    /// Classifies `[base, base + len)` once and, for GPU memory with IPC on, exports it.
    pub fn register(&self, base: u64, len: u64) -> Registered {
        let (ordinal, legacy_ipc) = match cuda::pointer_kind(base as *const std::ffi::c_void) {
            PtrKind::Host => {
                return Registered {
                    kind: Kind::Host,
                    ipc: None,
                    no_ipc: None,
                }
            }
            PtrKind::Device {
                ordinal,
                legacy_ipc,
            } => (ordinal, legacy_ipc),
        };
        let mut r = Registered {
            kind: Kind::Device,
            ipc: None,
            no_ipc: None,
        };
        if !self.policy.ipc {
            r.no_ipc = Some("NVSHMEM_EFA_IPC=0".into());
            return r;
        }
        let _g = match cuda::ContextGuard::enter(self.ctx.load(Ordering::Relaxed)) {
            Ok(g) => g,
            Err(e) => {
                r.no_ipc = Some(e.to_string());
                return r;
            }
        };
        // Device memory that legacy IPC cannot export is CUDA VMM memory (see ipc::is_vmm).
        let exported = if !legacy_ipc {
            self.export_vmm(base, len)
        } else {
            ipc::export(base, len).map(|x| {
                (
                    x.alloc_base,
                    x.alloc_len,
                    Export::Legacy { handle: x.handle },
                )
            })
        };
        match exported {
            Ok((alloc_base, alloc_len, export)) => {
                r.ipc = Some(IpcDesc {
                    host: HostId::local(),
                    pid: std::process::id(),
                    ordinal,
                    alloc_base,
                    alloc_len,
                    region_base: base,
                    region_len: len,
                    export,
                });
                let how = match export {
                    Export::Legacy { .. } => "CUDA IPC".to_string(),
                    Export::Vmm { pieces, .. } => {
                        format!("CUDA VMM, {pieces} allocation(s) through the fd server")
                    }
                };
                tracing::debug!(
                    "{base:#x}+{len}: exported for same-host copies ({how}; allocation {alloc_base:#x}+{alloc_len})"
                );
            }
            Err(e) => {
                let msg = format!("{base:#x}+{len}: no same-host GPU copies: {e}");
                if matches!(e, ipc::ExportError::Vmm | ipc::ExportError::NotShareable(_)) {
                    tracing::warn!("{msg}");
                } else {
                    tracing::info!("{msg}");
                }
                r.no_ipc = Some(msg);
            }
        }
        r
    }

    /// Exports VMM memory `[base, base + len)`: its allocations' descriptors go to this process's fd
    /// server (started on first use). Returns the run of mappings and the export.
    fn export_vmm(&self, base: u64, len: u64) -> Result<(u64, u64, Export), ipc::ExportError> {
        let x = vmm::export(base, len, fdshare::MAX_PIECES)?;
        let n = x.pieces.len();
        let pieces = x
            .pieces
            .into_iter()
            .map(|p| fdshare::Piece {
                offset: p.offset,
                len: p.len,
                fd: p.fd,
            })
            .collect();
        let server_err = |e: std::io::Error| {
            ipc::ExportError::Cuda(cuda::CudaError {
                code: 0,
                context: format!("fd server: {e}"),
            })
        };
        let mut fds = self.fds.lock();
        if fds.is_none() {
            *fds = Some(FdServer::start().map_err(server_err)?);
        }
        let server = fds.as_ref().expect("started above");
        let export_id = server.add(pieces).map_err(server_err)?;
        if let Some(old) = self.vmm_exports.lock().insert((base, len), export_id) {
            // Registered again without a release: the old export goes.
            server.remove(old);
        }
        Ok((
            x.alloc_base,
            x.alloc_len,
            Export::Vmm {
                cookie: server.cookie(),
                export_id,
                pieces: n as u32,
            },
        ))
    }

    /// The registration of `[base, base + len)` ends: its VMM export (if any) is withdrawn and its
    /// descriptors closed. Peers that opened it keep their mappings until they close them.
    pub fn unregister(&self, base: u64, len: u64) {
        let Some(id) = self.vmm_exports.lock().remove(&(base, len)) else {
            return;
        };
        if let Some(s) = self.fds.lock().as_ref() {
            s.remove(id);
            tracing::debug!("{base:#x}+{len}: VMM export {id} withdrawn");
        }
    }

    /// Where the peer's `[addr, addr + len)` (described by `desc`, read from its memory handle) is
    /// reachable from this process: `Ok(Some(local address))` when the peer shares this host and its
    /// allocation is (or now gets) opened; `Ok(None)` when IPC does not apply or the handle does
    /// not open (logged once per allocation; the caller uses another means); an error for a range
    /// outside the registered region.
    pub fn resolve(&self, pe: i32, desc: &IpcDesc, addr: u64, len: u64) -> MResult<Option<u64>> {
        Ok(self.resolve_with(pe, desc, addr, len)?.map(|(a, _)| a))
    }

    /// [`Mover::resolve`], with whether GPU atomics of this context on the range are atomic
    /// against the owning GPU's ([`MapSlot::atomics`]).
    fn resolve_with(
        &self,
        pe: i32,
        desc: &IpcDesc,
        addr: u64,
        len: u64,
    ) -> MResult<Option<(u64, bool)>> {
        if !desc.contains(addr, len) {
            return Err(MoverError::Invalid(format!(
                "PE {pe}: remote range {addr:#x}+{len} outside the registered region {:#x}+{}",
                desc.region_base, desc.region_len
            )));
        }
        if !self.policy.ipc || !self.same_host(pe) || !desc.host.same_as(HostId::local()) {
            return Ok(None);
        }
        if desc.pid == std::process::id() {
            // This process's own memory (a PE talking to itself): no mapping needed.
            return Ok(Some((addr, true)));
        }
        let key = (pe, desc.export);
        let mut maps = self.maps.lock();
        let slot = match maps.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let open = self.open(pe, desc);
                let atomics = open.as_ref().is_some_and(|m| self.atomics_on(pe, m.base()));
                e.insert(MapSlot {
                    open,
                    alloc_base: desc.alloc_base,
                    regions: Vec::new(),
                    atomics,
                })
            }
        };
        let Some(m) = slot.open.clone() else {
            return Ok(None);
        };
        let atomics = slot.atomics;
        let region = (desc.region_base, desc.region_len);
        if !slot.regions.contains(&region) {
            slot.regions.push(region);
        }
        drop(maps);
        Ok(Some((desc.translate(m.base(), addr, len)?, atomics)))
    }

    /// Whether this context's GPU atomics on a peer allocation mapped at `base` are atomic against
    /// the owning GPU's own (logged once per allocation when not).
    fn atomics_on(&self, pe: i32, base: u64) -> bool {
        let me = self.device.load(Ordering::Relaxed);
        match cuda::pointer_kind(base as *const std::ffi::c_void) {
            PtrKind::Device { ordinal, .. } if me >= 0 && kernel::native_atomics(me, ordinal) => {
                true
            }
            other => {
                tracing::debug!(
                    "PE {pe}: its GPU memory at {base:#x} ({other:?}) is not reachable by native \
                     atomics from device {me}; atomics to it take the provider's path"
                );
                false
            }
        }
    }

    /// Opens a peer's allocation (legacy IPC handle, or VMM export fetched from its fd server);
    /// `None` (logged) when it does not open.
    fn open(&self, pe: i32, desc: &IpcDesc) -> Option<Arc<Opened>> {
        let t = Instant::now();
        let ctx = self.ctx.load(Ordering::Relaxed);
        let (opened, how) = match desc.export {
            Export::Legacy { handle } => (
                ipc::Mapping::open(ctx, &handle)
                    .map(Opened::Legacy)
                    .map_err(|e| e.to_string()),
                "CUDA IPC",
            ),
            Export::Vmm {
                cookie,
                export_id,
                pieces,
            } => (
                open_vmm(ctx, desc, cookie, export_id, pieces).map(Opened::Vmm),
                "CUDA VMM",
            ),
        };
        match opened {
            Ok(m) => {
                tracing::info!(
                    "PE {pe}: GPU memory opened for same-host copies ({how}): allocation {:#x}+{} \
                     at {:#x} in {:?}",
                    desc.alloc_base,
                    desc.alloc_len,
                    m.base(),
                    t.elapsed()
                );
                Some(Arc::new(m))
            }
            Err(e) => {
                tracing::warn!(
                    "PE {pe}: cannot open its GPU memory through {how} ({e}); transfers to it \
                     take the staged path"
                );
                None
            }
        }
    }

    /// The local address of PE `pe`'s `[addr, addr + len)`: the address itself when `pe` is this
    /// PE (its heap is this process's memory), else the mapped address when the range lies inside
    /// a registered region of that peer already opened here (legacy IPC or VMM); opens nothing.
    pub fn lookup(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        if pe >= 0 && pe as usize == self.my_pe.load(Ordering::Relaxed) {
            return Some(addr);
        }
        let maps = self.maps.lock();
        maps.iter()
            .filter(|((p, _), _)| *p == pe)
            .find_map(|(_, slot)| {
                let m = slot.open.as_ref()?;
                let inside = slot
                    .regions
                    .iter()
                    .any(|&(b, l)| addr >= b && b.checked_add(l).is_some_and(|e| end <= e));
                if !inside {
                    return None;
                }
                m.base().checked_add(addr.checked_sub(slot.alloc_base)?)
            })
    }

    /// The means for one transfer (see [`super::choose`]).
    pub fn means(&self, pe: i32, local: Kind, remote: Kind, ipc_open: bool) -> Means {
        let peer = Peer {
            is_self: pe >= 0 && pe as usize == self.my_pe.load(Ordering::Relaxed),
            same_host: self.same_host(pe),
            ipc_open,
        };
        choose(self.policy, local, remote, peer)
    }

    /// Enqueues a copy on endpoint `ep`'s queue (never blocks on the GPU). Complete once
    /// [`Mover::quiet`] on the same endpoint returned `Ok`.
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes (addresses of this process, mapped peer memory
    /// included) until that quiet returns.
    pub unsafe fn copy(&self, ep: usize, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller's guarantee.
        self.with_queue(ep, len, |q| unsafe { q.submit(dst, src, len) })
    }

    /// [`Mover::copy`] between device-accessible ranges (device memory of the context, mapped peer
    /// memory): the queue may move it with the copy kernel.
    ///
    /// # Safety
    /// As [`Mover::copy`], and both ranges device-accessible.
    pub unsafe fn copy_device(&self, ep: usize, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: the caller's guarantee.
        self.with_queue(ep, len, |q| unsafe { q.submit_device(dst, src, len) })
    }

    /// Runs `f` on endpoint `ep`'s queue (created at first use), counted as one submission of
    /// `len` bytes.
    fn with_queue(
        &self,
        ep: usize,
        len: usize,
        f: impl FnOnce(&mut CopyQueue<Engine>) -> MResult<()>,
    ) -> MResult<()> {
        let q = self
            .queues
            .get(ep)
            .ok_or_else(|| MoverError::Invalid(format!("copy queue {ep} does not exist")))?;
        let mut q = q.lock();
        if q.is_none() {
            // Not prepared at connect: the copy engine alone (no module load here, see
            // `prepare_queues`).
            let ctx = self.ctx.load(Ordering::Relaxed);
            let inner = CudaEngine::new(ctx, self.policy.copy_overlap)?;
            *q = Some(CopyQueue::new(KernelFront::new(inner, None)).with_batch(self.copy_batch));
        }
        let t = self.stats.start();
        let r = f(q.as_mut().expect("created above"));
        self.stats.record(Stage::IpcSubmit, t, len as u64);
        r
    }

    /// One put or get with a peer whose region is described by `desc` (from its memory handle):
    /// when the pair allows a copy-engine copy (same host, IPC open, or this very process), the copy
    /// is enqueued on endpoint `ep`'s queue and `Ok(true)` returned (complete at the next quiet of
    /// `ep`); `Ok(false)` leaves the transfer to the caller's other means (staged or provider).
    /// Errors: the remote range leaves the registered region, or the copy could not be enqueued.
    ///
    /// `local_registered` says whether the local range lies in a registration (kept until quiet).
    /// A put from memory that is not (NVSHMEM's inline values: the caller may reuse them as soon as
    /// this returns) is taken at once through the inline ring when it is host memory of at most
    /// [`INLINE_BYTES`]; a larger one is declined.
    ///
    /// # Safety
    /// `[local, local + len)` must be valid memory of this process until that quiet returns (for
    /// inline puts: until this call returns).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn transfer(
        &self,
        ep: usize,
        pe: i32,
        is_put: bool,
        local: u64,
        local_kind: Kind,
        local_registered: bool,
        desc: &IpcDesc,
        raddr: u64,
        len: u64,
    ) -> MResult<bool> {
        let inline = is_put && !local_registered;
        if inline && (local_kind != Kind::Host || len as usize > INLINE_BYTES) {
            return Ok(false);
        }
        let Some(mapped) = self.resolve(pe, desc, raddr, len)? else {
            return Ok(false);
        };
        let means = self.means(pe, local_kind, Kind::Device, true);
        if !matches!(means, Means::Ipc | Means::Local) {
            return Ok(false);
        }
        if inline {
            // SAFETY: the caller vouches for the local range for the duration of this call.
            let bytes = unsafe { std::slice::from_raw_parts(local as *const u8, len as usize) };
            // SAFETY: `mapped` lies in the peer's open allocation (see below).
            unsafe { self.copy_inline(ep, mapped, bytes)? };
            return Ok(true);
        }
        let (dst, src) = if is_put {
            (mapped, local)
        } else {
            (local, mapped)
        };
        // SAFETY: `mapped` lies in the peer's open allocation (resolve checked the range against the
        // registered region) and the mapping stays open until close_peers; the caller vouches for
        // the local range, which is device memory registered in this context (NVSHMEM's heap or a
        // registered buffer on this PE's GPU) where `copy_device` is taken: unregistered device
        // memory may lie on another GPU, which the copy engine reaches and a kernel may not.
        unsafe {
            if local_kind == Kind::Device && local_registered {
                self.copy_device(ep, dst, src, len as usize)?
            } else {
                self.copy(ep, dst, src, len as usize)?
            }
        };
        Ok(true)
    }

    /// Enqueues a copy of `bytes` (taken at once, at most [`INLINE_BYTES`]) to `dst` on endpoint
    /// `ep`'s queue.
    ///
    /// # Safety
    /// `[dst, dst + bytes.len())` must be valid until the next quiet of `ep` returned.
    pub unsafe fn copy_inline(&self, ep: usize, dst: u64, bytes: &[u8]) -> MResult<()> {
        let deadline = Instant::now() + self.timeout;
        // SAFETY: the caller's guarantee.
        self.with_queue(ep, bytes.len(), |q| unsafe {
            q.submit_inline(dst, bytes, deadline)
        })
    }

    /// Retires completed copies of endpoint `ep` (for progress); returns how many.
    pub fn poll(&self, ep: usize) -> u64 {
        match self.queues.get(ep) {
            // try_lock: progress never waits for a thread that is submitting.
            Some(q) => q
                .try_lock()
                .and_then(|mut q| q.as_mut().map(|q| q.poll()))
                .unwrap_or(0),
            None => 0,
        }
    }

    /// Copies submitted on endpoint `ep` so far (held ones included): what
    /// [`Mover::copies_done`] waits for, to let something follow them without a wait.
    pub fn copies_submitted(&self, ep: usize) -> u64 {
        self.queues
            .get(ep)
            .and_then(|q| q.lock().as_ref().map(|q| q.counts().0))
            .unwrap_or(0)
    }

    /// Whether the first `upto` copies submitted on endpoint `ep` have completed, polled without
    /// waiting for a thread that is submitting (`Ok(false)` then); an error when a copy failed
    /// since the last quiet (what follows the copies must not announce them).
    pub fn copies_done(&self, ep: usize, upto: u64) -> MResult<bool> {
        let Some(q) = self.queues.get(ep) else {
            return Ok(true);
        };
        let Some(mut g) = q.try_lock() else {
            return Ok(false);
        };
        let Some(q) = g.as_mut() else {
            return Ok(true);
        };
        if q.counts().1 < upto {
            q.poll();
        }
        if let Some(e) = q.pending_error() {
            return Err(e.clone());
        }
        Ok(q.counts().1 >= upto)
    }

    /// Hands endpoint `ep`'s held copies to the copy engine now, so that a copy enqueued after
    /// this call runs after them (copies of one submission run in no order among themselves).
    pub fn flush(&self, ep: usize) -> MResult<()> {
        match self.queues.get(ep) {
            Some(q) => q.lock().as_mut().map_or(Ok(()), |q| q.flush()),
            None => Ok(()),
        }
    }

    /// Hands endpoint `ep`'s held copies to the copy engine once the oldest has waited
    /// [`super::queue::BATCH_FLUSH_AGE`] (for progress; never waits for a submitting thread).
    pub fn flush_stale(&self, ep: usize) {
        if let Some(mut q) = self.queues.get(ep).and_then(|q| q.try_lock()) {
            if let Some(q) = q.as_mut() {
                q.flush_stale();
            }
        }
    }

    /// Copies of endpoint `ep` not yet complete.
    pub fn outstanding(&self, ep: usize) -> u64 {
        self.queues
            .get(ep)
            .and_then(|q| q.lock().as_ref().map(|q| q.outstanding()))
            .unwrap_or(0)
    }

    /// Waits until every copy submitted on `ep` before the call has completed; an error at
    /// `deadline`, or the first copy error since the last quiet.
    pub fn quiet(&self, ep: usize, deadline: Instant) -> MResult<()> {
        let Some(q) = self.queues.get(ep) else {
            return Ok(());
        };
        let t = self.stats.start();
        let r = match q.lock().as_mut() {
            Some(q) => q.quiet(deadline),
            None => Ok(()),
        };
        self.stats.record(Stage::IpcQuiet, t, 0);
        r
    }

    /// Loads the atomic kernel into the mover's context (see [`AmoLanes::prepare`]).
    pub fn prepare_kernel_amos(&self, stuck: std::time::Duration) -> MResult<()> {
        self.amos.prepare(self.ctx.load(Ordering::Relaxed), stuck)
    }

    /// The kernel-atomic lanes (on/off, settle, carry guard, counts).
    pub fn amos(&self) -> &AmoLanes {
        &self.amos
    }

    /// One atomic `op` of `size` bytes with operand `val` on PE `pe`'s `raddr` (described by
    /// `desc`), launched on endpoint `ep`'s kernel lane after the copies already on its copy
    /// queue; a fetching one (`req.retptr` not 0) stores the old value there: GPU memory of this
    /// device directly, host memory through the slot ([`AmoLanes::settle`] hands it back).
    /// [`Launch::Launched`]: decided by [`AmoLanes::settle`] (the next quiet of `ep` waits for
    /// it); otherwise the caller settles and retries ([`Launch::NoSlot`]) or carries it another way.
    /// A launch the driver refuses turns kernel atomics off (logged) and answers
    /// [`Launch::NotHere`].
    #[allow(clippy::too_many_arguments)]
    pub fn kernel_amo(
        &self,
        ep: usize,
        pe: i32,
        desc: &IpcDesc,
        raddr: u64,
        op: AmoOp,
        size: u32,
        val: u64,
        mut req: AmoRequest,
    ) -> MResult<Launch> {
        if !self.amos.on() {
            return Ok(Launch::NotHere);
        }
        let Some((target, true)) = self.resolve_with(pe, desc, raddr, size as u64)? else {
            return Ok(Launch::NotHere);
        };
        let mut result = 0;
        if req.retptr != 0 {
            let me = self.device.load(Ordering::Relaxed);
            match cuda::pointer_kind(req.retptr as *const std::ffi::c_void) {
                PtrKind::Device { ordinal, .. } if ordinal == me => result = req.retptr,
                PtrKind::Host => req.ret_by_host = true,
                _ => return Ok(Launch::NotHere),
            }
        }
        let Some(queue) = self.queues.get(ep) else {
            return Err(MoverError::Invalid(format!(
                "copy queue {ep} does not exist"
            )));
        };
        let t = self.stats.start();
        let record = |ev: &cuda::stream::Event| -> MResult<bool> {
            match queue.lock().as_mut() {
                Some(q) => q.record_order(ev, Instant::now() + self.timeout),
                None => Ok(false),
            }
        };
        // SAFETY: `target` lies in this process's memory or a peer allocation open until
        // close_peers, which closes the lanes first.
        let launched = unsafe {
            self.amos
                .launch(ep, record, target, op, size, val, result, req)?
        };
        if launched == Launch::Launched {
            self.stats.record(Stage::KernelAmo, t, size as u64);
        }
        Ok(launched)
    }

    /// Closes every opened peer allocation and stops this process's fd server, closing its
    /// exported descriptors (finalize). Copies must be complete. Kernel lanes go first (their
    /// drop waits for launches still queued), so no kernel runs on an unmapped peer.
    pub fn close_peers(&self) {
        self.amos.close();
        // Copy queues next: a copy kernel launch still pending (a late kernel of a taken-over
        // launch, which copies nothing) is waited for before peer memory is unmapped.
        for q in &self.queues {
            q.lock().take();
        }
        self.maps.lock().clear();
        self.vmm_exports.lock().clear();
        if let Some(s) = self.fds.lock().take() {
            s.shutdown();
        }
    }
}

/// Fetches VMM export `export_id` of `desc`'s process from its fd server and maps it.
fn open_vmm(
    ctx: usize,
    desc: &IpcDesc,
    cookie: u64,
    export_id: u64,
    pieces: u32,
) -> Result<vmm::VmmMapping, String> {
    let got = fdshare::fetch(desc.pid, cookie, export_id, fdshare::IO_TIMEOUT)
        .map_err(|e| format!("fd server @{}: {e}", fdshare::socket_name(desc.pid, cookie)))?;
    if got.len() != pieces as usize {
        return Err(format!(
            "the fd server gave {} piece(s), the handle says {pieces}",
            got.len()
        ));
    }
    let parts: Vec<_> = got
        .iter()
        .map(|p| (p.offset, p.len, std::os::fd::AsFd::as_fd(&p.fd)))
        .collect();
    // The descriptors close when `got` drops; the mappings keep the memory.
    vmm::VmmMapping::import(ctx, desc.alloc_len, &parts).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::ipc::HANDLE_BYTES;

    fn policy() -> Policy {
        Policy {
            ipc: true,
            staging: true,
            stage_all: false,
            copy_overlap: true,
        }
    }

    fn desc(host: HostId, pid: u32) -> IpcDesc {
        IpcDesc {
            host,
            pid,
            ordinal: 0,
            alloc_base: 0x10_0000,
            alloc_len: 1 << 20,
            region_base: 0x10_0000,
            region_len: 1 << 20,
            export: Export::Legacy {
                handle: [7; HANDLE_BYTES],
            },
        }
    }

    #[test]
    fn peers_on_other_hosts_are_not_resolved() {
        let m = Mover::new(policy(), 2);
        let other = HostId(HostId::local().0 ^ 1);
        m.set_peers(0, vec![HostId::local(), other]);
        assert!(m.same_host(0));
        assert!(!m.same_host(1));
        assert!(!m.same_host(2) && !m.same_host(-1));
        assert_eq!(m.resolve(1, &desc(other, 1), 0x10_0000, 8), Ok(None));
        // A descriptor claiming this host for a peer known to be elsewhere is not trusted either.
        assert_eq!(
            m.resolve(1, &desc(HostId::local(), 1), 0x10_0000, 8),
            Ok(None)
        );
        assert_eq!(m.means(1, Kind::Device, Kind::Device, false), Means::Staged);
        assert_eq!(m.means(0, Kind::Device, Kind::Device, false), Means::Local);
    }

    #[test]
    fn out_of_range_is_an_error_before_anything_opens() {
        let m = Mover::new(policy(), 2);
        m.set_peers(0, vec![HostId::local(), HostId::local()]);
        let d = desc(HostId::local(), 1);
        assert!(matches!(
            m.resolve(1, &d, d.region_base + d.region_len, 1),
            Err(MoverError::Invalid(_))
        ));
        assert!(m.resolve(1, &d, d.region_base - 1, 8).is_err());
    }

    #[test]
    fn own_process_memory_resolves_to_itself() {
        let m = Mover::new(policy(), 2);
        m.set_peers(0, vec![HostId::local(), HostId::local()]);
        let d = desc(HostId::local(), std::process::id());
        assert_eq!(m.resolve(1, &d, 0x10_0040, 64), Ok(Some(0x10_0040)));
    }

    #[test]
    fn a_handle_that_does_not_open_is_remembered_and_falls_back() {
        if cuda::available() {
            return; // a real driver would try the bogus handle; covered on the GPU node
        }
        let m = Mover::new(policy(), 2);
        m.set_peers(0, vec![HostId::local(), HostId::local()]);
        let d = desc(HostId::local(), std::process::id().wrapping_add(1));
        assert_eq!(m.resolve(1, &d, 0x10_0000, 8), Ok(None));
        assert_eq!(m.maps.lock().len(), 1, "the failure is cached");
        assert_eq!(m.resolve(1, &d, 0x10_0100, 8), Ok(None));
        assert_eq!(m.maps.lock().len(), 1);
        assert_eq!(m.means(1, Kind::Device, Kind::Device, false), Means::Staged);
    }

    #[test]
    fn a_vmm_export_whose_server_is_gone_falls_back_and_lookup_finds_nothing() {
        let m = Mover::new(policy(), 2);
        m.set_peers(0, vec![HostId::local(), HostId::local()]);
        // A server that existed once: its socket name is free again.
        let srv = FdServer::start().unwrap();
        let cookie = srv.cookie();
        drop(srv);
        let d = IpcDesc {
            export: Export::Vmm {
                cookie,
                export_id: 1,
                pieces: 1,
            },
            ..desc(HostId::local(), std::process::id())
        };
        // Its own process resolves to itself without the server (and records nothing).
        assert_eq!(m.resolve(1, &d, 0x10_0000, 8), Ok(Some(0x10_0000)));
        assert_eq!(m.lookup(1, 0x10_0000, 8), None);
        let d = IpcDesc {
            pid: std::process::id().wrapping_add(1),
            ..d
        };
        assert_eq!(m.resolve(1, &d, 0x10_0000, 8), Ok(None));
        assert_eq!(m.maps.lock().len(), 1, "the failure is cached");
        assert_eq!(m.resolve(1, &d, 0x10_0100, 8), Ok(None));
        assert_eq!(m.maps.lock().len(), 1);
        assert_eq!(m.lookup(1, 0x10_0000, 8), None, "not open: nothing to find");
        assert_eq!(m.lookup(1, u64::MAX, 2), None, "overflowing range");
        // Finalize with nothing exported.
        m.unregister(0x10_0000, 1 << 20);
        m.close_peers();
        assert!(m.maps.lock().is_empty());
    }

    #[test]
    fn ipc_off_resolves_nothing_and_registers_without_export() {
        let m = Mover::new(
            Policy {
                ipc: false,
                ..policy()
            },
            1,
        );
        m.set_peers(0, vec![HostId::local(), HostId::local()]);
        let d = desc(HostId::local(), std::process::id().wrapping_add(1));
        assert_eq!(m.resolve(1, &d, 0x10_0000, 8), Ok(None));
        let buf = [0u8; 64];
        let r = m.register(buf.as_ptr() as u64, 64);
        assert_eq!(r.kind, Kind::Host);
        assert_eq!(r.ipc, None);
    }

    #[test]
    fn transfer_declines_what_ipc_cannot_carry_and_rejects_bad_ranges() {
        let m = Mover::new(policy(), 2);
        let other = HostId(HostId::local().0 ^ 1);
        m.set_peers(0, vec![HostId::local(), other, HostId::local()]);
        let d = desc(other, 1);
        // SAFETY: declined before any copy.
        assert_eq!(
            unsafe { m.transfer(0, 1, true, 0x1000, Kind::Device, true, &d, 0x10_0000, 64) },
            Ok(false),
            "peer on another host"
        );
        // SAFETY: rejected before any copy.
        let r = unsafe { m.transfer(0, 1, true, 0x1000, Kind::Device, true, &d, 0x20_0000, 64) };
        assert!(matches!(r, Err(MoverError::Invalid(_))), "{r:?}");
        if !cuda::available() {
            // Same host, but the handle cannot open here: declined, the caller stages.
            let d = desc(HostId::local(), std::process::id().wrapping_add(1));
            // SAFETY: declined before any copy.
            assert_eq!(
                unsafe { m.transfer(1, 2, false, 0x1000, Kind::Host, true, &d, 0x10_0000, 64) },
                Ok(false)
            );
        }
        // Unregistered local memory: GPU memory, or more than an inline slot, is declined before
        // anything is resolved (no error even for a bad range).
        // SAFETY: declined before any copy.
        unsafe {
            assert_eq!(
                m.transfer(0, 1, true, 0x1000, Kind::Device, false, &d, 0x20_0000, 8),
                Ok(false)
            );
            assert_eq!(
                m.transfer(0, 1, true, 0x1000, Kind::Host, false, &d, 0x20_0000, 257),
                Ok(false)
            );
        }
        let off = Mover::new(
            Policy {
                ipc: false,
                ..policy()
            },
            2,
        );
        off.set_peers(0, vec![HostId::local(), HostId::local()]);
        let d = desc(HostId::local(), std::process::id());
        // SAFETY: declined before any copy.
        assert_eq!(
            unsafe { off.transfer(0, 1, true, 0x1000, Kind::Device, true, &d, 0x10_0000, 64) },
            Ok(false),
            "NVSHMEM_EFA_IPC=0"
        );
    }

    #[test]
    fn queues_are_bounded_and_idle_quiet_is_immediate() {
        let m = Mover::new(policy(), 2);
        // SAFETY: the call fails before touching memory (no such queue).
        assert!(unsafe { m.copy(5, 1, 2, 3) }.is_err());
        assert_eq!(m.outstanding(0), 0);
        assert_eq!(m.poll(1), 0);
        assert_eq!(m.poll(9), 0);
        m.quiet(0, Instant::now()).unwrap();
        m.quiet(9, Instant::now()).unwrap();
        if !cuda::available() {
            // SAFETY: fails at engine creation (no driver), before any copy.
            assert!(matches!(
                unsafe { m.copy(0, 1, 2, 3) },
                Err(MoverError::Cuda(_))
            ));
        }
    }
}
