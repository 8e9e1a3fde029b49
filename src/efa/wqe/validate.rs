//! The rules a description must meet, shared by [`validate`] and the decoder so that both report
//! the same error for the same fault.

use super::{
    LocalBuf, RemoteBuf, SendPayload, WqeDesc, WqeError, WqeOp, DATA_OFFSET, INLINE_MAX, LKEY_MASK,
    REQ_ID_16_MAX,
};

/// The checks of one local buffer descriptor (`index` names it in the error).
pub(super) fn check_local(index: u8, b: &LocalBuf, allow_zero: bool) -> Result<(), WqeError> {
    if b.lkey & !LKEY_MASK != 0 {
        return Err(WqeError::LkeyTooWide {
            index,
            lkey: b.lkey,
        });
    }
    if b.len == 0 && !allow_zero {
        return Err(WqeError::ZeroLength { index });
    }
    Ok(())
}

/// The checks of the local and remote descriptors of an RDMA read or write.
pub(super) fn check_rdma(
    local: &LocalBuf,
    remote: &RemoteBuf,
    allow_zero: bool,
) -> Result<(), WqeError> {
    if local.lkey & !LKEY_MASK != 0 {
        return Err(WqeError::LkeyTooWide {
            index: 0,
            lkey: local.lkey,
        });
    }
    if local.len != remote.len {
        return Err(WqeError::LengthMismatch {
            local: local.len,
            remote: remote.len,
        });
    }
    if local.len == 0 && !allow_zero {
        return Err(WqeError::ZeroLength { index: 0 });
    }
    Ok(())
}

/// Checks that `desc` describes a WQE [`decode_with`](super::decode_with) accepts, reporting the same error
/// the decoder would report for the corresponding bytes.
///
/// Rules: `phase` is 0 or 1; `req_id` fits 16 bits unless `req_id_64`; lkeys fit 24 bits;
/// SEND descriptors have non-zero length; inline payloads are at most [`INLINE_MAX`] bytes
/// with zero bytes past their length; RDMA local and remote lengths are equal and
/// non-zero, except that an RDMA write with immediate may move zero bytes.
pub fn validate(desc: &WqeDesc) -> Result<(), WqeError> {
    if desc.phase > 1 {
        return Err(WqeError::PhaseOutOfRange(desc.phase));
    }
    if !desc.req_id_64 && desc.req_id > REQ_ID_16_MAX {
        return Err(WqeError::ReqIdTooWide(desc.req_id));
    }
    match &desc.op {
        WqeOp::Send { payload, .. } => match payload {
            SendPayload::Sgl { first, second } => {
                check_local(0, first, false)?;
                if let Some(s) = second {
                    check_local(1, s, false)?;
                }
            }
            SendPayload::Inline { len, data } => {
                let n = usize::from(*len);
                if n > INLINE_MAX {
                    return Err(WqeError::InlineTooLong {
                        len: u16::from(*len),
                    });
                }
                if let Some(i) = data[n..].iter().position(|&x| x != 0) {
                    return Err(WqeError::ReservedNonZero {
                        offset: (DATA_OFFSET + n + i) as u8,
                    });
                }
            }
        },
        WqeOp::RdmaWrite { remote, local } | WqeOp::RdmaRead { remote, local } => {
            check_rdma(local, remote, false)?;
        }
        WqeOp::RdmaWriteImm { remote, local, .. } => {
            check_rdma(local, remote, true)?;
        }
    }
    Ok(())
}
