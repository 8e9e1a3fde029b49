//! `nvshmem-efa-gda info` on a fake sysfs tree (`--sysfs-root`): two GPUs on two sockets, and the
//! network interface that libfabric's tcp provider lists (`lo`, or `FI_TCP_IFACE`) made to look
//! like a PCI NIC under the first GPU's PCIe switch. The report must show both GPUs, that NIC for
//! the first at PIX distance with its NUMA node, a farther class for the second, and the reasons;
//! the JSON form must carry the same.
use std::path::{Path, PathBuf};
use std::process::Command;

fn mkdev(root: &Path, path: &[&str], vendor: &str, class: &str, numa: i32) {
    let dir = root.join("sys/devices").join(path.join("/"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), vendor).unwrap();
    std::fs::write(dir.join("class"), class).unwrap();
    std::fs::write(dir.join("numa_node"), numa.to_string()).unwrap();
    let link = root.join("sys/bus/pci/devices").join(path.last().unwrap());
    std::os::unix::fs::symlink(format!("../../../devices/{}", path.join("/")), link).unwrap();
}

struct Tree(PathBuf);
impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fake_tree(iface: &str) -> Tree {
    let root = std::env::temp_dir().join(format!("negda-info-nics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    let sw0 = ["pci0000:10", "0000:10:01.0", "0000:11:00.0"];
    let gpu0 = [&sw0[..], &["0000:12:00.0", "0000:13:00.0"]].concat();
    let nic0 = [&sw0[..], &["0000:12:01.0", "0000:14:00.0"]].concat();
    let gpu1 = [
        "pci0000:90",
        "0000:90:01.0",
        "0000:91:00.0",
        "0000:92:00.0",
        "0000:93:00.0",
    ];
    mkdev(&root, &gpu0, "0x10de", "0x030200", 0);
    mkdev(&root, &gpu1, "0x10de", "0x030200", 1);
    mkdev(&root, &nic0, "0x1d0f", "0x020000", 0);
    let net = root.join("sys/class/net").join(iface);
    std::fs::create_dir_all(&net).unwrap();
    std::os::unix::fs::symlink(
        format!("../../../devices/{}", nic0.join("/")),
        net.join("device"),
    )
    .unwrap();
    Tree(root)
}

fn info(root: &Path, json: bool) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvshmem-efa-gda"));
    c.arg("info").arg("--sysfs-root").arg(root);
    if json {
        c.arg("--json");
    }
    let out = c
        .env_remove("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE")
        .env_remove("NVSHMEM_ENABLE_NIC_PE_MAPPING")
        .env("FI_PROVIDER", "tcp")
        .output()
        .expect("run nvshmem-efa-gda info");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn info_shows_each_gpu_with_its_nearest_nic() {
    let iface = std::env::var("FI_TCP_IFACE").unwrap_or_else(|_| "lo".into());
    let tree = fake_tree(&iface);
    let text = info(&tree.0, false);
    let section = text
        .split("NICs by GPU")
        .nth(1)
        .unwrap_or_else(|| panic!("no NIC section in:\n{text}"));
    let section = section.split("\nCUDA").next().unwrap();
    assert!(
        section.contains("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE=16"),
        "{section}"
    );
    assert!(section.contains("GPU 0 0000:13:00.0 (NUMA 0)"), "{section}");
    assert!(section.contains("GPU 1 0000:93:00.0 (NUMA 1)"), "{section}");
    let line = format!("{iface:<16} 0000:14:00.0 NUMA 0  PIX  same PCIe switch");
    assert!(section.contains(&line), "missing {line:?} in:\n{section}");
    assert!(
        section.contains("SYS  other NUMA node (across the socket link)"),
        "{section}"
    );
    assert!(
        section.contains("why: 1 of 1 NICs at the nearest distance PIX"),
        "{section}"
    );
    assert!(
        section.contains("why: 1 of 1 NICs at the nearest distance SYS"),
        "{section}"
    );
    assert!(section.contains("1 shared with another GPU"), "{section}");

    let json = info(&tree.0, true);
    for want in [
        "\"nics\": {\"max_nic_per_pe\": 16, \"nic_pe_mapping\": false",
        "{\"pci\": \"0000:13:00.0\", \"numa\": 0, \"nics\": [{\"name\": ",
        "\"pci\": \"0000:14:00.0\", \"numa\": 0, \"distance\": \"PIX\"}]",
        "\"distance\": \"SYS\"",
    ] {
        assert!(json.contains(want), "missing {want:?} in:\n{json}");
    }
}

#[test]
fn info_without_nics_or_gpus_says_so() {
    let root = std::env::temp_dir().join(format!("negda-info-empty-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let tree = Tree(root);
    let text = info(&tree.0, false);
    assert!(
        text.contains("no NVIDIA GPU on the PCI bus (sysfs lists none)"),
        "{text}"
    );
    assert!(text.contains("no NIC with a PCI address"), "{text}");
}
