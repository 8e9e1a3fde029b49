//! EFA formats: the TX WQE and the CQEs (encode, validating decode). Bit positions follow the EFA
//! device's queue definitions. (The binding of the provider's GPU Direct Async operations table is
//! in `fabric::efa_gda`.)

/// A field value of the EFA formats as a `u8` enum: the enum (`repr(u8)`, with the usual derives)
/// from its variants and their raw values, plus `ALL` (every variant, in declaration order),
/// `from_raw` (`None` for a value the device does not define) and `raw`.
macro_rules! raw_u8_enum {
    ($(#[$doc:meta])* pub enum $name:ident {
        $($(#[$vdoc:meta])* $var:ident = $val:literal,)*
    }) => {
        $(#[$doc])*
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $var = $val,)*
        }

        impl $name {
            /// Every defined value, in declaration order.
            pub const ALL: [$name; [$(stringify!($var)),*].len()] = [$($name::$var),*];

            /// Maps a raw value; `None` for values the device does not define.
            pub const fn from_raw(raw: u8) -> Option<Self> {
                $(if raw == $val {
                    return Some($name::$var);
                })*
                None
            }

            /// The raw value written into the WQE or CQE.
            pub const fn raw(self) -> u8 {
                self as u8
            }
        }
    };
}

pub mod cqe;
mod le;
pub mod sq;
pub mod wqe;

#[cfg(test)]
mod tests {
    use super::cqe::{CqStatus, QueueType};
    use super::wqe::OpType;

    #[test]
    fn raw_values_map_back_and_only_defined_ones_map() {
        for x in 0..=255u8 {
            let status = CqStatus::from_raw(x).map(CqStatus::raw);
            assert_eq!(status, (x <= 15 || x == 18).then_some(x), "status {x}");
            let queue = QueueType::from_raw(x).map(QueueType::raw);
            assert_eq!(queue, (x == 1 || x == 2).then_some(x), "queue type {x}");
            assert_eq!(
                OpType::from_raw(x).map(OpType::raw),
                (x <= 2).then_some(x),
                "op {x}"
            );
        }
        assert_eq!(CqStatus::ALL.len(), 17);
        assert_eq!(CqStatus::ALL[16], CqStatus::RemoteFeatureMismatch);
        assert_eq!(
            OpType::ALL,
            [OpType::Send, OpType::RdmaRead, OpType::RdmaWrite]
        );
    }
}
