//! Crash points for tests: with `FLOE_FAILPOINT=<name>` set, the agent stops at that
//! point, prints `FLOE_FAILPOINT <name> reached` to stderr (and writes the name to the
//! file `FLOE_FAILPOINT_FILE` names, if set: tests wait on that state, not on log text)
//! and waits to be killed.
//! Used by the crash tests to SIGKILL the agent at exact moments of a commit.
//! With `FLOE_FAILPOINT_RESUME=<file>` also set, it waits for that file instead, deletes
//! it and goes on (used to let another writer commit at an exact moment).

use std::sync::OnceLock;

/// Before any data file of a commit is written.
pub const BEFORE_WRITE: &str = "before_write";
/// After the data files are written, before the Iceberg commit.
pub const AFTER_WRITE: &str = "after_write";
/// After the Iceberg commit, before the consumer-group offset commit.
pub const AFTER_COMMIT: &str = "after_commit";
/// Compaction: after the new files are written, before the replace commit.
pub const COMPACT_BEFORE_COMMIT: &str = "compact_before_commit";

/// Parks the process forever if `name` is the configured failpoint.
pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        std::env::var("FLOE_FAILPOINT")
            .ok()
            .filter(|s| !s.is_empty())
    });
    if armed.as_deref() == Some(name) {
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
