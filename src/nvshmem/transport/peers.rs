//! Per-peer state of the transport: liveness, per-peer operation accounting, and the backlog of
//! operations a peer could not take yet.
//!
//! Liveness comes from three sources, none of them a timeout on a live peer:
//! * the process: PEs on one host (always the case for shm) exchange their identity at connect
//!   (boot id, PID namespace, PID, start time); a peer with work outstanding is looked up in
//!   `/proc` every [`CHECK_EVERY`]; a process that is gone, a zombie, or a reused PID means dead;
//! * the provider: a connection refused by the peer's address (nobody listens there any more) means
//!   gone; other connection errors make the peer a suspect, checked as above where possible, and
//!   its connection is rebuilt; a rebuilt peer that then answers nothing for a whole quiet timeout
//!   is gone (a killed PE on another host: tcp;ofi_rxm reports nothing for operations queued on a
//!   connection to an address nobody serves);
//! * the peer itself: a PE that finalizes says goodbye to every peer.
//!
//! A heartbeat is not used: it cannot tell a stopped or busy peer (a debugger, a long kernel, a proxy
//! thread that does not progress) from a dead one without a timeout, and failing a live peer's
//! operations is worse than waiting for the quiet timeout. A remote peer on a provider that reports
//! nothing (a powered-off host behind tcp, a killed PE whose connection showed no error) is still
//! bounded by the quiet timeout, at every quiet.
use std::collections::{HashSet, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::error::broken_connection;
use super::lanes::{Lanes, ProbeStep};
use super::wire::{AmMsg, AM_GOODBYE, AM_MAGIC, AM_PING};
use super::{shm_regions, Connected, Transport, EP_HOST, NUM_EPS};

/// Why a peer that said goodbye is gone.
pub(super) const DEPARTED: &str = "it finalized";

/// Least interval between two rebuilds of one peer's addresses.
const REBUILD_EVERY: Duration = Duration::from_millis(10);

/// How often peers with outstanding work are looked up.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Who a process is, as far as another process on the same host can check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ProcId {
    /// Hash of the kernel's boot id (0: unknown).
    pub boot: u64,
    /// Inode of the PID namespace (0: unknown).
    pub pidns: u64,
    pub pid: u64,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub start: u64,
}

pub(super) const PROC_ID_BYTES: usize = 32;

impl ProcId {
    /// This process.
    pub fn me() -> ProcId {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| fnv(s.trim().as_bytes()))
            .unwrap_or(0);
        let pidns = std::fs::metadata("/proc/self/ns/pid")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        let pid = std::process::id() as u64;
        let start = stat_of(pid).map_or(0, |(_, s)| s);
        ProcId {
            boot,
            pidns,
            pid,
            start,
        }
    }

    pub fn to_bytes(self) -> [u8; PROC_ID_BYTES] {
        let mut b = [0u8; PROC_ID_BYTES];
        for (i, v) in [self.boot, self.pidns, self.pid, self.start]
            .iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> ProcId {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        ProcId {
            boot: w(0),
            pidns: w(1),
            pid: w(2),
            start: w(3),
        }
    }

    /// Whether `other`'s PID can be looked up from this process.
    pub fn same_host(&self, other: &ProcId) -> bool {
        self.boot != 0 && self.boot == other.boot && self.pidns != 0 && self.pidns == other.pidns
    }

    /// `Some(reason)` when the process is gone (exited, zombie, PID reused).
    pub fn gone(&self) -> Option<String> {
        match stat_of(self.pid) {
            None => Some(format!("process {} has exited", self.pid)),
            Some((state, _)) if state == 'Z' || state == 'X' => {
                Some(format!("process {} has exited", self.pid))
            }
            Some((_, start)) if self.start != 0 && start != self.start => Some(format!(
                "process {} has exited (its PID now names another process)",
                self.pid
            )),
            Some(_) => None,
        }
    }
}

/// State letter and start time of `/proc/<pid>/stat`.
fn stat_of(pid: u64) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    // Fields 3.. follow; the start time is field 22, i.e. the 20th after the state.
    let start = f.nth(18)?.parse().ok()?;
    Some((state, start))
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A peer as every endpoint sees it.
pub(super) struct PeerState {
    /// 0: live; 1: gone (dead or departed).
    state: AtomicU8,
    why: Mutex<String>,
    pub proc: ProcId,
    pub same_host: bool,
    /// When the peer's addresses were last inserted again after a broken connection.
    rebuilt: Mutex<Option<Instant>>,
}

