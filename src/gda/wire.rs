//! Formats of the software queue: what kernels put into WQEs beyond the EFA format, and what the
//! software queue sends between PEs.
//!
//! # Soft keys and queue identities (what kernels find in the device state)
//! * `lkey`: an index into the consumer's table of local registrations, starting at 1
//!   ([`SOFT_LKEY_FIRST`]); every local heap chunk has its own.
//! * `rkey`: [`SOFT_RKEY_HEAP`] `+ n` (`SOFT_RKEY_HEAP` = 1) names chunk `n` of the destination PE's
//!   symmetric heap, the chunk starting at heap offset `n << log2_granularity` (the same on every PE:
//!   NVSHMEM registers heap chunks collectively); the heap-key table publishes it. An rkey naming no
//!   known chunk, or a range outside its chunk, is answered with `REMOTE_BAD_ADDRESS`.
//! * `ah`: the destination PE's index. `dest_qp_num`: [`soft_qpn`] of that PE. `qkey`: one per-job
//!   value every PE derives from the exchanged endpoint names ([`soft_qkey`]).
//!
//! # AMO message (32 bytes, a SEND payload)
//! The layout is [`NvshmemEfaGdaAmoMsg`] of the device state (magic `NVSHMEM_EFA_GDA_AMO_MAGIC`, the
//! ASCII bytes `EAMO`; op `NVSHMEM_EFA_GDA_AMO_ADD` or `_SET`; size 4 or 8; flags 0 or
//! `NVSHMEM_EFA_GDA_AMO_AFTER_DATA` (the AMO announces data: docs/ordering.md); offset from the
//! target heap's base, aligned to the size; value, the low 4 bytes for size 4; little-endian). A SEND
//! (inline or not) whose payload is exactly 32 bytes and starts with the magic is applied by the
//! target's software queue to the target's local heap before its RX completion is produced.
//!
//! The initiator's queue checks the message against the target heap it knows (error completion
//! `REMOTE_BAD_ADDRESS` for a bad offset, `LOCAL_UNSUPPORTED_OP` for an unknown op,
//! `LOCAL_BAD_LENGTH` for a bad size); the target checks again and reports a failed application in
//! the status of the RX completion. All AMOs on one PE are applied by that PE's one consumer thread,
//! so ADDs from any number of PEs are exact. The initiator's completion means the message reached
//! the target; the application is visible to the target through its RX completion.
//!
//! # Wire header of a SEND between software queues (24 bytes, then the payload)
//! | bytes | field |
//! |---|---|
//! | 0-3 | magic `0x53414447` (`GDAS`) |
//! | 4-7 | sender's PE |
//! | 8-11 | immediate data |
//! | 12-13 | flags: bit 0 = has immediate, bit 1 = answer wanted, bit 2 = packed AMOs |
//! | 14-15 | payload length |
//! | 16-23 | the sender's token when an answer is wanted (else 0) |
//!
//! A packed SEND (bit 2, with bit 1, no immediate) carries several answered AMO messages, each
//! behind its own 8-byte token (40-byte entries); the target answers each token. The sender packs
//! the AMOs one consumer pass posts to one PE.
//! An answered SEND: where the provider takes delivery-complete sends one per peer at a time
//! ([`crate::fabric::Caps::dc_sends_serialise`]), the sender posts SENDs with transmit completion
//! and asks for an answer; the target, once it handled the SEND (an AMO applied to its heap, an RX
//! completion written), answers with a staged acknowledgement ([`STAGE_WRITE_ACK`]) carrying the
//! token and the status, and the sender completes the WQE then. So a completed AMO has been applied
//! at the target (docs/gda-amo-path.md). The answers to the SENDs of one sender that one CQ read
//! brought (a batch of AMOs) travel together, as one [`STAGE_ACKS`] message with their tokens.
//!
//! # Staged transfers (40-byte header, then the payload)
//! Where a queue stages RDMA (see the software queue's module doc), writes and reads travel as SENDs
//! of `StageHdr` (magic `GDAT`): write chunks and their acks, read requests and read data. Receive
//! buffers of a staging queue hold `STAGE_SLOT` bytes.
//!
//! # Remote CQ data of an RDMA write with immediate
//! Bits 31:0 carry the immediate, bits 63:32 the sender's PE plus one (0: unknown) when the provider
//! carries 8 bytes of CQ data; providers with 4 bytes carry the immediate alone.

