//! What `tests/efa_ext_header.rs` compares: the C programs compiled against a libfabric tree and
//! the numbers the library's mirrors say they print.
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshmem_efa_gda::efa::cqe::{self, CdescCommon, RxCdesc, TxCdesc};
use nvshmem_efa_gda::efa::wqe::{
    self, BufDesc, RdmaReq, RemoteMemDesc, TxMetaDesc, TxWqe, DATA_OFFSET, RDMA_LOCAL_OFFSET,
};
use nvshmem_efa_gda::fabric::efa_gda_abi::{
    FiEfaCompCntrInitAttr, FiEfaCqAttr, FiEfaCqExtMemDmabuf, FiEfaCqInitAttr, FiEfaMemoryLocation,
    FiEfaMemoryLocationDmabuf, FiEfaOpsGda, FiEfaWqAttr,
    FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM, FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM,
    FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF, FI_EFA_MEMORY_LOCATION_DMABUF, FI_EFA_MEMORY_LOCATION_VA,
    FI_EFA_OPS_GDA_SIZE_V2_3, FI_EFA_WQ_CAPS_64_BIT_REQ_ID,
};

/// The programs. Each prints `key value` lines; a program that does not compile against a tree
/// (a struct or field that version lacks) prints nothing, and its keys are then absent.
const HEAD: &str = r#"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#define SZ(T) printf("sizeof." #T " %zu\n", sizeof(struct T))
#define OFF(T, F) printf("offsetof." #T "." #F " %zu\n", offsetof(struct T, F))
#define VAL(N) printf("value." #N " %llu\n", (unsigned long long)(N))
"#;

/// `fi_ext_efa.h` of 2.3 and later, with the slot types of src/fabric/efa_gda_abi.rs spelled in C.
const EXT_BASE: &str = r#"
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include "fi_ext_efa.h"
#define SLOT_TYPE(F, ...) _Static_assert(__builtin_types_compatible_p( \
    __typeof__(((struct fi_efa_ops_gda *)0)->F), __VA_ARGS__), "slot " #F " has another type")
SLOT_TYPE(query_addr, int (*)(struct fid_ep *, fi_addr_t, uint16_t *, uint16_t *, uint32_t *));
SLOT_TYPE(query_qp_wqs, int (*)(struct fid_ep *, struct fi_efa_wq_attr *, struct fi_efa_wq_attr *));
SLOT_TYPE(query_cq, int (*)(struct fid_cq *, struct fi_efa_cq_attr *));
SLOT_TYPE(cq_open_ext, int (*)(struct fid_domain *, struct fi_cq_attr *,
                               struct fi_efa_cq_init_attr *, struct fid_cq **, void *));
SLOT_TYPE(get_mr_lkey, uint64_t (*)(struct fid_mr *));
int main(void)
{
    printf("name.FI_EFA_GDA_OPS %s\n", FI_EFA_GDA_OPS);
    SZ(fi_efa_wq_attr); OFF(fi_efa_wq_attr, buffer); OFF(fi_efa_wq_attr, entry_size);
    OFF(fi_efa_wq_attr, num_entries); OFF(fi_efa_wq_attr, doorbell); OFF(fi_efa_wq_attr, max_batch);
    SZ(fi_efa_cq_attr); OFF(fi_efa_cq_attr, buffer); OFF(fi_efa_cq_attr, entry_size);
    OFF(fi_efa_cq_attr, num_entries);
    SZ(fi_efa_cq_init_attr); OFF(fi_efa_cq_init_attr, flags); OFF(fi_efa_cq_init_attr, ext_mem_dmabuf);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.buffer); OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.length);
    OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.offset); OFF(fi_efa_cq_init_attr, ext_mem_dmabuf.fd);
    VAL(FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF);
    SZ(fi_efa_ops_gda); OFF(fi_efa_ops_gda, query_addr); OFF(fi_efa_ops_gda, query_qp_wqs);
    OFF(fi_efa_ops_gda, query_cq); OFF(fi_efa_ops_gda, cq_open_ext); OFF(fi_efa_ops_gda, get_mr_lkey);
    return 0;
}
"#;

/// 2.6.0 and later: `cntr_open_ext` and its attributes.
const EXT_CNTR: &str = r#"
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include "fi_ext_efa.h"
_Static_assert(__builtin_types_compatible_p(__typeof__(((struct fi_efa_ops_gda *)0)->cntr_open_ext),
    int (*)(struct fid_domain *, struct fi_cntr_attr *, struct fid_cntr **, void *,
            struct fi_efa_comp_cntr_init_attr *)), "slot cntr_open_ext has another type");
