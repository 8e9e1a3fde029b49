//! nvshmem-efa-gda: `info` reports what this machine offers the library (like `nvshmem-info` and
//! `fi_info`): the library version and the NVSHMEM transport ABIs it serves, the NVSHMEM found and
//! whether its ABI is served, libfabric's version and providers with their RMA/atomic/HMEM caps, the
//! GDA mode `NVSHMEM_EFA_GDA=auto` would pick and why, the CUDA driver, and the `NVSHMEM_*` variables
//! in effect. `--json` prints the same as one JSON object.
//!
//! Exit codes: 0 ready (a provider answers, NVSHMEM found and served); 1 no libfabric provider
//! answers; 2 bad usage; 3 NVSHMEM found but its transport ABI is not served; 4 no NVSHMEM found.
//! (A missing libfabric.so.1 stops the loader before main: exit 127 with its message; the Python
//! `nvshmem-efa-gda` command checks for libfabric first and exits 5 with an explanation.)
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nvshmem_efa_gda::capi::info::cuda_driver_version;
use nvshmem_efa_gda::fabric::{self, Domain, Fabric, Info, InfoRequest, Provider};
use nvshmem_efa_gda::gda::hw::{self, GdaOps};
use nvshmem_efa_gda::nvshmem::abi::SERVED_MAJORS;
use nvshmem_efa_gda::nvshmem::Transport;
use nvshmem_efa_gda::route::Staging;
use nvshmem_efa_gda::topo;

const USAGE: &str = "\
usage: nvshmem-efa-gda info [--json] [--nvshmem-home DIR] [--nvshmem-version X.Y.Z]
                            [--nvshmem-source TEXT]
                            [--sysfs-root DIR]
       nvshmem-efa-gda --version

info  reports the library version and the NVSHMEM transport ABIs it serves; the NVSHMEM found
      (--nvshmem-home, else NVSHMEM_HOME, else a libnvshmem_host.so in LD_LIBRARY_PATH), its version
      and transport ABI (from include/non_abi/nvshmem_version.h, else --nvshmem-version) and whether
      the ABI is served; libfabric's version and, per provider, whether an RDM endpoint with RMA,
      atomics and FI_HMEM answers; the GDA mode NVSHMEM_EFA_GDA=auto would pick and why; the route the
      library would decide (GPU memory staged or moved by the NIC, atomics, CUDA IPC, progress) and
      the provider capabilities it follows from; the CUDA driver; each NVIDIA GPU (sysfs, under
      --sysfs-root, default /) with the NICs a PE on it would use, nearest first (PCI distance, NUMA
      node; NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE and NVSHMEM_ENABLE_NIC_PE_MAPPING as NVSHMEM reads
      them); the NVSHMEM_* variables set.

exit status: 0 ready (a provider answers, NVSHMEM found and its ABI served), 1 no libfabric provider
answers, 2 bad usage, 3 NVSHMEM found but its ABI is not served, 4 no NVSHMEM found";