use std::mem::offset_of;

use super::state::{
    NvshmemEfaGdaAmoMsg, NVSHMEM_EFA_GDA_AMO_ADD, NVSHMEM_EFA_GDA_AMO_AFTER_DATA,
    NVSHMEM_EFA_GDA_AMO_FLAGS_KNOWN, NVSHMEM_EFA_GDA_AMO_MAGIC, NVSHMEM_EFA_GDA_AMO_SET,
};

/// `lkey` of the first local registration of a software queue.
pub const SOFT_LKEY_FIRST: u32 = 1;
/// `rkey` naming the destination PE's symmetric heap.
pub const SOFT_RKEY_HEAP: u32 = 1;
/// Largest SEND payload the software queue carries (inline or from buffers).
pub const SOFT_SEND_MAX: usize = 4096;

/// Magic of an AMO message (`EAMO`).
pub const AMO_MAGIC: u32 = NVSHMEM_EFA_GDA_AMO_MAGIC;
/// AMO op: add the value.
pub const AMO_OP_ADD: u32 = NVSHMEM_EFA_GDA_AMO_ADD;
/// AMO op: store the value.
pub const AMO_OP_SET: u32 = NVSHMEM_EFA_GDA_AMO_SET;
/// AMO flag: the AMO announces data and is applied after the WQEs before it (docs/ordering.md).
pub const AMO_AFTER_DATA: u32 = NVSHMEM_EFA_GDA_AMO_AFTER_DATA;
/// Size of an AMO message.
pub const AMO_MSG_SIZE: usize = std::mem::size_of::<NvshmemEfaGdaAmoMsg>();

/// Magic of the software queue's SEND header (`GDAS`).
pub const SEND_MAGIC: u32 = u32::from_le_bytes(*b"GDAS");
/// Size of the SEND header.
pub const SEND_HDR_SIZE: usize = 24;
/// SEND header flag: immediate data present.
pub const SEND_FLAG_IMM: u16 = 1;
/// SEND header flag: the sender waits for an answer carrying its token (an answered SEND).
pub const SEND_FLAG_ANSWER: u16 = 2;
/// SEND header flag: the payload is several answered AMO messages ([`PACKED_ENTRY`] bytes each:
/// the AMO's token, then its message); each is answered with its own token. Needs
/// [`SEND_FLAG_ANSWER`], no immediate.
pub const SEND_FLAG_PACKED: u16 = 4;
/// Bytes of one entry of a packed SEND: the token (8, little-endian), then the AMO message.
pub const PACKED_ENTRY: usize = 8 + AMO_MSG_SIZE;
/// Most AMO messages one packed SEND carries.
pub const PACKED_MAX: usize = SOFT_SEND_MAX / PACKED_ENTRY;

/// Largest number of PEs a software queue addresses (`ah` is 16 bits and 0xFFFF means unknown).
pub const SOFT_MAX_PES: i32 = 0xFFFF;

/// QP number the software queue gives PE `pe` (never 0).
pub fn soft_qpn(pe: i32) -> u16 {
    (pe as u32 % 0xFFFF + 1) as u16
}

/// The per-job qkey: FNV-1a over the PE count and every PE's endpoint name, never 0. Every PE
/// computes it from the same exchanged names, so they all agree.
pub fn soft_qkey(n_pes: i32, names: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in (n_pes as u32).to_le_bytes().iter().chain(names.iter()) {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h | 1
}

/// An AMO request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmoMsg {
    /// [`AMO_OP_ADD`] or [`AMO_OP_SET`].
    pub op: u32,
    /// 4 or 8.
    pub size: u32,
    /// Offset from the target heap's base.
    pub offset: u64,
    /// Operand.
    pub value: u64,
    /// 0 or [`AMO_AFTER_DATA`].
    pub flags: u32,
}

/// Why an AMO message is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmoError {
    /// Unknown op.
    BadOp(u32),
    /// Size other than 4 or 8.
    BadSize(u32),
    /// A flag bit the library does not know.
    UnknownFlags(u32),
    /// Offset not aligned to the size.
    Misaligned(u64),
    /// Offset outside the heap (or no heap).
    OutOfRange(u64),
}