int main(void)
{
    OFF(fi_efa_ops_gda, cntr_open_ext);
    SZ(fi_efa_memory_location); OFF(fi_efa_memory_location, ptr); OFF(fi_efa_memory_location, dmabuf);
    OFF(fi_efa_memory_location, dmabuf.offset); OFF(fi_efa_memory_location, dmabuf.fd);
    OFF(fi_efa_memory_location, dmabuf.reserved); OFF(fi_efa_memory_location, type);
    OFF(fi_efa_memory_location, reserved);
    SZ(fi_efa_comp_cntr_init_attr); OFF(fi_efa_comp_cntr_init_attr, comp_mask);
    OFF(fi_efa_comp_cntr_init_attr, flags); OFF(fi_efa_comp_cntr_init_attr, reserved);
    OFF(fi_efa_comp_cntr_init_attr, comp_cntr_ext_mem); OFF(fi_efa_comp_cntr_init_attr, err_cntr_ext_mem);
    VAL(FI_EFA_MEMORY_LOCATION_VA); VAL(FI_EFA_MEMORY_LOCATION_DMABUF);
    VAL(FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM); VAL(FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM);
    return 0;
}
"#;

/// After 2.6.0: `fi_efa_wq_attr.caps`.
const EXT_CAPS: &str = r#"
#include <rdma/fabric.h>
#include "fi_ext_efa.h"
int main(void)
{
    OFF(fi_efa_wq_attr, caps);
    printf("sizeof.fi_efa_wq_attr.caps %zu\n", sizeof(((struct fi_efa_wq_attr *)0)->caps));
    VAL(FI_EFA_WQ_CAPS_64_BIT_REQ_ID);
    return 0;
}
"#;

/// The provider's copy of the device formats (`prov/efa/src/efa_io_defs.h`, rdma-core's
/// `providers/efa/efa_io_defs.h`): every field and bit mask the codecs of src/efa use.
const IO_BASE: &str = r#"
#define BIT(n) (1ULL << (n))
#define GENMASK(h, l) (((~0ULL) << (l)) & (~0ULL >> (63 - (h))))
#include "efa_io_defs.h"
int main(void)
{
    SZ(efa_io_tx_meta_desc); OFF(efa_io_tx_meta_desc, req_id); OFF(efa_io_tx_meta_desc, ctrl1);
    OFF(efa_io_tx_meta_desc, ctrl2); OFF(efa_io_tx_meta_desc, dest_qp_num);
    OFF(efa_io_tx_meta_desc, length); OFF(efa_io_tx_meta_desc, immediate_data);
    OFF(efa_io_tx_meta_desc, ah); OFF(efa_io_tx_meta_desc, qkey);
    SZ(efa_io_tx_buf_desc); OFF(efa_io_tx_buf_desc, length); OFF(efa_io_tx_buf_desc, lkey);
    OFF(efa_io_tx_buf_desc, buf_addr_lo); OFF(efa_io_tx_buf_desc, buf_addr_hi);
    SZ(efa_io_remote_mem_addr); OFF(efa_io_remote_mem_addr, length); OFF(efa_io_remote_mem_addr, rkey);
    OFF(efa_io_remote_mem_addr, buf_addr_lo); OFF(efa_io_remote_mem_addr, buf_addr_hi);
    SZ(efa_io_rdma_req); OFF(efa_io_rdma_req, remote_mem); OFF(efa_io_rdma_req, local_mem);
    SZ(efa_io_tx_wqe); OFF(efa_io_tx_wqe, meta); OFF(efa_io_tx_wqe, data);
    SZ(efa_io_cdesc_common); OFF(efa_io_cdesc_common, req_id); OFF(efa_io_cdesc_common, status);
    OFF(efa_io_cdesc_common, flags); OFF(efa_io_cdesc_common, qp_num);
    SZ(efa_io_rx_cdesc); OFF(efa_io_rx_cdesc, length); OFF(efa_io_rx_cdesc, ah);
    OFF(efa_io_rx_cdesc, src_qp_num); OFF(efa_io_rx_cdesc, imm);
    SZ(efa_io_rx_cdesc_ex); OFF(efa_io_rx_cdesc_ex, u);
    VAL(EFA_IO_TX_DESC_NUM_BUFS); VAL(EFA_IO_TX_DESC_NUM_RDMA_BUFS);
    VAL(EFA_IO_SEND); VAL(EFA_IO_RDMA_READ); VAL(EFA_IO_RDMA_WRITE);
    VAL(EFA_IO_SEND_QUEUE); VAL(EFA_IO_RECV_QUEUE);
    VAL(EFA_IO_TX_META_DESC_OP_TYPE_MASK); VAL(EFA_IO_TX_META_DESC_HAS_IMM_MASK);
    VAL(EFA_IO_TX_META_DESC_INLINE_MSG_MASK); VAL(EFA_IO_TX_META_DESC_META_EXTENSION_MASK);
    VAL(EFA_IO_TX_META_DESC_META_DESC_MASK); VAL(EFA_IO_TX_META_DESC_PHASE_MASK);
    VAL(EFA_IO_TX_META_DESC_FIRST_MASK); VAL(EFA_IO_TX_META_DESC_LAST_MASK);
    VAL(EFA_IO_TX_META_DESC_COMP_REQ_MASK); VAL(EFA_IO_TX_BUF_DESC_LKEY_MASK);
    VAL(EFA_IO_CDESC_COMMON_PHASE_MASK); VAL(EFA_IO_CDESC_COMMON_Q_TYPE_MASK);
    VAL(EFA_IO_CDESC_COMMON_HAS_IMM_MASK); VAL(EFA_IO_CDESC_COMMON_OP_TYPE_MASK);
    VAL(EFA_IO_CDESC_COMMON_UNSOLICITED_MASK);
    return 0;
}
"#;

