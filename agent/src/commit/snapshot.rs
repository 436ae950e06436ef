//! Building one snapshot from data files and delete files.
//!
//! The manifests of the new files are written once per commit; only the manifest list,
//! which names the parent's manifests, is rewritten when a retry lands on a newer parent.

use std::collections::HashMap;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile,
    ManifestListWriter, ManifestWriterBuilder, Operation, Schema, Snapshot, SnapshotReference,
    SnapshotRetention, Summary,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result, TableRequirement, TableUpdate};
use uuid::Uuid;

/// The files of one commit, written as manifests that do not depend on the parent.
pub struct StagedSnapshot {
    snapshot_id: i64,
    commit_uuid: Uuid,
    manifests: Vec<ManifestFile>,
    stats: FileStats,
    attempt: u32,
}

/// Counts that go into the snapshot summary.
#[derive(Debug, Default, Clone, Copy)]
struct FileStats {
    data_files: u64,
    data_records: u64,
    data_bytes: u64,
    delete_files: u64,
    position_deletes: u64,
    equality_deletes: u64,
    delete_bytes: u64,
}

impl StagedSnapshot {
    /// Writes the manifests for `data` and `deletes` under the table's metadata folder.
    /// `schema`: the schema the files were written with, if not the table's current one.
    pub async fn write(
        table: &Table,
        schema: Option<&Schema>,
        data: Vec<DataFile>,
        deletes: Vec<DataFile>,
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
        for f in &data {
            stats.data_files += 1;
            stats.data_records += f.record_count();
            stats.data_bytes += f.file_size_in_bytes();
        }
        for f in &deletes {
            stats.delete_files += 1;
            stats.delete_bytes += f.file_size_in_bytes();
            match f.content_type() {
                DataContentType::EqualityDeletes => stats.equality_deletes += f.record_count(),
                _ => stats.position_deletes += f.record_count(),
            }
        }
        let mut manifests = Vec::new();
        for (content, files) in [
            (ManifestContentType::Data, data),
            (ManifestContentType::Deletes, deletes),
        ] {
            if files.is_empty() {
                continue;
            }
            let path = format!(
                "{}/metadata/{commit_uuid}-m{}.avro",
                metadata.location(),
                manifests.len()
            );
            let builder = ManifestWriterBuilder::new(
                table.file_io().new_output(path)?,
                Some(snapshot_id),
                match schema {
                    Some(s) => std::sync::Arc::new(s.clone()),
                    None => metadata.current_schema().clone(),
                },
                metadata.default_partition_spec().as_ref().clone(),
            );
            let mut writer = match (metadata.format_version(), content) {
                (FormatVersion::V1, _) => builder.build_v1(),
                (FormatVersion::V2, ManifestContentType::Data) => builder.build_v2_data(),
                (FormatVersion::V2, ManifestContentType::Deletes) => builder.build_v2_deletes(),
                (FormatVersion::V3, ManifestContentType::Data) => builder.build_v3_data(),
                (FormatVersion::V3, ManifestContentType::Deletes) => builder.build_v3_deletes(),
            };
            for file in files {
                // -1: the data sequence number is inherited from the manifest list.
                writer.add_file(file, -1)?;
            }
            manifests.push(writer.write_manifest_file().await?);
        }
        Ok(StagedSnapshot {
            snapshot_id,
            commit_uuid,
            manifests,
            stats,
            attempt: 0,
        })
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
        let parent_id = parent.map(|s| s.snapshot_id());
        let sequence_number = metadata.next_sequence_number();

        let mut manifests: Vec<ManifestFile> = match parent {
            Some(snapshot) => base
                .manifest_list_reader(snapshot)
                .load()
                .await?
                .entries()
                .iter()
                .filter(|m| m.has_added_files() || m.has_existing_files() || m.has_deleted_files())
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        manifests.extend(self.manifests.iter().cloned());

        let list_path = format!(
            "{}/metadata/snap-{}-{}-{}.avro",
            metadata.location(),
            self.snapshot_id,
            self.attempt,
            self.commit_uuid
        );
        let output = base.file_io().new_output(&list_path)?.writer().await?;
        let first_row_id = metadata.next_row_id();
        let mut list = match metadata.format_version() {
            FormatVersion::V1 => ManifestListWriter::v1(output, self.snapshot_id, parent_id),
            FormatVersion::V2 => {
                ManifestListWriter::v2(output, self.snapshot_id, parent_id, sequence_number)
            }
            FormatVersion::V3 => ManifestListWriter::v3(
                output,
                self.snapshot_id,
                parent_id,
                sequence_number,
                Some(first_row_id),
            ),
        };
        list.add_manifests(manifests.into_iter())?;
        let next_row_id = list.next_row_id();
        list.close().await?;

        let summary = Summary {
            operation: if self.stats.delete_files > 0 {
                Operation::Overwrite
            } else {
                Operation::Append
            },
            additional_properties: self.summary_properties(parent.map(|s| s.summary()), properties),
        };
        // The id the metadata builder gives an added schema: an identical one's, or the next.
        let schema_id = match new_schema {
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
            .with_snapshot_id(self.snapshot_id)
            .with_parent_snapshot_id(parent_id)
            .with_sequence_number(sequence_number)
            .with_summary(summary)
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
        if let Some(schema) = new_schema {
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
            reference: SnapshotReference::new(
                self.snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        });
        Ok((requirements, updates))
    }

    /// The standard summary counters (`added-*`, `total-*`) plus our own properties.
    fn summary_properties(
        &self,
        parent: Option<&Summary>,
        properties: &HashMap<String, String>,
    ) -> HashMap<String, String> {
        let s = self.stats;
        let mut out = properties.clone();
        let mut put = |key: &str, added: u64, total_key: &str| {
            if added > 0 {
                out.insert(key.to_string(), added.to_string());
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
                out.insert(total_key.to_string(), (before + added).to_string());
            }
        };
        put("added-data-files", s.data_files, "total-data-files");
        put("added-records", s.data_records, "total-records");
        put(
            "added-files-size",
            s.data_bytes + s.delete_bytes,
            "total-files-size",
        );
        put("added-delete-files", s.delete_files, "total-delete-files");
        put(
            "added-position-deletes",
            s.position_deletes,
            "total-position-deletes",
        );
        put(
            "added-equality-deletes",
            s.equality_deletes,
            "total-equality-deletes",
        );
        out
    }
}

/// A random positive snapshot id not used by the table.
fn unique_snapshot_id(table: &Table) -> i64 {
    loop {
        let (hi, lo) = Uuid::new_v4().as_u64_pair();
        let id = ((hi ^ lo) >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}
