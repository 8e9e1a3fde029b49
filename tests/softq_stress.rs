//! Stress of the software EFA queue: CPU threads play the GPU (the posting protocol of
//! `gda::state`) on small rings (many wrap-arounds), several posters per queue (producers faster
//! than the consumer), mixed operations (RDMA write, write with immediate, read, inline SEND, AMO
//! messages) of 1 B to 64 KiB, malformed WQEs of every kind mixed in. Checked: exactly one completion
//! per WQE with the right request id and status, every byte at every target, every immediate
//! delivered exactly once with its length and source, AMO totals exact.
//!
//! Size: `SOFTQ_OPS` WQEs per provider for the two-PE test (default 1,000,000, debug and release
//! builds alike; the loopback test runs a fifth of that). `SOFTQ_PROVIDER` picks tcp or
//! shm; `SOFTQ_THREADS` posters per PE (default 2); `SOFTQ_DEPTH` the SQ depth (default 64).
mod softq_common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::efa::cqe::{self, CqStatus};
use nvshmem_efa_gda::efa::wqe::{
    self, LocalBuf, OpType, RemoteBuf, SendPayload, WqeDesc, WqeOp, WQE_SIZE,
};
use nvshmem_efa_gda::fabric::Provider;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::softq::Staging;
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer;
use nvshmem_efa_gda::gda::wire::{self, AmoMsg, AMO_OP_ADD, AMO_OP_SET};
use softq_common::*;

const LANES: usize = 8;
const SLOT: u64 = 64 * 1024;
const AMO_OFF: u64 = 0;
const N_CTR64: u64 = 16;
const N_CTR32: u64 = 16;
const CTR32_OFF: u64 = AMO_OFF + 8 * N_CTR64;
const SET_OFF: u64 = 1024;
const READ_SRC_OFF: u64 = 4096;

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Heap layout of one PE for `t` posters per PE and `p` PEs.
#[derive(Clone, Copy)]
struct Layout {
    threads: u64,
    pes: u64,
}

impl Layout {
    fn src(&self, thread: u64, lane: u64) -> u64 {
        READ_SRC_OFF + SLOT + (thread * LANES as u64 + lane) * SLOT
    }
    fn rd(&self, thread: u64, lane: u64) -> u64 {
        READ_SRC_OFF
            + SLOT * (1 + self.threads * LANES as u64)
            + (thread * LANES as u64 + lane) * SLOT
    }
    fn wr(&self, src_pe: u64, thread: u64, lane: u64) -> u64 {
        READ_SRC_OFF
            + SLOT * (1 + 2 * self.threads * LANES as u64)
            + ((src_pe * self.threads + thread) * LANES as u64 + lane) * SLOT
    }
    fn size(&self) -> u64 {
        READ_SRC_OFF
            + SLOT * (1 + 2 * self.threads * LANES as u64 + self.pes * self.threads * LANES as u64)
    }
}

