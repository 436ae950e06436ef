//! Model-based test of the pipeline next to other writers and faults.
//!
//! A seeded generator drives the real pipeline in process (scripted source, real
//! embedded catalog with injected faults) through random steps: records with new
//! columns, incompatible values and tombstones; transient write and commit failures,
//! lost commit answers; another pipeline committing to the same table, another writer
//! adding a column; compaction and snapshot expiry; a partition revoked and assigned back
//! while its commit is in flight; restarts; crashes (a commit refused for good stops the
//! pipeline with no clean close, and a new one starts from the table and, in upsert
//! mode, from the key index kept on disk, 64 KiB so that it spills and merges between
//! commits). After every step the table is read back and
//! compared, every column of every row, with a reference model of what the records must
//! have become (and the dead letters with the records that must not).
//!
//! Modes: append, upsert on a v2 table (position deletes) and on a v3 table (deletion
//! vectors). CI runs one seed per mode with `FLOE_MODEL_STEPS` (default 18) steps;
//! `scripts/faults.sh` runs more (`FLOE_MODEL_SEEDS=1-20 FLOE_MODEL_STEPS=60`). A failure
//! prints its seed and step; failing seeds are kept in `REGRESSIONS`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use floe::source::SourceCommand;
use floe_tests::inject::{Faults, faulty_catalog};
use floe_tests::scripted::ScriptedPipeline;
use floe_tests::{Config, Pipeline, TableDump, Workspace};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use serde_json::{Map, Value, json};

/// Seeds that once failed, run in CI with the default ones.
const REGRESSIONS: &[(Mode, u64)] = &[];

/// The roll of [`Run::random_step`] that crashes the pipeline.
const CRASH_ROLL: u64 = 89;

