//! The transport's error: an NVSHMEM status code and a message that was logged when it was made.
use crate::fabric::Error as FabricError;
use crate::nvshmem::abi;

/// A transport error: the NVSHMEM status code to return, and the message (already logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError {
    /// NVSHMEM status code (`abi::status::*`).
    pub status: i32,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether a provider error says the connection to the peer broke (see `Transport::suspect`).
pub(super) fn broken_connection(err: &str) -> bool {
    [
        "Broken pipe",
        "not connected",
        "Connection reset",
        "Operation canceled",
    ]
    .iter()
    .any(|w| err.contains(w))
}

/// Result of a transport op.
pub type TResult<T> = Result<T, TransportError>;

/// Logs `message` and makes an error with `status`.
fn logged(status: i32, message: String) -> TransportError {
    tracing::error!("{message}");
    TransportError { status, message }
}

/// A bad argument (`INVALID_VALUE`), logged.
pub(super) fn invalid(message: impl Into<String>) -> TransportError {
    logged(abi::status::INVALID_VALUE, message.into())
}

/// A failure inside the transport or the provider (`INTERNAL`), logged.
pub(super) fn internal(message: impl Into<String>) -> TransportError {
    logged(abi::status::INTERNAL, message.into())
}

impl From<FabricError> for TransportError {
    fn from(e: FabricError) -> Self {
        internal(e.to_string())
    }
}
