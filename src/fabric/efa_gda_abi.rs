//! `#[repr(C)]` mirrors of libfabric's EFA GPU-direct-async extension (`fi_ext_efa.h`).
//!
//! The extension is opened with
//! `fi_open_ops(&domain->fid, FI_EFA_GDA_OPS, 0, &ops, NULL)` on an `efa-direct` domain
//! and hands back a pointer to a [`FiEfaOpsGda`] table owned by the provider. Other
//! providers, and `efa` (RDM), answer `-FI_EOPNOTSUPP`.
//!
//! Version history of the table, as published in libfabric releases:
//! - 2.2.0: the first four calls (without `get_mr_lkey`) were part of the domain ops
//!   table `"efa domain ops"`, after `query_mr`; that layout is not described here.
//! - 2.3.0: the separate `"efa gda ops"` table with `query_addr`, `query_qp_wqs`,
//!   `query_cq`, `cq_open_ext`, `get_mr_lkey` (40 bytes).
//! - 2.6.0: `cntr_open_ext` appended (48 bytes), with [`FiEfaMemoryLocation`] and
//!   [`FiEfaCompCntrInitAttr`] (libfabric commit 5a4ba9b282f9d2fa3d8e045038656d4fcf9cf70e).
//! - the 2.7.0 line (main, `configure.ac` 2.7.0a1): [`FiEfaWqAttr::caps`] with
//!   [`FI_EFA_WQ_CAPS_64_BIT_REQ_ID`] (libfabric commit c7f533f793bc6cf0602e776440727962018a2ab0).
//!
//! Every size, offset and constant here is compared with the real `prov/efa/src/fi_ext_efa.h` of
//! v2.5.1, v2.6.0 and main (2.7.0a1) by `tests/efa_ext_header.rs` (numbers recorded in
//! `tests/golden/libfabric_layouts.txt`; see `docs/efa-hardware.md`).
//!
//! libfabric objects appear only behind pointers; they are declared here as opaque
//! types so this module depends on nothing. Cast to and from the real bindings at the
//! call site.

use core::ffi::{c_int, c_void, CStr};
use core::marker::{PhantomData, PhantomPinned};
use core::mem::{offset_of, size_of};

/// Name passed to `fi_open_ops` to obtain the GDA ops table.
pub const FI_EFA_GDA_OPS: &str = "efa gda ops";
/// [`FI_EFA_GDA_OPS`] as a NUL-terminated C string.
pub const FI_EFA_GDA_OPS_CSTR: &CStr = c"efa gda ops";

/// libfabric's `FI_VERSION(major, minor)` encoding: `(major << 16) | minor`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// First libfabric version that serves [`FI_EFA_GDA_OPS`].
pub const FI_EFA_GDA_OPS_MIN_VERSION: u32 = fi_version(2, 3);
/// First libfabric version whose table has [`FiEfaOpsGda::cntr_open_ext`].
pub const FI_EFA_CNTR_OPEN_EXT_MIN_VERSION: u32 = fi_version(2, 6);

/// True when the table of libfabric version `version` (from `fi_version()`) has the
/// `cntr_open_ext` slot. Older tables are 40 bytes long: do not read the sixth slot.
pub const fn has_cntr_open_ext(version: u32) -> bool {
    version >= FI_EFA_CNTR_OPEN_EXT_MIN_VERSION
}

/// Size of the table in libfabric 2.3.0 to 2.5.x (five entries).
pub const FI_EFA_OPS_GDA_SIZE_V2_3: usize = 5 * size_of::<usize>();

