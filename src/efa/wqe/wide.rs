//! 128-byte ("wide") send-queue entries and their inline payload of up to 80 bytes.
//!
//! Sources (bit positions checked there):
//! - rdma-core `providers/efa/efa_io_defs.h` at commit 2166b90e284df10dfccea840765b863f905a28c2
//!   ("efa: Add support for 128-byte WQE"): `EFA_IO_TX_DESC_INLINE_MAX_SIZE_128 80`,
//!   `struct efa_io_tx_wqe_128` = the 32-byte meta descriptor, then a union of `sgl[2]`,
//!   `inline_data[80]` (bytes 32-111) and `struct efa_io_rdma_req_128` = the 16-byte remote
//!   descriptor (bytes 32-47) then a union of `local_mem[1]` and `inline_data[80]` (bytes 48-127).
//! - libfabric `prov/efa/src/efa_io_defs.h` at commit fd5b9ef5fbd9c66617476f28ce8cda20bae5cc4d
//!   (the same structs, "matching rdma-core commit 2166b90e284d").
//! - How the producers fill them, libfabric main at af8ddbe92f033b7deb9c4e4f47197d1fd4bcf150
//!   (2.7.0a1): `efa_data_path_direct_set_inline_data` (SEND: inline bit, `meta.length` = byte
//!   count, payload from byte 32) and `efa_data_path_direct_post_write` (RDMA write: inline bit,
//!   `meta.length` = `remote_mem.length` = byte count, payload from byte 48; a zero-byte write
//!   never goes inline). Both build a zeroed `efa_io_tx_wqe_128` and copy `wqe_size` bytes.
//! - When a queue has wide entries: rdma-core `efa_calc_sq_wqe_size` (verbs.c) picks 128 bytes
//!   when `max_inline_data > 32` or the QP has `EFADV_QP_FLAGS_INLINE_WRITE`; libfabric
//!   (`efa_base_ep.c`, commit a12b68a269b50755caa534de31ea8cf11c28cc9b and later) sets that flag
//!   exactly when the endpoint's inject size exceeds the device's `inline_buf_size` and the device
//!   has RDMA write. An RDMA write may go inline only on such a QP: see
//!   [`crate::efa::sq::SqFormat::rdma_inline`].
//!
//! Every other WQE is laid out in a wide entry as in a 64-byte one, with bytes 64-127 zero
//! ([`super::store_entry`], [`super::decode_entry`]).

use super::{
    decode_entry, decode_with, encode, OpType, SendPayload, WqeDesc, WqeError, WqeOp,
    CTRL1_INLINE_MSG, CTRL1_OP_TYPE_MASK, DATA_OFFSET, INLINE_MAX, REQ_ID_16_MAX, WQE_SIZE,
    WQE_SIZE_128,
};
use crate::efa::le::{first_nonzero, get_u16, get_u32, put_u16, put_u32};

/// Largest inline payload of a wide entry (`EFA_IO_TX_DESC_INLINE_MAX_SIZE_128`).
pub const INLINE_MAX_128: usize = 80;
/// Byte offset of an inline SEND's payload (`efa_io_tx_wqe_128.data.inline_data`).
pub const SEND_INLINE_OFFSET: usize = DATA_OFFSET;
/// Byte offset of an inline RDMA write's payload (`data.rdma_req.inline_data`, after the remote
/// descriptor).
pub const RDMA_INLINE_OFFSET: usize = DATA_OFFSET + 16;
/// Byte offset of the meta descriptor's `length` field.
const LENGTH_OFFSET: usize = 6;
/// Byte offset of `ctrl1`.
const CTRL1_OFFSET: usize = 2;

/// Where an inline payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InlineTarget {
    /// A two-sided SEND carrying the payload (bytes 32-111).
    Send,
    /// An RDMA write of the payload (bytes 48-127) to `addr` under `rkey`.
    RdmaWrite {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
}

/// A WQE of a wide entry whose payload travels inline, longer than a 64-byte WQE carries (or an
/// RDMA write, which a 64-byte WQE never carries inline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InlineDesc {
    /// SEND or RDMA write.
    pub target: InlineTarget,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Payload bytes used (at most [`INLINE_MAX_128`]; at least 1 for an RDMA write).
    pub len: u8,
    /// Payload; bytes at and after `len` must be zero.
    pub data: [u8; INLINE_MAX_128],
    /// Request id (16 bits without `req_id_64`).
    pub req_id: u64,
    /// The queue has the 64-bit request-id capability.
    pub req_id_64: bool,
    /// Phase bit.
    pub phase: u8,
    /// Ask for a completion.
    pub comp_req: bool,
    /// Destination QP number.
    pub dest_qpn: u16,
    /// Destination address handle.
    pub ah: u16,
    /// Destination queue key.
    pub qkey: u32,
    /// The "high packets-per-second" processing hint.
    pub high_pps: bool,
}

