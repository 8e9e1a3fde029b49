//! Nearest NICs: where a GPU and the NICs sit on the PCIe tree, and which NICs a GPU's PE should use.
//!
//! The topology comes from sysfs: `/sys/bus/pci/devices/<bdf>` is a link into `/sys/devices`, whose
//! path is the device's PCIe ancestry (root complex, root port, switch ports, the device). Two
//! devices' distance is read from the longest common prefix of those paths, with `numa_node` for
//! devices under different root complexes. The classes are those NVSHMEM's topology code and NCCL
//! use, nearest first:
//!
//! | class | meaning |
//! |---|---|
//! | PIX | at most one PCIe switch between them (same switch, or the same downstream port) |
//! | PXB | several switches, below the same root complex |
//! | PHB | only the root complex (host bridge) in common |
//! | NODE | different root complexes, same NUMA node |
//! | SYS | different NUMA nodes (the inter-socket link) |
//!
//! The choice follows NVSHMEM's own for its libfabric transport (3.6+): a PE is offered
//! `n_nics / n_local_gpus` devices (at least one), taken only from the GPU's nearest class, spread
//! so that GPUs share a NIC only when they must; the transport then keeps at most
//! `NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE` of them (default 16). `NVSHMEM_ENABLE_NIC_PE_MAPPING=1` turns
//! the distance rule off: local PE `i` gets NIC `i mod n_nics`. `NVSHMEM_HCA_LIST` and
//! `NVSHMEM_HCA_PE_MAPPING` are read only by NVSHMEM's InfiniBand transports, not by its libfabric
//! transport; they are reported as ignored. The root of the sysfs tree is a parameter, so tests run
//! the choice on a fake tree.
use std::cmp::Reverse;
use std::fmt;
use std::path::{Path, PathBuf};

/// A topology error: a device or sysfs entry that cannot be read, or a bad variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoError(pub String);

impl fmt::Display for TopoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TopoError {}

type Result<T> = std::result::Result<T, TopoError>;

/// A PCI address (domain:bus:device.function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddr {
    /// Parses `dddd:bb:dd.f`, with a domain of any width (CUDA writes eight digits:
    /// `00000000:53:00.0`), in either case.
    pub fn parse(s: &str) -> Result<PciAddr> {
        let bad = || TopoError(format!("not a PCI address (dddd:bb:dd.f): {s:?}"));
        let s = s.trim();
        let (domain, rest) = s.split_once(':').ok_or_else(bad)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |t: &str, max: u32| {
            (!t.is_empty() && t.len() <= 8)
                .then(|| u32::from_str_radix(t, 16).ok())
                .flatten()
                .filter(|v| *v <= max)
                .ok_or_else(bad)
        };
        Ok(PciAddr {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xff)? as u8,
            device: hex(device, 0x1f)? as u8,
            function: hex(function, 7)? as u8,
        })
    }
}

impl fmt::Display for PciAddr {
    /// The sysfs spelling: `0000:53:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// A PCI device's place in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    pub addr: PciAddr,
    /// Components of its path below `/sys/devices`, root complex first, the device last
    /// (`["pci0000:00", "0000:00:01.0", "0000:01:00.0", ...]`).
    pub path: Vec<String>,
    /// `numa_node`, where sysfs knows it (-1 there means unknown).
    pub numa: Option<i32>,
}

/// PCI distance classes, nearest first (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Distance {
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl Distance {
    pub fn as_str(self) -> &'static str {
        match self {
            Distance::Pix => "PIX",
            Distance::Pxb => "PXB",
            Distance::Phb => "PHB",
            Distance::Node => "NODE",
            Distance::Sys => "SYS",
        }
    }

    /// One line for people.
    pub fn describe(self) -> &'static str {
        match self {
            Distance::Pix => "same PCIe switch",
            Distance::Pxb => "same root complex, across PCIe switches",
            Distance::Phb => "only the host bridge in common",
            Distance::Node => "other root complex, same NUMA node",
            Distance::Sys => "other NUMA node (across the socket link)",
        }
    }
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How two devices relate on the PCIe tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub distance: Distance,
    /// Path components the two share (0: different root complexes).
    pub shared: usize,
    /// Levels from each device up to their common ancestor, added up.
    pub hops: usize,
}

