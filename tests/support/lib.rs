//! Shared support for Floe's integration tests: a real Kafka-protocol broker (Tansu)
//! per test on a free loopback port, a real producer (rdkafka), the agent (in-process
//! or as the `floe` binary), and independent readers (PyIceberg, DuckDB) run through
//! `tests/readers/read_table.py`.
//!
//! The tools come from `scripts/setup.sh`; `scripts/test.sh` exports their paths
//! (`FLOE_TANSU`, `FLOE_PYTHON`) and builds the `floe` binary (`FLOE_BIN`).

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use iceberg::{Catalog, TableIdent};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

pub use config::{CatalogSection, Config, Pipeline, Transform};

pub mod config;
pub mod faults;
pub mod fuzzing;
pub mod inject;
pub mod lake;
pub mod postgres;
pub mod reference;
pub mod rest;
pub mod scripted;
pub mod snapshots;
pub mod spark;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

pub(crate) fn tool(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "{var} is not set: run the tests with scripts/test.sh (it installs and exports the tools)"
        ),
    }
}

/// A free TCP port on 127.0.0.1, never handed out twice by this process (a port
/// released by one test is not given to another before its service binds it). Services
/// started on it still check that it is theirs (see [`Broker::start`]).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let mut given = GIVEN.lock().expect("ports");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A Kafka message to produce: key and value (a `None` value is a tombstone).
pub type Message = (Option<Vec<u8>>, Option<Vec<u8>>);

/// A Tansu broker on a loopback port, killed on drop.
pub struct Broker {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub bootstrap: String,
    _dir: tempfile::TempDir,
}

