//! A throwaway PostgreSQL server (`scripts/pg.sh`) for the SQL catalog tests, and the
//! readers of a catalog in it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{TableDump, free_port, repo_root, tool};

/// A PostgreSQL server on a free loopback port, stopped when dropped. Its data lives in
/// a temporary directory (a short path: the server's socket path is limited).
pub struct Postgres {
    dir: tempfile::TempDir,
    /// `postgresql://floe@127.0.0.1:PORT/floe` (superuser `floe`, no password).
    pub uri: String,
}

impl Postgres {
    /// Starts a server with an empty database `floe`.
    pub fn start() -> Result<Postgres> {
        let dir = tempfile::Builder::new()
            .prefix("floe-pg")
            .tempdir_in("/tmp")?;
        let out = pg_sh(&[
            "start",
            dir.path().to_str().context("path")?,
            &free_port().to_string(),
        ])?;
        Ok(Postgres {
            dir,
            uri: out.trim().to_string(),
        })
    }

    /// The `[catalogs.NAME]` section of a SQL catalog in this database with its tables
    /// in `warehouse` (a path or `s3://...`).
    pub fn catalog(&self, warehouse: impl AsRef<Path>) -> crate::CatalogSection {
        crate::CatalogSection::sql(&self.uri, warehouse)
    }

    /// The agent's settings of a SQL catalog in this database with its tables in the
    /// local directory `warehouse` (to open it as the agent does).
    pub fn catalog_config(&self, warehouse: &Path) -> floe_iceberg::CatalogConfig {
        floe_iceberg::CatalogConfig::Sql {
            uri: floe::config::Redacted(self.uri.clone()),
            warehouse: warehouse.display().to_string(),
            s3: Default::default(),
            aws: Default::default(),
        }
    }

    /// Reads `namespace.table` of catalog `catalog` with an independent reader
    /// (`pyiceberg`, `duckdb` or `spark`), rows sorted by `order_by`.
    pub fn read(
        &self,
        reader: &str,
        catalog: &str,
        warehouse: &Path,
        table: &str,
        order_by: &str,
    ) -> Result<TableDump> {
        let warehouse = warehouse.display().to_string();
        self.read_at(reader, catalog, (&warehouse, None), table, order_by)
    }

    /// [`Postgres::read`] of a warehouse at a location: a path, or `s3://...` with the
    /// S3 endpoint of the store (`(location, Some(endpoint))`).
    pub fn read_at(
        &self,
        reader: &str,
        catalog: &str,
        (warehouse, s3_endpoint): (&str, Option<&str>),
        table: &str,
        order_by: &str,
    ) -> Result<TableDump> {
        let out = Command::new(tool("FLOE_PYTHON"))
            .arg(repo_root().join("tests/readers/read_table.py"))
            .args(["--reader", reader, "--catalog-name", catalog])
            .args(["--catalog-uri", &self.uri, "--table", table])
            .args(["--order-by", order_by])
            .args(["--warehouse", warehouse])
            .args(["--s3-endpoint", s3_endpoint.unwrap_or_default()])
            .output()?;
        if !out.status.success() {
            bail!(
                "{reader} reader failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("reader output is JSON")?;
        Ok(TableDump(v))
    }

    /// Runs SQL statements in the database with `psql` (as another engine would).
    pub fn execute(&self, sql: &str) -> Result<()> {
        let out = Command::new("psql")
            .args([&self.uri, "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .context("run psql")?;
        if !out.status.success() {
            bail!("psql: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Data directory of the server.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.path().to_str() {
            let _ = pg_sh(&["stop", dir]);
        }
    }
}

fn pg_sh(args: &[&str]) -> Result<String> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/pg.sh"))
        .args(args)
        .output()
        .context("run scripts/pg.sh")?;
    if !out.status.success() {
        bail!(
            "scripts/pg.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
