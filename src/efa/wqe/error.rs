//! Why a WQE, as bytes or as a description, is refused.

use core::fmt;

use super::{OpType, INLINE_MAX, WQE_SIZE, WQE_SIZE_128};

/// Why a WQE (bytes or description) is not acceptable.
///
/// [`decode_with`](super::decode_with) reports the first failing check in the order the variants are listed
/// (reserved-byte checks in ascending byte offset within their step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WqeError {
    /// `ctrl1` bit 7 (meta_desc) is clear; every WQE must set it.
    MissingMetaDesc,
    /// `ctrl1` bit 6 (meta_extension) is set; it must be zero.
    MetaExtension,
    /// `ctrl1` bits 3:0 hold a value other than SEND (0), RDMA_READ (1) or RDMA_WRITE (2).
    UnknownOpType(u8),
    /// `ctrl2` bit 2 (first) is clear; single-descriptor WQEs must set it.
    NotFirst,
    /// `ctrl2` bit 3 (last) is clear; single-descriptor WQEs must set it.
    NotLast,
    /// A reserved bit or byte is non-zero; `offset` is the byte offset within the WQE.
    /// Covers `ctrl2` bits 1 and 7:5, `ctrl3` bits 7:2, bytes 15 and 20-25, bytes 26-31
    /// without the 64-bit request-id capability, unused SEND descriptor slots and
    /// inline bytes past the inline length.
    ReservedNonZero {
        /// Byte offset of the first offending byte.
        offset: u8,
    },
    /// `ctrl3` bits 1:0 hold a processing hint other than 0 or 1.
    UnknownProcessingHint(u8),
    /// has_imm is set on an RDMA read; only SEND and RDMA write carry immediate data.
    ImmediateWithRead,
    /// `immediate_data` is non-zero while has_imm is clear.
    StrayImmediate,
    /// inline_msg is set on an RDMA operation; a 64-byte WQE has no inline room for RDMA.
    InlineRdma,
    /// Inline length exceeds [`INLINE_MAX`].
    InlineTooLong {
        /// The length field.
        len: u16,
    },
    /// Descriptor count is out of range: SEND needs 1 or 2, RDMA exactly 1.
    BadDescriptorCount {
        /// The operation.
        op: OpType,
        /// The length field (descriptor count).
        count: u16,
    },
    /// An lkey uses bits 31:24.
    LkeyTooWide {
        /// Index of the buffer descriptor (0 for RDMA).
        index: u8,
        /// The offending lkey word.
        lkey: u32,
    },
    /// A buffer descriptor has length zero: not allowed for SEND descriptors, RDMA read,
    /// or RDMA write without immediate data.
    ZeroLength {
        /// Index of the buffer descriptor (0 for RDMA).
        index: u8,
    },
    /// RDMA local and remote lengths differ.
    LengthMismatch {
        /// Local descriptor length.
        local: u32,
        /// Remote descriptor length.
        remote: u32,
    },
    /// Description only: `phase` is not 0 or 1.
    PhaseOutOfRange(u8),
    /// Description only: `req_id` exceeds 16 bits but `req_id_64` is false.
    ReqIdTooWide(u64),
    /// A ring entry is neither [`WQE_SIZE`] nor [`WQE_SIZE_128`] bytes long.
    BadEntrySize(usize),
}

impl fmt::Display for WqeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WqeError::MissingMetaDesc => write!(f, "meta_desc bit (ctrl1 bit 7) is clear"),
            WqeError::MetaExtension => write!(f, "meta_extension bit (ctrl1 bit 6) is set"),
            WqeError::UnknownOpType(v) => write!(f, "unknown op type {v}"),
            WqeError::NotFirst => write!(f, "first bit (ctrl2 bit 2) is clear"),
            WqeError::NotLast => write!(f, "last bit (ctrl2 bit 3) is clear"),
            WqeError::ReservedNonZero { offset } => {
                write!(f, "reserved bits set in byte {offset}")
            }
            WqeError::UnknownProcessingHint(v) => write!(f, "unknown processing hint {v}"),
            WqeError::ImmediateWithRead => write!(f, "immediate data on an RDMA read"),
            WqeError::StrayImmediate => write!(f, "immediate data present but has_imm is clear"),
            WqeError::InlineRdma => write!(f, "inline payload on an RDMA operation"),
            WqeError::InlineTooLong { len } => {
                write!(f, "inline length {len} exceeds {INLINE_MAX}")
            }
            WqeError::BadDescriptorCount { op, count } => {
                write!(f, "{op} with {count} buffer descriptors")
            }
            WqeError::LkeyTooWide { index, lkey } => {
                write!(f, "lkey {lkey:#x} of descriptor {index} exceeds 24 bits")
            }
            WqeError::ZeroLength { index } => write!(f, "descriptor {index} has length zero"),
            WqeError::LengthMismatch { local, remote } => {
                write!(
                    f,
                    "local length {local} differs from remote length {remote}"
                )
            }
            WqeError::PhaseOutOfRange(p) => write!(f, "phase {p} is not 0 or 1"),
            WqeError::ReqIdTooWide(id) => {
                write!(
                    f,
                    "request id {id:#x} needs the 64-bit request-id capability"
                )
            }
            WqeError::BadEntrySize(n) => {
                write!(
                    f,
                    "a send-queue entry of {n} bytes (entries are {WQE_SIZE} or {WQE_SIZE_128})"
                )
            }
        }
    }
}

impl std::error::Error for WqeError {}
