//! EFA completion-queue entries (CQEs).
//!
//! A CQ holds entries of `entry_size` bytes (16, or 32 with the extended receive form).
//! Every entry starts with a 6-byte common descriptor:
//!
//! | bytes | field |
//! |---|---|
//! | 0-1 | `req_id`: request id of the completed WQE (low 16 bits) |
//! | 2 | `status`: [`CqStatus`] |
//! | 3 | `flags`: phase (0), queue type (2:1, SQ 1 / RQ 2), has_imm (3, RX only), op type (6:4), unsolicited (7, RX only) |
//! | 4-5 | `qp_num`: local queue-pair number |
//!
//! A send-queue completion ([`TxCdesc`], 16 bytes) continues with `req_id_ex` (6-11: bits
//! 16-63 of the request id when the send queue has the 64-bit request-id capability,
//! reserved otherwise) and 4 reserved bytes (12-15).
//!
//! A receive completion ([`RxCdesc`], 16 bytes) continues with `length` (6-7, bits 15:0 of
//! the byte count), `ah` (8-9, 0xFFFF when the sender's address handle is unknown),
//! `src_qp_num` (10-11) and `imm` (12-15). The extended form ([`RxCdescEx`], 32 bytes) adds
//! 16 bytes: `length_hi` (16-17, bits 31:16 of the byte count) for an RDMA write with
//! immediate, or the sender's 16-byte address (16-31) when `ah` is 0xFFFF and the CQ was
//! created to report it.
//!
//! Polling: the expected phase starts at 1 and flips on every wrap of the consumer index
//! ([`cq_expected_phase`]). Read the flags byte first, fence, then the rest of the entry.

use core::fmt;
use core::mem::{align_of, offset_of, size_of};

use super::le::{
    array_at, first_nonzero, get_u16, get_u32, put_u16, put_u32, req_id_ex_words, req_id_from_words,
};
use super::wqe::OpType;

/// Size of a send-queue completion entry.
pub const TX_CQE_SIZE: usize = 16;
/// Size of the base receive completion entry.
pub const RX_CQE_SIZE: usize = 16;
/// Size of the extended receive completion entry.
pub const RX_CQE_EX_SIZE: usize = 32;
/// `ah` value meaning the sender's address handle is unknown to the receiver.
pub const AH_UNKNOWN: u16 = 0xFFFF;

/// flags bit 0: phase.
pub const FLAG_PHASE: u8 = 1 << 0;
/// flags bits 2:1: queue type.
pub const FLAG_Q_TYPE_MASK: u8 = 0b0000_0110;
/// Shift of the queue-type field.
pub const FLAG_Q_TYPE_SHIFT: u32 = 1;
/// flags bit 3: immediate data present (receive completions only).
pub const FLAG_HAS_IMM: u8 = 1 << 3;
/// flags bits 6:4: op type.
pub const FLAG_OP_TYPE_MASK: u8 = 0b0111_0000;
/// Shift of the op-type field.
pub const FLAG_OP_TYPE_SHIFT: u32 = 4;
/// flags bit 7: no matching receive request (RDMA write with immediate, receive only).
pub const FLAG_UNSOLICITED: u8 = 1 << 7;

raw_u8_enum! {
    /// Which queue of the QP a completion belongs to (flags bits 2:1); 0 and 3 are not defined.
    pub enum QueueType {
        /// Send queue.
        Send = 1,
        /// Receive queue.
        Recv = 2,
    }
}

raw_u8_enum! {
    /// Completion status (byte 2), as the device reports it; 16, 17 and 19-255 are not defined.
    pub enum CqStatus {
        /// 0: success.
        Ok = 0,
        /// 1: flushed while the QP was destroyed.
        Flushed = 1,
        /// 2: local QP internal error.
        LocalQpInternalError = 2,
        /// 3: unsupported operation type.
        LocalUnsupportedOp = 3,
        /// 4: invalid address handle (local).
        LocalInvalidAh = 4,
        /// 5: local memory registration invalid, lacking access rights or not matching the address.
        LocalInvalidLkey = 5,
        /// 6: message too long.
        LocalBadLength = 6,
        /// 7: remote memory registration invalid, lacking access rights or not matching the address.
        RemoteBadAddress = 7,
        /// 8: connection reset by the remote peer.
        RemoteAbort = 8,
        /// 9: bad destination QP number (missing or in error state).
        RemoteBadDestQpn = 9,
        /// 10: receiver not ready (no receive buffer posted).
        RemoteRnr = 10,
        /// 11: remote scatter list too short.
        RemoteBadLength = 11,
        /// 12: unexpected status returned by the responder.
        RemoteBadStatus = 12,
        /// 13: remote stopped responding after having responded before (a local error code).
        LocalUnresponsiveRemote = 13,
        /// 14: the remote side has no address handle for us (required for RDMA).
        RemoteUnknownPeer = 14,
        /// 15: remote never responded (a local error code).
        LocalUnreachableRemote = 15,
        /// 18: remote feature mismatch.
        RemoteFeatureMismatch = 18,
    }
}