/// A JSON value (the report is small; no serializer needed).
enum J {
    S(String),
    N(i64),
    B(bool),
    Null,
    A(Vec<J>),
    O(Vec<(&'static str, J)>),
    /// An object with keys known only at run time (environment variables).
    M(Vec<(String, String)>),
}

impl J {
    fn s(v: impl Into<String>) -> J {
        J::S(v.into())
    }
    fn opt_s(v: Option<impl Into<String>>) -> J {
        v.map(J::s).unwrap_or(J::Null)
    }
    fn write(&self, out: &mut String) {
        match self {
            J::S(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            J::N(n) => out.push_str(&n.to_string()),
            J::B(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Null => out.push_str("null"),
            J::A(v) => write_seq(out, '[', ']', v, |x, out| x.write(out)),
            J::O(v) => write_seq(out, '{', '}', v, |(k, x), out| write_member(out, k, x)),
            J::M(v) => write_seq(out, '{', '}', v, |(k, x), out| {
                write_member(out, k, &J::s(x.clone()))
            }),
        }
    }
}

/// Writes `items` between `open` and `close`, separated by commas, each through `each`.
fn write_seq<T>(
    out: &mut String,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&T, &mut String),
) {
    out.push(open);
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        each(x, out);
    }
    out.push(close);
}

/// Writes one object member `"key": value`.
fn write_member(out: &mut String, key: &str, value: &J) {
    J::s(key).write(out);
    out.push_str(": ");
    value.write(out);
}

/// NVSHMEM release -> transport ABI major (3.4 -> 3, 3.5 -> 4, 3.6 -> 5, 3.7 -> 6, 3.8 -> 7).
fn abi_for_release(major: u32, minor: u32) -> Option<i32> {
    (major == 3 && (4..=8).contains(&minor)).then(|| minor as i32 - 1)
}

fn parse_release(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.trim().split(['.', '-', '+']);
    let a = it.next()?.parse().ok()?;
    let b = it.next()?.parse().ok()?;
    let c = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((a, b, c))
}

/// What was learnt about NVSHMEM.
struct Nvshmem {
    source: String,
    home: PathBuf,
    host_lib: Option<PathBuf>,
    version: Option<String>,
    abi: Option<i32>,
    abi_from: &'static str,
}

fn header_define(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("#define") && w.next() == Some(name))
            .then(|| w.next().and_then(|v| v.parse().ok()))
            .flatten()
    })
}

fn host_lib_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvshmem_host.so"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The NVSHMEM to report on, or why none was found.
fn find_nvshmem(
    home: Option<PathBuf>,
    source: Option<String>,
    version: Option<String>,
) -> Result<Nvshmem, String> {
    let (home, source) = match home {
        Some(h) => (h, source.unwrap_or_else(|| "--nvshmem-home".into())),
        None => match std::env::var_os("NVSHMEM_HOME").filter(|v| !v.is_empty()) {
            Some(h) => (PathBuf::from(h), "NVSHMEM_HOME".into()),
            None => {
                let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
                let dir = ld
                    .split(':')
                    .filter(|d| !d.is_empty())
                    .find(|d| host_lib_in(Path::new(d)).is_some())
                    .ok_or("looked at --nvshmem-home, NVSHMEM_HOME and LD_LIBRARY_PATH")?;
                let lib = PathBuf::from(dir);
                let home = lib.parent().map(Path::to_path_buf).unwrap_or(lib);
                (home, "LD_LIBRARY_PATH".into())
            }
        },
    };
    let host_lib = host_lib_in(&home.join("lib")).or_else(|| host_lib_in(&home));
    let header = std::fs::read_to_string(home.join("include/non_abi/nvshmem_version.h")).ok();
    if host_lib.is_none() && header.is_none() {
        return Err(format!(
            "{source}={} holds neither lib/libnvshmem_host.so* nor include/non_abi/nvshmem_version.h",
            home.display()
        ));
    }
    let mut n = Nvshmem {
        source,
        home,
        host_lib,
        version: None,
        abi: None,
        abi_from: "unknown",
    };
    if let Some(h) = &header {
        let v = (
            header_define(h, "NVSHMEM_VENDOR_MAJOR_VERSION"),
            header_define(h, "NVSHMEM_VENDOR_MINOR_VERSION"),
            header_define(h, "NVSHMEM_VENDOR_PATCH_VERSION"),
        );
        if let (Some(a), Some(b), Some(c)) = v {
            n.version = Some(format!("{a}.{b}.{c}"));
        }
        if let Some(m) = header_define(h, "NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION") {
            n.abi = Some(m as i32);
            n.abi_from = "include/non_abi/nvshmem_version.h";
        }
    }
    if let Some(v) = version {
        if n.version.is_none() {
            n.version = Some(v);
        }
    }
    if n.abi.is_none() {
        if let Some((a, b, _)) = n.version.as_deref().and_then(parse_release) {
            n.abi = abi_for_release(a, b);
            if n.abi.is_some() {
                n.abi_from = "release number";
            }
        }
    }
    Ok(n)
}

