//! Where a commit lands: the catalog's compare-and-swap of the table's metadata.
//!
//! iceberg-rust builds commit requests only inside its own `Transaction`, so these
//! backends take requirements and updates directly: the SQL catalog layout on SQLite or
//! Postgres (new metadata file, then an `UPDATE ... WHERE metadata_location = <base>`),
//! and the REST catalog's commit-table request.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableRequirement, TableUpdate};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::rest::{RestCatalog, RestError, RestSession};

/// Table property: delete metadata files that leave the metadata log at commit.
pub const DELETE_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";

/// Why a commit did not land.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The table moved on since `base` was read: reload and try again.
    #[error("commit conflict: {0}")]
    Conflict(String),
    /// The request may or may not have been applied (timeout, 5xx): reload and look.
    #[error("commit state unknown: {0}")]
    Unknown(String),
    /// The commit was refused or could not be prepared; retrying will not help.
    #[error("{0}")]
    Failed(String),
}

impl CommitError {
    /// Whether another attempt (after reloading the table) can land.
    pub fn class(&self) -> crate::ErrorClass {
        match self {
            CommitError::Conflict(_) | CommitError::Unknown(_) => crate::ErrorClass::Transient,
            CommitError::Failed(_) => crate::ErrorClass::Fatal,
        }
    }
}

// upstream: public TableCommit builder / TransactionAction (iceberg-rust 0.10 builds
// TableCommit only inside its Transaction, and the SQL catalog has no update_table;
// delete when a caller can commit its own requirements and updates)
/// A catalog that applies requirements and updates atomically.
#[async_trait]
pub trait CommitBackend: Send + Sync + std::fmt::Debug {
    /// Commits `updates` on top of `base` if `requirements` still hold; returns the new table.
    async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Table, CommitError>;
}

/// Commits to a catalog in the SQL catalog layout (`iceberg_tables`): the embedded
/// SQLite file, or a shared Postgres database.
#[derive(Debug, Clone)]
pub struct SqlBackend {
    pool: SqlPool,
    catalog_name: String,
}

#[derive(Debug, Clone)]
enum SqlPool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The compare-and-swap of a commit: moves `metadata_location` only if it still is the
/// base. `?` placeholders for SQLite, `$n` for Postgres.
const SWAP_SQLITE: &str = "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
     WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
     AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) AND metadata_location = ?";
const SWAP_POSTGRES: &str = "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
     WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 \
     AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) AND metadata_location = $6";

impl SqlBackend {
    /// Opens the SQLite file of an embedded catalog named `catalog_name`.
    pub async fn open(path: &std::path::Path, catalog_name: &str) -> Result<Arc<Self>, String> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        Ok(Arc::new(SqlBackend {
            pool: SqlPool::Sqlite(pool),
            catalog_name: catalog_name.to_string(),
        }))
    }

    /// Connects to the Postgres database at `uri` (`postgresql://user@host:port/db`; the
    /// password from the URI or `PGPASSWORD`) holding a SQL catalog named `catalog_name`.
    pub async fn connect_postgres(uri: &str, catalog_name: &str) -> Result<Arc<Self>, String> {
        let options = PgConnectOptions::from_str(uri).map_err(|e| bad_postgres_uri(uri, &e))?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(super::CALL_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        // A catalog another engine created with the JDBC catalog's first (V0) layout
        // has no `iceberg_type` column, which iceberg-rust's SQL catalog reads.
        if let Err(e) = sqlx::query("SELECT iceberg_type FROM iceberg_tables LIMIT 0")
            .execute(&pool)
            .await
            && let Some(hint) = v0_layout_hint(&e.to_string())
        {
            return Err(format!("{e}: {hint}"));
        }
        Ok(Arc::new(SqlBackend {
            pool: SqlPool::Postgres(pool),
            catalog_name: catalog_name.to_string(),
        }))
    }

    /// Runs the compare-and-swap; returns the number of rows it changed (0 or 1).
    async fn swap(
        &self,
        ident: &iceberg::TableIdent,
        base_location: &str,
        location: &str,
    ) -> Result<u64, sqlx::Error> {
        let namespace = ident.namespace().join(".");
        let binds = [
            location,
            base_location,
            self.catalog_name.as_str(),
            namespace.as_str(),
            ident.name(),
            base_location,
        ];
        match &self.pool {
            SqlPool::Sqlite(pool) => {
                let mut query = sqlx::query(SWAP_SQLITE);
                for value in binds {
                    query = query.bind(value);
                }
                Ok(query.execute(pool).await?.rows_affected())
            }
            SqlPool::Postgres(pool) => {
                let mut query = sqlx::query(SWAP_POSTGRES);
                for value in binds {
                    query = query.bind(value);
                }
                Ok(query.execute(pool).await?.rows_affected())
            }
        }
    }
}

