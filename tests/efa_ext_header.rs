//! The `repr(C)` mirrors of libfabric's EFA GDA extension (`src/fabric/efa_gda_abi.rs`) and the
//! device formats of `src/efa` checked against the real headers of several libfabric versions.
//!
//! Small C programs (`tests/efa_headers/mod.rs`) are compiled against a tree's `fi_ext_efa.h` and
//! `efa_io_defs.h` with the system C compiler (`CC`, else `cc`); they print sizes, offsets, bit
//! masks and constants, and assert each slot type of `struct fi_efa_ops_gda` against the Rust
//! aliases (`__builtin_types_compatible_p`). Every printed value must equal the mirrors.
//!
//! Two sources of those numbers:
//! - `tests/golden/libfabric_layouts.txt`: the output of the programs against each released or
//!   cited libfabric revision (name, commit, version in each block header), checked in. The test
//!   `golden_layouts_equal_the_mirrors` checks every block against the mirrors on every run (CI has
//!   no network and Debian's libfabric 2.1.0 has no GDA table).
//! - Trees present on this machine: every export of `tests/golden/libfabric_headers.sh` under
//!   `target/libfabric-headers/` (git-ignored), and the trees named in `NVSHMEM_EFA_LIBFABRIC_SRC`
//!   (colon-separated source checkouts or installation prefixes). `headers_equal_the_mirrors`
//!   compiles against each, compares with the mirrors, and for an export also with its golden
//!   block (so the golden numbers cannot drift from the headers). With no tree it says so and
//!   passes.
//!
//! ```sh
//! tests/golden/libfabric_headers.sh /path/to/libfabric v2.6.0 main
//! cargo test --test efa_ext_header -- --nocapture
//! ```
mod efa_headers;

use std::collections::BTreeMap;
use std::path::PathBuf;

use efa_headers::{compare, Tree, PROGRAMS};

const ENV: &str = "NVSHMEM_EFA_LIBFABRIC_SRC";
const GOLDEN: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/libfabric_layouts.txt"
));

/// The golden blocks: (`name commit version`, lines).
fn golden() -> Vec<(String, BTreeMap<String, String>)> {
    let mut out: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for (i, line) in GOLDEN.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.push((h.to_string(), BTreeMap::new()));
            continue;
        }
        let (k, v) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("golden line {}: not `key value`", i + 1));
        let block = out
            .last_mut()
            .unwrap_or_else(|| panic!("golden line {}: before any [block]", i + 1));
        assert!(
            block.1.insert(k.into(), v.into()).is_none(),
            "golden line {}: {k} twice",
            i + 1
        );
    }
    out
}

/// The golden blocks cover the releases the hardware mode is asserted against, and every block
/// equals the mirrors.
#[test]
fn golden_layouts_equal_the_mirrors() {
    let blocks = golden();
    let versions: Vec<&str> = blocks
        .iter()
        .map(|(h, _)| {
            h.split(' ')
                .nth(2)
                .expect("block header: name commit version")
        })
        .collect();
    for want in ["2.6.0", "2.7.0"] {
        assert!(
            versions.iter().any(|v| v.starts_with(want)),
            "no golden block for libfabric {want} (have {versions:?})"
        );
    }
    for (header, lines) in &blocks {
        assert!(
            lines.len() > 60,
            "[{header}]: only {} lines; every program against fi_ext_efa.h and efa_io_defs.h",
            lines.len()
        );
        let bad = compare(lines);
        assert!(
            bad.is_empty(),
            "the mirrors differ from libfabric [{header}]:\n  {}",
            bad.join("\n  ")
        );
        println!("[{header}]: {} values equal the mirrors", lines.len());
    }
    // The 2.7.0 block has what 2.6.0 lacks: caps, 64-bit request ids, wide entries.
    let (_, newest) = blocks
        .iter()
        .find(|(h, _)| h.split(' ').nth(2).is_some_and(|v| v.starts_with("2.7")))
        .expect("a 2.7 block");
    for k in [
        "offsetof.fi_efa_wq_attr.caps",
        "offsetof.efa_io_tx_meta_desc.req_id_ex",
        "offsetof.efa_io_tx_cdesc.req_id_ex",
        "sizeof.efa_io_tx_wqe_128",
        "offsetof.fi_efa_ops_gda.cntr_open_ext",
    ] {
        assert!(newest.contains_key(k), "the 2.7 block lacks {k}");
    }
}

