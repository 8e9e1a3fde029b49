//! The process-global GDA context: what this library's transport and the C API drive. One [`Gda`]
//! behind a lock; every call is thread-safe, `init_*` and [`fini`] are idempotent.
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::Config;
use crate::fabric::{CqHandle, Domain, DomainHandle, EndpointHandle, MemoryRegion, MrHandle};

use super::error::{GdaError, Result};
use super::state::NvshmemEfaGdaDeviceState;
use super::{Gda, GdaOptions};

static GDA: Mutex<Option<Gda>> = Mutex::new(None);

/// Initialises GDA for this library's own transport on `domain` (idempotent: a second call on the
/// same domain returns the mode chosen the first time). Returns `MODE_OFF`, `MODE_HW` or
/// `MODE_SOFT`.
pub fn init_internal(domain: &Arc<Domain>, cfg: &Config) -> Result<u32> {
    install(domain.handle(), || {
        Gda::new(domain, cfg, &GdaOptions::default())
    })
}

/// Initialises hardware GDA on an endpoint the caller owns (patched NVSHMEM). The configuration is
/// read from the environment.
///
/// # Safety
/// As for [`Gda::on_external_ep`].
pub unsafe fn init_on_external_ep(domain: DomainHandle, ep: EndpointHandle) -> Result<u32> {
    let cfg = Config::from_env().map_err(|e| GdaError::invalid(e.to_string()))?;
    // SAFETY: forwarded contract.
    install(domain, || unsafe { Gda::on_external_ep(domain, ep, &cfg) })
}

/// Makes the context `make` builds the global one unless one exists: then its mode when it is on
/// `domain`, else `-EALREADY`.
fn install(domain: DomainHandle, make: impl FnOnce() -> Result<Gda>) -> Result<u32> {
    let mut g = GDA.lock();
    if let Some(x) = g.as_ref() {
        if x.same_domain(domain) {
            return Ok(x.mode);
        }
        return Err(GdaError {
            code: -libc::EALREADY,
            message: "GDA is already initialised on another domain".into(),
        });
    }
    let gda = make()?;
    let m = gda.mode;
    *g = Some(gda);
    Ok(m)
}

fn with<T>(f: impl FnOnce(&mut Gda) -> Result<T>) -> Result<T> {
    let mut g = GDA.lock();
    f(g.as_mut().ok_or_else(GdaError::not_initialised)?)
}

/// Public functions that run a [`Gda`] method of the same name and arguments on the global context
/// (`GdaError::not_initialised` without one).
macro_rules! on_global {
    ($($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            with(|g| g.$name($($arg),*))
        }
    )*};
}

on_global! {
    /// Raw name of the GDA endpoint.
    pub fn address() -> Result<Vec<u8>>;
    /// Builds the peer table (see [`Gda::connect`]).
    pub fn connect(my_pe: i32, n_pes: i32, names: &[u8], fi_addrs: Option<&[u64]>) -> Result<()>;
    /// Sets the local heap (see [`Gda::set_local_heap`]). A given `mr` must stay open until
    /// [`fini`].
    pub fn set_local_heap(base: u64, size: u64, mr: Option<&MemoryRegion>) -> Result<()>;
    /// Forgets the heap chunk at heap offset `start` on every PE (see [`Gda::remove_heap_chunk`]).
    pub fn remove_heap_chunk(start: u64) -> Result<bool>;
    /// Records a chunk of PE `pe`'s heap (see [`Gda::add_remote_heap_chunk`]).
    pub fn add_remote_heap_chunk(
        pe: i32, start: u64, end: u64, addr: u64, key: u64, log2: u32
    ) -> Result<()>;
    /// Records a peer's heap (see [`Gda::set_remote_heap`]).
    pub fn set_remote_heap(pe: i32, base: u64, size: u64, key: u64) -> Result<()>;
    /// The key peers use for this PE's heap.
    pub fn local_heap_key() -> Result<u64>;
    /// Names where peers' heaps are mapped here (see [`Gda::set_peer_memory`]).
    pub fn set_peer_memory(pm: Option<Arc<dyn super::PeerMemory>>) -> Result<()>;
}

/// [`set_local_heap`] with a raw registration.
///
/// # Safety
/// As for [`Gda::set_local_heap_raw`], with "until [`fini`]".
pub unsafe fn set_local_heap_raw(base: u64, size: u64, mr: Option<MrHandle>) -> Result<()> {
    // SAFETY: forwarded contract.
    with(|g| unsafe { g.set_local_heap_raw(base, size, mr) })
}

/// Adds a local heap chunk (see [`Gda::add_local_heap_chunk`]). A given `mr` must stay open until
/// the chunk is removed ([`remove_heap_chunk_at`]) or [`fini`].
///
/// # Safety
/// The memory must stay allocated as long.
pub unsafe fn add_local_heap_chunk(
    start: u64,
    end: u64,
    base: u64,
    mr: Option<&MemoryRegion>,
    log2: u32,
) -> Result<()> {
    // SAFETY: a MemoryRegion is an open registration (of this range, per the caller); forwarded
    // contract for its lifetime and the memory's.
    with(|g| unsafe {
        g.add_local_heap_chunk(start, end, base, mr.map(|m| (m.handle(), m.kind())), log2)
    })
}

/// [`add_local_heap_chunk`] with a raw registration (memory kind found from the address).
///
/// # Safety
/// As for [`add_local_heap_chunk`]; `mr`, when given, an open registration of the range.
pub unsafe fn add_local_heap_chunk_raw(
    start: u64,
    end: u64,
    base: u64,
    mr: Option<MrHandle>,
    log2: u32,
) -> Result<()> {
    let kind = super::mem::mem_kind(base);
    // SAFETY: forwarded contract.
    with(|g| unsafe { g.add_local_heap_chunk(start, end, base, mr.map(|m| (m, kind)), log2) })
}

/// The heap granularity (log2) in use, once a chunk named it.
pub fn heap_log2() -> Option<u32> {
    GDA.lock().as_ref().and_then(|g| g.heap_log2())
}

/// Forgets the heap chunk whose local registration starts at `base`, on every PE (see
/// [`Gda::remove_heap_chunk`]); `Ok(false)` when no local chunk is there.
pub fn remove_heap_chunk_at(base: u64) -> Result<bool> {
    with(|g| match g.local_chunk_start(base) {
        Some(start) => g.remove_heap_chunk(start),
        None => Ok(false),
    })
}

/// Names the transmit CQ of the caller's endpoint (hardware GDA on an external endpoint).
///
/// # Safety
/// As for [`HwQueue::set_cq`].
pub unsafe fn set_cq(cq: CqHandle) -> Result<()> {
    // SAFETY: forwarded contract.
    with(|g| unsafe { g.set_cq(cq) })
}

/// The device state (host copy), if initialised with a queue.
pub fn device_state() -> Option<NvshmemEfaGdaDeviceState> {
    GDA.lock().as_ref().and_then(|g| g.device_state())
}

/// Address of the device-resident copy of the state kernels read (host address without CUDA), or 0.
pub fn device_state_device_ptr() -> u64 {
    GDA.lock().as_ref().map_or(0, |g| g.device_state_ptr())
}

/// 0 off, 1 hardware, 2 software, `-ENODEV` when not initialised.
pub fn mode() -> i32 {
    GDA.lock().as_ref().map_or(-libc::ENODEV, |g| g.mode as i32)
}

/// Shuts GDA down (stops the software queue, unmaps the hardware queue). Idempotent.
pub fn fini() {
    let g = GDA.lock().take();
    drop(g);
}
