//! Compaction: bin-pack small data files per partition and apply deletes.
//!
//! Per partition (spec id and partition tuple), the data files smaller than 3/4 of the
//! target size, and every data file that has deletes, are rewritten when there are at
//! least `min_input_files` small ones or any deletes: their live rows (position deletes
//! and deletion vectors applied) are streamed, file after file, into new files rolled
//! at the target size. Delete files whose every data file is rewritten (or gone) are
//! removed, so a compacted table has no delete files left.
//!
//! Safety next to other writers. The rewrite is committed through
//! [`floe_iceberg::commit_rewrite`], which plans it again against every newer table:
//! - a concurrent append only adds files: kept as they are;
//! - a concurrent delete of rows in a file being rewritten (an upsert commit, a
//!   deletion vector merged with the old one) is carried over: the row's new position is
//!   known from the rewrite's row mapping, and a delete file for the new file is added
//!   in the same snapshot;
//! - a data file being rewritten that another writer removed, or equality deletes,
//!   make the run give up (nothing is committed; the next run starts again).
//!
//! A row is never dropped silently: the rows written must equal the live rows read, or
//! nothing is committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{BooleanArray, RecordBatch};
use async_trait::async_trait;
use futures::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, FormatVersion, PartitionSpec, Schema, Struct,
};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use super::{MaintainError, Target, size};
use crate::sink::writer::PartitionWriter;
use floe_iceberg::CatalogHandle;
use floe_iceberg::dv;
use floe_iceberg::manifests::{self, FileKey, LiveFile};
use floe_iceberg::{
    COMMIT_KEY, GiveUp, MAINTENANCE_KEY, Rewrite, RewriteOutcome, RewritePlan, SpecFile,
    commit_rewrite,
};

/// Files below this share of the target size count as small.
const SMALL: f64 = 0.75;

/// One partition to rewrite.
struct Group {
    spec: PartitionSpec,
    partition: Struct,
    /// Input data files, in the order their rows are written.
    inputs: Vec<LiveFile>,
}

/// Where an input file's live rows went: its first row's index in the group's output
/// and the positions it had deleted.
struct Placement {
    group: usize,
    first: u64,
    deleted: RoaringTreemap,
}

