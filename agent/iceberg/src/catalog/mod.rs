//! Catalog access: the configured catalog (embedded SQLite file, a SQL catalog on
//! Postgres, or Iceberg REST), opened once per agent and shared by its pipelines.
//!
//! - [`open_catalog`]: opens a catalog and checks that it answers (lists namespaces).
//! - `rest`: the Iceberg REST client (OAuth2 or SigV4, vended credentials, S3).
//! - `aws`: the agent's own AWS identity (aws-config's default chain, assume role).
//! - `object_store`: listing and deleting a table's files on S3 (orphan cleanup).
//! - [`CatalogHandle`]: what the other stages use: the `iceberg::Catalog` for loads and
//!   creation, and the commit backend of [`crate::commit()`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::{LocalFsStorageFactory, StorageFactory};
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_sql::SqlCatalogBuilder;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use serde::Deserialize;

pub mod aws;
pub(crate) mod backend;
pub mod object_store;
pub mod rest;
mod timed;

pub use timed::{CALL_TIMEOUT, Timed};

use crate::redact::{Redacted, redact_url};
use backend::{CommitBackend, RestBackend, SqlBackend};
use rest::{RestCatalog, RestCatalogConfig, RestSession, S3Settings};

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
    /// A local path of the embedded catalog cannot be resolved or created.
    #[error("catalog {catalog:?}: {action} {}: {source}", path.display())]
    Path {
        /// Catalog name from the config.
        catalog: String,
        /// What failed: "bad path" or "cannot create".
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl CatalogError {
    /// Whether opening the catalog again later can succeed.
    pub fn class(&self) -> crate::ErrorClass {
        match self {
            CatalogError::Unreachable { source, .. } => crate::error::iceberg_class(source),
            CatalogError::Rest { source, .. } => source.class(),
            CatalogError::Local { .. } | CatalogError::Path { .. } => crate::ErrorClass::Fatal,
        }
    }
}

/// An open catalog: the `Catalog` for reads and table creation, the backend our commit
/// layer uses for snapshot commits and, for a REST catalog, its session.
#[derive(Debug, Clone)]
pub struct CatalogHandle {
    /// Loads, lists and creates tables.
    pub catalog: Arc<dyn Catalog>,
    /// Applies commits (see [`crate::commit()`]).
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
        /// Where table data and metadata go: a local directory (created if missing), or
        /// `s3://bucket/prefix` on S3 or an S3-compatible store.
        warehouse: String,
        /// S3 settings of an `s3://` warehouse (endpoint, region, addressing, static
        /// keys); without keys the AWS identity of `aws.*` is used.
        #[serde(default)]
        s3: S3Settings,
        /// How the agent finds its AWS identity for an `s3://` warehouse.
        #[serde(default)]
        aws: aws::AwsSettings,
    },
    /// A SQL catalog in a Postgres database, shared by agents on several machines: the
    /// Iceberg JDBC/SQL catalog layout, which Spark's `JdbcCatalog`, PyIceberg's
    /// `SqlCatalog` and Trino's JDBC catalog open too.
    Sql {
        /// `postgresql://user@host:port/database`; the password from the URI or the
        /// `PGPASSWORD` environment variable; `?sslmode=require` for TLS. Shown with its
        /// credentials hidden.
        uri: Redacted<String>,
        /// Where table data and metadata go: `s3://bucket/prefix` (S3 or an
        /// S3-compatible store), or a directory mounted at the same path by every agent
        /// and reader (created if missing).
        warehouse: String,
        /// S3 settings of an `s3://` warehouse (endpoint, region, addressing, static
        /// keys); without keys the AWS identity of `aws.*` is used.
        #[serde(default)]
        s3: S3Settings,
        /// How the agent finds its AWS identity for an `s3://` warehouse.
        #[serde(default)]
        aws: aws::AwsSettings,
    },
    /// An Iceberg REST catalog (Polaris, Lakekeeper, Nessie, ...), tables on S3.
    Rest(Box<RestCatalogConfig>),
}