#[async_trait]
impl CommitBackend for SqlBackend {
    async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Table, CommitError> {
        let failed = |e: iceberg::Error| CommitError::Failed(e.to_string());
        for requirement in &requirements {
            requirement
                .check(Some(base.metadata()))
                .map_err(|e| CommitError::Conflict(e.to_string()))?;
        }
        let base_location = base.metadata_location_result().map_err(failed)?.to_string();
        let mut builder = base
            .metadata()
            .clone()
            .into_builder(Some(base_location.clone()));
        for update in updates {
            builder = update.apply(builder).map_err(failed)?;
        }
        let built = builder.build().map_err(failed)?;
        let (metadata, expired_logs) = (built.metadata, built.expired_metadata_logs);
        let location = MetadataLocation::from_str(&base_location)
            .map_err(failed)?
            .with_next_version()
            .with_new_metadata(&metadata);
        metadata
            .write_to(base.file_io(), &location)
            .await
            .map_err(failed)?;
        let location = location.to_string();
        let ident = base.identifier();
        let swapped = self.swap(ident, &base_location, &location);
        // The database applies the statement or not at all, but an error here (busy, I/O,
        // a lost connection) or a call that does not finish in time is reported as
        // unknown: the caller looks before retrying. Abandoning the call returns its
        // connection to the pool.
        let changed = match tokio::time::timeout(super::CALL_TIMEOUT, swapped).await {
            Ok(done) => done.map_err(|e| CommitError::Unknown(e.to_string()))?,
            Err(_) => {
                return Err(CommitError::Unknown(format!(
                    "the catalog update did not finish within {}s",
                    super::CALL_TIMEOUT.as_secs()
                )));
            }
        };
        if changed == 0 {
            return Err(CommitError::Conflict(format!(
                "{ident} changed since {base_location}"
            )));
        }
        // Metadata files that fell off the metadata log (`write.metadata.previous-versions-max`)
        // are deleted when the table asks for it, as Iceberg's own catalogs do.
        let delete_old = metadata
            .properties()
            .get(DELETE_AFTER_COMMIT)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if delete_old {
            for log in expired_logs {
                if let Err(e) = base.file_io().delete(&log.metadata_file).await {
                    tracing::warn!(table = %ident, file = %log.metadata_file, error = %e, "could not delete an old metadata file");
                }
            }
        }
        Table::builder()
            .identifier(ident.clone())
            .metadata(metadata)
            .metadata_location(location)
            .file_io(base.file_io().clone())
            .runtime(iceberg::Runtime::try_current().map_err(failed)?)
            .build()
            .map_err(failed)
    }
}

/// What a failed commit request means, with the classification every REST call uses
/// ([`RestError::transient`]): 409 is a conflict; anything transient (no answer, 408,
/// 429 the session stopped waiting out, any 5xx) may have been applied, so the caller
/// reloads and looks for its commit before trying again; the rest is final.
fn classify_commit_error(e: &RestError) -> CommitError {
    match e.status() {
        Some(409) => CommitError::Conflict(e.to_string()),
        _ if e.transient() => CommitError::Unknown(e.to_string()),
        _ => CommitError::Failed(e.to_string()),
    }
}

/// Commits through a REST catalog's commit-table endpoint
/// (`POST /v1/{prefix}/namespaces/{ns}/tables/{table}` with requirements and updates).
#[derive(Debug, Clone)]
pub struct RestBackend {
    session: RestSession,
}

