//! A symmetric heap registered in several chunks (as NVSHMEM's VMM heap is): every chunk of every PE
//! is addressable through the published heap-key table, puts and AMOs land in each chunk (the last
//! granule included), an access outside a chunk or to a released chunk completes with an error, the
//! table grows when a later chunk lies past its capacity, and ordering holds for "puts, quiet, then
//! a barrier, then the peer reads". Software queue, tcp and shm; PEs as threads with their own
//! fabric, domain and GDA endpoint, and (`multi_process_*`) as separate processes exchanging names
//! and chunk keys through files; a CPU poster plays the GPU.
#[path = "fabric_common.rs"]
mod common;
mod softq_common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::efa::cqe::CqStatus;
use nvshmem_efa_gda::efa::wqe::{LocalBuf, RemoteBuf, WqeOp};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::CtrlPlacement;
use nvshmem_efa_gda::gda::state::{NvshmemEfaGdaHeapKey, NVSHMEM_EFA_GDA_STATE_VERSION};
use nvshmem_efa_gda::gda::wire::{self, AmoMsg};
use nvshmem_efa_gda::gda::{Gda, GdaOptions};
use softq_common::*;

const LOG2: u32 = 16;
const G: u64 = 1 << LOG2;
/// Chunks as heap offsets [start, end): three of different sizes, back to back.
const CHUNKS: [(u64, u64); 3] = [(0, 2 * G), (2 * G, 3 * G), (3 * G, 6 * G)];
/// A chunk added later, past the table's first capacity (growth).
const LATE: (u64, u64) = (6 * G, 20 * G);

struct ChunkPe {
    gda: Gda,
    /// One allocation per chunk (VMM chunks are separate registrations).
    mem: Vec<HostBuf>,
    pe: i32,
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// `n` connected PEs whose heaps are `CHUNKS`, registered chunk by chunk as the transport does.
fn setup_chunks(p: &nvshmem_efa_gda::fabric::Provider, n: usize) -> Vec<ChunkPe> {
    let cfg = config(nvshmem_efa_gda::config::GdaMode::Soft);
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Host,
        sq_depth: Some(64),
        max_batch: Some(8),
    };
    let mut pes: Vec<ChunkPe> = (0..n)
        .map(|i| ChunkPe {
            gda: Gda::new(&domain(p).expect("domain"), &cfg, &opts).expect("GDA context"),
            mem: CHUNKS
                .iter()
                .map(|(s, e)| HostBuf::new((e - s) as usize))
                .collect(),
            pe: i as i32,
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
        pe.gda.connect(pe.pe, n as i32, &all, None).unwrap();
    }
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        add_chunk(&mut pes, c, s, e);
    }
    pes
}

/// Registers chunk `c` ([s, e), memory `mem[c]`) on every PE, then records every PE's on every PE.
fn add_chunk(pes: &mut [ChunkPe], c: usize, s: u64, e: u64) {
    for pe in pes.iter_mut() {
        let base = pe.mem[c].addr();
        // SAFETY: the memory lives in `pe.mem`, which outlives the context (dropped after it).
        unsafe { pe.gda.add_local_heap_chunk(s, e, base, None, LOG2) }.unwrap();
    }
    let remote: Vec<(u64, u64)> = pes
        .iter()
        .map(|p| (p.mem[c].addr(), p.gda.local_chunk_key(s).unwrap()))
        .collect();
    for pe in pes.iter_mut() {
        for (j, &(addr, key)) in remote.iter().enumerate() {
            pe.gda
                .add_remote_heap_chunk(j as i32, s, e, addr, key, LOG2)
                .unwrap();
        }
    }
}

/// The published entry of `row` for heap offset `off` (read where kernels read it: through the
/// state's `heap_keys` pointer, host memory here).
fn entry(pe: &ChunkPe, row: usize, off: u64) -> NvshmemEfaGdaHeapKey {
    let st = pe.gda.device_state().unwrap();
    assert_ne!(st.heap_keys, 0);
    let i = row as u64 * u64::from(st.key_stride) + (off >> st.log2_granularity);
    // SAFETY: the published table holds (n_pes + 1) * key_stride entries; i is inside (off below
    // the stride's reach in every caller).
    unsafe { *(st.heap_keys as *const NvshmemEfaGdaHeapKey).add(i as usize) }
}

