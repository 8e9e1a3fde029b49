//! The software queue's copy route and its null consumer, on host memory.
//!
//! * Copy route: RDMA writes (without immediate) and reads whose peer range a [`PeerMemory`] maps in
//!   this process run as copies on the queue's copy queue (here `memcpy`: no GPU, the "mapping" is
//!   the peer's host heap of the same process); everything else keeps its path, and
//!   `NVSHMEM_EFA_SOFT_IPC=0` turns the route off. `kernel` (default) moves a round's copies in one
//!   launch of the copy kernel (here its host stand-in, a thread, so the claim protocol runs as on
//!   the GPU) and takes launches over that do not start; `host` moves each copy in two hops through
//!   the bounce ring (here two memcpys, so the ring's reservations, waits and wraps run as on the
//!   GPU); `direct` copies once.
//! * Null consumer (`NVSHMEM_EFA_SOFT_NULL=1`): every WQE completes with success after the request
//!   id and phase checks, nothing moves; a wrong request id or phase still gets its error.
mod softq_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nvshmem_efa_gda::config::{Config, GdaMode};
use nvshmem_efa_gda::efa::cqe::{self, CqStatus};
use nvshmem_efa_gda::efa::wqe::{self, OpType};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::softq::{CopyRoute, SoftQueue};
use nvshmem_efa_gda::gda::PeerMemory;
use softq_common::*;

const HEAP: usize = 1 << 20;

/// Maps PE `pe`'s heap `[base, base + len)` at the same addresses (one process), counting lookups.
struct FakePeers {
    pe: i32,
    base: u64,
    len: u64,
    lookups: AtomicU64,
}

impl PeerMemory for FakePeers {
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let inside = addr >= self.base && len <= self.len && addr - self.base <= self.len - len;
        (pe == self.pe && inside).then_some(addr)
    }
}

/// Completions by producer count: (status, op, request id) as the poster's CQ polling saw them.
type Seen = Arc<Mutex<BTreeMap<u64, (u8, u8, u16)>>>;

fn observed(q: &SoftQueue) -> (HostPoster<'_>, Seen) {
    let seen: Seen = Arc::new(Mutex::new(BTreeMap::new()));
    let s = seen.clone();
    let poster = HostPoster::new(q)
        .unwrap()
        .with_observer(Arc::new(move |pc, st, bytes| {
            let c = cqe::decode_tx(bytes).expect("a well-formed TX completion");
            s.lock()
                .unwrap()
                .insert(pc, (st, c.op as u8, c.req_id as u16));
        }));
    (poster, seen)
}

fn fill(buf: &HostBuf, off: usize, len: usize, seed: u8) {
    // SAFETY: inside the heap; the queue does not touch this range while the test writes it.
    let s = unsafe { std::slice::from_raw_parts_mut(buf.ptr().add(off), len) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(31) | 1;
    }
}

fn bytes(buf: &HostBuf, off: usize, len: usize) -> Vec<u8> {
    // SAFETY: inside the heap; every operation on it is complete (quiet).
    unsafe { std::slice::from_raw_parts(buf.ptr().add(off), len) }.to_vec()
}

/// Two PEs; PE 0's queue maps PE 1's heap when `map`. Returns the PEs and the fake.
fn two_pes(ipc: CopyRoute, map: bool) -> Option<(Vec<Pe>, Arc<FakePeers>)> {
    two_pes_ring(ipc, map, None)
}

/// [`two_pes`] with a bounce ring of `bounce` bytes (default when `None`).
fn two_pes_ring(
    ipc: CopyRoute,
    map: bool,
    bounce: Option<usize>,
) -> Option<(Vec<Pe>, Arc<FakePeers>)> {
    two_pes_with(map, |cfg| {
        cfg.soft_ipc = ipc;
        if let Some(b) = bounce {
            cfg.soft_ipc_bounce = b;
        }
        // These tests assert that every launch of the copy kernel's host stand-in is applied by
        // it, none taken over: at the default stuck limit (2 ms) a loaded 2-core CI machine once
        // left one launch unstarted that long (1 of 157 in `ring_wraps`). Take-overs have their
        // own test (1 ms limit, launches held 300 ms).
        cfg.soft_kernel_stuck = std::time::Duration::from_secs(10);
    })
}

