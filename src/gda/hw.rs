//! The hardware binding: the provider's GPU Direct Async ops (`fi_open_ops(domain, "efa gda ops")`,
//! libfabric >= 2.3, `efa-direct` fabric), the queries of an endpoint's send queue and of its
//! completion queues, peer address handles, lkeys, and the mapping of the send ring and its doorbell
//! for the GPU.
//!
//! What kernels get in hardware mode:
//! * `sq`: the endpoint's send ring, registered with `cuMemHostRegister(IOMEMORY | DEVICEMAP)`;
//! * `sq_doorbell`: the MMIO doorbell register, registered the same way (the page that holds it);
//! * `cq` / `rx_cq`: the transmit and receive CQ rings. On a queue this library opens itself the
//!   CQs are opened with `cq_open_ext` on GPU memory exported as a dmabuf, so kernels poll device
//!   memory; where that is refused, a plain CQ's host ring is registered with `DEVICEMAP`. For an
//!   endpoint opened by the caller (the patched-NVSHMEM path) the CQ cannot be found from the
//!   endpoint: the caller names it with [`HwQueue::set_cq`] (`nvshmemt_efa_gda_set_cq`) and must not
//!   poll it itself afterwards;
//! * `ctrl` and `slot_status` in device memory.
//!
//! Limits of state layout version 1 in hardware mode: receive-queue WQEs are not published, so
//! SENDs to a hardware-mode PE need receive buffers posted by other means, and RDMA write with
//! immediate relies on the device's unsolicited write-receive capability; RX ring entries are
//! 32 bytes (the CQ must use the extended receive form).
//!
//! Nothing here can run without an EFA device; what can run anywhere is the error path (other
//! providers answer `-FI_ENOSYS` or `-FI_EOPNOTSUPP` to `fi_open_ops`, mapped to [`NO_GDA_OPS`]).
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys as cu;

use crate::cuda::{self, DeviceBuffer, HostRegistration, PtrKind};
use crate::efa::gda_ops::{
    FiCqAttr, FiEfaCqAttr, FiEfaCqInitAttr, FiEfaOpsGda, FiEfaWqAttr, FidCq, FidDomain, FidEp,
    FidMr, FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF, FI_EFA_GDA_OPS_CSTR,
};
use crate::efa::wqe::WQE_SIZE;
use crate::fabric::{sys as fi, Domain, Error as FabricError, FiAddr};

use super::error::{GdaError, Result};
use super::mem;
use super::softq::SOFT_RX_CQE_SIZE;
use super::state::{NvshmemEfaGdaQueue, NvshmemEfaGdaQueueCtrl, NVSHMEM_EFA_GDA_MODE_HW};

/// The error text for a domain without GDA ops.
pub const NO_GDA_OPS: &str =
    "provider has no GDA ops (needs libfabric >= 2.3 with the efa-direct fabric)";

/// `FI_KEY_NOTAVAIL`.
const FI_KEY_NOTAVAIL: u64 = u64::MAX;

fn no_ops_error(code: i32) -> bool {
    let c = code.unsigned_abs();
    c == fi::FI_ENOSYS || c == fi::FI_EOPNOTSUPP || c == fi::FI_EINVAL || c == fi::FI_ENOENT
}

