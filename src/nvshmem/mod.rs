//! NVSHMEM remote transport: the ABI mirror ([`abi`]) and the one ABI-independent implementation
//! ([`transport`]). The `extern "C"` entry points and per-ABI adapters are in `crate::capi::transport`.
pub mod abi;
pub mod transport;

pub use transport::{Transport, TransportError, EP_HOST, EP_PROXY, NUM_EPS};

/// Transport ABI majors this library serves: 3 (NVSHMEM 3.4.x) and 4 (NVSHMEM 3.5.x).
pub const SUPPORTED_MAJORS: [i32; 2] = [3, 4];