/// Two PEs with the configuration `edit` makes; PE 0's queue maps PE 1's heap when `map`.
fn two_pes_with(map: bool, edit: impl FnOnce(&mut Config)) -> Option<(Vec<Pe>, Arc<FakePeers>)> {
    let p = providers().into_iter().next()?;
    let mut cfg = config(GdaMode::Soft);
    edit(&mut cfg);
    let mut pes = setup_with(&p, 2, HEAP, 64, 32, &cfg);
    let fake = Arc::new(FakePeers {
        pe: 1,
        base: pes[1].heap.addr(),
        len: HEAP as u64,
        lookups: AtomicU64::new(0),
    });
    if map {
        let pm: Arc<dyn PeerMemory> = fake.clone();
        pes[0].gda.set_peer_memory(Some(pm)).unwrap();
    }
    Some((pes, fake))
}

#[test]
fn writes_and_reads_to_a_mapped_peer_run_as_copies() {
    // Host hops with the default ring and with a 64 KiB one (the 64 KiB write needs all of it),
    // and the copy kernel (here its host stand-in).
    for (ipc, bounce) in [
        (CopyRoute::Host, None),
        (CopyRoute::Host, Some(64 << 10)),
        (CopyRoute::Kernel, None),
        (CopyRoute::Kernel, Some(64 << 10)),
    ] {
        writes_and_reads(ipc, bounce);
    }
}

fn writes_and_reads(ipc: CopyRoute, bounce: Option<usize>) {
    let Some((pes, fake)) = two_pes_ring(ipc, true, bounce) else {
        return;
    };
    writes_and_reads_on(&pes, &fake);
    let st = pes[0].gda.soft_queue().unwrap().stats();
    if ipc == CopyRoute::Kernel {
        // At least two rounds (the writes, then the read; the small ring splits the writes),
        // each one launch that the kernel made.
        assert!(st.kernel_launches >= 2, "{st:?}");
        assert_eq!(st.kernel_applied, st.kernel_launches, "{st:?}");
        assert_eq!(st.kernel_taken_over, 0, "{st:?}");
    } else {
        assert_eq!(st.kernel_launches, 0, "{st:?}");
    }
}

fn writes_and_reads_on(pes: &[Pe], fake: &FakePeers) {
    let (pe0, pe1) = (&pes[0], &pes[1]);
    let q = pe0.gda.soft_queue().unwrap();
    let (poster, seen) = observed(q);
    let peer = pe0.peer(1);
    // Writes of several sizes into PE 1's heap at 64 KiB, and a read back.
    let sizes = [1usize, 8, 100, 4096, 65536];
    let mut off = 0;
    let mut descs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        fill(&pe0.heap, off, n, i as u8);
        descs.push(write(
            &peer,
            pe0.heap.addr() + off as u64,
            pe0.heap_lkey(),
            pe1.heap.addr() + (1 << 16) + off as u64,
            n as u32,
            None,
        ));
        off += n.max(1);
    }
    let base = poster.post(&descs).unwrap();
    assert_eq!(
        poster.quiet().unwrap(),
        0,
        "no errors: {:?}",
        seen.lock().unwrap()
    );
    let mut off = 0;
    for &n in &sizes {
        assert_eq!(
            bytes(&pe1.heap, (1 << 16) + off, n),
            bytes(&pe0.heap, off, n),
            "{n} bytes written"
        );
        off += n.max(1);
    }
    fill(&pe1.heap, 3 << 16, 4096, 99);
    let rbase = poster
        .post(&[read(
            &peer,
            pe0.heap.addr() + (5 << 16),
            pe0.heap_lkey(),
            pe1.heap.addr() + (3 << 16),
            4096,
        )])
        .unwrap();
    assert_eq!(poster.quiet().unwrap(), 0);
    assert_eq!(
        bytes(&pe0.heap, 5 << 16, 4096),
        bytes(&pe1.heap, 3 << 16, 4096)
    );
    let st = q.stats();
    assert_eq!(st.ipc_copies, sizes.len() as u64 + 1, "{st:?}");
    assert!(fake.lookups.load(Ordering::Relaxed) >= st.ipc_copies);
    // One completion per WQE, request id and op of the WQE, success.
    let s = seen.lock().unwrap();
    for pc in base..base + sizes.len() as u64 {
        assert_eq!(s[&pc], (0, OpType::RdmaWrite as u8, pc as u16), "WQE {pc}");
    }
    assert_eq!(s[&rbase], (0, OpType::RdmaRead as u8, rbase as u16));
    assert_eq!(s.len() as u64, rbase + 1);
}

