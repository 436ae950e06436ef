//! The plugin sandbox under `floe run`: a real broker, the `floe` binary, plugins built
//! to `wasm32-wasip2` that try to get out (files, sockets, environment, clock, random,
//! stdout/stderr, sleep) or misbehave (endless loop, memory bomb, huge output, a trap
//! on one record), a 5 MB record, and a plugin built for the previous contract. Each
//! attempt has an asserted outcome; records a fault is isolated to are dead-lettered
//! with their original bytes and the rest is committed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use floe::dead_letter::{DeadLetter, DeadLetterWriter};
use floe::record::json::JsonObject;
use floe::transform::{
    ChainInput, Limits, OnError, PluginsConfig, TransformChain, TransformConfig, TransformEngine,
};
use floe_tests::{AgentProcess, Broker, Pipeline, Transform, Workspace, floe_cmd, plugin_path};
use serde_json::{Value, json};

const NS: &str = "sandbox";

/// A broker with a one-partition topic (offsets equal the `id`s) holding `values`,
/// and a workspace config for it running `transforms`.
async fn setup(
    topic: &str,
    values: &[Value],
    transforms: &[Transform],
) -> Result<(Broker, Workspace, PathBuf)> {
    let broker = Broker::start()?;
    broker.create_topic(topic, 1).await?;
    let messages: Vec<floe_tests::Message> = values
        .iter()
        .map(|v| (None, Some(v.to_string().into_bytes())))
        .collect();
    broker.produce(topic, &messages).await?;
    let (ws, config) = workspace_for(&broker, topic, transforms)?;
    Ok((broker, ws, config))
}

/// A workspace with a config reading `topic` into table `topic` of namespace `NS`
/// through `transforms`.
fn workspace_for(
    broker: &Broker,
    topic: &str,
    transforms: &[Transform],
) -> Result<(Workspace, PathBuf)> {
    let ws = Workspace::new()?;
    let config = write_config(&ws, broker, topic, transforms)?;
    Ok((ws, config))
}

/// Writes the workspace's config reading `topic` into table `topic` of namespace `NS`
/// through `transforms`.
fn write_config(
    ws: &Workspace,
    broker: &Broker,
    topic: &str,
    transforms: &[Transform],
) -> Result<PathBuf> {
    let pipeline = transforms.iter().cloned().fold(
        ws.pipeline(topic, &broker.bootstrap, topic)
            .table(NS, topic),
        Pipeline::transform,
    );
    ws.write(&ws.config().pipeline(pipeline))
}

fn records(n: i64) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"id": i, "v": format!("x{i}")}))
        .collect()
}

/// The test plugin `test-NAME`, named `name`, with its settings `with`.
fn plugin(name: &str, with: Value) -> Transform {
    Transform::new(plugin_path(&format!("test-{name}")))
        .name(name)
        .with(with)
}

/// Runs `floe run` until the table holds `rows` rows, stops it with SIGTERM (which must
/// end cleanly), and returns what it logged, without colour codes.
async fn run_until(config: &Path, ws: &Workspace, table: &str, rows: i64) -> Result<String> {
    let agent = AgentProcess::start(config, &[])?;
    if let Err(e) = ws
        .wait_for_rows(NS, table, rows, Duration::from_secs(120))
        .await
    {
        bail!("{e}\nagent output:\n{}", agent.output());
    }
    Ok(plain(&agent.terminate()?))
}

/// `text` without ANSI colour codes.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn ids(rows: &[Value]) -> BTreeSet<i64> {
    rows.iter().map(|r| r["id"].as_i64().expect("id")).collect()
}

fn dead_letters(ws: &Workspace) -> Result<Vec<DeadLetter>> {
    let path = ws.path("dead-letter.ndjson");
    if !path.exists() {
        return Ok(Vec::new());
    }
    Ok(DeadLetterWriter::read_all(&path)?)
}

