//! `after_close: adjust` — a final day is never rewritten; what arrives for it after the books
//! closed is booked as an **adjustment** in the open period (seed 002's side output, made
//! durable): per day and group, the difference between a fresh recompute and what is published
//! so far (gold's rows plus the adjustments already booked), for the additive measures.
//!
//! So *published closed day + its adjustments == a fresh recompute of that day* after every run,
//! and booking is idempotent: a rerun finds the difference already booked and adds nothing.

use std::sync::Arc;

use arrow::array::RecordBatch;
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::datasource::MemTable;
use datafusion::functions_aggregate::expr_fn::{max, sum};
use datafusion::logical_expr::{cast, lit, Expr};
use datafusion::prelude::{coalesce, ident, DataFrame, SessionContext};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;

use super::days::date_lit;
use crate::config::pipeline::aggregate::{DATA_AS_OF, EVENT_DATE};
use crate::config::pipeline::Aggregate;
use crate::lake;
use crate::run::{Phase, RunError};

/// The adjustments table's column: the open day the adjustment is booked to.
pub const REPORTED_IN: &str = "reported_in";
/// ... when the late data behind it arrived (the latest arrival among the day's group).
pub const ARRIVED_AT: &str = "arrived_at";
/// ... the run that booked it.
pub const RUN_ID: &str = "run_id";

/// The adjustment rows for the days of `fresh` (a recompute of final days, in gold's columns):
/// per group, fresh minus published (`gold`'s rows of those days plus `booked`'s). Also the
/// number of groups whose published float total is NaN while the fresh one is not: no
/// adjustment can bring such a total back (NaN + x is NaN), so nothing is booked for them.
///
/// A group is booked when a measure differs: NaN equals NaN and -0.0 equals 0.0 here, so a
/// NaN in a closed day is booked once, and a rerun books nothing.
#[allow(clippy::too_many_arguments)]
pub async fn deltas(
    ctx: &SessionContext,
    spec: &Aggregate,
    fresh: Vec<RecordBatch>,
    gold: Option<DataFrame>,
    booked: Option<DataFrame>,
    reported_in: NaiveDate,
    run_id: &str,
    now: DateTime<Utc>,
    closes: &std::collections::BTreeMap<NaiveDate, i64>,
) -> Result<(Vec<RecordBatch>, usize), RunError> {
    let q = |e| RunError::query(Phase::Compare)(e);
    let Some(schema) = fresh.first().map(|b| b.schema()) else {
        return Ok((Vec::new(), 0));
    };
    let mut keys: Vec<String> = vec![EVENT_DATE.to_string()];
    keys.extend(spec.group_keys());
    let measures: Vec<Side> = spec
        .measures
        .iter()
        .map(|m| Side::of(&m.name, &schema))
        .collect();
    let ts = schema
        .field_with_name(DATA_AS_OF)
        .map(|f| f.data_type().clone())
        .map_err(|e| RunError::arrow(Phase::Compare)(e))?;
    // Each side in one shape: the keys, each measure as fresh and as published, arrival.
    let shape = |df: DataFrame, is_fresh: bool| -> Result<DataFrame, RunError> {
        let mut cols: Vec<Expr> = keys.iter().map(ident).collect();
        for m in &measures {
            let v = coalesce(vec![ident(&m.name), lit(0i64)]);
            let zero = cast(lit(0i64), m.data_type.clone());
            let (f, p) = if is_fresh { (v, zero) } else { (zero, v) };
            cols.push(f.alias(&m.fresh));
            cols.push(p.alias(&m.published));
            if m.is_float() {
                // (each term's size: how far apart rounding alone can put the two sums)
                cols.push(abs(coalesce(vec![ident(&m.name), lit(0f64)])).alias(&m.magnitude));
            }
        }
        cols.push(if is_fresh {
            // Only what arrived after the day closed is behind an adjustment; a removal (a
            // delete) has no row left to say when: the run that found it does (below).
            late_arrival(closes, &ts).alias(ARRIVED_AT)
        } else {
            cast(lit(datafusion::scalar::ScalarValue::Null), ts.clone()).alias(ARRIVED_AT)
        });
        df.select(cols).map_err(q)
    };
    // (the adjustments table's own column types: a decimal difference is booked in them)
    let booked_types = booked.as_ref().map(|b| b.schema().as_arrow().clone());
    let mem = MemTable::try_new(schema.clone(), vec![fresh]).map_err(q)?;
    let mut all = shape(ctx.read_table(Arc::new(mem)).map_err(q)?, true)?;
    for side in [gold, booked].into_iter().flatten() {
        all = all.union(shape(side, false)?).map_err(q)?;
    }
    let mut aggs: Vec<Expr> = Vec::new();
    for m in &measures {
        aggs.push(sum(ident(&m.fresh)).alias(&m.fresh));
        aggs.push(sum(ident(&m.published)).alias(&m.published));
        if m.is_float() {
            aggs.push(sum(ident(&m.magnitude)).alias(&m.magnitude));
        }
    }
    aggs.push(max(ident(ARRIVED_AT)).alias(ARRIVED_AT));
    let any = |f: &dyn Fn(&Side) -> Expr| {
        measures
            .iter()
            .map(f)
            .reduce(Expr::or)
            .unwrap_or_else(|| lit(false))
    };
    let changed = any(&Side::changed);
    let stuck = any(&Side::stuck);
    let mut out: Vec<Expr> = vec![ident(EVENT_DATE), date_lit(reported_in).alias(REPORTED_IN)];
    out.extend(spec.group_keys().iter().map(ident));
    out.extend(measures.iter().map(|m| m.difference(booked_types.as_ref())));
    let now_lit = lit(datafusion::scalar::ScalarValue::TimestampMicrosecond(
        Some(now.timestamp_micros()),
        Some("UTC".into()),
    ));
    out.push(coalesce(vec![ident(ARRIVED_AT), cast(now_lit, ts.clone())]).alias(ARRIVED_AT));
    out.push(lit(run_id.to_string()).alias(RUN_ID));
    let order: Vec<_> = keys.iter().map(|k| ident(k).sort(true, true)).collect();
    let totals = all
        .aggregate(keys.iter().map(ident).collect(), aggs)
        .map_err(q)?
        .cache()
        .await
        .map_err(q)?;
    let stuck = totals
        .clone()
        .filter(stuck)
        .map_err(q)?
        .count()
        .await
        .map_err(q)?;
    let rows = totals
        .filter(changed)
        .and_then(|df| df.select(out))
        .and_then(|df| df.sort(order))
        .map_err(q)?
        .collect()
        .await
        .map_err(q)?;
    Ok((rows, stuck))
}

