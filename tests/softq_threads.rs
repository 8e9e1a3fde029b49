//! Consumer threads of the software queue (`NVSHMEM_EFA_SOFT_THREADS`, docs/softq-threads.md):
//! ring `r` is served by thread `r % T` alone, thread 0 alone uses the endpoint and posts what the
//! other threads hand it. Host threads play the GPU's posters on the rings.
mod softq_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::CtrlPlacement;
use nvshmem_efa_gda::gda::queues::queue_index;
use nvshmem_efa_gda::gda::softq::{CopyRoute, SoftQueue, SoftQueueConfig};
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_AFTER_DATA, AMO_OP_ADD};
use nvshmem_efa_gda::gda::PeerMemory;
use softq_common::*;

/// Queues per PE: 16 rings for 2 PEs.
const QPP: u32 = 8;
const HEAP: usize = 4 << 20;

fn provider() -> nvshmem_efa_gda::fabric::Provider {
    providers().into_iter().next().expect("a software provider")
}

fn two_pes(threads: usize, unordered: Duration, ipc: CopyRoute) -> Vec<Pe> {
    two_pes_staged(threads, unordered, ipc, false)
}

/// [`two_pes`], `staged`: every RDMA transfer the copy route does not take moves by staged
/// messages (`NVSHMEM_EFA_GPU_STAGING=1`).
fn two_pes_staged(threads: usize, unordered: Duration, ipc: CopyRoute, staged: bool) -> Vec<Pe> {
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = Some(staged);
    cfg.soft_unordered = unordered;
    cfg.soft_ipc = ipc;
    cfg.soft_threads = threads;
    setup_queues(&provider(), 2, HEAP, 64, 16, &cfg, Some(QPP))
}

/// PE 1's heap mapped "here" from its middle on: writes to its upper half run as copies, writes
/// to its lower half go through the provider (handed to thread 0 by the other threads).
struct UpperHalf(u64, u64);

impl PeerMemory for UpperHalf {
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        let lo = self.0 + self.1 / 2;
        let inside =
            addr >= lo && len <= self.0 + self.1 - lo && addr - lo <= self.0 + self.1 - lo - len;
        (pe == 1 && inside).then_some(addr)
    }
}

const ROUNDS: u64 = 4;
const WRITES: usize = 4;
const LEN: usize = 4096;

/// The heap offset of write `i` of queue `qp` (`upper`: in the half that runs as copies).
fn slot_off(qp: u32, i: usize, upper: bool) -> usize {
    let half = if upper { HEAP / 2 } else { 0 };
    half + 64 * 1024 + (qp as usize * WRITES + i) * LEN
}

/// The pattern of queue `qp` in round `round`.
fn pattern(qp: u32, round: u64) -> u8 {
    (qp as u8) * 16 + round as u8 + 1
}

