//! The software queue where CUDA is present: rings in CUDA-mapped host memory, heaps in GPU memory
//! (moved by staged messages over shm, never handed to the provider), AMOs applied to GPU memory,
//! the control block, peer table and device-state copy in device memory. On machines without a CUDA
//! device (CI) each test says so and checks nothing else; run it on a GPU host
//! (`cargo test --test softq_cuda`).
mod softq_common;

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::cuda::{self, DeviceBuffer, PtrKind};
use nvshmem_efa_gda::efa::cqe::{self, CqStatus};
use nvshmem_efa_gda::efa::wqe::{self, LocalBuf, OpType, SendPayload, WqeOp};
use nvshmem_efa_gda::fabric::{Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::CtrlPlacement;
use nvshmem_efa_gda::gda::state::{NvshmemEfaGdaDeviceState, NvshmemEfaGdaPeer};
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_OP_ADD, AMO_OP_SET};
use nvshmem_efa_gda::gda::{Gda, GdaOptions};
use softq_common::*;

/// Makes device 0's primary context current; false when there is no usable CUDA device.
fn cuda_context() -> bool {
    if !cuda::available() {
        eprintln!("no CUDA driver: nothing to check here");
        return false;
    }
    let ok = cuda::use_primary_context(0).is_ok();
    if !ok {
        eprintln!("CUDA driver present but no usable device: nothing to check here");
    }
    ok
}

fn shm_domain(hmem: bool) -> Option<Arc<Domain>> {
    let info = Info::get(&InfoRequest {
        provider: Provider::Shm,
        hmem,
        atomics: false,
        msg: true,
    })
    .ok()?;
    Domain::open(&Fabric::open(info).ok()?).ok()
}

fn h2d(dst: u64, src: &[u8]) {
    // SAFETY: callers pass ranges inside their device allocations.
    unsafe { cuda::memcpy(dst as *mut c_void, src.as_ptr() as *const c_void, src.len()) }.unwrap();
}

fn d2h(src: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: as above.
    unsafe { cuda::memcpy(v.as_mut_ptr() as *mut c_void, src as *const c_void, len) }.unwrap();
    v
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: v has len bytes.
    unsafe { fill(v.as_mut_ptr(), len, seed) };
    v
}

fn connect(pes: &mut [(Gda, DeviceBuffer)]) {
    let names: Vec<Vec<u8>> = pes.iter().map(|p| p.0.address().unwrap()).collect();
    let all: Vec<u8> = names.concat();
    let n = pes.len() as i32;
    for (i, (g, heap)) in pes.iter_mut().enumerate() {
        g.set_local_heap(heap.ptr(), heap.len() as u64, None)
            .unwrap();
        g.connect(i as i32, n, &all, None).unwrap();
    }
    let heaps: Vec<(u64, u64, u64)> = pes
        .iter()
        .map(|p| (p.1.ptr(), p.1.len() as u64, p.0.local_heap_key().unwrap()))
        .collect();
    for (g, _) in pes.iter_mut() {
        for (j, h) in heaps.iter().enumerate() {
            g.set_remote_heap(j as i32, h.0, h.1, h.2).unwrap();
        }
    }
}

