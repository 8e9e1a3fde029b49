//! Transmit lanes: on shm, every operation to PE `p` leaves through a libfabric endpoint of its own
//! for `p` (two of them: one for operations a caller waits for inside its call, one for the rest).
//!
//! Why: libfabric 2.1's shm hands out the completions of an endpoint in posting order (one response
//! queue per endpoint), and it never answers an operation aimed at a dead peer or at a key the
//! target released (the target drops it). On a shared endpoint one such operation holds up every
//! later completion, to every peer. On a lane it holds up only that lane.
//!
//! The peers' receiving endpoints (the ones exchanged at connect) stay as they are; a lane only
//! transmits, and shm tells the target the sender's name with the first command, so a lane needs no
//! address exchange and can be replaced at any time:
//! * a peer that is gone has its lanes closed, and every operation still posted on them is
//!   reclaimed (a counted one fails; contexts and send slots come back);
//! * a lane whose oldest operation stays unanswered although the peer is alive and has processed
//!   it (a probe message posted after it was answered) is replaced by a fresh one, and the
//!   operations posted on the old lane fail with an error saying so. This is how an operation
//!   through a released key fails on shm (it is never answered), without the quiet timeout.
//!
//! Reclaiming is safe because a closed endpoint no longer touches its operations, and completions
//! it wrote before its close are read first: whoever reads the shared CQ holds [`Lanes::gate`]
//! shared; closing takes it exclusively, then reads the CQ, then reclaims what is left.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::fabric::{AddressVector, CompletionQueue, Domain, Endpoint};

/// Lane of operations nobody waits for inside the call (nbi puts and gets, AMOs, messages).
pub(super) const LANE_NBI: usize = 0;
/// Lane of operations whose caller waits for them (blocking puts and gets, bounce chunks).
pub(super) const LANE_WAIT: usize = 1;
const KINDS: usize = 2;
/// Names one shm endpoint can hold in its peer table (libfabric 2.1: `SMR_MAX_PEERS`).
const SHM_PEER_NAMES: usize = 256;

/// A lane whose oldest operation has not completed for this long gets a probe.
const STALL: Duration = Duration::from_millis(100);
/// After the probe's answer, the oldest operation gets this long to complete (a multi-step shm
/// protocol may still be moving its data) before the lane is declared stuck.
const GRACE: Duration = Duration::from_millis(300);
/// A probe that got no answer is sent again after this long (the peer may be stopped).
const REPROBE: Duration = Duration::from_secs(1);

/// The endpoint of a lane and its generation (a replaced lane's operations carry the old one).
struct Slot {
    ep: Option<Endpoint>,
    gen: u64,
    /// The peer is gone: no new endpoint for it.
    closed: bool,
}

#[derive(Default)]
struct Probe {
    /// `done` when the lane was last seen moving, and when.
    seen: u64,
    since: Option<Instant>,
    ping: Option<Ping>,
}

struct Ping {
    seq: u64,
    /// Sequence number of the first probe of this stall and the operations posted on the lane
    /// before it: an answer to any probe from `first_seq` to `seq` proves the target processed
    /// every one of them.
    first_seq: u64,
    first_before: u64,
    sent: Instant,
    answered: Option<Instant>,
}

struct Lane {
    slot: RwLock<Slot>,
    posted: AtomicU64,
    done: AtomicU64,
    probe: Mutex<Probe>,
}

/// What the probe of one lane asks for.
pub(super) enum ProbeStep {
    Nothing,
    /// Send a probe with this sequence number to the lane's peer.
    Send(u64),
    /// The lane is stuck: replace it.
    Stuck,
}

/// An endpoint taken out of service, closed at the next [`Lanes::take_retired`].
pub(super) struct Retired {
    pub pe: usize,
    kind: usize,
    gen: u64,
    /// Closed (set to `None`) before the CQ is read and the contexts are reclaimed.
    pub ep: Option<Endpoint>,
    pub why: String,
}

/// The lanes of one logical endpoint (index: PE).
pub(super) struct Lanes {
    domain: Arc<Domain>,
    av: Arc<AddressVector>,
    cq: Arc<CompletionQueue>,
    /// Name prefix of this endpoint's lanes (unique per process).
    prefix: String,
    lanes: Vec<[Lane; KINDS]>,
    /// Contexts posted on a lane and not completed yet: PE, kind, generation.
    posted: Mutex<HashMap<usize, (usize, usize, u64)>>,
    /// Shared while completions are read and handled; exclusive while retired lanes are closed.
    pub gate: RwLock<()>,
    retired: Mutex<Vec<Retired>>,
    seq: AtomicU64,
}

