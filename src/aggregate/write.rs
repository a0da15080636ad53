//! Gold's side: what it holds for a range of days, which days differ from a fresh aggregate, and
//! the one commit that replaces exactly those days (partitions by `event_date`, so a
//! replace-where rewrites the days' own files and nothing else).

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use chrono::NaiveDate;
use datafusion::prelude::{ident, SessionContext};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use super::days::Days;
use crate::config::pipeline::aggregate::EVENT_DATE;
use crate::lake;
use crate::lake::storage::cast_to;
use crate::run::{Phase, RunError};

/// Refuses to replace days of a gold table whose columns are not the pipeline's (measures or
/// groups changed since it was built): a day written one way beside days written another would
/// be a table no reader can trust.
pub fn check_schema(
    gold: &DeltaTable,
    schema: &SchemaRef,
    uri: &str,
    rerun: &str,
) -> Result<(), RunError> {
    let held = gold
        .snapshot()
        .map_err(RunError::delta(Phase::Compare, uri))?
        .snapshot()
        .arrow_schema();
    let names = |s: &arrow::datatypes::Schema| -> Vec<String> {
        s.fields().iter().map(|f| f.name().clone()).collect()
    };
    let (held, wanted) = (names(&held), names(schema));
    if held != wanted {
        return Err(RunError::SchemaDrift {
            uri: uri.to_string(),
            message: format!(
                "gold has the columns [{}] and the pipeline now makes [{}] (its groups or measures changed): rebuild it with `{rerun} --full-reload`",
                held.join(", "),
                wanted.join(", ")
            ),
        });
    }
    Ok(())
}

/// Gold's rows of `days`.
pub async fn read_days(
    ctx: &SessionContext,
    gold: &DeltaTable,
    uri: &str,
    days: &Days,
) -> Result<Vec<RecordBatch>, RunError> {
    crate::run::frame(ctx, gold, uri, Phase::Compare)
        .await?
        .filter(days.contains_expr(ident(EVENT_DATE)))
        .map_err(RunError::query(Phase::Compare))?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Compare, uri))
}

/// A day's rows as a multiset fingerprint: how many, and two order-free sums of each row's
/// hash (of its bytes in `schema`'s row format). Two days differ when their fingerprints do;
/// equal fingerprints of different rows need a 128-bit collision of hashes keyed by the run.
/// Fingerprints of parts of a day add up to the day's.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct DayPrint {
    rows: u64,
    sum: u64,
    mixed: u64,
}

impl DayPrint {
    fn add(&mut self, o: DayPrint) {
        self.rows += o.rows;
        self.sum = self.sum.wrapping_add(o.sum);
        self.mixed = self.mixed.wrapping_add(o.mixed);
    }
}

/// Each day's fingerprint of some rows.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Prints(BTreeMap<NaiveDate, DayPrint>);

impl Prints {
    /// The days whose rows differ between `self` (gold) and `fresh` (the aggregate), among
    /// `days`.
    pub fn changed(&self, fresh: &Prints, days: &BTreeSet<NaiveDate>) -> BTreeSet<NaiveDate> {
        days.iter()
            .filter(|d| self.0.get(d) != fresh.0.get(d))
            .copied()
            .collect()
    }
}

/// Fingerprints days of rows in one schema with one run's hash keys.
#[derive(Clone)]
pub struct Fingerprints {
    schema: SchemaRef,
    keys: std::collections::hash_map::RandomState,
}

