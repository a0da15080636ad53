//! `tidemark lateness`: how late the data really runs (seeds 000 and 001).
//!
//! Every event has two clocks — when it happened (event time) and when it landed (arrival,
//! `_ingested_at`) — and lateness, `arrival - event`, is a distribution with a long tail that
//! has to be measured before an overlap, a lookback or a budget is chosen. One pass over the
//! table's two time columns (three with `--by`) yields:
//!
//! * the histogram of days late (`date(arrival) - date(event)`, UTC calendar days, as DuckDB's
//!   `date_diff('day', ...)`), or of elapsed hours/minutes late with `--unit`;
//! * the completeness curve over a **settled** window of event times (`[now-120d, now-30d)` by
//!   default): the cumulative share of those rows that had arrived by D+0, D+1, …, and within
//!   1..48 hours;
//! * percentiles of lateness in seconds: DuckDB's `quantile_cont` (linear interpolation between
//!   the ranks around `(n-1)q`) over the lateness floored to the millisecond (to the second per
//!   `--by` group), and the exact maximum;
//! * rows beyond `--budget` and beyond the pipeline's overlap (`arrival > event + d`), exact;
//! * a recommendation: the smallest lookback covering `--target-completeness` of settled rows.
//!
//! Rows arriving before their event (clock skew) are counted and left out of the curve; rows
//! with a null time are counted and left out of everything.
//!
//! How it stays one pass: each DataFusion partition of a projected scan is consumed by its own
//! task into exact, bounded-memory counters (`counts.rs`), merged at the end. The default
//! `now` (the latest arrival) comes from the Delta log's statistics before the scan; they are
//! truncated to the millisecond, so the few rows within 1 ms of the window's edges are kept
//! aside and classified once the scan has found the exact latest arrival.

mod acc;
mod counts;
mod error;
mod plot;
mod report;
mod runs;
mod scan;
mod text;

use std::time::Duration;

use chrono::{DateTime, Utc};
use datafusion::prelude::SessionContext;

pub use error::LatenessError;
pub use plot::write_plot;
pub use report::{LatenessReport, Profile};
pub use runs::{runs_trend, RunsTrend};

use acc::Bounds;
use scan::{column_names, column_type, is_time};

/// The table and columns to profile, as the command line and the pipeline give them.
#[derive(Debug, Clone)]
pub struct LatenessInputs {
    pub table_uri: String,
    /// `"source"` for a pipeline's bronze table, `"table"` for a URI: used in messages.
    pub role: &'static str,
    /// The pipeline's name, when the table is a pipeline's source.
    pub pipeline: Option<String>,
    /// The event-time column (`--event-time`, else the pipeline's `sequence_by`).
    pub event_time: Option<String>,
    /// The arrival column (`--arrival`, default `_ingested_at`).
    pub arrival: String,
    /// The pipeline's overlap.
    pub overlap: Option<Duration>,
}

/// The histogram's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Calendar days late: `date(arrival) - date(event)` in UTC.
    #[default]
    Days,
    /// Elapsed whole hours late.
    Hours,
    /// Elapsed whole minutes late.
    Minutes,
}

/// The settled window: event times in `[now - from, now - to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub from: Duration,
    pub to: Duration,
}

impl Settled {
    /// `120d..30d`: days old enough that their stragglers have landed (seed 001).
    pub const DEFAULT: Settled = Settled {
        from: Duration::from_secs(120 * 86_400),
        to: Duration::from_secs(30 * 86_400),
    };
}

/// How to profile.
#[derive(Debug, Clone)]
pub struct LatenessOptions {
    /// `--settled`; `None`: the default window (narrowed when the table is younger than it).
    pub settled: Option<Settled>,
    /// `--now`; `None`: the table's latest arrival.
    pub now: Option<DateTime<Utc>>,
    pub budget: Duration,
    /// `--target-completeness` in percent, `(0, 100]`.
    pub target_pct: f64,
    pub by: Option<String>,
    pub unit: Unit,
}