/// The error of an operation on a lane that is gone.
fn closed_error() -> crate::fabric::Error {
    crate::fabric::Error::from_ret(-(libc::ECONNABORTED as i64), "the peer is gone")
}

impl Lanes {
    pub fn new(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        cq: &Arc<CompletionQueue>,
        prefix: String,
        n_pes: usize,
    ) -> Lanes {
        let lane = || Lane {
            slot: RwLock::new(Slot {
                ep: None,
                gen: 0,
                closed: false,
            }),
            posted: AtomicU64::new(0),
            done: AtomicU64::new(0),
            probe: Mutex::new(Probe::default()),
        };
        // Every lane of every PE is one more name in each target's shm address table, which holds
        // SHM_PEER_NAMES entries (libfabric 2.1 prov/shm/src/smr_util.h: SMR_MAX_PEERS); replaced lanes
        // take further entries. Two lanes per logical endpoint, two logical endpoints per PE.
        let names = 2 * KINDS * n_pes;
        if names > SHM_PEER_NAMES * 3 / 4 {
            tracing::warn!(
                "shm transmit lanes: {n_pes} PEs may register up to {names} sender names at each \
                 target, close to shm's limit of {SHM_PEER_NAMES}; past it new lanes cannot reach \
                 their peer. Use fewer PEs per node on shm, or another provider"
            );
        }
        Lanes {
            domain: domain.clone(),
            av: av.clone(),
            cq: cq.clone(),
            prefix,
            lanes: (0..n_pes).map(|_| [lane(), lane()]).collect(),
            posted: Mutex::new(HashMap::new()),
            gate: RwLock::new(()),
            retired: Mutex::new(Vec::new()),
            seq: AtomicU64::new(1),
        }
    }

    /// Posts with `f` on lane `kind` of `pe` (opened on first use); `ctx` is the operation's
    /// context, remembered until its completion is claimed.
    pub fn post(
        &self,
        pe: usize,
        kind: usize,
        ctx: *mut c_void,
        f: impl FnOnce(&Endpoint) -> crate::fabric::Result<()>,
    ) -> crate::fabric::Result<()> {
        let Some(lane) = self.lanes.get(pe).map(|l| &l[kind.min(KINDS - 1)]) else {
            return Err(crate::fabric::Error::invalid(format!("no lane to PE {pe}")));
        };
        loop {
            {
                let s = lane.slot.read();
                if let Some(ep) = &s.ep {
                    self.posted.lock().insert(ctx as usize, (pe, kind, s.gen));
                    lane.posted.fetch_add(1, Ordering::AcqRel);
                    let r = f(ep);
                    if r.is_err() {
                        self.posted.lock().remove(&(ctx as usize));
                        lane.posted.fetch_sub(1, Ordering::AcqRel);
                    }
                    return r;
                }
                if s.closed {
                    return Err(closed_error());
                }
            }
            // No completion is being read while the endpoint joins the CQ.
            let _gate = self.gate.write();
            let mut w = lane.slot.write();
            if w.ep.is_none() && !w.closed {
                let name = format!("{}:{pe}:{kind}:{}\0", self.prefix, w.gen);
                let ep = Endpoint::open_named(&self.domain, &self.av, &self.cq, name.as_bytes())?;
                tracing::debug!(
                    "lane {kind} to PE {pe} opened ({})",
                    name.trim_end_matches('\0')
                );
                w.ep = Some(ep);
            }
        }
    }

