//! Calls into the provider's GPU Direct Async operations table (`fi_open_ops(domain, "efa gda ops")`,
//! libfabric >= 2.3, `efa-direct` fabric; layout in [`super::efa_gda_abi`]): queries of an
//! endpoint's rings, of a CQ's ring, of peer address handles and of registration lkeys, CQs on
//! caller memory, and (libfabric >= 2.6) hardware completion counters whose counts live in caller
//! memory. Errors are fabric errors; whether "no table" means "no GDA here" is the caller's
//! reading.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::cntr::Counter;
use super::cq::CompletionQueue;
use super::domain::{Domain, FiAddr};
use super::efa_gda_abi::{
    has_cntr_open_ext, FiCntrAttr, FiCqAttr, FiEfaCompCntrInitAttr, FiEfaCqAttr, FiEfaCqInitAttr,
    FiEfaMemoryLocation, FiEfaOpsGda, FiEfaWqAttr, FidCntr, FidCq, FidDomain, FidEp, FidMr,
    FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM, FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM,
    FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF, FI_EFA_GDA_OPS_CSTR, FI_EFA_MEMORY_LOCATION_DMABUF,
    FI_EFA_MEMORY_LOCATION_VA,
};
use super::error::{check, Error, Result};
use super::handle::{CqHandle, DomainHandle, EndpointHandle, MrHandle};

/// `FI_KEY_NOTAVAIL`.
const FI_KEY_NOTAVAIL: u64 = u64::MAX;

/// True for the codes with which a provider says it has no such ops table.
pub fn is_no_ops_code(code: i32) -> bool {
    let c = code.unsigned_abs();
    c == fi::FI_ENOSYS || c == fi::FI_EOPNOTSUPP || c == fi::FI_EINVAL || c == fi::FI_ENOENT
}

/// The provider's GDA operations table of one domain.
#[derive(Clone, Copy)]
pub struct GdaOps {
    table: *const FiEfaOpsGda,
    domain: DomainHandle,
    /// The running libfabric's `fi_version()`: the table's length depends on it.
    version: u32,
}

/// Where a hardware counter keeps one of its counts (a `u64` the device writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterMemory {
    /// The provider's own memory.
    Provider,
    /// A virtual address (host memory the device can write).
    Va(*mut u64),
    /// `offset` bytes into the memory exported as dmabuf `fd` (GPU memory).
    Dmabuf {
        /// dmabuf file descriptor.
        fd: i32,
        /// Offset of the count within it.
        offset: u64,
    },
}

impl CounterMemory {
    /// The `fi_efa_memory_location` of this memory (`None` for the provider's own).
    fn location(self) -> Option<FiEfaMemoryLocation> {
        let mut l = FiEfaMemoryLocation::zeroed();
        match self {
            CounterMemory::Provider => return None,
            CounterMemory::Va(p) => {
                l.type_ = FI_EFA_MEMORY_LOCATION_VA;
                l.ptr = p as *mut u8;
            }
            CounterMemory::Dmabuf { fd, offset } => {
                l.type_ = FI_EFA_MEMORY_LOCATION_DMABUF;
                l.dmabuf.fd = fd;
                l.dmabuf.offset = offset;
            }
        }
        Some(l)
    }
}

/// The extra attributes of `cntr_open_ext` for counts kept in `comp` and `err`.
pub fn counter_init_attr(comp: CounterMemory, err: CounterMemory) -> FiEfaCompCntrInitAttr {
    let mut a = FiEfaCompCntrInitAttr::zeroed();
    if let Some(l) = comp.location() {
        a.flags |= FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM;
        a.comp_cntr_ext_mem = l;
    }
    if let Some(l) = err.location() {
        a.flags |= FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM;
        a.err_cntr_ext_mem = l;
    }
    a
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
            Error::unsupported(concat!("GDA ops: ", stringify!($name), " is missing"))
        })?
    };
}

impl GdaOps {
    /// Opens the GDA ops of `domain`.
    pub fn open(domain: &Arc<Domain>) -> Result<GdaOps> {
        // SAFETY: the domain is open and outlives this call's use of it.
        unsafe { Self::open_foreign(domain.handle()) }
    }

