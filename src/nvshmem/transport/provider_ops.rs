//! The transport's mapping onto libfabric's typed names, in one place: AMO op and datatype,
//! EAGAIN, INJECT and DELIVERY_COMPLETE.
use super::abi::amo;
use super::Transport;
use crate::fabric::{errno, flags, AtomicOp, Datatype, Error as FabricError};

/// A provider atomic: libfabric's op and datatype for one NVSHMEM AMO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProviderAmo {
    pub(super) op: AtomicOp,
    pub(super) datatype: Datatype,
}

/// Maps an NVSHMEM AMO to a libfabric op and datatype.
pub(super) fn provider_op(opc: i32, elembytes: i32) -> Option<ProviderAmo> {
    let datatype = if elembytes == 4 {
        Datatype::U32
    } else {
        Datatype::U64
    };
    let op = match opc {
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => AtomicOp::Write,
        amo::INC | amo::ADD | amo::SIGNAL_ADD | amo::FETCH_INC | amo::FETCH_ADD => AtomicOp::Sum,
        amo::AND | amo::FETCH_AND => AtomicOp::Band,
        amo::OR | amo::FETCH_OR => AtomicOp::Bor,
        amo::XOR | amo::FETCH_XOR => AtomicOp::Bxor,
        amo::FETCH => AtomicOp::Read,
        amo::COMPARE_SWAP => AtomicOp::Cswap,
        _ => return None,
    };
    Some(ProviderAmo { op, datatype })
}

/// The "try again" error (`-FI_EAGAIN`) for a send that found no free context.
pub(super) fn again(what: &str) -> FabricError {
    FabricError::from_ret(-i64::from(errno::EAGAIN), what)
}

impl Transport {
    /// Flags of a transmit operation: FI_DELIVERY_COMPLETE where the provider has it, so a
    /// completed put is visible at the target.
    pub(super) fn tx_flags(&self) -> u64 {
        if self.info.delivery_complete() {
            flags::DELIVERY_COMPLETE
        } else {
            0
        }
    }

    /// Flags of an injected put (the provider copies the source before returning).
    pub(super) fn inject_flags(&self) -> u64 {
        flags::INJECT | self.tx_flags()
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