const PARTITIONS: i32 = 2;
const WAIT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Append,
    /// Upsert on a format v2 table (position deletes).
    Upsert,
    /// Upsert on a format v3 table (deletion vectors).
    UpsertV3,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_tables_match_the_model() -> Result<()> {
    run_seeds(Mode::Append).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_tables_match_the_model() -> Result<()> {
    run_seeds(Mode::Upsert).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_v3_tables_match_the_model() -> Result<()> {
    run_seeds(Mode::UpsertV3).await
}

async fn run_seeds(mode: Mode) -> Result<()> {
    if let Ok(filter) = std::env::var("FLOE_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
    }
    let steps: usize = std::env::var("FLOE_MODEL_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(18);
    let mut seeds: Vec<u64> = match std::env::var("FLOE_MODEL_SEEDS") {
        Ok(v) => match v.split_once('-') {
            Some((a, b)) => (a.parse()?..=b.parse()?).collect(),
            None => v
                .split(',')
                .map(|s| s.trim().parse())
                .collect::<Result<_, _>>()?,
        },
        Err(_) => vec![match mode {
            Mode::Append => 1,
            Mode::Upsert => 2,
            Mode::UpsertV3 => 3,
        }],
    };
    seeds.extend(
        REGRESSIONS
            .iter()
            .filter(|(m, _)| *m == mode)
            .map(|(_, s)| *s),
    );
    for seed in seeds {
        let started = Instant::now();
        run(mode, seed, steps)
            .await
            .with_context(|| format!("{mode:?} model, seed {seed}"))?;
        eprintln!(
            "{mode:?} seed {seed}: {steps} steps in {:?}",
            started.elapsed()
        );
    }
    Ok(())
}

/// A small, reproducible generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Column types the generator uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Long,
    Double,
    Text,
    Flag,
    Time,
    Tags,
    Nested,
}

impl Col {
    fn random(rng: &mut Rng) -> Col {
        [
            Col::Long,
            Col::Double,
            Col::Text,
            Col::Flag,
            Col::Time,
            Col::Tags,
            Col::Nested,
        ][rng.below(7) as usize]
    }

    fn value(self, rng: &mut Rng) -> Value {
        let n = rng.below(1000) as i64;
        match self {
            Col::Long => json!(n - 500),
            Col::Double => json!(n as f64 / 8.0 + 0.5),
            Col::Text => json!(format!("s{n}")),
            Col::Flag => json!(n % 2 == 0),
            Col::Time => json!(
                chrono::DateTime::from_timestamp(1_700_000_000 + n * 3600, 0)
                    .expect("time")
                    .to_rfc3339()
            ),
            Col::Tags => json!([format!("t{}", n % 5), format!("u{}", n % 3)]),
            Col::Nested => json!({"n": n, "s": format!("x{n}")}),
        }
    }

    /// A value no column of this type can hold (the record is dead-lettered), if any.
    fn incompatible(self) -> Option<Value> {
        match self {
            Col::Long | Col::Double | Col::Flag | Col::Time => Some(json!({"not": "this"})),
            Col::Nested => Some(json!("flat")),
            Col::Text | Col::Tags => None,
        }
    }
}

/// One record of the log.
#[derive(Debug, Clone)]
struct Rec {
    key: Option<String>,
    value: Option<Value>,
    /// Dead-lettered: a value of a committed column's incompatible type.
    bad: bool,
}

/// What the pipeline under test must have written, and the other writer.
struct Model {
    mode: Mode,
    /// Columns the records may use, with their type.
    columns: Vec<(String, Col)>,
    /// Columns known to be in the table (a value of another type is dead-lettered).
    committed: BTreeSet<String>,
    /// Per partition, the records by offset.
    log: Vec<Vec<Rec>>,
    /// The other pipeline's records (topic `f`, partition 0).
    foreign: Vec<Rec>,
    next_id: i64,
    next_column: usize,
}

impl Model {
    fn record(&mut self, rng: &mut Rng) -> Rec {
        let id = match self.mode {
            Mode::Append => {
                self.next_id += 1;
                self.next_id
            }
            Mode::Upsert | Mode::UpsertV3 => rng.below(12) as i64,
        };
        let key = Some(format!("k{id}"));
        if self.mode != Mode::Append && rng.chance(8) {
            return Rec {
                key,
                value: None,
                bad: false,
            };
        }
        let mut value = Map::new();
        value.insert("id".into(), json!(id));
        if self.columns.is_empty() || rng.chance(15) {
            self.next_column += 1;
            self.columns
                .push((format!("c{}", self.next_column), Col::random(rng)));
        }
        let n = 1 + rng.below(3);
        for _ in 0..n {
            let (name, col) = self.columns[rng.below(self.columns.len() as u64) as usize].clone();
            value.insert(name, col.value(rng));
        }
        let mut bad = false;
        if rng.chance(10) {
            let targets: Vec<(String, Value)> = self
                .columns
                .iter()
                .filter(|(c, _)| self.committed.contains(c))
                .filter_map(|(c, t)| t.incompatible().map(|v| (c.clone(), v)))
                .collect();
            if !targets.is_empty() {
                let (c, v) = targets[rng.below(targets.len() as u64) as usize].clone();
                value.insert(c, v);
                bad = true;
            }
        }
        Rec {
            key,
            value: Some(Value::Object(value)),
            bad,
        }
    }

    /// After everything is committed: every column a good record used is in the table.
    fn settled(&mut self) {
        for rec in self.log.iter().flatten().chain(&self.foreign) {
            if let (Some(Value::Object(o)), false) = (&rec.value, rec.bad) {
                self.committed.extend(o.keys().cloned());
            }
        }
    }

    /// The rows the table must hold (both pipelines), each with its Kafka columns.
    fn expected(&self) -> Vec<Value> {
        let mut rows: BTreeMap<String, Option<Value>> = BTreeMap::new();
        let mut append = Vec::new();
        let sources = (0..PARTITIONS)
            .flat_map(|p| {
                self.log[p as usize]
                    .iter()
                    .enumerate()
                    .map(move |(o, r)| (p, o as i64, r))
            })
            .chain(
                self.foreign
                    .iter()
                    .enumerate()
                    .map(|(o, r)| (0, o as i64, r)),
            );
        for (partition, offset, rec) in sources {
            if rec.bad {
                continue;
            }
            let row = rec.value.as_ref().map(|v| {
                let mut o = v.as_object().cloned().unwrap_or_default();
                o.insert("_kafka_partition".into(), json!(partition));
                o.insert("_kafka_offset".into(), json!(offset));
                o.insert("_kafka_key".into(), json!(rec.key));
                Value::Object(o)
            });
            match self.mode {
                Mode::Append => append.push(row.unwrap_or_else(|| {
                    json!({"_kafka_partition": partition, "_kafka_offset": offset, "_kafka_key": rec.key})
                })),
                Mode::Upsert | Mode::UpsertV3 => {
                    rows.insert(rec.key.clone().unwrap_or_default(), row);
                }
            }
        }
        match self.mode {
            Mode::Append => append,
            Mode::Upsert | Mode::UpsertV3 => rows.into_values().flatten().collect(),
        }
    }

    /// Offsets (partition, offset) of the records that must be dead letters.
    fn dead(&self) -> BTreeSet<(i32, i64)> {
        let mut out = BTreeSet::new();
        for p in 0..PARTITIONS {
            for (o, r) in self.log[p as usize].iter().enumerate() {
                if r.bad {
                    out.insert((p, o as i64));
                }
            }
        }
        out
    }
}

/// A pipeline under test and the state of its scripted source.
struct Driven {
    pipeline: ScriptedPipeline,
    faults: Arc<Faults>,
    topic: &'static str,
    /// Seek commands already served.
    served: usize,
}

fn message(topic: &str, partition: i32, offset: i64, rec: &Rec) -> floe::record::Message {
    floe::record::Message {
        topic: Arc::from(topic),
        partition,
        offset,
        timestamp_ms: Some(1_700_000_000_000 + offset),
        key: rec.key.as_ref().map(|k| k.as_bytes().to_vec()),
        value: rec.value.as_ref().map(|v| v.to_string().into_bytes()),
        headers: Vec::new(),
    }
}

impl Driven {
    async fn start(
        ws: &Workspace,
        config: &std::path::Path,
        topic: &'static str,
    ) -> Result<Driven> {
        let (catalog, faults) = faulty_catalog(ws.dir.path(), "local").await?;
        Ok(Driven {
            pipeline: ScriptedPipeline::start_on(config, Some(catalog)).await?,
            faults,
            topic,
            served: 0,
        })
    }

    /// Delivers `log[from..]` of a partition.
    fn deliver(&self, partition: i32, from: i64, log: &[Rec]) {
        let messages: Vec<_> = log
            .iter()
            .enumerate()
            .skip(from as usize)
            .map(|(o, r)| message(self.topic, partition, o as i64, r))
            .collect();
        if !messages.is_empty() {
            self.pipeline.push(messages);
        }
    }

    /// Does what the real consumer does on a seek: delivers again from the positions.
    fn serve_seeks(&mut self, logs: &[&[Rec]]) {
        let seeks = self.pipeline.seeks();
        for seek in &seeks[self.served..] {
            if let SourceCommand::Seek { positions, .. } = seek {
                for ((_, p), at) in positions {
                    self.deliver(*p, at.unwrap_or(0), logs[*p as usize]);
                }
            }
        }
        self.served = seeks.len();
    }
}

fn config(ws: &Workspace, name: &str, topic: &str, mode: Mode) -> Result<PathBuf> {
    let pipeline = Pipeline::new(name, "127.0.0.1:9", topic)
        .group_id(&format!("g-{name}"))
        .sink("local", "ns", "t")
        .commit_interval("1s")
        .dead_letter(ws.path(&format!("{name}.ndjson")));
    // Upsert: a kept index small enough to spill and merge between commits, so that
    // the crash steps start from what it kept on disk.
    let upsert = |p: Pipeline| {
        p.upsert(&["_kafka_key"])
            .set("sink.index_memory", "64KiB")
            .set(
                "sink.index_dir",
                ws.path(&format!("index-{name}")).display().to_string(),
            )
    };
    let pipeline = match mode {
        Mode::Append => pipeline,
        Mode::Upsert => upsert(pipeline),
        Mode::UpsertV3 => upsert(pipeline).set("sink.format_version", 3),
    };
    Config::new()
        .catalog("local", ws.embedded_catalog())
        .pipeline(pipeline)
        .write(ws.path(&format!("{name}.toml")))
}

/// The stored offsets of `pipeline` per partition.
async fn stored(catalog: &dyn iceberg::Catalog, pipeline: &str) -> Result<BTreeMap<i32, i64>> {
    let ident = iceberg::TableIdent::from_strs(["ns", "t"])?;
    let table = match catalog.load_table(&ident).await {
        Ok(t) => t,
        Err(_) => return Ok(BTreeMap::new()),
    };
    Ok(
        floe_iceberg::OffsetMap::from_table(table.metadata(), pipeline)?
            .0
            .into_iter()
            .map(|((_, p), o)| (p, o))
            .collect(),
    )
}

struct Run {
    ws: Workspace,
    model: Model,
    rng: Rng,
    p: Driven,
    p_config: PathBuf,
    f: Option<Driven>,
    f_config: PathBuf,
    catalog: floe_iceberg::CatalogHandle,
    step: usize,
}

async fn run(mode: Mode, seed: u64, steps: usize) -> Result<()> {
    let ws = Workspace::new()?;
    let p_config = config(&ws, "p", "t", mode)?;
    let f_config = config(&ws, "f", "f", mode)?;
    let p = Driven::start(&ws, &p_config, "t").await?;
    let assign: Vec<_> = (0..PARTITIONS).map(|i| (i, None, vec![None])).collect();
    p.pipeline.assign("t", &assign);
    let catalog = floe_iceberg::open_catalog(
        "local",
        &floe_iceberg::CatalogConfig::embedded(ws.path("catalog.db"), ws.path("warehouse")),
    )
    .await?;
    let mut run = Run {
        ws,
        model: Model {
            mode,
            columns: Vec::new(),
            committed: BTreeSet::new(),
            log: vec![Vec::new(); PARTITIONS as usize],
            foreign: Vec::new(),
            next_id: 0,
            next_column: 0,
        },
        rng: Rng(seed),
        p,
        p_config,
        f: None,
        f_config,
        catalog,
        step: 0,
    };
    run.produce(6).await?;
    run.check().await.context("after the first records")?;
    for step in 1..=steps {
        run.step = step;
        // Every run crashes at least once, half way.
        let roll = (step == steps.div_ceil(2)).then_some(CRASH_ROLL);
        let what = run
            .random_step(roll)
            .await
            .with_context(|| format!("step {step}"))?;
        run.check()
            .await
            .with_context(|| format!("after step {step} ({what})"))?;
    }
    if let Some(f) = run.f.take() {
        f.pipeline.stop().await??;
    }
    let Run { p, model, ws, .. } = run;
    p.pipeline.stop().await??;
    // Both independent readers agree with the model at the end.
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, "ns", "t", "_kafka_offset")?;
        compare(&model, &dump).with_context(|| format!("{reader} at the end"))?;
    }
    Ok(())
}

