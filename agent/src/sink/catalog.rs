//! Opening the configured catalog.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::LocalFsStorageFactory;
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_sql::SqlCatalogBuilder;
use serde::Deserialize;

use super::SinkError;
use super::commit::{CommitBackend, RestBackend, SqlBackend};
use super::rest::{RestCatalog, RestCatalogConfig, RestSession};

/// An open catalog: the `Catalog` for reads and table creation, the backend our commit
/// layer uses for snapshot commits and, for a REST catalog, its session.
#[derive(Debug, Clone)]
pub struct CatalogHandle {
    /// Loads, lists and creates tables.
    pub catalog: Arc<dyn Catalog>,
    /// Applies commits (see [`super::commit`]).
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
pub async fn open_catalog(name: &str, config: &CatalogConfig) -> Result<CatalogHandle, SinkError> {
    match config {
        CatalogConfig::Embedded { path, warehouse } => {
            let db = absolute(path)?;
            let wh = absolute(warehouse)?;
            if let Some(dir) = db.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| SinkError::Io(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::create_dir_all(&wh)
                .map_err(|e| SinkError::Io(format!("cannot create {}: {e}", wh.display())))?;
            let detail = format!("sqlite file {}", db.display());
            let unreachable = |source| SinkError::Unreachable {
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
                catalog: Arc::new(catalog),
                committer,
                rest: None,
            })
        }
        CatalogConfig::Rest(rest) => {
            let failed = |source| SinkError::Rest {
                catalog: name.to_string(),
                source,
            };
            let session = RestSession::connect(name, rest).await.map_err(failed)?;
            let catalog = RestCatalog::new(session.clone(), rest.s3.clone());
            catalog
                .list_namespaces(None)
                .await
                .map_err(|source| SinkError::Unreachable {
                    catalog: name.to_string(),
                    detail: format!("REST catalog at {}", rest.uri),
                    source: Box::new(source),
                })?;
            Ok(CatalogHandle {
                catalog: Arc::new(catalog),
                committer: RestBackend::new(session.clone()),
                rest: Some(session),
            })
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf, SinkError> {
    std::path::absolute(p).map_err(|e| SinkError::Io(format!("bad path {}: {e}", p.display())))
}
