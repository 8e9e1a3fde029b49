//! Rail 0 towards one peer, and which rail carries a peer's atomics.
//!
//! Rail 0 is the transport's own domain and endpoints, shared by every peer, so it cannot be
//! closed when its connection to one peer breaks. Instead rail 0 fails per peer: when operations
//! to a peer on rail 0 see no completion for `NVSHMEM_EFA_RAIL_TIMEOUT_MS` while the peer
//! completes operations on the extra rails, rail 0 is down towards that peer for the rest of the
//! job: its operations to the peer in flight there end with an error (as when a peer is declared
//! gone, without declaring it gone), the peer's rail-0 addresses are removed from the AV and
//! inserted again (the provider drops its connection and what it still holds for it, so nothing
//! of it is delivered later), its RMA takes the extra rails, and its atomics move to the lowest
//! live extra rail as target-applied messages ([`super::msg`]).
//!
//! Atomics of one peer go over one rail at a time. A move waits until every AMO posted on the old
//! rail has ended (with its error; none is posted again): for rail 0 the peer's AMO gate (AMOs on
//! rail 0 are posted while holding it shared; the move holds it exclusively while it ends the
//! peer's rail-0 operations), for an extra rail its link lock (taken exclusively by `fail_rail`,
//! which ends that rail's operations before it moves atomics). An AMO that finds its peer's
//! atomics moving waits for the move.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use super::super::abi::AmoMemdesc;
use super::super::{internal, Connected, TResult, Transport};
use super::RAIL_FAILED;

/// `amo_rail` when no rail is left for a peer's atomics.
pub(super) const NO_RAIL: usize = usize::MAX;

/// Rail state of one peer.
pub(in crate::nvshmem::transport) struct PeerRails {
    /// Why rail 0 failed towards this peer (set once; it stays down for the job).
    down0: OnceLock<String>,
    /// Rail 0's failure handled: its operations ended, atomics moved.
    moved0: AtomicBool,
    /// The probe in flight to this peer: when it was sent (see `peer_answers`).
    ping: Mutex<Option<Instant>>,
    /// The last answered probe: when it was sent, and when its answer came.
    pong: Mutex<Option<(Instant, Instant)>>,
    /// Rail 0's completions to this peer when it failed towards it (its progress from then on).
    frozen0: AtomicU64,
    /// The rail that carries this peer's atomics (0 until rail 0 fails towards it; [`NO_RAIL`]).
    pub(super) amo_rail: AtomicUsize,
    /// AMOs on rail 0 are posted holding this shared; rail 0's failure takes it exclusively.
    gate: RwLock<()>,
    watch: Mutex<Watch>,
}

/// What the last scan saw of the peer's rail-0 operations.
#[derive(Clone, Copy)]
struct Watch {
    /// Rail-0 completions of operations to the peer (both endpoints).
    completed: u64,
    /// Whether operations were outstanding, and since when without a completion.
    busy: bool,
    since: Instant,
    /// The peer's completions on the extra rails when rail 0 was last idle towards it or last
    /// completed an operation to it.
    other: u64,
}

impl PeerRails {
    pub(super) fn new() -> PeerRails {
        PeerRails {
            down0: OnceLock::new(),
            moved0: AtomicBool::new(false),
            ping: Mutex::new(None),
            pong: Mutex::new(None),
            frozen0: AtomicU64::new(0),
            amo_rail: AtomicUsize::new(0),
            gate: RwLock::new(()),
            watch: Mutex::new(Watch {
                completed: 0,
                busy: false,
                since: Instant::now(),
                other: 0,
            }),
        }
    }

    /// Whether rail 0 is down towards this peer.
    pub(super) fn down0(&self) -> bool {
        self.down0.get().is_some()
    }
}

/// How an AMO goes: the transport's own ways on rail 0 (holding the peer's gate, when rails are
/// on, until it is posted), or done already over an extra rail.
pub(in crate::nvshmem::transport) enum RailAmo<'a> {
    Primary(Option<RwLockReadGuard<'a, ()>>),
    Done,
}

impl Transport {
    /// The state of `pe`, when rails are on and connected.
    pub(super) fn peer_rails(&self, pe: usize) -> Option<&PeerRails> {
        self.rails.peers.get().and_then(|v| v.get(pe))
    }