impl std::fmt::Display for AmoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AmoError::BadOp(o) => write!(f, "unknown AMO op {o}"),
            AmoError::BadSize(s) => write!(f, "AMO size {s} (expected 4 or 8)"),
            AmoError::UnknownFlags(b) => write!(
                f,
                "AMO flags {b:#x} (known: {:#x})",
                NVSHMEM_EFA_GDA_AMO_FLAGS_KNOWN
            ),
            AmoError::Misaligned(o) => write!(f, "AMO offset {o:#x} is not aligned to its size"),
            AmoError::OutOfRange(o) => write!(f, "AMO offset {o:#x} is outside the target heap"),
        }
    }
}

impl AmoMsg {
    /// The message as the device state's struct.
    pub fn to_repr(&self) -> NvshmemEfaGdaAmoMsg {
        NvshmemEfaGdaAmoMsg {
            magic: AMO_MAGIC,
            op: self.op,
            size: self.size,
            flags: self.flags,
            offset: self.offset,
            value: self.value,
        }
    }

    /// Encodes the 32-byte message (the bytes of [`NvshmemEfaGdaAmoMsg`], little-endian).
    pub fn encode(&self) -> [u8; AMO_MSG_SIZE] {
        let r = self.to_repr();
        let mut b = [0u8; AMO_MSG_SIZE];
        type M = NvshmemEfaGdaAmoMsg;
        for (at, v) in [
            (offset_of!(M, magic), &r.magic.to_le_bytes()[..]),
            (offset_of!(M, op), &r.op.to_le_bytes()[..]),
            (offset_of!(M, size), &r.size.to_le_bytes()[..]),
            (offset_of!(M, flags), &r.flags.to_le_bytes()[..]),
            (offset_of!(M, offset), &r.offset.to_le_bytes()[..]),
            (offset_of!(M, value), &r.value.to_le_bytes()[..]),
        ] {
            b[at..at + v.len()].copy_from_slice(v);
        }
        b
    }

    /// Recognises an AMO message: `None` when `payload` is not one (wrong size or magic), else the
    /// message with its fields checked against a heap of `heap_size` bytes (0: no heap).
    pub fn parse(payload: &[u8], heap_size: u64) -> Option<std::result::Result<AmoMsg, AmoError>> {
        if payload.len() != AMO_MSG_SIZE
            || u32::from_le_bytes(payload[0..4].try_into().ok()?) != AMO_MAGIC
        {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(payload[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(payload[i..i + 8].try_into().expect("8 bytes"));
        let m = AmoMsg {
            op: u32_at(4),
            size: u32_at(8),
            offset: u64_at(16),
            value: u64_at(24),
            flags: u32_at(12),
        };
        Some(m.check(heap_size))
    }

    fn check(self, heap_size: u64) -> std::result::Result<AmoMsg, AmoError> {
        if self.op != AMO_OP_ADD && self.op != AMO_OP_SET {
            return Err(AmoError::BadOp(self.op));
        }
        if self.size != 4 && self.size != 8 {
            return Err(AmoError::BadSize(self.size));
        }
        if self.flags & !NVSHMEM_EFA_GDA_AMO_FLAGS_KNOWN != 0 {
            return Err(AmoError::UnknownFlags(self.flags));
        }
        if self.offset % u64::from(self.size) != 0 {
            return Err(AmoError::Misaligned(self.offset));
        }
        if heap_size < u64::from(self.size) || self.offset > heap_size - u64::from(self.size) {
            return Err(AmoError::OutOfRange(self.offset));
        }
        Ok(self)
    }
}

/// The SEND header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendHdr {
    /// Sender's PE.
    pub src_pe: u32,
    /// Immediate data, if any.
    pub imm: Option<u32>,
    /// Payload length.
    pub len: u16,
    /// The sender's token, when it waits for an answer (an answered SEND, see the module doc).
    pub answer: Option<u64>,
    /// The payload is packed AMO messages ([`SEND_FLAG_PACKED`]).
    pub packed: bool,
}

impl SendHdr {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; SEND_HDR_SIZE] {
        let mut b = [0u8; SEND_HDR_SIZE];
        b[0..4].copy_from_slice(&SEND_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.src_pe.to_le_bytes());
        b[8..12].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        let mut flags = if self.imm.is_some() { SEND_FLAG_IMM } else { 0 };
        if self.answer.is_some() {
            flags |= SEND_FLAG_ANSWER;
        }
        if self.packed {
            flags |= SEND_FLAG_PACKED;
        }
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.answer.unwrap_or(0).to_le_bytes());
        b
    }

