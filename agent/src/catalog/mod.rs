//! Catalog access: the configured catalog (embedded SQLite file, a SQL catalog on
//! Postgres, or Iceberg REST), opened once per agent and shared by its pipelines.
//!
//! - [`open_catalog`]: opens a catalog and checks that it answers (lists namespaces).
//! - `rest`: the Iceberg REST client (OAuth2 or SigV4, vended credentials, S3).
//! - `aws`: the agent's own AWS identity (aws-config's default chain, assume role).
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

pub mod aws;
pub mod object_store;
pub mod probe;
pub mod rest;
mod timed;

pub use timed::{CALL_TIMEOUT, Timed};

use crate::commit::{CommitBackend, RestBackend, SqlBackend};
use crate::config::redact_url;
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
    /// A SQL catalog in a Postgres database, shared by agents on several machines: the
    /// Iceberg JDBC/SQL catalog layout, which Spark's `JdbcCatalog`, PyIceberg's
    /// `SqlCatalog` and Trino's JDBC catalog open too.
    Sql {
        /// `postgresql://user@host:port/database`; the password from the URI or the
        /// `PGPASSWORD` environment variable; `?sslmode=require` for TLS.
        uri: String,
        /// Directory holding table data and metadata, mounted at the same path by every
        /// agent and reader (created if missing).
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
            CatalogConfig::Sql { uri, .. } => {
                if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
                    Vec::new()
                } else {
                    vec![(
                        "uri".into(),
                        "must start with postgresql:// (the SQL catalog runs on Postgres)".into(),
                    )]
                }
            }
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
            let wh = local_warehouse(name, warehouse)?;
            if let Some(dir) = db.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| local(format!("cannot create {}: {e}", dir.display())))?;
            }
            let sql = SqlDatabase {
                uri: format!("sqlite://{}?mode=rwc", db.display()),
                detail: format!("sqlite file {}", db.display()),
                bind_style: "QMark",
                // SQLite allows one writer; a small pool avoids lock errors.
                connections: 1,
            };
            let committer = SqlBackend::open(&db, name);
            open_sql(name, &sql, &wh, committer).await
        }
        CatalogConfig::Sql { uri, warehouse } => {
            let wh = local_warehouse(name, warehouse)?;
            let sql = SqlDatabase {
                uri: uri.clone(),
                detail: format!("postgres at {}", redact_url(uri)),
                bind_style: "DollarNumeric",
                connections: 4,
            };
            // Agents starting together race to create the catalog's tables; the loser
            // fails on Postgres's catalog of types and succeeds when it tries again.
            let mut attempt = 0;
            loop {
                let committer = SqlBackend::connect_postgres(uri, name);
                match open_sql(name, &sql, &wh, committer).await {
                    Err(e) if attempt < 3 && e.to_string().contains("duplicate key") => {
                        attempt += 1;
                        tokio::time::sleep(crate::error::backoff(
                            attempt,
                            std::time::Duration::from_millis(200),
                            std::time::Duration::from_secs(2),
                        ))
                        .await;
                    }
                    opened => return opened,
                }
            }
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

/// A database holding a catalog in the SQL catalog layout.
struct SqlDatabase {
    /// Connection URI, as sqlx takes it.
    uri: String,
    /// Where it is, for messages (no credentials).
    detail: String,
    /// Placeholder style of iceberg-rust's SQL catalog: `QMark` (SQLite) or
    /// `DollarNumeric` (Postgres).
    bind_style: &'static str,
    /// Pool size of the catalog's reads and creations.
    connections: u32,
}

/// Opens a SQL-layout catalog: iceberg-rust's `SqlCatalog` for loads and creation (it
/// creates the catalog's tables if missing), checked by listing namespaces, and
/// `committer`, the commit backend on the same database.
async fn open_sql(
    name: &str,
    sql: &SqlDatabase,
    warehouse: &Path,
    committer: impl std::future::Future<Output = Result<Arc<SqlBackend>, String>>,
) -> Result<CatalogHandle, CatalogError> {
    let unreachable = |source| CatalogError::Unreachable {
        catalog: name.to_string(),
        detail: sql.detail.clone(),
        source: Box::new(source),
    };
    let props = HashMap::from([
        ("uri".to_string(), sql.uri.clone()),
        (
            "warehouse".to_string(),
            format!("file://{}", warehouse.display()),
        ),
        ("sql_bind_style".to_string(), sql.bind_style.to_string()),
        (
            "pool.max-connections".to_string(),
            sql.connections.to_string(),
        ),
    ]);
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(Arc::new(LocalFsStorageFactory))
        .load(name, props)
        .await
        .map_err(unreachable)?;
    catalog.list_namespaces(None).await.map_err(unreachable)?;
    let committer = committer
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

/// The absolute path of a local warehouse directory, created if missing.
fn local_warehouse(name: &str, warehouse: &Path) -> Result<PathBuf, CatalogError> {
    let local = |message: String| CatalogError::Local {
        catalog: name.to_string(),
        message,
    };
    let wh = absolute(warehouse).map_err(local)?;
    std::fs::create_dir_all(&wh)
        .map_err(|e| local(format!("cannot create {}: {e}", wh.display())))?;
    Ok(wh)
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
/// the table's unique key instead (SQLite's and Postgres's messages are matched here).
pub fn is_already_exists(e: &iceberg::Error) -> bool {
    const UNIQUE_KEY: [&str; 2] = [
        "UNIQUE constraint failed",
        "duplicate key value violates unique constraint",
    ];
    e.kind() == iceberg::ErrorKind::TableAlreadyExists
        || UNIQUE_KEY
            .iter()
            .any(|m| e.message().contains(m) || e.to_string().contains(m))
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("bad path {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sql_catalog_runs_on_postgres() {
        let sql = |uri: &str| CatalogConfig::Sql {
            uri: uri.into(),
            warehouse: "w".into(),
        };
        assert!(sql("postgresql://db/iceberg").problems().is_empty());
        assert!(sql("postgres://db/iceberg").problems().is_empty());
        let problems = sql("mysql://db/iceberg").problems();
        assert_eq!(problems[0].0, "uri", "{problems:?}");
    }
}
