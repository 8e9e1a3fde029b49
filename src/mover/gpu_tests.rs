//! The mover on a real GPU: copy-engine queue, legacy IPC and CUDA VMM exports, and a second
//! process that opens the export (a VMM one through the fd server) and moves data both ways (the
//! same-host path, without NVSHMEM or a provider). On
//! machines without a CUDA device each test says so and checks nothing else; on a GPU host run
//! `cargo test --release --lib mover::gpu_tests -- --test-threads=1 --nocapture` (under MPS when
//! PEs share the GPU, as the GPU runners do).
use std::ffi::c_void;
use std::io::Write;
use std::time::{Duration, Instant};

use super::amo::{AmoRequest, Launch};
use super::engine::Mover;
use super::fdshare;
use super::handle::{Export, HostId, IpcDesc};
use super::kcopy::KernelCopies;
use super::kfront::KernelFront;
use super::queue::{CopyQueue, CudaEngine};
use super::{Kind, Means, Policy};
use crate::cuda::kernel::AmoOp;
use crate::cuda::vmm::VmmBuffer;
use crate::cuda::{self, DeviceBuffer};

const CHILD_ENV: &str = "NVSHMEM_EFA_MOVER_TEST_CHILD";
const LEN: usize = 8 << 20;
const OFF: u64 = 4096;

fn cuda_context() -> bool {
    if !cuda::available() {
        eprintln!("no CUDA driver: nothing to check here");
        return false;
    }
    if cuda::use_primary_context(0).is_err() {
        eprintln!("CUDA driver present but no usable device: nothing to check here");
        return false;
    }
    true
}

fn policy() -> Policy {
    Policy {
        ipc: true,
        staging: true,
        stage_all: false,
        copy_overlap: true,
    }
}

