//! Bearer tokens for catalog requests: a static token, or an OAuth2 client-credentials
//! token that is fetched again before `expires_in` runs out and after a 401.
//! (iceberg-catalog-rest 0.10 never refreshes its token, which ends long-running jobs.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::Mutex;

use super::config::{RestCatalogConfig, Secret, valid_client_credential};
use super::error::RestError;
use crate::retry::{Policy, retry};

/// Refresh when this share of the token's life has passed (48 minutes into an hour).
const REFRESH_AT_SHARE: f64 = 0.8;
/// A token fetch is tried 6 times while the endpoint is unreachable or answers
/// 408/429/5xx.
const TOKEN_RETRY: Policy =
    Policy::backoff(Duration::from_millis(500), Duration::from_secs(15)).attempts(6);

// upstream: REST token refresh (iceberg-catalog-rest 0.10 keeps its first OAuth2 token
// forever and does not retry after a 401; delete when it refreshes)
/// Where tokens come from.
pub(crate) enum TokenSource {
    /// No `Authorization` header.
    Anonymous,
    /// A fixed bearer token.
    Static(Secret),
    /// OAuth2 client credentials exchanged at `endpoint`.
    ClientCredentials {
        endpoint: String,
        client_id: String,
        client_secret: Secret,
        scope: Option<String>,
        current: Mutex<Option<Token>>,
        /// How many tokens were fetched (logged, and read by tests).
        fetched: AtomicU64,
    },
}

/// A token and when to fetch the next one.
pub(crate) struct Token {
    value: Secret,
    refresh_at: Option<Instant>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct OAuthError {
    error: String,
    error_description: Option<String>,
}

impl TokenSource {
    /// Chooses the source from the config (reads `credential_file` now).
    pub(crate) fn from_config(config: &RestCatalogConfig) -> Result<TokenSource, RestError> {
        let pair = match (&config.credential, &config.credential_file, &config.token) {
            (_, _, Some(token)) => return Ok(TokenSource::Static(token.clone())),
            (Some(c), _, _) => c.expose().trim().to_string(),
            (None, Some(path), _) => std::fs::read_to_string(path)
                .map_err(|e| {
                    RestError::Config(format!(
                        "cannot read credential_file {}: {e}",
                        path.display()
                    ))
                })?
                .trim()
                .to_string(),
            (None, None, None) => return Ok(TokenSource::Anonymous),
        };
        if !valid_client_credential(&pair) {
            return Err(RestError::Config(
                "credential must be client_id:client_secret (both non-empty)".into(),
            ));
        }
        let (id, secret) = pair.split_once(':').expect("checked above");
        Ok(TokenSource::ClientCredentials {
            endpoint: config.token_endpoint(),
            client_id: id.trim().to_string(),
            client_secret: Secret::new(secret.trim()),
            scope: config.scope.clone(),
            current: Mutex::new(None),
            fetched: AtomicU64::new(0),
        })
    }

    /// The token to send now, fetching a new one when there is none or it is due.
    pub(crate) async fn bearer(&self, http: &reqwest::Client) -> Result<Option<String>, RestError> {
        match self {
            TokenSource::Anonymous => Ok(None),
            TokenSource::Static(t) => Ok(Some(t.expose().to_string())),
            TokenSource::ClientCredentials { current, .. } => {
                let mut current = current.lock().await;
                let due = current
                    .as_ref()
                    .is_none_or(|t| t.refresh_at.is_some_and(|at| Instant::now() >= at));
                if due {
                    *current = Some(self.fetch_with_retries(http).await?);
                }
                Ok(current.as_ref().map(|t| t.value.expose().to_string()))
            }
        }
    }

    /// Forgets `rejected` (after a 401) so the next call fetches a new token. Returns
    /// whether a retry can help (a static token cannot be renewed).
    pub(crate) async fn reject(&self, rejected: &str) -> bool {
        match self {
            TokenSource::ClientCredentials { current, .. } => {
                let mut current = current.lock().await;
                if current
                    .as_ref()
                    .is_some_and(|t| t.value.expose() == rejected)
                {
                    *current = None;
                }
                true
            }
            _ => false,
        }
    }

