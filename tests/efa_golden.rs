//! Golden-vector tests of the EFA WQE and CQE codecs.
//!
//! Reads `tests/golden/efa_vectors.txt` (format described in `tests/golden/gen_vectors.py`),
//! encodes every described entry and compares it byte for byte with the expected bytes,
//! decodes the expected bytes and compares the result with the description, and checks
//! that every negative vector is rejected with the named error.

use std::collections::{BTreeMap, HashSet};

use nvshmem_efa_gda::efa::cqe::{self, CqStatus, CqeError, RxCqe, TxCqe};
use nvshmem_efa_gda::efa::wqe::{
    self, LocalBuf, OpType, RemoteBuf, SendPayload, TxWqe, WqeDesc, WqeError, WqeOp,
};

const VECTORS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/efa_vectors.txt"
));

struct Vector {
    line: usize,
    kind: String,
    name: String,
    fields: BTreeMap<String, String>,
}

impl Vector {
    fn get(&self, key: &str) -> &str {
        self.fields
            .get(key)
            .unwrap_or_else(|| panic!("line {} ({}): missing key {key}", self.line, self.name))
    }

    fn num(&self, key: &str) -> u64 {
        parse_num(self.get(key))
            .unwrap_or_else(|| panic!("line {} ({}): bad number for {key}", self.line, self.name))
    }

    fn opt_num(&self, key: &str) -> Option<u64> {
        match self.get(key) {
            "-" => None,
            _ => Some(self.num(key)),
        }
    }

    fn flag(&self, key: &str) -> bool {
        match self.num(key) {
            0 => false,
            1 => true,
            v => panic!(
                "line {} ({}): {key}={v} is not 0 or 1",
                self.line, self.name
            ),
        }
    }

    fn bytes(&self, key: &str) -> Vec<u8> {
        match self.get(key) {
            "-" => Vec::new(),
            s => parse_hex(s)
                .unwrap_or_else(|| panic!("line {} ({}): bad hex for {key}", self.line, self.name)),
        }
    }

    fn fixed<const N: usize>(&self, key: &str) -> [u8; N] {
        let v = self.bytes(key);
        v.as_slice().try_into().unwrap_or_else(|_| {
            panic!(
                "line {} ({}): {key} has {} bytes, expected {N}",
                self.line,
                self.name,
                v.len()
            )
        })
    }

    fn u16(&self, key: &str) -> u16 {
        u16::try_from(self.num(key)).expect("value fits u16")
    }

    fn u32(&self, key: &str) -> u32 {
        u32::try_from(self.num(key)).expect("value fits u32")
    }
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() & 1 == 1 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vectors() -> Vec<Vector> {
    let mut out = Vec::new();
    for (i, raw) in VECTORS.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut toks = line.split(' ');
        let kind = toks.next().expect("kind").to_string();
        let name = toks.next().expect("name").to_string();
        let mut fields = BTreeMap::new();
        for t in toks {
            let (k, v) = t
                .split_once('=')
                .unwrap_or_else(|| panic!("line {}: token {t:?} is not key=value", i + 1));
            assert!(
                fields.insert(k.to_string(), v.to_string()).is_none(),
                "line {}: duplicate key {k}",
                i + 1
            );
        }
        out.push(Vector {
            line: i + 1,
            kind,
            name,
            fields,
        });
    }
    out
}

fn of_kind(kind: &str) -> Vec<Vector> {
    vectors().into_iter().filter(|v| v.kind == kind).collect()
}

fn show_diff(name: &str, got: &[u8], want: &[u8]) -> String {
    let diffs: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| format!("byte {i}: got {g:02x} want {w:02x}"))
        .collect();
    format!(
        "{name}: encoding differs\n got  {}\n want {}\n {}",
        hex(got),
        hex(want),
        diffs.join(", ")
    )
}

fn local(v: &Vector, prefix: &str) -> LocalBuf {
    LocalBuf {
        addr: v.num(&format!("{prefix}addr")),
        lkey: v.u32(&format!("{prefix}lkey")),
        len: v.u32(&format!("{prefix}len")),
    }
}

