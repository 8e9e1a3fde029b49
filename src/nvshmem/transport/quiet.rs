//! quiet / fence: wait, bounded, for every operation posted on an endpoint before the call: the
//! same-host copies of the endpoint's copy queue, then the fabric operations.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{internal, TResult, Transport};
use crate::mover::stats::Stage;

impl Transport {
    /// `quiet` / `fence`: every operation posted on endpoint `ep` before the call is complete.
    pub fn quiet(&self, ep: usize) -> TResult<()> {
        let Some(c) = self.conn.get() else {
            return Ok(());
        };
        self.check_alive()?;
        let e = &c.eps[ep];
        let target = e.submitted.load(Ordering::Acquire);
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        let t = self.mover.stats().start();
        // Same-host copies (they need no progress of this endpoint; an error or the deadline ends
        // the wait with an error, never a hang).
        self.mover
            .quiet(ep, deadline)
            .map_err(|err| internal(format!("quiet on endpoint {ep}: {err}")))?;
        let mut spins = 0u32;
        let mut warned = false;
        let started = Instant::now();
        while e.completed.load(Ordering::Acquire) < target {
            self.check_alive()?;
            self.progress_ep(c, ep);
            if !warned && started.elapsed() > Duration::from_secs(2) {
                warned = true;
                tracing::warn!(
                    "quiet on endpoint {ep}: {} operation(s) still outstanding after 2 s ({} contexts in flight, {} errors so far); stages so far: {}",
                    target.saturating_sub(e.completed.load(Ordering::Acquire)),
                    e.ctxs.in_flight(),
                    e.errors.load(Ordering::Acquire),
                    self.mover.stats().summary()
                );
            }
            if Instant::now() > deadline {
                let outstanding = target.saturating_sub(e.completed.load(Ordering::Acquire));
                return Err(internal(format!(
                    "quiet: {outstanding} operation(s) on endpoint {ep} not complete after {:?} (peer gone?)",
                    self.cfg.quiet_timeout
                )));
            }
            spins += 1;
            if spins > 1000 {
                std::thread::yield_now();
            }
        }
        self.mover.stats().record(Stage::Quiet, t, 0);
        if e.errors.swap(0, Ordering::AcqRel) > 0 {
            let msg = e.last_error.lock().take().unwrap_or_default();
            return Err(internal(format!(
                "quiet: operation(s) failed on endpoint {ep}: {msg}"
            )));
        }
        Ok(())
    }
}