/// `fi_efa_wq_caps` bit 0: the send queue carries 64-bit request ids in the WQE and CQE.
pub const FI_EFA_WQ_CAPS_64_BIT_REQ_ID: u16 = 1 << 0;
/// `fi_efa_cq_init_attr.flags` bit 0: the CQ ring lives in caller memory given as a dmabuf.
pub const FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF: u64 = 1 << 0;
/// `fi_efa_memory_location_type`: plain virtual address.
pub const FI_EFA_MEMORY_LOCATION_VA: u8 = 0;
/// `fi_efa_memory_location_type`: dmabuf file descriptor plus offset.
pub const FI_EFA_MEMORY_LOCATION_DMABUF: u8 = 1;
/// `fi_efa_comp_cntr_init_attr.flags` bit 0: the completion counter lives in caller memory.
pub const FI_EFA_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM: u32 = 1 << 0;
/// `fi_efa_comp_cntr_init_attr.flags` bit 1: the error counter lives in caller memory.
pub const FI_EFA_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM: u32 = 1 << 1;

/// libfabric's `fi_addr_t`.
pub type FiAddr = u64;

macro_rules! opaque {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}

opaque!(
    /// Opaque `struct fid_ep`.
    FidEp,
    /// Opaque `struct fid_cq`.
    FidCq,
    /// Opaque `struct fid_domain`.
    FidDomain,
    /// Opaque `struct fid_mr`.
    FidMr,
    /// Opaque `struct fid_cntr`.
    FidCntr,
    /// Opaque `struct fi_cq_attr`.
    FiCqAttr,
    /// Opaque `struct fi_cntr_attr`.
    FiCntrAttr,
);

/// `struct fi_efa_wq_attr`: where a work queue lives and how to ring it (32 bytes).
///
/// Zero the struct before the query: releases up to 2.6.0 have no `caps` field, and the
/// provider clears the whole struct (including the padding where `caps` now sits:
/// `efa_domain_query_qp_wqs` memsets `sq_attr` and `rq_attr`, v2.6.0 `prov/efa/src/efa_domain.c`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaWqAttr {
    /// Ring buffer (host memory, write-combined for the SQ).
    pub buffer: *mut u8,
    /// Size of one entry (SQ: 64, or 128 with wide WQEs).
    pub entry_size: u32,
    /// Number of entries (a power of two).
    pub num_entries: u32,
    /// Doorbell register (MMIO); the producer counter is written here.
    pub doorbell: *mut u32,
    /// Ring the doorbell at least every this many WQEs.
    pub max_batch: u32,
    /// `fi_efa_wq_caps` bits; present from the 2.7.0 line on (zero on older releases, where the
    /// provider leaves this padding as the caller zeroed it). Checked by `efa::sq::SqFormat`.
    pub caps: u16,
}

/// `struct fi_efa_cq_attr`: where a completion queue lives (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaCqAttr {
    /// Ring buffer.
    pub buffer: *mut u8,
    /// Size of one entry (16 or 32).
    pub entry_size: u32,
    /// Number of entries.
    pub num_entries: u32,
}

/// The `ext_mem_dmabuf` member of [`FiEfaCqInitAttr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaCqExtMemDmabuf {
    /// Caller's mapping of the memory.
    pub buffer: *mut u8,
    /// Length in bytes.
    pub length: u64,
    /// Offset of the ring within the dmabuf.
    pub offset: u64,
    /// dmabuf file descriptor.
    pub fd: u32,
}

/// `struct fi_efa_cq_init_attr`: extra arguments of `cq_open_ext` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaCqInitAttr {
    /// `FI_EFA_CQ_INIT_FLAGS_*` bits.
    pub flags: u64,
    /// External ring memory, used with [`FI_EFA_CQ_INIT_FLAGS_EXT_MEM_DMABUF`].
    pub ext_mem_dmabuf: FiEfaCqExtMemDmabuf,
}

