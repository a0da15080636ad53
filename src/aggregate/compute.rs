//! The aggregate itself: the source's live rows of the run's days, grouped by event day and the
//! pipeline's groups, with its measures, `data_as_of` and `is_final`; and per day, what the
//! status table records.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type, Int64Type, SchemaRef, TimeUnit};
use chrono::NaiveDate;
use datafusion::functions_aggregate::expr_fn::{count, count_distinct, max, min, sum};
use datafusion::logical_expr::{lit, when, Expr, ExprSchemable, SortExpr};
use datafusion::prelude::{coalesce, ident, DataFrame};

use super::days::{date_lit, Days};
use crate::config::pipeline::aggregate::{
    Agg, Measure, DATA_AS_OF, EVENT_DATE, IS_FINAL, WINDOW_END, WINDOW_START,
};
use crate::config::pipeline::{Aggregate, Pipeline, DELETED_COLUMN};
use crate::run::{Phase, RunError};

/// Rows per output group (not written to gold: summed per day for the status table).
pub const ROWS: &str = "__tidemark_rows";
/// Of those, rows that arrived after their (closed) day was first labelled final.
pub const LATE: &str = "__tidemark_late";
/// The prefix of the helper columns gold does not store.
const HELPER: &str = "__tidemark_";

/// What the read needs to know about the source.
pub struct Source<'a> {
    pub p: &'a Pipeline,
    pub spec: &'a Aggregate,
    pub df: DataFrame,
    /// Closed days and when they closed (µs, UTC: the start of their `final_since` day):
    /// their rows arriving later are counted as late after close.
    pub closed: &'a BTreeMap<NaiveDate, i64>,
    /// With `window:` and `watermark:`: windows ending at or before it (µs) are final, in an
    /// open day too.
    pub final_before: Option<i64>,
}

/// The grouped rows for `days` (every day when `None`), sorted by day and groups, with the
/// helper [`ROWS`] column last.
pub fn grouped(
    s: Source<'_>,
    days: Option<&Days>,
    open_from: NaiveDate,
) -> Result<DataFrame, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let spec = s.spec;
    let (day, raw) = checked_columns(&s)?;
    let mut df = counted_rows(&s, s.df.clone())?;
    if let Some(d) = days {
        // One range of the raw column per run of consecutive days (late changes to closed
        // days are scattered: files between them are pruned); no day: the same plan over no
        // rows.
        let covering = d
            .runs()
            .into_iter()
            .map(|(a, b)| raw.covering(&spec.event_date, spec.time_zone, a, b))
            .reduce(Expr::or)
            .unwrap_or_else(|| lit(false));
        df = df.filter(covering).map_err(q)?;
    }
    df = df.with_column(EVENT_DATE, day).map_err(q)?;
    if let Some(d) = days {
        df = df.filter(d.contains_expr(ident(EVENT_DATE))).map_err(q)?;
    }
    if let Some(w) = spec.window {
        let tz = matches!(raw, super::days::RawRange::Instant(_)).then_some(spec.time_zone);
        let (start, end) = super::window::bounds(ident(&spec.event_date), tz, w);
        df = df
            .with_column(WINDOW_START, start)
            .and_then(|df| df.with_column(WINDOW_END, end))
            .map_err(q)?;
    }
    let mut aggs: Vec<Expr> = Vec::new();
    for m in &spec.measures {
        aggs.push(measure(&s, &df, m)?.alias(&m.name));
    }
    aggs.push(max(ident(&spec.data_as_of)).alias(DATA_AS_OF));
    aggs.push(count(lit(1i64)).alias(ROWS));
    aggs.push(late_after_close(s.closed, days, &spec.data_as_of)?.alias(LATE));
    let mut groups: Vec<Expr> = vec![ident(EVENT_DATE)];
    groups.extend(spec.group_keys().iter().map(ident));
    let zone = matches!(raw, super::days::RawRange::Instant(_)).then(|| "UTC".into());
    let out = output_columns(&s, &groups, open_from, zone);
    let order: Vec<SortExpr> = groups.iter().map(|g| g.clone().sort(true, true)).collect();
    df.aggregate(groups, aggs)
        .and_then(|df| df.select(out))
        .and_then(|df| df.sort(order))
        .map_err(q)
}

