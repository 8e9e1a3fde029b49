//! Strict, panic-free decoding of WQE bytes into a description.

use core::mem::offset_of;

use super::layout::{BufDesc, TxMetaDesc, TxWqe};
use super::validate::{check_local, check_rdma};
use super::{
    LocalBuf, OpType, RemoteBuf, SendPayload, WqeDesc, WqeError, WqeOp, CTRL1_HAS_IMM,
    CTRL1_INLINE_MSG, CTRL1_META_DESC, CTRL1_META_EXTENSION, CTRL1_OP_TYPE_MASK, CTRL2_COMP_REQ,
    CTRL2_FIRST, CTRL2_LAST, CTRL2_PHASE, CTRL2_RESERVED_MASK, CTRL3_PROCESSING_HINTS_MASK,
    DATA_OFFSET, INLINE_MAX, PROCESSING_HINT_HIGH_PPS, RDMA_SGES, SEND_MAX_SGES, WQE_SIZE,
};
use crate::efa::le::first_nonzero;

fn local_from(d: &BufDesc) -> LocalBuf {
    LocalBuf {
        addr: d.addr(),
        lkey: d.lkey,
        len: d.length,
    }
}

/// Decodes and validates a WQE of a queue WITHOUT the 64-bit request-id capability
/// (bytes 26-31 must be zero). Same as `decode_with(bytes, false)`.
pub fn decode(bytes: &[u8; WQE_SIZE]) -> Result<WqeDesc, WqeError> {
    decode_with(bytes, false)
}

/// Decodes and validates a WQE; `req_id_64` says whether the queue has the 64-bit
/// request-id capability (bytes 26-31 then carry bits 16-63 of the request id).
///
/// Never panics. Checks, in order: meta_desc set; meta_extension clear; known op type;
/// first and last set; reserved `ctrl2` bits clear; `ctrl3` reserved bits clear and a
/// known hint; bytes 15, 20-25 (and 26-31 without the capability) zero; has_imm only on
/// SEND or RDMA write and no immediate bytes without it; then per operation: SEND inline
/// length at most 32 with zero bytes past it, or 1-2 descriptors with 24-bit lkeys,
/// non-zero lengths and an all-zero unused slot; RDMA not inline, exactly one local
/// descriptor with a 24-bit lkey and the remote length, non-zero unless it is an RDMA
/// write with immediate.
pub fn decode_with(bytes: &[u8; WQE_SIZE], req_id_64: bool) -> Result<WqeDesc, WqeError> {
    let w = TxWqe::from_bytes(bytes);
    let m = &w.meta;

    if m.ctrl1 & CTRL1_META_DESC == 0 {
        return Err(WqeError::MissingMetaDesc);
    }
    if m.ctrl1 & CTRL1_META_EXTENSION != 0 {
        return Err(WqeError::MetaExtension);
    }
    let raw_op = m.ctrl1 & CTRL1_OP_TYPE_MASK;
    let op = OpType::from_raw(raw_op).ok_or(WqeError::UnknownOpType(raw_op))?;
    if m.ctrl2 & CTRL2_FIRST == 0 {
        return Err(WqeError::NotFirst);
    }
    if m.ctrl2 & CTRL2_LAST == 0 {
        return Err(WqeError::NotLast);
    }
    if m.ctrl2 & CTRL2_RESERVED_MASK != 0 {
        return Err(WqeError::ReservedNonZero {
            offset: offset_of!(TxMetaDesc, ctrl2) as u8,
        });
    }
    if m.ctrl3 & !CTRL3_PROCESSING_HINTS_MASK != 0 {
        return Err(WqeError::ReservedNonZero {
            offset: offset_of!(TxMetaDesc, ctrl3) as u8,
        });
    }
    let hint = m.ctrl3 & CTRL3_PROCESSING_HINTS_MASK;
    if hint > PROCESSING_HINT_HIGH_PPS {
        return Err(WqeError::UnknownProcessingHint(hint));
    }
    let reserved_end = if req_id_64 { 26 } else { 32 };
    if let Some(offset) = first_nonzero(bytes, 15, 16).or(first_nonzero(bytes, 20, reserved_end)) {
        return Err(WqeError::ReservedNonZero { offset });
    }

    let has_imm = m.ctrl1 & CTRL1_HAS_IMM != 0;
    if has_imm && op == OpType::RdmaRead {
        return Err(WqeError::ImmediateWithRead);
    }
    if !has_imm && m.immediate_data != 0 {
        return Err(WqeError::StrayImmediate);
    }
    let inline = m.ctrl1 & CTRL1_INLINE_MSG != 0;

    let wop = match op {
        OpType::Send => {
            let payload = if inline {
                let n = usize::from(m.length);
                if n > INLINE_MAX {
                    return Err(WqeError::InlineTooLong { len: m.length });
                }
                if let Some(offset) = first_nonzero(bytes, DATA_OFFSET + n, WQE_SIZE) {
                    return Err(WqeError::ReservedNonZero { offset });
                }
                let mut data = [0u8; INLINE_MAX];
                data[..n].copy_from_slice(&w.data[..n]);
                SendPayload::Inline { len: n as u8, data }
            } else {
                let count = m.length;
                if count == 0 || usize::from(count) > SEND_MAX_SGES {
                    return Err(WqeError::BadDescriptorCount { op, count });
                }
                let sgl = w.sgl();
                let mut used = [LocalBuf::default(); SEND_MAX_SGES];
                for (i, d) in sgl.iter().take(usize::from(count)).enumerate() {
                    let b = local_from(d);
                    check_local(i as u8, &b, false)?;
                    used[i] = b;
                }
                if count == 1 {
                    if let Some(offset) = first_nonzero(bytes, DATA_OFFSET + 16, WQE_SIZE) {
                        return Err(WqeError::ReservedNonZero { offset });
                    }
                }
                SendPayload::Sgl {
                    first: used[0],
                    second: if count == 2 { Some(used[1]) } else { None },
                }
            };
            WqeOp::Send {
                payload,
                imm: if has_imm {
                    Some(m.immediate_data)
                } else {
                    None
                },
            }
        }
        OpType::RdmaRead | OpType::RdmaWrite => {
            if inline {
                return Err(WqeError::InlineRdma);
            }
            if m.length != RDMA_SGES {
                return Err(WqeError::BadDescriptorCount {
                    op,
                    count: m.length,
                });
            }
            let req = w.rdma();
            let local = local_from(&req.local);
            let remote = RemoteBuf {
                addr: req.remote.addr(),
                rkey: req.remote.rkey,
                len: req.remote.length,
            };
            let write_imm = op == OpType::RdmaWrite && has_imm;
            check_rdma(&local, &remote, write_imm)?;
            match (op, has_imm) {
                (OpType::RdmaRead, _) => WqeOp::RdmaRead { remote, local },
                (_, true) => WqeOp::RdmaWriteImm {
                    remote,
                    local,
                    imm: m.immediate_data,
                },
                (_, false) => WqeOp::RdmaWrite { remote, local },
            }
        }
    };

    Ok(WqeDesc {
        op: wop,
        req_id: w.request_id(req_id_64),
        req_id_64,
        phase: m.ctrl2 & CTRL2_PHASE,
        comp_req: m.ctrl2 & CTRL2_COMP_REQ != 0,
        dest_qpn: m.dest_qp_num,
        ah: m.ah,
        qkey: m.qkey,
        high_pps: hint == PROCESSING_HINT_HIGH_PPS,
    })
}
