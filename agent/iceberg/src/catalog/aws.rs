//! AWS credentials from the AWS SDK's default chain (`aws-config`): environment, shared
//! config and credentials files with profiles (`role_arn`, `credential_process`, SSO),
//! web identity token file (EKS IRSA), ECS and Pod Identity, IMDSv2; optionally then
//! assuming a role (cross-account access). Cached and fetched again before they expire;
//! shared by the S3 storage of tables (when the catalog vends none) and by SigV4
//! signing of catalog requests.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::sts::AssumeRoleProvider;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use iceberg_storage_opendal::AwsCredential;
use reqsign_core::ProvideCredential;
use reqsign_core::time::Timestamp;
use serde::Deserialize;
use tokio::sync::{Mutex, OnceCell};

use crate::error::with_causes;

/// Credentials are fetched again this long before they expire.
const REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);

/// `[catalogs.NAME.aws]`: how the agent finds its own AWS identity. Without any of
/// these the SDK's default chain decides (`AWS_PROFILE`, `AWS_ROLE_ARN` with
/// `AWS_WEB_IDENTITY_TOKEN_FILE`, instance metadata, ...).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AwsSettings {
    /// A profile of the shared config files, instead of `AWS_PROFILE`.
    pub profile: Option<String>,
    /// Region for STS and signing, instead of `AWS_REGION` or the profile's.
    pub region: Option<String>,
    /// A role to assume with the chain's credentials (e.g. a lake bucket's role in
    /// another account).
    pub role_arn: Option<String>,
    /// External id the role's trust policy requires.
    pub external_id: Option<String>,
    /// Session name of the assumed role (default `floe`), shown in CloudTrail.
    pub role_session_name: Option<String>,
}

impl AwsSettings {
    /// The first of `given` that is set, else `region`, else `AWS_REGION` or
    /// `AWS_DEFAULT_REGION`.
    pub fn region_or_env(&self, given: &[Option<&String>]) -> Option<String> {
        given
            .iter()
            .flatten()
            .map(|r| r.to_string())
            .chain(self.region.clone())
            .chain(std::env::var("AWS_REGION").ok())
            .chain(std::env::var("AWS_DEFAULT_REGION").ok())
            .find(|r| !r.is_empty())
    }
}

/// Why the agent has no AWS credentials.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    /// The SDK's default chain has nothing to ask (no environment, profile or metadata).
    #[error("the AWS SDK found no credential provider")]
    NoProvider,
    /// The credential provider failed and no cached credentials are still valid.
    #[error("no AWS credentials: {}", with_causes(.0))]
    Credentials(#[source] CredentialsError),
}

/// The agent's AWS credentials, loaded on first use and cached.
#[derive(Debug)]
pub struct AwsCredentials {
    settings: AwsSettings,
    provider: OnceCell<SharedCredentialsProvider>,
    current: Mutex<Option<Credentials>>,
}

impl AwsCredentials {
    /// Credentials found as `settings` say (nothing is loaded before the first use).
    pub fn new(settings: AwsSettings) -> Arc<AwsCredentials> {
        Arc::new(AwsCredentials {
            settings,
            provider: OnceCell::new(),
            current: Mutex::new(None),
        })
    }

    async fn provider(&self) -> Result<&SharedCredentialsProvider, AwsError> {
        self.provider
            .get_or_try_init(|| async {
                let s = &self.settings;
                let mut loader = aws_config::defaults(BehaviorVersion::latest());
                if let Some(region) = &s.region {
                    loader = loader.region(Region::new(region.clone()));
                }
                if let Some(profile) = &s.profile {
                    loader = loader.profile_name(profile);
                }
                let sdk = loader.load().await;
                let chain = sdk.credentials_provider().ok_or(AwsError::NoProvider)?;
                let Some(arn) = &s.role_arn else {
                    return Ok(chain);
                };
                let mut role = AssumeRoleProvider::builder(arn.clone())
                    .session_name(s.role_session_name.as_deref().unwrap_or("floe"))
                    .configure(&sdk);
                if let Some(id) = &s.external_id {
                    role = role.external_id(id.clone());
                }
                Ok(SharedCredentialsProvider::new(role.build().await))
            })
            .await
    }

    /// Current credentials: cached, fetched again `REFRESH_AHEAD` before they expire;
    /// while a refresh fails, the cached ones are used as long as they are valid.
    pub async fn credentials(&self) -> Result<Credentials, AwsError> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some(c) = current.as_ref()
            && c.expiry().is_none_or(|e| e > now + REFRESH_AHEAD)
        {
            return Ok(c.clone());
        }
        match self.provider().await?.provide_credentials().await {
            Ok(fresh) => {
                tracing::debug!(expiry = ?fresh.expiry(), "loaded AWS credentials");
                *current = Some(fresh.clone());
                Ok(fresh)
            }
            Err(e) => match current.as_ref() {
                Some(c) if c.expiry().is_none_or(|x| x > now + Duration::from_secs(30)) => {
                    tracing::warn!(error = %with_causes(&e), "cannot refresh AWS credentials; using the current ones");
                    Ok(c.clone())
                }
                _ => Err(AwsError::Credentials(e)),
            },
        }
    }
}

impl ProvideCredential for AwsCredentials {
    type Credential = AwsCredential;

    async fn provide_credential(
        &self,
        _ctx: &reqsign_core::Context,
    ) -> reqsign_core::Result<Option<AwsCredential>> {
        let c = self
            .credentials()
            .await
            .map_err(|e| reqsign_core::Error::credential_invalid(e.to_string()).with_source(e))?;
        Ok(Some(AwsCredential {
            access_key_id: c.access_key_id().to_string(),
            secret_access_key: c.secret_access_key().to_string(),
            session_token: c.session_token().map(str::to_string),
            expires_in: c.expiry().and_then(|t| {
                let ms = t.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64;
                Timestamp::from_millisecond(ms).ok()
            }),
        }))
    }
}