impl Fingerprints {
    pub fn new(schema: SchemaRef) -> Self {
        Fingerprints {
            schema,
            keys: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Each day's fingerprint of `batches`, hashed on two threads (half the batches each).
    pub fn of(&self, batches: &[RecordBatch]) -> Result<Prints, RunError> {
        let (a, b) = batches.split_at(batches.len() / 2);
        let (a, b) = std::thread::scope(|s| {
            let other = s.spawn(|| self.by_day(b));
            (self.by_day(a), other.join())
        });
        let mut out = a?;
        let b = b.map_err(|_| RunError::Internal {
            phase: Phase::Compare,
            message: "fingerprinting gold's days panicked".into(),
        })??;
        for (d, p) in b.0 {
            out.0.entry(d).or_default().add(p);
        }
        Ok(out)
    }

    /// Each day's fingerprint of `batches`, one hash per row and no copy of it.
    fn by_day(&self, batches: &[RecordBatch]) -> Result<Prints, RunError> {
        use std::hash::BuildHasher;
        let a = |e| RunError::arrow(Phase::Compare)(e);
        let fields: Vec<SortField> = self
            .schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let conv = RowConverter::new(fields).map_err(a)?;
        let mut out: BTreeMap<NaiveDate, DayPrint> = BTreeMap::new();
        for b in batches {
            let b = cast_to(b, &self.schema).map_err(a)?;
            let day = arrow::compute::cast(
                b.column_by_name(EVENT_DATE)
                    .ok_or_else(|| RunError::Internal {
                        phase: Phase::Compare,
                        message: "gold rows without event_date".into(),
                    })?,
                &DataType::Date32,
            )
            .map_err(a)?;
            let day = day.as_primitive::<Date32Type>();
            let rows = conv.convert_columns(b.columns()).map_err(a)?;
            let mut current: Option<(NaiveDate, &mut DayPrint)> = None;
            for i in 0..b.num_rows() {
                let Some(d) = day.value_as_date(i) else {
                    continue;
                };
                let h = self.keys.hash_one(rows.row(i).as_ref());
                // (rows come grouped by day: look the day up only when it changes)
                let print = match current.take() {
                    Some((cd, p)) if cd == d => p,
                    _ => out.entry(d).or_default(),
                };
                print.add(DayPrint {
                    rows: 1,
                    sum: h,
                    mixed: h.rotate_left(29).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                });
                current = Some((d, print));
            }
        }
        Ok(Prints(out))
    }
}

/// The days whose rows in `held` (gold) and `fresh` (the aggregate) differ.
#[cfg(test)]
fn changed_days(
    held: &[RecordBatch],
    fresh: &[RecordBatch],
    schema: &SchemaRef,
) -> Result<BTreeSet<NaiveDate>, RunError> {
    let f = Fingerprints::new(schema.clone());
    let (held, fresh) = (f.of(held)?, f.of(fresh)?);
    let days = held.0.keys().chain(fresh.0.keys()).copied().collect();
    Ok(held.changed(&fresh, &days))
}

/// The rows of `batches` whose day is in `days`.
pub fn rows_of(
    batches: &[RecordBatch],
    days: &BTreeSet<NaiveDate>,
) -> Result<Vec<RecordBatch>, RunError> {
    let a = |e| RunError::arrow(Phase::Write)(e);
    batches
        .iter()
        .map(|b| {
            let day = b
                .column_by_name(EVENT_DATE)
                .map(|c| arrow::compute::cast(c, &DataType::Date32))
                .transpose()
                .map_err(a)?;
            let Some(day) = day else {
                return Ok(b.clone());
            };
            let day = day.as_primitive::<Date32Type>();
            let keep: arrow::array::BooleanArray = (0..b.num_rows())
                .map(|i| Some(day.value_as_date(i).is_some_and(|d| days.contains(&d))))
                .collect();
            arrow::compute::filter_record_batch(b, &keep).map_err(a)
        })
        .collect()
}

/// Replaces the `days` of gold with `rows` in one commit (a replace-where on the `event_date`
/// partitions); a bootstrap or full reload is [`overwrite_all`].
pub async fn replace_days(
    gold: DeltaTable,
    uri: &str,
    rows: Vec<RecordBatch>,
    schema: &SchemaRef,
    days: &BTreeSet<NaiveDate>,
    props: CommitProperties,
) -> Result<Option<u64>, RunError> {
    let rows: Vec<RecordBatch> = rows
        .iter()
        .map(|b| cast_to(b, schema))
        .collect::<Result<_, _>>()
        .map_err(RunError::arrow(Phase::Write))?;
    if rows.iter().all(|b| b.num_rows() == 0) {
        // The days lost every row (all deleted): remove what gold held for them.
        let (t, _) = gold
            .delete()
            .with_predicate(predicate(days))
            .with_commit_properties(props)
            .await
            .map_err(RunError::write(Phase::Write, uri))?;
        return Ok(t.version());
    }
    let t = gold
        .write(rows)
        .with_save_mode(SaveMode::Overwrite)
        .with_writer_properties(lake::datafile::writer_properties(ROW_GROUP_ROWS))
        .with_partition_columns([EVENT_DATE])
        .with_replace_where(predicate(days))
        .with_commit_properties(lake::no_blind_retry(props))
        .await
        .map_err(RunError::write(Phase::Write, uri))?;
    Ok(t.version())
}

/// Rows per row group in gold's files: a day's file is written (and flushed, compressed) in
/// row groups of this size, so a restatement of many days holds the encoded pages of the open
/// row group per day, not every day's rows.
const ROW_GROUP_ROWS: usize = 8192;

/// `event_date` is one of `days`, as Delta predicate text.
fn predicate(days: &BTreeSet<NaiveDate>) -> String {
    let list: Vec<String> = days.iter().map(|d| format!("'{d}'")).collect();
    format!("{EVENT_DATE} IN ({})", list.join(", "))
}

/// Replaces all of gold with the rows of `plan` in one commit (streamed: a bootstrap or full
/// reload); creates gold, partitioned by `event_date`, on the first run. `facts` completes the
/// commit's run facts once the rows are written.
pub async fn overwrite_all(
    ctx: &SessionContext,
    gold: Option<DeltaTable>,
    uri: &str,
    name: &str,
    plan: datafusion::logical_expr::LogicalPlan,
    facts: lake::facts::FinalFacts,
    props: CommitProperties,
) -> Result<Option<u64>, RunError> {
    let table = lake::or_new(gold, uri)?;
    let table = lake::facts::with_final_facts(table, facts);
    let t = table
        .write(std::iter::empty())
        .with_input_plan(plan)
        .with_session_state(std::sync::Arc::new(ctx.state()))
        .with_save_mode(SaveMode::Overwrite)
        .with_schema_mode(SchemaMode::Overwrite)
        .with_writer_properties(lake::datafile::writer_properties(ROW_GROUP_ROWS))
        .with_partition_columns([EVENT_DATE])
        .with_table_name(name)
        .with_commit_properties(lake::no_blind_retry(props))
        .await
        .map_err(RunError::write(Phase::Write, uri))?;
    Ok(t.version())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Date32Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn day_rows(rows: &[(i32, &str, i64)]) -> (RecordBatch, SchemaRef) {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new(EVENT_DATE, DataType::Date32, false),
            Field::new("merchant", DataType::Utf8, false),
            Field::new("amount", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Date32Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap();
        (batch, schema)
    }

    #[test]
    fn a_day_differs_when_a_row_does_whatever_the_order() {
        let (held, schema) = day_rows(&[(1, "a", 10), (1, "b", 20), (2, "a", 5)]);
        // The same rows in another order: no day changed.
        let (same, _) = day_rows(&[(2, "a", 5), (1, "b", 20), (1, "a", 10)]);
        assert!(changed_days(std::slice::from_ref(&held), &[same], &schema)
            .unwrap()
            .is_empty());
        // One value, one extra row, one missing day, two rows swapping values.
        let (fresh, _) = day_rows(&[(1, "a", 10), (1, "b", 21), (3, "c", 1)]);
        let day = |n: i32| Date32Type::to_naive_date_opt(n).unwrap();
        assert_eq!(
            changed_days(std::slice::from_ref(&held), &[fresh], &schema).unwrap(),
            [day(1), day(2), day(3)].into_iter().collect()
        );
        let (swapped, _) = day_rows(&[(1, "a", 20), (1, "b", 10), (2, "a", 5)]);
        assert_eq!(
            changed_days(std::slice::from_ref(&held), &[swapped], &schema).unwrap(),
            [day(1)].into_iter().collect()
        );
        // A duplicated row is a change (the fingerprint counts rows, not just sums hashes).
        let (doubled, _) = day_rows(&[(1, "a", 10), (1, "a", 10), (1, "b", 20), (2, "a", 5)]);
        assert_eq!(
            changed_days(&[held], &[doubled], &schema).unwrap(),
            [day(1)].into_iter().collect()
        );
    }
}
