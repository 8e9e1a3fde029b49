//! RAII wrappers of the libfabric objects: fabric, domain, address vector, completion queue, counter,
//! endpoint and memory registration. Ownership runs one way: every object holds an `Arc` of what it was
//! opened from, so a domain never closes before its endpoints, and a fabric never before its domains.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::error::{check, Error, Result};
use super::info::Info;

/// libfabric address handle (`fi_addr_t`).
pub type FiAddr = u64;

fn close_fid(fid: *mut fi::fid, what: &str) {
    if fid.is_null() {
        return;
    }
    // SAFETY: fid is an open libfabric object owned by the caller, closed exactly once here.
    let ret = unsafe { fi::fi_close(fid) };
    if ret != 0 {
        tracing::warn!(
            "{}",
            Error::from_ret(ret as i64, format!("fi_close({what})"))
        );
    }
}

/// An open fabric.
pub struct Fabric {
    raw: *mut fi::fid_fabric,
    info: Info,
}
// SAFETY: libfabric objects opened with FI_THREAD_SAFE may be used from any thread.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl Fabric {
    /// Opens the fabric described by `info`.
    pub fn open(info: Info) -> Result<Arc<Fabric>> {
        let mut raw = ptr::null_mut();
        // SAFETY: info is a valid getinfo answer; raw receives the new object.
        let ret = unsafe { fi::fi_fabric((*info.as_ptr()).fabric_attr, &mut raw, ptr::null_mut()) };
        check(ret as i64, || format!("fi_fabric({})", info.fabric_name()))?;
        Ok(Arc::new(Fabric { raw, info }))
    }

    /// The `fi_info` the fabric was opened from.
    pub fn info(&self) -> &Info {
        &self.info
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: the fid of an open fabric.
        close_fid(unsafe { &mut (*self.raw).fid }, "fabric");
    }
}

/// An open domain (a NIC, or the software provider's equivalent).
pub struct Domain {
    raw: *mut fi::fid_domain,
    fabric: Arc<Fabric>,
    owned: bool,
    /// Next key to request where the provider does not choose keys itself (no FI_MR_PROV_KEY).
    next_key: std::sync::atomic::AtomicU64,
}
// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Send for Domain {}
// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Sync for Domain {}

impl Domain {
    /// Opens the domain of `fabric`'s info.
    pub fn open(fabric: &Arc<Fabric>) -> Result<Arc<Domain>> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid fabric and info.
        let ret =
            unsafe { fi::fi_domain(fabric.raw, fabric.info.as_ptr(), &mut raw, ptr::null_mut()) };
        check(ret as i64, || {
            format!("fi_domain({})", fabric.info.domain_name())
        })?;
        Ok(Arc::new(Domain {
            raw,
            fabric: fabric.clone(),
            owned: true,
            next_key: std::sync::atomic::AtomicU64::new(1),
        }))
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_domain {
        self.raw
    }

    /// The info the domain was opened with.
    pub fn info(&self) -> &Info {
        &self.fabric.info
    }

    /// Opens a provider-specific operations table (`fi_open_ops`).
    ///
    /// # Safety
    /// `name` must name an ops table whose layout the caller knows; the returned pointer is only valid
    /// while the domain is open.
    pub unsafe fn open_ops(&self, name: &std::ffi::CStr) -> Result<*mut c_void> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let mut ops: *mut c_void = ptr::null_mut();
            let ret = fi::fi_open_ops(
                &mut (*self.raw).fid,
                name.as_ptr(),
                0,
                &mut ops,
                ptr::null_mut(),
            );
            check(ret as i64, || {
                format!("fi_open_ops({})", name.to_string_lossy())
            })?;
            Ok(ops)
        }
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: the fid of an open domain we opened.
            close_fid(unsafe { &mut (*self.raw).fid }, "domain");
        }
    }
}

