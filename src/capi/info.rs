//! Small queries for tools and the Python package (`nvshmem-efa-gda info`, `nvshmem_efa_gda`):
//! which NVSHMEM transport ABI majors this library serves and which CUDA driver is installed.
use std::ffi::c_int;

use super::ffi_guard;
use crate::nvshmem::abi::SERVED_MAJORS;

/// Copies the NVSHMEM transport ABI majors this library serves (ascending) into `out`, at most
/// `cap` of them, and returns how many it serves (which may exceed `cap`: call again with more room).
/// `out` may be NULL when `cap` is 0. Returns -1 when `out` is NULL and `cap` is not 0.
///
/// # Safety
/// `out` must point to `cap` writable `int`s when `cap` is not 0.
#[no_mangle]
pub unsafe extern "C" fn nvshmem_efa_gda_served_abi_majors(out: *mut c_int, cap: usize) -> c_int {
    ffi_guard("nvshmem_efa_gda_served_abi_majors", -1, || {
        if out.is_null() && cap != 0 {
            tracing::error!("nvshmem_efa_gda_served_abi_majors: NULL output with capacity {cap}");
            return -1;
        }
        for (i, m) in SERVED_MAJORS.iter().take(cap).enumerate() {
            // SAFETY: i < cap and the caller guarantees `cap` writable ints at `out`.
            unsafe { *out.add(i) = *m };
        }
        SERVED_MAJORS.len() as c_int
    })
}

/// The installed CUDA driver's version (`cuDriverGetVersion`, e.g. 13000 for CUDA 13.0), or 0 when
/// no CUDA driver library can be loaded. Does not initialise CUDA.
#[no_mangle]
pub extern "C" fn nvshmem_efa_gda_cuda_driver_version() -> c_int {
    ffi_guard("nvshmem_efa_gda_cuda_driver_version", 0, || {
        cuda_driver_version().unwrap_or(0)
    })
}

/// The CUDA driver version, `None` when libcuda cannot be loaded or does not answer.
pub fn cuda_driver_version() -> Option<i32> {
    crate::cuda::driver_version()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_majors_are_copied_and_counted() {
        let mut buf = [0 as c_int; 16];
        // SAFETY: buf holds 16 ints.
        let n = unsafe { nvshmem_efa_gda_served_abi_majors(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n as usize, SERVED_MAJORS.len());
        assert_eq!(&buf[..n as usize], SERVED_MAJORS);
        assert!(
            SERVED_MAJORS.contains(&3),
            "NVSHMEM 3.4 (ABI 3) must be served"
        );
        // SAFETY: cap 0 with NULL is allowed.
        let n0 = unsafe { nvshmem_efa_gda_served_abi_majors(std::ptr::null_mut(), 0) };
        assert_eq!(n0, n);
        let mut one = [0 as c_int; 1];
        // SAFETY: one holds 1 int.
        let n1 = unsafe { nvshmem_efa_gda_served_abi_majors(one.as_mut_ptr(), 1) };
        assert_eq!(n1, n);
        assert_eq!(one[0], SERVED_MAJORS[0]);
        // SAFETY: NULL with a capacity is refused, nothing is written.
        assert_eq!(
            unsafe { nvshmem_efa_gda_served_abi_majors(std::ptr::null_mut(), 4) },
            -1
        );
    }

    #[test]
    fn driver_version_is_zero_or_plausible() {
        let v = nvshmem_efa_gda_cuda_driver_version();
        assert!(v == 0 || (9000..100000).contains(&v), "driver version {v}");
        assert_eq!(cuda_driver_version().unwrap_or(0), v);
    }
}
