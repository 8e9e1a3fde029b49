//! Every `extern "C"` entry point. Each one runs its body inside [`ffi_guard`]: a panic never unwinds
//! into C; it is logged and turned into an error code. Argument checks happen here, before the safe
//! implementation runs.
pub mod gda;
pub mod info;
pub mod transport;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Generic failure (NVSHMEMX_ERROR_INTERNAL in NVSHMEM's numbering). Every NVSHMEM host op and
/// `nvshmemt_init` returns 0, this or [`NVSHMEM_EFA_ERROR_INVALID_VALUE`]; nothing else. (The GDA C
/// API, `nvshmemt_efa_gda_*`, keeps its documented negative errno values.)
pub const NVSHMEM_EFA_ERROR_INTERNAL: i32 = 7;
/// Bad argument (NVSHMEMX_ERROR_INVALID_VALUE).
pub const NVSHMEM_EFA_ERROR_INVALID_VALUE: i32 = 2;

// The published codes are NVSHMEM's own numbers, which the transport's statuses use too.
const _: () = {
    assert!(NVSHMEM_EFA_ERROR_INTERNAL == crate::nvshmem::abi::status::INTERNAL);
    assert!(NVSHMEM_EFA_ERROR_INVALID_VALUE == crate::nvshmem::abi::status::INVALID_VALUE);
};

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
    fn version_is_nul_terminated() {
        // SAFETY: static string.
        let s = unsafe { std::ffi::CStr::from_ptr(nvshmem_efa_gda_version()) };
        assert_eq!(s.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