/// Every column the pipeline names is in the source (else a config error at the line naming
/// it); the event day's expression and its raw column.
fn checked_columns(s: &Source<'_>) -> Result<(Expr, super::days::RawRange), RunError> {
    let spec = s.spec;
    let schema = s.df.schema().clone();
    let field = |name: &str, key: &str, hint: &str| {
        schema
            .qualified_field_with_unqualified_name(name)
            .map(|(_, f)| f.data_type().clone())
            .map_err(|_| {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                let near = crate::config::nearest(name, names.iter().copied())
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                let message = format!(
                    "the source {} has no column `{name}`{near}{hint}; its columns: {}",
                    spec.source_uri,
                    names.join(", ")
                );
                // (at the line naming it; a default such as `data_as_of`: at its key)
                RunError::Config(if s.p.mentions(name) {
                    s.p.error_at_text(name, message)
                } else {
                    s.p.error_at(key, message)
                })
            })
    };
    let event_type = field(&spec.event_date, "column", "")?;
    let (day, raw) = super::days::event_day(spec, &event_type)
        .map_err(|m| RunError::Config(s.p.error_at("column", m)))?;
    if let (Some(w), super::days::RawRange::Date) = (spec.window, raw) {
        return Err(RunError::Config(s.p.error_at(
            "window",
            format!(
                "`window: {}` cuts days by the time of day, and `{}` is a date: window a timestamp column, or leave `window:` out for rows per day",
                w.label(),
                spec.event_date
            ),
        )));
    }
    field(
        &spec.data_as_of,
        "data_as_of",
        "; name the arrival column with `data_as_of:` (a tidemark silver has `_ingested_at`)",
    )?;
    for g in &spec.group_by {
        field(g, "group_by", "")?;
    }
    for m in &spec.measures {
        if let Some(c) = &m.column {
            field(c, "measures", "")?;
        }
    }
    Ok((day, raw))
}

/// The rows of `df` that count (see `counted_rows`), for the rows no day can hold.
pub fn counted(p: &Pipeline, spec: &Aggregate, df: DataFrame) -> Result<DataFrame, RunError> {
    let s = Source {
        p,
        spec,
        df: df.clone(),
        closed: &BTreeMap::new(),
        final_before: None,
    };
    counted_rows(&s, df)
}

/// The rows that count: no tombstones (a tidemark silver's soft deletes are not payments), and
/// those meeting `where`.
fn counted_rows(s: &Source<'_>, mut df: DataFrame) -> Result<DataFrame, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    if df
        .schema()
        .qualified_field_with_unqualified_name(DELETED_COLUMN)
        .is_ok()
    {
        df = df
            .filter(datafusion::logical_expr::not(coalesce(vec![
                ident(DELETED_COLUMN),
                lit(false),
            ])))
            .map_err(q)?;
    }
    if let Some(w) = &s.spec.where_sql {
        let e = df.parse_sql_expr(w).map_err(|e| {
            let why = crate::run::sql::explain(&e, w);
            RunError::Config(s.p.error_at("where", format!("where: {why}")))
        })?;
        condition(&e, &df, w).map_err(|m| RunError::Config(s.p.error_at("where", m)))?;
        df = df.filter(coalesce(vec![e, lit(false)])).map_err(q)?;
    }
    Ok(df)
}

/// One measure's aggregate over the rows meeting its filter.
fn measure(s: &Source<'_>, df: &DataFrame, m: &Measure) -> Result<Expr, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let filter = match &m.filter {
        Some(f) => {
            let e = df.parse_sql_expr(f).map_err(|e| {
                RunError::Config(s.p.error_at_text(
                    f,
                    format!(
                        "measure `{}`: filter {}",
                        m.name,
                        crate::run::sql::explain(&e, f)
                    ),
                ))
            })?;
            condition(&e, df, f).map_err(|msg| {
                RunError::Config(
                    s.p.error_at_text(f, format!("measure `{}`: filter {msg}", m.name)),
                )
            })?;
            Some(e)
        }
        None => None,
    };
    let mut wide_sum = None;
    if let (Agg::Sum, Some(c)) = (m.agg, &m.column) {
        let t = df
            .schema()
            .qualified_field_with_unqualified_name(c)
            .map(|(_, f)| f.data_type().clone())
            .unwrap_or(DataType::Null);
        // A sum of decimal(p, s) is a decimal(min(38, p + 10), s): past p = 28 it can overflow
        // 38 digits, and DataFusion's sum would wrap. Summed as a decimal(76, s) and cast back,
        // an overflow is an error ([`OVERFLOW`]), never a wrong total.
        if let DataType::Decimal128(p, s) = t {
            if p > 28 {
                wide_sum = Some(s);
            }
        }
        if !t.is_numeric() {
            return Err(RunError::Config(s.p.error_at_text(
                &m.name,
                format!("measure `{}` sums `{c}`, which is {}: `sum` needs a number column (count rows with `agg: count`)", m.name, type_name(&t)),
            )));
        }
    }
    // Only the rows meeting the filter: others become NULL, which every aggregate skips.
    let input = match &m.column {
        Some(c) => ident(c),
        None => lit(1i64),
    };
    let input = match &filter {
        Some(f) => when(coalesce(vec![f.clone(), lit(false)]), input)
            .end()
            .map_err(q)?,
        None => input,
    };
    Ok(match m.agg {
        Agg::Count => count(input),
        // A group whose rows all miss the filter sums to 0, not NULL.
        Agg::Sum => match wide_sum {
            Some(s) => datafusion::logical_expr::cast(
                coalesce(vec![
                    sum(datafusion::logical_expr::cast(
                        input,
                        DataType::Decimal256(76, s),
                    )),
                    lit(0i64),
                ]),
                DataType::Decimal128(38, s),
            ),
            None => coalesce(vec![sum(input), lit(0i64)]),
        },
        Agg::Min => min(input),
        Agg::Max => max(input),
        Agg::CountDistinct => count_distinct(input),
    })
}

