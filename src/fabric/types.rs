//! Typed names for libfabric's atomic operations and datatypes, and named constants for the
//! operation flags and error numbers the crate uses, so that code outside this module never names
//! the raw bindings.
use ofi_libfabric_sys::bindgen as fi;

/// Flags of data-transfer calls and completions (`fi_*msg` flags, `fi_cq_data_entry::flags`).
pub mod flags {
    use super::fi;

    /// `FI_MSG`: a message (send/receive) operation.
    pub const MSG: u64 = fi::FI_MSG as u64;
    /// `FI_RMA`: an RMA operation.
    pub const RMA: u64 = fi::FI_RMA as u64;
    /// `FI_ATOMIC`: an atomic operation.
    pub const ATOMIC: u64 = fi::FI_ATOMIC as u64;
    /// `FI_READ`: an RMA read (or read access).
    pub const READ: u64 = fi::FI_READ as u64;
    /// `FI_WRITE`: an RMA write (or write access).
    pub const WRITE: u64 = fi::FI_WRITE as u64;
    /// `FI_RECV`: a receive completion.
    pub const RECV: u64 = fi::FI_RECV as u64;
    /// `FI_SEND`: a send completion.
    pub const SEND: u64 = fi::FI_SEND as u64;
    /// `FI_REMOTE_CQ_DATA`: the operation carries (or the completion holds) remote CQ data.
    pub const REMOTE_CQ_DATA: u64 = fi::FI_REMOTE_CQ_DATA as u64;
    /// `FI_REMOTE_WRITE`: a completion of a remote peer's RMA write (remote CQ data).
    pub const REMOTE_WRITE: u64 = fi::FI_REMOTE_WRITE as u64;
    /// `FI_RX_CQ_DATA` (a mode bit): the application posts a receive for every incoming remote CQ data.
    pub const RX_CQ_DATA: u64 = fi::FI_RX_CQ_DATA;
    /// `FI_FENCE`: wait for earlier operations before this one.
    pub const FENCE: u64 = fi::FI_FENCE as u64;
    /// `FI_COMPLETION`: generate a completion.
    pub const COMPLETION: u64 = fi::FI_COMPLETION as u64;
    /// `FI_INJECT`: the buffer may be reused as soon as the call returns.
    pub const INJECT: u64 = fi::FI_INJECT as u64;
    /// `FI_INJECT_COMPLETE`: complete once the buffer may be reused.
    pub const INJECT_COMPLETE: u64 = fi::FI_INJECT_COMPLETE as u64;
    /// `FI_TRANSMIT_COMPLETE`: complete once the data left this node.
    pub const TRANSMIT_COMPLETE: u64 = fi::FI_TRANSMIT_COMPLETE as u64;
    /// `FI_DELIVERY_COMPLETE`: complete once the data is visible at the target.
    pub const DELIVERY_COMPLETE: u64 = fi::FI_DELIVERY_COMPLETE as u64;
}

/// libfabric error numbers (positive, as `fi_errno.h` defines them; [`super::Error::code`] holds
/// their negation).
pub mod errno {
    use super::fi;

    /// `FI_EIO`.
    pub const EIO: u32 = fi::FI_EIO;
    /// `FI_EAGAIN`.
    pub const EAGAIN: u32 = fi::FI_EAGAIN;
    /// `FI_ENOMEM`.
    pub const ENOMEM: u32 = fi::FI_ENOMEM;
    /// `FI_EACCES`.
    pub const EACCES: u32 = fi::FI_EACCES;
    /// `FI_EINVAL`.
    pub const EINVAL: u32 = fi::FI_EINVAL;
    /// `FI_ENOENT`.
    pub const ENOENT: u32 = fi::FI_ENOENT;
    /// `FI_ENOSYS`.
    pub const ENOSYS: u32 = fi::FI_ENOSYS;
    /// `FI_EOPNOTSUPP`.
    pub const EOPNOTSUPP: u32 = fi::FI_EOPNOTSUPP;
    /// `FI_EMSGSIZE`.
    pub const EMSGSIZE: u32 = fi::FI_EMSGSIZE;
    /// `FI_EADDRNOTAVAIL`.
    pub const EADDRNOTAVAIL: u32 = fi::FI_EADDRNOTAVAIL;
    /// `FI_ENETUNREACH`.
    pub const ENETUNREACH: u32 = fi::FI_ENETUNREACH;
    /// `FI_ECONNABORTED`.
    pub const ECONNABORTED: u32 = fi::FI_ECONNABORTED;
    /// `FI_ECONNRESET`.
    pub const ECONNRESET: u32 = fi::FI_ECONNRESET;
    /// `FI_ENOTCONN`.
    pub const ENOTCONN: u32 = fi::FI_ENOTCONN;
    /// `FI_ETIMEDOUT`.
    pub const ETIMEDOUT: u32 = fi::FI_ETIMEDOUT;
    /// `FI_ECONNREFUSED`.
    pub const ECONNREFUSED: u32 = fi::FI_ECONNREFUSED;
    /// `FI_EHOSTUNREACH`.
    pub const EHOSTUNREACH: u32 = fi::FI_EHOSTUNREACH;
    /// `FI_ECANCELED`.
    pub const ECANCELED: u32 = fi::FI_ECANCELED;
    /// `FI_EKEYREJECTED`.
    pub const EKEYREJECTED: u32 = fi::FI_EKEYREJECTED;
    /// `FI_ETRUNC`.
    pub const ETRUNC: u32 = fi::FI_ETRUNC;
    /// `FI_ETOOSMALL`.
    pub const ETOOSMALL: u32 = fi::FI_ETOOSMALL;
    /// `FI_EBADFLAGS`.
    pub const EBADFLAGS: u32 = fi::FI_EBADFLAGS;
    /// `FI_ENOKEY`.
    pub const ENOKEY: u32 = fi::FI_ENOKEY;
}

