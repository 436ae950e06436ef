//! Floe's Iceberg write path: the catalogs, the commit layer with the exactly-once
//! fence, row-delta and rewrite commits, delete files, snapshot expiry and orphan
//! cleanup.
//!
//! Independent of the agent (`floe-agent` depends on this crate, never the reverse):
//! settings come in as the serde types of this crate, which the agent's config embeds
//! (`[catalogs.NAME]` is a [`CatalogConfig`]); errors go out typed, each with its
//! `source()` and a [`ErrorClass`] (transient or fatal) the agent maps into its own
//! classes; the one metric, [`COMMIT_RETRIES`], goes straight to the `metrics` facade.
//!
//! # Entry points
//!
//! - Catalogs: [`open_catalog`] turns a [`CatalogConfig`] (embedded SQLite, SQL on
//!   Postgres, REST) into a [`CatalogHandle`]: the `iceberg::Catalog` for loads and
//!   creation plus the [`CommitBackend`] that applies commits. [`is_not_found`] and
//!   [`is_already_exists`] read the catalogs' errors. [`rest`] and [`aws`] hold the REST
//!   client and the AWS identity (which the agent's Kafka source reuses for MSK IAM).
//! - Appends and row deltas: [`StagedSnapshot::write`] writes the manifests of new data
//!   and delete files once; [`commit`] commits them with [`CommitOptions`] (summary
//!   properties, the [`OffsetMap`] it moves, the [`Fence`] precondition), rebasing on
//!   conflicts and finding its own commit after a lost answer; [`Committed`] or a
//!   [`CommitFailure`].
//! - Rewrites and metadata changes: [`commit_rewrite`] with a [`Rewrite`] planner
//!   (compaction), [`commit_updates`] for metadata-only changes.
//! - Offsets stored in tables: [`OffsetMap`], [`StoredOffsets`], the summary keys.
//! - Delete files: [`write_position_deletes`], [`read_position_deletes`], and
//!   deletion vectors in [`dv`]; [`manifests`] reads a snapshot's live files.
//! - Maintenance operations: [`expire::expire`] and [`expire::trim_metadata`] with
//!   [`ExpireOptions`]; [`orphans::remove_orphans`]. The agent schedules them.
//! - Secrets in settings: [`redact`].
//!
//! # Where iceberg-rust 0.10.1 falls short
//!
//! Each workaround is marked in the code with `// upstream: <feature> (...)`, so it
//! can be found (`grep -rn "// upstream:"`) and deleted when iceberg-rust gains it:
//!
//! - row-delta commits: `commit/mod.rs` ([`commit`]), `commit/snapshot.rs` (the snapshot
//!   producer and the spec id of a `DataFile`);
//! - a public `TableCommit` builder / `TransactionAction`: `catalog/backend.rs`
//!   ([`CommitBackend`], the SQL catalog's compare-and-swap);
//! - a rewrite-files action: `commit/rewrite.rs` ([`commit_rewrite`]);
//! - REST token refresh, SigV4 signing and the REST client around them:
//!   `catalog/rest/auth.rs`, `catalog/rest/sigv4.rs`, `catalog/rest/catalog.rs`;
//! - use and renewal of vended storage credentials: `catalog/rest/storage.rs`;
//! - `FileIO` listing: `catalog/object_store.rs` (orphan cleanup);
//! - the SQL catalog's error kinds: `catalog/mod.rs` ([`is_not_found`]);
//! - position-delete and deletion-vector writers: `deletes.rs`, `dv.rs`;
//! - `expire_snapshots` with file deletion, and public snapshot refs: `expire.rs`;
//! - a typed missing-file error: `error.rs` ([`error::is_missing_file`]).

mod catalog;
mod commit;
mod deletes;
pub mod dv;
pub mod error;
pub mod expire;
pub mod orphans;
pub mod redact;
pub mod retry;

pub use catalog::rest;
pub use catalog::{CALL_TIMEOUT, aws, object_store};
pub use catalog::{
    CatalogConfig, CatalogError, CatalogHandle, is_already_exists, is_not_found, open_catalog,
    probe_warehouse, probe_write,
};
pub use commit::manifests;
pub use commit::{
    COMMIT_KEY, CREATED_BY_PROPERTY, CommitBackend, CommitError, CommitFailure, CommitOptions,
    Committed, DELETE_AFTER_COMMIT, Fence, GAP_KEY, GiveUp, MAINTENANCE_KEY, OFFSETS_KEY,
    OFFSETS_PROPERTY_PREFIX, OffsetMap, OffsetsError, OffsetsSource, PIPELINE_KEY, PartitionMap,
    RESET_KEY, RestBackend, Rewrite, RewriteOutcome, RewritePlan, SpecFile, SqlBackend,
    StagedSnapshot, StoredOffsets, TopicPartition, WRITER_KEY, commit, commit_rewrite,
    commit_updates,
};
pub use deletes::{read_position_deletes, write_position_deletes};
pub use error::{Error, ErrorClass};
pub use expire::ExpireOptions;

/// `floe_commit_retries_total{pipeline}`: commit attempts retried after a catalog
/// conflict or an unknown outcome (the pipeline is the commit's `floe.pipeline` summary
/// property).
pub const COMMIT_RETRIES: &str = "floe_commit_retries_total";