    /// Decodes a received message of `msg_len` bytes; `None` if it is not a software-queue SEND.
    pub fn decode(msg: &[u8]) -> Option<SendHdr> {
        if msg.len() < SEND_HDR_SIZE || u32::from_le_bytes(msg[0..4].try_into().ok()?) != SEND_MAGIC
        {
            return None;
        }
        let flags = u16::from_le_bytes(msg[12..14].try_into().ok()?);
        let len = u16::from_le_bytes(msg[14..16].try_into().ok()?);
        let packed = flags & SEND_FLAG_PACKED != 0;
        if flags & !(SEND_FLAG_IMM | SEND_FLAG_ANSWER | SEND_FLAG_PACKED) != 0
            || usize::from(len) != msg.len() - SEND_HDR_SIZE
            || (packed
                && (flags & SEND_FLAG_ANSWER == 0
                    || flags & SEND_FLAG_IMM != 0
                    || len == 0
                    || usize::from(len) % PACKED_ENTRY != 0))
        {
            return None;
        }
        let imm = u32::from_le_bytes(msg[8..12].try_into().ok()?);
        let token = u64::from_le_bytes(msg[16..24].try_into().ok()?);
        Some(SendHdr {
            src_pe: u32::from_le_bytes(msg[4..8].try_into().ok()?),
            imm: if flags & SEND_FLAG_IMM != 0 {
                Some(imm)
            } else {
                None
            },
            len,
            answer: (flags & SEND_FLAG_ANSWER != 0).then_some(token),
            packed,
        })
    }

    /// The (token, AMO message bytes) entries of a packed SEND's payload (checked by
    /// [`SendHdr::decode`]).
    pub fn packed_entries(payload: &[u8]) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        payload.chunks_exact(PACKED_ENTRY).map(|e| {
            (
                u64::from_le_bytes(e[..8].try_into().expect("8 bytes")),
                &e[8..],
            )
        })
    }
}

/// Magic of a staged-transfer message between software queues (`GDAT`).
pub const STAGE_MAGIC: u32 = u32::from_le_bytes(*b"GDAT");
/// Size of the staged-transfer header.
pub const STAGE_HDR_SIZE: usize = 40;
/// Size of one staging buffer (send and receive slots of a queue that stages): header + payload.
pub const STAGE_SLOT: usize = 64 * 1024;
/// Largest payload of one staged message.
pub const STAGE_CHUNK: usize = STAGE_SLOT - STAGE_HDR_SIZE;
/// Staged RDMA write chunk (initiator to target), with payload.
pub const STAGE_WRITE: u8 = 1;
/// Acknowledgement of one write chunk (target to initiator), with the target's status.
pub const STAGE_WRITE_ACK: u8 = 2;
/// Staged RDMA read request (initiator to target).
pub const STAGE_READ_REQ: u8 = 3;
/// Read data (target to initiator): payload when the status is 0.
pub const STAGE_READ_DATA: u8 = 4;
/// Answers to several answered SENDs of the initiator (target to initiator), all with the
/// header's status: the payload is `len` bytes, the SENDs' tokens (8 bytes each, little-endian);
/// `total` is their count.
pub const STAGE_ACKS: u8 = 5;
/// Most tokens one [`STAGE_ACKS`] message carries.
pub const STAGE_ACKS_MAX: usize = STAGE_CHUNK / 8;
/// Staged header flag: the immediate is present (the last chunk of a write with immediate).
pub const STAGE_FLAG_IMM: u8 = 1;