impl PeerState {
    pub fn new(proc: ProcId, same_host: bool) -> PeerState {
        PeerState {
            state: AtomicU8::new(0),
            why: Mutex::new(String::new()),
            proc,
            same_host,
            rebuilt: Mutex::new(None),
        }
    }

    pub fn is_gone(&self) -> bool {
        self.state.load(Ordering::Acquire) != 0
    }

    pub fn why(&self) -> String {
        self.why.lock().clone()
    }

    /// Marks the peer gone; true for the caller that changed the state.
    pub fn set_gone(&self, why: &str) -> bool {
        let mut w = self.why.lock();
        if self
            .state
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *w = why.to_string();
            true
        } else {
            false
        }
    }
}

/// An operation the provider refused with EAGAIN, retried by progress in order.
pub(super) struct Deferred {
    pub ctx: usize,
    pub f: Box<dyn Fn(*mut c_void) -> crate::fabric::Result<()>>,
}

// SAFETY: the closure captures plain addresses (of memory that stays valid until the operation
// completes, or of the endpoint state that owns the backlog) and is called by one thread at a time
// under the backlog's lock.
unsafe impl Send for Deferred {}

/// One endpoint's bookkeeping for one peer.
#[derive(Default)]
pub(super) struct PeerAcct {
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
    pub errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// Counted contexts not yet completed (their tokens: `OpContexts::token`). Whoever removes a
    /// token finishes that operation: its completion, its answer, or the peer's death.
    pub outstanding: Mutex<HashSet<u64>>,
    pub backlog: Mutex<VecDeque<Deferred>>,
    /// Entries in `backlog` (read without the lock).
    pub backlogged: AtomicUsize,
    /// Provider operations (RMA, atomics: `TAG_OP`) to the peer not yet completed: nothing orders
    /// them with the messages after them, so a fence waits for them (`fence`).
    pub raw_out: AtomicU64,
    /// A fence owed to the operations after it (`fence::FENCE_*` bits), taken by the next put or
    /// AMO to the peer (`Transport::fence_gate`).
    pub fence: AtomicU8,
}

impl PeerAcct {
    pub fn record_error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::AcqRel);
        *self.last_error.lock() = Some(msg);
    }

    /// Whether the peer has work the provider has not finished.
    pub fn busy(&self) -> bool {
        self.completed.load(Ordering::Acquire) < self.submitted.load(Ordering::Acquire)
            || self.backlogged.load(Ordering::Acquire) > 0
    }
}

impl Transport {
    /// Retries operations peers could not take yet, in order per peer.
    pub(super) fn drain_backlogs(&self, c: &Connected, i: usize) -> usize {
        let e = &c.eps[i];
        if e.backlogged.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut posted = 0;
        for a in &e.peer {
            if a.backlogged.load(Ordering::Acquire) == 0 {
                continue;
            }
            let mut q = a.backlog.lock();
            while let Some(d) = q.front() {
                let ctx = d.ctx as *mut c_void;
                match (d.f)(ctx) {
                    Err(err) if err.is_again() => break,
                    r => {
                        q.pop_front();
                        a.backlogged.fetch_sub(1, Ordering::AcqRel);
                        e.backlogged.fetch_sub(1, Ordering::AcqRel);
                        posted += 1;
                        if let Err(err) = r {
                            drop(q);
                            self.complete(c, i, ctx, 0, Some(err.to_string()));
                            q = a.backlog.lock();
                        }
                    }
                }
            }
        }
        posted
    }

    /// Looks up, at most every CHECK_EVERY, the processes of same-host peers that have work
    /// outstanding; a peer whose process is gone is declared gone.
    pub(super) fn check_peers(&self, c: &Connected) {
        {
            let Some(mut t) = c.last_check.try_lock() else {
                return;
            };
            if t.elapsed() < CHECK_EVERY {
                return;
            }
            *t = Instant::now();
        }
        for (pe, p) in c.peers.iter().enumerate() {
            if !p.same_host || p.is_gone() || !c.eps.iter().any(|e| e.peer[pe].busy()) {
                continue;
            }
            if let Some(why) = p.proc.gone() {
                self.declare_gone(c, pe, &why);
            }
        }
        self.probe_lanes(c);
    }

