//! The error type of plugins.

use std::fmt;

/// What went wrong in a plugin: a config `init` refuses, or one record it cannot
/// transform (the pipeline's `on_error` policy decides what happens to that record;
/// the rest of the batch is unaffected).
///
/// Build one with [`Error::msg`] or the [`error!`](crate::error!) macro, or let `?`
/// convert any standard error:
///
/// ```
/// use floe_sdk::{Error, error};
///
/// fn parse(text: &str) -> Result<i64, Error> {
///     let n: i64 = text.parse()?; // std::num::ParseIntError -> Error
///     if n < 0 {
///         return Err(error!("negative: {n}"));
///     }
///     Ok(n)
/// }
/// assert_eq!(parse("-2").unwrap_err().to_string(), "negative: -2");
/// assert_eq!(parse("x").unwrap_err().to_string(), "invalid digit found in string");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

impl Error {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Error {
        Error {
            message: message.to_string(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context` in front: `"{context}: {message}"`.
    pub fn context(self, context: impl fmt::Display) -> Error {
        Error {
            message: format!("{context}: {}", self.message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?})", self.message)
    }
}

/// Any standard error converts, keeping its message (so `?` works on them).
impl<E: std::error::Error + Send + Sync + 'static> From<E> for Error {
    fn from(e: E) -> Error {
        Error::msg(e)
    }
}

/// Builds an [`Error`] from a format string: `error!("bad value {v}")`.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => {
        $crate::Error::msg(::std::format!($($arg)*))
    };
}
