//! Shared setup of the software-queue tests: PEs as threads of one process, each with its own fabric,
//! domain, GDA endpoint and symmetric heap, on a software provider (tcp;ofi_rxm or shm).
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::{Config, GdaMode};
use nvshmem_efa_gda::efa::wqe::{LocalBuf, RemoteBuf, SendPayload, WqeDesc, WqeOp};
use nvshmem_efa_gda::fabric::{Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::CtrlPlacement;
use nvshmem_efa_gda::gda::queues::queue_index;
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer;
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_OP_ADD};
use nvshmem_efa_gda::gda::{Gda, GdaOptions};

/// Waits until `f` holds, for at most 30 s; fails the test naming `what` past that.
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    wait_until_within(what, Duration::from_secs(30), f);
}

/// [`wait_until`] with its own bound.
pub fn wait_until_within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Page-aligned zeroed host memory.
pub struct HostBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain memory owned by the value; the tests coordinate access.
unsafe impl Send for HostBuf {}
// SAFETY: as above.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    pub fn new(len: usize) -> HostBuf {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        HostBuf { ptr, layout }
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// One PE: its GDA context and heap. The GDA context drops before the heap it registered.
pub struct Pe {
    pub gda: Gda,
    pub heap: HostBuf,
    pub pe: i32,
}

impl Pe {
    pub fn peer(&self, pe: i32) -> NvshmemEfaGdaPeer {
        self.gda.peers()[pe as usize]
    }
    pub fn heap_lkey(&self) -> u32 {
        self.gda.device_state().unwrap().heap_lkey
    }
}

/// The provider named by `SOFTQ_PROVIDER` (tcp or shm), else every software provider that opens here.
pub fn providers() -> Vec<Provider> {
    let want = std::env::var("SOFTQ_PROVIDER").ok();
    let all = [Provider::Tcp, Provider::Shm];
    let mut out = Vec::new();
    for p in all {
        if let Some(w) = &want {
            if Provider::parse(w).ok().as_ref() != Some(&p) {
                continue;
            }
        }
        if domain(&p).is_some() {
            out.push(p);
        } else {
            eprintln!("provider {p} does not open here: skipped");
        }
    }
    assert!(
        !out.is_empty(),
        "no software provider (tcp;ofi_rxm or shm) opens on this machine"
    );
    out
}

pub fn domain(p: &Provider) -> Option<Arc<Domain>> {
    // tcp stays on the loopback interface unless the caller chose another.
    if std::env::var_os("FI_TCP_IFACE").is_none() {
        std::env::set_var("FI_TCP_IFACE", "lo");
    }
    let info = Info::get(&InfoRequest {
        provider: p.clone(),
        hmem: false,
        atomics: false,
        msg: true,
    })
    .ok()?;
    let fabric = Fabric::open(info).ok()?;
    Domain::open(&fabric).ok()
}

pub fn config(mode: GdaMode) -> Config {
    let mut c = Config::from_lookup(|_| None).unwrap();
    c.gda = mode;
    c
}

/// `n` connected PEs with heaps of `heap` bytes, control blocks in host memory.
pub fn setup(p: &Provider, n: usize, heap: usize, sq_depth: u32, max_batch: u32) -> Vec<Pe> {
    setup_with(p, n, heap, sq_depth, max_batch, &config(GdaMode::Soft))
}

/// [`setup`] with a configuration of the caller's.
pub fn setup_with(
    p: &Provider,
    n: usize,
    heap: usize,
    sq_depth: u32,
    max_batch: u32,
    cfg: &Config,
) -> Vec<Pe> {
    setup_queues(p, n, heap, sq_depth, max_batch, cfg, None)
}

/// [`setup_with`] with the queue table built for `queues_per_pe` queues per PE (`None`: the
/// environment's `NVSHMEM_IBGDA_NUM_RC_PER_PE`, 1 when unset).
pub fn setup_queues(
    p: &Provider,
    n: usize,
    heap: usize,
    sq_depth: u32,
    max_batch: u32,
    cfg: &Config,
    queues_per_pe: Option<u32>,
) -> Vec<Pe> {
    let cfg = cfg.clone();
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Host,
        sq_depth: Some(sq_depth),
        max_batch: Some(max_batch),
    };
    let mut pes: Vec<Pe> = (0..n)
        .map(|i| {
            let d = domain(p).expect("domain");
            let mut gda = Gda::new(&d, &cfg, &opts).expect("GDA context");
            assert_eq!(gda.mode(), nvshmem_efa_gda::gda::MODE_SOFT);
            if let Some(q) = queues_per_pe {
                gda.set_queues_per_pe(q).expect("queues per PE");
            }
            Pe {
                gda,
                heap: HostBuf::new(heap),
                pe: i as i32,
            }
        })
        .collect();
    let names: Vec<Vec<u8>> = pes.iter().map(|p| p.gda.address().unwrap()).collect();
    let len = names.iter().map(|n| n.len()).max().unwrap();
    let mut all = Vec::new();
    for nm in &names {
        let mut x = nm.clone();
        x.resize(len, 0);
        all.extend_from_slice(&x);
    }
    for pe in pes.iter_mut() {
        let (b, l) = (pe.heap.addr(), pe.heap.len() as u64);
        pe.gda.set_local_heap(b, l, None).unwrap();
        pe.gda.connect(pe.pe, n as i32, &all, None).unwrap();
    }
    let heaps: Vec<(u64, u64, u64)> = pes
        .iter()
        .map(|p| {
            (
                p.heap.addr(),
                p.heap.len() as u64,
                p.gda.local_heap_key().unwrap(),
            )
        })
        .collect();
    for pe in pes.iter_mut() {
        for (j, h) in heaps.iter().enumerate() {
            pe.gda.set_remote_heap(j as i32, h.0, h.1, h.2).unwrap();
        }
        assert_eq!(pe.gda.device_state().unwrap().ready, 1);
    }
    pes
}