impl Run {
    async fn produce(&mut self, n: u64) -> Result<()> {
        for _ in 0..n {
            let rec = self.model.record(&mut self.rng);
            // A key always goes to one partition (as a keyed producer sends it): the
            // order of its versions is defined.
            let p = match &rec.key {
                Some(k) if self.model.mode != Mode::Append => {
                    k.trim_start_matches('k').parse::<i32>().unwrap_or(0) % PARTITIONS
                }
                _ => self.rng.below(PARTITIONS as u64) as i32,
            };
            let offset = self.model.log[p as usize].len() as i64;
            self.model.log[p as usize].push(rec.clone());
            self.p.pipeline.push(vec![message("t", p, offset, &rec)]);
        }
        Ok(())
    }

    fn logs(&self) -> Vec<&[Rec]> {
        self.model.log.iter().map(Vec::as_slice).collect()
    }

    /// One random step (`roll`: that step instead); returns what it did.
    async fn random_step(&mut self, roll: Option<u64>) -> Result<String> {
        let n = 2 + self.rng.below(8);
        let roll = roll.unwrap_or_else(|| self.rng.below(100));
        let what = match roll {
            0..=29 => {
                self.produce(n).await?;
                format!("{n} records")
            }
            30..=37 => {
                self.p.faults.fail_writes(1);
                self.produce(n).await?;
                format!("{n} records, a storage write fails")
            }
            38..=45 => {
                self.p.faults.lose_answers(1);
                self.produce(n).await?;
                format!("{n} records, a commit answer is lost")
            }
            46..=51 => {
                self.p.faults.fail_commits(1);
                self.produce(n).await?;
                format!("{n} records, a commit fails")
            }
            52..=61 => {
                self.foreign_records(n).await?;
                self.produce(n).await?;
                format!("{n} records from the other pipeline, {n} from ours")
            }
            62..=67 => {
                let c = self.foreign_column().await?;
                self.produce(n).await?;
                format!("another writer adds column {c}, {n} records")
            }
            68..=75 => {
                self.produce(n).await?;
                self.maintain(true).await?;
                format!("{n} records, compaction")
            }
            76..=83 => {
                self.produce(n).await?;
                self.maintain(false).await?;
                format!("{n} records, expiry")
            }
            84..=88 => {
                self.reassign_in_flight(n).await?;
                format!("partition assigned back with {n} records in flight")
            }
            CRASH_ROLL..=92 => {
                self.crash(n).await?;
                format!(
                    "{n} records, a commit refused for good: the pipeline stops without a clean close and starts again"
                )
            }
            _ => {
                self.restart().await?;
                self.produce(n).await?;
                format!("restart, {n} records")
            }
        };
        Ok(what)
    }

