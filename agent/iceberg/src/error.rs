//! Errors of the Iceberg write path and their class: whether retrying can help.
//!
//! Every error type of this crate answers `class()` with an [`ErrorClass`]: `Transient`
//! (an outside system failed for now: retry with backoff) or `Fatal` (retrying cannot
//! help). The agent maps the class into its own error classes.

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// An outside system failed for now (catalog 5xx/429/timeout, object store): retry
    /// with backoff.
    Transient,
    /// Retrying cannot help (configuration, privileges, invalid data, a bug).
    Fatal,
}

/// Errors of reading and writing table files outside a commit: delete files, deletion
/// vectors, snapshot expiry and orphan cleanup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing table files failed.
    #[error(transparent)]
    Iceberg(#[from] iceberg::Error),
    /// A Parquet file could not be read or written.
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow data could not be built.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A commit failed.
    #[error(transparent)]
    Commit(#[from] Box<crate::CommitFailure>),
    /// The table does not fit what was asked (e.g. a file's metadata cannot be built).
    #[error("{0}")]
    Unsupported(String),
    /// Listing or deleting files failed, or a blocking task did not finish.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// Whether retrying can help.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Iceberg(e) => iceberg_class(e),
            Error::Parquet(_) | Error::Other(_) => ErrorClass::Transient,
            Error::Commit(e) => e.class(),
            Error::Arrow(_) | Error::Unsupported(_) => ErrorClass::Fatal,
        }
    }
}

/// Attached as the source of an iceberg-rust error whose cause is known to be final
/// (a catalog's 400/401/403 answer): the error's kind alone (`Unexpected`) would read as
/// transient, and retrying a missing privilege forever hides it from the operator.
#[derive(Debug, thiserror::Error)]
#[error("retrying cannot help: {0}")]
pub struct NotRetryable(pub &'static str);

/// The class of an iceberg-rust error: data and feature errors, and errors marked
/// [`NotRetryable`], are fatal; the rest (I/O, storage, catalog answers) transient unless
/// the crate says otherwise.
pub fn iceberg_class(e: &iceberg::Error) -> ErrorClass {
    use iceberg::ErrorKind as K;
    if is_unwritable_storage(e) {
        return ErrorClass::Fatal;
    }
    if e.retryable() {
        return ErrorClass::Transient;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<NotRetryable>() {
            return ErrorClass::Fatal;
        }
        source = s.source();
    }
    match e.kind() {
        K::DataInvalid
        | K::FeatureUnsupported
        | K::NamespaceNotFound
        | K::TableNotFound
        | K::PreconditionFailed => ErrorClass::Fatal,
        _ => ErrorClass::Transient,
    }
}

/// Whether an iceberg-rust error says local storage refuses writes for good: a read-only
/// file system, a directory the agent may not write, a file name the file system cannot
/// hold. Retrying cannot fix those; the operator must.
pub fn is_unwritable_storage(e: &iceberg::Error) -> bool {
    use std::io::ErrorKind as K;
    const FINAL: [&str; 3] = ["(os error 30)", "(os error 13)", "(os error 36)"];
    let says = |text: &str| FINAL.iter().any(|code| text.contains(code));
    if says(e.message()) {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                K::ReadOnlyFilesystem | K::PermissionDenied | K::InvalidFilename
            )
        {
            return true;
        }
        if says(&s.to_string()) {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether an iceberg-rust error says a file does not exist: the local file system
/// reports `NotFound` in its message, object stores through opendal as the `NotFound`
/// kind of the error's source.
///
/// A file of a table that is missing when a commit is prepared means the table view is
/// stale (another writer's snapshot expiry or compaction removed it): reload and retry.
// upstream: typed not-found errors (iceberg-rust has no error kind for a missing file;
// delete when it has one)
pub fn is_missing_file(e: &iceberg::Error) -> bool {
    fn says_missing(text: &str) -> bool {
        text.contains("No such file or directory") || text.contains("NotFound")
    }
    if says_missing(e.message()) {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::NotFound
        {
            return true;
        }
        if says_missing(&s.to_string()) {
            return true;
        }
        source = s.source();
    }
    false
}

/// An error and its causes on one line, `error: cause: cause`.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_that_refuses_writes_for_good_is_fatal() {
        for code in [30, 13, 36] {
            let io = std::io::Error::from_raw_os_error(code);
            let e = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "writing a data file")
                .with_source(io);
            assert_eq!(iceberg_class(&e), ErrorClass::Fatal, "os error {code}");
        }
        let busy = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "writing")
            .with_source(std::io::Error::from_raw_os_error(11));
        assert_eq!(iceberg_class(&busy), ErrorClass::Transient);
    }

    #[test]
    fn an_error_marked_not_retryable_is_fatal_whatever_its_kind() {
        let plain = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "HTTP 403");
        assert_eq!(iceberg_class(&plain), ErrorClass::Transient);
        let marked = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "HTTP 403")
            .with_source(NotRetryable("the catalog refused the request"));
        assert_eq!(iceberg_class(&marked), ErrorClass::Fatal);
    }

    #[test]
    fn a_missing_file_is_recognised_on_local_disk_and_behind_a_source() {
        let local = iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            "Failed to read file /w/t/metadata/snap-1.avro: No such file or directory (os error 2)",
        );
        assert!(is_missing_file(&local));
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let wrapped =
            iceberg::Error::new(iceberg::ErrorKind::Unexpected, "io failed").with_source(io);
        assert!(is_missing_file(&wrapped));
        let other = iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "bad manifest");
        assert!(!is_missing_file(&other));
    }
}