/// An address vector of type FI_AV_TABLE: inserted addresses get consecutive `fi_addr` values.
pub struct AddressVector {
    raw: *mut fi::fid_av,
    _domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE domain objects.
unsafe impl Send for AddressVector {}
// SAFETY: as above.
unsafe impl Sync for AddressVector {}

impl AddressVector {
    /// Opens an AV sized for `count` addresses.
    pub fn open(domain: &Arc<Domain>, count: usize) -> Result<Arc<AddressVector>> {
        // SAFETY: zeroed attr is valid input; fields set below.
        let mut attr: fi::fi_av_attr = unsafe { std::mem::zeroed() };
        attr.type_ = fi::fi_av_type_FI_AV_TABLE;
        attr.count = count;
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain.
        let ret = unsafe { fi::fi_av_open(domain.raw, &mut attr, &mut raw, ptr::null_mut()) };
        check(ret as i64, || "fi_av_open".to_string())?;
        Ok(Arc::new(AddressVector {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Inserts `count` raw endpoint names stored back to back (`names.len() / count` bytes each) and
    /// returns their `fi_addr` values.
    pub fn insert(&self, names: &[u8], count: usize) -> Result<Vec<FiAddr>> {
        if count == 0 || names.len() % count != 0 {
            return Err(Error::invalid(format!(
                "fi_av_insert: {} bytes for {count} names",
                names.len()
            )));
        }
        // shm names are C strings that the provider reads with strlen: a slot without a NUL would
        // make it read past the caller's buffer.
        if self._domain.info().provider_name() == "shm" {
            let len = names.len() / count;
            if let Some(k) = (0..count).find(|k| !names[k * len..(k + 1) * len].contains(&0)) {
                return Err(Error::invalid(format!(
                    "fi_av_insert: shm name {k} is not NUL-terminated"
                )));
            }
        }
        let mut addrs = vec![u64::MAX; count];
        // SAFETY: names holds count addresses; addrs has room for count results.
        let ret = unsafe {
            fi::fi_av_insert(
                self.raw,
                names.as_ptr() as *const c_void,
                count,
                addrs.as_mut_ptr(),
                0,
                ptr::null_mut(),
            )
        };
        if ret < 0 {
            return Err(Error::from_ret(ret as i64, "fi_av_insert"));
        }
        if ret as usize != count || addrs.contains(&u64::MAX) {
            return Err(Error::invalid(format!(
                "fi_av_insert: inserted {ret} of {count} addresses"
            )));
        }
        Ok(addrs)
    }

    /// The fid, for binding.
    fn fid(&self) -> *mut fi::fid {
        // SAFETY: open AV.
        unsafe { &mut (*self.raw).fid }
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        close_fid(self.fid(), "av");
    }
}

/// A completion queue in FI_CQ_FORMAT_DATA.
pub struct CompletionQueue {
    raw: *mut fi::fid_cq,
    _domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE domain objects.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// One completion: the context of the operation, its flags, and remote CQ data if any.
pub type CqEntry = fi::fi_cq_data_entry;

/// One failed completion.
#[derive(Clone, Debug)]
pub struct CqError {
    /// Context of the failed operation.
    pub context: *mut c_void,
    /// Flags of the operation.
    pub flags: u64,
    /// The error, with the provider's text.
    pub error: Error,
}

impl CompletionQueue {
    /// Opens a CQ with room for `size` entries.
    pub fn open(domain: &Arc<Domain>, size: usize) -> Result<Arc<CompletionQueue>> {
        // SAFETY: zeroed attr is valid input.
        let mut attr: fi::fi_cq_attr = unsafe { std::mem::zeroed() };
        attr.size = size;
        attr.format = fi::fi_cq_format_FI_CQ_FORMAT_DATA;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain.
        let ret = unsafe { fi::fi_cq_open(domain.raw, &mut attr, &mut raw, ptr::null_mut()) };
        check(ret as i64, || "fi_cq_open".to_string())?;
        Ok(Arc::new(CompletionQueue {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Reads up to `out.len()` completions (drives progress). `Ok(0)` when there are none; an
    /// `Err(CqError)` when the next completion is an error (it is consumed).
    pub fn read(&self, out: &mut [CqEntry]) -> std::result::Result<usize, CqError> {
        // SAFETY: out has room for out.len() entries of the CQ's format.
        let ret = unsafe { fi::fi_cq_read(self.raw, out.as_mut_ptr() as *mut c_void, out.len()) };
        if ret >= 0 {
            return Ok(ret as usize);
        }
        if ret == -(fi::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if ret == -(fi::FI_EAVAIL as isize) {
            return Err(self.read_error());
        }
        Err(CqError {
            context: ptr::null_mut(),
            flags: 0,
            error: Error::from_ret(ret as i64, "fi_cq_read"),
        })
    }

    fn read_error(&self) -> CqError {
        // SAFETY: zeroed err entry (err_data NULL) is valid input.
        let mut e: fi::fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: valid CQ, e has room for one entry.
        let ret = unsafe { fi::fi_cq_readerr(self.raw, &mut e, 0) };
        if ret < 0 {
            return CqError {
                context: ptr::null_mut(),
                flags: 0,
                error: Error::from_ret(ret as i64, "fi_cq_readerr"),
            };
        }
        // SAFETY: fi_cq_strerror returns a string owned by the CQ or static.
        let detail = unsafe {
            let p = fi::fi_cq_strerror(self.raw, e.prov_errno, e.err_data, ptr::null_mut(), 0);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        CqError {
            context: e.op_context,
            flags: e.flags,
            error: Error::from_ret(
                -(e.err.abs() as i64),
                format!("completion error (prov_errno {}: {detail})", e.prov_errno),
            ),
        }
    }

    fn fid(&self) -> *mut fi::fid {
        // SAFETY: open CQ.
        unsafe { &mut (*self.raw).fid }
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_cq {
        self.raw
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        close_fid(self.fid(), "cq");
    }
}

/// A completion counter.
pub struct Counter {
    raw: *mut fi::fid_cntr,
    _domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE domain objects.
unsafe impl Send for Counter {}
// SAFETY: as above.
unsafe impl Sync for Counter {}

impl Counter {
    /// Opens a counter of completions.
    pub fn open(domain: &Arc<Domain>) -> Result<Arc<Counter>> {
        // SAFETY: zeroed attr is valid input.
        let mut attr: fi::fi_cntr_attr = unsafe { std::mem::zeroed() };
        attr.events = fi::fi_cntr_events_FI_CNTR_EVENTS_COMP;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain.
        let ret = unsafe { fi::fi_cntr_open(domain.raw, &mut attr, &mut raw, ptr::null_mut()) };
        check(ret as i64, || "fi_cntr_open".to_string())?;
        Ok(Arc::new(Counter {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Successful completions so far.
    pub fn read(&self) -> u64 {
        // SAFETY: open counter.
        unsafe { fi::fi_cntr_read(self.raw) }
    }

    /// Failed completions so far.
    pub fn read_err(&self) -> u64 {
        // SAFETY: open counter.
        unsafe { fi::fi_cntr_readerr(self.raw) }
    }

    fn fid(&self) -> *mut fi::fid {
        // SAFETY: open counter.
        unsafe { &mut (*self.raw).fid }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        close_fid(self.fid(), "cntr");
    }
}

/// A registered memory region.
pub struct MemoryRegion {
    raw: *mut fi::fid_mr,
    base: usize,
    len: usize,
    device: bool,
    _domain: Arc<Domain>,
}
// SAFETY: registration handles are immutable after creation.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

/// Where registered memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// CUDA device memory of the given device ordinal.
    Cuda(i32),
}

impl MemoryRegion {
    /// Registers `[base, base+len)` for local and (if `remote`) remote access. For providers that
    /// need it (FI_MR_ENDPOINT) the region is bound to `ep` and enabled.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        remote: bool,
        ep: Option<&Endpoint>,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            if base.is_null() || len == 0 {
                return Err(Error::invalid(format!(
                    "fi_mr_regattr: empty region {base:p}+{len}"
                )));
            }
            let iov = libc::iovec {
                iov_base: base as *mut c_void,
                iov_len: len,
            };
            let mut attr: fi::fi_mr_attr = std::mem::zeroed();
            attr.__bindgen_anon_1.mr_iov = &iov as *const libc::iovec as *const _;
            attr.iov_count = 1;
            if domain.info().mr_mode() & fi::FI_MR_PROV_KEY as u64 == 0 {
                // The application chooses keys: unique within the domain.
                attr.requested_key = domain
                    .next_key
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let mut access = (fi::FI_READ | fi::FI_WRITE | fi::FI_SEND | fi::FI_RECV) as u64;
            if remote {
                access |= (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
            }
            attr.access = access;
            let device = match kind {
                MemKind::Host => {
                    attr.iface = fi::fi_hmem_iface_FI_HMEM_SYSTEM;
                    false
                }
                MemKind::Cuda(dev) => {
                    if !domain.info().has_hmem() {
                        return Err(Error::invalid(format!(
                            "provider {} has no FI_HMEM: cannot register CUDA memory {base:p}",
                            domain.info().provider_name()
                        )));
                    }
                    attr.iface = fi::fi_hmem_iface_FI_HMEM_CUDA;
                    attr.device.cuda = dev;
                    true
                }
            };
            let mut raw = ptr::null_mut();
            // Device memory is registered FI_HMEM_DEVICE_ONLY (as fabtests does): shm then moves it
            // with CUDA IPC instead of its CPU copy protocols, which cannot read GPU memory.
            let flags = if device { fi::FI_HMEM_DEVICE_ONLY } else { 0 };
            let ret = fi::fi_mr_regattr(domain.raw, &attr, flags, &mut raw);
            check(ret as i64, || {
                format!("fi_mr_regattr({base:p}, {len} bytes, {kind:?})")
            })?;
            let mr = MemoryRegion {
                raw,
                base: base as usize,
                len,
                device,
                _domain: domain.clone(),
            };
            if domain.info().mr_endpoint() {
                let ep = ep.ok_or_else(|| {
                    Error::invalid("FI_MR_ENDPOINT provider: registration needs an endpoint")
                })?;
                check(fi::fi_mr_bind(raw, ep.fid(), 0) as i64, || {
                    "fi_mr_bind".to_string()
                })?;
                check(fi::fi_mr_enable(raw) as i64, || "fi_mr_enable".to_string())?;
            }
            Ok(mr)
        }
    }

    /// Remote key.
    pub fn key(&self) -> u64 {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_key(self.raw) }
    }

    /// Local descriptor for data transfer calls.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_desc(self.raw) }
    }

    /// Start address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty (registration refuses empty regions); present for API completeness.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the region is device memory.
    pub fn is_device(&self) -> bool {
        self.device
    }

    /// True if `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_mr {
        self.raw
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: open registration.
        close_fid(unsafe { &mut (*self.raw).fid }, "mr");
    }
}

/// An enabled RDM endpoint bound to an AV, a CQ and a counter.
pub struct Endpoint {
    raw: *mut fi::fid_ep,
    av: Arc<AddressVector>,
    cq: Arc<CompletionQueue>,
    cntr: Option<Arc<Counter>>,
    domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE endpoint.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Opens an endpoint, binds AV, CQ (transmit and receive) and optionally a counter (counting
    /// transmit, read and write completions), and enables it.
    pub fn open(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        cq: &Arc<CompletionQueue>,
        cntr: Option<&Arc<Counter>>,
    ) -> Result<Endpoint> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and info.
        let ret = unsafe {
            fi::fi_endpoint(
                domain.raw,
                domain.info().as_ptr(),
                &mut raw,
                ptr::null_mut(),
            )
        };
        check(ret as i64, || "fi_endpoint".to_string())?;
        let ep = Endpoint {
            raw,
            av: av.clone(),
            cq: cq.clone(),
            cntr: cntr.cloned(),
            domain: domain.clone(),
        };
        // SAFETY: binding open objects of the same domain to the new endpoint.
        unsafe {
            check(fi::fi_ep_bind(raw, av.fid(), 0) as i64, || {
                "fi_ep_bind(av)".to_string()
            })?;
            check(
                fi::fi_ep_bind(raw, cq.fid(), (fi::FI_TRANSMIT | fi::FI_RECV) as u64) as i64,
                || "fi_ep_bind(cq)".to_string(),
            )?;
            if let Some(c) = cntr {
                let flags = (fi::FI_SEND | fi::FI_READ | fi::FI_WRITE) as u64;
                check(fi::fi_ep_bind(raw, c.fid(), flags) as i64, || {
                    "fi_ep_bind(cntr)".to_string()
                })?;
            }
            check(fi::fi_enable(raw) as i64, || "fi_enable".to_string())?;
        }
        Ok(ep)
    }

    /// Raw endpoint name, to be exchanged with peers and inserted into their AVs.
    pub fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf has len bytes.
        let mut ret =
            unsafe { fi::fi_getname(self.fid(), buf.as_mut_ptr() as *mut c_void, &mut len) };
        if ret == -(fi::FI_ETOOSMALL as i32) || (ret != 0 && len > buf.len()) {
            buf.resize(len, 0);
            // SAFETY: buf resized to the length libfabric asked for.
            ret = unsafe { fi::fi_getname(self.fid(), buf.as_mut_ptr() as *mut c_void, &mut len) };
        }
        check(ret as i64, || "fi_getname".to_string())?;
        buf.truncate(len);
        Ok(buf)
    }

    pub(crate) fn fid(&self) -> *mut fi::fid {
        // SAFETY: open endpoint.
        unsafe { &mut (*self.raw).fid }
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_ep {
        self.raw
    }

    /// The AV bound to the endpoint.
    pub fn av(&self) -> &Arc<AddressVector> {
        &self.av
    }

    /// The CQ bound to the endpoint.
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// The counter bound to the endpoint, if any.
    pub fn counter(&self) -> Option<&Arc<Counter>> {
        self.cntr.as_ref()
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// RDMA write of `len` bytes to `(dest, addr, key)`.
    ///
    /// # Safety
    /// `buf` (described by `desc`) and `ctx` must stay valid until the completion is reaped.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_write(
                self.raw,
                buf as *const c_void,
                len,
                desc,
                dest,
                addr,
                key,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_write({len} bytes to {dest}:{addr:#x})")
            })
        }
    }

    /// RDMA write carrying 64 bits of remote CQ data (the target gets a completion with it).
    ///
    /// # Safety
    /// As for `write`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_data(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_writedata(
                self.raw,
                buf as *const c_void,
                len,
                desc,
                data,
                dest,
                addr,
                key,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_writedata({len} bytes to {dest}:{addr:#x})")
            })
        }
    }

    /// RDMA write with explicit flags (FI_INJECT, FI_FENCE, FI_DELIVERY_COMPLETE, ...).
    ///
    /// # Safety
    /// As for `write`; with FI_INJECT the buffer may be reused on return.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_msg(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let mut iov = libc::iovec {
                iov_base: buf as *mut c_void,
                iov_len: len,
            };
            let mut d = desc;
            let mut riov = fi::fi_rma_iov { addr, len, key };
            let mut msg: fi::fi_msg_rma = std::mem::zeroed();
            msg.msg_iov = &mut iov as *mut libc::iovec as *const _;
            msg.desc = &mut d;
            msg.iov_count = 1;
            msg.addr = dest;
            msg.rma_iov = &mut riov;
            msg.rma_iov_count = 1;
            msg.context = ctx;
            let ret = fi::fi_writemsg(self.raw, &msg, flags);
            check(ret as i64, || {
                format!("fi_writemsg({len} bytes to {dest}:{addr:#x}, flags {flags:#x})")
            })
        }
    }

    /// RDMA read of `len` bytes from `(dest, addr, key)` into `buf`.
    ///
    /// # Safety
    /// As for `write`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn read(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_read(
                self.raw,
                buf as *mut c_void,
                len,
                desc,
                dest,
                addr,
                key,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_read({len} bytes from {dest}:{addr:#x})")
            })
        }
    }

    /// Sends a message.
    ///
    /// # Safety
    /// As for `write`.
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_send(self.raw, buf as *const c_void, len, desc, dest, ctx);
            check(ret as i64, || format!("fi_send({len} bytes to {dest})"))
        }
    }

    /// Posts a receive buffer (from any source).
    ///
    /// # Safety
    /// As for `write`.
    pub unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_recv(self.raw, buf as *mut c_void, len, desc, u64::MAX, ctx);
            check(ret as i64, || format!("fi_recv({len} bytes)"))
        }
    }

    /// Whether the provider supports `op` on `datatype` (non-fetching, fetching, compare forms).
    pub fn atomic_valid(&self, datatype: fi::fi_datatype, op: fi::fi_op) -> (bool, bool, bool) {
        let mut count = 0usize;
        // SAFETY: queries only.
        unsafe {
            let a = fi::fi_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            let f = fi::fi_fetch_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            let c =
                fi::fi_compare_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            (a, f, c)
        }
    }

    /// Non-fetching atomic on one element.
    ///
    /// # Safety
    /// As for `write` (`buf` holds the operand).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn atomic(
        &self,
        buf: *const u8,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        dt: fi::fi_datatype,
        op: fi::fi_op,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_atomic(
                self.raw,
                buf as *const c_void,
                1,
                desc,
                dest,
                addr,
                key,
                dt,
                op,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_atomic(op {op}, dt {dt}, {dest}:{addr:#x})")
            })
        }
    }

