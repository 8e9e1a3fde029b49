//! A DeepEP-like burst on the software EFA queue: every PE writes hundreds of staged messages of a
//! few KiB to its peer at once (the dispatch pattern of DeepEP's low-latency kernels: one token
//! message per (token, expert), all posted before any completion is read), with the SQ deep
//! enough to hold them all. Checked: every WQE completes without error well inside the timeout and
//! every byte lands.
mod softq_common;

use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use softq_common::*;

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn burst(p: &nvshmem_efa_gda::fabric::Provider, msgs: u64, len: u64, staged: bool) {
    let depth = 1024u32;
    let n = 2usize;
    let heap = (2 * msgs * len + 4096) as usize;
    let mut cfg = config(GdaMode::Soft);
    cfg.gpu_staging = Some(staged);
    let pes = setup_with(p, n, heap, depth, 32, &cfg);
    // Source: the first half of each heap; destination: the second half of the peer's.
    for (j, pe) in pes.iter().enumerate() {
        // SAFETY: the first half of the heap belongs to this test's sources.
        unsafe { fill(pe.heap.ptr(), (msgs * len) as usize, 0x5eed + j as u64) };
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for (j, pe) in pes.iter().enumerate() {
            let pes = &pes;
            s.spawn(move || {
                let q = pe.gda.soft_queue().unwrap();
                let poster = HostPoster::new(q)
                    .unwrap()
                    .with_timeout(Duration::from_secs(30));
                let peer_pe = (j + 1) % n;
                let peer = pe.peer(peer_pe as i32);
                let lkey = pe.heap_lkey();
                let base = pes[peer_pe].heap.addr();
                let mut i = 0;
                while i < msgs {
                    let k = (msgs - i).min(32);
                    let descs: Vec<_> = (i..i + k)
                        .map(|m| {
                            write(
                                &peer,
                                pe.heap.addr() + m * len,
                                lkey,
                                base + msgs * len + m * len,
                                len as u32,
                                None,
                            )
                        })
                        .collect();
                    poster.post(&descs).unwrap();
                    i += k;
                }
                poster.quiet().unwrap();
                assert_eq!(
                    poster.errors(),
                    0,
                    "PE {j}: first error {:#x}",
                    poster.first_error()
                );
            });
        }
    });
    let took = start.elapsed();
    for (j, pe) in pes.iter().enumerate() {
        let src = (j + 1) % n;
        // SAFETY: every write into this half has completed.
        let bad = unsafe {
            check(
                pe.heap.ptr().add((msgs * len) as usize),
                (msgs * len) as usize,
                0x5eed + src as u64,
            )
        };
        assert!(
            bad.is_none(),
            "PE {j}: bytes from PE {src} wrong at {bad:?}"
        );
    }
    eprintln!(
        "{}: {msgs} x {len} B per PE both ways{} in {took:?}",
        p.name(),
        if staged { " (staged)" } else { "" }
    );
}

#[test]
fn burst_of_staged_token_messages() {
    let msgs = env_u64("SOFTQ_BURST_MSGS", 600);
    let len = env_u64("SOFTQ_BURST_LEN", 7232);
    for p in providers() {
        burst(&p, msgs, len, true);
    }
}

/// Doorbell liveness: many posters commit single WQEs concurrently and none calls quiet. Every
/// commit must still reach the doorbell (rung by its poster, or by the doorbell lock's holder of
/// that moment), so the doorbell ends equal to the reservation counter and every write lands.
#[test]
fn every_commit_is_rung_without_quiet() {
    let posters = 8u64;
    let per = 300u64;
    let len = 64u64;
    let msgs = posters * per;
    for p in providers() {
        let heap = (2 * msgs * len + 4096) as usize;
        let pes = setup_with(&p, 2, heap, 64, 4, &config(GdaMode::Soft));
        let pe = &pes[0];
        // SAFETY: the first half of the heap belongs to this test's sources.
        unsafe { fill(pe.heap.ptr(), (msgs * len) as usize, 0xd00b) };
        let q = pe.gda.soft_queue().unwrap();
        let peer = pe.peer(1);
        let lkey = pe.heap_lkey();
        let dst = pes[1].heap.addr() + msgs * len;
        std::thread::scope(|s| {
            for t in 0..posters {
                let peer = &peer;
                s.spawn(move || {
                    let poster = HostPoster::new(q)
                        .unwrap()
                        .with_timeout(Duration::from_secs(30));
                    for i in 0..per {
                        let m = i * posters + t;
                        let d = write(
                            peer,
                            pe.heap.addr() + m * len,
                            lkey,
                            dst + m * len,
                            len as u32,
                            None,
                        );
                        poster.post(&[d]).unwrap();
                    }
                });
            }
        });
        let poster = HostPoster::new(q).unwrap();
        let resv = poster.resv();
        assert_eq!(resv, msgs, "{}: reservations", p.name());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // SAFETY: the doorbell record lives in the queue's ring memory.
            let db = unsafe { std::ptr::read_volatile(poster.view().doorbell) };
            if db == resv as u32 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: doorbell stuck at {db}, {resv} WQEs committed",
                p.name()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        poster.quiet().unwrap();
        assert_eq!(
            poster.errors(),
            0,
            "{}: first error {:#x}",
            p.name(),
            poster.first_error()
        );
        // SAFETY: every write has completed (quiet).
        let bad = unsafe {
            check(
                pes[1].heap.ptr().add((msgs * len) as usize),
                (msgs * len) as usize,
                0xd00b,
            )
        };
        assert!(bad.is_none(), "{}: bytes wrong at {bad:?}", p.name());
    }
}
