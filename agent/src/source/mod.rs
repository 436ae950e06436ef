//! Source stage: consumes Kafka topics with a consumer group (rdkafka).
//!
//! The pipeline sees a source through [`Source`]: an ordered stream of
//! [`SourceEvent`]s (records, assignments, revocations) and a way to send
//! [`SourceCommand`]s (seek after a rewind, commit group offsets). [`KafkaSource`] is the
//! real one; [`scripted::ScriptedSource`] drives the pipeline in-process tests.
//!
//! Positions come from the Iceberg table, not from the group: when a partition is
//! assigned, the consumer is pointed at the offsets the tables store for it, read fresh
//! through a [`PositionLookup`]; group offsets are committed afterwards, for monitoring only.

mod kafka;
pub mod oauth;
pub mod probe;
pub mod scripted;

use std::collections::BTreeMap;
use std::sync::Arc;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use serde::Deserialize;

pub use kafka::KafkaSource;

use crate::record::{Message, PartitionMap, TopicPartition};

/// Kafka source settings (`[pipelines.source]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Consumer group; group offsets are committed after each Iceberg commit, for monitoring.
    pub group_id: String,
    /// Topics to consume (or use `topic_pattern`).
    #[serde(default)]
    pub topics: Vec<String>,
    /// Regular expression of topics to consume, instead of `topics`.
    pub topic_pattern: Option<String>,
    /// Where a partition with no offsets stored in the table starts.
    #[serde(default)]
    pub start: StartPosition,
    /// `PLAINTEXT` (default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    #[serde(default)]
    pub security_protocol: SecurityProtocol,
    /// SASL credentials, required with the SASL protocols.
    pub sasl: Option<SaslConfig>,
    /// TLS settings for `SSL` and `SASL_SSL` (without it, the system's CA certificates).
    pub tls: Option<TlsConfig>,
    /// Extra librdkafka properties, passed through as they are (e.g. `ssl.ca.location`).
    #[serde(default)]
    /// Values may hold secrets (`sasl.jaas.config`, `ssl.key.password`): `Debug`
    /// shows the property names only.
    pub properties: crate::settings::Redacted<BTreeMap<String, String>>,
}

/// Start position for partitions the table has no offsets for.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The oldest retained message.
    #[default]
    Earliest,
    /// Only messages produced after the pipeline first starts.
    Latest,
}

/// Kafka security protocol.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    #[default]
    #[serde(rename = "PLAINTEXT")]
    Plaintext,
    /// TLS without SASL.
    #[serde(rename = "SSL")]
    Ssl,
    /// SASL over plain TCP.
    #[serde(rename = "SASL_PLAINTEXT")]
    SaslPlaintext,
    /// SASL over TLS.
    #[serde(rename = "SASL_SSL")]
    SaslSsl,
}

/// SASL credentials.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslConfig {
    /// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` (OIDC client
    /// credentials) or `AWS_MSK_IAM`.
    pub mechanism: SaslMechanism,
    /// User name (PLAIN, SCRAM).
    pub username: Option<String>,
    /// Password (PLAIN, SCRAM); use `${ENV_VAR}` to keep it out of the file.
    pub password: Option<String>,
    /// OAUTHBEARER: the OIDC token endpoint (client-credentials grant).
    pub token_endpoint: Option<String>,
    /// OAUTHBEARER: client id.
    pub client_id: Option<String>,
    /// OAUTHBEARER: client secret; use `${ENV_VAR}`.
    pub client_secret: Option<String>,
    /// OAUTHBEARER: requested scope.
    pub scope: Option<String>,
    /// AWS_MSK_IAM: the cluster's region (default `aws.region`, then `AWS_REGION`).
    pub region: Option<String>,
    /// AWS_MSK_IAM: how the agent finds its AWS identity (profile, role to assume).
    #[serde(default)]
    pub aws: floe_iceberg::aws::AwsSettings,
}

