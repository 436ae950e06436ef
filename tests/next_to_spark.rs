//! Spark next to Floe on the same tables: Floe's SQL catalog on Postgres, Spark 3.5
//! with Iceberg through its `JdbcCatalog` on the same database, a v2 table (position
//! deletes) and a v3 table (deletion vectors).
//!
//! Spark caches the tables it loads (its default), so a statement plans on the table
//! as the session last saw it. Each step makes Spark plan a row-level statement before
//! a Floe compaction and commit after it, as when the two overlap: Spark's own conflict
//! check must refuse it (it finds the files it deletes from among the compaction's
//! `DELETED` entries), and the statement run again on the fresh table must land. Then
//! Spark adds a column and inserts, Floe ingests into Spark's column, and Spark's own
//! `rewrite_data_files` and `expire_snapshots` run between Floe's commits. At the end
//! every column of every row is compared, through Spark, PyIceberg and DuckDB, with the
//! topic's records plus Spark's changes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use floe_tests::lake::WAIT;
use floe_tests::postgres::Postgres;
use floe_tests::reference::{append_rows, assert_rows, read_topic};
use floe_tests::spark::SparkSession;
use floe_tests::{AgentProcess, Broker, Config, Message, Pipeline, floe_bin, wait_for_messages};
use serde_json::{Value, json};

/// The two tables: (name, format version).
const TABLES: [(&str, u8); 2] = [("orders2", 2), ("orders3", 3)];

fn records(from: i64, to: i64, region: Option<&str>) -> Vec<Message> {
    (from..to)
        .map(|i| {
            let mut value = json!({"id": i, "amount": i * 3 % 1000, "note": format!("n{i}")});
            if let Some(r) = region {
                value["region"] = json!(r);
            }
            (None, Some(value.to_string().into_bytes()))
        })
        .collect()
}

fn config(
    dir: &Path,
    pg: &Postgres,
    warehouse: &Path,
    bootstrap: &str,
    maintenance: Maintenance,
) -> Result<std::path::PathBuf> {
    let mut config = Config::new().catalog("lake", pg.catalog(warehouse));
    for (table, version) in TABLES {
        let mut pipeline = Pipeline::new(table, bootstrap, table)
            .property("session.timeout.ms", "6000")
            .property("heartbeat.interval.ms", "500")
            .dead_letter(dir.join(format!("dead-letter-{table}.ndjson")))
            .sink("lake", "shop", table)
            .commit_interval("1s")
            .set("sink.format_version", version as i64);
        match maintenance {
            Maintenance::None => {}
            Maintenance::OnDemand => {
                pipeline = pipeline
                    .maintenance("min_input_files", 2)
                    .maintenance("keep_snapshots", 100)
                    .maintenance("max_snapshot_age", "1h");
            }
            Maintenance::Aggressive => {
                pipeline = pipeline
                    .maintenance("interval", "2s")
                    .maintenance("min_input_files", 2)
                    .maintenance("keep_snapshots", 5)
                    .maintenance("max_snapshot_age", "0s");
            }
        }
        config = config.pipeline(pipeline);
    }
    config.write(dir.join(if maintenance == Maintenance::OnDemand {
        "maintain.toml"
    } else {
        "floe.toml"
    }))
}

/// The maintenance section of a config.
#[derive(Clone, Copy, PartialEq)]
enum Maintenance {
    /// None: the agent does not maintain.
    None,
    /// For `floe maintain`: compaction from 2 files, every snapshot of the test kept.
    OnDemand,
    /// The agent compacts and expires every 2 s, keeping 5 snapshots.
    Aggressive,
}

