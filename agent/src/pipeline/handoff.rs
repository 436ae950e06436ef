//! What the intake and the committer tell each other, in order.
//!
//! The intake hands over [`Chunk`]s of rows as its per-table buffers fill (the committer
//! streams them into open data files at once) and, every commit interval, a [`Mark`]:
//! everything handed over before it is committed with the offsets it names. The
//! committer answers with [`Report`]s. Every rewind goes through the committer, so that a
//! chunk or mark already handed over is committed or dropped before reading starts again:
//! handoffs carry the read epoch they belong to, and those of an older epoch are dropped.

use std::sync::Arc;

use iceberg::spec::Schema;

use super::PipelineError;
use crate::batch::Buffered;
use crate::record::PartitionMap;
use crate::schema::SchemaTracker;
use crate::sink::TableSink;
use floe_iceberg::OffsetMap;

/// What the intake hands to the committer, in order.
pub(super) enum Handoff {
    /// Rows of one table, to stream into its open files.
    Rows(Box<Chunk>),
    /// The end of a commit interval.
    Mark(Mark),
    /// A table added while running (the table of a new topic): its rows follow.
    AddTable(Box<TableSink>),
    /// Drop everything not committed and position reading at the stored offsets, once
    /// every earlier mark is committed (a plugin fault).
    Rewind {
        /// The epoch the request was made in.
        epoch: u64,
        /// Why (for the log).
        reason: String,
    },
}

/// Buffered rows of one table.
pub(super) struct Chunk {
    /// The read epoch the rows belong to.
    pub epoch: u64,
    /// Table index (pipeline order).
    pub table: usize,
    /// The rows.
    pub buffered: Buffered,
    /// The columns they were admitted into (the commit evolves the table to these).
    pub tracker: SchemaTracker,
    /// Where this interval's records start per partition, when the table does not exist
    /// yet: a table created for these rows starts with these offsets, so a crash before
    /// its first data commit makes the pipeline read them again.
    pub from: Option<PartitionMap<i64>>,
}

/// The end of a commit interval.
pub(super) struct Mark {
    /// The read epoch (a mark of an older epoch is dropped).
    pub epoch: u64,
    /// Its number (counting up): [`Report::Durable`] names the last one committed.
    pub seq: u64,
    /// The last mark before stopping: also record progress in tables without rows.
    pub closing: bool,
    /// Next offset per partition read so far (what the commit covers).
    pub next: PartitionMap<i64>,
    /// Records lost to retention before they were read, per partition (for the summary).
    pub gaps: PartitionMap<(i64, i64)>,
    /// Partitions whose log restarted below the stored offset (for the summary).
    pub resets: PartitionMap<(i64, i64)>,
}

/// What the committer tells the intake.
#[derive(Debug)]
pub(super) enum Report {
    /// Table `table` now stores `offsets`.
    Committed {
        /// Table index.
        table: usize,
        /// What it stores for the pipeline.
        offsets: OffsetMap,
    },
    /// Everything handed over up to mark `seq` is committed in every table.
    Durable {
        /// The mark.
        seq: u64,
    },
    /// Everything not committed is dropped: read again from the tables' offsets, with
    /// records of `epoch` and later.
    Rewind {
        /// The new read epoch.
        epoch: u64,
        /// Per table: what it stores now.
        tables: Vec<TableState>,
    },
    /// The pipeline cannot go on.
    Failed(PipelineError),
    /// The closing mark is committed.
    Done,
}

/// A table as loaded from the catalog.
#[derive(Debug)]
pub(super) struct TableState {
    /// Its stored offsets for the pipeline.
    pub committed: OffsetMap,
    /// Its current schema, if it exists.
    pub schema: Option<Arc<Schema>>,
    /// Whether it exists.
    pub exists: bool,
}
