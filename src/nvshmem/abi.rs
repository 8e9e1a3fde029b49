//! Mirror of NVSHMEM's transport plugin ABI (`src/include/internal/host_transport/transport.h`):
//! the shared types, the v3 layout (NVSHMEM 3.4.x) and the v4 layout (3.5.x). Every type carries size
//! and offset assertions for x86-64/aarch64 (LP64).
#![allow(missing_docs)]
use std::ffi::{c_int, c_void};

/// Size of NVSHMEM's opaque memory handle.
pub const MEM_HANDLE_SIZE: usize = 512;

/// `nvshmem_mem_handle_t`: 512 opaque bytes, allgathered between PEs as raw bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemHandle {
    pub reserved: [u8; MEM_HANDLE_SIZE],
}

/// `rma_verb_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RmaVerb {
    pub op: c_int,
    pub is_nbi: c_int,
    pub is_stream: c_int,
    pub cstrm: *mut c_void,
}

/// `rma_memdesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RmaMemdesc {
    pub ptr: *mut c_void,
    pub offset: u64,
    pub handle: *mut MemHandle,
}

/// `rma_bytesdesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RmaBytesdesc {
    pub nelems: usize,
    pub elembytes: c_int,
    pub srcstride: isize,
    pub deststride: isize,
}

/// `amo_verb_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AmoVerb {
    pub op: c_int,
    pub is_fetch: c_int,
    pub is_val: c_int,
    pub is_cmp: c_int,
}

/// `amo_memdesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AmoMemdesc {
    pub remote: RmaMemdesc,
    pub retflag: u64,
    pub retptr: *mut c_void,
    pub valptr: *mut c_void,
    pub cmpptr: *mut c_void,
    pub val: u64,
    pub cmp: u64,
    pub ret_handle: *mut MemHandle,
}

/// `amo_bytesdesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AmoBytesdesc {
    pub name_type: c_int,
    pub elembytes: c_int,
}

/// `pcie_id_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PcieId {
    pub dev_id: c_int,
    pub bus_id: c_int,
    pub domain_id: c_int,
}

/// `nvshmem_transport_pe_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PeInfo {
    pub pcie_id: PcieId,
    pub pe: c_int,
    pub host_hash: u64,
    pub gpu_uuid: [u8; 16],
}

/// `bootstrap_handle_t`.
#[repr(C)]
pub struct BootstrapHandle {
    pub version: c_int,
    pub pg_rank: c_int,
    pub pg_size: c_int,
    pub mype_node: c_int,
    pub npes_node: c_int,
    pub allgather: Option<
        unsafe extern "C" fn(*const c_void, *mut c_void, c_int, *mut BootstrapHandle) -> c_int,
    >,
    pub alltoall: Option<
        unsafe extern "C" fn(*const c_void, *mut c_void, c_int, *mut BootstrapHandle) -> c_int,
    >,
    pub barrier: Option<unsafe extern "C" fn(*mut BootstrapHandle) -> c_int>,
    pub global_exit: Option<unsafe extern "C" fn(c_int)>,
    pub finalize: Option<unsafe extern "C" fn(*mut BootstrapHandle) -> c_int>,
    pub show_info: Option<unsafe extern "C" fn(*mut BootstrapHandle, c_int) -> c_int>,
    pub pre_init_ops: *mut c_void,
    pub comm_state: *mut c_void,
}

/// A libstdc++ `std::vector<T>`: `{begin, end, end_of_storage}`; v4's put_signal takes references
/// (pointers) to these.
#[repr(C)]
pub struct CxxVector<T> {
    pub begin: *mut T,
    pub end: *mut T,
    pub end_of_storage: *mut T,
}

impl<T> CxxVector<T> {
    /// The elements, or `None` when the vector is malformed.
    ///
    /// # Safety
    /// `self` must be a live vector of `T`.
    pub unsafe fn as_slice(&self) -> Option<&[T]> {
        if self.begin.is_null() {
            return if self.end.is_null() { Some(&[]) } else { None };
        }
        let bytes = (self.end as usize).checked_sub(self.begin as usize)?;
        if bytes % std::mem::size_of::<T>() != 0 {
            return None;
        }
        // SAFETY: caller guarantees a live vector; begin..end holds initialised elements.
        Some(unsafe { std::slice::from_raw_parts(self.begin, bytes / std::mem::size_of::<T>()) })
    }
}

/// Opaque transport pointer as passed to the host ops.
pub type TransportPtr = *mut c_void;

pub type CanReachPeerFn = unsafe extern "C" fn(*mut c_int, *mut PeInfo, TransportPtr) -> c_int;
pub type ConnectV3Fn = unsafe extern "C" fn(TransportPtr, *mut c_int, c_int) -> c_int;
pub type ConnectV4Fn =
    unsafe extern "C" fn(TransportPtr, *mut c_int, c_int, *mut c_int, c_int) -> c_int;