/// Compacts `table` once; returns what it did.
pub async fn compact(
    catalog: &CatalogHandle,
    table: Table,
    target: &Target,
    dry_run: bool,
) -> Result<String, MaintainError> {
    let Some(snapshot) = table.metadata().current_snapshot().cloned() else {
        return Ok("the table has no snapshot".into());
    };
    let live = manifests::live_files(&table, &snapshot).await?;
    if live
        .iter()
        .any(|f| f.content() == DataContentType::EqualityDeletes)
    {
        return Ok("skipped: the table has equality-delete files (from another engine), which Floe's compaction does not apply".into());
    }
    let data: Vec<&LiveFile> = live
        .iter()
        .filter(|f| f.content() == DataContentType::Data)
        .collect();
    let live_data: HashSet<&str> = data.iter().map(|f| f.path()).collect();
    // Deleted positions per data file, and which data files each delete file names.
    let mut deleted: HashMap<String, RoaringTreemap> = HashMap::new();
    let mut names: Vec<(FileKey, Vec<String>)> = Vec::new();
    for f in live
        .iter()
        .filter(|f| f.content() == DataContentType::PositionDeletes)
    {
        let rows = read_delete_file(&table, f.entry.data_file()).await?;
        let mut named = Vec::new();
        for (path, positions) in rows {
            deleted.entry(path.clone()).or_default().extend(positions);
            named.push(path);
        }
        names.push((f.key(), named));
    }

    let target_size = target.target_file_size;
    let small = |f: &LiveFile| (f.entry.file_size_in_bytes() as f64) < target_size as f64 * SMALL;
    let mut index: HashMap<(i32, &Struct), usize> = HashMap::new();
    let mut by_partition: Vec<(i32, Vec<&LiveFile>)> = Vec::new();
    for f in &data {
        let key = (
            f.manifest.partition_spec_id,
            f.entry.data_file().partition(),
        );
        let at = *index.entry(key).or_insert_with(|| {
            by_partition.push((key.0, Vec::new()));
            by_partition.len() - 1
        });
        by_partition[at].1.push(f);
    }
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    let schema = table.metadata().current_schema().clone();
    for (spec_id, files) in by_partition {
        let with_deletes = files
            .iter()
            .filter(|f| deleted.contains_key(f.path()))
            .count();
        let small_files = files.iter().filter(|f| small(f)).count();
        if with_deletes == 0 && small_files < target.config.min_input_files {
            continue;
        }
        let Some(spec) = table.metadata().partition_spec_by_id(spec_id) else {
            skipped.push(format!("partition spec {spec_id} is missing"));
            continue;
        };
        if let Err(e) = crate::sink::partition::check_spec(spec, &schema) {
            skipped.push(e.to_string());
            continue;
        }
        let mut inputs: Vec<LiveFile> = files
            .into_iter()
            .filter(|f| small(f) || deleted.contains_key(f.path()))
            .cloned()
            .collect();
        if inputs.len() < 2 && with_deletes == 0 {
            continue;
        }
        inputs
            .sort_by(|a, b| (a.sequence_number(), a.path()).cmp(&(b.sequence_number(), b.path())));
        let partition = inputs[0].entry.data_file().partition().clone();
        groups.push(Group {
            spec: spec.as_ref().clone(),
            partition,
            inputs,
        });
    }
    let rewritten: HashSet<String> = groups
        .iter()
        .flat_map(|g| g.inputs.iter().map(|f| f.path().to_string()))
        .collect();
    // Delete files all of whose data files are rewritten or no longer live.
    let removed_deletes: HashSet<FileKey> = names
        .iter()
        .filter(|(_, named)| {
            named
                .iter()
                .all(|p| rewritten.contains(p) || !live_data.contains(p.as_str()))
        })
        .map(|(k, _)| k.clone())
        .collect();
    let delete_files = names.len();
    if groups.is_empty() && removed_deletes.is_empty() {
        let mut msg = format!(
            "nothing to compact ({} data files, {delete_files} delete files)",
            data.len()
        );
        if !skipped.is_empty() {
            msg.push_str(&format!("; skipped: {}", skipped.join("; ")));
        }
        return Ok(msg);
    }
    let input_files: usize = groups.iter().map(|g| g.inputs.len()).sum();
    let input_bytes: u64 = groups
        .iter()
        .flat_map(|g| &g.inputs)
        .map(|f| f.entry.file_size_in_bytes())
        .sum();
    if dry_run {
        return Ok(format!(
            "would rewrite {input_files} data files ({}) in {} partitions and remove {} of {delete_files} delete files",
            size(input_bytes),
            groups.len(),
            removed_deletes.len()
        ));
    }

    // Rewrite, partition by partition.
    let arrow = crate::batch::table_arrow_schema(&schema)
        .map_err(|e| MaintainError::Other(e.to_string()))?;
    let mut placements: HashMap<String, Placement> = HashMap::new();
    let mut outputs: Vec<Vec<DataFile>> = Vec::with_capacity(groups.len());
    let mut rows_read = 0u64;
    for (g, group) in groups.iter().enumerate() {
        let mut writer = PartitionWriter::open(
            &table,
            schema.clone(),
            group.spec.clone(),
            group.partition.clone(),
            &target.prefix,
            target_size,
        )
        .await?;
        let mut written = 0u64;
        for input in &group.inputs {
            let gone = deleted.get(input.path()).cloned().unwrap_or_default();
            placements.insert(
                input.path().to_string(),
                Placement {
                    group: g,
                    first: written,
                    deleted: gone.clone(),
                },
            );
            let kept = copy_live_rows(&table, &schema, &arrow, input, &gone, &mut writer).await?;
            let expected = input.entry.record_count()
                - gone
                    .iter()
                    .filter(|p| *p < input.entry.record_count())
                    .count() as u64;
            if kept != expected {
                return Err(MaintainError::Other(format!(
                    "{} has {expected} live rows but {kept} were read: nothing committed",
                    input.path()
                )));
            }
            written += kept;
        }
        let files = writer.close().await?;
        let out_rows: u64 = files.iter().map(|f| f.record_count()).sum();
        if out_rows != written {
            return Err(MaintainError::Other(format!(
                "wrote {out_rows} rows for {written} live rows: nothing committed"
            )));
        }
        rows_read += written;
        outputs.push(files);
    }

    let mut rewrite = Compaction {
        start: live.iter().map(LiveFile::key).collect(),
        removed_data: rewritten
            .iter()
            .map(|p| FileKey {
                path: p.clone(),
                offset: None,
            })
            .collect(),
        removed_deletes,
        groups: groups
            .iter()
            .map(|g| (g.spec.spec_id(), g.partition.clone()))
            .collect(),
        outputs: outputs.clone(),
        placements,
        prefix: target.prefix.clone(),
        carried: 0,
        seen: HashMap::new(),
        last_carried: None,
    };
    crate::failpoint::hit(crate::failpoint::COMPACT_BEFORE_COMMIT);
    let properties = HashMap::from([
        (MAINTENANCE_KEY.to_string(), "compaction".to_string()),
        (COMMIT_KEY.to_string(), uuid::Uuid::now_v7().to_string()),
    ]);
    let outcome = commit_rewrite(
        catalog.catalog.as_ref(),
        catalog.committer.as_ref(),
        table,
        &mut rewrite,
        &properties,
    )
    .await
    .map_err(Box::new)?;
    let output_files: usize = outputs.iter().map(Vec::len).sum();
    match outcome {
        RewriteOutcome::Committed(t) => {
            let mut msg = format!(
                "rewrote {input_files} data files ({}) in {} partitions into {output_files}, {rows_read} rows; removed {} of {delete_files} delete files",
                size(input_bytes),
                groups.len(),
                rewrite.removed_deletes.len(),
            );
            if rewrite.carried > 0 {
                msg.push_str(&format!(
                    "; carried {} concurrent deletes over",
                    rewrite.carried
                ));
            }
            msg.push_str(&format!(
                "; snapshot {}",
                t.metadata().current_snapshot_id().unwrap_or_default()
            ));
            Ok(msg)
        }
        RewriteOutcome::GaveUp(reason) => Ok(format!(
            "gave up, nothing committed (the next run starts again): {reason}"
        )),
    }
}