/// Remote address and rkey of heap offset `off` on `pe` as a kernel computes them; local address and
/// lkey of `off` here.
fn remote_of(me: &ChunkPe, pe: usize, off: u64) -> (u64, u32) {
    let e = entry(me, pe, off);
    assert_eq!(e.flags, 1, "offset {off:#x} of PE {pe} has no chunk");
    (e.addr + (off - e.start), e.key)
}
fn local_of(me: &ChunkPe, off: u64) -> (u64, u32) {
    let n = me.gda.device_state().unwrap().n_pes as usize;
    remote_of(me, n, off)
}

fn put(
    me: &ChunkPe,
    to: usize,
    loff: u64,
    roff: u64,
    len: u32,
) -> nvshmem_efa_gda::efa::wqe::WqeDesc {
    let peer = me.gda.peers()[to];
    let (la, lk) = local_of(me, loff);
    let (ra, rk) = remote_of(me, to, roff);
    raw_put(&peer, la, lk, ra, rk, len)
}

fn raw_put(
    peer: &nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer,
    la: u64,
    lk: u32,
    ra: u64,
    rk: u32,
    len: u32,
) -> nvshmem_efa_gda::efa::wqe::WqeDesc {
    desc(
        peer,
        WqeOp::RdmaWrite {
            remote: RemoteBuf {
                addr: ra,
                rkey: rk,
                len,
            },
            local: LocalBuf {
                addr: la,
                lkey: lk,
                len,
            },
        },
    )
}

fn amo_add(me: &ChunkPe, to: usize, off: u64, v: u64) -> nvshmem_efa_gda::efa::wqe::WqeDesc {
    let m = AmoMsg {
        op: wire::AMO_OP_ADD,
        size: 8,
        offset: off,
        value: v,
        flags: 0,
    };
    send_inline(&me.gda.peers()[to], &m.encode(), None)
}

/// The host address of heap offset `off` on `pe`.
fn at(pe: &ChunkPe, off: u64) -> *mut u8 {
    let c = CHUNKS
        .iter()
        .chain(std::iter::once(&LATE))
        .position(|&(s, e)| off >= s && off < e)
        .unwrap();
    let s = if c < CHUNKS.len() {
        CHUNKS[c].0
    } else {
        LATE.0
    };
    // SAFETY: off lies in chunk c's allocation.
    unsafe { pe.mem[c].ptr().add((off - s) as usize) }
}

fn read_u64(pe: &ChunkPe, off: u64) -> u64 {
    // SAFETY: 8 bytes inside a chunk, written by the consumer thread (volatile read).
    unsafe { std::ptr::read_volatile(at(pe, off) as *const u64) }
}

#[test]
fn table_layout_and_keys() {
    for p in providers() {
        let pes = setup_chunks(&p, 2);
        for me in &pes {
            let st = me.gda.device_state().unwrap();
            assert_eq!(st.version, NVSHMEM_EFA_GDA_STATE_VERSION);
            assert_eq!(st.version, 3);
            assert_eq!(st.ready, 1, "every row has a chunk");
            assert_eq!(st.log2_granularity, LOG2);
            assert_eq!(st.n_granules, 6);
            assert!(st.key_stride >= 6);
            assert_eq!(st.heap_size, 6 * G);
            assert_eq!(st.heap_base, me.mem[0].addr());
            for (c, &(s, e)) in CHUNKS.iter().enumerate() {
                for g in s / G..e / G {
                    // Remote rows: soft rkey 1 + chunk ordinal (start granule), the peer's address.
                    for (j, other) in pes.iter().enumerate() {
                        let k = entry(me, j, g * G);
                        assert_eq!((k.start, k.end, k.flags), (s, e, 1));
                        assert_eq!(k.addr, other.mem[c].addr());
                        assert_eq!(k.key, wire::SOFT_RKEY_HEAP + (s >> LOG2) as u32);
                    }
                    // Local row: this PE's address and a soft lkey per chunk.
                    let k = entry(me, 2, g * G);
                    assert_eq!((k.start, k.end, k.addr), (s, e, me.mem[c].addr()));
                    assert!(k.key >= wire::SOFT_LKEY_FIRST);
                }
            }
            let lkeys: Vec<u32> = CHUNKS.iter().map(|c| entry(me, 2, c.0).key).collect();
            assert!(lkeys[0] != lkeys[1] && lkeys[1] != lkeys[2] && lkeys[0] != lkeys[2]);
            // The version-1 fields stay "chunk 0".
            assert_eq!(st.heap_lkey, lkeys[0]);
            let peer = me.gda.peers()[1];
            assert_eq!(peer.heap_base, pes[1].mem[0].addr());
            assert_eq!(peer.heap_rkey, wire::SOFT_RKEY_HEAP);
            assert_eq!(peer.heap_size, 6 * G);
        }
    }
}

