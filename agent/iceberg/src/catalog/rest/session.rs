//! One authenticated connection to a REST catalog: base path (with the prefix from
//! `/v1/config`), bearer token (renewed), extra headers and access delegation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::auth::TokenSource;
use super::config::{AccessDelegation, RestCatalogConfig};
use super::error::RestError;
use super::sigv4::SigV4;
use crate::catalog::aws::AwsCredentials;
use crate::retry::Policy;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest `Retry-After` honoured; a longer one is waited this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Eight answers of 429 (Too Many Requests) are waited out (as long as `Retry-After`
/// says, else with backoff) before the error is returned.
const THROTTLED_RETRY: Policy =
    Policy::backoff(Duration::from_millis(500), MAX_RETRY_AFTER).attempts(9);

/// An authenticated client of one REST catalog; cheap to clone, shared by every table
/// of the catalog. Tokens are renewed before they expire and once after a 401.
#[derive(Clone)]
pub struct RestSession {
    inner: Arc<Inner>,
}

struct Inner {
    catalog: String,
    uri: String,
    /// `{uri}/v1/` or `{uri}/v1/{prefix}/`.
    base: String,
    http: reqwest::Client,
    tokens: TokenSource,
    headers: HeaderMap,
    delegation: AccessDelegation,
    /// Catalog properties from `/v1/config` (defaults overlaid with overrides).
    properties: HashMap<String, String>,
    /// The agent's AWS identity (SigV4, and S3 without vended credentials or keys).
    aws: Arc<AwsCredentials>,
    /// With `sigv4 = true`: signs every request.
    sigv4: Option<SigV4>,
}

impl std::fmt::Debug for RestSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestSession")
            .field("catalog", &self.inner.catalog)
            .field("base", &self.inner.base)
            .finish_non_exhaustive()
    }
}

impl RestSession {
    /// Opens a session: reads `/v1/config` (which also proves the credential works) and
    /// keeps the prefix it names.
    pub async fn connect(name: &str, config: &RestCatalogConfig) -> Result<RestSession, RestError> {
        RestSession::new(name, config)?
            .configure(config.warehouse.as_deref())
            .await
    }

