//! Newest version per key, over a stream sorted by [`Layout::dedup_sort`].
//!
//! The sort (DataFusion, spilling when a memory limit is set) puts each key's versions together,
//! newest first; this pass keeps the first row of each key and counts what it drops. It holds one
//! key's state at a time, so a full reload of any size streams through it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;

use super::layout::Layout;
use crate::config::pipeline::DELETED_COLUMN;

/// What deduplication did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupCounts {
    /// Rows that went in.
    pub rows_in: u64,
    /// One row per key came out.
    pub winners: u64,
    /// Rows dropped because a newer (or identical) version of the same key won.
    pub collapsed: u64,
    /// Keys whose newest tuple appeared with different contents; resolved by content order.
    pub conflicts: u64,
    /// Winners that are deletes.
    pub deleted_winners: u64,
    /// Largest sequence among all winners (µs since the epoch).
    pub max_sequence_all: Option<i64>,
    /// Largest sequence among winners that are not deletes (µs since the epoch).
    pub max_sequence_live: Option<i64>,
}

impl DedupCounts {
    /// The watermark the target will have once these winners are its rows.
    pub fn watermark(&self, hard_deletes: bool) -> Option<i64> {
        if hard_deletes {
            self.max_sequence_live
        } else {
            self.max_sequence_all
        }
    }
}

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
    /// Encoders for batches in the canonical schema of `layout`.
    pub fn new(layout: &Layout) -> Result<Self, ArrowError> {
        let schema = &layout.canonical;
        let conv = |idx: &[usize]| {
            RowConverter::new(
                idx.iter()
                    .map(|i| SortField::new(schema.field(*i).data_type().clone()))
                    .collect(),
            )
        };
        let key_idx = layout.indices(&layout.keys);
        let tuple_idx = layout.indices(&layout.order);
        let content_idx = layout.indices(&layout.comparable_content());
        Ok(RowEncoders {
            key: conv(&key_idx)?,
            tuple: conv(&tuple_idx)?,
            content: conv(&content_idx)?,
            deleted_idx: schema.index_of(DELETED_COLUMN).ok(),
            seq_idx: schema.index_of(layout.sequence())?,
            key_idx,
            tuple_idx,
            content_idx,
        })
    }

    /// Encodes one canonical batch. Rows compare like the values: ascending, nulls lowest.
    pub fn encode(&self, batch: &RecordBatch) -> Result<EncodedBatch, ArrowError> {
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
            contents: self.content.convert_columns(&cols(&self.content_idx))?,
            deleted,
        })
    }
}

struct Current {
    key: OwnedRow,
    tuple: OwnedRow,
    content: OwnedRow,
    conflict_counted: bool,
}

/// The streaming "first row per key" pass.
pub struct Deduper {
    enc: RowEncoders,
    current: Option<Current>,
    counts: DedupCounts,
    conflict_keys: HashSet<Box<[u8]>>,
}

impl Deduper {
    /// A deduper for canonical batches of `layout`.
    pub fn new(layout: &Layout) -> Result<Self, ArrowError> {
        Ok(Deduper {
            enc: RowEncoders::new(layout)?,
            current: None,
            counts: DedupCounts::default(),
            conflict_keys: HashSet::new(),
        })
    }