#[test]
fn puts_and_amos_into_every_chunk() {
    for p in providers() {
        let pes = setup_chunks(&p, 2);
        let (a, b) = (&pes[0], &pes[1]);
        let poster = HostPoster::new(a.gda.soft_queue().unwrap()).unwrap();
        for (c, &(s, e)) in CHUNKS.iter().enumerate() {
            // The first and the last granule of the chunk, the last one up to its very last byte.
            for roff in [s, e - G, e - 256] {
                let seed = roff ^ (c as u64) << 40;
                // Source: the last granule of the same chunk here.
                let loff = e - 512;
                // SAFETY: 256 bytes inside chunk c here.
                unsafe { fill(at(a, loff), 256, seed) };
                let errs = poster.errors();
                poster.post(&[put(a, 1, loff, roff, 256)]).unwrap();
                assert_eq!(
                    poster.quiet().unwrap(),
                    errs,
                    "put into chunk {c} at {roff:#x}"
                );
                // SAFETY: 256 bytes inside chunk c on PE 1.
                assert_eq!(
                    unsafe { check(at(b, roff), 256, seed) },
                    None,
                    "chunk {c} {roff:#x}"
                );
            }
            // A put that crosses from the local chunk into the next one is refused (the kernel
            // splits there); on the remote side, one past the chunk's end too.
            if c + 1 < CHUNKS.len() {
                let (la, lk) = local_of(a, e - 128);
                let (ra, rk) = remote_of(a, 1, s);
                let errs = poster.errors();
                poster
                    .post(&[raw_put(&a.gda.peers()[1], la, lk, ra, rk, 256)])
                    .unwrap();
                assert_eq!(
                    poster.quiet().unwrap(),
                    errs + 1,
                    "local range across chunks"
                );
            }
            let (ra, rk) = remote_of(a, 1, e - 128);
            let (la, lk) = local_of(a, s);
            let errs = poster.errors();
            poster
                .post(&[raw_put(&a.gda.peers()[1], la, lk, ra, rk, 256)])
                .unwrap();
            assert_eq!(
                poster.quiet().unwrap(),
                errs + 1,
                "remote range past chunk {c}"
            );
            // The first failure of this queue was the local range across chunks 0 and 1.
            assert_eq!(poster.first_error() as u8, CqStatus::LocalInvalidLkey as u8);
            // AMOs at the first and last word of each chunk, applied by PE 1's consumer.
            for off in [s, e - 8] {
                let before = read_u64(b, off);
                for _ in 0..3 {
                    poster.post(&[amo_add(a, 1, off, 5)]).unwrap();
                }
                let errs = poster.errors();
                assert_eq!(poster.quiet().unwrap(), errs);
                wait_until("AMOs applied", || {
                    read_u64(b, off) == before.wrapping_add(15)
                });
            }
        }
        // An rkey naming no chunk, and an AMO past the heap, complete with errors.
        let (la, lk) = local_of(a, 0);
        let errs = poster.errors();
        poster
            .post(&[raw_put(&a.gda.peers()[1], la, lk, b.mem[0].addr(), 1000, 8)])
            .unwrap();
        assert_eq!(
            poster.quiet().unwrap(),
            errs + 1,
            "rkey naming no chunk ({p})"
        );
        poster.post(&[amo_add(a, 1, 6 * G, 1)]).unwrap();
        assert_eq!(poster.quiet().unwrap(), errs + 2, "AMO past the heap ({p})");
    }
}

