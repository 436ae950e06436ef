//! Building one snapshot from data files and delete files.
//!
//! The manifests of the new files are written once per commit, one per content type and
//! partition spec; only the manifest list, which names the parent's manifests, is
//! rewritten when a retry lands on a newer parent. A commit that removes files (a
//! deletion vector replaced by a merged one) also rewrites, at each attempt, the parent's
//! manifests that list them. Manifests of the parent with no live file left are dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestEntry,
    ManifestFile, ManifestListWriter, ManifestWriter, ManifestWriterBuilder, Operation,
    PartitionSpec, Schema, SchemaRef, Snapshot, SnapshotReference, SnapshotRetention, Summary,
    TableMetadata,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result, TableRequirement, TableUpdate};
use uuid::Uuid;

use super::manifests::{self, FileKey};

// upstream: snapshot producer (iceberg-rust 0.10 keeps its SnapshotProducer crate-
// private, so manifests and the manifest list are written here; delete with row-delta)
/// The files of one commit, written as manifests that do not depend on the parent.
pub struct StagedSnapshot {
    snapshot_id: i64,
    commit_uuid: Uuid,
    manifests: Vec<ManifestFile>,
    stats: FileStats,
    attempt: u32,
    /// Entries of the parent this snapshot removes (found and rewritten at each attempt).
    removed: HashSet<FileKey>,
}

/// Counts that go into the snapshot summary.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FileStats {
    pub(crate) data_files: u64,
    pub(crate) data_records: u64,
    pub(crate) data_bytes: u64,
    pub(crate) delete_files: u64,
    pub(crate) position_deletes: u64,
    pub(crate) equality_deletes: u64,
    pub(crate) delete_bytes: u64,
}

impl FileStats {
    pub(crate) fn add(&mut self, f: &DataFile) {
        match f.content_type() {
            DataContentType::Data => {
                self.data_files += 1;
                self.data_records += f.record_count();
                self.data_bytes += f.file_size_in_bytes();
            }
            content => {
                self.delete_files += 1;
                // A deletion vector's size is its blob's, not the shared Puffin file's.
                self.delete_bytes += f
                    .content_size_in_bytes()
                    .map_or(f.file_size_in_bytes(), |s| s as u64);
                if content == DataContentType::EqualityDeletes {
                    self.equality_deletes += f.record_count();
                } else {
                    self.position_deletes += f.record_count();
                }
            }
        }
    }
}

impl StagedSnapshot {
    /// Writes the manifests for `data` and `deletes` under the table's metadata folder.
    /// Each file comes with the id of the partition spec it was written for (the
    /// default spec for new data; a delete file takes its data file's).
    /// `schema`: the schema the files were written with, if not the table's current one.
    pub async fn write(
        table: &Table,
        schema: Option<&Schema>,
        data: Vec<SpecFile>,
        deletes: Vec<SpecFile>,
    ) -> Result<Self> {
        let metadata = table.metadata();
        if !deletes.is_empty() && metadata.format_version() == FormatVersion::V1 {
            return Err(Error::new(
                ErrorKind::FeatureUnsupported,
                "delete files need table format version 2 or later",
            ));
        }
        let snapshot_id = unique_snapshot_id(table);
        let commit_uuid = Uuid::now_v7();
        let mut stats = FileStats::default();
        for (_, f) in data.iter().chain(&deletes) {
            stats.add(f);
        }
        let schema: SchemaRef = match schema {
            Some(s) => Arc::new(s.clone()),
            None => metadata.current_schema().clone(),
        };
        let mut manifests = Vec::new();
        let mut n = 0;
        for (content, files) in [
            (ManifestContentType::Data, data),
            (ManifestContentType::Deletes, deletes),
        ] {
            for (spec_id, files) in by_spec(files) {
                let spec = spec_of(metadata, spec_id)?;
                let path = format!("{}/metadata/{commit_uuid}-m{n}.avro", metadata.location());
                n += 1;
                let mut writer =
                    manifest_writer(table, &path, snapshot_id, schema.clone(), spec, content)?;
                for file in files {
                    // -1: the data sequence number is inherited from the manifest list.
                    writer.add_file(file, -1)?;
                }
                manifests.push(writer.write_manifest_file().await?);
            }
        }
        Ok(StagedSnapshot {
            snapshot_id,
            commit_uuid,
            manifests,
            stats,
            attempt: 0,
            removed: HashSet::new(),
        })
    }

