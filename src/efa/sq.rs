//! The send-queue format a provider's query reports, checked against what this library encodes:
//! entry size, request-id width and inline room. A queue reporting anything else is refused with
//! an error that names it, never written with WQEs of a format the library does not know.
//!
//! Sources:
//! - `fi_efa_wq_attr.caps` and `FI_EFA_WQ_CAPS_64_BIT_REQ_ID = 1 << 0`: libfabric
//!   `prov/efa/src/fi_ext_efa.h` at commit c7f533f793bc6cf0602e776440727962018a2ab0 ("prov/efa:
//!   Add support for EFA WQ caps in query domain"), on main after v2.6.0 (main at
//!   af8ddbe92f033b7deb9c4e4f47197d1fd4bcf150 is 2.7.0a1; v2.6.0 has no `caps`). `efa_domain.c`
//!   there sets that bit exactly when rdma-core's `efadv_query_qp_wqs` reports
//!   `EFADV_WQ_CAPS_64_BIT_REQ_ID`, and no other bit.
//! - What the capability changes: rdma-core commits f655e05dea2d76720519bafaceff3a64f2014f8e (the
//!   WQE meta descriptor's bytes 26-31 become `req_id_ex`, bits 16-63 of the request id) and
//!   668d06863f43c6f0a5177bb9093c83ce53756666 (the send completion's bytes 6-11 become
//!   `req_id_ex`; every CQ of a device with the capability is created with it). rdma-core turns
//!   the capability on for every QP of such a device, whatever the libfabric version, so a
//!   library that cannot see `caps` (2.6.0 and older) may still be on such a queue: this library
//!   writes zero into `req_id_ex` either way, which both modes accept, and so reads zero back.
//! - Entry sizes 64 and 128 and the inline room: see [`super::wqe::wide`].
use core::fmt;

use super::cqe::{RX_CQE_EX_SIZE, TX_CQE_SIZE};
use super::wqe::{INLINE_MAX, INLINE_MAX_128, WQE_SIZE, WQE_SIZE_128};

/// `FI_EFA_WQ_CAPS_64_BIT_REQ_ID`: request ids of 64 bits in the WQE and the send completion.
pub const WQ_CAPS_64_BIT_REQ_ID: u16 = 1 << 0;
/// Every `fi_efa_wq_caps` bit this library handles.
pub const WQ_CAPS_KNOWN: u16 = WQ_CAPS_64_BIT_REQ_ID;
/// First libfabric version (`FI_VERSION(2, 7)`) that creates wide send queues, and creates them
/// with inline RDMA write where the device has RDMA write (libfabric commit
/// a12b68a269b50755caa534de31ea8cf11c28cc9b, on main after v2.6.0).
pub const WIDE_INLINE_WRITE_MIN_VERSION: u32 = (2 << 16) | 7;

/// Why a reported send queue is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqFormatError {
    /// Entries are neither 64 nor 128 bytes.
    EntrySize(u32),
    /// The entry count is zero or not a power of two.
    Entries(u32),
    /// Completion entries are neither 16 nor 32 bytes.
    CqEntrySize(u32),
    /// `caps` has bits this library does not handle (`unknown`).
    UnknownCaps {
        /// The whole field.
        caps: u16,
        /// The bits outside [`WQ_CAPS_KNOWN`].
        unknown: u16,
    },
}

impl fmt::Display for SqFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqFormatError::EntrySize(n) => write!(
                f,
                "send-queue entries of {n} bytes: this library writes {WQE_SIZE}- and \
                 {WQE_SIZE_128}-byte entries only"
            ),
            SqFormatError::CqEntrySize(n) => write!(
                f,
                "completion entries of {n} bytes: this library reads {TX_CQE_SIZE}- and \
                 {RX_CQE_EX_SIZE}-byte entries only"
            ),
            SqFormatError::Entries(n) => write!(
                f,
                "a send queue of {n} entries: expected a non-zero power of two"
            ),
            SqFormatError::UnknownCaps { caps, unknown } => write!(
                f,
                "the send queue reports capability bits {caps:#x}, of which {unknown:#x} this \
                 library does not handle (it knows FI_EFA_WQ_CAPS_64_BIT_REQ_ID = \
                 {WQ_CAPS_64_BIT_REQ_ID:#x} only); refused rather than written with WQEs of a \
                 format it does not know"
            ),
        }
    }
}

impl std::error::Error for SqFormatError {}

/// A send queue's format, as the library will write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqFormat {
    /// Bytes per entry (64 or 128).
    pub entry_size: usize,
    /// Entries (a power of two).
    pub entries: u32,
    /// Request ids of 64 bits: WQE bytes 26-31 and send-completion bytes 6-11 carry bits 16-63.
    pub req_id_64: bool,
    /// An RDMA write may carry its payload inline (wide entries of a libfabric that creates them
    /// with inline write).
    pub rdma_inline: bool,
}

