//! nvshmem-efa-gda: an NVSHMEM remote transport over libfabric, EFA GPU Direct Async queue publishing,
//! and a software EFA queue that runs the same GPU posting path on machines without EFA.
//!
//! Layout: [`fabric`] is the safe libfabric layer; [`efa`] the EFA queue formats and the GDA ops
//! binding; [`gda`] the queue geometry shared with the GPU, the hardware mapping and the software
//! queue; [`nvshmem`] the NVSHMEM transport ABI mirror and the transport; [`capi`] every `extern "C"`
//! entry point; [`config`] every environment variable; [`route`] how data moves, decided once
//! from the provider's capabilities ([`fabric::Caps`]) and the configuration; [`topo`] the PCIe
//! topology (sysfs) and the choice of a GPU's nearest NICs.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod capi;
/// cbindgen:ignore
pub mod config;
/// cbindgen:ignore
pub mod cuda;
/// cbindgen:ignore
pub mod efa;
/// cbindgen:ignore
pub mod fabric;
pub mod gda;
/// cbindgen:ignore
pub mod log;
/// cbindgen:ignore
pub mod mover;
/// cbindgen:ignore
pub mod nvshmem;
/// cbindgen:ignore
pub mod route;
/// cbindgen:ignore
pub mod topo;
