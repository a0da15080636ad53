//! Newest version per key, over a stream sorted by [`ColumnRoles::dedup_sort`].
//!
//! The sort (DataFusion, spilling when a memory limit is set) puts each key's versions together,
//! newest first; this pass keeps the first row of each key and counts what it drops. It holds one
//! key's state at a time, so a full reload of any size streams through it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::row::OwnedRow;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;

pub use super::encode::{EncodedBatch, RowEncoders};
use super::partial::{Carrier, Filler};

mod fill;
use super::roles::ColumnRoles;

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

/// The winner of the key being read: a row of the batch at hand, or one carried over from an
/// earlier batch (the key's versions can span batches).
enum Winner {
    Here(usize),
    Carried(RecordBatch),
}

/// An older row of the current key: row `.1` of batch `.0` (shared, not copied: only the cells
/// that fill the winner are), and whether it is a delete.
type Older = (RecordBatch, usize, bool);

/// Partial updates: where filling the key's winner from its older rows stands.
enum Fill {
    /// Rows so far share the winner's tuple; the losers (lesser content: older) wait here, to
    /// be applied once the ties end.
    Ties(Vec<Older>),
    /// Older rows are streaming past. Rows of one tuple come in any order: they are gathered
    /// (`group`, of tuple `tuple`) and applied newest content first when the tuple changes.
    Filling {
        filler: Filler,
        group: Vec<Older>,
        tuple: Option<OwnedRow>,
    },
    /// Nothing older can change the winner (it carries every column, or it is a delete).
    Done,
}

struct Current {
    key: OwnedRow,
    tuple: OwnedRow,
    winner: Winner,
    conflict_counted: bool,
    /// `None` without partial updates.
    fill: Option<Fill>,
}

/// The streaming "newest row per key" pass.
///
/// The sort in front orders by key and newest tuple first only; rows with equal tuples come in
/// any order, and the pass keeps the one with the greatest content itself (encoding content
/// only for such ties, which are rare). A key's winner is therefore known only when the next
/// key starts: [`Deduper::push`] returns the winners of the keys it finished and
/// [`Deduper::finish`] the last one. With partial updates ([`super::partial`]) the winner's
/// columns it does not carry are filled from the key's older rows as they pass.
pub struct Deduper {
    enc: RowEncoders,
    current: Option<Current>,
    counts: DedupCounts,
    conflict_keys: HashSet<Box<[u8]>>,
    partial: Option<Carrier>,
    /// Encoded keys whose winner still has partial columns no row of the input carried (and no
    /// delete stopped): the target's row, when the input was not the key's whole history, fills
    /// them.
    open: HashMap<Box<[u8]>, Vec<usize>>,
}

/// Winners gathered from one pushed batch: rows of it, and rows made or carried elsewhere.
struct Picks<'b> {
    pieces: Vec<RecordBatch>,
    picks: Vec<(usize, usize)>,
    batch: &'b RecordBatch,
}

impl Picks<'_> {
    fn here(&mut self, i: usize) {
        self.picks.push((0, i));
    }

    fn owned(&mut self, row: RecordBatch) {
        self.pieces.push(row);
        self.picks.push((self.pieces.len() - 1, 0));
    }

    fn into_batch(self) -> Result<RecordBatch, ArrowError> {
        if self.pieces.len() == 1 {
            let rows = UInt32Array::from_iter_values(self.picks.iter().map(|(_, i)| *i as u32));
            return arrow::compute::take_record_batch(self.batch, &rows);
        }
        let pieces: Vec<&RecordBatch> = self.pieces.iter().collect();
        arrow::compute::interleave_record_batch(&pieces, &self.picks)
    }
}

