//! The profile as text for people: aligned tables of the histogram and the curves.

use super::report::*;
use super::*;
use comfy_table::{presets::UTF8_BORDERS_ONLY, CellAlignment, Table};

/// Thousands separators: 1234567 → 1,234,567.
pub(super) fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as a reader takes them in: `20.468s`, `2h3m`, `4d6h` (two units at most).
pub(super) fn seconds_text(s: Option<f64>) -> String {
    let Some(s) = s else {
        return "-".into();
    };
    if s.abs() < 60.0 {
        return format!("{s:.3}s");
    }
    let sign = if s < 0.0 { "-" } else { "" };
    let whole = s.abs().round() as u64;
    let unit = [86_400, 3_600, 60, 1]
        .into_iter()
        .find(|u| whole >= *u)
        .unwrap_or(1);
    // The largest unit and the next one: 2h3m rather than 2h3m7s.
    let next = match unit {
        86_400 => 3_600,
        3_600 => 60,
        _ => 1,
    };
    format!(
        "{sign}{}",
        duration_text(Duration::from_secs(whole / next * next))
    )
}

pub fn pct_text(p: f64) -> String {
    if p == 100.0 || p == 0.0 {
        format!("{p:.0}%")
    } else if p < 0.0005 {
        "<0.001%".into()
    } else if p >= 99.9995 {
        ">99.999%".into()
    } else if !(0.1..99.0).contains(&p) {
        // The tail's digits: 99.934%, 0.002%.
        let text = format!("{p:.3}");
        format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{p:.1}%")
    }
}

pub(super) fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Days => "days late (calendar days, UTC)",
        Unit::Hours => "hours late (elapsed)",
        Unit::Minutes => "minutes late (elapsed)",
    }
}

/// Lines of the histogram shown in text (JSON has them all); the rest are summed in one row.
const TEXT_BUCKETS: usize = 30;
/// Days of the completeness curve shown in text before the tail is summarised.
const TEXT_DAYS: usize = 8;

