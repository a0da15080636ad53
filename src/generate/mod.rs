//! Synthetic bronze CDC data: a deterministic world of payments and their change records,
//! written to a Delta table either in full or one ingestion window at a time.
//!
//! This is a port of the world model of `gen_payments.py` (same schema, same behaviour,
//! not bit-identical random numbers):
//!
//! * Payments are created at a constant rate of `payments / days` per day, forever: day `k`
//!   creates `floor((k+1)N/D) - floor(kN/D)` payments with a diurnal profile, numbered in
//!   creation order (`pay_` + 12 digits), so ids grow over time. Each creation day has its own
//!   RNG stream (ChaCha8 seeded from `(seed, k)`), so any day can be regenerated on its own.
//! * Each payment has 1–4 state versions (`op = 'U'`): created only (8%), failed (7%),
//!   authorized only (10%), captured (68%), captured then refunded (7%, of which 30% are
//!   chargeback-like 14–75 days later); 0.1% get a trailing `op = 'D'` tombstone carrying
//!   the last state's values.
//! * `_ingested_at = updated_at + lag`, with a lag mixture (92% seconds, 7% hours, 0.9% days,
//!   0.1% weeks), and 0.5% of rows are delivered twice (at-least-once delivery).
//!
//! The generator parameters and the ingestion frontier live in the commit metadata under
//! [`META_KEY`], so an existing table can be extended by [`next_hours`] given only its path.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, StringBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use deltalake::kernel::transaction::CommitProperties;
use deltalake::protocol::SaveMode;
use deltalake::table::builder::parse_table_uri;
use deltalake::{ensure_table_uri, DeltaTable, DeltaTableBuilder, DeltaTableError};
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Exp1, StandardNormal};
use serde::{Deserialize, Serialize};

mod debezium;
mod landing;
pub mod merchants;
mod world;
pub use landing::{
    landing_from, landing_full, landing_has_state, landing_next, Feed, LandingReport,
};
use world::*;

const SEC: i64 = 1_000_000;
const MIN: i64 = 60 * SEC;
const HOUR: i64 = 60 * MIN;
const DAY: i64 = 24 * HOUR;

/// Longest possible distance, in days, between the creation and the ingestion of any row of a
/// payment: capture <= 7 d, refund <= 75 d after capture, delete <= 10 d after the last state,
/// lag <= 42 d, redelivery <= 1 d  ->  < 135 days. A window only needs these creation days.
const LOOKBACK_DAYS: i64 = 136;

/// Commit-metadata key holding the generator parameters and the frontier.
pub const META_KEY: &str = "gen";

/// Upper bound on the rows of one Arrow batch handed to the Delta writer.
const MAX_BATCH_ROWS: usize = 1_000_000;

const N_MERCHANTS: f64 = 20_000.0;
const CURRENCIES: [&str; 7] = ["USD", "EUR", "GBP", "CAD", "AUD", "JPY", "CHF"];
const CURRENCY_CUM: [f64; 7] = cumulative(&[0.55, 0.20, 0.10, 0.05, 0.04, 0.03, 0.03]);
/// Diurnal profile: UTC hour-of-day weights of payment creation.
const HOUR_CUM: [f64; 24] = cumulative(&[
    2.0, 1.5, 1.0, 1.0, 1.0, 1.5, 2.5, 4.0, 5.5, 6.5, 7.0, 7.5, 8.0, 8.0, 7.5, 7.0, 7.0, 7.0, 6.5,
    6.0, 5.0, 4.0, 3.0, 2.5,
]);
/// Outcome mix, in [`Outcome`] order.
const OUTCOME_CUM: [f64; 5] = cumulative(&[0.08, 0.07, 0.10, 0.68, 0.07]);

/// Normalised cumulative sums of `weights`, for inverse-CDF sampling of a categorical value.
const fn cumulative<const N: usize>(weights: &[f64; N]) -> [f64; N] {
    let mut total = 0.0;
    let mut i = 0;
    while i < N {
        total += weights[i];
        i += 1;
    }
    let mut out = [0.0; N];
    let mut acc = 0.0;
    i = 0;
    while i < N {
        acc += weights[i];
        out[i] = acc / total;
        i += 1;
    }
    out
}