impl std::fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("SaslConfig")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &hidden(&self.password))
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &hidden(&self.client_secret))
            .field("scope", &self.scope)
            .field("region", &self.region)
            .field("aws", &self.aws)
            .finish()
    }
}

impl SaslConfig {
    /// The MSK IAM region.
    fn msk_region(&self) -> Option<String> {
        self.aws.region_or_env(&[self.region.as_ref()])
    }

    /// Problems serde cannot see: the fields each mechanism needs.
    fn problems(&self) -> Vec<(String, String)> {
        let needed: &[(&str, &Option<String>)] = match self.mechanism {
            SaslMechanism::Plain | SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
                &[("username", &self.username), ("password", &self.password)]
            }
            SaslMechanism::OauthBearer => &[
                ("token_endpoint", &self.token_endpoint),
                ("client_id", &self.client_id),
                ("client_secret", &self.client_secret),
            ],
            SaslMechanism::AwsMskIam => &[],
        };
        let mut out: Vec<(String, String)> = needed
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| {
                (
                    format!("sasl.{k}"),
                    format!("required with mechanism {:?}", self.mechanism),
                )
            })
            .collect();
        if self.mechanism == SaslMechanism::AwsMskIam && self.msk_region().is_none() {
            out.push((
                "sasl.region".into(),
                "AWS_MSK_IAM needs the cluster's region (region, aws.region or AWS_REGION)".into(),
            ));
        }
        out
    }
}

/// TLS to the brokers.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA certificates that sign the brokers' certificates.
    pub ca_file: Option<String>,
    /// PEM client certificate, for brokers that require one (mutual TLS).
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
    /// Password of `key_file`, if it is encrypted.
    pub key_password: Option<String>,
    /// Check that the broker's certificate names the host connected to (default true).
    #[serde(default = "yes")]
    pub verify_hostname: bool,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field(
                "key_password",
                &self.key_password.as_ref().map(|_| "<redacted>"),
            )
            .field("verify_hostname", &self.verify_hostname)
            .finish()
    }
}

/// SASL mechanism.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum SaslMechanism {
    /// Plain user name and password.
    #[serde(rename = "PLAIN")]
    Plain,
    /// SCRAM with SHA-256.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// SCRAM with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    /// OAuth2 bearer tokens from an OIDC token endpoint (client credentials).
    #[serde(rename = "OAUTHBEARER")]
    OauthBearer,
    /// Amazon MSK IAM authentication with the agent's AWS identity.
    #[serde(rename = "AWS_MSK_IAM")]
    AwsMskIam,
}