/// `--settled FROM..TO`, e.g. `120d..30d`.
pub fn parse_settled(text: &str) -> Result<Settled, String> {
    let (from, to) = text.split_once("..").ok_or_else(|| {
        format!("{text:?} is not a window: write FROM..TO as durations before now, e.g. 120d..30d")
    })?;
    let parse = |s: &str| {
        humantime::parse_duration(s.trim())
            .map_err(|e| format!("{s:?} in {text:?} is not a duration ({e}); write e.g. 120d..30d"))
    };
    let (from, to) = (parse(from)?, parse(to)?);
    if from <= to {
        return Err(format!(
            "{text:?}: FROM must be further back than TO (event times in [now-FROM, now-TO)), e.g. 120d..30d"
        ));
    }
    Ok(Settled { from, to })
}

/// `--target-completeness 99.9%` (the `%` is optional), in percent.
pub fn parse_percent(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    match number.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!(
            "{text:?} is not a percentage above 0 and at most 100, e.g. 99.9%"
        )),
    }
}

/// `--now`: an RFC 3339 time.
pub fn parse_now(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}), e.g. 2024-06-01T00:00:00Z"))
}

/// A duration for the command line (`--budget`): humantime's syntax, at least 0.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 3d, 36h, 90m"))
}

/// A duration in whole microseconds (saturating).
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The window tried when the default one holds none of the table's events.
const NARROWER: [Settled; 2] = [
    Settled {
        from: Settled::DEFAULT.from,
        to: Duration::from_secs(7 * 86_400),
    },
    Settled {
        from: Settled::DEFAULT.from,
        to: Duration::from_secs(86_400),
    },
];

/// Profiles the table: one pass (two in the rare cases the module docs name), in `ctx` (the
/// command's compute: its partitions, memory limit and spill directory).
pub async fn profile(
    inputs: &LatenessInputs,
    opts: &LatenessOptions,
    ctx: SessionContext,
) -> Result<LatenessReport, LatenessError> {
    let uri = inputs.table_uri.as_str();
    let table = crate::lake::open_required(uri, inputs.role).await?;
    let df = scan::frame(&table, &ctx, uri).await?;
    let (event, arrival) = checked_columns(inputs, opts, &df)?;

    // `now`: given, else the latest arrival — from the log's statistics when they have it
    // (exact up to the millisecond they are truncated to; settled below), else read first.
    let mut notes = Vec::new();
    let (provisional, exact) =
        provisional_now(opts, &table, &df, &arrival, uri, &mut notes).await?;

    let (window, window_note) = match (opts.settled, provisional) {
        (Some(w), _) => (w, None),
        (None, Some(now)) => default_window(&table, &event, now),
        (None, None) => (Settled::DEFAULT, None),
    };
    notes.extend(window_note);
    let budget = micros(opts.budget);
    let overlap = inputs.overlap.map(micros);
    let bounds_at = |now: i64, edge: i64| Bounds {
        budget,
        overlap,
        lo: now.saturating_sub(micros(window.from)),
        hi: now.saturating_sub(micros(window.to)),
        edge,
    };
    let mut columns = vec![event.as_str(), arrival.as_str()];
    if let Some(by) = &opts.by {
        columns.push(by.as_str());
    }
    let projected = df
        .select_columns(&columns)
        .map_err(|e| scan::query(uri, e))?;
    let p = provisional.unwrap_or(0);
    let mut scanned = scan::scan(
        projected.clone(),
        bounds_at(p, if exact { 0 } else { 1_000 }),
        opts.by.as_deref(),
        uri,
    )
    .await?;
    let now = match opts.now {
        Some(n) => Some(n.timestamp_micros()),
        None => scanned.table.max_arrival,
    };
    if let Some(now) = now {
        if !exact && !(p..p + 1_000).contains(&now) {
            // The statistics were not a millisecond-truncated maximum (deletion vectors keep
            // the statistics of deleted rows): classify again against the exact `now`.
            tracing::info!(
                stats_max = p,
                exact = now,
                "lateness: the log's maximum arrival was not the table's; a second pass"
            );
            scanned = scan::scan(projected, bounds_at(now, 0), opts.by.as_deref(), uri).await?;
        } else {
            let b = bounds_at(now, 0);
            scanned.table.resolve_edges(b.lo, b.hi, overlap);
            for (_, g) in scanned.groups.iter_mut() {
                g.resolve_edges(b.lo, b.hi, overlap);
            }
        }
    }
    Ok(report::build(
        report::Context {
            inputs,
            opts,
            event,
            arrival,
            now,
            window,
            explicit_window: opts.settled.is_some(),
            notes,
        },
        scanned,
    ))
}