impl SqFormat {
    /// Checks a queue as `query_qp_wqs` reported it (`caps` zero where the library predates the
    /// field) under libfabric version `lib_version` (`fi_version()`).
    pub fn from_query(
        entry_size: u32,
        entries: u32,
        caps: u16,
        lib_version: u32,
    ) -> Result<SqFormat, SqFormatError> {
        let size = entry_size as usize;
        if size != WQE_SIZE && size != WQE_SIZE_128 {
            return Err(SqFormatError::EntrySize(entry_size));
        }
        if !entries.is_power_of_two() {
            return Err(SqFormatError::Entries(entries));
        }
        let unknown = caps & !WQ_CAPS_KNOWN;
        if unknown != 0 {
            return Err(SqFormatError::UnknownCaps { caps, unknown });
        }
        Ok(SqFormat {
            entry_size: size,
            entries,
            req_id_64: caps & WQ_CAPS_64_BIT_REQ_ID != 0,
            rdma_inline: size == WQE_SIZE_128 && lib_version >= WIDE_INLINE_WRITE_MIN_VERSION,
        })
    }

    /// Largest inline SEND payload: 32 bytes, 80 on wide entries.
    pub fn send_inline_max(&self) -> usize {
        if self.entry_size == WQE_SIZE_128 {
            INLINE_MAX_128
        } else {
            INLINE_MAX
        }
    }

    /// Largest inline RDMA write payload: 0 unless [`SqFormat::rdma_inline`], else 80 bytes.
    pub fn rdma_inline_max(&self) -> usize {
        if self.rdma_inline {
            INLINE_MAX_128
        } else {
            0
        }
    }
}

/// Checks a completion ring as `query_cq` reported it: 16- or 32-byte entries (efa_io_defs.h:
/// `efa_io_tx_cdesc` / `efa_io_rx_cdesc`, `efa_io_rx_cdesc_ex`), a non-zero power-of-two count.
/// A completion of 64-bit request ids keeps those sizes (rdma-core 668d06863f43: `req_id_ex` takes
/// bytes 6-11 of the 16-byte send completion).
pub fn check_cq(entry_size: u32, entries: u32) -> Result<(), SqFormatError> {
    let size = entry_size as usize;
    if size != TX_CQE_SIZE && size != RX_CQE_EX_SIZE {
        return Err(SqFormatError::CqEntrySize(entry_size));
    }
    if !entries.is_power_of_two() {
        return Err(SqFormatError::Entries(entries));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_6: u32 = (2 << 16) | 6;
    const V2_7: u32 = (2 << 16) | 7;

    #[test]
    fn the_formats_this_library_writes() {
        let f = SqFormat::from_query(64, 256, 0, V2_6).unwrap();
        assert_eq!(
            (f.entry_size, f.req_id_64, f.rdma_inline),
            (64, false, false)
        );
        assert_eq!((f.send_inline_max(), f.rdma_inline_max()), (32, 0));
        let f = SqFormat::from_query(128, 512, WQ_CAPS_64_BIT_REQ_ID, V2_7).unwrap();
        assert_eq!(
            (f.entry_size, f.req_id_64, f.rdma_inline),
            (128, true, true)
        );
        assert_eq!((f.send_inline_max(), f.rdma_inline_max()), (80, 80));
        // A wide queue under a library that does not create them with inline write.
        let f = SqFormat::from_query(128, 512, 0, V2_6).unwrap();
        assert_eq!((f.send_inline_max(), f.rdma_inline_max()), (80, 0));
    }

    #[test]
    fn what_the_library_does_not_handle_is_refused_by_name() {
        for (size, n, caps, want) in [
            (256, 64, 0, SqFormatError::EntrySize(256)),
            (32, 64, 0, SqFormatError::EntrySize(32)),
            (64, 0, 0, SqFormatError::Entries(0)),
            (64, 100, 0, SqFormatError::Entries(100)),
            (
                64,
                64,
                0b10,
                SqFormatError::UnknownCaps {
                    caps: 0b10,
                    unknown: 0b10,
                },
            ),
            (
                128,
                64,
                0x8001,
                SqFormatError::UnknownCaps {
                    caps: 0x8001,
                    unknown: 0x8000,
                },
            ),
        ] {
            let e = SqFormat::from_query(size, n, caps, V2_7).unwrap_err();
            assert_eq!(e, want);
            assert!(!e.to_string().is_empty());
        }
        let e = SqFormat::from_query(64, 64, 2, V2_7)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0x2") && e.contains("does not handle"), "{e}");
    }
}
