//! Errors of the REST catalog client, worded so that a user knows what to change.

use iceberg::ErrorKind;

/// What went wrong talking to a REST catalog.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// The catalog answered with a non-2xx status.
    #[error("{operation}: {}", status_text(*status, message))]
    Status {
        /// HTTP status code.
        status: u16,
        /// What we asked for, e.g. `load table db.events`.
        operation: String,
        /// The server's error message (from its `ErrorModel`, else the body).
        message: String,
    },
    /// The token endpoint refused the client credentials or answered badly.
    #[error("OAuth2 token request to {endpoint} failed (HTTP {status}): {message}")]
    Token {
        /// Token endpoint.
        endpoint: String,
        /// HTTP status code.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// No answer at all (connection refused, DNS, TLS, timeout).
    #[error("{operation}: cannot reach {url}: {source}")]
    Http {
        /// What we asked for.
        operation: String,
        /// Where.
        url: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// A 2xx answer we could not read.
    #[error("{operation}: unexpected answer: {message}")]
    Decode {
        /// What we asked for.
        operation: String,
        /// What did not parse.
        message: String,
    },
    /// Settings that cannot work (unreadable credential file, bad header).
    #[error("{0}")]
    Config(String),
}

/// Whether a 403's message is AWS refusing a signature or its credentials (rather than
/// a missing privilege): `SignatureDoesNotMatch`, `InvalidSignatureException`, an
/// unknown access key or an invalid security token.
fn is_signature_refusal(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "signature",
        "security token",
        "access key id",
        "credential should be scoped",
        "unrecognizedclient",
        "invalidclienttokenid",
        "expiredtoken",
    ]
    .iter()
    .any(|s| m.contains(s))
}

fn status_text(status: u16, message: &str) -> String {
    let hint = match status {
        401 => {
            "the catalog rejected the credential: it is wrong or expired (check `credential`, `credential_file` or `token`)"
        }
        403 if is_signature_refusal(message) => {
            "AWS refused the request's SigV4 signature: check the signing identity's secret key (or session token), `signing_name` and `signing_region`"
        }
        403 => {
            "the principal lacks the privilege for this operation (grant it in the catalog, e.g. a Polaris catalog role with TABLE_WRITE_DATA)"
        }
        409 => "conflict: the table changed since it was read",
        419 => "the token expired",
        429 => "the catalog asks to slow down (too many requests); retried",
        500..=599 => "server error",
        _ => "",
    };
    match (hint.is_empty(), message.is_empty()) {
        (true, _) => format!("HTTP {status}: {message}"),
        (false, true) => format!("HTTP {status}: {hint}"),
        (false, false) => format!("HTTP {status}: {hint}; server says: {message}"),
    }
}

impl RestError {
    /// Whether retrying can help ([`RestError::transient`] as a class).
    pub fn class(&self) -> crate::ErrorClass {
        if self.transient() {
            crate::ErrorClass::Transient
        } else {
            crate::ErrorClass::Fatal
        }
    }

    /// The HTTP status, if the catalog answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            RestError::Status { status, .. } | RestError::Token { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether trying again later can help: no answer at all (connection refused or
    /// reset, timeout), 408, 429 and 5xx. A 4xx other than those says the request itself
    /// is wrong (credential, privilege, missing table): trying again will not help.
    pub fn transient(&self) -> bool {
        match self {
            RestError::Http { .. } => true,
            RestError::Status { status, .. } | RestError::Token { status, .. } => {
                matches!(status, 408 | 429 | 500..=599)
            }
            RestError::Decode { .. } | RestError::Config(_) => false,
        }
    }

    /// As an Iceberg error of the kind the `Catalog` trait's callers look for; transient
    /// failures (see [`RestError::transient`]) and conflicts are marked retryable.
    pub(crate) fn into_iceberg(self, not_found: ErrorKind) -> iceberg::Error {
        let kind = match self.status() {
            Some(404) => not_found,
            Some(409) => ErrorKind::CatalogCommitConflicts,
            _ => ErrorKind::Unexpected,
        };
        let retryable = matches!(self.status(), Some(409)) || self.transient();
        let refused = matches!(self.status(), Some(400..=499)) && kind == ErrorKind::Unexpected;
        let error = iceberg::Error::new(kind, self.to_string()).with_retryable(retryable);
        if refused && !retryable {
            // A credential, privilege or request the catalog refuses: final, not an outage.
            error.with_source(crate::error::NotRetryable(
                "the catalog refused the request",
            ))
        } else {
            error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_say_what_to_do() {
        let e = |status: u16| RestError::Status {
            status,
            operation: "commit table db.t".into(),
            message: "denied".into(),
        };
        assert!(e(401).to_string().contains("wrong or expired"));
        let forbidden = e(403).to_string();
        assert!(
            forbidden.starts_with("commit table db.t:")
                && forbidden.contains("lacks the privilege"),
            "{forbidden}"
        );
        assert_eq!(e(418).to_string(), "commit table db.t: HTTP 418: denied");
        let signature = RestError::Status {
            status: 403,
            operation: "read catalog config".into(),
            message:
                "The request signature we calculated does not match the signature you provided."
                    .into(),
        };
        assert!(
            signature
                .to_string()
                .contains("refused the request's SigV4 signature"),
            "{signature}"
        );
        // A wrong `signing_name` or `signing_region`, as AWS words it.
        for message in [
            "Credential should be scoped to correct service: 'glue'. ",
            "Credential should be scoped to a valid region. ",
            "InvalidSignatureException: something else",
        ] {
            let scoped = RestError::Status {
                status: 403,
                operation: "read catalog config".into(),
                message: message.into(),
            }
            .to_string();
            assert!(scoped.contains("SigV4 signature"), "{scoped}");
        }
        assert_eq!(
            e(404).into_iceberg(ErrorKind::TableNotFound).kind(),
            ErrorKind::TableNotFound
        );
        use crate::error::{ErrorClass, iceberg_class};
        for (status, class) in [
            (401, ErrorClass::Fatal),
            (403, ErrorClass::Fatal),
            (400, ErrorClass::Fatal),
            (409, ErrorClass::Transient),
            (429, ErrorClass::Transient),
            (503, ErrorClass::Transient),
        ] {
            let got = iceberg_class(&e(status).into_iceberg(ErrorKind::TableNotFound));
            assert_eq!(got, class, "HTTP {status}");
        }
    }
}