    /// The id the snapshot will have.
    pub fn snapshot_id(&self) -> i64 {
        self.snapshot_id
    }

    /// Also removes these live entries of the parent (every one must be live in it).
    pub fn remove(&mut self, files: impl IntoIterator<Item = FileKey>) {
        self.removed.extend(files);
    }

    /// The requirements and updates that add this snapshot on top of `base`'s `main`
    /// branch, with `properties` in its summary and, if given, a new current schema.
    pub async fn updates(
        &mut self,
        base: &Table,
        properties: &HashMap<String, String>,
        new_schema: Option<&Schema>,
    ) -> Result<(Vec<TableRequirement>, Vec<TableUpdate>)> {
        let metadata = base.metadata();
        if metadata.snapshot_by_id(self.snapshot_id).is_some() {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("snapshot id {} already used", self.snapshot_id),
            ));
        }
        self.attempt += 1;
        let parent = metadata.current_snapshot();
        let mut manifests = Vec::new();
        let mut removed = FileStats::default();
        if let Some(snapshot) = parent {
            let mut found = 0;
            for file in manifests::manifest_files(base, snapshot).await? {
                if !(file.has_added_files() || file.has_existing_files()) {
                    continue;
                }
                if self.removed.is_empty() {
                    manifests.push(file);
                    continue;
                }
                let manifest = manifests::load(base, &file).await?;
                let hits = manifest
                    .entries()
                    .iter()
                    .filter(|e| e.is_alive() && self.removed.contains(&FileKey::of(e.data_file())))
                    .count();
                if hits == 0 {
                    manifests.push(file);
                    continue;
                }
                found += hits;
                let path = format!(
                    "{}/metadata/{}-r{}-{}.avro",
                    metadata.location(),
                    self.commit_uuid,
                    self.attempt,
                    manifests.len()
                );
                let mut writer = manifest_writer(
                    base,
                    &path,
                    self.snapshot_id,
                    manifest.metadata().schema().clone(),
                    manifest.metadata().partition_spec().clone(),
                    file.content,
                )?;
                for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                    if self.removed.contains(&FileKey::of(entry.data_file())) {
                        removed.add(entry.data_file());
                        add_deleted(&mut writer, entry)?;
                    } else {
                        add_existing(&mut writer, entry)?;
                    }
                }
                manifests.push(writer.write_manifest_file().await?);
            }
            if found != self.removed.len() {
                return Err(Error::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "{} of the {} files this commit removes are not live in the table",
                        self.removed.len() - found,
                        self.removed.len()
                    ),
                )
                .with_source(NotLive));
            }
        } else if !self.removed.is_empty() {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                "a commit on an empty table cannot remove files",
            )
            .with_source(NotLive));
        }
        manifests.extend(self.manifests.iter().cloned());
        // As Java's RowDelta names it: only deletes is `delete`, deletes with new rows
        // `overwrite`, only new rows `append`.
        let deletes = self.stats.delete_files > 0 || !self.removed.is_empty();
        let operation = match (deletes, self.stats.data_files > 0) {
            (false, _) => Operation::Append,
            (true, false) => Operation::Delete,
            (true, true) => Operation::Overwrite,
        };
        let summary = Summary {
            operation,
            additional_properties: summary_properties(
                self.stats,
                removed,
                parent.map(|s| s.summary()),
                properties,
            ),
        };
        finish(
            base,
            SnapshotParts {
                snapshot_id: self.snapshot_id,
                list_name: format!("{}-{}", self.attempt, self.commit_uuid),
                manifests,
                summary,
                new_schema,
            },
        )
        .await
    }
}

/// The source of the error [`StagedSnapshot::updates`] returns when files it removes
/// are not live in the base: the removal was planned on another version of the table.
#[derive(Debug, thiserror::Error)]
#[error("files to remove are not live in this version of the table")]
pub(crate) struct NotLive;

/// Whether `e` is that error.
pub(crate) fn removes_files_not_live(e: &Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<NotLive>())
}

/// What [`finish`] needs to add a snapshot to `main`.
pub(crate) struct SnapshotParts<'a> {
    pub(crate) snapshot_id: i64,
    /// Unique per attempt: part of the manifest list's file name.
    pub(crate) list_name: String,
    pub(crate) manifests: Vec<ManifestFile>,
    pub(crate) summary: Summary,
    pub(crate) new_schema: Option<&'a Schema>,
}