impl LatenessReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The recommendation in one sentence (also under the plot): the lookback, then what the
    /// overlap spans.
    pub fn sentence(&self, p: &Profile) -> String {
        match self.overlap_sentence(p) {
            Some(o) => format!("{}; {o}", self.lookback_sentence(p)),
            None => self.lookback_sentence(p),
        }
    }

    /// The lookback that keeps the target share of rows inside open days — the number that
    /// decides whether published days are right.
    pub fn lookback_sentence(&self, p: &Profile) -> String {
        let Some(r) = &p.recommendation else {
            return format!(
                "no settled rows: nothing arrived for events between {} and {} before now; pass --settled FROM..TO with a window this table's event times cover",
                self.settled.from, self.settled.to
            );
        };
        format!(
            "lookback {} keeps {} of rows inside open days ({} covers {} of the settled rows)",
            r.lookback,
            pct_text(r.target_pct),
            r.lookback,
            pct_text(r.lookback_covers_pct)
        )
    }

    /// What the pipeline's overlap spans, said as the cost setting it is (a row later than the
    /// overlap is still merged, from the file it lands in): None without an overlap.
    pub fn overlap_sentence(&self, p: &Profile) -> Option<String> {
        let r = p.recommendation.as_ref()?;
        let (o, c) = (r.overlap.as_ref()?, r.overlap_covers_pct?);
        Some(format!(
            "overlap {o} spans {} of them, a cost setting: later rows are still merged",
            pct_text(c)
        ))
    }

    pub fn to_text(&self) -> String {
        let p = &self.overall;
        let mut out = String::new();
        let of = match &self.pipeline {
            Some(name) => format!("{} ({} of pipeline {name})", self.table, self.role),
            None => self.table.clone(),
        };
        out.push_str(&format!(
            "lateness of {of}: event time `{}`, arrival `{}`\n",
            self.event_time, self.arrival
        ));
        if p.rows == 0 {
            out.push_str("no rows: the table is empty, nothing to profile\n");
            return out;
        }
        let now = self.now.clone().unwrap_or_else(|| "-".into());
        let why = if self.now_from == "flag" {
            "--now"
        } else {
            "the latest arrival; --now to choose"
        };
        out.push_str(&format!("now: {now} ({why})\n"));
        let mut rows_line = format!("rows: {} profiled", count(p.profiled_rows));
        if p.profiled_rows < p.rows {
            rows_line.push_str(&format!(
                "; {} left out for a null time ({} null `{}`, {} null `{}`)",
                count(p.rows - p.profiled_rows),
                count(p.null_event_time),
                self.event_time,
                count(p.null_arrival),
                self.arrival
            ));
        }
        rows_line.push_str(&format!(
            "; {} arrived before their event (clock skew: counted, left out of the curve)\n",
            count(p.negative_rows)
        ));
        out.push_str(&rows_line);
        if p.profiled_rows == 0 {
            out.push_str("no row has both times: nothing to profile\n");
            return out;
        }
        let ps = &p.percentiles_s;
        out.push_str(&format!(
            "lateness: p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (percentiles exact to {} s)\n",
            seconds_text(ps.p50),
            seconds_text(ps.p90),
            seconds_text(ps.p99),
            seconds_text(ps.p999),
            seconds_text(ps.max),
            p.percentile_precision_s
        ));
        out.push_str(&format!(
            "beyond the budget ({}): {} ({})\n",
            self.budget,
            rows_text(p.beyond_budget.rows),
            pct_text(p.beyond_budget.pct)
        ));
        if let (Some(o), Some(b)) = (&self.overlap, &p.beyond_overlap) {
            out.push_str(&format!(
                "beyond the overlap ({o}): {} ({})\n",
                rows_text(b.rows),
                pct_text(b.pct)
            ));
        }
        out.push('\n');
        out.push_str(&histogram_table(&p.histogram, self.unit, p.profiled_rows));
        out.push('\n');
        let window = format!(
            "{} .. {}",
            self.settled.start.as_deref().unwrap_or("-"),
            self.settled.end.as_deref().unwrap_or("-")
        );
        out.push_str(&format!(
            "completeness of settled rows: event times {}..{} before now ({window}): {}{}\n",
            self.settled.from,
            self.settled.to,
            rows_text(p.settled_rows),
            if p.settled_negative_rows > 0 {
                format!(
                    " ({} more arrived before their event: left out)",
                    count(p.settled_negative_rows)
                )
            } else {
                String::new()
            }
        ));
        if p.settled_rows > 0 {
            out.push_str(&days_table(&p.completeness_days));
            let pick = |list: &[WithinPoint], at: u32| {
                list.iter()
                    .find(|w| w.within == at)
                    .map(|w| pct_text(w.pct_complete))
                    .unwrap_or_default()
            };
            out.push_str(&format!(
                "within 5m {}  15m {}  1h {}  2h {}  6h {}  12h {}  24h {}  48h {}\n",
                pick(&p.completeness_minutes, 5),
                pick(&p.completeness_minutes, 15),
                pick(&p.completeness_hours, 1),
                pick(&p.completeness_hours, 2),
                pick(&p.completeness_hours, 6),
                pick(&p.completeness_hours, 12),
                pick(&p.completeness_hours, 24),
                pick(&p.completeness_hours, 48),
            ));
        }
        out.push('\n');
        out.push_str(&format!("recommendation: {}\n", self.sentence(p)));
        if let Some(by) = &self.by {
            out.push('\n');
            out.push_str(&self.groups_table(by));
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    fn groups_table(&self, by: &str) -> String {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        let target = pct_text(self.target_completeness_pct);
        t.set_header(vec![
            by.to_string(),
            "rows".into(),
            "p50".into(),
            "p99".into(),
            "p99.9".into(),
            "max".into(),
            format!("beyond {}", self.budget),
            format!("{target} needs"),
        ]);
        for g in &self.groups {
            let p = &g.profile;
            t.add_row(vec![
                g.group.clone().unwrap_or_else(|| "(null)".into()),
                count(p.profiled_rows),
                seconds_text(p.percentiles_s.p50),
                seconds_text(p.percentiles_s.p99),
                seconds_text(p.percentiles_s.p999),
                seconds_text(p.percentiles_s.max),
                format!(
                    "{} ({})",
                    count(p.beyond_budget.rows),
                    pct_text(p.beyond_budget.pct)
                ),
                p.recommendation
                    .as_ref()
                    .map_or("-".into(), |r| r.lookback.clone()),
            ]);
        }
        for i in 1..8 {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        format!(
            "by {by}: {} groups, the tail's owners first (most rows beyond the budget, then highest p99; percentiles exact to the second)\n{t}\n",
            self.groups.len()
        )
    }
}

pub(super) fn histogram_table(buckets: &[Bucket], unit: Unit, total: u64) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(vec![unit_name(unit), "rows", "% of rows"]);
    let shown = buckets.len().min(TEXT_BUCKETS);
    for b in &buckets[..shown] {
        t.add_row(vec![
            b.late.to_string(),
            count(b.rows),
            pct_text(pct(b.rows, total)),
        ]);
    }
    if buckets.len() > shown {
        let rest: u64 = buckets[shown..].iter().map(|b| b.rows).sum();
        let last = buckets.last().map_or(0, |b| b.late);
        t.add_row(vec![
            format!("{}..{last}", buckets[shown].late),
            count(rest),
            pct_text(pct(rest, total)),
        ]);
    }
    for i in 0..3 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    format!("{t}\n")
}

pub(super) fn days_table(points: &[DayPoint]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(vec!["arrived by", "rows", "% complete"]);
    let label = |d: i64| {
        if d == 0 {
            "D+0 (same day)".to_string()
        } else {
            format!("D+{d}")
        }
    };
    let shown = points.len().min(TEXT_DAYS);
    for p in &points[..shown] {
        t.add_row(vec![
            label(p.days_late),
            count(p.rows),
            pct_text(p.pct_complete),
        ]);
    }
    let mut note = String::new();
    if points.len() > shown {
        // The tail in one line per milestone: the day 99.9% / 99.99% / 100% is reached.
        let last_day = points.last().map_or(0, |p| p.days_late);
        note = format!(
            "(after D+{}: only the days 99.9%, 99.99% and 100% are reached, of D+{} … D+{last_day}; --output json has every day)\n",
            points[shown - 1].days_late,
            points[shown].days_late
        );
        let mut last_shown = points[shown - 1].pct_complete;
        for milestone in [99.9, 99.99, 100.0] {
            if last_shown >= milestone {
                continue;
            }
            if let Some(p) = points[shown..].iter().find(|p| p.pct_complete >= milestone) {
                t.add_row(vec![
                    format!("… {}", label(p.days_late)),
                    count(p.rows),
                    pct_text(p.pct_complete),
                ]);
                last_shown = p.pct_complete;
            }
        }
    }
    for i in 0..3 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    format!("{t}\n{note}")
}

/// A row count with its separators and `row`/`rows`.
fn rows_text(n: u64) -> String {
    format!("{} row{}", count(n), if n == 1 { "" } else { "s" })
}
