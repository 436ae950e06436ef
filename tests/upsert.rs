//! Upsert mode end to end: a real broker, the agent, position deletes, and independent
//! readers (PyIceberg and DuckDB) compared with a reference computed from what was produced.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Result, ensure};
use floe_tests::lake::{Lake, WAIT};
use floe_tests::{AgentProcess, Broker, Pipeline, spawn_agent};
use serde_json::{Value, json};

const READERS: [&str; 2] = ["pyiceberg", "duckdb"];

/// An upsert pipeline reading topic `name` into `table` of the lake, keyed by `key`.
fn upsert(lake: &Lake, bootstrap: &str, name: &str, table: &str, key: &str) -> Pipeline {
    lake.pipeline(name, bootstrap, name, table).upsert(&[key])
}

/// Payload columns of every row a reader returns, keyed by `id`, plus each row's `_op`.
fn rows_by_id(
    lake: &Lake,
    reader: &str,
    table: &str,
    fields: &[&str],
) -> Result<(BTreeMap<i64, Value>, BTreeMap<i64, String>)> {
    let dump = lake.read(reader, table, "id")?;
    let mut rows = BTreeMap::new();
    let mut ops = BTreeMap::new();
    for r in dump.rows() {
        let id = r["id"].as_i64().expect("id");
        let payload: serde_json::Map<String, Value> = fields
            .iter()
            .map(|f| (f.to_string(), r[*f].clone()))
            .collect();
        ensure!(
            rows.insert(id, Value::Object(payload)).is_none(),
            "{reader}: id {id} appears twice in {table}"
        );
        ops.insert(id, r["_op"].as_str().unwrap_or_default().to_string());
    }
    Ok((rows, ops))
}

fn project(v: &Value, fields: &[&str]) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|f| (f.to_string(), v[*f].clone()))
            .collect(),
    )
}

fn customer(id: i64, version: i64) -> Value {
    let city = ["Oslo", "Lyon", "Porto"][(id % 3) as usize];
    // Nested fields get ids above the top-level ones: `_op` must not collide with them.
    json!({"id": id, "name": format!("customer {id}"), "city": city, "balance": id * 10 + version, "tags": [city], "address": {"city": city}})
}

fn order(id: i64, version: i64) -> Value {
    let status = ["new", "paid", "shipped", "done"][version as usize % 4];
    json!({"id": id, "customer": id % 40, "status": status, "amount": id * 3 + version})
}

type Message = (Option<Vec<u8>>, Option<Vec<u8>>);

fn msg(key: String, value: Option<&Value>) -> Message {
    (
        Some(key.into_bytes()),
        value.map(|v| v.to_string().into_bytes()),
    )
}

