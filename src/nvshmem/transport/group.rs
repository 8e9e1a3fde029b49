//! Completion groups: a blocking call waits for its own operations and reports only their errors.
//!
//! A blocking call (a blocking put or get, a chunk of the bounce buffer, put_signal's data and
//! signal) makes a [`Group`] and enters it on its thread ([`GroupScope`]); every counted context the
//! thread takes meanwhile joins the group (scratch word [`SCRATCH_GROUP`] holds a reference). The
//! completion of such a context records its error in the group, not on the endpoint, so a later
//! quiet never reports it again and an earlier non-blocking operation's error never lands on the
//! blocking call.
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::{internal, Connected, TResult, Transport};

/// The operations of one blocking call and the first error among them.
#[derive(Default)]
pub(super) struct Group {
    pub(super) pending: AtomicU64,
    pub(super) error: Mutex<Option<String>>,
}

thread_local! {
    /// The group that counted contexts taken on this thread join (set by a blocking call).
    static GROUP: RefCell<Option<Arc<Group>>> = const { RefCell::new(None) };
}

/// Scratch word of a counted context (TAG_OP, TAG_AM_WAIT) holding its group (`Arc::into_raw`).
pub(super) const SCRATCH_GROUP: usize = 7;

/// Makes the counted contexts this thread takes join `g` until dropped (then the previous group,
/// if any, is current again).
pub(super) struct GroupScope(Option<Arc<Group>>);

impl GroupScope {
    pub(super) fn enter(g: &Arc<Group>) -> GroupScope {
        GroupScope(GROUP.with(|c| c.replace(Some(g.clone()))))
    }
}

impl Drop for GroupScope {
    fn drop(&mut self) {
        let prev = self.0.take();
        GROUP.with(|c| *c.borrow_mut() = prev);
    }
}

/// The group of this thread, if a blocking call is posting.
pub(super) fn current() -> Option<Arc<Group>> {
    GROUP.with(|c| c.borrow().clone())
}

impl Transport {
    /// Waits (bounded by the quiet timeout) until the operations of a blocking call completed;
    /// returns the first error among them.
    pub(super) fn wait_group(
        &self,
        c: &Connected,
        ep: usize,
        g: &Group,
        what: &str,
    ) -> TResult<()> {
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        let mut spins = 0u32;
        while g.pending.load(Ordering::Acquire) > 0 {
            self.check_alive()?;
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "{what}: {} operation(s) on endpoint {ep} not complete after {:?} (peer gone?)",
                    g.pending.load(Ordering::Acquire),
                    self.cfg.quiet_timeout
                )));
            }
            spins += 1;
            if spins > 1000 {
                std::thread::yield_now();
            }
        }
        match g.error.lock().take() {
            Some(m) => Err(internal(format!("{what} failed: {m}"))),
            None => Ok(()),
        }
    }
}
