//! The reference a table is compared with: every record of a topic read back from the
//! broker with a plain consumer (partition, offset, timestamp, key and value as Kafka
//! holds them), the rows Floe must have written for them, and a comparison of every
//! column of every row with what an independent reader returned.
//!
//! Values are compared by what they mean, so the types the schema widened to compare
//! equal to the values produced: numbers as numbers (`5` and `5.0` are equal, `2.5` and
//! `2` are not), timestamps as instants (`…T10:00:00Z` and `…T10:00:00.000000+00:00`),
//! structs field by field (a field the record lacks must be null), lists element by
//! element.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{Map, Value};

use crate::TableDump;

/// One record as the broker holds it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Timestamp (ms since the epoch).
    pub timestamp_ms: Option<i64>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
}

impl Record {
    /// The value as a JSON object, if it is one (anything else is dead-lettered).
    pub fn object(&self) -> Option<Map<String, Value>> {
        match serde_json::from_slice(self.value.as_deref()?) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        }
    }

    /// The `_kafka_*` columns of this record's row.
    fn kafka_columns(&self) -> Map<String, Value> {
        let mut row = Map::new();
        row.insert("_kafka_partition".into(), Value::from(self.partition));
        row.insert("_kafka_offset".into(), Value::from(self.offset));
        row.insert(
            "_kafka_timestamp".into(),
            self.timestamp_ms
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map_or(Value::Null, |t| {
                    Value::from(t.format("%Y-%m-%dT%H:%M:%S%.6f+00:00").to_string())
                }),
        );
        row.insert(
            "_kafka_key".into(),
            self.key
                .as_deref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map_or(Value::Null, Value::from),
        );
        row
    }
}

/// Reads every record of `topic` from the start of each partition (committed records
/// only) until at least `at_least` arrived and nothing more comes for a second.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    at_least: usize,
    timeout: Duration,
) -> Result<Vec<Record>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reference-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .context("topic not found")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                });
                quiet_since = Instant::now();
            }
            Some(Err(e)) => bail!("reading {topic} back: {e}"),
            None => {
                if out.len() >= at_least && quiet_since.elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            bail!(
                "read {} of at least {at_least} records of {topic} back",
                out.len()
            );
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// What identifies a row of an upsert table.
#[derive(Debug, Clone)]
pub enum UpsertKey {
    /// A top-level payload field.
    Field(String),
    /// The Kafka message key (a tombstone deletes the row).
    MessageKey,
}

/// The rows an append table holds for `records`: one per record whose value is a JSON
/// object, its fields plus the `_kafka_*` columns.
pub fn append_rows(records: &[Record]) -> Vec<Value> {
    records
        .iter()
        .filter_map(|r| {
            let mut row = r.object()?;
            row.extend(r.kafka_columns());
            Some(Value::Object(row))
        })
        .collect()
}

/// The rows an upsert table holds for `records`: per key, its last record (none if that
/// is a tombstone), in offset order per partition.
pub fn upsert_rows(records: &[Record], key: &UpsertKey) -> Vec<Value> {
    let mut last: BTreeMap<String, Option<Value>> = BTreeMap::new();
    for r in records {
        let k = match key {
            UpsertKey::MessageKey => match r.key.as_deref().map(String::from_utf8_lossy) {
                Some(k) => k.to_string(),
                None => continue,
            },
            UpsertKey::Field(f) => match r.object().and_then(|o| o.get(f).cloned()) {
                Some(v) => v.to_string(),
                None => continue,
            },
        };
        let row = match (r.object(), &r.value) {
            (Some(mut o), _) => {
                o.extend(r.kafka_columns());
                Some(Value::Object(o))
            }
            (None, None) => None,
            // Not an object: dead-lettered, the key keeps its row.
            (None, Some(_)) => continue,
        };
        last.insert(k, row);
    }
    last.into_values().flatten().collect()
}

/// Reads `namespace.table` in process with iceberg-rust's scan (position deletes applied;
/// not deletion vectors), as a [`TableDump`] like the readers print: quicker than an
/// independent reader, for checks after every step of a long test.
pub async fn scan(
    catalog: &dyn iceberg::Catalog,
    namespace: &str,
    table: &str,
) -> Result<TableDump> {
    use futures::TryStreamExt;
    let table = catalog
        .load_table(&iceberg::TableIdent::from_strs([namespace, table])?)
        .await?;
    let columns: Vec<Value> = table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            Value::from(vec![
                Value::from(f.name.clone()),
                Value::from(f.field_type.to_string()),
            ])
        })
        .collect();
    let mut rows = Vec::new();
    if table.metadata().current_snapshot().is_some() {
        let batches: Vec<arrow_array::RecordBatch> = table
            .scan()
            .select_all()
            .build()?
            .to_arrow()
            .await?
            .try_collect()
            .await?;
        let mut writer = arrow_json::ArrayWriter::new(Vec::new());
        for b in &batches {
            writer.write(b)?;
        }
        writer.finish()?;
        let bytes = writer.into_inner();
        if !bytes.is_empty() {
            let parsed: Value = serde_json::from_slice(&bytes)?;
            rows = parsed.as_array().cloned().unwrap_or_default();
        }
    }
    Ok(TableDump(
        serde_json::json!({"columns": columns, "rows": rows}),
    ))
}

