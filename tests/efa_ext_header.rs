//! The `repr(C)` mirrors of libfabric's EFA GDA extension checked against the real header.
//!
//! `src/fabric/efa_gda_abi.rs` mirrors `fi_ext_efa.h` from notes (sizes and offsets asserted at compile
//! time against those notes). This test checks the notes against a libfabric tree: with
//! `NVSHMEM_EFA_LIBFABRIC_SRC` naming a libfabric source tree (`prov/efa/src/fi_ext_efa.h`, e.g. a
//! checkout of tag v2.6.0) or an installation prefix (`include/rdma/fi_ext_efa.h`), it compiles a
//! small C program against that header with the system C compiler (`CC`, else `cc`), runs it, and
//! compares every size, offset and constant it prints with the mirrors. The same C file also checks
//! that each slot of `struct fi_efa_ops_gda` has exactly the function type our Rust alias spells
//! (`__builtin_types_compatible_p`), so a changed parameter list fails to compile.
//!
//! Without the variable the test prints why it checks nothing and passes (CI has no network to
//! fetch libfabric; the Debian package and the 2.1.0 build in `.deps/` predate the GDA table).
//!
//! ```sh
//! git -C /path/to/libfabric checkout v2.6.0
//! NVSHMEM_EFA_LIBFABRIC_SRC=/path/to/libfabric cargo test --test efa_ext_header -- --nocapture
//! ```
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshmem_efa_gda::fabric::efa_gda_abi::{
    FiEfaCompCntrInitAttr, FiEfaCqAttr, FiEfaCqExtMemDmabuf, FiEfaCqInitAttr, FiEfaMemoryLocation,
    FiEfaMemoryLocationDmabuf, FiEfaOpsGda, FiEfaWqAttr,
    FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM, FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM,
    FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF, FI_EFA_GDA_OPS, FI_EFA_MEMORY_LOCATION_DMABUF,
    FI_EFA_MEMORY_LOCATION_VA, FI_EFA_OPS_GDA_SIZE_V2_3,
};

const ENV: &str = "NVSHMEM_EFA_LIBFABRIC_SRC";

/// Where the header lives in `root` and the include directories it needs.
fn locate(root: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let src = root.join("prov/efa/src/fi_ext_efa.h");
    if src.is_file() {
        return Some((src, vec![root.join("include"), root.join("prov/efa/src")]));
    }
    let installed = root.join("include/rdma/fi_ext_efa.h");
    if installed.is_file() {
        return Some((installed, vec![root.join("include")]));
    }
    None
}

/// One line per printed item: `name value`.
const PROGRAM_HEAD: &str = r#"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include "fi_ext_efa.h"

#define SZ(T) printf("sizeof." #T " %zu\n", sizeof(struct T))
#define OFF(T, F) printf("offsetof." #T "." #F " %zu\n", offsetof(struct T, F))
#define VAL(N) printf("value." #N " %llu\n", (unsigned long long)(N))
/* The function types of src/fabric/efa_gda_abi.rs, spelled in C (QueryAddrFn, QueryQpWqsFn, ...). */
#define SLOT_TYPE(F, ...) _Static_assert(__builtin_types_compatible_p( \
    __typeof__(((struct fi_efa_ops_gda *)0)->F), __VA_ARGS__), "slot " #F " has another type")

SLOT_TYPE(query_addr, int (*)(struct fid_ep *, fi_addr_t, uint16_t *, uint16_t *, uint32_t *));
SLOT_TYPE(query_qp_wqs, int (*)(struct fid_ep *, struct fi_efa_wq_attr *, struct fi_efa_wq_attr *));
SLOT_TYPE(query_cq, int (*)(struct fid_cq *, struct fi_efa_cq_attr *));
SLOT_TYPE(cq_open_ext, int (*)(struct fid_domain *, struct fi_cq_attr *,
                               struct fi_efa_cq_init_attr *, struct fid_cq **, void *));
SLOT_TYPE(get_mr_lkey, uint64_t (*)(struct fid_mr *));
"#;

const PROGRAM_CNTR: &str = r#"
SLOT_TYPE(cntr_open_ext, int (*)(struct fid_domain *, struct fi_cntr_attr *, struct fid_cntr **,
                                 void *, struct fi_efa_comp_cntr_init_attr *));
