//! Final windows inside open days (`window:` + `watermark:` + `after_close: adjust`): the
//! watermark makes a day's early windows final while its later ones are still open, and a final
//! window is never rewritten — what arrives for it later is booked as adjustments, like a closed
//! day's. The day is still replaced whole, so its final windows are written back as gold
//! published them.

use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use std::collections::HashMap;

use arrow::datatypes::{DataType, Date32Type, Int64Type, SchemaRef, TimeUnit};
use datafusion::logical_expr::{cast, lit, Expr};
use datafusion::prelude::ident;

use super::{adjust, days::Days, AfterClose, Opened, Run};
use crate::config::pipeline::aggregate::{DATA_AS_OF, EVENT_DATE, WINDOW_END};
use crate::run::{Phase, RunError};

/// What the day's rows become: the rows to publish, and the adjustments the frozen windows owe.
pub(super) struct Frozen {
    pub(super) rows: Vec<RecordBatch>,
    pub(super) booked: Vec<RecordBatch>,
}

impl Run<'_, '_> {
    /// Keeps the windows final as of the previous run as gold published them, and books what
    /// their fresh rows differ by (nothing to do without all three settings, or before gold).
    pub(super) async fn freeze_windows(
        &mut self,
        o: &Opened,
        rows: Vec<RecordBatch>,
    ) -> Result<Frozen, RunError> {
        let spec = self.spec;
        let before = self
            .clock
            .filter(|_| spec.window.is_some() && spec.after_close == AfterClose::Adjust)
            .and_then(|t| t.clock.final_before_then(t.watermark));
        let (Some(before), Some(gold), Some(schema)) =
            (before, o.gold.as_ref(), rows.first().map(|b| b.schema()))
        else {
            return Ok(Frozen {
                rows,
                booked: Vec::new(),
            });
        };
        let q = |e| RunError::query(Phase::Compare)(e);
        let keep = frozen_expr(&o.plan.days, before, &schema);
        let published = crate::run::frame(&self.a.ctx, gold, &spec.target_uri, Phase::Compare)
            .await?
            .filter(keep.clone())
            .map_err(q)?;
        let (live, fresh) = split(&rows, &o.plan.days, before)?;
        let booked = adjust::booked(
            &self.a.ctx,
            o.adjustments.as_ref(),
            &spec.adjustments_uri,
            keep,
        )
        .await?;
        let kept = published
            .collect()
            .await
            .map_err(RunError::scan(Phase::Compare, &spec.target_uri))?
            .iter()
            .map(|b| conform(b, &schema))
            .collect::<Result<Vec<_>, _>>()?;
        let published = match kept.is_empty() {
            true => self
                .a
                .ctx
                .read_batch(RecordBatch::new_empty(schema.clone())),
            false => self.a.ctx.read_batches(kept.clone()),
        }
        .map_err(q)?;
        // (a booking's `arrived_at`: the latest arrival its window had not seen when published,
        // else — a removal — the run's time; the days' close times say nothing of a window's)
        let fresh = only_new_arrivals(fresh, &kept, spec)?;
        let (booked, stuck) = adjust::deltas(
            &self.a.ctx,
            spec,
            fresh,
            Some(published),
            booked,
            o.plan.days.logical,
            &self.a.summary.run_id,
            self.now,
            &std::collections::BTreeMap::new(),
        )
        .await?;
        if stuck > 0 {
            self.warn(format!("{stuck} group(s) of final windows have a published total that is NaN while a fresh recompute's is not: no adjustment can change a NaN total, so none was booked. Rebuild with `--full-reload`"));
        }
        let mut out = live;
        out.extend(kept);
        Ok(Frozen { rows: out, booked })
    }
}

/// Rows of `days` whose window ends at or before `before`.
fn frozen_expr(days: &Days, before: i64, schema: &SchemaRef) -> Expr {
    let end_type = schema
        .field_with_name(WINDOW_END)
        .map(|f| f.data_type().clone())
        .unwrap_or(DataType::Int64);
    let zone = match &end_type {
        DataType::Timestamp(_, z) => z.clone(),
        _ => None,
    };
    let at = cast(
        lit(datafusion::scalar::ScalarValue::TimestampMicrosecond(
            Some(before),
            zone,
        )),
        end_type,
    );
    days.contains_expr(ident(EVENT_DATE))
        .and(ident(WINDOW_END).lt_eq(at))
}

