//! OAUTHBEARER tokens for the Kafka clients (consumer, dead-letter producer, `floe
//! check`): OIDC client credentials from a token endpoint, or AWS MSK IAM (a SigV4
//! presigned `kafka-cluster:Connect` request signed with the agent's AWS identity).
//!
//! librdkafka asks for a token through the client context when it needs one and again
//! at 80% of its lifetime; the request runs on its own thread and runtime, because
//! librdkafka calls from inside a poll that may itself run on the async runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use rdkafka::client::OAuthToken;

use floe_iceberg::aws::{AwsCredentials, AwsError, AwsSettings};

/// How long an MSK IAM token is valid (what AWS's own signers use).
const MSK_TOKEN_LIFE: Duration = Duration::from_secs(900);
/// A token endpoint that does not answer in time fails this attempt (librdkafka retries).
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(30);
/// Characters left as they are in a query value (RFC 3986 unreserved).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Why no OAUTHBEARER token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The thread that fetches the token could not start its runtime.
    #[error("cannot start a runtime for the token request: {0}")]
    Runtime(#[source] std::io::Error),
    /// The thread that fetches the token panicked.
    #[error("the token request panicked")]
    Panicked,
    /// The HTTP client for the token endpoint could not be built.
    #[error("{0}")]
    Client(#[source] reqwest::Error),
    /// The token endpoint did not answer (connection refused, DNS, TLS, timeout).
    #[error("token endpoint {endpoint}: {source}")]
    Unreachable {
        /// Token endpoint URL.
        endpoint: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// The token endpoint refused the client credentials or failed.
    #[error("token endpoint {endpoint} answered {status}: {answer}")]
    Refused {
        /// Token endpoint URL.
        endpoint: String,
        /// The HTTP status of its answer.
        status: reqwest::StatusCode,
        /// The start of its answer.
        answer: String,
    },
    /// The token endpoint's answer is not a token response.
    #[error("token endpoint {endpoint}: unreadable answer: {source}")]
    Unreadable {
        /// Token endpoint URL.
        endpoint: String,
        /// Cause.
        source: serde_json::Error,
    },
    /// The token endpoint issued a token whose lifetime is over.
    #[error(
        "token endpoint {endpoint} issued a token that has already expired \
         (expires_in = {expires_in}): check the endpoint's clock and token lifetime"
    )]
    Expired {
        /// Token endpoint URL.
        endpoint: String,
        /// The lifetime it gave, in seconds.
        expires_in: i64,
    },
    /// No AWS credentials to sign an MSK IAM token with.
    #[error(transparent)]
    Aws(#[from] AwsError),
    /// The MSK IAM signing parameters are incomplete.
    #[error("{0}")]
    Params(#[source] v4::signing_params::BuildError),
    /// The MSK IAM request could not be signed.
    #[error("{0}")]
    Signing(#[source] aws_sigv4::http_request::SigningError),
}

/// Where OAUTHBEARER tokens come from.
#[derive(Debug)]
pub enum TokenSource {
    /// OAuth2 client credentials at an OIDC token endpoint.
    Oidc {
        /// Token endpoint URL.
        endpoint: String,
        /// Client id (also the principal name librdkafka shows).
        client_id: String,
        /// Client secret (hidden from `Debug`).
        client_secret: floe_iceberg::redact::Secret,
        /// Requested scope, if any.
        scope: Option<String>,
    },
    /// AWS MSK IAM: tokens signed for `region` with the agent's AWS identity.
    MskIam {
        /// The cluster's region.
        region: String,
        /// Whose credentials sign.
        aws: Arc<AwsCredentials>,
    },
}

impl TokenSource {
    /// An MSK IAM token source for `region` with the AWS identity `settings` describe.
    pub fn msk_iam(region: String, settings: AwsSettings) -> TokenSource {
        TokenSource::MskIam {
            region,
            aws: AwsCredentials::new(settings),
        }
    }

    /// A fresh token (blocking: called by librdkafka from its poll).
    pub fn token(&self) -> Result<OAuthToken, TokenError> {
        std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(TokenError::Runtime)?;
                runtime.block_on(self.fetch())
            })
            .join()
            .unwrap_or(Err(TokenError::Panicked))
        })
    }

    async fn fetch(&self) -> Result<OAuthToken, TokenError> {
        match self {
            TokenSource::Oidc {
                endpoint,
                client_id,
                client_secret,
                scope,
            } => {
                let secret = client_secret.expose();
                oidc_token(endpoint, client_id, secret, scope.as_deref()).await
            }
            TokenSource::MskIam { region, aws } => {
                let credentials = aws.credentials().await?;
                let token = msk_iam_token(region, credentials.into(), SystemTime::now())?;
                Ok(OAuthToken {
                    token,
                    principal_name: "msk-iam".into(),
                    lifetime_ms: epoch_ms(SystemTime::now() + MSK_TOKEN_LIFE),
                })
            }
        }
    }
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<i64>,
}

