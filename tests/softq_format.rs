//! What the software queue writes, byte for byte: TX completions (request id, status, queue type, op
//! type, QP number, the phase sequence across CQ wraps), RX completions (phase across RX-ring wraps,
//! immediates, lengths, source), the consumed/rejected words, and the guards against a poster that
//! breaks the protocol (a doorbell beyond the ring, WQEs beyond the completion bound).
mod softq_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvshmem_efa_gda::efa::cqe::{self, CqStatus, QueueType, TX_CQE_SIZE};
use nvshmem_efa_gda::efa::wqe::OpType;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::wire;
use softq_common::*;

/// (producer count, status, raw CQE) as the observer saw it.
type Completion = (u64, u8, [u8; TX_CQE_SIZE]);

#[test]
fn tx_completion_bytes_and_phase_across_wraps() {
    for p in providers() {
        let pes = setup(&p, 1, 1 << 20, 8, 4);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        let log: Arc<Mutex<Vec<Completion>>> = Arc::default();
        let l2 = log.clone();
        let poster = HostPoster::new(q)
            .unwrap()
            .with_observer(Arc::new(move |pc, st, b| {
                l2.lock().unwrap().push((pc, st, *b))
            }));
        let peer = pe.peer(0);
        let base = pe.heap.addr();
        let lkey = pe.heap_lkey();
        // One WQE at a time: completion i lands in CQ slot i % 8 with phase 1 on even passes.
        let total = 8 * 5 + 3;
        for i in 0..total as u64 {
            let d = if i % 3 == 2 {
                read(&peer, base + 4096, lkey, base + 8192, 64)
            } else {
                write(&peer, base, lkey, base + 65536 + i * 64, 64, None)
            };
            let pc = poster.post(&[d]).unwrap();
            assert_eq!(pc, i);
            poster.quiet().unwrap();
        }
        let log = log.lock().unwrap();
        assert_eq!(log.len(), total);
        for (i, (pc, st, b)) in log.iter().enumerate() {
            assert_eq!(*pc, i as u64);
            assert_eq!(*st, 0, "status of WQE {i}");
            let c = cqe::decode_tx(b).expect("well-formed TX CQE");
            assert_eq!(c.req_id, i as u64);
            assert_eq!(c.status, CqStatus::Ok);
            assert_eq!(
                c.phase,
                cqe::cq_expected_phase(i as u64, 8),
                "phase of completion {i}"
            );
            assert_eq!(c.phase, if (i / 8) % 2 == 0 { 1 } else { 0 });
            assert_eq!(
                cqe::queue_type_of(&[b[0], b[1], b[2], b[3]]).unwrap(),
                QueueType::Send
            );
            assert_eq!(
                c.op,
                if i % 3 == 2 {
                    OpType::RdmaRead
                } else {
                    OpType::RdmaWrite
                }
            );
            assert_eq!(c.qp_num, wire::soft_qpn(0));
        }
        let st = q.stats();
        assert_eq!(st.consumed, total as u64);
        assert_eq!(st.rejected, 0);
        assert_eq!(st.completed, total as u64);
        assert_eq!(poster.duplicates(), 0);
        assert_eq!(poster.errors(), 0);
    }
}

#[test]
fn rx_completions_across_ring_wraps() {
    for p in providers() {
        let pes = setup(&p, 2, 1 << 20, 64, 16);
        let (a, b) = (&pes[0], &pes[1]);
        let qa = a.gda.soft_queue().unwrap();
        let qb = b.gda.soft_queue().unwrap();
        let pa = HostPoster::new(qa).unwrap();
        let pb = HostPoster::new(qb).unwrap();
        let rx_entries = pb.view().rx_entries as u64;
        let n = rx_entries * 2 + 17;
        let to_b = a.peer(1);
        let mut got = Vec::new();
        for i in 0..n {
            let d = if i % 2 == 0 {
                write(
                    &to_b,
                    a.heap.addr(),
                    a.heap_lkey(),
                    b.heap.addr() + 128 * (i % 64),
                    100 + (i % 7) as u32,
                    Some(i as u32),
                )
            } else {
                send_inline(&to_b, &[i as u8; 9], Some(i as u32))
            };
            pa.post(&[d]).unwrap();
            pa.quiet().unwrap();
            // Drain B's RX ring in small bites so it wraps several times.
            let mut v = Vec::new();
            wait_until("RX completion", || {
                pb.poll_rx(8, &mut v);
                !v.is_empty()
            });
            got.extend(v);
        }
        assert_eq!(pa.errors(), 0);
        assert_eq!(got.len() as u64, n);
        for (i, r) in got.iter().enumerate() {
            let r = r.as_ref().expect("well-formed RX CQE");
            let i = i as u64;
            assert_eq!(
                r.phase,
                cqe::cq_expected_phase(i, rx_entries as u32),
                "RX phase {i}"
            );
            assert_eq!(r.status, CqStatus::Ok);
            assert!(r.has_imm);
            assert_eq!(r.imm, i as u32);
            assert_eq!(r.ah, 0, "source PE");
            assert_eq!(r.src_qp, wire::soft_qpn(0));
            assert_eq!(r.qp_num, wire::soft_qpn(1));
            if i % 2 == 0 {
                assert_eq!(r.op, OpType::RdmaWrite);
                assert!(r.unsolicited);
                assert_eq!(r.length, 100 + (i % 7) as u32);
            } else {
                assert_eq!(r.op, OpType::Send);
                assert_eq!(r.length, 9);
            }
        }
        assert_eq!(qb.stats().rx_produced, n);
        // Nothing more arrives.
        std::thread::sleep(Duration::from_millis(20));
        let mut v = Vec::new();
        assert_eq!(pb.poll_rx(8, &mut v), 0);
    }
}

