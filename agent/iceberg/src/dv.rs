//! Deletion vectors (format v3): one Puffin file per data file with deleted rows, each
//! holding its `deletion-vector-v1` blob.
//!
//! Blob layout (Iceberg Puffin spec): the length of magic + vector as 4 bytes big-endian,
//! the magic `D1 D3 39 64`, the vector as a portable 64-bit roaring bitmap (8-byte
//! little-endian count of 32-bit bitmaps, then per bitmap its 4-byte little-endian key and
//! the standard roaring serialization; the `roaring` crate's `RoaringTreemap` format), then
//! the CRC-32 of magic + vector as 4 bytes big-endian. Blobs are not compressed. The
//! manifest entry of a vector names its data file (`referenced_data_file`) and the blob's
//! offset and length in the Puffin file.
//!
//! A data file has at most one live deletion vector: a new one for the same file carries
//! the old one's positions too, and the commit removes the old entry.

use std::collections::HashMap;

use iceberg::io::FileRead;
use iceberg::puffin::{Blob, CompressionCodec, DELETION_VECTOR_V1, PuffinWriter};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::Error;

/// The magic bytes that start a deletion vector.
const MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
/// Field id of the row position metadata column, which the blobs are computed for.
const ROW_POSITION_ID: i32 = 2_147_483_645;
/// Length of the Puffin file's leading magic: the first blob starts there.
const PUFFIN_HEADER: u64 = 4;

