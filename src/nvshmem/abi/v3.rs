//! Transport ABI 3 (NVSHMEM 3.4.x; NVIDIA/nvshmem tag v3.4.5-0,
//! `src/include/internal/host_transport/transport.h`): host ops embedded right after `cap`.
use std::ffi::c_int;

use super::*;

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

/// `struct nvshmem_transport`, v3: host ops right after `cap`.
#[repr(C)]
pub struct TransportV3 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub host_ops: HostOpsV3,
    pub tail: TransportTail,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<HostOpsV3>() == 14 * 8);
    assert!(offset_of!(TransportV3, host_ops) == 0x10);
    assert!(offset_of!(TransportV3, tail) == 0x10 + 14 * 8);
    assert!(size_of::<TransportV3>() == 0xf0);
};
