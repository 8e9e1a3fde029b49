//! The software queue as a strict model of the EFA device: each hardware rule the device code must
//! keep is broken here on purpose, and the queue must refuse it the way the device would (an error
//! completion, a log line naming the rule) while a poster that keeps the rule is served.
//!
//! | rule | test |
//! |---|---|
//! | at most `max_batch` WQEs written ahead of the doorbell, over all posters | `written_ahead_of_the_doorbell_is_refused` |
//! | a 128-byte SQ entry is written whole (bytes 64-127 zero) | `stale_bytes_of_a_128_byte_entry_are_refused` |
//! | the NIC's RX CQ does not see the consumer index: undrained entries are overwritten (opt-in model, `NVSHMEM_EFA_SOFT_RX_OVERWRITE=1`) | `undrained_rx_entries_are_overwritten_as_on_the_nic` |
//! | (same) a receiver that stops draining finds its next entry overwritten and waits on it | `a_receiver_that_stops_draining_finds_its_next_entry_overwritten` |
//! | a receive whose completion waits for RX ring room stays unposted: at most the receives' worth wait (opt-in model, `NVSHMEM_EFA_SOFT_RX_CREDITS=1`) | `a_receiver_that_does_not_drain_holds_its_receives` |
//! | an AMO that announces data (`AMO_AFTER_DATA`) is applied at the target only after every earlier WQE of its queue to that PE completed (docs/ordering.md) | `an_announcing_amo_is_applied_after_the_data_it_announces`; control: `a_plain_amo_overtakes_the_data_on_an_unordered_fabric`; stop: `a_stopping_queue_settles_the_amos_it_holds` |
mod softq_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::efa::cqe::CqStatus;
use nvshmem_efa_gda::efa::wqe;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::softq::CopyRoute;
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer;
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_AFTER_DATA, AMO_OP_ADD};
use nvshmem_efa_gda::gda::PeerMemory;
use softq_common::*;

/// Statuses by producer count, as the poster's completion polling sees them.
type Seen = Arc<Mutex<BTreeMap<u64, u8>>>;

fn observed(q: &nvshmem_efa_gda::gda::softq::SoftQueue) -> (HostPoster<'_>, Seen) {
    let seen: Seen = Arc::new(Mutex::new(BTreeMap::new()));
    let s = seen.clone();
    let poster = HostPoster::new(q)
        .unwrap()
        .with_observer(Arc::new(move |pc, st, _| {
            s.lock().unwrap().insert(pc, st);
        }));
    (poster, seen)
}

/// Tells the control block about WQEs a raw writer posted, as the protocol's bookkeeping would.
fn account(ctrl: *mut u8, upto: u64) {
    // SAFETY: `resv` and `ready` are the first two words of the live queue's control block (host
    // memory); the test's raw writer plays the posters that would have moved them.
    unsafe {
        AtomicU64::from_ptr(ctrl as *mut u64).store(upto, Ordering::Release);
        AtomicU64::from_ptr((ctrl as *mut u64).add(1)).store(upto, Ordering::Release);
    }
}