fn read_src_seed(pe: usize) -> u64 {
    0x5EED_0000 + pe as u64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bad {
    MetaBit,
    Opcode,
    Phase,
    Reserved,
    ReqId,
    Lkey,
    LocalRange,
    RemoteRange,
    Rkey,
    Ah,
    Qkey,
    Qpn,
    ZeroLength,
    AmoRange,
    AmoOp,
}

const BADS: [Bad; 15] = [
    Bad::MetaBit,
    Bad::Opcode,
    Bad::Phase,
    Bad::Reserved,
    Bad::ReqId,
    Bad::Lkey,
    Bad::LocalRange,
    Bad::RemoteRange,
    Bad::Rkey,
    Bad::Ah,
    Bad::Qkey,
    Bad::Qpn,
    Bad::ZeroLength,
    Bad::AmoRange,
    Bad::AmoOp,
];

impl Bad {
    fn status(self) -> CqStatus {
        match self {
            Bad::MetaBit | Bad::Phase | Bad::Reserved | Bad::ReqId => {
                CqStatus::LocalQpInternalError
            }
            Bad::Opcode | Bad::AmoOp => CqStatus::LocalUnsupportedOp,
            Bad::Lkey | Bad::LocalRange => CqStatus::LocalInvalidLkey,
            Bad::RemoteRange | Bad::Rkey | Bad::AmoRange => CqStatus::RemoteBadAddress,
            Bad::Ah => CqStatus::LocalInvalidAh,
            Bad::Qkey => CqStatus::LocalUnreachableRemote,
            Bad::Qpn => CqStatus::RemoteBadDestQpn,
            Bad::ZeroLength => CqStatus::LocalBadLength,
        }
    }
}

/// What one PE's completions must look like, and what they were.
struct PeBook {
    expected: Vec<AtomicU8>,
    status: Vec<AtomicU8>,
    count: Vec<AtomicU8>,
    bad_cqe: AtomicU64,
    mismatches: Mutex<Vec<String>>,
}

impl PeBook {
    fn new(n: usize) -> PeBook {
        PeBook {
            expected: (0..n).map(|_| AtomicU8::new(0)).collect(),
            status: (0..n).map(|_| AtomicU8::new(0)).collect(),
            count: (0..n).map(|_| AtomicU8::new(0)).collect(),
            bad_cqe: AtomicU64::new(0),
            mismatches: Mutex::new(Vec::new()),
        }
    }

    fn observe(&self, pc: u64, st: u8, bytes: &[u8; 16]) {
        let i = pc as usize;
        if i >= self.count.len() {
            self.note(format!(
                "completion for producer count {pc} beyond what was posted"
            ));
            return;
        }
        match cqe::decode_tx(bytes) {
            Ok(c) if c.req_id == pc & 0xffff && c.status.raw() == st => {}
            other => {
                self.bad_cqe.fetch_add(1, Ordering::Relaxed);
                self.note(format!("completion of {pc}: {other:?}"));
            }
        }
        let want = self.expected[i].load(Ordering::Acquire);
        if st != want {
            self.note(format!("WQE {pc}: status {st}, expected {want}"));
        }
        self.count[i].fetch_add(1, Ordering::AcqRel);
        self.status[i].store(st + 1, Ordering::Release);
    }

    fn note(&self, m: String) {
        let mut v = self.mismatches.lock().unwrap();
        if v.len() < 20 {
            v.push(m);
        } else if v.len() == 20 {
            v.push("...".into());
        }
    }
}

/// Receive-side expectations, indexed by immediate value.
struct RxBook {
    target: Vec<AtomicU8>,
    src: Vec<AtomicU8>,
    len: Vec<AtomicU32>,
    kind: Vec<AtomicU8>,
    count: Vec<AtomicU8>,
    next: AtomicU32,
    expected_total: AtomicU64,
    received: AtomicU64,
    mismatches: Mutex<Vec<String>>,
}

impl RxBook {
    fn new(n: usize) -> RxBook {
        RxBook {
            target: (0..n).map(|_| AtomicU8::new(0)).collect(),
            src: (0..n).map(|_| AtomicU8::new(0)).collect(),
            len: (0..n).map(|_| AtomicU32::new(0)).collect(),
            kind: (0..n).map(|_| AtomicU8::new(0)).collect(),
            count: (0..n).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU32::new(0),
            expected_total: AtomicU64::new(0),
            received: AtomicU64::new(0),
            mismatches: Mutex::new(Vec::new()),
        }
    }

    fn expect(&self, target: usize, src: usize, len: u32, op: OpType) -> u32 {
        let imm = self.next.fetch_add(1, Ordering::AcqRel);
        let i = imm as usize;
        assert!(i < self.count.len(), "RX book too small");
        self.target[i].store(target as u8, Ordering::Relaxed);
        self.src[i].store(src as u8, Ordering::Relaxed);
        self.len[i].store(len, Ordering::Relaxed);
        self.kind[i].store(op.raw() + 1, Ordering::Release);
        imm
    }

    fn note(&self, m: String) {
        let mut v = self.mismatches.lock().unwrap();
        if v.len() < 20 {
            v.push(m);
        }
    }

    fn receive(&self, at: usize, r: &Result<cqe::RxCqe, cqe::CqeError>) {
        self.received.fetch_add(1, Ordering::AcqRel);
        let r = match r {
            Ok(r) => r,
            Err(e) => return self.note(format!("PE {at}: malformed RX completion: {e}")),
        };
        if !r.has_imm || r.status != CqStatus::Ok {
            return self.note(format!("PE {at}: RX completion {r:?}"));
        }
        let i = r.imm as usize;
        if i >= self.count.len() || self.kind[i].load(Ordering::Acquire) == 0 {
            return self.note(format!("PE {at}: unexpected immediate {}", r.imm));
        }
        let (t, s, l, k) = (
            self.target[i].load(Ordering::Relaxed) as usize,
            self.src[i].load(Ordering::Relaxed) as u16,
            self.len[i].load(Ordering::Relaxed),
            self.kind[i].load(Ordering::Relaxed) - 1,
        );
        if t != at
            || r.ah != s
            || r.src_qp != wire::soft_qpn(s as i32)
            || r.length != l
            || r.op.raw() != k
        {
            self.note(format!(
                "PE {at}: immediate {i}: {r:?}, expected target {t} source {s} length {l} op {k}"
            ));
        }
        self.count[i].fetch_add(1, Ordering::AcqRel);
    }
}

/// AMO bookkeeping per target PE.
struct AmoBook {
    sums64: Vec<Vec<AtomicU64>>,
    sums32: Vec<Vec<AtomicU32>>,
    sets: Mutex<Vec<HashSet<(u64, u64)>>>,
}

fn size_for(r: &mut Rng) -> u32 {
    let x = r.below(1000);
    let (lo, hi) = if x < 800 {
        (1, 256)
    } else if x < 950 {
        (257, 4096)
    } else if x < 995 {
        (4097, 32768)
    } else {
        (32769, 65536)
    };
    (lo + r.below(hi - lo + 1)) as u32
}

#[derive(Clone, Copy, Debug)]
enum LaneOp {
    Write { target: usize, seed: u64, len: u32 },
    Read { target: usize, off: u64, len: u32 },
}

/// One WQE of a batch: its description, how it is broken (if it is), its lane and what to verify.
type Planned = (WqeDesc, Option<Bad>, Option<usize>, Option<LaneOp>);

struct Ctx<'a> {
    pes: &'a [Pe],
    books: &'a [PeBook],
    rx: &'a RxBook,
    amo: &'a AmoBook,
    layout: Layout,
    posted_bad: &'a AtomicU64,
    verified: &'a AtomicU64,
    verify_fail: &'a Mutex<Vec<String>>,
}

