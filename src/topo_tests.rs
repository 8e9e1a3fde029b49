//! NIC choice on fake sysfs trees: a p5-like machine (8 GPUs, 32 EFA NICs, 2 sockets, one PCIe
//! switch per GPU with its 4 NICs, the layout of AWS's own NCCL topology file for p5.48xlarge),
//! variants of it, and the parsing around it.
use super::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A sysfs tree in a temporary directory, removed on drop.
struct FakeSys {
    root: PathBuf,
}

impl FakeSys {
    fn new() -> FakeSys {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "negda-topo-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(root.join("sys/devices")).unwrap();
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        FakeSys { root }
    }

    fn sysfs(&self) -> Sysfs {
        Sysfs::at(&self.root)
    }

    /// A PCI function at `path` (components below /sys/devices), linked from sys/bus/pci/devices.
    fn device(&self, path: &[String], vendor: &str, class: &str, numa: i32) {
        let dir = self.root.join("sys/devices").join(path.join("/"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
        let name = path.last().unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/{}", path.join("/")),
            self.root.join("sys/bus/pci/devices").join(name),
        )
        .unwrap();
    }

    /// `/sys/class/<class>/<name>/device` -> the PCI function at `path`.
    fn class_link(&self, class: &str, name: &str, path: &[String]) {
        let dir = self.root.join("sys/class").join(class).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/{}", path.join("/")),
            dir.join("device"),
        )
        .unwrap();
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

const NVIDIA: &str = "0x10de";
const GPU_CLASS: &str = "0x030200";
const AMAZON: &str = "0x1d0f";
const NIC_CLASS: &str = "0x020000";

/// The machine built by `p5_like`: addresses of GPUs and NICs.
struct Machine {
    sys: FakeSys,
    gpus: Vec<PciAddr>,
    /// NICs in the order the provider lists them: interleaved across the switches and from the
    /// last GPU's down (a provider's own order need not follow the topology).
    nics: Vec<PciAddr>,
    /// Which GPU's switch each NIC of `nics` sits under.
    nic_home: Vec<usize>,
}

fn addr(bus: u32) -> PciAddr {
    PciAddr {
        domain: 0,
        bus: bus as u8,
        device: 0,
        function: 0,
    }
}

fn bdf(bus: u32, dev: u32) -> String {
    format!("0000:{bus:02x}:{dev:02x}.0")
}

/// 8 GPUs; GPU g on socket g / 4 (NUMA node g / 4) below its own root complex and PCIe switch,
/// with `nics_per_gpu` NICs on other downstream ports of that switch, except the GPUs in
/// `bare` (no NICs under their switch).
fn p5_like(nics_per_gpu: u32, bare: &[usize]) -> Machine {
    let sys = FakeSys::new();
    let mut gpus = Vec::new();
    let mut by_switch: Vec<Vec<PciAddr>> = Vec::new();
    for g in 0..8u32 {
        let r = 0x10 + 0x20 * g; // root bus of this GPU's root complex
        let numa = (g / 4) as i32;
        let base = vec![
            format!("pci0000:{r:02x}"),
            bdf(r, 1),     // root port
            bdf(r + 1, 0), // switch upstream port
        ];
        let under = |port: u32| {
            let mut p = base.clone();
            p.push(bdf(r + 2, port)); // switch downstream port
            p.push(bdf(r + 3 + port, 0)); // the endpoint below it
            p
        };
        sys.device(&under(0), NVIDIA, GPU_CLASS, numa);
        gpus.push(addr(r + 3));
        let mut mine = Vec::new();
        if !bare.contains(&(g as usize)) {
            for j in 1..=nics_per_gpu {
                sys.device(&under(j), AMAZON, NIC_CLASS, numa);
                mine.push(addr(r + 3 + j));
            }
        }
        by_switch.push(mine);
    }
    let (mut nics, mut nic_home) = (Vec::new(), Vec::new());
    for j in 0..nics_per_gpu as usize {
        for (g, mine) in by_switch.iter().enumerate() {
            if let Some(a) = mine.get(j) {
                nics.push(*a);
                nic_home.push(g);
            }
        }
    }
    nics.reverse();
    nic_home.reverse();
    Machine {
        sys,
        gpus,
        nics,
        nic_home,
    }
}

fn devices(s: &Sysfs, addrs: &[PciAddr]) -> Vec<PciDevice> {
    addrs.iter().map(|a| s.pci_device(*a).unwrap()).collect()
}

fn run(m: &Machine, policy: &NicPolicy) -> Vec<GpuNics> {
    let s = m.sys.sysfs();
    choose(&devices(&s, &m.gpus), &devices(&s, &m.nics), policy)
}

#[test]
fn p5_each_gpu_gets_the_four_nics_of_its_switch() {
    let m = p5_like(4, &[]);
    assert_eq!(m.nics.len(), 32);
    let out = run(&m, &NicPolicy::default());
    assert_eq!(out.len(), 8);
    let mut seen = std::collections::HashSet::new();
    for c in &out {
        assert_eq!(c.picks.len(), 4, "GPU {}: {:?}", c.gpu, c.picks);
        for p in &c.picks {
            assert_eq!(
                m.nic_home[p.nic], c.gpu,
                "GPU {} got a NIC of GPU {}",
                c.gpu, m.nic_home[p.nic]
            );
            assert_eq!(p.link.distance, Distance::Pix);
            assert_eq!(p.link.hops, 4);
            assert!(seen.insert(p.nic), "NIC {} chosen twice", p.nic);
        }
        assert!(
            c.why.contains("4 of 4 NICs at the nearest distance PIX"),
            "{}",
            c.why
        );
        assert!(c.why.contains("4 offered (32 NICs / 8 GPUs)"), "{}", c.why);
        assert!(!c.why.contains("shared"), "{}", c.why);
    }
    assert_eq!(seen.len(), 32);
}

#[test]
fn p5_max_nic_per_pe_limits_the_rails_to_nearest_ones() {
    let m = p5_like(4, &[]);
    let policy = NicPolicy::from_lookup(|k| {
        (k == "NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE").then(|| "2".to_string())
    })
    .unwrap();
    assert_eq!(policy.max_nic_per_pe, 2);
    for c in run(&m, &policy) {
        assert_eq!(c.picks.len(), 2);
        assert!(c.picks.iter().all(|p| m.nic_home[p.nic] == c.gpu));
        assert!(
            c.why
                .contains("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE=2 of the 4 offered"),
            "{}",
            c.why
        );
    }
}

#[test]
fn a_gpu_without_its_own_nics_stays_on_its_socket() {
    // GPU 3's switch has no NICs: 28 NICs for 8 GPUs, 3 offered to each.
    let m = p5_like(4, &[3]);
    assert_eq!(m.nics.len(), 28);
    let s = m.sys.sysfs();
    let nic_devs = devices(&s, &m.nics);
    let out = run(&m, &NicPolicy::default());
    let g3 = &out[3];
    assert_eq!(g3.picks.len(), 3);
    for p in &g3.picks {
        assert_eq!(p.link.distance, Distance::Node, "{:?}", p);
        assert_eq!(
            nic_devs[p.nic].numa,
            Some(0),
            "GPU 3 (socket 0) got a NIC of socket 1"
        );
        assert!(m.nic_home[p.nic] < 4);
    }
    assert!(g3.why.contains("nearest distance NODE"), "{}", g3.why);
    // Every other GPU keeps NICs of its own switch only.
    for c in out.iter().filter(|c| c.gpu != 3) {
        assert_eq!(c.picks.len(), 3);
        assert!(c
            .picks
            .iter()
            .all(|p| m.nic_home[p.nic] == c.gpu && p.link.distance == Distance::Pix));
    }
    // 24 picks on 28 NICs: no NIC carries two GPUs, and no GPU reports sharing.
    let mut uses = vec![0; m.nics.len()];
    for c in &out {
        let mut mine: Vec<usize> = c.picks.iter().map(|p| p.nic).collect();
        mine.dedup();
        assert_eq!(mine.len(), c.picks.len());
        for n in mine {
            uses[n] += 1;
        }
    }
    assert!(uses.iter().all(|u| *u <= 1), "{uses:?}");
    assert!(out.iter().all(|c| !c.why.contains("shared")));
}

#[test]
fn p5en_like_two_nics_per_gpu() {
    let m = p5_like(2, &[]);
    for c in run(&m, &NicPolicy::default()) {
        let homes: Vec<usize> = c.picks.iter().map(|p| m.nic_home[p.nic]).collect();
        assert_eq!(homes, vec![c.gpu, c.gpu]);
    }
}

#[test]
fn nic_pe_mapping_is_round_robin_by_local_rank() {
    let m = p5_like(4, &[]);
    let policy =
        NicPolicy::from_lookup(|k| (k == "NVSHMEM_ENABLE_NIC_PE_MAPPING").then(|| "1".to_string()))
            .unwrap();
    let out = run(&m, &policy);
    for c in &out {
        assert_eq!(c.picks.len(), 1);
        assert_eq!(c.picks[0].nic, c.gpu);
        assert!(c.why.contains("NVSHMEM_ENABLE_NIC_PE_MAPPING=1"));
    }
    // In this provider order NIC g sits under GPU 7 - g, on the other socket: the mapping ignores
    // distance, as NVSHMEM's does.
    for c in &out {
        assert_eq!(m.nic_home[c.picks[0].nic], 7 - c.gpu);
        assert_eq!(c.picks[0].link.distance, Distance::Sys);
    }
}

#[test]
fn two_gpus_under_one_switch_split_its_nics() {
    let sys = FakeSys::new();
    let base = vec!["pci0000:00".to_string(), bdf(0, 1), bdf(1, 0)];
    let under = |port: u32| {
        let mut p = base.clone();
        p.push(bdf(2, port));
        p.push(bdf(3 + port, 0));
        p
    };
    sys.device(&under(0), NVIDIA, GPU_CLASS, 0);
    sys.device(&under(1), NVIDIA, GPU_CLASS, 0);
    sys.device(&under(2), AMAZON, NIC_CLASS, 0);
    sys.device(&under(3), AMAZON, NIC_CLASS, 0);
    let s = sys.sysfs();
    let gpus = devices(&s, &[addr(3), addr(4)]);
    let nics = devices(&s, &[addr(5), addr(6)]);
    let out = choose(&gpus, &nics, &NicPolicy::default());
    assert_eq!(out[0].picks.len(), 1);
    assert_eq!(out[1].picks.len(), 1);
    assert_ne!(out[0].picks[0].nic, out[1].picks[0].nic);
    // With NICs to spare a GPU takes several; with one NIC for two GPUs, both share it.
    let out = choose(&gpus, &nics[..1], &NicPolicy::default());
    assert_eq!(out[0].picks[0].nic, 0);
    assert_eq!(out[1].picks[0].nic, 0);
    assert!(out[1].why.contains("1 shared"), "{}", out[1].why);
}

#[test]
fn distance_classes() {
    let dev = |path: &[&str], numa: Option<i32>| PciDevice {
        addr: addr(0),
        path: path.iter().map(|s| s.to_string()).collect(),
        numa,
    };
    let gpu = dev(&["pci0000:00", "a", "b", "c", "gpu"], Some(0));
    let cases = [
        (
            dev(&["pci0000:00", "a", "b", "d", "nic"], Some(0)),
            Distance::Pix,
        ),
        (
            dev(&["pci0000:00", "a", "b", "c", "nic"], Some(0)),
            Distance::Pix,
        ),
        (
            dev(&["pci0000:00", "a", "x", "d", "nic"], Some(0)),
            Distance::Pxb,
        ),
        (dev(&["pci0000:00", "e", "nic"], Some(0)), Distance::Phb),
        (dev(&["pci0000:40", "a", "nic"], Some(0)), Distance::Node),
        (dev(&["pci0000:40", "a", "nic"], None), Distance::Node),
        (dev(&["pci0000:80", "a", "nic"], Some(1)), Distance::Sys),
    ];
    for (nic, want) in cases {
        assert_eq!(link(&gpu, &nic).distance, want, "{:?}", nic.path);
        assert_eq!(
            link(&nic, &gpu).distance,
            want,
            "symmetric for {:?}",
            nic.path
        );
    }
    assert!(Distance::Pix < Distance::Pxb && Distance::Node < Distance::Sys);
}

#[test]
fn sysfs_finds_gpus_nics_and_numa() {
    let m = p5_like(4, &[]);
    let s = m.sys.sysfs();
    assert_eq!(s.nvidia_gpus().unwrap(), m.gpus);
    let d = s.pci_device(m.gpus[5]).unwrap();
    assert_eq!(d.numa, Some(1));
    assert_eq!(d.path.len(), 5);
    assert_eq!(d.path[0], "pci0000:b0");
    // EFA devices are found by name under /sys/class/infiniband, NICs under /sys/class/net.
    let nic_path = vec![
        "pci0000:10".to_string(),
        bdf(0x10, 1),
        bdf(0x11, 0),
        bdf(0x12, 1),
        bdf(0x14, 0),
    ];
    m.sys.class_link("infiniband", "rdmap20s0", &nic_path);
    m.sys.class_link("net", "eth1", &nic_path);
    assert_eq!(s.nic_by_name("rdmap20s0"), Some(addr(0x14)));
    assert_eq!(s.nic_by_name("eth1"), Some(addr(0x14)));
    assert_eq!(s.nic_by_name("lo"), None);
    // virtio-net: the interface's `device` is a virtio device below the PCI function.
    let mut virtio = nic_path.clone();
    virtio.push("virtio2".to_string());
    std::fs::create_dir_all(m.sys.root.join("sys/devices").join(virtio.join("/"))).unwrap();
    m.sys.class_link("net", "eth0", &virtio);
    assert_eq!(s.nic_by_name("eth0"), Some(addr(0x14)));
    assert_eq!(s.nic_by_name("../x"), None);
    // A device that is not there is an error that names it.
    let e = s.pci_device(addr(0x0f)).unwrap_err();
    assert!(e.0.contains("0000:0f:00.0"), "{e}");
    // A tree without PCI devices has no GPUs (not an error).
    assert!(Sysfs::at("/nonexistent-root")
        .nvidia_gpus()
        .unwrap()
        .is_empty());
}

#[test]
fn no_nics_says_so() {
    let m = p5_like(0, &[]);
    let s = m.sys.sysfs();
    let out = choose(&devices(&s, &m.gpus), &[], &NicPolicy::default());
    assert_eq!(out.len(), 8);
    assert!(out
        .iter()
        .all(|c| c.picks.is_empty() && c.why.contains("no NIC")));
}

#[test]
fn pci_addresses_parse_and_print() {
    let a = PciAddr::parse("00000000:5A:00.0").unwrap();
    assert_eq!(a.to_string(), "0000:5a:00.0");
    assert_eq!(PciAddr::parse("0001:53:1f.7").unwrap().function, 7);
    for bad in [
        "",
        "53:00.0",
        "0000:53:00",
        "0000:153:00.0",
        "0000:53:20.0",
        "0000:53:00.8",
        "x:53:00.0",
    ] {
        assert!(PciAddr::parse(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn nvshmem_variables() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(
        NicPolicy::from_lookup(env(&[])).unwrap(),
        NicPolicy::default()
    );
    assert_eq!(NicPolicy::default().max_nic_per_pe, 16);
    for bad in ["0", "-1", "four", ""] {
        let leaked: &'static str = Box::leak(bad.to_string().into_boxed_str());
        let pairs: &'static [(&str, &str)] =
            Box::leak(vec![("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE", leaked)].into_boxed_slice());
        let e = NicPolicy::from_lookup(env(pairs)).unwrap_err();
        assert!(e.0.contains("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE"), "{e}");
    }
    let e = NicPolicy::from_lookup(env(&[("NVSHMEM_ENABLE_NIC_PE_MAPPING", "maybe")])).unwrap_err();
    assert!(e.0.contains("NVSHMEM_ENABLE_NIC_PE_MAPPING"));
    let p = NicPolicy::from_lookup(env(&[
        ("NVSHMEM_ENABLE_NIC_PE_MAPPING", "false"),
        ("NVSHMEM_HCA_PE_MAPPING", "mlx5_0:1:2"),
        ("NVSHMEM_HCA_LIST", "mlx5_0"),
    ]))
    .unwrap();
    assert!(!p.nic_pe_mapping);
    assert_eq!(
        p.ignored,
        vec!["NVSHMEM_HCA_LIST", "NVSHMEM_HCA_PE_MAPPING"]
    );
}

#[test]
fn report_merges_fabrics_and_drops_devices_without_pci() {
    let m = p5_like(4, &[]);
    let s = m.sys.sysfs();
    let mut listed = Vec::new();
    for (i, a) in m.nics.iter().enumerate() {
        // efa and efa-direct list each device; the second listing has no bus attributes, and
        // is found through /sys/class/infiniband by name.
        let name = format!("rdmap{i}");
        listed.push(NicName {
            name: name.clone(),
            provider: "efa".into(),
            pci: Some(*a),
        });
        let p = s.pci_device(*a).unwrap().path;
        m.sys.class_link("infiniband", &name, &p);
        listed.push(NicName {
            name,
            provider: "efa-direct".into(),
            pci: None,
        });
    }
    listed.push(NicName {
        name: "lo".into(),
        provider: "tcp".into(),
        pci: None,
    });
    let r = report(&s, &listed, NicPolicy::default());
    assert_eq!(r.nics.len(), 32);
    assert!(
        r.nics.iter().all(|n| n.provider == "efa,efa-direct"),
        "{:?}",
        r.nics[0]
    );
    assert_eq!(r.gpus.len(), 8);
    for (g, line) in r.gpus.iter().enumerate() {
        assert_eq!(line.gpu.addr, m.gpus[g]);
        assert_eq!(line.nics.len(), 4);
        for (name, dev, l) in &line.nics {
            let i: usize = name.trim_start_matches("rdmap").parse().unwrap();
            assert_eq!(m.nic_home[i], g);
            assert_eq!(dev.addr, m.nics[i]);
            assert_eq!(l.distance, Distance::Pix);
        }
    }
    assert!(r.notes.is_empty(), "{:?}", r.notes);

    // The same machine seen through tcp only: no NIC, and the report says why.
    let r = report(&s, &listed[listed.len() - 1..], NicPolicy::default());
    assert!(r.nics.is_empty());
    assert!(r.gpus.iter().all(|l| l.nics.is_empty()));
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("no NIC with a PCI address")),
        "{:?}",
        r.notes
    );
    // And a machine without GPUs.
    let r = report(&Sysfs::at("/nonexistent-root"), &[], NicPolicy::default());
    assert!(r.gpus.is_empty());
    assert!(
        r.notes.iter().any(|n| n.contains("no NVIDIA GPU")),
        "{:?}",
        r.notes
    );
}

#[test]
fn nics_for_one_gpu_take_part_in_the_node_choice() {
    let m = p5_like(4, &[]);
    let s = m.sys.sysfs();
    let listed: Vec<NicName> = m
        .nics
        .iter()
        .enumerate()
        .map(|(i, a)| NicName {
            name: format!("rdmap{i}"),
            provider: "efa".into(),
            pci: Some(*a),
        })
        .collect();
    // CUDA spells the bus id with an 8-digit domain.
    let bus_id = format!("0000{}", m.gpus[6]);
    let line = nics_for_gpu(
        &s,
        PciAddr::parse(&bus_id).unwrap(),
        &listed,
        NicPolicy::default(),
    )
    .unwrap();
    assert_eq!(line.gpu.addr, m.gpus[6]);
    assert_eq!(line.nics.len(), 4);
    for (name, _, l) in &line.nics {
        let i: usize = name.trim_start_matches("rdmap").parse().unwrap();
        assert_eq!(m.nic_home[i], 6);
        assert_eq!(l.distance, Distance::Pix);
    }
    // A device that is no NVIDIA GPU (here a NIC) is chosen for alone: the four NICs of its own
    // switch (itself among them), the nearest of the 16 it may take, none from another switch.
    let alone = nics_for_gpu(&s, m.nics[0], &listed, NicPolicy::default()).unwrap();
    assert_eq!(alone.nics.len(), 4);
    for (name, _, l) in &alone.nics {
        let i: usize = name.trim_start_matches("rdmap").parse().unwrap();
        assert_eq!(m.nic_home[i], m.nic_home[0]);
        assert_eq!(l.distance, Distance::Pix);
    }
    assert!(
        alone
            .why
            .contains("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE=16 of the 32 offered"),
        "{}",
        alone.why
    );
    // An address sysfs does not know is an error that names it.
    let e = nics_for_gpu(&s, addr(0x0f), &listed, NicPolicy::default()).unwrap_err();
    assert!(e.0.contains("0000:0f:00.0"), "{e}");
}

#[test]
fn rail_order_gives_a_gpus_nearest_nics_as_indices() {
    let m = p5_like(4, &[]);
    let s = m.sys.sysfs();
    // The provider's list with a NIC-less domain in front (tcp's loopback would be one).
    let mut listed = vec![NicName {
        name: "lo".into(),
        provider: "tcp".into(),
        pci: None,
    }];
    listed.extend(m.nics.iter().enumerate().map(|(i, a)| NicName {
        name: format!("rdmap{i}"),
        provider: "efa".into(),
        pci: Some(*a),
    }));
    let order = rail_order(&s, m.gpus[2], &listed, NicPolicy::default()).unwrap();
    assert_eq!(order.len(), 4, "{order:?}");
    for &k in &order {
        assert!(k >= 1, "the NIC-less domain is never a rail");
        assert_eq!(m.nic_home[k - 1], 2, "rail {k} is not under GPU 2's switch");
    }
    let two = NicPolicy {
        max_nic_per_pe: 2,
        ..NicPolicy::default()
    };
    let order2 = rail_order(&s, m.gpus[2], &listed, two).unwrap();
    assert_eq!(order2, order[..2], "the limit keeps the nearest first");
}
