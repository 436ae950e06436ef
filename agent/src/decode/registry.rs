//! A Confluent schema-registry client: `GET /schemas/ids/{id}`, cached by id.
//!
//! Schemas are immutable per id, so a fetched schema is kept for the life of the
//! process. An id the registry does not know is remembered too (its records are
//! dead-lettered without asking again); an unreachable registry is an error of the
//! pipeline, never of a record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::DecodeError;
use super::avro::WriterSchema;
use crate::config::{Secret, redact_url};

/// `[pipelines.decode.registry]`. `Debug` hides the password and any credentials in the URL.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URL, e.g. `http://127.0.0.1:8081`.
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
        deserialize_with = "crate::config::duration::deserialize"
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

/// What the registry said about one id.
#[derive(Debug, Clone)]
enum Entry {
    Found(Arc<WriterSchema>),
    /// 404, or a schema that is not usable Avro: records with this id are dead-lettered.
    Rejected(DecodeError),
}

/// Fetches and caches writer schemas by id.
#[derive(Debug)]
pub struct RegistryClient {
    config: RegistryConfig,
    /// The URL as shown in messages, logs and dead-letter reasons (no credentials).
    shown: String,
    http: reqwest::Client,
    cache: Mutex<HashMap<u32, Entry>>,
}

#[derive(Deserialize)]
struct SchemaResponse {
    schema: String,
    #[serde(default, rename = "schemaType")]
    schema_type: Option<String>,
}

impl RegistryClient {
    /// A client for `config` (no request is made yet).
    pub fn new(config: RegistryConfig) -> Result<RegistryClient, DecodeError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| DecodeError::RegistryUnreachable {
                url: redact_url(&config.url),
                reason: e.without_url().to_string(),
            })?;
        Ok(RegistryClient {
            shown: redact_url(&config.url),
            config,
            http,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The cached schema of `id`; `None` when it was never fetched.
    pub fn cached(&self, id: u32) -> Option<Result<Arc<WriterSchema>, DecodeError>> {
        let cache = self.cache.lock().expect("registry cache lock");
        cache.get(&id).map(|e| match e {
            Entry::Found(s) => Ok(s.clone()),
            Entry::Rejected(err) => Err(err.clone()),
        })
    }

    /// Fetches `id` unless it is cached. Fails only when the registry cannot be asked
    /// (connection, timeout, 5xx, 401/403); a per-id answer is cached either way.
    pub async fn fetch(&self, id: u32) -> Result<(), DecodeError> {
        if self.cached(id).is_some() {
            return Ok(());
        }
        let url = format!("{}/schemas/ids/{id}", self.config.url.trim_end_matches('/'));
        let shown = format!("{}/schemas/ids/{id}", self.shown.trim_end_matches('/'));
        let unreachable = |reason: String| DecodeError::RegistryUnreachable {
            url: self.shown.clone(),
            reason,
        };
        let mut request = self
            .http
            .get(&url)
            .header("Accept", "application/vnd.schemaregistry.v1+json");
        if let Some(user) = &self.config.username {
            request = request.basic_auth(user, self.config.password.as_ref().map(Secret::expose));
        }
        let response = request
            .send()
            .await
            .map_err(|e| unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let entry = if status == reqwest::StatusCode::NOT_FOUND {
            Entry::Rejected(DecodeError::UnknownSchemaId {
                id,
                url: self.shown.clone(),
            })
        } else if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(unreachable(format!(
                "GET {shown}: HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            )));
        } else {
            let body: SchemaResponse = response.json().await.map_err(|e| {
                unreachable(format!(
                    "GET {shown}: unreadable answer: {}",
                    e.without_url()
                ))
            })?;
            match body.schema_type.as_deref() {
                None | Some("AVRO") => match WriterSchema::parse(Some(id), &body.schema) {
                    Ok(s) => Entry::Found(Arc::new(s)),
                    Err(e) => Entry::Rejected(e),
                },
                Some(other) => Entry::Rejected(DecodeError::BadSchema {
                    id: Some(id),
                    reason: format!("schema type {other} is not Avro"),
                }),
            }
        };
        if let Entry::Found(_) = &entry {
            tracing::info!(url = %self.shown, id, "fetched Avro schema from the registry");
        }
        self.cache
            .lock()
            .expect("registry cache lock")
            .insert(id, entry);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn credentials_in_the_url_stay_out_of_errors() {
        // Port 1 on loopback refuses: the error names the registry without its password.
        let client = RegistryClient::new(RegistryConfig {
            url: "http://reg-user:URL-SECRET@127.0.0.1:1".into(),
            username: None,
            password: None,
            timeout: Duration::from_secs(2),
        })
        .unwrap();
        let e = client.fetch(7).await.unwrap_err().to_string();
        assert!(!e.contains("URL-SECRET"), "{e}");
        assert!(e.contains("http://***@127.0.0.1:1"), "{e}");
    }
}
