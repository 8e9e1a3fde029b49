//! EFA formats: the TX WQE and the CQEs (encode, validating decode). Bit positions follow the EFA
//! device's queue definitions. (The binding of the provider's GPU Direct Async operations table is
//! in `fabric::efa_gda`.)
pub mod cqe;
mod le;
pub mod wqe;
