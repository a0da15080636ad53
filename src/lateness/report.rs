//! The profile as numbers (`--output json`, stable field names); the text is in `text.rs`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::acc::{Acc, HOUR, MIN, SEC};
use super::counts::Cumulative;
use super::scan::Scanned;
use super::{duration_text, micros, LatenessInputs, LatenessOptions, Settled, Unit};

/// Hours of the hourly completeness curve (`within 1h` … `within 48h`).
pub const CURVE_HOURS: u32 = 48;
/// Minutes of the minute curve.
pub const CURVE_MINUTES: [u32; 10] = [1, 2, 3, 5, 10, 15, 20, 30, 45, 60];

/// The whole `--output json` object.
#[derive(Debug, Clone, Serialize)]
pub struct LatenessReport {
    pub table: String,
    pub pipeline: Option<String>,
    /// What the table is to the pipeline (`source` of a merge, `target` of an ingest).
    #[serde(skip)]
    pub role: &'static str,
    pub event_time: String,
    pub arrival: String,
    /// RFC 3339; null for a table without a single arrival.
    pub now: Option<String>,
    /// `flag` (`--now`) or `max_arrival` (the table's latest arrival).
    pub now_from: &'static str,
    pub settled: SettledWindow,
    pub budget: String,
    pub budget_s: f64,
    pub overlap: Option<String>,
    pub overlap_s: Option<f64>,
    pub target_completeness_pct: f64,
    pub unit: Unit,
    pub by: Option<String>,
    /// The whole table.
    pub overall: Profile,
    /// Per `--by` value, the tail's owners first (most rows beyond the budget, then highest p99).
    pub groups: Vec<GroupProfile>,
    /// Things the reader should know (a narrowed window, an extra pass).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SettledWindow {
    /// `--settled`'s FROM and TO.
    pub from: String,
    pub to: String,
    /// The window's event times `[start, end)`, RFC 3339 (null without a `now`).
    pub start: Option<String>,
    pub end: Option<String>,
    /// Whether `--settled` chose it (false: the default, or the narrower one a note explains).
    pub explicit: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupProfile {
    /// The `--by` value as text; null for rows whose value is null.
    pub group: Option<String>,
    #[serde(flatten)]
    pub profile: Profile,
}

/// The lateness of one set of rows (the table, or one `--by` group).
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    /// Rows read.
    pub rows: u64,
    /// Rows with both times: everything below counts these.
    pub profiled_rows: u64,
    /// Rows left out for a null event time / a null arrival (a row null in both counts in both).
    pub null_event_time: u64,
    pub null_arrival: u64,
    /// Profiled rows that arrived before their event time (clock skew); left out of the curve.
    pub negative_rows: u64,
    pub percentiles_s: Percentiles,
    /// What the percentiles are exact to: lateness is floored to this many seconds first.
    pub percentile_precision_s: f64,
    /// Rows with `arrival > event + budget`.
    pub beyond_budget: Share,
    /// Rows with `arrival > event + overlap` (null without a pipeline).
    pub beyond_overlap: Option<Share>,
    /// Rows per lateness in `unit` (days: calendar days; hours/minutes: elapsed, floored).
    pub histogram: Vec<Bucket>,
    /// Rows with an event time in the settled window and a lateness >= 0.
    pub settled_rows: u64,
    /// Rows in the settled window that arrived before their event (not in the curve).
    pub settled_negative_rows: u64,
    /// Cumulative % of settled rows by calendar days late: D+0 is the event's own day.
    pub completeness_days: Vec<DayPoint>,
    /// Cumulative % of settled rows that arrived within 1, 2, … 48 hours (`lateness <= h`).
    pub completeness_hours: Vec<WithinPoint>,
    /// The same within 1, 2, 3, 5, 10, 15, 20, 30, 45, 60 minutes.
    pub completeness_minutes: Vec<WithinPoint>,
    /// Null when there are no settled rows.
    pub recommendation: Option<Recommendation>,
    /// The settled rows' lateness in whole seconds (rounded up), for the plot.
    #[serde(skip)]
    pub curve: Cumulative,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    /// Exact (microseconds).
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub rows: u64,
    /// Of the profiled rows.
    pub pct: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    pub late: i64,
    pub rows: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DayPoint {
    pub days_late: i64,
    pub rows: u64,
    pub pct_complete: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WithinPoint {
    /// Hours or minutes, per the list it is in.
    pub within: u32,
    pub pct_complete: f64,
}

/// The smallest lookback that covers the target, and what the overlap covers.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    pub target_pct: f64,
    /// The smallest whole-second lookback with `target_pct` of settled rows within it.
    pub needed_s: u64,
    /// `needed_s` rounded up to a round figure (see [`round_up`]), as a duration and in seconds.
    pub lookback: String,
    pub lookback_s: u64,
    /// % of settled rows with `lateness <= lookback`.
    pub lookback_covers_pct: f64,
    pub overlap: Option<String>,
    /// % of settled rows with `lateness <= overlap`.
    pub overlap_covers_pct: Option<f64>,
}

/// A lookback rounded up to a figure a person would write: 5 s steps under a minute, minutes
/// under 10 minutes, 5 minutes under an hour, 10 minutes under 6 hours, 30 minutes under a
/// day, hours under 3 days, then 6 hours.
pub fn round_up(seconds: u64) -> u64 {
    const STEPS: [(u64, u64); 6] = [
        (60, 5),
        (600, 60),
        (3_600, 300),
        (6 * 3_600, 600),
        (86_400, 1_800),
        (3 * 86_400, 3_600),
    ];
    let step = STEPS
        .iter()
        .find(|(limit, _)| seconds <= *limit)
        .map_or(6 * 3_600, |(_, s)| *s);
    seconds.div_ceil(step) * step
}

/// What [`build`] needs besides the counts.
pub struct Context<'a> {
    pub inputs: &'a LatenessInputs,
    pub opts: &'a LatenessOptions,
    pub event: String,
    pub arrival: String,
    pub now: Option<i64>,
    pub window: Settled,
    pub explicit_window: bool,
    pub notes: Vec<String>,
}

