//! Where a test's tables live: the embedded catalog of a [`Workspace`], or a REST
//! catalog (rustberg) on S3 (moto). Tests written against a `Lake` run on both.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use iceberg::Catalog;
use serde_json::Value;

use crate::rest::{RestStack, TokenPolicy, WRITER};
use crate::{
    CatalogSection, Config, Pipeline, TableDump, Workspace, repo_root, tool, wait_for_messages,
};

/// How long a test waits for the agent to cover what was produced.
pub const WAIT: Duration = Duration::from_secs(120);

/// A catalog (named `local` in configs) and the tables' namespace.
pub struct Lake {
    /// Temporary directory: configs, dead letters, and the embedded catalog's files.
    pub ws: Workspace,
    /// The REST stack, for a REST lake.
    pub rest: Option<RestStack>,
    /// Namespace of the test's tables.
    pub namespace: String,
}

impl Lake {
    /// An embedded (SQLite + local warehouse) lake; tables in namespace `shop`.
    pub fn embedded() -> Result<Lake> {
        Ok(Lake {
            ws: Workspace::new()?,
            rest: None,
            namespace: "shop".into(),
        })
    }

    /// A REST-catalog lake (rustberg over moto S3, vended credentials).
    pub fn rest() -> Result<Lake> {
        Ok(Lake {
            ws: Workspace::new()?,
            rest: Some(RestStack::start(TokenPolicy::default())?),
            namespace: "shop".into(),
        })
    }

    /// "embedded" or "REST + S3", for messages.
    pub fn kind(&self) -> &'static str {
        if self.rest.is_some() {
            "REST + S3"
        } else {
            "embedded"
        }
    }

    /// The `[catalogs.local]` section.
    pub fn catalog_toml(&self) -> String {
        match &self.rest {
            Some(stack) => stack.catalog_toml("local", WRITER),
            None => {
                let d = self.ws.dir.path().display();
                format!(
                    "[catalogs.local]\ntype = \"embedded\"\npath = \"{d}/catalog.db\"\nwarehouse = \"{d}/warehouse\"\n"
                )
            }
        }
    }

    /// The `[catalogs.local]` section as a builder.
    pub fn catalog_section(&self) -> CatalogSection {
        match &self.rest {
            Some(stack) => stack.catalog(WRITER),
            None => self.ws.embedded_catalog(),
        }
    }

    /// A config with the lake's catalog `local`; add pipelines with [`Config::pipeline`].
    pub fn config(&self) -> Config {
        Config::new().catalog("local", self.catalog_section())
    }

    /// A pipeline reading `topic` into `table` of the lake's namespace (created if
    /// missing), committing every second, with a short consumer session and dead
    /// letters in `dead-letter-NAME.ndjson` of the workspace.
    pub fn pipeline(&self, name: &str, bootstrap: &str, topic: &str, table: &str) -> Pipeline {
        Pipeline::new(name, bootstrap, topic)
            .property("session.timeout.ms", "2000")
            .property("heartbeat.interval.ms", "500")
            .dead_letter(self.ws.path(&format!("dead-letter-{name}.ndjson")))
            .sink("local", &self.namespace, table)
            .commit_interval("1s")
    }

    /// Writes `config` to `file` in the workspace; returns its path.
    pub fn write(&self, file: &str, config: &Config) -> Result<PathBuf> {
        config.write(self.ws.path(file))
    }

    /// The catalog as the agent opens it (with its commit backend).
    pub async fn handle(&self) -> Result<floe_iceberg::CatalogHandle> {
        let text = self.catalog_toml();
        let mut root: toml::Table = toml::from_str(&text)?;
        let section = root
            .remove("catalogs")
            .and_then(|c| c.as_table().and_then(|t| t.get("local").cloned()))
            .context("catalog section")?;
        let config: floe_iceberg::CatalogConfig = section.try_into()?;
        Ok(floe_iceberg::open_catalog("local", &config).await?)
    }

    /// The catalog, for reads.
    pub async fn catalog(&self) -> Result<Arc<dyn Catalog>> {
        Ok(self.handle().await?.catalog)
    }

    /// Loads `namespace.table`.
    pub async fn table(&self, table: &str) -> Result<iceberg::table::Table> {
        let ident = iceberg::TableIdent::from_strs([self.namespace.as_str(), table])?;
        Ok(self.catalog().await?.load_table(&ident).await?)
    }

    /// Reads a table with an independent reader (`pyiceberg`, `duckdb`, or `spark` on an
    /// embedded lake).
    pub fn read(&self, reader: &str, table: &str, order_by: &str) -> Result<TableDump> {
        match &self.rest {
            Some(stack) => stack.read(reader, &self.namespace, table, order_by),
            None => self.ws.read(reader, &self.namespace, table, order_by),
        }
    }

    /// The data files a PyIceberg scan with `filter` plans, and all live data files
    /// (embedded lakes).
    pub fn plan_filter(&self, table: &str, filter: &str) -> Result<(Vec<String>, Vec<String>)> {
        if self.rest.is_some() {
            bail!("plan_filter reads embedded lakes only");
        }
        let out = Command::new(tool("FLOE_PYTHON"))
            .arg(repo_root().join("tests/readers/read_table.py"))
            .args(["--reader", "pyiceberg", "--catalog-name", "local"])
            .args(["--table", &format!("{}.{table}", self.namespace)])
            .args(["--plan-filter", filter])
            .arg("--catalog-db")
            .arg(self.ws.path("catalog.db"))
            .arg("--warehouse")
            .arg(self.ws.path("warehouse"))
            .output()?;
        if !out.status.success() {
            bail!(
                "plan filter failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        let list = |k: &str| -> Vec<String> {
            v[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok((list("planned"), list("all")))
    }

    /// Waits until `namespace.table` covers `messages` messages of `pipeline`.
    pub async fn wait_for_messages(
        &self,
        table: &str,
        pipeline: &str,
        messages: i64,
    ) -> Result<()> {
        let catalog = self.catalog().await?;
        wait_for_messages(
            catalog.as_ref(),
            &self.namespace,
            table,
            pipeline,
            messages,
            WAIT,
        )
        .await?;
        Ok(())
    }

    /// Runs `tests/readers/foreign_writer.py` (PyIceberg as another engine) on an
    /// embedded lake's table with `args`; returns its JSON answer.
    pub fn foreign(&self, table: &str, args: &[&str]) -> Result<Value> {
        if self.rest.is_some() {
            bail!("the foreign writer works on embedded lakes only");
        }
        let out = Command::new(tool("FLOE_PYTHON"))
            .arg(repo_root().join("tests/readers/foreign_writer.py"))
            .arg("--catalog-db")
            .arg(self.ws.path("catalog.db"))
            .arg("--warehouse")
            .arg(self.ws.path("warehouse"))
            .args(["--table", &format!("{}.{table}", self.namespace)])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "foreign writer failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}