impl CqStatus {
    /// True for [`CqStatus::Ok`].
    pub const fn is_ok(self) -> bool {
        matches!(self, CqStatus::Ok)
    }

    /// Short description of the status.
    pub const fn description(self) -> &'static str {
        match self {
            CqStatus::Ok => "success",
            CqStatus::Flushed => "flushed during queue-pair destroy",
            CqStatus::LocalQpInternalError => "local queue-pair internal error",
            CqStatus::LocalUnsupportedOp => "unsupported operation type",
            CqStatus::LocalInvalidAh => "invalid address handle (local)",
            CqStatus::LocalInvalidLkey => "local memory registration invalid",
            CqStatus::LocalBadLength => "message too long",
            CqStatus::RemoteBadAddress => "remote memory registration invalid",
            CqStatus::RemoteAbort => "connection reset by remote peer",
            CqStatus::RemoteBadDestQpn => "bad destination queue-pair number",
            CqStatus::RemoteRnr => "receiver not ready",
            CqStatus::RemoteBadLength => "remote scatter list too short",
            CqStatus::RemoteBadStatus => "unexpected status from responder",
            CqStatus::LocalUnresponsiveRemote => "remote became unresponsive",
            CqStatus::RemoteUnknownPeer => "remote has no address handle for the sender",
            CqStatus::LocalUnreachableRemote => "remote unreachable",
            CqStatus::RemoteFeatureMismatch => "remote feature mismatch",
        }
    }
}

impl fmt::Display for CqStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.description(), self.raw())
    }
}

/// Common 6-byte head of every completion entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CdescCommon {
    /// Request id (low 16 bits).
    pub req_id: u16,
    /// Completion status.
    pub status: u8,
    /// Phase, queue type, has_imm, op type, unsolicited.
    pub flags: u8,
    /// Local queue-pair number.
    pub qp_num: u16,
}

/// Send-queue completion entry (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxCdesc {
    /// Common head.
    pub common: CdescCommon,
    /// Bits 16-31, 32-47, 48-63 of a 64-bit request id.
    pub req_id_ex: [u16; 3],
    /// Reserved, zero.
    pub reserved: [u8; 4],
}

/// Receive completion entry, base form (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxCdesc {
    /// Common head.
    pub common: CdescCommon,
    /// Bits 15:0 of the received byte count.
    pub length: u16,
    /// Sender's address handle number, [`AH_UNKNOWN`] if unknown.
    pub ah: u16,
    /// Sender's queue-pair number.
    pub src_qp_num: u16,
    /// Immediate data, valid when has_imm is set.
    pub imm: u32,
}

/// Receive completion entry, extended form (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxCdescEx {
    /// Base form.
    pub base: RxCdesc,
    /// `length_hi` (bytes 0-1, little-endian) for RDMA write with immediate, or the
    /// sender's 16-byte address when `ah` is [`AH_UNKNOWN`].
    pub tail: [u8; 16],
}

const _: () = assert!(size_of::<CdescCommon>() == 6);
const _: () = assert!(offset_of!(CdescCommon, req_id) == 0);
const _: () = assert!(offset_of!(CdescCommon, status) == 2);
const _: () = assert!(offset_of!(CdescCommon, flags) == 3);
const _: () = assert!(offset_of!(CdescCommon, qp_num) == 4);
const _: () = assert!(size_of::<TxCdesc>() == TX_CQE_SIZE);
const _: () = assert!(offset_of!(TxCdesc, req_id_ex) == 6);
const _: () = assert!(offset_of!(TxCdesc, reserved) == 12);
const _: () = assert!(size_of::<RxCdesc>() == RX_CQE_SIZE);
const _: () = assert!(align_of::<RxCdesc>() == 4);
const _: () = assert!(offset_of!(RxCdesc, length) == 6);
const _: () = assert!(offset_of!(RxCdesc, ah) == 8);
const _: () = assert!(offset_of!(RxCdesc, src_qp_num) == 10);
const _: () = assert!(offset_of!(RxCdesc, imm) == 12);
const _: () = assert!(size_of::<RxCdescEx>() == RX_CQE_EX_SIZE);
const _: () = assert!(offset_of!(RxCdescEx, tail) == 16);

