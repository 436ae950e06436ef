//! Dead-letter path: records that cannot become rows, with everything needed to replay them.
//!
//! Destination: an NDJSON file per pipeline. One line per record:
//! `{"topic","partition","offset","timestamp_ms","key_base64","value_base64","stage","reason","pipeline","dead_lettered_at"}`.
//! Lines are fsynced before the Iceberg commit that moves the offsets past them, so a
//! record is never skipped without being kept. After a crash the same records are read
//! again; records already in the file are not written twice.
//!
//! The file holds raw payloads: it is created readable by its owner only (0600), and an
//! existing file is narrowed to that when opened.
//!
//! - Torn line: a crash or a full disk can leave a last line without its newline. It
//!   was never synced before a commit, so its record will be read again: on open the
//!   file is cut back to its last complete line, so the next line starts on its own.
//! - Rotation: past `max_file_size`, after a commit, the file is renamed `<path>.1`
//!   (`.1` to `.2`, and so on); at most `max_files` rotated files are kept and the
//!   oldest is deleted. Records in a deleted file are gone: size `max_files` for the
//!   retention needed.
//! - Start-up: a small sidecar `<path>.idx` says from which byte of the current file
//!   lines can still be re-delivered (the offsets stored in the table are past the rest)
//!   and lists re-deliverable records of rotated files. Only that tail is read at start;
//!   without a sidecar the current file (bounded by rotation) is read.
//! - A full disk (ENOSPC, EDQUOT) is [`DeadLetterError::DiskFull`]: the pipeline stops
//!   before any commit moves past a record it could not keep, and loses nothing.
//! - With `topic` set, each record the file takes is also produced to that Kafka topic
//!   ([`topic`]): original key, value and headers, the reason in headers. A record the
//!   file had from an earlier run is produced again when it is read again (that run may
//!   have died before the topic acknowledged it): on the topic a dead letter may repeat
//!   after a crash, never go missing while the topic takes it. A topic that refuses
//!   (missing, denied, a record too large) gets a warning and the letter stays in the
//!   file; with `file = false` the pipeline stops instead, before offsets move past it.
//! - The log gets one warning per distinct reason and commit interval, with a count
//!   ([`summary`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use crate::record::{Message, PartitionMap, TopicPartition};

pub mod summary;
pub mod topic;

pub use summary::Summary;
pub use topic::DeadLetterTopic;

/// Default size past which the file is rotated.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 128 * 1024 * 1024;
/// Default number of rotated files kept.
pub const DEFAULT_MAX_FILES: u32 = 10;

/// File mode of dead-letter files: they hold raw payloads.
const FILE_MODE: u32 = 0o600;

/// `[pipelines.dead_letter]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// NDJSON file the records are appended to (directories are created); default
    /// `.floe/dead-letter/<pipeline>.ndjson`.
    #[serde(default)]
    pub path: PathBuf,
    /// Size past which the file is rotated to `<path>.1` (default 128MiB).
    #[serde(
        default = "default_max_file_size",
        deserialize_with = "crate::settings::size::deserialize"
    )]
    pub max_file_size: u64,
    /// Rotated files kept (`<path>.1` .. `<path>.N`, default 10); the oldest is deleted.
    #[serde(default = "default_max_files")]
    pub max_files: u32,
    /// A Kafka topic (on the source's brokers, with its security settings) each dead
    /// letter is also produced to: original key and value, the reason in headers.
    #[serde(default)]
    pub topic: Option<String>,
    /// Keep the NDJSON file (default true). `false` needs `topic`: dead letters go to
    /// the topic only (a read-only or ephemeral disk); it may then get a record again
    /// after a restart, as it may with the file.
    #[serde(default = "yes")]
    pub file: bool,
}

fn yes() -> bool {
    true
}

fn default_max_file_size() -> u64 {
    DEFAULT_MAX_FILE_SIZE
}

fn default_max_files() -> u32 {
    DEFAULT_MAX_FILES
}

impl DeadLetterConfig {
    /// `.floe/dead-letter/<pipeline>.ndjson` under the working directory.
    pub fn default_for(pipeline: &str) -> DeadLetterConfig {
        DeadLetterConfig::at(PathBuf::from(format!(
            ".floe/dead-letter/{pipeline}.ndjson"
        )))
    }