/// The output's columns: groups, measures, data_as_of, whether the day is final, and the
/// helper columns.
fn output_columns(
    s: &Source<'_>,
    groups: &[Expr],
    open_from: NaiveDate,
    zone: Option<std::sync::Arc<str>>,
) -> Vec<Expr> {
    let mut out: Vec<Expr> = groups.to_vec();
    out.extend(s.spec.measures.iter().map(|m| ident(&m.name)));
    out.push(ident(DATA_AS_OF));
    // Final: before the open window, or closed by an earlier run (a closed day stays closed).
    let mut is_final = ident(EVENT_DATE).lt(date_lit(open_from));
    if !s.closed.is_empty() {
        is_final = is_final
            .or(ident(EVENT_DATE).in_list(s.closed.keys().map(|d| date_lit(*d)).collect(), false));
    }
    if let (Some(x), Some(_)) = (s.final_before, s.spec.window) {
        let x = lit(datafusion::scalar::ScalarValue::TimestampMicrosecond(
            Some(x),
            zone,
        ));
        is_final = is_final.or(ident(WINDOW_END).lt_eq(x));
    }
    out.push(is_final.alias(IS_FINAL));
    out.push(ident(ROWS));
    out.push(ident(LATE));
    out
}

/// The first and last event day of the source's rows (`None` when it has none): a full
/// restatement aggregates the days between in chunks, so one hash table never holds every
/// day's groups.
pub async fn day_bounds(s: Source<'_>) -> Result<Option<(NaiveDate, NaiveDate)>, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let spec = s.spec;
    let Ok((_, field)) =
        s.df.schema()
            .qualified_field_with_unqualified_name(&spec.event_date)
    else {
        return Ok(None); // `grouped` names the missing column
    };
    let (day, _) = super::days::event_day(spec, field.data_type())
        .map_err(|m| RunError::Config(s.p.error_at("column", m)))?;
    let b =
        s.df.aggregate(
            vec![],
            vec![min(day.clone()).alias("lo"), max(day).alias("hi")],
        )
        .map_err(q)?
        .collect()
        .await
        .map_err(RunError::scan(Phase::Read, &spec.source_uri))?;
    let Some(b) = b.iter().find(|b| b.num_rows() > 0) else {
        return Ok(None);
    };
    let get = |i: usize| {
        arrow::compute::cast(b.column(i), &DataType::Date32)
            .ok()
            .and_then(|c| c.as_primitive::<Date32Type>().value_as_date(0))
    };
    Ok(get(0).zip(get(1)))
}

/// A condition must be true/false: a number or a text in its place is a config error, not a
/// failed query.
fn condition(e: &Expr, df: &DataFrame, sql: &str) -> Result<(), String> {
    match e.get_type(df.schema()) {
        Ok(DataType::Boolean) | Ok(DataType::Null) => Ok(()),
        Ok(t) => Err(format!(
            "`{sql}` is {}, not a condition: write one that is true for the rows to count, like `status = 'refunded'`",
            type_name(&t)
        )),
        Err(e) => Err(crate::run::sql::explain(&e, sql)),
    }
}

/// A column type as a person names it (not Arrow's `Utf8View`, `Int64`, ...).
fn type_name(t: &DataType) -> &'static str {
    match t {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => "text",
        DataType::Boolean => "a boolean",
        t if t.is_integer() => "an integer",
        t if t.is_floating() => "a floating-point number",
        DataType::Decimal128(..) | DataType::Decimal256(..) => "a decimal",
        DataType::Timestamp(..) => "a timestamp",
        DataType::Date32 | DataType::Date64 => "a date",
        _ => "not a number",
    }
}

