//! `tidemark reconcile` for `kind: aggregate`: are the published numbers right?
//!
//! Every day and group is recomputed from the source as a full reload computes it (at the
//! source version gold's last run read, so rows that landed since are not "missing") and
//! compared, measure by measure, with what is published: for an **open** day, gold's row; for a
//! **final** day, gold's row plus the adjustments booked for it (`after_close: adjust`; none with
//! `restate`) — *published closed day + its adjustments == a fresh recompute of that day*. With
//! `window:` and `watermark:`, a window can be final (and adjusted) while its day is open: gold
//! plus the adjustments is compared on every day.
//! Counts, integer and decimal sums compare exactly; float sums within a relative 1e-9 (the
//! same rows summed in another order), NaN equal to NaN; min and max exactly.

use std::collections::BTreeMap;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Date32Type};
use chrono::NaiveDate;
use datafusion::functions_aggregate::expr_fn::{max, sum};
use datafusion::logical_expr::{cast, lit, Expr, ExprSchemable};
use datafusion::prelude::{coalesce, ident, DataFrame};
use serde::Serialize;

use super::differs::differs_here;
use super::ReconcileError;
use crate::aggregate::status::{self, DayStatus};
use crate::config::pipeline::aggregate::{Measure, EVENT_DATE};
use crate::config::pipeline::{Aggregate, Pipeline};
use crate::lake;
use crate::run::render::{render_key, render_value};
use crate::run::{Engine, Phase, RunError};

/// One measure of one day and group that is not what the source says.
#[derive(Debug, Clone, Serialize)]
pub struct MeasureDiff {
    pub event_date: NaiveDate,
    /// `open` or `final`.
    pub status: &'static str,
    /// The group's columns, `merchant_id="m1", currency="EUR"`.
    pub group: String,
    pub measure: String,
    /// Gold's value (null: gold has no row for the group).
    pub published: Option<String>,
    /// The adjustments booked for it (final days; null when none).
    pub adjustments: Option<String>,
    /// The recompute's value (null: the source has no row for the group now).
    pub recompute: Option<String>,
}

/// What `reconcile` found for an aggregate.
#[derive(Debug, Clone, Serialize)]
pub struct AggregateReport {
    pub pipeline: String,
    pub kind: &'static str,
    pub target_uri: String,
    pub target_version: Option<u64>,
    pub adjustments_uri: String,
    pub adjustments_version: Option<u64>,
    pub source_uri: String,
    pub source_version: Option<u64>,
    /// Which source version was recomputed, and why.
    pub basis: String,
    pub days_open: u64,
    pub days_final: u64,
    /// Day-and-group rows compared (the union of both sides).
    pub groups_compared: u64,
    /// Day-and-group rows with a measure that differs.
    pub groups_differing: u64,
    /// The first `--limit` of them, measure by measure.
    pub differences: Vec<MeasureDiff>,
    pub notes: Vec<String>,
    pub identical: bool,
}

/// Column names of a measure's three sides in the comparison.
struct Sides {
    measure: Measure,
    data_type: DataType,
    recompute: String,
    published: String,
    adjusted: String,
}

