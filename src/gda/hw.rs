//! The hardware queue: the provider's GPU Direct Async ops (the `efa gda ops` table, libfabric
//! >= 2.3, `efa-direct` fabric; the calls are in `fabric::efa_gda`), the queries of an endpoint's send queue and of its
//! completion queues, peer address handles, lkeys, and the mapping of the send ring and its doorbell
//! for the GPU.
//!
//! What kernels get in hardware mode:
//! * `sq`: the endpoint's send ring, registered with `cuMemHostRegister(IOMEMORY | DEVICEMAP)`;
//! * `sq_doorbell`: the MMIO doorbell register, registered the same way (the page that holds it);
//! * `cq`: the transmit CQ ring. On a queue this library opens itself it is opened with
//!   `cq_open_ext` on GPU memory exported as a dmabuf, so kernels poll device memory; where that is
//!   refused, a plain CQ's host ring is registered read-only for the GPU. For an endpoint opened by
//!   the caller (the patched-NVSHMEM path) the CQ cannot be found from the endpoint: the caller names
//!   it with [`HwQueue::set_cq`] (`nvshmemt_efa_gda_set_cq`) and must not poll it itself afterwards;
//! * `rx_cq`: the RX ring of the receive path ([`super::hw_rx`]) on a queue this library opens: the
//!   endpoint's receive CQ is a host CQ, read by a host thread that applies AMO messages to the
//!   local heap and writes the receive completions kernels must see (RDMA writes with immediate,
//!   AMOs with immediate, refused AMOs) into a GPU-mapped ring in the extended receive format. The
//!   endpoint is opened with `FI_RX_CQ_DATA`, so every write with immediate consumes a posted
//!   receive and the credit arithmetic of [`super::hw_rx`] bounds the receive CQ. On the caller's
//!   endpoint there is no receive path (`rx_cq` 0): the device AMO calls answer
//!   `NVSHMEM_EFA_GDA_ERR_UNSUPPORTED` there;
//! * `ctrl` and `slot_status` in device memory.
//!
//! Nothing here can run without an EFA device; what can run anywhere is the error path (other
//! providers answer `-FI_ENOSYS` or `-FI_EOPNOTSUPP` to `fi_open_ops`, mapped to [`NO_GDA_OPS`]).
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys as cu;

use crate::cuda::{self, DeviceBuffer, HostMapping, HostRegistration, PtrKind};
use crate::efa::wqe::WQE_SIZE;
use crate::fabric::efa_gda::is_no_ops_code;
pub use crate::fabric::efa_gda::GdaOps;
use crate::fabric::efa_gda_abi::{FiEfaCqAttr, FiEfaWqAttr};
use crate::fabric::{
    flags, AddressVector, CompletionQueue, CqHandle, Domain, DomainHandle, Endpoint,
    EndpointHandle, Error as FabricError, FiAddr, MrHandle,
};

use super::error::{GdaError, Result};
use super::hw_rx::{HwRx, RxConfig, RxCredits, WriteImmRx};
use super::mem::{self, CtrlMem, CtrlPlacement};
use super::state::{NvshmemEfaGdaQueue, NvshmemEfaGdaQueueCtrl, NVSHMEM_EFA_GDA_MODE_HW};

/// The error text for a domain without GDA ops.
pub const NO_GDA_OPS: &str =
    "provider has no GDA ops (needs libfabric >= 2.3 with the efa-direct fabric)";

/// Turns an `fi_open_ops` failure into the clear error.
pub fn open_ops_error(e: FabricError) -> GdaError {
    if is_no_ops_code(e.code) {
        GdaError {
            code: -libc::EOPNOTSUPP,
            message: format!("{NO_GDA_OPS}: {e}"),
        }
    } else {
        GdaError::from(e)
    }
}

/// Opens the GDA ops of `domain`; a provider without them gets the clear error ([`NO_GDA_OPS`]).
pub fn open_ops(domain: &Arc<Domain>) -> Result<GdaOps> {
    GdaOps::open(domain).map_err(open_ops_error)
}

/// [`open_ops`] on a domain the caller owns.
///
/// # Safety
/// `domain` must be an open libfabric domain that outlives the returned value.
pub unsafe fn open_ops_foreign(domain: DomainHandle) -> Result<GdaOps> {
    // SAFETY: forwarded contract.
    unsafe { GdaOps::open_foreign(domain) }.map_err(open_ops_error)
}