impl CdescCommon {
    /// Reads the common head from the first 6 bytes of an entry.
    pub fn from_bytes(b: &[u8; 6]) -> Self {
        CdescCommon {
            req_id: get_u16(b, 0),
            status: b[2],
            flags: b[3],
            qp_num: get_u16(b, 4),
        }
    }

    /// Writes the common head as 6 bytes.
    pub fn to_bytes(&self) -> [u8; 6] {
        let mut b = [0u8; 6];
        put_u16(&mut b, 0, self.req_id);
        b[2] = self.status;
        b[3] = self.flags;
        put_u16(&mut b, 4, self.qp_num);
        b
    }
}

impl TxCdesc {
    /// Reads a send completion from 16 bytes (no validation).
    pub fn from_bytes(b: &[u8; TX_CQE_SIZE]) -> Self {
        TxCdesc {
            common: CdescCommon::from_bytes(&array_at(b, 0)),
            req_id_ex: [get_u16(b, 6), get_u16(b, 8), get_u16(b, 10)],
            reserved: array_at(b, 12),
        }
    }

    /// Writes the send completion as 16 bytes.
    pub fn to_bytes(&self) -> [u8; TX_CQE_SIZE] {
        let mut b = [0u8; TX_CQE_SIZE];
        b[..6].copy_from_slice(&self.common.to_bytes());
        put_u16(&mut b, 6, self.req_id_ex[0]);
        put_u16(&mut b, 8, self.req_id_ex[1]);
        put_u16(&mut b, 10, self.req_id_ex[2]);
        b[12..16].copy_from_slice(&self.reserved);
        b
    }
}

impl RxCdesc {
    /// Reads a base receive completion from 16 bytes (no validation).
    pub fn from_bytes(b: &[u8; RX_CQE_SIZE]) -> Self {
        RxCdesc {
            common: CdescCommon::from_bytes(&array_at(b, 0)),
            length: get_u16(b, 6),
            ah: get_u16(b, 8),
            src_qp_num: get_u16(b, 10),
            imm: get_u32(b, 12),
        }
    }

    /// Writes the base receive completion as 16 bytes.
    pub fn to_bytes(&self) -> [u8; RX_CQE_SIZE] {
        let mut b = [0u8; RX_CQE_SIZE];
        b[..6].copy_from_slice(&self.common.to_bytes());
        put_u16(&mut b, 6, self.length);
        put_u16(&mut b, 8, self.ah);
        put_u16(&mut b, 10, self.src_qp_num);
        put_u32(&mut b, 12, self.imm);
        b
    }
}

impl RxCdescEx {
    /// Reads an extended receive completion from 32 bytes (no validation).
    pub fn from_bytes(b: &[u8; RX_CQE_EX_SIZE]) -> Self {
        RxCdescEx {
            base: RxCdesc::from_bytes(&array_at(b, 0)),
            tail: array_at(b, RX_CQE_SIZE),
        }
    }

    /// Writes the extended receive completion as 32 bytes.
    pub fn to_bytes(&self) -> [u8; RX_CQE_EX_SIZE] {
        let mut b = [0u8; RX_CQE_EX_SIZE];
        b[..RX_CQE_SIZE].copy_from_slice(&self.base.to_bytes());
        b[RX_CQE_SIZE..].copy_from_slice(&self.tail);
        b
    }

    /// Bits 31:16 of the byte count (meaningful for RDMA write with immediate).
    pub fn length_hi(&self) -> u16 {
        u16::from_le_bytes([self.tail[0], self.tail[1]])
    }
}

/// A decoded send-queue completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxCqe {
    /// Request id; above 16 bits only with `req_id_64`.
    pub req_id: u64,
    /// The send queue has the 64-bit request-id capability (bytes 6-11 carry bits 16-63).
    pub req_id_64: bool,
    /// Completion status.
    pub status: CqStatus,
    /// Phase bit (0 or 1).
    pub phase: u8,
    /// Op type of the completed WQE.
    pub op: OpType,
    /// Local queue-pair number.
    pub qp_num: u16,
}