    /// Takes the next sorted batch; returns its winners (possibly empty).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        let e = self.enc.encode(batch)?;
        let mut keep: Vec<u32> = Vec::new();
        for i in 0..batch.num_rows() {
            self.counts.rows_in += 1;
            let key = e.keys.row(i);
            let same_key = self.current.as_ref().is_some_and(|c| c.key.row() == key);
            if !same_key {
                self.current = Some(Current {
                    key: key.owned(),
                    tuple: e.tuples.row(i).owned(),
                    content: e.contents.row(i).owned(),
                    conflict_counted: false,
                });
                keep.push(i as u32);
                self.counts.winners += 1;
                let seq = e.sequence_micros(i);
                self.counts.max_sequence_all = self.counts.max_sequence_all.max(seq);
                if e.is_deleted(i) {
                    self.counts.deleted_winners += 1;
                } else {
                    self.counts.max_sequence_live = self.counts.max_sequence_live.max(seq);
                }
                continue;
            }
            self.counts.collapsed += 1;
            if let Some(c) = self.current.as_mut() {
                if !c.conflict_counted
                    && c.tuple.row() == e.tuples.row(i)
                    && c.content.row() != e.contents.row(i)
                {
                    c.conflict_counted = true;
                    self.counts.conflicts += 1;
                    self.conflict_keys.insert(c.key.row().as_ref().into());
                }
            }
        }
        let idx = UInt32Array::from(keep);
        arrow::compute::take_record_batch(batch, &idx)
    }

    /// The counts so far.
    pub fn counts(&self) -> DedupCounts {
        self.counts
    }

    /// Encoded keys that had a conflict (conflicts are rare, so this stays small); the
    /// comparison with the target uses it not to count the same conflict twice.
    pub fn conflict_keys(&self) -> &HashSet<Box<[u8]>> {
        &self.conflict_keys
    }
}

/// Runs a sorted stream through a [`Deduper`] as a one-shot DataFusion partition, so the
/// winners can feed a Delta write as a streaming plan. Counts are readable after the stream ends.
pub struct DedupPartition {
    schema: SchemaRef,
    input: Mutex<Option<SendableRecordBatchStream>>,
    deduper: Arc<Mutex<Option<Deduper>>>,
    counts: Arc<Mutex<DedupCounts>>,
    input_error: InputError,
}

/// The first error of the sorted input, kept with its type: a consumer such as the Delta writer
/// reports stream errors as text, which would lose what kind of failure it was.
pub type InputError = Arc<Mutex<Option<DataFusionError>>>;

/// Takes the recorded input error, if any.
pub fn take_error(slot: &InputError) -> Option<DataFusionError> {
    slot.lock().ok().and_then(|mut g| g.take())
}

impl std::fmt::Debug for DedupPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupPartition").finish_non_exhaustive()
    }
}

impl DedupPartition {
    /// Wraps `input` (sorted canonical rows).
    pub fn new(layout: &Layout, input: SendableRecordBatchStream) -> Result<Self, ArrowError> {
        Ok(DedupPartition {
            schema: input.schema(),
            input: Mutex::new(Some(input)),
            deduper: Arc::new(Mutex::new(Some(Deduper::new(layout)?))),
            counts: Arc::new(Mutex::new(DedupCounts::default())),
            input_error: Arc::new(Mutex::new(None)),
        })
    }

    /// A handle to the first error the input stream returned (see [`take_error`]).
    pub fn input_error(&self) -> InputError {
        self.input_error.clone()
    }

    /// A handle to the counts, filled in as the stream is consumed.
    pub fn counts(&self) -> Arc<Mutex<DedupCounts>> {
        self.counts.clone()
    }
}

impl PartitionStream for DedupPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let input = self.input.lock().ok().and_then(|mut g| g.take());
        let deduper = self.deduper.lock().ok().and_then(|mut g| g.take());
        let schema = self.schema.clone();
        let (Some(input), Some(mut deduper)) = (input, deduper) else {
            let err = DataFusionError::Internal("the dedup stream can only be read once".into());
            return Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::once(async move { Err(err) }),
            ));
        };
        let counts = self.counts.clone();
        let input_error = self.input_error.clone();
        let stream = input.map(move |batch| {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    let text = e.to_string();
                    if let Ok(mut slot) = input_error.lock() {
                        slot.get_or_insert(e);
                    }
                    return Err(DataFusionError::Execution(text));
                }
            };
            let out = deduper
                .push(&batch)
                .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))?;
            if let Ok(mut c) = counts.lock() {
                *c = deduper.counts();
            }
            Ok(out)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

impl DedupPartition {
    /// The output schema (same as the input).
    pub fn schema_ref(&self) -> SchemaRef {
        self.schema.clone()
    }
}