/// What to generate and where.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Local path or `file://` URI of the bronze table.
    pub out: String,
    /// Payments created over `days`; creation continues at the same rate afterwards, so
    /// increments past the initial range keep getting new payments.
    pub payments: u64,
    /// Length of the initial range, in days.
    pub days: u32,
    /// Seed of the world: the same seed gives the same rows.
    pub seed: u64,
    /// UTC date of day 0.
    pub start: NaiveDate,
    /// Create a new table or extend an existing one.
    pub mode: GenerateMode,
}

/// How [`generate`] touches the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerateMode {
    /// Create a NEW table with every row ingested before `start + days`.
    Full,
    /// Append the next `h` hours of arrivals to an existing generator table. The world
    /// parameters are read from the table, so the other options are ignored.
    NextHours(u32),
}

/// What a generation run wrote, for the CLI to print (JSON) and for tests to check.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateReport {
    /// The table location as given.
    pub table: String,
    /// `"full"` or `"increment"`.
    pub mode: &'static str,
    /// Table version after the run.
    pub version: i64,
    /// Rows written by this run.
    pub rows: u64,
    /// Distinct payment ids among the rows written.
    pub distinct_payments: u64,
    /// Rows with `op = 'D'` among the rows written.
    pub deletes: u64,
    /// Start of the ingestion window (increment only).
    pub window_start: Option<DateTime<Utc>>,
    /// End (exclusive) of ingestion covered by the table after the run.
    pub frontier: DateTime<Utc>,
    /// Rows with `updated_at <= window_start - 15 min` (increment only, else 0): the rows a
    /// job filtering the source on `updated_at > max(target.updated_at) - 15 min` would miss.
    pub late_rows_behind_15m: u64,
}

