//! A Spark session on a SQL catalog in Postgres (`tests/readers/spark_session.py`):
//! another engine running statements on Floe's tables, one at a time, between Floe's
//! own commits.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::postgres::Postgres;
use crate::{TableDump, repo_root, tool};

/// The Postgres JDBC driver Spark's `JdbcCatalog` loads (installed by `scripts/setup.sh`).
const POSTGRES_JDBC_JAR: &str = "/usr/share/java/postgresql.jar";

/// A running Spark session, stopped when dropped. Tables are cached by the session as
/// Spark does by default: a statement plans on the table as last loaded, until
/// `REFRESH TABLE`.
pub struct SparkSession {
    child: Child,
    /// Spark's own log (its stderr), for messages.
    log: tempfile::NamedTempFile,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Whether the session said it is up.
    ready: bool,
}

impl SparkSession {
    /// Starts a session with catalog `catalog` on `pg`, its tables in the local
    /// directory `warehouse`; returns at once (Spark takes seconds to start: the
    /// first statement waits for it).
    pub fn start(pg: &Postgres, catalog: &str, warehouse: &Path) -> Result<SparkSession> {
        let jars = format!("{},{POSTGRES_JDBC_JAR}", tool("FLOE_SPARK_JARS").display());
        let log = tempfile::NamedTempFile::new()?;
        let mut child = Command::new(tool("FLOE_SPARK_PYTHON"))
            .arg(repo_root().join("tests/readers/spark_session.py"))
            .args(["--jdbc-uri", &pg.uri, "--catalog", catalog])
            .arg("--warehouse")
            .arg(format!("file://{}", warehouse.display()))
            .args(["--jars", &jars])
            // PySpark turns timestamps into the Python process's local time.
            .env("TZ", "UTC")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log.reopen()?)
            .spawn()
            .context("start spark_session.py")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout")?);
        // Spark starts while the caller goes on; the first statement waits for it.
        Ok(SparkSession {
            child,
            log,
            stdin,
            stdout,
            ready: false,
        })
    }

    /// Runs `sql`: its rows, or the statement's error (the session goes on).
    pub fn sql(&mut self, sql: &str) -> Result<std::result::Result<Vec<Value>, String>> {
        if !self.ready {
            let ready = self.answer()?;
            if ready["ready"] != true {
                bail!("spark session did not start: {ready}");
            }
            self.ready = true;
        }
        writeln!(self.stdin, "{}", json!({ "sql": sql }))?;
        self.stdin.flush()?;
        let answer = self.answer()?;
        Ok(if answer["ok"] == true {
            Ok(answer["rows"].as_array().cloned().unwrap_or_default())
        } else {
            Err(answer["error"].as_str().unwrap_or_default().to_string())
        })
    }

    /// Runs `sql`, failing on a statement error.
    pub fn run(&mut self, sql: &str) -> Result<Vec<Value>> {
        match self.sql(sql)? {
            Ok(rows) => Ok(rows),
            Err(e) => bail!("spark: {sql}: {e}"),
        }
    }

    /// `table` as this session reads it (after `REFRESH TABLE`), rows sorted by
    /// `order_by`, in the shape of the other readers' dumps; `columns` is the column
    /// list of another reader's dump of the same table.
    pub fn dump(&mut self, table: &str, order_by: &str, columns: &Value) -> Result<TableDump> {
        self.run(&format!("REFRESH TABLE {table}"))?;
        let rows = self.run(&format!("SELECT * FROM {table} ORDER BY {order_by}"))?;
        Ok(TableDump(
            json!({"reader": "spark", "columns": columns, "rows": rows}),
        ))
    }

    fn answer(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            let tail: String = log
                .chars()
                .skip(log.chars().count().saturating_sub(4000))
                .collect();
            bail!("the spark session exited; its log ends:\n{tail}");
        }
        serde_json::from_str(&line).with_context(|| format!("spark session answered {line:?}"))
    }
}

impl Drop for SparkSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