/// One provider as the library would ask for it.
struct ProvReport {
    name: &'static str,
    answer: Result<Info, String>,
    atomics: bool,
    hmem: bool,
}

fn ask(p: &Provider) -> ProvReport {
    let req = |hmem| InfoRequest {
        provider: p.clone(),
        hmem,
        atomics: true,
        msg: true,
    };
    let answer = Info::get(&req(false)).map_err(|e| e.to_string());
    let atomics = answer.as_ref().is_ok_and(|i| i.has_atomics());
    let hmem = answer.is_ok() && Info::get(&req(true)).is_ok_and(|i| i.has_hmem());
    ProvReport {
        name: p.name(),
        answer,
        atomics,
        hmem,
    }
}

/// The GDA mode `NVSHMEM_EFA_GDA=auto` would pick: (mode, provider, why).
fn gda_mode(reports: &[ProvReport]) -> (&'static str, Option<&'static str>, String) {
    let hw_why = match Info::get(&InfoRequest {
        provider: Provider::EfaDirect,
        hmem: false,
        atomics: false,
        msg: true,
    })
    .and_then(Fabric::open)
    .and_then(|f| Domain::open(&f))
    {
        Err(e) => format!("efa-direct does not open ({e})"),
        Ok(d) => match GdaOps::open(&d) {
            Err(e) => format!("efa-direct opens but {e}"),
            Ok(_) if !hw::is_efa_direct(&d) => "the efa answer is not the efa-direct fabric".into(),
            Ok(_) => {
                return (
                    "hardware",
                    Some("efa-direct"),
                    "efa-direct answers the EFA GDA ops (efa-gda-probe checks queue mapping for the GPU)"
                        .into(),
                )
            }
        },
    };
    match reports.iter().find(|r| r.answer.is_ok()) {
        Some(r) => (
            "software",
            Some(r.name),
            format!("{hw_why}: {}", hw::NO_GDA_OPS),
        ),
        None => ("none", None, format!("{hw_why}; no provider answers")),
    }
}

fn loaded_libfabric() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libfabric.so"))
        })
        .map(str::to_string)
}

/// The environment the process was started with. The library's load-time code may set
/// `CUDA_MODULE_LOADING=EAGER` and `CUDA_DEVICE_MAX_CONNECTIONS=32` (see docs/nvshmem-transport.md), so `std::env::vars`
/// would show values the user did not
/// set; /proc/self/environ keeps what was given at exec.
fn start_environment() -> Vec<(String, String)> {
    match std::fs::read("/proc/self/environ") {
        Ok(raw) => raw
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect(),
        Err(_) => std::env::vars().collect(),
    }
}

fn release_of_abi(m: i32) -> String {
    format!("NVSHMEM 3.{}.x", m + 1)
}

struct Args {
    json: bool,
    home: Option<PathBuf>,
    version: Option<String>,
    source: Option<String>,
    sysfs_root: Option<PathBuf>,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        json: false,
        home: None,
        version: None,
        source: None,
        sysfs_root: None,
    };
    let mut saw_info = false;
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match x.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("nvshmem-efa-gda {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "info" if !saw_info => saw_info = true,
            "--json" => a.json = true,
            "--nvshmem-home" => a.home = Some(PathBuf::from(value("--nvshmem-home")?)),
            "--nvshmem-version" => a.version = Some(value("--nvshmem-version")?),
            "--nvshmem-source" => a.source = Some(value("--nvshmem-source")?),
            "--sysfs-root" => a.sysfs_root = Some(PathBuf::from(value("--sysfs-root")?)),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if !saw_info {
        return Err("missing command (info)".into());
    }
    Ok(Some(a))
}

