//! Drives the software-queue consumer itself with arbitrary rings: the consumer thread of a real
//! software EFA queue (one PE connected to itself over a loopback provider, `SOFTQ_FUZZ_PROVIDER`,
//! tcp by default) executes whatever the input posts.
//!
//! The input is a sequence of records, each led by a selector byte:
//! * structured WQE: every field (op, local address and lkey, remote address and rkey, lengths,
//!   address handle, QP number, qkey, immediate, SEND payload) is either valid or one of several
//!   kinds of invalid, chosen by the input; the expected outcome follows from the choices;
//! * raw WQE: 64 bytes from the input, with or without the request id and phase the protocol
//!   expects for its slot;
//! * doorbell noise: a doorbell value that announces more WQEs than the ring holds, or goes back,
//!   written before the next proper doorbell.
//!
//! The ring is small (16 entries) and lives across inputs, so slots, phases and the 16-bit request
//! id wrap all the time. Checks, for every WQE: exactly one completion; status 0 for a valid one, an
//! error status for every entry the consumer must refuse (bad fields, out-of-range buffers, bytes
//! that do not decode, a wrong request id or phase); the queue never gets stuck (a bounded quiet).
//! Memory: the heap sits between inaccessible guard pages, and a canary region that the WQEs name as
//! out-of-range buffers must never change (no access outside registered memory).
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nvshmem_efa_gda::config::{Config, GdaMode};
use nvshmem_efa_gda::efa::wqe::{
    self, LocalBuf, RemoteBuf, SendPayload, WqeDesc, WqeOp, INLINE_MAX, WQE_SIZE,
};
use nvshmem_efa_gda::fabric::{Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::CtrlPlacement;
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer;
use nvshmem_efa_gda::gda::{Gda, GdaOptions};

const SQ_DEPTH: u32 = 16;
const HEAP: usize = 1 << 20;
const CANARY: usize = 64 << 10;
const CANARY_BYTE: u8 = 0xc5;
/// Longest transfer a valid structured WQE asks for.
const MAX_LEN: u32 = 64 << 10;
/// WQEs per input at most (keeps one execution short).
const MAX_WQES: usize = 48;

/// What the consumer must answer for one WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Ok,
    Error,
    /// Either (a case the queue may legitimately take or refuse, e.g. a zero-length transfer).
    Any,
}

/// A mapping with an inaccessible page on each side.
struct Guarded {
    base: *mut u8,
    len: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        let page = 4096;
        // SAFETY: a fresh anonymous mapping; the middle is made accessible, the sides stay PROT_NONE.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len + 2 * page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "mmap");
            let base = (p as *mut u8).add(page);
            assert_eq!(
                libc::mprotect(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE
                ),
                0
            );
            Guarded { base, len }
        }
    }
    fn addr(&self) -> u64 {
        self.base as u64
    }
}

struct World {
    gda: &'static Gda,
    poster: HostPoster<'static>,
    heap: Guarded,
    canary: Guarded,
    peer: NvshmemEfaGdaPeer,
    lkey: u32,
    log: Arc<Mutex<Vec<(u64, u8)>>>,
}

// SAFETY: the fuzzer calls the target from one thread; the raw pointers name mappings that live
// for the whole process.
unsafe impl Send for World {}
// SAFETY: as above.
unsafe impl Sync for World {}

fn provider() -> Provider {
    let name = std::env::var("SOFTQ_FUZZ_PROVIDER").unwrap_or_else(|_| "tcp".into());
    Provider::parse(&name).expect("SOFTQ_FUZZ_PROVIDER: tcp or shm")
}

