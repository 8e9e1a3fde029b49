//! The hardware queue's receive path (`gda::hw_rx`) run on a software provider: the same receive
//! thread, credit check and applier hardware mode uses, started exactly as `HwQueue::open` starts
//! them (an endpoint with a host receive CQ opened with `FI_RX_CQ_DATA`), fed with the bytes a NIC
//! would deliver. The messages are built by the WQE encoder the device code is held equal to
//! (`efa::wqe`, golden vectors): a sender encodes the inline SEND WQE that `post_amo` writes, a
//! stand-in for the NIC decodes it and sends its inline payload. A thread standing in for the GPU
//! reads the RX ring by phase and advances `ctrl.rx_ci`, as `poll_rx` does.
mod softq_common;

use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::efa::cqe::{self, CqStatus, RxCqe, RX_CQE_EX_SIZE};
use nvshmem_efa_gda::efa::wqe::{self, OpType, WqeOp};
use nvshmem_efa_gda::fabric::{
    flags, AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, FiAddr, MemKind,
    MemoryRegion, Provider,
};
use nvshmem_efa_gda::gda::hw_rx::{HwRx, RxConfig, RxCredits, WriteImmRx};
use nvshmem_efa_gda::gda::mem::{atomic_u64, CtrlMem, CtrlPlacement};
use nvshmem_efa_gda::gda::state::{NvshmemEfaGdaPeer, NvshmemEfaGdaQueueCtrl};
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_OP_ADD, AMO_OP_SET};

use softq_common::{capture, providers, send_inline, HostBuf};

/// The receiving PE: its endpoint (opened as `HwQueue::open` opens the GDA endpoint), its control
/// block in host memory, its heap (two chunks in separate allocations) and the receive path.
/// Field order is drop order: the receive path holds the endpoint's last reference, so the endpoint
/// closes before the receive buffers go; registrations go before the memory.
struct Target {
    ep: Arc<Endpoint>,
    rx: HwRx,
    heap_mr: MemoryRegion,
    ctrl: Arc<CtrlMem>,
    heap: [HostBuf; 2],
    domain: Arc<Domain>,
}

const CHUNK: u64 = 64 * 1024;

impl Target {
    fn open(p: &Provider, cfg: &RxConfig) -> Target {
        let domain = softq_common::domain(p).expect("provider opens");
        let tx_cq = CompletionQueue::open(&domain, 64).unwrap();
        // Sized as HwQueue::open sizes it: one entry per posted receive.
        let rx_cq = CompletionQueue::open(&domain, cfg.receives as usize).unwrap();
        let av = AddressVector::open(&domain, 64).unwrap();
        let ep = Arc::new(
            Endpoint::open_split_mode(&domain, &av, &tx_cq, &rx_cq, flags::RX_CQ_DATA).unwrap(),
        );
        let ctrl = Arc::new(
            CtrlMem::new(
                std::mem::size_of::<NvshmemEfaGdaQueueCtrl>(),
                CtrlPlacement::Host,
            )
            .unwrap(),
        );
        let credits = RxCredits {
            receives: cfg.receives,
            rq_entries: cfg.receives,
            cq_entries: cfg.receives,
            write_imm: WriteImmRx::ConsumesReceive,
        };
        let rx = HwRx::start(ep.clone(), credits, cfg, ctrl.clone(), false).unwrap();
        let heap = [HostBuf::new(CHUNK as usize), HostBuf::new(CHUNK as usize)];
        // Chunk 0 at heap offsets [0, 64K), chunk 1 at [128K, 192K): a hole between them.
        rx.add_heap_chunk(0, CHUNK, heap[0].addr(), false).unwrap();
        rx.add_heap_chunk(2 * CHUNK, 3 * CHUNK, heap[1].addr(), false)
            .unwrap();
        // SAFETY: the heap outlives the registration (field order of Target).
        let heap_mr = unsafe {
            MemoryRegion::register_reserved(
                &domain,
                heap[0].ptr(),
                CHUNK as usize,
                MemKind::Host,
                Some(&ep),
            )
            .unwrap()
        };
        Target {
            rx,
            ctrl,
            ep,
            heap,
            heap_mr,
            domain,
        }
    }

