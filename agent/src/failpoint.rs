//! Crash points for tests: with `FLOE_FAILPOINT=<name>` set, the agent stops at that
//! point, prints `FLOE_FAILPOINT <name> reached` to stderr (and writes the name to the
//! file `FLOE_FAILPOINT_FILE` names, if set: tests wait on that state, not on log text)
//! and waits to be killed.
//! Used by the crash tests to SIGKILL the agent at exact moments of a commit.
//! With `FLOE_FAILPOINT_RESUME=<file>` also set, it waits for that file instead, deletes
//! it and goes on (used to let another writer commit at an exact moment).
//! With `FLOE_FAILPOINT_SKIP=<n>` the first `n` hits pass (to stop mid-stream, with a
//! file partly written).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Before a chunk of rows is written into the open data files.
pub const BEFORE_WRITE: &str = "before_write";
/// After a chunk is written into the open data files (a file may be half written:
/// some row groups in storage, not closed), before the Iceberg commit.
pub const AFTER_WRITE: &str = "after_write";
/// After an interval's dead letters are durable (file synced, topic acknowledged),
/// before the commit that moves offsets past them.
pub const AFTER_DEAD_LETTERS: &str = "after_dead_letters";
/// After the Iceberg commit, before the consumer-group offset commit.
pub const AFTER_COMMIT: &str = "after_commit";
/// Compaction: after the new files are written, before the replace commit.
pub const COMPACT_BEFORE_COMMIT: &str = "compact_before_commit";

/// Upsert key index: a run's entries are durable, its sidecar not yet written.
pub const INDEX_RUN_WRITTEN: &str = "index_run_written";
/// Upsert key index: a merged run is complete, about to replace its inputs.
pub const INDEX_MERGE_INSTALL: &str = "index_merge_install";
/// Upsert key index: a merge was installed between two spills and the manifest
/// rewritten with the new runs (the memory table holds keys of newer commits).
pub const INDEX_MERGE_INSTALLED: &str = "index_merge_installed";
/// Upsert key index: the runs are durable, the manifest naming them not yet written.
pub const INDEX_BEFORE_MANIFEST: &str = "index_before_manifest";
/// Upsert key index: a rebuild has read a data file and has spilled to disk.
pub const INDEX_REBUILDING: &str = "index_rebuilding";

/// Parks the process forever if `name` is the configured failpoint.
pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        std::env::var("FLOE_FAILPOINT")
            .ok()
            .filter(|s| !s.is_empty())
    });
    static SKIP: OnceLock<u64> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    if armed.as_deref() == Some(name) {
        let skip = *SKIP.get_or_init(|| {
            std::env::var("FLOE_FAILPOINT_SKIP")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        });
        if HITS.fetch_add(1, Ordering::Relaxed) < skip {
            return;
        }
        eprintln!("FLOE_FAILPOINT {name} reached");
        if let Some(file) = std::env::var_os("FLOE_FAILPOINT_FILE") {
            let _ = std::fs::write(file, name);
        }
        let resume = std::env::var_os("FLOE_FAILPOINT_RESUME").map(std::path::PathBuf::from);
        loop {
            if let Some(file) = &resume
                && std::fs::remove_file(file).is_ok()
            {
                eprintln!("FLOE_FAILPOINT {name} resumed");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