fn wqe_desc(v: &Vector) -> WqeDesc {
    let imm = v
        .opt_num("imm")
        .map(|x| u32::try_from(x).expect("imm fits u32"));
    let rdma = || {
        (
            RemoteBuf {
                addr: v.num("raddr"),
                rkey: v.u32("rkey"),
                len: v.u32("rlen"),
            },
            LocalBuf {
                addr: v.num("laddr"),
                lkey: v.u32("lkey"),
                len: v.u32("llen"),
            },
        )
    };
    let op = match v.get("op") {
        "send_inline" => WqeOp::Send {
            payload: SendPayload::inline(&v.bytes("inline")).expect("inline fits"),
            imm,
        },
        "send_sge" => {
            let n = v.num("sges");
            assert!(n == 1 || n == 2, "{}: sges={n}", v.name);
            WqeOp::Send {
                payload: SendPayload::Sgl {
                    first: local(v, "s0_"),
                    second: (n == 2).then(|| local(v, "s1_")),
                },
                imm,
            }
        }
        "rdma_write" => {
            assert_eq!(imm, None, "{}", v.name);
            let (remote, local) = rdma();
            WqeOp::RdmaWrite { remote, local }
        }
        "rdma_write_imm" => {
            let (remote, local) = rdma();
            WqeOp::RdmaWriteImm {
                remote,
                local,
                imm: imm.expect("rdma_write_imm needs imm"),
            }
        }
        "rdma_read" => {
            assert_eq!(imm, None, "{}", v.name);
            let (remote, local) = rdma();
            WqeOp::RdmaRead { remote, local }
        }
        other => panic!("{}: unknown op {other}", v.name),
    };
    WqeDesc {
        op,
        req_id: v.num("req_id"),
        req_id_64: v.flag("req64"),
        phase: v.num("phase") as u8,
        comp_req: v.flag("comp_req"),
        dest_qpn: v.u16("dest_qpn"),
        ah: v.u16("ah"),
        qkey: v.u32("qkey"),
        high_pps: v.flag("high_pps"),
    }
}

fn wqe_error_name(e: &WqeError) -> String {
    match e {
        WqeError::MissingMetaDesc => "MissingMetaDesc".into(),
        WqeError::MetaExtension => "MetaExtension".into(),
        WqeError::UnknownOpType(v) => format!("UnknownOpType:{v}"),
        WqeError::NotFirst => "NotFirst".into(),
        WqeError::NotLast => "NotLast".into(),
        WqeError::ReservedNonZero { offset } => format!("ReservedNonZero:{offset}"),
        WqeError::UnknownProcessingHint(v) => format!("UnknownProcessingHint:{v}"),
        WqeError::ImmediateWithRead => "ImmediateWithRead".into(),
        WqeError::StrayImmediate => "StrayImmediate".into(),
        WqeError::InlineRdma => "InlineRdma".into(),
        WqeError::InlineTooLong { len } => format!("InlineTooLong:{len}"),
        WqeError::BadDescriptorCount { count, .. } => format!("BadDescriptorCount:{count}"),
        WqeError::LkeyTooWide { index, .. } => format!("LkeyTooWide:{index}"),
        WqeError::ZeroLength { index } => format!("ZeroLength:{index}"),
        WqeError::LengthMismatch { .. } => "LengthMismatch".into(),
        WqeError::PhaseOutOfRange(v) => format!("PhaseOutOfRange:{v}"),
        WqeError::ReqIdTooWide(v) => format!("ReqIdTooWide:{v}"),
        WqeError::BadEntrySize(v) => format!("BadEntrySize:{v}"),
    }
}

fn cqe_error_name(e: &CqeError) -> String {
    match e {
        CqeError::UnknownStatus(v) => format!("UnknownStatus:{v}"),
        CqeError::UnknownQueueType(v) => format!("UnknownQueueType:{v}"),
        CqeError::WrongQueueType { .. } => "WrongQueueType".into(),
        CqeError::UnknownOpType(v) => format!("UnknownOpType:{v}"),
        CqeError::InvalidOpForQueue(_) => "InvalidOpForQueue".into(),
        CqeError::RxOnlyFlag { bit } => format!("RxOnlyFlag:{bit}"),
        CqeError::UnsolicitedWithoutWrite => "UnsolicitedWithoutWrite".into(),
        CqeError::WriteWithoutImm => "WriteWithoutImm".into(),
        CqeError::StrayImmediate => "StrayImmediate".into(),
        CqeError::ReservedNonZero { offset } => format!("ReservedNonZero:{offset}"),
        CqeError::PhaseOutOfRange(v) => format!("PhaseOutOfRange:{v}"),
        CqeError::ReqIdTooWide(v) => format!("ReqIdTooWide:{v}"),
        CqeError::LengthTooWide(v) => format!("LengthTooWide:{v}"),
        CqeError::SrcAddrNotAllowed => "SrcAddrNotAllowed".into(),
        CqeError::EmptySrcAddr => "EmptySrcAddr".into(),
    }
}