/// Every queue of PE 0 to PE 1, from a host thread each, `ROUNDS` times: `WRITES` writes through
/// the provider (`staged`: by staged messages), `WRITES` copies, then an AMO announcing them (a
/// SEND); every WQE completes once, the data and the counts land, and each ring was served by its
/// one thread, `r % T`.
fn every_wqe_once(threads: usize, staged: bool) {
    let mut pes = two_pes_staged(threads, Duration::ZERO, CopyRoute::Host, staged);
    let pm = UpperHalf(pes[1].heap.addr(), pes[1].heap.len() as u64);
    pes[0].gda.set_peer_memory(Some(Arc::new(pm))).unwrap();
    let q0 = pes[0].gda.soft_queue().unwrap();
    assert_eq!(q0.threads(), threads);
    assert_eq!(
        q0.staging() == nvshmem_efa_gda::gda::softq::Staging::All,
        staged,
        "staging as asked"
    );
    let peer = pes[0].peer(1);
    let (src, src_addr, lkey) = (
        pes[0].heap.ptr() as usize,
        pes[0].heap.addr(),
        pes[0].heap_lkey(),
    );
    let dst_addr = pes[1].heap.addr();
    std::thread::scope(|s| {
        for qp in 0..QPP {
            s.spawn(move || {
                let poster = HostPoster::on_ring(q0, queue_index(1, qp, QPP)).unwrap();
                for round in 0..ROUNDS {
                    let mut ds = Vec::new();
                    for upper in [false, true] {
                        for i in 0..WRITES {
                            let off = slot_off(qp, i, upper);
                            // SAFETY: inside PE 0's heap; this queue's own slots, whose previous
                            // writes completed (quiet below).
                            unsafe {
                                std::ptr::write_bytes(
                                    (src as *mut u8).add(off),
                                    pattern(qp, round),
                                    LEN,
                                )
                            };
                            ds.push(write(
                                &peer,
                                src_addr + off as u64,
                                lkey,
                                dst_addr + off as u64,
                                LEN as u32,
                                None,
                            ));
                        }
                    }
                    let amo = AmoMsg {
                        op: AMO_OP_ADD,
                        size: 8,
                        offset: u64::from(qp) * 8,
                        value: 1,
                        flags: AMO_AFTER_DATA,
                    };
                    ds.push(send_inline(&peer, &amo.encode(), None));
                    poster.post(&ds).unwrap();
                    poster.quiet().unwrap();
                }
                assert_eq!(poster.errors(), 0, "queue {qp}: error completions");
                assert_eq!(poster.duplicates(), 0, "queue {qp}: completions twice");
                assert_eq!(
                    poster.done(),
                    ROUNDS * (2 * WRITES as u64 + 1),
                    "queue {qp}: every WQE completed once"
                );
            });
        }
    });
    let per_ring = ROUNDS * (2 * WRITES as u64 + 1);
    let total = per_ring * u64::from(QPP);
    // SAFETY: PE 1's heap, written by the completed writes and AMOs above.
    let dst = unsafe { std::slice::from_raw_parts(pes[1].heap.ptr(), HEAP) };
    for qp in 0..QPP {
        // The target's consumer applies an AMO after its message arrived (the sender's completion
        // does not wait for that): wait for the last one.
        // SAFETY: an 8-byte aligned word of PE 1's live heap, which its consumer updates with
        // atomics.
        let c = unsafe {
            std::sync::atomic::AtomicU64::from_ptr(
                pes[1].heap.ptr().add(qp as usize * 8) as *mut u64
            )
        };
        let t = Instant::now();
        while c.load(std::sync::atomic::Ordering::Acquire) < ROUNDS
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            c.load(std::sync::atomic::Ordering::Acquire),
            ROUNDS,
            "queue {qp}'s count"
        );
        for upper in [false, true] {
            for i in 0..WRITES {
                let off = slot_off(qp, i, upper);
                assert!(
                    dst[off..off + LEN]
                        .iter()
                        .all(|&b| b == pattern(qp, ROUNDS - 1)),
                    "T={threads}: queue {qp}'s write {i} (upper half: {upper}) landed"
                );
            }
        }
    }
    let st = q0.stats();
    assert_eq!((st.consumed, st.completed, st.rejected), (total, total, 0));
    assert_eq!(st.ipc_copies, u64::from(QPP) * ROUNDS * WRITES as u64);
    assert_eq!(st.amos_announcing, u64::from(QPP) * ROUNDS);
    q0.stop();
    assert!(q0.stopped());
    let all = q0.consumer_summaries();
    assert_eq!(
        all.iter().map(|s| s.thread).collect::<Vec<_>>(),
        (0..threads).collect::<Vec<_>>(),
        "stop joined every thread, each left its account"
    );
    // Each ring served by exactly one thread, r % T, which took every WQE of it.
    let rings = 2 * QPP as usize;
    let mut owner = vec![None; rings];
    for s in &all {
        for &(r, taken) in &s.rings {
            assert_eq!(r % threads, s.thread, "ring {r} on thread {}", s.thread);
            assert!(
                owner[r].replace(s.thread).is_none(),
                "T={threads}: ring {r} served by two threads"
            );
            let want = if r >= QPP as usize { per_ring } else { 0 };
            assert_eq!(taken, want, "ring {r}'s WQEs");
        }
    }
    assert!(
        owner.iter().all(Option::is_some),
        "every ring has a thread: {owner:?}"
    );
    // The accounts sum to the queue's counters.
    assert_eq!(all.iter().map(|s| s.taken).sum::<u64>(), total);
    assert_eq!(all.iter().map(|s| s.completed).sum::<u64>(), total);
    assert_eq!(all.iter().map(|s| s.ipc_copies).sum::<u64>(), st.ipc_copies);
    if threads > 1 {
        let busy = all.iter().filter(|s| s.taken > 0).count();
        assert_eq!(busy, threads, "every thread took WQEs of its rings");
        let handed: u64 = all[1..].iter().map(|s| s.handed).sum();
        assert_eq!(
            handed, all[0].handed,
            "thread 0 took what the others handed over"
        );
        // Each other thread hands over its writes through the provider and its AMOs.
        for s in &all[1..] {
            let rings = s.rings.iter().filter(|r| r.1 > 0).count() as u64;
            assert_eq!(
                s.handed,
                rings * ROUNDS * (WRITES as u64 + 1),
                "thread {}",
                s.thread
            );
        }
    } else {
        assert_eq!(all[0].handed, 0);
    }
}

