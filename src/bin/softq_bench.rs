//! softq-bench: WQE rate of the software EFA queue on this machine. CPU threads play the GPU (the
//! posting protocol of `gda::state`) on PE 0 and post RDMA writes into PE 1's heap; both PEs are
//! threads of this process with their own fabric, domain and queue. Prints a table and writes CSV.
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::{Config, GdaMode};
use nvshmem_efa_gda::efa::wqe::{self, LocalBuf, RemoteBuf, WqeDesc, WqeOp};
use nvshmem_efa_gda::fabric::{Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::mem::{CtrlPlacement, SharedMem};
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer;
use nvshmem_efa_gda::gda::{Gda, GdaOptions};

const USAGE: &str = "\
usage: softq-bench [--csv PATH] [--provider tcp|shm] [--sizes 8,64,...] [--threads 1,2,4]
                   [--depth N] [--batch N] [--seconds S] [--mode provider|copy|null] [--help]
       softq-bench --ll EXPERTS [--writes W] [--sizes S] [--threads 1,4] [--phases N]
                   [--mode provider|copy] [--csv PATH] [--provider tcp|shm]

Measures WQEs per second of the software EFA queue: RDMA writes of each size from PE 0 to PE 1
(two PEs as threads of this process), posted by 1..n CPU threads that follow the GPU posting
protocol. Defaults: provider shm then tcp (the first that opens), sizes 8 B to 64 KiB, threads
1,2,4, depth 1024, batch 16, 1.5 s per point. Modes: provider (default: the writes go through
the provider), copy (PE 1's heap is lent to PE 0's queue as mapped peer memory: the copy route,
memcpy here), null (the null consumer: no data moves; the host-side cost of taking and completing
WQEs).

--ll EXPERTS: DeepEP's low-latency pattern on 2 PEs (its dispatch, one direction): PE 0's queue
has EXPERTS/2 queues per PE (NVSHMEM_IBGDA_NUM_RC_PER_PE = local experts, as DeepEP sets it); a
phase posts, for each of PE 1's EXPERTS/2 experts, W writes of S bytes (default 4 x 7168: 128
tokens x top-8 spread over the experts) on the expert's queue, then a data-announcing AMO add to
the expert's count word on the same queue; PE 1 waits until every count has moved. Prints the
phase time (median, min, max over N phases, default 20) and the time per count.";

/// Maps PE 1's heap at the same addresses (both PEs are threads of this process).
struct SameProcess {
    base: u64,
    len: u64,
}

impl nvshmem_efa_gda::gda::PeerMemory for SameProcess {
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        let inside = addr >= self.base && len <= self.len && addr - self.base <= self.len - len;
        (pe == 1 && inside).then_some(addr)
    }
}

struct Args {
    ll: Option<u32>,
    writes: u32,
    phases: u32,
    csv: Option<String>,
    provider: Option<Provider>,
    sizes: Vec<u32>,
    threads: Vec<usize>,
    depth: u32,
    batch: usize,
    seconds: f64,
    mode: String,
}

