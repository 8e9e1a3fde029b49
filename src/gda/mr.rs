//! Memory registrations the GDA code makes on its own endpoint's domain.
//!
//! Providers without `FI_MR_PROV_KEY` (tcp;ofi_rxm and shm among them) take the key from the caller
//! (`requested_key`) and refuse a second registration with a key already in use in the domain
//! (`-FI_ENOKEY`). Every registration made here therefore asks for a key drawn from a process-wide
//! counter in a range of its own, so it never collides with the transport's registrations or with
//! another queue's. Providers with `FI_MR_PROV_KEY` ignore the request and choose the key.
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cuda::{self, PtrKind};
use crate::fabric::{sys as fi, Domain, Error as FabricError};

use super::error::{GdaError, Result};

/// First key this module requests (a range the transport does not use).
const KEY_BASE: u64 = 0x4744_4100_0000;
static NEXT_KEY: AtomicU64 = AtomicU64::new(KEY_BASE);

/// An owned registration (closed on drop). Keeps its domain open.
pub struct OwnedMr {
    raw: *mut fi::fid_mr,
    base: u64,
    len: u64,
    device: bool,
    _domain: Arc<Domain>,
}

// SAFETY: a registration handle is immutable after creation; libfabric objects of an FI_THREAD_SAFE
// domain may be used from any thread.
unsafe impl Send for OwnedMr {}
// SAFETY: as above.
unsafe impl Sync for OwnedMr {}

impl OwnedMr {
    /// Registers `[base, base+len)` for local and remote access, as host or CUDA memory according to
    /// `cuda::pointer_kind`. `ep` is bound and the registration enabled where the provider asks
    /// for it (`FI_MR_ENDPOINT`).
    ///
    /// # Safety
    /// The memory must stay allocated until the registration is dropped; `ep`, when given, must be an
    /// open endpoint of `domain`.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        base: u64,
        len: u64,
        ep: Option<*mut fi::fid_ep>,
    ) -> Result<OwnedMr> {
        if base == 0 || len == 0 {
            return Err(GdaError::invalid(format!(
                "cannot register an empty region {base:#x}+{len}"
            )));
        }
        let kind = cuda::pointer_kind(base as *const c_void);
        let info = domain.info();
        let iov = libc::iovec {
            iov_base: base as *mut c_void,
            iov_len: len as usize,
        };
        // SAFETY: an all-zero fi_mr_attr is a valid starting point; fields are set below.
        let mut attr: fi::fi_mr_attr = unsafe { std::mem::zeroed() };
        attr.__bindgen_anon_1.mr_iov = &iov as *const libc::iovec as *const _;
        attr.iov_count = 1;
        attr.access = (fi::FI_READ
            | fi::FI_WRITE
            | fi::FI_SEND
            | fi::FI_RECV
            | fi::FI_REMOTE_READ
            | fi::FI_REMOTE_WRITE) as u64;
        attr.requested_key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let device = match kind {
            PtrKind::Host => {
                attr.iface = fi::fi_hmem_iface_FI_HMEM_SYSTEM;
                false
            }
            PtrKind::Device { ordinal, .. } => {
                if !info.has_hmem() {
                    return Err(GdaError::unsupported(format!(
                        "provider {} has no FI_HMEM: cannot register CUDA memory {base:#x}",
                        info.provider_name()
                    )));
                }
                attr.iface = fi::fi_hmem_iface_FI_HMEM_CUDA;
                attr.device.cuda = ordinal;
                true
            }
        };
        let mut raw: *mut fi::fid_mr = ptr::null_mut();
        // SAFETY: valid domain, attr and iov live across the call; raw receives the new object.
        let ret = unsafe { fi::fi_mr_regattr(domain.as_ptr(), &attr, 0, &mut raw) };
        if ret != 0 {
            return Err(FabricError::from_ret(
                ret as i64,
                format!("fi_mr_regattr({base:#x}, {len} bytes, {kind:?})"),
            )
            .into());
        }
        let mr = OwnedMr {
            raw,
            base,
            len,
            device,
            _domain: domain.clone(),
        };
        if info.mr_endpoint() {
            let ep = ep.ok_or_else(|| {
                GdaError::invalid("FI_MR_ENDPOINT provider: registration needs an endpoint")
            })?;
            // SAFETY: open registration and endpoint of the same domain.
            unsafe {
                let r = fi::fi_mr_bind(raw, &mut (*ep).fid, 0);
                if r != 0 {
                    return Err(FabricError::from_ret(r as i64, "fi_mr_bind").into());
                }
                let r = fi::fi_mr_enable(raw);
                if r != 0 {
                    return Err(FabricError::from_ret(r as i64, "fi_mr_enable").into());
                }
            }
        }
        Ok(mr)
    }

    /// Local descriptor for data-transfer calls.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_desc(self.raw) }
    }

    /// Remote key.
    pub fn key(&self) -> u64 {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_key(self.raw) }
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_mr {
        self.raw
    }

    /// Start address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this is CUDA memory.
    pub fn is_device(&self) -> bool {
        self.device
    }
}

impl Drop for OwnedMr {
    fn drop(&mut self) {
        // SAFETY: the fid of an open registration, closed once.
        let ret = unsafe { fi::fi_close(&mut (*self.raw).fid) };
        if ret != 0 {
            tracing::warn!("{}", FabricError::from_ret(ret as i64, "fi_close(mr)"));
        }
    }
}
