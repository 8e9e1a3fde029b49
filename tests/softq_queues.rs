//! Many queues per PE (docs/gda-queues.md): the device state's queue table has one entry per
//! `(dst_pe, qp_id)`, the software queue gives each entry a ring of its own and one consumer serves
//! them all. Host threads play the GPU's posters on the rings ([`HostPoster::on_ring`]).
mod softq_common;

use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::queues::queue_index;
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_AFTER_DATA, AMO_OP_ADD};
use nvshmem_efa_gda::gda::PeerMemory;
use softq_common::*;

const QUEUES_PER_PE: u32 = 4;

/// The provider these tests run on: the first that opens (tcp where it does).
fn provider() -> nvshmem_efa_gda::fabric::Provider {
    providers().into_iter().next().expect("a software provider")
}

fn two_pes(unordered: Duration) -> Vec<Pe> {
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = Some(false);
    cfg.soft_unordered = unordered;
    setup_queues(&provider(), 2, 2 << 20, 64, 16, &cfg, Some(QUEUES_PER_PE))
}

#[test]
fn the_state_describes_a_queue_per_pair_and_each_has_a_ring() {
    let pes = two_pes(Duration::ZERO);
    for pe in &pes {
        let st = pe.gda.device_state().unwrap();
        assert_eq!(st.ready, 1);
        assert_eq!(
            (st.n_queues, st.queues_per_pe),
            (2 * QUEUES_PER_PE, QUEUES_PER_PE)
        );
        assert_ne!(st.queues, 0);
        let table = pe.gda.queue_table();
        assert_eq!(table.len(), 8);
        assert_eq!(table[0], st.queue, "entry 0 is the state's queue");
        let mut ctrls: Vec<u64> = table.iter().map(|q| q.ctrl).collect();
        ctrls.sort_unstable();
        ctrls.dedup();
        assert_eq!(ctrls.len(), 8, "every entry has a control block of its own");
        let mut sqs: Vec<u64> = table.iter().map(|q| q.sq).collect();
        sqs.sort_unstable();
        sqs.dedup();
        assert_eq!(sqs.len(), 8, "every entry has a ring of its own");
        assert!(
            table.iter().all(|q| q.rx_cq == st.queue.rx_cq),
            "one RX ring per PE"
        );
        assert_eq!(pe.gda.soft_queue().unwrap().rings(), 8);
    }
}

#[test]
fn every_queue_delivers() {
    let pes = two_pes(Duration::ZERO);
    let q0 = pes[0].gda.soft_queue().unwrap();
    let peer = pes[0].peer(1);
    const LEN: usize = 4096;
    let mut posted = 0;
    for qp in 0..QUEUES_PER_PE {
        let ring = queue_index(1, qp, QUEUES_PER_PE);
        let poster = HostPoster::on_ring(q0, ring).unwrap();
        let src = pes[0].heap.ptr();
        // Eight writes per queue, each its own 4 KiB of PE 1's heap, bytes naming the queue.
        let ds: Vec<_> = (0..8usize)
            .map(|i| {
                let off = (qp as usize * 8 + i) * LEN;
                // SAFETY: inside PE 0's heap (2 MiB); nothing is in flight from this range.
                unsafe { std::ptr::write_bytes(src.add(off), 0x40 + qp as u8, LEN) };
                write(
                    &peer,
                    pes[0].heap.addr() + off as u64,
                    pes[0].heap_lkey(),
                    pes[1].heap.addr() + off as u64,
                    LEN as u32,
                    None,
                )
            })
            .collect();
        poster.post(&ds).unwrap();
        poster.quiet().unwrap();
        assert_eq!(poster.errors(), 0, "queue {qp}: error completions");
        assert_eq!(
            poster.done(),
            8,
            "queue {qp} (ring {ring}) counts its own WQEs"
        );
        posted += 8;
    }
    // SAFETY: PE 1's heap, written by the completed writes above.
    let dst = unsafe { std::slice::from_raw_parts(pes[1].heap.ptr(), 4 * 8 * LEN) };
    for qp in 0..QUEUES_PER_PE as usize {
        let part = &dst[qp * 8 * LEN..(qp + 1) * 8 * LEN];
        assert!(
            part.iter().all(|&b| b == 0x40 + qp as u8),
            "queue {qp}'s writes landed"
        );
    }
    assert_eq!(q0.stats().consumed, posted);
    // Ring 0 (PE 0's own pair) never posted.
    assert_eq!(HostPoster::on_ring(q0, 0).unwrap().resv(), 0);
    assert!(
        HostPoster::on_ring(q0, 8).is_err(),
        "no ring past the table"
    );
}

/// How late the unordered fabric model issues writes.
const LATE: Duration = Duration::from_millis(400);

#[test]
fn quiet_of_one_queue_does_not_wait_for_another() {
    let pes = two_pes(LATE);
    let q0 = pes[0].gda.soft_queue().unwrap();
    let peer = pes[0].peer(1);
    let slow = HostPoster::on_ring(q0, queue_index(1, 1, QUEUES_PER_PE)).unwrap();
    let fast = HostPoster::on_ring(q0, queue_index(1, 2, QUEUES_PER_PE)).unwrap();
    // A write on queue 1: the model issues it LATE after it was taken.
    slow.post(&[write(
        &peer,
        pes[0].heap.addr(),
        pes[0].heap_lkey(),
        pes[1].heap.addr(),
        4096,
        None,
    )])
    .unwrap();
    // An AMO (a SEND: not delayed) on queue 2, and the quiet of queue 2.
    let amo = AmoMsg {
        op: AMO_OP_ADD,
        size: 8,
        offset: 8192,
        value: 1,
        flags: 0,
    };
    let t = Instant::now();
    fast.post(&[send_inline(&peer, &amo.encode(), None)])
        .unwrap();
    fast.quiet().unwrap();
    let took = t.elapsed();
    assert!(
        slow.done() < slow.ready(),
        "queue 1's write is still in flight when queue 2's quiet returns"
    );
    assert!(
        took < LATE,
        "queue 2's quiet took {took:?}: it waited for queue 1's write (issued {LATE:?} late)"
    );
    slow.quiet().unwrap();
    assert_eq!((slow.errors(), fast.errors()), (0, 0));
}