fn list<T: std::str::FromStr>(v: &str) -> Option<Vec<T>> {
    v.split(',').map(|x| x.trim().parse().ok()).collect()
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        ll: None,
        writes: 4,
        phases: 20,
        csv: None,
        provider: None,
        sizes: vec![8, 64, 512, 4096, 16384, 65536],
        threads: vec![1, 2, 4],
        depth: 1024,
        batch: 16,
        seconds: 1.5,
        mode: "provider".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "-h" || k == "--help" {
            return Err(String::new());
        }
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--csv" => a.csv = Some(v),
            "--ll" => {
                a.ll = Some(
                    v.parse()
                        .ok()
                        .filter(|e: &u32| *e >= 2 && *e <= 1024 && e % 2 == 0)
                        .ok_or("ll: an even number of experts, 2 to 1024")?,
                )
            }
            "--writes" => {
                a.writes = v
                    .parse()
                    .ok()
                    .filter(|w: &u32| (1..=64).contains(w))
                    .ok_or("writes: 1 to 64")?
            }
            "--phases" => {
                a.phases = v
                    .parse()
                    .ok()
                    .filter(|n: &u32| (1..=10000).contains(n))
                    .ok_or("phases: 1 to 10000")?
            }
            "--provider" => a.provider = Some(Provider::parse(&v).map_err(|e| e.to_string())?),
            "--sizes" => {
                a.sizes = list(&v)
                    .filter(|s: &Vec<u32>| s.iter().all(|&x| (1..=65536).contains(&x)))
                    .ok_or("sizes: 1 to 65536")?
            }
            "--threads" => {
                a.threads = list(&v)
                    .filter(|s: &Vec<usize>| s.iter().all(|&x| (1..=64).contains(&x)))
                    .ok_or("threads: 1 to 64")?
            }
            "--depth" => {
                a.depth = v
                    .parse()
                    .ok()
                    .filter(|d: &u32| d.is_power_of_two() && (2..=32768).contains(d))
                    .ok_or("depth: a power of two, 2 to 32768")?
            }
            "--batch" => {
                a.batch = v
                    .parse()
                    .ok()
                    .filter(|b| *b >= 1)
                    .ok_or("batch: at least 1")?
            }
            "--mode" => {
                a.mode = v.clone();
                if !["provider", "copy", "null"].contains(&a.mode.as_str()) {
                    return Err("mode: provider, copy or null".into());
                }
            }
            "--seconds" => {
                a.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .ok_or("seconds: positive")?
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if a.batch > a.depth as usize {
        return Err("batch must not exceed depth".into());
    }
    Ok(a)
}

fn domain(p: &Provider) -> Option<Arc<Domain>> {
    let info = Info::get(&InfoRequest {
        provider: p.clone(),
        hmem: false,
        atomics: false,
        msg: true,
    })
    .ok()?;
    Domain::open(&Fabric::open(info).ok()?).ok()
}

struct Pe {
    gda: Gda,
    heap: SharedMem,
}

fn setup(
    p: &Provider,
    depth: u32,
    batch: u32,
    heap: usize,
    mode: &str,
    queues_per_pe: Option<u32>,
) -> Result<Vec<Pe>, String> {
    let mut cfg = Config::from_lookup(|_| None).map_err(|e| e.to_string())?;
    cfg.gda = GdaMode::Soft;
    cfg.soft_null = mode == "null";
    let opts = GdaOptions {
        ctrl: CtrlPlacement::Host,
        sq_depth: Some(depth),
        max_batch: Some(batch),
    };
    let mut pes = Vec::new();
    for _ in 0..2 {
        let d = domain(p).ok_or_else(|| format!("provider {p} does not open"))?;
        let mut gda = Gda::new(&d, &cfg, &opts).map_err(|e| e.to_string())?;
        if let Some(q) = queues_per_pe {
            gda.set_queues_per_pe(q).map_err(|e| e.to_string())?;
        }
        pes.push(Pe {
            gda,
            heap: SharedMem::new(heap, false).map_err(|e| e.to_string())?,
        });
    }
    let names: Vec<Vec<u8>> = pes
        .iter()
        .map(|p| p.gda.address())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let len = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let all: Vec<u8> = names
        .iter()
        .flat_map(|n| {
            let mut x = n.clone();
            x.resize(len, 0);
            x
        })
        .collect();
    for (i, pe) in pes.iter_mut().enumerate() {
        let (b, l) = (pe.heap.host() as u64, pe.heap.len() as u64);
        pe.gda
            .set_local_heap(b, l, None)
            .map_err(|e| e.to_string())?;
        pe.gda
            .connect(i as i32, 2, &all, None)
            .map_err(|e| e.to_string())?;
    }
    let heaps: Vec<(u64, u64, u64)> = pes
        .iter()
        .map(|p| {
            Ok((
                p.heap.host() as u64,
                p.heap.len() as u64,
                p.gda.local_heap_key()?,
            ))
        })
        .collect::<Result<_, nvshmem_efa_gda::gda::GdaError>>()
        .map_err(|e| e.to_string())?;
    for pe in pes.iter_mut() {
        for (j, h) in heaps.iter().enumerate() {
            pe.gda
                .set_remote_heap(j as i32, h.0, h.1, h.2)
                .map_err(|e| e.to_string())?;
        }
    }
    if mode == "copy" {
        let pm = Arc::new(SameProcess {
            base: pes[1].heap.host() as u64,
            len: pes[1].heap.len() as u64,
        });
        pes[0]
            .gda
            .set_peer_memory(Some(pm))
            .map_err(|e| e.to_string())?;
    }
    Ok(pes)
}

struct Point {
    threads: usize,
    size: u32,
    wqes: u64,
    secs: f64,
    errors: u64,
}

fn run_point(
    pes: &[Pe],
    threads: usize,
    size: u32,
    batch: usize,
    secs: f64,
) -> Result<Point, String> {
    let q = pes[0].gda.soft_queue().ok_or("no software queue")?;
    let poster = HostPoster::new(q)
        .map_err(|e| e.to_string())?
        .with_timeout(Duration::from_secs(60));
    let st = pes[0].gda.device_state().ok_or("no state")?;
    let peer = pes[0].gda.peers()[1];
    let slot = 65536u64;
    let src_base = pes[0].heap.host() as u64;
    let dst_base = pes[1].heap.host() as u64;
    let errors0 = poster.errors();
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let counts: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let poster = &poster;
                s.spawn(move || -> Result<u64, String> {
                    let mut n = 0u64;
                    let off = (t as u64 % 16) * slot;
                    let d = wqe_to(
                        &peer,
                        write_op(
                            src_base + off,
                            st.heap_lkey,
                            dst_base + off,
                            peer.heap_rkey,
                            size,
                        ),
                    );
                    while Instant::now() < stop {
                        poster
                            .post_with(batch, |pc, phase| {
                                let mut x = d;
                                x.req_id = pc & 0xffff;
                                x.phase = phase;
                                wqe::encode(&x)
                            })
                            .map_err(|e| e.to_string())?;
                        n += batch as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("poster thread").unwrap_or(0))
            .collect()
    });
    poster.quiet().map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    Ok(Point {
        threads,
        size,
        wqes: counts.iter().sum(),
        secs,
        errors: poster.errors() - errors0,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    nvshmem_efa_gda::log::init();
    let candidates = match &args.provider {
        Some(p) => vec![p.clone()],
        None => vec![Provider::Shm, Provider::Tcp],
    };
    let Some(provider) = candidates.into_iter().find(|p| domain(p).is_some()) else {
        eprintln!("no software provider (shm, tcp) opens here");
        return ExitCode::from(1);
    };
    if let Some(experts) = args.ll {
        return ll_main(&args, &provider, experts);
    }
    let pes = match setup(
        &provider,
        args.depth,
        args.batch as u32,
        16 * 65536,
        &args.mode,
        None,
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("setup failed: {e}");
            return ExitCode::from(1);
        }
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "software EFA queue, provider {provider}, 2 PEs in one process, {cpus} CPUs, depth {}, batch {}, RDMA write PE 0 -> PE 1",
        args.depth, args.batch
    );
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>10}",
        "threads", "size", "WQE/s", "MB/s", "errors"
    );
    let mut csv = String::from(
        "provider,threads,size_bytes,wqes,seconds,wqe_per_s,mbytes_per_s,errors,depth,batch,cpus\n",
    );
    let mut failed = false;
    for &t in &args.threads {
        for &size in &args.sizes {
            match run_point(&pes, t, size, args.batch, args.seconds) {
                Ok(p) => {
                    let rate = p.wqes as f64 / p.secs;
                    let mbs = rate * f64::from(p.size) / 1e6;
                    println!(
                        "{:>8} {:>8} {:>12.0} {:>12.1} {:>10}",
                        p.threads, p.size, rate, mbs, p.errors
                    );
                    let _ = writeln!(
                        csv,
                        "{provider},{},{},{},{:.4},{:.0},{:.2},{},{},{},{cpus}",
                        p.threads,
                        p.size,
                        p.wqes,
                        p.secs,
                        rate,
                        mbs,
                        p.errors,
                        args.depth,
                        args.batch
                    );
                    failed |= p.errors > 0;
                }
                Err(e) => {
                    eprintln!("threads {t}, size {size}: {e}");
                    failed = true;
                }
            }
        }
    }
    finish(args.csv.as_deref(), &csv, failed)
}

