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
         was not written by the generator; create a generator table with a full generation"
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
            GenerateError::Delta { source, .. } => crate::error::classify_delta(source),
            GenerateError::Arrow(_) => ErrorClass::Internal,
        }
    }
}

/// Attach the table path to Delta errors.
trait AtPath<T> {
    fn at(self, path: &str) -> Result<T, GenerateError>;
}

impl<T> AtPath<T> for Result<T, DeltaTableError> {
    fn at(self, path: &str) -> Result<T, GenerateError> {
        self.map_err(|source| GenerateError::Delta {
            path: path.to_string(),
            source: Box::new(source),
        })
    }
}

/// Generate according to `opts.mode`: a new table ([`GenerateMode::Full`]) or the next hours
/// of an existing one ([`GenerateMode::NextHours`], same as [`next_hours`]).
pub async fn generate(opts: &GenerateOptions) -> Result<GenerateReport, GenerateError> {
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
    Ok(report(out, &table, &rows, Some(window_start), frontier))
}

async fn generate_full(opts: &GenerateOptions) -> Result<GenerateReport, GenerateError> {
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
    let frontier = to_utc(hi)?;
    let table = new_table(&opts.out).await?;

    let rows = gen_window(&world, None, hi);
    let meta = GenMeta::new(world, hi, None);
    let table = write_by_ingestion_day(table, &rows, &world, &meta, &opts.out).await?;
    Ok(report(&opts.out, &table, &rows, None, frontier))
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

/// The parameters that fully determine the generated world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct World {
    payments: u64,
    days: u32,
    start_us: i64,
    seed: u64,
}

impl World {
    fn check(&self) -> Result<(), &'static str> {
        if self.payments == 0 {
            return Err("payments must be at least 1");
        }
        if self.days == 0 {
            return Err("days must be at least 1");
        }
        Ok(())
    }

    fn n_customers(&self) -> u64 {
        (self.payments / 8).max(1000)
    }

    /// Number of payments created before day `k`.
    fn day_offset(&self, k: u64) -> u64 {
        let n = u128::from(k) * u128::from(self.payments) / u128::from(self.days);
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    fn day_count(&self, k: u64) -> u64 {
        self.day_offset(k + 1) - self.day_offset(k)
    }

    fn day_start(&self, k: u64) -> i64 {
        self.start_us + k as i64 * DAY
    }

    /// Ingestion day of a row, relative to day 0.
    fn ingestion_day(&self, row: &Row) -> i64 {
        (row.ingested - self.start_us).div_euclid(DAY)
    }
}

/// The independent RNG stream of creation day `k`.
fn day_rng(seed: u64, k: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(k);
    rng
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Created,
    Authorized,
    Captured,
    Refunded,
    Failed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Authorized => "authorized",
            Status::Captured => "captured",
            Status::Refunded => "refunded",
            Status::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Upsert,
    Delete,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Upsert => "U",
            Op::Delete => "D",
        }
    }
}

/// Final state a payment reaches, in [`OUTCOME_CUM`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Abandoned,
    Failed,
    AuthorizedOnly,
    Captured,
    Refunded,
}

impl Outcome {
    fn draw(rng: &mut ChaCha8Rng) -> Self {
        match pick(rng, &OUTCOME_CUM) {
            0 => Outcome::Abandoned,
            1 => Outcome::Failed,
            2 => Outcome::AuthorizedOnly,
            3 => Outcome::Captured,
            _ => Outcome::Refunded,
        }
    }
}

/// The immutable attributes of a payment, repeated on each of its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Payment {
    pnum: u64,
    customer: u64,
    merchant: u64,
    amount: i64,
    currency: u8,
    created: i64,
}

/// One state version of a payment, before delivery.
#[derive(Debug, Clone, Copy)]
struct Version {
    status: Status,
    op: Op,
    updated: i64,
}

/// One delivered change record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    payment: Payment,
    status: Status,
    op: Op,
    updated: i64,
    ingested: i64,
}