impl SourceConfig {
    /// Whether the pipeline consumes `topic`: one of `topics`, or a match of
    /// `topic_pattern` anchored at the start, as librdkafka's subscription anchors it.
    pub fn consumes(&self, topic: &str) -> bool {
        match &self.topic_pattern {
            Some(p) => regex::Regex::new(&format!("^(?:{})", p.trim_start_matches('^')))
                .is_ok_and(|re| re.is_match(topic)),
            None => self.topics.iter().any(|t| t == topic),
        }
    }

    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        match (self.topics.is_empty(), &self.topic_pattern) {
            (true, None) => out.push(("topics".into(), "set `topics` or `topic_pattern`".into())),
            (false, Some(_)) => out.push((
                "topic_pattern".into(),
                "set either `topics` or `topic_pattern`, not both".into(),
            )),
            (_, Some(p)) => {
                if let Err(e) = regex::Regex::new(p) {
                    out.push((
                        "topic_pattern".into(),
                        format!("invalid regular expression: {e}"),
                    ));
                }
            }
            _ => {}
        }
        if self.bootstrap_servers.trim().is_empty() {
            out.push(("bootstrap_servers".into(), "must not be empty".into()));
        }
        if self.group_id.trim().is_empty() {
            out.push(("group_id".into(), "must not be empty".into()));
        }
        let needs_sasl = matches!(
            self.security_protocol,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        );
        if needs_sasl && self.sasl.is_none() {
            out.push((
                "sasl".into(),
                "required with SASL_PLAINTEXT and SASL_SSL".into(),
            ));
        }
        if let Some(sasl) = &self.sasl {
            out.extend(sasl.problems());
        }
        if !needs_sasl && self.sasl.is_some() {
            out.push((
                "sasl".into(),
                "only used with SASL_PLAINTEXT or SASL_SSL".into(),
            ));
        }
        if let Some(tls) = &self.tls {
            if !matches!(
                self.security_protocol,
                SecurityProtocol::Ssl | SecurityProtocol::SaslSsl
            ) {
                out.push((
                    "tls".into(),
                    "only used with security_protocol SSL or SASL_SSL".into(),
                ));
            }
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                out.push(("tls".into(), "cert_file and key_file go together".into()));
            }
            for (key, file) in [
                ("tls.ca_file", &tls.ca_file),
                ("tls.cert_file", &tls.cert_file),
                ("tls.key_file", &tls.key_file),
            ] {
                if let Some(f) = file
                    && !std::path::Path::new(f).is_file()
                {
                    out.push((key.into(), format!("no such file: {f}")));
                }
            }
        }
        for (key, _) in &self.properties {
            if let Some(why) = managed_property(key) {
                out.push((format!("properties.{key}"), why.to_string()));
            }
        }
        out
    }

    /// Where the clients get OAUTHBEARER tokens, for `OAUTHBEARER` and `AWS_MSK_IAM`.
    pub fn token_source(&self) -> Option<Arc<oauth::TokenSource>> {
        let sasl = self.sasl.as_ref()?;
        match sasl.mechanism {
            SaslMechanism::OauthBearer => Some(Arc::new(oauth::TokenSource::Oidc {
                endpoint: sasl.token_endpoint.clone()?,
                client_id: sasl.client_id.clone()?,
                client_secret: floe_iceberg::redact::Secret::new(sasl.client_secret.clone()?),
                scope: sasl.scope.clone(),
            })),
            SaslMechanism::AwsMskIam => Some(Arc::new(oauth::TokenSource::msk_iam(
                sasl.msk_region()?,
                sasl.aws.clone(),
            ))),
            _ => None,
        }
    }

    /// A client configuration for producing to the same brokers (the dead-letter
    /// topic): the brokers and security settings, without the consumer's.
    pub fn producer_config(&self) -> ClientConfig {
        let mut c = self.client_config();
        for key in [
            "group.id",
            "enable.auto.commit",
            "enable.auto.offset.store",
            "enable.partition.eof",
            "isolation.level",
            "statistics.interval.ms",
            "partition.assignment.strategy",
            "auto.offset.reset",
            "queued.max.messages.kbytes",
            "fetch.queue.backoff.ms",
        ] {
            c.remove(key);
        }
        c
    }

    /// The librdkafka client configuration for this source.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("group.id", &self.group_id)
            // Positions come from the table; group offsets are written by us after each commit.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            // Statistics carry per-partition consumer lag for the metrics.
            .set("statistics.interval.ms", "5000")
            // Partitions move between agents one by one, without stopping the group.
            .set("partition.assignment.strategy", "cooperative-sticky")
            // An offset below the log start (retention, DeleteRecords) resumes at the
            // oldest record, never silently at the end.
            .set("auto.offset.reset", "earliest")
            // Prefetched messages are bounded: memory stays flat when the pipeline is slow.
            .set("queued.max.messages.kbytes", "8192")
            // ... and fetching resumes quickly once the pipeline takes more: librdkafka's
            // default waits a whole second after its queue was full, which stalls reading
            // every time the pipeline was briefly behind.
            .set("fetch.queue.backoff.ms", "20")
            .set(
                "security.protocol",
                match self.security_protocol {
                    SecurityProtocol::Plaintext => "plaintext",
                    SecurityProtocol::Ssl => "ssl",
                    SecurityProtocol::SaslPlaintext => "sasl_plaintext",
                    SecurityProtocol::SaslSsl => "sasl_ssl",
                },
            );
        if let Some(sasl) = &self.sasl {
            let mechanism = match sasl.mechanism {
                SaslMechanism::Plain => "PLAIN",
                SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
                SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
                // Tokens come from the client context (see `oauth`).
                SaslMechanism::OauthBearer | SaslMechanism::AwsMskIam => "OAUTHBEARER",
            };
            c.set("sasl.mechanism", mechanism);
            if let (Some(user), Some(password)) = (&sasl.username, &sasl.password) {
                c.set("sasl.username", user).set("sasl.password", password);
            }
        }
        if let Some(tls) = &self.tls {
            let files = [
                ("ssl.ca.location", &tls.ca_file),
                ("ssl.certificate.location", &tls.cert_file),
                ("ssl.key.location", &tls.key_file),
                ("ssl.key.password", &tls.key_password),
            ];
            for (key, value) in files {
                if let Some(v) = value {
                    c.set(key, v);
                }
            }
            c.set(
                "ssl.endpoint.identification.algorithm",
                if tls.verify_hostname { "https" } else { "none" },
            );
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// Why a librdkafka property cannot be set through `properties`: Floe sets it because
/// exactly-once depends on it (or it has its own setting).
pub fn managed_property(key: &str) -> Option<&'static str> {
    Some(match key {
        "bootstrap.servers" | "metadata.broker.list" => "set by `bootstrap_servers`",
        "group.id" => "set by `group_id`",
        "security.protocol" => "set by `security_protocol`",
        "enable.auto.commit" | "enable.auto.offset.store" => {
            "managed by Floe: group offsets are committed only after the Iceberg commit that covers them"
        }
        "auto.offset.reset" => {
            "managed by Floe (`earliest`): a stored offset below the log start must resume at the oldest record and be recorded as a gap, never jump to the end; use `start` for where a new partition begins"
        }
        "isolation.level" => {
            "managed by Floe (`read_committed`): records of aborted transactions must not become rows"
        }
        "enable.partition.eof" => "managed by Floe",
        _ => return None,
    })
}

