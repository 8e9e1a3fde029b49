//! EFA send-queue work-queue entry (TX WQE).
//!
//! The device reads 64-byte entries from the send-queue ring. This module holds
//! a `#[repr(C)]` mirror of that layout ([`TxWqe`]), a typed description of one
//! work request ([`WqeDesc`]), a deterministic encoder ([`encode`]) and a strict,
//! panic-free decoder ([`decode`], [`decode_with`]) that rejects anything the
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

use core::fmt;
use core::mem::{align_of, offset_of, size_of};

/// Size of one TX WQE in bytes.
pub const WQE_SIZE: usize = 64;
/// Size of a send-queue entry on queues with wide entries: efa-direct picks them when the device
/// has 80 bytes of inline room (rdma-core `efa_calc_sq_wqe_size`). The first 64 bytes are laid
/// out as a 64-byte WQE; this library never sets anything past them, so bytes 64-127 are zero.
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

/// Operation type carried in `ctrl1` bits 3:0 (and in CQE flags bits 6:4).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpType {
    /// Two-sided send; consumes a receive buffer at the target.
    Send = 0,
    /// One-sided RDMA read from remote memory into a local buffer.
    RdmaRead = 1,
    /// One-sided RDMA write from a local buffer into remote memory.
    RdmaWrite = 2,
}

impl OpType {
    /// Maps a raw op-type value to the enum; `None` for values the device does not define.
    pub const fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(OpType::Send),
            1 => Some(OpType::RdmaRead),
            2 => Some(OpType::RdmaWrite),
            _ => None,
        }
    }

    /// The raw value written into the WQE or CQE.
    pub const fn raw(self) -> u8 {
        self as u8
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

/// Metadata descriptor: the first 32 bytes of every TX WQE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxMetaDesc {
    /// Low 16 bits of the request id, echoed in the completion.
    pub req_id: u16,
    /// Op type, has_imm, inline_msg, meta_extension, meta_desc.
    pub ctrl1: u8,
    /// Phase, first, last, comp_req.
    pub ctrl2: u8,
    /// Destination queue-pair number.
    pub dest_qp_num: u16,
    /// Inline byte count, or number of buffer descriptors.
    pub length: u16,
    /// Immediate data, valid when `ctrl1` has_imm is set.
    pub immediate_data: u32,
    /// Address handle number of the destination.
    pub ah: u16,
    /// Processing hints.
    pub ctrl3: u8,
    /// Reserved, must be zero.
    pub reserved: u8,
    /// Queue key of the destination.
    pub qkey: u32,
    /// Reserved, must be zero.
    pub reserved2: [u8; 6],
    /// Bits 16-31, 32-47 and 48-63 of a 64-bit request id.
    pub req_id_ex: [u16; 3],
}

/// Local buffer descriptor (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufDesc {
    /// Length in bytes.
    pub length: u32,
    /// Local key in bits 23:0; bits 31:24 reserved.
    pub lkey: u32,
    /// Address bits 31:0.
    pub addr_lo: u32,
    /// Address bits 63:32.
    pub addr_hi: u32,
}

/// Remote memory descriptor of an RDMA request (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteMemDesc {
    /// Length in bytes.
    pub length: u32,
    /// Remote key.
    pub rkey: u32,
    /// Address bits 31:0.
    pub addr_lo: u32,
    /// Address bits 63:32.
    pub addr_hi: u32,
}

/// Data area of an RDMA read or write: remote descriptor then one local descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaReq {
    /// Remote memory to read from or write to.
    pub remote: RemoteMemDesc,
    /// Local buffer to write into or read from.
    pub local: BufDesc,
}

/// The 64-byte TX WQE as the device reads it.
///
/// The data area is kept as raw bytes; [`TxWqe::sgl`] and [`TxWqe::rdma`] view it
/// as buffer descriptors or as an RDMA request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxWqe {
    /// Metadata descriptor (bytes 0-31).
    pub meta: TxMetaDesc,
    /// Data area (bytes 32-63).
    pub data: [u8; 32],
}