#[test]
fn copy_kernel_launches_that_cannot_start_are_taken_over_and_late_kernels_touch_nothing() {
    // The stand-in's launches start 300 ms late; the stuck limit is 1 ms.
    let Some((pes, _fake)) = two_pes_with(true, |cfg| {
        cfg.soft_ipc = CopyRoute::Kernel;
        cfg.soft_kernel_stuck = std::time::Duration::from_millis(1);
        cfg.soft_kernel_host_delay = std::time::Duration::from_millis(300);
    }) else {
        return;
    };
    let (pe0, pe1) = (&pes[0], &pes[1]);
    let q = pe0.gda.soft_queue().unwrap();
    let (poster, seen) = observed(q);
    let peer = pe0.peer(1);
    fill(&pe0.heap, 0, 64 << 10, 5);
    let descs: Vec<_> = (0..40usize)
        .map(|i| {
            write(
                &peer,
                pe0.heap.addr() + (i * 1024) as u64,
                pe0.heap_lkey(),
                pe1.heap.addr() + (i * 1024) as u64,
                (1 + i * 25) as u32,
                None,
            )
        })
        .collect();
    let t = std::time::Instant::now();
    poster.post(&descs).unwrap();
    assert_eq!(poster.quiet().unwrap(), 0, "{:?}", seen.lock().unwrap());
    let waited = t.elapsed();
    assert!(
        waited < std::time::Duration::from_millis(250),
        "completed by the host, not by the late kernel: {waited:?}"
    );
    for i in 0..40usize {
        let n = 1 + i * 25;
        assert_eq!(
            bytes(&pe1.heap, i * 1024, n),
            bytes(&pe0.heap, i * 1024, n),
            "write {i}"
        );
    }
    let st = q.stats();
    assert!(
        st.kernel_launches >= 1 && st.kernel_taken_over == st.kernel_launches,
        "{st:?}"
    );
    assert_eq!(st.kernel_applied, 0, "{st:?}");
    // PE 1 writes its own bytes there; the late kernels (300 ms) must leave them alone.
    fill(&pe1.heap, 0, 40 << 10, 77);
    let mine = bytes(&pe1.heap, 0, 40 << 10);
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(bytes(&pe1.heap, 0, 40 << 10), mine, "a late kernel copied");
    // Later rounds (after the 100 ms hold) go to the kernel again, and are taken over again.
    poster.post(&descs[..4]).unwrap();
    assert_eq!(poster.quiet().unwrap(), 0);
    assert!(
        q.stats().kernel_launches > st.kernel_launches,
        "{:?}",
        q.stats()
    );
}