fn cqe_op(v: &Vector) -> OpType {
    match v.get("op") {
        "send" => OpType::Send,
        "rdma_read" => OpType::RdmaRead,
        "rdma_write" => OpType::RdmaWrite,
        other => panic!("{}: unknown op {other}", v.name),
    }
}

fn status(v: &Vector) -> CqStatus {
    let raw = v.num("status");
    CqStatus::from_raw(u8::try_from(raw).expect("status fits u8"))
        .unwrap_or_else(|| panic!("{}: status {raw} undefined", v.name))
}

#[test]
fn vector_file_is_well_formed() {
    let all = vectors();
    let mut names = HashSet::new();
    for v in &all {
        assert!(
            names.insert(v.name.clone()),
            "duplicate vector name {}",
            v.name
        );
        assert!(
            [
                "wqe",
                "wqe_bad",
                "tx_cqe",
                "rx_cqe",
                "rx_cqe_ex",
                "cqe_bad",
                "entry",
                "entry_bad"
            ]
            .contains(&v.kind.as_str()),
            "line {}: unknown kind {}",
            v.line,
            v.kind
        );
    }
    let count = |k: &str| all.iter().filter(|v| v.kind == k).count();
    assert!(count("wqe") >= 40, "only {} WQE vectors", count("wqe"));
    assert!(
        count("wqe_bad") >= 20,
        "only {} negative WQE vectors",
        count("wqe_bad")
    );
    let cqes = count("tx_cqe") + count("rx_cqe") + count("rx_cqe_ex");
    assert!(cqes >= 20, "only {cqes} CQE vectors");
    assert!(
        count("cqe_bad") >= 10,
        "only {} negative CQE vectors",
        count("cqe_bad")
    );
    assert!(count("entry") >= 6, "only {} entry vectors", count("entry"));
    assert!(
        count("entry_bad") >= 3,
        "only {} negative entry vectors",
        count("entry_bad")
    );
}

/// A WQE written into a ring entry: the whole entry, the WQE then zeros (128-byte entries too).
#[test]
fn entry_vectors_store_and_decode() {
    let wqes: BTreeMap<String, Vector> = of_kind("wqe")
        .into_iter()
        .map(|v| (v.name.clone(), v))
        .collect();
    let entries = of_kind("entry");
    assert!(entries.iter().any(|v| v.num("entry_size") == 128));
    for v in &entries {
        let of = wqes
            .get(v.get("of"))
            .unwrap_or_else(|| panic!("{}: no WQE vector {}", v.name, v.get("of")));
        let desc = wqe_desc(of);
        let size = v.num("entry_size") as usize;
        let want = v.bytes("bytes");
        assert_eq!(want.len(), size, "{}: expected bytes", v.name);
        let mut slot = vec![0xA5u8; size];
        wqe::store_entry(&mut slot, &wqe::encode(&desc)).expect("valid entry size");
        assert!(slot == want, "{}", show_diff(&v.name, &slot, &want));
        assert_eq!(
            wqe::decode_entry(&want, desc.req_id_64),
            Ok(desc),
            "{}: decode",
            v.name
        );
    }
}

#[test]
fn entry_negative_vectors_are_rejected() {
    for v in &of_kind("entry_bad") {
        let bytes = v.bytes("bytes");
        assert_eq!(bytes.len(), wqe::WQE_SIZE_128, "{}", v.name);
        let expected = v.get("error");
        match wqe::decode_entry(&bytes, v.flag("req64")) {
            Ok(d) => panic!("{}: accepted as {d:?}, expected {expected}", v.name),
            Err(e) => assert_eq!(
                wqe_error_name(&e),
                expected,
                "{}: wrong error ({e})",
                v.name
            ),
        }
        // The first 64 bytes alone are a valid WQE: only the stale tail is wrong.
        let mut head = [0u8; wqe::WQE_SIZE];
        head.copy_from_slice(&bytes[..wqe::WQE_SIZE]);
        assert!(
            wqe::decode_with(&head, v.flag("req64")).is_ok(),
            "{}",
            v.name
        );
    }
}

