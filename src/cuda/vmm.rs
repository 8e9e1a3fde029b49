//! CUDA VMM memory (`cuMemCreate` + `cuMemMap`) shared with another process of the same host:
//! export a range as POSIX file descriptors, one per physical allocation mapped in it, and map such
//! descriptors into this process.
//!
//! A VMM range is a run of mappings, each of one physical allocation (NVSHMEM maps its heap chunk by
//! chunk). `cuMemGetAddressRange` answers with the mapping that holds an address, so [`export`]
//! walks the range mapping by mapping: `cuMemRetainAllocationHandle` gives the allocation,
//! `cuMemExportToShareableHandle` its descriptor (only for allocations created with
//! `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` among their requested handle types). The importer
//! ([`VmmMapping::import`]) reserves one address range as long as the exporter's run of mappings and
//! maps each allocation at its offset, read/write for its current device.
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::ipc::{allocation_range, ExportError};
use super::{check, current_context, require, ContextGuard, CudaError, CudaResult};

/// One physical allocation of an exported range: mapped at `offset` from the range's start for
/// `len` bytes, shared as `fd`.
#[derive(Debug)]
pub struct VmmPiece {
    /// Offset from the first mapping's base.
    pub offset: u64,
    /// Length of the mapping.
    pub len: u64,
    /// The allocation as a POSIX file descriptor (closed on drop).
    pub fd: OwnedFd,
}

/// An exported VMM range: the mappings that cover a registered region, whole.
#[derive(Debug)]
pub struct VmmExport {
    /// Base of the first mapping (exporter's address space).
    pub alloc_base: u64,
    /// From `alloc_base` to the end of the last mapping.
    pub alloc_len: u64,
    /// One per mapping, in address order, back to back.
    pub pieces: Vec<VmmPiece>,
}

/// A generic allocation handle, released on drop (the mappings made from it keep the memory).
struct Generic(sys::CUmemGenericAllocationHandle);

impl Drop for Generic {
    fn drop(&mut self) {
        // SAFETY: the handle came from a retain, create or import call and is released once, here.
        unsafe {
            let _ = sys::cuMemRelease(self.0);
        }
    }
}