const _: () = assert!(size_of::<TxMetaDesc>() == 32);
const _: () = assert!(offset_of!(TxMetaDesc, req_id) == 0);
const _: () = assert!(offset_of!(TxMetaDesc, ctrl1) == 2);
const _: () = assert!(offset_of!(TxMetaDesc, ctrl2) == 3);
const _: () = assert!(offset_of!(TxMetaDesc, dest_qp_num) == 4);
const _: () = assert!(offset_of!(TxMetaDesc, length) == 6);
const _: () = assert!(offset_of!(TxMetaDesc, immediate_data) == 8);
const _: () = assert!(offset_of!(TxMetaDesc, ah) == 12);
const _: () = assert!(offset_of!(TxMetaDesc, ctrl3) == 14);
const _: () = assert!(offset_of!(TxMetaDesc, reserved) == 15);
const _: () = assert!(offset_of!(TxMetaDesc, qkey) == 16);
const _: () = assert!(offset_of!(TxMetaDesc, reserved2) == 20);
const _: () = assert!(offset_of!(TxMetaDesc, req_id_ex) == 26);
const _: () = assert!(size_of::<BufDesc>() == 16);
const _: () = assert!(offset_of!(BufDesc, length) == 0);
const _: () = assert!(offset_of!(BufDesc, lkey) == 4);
const _: () = assert!(offset_of!(BufDesc, addr_lo) == 8);
const _: () = assert!(offset_of!(BufDesc, addr_hi) == 12);
const _: () = assert!(size_of::<RemoteMemDesc>() == 16);
const _: () = assert!(offset_of!(RemoteMemDesc, length) == 0);
const _: () = assert!(offset_of!(RemoteMemDesc, rkey) == 4);
const _: () = assert!(offset_of!(RemoteMemDesc, addr_lo) == 8);
const _: () = assert!(offset_of!(RemoteMemDesc, addr_hi) == 12);
const _: () = assert!(size_of::<RdmaReq>() == 32);
const _: () = assert!(offset_of!(RdmaReq, remote) == 0);
const _: () = assert!(offset_of!(RdmaReq, local) == 16);
const _: () = assert!(size_of::<TxWqe>() == WQE_SIZE);
const _: () = assert!(align_of::<TxWqe>() == 4);
const _: () = assert!(offset_of!(TxWqe, meta) == 0);
const _: () = assert!(offset_of!(TxWqe, data) == DATA_OFFSET);

/// Byte offset of the remote descriptor of an RDMA request.
pub const RDMA_REMOTE_OFFSET: usize = DATA_OFFSET + offset_of!(RdmaReq, remote);
/// Byte offset of the local buffer descriptor of an RDMA request.
pub const RDMA_LOCAL_OFFSET: usize = DATA_OFFSET + offset_of!(RdmaReq, local);

fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

impl BufDesc {
    /// Reads a descriptor from 16 little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        BufDesc {
            length: get_u32(b, 0),
            lkey: get_u32(b, 4),
            addr_lo: get_u32(b, 8),
            addr_hi: get_u32(b, 12),
        }
    }

    /// Writes the descriptor as 16 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u32(&mut b, 0, self.length);
        put_u32(&mut b, 4, self.lkey);
        put_u32(&mut b, 8, self.addr_lo);
        put_u32(&mut b, 12, self.addr_hi);
        b
    }

    /// The 64-bit buffer address.
    pub fn addr(&self) -> u64 {
        (u64::from(self.addr_hi) << 32) | u64::from(self.addr_lo)
    }
}

impl RemoteMemDesc {
    /// Reads a descriptor from 16 little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        RemoteMemDesc {
            length: get_u32(b, 0),
            rkey: get_u32(b, 4),
            addr_lo: get_u32(b, 8),
            addr_hi: get_u32(b, 12),
        }
    }

    /// Writes the descriptor as 16 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u32(&mut b, 0, self.length);
        put_u32(&mut b, 4, self.rkey);
        put_u32(&mut b, 8, self.addr_lo);
        put_u32(&mut b, 12, self.addr_hi);
        b
    }

    /// The 64-bit remote address.
    pub fn addr(&self) -> u64 {
        (u64::from(self.addr_hi) << 32) | u64::from(self.addr_lo)
    }
}