/// The `dmabuf` member of [`FiEfaMemoryLocation`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FiEfaMemoryLocationDmabuf {
    /// Offset within the dmabuf.
    pub offset: u64,
    /// dmabuf file descriptor.
    pub fd: i32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `struct fi_efa_memory_location` (libfabric >= 2.6.0): a VA or a dmabuf location (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaMemoryLocation {
    /// Address (for [`FI_EFA_MEMORY_LOCATION_VA`]).
    pub ptr: *mut u8,
    /// dmabuf location (for [`FI_EFA_MEMORY_LOCATION_DMABUF`]).
    pub dmabuf: FiEfaMemoryLocationDmabuf,
    /// `FI_EFA_MEMORY_LOCATION_*`.
    pub type_: u8,
    /// Reserved, zero.
    pub reserved: [u8; 7],
}

/// `struct fi_efa_comp_cntr_init_attr` (libfabric >= 2.6.0): extra arguments of
/// `cntr_open_ext` (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaCompCntrInitAttr {
    /// Reserved for extensions, zero.
    pub comp_mask: u64,
    /// `FI_EFA_COMP_CNTR_INIT_WITH_*` bits.
    pub flags: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Memory of the completion counter.
    pub comp_cntr_ext_mem: FiEfaMemoryLocation,
    /// Memory of the error counter.
    pub err_cntr_ext_mem: FiEfaMemoryLocation,
}

/// `query_addr(ep, addr, *ahn, *remote_qpn, *remote_qkey)`: address handle, QP number and
/// queue key of peer `addr`. Since 2.3.0.
pub type QueryAddrFn = unsafe extern "C" fn(
    ep: *mut FidEp,
    addr: FiAddr,
    ahn: *mut u16,
    remote_qpn: *mut u16,
    remote_qkey: *mut u32,
) -> c_int;

/// `query_qp_wqs(ep, *sq_attr, *rq_attr)`: the endpoint's send and receive rings. Since 2.3.0.
pub type QueryQpWqsFn = unsafe extern "C" fn(
    ep: *mut FidEp,
    sq_attr: *mut FiEfaWqAttr,
    rq_attr: *mut FiEfaWqAttr,
) -> c_int;

/// `query_cq(cq, *cq_attr)`: the completion ring of a CQ. Since 2.3.0.
pub type QueryCqFn = unsafe extern "C" fn(cq: *mut FidCq, cq_attr: *mut FiEfaCqAttr) -> c_int;

/// `cq_open_ext(domain, *attr, *efa_attr, **cq, context)`: open a CQ, optionally on
/// caller memory. Since 2.3.0.
pub type CqOpenExtFn = unsafe extern "C" fn(
    domain: *mut FidDomain,
    attr: *mut FiCqAttr,
    efa_attr: *mut FiEfaCqInitAttr,
    cq: *mut *mut FidCq,
    context: *mut c_void,
) -> c_int;

/// `get_mr_lkey(mr)`: the device lkey of a registration. Since 2.3.0.
pub type GetMrLkeyFn = unsafe extern "C" fn(mr: *mut FidMr) -> u64;

/// `cntr_open_ext(domain, *attr, **cntr, context, *efa_attr)`: open a hardware completion
/// counter, optionally on caller memory. Since 2.6.0.
pub type CntrOpenExtFn = unsafe extern "C" fn(
    domain: *mut FidDomain,
    attr: *mut FiCntrAttr,
    cntr: *mut *mut FidCntr,
    context: *mut c_void,
    efa_attr: *mut FiEfaCompCntrInitAttr,
) -> c_int;

/// `struct fi_efa_ops_gda`: the table `fi_open_ops(FI_EFA_GDA_OPS)` returns (48 bytes in
/// 2.6.0 and later, 40 bytes before; see [`has_cntr_open_ext`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEfaOpsGda {
    /// Since 2.3.0.
    pub query_addr: Option<QueryAddrFn>,
    /// Since 2.3.0.
    pub query_qp_wqs: Option<QueryQpWqsFn>,
    /// Since 2.3.0.
    pub query_cq: Option<QueryCqFn>,
    /// Since 2.3.0.
    pub cq_open_ext: Option<CqOpenExtFn>,
    /// Since 2.3.0.
    pub get_mr_lkey: Option<GetMrLkeyFn>,
    /// Since 2.6.0; absent from (and must not be read in) older tables.
    pub cntr_open_ext: Option<CntrOpenExtFn>,
}

#[cfg(target_pointer_width = "64")]
mod layout {
    use super::*;

