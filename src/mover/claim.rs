//! The one launch / race / host-takes-over handshake of the library's kernels that the host can
//! take over: the copy kernel ([`crate::mover::kcopy`]) and kernel atomics ([`crate::mover::amo`]).
//!
//! A kernel needs an SM. When the application's kernels hold every SM while they wait for the
//! very work a launch carries, the launch would never run. So each launch has a slot of pinned
//! host memory, and a launch that has not started within the stuck limit is taken over by the
//! host, which carries the work another way. Host and kernel decide who does it with Dekker's two
//! flags in the slot:
//!
//! - kernel: write its flag, `fence.sc.sys`, read the host's flag; clear: do the work, fence,
//!   outcome [`APPLIED`]; set: outcome [`LEFT`] without touching anything else.
//! - host ([`Slots::claim`]): write its flag, sequentially consistent fence, read the kernel's
//!   flag; clear: the host owns the work (the kernel, when it runs, will see the host's flag); set:
//!   the kernel is running and its outcome, written within microseconds, decides.
//!
//! Both reads cannot see the other's flag clear (the store-buffer case the two fences forbid), so
//! the work is done exactly once. A slot the host took over stays in use until the kernel has
//! written [`LEFT`], so a late kernel never writes into a reused slot.
//!
//! The host's side is one state machine ([`step`] for what an outcome means in a phase, the claim
//! for `Launched -> HostOwns | Racing`, [`Ledger::settle`] driving both over the pending
//! launches). Its users differ in two parameters only ([`Policy`]): how the stuck clock runs
//! ([`Timing`]) and what becomes of work found in a state the protocol rules out ([`OnBroken`]).
//! Such a state is rejected the same way for both: logged as an error, its slot retired, counted
//! in [`Counts::broken`], never read as a success.
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{MResult, MoverError};

/// Bytes per slot: host flag, kernel flag, outcome, a spare word, a fetched value (8 bytes), 8
/// spare.
pub const SLOT_BYTES: usize = 32;
/// The outcome a kernel writes after doing the work.
pub const APPLIED: u32 = 1;
/// The outcome a kernel writes when it found the host's flag set and left everything alone.
pub const LEFT: u32 = 2;

const HOST_FLAG: usize = 0;
const KERNEL_FLAG: usize = 1;
const OUTCOME: usize = 2;
/// Byte offset of the fetched value in a slot.
const RESULT_BYTE: usize = 16;

/// What the host's claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The kernel had not started: the host owns the work.
    Host,
    /// The kernel had started: its outcome decides.
    Racing,
}

/// The host's half of the slot protocol over slots of shared memory.
pub struct Slots {
    base: *const AtomicU32,
    count: usize,
    free: Vec<u16>,
}

// SAFETY: the slot memory is plain shared memory accessed only through atomics; the owner keeps it
// alive.
unsafe impl Send for Slots {}

impl Slots {
    /// Slots over `count * SLOT_BYTES` bytes at `base`, 8-byte aligned.
    ///
    /// # Safety
    /// The memory stays valid, and is touched by nobody but this table and the kernels (or test
    /// threads) it hands slots to, for the table's life.
    pub unsafe fn with_count(base: *mut u8, count: usize) -> Slots {
        assert_eq!(base as usize % 8, 0, "slot memory must be 8-byte aligned");
        assert!(count <= usize::from(u16::MAX), "at most 65535 slots");
        Slots {
            base: base as *const AtomicU32,
            count,
            free: (0..count as u16).rev().collect(),
        }
    }

    /// The word `w` of slot `s`.
    fn word(&self, s: u16, w: usize) -> &AtomicU32 {
        debug_assert!((s as usize) < self.count && w < SLOT_BYTES / 4);
        // SAFETY: inside the table's memory (with_count's contract); AtomicU32 has u32's layout.
        unsafe { &*self.base.add(s as usize * (SLOT_BYTES / 4) + w) }
    }

    /// A free slot, zeroed; `None` when every slot is in use.
    pub fn take(&mut self) -> Option<u16> {
        let s = self.free.pop()?;
        for w in 0..SLOT_BYTES / 4 {
            self.word(s, w).store(0, Ordering::SeqCst);
        }
        Some(s)
    }

    /// Returns slot `s` to the free list (its kernel has written its outcome, or never will run).
    pub fn give_back(&mut self, s: u16) {
        debug_assert!(!self.free.contains(&s));
        self.free.push(s);
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.count - self.free.len()
    }

    /// The slot's outcome: 0 while its kernel has not decided, else [`APPLIED`] or [`LEFT`] (any
    /// other value breaks the protocol).
    pub fn outcome(&self, s: u16) -> u32 {
        self.word(s, OUTCOME).load(Ordering::SeqCst)
    }