    /// A session that has not talked to the catalog yet (see [`RestSession::configure`]).
    pub fn new(name: &str, config: &RestCatalogConfig) -> Result<RestSession, RestError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("floe/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RestError::Config(format!("HTTP client: {e}")))?;
        let mut headers = HeaderMap::new();
        if config.access_delegation == AccessDelegation::VendedCredentials {
            headers.insert(
                HeaderName::from_static("x-iceberg-access-delegation"),
                HeaderValue::from_static("vended-credentials"),
            );
        }
        for (k, v) in &config.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| RestError::Config(format!("header {k:?}: not a valid header name")))?;
            let value = HeaderValue::from_str(v).map_err(|_| {
                RestError::Config(format!("header {k:?}: not a valid header value"))
            })?;
            headers.insert(name, value);
        }
        if config.allow_insecure_http {
            for (field, url) in config.cleartext_secrets() {
                tracing::warn!(catalog = %name, %field, %url, "INSECURE: catalog credentials are sent over plain http:// to a host that is not loopback (allow_insecure_http = true); anyone on the network path can read them");
            }
        }
        let uri = config.uri.trim_end_matches('/').to_string();
        let aws = AwsCredentials::new(config.aws.clone());
        let sigv4 = match config.sigv4 {
            false => None,
            true => Some(SigV4 {
                credentials: aws.clone(),
                region: config.signing_region().ok_or_else(|| {
                    RestError::Config("sigv4 needs a region: set signing_region".into())
                })?,
                service: config.signing_name().to_string(),
            }),
        };
        Ok(RestSession {
            inner: Arc::new(Inner {
                catalog: name.to_string(),
                base: format!("{uri}/v1/"),
                uri: uri.clone(),
                http,
                tokens: TokenSource::from_config(config)?,
                headers,
                delegation: config.access_delegation,
                properties: HashMap::new(),
                aws,
                sigv4,
            }),
        })
    }

    /// Reads `/v1/config` for `warehouse` and keeps the prefix and properties it returns.
    pub async fn configure(mut self, warehouse: Option<&str>) -> Result<RestSession, RestError> {
        let uri = self.inner.uri.clone();
        let name = self.inner.catalog.clone();
        let query: Vec<(&str, &str)> = match warehouse {
            Some(w) => vec![("warehouse", w)],
            None => Vec::new(),
        };
        let answer = self
            .call("read catalog config", Method::GET, "config", &query, None)
            .await
            .map_err(|e| match e {
                RestError::Status {
                    status: 404,
                    operation,
                    message,
                } => RestError::Status {
                    status: 404,
                    operation,
                    message: format!(
                        "no Iceberg REST API at {uri}/v1/config ({message}); check `uri` \
                         (for Polaris it ends in /api/catalog) and `warehouse`"
                    ),
                },
                other => other,
            })?
            .unwrap_or(Value::Null);
        let mut properties = HashMap::new();
        for section in ["defaults", "overrides"] {
            if let Some(map) = answer.get(section).and_then(Value::as_object) {
                for (k, v) in map {
                    if let Some(v) = v.as_str() {
                        properties.insert(k.clone(), v.to_string());
                    }
                }
            }
        }
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            RestError::Config("a session is configured before it is shared".into())
        })?;
        if let Some(prefix) = properties.get("prefix").filter(|p| !p.is_empty()) {
            inner.base = format!("{uri}/v1/{}/", prefix.trim_matches('/'));
        }
        inner.properties = properties;
        tracing::info!(catalog = %name, base = %self.inner.base, "connected to REST catalog");
        Ok(self)
    }

    /// Sends a request to `path`, relative to `{uri}/v1/{prefix}/`, with the bearer
    /// token, extra headers and access-delegation header; a 401 renews the token and
    /// retries once. Returns the JSON body (`Null` for an empty 2xx answer) or
    /// [`RestError::Status`] for any non-2xx answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, RestError> {
        let operation = format!("{method} {path}");
        let path = path.trim_start_matches('/');
        Ok(self
            .call(&operation, method, path, &[], body)
            .await?
            .unwrap_or(Value::Null))
    }

    /// Like [`RestSession::send`] with a user-facing operation name and a query string.
    pub(crate) async fn call(
        &self,
        operation: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Option<Value>, RestError> {
        let url = format!("{}{path}", self.inner.base);
        let mut retried = false;
        let mut throttled = THROTTLED_RETRY.start();
        loop {
            let bearer = self.inner.tokens.bearer(&self.inner.http).await?;
            let mut request = self
                .inner
                .http
                .request(method.clone(), &url)
                .headers(self.inner.headers.clone())
                .query(query);
            if let Some(token) = &bearer {
                request = request.bearer_auth(token);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let http_error = |source| RestError::Http {
                operation: operation.to_string(),
                url: url.clone(),
                source,
            };
            let mut request = request.build().map_err(http_error)?;
            if let Some(sigv4) = &self.inner.sigv4 {
                sigv4.sign(&mut request).await.map_err(|m| {
                    RestError::Config(format!("{operation}: cannot sign the request (SigV4): {m}"))
                })?;
            }
            let response = self.inner.http.execute(request).await.map_err(http_error)?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED
                && !retried
                && let Some(token) = &bearer
                && self.inner.tokens.reject(token).await
            {
                tracing::info!(catalog = %self.inner.catalog, %operation, "token rejected (401); fetching a new one");
                retried = true;
                continue;
            }
            // The request was not processed: waiting and sending it again is safe.
            if status == StatusCode::TOO_MANY_REQUESTS
                && let Some(backoff) = throttled.retry_after(crate::ErrorClass::Transient)
            {
                let wait = retry_after(response.headers()).unwrap_or(backoff);
                tracing::warn!(catalog = %self.inner.catalog, %operation, attempt = throttled.failures(), wait_ms = wait.as_millis() as u64, "catalog answered 429 (too many requests): waiting");
                tokio::time::sleep(wait).await;
                continue;
            }
            // AWS services name the error's type in a header (`InvalidSignatureException`).
            let aws_type = response
                .headers()
                .get("x-amzn-errortype")
                .and_then(|v| v.to_str().ok())
                .map(|t| t.split(':').next().unwrap_or(t).to_string());
            let text = response.text().await.unwrap_or_default();
            if !status.is_success() {
                let message = error_message(&text);
                return Err(RestError::Status {
                    status: status.as_u16(),
                    operation: operation.to_string(),
                    message: match aws_type {
                        Some(t) if !message.contains(&t) => format!("{t}: {message}"),
                        _ => message,
                    },
                });
            }
            if text.trim().is_empty() {
                return Ok(None);
            }
            return serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| RestError::Decode {
                    operation: operation.to_string(),
                    message: format!("{e}"),
                });
        }
    }

    /// Like [`RestSession::call`], decoding the answer into `T`.
    pub(crate) async fn call_as<T: serde::de::DeserializeOwned>(
        &self,
        operation: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<T, RestError> {
        let value = self
            .call(operation, method, path, query, body)
            .await?
            .unwrap_or(Value::Null);
        serde_json::from_value(value).map_err(|e| RestError::Decode {
            operation: operation.to_string(),
            message: e.to_string(),
        })
    }

    /// Obtains a token now; `Ok(false)` when the catalog is used without one.
    pub async fn obtain_token(&self) -> Result<bool, RestError> {
        Ok(self.inner.tokens.bearer(&self.inner.http).await?.is_some())
    }

    /// The base path requests go to (`{uri}/v1/{prefix}/`).
    pub fn base(&self) -> &str {
        &self.inner.base
    }

    /// OAuth2 tokens fetched since the session started.
    pub fn tokens_fetched(&self) -> u64 {
        self.inner.tokens.fetched()
    }

    /// The catalog's name in the config.
    pub fn catalog(&self) -> &str {
        &self.inner.catalog
    }

    /// The catalog's base URI.
    pub fn uri(&self) -> &str {
        &self.inner.uri
    }

    /// Whether tables come with vended storage credentials.
    pub fn delegation(&self) -> AccessDelegation {
        self.inner.delegation
    }

    /// Catalog properties from `/v1/config`.
    pub fn properties(&self) -> &HashMap<String, String> {
        &self.inner.properties
    }

    /// The agent's AWS identity for this catalog.
    pub(crate) fn aws(&self) -> &Arc<AwsCredentials> {
        &self.inner.aws
    }

    /// With `sigv4 = true`: `(service, region)` of the signatures, once credentials load.
    pub async fn signer(&self) -> Option<Result<(String, String), crate::catalog::aws::AwsError>> {
        let sigv4 = self.inner.sigv4.as_ref()?;
        Some(
            sigv4
                .credentials
                .credentials()
                .await
                .map(|_| (sigv4.service.clone(), sigv4.region.clone())),
        )
    }
}

/// The wait a `Retry-After` header asks for (seconds or an HTTP date), capped.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The `message` of an Iceberg `ErrorModel` body, else the body itself (shortened).
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    if let Some(m) = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message").or(Some(e)))
        .and_then(Value::as_str)
    {
        return m.to_string();
    }
    // AWS's own JSON error shape: `{"__type": "...", "message": "..."}`.
    if let Some(v) = &parsed
        && let Some(m) = v
            .get("message")
            .or(v.get("Message"))
            .and_then(Value::as_str)
    {
        return match v.get("__type").and_then(Value::as_str) {
            Some(t) => format!("{}: {m}", t.rsplit('#').next().unwrap_or(t)),
            None => m.to_string(),
        };
    }
    body.trim().chars().take(300).collect()
}

/// A namespace as one path segment: levels joined by the unit separator, escaped.
pub(crate) fn namespace_path(levels: &[String]) -> String {
    encode(&levels.join("\u{1f}"))
}

/// Percent-encodes a path segment.
pub(crate) fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_or_as_a_date_is_capped() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after", HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past");
    }

    #[test]
    fn paths_and_error_bodies() {
        assert_eq!(namespace_path(&["a".into(), "b c".into()]), "a%1Fb%20c");
        assert_eq!(
            error_message(
                r#"{"error":{"message":"Table does not exist: db.t","type":"NoSuchTableException","code":404}}"#
            ),
            "Table does not exist: db.t"
        );
        assert_eq!(error_message("plain text\n"), "plain text");
    }
}