    const _: () = assert!(size_of::<FiEfaWqAttr>() == 32);
    const _: () = assert!(offset_of!(FiEfaWqAttr, buffer) == 0);
    const _: () = assert!(offset_of!(FiEfaWqAttr, entry_size) == 8);
    const _: () = assert!(offset_of!(FiEfaWqAttr, num_entries) == 12);
    const _: () = assert!(offset_of!(FiEfaWqAttr, doorbell) == 16);
    const _: () = assert!(offset_of!(FiEfaWqAttr, max_batch) == 24);
    const _: () = assert!(offset_of!(FiEfaWqAttr, caps) == 28);

    const _: () = assert!(size_of::<FiEfaCqAttr>() == 16);
    const _: () = assert!(offset_of!(FiEfaCqAttr, buffer) == 0);
    const _: () = assert!(offset_of!(FiEfaCqAttr, entry_size) == 8);
    const _: () = assert!(offset_of!(FiEfaCqAttr, num_entries) == 12);

    const _: () = assert!(size_of::<FiEfaCqExtMemDmabuf>() == 32);
    const _: () = assert!(offset_of!(FiEfaCqExtMemDmabuf, buffer) == 0);
    const _: () = assert!(offset_of!(FiEfaCqExtMemDmabuf, length) == 8);
    const _: () = assert!(offset_of!(FiEfaCqExtMemDmabuf, offset) == 16);
    const _: () = assert!(offset_of!(FiEfaCqExtMemDmabuf, fd) == 24);
    const _: () = assert!(size_of::<FiEfaCqInitAttr>() == 40);
    const _: () = assert!(offset_of!(FiEfaCqInitAttr, flags) == 0);
    const _: () = assert!(offset_of!(FiEfaCqInitAttr, ext_mem_dmabuf) == 8);

    const _: () = assert!(size_of::<FiEfaMemoryLocationDmabuf>() == 16);
    const _: () = assert!(size_of::<FiEfaMemoryLocation>() == 32);
    const _: () = assert!(offset_of!(FiEfaMemoryLocation, ptr) == 0);
    const _: () = assert!(offset_of!(FiEfaMemoryLocation, dmabuf) == 8);
    const _: () = assert!(offset_of!(FiEfaMemoryLocationDmabuf, offset) == 0);
    const _: () = assert!(offset_of!(FiEfaMemoryLocationDmabuf, fd) == 8);
    const _: () = assert!(offset_of!(FiEfaMemoryLocationDmabuf, reserved) == 12);
    const _: () = assert!(offset_of!(FiEfaMemoryLocation, type_) == 24);
    const _: () = assert!(offset_of!(FiEfaMemoryLocation, reserved) == 25);

    const _: () = assert!(size_of::<FiEfaCompCntrInitAttr>() == 80);
    const _: () = assert!(offset_of!(FiEfaCompCntrInitAttr, comp_mask) == 0);
    const _: () = assert!(offset_of!(FiEfaCompCntrInitAttr, flags) == 8);
    const _: () = assert!(offset_of!(FiEfaCompCntrInitAttr, reserved) == 12);
    const _: () = assert!(offset_of!(FiEfaCompCntrInitAttr, comp_cntr_ext_mem) == 16);
    const _: () = assert!(offset_of!(FiEfaCompCntrInitAttr, err_cntr_ext_mem) == 48);

    const _: () = assert!(size_of::<FiEfaOpsGda>() == 48);
    const _: () = assert!(offset_of!(FiEfaOpsGda, query_addr) == 0);
    const _: () = assert!(offset_of!(FiEfaOpsGda, query_qp_wqs) == 8);
    const _: () = assert!(offset_of!(FiEfaOpsGda, query_cq) == 16);
    const _: () = assert!(offset_of!(FiEfaOpsGda, cq_open_ext) == 24);
    const _: () = assert!(offset_of!(FiEfaOpsGda, get_mr_lkey) == 32);
    const _: () = assert!(offset_of!(FiEfaOpsGda, cntr_open_ext) == 40);
    const _: () = assert!(FI_EFA_OPS_GDA_SIZE_V2_3 == 40);
}

