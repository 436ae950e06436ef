//! Floe's Iceberg write path: the catalogs, the commit layer with the exactly-once
//! fence, row-delta and rewrite commits, delete files, snapshot expiry and orphan
//! cleanup. Independent of the agent: its settings come in as the serde types below
//! (which the agent's config embeds), its errors go out typed with a
//! [`ErrorClass`], and its one metric ([`COMMIT_RETRIES`]) goes to the `metrics` facade.

mod catalog;
mod commit;
mod deletes;
pub mod dv;
pub mod error;
pub mod expire;
pub mod orphans;
pub mod redact;

pub use catalog::rest;
pub use catalog::{CALL_TIMEOUT, aws, object_store};
pub use catalog::{
    CatalogConfig, CatalogError, CatalogHandle, is_already_exists, is_not_found, open_catalog,
};
pub use commit::manifests;
pub use commit::{
    COMMIT_KEY, CommitBackend, CommitError, CommitFailure, CommitOptions, Committed,
    DELETE_AFTER_COMMIT, Fence, GAP_KEY, MAINTENANCE_KEY, OFFSETS_KEY, OFFSETS_PROPERTY_PREFIX,
    OffsetMap, OffsetsError, OffsetsSource, PIPELINE_KEY, PartitionMap, RESET_KEY, RestBackend,
    Rewrite, RewriteOutcome, RewritePlan, SpecFile, SqlBackend, StagedSnapshot, StoredOffsets,
    TopicPartition, WRITER_KEY, commit, commit_rewrite, commit_updates,
};
pub use deletes::{read_position_deletes, write_position_deletes};
pub use error::{Error, ErrorClass};
pub use expire::ExpireOptions;

/// `floe_commit_retries_total{pipeline}`: commit attempts retried after a catalog
/// conflict or an unknown outcome (the pipeline is the commit's `floe.pipeline` summary
/// property).
pub const COMMIT_RETRIES: &str = "floe_commit_retries_total";
