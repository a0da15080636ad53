//! A full reload's input thinned before its sort: within each chunk of rows as the scan reads
//! them, a key's versions older than the chunk's newest for that key are dropped. Most of a
//! payment's versions arrive together (created, authorised and captured within the hour: 15.7M
//! of the 17.5M superseded rows of the 10M-payment benchmark share a bronze file with a newer
//! version of their key), so the sort — and what it spills — shrinks to little more than the
//! winners.
//!
//! Exactly what the dedup after the sort would do with those rows: a row whose tuple is below
//! another of its key's is superseded, whoever wins; rows with the chunk's newest tuple (ties
//! included) are all kept, so the dedup still sees every tie, re-delivery and conflict. The
//! dropped rows are added to the shared counts as superseded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::keyed::dedup::RowEncoders;
use crate::keyed::roles::ColumnRoles;
use crate::keyed::DedupCounts;
use crate::run::once::Once;

/// Rows gathered before thinning (a day's bronze file is ~75k rows at 10M payments a year).
pub const CHUNK_ROWS: usize = 65_536;

/// Rows per chunk for a partition's share of a memory limit: the chunk is held outside the
/// pool, so under a small limit it stays a small part of the share (~1 KiB of limit per row;
/// 16 MiB on one partition: 16k rows), never fewer than a batch's 8,192 rows.
pub fn chunk_rows(limit: Option<usize>, partitions: usize) -> usize {
    match limit {
        Some(bytes) => (bytes / 1024 / partitions.max(1)).clamp(8_192, CHUNK_ROWS),
        None => CHUNK_ROWS,
    }
}

/// The rows `batches` keep, batch by batch (each no larger than it was, so the sort's merge
/// of spilled runs reads small batches): those with their key's newest tuple among all of
/// `batches`; and how many they drop.
pub fn thin(
    enc: &RowEncoders,
    batches: &[RecordBatch],
) -> Result<(Vec<RecordBatch>, u64), ArrowError> {
    let encoded = batches
        .iter()
        .map(|b| enc.encode_order(b))
        .collect::<Result<Vec<_>, _>>()?;
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    // One hash lookup per row: each key gets a slot holding its newest tuple, and each row
    // remembers its key's slot for the second pass.
    let mut slot_of: HashMap<&[u8], u32, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(rows, Default::default());
    let mut newest: Vec<&[u8]> = Vec::with_capacity(rows);
    let mut slots: Vec<u32> = Vec::with_capacity(rows);
    for e in &encoded {
        for i in 0..e.keys.num_rows() {
            let t = e.tuples.row(i).data();
            let next = newest.len() as u32;
            let slot = *slot_of.entry(e.keys.row(i).data()).or_insert(next);
            if slot == next {
                newest.push(t);
            } else if t > newest[slot as usize] {
                newest[slot as usize] = t;
            }
            slots.push(slot);
        }
    }
    if newest.len() == rows {
        return Ok((batches.to_vec(), 0));
    }
    let mut out = Vec::with_capacity(batches.len());
    let mut kept = 0usize;
    let mut at = 0usize;
    for (b, e) in batches.iter().zip(&encoded) {
        let keep: BooleanArray = (0..b.num_rows())
            .map(|i| Some(e.tuples.row(i).data() == newest[slots[at + i] as usize]))
            .collect();
        at += b.num_rows();
        let thinned = arrow::compute::filter_record_batch(b, &keep)?;
        kept += thinned.num_rows();
        if thinned.num_rows() > 0 {
            out.push(thinned);
        }
    }
    Ok((out, (rows - kept) as u64))
}

/// One partition of the reload's canonical rows, thinned chunk by chunk (a one-shot stream).
pub struct Thinned {
    schema: SchemaRef,
    input: Once<(SendableRecordBatchStream, RowEncoders)>,
    counts: Arc<Mutex<DedupCounts>>,
    chunk_rows: usize,
}

impl std::fmt::Debug for Thinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Thinned").finish_non_exhaustive()
    }
}

