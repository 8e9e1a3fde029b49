//! The typed description of one TX work request: its operation, operands and header fields.

use super::{OpType, INLINE_MAX};

/// A local buffer: address, local key (24 bits) and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LocalBuf {
    /// Virtual (or device) address of the buffer.
    pub addr: u64,
    /// Local memory key; only bits 23:0 are valid.
    pub lkey: u32,
    /// Length in bytes.
    pub len: u32,
}

/// A remote buffer: address, remote key and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Remote address.
    pub addr: u64,
    /// Remote memory key.
    pub rkey: u32,
    /// Length in bytes; must equal the local buffer's length.
    pub len: u32,
}

/// Payload of a SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendPayload {
    /// One or two buffer descriptors.
    Sgl {
        /// First buffer.
        first: LocalBuf,
        /// Optional second buffer.
        second: Option<LocalBuf>,
    },
    /// Payload copied into the WQE.
    Inline {
        /// Number of valid bytes in `data` (at most [`INLINE_MAX`]).
        len: u8,
        /// Payload; bytes at and after `len` must be zero.
        data: [u8; INLINE_MAX],
    },
}

impl SendPayload {
    /// Builds an inline payload; `None` when `bytes` is longer than [`INLINE_MAX`].
    pub fn inline(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > INLINE_MAX {
            return None;
        }
        let mut data = [0u8; INLINE_MAX];
        data[..bytes.len()].copy_from_slice(bytes);
        Some(SendPayload::Inline {
            len: bytes.len() as u8,
            data,
        })
    }

    /// The inline bytes, or `None` for a buffer-descriptor payload.
    pub fn inline_bytes(&self) -> Option<&[u8]> {
        match self {
            SendPayload::Inline { len, data } => Some(&data[..usize::from(*len).min(INLINE_MAX)]),
            SendPayload::Sgl { .. } => None,
        }
    }
}

/// The operation of a work request with its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WqeOp {
    /// Two-sided send, optionally with 4 bytes of immediate data.
    Send {
        /// Buffers or inline bytes.
        payload: SendPayload,
        /// Immediate data delivered in the receiver's completion.
        imm: Option<u32>,
    },
    /// RDMA write of `local` into `remote`.
    RdmaWrite {
        /// Destination.
        remote: RemoteBuf,
        /// Source.
        local: LocalBuf,
    },
    /// RDMA write with immediate data, which raises a completion at the target.
    RdmaWriteImm {
        /// Destination.
        remote: RemoteBuf,
        /// Source.
        local: LocalBuf,
        /// Immediate data delivered in the target's completion.
        imm: u32,
    },
    /// RDMA read of `remote` into `local`.
    RdmaRead {
        /// Source.
        remote: RemoteBuf,
        /// Destination.
        local: LocalBuf,
    },
}

impl WqeOp {
    /// The device op type of this operation.
    pub fn op_type(&self) -> OpType {
        match self {
            WqeOp::Send { .. } => OpType::Send,
            WqeOp::RdmaWrite { .. } | WqeOp::RdmaWriteImm { .. } => OpType::RdmaWrite,
            WqeOp::RdmaRead { .. } => OpType::RdmaRead,
        }
    }

    /// The immediate data, if the operation carries any.
    pub fn imm(&self) -> Option<u32> {
        match self {
            WqeOp::Send { imm, .. } => *imm,
            WqeOp::RdmaWriteImm { imm, .. } => Some(*imm),
            WqeOp::RdmaWrite { .. } | WqeOp::RdmaRead { .. } => None,
        }
    }
}

/// A typed description of one TX work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WqeDesc {
    /// Operation and operands.
    pub op: WqeOp,
    /// Request id echoed in the completion. Without `req_id_64` only 16 bits fit.
    pub req_id: u64,
    /// The queue has the 64-bit request-id capability: bits 16-63 go to `req_id_ex`.
    pub req_id_64: bool,
    /// Phase bit (0 or 1); see [`phase_for`](super::phase_for).
    pub phase: u8,
    /// Ask for a completion entry.
    pub comp_req: bool,
    /// Destination queue-pair number.
    pub dest_qpn: u16,
    /// Destination address handle number.
    pub ah: u16,
    /// Destination queue key.
    pub qkey: u32,
    /// Set the "high packets-per-second" processing hint.
    pub high_pps: bool,
}