/// `floe maintain`; fails unless it compacted both tables.
fn compact(config: &Path) -> Result<String> {
    let out = std::process::Command::new(floe_bin())
        .args(["maintain", "--config"])
        .arg(config)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success() && text.matches("rewrote").count() == TABLES.len(),
        "floe maintain did not compact both tables:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// The rows each table must hold, by id.
type Expected = BTreeMap<&'static str, BTreeMap<i64, Value>>;

/// Spark runs `statement` (with `{t}` for each table) planned before a Floe compaction
/// and committed after it: refused by Spark's conflict check; then on the fresh table:
/// lands. `apply` changes the expected rows as the statement does.
fn overlapping(
    spark: &mut SparkSession,
    maintain: &Path,
    statement: &str,
    expected: &mut Expected,
    apply: impl Fn(&mut BTreeMap<i64, Value>),
) -> Result<()> {
    for (table, _) in TABLES {
        // Loaded (and cached) by the session now.
        spark.run(&format!("SELECT count(*) FROM lake.shop.{table}"))?;
    }
    let compacted = compact(maintain)?;
    for (table, _) in TABLES {
        let sql = statement.replace("{t}", &format!("lake.shop.{table}"));
        match spark.sql(&sql)? {
            Err(e) if e.contains("ValidationException") => {}
            Err(e) => bail!("{table}: {sql}: failed for another reason than a conflict: {e}"),
            Ok(_) => bail!(
                "{table}: Spark committed `{sql}`, planned before a Floe compaction, on top of it: \
                 its conflict check did not see the files the compaction removed\n{compacted}"
            ),
        }
        spark.run(&format!("REFRESH TABLE lake.shop.{table}"))?;
        spark.run(&sql)?;
        apply(expected.get_mut(table).expect("table"));
    }
    Ok(())
}

/// What the agent runs against.
struct Lake<'a> {
    pg: &'a Postgres,
    broker: &'a Broker,
    warehouse: &'a Path,
    run: &'a Path,
}

/// Runs the agent until records `from..to` (fields `region` too, if given) of each
/// topic, produced in three batches, are in the tables; three commits per table.
async fn ingest(lake: &Lake<'_>, from: i64, to: i64, region: Option<&str>) -> Result<()> {
    let agent = AgentProcess::start(lake.run, &[])?;
    let catalog = open_lake(lake.pg, lake.warehouse).await?;
    let step = ((to - from) / 3).max(1);
    let mut at = from;
    while at < to {
        let end = (at + step).min(to);
        for (table, _) in TABLES {
            lake.broker
                .produce(table, &records(at, end, region))
                .await?;
        }
        for (table, _) in TABLES {
            let wait = Duration::from_secs(90);
            wait_for_messages(catalog.as_ref(), "shop", table, table, end, wait)
                .await
                .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.output()))?;
        }
        at = end;
    }
    agent.terminate()?;
    Ok(())
}

/// Catalog `lake` as the agent opens it.
async fn open_lake(
    pg: &Postgres,
    warehouse: &Path,
) -> Result<std::sync::Arc<dyn iceberg::Catalog>> {
    let config = pg.catalog_config(warehouse);
    Ok(floe_iceberg::open_catalog("lake", &config).await?.catalog)
}

/// Every snapshot of both tables, Floe's and Spark's, lists the files it added and
/// removed and has a summary that matches its manifests ([`floe_tests::snapshots`]).
async fn check_snapshots(pg: &Postgres, warehouse: &Path) -> Result<()> {
    let catalog = open_lake(pg, warehouse).await?;
    for (table, _) in TABLES {
        let ident = iceberg::TableIdent::from_strs(["shop", table])?;
        let loaded = catalog.load_table(&ident).await?;
        let checked = floe_tests::snapshots::check_all(&loaded)
            .await
            .with_context(|| format!("{table}: a snapshot does not say what it did"))?;
        ensure!(
            checked.contains_key("append") && checked.contains_key("replace"),
            "{table}: no Floe append or compaction among the snapshots checked: {checked:?}"
        );
    }
    Ok(())
}

/// Every column of every row of `table` through PyIceberg, DuckDB and the Spark
/// session (a fresh load), against `expected`.
fn compare(
    pg: &Postgres,
    warehouse: &Path,
    spark: &mut SparkSession,
    table: &str,
    expected: &BTreeMap<i64, Value>,
    what: &str,
) -> Result<()> {
    let want: Vec<Value> = expected.values().cloned().collect();
    let mut columns = Value::Null;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = pg.read(reader, "lake", warehouse, &format!("shop.{table}"), "id")?;
        assert_rows(
            &format!("{what} through {reader}"),
            &dump,
            &want,
            &["id"],
            &[],
        )?;
        columns = dump.0["columns"].clone();
    }
    let dump = spark.dump(&format!("lake.shop.{table}"), "id", &columns)?;
    assert_rows(&format!("{what} through Spark"), &dump, &want, &["id"], &[])
}