    /// Opens the GDA ops of a domain the caller owns.
    ///
    /// # Safety
    /// `domain` must be an open libfabric domain that outlives the returned value.
    pub unsafe fn open_foreign(domain: DomainHandle) -> Result<GdaOps> {
        let mut ops: *mut c_void = ptr::null_mut();
        // SAFETY: open domain per the contract; the name is the GDA table, whose layout
        // `FiEfaOpsGda` mirrors.
        let ret = unsafe {
            fi::fi_open_ops(
                &mut (*domain.0).fid,
                FI_EFA_GDA_OPS_CSTR.as_ptr(),
                0,
                &mut ops,
                ptr::null_mut(),
            )
        };
        check(ret as i64, || "fi_open_ops(efa gda ops)".to_string())?;
        if ops.is_null() {
            return Err(Error::unsupported(
                "fi_open_ops(efa gda ops) returned no table",
            ));
        }
        Ok(GdaOps {
            table: ops as *const FiEfaOpsGda,
            domain,
            // SAFETY: fi_version has no preconditions.
            version: unsafe { fi::fi_version() },
        })
    }

    /// The domain the table belongs to.
    pub fn domain(&self) -> DomainHandle {
        self.domain
    }

    /// Address handle number, QP number and qkey of `addr` as seen from `ep`.
    ///
    /// # Safety
    /// `ep` must be an open endpoint of the ops' domain and `addr` an address of its AV.
    pub unsafe fn query_addr(&self, ep: EndpointHandle, addr: FiAddr) -> Result<(u16, u16, u32)> {
        let f = slot!(self, query_addr);
        let (mut ahn, mut qpn, mut qkey) = (0u16, 0u16, 0u32);
        // SAFETY: forwarded contract; outputs are locals.
        let r = unsafe { f(ep.0 as *mut FidEp, addr, &mut ahn, &mut qpn, &mut qkey) };
        check(r as i64, || format!("GDA query_addr(fi_addr {addr})"))?;
        Ok((ahn, qpn, qkey))
    }

    /// The send and receive rings of `ep`.
    ///
    /// # Safety
    /// `ep` must be an open, enabled endpoint of the ops' domain.
    pub unsafe fn query_qp_wqs(&self, ep: EndpointHandle) -> Result<(FiEfaWqAttr, FiEfaWqAttr)> {
        let f = slot!(self, query_qp_wqs);
        let mut sq = FiEfaWqAttr::zeroed();
        let mut rq = FiEfaWqAttr::zeroed();
        // SAFETY: forwarded contract; outputs are locals.
        let r = unsafe { f(ep.0 as *mut FidEp, &mut sq, &mut rq) };
        check(r as i64, || "GDA query_qp_wqs".to_string())?;
        Ok((sq, rq))
    }

    /// The ring of `cq`.
    ///
    /// # Safety
    /// `cq` must be an open CQ of the ops' domain.
    pub unsafe fn query_cq(&self, cq: CqHandle) -> Result<FiEfaCqAttr> {
        let f = slot!(self, query_cq);
        let mut a = FiEfaCqAttr::zeroed();
        // SAFETY: forwarded contract; output is a local.
        let r = unsafe { f(cq.0 as *mut FidCq, &mut a) };
        check(r as i64, || "GDA query_cq".to_string())?;
        Ok(a)
    }

    /// The device lkey of `mr`.
    ///
    /// # Safety
    /// `mr` must be an open registration of the ops' domain.
    pub unsafe fn get_mr_lkey(&self, mr: MrHandle) -> Result<u32> {
        let f = slot!(self, get_mr_lkey);
        // SAFETY: forwarded contract.
        let k = unsafe { f(mr.0 as *mut FidMr) };
        if k == FI_KEY_NOTAVAIL || k > u64::from(crate::efa::wqe::LKEY_MASK) {
            return Err(Error::invalid(format!(
                "GDA get_mr_lkey: no usable lkey ({k:#x})"
            )));
        }
        Ok(k as u32)
    }

