//! Kafka over TLS with SASL: a real broker (Tansu, plaintext) behind an edge proxy that
//! terminates TLS (server certificate from a test CA, client certificates required) and
//! authenticates SASL PLAIN and SCRAM-SHA-512 with the Kafka wire protocol
//! (`tests/fixtures/kafka_edge_proxy.py`; Tansu itself cannot do either).
//!
//! Floe reads through it with `[pipelines.source.tls]` and `[pipelines.source.sasl]`;
//! every value of every row is compared. A wrong password and an unknown CA stop the
//! pipeline with an error that says what to fix, and `floe check` says the same.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use floe_tests::lake::Lake;
use floe_tests::{AgentProcess, Broker, floe_bin, free_port, repo_root};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

const USER: &str = "floe";
const PASSWORD: &str = "floe-secret";

/// The broker behind the proxy, the proxy, and the test PKI.
struct SecureKafka {
    _broker: Broker,
    proxy: Child,
    bootstrap: String,
    pki: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for SecureKafka {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
    }
}

impl SecureKafka {
    fn start() -> Result<SecureKafka> {
        let dir = tempfile::tempdir()?;
        let pki = dir.path().join("pki");
        let status = Command::new("bash")
            .arg(repo_root().join("tests/fixtures/make_test_pki.sh"))
            .arg(&pki)
            .status()?;
        ensure!(status.success(), "make_test_pki.sh failed");
        let port = free_port();
        let bootstrap = format!("127.0.0.1:{port}");
        let broker = Broker::start_advertising(&bootstrap)?;
        let python = std::env::var("FLOE_PYTHON").unwrap_or_else(|_| "python3".into());
        let log = std::fs::File::create(dir.path().join("proxy.log"))?;
        let proxy = Command::new(python)
            .arg(repo_root().join("tests/fixtures/kafka_edge_proxy.py"))
            .args(["--listen", &bootstrap, "--upstream", &broker.bootstrap])
            .arg("--tls-cert")
            .arg(pki.join("server.pem"))
            .arg("--tls-key")
            .arg(pki.join("server.key"))
            .arg("--tls-client-ca")
            .arg(pki.join("ca.pem"))
            .args(["--sasl", "PLAIN,SCRAM-SHA-512"])
            .args(["--user", &format!("{USER}:{PASSWORD}")])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start the Kafka edge proxy")?;
        let kafka = SecureKafka {
            _broker: broker,
            proxy,
            bootstrap,
            pki,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&kafka.bootstrap).is_err() {
            ensure!(Instant::now() < deadline, "the proxy did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(kafka)
    }

    fn file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }

    /// A client of the proxy: SASL_SSL, SCRAM-SHA-512, with a client certificate.
    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("security.protocol", "sasl_ssl")
            .set("ssl.ca.location", self.file("ca.pem"))
            .set("ssl.certificate.location", self.file("client.pem"))
            .set("ssl.key.location", self.file("client.key"))
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", USER)
            .set("sasl.password", PASSWORD);
        c
    }

    async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.client().create()?;
        for r in admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await?
        {
            r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
        }
        Ok(())
    }

    async fn produce(&self, topic: &str, values: &[(String, String)]) -> Result<()> {
        let producer: FutureProducer = self.client().set("enable.idempotence", "true").create()?;
        for (key, value) in values {
            producer
                .send(
                    FutureRecord::to(topic).key(key).payload(value),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| anyhow::anyhow!("produce: {e}"))?;
        }
        Ok(())
    }

    /// The source section of a pipeline reading through the proxy.
    fn source_toml(&self, mechanism: &str, password: &str, ca: &str) -> String {
        format!(
            r#"security_protocol = "SASL_SSL"
[pipelines.source.sasl]
mechanism = "{mechanism}"
username = "{USER}"
password = "{password}"
[pipelines.source.tls]
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
[pipelines.source.properties]"#,
            ca = self.file(ca),
            cert = self.file("client.pem"),
            key = self.file("client.key"),
        )
    }
}

/// A pipeline config on `lake` reading `topic` through the proxy.
fn config(lake: &Lake, kafka: &SecureKafka, name: &str, source: &str) -> Result<PathBuf> {
    let pipeline = lake
        .pipeline_toml(name, &kafka.bootstrap, "secure", name, "")
        .replace("[pipelines.source.properties]", source);
    lake.write_config(&format!("{name}.toml"), &[pipeline])
}

fn floe_check(config: &Path) -> Result<String> {
    let out = Command::new(floe_bin())
        .args(["check", "--config"])
        .arg(config)
        .output()?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_over_tls_with_sasl_and_says_what_is_wrong_when_refused() -> Result<()> {
    let kafka = SecureKafka::start()?;
    kafka.create_topic("secure", 2).await?;
    let records: Vec<(String, String)> = (0..300)
        .map(|i| {
            let v = json!({"id": i, "name": format!("n{i}"), "amount": i as f64 / 4.0});
            (format!("k{}", i % 7), v.to_string())
        })
        .collect();
    kafka.produce("secure", &records).await?;
    let lake = Lake::embedded()?;

    // SCRAM-SHA-512 and PLAIN, both over mutual TLS.
    for (name, mechanism) in [("scram", "SCRAM-SHA-512"), ("plain", "PLAIN")] {
        let path = config(
            &lake,
            &kafka,
            name,
            &kafka.source_toml(mechanism, PASSWORD, "ca.pem"),
        )?;
        let check = floe_check(&path)?;
        ensure!(
            check.contains("broker") && !check.contains("FAIL"),
            "floe check ({mechanism}):\n{check}"
        );
        let agent = AgentProcess::start(&path, &[])?;
        lake.wait_for_messages(name, name, records.len() as i64)
            .await?;
        agent.terminate()?;
        let expected: Vec<Value> = records
            .iter()
            .map(|(k, v)| {
                let mut row: serde_json::Map<String, Value> = serde_json::from_str(v).unwrap();
                row.insert("_kafka_key".into(), Value::from(k.as_str()));
                Value::Object(row)
            })
            .collect();
        for reader in ["pyiceberg", "duckdb"] {
            let dump = lake.read(reader, name, "id")?;
            floe_tests::reference::assert_rows(
                &format!("{reader}: {mechanism}"),
                &dump,
                &expected,
                &["id"],
                &["_kafka_partition", "_kafka_offset", "_kafka_timestamp"],
            )?;
        }
    }

    // Refused: the pipeline stops at once with what to fix (librdkafka alone would
    // retry forever), and `floe check` says the same.
    let cases = [
        (
            "badpassword",
            kafka.source_toml("SCRAM-SHA-512", "wrong", "ca.pem"),
            "refused the credentials",
        ),
        (
            "unknownca",
            kafka.source_toml("SCRAM-SHA-512", PASSWORD, "other-ca.pem"),
            "TLS handshake with a broker failed",
        ),
    ];
    for (name, source, says) in cases {
        let path = config(&lake, &kafka, name, &source)?;
        let check = floe_check(&path)?;
        ensure!(
            check.contains(says),
            "floe check ({name}) does not say {says:?}:\n{check}"
        );
        let agent = AgentProcess::start(&path, &[])?;
        let (status, log) = agent.wait_exit(Duration::from_secs(60))?;
        if status.success() || !log.contains(says) {
            bail!("{name}: exit {status}, the log does not say {says:?}:\n{log}");
        }
    }
    Ok(())
}