/// Adds the rows of the records with ids in `ids` (as Floe ingested them) to the
/// expected rows of each table.
fn add_ingested(broker: &Broker, expected: &mut Expected, ids: std::ops::Range<i64>) -> Result<()> {
    for (table, _) in TABLES {
        let records = read_topic(
            &broker.bootstrap,
            table,
            ids.end as usize,
            Duration::from_secs(60),
        )?;
        let rows = expected.entry(table).or_default();
        for r in append_rows(&records) {
            let id = r["id"].as_i64().unwrap_or(-1);
            if ids.contains(&id) {
                rows.insert(id, r);
            }
        }
    }
    Ok(())
}

/// A Floe compaction of `table` held between its writes and its commit while Spark runs
/// `statement` on the fresh table (so Spark commits first); returns what the
/// compaction then did.
fn held_compaction(
    spark: &mut SparkSession,
    maintain: &Path,
    table: &str,
    statement: &str,
) -> Result<String> {
    let resume = maintain.with_file_name(format!("resume-{table}"));
    let config = maintain.to_str().context("utf-8 path")?;
    let mut compaction = AgentProcess::command(
        &["maintain", "--config", config, "--table", table],
        &[
            ("FLOE_FAILPOINT", floe::failpoint::COMPACT_BEFORE_COMMIT),
            (
                "FLOE_FAILPOINT_RESUME",
                resume.to_str().context("utf-8 path")?,
            ),
        ],
    )?;
    compaction.wait_for_line("FLOE_FAILPOINT compact_before_commit reached", WAIT)?;
    spark.run(&format!("REFRESH TABLE lake.shop.{table}"))?;
    spark.run(&statement.replace("{t}", &format!("lake.shop.{table}")))?;
    std::fs::write(&resume, b"")?;
    let (status, out) = compaction.wait_exit(WAIT)?;
    ensure!(status.success(), "floe maintain failed:\n{out}");
    Ok(out)
}