/// The rows whose arrival is at or after their closed day's close (0 for open days).
fn late_after_close(
    closed: &BTreeMap<NaiveDate, i64>,
    days: Option<&Days>,
    arrival: &str,
) -> Result<Expr, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let mut relevant = closed
        .iter()
        .filter(|(d, _)| days.is_none_or(|days| days.set.contains(d)));
    let Some((d, t)) = relevant.next() else {
        return Ok(sum(lit(0i64)));
    };
    let at = |t: i64| {
        lit(datafusion::scalar::ScalarValue::TimestampMicrosecond(
            Some(t),
            Some("UTC".into()),
        ))
    };
    let day = ident(EVENT_DATE);
    let mut close = when(day.clone().eq(date_lit(*d)), at(*t));
    for (d, t) in relevant {
        close = close.when(day.clone().eq(date_lit(*d)), at(*t));
    }
    let close = close.end().map_err(q)?;
    let late = coalesce(vec![
        datafusion::logical_expr::cast(
            ident(arrival),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        )
        .gt_eq(close),
        lit(false),
    ]);
    Ok(sum(when(late, lit(1i64))
        .otherwise(lit(0i64))
        .map_err(q)?))
}

/// Per event day: source rows, output groups and the latest arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DayFacts {
    pub rows: i64,
    pub groups: i64,
    /// Microseconds (UTC).
    pub last_arrival: Option<i64>,
    /// Rows that arrived after the (closed) day was first labelled final.
    pub late_rows: i64,
}

/// Sums the grouped batches per day.
pub fn day_facts(batches: &[RecordBatch]) -> Result<BTreeMap<NaiveDate, DayFacts>, RunError> {
    let mut out: BTreeMap<NaiveDate, DayFacts> = BTreeMap::new();
    add_day_facts(&mut out, batches).map_err(RunError::arrow(Phase::Read))?;
    Ok(out)
}

/// Adds the grouped batches' rows to `out`, per day.
pub fn add_day_facts(
    out: &mut BTreeMap<NaiveDate, DayFacts>,
    batches: &[RecordBatch],
) -> Result<(), arrow::error::ArrowError> {
    for b in batches {
        let (Some(day), Some(rows), Some(arrival), Some(late)) = (
            b.column_by_name(EVENT_DATE),
            b.column_by_name(ROWS),
            b.column_by_name(DATA_AS_OF),
            b.column_by_name(LATE),
        ) else {
            continue;
        };
        let late = arrow::compute::cast(late, &DataType::Int64)?;
        let late = late.as_primitive::<Int64Type>();
        let day = arrow::compute::cast(day, &DataType::Date32)?;
        let day = day.as_primitive::<Date32Type>();
        let rows = arrow::compute::cast(rows, &DataType::Int64)?;
        let rows = rows.as_primitive::<Int64Type>();
        let arrival =
            arrow::compute::cast(arrival, &DataType::Timestamp(TimeUnit::Microsecond, None))
                .and_then(|c| arrow::compute::cast(&c, &DataType::Int64))?;
        let arrival = arrival.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let Some(d) = day.value_as_date(i) else {
                continue;
            };
            let f = out.entry(d).or_default();
            f.rows += rows.value(i);
            f.groups += 1;
            if late.is_valid(i) {
                f.late_rows += late.value(i);
            }
            if arrival.is_valid(i) {
                f.last_arrival = f.last_arrival.max(Some(arrival.value(i)));
            }
        }
    }
    Ok(())
}

/// The batches without the helper column, as gold stores them.
pub fn without_helpers(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, RunError> {
    batches
        .iter()
        .map(|b| without_helper(b).map_err(RunError::arrow(Phase::Read)))
        .collect()
}

/// One batch without the helper column.
pub fn without_helper(b: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    let keep: Vec<usize> = (0..b.num_columns())
        .filter(|i| !b.schema().field(*i).name().starts_with(HELPER))
        .collect();
    b.project(&keep)
}

/// The output schema of gold (without the helper column).
pub fn gold_schema(df: &DataFrame) -> SchemaRef {
    let s = df.schema().as_arrow();
    std::sync::Arc::new(arrow::datatypes::Schema::new(
        s.fields()
            .iter()
            .filter(|f| !f.name().starts_with(HELPER))
            .cloned()
            .collect::<Vec<_>>(),
    ))
}