    async fn foreign_records(&mut self, n: u64) -> Result<()> {
        if self.f.is_none() {
            let f = Driven::start(&self.ws, &self.f_config, "f").await?;
            f.pipeline.assign("f", &[(0, None, vec![None])]);
            self.f = Some(f);
        }
        let f = self.f.as_ref().expect("foreign pipeline");
        for _ in 0..n {
            let offset = self.model.foreign.len() as i64;
            let id = match self.model.mode {
                Mode::Append => {
                    self.model.next_id += 1;
                    self.model.next_id
                }
                Mode::Upsert | Mode::UpsertV3 => self.rng.below(6) as i64,
            };
            let rec = Rec {
                key: Some(format!("f{id}")),
                value: Some(json!({"id": id, "fv": format!("f{offset}")})),
                bad: false,
            };
            self.model.foreign.push(rec.clone());
            f.pipeline.push(vec![message("f", 0, offset, &rec)]);
        }
        Ok(())
    }

    /// Another writer (not a pipeline) adds a long column; our records use it next.
    async fn foreign_column(&mut self) -> Result<String> {
        self.model.next_column += 1;
        let name = format!("g{}", self.model.next_column);
        let ident = iceberg::TableIdent::from_strs(["ns", "t"])?;
        let table = self.catalog.catalog.load_table(&ident).await?;
        let column = name.clone();
        floe_iceberg::commit_updates(
            self.catalog.catalog.as_ref(),
            self.catalog.committer.as_ref(),
            table,
            move |base| {
                let metadata = base.metadata();
                let current = metadata.current_schema();
                let mut fields: Vec<_> = current.as_struct().fields().to_vec();
                fields.push(Arc::new(NestedField::optional(
                    metadata.last_column_id() + 1,
                    column.clone(),
                    Type::Primitive(PrimitiveType::Long),
                )));
                let schema = Schema::builder()
                    .with_schema_id(current.schema_id() + 1)
                    .with_identifier_field_ids(current.identifier_field_ids())
                    .with_fields(fields)
                    .build()
                    .map_err(|e| floe_iceberg::CommitFailure::Iceberg {
                        table: base.identifier().to_string(),
                        source: Box::new(e),
                    })?;
                Ok(Some(vec![
                    iceberg::TableUpdate::AddSchema { schema },
                    iceberg::TableUpdate::SetCurrentSchema { schema_id: -1 },
                ]))
            },
        )
        .await?;
        self.model.columns.push((name.clone(), Col::Long));
        self.model.committed.insert(name.clone());
        Ok(name)
    }