/// The distance between two devices.
pub fn link(a: &PciDevice, b: &PciDevice) -> Link {
    let shared = a
        .path
        .iter()
        .zip(&b.path)
        .take_while(|(x, y)| x == y)
        .count();
    let (up_a, up_b) = (a.path.len() - shared, b.path.len() - shared);
    let distance = if shared == 0 {
        match (a.numa, b.numa) {
            (Some(x), Some(y)) if x != y => Distance::Sys,
            // Unknown NUMA nodes (single-socket machines report -1) count as the same node.
            _ => Distance::Node,
        }
    } else if shared == 1 {
        Distance::Phb
    } else if up_a <= 2 && up_b <= 2 {
        // device -> downstream port -> the switch both hang off (or one port for both).
        Distance::Pix
    } else {
        Distance::Pxb
    };
    Link {
        distance,
        shared,
        hops: up_a + up_b,
    }
}

/// A sysfs tree: the machine's (`/`) or a copy under another root (tests).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// The running machine's sysfs.
    pub fn system() -> Sysfs {
        Sysfs::at("/")
    }

    /// A tree laid out like sysfs under `root` (`root/sys/bus/pci/devices/...`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    fn sys(&self, rel: &str) -> PathBuf {
        self.root.join("sys").join(rel)
    }

    /// The device at `addr`: its path below `/sys/devices` and its NUMA node.
    pub fn pci_device(&self, addr: PciAddr) -> Result<PciDevice> {
        let link = self.sys("bus/pci/devices").join(addr.to_string());
        let real = link
            .canonicalize()
            .map_err(|e| TopoError(format!("PCI device {addr}: {}: {e}", link.display())))?;
        let devices = self
            .sys("devices")
            .canonicalize()
            .map_err(|e| TopoError(format!("{}: {e}", self.sys("devices").display())))?;
        let rel = real.strip_prefix(&devices).map_err(|_| {
            TopoError(format!(
                "PCI device {addr}: {} is not below {}",
                real.display(),
                devices.display()
            ))
        })?;
        let path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if path.len() < 2 || !path[0].starts_with("pci") {
            return Err(TopoError(format!(
                "PCI device {addr}: unexpected sysfs path {}",
                real.display()
            )));
        }
        let numa = read_trimmed(&real.join("numa_node"))
            .and_then(|s| s.parse::<i32>().ok())
            .filter(|n| *n >= 0);
        Ok(PciDevice { addr, path, numa })
    }

    /// NVIDIA GPUs on the PCI bus (vendor 0x10de, display or 3D controller class), in address
    /// order (CUDA's order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    pub fn nvidia_gpus(&self) -> Result<Vec<PciAddr>> {
        let dir = self.sys("bus/pci/devices");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(TopoError(format!("{}: {e}", dir.display()))),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            let vendor = read_trimmed(&p.join("vendor")).unwrap_or_default();
            let class = read_trimmed(&p.join("class")).unwrap_or_default();
            // class 0x0300xx VGA, 0x0302xx 3D controller (data-centre GPUs).
            if vendor == "0x10de" && (class.starts_with("0x0300") || class.starts_with("0x0302")) {
                if let Ok(a) = PciAddr::parse(&e.file_name().to_string_lossy()) {
                    out.push(a);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The PCI address of a NIC known by name: an RDMA device (`/sys/class/infiniband/<name>`,
    /// where EFA devices appear, as NVSHMEM looks them up) or a network interface
    /// (`/sys/class/net/<name>`). None for virtual devices (loopback, veth) and unknown names.
    pub fn nic_by_name(&self, name: &str) -> Option<PciAddr> {
        if name.is_empty() || name.contains('/') {
            return None;
        }
        ["class/infiniband", "class/net"].iter().find_map(|class| {
            let dev = self
                .sys(class)
                .join(name)
                .join("device")
                .canonicalize()
                .ok()?;
            // A PCI function's directory is named by its address. The `device` link may point
            // below it (virtio-net: `<bdf>/virtio2`), so the nearest ancestor so named counts;
            // a virtual device has no `device` link, and one outside the PCI tree has no such
            // ancestor.
            dev.ancestors()
                .take(3)
                .find_map(|d| PciAddr::parse(&d.file_name()?.to_string_lossy()).ok())
        })
    }
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// NVSHMEM's NIC-selection variables, as its libfabric transport reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicPolicy {
    /// `NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE` (NVSHMEM's default 16).
    pub max_nic_per_pe: usize,
    /// `NVSHMEM_ENABLE_NIC_PE_MAPPING` (default false): round robin instead of distance.
    pub nic_pe_mapping: bool,
    /// Variables that are set but that NVSHMEM's libfabric transport does not read.
    pub ignored: Vec<String>,
}

/// NVSHMEM's default for `NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE`.
pub const DEFAULT_MAX_NIC_PER_PE: usize = 16;

impl Default for NicPolicy {
    fn default() -> Self {
        NicPolicy {
            max_nic_per_pe: DEFAULT_MAX_NIC_PER_PE,
            nic_pe_mapping: false,
            ignored: Vec::new(),
        }
    }
}

impl NicPolicy {
    /// Reads the variables through `get` (the process environment in `from_env`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<NicPolicy> {
        let mut p = NicPolicy::default();
        if let Some(v) = get("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE") {
            p.max_nic_per_pe = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    TopoError(format!(
                        "NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE={v:?}: expected a whole number >= 1"
                    ))
                })?;
        }
        if let Some(v) = get("NVSHMEM_ENABLE_NIC_PE_MAPPING") {
            p.nic_pe_mapping = parse_bool(&v).ok_or_else(|| {
                TopoError(format!(
                    "NVSHMEM_ENABLE_NIC_PE_MAPPING={v:?}: expected 1/0, true/false, yes/no or on/off"
                ))
            })?;
        }
        for k in ["NVSHMEM_HCA_LIST", "NVSHMEM_HCA_PE_MAPPING"] {
            if get(k).is_some() {
                p.ignored.push(k.to_string());
            }
        }
        Ok(p)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<NicPolicy> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" | "on" | "t" => Some(true),
        "0" | "false" | "no" | "n" | "off" | "f" => Some(false),
        _ => None,
    }
}