/// The OLake-style walk-through: first sync, then new keys, updates and tombstones, then
/// a restart (the index is rebuilt from the table) and more updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_and_orders_keep_one_row_per_key() -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("customers", 2).await?;
    broker.create_topic("orders", 3).await?;
    let lake = Lake::embedded()?;
    let bootstrap = &broker.bootstrap;
    let config = lake.write(
        "floe.toml",
        &lake
            .config()
            // Keyed by the message key: tombstones delete.
            .pipeline(upsert(
                &lake,
                bootstrap,
                "customers",
                "customers",
                "_kafka_key",
            ))
            // Keyed by a payload field: a tombstone is an error routed to the dead letters.
            .pipeline(upsert(&lake, bootstrap, "orders", "orders", "id")),
    )?;
    let mut customers: BTreeMap<i64, Value> = BTreeMap::new();
    let mut orders: BTreeMap<i64, Value> = BTreeMap::new();
    let mut produced = (0i64, 0i64);

    // First sync.
    let mut c_msgs = Vec::new();
    for id in 0..50 {
        let v = customer(id, 0);
        c_msgs.push(msg(id.to_string(), Some(&v)));
        customers.insert(id, v);
    }
    let mut o_msgs = Vec::new();
    for id in 0..100 {
        let v = order(id, 0);
        o_msgs.push(msg(format!("o{id}"), Some(&v)));
        orders.insert(id, v);
    }
    broker.produce("customers", &c_msgs).await?;
    broker.produce("orders", &o_msgs).await?;
    produced.0 += c_msgs.len() as i64;
    produced.1 += o_msgs.len() as i64;
    let agent = spawn_agent(&config)?;
    lake.wait_for_messages("customers", "customers", produced.0)
        .await?;
    lake.wait_for_messages("orders", "orders", produced.1)
        .await?;

    // Second batch: new keys, changed values (some several times in one batch), deletes.
    let mut c_msgs = Vec::new();
    for id in 50..60 {
        let v = customer(id, 0);
        c_msgs.push(msg(id.to_string(), Some(&v)));
        customers.insert(id, v);
    }
    for round in 1..=3 {
        for id in 0..20 {
            let v = customer(id, round);
            c_msgs.push(msg(id.to_string(), Some(&v)));
            customers.insert(id, v);
        }
    }
    for id in 40..45 {
        c_msgs.push(msg(id.to_string(), None));
        customers.remove(&id);
    }
    // Deleted and then re-created within the batch: one live row.
    c_msgs.push(msg("7".into(), None));
    let v = customer(7, 9);
    c_msgs.push(msg("7".into(), Some(&v)));
    customers.insert(7, v);
    let mut o_msgs = Vec::new();
    for id in (0..30).chain(100..120) {
        let v = order(id, 1 + id % 3);
        o_msgs.push(msg(format!("o{id}"), Some(&v)));
        orders.insert(id, v);
    }
    o_msgs.push(msg("o5".into(), None)); // tombstone on a payload-keyed table
    broker.produce("customers", &c_msgs).await?;
    broker.produce("orders", &o_msgs).await?;
    produced.0 += c_msgs.len() as i64;
    produced.1 += o_msgs.len() as i64;
    lake.wait_for_messages("customers", "customers", produced.0)
        .await?;
    lake.wait_for_messages("orders", "orders", produced.1)
        .await?;
    agent.stop().await?;

    // The tombstone on `orders` is in the dead-letter file with its reason.
    let dl = std::fs::read_to_string(lake.ws.path("dead-letter-orders.ndjson"))?;
    ensure!(
        dl.lines().count() == 1 && dl.contains("tombstone"),
        "orders dead letters: {dl}"
    );

    // Restart: the index comes back from the table; update keys from both batches.
    let agent = spawn_agent(&config)?;
    let mut c_msgs = Vec::new();
    for id in [0, 19, 25, 55] {
        let v = customer(id, 100);
        c_msgs.push(msg(id.to_string(), Some(&v)));
        customers.insert(id, v);
    }
    c_msgs.push(msg("56".into(), None));
    customers.remove(&56);
    broker.produce("customers", &c_msgs).await?;
    produced.0 += c_msgs.len() as i64;
    lake.wait_for_messages("customers", "customers", produced.0)
        .await?;
    agent.stop().await?;

    let c_fields = ["id", "name", "city", "balance"];
    let o_fields = ["id", "customer", "status", "amount"];
    for reader in READERS {
        let (rows, ops) = rows_by_id(&lake, reader, "customers", &c_fields)?;
        let expected: BTreeMap<i64, Value> = customers
            .iter()
            .map(|(k, v)| (*k, project(v, &c_fields)))
            .collect();
        ensure!(
            rows == expected,
            "{reader}: customers differ from the reference\n got {rows:?}\nwant {expected:?}"
        );
        let sum: i64 = rows
            .values()
            .map(|r| r["balance"].as_i64().unwrap_or_default())
            .sum();
        let want: i64 = customers
            .values()
            .map(|r| r["balance"].as_i64().unwrap_or_default())
            .sum();
        ensure!(sum == want, "{reader}: sum(balance) {sum} != {want}");
        ensure!(
            ops[&0] == "update" && ops[&55] == "update" && ops[&25] == "update",
            "{reader}: _op of updated rows: {ops:?}"
        );
        ensure!(
            ops[&57] == "insert",
            "{reader}: _op of a row written once: {:?}",
            ops[&57]
        );

        let (rows, _) = rows_by_id(&lake, reader, "orders", &o_fields)?;
        let expected: BTreeMap<i64, Value> = orders
            .iter()
            .map(|(k, v)| (*k, project(v, &o_fields)))
            .collect();
        ensure!(
            rows == expected,
            "{reader}: orders differ from the reference"
        );
        let paid = rows.values().filter(|r| r["status"] == "paid").count();
        let want = orders.values().filter(|r| r["status"] == "paid").count();
        ensure!(paid == want, "{reader}: paid orders {paid} != {want}");
    }
    Ok(())
}

