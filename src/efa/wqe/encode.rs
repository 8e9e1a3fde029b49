//! Building the WQE bytes from a description.

use super::layout::{BufDesc, RdmaReq, RemoteMemDesc, TxWqe};
use super::validate::validate;
use super::{
    LocalBuf, RemoteBuf, SendPayload, WqeDesc, WqeError, WqeOp, CTRL1_HAS_IMM, CTRL1_INLINE_MSG,
    CTRL1_META_DESC, CTRL1_OP_TYPE_MASK, CTRL2_COMP_REQ, CTRL2_FIRST, CTRL2_LAST, CTRL2_PHASE,
    INLINE_MAX, LKEY_MASK, PROCESSING_HINT_HIGH_PPS, RDMA_SGES, WQE_SIZE,
};
use crate::efa::le::req_id_ex_words;

fn buf_desc(b: &LocalBuf) -> BufDesc {
    BufDesc {
        length: b.len,
        lkey: b.lkey & LKEY_MASK,
        addr_lo: b.addr as u32,
        addr_hi: (b.addr >> 32) as u32,
    }
}

fn remote_desc(r: &RemoteBuf) -> RemoteMemDesc {
    RemoteMemDesc {
        length: r.len,
        rkey: r.rkey,
        addr_lo: r.addr as u32,
        addr_hi: (r.addr >> 32) as u32,
    }
}

/// Builds the raw WQE for `desc`.
///
/// Out-of-range fields are masked rather than rejected (phase to bit 0, lkey to 24 bits,
/// request id to 16 bits without `req_id_64`, inline length to [`INLINE_MAX`], inline bytes
/// past the length dropped); use [`validate`] or [`encode_checked`] to refuse them instead.
pub fn encode_raw(desc: &WqeDesc) -> TxWqe {
    let mut w = TxWqe::default();
    let op = desc.op.op_type();
    let m = &mut w.meta;
    m.req_id = desc.req_id as u16;
    if desc.req_id_64 {
        m.req_id_ex = req_id_ex_words(desc.req_id);
    }
    m.ctrl1 = CTRL1_META_DESC | (op.raw() & CTRL1_OP_TYPE_MASK);
    m.ctrl2 = CTRL2_FIRST | CTRL2_LAST | (desc.phase & CTRL2_PHASE);
    if desc.comp_req {
        m.ctrl2 |= CTRL2_COMP_REQ;
    }
    m.dest_qp_num = desc.dest_qpn;
    m.ah = desc.ah;
    m.qkey = desc.qkey;
    if desc.high_pps {
        m.ctrl3 = PROCESSING_HINT_HIGH_PPS;
    }
    if let Some(imm) = desc.op.imm() {
        m.ctrl1 |= CTRL1_HAS_IMM;
        m.immediate_data = imm;
    }
    match &desc.op {
        WqeOp::Send { payload, .. } => match payload {
            SendPayload::Sgl { first, second } => {
                w.meta.length = 1;
                w.set_sge(0, &buf_desc(first));
                if let Some(s) = second {
                    w.meta.length = 2;
                    w.set_sge(1, &buf_desc(s));
                }
            }
            SendPayload::Inline { len, data } => {
                let n = usize::from(*len).min(INLINE_MAX);
                w.meta.ctrl1 |= CTRL1_INLINE_MSG;
                w.meta.length = n as u16;
                w.data[..n].copy_from_slice(&data[..n]);
            }
        },
        WqeOp::RdmaWrite { remote, local }
        | WqeOp::RdmaWriteImm { remote, local, .. }
        | WqeOp::RdmaRead { remote, local } => {
            w.meta.length = RDMA_SGES;
            w.set_rdma(&RdmaReq {
                remote: remote_desc(remote),
                local: buf_desc(local),
            });
        }
    }
    w
}

/// Encodes `desc` as the 64 bytes the device reads (little-endian, reserved bytes zero).
///
/// Deterministic; masks out-of-range fields as [`encode_raw`] describes. For every
/// description that [`validate`] accepts, `decode_with(&encode(d), d.req_id_64) == Ok(d)`.
pub fn encode(desc: &WqeDesc) -> [u8; WQE_SIZE] {
    encode_raw(desc).to_bytes()
}

/// Validates `desc` and encodes it; the error is the one [`validate`] reports.
pub fn encode_checked(desc: &WqeDesc) -> Result<[u8; WQE_SIZE], WqeError> {
    validate(desc)?;
    Ok(encode(desc))
}