impl Row {
    /// Ingestion order, ties broken like the python (`lexsort` on op, updated, pnum,
    /// ingested) and then by status so the order is total.
    fn sort_key(&self) -> (i64, u64, i64, Op, Status) {
        (
            self.ingested,
            self.payment.pnum,
            self.updated,
            self.op,
            self.status,
        )
    }
}

fn uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    mean * rng.sample::<f64, _>(Exp1)
}

fn lognormal(rng: &mut ChaCha8Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * rng.sample::<f64, _>(StandardNormal)).exp()
}

/// Inverse-CDF draw of a categorical index from normalised cumulative weights.
fn pick(rng: &mut ChaCha8Rng, cum: &[f64]) -> usize {
    let u = rng.random::<f64>();
    cum.iter()
        .position(|&c| u < c)
        .unwrap_or(cum.len().saturating_sub(1))
}

/// Every row (all versions, all redeliveries) of the payments created on day `k`, unsorted.
fn gen_day(world: &World, k: u64) -> Vec<Row> {
    let mut rng = day_rng(world.seed, k);
    let n = world.day_count(k) as usize;
    let day0 = world.day_start(k);
    let mut created: Vec<i64> = (0..n)
        .map(|_| {
            let hour = pick(&mut rng, &HOUR_CUM) as i64;
            day0 + hour * HOUR + (rng.random::<f64>() * HOUR as f64) as i64
        })
        .collect();
    created.sort_unstable();

    let first_pnum = world.day_offset(k);
    let mut rows = Vec::with_capacity(n * 4);
    let mut versions = Vec::with_capacity(5);
    for (i, &t) in created.iter().enumerate() {
        let payment = draw_payment(&mut rng, world, first_pnum + i as u64, t);
        draw_versions(&mut rng, t, &mut versions);
        for v in &versions {
            deliver(&mut rng, payment, v, &mut rows);
        }
    }
    rows
}

fn draw_payment(rng: &mut ChaCha8Rng, world: &World, pnum: u64, created: i64) -> Payment {
    let customer = (world.n_customers() as f64 * rng.random::<f64>().powi(3)) as u64;
    let merchant = (N_MERCHANTS * rng.random::<f64>().powi(4)) as u64;
    let amount = lognormal(rng, 2500.0, 1.1)
        .round()
        .clamp(50.0, 10_000_000.0) as i64;
    let currency = pick(rng, &CURRENCY_CUM) as u8;
    Payment {
        pnum,
        customer,
        merchant,
        amount,
        currency,
        created,
    }
}

/// The state versions of a payment created at `created` (into `out`, which is cleared first):
/// its lifecycle up to the drawn outcome, plus the rare trailing tombstone.
fn draw_versions(rng: &mut ChaCha8Rng, created: i64, out: &mut Vec<Version>) {
    let upsert = |status, updated| Version {
        status,
        op: Op::Upsert,
        updated,
    };
    out.clear();
    out.push(upsert(Status::Created, created));
    let outcome = Outcome::draw(rng);
    if outcome == Outcome::Failed {
        let t_fail = created + SEC + exponential(rng, MIN as f64) as i64;
        out.push(upsert(Status::Failed, t_fail));
    }
    if matches!(
        outcome,
        Outcome::AuthorizedOnly | Outcome::Captured | Outcome::Refunded
    ) {
        let t_auth = created + 200_000 + exponential(rng, 3.0 * SEC as f64) as i64;
        out.push(upsert(Status::Authorized, t_auth));
        if outcome != Outcome::AuthorizedOnly {
            let capture_delay = lognormal(rng, 30.0 * MIN as f64, 1.5).min(7.0 * DAY as f64);
            let t_capt = t_auth + capture_delay as i64;
            out.push(upsert(Status::Captured, t_capt));
            if outcome == Outcome::Refunded {
                let t_ref = t_capt + SEC + refund_delay(rng);
                out.push(upsert(Status::Refunded, t_ref));
            }
        }
    }
    if rng.random::<f64>() < 0.001 {
        let last = *out.last().expect("every payment has a created version");
        let delay = SEC + exponential(rng, 2.0 * DAY as f64).min(10.0 * DAY as f64) as i64;
        out.push(Version {
            op: Op::Delete,
            updated: last.updated + delay,
            ..last
        });
    }
}