/// xorshift64*: a small deterministic generator (no extra crate).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// 100,000 messages over 1,000 keys with updates and deletes, across many commits and a
/// restart, against the reference "last message per key": on the embedded catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomised_updates_and_deletes_match_the_reference() -> Result<()> {
    randomised(Lake::embedded()?, 2).await
}

/// The same on a format-v3 table: deletion vectors (Puffin) instead of position-delete
/// files, merged per data file; read by PyIceberg, DuckDB and Spark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomised_updates_and_deletes_on_a_v3_table_with_deletion_vectors() -> Result<()> {
    randomised(Lake::embedded()?, 3).await
}

/// The same on the REST catalog (rustberg) over S3 (moto), with vended credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomised_updates_and_deletes_match_the_reference_on_rest_and_s3() -> Result<()> {
    randomised(Lake::rest()?, 2).await
}

async fn randomised(lake: Lake, format_version: u8) -> Result<()> {
    const N: usize = 100_000;
    const KEYS: u64 = 1_000;
    let broker = Broker::start()?;
    broker.create_topic("state", 4).await?;
    let config = lake.write(
        "floe.toml",
        &lake.config().pipeline(
            upsert(&lake, &broker.bootstrap, "state", "state", "_kafka_key")
                .set("sink.row_group_bytes", "64KiB")
                .set("sink.max_uncommitted_bytes", "256KiB")
                .set("sink.format_version", format_version),
        ),
    )?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut messages = Vec::with_capacity(N);
    for seq in 0..N {
        let id = (rng.next() % KEYS) as i64;
        if rng.next().is_multiple_of(10) {
            messages.push(msg(id.to_string(), None));
            reference.remove(&id);
        } else {
            let v = json!({"id": id, "seq": seq, "flag": rng.next().is_multiple_of(2), "score": (rng.next() % 10_000) as f64 / 100.0});
            messages.push(msg(id.to_string(), Some(&v)));
            reference.insert(id, v);
        }
    }
    let started = Instant::now();
    let (first, second) = messages.split_at(N / 2);
    broker.produce("state", first).await?;
    let agent = spawn_agent(&config)?;
    lake.wait_for_messages("state", "state", first.len() as i64)
        .await?;
    agent.stop().await?;
    broker.produce("state", second).await?;
    let agent = spawn_agent(&config)?;
    lake.wait_for_messages("state", "state", N as i64).await?;
    agent.stop().await?;
    let ingest = started.elapsed();

    let fields = ["id", "seq", "flag", "score"];
    let expected: BTreeMap<i64, Value> = reference
        .iter()
        .map(|(k, v)| (*k, project(v, &fields)))
        .collect();
    let mut report = Vec::new();
    // Spark reads local warehouses only.
    let spark = lake.rest.is_none().then_some("spark");
    for reader in READERS.into_iter().chain(spark) {
        let t = Instant::now();
        let (rows, _) = rows_by_id(&lake, reader, "state", &fields)?;
        report.push(format!(
            "{reader} read {} rows in {:?}",
            rows.len(),
            t.elapsed()
        ));
        ensure!(
            rows.len() == expected.len(),
            "{reader}: {} rows, reference has {}",
            rows.len(),
            expected.len()
        );
        ensure!(rows == expected, "{reader}: rows differ from the reference");
    }
    // Files per commit, from the snapshot summaries, in commit order. (Each commit holds
    // about one partition's worth of messages, i.e. about 250 of the keys.)
    let table = lake.table("state").await?;
    let live = floe_iceberg::manifests::live_files(
        &table,
        table.metadata().current_snapshot().expect("snapshot"),
    )
    .await?;
    let deletes: Vec<_> = live
        .iter()
        .filter(|f| f.content() != iceberg::spec::DataContentType::Data)
        .collect();
    ensure!(
        !deletes.is_empty(),
        "no delete files: the test did not update"
    );
    if format_version == 3 {
        ensure!(
            table.metadata().format_version() == iceberg::spec::FormatVersion::V3,
            "the table is not v3"
        );
        let mut targets = std::collections::HashSet::new();
        for d in &deletes {
            let f = d.entry.data_file();
            ensure!(
                f.file_format() == iceberg::spec::DataFileFormat::Puffin
                    && f.content_offset().is_some(),
                "{} is not a deletion vector",
                f.file_path()
            );
            let target = f
                .referenced_data_file()
                .expect("deletion vector names its file");
            ensure!(
                targets.insert(target.clone()),
                "two live deletion vectors for {target}"
            );
        }
    }
    let mut per_commit = Vec::new();
    let mut snapshots: Vec<_> = table.metadata().snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    for s in snapshots {
        let p = &s.summary().additional_properties;
        let get = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        per_commit.push((
            get("added-data-files"),
            get("added-delete-files"),
            get("added-records"),
            get("added-position-deletes"),
        ));
    }
    let commits = per_commit.iter().filter(|c| c.0 + c.1 > 0).count();
    ensure!(commits >= 10, "expected many commits, got {commits}");
    println!(
        "randomised upsert ({}, v{format_version}): {N} messages, {} live keys, ingest {ingest:?}, {} snapshots ({commits} with files), (data files, delete files, rows, position deletes) per snapshot: {per_commit:?}; {}",
        if lake.rest.is_some() {
            "REST + S3"
        } else {
            "embedded"
        },
        expected.len(),
        per_commit.len(),
        report.join("; ")
    );
    Ok(())
}

