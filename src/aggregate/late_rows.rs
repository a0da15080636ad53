//! The raw late rows (`late_rows:`), what Flink's side output carries, kept durably: each run
//! stores the source rows that reached a final day or window after gold published it — rows
//! gold has not counted: their arrival is later than the `data_as_of` gold published for their
//! day (or window) and group, or gold published no row for that group. New rows, corrected
//! rows (their new image) and soft deletes (a tidemark silver's tombstones) alike; a row
//! removed from the source outright leaves no row to store (its effect is in the adjustments).
//!
//! Each row is stored once (by a fingerprint of its contents), so a rerun, or a run after a
//! crash between this table's commit and gold's, adds none; a restated day's rows are no longer
//! late once gold counts them.

use std::collections::{BTreeSet, HashMap};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type, TimeUnit};
use chrono::NaiveDate;
use datafusion::logical_expr::{cast, lit};
use datafusion::prelude::{ident, DataFrame};

use super::{days::Days, freeze, Opened, Run};
use crate::config::pipeline::aggregate::{
    DATA_AS_OF, EVENT_DATE, IS_FINAL, WINDOW_END, WINDOW_START,
};
use crate::config::pipeline::Aggregate;
use crate::run::quarantine::{store_once, Outcome, Stamp};
use crate::run::{Phase, RunError};

/// The late rows table's columns beside the source's: where the row belongs, and what gold
/// had published for it.
pub const PLACED_DATE: &str = "_event_date";
pub const PLACED_START: &str = "_window_start";
pub const PLACED_END: &str = "_window_end";
pub const PUBLISHED_AS_OF: &str = "_published_data_as_of";

impl Run<'_, '_> {
    /// The source rows of the run's final days and windows that gold has not counted (none
    /// without `late_rows:` or before gold).
    pub(super) async fn late_rows(&mut self, o: &Opened) -> Result<Vec<RecordBatch>, RunError> {
        let spec = self.spec;
        let (Some(_), Some(gold)) = (&spec.late_rows, &o.gold) else {
            return Ok(Vec::new());
        };
        let mut read = o.plan.days.clone();
        read.set.extend(o.plan.adjust.iter().copied());
        read.set.extend(o.plan.beyond.iter().copied());
        let closed: BTreeSet<NaiveDate> = read
            .each()
            .filter(|d| {
                o.closed.contains_key(d) || o.plan.adjust.contains(d) || o.plan.beyond.contains(d)
            })
            .collect();
        // (windows final as of the previous run, in open days too)
        let frozen_before = self
            .clock
            .filter(|_| spec.window.is_some())
            .and_then(|t| t.clock.final_before_then(t.watermark));
        if closed.is_empty() && frozen_before.is_none() {
            return Ok(Vec::new());
        }
        let rows = placed(spec, o.df.clone(), &read, &closed, frozen_before)?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Compare, &spec.source_uri))?;
        if rows.iter().all(|b| b.num_rows() == 0) {
            return Ok(Vec::new());
        }
        let published = self.published(gold, &read).await?;
        rows.iter()
            .map(|b| not_counted(b, spec, &published, &closed, frozen_before))
            .collect()
    }

    /// Gold's rows of `days`: each key's `data_as_of` (µs) and whether it is final.
    async fn published(
        &self,
        gold: &deltalake::DeltaTable,
        days: &Days,
    ) -> Result<HashMap<String, (Option<i64>, bool)>, RunError> {
        let spec = self.spec;
        let q = |e| RunError::query(Phase::Compare)(e);
        let batches = crate::run::frame(&self.a.ctx, gold, &spec.target_uri, Phase::Compare)
            .await?
            .filter(days.contains_expr(ident(EVENT_DATE)))
            .map_err(q)?
            .collect()
            .await
            .map_err(RunError::scan(Phase::Compare, &spec.target_uri))?;
        let mut keys = vec![EVENT_DATE.to_string()];
        keys.extend(spec.group_keys());
        let mut out = HashMap::new();
        for b in &batches {
            let as_of = freeze::column_micros(b.column_by_name(DATA_AS_OF), b.num_rows())?;
            let is_final = b
                .column_by_name(IS_FINAL)
                .and_then(|c| c.as_boolean_opt().cloned());
            for (i, k) in freeze::row_keys(b, &keys)?.into_iter().enumerate() {
                let f = is_final
                    .as_ref()
                    .is_some_and(|c| c.is_valid(i) && c.value(i));
                out.insert(k, (as_of[i], f));
            }
        }
        Ok(out)
    }

    /// Stores the late rows not stored yet (unless a dry run) and counts them.
    pub(super) async fn store_late_rows(&mut self, rows: Vec<RecordBatch>) -> Result<(), RunError> {
        let Some(uri) = &self.spec.late_rows else {
            return Ok(());
        };
        self.check_late_rows_table(uri).await?;
        let stamp = Stamp {
            run_id: &self.a.summary.run_id,
            now: self.now,
            column: "_recorded_at",
            phase: Phase::Write,
            // (what gold had counted changes with a restatement, a reload or a restore: the
            // row is the same late row)
            unhashed: &[PUBLISHED_AS_OF],
        };
        let Outcome { rejected, new } =
            store_once(&self.a.ctx, uri, rows, stamp, self.opts.dry_run).await?;
        self.c.num_late_rows = Some(rejected);
        self.c.num_late_rows_new = Some(new);
        Ok(())
    }
}