/// Refund after capture: 30% chargeback-like (14–75 d), otherwise ~exp(3 d) capped at 75 d.
fn refund_delay(rng: &mut ChaCha8Rng) -> i64 {
    let delay = if rng.random::<f64>() < 0.3 {
        uniform(rng, 14.0 * DAY as f64, 75.0 * DAY as f64)
    } else {
        exponential(rng, 3.0 * DAY as f64).min(75.0 * DAY as f64)
    };
    delay as i64
}

/// Deliver one version: draw its ingestion lag, and with 0.5% probability a redelivery of the
/// identical row a little later (at-least-once delivery).
fn deliver(rng: &mut ChaCha8Rng, payment: Payment, v: &Version, rows: &mut Vec<Row>) {
    let row = Row {
        payment,
        status: v.status,
        op: v.op,
        updated: v.updated,
        ingested: v.updated + ingestion_lag(rng),
    };
    rows.push(row);
    if rng.random::<f64>() < 0.005 {
        let again = SEC + (exponential(rng, 10.0 * MIN as f64) as i64).min(DAY);
        rows.push(Row {
            ingested: row.ingested + again,
            ..row
        });
    }
}

/// Lag mixture: 92% lognormal median 20 s (cap 50 min), 7% log-uniform 1 h..24 h,
/// 0.9% uniform 1..5 d, 0.1% uniform 7..42 d.
fn ingestion_lag(rng: &mut ChaCha8Rng) -> i64 {
    let u = rng.random::<f64>();
    let lag = if u < 0.92 {
        lognormal(rng, 20.0 * SEC as f64, 1.0).min(50.0 * MIN as f64)
    } else if u < 0.99 {
        uniform(rng, (HOUR as f64).ln(), (DAY as f64).ln()).exp()
    } else if u < 0.999 {
        uniform(rng, DAY as f64, 5.0 * DAY as f64)
    } else {
        uniform(rng, 7.0 * DAY as f64, 42.0 * DAY as f64)
    };
    lag as i64
}

/// Rows with `lo <= _ingested_at < hi` (`lo = None`: from the beginning), in ingestion order.
/// Only the creation days that can reach the window are generated.
fn gen_window(world: &World, lo: Option<i64>, hi: i64) -> Vec<Row> {
    let last_day = (hi - 1 - world.start_us).div_euclid(DAY);
    let first_day = lo.map_or(0, |lo| {
        ((lo - world.start_us).div_euclid(DAY) - LOOKBACK_DAYS).max(0)
    });
    let in_window = |r: &Row| r.ingested < hi && lo.is_none_or(|lo| r.ingested >= lo);
    let mut rows = Vec::new();
    for k in first_day..=last_day {
        let day = gen_day(world, k as u64);
        rows.extend(day.into_iter().filter(in_window));
    }
    rows.sort_unstable_by_key(Row::sort_key);
    rows
}

// ---------------------------------------------------------------------------------------------
// Arrow
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

/// An unloaded handle for a table that must not exist yet.
async fn new_table(out: &str) -> Result<DeltaTable, GenerateError> {
    let url = ensure_table_uri(out).at(out)?;
    let table = DeltaTableBuilder::from_url(url).at(out)?.build().at(out)?;
    if table.verify_deltatable_existence().await.at(out)? {
        return Err(GenerateError::TableExists {
            path: out.to_string(),
        });
    }
    Ok(table)
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
    let mut write = table.write(to_batches(rows)?).with_save_mode(mode);
    if let Some(meta) = meta {
        write = write.with_commit_properties(meta.commit_properties());
    }
    write.await.at(out)
}