fn original(letter: &DeadLetter) -> Value {
    let bytes = B64
        .decode(letter.value_base64.as_deref().expect("value"))
        .expect("base64");
    serde_json::from_slice(&bytes).expect("the original message")
}

/// Every row's `outcome`, as the reader saw it.
fn outcomes(ws: &Workspace, reader: &str, table: &str) -> Result<Vec<String>> {
    let dump = ws.read(reader, NS, table, "id")?;
    Ok(dump
        .rows()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("<none>").to_string())
        .collect())
}

/// Runs `n` records through the plugin `name` (with `with`, completed by `extra`) and
/// checks that exactly the record with
/// `id == bad` was dead-lettered, with its original bytes, its offset and a reason
/// naming the plugin and containing `reason`, and that the others were committed.
async fn isolates(
    topic: &str,
    name: &str,
    with: Value,
    extra: impl FnOnce(Transform) -> Transform,
    bad: i64,
    reason: &str,
) -> Result<DeadLetter> {
    const N: i64 = 60;
    let (_broker, ws, config) = setup(topic, &records(N), &[extra(plugin(name, with))]).await?;
    let log = run_until(&config, &ws, topic, N - 1).await?;
    for reader in ["pyiceberg", "duckdb"] {
        let rows = ws.read(reader, NS, topic, "id")?;
        let expected: BTreeSet<i64> = (0..N).filter(|i| *i != bad).collect();
        assert_eq!(
            ids(rows.rows()),
            expected,
            "{reader}: every other record committed"
        );
        assert_eq!(rows.rows().len() as i64, N - 1, "{reader}: no duplicates");
    }
    let letters = dead_letters(&ws)?;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}\n{log}");
    let letter = &letters[0];
    assert_eq!(
        original(letter),
        json!({"id": bad, "v": format!("x{bad}")}),
        "original bytes"
    );
    assert_eq!(
        (letter.topic.as_str(), letter.partition, letter.offset),
        (topic, 0, bad)
    );
    assert_eq!(letter.stage, "transform");
    assert!(
        letter.reason.starts_with(&format!("plugin {name}: ")) && letter.reason.contains(reason),
        "{}",
        letter.reason
    );
    assert!(
        !log.contains("panicked at"),
        "the agent did not panic:\n{log}"
    );
    Ok(letters.into_iter().next().expect("one letter"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_traps_only_on_one_input_is_dead_lettered() -> Result<()> {
    isolates(
        "traps",
        "faulty",
        json!({"mode": "panic", "at_offset": 17}),
        |t| t,
        17,
        "panicked: faulty plugin panicked on purpose at offset 17",
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_at_its_deadline() -> Result<()> {
    // No fuel is counted unless a plugin asks for it: only the deadline stops it.
    isolates(
        "loops",
        "faulty",
        json!({"mode": "spin", "at_offset": 30}),
        |t| t.limit("timeout", "300ms"),
        30,
        "exceeded its time limit (300ms per batch",
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_contained() -> Result<()> {
    isolates(
        "bombs",
        "faulty",
        json!({"mode": "hog", "bytes": 268435456, "at_offset": 5}),
        |t| t.limit("memory", "16MiB"),
        5,
        "exceeded its memory limit (16 MiB",
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_output_is_capped() -> Result<()> {
    isolates(
        "floods",
        "escape",
        json!({"attempt": "flood", "at_offset": 44, "copies": 5000}),
        |t| t.limit("max_outputs", 1000),
        44,
        "exceeded its output limit: more than 1000 records",
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_cannot_pose_as_a_panic() -> Result<()> {
    // The plugin logs "panic: spoofed" and then aborts: a trap, not a panic.
    let letter = isolates(
        "spoofs",
        "escape",
        json!({"attempt": "spoof", "at_offset": 9}),
        |t| t,
        9,
        "trapped: ",
    )
    .await?;
    assert!(!letter.reason.contains("spoofed"), "{}", letter.reason);
    Ok(())
}

/// Runs every record through the escape plugin with `with` and returns each reader's
/// `outcome`s.
async fn attempt(
    topic: &str,
    with: Value,
    extra: impl FnOnce(Transform) -> Transform,
) -> Result<(Vec<String>, String)> {
    const N: i64 = 20;
    let (_broker, ws, config) = setup(topic, &records(N), &[extra(plugin("escape", with))]).await?;
    let log = run_until(&config, &ws, topic, N).await?;
    let pyiceberg = outcomes(&ws, "pyiceberg", topic)?;
    assert_eq!(
        pyiceberg,
        outcomes(&ws, "duckdb", topic)?,
        "both readers agree"
    );
    assert_eq!(pyiceberg.len() as i64, N);
    Ok((pyiceberg, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_open_files() -> Result<()> {
    let secret = std::env::temp_dir().join(format!("floe-sandbox-secret-{}", std::process::id()));
    std::fs::write(&secret, "do not read")?;
    let (outcomes, _) = attempt(
        "files",
        json!({"attempt": "file", "path": secret.display().to_string()}),
        |t| t,
    )
    .await?;
    for o in &outcomes {
        let (read, write) = o.split_once("; ").expect("two results");
        assert!(read.starts_with("denied: "), "{o}");
        assert!(write.starts_with("denied: "), "{o}");
    }
    assert!(
        !Path::new(&format!("{}.escape", secret.display())).exists(),
        "nothing written"
    );
    std::fs::remove_file(secret)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_open_sockets() -> Result<()> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let (outcomes, _) =
        attempt("sockets", json!({"attempt": "socket", "port": port}), |t| t).await?;
    for o in &outcomes {
        assert!(o.starts_with("denied: "), "{o}");
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nobody connected"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_sees_no_environment() -> Result<()> {
    let (outcomes, _) = attempt("env", json!({"attempt": "env", "var": "HOME"}), |t| t).await?;
    assert!(std::env::var("HOME").is_ok(), "the agent has a HOME");
    for o in &outcomes {
        assert_eq!(o, "0 variables, 0 arguments, HOME=None");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_is_frozen_unless_granted() -> Result<()> {
    let (outcomes, _) = attempt("clocks", json!({"attempt": "clock"}), |t| t).await?;
    for o in &outcomes {
        assert_eq!(o, "wall 0 monotonic 0");
    }
    let (outcomes, _) = attempt("granted", json!({"attempt": "clock"}), |t| {
        t.set("allow_clock", true)
    })
    .await?;
    for o in &outcomes {
        let wall: u64 = o.split(' ').nth(1).unwrap().parse()?;
        assert!(wall > 1_700_000_000, "{o}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_returns_at_once() -> Result<()> {
    // An hour per record: the rows only arrive (within the wait) if sleep does not block.
    let (outcomes, _) = attempt(
        "sleeps",
        json!({"attempt": "sleep", "seconds": 3600}),
        |t| t,
    )
    .await?;
    assert!(outcomes.iter().all(|o| o == "slept"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printing_goes_to_the_log_with_the_plugin_name() -> Result<()> {
    // Under `floe run`, a plugin writing to stdout or stderr made a blocking WASI call on
    // a tokio worker, and the agent died with "Cannot start a runtime from within a
    // runtime" before committing a row.
    let (outcomes, log) = attempt("prints", json!({"attempt": "print"}), |t| t).await?;
    assert!(outcomes.iter().all(|o| o == "printed"));
    assert!(!log.contains("Cannot start a runtime"), "{log}");
    let line = |needle: &str| -> &str {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no log line with {needle:?}:\n{log}"))
    };
    let stdout = line("escape stdout 3");
    assert!(
        stdout.contains("plugin=\"escape\"") || stdout.contains("plugin=escape"),
        "{stdout}"
    );
    assert!(
        stdout.contains("stream=\"stdout\"") || stdout.contains("stream=stdout"),
        "{stdout}"
    );
    assert!(line("escape stderr 3").contains("stderr"));
    // A newline in a log message is escaped; a newline on stderr starts a new line that
    // still carries the plugin's name. No line starts like one of the agent's own.
    assert!(line("escape log 3").contains("escape log 3\\nINFO forged by log"));
    for l in log.lines() {
        if l.contains("forged") {
            assert!(
                l.contains("escape"),
                "a forged line without the plugin's name: {l}"
            );
            assert!(
                !l.starts_with("ERROR forged") && !l.starts_with("INFO forged"),
                "{l}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mb_record_goes_through_on_its_own() -> Result<()> {
    let big = "b".repeat(5 << 20);
    let mut values = records(10);
    values.insert(5, json!({"id": 100, "v": big}));
    let topic = "big";
    let broker = Broker::start()?;
    broker.create_topic(topic, 1).await?;
    produce_large(&broker.bootstrap, topic, &values).await?;
    // Through two plugins, the second one patching every record.
    let (ws, config) = workspace_for(
        &broker,
        topic,
        &[
            Transform::new(plugin_path("passthrough")),
            Transform::new(plugin_path("redact")).with(json!({"hash": ["id"]})),
        ],
    )?;
    run_until(&config, &ws, topic, 11).await?;
    for reader in ["pyiceberg", "duckdb"] {
        let dump = ws.read(reader, NS, topic, "v")?;
        let lengths: Vec<usize> = dump
            .rows()
            .iter()
            .map(|r| r["v"].as_str().unwrap().len())
            .collect();
        assert_eq!(lengths.len(), 11, "{reader}");
        assert!(
            lengths.contains(&(5 << 20)),
            "{reader}: the big value is whole"
        );
    }
    assert!(dead_letters(&ws)?.is_empty());

    // With less memory than the record needs, it is dead-lettered alone, whole.
    let topic = "big_small_memory";
    broker.create_topic(topic, 1).await?;
    produce_large(&broker.bootstrap, topic, &values).await?;
    let (ws, config) = workspace_for(
        &broker,
        topic,
        &[Transform::new(plugin_path("passthrough")).limit("memory", "4MiB")],
    )?;
    run_until(&config, &ws, topic, 10).await?;
    let letters = dead_letters(&ws)?;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        original(&letters[0])["v"].as_str().map(str::len),
        Some(5 << 20)
    );
    assert!(
        letters[0]
            .reason
            .contains("exceeded its memory limit (4 MiB"),
        "{}",
        letters[0].reason
    );
    assert_eq!(ws.committed_rows(NS, topic).await?, 10);
    Ok(())
}

/// Produces messages larger than the client's default size limit.
async fn produce_large(bootstrap: &str, topic: &str, values: &[Value]) -> Result<()> {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.max.bytes", "20000000")
        .create()?;
    for v in values {
        let payload = v.to_string();
        producer
            .send(
                FutureRecord::<(), _>::to(topic).payload(&payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("produce: {e}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_interrupts_a_running_plugin() -> Result<()> {
    let (_broker, ws, config) = setup(
        "stuck",
        &records(5),
        &[plugin("faulty", json!({"mode": "spin"})).limit("timeout", "10m")],
    )
    .await?;
    let mut agent = AgentProcess::start(&config, &[])?;
    agent.wait_for_line("plugin loaded", Duration::from_secs(120))?;
    // Let it reach the records and spin.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stopping = Instant::now();
    agent.terminate()?;
    assert!(
        stopping.elapsed() < Duration::from_secs(60),
        "SIGTERM did not wait for the 10-minute deadline: {:?}",
        stopping.elapsed()
    );
    assert_eq!(ws.committed_rows(NS, "stuck").await.unwrap_or(0), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_the_old_contract_is_refused_with_how_to_rebuild() -> Result<()> {
    let (broker, ws, config) = setup("legacy", &records(3), &[plugin("legacy", json!({}))]).await?;
    let (status, out) = AgentProcess::start(&config, &[])?.wait_exit(Duration::from_secs(120))?;
    assert!(!status.success());
    let out = plain(&out);
    assert!(
        out.contains("built for the plugin contract floe-plugin:transform@0.1.0, but this agent runs @0.2.2; rebuild it with floe-sdk 0.2"),
        "{out}"
    );
    assert_eq!(ws.committed_rows(NS, "legacy").await.unwrap_or(0), 0);

    // `floe check` says so too, and passes a good plugin with its `with` table.
    let (code, stdout, _) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    assert_eq!(code, 1, "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains(" plugin "))
        .expect("a plugin line");
    assert!(
        line.contains("FAIL") && line.contains("transform@0.1.0"),
        "{line}"
    );
    write_config(
        &ws,
        &broker,
        "legacy",
        &[
            plugin("faulty", json!({"mode": "ok"})),
            plugin("escape", json!({"attempt": "nope"})),
        ],
    )?;
    let (_, stdout, _) = floe_cmd(&["check", "--config", config.to_str().unwrap()])?;
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(" plugin ")).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].contains(" ok ") && lines[0].contains("faulty: loaded and initialised"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("FAIL") && lines[1].contains("unknown attempt `nope`"),
        "{}",
        lines[1]
    );
    Ok(())
}

/// An engine for chains built in the test process, compiling into `cache`.
fn chain_engine(cache: &Path, instances: u32) -> Result<TransformEngine> {
    Ok(TransformEngine::new(
        &PluginsConfig {
            path: vec![],
            cache_dir: cache.to_path_buf(),
        },
        instances,
        64 << 20,
    )?)
}

/// A built plugin named `name`, with `with` (TOML) and default limits.
fn chain_config(plugin: &str, name: &str, with: &str) -> Result<TransformConfig> {
    Ok(TransformConfig {
        uses: plugin_path(plugin).display().to_string(),
        name: Some(name.into()),
        with: toml::from_str(with)?,
        limits: Limits::default(),
        on_error: OnError::DeadLetter,
        allow_clock: false,
        allow_random: false,
    })
}

/// Chain inputs of partition 0 of topic `t`, offsets from `first`.
fn chain_inputs(values: &[JsonObject], first: i64) -> Vec<ChainInput<'_>> {
    values
        .iter()
        .zip(first..)
        .map(|(value, offset)| ChainInput {
            value: value.view(),
            topic: "t",
            partition: 0,
            offset,
            timestamp_ms: None,
            key: None,
        })
        .collect()
}

/// A chain over records with the escape plugin's `random` attempt; the numbers it got.
fn random_numbers(allow_random: bool, offsets: std::ops::Range<i64>) -> Result<Vec<String>> {
    let cache = tempfile::tempdir()?;
    let engine = chain_engine(cache.path(), 1)?;
    let mut config = chain_config("test-escape", "escape", "attempt = \"random\"")?;
    config.allow_random = allow_random;
    let mut chain = TransformChain::new("random", &engine, &[config])?;
    let values: Vec<JsonObject> = offsets
        .clone()
        .map(|i| JsonObject::parse(json!({"id": i}).to_string().into_bytes()))
        .collect::<Result<_, _>>()?;
    let inputs = chain_inputs(&values, offsets.start);
    let result = chain.run(&inputs)?;
    Ok(result
        .outputs
        .iter()
        .map(|o| match &o.value {
            floe::transform::Produced::New(v) => {
                serde_json::from_slice::<Value>(v.as_bytes()).unwrap()["outcome"].to_string()
            }
            floe::transform::Produced::Unchanged => panic!("the plugin patches every record"),
        })
        .collect())
}

#[test]
fn random_is_seeded_per_batch_unless_granted() -> Result<()> {
    let first = random_numbers(false, 0..8)?;
    assert_eq!(
        first,
        random_numbers(false, 0..8)?,
        "a replay gets the same numbers"
    );
    assert_eq!(
        first.iter().collect::<BTreeSet<_>>().len(),
        8,
        "numbers differ within a batch"
    );
    assert_ne!(
        first,
        random_numbers(false, 100..108)?,
        "another batch gets others"
    );
    let granted = random_numbers(true, 0..8)?;
    assert_ne!(
        granted,
        random_numbers(true, 0..8)?,
        "granted: the host's random numbers"
    );
    Ok(())
}

/// `redact` compiled to WebAssembly hashes as its native tests do: SHA-256 of salt +
/// text, as any other tool computes it. In WebAssembly the hash is the agent's
/// `sha256` host function: a short value (joined with the salt on the guest's stack)
/// and a long one (joined on its heap, several SHA-256 blocks).
#[test]
fn redact_in_webassembly_hashes_with_sha_256() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let engine = chain_engine(cache.path(), 1)?;
    let config = chain_config(
        "redact",
        "redact",
        "hash = [\"user\", \"n\"]\nsalt = \"pepper\"",
    )?;
    let mut chain = TransformChain::new("hash", &engine, &[config])?;
    // One record through the chain: the object redact's patch made of it.
    let mut redacted = |record: Value| -> Result<Value> {
        let values = vec![JsonObject::parse(record.to_string().into_bytes())?];
        let result = chain.run(&chain_inputs(&values, 0))?;
        let floe::transform::Produced::New(out) = &result.outputs[0].value else {
            bail!("redact patches the record")
        };
        Ok(serde_json::from_slice(out.as_bytes())?)
    };
    assert_eq!(
        redacted(json!({"user": "u-42", "n": 42, "k": 1}))?,
        json!({
            // sha256("pepperu-42") and sha256("pepper42"), as Python's hashlib gives them.
            "user": "d5edbbd3f8a9c935546d328a403d50aff769f7a8dcabe236880002f7fa7730ab",
            "n": "93ca73bec2907ec825519db1f7ee28cb033d71c83d14b76ef78b0c4e64566e6e",
            "k": 1
        })
    );
    let long = format!("long-{}", "x".repeat(300));
    assert_eq!(
        redacted(json!({"user": long, "n": null}))?,
        // sha256("pepper" + long) as hashlib gives it; a null stays null.
        json!({"user": "98a2ed1dea892fda9d30a10dc11836c83b7862810787efc9b28768c264ef4a44", "n": null})
    );
    Ok(())
}

/// A plugin built for contract 0.2.0 (before the `sha256` host function; it reads
/// and writes the batch buffers itself, as floe-sdk 0.2.0 did) still loads and runs:
/// a patch version of the contract only adds host functions.
#[test]
fn a_plugin_built_for_contract_0_2_0_still_runs() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let engine = chain_engine(cache.path(), 1)?;
    let config = chain_config("test-contract_0_2_0", "older", "")?;
    let mut chain = TransformChain::new("older", &engine, &[config])?;
    let values: Vec<JsonObject> = records(6)
        .iter()
        .map(|v| JsonObject::parse(v.to_string().into_bytes()))
        .collect::<Result<_, _>>()?;
    let result = chain.run(&chain_inputs(&values, 10))?;
    assert!(result.errors.is_empty(), "{:?}", result.errors);
    // It keeps the records at even offsets (10, 12, 14) unchanged.
    let kept: Vec<usize> = result.outputs.iter().map(|o| o.origin).collect();
    assert_eq!(kept, vec![0, 2, 4]);
    assert!(
        result
            .outputs
            .iter()
            .all(|o| matches!(o.value, floe::transform::Produced::Unchanged)),
        "{:?}",
        result.outputs.iter().map(|o| &o.value).collect::<Vec<_>>()
    );
    Ok(())
}

/// With fuel counted, a chain reports the fuel its plugins used: the same batch again
/// uses exactly as much again (it counts WebAssembly instructions, not time), a plugin
/// doing more per record uses more, and an engine without fuel reports none.
#[test]
fn fuel_used_counts_the_plugins_work() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let plugins = PluginsConfig {
        path: vec![],
        cache_dir: cache.path().to_path_buf(),
    };
    let with_fuel = |plugin: &str, with: &str| -> Result<TransformConfig> {
        let mut config = chain_config(plugin, plugin, with)?;
        config.limits.fuel = Some(1_000_000_000);
        Ok(config)
    };
    let pass = with_fuel("passthrough", "")?;
    let redact = with_fuel("redact", "hash = [\"user\"]")?;
    let engine = TransformEngine::for_transforms(&plugins, 2, [&pass, &redact])?;
    let values: Vec<JsonObject> = (0..50)
        .map(|i| {
            JsonObject::parse(
                json!({"user": format!("u-{i}"), "n": i})
                    .to_string()
                    .into_bytes(),
            )
        })
        .collect::<Result<_, _>>()?;
    let inputs = chain_inputs(&values, 0);

    let mut passthrough = TransformChain::new("fuel", &engine, std::slice::from_ref(&pass))?;
    assert_eq!(passthrough.fuel_used(), 0, "nothing ran yet");
    passthrough.run(&inputs)?;
    let once = passthrough.fuel_used();
    assert!(once > 0, "a call uses fuel");
    passthrough.run(&inputs)?;
    assert_eq!(
        passthrough.fuel_used(),
        2 * once,
        "the same batch, the same fuel"
    );

    let mut hashing = TransformChain::new("fuel", &engine, &[redact])?;
    hashing.run(&inputs)?;
    assert!(
        hashing.fuel_used() > once,
        "hashing a field ({}) costs more than passing records on ({once})",
        hashing.fuel_used()
    );

    let uncounted = chain_engine(cache.path(), 1)?;
    let mut free = TransformChain::new(
        "fuel",
        &uncounted,
        &[chain_config("passthrough", "passthrough", "")?],
    )?;
    free.run(&inputs)?;
    assert_eq!(free.fuel_used(), 0, "an engine without fuel counts none");
    Ok(())
}

/// How a test runs a chain over a batch.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Run {
    /// `TransformChain::run`: one result.
    Whole,
    /// `TransformChain::run_parts`: results part by part, merged here.
    Parts,
}

/// A chain of a flat-map, a plugin that rejects some records, one that panics on one
/// record and a filter, run over `n` records with `lanes` instances of each plugin:
/// (origin, route, value) of every output and (origin, plugin, message) of every error.
#[allow(clippy::type_complexity, reason = "a test's summary of a chain result")]
fn chain_result(
    lanes: usize,
    n: i64,
    run: Run,
) -> Result<(
    Vec<(usize, Option<String>, String)>,
    Vec<(usize, String, String)>,
)> {
    let cache = tempfile::tempdir()?;
    let engine = chain_engine(cache.path(), 4 * lanes as u32)?;
    let configs = [
        chain_config("explode", "explode", "field = \"items\"")?,
        chain_config("test-faulty", "rejects", "mode = \"fail_every\"\nevery = 7")?,
        chain_config(
            "test-faulty",
            "panics",
            "mode = \"panic\"\nat_offset = 1501",
        )?,
        chain_config(
            "filter",
            "filter",
            "all = [{ field = \"items\", op = \"ne\", value = 1 }]",
        )?,
    ];
    let mut chain = TransformChain::with_lanes("lanes", &engine, &configs, lanes)?;
    assert_eq!(chain.lanes(), lanes);
    let values: Vec<JsonObject> = (0..n)
        .map(|i| {
            let items: Vec<i64> = (0..i % 3).collect();
            JsonObject::parse(json!({"id": i, "items": items}).to_string().into_bytes())
        })
        .collect::<Result<_, _>>()?;
    let inputs = chain_inputs(&values, 0);
    let result = match run {
        Run::Whole => chain.run(&inputs)?,
        Run::Parts => {
            let mut merged = floe::transform::ChainResult::default();
            let mut failed = None;
            chain.run_parts(&inputs, |part| match part {
                Ok(part) => {
                    merged.outputs.extend(part.outputs);
                    merged.errors.extend(part.errors);
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            });
            if let Some(e) = failed {
                return Err(e.into());
            }
            merged
        }
    };
    let outputs = result
        .outputs
        .iter()
        .map(|o| {
            let text = match &o.value {
                floe::transform::Produced::New(v) => String::from_utf8_lossy(v.as_bytes()).into(),
                floe::transform::Produced::Unchanged => "unchanged".to_string(),
            };
            (o.origin, o.route.clone(), text)
        })
        .collect();
    let errors = result
        .errors
        .iter()
        .map(|e| (e.origin, e.plugin.clone(), e.message.clone()))
        .collect();
    Ok((outputs, errors))
}

/// A batch shared by several plugin threads gives what one thread gives: the same
/// outputs and errors, in input order, with the right origins (a fault in a later
/// share isolated to its record too).
#[test]
fn plugin_threads_give_what_one_thread_gives() -> Result<()> {
    let n = 3000;
    let (outputs, errors) = chain_result(1, n, Run::Whole)?;
    // Record i has i % 3 items: 0, 1 or 2 outputs before the filter drops item 1.
    assert!(outputs.len() > n as usize / 2, "{} outputs", outputs.len());
    assert!(
        errors
            .iter()
            .any(|e| e.1 == "panics" && e.0 == 1501 && e.2.contains("offset 1501")),
        "the panic is isolated to record 1501: {:?}",
        errors
            .iter()
            .filter(|e| e.1 == "panics")
            .collect::<Vec<_>>()
    );
    assert!(errors.iter().any(|e| e.1 == "rejects"), "rejected records");
    for (lanes, run) in [
        (2, Run::Whole),
        (3, Run::Whole),
        (1, Run::Parts),
        (2, Run::Parts),
        (3, Run::Parts),
    ] {
        let (o, e) = chain_result(lanes, n, run)?;
        assert_eq!(
            o.len(),
            outputs.len(),
            "{lanes} lanes, {run:?}: output count"
        );
        assert!(
            o == outputs,
            "{lanes} lanes, {run:?}: outputs differ from one lane's"
        );
        assert!(
            e == errors,
            "{lanes} lanes, {run:?}: errors differ from one lane's"
        );
    }
    Ok(())
}

/// The pipeline stops taking parts of a batch when one fails: `run_parts` hands over
/// nothing after `each` says stop.
#[test]
fn a_caller_can_stop_taking_parts() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let engine = chain_engine(cache.path(), 8)?;
    let configs = [chain_config("passthrough", "pass", "")?];
    let mut chain = TransformChain::with_lanes("parts", &engine, &configs, 2)?;
    let values: Vec<JsonObject> = (0..5000)
        .map(|i| JsonObject::parse(json!({ "id": i }).to_string().into_bytes()))
        .collect::<Result<_, _>>()?;
    let inputs = chain_inputs(&values, 0);
    let mut origins = Vec::new();
    chain.run_parts(&inputs, |part| {
        origins.extend(part.expect("passthrough").outputs.iter().map(|o| o.origin));
        origins.len() < 1000
    });
    assert!(
        (1000..1600).contains(&origins.len()),
        "parts stop after the one that crossed 1,000 records: {} taken",
        origins.len()
    );
    assert!(
        origins.iter().enumerate().all(|(i, &o)| i == o),
        "parts come in input order"
    );
    let mut all = 0;
    chain.run_parts(&inputs, |part| {
        all += part.expect("passthrough").outputs.len();
        true
    });
    assert_eq!(all, 5000, "the chain is usable after a stop");
    Ok(())
}