fn world() -> &'static Mutex<World> {
    static W: OnceLock<Mutex<World>> = OnceLock::new();
    W.get_or_init(|| {
        // The library's log (NVSHMEM_EFA_LOG), as the C entry points would set it up.
        nvshmem_efa_gda::log::init();
        if std::env::var_os("FI_TCP_IFACE").is_none() {
            std::env::set_var("FI_TCP_IFACE", "lo");
        }
        let info = Info::get(&InfoRequest {
            provider: provider(),
            hmem: false,
            atomics: false,
            msg: true,
        })
        .expect("provider");
        let fabric = Fabric::open(info).expect("fabric");
        let domain = Domain::open(&fabric).expect("domain");
        let mut cfg = Config::from_lookup(|_| None).expect("config");
        cfg.gda = GdaMode::Soft;
        let opts = GdaOptions {
            ctrl: CtrlPlacement::Host,
            sq_depth: Some(SQ_DEPTH),
            max_batch: Some(4),
        };
        let mut gda = Gda::new(&domain, &cfg, &opts).expect("software queue");
        let heap = Guarded::new(HEAP);
        let canary = Guarded::new(CANARY);
        // SAFETY: fresh mapping of CANARY bytes.
        unsafe { std::ptr::write_bytes(canary.base, CANARY_BYTE, canary.len) };
        gda.set_local_heap(heap.addr(), HEAP as u64, None)
            .expect("local heap");
        let name = gda.address().expect("address");
        gda.connect(0, 1, &name, None).expect("connect to itself");
        let key = gda.local_heap_key().expect("heap key");
        gda.set_remote_heap(0, heap.addr(), HEAP as u64, key)
            .expect("remote heap");
        let peer = gda.peers()[0];
        let lkey = gda.device_state().expect("device state").heap_lkey;
        let gda: &'static Gda = Box::leak(Box::new(gda));
        let log: Arc<Mutex<Vec<(u64, u8)>>> = Arc::default();
        let l2 = log.clone();
        let poster = HostPoster::new(gda.soft_queue().expect("software queue"))
            .expect("host poster")
            .with_timeout(Duration::from_secs(20))
            .with_observer(Arc::new(move |pc, status, _| {
                l2.lock().unwrap().push((pc, status))
            }));
        Mutex::new(World {
            gda,
            poster,
            heap,
            canary,
            peer,
            lkey,
            log,
        })
    })
}

/// Reads the input front to back; zero once it runs out.
struct Bytes<'a>(&'a [u8]);
impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One WQE to post: either a description (request id and phase filled in at posting) or raw bytes.
enum Entry {
    Desc(WqeDesc, Expect, String),
    Raw { bytes: [u8; WQE_SIZE], fix: bool },
}

/// A buffer: valid (inside the heap) or one of the ways to be wrong. Returns (address, lkey/rkey
/// adjustment is separate, valid?).
fn buffer(b: &mut Bytes, base: u64, size: u64, canary: u64, len: u32) -> (u64, bool) {
    let len = u64::from(len);
    match b.u8() % 8 {
        // inside
        0..=3 => {
            let room = size.saturating_sub(len) + 1;
            (base + u64::from(b.u32()) % room, len <= size)
        }
        // straddles the end
        4 => (base + size - len / 2, len == 0),
        // before the start
        5 => (base.wrapping_sub(1 + u64::from(b.u16())), false),
        // in the canary (unregistered memory)
        6 => (canary + u64::from(b.u16()) % (CANARY as u64), false),
        // wraps the address space
        _ => (u64::MAX - u64::from(b.u8()), len == 0),
    }
}

