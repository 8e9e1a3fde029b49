//! Every `extern "C"` entry point. Each one runs its body inside [`ffi_guard`]: a panic never unwinds
//! into C; it is logged and turned into an error code. Argument checks happen here, before the safe
//! implementation runs.
mod bench_null;
pub mod gda;
pub mod info;
pub mod transport;

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success (NVSHMEMX_SUCCESS).
///
/// One error vocabulary at the C boundary: every function of this header that returns a status (the
/// NVSHMEM host ops and `nvshmemt_init`, and the GDA C API `nvshmemt_efa_gda_*`) returns 0 or one of
/// the positive `NVSHMEM_EFA_ERROR_*` codes, never an errno. A code NVSHMEM has carries NVSHMEM's own
/// number (`enum nvshmemx_status` in NVSHMEM's `non_abi/nvshmemx_error.h`: INVALID_VALUE 1,
/// OUT_OF_MEMORY 2, NOT_SUPPORTED 3, INTERNAL 7); the library's own codes start at 100, above
/// NVSHMEM's range. `nvshmem_efa_gda_last_error()` gives the text of this thread's last GDA failure.
/// Not statuses: `nvshmemt_efa_gda_mode()` returns the mode (0, 1, 2) or -1 without a context.
/// The device API of `cuda/` has codes of its own (`NVSHMEM_EFA_GDA_ERR_*` of device functions,
/// `NVSHMEM_EFA_GDA_LOAD_*`, `NVSHMEM_EFA_GDA_IBGDA_SETUP_*`), a separate vocabulary.
pub const NVSHMEM_EFA_SUCCESS: i32 = 0;
/// Bad argument (NVSHMEMX_ERROR_INVALID_VALUE).
pub const NVSHMEM_EFA_ERROR_INVALID_VALUE: i32 = 1;
/// Memory could not be allocated (NVSHMEMX_ERROR_OUT_OF_MEMORY).
pub const NVSHMEM_EFA_ERROR_OUT_OF_MEMORY: i32 = 2;
/// Not available here: GDA is off, the provider has no GDA ops, the software queue on an endpoint
/// the caller owns (NVSHMEMX_ERROR_NOT_SUPPORTED).
pub const NVSHMEM_EFA_ERROR_NOT_SUPPORTED: i32 = 3;
/// Generic failure: a libfabric, CUDA or driver call failed, or a panic was caught
/// (NVSHMEMX_ERROR_INTERNAL). Every NVSHMEM host op and `nvshmemt_init` returns 0, this or
/// [`NVSHMEM_EFA_ERROR_INVALID_VALUE`]; nothing else.
pub const NVSHMEM_EFA_ERROR_INTERNAL: i32 = 7;
/// (This library's own, no NVSHMEM counterpart.) GDA is not initialised: no context is current.
pub const NVSHMEM_EFA_ERROR_NOT_INITIALIZED: i32 = 100;
/// (This library's own.) Already set up differently: GDA initialised on another domain, or
/// connected with another PE numbering.
pub const NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED: i32 = 101;
/// (This library's own.) The caller's buffer is too small; the size needed was returned.
pub const NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL: i32 = 102;
/// (This library's own.) Nothing to act on: no heap chunk starts at the given offset.
pub const NVSHMEM_EFA_ERROR_NOT_FOUND: i32 = 103;

// The published codes are NVSHMEM's own numbers, which the transport's statuses use too.
const _: () = {
    use crate::nvshmem::abi::status;
    assert!(NVSHMEM_EFA_SUCCESS == status::SUCCESS);
    assert!(NVSHMEM_EFA_ERROR_INVALID_VALUE == status::INVALID_VALUE);
    assert!(NVSHMEM_EFA_ERROR_OUT_OF_MEMORY == status::OUT_OF_MEMORY);
    assert!(NVSHMEM_EFA_ERROR_NOT_SUPPORTED == status::NOT_SUPPORTED);
    assert!(NVSHMEM_EFA_ERROR_INTERNAL == status::INTERNAL);
};

thread_local! {
    /// Text of this thread's last failure of a GDA C API call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (an interior NUL ends the text there).
pub(crate) fn set_last_error(message: &str) {
    let text = message.split('\0').next().unwrap_or_default();
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The text of this thread's last failed `nvshmemt_efa_gda_*` call ("" when none failed yet): what
/// failed and why, the message the library also logs. The pointer stays valid until the next
/// failing GDA call on this thread; copy the text to keep it.
#[no_mangle]
pub extern "C" fn nvshmem_efa_gda_last_error() -> *const libc::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs `f`, turning a panic into `on_panic` after logging it with the entry point's name.
pub fn ffi_guard<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    crate::log::init();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = crate::log::panic_message(p.as_ref());
            tracing::error!("{name}: internal error (panic): {msg}");
            on_panic
        }
    }
}

/// The library's version string (static, NUL-terminated).
#[no_mangle]
pub extern "C" fn nvshmem_efa_gda_version() -> *const libc::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const libc::c_char
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_error_codes() {
        let r = ffi_guard("test", -1, || -> i32 { panic!("boom") });
        assert_eq!(r, -1);
        assert_eq!(ffi_guard("test", -1, || 5), 5);
    }

    #[test]
    fn last_error_is_per_thread_text() {
        set_last_error("first");
        set_last_error("bad \0 tail");
        // SAFETY: the thread's own NUL-terminated string, unchanged until the next failure here.
        let s = unsafe { std::ffi::CStr::from_ptr(nvshmem_efa_gda_last_error()) };
        assert_eq!(s.to_str().unwrap(), "bad ");
        let other = std::thread::spawn(|| {
            // SAFETY: as above, on that thread.
            let s = unsafe { std::ffi::CStr::from_ptr(nvshmem_efa_gda_last_error()) };
            s.to_str().unwrap().to_owned()
        });
        assert_eq!(other.join().unwrap(), "");
    }

    #[test]
    fn version_is_nul_terminated() {
        // SAFETY: static string.
        let s = unsafe { std::ffi::CStr::from_ptr(nvshmem_efa_gda_version()) };
        assert_eq!(s.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