/// The processing-hint byte `ctrl3` (2.6.0 on; before, bytes 14-15 were one reserved word).
const IO_HINTS: &str = r#"
#define BIT(n) (1ULL << (n))
#define GENMASK(h, l) (((~0ULL) << (l)) & (~0ULL >> (63 - (h))))
#include "efa_io_defs.h"
int main(void)
{
    OFF(efa_io_tx_meta_desc, ctrl3);
    VAL(EFA_IO_TX_META_DESC_PROCESSING_HINTS_MASK); VAL(EFA_IO_PROCESSING_HINT_BURST_PPS_SENSITIVE);
    return 0;
}
"#;

/// 64-bit request ids (rdma-core f655e05dea2d and 668d06863f43, libfabric a4a6fda17 and 06e6af82f).
const IO_REQID: &str = r#"
#define BIT(n) (1ULL << (n))
#define GENMASK(h, l) (((~0ULL) << (l)) & (~0ULL >> (63 - (h))))
#include "efa_io_defs.h"
int main(void)
{
    OFF(efa_io_tx_meta_desc, reserved2); OFF(efa_io_tx_meta_desc, req_id_ex);
    SZ(efa_io_req_id_ex); SZ(efa_io_tx_cdesc); OFF(efa_io_tx_cdesc, req_id_ex);
    OFF(efa_io_tx_cdesc, reserved);
    return 0;
}
"#;

/// Wide entries (rdma-core 2166b90e284d, libfabric fd5b9ef5fbd9).
const IO_WIDE: &str = r#"
#define BIT(n) (1ULL << (n))
#define GENMASK(h, l) (((~0ULL) << (l)) & (~0ULL >> (63 - (h))))
#include "efa_io_defs.h"
int main(void)
{
    SZ(efa_io_tx_wqe_128); OFF(efa_io_tx_wqe_128, meta); OFF(efa_io_tx_wqe_128, data);
    OFF(efa_io_tx_wqe_128, data.inline_data); OFF(efa_io_tx_wqe_128, data.rdma_req.inline_data);
    OFF(efa_io_tx_wqe_128, data.rdma_req.local_mem);
    VAL(EFA_IO_TX_DESC_INLINE_MAX_SIZE_128);
    printf("sizeof.efa_io_tx_wqe_128.data.inline_data %zu\n",
           sizeof(((struct efa_io_tx_wqe_128 *)0)->data.inline_data));
    printf("sizeof.efa_io_tx_wqe_128.data.rdma_req.inline_data %zu\n",
           sizeof(((struct efa_io_tx_wqe_128 *)0)->data.rdma_req.inline_data));
    return 0;
}
"#;

