//! A dead-letter topic beside the file: each record the file takes is also produced to a
//! Kafka topic with its original key and value, and the reason in headers (the
//! convention of Kafka Connect's dead-letter queues), so dead letters outlive a pod
//! whose disk goes with it.
//!
//! Produced with an idempotent producer (`acks=all`); [`DeadLetterTopic::flush`] runs
//! with the file's sync, before any commit moves offsets past the records, and fails if
//! a record was not delivered. The topic is at least once: a record read again after a
//! crash or a rewind may be produced again (the file keeps each one once); headers carry
//! the source topic, partition and offset to tell copies apart.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use crate::record::Message;

/// How long a flush may wait for the broker to acknowledge what was produced.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// Header names (prefixed like Kafka Connect's `__connect.errors.*`).
const STAGE: &str = "floe.error.stage";
const REASON: &str = "floe.error.reason";
const PIPELINE: &str = "floe.error.pipeline";
const TOPIC: &str = "floe.error.topic";
const PARTITION: &str = "floe.error.partition";
const OFFSET: &str = "floe.error.offset";

/// Why the records queued for the dead-letter topic are not all acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The producer did not flush its queue (in time).
    #[error("dead-letter topic {topic}: {source}")]
    Flush {
        /// The dead-letter topic.
        topic: String,
        /// The producer's error.
        source: KafkaError,
    },
    /// A thread panicked while recording a delivery.
    #[error("delivery state poisoned")]
    Poisoned,
    /// A record was refused or timed out (after librdkafka's retries).
    #[error("dead-letter topic {topic}: a record was not delivered: {source}")]
    Undelivered {
        /// The dead-letter topic.
        topic: String,
        /// The first failed delivery's error.
        source: KafkaError,
    },
}

/// Keeps the first failed delivery until the next flush reports it.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<KafkaError>>,
    tokens: crate::source::oauth::ContextTokens,
}

impl rdkafka::ClientContext for Deliveries {
    crate::source::oauth::oauth_context!(tokens);
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result
            && let Ok(mut failed) = self.failed.lock()
        {
            failed.get_or_insert_with(|| e.clone());
        }
    }
}

/// The producer of one pipeline's dead-letter topic.
pub struct DeadLetterTopic {
    topic: String,
    producer: BaseProducer<Deliveries>,
}

impl DeadLetterTopic {
    /// A producer of `topic` with `client` (the source's brokers and security settings).
    /// `tokens`: where OAUTHBEARER tokens come from, when the source uses them.
    pub fn new(
        topic: &str,
        mut client: ClientConfig,
        tokens: Option<std::sync::Arc<crate::source::oauth::TokenSource>>,
    ) -> Result<DeadLetterTopic, KafkaError> {
        client
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", FLUSH_TIMEOUT.as_millis().to_string());
        Ok(DeadLetterTopic {
            topic: topic.to_string(),
            producer: client.create_with_context(Deliveries {
                tokens: crate::source::oauth::ContextTokens::new(tokens),
                ..Deliveries::default()
            })?,
        })
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Queues one rejected record (delivered by [`DeadLetterTopic::flush`] at the latest).
    pub fn send(
        &self,
        pipeline: &str,
        record: &Message,
        stage: &str,
        reason: &str,
    ) -> Result<(), KafkaError> {
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        // The record's own headers first, then the reason.
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 6);
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        let headers = headers
            .insert(header(STAGE, stage))
            .insert(header(REASON, reason))
            .insert(header(PIPELINE, pipeline))
            .insert(header(TOPIC, &record.topic))
            .insert(header(PARTITION, &partition))
            .insert(header(OFFSET, &offset));
        let mut out: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).headers(headers);
        if let Some(k) = &record.key {
            out = out.key(k.as_slice());
        }
        if let Some(v) = &record.value {
            out = out.payload(v.as_slice());
        }
        if let Some(ts) = record.timestamp_ms {
            out = out.timestamp(ts);
        }
        loop {
            match self.producer.send(out) {
                Ok(()) => return Ok(()),
                // The local queue is full: serve deliveries and try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    self.producer.poll(Duration::from_millis(100));
                    out = back;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits until everything queued is acknowledged; fails if a record was not.
    pub fn flush(&self) -> Result<(), FlushError> {
        self.producer
            .flush(FLUSH_TIMEOUT)
            .map_err(|source| FlushError::Flush {
                topic: self.topic.clone(),
                source,
            })?;
        let failed = self
            .producer
            .context()
            .failed
            .lock()
            .map_err(|_| FlushError::Poisoned)?
            .take();
        match failed {
            Some(source) => Err(FlushError::Undelivered {
                topic: self.topic.clone(),
                source,
            }),
            None => Ok(()),
        }
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a [u8]> {
    Header {
        key,
        value: Some(value.as_bytes()),
    }
}