#[allow(clippy::too_many_arguments)]
fn poster(c: &Ctx, pe: usize, thread: u64, quota: u64, poster: &HostPoster, seed: u64) {
    let me = &c.pes[pe];
    let n = c.pes.len();
    let heap = me.heap.addr();
    let lkey = me.heap_lkey();
    let mut rng = Rng(seed | 1);
    let mut lanes: [Option<(u64, LaneOp)>; LANES] = [None; LANES];
    let mut posted = 0u64;
    let mut seq = 0u64;
    let peers: Vec<NvshmemEfaGdaPeer> = (0..n).map(|j| me.peer(j as i32)).collect();
    let book = &c.books[pe];
    let verify = |lane: usize, op: LaneOp| {
        let ok = match op {
            LaneOp::Write { target, seed, len } => {
                let dst =
                    c.pes[target].heap.ptr() as u64 + c.layout.wr(pe as u64, thread, lane as u64);
                // SAFETY: the lane owns this slot of the target heap; the write has completed.
                unsafe { check(dst as *const u8, len as usize, seed) }
                    .map(|o| format!("write to PE {target} wrong at +{o} of {len}"))
            }
            LaneOp::Read { target, off, len } => {
                let dst = heap + c.layout.rd(thread, lane as u64);
                // SAFETY: the lane owns this local slot; the read has completed.
                unsafe {
                    check_from(
                        dst as *const u8,
                        len as usize,
                        read_src_seed(target),
                        off as usize,
                    )
                }
                .map(|o| format!("read from PE {target} wrong at +{o} of {len}"))
            }
        };
        c.verified.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = ok {
            let mut v = c.verify_fail.lock().unwrap();
            if v.len() < 20 {
                v.push(format!("PE {pe} thread {thread} lane {lane}: {m}"));
            }
        }
    };
    let mut idle = 0u32;
    while posted < quota {
        // Retire finished lanes.
        for (l, slot) in lanes.iter_mut().enumerate() {
            if let Some((pc, op)) = *slot {
                let st = book.status[pc as usize].load(Ordering::Acquire);
                if st != 0 {
                    if st == 1 {
                        verify(l, op);
                    }
                    *slot = None;
                }
            }
        }
        // Build a batch.
        let k = (1 + rng.below(8)).min(quota - posted) as usize;
        let mut batch: Vec<Planned> = Vec::with_capacity(k);
        for _ in 0..k {
            let target = rng.below(n as u64) as usize;
            let peer = &peers[target];
            let tb = c.pes[target].heap.addr();
            let x = rng.below(100);
            let free_lane = lanes
                .iter()
                .enumerate()
                .position(|(i, l)| l.is_none() && !batch.iter().any(|b| b.2 == Some(i)));
            if let (true, Some(lane)) = (x < 70, free_lane) {
                let len = size_for(&mut rng);
                if x < 25 {
                    let off = rng.below(SLOT - len as u64 + 1);
                    let d = read(
                        peer,
                        heap + c.layout.rd(thread, lane as u64),
                        lkey,
                        tb + READ_SRC_OFF + off,
                        len,
                    );
                    // SAFETY: the lane's local read slot.
                    unsafe {
                        std::ptr::write_bytes(
                            (heap + c.layout.rd(thread, lane as u64)) as *mut u8,
                            0xEE,
                            len as usize,
                        )
                    };
                    batch.push((d, None, Some(lane), Some(LaneOp::Read { target, off, len })));
                } else {
                    seq += 1;
                    let s = mix((pe as u64) << 56 | thread << 48 | seq);
                    let src = heap + c.layout.src(thread, lane as u64);
                    let dst = tb + c.layout.wr(pe as u64, thread, lane as u64);
                    // SAFETY: the lane owns its source slot and its destination slot at the target.
                    unsafe {
                        fill(src as *mut u8, len as usize, s);
                        fill_not(dst as *mut u8, len as usize, s);
                    }
                    let imm = if x >= 55 {
                        Some(c.rx.expect(target, pe, len, OpType::RdmaWrite))
                    } else {
                        None
                    };
                    let d = write(peer, src, lkey, dst, len, imm);
                    batch.push((
                        d,
                        None,
                        Some(lane),
                        Some(LaneOp::Write {
                            target,
                            seed: s,
                            len,
                        }),
                    ));
                }
            } else if x < 80 {
                let len = 1 + rng.below(31) as usize;
                let imm = c.rx.expect(target, pe, len as u32, OpType::Send);
                let payload: Vec<u8> = (0..len).map(|i| (imm as usize + i) as u8).collect();
                batch.push((send_inline(peer, &payload, Some(imm)), None, None, None));
            } else if x < 94 {
                let set = x >= 92;
                let m = if set {
                    let slot = (pe as u64 * c.layout.threads + thread) * 8;
                    seq += 1;
                    let v = mix(seq ^ 0xABCD) | 1;
                    c.amo.sets.lock().unwrap()[target].insert((slot, v));
                    AmoMsg {
                        op: AMO_OP_SET,
                        size: 8,
                        offset: SET_OFF + slot,
                        value: v,
                        flags: 0,
                    }
                } else if rng.below(2) == 0 {
                    let ctr = rng.below(N_CTR64);
                    let v = rng.below(1 << 40);
                    c.amo.sums64[target][ctr as usize].fetch_add(v, Ordering::Relaxed);
                    AmoMsg {
                        op: AMO_OP_ADD,
                        size: 8,
                        offset: AMO_OFF + 8 * ctr,
                        value: v,
                        flags: 0,
                    }
                } else {
                    let ctr = rng.below(N_CTR32);
                    let v = rng.below(1 << 32);
                    c.amo.sums32[target][ctr as usize].fetch_add(v as u32, Ordering::Relaxed);
                    AmoMsg {
                        op: AMO_OP_ADD,
                        size: 4,
                        offset: CTR32_OFF + 4 * ctr,
                        value: v,
                        flags: 0,
                    }
                };
                let imm = c.rx.expect(target, pe, 32, OpType::Send);
                batch.push((send_inline(peer, &m.encode(), Some(imm)), None, None, None));
            } else {
                let bad = BADS[rng.below(BADS.len() as u64) as usize];
                let good = write(
                    peer,
                    heap + c.layout.src(thread, 0),
                    lkey,
                    tb + c.layout.wr(pe as u64, thread, 0),
                    8,
                    None,
                );
                let d = match bad {
                    Bad::Lkey => write(peer, heap, lkey + 1000, tb, 8, None),
                    Bad::LocalRange => {
                        write(peer, heap + me.heap.len() as u64 - 4, lkey, tb, 8, None)
                    }
                    Bad::RemoteRange => write(
                        peer,
                        heap,
                        lkey,
                        tb + c.pes[target].heap.len() as u64 - 4,
                        8,
                        None,
                    ),
                    Bad::Rkey => {
                        let mut d = read(peer, heap, lkey, tb, 8);
                        if let WqeOp::RdmaRead { remote, .. } = &mut d.op {
                            remote.rkey = wire::SOFT_RKEY_HEAP + 1;
                        }
                        d
                    }
                    Bad::Ah => WqeDesc {
                        ah: n as u16 + 2,
                        ..good
                    },
                    Bad::Qkey => WqeDesc {
                        qkey: peer.qkey ^ 0x55,
                        ..good
                    },
                    Bad::Qpn => WqeDesc {
                        dest_qpn: peer.qpn.wrapping_add(7),
                        ..good
                    },
                    Bad::ZeroLength => WqeDesc {
                        op: WqeOp::RdmaWrite {
                            remote: RemoteBuf {
                                addr: tb,
                                rkey: peer.heap_rkey,
                                len: 0,
                            },
                            local: LocalBuf {
                                addr: heap,
                                lkey,
                                len: 0,
                            },
                        },
                        ..good
                    },
                    Bad::AmoRange => {
                        let m = AmoMsg {
                            op: AMO_OP_ADD,
                            size: 8,
                            offset: c.pes[target].heap.len() as u64,
                            value: 1,
                            flags: 0,
                        };
                        send_inline(peer, &m.encode(), None)
                    }
                    Bad::AmoOp => {
                        let mut b = AmoMsg {
                            op: AMO_OP_ADD,
                            size: 8,
                            offset: 0,
                            value: 1,
                            flags: 0,
                        }
                        .encode();
                        b[4] = 9;
                        desc(
                            peer,
                            WqeOp::Send {
                                payload: SendPayload::inline(&b).unwrap(),
                                imm: None,
                            },
                        )
                    }
                    _ => good,
                };
                batch.push((d, Some(bad), None, None));
            }
        }
        let mut i = 0;
        let r = poster.post_with(batch.len(), |pc, phase| {
            let (d, bad, lane, op) = &batch[i];
            i += 1;
            let mut d = *d;
            d.req_id = pc & 0xffff;
            d.phase = phase;
            let mut b = wqe::encode(&d);
            let want = bad.map_or(0, |x| x.status().raw());
            match bad {
                Some(Bad::MetaBit) => b[2] &= !wqe::CTRL1_META_DESC,
                Some(Bad::Opcode) => b[2] = (b[2] & !wqe::CTRL1_OP_TYPE_MASK) | 5,
                Some(Bad::Phase) => b[3] ^= wqe::CTRL2_PHASE,
                Some(Bad::Reserved) => b[15] = 1,
                Some(Bad::ReqId) => b[0] ^= 1,
                _ => {}
            }
            book.expected[pc as usize].store(want, Ordering::Release);
            if let (Some(l), Some(op)) = (lane, op) {
                lanes[*l] = Some((pc, *op));
            }
            let arr: [u8; WQE_SIZE] = b;
            arr
        });
        if let Err(e) = r {
            panic!("PE {pe} thread {thread}: {e}");
        }
        c.posted_bad.fetch_add(
            batch.iter().filter(|b| b.1.is_some()).count() as u64,
            Ordering::Relaxed,
        );
        posted += batch.len() as u64;
        if lanes.iter().all(|l| l.is_some()) {
            idle += 1;
            if poster.poll_cq() == 0 && idle > 16 {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
        }
    }
    poster
        .quiet()
        .unwrap_or_else(|e| panic!("PE {pe} thread {thread}: {e}"));
    for (l, slot) in lanes.iter().enumerate() {
        if let Some((pc, op)) = slot {
            let st = book.status[*pc as usize].load(Ordering::Acquire);
            assert_ne!(st, 0, "quiet returned before WQE {pc} completed");
            if st == 1 {
                verify(l, *op);
            }
        }
    }
}

fn run(p: &Provider, n_pes: usize, ops: u64) {
    run_with(p, n_pes, ops, None)
}

/// `gpu_staging`: the `NVSHMEM_EFA_GPU_STAGING` setting (`Some(true)`: every transfer staged).
fn run_with(p: &Provider, n_pes: usize, ops: u64, gpu_staging: Option<bool>) {
    let threads = env_u64("SOFTQ_THREADS", 2);
    let depth = env_u64("SOFTQ_DEPTH", 64) as u32;
    let layout = Layout {
        threads,
        pes: n_pes as u64,
    };
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = gpu_staging;
    let pes = setup_with(p, n_pes, layout.size() as usize, depth, 16, &cfg);
    let want = if gpu_staging == Some(true) {
        Staging::All
    } else {
        Staging::Device
    };
    for pe in &pes {
        assert_eq!(pe.gda.soft_queue().unwrap().staging(), want);
    }
    for (j, pe) in pes.iter().enumerate() {
        // SAFETY: the read-source region of each heap, written before any traffic.
        unsafe {
            fill(
                pe.heap.ptr().add(READ_SRC_OFF as usize),
                SLOT as usize,
                read_src_seed(j),
            )
        };
    }
    let per_pe = ops / n_pes as u64;
    let quota = per_pe / threads;
    let books: Arc<Vec<PeBook>> = Arc::new(
        (0..n_pes)
            .map(|_| PeBook::new((quota * threads) as usize + 16))
            .collect(),
    );
    let rx = RxBook::new(ops as usize + 16);
    let amo = AmoBook {
        sums64: (0..n_pes)
            .map(|_| (0..N_CTR64).map(|_| AtomicU64::new(0)).collect())
            .collect(),
        sums32: (0..n_pes)
            .map(|_| (0..N_CTR32).map(|_| AtomicU32::new(0)).collect())
            .collect(),
        sets: Mutex::new(vec![HashSet::new(); n_pes]),
    };
    let posted_bad = AtomicU64::new(0);
    let verified = AtomicU64::new(0);
    let verify_fail = Mutex::new(Vec::new());
    let stop_rx = AtomicBool::new(false);
    let ctx = Ctx {
        pes: &pes,
        books: &books,
        rx: &rx,
        amo: &amo,
        layout,
        posted_bad: &posted_bad,
        verified: &verified,
        verify_fail: &verify_fail,
    };
    let deadline = Duration::from_secs(env_u64("SOFTQ_DEADLINE_S", 900));
    let t0 = Instant::now();
    let posters: Vec<HostPoster> = pes
        .iter()
        .enumerate()
        .map(|(j, pe)| {
            let b = books.clone();
            HostPoster::new(pe.gda.soft_queue().unwrap())
                .unwrap()
                .with_timeout(Duration::from_secs(120))
                .with_observer(Arc::new(move |pc, st, bytes| b[j].observe(pc, st, bytes)))
        })
        .collect();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (pe, po) in posters.iter().enumerate() {
            for t in 0..threads {
                let ctx = &ctx;
                hs.push(
                    s.spawn(move || poster(ctx, pe, t, quota, po, mix(pe as u64 * 131 + t + 7))),
                );
            }
        }
        let rxs: Vec<_> = (0..n_pes)
            .map(|pe| {
                let (po, rx, stop) = (&posters[pe], &rx, &stop_rx);
                s.spawn(move || {
                    let mut v = Vec::new();
                    while !stop.load(Ordering::Acquire) {
                        v.clear();
                        if po.poll_rx(256, &mut v) == 0 {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        for r in &v {
                            rx.receive(pe, r);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        // Every RX-producing WQE completed OK must show up at its target.
        let want = rx.next.load(Ordering::Acquire) as u64;
        rx.expected_total.store(want, Ordering::Release);
        // Stop waiting once nothing has arrived for a while (a lost completion fails below).
        let (mut last, mut since) = (0, Instant::now());
        while rx.received.load(Ordering::Acquire) < want
            && since.elapsed() < Duration::from_secs(10)
            && t0.elapsed() < deadline
        {
            let now = rx.received.load(Ordering::Acquire);
            if now != last {
                (last, since) = (now, Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        stop_rx.store(true, Ordering::Release);
        for h in rxs {
            h.join().unwrap();
        }
    });
    let elapsed = t0.elapsed();
    let total = quota * threads * n_pes as u64;
    eprintln!(
        "{p}{}, {n_pes} PE(s), depth {depth}, {threads} posters/PE: {total} WQEs ({} malformed, {} data transfers verified, {} RX) in {:.2} s = {:.0} WQE/s",
        if gpu_staging == Some(true) { " (staged)" } else { "" },
        posted_bad.load(Ordering::Relaxed),
        verified.load(Ordering::Relaxed),
        rx.received.load(Ordering::Relaxed),
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    // Exactly one completion per WQE, with the expected status.
    for (j, b) in books.iter().enumerate() {
        let m = b.mismatches.lock().unwrap();
        assert!(m.is_empty(), "PE {j}: {m:#?}");
        assert_eq!(b.bad_cqe.load(Ordering::Relaxed), 0);
        let n = quota * threads;
        for pc in 0..n as usize {
            assert_eq!(
                b.count[pc].load(Ordering::Relaxed),
                1,
                "PE {j}: completions of WQE {pc}"
            );
        }
        for pc in n as usize..b.count.len() {
            assert_eq!(b.count[pc].load(Ordering::Relaxed), 0);
        }
        assert_eq!(posters[j].duplicates(), 0);
        let st = pes[j].gda.soft_queue().unwrap().stats();
        assert_eq!(st.consumed, n, "PE {j} consumed");
        assert_eq!(st.completed, n, "PE {j} completed");
    }
    let bad: u64 = posters.iter().map(|p| p.errors()).sum();
    assert_eq!(
        bad,
        posted_bad.load(Ordering::Relaxed),
        "error completions = malformed WQEs"
    );
    let rejected: u64 = pes
        .iter()
        .map(|p| p.gda.soft_queue().unwrap().stats().rejected)
        .sum();
    assert_eq!(rejected, posted_bad.load(Ordering::Relaxed));
    // Every byte.
    let vf = verify_fail.lock().unwrap();
    assert!(vf.is_empty(), "{vf:#?}");
    // Immediates exactly once, with length and source.
    let m = rx.mismatches.lock().unwrap();
    assert!(m.is_empty(), "{m:#?}");
    let want = rx.next.load(Ordering::Relaxed) as usize;
    for i in 0..want {
        assert_eq!(
            rx.count[i].load(Ordering::Relaxed),
            1,
            "immediate {i} delivered"
        );
    }
    assert_eq!(rx.received.load(Ordering::Relaxed), want as u64);
    // AMO totals.
    let applied: u64 = pes
        .iter()
        .map(|p| p.gda.soft_queue().unwrap().stats().amos_applied)
        .sum();
    for (t, pe) in pes.iter().enumerate() {
        let h = pe.heap.addr();
        for c in 0..N_CTR64 {
            // SAFETY: counter inside the heap; all traffic has finished.
            let v = unsafe { std::ptr::read_volatile((h + AMO_OFF + 8 * c) as *const u64) };
            assert_eq!(
                v,
                amo.sums64[t][c as usize].load(Ordering::Relaxed),
                "PE {t} 64-bit counter {c}"
            );
        }
        for c in 0..N_CTR32 {
            // SAFETY: as above.
            let v = unsafe { std::ptr::read_volatile((h + CTR32_OFF + 4 * c) as *const u32) };
            assert_eq!(
                v,
                amo.sums32[t][c as usize].load(Ordering::Relaxed),
                "PE {t} 32-bit counter {c}"
            );
        }
        let sets = amo.sets.lock().unwrap();
        for slot in sets[t].iter().map(|x| x.0).collect::<HashSet<_>>() {
            // SAFETY: as above.
            let v = unsafe { std::ptr::read_volatile((h + SET_OFF + slot) as *const u64) };
            assert!(
                sets[t].contains(&(slot, v)),
                "PE {t} SET slot {slot}: {v:#x} was never set"
            );
        }
    }
    assert!(applied > 0 || total < 100);
    assert!(elapsed < deadline, "run took {elapsed:?}");
}

fn default_ops(two_pe: bool) -> u64 {
    let n = env_u64("SOFTQ_OPS", 1_000_000);
    if two_pe {
        n
    } else {
        n / 5
    }
}

#[test]
fn stress_two_pes() {
    for p in providers() {
        run(&p, 2, default_ops(true));
    }
}

#[test]
fn stress_loopback_one_pe() {
    let p = providers().remove(0);
    run(&p, 1, default_ops(false));
}

/// Every RDMA transfer staged (`NVSHMEM_EFA_GPU_STAGING=1`): the path GPU memory takes on software
/// providers, exercised with host memory. `SOFTQ_STAGED_OPS` WQEs per provider (default 100,000).
#[test]
fn stress_two_pes_staged() {
    let n = env_u64("SOFTQ_STAGED_OPS", 100_000);
    for p in providers() {
        run_with(&p, 2, n, Some(true));
    }
}

#[test]
fn stress_loopback_one_pe_staged() {
    let n = env_u64("SOFTQ_STAGED_OPS", 100_000) / 5;
    let p = providers().remove(0);
    run_with(&p, 1, n, Some(true));
}
