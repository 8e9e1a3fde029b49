//! The software queue as a strict model of the EFA device: each hardware rule the device code must
//! keep is broken here on purpose, and the queue must refuse it the way the device would (an error
//! completion, a log line naming the rule) while a poster that keeps the rule is served.
//!
//! | rule | test |
//! |---|---|
//! | at most `max_batch` WQEs written ahead of the doorbell, over all posters | `written_ahead_of_the_doorbell_is_refused` |
//! | a 128-byte SQ entry is written whole (bytes 64-127 zero) | `stale_bytes_of_a_128_byte_entry_are_refused` |
//! | the NIC's RX CQ does not see the consumer index: undrained entries are overwritten (opt-in model, `NVSHMEM_EFA_SOFT_RX_OVERWRITE=1`) | `undrained_rx_entries_are_overwritten_as_on_the_nic` |
mod softq_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::efa::cqe::CqStatus;
use nvshmem_efa_gda::efa::wqe;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use softq_common::*;

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

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
        let n = u64::from(v.sq_entries);
        let count = 3 * u64::from(MAX_BATCH);
        for pc in base..base + count {
            let mut d = write(
                &peer,
                pe.heap.addr(),
                pe.heap_lkey(),
                pe.heap.addr() + 4096 + 64 * (pc % 16),
                64,
                None,
            );
            d.req_id = pc & 0xffff;
            d.phase = wqe::phase_for(pc, v.sq_entries);
            let b = wqe::encode(&d);
            // SAFETY: a slot of the SQ ring the consumer has not been told about.
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), v.sq.add((pc % n) as usize * 64), 64)
            };
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