/// `include/rdma/fi_domain.h`: `struct fi_mr_dmabuf` and the `struct fi_mr_attr` fields a
/// registration sets (src/fabric/mr.rs builds them through the bindings of the libfabric it is
/// compiled against; the structs are libfabric's ABI, the same in every release it runs with).
const MR_ATTR: &str = r#"
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
int main(void)
{
    SZ(fi_mr_dmabuf); OFF(fi_mr_dmabuf, fd); OFF(fi_mr_dmabuf, offset); OFF(fi_mr_dmabuf, len);
    OFF(fi_mr_dmabuf, base_addr);
    OFF(fi_mr_attr, mr_iov); OFF(fi_mr_attr, dmabuf); OFF(fi_mr_attr, iov_count);
    OFF(fi_mr_attr, access); OFF(fi_mr_attr, requested_key); OFF(fi_mr_attr, iface);
    OFF(fi_mr_attr, device);
    VAL(FI_MR_DMABUF); VAL(FI_HMEM_DEVICE_ONLY); VAL(FI_HMEM_CUDA);
    return 0;
}
"#;

/// The programs by name, and whether the header they need is `fi_ext_efa.h` (else `efa_io_defs.h`).
pub const PROGRAMS: [(&str, &str, bool); 8] = [
    ("ext_base", EXT_BASE, true),
    ("ext_cntr", EXT_CNTR, true),
    ("ext_caps", EXT_CAPS, true),
    ("io_base", IO_BASE, false),
    ("io_hints", IO_HINTS, false),
    ("io_reqid", IO_REQID, false),
    ("io_wide", IO_WIDE, false),
    ("mr_attr", MR_ATTR, true),
];

/// A libfabric tree (source checkout, installation prefix, or an export of
/// `tests/golden/libfabric_headers.sh`): where its headers are.
pub struct Tree {
    pub root: PathBuf,
    pub ext: PathBuf,
    pub io_defs: Option<PathBuf>,
    pub includes: Vec<PathBuf>,
    /// `<name> <commit> <version>` from the export's `SOURCE` file.
    pub source: Option<String>,
}

impl Tree {
    pub fn locate(root: &Path) -> Option<Tree> {
        let source = std::fs::read_to_string(root.join("SOURCE"))
            .ok()
            .map(|s| s.trim().to_string());
        let src = root.join("prov/efa/src");
        if src.join("fi_ext_efa.h").is_file() {
            let io = src.join("efa_io_defs.h");
            return Some(Tree {
                root: root.into(),
                ext: src.join("fi_ext_efa.h"),
                io_defs: io.is_file().then_some(io),
                includes: vec![root.join("include"), src],
                source,
            });
        }
        let installed = root.join("include/rdma/fi_ext_efa.h");
        installed.is_file().then(|| Tree {
            root: root.into(),
            ext: installed,
            io_defs: None,
            includes: vec![root.join("include")],
            source,
        })
    }

    /// Compiles and runs every program; returns their lines, and the programs that did not build.
    pub fn measure(&self, cc: &str, dir: &Path) -> (BTreeMap<String, String>, Vec<String>) {
        std::fs::create_dir_all(dir).expect("temp dir");
        // efa_io_defs.h includes "config.h" and is compiled only with the direct data path.
        std::fs::write(
            dir.join("config.h"),
            "#define HAVE_EFA_DATA_PATH_DIRECT 1\n",
        )
        .unwrap();
        let mut got = BTreeMap::new();
        let mut failed = Vec::new();
        for (name, body, ext) in PROGRAMS {
            let header = if ext {
                Some(&self.ext)
            } else {
                self.io_defs.as_ref()
            };
            let Some(header) = header else {
                failed.push(format!("{name} (no efa_io_defs.h in the tree)"));
                continue;
            };
            let c = dir.join(format!("{name}.c"));
            let exe = dir.join(name);
            std::fs::write(&c, format!("{HEAD}{body}")).expect("write the C file");
            let mut cmd = Command::new(cc);
            cmd.args(["-std=gnu11", "-Wall", "-Werror", "-I"])
                .arg(dir)
                .arg("-I")
                .arg(header.parent().expect("header directory"));
            for i in &self.includes {
                cmd.arg("-I").arg(i);
            }
            let out = cmd
                .arg(&c)
                .arg("-o")
                .arg(&exe)
                .output()
                .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
            if !out.status.success() {
                failed.push(name.to_string());
                continue;
            }
            let out = Command::new(&exe).output().expect("run the C program");
            assert!(out.status.success(), "{name} exited with {}", out.status);
            for l in String::from_utf8(out.stdout).expect("ASCII").lines() {
                let (k, v) = l.split_once(' ').expect("key value");
                got.insert(k.to_string(), v.to_string());
            }
        }
        (got, failed)
    }
}

