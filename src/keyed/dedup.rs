//! Newest version per key, over a stream sorted by [`ColumnRoles::dedup_sort`].
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

use super::roles::ColumnRoles;
use crate::config::pipeline::DELETED_COLUMN;

/// What deduplication did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupCounts {
    /// Rows that went in.
    pub rows_in: u64,
    /// One row per key came out.
    pub winners: u64,
    /// Rows dropped because a newer version of the same key won (a different row, or the
    /// loser of an equal-tuple conflict).
    pub superseded: u64,
    /// Rows dropped because they are identical, in every column, to the key's winner: the same
    /// change delivered again.
    pub duplicates: u64,
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
    /// Adds what `now` counted beyond `before` (two readings of one deduper's counts), so that
    /// others may add into the same total (a full reload's thinning, before the sort).
    fn add_progress(&mut self, before: &DedupCounts, now: &DedupCounts) {
        self.rows_in += now.rows_in - before.rows_in;
        self.winners += now.winners - before.winners;
        self.superseded += now.superseded - before.superseded;
        self.duplicates += now.duplicates - before.duplicates;
        self.conflicts += now.conflicts - before.conflicts;
        self.deleted_winners += now.deleted_winners - before.deleted_winners;
        self.max_sequence_all = self.max_sequence_all.max(now.max_sequence_all);
        self.max_sequence_live = self.max_sequence_live.max(now.max_sequence_live);
    }

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

/// The winner of the key being read: a row of the batch at hand, or one carried over from an
/// earlier batch (the key's versions can span batches).
enum Winner {
    Here(usize),
    Carried(RecordBatch),
}

struct Current {
    key: OwnedRow,
    tuple: OwnedRow,
    winner: Winner,
    conflict_counted: bool,
}

/// The streaming "newest row per key" pass.
///
/// The sort in front orders by key and newest tuple first only; rows with equal tuples come in
/// any order, and the pass keeps the one with the greatest content itself (encoding content
/// only for such ties, which are rare). A key's winner is therefore known only when the next
/// key starts: [`Deduper::push`] returns the winners of the keys it finished and
/// [`Deduper::finish`] the last one.
pub struct Deduper {
    enc: RowEncoders,
    current: Option<Current>,
    counts: DedupCounts,
    conflict_keys: HashSet<Box<[u8]>>,
}

impl Deduper {
    /// A deduper for canonical batches of `roles`.
    pub fn new(roles: &ColumnRoles) -> Result<Self, ArrowError> {
        Ok(Deduper {
            enc: RowEncoders::new(roles)?,
            current: None,
            counts: DedupCounts::default(),
            conflict_keys: HashSet::new(),
        })
    }

    fn count_winner(&mut self, seq: Option<i64>, deleted: bool) {
        self.counts.winners += 1;
        self.counts.max_sequence_all = self.counts.max_sequence_all.max(seq);
        if deleted {
            self.counts.deleted_winners += 1;
        } else {
            self.counts.max_sequence_live = self.counts.max_sequence_live.max(seq);
        }
    }

    /// Counts a carried-over winner as final and returns it.
    fn settle_carried(&mut self, row: RecordBatch) -> Result<RecordBatch, ArrowError> {
        let e = self.enc.encode_order(&row)?;
        self.count_winner(e.sequence_micros(0), e.is_deleted(0));
        Ok(row)
    }

