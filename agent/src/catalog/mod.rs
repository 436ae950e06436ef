//! Catalog access: the configured catalog (embedded SQLite file or Iceberg REST), opened
//! once per agent and shared by its pipelines.
//!
//! - [`open_catalog`]: opens a catalog and checks that it answers (lists namespaces).
//! - `rest`: the Iceberg REST client (OAuth2, vended credentials, S3).
//! - `object_store`: listing and deleting a table's files on S3 (orphan cleanup).
//! - [`CatalogHandle`]: what the other stages use: the `iceberg::Catalog` for loads and
//!   creation, and the commit backend of [`crate::commit`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::LocalFsStorageFactory;
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_sql::SqlCatalogBuilder;
use serde::Deserialize;

pub mod object_store;
pub mod probe;
pub mod rest;
mod timed;

pub use timed::{CALL_TIMEOUT, Timed};

use crate::commit::{CommitBackend, RestBackend, SqlBackend};
use rest::{RestCatalog, RestCatalogConfig, RestSession};

/// Why a catalog could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The catalog could not be opened or did not answer.
    #[error("catalog {catalog:?} is unreachable ({detail}): {source}")]
    Unreachable {
        /// Catalog name from the config.
        catalog: String,
        /// Where we tried to reach it.
        detail: String,
        /// The cause.
        source: Box<iceberg::Error>,
    },
    /// A REST catalog could not be opened (no answer, credential refused, wrong URI).
    #[error("catalog {catalog:?}: {source}")]
    Rest {
        /// Catalog name from the config.
        catalog: String,
        /// The cause.
        source: rest::RestError,
    },
    /// A local path of the embedded catalog is unusable.
    #[error("catalog {catalog:?}: {message}")]
    Local {
        /// Catalog name from the config.
        catalog: String,
        /// What is wrong.
        message: String,
    },
}

/// An open catalog: the `Catalog` for reads and table creation, the backend our commit
/// layer uses for snapshot commits and, for a REST catalog, its session.
#[derive(Debug, Clone)]
pub struct CatalogHandle {
    /// Loads, lists and creates tables.
    pub catalog: Arc<dyn Catalog>,
    /// Applies commits (see [`crate::commit`]).
    pub committer: Arc<dyn CommitBackend>,
    /// The REST session, for `type = "rest"` (token checks in `floe check`).
    pub rest: Option<RestSession>,
}

/// `[catalogs.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum CatalogConfig {
    /// A SQLite catalog file plus a local warehouse directory; no server.
    /// The file uses the Iceberg JDBC/SQL catalog layout (`iceberg_tables`,
    /// `iceberg_namespace_properties`), so PyIceberg's `SqlCatalog` opens it too.
    Embedded {
        /// SQLite file (created if missing).
        path: PathBuf,
        /// Directory holding table data and metadata (created if missing).
        warehouse: PathBuf,
    },
    /// An Iceberg REST catalog (Polaris, Lakekeeper, Nessie, ...), tables on S3.
    Rest(Box<RestCatalogConfig>),
}

impl CatalogConfig {
    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        match self {
            CatalogConfig::Embedded { .. } => Vec::new(),
            CatalogConfig::Rest(rest) => rest.problems(),
        }
    }
}

/// Opens a catalog and checks that it answers (by listing namespaces).
pub async fn open_catalog(
    name: &str,
    config: &CatalogConfig,
) -> Result<CatalogHandle, CatalogError> {
    match config {
        CatalogConfig::Embedded { path, warehouse } => {
            let local = |message: String| CatalogError::Local {
                catalog: name.to_string(),
                message,
            };
            let db = absolute(path).map_err(local)?;
            let wh = absolute(warehouse).map_err(local)?;
            if let Some(dir) = db.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| local(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::create_dir_all(&wh)
                .map_err(|e| local(format!("cannot create {}: {e}", wh.display())))?;
            let detail = format!("sqlite file {}", db.display());
            let unreachable = |source| CatalogError::Unreachable {
                catalog: name.to_string(),
                detail: detail.clone(),
                source: Box::new(source),
            };
            let props = HashMap::from([
                (
                    "uri".to_string(),
                    format!("sqlite://{}?mode=rwc", db.display()),
                ),
                ("warehouse".to_string(), format!("file://{}", wh.display())),
                ("sql_bind_style".to_string(), "QMark".to_string()),
                // SQLite allows one writer; a small pool avoids lock errors.
                ("pool.max-connections".to_string(), "1".to_string()),
            ]);
            let catalog = SqlCatalogBuilder::default()
                .with_storage_factory(Arc::new(LocalFsStorageFactory))
                .load(name, props)
                .await
                .map_err(unreachable)?;
            catalog.list_namespaces(None).await.map_err(unreachable)?;
            let committer = SqlBackend::open(&db, name)
                .await
                .map_err(|e| unreachable(iceberg::Error::new(iceberg::ErrorKind::Unexpected, e)))?;
            Ok(CatalogHandle {
                catalog: Arc::new(Timed::new(
                    Arc::new(catalog),
                    &format!("catalog {name:?}"),
                    CALL_TIMEOUT,
                )),
                committer,
                rest: None,
            })
        }
        CatalogConfig::Rest(rest) => {
            let failed = |source| CatalogError::Rest {
                catalog: name.to_string(),
                source,
            };
            let session = RestSession::connect(name, rest).await.map_err(failed)?;
            let catalog = RestCatalog::new(session.clone(), rest.s3.clone());
            catalog
                .list_namespaces(None)
                .await
                .map_err(|source| CatalogError::Unreachable {
                    catalog: name.to_string(),
                    detail: format!("REST catalog at {}", rest.uri),
                    source: Box::new(source),
                })?;
            Ok(CatalogHandle {
                catalog: Arc::new(Timed::new(
                    Arc::new(catalog),
                    &format!("catalog {name:?}"),
                    CALL_TIMEOUT,
                )),
                committer: RestBackend::new(session.clone()),
                rest: Some(session),
            })
        }
    }
}

/// Whether a catalog error says the table (or its namespace) does not exist. The SQL
/// catalog reports a missing table as an unexpected error with this message; that
/// string is matched here, once, for every caller.
pub fn is_not_found(e: &iceberg::Error) -> bool {
    matches!(
        e.kind(),
        iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound
    ) || e.message().contains("No such table")
}

/// Whether a creation failed because the table already exists (another writer created
/// it first). The SQL catalog checks first, but a creation racing another one fails on
/// the table's unique key instead; that message is matched here.
pub fn is_already_exists(e: &iceberg::Error) -> bool {
    e.kind() == iceberg::ErrorKind::TableAlreadyExists
        || e.message().contains("UNIQUE constraint failed")
        || e.to_string().contains("UNIQUE constraint failed")
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("bad path {}: {e}", p.display()))
}
