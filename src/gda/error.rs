//! Errors of the GDA layer: a negative errno-style code and a message that says what and why. Inside
//! the library only: the C API returns the published `NVSHMEM_EFA_ERROR_*` codes
//! (`capi::gda::status_of` translates).
use std::fmt;

use crate::cuda;

/// An error of the GDA layer: a negative errno-style code and a message that says what and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdaError {
    /// Negative errno-style code (`-EINVAL`, `-EOPNOTSUPP`, `-ENODEV`, ...).
    pub code: i32,
    /// What failed and why.
    pub message: String,
}

/// Constructors of errors with a fixed code: `name => code`.
macro_rules! coded_errors {
    ($($(#[$doc:meta])* $name:ident => $code:expr;)*) => {
        impl GdaError {
            $(
                $(#[$doc])*
                pub fn $name(m: impl Into<String>) -> GdaError {
                    GdaError {
                        code: $code,
                        message: m.into(),
                    }
                }
            )*
        }
    };
}

coded_errors! {
    /// Bad argument (`-EINVAL`).
    invalid => -libc::EINVAL;
    /// Not supported here (`-EOPNOTSUPP`).
    unsupported => -libc::EOPNOTSUPP;
    /// Out of memory (`-ENOMEM`).
    nomem => -libc::ENOMEM;
    /// I/O or driver failure (`-EIO`).
    io => -libc::EIO;
}

impl GdaError {
    /// Not initialised (`-ENODEV`).
    pub fn not_initialised() -> GdaError {
        GdaError {
            code: -libc::ENODEV,
            message: "GDA is not initialised".into(),
        }
    }
}

impl fmt::Display for GdaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for GdaError {}

impl From<crate::fabric::Error> for GdaError {
    fn from(e: crate::fabric::Error) -> GdaError {
        GdaError {
            code: if e.code < 0 { e.code } else { -libc::EIO },
            message: e.to_string(),
        }
    }
}

impl From<cuda::CudaError> for GdaError {
    fn from(e: cuda::CudaError) -> GdaError {
        GdaError::io(e.to_string())
    }
}

/// Result of the GDA layer.
pub type Result<T> = std::result::Result<T, GdaError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_codes() {
        assert_eq!(GdaError::invalid("x").code, -libc::EINVAL);
        assert_eq!(GdaError::not_initialised().code, -libc::ENODEV);
        let e: GdaError = crate::fabric::Error::from_ret(-38, "fi_open_ops").into();
        assert_eq!(e.code, -38);
        assert!(e.to_string().contains("fi_open_ops"));
    }
}