/// The two clocks (and `--by`) are columns of the table, distinct, times (and a group that
/// reads as text): the event-time and arrival columns.
fn checked_columns(
    inputs: &LatenessInputs,
    opts: &LatenessOptions,
    df: &datafusion::prelude::DataFrame,
) -> Result<(String, String), LatenessError> {
    let uri = inputs.table_uri.as_str();
    let names = column_names(df);
    let listed = names.join(", ");
    let Some(event) = inputs.event_time.clone() else {
        return Err(LatenessError::NoEventTime {
            uri: uri.to_string(),
            what: match &inputs.pipeline {
                Some(p) => {
                    format!("is the bronze of ingest pipeline `{p}`, which names no event time")
                }
                None => "is a table, not a pipeline".to_string(),
            },
            columns: format!(" (its columns: {listed})"),
        });
    };
    let arrival = inputs.arrival.clone();
    let check = |flag: &'static str, column: &str| -> Result<(), LatenessError> {
        if names.iter().any(|n| n == column) {
            return Ok(());
        }
        let hint = nearest(column, &names)
            .map(|n| format!(" (did you mean `{n}`?)"))
            .unwrap_or_default();
        Err(LatenessError::NoSuchColumn {
            flag,
            column: column.to_string(),
            uri: uri.to_string(),
            hint,
            columns: listed.clone(),
        })
    };
    check("--event-time", &event)?;
    check("--arrival", &arrival)?;
    if let Some(by) = &opts.by {
        check("--by", by)?;
    }
    if event == arrival {
        return Err(LatenessError::SameColumn { column: event });
    }
    if let Some(by) = opts.by.as_ref().filter(|b| **b == event || **b == arrival) {
        return Err(LatenessError::Usage(format!(
            "--by {by} is one of the two clocks: group by another column (a source system, a client, a currency)"
        )));
    }
    for (flag, column) in [("--event-time", &event), ("--arrival", &arrival)] {
        let dt = column_type(df, column).unwrap_or(arrow::datatypes::DataType::Null);
        if !is_time(&dt) {
            return Err(LatenessError::NotATime {
                flag,
                column: column.clone(),
                uri: uri.to_string(),
                data_type: dt.to_string(),
            });
        }
    }
    if let Some(by) = &opts.by {
        let dt = column_type(df, by).unwrap_or(arrow::datatypes::DataType::Null);
        if !arrow::compute::can_cast_types(&dt, &arrow::datatypes::DataType::Utf8) {
            return Err(LatenessError::NotAGroup {
                column: by.clone(),
                uri: uri.to_string(),
                data_type: dt.to_string(),
            });
        }
    }

    Ok((event, arrival))
}

/// The provisional `now` (µs) and whether it is exact: `--now`, else the latest arrival from
/// the log's statistics (millisecond-truncated: not exact), else from a first pass.
async fn provisional_now(
    opts: &LatenessOptions,
    table: &deltalake::DeltaTable,
    df: &datafusion::prelude::DataFrame,
    arrival: &str,
    uri: &str,
    notes: &mut Vec<String>,
) -> Result<(Option<i64>, bool), LatenessError> {
    Ok(match opts.now {
        Some(now) => (Some(now.timestamp_micros()), true),
        None => match crate::lake::max_from_stats(table, arrival) {
            Ok(crate::lake::StatsMax::Max(p)) => (Some(p), false),
            Ok(crate::lake::StatsMax::Empty) => (None, true),
            _ => {
                let arrivals = df
                    .clone()
                    .select_columns(&[arrival])
                    .map_err(|e| scan::query(uri, e))?;
                notes.push(format!(
                    "the log has no statistics for `{arrival}`: its latest value was read in a first pass"
                ));
                (scan::max_arrival(arrivals, uri).await?, true)
            }
        },
    })
}