impl Run<'_, '_> {
    /// Refuses a `late_rows` location holding a table that is not a late rows table (another
    /// pipeline's, say): appending there would change that table.
    async fn check_late_rows_table(&self, uri: &str) -> Result<(), RunError> {
        let Some(t) = crate::lake::open_if_exists(uri).await? else {
            return Ok(());
        };
        let holds = t
            .snapshot()
            .map(|s| {
                s.schema()
                    .field(crate::run::quarantine::ROW_HASH_COLUMN)
                    .is_some()
            })
            .unwrap_or(false);
        if holds {
            return Ok(());
        }
        Err(RunError::Config(self.p.error_at(
            "late_rows",
            format!("`late_rows` is {uri}, a Delta table that is not a late rows table (it has no `{}` column): nothing was written. Point `late_rows.uri` at a location of its own, or leave it out for the default `<target>_late_rows`", crate::run::quarantine::ROW_HASH_COLUMN),
        )))
    }
}

/// The source's rows of `read` in a closed day or in a window ending at or before
/// `frozen_before`, each with its day and window.
fn placed(
    spec: &Aggregate,
    df: DataFrame,
    read: &Days,
    closed: &BTreeSet<NaiveDate>,
    frozen_before: Option<i64>,
) -> Result<DataFrame, RunError> {
    let q = |e| RunError::query(Phase::Compare)(e);
    let event_type = df
        .schema()
        .qualified_field_with_unqualified_name(&spec.event_date)
        .map_err(q)?
        .1
        .data_type()
        .clone();
    let (day, raw) = super::days::event_day(spec, &event_type).map_err(|m| RunError::Internal {
        phase: Phase::Compare,
        message: format!("the late rows' event day: {m}"),
    })?;
    let mut df = df
        .with_column(PLACED_DATE, day)
        .and_then(|df| df.filter(read.contains_expr(ident(PLACED_DATE))))
        .map_err(q)?;
    let closed_days = Days {
        set: closed.clone(),
        ..read.clone()
    };
    let mut keep = closed_days.contains_expr(ident(PLACED_DATE));
    if let Some(w) = spec.window {
        let tz = matches!(raw, super::days::RawRange::Instant(_)).then_some(spec.time_zone);
        let (start, end) = super::window::bounds(ident(&spec.event_date), tz, w);
        df = df
            .with_column(PLACED_START, start)
            .and_then(|df| df.with_column(PLACED_END, end))
            .map_err(q)?;
        if let Some(before) = frozen_before {
            let end_micros = cast(
                cast(
                    ident(PLACED_END),
                    DataType::Timestamp(TimeUnit::Microsecond, None),
                ),
                DataType::Int64,
            );
            keep = keep.or(end_micros.lt_eq(lit(before)));
        }
    }
    df.filter(keep).map_err(q)
}

/// The rows of `b` gold has not counted: later than the `data_as_of` published for their key,
/// or of a final key gold published nothing for; with that published `data_as_of`.
fn not_counted(
    b: &RecordBatch,
    spec: &Aggregate,
    published: &HashMap<String, (Option<i64>, bool)>,
    closed: &BTreeSet<NaiveDate>,
    frozen_before: Option<i64>,
) -> Result<RecordBatch, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    // (the keys as gold spells them: its day, window and group columns)
    let mut names = vec![PLACED_DATE.to_string()];
    let mut keys = vec![EVENT_DATE.to_string()];
    if spec.window.is_some() {
        names.extend([PLACED_START.to_string(), PLACED_END.to_string()]);
        keys.extend([WINDOW_START.to_string(), WINDOW_END.to_string()]);
    }
    names.extend(spec.group_by.iter().cloned());
    keys.extend(spec.group_by.iter().cloned());
    let renamed = rename(b, &names, &keys)?;
    let arrival = freeze::column_micros(b.column_by_name(&spec.data_as_of), b.num_rows())?;
    let ends = freeze::column_micros(b.column_by_name(PLACED_END), b.num_rows())?;
    let day = b
        .column_by_name(PLACED_DATE)
        .map(|c| arrow::compute::cast(c, &DataType::Date32))
        .transpose()
        .map_err(a)?;
    let day = day.as_ref().map(|d| d.as_primitive::<Date32Type>());
    let mut as_of: Vec<Option<i64>> = Vec::with_capacity(b.num_rows());
    let keep: BooleanArray = freeze::row_keys(&renamed, &keys)?
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let final_here = day
                .and_then(|d| d.value_as_date(i))
                .is_some_and(|d| closed.contains(&d))
                || frozen_before.zip(ends[i]).is_some_and(|(x, e)| e <= x);
            let (seen, late) = match published.get(k) {
                Some((seen, f)) => (*seen, (final_here || *f) && arrival[i] > *seen),
                None => (None, final_here),
            };
            as_of.push(seen);
            Some(late)
        })
        .collect();
    let column: ArrayRef = std::sync::Arc::new(
        arrow::array::TimestampMicrosecondArray::from(as_of).with_timezone("UTC"),
    );
    let mut fields: Vec<arrow::datatypes::Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(arrow::datatypes::Field::new(
        PUBLISHED_AS_OF,
        column.data_type().clone(),
        true,
    ));
    let mut columns = b.columns().to_vec();
    columns.push(column);
    let with = RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        columns,
    )
    .map_err(a)?;
    arrow::compute::filter_record_batch(&with, &keep).map_err(a)
}

/// `b` with its columns `from` named `to` (only those, for the keys).
fn rename(b: &RecordBatch, from: &[String], to: &[String]) -> Result<RecordBatch, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (f, t) in from.iter().zip(to) {
        let c = b.column_by_name(f).ok_or_else(|| {
            a(arrow::error::ArrowError::SchemaError(format!(
                "no column {f}"
            )))
        })?;
        fields.push(arrow::datatypes::Field::new(t, c.data_type().clone(), true));
        columns.push(c.clone());
    }
    RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        columns,
    )
    .map_err(a)
}
