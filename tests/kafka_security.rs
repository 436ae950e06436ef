//! Kafka over TLS with SASL: a real broker (Tansu, plaintext) behind an edge proxy that
//! terminates TLS (server certificate from a test CA, client certificates required) and
//! authenticates SASL PLAIN and SCRAM (SHA-256, SHA-512) with the Kafka wire protocol
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
use floe_tests::{AgentProcess, Broker, Pipeline, floe_bin, free_port, repo_root};
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
        SecureKafka::start_with("PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", &[])
    }

    /// The proxy with SASL `mechanisms` and extra proxy arguments.
    fn start_with(mechanisms: &str, extra: &[String]) -> Result<SecureKafka> {
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
            .args(["--sasl", mechanisms])
            .args(["--user", &format!("{USER}:{PASSWORD}")])
            .args(extra)
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

    /// A pipeline on `lake` reading `secure` through the proxy as `name` into table
    /// `name`: SASL_SSL with the client certificate, the brokers' certificates checked
    /// against `ca`; the SASL settings are the caller's.
    fn pipeline(&self, lake: &Lake, name: &str, ca: &str) -> Pipeline {
        lake.pipeline(name, &self.bootstrap, "secure", name)
            .security_protocol("SASL_SSL")
            .tls_ca(self.file(ca))
            .tls_client(self.file("client.pem"), self.file("client.key"))
    }
}

