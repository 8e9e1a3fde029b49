//! The state machine of the host's side, transition by transition, under both policies.
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const COUNT: usize = 16;
const MS: Duration = Duration::from_millis(1);

/// Slot memory for the tests: 8-byte aligned like the pinned buffers, seen as words.
struct TestMem(Vec<AtomicU64>);

impl TestMem {
    fn new() -> TestMem {
        TestMem(
            (0..COUNT * SLOT_BYTES / 8)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    /// The words of slot `s`.
    fn slot(&self, s: u16) -> &[AtomicU32] {
        // SAFETY: two AtomicU32 per AtomicU64, same memory, alignment 8 >= 4; the view lives as
        // long as the borrow of the vector.
        let all = unsafe {
            std::slice::from_raw_parts(self.0.as_ptr() as *const AtomicU32, self.0.len() * 2)
        };
        let b = s as usize * SLOT_BYTES / 4;
        &all[b..b + SLOT_BYTES / 4]
    }
}

/// The kernel's half, as `copy.ptx` and `amo.ptx` do it, with `apply` for the work.
fn kernel_side(words: &[AtomicU32], apply: impl FnOnce()) -> bool {
    words[KERNEL_FLAG].store(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if words[HOST_FLAG].load(Ordering::SeqCst) != 0 {
        words[OUTCOME].store(LEFT, Ordering::SeqCst);
        return false;
    }
    apply();
    fence(Ordering::SeqCst);
    words[OUTCOME].store(APPLIED, Ordering::SeqCst);
    true
}

const COPIES: Policy = Policy {
    timing: Timing::StreamOrder,
    on_broken: OnBroken::HandBack,
    what: "copy kernel",
};
const ATOMICS: Policy = Policy {
    timing: Timing::FromLaunch,
    on_broken: OnBroken::Drop,
    what: "kernel atomics",
};
const POLICIES: [Policy; 4] = [
    COPIES,
    ATOMICS,
    Policy {
        timing: Timing::StreamOrder,
        on_broken: OnBroken::Drop,
        what: "t",
    },
    Policy {
        timing: Timing::FromLaunch,
        on_broken: OnBroken::HandBack,
        what: "t",
    },
];

fn ledger(mem: &TestMem, policy: Policy) -> Ledger<u32> {
    // SAFETY: every test keeps `mem` alive longer than the ledger.
    let slots = unsafe { Slots::with_count(mem.0.as_ptr() as *mut u8, COUNT) };
    Ledger::new(slots, policy)
}

/// Launches `payload` at `at`; returns (id, slot).
fn launch(l: &mut Ledger<u32>, at: Instant, payload: u32) -> (u64, u16) {
    let s = l.take_slot().expect("a free slot");
    (l.launched(s, at, payload), s)
}

fn taken(id: u64, payload: u32) -> Decided<u32> {
    Decided::TakenOver { id, payload }
}

#[test]
fn the_transition_table_covers_every_phase_and_outcome() {
    use Phase::*;
    for (phase, outcome, want) in [
        (Launched, 0, Step::Undecided),
        (Launched, APPLIED, Step::Applied),
        (Launched, LEFT, Step::Impossible),
        (Racing, 0, Step::Racing),
        (Racing, APPLIED, Step::Applied),
        (Racing, LEFT, Step::HostCarries),
        (HostOwns, 0, Step::AwaitLate),
        (HostOwns, APPLIED, Step::Impossible),
        (HostOwns, LEFT, Step::SlotFree),
    ] {
        assert_eq!(
            step(phase, outcome),
            want,
            "{phase:?} with outcome {outcome}"
        );
    }
    for phase in [Launched, Racing, HostOwns] {
        for outcome in [3, 4, 0x100, u32::MAX] {
            assert_eq!(
                step(phase, outcome),
                Step::Impossible,
                "{phase:?}/{outcome}"
            );
        }
    }
}

#[test]
fn an_applied_launch_hands_back_its_payload_result_and_wait() {
    for policy in POLICIES {
        let mem = TestMem::new();
        let mut l = ledger(&mem, policy);
        let t0 = Instant::now();
        let (id, s) = launch(&mut l, t0, 5);
        assert!(kernel_side(mem.slot(s), || {
            mem.slot(s)[4].store(0x89ab_cdef, Ordering::SeqCst);
            mem.slot(s)[5].store(0x0123_4567, Ordering::SeqCst);
        }));
        let mut out = Vec::new();
        let r = l.settle(t0 + 3 * MS, Duration::from_secs(1), &mut out);
        assert_eq!(
            out,
            vec![Decided::Applied {
                id,
                payload: 5,
                result: 0x0123_4567_89ab_cdef,
                waited: 3 * MS
            }],
            "{policy:?}"
        );
        assert_eq!(r, Round::default());
        assert_eq!((l.pending(), l.slots().in_use()), (0, 0));
        assert_eq!(
            l.counts,
            Counts {
                applied: 1,
                taken_over: 0,
                broken: 0
            }
        );
    }
}

#[test]
fn a_claim_before_the_kernel_starts_hands_the_work_over_and_keeps_the_slot_for_the_late_kernel() {
    for policy in POLICIES {
        let mem = TestMem::new();
        let mut l = ledger(&mem, policy);
        let t0 = Instant::now();
        let (id, s) = launch(&mut l, t0, 9);
        let mut out = Vec::new();
        // Launched, not due: undecided.
        let r = l.settle(t0, MS, &mut out);
        assert_eq!((r.undecided, r.claimed, out.len()), (1, 0, 0), "{policy:?}");
        // Due: Launched -> HostOwns, the payload comes back.
        let r = l.settle(t0 + MS, MS, &mut out);
        assert_eq!((r.undecided, r.claimed), (0, 1));
        assert_eq!(out, vec![taken(id, 9)]);
        assert_eq!(l.phases().collect::<Vec<_>>(), vec![Phase::HostOwns]);
        assert_eq!(l.undecided(), 0);
        // HostOwns with no answer: the slot stays in use.
        l.settle(t0 + 9 * MS, MS, &mut out);
        assert_eq!((l.pending(), l.slots().in_use(), out.len()), (1, 1, 1));
        // The late kernel sees the host's flag, leaves everything alone: HostOwns -> slot free.
        assert!(!kernel_side(mem.slot(s), || panic!("done twice")));
        let r = l.settle(t0 + 9 * MS, MS, &mut out);
        assert_eq!(r, Round::default());
        assert_eq!((l.pending(), l.slots().in_use(), out.len()), (0, 0, 1));
        assert_eq!(
            l.counts,
            Counts {
                applied: 0,
                taken_over: 1,
                broken: 0
            }
        );
    }
}

#[test]
fn a_claim_that_meets_a_running_kernel_waits_for_its_outcome() {
    for policy in POLICIES {
        for kernel_wins in [true, false] {
            let mem = TestMem::new();
            let mut l = ledger(&mem, policy);
            let t0 = Instant::now();
            let (id, s) = launch(&mut l, t0, 4);
            // The kernel has announced itself but not decided when the host claims.
            mem.slot(s)[KERNEL_FLAG].store(1, Ordering::SeqCst);
            let mut out = Vec::new();
            let r = l.settle(t0, Duration::ZERO, &mut out);
            assert_eq!((r.undecided, r.claimed, out.len()), (1, 0, 0));
            assert_eq!(l.phases().collect::<Vec<_>>(), vec![Phase::Racing]);
            // Racing with no outcome yet: still undecided.
            let r = l.settle(t0 + MS, Duration::ZERO, &mut out);
            assert_eq!((r.undecided, out.len()), (1, 0));
            let outcome = if kernel_wins { APPLIED } else { LEFT };
            mem.slot(s)[OUTCOME].store(outcome, Ordering::SeqCst);
            l.settle(t0 + MS, Duration::ZERO, &mut out);
            if kernel_wins {
                assert!(matches!(out[..], [Decided::Applied { id: i, payload: 4, .. }] if i == id));
            } else {
                assert_eq!(
                    out,
                    vec![taken(id, 4)],
                    "Racing + LEFT: the host carries it"
                );
            }
            assert_eq!((l.pending(), l.slots().in_use()), (0, 0));
        }
    }
}

/// Every impossible state, under every policy: an error, the slot retired, `broken` counted, and
/// the work handed back or dropped as the policy says (never reported applied).
#[test]
fn impossible_states_are_rejected_the_same_way_under_every_policy() {
    for policy in POLICIES {
        // (phase to reach, outcome the slot then reads)
        for (phase, outcome) in [
            (Phase::Launched, LEFT),
            (Phase::Launched, 3),
            (Phase::Racing, 7),
            (Phase::HostOwns, APPLIED),
            (Phase::HostOwns, u32::MAX),
        ] {
            let mem = TestMem::new();
            let mut l = ledger(&mem, policy);
            let t0 = Instant::now();
            let (id, s) = launch(&mut l, t0, 1);
            let mut out = Vec::new();
            match phase {
                Phase::Launched => {}
                Phase::Racing => {
                    mem.slot(s)[KERNEL_FLAG].store(1, Ordering::SeqCst);
                    l.settle(t0, Duration::ZERO, &mut out);
                }
                Phase::HostOwns => {
                    l.settle(t0, Duration::ZERO, &mut out);
                    assert_eq!(out, vec![taken(id, 1)]);
                    out.clear();
                }
            }
            assert_eq!(l.phases().collect::<Vec<_>>(), vec![phase]);
            mem.slot(s)[OUTCOME].store(outcome, Ordering::SeqCst);
            let r = l.settle(
                t0 + Duration::from_secs(9),
                Duration::from_secs(1),
                &mut out,
            );
            let what = format!("{policy:?}, {phase:?} + {outcome}");
            assert_eq!(r.broken, 1, "{what}");
            assert_eq!(l.counts.broken, 1, "{what}");
            assert_eq!(
                (l.pending(), l.slots().in_use()),
                (0, 0),
                "{what}: slot retired"
            );
            assert!(
                !out.iter().any(|d| matches!(d, Decided::Applied { .. })),
                "{what}: reported applied"
            );
            let handed_back = policy.on_broken == OnBroken::HandBack && phase != Phase::HostOwns;
            let want = if handed_back {
                vec![taken(id, 1)]
            } else {
                vec![]
            };
            assert_eq!(out, want, "{what}");
        }
    }
}

#[test]
fn from_launch_times_each_launch_from_its_own_start_and_a_racing_one_holds_nobody_back() {
    let mem = TestMem::new();
    let mut l = ledger(&mem, ATOMICS);
    let t0 = Instant::now();
    let stuck = 5 * MS;
    let (a, sa) = launch(&mut l, t0, 0);
    let (b, _) = launch(&mut l, t0 + MS, 1);
    let (c, _) = launch(&mut l, t0 + 4 * MS, 2);
    // a's kernel is running when the host claims it.
    mem.slot(sa)[KERNEL_FLAG].store(1, Ordering::SeqCst);
    let mut out = Vec::new();
    let r = l.settle(t0 + 5 * MS, stuck, &mut out);
    assert_eq!(
        (r.claimed, r.undecided, out.len()),
        (0, 3, 0),
        "only a is due, and races"
    );
    // b is due at 6 ms although a still races; c goes with b.
    let r = l.settle(t0 + 6 * MS, stuck, &mut out);
    assert_eq!((r.claimed, r.undecided), (2, 1));
    assert_eq!(out, vec![taken(b, 1), taken(c, 2)]);
    let _ = a;
}

#[test]
fn stream_order_times_only_the_oldest_undecided_launch_from_when_the_one_before_was_decided() {
    let mem = TestMem::new();
    let mut l = ledger(&mem, COPIES);
    let t0 = Instant::now();
    let stuck = 30 * MS;
    let (a, sa) = launch(&mut l, t0, 0);
    let (b, _) = launch(&mut l, t0 + MS, 1);
    let mut out = Vec::new();
    // At 29 ms nothing is due.
    l.settle(t0 + 29 * MS, stuck, &mut out);
    assert!(out.is_empty());
    // a's kernel runs at 40 ms; seen then, b's clock starts there (not at 1 ms).
    assert!(kernel_side(mem.slot(sa), || {}));
    l.settle(t0 + 40 * MS, stuck, &mut out);
    assert!(matches!(out[..], [Decided::Applied { id, .. }] if id == a));
    l.settle(t0 + 69 * MS, stuck, &mut out);
    assert_eq!(out.len(), 1, "b is timed from 40 ms");
    l.settle(t0 + 70 * MS, stuck, &mut out);
    assert_eq!(out[1], taken(b, 1));
}

#[test]
fn stream_order_holds_the_younger_launches_behind_a_racing_one() {
    let mem = TestMem::new();
    let mut l = ledger(&mem, COPIES);
    let t0 = Instant::now();
    let (_, sa) = launch(&mut l, t0, 0);
    let (b, _) = launch(&mut l, t0, 1);
    mem.slot(sa)[KERNEL_FLAG].store(1, Ordering::SeqCst);
    let mut out = Vec::new();
    // Stuck limit 0: a is claimed and races; b waits behind it, unclaimed.
    let r = l.settle(t0 + MS, Duration::ZERO, &mut out);
    assert_eq!((r.claimed, r.undecided, out.len()), (0, 2, 0));
    assert_eq!(
        l.phases().collect::<Vec<_>>(),
        vec![Phase::Racing, Phase::Launched]
    );
    // a's kernel applies; b is timed from now and claimed at once (limit 0).
    mem.slot(sa)[OUTCOME].store(APPLIED, Ordering::SeqCst);
    l.settle(t0 + 2 * MS, Duration::ZERO, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1], taken(b, 1));
}

#[test]
fn a_take_over_takes_every_younger_undecided_launch_too() {
    for policy in POLICIES {
        let mem = TestMem::new();
        let mut l = ledger(&mem, policy);
        let t0 = Instant::now();
        let stuck = 5 * MS;
        let ids: Vec<u64> = [0u32, 9, 10]
            .iter()
            .enumerate()
            .map(|(i, &ms)| launch(&mut l, t0 + ms * MS, i as u32).0)
            .collect();
        let mut out = Vec::new();
        // Only the first is past the limit; the younger two wait behind it and go with it.
        let r = l.settle(t0 + 10 * MS, stuck, &mut out);
        assert_eq!(r.claimed, 3, "{policy:?}");
        assert_eq!(
            out,
            vec![taken(ids[0], 0), taken(ids[1], 1), taken(ids[2], 2)]
        );
        for s in l.pending_slots().collect::<Vec<_>>() {
            assert!(!kernel_side(mem.slot(s), || panic!(
                "a younger kernel did it too"
            )));
        }
        l.settle(t0 + 10 * MS, stuck, &mut out);
        assert_eq!((l.pending(), l.slots().in_use()), (0, 0));
    }
}

#[test]
fn slots_run_out_and_come_back_zeroed() {
    let mem = TestMem::new();
    // SAFETY: `mem` outlives the table.
    let mut slots = unsafe { Slots::with_count(mem.0.as_ptr() as *mut u8, COUNT) };
    let taken: Vec<u16> = (0..COUNT).map(|_| slots.take().unwrap()).collect();
    assert!(slots.take().is_none(), "every slot in use");
    mem.slot(taken[5])[OUTCOME].store(APPLIED, Ordering::SeqCst);
    slots.give_back(taken[5]);
    let again = slots.take().unwrap();
    assert_eq!(again, taken[5]);
    assert_eq!(slots.outcome(again), 0, "zeroed when taken");
    assert_eq!(Slots::device_addr(0x1000, 3), 0x1000 + 96);
    assert_eq!(Slots::result_addr(0x1000, 3), 0x1000 + 112);
}

#[test]
fn host_and_kernel_racing_do_each_launch_exactly_once() {
    // A thread plays the kernel; each round both sides start together on a fresh slot, the host
    // claiming at once, and exactly one of them does the work.
    const ROUNDS: u32 = 20_000;
    let mem = Arc::new(TestMem::new());
    // SAFETY: `mem` outlives the table (dropped at the end of the test, after the thread).
    let mut slots = unsafe { Slots::with_count(mem.0.as_ptr() as *mut u8, COUNT) };
    let round = Arc::new(AtomicU32::new(0));
    let decided = Arc::new(AtomicU32::new(0));
    let slot_of_round = Arc::new(AtomicU32::new(0));
    let applied = Arc::new(AtomicU32::new(0));
    let kernel = {
        let (mem, round, decided, slot_of_round, applied) = (
            mem.clone(),
            round.clone(),
            decided.clone(),
            slot_of_round.clone(),
            applied.clone(),
        );
        std::thread::spawn(move || {
            let mut by_kernel = 0u32;
            for r in 1..=ROUNDS {
                while round.load(Ordering::SeqCst) != r {
                    std::hint::spin_loop();
                }
                let s = slot_of_round.load(Ordering::SeqCst) as u16;
                if kernel_side(mem.slot(s), || {
                    applied.fetch_add(1, Ordering::SeqCst);
                }) {
                    by_kernel += 1;
                }
                decided.store(r, Ordering::SeqCst);
            }
            by_kernel
        })
    };
    let (mut by_host, mut racing) = (0u32, 0u32);
    for r in 1..=ROUNDS {
        let s = slots.take().unwrap();
        applied.store(0, Ordering::SeqCst);
        slot_of_round.store(s as u32, Ordering::SeqCst);
        round.store(r, Ordering::SeqCst);
        // A varying head start for the kernel, so that every interleaving comes up.
        for _ in 0..(r % 512) {
            std::hint::spin_loop();
        }
        let claim = slots.claim(s);
        racing += u32::from(claim == Claim::Racing);
        while decided.load(Ordering::SeqCst) != r {
            std::hint::spin_loop();
        }
        let outcome = slots.outcome(s);
        let phase = match claim {
            Claim::Host => Phase::HostOwns,
            Claim::Racing => Phase::Racing,
        };
        match step(phase, outcome) {
            Step::HostCarries => {
                applied.fetch_add(1, Ordering::SeqCst);
                by_host += 1;
            }
            Step::SlotFree => {
                applied.fetch_add(1, Ordering::SeqCst);
                by_host += 1;
            }
            Step::Applied => {}
            other => panic!("round {r}: {phase:?} + outcome {outcome} -> {other:?}"),
        }
        assert_eq!(
            applied.load(Ordering::SeqCst),
            1,
            "round {r}: done exactly once"
        );
        slots.give_back(s);
    }
    let by_kernel = kernel.join().unwrap();
    assert_eq!(by_kernel + by_host, ROUNDS);
    eprintln!(
        "kernel {by_kernel}, host {by_host}; the host's claim met a started kernel {racing} times"
    );
}