fn structured(b: &mut Bytes, w: &World) -> Entry {
    let heap = w.heap.addr();
    let canary = w.canary.addr();
    let sel = b.u8();
    let mut ok = true;
    let mut why: Vec<&str> = Vec::new();
    let len = match b.u8() % 8 {
        0 => 0,
        1..=5 => 1 + b.u32() % MAX_LEN,
        6 => 1 + u32::from(b.u8()),
        _ => HEAP as u32 + 1 + b.u32() % 4096,
    };
    let mut any = len == 0;
    if len as usize > HEAP {
        ok = false;
        why.push("length beyond the heap");
    }
    let (laddr, lok) = buffer(b, heap, HEAP as u64, canary, len);
    let (raddr, rok) = buffer(b, heap, HEAP as u64, canary, len);
    let lkey = match b.u8() % 8 {
        0 => 0,
        1 => w.lkey + 1 + u32::from(b.u8()),
        2 => b.u32() & wqe::LKEY_MASK,
        _ => w.lkey,
    };
    let rkey = match b.u8() % 8 {
        0 => w.peer.heap_rkey ^ (1 + u32::from(b.u8())),
        _ => w.peer.heap_rkey,
    };
    let mut rlen = len;
    let mut rlen_bad = false;
    if b.u8() % 16 == 0 {
        rlen = len.wrapping_add(1 + u32::from(b.u8()));
        rlen_bad = true;
    }
    let op = match sel % 6 {
        0 | 1 => WqeOp::RdmaWrite {
            remote: RemoteBuf {
                addr: raddr,
                rkey,
                len: rlen,
            },
            local: LocalBuf {
                addr: laddr,
                lkey,
                len,
            },
        },
        2 => WqeOp::RdmaWriteImm {
            remote: RemoteBuf {
                addr: raddr,
                rkey,
                len: rlen,
            },
            local: LocalBuf {
                addr: laddr,
                lkey,
                len,
            },
            imm: b.u32(),
        },
        3 => WqeOp::RdmaRead {
            remote: RemoteBuf {
                addr: raddr,
                rkey,
                len: rlen,
            },
            local: LocalBuf {
                addr: laddr,
                lkey,
                len,
            },
        },
        4 => {
            let n = (b.u8() as usize) % (INLINE_MAX + 1);
            let bytes: Vec<u8> = (0..n).map(|_| b.u8()).collect();
            // An inline SEND touches no buffer, so only the addressing below can make it wrong; the
            // receiver may still refuse a payload that announces an AMO it cannot apply.
            ok = true;
            why.clear();
            any = true;
            WqeOp::Send {
                payload: SendPayload::inline(&bytes).expect("fits"),
                imm: (b.u8() & 1 == 1).then(|| b.u32()),
            }
        }
        _ => {
            let slen = len.min(8192);
            if slen as usize > nvshmem_efa_gda::gda::wire::SOFT_SEND_MAX {
                ok = false;
                why.push("SEND above 4 KiB");
            }
            any = true;
            WqeOp::Send {
                payload: SendPayload::Sgl {
                    first: LocalBuf {
                        addr: laddr,
                        lkey,
                        len: slen,
                    },
                    second: None,
                },
                imm: None,
            }
        }
    };
    let uses_buffers = !matches!(
        op,
        WqeOp::Send {
            payload: SendPayload::Inline { .. },
            ..
        }
    );
    let uses_remote = matches!(
        op,
        WqeOp::RdmaWrite { .. } | WqeOp::RdmaWriteImm { .. } | WqeOp::RdmaRead { .. }
    );
    if uses_buffers && (!lok || lkey != w.lkey) {
        ok = false;
        why.push("local buffer or lkey");
    }
    if uses_remote && (!rok || rkey != w.peer.heap_rkey || rlen_bad) {
        ok = false;
        why.push("remote buffer, rkey or length mismatch");
    }
    let mut d = WqeDesc {
        op,
        req_id: 0,
        req_id_64: false,
        phase: 0,
        comp_req: true,
        dest_qpn: w.peer.qpn,
        ah: w.peer.ahn,
        qkey: w.peer.qkey,
        high_pps: false,
    };
    match b.u8() % 16 {
        0 => {
            d.ah = d.ah.wrapping_add(1 + u16::from(b.u8()));
            ok = false;
            why.push("address handle");
        }
        1 => {
            d.dest_qpn = d.dest_qpn.wrapping_add(1 + u16::from(b.u8()));
            ok = false;
            why.push("QP number");
        }
        2 => {
            d.qkey = d.qkey.wrapping_add(1 + u32::from(b.u8()));
            ok = false;
            why.push("qkey");
        }
        _ => {}
    }
    if wqe::validate(&d).is_err() {
        // Not expressible as a well-formed WQE: send the raw encoding, the consumer must refuse it.
        return Entry::Raw {
            bytes: wqe::encode(&d),
            fix: true,
        };
    }
    // An empty transfer touches no memory: whether the queue checks its buffers is its choice.
    // Wrong addressing (address handle, QP number, qkey) is refused whatever the length.
    let addressing_bad = why
        .iter()
        .any(|w| matches!(*w, "address handle" | "QP number" | "qkey"));
    if len == 0 && !addressing_bad {
        ok = true;
    }
    let expect = if !ok {
        Expect::Error
    } else if any {
        Expect::Any
    } else {
        Expect::Ok
    };
    Entry::Desc(d, expect, why.join(", "))
}

fn raw(b: &mut Bytes) -> Entry {
    let fix = b.u8() & 1 == 1;
    let mut bytes = [0u8; WQE_SIZE];
    for x in bytes.iter_mut() {
        *x = b.u8();
    }
    Entry::Raw { bytes, fix }
}

/// What the consumer must answer for `bytes` posted at producer count `pc`.
fn expect_raw(bytes: &[u8; WQE_SIZE], pc: u64) -> Expect {
    match wqe::decode(bytes) {
        Err(_) => Expect::Error,
        Ok(d) if d.req_id != pc & 0xFFFF || d.phase != wqe::phase_for(pc, SQ_DEPTH) => {
            Expect::Error
        }
        // Well-formed: whether its fields make sense is the consumer's business.
        Ok(_) => Expect::Any,
    }
}