async fn oidc_token(
    endpoint: &str,
    client_id: &str,
    client_secret: &str,
    scope: Option<&str>,
) -> Result<OAuthToken, TokenError> {
    let mut form = vec![("grant_type", "client_credentials")];
    if let Some(scope) = scope {
        form.push(("scope", scope));
    }
    let client = reqwest::Client::builder()
        .timeout(ENDPOINT_TIMEOUT)
        .build()
        .map_err(TokenError::Client)?;
    let response = client
        .post(endpoint)
        .basic_auth(client_id, Some(client_secret))
        .form(&form)
        .send()
        .await
        .map_err(|source| TokenError::Unreachable {
            endpoint: endpoint.to_string(),
            source,
        })?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(TokenError::Refused {
            endpoint: endpoint.to_string(),
            status,
            answer: text.chars().take(300).collect(),
        });
    }
    let answer: TokenAnswer =
        serde_json::from_str(&text).map_err(|source| TokenError::Unreadable {
            endpoint: endpoint.to_string(),
            source,
        })?;
    // Without `expires_in` the token is taken to live an hour (librdkafka refreshes at 80%).
    let life = match answer.expires_in {
        None => Duration::from_secs(3600),
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        Some(s) => {
            return Err(TokenError::Expired {
                endpoint: endpoint.to_string(),
                expires_in: s,
            });
        }
    };
    Ok(OAuthToken {
        token: answer.access_token,
        principal_name: client_id.to_string(),
        lifetime_ms: epoch_ms(SystemTime::now() + life),
    })
}

/// The MSK IAM token: the base64url (unpadded) text of a SigV4-presigned URL
/// `https://kafka.{region}.amazonaws.com/?Action=kafka-cluster:Connect&...` for the
/// service `kafka-cluster`, with `User-Agent` appended after signing.
fn msk_iam_token(region: &str, identity: Identity, now: SystemTime) -> Result<String, TokenError> {
    let url = format!("https://kafka.{region}.amazonaws.com/?Action=kafka-cluster%3AConnect");
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(MSK_TOKEN_LIFE);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("kafka-cluster")
        .time(now)
        .settings(settings)
        .build()
        .map_err(TokenError::Params)?
        .into();
    let signable = SignableRequest::new(
        "GET",
        url.as_str(),
        std::iter::empty(),
        SignableBody::Bytes(&[]),
    )
    .map_err(TokenError::Signing)?;
    let (instructions, _) = sign(signable, &params)
        .map_err(TokenError::Signing)?
        .into_parts();
    let (_, query) = instructions.into_parts();
    let mut signed = url;
    for (name, value) in query {
        signed.push('&');
        signed.push_str(name);
        signed.push('=');
        signed.extend(utf8_percent_encode(&value, QUERY_VALUE));
    }
    signed.push_str("&User-Agent=");
    signed.extend(utf8_percent_encode(
        concat!("floe/", env!("CARGO_PKG_VERSION")),
        QUERY_VALUE,
    ));
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed))
}

/// The OAUTHBEARER items of an rdkafka `ClientContext` impl whose tokens are its field
/// `$tokens` (a [`ContextTokens`]): librdkafka asks for a token when one is due, and
/// gets it from there. Written inside the impl: `oauth_context!(tokens);`.
macro_rules! oauth_context {
    ($tokens:ident) => {
        const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

        fn generate_oauth_token(
            &self,
            _config: Option<&str>,
        ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
            self.$tokens.generate()
        }
    };
}
pub(crate) use oauth_context;

/// The OAUTHBEARER part of a client context.
#[derive(Debug, Default)]
pub(crate) struct ContextTokens {
    source: Option<Arc<TokenSource>>,
    served: AtomicBool,
}

impl ContextTokens {
    /// Tokens from `source` (`None`: the client does not use OAUTHBEARER).
    pub(crate) fn new(source: Option<Arc<TokenSource>>) -> ContextTokens {
        ContextTokens {
            source,
            served: AtomicBool::new(false),
        }
    }

    /// What `ClientContext::generate_oauth_token` answers.
    pub(crate) fn generate(&self) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        let Some(source) = &self.source else {
            return Err("OAUTHBEARER is not configured for this client".into());
        };
        let token = source.token()?;
        self.served.store(true, Ordering::Release);
        Ok(token)
    }

    /// librdkafka asks for the first token through an event that only polling serves;
    /// a metadata request made before that cannot authenticate. Polls with `poll` until
    /// a token was handed over, at most `timeout` (a failure is reported by librdkafka's
    /// own error events).
    pub(crate) fn serve_first(&self, timeout: Duration, poll: impl Fn()) {
        if self.source.is_none() {
            return;
        }
        let deadline = std::time::Instant::now() + timeout;
        while !self.served.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            poll();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::Credentials;

    #[test]
    fn an_msk_iam_token_is_a_presigned_connect_url() {
        let credentials =
            Credentials::new("AKIDTEST", "secret", Some("tok+en/=".into()), None, "t");
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = msk_iam_token("eu-west-1", credentials.into(), now).unwrap();
        let url = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&token)
                .unwrap(),
        )
        .unwrap();
        assert!(
            url.starts_with(
                "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ),
            "{url}"
        );
        for part in [
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Credential=AKIDTEST%2F20231114%2Feu-west-1%2Fkafka-cluster%2Faws4_request",
            "X-Amz-Expires=900",
            "X-Amz-Security-Token=tok%2Ben%2F%3D",
            "X-Amz-Signature=",
            "&User-Agent=floe%2F",
        ] {
            assert!(url.contains(part), "{part} missing in {url}");
        }
    }
}