pub type GetMemHandleFn =
    unsafe extern "C" fn(*mut MemHandle, *mut c_void, usize, TransportPtr, bool) -> c_int;
pub type ReleaseMemHandleFn = unsafe extern "C" fn(*mut MemHandle, TransportPtr) -> c_int;
pub type TransportFn = unsafe extern "C" fn(TransportPtr) -> c_int;
pub type ShowInfoFn = unsafe extern "C" fn(TransportPtr, c_int) -> c_int;
pub type RmaFn = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    RmaVerb,
    *mut RmaMemdesc,
    *mut RmaMemdesc,
    RmaBytesdesc,
    c_int,
) -> c_int;
pub type AmoFn = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    *mut c_void,
    AmoVerb,
    *mut AmoMemdesc,
    AmoBytesdesc,
    c_int,
) -> c_int;
pub type FenceV3Fn = unsafe extern "C" fn(TransportPtr, c_int, c_int) -> c_int;
pub type FenceV4Fn = unsafe extern "C" fn(TransportPtr, c_int, c_int, c_int) -> c_int;
pub type QuietFn = unsafe extern "C" fn(TransportPtr, c_int, c_int) -> c_int;
pub type PutSignalFn = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    RmaVerb,
    *mut CxxVector<RmaMemdesc>,
    *mut CxxVector<RmaMemdesc>,
    *mut CxxVector<RmaBytesdesc>,
    AmoVerb,
    *mut AmoMemdesc,
    AmoBytesdesc,
    c_int,
) -> c_int;
pub type AddRemoteHandlesFn =
    unsafe extern "C" fn(TransportPtr, c_int, *mut MemHandle, u64, usize) -> c_int;

/// `struct nvshmem_transport_host_ops`, v3.
#[repr(C)]
pub struct HostOpsV3 {
    pub can_reach_peer: Option<CanReachPeerFn>,
    pub connect_endpoints: Option<ConnectV3Fn>,
    pub get_mem_handle: Option<GetMemHandleFn>,
    pub release_mem_handle: Option<ReleaseMemHandleFn>,
    pub finalize: Option<TransportFn>,
    pub show_info: Option<ShowInfoFn>,
    pub progress: Option<TransportFn>,
    pub rma: Option<RmaFn>,
    pub amo: Option<AmoFn>,
    pub fence: Option<FenceV3Fn>,
    pub quiet: Option<QuietFn>,
    pub enforce_cst: Option<TransportFn>,
    pub enforce_cst_at_target: Option<TransportFn>,
    pub add_device_remote_mem_handles: Option<AddRemoteHandlesFn>,
}

/// `struct nvshmem_transport_host_ops`, v4.
#[repr(C)]
pub struct HostOpsV4 {
    pub can_reach_peer: Option<CanReachPeerFn>,
    pub connect_endpoints: Option<ConnectV4Fn>,
    pub get_mem_handle: Option<GetMemHandleFn>,
    pub release_mem_handle: Option<ReleaseMemHandleFn>,
    pub finalize: Option<TransportFn>,
    pub show_info: Option<ShowInfoFn>,
    pub progress: Option<TransportFn>,
    pub rma: Option<RmaFn>,
    pub amo: Option<AmoFn>,
    pub fence: Option<FenceV4Fn>,
    pub quiet: Option<QuietFn>,
    pub put_signal: Option<PutSignalFn>,
    pub enforce_cst: Option<TransportFn>,
    pub enforce_cst_at_target: Option<TransportFn>,
    pub add_device_remote_mem_handles: Option<AddRemoteHandlesFn>,
}

/// The fields both layouts share, in order (everything but the host ops).
#[repr(C)]
pub struct TransportTail {
    pub boot_handle: *mut BootstrapHandle,
    pub state: *mut c_void,
    pub type_specific_shared_state: *mut c_void,
    pub cache_handle: *mut c_void,
    pub device_pci_paths: *mut *mut libc::c_char,
    pub attr: c_int,
    pub n_devices: c_int,
    pub atomics_complete_on_quiet: bool,
    pub is_successfully_initialized: bool,
    pub no_proxy: bool,
    pub heap_base: *mut c_void,
    pub log2_cumem_granularity: usize,
    pub max_op_len: u64,
    pub atomic_host_endian_min_size: u32,
    pub index: c_int,
    pub my_pe: c_int,
    pub n_pes: c_int,
    pub alias_va_map: *mut c_void,
    pub egm_map: *mut c_void,
}

/// `struct nvshmem_transport`, v3: host ops right after `cap`.
#[repr(C)]
pub struct TransportV3 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub host_ops: HostOpsV3,
    pub tail: TransportTail,
}