/// A decoded receive completion (base or extended form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RxCqe {
    /// Request id of the consumed receive WQE (meaningless when `unsolicited`).
    pub req_id: u16,
    /// Completion status.
    pub status: CqStatus,
    /// Phase bit (0 or 1).
    pub phase: u8,
    /// [`OpType::Send`] for a received message, [`OpType::RdmaWrite`] for an RDMA write with immediate.
    pub op: OpType,
    /// Immediate data present.
    pub has_imm: bool,
    /// No receive WQE was consumed (RDMA write with immediate only).
    pub unsolicited: bool,
    /// Local queue-pair number.
    pub qp_num: u16,
    /// Received byte count; above 16 bits only for RDMA write in the extended form.
    pub length: u32,
    /// Sender's address handle number, [`AH_UNKNOWN`] if unknown.
    pub ah: u16,
    /// Sender's queue-pair number.
    pub src_qp: u16,
    /// Immediate data; zero unless `has_imm`.
    pub imm: u32,
    /// Sender's 16-byte address (extended form, SEND with `ah == AH_UNKNOWN` only).
    pub src_addr: Option<[u8; 16]>,
}

impl RxCqe {
    /// The completion of an RDMA write with immediate `imm` of `length` bytes that landed on queue
    /// pair `qp_num`, from address handle `ah`, queue pair `src_qp` (phase 0: the writer sets it).
    pub fn write_imm(qp_num: u16, length: u32, ah: u16, src_qp: u16, imm: u32) -> RxCqe {
        RxCqe {
            req_id: 0,
            status: CqStatus::Ok,
            phase: 0,
            op: OpType::RdmaWrite,
            has_imm: true,
            unsolicited: true,
            qp_num,
            length,
            ah,
            src_qp,
            imm,
            src_addr: None,
        }
    }
}

/// Why a completion entry (bytes or description) is not acceptable.
///
/// Decoders report the first failing check in the order the variants are listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqeError {
    /// Status byte is not a defined completion status.
    UnknownStatus(u8),
    /// Queue-type field (flags bits 2:1) is 0 or 3.
    UnknownQueueType(u8),
    /// Queue type is valid but not the one the decoder expects.
    WrongQueueType {
        /// Queue type the decoder handles.
        expected: QueueType,
        /// Queue type in the entry.
        found: QueueType,
    },
    /// Op-type field (flags bits 6:4) is 3-7.
    UnknownOpType(u8),
    /// A receive completion reports an RDMA read, which never completes at the target.
    InvalidOpForQueue(OpType),
    /// A receive-only flag (has_imm bit 3 or unsolicited bit 7) is set on a send completion.
    RxOnlyFlag {
        /// Bit number within the flags byte.
        bit: u8,
    },
    /// unsolicited is set on a receive completion that is not an RDMA write.
    UnsolicitedWithoutWrite,
    /// A receive completion for an RDMA write lacks immediate data (only writes with
    /// immediate complete at the target).
    WriteWithoutImm,
    /// Immediate bytes are non-zero while has_imm is clear.
    StrayImmediate,
    /// A reserved byte is non-zero; `offset` is the byte offset within the entry.
    ReservedNonZero {
        /// Byte offset of the first offending byte.
        offset: u8,
    },
    /// Description only: `phase` is not 0 or 1.
    PhaseOutOfRange(u8),
    /// Description only: `req_id` exceeds 16 bits without `req_id_64`.
    ReqIdTooWide(u64),
    /// Description only: `length` exceeds 16 bits where the form cannot carry it (base
    /// form, or a SEND completion).
    LengthTooWide(u32),
    /// Description only: `src_addr` is set where the form cannot carry it (base form,
    /// RDMA write, or a known `ah`).
    SrcAddrNotAllowed,
    /// Description only: `src_addr` is all zero, which decodes as no address.
    EmptySrcAddr,
}

impl fmt::Display for CqeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CqeError::UnknownStatus(s) => write!(f, "unknown completion status {s}"),
            CqeError::UnknownQueueType(q) => write!(f, "unknown queue type {q}"),
            CqeError::WrongQueueType { expected, found } => {
                write!(f, "queue type {found:?} where {expected:?} was expected")
            }
            CqeError::UnknownOpType(o) => write!(f, "unknown op type {o}"),
            CqeError::InvalidOpForQueue(op) => write!(f, "{op} cannot complete on a receive queue"),
            CqeError::RxOnlyFlag { bit } => {
                write!(f, "receive-only flag bit {bit} set on a send completion")
            }
            CqeError::UnsolicitedWithoutWrite => {
                write!(
                    f,
                    "unsolicited flag on a completion that is not an RDMA write"
                )
            }
            CqeError::WriteWithoutImm => {
                write!(f, "RDMA write receive completion without immediate data")
            }
            CqeError::StrayImmediate => write!(f, "immediate data present but has_imm is clear"),
            CqeError::ReservedNonZero { offset } => write!(f, "reserved byte {offset} is non-zero"),
            CqeError::PhaseOutOfRange(p) => write!(f, "phase {p} is not 0 or 1"),
            CqeError::ReqIdTooWide(id) => {
                write!(
                    f,
                    "request id {id:#x} needs the 64-bit request-id capability"
                )
            }
            CqeError::LengthTooWide(l) => write!(f, "length {l} does not fit this entry form"),
            CqeError::SrcAddrNotAllowed => write!(f, "source address not allowed in this entry"),
            CqeError::EmptySrcAddr => write!(f, "source address is all zero"),
        }
    }
}

