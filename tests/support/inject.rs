//! Faults injected in process, in front of the real embedded catalog: the SQLite
//! catalog and the local warehouse do the work, and a test decides when a write to
//! storage fails, when a commit's answer is lost (after it was applied), when a commit
//! fails without being applied, and when a commit is held in flight until released.
//!
//! This is the in-process counterpart of the fault proxy (`faults.rs`), for tests that
//! need a fault at an exact moment of the pipeline (the model-based test, and the
//! regression tests of the commit path).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use async_trait::async_trait;
use bytes::Bytes;
use floe_iceberg::CatalogHandle;
use floe_iceberg::{CommitBackend, CommitError, SqlBackend};
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::table::Table;
use iceberg::{CatalogBuilder, TableRequirement, TableUpdate};
use tokio::sync::Notify;

/// What the test can do to the catalog and storage of one [`faulty_catalog`].
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
    released: Notify,
    /// Commits the backend applied.
    pub commits: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Data-file writes to fail (paths under `/data/`).
    fail_writes: u32,
    /// Table-metadata writes to fail (`*.metadata.json`: creating or committing a table).
    fail_metadata_writes: u32,
    /// Reads of data or metadata files to fail.
    fail_reads: u32,
    /// Commits to answer as lost after applying them.
    lose_answers: u32,
    /// Commits to refuse without applying them, as unknown (a 503).
    fail_commits: u32,
    /// Commits to refuse for good (a 400): the pipeline stops without a clean close.
    refuse_commits: u32,
    /// Commits to hold until [`Faults::release`].
    hold_commits: u32,
    /// Whether a commit whose answer is lost is held (after it was applied, before the
    /// caller hears) until [`Faults::release`].
    hold_lost: bool,
    /// Commits being held right now.
    holding: u32,
    /// Whether held commits may go on.
    open: bool,
}

impl Faults {
    /// The next `n` data-file writes fail (a transient storage error).
    pub fn fail_writes(&self, n: u32) {
        self.state.lock().unwrap().fail_writes = n;
    }

    /// The next `n` table-metadata writes fail (a table creation, say).
    pub fn fail_metadata_writes(&self, n: u32) {
        self.state.lock().unwrap().fail_metadata_writes = n;
    }

    /// The next `n` file reads fail.
    pub fn fail_reads(&self, n: u32) {
        self.state.lock().unwrap().fail_reads = n;
    }

    /// The next `n` commits are applied but answered as unknown (a lost answer).
    pub fn lose_answers(&self, n: u32) {
        self.state.lock().unwrap().lose_answers = n;
    }

    /// The next `n` commits are refused as unknown without being applied.
    pub fn fail_commits(&self, n: u32) {
        self.state.lock().unwrap().fail_commits = n;
    }

    /// The next `n` commits are refused with an error no retry can help: the pipeline
    /// stops as after a crash, without keeping anything at a clean close.
    pub fn refuse_commits(&self, n: u32) {
        self.state.lock().unwrap().refuse_commits = n;
    }

    /// The next `n` commits wait (before being applied) until [`Faults::release`].
    pub fn hold_commits(&self, n: u32) {
        let mut s = self.state.lock().unwrap();
        s.hold_commits = n;
        s.open = false;
    }

    /// A commit whose answer is lost waits, after it was applied, until
    /// [`Faults::release`]: another writer can commit before the caller looks again.
    pub fn hold_after_lost_answer(&self) {
        let mut s = self.state.lock().unwrap();
        s.hold_lost = true;
        s.open = false;
    }

    /// Commits waiting in [`Faults::hold_commits`].
    pub fn holding(&self) -> u32 {
        self.state.lock().unwrap().holding
    }

    /// Lets held commits go on.
    pub fn release(&self) {
        self.state.lock().unwrap().open = true;
        self.released.notify_waiters();
    }

    /// Waits until a commit is held (up to `timeout`).
    pub async fn wait_holding(&self, timeout: std::time::Duration) -> Result<()> {
        let start = std::time::Instant::now();
        while self.holding() == 0 {
            anyhow::ensure!(start.elapsed() < timeout, "no commit was held");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn take(&self, pick: impl FnOnce(&mut State) -> &mut u32) -> bool {
        let mut s = self.state.lock().unwrap();
        let n = pick(&mut s);
        if *n > 0 {
            *n -= 1;
            true
        } else {
            false
        }
    }
}

/// Storage instances are (de)serialized by iceberg-rust; they find their faults here.
static REGISTRY: Mutex<Vec<Arc<Faults>>> = Mutex::new(Vec::new());

fn faults_of(id: usize) -> Arc<Faults> {
    REGISTRY.lock().unwrap()[id].clone()
}

fn injected(what: &str) -> iceberg::Error {
    iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        format!("injected fault: {what}"),
    )
    .with_retryable(true)
}

/// Local file storage with injected faults.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FaultyStorage {
    faults: usize,
    #[serde(skip)]
    inner: LocalFsStorage,
}