/// `struct nvshmem_transport`, v4: host ops at the end.
#[repr(C)]
pub struct TransportV4 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV4,
}

/// Operation codes (`nvshmemi_op_t`).
pub mod op {
    pub const PUT: i32 = 1;
    pub const P: i32 = 2;
    pub const PUT_SIGNAL: i32 = 3;
    pub const GET: i32 = 4;
    pub const G: i32 = 5;
    pub const FENCE: i32 = 6;
    pub const AMO: i32 = 7;
    pub const QUIET: i32 = 8;
}

/// Atomic operation codes (`nvshmemi_amo_t`).
pub mod amo {
    pub const ACK: i32 = 1;
    pub const INC: i32 = 2;
    pub const SET: i32 = 3;
    pub const ADD: i32 = 4;
    pub const AND: i32 = 5;
    pub const OR: i32 = 6;
    pub const XOR: i32 = 7;
    pub const SIGNAL: i32 = 8;
    pub const SIGNAL_SET: i32 = 9;
    pub const SIGNAL_ADD: i32 = 10;
    pub const END_OF_NONFETCH: i32 = 11;
    pub const FETCH: i32 = 12;
    pub const FETCH_INC: i32 = 13;
    pub const FETCH_ADD: i32 = 14;
    pub const FETCH_AND: i32 = 15;
    pub const FETCH_OR: i32 = 16;
    pub const FETCH_XOR: i32 = 17;
    pub const SWAP: i32 = 18;
    pub const COMPARE_SWAP: i32 = 19;
}

/// Access capability bits (`NVSHMEM_TRANSPORT_CAP_*`).
pub mod cap {
    pub const MAP: i32 = 1;
    pub const MAP_GPU_ST: i32 = 1 << 1;
    pub const MAP_GPU_LD: i32 = 1 << 2;
    pub const MAP_GPU_ATOMICS: i32 = 1 << 3;
    pub const CPU_WRITE: i32 = 1 << 4;
    pub const CPU_READ: i32 = 1 << 5;
    pub const CPU_ATOMICS: i32 = 1 << 6;
    pub const GPU_WRITE: i32 = 1 << 7;
    pub const GPU_READ: i32 = 1 << 8;
    pub const GPU_ATOMICS: i32 = 1 << 9;
}

/// Transport attribute bits.
pub mod attr {
    pub const NO_ENDPOINTS: i32 = 1;
    pub const CONNECTED: i32 = 1 << 1;
}

/// NVSHMEM error codes the ops return.
pub mod status {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 2;
    pub const OUT_OF_MEMORY: i32 = 3;
    pub const INTERNAL: i32 = 7;
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<MemHandle>() == 512);
    assert!(size_of::<RmaVerb>() == 24);
    assert!(size_of::<RmaMemdesc>() == 24);
    assert!(size_of::<RmaBytesdesc>() == 32);
    assert!(size_of::<AmoVerb>() == 16);
    assert!(size_of::<AmoMemdesc>() == 80);
    assert!(offset_of!(AmoMemdesc, retflag) == 24);
    assert!(offset_of!(AmoMemdesc, val) == 56);
    assert!(offset_of!(AmoMemdesc, ret_handle) == 72);
    assert!(size_of::<AmoBytesdesc>() == 8);
    assert!(size_of::<PeInfo>() == 40);
    assert!(offset_of!(PeInfo, host_hash) == 16);
    assert!(size_of::<BootstrapHandle>() == 88);
    assert!(offset_of!(BootstrapHandle, allgather) == 24);
    assert!(offset_of!(BootstrapHandle, barrier) == 40);
    assert!(size_of::<CxxVector<RmaMemdesc>>() == 24);
    assert!(size_of::<HostOpsV3>() == 14 * 8);
    assert!(size_of::<HostOpsV4>() == 15 * 8);
    assert!(offset_of!(HostOpsV4, put_signal) == 11 * 8);
    assert!(size_of::<TransportTail>() == 0x70);
    assert!(offset_of!(TransportTail, attr) == 0x28);
    assert!(offset_of!(TransportTail, atomics_complete_on_quiet) == 0x30);
    assert!(offset_of!(TransportTail, heap_base) == 0x38);
    assert!(offset_of!(TransportTail, index) == 0x54);
    assert!(offset_of!(TransportTail, alias_va_map) == 0x60);
    assert!(offset_of!(TransportV3, host_ops) == 0x10);
    assert!(offset_of!(TransportV3, tail) == 0x10 + 14 * 8);
    assert!(size_of::<TransportV3>() == 0xf0);
    assert!(offset_of!(TransportV4, tail) == 0x10);
    assert!(offset_of!(TransportV4, host_ops) == 0x80);
    assert!(size_of::<TransportV4>() == 0xf8);
};
pub const SERVED_MAJORS: &[i32] = &[3, 4];