fn sub16(b: &[u8; 32], off: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&b[off..off + 16]);
    out
}

impl TxWqe {
    /// Reads a WQE from its 64 little-endian bytes (no validation).
    pub fn from_bytes(b: &[u8; WQE_SIZE]) -> Self {
        let mut reserved2 = [0u8; 6];
        reserved2.copy_from_slice(&b[20..26]);
        let mut data = [0u8; 32];
        data.copy_from_slice(&b[DATA_OFFSET..WQE_SIZE]);
        TxWqe {
            meta: TxMetaDesc {
                req_id: get_u16(b, offset_of!(TxMetaDesc, req_id)),
                ctrl1: b[offset_of!(TxMetaDesc, ctrl1)],
                ctrl2: b[offset_of!(TxMetaDesc, ctrl2)],
                dest_qp_num: get_u16(b, offset_of!(TxMetaDesc, dest_qp_num)),
                length: get_u16(b, offset_of!(TxMetaDesc, length)),
                immediate_data: get_u32(b, offset_of!(TxMetaDesc, immediate_data)),
                ah: get_u16(b, offset_of!(TxMetaDesc, ah)),
                ctrl3: b[offset_of!(TxMetaDesc, ctrl3)],
                reserved: b[offset_of!(TxMetaDesc, reserved)],
                qkey: get_u32(b, offset_of!(TxMetaDesc, qkey)),
                reserved2,
                req_id_ex: [get_u16(b, 26), get_u16(b, 28), get_u16(b, 30)],
            },
            data,
        }
    }

    /// Writes the WQE as 64 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; WQE_SIZE] {
        let m = &self.meta;
        let mut b = [0u8; WQE_SIZE];
        put_u16(&mut b, offset_of!(TxMetaDesc, req_id), m.req_id);
        b[offset_of!(TxMetaDesc, ctrl1)] = m.ctrl1;
        b[offset_of!(TxMetaDesc, ctrl2)] = m.ctrl2;
        put_u16(&mut b, offset_of!(TxMetaDesc, dest_qp_num), m.dest_qp_num);
        put_u16(&mut b, offset_of!(TxMetaDesc, length), m.length);
        put_u32(
            &mut b,
            offset_of!(TxMetaDesc, immediate_data),
            m.immediate_data,
        );
        put_u16(&mut b, offset_of!(TxMetaDesc, ah), m.ah);
        b[offset_of!(TxMetaDesc, ctrl3)] = m.ctrl3;
        b[offset_of!(TxMetaDesc, reserved)] = m.reserved;
        put_u32(&mut b, offset_of!(TxMetaDesc, qkey), m.qkey);
        b[20..26].copy_from_slice(&m.reserved2);
        put_u16(&mut b, 26, m.req_id_ex[0]);
        put_u16(&mut b, 28, m.req_id_ex[1]);
        put_u16(&mut b, 30, m.req_id_ex[2]);
        b[DATA_OFFSET..WQE_SIZE].copy_from_slice(&self.data);
        b
    }

    /// Views the data area as the two SEND buffer descriptors.
    pub fn sgl(&self) -> [BufDesc; 2] {
        [
            BufDesc::from_bytes(&sub16(&self.data, 0)),
            BufDesc::from_bytes(&sub16(&self.data, 16)),
        ]
    }

    /// Views the data area as an RDMA request.
    pub fn rdma(&self) -> RdmaReq {
        RdmaReq {
            remote: RemoteMemDesc::from_bytes(&sub16(&self.data, 0)),
            local: BufDesc::from_bytes(&sub16(&self.data, 16)),
        }
    }

    /// Stores buffer descriptor `index` (0 or 1; other values are ignored) into the data area.
    pub fn set_sge(&mut self, index: usize, desc: &BufDesc) {
        if index < SEND_MAX_SGES {
            let off = index * 16;
            self.data[off..off + 16].copy_from_slice(&desc.to_bytes());
        }
    }

    /// Stores an RDMA request into the data area.
    pub fn set_rdma(&mut self, req: &RdmaReq) {
        self.data[0..16].copy_from_slice(&req.remote.to_bytes());
        self.data[16..32].copy_from_slice(&req.local.to_bytes());
    }

    /// The full request id: `req_id` plus, when `req_id_64` is true, the `req_id_ex` words.
    pub fn request_id(&self, req_id_64: bool) -> u64 {
        let low = u64::from(self.meta.req_id);
        if req_id_64 {
            low | (u64::from(self.meta.req_id_ex[0]) << 16)
                | (u64::from(self.meta.req_id_ex[1]) << 32)
                | (u64::from(self.meta.req_id_ex[2]) << 48)
        } else {
            low
        }
    }
}

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
    /// Phase bit (0 or 1); see [`phase_for`].
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