#[test]
fn written_ahead_of_the_doorbell_is_refused() {
    const MAX_BATCH: u32 = 8;
    for p in providers() {
        let pes = setup(&p, 1, 1 << 20, 64, MAX_BATCH);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        assert_eq!(pe.gda.device_state().unwrap().queue.max_batch, MAX_BATCH);
        let peer = pe.peer(0);
        let (poster, seen) = observed(q);

        // A poster that keeps the rule: 64 WQEs through the window, in reservations larger and
        // smaller than max_batch, all served.
        for k in [1usize, 3, 8, 13, 20, 19] {
            let descs: Vec<_> = (0..k)
                .map(|i| {
                    write(
                        &peer,
                        pe.heap.addr() + 64 * i as u64,
                        pe.heap_lkey(),
                        pe.heap.addr() + 8192 + 64 * i as u64,
                        64,
                        None,
                    )
                })
                .collect();
            poster.post(&descs).unwrap();
        }
        poster.quiet().unwrap();
        let base = poster.done();
        assert_eq!(base, 64);
        assert_eq!(
            q.stats().ahead_of_doorbell,
            0,
            "a correct poster was flagged"
        );
        assert!(seen.lock().unwrap().values().all(|&s| s == 0));

        // A poster that breaks it: 3 * max_batch WQEs written before the doorbell moves.
        let v = *poster.view();
        let count = 3 * u64::from(MAX_BATCH);
        for pc in base..base + count {
            place_write_wqe(&v, pe, &peer, pc);
        }
        // The consumer looks past the window while the doorbell stands still.
        wait_until("the written-ahead WQEs to be noticed", || {
            q.stats().ahead_of_doorbell >= u64::from(MAX_BATCH)
        });
        account(v.ctrl, base + count);
        // SAFETY: the doorbell record of the live queue.
        unsafe { AtomicU32::from_ptr(v.doorbell) }.store((base + count) as u32, Ordering::Release);
        wait_until("every completion", || {
            poster.poll_cq();
            poster.done() == base + count
        });
        let s = seen.lock().unwrap();
        let bad: Vec<u64> = (base..base + count)
            .filter(|pc| s[pc] == CqStatus::LocalQpInternalError as u8)
            .collect();
        // Within the window [db, db + max_batch) the WQEs were legal; past it, refused.
        assert!(
            (base..base + u64::from(MAX_BATCH)).all(|pc| s[&pc] == 0),
            "WQEs inside the doorbell window were refused: {s:?}"
        );
        assert!(
            bad.iter().all(|&pc| pc >= base + u64::from(MAX_BATCH)),
            "{bad:?}"
        );
        assert_eq!(bad.len() as u64, q.stats().ahead_of_doorbell, "{bad:?}");
        assert!(bad.len() >= MAX_BATCH as usize, "{bad:?}");
    }
}

#[test]
fn stale_bytes_of_a_128_byte_entry_are_refused() {
    for p in providers() {
        let mut cfg = config(GdaMode::Soft);
        cfg.sq_entry_size = 128;
        let pes = setup_with(&p, 2, 1 << 20, 32, 8, &cfg);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        let st = pe.gda.device_state().unwrap();
        assert_eq!(st.queue.sq_entry_size, 128);
        let peer = pe.peer(1);
        let (poster, seen) = observed(q);
        let v = *poster.view();
        assert_eq!(v.sq_entry_size, 128);

        // Fill every slot's tail with garbage first: a poster writing whole entries clears it.
        for slot in 0..v.sq_entries as usize {
            // SAFETY: bytes 64-127 of an SQ slot nobody has written yet.
            unsafe { std::ptr::write_bytes(v.sq.add(slot * 128 + 64), 0xA5, 64) };
        }
        // SAFETY: the heap of PE 0 is host memory owned by the test.
        unsafe { std::ptr::write_bytes(pe.heap.ptr(), 0x5C, 4096) };
        let descs: Vec<_> = (0..40u64)
            .map(|i| {
                write(
                    &peer,
                    pe.heap.addr() + 64 * (i % 64),
                    pe.heap_lkey(),
                    pes[1].heap.addr() + 64 * (i % 64),
                    64,
                    None,
                )
            })
            .collect();
        for c in descs.chunks(5) {
            poster.post(c).unwrap();
        }
        poster.quiet().unwrap();
        assert!(seen.lock().unwrap().values().all(|&s| s == 0));
        // SAFETY: PE 1's heap, written by the queue and quiet.
        let got = unsafe { std::slice::from_raw_parts(pes[1].heap.ptr(), 40 * 64) };
        assert!(got.iter().all(|&b| b == 0x5C), "the writes did not arrive");

        // An entry whose WQE is fine but whose tail still holds an earlier WQE's bytes.
        let pc = poster.done();
        let mut d = write(
            &peer,
            pe.heap.addr(),
            pe.heap_lkey(),
            pes[1].heap.addr(),
            64,
            None,
        );
        d.req_id = pc & 0xffff;
        d.phase = wqe::phase_for(pc, v.sq_entries);
        let mut entry = [0u8; 128];
        wqe::store_entry(&mut entry, &wqe::encode(&d)).unwrap();
        entry[100] = 0x80;
        let slot = (pc % u64::from(v.sq_entries)) as usize;
        // SAFETY: a slot of the SQ ring the consumer has not been told about.
        unsafe { std::ptr::copy_nonoverlapping(entry.as_ptr(), v.sq.add(slot * 128), 128) };
        account(v.ctrl, pc + 1);
        // SAFETY: the doorbell record of the live queue.
        unsafe { AtomicU32::from_ptr(v.doorbell) }.store((pc + 1) as u32, Ordering::Release);
        wait_until("the completion", || {
            poster.poll_cq();
            poster.done() == pc + 1
        });
        assert_eq!(
            seen.lock().unwrap()[&pc],
            CqStatus::LocalQpInternalError as u8
        );
        assert_eq!(q.stats().rejected, 1);
    }
}