/// Compares gold (and its adjustments) of the aggregate pipeline `p` with a recompute.
pub async fn reconcile(
    p: &Pipeline,
    spec: &Aggregate,
    limit: usize,
    var_args: &str,
    engine: &Engine,
) -> Result<AggregateReport, ReconcileError> {
    let ctx = engine.context();
    let Some(gold) = lake::open_if_exists(&spec.target_uri)
        .await
        .map_err(RunError::from)?
    else {
        return Err(ReconcileError::NoTarget {
            target: spec.target_uri.clone(),
            pipeline: format!("{}{var_args}", p.path.display()),
        });
    };
    let status_table = lake::open_if_exists(&spec.status_uri)
        .await
        .map_err(RunError::from)?;
    let adjustments = lake::open_if_exists(&spec.adjustments_uri)
        .await
        .map_err(RunError::from)?;
    let days = status::read(&ctx, status_table.as_ref(), &spec.status_uri).await?;
    let tables = [Some(&gold), status_table.as_ref(), adjustments.as_ref()];
    let present: Vec<&deltalake::DeltaTable> = tables.iter().flatten().copied().collect();
    let newest = crate::aggregate::newest_logical_date(p, &present)
        .await
        .or_else(|| days.keys().next_back().copied());
    let published = Published {
        ctx: &ctx,
        p,
        spec,
        gold: &gold,
        adjustments: adjustments.as_ref(),
        days: &days,
        newest,
    };
    // The source as it is now, then — when that differs — as the pipeline's last run read it
    // (rows that landed since are the next run's work, not differences).
    let mut notes = Vec::new();
    let latest = lake::open_required(&spec.source_uri, "source")
        .await
        .map_err(RunError::from)?;
    let mut basis = format!("version {}, its latest", latest.version().unwrap_or(0));
    let mut found = published.check(&latest, limit).await?;
    let mut source_version = latest.version();
    if found.differing > 0 {
        if let Some((older, why)) = source_at_last_run(spec, &tables, &latest, &mut notes).await? {
            found = published.check(&older, limit).await?;
            basis = why;
            source_version = older.version();
        }
    }
    if !spec.lookups.is_empty() {
        notes.push("lookups read each dimension as it is now: a dimension changed since gold's last run shows here as differences until the next run restates the days it touches".into());
    }
    notes.extend(found.notes);
    Ok(AggregateReport {
        pipeline: p.name.clone(),
        kind: "aggregate",
        target_uri: spec.target_uri.clone(),
        target_version: gold.version(),
        adjustments_uri: spec.adjustments_uri.clone(),
        adjustments_version: adjustments.as_ref().and_then(|a| a.version()),
        source_uri: spec.source_uri.clone(),
        source_version,
        basis,
        days_open: days.values().filter(|d| !d.is_final()).count() as u64,
        days_final: days.values().filter(|d| d.is_final()).count() as u64,
        groups_compared: found.compared,
        groups_differing: found.differing,
        differences: found.differences,
        notes,
        identical: found.differing == 0,
    })
}

/// What is published, to check against a recompute.
struct Published<'a> {
    ctx: &'a datafusion::prelude::SessionContext,
    p: &'a Pipeline,
    spec: &'a Aggregate,
    gold: &'a deltalake::DeltaTable,
    adjustments: Option<&'a deltalake::DeltaTable>,
    days: &'a BTreeMap<NaiveDate, DayStatus>,
    /// The newest logical date of the pipeline's runs: later days are not published yet.
    newest: Option<NaiveDate>,
}

/// What one comparison found.
struct Found {
    compared: u64,
    differing: u64,
    differences: Vec<MeasureDiff>,
    notes: Vec<String>,
}

impl Published<'_> {
    /// Gold (and its adjustments) against a recompute of `source`.
    async fn check(
        &self,
        source: &deltalake::DeltaTable,
        limit: usize,
    ) -> Result<Found, ReconcileError> {
        let (ctx, spec) = (self.ctx, self.spec);
        let mut notes = Vec::new();
        let closed = status::closes(self.days, spec.time_zone);
        let fresh = crate::aggregate::recompute(ctx, self.p, spec, source, &closed).await?;
        let fresh = published_days(fresh, self.newest, &mut notes).await?;
        let sides = sides(spec, &fresh)?;
        let keys = key_columns(spec);
        let fresh = shaped(fresh, &keys, &sides, Side::Recompute)?;
        let gold_df = crate::run::frame(ctx, self.gold, &spec.target_uri, Phase::Reconcile).await?;
        let mut all = fresh
            .union(shaped(gold_df, &keys, &sides, Side::Published)?)
            .map_err(q)?;
        if let Some(a) = self.adjustments {
            let df = crate::run::frame(ctx, a, &spec.adjustments_uri, Phase::Reconcile).await?;
            let summed = summed_adjustments(df, &keys, &sides)?;
            all = all
                .union(shaped(summed, &keys, &sides, Side::Adjusted)?)
                .map_err(q)?;
        }
        // (gold may hold days after the newest logical date, from a bootstrap: left out alike)
        if let Some(n) = self.newest {
            let up_to = ident(EVENT_DATE).lt_eq(crate::aggregate::days::date_lit(n));
            all = all.filter(up_to).map_err(q)?;
        }
        let finals: Vec<NaiveDate> = self
            .days
            .values()
            .filter(|d| d.is_final())
            .map(|d| d.event_date)
            .collect();
        // (windows final by the watermark get adjustments while their day is still open)
        let all_adjusted = spec.window.is_some() && spec.watermark.is_some();
        let (compared, differing, rows) =
            compare(all, &keys, &sides, &finals, all_adjusted).await?;
        let differences = diffs(&rows, spec, &sides, self.days, limit)?;
        Ok(Found {
            compared,
            differing,
            differences,
            notes,
        })
    }
}

fn q(e: datafusion::error::DataFusionError) -> RunError {
    RunError::query(Phase::Reconcile)(e)
}