impl std::error::Error for CqeError {}

/// Phase the consumer expects at consumer index `ci` on a CQ of `entries` slots: 1 on
/// the first pass, flipping on every wrap. `entries == 0` yields 1.
pub fn cq_expected_phase(ci: u64, entries: u32) -> u8 {
    match ci.checked_div(u64::from(entries)) {
        Some(wraps) => 1 ^ (wraps & 1) as u8,
        None => 1,
    }
}

/// The phase bit of a flags byte.
pub const fn flags_phase(flags: u8) -> u8 {
    flags & FLAG_PHASE
}

/// The queue type of a flags byte.
pub fn flags_queue_type(flags: u8) -> Result<QueueType, CqeError> {
    let raw = (flags & FLAG_Q_TYPE_MASK) >> FLAG_Q_TYPE_SHIFT;
    QueueType::from_raw(raw).ok_or(CqeError::UnknownQueueType(raw))
}

/// Reads the queue type of an entry from its flags byte (entry byte 3); lets a poller
/// pick [`decode_tx`] or [`decode_rx`] for a mixed CQ.
pub fn queue_type_of(entry_head: &[u8; 4]) -> Result<QueueType, CqeError> {
    flags_queue_type(entry_head[3])
}

fn flags_op(flags: u8) -> Result<OpType, CqeError> {
    let raw = (flags & FLAG_OP_TYPE_MASK) >> FLAG_OP_TYPE_SHIFT;
    OpType::from_raw(raw).ok_or(CqeError::UnknownOpType(raw))
}

fn common_checks(c: &CdescCommon, expected: QueueType) -> Result<(CqStatus, OpType), CqeError> {
    let status = CqStatus::from_raw(c.status).ok_or(CqeError::UnknownStatus(c.status))?;
    let found = flags_queue_type(c.flags)?;
    if found != expected {
        return Err(CqeError::WrongQueueType { expected, found });
    }
    Ok((status, flags_op(c.flags)?))
}

fn make_flags(phase: u8, q: QueueType, has_imm: bool, op: OpType, unsolicited: bool) -> u8 {
    let mut f = (phase & FLAG_PHASE)
        | (((q as u8) << FLAG_Q_TYPE_SHIFT) & FLAG_Q_TYPE_MASK)
        | ((op.raw() << FLAG_OP_TYPE_SHIFT) & FLAG_OP_TYPE_MASK);
    if has_imm {
        f |= FLAG_HAS_IMM;
    }
    if unsolicited {
        f |= FLAG_UNSOLICITED;
    }
    f
}

/// Checks that `c` encodes to bytes [`decode_tx_with`] accepts with the same description.
pub fn validate_tx(c: &TxCqe) -> Result<(), CqeError> {
    if c.phase > 1 {
        return Err(CqeError::PhaseOutOfRange(c.phase));
    }
    if !c.req_id_64 && c.req_id > 0xFFFF {
        return Err(CqeError::ReqIdTooWide(c.req_id));
    }
    Ok(())
}

/// Encodes a send completion (16 bytes, reserved bytes zero). Masks the phase to bit 0
/// and drops request-id bits above 15 without `req_id_64`.
pub fn encode_tx(c: &TxCqe) -> [u8; TX_CQE_SIZE] {
    let mut d = TxCdesc {
        common: CdescCommon {
            req_id: c.req_id as u16,
            status: c.status.raw(),
            flags: make_flags(c.phase, QueueType::Send, false, c.op, false),
            qp_num: c.qp_num,
        },
        ..TxCdesc::default()
    };
    if c.req_id_64 {
        d.req_id_ex = req_id_ex_words(c.req_id);
    }
    d.to_bytes()
}

/// Decodes a send completion of a queue without the 64-bit request-id capability
/// (bytes 6-15 must be zero). Same as `decode_tx_with(bytes, false)`.
pub fn decode_tx(bytes: &[u8; TX_CQE_SIZE]) -> Result<TxCqe, CqeError> {
    decode_tx_with(bytes, false)
}

