//! Target data files at row-group granularity.
//!
//! An hourly run changes a few rows in a handful of files. Copy-on-write must write those files
//! again, but not re-encode them: a row group without a changed row is copied byte for byte
//! (its pages, statistics and all), and only the row groups that hold a changed row are decoded,
//! patched and encoded. With small row groups (`target.row_group_rows`) the cost of a run then
//! follows the rows it changes, not the size of the files they sit in. Reads go the same way:
//! the probe fetches only the key and ordering columns of the row groups whose key statistics
//! can hold a changed key.
//!
//! Only plain tables take this path (no partitions, no column mapping, no deletion vectors);
//! [`FastPath::check`] says which do.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use deltalake::kernel::{Add, DeletionVectorDescriptor};
use deltalake::logstore::ObjectStoreRef;
use deltalake::{DeltaTable, DeltaTableError};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowRowGroupWriterFactory};
// `ParquetObjectReader` is deprecated in favour of hand-written readers; it still does exactly
// what is needed here (ranged gets on the table's own object store), so it stays until removed.
#[allow(deprecated)]
use parquet::arrow::async_reader::{ParquetObjectReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use super::ranges::Fetched;
use super::stats::{delta_stats, StatsColumns};

/// Bytes read from the end of a data file to find its footer: tidemark's 2 MiB files' footers
/// are ~10 KiB; a larger footer costs one more request.
const FOOTER_HINT: usize = 64 * 1024;

/// How tidemark writes target data files: snappy like delta-rs, row groups of `row_group_rows`,
/// statistics per column chunk (pruning and Delta stats need no more) and no page index, so a
/// file assembled from copied and re-encoded row groups is uniform.
pub fn writer_properties(row_group_rows: usize) -> WriterProperties {
    writer_builder(row_group_rows).build()
}

fn writer_builder(row_group_rows: usize) -> WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_offset_index_disabled(true)
}

/// [`writer_properties`] for a table whose rows are unique by `keys`: a single key column holds
/// a different value in every row, so a dictionary for it would only repeat the values (and
/// cost a hash per row to build); it is written plain. (Each column of a composite key may
/// repeat, so those keep their dictionaries.)
pub fn keyed_writer_properties(row_group_rows: usize, keys: &[String]) -> WriterProperties {
    let builder = writer_builder(row_group_rows);
    match keys {
        [key] => builder
            .set_column_dictionary_enabled(ColumnPath::from(key.as_str()), false)
            .build(),
        _ => builder.build(),
    }
}

/// Whether a table's files can be read and written directly, and the facts needed to do so.
#[derive(Clone)]
pub struct FastPath {
    pub store: ObjectStoreRef,
    /// The table's columns in the types its files store.
    pub schema: SchemaRef,
    pub stats: StatsColumns,
    /// The table keeps a change data feed: the rewrite writes its `_change_data` file.
    pub change_data_feed: bool,
    /// The deletion vectors of the live files that have one, by path: their rows are not
    /// part of the table.
    pub deletion_vectors: Arc<HashMap<String, DeletionVectorDescriptor>>,
    /// The table may take new deletion vectors (the `deletionVectors` writer feature).
    pub dv_enabled: bool,
}

