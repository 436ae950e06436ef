//! Table storage (FileIO) for REST tables: vended credentials, renewed before they
//! expire, or the agent's own S3 settings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use iceberg::io::{FileIO, FileIOBuilder};
use iceberg_catalog_rest::StorageCredential;
use iceberg_storage_opendal::{AwsCredential, OpenDalResolvingStorageFactory, ProvideCredential};
use reqsign_core::time::Timestamp;
use reqwest::Method;
use serde::Deserialize;
use tokio::sync::Mutex;

use super::config::{AccessDelegation, S3Settings};
use super::error::RestError;
use super::session::RestSession;
use crate::catalog::object_store::{self, SharedCredentials};

/// Vended credentials without an expiry time are fetched again after this long
/// (STS session credentials live at least 15 minutes).
const UNDATED_CREDENTIAL_LIFE: Duration = Duration::from_secs(10 * 60);

const ACCESS_KEY: &str = "s3.access-key-id";
const SECRET_KEY: &str = "s3.secret-access-key";
const SESSION_TOKEN: &str = "s3.session-token";
const EXPIRES_AT_MS: &str = "s3.session-token-expires-at-ms";

/// Builds the FileIO of a table from what load-table returned.
// upstream: vended storage credentials use (iceberg-rust 0.10 takes a table's vended
// credentials once and never renews them; delete when its FileIO refreshes them)
pub(crate) fn table_file_io(
    session: &RestSession,
    s3: &S3Settings,
    table_path: &str,
    location: &str,
    config: &HashMap<String, String>,
    credentials: &[StorageCredential],
) -> Result<FileIO, RestError> {
    // Catalog-wide properties, then the table's, then the agent's own endpoint/region/
    // addressing (the catalog may advertise an endpoint the agent cannot reach).
    let mut props: HashMap<String, String> = session
        .properties()
        .iter()
        .chain(config.iter())
        .filter(|(k, _)| !is_secret_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let delegated = session.delegation() == AccessDelegation::VendedCredentials;
    props.extend(s3.file_io_props(!delegated));
    props
        .entry("s3.region".into())
        .or_insert_with(|| "us-east-1".into());
    let mut factory = OpenDalResolvingStorageFactory::new();
    // Whether the table is written with the agent's own identity.
    let mut own = !delegated;
    if delegated {
        match vended(location, config, credentials) {
            Some(credential) => {
                let provider: SharedCredentials = Arc::new(VendedCredentials {
                    session: session.clone(),
                    table_path: table_path.to_string(),
                    location: location.to_string(),
                    current: Mutex::new(Some(credential)),
                });
                factory = object_store::sign_with(factory, location, provider);
            }
            None => {
                tracing::warn!(
                    catalog = %session.catalog(), table = %table_path,
                    "the catalog vended no storage credentials; using the agent's own (s3.* settings or the AWS chain)"
                );
                props.extend(s3.file_io_props(true));
                own = true;
            }
        }
    }
    if own && s3.access_key_id.is_none() {
        // No keys in the config: the AWS SDK's chain (and `aws.role_arn`) decides.
        factory = object_store::sign_with(factory, location, session.aws().clone());
    }
    Ok(FileIOBuilder::new(Arc::new(factory))
        .with_props(props)
        .build())
}

fn is_secret_key(key: &str) -> bool {
    [ACCESS_KEY, SECRET_KEY, SESSION_TOKEN, EXPIRES_AT_MS].contains(&key)
}

/// The credential for `location`: the `storage-credentials` entry with the longest
/// matching prefix, else keys in the table `config`.
fn vended(
    location: &str,
    config: &HashMap<String, String>,
    credentials: &[StorageCredential],
) -> Option<AwsCredential> {
    // Prefixes often end in '/', locations do not (`s3://b/wh/t/` covers `s3://b/wh/t`).
    let location = format!("{}/", location.trim_end_matches('/'));
    credentials
        .iter()
        .filter(|c| location.starts_with(&c.prefix) && c.config.contains_key(ACCESS_KEY))
        .max_by_key(|c| c.prefix.len())
        .and_then(|c| aws_credential(&c.config))
        .or_else(|| aws_credential(config))
}

fn aws_credential(props: &HashMap<String, String>) -> Option<AwsCredential> {
    let expires_in = props
        .get(EXPIRES_AT_MS)
        .and_then(|ms| ms.parse::<i64>().ok())
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .or_else(|| {
            Timestamp::from_second(
                Timestamp::now().as_second() + UNDATED_CREDENTIAL_LIFE.as_secs() as i64,
            )
            .ok()
        });
    Some(AwsCredential {
        access_key_id: props.get(ACCESS_KEY)?.clone(),
        secret_access_key: props.get(SECRET_KEY)?.clone(),
        session_token: props.get(SESSION_TOKEN).cloned(),
        expires_in,
    })
}

/// Hands the table's vended credential to the S3 signer and fetches a new one when the
/// signer finds it about to expire (two minutes ahead): from the catalog's
/// `/credentials` endpoint, or by loading the table again where there is none.
#[derive(Debug)]
struct VendedCredentials {
    session: RestSession,
    table_path: String,
    location: String,
    current: Mutex<Option<AwsCredential>>,
}

#[derive(Deserialize)]
struct CredentialsAnswer {
    #[serde(rename = "storage-credentials", default)]
    storage_credentials: Vec<StorageCredential>,
    #[serde(default)]
    config: HashMap<String, String>,
}

impl VendedCredentials {
    async fn fetch(&self) -> Result<AwsCredential, RestError> {
        let path = format!("{}/credentials", self.table_path);
        let answer = match self
            .session
            .call_as::<CredentialsAnswer>("load table credentials", Method::GET, &path, &[], None)
            .await
        {
            Err(e) if matches!(e.status(), Some(400 | 404 | 405 | 501)) => {
                self.session
                    .call_as::<CredentialsAnswer>(
                        "load table",
                        Method::GET,
                        &self.table_path,
                        &[],
                        None,
                    )
                    .await?
            }
            other => other?,
        };
        vended(&self.location, &answer.config, &answer.storage_credentials).ok_or_else(|| {
            RestError::Decode {
                operation: "load table credentials".into(),
                message: format!("no S3 credential for {}", self.location),
            }
        })
    }
}

impl ProvideCredential for VendedCredentials {
    type Credential = AwsCredential;

    async fn provide_credential(
        &self,
        _ctx: &reqsign_core::Context,
    ) -> reqsign_core::Result<Option<AwsCredential>> {
        use reqsign_core::SigningCredential;
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref()
            && c.is_valid()
        {
            return Ok(Some(c.clone()));
        }
        let fresh = self.fetch().await.map_err(|e| {
            tracing::warn!(table = %self.table_path, error = %e, "cannot renew vended storage credentials");
            reqsign_core::Error::credential_invalid(format!(
                "renewing vended credentials for {}: {e}",
                self.table_path
            ))
        })?;
        tracing::info!(table = %self.table_path, expires = ?fresh.expires_in, "renewed vended storage credentials");
        *current = Some(fresh.clone());
        Ok(Some(fresh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(prefix: &str, key: &str) -> StorageCredential {
        StorageCredential {
            prefix: prefix.into(),
            config: HashMap::from([
                (ACCESS_KEY.to_string(), key.to_string()),
                (SECRET_KEY.to_string(), "secret".to_string()),
                (EXPIRES_AT_MS.to_string(), "4102444800000".to_string()),
            ]),
        }
    }

    #[test]
    fn the_longest_matching_prefix_wins() {
        let creds = [
            cred("s3://wh/", "broad"),
            cred("s3://wh/db/t", "narrow"),
            cred("s3://other/", "elsewhere"),
        ];
        let c = vended("s3://wh/db/t", &HashMap::new(), &creds).unwrap();
        assert_eq!(c.access_key_id, "narrow");
        assert_eq!(c.expires_in.unwrap().as_second(), 4_102_444_800);
        let c = vended("s3://wh/db/u", &HashMap::new(), &creds).unwrap();
        assert_eq!(c.access_key_id, "broad");
        let slashed = [cred("s3://wh/db/t/", "slashed")];
        let c = vended("s3://wh/db/t", &HashMap::new(), &slashed).unwrap();
        assert_eq!(c.access_key_id, "slashed");
        assert!(vended("s3://wh/db/tt", &HashMap::new(), &slashed).is_none());
        let config = cred("", "from-config").config;
        assert_eq!(
            vended("s3://x/t", &config, &creds).unwrap().access_key_id,
            "from-config"
        );
        assert!(vended("s3://x/t", &HashMap::new(), &creds).is_none());
    }
}
