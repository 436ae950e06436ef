//! Table maintenance end to end: compaction, snapshot expiry, orphan and metadata cleanup
//! running while pipelines commit every second, offsets that survive another engine's
//! commits plus expiry, and another engine's equality deletes left in force.
//!
//! `maintenance_runs_while_pipelines_commit` produces for `FLOE_SOAK_SECONDS` (default
//! 20 in CI; `scripts/soak-maintenance.sh` runs it for 60 and more).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use floe_iceberg::manifests;
use floe_iceberg::{OffsetMap, OffsetsSource};
use floe_tests::lake::{Lake, WAIT};
use floe_tests::{AgentProcess, Broker, Pipeline, floe_bin};
use iceberg::spec::DataContentType;
use serde_json::{Value, json};

/// xorshift64*: a small deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Maintenance every 2s: compaction from 2 files, 3 snapshots kept, any older expired.
fn maintenance(pipeline: Pipeline) -> Pipeline {
    pipeline
        .maintenance("interval", "2s")
        .maintenance("min_input_files", 2)
        .maintenance("keep_snapshots", 3)
        .maintenance("max_snapshot_age", "0s")
        .maintenance("orphan_age", "2h")
        .maintenance("keep_metadata_files", 5)
}

/// `floe maintain --config CONFIG`; returns its output, failing on a failed job.
fn maintain(config: &std::path::Path) -> Result<String> {
    let out = std::process::Command::new(floe_bin())
        .args(["maintain", "--config"])
        .arg(config)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let toml = std::fs::read_to_string(config).unwrap_or_default();
        bail!("floe maintain failed:\n{text}\nconfig:\n{toml}");
    }
    Ok(text)
}