impl InlineDesc {
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.data[..usize::from(self.len).min(INLINE_MAX_128)]
    }

    /// A header-only 64-byte description with the same meta fields (an empty inline SEND), whose
    /// encoding and decoding share every header rule with the narrow format.
    fn header(&self) -> WqeDesc {
        WqeDesc {
            op: WqeOp::Send {
                payload: SendPayload::Inline {
                    len: 0,
                    data: [0; INLINE_MAX],
                },
                imm: self.imm,
            },
            req_id: self.req_id,
            req_id_64: self.req_id_64,
            phase: self.phase,
            comp_req: self.comp_req,
            dest_qpn: self.dest_qpn,
            ah: self.ah,
            qkey: self.qkey,
            high_pps: self.high_pps,
        }
    }
}

/// What a wide entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry128 {
    /// A WQE in the 64-byte layout, bytes 64-127 zero.
    Narrow(WqeDesc),
    /// An inline payload of the wide layout.
    Inline(InlineDesc),
}

/// Checks `d` as [`decode_entry_128`] would check its bytes (same errors for the same faults).
pub fn validate_inline(d: &InlineDesc) -> Result<(), WqeError> {
    if d.phase > 1 {
        return Err(WqeError::PhaseOutOfRange(d.phase));
    }
    if !d.req_id_64 && d.req_id > REQ_ID_16_MAX {
        return Err(WqeError::ReqIdTooWide(d.req_id));
    }
    let n = usize::from(d.len);
    if n > INLINE_MAX_128 {
        return Err(WqeError::InlineTooLong {
            len: u16::from(d.len),
        });
    }
    let at = match d.target {
        InlineTarget::Send => SEND_INLINE_OFFSET,
        InlineTarget::RdmaWrite { .. } => {
            if n == 0 {
                return Err(WqeError::ZeroLength { index: 0 });
            }
            RDMA_INLINE_OFFSET
        }
    };
    if let Some(i) = d.data[n..].iter().position(|&x| x != 0) {
        // at + INLINE_MAX_128 <= WQE_SIZE_128: the offset lies inside the entry.
        return Err(WqeError::ReservedNonZero {
            offset: (at + n + i) as u8,
        });
    }
    Ok(())
}

/// Encodes `d` as the 128 bytes of a wide entry (little-endian, every unused byte zero), after
/// [`validate_inline`]. For every accepted description,
/// `decode_entry_128(&encode_inline(d)?, d.req_id_64) == Ok(Entry128::Inline(*d))` unless the
/// payload also fits a 64-byte SEND (then the same bytes decode as [`Entry128::Narrow`]).
pub fn encode_inline(d: &InlineDesc) -> Result<[u8; WQE_SIZE_128], WqeError> {
    validate_inline(d)?;
    let mut b = [0u8; WQE_SIZE_128];
    // The meta descriptor of an empty inline SEND: inline bit, has_imm, phase, first, last,
    // comp_req, request id, address, hint.
    b[..DATA_OFFSET].copy_from_slice(&encode(&d.header())[..DATA_OFFSET]);
    let payload = d.payload();
    put_u16(&mut b, LENGTH_OFFSET, payload.len() as u16);
    match d.target {
        InlineTarget::Send => {
            b[SEND_INLINE_OFFSET..SEND_INLINE_OFFSET + payload.len()].copy_from_slice(payload);
        }
        InlineTarget::RdmaWrite { addr, rkey } => {
            b[CTRL1_OFFSET] = (b[CTRL1_OFFSET] & !CTRL1_OP_TYPE_MASK) | OpType::RdmaWrite.raw();
            // efa_io_remote_mem_addr: length, rkey, addr_lo, addr_hi.
            put_u32(&mut b, DATA_OFFSET, payload.len() as u32);
            put_u32(&mut b, DATA_OFFSET + 4, rkey);
            put_u32(&mut b, DATA_OFFSET + 8, addr as u32);
            put_u32(&mut b, DATA_OFFSET + 12, (addr >> 32) as u32);
            b[RDMA_INLINE_OFFSET..RDMA_INLINE_OFFSET + payload.len()].copy_from_slice(payload);
        }
    }
    Ok(b)
}