    /// Fetching atomic on one element; the old value lands in `result`.
    ///
    /// # Safety
    /// As for `write` (`buf` holds the operand, `result` receives the old value).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fetch_atomic(
        &self,
        buf: *const u8,
        desc: *mut c_void,
        result: *mut u8,
        result_desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        dt: fi::fi_datatype,
        op: fi::fi_op,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_fetch_atomic(
                self.raw,
                buf as *const c_void,
                1,
                desc,
                result as *mut c_void,
                result_desc,
                dest,
                addr,
                key,
                dt,
                op,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_fetch_atomic(op {op}, dt {dt}, {dest}:{addr:#x})")
            })
        }
    }

    /// Compare-and-swap on one element; the old value lands in `result`.
    ///
    /// # Safety
    /// As for `fetch_atomic`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_atomic(
        &self,
        buf: *const u8,
        desc: *mut c_void,
        compare: *const u8,
        compare_desc: *mut c_void,
        result: *mut u8,
        result_desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        dt: fi::fi_datatype,
        ctx: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            let ret = fi::fi_compare_atomic(
                self.raw,
                buf as *const c_void,
                1,
                desc,
                compare as *const c_void,
                compare_desc,
                result as *mut c_void,
                result_desc,
                dest,
                addr,
                key,
                dt,
                fi::fi_op_FI_CSWAP,
                ctx,
            );
            check(ret as i64, || {
                format!("fi_compare_atomic(dt {dt}, {dest}:{addr:#x})")
            })
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        close_fid(self.fid(), "ep");
    }
}