/// A measure's two sides in the compare: its fresh total and its published one (and for a
/// float, the sum of the sizes of every term on both sides).
struct Side {
    name: String,
    fresh: String,
    published: String,
    magnitude: String,
    data_type: arrow::datatypes::DataType,
}

/// Float totals closer than this fraction of the sizes summed are equal: a float sum's value
/// depends on the order it adds its terms in (the published total plus its bookings, summed
/// in another order, can miss the fresh total by a few units in the last place), and a
/// difference that small is rounding, not a late row — booking it would book it again and
/// again. Far below any money amount's cents (2^-40 ≈ 9e-13: a cent in ten billion), and
/// below `reconcile`'s tolerance (1e-9), so what is not booked is not a difference there.
const FLOAT_ROUNDING: f64 = 1.0 / (1u64 << 40) as f64;

impl Side {
    fn of(name: &str, schema: &arrow::datatypes::Schema) -> Side {
        let data_type = schema
            .field_with_name(name)
            .map(|f| f.data_type().clone())
            .unwrap_or(arrow::datatypes::DataType::Int64);
        Side {
            name: name.to_string(),
            fresh: format!("__fresh_{name}"),
            published: format!("__published_{name}"),
            magnitude: format!("__magnitude_{name}"),
            data_type,
        }
    }

    /// Fresh minus published, named after the measure. A decimal's difference is exact but one
    /// digit wider than its sides (which are sums already), so it is booked in the adjustments
    /// table's type when there is one, else in gold's: every booking has the same column type.
    fn difference(&self, booked: Option<&arrow::datatypes::Schema>) -> Expr {
        let d = ident(&self.fresh) - ident(&self.published);
        if !matches!(self.data_type, arrow::datatypes::DataType::Decimal128(..)) {
            return d.alias(&self.name);
        }
        let ty = booked
            .and_then(|s| s.field_with_name(&self.name).ok())
            .map(|f| f.data_type().clone())
            .filter(|t| matches!(t, arrow::datatypes::DataType::Decimal128(..)))
            .unwrap_or_else(|| self.data_type.clone());
        cast(d, ty).alias(&self.name)
    }