/// The source at the version the pipeline's last run read — the newest `source_version` in
/// the run facts of the last commit of gold, its status and its adjustments table — when it is
/// not `latest`'s and can be loaded (else a note says why not), and the basis in words.
async fn source_at_last_run(
    spec: &Aggregate,
    tables: &[Option<&deltalake::DeltaTable>],
    latest: &deltalake::DeltaTable,
    notes: &mut Vec<String>,
) -> Result<Option<(deltalake::DeltaTable, String)>, ReconcileError> {
    let now = latest.version().unwrap_or(0);
    let mut read: Option<u64> = None;
    for t in tables.iter().flatten() {
        let last = lake::read_commits(t, 1).await.unwrap_or_default();
        let v = last
            .first()
            .and_then(|c| c.run.as_ref())
            .and_then(|r| r.get("source_version"))
            .and_then(serde_json::Value::as_u64);
        read = read.max(v);
    }
    let Some(v) = read.filter(|v| *v != now) else {
        return Ok(None);
    };
    let mut source = lake::open_required(&spec.source_uri, "source")
        .await
        .map_err(RunError::from)?;
    match source.load_version(v).await {
        Ok(()) => Ok(Some((
            source,
            format!("version {v}, the one the last commit's run read (the latest, {now}, differs: rows landed since are for the next run)"),
        ))),
        Err(e) => {
            notes.push(format!("the source version the last commit's run read ({v}) cannot be loaded ({e}): compared with the latest ({now}) only, so rows landed since that run show as differences until the next run"));
            Ok(None)
        }
    }
}

/// The recompute's days up to the newest logical date of the pipeline's runs (else the newest
/// day the status table holds): a day after it may have rows no run has restated yet (its
/// logical date has not come), which is not a difference.
async fn published_days(
    fresh: DataFrame,
    newest: Option<NaiveDate>,
    notes: &mut Vec<String>,
) -> Result<DataFrame, RunError> {
    let Some(newest) = newest.as_ref() else {
        return Ok(fresh);
    };
    let fresh = fresh.cache().await.map_err(q)?;
    let after = ident(EVENT_DATE).gt(crate::aggregate::days::date_lit(*newest));
    let later = fresh
        .clone()
        .filter(after.clone())
        .map_err(q)?
        .count()
        .await
        .map_err(q)?;
    if later > 0 {
        notes.push(format!("{later} day-and-group row(s) of days after {newest}, the newest logical date of the pipeline's runs, are left out: no run has restated them yet (a run with a later logical date will)"));
    }
    fresh
        .filter(datafusion::logical_expr::not(after))
        .map_err(q)
}

/// `event_date` and the groups: what identifies a published row.
fn key_columns(spec: &Aggregate) -> Vec<String> {
    let mut keys = vec![EVENT_DATE.to_string()];
    keys.extend(spec.group_keys());
    keys
}