    /// The value slot `s`'s kernel fetched into the slot (meaningful once the outcome is
    /// [`APPLIED`] and the kernel fetches into the slot).
    pub fn result(&self, s: u16) -> u64 {
        // SAFETY: 8-byte aligned inside slot `s` (32-byte slots from an 8-byte-aligned base);
        // AtomicU64 has u64's layout.
        let w = unsafe {
            &*((self.base as *const u8).add(s as usize * SLOT_BYTES + RESULT_BYTE)
                as *const AtomicU64)
        };
        w.load(Ordering::SeqCst)
    }

    /// The device address of slot `s`'s fetched-value word.
    pub fn result_addr(device_base: u64, s: u16) -> u64 {
        Self::device_addr(device_base, s) + RESULT_BYTE as u64
    }

    /// The host's claim: its flag, a full fence, the kernel's flag.
    pub fn claim(&self, s: u16) -> Claim {
        self.word(s, HOST_FLAG).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.word(s, KERNEL_FLAG).load(Ordering::SeqCst) == 0 {
            Claim::Host
        } else {
            Claim::Racing
        }
    }

    /// The device address of slot `s` for a table whose memory the device sees at `device_base`.
    pub fn device_addr(device_base: u64, s: u16) -> u64 {
        device_base + (s as u64) * SLOT_BYTES as u64
    }

    /// The check each kernel of the library gets where it is loaded: takes a slot, claims it,
    /// `launch`es one launch over the slot's device address (`device_base` as for
    /// [`Slots::device_addr`]) that must find the claim, leave everything alone and answer
    /// [`LEFT`], and waits for that answer until `deadline`. `what` names the kernel in errors.
    pub fn check_claimed_launch(
        &mut self,
        device_base: u64,
        deadline: Instant,
        what: &str,
        launch: impl FnOnce(u64) -> MResult<()>,
    ) -> MResult<()> {
        let s = self
            .take()
            .ok_or_else(|| MoverError::Invalid(format!("{what}: no free slot")))?;
        let claim = self.claim(s);
        let started = Instant::now();
        if let Err(e) = launch(Self::device_addr(device_base, s)) {
            // Nothing will write the slot.
            self.give_back(s);
            return Err(e);
        }
        let outcome = loop {
            let o = self.outcome(s);
            if o != 0 || Instant::now() > deadline {
                break o;
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        // The slot is safe to reuse only once the kernel has written it.
        if outcome != 0 {
            self.give_back(s);
        }
        match (claim, outcome) {
            (Claim::Host, LEFT) => Ok(()),
            (_, 0) => Err(MoverError::Timeout {
                outstanding: 1,
                waited: started.elapsed(),
            }),
            (c, o) => Err(MoverError::Cuda(format!(
                "{what}: a claimed launch answered {o} (claim {c:?}); the slot protocol does not \
                 hold here"
            ))),
        }
    }
}

/// Logs a take-over: the first one (per `warned`) as a warning, later ones at debug level.
pub(super) fn warn_first(warned: &mut bool, msg: &str) {
    if *warned {
        tracing::debug!("{msg}");
    } else {
        *warned = true;
        tracing::warn!("{msg} (logged once; later ones at debug level)");
    }
}

/// Where a pending launch stands, as the host sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Launched; the host has not claimed it.
    Launched,
    /// The host claimed it and saw the kernel's flag: the kernel's outcome decides.
    Racing,
    /// The host owns the work (handed to the caller); the slot waits for the late kernel's
    /// [`LEFT`].
    HostOwns,
}

/// What a slot's outcome means in a phase ([`step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The kernel did the work: the launch is done, its slot free.
    Applied,
    /// The kernel lost the race and did nothing: the host carries the work; the slot is free.
    HostCarries,
    /// The late kernel of a launch the host owns answered: the slot is free.
    SlotFree,
    /// Not decided and not claimed: the host may claim it (once it is due).
    Undecided,
    /// Claimed while the kernel ran: wait for its outcome.
    Racing,
    /// The host owns the work; its kernel has not answered yet: keep the slot.
    AwaitLate,
    /// A state the protocol rules out: [`LEFT`] without a claim, [`APPLIED`] after the host took
    /// the work, or an outcome other than 0, [`APPLIED`] and [`LEFT`].
    Impossible,
}

