//! Error classes: whose fault an error is and whether retrying can help.
//!
//! Every stage error answers [`Classify::class`], so the pipeline's recovery policy is
//! one `match`: a bad record goes to the dead letters, a transient failure is retried
//! with capped exponential backoff and jitter, a fatal one stops the pipeline.

/// What an error means for the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The record itself cannot become a row: dead-letter it and go on.
    BadRecord,
    /// An outside system failed for now (broker, catalog 5xx/429/timeout, object
    /// store, registry): retry with backoff, keeping committed progress.
    Transient,
    /// Retrying cannot help (configuration, privileges, a bug): stop the pipeline.
    Fatal,
}

/// An error that knows its class.
pub trait Classify {
    /// The class of this error.
    fn class(&self) -> ErrorClass;

    /// Whether trying the same thing again later can succeed.
    fn retryable(&self) -> bool {
        self.class() == ErrorClass::Transient
    }
}

pub use floe_iceberg::error::{NotRetryable, is_missing_file, with_causes};
pub use floe_iceberg::retry;

/// For [`retry`]: a bad record is not retried.
impl From<ErrorClass> for floe_iceberg::ErrorClass {
    fn from(class: ErrorClass) -> floe_iceberg::ErrorClass {
        match class {
            ErrorClass::Transient => floe_iceberg::ErrorClass::Transient,
            ErrorClass::BadRecord | ErrorClass::Fatal => floe_iceberg::ErrorClass::Fatal,
        }
    }
}

impl From<floe_iceberg::ErrorClass> for ErrorClass {
    fn from(class: floe_iceberg::ErrorClass) -> ErrorClass {
        match class {
            floe_iceberg::ErrorClass::Transient => ErrorClass::Transient,
            floe_iceberg::ErrorClass::Fatal => ErrorClass::Fatal,
        }
    }
}

/// The class of an iceberg-rust error ([`floe_iceberg::error::iceberg_class`]): data and
/// feature errors, and errors marked [`NotRetryable`], are fatal; the rest transient.
pub fn iceberg_class(e: &iceberg::Error) -> ErrorClass {
    floe_iceberg::error::iceberg_class(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iceberg_classes_map_onto_the_agents() {
        let plain = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "HTTP 503");
        assert_eq!(iceberg_class(&plain), ErrorClass::Transient);
        let marked = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "HTTP 403")
            .with_source(NotRetryable("the catalog refused the request"));
        assert_eq!(iceberg_class(&marked), ErrorClass::Fatal);
    }
}