/// The GPUs on the PCI bus and the NICs a PE on each would use (libfabric's NICs, sysfs topology).
fn nic_report(sysfs_root: Option<&Path>) -> topo::Report {
    let sys = sysfs_root
        .map(topo::Sysfs::at)
        .unwrap_or_else(topo::Sysfs::system);
    let (policy, bad) = match topo::NicPolicy::from_env() {
        Ok(p) => (p, None),
        Err(e) => (topo::NicPolicy::default(), Some(e)),
    };
    let listed: Vec<topo::NicName> = fabric::list_nics()
        .into_iter()
        .map(|n| topo::NicName {
            name: n.domain,
            provider: n.fabric,
            pci: n.pci.map(|(domain, bus, device, function)| topo::PciAddr {
                domain: domain as u32,
                bus,
                device,
                function,
            }),
        })
        .collect();
    let mut r = topo::report(&sys, &listed, policy);
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        r.notes.push(
            "CUDA_VISIBLE_DEVICES is set: the list still shows every NVIDIA GPU on the PCI bus, in \
             bus order (the choice is made for the whole node)"
                .to_string(),
        );
    }
    if let Some(e) = bad {
        tracing::warn!("{e}; NVSHMEM's defaults are shown instead");
        r.notes
            .push(format!("{e}; NVSHMEM's defaults are shown instead"));
    }
    r
}

fn nics_json(r: &topo::Report) -> J {
    let dev = |d: &topo::PciDevice| {
        vec![
            ("pci", J::s(d.addr.to_string())),
            ("numa", d.numa.map(|n| J::N(n as i64)).unwrap_or(J::Null)),
        ]
    };
    J::O(vec![
        ("max_nic_per_pe", J::N(r.policy.max_nic_per_pe as i64)),
        ("nic_pe_mapping", J::B(r.policy.nic_pe_mapping)),
        (
            "gpus",
            J::A(
                r.gpus
                    .iter()
                    .map(|g| {
                        let mut o = dev(&g.gpu);
                        o.push((
                            "nics",
                            J::A(
                                g.nics
                                    .iter()
                                    .map(|(name, d, l)| {
                                        let mut n = vec![("name", J::s(name.clone()))];
                                        n.extend(dev(d));
                                        n.push(("distance", J::s(l.distance.as_str())));
                                        J::O(n)
                                    })
                                    .collect(),
                            ),
                        ));
                        o.push(("why", J::s(g.why.clone())));
                        J::O(o)
                    })
                    .collect(),
            ),
        ),
        (
            "notes",
            J::A(r.notes.iter().map(|n| J::s(n.clone())).collect()),
        ),
    ])
}