/// The error for a mapping the CUDA driver refused.
pub fn mapping_error(what: &str, e: cuda::CudaError) -> GdaError {
    GdaError {
        code: -libc::EOPNOTSUPP,
        message: format!(
            "cannot map the EFA {what} for the GPU: {e}. cuMemHostRegister of device memory (MMIO) needs the \
             NVIDIA driver option PeerMappingOverride=1 (for example `options nvidia \
             NVreg_RegistryDwords=\"PeerMappingOverride=1;\"` in /etc/modprobe.d, then reload the driver)"
        ),
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// The page-aligned span `[base, base+len)` covering `[addr, addr+len)`.
pub fn page_span(addr: u64, len: u64, page: u64) -> (u64, u64) {
    let base = addr & !(page - 1);
    let end = (addr + len.max(1) + page - 1) & !(page - 1);
    (base, end - base)
}

/// A host range registered for the GPU, and the device address of the range's first byte.
struct Mapped {
    _reg: HostRegistration,
    device: u64,
}

fn map_for_gpu(what: &str, addr: *mut u8, len: u64, kind: HostMapping) -> Result<Mapped> {
    if addr.is_null() || len == 0 {
        return Err(GdaError::invalid(format!(
            "the provider reported no {what}"
        )));
    }
    let (base, span) = page_span(addr as u64, len, page_size());
    // SAFETY: the range belongs to the provider's queue, which stays open while the mapping lives
    // (the queue value drops the mapping before it closes the endpoint).
    let reg = unsafe { HostRegistration::new(base as *mut c_void, span as usize, kind) }
        .map_err(|e| mapping_error(what, e))?;
    let device = reg.device() + (addr as u64 - base);
    Ok(Mapped { _reg: reg, device })
}

/// [`map_for_gpu`] for a ring of `entries` entries of `entry_size` bytes.
fn map_ring(
    what: &str,
    buffer: *mut u8,
    entries: u32,
    entry_size: u32,
    kind: HostMapping,
) -> Result<Mapped> {
    let len = u64::from(entries) * u64::from(entry_size);
    map_for_gpu(what, buffer, len, kind)
}

/// Maps a send queue's ring and doorbell (device registers) for the GPU.
fn map_send_queue(sq: &FiEfaWqAttr) -> Result<(Mapped, Mapped)> {
    let ring = map_ring(
        "send queue ring",
        sq.buffer,
        sq.num_entries,
        sq.entry_size,
        HostMapping::Io,
    )?;
    let doorbell = map_for_gpu(
        "send queue doorbell",
        sq.doorbell as *mut u8,
        4,
        HostMapping::Io,
    )?;
    Ok((ring, doorbell))
}

/// The GPU's view of one CQ ring.
enum CqRing {
    /// The ring is GPU memory we own (cq_open_ext on a dmabuf).
    Device(DeviceBuffer),
    /// The ring is host memory of the provider, mapped for the GPU.
    Host(Mapped),
    /// The ring is GPU memory the caller owns.
    Foreign,
}

/// A CQ ring published to the GPU, with the CQ when this library opened it. Dropping it unmaps a
/// host ring before the CQ closes, and closes the CQ before its GPU ring is freed.
struct CqView {
    cq: Option<Arc<CompletionQueue>>,
    ring: Option<CqRing>,
    device: u64,
    attr: FiEfaCqAttr,
}

impl Drop for CqView {
    fn drop(&mut self) {
        match self.ring.take() {
            Some(CqRing::Device(b)) => {
                self.cq.take();
                drop(b);
            }
            Some(CqRing::Host(m)) => {
                drop(m);
                self.cq.take();
            }
            _ => {
                self.cq.take();
            }
        }
    }
}

/// Opens a CQ for the GPU: `cq_open_ext` on GPU memory (dmabuf), else a plain CQ mapped with DEVICEMAP.
fn open_gpu_cq(ops: &GdaOps, domain: &Arc<Domain>, entries: usize) -> Result<CqView> {
    match open_dmabuf_cq(ops, domain, entries) {
        Ok(x) => return Ok(x),
        Err(e) => tracing::info!(
            "GDA: CQ on GPU memory not available ({e}); using a host CQ mapped for the GPU"
        ),
    }
    let cq = CompletionQueue::open(domain, entries)?;
    // SAFETY: open CQ of this domain.
    let a = unsafe { ops.query_cq(cq.handle())? };
    let mut view = cq_view(a)?;
    view.cq = Some(cq);
    Ok(view)
}

fn open_dmabuf_cq(ops: &GdaOps, domain: &Arc<Domain>, entries: usize) -> Result<CqView> {
    let page = page_size();
    let len = ((entries as u64 * 32 + 4096) + page - 1) & !(page - 1);
    let buf = DeviceBuffer::new(len as usize)
        .map_err(|e| GdaError::nomem(format!("GDA CQ ring: {e}")))?;
    let (base, span) = page_span(buf.ptr(), len, page);
    let mut fd: i32 = -1;
    // SAFETY: exports a range of our own device allocation; fd receives a new file descriptor.
    let r = unsafe {
        cu::cuMemGetHandleForAddressRange(
            &mut fd as *mut i32 as *mut c_void,
            base,
            span as usize,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if r != cu::CUresult::CUDA_SUCCESS || fd < 0 {
        return Err(GdaError::unsupported(format!(
            "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed ({r:?})"
        )));
    }
    // SAFETY: the device buffer goes into the returned view, which frees it only after the CQ closes.
    let cq = unsafe { ops.cq_open_dmabuf(domain, entries, len, buf.ptr() - base, fd) };
    // SAFETY: fd is ours; the provider holds its own reference once the CQ is open.
    unsafe { libc::close(fd) };
    let cq = cq?;
    // SAFETY: open CQ.
    let a = match unsafe { ops.query_cq(cq.handle()) } {
        Ok(a) => a,
        Err(e) => {
            drop(cq);
            return Err(e.into());
        }
    };
    if a.num_entries == 0 || a.entry_size == 0 {
        drop(cq);
        return Err(GdaError::invalid(format!(
            "GDA query_cq: empty ring ({} entries of {} bytes)",
            a.num_entries, a.entry_size
        )));
    }
    // The ring is our allocation: the provider knows it only as the dmabuf (no CPU address was
    // given, so query_cq reports none), kernels get our own device pointer.
    let device = buf.ptr();
    Ok(CqView {
        cq: Some(cq),
        ring: Some(CqRing::Device(buf)),
        device,
        attr: a,
    })
}

/// The GPU's view of a CQ ring the provider reports.
fn cq_view(a: FiEfaCqAttr) -> Result<CqView> {
    if a.buffer.is_null() || a.num_entries == 0 || a.entry_size == 0 {
        return Err(GdaError::invalid(format!(
            "GDA query_cq: empty ring (buffer {:p}, {} entries of {} bytes)",
            a.buffer, a.num_entries, a.entry_size
        )));
    }
    if let PtrKind::Device { .. } = cuda::pointer_kind(a.buffer as *const c_void) {
        return Ok(CqView {
            cq: None,
            ring: Some(CqRing::Foreign),
            device: a.buffer as u64,
            attr: a,
        });
    }
    // rdma-core maps a provider-allocated CQ ring PROT_READ (efa_create_cq): register it
    // READ_ONLY, which the driver requires for read-only CPU mappings where the GPU does not use
    // the host page tables (aws-ofi-nccl found a DEVICEMAP-only registration of it failing on
    // p5en). The GPU only reads completion rings.
    let m = map_ring(
        "completion ring",
        a.buffer,
        a.num_entries,
        a.entry_size,
        HostMapping::ReadOnly,
    )?;
    let device = m.device;
    Ok(CqView {
        cq: None,
        ring: Some(CqRing::Host(m)),
        device,
        attr: a,
    })
}

/// Endpoint objects this library opened itself (dedicated GDA endpoint); the transmit CQ lives in
/// the queue's CQ view and closes after the endpoint. The receive path holds the endpoint too.
struct Owned {
    ep: Arc<Endpoint>,
}

/// A hardware EFA queue published to the GPU. Dropping it unmaps the provider's rings, closes the
/// endpoint and CQs, and only then frees GPU memory the CQs used.
pub struct HwQueue {
    /// GDA QPs the device admits ([`super::queues::qp_limit`]); `None`: not reported.
    qp_limit: Option<usize>,
    /// The queue table's layout was logged.
    plan_logged: std::sync::atomic::AtomicBool,
    sq_map: Option<Mapped>,
    db_map: Option<Mapped>,
    sq_dev: u64,
    db_dev: u64,
    tx_cq: Option<CqView>,
    rx: Option<HwRx>,
    ctrl: Arc<CtrlMem>,
    owned: Option<Owned>,
    ops: GdaOps,
    ep: EndpointHandle,
    sq: FiEfaWqAttr,
    rq: FiEfaWqAttr,
    qpn: u16,
}

// SAFETY: the raw handles are libfabric objects of an FI_THREAD_SAFE domain and immutable mappings.
unsafe impl Send for HwQueue {}
// SAFETY: as above.
unsafe impl Sync for HwQueue {}

impl HwQueue {
    /// Opens a dedicated endpoint on `domain` (own AV, a transmit CQ on GPU memory, a host receive
    /// CQ), queries its rings, maps them for the GPU and starts the receive path.
    pub fn open(domain: &Arc<Domain>, ops: GdaOps) -> Result<HwQueue> {
        if !mem::cuda_usable() {
            return Err(GdaError::unsupported(
                "hardware GDA needs the CUDA driver and a current context to map the queues",
            ));
        }
        let info = domain.info();
        let (ep_cnt, tx_ctx, per_ep) = info.endpoint_limits();
        let qp_limit = super::queues::qp_limit(ep_cnt, tx_ctx, per_ep);
        tracing::info!(
            "hardware GDA: the domain admits {ep_cnt} endpoints, {tx_ctx} transmit contexts ({per_ep} \
             per endpoint); the library opens one GDA queue (one QP) per context, which the queue \
             table's (dst_pe, qp_id) entries share (docs/gda-queues.md)"
        );
        if qp_limit.is_none() {
            tracing::warn!(
                "hardware GDA: the provider reports no endpoint limit (ep_cnt 0): one QP serves \
                 every queue"
            );
        }
        let rx_cfg = RxConfig::default();
        let tx_view = open_gpu_cq(&ops, domain, info.tx_size().max(64))?;
        let tx_cq = tx_view.cq.clone().expect("CQ opened here");
        // The receive CQ is the host's (hw_rx's module doc: why efa-direct allows it).
        let rx_cq = CompletionQueue::open(domain, rx_cfg.receives as usize)?;
        let av = AddressVector::open(domain, 64)?;
        // FI_RX_CQ_DATA: efa-direct creates the QP without unsolicited write-receive
        // (prov/efa/src/efa_base_ep.c:409-413 at v2.6.0), so writes with immediate consume receives.
        let owned = Owned {
            ep: Arc::new(Endpoint::open_split_mode(
                domain,
                &av,
                &tx_cq,
                &rx_cq,
                flags::RX_CQ_DATA,
            )?),
        };
        let ep = owned.ep.handle();
        // SAFETY: enabled endpoint of the ops' domain.
        let mut q = unsafe { Self::map_endpoint(ops, ep)? };
        q.qp_limit = qp_limit;
        q.tx_cq = Some(tx_view);
        q.check_cqs()?;
        // SAFETY: the receive CQ is open and belongs to the ops' domain.
        let rx_attr = unsafe { q.ops.query_cq(rx_cq.handle())? };
        let receives = rx_cfg.receives.min(q.rq.num_entries);
        let credits = RxCredits {
            receives,
            rq_entries: q.rq.num_entries,
            cq_entries: rx_attr.num_entries,
            write_imm: WriteImmRx::ConsumesReceive,
        };
        q.rx = Some(HwRx::start(
            owned.ep.clone(),
            credits,
            &RxConfig { receives, ..rx_cfg },
            q.ctrl.clone(),
            true,
        )?);
        q.owned = Some(owned);
        Ok(q)
    }

    /// Publishes the send queue of an endpoint the caller owns. The CQ comes later, through
    /// [`HwQueue::set_cq`].
    ///
    /// # Safety
    /// `ep` must be an open, enabled endpoint of the ops' domain that stays open until this value is
    /// dropped, and on which nothing else posts sends from now on.
    pub unsafe fn on_external_ep(ops: GdaOps, ep: EndpointHandle) -> Result<HwQueue> {
        if !mem::cuda_usable() {
            return Err(GdaError::unsupported(
                "hardware GDA needs the CUDA driver and a current context to map the queues",
            ));
        }
        tracing::info!(
            "GDA hardware queue on the caller's endpoint: no receive path here, so the device AMO calls \
             (amo_nonfetch_add, amo_set, IBGDA rma_p) return NVSHMEM_EFA_GDA_ERR_UNSUPPORTED: EFA has no \
             RDMA atomics and nothing would receive or apply AMO messages"
        );
        // SAFETY: forwarded contract.
        unsafe { Self::map_endpoint(ops, ep) }
    }

    /// # Safety
    /// As for `on_external_ep`.
    unsafe fn map_endpoint(ops: GdaOps, ep: EndpointHandle) -> Result<HwQueue> {
        // SAFETY: forwarded contract.
        let (sq, rq) = unsafe { ops.query_qp_wqs(ep)? };
        tracing::info!(
            "GDA send queue: {} entries of {} bytes at {:p}, doorbell {:p}, max batch {}, caps {:#x}; receive \
             queue: {} entries of {} bytes",
            sq.num_entries,
            sq.entry_size,
            sq.buffer,
            sq.doorbell,
            sq.max_batch,
            sq.caps,
            rq.num_entries,
            rq.entry_size
        );
        // The queue's format against what the library encodes (crate::efa::sq): unknown caps bits
        // or entry sizes are refused here, before a WQE is written.
        let (major, minor) = crate::fabric::library_version();
        let format = crate::efa::sq::SqFormat::from_query(
            sq.entry_size,
            sq.num_entries,
            sq.caps,
            (major << 16) | minor,
        )
        .map_err(|e| {
            tracing::error!("GDA hardware queue refused: {e}");
            GdaError::unsupported(format!("GDA send queue: {e}"))
        })?;
        if format.req_id_64 {
            tracing::info!(
                "GDA: the send queue carries 64-bit request ids; kernels write bits 16-63 as zero"
            );
        }
        let (sq_map, db_map) = map_send_queue(&sq)?;
        let ctrl = Arc::new(CtrlMem::new(
            std::mem::size_of::<NvshmemEfaGdaQueueCtrl>() + 4 * sq.num_entries as usize,
            CtrlPlacement::Auto,
        )?);
        Ok(HwQueue {
            // Read by `open` (the caller's endpoint: its domain's limits are not known here).
            qp_limit: None,
            plan_logged: Default::default(),
            sq_dev: sq_map.device,
            db_dev: db_map.device,
            sq_map: Some(sq_map),
            db_map: Some(db_map),
            tx_cq: None,
            rx: None,
            ctrl,
            owned: None,
            ops,
            ep,
            sq,
            rq,
            qpn: 0,
        })
    }

    fn check_cqs(&self) -> Result<()> {
        if let Some(c) = &self.tx_cq {
            // Entry sizes the kernels do not read are refused (crate::efa::sq::check_cq).
            crate::efa::sq::check_cq(c.attr.entry_size, c.attr.num_entries).map_err(|e| {
                tracing::error!("GDA hardware queue refused: {e}");
                GdaError::unsupported(format!("GDA completion ring: {e}"))
            })?;
            if c.attr.num_entries < self.sq.num_entries || !c.attr.num_entries.is_power_of_two() {
                return Err(GdaError::unsupported(format!(
                    "GDA completion ring of {} entries for a send queue of {}: needs a power of two at least as large",
                    c.attr.num_entries, self.sq.num_entries
                )));
            }
        }
        Ok(())
    }

    /// Names the transmit CQ bound to an external endpoint (queried and mapped for the GPU).
    ///
    /// # Safety
    /// `cq` must be the open CQ bound to the endpoint for transmit completions, staying open while
    /// this value lives; the caller must not read completions from it afterwards.
    pub unsafe fn set_cq(&mut self, cq: CqHandle) -> Result<()> {
        // SAFETY: forwarded contract.
        let a = unsafe { self.ops.query_cq(cq)? };
        self.tx_cq = Some(cq_view(a)?);
        self.check_cqs()
    }

    /// Whether a transmit CQ is known.
    pub fn has_cq(&self) -> bool {
        self.tx_cq.is_some()
    }

    /// Raw name of the dedicated endpoint (none for an external endpoint).
    pub fn name(&self) -> Result<Vec<u8>> {
        let o = self
            .owned
            .as_ref()
            .ok_or_else(|| GdaError::invalid("the endpoint belongs to the caller"))?;
        Ok(o.ep.name()?)
    }

    /// Inserts `count` names into the dedicated endpoint's AV.
    pub fn insert_names(&self, names: &[u8], count: usize) -> Result<Vec<FiAddr>> {
        let o = self.owned.as_ref().ok_or_else(|| {
            GdaError::invalid("the endpoint belongs to the caller: pass its fi_addr values")
        })?;
        if count == 0 || names.len() % count != 0 {
            return Err(GdaError::invalid(format!(
                "{} bytes of names for {count} PEs",
                names.len()
            )));
        }
        Ok(o.ep.av().insert(names, count)?)
    }

    /// Address handle, QP number and qkey of every address, and this PE's QP number (`me`).
    pub fn query_peers(&mut self, fi_addrs: &[FiAddr], me: usize) -> Result<Vec<(u16, u16, u32)>> {
        let mut out = Vec::with_capacity(fi_addrs.len());
        for &a in fi_addrs {
            // SAFETY: the endpoint is open; the addresses come from its AV.
            out.push(unsafe { self.ops.query_addr(self.ep, a)? });
        }
        if let Some(m) = out.get(me) {
            self.qpn = m.1;
        }
        if let Some(rx) = &self.rx {
            let peers: Vec<(FiAddr, u16, u16)> = fi_addrs
                .iter()
                .zip(&out)
                .map(|(&a, &(ahn, qpn, _))| (a, ahn, qpn))
                .collect();
            rx.set_peers(self.qpn, &peers);
        }
        Ok(out)
    }

    /// lkey of a registration.
    ///
    /// # Safety
    /// `mr` must be an open registration of the queue's domain.
    pub unsafe fn lkey(&self, mr: MrHandle) -> Result<u32> {
        // SAFETY: forwarded contract.
        Ok(unsafe { self.ops.get_mr_lkey(mr)? })
    }

    /// The dedicated endpoint this queue opened (to bind registrations); `None` on the caller's.
    pub fn endpoint(&self) -> Option<&Endpoint> {
        self.owned.as_ref().map(|o| &*o.ep)
    }

    /// The receive path (on a queue this library opened).
    pub fn receive_path(&self) -> Option<&HwRx> {
        self.rx.as_ref()
    }

    /// Stops the receive path's thread (before the heap it applies AMOs to goes).
    pub fn stop(&self) {
        if let Some(rx) = &self.rx {
            rx.stop();
        }
    }

    /// GDA QPs the device admits, as the provider reports them.
    pub fn qp_limit(&self) -> Option<usize> {
        self.qp_limit
    }

    /// Logs (once) how the queue table's `n` entries map onto this queue's QPs.
    pub fn log_plan(&self, n: usize) {
        if !self
            .plan_logged
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let (_, line) = super::queues::hw_plan(n, self.qp_limit, 1);
            tracing::info!("{line}");
        }
    }

    /// The queue as kernels see it (`cq` 0 until a CQ is known).
    pub fn queue_desc(&self) -> NvshmemEfaGdaQueue {
        let (cq, cq_entries, cq_entry_size) = self.tx_cq.as_ref().map_or((0, 0, 0), |c| {
            (c.device, c.attr.num_entries, c.attr.entry_size)
        });
        let (rx_cq, rx_entries) = self
            .rx
            .as_ref()
            .map_or((0, 0), |r| (r.ring_device(), r.ring_entries()));
        NvshmemEfaGdaQueue {
            sq: self.sq_dev,
            sq_doorbell: self.db_dev,
            cq,
            rx_cq,
            ctrl: self.ctrl.device(),
            slot_status: self.ctrl.device() + std::mem::size_of::<NvshmemEfaGdaQueueCtrl>() as u64,
            host_ctrl: 0,
            sq_entries: self.sq.num_entries,
            sq_entry_size: self.sq.entry_size,
            cq_entries,
            cq_entry_size,
            rx_entries,
            max_batch: self.sq.max_batch.max(1),
            qpn: self.qpn,
            reserved: 0,
            mode: NVSHMEM_EFA_GDA_MODE_HW,
        }
    }
}

impl Drop for HwQueue {
    fn drop(&mut self) {
        // Mappings of provider memory go while that memory is still mapped.
        self.sq_map.take();
        self.db_map.take();
        // The receive thread stops; the endpoint closes when its last holder goes (the receive
        // path closes it before freeing the buffers its receives point at), then the CQs bound to
        // it; each CQ view orders its own teardown.
        self.stop();
        self.owned.take();
        self.rx.take();
        self.tx_cq.take();
    }
}

/// Whether `domain` has GDA ops (an `efa-direct` domain; [`crate::fabric::Caps::gda_ops`]).
pub fn is_efa_direct(domain: &Domain) -> bool {
    crate::fabric::Caps::of(domain.info()).gda_ops
}

/// Entry size the 64-byte WQE format uses.
pub const HW_WQE_SIZE: u32 = WQE_SIZE as u32;

/// What the probe learns from a test endpoint on a domain with GDA ops.
pub struct EndpointProbe {
    /// Send queue attributes.
    pub sq: FiEfaWqAttr,
    /// Receive queue attributes.
    pub rq: FiEfaWqAttr,
    /// The endpoint's CQ ring.
    pub cq: std::result::Result<FiEfaCqAttr, GdaError>,
    /// Whether the send ring and doorbell map for the GPU (`None` without CUDA).
    pub mapping: Option<std::result::Result<(u64, u64), GdaError>>,
}

/// Opens a throw-away endpoint on `domain`, queries its rings and, when CUDA is usable, maps the
/// send ring and doorbell for the GPU (and unmaps them again).
pub fn probe_endpoint(domain: &Arc<Domain>, ops: &GdaOps) -> Result<EndpointProbe> {
    let av = AddressVector::open(domain, 4)?;
    let cq = CompletionQueue::open(domain, 256)?;
    let ep = Endpoint::open(domain, &av, &cq, None)?;
    // SAFETY: enabled endpoint and open CQ of the ops' domain, alive for this function.
    let (sq, rq) = unsafe { ops.query_qp_wqs(ep.handle())? };
    // SAFETY: as above.
    let cq_attr = unsafe { ops.query_cq(cq.handle()) }.map_err(GdaError::from);
    let mapping = mem::cuda_usable().then(|| {
        let (s, d) = map_send_queue(&sq)?;
        Ok((s.device, d.device))
    });
    Ok(EndpointProbe {
        sq,
        rq,
        cq: cq_attr,
        mapping,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::errno;

    #[test]
    fn page_spans() {
        assert_eq!(page_span(0x1000, 4, 0x1000), (0x1000, 0x1000));
        assert_eq!(page_span(0x1ffc, 4, 0x1000), (0x1000, 0x1000));
        assert_eq!(page_span(0x1ffe, 4, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_span(0x10000, 0x8000, 0x1000), (0x10000, 0x8000));
    }

    #[test]
    fn open_ops_errors_name_the_requirement() {
        for code in [errno::ENOSYS, errno::EOPNOTSUPP] {
            let e = open_ops_error(FabricError::from_ret(
                -(code as i64),
                "open ops (efa gda ops)",
            ));
            assert_eq!(e.code, -libc::EOPNOTSUPP);
            assert!(e.message.contains(NO_GDA_OPS), "{e}");
        }
        let e = open_ops_error(FabricError::from_ret(-(errno::EIO as i64), "fi_open_ops"));
        assert!(!e.message.contains(NO_GDA_OPS));
    }

    #[test]
    fn mapping_errors_suggest_the_driver_option() {
        let e = mapping_error(
            "send queue doorbell",
            cuda::CudaError {
                code: 1,
                context: "cuMemHostRegister".into(),
            },
        );
        assert!(e.message.contains("PeerMappingOverride=1"), "{e}");
        assert!(e.message.contains("cuMemHostRegister"), "{e}");
    }
}