pub(super) fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn rfc3339(us: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// Summarises one accumulator.
pub fn profile_of(
    acc: &mut Acc,
    unit: Unit,
    target_pct: f64,
    overlap: Option<Duration>,
) -> Profile {
    let per_second = (SEC / acc.precision) as f64;
    let q = acc.lateness.quantiles(&[0.5, 0.9, 0.99, 0.999]);
    let seconds = |v: Option<f64>| v.map(|v| v / per_second);
    let profiled = acc.n > 0;
    let percentiles = Percentiles {
        p50: seconds(q[0]),
        p90: seconds(q[1]),
        p99: seconds(q[2]),
        p999: seconds(q[3]),
        min: profiled.then(|| acc.min_lateness as f64 / SEC as f64),
        max: profiled.then(|| acc.max_lateness as f64 / SEC as f64),
    };
    let histogram = match unit {
        Unit::Days => acc
            .days
            .iter()
            .map(|(late, rows)| Bucket { late, rows })
            .collect(),
        Unit::Hours | Unit::Minutes => {
            let size = if unit == Unit::Hours { HOUR } else { MIN };
            let precision = acc.precision;
            let mut out: Vec<Bucket> = Vec::new();
            for (key, rows) in acc.lateness.iter() {
                let late = key.saturating_mul(precision).div_euclid(size);
                match out.last_mut() {
                    Some(b) if b.late == late => b.rows += rows,
                    _ => out.push(Bucket { late, rows }),
                }
            }
            out
        }
    };
    let settled = acc.settled;
    let mut cum_rows = 0;
    let completeness_days = acc
        .settled_days
        .iter()
        .map(|(days_late, rows)| {
            cum_rows += rows;
            DayPoint {
                days_late,
                rows,
                pct_complete: pct(cum_rows, settled),
            }
        })
        .collect();
    let curve = Cumulative::new(&acc.settled_secs.sorted());
    let within = |seconds: i64| pct(curve.at_most(seconds), settled);
    let (completeness_hours, completeness_minutes) = if settled == 0 {
        (Vec::new(), Vec::new())
    } else {
        (
            (1..=CURVE_HOURS)
                .map(|h| WithinPoint {
                    within: h,
                    pct_complete: within(i64::from(h) * 3_600),
                })
                .collect(),
            CURVE_MINUTES
                .iter()
                .map(|&m| WithinPoint {
                    within: m,
                    pct_complete: within(i64::from(m) * 60),
                })
                .collect(),
        )
    };
    let recommendation = curve.smallest_covering(target_pct).map(|s| {
        let needed_s = s.max(0) as u64;
        let lookback_s = round_up(needed_s);
        Recommendation {
            target_pct,
            needed_s,
            lookback: duration_text(Duration::from_secs(lookback_s)),
            lookback_s,
            lookback_covers_pct: within(lookback_s as i64),
            overlap: overlap.map(duration_text),
            overlap_covers_pct: overlap.map(|_| pct(acc.settled_within_overlap, settled)),
        }
    });
    Profile {
        rows: acc.rows,
        profiled_rows: acc.n,
        null_event_time: acc.null_event,
        null_arrival: acc.null_arrival,
        negative_rows: acc.negative,
        percentiles_s: percentiles,
        percentile_precision_s: 1.0 / per_second,
        beyond_budget: Share {
            rows: acc.beyond_budget,
            pct: pct(acc.beyond_budget, acc.n),
        },
        beyond_overlap: overlap.map(|_| Share {
            rows: acc.beyond_overlap,
            pct: pct(acc.beyond_overlap, acc.n),
        }),
        histogram,
        settled_rows: settled,
        settled_negative_rows: acc.settled_negative,
        completeness_days,
        completeness_hours,
        completeness_minutes,
        recommendation,
        curve,
    }
}

/// The report of a scan.
pub fn build(ctx: Context<'_>, mut scanned: Scanned) -> LatenessReport {
    let opts = ctx.opts;
    let overlap = ctx.inputs.overlap;
    let overall = profile_of(&mut scanned.table, opts.unit, opts.target_pct, overlap);
    let mut groups: Vec<GroupProfile> = scanned
        .groups
        .iter_mut()
        .map(|(name, acc)| GroupProfile {
            group: name.clone(),
            profile: profile_of(acc, opts.unit, opts.target_pct, overlap),
        })
        .collect();
    groups.sort_by(|a, b| {
        let tail = |g: &GroupProfile| g.profile.percentiles_s.p99.unwrap_or(f64::NEG_INFINITY);
        b.profile
            .beyond_budget
            .rows
            .cmp(&a.profile.beyond_budget.rows)
            .then(tail(b).total_cmp(&tail(a)))
            .then(a.group.cmp(&b.group))
    });
    let start = ctx
        .now
        .and_then(|n| rfc3339(n.saturating_sub(micros(ctx.window.from))));
    let end = ctx
        .now
        .and_then(|n| rfc3339(n.saturating_sub(micros(ctx.window.to))));
    LatenessReport {
        table: ctx.inputs.table_uri.clone(),
        pipeline: ctx.inputs.pipeline.clone(),
        role: ctx.inputs.role,
        event_time: ctx.event,
        arrival: ctx.arrival,
        now: ctx.now.and_then(rfc3339),
        now_from: if opts.now.is_some() {
            "flag"
        } else {
            "max_arrival"
        },
        settled: SettledWindow {
            from: duration_text(ctx.window.from),
            to: duration_text(ctx.window.to),
            start,
            end,
            explicit: ctx.explicit_window,
        },
        budget: duration_text(opts.budget),
        budget_s: opts.budget.as_secs_f64(),
        overlap: overlap.map(duration_text),
        overlap_s: overlap.map(|d| d.as_secs_f64()),
        target_completeness_pct: opts.target_pct,
        unit: opts.unit,
        by: opts.by.clone(),
        overall,
        groups,
        notes: ctx.notes,
    }
}
#[cfg(test)]
mod tests {
    use super::super::text::{count, pct_text, seconds_text};
    use super::*;

    #[test]
    fn lookbacks_round_up_to_figures_people_write() {
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(1), 5);
        assert_eq!(round_up(60), 60);
        assert_eq!(round_up(61), 120);
        assert_eq!(round_up(14 * 60 + 1), 15 * 60);
        assert_eq!(round_up(2 * 3_600 + 3 * 60), 2 * 3_600 + 10 * 60);
        assert_eq!(
            duration_text(Duration::from_secs(round_up(2 * 3_600 + 3 * 60))),
            "2h10m"
        );
        assert_eq!(round_up(20 * 3_600 + 1), 20 * 3_600 + 1_800);
        assert_eq!(round_up(2 * 86_400 + 1), 2 * 86_400 + 3_600);
        assert_eq!(round_up(4 * 86_400 + 1), 4 * 86_400 + 6 * 3_600);
        // Rounding never goes down, and a round figure stays.
        for s in [1u64, 59, 599, 3_599, 86_399, 300_000] {
            assert!(round_up(s) >= s);
            assert_eq!(round_up(round_up(s)), round_up(s));
        }
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(seconds_text(Some(20.4684)), "20.468s");
        assert_eq!(seconds_text(Some(7_387.0)), "2h3m");
        assert_eq!(seconds_text(Some(-90.0)), "-1m30s");
        assert_eq!(seconds_text(Some(3_579_984.0)), "41d10h");
        assert_eq!(seconds_text(None), "-");
        assert_eq!(pct_text(99.934), "99.934%");
        assert_eq!(pct_text(99.9), "99.9%");
        assert_eq!(pct_text(0.0018), "0.002%");
        assert_eq!(pct_text(0.0001), "<0.001%");
        assert_eq!(pct_text(99.99999), ">99.999%");
        assert_eq!(pct_text(91.84), "91.8%");
        assert_eq!(pct_text(100.0), "100%");
    }
}
