//! Mirror of NVSHMEM's transport plugin ABI (`src/include/internal/host_transport/transport.h`):
//! the types every ABI shares (this file) and one file per transport ABI major. Sources are
//! NVIDIA/nvshmem commits as stored in a public code index (the major of each commit is the
//! `TRANSPORT_VERSION_MAJOR` of its `src/CMakeLists.txt`):
//!
//! | major | NVSHMEM | file | source of the layout | status |
//! |---|---|---|---|---|
//! | 3 | 3.4.x | [`v3`] | NVIDIA/nvshmem tag v3.4.5-0 | established |
//! | 4 | 3.5.x | [`v4`] | NVIDIA/nvshmem 2c7f5a37b16d74166b7dfd30014bb1de1c6aaa0a (3.5.1) | established |
//! | 5 | 3.6.x | [`v5`] | NVIDIA/nvshmem ef92d34f16d05a7f119b760da864efaa0742d20d (major 5): v4's layout | established |
//! | 6 | 3.7.x | [`v6`] | no major-6 header found: v5 + `amo_verb.is_float` | **inferred** |
//! | 7 | 3.8.x | [`v7`] | NVIDIA/nvshmem 6d5e14cd961a1fa07a30849e05f0882d78a6cdb1, 7bbd6c8417f2fc59d3762492181445808986c86e, e4c3dfc8cf9daf1f30a76c461fef5fc69712eb7e (major 7) | established |
//!
//! The majors of the released wheels come from each wheel's `include/non_abi/nvshmem_version.h`
//! (nvidia-nvshmem-cu13 3.6.5, 3.7.2, 3.8.0: plugin versions 5.0.0, 6.0.0, 7.0.0) and from the
//! transport file names in its `lib/`. Every type carries size and offset assertions for LP64
//! (x86-64, aarch64). At run time the first `connect_endpoints` checks that the struct fields the
//! host filled (`my_pe`, `n_pes`) agree with its bootstrap handle, so a wrong layout fails loudly.
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

/// `amo_verb_t` from ABI 6 (NVSHMEM 3.7) on: `amo_verb_t` plus a trailing `int is_float` (non-zero:
/// the operands are IEEE-754 `float` (4 bytes) or `double` (8 bytes)). 20 bytes, so unlike the
/// 16-byte [`AmoVerb`] it is passed by value in memory, not in two registers (SysV x86-64 and AAPCS64
/// alike): an ABI 6/7 `amo` must never be called through an ABI 3-5 function type.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AmoVerbF {
    pub op: c_int,
    pub is_fetch: c_int,
    pub is_val: c_int,
    pub is_cmp: c_int,
    pub is_float: c_int,
}

impl AmoVerbF {
    /// The integer verb and the float flag.
    pub fn split(self) -> (AmoVerb, bool) {
        (
            AmoVerb {
                op: self.op,
                is_fetch: self.is_fetch,
                is_val: self.is_val,
                is_cmp: self.is_cmp,
            },
            self.is_float != 0,
        )
    }
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
/// `amo` with verb type `V`: [`AmoFn`] up to ABI 5, [`AmoFFn`] from ABI 6 on.
pub type AmoFnOf<V> = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    *mut c_void,
    V,
    *mut AmoMemdesc,
    AmoBytesdesc,
    c_int,
) -> c_int;
pub type AmoFn = AmoFnOf<AmoVerb>;
/// `amo` from ABI 6 on (20-byte verb).
pub type AmoFFn = AmoFnOf<AmoVerbF>;
pub type FenceV3Fn = unsafe extern "C" fn(TransportPtr, c_int, c_int) -> c_int;
pub type FenceV4Fn = unsafe extern "C" fn(TransportPtr, c_int, c_int, c_int) -> c_int;
pub type QuietFn = unsafe extern "C" fn(TransportPtr, c_int, c_int) -> c_int;
/// `put_signal` with signal-verb type `V`: [`PutSignalFn`] for ABI 4 and 5, [`PutSignalFFn`] from
/// ABI 6 on.
pub type PutSignalFnOf<V> = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    RmaVerb,
    *mut CxxVector<RmaMemdesc>,
    *mut CxxVector<RmaMemdesc>,
    *mut CxxVector<RmaBytesdesc>,
    V,
    *mut AmoMemdesc,
    AmoBytesdesc,
    c_int,
) -> c_int;
pub type PutSignalFn = PutSignalFnOf<AmoVerb>;
/// `put_signal` from ABI 6 on (20-byte signal verb).
pub type PutSignalFFn = PutSignalFnOf<AmoVerbF>;
pub type AddRemoteHandlesFn =
    unsafe extern "C" fn(TransportPtr, c_int, *mut MemHandle, u64, usize) -> c_int;