/// Another writer commits to the same table between our write and our commit: our
/// commit is rebased, its position deletes recomputed, and nothing is lost or duplicated.
/// Embedded catalog: the conflict is the SQLite compare-and-swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_writer_between_write_and_commit_loses_nothing() -> Result<()> {
    concurrent_writer(Lake::embedded()?).await
}

/// The same on the REST catalog: the conflict is the catalog's real HTTP 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_writer_on_the_rest_catalog_gets_a_409_and_loses_nothing() -> Result<()> {
    concurrent_writer(Lake::rest()?).await
}

async fn concurrent_writer(lake: Lake) -> Result<()> {
    let broker = Broker::start()?;
    broker.create_topic("a", 1).await?;
    broker.create_topic("b", 1).await?;
    let a = lake.write(
        "a.toml",
        &lake
            .config()
            .pipeline(upsert(&lake, &broker.bootstrap, "a", "kv", "id")),
    )?;
    let b = lake.write(
        "b.toml",
        &lake
            .config()
            .pipeline(upsert(&lake, &broker.bootstrap, "b", "kv", "id")),
    )?;
    let a_msgs: Vec<_> = (0..100)
        .map(|id| msg(format!("{id}"), Some(&json!({"id": id, "v": "a"}))))
        .collect();
    let b_msgs: Vec<_> = (50..150)
        .map(|id| msg(format!("{id}"), Some(&json!({"id": id, "v": "b"}))))
        .collect();
    broker.produce("a", &a_msgs).await?;
    broker.produce("b", &b_msgs).await?;

    // Writer A stops right after writing its data files, before committing them.
    let resume = lake.ws.path("resume-a");
    let mut agent_a = AgentProcess::start_at_failpoint(
        &a,
        floe::failpoint::AFTER_WRITE,
        &[(
            "FLOE_FAILPOINT_RESUME",
            resume.to_str().expect("utf-8 path"),
        )],
    )?;
    agent_a.wait_for_failpoint(WAIT)?;
    // Writer B commits keys 50..149 meanwhile.
    let agent_b = AgentProcess::start(&b, &[])?;
    lake.wait_for_messages("kv", "b", 100).await?;
    agent_b.terminate()?;
    // A goes on: its commit conflicts, it rebuilds its index and deletes B's rows it replaces.
    std::fs::write(&resume, b"")?;
    lake.wait_for_messages("kv", "a", 100).await?;
    let log = agent_a.terminate()?;
    ensure!(
        (log.contains("commit did not land") || log.contains("another writer committed first"))
            && log.contains("updating the upsert index"),
        "A's commit did not conflict and rebase its deletes:\n{log}"
    );
    if lake.rest.is_some() {
        ensure!(
            log.contains("HTTP 409"),
            "no 409 from the REST catalog:\n{log}"
        );
    }

    let mut expected = BTreeMap::new();
    for id in 0..150 {
        expected.insert(id, json!({"id": id, "v": if id < 100 { "a" } else { "b" }}));
    }
    for reader in READERS {
        let (rows, _) = rows_by_id(&lake, reader, "kv", &["id", "v"])?;
        ensure!(
            rows == expected,
            "{reader}: kv differs from the reference:\n got {rows:?}"
        );
    }
    Ok(())
}

