//! A real Iceberg REST catalog on real S3, on loopback: moto (S3 + STS), rustberg (the
//! catalog, vending STS credentials) and `tests/fixtures/oauth_token_proxy.py` (an OAuth2
//! token endpoint in front of rustberg, which only knows API keys). Each is started on a
//! free port and killed on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{free_port, repo_root, tool};

/// S3 bucket the warehouse lives in.
pub const BUCKET: &str = "warehouse";
/// The rustberg warehouse, which clients must name exactly.
pub const WAREHOUSE: &str = "s3://warehouse/wh";
/// OAuth2 client with the catalog's admin role.
pub const WRITER: (&str, &str) = ("floe-writer", "writer-secret");
/// OAuth2 client with rustberg's `reader` role (read and list only).
pub const READER: (&str, &str) = ("floe-reader", "reader-secret");
/// Scope the token endpoint demands, as Polaris does.
pub const SCOPE: &str = "PRINCIPAL_ROLE:ALL";
/// Path prefix the fixture serves the catalog under, as Polaris does.
pub const BASE_PATH: &str = "/api/catalog";
const ADMIN_KEY: &str = "rb_floe_test_admin_key_0123456789";
const READER_KEY: &str = "rb_floe_test_reader_key_0123456789";

struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Service {
    fn spawn(name: &'static str, mut cmd: Command, dir: &std::path::Path) -> Result<Service> {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        Ok(Service { name, child, log })
    }

    fn wait_listening(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}):\n{}", self.name, self.log_text());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} did not listen on {port} within {timeout:?}:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 request on loopback; returns (status, body).
pub fn http(method: &str, addr: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("HTTP status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    Ok((status, body))
}

/// Creates bucket `bucket` in the moto at `addr`, which has just started listening: the
/// request is made again for up to 10 s while the connection is refused or reset (moto
/// may reset a connection made right as it starts listening); any HTTP answer but 200
/// fails.
pub fn create_bucket(addr: &str, bucket: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        match http("PUT", addr, &format!("/{bucket}"), "") {
            Err(e)
                if e.downcast_ref::<std::io::Error>().is_some()
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            answer => break answer?,
        }
    };
    if status != 200 {
        bail!("creating bucket {bucket} in moto: {status} {body}");
    }
    Ok(())
}

/// moto, rustberg and the OAuth2 token fixture, wired together.
pub struct RestStack {
    /// `http://127.0.0.1:PORT` of moto (S3 and STS).
    pub s3_endpoint: String,
    /// `http://127.0.0.1:PORT` of rustberg itself (API-key auth).
    pub rustberg_uri: String,
    /// `http://127.0.0.1:PORT/api/catalog`: the catalog behind OAuth2, as clients see it.
    pub uri: String,
    proxy_addr: String,
    // Dropped in reverse order of start.
    _proxy: Service,
    _rustberg: Service,
    _moto: Service,
    /// Logs and rustberg's catalog files.
    pub dir: tempfile::TempDir,
}

/// Settings of the token fixture.
#[derive(Clone, Copy)]
pub struct TokenPolicy {
    /// Lifetime of an access token, seconds.
    pub ttl_secs: u64,
    /// Stamp vended credentials with an expiry this far ahead (0: leave them undated).
    pub vended_ttl_ms: u64,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            ttl_secs: 3600,
            vended_ttl_ms: 0,
        }
    }
}