/// What one `--ll` configuration measured.
struct LlPoint {
    threads: usize,
    size: u32,
    phases: Vec<f64>,
    errors: u64,
}

/// DeepEP's low-latency dispatch pattern (see the usage): `experts / 2` queues per PE, `writes`
/// writes and one data-announcing count per expert of PE 1 per phase, posted by `threads` threads.
fn run_ll(
    pes: &[Pe],
    experts: u32,
    writes: u32,
    size: u32,
    threads: usize,
    phases: u32,
) -> Result<LlPoint, String> {
    use nvshmem_efa_gda::efa::wqe::SendPayload;
    use nvshmem_efa_gda::gda::queues::queue_index;
    use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_AFTER_DATA, AMO_OP_ADD};
    let local = experts / 2;
    let q = pes[0].gda.soft_queue().ok_or("no software queue")?;
    let posters: Vec<HostPoster> = (0..local)
        .map(|e| {
            HostPoster::on_ring(q, queue_index(1, e, local))
                .map(|p| p.with_timeout(Duration::from_secs(60)))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let st = pes[0].gda.device_state().ok_or("no state")?;
    let peer = pes[0].gda.peers()[1];
    let (src_base, dst_base) = (pes[0].heap.host() as u64, pes[1].heap.host() as u64);
    // PE 1's heap: the count words first (one 8-byte word per expert), then the data.
    let data_off = 65536u64;
    let per_expert = u64::from(writes) * u64::from(size);
    let desc = |op| wqe_to(&peer, op);
    let counts = dst_base as *const std::sync::atomic::AtomicU64;
    // SAFETY: PE 1's heap starts with one aligned 8-byte count word per expert, written only by
    // PE 1's queue with atomics.
    let count = |e: usize| unsafe { &*counts.add(e) };
    // The counts where an earlier configuration left them.
    let base: Vec<u64> = (0..local as usize)
        .map(|e| count(e).load(std::sync::atomic::Ordering::Acquire))
        .collect();
    let errors0: u64 = posters.iter().map(|p| p.errors()).sum();
    let mut times = Vec::new();
    for phase in 1..=u64::from(phases) {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let posters = &posters;
                let desc = &desc;
                s.spawn(move || {
                    for e in (t as u32..local).step_by(threads) {
                        let at = data_off + u64::from(e) * per_expert;
                        let mut ds: Vec<WqeDesc> = (0..u64::from(writes))
                            .map(|w| {
                                let off = at + w * u64::from(size);
                                desc(write_op(
                                    src_base + off,
                                    st.heap_lkey,
                                    dst_base + off,
                                    peer.heap_rkey,
                                    size,
                                ))
                            })
                            .collect();
                        let amo = AmoMsg {
                            op: AMO_OP_ADD,
                            size: 8,
                            offset: 8 * u64::from(e),
                            value: 1,
                            flags: AMO_AFTER_DATA,
                        };
                        ds.push(desc(WqeOp::Send {
                            payload: SendPayload::inline(&amo.encode()).expect("32-byte message"),
                            imm: None,
                        }));
                        if let Err(err) = posters[e as usize].post(&ds) {
                            eprintln!("expert {e}: {err}");
                        }
                    }
                });
            }
        });
        // PE 1's side: every expert's count reached this phase.
        let deadline = Instant::now() + Duration::from_secs(60);
        for (e, b) in base.iter().enumerate() {
            let c = count(e);
            while c.load(std::sync::atomic::Ordering::Acquire) < b + phase {
                if Instant::now() > deadline {
                    return Err(format!("phase {phase}: expert {e}'s count did not arrive"));
                }
                std::hint::spin_loop();
            }
        }
        times.push(t0.elapsed().as_secs_f64());
    }
    for p in &posters {
        p.quiet().map_err(|e| e.to_string())?;
    }
    let errors = posters.iter().map(|p| p.errors()).sum::<u64>() - errors0;
    Ok(LlPoint {
        threads,
        size,
        phases: times,
        errors,
    })
}

