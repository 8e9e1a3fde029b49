//! GPU Direct Async, host side: choosing between the provider's hardware queues and the software EFA
//! queue, creating the queue on an endpoint of its own, building the peer table, and publishing the
//! device state ([`state::NvshmemEfaGdaDeviceState`]) kernels read.
//!
//! Who owns a context (`global.rs`): this library's NVSHMEM transport holds its own [`GdaHandle`]:
//! the context is created in it at connect ([`GdaHandle::init`]: the queue gets a dedicated endpoint,
//! own AV, own CQ, on the transport's domain, so libfabric never posts on the send queue the GPU
//! posts to; `auto` picks hardware when the domain serves the `efa gda ops` table and is
//! `efa-direct`, the software queue otherwise) and dropped at finalize. A patched NVSHMEM that owns
//! the endpoint starts hardware GDA with [`init_on_external_ep`]; that context belongs to the
//! registry until [`fini`].
//!
//! The C API reaches the current context through the registry in `global.rs` (the transport
//! registers a weak reference while it lives): [`connect`] (peer table), `set_local_heap`,
//! [`set_remote_heap`] for every PE, and kernels read [`device_state_device_ptr`]. The state's
//! `ready` flag turns 1 once the queue, the local heap, the peer table and every peer's heap are
//! known. Every call is thread-safe; `init_*` and [`fini`] are idempotent. [`Gda`] is the context
//! as a value, for programs (and tests) that want several.
/// cbindgen:ignore
pub mod amo_batch;
pub mod apply;
/// cbindgen:ignore
mod chunks;
/// cbindgen:ignore
pub mod error;
mod global;
/// cbindgen:ignore
pub mod heap;
#[cfg(feature = "test-support")]
/// cbindgen:ignore
pub mod host_poster;
/// cbindgen:ignore
pub mod hw;
/// cbindgen:ignore
pub mod hw_rx;
/// cbindgen:ignore
pub mod mem;
/// cbindgen:ignore
pub mod queue;
/// cbindgen:ignore
pub mod queues;
/// cbindgen:ignore
pub mod softq;
pub mod state;
/// cbindgen:ignore
pub mod wire;

use std::sync::Arc;

use crate::config::{Config, GdaMode};
use crate::cuda::{self, DeviceBuffer};
use crate::fabric::{Caps, CqHandle, Domain, DomainHandle, EndpointHandle, MemKind, MemoryRegion};

pub use self::error::{GdaError, Result};
pub use self::global::{
    add_local_heap_chunk_raw, add_remote_heap_chunk, address, connect, device_state,
    device_state_device_ptr, fini, init_internal, init_on_external_ep, local_heap_key, mode,
    remove_heap_chunk, set_cq, set_local_heap_raw, set_remote_heap, GdaHandle,
};
use self::hw::HwQueue;
use self::mem::CtrlPlacement;
use self::queue::{GdaQueue, Registration};
pub use self::softq::PeerMemory;
use self::softq::{SoftQueue, SoftQueueConfig, Staging};
use self::state::{
    NvshmemEfaGdaDeviceState, NvshmemEfaGdaHeapKey, NvshmemEfaGdaPeer, NvshmemEfaGdaQueue,
    NVSHMEM_EFA_GDA_MODE_HW, NVSHMEM_EFA_GDA_MODE_SOFT, NVSHMEM_EFA_GDA_STATE_VERSION,
};

/// GDA is off (`NVSHMEM_EFA_GDA=off`).
/// cbindgen:ignore
pub const MODE_OFF: u32 = 0;
/// Hardware queues.
/// cbindgen:ignore
pub const MODE_HW: u32 = NVSHMEM_EFA_GDA_MODE_HW;
/// Software queue.
/// cbindgen:ignore
pub const MODE_SOFT: u32 = NVSHMEM_EFA_GDA_MODE_SOFT;

/// Knobs beyond the configuration (tests and tools).
#[derive(Clone, Debug)]
pub struct GdaOptions {
    /// Where the software queue's control block lives.
    pub ctrl: CtrlPlacement,
    /// Override of `NVSHMEM_EFA_SQ_DEPTH`.
    pub sq_depth: Option<u32>,
    /// Override of `NVSHMEM_EFA_MAX_BATCH`.
    pub max_batch: Option<u32>,
}