impl FastPath {
    /// `None` when the table uses a feature the direct path does not handle (partitions,
    /// column mapping); the caller then goes through delta-rs' MERGE. A change data feed is
    /// written by the rewrite itself (`merge::cow::feed`); deletion vectors are honoured (their
    /// rows skipped) and, with `target.apply: deletion_vectors`, written.
    pub fn check(table: &DeltaTable) -> Result<Option<FastPath>, DeltaTableError> {
        let snapshot = table.snapshot()?;
        let metadata = snapshot.metadata();
        if !metadata.partition_columns().is_empty() {
            return Ok(None);
        }
        let config = metadata.configuration();
        if config
            .get("delta.columnMapping.mode")
            .is_some_and(|m| !m.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let deletion_vectors: HashMap<String, DeletionVectorDescriptor> = snapshot
            .log_data()
            .iter()
            .filter_map(|f| {
                f.deletion_vector_descriptor()
                    .map(|d| (f.path().to_string(), d))
            })
            .collect();
        let schema = Arc::new(super::storage::storage_schema(
            &snapshot.snapshot().arrow_schema(),
        ));
        let stats =
            StatsColumns::from_configuration(config.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Ok(Some(FastPath {
            store: table.log_store().object_store(None),
            schema,
            stats,
            change_data_feed: change_data_feed(table),
            deletion_vectors: Arc::new(deletion_vectors),
            dv_enabled: super::dv::enabled(table),
        }))
    }
}

/// The table property that turns a Delta change data feed on.
pub const CHANGE_DATA_FEED: &str = "delta.enableChangeDataFeed";

/// Whether `table` keeps a change data feed (`delta.enableChangeDataFeed = true`).
pub fn change_data_feed(table: &DeltaTable) -> bool {
    table.snapshot().is_ok_and(|s| {
        s.metadata()
            .configuration()
            .get(CHANGE_DATA_FEED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    })
}

/// A target data file's footer, read once and used for pruning, probing and rewriting.
pub struct DataFile {
    pub path: String,
    pub size: u64,
    pub meta: ArrowReaderMetadata,
    /// Byte ranges of the file read so far ([`DataFile::read`]).
    fetched: Arc<Fetched>,
}

fn object_path(path: &str) -> Result<Path, DeltaTableError> {
    Path::from_url_path(path)
        .map_err(|e| DeltaTableError::Generic(format!("data file {path}: {e}")))
}

impl DataFile {
    /// Reads the footer of `path` (relative to the table root; `size` from the log).
    #[allow(deprecated)]
    pub async fn open(
        store: &ObjectStoreRef,
        path: &str,
        size: u64,
    ) -> Result<Self, DeltaTableError> {
        // (the footer and its length in one request: two round trips on an object store)
        let mut reader = ParquetObjectReader::new(store.clone(), object_path(path)?)
            .with_file_size(size)
            .with_footer_size_hint(FOOTER_HINT);
        let meta = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new()).await?;
        Ok(DataFile {
            path: path.to_string(),
            size,
            meta,
            fetched: Arc::default(),
        })
    }

    pub fn row_groups(&self) -> &[RowGroupMetaData] {
        self.meta.metadata().row_groups()
    }

    /// Per row group, the least and greatest value of `column` (nulls where unknown).
    pub fn bounds(&self, column: &str) -> Result<(ArrayRef, ArrayRef), DeltaTableError> {
        let conv =
            StatisticsConverter::try_new(column, self.meta.schema(), self.meta.parquet_schema())?;
        Ok((
            conv.row_group_mins(self.row_groups())?,
            conv.row_group_maxes(self.row_groups())?,
        ))
    }

    /// Per row group, whether `column`'s statistics are its exact least and greatest values (a
    /// writer may shorten long strings: such bounds only enclose the values).
    pub fn exact_bounds(&self, column: &str) -> Vec<bool> {
        let leaf =
            StatisticsConverter::try_new(column, self.meta.schema(), self.meta.parquet_schema())
                .ok()
                .and_then(|c| c.parquet_column_index());
        self.row_groups()
            .iter()
            .map(|g| {
                leaf.and_then(|l| g.column(l).statistics())
                    .is_some_and(|s| s.min_is_exact() && s.max_is_exact())
            })
            .collect()
    }

    /// The named columns of the given row groups, in the order given. Their column chunks are
    /// fetched in few concurrent requests and kept (`lake/ranges.rs`): on an object store
    /// each request mostly waits, and a later read of the same row groups finds them here.
    pub async fn read(
        &self,
        store: &ObjectStoreRef,
        row_groups: Vec<usize>,
        columns: &[String],
    ) -> Result<Vec<RecordBatch>, DeltaTableError> {
        if row_groups.is_empty() {
            return Ok(Vec::new());
        }
        let roots = self.roots(columns)?;
        let path = object_path(&self.path)?;
        let descr = self.meta.parquet_schema();
        let leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&l| roots.contains(&descr.get_column_root_idx(l)))
            .collect();
        let wanted: Vec<Vec<std::ops::Range<u64>>> = row_groups
            .iter()
            .map(|&g| {
                let group = &self.row_groups()[g];
                leaves
                    .iter()
                    .map(|&l| {
                        let (start, len) = group.column(l).byte_range();
                        start..start + len
                    })
                    .collect()
            })
            .collect();
        self.fetched.fetch(store, &path, &wanted).await?;
        let reader = self
            .fetched
            .reader(store.clone(), path, self.meta.metadata().clone());
        let mask = ProjectionMask::roots(descr, roots);
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, self.meta.clone())
            .with_projection(mask)
            .with_row_groups(row_groups)
            .with_batch_size(64 * 1024)
            .build()?;
        Ok(stream.try_collect().await?)
    }

