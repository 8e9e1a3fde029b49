//! Quiet over the extra rails, and the rails' summary lines.
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::{internal, Connected, TResult, Transport};

impl Transport {
    /// Waits (until `deadline`) for the operations on every extra rail posted before the call on
    /// endpoint `ep` (to PE `pe`, or to all); their errors are recorded for the caller's quiet.
    pub(in crate::nvshmem::transport) fn rails_quiet(
        &self,
        c: &Connected,
        ep: usize,
        pe: Option<usize>,
        deadline: Instant,
    ) -> TResult<()> {
        let n = c.n_pes as usize;
        let range = match pe {
            Some(p) => p..p + 1,
            None => 0..n,
        };
        let targets: Vec<(usize, usize, u64)> = self
            .rails
            .extra
            .iter()
            .filter_map(|r| r.counts.get().map(|cs| (r, cs)))
            .flat_map(|(r, cs)| {
                range.clone().map(move |p| {
                    (
                        r.index,
                        ep * n + p,
                        cs[ep * n + p].0.load(Ordering::Acquire),
                    )
                })
            })
            .collect();
        let done = |(ri, slot, want): &(usize, usize, u64)| {
            self.rails.extra[ri - 1]
                .counts
                .get()
                .is_some_and(|cs| cs[*slot].1.load(Ordering::Acquire) >= *want)
        };
        while !targets.iter().all(done) {
            self.check_alive()?;
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "quiet: operations on the extra rails of endpoint {ep} not complete after {:?}",
                    self.cfg.quiet_timeout
                )));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// One line per rail for the description and the log at shutdown.
    pub(in crate::nvshmem::transport) fn rails_summary(&self) -> Vec<String> {
        if !self.rails.active() {
            return Vec::new();
        }
        self.rails
            .stats()
            .into_iter()
            .map(|s| {
                format!(
                    "rail {} ({}): {} operations, {} bytes, {} AMOs{}",
                    s.index,
                    s.name,
                    s.ops,
                    s.bytes,
                    s.amos,
                    s.failed
                        .map(|w| format!(", failed: {w}"))
                        .unwrap_or_default()
                )
            })
            .collect()
    }
}