"#;

const PROGRAM_MAIN: &str = r#"
int main(void)
{
    printf("value.name %s\n", FI_EFA_GDA_OPS);
    SZ(fi_efa_wq_attr);
    OFF(fi_efa_wq_attr, buffer);
    OFF(fi_efa_wq_attr, entry_size);
    OFF(fi_efa_wq_attr, num_entries);
    OFF(fi_efa_wq_attr, doorbell);
    OFF(fi_efa_wq_attr, max_batch);
    SZ(fi_efa_cq_attr);
    OFF(fi_efa_cq_attr, buffer);
    OFF(fi_efa_cq_attr, entry_size);
    OFF(fi_efa_cq_attr, num_entries);
    SZ(fi_efa_cq_init_attr);
    OFF(fi_efa_cq_init_attr, flags);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf);
    printf("sizeof.ext_mem_dmabuf %zu\n", sizeof(((struct fi_efa_cq_init_attr *)0)->ext_mem_dmabuf));
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.buffer);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.length);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.offset);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.fd);
    printf("sizeof.ext_mem_dmabuf.fd %zu\n", sizeof(((struct fi_efa_cq_init_attr *)0)->ext_mem_dmabuf.fd));
    VAL(FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF);
    SZ(fi_efa_ops_gda);
    OFF(fi_efa_ops_gda, query_addr);
    OFF(fi_efa_ops_gda, query_qp_wqs);
    OFF(fi_efa_ops_gda, query_cq);
    OFF(fi_efa_ops_gda, cq_open_ext);
    OFF(fi_efa_ops_gda, get_mr_lkey);
"#;

const PROGRAM_MAIN_CNTR: &str = r#"
    OFF(fi_efa_ops_gda, cntr_open_ext);
    SZ(fi_efa_memory_location);
    OFF(fi_efa_memory_location, ptr);
    OFF(fi_efa_memory_location, dmabuf);
    OFF(fi_efa_memory_location, dmabuf.offset);
    OFF(fi_efa_memory_location, dmabuf.fd);
    OFF(fi_efa_memory_location, dmabuf.reserved);
    OFF(fi_efa_memory_location, type);
    OFF(fi_efa_memory_location, reserved);
    printf("sizeof.fi_efa_memory_location.dmabuf %zu\n", sizeof(((struct fi_efa_memory_location *)0)->dmabuf));
    SZ(fi_efa_comp_cntr_init_attr);
    OFF(fi_efa_comp_cntr_init_attr, comp_mask);
    OFF(fi_efa_comp_cntr_init_attr, flags);
    OFF(fi_efa_comp_cntr_init_attr, reserved);
    OFF(fi_efa_comp_cntr_init_attr, comp_cntr_ext_mem);
    OFF(fi_efa_comp_cntr_init_attr, err_cntr_ext_mem);
    VAL(FI_EFA_MEMORY_LOCATION_VA);
    VAL(FI_EFA_MEMORY_LOCATION_DMABUF);
    VAL(FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM);
    VAL(FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM);
"#;

/// A separate program: compiles only where the header has `fi_efa_wq_attr.caps` (after 2.6.0).
const PROGRAM_CAPS: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include <rdma/fabric.h>
#include "fi_ext_efa.h"
int main(void)
{
    printf("offsetof.fi_efa_wq_attr.caps %zu\n", offsetof(struct fi_efa_wq_attr, caps));
    printf("sizeof.fi_efa_wq_attr.caps %zu\n", sizeof(((struct fi_efa_wq_attr *)0)->caps));
    return 0;
}
"#;

struct Build {
    dir: PathBuf,
    cc: String,
    includes: Vec<PathBuf>,
    header: PathBuf,
}