impl Thinned {
    pub fn new(
        roles: &ColumnRoles,
        input: SendableRecordBatchStream,
        counts: Arc<Mutex<DedupCounts>>,
        chunk_rows: usize,
    ) -> Result<Self, ArrowError> {
        Ok(Thinned {
            schema: input.schema(),
            input: Once::new((input, RowEncoders::new(roles)?)),
            counts,
            chunk_rows,
        })
    }
}

impl PartitionStream for Thinned {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let (input, enc) = match self.input.take(&schema, "thinned") {
            Ok(v) => v,
            Err(failed) => return failed,
        };
        let counts = self.counts.clone();
        let chunk_rows = self.chunk_rows;
        let stream = futures::stream::unfold(Some((input, enc)), move |state| {
            let counts = counts.clone();
            async move {
                let (mut input, enc) = state?;
                let mut pending: Vec<RecordBatch> = Vec::new();
                let mut rows = 0usize;
                let mut ended = false;
                while rows < chunk_rows {
                    match input.next().await {
                        Some(Ok(b)) => {
                            rows += b.num_rows();
                            pending.push(b);
                        }
                        Some(Err(e)) => {
                            let failed: BoxStream<'static, Result<RecordBatch, DataFusionError>> =
                                futures::stream::once(async move { Err(e) }).boxed();
                            return Some((failed, Some((input, enc))));
                        }
                        None => {
                            ended = true;
                            break;
                        }
                    }
                }
                if pending.is_empty() {
                    return None;
                }
                let thinned = thin(&enc, &pending)
                    .map(|(out, dropped)| {
                        if let Ok(mut c) = counts.lock() {
                            c.rows_in += dropped;
                            c.superseded += dropped;
                        }
                        futures::stream::iter(out.into_iter().map(Ok))
                    })
                    .map_err(|e| DataFusionError::ArrowError(Box::new(e), None));
                let items: BoxStream<'static, Result<RecordBatch, DataFusionError>> = match thinned
                {
                    Ok(s) => s.boxed(),
                    Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
                };
                Some((items, (!ended).then_some((input, enc))))
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream.flatten()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Pipeline, Vars};
    use arrow::array::{AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    fn roles() -> ColumnRoles {
        let p = Pipeline::parse(
            std::path::Path::new("p.yml"),
            "name: t\nkind: cdc_merge\nsource: { uri: /tmp/l/b }\ntarget: { uri: /tmp/l/s }\nkeys: [id]\nsequence_by: ts\ntie_breakers: [n]\noverlap: 1h\nquarantine: { uri: /tmp/l/q }\n",
            &Vars::new(),
        )
        .expect("pipeline");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("n", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]);
        ColumnRoles::new(&p, p.cdc_merge("test").expect("merge"), &schema).expect("roles")
    }

    /// Older versions go, every row with its key's newest tuple stays (ties and re-deliveries
    /// included: the dedup decides those), null tie-breakers are the lowest.
    #[test]
    fn keeps_each_keys_newest_tuple_and_its_ties() {
        let roles = roles();
        let enc = RowEncoders::new(&roles).expect("enc");
        let rows: Vec<(&str, i64, Option<i64>, &str)> = vec![
            ("a", 1, Some(1), "old"),
            ("a", 3, Some(1), "new"),
            ("a", 3, Some(1), "tie"),
            ("a", 2, Some(9), "older"),
            ("b", 5, None, "null tie-breaker"),
            ("b", 5, Some(0), "newest"),
            ("c", 7, Some(1), "only"),
        ];
        let batch = RecordBatch::try_new(
            roles.canonical.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter().map(|r| r.1),
                )),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )
        .expect("batch");
        // (in two batches: a key's versions are compared across the chunk's batches)
        let parts = [batch.slice(0, 3), batch.slice(3, 4)];
        let (out, dropped) = thin(&enc, &parts).expect("thin");
        let kept: Vec<String> = out
            .iter()
            .flat_map(|b| {
                b.column(3)
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(kept, vec!["new", "tie", "newest", "only"]);
        assert_eq!(dropped, 3);
        assert!(out.iter().all(|b| b.num_rows() <= 4));
    }
}