/// Create the table with one append commit per ingestion day (like a bronze table appended to
/// daily); the first commit creates the table, the last one carries the metadata.
async fn write_by_ingestion_day(
    mut table: DeltaTable,
    rows: &[Row],
    world: &World,
    meta: &GenMeta,
    out: &str,
) -> Result<DeltaTable, GenerateError> {
    let mut days: Vec<&[Row]> = rows
        .chunk_by(|a, b| world.ingestion_day(a) == world.ingestion_day(b))
        .collect();
    if days.is_empty() {
        days.push(&[]);
    }
    let last = days.len() - 1;
    for (i, day) in days.into_iter().enumerate() {
        let mode = if i == 0 {
            SaveMode::ErrorIfExists
        } else {
            SaveMode::Append
        };
        table = commit_rows(table, day, mode, (i == last).then_some(meta), out).await?;
    }
    Ok(table)
}

fn report(
    out: &str,
    table: &DeltaTable,
    rows: &[Row],
    window_start: Option<DateTime<Utc>>,
    frontier: DateTime<Utc>,
) -> GenerateReport {
    let mut pnums: Vec<u64> = rows.iter().map(|r| r.payment.pnum).collect();
    pnums.sort_unstable();
    pnums.dedup();
    let late_before = window_start.map(|lo| lo.timestamp_micros() - 15 * MIN);
    let count = |pred: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| pred(r)).count() as u64;
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
        rows: rows.len() as u64,
        distinct_payments: pnums.len() as u64,
        deletes: count(&|r| r.op == Op::Delete),
        window_start,
        frontier,
        late_rows_behind_15m: late_before.map_or(0, |t| count(&|r| r.updated <= t)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::error::Error;
    use std::path::Path;
    use std::time::Instant;

    use arrow::array::AsArray;
    use arrow::compute::cast;
    use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
    use datafusion::prelude::SessionContext;
    use deltalake::kernel::DataType as DeltaType;

    use super::*;

    type TestResult = Result<(), Box<dyn Error>>;
    /// A bronze row as plain values, in schema order.
    type Tuple = (
        String,
        String,
        String,
        i64,
        String,
        String,
        i64,
        i64,
        i64,
        String,
    );

    const START: &str = "2024-01-01";

    fn options(dir: &Path, payments: u64, days: u32, seed: u64) -> GenerateOptions {
        GenerateOptions {
            out: dir.join("bronze").display().to_string(),
            payments,
            days,
            seed,
            start: START.parse().expect("valid test date"),
            mode: GenerateMode::Full,
        }
    }

    fn world(payments: u64, days: u32, seed: u64) -> World {
        let start: NaiveDate = START.parse().expect("valid test date");
        World {
            payments,
            days,
            start_us: start.and_time(NaiveTime::MIN).and_utc().timestamp_micros(),
            seed,
        }
    }

    fn tuples(batches: &[RecordBatch]) -> Result<Vec<Tuple>, Box<dyn Error>> {
        let mut out = Vec::new();
        for b in batches {
            let text = |i: usize| cast(b.column(i), &DataType::Utf8);
            let (pay, cus, mch, cur, st, op) =
                (text(0)?, text(1)?, text(2)?, text(4)?, text(5)?, text(9)?);
            let amount = b.column(3).as_primitive::<Int64Type>();
            let ts = |i: usize| b.column(i).as_primitive::<TimestampMicrosecondType>();
            let (created, updated, ingested) = (ts(6), ts(7), ts(8));
            for r in 0..b.num_rows() {
                let s = |a: &ArrayRef| a.as_string::<i32>().value(r).to_string();
                out.push((
                    s(&pay),
                    s(&cus),
                    s(&mch),
                    amount.value(r),
                    s(&cur),
                    s(&st),
                    created.value(r),
                    updated.value(r),
                    ingested.value(r),
                    s(&op),
                ));
            }
        }
        Ok(out)
    }

    fn sorted(mut rows: Vec<Tuple>) -> Vec<Tuple> {
        rows.sort();
        rows
    }

    async fn read_table(path: &str) -> Result<Vec<Tuple>, Box<dyn Error>> {
        let table = deltalake::open_table(parse_table_uri(path)?).await?;
        let ctx = SessionContext::new();
        ctx.register_table("t", table.table_provider().await?)?;
        let batches = ctx.sql("SELECT * FROM t").await?.collect().await?;
        Ok(sorted(tuples(&batches)?))
    }

    fn expected(world: &World, lo: Option<i64>, hi: i64) -> Result<Vec<Tuple>, Box<dyn Error>> {
        Ok(sorted(tuples(&[to_batch(&gen_window(world, lo, hi))?])?))
    }

    fn us(t: DateTime<Utc>) -> i64 {
        t.timestamp_micros()
    }

    #[tokio::test]
    async fn same_options_give_identical_tables() -> TestResult {
        let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let ra = generate(&options(a.path(), 2_000, 5, 7)).await?;
        let rb = generate(&options(b.path(), 2_000, 5, 7)).await?;
        let (ta, tb) = (read_table(&ra.table).await?, read_table(&rb.table).await?);
        assert!(!ta.is_empty());
        assert_eq!(ta, tb);
        assert_eq!(ra.rows, ta.len() as u64);
        let other_seed = gen_window(&world(2_000, 5, 8), None, us(ra.frontier));
        assert_ne!(
            gen_window(&world(2_000, 5, 7), None, us(ra.frontier)),
            other_seed
        );
        Ok(())
    }

    #[tokio::test]
    async fn full_writes_one_commit_per_ingestion_day_with_metadata_last() -> TestResult {
        let dir = tempfile::tempdir()?;
        let opts = options(dir.path(), 2_000, 5, 1);
        let report = generate(&opts).await?;
        let w = world(2_000, 5, 1);
        assert_eq!(report.mode, "full");
        assert_eq!(report.window_start, None);
        assert_eq!(report.late_rows_behind_15m, 0);
        assert_eq!(us(report.frontier), w.start_us + 5 * DAY);
        assert_eq!(
            read_table(&opts.out).await?,
            expected(&w, None, w.start_us + 5 * DAY)?
        );

        let table = open_existing(&opts.out).await?;
        let history: Vec<_> = table.history(None).collect().await;
        assert_eq!(history.len(), 5, "one commit per ingestion day");
        assert_eq!(report.version, 4);
        let with_meta: Vec<bool> = history
            .into_iter()
            .map(|c| c.map(|c| c.info.contains_key(META_KEY)))
            .collect::<Result<_, _>>()?;
        assert_eq!(
            with_meta,
            [true, false, false, false, false],
            "newest first"
        );
        let meta = find_meta(&table, &opts.out).await?;
        assert_eq!((meta.world, meta.frontier_us), (w, w.start_us + 5 * DAY));

        let fields: Vec<(String, DeltaType)> = table
            .snapshot()?
            .schema()
            .fields()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        let (s, l, t) = (DeltaType::STRING, DeltaType::LONG, DeltaType::TIMESTAMP);
        let want = [
            ("payment_id", &s),
            ("customer_id", &s),
            ("merchant_id", &s),
            ("amount_cents", &l),
            ("currency", &s),
            ("status", &s),
            ("created_at", &t),
            ("updated_at", &t),
            ("_ingested_at", &t),
            ("op", &s),
        ]
        .map(|(n, d)| (n.to_string(), d.clone()));
        assert_eq!(fields, want);
        Ok(())
    }

    #[tokio::test]
    async fn next_hours_appends_contiguous_disjoint_windows() -> TestResult {
        let dir = tempfile::tempdir()?;
        let opts = options(dir.path(), 2_000, 5, 3);
        let w = world(2_000, 5, 3);
        let full = generate(&opts).await?;
        let first = next_hours(&opts.out, 1).await?;
        let second = generate(&GenerateOptions {
            mode: GenerateMode::NextHours(1),
            ..opts.clone()
        })
        .await?;

        assert_eq!(first.window_start, Some(full.frontier));
        assert_eq!(second.window_start, Some(first.frontier));
        assert_eq!(us(first.frontier) - us(full.frontier), HOUR);
        assert_eq!(us(second.frontier) - us(first.frontier), HOUR);
        assert_eq!(
            (first.version, second.version),
            (full.version + 1, full.version + 2)
        );
        assert_eq!((first.mode, second.mode), ("increment", "increment"));

        // Everything written equals one generation up to the last frontier: nothing is
        // missing and nothing is written twice.
        let all = read_table(&opts.out).await?;
        assert_eq!(all, expected(&w, None, us(second.frontier))?);
        for r in [&first, &second] {
            let lo = us(r.window_start.expect("increment has a window"));
            let hi = us(r.frontier);
            let window: Vec<&Tuple> = all.iter().filter(|t| (lo..hi).contains(&t.8)).collect();
            assert_eq!(window.len() as u64, r.rows);
            let late = window.iter().filter(|t| t.7 <= lo - 15 * MIN).count() as u64;
            assert_eq!(late, r.late_rows_behind_15m);
        }
        Ok(())
    }

    #[test]
    fn windows_far_from_day_zero_only_need_the_lookback_days() {
        let w = world(3_000, 10, 11);
        let lo = w.start_us + 150 * DAY + 13 * HOUR;
        let hi = lo + 6 * HOUR;
        let everything = gen_window(&w, None, hi);
        let from_lo: Vec<Row> = everything
            .into_iter()
            .filter(|r| r.ingested >= lo)
            .collect();
        assert!(!from_lo.is_empty());
        assert_eq!(gen_window(&w, Some(lo), hi), from_lo);
    }

    #[test]
    fn the_world_has_the_expected_shape() {
        let w = world(50_000, 30, 5);
        let rows: Vec<Row> = (0..30).flat_map(|k| gen_day(&w, k)).collect();
        let mut by_payment: HashMap<u64, Vec<Row>> = HashMap::new();
        for r in &rows {
            by_payment.entry(r.payment.pnum).or_default().push(*r);
        }
        assert_eq!(by_payment.len(), 50_000);
        assert_eq!(by_payment.keys().max(), Some(&49_999));

        use Status::*;
        let lifecycles: [&[Status]; 5] = [
            &[Created],
            &[Created, Failed],
            &[Created, Authorized],
            &[Created, Authorized, Captured],
            &[Created, Authorized, Captured, Refunded],
        ];
        let (mut captured, mut deletes, mut redeliveries) = (0, 0, 0);
        for versions in by_payment.values_mut() {
            versions.sort_by_key(|r| (r.updated, r.op, r.ingested));
            let before = versions.len();
            versions.dedup_by_key(|r| (r.updated, r.op, r.status));
            redeliveries += before - versions.len();
            let (upserts, tombstones): (Vec<Row>, Vec<Row>) =
                versions.iter().partition(|r| r.op == Op::Upsert);
            let statuses: Vec<Status> = upserts.iter().map(|r| r.status).collect();
            assert!(lifecycles.contains(&statuses.as_slice()), "{statuses:?}");
            assert_eq!(upserts[0].updated, upserts[0].payment.created);
            captured += usize::from(statuses.contains(&Captured));
            assert!(tombstones.len() <= 1);
            if let (Some(d), Some(last)) = (tombstones.first(), upserts.last()) {
                assert_eq!(d.status, last.status);
                assert!(d.updated > last.updated);
                deletes += 1;
            }
        }
        let share = captured as f64 / 50_000.0;
        assert!((0.72..0.78).contains(&share), "captured share {share}");
        assert!((10..120).contains(&deletes), "{deletes} deletes");
        assert!(
            redeliveries as f64 > 0.003 * rows.len() as f64,
            "{redeliveries} redeliveries"
        );

        let lags: Vec<i64> = rows.iter().map(|r| r.ingested - r.updated).collect();
        let share_le = |t: i64| lags.iter().filter(|&&l| l <= t).count() as f64 / lags.len() as f64;
        assert!(
            (0.88..0.94).contains(&share_le(15 * MIN)),
            "{}",
            share_le(15 * MIN)
        );
        assert!(lags.iter().any(|&l| l > DAY));
        assert!(lags.iter().any(|&l| l > 7 * DAY));
        assert!(lags.iter().all(|l| (0..=42 * DAY + DAY + SEC).contains(l)));
        let spread = rows.iter().map(|r| r.ingested - r.payment.created).max();
        assert!(spread < Some(LOOKBACK_DAYS * DAY));
    }

    #[test]
    fn ids_are_prefixed_and_zero_padded() -> TestResult {
        let rows = gen_window(
            &world(20_000, 1, 2),
            None,
            world(20_000, 1, 2).start_us + DAY,
        );
        let t = tuples(&[to_batch(&rows[..10])?])?;
        for (pay, cus, mch, ..) in &t {
            assert!(pay.starts_with("pay_") && pay.len() == 16, "{pay}");
            assert!(cus.starts_with("cus_") && cus.len() == 13, "{cus}");
            assert!(mch.starts_with("mch_") && mch.len() == 10, "{mch}");
            assert!(pay[4..].chars().all(|c| c.is_ascii_digit()));
        }
        assert!(rows.windows(2).all(|p| p[0].sort_key() <= p[1].sort_key()));
        Ok(())
    }

    #[tokio::test]
    async fn an_empty_first_window_still_creates_a_generator_table() -> TestResult {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("empty").display().to_string();
        let w = world(10, 1, 0);
        let table = new_table(&out).await?;
        let meta = GenMeta::new(w, w.start_us, None);
        write_by_ingestion_day(table, &[], &w, &meta, &out).await?;
        assert!(read_table(&out).await?.is_empty());
        let report = next_hours(&out, 24).await?;
        assert_eq!(report.window_start.map(us), Some(w.start_us));
        assert!(report.rows > 0);
        Ok(())
    }

    #[tokio::test]
    async fn full_mode_refuses_an_existing_table() -> TestResult {
        let dir = tempfile::tempdir()?;
        let opts = options(dir.path(), 100, 1, 0);
        generate(&opts).await?;
        let err = generate(&opts).await.expect_err("second full generation");
        assert!(matches!(err, GenerateError::TableExists { .. }), "{err}");
        assert!(err.to_string().contains("--next-hour"));
        Ok(())
    }

    #[tokio::test]
    async fn next_hours_needs_a_generator_table() -> TestResult {
        let dir = tempfile::tempdir()?;
        let missing = dir.path().join("missing").display().to_string();
        let err = next_hours(&missing, 1).await.expect_err("no table");
        assert!(matches!(err, GenerateError::NotATable { .. }), "{err}");
        assert!(!Path::new(&missing).exists(), "must not create directories");

        let plain = dir.path().join("plain").display().to_string();
        let rows = gen_window(&world(100, 1, 0), None, world(100, 1, 0).start_us + DAY);
        commit_rows(
            new_table(&plain).await?,
            &rows,
            SaveMode::ErrorIfExists,
            None,
            &plain,
        )
        .await?;
        let err = next_hours(&plain, 1).await.expect_err("no metadata");
        assert!(
            matches!(err, GenerateError::NoGeneratorMetadata { .. }),
            "{err}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn zero_sizes_are_rejected() -> TestResult {
        let dir = tempfile::tempdir()?;
        for opts in [
            options(dir.path(), 0, 5, 0),
            options(dir.path(), 10, 0, 0),
            GenerateOptions {
                mode: GenerateMode::NextHours(0),
                ..options(dir.path(), 10, 5, 0)
            },
        ] {
            let err = generate(&opts).await.expect_err("invalid options");
            assert!(matches!(err, GenerateError::InvalidOptions(_)), "{err}");
        }
        assert!(!dir.path().join("bronze").exists());
        Ok(())
    }

    /// Timing of debug-build generation; run with `--ignored --nocapture`.
    #[tokio::test]
    #[ignore]
    async fn timing() -> TestResult {
        for (payments, days) in [(20_000, 30), (200_000, 90)] {
            let dir = tempfile::tempdir()?;
            let opts = options(dir.path(), payments, days, 42);
            let t0 = Instant::now();
            let full = generate(&opts).await?;
            let t1 = Instant::now();
            let inc = next_hours(&opts.out, 1).await?;
            println!(
                "{payments} payments / {days} days: full {} rows in {:.2?}; next hour {} rows in {:.2?}",
                full.rows,
                t1 - t0,
                inc.rows,
                t1.elapsed()
            );
        }
        Ok(())
    }
}