/// Errors of the source stage.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The brokers did not answer a metadata request.
    #[error("cannot reach Kafka brokers at {servers}: {source}")]
    Unreachable {
        /// The configured bootstrap servers.
        servers: String,
        /// What librdkafka said.
        source: KafkaError,
    },
    /// The brokers refused the client's identity, or the TLS handshake failed: a
    /// setting to fix, not an outage to wait out.
    #[error("{0}")]
    Refused(String),
    /// A configured topic does not exist on the cluster.
    #[error("topic {0:?} does not exist on the Kafka cluster")]
    MissingTopic(String),
    /// The consumer could not be created or subscribed.
    #[error("Kafka consumer error: {0}")]
    Kafka(#[from] KafkaError),
    /// The consumer thread stopped unexpectedly.
    #[error("Kafka consumer thread stopped: {0}")]
    Stopped(String),
}

/// Where each assigned partition starts: the position the consumer was set to
/// (`None`: the configured start) and what each table stores for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The partition.
    pub tp: TopicPartition,
    /// Where reading starts.
    pub position: Option<i64>,
    /// Per table of the pipeline (in pipeline order): the next offset it stores.
    pub stored: Vec<Option<i64>>,
}

/// Reads where assigned partitions continue, from the tables (fresh) or, when the
/// catalog cannot be asked in time, from the last known offsets.
pub trait PositionLookup: Send + Sync {
    /// Positions of `tps`, in the same order.
    fn lookup(&self, tps: &[TopicPartition]) -> Vec<Assignment>;
}