/// One chosen NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// Index into the NIC list given to [`choose`].
    pub nic: usize,
    pub link: Link,
}

/// The NICs chosen for one GPU (one PE), nearest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNics {
    /// Index into the GPU list given to [`choose`] (its local PE rank).
    pub gpu: usize,
    pub picks: Vec<Pick>,
    /// Why these, in words.
    pub why: String,
}

/// Chooses the NICs of every local GPU, one PE a GPU, in the GPUs' order (local PE ranks).
pub fn choose(gpus: &[PciDevice], nics: &[PciDevice], policy: &NicPolicy) -> Vec<GpuNics> {
    if nics.is_empty() {
        return gpus
            .iter()
            .enumerate()
            .map(|(g, _)| GpuNics {
                gpu: g,
                picks: Vec::new(),
                why: "no NIC with a PCI address".to_string(),
            })
            .collect();
    }
    if policy.nic_pe_mapping {
        return gpus
            .iter()
            .enumerate()
            .map(|(g, gpu)| {
                let nic = g % nics.len();
                GpuNics {
                    gpu: g,
                    picks: vec![Pick {
                        nic,
                        link: link(gpu, &nics[nic]),
                    }],
                    why: format!(
                        "NVSHMEM_ENABLE_NIC_PE_MAPPING=1: local PE {g} takes NIC {g} mod {}",
                        nics.len()
                    ),
                }
            })
            .collect();
    }
    // NVSHMEM offers each PE n_nics / n_local_pes devices (at least one); its libfabric transport
    // keeps at most NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE.
    let offered = (nics.len() / gpus.len().max(1)).max(1);
    let want = offered.min(policy.max_nic_per_pe);
    let links: Vec<Vec<Link>> = gpus
        .iter()
        .map(|g| nics.iter().map(|n| link(g, n)).collect())
        .collect();
    // Only the GPU's nearest class is eligible: a farther NIC is never added to fill up.
    let eligible: Vec<Vec<usize>> = links
        .iter()
        .map(|ls| {
            let best = ls.iter().map(|l| l.distance).min().expect("nics not empty");
            (0..nics.len())
                .filter(|&n| ls[n].distance == best)
                .collect()
        })
        .collect();
    let best_class: Vec<Distance> = eligible
        .iter()
        .zip(&links)
        .map(|(e, ls)| ls[e[0]].distance)
        .collect();
    let mut uses = vec![0usize; nics.len()];
    let mut picks: Vec<Vec<Pick>> = vec![Vec::new(); gpus.len()];
    // Nearer pairs first, as NVSHMEM assigns (GPU, NIC) pairs in distance order: GPUs whose
    // nearest NICs are nearer choose before GPUs that must reach farther. Within a class, round
    // robin over the GPUs, one NIC each per round, so that NICs are shared evenly.
    let mut classes = best_class.clone();
    classes.sort();
    classes.dedup();
    for class in classes {
        let group: Vec<usize> = (0..gpus.len())
            .filter(|&g| best_class[g] == class)
            .collect();
        for _ in 0..want {
            for &g in &group {
                let best = eligible[g]
                    .iter()
                    .copied()
                    .filter(|n| !picks[g].iter().any(|p| p.nic == *n))
                    .min_by_key(|&n| (uses[n], Reverse(links[g][n].shared), links[g][n].hops, n));
                if let Some(n) = best {
                    uses[n] += 1;
                    picks[g].push(Pick {
                        nic: n,
                        link: links[g][n],
                    });
                }
            }
        }
    }
    picks
        .into_iter()
        .enumerate()
        .map(|(g, mut ps)| {
            ps.sort_by_key(|p| (p.link.distance, Reverse(p.link.shared), p.link.hops, p.nic));
            let class = ps.first().map(|p| p.link.distance).expect("want >= 1");
            let limit = if want < offered {
                format!(
                    "NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE={} of the {offered} offered",
                    policy.max_nic_per_pe
                )
            } else {
                format!(
                    "{offered} offered ({} NICs / {} GPUs)",
                    nics.len(),
                    gpus.len()
                )
            };
            let shared = ps.iter().filter(|p| uses[p.nic] > 1).count();
            let mut why = format!(
                "{} of {} NICs at the nearest distance {class} ({}); {limit}",
                ps.len(),
                eligible[g].len(),
                class.describe()
            );
            if shared > 0 {
                why.push_str(&format!("; {shared} shared with another GPU"));
            }
            GpuNics {
                gpu: g,
                picks: ps,
                why,
            }
        })
        .collect()
}

