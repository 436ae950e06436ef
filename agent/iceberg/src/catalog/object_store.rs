//! Listing and deleting a table's files on an object store (S3 and S3-compatible), which
//! iceberg-rust's `FileIO` cannot do: orphan cleanup needs both. The store is opened
//! with the table's own FileIO properties (endpoint, region, addressing, keys) and, for
//! REST tables with vended credentials, the same credential provider the table uses.
//!
//! Would be replaced by a listing API on `FileIO` (iceberg-rust has none in 0.10).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::SystemTime;

use futures::TryStreamExt;
use iceberg_storage_opendal::{
    AwsCredential, CustomAwsCredentialLoader, OpenDalResolvingStorageFactory,
};
use opendal::Operator;
use reqsign_core::{ProvideCredential, ProvideCredentialChain, ProvideCredentialDyn};

/// A credential provider shared by a table's FileIO and its listings.
pub(crate) type SharedCredentials = Arc<dyn ProvideCredentialDyn<Credential = AwsCredential>>;

/// Vended-credential providers by table location (the newest load of each table).
static PROVIDERS: LazyLock<Mutex<HashMap<String, SharedCredentials>>> =
    LazyLock::new(Default::default);

/// Remembers the credential provider of the table (or warehouse) at `location` for
/// listings.
fn register_credentials(location: &str, provider: SharedCredentials) {
    let mut providers = PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    providers.insert(location.trim_end_matches('/').to_string(), provider);
}

/// The provider registered for `location` or the longest prefix of it (a table's own,
/// else its warehouse's).
fn credentials_for(location: &str) -> Option<SharedCredentials> {
    let location = location.trim_end_matches('/');
    let providers = PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    providers
        .iter()
        .filter(|(prefix, _)| {
            location == prefix.as_str()
                || location
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, provider)| provider.clone())
}

/// `factory` signing S3 requests with `provider`, which orphan listings under
/// `location` use too.
pub(crate) fn sign_with(
    factory: OpenDalResolvingStorageFactory,
    location: &str,
    provider: SharedCredentials,
) -> OpenDalResolvingStorageFactory {
    register_credentials(location, provider.clone());
    factory.with_s3_credential_loader(CustomAwsCredentialLoader::new(Shared(provider)))
}

/// Hands a shared provider to one operator's credential chain.
#[derive(Debug)]
pub(crate) struct Shared(pub(crate) SharedCredentials);

impl ProvideCredential for Shared {
    type Credential = AwsCredential;

    async fn provide_credential(
        &self,
        ctx: &reqsign_core::Context,
    ) -> reqsign_core::Result<Option<AwsCredential>> {
        self.0.provide_credential_dyn(ctx).await
    }
}

/// A file found under a location.
#[derive(Debug, Clone)]
pub struct ListedFile {
    /// Its full location (`s3://bucket/key`).
    pub location: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification time, if the store reports one.
    pub modified: Option<SystemTime>,
}

// upstream: FileIO listing (iceberg-rust 0.10 FileIO cannot list a prefix; delete when
// it can, with the table's own credentials)
/// An object store opened at a table location.
pub struct ObjectStore {
    op: Operator,
    /// `s3://bucket/`: prefix of every location in this store.
    base: String,
    /// Key prefix of the table location within the bucket, ending in `/`.
    prefix: String,
}

impl ObjectStore {
    /// Opens the store of `location` (an `s3://`, `s3a://` or `s3n://` location) with
    /// `props`, the table's FileIO properties. `None` for other schemes.
    pub fn open(
        location: &str,
        props: &HashMap<String, String>,
    ) -> Result<Option<Self>, ObjectStoreError> {
        let Some((scheme, rest)) = location.split_once("://") else {
            return Ok(None);
        };
        if !matches!(scheme, "s3" | "s3a" | "s3n") {
            return Ok(None);
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let mut builder = opendal::services::S3::default().bucket(bucket).root("/");
        let get = |k: &str| props.get(k).map(String::as_str);
        if let Some(v) = get("s3.endpoint") {
            builder = builder.endpoint(v);
        }
        if let Some(v) = get("client.region").or(get("s3.region")) {
            builder = builder.region(v);
        }
        // Iceberg's default is virtual-host addressing; `s3.path-style-access` turns it off.
        let path_style = get("s3.path-style-access")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "t" | "1" | "on"));
        if !path_style {
            builder = builder.enable_virtual_host_style();
        }
        if let Some(v) = get("s3.access-key-id") {
            builder = builder.access_key_id(v);
        }
        if let Some(v) = get("s3.secret-access-key") {
            builder = builder.secret_access_key(v);
        }
        if let Some(v) = get("s3.session-token") {
            builder = builder.session_token(v);
        }
        if let Some(provider) = credentials_for(location) {
            builder = builder
                .credential_provider_chain(ProvideCredentialChain::new().push(Shared(provider)));
        }
        let op = Operator::new(builder)
            .map_err(|source| ObjectStoreError::Open {
                location: location.to_string(),
                source,
            })?
            .finish();
        let prefix = format!("{}/", key.trim_end_matches('/'));
        Ok(Some(ObjectStore {
            op,
            base: format!("{scheme}://{bucket}/"),
            prefix: prefix.trim_start_matches('/').to_string(),
        }))
    }

    /// Every file under the location, recursively.
    pub async fn list(&self) -> Result<Vec<ListedFile>, ObjectStoreError> {
        let mut lister = self
            .op
            .lister_with(&self.prefix)
            .recursive(true)
            .await
            .map_err(|e| self.listing(e))?;
        let mut out = Vec::new();
        while let Some(entry) = lister.try_next().await.map_err(|e| self.listing(e))? {
            if entry.path().ends_with('/') {
                continue;
            }
            let meta = entry.metadata();
            out.push(ListedFile {
                location: format!("{}{}", self.base, entry.path().trim_start_matches('/')),
                size: meta.content_length(),
                modified: meta.last_modified().map(SystemTime::from),
            });
        }
        Ok(out)
    }

    /// Deletes the file at `location` (a location [`ObjectStore::list`] returned).
    pub async fn delete(&self, location: &str) -> Result<(), ObjectStoreError> {
        let key = location.strip_prefix(&self.base).unwrap_or(location);
        self.op
            .delete(key)
            .await
            .map_err(|source| ObjectStoreError::Delete {
                location: location.to_string(),
                source,
            })
    }

    fn listing(&self, source: opendal::Error) -> ObjectStoreError {
        ObjectStoreError::List {
            location: format!("{}{}", self.base, self.prefix),
            source,
        }
    }
}

/// An operation on an object store failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// The store's settings cannot make a client.
    #[error("opening {location}: {source}")]
    Open {
        /// The table location.
        location: String,
        /// The object store's error.
        source: opendal::Error,
    },
    /// Listing the files under the location failed.
    #[error("listing {location}: {source}")]
    List {
        /// The location listed.
        location: String,
        /// The object store's error.
        source: opendal::Error,
    },
    /// A file could not be deleted.
    #[error("deleting {location}: {source}")]
    Delete {
        /// The file's location.
        location: String,
        /// The object store's error.
        source: opendal::Error,
    },
}