#[test]
fn wqe_vectors_cover_every_op_and_boundary() {
    let descs: Vec<WqeDesc> = of_kind("wqe").iter().map(wqe_desc).collect();
    let has = |f: &dyn Fn(&WqeDesc) -> bool| descs.iter().any(f);
    assert!(has(&|d| matches!(d.op, WqeOp::RdmaWrite { .. })));
    assert!(has(&|d| matches!(d.op, WqeOp::RdmaWriteImm { .. })));
    assert!(has(&|d| matches!(d.op, WqeOp::RdmaRead { .. })));
    assert!(has(&|d| matches!(
        d.op,
        WqeOp::Send {
            payload: SendPayload::Inline { len: 32, .. },
            ..
        }
    )));
    assert!(has(&|d| matches!(
        d.op,
        WqeOp::Send {
            payload: SendPayload::Inline { len: 0, .. },
            ..
        }
    )));
    assert!(has(&|d| matches!(
        d.op,
        WqeOp::Send {
            payload: SendPayload::Sgl {
                second: Some(_),
                ..
            },
            ..
        }
    )));
    assert!(has(&|d| d.req_id_64 && d.req_id > 0xFFFF_FFFF_FFFF));
    assert!(has(&|d| d.phase == 0) && has(&|d| d.phase == 1));
    assert!(has(
        &|d| matches!(d.op, WqeOp::RdmaRead { local, .. } if local.lkey == 0xFF_FFFF)
    ));
    assert!(has(
        &|d| matches!(d.op, WqeOp::RdmaWrite { remote, .. } if remote.addr >> 63 == 1)
    ));
}

#[test]
fn wqe_vectors_encode_and_decode() {
    let vs = of_kind("wqe");
    for v in &vs {
        let desc = wqe_desc(v);
        let want: [u8; wqe::WQE_SIZE] = v.fixed("bytes");
        assert_eq!(
            wqe::validate(&desc),
            Ok(()),
            "{}: description invalid",
            v.name
        );
        let got = wqe::encode(&desc);
        assert!(got == want, "{}", show_diff(&v.name, &got, &want));
        assert_eq!(wqe::encode_checked(&desc), Ok(want), "{}", v.name);
        assert_eq!(
            wqe::decode_with(&want, desc.req_id_64),
            Ok(desc),
            "{}: decode mismatch",
            v.name
        );
        if !desc.req_id_64 {
            assert_eq!(wqe::decode(&want), Ok(desc), "{}", v.name);
        }
        let raw = TxWqe::from_bytes(&want);
        assert_eq!(raw.to_bytes(), want, "{}: raw round trip", v.name);
        assert_eq!(raw.meta.req_id, desc.req_id as u16, "{}", v.name);
        assert_eq!(raw.request_id(desc.req_id_64), desc.req_id, "{}", v.name);
        assert_eq!(
            raw.meta.ctrl1 & wqe::CTRL1_OP_TYPE_MASK,
            desc.op.op_type().raw()
        );
    }
}