impl Broker {
    /// Starts a broker and waits until it accepts connections; if another process took
    /// the port first (the broker exits), tries another one.
    pub fn start() -> Result<Broker> {
        let mut last = None;
        for _ in 0..5 {
            match Broker::start_on(free_port(), None) {
                Ok(b) => return Ok(b),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// Starts a broker that advertises `advertised` (`host:port` of a proxy in front of
    /// it, such as the TLS and SASL edge proxy): every client then goes through it.
    /// `bootstrap` is still the broker's own address.
    pub fn start_advertising(advertised: &str) -> Result<Broker> {
        Broker::start_on(free_port(), Some(advertised))
    }

    fn start_on(port: u16, advertised: Option<&str>) -> Result<Broker> {
        let dir = tempfile::tempdir()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised = advertised.map_or_else(|| url.clone(), |a| format!("tcp://{a}"));
        let log = std::fs::File::create(dir.path().join("broker.log"))?;
        let child = Command::new(tool("FLOE_TANSU"))
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start tansu")?;
        let mut child = child;
        let bootstrap = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("broker exited ({status}) before listening on {bootstrap}");
            }
            if TcpStream::connect(&bootstrap).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("broker did not listen on {bootstrap} within 20s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Still ours: a broker that lost the port to another process has exited by now.
        std::thread::sleep(Duration::from_millis(100));
        if let Some(status) = child.try_wait()? {
            bail!("broker exited ({status}) right after start on {bootstrap}");
        }
        Ok(Broker {
            child,
            bootstrap,
            _dir: dir,
        })
    }

    /// Creates a topic with `partitions` partitions.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let results = admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await?;
        for r in results {
            r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes a topic (its offsets start again at 0 when it is created again).
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        for r in admin.delete_topics(&[name], &AdminOptions::new()).await? {
            r.map_err(|(t, e)| anyhow::anyhow!("delete topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// Produces messages (key, value) with an idempotent producer; the partition follows the key.
    pub async fn produce(&self, topic: &str, messages: &[Message]) -> Result<()> {
        produce_to(&self.bootstrap, topic, messages).await
    }
}

/// Produces messages (key, value) to the broker at `bootstrap` with an idempotent
/// producer; the partition follows the key.
pub async fn produce_to(bootstrap: &str, topic: &str, messages: &[Message]) -> Result<()> {
    produce_with_headers(bootstrap, topic, messages, &[]).await
}

/// Like [`produce_to`], every record carrying the record headers `headers`.
pub async fn produce_with_headers(
    bootstrap: &str,
    topic: &str,
    messages: &[Message],
    headers: &[(&str, &[u8])],
) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        // Tests send messages of up to tens of megabytes (above librdkafka's 1 MB).
        .set("message.max.bytes", "67108864")
        .create()?;
    let mut deliveries = Vec::with_capacity(messages.len());
    for (key, value) in messages {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
        if let Some(k) = key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = value {
            record = record.payload(v.as_slice());
        }
        if !headers.is_empty() {
            let mut h = rdkafka::message::OwnedHeaders::new();
            for (name, value) in headers {
                h = h.insert(rdkafka::message::Header {
                    key: name,
                    value: Some(*value),
                });
            }
            record = record.headers(h);
        }
        // Enqueue now (send_result does not wait); on a full queue, wait for room.
        loop {
            match producer.send_result(record) {
                Ok(delivery) => break deliveries.push(delivery),
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    r,
                )) => {
                    record = r;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => bail!("produce: {e}"),
            }
        }
    }
    for d in deliveries {
        d.await?
            .map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
    }
    Ok(())
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A working directory with an embedded catalog and a config for one pipeline.
pub struct Workspace {
    /// Temporary directory holding catalog, warehouse, dead letters and config.
    pub dir: tempfile::TempDir,
}

/// Settings of the single pipeline a test config declares.
pub struct PipelineSpec<'a> {
    /// Pipeline name.
    pub name: &'a str,
    /// Broker address.
    pub bootstrap: &'a str,
    /// Topic.
    pub topic: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Table.
    pub table: &'a str,
    /// Commit interval, e.g. `"1s"`.
    pub commit_interval: &'a str,
}

/// Fetches `http://ADDR/metrics` (Prometheus text) with a plain HTTP/1.0 request.
pub fn scrape_metrics(addr: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// The value of the first sample of `metric` whose labels contain every `label=value` given.
pub fn metric_value(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|kv| l.contains(kv)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

impl Workspace {
    /// A fresh directory.
    pub fn new() -> Result<Workspace> {
        Ok(Workspace {
            dir: tempfile::tempdir()?,
        })
    }

    /// Path inside the workspace.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A config with the shared plugin cache (`[plugins] cache_dir`) and the workspace's
    /// embedded catalog `local`; add pipelines with [`Config::pipeline`].
    pub fn config(&self) -> Config {
        Config::new()
            .plugin_cache(plugin_cache())
            .catalog("local", self.embedded_catalog())
    }

    /// The workspace's embedded catalog: `catalog.db` and `warehouse/` in it.
    pub fn embedded_catalog(&self) -> CatalogSection {
        CatalogSection::embedded(self.path("catalog.db"), self.path("warehouse"))
    }

    /// A pipeline reading `topic` into the catalog `local` (set the table with
    /// [`Pipeline::table`]): group `floe-NAME`, a short consumer session (2s, heartbeat
    /// 0.5s), `create_table`, a commit every second, dead letters in
    /// `dead-letter.ndjson` of the workspace.
    pub fn pipeline(&self, name: &str, bootstrap: &str, topic: &str) -> Pipeline {
        Pipeline::new(name, bootstrap, topic)
            .property("session.timeout.ms", "2000")
            .property("heartbeat.interval.ms", "500")
            .set("sink.catalog", "local")
            .set("sink.create_table", true)
            .commit_interval("1s")
            .dead_letter(self.path("dead-letter.ndjson"))
    }

    /// Writes `config` to `floe.toml` in the workspace; returns its path.
    pub fn write(&self, config: &Config) -> Result<PathBuf> {
        config.write(self.path("floe.toml"))
    }

    /// Writes `floe.toml` for one pipeline on the embedded catalog `local`; returns its path.
    pub fn write_config(&self, spec: &PipelineSpec<'_>) -> Result<PathBuf> {
        self.write(
            &self.config().pipeline(
                self.pipeline(spec.name, spec.bootstrap, spec.topic)
                    .table(spec.namespace, spec.table)
                    .commit_interval(spec.commit_interval),
            ),
        )
    }

    /// Opens the embedded catalog read-side, for polling progress.
    pub async fn catalog(&self) -> Result<Arc<dyn Catalog>> {
        let config =
            floe_iceberg::CatalogConfig::embedded(self.path("catalog.db"), self.path("warehouse"));
        Ok(floe_iceberg::open_catalog("local", &config).await?.catalog)
    }

    /// Rows committed to a table so far (see [`committed_rows`]).
    pub async fn committed_rows(&self, namespace: &str, table: &str) -> Result<i64> {
        committed_rows(self.catalog().await?.as_ref(), namespace, table).await
    }

    /// Waits until the table holds at least `rows` rows (see [`wait_for_rows`]).
    pub async fn wait_for_rows(
        &self,
        namespace: &str,
        table: &str,
        rows: i64,
        timeout: Duration,
    ) -> Result<Duration> {
        wait_for_rows(
            self.catalog().await?.as_ref(),
            namespace,
            table,
            rows,
            timeout,
        )
        .await
    }

    /// Reads a table with an independent reader (`pyiceberg` or `duckdb`).
    pub fn read(
        &self,
        reader: &str,
        namespace: &str,
        table: &str,
        order_by: &str,
    ) -> Result<TableDump> {
        let out = Command::new(tool("FLOE_PYTHON"))
            .arg(repo_root().join("tests/readers/read_table.py"))
            .args([
                "--reader",
                reader,
                "--catalog-name",
                "local",
                "--table",
                &format!("{namespace}.{table}"),
                "--order-by",
                order_by,
            ])
            .arg("--catalog-db")
            .arg(self.path("catalog.db"))
            .arg("--warehouse")
            .arg(self.path("warehouse"))
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
}

/// What a reader saw.
pub struct TableDump(pub Value);

impl TableDump {
    /// The rows, as JSON objects.
    pub fn rows(&self) -> &Vec<Value> {
        self.0["rows"].as_array().expect("rows")
    }
    /// Column names.
    pub fn columns(&self) -> Vec<String> {
        self.0["columns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c[0].as_str().expect("name").to_string())
            .collect()
    }
    /// Number of snapshots of the table.
    pub fn snapshot_count(&self) -> i64 {
        self.0["snapshot_count"].as_i64().expect("snapshot_count")
    }
}

/// The `floe` binary as a child process, its stderr captured line by line.
pub struct AgentProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The thread copying stderr; joined once the process exited, so every line is in.
    reader: Option<std::thread::JoinHandle<()>>,
    /// The marker file a failpoint writes when reached.
    failpoint: Option<PathBuf>,
}

impl AgentProcess {
    /// Starts `floe run --config CONFIG` with extra environment variables.
    pub fn start(config: &Path, env: &[(&str, &str)]) -> Result<AgentProcess> {
        let config = config.to_str().context("config path is not UTF-8")?;
        AgentProcess::spawn(&["run", "--config", config], env, false)
    }

    /// Starts `floe ARGS...` with extra environment variables; stdout and stderr are both
    /// captured (for commands that print their results, like `floe maintain`).
    pub fn command(args: &[&str], env: &[(&str, &str)]) -> Result<AgentProcess> {
        AgentProcess::spawn(args, env, true)
    }

    fn spawn(args: &[&str], env: &[(&str, &str)], stdout: bool) -> Result<AgentProcess> {
        let mut cmd = Command::new(floe_bin());
        cmd.args(args)
            .stdout(if stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("start floe")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let stdout = child.stdout.take();
        let sink = lines.clone();
        // One joinable thread per process: stdout (when captured) is copied by a thread
        // it joins, so every line of both is in once the process exited.
        let reader = std::thread::spawn(move || {
            let out = stdout.map(|stdout| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        sink.lock().expect("lines").push(line);
                    }
                })
            });
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
            if let Some(out) = out {
                let _ = out.join();
            }
        });
        Ok(AgentProcess {
            child,
            lines,
            reader: Some(reader),
            failpoint: None,
        })
    }

    /// Starts `floe run` armed to stop at the failpoint `point` (see `floe::failpoint`).
    pub fn start_at_failpoint(
        config: &Path,
        point: &str,
        env: &[(&str, &str)],
    ) -> Result<AgentProcess> {
        let marker = config.with_file_name(format!("failpoint-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let marker_text = marker.display().to_string();
        let mut all = vec![
            ("FLOE_FAILPOINT", point),
            ("FLOE_FAILPOINT_FILE", marker_text.as_str()),
        ];
        all.extend_from_slice(env);
        let mut agent = AgentProcess::start(config, &all)?;
        agent.failpoint = Some(marker);
        Ok(agent)
    }

    /// Waits until the process stopped at its failpoint (the marker file names it).
    pub fn wait_for_failpoint(&mut self, timeout: Duration) -> Result<()> {
        let marker = self
            .failpoint
            .clone()
            .context("not started with start_at_failpoint")?;
        let start = Instant::now();
        loop {
            if marker.exists() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                self.join_reader();
                bail!(
                    "floe exited ({status}) before its failpoint:\n{}",
                    self.output()
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "floe did not reach its failpoint within {timeout:?}:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until a stderr line contains `needle`.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.contains(needle))
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "floe exited ({status}) before printing {needle:?}:\n{}",
                    self.output()
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "floe did not print {needle:?} within {timeout:?}:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the stderr copy reached the end (the process has exited).
    fn join_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// The process id (for signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed on stderr so far.
    pub fn output(&self) -> String {
        self.lines.lock().expect("lines").join("\n")
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM and wait for a clean exit (at most 2 minutes: an agent that does not
    /// stop is killed and the test fails, instead of hanging).
    pub fn terminate(self) -> Result<String> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let (status, out) = self
            .wait_exit(Duration::from_secs(120))
            .context("SIGTERM did not stop the agent")?;
        if !status.success() {
            bail!("floe exited with {status}:\n{out}");
        }
        Ok(out)
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(mut self, timeout: Duration) -> Result<(std::process::ExitStatus, String)> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.join_reader();
                return Ok((status, self.output()));
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                bail!("floe still running after {timeout:?}:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Path of the `floe` binary (`FLOE_BIN`, else next to the test executable).
pub fn floe_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("floe");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build -p floe-agent --bin floe)",
        bin.display()
    );
    bin
}

/// Runs `floe` to completion with arguments, returning (exit code, stdout, stderr).
pub fn floe_cmd(args: &[&str]) -> Result<(i32, String, String)> {
    let out = Command::new(floe_bin()).args(args).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    ))
}

/// The agent running in-process (same runtime as the test).
pub struct InProcessAgent {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), floe::FloeError>>,
}

impl InProcessAgent {
    /// Waits (at most `timeout`) for the agent to stop by itself, returning how it ended.
    pub async fn finished(self, timeout: Duration) -> Result<Result<(), floe::FloeError>> {
        let result = tokio::time::timeout(timeout, self.handle)
            .await
            .context("agent still running")??;
        Ok(result)
    }

    /// Asks for a graceful stop (commit what is buffered) and waits for it.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.handle.await??;
        Ok(())
    }
}

/// Starts the agent in-process with the given config file.
pub fn spawn_agent(config: &Path) -> Result<InProcessAgent> {
    let config = floe::config::Config::load(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(floe::run(config, async move {
        let _ = rx.await;
    }));
    Ok(InProcessAgent { stop, handle })
}

/// Where the tests cache compiled plugins, once for all of them (they compile in
/// seconds in debug builds): `$FLOE_CACHE/wasm-cache-tests`.
pub fn plugin_cache() -> PathBuf {
    std::env::var_os("FLOE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("wasm-cache-tests")
}

/// Path of a built plugin (`scripts/build-plugins.sh` puts them in `FLOE_PLUGIN_DIR`).
pub fn plugin_path(name: &str) -> PathBuf {
    let path = tool("FLOE_PLUGIN_DIR").join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} not found: run scripts/build-plugins.sh",
        path.display()
    );
    path
}

/// The schema-registry fixture (`tests/registry/registry.py`) on a loopback port, killed on drop.
pub struct Registry {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `USER:PASSWORD` the registry requires, if any.
    pub user: Option<String>,
}

impl Registry {
    /// Starts the registry; with `user` (`USER:PASSWORD`) it requires basic auth.
    pub fn start(user: Option<&str>) -> Result<Registry> {
        Registry::start_on(0, user)
    }

    /// [`Registry::start`] on a given port (0: any free one).
    pub fn start_on(port: u16, user: Option<&str>) -> Result<Registry> {
        let mut cmd = Command::new(tool("FLOE_PYTHON"));
        cmd.arg(repo_root().join("tests/registry/registry.py"))
            .args(["--port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(u) = user {
            cmd.args(["--user", u]);
        }
        let mut child = cmd.spawn().context("start the registry fixture")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            bail!("registry fixture did not start: {line:?}");
        };
        Ok(Registry {
            url: format!("http://{addr}"),
            user: user.map(str::to_string),
            child,
        })
    }

    /// How often `GET /schemas/ids/{id}` was asked per id (the fixture's `/_stats`).
    pub fn schema_gets(&self) -> Result<Value> {
        let out = Command::new(tool("FLOE_PYTHON"))
            .args(["-c", "import sys, urllib.request, base64\nreq = urllib.request.Request(sys.argv[1] + '/_stats')\nif len(sys.argv) > 2: req.add_header('Authorization', 'Basic ' + base64.b64encode(sys.argv[2].encode()).decode())\nprint(urllib.request.urlopen(req).read().decode())"])
            .arg(&self.url)
            .args(self.user.iter())
            .output()?;
        if !out.status.success() {
            bail!("registry stats: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice::<Value>(&out.stdout)?["schema_gets"].clone())
    }

    /// Produces `records` (JSON objects) to `topic` with confluent-kafka's `AvroSerializer`
    /// and the Avro `schema` (JSON text), which the serializer registers here.
    pub fn produce_avro(
        &self,
        bootstrap: &str,
        topic: &str,
        schema: &str,
        records: &[Value],
    ) -> Result<()> {
        self.produce_avro_keyed(bootstrap, topic, schema, records, None)
    }

    /// [`Registry::produce_avro`] with Avro keys: `key` is (key schema, field of the record
    /// whose value is the key).
    pub fn produce_avro_keyed(
        &self,
        bootstrap: &str,
        topic: &str,
        schema: &str,
        records: &[Value],
        key: Option<(&str, &str)>,
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let schema_path = dir.path().join("schema.avsc");
        std::fs::write(&schema_path, schema)?;
        let records_path = dir.path().join("records.ndjson");
        let lines: Vec<String> = records.iter().map(Value::to_string).collect();
        std::fs::write(&records_path, lines.join("\n"))?;
        let mut cmd = Command::new(tool("FLOE_PYTHON"));
        cmd.arg(repo_root().join("tests/registry/produce_avro.py"))
            .args([
                "--bootstrap",
                bootstrap,
                "--registry",
                &self.url,
                "--topic",
                topic,
            ])
            .arg("--schema")
            .arg(&schema_path)
            .arg("--records")
            .arg(&records_path);
        if let Some(u) = &self.user {
            cmd.args(["--user", u]);
        }
        if let Some((key_schema, field)) = key {
            let key_path = dir.path().join("key.avsc");
            std::fs::write(&key_path, key_schema)?;
            cmd.args(["--key-field", field])
                .arg("--key-schema")
                .arg(&key_path);
        }
        let out = cmd.output()?;
        if !out.status.success() {
            bail!(
                "produce_avro.py failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

/// What [`Registry::produce`] sends with `tests/registry/produce.py` (confluent-kafka's
/// real `ProtobufSerializer`, `JSONSerializer` or `AvroSerializer`).
pub struct Produce<'a> {
    /// `protobuf`, `json` or `avro`.
    pub format: &'a str,
    /// The schema: a `.proto` file (under `proto_path`), a JSON schema or an `.avsc`.
    pub schema: &'a Path,
    /// Records as JSON (Protobuf: the protobuf JSON mapping).
    pub records: &'a [Value],
    /// Protobuf: the message type (default: the first of the file).
    pub message: Option<&'a str>,
    /// Protobuf: the root of the `.proto` files (default: the schema's directory).
    pub proto_path: Option<&'a Path>,
    /// JSON / Avro: schemas registered first and referenced, as (name, subject, file).
    pub references: &'a [(&'a str, &'a str, &'a Path)],
    /// The record field holding the key (a `_field` is removed from the value).
    pub key_field: Option<&'a str>,
    /// The key's schema (same format as the value); without it the key is UTF-8 text.
    pub key_schema: Option<&'a Path>,
    /// Protobuf: the key's message type.
    pub key_message: Option<&'a str>,
    /// Protobuf: the message bytes alone, without the Confluent header (nothing registered).
    pub plain: bool,
}

impl Default for Produce<'_> {
    fn default() -> Self {
        Produce {
            format: "",
            schema: Path::new(""),
            records: &[],
            message: None,
            proto_path: None,
            references: &[],
            key_field: None,
            key_schema: None,
            key_message: None,
            plain: false,
        }
    }
}

impl Registry {
    /// The fixture's `/_stats`: `schema_gets` per id, `version_gets` per `subject/version`.
    pub fn stats(&self) -> Result<Value> {
        self.get("/_stats")
    }

    /// `GET {url}{path}` as JSON, e.g. `/subjects/orders-value/versions/1`.
    pub fn get(&self, path: &str) -> Result<Value> {
        let out = Command::new(tool("FLOE_PYTHON"))
            .args(["-c", "import sys, urllib.request, base64\nreq = urllib.request.Request(sys.argv[1])\nif len(sys.argv) > 2: req.add_header('Authorization', 'Basic ' + base64.b64encode(sys.argv[2].encode()).decode())\nprint(urllib.request.urlopen(req).read().decode())"])
            .arg(format!("{}{path}", self.url))
            .args(self.user.iter())
            .output()?;
        if !out.status.success() {
            bail!(
                "registry GET {path}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice::<Value>(&out.stdout)?)
    }

    /// Produces records to `topic` with a real confluent-kafka serializer (see [`Produce`]).
    pub fn produce(&self, bootstrap: &str, topic: &str, p: &Produce<'_>) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let records_path = dir.path().join("records.ndjson");
        let lines: Vec<String> = p.records.iter().map(Value::to_string).collect();
        std::fs::write(&records_path, lines.join("\n"))?;
        let mut cmd = Command::new(tool("FLOE_PYTHON"));
        cmd.arg(repo_root().join("tests/registry/produce.py"))
            .args(["--bootstrap", bootstrap, "--registry", &self.url])
            .args(["--topic", topic, "--format", p.format])
            .arg("--schema")
            .arg(p.schema)
            .arg("--records")
            .arg(&records_path);
        if let Some(u) = &self.user {
            cmd.args(["--user", u]);
        }
        if let Some(m) = p.message {
            cmd.args(["--message", m]);
        }
        if let Some(dir) = p.proto_path {
            cmd.arg("--proto-path").arg(dir);
        }
        for (name, subject, file) in p.references {
            cmd.arg("--ref")
                .arg(format!("{name}={subject}={}", file.display()));
        }
        if let Some(f) = p.key_field {
            cmd.args(["--key-field", f]);
        }
        if let Some(k) = p.key_schema {
            cmd.arg("--key-schema").arg(k);
        }
        if let Some(m) = p.key_message {
            cmd.args(["--key-message", m]);
        }
        if p.plain {
            cmd.arg("--plain");
        }
        let out = cmd.output()?;
        if !out.status.success() {
            bail!(
                "produce.py failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rows committed to a table so far, from the current snapshot's `total-records`
/// (0 when the table or snapshot is missing).
pub async fn committed_rows(catalog: &dyn Catalog, namespace: &str, table: &str) -> Result<i64> {
    let ident = TableIdent::from_strs([namespace, table])?;
    let t = match catalog.load_table(&ident).await {
        Ok(t) => t,
        Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => return Ok(0),
        Err(e) if e.message().contains("No such table") => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    Ok(t.metadata()
        .current_snapshot()
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("total-records")
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0))
}

/// Sum over partitions of the next offsets a table stores for `pipeline`: the number of
/// messages it covers when every partition started at 0 (0 if there is no table yet).
pub async fn covered_messages(
    catalog: &dyn Catalog,
    namespace: &str,
    table: &str,
    pipeline: &str,
) -> Result<i64> {
    let ident = TableIdent::from_strs([namespace, table])?;
    let Ok(t) = catalog.load_table(&ident).await else {
        return Ok(0);
    };
    let offsets = floe_iceberg::OffsetMap::from_table(t.metadata(), pipeline)?;
    Ok(offsets.0.values().sum())
}

/// Polls `count` until it reaches `target` or `timeout` passes; `what` names the count
/// in the error.
async fn wait_until<F, Fut>(
    target: i64,
    timeout: Duration,
    what: &str,
    mut count: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<i64>>,
{
    let start = Instant::now();
    loop {
        let n = count().await?;
        if n >= target {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("{what}: {n} after {timeout:?}, expected {target}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a table holds at least `rows` rows.
pub async fn wait_for_rows(
    catalog: &dyn Catalog,
    namespace: &str,
    table: &str,
    rows: i64,
    timeout: Duration,
) -> Result<Duration> {
    let what = format!("rows of {namespace}.{table}");
    wait_until(rows, timeout, &what, || {
        committed_rows(catalog, namespace, table)
    })
    .await
}

/// Waits until a table covers `messages` messages of `pipeline` (see [`covered_messages`]).
pub async fn wait_for_messages(
    catalog: &dyn Catalog,
    namespace: &str,
    table: &str,
    pipeline: &str,
    messages: i64,
    timeout: Duration,
) -> Result<Duration> {
    let what = format!("messages of pipeline {pipeline} covered by {namespace}.{table}");
    wait_until(messages, timeout, &what, || {
        covered_messages(catalog, namespace, table, pipeline)
    })
    .await
}
