//! Who owns a GDA context, and how the C API finds the current one.
//!
//! * [`GdaHandle`]: a shared, lockable slot for one [`Gda`]. This library's NVSHMEM transport holds
//!   one for its lifetime: it creates the context in it at connect ([`GdaHandle::init`]), calls the
//!   context's methods through it, and drops the context at finalize ([`GdaHandle::shutdown`]) or
//!   when the transport goes.
//! * The registry: the one context the C API (`nvshmemt_efa_gda_*`, [`crate::capi::gda`]) and CUDA
//!   programs (`nvshmemt_efa_gda_get_device_state`) reach. A transport registers a weak reference to
//!   its handle while it lives, so the registry never keeps a transport's context alive. Without a
//!   transport ([`init_on_external_ep`]: a patched NVSHMEM that owns the endpoint; [`init_internal`]:
//!   tools and tests on a domain of their own) the registry owns the context until [`fini`].
//!
//! One context is current at a time: `init_*` on the current context's domain returns its mode
//! (idempotent), on another domain `-EALREADY`. [`fini`] shuts the current context down whoever owns
//! it (its owner then sees no context) and is idempotent. Every call is thread-safe. Lock order: the
//! registry before a context, never the reverse; a context is dropped with no lock held.
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::config::Config;
use crate::fabric::{CqHandle, Domain, DomainHandle, EndpointHandle, MemoryRegion, MrHandle};

use super::error::{GdaError, Result};
use super::state::NvshmemEfaGdaDeviceState;
use super::{Gda, GdaOptions};

type Slot = Mutex<Option<Gda>>;

/// A shared slot for one GDA context (empty before init and after shutdown). Clones share the slot.
#[derive(Clone, Default)]
pub struct GdaHandle(Arc<Slot>);

/// The registry's entry: a transport's context (weak) or one the registry owns.
enum Registered {
    Transport(Weak<Slot>),
    Owned(GdaHandle),
}

impl Registered {
    fn handle(&self) -> Option<GdaHandle> {
        match self {
            Registered::Transport(w) => w.upgrade().map(GdaHandle),
            Registered::Owned(h) => Some(h.clone()),
        }
    }
}

static REGISTRY: Mutex<Option<Registered>> = Mutex::new(None);

impl GdaHandle {
    /// An empty slot.
    pub fn new() -> GdaHandle {
        GdaHandle::default()
    }

    /// Creates the context on `domain` (mode as `cfg.gda` says) in this slot and registers it, weakly,
    /// as the C API's current context. Idempotent on the same domain; `-EALREADY` while another live
    /// context on another domain is current. Returns `MODE_OFF`, `MODE_HW` or `MODE_SOFT`.
    pub fn init(&self, domain: &Arc<Domain>, cfg: &Config) -> Result<u32> {
        install(domain.handle(), Some(self), || {
            Gda::new(domain, cfg, &GdaOptions::default())
        })
    }

    /// Runs `f` on the context; `GdaError::not_initialised` when the slot is empty.
    pub fn with<T>(&self, f: impl FnOnce(&mut Gda) -> Result<T>) -> Result<T> {
        let mut g = self.0.lock();
        f(g.as_mut().ok_or_else(GdaError::not_initialised)?)
    }

    /// Runs `f` on the context, if there is one.
    fn peek<T>(&self, f: impl FnOnce(&Gda) -> T) -> Option<T> {
        self.0.lock().as_ref().map(f)
    }

    /// The context's mode (`MODE_OFF`, `MODE_HW`, `MODE_SOFT`), `None` when the slot is empty.
    pub fn mode(&self) -> Option<u32> {
        self.peek(|g| g.mode)
    }

    /// Whether the slot holds a context with a queue (hardware or software, not off).
    pub fn active(&self) -> bool {
        self.mode().is_some_and(|m| m != super::MODE_OFF)
    }

    /// The heap granularity (log2) in use, once a chunk named it.
    pub fn heap_log2(&self) -> Option<u32> {
        self.peek(|g| g.heap_log2()).flatten()
    }

    /// Adds a local heap chunk (see [`Gda::add_local_heap_chunk`]). A given `mr` must stay open until
    /// the chunk is removed ([`GdaHandle::remove_heap_chunk_at`]) or the context goes.
    ///
    /// # Safety
    /// The memory must stay allocated as long.
    pub unsafe fn add_local_heap_chunk(
        &self,
        start: u64,
        end: u64,
        base: u64,
        mr: Option<&MemoryRegion>,
        log2: u32,
    ) -> Result<()> {
        // SAFETY: a MemoryRegion is an open registration (of this range, per the caller); forwarded
        // contract for its lifetime and the memory's.
        self.with(|g| unsafe {
            g.add_local_heap_chunk(start, end, base, mr.map(|m| (m.handle(), m.kind())), log2)
        })
    }

    /// Forgets the heap chunk whose local registration starts at `base`, on every PE (see
    /// [`Gda::remove_heap_chunk`]); `Ok(false)` when no local chunk is there.
    pub fn remove_heap_chunk_at(&self, base: u64) -> Result<bool> {
        self.with(|g| match g.local_chunk_start(base) {
            Some(start) => g.remove_heap_chunk(start),
            None => Ok(false),
        })
    }

    /// Empties the slot (stops the software queue, unmaps the hardware queue) and takes it out of the
    /// registry if it is the current context there. Idempotent.
    pub fn shutdown(&self) {
        {
            let mut r = REGISTRY.lock();
            if r.as_ref()
                .and_then(Registered::handle)
                .is_some_and(|h| h.is(self))
            {
                *r = None;
            }
        }
        let g = self.0.lock().take();
        drop(g);
    }