/// Writes the manifest list of `parts` on top of `base`'s `main` and returns the
/// requirements and updates that commit it.
pub(crate) async fn finish(
    base: &Table,
    parts: SnapshotParts<'_>,
) -> Result<(Vec<TableRequirement>, Vec<TableUpdate>)> {
    let metadata = base.metadata();
    let parent_id = metadata.current_snapshot_id();
    let sequence_number = metadata.next_sequence_number();
    let snapshot_id = parts.snapshot_id;
    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-{}.avro",
        metadata.location(),
        parts.list_name
    );
    let output = base.file_io().new_output(&list_path)?.writer().await?;
    let first_row_id = metadata.next_row_id();
    let mut list = match metadata.format_version() {
        FormatVersion::V1 => ManifestListWriter::v1(output, snapshot_id, parent_id),
        FormatVersion::V2 => {
            ManifestListWriter::v2(output, snapshot_id, parent_id, sequence_number)
        }
        FormatVersion::V3 => ManifestListWriter::v3(
            output,
            snapshot_id,
            parent_id,
            sequence_number,
            Some(first_row_id),
        ),
    };
    list.add_manifests(parts.manifests.into_iter())?;
    let next_row_id = list.next_row_id();
    list.close().await?;

    // The id the metadata builder gives an added schema: an identical one's, or the next.
    let schema_id = match parts.new_schema {
        Some(new) => metadata
            .schemas_iter()
            .find(|s| {
                s.as_struct() == new.as_struct()
                    && s.identifier_field_ids().eq(new.identifier_field_ids())
            })
            .map(|s| s.schema_id())
            .unwrap_or_else(|| {
                metadata
                    .schemas_iter()
                    .map(|s| s.schema_id())
                    .max()
                    .unwrap_or_default()
                    + 1
            }),
        None => metadata.current_schema_id(),
    };
    let builder = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent_id)
        .with_sequence_number(sequence_number)
        .with_summary(parts.summary)
        .with_schema_id(schema_id)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis());
    let snapshot = match next_row_id {
        Some(next) => builder
            .with_row_range(first_row_id, next - first_row_id)
            .build(),
        None => builder.build(),
    };

    let mut requirements = vec![
        TableRequirement::UuidMatch {
            uuid: metadata.uuid(),
        },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: parent_id,
        },
    ];
    let mut updates = Vec::new();
    if let Some(schema) = parts.new_schema {
        requirements.push(TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: metadata.current_schema_id(),
        });
        requirements.push(TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: metadata.last_column_id(),
        });
        updates.push(TableUpdate::AddSchema {
            schema: schema.clone(),
        });
        // -1: the schema added by this commit.
        updates.push(TableUpdate::SetCurrentSchema { schema_id: -1 });
    }
    updates.push(TableUpdate::AddSnapshot { snapshot });
    updates.push(TableUpdate::SetSnapshotRef {
        ref_name: MAIN_BRANCH.to_string(),
        reference: SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
    });
    Ok((requirements, updates))
}

/// The standard summary counters (`added-*`, `deleted-*`, `removed-*`, `total-*`) plus
/// our own properties.
pub(crate) fn summary_properties(
    added: FileStats,
    removed: FileStats,
    parent: Option<&Summary>,
    properties: &HashMap<String, String>,
) -> HashMap<String, String> {
    let mut out = properties.clone();
    let mut put = |add_key: &str, remove_key: &str, add: u64, remove: u64, total_key: &str| {
        if add > 0 {
            out.insert(add_key.to_string(), add.to_string());
        }
        if remove > 0 {
            out.insert(remove_key.to_string(), remove.to_string());
        }
        // Totals are only exact when the parent had them (or there is no parent).
        let before = match parent {
            None => Some(0),
            Some(p) => p
                .additional_properties
                .get(total_key)
                .and_then(|v| v.parse::<u64>().ok()),
        };
        if let Some(before) = before {
            let total = (before + add).saturating_sub(remove);
            out.insert(total_key.to_string(), total.to_string());
        }
    };
    put(
        "added-data-files",
        "deleted-data-files",
        added.data_files,
        removed.data_files,
        "total-data-files",
    );
    put(
        "added-records",
        "deleted-records",
        added.data_records,
        removed.data_records,
        "total-records",
    );
    put(
        "added-files-size",
        "removed-files-size",
        added.data_bytes + added.delete_bytes,
        removed.data_bytes + removed.delete_bytes,
        "total-files-size",
    );
    put(
        "added-delete-files",
        "removed-delete-files",
        added.delete_files,
        removed.delete_files,
        "total-delete-files",
    );
    put(
        "added-position-deletes",
        "removed-position-deletes",
        added.position_deletes,
        removed.position_deletes,
        "total-position-deletes",
    );
    put(
        "added-equality-deletes",
        "removed-equality-deletes",
        added.equality_deletes,
        removed.equality_deletes,
        "total-equality-deletes",
    );
    out
}