macro_rules! off {
    ($m:ident, $c:literal, $t:ty, $f:tt) => {
        $m.insert(concat!("offsetof.", $c), offset_of!($t, $f) as u64)
    };
}

/// Every key the programs print, with the value the library's mirrors and codecs hold. Keys whose
/// value depends on the version (the table's size, `caps`) are checked in [`compare`].
pub fn mirror() -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    m.extend(nvshmem_efa_gda::fabric::mr_attr_layout());
    m.insert("sizeof.fi_efa_wq_attr", size_of::<FiEfaWqAttr>() as u64);
    off!(m, "fi_efa_wq_attr.buffer", FiEfaWqAttr, buffer);
    off!(m, "fi_efa_wq_attr.entry_size", FiEfaWqAttr, entry_size);
    off!(m, "fi_efa_wq_attr.num_entries", FiEfaWqAttr, num_entries);
    off!(m, "fi_efa_wq_attr.doorbell", FiEfaWqAttr, doorbell);
    off!(m, "fi_efa_wq_attr.max_batch", FiEfaWqAttr, max_batch);
    off!(m, "fi_efa_wq_attr.caps", FiEfaWqAttr, caps);
    m.insert("sizeof.fi_efa_wq_attr.caps", 2);
    m.insert(
        "value.FI_EFA_WQ_CAPS_64_BIT_REQ_ID",
        u64::from(FI_EFA_WQ_CAPS_64_BIT_REQ_ID),
    );
    m.insert("sizeof.fi_efa_cq_attr", size_of::<FiEfaCqAttr>() as u64);
    off!(m, "fi_efa_cq_attr.buffer", FiEfaCqAttr, buffer);
    off!(m, "fi_efa_cq_attr.entry_size", FiEfaCqAttr, entry_size);
    off!(m, "fi_efa_cq_attr.num_entries", FiEfaCqAttr, num_entries);
    m.insert(
        "sizeof.fi_efa_cq_init_attr",
        size_of::<FiEfaCqInitAttr>() as u64,
    );
    off!(m, "fi_efa_cq_init_attr.flags", FiEfaCqInitAttr, flags);
    let d = offset_of!(FiEfaCqInitAttr, ext_mem_dmabuf) as u64;
    m.insert("offsetof.fi_efa_cq_init_attr.ext_mem_dmabuf", d);
    for (k, o) in [
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
        m.insert(k, d + o as u64);
    }
    m.insert(
        "value.FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF",
        FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF,
    );
    off!(m, "fi_efa_ops_gda.query_addr", FiEfaOpsGda, query_addr);
    off!(m, "fi_efa_ops_gda.query_qp_wqs", FiEfaOpsGda, query_qp_wqs);
    off!(m, "fi_efa_ops_gda.query_cq", FiEfaOpsGda, query_cq);
    off!(m, "fi_efa_ops_gda.cq_open_ext", FiEfaOpsGda, cq_open_ext);
    off!(m, "fi_efa_ops_gda.get_mr_lkey", FiEfaOpsGda, get_mr_lkey);
    off!(
        m,
        "fi_efa_ops_gda.cntr_open_ext",
        FiEfaOpsGda,
        cntr_open_ext
    );
    m.insert(
        "sizeof.fi_efa_memory_location",
        size_of::<FiEfaMemoryLocation>() as u64,
    );
    let l = offset_of!(FiEfaMemoryLocation, dmabuf) as u64;
    off!(m, "fi_efa_memory_location.ptr", FiEfaMemoryLocation, ptr);
    m.insert("offsetof.fi_efa_memory_location.dmabuf", l);
    for (k, o) in [
        (
            "offsetof.fi_efa_memory_location.dmabuf.offset",
            offset_of!(FiEfaMemoryLocationDmabuf, offset),
        ),
        (
            "offsetof.fi_efa_memory_location.dmabuf.fd",
            offset_of!(FiEfaMemoryLocationDmabuf, fd),
        ),
        (
            "offsetof.fi_efa_memory_location.dmabuf.reserved",
            offset_of!(FiEfaMemoryLocationDmabuf, reserved),
        ),
    ] {
        m.insert(k, l + o as u64);
    }
    off!(m, "fi_efa_memory_location.type", FiEfaMemoryLocation, type_);
    off!(
        m,
        "fi_efa_memory_location.reserved",
        FiEfaMemoryLocation,
        reserved
    );
    m.insert(
        "sizeof.fi_efa_comp_cntr_init_attr",
        size_of::<FiEfaCompCntrInitAttr>() as u64,
    );
    off!(
        m,
        "fi_efa_comp_cntr_init_attr.comp_mask",
        FiEfaCompCntrInitAttr,
        comp_mask
    );
    off!(
        m,
        "fi_efa_comp_cntr_init_attr.flags",
        FiEfaCompCntrInitAttr,
        flags
    );
    off!(
        m,
        "fi_efa_comp_cntr_init_attr.reserved",
        FiEfaCompCntrInitAttr,
        reserved
    );
    off!(
        m,
        "fi_efa_comp_cntr_init_attr.comp_cntr_ext_mem",
        FiEfaCompCntrInitAttr,
        comp_cntr_ext_mem
    );
    off!(
        m,
        "fi_efa_comp_cntr_init_attr.err_cntr_ext_mem",
        FiEfaCompCntrInitAttr,
        err_cntr_ext_mem
    );
    m.insert(
        "value.FI_EFA_MEMORY_LOCATION_VA",
        u64::from(FI_EFA_MEMORY_LOCATION_VA),
    );
    m.insert(
        "value.FI_EFA_MEMORY_LOCATION_DMABUF",
        u64::from(FI_EFA_MEMORY_LOCATION_DMABUF),
    );
    m.insert(
        "value.FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM",
        u64::from(FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM),
    );
    m.insert(
        "value.FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM",
        u64::from(FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM),
    );
    io_mirror(&mut m);
    m
}