impl Deduper {
    /// A deduper for canonical batches of `roles` (partial updates as `roles` says).
    pub fn new(roles: &ColumnRoles) -> Result<Self, ArrowError> {
        Ok(Deduper {
            enc: RowEncoders::new(roles)?,
            current: None,
            counts: DedupCounts::default(),
            conflict_keys: HashSet::new(),
            partial: roles.partial.clone(),
            open: HashMap::new(),
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

    /// Counts a winner held as its own row as final.
    fn count_row(&mut self, row: &RecordBatch) -> Result<(), ArrowError> {
        let e = self.enc.encode_order(row)?;
        self.count_winner(e.sequence_micros(0), e.is_deleted(0));
        Ok(())
    }

    /// Takes the next sorted batch; returns the winners of the keys it completed.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        let e = self.enc.encode_order(batch)?;
        let mut out = Picks {
            pieces: vec![batch.clone()],
            picks: Vec::new(),
            batch,
        };
        for i in 0..batch.num_rows() {
            self.counts.rows_in += 1;
            let key = e.keys.row(i);
            let same_key = self.current.as_ref().is_some_and(|c| c.key.row() == key);
            if !same_key {
                if let Some(c) = self.current.take() {
                    self.settle(c, batch, &e, &mut out)?;
                }
                self.current = Some(Current {
                    key: key.owned(),
                    tuple: e.tuples.row(i).owned(),
                    winner: Winner::Here(i),
                    conflict_counted: false,
                    fill: self.partial.as_ref().map(|_| Fill::Ties(Vec::new())),
                });
                continue;
            }
            let tie = self
                .current
                .as_ref()
                .is_some_and(|c| c.tuple.row() == e.tuples.row(i));
            if !tie {
                self.counts.superseded += 1;
                self.fill_older(batch, &e, i)?;
                continue;
            }
            let (identical, loser) = self.resolve_tie(batch, i)?;
            if identical {
                self.counts.duplicates += 1;
                continue;
            }
            self.counts.superseded += 1;
            if let Some(Fill::Ties(losers)) = self.current.as_mut().and_then(|c| c.fill.as_mut()) {
                let deleted = self.enc.encode_order(&loser)?.is_deleted(0);
                losers.push((loser, 0, deleted));
            }
        }
        if let Some(c) = self.current.as_mut() {
            if let Winner::Here(w) = c.winner {
                c.winner = Winner::Carried(match self.partial {
                    Some(_) => super::partial::own_row(batch, w),
                    None => batch.slice(w, 1),
                });
            }
        }
        out.into_batch()
    }

    /// A finished key's winner into `out`, filled from what its older rows carried.
    fn settle(
        &mut self,
        mut c: Current,
        batch: &RecordBatch,
        e: &EncodedBatch,
        out: &mut Picks<'_>,
    ) -> Result<(), ArrowError> {
        let filled = match c.fill.take() {
            Some(fill) => self.close_fill(&c, fill, batch, e)?,
            None => None,
        };
        match (filled, c.winner) {
            (None, Winner::Here(w)) => {
                out.here(w);
                self.count_winner(e.sequence_micros(w), e.is_deleted(w));
            }
            (Some(row), _) | (None, Winner::Carried(row)) => {
                self.count_row(&row)?;
                out.owned(row);
            }
        }
        Ok(())
    }

    /// Row `i` of `batch` has the current key and the same tuple as its winner: the greater
    /// content wins; different contents are a conflict, counted once per key. Returns whether
    /// the row is identical to the winner (a re-delivery), and the loser's row.
    fn resolve_tie(
        &mut self,
        batch: &RecordBatch,
        i: usize,
    ) -> Result<(bool, RecordBatch), ArrowError> {
        let challenger_row = batch.slice(i, 1);
        let Some(c) = self.current.as_mut() else {
            return Ok((false, challenger_row));
        };
        let challenger = self.enc.encode_content(&challenger_row)?;
        let holder_row = match &c.winner {
            Winner::Here(w) => batch.slice(*w, 1),
            Winner::Carried(row) => row.clone(),
        };
        let holder = self.enc.encode_content(&holder_row)?;
        let (challenger, holder) = (challenger.row(0), holder.row(0));
        if challenger != holder && !c.conflict_counted {
            c.conflict_counted = true;
            self.counts.conflicts += 1;
            self.conflict_keys.insert(c.key.row().as_ref().into());
        }
        if challenger > holder {
            c.winner = Winner::Here(i);
            return Ok((false, holder_row));
        }
        Ok((challenger == holder, challenger_row))
    }

    /// The last key's winner, once the input has ended.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        let Some(c) = self.current.take() else {
            return Ok(None);
        };
        // (`push` always carries the open key's winner over)
        let Winner::Carried(row) = &c.winner else {
            return Ok(None);
        };
        let row = row.clone();
        let mut out = Picks {
            pieces: vec![row.clone()],
            picks: Vec::new(),
            batch: &row,
        };
        let e = self.enc.encode_order(&row)?;
        self.settle(c, &row, &e, &mut out)?;
        out.into_batch().map(Some)
    }

    /// Encoded keys whose winner has partial columns the input never carried, with those
    /// columns (indices in the canonical schema).
    pub fn open_keys(&self) -> &HashMap<Box<[u8]>, Vec<usize>> {
        &self.open
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
    use arrow::array::{Array, AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
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