/// Streams the live rows of `input` (positions in `gone` skipped) into `writer`, in
/// the current schema; returns how many rows it wrote.
async fn copy_live_rows(
    table: &Table,
    schema: &Arc<Schema>,
    arrow: &arrow_schema::SchemaRef,
    input: &LiveFile,
    gone: &RoaringTreemap,
    writer: &mut PartitionWriter,
) -> Result<u64, MaintainError> {
    let file = input.entry.data_file();
    let size = file.file_size_in_bytes();
    let task = FileScanTask::builder()
        .with_file_size_in_bytes(size)
        .with_start(0)
        .with_length(size)
        .with_record_count(Some(file.record_count()))
        .with_data_file_path(file.file_path().to_string())
        .with_data_file_format(DataFileFormat::Parquet)
        .with_schema(schema.clone())
        .with_project_field_ids(schema.as_struct().fields().iter().map(|f| f.id).collect())
        .with_case_sensitive(true)
        .build();
    let reader = table
        .reader_builder()
        .with_data_file_concurrency_limit(1)
        .build();
    let mut stream = reader
        .read(Box::pin(futures::stream::iter([Ok(task)])))?
        .stream();
    let mut pos = 0u64;
    let mut kept = 0u64;
    while let Some(batch) = stream.try_next().await? {
        let n = batch.num_rows() as u64;
        let batch = if gone.range_cardinality(pos..pos + n) == 0 {
            batch
        } else {
            let mask: BooleanArray = (pos..pos + n).map(|p| Some(!gone.contains(p))).collect();
            arrow_select::filter::filter_record_batch(&batch, &mask)
                .map_err(|e| MaintainError::Other(e.to_string()))?
        };
        pos += n;
        let batch: RecordBatch = crate::batch::conform(&batch, arrow)
            .map_err(|e| MaintainError::Other(e.to_string()))?;
        kept += batch.num_rows() as u64;
        writer.write(batch).await?;
    }
    if pos != file.record_count() {
        return Err(MaintainError::Other(format!(
            "{} holds {} rows but {pos} were read: nothing committed",
            file.file_path(),
            file.record_count()
        )));
    }
    Ok(kept)
}