#[test]
fn release_and_growth() {
    for p in providers() {
        let mut pes = setup_chunks(&p, 2);
        // Release chunk 1 on both PEs (collective, as NVSHMEM frees a chunk).
        let (s1, e1) = CHUNKS[1];
        for pe in pes.iter_mut() {
            assert!(pe.gda.remove_heap_chunk(s1).unwrap());
            assert!(!pe.gda.remove_heap_chunk(s1).unwrap(), "released once");
        }
        {
            let a = &pes[0];
            for row in 0..3 {
                assert_eq!(entry(a, row, s1).flags, 0, "row {row} cleared");
                assert_eq!(entry(a, row, CHUNKS[2].0).flags, 1, "other chunks stay");
            }
            let poster = HostPoster::new(a.gda.soft_queue().unwrap()).unwrap();
            let errs = poster.errors();
            // The old rkey of chunk 1 now names nothing; an AMO into it is refused.
            let (la, lk) = local_of(a, 0);
            let rk = wire::SOFT_RKEY_HEAP + (s1 >> LOG2) as u32;
            poster
                .post(&[raw_put(
                    &a.gda.peers()[1],
                    la,
                    lk,
                    pes[1].mem[1].addr(),
                    rk,
                    64,
                )])
                .unwrap();
            poster.post(&[amo_add(a, 1, e1 - 8, 1)]).unwrap();
            assert_eq!(poster.quiet().unwrap(), errs + 2);
        }
        // A later chunk past the table's capacity: the table moves, the old one stays readable.
        let st0 = pes[0].gda.device_state().unwrap();
        for pe in pes.iter_mut() {
            pe.mem.push(HostBuf::new((LATE.1 - LATE.0) as usize));
        }
        add_chunk(&mut pes, 3, LATE.0, LATE.1);
        let st1 = pes[0].gda.device_state().unwrap();
        assert!(st1.key_stride as u64 >= LATE.1 / G);
        assert_ne!(
            st1.heap_keys, st0.heap_keys,
            "grown table is a new allocation"
        );
        assert_eq!(st1.n_granules as u64, LATE.1 / G);
        // SAFETY: the old table is kept until the context goes; entry 0 (row 0, granule 0).
        let old = unsafe { *(st0.heap_keys as *const NvshmemEfaGdaHeapKey) };
        assert_eq!((old.start, old.flags), (0, 1));
        let (a, b) = (&pes[0], &pes[1]);
        let poster = HostPoster::new(a.gda.soft_queue().unwrap()).unwrap();
        let roff = LATE.1 - 64;
        // SAFETY: 64 bytes inside the late chunk here.
        unsafe { fill(at(a, LATE.0), 64, 99) };
        let errs = poster.errors();
        poster.post(&[put(a, 1, LATE.0, roff, 64)]).unwrap();
        poster.post(&[amo_add(a, 1, LATE.0 + 8, 7)]).unwrap();
        assert_eq!(poster.quiet().unwrap(), errs);
        // SAFETY: inside the late chunk on PE 1.
        assert_eq!(unsafe { check(at(b, roff), 64, 99) }, None);
        wait_until("AMO in the late chunk", || read_u64(b, LATE.0 + 8) == 7);
    }
}

/// Ordering of "GDA puts, our quiet, then a barrier, then the peer reads" (what DeepEP's clean
/// kernel relies on through `nvshmemx_barrier_all_block` = our quiet + NVSHMEM's barrier): once
/// quiet returned on the writer, a reader that passes the barrier after it sees every byte.
#[test]
fn quiet_then_barrier_orders_puts() {
    for p in providers() {
        let pes = Arc::new(setup_chunks(&p, 2));
        let barrier = Arc::new(Barrier::new(2));
        let rounds = 20u64;
        std::thread::scope(|sc| {
            let (pw, bw) = (pes.clone(), barrier.clone());
            sc.spawn(move || {
                let a = &pw[0];
                let poster = HostPoster::new(a.gda.soft_queue().unwrap()).unwrap();
                for r in 0..rounds {
                    let mut ds = Vec::new();
                    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
                        let src = e - 1024;
                        // SAFETY: 1 KiB inside chunk c here, not in flight (previous round quieted).
                        unsafe { fill(at(a, src), 1024, r * 16 + c as u64) };
                        ds.push(put(a, 1, src, s + 4096, 1024));
                    }
                    poster.post(&ds).unwrap();
                    assert_eq!(poster.quiet().unwrap(), 0);
                    bw.wait(); // the barrier after quiet
                    bw.wait(); // the reader checked
                }
            });
            let (pr, br) = (pes.clone(), barrier.clone());
            sc.spawn(move || {
                let b = &pr[1];
                for r in 0..rounds {
                    br.wait();
                    for (c, &(s, _)) in CHUNKS.iter().enumerate() {
                        // SAFETY: 1 KiB inside chunk c on PE 1; the writer is idle until the
                        // next barrier.
                        let bad = unsafe { check(at(b, s + 4096), 1024, r * 16 + c as u64) };
                        assert_eq!(
                            bad, None,
                            "round {r} chunk {c}: data not there after the barrier"
                        );
                    }
                    br.wait();
                }
            });
        });
    }
}

