//! Transport ABI 5 (NVSHMEM 3.6.x). Source: NVIDIA/nvshmem commit
//! ef92d34f16d05a7f119b760da864efaa0742d20d, whose `src/CMakeLists.txt` sets
//! `TRANSPORT_VERSION_MAJOR 5` and whose exported header list matches the 3.6.5 wheel's `include/`
//! (no logical endpoints, no GDAKI). Its `src/include/internal/host_transport/transport.h` keeps v4's
//! layout field for field: `struct nvshmem_transport` with the host ops last, the same fifteen host
//! ops in the same order with the same signatures (`connect_endpoints` with QP outputs, `rma`/`amo`
//! /`quiet` with a QP index, `fence` with QP index and `is_multi`, the C++ `std::vector` `put_signal`),
//! and the 16-byte `amo_verb_t`. The one addition is the library code `GPUNETIO = 2` of the struct's
//! `type` (the plugin writes NONE). The wheel nvidia-nvshmem-cu13 3.6.5 states plugin version 5.0.0.
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