/// Exports the mappings that cover `[ptr, ptr + len)` (VMM memory of the current context's
/// device), at most `max_pieces` of them.
pub fn export(ptr: u64, len: u64, max_pieces: usize) -> Result<VmmExport, ExportError> {
    require("cuMemExportToShareableHandle").map_err(ExportError::Cuda)?;
    let end = ptr
        .checked_add(len)
        .filter(|_| len > 0)
        .ok_or(ExportError::Spans {
            alloc_base: ptr,
            alloc_len: 0,
        })?;
    let (alloc_base, _) = allocation_range(ptr).map_err(ExportError::Cuda)?;
    let mut pieces = Vec::new();
    let mut at = alloc_base;
    while at < end {
        let (b, l) = allocation_range(at).map_err(ExportError::Cuda)?;
        if b != at || l == 0 || pieces.len() >= max_pieces {
            // A hole or an overlap in the run of mappings, or too many of them.
            return Err(ExportError::Spans {
                alloc_base,
                alloc_len: at - alloc_base,
            });
        }
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; `at` is the base of a live mapping (just queried).
        check(
            unsafe { sys::cuMemRetainAllocationHandle(&mut h, at as *mut c_void) },
            || format!("cuMemRetainAllocationHandle({at:#x})"),
        )
        .map_err(ExportError::Cuda)?;
        let h = Generic(h);
        let mut fd: libc::c_int = -1;
        // SAFETY: for the POSIX descriptor type the driver writes one int into `fd`.
        check(
            unsafe {
                sys::cuMemExportToShareableHandle(
                    &mut fd as *mut libc::c_int as *mut c_void,
                    h.0,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            || format!("cuMemExportToShareableHandle({at:#x}, POSIX_FILE_DESCRIPTOR)"),
        )
        .map_err(ExportError::NotShareable)?;
        if fd < 0 {
            return Err(ExportError::NotShareable(CudaError {
                code: 0,
                context: format!("cuMemExportToShareableHandle({at:#x}) gave descriptor {fd}"),
            }));
        }
        pieces.push(VmmPiece {
            offset: at - alloc_base,
            len: l,
            // SAFETY: the driver just created this descriptor for us; nothing else owns it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        });
        at = b + l;
    }
    Ok(VmmExport {
        alloc_base,
        alloc_len: at - alloc_base,
        pieces,
    })
}

/// A peer's VMM range mapped in this process: one reserved address range with each of the peer's
/// allocations mapped at its offset. Unmapped and the addresses freed on drop.
#[derive(Debug)]
pub struct VmmMapping {
    ctx: usize,
    base: u64,
    len: u64,
    /// (offset, length) of every mapping made.
    mapped: Vec<(u64, u64)>,
}

/// The current context's device.
fn current_device() -> CudaResult<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuCtxGetDevice(&mut dev) }, || {
        "cuCtxGetDevice".into()
    })?;
    Ok(dev)
}

/// Read/write access of `dev` to `[ptr, ptr + len)` (mapped memory).
fn set_access(ptr: u64, len: u64, dev: sys::CUdevice) -> CudaResult<()> {
    // SAFETY: all-zero is a valid descriptor to fill in.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: one descriptor, read by the driver; the range is mapped (the driver checks).
    check(
        unsafe { sys::cuMemSetAccess(ptr as sys::CUdeviceptr, len as usize, &d, 1) },
        || format!("cuMemSetAccess({ptr:#x}+{len})"),
    )
}

/// Checks that `pieces` (offset, length) lie in order, without overlap, inside `[0, len)`.
pub fn check_layout(len: u64, pieces: &[(u64, u64)]) -> Result<(), String> {
    let mut next = 0u64;
    for &(o, l) in pieces {
        let end = o.checked_add(l).filter(|&e| l > 0 && o >= next && e <= len);
        match end {
            Some(e) => next = e,
            None => {
                return Err(format!(
                    "piece {o:#x}+{l} out of order, overlapping or outside the range of {len}"
                ))
            }
        }
    }
    if pieces.is_empty() {
        return Err("no pieces".into());
    }
    Ok(())
}

/// The alignment for a reservation that must take `pieces` at their offsets: the largest power of
/// two that divides every offset and length (the exporter's mapping granularity, at least), at
/// most 1 GiB.
pub fn reserve_alignment(pieces: &[(u64, u64)]) -> u64 {
    let bits = pieces.iter().fold(1u64 << 30, |a, &(o, l)| a | o | l);
    1u64 << bits.trailing_zeros()
}

impl VmmMapping {
    /// Maps a peer's range of `len` bytes, given as `(offset, length, descriptor)` pieces, in
    /// context `ctx` (0: the current one). The descriptors stay the caller's (close them after).
    pub fn import(
        ctx: usize,
        len: u64,
        pieces: &[(u64, u64, BorrowedFd<'_>)],
    ) -> CudaResult<VmmMapping> {
        require("cuMemImportFromShareableHandle")?;
        let layout: Vec<(u64, u64)> = pieces.iter().map(|p| (p.0, p.1)).collect();
        check_layout(len, &layout).map_err(|m| CudaError {
            code: 0,
            context: format!("VMM import: {m}"),
        })?;
        let _g = ContextGuard::enter(ctx)?;
        let dev = current_device()?;
        let align = reserve_alignment(&layout);
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; reserves `len` bytes anywhere, aligned to a power of two.
        check(
            unsafe { sys::cuMemAddressReserve(&mut base, len as usize, align as usize, 0, 0) },
            || format!("cuMemAddressReserve({len}, alignment {align})"),
        )?;
        // From here on, drop undoes what was done.
        let mut m = VmmMapping {
            ctx: current_context(),
            base,
            len,
            mapped: Vec::with_capacity(pieces.len()),
        };
        for &(off, plen, fd) in pieces {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: writes one handle; for the POSIX type the "OS handle" is the descriptor's
            // number passed as a pointer-sized value; the driver validates it.
            check(
                unsafe {
                    sys::cuMemImportFromShareableHandle(
                        &mut h,
                        fd.as_raw_fd() as usize as *mut c_void,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    )
                },
                || format!("cuMemImportFromShareableHandle(piece at {off:#x})"),
            )?;
            let h = Generic(h);
            let at = base + off;
            // SAFETY: `[at, at + plen)` lies in the reservation (check_layout) and is not mapped
            // yet (pieces do not overlap); the driver checks size against the allocation.
            check(
                unsafe { sys::cuMemMap(at, plen as usize, 0, h.0, 0) },
                || format!("cuMemMap({at:#x}+{plen})"),
            )?;
            m.mapped.push((off, plen));
            set_access(at, plen, dev)?;
        }
        Ok(m)
    }

    /// Where the peer's range starts in this process.
    pub fn base(&self) -> u64 {
        self.base
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        let _g = ContextGuard::enter(self.ctx);
        // SAFETY: each (offset, length) was mapped by `import` in this reservation and is unmapped
        // once; the reservation is freed once, after its mappings.
        unsafe {
            for &(o, l) in &self.mapped {
                let _ = sys::cuMemUnmap(self.base + o, l as usize);
            }
            let _ = sys::cuMemAddressFree(self.base, self.len as usize);
        }
    }
}

/// VMM device memory of this process, for tests: `pieces` allocations of `piece_len` bytes each
/// (rounded up to the granularity), created shareable as POSIX descriptors (unless `shareable` is
/// false: then with no shareable handle type) and mapped back to back, read/write for the current
/// device.
#[cfg(test)]
pub struct VmmBuffer(VmmMapping);

#[cfg(test)]
impl VmmBuffer {
    /// Allocates and maps the buffer in the current context.
    pub fn new(piece_len: usize, pieces: usize, shareable: bool) -> CudaResult<VmmBuffer> {
        require("cuMemCreate")?;
        let dev = current_device()?;
        // SAFETY: all-zero is a valid property block to fill in.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        prop.requestedHandleTypes = if shareable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        };
        let mut gran = 0usize;
        // SAFETY: writes one size; prop is filled in.
        check(
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            },
            || "cuMemGetAllocationGranularity".into(),
        )?;
        let plen = piece_len.div_ceil(gran.max(1)) * gran.max(1);
        let len = (plen * pieces) as u64;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(
            unsafe { sys::cuMemAddressReserve(&mut base, len as usize, 0, 0, 0) },
            || format!("cuMemAddressReserve({len})"),
        )?;
        let mut m = VmmMapping {
            ctx: current_context(),
            base,
            len,
            mapped: Vec::new(),
        };
        for i in 0..pieces {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: writes one handle; prop is filled in.
            check(unsafe { sys::cuMemCreate(&mut h, plen, &prop, 0) }, || {
                format!("cuMemCreate({plen})")
            })?;
            let h = Generic(h);
            let off = (i * plen) as u64;
            // SAFETY: inside the reservation, not mapped yet.
            check(
                unsafe { sys::cuMemMap(base + off, plen, 0, h.0, 0) },
                || "cuMemMap".into(),
            )?;
            m.mapped.push((off, plen as u64));
            set_access(base + off, plen as u64, dev)?;
        }
        Ok(VmmBuffer(m))
    }

    /// The buffer's device address.
    pub fn ptr(&self) -> u64 {
        self.0.base
    }

    /// Its size in bytes (pieces times the rounded piece length).
    pub fn size(&self) -> u64 {
        self.0.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_must_be_ordered_disjoint_and_inside() {
        assert!(check_layout(100, &[(0, 50), (50, 50)]).is_ok());
        assert!(
            check_layout(100, &[(0, 10), (60, 40)]).is_ok(),
            "gaps are fine"
        );
        assert!(check_layout(100, &[]).is_err());
        assert!(check_layout(100, &[(0, 60), (50, 50)]).is_err(), "overlap");
        assert!(check_layout(100, &[(50, 50), (0, 50)]).is_err(), "order");
        assert!(check_layout(100, &[(0, 101)]).is_err(), "past the end");
        assert!(check_layout(100, &[(0, 0)]).is_err(), "empty piece");
        assert!(
            check_layout(u64::MAX, &[(u64::MAX, 2)]).is_err(),
            "overflow"
        );
    }

    #[test]
    fn reservations_keep_the_pieces_granularity() {
        const MB2: u64 = 2 << 20;
        assert_eq!(reserve_alignment(&[(0, MB2), (MB2, MB2)]), MB2);
        assert_eq!(
            reserve_alignment(&[(0, 4 * MB2), (4 * MB2, 2 * MB2)]),
            2 * MB2
        );
        assert_eq!(reserve_alignment(&[(0, 1 << 34)]), 1 << 30, "capped");
        assert_eq!(reserve_alignment(&[(0, 4096 + MB2)]), 4096);
    }

    #[test]
    fn without_a_driver_nothing_exports_or_imports() {
        if crate::cuda::available() {
            return; // covered on the GPU node
        }
        assert!(matches!(
            export(0x1000, 8, 4),
            Err(ExportError::Cuda(CudaError { code: -1, .. }))
        ));
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&f);
        assert!(VmmMapping::import(0, 4096, &[(0, 4096, fd)]).is_err());
    }
}