    /// Every column of one row group, decoded from the whole file's bytes.
    pub fn decode(&self, bytes: &Bytes, row_group: usize) -> Result<RecordBatch, DeltaTableError> {
        let rows = self.row_groups()[row_group].num_rows().max(1) as usize;
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(bytes.clone(), self.meta.clone())
                .with_row_groups(vec![row_group])
                .with_batch_size(rows)
                .build()?;
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        Ok(arrow::compute::concat_batches(
            self.meta.schema(),
            &batches,
        )?)
    }

    fn roots(&self, columns: &[String]) -> Result<Vec<usize>, DeltaTableError> {
        columns
            .iter()
            .map(|c| {
                self.meta.schema().index_of(c).map_err(|_| {
                    DeltaTableError::Generic(format!("data file {} has no column `{c}`", self.path))
                })
            })
            .collect()
    }

    /// The whole file, for a rewrite.
    pub async fn fetch(&self, store: &ObjectStoreRef) -> Result<Bytes, DeltaTableError> {
        Ok(store.get(&object_path(&self.path)?).await?.bytes().await?)
    }
}

/// A new data file being assembled in memory from copied and encoded row groups.
pub struct NewFile {
    writer: SerializedFileWriter<Vec<u8>>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    row_group_rows: usize,
    row_groups: usize,
    pub rows: u64,
}

impl NewFile {
    /// An empty file with the table's `schema` (storage types).
    /// `capacity`: the expected size in bytes (the file it replaces), so the buffer is not
    /// grown and copied along the way.
    pub fn new(
        schema: SchemaRef,
        row_group_rows: usize,
        capacity: usize,
    ) -> Result<Self, DeltaTableError> {
        Self::keyed(schema, row_group_rows, capacity, &[])
    }

    /// [`NewFile::new`] for a table whose rows are unique by `keys`
    /// ([`keyed_writer_properties`]).
    pub fn keyed(
        schema: SchemaRef,
        row_group_rows: usize,
        capacity: usize,
        keys: &[String],
    ) -> Result<Self, DeltaTableError> {
        let props = keyed_writer_properties(row_group_rows, keys);
        let buffer = Vec::with_capacity(capacity);
        let (writer, factory) =
            ArrowWriter::try_new(buffer, schema.clone(), Some(props))?.into_serialized_writer()?;
        Ok(NewFile {
            writer,
            factory,
            schema,
            row_group_rows: row_group_rows.max(1),
            row_groups: 0,
            rows: 0,
        })
    }

    /// Whether `file`'s row groups can be copied into this one as they are: the same Parquet
    /// schema, column for column (files from before a schema change are re-encoded instead).
    pub fn can_copy_from(&self, file: &DataFile) -> bool {
        file.meta.parquet_schema().root_schema() == self.writer.schema_descr().root_schema()
            && file.meta.schema().fields().len() == self.schema.fields().len()
    }

    /// Appends row group `index` of `file` (whose bytes are `bytes`) without decoding it.
    pub fn copy_row_group(
        &mut self,
        file: &DataFile,
        bytes: &Bytes,
        index: usize,
    ) -> Result<(), DeltaTableError> {
        let group = &file.row_groups()[index];
        let mut rg = self.writer.next_row_group()?;
        for column in group.columns() {
            rg.append_column(
                bytes,
                ColumnCloseResult {
                    bytes_written: column.compressed_size() as u64,
                    rows_written: group.num_rows() as u64,
                    metadata: column.clone(),
                    bloom_filter: None,
                    column_index: None,
                    offset_index: None,
                },
            )?;
        }
        rg.close()?;
        self.row_groups += 1;
        self.rows += group.num_rows() as u64;
        Ok(())
    }

