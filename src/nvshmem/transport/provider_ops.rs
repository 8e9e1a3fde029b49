//! Every raw libfabric constant the transport uses, in one place: AMO op and datatype mapping,
//! EAGAIN, FI_INJECT and FI_DELIVERY_COMPLETE.
use super::abi::amo;
use super::Transport;
use crate::fabric::{sys, Error as FabricError};

/// A provider atomic: libfabric's op and datatype for one NVSHMEM AMO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProviderAmo {
    pub(super) op: sys::fi_op,
    pub(super) datatype: sys::fi_datatype,
}

/// Maps an NVSHMEM AMO to a libfabric op and datatype.
pub(super) fn provider_op(opc: i32, elembytes: i32) -> Option<ProviderAmo> {
    let datatype = if elembytes == 4 {
        sys::fi_datatype_FI_UINT32
    } else {
        sys::fi_datatype_FI_UINT64
    };
    let op = match opc {
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => sys::fi_op_FI_ATOMIC_WRITE,
        amo::INC | amo::ADD | amo::SIGNAL_ADD | amo::FETCH_INC | amo::FETCH_ADD => {
            sys::fi_op_FI_SUM
        }
        amo::AND | amo::FETCH_AND => sys::fi_op_FI_BAND,
        amo::OR | amo::FETCH_OR => sys::fi_op_FI_BOR,
        amo::XOR | amo::FETCH_XOR => sys::fi_op_FI_BXOR,
        amo::FETCH => sys::fi_op_FI_ATOMIC_READ,
        amo::COMPARE_SWAP => sys::fi_op_FI_CSWAP,
        _ => return None,
    };
    Some(ProviderAmo { op, datatype })
}

/// The "try again" error (`-FI_EAGAIN`) for a send that found no free context.
pub(super) fn again(what: &str) -> FabricError {
    FabricError::from_ret(-(sys::FI_EAGAIN as i64), what)
}

impl Transport {
    /// Flags of a transmit operation: FI_DELIVERY_COMPLETE where the provider has it, so a
    /// completed put is visible at the target.
    pub(super) fn tx_flags(&self) -> u64 {
        if self.info.delivery_complete() {
            sys::FI_DELIVERY_COMPLETE as u64
        } else {
            0
        }
    }

    /// Flags of an injected put (the provider copies the source before returning).
    pub(super) fn inject_flags(&self) -> u64 {
        sys::FI_INJECT as u64 | self.tx_flags()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ops_cover_every_code() {
        for opc in amo::INC..=amo::SIGNAL_ADD {
            assert!(provider_op(opc, 8).is_some(), "op {opc}");
        }
        for opc in amo::FETCH..=amo::COMPARE_SWAP {
            assert!(provider_op(opc, 4).is_some(), "op {opc}");
        }
        assert!(provider_op(amo::ACK, 8).is_none());
    }
}
