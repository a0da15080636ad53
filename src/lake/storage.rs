//! Arrow types as Delta stores them.
//!
//! DataFusion reads strings as `Utf8View`; Delta's `string` is written from plain `Utf8`. Casting
//! before a write keeps the table schema exactly what readers (Spark, DuckDB, Python) expect.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::error::ArrowError;

/// The storage type for an in-memory type.
pub fn storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        other => other.clone(),
    }
}

/// `schema` with every field in its storage type.
pub fn storage_schema(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| {
                f.as_ref()
                    .clone()
                    .with_data_type(storage_type(f.data_type()))
            })
            .collect::<Vec<Field>>(),
    )
}

/// `schema` without field metadata. Reading a column-mapped table annotates each field with its
/// `delta.columnMapping.*` id and physical name; those describe the table read, not the data,
/// and delta-rs refuses to create a table from a schema that carries them. Rows tidemark writes
/// elsewhere (target, quarantine) go through this, so a new table gets plain logical names.
pub fn plain_schema(schema: &Schema) -> Schema {
    Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(Default::default()))
            .collect::<Vec<Field>>(),
        schema.metadata().clone(),
    )
}

/// `batch` with every column cast to its storage type, without field metadata.
pub fn storage_batch(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    if schema
        .fields()
        .iter()
        .all(|f| storage_type(f.data_type()) == *f.data_type() && f.metadata().is_empty())
    {
        return Ok(batch.clone());
    }
    let storage = Arc::new(plain_schema(&storage_schema(&schema)));
    let columns = batch
        .columns()
        .iter()
        .zip(storage.fields())
        .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(storage, columns)
}

/// `batch` with its columns cast to `schema` (matched by name), for comparing rows read from
/// two tables whose readers chose different in-memory types.
pub fn cast_to(batch: &RecordBatch, schema: &Arc<Schema>) -> Result<RecordBatch, ArrowError> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = batch.column_by_name(f.name()).ok_or_else(|| {
                ArrowError::SchemaError(format!("column `{}` is missing", f.name()))
            })?;
            arrow::compute::cast(c, f.data_type())
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}