/// Why a generation failed; every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// Full mode refuses to touch an existing table.
    #[error(
        "{path} already is a Delta table; remove it first, or use --next-hour to append to it"
    )]
    TableExists { path: String },
    /// Increment mode needs an existing table.
    #[error(
        "no Delta table at {path}; create one first with a full generation (without --next-hour)"
    )]
    NotATable { path: String },
    /// The table exists but was not written by this generator.
    #[error(
        "{path} has no generator metadata (no \"{META_KEY}\" entry in its commit history), so it \
         was not written by the generator (or its generation was interrupted); create a generator \
         table with a full generation (`tidemark demo`: remove that folder and run the demo again)"
    )]
    NoGeneratorMetadata { path: String },
    /// The `"gen"` commit metadata exists but cannot be used.
    #[error(
        "the generator metadata of {path} is unusable ({reason}); recreate the table with a full generation"
    )]
    BadMetadata { path: String, reason: String },
    /// Options out of range.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// The object store could not be reached or refused access (one line: which store, why,
    /// what to check).
    #[error(transparent)]
    Store(crate::lake::LakeError),
    /// Opening, reading or writing the table failed.
    #[error("Delta Lake error on {path}: {source}")]
    Delta {
        path: String,
        #[source]
        source: Box<DeltaTableError>,
    },
    /// Building the Arrow batches failed (a bug: the schema is fixed).
    #[error("could not build Arrow record batches: {0}")]
    Arrow(#[from] ArrowError),
    /// A failpoint armed for testing fired.
    #[error(transparent)]
    Injected(#[from] crate::failpoint::Injected),
}

impl crate::error::Classify for GenerateError {
    fn class(&self) -> crate::error::ErrorClass {
        use crate::error::ErrorClass;
        match self {
            GenerateError::TableExists { .. } | GenerateError::InvalidOptions(_) => {
                ErrorClass::Usage
            }
            GenerateError::NotATable { .. }
            | GenerateError::NoGeneratorMetadata { .. }
            | GenerateError::BadMetadata { .. } => ErrorClass::Unavailable,
            GenerateError::Store(e) => e.class(),
            GenerateError::Delta { source, .. } => crate::lake::classify_delta(source),
            GenerateError::Arrow(_) => ErrorClass::Internal,
            GenerateError::Injected(e) => e.class(),
        }
    }
}

/// Attach the table path to Delta errors.
trait AtPath<T> {
    fn at(self, path: &str) -> Result<T, GenerateError>;
}

impl<T> AtPath<T> for Result<T, DeltaTableError> {
    fn at(self, path: &str) -> Result<T, GenerateError> {
        self.map_err(|source| {
            if crate::lake::store_fault(&source).is_some() {
                GenerateError::Store(crate::lake::LakeError::delta("access", path, source))
            } else {
                GenerateError::Delta {
                    path: path.to_string(),
                    source: Box::new(source),
                }
            }
        })
    }
}

/// Generate according to `opts.mode`: a new table ([`GenerateMode::Full`]) or the next hours
/// of an existing one ([`GenerateMode::NextHours`], same as [`next_hours`]).
pub async fn generate(opts: &GenerateOptions) -> Result<GenerateReport, GenerateError> {
    crate::lake::check_scheme(&opts.out).map_err(|e| invalid(e.to_string()))?;
    match opts.mode {
        GenerateMode::Full => generate_full(opts).await,
        GenerateMode::NextHours(hours) => next_hours(&opts.out, hours).await,
    }
}

/// Append the rows ingested during the `hours` after the table's frontier, in one commit, and
/// advance the frontier. Parameters and frontier come from the table's commit metadata, so
/// repeated calls replay the same world hour after hour.
pub async fn next_hours(out: &str, hours: u32) -> Result<GenerateReport, GenerateError> {
    if hours == 0 {
        return Err(invalid("hours must be at least 1"));
    }
    let table = open_existing(out).await?;
    let previous = find_meta(&table, out).await?;
    let world = previous.world;
    let lo = previous.frontier_us;
    let hi = advance(lo, hours.into(), HOUR)?;
    let (window_start, frontier) = (to_utc(lo)?, to_utc(hi)?);

    let rows = gen_window(&world, Some(lo), hi);
    let meta = GenMeta::new(world, hi, Some(lo));
    let table = commit_rows(table, &rows, SaveMode::Append, Some(&meta), out).await?;
    let counts = Counts::of(&rows, Some(window_start));
    Ok(report(out, &table, counts, Some(window_start), frontier))
}

/// The world `opts` describe, checked, and the end (exclusive) of its initial range.
fn initial_world(opts: &GenerateOptions) -> Result<(World, i64), GenerateError> {
    let start_us = opts
        .start
        .and_time(NaiveTime::MIN)
        .and_utc()
        .timestamp_micros();
    let world = World {
        payments: opts.payments,
        days: opts.days,
        start_us,
        seed: opts.seed,
    };
    world.check().map_err(invalid)?;
    let hi = advance(start_us, opts.days.into(), DAY)?;
    Ok((world, hi))
}

async fn generate_full(opts: &GenerateOptions) -> Result<GenerateReport, GenerateError> {
    let (world, hi) = initial_world(opts)?;
    let frontier = to_utc(hi)?;
    let (table, restart) = new_table(&opts.out).await?;

    let meta = GenMeta::new(world, hi, None);
    let mut days = ingestion_days(&world, hi);
    let (table, counts) =
        write_by_ingestion_day(table, &mut days, &meta, &opts.out, restart).await?;
    let counts = Counts {
        distinct_payments: days.payments,
        ..counts
    };
    Ok(report(&opts.out, &table, counts, None, frontier))
}

fn invalid(msg: impl Into<String>) -> GenerateError {
    GenerateError::InvalidOptions(msg.into())
}

/// `base + n * unit`, or an error if it leaves the representable time range.
fn advance(base: i64, n: u64, unit: i64) -> Result<i64, GenerateError> {
    i64::try_from(n)
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .and_then(|d| base.checked_add(d))
        .ok_or_else(|| invalid("the time range reaches beyond the supported dates"))
}

/// Convert microseconds to a timestamp. Checking every window bound here keeps all row
/// arithmetic (at most ~136 days past a bound) far from i64 overflow.
fn to_utc(us: i64) -> Result<DateTime<Utc>, GenerateError> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| invalid("the time range reaches beyond the supported dates"))
}

// ---------------------------------------------------------------------------------------------
// World model
// ---------------------------------------------------------------------------------------------

/// Arrow schema of the bronze table (same names and types as the python generator).
pub fn bronze_schema() -> SchemaRef {
    let ts = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new("payment_id", DataType::Utf8, true),
        Field::new("customer_id", DataType::Utf8, true),
        Field::new("merchant_id", DataType::Utf8, true),
        Field::new("amount_cents", DataType::Int64, true),
        Field::new("currency", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("created_at", ts(), true),
        Field::new("updated_at", ts(), true),
        Field::new("_ingested_at", ts(), true),
        Field::new("op", DataType::Utf8, true),
    ]))
}