/// A Postgres server, a broker with a topic per table, and a directory for the
/// warehouse and the configs.
async fn services() -> Result<(Postgres, Broker, tempfile::TempDir)> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    for (table, _) in TABLES {
        broker.create_topic(table, 2).await?;
    }
    Ok((pg, broker, tempfile::tempdir()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_statements_and_procedures_next_to_floe() -> Result<()> {
    let (pg, broker, dir) = services().await?;
    let warehouse = dir.path().join("warehouse");
    let run = config(
        dir.path(),
        &pg,
        &warehouse,
        &broker.bootstrap,
        Maintenance::None,
    )?;
    let lake = Lake {
        pg: &pg,
        broker: &broker,
        warehouse: &warehouse,
        run: &run,
    };
    let maintain = config(
        dir.path(),
        &pg,
        &warehouse,
        &broker.bootstrap,
        Maintenance::OnDemand,
    )?;
    let mut spark = SparkSession::start(&pg, "lake", &warehouse)?;
    ingest(&lake, 0, 600, None).await?;

    let mut expected: Expected = BTreeMap::new();
    for (table, _) in TABLES {
        spark.run(&format!(
            "ALTER TABLE lake.shop.{table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', \
             'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"
        ))?;
    }

    add_ingested(&broker, &mut expected, 0..600)?;

    // Merge-on-read DELETE, UPDATE and MERGE, then a copy-on-write DELETE.
    overlapping(
        &mut spark,
        &maintain,
        "DELETE FROM {t} WHERE id % 10 = 0",
        &mut expected,
        |rows| rows.retain(|id, _| id % 10 != 0),
    )?;
    overlapping(
        &mut spark,
        &maintain,
        "UPDATE {t} SET amount = amount + 1000 WHERE id % 10 = 1",
        &mut expected,
        |rows| {
            for (id, row) in rows.iter_mut() {
                if id % 10 == 1 {
                    row["amount"] = json!(row["amount"].as_i64().unwrap_or(0) + 1000);
                }
            }
        },
    )?;
    overlapping(
        &mut spark,
        &maintain,
        "MERGE INTO {t} t USING (SELECT id FROM {t} WHERE id % 10 = 2) s ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET t.note = concat(t.note, '-m')",
        &mut expected,
        |rows| {
            for (id, row) in rows.iter_mut() {
                if id % 10 == 2 {
                    row["note"] = json!(format!("{}-m", row["note"].as_str().unwrap_or("")));
                }
            }
        },
    )?;
    for (table, _) in TABLES {
        spark.run(&format!(
            "ALTER TABLE lake.shop.{table} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')"
        ))?;
    }
    overlapping(
        &mut spark,
        &maintain,
        "DELETE FROM {t} WHERE id % 10 = 3",
        &mut expected,
        |rows| rows.retain(|id, _| id % 10 != 3),
    )?;

    // Spark commits while a Floe compaction of the same files waits for its commit: a
    // merge-on-read delete is carried over to the compaction's new files; a
    // copy-on-write delete removed the files, so the compaction gives up.
    ingest(&lake, 600, 690, None).await?;
    add_ingested(&broker, &mut expected, 600..690)?;
    for (table, _) in TABLES {
        spark.run(&format!(
            "ALTER TABLE lake.shop.{table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')"
        ))?;
        let out = held_compaction(
            &mut spark,
            &maintain,
            table,
            "DELETE FROM {t} WHERE id % 10 = 4",
        )?;
        ensure!(
            out.contains("concurrent deletes over"),
            "{table}: the compaction did not carry Spark's deletes over:\n{out}"
        );
        spark.run(&format!(
            "ALTER TABLE lake.shop.{table} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')"
        ))?;
        let out = held_compaction(
            &mut spark,
            &maintain,
            table,
            "DELETE FROM {t} WHERE id % 10 = 5",
        )?;
        ensure!(
            out.contains("gave up"),
            "{table}: the compaction committed over files Spark removed:\n{out}"
        );
        expected
            .get_mut(table)
            .expect("table")
            .retain(|id, _| id % 10 != 4 && id % 10 != 5);
    }

    // Spark adds a column and inserts; Floe's records fill Spark's column.
    for (table, _) in TABLES {
        spark.run(&format!(
            "ALTER TABLE lake.shop.{table} ADD COLUMN region string"
        ))?;
        spark.run(&format!(
            "INSERT INTO lake.shop.{table} (id, amount, note, region, _kafka_partition, _kafka_offset, \
             _kafka_timestamp, _kafka_key) VALUES (10000, 1, 'spark', 'us', -1, 10000, NULL, NULL), \
             (10001, 2, 'spark', 'us', -1, 10001, NULL, NULL)"
        ))?;
        let rows = expected.get_mut(table).expect("table");
        for row in rows.values_mut() {
            row["region"] = Value::Null;
        }
        for (id, amount) in [(10000, 1), (10001, 2)] {
            rows.insert(id, json!({"id": id, "amount": amount, "note": "spark", "region": "us",
                "_kafka_partition": -1, "_kafka_offset": id, "_kafka_timestamp": null, "_kafka_key": null}));
        }
    }
    ingest(&lake, 690, 900, Some("eu")).await?;
    check_snapshots(&pg, &warehouse).await?;
    // Spark's own maintenance between Floe's commits.
    for (table, _) in TABLES {
        spark.run(&format!("REFRESH TABLE lake.shop.{table}"))?;
        let rewritten = spark.run(&format!(
            "CALL lake.system.rewrite_data_files(table => 'shop.{table}', options => map('min-input-files', '2'))"
        ))?;
        ensure!(
            rewritten
                .first()
                .and_then(|r| r["rewritten_data_files_count"].as_i64())
                > Some(0),
            "{table}: Spark's rewrite_data_files rewrote nothing: {rewritten:?}"
        );
        spark.run(&format!(
            "CALL lake.system.expire_snapshots(table => 'shop.{table}', \
             older_than => TIMESTAMP '2999-12-31 00:00:00', retain_last => 1)"
        ))?;
    }
    ingest(&lake, 900, 1000, Some("eu")).await?;
    compact(&maintain)?;

    check_snapshots(&pg, &warehouse).await?;
    add_ingested(&broker, &mut expected, 690..1000)?;
    for (table, _) in TABLES {
        compare(&pg, &warehouse, &mut spark, table, &expected[table], table)?;
    }
    Ok(())
}

/// A change Spark committed: rows with `id < below` and `id % modulo == rest` deleted,
/// or their amount raised by 1000.
struct Change {
    table: &'static str,
    delete: bool,
    below: i64,
    modulo: i64,
    rest: i64,
}

impl Change {
    fn sql(&self) -> String {
        let filter = format!(
            "id < {} AND id % {} = {}",
            self.below, self.modulo, self.rest
        );
        if self.delete {
            format!("DELETE FROM lake.shop.{} WHERE {filter}", self.table)
        } else {
            format!(
                "UPDATE lake.shop.{} SET amount = amount + 1000 WHERE {filter}",
                self.table
            )
        }
    }

    fn apply(&self, rows: &mut BTreeMap<i64, Value>) {
        let hit = |id: i64| id < self.below && id % self.modulo == self.rest;
        if self.delete {
            rows.retain(|id, _| !hit(*id));
        } else {
            for (_, row) in rows.iter_mut().filter(|(id, _)| hit(**id)) {
                row["amount"] = json!(row["amount"].as_i64().unwrap_or(0) + 1000);
            }
        }
    }
}

/// Spark's statements at random moments while Floe ingests and maintains every 2 s
/// (compaction and expiry): on `orders2` merge-on-read deletes and updates, on
/// `orders3` copy-on-write deletes and merge-on-read updates. Spark runs a statement
/// again when its conflict check refuses it, as a user would; every change it reports
/// committed must be in the table, and nothing else (every value through the three
/// readers). `FLOE_SPARK_SECONDS` long (12 in CI; `scripts/faults.sh` runs 180).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_and_floe_maintenance_at_random() -> Result<()> {
    let seconds: u64 = std::env::var("FLOE_SPARK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let (pg, broker, dir) = services().await?;
    let warehouse = dir.path().join("warehouse");
    let run = config(
        dir.path(),
        &pg,
        &warehouse,
        &broker.bootstrap,
        Maintenance::Aggressive,
    )?;
    let lake = Lake {
        pg: &pg,
        broker: &broker,
        warehouse: &warehouse,
        run: &run,
    };
    let mut spark = SparkSession::start(&pg, "lake", &warehouse)?;
    ingest(&lake, 0, 90, None).await?;
    spark.run(
        "ALTER TABLE lake.shop.orders2 SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', \
         'write.update.mode'='merge-on-read')",
    )?;
    spark.run(
        "ALTER TABLE lake.shop.orders3 SET TBLPROPERTIES ('write.delete.mode'='copy-on-write', \
         'write.update.mode'='merge-on-read')",
    )?;
    let agent = AgentProcess::start(&run, &[])?;
    let catalog = open_lake(&pg, &warehouse).await?;
    let mut rng = 0x5eed_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut produced, mut covered) = (90, 90);
    let mut changes: Vec<Change> = Vec::new();
    let mut refused = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        // New records keep arriving while Spark works on the rows already in.
        for (table, _) in TABLES {
            broker
                .produce(table, &records(produced, produced + 30, None))
                .await?;
        }
        produced += 30;
        let (table, _) = TABLES[(next() % 2) as usize];
        let change = Change {
            table,
            delete: next() % 2 == 0,
            below: covered,
            modulo: 7 + (next() % 5) as i64,
            rest: 0,
        };
        let change = Change {
            rest: (next() % change.modulo as u64) as i64,
            ..change
        };
        let sql = change.sql();
        let mut landed = false;
        for _ in 0..8 {
            spark.run(&format!("REFRESH TABLE lake.shop.{table}"))?;
            match spark.sql(&sql)? {
                Ok(_) => {
                    landed = true;
                    break;
                }
                Err(e) if e.contains("ValidationException") || e.contains("CommitFailed") => {
                    refused += 1;
                }
                Err(e) => bail!("{sql}: {e}\n{}", agent.output()),
            }
        }
        if landed {
            changes.push(change);
        }
        for (table, _) in TABLES {
            wait_for_messages(
                catalog.as_ref(),
                "shop",
                table,
                table,
                produced,
                Duration::from_secs(90),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.output()))?;
        }
        covered = produced;
    }
    let log = agent.terminate()?;
    let compactions = log.matches("rewrote ").count();
    eprintln!(
        "{} Spark changes committed, {refused} refused by a conflict and run again; {compactions} Floe compactions",
        changes.len()
    );
    ensure!(
        !changes.is_empty(),
        "Spark committed nothing ({refused} refusals)"
    );

    let mut expected: Expected = BTreeMap::new();
    add_ingested(&broker, &mut expected, 0..produced)?;
    for change in &changes {
        change.apply(expected.get_mut(change.table).expect("table"));
    }
    for (table, _) in TABLES {
        let what = format!(
            "{table} after {} Spark changes ({refused} refused and run again)",
            changes.len()
        );
        compare(&pg, &warehouse, &mut spark, table, &expected[table], &what)?;
    }
    Ok(())
}