/// Decodes and validates a send completion. Never panics.
///
/// Checks, in order: known status; queue type SQ; known op type; has_imm and
/// unsolicited clear; reserved bytes zero (12-15, plus 6-11 without `req_id_64`).
pub fn decode_tx_with(bytes: &[u8; TX_CQE_SIZE], req_id_64: bool) -> Result<TxCqe, CqeError> {
    let d = TxCdesc::from_bytes(bytes);
    let c = &d.common;
    let (status, op) = common_checks(c, QueueType::Send)?;
    if c.flags & FLAG_HAS_IMM != 0 {
        return Err(CqeError::RxOnlyFlag { bit: 3 });
    }
    if c.flags & FLAG_UNSOLICITED != 0 {
        return Err(CqeError::RxOnlyFlag { bit: 7 });
    }
    let start = if req_id_64 { 12 } else { 6 };
    if let Some(offset) = first_nonzero(bytes, start, TX_CQE_SIZE) {
        return Err(CqeError::ReservedNonZero { offset });
    }
    let req_id = if req_id_64 {
        req_id_from_words(c.req_id, d.req_id_ex)
    } else {
        u64::from(c.req_id)
    };
    Ok(TxCqe {
        req_id,
        req_id_64,
        status,
        phase: flags_phase(c.flags),
        op,
        qp_num: c.qp_num,
    })
}

fn rx_semantic_checks(
    op: OpType,
    has_imm: bool,
    unsolicited: bool,
    imm: u32,
) -> Result<(), CqeError> {
    if op == OpType::RdmaRead {
        return Err(CqeError::InvalidOpForQueue(op));
    }
    if unsolicited && op != OpType::RdmaWrite {
        return Err(CqeError::UnsolicitedWithoutWrite);
    }
    if op == OpType::RdmaWrite && !has_imm {
        return Err(CqeError::WriteWithoutImm);
    }
    if !has_imm && imm != 0 {
        return Err(CqeError::StrayImmediate);
    }
    Ok(())
}

/// Checks that `c` encodes to bytes the receive decoder of the chosen form accepts with
/// the same description (`extended` selects the 32-byte form).
pub fn validate_rx(c: &RxCqe, extended: bool) -> Result<(), CqeError> {
    if c.phase > 1 {
        return Err(CqeError::PhaseOutOfRange(c.phase));
    }
    rx_semantic_checks(c.op, c.has_imm, c.unsolicited, c.imm)?;
    if c.length > 0xFFFF && !(extended && c.op == OpType::RdmaWrite) {
        return Err(CqeError::LengthTooWide(c.length));
    }
    if let Some(addr) = c.src_addr {
        if !extended || c.op != OpType::Send || c.ah != AH_UNKNOWN {
            return Err(CqeError::SrcAddrNotAllowed);
        }
        if addr == [0u8; 16] {
            return Err(CqeError::EmptySrcAddr);
        }
    }
    Ok(())
}

fn rx_base(c: &RxCqe) -> RxCdesc {
    RxCdesc {
        common: CdescCommon {
            req_id: c.req_id,
            status: c.status.raw(),
            flags: make_flags(c.phase, QueueType::Recv, c.has_imm, c.op, c.unsolicited),
            qp_num: c.qp_num,
        },
        length: c.length as u16,
        ah: c.ah,
        src_qp_num: c.src_qp,
        imm: c.imm,
    }
}

/// Encodes a base (16-byte) receive completion; length bits above 15 and `src_addr`
/// do not fit this form and are dropped.
pub fn encode_rx(c: &RxCqe) -> [u8; RX_CQE_SIZE] {
    rx_base(c).to_bytes()
}

/// Encodes an extended (32-byte) receive completion: `length_hi` for an RDMA write,
/// `src_addr` (when present) for a SEND; other tail bytes zero.
pub fn encode_rx_ex(c: &RxCqe) -> [u8; RX_CQE_EX_SIZE] {
    let mut d = RxCdescEx {
        base: rx_base(c),
        tail: [0u8; 16],
    };
    match c.op {
        OpType::RdmaWrite => {
            d.tail[0..2].copy_from_slice(&((c.length >> 16) as u16).to_le_bytes());
        }
        _ => {
            if let Some(addr) = c.src_addr {
                d.tail = addr;
            }
        }
    }
    d.to_bytes()
}

fn decode_rx_base(b: &RxCdesc) -> Result<RxCqe, CqeError> {
    let c = &b.common;
    let (status, op) = common_checks(c, QueueType::Recv)?;
    let has_imm = c.flags & FLAG_HAS_IMM != 0;
    let unsolicited = c.flags & FLAG_UNSOLICITED != 0;
    rx_semantic_checks(op, has_imm, unsolicited, b.imm)?;
    Ok(RxCqe {
        req_id: c.req_id,
        status,
        phase: flags_phase(c.flags),
        op,
        has_imm,
        unsolicited,
        qp_num: c.qp_num,
        length: u32::from(b.length),
        ah: b.ah,
        src_qp: b.src_qp_num,
        imm: b.imm,
        src_addr: None,
    })
}