/// `prefix` + zero-padded number, e.g. `pay_000000000042` (written straight into the builder:
/// the builder's `fmt::Write` fills the next value, `append_value("")` closes it).
fn id_array(rows: &[Row], prefix: &str, width: usize, num: impl Fn(&Payment) -> u64) -> ArrayRef {
    use std::fmt::Write as _;
    let mut ids = StringBuilder::with_capacity(rows.len(), rows.len() * (prefix.len() + width));
    for r in rows {
        write!(ids, "{prefix}{:0width$}", num(&r.payment)).expect("writing to a StringBuilder");
        ids.append_value("");
    }
    Arc::new(ids.finish())
}

fn timestamp_array(rows: &[Row], ts: impl Fn(&Row) -> i64) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from_iter_values(rows.iter().map(ts)).with_timezone("UTC"))
}

fn text_array(rows: &[Row], text: impl Fn(&Row) -> &'static str) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(rows.iter().map(text)))
}

fn to_batch(rows: &[Row]) -> Result<RecordBatch, ArrowError> {
    let columns = vec![
        id_array(rows, "pay_", 12, |p| p.pnum),
        id_array(rows, "cus_", 9, |p| p.customer),
        id_array(rows, "mch_", 6, |p| p.merchant),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.payment.amount),
        )) as ArrayRef,
        text_array(rows, |r| CURRENCIES[usize::from(r.payment.currency)]),
        text_array(rows, |r| r.status.name()),
        timestamp_array(rows, |r| r.payment.created),
        timestamp_array(rows, |r| r.updated),
        timestamp_array(rows, |r| r.ingested),
        text_array(rows, |r| r.op.name()),
    ];
    RecordBatch::try_new(bronze_schema(), columns)
}

/// Batches of at most [`MAX_BATCH_ROWS`]; one empty batch for no rows, because the Delta
/// writer needs at least one batch to commit (and to learn the schema of a new table).
fn to_batches(rows: &[Row]) -> Result<Vec<RecordBatch>, ArrowError> {
    if rows.is_empty() {
        return Ok(vec![to_batch(rows)?]);
    }
    rows.chunks(MAX_BATCH_ROWS).map(to_batch).collect()
}

// ---------------------------------------------------------------------------------------------
// Delta
// ---------------------------------------------------------------------------------------------

/// The `"gen"` commit metadata (same keys as the python generator).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GenMeta {
    #[serde(flatten)]
    world: World,
    frontier_us: i64,
    mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_start_us: Option<i64>,
}

impl GenMeta {
    fn new(world: World, frontier_us: i64, window_start_us: Option<i64>) -> Self {
        let mode = if window_start_us.is_some() {
            "increment"
        } else {
            "full"
        };
        GenMeta {
            world,
            frontier_us,
            mode: mode.to_string(),
            window_start_us,
        }
    }

    fn commit_properties(&self) -> CommitProperties {
        let value = serde_json::to_value(self).expect("GenMeta serialises to a JSON object");
        CommitProperties::default().with_metadata([(META_KEY.to_string(), value)])
    }
}

/// The commit metadata key of a full generation's commits before its last (which carries
/// [`META_KEY`]): a table with only such commits is an interrupted generation.
const PARTIAL_KEY: &str = "gen_partial";

/// A handle for a table that must not exist yet — or that an interrupted full generation left
/// (every commit marked [`PARTIAL_KEY`], none finished): `true` then, and the generation
/// replaces it.
async fn new_table(out: &str) -> Result<(DeltaTable, bool), GenerateError> {
    let url = ensure_table_uri(out).at(out)?;
    let mut table = DeltaTableBuilder::from_url(url).at(out)?.build().at(out)?;
    if !table.verify_deltatable_existence().await.at(out)? {
        return Ok((table, false));
    }
    table.load().await.at(out)?;
    let mut history = table.history(None);
    let mut interrupted = true;
    while let Some(commit) = history.next().await {
        if !commit.at(out)?.info.contains_key(PARTIAL_KEY) {
            interrupted = false;
            break;
        }
    }
    drop(history);
    if !interrupted {
        return Err(GenerateError::TableExists {
            path: out.to_string(),
        });
    }
    tracing::warn!("{out} holds an interrupted generation: it is replaced");
    Ok((table, true))
}

/// A loaded handle of an existing table (without creating directories on the way).
async fn open_existing(out: &str) -> Result<DeltaTable, GenerateError> {
    let not_a_table = || GenerateError::NotATable {
        path: out.to_string(),
    };
    let url = parse_table_uri(out).map_err(|_| not_a_table())?;
    let mut table = DeltaTableBuilder::from_url(url).at(out)?.build().at(out)?;
    if !table.verify_deltatable_existence().await.at(out)? {
        return Err(not_a_table());
    }
    table.load().await.at(out)?;
    Ok(table)
}