/// Why a WQE (bytes or description) is not acceptable.
///
/// [`decode_with`] reports the first failing check in the order the variants are listed
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

/// Phase bit a producer writes for producer counter `pc` on a ring of `entries` slots:
/// `(pc / entries) & 1`, so the first pass writes 0. `entries == 0` yields 0.
pub fn phase_for(pc: u64, entries: u32) -> u8 {
    match pc.checked_div(u64::from(entries)) {
        Some(wraps) => (wraps & 1) as u8,
        None => 0,
    }
}

/// Ring slot for producer counter `pc` on a ring of `entries` slots: `pc % entries`
/// (equal to `pc & (entries - 1)` for the power-of-two rings EFA uses). `entries == 0` yields 0.
pub fn slot_for(pc: u64, entries: u32) -> u32 {
    match pc.checked_rem(u64::from(entries)) {
        Some(slot) => slot as u32,
        None => 0,
    }
}

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
        m.req_id_ex = [
            (desc.req_id >> 16) as u16,
            (desc.req_id >> 32) as u16,
            (desc.req_id >> 48) as u16,
        ];
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

fn check_local(index: u8, b: &LocalBuf, allow_zero: bool) -> Result<(), WqeError> {
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

fn check_rdma(local: &LocalBuf, remote: &RemoteBuf, allow_zero: bool) -> Result<(), WqeError> {
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

/// Checks that `desc` describes a WQE [`decode_with`] accepts, reporting the same error
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

fn first_nonzero(b: &[u8], start: usize, end: usize) -> Option<u8> {
    (start..end).find(|&i| b[i] != 0).map(|i| i as u8)
}

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

/// Writes a built WQE into a send-queue ring entry of `entry.len()` bytes (64 or 128): the 64
/// WQE bytes, then zeros. A 128-byte entry is written whole, as the producers on hardware do
/// (rdma-core's `efa_post_send` clears `wqe_size` bytes before it copies; NCCL's EFA GDA post path
/// zeroes a 128-byte staging WQE and copies `wqe_size` bytes): the device reads bytes 64-127
/// too, and a previous WQE's bytes there must not survive. The CUDA twin is
/// `nvshmem_efa_wqe_store_entry` in `cuda/efa_wqe.cuh` (golden vectors of kind `entry`).
pub fn store_entry(entry: &mut [u8], wqe: &[u8; WQE_SIZE]) -> Result<(), WqeError> {
    if entry.len() != WQE_SIZE && entry.len() != WQE_SIZE_128 {
        return Err(WqeError::BadEntrySize(entry.len()));
    }
    entry[..WQE_SIZE].copy_from_slice(wqe);
    entry[WQE_SIZE..].fill(0);
    Ok(())
}

/// Decodes and validates a send-queue ring entry of 64 or 128 bytes: bytes 0-63 as
/// [`decode_with`], then every byte past them must be zero ([`WqeError::ReservedNonZero`] with
/// the offset within the entry), since no WQE this library accepts uses them.
pub fn decode_entry(entry: &[u8], req_id_64: bool) -> Result<WqeDesc, WqeError> {
    if entry.len() != WQE_SIZE && entry.len() != WQE_SIZE_128 {
        return Err(WqeError::BadEntrySize(entry.len()));
    }
    let mut head = [0u8; WQE_SIZE];
    head.copy_from_slice(&entry[..WQE_SIZE]);
    let desc = decode_with(&head, req_id_64)?;
    if let Some(offset) = first_nonzero(entry, WQE_SIZE, entry.len()) {
        return Err(WqeError::ReservedNonZero { offset });
    }
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_other_sizes_are_refused() {
        let w = [0u8; WQE_SIZE];
        for n in [0usize, 32, 63, 65, 96, 127, 129, 256] {
            let mut e = vec![0x5Au8; n];
            assert_eq!(store_entry(&mut e, &w), Err(WqeError::BadEntrySize(n)));
            assert!(e.iter().all(|&x| x == 0x5A), "entry of {n} bytes touched");
            assert_eq!(decode_entry(&e, false), Err(WqeError::BadEntrySize(n)));
        }
        assert!(WqeError::BadEntrySize(96).to_string().contains("96 bytes"));
    }
    use proptest::prelude::*;

    fn base(op: WqeOp) -> WqeDesc {
        WqeDesc {
            op,
            req_id: 0x1234,
            req_id_64: false,
            phase: 1,
            comp_req: true,
            dest_qpn: 0x0102,
            ah: 0x0304,
            qkey: 0x0506_0708,
            high_pps: false,
        }
    }

    fn write_op(len: u32) -> WqeOp {
        WqeOp::RdmaWrite {
            remote: RemoteBuf {
                addr: 0xAABB_CCDD_1122_3344,
                rkey: 0xDEAD_BEEF,
                len,
            },
            local: LocalBuf {
                addr: 0x0000_7F00_0000_1000,
                lkey: 0x00AB_CDEF,
                len,
            },
        }
    }

    #[test]
    fn rdma_write_bytes_by_hand() {
        let b = encode(&base(write_op(4096)));
        assert_eq!(&b[0..2], &[0x34, 0x12]);
        assert_eq!(b[2], 0x82, "meta_desc | RDMA_WRITE");
        assert_eq!(b[3], 0x1D, "phase | first | last | comp_req");
        assert_eq!(&b[4..6], &[0x02, 0x01]);
        assert_eq!(&b[6..8], &[1, 0], "one descriptor");
        assert_eq!(&b[8..12], &[0; 4]);
        assert_eq!(&b[12..14], &[0x04, 0x03]);
        assert_eq!(&b[14..16], &[0, 0]);
        assert_eq!(&b[16..20], &[0x08, 0x07, 0x06, 0x05]);
        assert_eq!(&b[20..32], &[0; 12]);
        assert_eq!(&b[32..36], &4096u32.to_le_bytes());
        assert_eq!(&b[36..40], &0xDEAD_BEEFu32.to_le_bytes());
        assert_eq!(&b[40..44], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&b[44..48], &0xAABB_CCDDu32.to_le_bytes());
        assert_eq!(&b[48..52], &4096u32.to_le_bytes());
        assert_eq!(&b[52..56], &0x00AB_CDEFu32.to_le_bytes());
        assert_eq!(&b[56..60], &0x0000_1000u32.to_le_bytes());
        assert_eq!(&b[60..64], &0x0000_7F00u32.to_le_bytes());
    }

    #[test]
    fn req_id_64_goes_to_ext_words() {
        let mut d = base(write_op(8));
        d.req_id = 0x8877_6655_4433_2211;
        d.req_id_64 = true;
        let b = encode(&d);
        assert_eq!(&b[0..2], &[0x11, 0x22]);
        assert_eq!(&b[26..32], &[0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(decode_with(&b, true), Ok(d));
        // The same bytes on a queue without the capability are reserved-byte violations.
        assert_eq!(decode(&b), Err(WqeError::ReservedNonZero { offset: 26 }));
    }

    #[test]
    fn validate_rejects_what_decode_rejects() {
        let mut d = base(write_op(8));
        d.req_id = 0x1_0000;
        assert_eq!(validate(&d), Err(WqeError::ReqIdTooWide(0x1_0000)));
        assert_eq!(encode_checked(&d), Err(WqeError::ReqIdTooWide(0x1_0000)));
        let mut d = base(write_op(8));
        d.phase = 2;
        assert_eq!(validate(&d), Err(WqeError::PhaseOutOfRange(2)));
        let d = base(write_op(0));
        assert_eq!(validate(&d), Err(WqeError::ZeroLength { index: 0 }));
        assert_eq!(decode(&encode(&d)), Err(WqeError::ZeroLength { index: 0 }));
        let d = base(WqeOp::RdmaWriteImm {
            remote: RemoteBuf {
                addr: 1,
                rkey: 2,
                len: 0,
            },
            local: LocalBuf {
                addr: 3,
                lkey: 4,
                len: 0,
            },
            imm: 5,
        });
        assert_eq!(validate(&d), Ok(()));
        assert_eq!(decode(&encode(&d)), Ok(d));
        let mut d = base(write_op(8));
        if let WqeOp::RdmaWrite { local, .. } = &mut d.op {
            local.lkey = 0x0100_0000;
        }
        assert_eq!(
            validate(&d),
            Err(WqeError::LkeyTooWide {
                index: 0,
                lkey: 0x0100_0000
            })
        );
        let mut data = [0u8; INLINE_MAX];
        data[5] = 9;
        let d = base(WqeOp::Send {
            payload: SendPayload::Inline { len: 4, data },
            imm: None,
        });
        assert_eq!(validate(&d), Err(WqeError::ReservedNonZero { offset: 37 }));
    }

    #[test]
    fn inline_helpers() {
        assert!(SendPayload::inline(&[0u8; 33]).is_none());
        let p = SendPayload::inline(b"hello").unwrap();
        assert_eq!(p.inline_bytes(), Some(&b"hello"[..]));
        let d = base(WqeOp::Send {
            payload: p,
            imm: Some(7),
        });
        let b = encode(&d);
        assert_eq!(b[2], 0x80 | 0x20 | 0x10);
        assert_eq!(&b[6..8], &[5, 0]);
        assert_eq!(&b[32..37], b"hello");
        assert_eq!(decode(&b), Ok(d));
    }

    #[test]
    fn phase_and_slot() {
        assert_eq!(phase_for(0, 8), 0);
        assert_eq!(phase_for(7, 8), 0);
        assert_eq!(phase_for(8, 8), 1);
        assert_eq!(phase_for(16, 8), 0);
        assert_eq!(phase_for(5, 0), 0);
        assert_eq!(slot_for(9, 8), 1);
        assert_eq!(slot_for(u64::MAX, 1024), 1023);
        assert_eq!(slot_for(5, 0), 0);
    }

    #[test]
    fn error_display_is_specific() {
        let s = WqeError::LengthMismatch {
            local: 1,
            remote: 2,
        }
        .to_string();
        assert!(s.contains('1') && s.contains('2'), "{s}");
        assert_eq!(WqeError::UnknownOpType(3).to_string(), "unknown op type 3");
    }

    fn local_buf(allow_zero: bool) -> impl Strategy<Value = LocalBuf> {
        let min = u32::from(!allow_zero);
        (any::<u64>(), 0..=LKEY_MASK, min..=u32::MAX).prop_map(|(addr, lkey, len)| LocalBuf {
            addr,
            lkey,
            len,
        })
    }

    fn rdma_pair(allow_zero: bool) -> impl Strategy<Value = (RemoteBuf, LocalBuf)> {
        (local_buf(allow_zero), any::<u64>(), any::<u32>()).prop_map(|(local, addr, rkey)| {
            (
                RemoteBuf {
                    addr,
                    rkey,
                    len: local.len,
                },
                local,
            )
        })
    }

    fn payload() -> impl Strategy<Value = SendPayload> {
        prop_oneof![
            (local_buf(false), proptest::option::of(local_buf(false)))
                .prop_map(|(first, second)| SendPayload::Sgl { first, second }),
            proptest::collection::vec(any::<u8>(), 0..=INLINE_MAX)
                .prop_map(|v| SendPayload::inline(&v).unwrap()),
        ]
    }

    fn wqe_op() -> impl Strategy<Value = WqeOp> {
        prop_oneof![
            (payload(), proptest::option::of(any::<u32>()))
                .prop_map(|(payload, imm)| WqeOp::Send { payload, imm }),
            rdma_pair(false).prop_map(|(remote, local)| WqeOp::RdmaWrite { remote, local }),
            (rdma_pair(true), any::<u32>())
                .prop_map(|((remote, local), imm)| { WqeOp::RdmaWriteImm { remote, local, imm } }),
            rdma_pair(false).prop_map(|(remote, local)| WqeOp::RdmaRead { remote, local }),
        ]
    }

    prop_compose! {
        fn valid_desc()(
            op in wqe_op(),
            req_id_64 in any::<bool>(),
            id in any::<u64>(),
            phase in 0u8..=1,
            comp_req in any::<bool>(),
            dest_qpn in any::<u16>(),
            ah in any::<u16>(),
            qkey in any::<u32>(),
            high_pps in any::<bool>(),
        ) -> WqeDesc {
            WqeDesc {
                op,
                req_id: if req_id_64 { id } else { id & REQ_ID_16_MAX },
                req_id_64,
                phase,
                comp_req,
                dest_qpn,
                ah,
                qkey,
                high_pps,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn encode_decode_identity(d in valid_desc()) {
            prop_assert_eq!(validate(&d), Ok(()));
            let b = encode(&d);
            prop_assert_eq!(decode_with(&b, d.req_id_64), Ok(d));
            // The raw view round-trips the bytes exactly.
            prop_assert_eq!(TxWqe::from_bytes(&b).to_bytes(), b);
        }

        #[test]
        fn decode_never_panics_and_is_stable(
            v in proptest::collection::vec(any::<u8>(), WQE_SIZE),
            req_id_64 in any::<bool>(),
        ) {
            let mut b = [0u8; WQE_SIZE];
            b.copy_from_slice(&v);
            if let Ok(d) = decode_with(&b, req_id_64) {
                // Accepted bytes are canonical: they re-encode to themselves.
                prop_assert_eq!(validate(&d), Ok(()));
                prop_assert_eq!(encode(&d), b);
            }
        }

        #[test]
        fn entries_round_trip_and_reject_a_stale_tail(
            d in valid_desc(),
            wide in any::<bool>(),
            fill in 1u8..=255,
            stale in WQE_SIZE..WQE_SIZE_128,
        ) {
            let size = if wide { WQE_SIZE_128 } else { WQE_SIZE };
            let mut e = vec![fill; size];
            let b = encode(&d);
            prop_assert_eq!(store_entry(&mut e, &b), Ok(()));
            prop_assert_eq!(&e[..WQE_SIZE], &b[..]);
            prop_assert!(e[WQE_SIZE..].iter().all(|&x| x == 0));
            prop_assert_eq!(decode_entry(&e, d.req_id_64), Ok(d));
            if wide {
                e[stale] = fill;
                prop_assert_eq!(
                    decode_entry(&e, d.req_id_64),
                    Err(WqeError::ReservedNonZero { offset: stale as u8 })
                );
            }
        }

        #[test]
        fn mutated_valid_wqe_decodes_consistently(
            d in valid_desc(),
            idx in 0usize..WQE_SIZE,
            bit in 0u8..8,
        ) {
            let mut b = encode(&d);
            b[idx] ^= 1 << bit;
            if let Ok(d2) = decode_with(&b, d.req_id_64) {
                prop_assert_eq!(encode(&d2), b);
                prop_assert_ne!(d2, d);
            }
        }
    }
}
