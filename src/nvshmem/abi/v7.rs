//! Transport ABI 7 (NVSHMEM 3.8.x). Established (wheel nvidia-nvshmem-cu13 3.8.0): file
//! `nvshmem_transport_libfabric.so.7`, plugin version 7.0.0, `NVSHMEMI_OP_REGION_END = 9` in the
//! shared types and `non_abi/nvshmemi_region_types.h` (regions with the hint
//! `NVSHMEMI_REGION_HINT_BATCH_RMA = 1`). From NVIDIA/nvshmem's host code of that line (code index:
//! `src/modules/transport/common/transport_batch_rma.hpp` at 38bd4c0412a222dbef353a458708995a4c43a110
//! and the host region file that calls `host_ops.region_flush(tcurr, role, issuer_id, region_id)`):
//! an op-attributes struct `nvshmem_transport_op_attrs_t {flags, hints, issuer_id, region_id}` with
//! `NVSHMEM_TRANSPORT_OP_FLAG_NONE` / `..._MORE_FOLLOWS`, region roles HOST and PROXY (a two-entry
//! table indexed by role: HOST for `qp_index == NVSHMEMX_QP_HOST (0)`, PROXY otherwise).
//!
//! Not seen in a public header and therefore inferred (the GPU suite under the real 3.8.0 confirms
//! or refutes it): the two new ops are appended after `add_device_remote_mem_handles`;
//! `rma_with_hints` is `rma` plus a trailing `const nvshmem_transport_op_attrs_t *`; the attrs are
//! `{u32 flags; u32 hints; u64 issuer_id; u64 region_id}` (the order the host fills them); MORE_FOLLOWS
//! is bit 0; `device_assignment_mode` is an `int` after the host ops; roles are HOST 0, PROXY 1.
use std::ffi::c_int;

use super::*;

/// `nvshmem_transport_op_attrs_t` (inferred order, see the module doc).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OpAttrs {
    pub flags: u32,
    pub hints: u32,
    pub issuer_id: u64,
    pub region_id: u64,
}

/// `NVSHMEM_TRANSPORT_OP_FLAG_*`.
pub mod op_flag {
    pub const NONE: u32 = 0;
    /// More operations of the same batch follow on this QP: the transport may defer its flush.
    pub const MORE_FOLLOWS: u32 = 1;
}

/// `NVSHMEM_TRANSPORT_REGION_ROLE_*`.
pub mod region_role {
    pub const HOST: i32 = 0;
    pub const PROXY: i32 = 1;
    pub const COUNT: i32 = 2;
}

/// `NVSHMEMI_REGION_HINT_BATCH_RMA`.
pub const REGION_HINT_BATCH_RMA: u32 = 1;

pub type RmaWithHintsFn = unsafe extern "C" fn(
    TransportPtr,
    c_int,
    RmaVerb,
    *mut RmaMemdesc,
    *mut RmaMemdesc,
    RmaBytesdesc,
    c_int,
    *const OpAttrs,
) -> c_int;
pub type RegionFlushFn = unsafe extern "C" fn(TransportPtr, c_int, u64, u64) -> c_int;

/// `struct nvshmem_transport_host_ops`, v7: v6 plus `rma_with_hints` and `region_flush`.
#[repr(C)]
pub struct HostOpsV7 {
    pub can_reach_peer: Option<CanReachPeerFn>,
    pub connect_endpoints: Option<ConnectV4Fn>,
    pub get_mem_handle: Option<GetMemHandleFn>,
    pub release_mem_handle: Option<ReleaseMemHandleFn>,
    pub finalize: Option<TransportFn>,
    pub show_info: Option<ShowInfoFn>,
    pub progress: Option<TransportFn>,
    pub rma: Option<RmaFn>,
    pub amo: Option<AmoFFn>,
    pub fence: Option<FenceV4Fn>,
    pub quiet: Option<QuietFn>,
    pub put_signal: Option<PutSignalFFn>,
    pub enforce_cst: Option<TransportFn>,
    pub enforce_cst_at_target: Option<TransportFn>,
    pub add_device_remote_mem_handles: Option<AddRemoteHandlesFn>,
    pub rma_with_hints: Option<RmaWithHintsFn>,
    pub region_flush: Option<RegionFlushFn>,
}

/// `struct nvshmem_transport`, v7: host ops at the end, then `device_assignment_mode`.
#[repr(C)]
pub struct TransportV7 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV7,
    /// Left 0 by the plugin (the host's default assignment of devices to PEs).
    pub device_assignment_mode: c_int,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<OpAttrs>() == 24);
    assert!(offset_of!(OpAttrs, issuer_id) == 8);
    assert!(offset_of!(OpAttrs, region_id) == 16);
    assert!(size_of::<HostOpsV7>() == 17 * 8);
    assert!(offset_of!(HostOpsV7, rma_with_hints) == 15 * 8);
    assert!(offset_of!(HostOpsV7, region_flush) == 16 * 8);
    assert!(offset_of!(TransportV7, host_ops) == 0x80);
    assert!(offset_of!(TransportV7, device_assignment_mode) == 0x80 + 17 * 8);
    assert!(size_of::<TransportV7>() == 0x110);
};