/// The ordering rule (docs/ordering.md) holds per queue: an announcing count on the queue of its
/// data waits for that data (no stale byte, though every write is issued late); the same count on
/// another queue of the same PE is not ordered after it (the control: it overtakes the late
/// writes), and neither is a plain count on the same queue.
#[test]
fn the_ordering_rule_is_per_queue() {
    // Writes issued 150 ms late: far longer than the checker takes to see a count, even on a
    // loaded machine.
    let pes = two_pes(Duration::from_millis(150));
    let same = data_then_count(&pes, QUEUES_PER_PE, 0, 1, 1, AMO_AFTER_DATA);
    assert_eq!(
        same, 0,
        "rule violated: a count announcing the data of its own queue was applied before {same} \
         bytes of it had landed"
    );
    let st = pes[0].gda.soft_queue().unwrap().stats();
    assert!(
        st.amos_waited > 0,
        "no count had to wait: the test exercised nothing"
    );
    let other = data_then_count(&pes, QUEUES_PER_PE, 1, 2, 3, AMO_AFTER_DATA);
    assert!(
        other > 0,
        "a count on another queue waited for this queue's data: the rule is not per queue"
    );
    let plain = data_then_count(&pes, QUEUES_PER_PE, 2, 1, 1, 0);
    assert!(
        plain > 0,
        "a plain count overtook nothing: the control exercised nothing"
    );
}

/// Same-host copies keep working from every ring (the copy route is per consumer, not per ring).
#[test]
fn the_copy_route_serves_every_ring() {
    struct SameProcess(u64, u64);
    impl PeerMemory for SameProcess {
        fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
            let inside = addr >= self.0 && len <= self.1 && addr - self.0 <= self.1 - len;
            (pe == 1 && inside).then_some(addr)
        }
    }
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = Some(false);
    cfg.soft_ipc = nvshmem_efa_gda::gda::softq::CopyRoute::Host;
    let mut pes = setup_queues(&provider(), 2, 2 << 20, 64, 16, &cfg, Some(QUEUES_PER_PE));
    let pm = SameProcess(pes[1].heap.addr(), pes[1].heap.len() as u64);
    pes[0]
        .gda
        .set_peer_memory(Some(std::sync::Arc::new(pm)))
        .unwrap();
    let q0 = pes[0].gda.soft_queue().unwrap();
    let peer = pes[0].peer(1);
    for qp in 0..QUEUES_PER_PE {
        let poster = HostPoster::on_ring(q0, queue_index(1, qp, QUEUES_PER_PE)).unwrap();
        let off = 4096 * (1 + qp as u64);
        // SAFETY: inside PE 0's heap.
        unsafe {
            std::ptr::write_bytes(pes[0].heap.ptr().add(off as usize), 0x70 + qp as u8, 4096)
        };
        poster
            .post(&[write(
                &peer,
                pes[0].heap.addr() + off,
                pes[0].heap_lkey(),
                pes[1].heap.addr() + off,
                4096,
                None,
            )])
            .unwrap();
        poster.quiet().unwrap();
        assert_eq!(poster.errors(), 0);
        // SAFETY: inside PE 1's heap, written by the completed copy.
        let d = unsafe { std::slice::from_raw_parts(pes[1].heap.ptr().add(off as usize), 4096) };
        assert!(
            d.iter().all(|&b| b == 0x70 + qp as u8),
            "queue {qp}'s copy landed"
        );
    }
    assert_eq!(q0.stats().ipc_copies, u64::from(QUEUES_PER_PE));
}

/// Past `max_rings` the table's entries share rings round-robin (entry `i` on ring
/// `i % max_rings`), and asking again for fewer or as many rings changes nothing.
#[test]
fn rings_beyond_the_cap_are_shared() {
    use nvshmem_efa_gda::gda::mem::CtrlPlacement;
    use nvshmem_efa_gda::gda::queue::GdaQueue;
    use nvshmem_efa_gda::gda::softq::{SoftQueue, SoftQueueConfig};
    let d = domain(&provider()).expect("domain");
    let mut cfg = SoftQueueConfig::new(64, 16, CtrlPlacement::Host);
    cfg.max_rings = 3;
    let q = SoftQueue::new(&d, &cfg).unwrap();
    assert_eq!(q.rings(), 1);
    assert_eq!(q.add_rings(8).unwrap(), 3);
    assert_eq!(q.add_rings(2).unwrap(), 3);
    assert!(q.ring_desc(2).is_some() && q.ring_desc(3).is_none());
    let t = GdaQueue::queue_table(&q, 2, 4).unwrap();
    assert_eq!(t.len(), 8);
    for (i, e) in t.iter().enumerate() {
        assert_eq!(e.ctrl, t[i % 3].ctrl, "entry {i} on ring {}", i % 3);
    }
    assert_ne!(t[0].ctrl, t[1].ctrl);
    assert_ne!(t[1].ctrl, t[2].ctrl);
    assert_eq!(t[0], q.queue_desc());
}