#[test]
fn every_wqe_completes_once_on_one_thread() {
    every_wqe_once(1, false);
}

#[test]
fn every_wqe_completes_once_on_two_threads() {
    every_wqe_once(2, false);
}

#[test]
fn every_wqe_completes_once_on_four_threads() {
    every_wqe_once(4, false);
}

/// Staged transfers handed over: thread 0 runs their messages and replies for the other threads.
#[test]
fn staged_writes_complete_once_on_two_and_four_threads() {
    every_wqe_once(2, true);
    every_wqe_once(4, true);
}

/// The ordering rule (docs/ordering.md) on a ring of a thread other than 0, whose writes and AMOs
/// thread 0 posts: an announcing count waits for its data (no stale byte, though every write is
/// issued late); the controls (a plain count on the same queue, an announcing count on a queue of
/// another thread) overtake the late writes.
fn ordering_rule(threads: usize) {
    let pes = two_pes(threads, Duration::from_millis(150), CopyRoute::Off);
    // Queue 1 of PE 1 is ring QPP + 1: thread 1 at T = 2 and 4.
    assert_eq!((QPP as usize + 1) % threads, 1);
    let same = data_then_count(&pes, QPP, 0, 1, 1, AMO_AFTER_DATA);
    assert_eq!(
        same, 0,
        "T={threads}: rule violated: a count announcing its queue's data was applied before \
         {same} bytes of it had landed"
    );
    assert!(
        pes[0].gda.soft_queue().unwrap().stats().amos_waited > 0,
        "no count had to wait: the test exercised nothing"
    );
    let plain = data_then_count(&pes, QPP, 1, 1, 1, 0);
    assert!(
        plain > 0,
        "T={threads}: a plain count overtook nothing: the control exercised nothing"
    );
    let other = data_then_count(&pes, QPP, 2, 1, 2, AMO_AFTER_DATA);
    assert!(
        other > 0,
        "T={threads}: a count on another thread's queue waited for this queue's data"
    );
}

#[test]
fn the_ordering_rule_holds_on_two_threads() {
    ordering_rule(2);
}

#[test]
fn the_ordering_rule_holds_on_four_threads() {
    ordering_rule(4);
}

#[test]
fn a_bad_thread_count_is_refused() {
    let d = domain(&provider()).expect("domain");
    for bad in [0, 17] {
        let mut cfg = SoftQueueConfig::new(64, 16, CtrlPlacement::Host);
        cfg.threads = bad;
        let e = SoftQueue::new(&d, &cfg).err().expect("refused");
        assert!(
            e.message.contains("NVSHMEM_EFA_SOFT_THREADS"),
            "{}",
            e.message
        );
    }
}

/// A thread other than 0 that dies fails the queue; stop still joins every thread.
#[test]
fn a_panic_on_another_thread_fails_the_queue_and_stop_joins() {
    let pes = two_pes(2, Duration::ZERO, CopyRoute::Off);
    let q0 = pes[0].gda.soft_queue().unwrap();
    q0.inject_panic_at(2);
    let peer = pes[0].peer(1);
    // Ring QPP + 1 is thread 1's; nothing else posts.
    let poster = HostPoster::on_ring(q0, queue_index(1, 1, QPP)).unwrap();
    let ds = heap_writes(&peer, &pes[0], &pes[1], 4096, 4, 64);
    poster.post(&ds).unwrap();
    let t = Instant::now();
    while q0.failure().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the thread did not fail"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let why = q0.failure().unwrap();
    assert!(why.contains("injected fault"), "{why}");
    assert!(q0.stopped(), "kernels see the failed queue stopped");
    let t = Instant::now();
    q0.stop();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        t.elapsed()
    );
    let all = q0.consumer_summaries();
    assert_eq!(
        all.len(),
        1,
        "thread 0 stopped with its account, thread 1 died: {all:?}"
    );
    assert_eq!(all[0].thread, 0);
}