    fn is_float(&self) -> bool {
        self.data_type.is_floating()
    }

    /// The totals differ: for floats, NaN equals NaN and -0.0 equals 0.0, and a NaN published
    /// total is never adjusted (see [`Side::stuck`]).
    fn changed(&self) -> Expr {
        let (f, p) = (ident(&self.fresh), ident(&self.published));
        if !self.is_float() {
            return distinct(f, p);
        }
        // (|f - p| beyond rounding: NaN when f is, and 0.0 for -0.0 - 0.0, which compare
        // unequal alone)
        let apart = abs(f.clone() - p.clone());
        let rounding = lit(FLOAT_ROUNDING) * ident(&self.magnitude);
        distinct(f, p.clone())
            .and(apart.clone().gt(lit(0.0f64)))
            .and(datafusion::logical_expr::not(apart.lt_eq(rounding)))
            .and(datafusion::logical_expr::not(isnan(p)))
    }

    /// A published float total is NaN while the fresh one is not.
    fn stuck(&self) -> Expr {
        if !self.is_float() {
            return lit(false);
        }
        isnan(ident(&self.published)).and(datafusion::logical_expr::not(isnan(ident(&self.fresh))))
    }
}

/// `a IS DISTINCT FROM b`.
fn distinct(a: Expr, b: Expr) -> Expr {
    datafusion::logical_expr::binary_expr(a, datafusion::logical_expr::Operator::IsDistinctFrom, b)
}

fn abs(e: Expr) -> Expr {
    datafusion::functions::math::expr_fn::abs(e)
}

fn isnan(e: Expr) -> Expr {
    datafusion::functions::math::expr_fn::isnan(e)
}

/// A row's arrival when it is after its day's close, else NULL.
fn late_arrival(
    closes: &std::collections::BTreeMap<NaiveDate, i64>,
    ts: &arrow::datatypes::DataType,
) -> Expr {
    let mut close: Option<datafusion::logical_expr::conditional_expressions::CaseBuilder> = None;
    for (d, t) in closes {
        let at = cast(
            lit(datafusion::scalar::ScalarValue::TimestampMicrosecond(
                Some(*t),
                Some("UTC".into()),
            )),
            ts.clone(),
        );
        let cond = ident(EVENT_DATE).eq(date_lit(*d));
        close = Some(match close {
            None => datafusion::logical_expr::when(cond, at),
            Some(mut c) => c.when(cond, at),
        });
    }
    let Some(close) = close else {
        return ident(DATA_AS_OF);
    };
    match close.end() {
        Ok(close) => datafusion::logical_expr::when(ident(DATA_AS_OF).gt(close), ident(DATA_AS_OF))
            .end()
            .unwrap_or_else(|_| ident(DATA_AS_OF)),
        Err(_) => ident(DATA_AS_OF),
    }
}

/// The adjustments booked so far for the days `keep` selects (`None` when there are none).
pub async fn booked(
    ctx: &SessionContext,
    table: Option<&DeltaTable>,
    uri: &str,
    keep: Expr,
) -> Result<Option<DataFrame>, RunError> {
    let Some(t) = table else {
        return Ok(None);
    };
    Ok(Some(
        crate::run::frame(ctx, t, uri, Phase::Compare)
            .await?
            .filter(keep)
            .map_err(RunError::query(Phase::Compare))?,
    ))
}

/// Appends `rows` to the adjustments table in one commit (created on first use).
pub async fn book(
    table: Option<DeltaTable>,
    uri: &str,
    rows: Vec<RecordBatch>,
    props: CommitProperties,
) -> Result<Option<u64>, RunError> {
    let table = lake::or_new(table, uri)?;
    let t = table
        .write(rows)
        .with_save_mode(SaveMode::Append)
        .with_schema_mode(SchemaMode::Merge)
        .with_commit_properties(props)
        .await
        .map_err(RunError::write(Phase::Write, uri))?;
    Ok(t.version())
}
