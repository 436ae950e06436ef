//! A Confluent schema-registry client: `GET /schemas/ids/{id}`, plus
//! `GET /subjects/{subject}/versions/{version}` for the schemas a schema references,
//! for the schema types `AVRO`, `PROTOBUF` and `JSON`.
//!
//! Schemas are immutable per id, so a parsed schema is kept (in a bounded cache, least
//! recently used out first). An id the registry does not know, a schema that does not
//! parse or a reference that does not exist is remembered too: its records are
//! dead-lettered with the reason without asking again. An unreachable registry
//! (connection, timeout, 5xx, 401/403) is an error of the pipeline, never of a record;
//! each request is tried three times before it is reported.
//!
//! Credentials never appear in messages: a URL's `user:password@` is moved into the basic
//! auth header and every message names the URL without it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::DecodeError;
use super::avro::WriterSchema;
use super::json_schema::JsonSchemaDoc;
use super::protobuf::ProtoSchema;
use crate::error::ErrorClass;
use crate::error::retry::{Policy, retry};
use crate::settings::{Secret, redact_url};

/// Parsed schemas kept per client (ids); least recently used ones go first.
const MAX_SCHEMAS: usize = 1024;
/// Referenced subject versions kept per client.
const MAX_REFERENCED: usize = 1024;
/// Most schemas one schema may reference, transitively.
const MAX_REFERENCES: usize = 256;
/// A request is tried 3 times (waiting about 250 ms, then 500 ms) while the registry
/// cannot answer, before it is reported unreachable; the intake then keeps asking.
const REQUEST_RETRY: Policy =
    Policy::backoff(Duration::from_millis(250), Duration::from_secs(1)).attempts(3);

/// `[pipelines.decode.registry]`. `Debug` hides the password and any credentials in the URL.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URL, e.g. `http://127.0.0.1:8081` (a `user:password@` in it is used as basic auth).
    pub url: String,
    /// Basic-auth user (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Per-request timeout (default 10s).
    #[serde(
        default = "default_timeout",
        deserialize_with = "crate::settings::duration::deserialize"
    )]
    pub timeout: Duration,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &redact_url(&self.url))
            .field("username", &self.username)
            .field("password", &self.password)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl RegistryConfig {
    /// Problems of the section, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        match reqwest::Url::parse(&self.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => Vec::new(),
            Ok(u) => vec![(
                "registry.url",
                format!("scheme {} is not http or https", u.scheme()),
            )],
            Err(e) => vec![("registry.url", format!("not a URL: {e}"))],
        }
    }
}

/// A schema the registry gave for an id, parsed according to its schema type.
#[derive(Debug, Clone)]
pub enum RegistrySchema {
    /// `AVRO` (the default schema type).
    Avro(Arc<WriterSchema>),
    /// `PROTOBUF`.
    Protobuf(Arc<ProtoSchema>),
    /// `JSON` (JSON Schema).
    Json(Arc<JsonSchemaDoc>),
}

impl RegistrySchema {
    /// The registry's name of the schema type.
    pub fn type_name(&self) -> &'static str {
        match self {
            RegistrySchema::Avro(_) => "AVRO",
            RegistrySchema::Protobuf(_) => "PROTOBUF",
            RegistrySchema::Json(_) => "JSON",
        }
    }
}

/// A small map that keeps at most `cap` entries, dropping the least recently used.
#[derive(Debug)]
struct Bounded<K, V> {
    map: HashMap<K, (V, u64)>,
    tick: u64,
    cap: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Bounded<K, V> {
    fn new(cap: usize) -> Self {
        Bounded {
            map: HashMap::new(),
            tick: 0,
            cap,
        }
    }

    fn get(&mut self, k: &K) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(k).map(|(v, used)| {
            *used = tick;
            v.clone()
        })
    }

