//! EFA send-queue work-queue entry (TX WQE).
//!
//! The device reads 64-byte entries from the send-queue ring. This module holds
//! a `#[repr(C)]` mirror of that layout ([`TxWqe`]), a typed description of one
//! work request ([`WqeDesc`]), a deterministic encoder ([`encode`](fn@encode)) and a strict,
//! panic-free decoder ([`decode`](fn@decode), [`decode_with`]) that rejects anything the
//! device would not accept or that carries non-zero reserved bits.
//!
//! Byte layout (all multi-byte fields little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0-1 | `req_id`: low 16 bits of the request id |
//! | 2 | `ctrl1`: op type (3:0), has_imm (4), inline_msg (5), meta_extension (6, must be 0), meta_desc (7, must be 1) |
//! | 3 | `ctrl2`: phase (0), reserved (1), first (2, must be 1), last (3, must be 1), comp_req (4), reserved (7:5) |
//! | 4-5 | `dest_qp_num` |
//! | 6-7 | `length`: inline byte count, or number of buffer descriptors |
//! | 8-11 | `immediate_data` |
//! | 12-13 | `ah`: address handle number |
//! | 14 | `ctrl3`: processing hints (1:0), reserved (7:2) |
//! | 15 | reserved |
//! | 16-19 | `qkey` |
//! | 20-25 | reserved |
//! | 26-31 | `req_id_ex`: bits 16-63 of the request id when the queue has the 64-bit request-id capability, reserved otherwise |
//! | 32-63 | data: SEND uses two buffer descriptors or 32 inline bytes; RDMA uses a remote descriptor (32-47) and one local buffer descriptor (48-63) |
//!
//! A buffer descriptor is `{u32 length, u32 lkey (23:0, 31:24 reserved), u32 addr_lo, u32 addr_hi}`;
//! a remote descriptor is `{u32 length, u32 rkey, u32 addr_lo, u32 addr_hi}`.
//!
//! The module is split by concern: [`layout`] (the `#[repr(C)]` mirror and its byte
//! conversions), [`desc`] (the typed work request), [`encode`](mod@encode), [`validate`](mod@validate),
//! [`decode`](mod@decode), [`ring`] (ring slots, phase and 64/128-byte entries) and
//! [`error`].

use core::fmt;

pub mod decode;
pub mod desc;
pub mod encode;
pub mod error;
pub mod layout;
pub mod ring;
pub mod validate;
pub mod wide;

pub use decode::{decode, decode_with};
pub use desc::{LocalBuf, RemoteBuf, SendPayload, WqeDesc, WqeOp};
pub use encode::{encode, encode_checked, encode_raw};
pub use error::WqeError;
pub use layout::{
    BufDesc, RdmaReq, RemoteMemDesc, TxMetaDesc, TxWqe, RDMA_LOCAL_OFFSET, RDMA_REMOTE_OFFSET,
};
pub use ring::{decode_entry, phase_for, slot_for, store_entry};
pub use validate::validate;
pub use wide::{
    decode_entry_128, encode_inline, validate_inline, Entry128, InlineDesc, InlineTarget,
    INLINE_MAX_128,
};

/// Size of one TX WQE in bytes.
pub const WQE_SIZE: usize = 64;
/// Size of a send-queue entry on queues with wide entries: efa-direct picks them when the device
/// has 80 bytes of inline room (rdma-core `efa_calc_sq_wqe_size`). Every WQE but a long inline
/// one is laid out in the first 64 bytes, bytes 64-127 zero; inline payloads of up to 80 bytes
/// are in [`wide`].
pub const WQE_SIZE_128: usize = 128;
/// Largest inline SEND payload a 64-byte WQE carries.
pub const INLINE_MAX: usize = 32;
/// Largest number of buffer descriptors a SEND carries.
pub const SEND_MAX_SGES: usize = 2;
/// Number of local buffer descriptors an RDMA read or write carries.
pub const RDMA_SGES: u16 = 1;
/// Bits of a buffer descriptor's lkey word that hold the key (23:0).
pub const LKEY_MASK: u32 = 0x00FF_FFFF;
/// Largest request id a queue without the 64-bit request-id capability carries.
pub const REQ_ID_16_MAX: u64 = 0xFFFF;

/// `ctrl1` bits 3:0: operation type.
pub const CTRL1_OP_TYPE_MASK: u8 = 0x0F;
/// `ctrl1` bit 4: `immediate_data` is valid and is delivered to the remote side.
pub const CTRL1_HAS_IMM: u8 = 1 << 4;
/// `ctrl1` bit 5: the data area holds inline payload instead of buffer descriptors.
pub const CTRL1_INLINE_MSG: u8 = 1 << 5;
/// `ctrl1` bit 6: extended metadata; must be zero.
pub const CTRL1_META_EXTENSION: u8 = 1 << 6;
/// `ctrl1` bit 7: marks a metadata descriptor; must be set.
pub const CTRL1_META_DESC: u8 = 1 << 7;
/// `ctrl2` bit 0: phase, flips each time the producer wraps the ring.
pub const CTRL2_PHASE: u8 = 1 << 0;
/// `ctrl2` bit 2: first descriptor of the transaction; must be set.
pub const CTRL2_FIRST: u8 = 1 << 2;
/// `ctrl2` bit 3: last descriptor of the transaction; must be set.
pub const CTRL2_LAST: u8 = 1 << 3;
/// `ctrl2` bit 4: post a completion once the operation finishes.
pub const CTRL2_COMP_REQ: u8 = 1 << 4;
/// `ctrl2` bits that are reserved (1 and 7:5).
pub const CTRL2_RESERVED_MASK: u8 = 0b1110_0010;
/// `ctrl3` bits 1:0: processing hints.
pub const CTRL3_PROCESSING_HINTS_MASK: u8 = 0x03;
/// Processing hint value 1: optimise for message rate (burst, packets-per-second sensitive).
pub const PROCESSING_HINT_HIGH_PPS: u8 = 1;

/// Byte offset of the data area (buffer descriptors, inline payload or RDMA request).
pub const DATA_OFFSET: usize = 32;

raw_u8_enum! {
    /// Operation type carried in `ctrl1` bits 3:0 (and in CQE flags bits 6:4).
    pub enum OpType {
        /// Two-sided send; consumes a receive buffer at the target.
        Send = 0,
        /// One-sided RDMA read from remote memory into a local buffer.
        RdmaRead = 1,
        /// One-sided RDMA write from a local buffer into remote memory.
        RdmaWrite = 2,
    }
}

impl fmt::Display for OpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpType::Send => "SEND",
            OpType::RdmaRead => "RDMA_READ",
            OpType::RdmaWrite => "RDMA_WRITE",
        })
    }
}

#[cfg(test)]
mod tests;