/// What a source tells the pipeline, in order.
#[derive(Debug)]
pub enum SourceEvent {
    /// Messages polled from the assigned partitions, tagged with the seek epoch they
    /// belong to (see [`SourceCommand::Seek`]).
    Records(u64, Vec<Message>),
    /// Partitions were added to this consumer, positioned as given.
    Assigned(Vec<Assignment>),
    /// Partitions were taken away: their uncommitted records must be dropped.
    Revoked(Vec<TopicPartition>),
    /// The offset stored for a partition was below the log start: reading resumed at
    /// the oldest record, `skipped` records were lost to retention.
    Gap {
        /// The partition.
        tp: TopicPartition,
        /// The stored offset.
        expected: i64,
        /// The first offset actually read.
        found: i64,
    },
    /// A partition's log restarted below its stored offset (a recreated topic, an
    /// unclean leader election): its end was below the stored offset when it was
    /// assigned, or the first record read after positioning it was. Records below the
    /// stored offset are skipped.
    Reset {
        /// The partition.
        tp: TopicPartition,
        /// The stored offset.
        expected: i64,
        /// The end of the log, or the first offset read.
        found: i64,
    },
    /// The consumer hit an error it cannot continue after.
    Failed(String),
}

/// What the pipeline asks of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceCommand {
    /// Re-position these partitions (after a fenced commit or a rewind); `None` means
    /// the start position. Records polled afterwards carry the new `epoch`, so the
    /// pipeline can ignore the ones that were already on their way.
    Seek {
        /// The epoch of records read after the seek.
        epoch: u64,
        /// Where each partition continues.
        positions: Vec<(TopicPartition, Option<i64>)>,
    },
    /// Commit these next-offsets to the consumer group (monitoring only).
    CommitGroupOffsets(Vec<(TopicPartition, i64)>),
}

/// A source of records for one pipeline.
pub trait Source: Send {
    /// Events, in order.
    fn events(&self) -> &crossbeam_channel::Receiver<SourceEvent>;
    /// Sends a command; it is applied before later records are delivered.
    fn command(&self, command: SourceCommand);
    /// Stops the source and leaves the group.
    fn shutdown(self: Box<Self>);
}

/// The offset a partition continues at: the smallest next offset any table stores for
/// it; `None` (the configured start) when a table that exists has none for it.
pub fn resume_position(stored: &[Option<i64>], exists: &[bool]) -> Option<i64> {
    let mut min: Option<i64> = None;
    for (s, e) in stored.iter().zip(exists) {
        match s {
            Some(o) => min = Some(min.map_or(*o, |m| m.min(*o))),
            None if *e => return None,
            None => {}
        }
    }
    min
}

/// Keeps the last known offsets per partition for the lookup to fall back on.
pub type KnownOffsets = std::sync::Mutex<PartitionMap<Vec<Option<i64>>>>;

/// What to tell the user when the brokers refuse the client's identity or the TLS
/// handshake fails: settings to fix, not a broker outage to wait out.
pub(crate) fn security_failure(e: &KafkaError) -> Option<&'static str> {
    use rdkafka::error::RDKafkaErrorCode as C;
    match e.rdkafka_error_code()? {
        C::Authentication | C::SaslAuthenticationFailed => Some(
            "the brokers refused the credentials: check [sasl] (mechanism, username and password, or the token settings)",
        ),
        C::SSL => Some(
            "the TLS handshake with a broker failed: check tls.ca_file (the CA that signed the broker's certificate), the host name in bootstrap_servers and the client certificate",
        ),
        C::TopicAuthorizationFailed | C::GroupAuthorizationFailed => {
            Some("the brokers deny this identity access to the topic or consumer group (ACLs)")
        }
        _ => None,
    }
}

/// A failed metadata request says only "transport failure"; a refused login or a failed
/// TLS handshake arrives as a separate error event, delivered when the consumer is
/// polled, possibly a little later. Polls for up to two seconds for one, asking
/// `recorded` after each poll for what the client context's error callback kept.
pub(crate) fn why_refused<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    recorded: impl Fn() -> Option<String>,
) -> Option<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        if let Some(Err(e)) = consumer.poll(std::time::Duration::from_millis(100))
            && let Some(what) = security_failure(&e)
        {
            return Some(format!("{what} ({e})"));
        }
        if let Some(reason) = recorded() {
            return Some(reason);
        }
    }
    None
}

