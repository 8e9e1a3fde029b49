//! efa-gda-probe: what libfabric offers on this machine for EFA GPU Direct Async, and which GDA mode
//! `NVSHMEM_EFA_GDA=auto` would pick.
//!
//! Exit codes: 0 hardware GDA is available, 3 the software EFA queue would be used, 1 no provider
//! opens at all, 2 bad usage.
use std::process::ExitCode;
use std::sync::Arc;

use nvshmem_efa_gda::cuda;
use nvshmem_efa_gda::fabric::{self, Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::hw;

const USAGE: &str = "\
usage: efa-gda-probe [--provider NAME] [--help]

Prints the libfabric version, the providers and fabrics libfabric lists, and for each provider tried
(NAME, else NVSHMEM_LIBFABRIC_PROVIDER, else efa-direct, efa, shm and tcp): whether a domain opens,
whether it answers the EFA GDA ops (fi_open_ops \"efa gda ops\"), the send/receive/completion queue
attributes when it does, and whether the send ring and doorbell map for the GPU (with CUDA). Ends
with the GDA mode NVSHMEM_EFA_GDA=auto would pick. Runs on machines without EFA or CUDA.

exit status: 0 hardware GDA available, 3 software EFA queue would be used, 1 no provider opens,
2 bad usage";

fn open_domain(p: &Provider) -> Result<Arc<Domain>, fabric::Error> {
    let info = Info::get(&InfoRequest {
        provider: p.clone(),
        hmem: false,
        atomics: false,
        msg: true,
    })?;
    let f = Fabric::open(info)?;
    Domain::open(&f)
}

/// Makes device 0's primary context current so that queues can be mapped (the probe has no other
/// CUDA user). Returns a description for the report.
fn cuda_setup() -> String {
    if !cuda::available() {
        return "not available (no driver): mapping checks skipped".into();
    }
    if cuda::current_context() != 0 {
        return "available, context current".into();
    }
    match cuda::use_primary_context(0) {
        Ok(()) => "available, device 0's primary context made current".into(),
        Err(_) => "driver present but no usable device: mapping checks skipped".into(),
    }
}

struct Outcome {
    opened: bool,
    hw: bool,
}

fn probe(p: &Provider) -> Outcome {
    println!("provider {p}:");
    let d = match open_domain(p) {
        Ok(d) => d,
        Err(e) => {
            println!("  domain: does not open ({e})");
            return Outcome {
                opened: false,
                hw: false,
            };
        }
    };
    let i = d.info();
    println!(
        "  domain: opens (provider {}, fabric {}, domain {}, FI_HMEM {}, remote CQ data {} bytes)",
        i.provider_name(),
        i.fabric_name(),
        i.domain_name(),
        if i.has_hmem() { "yes" } else { "no" },
        i.cq_data_size()
    );
    let ops = match hw::open_ops(&d) {
        Ok(o) => o,
        Err(e) => {
            println!("  GDA ops: no ({e})");
            return Outcome {
                opened: true,
                hw: false,
            };
        }
    };
    println!("  GDA ops: yes");
    if !hw::is_efa_direct(&d) {
        println!("  (not the efa-direct fabric: GDA needs efa-direct)");
        return Outcome {
            opened: true,
            hw: false,
        };
    }
    match hw::probe_endpoint(&d, &ops) {
        Err(e) => {
            println!("  queues: cannot query ({e})");
            Outcome {
                opened: true,
                hw: false,
            }
        }
        Ok(r) => {
            println!(
                "  send queue: {} entries x {} B at {:p}, doorbell {:p}, max batch {}, caps {:#x}",
                r.sq.num_entries,
                r.sq.entry_size,
                r.sq.buffer,
                r.sq.doorbell,
                r.sq.max_batch,
                r.sq.caps
            );
            println!(
                "  receive queue: {} entries x {} B at {:p}, doorbell {:p}",
                r.rq.num_entries, r.rq.entry_size, r.rq.buffer, r.rq.doorbell
            );
            match &r.cq {
                Ok(c) => println!(
                    "  completion queue: {} entries x {} B at {:p}",
                    c.num_entries, c.entry_size, c.buffer
                ),
                Err(e) => println!("  completion queue: cannot query ({e})"),
            }
            let mapped = match &r.mapping {
                None => {
                    println!("  GPU mapping: not checked (no CUDA)");
                    true
                }
                Some(Ok((s, db))) => {
                    println!(
                        "  GPU mapping: send ring at device {s:#x}, doorbell at device {db:#x}"
                    );
                    true
                }
                Some(Err(e)) => {
                    println!("  GPU mapping: refused ({e})");
                    false
                }
            };
            Outcome {
                opened: true,
                hw: mapped,
            }
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut named: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--provider" | "-p" => match args.next() {
                Some(v) => named = Some(v),
                None => {
                    eprintln!("--provider needs a value\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("unknown argument '{other}'\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    nvshmem_efa_gda::log::init();
    let named = named.or_else(|| {
        std::env::var("NVSHMEM_LIBFABRIC_PROVIDER")
            .ok()
            .filter(|v| !v.trim().is_empty() && v.trim() != "auto")
    });
    let candidates = match &named {
        Some(n) => match Provider::parse(n) {
            Ok(p) => vec![p],
            Err(e) => {
                eprintln!("{e}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        None => vec![
            Provider::EfaDirect,
            Provider::Efa,
            Provider::Shm,
            Provider::Tcp,
        ],
    };
    let (maj, min) = fabric::library_version();
    println!(
        "libfabric {maj}.{min} (this build asks for API {}.{})",
        fabric::API_VERSION >> 16,
        fabric::API_VERSION & 0xffff
    );
    let list = fabric::list_providers();
    if list.is_empty() {
        println!("providers: none answer fi_getinfo");
    } else {
        println!("providers (provider: fabrics):");
        let mut seen: Vec<(&str, Vec<&str>)> = Vec::new();
        for (p, f) in &list {
            match seen.iter_mut().find(|(q, _)| q == p) {
                Some((_, fs)) => fs.push(f),
                None => seen.push((p, vec![f])),
            }
        }
        for (p, fs) in seen {
            println!("  {p}: {}", fs.join(", "));
        }
    }
    println!("CUDA: {}", cuda_setup());
    let mut first_open: Option<Provider> = None;
    let mut hw_on: Option<Provider> = None;
    for p in &candidates {
        let o = probe(p);
        if o.opened && first_open.is_none() {
            first_open = Some(p.clone());
        }
        if o.hw && hw_on.is_none() {
            hw_on = Some(p.clone());
        }
    }
    match (hw_on, first_open) {
        (Some(p), _) => {
            println!("NVSHMEM_EFA_GDA=auto would pick: hardware EFA queues ({p})");
            ExitCode::SUCCESS
        }
        (None, Some(p)) => {
            println!(
                "NVSHMEM_EFA_GDA=auto would pick: the software EFA queue (over {p}): {}",
                hw::NO_GDA_OPS
            );
            ExitCode::from(3)
        }
        (None, None) => {
            println!("no provider opens: neither hardware nor software GDA can run");
            ExitCode::from(1)
        }
    }
}