    /// Tokens fetched so far.
    pub(crate) fn fetched(&self) -> u64 {
        match self {
            TokenSource::ClientCredentials { fetched, .. } => fetched.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// [`TokenSource::fetch`], retried with capped backoff while the failure is transient
    /// (no answer, 408, 429, 5xx); a refused credential fails at once.
    async fn fetch_with_retries(&self, http: &reqwest::Client) -> Result<Token, RestError> {
        retry(
            TOKEN_RETRY,
            || self.fetch(http),
            RestError::class,
            |e, attempt, wait| tracing::warn!(attempt, error = %e, wait_ms = wait.as_millis() as u64, "OAuth2 token request failed: retrying"),
        )
        .await
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<Token, RestError> {
        let TokenSource::ClientCredentials {
            endpoint,
            client_id,
            client_secret,
            scope,
            fetched,
            ..
        } = self
        else {
            unreachable!("only client credentials are fetched");
        };
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", client_id.as_str()),
            ("client_secret", client_secret.expose()),
        ];
        if let Some(s) = scope {
            form.push(("scope", s.as_str()));
        }
        let response = http
            .post(endpoint)
            .form(&form)
            .send()
            .await
            .map_err(|source| RestError::Http {
                operation: "OAuth2 token request".into(),
                url: endpoint.clone(),
                source,
            })?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        if status == 404 {
            return Err(RestError::Token {
                endpoint: endpoint.clone(),
                status,
                message: "no token endpoint there; check `uri` (for Polaris it ends in /api/catalog) or set `oauth2_server_uri`".into(),
            });
        }
        if !(200..300).contains(&status) {
            let message = match serde_json::from_str::<OAuthError>(&body) {
                Ok(e) => match e.error_description {
                    Some(d) => format!("{}: {d}", e.error),
                    None => e.error,
                },
                Err(_) => body.chars().take(300).collect(),
            };
            let message = format!(
                "{message}; the credential is wrong or expired, or the scope is not allowed \
                 (check `credential` = client_id:client_secret and `scope`)"
            );
            return Err(RestError::Token {
                endpoint: endpoint.clone(),
                status,
                message,
            });
        }
        let parsed: TokenResponse = serde_json::from_str(&body).map_err(|e| RestError::Token {
            endpoint: endpoint.clone(),
            status,
            message: format!("no access_token in the answer: {e}"),
        })?;
        let n = fetched.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(endpoint = %endpoint, expires_in = ?parsed.expires_in, tokens = n, "obtained catalog token");
        Ok(Token {
            value: Secret::new(parsed.access_token),
            refresh_at: parsed
                .expires_in
                .map(refresh_delay)
                .map(|d| Instant::now() + d),
        })
    }
}

/// How long to use a token that lives `expires_in` seconds.
fn refresh_delay(expires_in: u64) -> Duration {
    Duration::from_secs(expires_in).mul_f64(REFRESH_AT_SHARE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> RestCatalogConfig {
        toml::from_str(&format!(
            "uri = \"http://127.0.0.1:1/api/catalog\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn credential_sources() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("polaris");
        std::fs::write(&file, "etl:from-file\n").unwrap();
        let source = TokenSource::from_config(&config(&format!(
            "credential_file = \"{}\"\nscope = \"PRINCIPAL_ROLE:ALL\"",
            file.display()
        )))
        .unwrap();
        let TokenSource::ClientCredentials {
            endpoint,
            client_id,
            client_secret,
            scope,
            ..
        } = &source
        else {
            panic!("expected client credentials");
        };
        assert_eq!(endpoint, "http://127.0.0.1:1/api/catalog/v1/oauth/tokens");
        assert_eq!(client_id, "etl");
        assert_eq!(client_secret.expose(), "from-file");
        assert_eq!(scope.as_deref(), Some("PRINCIPAL_ROLE:ALL"));
        let missing = TokenSource::from_config(&config("credential_file = \"/nonexistent/x\""));
        assert!(
            matches!(&missing, Err(RestError::Config(m)) if m.contains("cannot read credential_file /nonexistent/x")),
            "{:?}",
            missing.err()
        );
        assert!(matches!(
            TokenSource::from_config(&config("token = \"t\"")),
            Ok(TokenSource::Static(_))
        ));
        assert!(matches!(
            TokenSource::from_config(&config("")),
            Ok(TokenSource::Anonymous)
        ));
    }

    #[test]
    fn tokens_are_renewed_before_they_run_out() {
        assert_eq!(refresh_delay(3), Duration::from_millis(2400));
        assert_eq!(refresh_delay(3600), Duration::from_secs(2880));
        assert_eq!(refresh_delay(0), Duration::ZERO);
    }
}
