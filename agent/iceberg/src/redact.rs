//! Values that must never be printed: [`Secret`] (one string) and [`Redacted`] (a map or
//! table whose keys may be shown but whose values may hold credentials, such as
//! `source.properties`, REST `header.*` and plugin `with` tables), plus
//! [`redact_url`] for URLs that may carry `user:password@`.
//!
//! Both keep their value for the code that sends it where it belongs; only `Debug`
//! (and so every `{:?}` of a config, in logs and panics) hides it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};

/// A string that never appears in logs or `Debug` output.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself; only for sending it where it belongs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// A value whose `Debug` shows its shape (keys) but none of its values.
#[derive(Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Redacted<T>(pub T);

impl<T> Deref for Redacted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Redacted<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Redacted(value)
    }
}

impl<'a, T> IntoIterator for &'a Redacted<T>
where
    &'a T: IntoIterator,
{
    type Item = <&'a T as IntoIterator>::Item;
    type IntoIter = <&'a T as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        (&self.0).into_iter()
    }
}

/// How a [`Redacted`] value is shown.
pub trait Redact {
    /// Writes the value's shape with every value replaced by `***`.
    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: Redact> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_redacted(f)
    }
}

impl Redact for BTreeMap<String, String> {
    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.keys().map(|k| (k, Hidden)))
            .finish()
    }
}

impl Redact for toml::Value {
    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            toml::Value::Table(t) => f
                .debug_map()
                .entries(t.keys().map(|k| (k, Hidden)))
                .finish(),
            _ => fmt::Debug::fmt(&Hidden, f),
        }
    }
}

struct Hidden;

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// `url` with any `user:password@` replaced by `***@` and the values of credential query
/// parameters (`password`, `secret`, `token`, `key`, ...) by `***`, for messages and logs.
///
/// A password written without percent-encoding may hold `/`, `?` or `#`, which end the
/// authority of a well-formed URL; so when the authority has no `@` but a later `@`
/// follows a `user:` prefix, everything up to that `@` is hidden too.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let authority_start = scheme_end + 3;
    let rest = &url[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let userinfo_end = match rest[..authority_end].rfind('@') {
        Some(at) => Some(at),
        None if rest[..authority_end].contains(':') => rest.rfind('@'),
        None => None,
    };
    let (head, tail) = match userinfo_end {
        Some(at) => (
            format!("{}***", &url[..authority_start]),
            &url[authority_start + at..],
        ),
        None => (url[..authority_start].to_string(), rest),
    };
    head + &redact_query(tail)
}

/// `tail` (from the host on) with the values of credential-like query parameters hidden.
fn redact_query(tail: &str) -> String {
    let Some(query_start) = tail.find('?') else {
        return tail.to_string();
    };
    let (path, query) = tail.split_at(query_start + 1);
    let (query, fragment) = match query.find('#') {
        Some(i) => query.split_at(i),
        None => (query, ""),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if is_credential_name(name) => format!("{name}=***"),
            _ => param.to_string(),
        })
        .collect();
    format!("{path}{}{fragment}", params.join("&"))
}

/// Whether a query parameter (or setting) of this name holds a credential.
fn is_credential_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "pwd",
        "secret",
        "token",
        "key",
        "credential",
        "signature",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// A URL whose `Debug` hides its credentials ([`redact_url`]).
impl Redact for String {
    fn fmt_redacted(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(self), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("https://u:p%40ss@registry:8081/path?x=1"),
            "https://***@registry:8081/path?x=1"
        );
        assert_eq!(redact_url("http://registry:8081"), "http://registry:8081");
        assert_eq!(
            redact_url("http://host/a@b"),
            "http://host/a@b",
            "an @ in the path is not userinfo"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(
            redact_url("postgresql://floe:Secret/123@127.0.0.1:5432/iceberg"),
            "postgresql://***@127.0.0.1:5432/iceberg",
            "a password with an unescaped / is hidden whole"
        );
        assert_eq!(
            redact_url("postgresql://floe:a#b?c@db/iceberg?sslmode=require"),
            "postgresql://***@db/iceberg?sslmode=require"
        );
        assert_eq!(
            redact_url("postgresql://db:5432/iceberg?user=floe&password=hunter2&sslmode=require"),
            "postgresql://db:5432/iceberg?user=floe&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("https://s3/bucket/k?X-Amz-Signature=abc&X-Amz-Credential=AKIA#frag"),
            "https://s3/bucket/k?X-Amz-Signature=***&X-Amz-Credential=***#frag"
        );
        let uri: Redacted<String> = Redacted("postgresql://u:pw@db/x".to_string());
        assert_eq!(format!("{uri:?}"), r#""postgresql://***@db/x""#);
    }

    #[test]
    fn maps_show_keys_only() {
        let m: Redacted<BTreeMap<String, String>> = Redacted(BTreeMap::from([(
            "sasl.jaas.config".to_string(),
            "password=\"hunter2\"".to_string(),
        )]));
        let shown = format!("{m:?}");
        assert_eq!(shown, r#"{"sasl.jaas.config": "***"}"#);
        let v: Redacted<toml::Value> = Redacted(toml::from_str("api_key = \"k1\"").unwrap());
        assert_eq!(format!("{v:?}"), r#"{"api_key": "***"}"#);
        assert_eq!(format!("{:?}", Secret::new("s")), r#""***""#);
    }
}