impl FiEfaWqAttr {
    /// An all-zero attribute block, ready to be filled by `query_qp_wqs`.
    pub const fn zeroed() -> Self {
        FiEfaWqAttr {
            buffer: core::ptr::null_mut(),
            entry_size: 0,
            num_entries: 0,
            doorbell: core::ptr::null_mut(),
            max_batch: 0,
            caps: 0,
        }
    }

    /// True when the queue carries 64-bit request ids ([`FI_EFA_WQ_CAPS_64_BIT_REQ_ID`]).
    pub const fn has_64_bit_req_id(&self) -> bool {
        self.caps & FI_EFA_WQ_CAPS_64_BIT_REQ_ID != 0
    }
}

impl FiEfaCqAttr {
    /// An all-zero attribute block, ready to be filled by `query_cq`.
    pub const fn zeroed() -> Self {
        FiEfaCqAttr {
            buffer: core::ptr::null_mut(),
            entry_size: 0,
            num_entries: 0,
        }
    }
}

impl FiEfaCqInitAttr {
    /// No flags: the provider allocates the ring.
    pub const fn zeroed() -> Self {
        FiEfaCqInitAttr {
            flags: 0,
            ext_mem_dmabuf: FiEfaCqExtMemDmabuf {
                buffer: core::ptr::null_mut(),
                length: 0,
                offset: 0,
                fd: 0,
            },
        }
    }
}

impl FiEfaMemoryLocation {
    /// An all-zero location (type VA, null pointer).
    pub const fn zeroed() -> Self {
        FiEfaMemoryLocation {
            ptr: core::ptr::null_mut(),
            dmabuf: FiEfaMemoryLocationDmabuf {
                offset: 0,
                fd: 0,
                reserved: 0,
            },
            type_: FI_EFA_MEMORY_LOCATION_VA,
            reserved: [0; 7],
        }
    }
}

impl FiEfaCompCntrInitAttr {
    /// No flags: the provider allocates both counters.
    pub const fn zeroed() -> Self {
        FiEfaCompCntrInitAttr {
            comp_mask: 0,
            flags: 0,
            reserved: 0,
            comp_cntr_ext_mem: FiEfaMemoryLocation::zeroed(),
            err_cntr_ext_mem: FiEfaMemoryLocation::zeroed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions() {
        assert_eq!(FI_EFA_GDA_OPS_CSTR.to_str(), Ok(FI_EFA_GDA_OPS));
        assert_eq!(FI_EFA_GDA_OPS_CSTR.to_bytes_with_nul().len(), 12);
        assert_eq!(fi_version(2, 6), 0x0002_0006);
        assert!(!has_cntr_open_ext(fi_version(2, 5)));
        assert!(has_cntr_open_ext(fi_version(2, 6)));
        assert!(has_cntr_open_ext(fi_version(3, 0)));
        assert!(!has_cntr_open_ext(FI_EFA_GDA_OPS_MIN_VERSION));
    }

    #[test]
    fn caps_bit() {
        let mut a = FiEfaWqAttr::zeroed();
        assert!(!a.has_64_bit_req_id());
        a.caps = FI_EFA_WQ_CAPS_64_BIT_REQ_ID;
        assert!(a.has_64_bit_req_id());
    }

    unsafe extern "C" fn fake_lkey(_mr: *mut FidMr) -> u64 {
        0x00AB_CDEF
    }

    #[test]
    fn table_slots_are_nullable_pointers() {
        let t = FiEfaOpsGda {
            query_addr: None,
            query_qp_wqs: None,
            query_cq: None,
            cq_open_ext: None,
            get_mr_lkey: Some(fake_lkey),
            cntr_open_ext: None,
        };
        let f = t.get_mr_lkey.expect("slot set");
        // SAFETY: the fake ignores its argument.
        assert_eq!(unsafe { f(core::ptr::null_mut()) }, 0x00AB_CDEF);
        assert_eq!(size_of::<Option<GetMrLkeyFn>>(), size_of::<usize>());
    }
}
