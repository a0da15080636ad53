//! Keys, version tuples and contents as comparable rows (Arrow's row format): what the dedup,
//! the thinning and the comparison with the target order and match by.

use arrow::array::{Array, RecordBatch};
use arrow::error::ArrowError;
use arrow::row::{RowConverter, SortField};

use super::roles::ColumnRoles;
use crate::config::pipeline::DELETED_COLUMN;

/// Row encoders for the three roles; shared with the change detection against the target.
pub struct RowEncoders {
    key: RowConverter,
    tuple: RowConverter,
    content: RowConverter,
    key_idx: Vec<usize>,
    tuple_idx: Vec<usize>,
    content_idx: Vec<usize>,
    deleted_idx: Option<usize>,
    seq_idx: usize,
}

/// Encoded roles of one batch.
pub struct EncodedBatch {
    pub keys: arrow::row::Rows,
    pub tuples: arrow::row::Rows,
    /// Empty when encoded by [`RowEncoders::encode_order`].
    pub contents: arrow::row::Rows,
    pub deleted: Option<arrow::array::BooleanArray>,
    /// The sequence column in microseconds.
    pub sequence: arrow::array::TimestampMicrosecondArray,
}

impl EncodedBatch {
    /// Whether row `i` is a delete.
    pub fn is_deleted(&self, i: usize) -> bool {
        self.deleted
            .as_ref()
            .is_some_and(|d| d.is_valid(i) && d.value(i))
    }

    /// Sequence of row `i` in microseconds (never null after validation).
    pub fn sequence_micros(&self, i: usize) -> Option<i64> {
        use arrow::array::Array;
        self.sequence.is_valid(i).then(|| self.sequence.value(i))
    }
}

impl RowEncoders {
    /// Encoders for batches in the canonical schema of `roles`.
    pub fn new(roles: &ColumnRoles) -> Result<Self, ArrowError> {
        let schema = &roles.canonical;
        let conv = |idx: &[usize]| {
            RowConverter::new(
                idx.iter()
                    .map(|i| SortField::new(schema.field(*i).data_type().clone()))
                    .collect(),
            )
        };
        let key_idx = roles.indices(&roles.keys);
        let tuple_idx = roles.indices(&roles.order);
        let content_idx = roles.indices(&roles.comparable_content());
        Ok(RowEncoders {
            key: conv(&key_idx)?,
            tuple: conv(&tuple_idx)?,
            content: conv(&content_idx)?,
            deleted_idx: schema.index_of(DELETED_COLUMN).ok(),
            seq_idx: schema.index_of(roles.sequence())?,
            key_idx,
            tuple_idx,
            content_idx,
        })
    }

    /// Encodes key columns (in the canonical key order and types) as the keys of
    /// [`Self::encode`].
    pub fn encode_keys(
        &self,
        columns: &[arrow::array::ArrayRef],
    ) -> Result<arrow::row::Rows, ArrowError> {
        self.key.convert_columns(columns)
    }

    /// Encodes the content columns only (the last tie-break), for the rare equal tuples.
    pub fn encode_content(&self, batch: &RecordBatch) -> Result<arrow::row::Rows, ArrowError> {
        let cols: Vec<_> = self
            .content_idx
            .iter()
            .map(|i| batch.column(*i).clone())
            .collect();
        self.content.convert_columns(&cols)
    }

    /// Encodes key, tuple, delete flag and sequence — what every row of a dedup needs — and
    /// leaves `contents` empty.
    pub fn encode_order(&self, batch: &RecordBatch) -> Result<EncodedBatch, ArrowError> {
        self.encode_parts(batch, false)
    }

    /// Encodes one canonical batch. Rows compare like the values: ascending, nulls lowest.
    pub fn encode(&self, batch: &RecordBatch) -> Result<EncodedBatch, ArrowError> {
        self.encode_parts(batch, true)
    }

    fn encode_parts(&self, batch: &RecordBatch, content: bool) -> Result<EncodedBatch, ArrowError> {
        let cols = |idx: &[usize]| {
            idx.iter()
                .map(|i| batch.column(*i).clone())
                .collect::<Vec<_>>()
        };
        let deleted = match self.deleted_idx {
            Some(i) => Some(
                arrow::array::AsArray::as_boolean_opt(batch.column(i).as_ref())
                    .ok_or_else(|| {
                        ArrowError::SchemaError(format!("{DELETED_COLUMN} is not boolean"))
                    })?
                    .clone(),
            ),
            None => None,
        };
        let sequence = arrow::compute::cast(
            batch.column(self.seq_idx),
            &arrow::datatypes::DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None),
        )?;
        let sequence = arrow::array::AsArray::as_primitive::<
            arrow::datatypes::TimestampMicrosecondType,
        >(sequence.as_ref())
        .clone();
        Ok(EncodedBatch {
            sequence,
            keys: self.key.convert_columns(&cols(&self.key_idx))?,
            tuples: self.tuple.convert_columns(&cols(&self.tuple_idx))?,
            contents: if content {
                self.encode_content(batch)?
            } else {
                self.content.empty_rows(0, 0)
            },
            deleted,
        })
    }
}