    /// Takes the next sorted batch; returns the winners of the keys it completed.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        let e = self.enc.encode_order(batch)?;
        let mut keep: Vec<u32> = Vec::new();
        let mut carried_out: Option<RecordBatch> = None;
        for i in 0..batch.num_rows() {
            self.counts.rows_in += 1;
            let key = e.keys.row(i);
            let same_key = self.current.as_ref().is_some_and(|c| c.key.row() == key);
            if !same_key {
                match self.current.take().map(|c| c.winner) {
                    Some(Winner::Here(w)) => {
                        keep.push(w as u32);
                        self.count_winner(e.sequence_micros(w), e.is_deleted(w));
                    }
                    Some(Winner::Carried(row)) => carried_out = Some(self.settle_carried(row)?),
                    None => {}
                }
                self.current = Some(Current {
                    key: key.owned(),
                    tuple: e.tuples.row(i).owned(),
                    winner: Winner::Here(i),
                    conflict_counted: false,
                });
                continue;
            }
            let tie = self
                .current
                .as_ref()
                .is_some_and(|c| c.tuple.row() == e.tuples.row(i));
            if tie && self.resolve_tie(batch, i)? {
                self.counts.duplicates += 1;
            } else {
                self.counts.superseded += 1;
            }
        }
        if let Some(c) = self.current.as_mut() {
            if let Winner::Here(w) = c.winner {
                c.winner = Winner::Carried(batch.slice(w, 1));
            }
        }
        let here = arrow::compute::take_record_batch(batch, &UInt32Array::from(keep))?;
        match carried_out {
            Some(row) => arrow::compute::concat_batches(&batch.schema(), [&row, &here]),
            None => Ok(here),
        }
    }

    /// Row `i` of `batch` has the current key and the same tuple as its winner: the greater
    /// content wins; different contents are a conflict, counted once per key. Returns whether
    /// the row is identical to the winner (a re-delivery).
    fn resolve_tie(&mut self, batch: &RecordBatch, i: usize) -> Result<bool, ArrowError> {
        let Some(c) = self.current.as_mut() else {
            return Ok(false);
        };
        let challenger = self.enc.encode_content(&batch.slice(i, 1))?;
        let holder = match &c.winner {
            Winner::Here(w) => self.enc.encode_content(&batch.slice(*w, 1))?,
            Winner::Carried(row) => self.enc.encode_content(row)?,
        };
        let (challenger, holder) = (challenger.row(0), holder.row(0));
        if challenger != holder && !c.conflict_counted {
            c.conflict_counted = true;
            self.counts.conflicts += 1;
            self.conflict_keys.insert(c.key.row().as_ref().into());
        }
        if challenger > holder {
            c.winner = Winner::Here(i);
        }
        Ok(challenger == holder)
    }

    /// The last key's winner, once the input has ended.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        match self.current.take().map(|c| c.winner) {
            Some(Winner::Carried(row)) => Ok(Some(self.settle_carried(row)?)),
            // (`push` always carries the open key's winner over)
            Some(Winner::Here(_)) | None => Ok(None),
        }
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

/// Runs sorted canonical batches through `deduper`: the winners, ending with the last key's.
/// `counts`, when given, gets the deduper's counts added as the stream is consumed (several
/// streams may add into one).
pub fn winners<S, E>(
    input: S,
    deduper: Deduper,
    counts: Option<Arc<Mutex<DedupCounts>>>,
    arrow_err: fn(ArrowError) -> E,
) -> impl futures::Stream<Item = Result<RecordBatch, E>>
where
    S: futures::Stream<Item = Result<RecordBatch, E>> + Unpin,
{
    let start = (input, Some(deduper), DedupCounts::default());
    futures::stream::unfold(start, move |(mut input, deduper, mut published)| {
        let counts = counts.clone();
        async move {
            let mut deduper = deduper?;
            let mut publish = |d: &Deduper| {
                let now = d.counts();
                if let Some(slot) = &counts {
                    if let Ok(mut c) = slot.lock() {
                        c.add_progress(&published, &now);
                    }
                }
                published = now;
            };
            match input.next().await {
                Some(Ok(batch)) => {
                    let out = deduper.push(&batch).map_err(arrow_err);
                    publish(&deduper);
                    Some((out, (input, Some(deduper), published)))
                }
                Some(Err(e)) => Some((Err(e), (input, Some(deduper), published))),
                None => {
                    let last = deduper.finish().map_err(arrow_err);
                    publish(&deduper);
                    match last {
                        Ok(Some(b)) => Some((Ok(b), (input, None, published))),
                        Ok(None) => None,
                        Err(e) => Some((Err(e), (input, None, published))),
                    }
                }
            }
        }
    })
    // Consumers such as reconcile's merge-join may poll again after the end.
    .fuse()
}

/// Runs a sorted stream through a [`Deduper`] as a one-shot DataFusion partition, so the
/// winners can feed a Delta write as a streaming plan. Counts are readable after the stream ends.
pub struct DedupPartition {
    schema: SchemaRef,
    input: crate::run::once::Once<(SendableRecordBatchStream, Deduper)>,
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
    /// Wraps `input` (sorted canonical rows), adding its counts into `counts` (which the
    /// reload's thinning adds to as well) and recording its input's first error in
    /// `input_error`. Its schema loses the source's field metadata (column-mapping annotations),
    /// which must not reach a table the winners create.
    pub fn sharing(
        roles: &ColumnRoles,
        input: SendableRecordBatchStream,
        counts: Arc<Mutex<DedupCounts>>,
        input_error: InputError,
    ) -> Result<Self, ArrowError> {
        Ok(DedupPartition {
            schema: Arc::new(crate::lake::storage::plain_schema(&input.schema())),
            input: crate::run::once::Once::new((input, Deduper::new(roles)?)),
            counts,
            input_error,
        })
    }
}