/// The (data file, positions) a delete file removes: a deletion vector or a
/// position-delete file.
async fn read_delete_file(
    table: &Table,
    file: &DataFile,
) -> Result<Vec<(String, RoaringTreemap)>, MaintainError> {
    if file.file_format() == DataFileFormat::Puffin {
        let target = file.referenced_data_file().ok_or_else(|| {
            MaintainError::Other(format!(
                "deletion vector in {} names no data file",
                file.file_path()
            ))
        })?;
        return Ok(vec![(target, dv::read(table, file).await?)]);
    }
    let mut rows = HashMap::default();
    floe_iceberg::read_position_deletes(table, file.file_path(), &mut rows).await?;
    Ok(rows
        .into_iter()
        .map(|(path, positions)| (path, positions.into_iter().collect()))
        .collect())
}

/// The compaction's plan, redone on every parent it commits on.
struct Compaction {
    /// Live files when the compaction started.
    start: HashSet<FileKey>,
    removed_data: HashSet<FileKey>,
    removed_deletes: HashSet<FileKey>,
    /// Per group: spec id and partition.
    groups: Vec<(i32, Struct)>,
    /// Per group: the files written, in row order.
    outputs: Vec<Vec<DataFile>>,
    placements: HashMap<String, Placement>,
    prefix: String,
    /// Concurrent deletes carried over by the last plan.
    carried: u64,
    /// Concurrent delete files already read.
    seen: HashMap<FileKey, Translated>,
    /// The carried rows of the last plan and the delete files written for them.
    last_carried: Option<(Carried, Vec<SpecFile>)>,
}

/// Carried-over rows per (group, output file).
type Carried = BTreeMap<(usize, usize), RoaringTreemap>;

/// A concurrent delete file's rows in the new files, and whether it names other files.
type Translated = (Vec<(usize, usize, u64)>, bool);

impl Compaction {
    /// The output file and position of row `pos` of input `path`, if it was live.
    fn new_position(&self, path: &str, pos: u64) -> Option<(usize, usize, u64)> {
        let p = self.placements.get(path)?;
        if p.deleted.contains(pos) {
            return None;
        }
        let mut index = p.first + pos - p.deleted.rank(pos);
        for (i, f) in self.outputs[p.group].iter().enumerate() {
            if index < f.record_count() {
                return Some((p.group, i, index));
            }
            index -= f.record_count();
        }
        None
    }
}