/// The key index is kept on disk (`index_dir`) with a memory budget far below the keys:
/// a restart opens it and catches up with what it missed (the commits after its last
/// spill when the agent was killed, a compaction that rewrote the files) instead of
/// reading every key again, and every value stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_key_index_is_opened_and_caught_up_after_kills_and_compaction() -> Result<()> {
    const KEYS: u64 = 3_000;
    let broker = Broker::start()?;
    broker.create_topic("state", 2).await?;
    let lake = Lake::embedded()?;
    let index_dir = lake.ws.path("index");
    let config = lake.write(
        "floe.toml",
        &lake.config().pipeline(
            upsert(&lake, &broker.bootstrap, "state", "state", "_kafka_key")
                .set("sink.index_memory", "64KiB")
                .set("sink.index_dir", index_dir.display().to_string())
                .maintenance("interval", "1h")
                .maintenance("min_input_files", 2),
        ),
    )?;
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut produced = 0i64;
    let round = |rng: &mut Rng, n: usize, reference: &mut BTreeMap<i64, Value>| {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = (rng.next() % KEYS) as i64;
            if rng.next().is_multiple_of(8) {
                out.push(msg(id.to_string(), None));
                reference.remove(&id);
            } else {
                let v = json!({"id": id, "n": rng.next() % 1_000_000, "s": format!("v{}", rng.next() % 97)});
                out.push(msg(id.to_string(), Some(&v)));
                reference.insert(id, v);
            }
        }
        out
    };

    // A first run creates the table and keeps its index at its clean stop.
    let batch = round(&mut rng, 6_000, &mut reference);
    broker.produce("state", &batch).await?;
    produced += batch.len() as i64;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("state", "state", produced).await?;
    agent.terminate()?;

    // Opened from disk; killed after more commits, so what it kept lags the table.
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("upsert index opened from disk", WAIT)?;
    for _ in 0..3 {
        let batch = round(&mut rng, 2_000, &mut reference);
        broker.produce("state", &batch).await?;
        produced += batch.len() as i64;
        lake.wait_for_messages("state", "state", produced).await?;
    }
    agent.kill9()?;

    // Opened from disk again, catching up with the commits made after its last spill.
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("upsert index opened from disk", WAIT)?;
    let batch = round(&mut rng, 3_000, &mut reference);
    broker.produce("state", &batch).await?;
    produced += batch.len() as i64;
    lake.wait_for_messages("state", "state", produced).await?;
    let log = agent.terminate()?;
    ensure!(!log.contains("rebuilt from the table"), "{log}");

    // A compaction rewrites the data files and drops the delete files.
    let out = std::process::Command::new(floe_tests::floe_bin())
        .args(["maintain", "--config"])
        .arg(&config)
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "floe maintain failed:\n{text}");

    // Another engine deletes rows by rewriting the files that hold them.
    lake.foreign("state", &["--delete-where", "id < 300"])?;
    reference.retain(|id, _| *id >= 300);

    // The index learns the rewrites from the files they changed, not by a rebuild; then
    // every key is written once more: an update where a row is live (found in the
    // compacted files), an insert where the other engine deleted it.
    let live_before: std::collections::BTreeSet<i64> = reference.keys().copied().collect();
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("upsert index opened from disk", WAIT)?;
    let mut batch = Vec::new();
    for id in 0..KEYS as i64 {
        let v = json!({"id": id, "n": id, "s": "last"});
        batch.push(msg(id.to_string(), Some(&v)));
        reference.insert(id, v);
    }
    broker.produce("state", &batch).await?;
    produced += batch.len() as i64;
    lake.wait_for_messages("state", "state", produced).await?;
    let log = agent.terminate()?;
    ensure!(
        !log.contains("rebuilt from the table"),
        "the compaction made the index rebuild:\n{log}"
    );
    for line in log.lines().filter(|l| l.contains("upsert index")) {
        println!("{line}");
    }
    let runs = std::fs::read_dir(index_dir.join("state"))?
        .flat_map(|t| std::fs::read_dir(t.expect("entry").path()).expect("table dir"))
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".keys"))
        })
        .count();
    ensure!(runs > 0, "the index never spilled to disk");
    // The kept index names only live data files: the compacted and rewritten ones are
    // forgotten (it would otherwise grow with every file the table ever had).
    let kept = kept_index_files(&index_dir.join("state"))?;
    let live = live_data_files(&lake, "state").await?;
    ensure!(
        kept.is_subset(&live),
        "the kept index still names {} files no longer in the table",
        kept.difference(&live).count()
    );

    let fields = ["id", "n", "s"];
    let expected: BTreeMap<i64, Value> = reference
        .iter()
        .map(|(k, v)| (*k, project(v, &fields)))
        .collect();
    for reader in READERS {
        let (rows, ops) = rows_by_id(&lake, reader, "state", &fields)?;
        ensure!(
            rows == expected,
            "{reader}: {} rows differ from the reference ({} rows)",
            rows.len(),
            expected.len()
        );
        for (id, op) in &ops {
            let want = if live_before.contains(id) {
                "update"
            } else {
                "insert"
            };
            ensure!(op == want, "{reader}: _op of key {id} is {op}, want {want}");
        }
    }
    Ok(())
}