/// Every tree on this machine: its headers against the mirrors, and an export's against its
/// golden block.
#[test]
fn headers_equal_the_mirrors() {
    let mut roots: Vec<PathBuf> = std::env::var_os(ENV)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    let exports = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/libfabric-headers");
    if let Ok(rd) = std::fs::read_dir(&exports) {
        let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        dirs.sort();
        roots.extend(dirs.into_iter().filter(|p| p.is_dir()));
    }
    if roots.is_empty() {
        println!(
            "skipped: no libfabric tree here (none under {} from tests/golden/libfabric_headers.sh, \
             {ENV} unset); golden_layouts_equal_the_mirrors still checks the numbers recorded from \
             the real headers",
            exports.display()
        );
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let blocks = golden();
    let mut missing = Vec::new();
    for (n, root) in roots.iter().enumerate() {
        let tree = Tree::locate(root).unwrap_or_else(|| {
            panic!(
                "{}: neither prov/efa/src/fi_ext_efa.h nor include/rdma/fi_ext_efa.h is there",
                root.display()
            )
        });
        let dir = std::env::temp_dir().join(format!("efa-ext-header-{}-{n}", std::process::id()));
        let (got, failed) = tree.measure(&cc, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            !failed.contains(&"ext_base".to_string()),
            "{}: the base program does not build (libfabric before 2.3.0 has no GDA table)",
            tree.ext.display()
        );
        let bad = compare(&got);
        assert!(
            bad.is_empty(),
            "the mirrors differ from {}:\n  {}",
            tree.root.display(),
            bad.join("\n  ")
        );
        let mut note = String::new();
        if let Some(src) = &tree.source {
            match blocks.iter().find(|(h, _)| h == src) {
                Some(block) => {
                    assert_eq!(
                        &block.1,
                        &got,
                        "golden block [{src}] differs from the headers of {}",
                        tree.root.display()
                    );
                    note = format!(", equal to golden block [{src}]");
                }
                None => {
                    let lines: Vec<String> = got.iter().map(|(k, v)| format!("{k} {v}")).collect();
                    missing.push(format!("[{src}]\n{}", lines.join("\n")));
                    note = ", NO golden block".into();
                }
            }
        }
        println!(
            "{}: {} values equal the mirrors{note}; programs not built (absent in this version): {:?} \
             of {}",
            tree.root.display(),
            got.len(),
            failed,
            PROGRAMS.len()
        );
    }
    assert!(
        missing.is_empty(),
        "exports without a block in tests/golden/libfabric_layouts.txt; add:\n{}",
        missing.join("\n")
    );
}

/// The comparison fails on a value that differs and on a printed key the mirrors do not hold.
#[test]
fn a_changed_value_or_an_unmirrored_key_is_reported() {
    let (_, mut block) = golden().pop().expect("a golden block");
    assert!(compare(&block).is_empty());
    block.insert("offsetof.efa_io_tx_meta_desc.req_id_ex".into(), "20".into());
    block.insert("sizeof.efa_io_something_new".into(), "8".into());
    block.remove("offsetof.fi_efa_wq_attr.caps");
    block.insert("sizeof.fi_efa_wq_attr".into(), "28".into());
    let bad = compare(&block);
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(bad
        .iter()
        .any(|b| b.contains("req_id_ex: header Ok(20), mirror 26")));
    assert!(bad.iter().any(|b| b.contains("not mirrored")));
    assert!(bad.iter().any(|b| b.contains("tail padding")));
}