#[async_trait]
impl Rewrite for Compaction {
    async fn plan(&mut self, table: &Table, live: &[LiveFile]) -> Result<RewritePlan, GiveUp> {
        let keys: HashSet<FileKey> = live.iter().map(LiveFile::key).collect();
        if let Some(gone) = self.removed_data.iter().find(|k| !keys.contains(*k)) {
            return Err(GiveUp::Changed(format!(
                "data file {} was removed by another writer meanwhile",
                gone.path
            )));
        }
        let mut removed: HashSet<FileKey> = self.removed_data.clone();
        removed.extend(self.removed_deletes.intersection(&keys).cloned());
        // Deletes committed since the start that name rewritten rows: carried over. A
        // delete file is read once, however many attempts it takes to commit.
        let mut carried = Carried::new();
        for f in live.iter().filter(|f| !self.start.contains(&f.key())) {
            match f.content() {
                DataContentType::Data => {}
                DataContentType::EqualityDeletes => {
                    return Err(GiveUp::Changed(
                        "another writer added equality deletes meanwhile".into(),
                    ));
                }
                DataContentType::PositionDeletes => {
                    let key = f.key();
                    if !self.seen.contains_key(&key) {
                        let translated =
                            self.translate(table, f.entry.data_file())
                                .await
                                .map_err(|e| GiveUp::Failed {
                                    what: "reading a concurrent delete file",
                                    source: Box::new(e),
                                })?;
                        self.seen.insert(key.clone(), translated);
                    }
                    let (rows, names_other) = &self.seen[&key];
                    for (g, i, new) in rows {
                        carried.entry((*g, *i)).or_default().insert(*new);
                    }
                    if !names_other {
                        removed.insert(key);
                    }
                }
            }
        }
        let mut added: Vec<SpecFile> = Vec::new();
        for (g, files) in self.outputs.iter().enumerate() {
            let spec_id = self.groups[g].0;
            added.extend(files.iter().map(|f| (spec_id, f.clone())));
        }
        self.carried = carried.values().map(|p| p.len()).sum();
        if !carried.is_empty() {
            let files = match &self.last_carried {
                Some((same, files)) if *same == carried => files.clone(),
                _ => {
                    let files = self
                        .write_carried(table, carried.clone())
                        .await
                        .map_err(|e| GiveUp::Failed {
                            what: "writing carried-over deletes",
                            source: Box::new(e),
                        })?;
                    self.last_carried = Some((carried, files.clone()));
                    files
                }
            };
            added.extend(files);
        }
        Ok(RewritePlan { removed, added })
    }
}

impl Compaction {
    /// The rows of the new files a concurrent delete file deletes: (group, output file,
    /// position) each, and whether it also names files this compaction does not rewrite.
    async fn translate(&self, table: &Table, file: &DataFile) -> Result<Translated, MaintainError> {
        let mut out = Vec::new();
        let mut names_other = false;
        for (path, positions) in read_delete_file(table, file).await? {
            if !self.placements.contains_key(&path) {
                names_other = true;
                continue;
            }
            out.extend(positions.iter().filter_map(|p| self.new_position(&path, p)));
        }
        Ok((out, names_other))
    }

    /// Delete files for the carried-over rows of the new files: deletion vectors on a v3
    /// table, else one position-delete file per partition.
    async fn write_carried(
        &self,
        table: &Table,
        carried: Carried,
    ) -> Result<Vec<SpecFile>, MaintainError> {
        if table.metadata().format_version() >= FormatVersion::V3 {
            let targets = carried
                .into_iter()
                .map(|((g, i), positions)| dv::Target {
                    data_file: self.outputs[g][i].file_path().to_string(),
                    spec_id: self.groups[g].0,
                    partition: self.groups[g].1.clone(),
                    positions,
                })
                .collect();
            return Ok(dv::write(table, &self.prefix, targets).await?);
        }
        let mut by_group: BTreeMap<usize, Vec<(String, u64)>> = BTreeMap::new();
        for ((g, i), positions) in carried {
            let path = self.outputs[g][i].file_path().to_string();
            by_group
                .entry(g)
                .or_default()
                .extend(positions.iter().map(|p| (path.clone(), p)));
        }
        let mut out = Vec::new();
        for (g, rows) in by_group {
            let (spec_id, partition) = self.groups[g].clone();
            let file =
                floe_iceberg::write_position_deletes(table, &self.prefix, spec_id, partition, rows)
                    .await?;
            out.push((spec_id, file));
        }
        Ok(out)
    }
}