/// A mover on the current context and a device buffer of `LEN` bytes, when CUDA is usable.
fn mover_and_buffer() -> Option<(Mover, DeviceBuffer)> {
    if !cuda_context() {
        return None;
    }
    let m = Mover::new(policy(), 2);
    m.set_context(cuda::current_context());
    Some((m, DeviceBuffer::new(LEN).unwrap()))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
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

#[test]
fn copy_queue_on_the_copy_engine() {
    if !cuda_context() {
        return;
    }
    let a = DeviceBuffer::new(LEN).unwrap();
    let b = DeviceBuffer::new(LEN).unwrap();
    let src = pattern(7, LEN);
    h2d(a.ptr(), &src);
    let mut q = CopyQueue::new(CudaEngine::new(cuda::current_context(), true).unwrap());
    // 256 copies of 32 KiB, one quiet: marks every 32 copies, not one sync each.
    let chunk = LEN / 256;
    for i in 0..256 {
        let o = (i * chunk) as u64;
        // SAFETY: both ranges lie in live device buffers until quiet returns.
        unsafe { q.submit(b.ptr() + o, a.ptr() + o, chunk).unwrap() };
    }
    q.quiet_for(Duration::from_secs(10)).unwrap();
    assert_eq!(q.counts(), (256, 256, 8));
    assert!(d2h(b.ptr(), LEN) == src, "device-to-device copies wrong");
}

/// The stream pattern on the copy engine: k = 200 small copies in flight, then one quiet, with and
/// without batching (`NVSHMEM_EFA_COPY_BATCH`); every byte lands either way, and the time per copy
/// of each is printed (--nocapture) for the record.
#[test]
fn k_copies_in_flight_then_one_quiet_batched_and_not() {
    if !cuda_context() {
        return;
    }
    const K: usize = 200;
    const SIZE: usize = 64;
    let a = DeviceBuffer::new(K * SIZE).unwrap();
    let b = DeviceBuffer::new(K * SIZE).unwrap();
    let src = pattern(11, K * SIZE);
    h2d(a.ptr(), &src);
    let kernel = std::sync::Arc::new(
        crate::cuda::kernel::CopyKernel::load(cuda::current_context()).unwrap(),
    );
    for (batch, with_kernel) in [(0usize, false), (64, false), (64, true)] {
        h2d(b.ptr(), &vec![0u8; K * SIZE]);
        let k = with_kernel.then(|| {
            KernelCopies::cuda(
                kernel.clone(),
                Duration::from_millis(2),
                Duration::from_millis(100),
            )
            .unwrap()
        });
        let inner = CudaEngine::new(cuda::current_context(), true).unwrap();
        let mut q = CopyQueue::new(KernelFront::new(inner, k)).with_batch(batch);
        let mut best = f64::MAX;
        for _round in 0..20 {
            let t = Instant::now();
            for i in 0..K {
                let o = (i * SIZE) as u64;
                // SAFETY: both ranges lie in live device buffers until quiet returns.
                unsafe { q.submit_device(b.ptr() + o, a.ptr() + o, SIZE).unwrap() };
            }
            q.quiet_for(Duration::from_secs(10)).unwrap();
            best = best.min(t.elapsed().as_secs_f64() * 1e6 / K as f64);
        }
        assert_eq!(q.outstanding(), 0);
        assert!(
            d2h(b.ptr(), K * SIZE) == src,
            "batch {batch}, kernel {with_kernel}: copies wrong"
        );
        let c = q.engine_mut().counts();
        if with_kernel {
            assert!(
                c.kernel_copies > 0,
                "no copy went through the kernel: {c:?}"
            );
        }
        println!(
            "k={K} copies of {SIZE} B then one quiet, batch {batch}, copy kernel {with_kernel}: \
             {best:.2} us per copy (best of 20; {c:?})"
        );
    }
}

/// The transport's queue with the copy kernel in front, on a mix that exercises both routes and
/// their order: small puts (kernel), a large copy (copy engine) over the same bytes as some of them,
/// small ones again over part of the large one, and inline values last; every byte is checked
/// against the order the copies were made in.
#[test]
fn the_kernel_front_keeps_submission_order_across_kernel_and_copy_engine() {
    if !cuda_context() {
        return;
    }
    let kernel = std::sync::Arc::new(
        crate::cuda::kernel::CopyKernel::load(cuda::current_context()).unwrap(),
    );
    let k =
        KernelCopies::cuda(kernel, Duration::from_millis(2), Duration::from_millis(100)).unwrap();
    let inner = CudaEngine::new(cuda::current_context(), true).unwrap();
    let mut q = CopyQueue::new(KernelFront::new(inner, Some(k))).with_batch(64);
    const N: usize = 1 << 20;
    let (s1, s2, s3, dst) = (
        DeviceBuffer::new(N).unwrap(),
        DeviceBuffer::new(N).unwrap(),
        DeviceBuffer::new(N).unwrap(),
        DeviceBuffer::new(N).unwrap(),
    );
    let (p1, p2, p3) = (pattern(1, N), pattern(2, N), pattern(3, N));
    h2d(s1.ptr(), &p1);
    h2d(s2.ptr(), &p2);
    h2d(s3.ptr(), &p3);
    h2d(dst.ptr(), &vec![0u8; N]);
    let mut want = vec![0u8; N];
    for round in 0..10u64 {
        // 150 small copies from s1 (kernel), one of 512 KiB from s2 over the first half (copy
        // engine), 100 small ones from s3 over part of that half (kernel), 40 inline values.
        for i in 0..150usize {
            let o = i * 4096 + (round as usize % 7) * 8;
            // SAFETY: ranges inside live device buffers until the quiet below.
            unsafe {
                q.submit_device(dst.ptr() + o as u64, s1.ptr() + o as u64, 64)
                    .unwrap()
            };
            want[o..o + 64].copy_from_slice(&p1[o..o + 64]);
        }
        // SAFETY: as above.
        unsafe { q.submit_device(dst.ptr(), s2.ptr(), N / 2).unwrap() };
        want[..N / 2].copy_from_slice(&p2[..N / 2]);
        for i in 0..100usize {
            let o = i * 2048 + 16;
            // SAFETY: as above.
            unsafe {
                q.submit_device(dst.ptr() + o as u64, s3.ptr() + o as u64, 32)
                    .unwrap()
            };
            want[o..o + 32].copy_from_slice(&p3[o..o + 32]);
        }
        for i in 0..40usize {
            let o = N - 8 * (i + 1);
            let v = round * 1000 + i as u64;
            // SAFETY: the destination lives until the quiet; the value is taken at once.
            unsafe {
                q.submit_inline(
                    dst.ptr() + o as u64,
                    &v.to_le_bytes(),
                    Instant::now() + Duration::from_secs(10),
                )
                .unwrap()
            };
            want[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        q.quiet_for(Duration::from_secs(10)).unwrap();
        assert!(
            d2h(dst.ptr(), N) == want,
            "round {round}: bytes differ from submission order"
        );
    }
    let c = q.engine_mut().counts();
    assert!(
        c.kernel_copies > 0 && c.engine > 0,
        "both routes taken: {c:?}"
    );
    eprintln!("kernel front, 10 rounds of mixed copies: {c:?}");
}

/// The staged path's copies out of GPU memory (`cuda::memcpy_async` into page-locked slots, one
/// `cuda::copy_mark` for a batch, polled with `Event::done`): k = 200 small copies and 32 chunks of
/// 64 KiB land with one mark, the enqueuing thread never waits, and the time per copy is printed
/// next to one synchronous copy each (the path before).
#[test]
fn staged_copies_out_of_gpu_memory_are_marked_once_and_land() {
    if !cuda_context() {
        return;
    }
    for (k, size) in [(200usize, 8usize), (200, 4096), (32, 65472)] {
        let a = DeviceBuffer::new(k * size).unwrap();
        let src = pattern(23, k * size);
        h2d(a.ptr(), &src);
        // Send slots: 64 KiB apart, page-locked like the transport's send slab.
        let stride = 64 << 10;
        let mut slab = vec![0u8; k * stride];
        let _pin = cuda::HostPin::new(slab.as_mut_ptr(), slab.len());
        let (mut sync_best, mut async_best, mut enqueue_best) = (f64::MAX, f64::MAX, f64::MAX);
        for round in 0..10 {
            slab.fill(0);
            let t = Instant::now();
            for i in 0..k {
                // SAFETY: a slot of the slab and a chunk of the device buffer.
                unsafe {
                    cuda::memcpy(
                        slab.as_mut_ptr().add(i * stride) as *mut c_void,
                        (a.ptr() + (i * size) as u64) as *const c_void,
                        size,
                    )
                }
                .unwrap();
            }
            sync_best = sync_best.min(t.elapsed().as_secs_f64() * 1e6 / k as f64);
            slab.fill(0);
            let t = Instant::now();
            for i in 0..k {
                // SAFETY: as above; the slab outlives the mark, which is waited for below.
                unsafe {
                    cuda::memcpy_async(
                        slab.as_mut_ptr().add(i * stride) as *mut c_void,
                        (a.ptr() + (i * size) as u64) as *const c_void,
                        size,
                    )
                }
                .unwrap();
            }
            let mark = cuda::copy_mark(0).unwrap();
            enqueue_best = enqueue_best.min(t.elapsed().as_secs_f64() * 1e6 / k as f64);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !mark.done().unwrap() {
                assert!(Instant::now() < deadline, "copy mark not done after 10 s");
                std::hint::spin_loop();
            }
            async_best = async_best.min(t.elapsed().as_secs_f64() * 1e6 / k as f64);
            for i in 0..k {
                let got = &slab[i * stride..i * stride + size];
                assert!(
                    got == &src[i * size..(i + 1) * size],
                    "round {round}: copy {i} of {size} B wrong"
                );
            }
        }
        println!(
            "k={k} copies of {size} B out of GPU memory: one sync each {sync_best:.2} us/copy; \
             enqueued {enqueue_best:.2} us/copy, landed (one mark) {async_best:.2} us/copy (best of 10)"
        );
    }
}

#[test]
fn registration_decides_kind_and_exports_device_memory() {
    let Some((m, buf)) = mover_and_buffer() else {
        return;
    };
    let r = m.register(buf.ptr() + OFF, 1 << 20);
    assert_eq!(r.kind, Kind::Device);
    let d = r.ipc.unwrap_or_else(|| panic!("no export: {:?}", r.no_ipc));
    assert_eq!(d.alloc_base, buf.ptr());
    assert!(d.alloc_len >= LEN as u64);
    assert_eq!((d.region_base, d.region_len), (buf.ptr() + OFF, 1 << 20));
    assert_eq!(d.pid, std::process::id());
    assert_eq!(IpcDesc::decode(&d.encode()), Ok(Some(d)));
    let host = vec![0u8; 4096];
    assert_eq!(m.register(host.as_ptr() as u64, 4096).kind, Kind::Host);
}

/// A request for the tests (only its identity matters to the mover).
fn req(op: i32) -> AmoRequest {
    AmoRequest {
        pe: 1,
        op,
        elembytes: 8,
        val: 0,
        cmp: 0,
        retptr: 0,
        ret_handle: 0,
        ret_by_host: false,
        remote: (0, 0, 0),
        ep: 0,
    }
}

/// Every op on 8- and 4-byte words of `word`'s PE (`remote`: the same word mapped here), starting
/// from a value put through the copy queue just before (the kernel must run after it); checked
/// against the same ops done on the host. Returns the word's final value, after every kernel has
/// been settled.
fn kernel_ops_land(m: &Mover, pe: i32, d: &IpcDesc, word: u64, remote: u64, scratch: u64) -> u64 {
    let deadline = || Some(Instant::now() + Duration::from_secs(10));
    let start = 0x0f0f_0f0f_0f0f_0f0fu64;
    let mut last = 0;
    let ops: [(AmoOp, u64); 6] = [
        (AmoOp::Add, 5),
        (AmoOp::Xor, 0xff00),
        (AmoOp::And, 0xffff_0000_ffff_fff0),
        (AmoOp::Or, 0x1_0000_0000_0003),
        (AmoOp::Add, u64::MAX), // minus one, wrapping
        (AmoOp::Set, 0x1234_5678_9abc_def0),
    ];
    for size in [8u32, 4] {
        let mut want = start;
        let mask = if size == 8 { u64::MAX } else { 0xffff_ffff };
        // SAFETY: the word lies in the open region; the value is taken at once.
        unsafe { m.copy_inline(0, remote, &start.to_le_bytes()).unwrap() };
        for (i, &(op, v)) in ops.iter().enumerate() {
            let launched = m
                .kernel_amo(0, pe, d, word, op, size, v & mask, req(i as i32))
                .unwrap();
            assert_eq!(launched, Launch::Launched, "{op:?} on {size} bytes");
            want = match op {
                AmoOp::Add => (want & mask).wrapping_add(v & mask) & mask | (want & !mask),
                AmoOp::And => want & (v | !mask),
                AmoOp::Or => want | (v & mask),
                AmoOp::Xor => want ^ (v & mask),
                AmoOp::Set => (want & !mask) | (v & mask),
                AmoOp::Cas => unreachable!("not in the list"),
            };
        }
        let settled = m.amos().settle(0, deadline()).unwrap();
        assert!(settled.take_over.is_empty(), "taken over: {settled:?}");
        // SAFETY: both ranges live until quiet.
        unsafe { m.copy(0, scratch, remote, 8).unwrap() };
        m.quiet(0, Instant::now() + Duration::from_secs(10))
            .unwrap();
        let got = u64::from_le_bytes(d2h(scratch, 8).try_into().unwrap());
        assert_eq!(got, want, "{size}-byte ops: {got:#x}, want {want:#x}");
        last = got;
    }
    last
}

#[test]
fn kernel_atomics_apply_every_op_after_earlier_copies() {
    let Some((m, buf)) = mover_and_buffer() else {
        return;
    };
    m.set_peers(0, vec![HostId::local(), HostId::local()]);
    let d = m.register(buf.ptr(), LEN as u64).ipc.expect("export");
    m.prepare_kernel_amos(Duration::from_secs(10)).unwrap();
    assert!(m.amos().on());
    // A word of "PE 1" that is this process's own memory: resolve gives its own address.
    let word = buf.ptr() + 4096;
    let last = kernel_ops_land(&m, 1, &d, word, word, buf.ptr() + 8192);
    assert_eq!(m.amos().counts(), (12, 0));
    // Fetching ops: the old value into GPU memory (stored by the kernel) and into host memory
    // (through the slot, handed back by settle); compare-and-swap that matches and one that does
    // not.
    let dev_ret = buf.ptr() + 12288;
    let mut host_ret = Box::new(0u64);
    // The transport writes host results at settle; the mover only hands them back.
    let fetch = |op, retptr: u64, cmp| AmoRequest {
        retptr,
        cmp,
        ..req(op)
    };
    let host_ptr = &mut *host_ret as *mut u64 as u64;
    let launches = [
        (AmoOp::Add, 10, fetch(14, dev_ret, 0)),
        (AmoOp::Cas, 77, fetch(19, host_ptr, last + 10)),
        (AmoOp::Cas, 99, fetch(19, dev_ret + 8, 5)),
    ];
    for (op, v, r) in launches {
        assert_eq!(
            m.kernel_amo(0, 1, &d, word, op, 8, v, r).unwrap(),
            Launch::Launched
        );
    }
    let settled = m
        .amos()
        .settle(0, Some(Instant::now() + Duration::from_secs(10)))
        .unwrap();
    assert!(settled.take_over.is_empty());
    assert_eq!(
        settled.results.len(),
        1,
        "only the host-memory fetch comes back"
    );
    let (r, v) = settled.results[0];
    assert!(r.ret_by_host && r.retptr == host_ptr);
    assert_eq!(v, last + 10, "CAS fetched the value after the add");
    let got = d2h(dev_ret, 16);
    assert_eq!(
        u64::from_le_bytes(got[..8].try_into().unwrap()),
        last,
        "fetch-add's old value"
    );
    assert_eq!(
        u64::from_le_bytes(got[8..].try_into().unwrap()),
        77,
        "failed CAS's old value"
    );
    assert_eq!(
        d2h(word, 8),
        77u64.to_le_bytes(),
        "the matching CAS swapped, the other did not"
    );
    assert_eq!(*host_ret, 0, "the mover leaves host memory to its caller");
    // Outside the registered region: an error, nothing launched.
    assert!(m
        .kernel_amo(0, 1, &d, buf.ptr() + LEN as u64, AmoOp::Add, 8, 1, req(0))
        .is_err());
    m.close_peers();
}

/// A kernel that cannot start (its stream waits for a long run of copies) is taken over by the
/// host at the stuck limit (zero here): the host gets the request back, and the kernel, when it
/// runs, leaves the target alone and frees its slot.
#[test]
fn a_kernel_atomic_that_cannot_start_is_taken_over_and_applied_once() {
    if !cuda_context() {
        return;
    }
    let m = Mover::new(policy(), 2);
    m.set_context(cuda::current_context());
    m.set_peers(0, vec![HostId::local(), HostId::local()]);
    let big = 64usize << 20;
    let (a, b) = (
        DeviceBuffer::new(big).unwrap(),
        DeviceBuffer::new(big).unwrap(),
    );
    let target = DeviceBuffer::new(4096).unwrap();
    let d = m.register(target.ptr(), 4096).ipc.expect("export");
    m.prepare_kernel_amos(Duration::ZERO).unwrap();
    // About 4 GiB of device copies ahead of the kernel: milliseconds.
    for _ in 0..64 {
        // SAFETY: both buffers live until the quiet below.
        unsafe { m.copy(0, b.ptr(), a.ptr(), big).unwrap() };
    }
    let t = Instant::now();
    assert_eq!(
        m.kernel_amo(0, 1, &d, target.ptr(), AmoOp::Add, 8, 5, req(42))
            .unwrap(),
        Launch::Launched
    );
    let taken = m
        .amos()
        .settle(0, Some(Instant::now() + Duration::from_secs(10)))
        .unwrap()
        .take_over;
    let settled_in = t.elapsed();
    m.poll(0);
    assert!(
        m.outstanding(0) > 0,
        "the copies ended before the host looked ({settled_in:?}): nothing was tested"
    );
    assert_eq!(taken, vec![req(42)], "the host takes it over");
    m.quiet(0, Instant::now() + Duration::from_secs(30))
        .unwrap();
    // The kernel runs now, finds the host's flag and leaves the target alone.
    let t = Instant::now();
    loop {
        assert!(m.amos().settle(0, None).unwrap().take_over.is_empty());
        if m.amos().in_flight(0) == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the late kernel never ran"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        d2h(target.ptr(), 8),
        [0u8; 8],
        "the late kernel applied it too"
    );
    assert_eq!(m.amos().counts(), (0, 1));
    m.close_peers();
}

#[test]
fn the_copy_kernel_moves_a_batch_in_one_launch_and_a_claimed_one_not_at_all() {
    use super::kcopy::{Done, KernelCopies};
    if !cuda_context() {
        return;
    }
    let kernel = std::sync::Arc::new(
        crate::cuda::kernel::CopyKernel::load(cuda::current_context()).unwrap(),
    );
    let mut k = KernelCopies::<u32>::cuda(kernel, Duration::from_secs(10), Duration::ZERO).unwrap();
    k.check_claimed_launch(Instant::now() + Duration::from_secs(10))
        .unwrap();
    let len = 1usize << 20;
    let (src, dst) = (
        DeviceBuffer::new(len).unwrap(),
        DeviceBuffer::new(len).unwrap(),
    );
    let data = pattern(9, len);
    h2d(src.ptr(), &data);
    // Sizes and alignments of both kinds (16-byte words, bytes), then a full table of 8-byte ones.
    let mut copies = Vec::new();
    let mut off = 0u64;
    for (i, n) in [
        1usize, 8, 100, 4096, 65536, 17, 48, 3000, 32, 5008, 1000, 2000, 65536,
    ]
    .into_iter()
    .enumerate()
    {
        let o = off + (i as u64 % 3) * 5;
        copies.push((dst.ptr() + o, src.ptr() + o, n));
        off = (o + n as u64 + 64).next_multiple_of(16);
    }
    let small: Vec<_> = (0..crate::cuda::kernel::COPY_MAX as u64)
        .map(|i| {
            (
                dst.ptr() + (512 << 10) + i * 16,
                src.ptr() + (512 << 10) + i * 16,
                8,
            )
        })
        .collect();
    let mut out = Vec::new();
    let t = Instant::now();
    for (batch, tag) in [(&copies, 1u32), (&small, 2)] {
        // SAFETY: both buffers live until the launches are settled below.
        unsafe { k.launch(batch, tag, Instant::now()) }.unwrap();
    }
    while out.len() < 2 && t.elapsed() < Duration::from_secs(10) {
        k.settle(Instant::now(), &mut out);
    }
    eprintln!("two copy kernel launches settled in {:?}", t.elapsed());
    assert_eq!(out, vec![Done::Applied(0), Done::Applied(1)]);
    let got = d2h(dst.ptr(), len);
    let mut want = vec![0u8; len];
    for &(d, _, n) in copies.iter().chain(&small) {
        let o = (d - dst.ptr()) as usize;
        want[o..o + n].copy_from_slice(&data[o..o + n]);
    }
    assert!(
        got == want,
        "copied bytes differ (or bytes between copies were written)"
    );
    assert_eq!((k.launched, k.applied, k.taken_over), (2, 2, 0));
}

/// The copy kernel's atomic descriptors and fences on the GPU: an epoch of 96 adds on one word
/// from every warp (and copies beside them), then (fenced) a copy of that word, which must read
/// the sum of all 96; the other ops on 4- and 8-byte words; a fenced exchange, then (fenced) its
/// word copied out.
#[test]
fn the_copy_kernel_applies_atomics_and_keeps_its_fences() {
    use super::kcopy::{Done, KernelCopies};
    use crate::cuda::kernel::{amo_desc, AmoOp, DESC_FENCE};
    if !cuda_context() {
        return;
    }
    let kernel = std::sync::Arc::new(
        crate::cuda::kernel::CopyKernel::load(cuda::current_context()).unwrap(),
    );
    let mut k = KernelCopies::<u32>::cuda(kernel, Duration::from_secs(10), Duration::ZERO).unwrap();
    let len = 64usize << 10;
    let (src, dst) = (
        DeviceBuffer::new(len).unwrap(),
        DeviceBuffer::new(len).unwrap(),
    );
    let data = pattern(5, len);
    h2d(src.ptr(), &data);
    // Words at 32 KiB: w0 (sum), w1..w4 (and, or, xor, 4-byte add), w5 (exchange); copies out of
    // w0 and w5 land at 40 KiB and 40 KiB + 8.
    let w = |i: u64| dst.ptr() + (32 << 10) + i * 8;
    let mut init = vec![0u8; 48];
    for (i, v) in [0u64, 0b1100, 0b1100, 0b1100, 10, 7].iter().enumerate() {
        init[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    h2d(w(0), &init);
    let mut descs = Vec::new();
    for i in 0..96u64 {
        descs.push(amo_desc(w(0), AmoOp::Add, 8, 1));
        if i % 8 == 0 {
            descs.push((dst.ptr() + i * 64, src.ptr() + i * 64, 64));
        }
    }
    descs.push(amo_desc(w(1), AmoOp::And, 8, 0b1010));
    descs.push(amo_desc(w(2), AmoOp::Or, 8, 0b1010));
    descs.push(amo_desc(w(3), AmoOp::Xor, 8, 0b1010));
    descs.push(amo_desc(w(4), AmoOp::Add, 4, 0xffff_ffff_0000_0003));
    let (d, s, word) = (dst.ptr() + (40 << 10), w(0), 8usize);
    descs.push((d, s, word | DESC_FENCE));
    let (d, s, word) = amo_desc(w(5), AmoOp::Set, 8, 0x5555);
    descs.push((d, s, word | DESC_FENCE));
    descs.push((dst.ptr() + (40 << 10) + 8, w(5), 8 | DESC_FENCE));
    assert!(
        descs.len() <= crate::cuda::kernel::COPY_MAX,
        "{}",
        descs.len()
    );
    let mut out = Vec::new();
    let t = Instant::now();
    // SAFETY: both buffers live until the launch is settled below.
    unsafe { k.launch(&descs, 1, Instant::now()) }.unwrap();
    while out.is_empty() && t.elapsed() < Duration::from_secs(10) {
        k.settle(Instant::now(), &mut out);
    }
    eprintln!(
        "a launch of {} descriptors settled in {:?}",
        descs.len(),
        t.elapsed()
    );
    assert_eq!(out, vec![Done::Applied(0)]);
    let words = d2h(w(0), 48);
    let word_at = |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(word_at(0), 96, "adds lost");
    assert_eq!(
        (word_at(1), word_at(2), word_at(3)),
        (0b1000, 0b1110, 0b0110)
    );
    assert_eq!(
        word_at(4),
        13,
        "a 4-byte add takes the operand's low half, and only 4 bytes"
    );
    assert_eq!(word_at(5), 0x5555);
    let copied = d2h(dst.ptr() + (40 << 10), 16);
    let copied_at = |i: usize| u64::from_le_bytes(copied[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(
        copied_at(0),
        96,
        "the fenced copy ran before every add of the epoch landed"
    );
    assert_eq!(
        copied_at(1),
        0x5555,
        "the fenced copy ran before the exchange"
    );
    let got = d2h(dst.ptr(), 96 * 64);
    for i in (0..96).step_by(8) {
        assert_eq!(
            got[i * 64..i * 64 + 64],
            data[i * 64..i * 64 + 64],
            "copy {i}"
        );
    }
}

/// Starts the second process ([`ipc_child`]) on descriptor `d` and waits for it to succeed.
fn run_child(d: &IpcDesc) {
    let hex: String = d.encode().iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "mover::gpu_tests::ipc_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, hex)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the second process did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "second process failed: {status}");
}

/// The parent: exports a device buffer, starts a second process that opens it, gets a pattern
/// out of it, puts another pattern into it and reports its bandwidth; then checks the put.
#[test]
fn second_process_moves_data_through_ipc() {
    let Some((m, buf)) = mover_and_buffer() else {
        return;
    };
    let region = (LEN as u64 - 2 * OFF) as usize;
    h2d(buf.ptr() + OFF, &pattern(1, region));
    let d = m
        .register(buf.ptr() + OFF, region as u64)
        .ipc
        .expect("export");
    assert!(matches!(d.export, Export::Legacy { .. }), "{d:?}");
    run_child(&d);
    assert!(
        d2h(buf.ptr() + OFF, region) == pattern(2, region),
        "the second process's put did not land"
    );
    // The bytes around the region are untouched (zeroed at allocation).
    assert!(d2h(buf.ptr(), OFF as usize).iter().all(|&b| b == 0));
}

/// VMM memory (NVSHMEM's default heap): four allocations mapped back to back, created shareable
/// as POSIX descriptors; the region starts in the first and ends in the last. The second process
/// fetches the descriptors from this process's fd server, maps them, and moves data both ways.
#[test]
fn second_process_moves_data_through_vmm() {
    if !cuda_context() {
        return;
    }
    let m = Mover::new(policy(), 2);
    m.set_context(cuda::current_context());
    let buf = VmmBuffer::new(LEN / 4, 4, true).unwrap();
    let total = buf.size() as usize;
    // Zero the whole buffer (cuMemCreate memory is not zeroed).
    h2d(buf.ptr(), &vec![0u8; total]);
    let region = total - 2 * OFF as usize;
    h2d(buf.ptr() + OFF, &pattern(1, region));
    let r = m.register(buf.ptr() + OFF, region as u64);
    assert_eq!(r.kind, Kind::Device);
    let d = r.ipc.unwrap_or_else(|| panic!("no export: {:?}", r.no_ipc));
    let Export::Vmm {
        cookie,
        export_id,
        pieces,
    } = d.export
    else {
        panic!("VMM memory exported as {:?}", d.export);
    };
    assert_eq!(pieces, 4, "one piece per mapped allocation");
    assert_eq!((d.alloc_base, d.alloc_len), (buf.ptr(), buf.size()));
    assert_eq!(IpcDesc::decode(&d.encode()), Ok(Some(d)));
    run_child(&d);
    assert!(
        d2h(buf.ptr() + OFF, region) == pattern(2, region),
        "the second process's put did not land in the VMM region"
    );
    assert!(d2h(buf.ptr(), OFF as usize).iter().all(|&b| b == 0));
    assert!(d2h(buf.ptr() + (total as u64 - OFF), OFF as usize)
        .iter()
        .all(|&b| b == 0));
    // Released: the export is withdrawn (its descriptors closed).
    let pid = std::process::id();
    assert_eq!(
        fdshare::fetch(pid, cookie, export_id, Duration::from_secs(5))
            .map(|p| p.len())
            .unwrap(),
        4
    );
    m.unregister(buf.ptr() + OFF, region as u64);
    let e = fdshare::fetch(pid, cookie, export_id, Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    // Finalize stops the server.
    m.close_peers();
    assert!(fdshare::fetch(pid, cookie, export_id, Duration::from_secs(5)).is_err());
}

/// VMM memory created without a shareable handle type cannot be exported: registration says so and
/// peers take the staged path.
#[test]
fn vmm_memory_without_posix_descriptors_falls_back() {
    if !cuda_context() {
        return;
    }
    let m = Mover::new(policy(), 2);
    m.set_context(cuda::current_context());
    let buf = VmmBuffer::new(LEN, 1, false).unwrap();
    let r = m.register(buf.ptr(), buf.size());
    assert_eq!(r.kind, Kind::Device);
    assert_eq!(r.ipc, None);
    let why = r.no_ipc.expect("a reason");
    assert!(why.contains("POSIX file descriptor"), "{why}");
}

/// The second process of [`second_process_moves_data_through_ipc`] and
/// [`second_process_moves_data_through_vmm`] (ignored unless started by one).
#[test]
#[ignore = "started by second_process_moves_data_through_ipc"]
fn ipc_child() {
    let Ok(hex) = std::env::var(CHILD_ENV) else {
        panic!("run by second_process_moves_data_through_ipc or _vmm only");
    };
    assert!(cuda_context(), "the child needs the GPU its parent used");
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let d = IpcDesc::decode(&bytes).unwrap().expect("a descriptor");
    assert_ne!(d.pid, std::process::id());
    let m = Mover::new(policy(), 2);
    m.set_context(cuda::current_context());
    m.set_peers(0, vec![HostId::local(), HostId::local()]);
    let region = d.region_len as usize;
    let t = Instant::now();
    let remote = m
        .resolve(1, &d, d.region_base, d.region_len)
        .unwrap()
        .expect("the parent's export opens here");
    let open_time = t.elapsed();
    assert_eq!(m.means(1, Kind::Device, Kind::Device, true), Means::Ipc);
    // A second resolve reuses the mapping; lookup finds it without opening anything.
    assert_eq!(
        m.resolve(1, &d, d.region_base + 64, 64).unwrap(),
        Some(remote + 64)
    );
    assert_eq!(m.lookup(1, d.region_base + 64, 64), Some(remote + 64));
    assert_eq!(m.lookup(1, d.region_base, d.region_len), Some(remote));
    assert_eq!(m.lookup(1, d.region_base + d.region_len, 8), None);
    assert_eq!(
        m.lookup(0, d.region_base, 8),
        Some(d.region_base),
        "this PE: its own address"
    );
    let local = DeviceBuffer::new(region).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(10);
    // Get: remote -> local.
    // SAFETY: both ranges are live (the mapping stays open in `m`) until quiet.
    unsafe { m.copy(0, local.ptr(), remote, region).unwrap() };
    m.quiet(0, deadline()).unwrap();
    assert!(
        d2h(local.ptr(), region) == pattern(1, region),
        "get through IPC wrong"
    );
    // Bandwidth: puts of 1 MiB, 64 per quiet; and 8-byte put latency (submit + quiet).
    let mut report = String::new();
    for &size in &[8usize, 4096, 65536, 1 << 20, region] {
        let iters = if size >= 1 << 20 { 64 } else { 1000 };
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: as above.
            unsafe { m.copy(0, remote, local.ptr(), size).unwrap() };
        }
        m.quiet(0, deadline()).unwrap();
        let bw = t.elapsed();
        let t = Instant::now();
        for _ in 0..100 {
            // SAFETY: as above.
            unsafe { m.copy(0, remote, local.ptr(), size).unwrap() };
            m.quiet(0, deadline()).unwrap();
        }
        let lat = t.elapsed() / 100;
        report += &format!(
            "  {size:>9} B: {:8.2} GB/s streamed, {:8.1} us put+quiet\n",
            (size * iters) as f64 / bw.as_secs_f64() / 1e9,
            lat.as_secs_f64() * 1e6
        );
    }
    // Inline puts (values the caller reuses at once) land, in order with the other copies.
    let mut value = 0u64;
    for i in 0..2000u64 {
        value = 0x5a5a_0000_0000 + i;
        // SAFETY: the remote range is open; the value is taken before copy_inline returns.
        unsafe {
            m.copy_inline(0, remote + 8 * (i % 64), &value.to_le_bytes())
                .unwrap()
        };
    }
    // SAFETY: as above.
    unsafe { m.copy(0, local.ptr(), remote + 8 * (1999 % 64), 8).unwrap() };
    m.quiet(0, deadline()).unwrap();
    assert_eq!(d2h(local.ptr(), 8), value.to_le_bytes(), "inline put lost");
    // Kernel atomics on the parent's memory (this GPU's atomics through the mapping), then their
    // cost: one launch settled at once, and 1000 launches settled together.
    m.prepare_kernel_amos(Duration::from_secs(10)).unwrap();
    let before = kernel_ops_land(&m, 1, &d, d.region_base, remote, local.ptr());
    let settle = || {
        let settled = m
            .amos()
            .settle(0, Some(Instant::now() + Duration::from_secs(10)))
            .unwrap();
        assert!(settled.take_over.is_empty());
    };
    let t = Instant::now();
    for i in 0..1000 {
        assert_eq!(
            m.kernel_amo(0, 1, &d, d.region_base, AmoOp::Add, 8, 1, req(i))
                .unwrap(),
            Launch::Launched
        );
        settle();
    }
    let one = t.elapsed() / 1000;
    let t = Instant::now();
    for i in 0..1000 {
        // Slots run out at 256 pending: the mover declines, the caller settles and retries.
        while m
            .kernel_amo(0, 1, &d, d.region_base, AmoOp::Add, 8, 1, req(i))
            .unwrap()
            == Launch::NoSlot
        {
            settle();
        }
    }
    settle();
    let many = t.elapsed() / 1000;
    report += &format!(
        "  kernel atomic: {:8.1} us launch+settle, {:8.1} us each of 1000 settled together\n",
        one.as_secs_f64() * 1e6,
        many.as_secs_f64() * 1e6
    );
    // SAFETY: as above.
    unsafe { m.copy(0, local.ptr(), remote, 8).unwrap() };
    m.quiet(0, deadline()).unwrap();
    let want = before + 2000;
    assert_eq!(d2h(local.ptr(), 8), want.to_le_bytes(), "kernel adds lost");
    // Put the final pattern for the parent to check.
    h2d(local.ptr(), &pattern(2, region));
    // SAFETY: as above.
    unsafe { m.copy(1, remote, local.ptr(), region).unwrap() };
    m.quiet(1, deadline()).unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "{} open {open_time:?}; same-host copies through the mover:\n{report}{}",
        match d.export {
            Export::Legacy { .. } => "CUDA IPC",
            Export::Vmm { .. } => "CUDA VMM",
        },
        m.stats().summary()
    );
    m.close_peers();
}