/// With the NIC's RX behaviour: a receiver that does not drain loses entries (counted and logged),
/// and after two wraps the phase check hands it the newest pass as if nothing had been lost.
#[test]
fn undrained_rx_entries_are_overwritten_as_on_the_nic() {
    for p in providers() {
        let mut cfg = config(GdaMode::Soft);
        cfg.soft_rx_overwrite = true;
        let pes = setup_with(&p, 1, 1 << 20, 64, 16, &cfg);
        let q = pes[0].gda.soft_queue().unwrap();
        let poster = HostPoster::new(q).unwrap();
        let rx = u64::from(poster.view().rx_entries);
        let peer = pes[0].peer(0);
        // Two RX rings' worth of immediates and 5 more, none consumed.
        let n = 2 * rx + 5;
        let mut i = 0u64;
        while i < n {
            let k = (n - i).min(16);
            let ds: Vec<_> = (0..k)
                .map(|j| send_inline(&peer, b"x", Some((i + j) as u32)))
                .collect();
            poster.post(&ds).unwrap();
            i += k;
        }
        poster.quiet().unwrap();
        wait_until("receive completions", || q.stats().rx_produced == n);
        assert_eq!(q.stats().rx_pending, 0, "nothing is held back");
        assert_eq!(
            q.stats().rx_overruns,
            n - rx,
            "every entry past the ring overwrote one"
        );
        // The receiver now finds the phase it expects at index 0 (the third pass wrote the same
        // phase as the first) and takes entries of the third pass as the first ones: the loss is
        // silent to it, which is why the device must never let the ring overrun.
        let mut got = Vec::new();
        poster.poll_rx(8, &mut got);
        let imms: Vec<u32> = got.iter().map(|r| r.as_ref().unwrap().imm).collect();
        assert_eq!(imms, (2 * rx as u32..2 * rx as u32 + 5).collect::<Vec<_>>());
    }
}