fn run(data: &[u8]) {
    let w = world().lock().unwrap();
    let mut b = Bytes(data);
    let mut entries = Vec::new();
    let mut noise = Vec::new();
    while !b.is_empty() && entries.len() < MAX_WQES {
        match b.u8() % 8 {
            0..=4 => entries.push(structured(&mut b, &w)),
            5 | 6 => entries.push(raw(&mut b)),
            _ => noise.push((entries.len(), b.u8(), b.u64())),
        }
    }
    if entries.is_empty() {
        return;
    }
    w.log.lock().unwrap().clear();
    let view = *w.poster.view();
    let mut expects: Vec<(u64, Expect, String)> = Vec::new();
    let mut went_back = false;
    let mut at = 0;
    while at < entries.len() {
        // Doorbell noise due before this batch: a value far ahead or behind; the consumer must
        // ignore it (the next proper doorbell follows at once).
        for &(_, kind, v) in noise.iter().filter(|n| n.0 == at) {
            let cur = w.poster.ready() as u32;
            let bogus = match kind % 3 {
                0 => cur.wrapping_add(SQ_DEPTH + 1 + (v as u32 % 1000)),
                1 => {
                    // A doorbell that goes back makes committed WQEs look written ahead of the
                    // doorbell window, which the queue may refuse (the device rule): valid WQEs
                    // of this input may then fail, bad ones must still.
                    went_back = true;
                    cur.wrapping_sub(1 + (v as u32 % SQ_DEPTH))
                }
                _ => cur.wrapping_add(0x8000_0000 | v as u32),
            };
            // SAFETY: the doorbell record of the queue, which lives for the process.
            let db = unsafe { nvshmem_efa_gda::gda::mem::atomic_u32(view.doorbell as *mut u8) };
            db.store(bogus, std::sync::atomic::Ordering::Release);
            std::thread::yield_now();
            // Then the proper value again: a doorbell that stays wrong stalls the queue by design
            // (it is ignored until it makes sense), and the next post may wait for free slots
            // before it rings.
            db.store(cur, std::sync::atomic::Ordering::Release);
        }
        let k = (entries.len() - at).min(SQ_DEPTH as usize / 2);
        let batch = &entries[at..at + k];
        let mut i = 0;
        let base = w
            .poster
            .post_with(k, |pc, phase| {
                let e = &batch[i];
                i += 1;
                match e {
                    Entry::Desc(d, x, why) => {
                        let mut d = *d;
                        d.req_id = pc & 0xFFFF;
                        d.phase = phase;
                        expects.push((pc, *x, format!("{d:?} [refused for: {why}]")));
                        wqe::encode(&d)
                    }
                    Entry::Raw { bytes, fix } => {
                        let mut bytes = *bytes;
                        if *fix {
                            let id = (pc as u16).to_le_bytes();
                            bytes[0] = id[0];
                            bytes[1] = id[1];
                            bytes[3] = (bytes[3] & !wqe::CTRL2_PHASE) | phase;
                        }
                        expects.push((pc, expect_raw(&bytes, pc), format!("raw {bytes:02x?}")));
                        bytes
                    }
                }
            })
            .unwrap_or_else(|e| panic!("posting {k} WQEs: {e}"));
        let _ = base;
        at += k;
    }
    if let Err(e) = w.poster.quiet() {
        panic!("the software queue is stuck: {e}");
    }
    // Drain the RX ring (SENDs and immediates to itself) so it never fills.
    let mut rx = Vec::new();
    while w.poster.poll_rx(256, &mut rx) > 0 {
        rx.clear();
    }
    let log = w.log.lock().unwrap().clone();
    for (pc, want, what) in &expects {
        let got: Vec<u8> = log.iter().filter(|(p, _)| p == pc).map(|x| x.1).collect();
        assert_eq!(
            got.len(),
            1,
            "WQE {pc}: {} completions (want exactly one)",
            got.len()
        );
        match want {
            Expect::Ok if went_back => {}
            Expect::Ok => assert_eq!(
                got[0], 0,
                "valid WQE {pc} completed with status {}: {what} (heap {:#x}+{HEAP:#x}, canary {:#x}, lkey {})",
                got[0], w.heap.addr(), w.canary.addr(), w.lkey
            ),
            Expect::Error => assert_ne!(
                got[0], 0,
                "bad WQE {pc} completed with status 0: {what} (heap {:#x}+{HEAP:#x}, canary {:#x}, lkey {}, peer {:?})",
                w.heap.addr(), w.canary.addr(), w.lkey, w.peer
            ),
            Expect::Any => {}
        }
    }
    assert_eq!(w.poster.duplicates(), 0, "a slot completed twice");
    // SAFETY: the canary mapping lives for the process.
    let canary = unsafe { std::slice::from_raw_parts(w.canary.base, w.canary.len) };
    if let Some(i) = canary.iter().position(|&x| x != CANARY_BYTE) {
        panic!("unregistered memory written at canary offset {i}");
    }
    let _ = w.gda;
}

fuzz_target!(|data: &[u8]| run(data));
