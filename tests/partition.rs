//! Partitioned tables end to end: a real broker, the agent creating tables with a
//! partition spec (day of a timestamp, bucket of a key, identity of `_kafka_partition`),
//! and independent readers. Checked: rows exact, every data file holds only rows of its
//! partition, delete files carry their data files' partition, and a reader's
//! partition-filtered scan plans only the matching files.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, TimestampMicrosecondType};
use floe_iceberg::manifests::{self, LiveFile};
use floe_tests::lake::{Lake, WAIT};
use floe_tests::{AgentProcess, Broker, spawn_agent};
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::spec::{DataContentType, Literal, PrimitiveLiteral, Struct};
use iceberg::table::Table;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};

const DAY_MICROS: i64 = 86_400_000_000;
/// 2024-01-01 in days since the epoch.
const JAN_1: i32 = 19_723;

fn readers(lake: &Lake) -> Vec<&'static str> {
    let mut r = vec!["pyiceberg", "duckdb"];
    if lake.rest.is_none() {
        r.push("spark");
    }
    r
}

fn ts(day: i64, second: i64) -> String {
    let t = chrono::DateTime::from_timestamp((JAN_1 as i64 + day) * 86_400 + second, 0)
        .expect("valid time");
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Live files of the table's current snapshot.
async fn live_files(table: &Table) -> Result<Vec<LiveFile>> {
    let snapshot = table
        .metadata()
        .current_snapshot()
        .context("table has no snapshot")?;
    Ok(manifests::live_files(table, snapshot).await?)
}

/// Checks that every row of every live data file computes to the file's partition;
/// returns the data files by partition.
async fn check_files_in_partitions(table: &Table) -> Result<BTreeMap<String, Vec<String>>> {
    let metadata = table.metadata();
    let schema = metadata.current_schema();
    let mut by_partition: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in live_files(table).await? {
        if f.content() != DataContentType::Data {
            continue;
        }
        let spec = metadata
            .partition_spec_by_id(f.manifest.partition_spec_id)
            .context("spec")?;
        let partition = f.entry.data_file().partition().clone();
        let calculator = PartitionValueCalculator::try_new(spec, schema)?;
        let bytes = table.file_io().new_input(f.path())?.read().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
        for batch in reader {
            let batch = batch?;
            let values = calculator.calculate(&batch)?;
            for (row, v) in arrow_struct_to_literal(&values, calculator.partition_type())?
                .into_iter()
                .enumerate()
            {
                ensure!(
                    v == Some(Literal::Struct(partition.clone())),
                    "row {row} of {} computes to partition {v:?}, the file says {partition:?}",
                    f.path()
                );
            }
            // The day and the Kafka partition checked by hand too.
            for (i, field) in spec.fields().iter().enumerate() {
                let name = schema.name_by_field_id(field.source_id).unwrap_or_default();
                let want = partition.fields()[i].clone();
                let column = batch.column_by_name(name);
                match (name, column) {
                    ("ts", Some(c)) => {
                        let c = c.as_primitive::<TimestampMicrosecondType>();
                        for v in c.iter().flatten() {
                            let day = v.div_euclid(DAY_MICROS) as i32;
                            ensure!(
                                want == Some(Literal::Primitive(PrimitiveLiteral::Int(day))),
                                "{}: ts day {day} in partition {want:?}",
                                f.path()
                            );
                        }
                    }
                    ("_kafka_partition", Some(c)) => {
                        for v in c.as_primitive::<Int32Type>().iter().flatten() {
                            ensure!(
                                want == Some(Literal::Primitive(PrimitiveLiteral::Int(v))),
                                "{}: Kafka partition {v} in partition {want:?}",
                                f.path()
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
        by_partition
            .entry(format!("{partition:?}"))
            .or_default()
            .push(f.path().to_string());
    }
    Ok(by_partition)
}

/// The day partition value of a live data file (first partition field).
fn day_of(partition: &Struct) -> Option<i32> {
    match partition.fields().first()? {
        Some(Literal::Primitive(PrimitiveLiteral::Int(d))) => Some(*d),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_append_table_on_the_embedded_catalog() -> Result<()> {
    partitioned_append(Lake::embedded()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_append_table_on_the_rest_catalog() -> Result<()> {
    partitioned_append(Lake::rest()?).await
}

/// Day of an event timestamp, bucket of the user, and the Kafka partition.
async fn partitioned_append(lake: Lake) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("events", 3).await?;
    let pipeline = lake
        .pipeline("events", &broker.bootstrap, "events", "events")
        .partition_by(&["day(ts)", "bucket(4, user)", "_kafka_partition"]);
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut messages = Vec::new();
    for n in 0..300i64 {
        let user = format!("u{}", n % 17);
        let v = json!({"n": n, "user": user, "ts": ts(n % 3, n), "amount": n * 7});
        messages.push((Some(user.into_bytes()), Some(v.to_string().into_bytes())));
        reference.insert(n, v);
    }
    broker.produce("events", &messages).await?;
    let agent = spawn_agent(&config)?;
    lake.wait_for_messages("events", "events", 300).await?;
    agent.stop().await?;

    for reader in readers(&lake) {
        let dump = lake.read(reader, "events", "n")?;
        let mut seen = HashSet::new();
        let mut rows = BTreeMap::new();
        for r in dump.rows() {
            let n = r["n"].as_i64().context("n")?;
            ensure!(
                seen.insert((r["_kafka_partition"].clone(), r["_kafka_offset"].clone())),
                "{reader}: a message appears twice"
            );
            rows.insert(
                n,
                json!({"n": n, "user": r["user"], "ts": r["ts"], "amount": r["amount"]}),
            );
        }
        let want: BTreeMap<i64, Value> = reference
            .iter()
            .map(|(n, v)| {
                let t = chrono::DateTime::parse_from_rfc3339(v["ts"].as_str().unwrap_or_default())
                    .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.6f+00:00").to_string())
                    .unwrap_or_default();
                (
                    *n,
                    json!({"n": n, "user": v["user"], "ts": t, "amount": v["amount"]}),
                )
            })
            .collect();
        ensure!(
            rows == want,
            "{reader} ({}): rows differ from what was produced",
            lake.kind()
        );
    }

    let table = lake.table("events").await?;
    let spec = table.metadata().default_partition_spec();
    let names: Vec<_> = spec.fields().iter().map(|f| f.name.clone()).collect();
    ensure!(
        names == ["ts_day", "user_bucket", "_kafka_partition"],
        "partition fields {names:?}"
    );
    let by_partition = check_files_in_partitions(&table).await?;
    ensure!(
        by_partition.len() > 9,
        "expected rows spread over many partitions, got {}",
        by_partition.len()
    );
    if lake.rest.is_none() {
        // A reader's scan filtered on the day plans exactly the files of that day.
        let (planned, all) = lake.plan_filter("events", "ts >= '2024-01-03T00:00:00+00:00'")?;
        let mut want = Vec::new();
        for f in live_files(&table).await? {
            if day_of(f.entry.data_file().partition()) == Some(JAN_1 + 2) {
                want.push(f.path().to_string());
            }
        }
        want.sort();
        ensure!(
            planned == want && planned.len() < all.len(),
            "filtered scan planned {planned:?}, the files of that day are {want:?} (of {} files)",
            all.len()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_upsert_table_on_the_embedded_catalog() -> Result<()> {
    partitioned_upsert(Lake::embedded()?, 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_upsert_table_on_the_rest_catalog() -> Result<()> {
    partitioned_upsert(Lake::rest()?, 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_v3_upsert_table_with_deletion_vectors() -> Result<()> {
    partitioned_upsert(Lake::embedded()?, 3).await
}

/// Upsert keyed by the message key, partitioned by day of `ts` and bucket of the key:
/// updates move rows between days, tombstones delete.
async fn partitioned_upsert(lake: Lake, format_version: u8) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("state", 2).await?;
    let pipeline = lake
        .pipeline("state", &broker.bootstrap, "state", "state")
        .upsert(&["_kafka_key"])
        .set("sink.format_version", i64::from(format_version))
        .partition_by(&["day(ts)", "bucket(4, _kafka_key)"]);
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    let mut reference: BTreeMap<String, Value> = BTreeMap::new();
    let mut produced = 0i64;
    let agent = spawn_agent(&config)?;
    for round in 0..3i64 {
        let mut messages = Vec::new();
        for id in 0..60i64 {
            let key = format!("k{id}");
            if round == 2 && id % 7 == 0 {
                messages.push((Some(key.clone().into_bytes()), None));
                reference.remove(&key);
                continue;
            }
            if round > 0 && id % 2 == 1 {
                continue;
            }
            // Round 1 moves even keys to the next day.
            let v = json!({"id": id, "round": round, "ts": ts(round.min(1) + id % 2, id)});
            messages.push((
                Some(key.clone().into_bytes()),
                Some(v.to_string().into_bytes()),
            ));
            reference.insert(key, v);
        }
        produced += messages.len() as i64;
        broker.produce("state", &messages).await?;
        lake.wait_for_messages("state", "state", produced).await?;
    }
    agent.stop().await?;

    for reader in readers(&lake) {
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
        let want: BTreeMap<String, Value> = reference
            .iter()
            .map(|(k, v)| (k.clone(), json!({"id": v["id"], "round": v["round"]})))
            .collect();
        ensure!(
            dump.rows().len() == want.len() && rows == want,
            "{reader} ({}, v{format_version}): {} rows, want {}: {rows:?}",
            lake.kind(),
            dump.rows().len(),
            want.len()
        );
    }

    let table = lake.table("state").await?;
    check_files_in_partitions(&table).await?;
    // Every delete file carries the partition of the data files it names.
    let live = live_files(&table).await?;
    let partition_of: BTreeMap<String, Struct> = live
        .iter()
        .filter(|f| f.content() == DataContentType::Data)
        .map(|f| {
            (
                f.path().to_string(),
                f.entry.data_file().partition().clone(),
            )
        })
        .collect();
    let mut delete_files = 0;
    for f in live.iter().filter(|f| f.content() != DataContentType::Data) {
        delete_files += 1;
        let file = f.entry.data_file();
        let named: Vec<String> = match file.referenced_data_file() {
            Some(p) if file.file_format() == iceberg::spec::DataFileFormat::Puffin => vec![p],
            _ => {
                let mut rows = Default::default();
                floe_iceberg::read_position_deletes(&table, f.path(), &mut rows).await?;
                rows.into_keys().collect()
            }
        };
        for p in named {
            if let Some(want) = partition_of.get(&p) {
                ensure!(
                    want == file.partition(),
                    "delete file {} has partition {:?}, its data file {p} {want:?}",
                    f.path(),
                    file.partition()
                );
            }
        }
    }
    ensure!(delete_files > 0, "no delete files: nothing was updated");
    Ok(())
}

/// A table whose partition spec Floe cannot compute (a transform it does not know) is
/// refused when the pipeline starts, with the reason; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_spec_floe_cannot_write_is_refused_at_start() -> Result<()> {
    let lake = Lake::embedded()?;
    let broker = Broker::start()?;
    broker.create_topic("events", 1).await?;
    let handle = lake.handle().await?;
    let ns = iceberg::NamespaceIdent::new("shop".into());
    handle
        .catalog
        .create_namespace(&ns, Default::default())
        .await?;
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![Arc::new(iceberg::spec::NestedField::optional(
            1,
            "user",
            iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String),
        ))])
        .build()?;
    let spec = iceberg::spec::UnboundPartitionSpec::builder()
        .add_partition_field(1, "user_zorder", iceberg::spec::Transform::Unknown)?
        .build();
    handle
        .catalog
        .create_table(
            &ns,
            iceberg::TableCreation::builder()
                .name("events".into())
                .schema(schema)
                .partition_spec(spec)
                .build(),
        )
        .await?;
    let pipeline = lake
        .pipeline("events", &broker.bootstrap, "events", "events")
        .set("sink.create_table", false);
    let config = lake.write("floe.toml", &lake.config().pipeline(pipeline))?;
    broker
        .produce("events", &[(None, Some(br#"{"user": "a"}"#.to_vec()))])
        .await?;
    let agent = AgentProcess::start(&config, &[])?;
    let (status, log) = agent.wait_exit(WAIT)?;
    ensure!(
        !status.success(),
        "floe ran on a table it cannot write:\n{log}"
    );
    ensure!(
        log.contains("partition spec cannot be written by Floe") && log.contains("user_zorder"),
        "the error does not say why:\n{log}"
    );
    let table = lake.table("events").await?;
    ensure!(
        table.metadata().current_snapshot().is_none(),
        "a snapshot was committed"
    );
    Ok(())
}