/// Compares every column of every row of `dump` with `expected`, rows matched by the
/// values of `match_on`; columns in `skip` are not compared. Returns the differences
/// (at most `limit` of them described, then a count).
pub fn diff_rows(
    dump: &TableDump,
    expected: &[Value],
    match_on: &[&str],
    skip: &[&str],
) -> Vec<String> {
    const LIMIT: usize = 20;
    let columns = dump.columns();
    let key_of = |row: &Value| -> String {
        match_on
            .iter()
            .map(|c| normalize(row.get(*c).unwrap_or(&Value::Null)).to_string())
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut actual: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for row in dump.rows() {
        actual.entry(key_of(row)).or_default().push(row);
    }
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for want in expected {
        let k = key_of(want);
        seen.insert(k.clone());
        let Some(found) = actual.get(&k) else {
            problems.push(format!("missing row {k}"));
            continue;
        };
        if found.len() > 1 {
            problems.push(format!("row {k} appears {} times", found.len()));
        }
        let got = found[0];
        for c in &columns {
            if skip.contains(&c.as_str()) {
                continue;
            }
            let w = want.get(c).unwrap_or(&Value::Null);
            let g = got.get(c).unwrap_or(&Value::Null);
            if !same(w, g) {
                problems.push(format!("row {k}, column {c}: expected {w}, read {g}"));
            }
        }
        if let Some(obj) = want.as_object() {
            for field in obj.keys() {
                if !columns.contains(field) && !skip.contains(&field.as_str()) {
                    problems.push(format!("row {k}: the table has no column {field}"));
                }
            }
        }
    }
    for (k, rows) in &actual {
        if !seen.contains(k) {
            problems.push(format!("unexpected row {k} ({} times)", rows.len()));
        }
    }
    if problems.len() > LIMIT {
        let more = problems.len() - LIMIT;
        problems.truncate(LIMIT);
        problems.push(format!("... and {more} more differences"));
    }
    problems
}

/// Fails with the differences between `dump` and `expected` (see [`diff_rows`]).
pub fn assert_rows(
    what: &str,
    dump: &TableDump,
    expected: &[Value],
    match_on: &[&str],
    skip: &[&str],
) -> Result<()> {
    let problems = diff_rows(dump, expected, match_on, skip);
    if !problems.is_empty() {
        bail!(
            "{what}: {} rows read, {} expected; differences:\n  {}",
            dump.rows().len(),
            expected.len(),
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// Whether an expected value and a value read mean the same.
fn same(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Null, Value::Null) => true,
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => {
                let (x, y) = (
                    a.as_f64().unwrap_or(f64::NAN),
                    b.as_f64().unwrap_or(f64::NAN),
                );
                x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
            }
        },
        (Value::String(a), Value::String(b)) => a == b || normalize(want) == normalize(got),
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.iter()
                .all(|(k, v)| same(v, b.get(k).unwrap_or(&Value::Null)))
                && b.iter().all(|(k, v)| a.contains_key(k) || v.is_null())
        }
        // An empty list or object with no known type has no column: it reads as null.
        (Value::Array(a), Value::Null) => a.is_empty(),
        (Value::Object(a), Value::Null) => a.values().all(|v| same(v, &Value::Null)),
        _ => false,
    }
}

/// Timestamps as one canonical text (UTC, microseconds); other values as they are.
fn normalize(v: &Value) -> Value {
    let Value::String(s) = v else {
        return v.clone();
    };
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Value::from(
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%dT%H:%M:%S%.6f+00:00")
                .to_string(),
        );
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, format) {
            return Value::from(t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string());
        }
    }
    v.clone()
}

/// Reads `topic` (at least `n` records) and fails unless the append-mode table that
/// `read(reader)` dumps holds exactly its rows, every column, through PyIceberg and
/// DuckDB; `what` names the table in the message.
pub fn assert_append_table(
    bootstrap: &str,
    topic: &str,
    n: usize,
    what: &str,
    read: impl Fn(&str) -> Result<TableDump>,
) -> Result<()> {
    let records = read_topic(bootstrap, topic, n, Duration::from_secs(120))?;
    let expected = append_rows(&records);
    // A table with a `_kafka_topic` column holds the topic in every row.
    let with_topic: Vec<Value> = expected
        .iter()
        .map(|row| {
            let mut row = row.clone();
            if let Value::Object(o) = &mut row {
                o.insert("_kafka_topic".into(), Value::from(topic));
            }
            row
        })
        .collect();
    for reader in ["pyiceberg", "duckdb"] {
        let dump = read(reader)?;
        let has_topic = dump
            .rows()
            .first()
            .is_some_and(|r| r.get("_kafka_topic").is_some());
        assert_rows(
            &format!("{reader}: {what}"),
            &dump,
            if has_topic { &with_topic } else { &expected },
            &["_kafka_partition", "_kafka_offset"],
            &[],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_compare_by_meaning() {
        assert!(same(&json!(5), &json!(5.0)));
        assert!(!same(&json!(2.5), &json!(2)));
        assert!(!same(&json!(7), &Value::Null));
        assert!(same(
            &json!("2024-01-01T10:00:00Z"),
            &json!("2024-01-01T10:00:00.000000+00:00")
        ));
        assert!(same(&json!({"a": 1}), &json!({"a": 1, "b": null})));
        assert!(!same(&json!({"a": 1, "b": 2}), &json!({"a": 1, "b": null})));
        assert!(same(&json!([1, 2]), &json!([1.0, 2.0])));
    }

    #[test]
    fn a_lost_value_and_a_duplicate_are_reported() {
        let rows =
            |v: Value| TableDump(json!({"columns": [["id", "long"], ["v", "string"]], "rows": v}));
        let expected = vec![json!({"id": 1, "v": "a"}), json!({"id": 2, "v": "b"})];
        assert!(
            diff_rows(
                &rows(json!([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])),
                &expected,
                &["id"],
                &[]
            )
            .is_empty()
        );
        let d = diff_rows(
            &rows(json!([{"id": 1, "v": null}, {"id": 2, "v": "b"}, {"id": 2, "v": "b"}])),
            &expected,
            &["id"],
            &[],
        );
        assert_eq!(d.len(), 2, "{d:?}");
    }
}