/// The device formats as src/efa encodes them.
fn io_mirror(m: &mut BTreeMap<&'static str, u64>) {
    m.insert("sizeof.efa_io_tx_meta_desc", size_of::<TxMetaDesc>() as u64);
    off!(m, "efa_io_tx_meta_desc.req_id", TxMetaDesc, req_id);
    off!(m, "efa_io_tx_meta_desc.ctrl1", TxMetaDesc, ctrl1);
    off!(m, "efa_io_tx_meta_desc.ctrl2", TxMetaDesc, ctrl2);
    off!(
        m,
        "efa_io_tx_meta_desc.dest_qp_num",
        TxMetaDesc,
        dest_qp_num
    );
    off!(m, "efa_io_tx_meta_desc.length", TxMetaDesc, length);
    off!(
        m,
        "efa_io_tx_meta_desc.immediate_data",
        TxMetaDesc,
        immediate_data
    );
    off!(m, "efa_io_tx_meta_desc.ah", TxMetaDesc, ah);
    off!(m, "efa_io_tx_meta_desc.ctrl3", TxMetaDesc, ctrl3);
    off!(m, "efa_io_tx_meta_desc.qkey", TxMetaDesc, qkey);
    off!(m, "efa_io_tx_meta_desc.reserved2", TxMetaDesc, reserved2);
    off!(m, "efa_io_tx_meta_desc.req_id_ex", TxMetaDesc, req_id_ex);
    m.insert("sizeof.efa_io_req_id_ex", 6);
    m.insert("sizeof.efa_io_tx_buf_desc", size_of::<BufDesc>() as u64);
    off!(m, "efa_io_tx_buf_desc.length", BufDesc, length);
    off!(m, "efa_io_tx_buf_desc.lkey", BufDesc, lkey);
    off!(m, "efa_io_tx_buf_desc.buf_addr_lo", BufDesc, addr_lo);
    off!(m, "efa_io_tx_buf_desc.buf_addr_hi", BufDesc, addr_hi);
    m.insert(
        "sizeof.efa_io_remote_mem_addr",
        size_of::<RemoteMemDesc>() as u64,
    );
    off!(m, "efa_io_remote_mem_addr.length", RemoteMemDesc, length);
    off!(m, "efa_io_remote_mem_addr.rkey", RemoteMemDesc, rkey);
    off!(
        m,
        "efa_io_remote_mem_addr.buf_addr_lo",
        RemoteMemDesc,
        addr_lo
    );
    off!(
        m,
        "efa_io_remote_mem_addr.buf_addr_hi",
        RemoteMemDesc,
        addr_hi
    );
    m.insert("sizeof.efa_io_rdma_req", size_of::<RdmaReq>() as u64);
    off!(m, "efa_io_rdma_req.remote_mem", RdmaReq, remote);
    off!(m, "efa_io_rdma_req.local_mem", RdmaReq, local);
    m.insert("sizeof.efa_io_tx_wqe", size_of::<TxWqe>() as u64);
    off!(m, "efa_io_tx_wqe.meta", TxWqe, meta);
    off!(m, "efa_io_tx_wqe.data", TxWqe, data);
    m.insert(
        "sizeof.efa_io_cdesc_common",
        size_of::<CdescCommon>() as u64,
    );
    off!(m, "efa_io_cdesc_common.req_id", CdescCommon, req_id);
    off!(m, "efa_io_cdesc_common.status", CdescCommon, status);
    off!(m, "efa_io_cdesc_common.flags", CdescCommon, flags);
    off!(m, "efa_io_cdesc_common.qp_num", CdescCommon, qp_num);
    m.insert("sizeof.efa_io_tx_cdesc", cqe::TX_CQE_SIZE as u64);
    off!(m, "efa_io_tx_cdesc.req_id_ex", TxCdesc, req_id_ex);
    off!(m, "efa_io_tx_cdesc.reserved", TxCdesc, reserved);
    m.insert("sizeof.efa_io_rx_cdesc", cqe::RX_CQE_SIZE as u64);
    off!(m, "efa_io_rx_cdesc.length", RxCdesc, length);
    off!(m, "efa_io_rx_cdesc.ah", RxCdesc, ah);
    off!(m, "efa_io_rx_cdesc.src_qp_num", RxCdesc, src_qp_num);
    off!(m, "efa_io_rx_cdesc.imm", RxCdesc, imm);
    m.insert("sizeof.efa_io_rx_cdesc_ex", cqe::RX_CQE_EX_SIZE as u64);
    m.insert("offsetof.efa_io_rx_cdesc_ex.u", cqe::RX_CQE_SIZE as u64);
    m.insert("value.EFA_IO_TX_DESC_NUM_BUFS", wqe::SEND_MAX_SGES as u64);
    m.insert(
        "value.EFA_IO_TX_DESC_NUM_RDMA_BUFS",
        u64::from(wqe::RDMA_SGES),
    );
    m.insert("value.EFA_IO_SEND", u64::from(wqe::OpType::Send.raw()));
    m.insert(
        "value.EFA_IO_RDMA_READ",
        u64::from(wqe::OpType::RdmaRead.raw()),
    );
    m.insert(
        "value.EFA_IO_RDMA_WRITE",
        u64::from(wqe::OpType::RdmaWrite.raw()),
    );
    m.insert(
        "value.EFA_IO_SEND_QUEUE",
        u64::from(cqe::QueueType::Send.raw()),
    );
    m.insert(
        "value.EFA_IO_RECV_QUEUE",
        u64::from(cqe::QueueType::Recv.raw()),
    );
    for (k, v) in [
        (
            "value.EFA_IO_TX_META_DESC_OP_TYPE_MASK",
            wqe::CTRL1_OP_TYPE_MASK,
        ),
        ("value.EFA_IO_TX_META_DESC_HAS_IMM_MASK", wqe::CTRL1_HAS_IMM),
        (
            "value.EFA_IO_TX_META_DESC_INLINE_MSG_MASK",
            wqe::CTRL1_INLINE_MSG,
        ),
        (
            "value.EFA_IO_TX_META_DESC_META_EXTENSION_MASK",
            wqe::CTRL1_META_EXTENSION,
        ),
        (
            "value.EFA_IO_TX_META_DESC_META_DESC_MASK",
            wqe::CTRL1_META_DESC,
        ),
        ("value.EFA_IO_TX_META_DESC_PHASE_MASK", wqe::CTRL2_PHASE),
        ("value.EFA_IO_TX_META_DESC_FIRST_MASK", wqe::CTRL2_FIRST),
        ("value.EFA_IO_TX_META_DESC_LAST_MASK", wqe::CTRL2_LAST),
        (
            "value.EFA_IO_TX_META_DESC_COMP_REQ_MASK",
            wqe::CTRL2_COMP_REQ,
        ),
        (
            "value.EFA_IO_TX_META_DESC_PROCESSING_HINTS_MASK",
            wqe::CTRL3_PROCESSING_HINTS_MASK,
        ),
        (
            "value.EFA_IO_PROCESSING_HINT_BURST_PPS_SENSITIVE",
            wqe::PROCESSING_HINT_HIGH_PPS,
        ),
        ("value.EFA_IO_CDESC_COMMON_PHASE_MASK", cqe::FLAG_PHASE),
        (
            "value.EFA_IO_CDESC_COMMON_Q_TYPE_MASK",
            cqe::FLAG_Q_TYPE_MASK,
        ),
        ("value.EFA_IO_CDESC_COMMON_HAS_IMM_MASK", cqe::FLAG_HAS_IMM),
        (
            "value.EFA_IO_CDESC_COMMON_OP_TYPE_MASK",
            cqe::FLAG_OP_TYPE_MASK,
        ),
        (
            "value.EFA_IO_CDESC_COMMON_UNSOLICITED_MASK",
            cqe::FLAG_UNSOLICITED,
        ),
    ] {
        m.insert(k, u64::from(v));
    }
    m.insert(
        "value.EFA_IO_TX_BUF_DESC_LKEY_MASK",
        u64::from(wqe::LKEY_MASK),
    );
    m.insert("sizeof.efa_io_tx_wqe_128", wqe::WQE_SIZE_128 as u64);
    m.insert("offsetof.efa_io_tx_wqe_128.meta", 0);
    m.insert("offsetof.efa_io_tx_wqe_128.data", DATA_OFFSET as u64);
    m.insert(
        "offsetof.efa_io_tx_wqe_128.data.inline_data",
        wqe::wide::SEND_INLINE_OFFSET as u64,
    );
    m.insert(
        "offsetof.efa_io_tx_wqe_128.data.rdma_req.inline_data",
        wqe::wide::RDMA_INLINE_OFFSET as u64,
    );
    m.insert(
        "offsetof.efa_io_tx_wqe_128.data.rdma_req.local_mem",
        RDMA_LOCAL_OFFSET as u64,
    );
    m.insert(
        "value.EFA_IO_TX_DESC_INLINE_MAX_SIZE_128",
        wqe::INLINE_MAX_128 as u64,
    );
    m.insert(
        "sizeof.efa_io_tx_wqe_128.data.inline_data",
        wqe::INLINE_MAX_128 as u64,
    );
    m.insert(
        "sizeof.efa_io_tx_wqe_128.data.rdma_req.inline_data",
        wqe::INLINE_MAX_128 as u64,
    );
}