/// The default settled window, or — when the log's statistics show that it holds less than a
/// day of the table's event times (a table younger than 30 days) — the first narrower one that
/// holds a day or more, with a note saying so.
fn default_window(
    table: &deltalake::DeltaTable,
    event: &str,
    now: i64,
) -> (Settled, Option<String>) {
    let Some((first, last)) = scan::range_from_stats(table, event) else {
        return (Settled::DEFAULT, None);
    };
    let holds_a_day = |w: &Settled| {
        let lo = now.saturating_sub(micros(w.from)).max(first);
        let hi = now.saturating_sub(micros(w.to)).min(last.saturating_add(1));
        hi.saturating_sub(lo) >= acc::DAY
    };
    if holds_a_day(&Settled::DEFAULT) {
        return (Settled::DEFAULT, None);
    }
    let age = duration_text(Duration::from_secs(
        (now.saturating_sub(first).max(0) / acc::HOUR * 3_600) as u64,
    ));
    match NARROWER.iter().find(|w| holds_a_day(w)) {
        Some(w) => (
            *w,
            Some(format!(
                "the default settled window 120d..30d holds less than a day of this table's event times (the oldest is {age} old): using {}; its latest days may still receive late rows, so the curve may look better than reality — pass --settled FROM..TO to choose",
                window_text(w)
            )),
        ),
        None => (Settled::DEFAULT, None),
    }
}

/// `120d..30d` as the command line writes it.
pub fn window_text(w: &Settled) -> String {
    format!("{}..{}", duration_text(w.from), duration_text(w.to))
}

/// A duration the way a pipeline file or the command line writes it, in days, hours, minutes,
/// seconds (and milliseconds): `2h10m`, `30d`, `1d6h`. Parsed back by humantime (no months or
/// years, whose lengths humantime averages).
pub fn duration_text(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3_600, "h"),
        (secs % 3_600 / 60, "m"),
        (secs % 60, "s"),
        (u64::from(d.subsec_millis()), "ms"),
    ];
    let text: String = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".into()
    } else {
        text
    }
}

/// The closest name to `wanted` (a typo), if any is close.
fn nearest<'a>(wanted: &str, names: &'a [String]) -> Option<&'a str> {
    names
        .iter()
        .map(|n| {
            (
                strsim::levenshtein(&n.to_lowercase(), &wanted.to_lowercase()),
                n,
            )
        })
        .filter(|(d, n)| *d <= 3.max(n.len() / 4) && *d < n.len().max(wanted.len()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_refuse_clearly() {
        let w = parse_settled("120d..30d").unwrap();
        assert_eq!(w, Settled::DEFAULT);
        assert_eq!(window_text(&w), "120d..30d");
        assert!(parse_settled("30d..120d")
            .unwrap_err()
            .contains("further back"));
        assert!(parse_settled("30d").unwrap_err().contains("FROM..TO"));
        assert!(parse_settled("x..1d")
            .unwrap_err()
            .contains("not a duration"));
        assert_eq!(parse_percent("99.9%").unwrap(), 99.9);
        assert_eq!(parse_percent("100").unwrap(), 100.0);
        assert!(parse_percent("0%").is_err());
        assert!(parse_percent("101%").is_err());
        assert!(parse_now("2024-06-01T00:00:00Z").is_ok());
        assert!(parse_now("yesterday").is_err());
        assert_eq!(duration_text(Duration::from_secs(7_800)), "2h10m");
        assert_eq!(duration_text(Duration::from_secs(86_400 * 30)), "30d");
        assert_eq!(duration_text(Duration::from_millis(1_500)), "1s500ms");
        assert_eq!(duration_text(Duration::ZERO), "0s");
        for d in [1u64, 59, 61, 3_601, 90_061, 86_400 * 120] {
            let d = Duration::from_secs(d);
            assert_eq!(humantime::parse_duration(&duration_text(d)).unwrap(), d);
        }
        assert_eq!(
            humantime::parse_duration(&duration_text(Duration::from_secs(7_800))).unwrap(),
            Duration::from_secs(7_800)
        );
        assert_eq!(
            nearest("_ingest_at", &["_ingested_at".into(), "id".into()]),
            Some("_ingested_at")
        );
        assert_eq!(nearest("zzz", &["_ingested_at".into()]), None);
    }
}