#[test]
fn immediates_unmapped_ranges_and_the_switch_keep_the_message_path() {
    for (ipc, map) in [
        (CopyRoute::Host, true),
        (CopyRoute::Off, true),
        (CopyRoute::Host, false),
        (CopyRoute::Kernel, true),
    ] {
        let Some((pes, fake)) = two_pes(ipc, map) else {
            return;
        };
        let (pe0, pe1) = (&pes[0], &pes[1]);
        let q = pe0.gda.soft_queue().unwrap();
        let (poster, seen) = observed(q);
        let peer = pe0.peer(1);
        fill(&pe0.heap, 0, 256, 7);
        // A write with immediate to PE 1 (its consumer delivers the immediate), and a write to
        // this PE's own heap (PE 0: not mapped by the fake).
        let descs = [
            write(
                &peer,
                pe0.heap.addr(),
                pe0.heap_lkey(),
                pe1.heap.addr() + 4096,
                256,
                Some(0xabc),
            ),
            write(
                &pe0.peer(0),
                pe0.heap.addr(),
                pe0.heap_lkey(),
                pe0.heap.addr() + 8192,
                256,
                None,
            ),
            // Mapped unless the route is off.
            write(
                &peer,
                pe0.heap.addr(),
                pe0.heap_lkey(),
                pe1.heap.addr() + 12288,
                256,
                None,
            ),
        ];
        let base = poster.post(&descs).unwrap();
        assert_eq!(poster.quiet().unwrap(), 0, "ipc {ipc:?}, mapped {map}");
        let src = bytes(&pe0.heap, 0, 256);
        assert_eq!(bytes(&pe1.heap, 4096, 256), src);
        assert_eq!(bytes(&pe0.heap, 8192, 256), src);
        assert_eq!(bytes(&pe1.heap, 12288, 256), src);
        let on = ipc.enabled() && map;
        assert_eq!(
            q.stats().ipc_copies,
            u64::from(on),
            "ipc {ipc:?}, mapped {map}"
        );
        if !on {
            assert_eq!(fake.lookups.load(Ordering::Relaxed), 0, "not asked");
        }
        let s = seen.lock().unwrap();
        assert!((base..base + 3).all(|pc| s[&pc].0 == 0), "{s:?}");
        // The immediate arrived at PE 1 as an RX completion.
        let q1 = pes[1].gda.soft_queue().unwrap();
        let rx = HostPoster::new(q1).unwrap();
        let mut got = Vec::new();
        let t = std::time::Instant::now();
        while got.is_empty() && t.elapsed() < std::time::Duration::from_secs(10) {
            rx.poll_rx(1, &mut got);
        }
        assert_eq!(got.len(), 1, "one RX completion");
        let c = got[0].as_ref().unwrap();
        assert!(c.has_imm && c.imm == 0xabc && c.length == 256, "{c:?}");
    }
}

#[test]
fn the_bounce_ring_wraps_waits_and_sends_larger_transfers_by_message() {
    // The copy kernel's rounds reserve ring ranges too (for a take-over).
    for ipc in [CopyRoute::Host, CopyRoute::Kernel] {
        ring_wraps(ipc);
    }
}