    /// Looks for stuck transmit lanes (see `lanes`): a lane whose oldest operation is not answered
    /// gets a probe; when the peer answers the probe and the operation still is not, the peer has
    /// processed it and will never answer it (shm drops an access through a key the target no
    /// longer has), so the lane is replaced and its operations fail.
    fn probe_lanes(&self, c: &Connected) {
        let now = Instant::now();
        for (i, e) in c.eps.iter().enumerate() {
            let Some(l) = &e.lanes else { continue };
            for (pe, p) in c.peers.iter().enumerate() {
                if p.is_gone() {
                    continue;
                }
                for kind in 0..Lanes::kinds() {
                    match l.probe_step(pe, kind, now) {
                        ProbeStep::Nothing => {}
                        ProbeStep::Send(seq) => {
                            let msg = AmMsg {
                                magic: AM_MAGIC,
                                kind: AM_PING,
                                token: seq,
                                val: c.my_pe as u64,
                                ..Default::default()
                            };
                            if let Err(err) = e.send_probe(c.addr(pe as i32, i), msg) {
                                tracing::debug!("endpoint {i}: probe to PE {pe} not sent: {err}");
                                l.probe_unsent(pe, kind);
                            }
                        }
                        ProbeStep::Stuck => {
                            let why = format!(
                                "PE {pe} processed an operation without answering it (an access \
                                 through a registration it no longer has?); the lane to it was \
                                 replaced and the operations posted on it failed"
                            );
                            tracing::error!("endpoint {i}: {why}");
                            l.retire(pe, kind, true, &why);
                        }
                    }
                }
            }
        }
    }

    /// A peer is dead or departed: everything outstanding towards it fails now, and new operations
    /// to it fail at once. Operations the provider still holds are accounted as failed and their
    /// contexts freed when, if ever, the provider returns them. Contexts waiting for the peer's
    /// answer (target-applied AMOs, staged puts and gets) are released now: their messages name
    /// them by token, so an answer that still comes, a send completion, or a message still queued
    /// finds no context and is dropped.
    pub(super) fn declare_gone(&self, c: &Connected, pe: usize, why: &str) {
        let Some(p) = c.peers.get(pe) else { return };
        if !p.set_gone(why) {
            return;
        }
        if why == DEPARTED {
            // The normal end of a job: every PE says goodbye to every other.
            tracing::info!("PE {pe} finalized: its operations fail from now on");
        } else {
            tracing::error!("PE {pe} is gone ({why}): its operations fail from now on");
            if p.same_host && p.proc.gone().is_some() {
                self.remove_shm_regions_of(c, pe);
            }
        }
        let msg = format!("PE {pe} is gone: {why}");
        for (i, e) in c.eps.iter().enumerate() {
            let a = &e.peer[pe];
            let queued: Vec<Deferred> = a.backlog.lock().drain(..).collect();
            a.backlogged.store(0, Ordering::Release);
            e.backlogged.fetch_sub(queued.len(), Ordering::AcqRel);
            for d in queued {
                self.complete(c, i, d.ctx as *mut c_void, 0, Some(msg.clone()));
            }
            let (_, released) = e.end_outstanding(i, pe, &msg);
            if released > 0 {
                tracing::debug!(
                    "endpoint {i}: released {released} context(s) waiting for PE {pe}'s answer"
                );
            }
            // Its lanes close: what is posted on them comes back at the next progress.
            if let Some(l) = &e.lanes {
                l.close_peer(pe, &msg);
            }
        }
    }

    /// Removes the shm regions of `pe`, whose process has exited on this host (providers whose
    /// endpoint names are shared-memory regions, i.e. shm; see shm_regions.rs). Safe to call more
    /// than once.
    pub(super) fn remove_shm_regions_of(&self, c: &Connected, pe: usize) {
        if !self.route.caps.named_endpoints || pe == c.my_pe as usize {
            return;
        }
        let start = pe * NUM_EPS * c.name_len;
        let Some(name) = c.names.get(start..start + c.name_len) else {
            return;
        };
        let Some(prefix) = shm_regions::region_prefix(name) else {
            return;
        };
        let n = shm_regions::remove_regions(std::path::Path::new(shm_regions::SHM_DIR), &prefix);
        if n > 0 {
            tracing::info!(
                "removed {n} shm regions of PE {pe}, whose process exited ({}/{prefix}*)",
                shm_regions::SHM_DIR
            );
        }
    }