/// Decodes and validates a wide entry. A WQE in the 64-byte layout with bytes 64-127 zero is
/// [`Entry128::Narrow`] (as [`decode_entry`]); an inline SEND longer than [`INLINE_MAX`] bytes
/// or an inline RDMA write is [`Entry128::Inline`]. Every header rule is the narrow format's, in
/// the same order; then the payload: at most [`INLINE_MAX_128`] bytes, zero past it, an RDMA
/// write's remote length equal to it and non-zero. An inline RDMA read stays
/// [`WqeError::InlineRdma`].
pub fn decode_entry_128(entry: &[u8; WQE_SIZE_128], req_id_64: bool) -> Result<Entry128, WqeError> {
    let narrow_err = match decode_entry(entry, req_id_64) {
        Ok(d) => return Ok(Entry128::Narrow(d)),
        Err(e) => e,
    };
    let ctrl1 = entry[CTRL1_OFFSET];
    let op = OpType::from_raw(ctrl1 & CTRL1_OP_TYPE_MASK);
    let wide = ctrl1 & CTRL1_INLINE_MSG != 0
        && matches!(
            (op, narrow_err),
            (Some(OpType::RdmaWrite), WqeError::InlineRdma)
                | (Some(OpType::Send), WqeError::InlineTooLong { .. })
        );
    if !wide {
        return Err(narrow_err);
    }
    // The header, checked by the narrow decoder: the meta descriptor as an empty inline SEND.
    let mut head = [0u8; WQE_SIZE];
    head[..DATA_OFFSET].copy_from_slice(&entry[..DATA_OFFSET]);
    head[CTRL1_OFFSET] &= !CTRL1_OP_TYPE_MASK;
    put_u16(&mut head, LENGTH_OFFSET, 0);
    let h = decode_with(&head, req_id_64)?;
    let len = get_u16(entry, LENGTH_OFFSET);
    let n = usize::from(len);
    if n > INLINE_MAX_128 {
        return Err(WqeError::InlineTooLong { len });
    }
    let (target, at) = match op {
        Some(OpType::RdmaWrite) => {
            let remote_len = get_u32(entry, DATA_OFFSET);
            if remote_len != u32::from(len) {
                return Err(WqeError::LengthMismatch {
                    local: u32::from(len),
                    remote: remote_len,
                });
            }
            if n == 0 {
                return Err(WqeError::ZeroLength { index: 0 });
            }
            let addr = u64::from(get_u32(entry, DATA_OFFSET + 8))
                | (u64::from(get_u32(entry, DATA_OFFSET + 12)) << 32);
            let rkey = get_u32(entry, DATA_OFFSET + 4);
            (InlineTarget::RdmaWrite { addr, rkey }, RDMA_INLINE_OFFSET)
        }
        _ => (InlineTarget::Send, SEND_INLINE_OFFSET),
    };
    if let Some(offset) = first_nonzero(entry, at + n, WQE_SIZE_128) {
        return Err(WqeError::ReservedNonZero { offset });
    }
    let mut data = [0u8; INLINE_MAX_128];
    data[..n].copy_from_slice(&entry[at..at + n]);
    let imm = match h.op {
        WqeOp::Send { imm, .. } => imm,
        _ => None,
    };
    Ok(Entry128::Inline(InlineDesc {
        target,
        imm,
        len: n as u8,
        data,
        req_id: h.req_id,
        req_id_64: h.req_id_64,
        phase: h.phase,
        comp_req: h.comp_req,
        dest_qpn: h.dest_qpn,
        ah: h.ah,
        qkey: h.qkey,
        high_pps: h.high_pps,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(target: InlineTarget, payload: &[u8]) -> InlineDesc {
        let mut data = [0u8; INLINE_MAX_128];
        data[..payload.len()].copy_from_slice(payload);
        InlineDesc {
            target,
            imm: None,
            len: payload.len() as u8,
            data,
            req_id: 0x1234,
            req_id_64: false,
            phase: 1,
            comp_req: true,
            dest_qpn: 0x42,
            ah: 7,
            qkey: 0x1122_3344,
            high_pps: false,
        }
    }

    const WRITE: InlineTarget = InlineTarget::RdmaWrite {
        addr: 0x7f00_1234_0000,
        rkey: 0xa1b2_c3d4,
    };

    #[test]
    fn eighty_bytes_round_trip_for_send_and_write() {
        let p: Vec<u8> = (1..=80).collect();
        for t in [InlineTarget::Send, WRITE] {
            let d = desc(t, &p);
            let b = encode_inline(&d).unwrap();
            assert_eq!(decode_entry_128(&b, false), Ok(Entry128::Inline(d)));
        }
    }

    #[test]
    fn a_short_inline_send_is_the_narrow_format() {
        let d = desc(InlineTarget::Send, &[9; 32]);
        let b = encode_inline(&d).unwrap();
        assert!(matches!(
            decode_entry_128(&b, false),
            Ok(Entry128::Narrow(_))
        ));
        let d = desc(InlineTarget::Send, &[9; 33]);
        let b = encode_inline(&d).unwrap();
        assert_eq!(decode_entry_128(&b, false), Ok(Entry128::Inline(d)));
    }

    #[test]
    fn descriptions_the_device_would_not_take_are_refused() {
        assert_eq!(
            encode_inline(&desc(WRITE, &[])),
            Err(WqeError::ZeroLength { index: 0 })
        );
        let mut d = desc(InlineTarget::Send, &[1; 80]);
        d.len = 81;
        assert_eq!(encode_inline(&d), Err(WqeError::InlineTooLong { len: 81 }));
        let mut d = desc(WRITE, &[1; 4]);
        d.data[10] = 1;
        assert_eq!(
            encode_inline(&d),
            Err(WqeError::ReservedNonZero { offset: 58 })
        );
        let mut d = desc(WRITE, &[1; 4]);
        d.req_id = 0x1_0000;
        assert_eq!(encode_inline(&d), Err(WqeError::ReqIdTooWide(0x1_0000)));
    }
}