impl FaultyStorage {
    fn write_fails(&self, path: &str) -> bool {
        let faults = faults_of(self.faults);
        (path.contains("/data/") && faults.take(|s| &mut s.fail_writes))
            || (path.ends_with(".metadata.json") && faults.take(|s| &mut s.fail_metadata_writes))
    }

    fn read_fails(&self) -> bool {
        faults_of(self.faults).take(|s| &mut s.fail_reads)
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for FaultyStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        self.inner.exists(path).await
    }
    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        self.inner.metadata(path).await
    }
    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        if self.read_fails() {
            return Err(injected("read"));
        }
        self.inner.read(path).await
    }
    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        if self.read_fails() {
            return Err(injected("read"));
        }
        self.inner.reader(path).await
    }
    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        if self.write_fails(path) {
            return Err(injected("write"));
        }
        self.inner.write(path, bs).await
    }
    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        if self.write_fails(path) {
            return Err(injected("write"));
        }
        self.inner.writer(path).await
    }
    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        self.inner.delete(path).await
    }
    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        self.inner.delete_prefix(path).await
    }
    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        self.inner.delete_stream(paths).await
    }
    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }
    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Builds [`FaultyStorage`] for a catalog.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FaultyStorageFactory {
    faults: usize,
}

#[typetag::serde]
impl StorageFactory for FaultyStorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(FaultyStorage {
            faults: self.faults,
            inner: LocalFsStorage,
        }))
    }
}

/// The SQL commit backend with injected faults.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn CommitBackend>,
    faults: Arc<Faults>,
}

#[async_trait]
impl CommitBackend for FaultyBackend {
    async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Table, CommitError> {
        let hold = {
            let mut s = self.faults.state.lock().unwrap();
            if s.hold_commits > 0 {
                s.hold_commits -= 1;
                s.holding += 1;
                true
            } else {
                false
            }
        };
        if hold {
            self.wait_released().await;
        }
        if self.faults.take(|s| &mut s.refuse_commits) {
            return Err(CommitError::Failed("injected fault: HTTP 400".into()));
        }
        if self.faults.take(|s| &mut s.fail_commits) {
            return Err(CommitError::Unknown("injected fault: HTTP 503".into()));
        }
        let table = self.inner.commit(base, requirements, updates).await?;
        self.faults.commits.fetch_add(1, Ordering::SeqCst);
        if self.faults.take(|s| &mut s.lose_answers) {
            let hold = {
                let mut s = self.faults.state.lock().unwrap();
                let hold = s.hold_lost;
                if hold {
                    s.hold_lost = false;
                    s.holding += 1;
                }
                hold
            };
            if hold {
                self.wait_released().await;
            }
            return Err(CommitError::Unknown(
                "injected fault: the answer was lost after the commit".into(),
            ));
        }
        Ok(table)
    }
}

impl FaultyBackend {
    /// Waits for [`Faults::release`] (the caller counted itself in `holding`).
    async fn wait_released(&self) {
        loop {
            let released = self.faults.released.notified();
            if self.faults.state.lock().unwrap().open {
                break;
            }
            released.await;
        }
        self.faults.state.lock().unwrap().holding -= 1;
    }
}

/// The embedded catalog of `dir` (the files a config with `path = "<dir>/catalog.db"`,
/// `warehouse = "<dir>/warehouse"` names) with faults the test controls.
pub async fn faulty_catalog(dir: &Path, name: &str) -> Result<(CatalogHandle, Arc<Faults>)> {
    let faults = Arc::new(Faults::default());
    let id = {
        let mut registry = REGISTRY.lock().unwrap();
        registry.push(faults.clone());
        registry.len() - 1
    };
    let db = dir.join("catalog.db");
    let warehouse = dir.join("warehouse");
    std::fs::create_dir_all(&warehouse)?;
    let props = HashMap::from([
        (
            "uri".to_string(),
            format!("sqlite://{}?mode=rwc", db.display()),
        ),
        (
            "warehouse".to_string(),
            format!("file://{}", warehouse.display()),
        ),
        ("sql_bind_style".to_string(), "QMark".to_string()),
        ("pool.max-connections".to_string(), "1".to_string()),
    ]);
    let catalog = iceberg_catalog_sql::SqlCatalogBuilder::default()
        .with_storage_factory(Arc::new(FaultyStorageFactory { faults: id }))
        .load(name, props)
        .await?;
    let backend = SqlBackend::open(&db, name)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok((
        CatalogHandle {
            catalog: Arc::new(catalog),
            committer: Arc::new(FaultyBackend {
                inner: backend,
                faults: faults.clone(),
            }),
            rest: None,
        },
        faults,
    ))
}

/// A counter shared by tests that need unique names.
pub fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}
