//! EFA formats: the TX WQE and the CQEs (encode, validating decode), and the binding of the provider's
//! GPU Direct Async operations table. Bit positions follow the EFA device's queue definitions.
pub mod cqe;
pub mod gda_ops;
pub mod wqe;