impl Build {
    /// Compiles `source` and runs it; `Err` carries the compiler's or the program's output.
    fn run(&self, name: &str, source: &str) -> Result<String, String> {
        let c = self.dir.join(format!("{name}.c"));
        let exe = self.dir.join(name);
        // The header's own directory first, so `#include "fi_ext_efa.h"` finds that file.
        let header_dir = self.header.parent().expect("header has a directory");
        std::fs::write(&c, source).expect("write the C file");
        let mut cmd = Command::new(&self.cc);
        cmd.args(["-std=gnu11", "-Wall", "-Werror"])
            .arg("-I")
            .arg(header_dir);
        for i in &self.includes {
            cmd.arg("-I").arg(i);
        }
        let out = cmd
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {}: {e}", self.cc));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let out = Command::new(&exe).output().expect("run the C program");
        if !out.status.success() {
            return Err(format!("{name} exited with {}", out.status));
        }
        Ok(String::from_utf8(out.stdout).expect("ASCII output"))
    }
}

fn parse(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What the mirrors say, in the C program's names.
fn mirror(with_cntr: bool) -> Vec<(&'static str, u64)> {
    let mut m: Vec<(&'static str, u64)> = vec![
        ("sizeof.fi_efa_wq_attr", size_of::<FiEfaWqAttr>() as u64),
        (
            "offsetof.fi_efa_wq_attr.buffer",
            offset_of!(FiEfaWqAttr, buffer) as u64,
        ),
        (
            "offsetof.fi_efa_wq_attr.entry_size",
            offset_of!(FiEfaWqAttr, entry_size) as u64,
        ),
        (
            "offsetof.fi_efa_wq_attr.num_entries",
            offset_of!(FiEfaWqAttr, num_entries) as u64,
        ),
        (
            "offsetof.fi_efa_wq_attr.doorbell",
            offset_of!(FiEfaWqAttr, doorbell) as u64,
        ),
        (
            "offsetof.fi_efa_wq_attr.max_batch",
            offset_of!(FiEfaWqAttr, max_batch) as u64,
        ),
        ("sizeof.fi_efa_cq_attr", size_of::<FiEfaCqAttr>() as u64),
        (
            "offsetof.fi_efa_cq_attr.buffer",
            offset_of!(FiEfaCqAttr, buffer) as u64,
        ),
        (
            "offsetof.fi_efa_cq_attr.entry_size",
            offset_of!(FiEfaCqAttr, entry_size) as u64,
        ),
        (
            "offsetof.fi_efa_cq_attr.num_entries",
            offset_of!(FiEfaCqAttr, num_entries) as u64,
        ),
        (
            "sizeof.fi_efa_cq_init_attr",
            size_of::<FiEfaCqInitAttr>() as u64,
        ),
        (
            "offsetof.fi_efa_cq_init_attr.flags",
            offset_of!(FiEfaCqInitAttr, flags) as u64,
        ),
        (
            "offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf",
            offset_of!(FiEfaCqInitAttr, ext_mem_dmabuf) as u64,
        ),
        (
            "sizeof.ext_mem_dmabuf",
            size_of::<FiEfaCqExtMemDmabuf>() as u64,
        ),
    ];
    let dmabuf = offset_of!(FiEfaCqInitAttr, ext_mem_dmabuf) as u64;
    for (name, off) in [
        (
            "offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf.buffer",
            offset_of!(FiEfaCqExtMemDmabuf, buffer),
        ),
        (
            "offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf.length",
            offset_of!(FiEfaCqExtMemDmabuf, length),
        ),
        (
            "offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf.offset",
            offset_of!(FiEfaCqExtMemDmabuf, offset),
        ),
        (
            "offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf.fd",
            offset_of!(FiEfaCqExtMemDmabuf, fd),
        ),
    ] {
        m.push((name, dmabuf + off as u64));
    }
    m.extend([
        ("sizeof.ext_mem_dmabuf.fd", size_of::<u32>() as u64),
        (
            "value.FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF",
            FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF,
        ),
        (
            "sizeof.fi_efa_ops_gda",
            if with_cntr {
                size_of::<FiEfaOpsGda>() as u64
            } else {
                FI_EFA_OPS_GDA_SIZE_V2_3 as u64
            },
        ),
        (
            "offsetof.fi_efa_ops_gda.query_addr",
            offset_of!(FiEfaOpsGda, query_addr) as u64,
        ),
        (
            "offsetof.fi_efa_ops_gda.query_qp_wqs",
            offset_of!(FiEfaOpsGda, query_qp_wqs) as u64,
        ),
        (
            "offsetof.fi_efa_ops_gda.query_cq",
            offset_of!(FiEfaOpsGda, query_cq) as u64,
        ),
        (
            "offsetof.fi_efa_ops_gda.cq_open_ext",
            offset_of!(FiEfaOpsGda, cq_open_ext) as u64,
        ),
        (
            "offsetof.fi_efa_ops_gda.get_mr_lkey",
            offset_of!(FiEfaOpsGda, get_mr_lkey) as u64,
        ),
    ]);
    if with_cntr {
        let loc_dmabuf = offset_of!(FiEfaMemoryLocation, dmabuf) as u64;
        m.extend([
            (
                "offsetof.fi_efa_ops_gda.cntr_open_ext",
                offset_of!(FiEfaOpsGda, cntr_open_ext) as u64,
            ),
            (
                "sizeof.fi_efa_memory_location",
                size_of::<FiEfaMemoryLocation>() as u64,
            ),
            (
                "offsetof.fi_efa_memory_location.ptr",
                offset_of!(FiEfaMemoryLocation, ptr) as u64,
            ),
            ("offsetof.fi_efa_memory_location.dmabuf", loc_dmabuf),
            (
                "offsetof.fi_efa_memory_location.dmabuf.offset",
                loc_dmabuf + offset_of!(FiEfaMemoryLocationDmabuf, offset) as u64,
            ),
            (
                "offsetof.fi_efa_memory_location.dmabuf.fd",
                loc_dmabuf + offset_of!(FiEfaMemoryLocationDmabuf, fd) as u64,
            ),
            (
                "offsetof.fi_efa_memory_location.dmabuf.reserved",
                loc_dmabuf + offset_of!(FiEfaMemoryLocationDmabuf, reserved) as u64,
            ),
            (
                "offsetof.fi_efa_memory_location.type",
                offset_of!(FiEfaMemoryLocation, type_) as u64,
            ),
            (
                "offsetof.fi_efa_memory_location.reserved",
                offset_of!(FiEfaMemoryLocation, reserved) as u64,
            ),
            (
                "sizeof.fi_efa_memory_location.dmabuf",
                size_of::<FiEfaMemoryLocationDmabuf>() as u64,
            ),
            (
                "sizeof.fi_efa_comp_cntr_init_attr",
                size_of::<FiEfaCompCntrInitAttr>() as u64,
            ),
            (
                "offsetof.fi_efa_comp_cntr_init_attr.comp_mask",
                offset_of!(FiEfaCompCntrInitAttr, comp_mask) as u64,
            ),
            (
                "offsetof.fi_efa_comp_cntr_init_attr.flags",
                offset_of!(FiEfaCompCntrInitAttr, flags) as u64,
            ),
            (
                "offsetof.fi_efa_comp_cntr_init_attr.reserved",
                offset_of!(FiEfaCompCntrInitAttr, reserved) as u64,
            ),
            (
                "offsetof.fi_efa_comp_cntr_init_attr.comp_cntr_ext_mem",
                offset_of!(FiEfaCompCntrInitAttr, comp_cntr_ext_mem) as u64,
            ),
            (
                "offsetof.fi_efa_comp_cntr_init_attr.err_cntr_ext_mem",
                offset_of!(FiEfaCompCntrInitAttr, err_cntr_ext_mem) as u64,
            ),
            (
                "value.FI_EFA_MEMORY_LOCATION_VA",
                u64::from(FI_EFA_MEMORY_LOCATION_VA),
            ),
            (
                "value.FI_EFA_MEMORY_LOCATION_DMABUF",
                u64::from(FI_EFA_MEMORY_LOCATION_DMABUF),
            ),
            (
                "value.FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM",
                u64::from(FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM),
            ),
            (
                "value.FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM",
                u64::from(FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM),
            ),
        ]);
    }
    m
}

#[test]
fn mirrors_match_the_libfabric_header() {
    let Some(root) = std::env::var_os(ENV).filter(|v| !v.is_empty()) else {
        println!(
            "skipped: {ENV} is not set. Set it to a libfabric source tree (tag v2.6.0 or later) or \
             installation prefix to check src/fabric/efa_gda_abi.rs against its fi_ext_efa.h"
        );
        return;
    };
    let root = PathBuf::from(root);
    let (header, includes) = locate(&root).unwrap_or_else(|| {
        panic!(
            "{ENV}={}: neither prov/efa/src/fi_ext_efa.h nor include/rdma/fi_ext_efa.h is there",
            root.display()
        )
    });
    let text = std::fs::read_to_string(&header).expect("read the header");
    assert!(
        text.contains("struct fi_efa_ops_gda"),
        "{}: no struct fi_efa_ops_gda (libfabric before 2.3.0 has no GDA table)",
        header.display()
    );
    let with_cntr = text.contains("cntr_open_ext");
    let dir = std::env::temp_dir().join(format!("efa-ext-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let build = Build {
        dir: dir.clone(),
        cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
        includes,
        header: header.clone(),
    };
    let mut source = String::from(PROGRAM_HEAD);
    if with_cntr {
        source.push_str(PROGRAM_CNTR);
    }
    source.push_str(PROGRAM_MAIN);
    if with_cntr {
        source.push_str(PROGRAM_MAIN_CNTR);
    }
    source.push_str("    return 0;\n}\n");
    let got = match build.run("layout", &source) {
        Ok(out) => parse(&out),
        Err(e) => panic!(
            "the layout program does not build against {}:\n{e}",
            header.display()
        ),
    };
    assert_eq!(
        got.get("value.name").map(String::as_str),
        Some(FI_EFA_GDA_OPS),
        "FI_EFA_GDA_OPS"
    );
    let mut bad = Vec::new();
    let expected = mirror(with_cntr);
    for (name, want) in &expected {
        match got.get(*name).map(|v| v.parse::<u64>()) {
            Some(Ok(v)) if v == *want => {}
            other => bad.push(format!("{name}: header {other:?}, mirror {want}")),
        }
    }
    // fi_efa_wq_attr.caps: after 2.6.0 only. Where the header has it, it must sit where the mirror
    // puts it; where it does not, the mirror's field must lie in the struct's tail padding (the
    // provider clears the whole struct, so it reads as zero).
    let caps_off = offset_of!(FiEfaWqAttr, caps) as u64;
    let caps_note = match build.run("caps", PROGRAM_CAPS) {
        Ok(out) => {
            let c = parse(&out);
            for (k, want) in [
                ("offsetof.fi_efa_wq_attr.caps", caps_off),
                ("sizeof.fi_efa_wq_attr.caps", 2),
            ] {
                if c.get(k).and_then(|v| v.parse::<u64>().ok()) != Some(want) {
                    bad.push(format!("{k}: header {:?}, mirror {want}", c.get(k)));
                }
            }
            "fi_efa_wq_attr.caps present and at the mirror's offset".to_string()
        }
        Err(_) => {
            let size: u64 = got["sizeof.fi_efa_wq_attr"].parse().unwrap_or(0);
            let max_batch_end: u64 = got["offsetof.fi_efa_wq_attr.max_batch"]
                .parse::<u64>()
                .unwrap_or(u64::MAX)
                .saturating_add(4);
            if !(caps_off >= max_batch_end && caps_off + 2 <= size) {
                bad.push(format!(
                    "fi_efa_wq_attr has no caps and the mirror's caps ({caps_off}..{}) is not in its \
                     tail padding ({max_batch_end}..{size})",
                    caps_off + 2
                ));
            }
            format!(
                "fi_efa_wq_attr.caps absent (libfabric up to 2.6.0); the mirror's caps lies in its tail \
                 padding ({max_batch_end}..{size})"
            )
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        bad.is_empty(),
        "src/fabric/efa_gda_abi.rs differs from {}:\n  {}",
        header.display(),
        bad.join("\n  ")
    );
    println!(
        "{}: {} sizes, offsets and constants equal the mirrors, slot types checked by the compiler \
         ({} table); {caps_note}",
        header.display(),
        expected.len() + 1,
        if with_cntr {
            "2.6.0 or later, with cntr_open_ext"
        } else {
            "2.3 to 2.5, without cntr_open_ext"
        }
    );
}
