//! Dead-letter path: records that cannot become rows, with everything needed to replay them.
//!
//! Destination: an NDJSON file per pipeline. One line per record:
//! `{"topic","partition","offset","timestamp_ms","key_base64","value_base64","stage","reason","pipeline","dead_lettered_at"}`.
//! Lines are fsynced before the Iceberg commit that moves the offsets past them, so a
//! record is never skipped without being kept. After a crash the same records are read
//! again; on start the file is scanned and records already in it are not written twice.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use crate::record::{Message, PartitionMap, TopicPartition};

/// `[pipelines.dead_letter]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// NDJSON file the records are appended to (directories are created).
    pub path: PathBuf,
}

impl DeadLetterConfig {
    /// `.floe/dead-letter/<pipeline>.ndjson` under the working directory.
    pub fn default_for(pipeline: &str) -> DeadLetterConfig {
        DeadLetterConfig {
            path: PathBuf::from(format!(".floe/dead-letter/{pipeline}.ndjson")),
        }
    }
}

/// Errors of the dead-letter path. Any of them stops the pipeline: losing a record is worse.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The file could not be opened, read, written or synced.
    #[error("dead-letter file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// One dead-lettered record as stored in the file.
#[derive(Debug, Clone, serde::Serialize, Deserialize, PartialEq, Eq)]
pub struct DeadLetter {
    /// Pipeline that rejected it.
    pub pipeline: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Message timestamp (ms since the epoch).
    pub timestamp_ms: Option<i64>,
    /// Original key bytes, base64.
    pub key_base64: Option<String>,
    /// Original value bytes, base64.
    pub value_base64: Option<String>,
    /// Stage that rejected it: `decode`, `schema`, `batch`.
    pub stage: String,
    /// Why.
    pub reason: String,
    /// When (RFC 3339).
    pub dead_lettered_at: String,
}

/// Appends dead letters to the pipeline's file.
pub struct DeadLetterWriter {
    pipeline: String,
    path: PathBuf,
    out: BufWriter<File>,
    /// Records already in the file that may be read again (at or after the resume point),
    /// so a re-delivery after a crash or rewind is not written twice.
    written: HashSet<(TopicPartition, i64)>,
    pending: usize,
}

impl DeadLetterWriter {
    /// Opens (or creates) the file and indexes what it already holds.
    pub fn open(
        pipeline: &str,
        config: &DeadLetterConfig,
    ) -> Result<DeadLetterWriter, DeadLetterError> {
        let path = config.path.clone();
        let io = |source| DeadLetterError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let written = index_existing(&path, pipeline).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        Ok(DeadLetterWriter {
            pipeline: pipeline.to_string(),
            path,
            out: BufWriter::new(file),
            written,
            pending: 0,
        })
    }

    /// Records one rejected message. Returns false if the file already had it.
    pub fn write(
        &mut self,
        record: &Message,
        stage: &str,
        reason: &str,
    ) -> Result<bool, DeadLetterError> {
        let tp = (record.topic.clone(), record.partition);
        if self.written.contains(&(tp.clone(), record.offset)) {
            return Ok(false);
        }
        let letter = DeadLetter {
            pipeline: self.pipeline.clone(),
            topic: record.topic.to_string(),
            partition: record.partition,
            offset: record.offset,
            timestamp_ms: record.timestamp_ms,
            key_base64: record.key.as_ref().map(|k| B64.encode(k)),
            value_base64: record.value.as_ref().map(|v| B64.encode(v)),
            stage: stage.to_string(),
            reason: reason.to_string(),
            dead_lettered_at: chrono::Utc::now().to_rfc3339(),
        };
        let line = serde_json::to_string(&letter).expect("dead letter serializes");
        let io = |source| DeadLetterError::Io {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(line.as_bytes()).map_err(io)?;
        self.out.write_all(b"\n").map_err(io)?;
        self.written.insert((tp, record.offset));
        self.pending += 1;
        Ok(true)
    }

    /// Makes every written line durable. Called before each Iceberg commit.
    pub fn sync(&mut self) -> Result<(), DeadLetterError> {
        if self.pending == 0 {
            return Ok(());
        }
        let io = |source| DeadLetterError::Io {
            path: self.path.clone(),
            source,
        };
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_data().map_err(io)?;
        self.pending = 0;
        Ok(())
    }

    /// Forgets records below the resume point: they will never be read again.
    pub fn forget_below(&mut self, resume: &PartitionMap<i64>) {
        self.written
            .retain(|(tp, offset)| resume.get(tp).is_none_or(|&r| *offset >= r));
    }

    /// Reads all dead letters of a file (for tests and tools).
    pub fn read_all(path: &Path) -> std::io::Result<Vec<DeadLetter>> {
        let file = File::open(path)?;
        let mut out = Vec::new();
        for line in BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            out.push(serde_json::from_str(&line).map_err(std::io::Error::other)?);
        }
        Ok(out)
    }
}

fn index_existing(path: &Path, pipeline: &str) -> std::io::Result<HashSet<(TopicPartition, i64)>> {
    let mut written = HashSet::new();
    if !path.exists() {
        return Ok(written);
    }
    let file = File::open(path)?;
    for line in BufReader::new(file).lines() {
        let line = line?;
        // A torn last line (crash mid-write) is ignored: that record was not synced, so not committed.
        let Ok(letter) = serde_json::from_str::<DeadLetter>(&line) else {
            continue;
        };
        if letter.pipeline == pipeline {
            written.insert((
                (Arc::from(letter.topic.as_str()), letter.partition),
                letter.offset,
            ));
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, value: &[u8]) -> Message {
        Message {
            topic: Arc::from("t"),
            partition: 2,
            offset,
            timestamp_ms: Some(5),
            key: Some(b"k".to_vec()),
            value: Some(value.to_vec()),
        }
    }

    #[test]
    fn keeps_original_bytes_and_skips_redeliveries_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let config = DeadLetterConfig {
            path: dir.path().join("dl/p.ndjson"),
        };
        let mut w = DeadLetterWriter::open("p", &config).unwrap();
        assert!(w.write(&rec(7, b"\xff{bad"), "decode", "not JSON").unwrap());
        w.sync().unwrap();
        drop(w);
        let mut w = DeadLetterWriter::open("p", &config).unwrap();
        assert!(
            !w.write(&rec(7, b"\xff{bad"), "decode", "not JSON").unwrap(),
            "same offset is not written twice"
        );
        assert!(w.write(&rec(9, b"[]"), "decode", "array").unwrap());
        w.sync().unwrap();
        assert!(
            w.write(&rec(3, b"{"), "decode", "torn").unwrap(),
            "an earlier offset that is not in the file is written"
        );
        w.forget_below(&PartitionMap::from_iter([((Arc::from("t"), 2), 8)]));
        assert!(
            w.write(&rec(7, b"x"), "decode", "again").unwrap(),
            "forgotten below the resume point"
        );
        w.sync().unwrap();
        let all = DeadLetterWriter::read_all(&config.path).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(
            B64.decode(all[0].value_base64.as_ref().unwrap()).unwrap(),
            b"\xff{bad"
        );
        assert_eq!((all[0].partition, all[0].offset, all[1].offset), (2, 7, 9));
        assert_eq!(all[0].reason, "not JSON");
    }
}