    /// A file at `path` with the default rotation.
    pub fn at(path: PathBuf) -> DeadLetterConfig {
        DeadLetterConfig {
            path,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            max_files: DEFAULT_MAX_FILES,
            topic: None,
            file: true,
        }
    }

    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.max_file_size < 4096 {
            out.push(("max_file_size".into(), "must be at least 4KiB".into()));
        }
        if self.topic.as_deref().is_some_and(|t| t.trim().is_empty()) {
            out.push(("topic".into(), "must not be empty".into()));
        }
        if !self.file && self.topic.is_none() {
            out.push((
                "file".into(),
                "false needs a topic: dead letters would go nowhere".into(),
            ));
        }
        if self.max_files == 0 {
            out.push((
                "max_files".into(),
                "must be at least 1 (rotated files kept)".into(),
            ));
        }
        out
    }

    /// The `n`th rotated file (`<path>.n`).
    pub fn rotated(&self, n: u32) -> PathBuf {
        with_suffix(&self.path, &format!(".{n}"))
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
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
    /// The device holding the file is full (or the quota is used up).
    #[error(
        "dead-letter file {path}: no space left on the device ({source}); this pipeline stops \
         before committing past records it could not keep: free space and restart it, it \
         resumes from the offsets stored in the table"
    )]
    DiskFull {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The dead-letter topic could not be produced to (after librdkafka's retries).
    #[error("{0}")]
    Topic(String),
    /// Records queued for the dead-letter topic were not all acknowledged.
    #[error(transparent)]
    TopicFlush(#[from] topic::FlushError),
}

impl DeadLetterError {
    fn io(path: &Path, source: std::io::Error) -> DeadLetterError {
        // ENOSPC (28) and EDQUOT (122) on Linux.
        let full = source.kind() == std::io::ErrorKind::StorageFull
            || source.kind() == std::io::ErrorKind::QuotaExceeded
            || matches!(source.raw_os_error(), Some(28 | 122));
        let path = path.to_path_buf();
        if full {
            DeadLetterError::DiskFull { path, source }
        } else {
            DeadLetterError::Io { path, source }
        }
    }
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

/// Just what the index needs of a line.
#[derive(Deserialize)]
struct LineKey {
    pipeline: String,
    topic: String,
    partition: i32,
    offset: i64,
    #[serde(default)]
    stage: String,
    #[serde(default)]
    reason: String,
}

/// The sidecar `<path>.idx`: where re-deliverable lines start in the current file.
#[derive(Debug, Default, serde::Serialize, Deserialize, PartialEq, Eq)]
struct Sidecar {
    /// Inode of the current file the sidecar describes.
    inode: u64,
    /// Lines before this byte are below every resume point.
    start: u64,
    /// Re-deliverable records kept in rotated files: `[topic, partition, offset,
    /// rejection digest]`.
    carried: Vec<Carried>,
}

/// A re-deliverable record in a rotated file. Sidecars written before rejections were
/// told apart hold `[topic, partition, offset]`: their digest reads as 0.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, Deserialize)]
#[serde(untagged)]
enum Carried {
    Rejection(String, i32, i64, u64),
    Record(String, i32, i64),
}

impl Carried {
    fn key(&self) -> Key {
        match self {
            Carried::Rejection(topic, partition, offset, digest) => {
                (((Arc::from(topic.as_str()), *partition), *offset), *digest)
            }
            Carried::Record(topic, partition, offset) => {
                (((Arc::from(topic.as_str()), *partition), *offset), 0)
            }
        }
    }
}

/// A point in the dead-letter file (its inode and length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    inode: u64,
    len: u64,
}

/// Where an indexed record's line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the current file, at this byte.
    At(u64),
    /// In a rotated file.
    Carried,
}

/// A rejection: the record (partition, offset) and a digest of its stage and reason, so
/// a record rejected twice for different reasons (two outputs of one message) keeps
/// both lines, and a record read again is not written twice.
type Key = ((TopicPartition, i64), u64);

/// The digest of a rejection's stage and reason (stable across restarts).
fn rejection_digest(stage: &str, reason: &str) -> u64 {
    let mut bytes = Vec::with_capacity(stage.len() + reason.len() + 1);
    bytes.extend_from_slice(stage.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(reason.as_bytes());
    twox_hash::XxHash3_128::oneshot(&bytes) as u64
}

/// Appends dead letters to the pipeline's file.
pub struct DeadLetterWriter {
    pipeline: String,
    config: DeadLetterConfig,
    /// The file; `None` with `file = false` (the topic only).
    out: Option<BufWriter<File>>,
    inode: u64,
    /// Bytes in the current file, buffered ones included.
    len: u64,
    /// Bytes known to be on disk.
    synced_len: u64,
    /// Records already written that may be read again (at or after the resume point),
    /// so a re-delivery after a crash or rewind is not written twice.
    written: HashMap<Key, Place>,
    /// Records the file had from an earlier run: that run may have died before the topic
    /// acknowledged them, so the topic gets each again when it is read again.
    earlier: std::collections::HashSet<Key>,
    pending: usize,
    /// What the sidecar on disk says.
    sidecar: Sidecar,
    /// The dead-letter topic, if configured.
    topic: Option<DeadLetterTopic>,
}

impl DeadLetterWriter {
    /// Opens (or creates) the file: repairs a torn last line, narrows its permissions
    /// and indexes the lines that may still be re-delivered.
    pub fn open(
        pipeline: &str,
        config: &DeadLetterConfig,
    ) -> Result<DeadLetterWriter, DeadLetterError> {
        if !config.file {
            return Ok(DeadLetterWriter {
                pipeline: pipeline.to_string(),
                config: config.clone(),
                out: None,
                inode: 0,
                len: 0,
                synced_len: 0,
                written: HashMap::new(),
                earlier: Default::default(),
                pending: 0,
                sidecar: Sidecar::default(),
                topic: None,
            });
        }
        let path = config.path.clone();
        let io = |source| DeadLetterError::io(&path, source);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // A rotation interrupted after the old file was renamed away.
        let fresh = with_suffix(&path, ".new");
        if fresh.exists() {
            if path.exists() {
                std::fs::remove_file(&fresh).map_err(io)?;
            } else {
                std::fs::rename(&fresh, &path).map_err(io)?;
            }
        }
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(FILE_MODE))
                .map_err(io)?;
            tracing::warn!(path = %path.display(), "dead-letter file was readable by others: narrowed to 0600 (it holds raw payloads)");
        }
        // Not a regular file (a device, e.g. /dev/full in tests): nothing to read back.
        let regular = meta.is_file();
        let len = if regular {
            repair_torn_tail(&mut file, meta.len()).map_err(io)?
        } else {
            0
        };
        let inode = meta.ino();
        let sidecar = read_sidecar(&with_suffix(&path, ".idx"));
        let mut written = HashMap::new();
        for carried in &sidecar.carried {
            written.insert(carried.key(), Place::Carried);
        }
        let start = if sidecar.inode == inode && sidecar.start <= len {
            sidecar.start
        } else {
            0
        };
        if regular {
            index_from(&mut file, start, pipeline, &mut written).map_err(io)?;
        }
        Ok(DeadLetterWriter {
            pipeline: pipeline.to_string(),
            config: config.clone(),
            out: Some(BufWriter::new(file)),
            inode,
            len,
            synced_len: len,
            earlier: written.keys().cloned().collect(),
            written,
            pending: 0,
            sidecar,
            topic: None,
        })
    }

    /// Also produces every record the file takes to `topic`.
    pub fn with_topic(mut self, topic: DeadLetterTopic) -> DeadLetterWriter {
        self.topic = Some(topic);
        self
    }

    /// Records one rejected message. Returns false if the file already had it.
    pub fn write(
        &mut self,
        record: &Message,
        stage: &str,
        reason: &str,
    ) -> Result<bool, DeadLetterError> {
        let key = (
            ((record.topic.clone(), record.partition), record.offset),
            rejection_digest(stage, reason),
        );
        if self.written.contains_key(&key) {
            // A dead letter may repeat on the topic, never go missing from it.
            if let Some(topic) = &self.topic
                && self.earlier.remove(&key)
                && let Err(e) = topic.send(&self.pipeline, record, stage, reason)
            {
                let e = format!("dead-letter topic {}: {e}", topic.topic());
                self.topic_failed(&e)?;
            }
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
        match &mut self.out {
            Some(out) => {
                let mut line = serde_json::to_vec(&letter).expect("dead letter serializes");
                line.push(b'\n');
                out.write_all(&line)
                    .map_err(|e| DeadLetterError::io(&self.config.path, e))?;
                self.written.insert(key, Place::At(self.len));
                self.len += line.len() as u64;
                self.pending += 1;
            }
            // Not sent twice while its record can be read again in this run.
            None => {
                self.written.insert(key, Place::Carried);
            }
        }
        if let Some(topic) = &self.topic
            && let Err(e) = topic.send(&self.pipeline, record, stage, reason)
        {
            let e = format!("dead-letter topic {}: {e}", topic.topic());
            self.topic_failed(&e)?;
        }
        Ok(true)
    }

    /// The topic did not take a dead letter. With the file, the letter is safe there:
    /// a warning says so and the pipeline goes on (a full topic, a missing one or a
    /// denied ACL must not stop ingestion). Without it, nothing else holds the letter:
    /// the pipeline stops before any offset moves past its record.
    fn topic_failed(&self, error: &str) -> Result<(), DeadLetterError> {
        match &self.out {
            Some(_) => {
                tracing::warn!(pipeline = %self.pipeline, file = %self.config.path.display(), "{error}; the dead letters are in the file");
                Ok(())
            }
            None => Err(DeadLetterError::Topic(format!(
                "{error} (file = false: no other place holds the dead letters)"
            ))),
        }
    }

    /// Makes every written line durable. Called before each Iceberg commit.
    pub fn sync(&mut self) -> Result<(), DeadLetterError> {
        if let Some(topic) = &self.topic
            && let Err(e) = topic.flush()
        {
            self.topic_failed(&e.to_string())?;
        }
        let Some(out) = &mut self.out else {
            return Ok(());
        };
        if self.pending == 0 {
            return Ok(());
        }
        let io = |e| DeadLetterError::io(&self.config.path, e);
        out.flush().map_err(io)?;
        out.get_ref().sync_data().map_err(io)?;
        self.pending = 0;
        self.synced_len = self.len;
        Ok(())
    }

    /// Where the file ends now (synced): [`DeadLetterWriter::discard_after`] goes back
    /// to it.
    pub fn position(&self) -> Position {
        Position {
            inode: self.inode,
            len: self.synced_len,
        }
    }

    /// Drops the lines written after `position`: the pipeline rewound, and the records
    /// they name will be read and judged again (against a table schema that may have
    /// changed meanwhile: a record rejected against buffered columns another writer's
    /// commit then contradicted may now be a row). Nothing happens if the file was
    /// rotated since.
    pub fn discard_after(&mut self, position: Position) -> Result<(), DeadLetterError> {
        // Without a file there is nothing to take back (the topic keeps what it got).
        let Some(out) = &mut self.out else {
            return Ok(());
        };
        if position.inode != self.inode || position.len >= self.len {
            return Ok(());
        }
        let io = |e| DeadLetterError::io(&self.config.path, e);
        let placeholder = BufWriter::new(out.get_ref().try_clone().map_err(io)?);
        // Unflushed lines are dropped with the buffer, not written.
        let (file, _unwritten) = std::mem::replace(out, placeholder).into_parts();
        file.set_len(position.len).map_err(io)?;
        file.sync_all().map_err(io)?;
        self.out = Some(BufWriter::new(file));
        self.written
            .retain(|_, place| !matches!(place, Place::At(p) if *p >= position.len));
        self.len = position.len;
        self.synced_len = position.len;
        self.pending = 0;
        Ok(())
    }

    /// Forgets records below the resume point: they will never be read again. Then
    /// records in the sidecar where re-deliverable lines start, and rotates the file
    /// past its size limit. Sidecar and rotation failures are logged, not returned: the
    /// next write or sync reports a file that cannot be written.
    pub fn forget_below(&mut self, resume: &PartitionMap<i64>) {
        self.written
            .retain(|((tp, offset), _), _| resume.get(tp).is_none_or(|&r| *offset >= r));
        if self.out.is_none() {
            return;
        }
        let result = if self.synced_len >= self.config.max_file_size {
            self.rotate()
        } else {
            self.update_sidecar()
                .map_err(|e| DeadLetterError::io(&self.config.path, e))
        };
        if let Err(e) = result {
            tracing::warn!(pipeline = %self.pipeline, error = %e, "dead-letter file maintenance failed; will try again after the next commit");
        }
    }

    /// The sidecar for the current state: start of the oldest re-deliverable line.
    fn current_sidecar(&self) -> Sidecar {
        let mut start = self.synced_len;
        let mut carried = Vec::new();
        for (((tp, offset), digest), place) in &self.written {
            match place {
                Place::At(p) => start = start.min(*p),
                Place::Carried => {
                    carried.push(Carried::Rejection(tp.0.to_string(), tp.1, *offset, *digest))
                }
            }
        }
        carried.sort();
        Sidecar {
            inode: self.inode,
            start,
            carried,
        }
    }

    fn update_sidecar(&mut self) -> std::io::Result<()> {
        let next = self.current_sidecar();
        if next != self.sidecar {
            write_sidecar(&with_suffix(&self.config.path, ".idx"), &next)?;
            self.sidecar = next;
        }
        Ok(())
    }

    /// Moves the current file to `<path>.1` (and older ones up), starting a new one.
    fn rotate(&mut self) -> Result<(), DeadLetterError> {
        let path = self.config.path.clone();
        let io = |e| DeadLetterError::io(&path, e);
        self.pending = self.pending.max(1);
        self.sync()?;
        let fresh_path = with_suffix(&path, ".new");
        let fresh = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .mode(FILE_MODE)
            .open(&fresh_path)
            .map_err(io)?;
        let inode = fresh.metadata().map_err(io)?.ino();
        // Every record still re-deliverable is carried in the new file's sidecar.
        for place in self.written.values_mut() {
            *place = Place::Carried;
        }
        let mut sidecar = self.current_sidecar();
        sidecar.inode = inode;
        sidecar.start = 0;
        write_sidecar(&with_suffix(&path, ".idx"), &sidecar).map_err(io)?;
        let keep = self.config.max_files.max(1);
        match std::fs::remove_file(self.config.rotated(keep)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        for n in (1..keep).rev() {
            let from = self.config.rotated(n);
            if from.exists() {
                std::fs::rename(&from, self.config.rotated(n + 1)).map_err(io)?;
            }
        }
        std::fs::rename(&path, self.config.rotated(1)).map_err(io)?;
        std::fs::rename(&fresh_path, &path).map_err(io)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        tracing::info!(pipeline = %self.pipeline, path = %path.display(), rotated = %self.config.rotated(1).display(), "dead-letter file rotated");
        self.out = Some(BufWriter::new(fresh));
        self.inode = inode;
        self.len = 0;
        self.synced_len = 0;
        self.pending = 0;
        self.sidecar = sidecar;
        Ok(())
    }

    /// Reads all dead letters of one file (for tests and tools). A torn last line (a
    /// record that was never synced) is skipped.
    pub fn read_all(path: &Path) -> std::io::Result<Vec<DeadLetter>> {
        let mut text = Vec::new();
        File::open(path)?.read_to_end(&mut text)?;
        let complete = match text.iter().rposition(|b| *b == b'\n') {
            Some(i) => &text[..=i],
            None => &text[..0],
        };
        let mut out = Vec::new();
        for line in complete.split(|b| *b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            out.push(serde_json::from_slice(line).map_err(std::io::Error::other)?);
        }
        Ok(out)
    }
}

/// Cuts the file back to its last complete line; returns the new length.
fn repair_torn_tail(file: &mut File, len: u64) -> std::io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if end == len && chunk.last() == Some(&b'\n') {
            return Ok(len);
        }
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            let keep = start + i as u64 + 1;
            truncate(file, keep, len)?;
            return Ok(keep);
        }
        if start == 0 {
            truncate(file, 0, len)?;
            return Ok(0);
        }
        end = start;
    }
}

fn truncate(file: &File, keep: u64, len: u64) -> std::io::Result<()> {
    tracing::warn!(
        torn_bytes = len - keep,
        "dead-letter file ended in a torn line (a crash or a full disk while writing): cut back to the last complete line; that record is read again"
    );
    file.set_len(keep)?;
    file.sync_all()
}

/// Indexes the lines of `pipeline` from byte `start` to the end.
fn index_from(
    file: &mut File,
    start: u64,
    pipeline: &str,
    written: &mut HashMap<Key, Place>,
) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(start))?;
    let mut reader = BufReader::new(file);
    let mut pos = start;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if let Ok(k) = serde_json::from_slice::<LineKey>(&line)
            && k.pipeline == pipeline
        {
            written.insert(
                (
                    ((Arc::from(k.topic.as_str()), k.partition), k.offset),
                    rejection_digest(&k.stage, &k.reason),
                ),
                Place::At(pos),
            );
        }
        pos += n as u64;
    }
}

fn read_sidecar(path: &Path) -> Sidecar {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_sidecar(path: &Path, sidecar: &Sidecar) -> std::io::Result<()> {
    let tmp = with_suffix(path, ".tmp");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(FILE_MODE)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(sidecar).map_err(std::io::Error::other)?)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests;