/// Sends from PE 0 to PE 1, whose receiver does not drain, numbered inline SENDs with immediates
/// (posting only while the sender's SQ has room) until `total` are posted or nothing moves for a
/// second; returns how many were posted.
fn send_until_stalled(
    q1: &nvshmem_efa_gda::gda::softq::SoftQueue,
    poster: &HostPoster<'_>,
    peer: &NvshmemEfaGdaPeer,
    total: u64,
) -> u64 {
    let mut posted = 0u64;
    let mut last = (0u64, 0u64, Instant::now());
    loop {
        poster.poll_cq();
        posted += send_step(poster, peer, posted, total);
        let now = (
            poster.done(),
            q1.stats().rx_produced + q1.stats().rx_pending,
        );
        if now != (last.0, last.1) {
            last = (now.0, now.1, Instant::now());
        } else if last.2.elapsed() > Duration::from_secs(1) {
            return posted;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Posts up to 16 more of the numbered SENDs if the SQ has room; returns how many.
fn send_step(poster: &HostPoster<'_>, peer: &NvshmemEfaGdaPeer, posted: u64, total: u64) -> u64 {
    let sq = u64::from(poster.view().sq_entries);
    if posted >= total || posted + 16 > poster.done() + sq {
        return 0;
    }
    let k = (total - posted).min(16);
    let ds: Vec<_> = (0..k)
        .map(|j| send_inline(peer, b"m", Some((posted + j) as u32)))
        .collect();
    poster.post(&ds).unwrap();
    k
}

/// On the device a receive whose completion waits for RX ring room stays unposted, so a receiver
/// that does not drain holds at most its receives' worth of completions and further SENDs wait at
/// the sender (RNR retry). With `NVSHMEM_EFA_SOFT_RX_CREDITS=1` the software queue does the same;
/// without it, it buffers completions without bound (what this test fails on).
#[test]
fn a_receiver_that_does_not_drain_holds_its_receives() {
    for p in providers() {
        let mut cfg = config(GdaMode::Soft);
        cfg.soft_rx_credits = true;
        cfg.gpu_staging = Some(false);
        let pes = setup_with(&p, 2, 1 << 20, 64, 16, &cfg);
        let q0 = pes[0].gda.soft_queue().unwrap();
        let q1 = pes[1].gda.soft_queue().unwrap();
        let (poster, seen) = observed(q0);
        let receiver = HostPoster::new(q1).unwrap();
        let rx = u64::from(receiver.view().rx_entries);
        let credits = 128u64; // the queue's receive buffers
        let total = rx + credits + 256;
        let peer = pes[0].peer(1);
        let posted = send_until_stalled(q1, &poster, &peer, total);
        let st = q1.stats();
        eprintln!(
            "{p}: posted {posted} of {total}, sender done {}, receiver: {} in the ring, {} waiting, {} receives held",
            poster.done(),
            st.rx_produced,
            st.rx_pending,
            st.rx_receives_held
        );
        assert_eq!(st.rx_produced, rx, "the ring fills");
        assert!(
            st.rx_pending <= credits,
            "{} completions wait in host memory, more than the {credits} receives",
            st.rx_pending
        );
        assert_eq!(st.rx_receives_held, st.rx_pending);
        assert_eq!(st.rx_pending, credits, "every receive is held");
        // The receiver drains: every message arrives, in order, and every SEND completes well.
        let mut got = Vec::new();
        let mut posted = posted;
        wait_until("every message", || {
            receiver.poll_rx(64, &mut got);
            if posted < total {
                posted += send_step(&poster, &peer, posted, total);
            }
            poster.poll_cq();
            got.len() as u64 == total && poster.done() == total
        });
        let imms: Vec<u32> = got.iter().map(|r| r.as_ref().unwrap().imm).collect();
        assert_eq!(imms, (0..total as u32).collect::<Vec<_>>());
        assert!(seen.lock().unwrap().values().all(|&s| s == 0));
        assert_eq!(q1.stats().rx_receives_held, 0);
    }
}

/// With the NIC's RX behaviour, a receiver that drains for a while and then stops: one entry past
/// the ring overwrites the one it would read next, whose phase is now the next pass's, so its phase
/// check sees nothing ready although a ring's worth of entries arrived (the device would wait
/// there until it times out).
#[test]
fn a_receiver_that_stops_draining_finds_its_next_entry_overwritten() {
    for p in providers() {
        let mut cfg = config(GdaMode::Soft);
        cfg.soft_rx_overwrite = true;
        let pes = setup_with(&p, 1, 1 << 20, 64, 16, &cfg);
        let q = pes[0].gda.soft_queue().unwrap();
        let poster = HostPoster::new(q).unwrap();
        let rx = u64::from(poster.view().rx_entries);
        let peer = pes[0].peer(0);
        let send = |from: u64, n: u64| {
            let mut i = from;
            while i < from + n {
                let k = (from + n - i).min(16);
                let ds: Vec<_> = (0..k)
                    .map(|j| send_inline(&peer, b"y", Some((i + j) as u32)))
                    .collect();
                poster.post(&ds).unwrap();
                i += k;
            }
            poster.quiet().unwrap();
            wait_until("receive completions", || q.stats().rx_produced == from + n);
        };
        // Half a ring, drained as it comes.
        let h = rx / 2;
        send(0, h);
        let mut got = Vec::new();
        wait_until("the first half", || {
            poster.poll_rx(64, &mut got);
            got.len() as u64 == h
        });
        assert_eq!(q.stats().rx_overruns, 0, "a draining receiver lost nothing");
        // The receiver stops; a ring's worth and one more arrive.
        send(h, rx + 1);
        assert_eq!(q.stats().rx_overruns, 1);
        let mut after = Vec::new();
        assert_eq!(
            poster.poll_rx(64, &mut after),
            0,
            "the overwritten entry still looked ready: {after:?}"
        );
    }
}

/// Data, then a count: rounds of large writes from PE 0 into PE 1's heap, each followed at once
/// (no quiet in between) by an 8-byte add to a counter in PE 1's heap. A thread playing PE 1's
/// kernel waits for each count and checks that every byte of that round has landed. Returns the
/// number of bytes found stale when their count was visible, and the queue's counters.
fn data_then_count(pes: &[Pe], flags: u32) -> (u64, u64, u64) {
    const ROUNDS: u8 = 24;
    const WRITES: usize = 8;
    const LEN: usize = 128 << 10;
    const DATA: usize = 4096;
    let q0 = pes[0].gda.soft_queue().unwrap();
    let poster = HostPoster::new(q0).unwrap();
    let peer = pes[0].peer(1);
    let src = pes[0].heap.ptr();
    let dst = pes[1].heap.ptr() as usize;
    let total = WRITES * LEN;
    let checker = std::thread::spawn(move || {
        let dst = dst as *mut u8;
        // SAFETY: the counter is the first 8-byte word of PE 1's live heap (page aligned); the
        // software queue's consumer applies the adds to it with atomics.
        let count = unsafe { AtomicU64::from_ptr(dst as *mut u64) };
        let mut stale = 0u64;
        for round in 1..=u64::from(ROUNDS) {
            wait_until("the round's count", || {
                count.load(Ordering::Acquire) >= round
            });
            // SAFETY: the data range lies inside PE 1's heap; bytes are read once the count says
            // they landed (the property under test); writers only ever raise them.
            let data = unsafe { std::slice::from_raw_parts(dst.add(DATA), total) };
            stale += data.iter().filter(|&&b| u64::from(b) < round).count() as u64;
        }
        stale
    });
    for round in 1..=ROUNDS {
        // SAFETY: the source range lies inside PE 0's heap; the previous round's writes have
        // completed (quiet below), so nothing reads it now.
        unsafe { std::ptr::write_bytes(src.add(DATA), round, total) };
        let mut ds = heap_writes(&peer, &pes[0], &pes[1], DATA, WRITES, LEN);
        let amo = AmoMsg {
            op: AMO_OP_ADD,
            size: 8,
            offset: 0,
            value: 1,
            flags,
        };
        ds.push(send_inline(&peer, &amo.encode(), None));
        poster.post(&ds).unwrap();
        poster.quiet().unwrap();
        assert_eq!(poster.errors(), 0, "round {round}: error completions");
    }
    let stale = checker.join().unwrap();
    let st = q0.stats();
    (stale, st.amos_announcing, st.amos_waited)
}

/// Maps PE 1's heap at its own addresses (the PEs are threads of one process): PE 0's queue then
/// runs its writes to PE 1 as copies (the copy route).
struct SameProcess {
    base: u64,
    len: u64,
}

impl PeerMemory for SameProcess {
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        let inside = addr >= self.base && len <= self.len && addr - self.base <= self.len - len;
        (pe == 1 && inside).then_some(addr)
    }
}

/// How the writes of [`data_then_count`] travel.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Provider,
    Staged,
    /// The copy route through the bounce ring (`memcpy` here).
    Copy,
}

/// Two PEs with writes going `route`; `unordered`: the unordered fabric model (every provider or
/// staged write issued that long after it was taken, so the SEND after it overtakes it).
fn data_then_count_setup(
    p: &nvshmem_efa_gda::fabric::Provider,
    route: Route,
    unordered: Duration,
) -> Vec<Pe> {
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = Some(route == Route::Staged);
    cfg.soft_unordered = unordered;
    cfg.soft_ipc = CopyRoute::Host;
    let mut pes = setup_with(p, 2, 2 << 20, 64, 16, &cfg);
    if route == Route::Copy {
        let pm: Arc<dyn PeerMemory> = Arc::new(SameProcess {
            base: pes[1].heap.addr(),
            len: pes[1].heap.len() as u64,
        });
        pes[0].gda.set_peer_memory(Some(pm)).unwrap();
    }
    pes
}

/// How late the unordered model issues writes: far longer than a SEND takes to be applied.
const LATE: Duration = Duration::from_millis(20);

/// The provider the ordering tests run on: the first that opens (tcp where it does). The rule
/// lives in the consumer, above the provider, and one provider keeps the number of shm pairs this
/// test binary opens where it was (shm pairs opened late in one process can find every send
/// refused with -FI_EAGAIN).
fn ordering_provider() -> nvshmem_efa_gda::fabric::Provider {
    providers().into_iter().next().expect("a software provider")
}

/// The ordering rule (docs/ordering.md): an AMO flagged `AMO_AFTER_DATA` is not applied at the
/// target before the writes its queue took before it for that PE have landed. Through the
/// provider and staged, in order and with the unordered fabric model (writes issued 20 ms late:
/// without the rule every count would be seen before its data, see the control below), and on
/// the copy route.
#[test]
fn an_announcing_amo_is_applied_after_the_data_it_announces() {
    for p in [ordering_provider()] {
        for (route, late) in [
            (Route::Provider, Duration::ZERO),
            (Route::Staged, Duration::ZERO),
            (Route::Copy, Duration::ZERO),
            (Route::Provider, LATE),
            (Route::Staged, LATE),
        ] {
            let pes = data_then_count_setup(&p, route, late);
            let (stale, announcing, waited) = data_then_count(&pes, AMO_AFTER_DATA);
            eprintln!(
                "{p} {route:?} late={late:?}: {announcing} announcing AMOs, {waited} waited \
                 for their data, {stale} stale bytes"
            );
            assert_eq!(
                stale, 0,
                "{p} {route:?} late={late:?}: rule violated: an AMO announcing data was \
                 applied before {stale} bytes of the writes before it had landed"
            );
            assert_eq!(announcing, 24);
            assert!(
                waited > 0,
                "{p} {route:?}: no AMO ever had to wait, so the test exercised nothing"
            );
            if route == Route::Copy {
                let copies = pes[0].gda.soft_queue().unwrap().stats().ipc_copies;
                assert_eq!(copies, 24 * 8, "{p}: every write went the copy route");
            }
        }
    }
}

/// Control for the rule: the same traffic with plain (unordered) AMOs on the unordered fabric
/// model: the counts overtake their data and the check above sees it.
#[test]
fn a_plain_amo_overtakes_the_data_on_an_unordered_fabric() {
    for p in [ordering_provider()] {
        for route in [Route::Provider, Route::Staged] {
            let pes = data_then_count_setup(&p, route, LATE);
            let (stale, announcing, _) = data_then_count(&pes, 0);
            eprintln!("{p} {route:?}: plain AMOs, {stale} stale bytes");
            assert_eq!(announcing, 0);
            assert!(
                stale > 0,
                "{p} {route:?}: no count overtook its data although every write was issued \
                 {LATE:?} late"
            );
        }
    }
}

/// A queue stopped while an announcing AMO waits for its data: within the stop's drain the late
/// writes go and the AMO follows them (applied at the target); past it (writes later than the
/// drain) the writes and the AMO complete as flushed and the AMO is never applied. Either way
/// every WQE gets its completion and the consumer ends.
#[test]
fn a_stopping_queue_settles_the_amos_it_holds() {
    let p = ordering_provider();
    for (late, applied) in [(LATE, true), (Duration::from_secs(8), false)] {
        let pes = data_then_count_setup(&p, Route::Provider, late);
        let q0 = pes[0].gda.soft_queue().unwrap();
        let poster = HostPoster::new(q0).unwrap();
        let peer = pes[0].peer(1);
        let mut ds: Vec<_> = (0..2u64)
            .map(|i| {
                write(
                    &peer,
                    pes[0].heap.addr() + 4096 + 4096 * i,
                    pes[0].heap_lkey(),
                    pes[1].heap.addr() + 4096 + 4096 * i,
                    4096,
                    None,
                )
            })
            .collect();
        let amo = AmoMsg {
            op: AMO_OP_ADD,
            size: 8,
            offset: 0,
            value: 1,
            flags: AMO_AFTER_DATA,
        };
        ds.push(send_inline(&peer, &amo.encode(), None));
        poster.post(&ds).unwrap();
        wait_until("the AMO held", || q0.stats().amos_waited == 1);
        let t = Instant::now();
        q0.stop();
        let st = q0.stats();
        eprintln!(
            "{p} late={late:?}: stopped after {:?}, {} completions",
            t.elapsed(),
            st.completed
        );
        assert_eq!(st.completed, 3, "every WQE completed (late={late:?})");
        // SAFETY: the first 8-byte word of PE 1's live heap; its queue applies adds atomically.
        let count = unsafe { AtomicU64::from_ptr(pes[1].heap.ptr() as *mut u64) };
        if applied {
            wait_until("the AMO applied", || count.load(Ordering::Acquire) == 1);
        } else {
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(
                count.load(Ordering::Acquire),
                0,
                "a flushed AMO was applied although its data never went"
            );
        }
    }
}
