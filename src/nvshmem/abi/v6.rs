//! Transport ABI 6 (NVSHMEM 3.7.x). Established (wheel nvidia-nvshmem-cu13 3.7.2): file
//! `nvshmem_transport_libfabric.so.6`, plugin version 6.0.0, and the shared-types header adds
//! `NVSHMEMI_AMO_FLOAT_BIT` (0x80): device code flags float AMOs in the proxy channel and the proxy
//! strips the bit before it calls the transport, so the float-ness reaches the transport in the verb:
//! `amo_verb_t` gains a trailing `int is_float` ([`AmoVerbF`]), which changes the `amo` and
//! `put_signal` signatures. The struct keeps v4's order. No 3.7 `transport.h` was found in public
//! sources; the GPU suite under the real 3.7.2 is what confirms this layout.
use std::ffi::c_int;

use super::*;

/// `struct nvshmem_transport_host_ops`, v6: v4's order, `amo`/`put_signal` take [`AmoVerbF`].
#[repr(C)]
pub struct HostOpsV6 {
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
}

/// `struct nvshmem_transport`, v6: host ops at the end.
#[repr(C)]
pub struct TransportV6 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV6,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<HostOpsV6>() == 15 * 8);
    assert!(offset_of!(HostOpsV6, amo) == 8 * 8);
    assert!(offset_of!(HostOpsV6, put_signal) == 11 * 8);
    assert!(offset_of!(TransportV6, host_ops) == 0x80);
    assert!(size_of::<TransportV6>() == 0xf8);
};