/// Decodes and validates a base (16-byte) receive completion. Never panics.
///
/// Checks, in order: known status; queue type RQ; known op type; op is SEND or RDMA
/// write; unsolicited only with RDMA write; RDMA write only with immediate; no immediate
/// bytes without has_imm.
pub fn decode_rx(bytes: &[u8; RX_CQE_SIZE]) -> Result<RxCqe, CqeError> {
    decode_rx_base(&RxCdesc::from_bytes(bytes))
}

/// Decodes and validates an extended (32-byte) receive completion. Never panics.
///
/// After the [`decode_rx`] checks: for an RDMA write, bytes 16-17 are `length_hi` and
/// bytes 18-31 must be zero; for a SEND with `ah == AH_UNKNOWN`, bytes 16-31 are the
/// sender's address (all zero means none); for a SEND with a known `ah`, bytes 16-31
/// must be zero.
pub fn decode_rx_ex(bytes: &[u8; RX_CQE_EX_SIZE]) -> Result<RxCqe, CqeError> {
    let d = RxCdescEx::from_bytes(bytes);
    let mut c = decode_rx_base(&d.base)?;
    if c.op == OpType::RdmaWrite {
        if let Some(offset) = first_nonzero(bytes, RX_CQE_SIZE + 2, RX_CQE_EX_SIZE) {
            return Err(CqeError::ReservedNonZero { offset });
        }
        c.length |= u32::from(d.length_hi()) << 16;
    } else if c.ah == AH_UNKNOWN {
        if d.tail != [0u8; 16] {
            c.src_addr = Some(d.tail);
        }
    } else if let Some(offset) = first_nonzero(bytes, RX_CQE_SIZE, RX_CQE_EX_SIZE) {
        return Err(CqeError::ReservedNonZero { offset });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn expected_phase_flips_per_wrap() {
        assert_eq!(cq_expected_phase(0, 4), 1);
        assert_eq!(cq_expected_phase(3, 4), 1);
        assert_eq!(cq_expected_phase(4, 4), 0);
        assert_eq!(cq_expected_phase(8, 4), 1);
        assert_eq!(cq_expected_phase(9, 0), 1);
    }

    #[test]
    fn status_table_is_complete() {
        let defined: Vec<u8> = (0..=255u8)
            .filter(|&s| CqStatus::from_raw(s).is_some())
            .collect();
        let mut expected: Vec<u8> = (0..=15).collect();
        expected.push(18);
        assert_eq!(defined, expected);
        for s in CqStatus::ALL {
            assert_eq!(CqStatus::from_raw(s.raw()), Some(s));
        }
    }

    #[test]
    fn tx_bytes_by_hand() {
        let c = TxCqe {
            req_id: 0xAB_CDEF_0123_4567,
            req_id_64: true,
            status: CqStatus::RemoteRnr,
            phase: 1,
            op: OpType::RdmaWrite,
            qp_num: 0x0102,
        };
        let b = encode_tx(&c);
        assert_eq!(
            b,
            [0x67, 0x45, 10, 0x23, 0x02, 0x01, 0x23, 0x01, 0xEF, 0xCD, 0xAB, 0x00, 0, 0, 0, 0]
        );
        assert_eq!(decode_tx_with(&b, true), Ok(c));
        assert_eq!(decode_tx(&b), Err(CqeError::ReservedNonZero { offset: 6 }));
        assert_eq!(queue_type_of(&[0, 0, 0, b[3]]), Ok(QueueType::Send));
    }

    #[test]
    fn rx_ex_write_imm_long_length() {
        let c = RxCqe::write_imm(7, 0x0012_3456, 3, 9, 0xCAFE_F00D);
        assert_eq!(validate_rx(&c, true), Ok(()));
        assert_eq!(
            validate_rx(&c, false),
            Err(CqeError::LengthTooWide(0x0012_3456))
        );
        let b = encode_rx_ex(&c);
        assert_eq!(b[3], 0x80 | 0x20 | 0x08 | 0x04);
        assert_eq!(&b[6..8], &[0x56, 0x34]);
        assert_eq!(&b[16..18], &[0x12, 0x00]);
        assert_eq!(decode_rx_ex(&b), Ok(c));
    }

    fn tx_cqe() -> impl Strategy<Value = TxCqe> {
        (
            any::<u64>(),
            any::<bool>(),
            proptest::sample::select(CqStatus::ALL.to_vec()),
            0u8..=1,
            0u8..=2,
            any::<u16>(),
        )
            .prop_map(|(id, req_id_64, status, phase, op, qp_num)| TxCqe {
                req_id: if req_id_64 { id } else { id & 0xFFFF },
                req_id_64,
                status,
                phase,
                op: OpType::from_raw(op).unwrap(),
                qp_num,
            })
    }

    fn rx_cqe(extended: bool) -> impl Strategy<Value = RxCqe> {
        (
            (
                any::<u16>(),
                proptest::sample::select(CqStatus::ALL.to_vec()),
                0u8..=1,
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<u16>(),
            ),
            (
                any::<u32>(),
                prop_oneof![Just(AH_UNKNOWN), any::<u16>()],
                any::<u16>(),
                any::<u32>(),
                proptest::option::of(any::<[u8; 16]>()),
            ),
        )
            .prop_map(
                move |(
                    (req_id, status, phase, write, has_imm, unsolicited, qp_num),
                    (length, ah, src_qp, imm, src_addr),
                )| {
                    let op = if write {
                        OpType::RdmaWrite
                    } else {
                        OpType::Send
                    };
                    let has_imm = has_imm || write;
                    let wide = extended && write;
                    RxCqe {
                        req_id,
                        status,
                        phase,
                        op,
                        has_imm,
                        unsolicited: unsolicited && write,
                        qp_num,
                        length: if wide { length } else { length & 0xFFFF },
                        ah,
                        src_qp,
                        imm: if has_imm { imm } else { 0 },
                        src_addr: src_addr
                            .filter(|a| extended && !write && ah == AH_UNKNOWN && *a != [0u8; 16]),
                    }
                },
            )
    }

    /// A valid completion (`valid` is its validation result) encodes to bytes that decode back to
    /// it, and the raw mirror reads and writes those bytes unchanged.
    fn check_identity<C: Copy + PartialEq + core::fmt::Debug, const N: usize>(
        c: C,
        valid: Result<(), CqeError>,
        encode: impl Fn(&C) -> [u8; N],
        decode: impl Fn(&[u8; N]) -> Result<C, CqeError>,
        raw_round_trip: impl Fn(&[u8; N]) -> [u8; N],
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(valid, Ok(()));
        let b = encode(&c);
        prop_assert_eq!(decode(&b), Ok(c));
        prop_assert_eq!(raw_round_trip(&b), b);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn tx_identity(c in tx_cqe()) {
            let decode = |b: &[u8; TX_CQE_SIZE]| decode_tx_with(b, c.req_id_64);
            let raw = |b: &[u8; TX_CQE_SIZE]| TxCdesc::from_bytes(b).to_bytes();
            check_identity(c, validate_tx(&c), encode_tx, decode, raw)?;
        }

        #[test]
        fn rx_identity(c in rx_cqe(false)) {
            let raw = |b: &[u8; RX_CQE_SIZE]| RxCdesc::from_bytes(b).to_bytes();
            check_identity(c, validate_rx(&c, false), encode_rx, decode_rx, raw)?;
        }

        #[test]
        fn rx_ex_identity(c in rx_cqe(true)) {
            let raw = |b: &[u8; RX_CQE_EX_SIZE]| RxCdescEx::from_bytes(b).to_bytes();
            check_identity(c, validate_rx(&c, true), encode_rx_ex, decode_rx_ex, raw)?;
        }

        #[test]
        fn decoders_never_panic_and_accepted_bytes_are_canonical(
            v in proptest::collection::vec(any::<u8>(), RX_CQE_EX_SIZE),
            req_id_64 in any::<bool>(),
        ) {
            let mut b32 = [0u8; RX_CQE_EX_SIZE];
            b32.copy_from_slice(&v);
            let mut b16 = [0u8; 16];
            b16.copy_from_slice(&v[..16]);
            if let Ok(c) = decode_tx_with(&b16, req_id_64) {
                prop_assert_eq!(validate_tx(&c), Ok(()));
                prop_assert_eq!(encode_tx(&c), b16);
            }
            if let Ok(c) = decode_rx(&b16) {
                prop_assert_eq!(validate_rx(&c, false), Ok(()));
                prop_assert_eq!(encode_rx(&c), b16);
            }
            if let Ok(c) = decode_rx_ex(&b32) {
                prop_assert_eq!(validate_rx(&c, true), Ok(()));
                prop_assert_eq!(encode_rx_ex(&c), b32);
            }
        }
    }
}