/// `got` (a tree's or a golden block's lines) against the mirrors: every key must be mirrored and
/// equal. The table's size is 40 or 48 bytes by whether it has `cntr_open_ext`; without `caps`,
/// the mirror's field must lie in the struct's tail padding (the provider clears the struct).
/// Returns the differences.
pub fn compare(got: &BTreeMap<String, String>) -> Vec<String> {
    let m = mirror();
    let mut bad = Vec::new();
    for (k, v) in got {
        if k == "name.FI_EFA_GDA_OPS" {
            if v != nvshmem_efa_gda::fabric::efa_gda_abi::FI_EFA_GDA_OPS {
                bad.push(format!("{k}: header {v:?}"));
            }
            continue;
        }
        let want = match k.as_str() {
            "sizeof.fi_efa_ops_gda" => Some(
                if got.contains_key("offsetof.fi_efa_ops_gda.cntr_open_ext") {
                    size_of::<FiEfaOpsGda>() as u64
                } else {
                    FI_EFA_OPS_GDA_SIZE_V2_3 as u64
                },
            ),
            // The struct without its tail: 2.6.0's tx_cdesc ends at a 2-byte reserved word.
            "sizeof.efa_io_tx_cdesc" if !got.contains_key("offsetof.efa_io_tx_cdesc.req_id_ex") => {
                continue
            }
            _ => m.get(k.as_str()).copied(),
        };
        match (want, v.parse::<u64>()) {
            (Some(w), Ok(h)) if w == h => {}
            (None, _) => bad.push(format!("{k}: printed ({v}) but not mirrored")),
            (Some(w), h) => bad.push(format!("{k}: header {h:?}, mirror {w}")),
        }
    }
    if got.contains_key("sizeof.fi_efa_wq_attr")
        && !got.contains_key("offsetof.fi_efa_wq_attr.caps")
    {
        let size: u64 = got["sizeof.fi_efa_wq_attr"].parse().unwrap_or(0);
        let end = got
            .get("offsetof.fi_efa_wq_attr.max_batch")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(u64::MAX, |o| o + 4);
        let caps = offset_of!(FiEfaWqAttr, caps) as u64;
        if !(caps >= end && caps + 2 <= size) {
            bad.push(format!(
                "fi_efa_wq_attr has no caps and the mirror's ({caps}..{}) is not in its tail padding \
                 ({end}..{size})",
                caps + 2
            ));
        }
    }
    bad
}
