//! Probing the brokers and topics for `floe check`.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::SourceConfig;
use crate::probe::{Outcome, Steps};

const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Keeps the first security failure librdkafka reports while probing.
#[derive(Default)]
struct ProbeContext {
    refused: std::sync::Mutex<Option<String>>,
    tokens: super::oauth::ContextTokens,
}

impl rdkafka::ClientContext for ProbeContext {
    super::oauth::oauth_context!(tokens);

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if let Some(what) = super::security_failure(&error)
            && let Ok(mut refused) = self.refused.lock()
        {
            refused.get_or_insert_with(|| format!("{what} ({reason})"));
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ProbeContext {}

/// Asks the brokers for metadata and checks the configured topics and the dead-letter
/// topic, if there is one.
pub async fn probe(source: &SourceConfig, dead_letter_topic: Option<&str>, report: &mut Steps) {
    if let Some(present) = check_broker(source, report).await
        && let Some(topic) = dead_letter_topic
    {
        let (outcome, detail) = match present.iter().any(|t| t == topic) {
            true => (Outcome::Pass, format!("{topic} present")),
            false => (
                Outcome::Fail,
                format!(
                    "{topic} does not exist: create it (dead letters then go to the file only, with a warning)"
                ),
            ),
        };
        report.report("dead-letter topic", outcome, detail);
    }
}

/// The broker and topic steps; the topics the brokers have, when they answered.
async fn check_broker(source: &SourceConfig, report: &mut Steps) -> Option<Vec<String>> {
    let config = source.client_config();
    let topics = source.topics.clone();
    let pattern = source.topic_pattern.clone();
    let consumes = {
        let source = source.clone();
        move |topic: &str| source.consumes(topic)
    };
    let tokens = super::oauth::ContextTokens::new(source.token_source());
    let result = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<ProbeContext> = config
            .create_with_context(ProbeContext {
                tokens,
                ..ProbeContext::default()
            })
            .map_err(|e| e.to_string())?;
        consumer.context().tokens.serve_first(BROKER_TIMEOUT, || {
            let _ = consumer.poll(Duration::from_millis(100));
        });
        let metadata = consumer.fetch_metadata(None, BROKER_TIMEOUT).map_err(|e| {
            let recorded = || consumer.context().refused.lock().ok()?.clone();
            super::why_refused(&consumer, recorded).unwrap_or_else(|| e.to_string())
        })?;
        let present: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        Ok::<_, String>((metadata.brokers().len(), present))
    })
    .await
    .unwrap_or_else(|e| Err(format!("metadata task failed: {e}")));
    let (brokers, present) = match result {
        Ok(r) => r,
        Err(e) => {
            report.report(
                "broker",
                Outcome::Fail,
                format!("{}: {e}", source.bootstrap_servers),
            );
            report.report("topics", Outcome::Skip, "broker unreachable".into());
            return None;
        }
    };
    report.report(
        "broker",
        Outcome::Pass,
        format!("{brokers} broker(s) at {}", source.bootstrap_servers),
    );
    if let Some(pattern) = pattern {
        let matched = present.iter().filter(|t| consumes(t)).count();
        let outcome = if matched > 0 {
            Outcome::Pass
        } else {
            Outcome::Fail
        };
        report.report(
            "topics",
            outcome,
            format!("{matched} topic(s) match /{pattern}/"),
        );
        return Some(present);
    }
    let missing: Vec<&String> = topics.iter().filter(|t| !present.contains(t)).collect();
    if missing.is_empty() {
        report.report(
            "topics",
            Outcome::Pass,
            format!("present: {}", topics.join(", ")),
        );
    } else {
        let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        report.report(
            "topics",
            Outcome::Fail,
            format!("missing: {}", names.join(", ")),
        );
    }
    Some(present)
}