impl RestStack {
    /// Starts the three services and creates the warehouse bucket.
    pub fn start(policy: TokenPolicy) -> Result<RestStack> {
        let dir = tempfile::tempdir()?;
        let venv = tool("FLOE_VENV");

        let moto_port = free_port();
        let mut cmd = Command::new(venv.join("bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &moto_port.to_string()]);
        let mut moto = Service::spawn("moto", cmd, dir.path())?;
        moto.wait_listening(moto_port, Duration::from_secs(30))?;
        let s3_addr = format!("127.0.0.1:{moto_port}");
        create_bucket(&s3_addr, BUCKET)?;
        let s3_endpoint = format!("http://{s3_addr}");

        let rb_port = free_port();
        let config = dir.path().join("rustberg.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[server]
host = "127.0.0.1"
port = {rb_port}

[server.auth]
api_key_enabled = true

[[server.auth.api_keys]]
name = "floe-admin"
tenant = "default"
roles = ["admin"]
key_env = "FLOE_TEST_RUSTBERG_ADMIN_KEY"

[[server.auth.api_keys]]
name = "floe-reader"
tenant = "default"
roles = ["reader"]
key_env = "FLOE_TEST_RUSTBERG_READER_KEY"

[storage]
catalog_url = "file://{catalog}"
warehouse_location = "{WAREHOUSE}"

[storage.properties]
"s3.endpoint" = "{s3_endpoint}"
"s3.path-style-access" = "true"
"s3.region" = "us-east-1"
"s3.access-key-id" = "testing"
"s3.secret-access-key" = "testing"

[credentials]
provider = "aws"

[credentials.aws]
region = "us-east-1"
role_arn = "arn:aws:iam::123456789012:role/floe-writer"
"#,
                catalog = dir.path().join("catalog").display(),
            ),
        )?;
        let mut cmd = Command::new(tool("FLOE_RUSTBERG"));
        cmd.arg("--config")
            .arg(&config)
            .arg("--insecure-http")
            .env("FLOE_TEST_RUSTBERG_ADMIN_KEY", ADMIN_KEY)
            .env("FLOE_TEST_RUSTBERG_READER_KEY", READER_KEY)
            .env("AWS_ENDPOINT_URL_STS", &s3_endpoint)
            .env("AWS_ENDPOINT_URL", &s3_endpoint)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        let mut rustberg = Service::spawn("rustberg", cmd, dir.path())?;
        rustberg.wait_listening(rb_port, Duration::from_secs(30))?;
        let rustberg_uri = format!("http://127.0.0.1:{rb_port}");

        let proxy_port = free_port();
        let mut cmd = Command::new(tool("FLOE_PYTHON"));
        cmd.arg(repo_root().join("tests/fixtures/oauth_token_proxy.py"))
            .args(["--port", &proxy_port.to_string()])
            .args(["--upstream", &rustberg_uri])
            .args(["--base-path", BASE_PATH])
            .args(["--scope", SCOPE])
            .args(["--ttl", &policy.ttl_secs.to_string()])
            .args(["--vended-ttl-ms", &policy.vended_ttl_ms.to_string()])
            .arg("--client")
            .arg(format!("{}:{}={ADMIN_KEY}", WRITER.0, WRITER.1))
            .arg("--client")
            .arg(format!("{}:{}={READER_KEY}", READER.0, READER.1));
        let mut proxy = Service::spawn("token-proxy", cmd, dir.path())?;
        proxy.wait_listening(proxy_port, Duration::from_secs(20))?;
        let proxy_addr = format!("127.0.0.1:{proxy_port}");

        Ok(RestStack {
            s3_endpoint,
            rustberg_uri,
            uri: format!("http://{proxy_addr}{BASE_PATH}"),
            proxy_addr,
            _proxy: proxy,
            _rustberg: rustberg,
            _moto: moto,
            dir,
        })
    }

    /// What the token fixture counted: `tokens_issued`, `rejected`, `credential_requests`.
    pub fn token_stats(&self) -> Result<Value> {
        let (status, body) = http("GET", &self.proxy_addr, "/_fixture/stats", "")?;
        if status != 200 {
            bail!("fixture stats: {status} {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }

    /// Makes the token fixture forget every token it issued, as if they had expired.
    pub fn revoke_tokens(&self) -> Result<()> {
        let (status, body) = http("POST", &self.proxy_addr, "/_fixture/revoke", "")?;
        if status != 200 {
            bail!("fixture revoke: {status} {body}");
        }
        Ok(())
    }

    /// The catalog's `[catalogs.NAME]` section, as client `client`.
    pub fn catalog(&self, client: (&str, &str)) -> crate::CatalogSection {
        crate::CatalogSection::rest(&self.uri)
            .warehouse(WAREHOUSE)
            .credential(&format!("{}:{}", client.0, client.1))
            .scope(SCOPE)
            .s3_store(&self.s3_endpoint, "us-east-1")
    }

    /// The `[catalogs.NAME]` section of the catalog as TOML text, for tests that edit
    /// it as text (`s3.*` as dotted keys in the section).
    pub fn catalog_toml(&self, name: &str, client: (&str, &str)) -> String {
        format!(
            r#"
[catalogs.{name}]
type = "rest"
uri = "{uri}"
warehouse = "{WAREHOUSE}"
credential = "{id}:{secret}"
scope = "{SCOPE}"
s3.endpoint = "{s3}"
s3.region = "us-east-1"
s3.path-style-access = true
"#,
            uri = self.uri,
            id = client.0,
            secret = client.1,
            s3 = self.s3_endpoint,
        )
    }

    /// Reads a table through rustberg with an independent reader (`pyiceberg` or `duckdb`).
    pub fn read(
        &self,
        reader: &str,
        namespace: &str,
        table: &str,
        order_by: &str,
    ) -> Result<crate::TableDump> {
        let out = Command::new(tool("FLOE_PYTHON"))
            .arg(repo_root().join("tests/readers/read_table.py"))
            .args(["--reader", reader])
            .args(["--rest-uri", &self.rustberg_uri])
            .args(["--rest-token", ADMIN_KEY])
            .args(["--rest-warehouse", WAREHOUSE])
            .args(["--s3-endpoint", &self.s3_endpoint])
            .args(["--table", &format!("{namespace}.{table}")])
            .args(["--order-by", order_by])
            .output()?;
        if !out.status.success() {
            bail!(
                "{reader} reader failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("reader output is JSON")?;
        Ok(crate::TableDump(v))
    }
}

/// A `[[pipelines]]` section reading `topic` into `namespace.table` of catalog `catalog`
/// (created if missing), committing every second.
pub fn pipeline_toml(
    name: &str,
    bootstrap: &str,
    topic: &str,
    catalog: &str,
    table: (&str, &str),
    dir: &std::path::Path,
) -> String {
    format!(
        r#"
[[pipelines]]
name = "{name}"
[pipelines.source]
bootstrap_servers = "{bootstrap}"
group_id = "floe-{name}"
topics = ["{topic}"]
[pipelines.source.properties]
"session.timeout.ms" = "2000"
"heartbeat.interval.ms" = "500"
[pipelines.sink]
catalog = "{catalog}"
namespace = "{ns}"
table = "{table}"
create_table = true
commit_interval = "1s"
[pipelines.dead_letter]
path = "{dl}"
"#,
        ns = table.0,
        table = table.1,
        dl = dir.join(format!("{name}-dead-letter.ndjson")).display(),
    )
}

pub use crate::{committed_rows, wait_for_rows};

impl RestStack {
    /// Opens the catalog the way the agent does, as client `client`.
    pub async fn open_catalog(
        &self,
        client: (&str, &str),
    ) -> Result<std::sync::Arc<dyn iceberg::Catalog>> {
        let text = self.catalog_toml("probe", client);
        let mut root: toml::Table = toml::from_str(&text)?;
        let section = root
            .remove("catalogs")
            .and_then(|c| c.as_table().and_then(|t| t.get("probe").cloned()))
            .context("catalog section")?;
        let config: floe_iceberg::CatalogConfig = section.try_into()?;
        Ok(floe_iceberg::open_catalog("probe", &config).await?.catalog)
    }
}

/// A SigV4-verifying proxy (`tests/fixtures/sigv4_proxy.py`) in front of rustberg, as
/// AWS Glue's or S3 Tables' Iceberg REST endpoint would be: it recomputes each request's
/// signature with botocore, answers 403 to a wrong or missing one, and forwards the rest
/// with rustberg's own API key.
pub struct SigV4Proxy {
    /// `http://127.0.0.1:PORT`: the catalog URI for Floe.
    pub uri: String,
    addr: String,
    _service: Service,
}

impl RestStack {
    /// Starts a proxy accepting requests signed for `service` in us-east-1 with
    /// `key` (`(access key id, secret)`).
    pub fn sigv4_proxy(&self, service: &str, key: (&str, &str)) -> Result<SigV4Proxy> {
        let port = free_port();
        let mut cmd = Command::new(tool("FLOE_PYTHON"));
        cmd.arg(repo_root().join("tests/fixtures/sigv4_proxy.py"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &self.rustberg_uri])
            .args(["--service", service, "--region", "us-east-1"])
            .args(["--key", &format!("{}:{}", key.0, key.1)])
            .arg("--strip-auth")
            .args([
                "--set-header",
                &format!("Authorization: Bearer {ADMIN_KEY}"),
            ]);
        let mut proxy = Service::spawn("sigv4-proxy", cmd, self.dir.path())?;
        proxy.wait_listening(port, Duration::from_secs(30))?;
        let addr = format!("127.0.0.1:{port}");
        Ok(SigV4Proxy {
            uri: format!("http://{addr}"),
            addr,
            _service: proxy,
        })
    }
}

impl SigV4Proxy {
    /// What the proxy counted: `requests`, `ok`, `rejected`, `by_access_key`, `by_reason`.
    pub fn stats(&self) -> Result<Value> {
        let (status, body) = http("GET", &self.addr, "/__sigv4/stats", "")?;
        if status != 200 {
            bail!("sigv4 proxy stats: {status} {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }
}
