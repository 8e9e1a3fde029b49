//! Transport ABI 5 (NVSHMEM 3.6.x). What is established (wheel nvidia-nvshmem-cu13 3.6.5): the host
//! opens `nvshmem_transport_libfabric.so.5`, its `non_abi/nvshmem_version.h` defines plugin version
//! 5.0.0, and its shared-types header (`device_host_transport/nvshmem_common_transport.h`) equals
//! 3.5.21's: no float AMOs, no regions. No public `transport.h` of 3.6 was found, so the layout is
//! v4's (the major moved with 3.6's multi-NIC rework inside NVIDIA's own transports); the GPU suite
//! under the real 3.6.5 is what confirms it.
use std::ffi::c_int;

use super::v4::HostOpsV4;
use super::TransportTail;

/// `struct nvshmem_transport`, v5: the v4 layout.
#[repr(C)]
pub struct TransportV5 {
    pub api_version: c_int,
    pub type_: c_int,
    pub cap: *mut c_int,
    pub tail: TransportTail,
    pub host_ops: HostOpsV4,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(TransportV5, tail) == 0x10);
    assert!(offset_of!(TransportV5, host_ops) == 0x80);
    assert!(size_of::<TransportV5>() == 0xf8);
};