/// A WQE description addressed to `peer` (request id and phase are set by the poster).
pub fn desc(peer: &NvshmemEfaGdaPeer, op: WqeOp) -> WqeDesc {
    WqeDesc {
        op,
        req_id: 0,
        req_id_64: false,
        phase: 0,
        comp_req: true,
        dest_qpn: peer.qpn,
        ah: peer.ahn,
        qkey: peer.qkey,
        high_pps: false,
    }
}

/// `n` RDMA writes of `len` bytes each, from `from`'s heap at offset `at + i * len` to the same
/// offset of `to`'s heap.
pub fn heap_writes(
    peer: &NvshmemEfaGdaPeer,
    from: &Pe,
    to: &Pe,
    at: usize,
    n: usize,
    len: usize,
) -> Vec<WqeDesc> {
    (0..n)
        .map(|i| {
            write(
                peer,
                from.heap.addr() + (at + i * len) as u64,
                from.heap_lkey(),
                to.heap.addr() + (at + i * len) as u64,
                len as u32,
                None,
            )
        })
        .collect()
}

pub fn write(
    peer: &NvshmemEfaGdaPeer,
    local: u64,
    lkey: u32,
    remote: u64,
    len: u32,
    imm: Option<u32>,
) -> WqeDesc {
    let l = LocalBuf {
        addr: local,
        lkey,
        len,
    };
    let r = RemoteBuf {
        addr: remote,
        rkey: peer.heap_rkey,
        len,
    };
    desc(
        peer,
        match imm {
            Some(imm) => WqeOp::RdmaWriteImm {
                remote: r,
                local: l,
                imm,
            },
            None => WqeOp::RdmaWrite {
                remote: r,
                local: l,
            },
        },
    )
}

pub fn read(peer: &NvshmemEfaGdaPeer, local: u64, lkey: u32, remote: u64, len: u32) -> WqeDesc {
    desc(
        peer,
        WqeOp::RdmaRead {
            remote: RemoteBuf {
                addr: remote,
                rkey: peer.heap_rkey,
                len,
            },
            local: LocalBuf {
                addr: local,
                lkey,
                len,
            },
        },
    )
}

pub fn send_inline(peer: &NvshmemEfaGdaPeer, bytes: &[u8], imm: Option<u32>) -> WqeDesc {
    desc(
        peer,
        WqeOp::Send {
            payload: SendPayload::inline(bytes).unwrap(),
            imm,
        },
    )
}

/// splitmix64.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `len` bytes at `p` with the pattern of `seed` (every byte depends on seed and position).
///
/// # Safety
/// `p` valid for `len` bytes.
pub unsafe fn fill(p: *mut u8, len: usize, seed: u64) {
    let mut i = 0;
    while i < len {
        let w = mix(seed ^ (i as u64 / 8)).to_le_bytes();
        let n = (len - i).min(8);
        std::ptr::copy_nonoverlapping(w.as_ptr(), p.add(i), n);
        i += n;
    }
}

/// Whether `len` bytes at `p` hold the pattern of `seed`; returns the first bad offset.
///
/// # Safety
/// `p` valid for `len` bytes.
pub unsafe fn check(p: *const u8, len: usize, seed: u64) -> Option<usize> {
    let mut i = 0;
    while i < len {
        let w = mix(seed ^ (i as u64 / 8)).to_le_bytes();
        let n = (len - i).min(8);
        for (k, want) in w.iter().enumerate().take(n) {
            if std::ptr::read_volatile(p.add(i + k)) != *want {
                return Some(i + k);
            }
        }
        i += n;
    }
    None
}

/// Fills with the complement of the pattern (so a write that never lands is detected).
///
/// # Safety
/// `p` valid for `len` bytes.
pub unsafe fn fill_not(p: *mut u8, len: usize, seed: u64) {
    fill(p, len, seed);
    for k in 0..len {
        *p.add(k) = !*p.add(k);
    }
}

/// A small xorshift generator.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Whether `len` bytes at `p` hold the pattern of `seed` from absolute position `start` on.
///
/// # Safety
/// `p` valid for `len` bytes.
pub unsafe fn check_from(p: *const u8, len: usize, seed: u64, start: usize) -> Option<usize> {
    for k in 0..len {
        let j = start + k;
        let w = mix(seed ^ (j as u64 / 8)).to_le_bytes();
        if std::ptr::read_volatile(p.add(k)) != w[j % 8] {
            return Some(k);
        }
    }
    None
}