impl RestBackend {
    /// Commits through `session` (the catalog's authenticated request path).
    pub fn new(session: RestSession) -> Arc<Self> {
        Arc::new(RestBackend { session })
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
struct CommitAnswer {
    metadata_location: String,
    metadata: iceberg::spec::TableMetadata,
}

#[async_trait]
impl CommitBackend for RestBackend {
    async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Table, CommitError> {
        let ident = base.identifier();
        let body = serde_json::json!({
            "identifier": {"namespace": ident.namespace().as_ref(), "name": ident.name()},
            "requirements": requirements,
            "updates": updates,
        });
        let path = RestCatalog::table_path(ident);
        // Named like docs/catalogs.md says, so a 403 reads "commit to table ns.t: ...".
        let operation = format!("commit to table {ident}");
        let answer = match self
            .session
            .call(
                &operation,
                reqwest::Method::POST,
                path.trim_start_matches('/'),
                &[],
                Some(&body),
            )
            .await
        {
            Ok(answer) => answer.unwrap_or(serde_json::Value::Null),
            Err(e) => {
                return Err(classify_commit_error(&e));
            }
        };
        let answer: CommitAnswer = serde_json::from_value(answer)
            .map_err(|e| CommitError::Unknown(format!("unreadable commit answer: {e}")))?;
        // The table's FileIO (with its renewing vended credentials) stays valid.
        Table::builder()
            .identifier(ident.clone())
            .metadata(answer.metadata)
            .metadata_location(answer.metadata_location)
            .file_io(base.file_io().clone())
            .runtime(
                iceberg::Runtime::try_current().map_err(|e| CommitError::Failed(e.to_string()))?,
            )
            .build()
            .map_err(|e| CommitError::Failed(e.to_string()))
    }
}

/// What to do when a SQL catalog's tables lack `iceberg_type`: they have the JDBC
/// catalog's first (V0) layout, the default of Spark's and Trino's JDBC catalogs, and
/// iceberg-rust's SQL catalog reads that column.
pub(crate) fn v0_layout_hint(error: &str) -> Option<&'static str> {
    (error.contains("iceberg_type") && error.contains("does not exist")).then_some(
        "the catalog's tables have the JDBC catalog's V0 layout (the default of Spark's and Trino's JDBC catalogs); upgrade them once with `ALTER TABLE iceberg_tables ADD COLUMN iceberg_type VARCHAR(5)`, which is what Iceberg's JdbcCatalog runs with `jdbc.schema-version=V1`",
    )
}

/// Whether `uri` parses as a Postgres connection URI; if not, why, without its password.
pub(crate) fn check_postgres_uri(uri: &str) -> Result<(), String> {
    PgConnectOptions::from_str(uri)
        .map(|_| ())
        .map_err(|e| bad_postgres_uri(uri, &e))
}

/// Why a Postgres URI does not parse, with the likely fix: a password holding `/`, `?`,
/// `#` or `@` must be percent-encoded (or given in `PGPASSWORD`), or the URI parser reads
/// part of it as the host or port.
fn bad_postgres_uri(uri: &str, error: &sqlx::Error) -> String {
    let authority = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let unescaped = authority
        .split(['/', '?', '#'])
        .next()
        .is_some_and(|host| !host.contains('@'))
        && authority.contains('@');
    let hint = match unescaped {
        true => {
            "; the password seems to hold `/`, `?`, `#` or `@`: percent-encode them (%2F, %3F, \
             %23, %40) or leave the password out of the URI and set PGPASSWORD"
        }
        false => "",
    };
    format!("bad uri {}: {error}{hint}", crate::redact::redact_url(uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transient_rest_failure_of_a_commit_is_looked_up_not_fatal() {
        let status = |status: u16| RestError::Status {
            status,
            operation: "commit to table ns.t".into(),
            message: String::new(),
        };
        for code in [408, 429, 500, 502, 503, 504, 507, 520] {
            assert!(
                matches!(
                    classify_commit_error(&status(code)),
                    CommitError::Unknown(_)
                ),
                "HTTP {code}"
            );
        }
        assert!(matches!(
            classify_commit_error(&status(409)),
            CommitError::Conflict(_)
        ));
        for code in [400, 401, 403, 404] {
            assert!(
                matches!(classify_commit_error(&status(code)), CommitError::Failed(_)),
                "HTTP {code}"
            );
        }
    }
}