/// The data files the kept key index under `pipeline_dir` names (its `MANIFEST`: JSON,
/// then a checksum line).
fn kept_index_files(pipeline_dir: &std::path::Path) -> Result<std::collections::BTreeSet<String>> {
    let table = std::fs::read_dir(pipeline_dir)?
        .next()
        .expect("one table")?;
    let text = std::fs::read_to_string(table.path().join("MANIFEST"))?;
    let (json, _) = text.trim_end().rsplit_once('\n').expect("a checksum line");
    let manifest: Value = serde_json::from_str(json)?;
    Ok(manifest["files"]
        .as_object()
        .expect("files")
        .values()
        .map(|p| p.as_str().expect("path").to_string())
        .collect())
}

/// The paths of the live data files of `table`.
async fn live_data_files(lake: &Lake, table: &str) -> Result<std::collections::BTreeSet<String>> {
    use futures::TryStreamExt;
    let table = lake.table(table).await?;
    let tasks: Vec<_> = table
        .scan()
        .build()?
        .plan_files()
        .await?
        .try_collect()
        .await?;
    Ok(tasks.into_iter().map(|t| t.data_file_path).collect())
}

/// Crash safety of the kept key index (`docs/reliability.md`, "Invariants"): the agent
/// is SIGKILLed at each step that writes the index (a run's entries durable before its
/// sidecar, the manifest about to be written, a merge about to be installed or just
/// installed between two spills, a rebuild half done), after commits, and in a
/// compaction between its writes and its commit, with an index small enough that
/// spills and merges happen between commits. After each kill it restarts and reads on; at the end every
/// value of every row must match the reference through both readers: a key the index
/// lost would keep two live rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_key_index_survives_a_sigkill_at_every_index_write() -> Result<()> {
    use floe::failpoint::{
        AFTER_COMMIT, INDEX_BEFORE_MANIFEST, INDEX_MERGE_INSTALL, INDEX_MERGE_INSTALLED,
        INDEX_REBUILDING, INDEX_RUN_WRITTEN,
    };
    const KEYS: u64 = 5_000;
    let broker = Broker::start()?;
    broker.create_topic("kept", 2).await?;
    let lake = Lake::embedded()?;
    let index_dir = lake.ws.path("index");
    let config = lake.write(
        "floe.toml",
        &lake.config().pipeline(
            upsert(&lake, &broker.bootstrap, "kept", "kept", "_kafka_key")
                // About 3,300 entries in memory: spills and merges every few commits.
                .set("sink.index_memory", "256KiB")
                .set("sink.index_dir", index_dir.display().to_string())
                .commit_interval("1s")
                // Compaction only when the test runs `floe maintain`.
                .maintenance("interval", "1h")
                .maintenance("min_input_files", 2),
        ),
    )?;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut produced = 0i64;
    let mut next_id = 0u64;
    // Keys updated round-robin, as a producer of state would; one in twelve deleted.
    let mut round = |n: usize, reference: &mut BTreeMap<i64, Value>| {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = (next_id % KEYS) as i64;
            next_id += 1;
            if rng.next().is_multiple_of(12) {
                out.push(msg(id.to_string(), None));
                reference.remove(&id);
            } else {
                let v = json!({"id": id, "n": rng.next() % 1_000_000, "s": format!("v{}", rng.next() % 97)});
                out.push(msg(id.to_string(), Some(&v)));
                reference.insert(id, v);
            }
        }
        out
    };

    // The table and a first kept index.
    let batch = round(8_000, &mut reference);
    broker.produce("kept", &batch).await?;
    produced += batch.len() as i64;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("kept", "kept", produced).await?;
    agent.terminate()?;

    let table_dir = || -> Result<std::path::PathBuf> {
        let tables = std::fs::read_dir(index_dir.join("kept"))?;
        Ok(tables.last().expect("one table")?.path())
    };
    let steps: [(&str, &str); 8] = [
        (INDEX_RUN_WRITTEN, "0"),
        (INDEX_BEFORE_MANIFEST, "1"),
        (INDEX_MERGE_INSTALL, "0"),
        // The manifest rewritten for a merge while newer keys are in memory only.
        (INDEX_MERGE_INSTALLED, "0"),
        (AFTER_COMMIT, "3"),
        // A rebuild (the kept index removed first) killed after its first spill.
        (INDEX_REBUILDING, "0"),
        (INDEX_MERGE_INSTALLED, "1"),
        (INDEX_BEFORE_MANIFEST, "3"),
    ];
    for (point, skip) in steps {
        if point == INDEX_REBUILDING {
            for entry in std::fs::read_dir(table_dir()?)? {
                let entry = entry?;
                if entry.file_name() != "LOCK" {
                    std::fs::remove_file(entry.path())?;
                }
            }
        }
        // Rounds until the agent reaches the point: commits of fewer keys than the
        // memory table holds, so that spills come every few commits and merges are
        // installed between them.
        let mut agent =
            AgentProcess::start_at_failpoint(&config, point, &[("FLOE_FAILPOINT_SKIP", skip)])?;
        let mut reached = false;
        for _ in 0..16 {
            let batch = round(1_000, &mut reference);
            broker.produce("kept", &batch).await?;
            produced += batch.len() as i64;
            if agent
                .wait_for_failpoint(std::time::Duration::from_secs(6))
                .is_ok()
            {
                reached = true;
                break;
            }
        }
        ensure!(reached, "never reached {point}:\n{}", agent.output());
        agent.kill9()?;
        let mut agent = AgentProcess::start(&config, &[])?;
        if point == INDEX_REBUILDING {
            agent.wait_for_line("upsert index rebuilt from the table", WAIT)?;
        }
        lake.wait_for_messages("kept", "kept", produced).await?;
        // Killed again once all is committed: no clean close keeps the index.
        agent.kill9()?;
    }
    // A compaction killed after writing its files, before its commit (they stay
    // unreferenced), then one that lands: the index learns the rewrite at its next start.
    let config_arg = config.to_str().expect("utf-8 path");
    let mut compaction = AgentProcess::command(
        &["maintain", "--config", config_arg],
        &[("FLOE_FAILPOINT", floe::failpoint::COMPACT_BEFORE_COMMIT)],
    )?;
    compaction.wait_for_line("FLOE_FAILPOINT compact_before_commit reached", WAIT)?;
    compaction.kill9()?;
    let out = std::process::Command::new(floe_tests::floe_bin())
        .args(["maintain", "--config", config_arg])
        .output()?;
    ensure!(
        out.status.success(),
        "floe maintain failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Everything written once more, so every key's delete is computed from the index.
    let batch = round(KEYS as usize, &mut reference);
    broker.produce("kept", &batch).await?;
    produced += batch.len() as i64;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("kept", "kept", produced).await?;
    let log = agent.terminate()?;
    for line in log.lines().filter(|l| l.contains("upsert index")) {
        println!("{line}");
    }
    matches_reference(&lake, "kept", &reference)
}