// upstream: deletion-vector writer and reader (iceberg-rust 0.10 has the Puffin writer but
// no deletion-vector blob codec or DV file writer; delete when it has them)
/// Serializes `positions` as a `deletion-vector-v1` blob.
pub fn serialize(positions: &RoaringTreemap) -> Vec<u8> {
    let mut body = Vec::with_capacity(MAGIC.len() + positions.serialized_size());
    body.extend_from_slice(&MAGIC);
    positions
        .serialize_into(&mut body)
        .expect("writing into a Vec cannot fail");
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    let crc = crc32fast::hash(&body);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Why a `deletion-vector-v1` blob cannot be read: the Puffin file is damaged or was not
/// written by a conforming writer.
#[derive(Debug, thiserror::Error)]
pub enum DvError {
    /// The blob is shorter than its length, magic and checksum.
    #[error("deletion vector of {0} bytes is too short")]
    TooShort(usize),
    /// The blob's length field disagrees with its size.
    #[error("deletion vector length {len} does not match its blob of {blob} bytes")]
    Length {
        /// The length the blob states.
        len: usize,
        /// The blob's size in bytes.
        blob: usize,
    },
    /// The blob does not start with the deletion vector magic.
    #[error("deletion vector has the wrong magic bytes")]
    Magic,
    /// The blob's CRC-32 does not match its contents.
    #[error("deletion vector checksum mismatch")]
    Checksum,
    /// The roaring bitmap inside the blob cannot be read.
    #[error("deletion vector: {0}")]
    Bitmap(#[source] std::io::Error),
}

/// Reads a `deletion-vector-v1` blob, checking its length, magic and checksum.
pub fn deserialize(blob: &[u8]) -> Result<RoaringTreemap, DvError> {
    if blob.len() < 12 {
        return Err(DvError::TooShort(blob.len()));
    }
    let len = u32::from_be_bytes(blob[0..4].try_into().expect("4 bytes")) as usize;
    if len + 8 != blob.len() {
        return Err(DvError::Length {
            len,
            blob: blob.len(),
        });
    }
    let body = &blob[4..4 + len];
    if body[..4] != MAGIC {
        return Err(DvError::Magic);
    }
    let crc = u32::from_be_bytes(blob[4 + len..].try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err(DvError::Checksum);
    }
    RoaringTreemap::deserialize_from(&body[4..]).map_err(DvError::Bitmap)
}

/// The row positions deletion vector `dv` (a manifest entry) deletes.
pub async fn read(table: &Table, dv: &DataFile) -> Result<RoaringTreemap, Error> {
    let (Some(offset), Some(size)) = (dv.content_offset(), dv.content_size_in_bytes()) else {
        return Err(Error::Unsupported(format!(
            "deletion vector in {} lacks its blob offset or length",
            dv.file_path()
        )));
    };
    let reader = table.file_io().new_input(dv.file_path())?.reader().await?;
    let start = offset as u64;
    let bytes = reader.read(start..start + size as u64).await?;
    let positions =
        deserialize(&bytes).map_err(|e| Error::Unsupported(format!("{}: {e}", dv.file_path())))?;
    if positions.len() != dv.record_count() {
        return Err(Error::Unsupported(format!(
            "deletion vector in {} holds {} positions, its entry says {}",
            dv.file_path(),
            positions.len(),
            dv.record_count()
        )));
    }
    Ok(positions)
}

/// The deleted rows of one data file.
#[derive(Debug, Clone)]
pub struct Target {
    /// The data file's path.
    pub data_file: String,
    /// Its partition spec id.
    pub spec_id: i32,
    /// Its partition tuple.
    pub partition: Struct,
    /// Every deleted row position (old vector's included).
    pub positions: RoaringTreemap,
}

/// Writes one Puffin file per target, holding its deletion vector; returns their entries
/// with the partition spec ids, in the targets' order.
///
/// One vector per file, although Puffin allows many: some readers (DuckDB's iceberg
/// extension 1.5.5) apply the first vector of a file to every data file that names it.
pub async fn write(
    table: &Table,
    name_prefix: &str,
    mut targets: Vec<Target>,
) -> Result<Vec<(i32, DataFile)>, Error> {
    targets.retain(|t| !t.positions.is_empty());
    let mut out = Vec::with_capacity(targets.len());
    for t in targets {
        out.push(write_one(table, name_prefix, t).await?);
    }
    Ok(out)
}

async fn write_one(table: &Table, name_prefix: &str, t: Target) -> Result<(i32, DataFile), Error> {
    let path = format!(
        "{}/data/{name_prefix}-{}-dv.puffin",
        table.metadata().location(),
        uuid::Uuid::now_v7()
    );
    let output = table.file_io().new_output(&path)?;
    let mut writer = PuffinWriter::new(
        &output,
        HashMap::from([(
            iceberg::puffin::CREATED_BY_PROPERTY.to_string(),
            format!("Floe {}", env!("CARGO_PKG_VERSION")),
        )]),
        false,
    )
    .await?;
    let data = serialize(&t.positions);
    let length = data.len() as u64;
    let blob = Blob::builder()
        .r#type(DELETION_VECTOR_V1.to_string())
        .fields(vec![ROW_POSITION_ID])
        // -1: inherited from the snapshot that commits it.
        .snapshot_id(-1)
        .sequence_number(-1)
        .data(data)
        .properties(HashMap::from([
            ("referenced-data-file".to_string(), t.data_file.clone()),
            ("cardinality".to_string(), t.positions.len().to_string()),
        ]))
        .build();
    writer.add(blob, CompressionCodec::None).await?;
    writer.close().await?;
    let size = table.file_io().new_input(&path)?.metadata().await?.size;
    let file = DataFileBuilder::default()
        .content(DataContentType::PositionDeletes)
        .file_path(path)
        .file_format(DataFileFormat::Puffin)
        .partition(t.partition)
        .partition_spec_id(t.spec_id)
        .record_count(t.positions.len())
        .file_size_in_bytes(size)
        .referenced_data_file(Some(t.data_file))
        .content_offset(Some(PUFFIN_HEADER as i64))
        .content_size_in_bytes(Some(length as i64))
        .build()
        .map_err(|e| Error::Unsupported(format!("deletion vector metadata: {e}")))?;
    Ok((t.spec_id, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_are_checked() {
        let positions: RoaringTreemap = [0u64, 5, 6, 70_000, 5_000_000_000].into_iter().collect();
        let blob = serialize(&positions);
        assert_eq!(&blob[4..8], &MAGIC);
        assert_eq!(
            u32::from_be_bytes(blob[0..4].try_into().unwrap()) as usize,
            blob.len() - 8
        );
        assert_eq!(deserialize(&blob).unwrap(), positions);
        let mut bad = blob.clone();
        let n = bad.len();
        bad[n - 6] ^= 1;
        assert!(
            deserialize(&bad)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        assert!(deserialize(&blob[..blob.len() - 1]).is_err());
    }

    #[test]
    fn the_portable_format_starts_with_the_bitmap_count() {
        // 64-bit portable format: u64 LE count of 32-bit bitmaps, then key u32 LE.
        let positions: RoaringTreemap = [1u64, (7u64 << 32) | 3].into_iter().collect();
        let blob = serialize(&positions);
        let vector = &blob[8..blob.len() - 4];
        assert_eq!(u64::from_le_bytes(vector[0..8].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(vector[8..12].try_into().unwrap()), 0);
    }
}