/// Turns an `fi_open_ops` failure into the clear error.
pub fn open_ops_error(e: FabricError) -> GdaError {
    if no_ops_error(e.code) {
        GdaError {
            code: -libc::EOPNOTSUPP,
            message: format!("{NO_GDA_OPS}: {e}"),
        }
    } else {
        GdaError::from(e)
    }
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

/// The provider's GDA operations table of one domain.
#[derive(Clone, Copy)]
pub struct GdaOps {
    table: *const FiEfaOpsGda,
    domain: *mut fi::fid_domain,
}

// SAFETY: the table is immutable provider data; the calls are thread-safe on an FI_THREAD_SAFE domain.
unsafe impl Send for GdaOps {}
// SAFETY: as above.
unsafe impl Sync for GdaOps {}

macro_rules! slot {
    ($self:ident, $name:ident) => {
        // SAFETY: the table pointer came from fi_open_ops and stays valid while the domain is open;
        // the first five slots exist in every version of the table (2.3.0 on).
        unsafe { (*$self.table).$name }.ok_or_else(|| {
            GdaError::unsupported(concat!("GDA ops: ", stringify!($name), " is missing"))
        })?
    };
}

impl GdaOps {
    /// Opens the GDA ops of `domain`.
    pub fn open(domain: &Arc<Domain>) -> Result<GdaOps> {
        // SAFETY: the name is the GDA table, whose layout `FiEfaOpsGda` mirrors.
        let ops = unsafe { domain.open_ops(FI_EFA_GDA_OPS_CSTR) }.map_err(open_ops_error)?;
        Self::from_table(ops, domain.as_ptr())
    }

    /// Opens the GDA ops of a domain the caller owns.
    ///
    /// # Safety
    /// `domain` must be an open libfabric domain that outlives the returned value.
    pub unsafe fn open_raw(domain: *mut fi::fid_domain) -> Result<GdaOps> {
        if domain.is_null() {
            return Err(GdaError::invalid("null domain"));
        }
        let mut ops: *mut c_void = ptr::null_mut();
        // SAFETY: open domain per the contract.
        let ret = unsafe {
            fi::fi_open_ops(
                &mut (*domain).fid,
                FI_EFA_GDA_OPS_CSTR.as_ptr(),
                0,
                &mut ops,
                ptr::null_mut(),
            )
        };
        if ret != 0 {
            return Err(open_ops_error(FabricError::from_ret(
                ret as i64,
                "fi_open_ops(efa gda ops)",
            )));
        }
        Self::from_table(ops, domain)
    }

    fn from_table(ops: *mut c_void, domain: *mut fi::fid_domain) -> Result<GdaOps> {
        if ops.is_null() {
            return Err(GdaError::unsupported(format!(
                "{NO_GDA_OPS}: fi_open_ops returned no table"
            )));
        }
        Ok(GdaOps {
            table: ops as *const FiEfaOpsGda,
            domain,
        })
    }

    /// The domain the table belongs to.
    pub fn domain(&self) -> *mut fi::fid_domain {
        self.domain
    }

    /// Address handle number, QP number and qkey of `addr` as seen from `ep`.
    ///
    /// # Safety
    /// `ep` must be an open endpoint of the ops' domain and `addr` an address of its AV.
    pub unsafe fn query_addr(&self, ep: *mut fi::fid_ep, addr: FiAddr) -> Result<(u16, u16, u32)> {
        let f = slot!(self, query_addr);
        let (mut ahn, mut qpn, mut qkey) = (0u16, 0u16, 0u32);
        // SAFETY: forwarded contract; outputs are locals.
        let r = unsafe { f(ep as *mut FidEp, addr, &mut ahn, &mut qpn, &mut qkey) };
        if r != 0 {
            return Err(
                FabricError::from_ret(r as i64, format!("GDA query_addr(fi_addr {addr})")).into(),
            );
        }
        Ok((ahn, qpn, qkey))
    }

    /// The send and receive rings of `ep`.
    ///
    /// # Safety
    /// `ep` must be an open, enabled endpoint of the ops' domain.
    pub unsafe fn query_qp_wqs(&self, ep: *mut fi::fid_ep) -> Result<(FiEfaWqAttr, FiEfaWqAttr)> {
        let f = slot!(self, query_qp_wqs);
        let mut sq = FiEfaWqAttr::zeroed();
        let mut rq = FiEfaWqAttr::zeroed();
        // SAFETY: forwarded contract; outputs are locals.
        let r = unsafe { f(ep as *mut FidEp, &mut sq, &mut rq) };
        if r != 0 {
            return Err(FabricError::from_ret(r as i64, "GDA query_qp_wqs").into());
        }
        Ok((sq, rq))
    }

    /// The ring of `cq`.
    ///
    /// # Safety
    /// `cq` must be an open CQ of the ops' domain.
    pub unsafe fn query_cq(&self, cq: *mut fi::fid_cq) -> Result<FiEfaCqAttr> {
        let f = slot!(self, query_cq);
        let mut a = FiEfaCqAttr::zeroed();
        // SAFETY: forwarded contract; output is a local.
        let r = unsafe { f(cq as *mut FidCq, &mut a) };
        if r != 0 {
            return Err(FabricError::from_ret(r as i64, "GDA query_cq").into());
        }
        Ok(a)
    }

    /// The device lkey of `mr`.
    ///
    /// # Safety
    /// `mr` must be an open registration of the ops' domain.
    pub unsafe fn get_mr_lkey(&self, mr: *mut fi::fid_mr) -> Result<u32> {
        let f = slot!(self, get_mr_lkey);
        // SAFETY: forwarded contract.
        let k = unsafe { f(mr as *mut FidMr) };
        if k == FI_KEY_NOTAVAIL || k > u64::from(crate::efa::wqe::LKEY_MASK) {
            return Err(GdaError::invalid(format!(
                "GDA get_mr_lkey: no usable lkey ({k:#x})"
            )));
        }
        Ok(k as u32)
    }

    /// Opens a CQ whose ring is `len` bytes of GPU memory at `buffer` exported as dmabuf `fd`.
    ///
    /// # Safety
    /// The memory must stay allocated while the CQ is open.
    unsafe fn cq_open_dmabuf(
        &self,
        size: usize,
        buffer: u64,
        len: u64,
        offset: u64,
        fd: i32,
    ) -> Result<RawCq> {
        let f = slot!(self, cq_open_ext);
        // SAFETY: all-zero fi_cq_attr is valid input.
        let mut attr: fi::fi_cq_attr = unsafe { std::mem::zeroed() };
        attr.size = size;
        attr.format = fi::fi_cq_format_FI_CQ_FORMAT_DATA;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let mut init = FiEfaCqInitAttr::zeroed();
        init.flags = FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF;
        init.ext_mem_dmabuf.buffer = buffer as *mut u8;
        init.ext_mem_dmabuf.length = len;
        init.ext_mem_dmabuf.offset = offset;
        init.ext_mem_dmabuf.fd = fd as u32;
        let mut cq: *mut FidCq = ptr::null_mut();
        // SAFETY: valid domain and attributes; cq receives the new object.
        let r = unsafe {
            f(
                self.domain as *mut FidDomain,
                &mut attr as *mut fi::fi_cq_attr as *mut FiCqAttr,
                &mut init,
                &mut cq,
                ptr::null_mut(),
            )
        };
        if r != 0 || cq.is_null() {
            return Err(FabricError::from_ret(r as i64, "GDA cq_open_ext(dmabuf)").into());
        }
        Ok(RawCq {
            raw: cq as *mut fi::fid_cq,
        })
    }
}

fn close_raw(fid: *mut fi::fid, what: &str) {
    // SAFETY: the callers pass the fid of an object they own, closed once.
    let r = unsafe { fi::fi_close(fid) };
    if r != 0 {
        tracing::warn!(
            "{}",
            FabricError::from_ret(r as i64, format!("fi_close({what})"))
        );
    }
}

/// An owned CQ.
struct RawCq {
    raw: *mut fi::fid_cq,
}
impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: open CQ.
        close_raw(unsafe { &mut (*self.raw).fid }, "cq");
    }
}

