//! Source stage: consumes Kafka topics with a consumer group (rdkafka).
//!
//! A dedicated thread polls a `BaseConsumer` and hands records to the pipeline in
//! batches over a bounded channel, so the async side never blocks on librdkafka.
//! Positions come from the Iceberg table, not from the group: on every partition
//! assignment the consumer is pointed at the offsets stored in the table's snapshots
//! (shared through [`Positions`]); group offsets are committed afterwards for monitoring only.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Deserialize;
use tokio::sync::mpsc;

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
    /// Extra librdkafka properties, passed through as they are (e.g. `ssl.ca.location`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
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
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: SaslMechanism,
    /// User name.
    pub username: String,
    /// Password; use `${ENV_VAR}` to keep it out of the file.
    pub password: String,
}

impl std::fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslConfig")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<redacted>")
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
}

impl SourceConfig {
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
        if !needs_sasl && self.sasl.is_some() {
            out.push((
                "sasl".into(),
                "only used with SASL_PLAINTEXT or SASL_SSL".into(),
            ));
        }
        out
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
            };
            c.set("sasl.mechanism", mechanism)
                .set("sasl.username", &sasl.username)
                .set("sasl.password", &sasl.password);
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
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

/// A topic-partition.
pub type TopicPartition = (Arc<str>, i32);

/// A map keyed by topic-partition. Looked up for every record, so it uses a fast
/// (non-DoS-resistant) hasher; the keys come from the broker, not from message data.
pub type PartitionMap<V> = HashMap<TopicPartition, V, foldhash::fast::RandomState>;

/// Next offset to read per topic-partition, as stored in the table.
#[derive(Debug, Default)]
pub struct Positions(Mutex<PartitionMap<i64>>);

impl Positions {
    /// Replaces every stored position.
    pub fn replace(&self, positions: PartitionMap<i64>) {
        *self.0.lock().expect("positions lock") = positions;
    }
    /// Sets some positions, keeping the others.
    pub fn update<'a>(&self, positions: impl IntoIterator<Item = (&'a TopicPartition, &'a i64)>) {
        let mut map = self.0.lock().expect("positions lock");
        for (tp, o) in positions {
            map.insert(tp.clone(), *o);
        }
    }
    fn get(&self, topic: &str, partition: i32) -> Option<i64> {
        let map = self.0.lock().expect("positions lock");
        map.get(&(Arc::from(topic), partition)).copied()
    }
}

/// One Kafka message, with everything the dead-letter path and the metadata columns need.
#[derive(Debug, Clone)]
pub struct KafkaRecord {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Message timestamp in milliseconds since the epoch, if the broker gave one.
    pub timestamp_ms: Option<i64>,
    /// Message key bytes.
    pub key: Option<Vec<u8>>,
    /// Message value bytes; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
}

/// What the consumer thread tells the pipeline, in order.
#[derive(Debug)]
pub enum SourceEvent {
    /// Records polled from the assigned partitions, tagged with the seek epoch they belong to.
    Records(u64, Vec<KafkaRecord>),
    /// Partitions were assigned, positioned at the stored offsets.
    Assigned(Vec<TopicPartition>),
    /// All partitions were revoked: uncommitted records must be dropped.
    Revoked,
    /// The consumer hit an error it cannot continue after.
    Failed(String),
}

/// What the pipeline asks of the consumer thread.
#[derive(Debug)]
pub enum SourceCommand {
    /// Re-position these partitions (after a fenced commit or a plugin fault); `None`
    /// means the start position. Records polled afterwards carry the new `epoch`, so
    /// the pipeline can ignore the ones that were already on their way.
    Seek {
        /// The epoch of records read after the seek.
        epoch: u64,
        /// Where each partition continues.
        positions: Vec<(TopicPartition, Option<i64>)>,
    },
    /// Commit these next-offsets to the consumer group (monitoring only).
    CommitGroupOffsets(Vec<(TopicPartition, i64)>),
}