    /// A completion of `ctx` was read from the CQ: true when it is to be handled, false when the
    /// context was reclaimed already (its lane was closed) or never went through a lane.
    pub fn claim(&self, ctx: *mut c_void) -> bool {
        let Some((pe, kind, gen)) = self.posted.lock().remove(&(ctx as usize)) else {
            return false;
        };
        let lane = &self.lanes[pe][kind];
        if lane.slot.read().gen == gen {
            lane.done.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Takes lane `kind` of `pe` out of service: a fresh endpoint replaces it on the next post
    /// (`replace`), or the peer gets none any more.
    pub fn retire(&self, pe: usize, kind: usize, replace: bool, why: &str) {
        let Some(lane) = self.lanes.get(pe).map(|l| &l[kind]) else {
            return;
        };
        let mut s = lane.slot.write();
        if s.closed {
            return;
        }
        let ep = s.ep.take();
        let gen = s.gen;
        s.gen += 1;
        s.closed = !replace;
        lane.posted.store(0, Ordering::Release);
        lane.done.store(0, Ordering::Release);
        *lane.probe.lock() = Probe::default();
        drop(s);
        self.retired.lock().push(Retired {
            pe,
            kind,
            gen,
            ep,
            why: why.to_string(),
        });
    }

    /// Closes every lane to `pe` for good.
    pub fn close_peer(&self, pe: usize, why: &str) {
        for kind in 0..KINDS {
            self.retire(pe, kind, false, why);
        }
    }

    pub fn has_retired(&self) -> bool {
        !self.retired.lock().is_empty()
    }

    /// The retired lanes, to be closed with [`Lanes::gate`] held exclusively.
    pub fn take_retired(&self) -> Vec<Retired> {
        std::mem::take(&mut *self.retired.lock())
    }

    /// The contexts posted on the retired lanes `r` (removed from the posted set), each with the
    /// index of its lane in `r`.
    pub fn reclaim(&self, r: &[Retired]) -> Vec<(*mut c_void, usize)> {
        let mut posted = self.posted.lock();
        let mut out = Vec::new();
        posted.retain(|&ctx, &mut (pe, kind, gen)| {
            match r
                .iter()
                .position(|x| x.pe == pe && x.kind == kind && x.gen == gen)
            {
                Some(k) => {
                    out.push((ctx as *mut c_void, k));
                    false
                }
                None => true,
            }
        });
        out
    }

    /// One step of the stuck-lane probe of lane `kind` to `pe` (called every few ms by progress).
    pub fn probe_step(&self, pe: usize, kind: usize, now: Instant) -> ProbeStep {
        let lane = &self.lanes[pe][kind];
        let posted = lane.posted.load(Ordering::Acquire);
        let done = lane.done.load(Ordering::Acquire);
        let mut p = lane.probe.lock();
        let since = match p.since {
            Some(t) if done < posted && done == p.seen => t,
            _ => {
                *p = Probe {
                    seen: done,
                    since: Some(now),
                    ping: None,
                };
                return ProbeStep::Nothing;
            }
        };
        let seen = p.seen;
        let next = |before, first: Option<(u64, u64)>| {
            let seq = self.seq.fetch_add(1, Ordering::AcqRel);
            let (first_seq, first_before) = first.unwrap_or((seq, before));
            Ping {
                seq,
                first_seq,
                first_before,
                sent: now,
                answered: None,
            }
        };
        match &p.ping {
            None if now.duration_since(since) >= STALL => {
                let pg = next(posted, None);
                let seq = pg.seq;
                p.ping = Some(pg);
                ProbeStep::Send(seq)
            }
            Some(pg) => match pg.answered {
                Some(t) if now.duration_since(t) >= GRACE && seen < pg.first_before => {
                    ProbeStep::Stuck
                }
                None if now.duration_since(pg.sent) >= REPROBE => {
                    // Resent (the peer may have been stopped), keeping the first probe's facts: an
                    // answer that comes later than REPROBE still counts (no livelock of resends).
                    let pg = next(posted, Some((pg.first_seq, pg.first_before)));
                    let seq = pg.seq;
                    p.ping = Some(pg);
                    ProbeStep::Send(seq)
                }
                _ => ProbeStep::Nothing,
            },
            None => ProbeStep::Nothing,
        }
    }

    /// A probe could not be sent: try again at the next step.
    pub fn probe_unsent(&self, pe: usize, kind: usize) {
        let mut p = self.lanes[pe][kind].probe.lock();
        if let Some(pg) = p.ping.as_mut() {
            // Resend at the next step, keeping the stall's first probe (see `probe_step`).
            match Instant::now().checked_sub(REPROBE) {
                Some(t) => pg.sent = t,
                None => p.ping = None,
            }
        }
    }

    /// The answer to probe `seq` from `pe` arrived.
    pub fn probe_answered(&self, pe: usize, seq: u64) {
        let Some(lanes) = self.lanes.get(pe) else {
            return;
        };
        for lane in lanes {
            let mut p = lane.probe.lock();
            if let Some(pg) = p
                .ping
                .as_mut()
                .filter(|pg| (pg.first_seq..=pg.seq).contains(&seq))
            {
                pg.answered.get_or_insert(Instant::now());
            }
        }
    }

    pub fn kinds() -> usize {
        KINDS
    }
}