/// The rows of windows still open (and of days other than `days`: closed days are adjusted
/// whole elsewhere), and (at least one batch, maybe empty) those of `days`' windows final as of
/// `before`.
fn split(
    rows: &[RecordBatch],
    days: &Days,
    before: i64,
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>), RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let (mut live, mut frozen) = (Vec::new(), Vec::new());
    for b in rows {
        let (Some(end), Some(day)) = (b.column_by_name(WINDOW_END), b.column_by_name(EVENT_DATE))
        else {
            live.push(b.clone());
            continue;
        };
        let end = arrow::compute::cast(end, &DataType::Int64).map_err(a)?;
        let end = end.as_primitive::<Int64Type>();
        let day = arrow::compute::cast(day, &DataType::Date32).map_err(a)?;
        let day = day.as_primitive::<Date32Type>();
        let is_frozen: BooleanArray = (0..b.num_rows())
            .map(|i| {
                let ours = day.value_as_date(i).is_some_and(|d| days.set.contains(&d));
                Some(ours && end.is_valid(i) && end.value(i) <= before)
            })
            .collect();
        let is_live = arrow::compute::not(&is_frozen).map_err(a)?;
        frozen.push(arrow::compute::filter_record_batch(b, &is_frozen).map_err(a)?);
        live.push(arrow::compute::filter_record_batch(b, &is_live).map_err(a)?);
    }
    Ok((live, frozen))
}

/// Gold's batch in the run's schema (its columns by name, cast where a type differs).
fn conform(b: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = b.column_by_name(f.name()).ok_or_else(|| {
                a(arrow::error::ArrowError::SchemaError(format!(
                    "gold has no column {}",
                    f.name()
                )))
            })?;
            match c.data_type() == f.data_type() {
                true => Ok(c.clone()),
                false => arrow::compute::cast(c, f.data_type()).map_err(a),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(a)
}

/// The fresh rows with `data_as_of` kept only where it is later than the published row's of the
/// same window and group (a row gold counted is no late arrival), else null.
fn only_new_arrivals(
    fresh: Vec<RecordBatch>,
    published: &[RecordBatch],
    spec: &crate::config::pipeline::Aggregate,
) -> Result<Vec<RecordBatch>, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let mut keys: Vec<String> = vec![EVENT_DATE.to_string()];
    keys.extend(spec.group_keys());
    let mut seen: HashMap<String, i64> = HashMap::new();
    for b in published {
        let arrival = micros(b)?;
        for (i, k) in row_keys(b, &keys)?.into_iter().enumerate() {
            if let Some(t) = arrival.get(i).copied().flatten() {
                seen.insert(k, t);
            }
        }
    }
    fresh
        .into_iter()
        .map(|b| {
            let arrival = micros(&b)?;
            let keep: BooleanArray = row_keys(&b, &keys)?
                .iter()
                .zip(&arrival)
                .map(|(k, t)| Some(t.is_some_and(|t| seen.get(k).is_none_or(|p| t > *p))))
                .collect();
            let Some(i) = b.schema().index_of(DATA_AS_OF).ok() else {
                return Ok(b);
            };
            let nulls = arrow::array::new_null_array(b.column(i).data_type(), b.num_rows());
            let column =
                arrow::compute::kernels::zip::zip(&keep, b.column(i), &nulls).map_err(a)?;
            let mut columns = b.columns().to_vec();
            columns[i] = column;
            RecordBatch::try_new(b.schema(), columns).map_err(a)
        })
        .collect()
}

/// Each row's `data_as_of` in µs.
fn micros(b: &RecordBatch) -> Result<Vec<Option<i64>>, RunError> {
    column_micros(b.column_by_name(DATA_AS_OF), b.num_rows())
}

/// A timestamp column's values in µs (all null without the column).
pub(super) fn column_micros(
    c: Option<&arrow::array::ArrayRef>,
    rows: usize,
) -> Result<Vec<Option<i64>>, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let Some(c) = c else {
        return Ok(vec![None; rows]);
    };
    let c = arrow::compute::cast(c, &DataType::Timestamp(TimeUnit::Microsecond, None))
        .and_then(|c| arrow::compute::cast(&c, &DataType::Int64))
        .map_err(a)?;
    Ok(c.as_primitive::<Int64Type>().iter().collect())
}

/// Each row's key columns rendered as one text.
pub(super) fn row_keys(b: &RecordBatch, keys: &[String]) -> Result<Vec<String>, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let options = arrow::util::display::FormatOptions::default().with_null("\u{0}");
    let columns = keys
        .iter()
        .map(|k| {
            let c = b.column_by_name(k).ok_or_else(|| {
                a(arrow::error::ArrowError::SchemaError(format!(
                    "no column {k}"
                )))
            })?;
            // (the same key in gold and in the fresh rows, whatever their timestamp zones)
            let c = match c.data_type() {
                DataType::Timestamp(_, _) => {
                    arrow::compute::cast(c, &DataType::Int64).map_err(a)?
                }
                _ => c.clone(),
            };
            Ok(c)
        })
        .collect::<Result<Vec<_>, RunError>>()?;
    let formatters = columns
        .iter()
        .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()
        .map_err(a)?;
    Ok((0..b.num_rows())
        .map(|i| {
            formatters
                .iter()
                .map(|f| f.value(i).to_string())
                .collect::<Vec<_>>()
                .join("\u{1f}")
        })
        .collect())
}
