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
use nvshmem_efa_gda::gda::{Gda, GdaOptions};

const USAGE: &str = "\
usage: softq-bench [--csv PATH] [--provider tcp|shm] [--sizes 8,64,...] [--threads 1,2,4]
                   [--depth N] [--batch N] [--seconds S] [--mode provider|copy|null] [--help]

Measures WQEs per second of the software EFA queue: RDMA writes of each size from PE 0 to PE 1
(two PEs as threads of this process), posted by 1..n CPU threads that follow the GPU posting
protocol. Defaults: provider shm then tcp (the first that opens), sizes 8 B to 64 KiB, threads
1,2,4, depth 1024, batch 16, 1.5 s per point. Modes: provider (default: the writes go through
the provider), copy (PE 1's heap is lent to PE 0's queue as mapped peer memory: the copy route,
memcpy here), null (the null consumer: no data moves; the host-side cost of taking and completing
WQEs).";

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

fn setup(p: &Provider, depth: u32, batch: u32, heap: usize, mode: &str) -> Result<Vec<Pe>, String> {
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
        let gda = Gda::new(&d, &cfg, &opts).map_err(|e| e.to_string())?;
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
                    let d = WqeDesc {
                        op: WqeOp::RdmaWrite {
                            remote: RemoteBuf {
                                addr: dst_base + (t as u64 % 16) * slot,
                                rkey: peer.heap_rkey,
                                len: size,
                            },
                            local: LocalBuf {
                                addr: src_base + (t as u64 % 16) * slot,
                                lkey: st.heap_lkey,
                                len: size,
                            },
                        },
                        req_id: 0,
                        req_id_64: false,
                        phase: 0,
                        comp_req: true,
                        dest_qpn: peer.qpn,
                        ah: peer.ahn,
                        qkey: peer.qkey,
                        high_pps: false,
                    };
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
    let pes = match setup(
        &provider,
        args.depth,
        args.batch as u32,
        16 * 65536,
        &args.mode,
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
    if let Some(path) = &args.csv {
        if let Err(e) = std::fs::write(path, &csv) {
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