impl PartitionStream for DedupPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let (input, deduper) = match self.input.take(&schema, "dedup") {
            Ok(v) => v,
            Err(failed) => return failed,
        };
        let counts = self.counts.clone();
        let input_error = self.input_error.clone();
        let input = input.map(move |batch| {
            batch.map_err(|e| {
                let text = e.to_string();
                if let Ok(mut slot) = input_error.lock() {
                    slot.get_or_insert(e);
                }
                DataFusionError::Execution(text)
            })
        });
        let stream = winners(input, deduper, Some(counts), |e| {
            DataFusionError::ArrowError(Box::new(e), None)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Pipeline, Vars};
    use arrow::array::{AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    /// (id, ts, v)
    type Row = (&'static str, i64, Option<i64>);

    fn roles() -> ColumnRoles {
        let p = Pipeline::parse(
            std::path::Path::new("p.yml"),
            "name: t\nkind: cdc_merge\nsource: { uri: /tmp/l/b }\ntarget: { uri: /tmp/l/s }\nkeys: [id]\nsequence_by: ts\noverlap: 1h\nquarantine: { uri: /tmp/l/q }\n",
            &Vars::new(),
        )
        .expect("pipeline");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("v", DataType::Int64, true),
        ]);
        ColumnRoles::new(&p, p.cdc_merge("test").expect("merge"), &schema).expect("roles")
    }

    fn batch(roles: &ColumnRoles, rows: &[Row]) -> RecordBatch {
        RecordBatch::try_new(
            roles.canonical.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter().map(|r| r.1),
                )),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
            ],
        )
        .expect("batch")
    }

    fn run(
        roles: &ColumnRoles,
        batches: &[Vec<Row>],
    ) -> (Vec<(String, i64, Option<i64>)>, DedupCounts) {
        let mut d = Deduper::new(roles).expect("deduper");
        let mut out = Vec::new();
        for b in batches {
            out.push(d.push(&batch(roles, b)).expect("push"));
        }
        out.extend(d.finish().expect("finish"));
        let rows = out
            .iter()
            .flat_map(|b| {
                let id = b.column(0).as_string::<i32>().clone();
                let ts = b
                    .column(1)
                    .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                    .clone();
                let v = b
                    .column(2)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .clone();
                (0..b.num_rows())
                    .map(|i| {
                        (
                            id.value(i).to_string(),
                            ts.value(i),
                            v.is_valid(i).then(|| v.value(i)),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        (rows, d.counts())
    }

    #[test]
    fn equal_tuples_keep_the_greatest_content_whatever_their_order_and_batching() {
        let l = roles();
        // key a: newest tuple 5 three times (contents 1, 7, null) across batches; key b: one row.
        let orders: [Vec<Vec<Row>>; 3] = [
            vec![
                vec![("a", 5, Some(1)), ("a", 5, Some(7))],
                vec![("a", 5, None), ("a", 2, Some(9)), ("b", 1, Some(3))],
            ],
            vec![
                vec![("a", 5, None)],
                vec![("a", 5, Some(7)), ("a", 5, Some(1))],
                vec![("a", 2, Some(9))],
                vec![("b", 1, Some(3))],
            ],
            vec![vec![
                ("a", 5, Some(7)),
                ("a", 5, None),
                ("a", 5, Some(1)),
                ("a", 2, Some(9)),
                ("b", 1, Some(3)),
            ]],
        ];
        for batches in orders {
            let (rows, counts) = run(&l, &batches);
            assert_eq!(
                rows,
                vec![("a".to_string(), 5, Some(7)), ("b".to_string(), 1, Some(3))],
                "{batches:?}"
            );
            assert_eq!(counts.winners, 2);
            // ("a",5,None) and ("a",5,Some(1)) lose the conflict, ("a",2,..) is older
            assert_eq!((counts.superseded, counts.duplicates), (3, 0));
            assert_eq!(counts.conflicts, 1, "one conflicting key, counted once");
            assert_eq!(counts.rows_in, 5);
            assert_eq!(counts.max_sequence_all, Some(5));
        }
    }

    #[test]
    fn identical_redeliveries_are_not_conflicts_and_a_key_may_span_batches() {
        let l = roles();
        let (rows, counts) = run(
            &l,
            &[
                vec![("a", 5, Some(1))],
                vec![("a", 5, Some(1))],
                vec![],
                vec![("a", 4, Some(2))],
            ],
        );
        assert_eq!(rows, vec![("a".to_string(), 5, Some(1))]);
        assert_eq!(
            (
                counts.winners,
                counts.superseded,
                counts.duplicates,
                counts.conflicts
            ),
            (1, 1, 1, 0)
        );
    }
}