fn print_nics(r: &topo::Report) {
    let numa = |n: Option<i32>| n.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
    println!(
        "NICs by GPU (nearest first; NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE={}, NVSHMEM_ENABLE_NIC_PE_MAPPING={})",
        r.policy.max_nic_per_pe,
        u8::from(r.policy.nic_pe_mapping)
    );
    for (i, g) in r.gpus.iter().enumerate() {
        println!("  GPU {i} {} (NUMA {})", g.gpu.addr, numa(g.gpu.numa));
        for (name, d, l) in &g.nics {
            println!(
                "    {name:<16} {} NUMA {:<2} {:<4} {}",
                d.addr,
                numa(d.numa),
                l.distance.as_str(),
                l.distance.describe()
            );
        }
        println!("    why: {}", g.why);
    }
    for n in &r.notes {
        println!("  {n}");
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvshmem-efa-gda: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    nvshmem_efa_gda::log::init();
    let version = env!("CARGO_PKG_VERSION");
    let nv = find_nvshmem(args.home, args.source, args.version);
    let served = nv
        .as_ref()
        .ok()
        .and_then(|n| n.abi)
        .map(|m| SERVED_MAJORS.contains(&m));
    let (fmaj, fmin) = fabric::library_version();
    let fpath = loaded_libfabric();
    let mut order = vec![Provider::EfaDirect];
    order.extend(Provider::auto_order());
    let reports: Vec<ProvReport> = order.iter().map(ask).collect();
    let listed = fabric::list_providers();
    let (gmode, gprov, gwhy) = gda_mode(&reports);
    let nics = nic_report(args.sysfs_root.as_deref());
    let driver = cuda_driver_version();
    // The route the library would decide here (provider from NVSHMEM_LIBFABRIC_PROVIDER, else the
    // automatic order; the rest of the configuration from the environment).
    let route = nvshmem_efa_gda::config::Config::from_env()
        .map_err(|e| e.to_string())
        .and_then(|cfg| {
            Transport::decide_route(&cfg)
                .map_err(|e| e.message)
                .map(|(_, _, r)| {
                    let line = r.provider_line(cfg.provider.as_ref());
                    (r, line)
                })
        });
    let mut vars: Vec<(String, String)> = start_environment()
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("NVSHMEM_")
                || k == "CUDA_MODULE_LOADING"
                || k == "CUDA_DEVICE_MAX_CONNECTIONS"
                || k.starts_with("FI_")
        })
        .collect();
    vars.sort();
    let any_provider = reports.iter().any(|r| r.answer.is_ok());
    let (code, verdict) = if !any_provider {
        (
            1u8,
            "no libfabric provider answers: the library cannot move data here".to_string(),
        )
    } else if let Err(why) = &nv {
        (
            4,
            format!(
                "no NVSHMEM found ({why}; set NVSHMEM_HOME or install nvidia-nvshmem-cu12/-cu13)"
            ),
        )
    } else if served != Some(true) {
        let n = nv.as_ref().expect("checked above");
        (
            3,
            match n.abi {
                Some(m) => format!(
                    "NVSHMEM {} uses transport ABI {m}, which this library does not serve (serves {:?})",
                    n.version.as_deref().unwrap_or("?"),
                    SERVED_MAJORS
                ),
                None => "the NVSHMEM found has no known transport ABI (version unknown)".to_string(),
            },
        )
    } else {
        (
            0,
            "ready: NVSHMEM's ABI is served and a libfabric provider answers".to_string(),
        )
    };

    if args.json {
        let nv_j = match &nv {
            Err(why) => J::O(vec![("found", J::B(false)), ("why", J::s(why.clone()))]),
            Ok(n) => J::O(vec![
                ("found", J::B(true)),
                ("source", J::s(n.source.clone())),
                ("home", J::s(n.home.display().to_string())),
                (
                    "host_library",
                    J::opt_s(n.host_lib.as_ref().map(|p| p.display().to_string())),
                ),
                ("version", J::opt_s(n.version.clone())),
                ("abi", n.abi.map(|m| J::N(m as i64)).unwrap_or(J::Null)),
                ("abi_from", J::s(n.abi_from)),
                ("served", served.map(J::B).unwrap_or(J::Null)),
            ]),
        };
        let provs = reports
            .iter()
            .map(|r| match &r.answer {
                Ok(i) => J::O(vec![
                    ("name", J::s(r.name)),
                    ("answers", J::B(true)),
                    ("provider", J::s(i.provider_name())),
                    ("fabric", J::s(i.fabric_name())),
                    ("domain", J::s(i.domain_name())),
                    ("rma", J::B(true)),
                    ("atomics", J::B(r.atomics)),
                    ("hmem", J::B(r.hmem)),
                ]),
                Err(e) => J::O(vec![
                    ("name", J::s(r.name)),
                    ("answers", J::B(false)),
                    ("error", J::s(e.clone())),
                ]),
            })
            .collect();
        let doc = J::O(vec![
            (
                "library",
                J::O(vec![
                    ("version", J::s(version)),
                    (
                        "served_abis",
                        J::A(SERVED_MAJORS.iter().map(|m| J::N(*m as i64)).collect()),
                    ),
                ]),
            ),
            ("nvshmem", nv_j),
            (
                "libfabric",
                J::O(vec![
                    ("version", J::s(format!("{fmaj}.{fmin}"))),
                    ("path", J::opt_s(fpath.clone())),
                    ("providers", J::A(provs)),
                    (
                        "listed",
                        J::A(
                            listed
                                .iter()
                                .map(|(p, f)| J::A(vec![J::s(p.clone()), J::s(f.clone())]))
                                .collect(),
                        ),
                    ),
                ]),
            ),
            (
                "gda",
                J::O(vec![
                    ("mode", J::s(gmode)),
                    ("provider", J::opt_s(gprov)),
                    ("why", J::s(gwhy.clone())),
                ]),
            ),
            (
                "route",
                match &route {
                    Ok((r, line)) => J::O(vec![
                        ("line", J::s(line.clone())),
                        ("provider", J::s(r.caps.prov_name.clone())),
                        ("fabric", J::s(r.caps.fabric_name.clone())),
                        ("staging", J::s(r.staging.to_string())),
                        ("provider_atomics", J::B(r.provider_atomics)),
                        ("ipc", J::B(r.ipc)),
                        ("progress_sleeps", J::B(r.progress_sleeps)),
                        ("nic_writes_gpu", J::B(r.caps.nic_writes_gpu)),
                        ("native_atomics", J::B(r.caps.native_atomics)),
                        ("per_peer_lanes", J::B(r.caps.per_peer_lanes)),
                        ("gda_ops", J::B(r.caps.gda_ops)),
                        ("gpu_registration", J::s(r.gpu_registration.to_string())),
                        ("note", J::opt_s(r.note.clone())),
                        ("summary", J::s(r.to_string())),
                    ]),
                    Err(e) => J::O(vec![("error", J::s(e.clone()))]),
                },
            ),
            (
                "cuda_driver",
                driver.map(|v| J::N(v as i64)).unwrap_or(J::Null),
            ),
            ("nics", nics_json(&nics)),
            ("environment", J::M(vars.clone())),
            ("exit_code", J::N(code as i64)),
            ("verdict", J::s(verdict.clone())),
        ]);
        let mut out = String::new();
        doc.write(&mut out);
        println!("{out}");
        return ExitCode::from(code);
    }

    println!("nvshmem-efa-gda {version}");
    println!(
        "  serves NVSHMEM transport ABIs: {}",
        SERVED_MAJORS
            .iter()
            .map(|m| format!("{m} ({})", release_of_abi(*m)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("NVSHMEM");
    match &nv {
        Err(why) => println!("  not found: {why}"),
        Ok(n) => {
            println!("  found via      {}", n.source);
            println!("  home           {}", n.home.display());
            match &n.host_lib {
                Some(p) => println!("  host library   {}", p.display()),
                None => println!("  host library   not found under {}", n.home.display()),
            }
            println!(
                "  version        {}",
                n.version.as_deref().unwrap_or("unknown")
            );
            match n.abi {
                Some(m) => println!("  transport ABI  {m} (from {})", n.abi_from),
                None => println!("  transport ABI  unknown"),
            }
            println!(
                "  served         {}",
                match served {
                    Some(true) => "yes".to_string(),
                    Some(false) => format!("NO (this library serves {:?})", SERVED_MAJORS),
                    None => "unknown".to_string(),
                }
            );
        }
    }
    println!("libfabric");
    println!(
        "  version        {fmaj}.{fmin} ({})",
        fpath
            .as_deref()
            .map(|p| format!("loaded from {p}"))
            .unwrap_or_else(|| "path unknown".into())
    );
    println!("  providers (RDM endpoint as the library asks for it):");
    println!(
        "    {:<11} {:<8} {:<22} {:<4} {:<8} {:<4}",
        "name", "answers", "fabric", "RMA", "atomics", "HMEM"
    );
    for r in &reports {
        match &r.answer {
            Ok(i) => println!(
                "    {:<11} {:<8} {:<22} {:<4} {:<8} {:<4}",
                r.name,
                "yes",
                i.fabric_name(),
                "yes",
                yes(r.atomics),
                yes(r.hmem)
            ),
            Err(_) => println!("    {:<11} {:<8}", r.name, "no"),
        }
    }
    let mut names: Vec<&str> = listed.iter().map(|(p, _)| p.as_str()).collect();
    names.dedup();
    println!(
        "  libfabric lists: {}",
        if names.is_empty() {
            "nothing".to_string()
        } else {
            names.join(", ")
        }
    );
    println!("GDA");
    match gprov {
        Some(p) => println!("  NVSHMEM_EFA_GDA=auto would use: {gmode} EFA queues over {p}"),
        None => println!("  NVSHMEM_EFA_GDA=auto would use: {gmode}"),
    }
    println!("  why: {gwhy}");
    print_nics(&nics);
    println!("Route (decided once at initialisation, from the provider's capabilities and the configuration)");
    match &route {
        Ok((r, line)) => {
            println!("  {line}");
            println!(
                "  provider       {} (fabric {})",
                r.caps.prov_name, r.caps.fabric_name
            );
            println!(
                "  GPU memory     {}",
                match r.staging {
                    Staging::Off if r.caps.nic_writes_gpu =>
                        "the NIC moves it (FI_HMEM)".to_string(),
                    Staging::Off => "handed to the provider (FI_HMEM)".to_string(),
                    s => format!("staged through host buffers (staged: {s})"),
                }
            );
            println!("  registration   GPU memory {}", r.gpu_registration);
            if let Some(n) = &r.note {
                println!("  note           {n}");
            }
            println!(
                "  atomics        {}",
                if r.provider_atomics {
                    "provider atomics"
                } else {
                    "applied at the target PE"
                }
            );
            println!(
                "  same host      {}",
                if r.ipc {
                    "GPU memory by CUDA IPC copies"
                } else {
                    "as other hosts (no CUDA IPC)"
                }
            );
            println!(
                "  progress       {}",
                if r.progress_sleeps {
                    "thread backs off when idle"
                } else {
                    "thread polls (manual progress or software provider)"
                }
            );
            println!("  caps           {}", r.caps);
        }
        Err(e) => println!("  none: {e}"),
    }
    println!("CUDA");
    match driver {
        Some(v) => println!("  driver         {}.{} ({v})", v / 1000, (v % 1000) / 10),
        None => println!(
            "  driver         not found (libcuda.so.1 does not load): GPU memory and GDA need it"
        ),
    }
    println!("Environment (NVSHMEM_*, FI_*, CUDA_MODULE_LOADING, CUDA_DEVICE_MAX_CONNECTIONS)");
    if vars.is_empty() {
        println!("  none set");
    }
    for (k, v) in &vars {
        println!("  {k}={v}");
    }
    println!("Verdict (exit {code}): {verdict}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_map_to_abis() {
        assert_eq!(abi_for_release(3, 4), Some(3));
        assert_eq!(abi_for_release(3, 5), Some(4));
        assert_eq!(abi_for_release(3, 8), Some(7));
        assert_eq!(abi_for_release(3, 3), None);
        assert_eq!(abi_for_release(4, 0), None);
        assert_eq!(parse_release("3.4.5"), Some((3, 4, 5)));
        assert_eq!(parse_release("3.5"), Some((3, 5, 0)));
        assert_eq!(parse_release("x"), None);
    }

    #[test]
    fn json_escapes() {
        let mut s = String::new();
        J::O(vec![
            ("a", J::s("q\"\\\n\u{1}")),
            ("b", J::A(vec![J::N(3), J::B(false), J::Null])),
        ])
        .write(&mut s);
        assert_eq!(s, r#"{"a": "q\"\\\n\u0001", "b": [3, false, null]}"#);
    }

    #[test]
    fn header_defines_are_read() {
        let h = "#define NVSHMEM_VENDOR_MINOR_VERSION 4\n#define NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION 3\n";
        assert_eq!(header_define(h, "NVSHMEM_VENDOR_MINOR_VERSION"), Some(4));
        assert_eq!(
            header_define(h, "NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION"),
            Some(3)
        );
        assert_eq!(header_define(h, "NVSHMEM_VENDOR_MAJOR"), None);
    }
}