    /// Compaction (applying deletes) or expiry of every snapshot but the newest.
    async fn maintain(&mut self, compact: bool) -> Result<()> {
        // Let the records reach the table first, so maintenance races the next commits.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let ident = iceberg::TableIdent::from_strs(["ns", "t"])?;
        let table = self.catalog.catalog.load_table(&ident).await?;
        let config = floe::maintain::MaintenanceConfig {
            keep_snapshots: 1,
            max_snapshot_age: Duration::ZERO,
            min_input_files: 2,
            ..Default::default()
        };
        let result = if compact {
            let target = floe::maintain::Target {
                ident,
                config,
                target_file_size: 64 << 20,
                prefix: "maintenance".into(),
            };
            floe::maintain::compact::compact(&self.catalog, table, &target, false).await
        } else {
            floe_iceberg::expire::expire(&self.catalog, table, &config.expire_options(), false)
                .await
                .map_err(floe::maintain::MaintainError::from)
        };
        // A maintenance run that lost a race is retried at its next interval; the
        // pipelines must be unaffected either way.
        if let Err(e) = result {
            eprintln!("maintenance: {e}");
        }
        Ok(())
    }

    /// A partition revoked and assigned back while a commit of it is held in flight;
    /// the assignment reads the table before that commit lands and the records are
    /// delivered again.
    async fn reassign_in_flight(&mut self, n: u64) -> Result<()> {
        self.p.faults.hold_commits(1);
        self.produce(n).await?;
        let held = self.p.faults.wait_holding(Duration::from_secs(10)).await;
        let partition = self.rng.below(PARTITIONS as u64) as i32;
        if held.is_ok() {
            let at = stored(self.catalog.catalog.as_ref(), "p")
                .await?
                .get(&partition)
                .copied();
            let tp = (Arc::from("t"), partition);
            self.p.pipeline.revoke(vec![tp]);
            self.p.pipeline.assign("t", &[(partition, at, vec![at])]);
            self.p.deliver(
                partition,
                at.unwrap_or(0),
                &self.model.log[partition as usize],
            );
            self.p.pipeline.drained(WAIT).await?;
        }
        self.p.faults.release();
        Ok(())
    }