    fn word(&self, off: u64) -> u64 {
        let (buf, o) = if off < CHUNK {
            (&self.heap[0], off)
        } else {
            (&self.heap[1], off - 2 * CHUNK)
        };
        // SAFETY: inside the buffer, 8-byte aligned; the applier writes it atomically.
        unsafe { atomic_u64(buf.ptr().add(o as usize)) }.load(Ordering::Acquire)
    }

    fn rx_ci(&self) -> &std::sync::atomic::AtomicU64 {
        let p = self.ctrl.host().expect("host control block");
        // SAFETY: rx_ci lies inside the control block, 8-byte aligned.
        unsafe { atomic_u64(p.add(offset_of!(NvshmemEfaGdaQueueCtrl, rx_ci))) }
    }

    /// Takes the next RX ring entry if its phase says it is there (as `poll_rx` does).
    fn poll_rx(&self) -> Option<RxCqe> {
        let n = self.rx.ring_entries();
        let ci = self.rx_ci().load(Ordering::Acquire);
        let slot = (ci & u64::from(n - 1)) as usize;
        // SAFETY: the slot lies inside the ring; the producer publishes the flags byte last.
        let bytes: [u8; RX_CQE_EX_SIZE] = unsafe {
            let p = self.rx.ring_host().add(slot * RX_CQE_EX_SIZE);
            let flags = std::ptr::read_volatile(p.add(3));
            if cqe::flags_phase(flags) != cqe::cq_expected_phase(ci, n) {
                return None;
            }
            std::sync::atomic::fence(Ordering::Acquire);
            std::ptr::read_volatile(p as *const [u8; RX_CQE_EX_SIZE])
        };
        let c = cqe::decode_rx_ex(&bytes).expect("a well-formed RX entry");
        self.rx_ci().store(ci + 1, Ordering::Release);
        Some(c)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.rx.stop();
    }
}

/// A sender: an endpoint of its own that plays the initiator's NIC.
struct Sender {
    mr: MemoryRegion,
    ep: Endpoint,
    dest: FiAddr,
    buf: HostBuf,
    peer: NvshmemEfaGdaPeer,
}

const SLOTS: usize = 16;
const SLOT: usize = 128;

impl Sender {
    fn new(t: &Target) -> Sender {
        let cq = CompletionQueue::open(&t.domain, 64).unwrap();
        let av = AddressVector::open(&t.domain, 4).unwrap();
        let ep = Endpoint::open(&t.domain, &av, &cq, None).unwrap();
        let dest = av.insert(&t.ep.name().unwrap(), 1).unwrap()[0];
        let buf = HostBuf::new(SLOTS * SLOT);
        // SAFETY: the buffer outlives the registration (Drop order of the fields below).
        let mr = unsafe {
            MemoryRegion::register_reserved(
                &t.domain,
                buf.ptr(),
                SLOTS * SLOT,
                MemKind::Host,
                Some(&ep),
            )
            .unwrap()
        };
        Sender {
            ep,
            dest,
            buf,
            mr,
            peer: NvshmemEfaGdaPeer {
                ahn: 3,
                qpn: 7,
                qkey: 0x1234_5677,
                flags: 1,
                ..Default::default()
            },
        }
    }

    fn drain(&self, outstanding: &mut usize) {
        let mut e: [CqEntry; 8] = unsafe { std::mem::zeroed() };
        match self.ep.cq().read(&mut e) {
            Ok(n) => *outstanding -= n,
            Err(err) => panic!("send failed: {}", err.error),
        }
    }