fn ring_wraps(ipc: CopyRoute) {
    // A 16 KiB ring, a 64-entry SQ: up to 64 copies of 300 B to 5 KiB stand in flight, far more
    // than the ring holds, so WQEs wait for room (and the ring wraps many times).
    let ring = 16 << 10;
    let Some((pes, _fake)) = two_pes_ring(ipc, true, Some(ring)) else {
        return;
    };
    let (pe0, pe1) = (&pes[0], &pes[1]);
    let q = pe0.gda.soft_queue().unwrap();
    let (poster, seen) = observed(q);
    let peer = pe0.peer(1);
    fill(&pe0.heap, 0, 256 << 10, 11);
    fill(&pe1.heap, 512 << 10, 256 << 10, 23);
    let total = 600usize;
    let mut expect = Vec::new();
    let mut posted = 0;
    while posted < total {
        let descs: Vec<_> = (posted..(posted + 48).min(total))
            .map(|i| {
                let len = 300 + (i * 997) % (5 << 10);
                let slot = (i % 40) * (6 << 10);
                if i % 5 == 4 {
                    // Read PE 1's [512 KiB + slot) into this heap at 256 KiB + slot.
                    expect.push((false, slot, len));
                    read(
                        &peer,
                        pe0.heap.addr() + (256 << 10) + slot as u64,
                        pe0.heap_lkey(),
                        pe1.heap.addr() + (512 << 10) + slot as u64,
                        len as u32,
                    )
                } else {
                    expect.push((true, slot, len));
                    write(
                        &peer,
                        pe0.heap.addr() + slot as u64,
                        pe0.heap_lkey(),
                        pe1.heap.addr() + slot as u64,
                        len as u32,
                        None,
                    )
                }
            })
            .collect();
        posted += descs.len();
        poster.post(&descs).unwrap();
    }
    assert_eq!(poster.quiet().unwrap(), 0, "no errors");
    // Same source bytes for every WQE of a slot: the bytes at each destination equal the source.
    for &(write, slot, len) in &expect {
        if write {
            assert_eq!(
                bytes(&pe1.heap, slot, len),
                bytes(&pe0.heap, slot, len),
                "write of {len} B at {slot}"
            );
        } else {
            assert_eq!(
                bytes(&pe0.heap, (256 << 10) + slot, len),
                bytes(&pe1.heap, (512 << 10) + slot, len),
                "read of {len} B at {slot}"
            );
        }
    }
    let st = q.stats();
    assert_eq!(st.ipc_copies, total as u64, "{st:?}");
    assert!(st.ipc_ring_waits > 0, "WQEs waited for ring room: {st:?}");
    if ipc == CopyRoute::Kernel {
        assert!(
            st.kernel_launches > 0 && st.kernel_applied == st.kernel_launches,
            "{st:?}"
        );
    }
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.len(), total);
        assert!(s.values().all(|c| c.0 == 0), "all succeeded");
    }

    // A write and a read larger than the ring (and one exactly its size) : the two larger take
    // the message path, the ring-sized one the copy route.
    fill(&pe0.heap, 0, 64 << 10, 5);
    fill(&pe1.heap, 768 << 10, 64 << 10, 6);
    let before = q.stats().ipc_copies;
    let descs = [
        write(
            &peer,
            pe0.heap.addr(),
            pe0.heap_lkey(),
            pe1.heap.addr() + (128 << 10),
            (ring + 1) as u32,
            None,
        ),
        read(
            &peer,
            pe0.heap.addr() + (128 << 10),
            pe0.heap_lkey(),
            pe1.heap.addr() + (768 << 10),
            (48 << 10) as u32,
        ),
        write(
            &peer,
            pe0.heap.addr() + (8 << 10),
            pe0.heap_lkey(),
            pe1.heap.addr() + (192 << 10),
            ring as u32,
            None,
        ),
    ];
    let base = poster.post(&descs).unwrap();
    assert_eq!(poster.quiet().unwrap(), 0);
    assert_eq!(
        bytes(&pe1.heap, 128 << 10, ring + 1),
        bytes(&pe0.heap, 0, ring + 1)
    );
    assert_eq!(
        bytes(&pe0.heap, 128 << 10, 48 << 10),
        bytes(&pe1.heap, 768 << 10, 48 << 10)
    );
    assert_eq!(
        bytes(&pe1.heap, 192 << 10, ring),
        bytes(&pe0.heap, 8 << 10, ring)
    );
    assert_eq!(
        q.stats().ipc_copies,
        before + 1,
        "only the ring-sized one copied"
    );
    let s = seen.lock().unwrap();
    assert!((base..base + 3).all(|pc| s[&pc].0 == 0), "{s:?}");
}

#[test]
fn copy_route_modes_parse() {
    let parse = |v: &str| {
        Config::from_lookup(|k| (k == "NVSHMEM_EFA_SOFT_IPC").then(|| v.to_string()))
            .map(|c| c.soft_ipc)
    };
    assert_eq!(
        Config::from_lookup(|_| None).unwrap().soft_ipc,
        CopyRoute::Kernel,
        "default"
    );
    assert_eq!(parse("0").unwrap(), CopyRoute::Off);
    assert_eq!(parse("host").unwrap(), CopyRoute::Host);
    assert_eq!(parse("1").unwrap(), CopyRoute::Kernel);
    assert_eq!(parse("kernel").unwrap(), CopyRoute::Kernel);
    let e = parse("kernels").unwrap_err();
    assert_eq!(e.var, "NVSHMEM_EFA_SOFT_IPC");
    // The removed one-hop route is refused, naming the values allowed.
    let e = parse("direct").unwrap_err();
    assert!(
        e.to_string()
            .contains("expected 0, kernel (or 1) or host; the direct route was removed"),
        "{e}"
    );
}