// ---- several processes ----------------------------------------------------------------------------

const MP_RANKS: usize = 3;

fn mp_run(provider: &str) {
    mp_run_child(provider, "mp_child");
}

fn mp_run_child(provider: &str, child: &str) {
    let dir = common::TempDir::new(&format!("gda-chunks-{provider}"));
    let specs = (0..MP_RANKS)
        .map(|rank| common::ChildSpec {
            rank,
            env: vec![("FI_TCP_IFACE".into(), "lo".into())],
            prefix: Vec::new(),
        })
        .collect();
    common::run_children(
        child,
        dir.path(),
        MP_RANKS,
        provider,
        specs,
        Duration::from_secs(120),
    );
}

/// Waits for `name{rank}` of every rank.
fn mp_gather(env: &common::ChildEnv, name: &str) -> Vec<std::collections::HashMap<String, String>> {
    let deadline = Instant::now() + common::WAIT;
    (0..env.nranks)
        .map(|r| {
            let s = common::wait_file(&env.dir, &format!("{name}{r}"), deadline, || {
                assert!(
                    !env.dir.join("abort").exists(),
                    "another rank aborted: {}",
                    std::fs::read_to_string(env.dir.join("abort")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(2));
            })
            .unwrap();
            common::decode_record(&s)
        })
        .collect()
}

fn seed(from: usize, c: usize, at: u64) -> u64 {
    ((from as u64) << 56) ^ ((c as u64) << 48) ^ at
}

/// One rank: chunks registered one by one, every PE's chunks recorded, then puts into the right
/// neighbour's every chunk (first and last granule) and AMO adds into every other rank's every chunk
/// (last word), quiet, a file barrier, and the checks of what the left neighbour and every rank
/// wrote here.
#[test]
fn mp_child() {
    let Some(env) = common::ChildEnv::from_env() else {
        return;
    };
    let (me, n) = (env.rank, env.nranks);
    let cfg = config(nvshmem_efa_gda::config::GdaMode::Soft);
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Host,
        sq_depth: Some(64),
        max_batch: Some(8),
    };
    let mut pe = ChunkPe {
        gda: Gda::new(&domain(&env.provider).expect("domain"), &cfg, &opts).expect("GDA context"),
        mem: CHUNKS
            .iter()
            .map(|(s, e)| HostBuf::new((e - s) as usize))
            .collect(),
        pe: me as i32,
    };
    let name = pe.gda.address().unwrap();
    common::write_atomic(
        &env.dir,
        &format!("name{me}"),
        &common::encode_record(&[("name", common::hex(&name))]),
    );
    let names: Vec<Vec<u8>> = mp_gather(&env, "name")
        .iter()
        .map(|r| common::unhex(&r["name"]))
        .collect();
    let len = names.iter().map(|x| x.len()).max().unwrap();
    let mut all = Vec::new();
    for nm in &names {
        let mut x = nm.clone();
        x.resize(len, 0);
        all.extend_from_slice(&x);
    }
    pe.gda.connect(me as i32, n as i32, &all, None).unwrap();
    let mut rec = Vec::new();
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        // SAFETY: the memory lives in `pe.mem`, dropped after the context.
        unsafe {
            pe.gda
                .add_local_heap_chunk(s, e, pe.mem[c].addr(), None, LOG2)
        }
        .unwrap();
        rec.push((format!("addr{c}"), pe.mem[c].addr().to_string()));
        rec.push((
            format!("key{c}"),
            pe.gda.local_chunk_key(s).unwrap().to_string(),
        ));
    }
    let rec: Vec<(&str, String)> = rec.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    common::write_atomic(
        &env.dir,
        &format!("chunks{me}"),
        &common::encode_record(&rec),
    );
    let chunks = mp_gather(&env, "chunks");
    for (j, r) in chunks.iter().enumerate() {
        for (c, &(s, e)) in CHUNKS.iter().enumerate() {
            let addr: u64 = r[&format!("addr{c}")].parse().unwrap();
            let key: u64 = r[&format!("key{c}")].parse().unwrap();
            pe.gda
                .add_remote_heap_chunk(j as i32, s, e, addr, key, LOG2)
                .unwrap();
        }
    }
    let st = pe.gda.device_state().unwrap();
    assert_eq!((st.ready, st.version, st.n_granules), (1, 3, 6));

    let poster = HostPoster::new(pe.gda.soft_queue().unwrap()).unwrap();
    let right = (me + 1) % n;
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        for (k, at_off) in [s, e - 512].into_iter().enumerate() {
            // 504 bytes (the last put ends at the chunk's last word, the AMOs' target). Source: a
            // 512-byte slot of this chunk here that no put or AMO targets, one per target slot.
            let src = s + 1024 + 512 * k as u64;
            // SAFETY: 504 bytes inside chunk c here, not in flight.
            unsafe { fill(at(&pe, src), 504, seed(me, c, at_off)) };
            poster.post(&[put(&pe, right, src, at_off, 504)]).unwrap();
        }
        for other in (0..n).filter(|&o| o != me) {
            poster
                .post(&[amo_add(&pe, other, e - 8, me as u64 + 1)])
                .unwrap();
        }
    }
    let errs = poster.quiet().unwrap();
    assert_eq!(
        errs,
        0,
        "error completions (first status {})",
        poster.first_error()
    );
    // The barrier after quiet: every rank's puts are in place once every rank wrote its file.
    common::write_atomic(&env.dir, &format!("quiet{me}"), "done=1\n");
    mp_gather(&env, "quiet");
    let left = (me + n - 1) % n;
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        for at_off in [s, e - 512] {
            // SAFETY: 504 bytes inside chunk c here; the left neighbour wrote them before the barrier.
            let bad = unsafe { check(at(&pe, at_off), 504, seed(left, c, at_off)) };
            assert_eq!(bad, None, "chunk {c} at {at_off:#x}: PE {left}'s put");
        }
    }
    // AMO messages are applied by this rank's consumer thread as they arrive.
    let want_amos = (CHUNKS.len() * (n - 1)) as u64;
    wait_until("AMOs applied", || {
        pe.gda.soft_queue().unwrap().stats().amos_applied >= want_amos
    });
    let sum: u64 = (0..n).filter(|&o| o != me).map(|o| o as u64 + 1).sum();
    for (c, &(_, e)) in CHUNKS.iter().enumerate() {
        assert_eq!(read_u64(&pe, e - 8), sum, "AMO sum in chunk {c}");
    }
    // Nobody tears down before everybody checked.
    common::write_atomic(&env.dir, &format!("checked{me}"), "done=1\n");
    mp_gather(&env, "checked");
    drop(poster);
    println!("{}", common::ok_marker(me));
}

