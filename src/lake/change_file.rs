//! Change data files: the `_change_data` Parquet files a commit's `cdc` actions point at. The
//! merge writes them for its runs (`crate::merge::feed`), and `restore` for its commit.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use deltalake::ObjectStore;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::ArrowWriter;

use super::datafile::writer_properties;

/// Why a change data file could not be written.
#[derive(Debug)]
pub enum ChangeFileError {
    Parquet(parquet::errors::ParquetError),
    Store(object_store::Error),
}

/// Writes `batches` (in `schema`: the table's columns and `_change_type`) as one change data
/// file under `dir` (`_change_data`, or a partition's folder in it); returns its path and size.
/// The copy-on-write rewrite and the rewrite of delta-rs' feed both write their files here.
pub async fn write_change_file(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<(String, usize), ChangeFileError> {
    let path = format!(
        "{dir}/cdc-00000-{}.c000.snappy.parquet",
        uuid::Uuid::new_v4()
    );
    let p = ChangeFileError::Parquet;
    let mut writer =
        ArrowWriter::try_new(Vec::new(), schema, Some(writer_properties(1 << 16))).map_err(p)?;
    for b in batches {
        writer.write(b).map_err(p)?;
    }
    let bytes = writer.into_inner().map_err(p)?;
    let size = bytes.len();
    store
        .put(&store_path(&path), Bytes::from(bytes).into())
        .await
        .map_err(ChangeFileError::Store)?;
    Ok((path, size))
}

fn store_path(path: &str) -> Path {
    Path::from_url_path(path).unwrap_or_else(|_| Path::from(path))
}