impl CatalogConfig {
    /// An embedded catalog: SQLite file `path`, tables in the local directory
    /// `warehouse`.
    pub fn embedded(path: impl Into<PathBuf>, warehouse: impl AsRef<Path>) -> CatalogConfig {
        CatalogConfig::Embedded {
            path: path.into(),
            warehouse: warehouse.as_ref().display().to_string(),
            s3: S3Settings::default(),
            aws: aws::AwsSettings::default(),
        }
    }

    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        match self {
            CatalogConfig::Embedded { .. } => Vec::new(),
            CatalogConfig::Sql { uri, .. } => {
                if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
                    match backend::check_postgres_uri(uri) {
                        Ok(()) => Vec::new(),
                        Err(why) => vec![("uri".into(), why)],
                    }
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
        CatalogConfig::Embedded {
            path,
            warehouse,
            s3,
            aws,
        } => {
            let local = |message: String| CatalogError::Local {
                catalog: name.to_string(),
                message,
            };
            let db = absolute(name, path)?;
            let wh = Warehouse::open(name, warehouse, s3, aws)?;
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
        CatalogConfig::Sql {
            uri,
            warehouse,
            s3,
            aws,
        } => {
            let wh = Warehouse::open(name, warehouse, s3, aws)?;
            let sql = SqlDatabase {
                uri: uri.to_string(),
                detail: format!("postgres at {}", redact_url(uri)),
                bind_style: "DollarNumeric",
                connections: 4,
            };
            // Agents starting together race to create the catalog's tables; the loser
            // fails on Postgres's catalog of types ("duplicate key", or "type ... already
            // exists") and succeeds when it tries again.
            let lost_race = |e: &CatalogError| {
                let text = e.to_string();
                match text.contains("duplicate key") || text.contains("already exists") {
                    true => crate::ErrorClass::Transient,
                    false => crate::ErrorClass::Fatal,
                }
            };
            crate::retry::retry(
                crate::retry::Policy::backoff(
                    std::time::Duration::from_millis(200),
                    std::time::Duration::from_secs(2),
                )
                .attempts(4),
                || open_sql(name, &sql, &wh, SqlBackend::connect_postgres(uri, name)),
                lost_race,
                |_, _, _| {},
            )
            .await
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
    warehouse: &Warehouse,
    committer: impl std::future::Future<Output = Result<Arc<SqlBackend>, String>>,
) -> Result<CatalogHandle, CatalogError> {
    let unreachable = |source: iceberg::Error| CatalogError::Unreachable {
        catalog: name.to_string(),
        detail: match backend::v0_layout_hint(&crate::error::with_causes(&source)) {
            Some(hint) => format!("{} ({hint})", sql.detail),
            None => sql.detail.clone(),
        },
        source: Box::new(source),
    };
    let mut props = HashMap::from([
        ("uri".to_string(), sql.uri.clone()),
        ("warehouse".to_string(), warehouse.uri.clone()),
        ("sql_bind_style".to_string(), sql.bind_style.to_string()),
        (
            "pool.max-connections".to_string(),
            sql.connections.to_string(),
        ),
    ]);
    // The catalog hands its properties to every table's FileIO.
    props.extend(warehouse.props.clone());
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(warehouse.factory.clone())
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

/// Where a SQL-layout catalog keeps its tables, and the storage that reaches it.
struct Warehouse {
    /// `file:///abs/dir` or `s3://bucket/prefix`.
    uri: String,
    /// FileIO properties (S3 endpoint, region, addressing, static keys).
    props: Vec<(String, String)>,
    factory: Arc<dyn StorageFactory>,
}

impl Warehouse {
    /// A local directory (made absolute and created if missing) or an `s3://` location.
    fn open(
        name: &str,
        warehouse: &str,
        s3: &S3Settings,
        aws: &aws::AwsSettings,
    ) -> Result<Warehouse, CatalogError> {
        let local = |message: String| CatalogError::Local {
            catalog: name.to_string(),
            message,
        };
        match warehouse.split_once("://") {
            Some(("s3" | "s3a", _)) => {
                let uri = warehouse.trim_end_matches('/').to_string();
                let mut props = s3.file_io_props(true);
                if s3.region.is_none() {
                    let region = aws.region_or_env(&[]).unwrap_or_else(|| "us-east-1".into());
                    props.push(("s3.region".into(), region));
                }
                let mut factory = OpenDalResolvingStorageFactory::new();
                if s3.access_key_id.is_none() {
                    // No keys in the config: the AWS SDK's chain (and `aws.role_arn`)
                    // decides, for the tables and for orphan listings.
                    factory = object_store::sign_with(
                        factory,
                        &uri,
                        aws::AwsCredentials::new(aws.clone()),
                    );
                }
                Ok(Warehouse {
                    uri,
                    props,
                    factory: Arc::new(factory),
                })
            }
            Some(("file", path)) => Warehouse::local(name, Path::new(path)),
            Some((scheme, _)) => Err(local(format!(
                "warehouse {warehouse:?}: use a local directory or an s3:// location (not {scheme}://)"
            ))),
            None => Warehouse::local(name, Path::new(warehouse)),
        }
    }

    fn local(name: &str, dir: &Path) -> Result<Warehouse, CatalogError> {
        let dir = absolute(name, dir)?;
        std::fs::create_dir_all(&dir).map_err(|source| CatalogError::Path {
            catalog: name.to_string(),
            action: "cannot create",
            path: dir.clone(),
            source,
        })?;
        Ok(Warehouse {
            uri: format!("file://{}", dir.display()),
            props: Vec::new(),
            factory: Arc::new(LocalFsStorageFactory),
        })
    }
}

/// Writes and deletes a small file at the top of the warehouse of an embedded or SQL
/// catalog, with the credentials tables would be written with: `floe check` runs it
/// before a table exists (a read-only or foreign warehouse fails here, not at the first
/// commit). Returns the path written; `None` for a REST catalog, whose storage comes
/// with each table.
pub async fn probe_warehouse(name: &str, config: &CatalogConfig) -> Option<Result<String, String>> {
    let (warehouse, s3, aws) = match config {
        CatalogConfig::Embedded {
            warehouse, s3, aws, ..
        }
        | CatalogConfig::Sql {
            warehouse, s3, aws, ..
        } => (warehouse, s3, aws),
        CatalogConfig::Rest(_) => return None,
    };
    let result = async {
        let wh = Warehouse::open(name, warehouse, s3, aws).map_err(|e| e.to_string())?;
        let io = iceberg::io::FileIOBuilder::new(wh.factory.clone())
            .with_props(wh.props.clone())
            .build();
        probe_write(&io, &wh.uri).await
    };
    Some(result.await)
}

/// Writes and deletes a small file under `dir` with `io`: the path written, or why not.
/// `floe check`'s storage step, for a table's location or a warehouse.
pub async fn probe_write(io: &iceberg::io::FileIO, dir: &str) -> Result<String, String> {
    let dir = dir.trim_end_matches('/');
    let path = format!("{dir}/.floe-check-{}", uuid::Uuid::now_v7());
    let write = async {
        io.new_output(&path)?
            .write(bytes::Bytes::from_static(b"floe check\n"))
            .await?;
        io.delete(&path).await
    };
    match write.await {
        Ok(()) => Ok(path),
        Err(e) => Err(format!(
            "cannot write {path}: {}",
            crate::error::with_causes(&e)
        )),
    }
}

// upstream: SQL catalog error kinds (iceberg-catalog-sql 0.10 reports a missing table
// and a lost creation race as Unexpected errors; delete when it uses TableNotFound
// and TableAlreadyExists)
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

fn absolute(catalog: &str, p: &Path) -> Result<PathBuf, CatalogError> {
    std::path::absolute(p).map_err(|source| CatalogError::Path {
        catalog: catalog.to_string(),
        action: "bad path",
        path: p.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_warehouse_is_probed_before_any_table_exists() {
        let dir = tempfile::tempdir().unwrap();
        let config = CatalogConfig::embedded(dir.path().join("c.db"), dir.path().join("w"));
        let path = probe_warehouse("local", &config).await.unwrap().unwrap();
        assert!(path.contains("/w/.floe-check-"), "{path}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("w")).unwrap().collect();
        assert!(left.is_empty(), "the probe file was left behind");
        // An object store that does not answer fails the probe, with the path.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s3 = CatalogConfig::Embedded {
            path: dir.path().join("c.db"),
            warehouse: "s3://bucket/wh".into(),
            s3: toml::from_str(&format!(
                "endpoint = \"http://127.0.0.1:{port}\"\naccess-key-id = \"k\"\nsecret-access-key = \"s\"\nregion = \"us-east-1\"\npath-style-access = true"
            ))
            .unwrap(),
            aws: aws::AwsSettings::default(),
        };
        let error = probe_warehouse("s3", &s3).await.unwrap().unwrap_err();
        assert!(
            error.starts_with("cannot write s3://bucket/wh/.floe-check-"),
            "{error}"
        );
    }

    #[test]
    fn a_sql_catalog_runs_on_postgres() {
        let secret_in_path = CatalogConfig::Sql {
            uri: Redacted("postgresql://floe:Secret/123@127.0.0.1:5432/iceberg".into()),
            warehouse: "w".into(),
            s3: S3Settings::default(),
            aws: aws::AwsSettings::default(),
        };
        let problems = format!("{:?} {secret_in_path:?}", secret_in_path.problems());
        assert!(!problems.contains("Secret"), "{problems}");
        assert!(problems.contains("percent-encode"), "{problems}");
        let sql = |uri: &str| CatalogConfig::Sql {
            uri: Redacted(uri.into()),
            warehouse: "w".into(),
            s3: S3Settings::default(),
            aws: aws::AwsSettings::default(),
        };
        assert!(sql("postgresql://db/iceberg").problems().is_empty());
        assert!(sql("postgres://db/iceberg").problems().is_empty());
        let problems = sql("mysql://db/iceberg").problems();
        assert_eq!(problems[0].0, "uri", "{problems:?}");
    }
}