/// A NIC offered to [`report`]: its name, the provider(s) listing it, its PCI address if known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicName {
    pub name: String,
    pub provider: String,
    pub pci: Option<PciAddr>,
}

/// One GPU of a [`Report`] and its NICs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLine {
    pub gpu: PciDevice,
    /// (NIC name, its device, the link to it), nearest first.
    pub nics: Vec<(String, PciDevice, Link)>,
    pub why: String,
}

/// The NIC choice for every GPU of the machine, as `nvshmem-efa-gda info` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub policy: NicPolicy,
    pub gpus: Vec<GpuLine>,
    /// NICs with a PCI address (one entry a device, providers joined).
    pub nics: Vec<NicName>,
    /// Things that could not be read, and what is missing, in words.
    pub notes: Vec<String>,
}

/// Builds the report: the NVIDIA GPUs sysfs lists, the NICs given (a name without a PCI address
/// is looked up in sysfs by name; one that has none is left out: loopback, veth, shm), and the
/// choice under `policy`.
pub fn report(sys: &Sysfs, listed: &[NicName], policy: NicPolicy) -> Report {
    let mut notes = Vec::new();
    let mut nics: Vec<NicName> = Vec::new();
    for n in listed {
        let Some(pci) = n.pci.or_else(|| sys.nic_by_name(&n.name)) else {
            continue;
        };
        match nics.iter_mut().find(|m| m.pci == Some(pci)) {
            Some(m) => {
                if !m.provider.split(',').any(|p| p == n.provider) {
                    m.provider.push(',');
                    m.provider.push_str(&n.provider);
                }
            }
            None => nics.push(NicName {
                name: n.name.clone(),
                provider: n.provider.clone(),
                pci: Some(pci),
            }),
        }
    }
    let mut nic_devs = Vec::new();
    let mut kept = Vec::new();
    for n in nics {
        match sys.pci_device(n.pci.expect("kept only with an address")) {
            Ok(d) => {
                nic_devs.push(d);
                kept.push(n);
            }
            Err(e) => notes.push(format!("NIC {} left out: {e}", n.name)),
        }
    }
    let gpu_addrs = match sys.nvidia_gpus() {
        Ok(g) => g,
        Err(e) => {
            notes.push(format!("cannot list PCI devices: {e}"));
            Vec::new()
        }
    };
    let mut gpu_devs = Vec::new();
    for a in gpu_addrs {
        match sys.pci_device(a) {
            Ok(d) => gpu_devs.push(d),
            Err(e) => notes.push(format!("GPU {a} left out: {e}")),
        }
    }
    if gpu_devs.is_empty() {
        notes.push("no NVIDIA GPU on the PCI bus (sysfs lists none)".to_string());
    }
    if kept.is_empty() {
        notes.push(
            "no NIC with a PCI address: libfabric lists no EFA/verbs device here (tcp and shm \
             have none), so there is no NIC to choose"
                .to_string(),
        );
    }
    let gpus = choose(&gpu_devs, &nic_devs, &policy)
        .into_iter()
        .map(|c| GpuLine {
            gpu: gpu_devs[c.gpu].clone(),
            nics: c
                .picks
                .iter()
                .map(|p| (kept[p.nic].name.clone(), nic_devs[p.nic].clone(), p.link))
                .collect(),
            why: c.why,
        })
        .collect();
    for k in &policy.ignored {
        notes.push(format!(
            "{k} is set but ignored: NVSHMEM reads it only in its InfiniBand transports"
        ));
    }
    Report {
        policy,
        gpus,
        nics: kept,
        notes,
    }
}