#[test]
fn multi_process_tcp() {
    mp_run("tcp");
}

#[test]
fn multi_process_shm() {
    mp_run("shm");
}

/// The chunk calls of the C API refuse bad input and answer "not initialised" before GDA is.
#[test]
fn c_api_chunk_calls_check_their_input() {
    use nvshmem_efa_gda::capi::gda::{
        nvshmemt_efa_gda_add_local_heap_chunk, nvshmemt_efa_gda_add_remote_heap_chunk,
        nvshmemt_efa_gda_remove_heap_chunk,
    };
    use nvshmem_efa_gda::capi::{
        NVSHMEM_EFA_ERROR_INVALID_VALUE, NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
    };
    let einval = NVSHMEM_EFA_ERROR_INVALID_VALUE;
    // SAFETY: null base: refused before anything is touched.
    let rc = unsafe {
        nvshmemt_efa_gda_add_local_heap_chunk(
            0,
            G,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            LOG2,
        )
    };
    assert_eq!(rc, einval);
    let buf = HostBuf::new(G as usize);
    // SAFETY: end before start: refused.
    let rc = unsafe {
        nvshmemt_efa_gda_add_local_heap_chunk(
            G,
            0,
            buf.ptr() as *mut std::ffi::c_void,
            std::ptr::null_mut(),
            LOG2,
        )
    };
    assert_eq!(rc, einval);
    assert_eq!(
        nvshmemt_efa_gda_add_remote_heap_chunk(-1, 0, G, 0x1000, 1, LOG2),
        einval
    );
    assert_eq!(
        nvshmemt_efa_gda_add_remote_heap_chunk(0, G, G, 0x1000, 1, LOG2),
        einval
    );
    assert_eq!(
        nvshmemt_efa_gda_add_remote_heap_chunk(0, 0, G, 0, 1, LOG2),
        einval
    );
    // Well-formed, but GDA is not initialised in this process.
    let enodev = NVSHMEM_EFA_ERROR_NOT_INITIALIZED;
    assert_eq!(
        nvshmemt_efa_gda_add_remote_heap_chunk(0, 0, G, 0x1000, 1, LOG2),
        enodev
    );
    assert_eq!(nvshmemt_efa_gda_remove_heap_chunk(0), enodev);
    // SAFETY: this thread's NUL-terminated text, read before the next failing call.
    let text =
        unsafe { std::ffi::CStr::from_ptr(nvshmem_efa_gda::capi::nvshmem_efa_gda_last_error()) };
    assert_eq!(
        text.to_str().unwrap(),
        "nvshmemt_efa_gda_remove_heap_chunk: GDA is not initialised (-19)"
    );
    // SAFETY: a live buffer; refused (not initialised) without being registered.
    let rc = unsafe {
        nvshmemt_efa_gda_add_local_heap_chunk(
            0,
            G,
            buf.ptr() as *mut std::ffi::c_void,
            std::ptr::null_mut(),
            LOG2,
        )
    };
    assert_eq!(rc, enodev);
}