/// Each measure's three columns, typed as the recompute types it.
fn sides(spec: &Aggregate, fresh: &DataFrame) -> Result<Vec<Sides>, RunError> {
    spec.measures
        .iter()
        .map(|m| {
            let data_type = fresh
                .schema()
                .field_with_unqualified_name(&m.name)
                .map(|f| f.data_type().clone())
                .map_err(q)?;
            Ok(Sides {
                measure: m.clone(),
                data_type,
                recompute: format!("__r_{}", m.name),
                published: format!("__p_{}", m.name),
                adjusted: format!("__a_{}", m.name),
            })
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Recompute,
    Published,
    Adjusted,
}

/// One side in the comparison's shape: the keys, then each measure's three columns, its own
/// filled and the others null.
fn shaped(
    df: DataFrame,
    keys: &[String],
    sides: &[Sides],
    side: Side,
) -> Result<DataFrame, RunError> {
    let mut cols: Vec<Expr> = keys.iter().map(ident).collect();
    for s in sides {
        let null = || {
            cast(
                lit(datafusion::scalar::ScalarValue::Null),
                s.data_type.clone(),
            )
        };
        let value = cast(ident(&s.measure.name), s.data_type.clone());
        let pick = |mine: Side| if side == mine { value.clone() } else { null() };
        cols.push(pick(Side::Recompute).alias(&s.recompute));
        cols.push(pick(Side::Published).alias(&s.published));
        cols.push(pick(Side::Adjusted).alias(&s.adjusted));
    }
    df.select(cols).map_err(q)
}

/// The adjustments booked per day and group, summed.
fn summed_adjustments(
    df: DataFrame,
    keys: &[String],
    sides: &[Sides],
) -> Result<DataFrame, RunError> {
    let aggs: Vec<Expr> = sides
        .iter()
        .filter(|s| s.measure.agg.additive())
        .map(|s| sum(ident(&s.measure.name)).alias(&s.measure.name))
        .collect();
    let mut df = df
        .aggregate(keys.iter().map(ident).collect(), aggs)
        .map_err(q)?;
    // (a measure that cannot be adjusted has no column there: nothing booked for it)
    for s in sides.iter().filter(|s| !s.measure.agg.additive()) {
        let null = cast(
            lit(datafusion::scalar::ScalarValue::Null),
            s.data_type.clone(),
        );
        df = df.with_column(&s.measure.name, null).map_err(q)?;
    }
    Ok(df)
}

/// Per day and group, the three sides side by side; how many there are, how many differ, and
/// the differing ones in day and group order.
async fn compare(
    all: DataFrame,
    keys: &[String],
    sides: &[Sides],
    finals: &[NaiveDate],
    all_adjusted: bool,
) -> Result<(u64, u64, Vec<RecordBatch>), RunError> {
    let mut aggs: Vec<Expr> = Vec::new();
    for s in sides {
        for c in [&s.recompute, &s.published, &s.adjusted] {
            aggs.push(max(ident(c)).alias(c));
        }
    }
    let totals = all
        .aggregate(keys.iter().map(ident).collect(), aggs)
        .map_err(q)?
        .cache()
        .await
        .map_err(q)?;
    let is_final = match finals.is_empty() {
        _ if all_adjusted => lit(true),
        true => lit(false),
        false => ident(EVENT_DATE).in_list(
            finals
                .iter()
                .map(|d| crate::aggregate::days::date_lit(*d))
                .collect(),
            false,
        ),
    };
    let differs = sides
        .iter()
        .map(|s| s.differs(is_final.clone(), totals.schema()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .reduce(Expr::or)
        .unwrap_or_else(|| lit(false));
    let compared = totals.clone().count().await.map_err(q)? as u64;
    let differing = totals.filter(differs).map_err(q)?;
    let count = differing.clone().count().await.map_err(q)? as u64;
    let order = keys.iter().map(|k| ident(k).sort(true, true)).collect();
    let rows = differing
        .sort(order)
        .map_err(q)?
        .collect()
        .await
        .map_err(q)?;
    Ok((compared, count, rows))
}

impl Sides {
    /// What is published for the day and group: gold's value, plus the adjustments on a final
    /// day; an additive measure counts a missing side as 0.
    fn published_expr(&self, is_final: Expr) -> Expr {
        let zero = || cast(lit(0i64), self.data_type.clone());
        if !self.measure.agg.additive() {
            return ident(&self.published);
        }
        let gold = coalesce(vec![ident(&self.published), zero()]);
        let adjusted = gold.clone() + coalesce(vec![ident(&self.adjusted), zero()]);
        datafusion::logical_expr::when(is_final, adjusted)
            .otherwise(gold)
            .unwrap_or_else(|_| ident(&self.published))
    }

    fn expected_expr(&self) -> Expr {
        match self.measure.agg.additive() {
            true => coalesce(vec![
                ident(&self.recompute),
                cast(lit(0i64), self.data_type.clone()),
            ]),
            false => ident(&self.recompute),
        }
    }

    /// The published value is not the recompute's (floats: NaN equals NaN, and a relative
    /// difference up to 1e-9 is the order of a sum, not a wrong number).
    fn differs(
        &self,
        is_final: Expr,
        schema: &datafusion::common::DFSchema,
    ) -> Result<Expr, RunError> {
        let (p, e) = (self.published_expr(is_final), self.expected_expr());
        let distinct = |a: Expr, b: Expr| {
            datafusion::logical_expr::binary_expr(
                a,
                datafusion::logical_expr::Operator::IsDistinctFrom,
                b,
            )
        };
        let ty = p.get_type(schema).map_err(q)?;
        if !ty.is_floating() {
            return Ok(distinct(p, e));
        }
        use datafusion::functions::math::expr_fn::{abs, isnan};
        let f64 = |x: Expr| cast(x, DataType::Float64);
        let (pf, ef) = (f64(p.clone()), f64(e.clone()));
        let tolerance = lit(1e-9f64) * coalesce(vec![abs(ef.clone()), lit(0f64)]);
        let tolerance =
            datafusion::functions::core::expr_fn::greatest(vec![tolerance, lit(1e-9f64)]);
        let nulls_differ = distinct(p.clone().is_null(), e.clone().is_null());
        let nans_differ = distinct(isnan(pf.clone()), isnan(ef.clone()));
        let apart = abs(pf - ef).gt(tolerance);
        Ok(nulls_differ.or(coalesce(vec![nans_differ.or(apart), lit(false)])))
    }
}

/// The differing rows as measure-by-measure differences (the first `limit` rows).
fn diffs(
    rows: &[RecordBatch],
    spec: &Aggregate,
    sides: &[Sides],
    days: &BTreeMap<NaiveDate, DayStatus>,
    limit: usize,
) -> Result<Vec<MeasureDiff>, RunError> {
    let arrow_err = |e| RunError::arrow(Phase::Reconcile)(e);
    let mut out = Vec::new();
    let mut listed = 0;
    for b in rows {
        let day = arrow::compute::cast(
            b.column_by_name(EVENT_DATE).ok_or_else(|| {
                arrow_err(arrow::error::ArrowError::SchemaError(
                    "no event_date".into(),
                ))
            })?,
            &DataType::Date32,
        )
        .map_err(arrow_err)?;
        let day = day.as_primitive::<Date32Type>();
        for i in 0..b.num_rows() {
            if listed >= limit {
                return Ok(out);
            }
            listed += 1;
            let Some(d) = day.value_as_date(i) else {
                continue;
            };
            let is_final = days.get(&d).is_some_and(|s| s.is_final());
            let adjusted = is_final || (spec.window.is_some() && spec.watermark.is_some());
            let group = render_key(b, &spec.group_keys(), i);
            for s in sides {
                let value = |c: &str| {
                    b.column_by_name(c)
                        .and_then(|col| render_value(col.as_ref(), i).ok().flatten())
                };
                let (r, p, a) = (value(&s.recompute), value(&s.published), value(&s.adjusted));
                if !differs_here(
                    s.measure.agg.additive(),
                    &s.data_type,
                    adjusted,
                    [&r, &p, &a],
                ) {
                    continue;
                }
                out.push(MeasureDiff {
                    event_date: d,
                    status: if is_final { "final" } else { "open" },
                    group: group.clone(),
                    measure: s.measure.name.clone(),
                    published: p,
                    adjustments: a.filter(|_| adjusted),
                    recompute: r,
                });
            }
        }
    }
    Ok(out)
}

impl AggregateReport {
    /// `Ok(rendered)` when every published number is right, else the error carrying the
    /// rendered report (`pipeline`: the file with the user's `--var`s, for the advice).
    pub fn into_result(self, rendered: String, pipeline: &str) -> Result<String, ReconcileError> {
        if self.identical {
            return Ok(rendered);
        }
        Err(ReconcileError::Mismatch(Box::new(super::Mismatch {
            summary: format!(
                "gold {} is not what its source says: {} day-and-group row(s) differ from a recompute",
                self.target_uri, self.groups_differing
            ),
            advice: format!("Rebuild it with `tidemark run {pipeline} --full-reload` (every day restated from the source and the adjustments cleared), or find the last good version with `tidemark history {pipeline}` and `tidemark restore` (docs/operations/runbook.md)"),
            stdout: rendered,
        })))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "reconcile {} (aggregate): gold {} (version {}) and its adjustments against a recompute of {} at {}\n",
            self.pipeline,
            self.target_uri,
            self.target_version.map_or("-".into(), |v| v.to_string()),
            self.source_uri,
            self.basis
        );
        out.push_str(&format!(
            "days: {} final (published + adjustments), {} open (published); {} day-and-group rows compared\n",
            self.days_final, self.days_open, self.groups_compared
        ));
        if self.identical {
            out.push_str("identical: every published number is what the source says\n");
        } else {
            out.push_str(&format!(
                "{} day-and-group row(s) differ; the first, measure by measure:\n",
                self.groups_differing
            ));
            let mut t = comfy_table::Table::new();
            t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY)
                .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
                .set_width(100);
            t.set_header(vec![
                "event_date",
                "status",
                "group",
                "measure",
                "published",
                "adjustments",
                "recompute",
            ]);
            for d in &self.differences {
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
                t.add_row(vec![
                    d.event_date.to_string(),
                    d.status.to_string(),
                    d.group.clone(),
                    d.measure.clone(),
                    show(&d.published),
                    show(&d.adjustments),
                    show(&d.recompute),
                ]);
            }
            out.push_str(&format!("{t}\n"));
        }
        let nan = self
            .differences
            .iter()
            .any(|d| d.status == "final" && d.published.as_deref() == Some("NaN"));
        if nan {
            out.push_str("note: a NaN published for a final day cannot be adjusted (NaN plus anything is NaN): only `--full-reload` puts that day right\n");
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }
}
