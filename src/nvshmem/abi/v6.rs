//! Transport ABI 6 (NVSHMEM 3.7.x). **Inferred layout**: no public source with a major-6
//! `transport.h` was found (the code index holds NVIDIA/nvshmem headers of majors 3, 4, 5 and 7 only).
//!
//! What is established: the wheel nvidia-nvshmem-cu13 3.7.2 opens
//! `nvshmem_transport_libfabric.so.6` and states plugin version 6.0.0; its shared-types header
//! (`device_host_transport/nvshmem_common_transport.h`) adds `NVSHMEMI_AMO_FLOAT_BIT` (0x80), "set in
//! the proxy channel amo field to indicate floating-point type; the proxy handler strips this flag";
//! the major-5 header (commit ef92d34f16d05a7f119b760da864efaa0742d20d) has no `is_float`; every
//! major-7 header has `amo_verb_t` with a trailing `int is_float` and otherwise v5's first fifteen
//! host ops unchanged. The 3.7.2 wheel also exports the logical-endpoint headers that go with
//! major 7's `NVSHMEM_TRANSPORT_CAP_LOGICAL_ENDPOINT`, but no region headers (those arrive with 3.8.0
//! and `NVSHMEMI_OP_REGION_END`).
//!
//! Inferred from that: v5's struct and op order, with `amo_verb_t` carrying `is_float` (the only
//! channel by which the stripped float flag can reach a transport), which changes the `amo` and
//! `put_signal` signatures ([`AmoVerbF`]). Whether major 6 already has major 7's trailing members
//! (`rma_with_hints`, `region_flush`, `device_assignment_mode`) is not known; the struct therefore
//! ends in a zeroed reserve as large as those members, so a host that has them reads NULL ops (both
//! are optional: the host falls back to `rma` and skips the flush) and the default device assignment
//! (0), at either offset. The first `connect_endpoints` checks `my_pe`/`n_pes` against the bootstrap
//! handle (see `crate::capi`), and the GPU suite under the real 3.7.2 is what confirms the rest.
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

/// `struct nvshmem_transport`, v6: host ops at the end, then a zeroed reserve (see the module doc).
#[repr(C)]
pub struct TransportV6 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV6,
    /// Always zero: covers `rma_with_hints`, `region_flush` and `device_assignment_mode` in case the
    /// 3.7 host already has them (NULL ops and the default assignment).
    pub reserved_zero: [u64; 3],
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<HostOpsV6>() == 15 * 8);
    assert!(offset_of!(HostOpsV6, amo) == 8 * 8);
    assert!(offset_of!(HostOpsV6, put_signal) == 11 * 8);
    assert!(offset_of!(TransportV6, host_ops) == 0x80);
    assert!(offset_of!(TransportV6, reserved_zero) == 0xf8);
    // As large as v7's struct: every member v7 appends lies in the zeroed reserve.
    assert!(size_of::<TransportV6>() == size_of::<super::v7::TransportV7>());
};