/// The NICs for the GPU at `gpu` (a PE's device, e.g. from `cuDeviceGetPCIBusId`), chosen as for
/// the whole node: the other GPUs sysfs lists take part, so that two PEs of one node do not pile
/// onto the same NICs. A GPU sysfs does not list as an NVIDIA GPU is chosen for alone. The
/// transport's rails take their NICs from here.
pub fn nics_for_gpu(
    sys: &Sysfs,
    gpu: PciAddr,
    listed: &[NicName],
    policy: NicPolicy,
) -> Result<GpuLine> {
    let mut r = report(sys, listed, policy.clone());
    if let Some(line) = r.gpus.iter().position(|l| l.gpu.addr == gpu) {
        return Ok(r.gpus.swap_remove(line));
    }
    let dev = sys.pci_device(gpu)?;
    let nic_devs: Vec<PciDevice> = r
        .nics
        .iter()
        .map(|n| sys.pci_device(n.pci.expect("report keeps NICs with an address")))
        .collect::<Result<_>>()?;
    let c = choose(std::slice::from_ref(&dev), &nic_devs, &policy)
        .pop()
        .expect("one GPU in, one out");
    Ok(GpuLine {
        gpu: dev,
        nics: c
            .picks
            .iter()
            .map(|p| (r.nics[p.nic].name.clone(), nic_devs[p.nic].clone(), p.link))
            .collect(),
        why: c.why,
    })
}

/// The rails of a PE on GPU `gpu`: indices into `listed` of the NICs [`nics_for_gpu`] chooses for
/// it, nearest first (at most `policy.max_nic_per_pe`).
pub fn rail_order(
    sys: &Sysfs,
    gpu: PciAddr,
    listed: &[NicName],
    policy: NicPolicy,
) -> Result<Vec<usize>> {
    let line = nics_for_gpu(sys, gpu, listed, policy)?;
    Ok(line
        .nics
        .iter()
        .filter_map(|(name, _, _)| listed.iter().position(|n| n.name == *name))
        .collect())
}

#[cfg(test)]
#[path = "topo_tests.rs"]
mod tests;
