//! Legacy CUDA IPC of device memory: export an allocation as a 64-byte handle, open a peer's handle
//! as a local mapping, close it again.
//!
//! Legacy IPC (`cuIpcGetMemHandle`) exports memory from `cuMemAlloc`/`cudaMalloc` only. CUDA VMM
//! allocations (`cuMemCreate` + `cuMemMap`, which NVSHMEM 3.4.5 uses for its heap unless
//! `NVSHMEM_DISABLE_CUDA_VMM=1`) are refused here; [`export`] tells them apart, and the mover
//! exports them through [`super::vmm`] instead.
//! A handle names a whole allocation: it is exported at the allocation's base and opened to that
//! base, so a registered region inside an allocation is reached at `mapping + (addr - alloc_base)`.
use std::ffi::c_void;

use cudarc::driver::sys;

use super::{check, require, ContextObject, CudaError, CudaResult};

/// Bytes of a legacy IPC handle (`CUipcMemHandle`).
pub const HANDLE_BYTES: usize = 64;

const _: () = assert!(std::mem::size_of::<sys::CUipcMemHandle>() == HANDLE_BYTES);

/// An exported allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    /// The IPC handle of the allocation.
    pub handle: [u8; HANDLE_BYTES],
    /// The allocation's base address in the exporting process.
    pub alloc_base: u64,
    /// The allocation's length.
    pub alloc_len: u64,
}

/// Why a region cannot be exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportError {
    /// A CUDA VMM allocation: legacy IPC cannot export it.
    Vmm,
    /// The region runs past the end of the allocation that holds its start (it spans allocations).
    Spans {
        /// Base of the allocation holding the region's start.
        alloc_base: u64,
        /// Its length.
        alloc_len: u64,
    },
    /// A CUDA VMM allocation that cannot be exported as a POSIX file descriptor (created without
    /// that handle type, e.g. only as a fabric handle).
    NotShareable(CudaError),
    /// The driver refused.
    Cuda(CudaError),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Vmm => f.write_str(
                "CUDA VMM memory (cuMemCreate) cannot be exported with legacy CUDA IPC; run NVSHMEM \
                 with NVSHMEM_DISABLE_CUDA_VMM=1 for same-host GPU copies",
            ),
            ExportError::Spans {
                alloc_base,
                alloc_len,
            } => write!(
                f,
                "the region runs past its allocation {alloc_base:#x}+{alloc_len} (spans allocations)"
            ),
            ExportError::NotShareable(e) => write!(
                f,
                "CUDA VMM memory that cannot be shared as a POSIX file descriptor ({e}); run \
                 NVSHMEM with NVSHMEM_CUMEM_HANDLE_TYPE=FILE_DESCRIPTOR, or with \
                 NVSHMEM_DISABLE_CUDA_VMM=1, for same-host GPU copies"
            ),
            ExportError::Cuda(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ExportError {}

/// The allocation (base, length) that contains device address `ptr`.
pub fn allocation_range(ptr: u64) -> CudaResult<(u64, u64)> {
    require("cuMemGetAddressRange")?;
    let mut base: sys::CUdeviceptr = 0;
    let mut len: usize = 0;
    // SAFETY: writes two locals; the driver validates ptr.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, ptr as sys::CUdeviceptr) },
        || format!("cuMemGetAddressRange({ptr:#x})"),
    )?;
    Ok((base, len as u64))
}

/// Whether `ptr` is device memory that legacy CUDA IPC cannot export: in practice a CUDA VMM
/// allocation (`cuMemCreate`). Asked through the pointer's IS_LEGACY_CUDA_IPC_CAPABLE attribute,
/// which answers for every device pointer (`cuMemRetainAllocationHandle` would fail, and be
/// reported by compute-sanitizer as an API error, for every allocation that is not VMM). False
/// without a driver and for host memory.
pub fn is_vmm(ptr: u64) -> bool {
    matches!(
        super::pointer_kind(ptr as *const c_void),
        super::PtrKind::Device {
            legacy_ipc: false,
            ..
        }
    )
}

/// Exports the allocation holding `[ptr, ptr + len)` (device memory of the current context's
/// device) for other processes.
pub fn export(ptr: u64, len: u64) -> Result<Export, ExportError> {
    require("cuIpcGetMemHandle").map_err(ExportError::Cuda)?;
    if is_vmm(ptr) {
        return Err(ExportError::Vmm);
    }
    let (alloc_base, alloc_len) = allocation_range(ptr).map_err(ExportError::Cuda)?;
    let end = ptr.checked_add(len);
    if end.is_none_or(|e| e > alloc_base + alloc_len) {
        return Err(ExportError::Spans {
            alloc_base,
            alloc_len,
        });
    }
    // SAFETY: all-zero is a valid handle value to be overwritten.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: writes one handle; alloc_base is the base of a live allocation (just queried).
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut h, alloc_base as sys::CUdeviceptr) },
        || format!("cuIpcGetMemHandle({alloc_base:#x})"),
    )
    .map_err(ExportError::Cuda)?;
    let mut handle = [0u8; HANDLE_BYTES];
    for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
        *d = *s as u8;
    }
    Ok(Export {
        handle,
        alloc_base,
        alloc_len,
    })
}

/// A peer's allocation opened in this process (`cuIpcOpenMemHandle` with lazy peer access);
/// closed on drop.
#[derive(Debug)]
pub struct Mapping(ContextObject);

/// Closes a mapping `ContextObject::create` got from `cuIpcOpenMemHandle`.
///
/// # Safety
/// Called once per mapping, with its context current.
unsafe fn close_mapping(base: usize) -> sys::CUresult {
    // SAFETY: per the contract.
    unsafe { sys::cuIpcCloseMemHandle(base as sys::CUdeviceptr) }
}

impl Mapping {
    /// Opens `handle` in context `ctx` (0: the current one). A handle of this very process cannot be
    /// opened (the driver refuses); callers use their own addresses for themselves.
    pub fn open(ctx: usize, handle: &[u8; HANDLE_BYTES]) -> CudaResult<Mapping> {
        let obj = ContextObject::create(
            ctx,
            "cuIpcOpenMemHandle",
            "cuIpcOpenMemHandle",
            || {
                // SAFETY: all-zero is a valid handle value to be overwritten.
                let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
                for (d, s) in h.reserved.iter_mut().zip(handle.iter()) {
                    *d = *s as libc::c_char;
                }
                let mut base: sys::CUdeviceptr = 0;
                let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
                // SAFETY: writes one pointer; the driver validates the handle.
                let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, h, flags) };
                (r, base as usize)
            },
            close_mapping,
        )?;
        Ok(Mapping(obj))
    }

    /// Where the peer's allocation starts in this process.
    pub fn base(&self) -> u64 {
        self.0.handle as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_error_messages_say_what_to_do() {
        assert!(ExportError::Vmm
            .to_string()
            .contains("NVSHMEM_DISABLE_CUDA_VMM=1"));
        let s = ExportError::Spans {
            alloc_base: 0x1000,
            alloc_len: 64,
        }
        .to_string();
        assert!(s.contains("0x1000+64"), "{s}");
    }

    #[test]
    fn without_a_driver_nothing_is_vmm_or_exportable() {
        if crate::cuda::available() {
            return; // covered on the GPU node
        }
        assert!(!is_vmm(0x1000));
        assert!(matches!(
            export(0x1000, 8),
            Err(ExportError::Cuda(CudaError { code: -1, .. }))
        ));
        assert!(Mapping::open(0, &[0; HANDLE_BYTES]).is_err());
    }
}