    /// Routes one AMO to `pe` by the rail that carries the peer's atomics: rail 0 (the caller
    /// posts it the transport's way while holding the returned gate), or an extra rail (posted
    /// here). Waits while the peer's atomics move (bounded by the quiet timeout).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::nvshmem::transport) fn rails_amo(
        &self,
        c: &Connected,
        pe: usize,
        opc: i32,
        t: &AmoMemdesc,
        val: u64,
        size: u64,
        ep: usize,
    ) -> TResult<RailAmo<'_>> {
        let Some(p) = self.peer_rails(pe) else {
            return Ok(RailAmo::Primary(None));
        };
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            let k = p.amo_rail.load(Ordering::Acquire);
            if k == 0 && !p.down0() {
                let g = p.gate.read();
                if p.amo_rail.load(Ordering::Acquire) == 0 && !p.down0() {
                    self.rails.primary_amos.fetch_add(1, Ordering::Relaxed);
                    return Ok(RailAmo::Primary(Some(g)));
                }
                continue;
            }
            if k == NO_RAIL {
                let why = p.down0.get().map(String::as_str).unwrap_or("rails failed");
                return Err(internal(if self.route.provider_atomics {
                    format!("amo to PE {pe}: rail 0 failed towards it ({why}), and provider atomics do not move to another rail (two NICs' atomics are not atomic with respect to each other)")
                } else {
                    format!("amo to PE {pe}: no rail left for its atomics ({why})")
                }));
            }
            if k != 0 && self.rail_amo(c, k, pe, opc, t, val, size, ep)? {
                return Ok(RailAmo::Done);
            }
            // Rail 0 failed towards the peer, or rail k failed: the move is under way.
            self.check_alive()?;
            self.rails_progress(c);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "amo to PE {pe}: its atomics did not move off a failed rail within {:?}",
                    self.cfg.quiet_timeout
                )));
            }
            std::thread::yield_now();
        }
    }

    /// Whether `pe` answered a probe sent (over an extra rail other than `except`) at or after
    /// `since`, at least a quarter of the rail timeout ago (operations held up by a stop that
    /// just ended complete meanwhile): `Some(false)` while not, with a probe sent where none
    /// such is in flight; `None` when no other extra rail reaches the peer (no probe possible).
    pub(super) fn peer_answers(
        &self,
        c: &Connected,
        pe: usize,
        since: Instant,
        except: usize,
    ) -> Option<bool> {
        let p = self.peer_rails(pe)?;
        let grace = self.rails.cfg.timeout / 4;
        if let Some((sent, answered)) = *p.pong.lock() {
            if sent >= since {
                return Some(answered.elapsed() >= grace);
            }
        }
        // One probe in flight at a time (a new one after a rail timeout without answer: the rail
        // it went over may have failed meanwhile).
        if p.ping
            .lock()
            .is_some_and(|sent| sent >= since && sent.elapsed() < self.rails.cfg.timeout)
        {
            return Some(false);
        }
        let k = self.rails.extra.iter().find_map(|r| {
            (r.index != except
                && r.failed.get().is_none()
                && r.link
                    .read()
                    .as_ref()
                    .is_some_and(|l| l.addrs.get(pe).is_some_and(|a| a.is_some())))
            .then_some(r.index)
        })?;
        let now = Instant::now();
        if self.rail_ping(c, k, pe, now) {
            *p.ping.lock() = Some(now);
        }
        Some(false)
    }

    /// The answer to a probe sent to `pe` at `sent`.
    pub(super) fn pong(&self, pe: usize, sent: Instant) {
        if let Some(p) = self.peer_rails(pe) {
            let mut g = p.pong.lock();
            if g.is_none_or(|(s, _)| s < sent) {
                *g = Some((sent, Instant::now()));
            }
        }
    }

    /// Rail 0's completions of operations to `pe`, up to its failure towards it.
    pub(super) fn primary_progress(&self, c: &Connected, pe: usize) -> u64 {
        match self.peer_rails(pe) {
            Some(p) if p.moved0.load(Ordering::Acquire) => p.frozen0.load(Ordering::Acquire),
            _ => rail0_completed(c, pe),
        }
    }

    /// An error for an operation to `pe` on rail 0 once rail 0 failed towards it: what has no
    /// other rail (staged transfers, RMA from unregistered memory, active messages) fails at once
    /// instead of waiting for quiet's timeout.
    pub(in crate::nvshmem::transport) fn check_primary(&self, pe: usize) -> TResult<()> {
        match self.peer_rails(pe).and_then(|p| p.down0.get()) {
            Some(why) => Err(internal(format!(
                "PE {pe}: rail 0 ({}) failed towards it ({why}), and this operation has no other rail",
                self.rails.primary_name
            ))),
            None => Ok(()),
        }
    }

    /// The lowest live extra rail that reaches `pe`.
    pub(super) fn lowest_live_rail(&self, pe: usize) -> Option<usize> {
        self.rails.extra.iter().find_map(|r| {
            (r.failed.get().is_none()
                && r.link
                    .read()
                    .as_ref()
                    .is_some_and(|l| l.addrs.get(pe).is_some_and(|a| a.is_some())))
            .then_some(r.index)
        })
    }

    /// Where the atomics of a peer whose rail failed go next, and what the log says of it.
    pub(super) fn next_amo_rail(&self, pe: usize) -> (usize, String) {
        if self.route.provider_atomics {
            // Provider atomics of another initiator may reach the same word through rail 0;
            // two NICs' atomics are not atomic with respect to each other.
            return (
                NO_RAIL,
                format!("PE {pe}'s atomics fail from now on (provider atomics of two NICs are not atomic with respect to each other)"),
            );
        }
        match self.lowest_live_rail(pe) {
            Some(k) => (
                k,
                format!(
                    "PE {pe}'s atomics now go over rail {k} ({})",
                    self.rails.extra[k - 1].name
                ),
            ),
            None => (NO_RAIL, format!("no rail is left for PE {pe}'s atomics")),
        }
    }

    /// Scans rail 0 towards every peer (every few milliseconds): operations without completion
    /// for the rail timeout while the peer completes operations on extra rails fail rail 0
    /// towards it; a failure whose handling could not take the gate yet is handled now.
    pub(super) fn primary_scan(&self, c: &Connected) {
        let Some(peers) = self.rails.peers.get() else {
            return;
        };
        {
            let mut last = self.rails.last_scan0.lock();
            if last.elapsed() < Duration::from_millis(2) {
                return;
            }
            *last = Instant::now();
        }
        let timeout = self.rails.cfg.timeout;
        for (pe, p) in peers.iter().enumerate() {
            if pe == c.my_pe as usize || c.peers[pe].is_gone() {
                continue;
            }
            if p.down0() {
                if !p.moved0.load(Ordering::Acquire) {
                    self.primary_move(c, pe);
                }
                continue;
            }
            let (mut sub, mut done, mut queued) = (0u64, 0u64, 0usize);
            for e in &c.eps {
                let a = &e.peer[pe];
                sub += a.submitted.load(Ordering::Acquire);
                done += a.completed.load(Ordering::Acquire);
                queued += a.backlogged.load(Ordering::Acquire);
            }
            let other = self.peer_progress(c, pe, 0);
            let failed = {
                let mut w = p.watch.lock();
                let busy = done < sub || queued > 0;
                if !busy || done != w.completed {
                    *w = Watch {
                        completed: done,
                        busy,
                        since: Instant::now(),
                        other,
                    };
                    None
                } else if !w.busy {
                    // Busy from now on; the peer's progress elsewhere counts from the last time
                    // rail 0 was idle or completed something (the operations posted since).
                    w.busy = true;
                    w.since = Instant::now();
                    None
                } else if w.since.elapsed() > timeout && other > w.other {
                    // And the peer answers a probe on an extra rail sent since (see
                    // `peer_answers`); without an extra rail there is nothing to fail over to.
                    let due = w.since + timeout;
                    drop(w);
                    (self.peer_answers(c, pe, due, 0) == Some(true))
                        .then_some(sub.saturating_sub(done) as usize + queued)
                } else {
                    None
                }
            };
            if let Some(k) = failed {
                self.fail_primary(
                    c,
                    pe,
                    format!("{k} operation(s) to PE {pe} without completion after {timeout:?} while it completed operations on other rails and answers probes there"),
                );
            }
        }
    }

    /// Fails rail 0 towards `pe` (once), when an extra rail still reaches it; otherwise the
    /// transport's own handling of broken connections and dead peers applies.
    pub(super) fn fail_primary(&self, c: &Connected, pe: usize, why: String) {
        let Some(p) = self.peer_rails(pe) else { return };
        if self.lowest_live_rail(pe).is_none() || p.down0.set(why).is_err() {
            return;
        }
        self.primary_move(c, pe);
    }

    /// Ends the rail-0 operations to `pe` with an error, drops rail 0's connection to it, and
    /// moves its atomics: once no AMO is being posted to it on rail 0 (else at a later scan).
    fn primary_move(&self, c: &Connected, pe: usize) {
        let Some(p) = self.peer_rails(pe) else { return };
        let Some(_g) = p.gate.try_write() else {
            return;
        };
        // (The gate, held exclusively, makes this the only mover.)
        if p.moved0.load(Ordering::Acquire) {
            return;
        }
        p.frozen0.store(rail0_completed(c, pe), Ordering::Release);
        p.moved0.store(true, Ordering::Release);
        let why = p.down0.get().cloned().unwrap_or_default();
        let name = &self.rails.primary_name;
        let msg = format!("rail 0 ({name}{RAIL_FAILED}{why}");
        let mut ended = 0;
        for (i, e) in c.eps.iter().enumerate() {
            let a = &e.peer[pe];
            let queued: Vec<_> = a.backlog.lock().drain(..).collect();
            a.backlogged.store(0, Ordering::Release);
            e.backlogged.fetch_sub(queued.len(), Ordering::AcqRel);
            ended += queued.len();
            for d in queued {
                self.complete(c, i, d.ctx as *mut std::ffi::c_void, 0, Some(msg.clone()));
            }
            // Accounted now (the provider's later completion, if any, only frees the context);
            // a context waiting for an answer over rail 0 is released.
            ended += e.end_outstanding(i, pe, &msg).0;
        }
        self.drop_primary_connection(c, pe);
        let (k, atomics) = self.next_amo_rail(pe);
        p.amo_rail.store(k, Ordering::Release);
        let rma = self
            .rails
            .extra
            .iter()
            .filter(|r| r.failed.get().is_none())
            .count();
        tracing::warn!(
            "rail 0 ({name}) failed towards PE {pe}: {why}; its {ended} operation(s) to PE {pe} in flight there end with an error; {atomics}; its RMA uses the {rma} remaining rail(s); rail 0 stays down towards PE {pe} for the job"
        );
    }

    /// Removes `pe`'s rail-0 addresses from the AV and inserts them again: the provider drops its
    /// connection to them (and what it still holds for it).
    fn drop_primary_connection(&self, c: &Connected, pe: usize) {
        for ep in 0..super::NUM_EPS {
            let k = pe * super::NUM_EPS + ep;
            let old = c.addrs[k].load(Ordering::Acquire);
            let name = &c.names[k * c.name_len..(k + 1) * c.name_len];
            match c.av.remove(old).and_then(|()| c.av.insert(name, 1)) {
                Ok(v) => c.addrs[k].store(v[0], Ordering::Release),
                Err(e) => tracing::debug!("rail 0 towards PE {pe}: address not replaced: {e}"),
            }
        }
    }

    /// Moves the atomics of every peer carried by extra rail `index`, which failed (its
    /// operations have ended); returns the log's words for them.
    pub(super) fn move_atomics_off(&self, index: usize) -> Vec<String> {
        let Some(peers) = self.rails.peers.get() else {
            return Vec::new();
        };
        peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.amo_rail.load(Ordering::Acquire) == index)
            .map(|(pe, p)| {
                let (k, words) = self.next_amo_rail(pe);
                p.amo_rail.store(k, Ordering::Release);
                words
            })
            .collect()
    }
}

/// Rail 0's completions of operations to `pe` (both endpoints).
fn rail0_completed(c: &Connected, pe: usize) -> u64 {
    c.eps
        .iter()
        .map(|e| e.peer[pe].completed.load(Ordering::Acquire))
        .sum()
}

/// The rails state of every peer (set at connect).
pub(super) fn peers_state(n: usize) -> Vec<PeerRails> {
    (0..n).map(|_| PeerRails::new()).collect()
}