/// The transition table of the host's side: what outcome `outcome` means for a launch in `phase`.
/// The one other transition is the claim, `Launched -> HostOwns` ([`Claim::Host`]) or
/// `Launched -> Racing` ([`Claim::Racing`]).
pub const fn step(phase: Phase, outcome: u32) -> Step {
    match (phase, outcome) {
        (Phase::Launched | Phase::Racing, APPLIED) => Step::Applied,
        (Phase::Racing, LEFT) => Step::HostCarries,
        (Phase::HostOwns, LEFT) => Step::SlotFree,
        (Phase::Launched, 0) => Step::Undecided,
        (Phase::Racing, 0) => Step::Racing,
        (Phase::HostOwns, 0) => Step::AwaitLate,
        // LEFT needs the host's flag, which only a claim sets (and a claim leaves Launched);
        // APPLIED needs the host's flag clear when the kernel looked, which a Host claim rules out;
        // a kernel writes no other value.
        (Phase::Launched, LEFT) | (Phase::HostOwns, APPLIED) | (_, _) => Step::Impossible,
    }
}

/// How the stuck clock of a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Each launch from when it was made; a launch racing with its kernel holds nobody back
    /// (kernel atomics: a launch pending past the limit is taken over whatever waits before it).
    FromLaunch,
    /// In stream order: only the oldest undecided launch is timed, from when it was made or when
    /// the launch before it was seen decided, whichever is later; the younger ones wait behind it
    /// (the copy kernel: a launch cannot start before the one ahead of it on the stream).
    StreamOrder,
}

/// What becomes of the work of a launch found in an impossible state (its slot is retired and it
/// is counted in [`Counts::broken`] either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBroken {
    /// Handed to the caller as taken over: for work that is harmless to do twice (copies of
    /// unchanged sources) and must never be lost.
    HandBack,
    /// Dropped: for work that must never be done twice (atomics).
    Drop,
}

/// The two parameters in which the users of the protocol differ, and the name for the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The stuck clock.
    pub timing: Timing,
    /// Work found in an impossible state.
    pub on_broken: OnBroken,
    /// The kernel, for log lines ("copy kernel", "kernel atomics").
    pub what: &'static str,
}

/// How a launch ended, from [`Ledger::settle`].
#[derive(Debug, PartialEq, Eq)]
pub enum Decided<P> {
    /// The kernel did launch `id`'s work.
    Applied {
        /// The launch.
        id: u64,
        /// What the caller gave with it.
        payload: P,
        /// The slot's fetched value (see [`Slots::result`]).
        result: u64,
        /// From the launch to being seen applied.
        waited: Duration,
    },
    /// The host owns launch `id`'s work: none of it was done; the caller carries it.
    TakenOver {
        /// The launch.
        id: u64,
        /// What the caller gave with it.
        payload: P,
    },
}

/// Counts of how launches ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Applied by kernels.
    pub applied: u64,
    /// Taken over by the host (claimed before the kernel started, or the kernel lost the race).
    pub taken_over: u64,
    /// Found in an impossible state.
    pub broken: u64,
}

/// What one [`Ledger::settle`] round found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Launches claimed by the host this round before their kernel started.
    pub claimed: usize,
    /// Launches still undecided (launched, or racing).
    pub undecided: usize,
    /// Launches found in an impossible state this round.
    pub broken: usize,
}

struct Job<P> {
    id: u64,
    slot: u16,
    at: Instant,
    phase: Phase,
    payload: Option<P>,
}

/// The host's side of the protocol: the slots, the pending launches in launch order, and the
/// policy. `P` is what the caller needs to carry a launch's work itself.
pub struct Ledger<P> {
    slots: Slots,
    jobs: VecDeque<Job<P>>,
    policy: Policy,
    next_id: u64,
    /// When settle last saw a launch decided ([`Timing::StreamOrder`]).
    last_decided: Option<Instant>,
    /// How launches ended so far.
    pub counts: Counts,
}

impl<P> Ledger<P> {
    /// A ledger over `slots` with `policy`.
    pub fn new(slots: Slots, policy: Policy) -> Ledger<P> {
        Ledger {
            slots,
            jobs: VecDeque::new(),
            policy,
            next_id: 0,
            last_decided: None,
            counts: Counts::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The slot table (for the device addresses, the fetched values and the load-time check).
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// The slot table, mutably (the load-time check takes and gives back a slot of its own).
    pub fn slots_mut(&mut self) -> &mut Slots {
        &mut self.slots
    }

    /// A free, zeroed slot for the next launch; `None` when every slot is in use.
    pub fn take_slot(&mut self) -> Option<u16> {
        self.slots.take()
    }

    /// Returns a slot from [`Ledger::take_slot`] whose launch failed (nothing will write it).
    pub fn unlaunched(&mut self, slot: u16) {
        self.slots.give_back(slot);
    }

    /// Records the launch made at `at` over `slot` (from [`Ledger::take_slot`]); returns its id.
    pub fn launched(&mut self, slot: u16, at: Instant, payload: P) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.jobs.push_back(Job {
            id,
            slot,
            at,
            phase: Phase::Launched,
            payload: Some(payload),
        });
        id
    }

    /// Launches pending, those the host owns whose late kernel has not answered included.
    pub fn pending(&self) -> usize {
        self.jobs.len()
    }

    /// Launches not yet decided (their kernel may still do the work).
    pub fn undecided(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.phase != Phase::HostOwns)
            .count()
    }