    /// Opens a CQ of `size` entries on `domain` (the ops' domain) whose ring is `len` bytes of GPU
    /// memory exported as dmabuf `fd` (`offset`: the ring's offset in it).
    ///
    /// The CPU address of the ring (`ext_mem_dmabuf.buffer`) is passed as NULL, as fabtests'
    /// `create_ext_cq` does: libfabric treats a CQ opened with a non-NULL buffer as CPU-pollable
    /// (`efa_domain_cq_open_ext` then installs `efa_cq_poll_ibv_cq` and a progress function, and
    /// rdma-core sets `cq->buf` from it), and drains it through that address when an endpoint bound
    /// to it closes (`efa_base_ep_destruct_qp_unsafe`). A GPU address there would be read by the
    /// CPU. With NULL the CQ is GPU-only: libfabric never polls it. Callers keep their own device
    /// pointer of the ring.
    ///
    /// # Safety
    /// The memory must stay allocated while the CQ is open.
    pub unsafe fn cq_open_dmabuf(
        &self,
        domain: &Arc<Domain>,
        size: usize,
        len: u64,
        offset: u64,
        fd: i32,
    ) -> Result<Arc<CompletionQueue>> {
        let f = slot!(self, cq_open_ext);
        if domain.handle() != self.domain {
            return Err(Error::invalid(
                "GDA cq_open_ext: domain is not the ops' domain",
            ));
        }
        // SAFETY: all-zero fi_cq_attr is valid input.
        let mut attr: fi::fi_cq_attr = unsafe { std::mem::zeroed() };
        attr.size = size;
        attr.format = fi::fi_cq_format_FI_CQ_FORMAT_DATA;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let mut init = dmabuf_cq_init_attr(len, offset, fd);
        let mut cq: *mut FidCq = ptr::null_mut();
        // SAFETY: valid domain and attributes; cq receives the new object.
        let r = unsafe {
            f(
                self.domain.0 as *mut FidDomain,
                &mut attr as *mut fi::fi_cq_attr as *mut FiCqAttr,
                &mut init,
                &mut cq,
                ptr::null_mut(),
            )
        };
        if r != 0 || cq.is_null() {
            return Err(Error::from_ret(r as i64, "GDA cq_open_ext(dmabuf)"));
        }
        // SAFETY: a CQ the provider just opened on this domain, owned from here on.
        Ok(unsafe { CompletionQueue::from_raw(domain, cq as *mut fi::fid_cq) })
    }
}

impl GdaOps {
    /// Whether the table has `cntr_open_ext` (libfabric >= 2.6).
    pub fn has_cntr_open_ext(&self) -> bool {
        has_cntr_open_ext(self.version)
    }

    /// Opens a hardware completion counter on `domain` (the ops' domain) whose completion and
    /// error counts live in `comp` and `err` (libfabric >= 2.6, `cntr_open_ext`; rdma-core's
    /// `efadv_create_comp_cntr`). Bind it to an endpoint with `fi_ep_bind` as any counter. Older
    /// libraries have a 40-byte table without the slot: refused with `FI_EOPNOTSUPP`, the slot is
    /// not read.
    ///
    /// # Safety
    /// Memory named by `comp` or `err` stays valid (and, for a VA, writable by the device) while the
    /// counter is open.
    pub unsafe fn cntr_open_ext(
        &self,
        domain: &Arc<Domain>,
        comp: CounterMemory,
        err: CounterMemory,
    ) -> Result<Arc<Counter>> {
        if !self.has_cntr_open_ext() {
            let (major, minor) = (self.version >> 16, self.version & 0xffff);
            tracing::warn!(
                "GDA cntr_open_ext needs libfabric 2.6 or later; this is {major}.{minor}, whose ops \
                 table has no such slot"
            );
            return Err(Error::unsupported(format!(
                "GDA cntr_open_ext needs libfabric 2.6 or later (running {major}.{minor})"
            )));
        }
        // SAFETY: the table is 48 bytes long from 2.6 on (checked above); valid while the domain
        // is open.
        let f = unsafe { (*self.table).cntr_open_ext }
            .ok_or_else(|| Error::unsupported("GDA ops: cntr_open_ext is missing"))?;
        if domain.handle() != self.domain {
            return Err(Error::invalid(
                "GDA cntr_open_ext: domain is not the ops' domain",
            ));
        }
        // SAFETY: all-zero fi_cntr_attr is valid input.
        let mut attr: fi::fi_cntr_attr = unsafe { std::mem::zeroed() };
        attr.events = fi::fi_cntr_events_FI_CNTR_EVENTS_COMP;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let mut init = counter_init_attr(comp, err);
        let mut cntr: *mut FidCntr = ptr::null_mut();
        // SAFETY: valid domain and attributes; cntr receives the new object.
        let r = unsafe {
            f(
                self.domain.0 as *mut FidDomain,
                &mut attr as *mut fi::fi_cntr_attr as *mut FiCntrAttr,
                &mut cntr,
                ptr::null_mut(),
                &mut init,
            )
        };
        if r != 0 || cntr.is_null() {
            return Err(Error::from_ret(r as i64, "GDA cntr_open_ext"));
        }
        // SAFETY: a counter the provider just opened on this domain, owned from here on.
        Ok(unsafe { Counter::from_raw(domain, cntr as *mut fi::fid_cntr) })
    }
}

