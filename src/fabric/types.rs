//! Typed names for libfabric's atomic operations and datatypes, and named constants for the
//! operation flags and error numbers the crate uses, so that code outside this module never names
//! the raw bindings.
use ofi_libfabric_sys::bindgen as fi;

/// Public constants of type `$ty` holding libfabric's `fi::$fi`, each documented with its
/// libfabric name and, where given, what it means.
macro_rules! fi_consts {
    ($ty:ty; $($name:ident = $fi:ident $(: $what:literal)?;)*) => {$(
        #[doc = concat!("`", stringify!($fi), "`", $(": ", $what,)? ".")]
        pub const $name: $ty = fi::$fi as $ty;
    )*};
}

/// Flags of data-transfer calls and completions (`fi_*msg` flags, `fi_cq_data_entry::flags`).
pub mod flags {
    use super::fi;

    fi_consts! { u64;
        MSG = FI_MSG: "a message (send/receive) operation";
        RMA = FI_RMA: "an RMA operation";
        ATOMIC = FI_ATOMIC: "an atomic operation";
        READ = FI_READ: "an RMA read (or read access)";
        WRITE = FI_WRITE: "an RMA write (or write access)";
        RECV = FI_RECV: "a receive completion";
        SEND = FI_SEND: "a send completion";
        REMOTE_CQ_DATA = FI_REMOTE_CQ_DATA: "the operation carries (or the completion holds) remote CQ data";
        REMOTE_WRITE = FI_REMOTE_WRITE: "a completion of a remote peer's RMA write (remote CQ data)";
        RX_CQ_DATA = FI_RX_CQ_DATA:
            "(a mode bit) the application posts a receive for every incoming remote CQ data";
        FENCE = FI_FENCE: "wait for earlier operations before this one";
        COMPLETION = FI_COMPLETION: "generate a completion";
        INJECT = FI_INJECT: "the buffer may be reused as soon as the call returns";
        INJECT_COMPLETE = FI_INJECT_COMPLETE: "complete once the buffer may be reused";
        TRANSMIT_COMPLETE = FI_TRANSMIT_COMPLETE: "complete once the data left this node";
        DELIVERY_COMPLETE = FI_DELIVERY_COMPLETE: "complete once the data is visible at the target";
    }
}

/// libfabric error numbers (positive, as `fi_errno.h` defines them; [`super::Error::code`] holds
/// their negation).
pub mod errno {
    use super::fi;

    fi_consts! { u32;
        EIO = FI_EIO; EAGAIN = FI_EAGAIN; ENOMEM = FI_ENOMEM; EACCES = FI_EACCES;
        EINVAL = FI_EINVAL; ENOENT = FI_ENOENT; ENOSYS = FI_ENOSYS; EOPNOTSUPP = FI_EOPNOTSUPP;
        EMSGSIZE = FI_EMSGSIZE; EADDRNOTAVAIL = FI_EADDRNOTAVAIL; ENETUNREACH = FI_ENETUNREACH;
        ECONNABORTED = FI_ECONNABORTED; ECONNRESET = FI_ECONNRESET; ENOTCONN = FI_ENOTCONN;
        ETIMEDOUT = FI_ETIMEDOUT; ECONNREFUSED = FI_ECONNREFUSED; EHOSTUNREACH = FI_EHOSTUNREACH;
        ECANCELED = FI_ECANCELED; EKEYREJECTED = FI_EKEYREJECTED; ETRUNC = FI_ETRUNC;
        ETOOSMALL = FI_ETOOSMALL; EBADFLAGS = FI_EBADFLAGS; ENOKEY = FI_ENOKEY;
    }
}

/// A Rust enum for a C enum of libfabric: the variants, each documented with the binding's name,
/// and the conversion to the binding's value.
macro_rules! fi_enum {
    ($(#[$doc:meta])* pub enum $name:ident: $fity:ident { $($var:ident = $fi:ident,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $(#[doc = concat!("`", stringify!($fi), "`.")] $var,)*
        }

        impl From<$name> for fi::$fity {
            fn from(x: $name) -> fi::$fity {
                match x {
                    $($name::$var => fi::$fi,)*
                }
            }
        }
    };
}

fi_enum! {
    /// An atomic operation (`enum fi_op`).
    pub enum AtomicOp: fi_op {
        Min = fi_op_FI_MIN, Max = fi_op_FI_MAX, Sum = fi_op_FI_SUM, Prod = fi_op_FI_PROD,
        Bor = fi_op_FI_BOR, Band = fi_op_FI_BAND, Bxor = fi_op_FI_BXOR,
        Read = fi_op_FI_ATOMIC_READ, Write = fi_op_FI_ATOMIC_WRITE, Cswap = fi_op_FI_CSWAP,
    }
}

fi_enum! {
    /// The datatype of an atomic operation's elements (`enum fi_datatype`).
    pub enum Datatype: fi_datatype {
        I8 = fi_datatype_FI_INT8, U8 = fi_datatype_FI_UINT8,
        I16 = fi_datatype_FI_INT16, U16 = fi_datatype_FI_UINT16,
        I32 = fi_datatype_FI_INT32, U32 = fi_datatype_FI_UINT32,
        I64 = fi_datatype_FI_INT64, U64 = fi_datatype_FI_UINT64,
        F32 = fi_datatype_FI_FLOAT, F64 = fi_datatype_FI_DOUBLE,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_names_map_to_the_bindings() {
        assert_eq!(fi::fi_op::from(AtomicOp::Sum), fi::fi_op_FI_SUM);
        assert_eq!(fi::fi_op::from(AtomicOp::Cswap), fi::fi_op_FI_CSWAP);
        assert_eq!(fi::fi_op::from(AtomicOp::Read), fi::fi_op_FI_ATOMIC_READ);
        assert_eq!(
            fi::fi_datatype::from(Datatype::F32),
            fi::fi_datatype_FI_FLOAT
        );
        assert_eq!(flags::RX_CQ_DATA, fi::FI_RX_CQ_DATA);
        assert_eq!(errno::ENOKEY, fi::FI_ENOKEY);
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