    /// The phase of every pending launch, oldest first.
    pub fn phases(&self) -> impl Iterator<Item = Phase> + '_ {
        self.jobs.iter().map(|j| j.phase)
    }

    /// The slot of every pending launch, oldest first.
    pub fn pending_slots(&self) -> impl Iterator<Item = u16> + '_ {
        self.jobs.iter().map(|j| j.slot)
    }

    /// One look at every pending launch at time `now`: pushes the decided ones to `out`, and
    /// claims the undecided ones that are due by the policy's [`Timing`] and `stuck` (and, once one
    /// is claimed for the host, every younger undecided one: they wait behind it on the stream).
    /// Never blocks.
    pub fn settle(&mut self, now: Instant, stuck: Duration, out: &mut Vec<Decided<P>>) -> Round {
        let policy = self.policy;
        let last_decided = self.last_decided;
        let slots = &mut self.slots;
        let counts = &mut self.counts;
        let mut round = Round::default();
        // A launch was claimed for the host: every younger undecided one goes with it.
        let mut taking = false;
        // An older launch is still undecided ([`Timing::StreamOrder`]: a younger one waits).
        let mut ahead = false;
        // A launch was seen decided in this round.
        let mut decided = false;
        self.jobs.retain_mut(|j| {
            let outcome = slots.outcome(j.slot);
            match step(j.phase, outcome) {
                Step::Applied => {
                    decided = true;
                    counts.applied += 1;
                    if let Some(payload) = j.payload.take() {
                        out.push(Decided::Applied {
                            id: j.id,
                            payload,
                            result: slots.result(j.slot),
                            waited: now.saturating_duration_since(j.at),
                        });
                    }
                    slots.give_back(j.slot);
                    false
                }
                Step::HostCarries => {
                    decided = true;
                    counts.taken_over += 1;
                    if let Some(payload) = j.payload.take() {
                        out.push(Decided::TakenOver { id: j.id, payload });
                    }
                    slots.give_back(j.slot);
                    false
                }
                Step::SlotFree => {
                    slots.give_back(j.slot);
                    false
                }
                Step::AwaitLate => true,
                Step::Racing => {
                    ahead = true;
                    round.undecided += 1;
                    true
                }
                Step::Impossible => {
                    round.broken += 1;
                    counts.broken += 1;
                    let handed = match (policy.on_broken, j.payload.take()) {
                        (OnBroken::HandBack, Some(payload)) => {
                            out.push(Decided::TakenOver { id: j.id, payload });
                            "its work goes to the host"
                        }
                        (OnBroken::Drop, Some(_)) => "its work is dropped, neither done nor redone",
                        (_, None) => "its work was the host's already",
                    };
                    tracing::error!(
                        "{}: launch {} (slot {}) in phase {:?} reads outcome {outcome}, which the \
                         slot protocol rules out; the slot is retired and {handed}",
                        policy.what,
                        j.id,
                        j.slot,
                        j.phase
                    );
                    slots.give_back(j.slot);
                    false
                }
                Step::Undecided => {
                    let due = taking
                        || match policy.timing {
                            Timing::FromLaunch => now.saturating_duration_since(j.at) >= stuck,
                            Timing::StreamOrder => {
                                let since = match last_decided {
                                    _ if decided => now,
                                    Some(t) if t > j.at => t,
                                    _ => j.at,
                                };
                                !ahead && now.saturating_duration_since(since) >= stuck
                            }
                        };
                    ahead = true;
                    if !due {
                        round.undecided += 1;
                        return true;
                    }
                    match slots.claim(j.slot) {
                        Claim::Host => {
                            taking = true;
                            round.claimed += 1;
                            counts.taken_over += 1;
                            j.phase = Phase::HostOwns;
                            if let Some(payload) = j.payload.take() {
                                out.push(Decided::TakenOver { id: j.id, payload });
                            }
                        }
                        Claim::Racing => {
                            j.phase = Phase::Racing;
                            round.undecided += 1;
                        }
                    }
                    true
                }
            }
        });
        if decided {
            self.last_decided = Some(now);
        }
        round
    }
}

#[cfg(test)]
mod tests;