/// An atomic operation (`enum fi_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// `FI_MIN`.
    Min,
    /// `FI_MAX`.
    Max,
    /// `FI_SUM`.
    Sum,
    /// `FI_PROD`.
    Prod,
    /// `FI_BOR`.
    Bor,
    /// `FI_BAND`.
    Band,
    /// `FI_BXOR`.
    Bxor,
    /// `FI_ATOMIC_READ`.
    Read,
    /// `FI_ATOMIC_WRITE`.
    Write,
    /// `FI_CSWAP`.
    Cswap,
}

impl From<AtomicOp> for fi::fi_op {
    fn from(op: AtomicOp) -> fi::fi_op {
        match op {
            AtomicOp::Min => fi::fi_op_FI_MIN,
            AtomicOp::Max => fi::fi_op_FI_MAX,
            AtomicOp::Sum => fi::fi_op_FI_SUM,
            AtomicOp::Prod => fi::fi_op_FI_PROD,
            AtomicOp::Bor => fi::fi_op_FI_BOR,
            AtomicOp::Band => fi::fi_op_FI_BAND,
            AtomicOp::Bxor => fi::fi_op_FI_BXOR,
            AtomicOp::Read => fi::fi_op_FI_ATOMIC_READ,
            AtomicOp::Write => fi::fi_op_FI_ATOMIC_WRITE,
            AtomicOp::Cswap => fi::fi_op_FI_CSWAP,
        }
    }
}

/// The datatype of an atomic operation's elements (`enum fi_datatype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// `FI_INT8`.
    I8,
    /// `FI_UINT8`.
    U8,
    /// `FI_INT16`.
    I16,
    /// `FI_UINT16`.
    U16,
    /// `FI_INT32`.
    I32,
    /// `FI_UINT32`.
    U32,
    /// `FI_INT64`.
    I64,
    /// `FI_UINT64`.
    U64,
    /// `FI_FLOAT`.
    F32,
    /// `FI_DOUBLE`.
    F64,
}

impl Datatype {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            Datatype::I8 | Datatype::U8 => 1,
            Datatype::I16 | Datatype::U16 => 2,
            Datatype::I32 | Datatype::U32 | Datatype::F32 => 4,
            Datatype::I64 | Datatype::U64 | Datatype::F64 => 8,
        }
    }

    /// The unsigned integer type of `bytes` bytes (4 or 8), if any.
    pub fn unsigned(bytes: usize) -> Option<Datatype> {
        match bytes {
            1 => Some(Datatype::U8),
            2 => Some(Datatype::U16),
            4 => Some(Datatype::U32),
            8 => Some(Datatype::U64),
            _ => None,
        }
    }
}

impl From<Datatype> for fi::fi_datatype {
    fn from(dt: Datatype) -> fi::fi_datatype {
        match dt {
            Datatype::I8 => fi::fi_datatype_FI_INT8,
            Datatype::U8 => fi::fi_datatype_FI_UINT8,
            Datatype::I16 => fi::fi_datatype_FI_INT16,
            Datatype::U16 => fi::fi_datatype_FI_UINT16,
            Datatype::I32 => fi::fi_datatype_FI_INT32,
            Datatype::U32 => fi::fi_datatype_FI_UINT32,
            Datatype::I64 => fi::fi_datatype_FI_INT64,
            Datatype::U64 => fi::fi_datatype_FI_UINT64,
            Datatype::F32 => fi::fi_datatype_FI_FLOAT,
            Datatype::F64 => fi::fi_datatype_FI_DOUBLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_names_map_to_the_bindings() {
        assert_eq!(fi::fi_op::from(AtomicOp::Sum), fi::fi_op_FI_SUM);
        assert_eq!(fi::fi_op::from(AtomicOp::Cswap), fi::fi_op_FI_CSWAP);
        assert_eq!(
            fi::fi_datatype::from(Datatype::U64),
            fi::fi_datatype_FI_UINT64
        );
        assert_eq!(Datatype::unsigned(4), Some(Datatype::U32));
        assert_eq!(Datatype::unsigned(3), None);
        assert_eq!(Datatype::F64.size(), 8);
        assert_eq!(
            flags::DELIVERY_COMPLETE,
            u64::from(fi::FI_DELIVERY_COMPLETE)
        );
        assert_eq!(errno::ECANCELED, fi::FI_ECANCELED);
    }
}
