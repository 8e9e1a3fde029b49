//! Error type of the fabric layer: a negative libfabric/errno code, its `fi_strerror` text and the
//! operation that failed.
use std::ffi::CStr;
use std::fmt;

use ofi_libfabric_sys::bindgen as fi;

/// An error from libfabric (or from a check of the fabric layer), with context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// Negative errno-style code (`-FI_EAGAIN`, `-FI_EINVAL`, ...).
    pub code: i32,
    /// What was being done, e.g. `fi_getinfo(provider=shm)`.
    pub context: String,
}

impl Error {
    /// Builds an error from a libfabric return value (negative or positive errno).
    pub fn from_ret(ret: i64, context: impl Into<String>) -> Self {
        let code = if ret > 0 { -(ret as i32) } else { ret as i32 };
        Error {
            code,
            context: context.into(),
        }
    }

    /// An error raised by the fabric layer itself (argument checks and the like).
    pub fn invalid(context: impl Into<String>) -> Self {
        Error {
            code: -(libc::EINVAL),
            context: context.into(),
        }
    }

    /// An operation the provider (or this layer) does not support here (`-EOPNOTSUPP`).
    pub fn unsupported(context: impl Into<String>) -> Self {
        Error {
            code: -(libc::EOPNOTSUPP),
            context: context.into(),
        }
    }

    /// True for `-FI_EAGAIN`: the operation can be retried after progress.
    pub fn is_again(&self) -> bool {
        self.code == -(fi::FI_EAGAIN as i32)
    }

    /// `fi_strerror` text of the code.
    pub fn text(&self) -> String {
        // SAFETY: fi_strerror returns a pointer to a static, NUL-terminated string for any value.
        unsafe {
            let p = fi::fi_strerror(-self.code);
            if p.is_null() {
                return format!("error {}", self.code);
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.context, self.text(), self.code)
    }
}

impl std::error::Error for Error {}

/// Result of the fabric layer.
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a libfabric return code into a `Result`.
pub(crate) fn check(ret: i64, context: impl FnOnce() -> String) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(Error::from_ret(ret, context()))
    }
}
