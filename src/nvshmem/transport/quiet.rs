//! quiet / fence: wait, bounded, for every operation posted on an endpoint before the call: the
//! kernel atomics of the endpoint (settled: applied, or taken over and posted the provider's way),
//! the same-host copies of the endpoint's copy queue, then the fabric operations.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::endpoints::EpState;
use super::peers::PeerAcct;
use super::{internal, Connected, TResult, Transport};
use crate::mover::stats::Stage;

impl Transport {
    /// `quiet` / `fence`: every operation posted on endpoint `ep` before the call is complete.
    pub fn quiet(&self, ep: usize) -> TResult<()> {
        let Some(c) = self.conn.get() else {
            return Ok(());
        };
        self.check_alive()?;
        let e = &c.eps[ep];
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        let t = self.mover.stats().start();
        // Kernel atomics first: those the host takes over are posted now and counted below.
        self.settle_kernel_amos(ep, Some(deadline))?;
        // Staged puts still being coalesced leave now (their waits are counted already).
        self.close_all(c, ep, false);
        let target = e.submitted.load(Ordering::Acquire);
        // Same-host copies (they need no progress of this endpoint; an error or the deadline ends
        // the wait with an error, never a hang).
        self.mover
            .quiet(ep, deadline)
            .map_err(|err| internal(format!("quiet on endpoint {ep}: {err}")))?;
        let mut warned = false;
        let started = Instant::now();
        let completed = || e.completed.load(Ordering::Acquire);
        let each_round = || {
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
        };
        self.drive_until(c, ep, target, completed, deadline, each_round, |outstanding| {
            format!(
                "quiet: {outstanding} operation(s) on endpoint {ep} not complete after {:?} (peer gone?)",
                self.cfg.quiet_timeout
            )
        })
        .inspect_err(|_| {
            // Every peer still owing an answer on this endpoint (see `unanswered`).
            for (pe, a) in e.peer.iter().enumerate() {
                if a.completed.load(Ordering::Acquire) < a.submitted.load(Ordering::Acquire) {
                    self.unanswered(c, pe, self.cfg.quiet_timeout);
                }
            }
        })?;
        // Every extra rail (their errors land on the peers, taken below).
        if self.rails.active() {
            self.rails_quiet(c, ep, None, deadline)?;
        }
        self.mover.stats().record(Stage::Quiet, t, 0);
        // Atomics the host took over from kernels are complete now.
        self.mover.amos().end_host_mode(ep);
        tracing::trace!("quiet: endpoint {ep} done");
        match take_failure(e, &e.peer) {
            Some(msg) => Err(internal(format!(
                "quiet: operation(s) failed on endpoint {ep}: {msg}"
            ))),
            None => Ok(()),
        }
    }

    /// `quiet` / `fence` towards one PE (`pe < 0`: all): every operation posted to it on endpoint
    /// `ep` before the call is complete, or has failed. Operations to other PEs are not waited for,
    /// so a dead or stopped peer does not hold up quiet towards the living.
    pub fn quiet_pe(&self, ep: usize, pe: i32) -> TResult<()> {
        let Some(c) = self.conn.get() else {
            return Ok(());
        };
        if pe < 0 {
            return self.quiet(ep);
        }
        self.check_alive()?;
        self.check_pe_range(c, pe)?;
        tracing::trace!("quiet: pe {pe}, endpoint {ep}");
        let e = &c.eps[ep];
        let a = &e.peer[pe as usize];
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        // Kernel atomics of the endpoint (to any PE; they need no peer to be decided) first.
        self.settle_kernel_amos(ep, Some(deadline))?;
        // Staged puts and gets to this PE still being coalesced leave now.
        self.close_peer(c, ep, pe as usize);
        self.post_staged(c, ep);
        let target = a.submitted.load(Ordering::Acquire);
        // Same-host copies of this endpoint first (the copy queue is not per peer; copies need no
        // peer to make progress, so a dead peer cannot hold this wait up).
        self.mover
            .quiet(ep, deadline)
            .map_err(|err| internal(format!("quiet on endpoint {ep}: {err}")))?;
        let completed = || a.completed.load(Ordering::Acquire);
        self.drive_until(c, ep, target, completed, deadline, || {}, |outstanding| {
            format!(
                "quiet: {outstanding} operation(s) to PE {pe} on endpoint {ep} not complete after {:?} (peer stuck?)",
                self.cfg.quiet_timeout
            )
        })
        .inspect_err(|_| self.unanswered(c, pe as usize, self.cfg.quiet_timeout))?;
        if self.rails.active() {
            self.rails_quiet(c, ep, Some(pe as usize), deadline)?;
        }
        match take_failure(e, std::slice::from_ref(a)) {
            Some(msg) => Err(internal(format!(
                "quiet: operation(s) to PE {pe} failed on endpoint {ep}: {msg}"
            ))),
            None => {
                tracing::trace!("quiet: pe {pe}, endpoint {ep} done");
                Ok(())
            }
        }
    }

    /// Drives endpoint `ep` until `completed()` reaches `target` (`each_round` runs after every
    /// round of progress); past `deadline` fails with the error `late` words for the number of
    /// operations still outstanding.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn drive_until(
        &self,
        c: &Connected,
        ep: usize,
        target: u64,
        completed: impl Fn() -> u64,
        deadline: Instant,
        mut each_round: impl FnMut(),
        late: impl Fn(u64) -> String,
    ) -> TResult<()> {
        let mut spins = 0u32;
        while completed() < target {
            self.check_alive()?;
            self.progress_ep(c, ep);
            each_round();
            if Instant::now() > deadline {
                return Err(internal(late(target.saturating_sub(completed()))));
            }
            spins += 1;
            if spins > 1000 {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// Takes (and clears) the error counts of `peers` and of endpoint `e`: the endpoint's last error
/// if it has one, else the last of the peers', or `None` when nothing failed.
fn take_failure(e: &EpState, peers: &[PeerAcct]) -> Option<String> {
    let mut failed = None;
    for a in peers {
        if a.errors.swap(0, Ordering::AcqRel) > 0 {
            failed = a.last_error.lock().take().or(failed);
        }
    }
    if e.errors.swap(0, Ordering::AcqRel) > 0 {
        failed = e.last_error.lock().take().or(failed);
    }
    failed
}
