//! The mover itself: registration (memory kind decided once, IPC export), peers' regions opened
//! lazily and cached, copies submitted per endpoint queue, polled and waited for with a deadline.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use super::handle::{HostId, IpcDesc};
use super::queue::{CopyQueue, CudaEngine, INLINE_BYTES};
use super::stats::{Stage, Stats};
use super::{choose, Kind, MResult, Means, MoverError, Peer, Policy};
use crate::cuda::{self, ipc, PtrKind};

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

/// A peer's allocation: open, or known not to open (not retried).
type MapSlot = Option<Arc<ipc::Mapping>>;

/// The data mover of one transport.
pub struct Mover {
    policy: Policy,
    /// The CUDA context copies run in (the application's, captured at connect).
    ctx: AtomicUsize,
    my_pe: AtomicUsize,
    hosts: RwLock<Vec<HostId>>,
    /// Opened peer allocations by (peer, IPC handle): the driver gives a new allocation a new
    /// handle even at a reused address, so a freed and reallocated heap is opened afresh.
    maps: Mutex<HashMap<(i32, [u8; ipc::HANDLE_BYTES]), MapSlot>>,
    /// The regions of `maps` that opened, with where each allocation is mapped (for `lookup`).
    opened: RwLock<Vec<(i32, IpcDesc, u64)>>,
    /// One copy queue per endpoint (created at first use: needs the context).
    queues: Vec<Mutex<Option<CopyQueue<CudaEngine>>>>,
    stats: Arc<Stats>,
    /// How long a submission may wait for a free inline slot.
    timeout: std::time::Duration,
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
            opened: RwLock::new(Vec::new()),
            queues: (0..queues).map(|_| Mutex::new(None)).collect(),
            stats: Arc::new(Stats::default()),
            timeout: std::time::Duration::from_secs(60),
        }
    }

    /// Sets how long a submission may wait for resources (the transport's quiet timeout).
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Mover {
        self.timeout = timeout;
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
        let ordinal = match cuda::pointer_kind(base as *const std::ffi::c_void) {
            PtrKind::Host => {
                return Registered {
                    kind: Kind::Host,
                    ipc: None,
                    no_ipc: None,
                }
            }
            PtrKind::Device { ordinal, .. } => ordinal,
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
        match ipc::export(base, len) {
            Ok(x) => {
                r.ipc = Some(IpcDesc {
                    host: HostId::local(),
                    pid: std::process::id(),
                    ordinal,
                    alloc_base: x.alloc_base,
                    alloc_len: x.alloc_len,
                    region_base: base,
                    region_len: len,
                    handle: x.handle,
                });
                tracing::debug!(
                    "{base:#x}+{len}: exported for CUDA IPC (allocation {:#x}+{})",
                    x.alloc_base,
                    x.alloc_len
                );
            }
            Err(e) => {
                let msg = format!("{base:#x}+{len}: no same-host GPU copies: {e}");
                if matches!(e, ipc::ExportError::Vmm) {
                    tracing::warn!("{msg}");
                } else {
                    tracing::info!("{msg}");
                }
                r.no_ipc = Some(msg);
            }
        }
        r
    }

    /// Where the peer's `[addr, addr + len)` (described by `desc`, read from its memory handle) is
    /// reachable from this process: `Ok(Some(local address))` when the peer shares this host and its
    /// allocation is (or now gets) opened; `Ok(None)` when IPC does not apply or the handle does
    /// not open (logged once per allocation; the caller uses another means); an error for a range
    /// outside the registered region.
    pub fn resolve(&self, pe: i32, desc: &IpcDesc, addr: u64, len: u64) -> MResult<Option<u64>> {
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
            return Ok(Some(addr));
        }
        let key = (pe, desc.handle);
        let slot = {
            let mut maps = self.maps.lock();
            match maps.get(&key) {
                Some(s) => s.clone(),
                None => {
                    let t = Instant::now();
                    let s = match ipc::Mapping::open(self.ctx.load(Ordering::Relaxed), &desc.handle)
                    {
                        Ok(m) => {
                            self.opened.write().push((pe, *desc, m.base()));
                            tracing::info!(
                                "PE {pe}: GPU memory opened for same-host copies (CUDA IPC): \
                                 allocation {:#x}+{} at {:#x} in {:?}",
                                desc.alloc_base,
                                desc.alloc_len,
                                m.base(),
                                t.elapsed()
                            );
                            Some(Arc::new(m))
                        }
                        Err(e) => {
                            tracing::warn!(
                                "PE {pe}: cannot open its GPU memory through CUDA IPC ({e}); \
                                 transfers to it take the staged path"
                            );
                            None
                        }
                    };
                    maps.insert(key, s.clone());
                    s
                }
            }
        };
        match slot {
            Some(m) => desc.translate(m.base(), addr, len).map(Some),
            None => Ok(None),
        }
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

    /// Runs `f` on endpoint `ep`'s queue (created at first use), counted as one submission of
    /// `len` bytes.
    fn with_queue(
        &self,
        ep: usize,
        len: usize,
        f: impl FnOnce(&mut CopyQueue<CudaEngine>) -> MResult<()>,
    ) -> MResult<()> {
        let q = self
            .queues
            .get(ep)
            .ok_or_else(|| MoverError::Invalid(format!("copy queue {ep} does not exist")))?;
        let mut q = q.lock();
        if q.is_none() {
            *q = Some(CopyQueue::new(CudaEngine::new(
                self.ctx.load(Ordering::Relaxed),
            )?));
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
        // the local range.
        unsafe { self.copy(ep, dst, src, len as usize)? };
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

    /// Closes every opened peer allocation (finalize). Copies must be complete.
    pub fn close_peers(&self) {
        self.opened.write().clear();
        self.maps.lock().clear();
    }

    /// Where PE `pe`'s `[addr, addr + len)` is reachable in this process, from the peer regions
    /// already opened (nothing is opened here): this process's own memory for `pe` = this PE, the
    /// mapped address when an opened region of `pe` holds the whole range, else `None`.
    pub fn lookup(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        if pe >= 0 && pe as usize == self.my_pe.load(Ordering::Relaxed) {
            return Some(addr);
        }
        self.opened
            .read()
            .iter()
            .filter(|(p, d, _)| *p == pe && d.contains(addr, len))
            .find_map(|(_, d, base)| d.translate(*base, addr, len).ok())
    }
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
            handle: [7; HANDLE_BYTES],
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
