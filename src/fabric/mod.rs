//! Safe layer over libfabric: provider choice, the provider's capabilities (`caps`: the one place
//! a provider's identity is turned into what the crate acts on), RAII objects (one file per object: domain, av, cq,
//! cntr, endpoint, mr), non-owning handles of objects C callers own, typed atomic ops, datatypes,
//! flags and error numbers, the EFA GDA ops table (`efa_gda`, `efa_gda_abi`), and errors that carry
//! `fi_strerror` text and context. Every libfabric call of the crate is made here; data-transfer
//! calls are `unsafe fn`s whose safety contract is that buffers and contexts outlive the operation.
mod av;
pub mod caps;
mod cntr;
mod context;
mod cq;
mod domain;
pub mod efa_gda;
pub mod efa_gda_abi;
mod endpoint;
mod error;
mod handle;
mod info;
mod mr;
#[cfg(test)]
mod mr_gpu_tests;
pub mod rxm;
mod types;

pub use av::AddressVector;
pub use caps::Caps;
pub use cntr::Counter;
pub use context::{OpContext, OpContexts};
pub use cq::{CompletionQueue, CqEntry, CqError};
pub use domain::{Domain, Fabric, FiAddr};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use handle::{CqHandle, DomainHandle, EndpointHandle, MrHandle};
pub use info::{
    library_version, list_nics, list_providers, Info, InfoRequest, NicAddr, Provider, API_VERSION,
};
pub use mr::{mr_attr_layout, DmabufSource, GpuRegistration, MemKind, MemoryRegion};
/// Raw libfabric bindings, for the crate's own tests only (they compare error texts with
/// libfabric's); the library itself uses the typed names of this module outside `fabric`.
#[cfg(any(test, feature = "test-support"))]
pub use ofi_libfabric_sys::bindgen as sys;
pub use types::{errno, flags, AtomicOp, Datatype};