/// Writes `NAME.toml` on `lake` with `pipeline`.
fn config(lake: &Lake, name: &str, pipeline: Pipeline) -> Result<PathBuf> {
    lake.write(&format!("{name}.toml"), &lake.config().pipeline(pipeline))
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

    // SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, each over mutual TLS.
    for (name, mechanism) in [
        ("scram", "SCRAM-SHA-512"),
        ("scram256", "SCRAM-SHA-256"),
        ("plain", "PLAIN"),
    ] {
        let path = config(
            &lake,
            name,
            kafka
                .pipeline(&lake, name, "ca.pem")
                .sasl(mechanism, USER, PASSWORD),
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
        ("badpassword", "wrong", "ca.pem", "refused the credentials"),
        (
            "unknownca",
            PASSWORD,
            "other-ca.pem",
            "TLS handshake with a broker failed",
        ),
    ];
    for (name, password, ca, says) in cases {
        let source = kafka
            .pipeline(&lake, name, ca)
            .sasl("SCRAM-SHA-512", USER, password);
        let path = config(&lake, name, source)?;
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

/// An OIDC token endpoint (`tests/fixtures/oidc_token_server.py`) issuing HS256 JWTs.
struct TokenEndpoint {
    child: Child,
    url: String,
    addr: String,
}

impl Drop for TokenEndpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TokenEndpoint {
    fn start(client: &str, ttl_secs: i64, jwt_secret: &str) -> Result<TokenEndpoint> {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let python = std::env::var("FLOE_PYTHON").unwrap_or_else(|_| "python3".into());
        let child = Command::new(python)
            .arg(repo_root().join("tests/fixtures/oidc_token_server.py"))
            .args(["--listen", &addr, "--client", client])
            .args(["--ttl", &ttl_secs.to_string(), "--hs256-secret", jwt_secret])
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("start the token endpoint")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            ensure!(
                Instant::now() < deadline,
                "the token endpoint did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(TokenEndpoint {
            child,
            url: format!("http://{addr}/oauth2/token"),
            addr,
        })
    }

    /// Tokens issued so far.
    fn issued(&self) -> Result<u64> {
        let (_, body) = floe_tests::rest::http("GET", &self.addr, "/stats", "")?;
        let stats: Value = serde_json::from_str(&body)?;
        Ok(stats["tokens_issued"].as_u64().unwrap_or(0))
    }
}

fn expected_rows(records: &[(String, String)]) -> Vec<Value> {
    records
        .iter()
        .map(|(k, v)| {
            let mut row: serde_json::Map<String, Value> = serde_json::from_str(v).unwrap();
            row.insert("_kafka_key".into(), Value::from(k.as_str()));
            Value::Object(row)
        })
        .collect()
}

/// OAUTHBEARER with OIDC client credentials: the agent fetches JWTs from a token
/// endpoint, renews them as they near expiry (10 s tokens over a longer run), and the
/// broker side checks each token's signature and expiry. A wrong client secret stops
/// the pipeline with the endpoint's answer, a token issued already expired with that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_tokens_authenticate_and_are_renewed() -> Result<()> {
    const JWT_SECRET: &str = "floe-test-jwt-secret";
    let endpoint = TokenEndpoint::start("floe-agent:agent-secret", 10, JWT_SECRET)?;
    let kafka = SecureKafka::start_with(
        "SCRAM-SHA-512,OAUTHBEARER",
        &["--oauth-hs256-secret".into(), JWT_SECRET.into()],
    )?;
    kafka.create_topic("secure", 2).await?;
    let first: Vec<(String, String)> = (0..200)
        .map(|i| {
            (
                format!("k{i}"),
                json!({"id": i, "v": format!("a{i}")}).to_string(),
            )
        })
        .collect();
    kafka.produce("secure", &first).await?;
    let lake = Lake::embedded()?;
    let oidc = |name: &str, endpoint: &str, secret: &str| {
        kafka
            .pipeline(&lake, name, "ca.pem")
            .set("source.sasl.mechanism", "OAUTHBEARER")
            .set("source.sasl.token_endpoint", endpoint)
            .set("source.sasl.client_id", "floe-agent")
            .set("source.sasl.client_secret", secret)
            .set("source.sasl.scope", "kafka")
    };
    let path = config(&lake, "oidc", oidc("oidc", &endpoint.url, "agent-secret"))?;
    let check = floe_check(&path)?;
    ensure!(
        check.contains("broker") && !check.contains("FAIL"),
        "floe check (OIDC):\n{check}"
    );
    let agent = AgentProcess::start(&path, &[])?;
    lake.wait_for_messages("oidc", "oidc", 200).await?;
    // Past the first tokens' lifetime: records read after it need renewed tokens.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let second: Vec<(String, String)> = (200..400)
        .map(|i| {
            (
                format!("k{i}"),
                json!({"id": i, "v": format!("b{i}")}).to_string(),
            )
        })
        .collect();
    kafka.produce("secure", &second).await?;
    if let Err(e) = lake.wait_for_messages("oidc", "oidc", 400).await {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    agent.terminate()?;
    let issued = endpoint.issued()?;
    ensure!(issued >= 3, "only {issued} tokens issued: none renewed");
    let all: Vec<(String, String)> = first.into_iter().chain(second).collect();
    for reader in ["pyiceberg", "duckdb"] {
        floe_tests::reference::assert_rows(
            &format!("{reader}: OIDC"),
            &lake.read(reader, "oidc", "id")?,
            &expected_rows(&all),
            &["id"],
            &["_kafka_partition", "_kafka_offset", "_kafka_timestamp"],
        )?;
    }

    let path = config(
        &lake,
        "badsecret",
        oidc("badsecret", &endpoint.url, "wrong"),
    )?;
    let agent = AgentProcess::start(&path, &[])?;
    let (status, log) = agent.wait_exit(Duration::from_secs(60))?;
    if status.success() || !(log.contains("refused the credentials") && log.contains("401")) {
        bail!("wrong client secret: exit {status}, the log does not say why:\n{log}");
    }

    // An endpoint that hands out tokens already expired (a clock off by minutes).
    let stale = TokenEndpoint::start("floe-agent:agent-secret", -60, JWT_SECRET)?;
    let path = config(
        &lake,
        "expired",
        oidc("expired", &stale.url, "agent-secret"),
    )?;
    let agent = AgentProcess::start(&path, &[])?;
    let (status, log) = agent.wait_exit(Duration::from_secs(60))?;
    if status.success() || !log.contains("already expired") {
        bail!("expired token: exit {status}, the log does not say why:\n{log}");
    }
    Ok(())
}

/// AWS_MSK_IAM: tokens are SigV4-presigned `kafka-cluster:Connect` requests signed with
/// the agent's AWS identity (here environment keys); the proxy recomputes each
/// signature with botocore. A wrong secret key is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msk_iam_tokens_carry_a_valid_signature() -> Result<()> {
    const KEY: (&str, &str) = ("AKIDFLOEMSK", "msk-secret-key");
    let kafka = SecureKafka::start_with(
        "SCRAM-SHA-512,OAUTHBEARER",
        &[
            "--msk-iam-key".into(),
            format!("{}:{}", KEY.0, KEY.1),
            "--msk-iam-region".into(),
            "eu-west-1".into(),
        ],
    )?;
    kafka.create_topic("secure", 2).await?;
    let records: Vec<(String, String)> = (0..250)
        .map(|i| (format!("k{i}"), json!({"id": i, "w": i * 3}).to_string()))
        .collect();
    kafka.produce("secure", &records).await?;
    let lake = Lake::embedded()?;
    let msk = |name: &str| {
        kafka
            .pipeline(&lake, name, "ca.pem")
            .set("source.sasl.mechanism", "AWS_MSK_IAM")
            .set("source.sasl.region", "eu-west-1")
    };
    let path = config(&lake, "msk", msk("msk"))?;
    let env = |secret: &'static str| {
        [
            ("AWS_ACCESS_KEY_ID", KEY.0),
            ("AWS_SECRET_ACCESS_KEY", secret),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_CONFIG_FILE", "/nonexistent/floe-test"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/floe-test"),
        ]
    };
    let agent = AgentProcess::start(&path, &env(KEY.1))?;
    if let Err(e) = lake.wait_for_messages("msk", "msk", 250).await {
        bail!("{e}\n--- agent:\n{}", agent.output());
    }
    agent.terminate()?;
    for reader in ["pyiceberg", "duckdb"] {
        floe_tests::reference::assert_rows(
            &format!("{reader}: MSK IAM"),
            &lake.read(reader, "msk", "id")?,
            &expected_rows(&records),
            &["id"],
            &["_kafka_partition", "_kafka_offset", "_kafka_timestamp"],
        )?;
    }
    let path = config(&lake, "mskbad", msk("mskbad"))?;
    let agent = AgentProcess::start(&path, &env("not-the-secret"))?;
    let (status, log) = agent.wait_exit(Duration::from_secs(60))?;
    if status.success() || !log.contains("refused the credentials") {
        bail!("wrong AWS secret: exit {status}, the log does not say why:\n{log}");
    }
    Ok(())
}