#[test]
fn gpu_heaps_over_shm() {
    if !cuda_context() {
        return;
    }
    let Some(_) = shm_domain(true) else {
        eprintln!(
            "shm offers no FI_HMEM here (libfabric built without CUDA?): GPU heaps not checked"
        );
        return;
    };
    let cfg = config(GdaMode::Soft);
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Host,
        sq_depth: Some(64),
        max_batch: Some(8),
    };
    const HEAP: usize = 4 << 20;
    let mut pes: Vec<(Gda, DeviceBuffer)> = (0..2)
        .map(|_| {
            (
                Gda::new(&shm_domain(true).unwrap(), &cfg, &opts).unwrap(),
                DeviceBuffer::new(HEAP).unwrap(),
            )
        })
        .collect();
    connect(&mut pes);
    let (g0, heap0) = (&pes[0].0, &pes[0].1);
    let heap1 = &pes[1].1;
    let st = g0.device_state().unwrap();
    assert_eq!(st.ready, 1);
    assert!(matches!(
        cuda::pointer_kind(heap0.ptr() as *const c_void),
        PtrKind::Device { .. }
    ));
    // Rings in CUDA-mapped host memory.
    let q0 = g0.soft_queue().unwrap();
    let view = q0.host_view().unwrap();
    assert!(!view.sq.is_null());
    let poster = HostPoster::new(q0)
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let peer: NvshmemEfaGdaPeer = g0.peers()[1];
    let lkey = st.heap_lkey;
    // Writes of every size class, GPU to GPU, then reads back GPU to GPU.
    let sizes = [1usize, 7, 64, 1000, 4096, 65536, 1 << 20];
    let mut off = 0u64;
    let mut expect = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let p = pattern(100 + i as u64, len);
        h2d(heap0.ptr() + off, &p);
        let imm = (i == 2).then_some(0xabc);
        poster
            .post(&[write(
                &peer,
                heap0.ptr() + off,
                lkey,
                heap1.ptr() + off,
                len as u32,
                imm,
            )])
            .unwrap();
        expect.push((off, p));
        off += len as u64 + 4096;
    }
    assert_eq!(poster.quiet().unwrap(), 0);
    for (o, p) in &expect {
        assert_eq!(&d2h(heap1.ptr() + o, p.len()), p, "write at +{o}");
    }
    let rd = 2 << 20;
    for (o, p) in &expect {
        poster
            .post(&[read(
                &peer,
                heap0.ptr() + rd,
                lkey,
                heap1.ptr() + o,
                p.len() as u32,
            )])
            .unwrap();
        assert_eq!(poster.quiet().unwrap(), 0);
        assert_eq!(&d2h(heap0.ptr() + rd, p.len()), p, "read of +{o}");
    }
    // AMOs applied to GPU memory by PE 1's consumer, and a SEND whose payload is in GPU memory.
    let mut sum64 = 0u64;
    let mut sum32 = 0u32;
    for i in 0..200u64 {
        let (m, imm) = match i % 3 {
            0 => {
                sum64 = sum64.wrapping_add(i * 1_000_003);
                (
                    AmoMsg {
                        op: AMO_OP_ADD,
                        size: 8,
                        offset: 8,
                        value: i * 1_000_003,
                        flags: 0,
                    },
                    None,
                )
            }
            1 => {
                sum32 = sum32.wrapping_add((i as u32) << 24);
                (
                    AmoMsg {
                        op: AMO_OP_ADD,
                        size: 4,
                        offset: 16,
                        value: u64::from((i as u32) << 24),
                        flags: 0,
                    },
                    None,
                )
            }
            _ => (
                AmoMsg {
                    op: AMO_OP_SET,
                    size: 8,
                    offset: 24,
                    value: i,
                    flags: 0,
                },
                Some(i as u32),
            ),
        };
        poster
            .post(&[send_inline(&peer, &m.encode(), imm)])
            .unwrap();
    }
    let sgl = pattern(7, 100);
    h2d(heap0.ptr() + 3 * 1024 * 1024, &sgl);
    let send = desc(
        &peer,
        WqeOp::Send {
            payload: SendPayload::Sgl {
                first: LocalBuf {
                    addr: heap0.ptr() + 3 * 1024 * 1024,
                    lkey,
                    len: 100,
                },
                second: None,
            },
            imm: Some(0x5e9d),
        },
    );
    poster.post(&[send]).unwrap();
    assert_eq!(poster.quiet().unwrap(), 0);
    let q1 = pes[1].0.soft_queue().unwrap();
    let p1 = HostPoster::new(q1).unwrap();
    let mut rx = Vec::new();
    let t = Instant::now();
    while rx.len() < 202 && t.elapsed() < Duration::from_secs(30) {
        p1.poll_rx(64, &mut rx);
    }
    assert_eq!(
        rx.len(),
        202,
        "one RX completion per write with immediate, AMO and SEND"
    );
    let rx: Vec<cqe::RxCqe> = rx.into_iter().map(|r| r.unwrap()).collect();
    assert!(rx.iter().all(|r| r.status == CqStatus::Ok));
    assert_eq!(
        rx.iter()
            .filter(|r| r.op == OpType::RdmaWrite && r.imm == 0xabc && r.length == 64)
            .count(),
        1
    );
    assert_eq!(
        rx.iter()
            .filter(|r| r.op == OpType::Send && r.imm == 0x5e9d && r.length == 100)
            .count(),
        1
    );
    assert_eq!(q1.stats().amos_applied, 200);
    let v = d2h(heap1.ptr() + 8, 24);
    assert_eq!(u64::from_le_bytes(v[0..8].try_into().unwrap()), sum64);
    assert_eq!(u32::from_le_bytes(v[8..12].try_into().unwrap()), sum32);
    assert_eq!(
        u64::from_le_bytes(v[16..24].try_into().unwrap()) % 3,
        2,
        "the last SET value stored"
    );
    eprintln!(
        "GPU heaps over shm: writes, reads, 200 AMOs on GPU memory and a GPU-sourced SEND checked"
    );
}