/// Live data and delete files of a table.
async fn file_counts(lake: &Lake, table: &str) -> Result<(usize, usize)> {
    let t = lake.table(table).await?;
    let Some(s) = t.metadata().current_snapshot() else {
        return Ok((0, 0));
    };
    let live = manifests::live_files(&t, s).await?;
    let data = live
        .iter()
        .filter(|f| f.content() == DataContentType::Data)
        .count();
    Ok((data, live.len() - data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_runs_while_pipelines_commit() -> Result<()> {
    concurrent(Lake::embedded()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_runs_while_pipelines_commit_on_the_rest_catalog() -> Result<()> {
    concurrent(Lake::rest()?).await
}

/// An append pipeline and an upsert pipeline commit every second while the agent's own
/// scheduled maintenance and `floe maintain` processes compact and expire their tables.
async fn concurrent(lake: Lake) -> Result<()> {
    let seconds: u64 = std::env::var("FLOE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let broker = Broker::start()?;
    broker.create_topic("events", 2).await?;
    broker.create_topic("state", 2).await?;
    let events = maintenance(lake.pipeline("events", &broker.bootstrap, "events", "events"));
    let state = maintenance(
        lake.pipeline("state", &broker.bootstrap, "state", "state")
            .upsert(&["_kafka_key"]),
    );
    let config = lake.write("floe.toml", &lake.config().pipeline(events).pipeline(state))?;

    let mut agent = AgentProcess::start(&config, &[])?;
    let mut rng = Rng(0x5EED_CAFE_F00D_D00D);
    let mut reference: BTreeMap<String, Value> = BTreeMap::new();
    let (mut n_events, mut n_state) = (0i64, 0i64);
    let started = Instant::now();
    let mut last_cli = Instant::now();
    let mut cli_runs = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        let e: Vec<_> = (0..20)
            .map(|i| {
                let kind = ["a", "b", "c"][(i % 3) as usize];
                let v = json!({"n": n_events + i, "kind": kind});
                (None, Some(v.to_string().into_bytes()))
            })
            .collect();
        n_events += e.len() as i64;
        let mut s = Vec::new();
        for _ in 0..20 {
            let key = format!("k{}", rng.next() % 200);
            if rng.next().is_multiple_of(10) {
                s.push((Some(key.clone().into_bytes()), None));
                reference.remove(&key);
            } else {
                let v = json!({"v": rng.next() % 1000, "at": n_state});
                s.push((
                    Some(key.clone().into_bytes()),
                    Some(v.to_string().into_bytes()),
                ));
                reference.insert(key, v);
            }
            n_state += 1;
        }
        broker.produce("events", &e).await?;
        broker.produce("state", &s).await?;
        // Another maintainer next to the agent's own: `floe maintain` every few seconds.
        if last_cli.elapsed() > Duration::from_secs(5) {
            let c = config.clone();
            cli_runs.push(tokio::task::spawn_blocking(move || maintain(&c)));
            last_cli = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    lake.wait_for_messages("events", "events", n_events).await?;
    lake.wait_for_messages("state", "state", n_state).await?;
    for run in cli_runs {
        run.await??;
    }
    agent.wait_for_line("maintenance: compact:", WAIT)?;
    let log = agent.terminate()?;
    let compactions = log
        .lines()
        .filter(|l| l.contains("maintenance: compact: rewrote"))
        .count();
    ensure!(
        compactions > 0,
        "the agent's scheduled maintenance never compacted:\n{log}"
    );
    ensure!(
        !log.contains("maintenance job failed"),
        "a maintenance job failed:\n{log}"
    );

    // Orphans: one old and one fresh unreferenced file in the data folder.
    let orphans = if lake.rest.is_none() {
        let table = lake.table("events").await?;
        let dir = floe_iceberg::orphans::local_dir(table.metadata().location())
            .context("local table")?
            .join("data");
        let old = dir.join("crashed-upload.parquet");
        let fresh = dir.join("in-flight.parquet");
        std::fs::write(&old, b"not referenced")?;
        std::fs::write(&fresh, b"not referenced yet")?;
        std::fs::File::options()
            .write(true)
            .open(&old)?
            .set_modified(SystemTime::now() - Duration::from_secs(3 * 3600))?;
        Some((old, fresh))
    } else {
        None
    };

    // A last run with nothing committing: every table ends compacted and expired.
    let report = maintain(&config)?;
    let carried = log
        .lines()
        .filter(|l| l.contains("concurrent deletes over"))
        .count();
    let gave_up = log.lines().filter(|l| l.contains("gave up")).count();
    println!(
        "maintenance ({}, {seconds}s): {compactions} scheduled compactions ({carried} carried concurrent deletes over, {gave_up} gave up); last run:\n{report}",
        lake.kind()
    );
    for table in ["events", "state"] {
        let (data, deletes) = file_counts(&lake, table).await?;
        ensure!(
            data == 1 && deletes == 0,
            "{table}: {data} data files and {deletes} delete files after compaction\n{report}"
        );
        let t = lake.table(table).await?;
        let snapshots = t.metadata().snapshots().count();
        ensure!(snapshots <= 3, "{table}: {snapshots} snapshots kept");
        // Every snapshot carries the pipeline's offsets: its own commits in
        // `floe.offsets`, compactions in `floe.offsets.<pipeline>`.
        for s in t.metadata().snapshots() {
            let summary = &s.summary().additional_properties;
            let carried = match summary.get("floe.maintenance").map(String::as_str) {
                Some("compaction") => summary.contains_key(&format!("floe.offsets.{table}")),
                _ => summary.contains_key("floe.offsets"),
            };
            ensure!(carried, "{table}: a snapshot without offsets: {summary:?}");
        }
        // The metadata log is trimmed to 5 entries, and no metadata file older than its
        // oldest entry is left (newer unreferenced ones, from attempts that lost a race,
        // wait for orphan cleanup).
        let log = t.metadata().metadata_log();
        ensure!(log.len() <= 5, "{table}: metadata log of {}", log.len());
        if lake.rest.is_none() {
            let version = |name: &str| -> Option<u64> {
                let name = name.rsplit('/').next()?;
                name.split_once('-')?.0.parse().ok()
            };
            let oldest = log
                .iter()
                .filter_map(|l| version(&l.metadata_file))
                .min()
                .context("metadata log versions")?;
            let metadata_dir = floe_iceberg::orphans::local_dir(t.metadata().location())
                .context("local")?
                .join("metadata");
            let stale: Vec<String> = std::fs::read_dir(&metadata_dir)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.ends_with(".metadata.json") && version(n).is_some_and(|v| v < oldest))
                .collect();
            ensure!(
                stale.is_empty(),
                "{table}: metadata files older than the log's oldest entry: {stale:?}"
            );
        }
    }
    if let Some((old, fresh)) = orphans {
        ensure!(!old.exists(), "the old orphan was not deleted");
        ensure!(fresh.exists(), "a fresh unreferenced file was deleted");
    }
    if lake.rest.is_some() {
        // On S3 (vended credentials): an object no snapshot references is listed and
        // deleted; every referenced one stays (the reads below find every row). Object
        // ages cannot be set here, so the cleanup runs in process with age zero.
        let table = lake.table("events").await?;
        let orphan = format!(
            "{}/data/crashed-upload.parquet",
            table.metadata().location()
        );
        let io = table.file_io();
        io.new_output(&orphan)?
            .write(bytes::Bytes::from_static(b"not referenced"))
            .await?;
        ensure!(io.exists(&orphan).await?, "the orphan was not written");
        let reload = || async { Ok(table.clone()) };
        let report =
            floe_iceberg::orphans::remove_orphans(&table, reload, Duration::ZERO, false).await?;
        println!("orphan cleanup on S3: {report}");
        ensure!(report.starts_with("deleted "), "{report}");
        ensure!(
            !io.exists(&orphan).await?,
            "the orphan on S3 was not deleted: {report}"
        );
    }

    // Nothing lost or duplicated.
    for reader in ["pyiceberg", "duckdb"] {
        let dump = lake.read(reader, "events", "n")?;
        let mut seen = HashSet::new();
        for r in dump.rows() {
            ensure!(
                seen.insert(r["n"].as_i64().context("n")?),
                "{reader}: event {} twice",
                r["n"]
            );
        }
        ensure!(
            seen.len() as i64 == n_events && seen.iter().all(|n| *n < n_events),
            "{reader}: {} events, {n_events} produced",
            seen.len()
        );
        let dump = lake.read(reader, "state", "_kafka_key")?;
        let rows: BTreeMap<String, Value> = dump
            .rows()
            .iter()
            .map(|r| {
                (
                    r["_kafka_key"].as_str().unwrap_or_default().to_string(),
                    json!({"v": r["v"], "at": r["at"]}),
                )
            })
            .collect();
        ensure!(
            dump.rows().len() == reference.len() && rows == reference,
            "{reader}: state differs from the reference ({} rows, want {})",
            dump.rows().len(),
            reference.len()
        );
    }
    Ok(())
}

/// The pipeline's snapshots are expired after another engine committed on top: the
/// restarted agent resumes from the table property and loses or repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_survive_foreign_commits_and_expiry() -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("events", 2).await?;
    let pipeline = lake.pipeline("events", &broker.bootstrap, "events", "events");
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let batch = |from: i64| -> Vec<floe_tests::Message> {
        (from..from + 100)
            .map(|n| (None, Some(json!({"n": n}).to_string().into_bytes())))
            .collect()
    };
    broker.produce("events", &batch(0)).await?;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("events", "events", 100).await?;
    agent.terminate()?;

    // Another engine appends twice, then expires every snapshot but its last one.
    let row = |n: i64| json!({"n": n, "_kafka_partition": -1, "_kafka_offset": n}).to_string();
    lake.foreign("events", &["--append-json", &row(-1)])?;
    lake.foreign("events", &["--append-json", &row(-2)])?;
    let after = lake.foreign("events", &["--expire-all-but-current"])?;
    ensure!(after["snapshots"] == 1, "expiry left {after}");
    let table = lake.table("events").await?;
    let (offsets, source) = OffsetMap::located(table.metadata(), "events")?;
    ensure!(
        matches!(source, OffsetsSource::Property(_)) && offsets.0.values().sum::<i64>() == 100,
        "offsets after expiry: {offsets:?} from {source:?}"
    );

    broker.produce("events", &batch(100)).await?;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("events", "events", 200).await?;
    let log = agent.terminate()?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = lake.read(reader, "events", "n")?;
        let ns: Vec<i64> = dump
            .rows()
            .iter()
            .map(|r| r["n"].as_i64().unwrap_or(i64::MIN))
            .collect();
        let want: Vec<i64> = (-2..200).collect();
        ensure!(
            ns == want,
            "{reader}: {} rows; lost or repeated messages after the restart\n{log}",
            ns.len()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_carries_over_deletes_committed_while_it_ran() -> Result<()> {
    carry_over(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_carries_over_deletion_vectors_committed_while_it_ran() -> Result<()> {
    carry_over(3).await
}

/// An upsert pipeline updates and deletes rows of the files a compaction is rewriting,
/// after the compaction read them and before it commits: the compaction's commit
/// carries those deletes over to the new files, and the pipeline goes on after it.
async fn carry_over(format_version: u8) -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("state", 1).await?;
    let pipeline = lake
        .pipeline("state", &broker.bootstrap, "state", "state")
        .upsert(&["_kafka_key"])
        .set("sink.format_version", i64::from(format_version))
        .maintenance("min_input_files", 2);
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let mut reference: BTreeMap<String, Value> = BTreeMap::new();
    let mut produced = 0i64;
    let agent = AgentProcess::start(&config, &[])?;
    // Five commits: five data files, and delete files from the updates among them.
    for round in 0..5 {
        let batch = (0..40)
            .map(|i| {
                let id = (round * 13 + i) % 60;
                (format!("k{id}"), Some(json!({"id": id, "round": round})))
            })
            .collect();
        send(&lake, &broker, &mut produced, batch, &mut reference).await?;
    }
    // Compaction stops after writing its files; the pipeline updates and deletes rows
    // of those files meanwhile.
    let resume = lake.ws.path("resume-compaction");
    let config_arg = config.to_str().context("utf-8 path")?;
    let mut compaction = AgentProcess::command(
        &["maintain", "--config", config_arg],
        &[
            ("FLOE_FAILPOINT", floe::failpoint::COMPACT_BEFORE_COMMIT),
            (
                "FLOE_FAILPOINT_RESUME",
                resume.to_str().context("utf-8 path")?,
            ),
        ],
    )?;
    compaction.wait_for_line("FLOE_FAILPOINT compact_before_commit reached", WAIT)?;
    let batch = (0..60)
        .filter(|id| id % 4 == 0)
        .map(|id| {
            let v = (id % 8 != 0).then(|| json!({"id": id, "round": 100}));
            (format!("k{id}"), v)
        })
        .collect();
    send(&lake, &broker, &mut produced, batch, &mut reference).await?;
    std::fs::write(&resume, b"")?;
    let (status, out) = compaction.wait_exit(WAIT)?;
    ensure!(status.success(), "floe maintain failed:\n{out}");
    ensure!(
        out.contains("concurrent deletes over"),
        "the compaction did not carry the concurrent deletes over:\n{out}"
    );
    // The pipeline goes on after the compaction (its index is rebuilt from the table).
    let batch = (0..60)
        .filter(|id| id % 3 == 0)
        .map(|id| (format!("k{id}"), Some(json!({"id": id, "round": 200}))))
        .collect();
    send(&lake, &broker, &mut produced, batch, &mut reference).await?;
    let log = agent.terminate()?;
    replace_snapshots_list_their_removals(&lake, "state").await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = lake.read(reader, "state", "_kafka_key")?;
        let rows: BTreeMap<String, Value> = dump
            .rows()
            .iter()
            .map(|r| {
                (
                    r["_kafka_key"].as_str().unwrap_or_default().to_string(),
                    json!({"id": r["id"], "round": r["round"]}),
                )
            })
            .collect();
        ensure!(
            dump.rows().len() == reference.len() && rows == reference,
            "{reader} (v{format_version}): rows differ from the reference\n got {rows:?}\nwant {reference:?}\n{log}"
        );
    }
    Ok(())
}

/// Every `replace` snapshot of `table` (a compaction) names each file it removed as a
/// `DELETED` entry of its own manifests, as Java's rewrite does: another engine's
/// conflict check for a concurrent row-level delete (`validateDataFilesExist`) and
/// incremental readers look for exactly those entries.
async fn replace_snapshots_list_their_removals(lake: &Lake, table: &str) -> Result<()> {
    let checked = floe_tests::snapshots::check_all(&lake.table(table).await?).await?;
    ensure!(
        checked.get("replace").copied().unwrap_or(0) > 0,
        "no compaction snapshot: {checked:?}"
    );
    Ok(())
}

/// Produces upserts (`None`: a tombstone) and waits until the table covers them.
async fn send(
    lake: &Lake,
    broker: &Broker,
    produced: &mut i64,
    batch: Vec<(String, Option<Value>)>,
    reference: &mut BTreeMap<String, Value>,
) -> Result<()> {
    let messages: Vec<floe_tests::Message> = batch
        .iter()
        .map(|(k, v)| {
            (
                Some(k.clone().into_bytes()),
                v.as_ref().map(|v| v.to_string().into_bytes()),
            )
        })
        .collect();
    for (k, v) in batch {
        match v {
            Some(v) => reference.insert(k, v),
            None => reference.remove(&k),
        };
    }
    *produced += messages.len() as i64;
    broker.produce("state", &messages).await?;
    lake.wait_for_messages("state", "state", *produced).await
}

/// Another engine (Flink's upsert mode, say) commits equality deletes to a table Floe
/// appends to and maintains. Compaction leaves that table alone and says why, expiry
/// keeps the delete files (they are live), and no deleted row comes back, before or
/// after Floe appends more. DuckDB applies equality deletes; PyIceberg cannot read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equality_deletes_of_another_engine_are_never_undone() -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("events", 1).await?;
    let pipeline = lake
        .pipeline("events", &broker.bootstrap, "events", "events")
        .maintenance("interval", "1h")
        .maintenance("min_input_files", 2)
        .maintenance("keep_snapshots", 1)
        .maintenance("max_snapshot_age", "0s");
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let value = |n: i64| json!({"n": n, "s": format!("v{n}")});
    let batch = |from: i64, to: i64| -> Vec<floe_tests::Message> {
        (from..to)
            .map(|n| (None, Some(value(n).to_string().into_bytes())))
            .collect()
    };
    // Three commits: three data files.
    let agent = AgentProcess::start(&config, &[])?;
    for round in 0..3 {
        broker
            .produce("events", &batch(round * 20, round * 20 + 20))
            .await?;
        lake.wait_for_messages("events", "events", round * 20 + 20)
            .await?;
    }
    agent.terminate()?;

    let deleted = [3i64, 25, 47];
    equality_delete(&lake, "events", "n", &deleted).await?;
    let (_, deletes) = file_counts(&lake, "events").await?;
    ensure!(
        deletes == 1,
        "{deletes} delete files after the foreign commit"
    );
    let report = maintain(&config)?;
    ensure!(
        report.contains("equality-delete"),
        "compaction does not say why it left the table alone:\n{report}"
    );
    check_equality_deleted(&lake, 60, &deleted).context("after maintenance")?;

    broker.produce("events", &batch(60, 80)).await?;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("events", "events", 80).await?;
    agent.terminate()?;
    maintain(&config)?;
    let (_, deletes) = file_counts(&lake, "events").await?;
    ensure!(deletes == 1, "{deletes} delete files after expiry");
    check_equality_deleted(&lake, 80, &deleted).context("after more records and maintenance")
}

/// Commits an equality-delete file on `column` holding `values`, as another engine would.
async fn equality_delete(lake: &Lake, table: &str, column: &str, values: &[i64]) -> Result<()> {
    use std::sync::Arc;

    use iceberg::spec::{DataFileFormat, Schema};
    use iceberg::writer::file_writer::ParquetWriterBuilder;
    use iceberg::writer::file_writer::location_generator::{
        DefaultFileNameGenerator, DefaultLocationGenerator,
    };
    use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;

    let handle = lake.handle().await?;
    let t = lake.table(table).await?;
    let field = t
        .metadata()
        .current_schema()
        .field_by_name(column)
        .with_context(|| format!("column {column}"))?
        .clone();
    let schema = Arc::new(Schema::builder().with_fields(vec![field.clone()]).build()?);
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
    let batch = arrow_array::RecordBatch::try_new(
        arrow,
        vec![Arc::new(arrow_array::Int64Array::from(values.to_vec()))],
    )?;
    let mut writer = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetWriterBuilder::new(
            parquet::file::properties::WriterProperties::default(),
            schema,
        ),
        t.file_io().clone(),
        DefaultLocationGenerator::new(t.metadata())?,
        DefaultFileNameGenerator::new("engine-eq-delete".into(), None, DataFileFormat::Parquet),
    )
    .build();
    writer.write(&None, &batch).await?;
    let spec = t.metadata().default_partition_spec_id();
    let files = writer
        .close()
        .await?
        .into_iter()
        .map(|mut b| {
            b.content(DataContentType::EqualityDeletes)
                .equality_ids(Some(vec![field.id]))
                .partition_spec_id(spec);
            b.build()
                .map(|f| (spec, f))
                .map_err(|e| anyhow::anyhow!("equality-delete file: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut staged = floe_iceberg::StagedSnapshot::write(&t, None, Vec::new(), files).await?;
    let properties = std::collections::HashMap::new();
    let offsets = OffsetMap::default();
    let fence = floe_iceberg::Fence {
        pipeline: "another-engine".into(),
        expected: Default::default(),
    };
    floe_iceberg::commit(
        handle.catalog.as_ref(),
        handle.committer.as_ref(),
        t,
        &mut staged,
        floe_iceberg::CommitOptions {
            properties: &properties,
            offsets: &offsets,
            new_schema: None,
            written_on: None,
            fence: &fence,
            exact_parent: false,
        },
    )
    .await?;
    Ok(())
}

/// DuckDB reads every record below `produced` but the `deleted` ones, every column.
fn check_equality_deleted(lake: &Lake, produced: i64, deleted: &[i64]) -> Result<()> {
    let expected: Vec<Value> = (0..produced)
        .filter(|n| !deleted.contains(n))
        .map(|n| json!({"n": n, "s": format!("v{n}"), "_kafka_partition": 0, "_kafka_offset": n, "_kafka_key": null}))
        .collect();
    let dump = lake.read("duckdb", "events", "n")?;
    floe_tests::reference::assert_rows("duckdb", &dump, &expected, &["n"], &["_kafka_timestamp"])
}

/// Compaction converges: after one run, a table with nothing new is left alone at any
/// target size (a file compaction rolled at the target is never "small" again), and
/// every value is what was ingested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_converges_at_any_target_size() -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("events", 1).await?;
    let pipeline = lake.pipeline("events", &broker.bootstrap, "events", "events");
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline.clone()))?;
    let agent = AgentProcess::start(&config, &[])?;
    let mut rng = Rng(0x5eed);
    let mut produced = 0;
    for _ in 0..4 {
        let batch: Vec<floe_tests::Message> = (produced..produced + 3000)
            .map(|n| {
                let note: String = (0..6).map(|_| format!("{:016x}", rng.next())).collect();
                let row = json!({"n": n, "note": note, "group": n % 7});
                (None, Some(row.to_string().into_bytes()))
            })
            .collect();
        produced += 3000;
        broker.produce("events", &batch).await?;
        lake.wait_for_messages("events", "events", produced).await?;
    }
    agent.terminate()?;
    // Every column of every row, as each reader sees it before maintenance.
    let values = |dump: floe_tests::TableDump| (dump.0["columns"].clone(), dump.0["rows"].clone());
    let reference: Vec<(Value, Value)> = ["pyiceberg", "duckdb"]
        .iter()
        .map(|r| Ok(values(lake.read(r, "events", "n")?)))
        .collect::<Result<_>>()?;
    ensure!(
        reference[0].1.as_array().map(Vec::len) == Some(produced as usize),
        "the table before maintenance is not what was produced"
    );

    for target in ["64KiB", "256KiB", "1MiB"] {
        let pipeline = pipeline
            .clone()
            .maintenance("target_file_size", target)
            .maintenance("min_input_files", 2);
        let config = lake.write("maintain.toml", &lake.config().pipeline(pipeline))?;
        let first = maintain(&config)?;
        let (files, _) = file_counts(&lake, "events").await?;
        let again = maintain(&config)?;
        ensure!(
            again.contains("nothing to compact"),
            "target {target}: a second run rewrote again with nothing new ({files} files after the first run):\n{again}\nfirst run:\n{first}"
        );
        for (reader, want) in ["pyiceberg", "duckdb"].iter().zip(&reference) {
            let got = values(lake.read(reader, "events", "n")?);
            if &got != want {
                let (g, w) = (got.1.as_array(), want.1.as_array());
                let first = g
                    .zip(w)
                    .and_then(|(g, w)| g.iter().zip(w).find(|(a, b)| a != b));
                bail!(
                    "{reader}: values changed by compaction at {target}: {} rows for {}; first difference {first:?}",
                    g.map_or(0, Vec::len),
                    w.map_or(0, Vec::len)
                );
            }
        }
    }
    Ok(())
}

/// With a `topic_pattern` and a `{topic}` table template, maintenance takes on the
/// tables the pipeline created, not another writer's table whose name fits the
/// template, and orphan cleanup never deletes the files of a table nested under a
/// maintained table's location.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_leaves_other_writers_tables_alone() -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("ta", 1).await?;
    let pipeline = lake
        .pipeline("events", &broker.bootstrap, "ta", "{topic}")
        .topic_pattern("t.*")
        .property("topic.metadata.refresh.interval.ms", "500");
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline.clone()))?;
    let agent = AgentProcess::start(&config, &[])?;
    for from in [0, 50, 100] {
        let batch: Vec<floe_tests::Message> = (from..from + 50)
            .map(|n| (None, Some(json!({"n": n}).to_string().into_bytes())))
            .collect();
        broker.produce("ta", &batch).await?;
        lake.wait_for_messages("ta", "events", from + 50).await?;
    }
    agent.terminate()?;

    // Another writer's table whose name fits `{topic}`, in three small files, and one
    // placed under `ta`'s location, its files two days old.
    let ta = format!("{}.ta", lake.namespace);
    let row = |n: i64| json!({"n": n, "_kafka_partition": -1, "_kafka_offset": n}).to_string();
    lake.foreign("tother", &["--create-like", &ta, "--append-json", &row(-1)])?;
    lake.foreign("tother", &["--append-json", &row(-2)])?;
    let other = lake.foreign("tother", &["--append-json", &row(-3)])?;
    let inner = lake.table("ta").await?.metadata().location().to_string() + "/inner";
    lake.foreign("tinner", &["--create-like", &ta, "--location", &inner])?;
    lake.foreign("tinner", &["--append-json", &row(-4)])?;
    let inner_dir = floe_iceberg::orphans::local_dir(&inner).context("local location")?;
    let status = std::process::Command::new("find")
        .arg(&inner_dir)
        .args([
            "-type",
            "f",
            "-exec",
            "touch",
            "-d",
            "2 days ago",
            "{}",
            "+",
        ])
        .status()?;
    ensure!(status.success(), "could not age the nested table's files");
    let inner_files = count_files(&inner_dir)?;

    let before: Vec<Value> = ["pyiceberg", "duckdb"]
        .iter()
        .map(|r| Ok(lake.read(r, "ta", "n")?.0["rows"].clone()))
        .collect::<Result<_>>()?;
    ensure!(
        before[0].as_array().map(Vec::len) == Some(150),
        "ta before maintenance: {}",
        before[0]
    );
    let maintained = pipeline
        .maintenance("min_input_files", 2)
        .maintenance("keep_snapshots", 1)
        .maintenance("max_snapshot_age", "0s")
        .maintenance("orphan_age", "2h");
    let config = lake.write("maintain.toml", &lake.config().pipeline(maintained))?;
    let out = maintain(&config)?;
    ensure!(
        out.contains("shop.ta ") && out.contains("rewrote 3 data files"),
        "the pipeline's own table was not compacted:\n{out}"
    );
    ensure!(
        !out.contains("tother") && !out.contains("tinner"),
        "maintenance took on another writer's table:\n{out}"
    );
    let after = lake.foreign("tother", &[])?;
    ensure!(
        after == other,
        "another writer's table changed: {other} -> {after}"
    );
    ensure!(
        count_files(&inner_dir)? == inner_files,
        "orphan cleanup deleted files of the table under its location:\n{out}"
    );
    for (reader, want) in ["pyiceberg", "duckdb"].iter().zip(&before) {
        let rows = lake.read(reader, "tinner", "n")?.0["rows"].clone();
        ensure!(
            rows.as_array()
                .map(|r| r.iter().map(|r| r["n"].clone()).collect::<Vec<_>>())
                == Some(vec![json!(-4)]),
            "{reader}: the nested table reads {rows}"
        );
        let rows = lake.read(reader, "ta", "n")?.0["rows"].clone();
        ensure!(&rows == want, "{reader}: compaction changed ta's values");
    }
    Ok(())
}

/// Files under `dir`, at any depth.
fn count_files(dir: &std::path::Path) -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            n += count_files(&entry.path())?;
        } else {
            n += 1;
        }
    }
    Ok(n)
}