struct Context {
    pipeline: String,
    positions: Arc<Positions>,
    start: StartPosition,
    events: mpsc::Sender<SourceEvent>,
}

impl ClientContext for Context {
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                // librdkafka reports -1 for partitions it does not fetch (and the internal -1 partition).
                if *partition >= 0 && p.consumer_lag >= 0 {
                    crate::telemetry::consumer_lag(
                        &self.pipeline,
                        topic,
                        *partition,
                        p.consumer_lag,
                    );
                }
            }
        }
    }
}

impl ConsumerContext for Context {
    // Assignments are positioned from the table's offsets; only safe rdkafka calls are used.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut assigned = Vec::new();
                for elem in tpl.elements() {
                    assigned.push((Arc::<str>::from(elem.topic()), elem.partition()));
                }
                for (topic, partition) in &assigned {
                    let offset = match self.positions.get(topic, *partition) {
                        Some(o) => Offset::Offset(o),
                        None if self.start == StartPosition::Earliest => Offset::Beginning,
                        None => Offset::End,
                    };
                    if let Err(e) = tpl.set_partition_offset(topic, *partition, offset) {
                        tracing::error!(pipeline = %self.pipeline, %topic, partition, error = %e, "cannot set start offset");
                    }
                }
                tracing::info!(pipeline = %self.pipeline, partitions = assigned.len(), "partitions assigned");
                if let Err(e) = consumer.assign(tpl) {
                    let _ = self
                        .events
                        .blocking_send(SourceEvent::Failed(format!("assign failed: {e}")));
                    return;
                }
                let _ = self.events.blocking_send(SourceEvent::Assigned(assigned));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::info!(pipeline = %self.pipeline, "partitions revoked");
                let _ = self.events.blocking_send(SourceEvent::Revoked);
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(pipeline = %self.pipeline, error = %e, "unassign failed");
                }
            }
            other => {
                tracing::error!(pipeline = %self.pipeline, error = ?other, "rebalance error");
                let _ = self.events.blocking_send(SourceEvent::Revoked);
                let _ = consumer.unassign();
            }
        }
    }
}