    fn insert(&mut self, k: K, v: V) {
        self.tick += 1;
        if self.map.len() >= self.cap
            && !self.map.contains_key(&k)
            && let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
        self.map.insert(k, (v, self.tick));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// A schema as the registry serves it.
#[derive(Debug, Clone, Deserialize)]
struct RawSchema {
    schema: String,
    #[serde(default, rename = "schemaType")]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

/// `{"name": "import name", "subject": "...", "version": N}`.
#[derive(Debug, Clone, Deserialize)]
struct Reference {
    name: String,
    subject: String,
    version: i64,
}

/// Why a request did not give a schema.
enum Failure {
    /// 404: the id or subject version does not exist.
    NotFound,
    /// The registry could not be asked.
    Unreachable(String),
    /// The registry did not answer or answered 429/5xx: asking again can help.
    Down(String),
}

impl Failure {
    fn class(&self) -> ErrorClass {
        match self {
            Failure::Down(_) => ErrorClass::Transient,
            Failure::NotFound | Failure::Unreachable(_) => ErrorClass::Fatal,
        }
    }
}

/// Fetches, parses and caches schemas by id.
#[derive(Debug)]
pub struct RegistryClient {
    /// Base URL without credentials or a trailing slash: also what messages show.
    base: String,
    username: Option<String>,
    password: Option<String>,
    http: reqwest::Client,
    schemas: Mutex<Bounded<u32, Result<RegistrySchema, DecodeError>>>,
    referenced: Mutex<Bounded<(String, i64), Arc<RawSchema>>>,
}

impl RegistryClient {
    /// A client for `config` (no request is made yet).
    pub fn new(config: RegistryConfig) -> Result<RegistryClient, DecodeError> {
        let mut url =
            reqwest::Url::parse(&config.url).map_err(|e| DecodeError::RegistryUnreachable {
                url: redact(&config.url),
                reason: format!("not a URL: {e}"),
            })?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let mut username = config.username.clone();
        let mut password = config.password.as_ref().map(|p| p.expose().to_string());
        if !url.username().is_empty() {
            username = username.or_else(|| Some(decode(url.username())));
            password = password.or_else(|| url.password().map(decode));
        }
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let base = url.as_str().trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| DecodeError::RegistryUnreachable {
                url: base.clone(),
                reason: error_chain(e),
            })?;
        Ok(RegistryClient {
            base,
            username,
            password,
            http,
            schemas: Mutex::new(Bounded::new(MAX_SCHEMAS)),
            referenced: Mutex::new(Bounded::new(MAX_REFERENCED)),
        })
    }

    /// The registry URL as messages show it (no credentials).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The cached schema of `id`; `None` when it was never fetched (or was evicted).
    pub fn cached(&self, id: u32) -> Option<Result<RegistrySchema, DecodeError>> {
        self.schemas.lock().expect("registry cache lock").get(&id)
    }

    /// Fetches `id` unless it is cached. Fails only when the registry cannot be asked
    /// (connection, timeout, 5xx, 401/403); a per-id answer is cached either way.
    pub async fn fetch(&self, id: u32) -> Result<(), DecodeError> {
        if self.cached(id).is_some() {
            return Ok(());
        }
        let entry = match self.get::<RawSchema>(&format!("/schemas/ids/{id}")).await {
            Ok(raw) => self.parse(id, raw).await?,
            Err(Failure::NotFound) => Err(DecodeError::UnknownSchemaId {
                id,
                url: self.base.clone(),
            }),
            Err(Failure::Unreachable(reason) | Failure::Down(reason)) => {
                return Err(DecodeError::RegistryUnreachable {
                    url: self.base.clone(),
                    reason,
                });
            }
        };
        if let Ok(schema) = &entry {
            tracing::info!(url = %self.base, id, schema_type = schema.type_name(), "fetched schema from the registry");
        }
        self.schemas
            .lock()
            .expect("registry cache lock")
            .insert(id, entry);
        Ok(())
    }

    /// Parses a fetched schema with its references. The outer error is the pipeline's
    /// (unreachable); the inner one is the schema's (its records are dead-lettered).
    async fn parse(
        &self,
        id: u32,
        raw: RawSchema,
    ) -> Result<Result<RegistrySchema, DecodeError>, DecodeError> {
        let references = match self.references(&raw).await? {
            Ok(r) => r,
            Err(reason) => {
                return Ok(Err(DecodeError::BadSchema {
                    id: Some(id),
                    reason,
                }));
            }
        };
        let texts: Vec<(String, String)> = references
            .iter()
            .map(|(name, r)| (name.clone(), r.schema.clone()))
            .collect();
        Ok(match raw.schema_type.as_deref().unwrap_or("AVRO") {
            "AVRO" => {
                let deps: Vec<&str> = texts.iter().map(|(_, t)| t.as_str()).collect();
                WriterSchema::parse_with_references(Some(id), &raw.schema, &deps)
                    .map(|s| RegistrySchema::Avro(Arc::new(s)))
            }
            "PROTOBUF" => ProtoSchema::from_registry(id, &raw.schema, &texts)
                .map(|s| RegistrySchema::Protobuf(Arc::new(s))),
            "JSON" => JsonSchemaDoc::parse(Some(id), &raw.schema, &texts)
                .map(|s| RegistrySchema::Json(Arc::new(s))),
            other => Err(DecodeError::BadSchema {
                id: Some(id),
                reason: format!("unknown schema type {other}"),
            }),
        })
    }

    /// Every schema `raw` references, transitively, as (reference name, schema), each
    /// after the schemas it references itself. `Ok(Err(reason))` when one does not exist.
    async fn references(
        &self,
        raw: &RawSchema,
    ) -> Result<Result<Vec<(String, Arc<RawSchema>)>, String>, DecodeError> {
        let mut out: Vec<(String, Arc<RawSchema>)> = Vec::new();
        // Depth-first, children before parents: (reference, children pushed yet).
        let mut stack: Vec<(Reference, bool)> = raw
            .references
            .iter()
            .rev()
            .map(|r| (r.clone(), false))
            .collect();
        let mut fetched: HashMap<String, Arc<RawSchema>> = HashMap::new();
        while let Some((reference, expanded)) = stack.pop() {
            if out.iter().any(|(n, _)| *n == reference.name) {
                continue;
            }
            if out.len() + stack.len() > MAX_REFERENCES {
                return Ok(Err(format!("more than {MAX_REFERENCES} schema references")));
            }
            let schema = match fetched.get(&reference.name) {
                Some(s) => s.clone(),
                None => match self.referenced(&reference).await? {
                    Some(s) => {
                        fetched.insert(reference.name.clone(), s.clone());
                        s
                    }
                    None => {
                        return Ok(Err(format!(
                            "reference {} (subject {}, version {}) is not in the registry",
                            reference.name, reference.subject, reference.version
                        )));
                    }
                },
            };
            if expanded {
                out.push((reference.name.clone(), schema));
                continue;
            }
            if stack.iter().any(|(r, e)| *e && r.name == reference.name) {
                return Ok(Err(format!(
                    "schema references form a cycle through {}",
                    reference.name
                )));
            }
            let children = schema.references.clone();
            stack.push((reference, true));
            for child in children.into_iter().rev() {
                stack.push((child, false));
            }
        }
        Ok(Ok(out))
    }

    /// One referenced subject version (cached); `None` when the registry does not have it.
    async fn referenced(&self, r: &Reference) -> Result<Option<Arc<RawSchema>>, DecodeError> {
        let key = (r.subject.clone(), r.version);
        if let Some(s) = self
            .referenced
            .lock()
            .expect("registry cache lock")
            .get(&key)
        {
            return Ok(Some(s));
        }
        let subject: String =
            percent_encoding::utf8_percent_encode(&r.subject, percent_encoding::NON_ALPHANUMERIC)
                .collect();
        let path = format!("/subjects/{subject}/versions/{}", r.version);
        match self.get::<RawSchema>(&path).await {
            Ok(raw) => {
                let raw = Arc::new(raw);
                self.referenced
                    .lock()
                    .expect("registry cache lock")
                    .insert(key, raw.clone());
                Ok(Some(raw))
            }
            Err(Failure::NotFound) => Ok(None),
            Err(Failure::Unreachable(reason) | Failure::Down(reason)) => {
                Err(DecodeError::RegistryUnreachable {
                    url: self.base.clone(),
                    reason,
                })
            }
        }
    }

    /// `GET {base}{path}` as JSON, retried under [`REQUEST_RETRY`].
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        retry(
            REQUEST_RETRY,
            || self.get_once(path),
            Failure::class,
            |_, _, _| {},
        )
        .await
    }

    async fn get_once<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        let mut request = self
            .http
            .get(format!("{}{path}", self.base))
            .header("Accept", "application/vnd.schemaregistry.v1+json");
        if let Some(user) = &self.username {
            request = request.basic_auth(user, self.password.as_deref());
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Down(format!("GET {path}: {}", error_chain(e))))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(Failure::NotFound);
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let reason = format!(
                "GET {path}: HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            );
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                return Err(Failure::Down(reason));
            }
            // 401, 403 and other client errors do not heal by asking again.
            return Err(Failure::Unreachable(reason));
        }
        response.json::<T>().await.map_err(|e| {
            Failure::Unreachable(format!("GET {path}: unreadable answer: {}", error_chain(e)))
        })
    }
}