/// Header of a staged-transfer message (40 bytes, little-endian, then the payload):
///
/// | bytes | field |
/// |---|---|
/// | 0-3 | magic `GDAT` |
/// | 4 | kind ([`STAGE_WRITE`], [`STAGE_WRITE_ACK`], [`STAGE_READ_REQ`], [`STAGE_READ_DATA`], [`STAGE_ACKS`]) |
/// | 5 | flags: bit 0 = immediate present |
/// | 6-7 | status (EFA completion status; acks and read data) |
/// | 8-11 | sender's PE |
/// | 12-15 | immediate |
/// | 16-23 | the initiator's token (its WQE count and slot), echoed in replies |
/// | 24-31 | offset: from the target heap's base (write, read request), into the read (read data) |
/// | 32-35 | length of this message's range (the payload's, when it carries one) |
/// | 36-39 | total length of the WQE |
///
/// A write chunk, read data with status 0 and answers ([`STAGE_ACKS`]: `len` = 8 x `total` token
/// bytes) carry `len` payload bytes; the others none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageHdr {
    /// Message kind.
    pub kind: u8,
    /// Immediate (write chunks that carry it).
    pub imm: Option<u32>,
    /// Status.
    pub status: u8,
    /// Sender's PE.
    pub src_pe: u32,
    /// Initiator's token.
    pub token: u64,
    /// Offset (see the table).
    pub offset: u64,
    /// Length of this message's range.
    pub len: u32,
    /// Total length of the WQE.
    pub total: u32,
}

