//! Buffered batches -> the exact Arrow schema of the table version a commit writes.
//!
//! Rows are buffered in the columns known when they arrived. A commit writes them with
//! the table's schema as it will be after the commit: Iceberg field ids in the field
//! metadata, columns added later (null in earlier rows), types widened later
//! (long -> double, int -> long...), and timestamp columns buffered as text converted
//! with the same parser that admitted them. Columns are matched by name.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, MapArray, RecordBatch, StructArray, new_null_array};
use arrow_schema::{ArrowError, DataType, SchemaRef, TimeUnit};

use crate::record::values::{parse_timestamp, parse_timestamp_nanos};

/// `batch` with exactly the columns and types of `target`.
pub fn conform(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let rows = batch.num_rows();
    let columns = target
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(array) => conform_array(array, f.data_type()),
            None => Ok(new_null_array(f.data_type(), rows)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new_with_options(
        target.clone(),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}

/// A list or map `array` rebuilt as the list or map type `target`: the same offsets and
/// nulls, each child (a list's values; a map's keys and values) made its type in `target`
/// by `child`.
pub(super) fn rebuild_list_or_map(
    array: &ArrayRef,
    target: &DataType,
    child: fn(&ArrayRef, &DataType) -> Result<ArrayRef, ArrowError>,
) -> Result<ArrayRef, ArrowError> {
    match target {
        DataType::List(field) => {
            let l = array.as_list::<i32>();
            let values = child(l.values(), field.data_type())?;
            Ok(Arc::new(ListArray::try_new(
                field.clone(),
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?))
        }
        DataType::Map(entries, sorted) => {
            let m = array.as_map();
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(ArrowError::SchemaError(
                    "map entries are not a struct".into(),
                ));
            };
            let e = m.entries();
            let children = e
                .columns()
                .iter()
                .zip(kv)
                .map(|(c, f)| child(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            let entries_array = StructArray::try_new(kv.clone(), children, e.nulls().cloned())?;
            Ok(Arc::new(MapArray::try_new(
                entries.clone(),
                m.offsets().clone(),
                entries_array,
                m.nulls().cloned(),
                *sorted,
            )?))
        }
        other => Err(ArrowError::CastError(format!(
            "{other} is not a list or map type"
        ))),
    }
}

fn conform_array(array: &ArrayRef, target: &DataType) -> Result<ArrayRef, ArrowError> {
    if array.data_type() == target {
        return Ok(array.clone());
    }
    match (array.data_type(), target) {
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let s = array.as_struct();
            let columns = fields
                .iter()
                .map(|f| match s.column_by_name(f.name()) {
                    Some(child) => conform_array(child, f.data_type()),
                    None => Ok(new_null_array(f.data_type(), s.len())),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if fields.is_empty() {
                return Ok(Arc::new(StructArray::new_empty_fields(
                    s.len(),
                    s.nulls().cloned(),
                )));
            }
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                columns,
                s.nulls().cloned(),
            )?))
        }
        (DataType::List(_), DataType::List(_)) | (DataType::Map(_, _), DataType::Map(_, _)) => {
            rebuild_list_or_map(array, target, conform_array)
        }
        // Timestamp columns whose type was not settled were buffered as their text.
        (DataType::Utf8, DataType::Timestamp(unit, tz)) => {
            let text = array.as_string::<i32>();
            let with_offset = tz.is_some();
            let mut out = Vec::with_capacity(text.len());
            for v in text.iter() {
                out.push(match v {
                    None => None,
                    Some(s) => Some(
                        match unit {
                            TimeUnit::Nanosecond => parse_timestamp_nanos(s, with_offset),
                            _ => parse_timestamp(s, with_offset),
                        }
                        .ok_or_else(|| {
                            ArrowError::CastError(format!("{s:?} is not a {target} value"))
                        })?,
                    ),
                });
            }
            Ok(match unit {
                TimeUnit::Nanosecond => Arc::new(
                    arrow_array::TimestampNanosecondArray::from(out).with_timezone_opt(tz.clone()),
                ),
                _ => Arc::new(
                    arrow_array::TimestampMicrosecondArray::from(out).with_timezone_opt(tz.clone()),
                ),
            })
        }
        // Widenings: long -> double, int -> long, float -> double, decimal precision.
        _ => arrow_cast::cast(array, target),
    }
}