/// A reqwest error with its causes, without the URL (which may carry credentials).
fn error_chain(e: reqwest::Error) -> String {
    crate::error::with_causes(&e.without_url())
}

/// `url` without `user:password@` (for messages about a URL that does not parse).
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_keeps_what_is_used() {
        let mut cache = Bounded::new(3);
        for i in 0..3 {
            cache.insert(i, i * 10);
        }
        assert_eq!(cache.get(&0), Some(0));
        cache.insert(3, 30);
        assert_eq!(cache.len(), 3);
        assert_eq!(
            cache.get(&1),
            None,
            "the least recently used entry went first"
        );
        assert_eq!(cache.get(&0), Some(0));
        assert_eq!(cache.get(&3), Some(30));
    }

    #[test]
    fn credentials_in_the_url_become_basic_auth_and_never_show() {
        let client = RegistryClient::new(RegistryConfig {
            url: "https://floe:s%40cret@registry.example:8081/base/".into(),
            username: None,
            password: None,
            timeout: default_timeout(),
        })
        .unwrap();
        assert_eq!(client.url(), "https://registry.example:8081/base");
        assert_eq!(client.username.as_deref(), Some("floe"));
        assert_eq!(client.password.as_deref(), Some("s@cret"));
        assert_eq!(
            redact("http://u:p@[bad"),
            "http://[bad",
            "an unparsable URL is redacted too"
        );
        let bad = RegistryConfig {
            url: "ftp://x".into(),
            username: None,
            password: None,
            timeout: default_timeout(),
        };
        assert!(bad.problems()[0].1.contains("not http"));
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_reported_without_credentials() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = RegistryClient::new(RegistryConfig {
            url: format!("http://floe:topsecret@127.0.0.1:{port}"),
            username: None,
            password: None,
            timeout: Duration::from_secs(2),
        })
        .unwrap();
        let e = client.fetch(1).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!(
                "schema registry at http://127.0.0.1:{port} is unreachable"
            )),
            "{text}"
        );
        assert!(!text.contains("topsecret"), "{text}");
        assert!(e.stops_pipeline());
        assert!(
            client.cached(1).is_none(),
            "nothing is cached for an unreachable registry"
        );
    }
}