    /// A provider error on an operation to `pe`: a refused connection means nobody listens at the
    /// peer's address any more; other connection errors get the peer's process checked.
    pub(super) fn suspect(&self, c: &Connected, pe: usize, err: &str) {
        let Some(p) = c.peers.get(pe) else { return };
        if p.is_gone() {
            return;
        }
        if err.contains("Connection refused") {
            self.declare_gone(c, pe, &format!("its address refuses connections ({err})"));
            return;
        }
        if p.same_host {
            if let Some(why) = p.proc.gone() {
                self.declare_gone(c, pe, &why);
                return;
            }
        }
        if broken_connection(err) {
            self.rebuild_peer(c, pe, err);
        }
    }

    /// A quiet towards `pe` timed out with its operations unanswered. A peer whose connection
    /// broke and was rebuilt ([`Transport::rebuild_peer`]) and that then answers nothing for a
    /// whole quiet timeout is gone: on another host its process cannot be looked up, and
    /// tcp;ofi_rxm reports nothing for operations queued on a connection to an address nobody
    /// serves any more (a killed PE whose host lives on), so they would wait out the quiet
    /// timeout at every later quiet. A peer that never broke stays (a stopped or busy peer).
    pub(super) fn unanswered(&self, c: &Connected, pe: usize, waited: Duration) {
        let Some(p) = c.peers.get(pe) else { return };
        if p.is_gone() || p.rebuilt.lock().is_none() {
            return;
        }
        self.declare_gone(
            c,
            pe,
            &format!(
                "its connection broke and it answered nothing for {waited:?} after it was rebuilt"
            ),
        );
    }

    /// A connection to a live peer broke (tcp;ofi_rxm tears it down when the peer's provider
    /// refuses an access, e.g. through a released key): its addresses are removed from the AV and
    /// inserted again, which makes the provider connect anew on the next operation. At most once
    /// per [`REBUILD_EVERY`]; a peer that is really gone then refuses the new connection.
    fn rebuild_peer(&self, c: &Connected, pe: usize, err: &str) {
        {
            let mut last = c.peers[pe].rebuilt.lock();
            if last.is_some_and(|t| t.elapsed() < REBUILD_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        tracing::warn!("connection to PE {pe} broke ({err}): inserting its addresses again");
        for ep in 0..NUM_EPS {
            let k = pe * NUM_EPS + ep;
            let old = c.addrs[k].load(Ordering::Acquire);
            let name = &c.names[k * c.name_len..(k + 1) * c.name_len];
            let r =
                c.av.remove(old)
                    .and_then(|()| c.av.insert(name, 1))
                    .map(|v| v[0]);
            match r {
                Ok(a) => c.addrs[k].store(a, Ordering::Release),
                Err(e) => {
                    tracing::error!("PE {pe}: could not rebuild its address: {e}");
                    self.declare_gone(c, pe, &format!("its address could not be rebuilt ({e})"));
                    return;
                }
            }
        }
    }

    /// Tells every live peer that this PE finalizes (best effort, bounded), so that their
    /// operations to it fail at once instead of waiting.
    pub(super) fn say_goodbye(&self, c: &Connected) {
        let e = &c.eps[EP_HOST];
        let deadline = Instant::now() + Duration::from_millis(200);
        for pe in 0..c.n_pes as usize {
            if pe == c.my_pe as usize || c.peers[pe].is_gone() {
                continue;
            }
            let msg = AmMsg {
                magic: AM_MAGIC,
                kind: AM_GOODBYE,
                val: c.my_pe as u64,
                ..Default::default()
            };
            let dest = c.addr(pe as i32, EP_HOST);
            while let Err(err) = self.send_small(e, pe, dest, msg) {
                if !err.is_again() || Instant::now() > deadline {
                    tracing::debug!("finalize: goodbye to PE {pe} not sent: {err}");
                    break;
                }
                self.progress_ep(c, EP_HOST);
            }
        }
        // Let the sends leave (their completions free the contexts).
        while Instant::now() < deadline && e.ctxs.in_flight() > e.recv_bufs {
            if self.progress_ep(c, EP_HOST) == 0 {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_a_missing_one_is_gone() {
        let me = ProcId::me();
        assert_ne!(me.start, 0);
        assert!(me.same_host(&me));
        assert_eq!(me.gone(), None);
        assert_eq!(ProcId::from_bytes(&me.to_bytes()), me);
        let other = ProcId {
            start: me.start + 1,
            ..me
        };
        assert!(
            other.gone().is_some(),
            "a different start time is another process"
        );
        // A child that exited and was reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as u64;
        c.wait().unwrap();
        let dead = ProcId { pid, ..me };
        assert!(dead.gone().is_some());
    }
}