/// Both readers return one row per key of `reference`, with its `id`, `n` and `s`
/// (a key with two live rows fails in [`rows_by_id`]).
fn matches_reference(lake: &Lake, table: &str, reference: &BTreeMap<i64, Value>) -> Result<()> {
    let fields = ["id", "n", "s"];
    let expected: BTreeMap<i64, Value> = reference
        .iter()
        .map(|(k, v)| (*k, project(v, &fields)))
        .collect();
    for reader in READERS {
        let (rows, _) = rows_by_id(lake, reader, table, &fields)?;
        let wrong = expected
            .iter()
            .filter(|(k, v)| rows.get(k) != Some(v))
            .count();
        ensure!(
            rows == expected,
            "{reader}: {} rows, {} expected, {wrong} keys wrong or missing",
            rows.len(),
            expected.len()
        );
    }
    Ok(())
}

/// The reported scenario: an upsert table whose key index spills to disk (256 KiB,
/// 8,000 keys updated round-robin by a producer that keeps going), the agent SIGKILLed
/// at random moments (start-up, reading, writing, committing, spilling, merging) and
/// started again, maintenance on. At the end no key may hold two live rows and every
/// value must match the last message of its key, through both readers. 4 kills in CI,
/// 12 in the full run (`FLOE_FAULTS_FULL=1`, `scripts/faults.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_index_stays_exact_through_random_kills() -> Result<()> {
    const KEYS: u64 = 8_000;
    const BATCH: usize = 400;
    let full = std::env::var_os("FLOE_FAULTS_FULL").is_some_and(|v| v == "1");
    let kills: u64 = if full { 12 } else { 4 };
    let broker = Broker::start()?;
    broker.create_topic("churn", 2).await?;
    let lake = Lake::embedded()?;
    let config = lake.write(
        "floe.toml",
        &lake.config().pipeline(
            upsert(&lake, &broker.bootstrap, "churn", "churn", "_kafka_key")
                .set("sink.index_memory", "256KiB")
                .set(
                    "sink.index_dir",
                    lake.ws.path("index").display().to_string(),
                )
                .commit_interval("1s")
                .maintenance("interval", "5s")
                .maintenance("min_input_files", 4),
        ),
    )?;
    // Every message up front, so the reference is the last message per key.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ kills);
    let mut reference: BTreeMap<i64, Value> = BTreeMap::new();
    let mut batches = Vec::new();
    let total = kills as usize * 8 * BATCH;
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..total {
        let id = (i as u64 % KEYS) as i64;
        if rng.next().is_multiple_of(16) {
            batch.push(msg(id.to_string(), None));
            reference.remove(&id);
        } else {
            let v = json!({"id": id, "n": rng.next() % 1_000_000, "s": format!("v{}", rng.next() % 97)});
            batch.push(msg(id.to_string(), Some(&v)));
            reference.insert(id, v);
        }
        if batch.len() == BATCH {
            batches.push(std::mem::take(&mut batch));
        }
    }
    let bootstrap = broker.bootstrap.clone();
    let producer = tokio::spawn(async move {
        for b in batches {
            floe_tests::produce_to(&bootstrap, "churn", &b).await?;
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        anyhow::Ok(())
    });
    let mut moments = Vec::new();
    for _ in 0..kills {
        let agent = AgentProcess::start(&config, &[])?;
        let ms = 800 + rng.next() % 4_000;
        moments.push(ms);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        agent.kill9()?;
    }
    producer.await??;
    let agent = AgentProcess::start(&config, &[])?;
    lake.wait_for_messages("churn", "churn", total as i64)
        .await?;
    let log = agent.terminate()?;
    println!("killed after (ms): {moments:?}");
    for line in log.lines().filter(|l| l.contains("upsert index")) {
        println!("{line}");
    }
    matches_reference(&lake, "churn", &reference)
}
