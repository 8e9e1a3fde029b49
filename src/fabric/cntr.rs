//! Completion counters.
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::domain::{close_fid, Domain};
use super::error::Result;

/// A completion counter.
pub struct Counter {
    pub(super) raw: *mut fi::fid_cntr,
    _domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE domain objects.
unsafe impl Send for Counter {}
// SAFETY: as above.
unsafe impl Sync for Counter {}

impl Counter {
    /// Opens a counter of completions.
    pub fn open(domain: &Arc<Domain>) -> Result<Arc<Counter>> {
        // SAFETY: zeroed attr is valid input.
        let mut attr: fi::fi_cntr_attr = unsafe { std::mem::zeroed() };
        attr.events = fi::fi_cntr_events_FI_CNTR_EVENTS_COMP;
        attr.wait_obj = fi::fi_wait_obj_FI_WAIT_NONE;
        let raw = domain.open_object(fi::fi_cntr_open, &mut attr, "fi_cntr_open")?;
        Ok(Arc::new(Counter {
            raw,
            _domain: domain.clone(),
        }))
    }

    /// Takes ownership of a counter the provider opened on `domain` by another call (the GDA ops'
    /// `cntr_open_ext`).
    ///
    /// # Safety
    /// `raw` is an open counter of `domain`, closed by nobody else.
    pub(super) unsafe fn from_raw(domain: &Arc<Domain>, raw: *mut fi::fid_cntr) -> Arc<Counter> {
        Arc::new(Counter {
            raw,
            _domain: domain.clone(),
        })
    }

    /// Successful completions so far.
    pub fn read(&self) -> u64 {
        // SAFETY: open counter.
        unsafe { fi::fi_cntr_read(self.raw) }
    }

    /// Failed completions so far.
    pub fn read_err(&self) -> u64 {
        // SAFETY: open counter.
        unsafe { fi::fi_cntr_readerr(self.raw) }
    }

    pub(super) fn fid(&self) -> *mut fi::fid {
        // SAFETY: open counter.
        unsafe { &mut (*self.raw).fid }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        close_fid(self.fid(), "cntr");
    }
}
