//! Memory registration: one region type that owns its registration and knows its memory kind
//! (host or CUDA device), decided once by the caller and carried from then on.
//!
//! Providers without `FI_MR_PROV_KEY` (tcp;ofi_rxm and shm among them) take the key from the
//! application and refuse a second registration with a key already in use in the domain
//! (`-FI_ENOKEY`). [`MemoryRegion::register`] draws keys from the domain's counter;
//! [`MemoryRegion::register_reserved`] (the GDA queues' registrations) from a process-wide range of
//! its own, so they never collide with the transport's registrations or with another queue's, even
//! on a domain object the transport holds separately.
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::domain::{close_fid, Domain};
use super::endpoint::Endpoint;
use super::error::{check, Error, Result};
use super::handle::MrHandle;

/// First key [`MemoryRegion::register_reserved`] requests (a range the transport does not use).
const RESERVED_KEY_BASE: u64 = 0x4744_4100_0000;
static NEXT_RESERVED_KEY: AtomicU64 = AtomicU64::new(RESERVED_KEY_BASE);

/// Where registered memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// CUDA device memory of the given device ordinal.
    Cuda(i32),
}

impl MemKind {
    /// Whether this is CUDA device memory.
    pub fn is_device(self) -> bool {
        matches!(self, MemKind::Cuda(_))
    }
}

/// A registered memory region (closed on drop; keeps its domain open).
pub struct MemoryRegion {
    raw: *mut fi::fid_mr,
    base: usize,
    len: usize,
    kind: MemKind,
    _domain: Arc<Domain>,
}
// SAFETY: registration handles are immutable after creation.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

/// How one registration is made.
struct Request {
    access: u64,
    /// Key to request (always passed; providers with FI_MR_PROV_KEY ignore it).
    key: Option<u64>,
    /// Register device memory FI_HMEM_DEVICE_ONLY.
    device_only: bool,
    /// Code of the error for CUDA memory on a provider without FI_HMEM.
    no_hmem_code: i32,
}

impl MemoryRegion {
    /// Registers `[base, base+len)` for local and (if `remote`) remote access. For providers that
    /// need it (FI_MR_ENDPOINT) the region is bound to `ep` and enabled. Device memory is registered
    /// `FI_HMEM_DEVICE_ONLY` (as fabtests does): shm then moves it with CUDA IPC instead of its CPU
    /// copy protocols, which cannot read GPU memory.
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
        let mut access = (fi::FI_READ | fi::FI_WRITE | fi::FI_SEND | fi::FI_RECV) as u64;
        if remote {
            access |= (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        }
        let key = (domain.info().mr_mode() & fi::FI_MR_PROV_KEY as u64 == 0).then(|| {
            // The application chooses keys: unique within the domain.
            domain.next_key.fetch_add(1, Ordering::Relaxed)
        });
        let req = Request {
            access,
            key,
            device_only: true,
            no_hmem_code: -libc::EINVAL,
        };
        // SAFETY: forwarded contract.
        unsafe { Self::register_with(domain, base, len, kind, ep, req) }
    }

    /// Registers `[base, base+len)` for local and remote access with a key from the reserved
    /// process-wide range (see the module documentation), without `FI_HMEM_DEVICE_ONLY`. CUDA
    /// memory on a provider without FI_HMEM is refused with `-EOPNOTSUPP`.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped.
    pub unsafe fn register_reserved(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        ep: Option<&Endpoint>,
    ) -> Result<MemoryRegion> {
        let req = Request {
            access: (fi::FI_READ
                | fi::FI_WRITE
                | fi::FI_SEND
                | fi::FI_RECV
                | fi::FI_REMOTE_READ
                | fi::FI_REMOTE_WRITE) as u64,
            key: Some(NEXT_RESERVED_KEY.fetch_add(1, Ordering::Relaxed)),
            device_only: false,
            no_hmem_code: -libc::EOPNOTSUPP,
        };
        // SAFETY: forwarded contract.
        unsafe { Self::register_with(domain, base, len, kind, ep, req) }
    }

    /// # Safety
    /// As for [`MemoryRegion::register`].
    unsafe fn register_with(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        ep: Option<&Endpoint>,
        req: Request,
    ) -> Result<MemoryRegion> {
        if base.is_null() || len == 0 {
            return Err(Error::invalid(format!(
                "fi_mr_regattr: empty region {base:p}+{len}"
            )));
        }
        let iov = libc::iovec {
            iov_base: base as *mut c_void,
            iov_len: len,
        };
        // SAFETY: an all-zero fi_mr_attr is a valid starting point; fields are set below.
        let mut attr: fi::fi_mr_attr = unsafe { std::mem::zeroed() };
        attr.__bindgen_anon_1.mr_iov = &iov as *const libc::iovec as *const _;
        attr.iov_count = 1;
        attr.access = req.access;
        if let Some(k) = req.key {
            attr.requested_key = k;
        }
        match kind {
            MemKind::Host => attr.iface = fi::fi_hmem_iface_FI_HMEM_SYSTEM,
            MemKind::Cuda(dev) => {
                if !domain.info().has_hmem() {
                    return Err(Error {
                        code: req.no_hmem_code,
                        context: format!(
                            "provider {} has no FI_HMEM: cannot register CUDA memory {base:p}",
                            domain.info().provider_name()
                        ),
                    });
                }
                attr.iface = fi::fi_hmem_iface_FI_HMEM_CUDA;
                attr.device.cuda = dev;
            }
        }
        let flags = if kind.is_device() && req.device_only {
            fi::FI_HMEM_DEVICE_ONLY
        } else {
            0
        };
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain; attr and iov live across the call; raw receives the new object.
        let ret = unsafe { fi::fi_mr_regattr(domain.raw, &attr, flags, &mut raw) };
        check(ret as i64, || {
            format!("fi_mr_regattr({base:p}, {len} bytes, {kind:?})")
        })?;
        let mr = MemoryRegion {
            raw,
            base: base as usize,
            len,
            kind,
            _domain: domain.clone(),
        };
        if domain.info().mr_endpoint() {
            let ep = ep.ok_or_else(|| {
                Error::invalid("FI_MR_ENDPOINT provider: registration needs an endpoint")
            })?;
            // SAFETY: open registration and endpoint of the same domain.
            unsafe {
                check(fi::fi_mr_bind(raw, ep.fid(), 0) as i64, || {
                    "fi_mr_bind".to_string()
                })?;
                check(fi::fi_mr_enable(raw) as i64, || "fi_mr_enable".to_string())?;
            }
        }
        Ok(mr)
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

    /// Where the memory lives (as given at registration).
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// Whether the region is device memory.
    pub fn is_device(&self) -> bool {
        self.kind.is_device()
    }

    /// True if `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }

    /// A non-owning handle of the registration (valid while `self` lives).
    pub fn handle(&self) -> MrHandle {
        MrHandle(self.raw)
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