// upstream: DataFile::partition_spec_id (iceberg-rust does not expose it; delete when it
// does)
/// A file with the id of the partition spec its partition tuple belongs to
/// (iceberg-rust does not expose the id a `DataFile` carries).
pub type SpecFile = (i32, DataFile);

/// `files` grouped by partition spec id, in the order specs first appear.
pub(crate) fn by_spec(files: Vec<SpecFile>) -> Vec<(i32, Vec<DataFile>)> {
    let mut out: Vec<(i32, Vec<DataFile>)> = Vec::new();
    for (spec, f) in files {
        match out.iter_mut().find(|(s, _)| *s == spec) {
            Some((_, v)) => v.push(f),
            None => out.push((spec, vec![f])),
        }
    }
    out
}

/// The partition spec `spec_id` of the table.
pub(crate) fn spec_of(metadata: &TableMetadata, spec_id: i32) -> Result<PartitionSpec> {
    metadata
        .partition_spec_by_id(spec_id)
        .map(|s| s.as_ref().clone())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("a file names partition spec {spec_id}, which the table does not have"),
            )
        })
}

/// A manifest writer for `content` files of `spec` at `path`.
pub(crate) fn manifest_writer(
    table: &Table,
    path: &str,
    snapshot_id: i64,
    schema: SchemaRef,
    spec: PartitionSpec,
    content: ManifestContentType,
) -> Result<ManifestWriter> {
    let builder = ManifestWriterBuilder::new(
        table.file_io().new_output(path)?,
        Some(snapshot_id),
        schema,
        spec,
    );
    Ok(match (table.metadata().format_version(), content) {
        (FormatVersion::V1, _) => builder.build_v1(),
        (FormatVersion::V2, ManifestContentType::Data) => builder.build_v2_data(),
        (FormatVersion::V2, ManifestContentType::Deletes) => builder.build_v2_deletes(),
        (FormatVersion::V3, ManifestContentType::Data) => builder.build_v3_data(),
        (FormatVersion::V3, ManifestContentType::Deletes) => builder.build_v3_deletes(),
    })
}

/// Copies a live entry into a rewritten manifest, unchanged.
pub(crate) fn add_existing(writer: &mut ManifestWriter, entry: &ManifestEntry) -> Result<()> {
    let (snapshot_id, seq, file_seq) = entry_numbers(entry)?;
    writer.add_existing_file(entry.data_file().clone(), snapshot_id, seq, Some(file_seq))
}

/// Records a live entry as removed by the snapshot the manifest belongs to.
pub(crate) fn add_deleted(writer: &mut ManifestWriter, entry: &ManifestEntry) -> Result<()> {
    let (_, seq, file_seq) = entry_numbers(entry)?;
    writer.add_delete_file(entry.data_file().clone(), seq, Some(file_seq))
}

fn entry_numbers(entry: &ManifestEntry) -> Result<(i64, i64, i64)> {
    let missing = || {
        Error::new(
            ErrorKind::DataInvalid,
            format!(
                "manifest entry of {} lacks its snapshot or sequence number",
                entry.file_path()
            ),
        )
    };
    let snapshot_id = entry.snapshot_id().ok_or_else(missing)?;
    let seq = entry.sequence_number().ok_or_else(missing)?;
    Ok((snapshot_id, seq, entry.file_sequence_number.unwrap_or(seq)))
}

/// A random positive snapshot id not used by the table.
pub(crate) fn unique_snapshot_id(table: &Table) -> i64 {
    loop {
        let (hi, lo) = Uuid::new_v4().as_u64_pair();
        let id = ((hi ^ lo) >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}