/// An owned AV.
struct RawAv {
    raw: *mut fi::fid_av,
}
impl Drop for RawAv {
    fn drop(&mut self) {
        // SAFETY: open AV.
        close_raw(unsafe { &mut (*self.raw).fid }, "av");
    }
}

/// An owned endpoint.
struct RawEp {
    raw: *mut fi::fid_ep,
}
impl Drop for RawEp {
    fn drop(&mut self) {
        // SAFETY: open endpoint.
        close_raw(unsafe { &mut (*self.raw).fid }, "ep");
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

fn map_for_gpu(what: &str, addr: *mut u8, len: u64, iomemory: bool) -> Result<Mapped> {
    if addr.is_null() || len == 0 {
        return Err(GdaError::invalid(format!(
            "the provider reported no {what}"
        )));
    }
    let (base, span) = page_span(addr as u64, len, page_size());
    // SAFETY: the range belongs to the provider's queue, which stays open while the mapping lives
    // (the queue value drops the mapping before it closes the endpoint).
    let reg = unsafe { HostRegistration::new(base as *mut c_void, span as usize, iomemory) }
        .map_err(|e| mapping_error(what, e))?;
    let device = reg.device() + (addr as u64 - base);
    Ok(Mapped { _reg: reg, device })
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
    cq: Option<RawCq>,
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
    match open_dmabuf_cq(ops, entries) {
        Ok(x) => return Ok(x),
        Err(e) => tracing::info!(
            "GDA: CQ on GPU memory not available ({e}); using a host CQ mapped for the GPU"
        ),
    }
    // SAFETY: all-zero fi_cq_attr is valid input.
    let mut attr: fi::fi_cq_attr = unsafe { std::mem::zeroed() };
    attr.size = entries;
    attr.format = fi::fi_cq_format_FI_CQ_FORMAT_DATA;
    attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
    let mut raw = ptr::null_mut();
    // SAFETY: valid domain; raw receives the new CQ.
    let r = unsafe { fi::fi_cq_open(domain.as_ptr(), &mut attr, &mut raw, ptr::null_mut()) };
    if r != 0 {
        return Err(FabricError::from_ret(r as i64, "fi_cq_open").into());
    }
    let cq = RawCq { raw };
    // SAFETY: open CQ of this domain.
    let a = unsafe { ops.query_cq(cq.raw)? };
    let mut view = cq_view(a)?;
    view.cq = Some(cq);
    Ok(view)
}

fn open_dmabuf_cq(ops: &GdaOps, entries: usize) -> Result<CqView> {
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
    let cq = unsafe { ops.cq_open_dmabuf(entries, buf.ptr(), len, buf.ptr() - base, fd) };
    // SAFETY: fd is ours; the provider holds its own reference once the CQ is open.
    unsafe { libc::close(fd) };
    let cq = cq?;
    // SAFETY: open CQ.
    let a = match unsafe { ops.query_cq(cq.raw) } {
        Ok(a) => a,
        Err(e) => {
            drop(cq);
            return Err(e);
        }
    };
    Ok(CqView {
        cq: Some(cq),
        ring: Some(CqRing::Device(buf)),
        device: a.buffer as u64,
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
    let m = map_for_gpu(
        "completion ring",
        a.buffer,
        u64::from(a.num_entries) * u64::from(a.entry_size),
        false,
    )?;
    let device = m.device;
    Ok(CqView {
        cq: None,
        ring: Some(CqRing::Host(m)),
        device,
        attr: a,
    })
}

/// Endpoint objects this library opened itself (dedicated GDA endpoint); the CQs live in the
/// queue's CQ views and close after the endpoint.
struct Owned {
    ep: RawEp,
    av: RawAv,
    _domain: Arc<Domain>,
}

/// A hardware EFA queue published to the GPU. Dropping it unmaps the provider's rings, closes the
/// endpoint and CQs, and only then frees GPU memory the CQs used.
pub struct HwQueue {
    sq_map: Option<Mapped>,
    db_map: Option<Mapped>,
    sq_dev: u64,
    db_dev: u64,
    tx_cq: Option<CqView>,
    rx_cq: Option<CqView>,
    ctrl: DeviceBuffer,
    owned: Option<Owned>,
    ops: GdaOps,
    ep: *mut fi::fid_ep,
    sq: FiEfaWqAttr,
    qpn: u16,
}

// SAFETY: the raw handles are libfabric objects of an FI_THREAD_SAFE domain and immutable mappings.
unsafe impl Send for HwQueue {}
// SAFETY: as above.
unsafe impl Sync for HwQueue {}

impl HwQueue {
    /// Opens a dedicated endpoint on `domain` (own AV, own transmit and receive CQs on GPU memory),
    /// queries its rings and maps them for the GPU.
    pub fn open(domain: &Arc<Domain>, ops: GdaOps) -> Result<HwQueue> {
        if !mem::cuda_usable() {
            return Err(GdaError::unsupported(
                "hardware GDA needs the CUDA driver and a current context to map the queues",
            ));
        }
        let info = domain.info();
        // SAFETY: tx_attr/rx_attr are always set in a getinfo answer.
        let (tx_size, rx_size) = unsafe {
            (
                (*(*info.as_ptr()).tx_attr).size,
                (*(*info.as_ptr()).rx_attr).size,
            )
        };
        let tx_view = open_gpu_cq(&ops, domain, tx_size.max(64))?;
        let rx_view = open_gpu_cq(&ops, domain, rx_size.max(64))?;
        let tx_cq = tx_view.cq.as_ref().map(|c| c.raw).expect("CQ opened here");
        let rx_cq = rx_view.cq.as_ref().map(|c| c.raw).expect("CQ opened here");
        // SAFETY: zeroed attr is valid input.
        let mut av_attr: fi::fi_av_attr = unsafe { std::mem::zeroed() };
        av_attr.type_ = fi::fi_av_type_FI_AV_TABLE;
        av_attr.count = 64;
        let mut av_raw = ptr::null_mut();
        // SAFETY: valid domain; av_raw receives the AV.
        let r =
            unsafe { fi::fi_av_open(domain.as_ptr(), &mut av_attr, &mut av_raw, ptr::null_mut()) };
        if r != 0 {
            return Err(FabricError::from_ret(r as i64, "fi_av_open").into());
        }
        let av = RawAv { raw: av_raw };
        let mut ep_raw = ptr::null_mut();
        // SAFETY: valid domain and info; ep_raw receives the endpoint.
        let r = unsafe {
            fi::fi_endpoint(domain.as_ptr(), info.as_ptr(), &mut ep_raw, ptr::null_mut())
        };
        if r != 0 {
            return Err(FabricError::from_ret(r as i64, "fi_endpoint").into());
        }
        let ep = RawEp { raw: ep_raw };
        // SAFETY: binding open objects of the same domain, then enabling.
        unsafe {
            let bind = |fid: *mut fi::fid, flags: u64, what: &str| -> Result<()> {
                let r = fi::fi_ep_bind(ep.raw, fid, flags);
                if r != 0 {
                    return Err(
                        FabricError::from_ret(r as i64, format!("fi_ep_bind({what})")).into(),
                    );
                }
                Ok(())
            };
            bind(&mut (*av.raw).fid, 0, "av")?;
            bind(&mut (*tx_cq).fid, u64::from(fi::FI_TRANSMIT), "transmit cq")?;
            bind(&mut (*rx_cq).fid, u64::from(fi::FI_RECV), "receive cq")?;
            let r = fi::fi_enable(ep.raw);
            if r != 0 {
                return Err(FabricError::from_ret(r as i64, "fi_enable").into());
            }
        }
        let owned = Owned {
            ep,
            av,
            _domain: domain.clone(),
        };
        let ep = owned.ep.raw;
        // SAFETY: enabled endpoint of the ops' domain.
        let mut q = unsafe { Self::map_endpoint(ops, ep)? };
        q.tx_cq = Some(tx_view);
        q.rx_cq = Some(rx_view);
        q.owned = Some(owned);
        q.check_cqs()?;
        Ok(q)
    }

    /// Publishes the send queue of an endpoint the caller owns. The CQ comes later, through
    /// [`HwQueue::set_cq`].
    ///
    /// # Safety
    /// `ep` must be an open, enabled endpoint of the ops' domain that stays open until this value is
    /// dropped, and on which nothing else posts sends from now on.
    pub unsafe fn on_external_ep(ops: GdaOps, ep: *mut fi::fid_ep) -> Result<HwQueue> {
        if ep.is_null() {
            return Err(GdaError::invalid("null endpoint"));
        }
        if !mem::cuda_usable() {
            return Err(GdaError::unsupported(
                "hardware GDA needs the CUDA driver and a current context to map the queues",
            ));
        }
        // SAFETY: forwarded contract.
        unsafe { Self::map_endpoint(ops, ep) }
    }

    /// # Safety
    /// As for `on_external_ep`.
    unsafe fn map_endpoint(ops: GdaOps, ep: *mut fi::fid_ep) -> Result<HwQueue> {
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
        if !sq.num_entries.is_power_of_two() || (sq.entry_size != 64 && sq.entry_size != 128) {
            return Err(GdaError::unsupported(format!(
                "GDA send queue of {} entries of {} bytes: expected a power of two of 64- or 128-byte entries",
                sq.num_entries, sq.entry_size
            )));
        }
        if sq.has_64_bit_req_id() {
            tracing::info!("GDA: the send queue carries 64-bit request ids; kernels write the low 16 bits only");
        }
        let sq_map = map_for_gpu(
            "send queue ring",
            sq.buffer,
            u64::from(sq.num_entries) * u64::from(sq.entry_size),
            true,
        )?;
        let db_map = map_for_gpu("send queue doorbell", sq.doorbell as *mut u8, 4, true)?;
        let ctrl = DeviceBuffer::new(
            std::mem::size_of::<NvshmemEfaGdaQueueCtrl>() + 4 * sq.num_entries as usize,
        )
        .map_err(|e| GdaError::nomem(format!("GDA control block: {e}")))?;
        Ok(HwQueue {
            sq_dev: sq_map.device,
            db_dev: db_map.device,
            sq_map: Some(sq_map),
            db_map: Some(db_map),
            tx_cq: None,
            rx_cq: None,
            ctrl,
            owned: None,
            ops,
            ep,
            sq,
            qpn: 0,
        })
    }

    fn check_cqs(&self) -> Result<()> {
        if let Some(c) = &self.tx_cq {
            if c.attr.num_entries < self.sq.num_entries || !c.attr.num_entries.is_power_of_two() {
                return Err(GdaError::unsupported(format!(
                    "GDA completion ring of {} entries for a send queue of {}: needs a power of two at least as large",
                    c.attr.num_entries, self.sq.num_entries
                )));
            }
        }
        if let Some(c) = &self.rx_cq {
            if c.attr.entry_size != SOFT_RX_CQE_SIZE || !c.attr.num_entries.is_power_of_two() {
                return Err(GdaError::unsupported(format!(
                    "GDA receive completion ring of {} entries of {} bytes: state version 1 expects a power of two \
                     of {SOFT_RX_CQE_SIZE}-byte entries",
                    c.attr.num_entries, c.attr.entry_size
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
    pub unsafe fn set_cq(&mut self, cq: *mut fi::fid_cq) -> Result<()> {
        if cq.is_null() {
            return Err(GdaError::invalid("null CQ"));
        }
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
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: open endpoint; buf has len bytes.
        let r = unsafe {
            fi::fi_getname(
                &mut (*o.ep.raw).fid,
                buf.as_mut_ptr() as *mut c_void,
                &mut len,
            )
        };
        if r != 0 {
            return Err(FabricError::from_ret(r as i64, "fi_getname").into());
        }
        buf.truncate(len);
        Ok(buf)
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
        let mut addrs = vec![u64::MAX; count];
        // SAFETY: names holds count addresses; addrs has room for count results.
        let r = unsafe {
            fi::fi_av_insert(
                o.av.raw,
                names.as_ptr() as *const c_void,
                count,
                addrs.as_mut_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(FabricError::from_ret(r as i64, "fi_av_insert").into());
        }
        if r as usize != count {
            return Err(GdaError::invalid(format!(
                "fi_av_insert inserted {r} of {count} addresses"
            )));
        }
        Ok(addrs)
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
        Ok(out)
    }

    /// lkey of a registration.
    ///
    /// # Safety
    /// `mr` must be an open registration of the queue's domain.
    pub unsafe fn lkey(&self, mr: *mut fi::fid_mr) -> Result<u32> {
        // SAFETY: forwarded contract.
        unsafe { self.ops.get_mr_lkey(mr) }
    }

    /// The raw endpoint (to bind registrations).
    pub fn ep(&self) -> *mut fi::fid_ep {
        self.ep
    }

    /// The queue as kernels see it (`cq` 0 until a CQ is known).
    pub fn queue_desc(&self) -> NvshmemEfaGdaQueue {
        let (cq, cq_entries, cq_entry_size) = self.tx_cq.as_ref().map_or((0, 0, 0), |c| {
            (c.device, c.attr.num_entries, c.attr.entry_size)
        });
        let (rx_cq, rx_entries) = self
            .rx_cq
            .as_ref()
            .map_or((0, 0), |c| (c.device, c.attr.num_entries));
        NvshmemEfaGdaQueue {
            sq: self.sq_dev,
            sq_doorbell: self.db_dev,
            cq,
            rx_cq,
            ctrl: self.ctrl.ptr(),
            slot_status: self.ctrl.ptr() + std::mem::size_of::<NvshmemEfaGdaQueueCtrl>() as u64,
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
        // The endpoint closes before the CQs bound to it; each CQ view then orders its own teardown.
        self.owned.take();
        self.tx_cq.take();
        self.rx_cq.take();
    }
}

/// Whether `domain` is an `efa-direct` domain (the only fabric with GDA ops).
pub fn is_efa_direct(domain: &Domain) -> bool {
    let i = domain.info();
    i.fabric_name() == "efa-direct" && i.provider_name().starts_with("efa")
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
    let av = crate::fabric::AddressVector::open(domain, 4)?;
    let cq = crate::fabric::CompletionQueue::open(domain, 256)?;
    let ep = crate::fabric::Endpoint::open(domain, &av, &cq, None)?;
    // SAFETY: enabled endpoint and open CQ of the ops' domain, alive for this function.
    let (sq, rq) = unsafe { ops.query_qp_wqs(ep.as_ptr())? };
    // SAFETY: as above.
    let cq_attr = unsafe { ops.query_cq(cq.as_ptr()) };
    let mapping = mem::cuda_usable().then(|| {
        let s = map_for_gpu(
            "send queue ring",
            sq.buffer,
            u64::from(sq.num_entries) * u64::from(sq.entry_size),
            true,
        )?;
        let d = map_for_gpu("send queue doorbell", sq.doorbell as *mut u8, 4, true)?;
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

    #[test]
    fn page_spans() {
        assert_eq!(page_span(0x1000, 4, 0x1000), (0x1000, 0x1000));
        assert_eq!(page_span(0x1ffc, 4, 0x1000), (0x1000, 0x1000));
        assert_eq!(page_span(0x1ffe, 4, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_span(0x10000, 0x8000, 0x1000), (0x10000, 0x8000));
    }

    #[test]
    fn open_ops_errors_name_the_requirement() {
        for code in [fi::FI_ENOSYS, fi::FI_EOPNOTSUPP] {
            let e = open_ops_error(FabricError::from_ret(
                -(code as i64),
                "fi_open_ops(efa gda ops)",
            ));
            assert_eq!(e.code, -libc::EOPNOTSUPP);
            assert!(e.message.contains(NO_GDA_OPS), "{e}");
        }
        let e = open_ops_error(FabricError::from_ret(-(fi::FI_EIO as i64), "fi_open_ops"));
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
