//! Completion queues (FI_CQ_FORMAT_DATA).
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::domain::{close_fid, Domain};
use super::error::{Error, Result};
use super::handle::CqHandle;

/// A completion queue in FI_CQ_FORMAT_DATA.
pub struct CompletionQueue {
    pub(super) raw: *mut fi::fid_cq,
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
        let raw = domain.open_object(fi::fi_cq_open, &mut attr, "fi_cq_open")?;
        Ok(Arc::new(CompletionQueue {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Takes ownership of a CQ opened by a provider extension on `domain`.
    ///
    /// # Safety
    /// `raw` must be an open CQ of `domain` that nothing else closes.
    pub(super) unsafe fn from_raw(
        domain: &Arc<Domain>,
        raw: *mut fi::fid_cq,
    ) -> Arc<CompletionQueue> {
        Arc::new(CompletionQueue {
            raw,
            _domain: domain.clone(),
        })
    }

    /// A non-owning handle of the CQ (valid while `self` lives).
    pub fn handle(&self) -> CqHandle {
        CqHandle(self.raw)
    }

    /// Reads up to `out.len()` completions (drives progress). `Ok(0)` when there are none; an
    /// `Err(CqError)` when the next completion is an error (it is consumed).
    pub fn read(&self, out: &mut [CqEntry]) -> std::result::Result<usize, CqError> {
        // SAFETY: out has room for out.len() entries of the CQ's format.
        let ret = unsafe { fi::fi_cq_read(self.raw, out.as_mut_ptr() as *mut c_void, out.len()) };
        self.read_result(ret, "fi_cq_read")
    }

    /// [`CompletionQueue::read`] with each completion's source address (`FI_ADDR_NOTAVAIL` where the
    /// provider does not know it); `src` must be at least as long as `out`.
    pub fn read_from(
        &self,
        out: &mut [CqEntry],
        src: &mut [super::domain::FiAddr],
    ) -> std::result::Result<usize, CqError> {
        let n = out.len().min(src.len());
        // SAFETY: out and src have room for n entries each.
        let ret = unsafe {
            fi::fi_cq_readfrom(
                self.raw,
                out.as_mut_ptr() as *mut c_void,
                n,
                src.as_mut_ptr(),
            )
        };
        self.read_result(ret, "fi_cq_readfrom")
    }

    /// What a read call's return value means: completions read, none (`-FI_EAGAIN`), the next
    /// error completion (`-FI_EAVAIL`, consumed here), or the call's own failure.
    fn read_result(&self, ret: isize, call: &str) -> std::result::Result<usize, CqError> {
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
            error: Error::from_ret(ret as i64, call),
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

    pub(super) fn fid(&self) -> *mut fi::fid {
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
