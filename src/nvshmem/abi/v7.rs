//! Transport ABI 7 (NVSHMEM 3.8.x). Source: NVIDIA/nvshmem commits
//! 6d5e14cd961a1fa07a30849e05f0882d78a6cdb1, 7bbd6c8417f2fc59d3762492181445808986c86e and
//! e4c3dfc8cf9daf1f30a76c461fef5fc69712eb7e: each `src/CMakeLists.txt` sets
//! `TRANSPORT_VERSION_MAJOR 7`, and their `src/include/internal/host_transport/transport.h` agree on:
//! - `amo_verb_t` gains a trailing `int is_float` ([`AmoVerbF`], 20 bytes);
//! - `nvshmem_transport_op_attrs_t {uint32_t flags; uint32_t hints; uint64_t issuer_id; uint64_t
//!   region_id}` ([`OpAttrs`]); op flags NONE 0 and MORE_FOLLOWS `1u << 0` (advisory: "this
//!   operation is not the terminal operation in a compatible transport-defined batch domain");
//! - region roles HOST 0, PROXY 1, COUNT 2 (an enum, passed as `int`);
//! - host ops: v5's fifteen, then `rma_with_hints(t, pe, verb, remote, local, bytesdesc, qp_index,
//!   const op_attrs *)` and `region_flush(t, role, uint64_t issuer_id, uint64_t region_id)`, both
//!   optional (the host calls `rma` when `rma_with_hints` is NULL and skips a NULL `region_flush`);
//! - `struct nvshmem_transport`: v5's, then after `host_ops` an enum `device_assignment_mode`
//!   (DEFAULT 0, HCA_LIST 1, HCA_PE_MAPPING 2);
//! - new bits `NVSHMEM_TRANSPORT_CAP_LOGICAL_ENDPOINT` (1 << 10) and
//!   `NVSHMEM_TRANSPORT_ATTR_MULTI_NIC_ENABLED` (1 << 2), neither set by this library.
//!
//! The wheel nvidia-nvshmem-cu13 3.8.0 states plugin version 7.0.0, `NVSHMEMI_OP_REGION_END = 9` and
//! `non_abi/nvshmemi_region_types.h` (hint `NVSHMEMI_REGION_HINT_BATCH_RMA = 1`). The host fills the
//! attrs of an RMA inside a host region with issuer 1 and the region's id (NVIDIA/nvshmem
//! `src/host/comm/region.cpp`), and a transport batches by (issuer, region) until `region_flush`
//! (`src/modules/transport/common/transport_batch_rma.hpp` at
//! 38bd4c0412a222dbef353a458708995a4c43a110).
use std::ffi::c_int;

use super::*;

/// `nvshmem_transport_op_attrs_t`.
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

/// `NVSHMEM_TRANSPORT_DEVICE_ASSIGNMENT_*` (`device_assignment_mode`).
pub mod device_assignment {
    pub const DEFAULT: i32 = 0;
    pub const HCA_LIST: i32 = 1;
    pub const HCA_PE_MAPPING: i32 = 2;
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
    /// Left DEFAULT by the plugin (the host's default assignment of devices to PEs).
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