#[test]
fn the_null_consumer_completes_every_wqe_and_checks_request_id_and_phase() {
    let Some(p) = providers().into_iter().next() else {
        return;
    };
    let mut cfg = config(GdaMode::Soft);
    cfg.soft_null = true;
    let (logged, pes) = {
        let cap = capture();
        let at = cap.len();
        let pes = setup_with(&p, 1, HEAP, 64, 32, &cfg);
        (cap.text_from(at), pes)
    };
    assert!(logged.contains("NULL CONSUMER"), "logged loudly: {logged}");
    let pe = &pes[0];
    let q = pe.gda.soft_queue().unwrap();
    let (poster, seen) = observed(q);
    let peer = pe.peer(0);
    fill(&pe.heap, 0, 64, 3);
    // 200 WQEs through a 64-entry ring (wraps: phases flip): writes, a read, garbage lkeys; all
    // succeed and nothing moves.
    let total = 200u64;
    let mut posted = 0;
    while posted < total {
        let k = (total - posted).min(40) as usize;
        let descs: Vec<_> = (0..k)
            .map(|i| match i % 3 {
                0 => write(
                    &peer,
                    pe.heap.addr(),
                    pe.heap_lkey(),
                    pe.heap.addr() + 8192,
                    64,
                    None,
                ),
                1 => read(
                    &peer,
                    pe.heap.addr() + 4096,
                    pe.heap_lkey(),
                    pe.heap.addr(),
                    64,
                ),
                _ => write(
                    &peer,
                    pe.heap.addr(),
                    0x7777,
                    pe.heap.addr() + 8192,
                    64,
                    None,
                ),
            })
            .collect();
        poster.post(&descs).unwrap();
        assert_eq!(poster.quiet().unwrap(), 0);
        posted += k as u64;
    }
    assert_eq!(bytes(&pe.heap, 8192, 64), vec![0; 64], "no data moved");
    assert_eq!(bytes(&pe.heap, 4096, 64), vec![0; 64], "no data moved");
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.len() as u64, total);
        for (pc, &(st, op, id)) in s.iter() {
            assert_eq!((st, id), (0, *pc as u16), "WQE {pc}");
            let want = if pc % 40 % 3 == 1 {
                OpType::RdmaRead
            } else {
                OpType::RdmaWrite
            };
            assert_eq!(op, want as u8, "WQE {pc}");
        }
    }
    let st = q.stats();
    assert_eq!((st.consumed, st.completed, st.rejected), (total, total, 0));

    // A wrong request id and a wrong phase still get LOCAL_QP_INTERNAL_ERROR, in order.
    let base = poster
        .post_with(3, |pc, phase| {
            let mut d = write(
                &peer,
                pe.heap.addr(),
                pe.heap_lkey(),
                pe.heap.addr() + 8192,
                64,
                None,
            );
            d.req_id = pc & 0xffff;
            d.phase = phase;
            match pc - total {
                0 => d.req_id = (pc + 1) & 0xffff,
                1 => d.phase ^= 1,
                _ => {}
            }
            wqe::encode(&d)
        })
        .unwrap();
    assert_eq!(poster.quiet().unwrap(), 2);
    let s = seen.lock().unwrap();
    let err = CqStatus::LocalQpInternalError as u8;
    assert_eq!(s[&base].0, err);
    assert_eq!(s[&(base + 1)].0, err);
    assert_eq!(s[&(base + 2)].0, 0);
    assert_eq!(q.stats().rejected, 2);
}