// ---- through the transport: get_mem_handle per chunk, add_device_remote_mem_handles per chunk ----

/// One rank of the transport path, as NVSHMEM drives it with a VMM heap: the heap (one range) is
/// registered chunk by chunk with `get_mem_handle`, every PE's handle of a chunk is passed to
/// `add_device_remote_mem_handles` with the chunk's heap offset and size; the published table then
/// holds every chunk of every PE, a chunk NVSHMEM misdescribes is refused, and a released chunk
/// leaves the table.
#[test]
fn transport_child() {
    use nvshmem_efa_gda::nvshmem::abi::{MemHandle, MEM_HANDLE_SIZE};
    use nvshmem_efa_gda::nvshmem::Transport;
    let Some(env) = common::ChildEnv::from_env() else {
        return;
    };
    let (me, n) = (env.rank, env.nranks);
    let mut vars = std::collections::HashMap::new();
    vars.insert("NVSHMEM_LIBFABRIC_PROVIDER", env.provider.to_string());
    vars.insert("NVSHMEM_EFA_GDA", "soft".to_string());
    let cfg = nvshmem_efa_gda::config::Config::from_lookup(|k| vars.get(k).cloned()).unwrap();
    let t = Arc::new(Transport::new(cfg).expect("transport"));
    let round = std::cell::Cell::new(0usize);
    let ag = |send: &[u8], recv: &mut [u8]| {
        let r = round.get();
        round.set(r + 1);
        common::write_atomic(
            &env.dir,
            &format!("ag{r}_{me}"),
            &common::encode_record(&[("b", common::hex(send))]),
        );
        for (j, rec) in mp_gather(&env, &format!("ag{r}_")).iter().enumerate() {
            recv[j * send.len()..(j + 1) * send.len()].copy_from_slice(&common::unhex(&rec["b"]));
        }
        Ok(())
    };
    let heap = HostBuf::new(LATE.0 as usize);
    let base = heap.addr();
    common::write_atomic(
        &env.dir,
        &format!("name{me}"),
        &common::encode_record(&[("base", base.to_string())]),
    );
    t.connect(me as i32, n as i32, &ag).expect("connect");
    let new_handle = || MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    };
    let mut mine: Vec<MemHandle> = CHUNKS.iter().map(|_| new_handle()).collect();
    let mut all: Vec<Vec<MemHandle>> = Vec::new();
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        // SAFETY: the heap outlives the transport's registrations (released or finalized below).
        unsafe {
            t.get_mem_handle(&mut mine[c], (base + s) as *mut _, (e - s) as usize, false)
                .expect("get_mem_handle")
        };
        let mut handles: Vec<MemHandle> = (0..n).map(|_| new_handle()).collect();
        let bytes = &mine[c].reserved;
        let mut recv = vec![0u8; MEM_HANDLE_SIZE * n];
        ag(bytes, &mut recv).unwrap();
        for (j, h) in handles.iter_mut().enumerate() {
            h.reserved
                .copy_from_slice(&recv[j * MEM_HANDLE_SIZE..(j + 1) * MEM_HANDLE_SIZE]);
        }
        all.push(handles);
    }
    // A chunk whose offset disagrees with this PE's registration, and one off a granule: refused.
    // SAFETY: `all[1]` holds n handles (stride 1).
    let bad =
        unsafe { t.add_remote_handles(1, 0, all[1].as_mut_ptr(), CHUNKS[2].0, G, base, LOG2) };
    assert!(bad.unwrap_err().message.contains("heap offset"));
    // SAFETY: as above.
    let bad =
        unsafe { t.add_remote_handles(1, 0, all[1].as_mut_ptr(), CHUNKS[1].0, G, base, LOG2 + 2) };
    assert!(bad.unwrap_err().message.contains("granule"));
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        // SAFETY: `all[c]` holds n handles (stride 1, this transport at index 0).
        unsafe { t.add_remote_handles(1, 0, all[c].as_mut_ptr(), s, e - s, base, LOG2) }
            .expect("add_device_remote_mem_handles");
    }
    // The same chunk again (NVSHMEM re-describing it, here without a granularity: the one in use
    // serves) changes nothing.
    // SAFETY: as above.
    unsafe { t.add_remote_handles(1, 0, all[0].as_mut_ptr(), 0, CHUNKS[0].1, base, 0) }
        .expect("the same chunk again");
    let st = nvshmem_efa_gda::gda::device_state().expect("GDA state");
    assert_eq!((st.version, st.ready, st.n_granules), (3, 1, 6));
    assert_eq!(st.log2_granularity, LOG2);
    assert_eq!((st.heap_base, st.heap_size), (base, 6 * G));
    let entry_at = |row: u64, off: u64| {
        let st = nvshmem_efa_gda::gda::device_state().unwrap();
        let i = row * u64::from(st.key_stride) + (off >> st.log2_granularity);
        // SAFETY: host-published table of (n_pes + 1) * key_stride entries; i is inside.
        unsafe { *(st.heap_keys as *const NvshmemEfaGdaHeapKey).add(i as usize) }
    };
    let bases: Vec<u64> = mp_gather(&env, "name")
        .iter()
        .map(|r| r["base"].parse().unwrap())
        .collect();
    for (c, &(s, e)) in CHUNKS.iter().enumerate() {
        for (j, b) in bases.iter().enumerate() {
            let k = entry_at(j as u64, e - 1);
            assert_eq!((k.start, k.end, k.flags), (s, e, 1), "PE {j} chunk {c}");
            assert_eq!(k.addr, b + s, "PE {j} chunk {c}");
            assert_eq!(k.key, wire::SOFT_RKEY_HEAP + (s >> LOG2) as u32);
        }
        let k = entry_at(n as u64, s);
        assert_eq!((k.addr, k.flags), (base + s, 1));
    }
    // The collective release of chunk 1 clears it from every row.
    // SAFETY: mine[1] is this transport's live handle.
    unsafe { t.release_mem_handle(&mut mine[1]) }.expect("release");
    for row in 0..=n as u64 {
        assert_eq!(entry_at(row, CHUNKS[1].0).flags, 0, "row {row}");
        assert_eq!(entry_at(row, CHUNKS[2].0).flags, 1, "row {row}");
    }
    common::write_atomic(&env.dir, &format!("checked{me}"), "done=1\n");
    mp_gather(&env, "checked");
    // The transport owns its context; the C API reaches it while the transport has it, and not
    // after its finalize.
    use nvshmem_efa_gda::capi::gda::{nvshmemt_efa_gda_mode, nvshmemt_efa_gda_remove_heap_chunk};
    assert_eq!(
        nvshmemt_efa_gda_mode(),
        2,
        "the transport's context is the C API's"
    );
    assert_eq!(
        nvshmemt_efa_gda_remove_heap_chunk(1 << 40),
        nvshmem_efa_gda::capi::NVSHMEM_EFA_ERROR_NOT_FOUND
    );
    t.shutdown();
    assert!(
        nvshmemt_efa_gda_mode() < 0,
        "finalize dropped the transport's context"
    );
    assert!(nvshmem_efa_gda::gda::device_state().is_none());
    println!("{}", common::ok_marker(me));
}

#[test]
fn transport_path_tcp() {
    mp_run_child("tcp", "transport_child");
}

#[test]
fn transport_path_shm() {
    mp_run_child("shm", "transport_child");
}