impl StageHdr {
    /// Payload bytes a message with this header carries.
    pub fn payload_len(&self) -> usize {
        match self.kind {
            STAGE_WRITE => self.len as usize,
            STAGE_READ_DATA if self.status == 0 => self.len as usize,
            STAGE_ACKS => self.len as usize,
            _ => 0,
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; STAGE_HDR_SIZE] {
        let mut b = [0u8; STAGE_HDR_SIZE];
        b[0..4].copy_from_slice(&STAGE_MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = if self.imm.is_some() {
            STAGE_FLAG_IMM
        } else {
            0
        };
        b[6..8].copy_from_slice(&u16::from(self.status).to_le_bytes());
        b[8..12].copy_from_slice(&self.src_pe.to_le_bytes());
        b[12..16].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        b[16..24].copy_from_slice(&self.token.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b[36..40].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// Decodes a received message; `None` if it is not a well-formed staged message (wrong magic,
    /// kind, flags or status, or a size that disagrees with the header).
    pub fn decode(msg: &[u8]) -> Option<StageHdr> {
        if msg.len() < STAGE_HDR_SIZE
            || u32::from_le_bytes(msg[0..4].try_into().ok()?) != STAGE_MAGIC
        {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(msg[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
        let kind = msg[4];
        let flags = msg[5];
        let status = u16::from_le_bytes([msg[6], msg[7]]);
        if !(STAGE_WRITE..=STAGE_ACKS).contains(&kind)
            || flags & !STAGE_FLAG_IMM != 0
            || (flags != 0 && kind != STAGE_WRITE)
            || status > 0xFF
        {
            return None;
        }
        let h = StageHdr {
            kind,
            imm: (flags & STAGE_FLAG_IMM != 0).then(|| u32_at(12)),
            status: status as u8,
            src_pe: u32_at(8),
            token: u64_at(16),
            offset: u64_at(24),
            len: u32_at(32),
            total: u32_at(36),
        };
        if msg.len() - STAGE_HDR_SIZE != h.payload_len()
            || (kind == STAGE_ACKS
                && (h.len == 0
                    || h.len as usize > STAGE_ACKS_MAX * 8
                    || u64::from(h.len) != 8 * u64::from(h.total)))
        {
            return None;
        }
        Some(h)
    }

    /// The tokens of a [`STAGE_ACKS`] message's payload (checked by [`StageHdr::decode`]).
    pub fn ack_tokens(payload: &[u8]) -> impl Iterator<Item = u64> + '_ {
        payload
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }
}

/// Remote CQ data of an RDMA write with immediate (see the module doc).
pub fn write_imm_data(imm: u32, src_pe: i32, wide: bool) -> u64 {
    if wide {
        u64::from(imm) | ((src_pe as u64 + 1) << 32)
    } else {
        u64::from(imm)
    }
}

/// Splits remote CQ data into (immediate, sender PE if known).
pub fn split_imm_data(data: u64, wide: bool) -> (u32, Option<u32>) {
    let pe1 = (data >> 32) as u32;
    if wide && pe1 != 0 {
        (data as u32, Some(pe1 - 1))
    } else {
        (data as u32, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amo_roundtrip_and_checks() {
        let m = AmoMsg {
            op: AMO_OP_ADD,
            size: 8,
            offset: 64,
            value: 5,
            flags: 0,
        };
        let b = m.encode();
        assert_eq!(&b[0..4], b"EAMO");
        // SAFETY: NvshmemEfaGdaAmoMsg is 32 bytes of plain integers; little-endian host.
        let r: NvshmemEfaGdaAmoMsg = unsafe { std::mem::transmute(b) };
        assert_eq!(r, m.to_repr());
        assert_eq!(AmoMsg::parse(&b, 4096), Some(Ok(m)));
        assert_eq!(AmoMsg::parse(&b[..31], 4096), None);
        assert_eq!(AmoMsg::parse(&b, 64), Some(Err(AmoError::OutOfRange(64))));
        assert_eq!(AmoMsg::parse(&b, 72), Some(Ok(m)));
        assert_eq!(AmoMsg::parse(&b, 0), Some(Err(AmoError::OutOfRange(64))));
        let mut bad = b;
        bad[4] = 9;
        assert_eq!(AmoMsg::parse(&bad, 4096), Some(Err(AmoError::BadOp(9))));
        let set = |size, offset| {
            let m = AmoMsg {
                op: AMO_OP_SET,
                size,
                offset,
                value: 1,
                flags: 0,
            };
            AmoMsg::parse(&m.encode(), 4096)
        };
        assert_eq!(set(4, 6), Some(Err(AmoError::Misaligned(6))));
        assert_eq!(set(3, 0), Some(Err(AmoError::BadSize(3))));
        let mut r = m.encode();
        r[13] = 1;
        assert_eq!(
            AmoMsg::parse(&r, 4096),
            Some(Err(AmoError::UnknownFlags(0x100)))
        );
        let after = AmoMsg {
            flags: AMO_AFTER_DATA,
            ..m
        };
        assert_eq!(after.encode()[12], 1);
        assert_eq!(AmoMsg::parse(&after.encode(), 4096), Some(Ok(after)));
    }

    #[test]
    fn send_header_roundtrip() {
        let h = SendHdr {
            src_pe: 3,
            imm: Some(0xabcd),
            len: 5,
            answer: None,
            packed: false,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(b"hello");
        assert_eq!(SendHdr::decode(&msg), Some(h));
        assert_eq!(SendHdr::decode(&msg[..20]), None);
        let h2 = SendHdr {
            src_pe: 0,
            imm: None,
            len: 0,
            answer: None,
            packed: false,
        };
        assert_eq!(SendHdr::decode(&h2.encode()), Some(h2));
        // An answered SEND: flag bit 1 and the token in bytes 16-23 (a token of 0 is a token).
        for token in [0u64, 0x0123_4567_89ab_cdef] {
            let h3 = SendHdr {
                src_pe: 7,
                imm: None,
                len: 0,
                answer: Some(token),
                packed: false,
            };
            let b = h3.encode();
            assert_eq!(u16::from_le_bytes([b[12], b[13]]), SEND_FLAG_ANSWER);
            assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), token);
            assert_eq!(SendHdr::decode(&b), Some(h3));
        }
        // An unknown flag is not a software-queue SEND.
        let mut b = h2.encode();
        b[12] = 8;
        assert_eq!(SendHdr::decode(&b), None);
        // Packed AMOs: flags 2 | 4, two entries of token + 32-byte message.
        assert_eq!(AMO_MSG_SIZE, 32);
        assert_eq!(PACKED_ENTRY, 40);
        let hp = SendHdr {
            src_pe: 1,
            imm: None,
            len: 80,
            answer: Some(0x55),
            packed: true,
        };
        let mut m = hp.encode().to_vec();
        assert_eq!(u16::from_le_bytes([m[12], m[13]]), 6);
        for (tok, fill) in [(0x55u64, 0xa1u8), (0x2_0000_0009, 0xb2)] {
            m.extend_from_slice(&tok.to_le_bytes());
            m.extend_from_slice(&[fill; 32]);
        }
        assert_eq!(SendHdr::decode(&m), Some(hp));
        let e: Vec<(u64, Vec<u8>)> = SendHdr::packed_entries(&m[SEND_HDR_SIZE..])
            .map(|(t, a)| (t, a.to_vec()))
            .collect();
        assert_eq!(
            e,
            vec![(0x55, vec![0xa1; 32]), (0x2_0000_0009, vec![0xb2; 32])]
        );
        // Packed without an answer, with an immediate, or with a partial entry: refused.
        let mut no_answer = m.clone();
        no_answer[12] = 4;
        assert_eq!(SendHdr::decode(&no_answer), None);
        let mut imm = m.clone();
        imm[12] = 7;
        assert_eq!(SendHdr::decode(&imm), None);
        let mut short = SendHdr { len: 41, ..hp }.encode().to_vec();
        short.extend_from_slice(&[0; 41]);
        assert_eq!(SendHdr::decode(&short), None);
    }

    #[test]
    fn stage_header_roundtrip() {
        let h = StageHdr {
            kind: STAGE_WRITE,
            imm: Some(9),
            status: 0,
            src_pe: 1,
            token: 0x1234_0000_0005,
            offset: 4096,
            len: 3,
            total: 70000,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(b"abc");
        assert_eq!(StageHdr::decode(&msg), Some(h));
        assert_eq!(StageHdr::decode(&msg[..42]), None);
        let ack = StageHdr {
            kind: STAGE_WRITE_ACK,
            imm: None,
            status: 7,
            ..h
        };
        assert_eq!(StageHdr::decode(&ack.encode()), Some(ack));
        let err = StageHdr {
            kind: STAGE_READ_DATA,
            imm: None,
            status: 7,
            ..h
        };
        assert_eq!(StageHdr::decode(&err.encode()), Some(err));
        let mut bad = ack.encode();
        bad[4] = 9;
        assert_eq!(StageHdr::decode(&bad), None);
        // Answers: two tokens; the golden bytes of the header's kind, status, count and length.
        let acks = StageHdr {
            kind: STAGE_ACKS,
            imm: None,
            status: 0,
            src_pe: 3,
            token: 0x11,
            offset: 0,
            len: 16,
            total: 2,
        };
        let mut m = acks.encode().to_vec();
        assert_eq!(&m[4..8], &[5, 0, 0, 0]);
        assert_eq!(&m[32..40], &[16, 0, 0, 0, 2, 0, 0, 0]);
        m.extend_from_slice(&0x11u64.to_le_bytes());
        m.extend_from_slice(&0x2_0000_0007u64.to_le_bytes());
        assert_eq!(StageHdr::decode(&m), Some(acks));
        let toks: Vec<u64> = StageHdr::ack_tokens(&m[STAGE_HDR_SIZE..]).collect();
        assert_eq!(toks, vec![0x11, 0x2_0000_0007]);
        // A count that disagrees with the length, an empty list, or a short payload: refused.
        let mut wrong = m.clone();
        wrong[36] = 3;
        assert_eq!(StageHdr::decode(&wrong), None);
        assert_eq!(StageHdr::decode(&m[..m.len() - 8]), None);
        let empty = StageHdr {
            len: 0,
            total: 0,
            ..acks
        };
        assert_eq!(StageHdr::decode(&empty.encode()), None);
        assert_eq!(SendHdr::decode(&msg), None);
    }

    #[test]
    fn identities() {
        assert_eq!(soft_qpn(0), 1);
        assert_ne!(soft_qpn(65533), 0);
        let a = soft_qkey(2, b"abcdef");
        assert_eq!(a, soft_qkey(2, b"abcdef"));
        assert_ne!(a, soft_qkey(2, b"abcdeg"));
        assert_ne!(soft_qkey(0, b""), 0);
        assert_eq!(
            split_imm_data(write_imm_data(7, 4, true), true),
            (7, Some(4))
        );
        assert_eq!(
            split_imm_data(write_imm_data(7, 4, false), false),
            (7, None)
        );
    }
}