#[test]
fn control_block_and_state_in_device_memory() {
    if !cuda_context() {
        return;
    }
    let cfg = config(GdaMode::Soft);
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Auto,
        sq_depth: Some(8),
        max_batch: Some(8),
    };
    let hmem = shm_domain(true).is_some();
    if !hmem {
        // Without FI_HMEM the heap cannot be GPU memory: host memory instead.
        eprintln!("shm offers no FI_HMEM here: the heap is host memory in this test");
    }
    let mut pes: Vec<(Gda, DeviceBuffer)> = vec![(
        Gda::new(&shm_domain(hmem).unwrap(), &cfg, &opts).unwrap(),
        DeviceBuffer::new(1 << 20).unwrap(),
    )];
    let host_heap = HostBuf::new(1 << 20);
    let (heap_ptr, heap_len) = if hmem {
        (pes[0].1.ptr(), pes[0].1.len() as u64)
    } else {
        (host_heap.addr(), host_heap.len() as u64)
    };
    {
        let g = &mut pes[0].0;
        let name = g.address().unwrap();
        g.set_local_heap(heap_ptr, heap_len, None).unwrap();
        g.connect(0, 1, &name, None).unwrap();
        let key = g.local_heap_key().unwrap();
        g.set_remote_heap(0, heap_ptr, heap_len, key).unwrap();
    }
    let g = &pes[0].0;
    let st = g.device_state().unwrap();
    assert_eq!(st.ready, 1);
    // Control block, status words, peer table and the state copy live in device memory.
    for (what, p) in [
        ("ctrl", st.queue.ctrl),
        ("slot_status", st.queue.slot_status),
        ("peers", st.peers),
        ("state", g.device_state_ptr()),
    ] {
        assert!(
            matches!(
                cuda::pointer_kind(p as *const c_void),
                PtrKind::Device { .. }
            ),
            "{what} at {p:#x}"
        );
    }
    let raw = d2h(
        g.device_state_ptr(),
        std::mem::size_of::<NvshmemEfaGdaDeviceState>(),
    );
    // SAFETY: the bytes of one state struct.
    let copy: NvshmemEfaGdaDeviceState =
        unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const _) };
    assert_eq!(copy, st);
    let raw = d2h(st.peers, 32);
    // SAFETY: the bytes of one peer entry.
    let peer: NvshmemEfaGdaPeer = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const _) };
    assert_eq!(peer, g.peers()[0]);
    let q = g.soft_queue().unwrap();
    assert!(q.host_view().is_none());
    assert!(HostPoster::new(q).is_err());
    // Drive the rings by hand (mapped memory: the kernels' addresses are host addresses with unified
    // addressing): the consumer reads `done` from device memory to bound what it takes.
    let n = st.queue.sq_entries as u64;
    let sq = st.queue.sq as *mut u8;
    let db = st.queue.sq_doorbell as *mut u32;
    let put = |pc: u64| {
        let mut d = write(
            &peer,
            heap_ptr,
            st.heap_lkey,
            heap_ptr + 4096 + 64 * (pc % n),
            64,
            None,
        );
        d.req_id = pc & 0xffff;
        d.phase = wqe::phase_for(pc, st.queue.sq_entries);
        let b = wqe::encode(&d);
        // SAFETY: slot inside the mapped SQ ring.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), sq.add((pc % n) as usize * 64), 64) };
    };
    for pc in 0..n + 2 {
        put(pc);
        if pc == n - 1 {
            // SAFETY: the doorbell record (mapped host memory).
            unsafe { std::ptr::write_volatile(db, n as u32) };
            let t = Instant::now();
            while q.stats().completed < n {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "first ring not completed"
                );
            }
        }
    }
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(db, (n + 2) as u32) };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(q.stats().consumed, n, "no WQE beyond done + sq_entries");
    // Retire the first ring in device memory, as kernels would.
    let done = n.to_le_bytes();
    h2d(st.queue.ctrl + 16, &done);
    let t = Instant::now();
    while q.stats().completed < n + 2 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the consumer did not see done advance in device memory"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("device-memory control block, peer table and state copy checked");
}
