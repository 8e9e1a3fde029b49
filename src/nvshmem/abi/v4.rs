//! Transport ABI 4 (NVSHMEM 3.5.x; NVIDIA/nvshmem branch devel = 3.5.1, commit
//! 2c7f5a37b16d74166b7dfd30014bb1de1c6aaa0a, `src/include/internal/host_transport/transport.h`):
//! host ops at the end, QP indices instead of is_proxy, `put_signal` after `quiet`.
use std::ffi::c_int;

use super::*;

/// `struct nvshmem_transport_host_ops`, v4 (also v5).
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

/// `struct nvshmem_transport`, v4: host ops at the end.
#[repr(C)]
pub struct TransportV4 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV4,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<HostOpsV4>() == 15 * 8);
    assert!(offset_of!(HostOpsV4, put_signal) == 11 * 8);
    assert!(offset_of!(TransportV4, tail) == 0x10);
    assert!(offset_of!(TransportV4, host_ops) == 0x80);
    assert!(size_of::<TransportV4>() == 0xf8);
};