    fn is(&self, other: &GdaHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Initialises GDA on `domain` without a transport (tools and tests): the registry owns the context
/// until [`fini`]. Idempotent for the same domain; `-EALREADY` on another. Returns the mode.
pub fn init_internal(domain: &Arc<Domain>, cfg: &Config) -> Result<u32> {
    install(domain.handle(), None, || {
        Gda::new(domain, cfg, &GdaOptions::default())
    })
}

/// Initialises hardware GDA on an endpoint the caller owns (patched NVSHMEM); the registry owns the
/// context until [`fini`]. The configuration is read from the environment.
///
/// # Safety
/// As for [`Gda::on_external_ep`].
pub unsafe fn init_on_external_ep(domain: DomainHandle, ep: EndpointHandle) -> Result<u32> {
    let cfg = Config::from_env().map_err(|e| GdaError::invalid(e.to_string()))?;
    // SAFETY: forwarded contract.
    install(domain, None, || unsafe {
        Gda::on_external_ep(domain, ep, &cfg)
    })
}

/// Makes the context `make` builds the current one, in `slot` (registered weakly) or in a slot the
/// registry owns (`None`), unless a live context is current: then its mode when it is on `domain`,
/// else `-EALREADY`.
fn install(
    domain: DomainHandle,
    slot: Option<&GdaHandle>,
    make: impl FnOnce() -> Result<Gda>,
) -> Result<u32> {
    let mut r = REGISTRY.lock();
    if let Some(cur) = r.as_ref().and_then(Registered::handle) {
        let state = cur.peek(|x| (x.same_domain(domain), x.mode));
        match state {
            Some((true, mode)) => return Ok(mode),
            Some((false, _)) => {
                return Err(GdaError {
                    code: -libc::EALREADY,
                    message: "GDA is already initialised on another domain".into(),
                })
            }
            // Shut down by its owner: the registry is free.
            None => {}
        }
    }
    let gda = make()?;
    let m = gda.mode;
    let entry = match slot {
        Some(h) => {
            *h.0.lock() = Some(gda);
            Registered::Transport(Arc::downgrade(&h.0))
        }
        None => {
            let h = GdaHandle::new();
            *h.0.lock() = Some(gda);
            Registered::Owned(h)
        }
    };
    // A context this replaces was shut down already (its slot is empty or gone).
    *r = Some(entry);
    Ok(m)
}

/// The current context's handle.
fn current() -> Option<GdaHandle> {
    REGISTRY.lock().as_ref().and_then(Registered::handle)
}

/// Runs `f` on the current context (`GdaError::not_initialised` without one).
fn with<T>(f: impl FnOnce(&mut Gda) -> Result<T>) -> Result<T> {
    current().ok_or_else(GdaError::not_initialised)?.with(f)
}

/// Public functions that run a [`Gda`] method of the same name and arguments on the current context
/// (`GdaError::not_initialised` without one).
macro_rules! on_current {
    ($($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            with(|g| g.$name($($arg),*))
        }
    )*};
}

on_current! {
    /// Raw name of the GDA endpoint.
    pub fn address() -> Result<Vec<u8>>;
    /// Builds the peer table (see [`Gda::connect`]).
    pub fn connect(my_pe: i32, n_pes: i32, names: &[u8], fi_addrs: Option<&[u64]>) -> Result<()>;
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
}

/// Sets the local heap of the current context with a raw registration (see
/// [`Gda::set_local_heap_raw`]).
///
/// # Safety
/// As for [`Gda::set_local_heap_raw`], with "until the context goes".
pub unsafe fn set_local_heap_raw(base: u64, size: u64, mr: Option<MrHandle>) -> Result<()> {
    // SAFETY: forwarded contract.
    with(|g| unsafe { g.set_local_heap_raw(base, size, mr) })
}

/// Adds a local heap chunk to the current context with a raw registration (memory kind found from
/// the address; see [`Gda::add_local_heap_chunk`]).
///
/// # Safety
/// `mr`, when given, an open registration of the range that stays open until the chunk is removed or
/// the context goes; the memory must stay allocated as long.
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

/// Names the transmit CQ of the caller's endpoint (hardware GDA on an external endpoint).
///
/// # Safety
/// As for [`HwQueue::set_cq`](super::hw::HwQueue::set_cq).
pub unsafe fn set_cq(cq: CqHandle) -> Result<()> {
    // SAFETY: forwarded contract.
    with(|g| unsafe { g.set_cq(cq) })
}

/// The current context's device state (host copy), if it has a queue.
pub fn device_state() -> Option<NvshmemEfaGdaDeviceState> {
    current()?.peek(|g| g.device_state()).flatten()
}

/// Address of the device-resident copy of the current context's state (host address without CUDA),
/// or 0.
pub fn device_state_device_ptr() -> u64 {
    current()
        .and_then(|h| h.peek(|g| g.device_state_ptr()))
        .unwrap_or(0)
}

/// The current context's mode (`MODE_OFF`, `MODE_HW`, `MODE_SOFT`), `None` without one.
pub fn mode() -> Option<u32> {
    current()?.mode()
}

/// Shuts the current context down (stops the software queue, unmaps the hardware queue), whoever
/// owns it, and empties the registry. Idempotent.
pub fn fini() {
    let h = REGISTRY.lock().take().and_then(|r| r.handle());
    if let Some(h) = h {
        let g = h.0.lock().take();
        drop(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_handle_has_no_context() {
        let h = GdaHandle::new();
        assert_eq!(h.mode(), None);
        assert!(!h.active());
        assert_eq!(h.heap_log2(), None);
        assert_eq!(
            h.remove_heap_chunk_at(0x1000).unwrap_err(),
            GdaError::not_initialised()
        );
        // Never registered: shutting it down leaves the registry alone.
        h.shutdown();
        assert!(h.with(|g| Ok(g.mode)).is_err());
    }
}