/// The newest `"gen"` commit metadata in the table history.
async fn find_meta(table: &DeltaTable, out: &str) -> Result<GenMeta, GenerateError> {
    let mut history = table.history(None);
    while let Some(commit) = history.next().await {
        let Some(value) = commit.at(out)?.info.remove(META_KEY) else {
            continue;
        };
        let bad = |reason: String| GenerateError::BadMetadata {
            path: out.to_string(),
            reason,
        };
        let meta: GenMeta = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        meta.world.check().map_err(|e| bad(e.to_string()))?;
        to_utc(meta.frontier_us).map_err(|e| bad(e.to_string()))?;
        return Ok(meta);
    }
    Err(GenerateError::NoGeneratorMetadata {
        path: out.to_string(),
    })
}

/// One commit of `rows`, with the generator metadata if given.
async fn commit_rows(
    table: DeltaTable,
    rows: &[Row],
    mode: SaveMode,
    meta: Option<&GenMeta>,
    out: &str,
) -> Result<DeltaTable, GenerateError> {
    let props = match meta {
        Some(meta) => meta.commit_properties(),
        // (a full generation's commit before its last: see `new_table`)
        None => CommitProperties::default().with_metadata([(PARTIAL_KEY.to_string(), true.into())]),
    };
    table
        .write(to_batches(rows)?)
        .with_save_mode(mode)
        .with_commit_properties(props)
        .await
        .at(out)
}

/// Create the table with one append commit per ingestion day of `days` (like a bronze table
/// appended to daily); the first commit creates the table, the last one carries the metadata
/// (no rows at all: one empty commit). Returns the table and what was written.
async fn write_by_ingestion_day(
    mut table: DeltaTable,
    days: impl Iterator<Item = Vec<Row>>,
    meta: &GenMeta,
    out: &str,
    restart: bool,
) -> Result<(DeltaTable, Counts), GenerateError> {
    let mut counts = Counts::default();
    let mut held: Option<Vec<Row>> = None;
    let mut first = true;
    let mode = |first: bool| match (first, restart) {
        (true, false) => SaveMode::ErrorIfExists,
        (true, true) => SaveMode::Overwrite,
        (false, _) => SaveMode::Append,
    };
    for day in days {
        counts.rows += day.len() as u64;
        counts.deletes += day.iter().filter(|r| r.op == Op::Delete).count() as u64;
        if let Some(previous) = held.replace(day) {
            table = commit_rows(table, &previous, mode(first), None, out).await?;
            first = false;
            crate::failpoint::hit_async("generate.between_commits").await?;
        }
    }
    let last = held.unwrap_or_default();
    table = commit_rows(table, &last, mode(first), Some(meta), out).await?;
    Ok((table, counts))
}

/// What a generation wrote, for its report.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    rows: u64,
    distinct_payments: u64,
    deletes: u64,
    late_rows_behind_15m: u64,
}

impl Counts {
    /// The counts of `rows`; rows updated 15 minutes or more before `window_start` are late.
    fn of(rows: &[Row], window_start: Option<DateTime<Utc>>) -> Self {
        let mut pnums: Vec<u64> = rows.iter().map(|r| r.payment.pnum).collect();
        pnums.sort_unstable();
        pnums.dedup();
        let late_before = window_start.map(|lo| lo.timestamp_micros() - 15 * MIN);
        let count = |pred: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| pred(r)).count() as u64;
        Counts {
            rows: rows.len() as u64,
            distinct_payments: pnums.len() as u64,
            deletes: count(&|r| r.op == Op::Delete),
            late_rows_behind_15m: late_before.map_or(0, |t| count(&|r| r.updated <= t)),
        }
    }
}

fn report(
    out: &str,
    table: &DeltaTable,
    counts: Counts,
    window_start: Option<DateTime<Utc>>,
    frontier: DateTime<Utc>,
) -> GenerateReport {
    GenerateReport {
        table: out.to_string(),
        mode: if window_start.is_some() {
            "increment"
        } else {
            "full"
        },
        version: table
            .version()
            .and_then(|v| i64::try_from(v).ok())
            .expect("a table that was just written has a version"),
        rows: counts.rows,
        distinct_payments: counts.distinct_payments,
        deletes: counts.deletes,
        window_start,
        frontier,
        late_rows_behind_15m: counts.late_rows_behind_15m,
    }
}

#[cfg(test)]
mod tests;