#[test]
fn rx_ring_never_overruns_and_nothing_is_lost() {
    for p in providers() {
        let pes = setup(&p, 1, 1 << 20, 64, 16);
        let q = pes[0].gda.soft_queue().unwrap();
        let poster = HostPoster::new(q).unwrap();
        let rx = poster.view().rx_entries as u64;
        let peer = pes[0].peer(0);
        // Twice the RX ring's worth of immediates without consuming any.
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
        wait_until("receive completions", || {
            q.stats().rx_produced + q.stats().rx_pending == n
        });
        assert_eq!(q.stats().rx_produced, rx, "the ring holds exactly its size");
        let mut got = Vec::new();
        wait_until("all receive completions", || {
            poster.poll_rx(7, &mut got);
            got.len() as u64 == n
        });
        let imms: Vec<u32> = got.iter().map(|r| r.as_ref().unwrap().imm).collect();
        assert_eq!(
            imms,
            (0..n as u32).collect::<Vec<_>>(),
            "in order, exactly once"
        );
        assert_eq!(q.stats().rx_pending, 0);
    }
}

#[test]
fn bogus_doorbell_and_completion_bound_are_enforced() {
    for p in providers() {
        let pes = setup(&p, 1, 1 << 20, 16, 16);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        let v = q.host_view().unwrap();
        let peer = pe.peer(0);
        let n = v.sq_entries as u64;
        let db = |val: u32| {
            // SAFETY: the doorbell record of a live queue.
            unsafe { std::sync::atomic::AtomicU32::from_ptr(v.doorbell) }
                .store(val, Ordering::Release)
        };
        let put = |pc: u64| place_write_wqe(&v, pe, &peer, pc);
        // A doorbell announcing more than the ring holds is ignored.
        db((n + 3) as u32);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(q.stats().consumed, 0);
        // A full ring, then a poster that ignores `done` and overwrites: the consumer stops at the
        // completion bound (n WQEs beyond done = 0) instead of overflowing the CQ.
        for pc in 0..n {
            put(pc);
        }
        db(n as u32);
        wait_until("first ring", || q.stats().completed == n);
        for pc in n..n + 4 {
            put(pc);
        }
        db((n + 4) as u32);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            q.stats().consumed,
            n,
            "no WQE is taken while the CQ could overflow"
        );
        // A poster that follows the protocol retires the completions; the queue then goes on.
        let done_log = Arc::new(AtomicU64::new(0));
        let d2 = done_log.clone();
        let poster = HostPoster::new(q)
            .unwrap()
            .with_observer(Arc::new(move |_, st, _| {
                assert_eq!(st, 0);
                d2.fetch_add(1, Ordering::Relaxed);
            }));
        // Tell the control block what the raw poster did, as its own bookkeeping would have.
        // SAFETY: the control block of a live queue (host memory).
        unsafe {
            std::sync::atomic::AtomicU64::from_ptr(v.ctrl as *mut u64)
                .store(n + 4, Ordering::Release);
            std::sync::atomic::AtomicU64::from_ptr((v.ctrl as *mut u64).add(1))
                .store(n + 4, Ordering::Release);
        }
        wait_until("completions of both rounds", || {
            poster.poll_cq();
            poster.done() == n + 4
        });
        assert_eq!(done_log.load(Ordering::Relaxed), n + 4);
        assert_eq!(q.stats().consumed, n + 4);
    }
}