/// Handle to a running consumer thread.
pub struct KafkaSource {
    /// Events from the consumer, in order.
    pub events: mpsc::Receiver<SourceEvent>,
    commands: std::sync::mpsc::Sender<SourceCommand>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How many records one event carries at most.
const MAX_EVENT_RECORDS: usize = 4096;

impl KafkaSource {
    /// Checks the brokers and topics, subscribes and starts the consumer thread.
    pub fn start(
        pipeline: &str,
        config: &SourceConfig,
        positions: Arc<Positions>,
    ) -> Result<KafkaSource, SourceError> {
        let (tx, rx) = mpsc::channel(16);
        let context = Context {
            pipeline: pipeline.to_string(),
            positions,
            start: config.start,
            events: tx.clone(),
        };
        let consumer: BaseConsumer<Context> =
            config.client_config().create_with_context(context)?;
        let metadata = consumer
            .fetch_metadata(None, Duration::from_secs(15))
            .map_err(|source| SourceError::Unreachable {
                servers: config.bootstrap_servers.clone(),
                source,
            })?;
        for topic in &config.topics {
            let found = metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
            if !found {
                return Err(SourceError::MissingTopic(topic.clone()));
            }
        }
        match &config.topic_pattern {
            // librdkafka treats a subscription starting with '^' as a regex.
            Some(p) => consumer.subscribe(&[&format!("^{}", p.trim_start_matches('^'))])?,
            None => {
                consumer.subscribe(&config.topics.iter().map(String::as_str).collect::<Vec<_>>())?
            }
        }
        let (cmd_tx, cmd_rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let name = pipeline.to_string();
        let start = config.start;
        let thread = std::thread::Builder::new()
            .name(format!("floe-source-{pipeline}"))
            .spawn(move || poll_loop(&name, consumer, tx, cmd_rx, &thread_stop, start))
            .map_err(|e| SourceError::Stopped(e.to_string()))?;
        Ok(KafkaSource {
            events: rx,
            commands: cmd_tx,
            stop,
            thread: Some(thread),
        })
    }

    /// Sends a command to the consumer thread.
    pub fn command(&self, command: SourceCommand) {
        let _ = self.commands.send(command);
    }

    /// Stops the consumer thread and waits for it to leave the group.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Unblock the thread if it waits for channel space.
        self.events.close();
        while self.events.try_recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn poll_loop(
    pipeline: &str,
    consumer: BaseConsumer<Context>,
    events: mpsc::Sender<SourceEvent>,
    commands: std::sync::mpsc::Receiver<SourceCommand>,
    stop: &AtomicBool,
    start: StartPosition,
) {
    let mut topics: HashMap<String, Arc<str>> = HashMap::new();
    let mut epoch = 0;
    while !stop.load(Ordering::SeqCst) {
        while let Ok(cmd) = commands.try_recv() {
            run_command(pipeline, &consumer, cmd, start, &mut epoch);
        }
        let mut batch = Vec::new();
        let mut timeout = Duration::from_millis(100);
        while batch.len() < MAX_EVENT_RECORDS {
            match consumer.poll(timeout) {
                None => break,
                Some(Ok(m)) => {
                    let topic = match topics.get(m.topic()) {
                        Some(t) => t.clone(),
                        None => {
                            let t: Arc<str> = Arc::from(m.topic());
                            topics.insert(m.topic().to_string(), t.clone());
                            t
                        }
                    };
                    batch.push(KafkaRecord {
                        topic,
                        partition: m.partition(),
                        offset: m.offset(),
                        timestamp_ms: m.timestamp().to_millis(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                    });
                }
                Some(Err(e)) => {
                    if is_fatal(&e) {
                        let _ = events.blocking_send(SourceEvent::Failed(e.to_string()));
                        return;
                    }
                    tracing::warn!(pipeline, error = %e, "Kafka consumer error (librdkafka retries)");
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        if !batch.is_empty()
            && events
                .blocking_send(SourceEvent::Records(epoch, batch))
                .is_err()
        {
            break;
        }
    }
    consumer.unsubscribe();
}

fn run_command(
    pipeline: &str,
    consumer: &BaseConsumer<Context>,
    cmd: SourceCommand,
    start: StartPosition,
    epoch: &mut u64,
) {
    match cmd {
        SourceCommand::Seek {
            epoch: new_epoch,
            positions,
        } => {
            *epoch = new_epoch;
            for ((topic, partition), offset) in positions {
                let to = match (offset, start) {
                    (Some(o), _) => Offset::Offset(o),
                    (None, StartPosition::Earliest) => Offset::Beginning,
                    (None, StartPosition::Latest) => Offset::End,
                };
                if let Err(e) = consumer.seek(&topic, partition, to, Duration::from_secs(10)) {
                    tracing::warn!(pipeline, %topic, partition, ?offset, error = %e, "seek failed");
                }
            }
        }
        SourceCommand::CommitGroupOffsets(list) => {
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), offset) in &list {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
            }
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                tracing::debug!(pipeline, error = %e, "group offset commit failed (monitoring only)");
            }
        }
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::Fatal
                | C::SaslAuthenticationFailed
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::Authentication
        )
    )
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
            "bootstrap_servers = \"b:9093\"\ngroup_id = \"g\"\ntopics = [\"t\"]\nsecurity_protocol = \"SASL_SSL\"\n[sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"u\"\npassword = \"secret\"",
        )
        .unwrap();
        assert!(c.problems().is_empty());
        let cc = c.client_config();
        assert_eq!(cc.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(cc.get("security.protocol"), Some("sasl_ssl"));
        assert!(
            !format!("{c:?}").contains("secret"),
            "password must not be printed"
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let r: Result<SourceConfig, _> = toml::from_str(
            "bootstrap_servers = \"b\"\ngroup_id = \"g\"\ntopics = [\"t\"]\ntopicz = 1",
        );
        assert!(r.unwrap_err().to_string().contains("topicz"));
    }
}