    /// The NIC's part: executes the inline SEND WQE `bytes` (what `post_amo` writes) by sending its
    /// inline payload to the target.
    fn execute(&self, bytes: &[u8; wqe::WQE_SIZE], slot: usize, outstanding: &mut usize) {
        let d = wqe::decode(bytes).expect("the encoder's WQE decodes");
        let WqeOp::Send { payload, imm } = d.op else {
            panic!("not a SEND: {:?}", d.op)
        };
        assert_eq!(imm, None);
        assert_eq!((d.ah, d.dest_qpn, d.qkey), (3, 7, 0x1234_5677));
        let data = payload.inline_bytes().expect("inline SEND");
        let p = unsafe { self.buf.ptr().add(slot * SLOT) };
        // SAFETY: the slot is ours and not in flight (at most SLOTS outstanding, used round robin).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        while *outstanding >= SLOTS - 1 {
            self.drain(outstanding);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // SAFETY: buffer registered, slot not reused before its completion (bounded outstanding).
            match unsafe {
                self.ep.send(
                    p,
                    data.len(),
                    self.mr.desc(),
                    self.dest,
                    std::ptr::null_mut(),
                )
            } {
                Ok(()) => break,
                Err(e) if e.is_again() && Instant::now() < deadline => self.drain(outstanding),
                Err(e) => panic!("fi_send: {e}"),
            }
        }
        *outstanding += 1;
    }

    /// Encodes the AMO as the device does (inline SEND of the 32-byte message) and executes it.
    fn amo(&self, m: &AmoMsg, slot: usize, outstanding: &mut usize) {
        let bytes = wqe::encode(&send_inline(&self.peer, &m.encode(), None));
        self.execute(&bytes, slot, outstanding);
    }

    fn finish(&self, outstanding: &mut usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while *outstanding > 0 {
            assert!(Instant::now() < deadline, "sends did not complete");
            self.drain(outstanding);
        }
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn ops() -> u64 {
    std::env::var("HW_RX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

#[test]
fn amo_messages_built_as_wqes_are_applied_exactly() {
    capture();
    for p in providers() {
        let t = Target::open(&p, &RxConfig::default());
        const THREADS: u64 = 4;
        const WORDS: u64 = 8;
        let per = ops() / THREADS;
        std::thread::scope(|s| {
            for k in 0..THREADS {
                let t = &t;
                s.spawn(move || {
                    let snd = Sender::new(t);
                    let mut out = 0usize;
                    for i in 0..per {
                        let w = i % WORDS;
                        // 8-byte adds into chunk 0, 4-byte adds into chunk 1 (heap offset 128K+).
                        let m = if i % 2 == 0 {
                            AmoMsg {
                                op: AMO_OP_ADD,
                                size: 8,
                                offset: 8 * w,
                                value: k + 1,
                                flags: 0,
                            }
                        } else {
                            AmoMsg {
                                op: AMO_OP_ADD,
                                size: 4,
                                offset: 2 * CHUNK + 8 * w,
                                value: 1,
                                flags: 0,
                            }
                        };
                        snd.amo(&m, (i as usize) % SLOTS, &mut out);
                    }
                    snd.finish(&mut out);
                });
            }
        });
        let total = per * THREADS;
        wait_for("every AMO applied", 120, || t.rx.stats().applied >= total);
        let st = t.rx.stats();
        assert_eq!(st.applied, total, "{p}: {st:?}");
        assert_eq!(st.rejected, 0, "{p}: {st:?}");
        assert_eq!(st.produced, 0, "{p}: plain AMOs produce no RX entry");
        // Thread k adds k+1 on every even i; each word w gets the even i with i % WORDS == w.
        for w in 0..WORDS {
            let hits = (0..per).filter(|i| i % 2 == 0 && i % WORDS == w).count() as u64;
            let want: u64 = (1..=THREADS).sum::<u64>() * hits;
            assert_eq!(t.word(8 * w), want, "{p}: 8-byte word {w}");
            let hits4 = (0..per).filter(|i| i % 2 == 1 && i % WORDS == w).count() as u64;
            assert_eq!(
                t.word(2 * CHUNK + 8 * w),
                hits4 * THREADS,
                "{p}: 4-byte word {w} (upper half untouched)"
            );
        }
        assert!(t.rx.failure().is_none());
        eprintln!("{p}: {total} AMOs from {THREADS} senders applied exactly");
    }
}

#[test]
fn bad_messages_are_rejected_with_an_error_entry() {
    let log = capture();
    for p in providers() {
        let t = Target::open(&p, &RxConfig::default());
        let snd = Sender::new(&t);
        let mut out = 0;
        let good = |offset| AmoMsg {
            op: AMO_OP_SET,
            size: 8,
            offset,
            value: 0xfeed,
            flags: 0,
        };
        let bad = [
            (AmoMsg { op: 9, ..good(0) }, CqStatus::LocalUnsupportedOp),
            (good(4), CqStatus::RemoteBadAddress), // misaligned
            (good(CHUNK + 8), CqStatus::RemoteBadAddress), // in the hole between the chunks
            (good(3 * CHUNK), CqStatus::RemoteBadAddress), // past the heap
            (AmoMsg { size: 3, ..good(0) }, CqStatus::LocalBadLength),
        ];
        for (i, (m, _)) in bad.iter().enumerate() {
            snd.amo(m, i, &mut out);
        }
        // A SEND that is not an AMO message: dropped with a log line, no RX entry.
        let junk = wqe::encode(&send_inline(&snd.peer, b"not an AMO message", None));
        snd.execute(&junk, 6, &mut out);
        // Then a good one: applied, so the rejections changed nothing and stopped nothing.
        snd.amo(&good(16), 7, &mut out);
        snd.finish(&mut out);
        wait_for("the good AMO", 30, || t.rx.stats().applied == 1);
        wait_for("every refusal", 30, || t.rx.stats().rejected == 6);
        let mut seen = Vec::new();
        wait_for("the error entries", 30, || {
            while let Some(c) = t.poll_rx() {
                seen.push(c);
            }
            seen.len() >= bad.len()
        });
        for (c, (m, st)) in seen.iter().zip(bad.iter()) {
            assert_eq!(c.status, *st, "{p}: {m:?}");
            assert_eq!(c.op, OpType::Send);
            assert_eq!(c.length, 32);
            assert!(!c.has_imm);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            t.poll_rx().is_none(),
            "{p}: no entry for the junk or the good AMO"
        );
        assert_eq!(t.word(16), 0xfeed);
        assert_eq!(t.word(0), 0, "{p}: rejected messages changed nothing");
        let text = log.text();
        for needle in [
            "unknown AMO op 9",
            "is not aligned to its size",
            "lies in no heap chunk",
            "is outside the target heap",
            "AMO size 3",
            "that is not an AMO message",
        ] {
            assert!(text.contains(needle), "{p}: no log line with {needle:?}");
        }
    }
}

#[test]
fn a_slow_gpu_holds_receives_instead_of_overrunning_the_ring() {
    capture();
    for p in providers() {
        let cfg = RxConfig {
            receives: 8,
            slot: 256,
            ring_entries: 4,
        };
        let t = Target::open(&p, &cfg);
        let cq = CompletionQueue::open(&t.domain, 64).unwrap();
        let av = AddressVector::open(&t.domain, 4).unwrap();
        let ep = Endpoint::open(&t.domain, &av, &cq, None).unwrap();
        let dest = av.insert(&t.ep.name().unwrap(), 1).unwrap()[0];
        let src = HostBuf::new(4096);
        // SAFETY: src outlives the registration (dropped at the end of this iteration, after it).
        let src_mr = unsafe {
            MemoryRegion::register_reserved(&t.domain, src.ptr(), 4096, MemKind::Host, Some(&ep))
                .unwrap()
        };
        const N: u32 = 40;
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            // The initiator: RDMA writes with immediate i (8 bytes each into heap word i).
            s.spawn(|| {
                let mut done = 0;
                let mut e: [CqEntry; 8] = unsafe { std::mem::zeroed() };
                for i in 0..N {
                    let dl = Instant::now() + Duration::from_secs(30);
                    loop {
                        // SAFETY: src outlives the transfer; the target heap chunk is registered.
                        let r = unsafe {
                            ep.write_data(
                                src.ptr(),
                                8,
                                src_mr.desc(),
                                u64::from(i),
                                dest,
                                if t.domain.info().virt_addr() {
                                    t.heap[0].addr() + 8 * u64::from(i)
                                } else {
                                    8 * u64::from(i)
                                },
                                t.heap_mr.key(),
                                std::ptr::null_mut(),
                            )
                        };
                        match r {
                            Ok(()) => break,
                            Err(e2) if e2.is_again() && Instant::now() < dl => {
                                done += cq.read(&mut e).expect("write completes");
                            }
                            Err(e2) => panic!("fi_writedata: {e2}"),
                        }
                    }
                }
                let dl = Instant::now() + Duration::from_secs(60);
                while done < N as usize && !stop.load(Ordering::Acquire) {
                    assert!(Instant::now() < dl, "writes did not complete");
                    done += cq.read(&mut e).expect("write completes");
                }
            });
            // The GPU does not consume yet: the ring fills to its 4 entries and stays there.
            wait_for("a full ring", 30, || t.rx.stats().produced >= 4);
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(t.rx.stats().produced, 4, "{p}: the ring was overrun");
            let mut imms = Vec::new();
            wait_for("every immediate", 60, || {
                while let Some(c) = t.poll_rx() {
                    assert_eq!(c.op, OpType::RdmaWrite, "{p}");
                    assert!(c.has_imm && c.status == CqStatus::Ok, "{p}: {c:?}");
                    imms.push(c.imm);
                    let produced = t.rx.stats().produced;
                    let ci = t.rx_ci().load(Ordering::Acquire);
                    assert!(
                        produced - ci <= 4,
                        "{p}: {produced} produced, {ci} consumed"
                    );
                }
                imms.len() >= N as usize
            });
            stop.store(true, Ordering::Release);
            assert_eq!(
                imms,
                (0..N).collect::<Vec<_>>(),
                "{p}: each immediate once, in order"
            );
        });
        assert_eq!(t.rx.stats().errors, 0);
    }
}

#[test]
fn queue_creation_refuses_a_receive_cq_that_could_overrun() {
    let log = capture();
    let p = providers().remove(0);
    let domain = softq_common::domain(&p).unwrap();
    let tx_cq = CompletionQueue::open(&domain, 64).unwrap();
    let rx_cq = CompletionQueue::open(&domain, 16).unwrap();
    let av = AddressVector::open(&domain, 4).unwrap();
    let ep = Arc::new(
        Endpoint::open_split_mode(&domain, &av, &tx_cq, &rx_cq, flags::RX_CQ_DATA).unwrap(),
    );
    let ctrl = Arc::new(CtrlMem::new(64, CtrlPlacement::Host).unwrap());
    let cfg = RxConfig {
        receives: 32,
        ..RxConfig::default()
    };
    let credits = RxCredits {
        receives: 32,
        rq_entries: 64,
        cq_entries: 16,
        write_imm: WriteImmRx::ConsumesReceive,
    };
    let e = HwRx::start(ep.clone(), credits, &cfg, ctrl.clone(), false)
        .err()
        .expect("a 16-entry receive CQ for 32 receives is refused");
    assert!(e.message.contains("can be overrun"), "{e}");
    let e = HwRx::start(
        ep.clone(),
        RxCredits {
            cq_entries: 64,
            write_imm: WriteImmRx::Unsolicited,
            ..credits
        },
        &cfg,
        ctrl.clone(),
        false,
    )
    .err()
    .expect("unsolicited write-receive is refused");
    assert!(e.message.contains("FI_RX_CQ_DATA"), "{e}");
    let e = HwRx::start(
        ep.clone(),
        RxCredits {
            rq_entries: 16,
            cq_entries: 64,
            ..credits
        },
        &cfg,
        ctrl.clone(),
        false,
    )
    .err()
    .expect("more receives than the receive queue holds is refused");
    assert!(e.message.contains("receive queue"), "{e}");
    assert!(log.text().contains("can be overrun by 32 posted receives"));
    // The exact fit is accepted.
    let ok = HwRx::start(
        ep,
        RxCredits {
            cq_entries: 32,
            ..credits
        },
        &cfg,
        ctrl,
        false,
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
}