fn ll_main(args: &Args, provider: &Provider, experts: u32) -> ExitCode {
    let size = args
        .sizes
        .first()
        .copied()
        .filter(|_| args.sizes.len() == 1)
        .unwrap_or(7168);
    let heap = 65536 + (experts as usize / 2) * args.writes as usize * size as usize;
    let pes = match setup(
        provider,
        args.depth,
        args.batch as u32,
        heap.next_multiple_of(65536),
        &args.mode,
        Some(experts / 2),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("setup failed: {e}");
            return ExitCode::from(1);
        }
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "software EFA queue, provider {provider}, mode {}, 2 PEs in one process, {cpus} CPUs: DeepEP \
         low-latency dispatch pattern, {experts} experts ({} queues per PE), {} x {size} B writes \
         and one count per expert of PE 1 per phase",
        args.mode,
        experts / 2,
        args.writes
    );
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>12} {:>14} {:>8}",
        "threads", "size", "median us", "min us", "max us", "us per count", "errors"
    );
    let mut csv = String::from(
        "provider,mode,experts,writes,size_bytes,threads,phases,median_us,min_us,max_us,us_per_count,errors,cpus\n",
    );
    let mut failed = false;
    for &t in &args.threads {
        match run_ll(&pes, experts, args.writes, size, t, args.phases) {
            Ok(p) => {
                let mut v = p.phases.clone();
                v.sort_by(f64::total_cmp);
                let med = v[v.len() / 2] * 1e6;
                let (min, max) = (v[0] * 1e6, v[v.len() - 1] * 1e6);
                let per = med / f64::from(experts / 2);
                println!(
                    "{:>8} {:>8} {:>12.1} {:>12.1} {:>12.1} {:>14.2} {:>8}",
                    p.threads, p.size, med, min, max, per, p.errors
                );
                let _ = writeln!(
                    csv,
                    "{provider},{},{experts},{},{},{},{},{med:.1},{min:.1},{max:.1},{per:.2},{},{cpus}",
                    args.mode,
                    args.writes,
                    p.size,
                    p.threads,
                    p.phases.len(),
                    p.errors
                );
                failed |= p.errors > 0;
            }
            Err(e) => {
                eprintln!("threads {t}: {e}");
                failed = true;
            }
        }
    }
    finish(args.csv.as_deref(), &csv, failed)
}

/// A WQE to `peer` (request id and phase are the poster's).
fn wqe_to(peer: &NvshmemEfaGdaPeer, op: WqeOp) -> WqeDesc {
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

/// An RDMA write of `len` bytes from `src` (`lkey`) to `dst` (`rkey`).
fn write_op(src: u64, lkey: u32, dst: u64, rkey: u32, len: u32) -> WqeOp {
    WqeOp::RdmaWrite {
        remote: RemoteBuf {
            addr: dst,
            rkey,
            len,
        },
        local: LocalBuf {
            addr: src,
            lkey,
            len,
        },
    }
}

/// Writes the CSV where asked and turns the run's outcome into the exit status.
fn finish(path: Option<&str>, csv: &str, failed: bool) -> ExitCode {
    if let Some(path) = path {
        if let Err(e) = std::fs::write(path, csv) {
            eprintln!("cannot write {path}: {e}");
            return ExitCode::from(1);
        }
        println!("CSV written to {path}");
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