impl Default for GdaOptions {
    fn default() -> GdaOptions {
        GdaOptions {
            ctrl: CtrlPlacement::Auto,
            sq_depth: None,
            max_batch: None,
        }
    }
}

/// Heap-key tables replaced by larger ones, kept until the context goes (a state loaded earlier may
/// still point at them).
enum Retired {
    Device(#[allow(dead_code)] DeviceBuffer),
    Host(#[allow(dead_code)] Vec<NvshmemEfaGdaHeapKey>),
}

/// Memory the published device state lives in.
enum Published {
    None,
    Device {
        state: DeviceBuffer,
        peers: Option<DeviceBuffer>,
        keys: Option<DeviceBuffer>,
        queues: Option<DeviceBuffer>,
    },
    Host {
        state: Box<NvshmemEfaGdaDeviceState>,
        peers: Vec<NvshmemEfaGdaPeer>,
        keys: Vec<NvshmemEfaGdaHeapKey>,
        queues: Vec<NvshmemEfaGdaQueue>,
    },
}

/// One GDA context: a queue, its peer table and heaps, and the device copy of its state.
///
/// Field order is drop order: the queue (and its consumer thread) goes before the registrations it
/// uses.
pub struct Gda {
    /// The queue; `None` when GDA is off. Every queue call goes through it.
    queue: Option<Box<dyn GdaQueue>>,
    /// The heap's chunks, local and remote, and the table kernels read.
    chunks: chunks::Chunks,
    registrations: Vec<MemoryRegion>,
    extra_lkeys: Vec<u32>,
    domain: Option<Arc<Domain>>,
    /// Identity of the domain (for the idempotence of `init_*`).
    domain_id: usize,
    mode: u32,
    reason: String,
    my_pe: i32,
    n_pes: i32,
    names: Vec<u8>,
    peers: Vec<NvshmemEfaGdaPeer>,
    /// Queues per PE of the queue table (`NVSHMEM_IBGDA_NUM_RC_PER_PE`, fitted at connect).
    queues_per_pe: u32,
    /// [`Gda::set_queues_per_pe`]: queues per PE instead of the environment's.
    queues_per_pe_wanted: Option<u32>,
    /// The queue table (state version 3), built at connect and on every publish.
    queue_table: Vec<NvshmemEfaGdaQueue>,
    published: Published,
    retired: Vec<Retired>,
    use_cuda: bool,
    cuda_ctx: usize,
}

fn soft_config(cfg: &Config, opts: &GdaOptions, domain: &Domain) -> SoftQueueConfig {
    let mut c = SoftQueueConfig::new(
        opts.sq_depth.unwrap_or(cfg.sq_depth),
        opts.max_batch.unwrap_or(cfg.max_batch),
        opts.ctrl,
    );
    c.sq_entry_size = cfg.sq_entry_size;
    c.rx_overwrite = cfg.soft_rx_overwrite;
    c.rx_credits = cfg.soft_rx_credits;
    c.ipc = cfg.soft_ipc;
    c.ipc_bounce = cfg.soft_ipc_bounce;
    c.kernel_stuck = cfg.soft_kernel_stuck;
    c.kernel_host_delay = cfg.soft_kernel_host_delay;
    c.kernel_ahead = cfg.soft_kernel_ahead;
    c.watchdog = cfg.soft_watchdog;
    c.threads = cfg.soft_threads;
    c.copy_overlap = cfg.copy_overlap;
    c.null_consumer = cfg.soft_null;
    c.unordered = cfg.soft_unordered;
    c.staging = Staging::decide(&Caps::of(domain.info()), cfg.gpu_staging);
    c
}

impl Gda {
    fn empty(
        mode: u32,
        reason: String,
        domain: Option<Arc<Domain>>,
        domain_id: usize,
        queue: Option<Box<dyn GdaQueue>>,
    ) -> Gda {
        Gda {
            queue,
            chunks: chunks::Chunks::default(),
            registrations: Vec::new(),
            extra_lkeys: Vec::new(),
            domain,
            domain_id,
            mode,
            reason,
            my_pe: -1,
            n_pes: 0,
            names: Vec::new(),
            peers: Vec::new(),
            queues_per_pe: 1,
            queues_per_pe_wanted: None,
            queue_table: Vec::new(),
            published: Published::None,
            retired: Vec::new(),
            use_cuda: mem::cuda_usable(),
            cuda_ctx: cuda::current_context(),
        }
    }

    /// Creates a GDA context on a dedicated endpoint of `domain`, choosing the mode as `cfg.gda` says.
    pub fn new(domain: &Arc<Domain>, cfg: &Config, opts: &GdaOptions) -> Result<Gda> {
        let provider = format!(
            "{} ({})",
            domain.info().provider_name(),
            domain.info().fabric_name()
        );
        let hw_attempt = || -> Result<HwQueue> {
            if !hw::is_efa_direct(domain) {
                // Still ask, so that the answer (and its error) is what the log shows.
                let _ = hw::open_ops(domain)?;
                return Err(GdaError::unsupported(format!(
                    "{}: provider {provider} is not efa-direct",
                    hw::NO_GDA_OPS
                )));
            }
            let ops = hw::open_ops(domain)?;
            HwQueue::open(domain, ops)
        };
        // A context on this domain in `mode` with `queue`, chosen for `reason`.
        let on_domain = |mode: u32, reason: String, queue: Option<Box<dyn GdaQueue>>| {
            Gda::empty(
                mode,
                reason,
                Some(domain.clone()),
                domain.handle().id(),
                queue,
            )
        };
        let soft = |reason: String| -> Result<Gda> {
            let q = SoftQueue::new(domain, &soft_config(cfg, opts, domain))?;
            tracing::info!("GDA: software EFA queue on provider {provider}: {reason}");
            Ok(on_domain(MODE_SOFT, reason, Some(Box::new(q))))
        };
        let hw = |q: HwQueue, reason: &str| -> Result<Gda> {
            tracing::info!("GDA: hardware EFA queues on provider {provider} ({reason})");
            Ok(on_domain(MODE_HW, reason.into(), Some(Box::new(q))))
        };
        match cfg.gda {
            GdaMode::Off => {
                tracing::info!("GDA: off (NVSHMEM_EFA_GDA=off)");
                Ok(on_domain(MODE_OFF, "NVSHMEM_EFA_GDA=off".into(), None))
            }
            GdaMode::Soft => soft("NVSHMEM_EFA_GDA=soft".into()),
            GdaMode::Hw => match hw_attempt() {
                Ok(q) => hw(q, "NVSHMEM_EFA_GDA=hw"),
                Err(e) => {
                    tracing::error!(
                        "GDA: NVSHMEM_EFA_GDA=hw but hardware queues are not available: {e}"
                    );
                    Err(GdaError {
                        code: e.code,
                        message: format!("NVSHMEM_EFA_GDA=hw: {}", e.message),
                    })
                }
            },
            GdaMode::Auto => match hw_attempt() {
                Ok(q) => hw(q, "GDA ops answer"),
                Err(e) => soft(format!("no hardware queues: {e}")),
            },
        }
    }

    /// Hardware GDA on an endpoint the caller owns (patched NVSHMEM). The transmit CQ comes later
    /// through [`Gda::set_cq`].
    ///
    /// # Safety
    /// `domain` and `ep` must be open libfabric objects (the endpoint enabled, of that domain) that
    /// stay open until this value is dropped; nothing else may post sends on `ep` afterwards.
    pub unsafe fn on_external_ep(
        domain: DomainHandle,
        ep: EndpointHandle,
        cfg: &Config,
    ) -> Result<Gda> {
        match cfg.gda {
            GdaMode::Off => {
                tracing::info!("GDA: off (NVSHMEM_EFA_GDA=off)");
                return Ok(Gda::empty(
                    MODE_OFF,
                    "NVSHMEM_EFA_GDA=off".into(),
                    None,
                    domain.id(),
                    None,
                ));
            }
            GdaMode::Soft => {
                let m = "the software EFA queue needs an endpoint of its own: it cannot run on an endpoint the \
                         caller owns. Load this library as NVSHMEM's transport (NVSHMEM_REMOTE_TRANSPORT=libfabric) \
                         to use it";
                tracing::error!("GDA: NVSHMEM_EFA_GDA=soft with an external endpoint: {m}");
                return Err(GdaError::unsupported(m));
            }
            GdaMode::Hw | GdaMode::Auto => {}
        }
        // SAFETY: forwarded contract.
        let q = unsafe {
            hw::open_ops_foreign(domain).and_then(|ops| HwQueue::on_external_ep(ops, ep))
        };
        match q {
            Ok(q) => {
                tracing::info!("GDA: hardware EFA queue on the caller's endpoint");
                Ok(Gda::empty(
                    MODE_HW,
                    "GDA ops answer".into(),
                    None,
                    domain.id(),
                    Some(Box::new(q)),
                ))
            }
            Err(e) => {
                let m = if cfg.gda == GdaMode::Auto {
                    format!(
                        "{}; the software EFA queue cannot run on the caller's endpoint: load this library as \
                         NVSHMEM's transport (NVSHMEM_REMOTE_TRANSPORT=libfabric) to use it",
                        e.message
                    )
                } else {
                    e.message
                };
                tracing::error!("GDA on the caller's endpoint: {m}");
                Err(GdaError {
                    code: e.code,
                    message: m,
                })
            }
        }
    }

    /// `MODE_OFF`, `MODE_HW` or `MODE_SOFT`.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Why this mode was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The software queue, in software mode.
    pub fn soft_queue(&self) -> Option<&SoftQueue> {
        self.queue.as_deref().and_then(|q| q.as_soft())
    }

    /// Names where peers' heaps are mapped in this process, for the software queue's copy route
    /// (other modes have no use for it: `Ok`).
    pub fn set_peer_memory(&mut self, pm: Option<Arc<dyn PeerMemory>>) -> Result<()> {
        match self.soft_queue() {
            Some(q) => q.set_peer_memory(pm),
            None => Ok(()),
        }
    }

    /// The queue; an error when GDA is off.
    fn q(&self) -> Result<&dyn GdaQueue> {
        self.queue
            .as_deref()
            .ok_or_else(|| GdaError::unsupported("GDA is off (NVSHMEM_EFA_GDA=off)"))
    }

    /// [`Gda::q`], mutable.
    fn q_mut(&mut self) -> Result<&mut dyn GdaQueue> {
        match self.queue.as_deref_mut() {
            Some(q) => Ok(q),
            None => Err(GdaError::unsupported("GDA is off (NVSHMEM_EFA_GDA=off)")),
        }
    }

    /// Raw name of the dedicated endpoint (exchange it with every PE, then [`Gda::connect`]).
    pub fn address(&self) -> Result<Vec<u8>> {
        self.q()?.name()
    }

    /// Builds the peer table from every PE's endpoint name (`names`, `n_pes` names of equal length back
    /// to back) or, for an external endpoint, from the caller's `fi_addrs`.
    pub fn connect(
        &mut self,
        my_pe: i32,
        n_pes: i32,
        names: &[u8],
        fi_addrs: Option<&[u64]>,
    ) -> Result<()> {
        self.q()?;
        if n_pes <= 0 || my_pe < 0 || my_pe >= n_pes {
            return Err(GdaError::invalid(format!("connect: PE {my_pe} of {n_pes}")));
        }
        let n = n_pes as usize;
        if !names.is_empty() && names.len() % n != 0 {
            return Err(GdaError::invalid(format!(
                "connect: {} bytes of names is not {n_pes} equal names",
                names.len()
            )));
        }
        if let Some(a) = fi_addrs {
            if a.len() != n {
                return Err(GdaError::invalid(format!(
                    "connect: {} fi_addr values for {n_pes} PEs",
                    a.len()
                )));
            }
        }
        if self.n_pes > 0 {
            if self.n_pes == n_pes && self.my_pe == my_pe && self.names == names {
                return Ok(());
            }
            return Err(GdaError {
                code: -libc::EALREADY,
                message: format!(
                    "connect: already connected as PE {} of {}",
                    self.my_pe, self.n_pes
                ),
            });
        }
        let wanted = match self.queues_per_pe_wanted {
            Some(n) => n,
            None => queues::queues_per_pe_from_env()?,
        };
        let queues_per_pe = queues::fit_queues_per_pe(n_pes, wanted)?;
        let peers = self.q_mut()?.connect(&queue::Roster {
            my_pe,
            n_pes,
            names,
            fi_addrs,
        })?;
        self.queues_per_pe = queues_per_pe;
        self.my_pe = my_pe;
        self.n_pes = n_pes;
        self.names = names.to_vec();
        self.peers = peers;
        self.build_table()?;
        self.queue_table = self.q()?.queue_table(n_pes, queues_per_pe)?;
        tracing::info!(
            "GDA: connected as PE {my_pe} of {n_pes}; queue table: {} entries ({n_pes} PEs x \
             {queues_per_pe} queues per PE from {}) over {} distinct queue(s)",
            self.queue_table.len(),
            queues::NUM_RC_PER_PE_VAR,
            queues::distinct_count(&self.queue_table)
        );
        self.publish()
    }

    /// Registers `[base, base+size)` of memory of `kind` on the queue's endpoint (kept until this
    /// value is dropped), or leaves it to the software queue's staging.
    fn register(&mut self, base: u64, size: u64, kind: MemKind) -> Result<Registration> {
        let domain = self.domain.clone().ok_or_else(|| {
            GdaError::invalid(
                "the caller owns the domain: pass the heap's registration (struct fid_mr)",
            )
        })?;
        let q = self.q()?;
        if q.stages(kind) {
            tracing::info!(
                "GDA: GPU memory {base:#x}+{size} is staged by the software queue: not registered with the provider"
            );
            return Ok(Registration {
                key: 0,
                desc: std::ptr::null_mut(),
                handle: None,
                kind,
            });
        }
        // SAFETY: the caller of set_local_heap/register_local guarantees the memory stays allocated
        // until fini; the endpoint belongs to the domain.
        let mr = unsafe {
            MemoryRegion::register_reserved(
                &domain,
                base as *const u8,
                size as usize,
                kind,
                q.endpoint(),
            )?
        };
        let r = Registration {
            key: mr.key(),
            desc: mr.desc(),
            handle: Some(mr.handle()),
            kind,
        };
        self.registrations.push(mr);
        Ok(r)
    }

    /// Registers another local buffer for WQEs and returns its lkey (kept until the value is dropped).
    ///
    /// # Safety
    /// The memory must stay allocated until this value is dropped.
    pub unsafe fn register_local(&mut self, base: u64, size: u64) -> Result<u32> {
        self.q()?;
        let reg = self.register(base, size, mem::mem_kind(base))?;
        // SAFETY: our registration of this range lives as long as the queue.
        let lkey = unsafe { self.q()?.add_local(base, size, &reg)? };
        self.extra_lkeys.push(lkey);
        Ok(lkey)
    }

    /// Names the transmit CQ of an external endpoint (hardware mode on the caller's endpoint).
    ///
    /// # Safety
    /// As for [`HwQueue::set_cq`].
    pub unsafe fn set_cq(&mut self, cq: CqHandle) -> Result<()> {
        let q = self.queue.as_deref_mut().ok_or_else(|| {
            GdaError::invalid("set_cq: only for hardware GDA on the caller's endpoint")
        })?;
        // SAFETY: forwarded contract.
        unsafe { q.set_cq(cq)? };
        self.publish()
    }

    fn queue_desc(&self) -> Option<NvshmemEfaGdaQueue> {
        self.queue.as_deref().map(|q| q.queue_desc())
    }

    /// The peer table (host copy): each PE's queue address and its heap chunk at offset 0
    /// (`heap_size`: the highest end of its chunks).
    pub fn peers(&self) -> Vec<NvshmemEfaGdaPeer> {
        self.peers
            .iter()
            .enumerate()
            .map(|(pe, p)| {
                let c = self.chunks.remote0(pe as i32);
                NvshmemEfaGdaPeer {
                    heap_base: c.map_or(0, |c| c.addr),
                    heap_size: self.chunks.remote_extent(pe as i32),
                    heap_rkey: c.and_then(|c| c.rkey).unwrap_or(0),
                    ..*p
                }
            })
            .collect()
    }

    fn peers_ptr(&self) -> u64 {
        match &self.published {
            Published::Device { peers: Some(p), .. } => p.ptr(),
            Published::Host { peers, .. } if !peers.is_empty() => peers.as_ptr() as u64,
            _ => 0,
        }
    }

    /// Builds the queue table for `n` queues per PE instead of what `NVSHMEM_IBGDA_NUM_RC_PER_PE`
    /// says (programs and tests that run several contexts in one process). Before `connect` only.
    pub fn set_queues_per_pe(&mut self, n: u32) -> Result<()> {
        if self.n_pes > 0 {
            return Err(GdaError::invalid(
                "set_queues_per_pe: the queue table is built at connect, which happened",
            ));
        }
        if n == 0 || n > state::NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE {
            return Err(GdaError::invalid(format!(
                "set_queues_per_pe: {n} queues per PE (1 to {})",
                state::NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE
            )));
        }
        self.queues_per_pe_wanted = Some(n);
        Ok(())
    }

    fn queues_ptr(&self) -> u64 {
        match &self.published {
            Published::Device {
                queues: Some(q), ..
            } => q.ptr(),
            Published::Host { queues, .. } if !queues.is_empty() => queues.as_ptr() as u64,
            _ => 0,
        }
    }

    /// The queue table (host copy, state version 3): entry `dst_pe * queues_per_pe + qp_id %
    /// queues_per_pe`; empty until connected.
    pub fn queue_table(&self) -> &[NvshmemEfaGdaQueue] {
        &self.queue_table
    }

    fn keys_ptr(&self) -> u64 {
        match &self.published {
            Published::Device { keys: Some(k), .. } => k.ptr(),
            Published::Host { keys, .. } if !keys.is_empty() => keys.as_ptr() as u64,
            _ => 0,
        }
    }

    /// The heap-key table (host copy) with its stride, once connected.
    pub fn heap_table(&self) -> Option<&heap::HeapTable> {
        self.chunks.table.as_ref()
    }

    /// The device state (host copy; the addresses inside are the ones kernels use). `ready` once
    /// the CQ is known and this PE and every PE have at least one heap chunk.
    pub fn device_state(&self) -> Option<NvshmemEfaGdaDeviceState> {
        let queue = self.queue_desc()?;
        let c = &self.chunks;
        let local0 = c.local.get(&0);
        let remote_complete = self.n_pes > 0 && (0..self.n_pes).all(|pe| c.remote_extent(pe) > 0);
        let cq_known = queue.cq != 0;
        let queues = self.queues_ptr();
        let ready = !c.local.is_empty() && remote_complete && cq_known && queues != 0;
        let table = c.table.as_ref();
        Some(NvshmemEfaGdaDeviceState {
            version: NVSHMEM_EFA_GDA_STATE_VERSION,
            ready: u32::from(ready),
            my_pe: self.my_pe,
            n_pes: self.n_pes,
            queue,
            heap_base: c.local_base(),
            heap_size: c.local_extent(),
            heap_lkey: local0.map_or(0, |h| h.lkey),
            reserved: 0,
            peers: self.peers_ptr(),
            heap_keys: self.keys_ptr(),
            log2_granularity: table.map_or(0, |t| t.log2()),
            key_stride: table.map_or(0, |t| t.stride() as u32),
            n_granules: table.map_or(0, |t| t.n_granules() as u32),
            reserved2: 0,
            queues,
            n_queues: if queues != 0 {
                self.queue_table.len() as u32
            } else {
                0
            },
            queues_per_pe: self.queues_per_pe,
        })
    }

    /// Address of the device-resident copy of the state (host memory when CUDA is not in use), or 0.
    pub fn device_state_ptr(&self) -> u64 {
        match &self.published {
            Published::Device { state, .. } => state.ptr(),
            Published::Host { state, .. } => &**state as *const NvshmemEfaGdaDeviceState as u64,
            Published::None => 0,
        }
    }

    /// Rewrites the device copies of the peer table, the heap-key table and the state. A key table
    /// that grew goes to a new buffer (the old one is kept until the context goes: a state loaded
    /// earlier may still point at it); entries are written before the state that names them.
    fn publish(&mut self) -> Result<()> {
        if self.queue.is_none() {
            return Ok(());
        }
        let peers = self.peers();
        if self.n_pes > 0 {
            // The queues' descriptions change (a hardware CQ named late): rebuild the table.
            self.queue_table = self.q()?.queue_table(self.n_pes, self.queues_per_pe)?;
        }
        let table = self.queue_table.clone();
        let empty: &[NvshmemEfaGdaHeapKey] = &[];
        let entries = self
            .chunks
            .table
            .as_ref()
            .map_or(empty, |t| t.entries())
            .to_vec();
        if self.use_cuda {
            if cuda::current_context() == 0 {
                cuda::set_current_context(self.cuda_ctx)?;
            }
            let bytes = std::mem::size_of_val(peers.as_slice());
            let kbytes = std::mem::size_of_val(entries.as_slice());
            let qbytes = std::mem::size_of_val(table.as_slice());
            let (state_buf, old_peers, old_keys, old_queues) =
                match std::mem::replace(&mut self.published, Published::None) {
                    Published::Device {
                        state,
                        peers,
                        keys,
                        queues,
                    } => (state, peers, keys, queues),
                    _ => (
                        DeviceBuffer::new(std::mem::size_of::<NvshmemEfaGdaDeviceState>())?,
                        None,
                        None,
                        None,
                    ),
                };
            let queues_buf = match old_queues {
                Some(q) if q.len() == qbytes => Some(q),
                _ if qbytes > 0 => Some(DeviceBuffer::new(qbytes)?),
                _ => None,
            };
            if let Some(q) = &queues_buf {
                q.upload(&table)?;
            }
            let peers_buf = match old_peers {
                Some(p) if p.len() == bytes => Some(p),
                _ if bytes > 0 => Some(DeviceBuffer::new(bytes)?),
                _ => None,
            };
            let keys_buf = match old_keys {
                Some(k) if k.len() == kbytes => Some(k),
                old => {
                    if let Some(k) = old {
                        self.retired.push(Retired::Device(k));
                    }
                    (kbytes > 0)
                        .then(|| DeviceBuffer::new(kbytes))
                        .transpose()?
                }
            };
            if let Some(p) = &peers_buf {
                p.upload(&peers)?;
            }
            if let Some(k) = &keys_buf {
                k.upload(&entries)?;
            }
            self.published = Published::Device {
                state: state_buf,
                peers: peers_buf,
                keys: keys_buf,
                queues: queues_buf,
            };
            let st = self.device_state().expect("queue exists");
            if let Published::Device { state, .. } = &self.published {
                state.upload(std::slice::from_ref(&st))?;
            }
        } else {
            let (state, keys) = match std::mem::replace(&mut self.published, Published::None) {
                Published::Host { state, keys, .. } => (state, keys),
                _ => (
                    Box::new(self.device_state().expect("queue exists")),
                    Vec::new(),
                ),
            };
            let keys = if keys.len() == entries.len() {
                let mut k = keys;
                k.copy_from_slice(&entries);
                k
            } else {
                if !keys.is_empty() {
                    self.retired.push(Retired::Host(keys));
                }
                entries
            };
            self.published = Published::Host {
                state,
                peers,
                keys,
                queues: table,
            };
            let st = self.device_state().expect("queue exists");
            if let Published::Host { state, .. } = &mut self.published {
                **state = st;
            }
        }
        Ok(())
    }

    fn same_domain(&self, domain: DomainHandle) -> bool {
        self.domain_id == domain.id()
    }
}

impl Drop for Gda {
    fn drop(&mut self) {
        if let Some(q) = &self.queue {
            q.stop();
        }
        if self.mode != MODE_OFF {
            tracing::info!("GDA: shut down (mode {})", self.mode);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uninitialised_calls_fail_cleanly() {
        // Another test in this binary never initialises the global context.
        assert!(address().is_err() || mode().is_some());
        assert_eq!(
            GdaError::not_initialised().message,
            "GDA is not initialised"
        );
    }
}
