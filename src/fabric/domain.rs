//! Fabric and domain: the objects everything else is opened from. Ownership runs one way: every
//! object holds an `Arc` of what it was opened from, so a domain never closes before its endpoints,
//! and a fabric never before its domains.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::error::{check, Error, Result};
use super::handle::DomainHandle;
use super::info::Info;

/// libfabric address handle (`fi_addr_t`).
pub type FiAddr = u64;

pub(super) fn close_fid(fid: *mut fi::fid, what: &str) {
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
    pub(super) raw: *mut fi::fid_fabric,
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
    pub(super) raw: *mut fi::fid_domain,
    pub(super) fabric: Arc<Fabric>,
    owned: bool,
    /// Next key to request where the provider does not choose keys itself (no FI_MR_PROV_KEY).
    pub(super) next_key: std::sync::atomic::AtomicU64,
}
// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Send for Domain {}
// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Sync for Domain {}

/// The form of libfabric's `fi_av_open`, `fi_cq_open` and `fi_cntr_open`: domain, attributes of
/// the object, where to store it, context.
pub(super) type OpenFn<A, T> =
    unsafe extern "C" fn(*mut fi::fid_domain, *mut A, *mut *mut T, *mut c_void) -> std::ffi::c_int;

impl Domain {
    /// Opens an object of this domain with `open` and `attr`; `what` names the call in the error.
    pub(super) fn open_object<A, T>(
        &self,
        open: OpenFn<A, T>,
        attr: &mut A,
        what: &str,
    ) -> Result<*mut T> {
        let mut raw = ptr::null_mut();
        // SAFETY: an open domain and attributes of the object `open` creates; writes one handle.
        let ret = unsafe { open(self.raw, attr, &mut raw, ptr::null_mut()) };
        check(ret as i64, || what.to_string())?;
        Ok(raw)
    }

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

    /// A non-owning handle of the domain (valid while `self` lives).
    pub fn handle(&self) -> DomainHandle {
        DomainHandle(self.raw)
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