/// Everything the library logs at info level and above, kept as text (the global subscriber of a
/// test binary, see [`capture`]).
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn text(&self) -> String {
        self.text_from(0)
    }
    pub fn text_from(&self, at: usize) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()[at..]).into_owned()
    }
}

/// The process-wide log capture, installed as the global subscriber on first use (a test that reads
/// logs calls it before anything logs, so no test's events depend on another's subscriber).
pub fn capture() -> &'static Capture {
    capture_at(tracing::Level::INFO)
}

/// [`capture`] at `level` and above (the first call of a test binary sets the level).
pub fn capture_at(level: tracing::Level) -> &'static Capture {
    static LOG: OnceLock<Capture> = OnceLock::new();
    LOG.get_or_init(|| {
        let c = Capture::default();
        let c2 = c.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || c2.clone())
            .finish();
        tracing::subscriber::set_global_default(sub).expect("first subscriber of this test binary");
        c
    })
}

/// Writes a well-formed 64-byte write WQE (64 bytes from the start of `pe`'s heap to one of 16 slots
/// at heap + 4096) for producer count `pc` into its SQ slot, without ringing the doorbell: what a
/// GPU poster does before it commits.
pub fn place_write_wqe(
    v: &nvshmem_efa_gda::gda::softq::HostView,
    pe: &Pe,
    peer: &NvshmemEfaGdaPeer,
    pc: u64,
) {
    let n = u64::from(v.sq_entries);
    let mut d = write(
        peer,
        pe.heap.addr(),
        pe.heap_lkey(),
        pe.heap.addr() + 4096 + 64 * (pc % 16),
        64,
        None,
    );
    d.req_id = pc & 0xffff;
    d.phase = nvshmem_efa_gda::efa::wqe::phase_for(pc, v.sq_entries);
    let b = nvshmem_efa_gda::efa::wqe::encode(&d);
    // SAFETY: a slot inside the SQ ring of a live queue (64-byte entries); the consumer has not been
    // told about it yet.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.sq.add((pc % n) as usize * 64), 64) };
}

/// Data on one queue, then a count, `ROUNDS` times, from PE 0 to PE 1 (`queues_per_pe` queues per
/// PE): the writes on queue `data_qp`, the count on queue `count_qp` of the same PE, in the heaps' region `region` (512 KiB each: the counter, then
/// the data; a fresh region per call). Returns the bytes found stale when their count was visible.
pub fn data_then_count(
    pes: &[Pe],
    queues_per_pe: u32,
    region: usize,
    data_qp: u32,
    count_qp: u32,
    flags: u32,
) -> u64 {
    const ROUNDS: u8 = 6;
    const WRITES: usize = 4;
    const LEN: usize = 64 << 10;
    let base = region * (512 << 10);
    let data_at = base + 4096;
    let q0 = pes[0].gda.soft_queue().unwrap();
    let data = HostPoster::on_ring(q0, queue_index(1, data_qp, queues_per_pe)).unwrap();
    let count = HostPoster::on_ring(q0, queue_index(1, count_qp, queues_per_pe)).unwrap();
    let peer = pes[0].peer(1);
    let src = pes[0].heap.ptr();
    let dst = pes[1].heap.ptr() as usize + base;
    let total = WRITES * LEN;
    let checker = std::thread::spawn(move || {
        let dst = dst as *mut u8;
        // SAFETY: the counter is the first 8-byte word of the region of PE 1's live heap (page
        // aligned); the software queue's consumer applies the adds to it with atomics.
        let c = unsafe { std::sync::atomic::AtomicU64::from_ptr(dst as *mut u64) };
        let mut stale = 0u64;
        for round in 1..=u64::from(ROUNDS) {
            let t = Instant::now();
            while c.load(std::sync::atomic::Ordering::Acquire) < round {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "round {round}'s count"
                );
                std::thread::sleep(Duration::from_micros(100));
            }
            // SAFETY: inside PE 1's heap; writers only ever raise the bytes.
            let d = unsafe { std::slice::from_raw_parts(dst.add(4096), total) };
            stale += d.iter().filter(|&&b| u64::from(b) < round).count() as u64;
        }
        stale
    });
    for round in 1..=ROUNDS {
        // SAFETY: inside PE 0's heap; the previous round's writes completed (quiet below).
        unsafe { std::ptr::write_bytes(src.add(data_at), round, total) };
        let ds = heap_writes(&peer, &pes[0], &pes[1], data_at, WRITES, LEN);
        let amo = AmoMsg {
            op: AMO_OP_ADD,
            size: 8,
            offset: base as u64,
            value: 1,
            flags,
        };
        data.post(&ds).unwrap();
        count
            .post(&[send_inline(&peer, &amo.encode(), None)])
            .unwrap();
        data.quiet().unwrap();
        count.quiet().unwrap();
        assert_eq!(data.errors() + count.errors(), 0, "round {round}");
    }
    checker.join().unwrap()
}
