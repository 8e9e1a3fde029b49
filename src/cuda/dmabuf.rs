//! GPU memory exported as a dmabuf file descriptor, for a NIC to register
//! (`cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ...)`).
//!
//! The exported range is the registered range widened to host pages, not the allocation that holds
//! it: `cuMemGetAddressRange` answers with one mapping of a CUDA VMM range (NVSHMEM maps its heap
//! chunk by chunk), and `cuMemGetHandleForAddressRange` asks only for page alignment. libfabric's
//! own export does the same since ofiwg/libfabric#12473 (backported to 2.4.x-2.6.x). A VMM
//! allocation exports only if it was created `gpuDirectRDMACapable`; the driver's refusal is the
//! error returned.
use std::os::fd::{FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::{check, require, CudaError, CudaResult};

/// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (CUDA 12.8): map the dmabuf through the PCIe BAR,
/// as a NIC needs. Older drivers refuse the flag; the export is then retried without it, as
/// libfabric does.
const MAPPING_TYPE_PCIE: std::ffi::c_ulonglong = 1;

/// A range of GPU memory exported as a dmabuf.
#[derive(Debug)]
pub struct DmabufRange {
    /// The dmabuf (closed on drop; a NIC registration holds its own reference).
    pub fd: OwnedFd,
    /// Start of the exported range (page-aligned): byte 0 of the dmabuf.
    pub base: u64,
    /// Offset of the requested address in the dmabuf.
    pub offset: u64,
    /// Length of the exported range (whole pages).
    pub span: u64,
}

/// `[ptr, ptr + len)` widened to whole pages of `page` bytes: `(start, span)`; `None` for an empty
/// or wrapping range or a page size that is not a power of two.
pub fn page_span(ptr: u64, len: u64, page: u64) -> Option<(u64, u64)> {
    if len == 0 || !page.is_power_of_two() {
        return None;
    }
    let start = ptr & !(page - 1);
    let end = ptr.checked_add(len)?.checked_add(page - 1)? & !(page - 1);
    Some((start, end - start))
}

/// The host page size.
fn host_page() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

/// Exports `[ptr, ptr + len)` (GPU memory of the current context's device) as a dmabuf.
pub fn export(ptr: u64, len: u64) -> CudaResult<DmabufRange> {
    require("cuMemGetHandleForAddressRange")?;
    let (base, span) = page_span(ptr, len, host_page()).ok_or_else(|| CudaError {
        code: sys::CUresult::CUDA_ERROR_INVALID_VALUE as i32,
        context: format!("dmabuf export of {ptr:#x}+{len}: empty or wrapping range"),
    })?;
    let mut fd: libc::c_int = -1;
    let attempt = |flags, fd: &mut libc::c_int| {
        // SAFETY: for the dmabuf handle type the driver writes one int into `fd`; the range is
        // page-aligned (page_span).
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                fd as *mut libc::c_int as *mut std::ffi::c_void,
                base,
                span as usize,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                flags,
            )
        }
    };
    let mut r = attempt(MAPPING_TYPE_PCIE, &mut fd);
    if matches!(
        r,
        sys::CUresult::CUDA_ERROR_INVALID_VALUE | sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
    ) {
        r = attempt(0, &mut fd);
    }
    check(r, || {
        format!(
            "cuMemGetHandleForAddressRange({base:#x}, {span} bytes, DMA_BUF_FD) for {ptr:#x}+{len} \
             (a CUDA VMM allocation exports only when created gpuDirectRDMACapable)"
        )
    })?;
    if fd < 0 {
        return Err(CudaError {
            code: 0,
            context: format!("cuMemGetHandleForAddressRange({base:#x}) gave descriptor {fd}"),
        });
    }
    Ok(DmabufRange {
        // SAFETY: the driver just created this descriptor for us; nothing else owns it.
        fd: unsafe { OwnedFd::from_raw_fd(fd) },
        base,
        offset: ptr - base,
        span,
    })
}

/// The current context's device, `None` without a CUDA driver or a current context.
pub fn current_device() -> Option<i32> {
    require("cuCtxGetDevice").ok()?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one int; fails without a current context.
    (unsafe { sys::cuCtxGetDevice(&mut dev) } == sys::CUresult::CUDA_SUCCESS).then_some(dev)
}

/// Whether device `ordinal` exports memory as dmabuf (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: the
/// driver, kernel and GPU support it).
pub fn device_supports(ordinal: i32) -> CudaResult<bool> {
    require("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)")?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device handle.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal) }, || {
        format!("cuDeviceGet({ordinal})")
    })?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: writes one int.
    check(
        unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                dev,
            )
        },
        || format!("cuDeviceGetAttribute(DMA_BUF_SUPPORTED, device {ordinal})"),
    )?;
    Ok(v != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_whole_pages() {
        assert_eq!(page_span(0x1000, 1, 4096), Some((0x1000, 0x1000)));
        assert_eq!(page_span(0x1fff, 2, 4096), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x1234, 0x1000, 4096), Some((0x1000, 0x2000)));
        assert_eq!(
            page_span(0x20_0000, 0x20_0000, 4096),
            Some((0x20_0000, 0x20_0000))
        );
        assert_eq!(page_span(0x1000, 0, 4096), None);
        assert_eq!(page_span(u64::MAX - 10, 5, 4096), None);
        assert_eq!(page_span(0x1000, 1, 3000), None);
    }
}
