//! Uuid columns: read as text by the JSON reader, then turned into Iceberg's 16 bytes.

use std::sync::Arc;

use arrow_array::builder::FixedSizeBinaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, MapArray, RecordBatch, StructArray};
use arrow_schema::{
    ArrowError, DataType, Field, FieldRef, Fields, Schema as ArrowSchema, SchemaRef,
};
use iceberg::spec::{PrimitiveType, Schema, Type};

/// The payload schema with every uuid column (also nested) as a string; `None` without uuids.
pub(super) fn read_schema(table: &Schema, payload: &SchemaRef) -> Option<SchemaRef> {
    let mut any = false;
    let fields: Vec<FieldRef> = payload
        .fields()
        .iter()
        .map(|f| match table.field_by_name(f.name()) {
            Some(tf) => Arc::new(replace(f, &tf.field_type, &mut any)),
            None => f.clone(),
        })
        .collect();
    any.then(|| {
        Arc::new(ArrowSchema::new_with_metadata(
            fields,
            payload.metadata().clone(),
        ))
    })
}

fn replace(f: &Field, t: &Type, any: &mut bool) -> Field {
    let data_type = match (t, f.data_type()) {
        (Type::Primitive(PrimitiveType::Uuid), _) => {
            *any = true;
            DataType::Utf8
        }
        (Type::Struct(st), DataType::Struct(children)) => DataType::Struct(Fields::from(
            children
                .iter()
                .zip(st.fields())
                .map(|(c, tf)| Arc::new(replace(c, &tf.field_type, any)))
                .collect::<Vec<_>>(),
        )),
        (Type::List(l), DataType::List(element)) => {
            DataType::List(Arc::new(replace(element, &l.element_field.field_type, any)))
        }
        (Type::Map(m), DataType::Map(entries, sorted)) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                let k = replace(&kv[0], &m.key_field.field_type, any);
                let v = replace(&kv[1], &m.value_field.field_type, any);
                DataType::Map(
                    Arc::new(
                        entries
                            .as_ref()
                            .clone()
                            .with_data_type(DataType::Struct(Fields::from(vec![k, v]))),
                    ),
                    *sorted,
                )
            }
            other => other.clone(),
        },
        (_, other) => other.clone(),
    };
    f.clone().with_data_type(data_type)
}

/// Converts a batch read with [`read_schema`] into the payload schema.
pub(super) fn convert(batch: RecordBatch, target: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .zip(target.fields())
        .map(|(c, f)| convert_array(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(target.clone(), columns)
}

fn convert_array(a: &ArrayRef, target: &DataType) -> Result<ArrayRef, ArrowError> {
    if a.data_type() == target {
        return Ok(a.clone());
    }
    match (a.data_type(), target) {
        (DataType::Utf8, DataType::FixedSizeBinary(16)) => {
            let strings = a.as_string::<i32>();
            let mut b = FixedSizeBinaryBuilder::with_capacity(strings.len(), 16);
            for s in strings.iter() {
                match s {
                    Some(s) => {
                        let u = uuid::Uuid::try_parse(s).map_err(|e| {
                            ArrowError::JsonError(format!("not a uuid: {s:?}: {e}"))
                        })?;
                        b.append_value(u.as_bytes())?;
                    }
                    None => b.append_null(),
                }
            }
            Ok(Arc::new(b.finish()))
        }
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let s = a.as_struct();
            let children = s
                .columns()
                .iter()
                .zip(fields)
                .map(|(c, f)| convert_array(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                children,
                s.nulls().cloned(),
            )?))
        }
        (DataType::List(_), DataType::List(_)) | (DataType::Map(_, _), DataType::Map(_, _)) => {
            super::conform::rebuild_list_or_map(a, target, convert_array)
        }
        (from, to) => Err(ArrowError::CastError(format!(
            "cannot convert {from} to {to}"
        ))),
    }
}