pub(crate) fn is_fatal(e: &KafkaError) -> bool {
    security_failure(e).is_some()
        || e.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::Fatal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SourceConfig {
        toml::from_str("bootstrap_servers = \"127.0.0.1:9092\"\ngroup_id = \"g\"\ntopics = [\"t\"]")
            .unwrap()
    }

    #[test]
    fn topics_and_pattern_are_exclusive() {
        let mut c = base();
        assert!(c.problems().is_empty());
        c.topic_pattern = Some("t.*".into());
        assert_eq!(c.problems()[0].0, "topic_pattern");
        c.topics.clear();
        assert!(c.problems().is_empty());
        c.topic_pattern = Some("(".into());
        assert!(c.problems()[0].1.contains("invalid regular expression"));
    }

    #[test]
    fn sasl_protocols_need_credentials() {
        let mut c = base();
        c.security_protocol = SecurityProtocol::SaslSsl;
        assert_eq!(c.problems()[0].0, "sasl");
        let c: SourceConfig = toml::from_str(
            "bootstrap_servers = \"b:9093\"\ngroup_id = \"g\"\ntopics = [\"t\"]\nsecurity_protocol = \"SASL_SSL\"\n[sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"u\"\npassword = \"hunter2-pass\"",
        )
        .unwrap();
        assert!(c.problems().is_empty());
        let cc = c.client_config();
        assert_eq!(cc.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(cc.get("security.protocol"), Some("sasl_ssl"));
        assert!(
            !format!("{c:?}").contains("hunter2"),
            "password must not be printed"
        );
    }

    #[test]
    fn oauthbearer_needs_a_token_endpoint_and_client() {
        let head = "bootstrap_servers = \"b:9093\"\ngroup_id = \"g\"\ntopics = [\"t\"]\nsecurity_protocol = \"SASL_SSL\"\n[sasl]\n";
        let c: SourceConfig = toml::from_str(&format!(
            "{head}mechanism = \"OAUTHBEARER\"\nclient_id = \"id\""
        ))
        .unwrap();
        let fields: Vec<String> = c.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(fields, ["sasl.token_endpoint", "sasl.client_secret"]);
        let c: SourceConfig = toml::from_str(&format!(
            "{head}mechanism = \"OAUTHBEARER\"\ntoken_endpoint = \"https://idp/token\"\nclient_id = \"id\"\nclient_secret = \"hunter2-pass\""
        ))
        .unwrap();
        assert!(c.problems().is_empty());
        assert_eq!(c.client_config().get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert!(c.token_source().is_some());
        assert!(!format!("{c:?}").contains("hunter2"));
        let c: SourceConfig = toml::from_str(&format!(
            "{head}mechanism = \"AWS_MSK_IAM\"\nregion = \"eu-west-1\""
        ))
        .unwrap();
        assert!(c.problems().is_empty());
        assert!(c.token_source().is_some());
    }

    #[test]
    fn properties_floe_relies_on_cannot_be_overridden() {
        let c: SourceConfig = toml::from_str(
            "bootstrap_servers = \"b:9092\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n[properties]\n\"auto.offset.reset\" = \"latest\"\n\"enable.auto.commit\" = \"true\"\n\"fetch.max.bytes\" = \"1048576\"",
        )
        .unwrap();
        let problems = c.problems();
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "properties.auto.offset.reset",
                "properties.enable.auto.commit"
            ]
        );
        assert!(problems[0].1.contains("oldest record"), "{problems:?}");
        assert_eq!(
            c.client_config().get("auto.offset.reset"),
            Some("latest"),
            "(the config is refused before a client is made from it)"
        );
        let mut ok = c.clone();
        ok.properties.retain(|k, _| k == "fetch.max.bytes");
        assert!(ok.problems().is_empty());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let r: Result<SourceConfig, _> = toml::from_str(
            "bootstrap_servers = \"b\"\ngroup_id = \"g\"\ntopics = [\"t\"]\ntopicz = 1",
        );
        assert!(r.unwrap_err().to_string().contains("topicz"));
    }
}
