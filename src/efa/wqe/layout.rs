//! The `#[repr(C)]` mirror of the 64-byte TX WQE and its descriptors, with their conversions
//! to and from the little-endian bytes the device reads.

use core::mem::{align_of, offset_of, size_of};

use super::{DATA_OFFSET, SEND_MAX_SGES, WQE_SIZE};
use crate::efa::le::{
    array_at, get_u16, get_u32, put_u16, put_u32, req_id_from_words, words_from_bytes,
    words_to_bytes,
};

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

impl BufDesc {
    /// Reads a descriptor from 16 little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let [length, lkey, addr_lo, addr_hi] = words_from_bytes(b);
        BufDesc {
            length,
            lkey,
            addr_lo,
            addr_hi,
        }
    }

    /// Writes the descriptor as 16 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        words_to_bytes([self.length, self.lkey, self.addr_lo, self.addr_hi])
    }

    /// The 64-bit buffer address.
    pub fn addr(&self) -> u64 {
        join_addr(self.addr_lo, self.addr_hi)
    }
}

impl RemoteMemDesc {
    /// Reads a descriptor from 16 little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let [length, rkey, addr_lo, addr_hi] = words_from_bytes(b);
        RemoteMemDesc {
            length,
            rkey,
            addr_lo,
            addr_hi,
        }
    }

    /// Writes the descriptor as 16 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        words_to_bytes([self.length, self.rkey, self.addr_lo, self.addr_hi])
    }

    /// The 64-bit remote address.
    pub fn addr(&self) -> u64 {
        join_addr(self.addr_lo, self.addr_hi)
    }
}

/// The 64-bit address a descriptor holds as two 32-bit halves.
fn join_addr(lo: u32, hi: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

impl TxWqe {
    /// Reads a WQE from its 64 little-endian bytes (no validation).
    pub fn from_bytes(b: &[u8; WQE_SIZE]) -> Self {
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
                reserved2: array_at(b, offset_of!(TxMetaDesc, reserved2)),
                req_id_ex: [get_u16(b, 26), get_u16(b, 28), get_u16(b, 30)],
            },
            data: array_at(b, DATA_OFFSET),
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
            BufDesc::from_bytes(&array_at(&self.data, 0)),
            BufDesc::from_bytes(&array_at(&self.data, 16)),
        ]
    }

    /// Views the data area as an RDMA request.
    pub fn rdma(&self) -> RdmaReq {
        RdmaReq {
            remote: RemoteMemDesc::from_bytes(&array_at(&self.data, 0)),
            local: BufDesc::from_bytes(&array_at(&self.data, 16)),
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
        if req_id_64 {
            req_id_from_words(self.meta.req_id, self.meta.req_id_ex)
        } else {
            u64::from(self.meta.req_id)
        }
    }
}
