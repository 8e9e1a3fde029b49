//! Safe layer over libfabric: provider choice, RAII objects, data-transfer calls, errors that carry
//! `fi_strerror` text and context. `unsafe` is confined to this module; data-transfer calls are
//! `unsafe fn`s whose safety contract is that buffers and contexts outlive the operation.
mod context;
mod error;
mod info;
mod objects;

pub use context::{OpContext, OpContexts};
pub use error::{Error, Result};
pub use info::{library_version, list_providers, Info, InfoRequest, Provider, API_VERSION};
pub use objects::{
    AddressVector, CompletionQueue, Counter, CqEntry, CqError, Domain, Endpoint, Fabric, FiAddr,
    MemKind, MemoryRegion,
};
/// Raw libfabric constants and types used by callers of this layer.
pub use ofi_libfabric_sys::bindgen as sys;