    /// A commit is refused with an error no retry helps: the pipeline stops at once,
    /// keeping nothing at a clean close (the upsert index stays as its last spill left
    /// it, as after a SIGKILL). It starts again from the index directory and the table.
    async fn crash(&mut self, n: u64) -> Result<()> {
        self.p.faults.refuse_commits(1);
        self.produce(n).await?;
        let deadline = Instant::now() + WAIT;
        while !self.p.pipeline.is_finished() {
            ensure!(
                Instant::now() < deadline,
                "the refused commit did not stop the pipeline"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.p.faults.refuse_commits(0);
        let new = Driven::start(&self.ws, &self.p_config, "t").await?;
        let old = std::mem::replace(&mut self.p, new);
        ensure!(
            old.pipeline.stop().await?.is_err(),
            "the pipeline stopped without an error"
        );
        self.resume_from_table().await
    }

    /// Stops the pipeline (committing what it buffered) and starts it again from the
    /// table's offsets.
    async fn restart(&mut self) -> Result<()> {
        let old = std::mem::replace(
            &mut self.p,
            Driven::start(&self.ws, &self.p_config, "t").await?,
        );
        old.pipeline.stop().await??;
        self.resume_from_table().await
    }

    /// Assigns every partition to the (new) pipeline at the table's offsets and delivers
    /// the log from there, as a consumer joining the group would.
    async fn resume_from_table(&mut self) -> Result<()> {
        let at = stored(self.catalog.catalog.as_ref(), "p").await?;
        let assign: Vec<_> = (0..PARTITIONS)
            .map(|p| {
                let o = at.get(&p).copied();
                (p, o, vec![o])
            })
            .collect();
        self.p.pipeline.assign("t", &assign);
        for p in 0..PARTITIONS {
            let from = at.get(&p).copied().unwrap_or(0);
            self.p.deliver(p, from, &self.model.log[p as usize]);
        }
        Ok(())
    }

    /// Waits until both pipelines committed everything (serving their seeks), then
    /// compares the table and the dead letters with the model.
    async fn check(&mut self) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            let logs: Vec<Vec<Rec>> = self.model.log.clone();
            let refs: Vec<&[Rec]> = logs.iter().map(Vec::as_slice).collect();
            self.p.serve_seeks(&refs);
            let foreign = [self.model.foreign.as_slice()];
            if let Some(f) = &mut self.f {
                f.serve_seeks(&foreign);
            }
            // Committed up to the end, or up to records that are all dead letters (a
            // table without new rows records progress only every few intervals).
            let at = stored(self.catalog.catalog.as_ref(), "p").await?;
            let p_done = (0..PARTITIONS).all(|p| {
                let from = at.get(&p).copied().unwrap_or(0).max(0) as usize;
                self.model.log[p as usize]
                    .get(from..)
                    .is_some_and(|rest| rest.iter().all(|r| r.bad))
            });
            let f_done = self.model.foreign.is_empty()
                || stored(self.catalog.catalog.as_ref(), "f")
                    .await?
                    .values()
                    .sum::<i64>()
                    == self.model.foreign.len() as i64;
            // ... and the dead letters of what is not committed are in their file.
            let letters_done = || {
                let letters =
                    floe::dead_letter::DeadLetterWriter::read_all(&self.ws.path("p.ndjson"))
                        .unwrap_or_default();
                let dead: BTreeSet<(i32, i64)> =
                    letters.iter().map(|l| (l.partition, l.offset)).collect();
                dead == self.model.dead()
            };
            if p_done && f_done && letters_done() {
                break;
            }
            if p_done && f_done && Instant::now() + Duration::from_secs(75) > deadline {
                // Committed; the dead-letter check below says what differs.
                break;
            }
            if self.p.pipeline.is_finished() {
                bail!("the pipeline stopped");
            }
            if Instant::now() > deadline {
                bail!(
                    "not everything was committed in {WAIT:?}: stored {:?}, produced {:?}",
                    stored(self.catalog.catalog.as_ref(), "p").await?,
                    self.logs().iter().map(|l| l.len()).collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.model.settled();
        // iceberg-rust's reader is quickest, but cannot fill a list or struct column a
        // file lacks (an older schema): PyIceberg reads those tables.
        let dump = match floe_tests::reference::scan(self.catalog.catalog.as_ref(), "ns", "t").await
        {
            Ok(dump) => dump,
            Err(_) => self.ws.read("pyiceberg", "ns", "t", "_kafka_offset")?,
        };
        self.compare(&dump)?;
        let letters = floe::dead_letter::DeadLetterWriter::read_all(&self.ws.path("p.ndjson"))
            .unwrap_or_default();
        let dead: BTreeSet<(i32, i64)> = letters.iter().map(|l| (l.partition, l.offset)).collect();
        let expected = self.model.dead();
        if dead != expected {
            let reasons: Vec<String> = letters
                .iter()
                .filter(|l| !expected.contains(&(l.partition, l.offset)))
                .map(|l| {
                    let value = l
                        .value_base64
                        .as_deref()
                        .and_then(|v| {
                            use base64::Engine;
                            base64::engine::general_purpose::STANDARD.decode(v).ok()
                        })
                        .map(|v| String::from_utf8_lossy(&v).to_string());
                    format!("{}/{}: {} ({value:?})", l.partition, l.offset, l.reason)
                })
                .collect();
            let file = std::fs::read_to_string(self.ws.path("p.ndjson")).unwrap_or_default();
            bail!(
                "dead letters at {dead:?}, expected {expected:?}; unexpected: {reasons:?}; file has {} lines, {} bytes",
                file.lines().count(),
                file.len()
            );
        }
        Ok(())
    }

    fn compare(&self, dump: &TableDump) -> Result<()> {
        compare(&self.model, dump)
    }
}

/// Every column of every row of `dump` against the model.
fn compare(model: &Model, dump: &TableDump) -> Result<()> {
    let key = match model.mode {
        Mode::Append => "id",
        Mode::Upsert | Mode::UpsertV3 => "_kafka_key",
    };
    floe_tests::reference::assert_rows(
        "table",
        dump,
        &model.expected(),
        &[key],
        &["_op", "_kafka_timestamp"],
    )
}