/// The fields every layout (v3 to v7) shares, in order, between `cap` and the host ops or after
/// them: everything the host and the plugin exchange but the ops themselves.
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
    /// NVSHMEM 3.8 (ABI 7): the device closed a batched-RMA region (proxy channel only).
    pub const REGION_END: i32 = 9;
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
    /// NVSHMEM 3.7+ (`NVSHMEMI_AMO_FLOAT_BIT`, nvshmem_common_transport.h of wheels 3.7.2 and 3.8.0):
    /// the proxy channel flags a floating-point AMO with this bit; the host strips it before it calls
    /// the transport. The library uses the same bit in its own target-applied AMO messages.
    pub const FLOAT_BIT: i32 = 0x80;
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
    /// ABI 7 (NVSHMEM 3.8; source in [`super::v7`]): the transport exports logical endpoints. This
    /// library does not set it.
    pub const LOGICAL_ENDPOINT: i32 = 1 << 10;
}

/// Transport attribute bits.
pub mod attr {
    pub const NO_ENDPOINTS: i32 = 1;
    pub const CONNECTED: i32 = 1 << 1;
    /// ABI 7 (source in [`super::v7`]): the transport drives several NICs per PE. Not set here.
    pub const MULTI_NIC_ENABLED: i32 = 1 << 2;
}

/// `nvshmem_transport_inline_lib_code_type_t` (the struct's `type`): ABI 5 on adds GPUNETIO (2).
/// This library leaves `type` at NONE (0).
pub mod lib_code {
    pub const NONE: i32 = 0;
    pub const IBGDA: i32 = 1;
    pub const GPUNETIO: i32 = 2;
}

/// NVSHMEM error codes the ops return (`enum nvshmemx_status`, NVSHMEM's `non_abi/nvshmemx_error.h`:
/// SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_SUPPORTED, SYMMETRY, GPU_NOT_SELECTED,
/// COLLECTIVE_LAUNCH_FAILED, INTERNAL, numbered from 0).
pub mod status {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_SUPPORTED: i32 = 3;
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
    assert!(size_of::<AmoVerbF>() == 20);
    assert!(offset_of!(AmoVerbF, is_float) == 16);
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
    assert!(size_of::<TransportTail>() == 0x70);
    assert!(offset_of!(TransportTail, attr) == 0x28);
    assert!(offset_of!(TransportTail, atomics_complete_on_quiet) == 0x30);
    assert!(offset_of!(TransportTail, heap_base) == 0x38);
    assert!(offset_of!(TransportTail, index) == 0x54);
    assert!(offset_of!(TransportTail, alias_va_map) == 0x60);
};

pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;
pub mod v7;

/// Transport ABI majors this library serves, oldest first: 3 (NVSHMEM 3.4.x), 4 (3.5.x), 5 (3.6.x),
/// 6 (3.7.x), 7 (3.8.x). The one list `nvshmemt_init` checks and names in its messages.
pub const SERVED_MAJORS: &[i32] = &[3, 4, 5, 6, 7];

/// The NVSHMEM release line of each served major, for messages and docs.
pub fn nvshmem_line(major: i32) -> Option<&'static str> {
    Some(match major {
        3 => "3.4.x",
        4 => "3.5.x",
        5 => "3.6.x",
        6 => "3.7.x",
        7 => "3.8.x",
        _ => return None,
    })
}

/// This library's transport interface version for a served major: `major*10000 + minor*100 +
/// patch` of the NVSHMEM release it was checked against (3.4.5 and 3.5.x pass 30000 and 40000; the
/// 3.6.5, 3.7.2 and 3.8.0 wheels define plugin versions 5.0.0, 6.0.0 and 7.0.0).
pub fn own_version(major: i32) -> Option<i32> {
    SERVED_MAJORS.contains(&major).then_some(major * 10000)
}

/// The served majors as text: "3 (NVSHMEM 3.4.x), 4 (NVSHMEM 3.5.x), ...".
pub fn served_list() -> String {
    SERVED_MAJORS
        .iter()
        .map(|m| format!("{m} (NVSHMEM {})", nvshmem_line(*m).unwrap_or("?")))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_majors_have_versions_and_lines() {
        assert_eq!(SERVED_MAJORS, &[3, 4, 5, 6, 7]);
        for m in SERVED_MAJORS {
            assert_eq!(own_version(*m), Some(m * 10000));
            assert!(nvshmem_line(*m).is_some());
        }
        assert_eq!(own_version(2), None);
        assert_eq!(own_version(8), None);
        let l = served_list();
        assert!(
            l.starts_with("3 (NVSHMEM 3.4.x)") && l.ends_with("7 (NVSHMEM 3.8.x)"),
            "{l}"
        );
    }
}
