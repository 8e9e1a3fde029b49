//! NVSHMEM remote transport: the ABI mirror ([`abi`], one file per transport ABI major), the one
//! ABI-independent implementation ([`transport`]) and the operations ABI 6/7 add on top of it
//! ([`ops_v5plus`]). The `extern "C"` entry points and per-ABI adapters are in
//! `crate::capi::transport`.
pub mod abi;
pub mod ops_v5plus;
pub mod transport;

pub use abi::SERVED_MAJORS;
pub use transport::{Transport, TransportError, EP_HOST, EP_PROXY, NUM_EPS};