/// The extra attributes of a CQ on caller GPU memory given as a dmabuf: the dmabuf flag, length,
/// offset and fd, and NO CPU address (see [`GdaOps::cq_open_dmabuf`]).
pub fn dmabuf_cq_init_attr(len: u64, offset: u64, fd: i32) -> FiEfaCqInitAttr {
    let mut init = FiEfaCqInitAttr::zeroed();
    init.flags = FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF;
    init.ext_mem_dmabuf.buffer = ptr::null_mut();
    init.ext_mem_dmabuf.length = len;
    init.ext_mem_dmabuf.offset = offset;
    init.ext_mem_dmabuf.fd = fd as u32;
    init
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use crate::fabric::efa_gda_abi::fi_version as fi_version_of;
    use crate::fabric::{Fabric, Info, InfoRequest, Provider};

    #[test]
    fn counter_memory_becomes_flags_and_locations() {
        let a = counter_init_attr(CounterMemory::Provider, CounterMemory::Provider);
        assert_eq!((a.flags, a.comp_mask), (0, 0));
        let mut word = 0u64;
        let a = counter_init_attr(
            CounterMemory::Dmabuf {
                fd: 9,
                offset: 4096,
            },
            CounterMemory::Va(&mut word),
        );
        assert_eq!(
            a.flags,
            FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM
                | FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM
        );
        assert_eq!(a.comp_cntr_ext_mem.type_, FI_EFA_MEMORY_LOCATION_DMABUF);
        assert_eq!(
            (
                a.comp_cntr_ext_mem.dmabuf.fd,
                a.comp_cntr_ext_mem.dmabuf.offset
            ),
            (9, 4096)
        );
        assert!(a.comp_cntr_ext_mem.ptr.is_null());
        assert_eq!(a.err_cntr_ext_mem.type_, FI_EFA_MEMORY_LOCATION_VA);
        assert_eq!(
            a.err_cntr_ext_mem.ptr as usize,
            &mut word as *mut u64 as usize
        );
        let a = counter_init_attr(
            CounterMemory::Provider,
            CounterMemory::Dmabuf { fd: 3, offset: 8 },
        );
        assert_eq!(a.flags, FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM);
    }

    /// What the fake `cntr_open_ext` was handed: flags, completion location type and fd.
    static SEEN_CNTR: Mutex<Option<(u32, u8, i32)>> = Mutex::new(None);

    unsafe extern "C" fn fake_cntr_open_ext(
        _domain: *mut FidDomain,
        _attr: *mut FiCntrAttr,
        _cntr: *mut *mut FidCntr,
        _context: *mut c_void,
        init: *mut FiEfaCompCntrInitAttr,
    ) -> i32 {
        // SAFETY: cntr_open_ext passes a pointer to its local attributes.
        let i = unsafe { *init };
        *SEEN_CNTR.lock().unwrap() = Some((
            i.flags,
            i.comp_cntr_ext_mem.type_,
            i.comp_cntr_ext_mem.dmabuf.fd,
        ));
        -(fi::FI_ENOSYS as i32)
    }

    /// A real (software) domain for the call paths, or `None` (said on stderr) without tcp.
    fn tcp_domain() -> Option<(Arc<Fabric>, Arc<Domain>)> {
        let Ok(info) = Info::get(&InfoRequest {
            provider: Provider::Tcp,
            hmem: false,
            atomics: false,
            msg: false,
        }) else {
            eprintln!("no tcp provider: the call path is not exercised");
            return None;
        };
        let fabric = Fabric::open(info).expect("fabric");
        let domain = Domain::open(&fabric).expect("domain");
        Some((fabric, domain))
    }

    /// The slot is called from 2.6 on, and never read under an older library (whose table is 40
    /// bytes long).
    #[test]
    fn cntr_open_ext_is_gated_by_the_library_version() {
        let Some((_fabric, domain)) = tcp_domain() else {
            return;
        };
        let table = FiEfaOpsGda {
            query_addr: None,
            query_qp_wqs: None,
            query_cq: None,
            cq_open_ext: None,
            get_mr_lkey: None,
            cntr_open_ext: Some(fake_cntr_open_ext),
        };
        let mem = CounterMemory::Dmabuf { fd: 5, offset: 0 };
        let old = GdaOps {
            table: &table,
            domain: domain.handle(),
            version: fi_version_of(2, 5),
        };
        assert!(!old.has_cntr_open_ext());
        // SAFETY: refused before any call.
        let e = unsafe { old.cntr_open_ext(&domain, mem, CounterMemory::Provider) }
            .err()
            .expect("refused");
        assert!(e.to_string().contains("2.6"), "{e}");
        assert!(SEEN_CNTR.lock().unwrap().is_none(), "the slot was read");
        let new = GdaOps {
            version: fi_version_of(2, 6),
            ..old
        };
        // SAFETY: the fake records its arguments and opens nothing.
        let r = unsafe { new.cntr_open_ext(&domain, mem, CounterMemory::Provider) };
        assert!(r.is_err(), "the fake refuses");
        let seen = SEEN_CNTR
            .lock()
            .unwrap()
            .take()
            .expect("cntr_open_ext called");
        assert_eq!(
            seen,
            (
                FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM,
                FI_EFA_MEMORY_LOCATION_DMABUF,
                5
            )
        );
    }

    /// What the fake `cq_open_ext` was handed: flags, CPU address, length, offset, fd.
    #[derive(Debug)]
    struct Seen {
        flags: u64,
        buffer: usize,
        length: u64,
        offset: u64,
        fd: u32,
    }
    static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

    unsafe extern "C" fn fake_cq_open_ext(
        _domain: *mut FidDomain,
        _attr: *mut FiCqAttr,
        init: *mut FiEfaCqInitAttr,
        _cq: *mut *mut FidCq,
        _context: *mut c_void,
    ) -> i32 {
        // SAFETY: cq_open_dmabuf passes a pointer to its local attributes.
        let i = unsafe { *init };
        *SEEN.lock().unwrap() = Some(Seen {
            flags: i.flags,
            buffer: i.ext_mem_dmabuf.buffer as usize,
            length: i.ext_mem_dmabuf.length,
            offset: i.ext_mem_dmabuf.offset,
            fd: i.ext_mem_dmabuf.fd,
        });
        -(fi::FI_ENOSYS as i32)
    }

    /// The dmabuf CQ is opened GPU-only: no CPU address reaches the provider, so libfabric never
    /// polls (nor drains at endpoint close) a ring that lives in GPU memory.
    #[test]
    fn dmabuf_cq_is_opened_without_a_cpu_address() {
        let a = dmabuf_cq_init_attr(8192, 4096, 7);
        assert_eq!(a.flags, FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF);
        assert!(a.ext_mem_dmabuf.buffer.is_null());
        assert_eq!(
            (
                a.ext_mem_dmabuf.length,
                a.ext_mem_dmabuf.offset,
                a.ext_mem_dmabuf.fd
            ),
            (8192, 4096, 7)
        );

        // Through the call itself, with a fake table on a real (software) domain.
        let Some((_fabric, domain)) = tcp_domain() else {
            return;
        };
        let table = FiEfaOpsGda {
            query_addr: None,
            query_qp_wqs: None,
            query_cq: None,
            cq_open_ext: Some(fake_cq_open_ext),
            get_mr_lkey: None,
            cntr_open_ext: None,
        };
        let ops = GdaOps {
            table: &table,
            domain: domain.handle(),
            version: fi_version_of(2, 6),
        };
        // SAFETY: the fake records its arguments and opens nothing.
        let r = unsafe { ops.cq_open_dmabuf(&domain, 64, 8192, 4096, 7) };
        assert!(r.is_err(), "the fake refuses");
        let seen = SEEN.lock().unwrap().take().expect("cq_open_ext called");
        assert_eq!(seen.flags, FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF);
        assert_eq!(seen.buffer, 0, "a CPU address was handed to cq_open_ext");
        assert_eq!((seen.length, seen.offset, seen.fd), (8192, 4096, 7));
    }
}