    /// Encodes `batch` (in this file's schema) as one or more row groups.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), DeltaTableError> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = self.row_group_rows.min(batch.num_rows() - offset);
            let part = batch.slice(offset, len);
            let mut writers = self.factory.create_column_writers(self.row_groups)?;
            let mut next = writers.iter_mut();
            for (field, column) in self.schema.fields().iter().zip(part.columns()) {
                for leaf in compute_leaves(field, column)? {
                    let w = next.next().ok_or_else(|| {
                        DeltaTableError::Generic("more leaf columns than writers".into())
                    })?;
                    w.write(&leaf)?;
                }
            }
            let mut rg = self.writer.next_row_group()?;
            for w in writers {
                w.close()?.append_to_row_group(&mut rg)?;
            }
            rg.close()?;
            self.row_groups += 1;
            self.rows += len as u64;
            offset += len;
        }
        Ok(())
    }

    /// The bytes encoded so far (the row groups closed), for rolling to a new file.
    pub fn encoded_bytes(&self) -> usize {
        self.writer.inner().len()
    }

    /// Writes the file under the table root and returns its `add` action (data change, with
    /// Delta statistics); `None` when it holds no rows.
    pub async fn put(mut self, fast: &FastPath) -> Result<Option<Add>, DeltaTableError> {
        if self.rows == 0 {
            return Ok(None);
        }
        let meta = self.writer.finish()?;
        self.writer
            .flush()
            .map_err(parquet::errors::ParquetError::from)?;
        let bytes = std::mem::take(self.writer.inner_mut());
        let stats = delta_stats(&meta, &self.schema, &fast.stats)?;
        let name = format!("part-00000-{}-c000.snappy.parquet", uuid::Uuid::new_v4());
        let size = bytes.len() as i64;
        fast.store
            .put(&Path::from(name.as_str()), Bytes::from(bytes).into())
            .await?;
        let modification_time = chrono::Utc::now().timestamp_millis();
        Ok(Some(Add {
            path: name,
            size,
            partition_values: Default::default(),
            modification_time,
            data_change: true,
            stats: Some(stats),
            tags: None,
            deletion_vector: None,
            base_row_id: None,
            default_row_commit_version: None,
            clustering_provider: None,
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{
        BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array, StringArray,
        TimestampMicrosecondArray,
    };
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use parquet::file::metadata::ParquetMetaDataReader;
    use serde_json::Value;

    fn batch(rows: std::ops::Range<i64>, bump: Option<i64>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("n", DataType::Int64, true),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("day", DataType::Date32, true),
            Field::new("ok", DataType::Boolean, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let v = |i: i64| if Some(i) == bump { i + 1_000_000 } else { i };
        let ids: Vec<String> = rows.clone().map(|i| format!("p{i:08}")).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(Int64Array::from_iter(
                    rows.clone().map(|i| (i % 7 != 0).then(|| v(i) * 3)),
                )),
                Arc::new(
                    Decimal128Array::from_iter(
                        rows.clone().map(|i| Some(i128::from(v(i) * 101 - 5000))),
                    )
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
                ),
                Arc::new(
                    TimestampMicrosecondArray::from_iter(
                        rows.clone()
                            .map(|i| Some(1_700_000_000_000_000 + v(i) * 1_234_567)),
                    )
                    .with_timezone("UTC"),
                ),
                Arc::new(Date32Array::from_iter(
                    rows.clone().map(|i| Some(19_000 + (v(i) % 400) as i32)),
                )),
                Arc::new(BooleanArray::from_iter(
                    rows.clone().map(|i| Some(i % 3 == 0)),
                )),
                Arc::new(Float64Array::from_iter(
                    rows.map(|i| (i % 5 != 0).then(|| v(i) as f64 / 3.0)),
                )),
            ],
        )
        .unwrap()
    }

    /// Writes `b` through delta-rs, with tidemark's writer properties and row groups of
    /// `row_group_rows`, into a new one-file table.
    pub(crate) async fn one_file_table(
        dir: &std::path::Path,
        b: RecordBatch,
        row_group_rows: usize,
    ) -> DeltaTable {
        let url = url::Url::from_directory_path(dir).unwrap();
        deltalake::DeltaTableBuilder::from_url(url)
            .unwrap()
            .build()
            .unwrap()
            .write(vec![b])
            .with_writer_properties(writer_properties(row_group_rows))
            .await
            .unwrap()
    }

    /// Writes `b` through delta-rs into a new table; returns the table and its file's stats.
    async fn delta_rs_table(dir: &std::path::Path, b: RecordBatch) -> (DeltaTable, Value) {
        let table = one_file_table(dir, b, 1024).await;
        let stats = table
            .snapshot()
            .unwrap()
            .log_data()
            .iter()
            .next()
            .unwrap()
            .stats()
            .unwrap();
        (table, serde_json::from_str(&stats).unwrap())
    }

    fn normalized(mut v: Value) -> Value {
        // delta-rs writes `nullCount` for every indexed column; so do we: compare all of it.
        v.as_object_mut().unwrap().remove("tightBounds");
        v
    }

    #[tokio::test]
    async fn statistics_match_what_delta_rs_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (table, want) = delta_rs_table(dir.path(), batch(0..3000, None)).await;
        let fast = FastPath::check(&table).unwrap().unwrap();
        let view = table.snapshot().unwrap().log_data().iter().next().unwrap();
        let file = DataFile::open(&fast.store, &view.path(), view.size() as u64)
            .await
            .unwrap();
        assert_eq!(file.row_groups().len(), 3, "row groups of 1024 rows");
        let ours = delta_stats(file.meta.metadata(), file.meta.schema(), &fast.stats).unwrap();
        assert_eq!(
            normalized(serde_json::from_str(&ours).unwrap()),
            normalized(want)
        );
    }

    /// Whether column `name` of every row group of the Parquet file in `bytes` has a
    /// dictionary.
    fn dictionary_encoded(bytes: Vec<u8>, name: &str) -> bool {
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&Bytes::from(bytes))
            .unwrap();
        let col = meta
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.name() == name)
            .unwrap();
        meta.row_groups()
            .iter()
            .all(|g| g.column(col).dictionary_page_offset().is_some())
    }

    fn written(keys: &[&str]) -> Vec<u8> {
        let b = batch(0..3000, None);
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let props = keyed_writer_properties(1024, &keys);
        let mut w = ArrowWriter::try_new(Vec::new(), b.schema(), Some(props)).unwrap();
        w.write(&b).unwrap();
        w.into_inner().unwrap()
    }

    #[test]
    fn a_single_key_column_is_written_plain_and_the_others_keep_their_dictionaries() {
        let keyed = written(&["id"]);
        assert!(!dictionary_encoded(keyed.clone(), "id"));
        assert!(dictionary_encoded(keyed, "day"));
        // Without keys, or with a composite key (whose columns may repeat), every column
        // keeps its dictionary.
        assert!(dictionary_encoded(written(&[]), "id"));
        assert!(dictionary_encoded(written(&["id", "day"]), "id"));
    }

    #[tokio::test]
    async fn a_file_rewritten_by_row_group_reads_back_and_has_exact_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let (table, _) = delta_rs_table(&dir.path().join("t"), batch(0..3000, None)).await;
        let fast = FastPath::check(&table).unwrap().unwrap();
        let view = table.snapshot().unwrap().log_data().iter().next().unwrap();
        let file = DataFile::open(&fast.store, &view.path(), view.size() as u64)
            .await
            .unwrap();
        let bytes = file.fetch(&fast.store).await.unwrap();

        // Row 1500 (in row group 1) gets bigger values than any other row: the maxima move.
        let mut new = NewFile::new(fast.schema.clone(), 1024, 0).unwrap();
        assert!(new.can_copy_from(&file));
        new.copy_row_group(&file, &bytes, 0).unwrap();
        let decoded = file.decode(&bytes, 1).unwrap();
        assert_eq!(decoded, batch(1024..2048, None));
        new.write(&batch(1024..2048, Some(1500))).unwrap();
        new.copy_row_group(&file, &bytes, 2).unwrap();
        assert_eq!(new.rows, 3000);
        let add = new.put(&fast).await.unwrap().unwrap();

        let reread = DataFile::open(&fast.store, &add.path, add.size as u64)
            .await
            .unwrap();
        let all = reread
            .read(
                &fast.store,
                vec![0, 1, 2],
                &["id".to_string(), "n".to_string()],
            )
            .await
            .unwrap();
        let all = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
        let want = batch(0..3000, Some(1500));
        assert_eq!(all.column(0), want.column(0));
        assert_eq!(all.column(1), want.column(1));
        let whole = reread.fetch(&fast.store).await.unwrap();
        for g in 0..3 {
            let lo = g * 1024;
            let hi = (lo + 1024).min(3000);
            assert_eq!(
                reread.decode(&whole, g as usize).unwrap(),
                want.slice(lo as usize, (hi - lo) as usize)
            );
        }

        let (_, oracle) = delta_rs_table(&dir.path().join("oracle"), want).await;
        let ours: Value = serde_json::from_str(add.stats.as_deref().unwrap()).unwrap();
        assert_eq!(normalized(ours), normalized(oracle));
    }
}