#[test]
fn wqe_negative_vectors_are_rejected() {
    for v in &of_kind("wqe_bad") {
        let bytes: [u8; wqe::WQE_SIZE] = v.fixed("bytes");
        let expected = v.get("error");
        match wqe::decode_with(&bytes, v.flag("req64")) {
            Ok(d) => panic!("{}: accepted as {d:?}, expected {expected}", v.name),
            Err(e) => {
                assert_eq!(
                    wqe_error_name(&e),
                    expected,
                    "{}: wrong error ({e})",
                    v.name
                );
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

fn tx_cqe(v: &Vector) -> TxCqe {
    TxCqe {
        req_id: v.num("req_id"),
        req_id_64: v.flag("req64"),
        status: status(v),
        phase: v.num("phase") as u8,
        op: cqe_op(v),
        qp_num: v.u16("qp_num"),
    }
}

fn rx_cqe(v: &Vector, extended: bool) -> RxCqe {
    RxCqe {
        req_id: v.u16("req_id"),
        status: status(v),
        phase: v.num("phase") as u8,
        op: cqe_op(v),
        has_imm: v.flag("has_imm"),
        unsolicited: v.flag("unsolicited"),
        qp_num: v.u16("qp_num"),
        length: v.u32("length"),
        ah: v.u16("ah"),
        src_qp: v.u16("src_qp"),
        imm: v.u32("imm"),
        src_addr: if extended && v.get("src_addr") != "-" {
            Some(v.fixed("src_addr"))
        } else {
            None
        },
    }
}

#[test]
fn tx_cqe_vectors_encode_and_decode() {
    let vs = of_kind("tx_cqe");
    let mut seen = HashSet::new();
    for v in &vs {
        let c = tx_cqe(v);
        seen.insert(c.status);
        let want: [u8; cqe::TX_CQE_SIZE] = v.fixed("bytes");
        assert_eq!(cqe::validate_tx(&c), Ok(()), "{}", v.name);
        let got = cqe::encode_tx(&c);
        assert!(got == want, "{}", show_diff(&v.name, &got, &want));
        assert_eq!(cqe::decode_tx_with(&want, c.req_id_64), Ok(c), "{}", v.name);
        assert_eq!(
            cqe::queue_type_of(&[want[0], want[1], want[2], want[3]]),
            Ok(cqe::QueueType::Send)
        );
        assert_eq!(cqe::flags_phase(want[3]), c.phase, "{}", v.name);
    }
    assert_eq!(
        seen.len(),
        CqStatus::ALL.len(),
        "every status appears in a TX vector"
    );
}

#[test]
fn rx_cqe_vectors_encode_and_decode() {
    for v in &of_kind("rx_cqe") {
        let c = rx_cqe(v, false);
        let want: [u8; cqe::RX_CQE_SIZE] = v.fixed("bytes");
        assert_eq!(cqe::validate_rx(&c, false), Ok(()), "{}", v.name);
        let got = cqe::encode_rx(&c);
        assert!(got == want, "{}", show_diff(&v.name, &got, &want));
        assert_eq!(cqe::decode_rx(&want), Ok(c), "{}", v.name);
        assert_eq!(
            cqe::queue_type_of(&[want[0], want[1], want[2], want[3]]),
            Ok(cqe::QueueType::Recv)
        );
    }
    for v in &of_kind("rx_cqe_ex") {
        let c = rx_cqe(v, true);
        let want: [u8; cqe::RX_CQE_EX_SIZE] = v.fixed("bytes");
        assert_eq!(cqe::validate_rx(&c, true), Ok(()), "{}", v.name);
        let got = cqe::encode_rx_ex(&c);
        assert!(got == want, "{}", show_diff(&v.name, &got, &want));
        assert_eq!(cqe::decode_rx_ex(&want), Ok(c), "{}", v.name);
        // The first 16 bytes are a valid base entry carrying the low 16 length bits.
        let mut base = [0u8; cqe::RX_CQE_SIZE];
        base.copy_from_slice(&want[..cqe::RX_CQE_SIZE]);
        let b = cqe::decode_rx(&base).expect("base part decodes");
        assert_eq!(b.length, c.length & 0xFFFF, "{}", v.name);
        assert_eq!(b.src_addr, None);
    }
}

#[test]
fn cqe_negative_vectors_are_rejected() {
    for v in &of_kind("cqe_bad") {
        let expected = v.get("error");
        let result = match v.get("form") {
            "tx" => cqe::decode_tx(&v.fixed("bytes")).map(|c| format!("{c:?}")),
            "tx64" => cqe::decode_tx_with(&v.fixed("bytes"), true).map(|c| format!("{c:?}")),
            "rx" => cqe::decode_rx(&v.fixed("bytes")).map(|c| format!("{c:?}")),
            "rx_ex" => cqe::decode_rx_ex(&v.fixed("bytes")).map(|c| format!("{c:?}")),
            other => panic!("{}: unknown form {other}", v.name),
        };
        match result {
            Ok(d) => panic!("{}: accepted as {d}, expected {expected}", v.name),
            Err(e) => {
                assert_eq!(
                    cqe_error_name(&e),
                    expected,
                    "{}: wrong error ({e})",
                    v.name
                );
            }
        }
    }
}
