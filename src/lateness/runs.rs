//! `--runs`: the run ledger's late rows per day for one pipeline — rows each merge run found
//! behind its overlap, which the overlap alone would have missed — so a drift shows before it
//! hurts.

use std::collections::BTreeMap;

use comfy_table::{presets::UTF8_BORDERS_ONLY, CellAlignment, Table};
use serde::Serialize;

use super::LatenessError;
use crate::jobs::{Ledger, TaskStatus};

/// The `--runs --output json` object.
#[derive(Debug, Clone, Serialize)]
pub struct RunsTrend {
    pub pipeline: String,
    /// The ledger table's location.
    pub ledger: String,
    /// False when there is no ledger table (yet).
    pub ledger_exists: bool,
    /// Per UTC day of the attempts' start, oldest first.
    pub days: Vec<RunsDay>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunsDay {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Succeeded attempts (their counts are summed below).
    pub runs: u64,
    /// Attempts that did not succeed (failed, timed out, cancelled, skipped).
    pub not_succeeded: u64,
    pub rows_read: u64,
    /// Sum of `num_late_rows`.
    pub late_rows: u64,
    /// `late_rows / rows_read`, in %.
    pub late_pct: f64,
}

/// Reads the ledger at `<lake>/_tidemark/runs`.
pub async fn runs_trend(lake: &str, pipeline: &str) -> Result<RunsTrend, LatenessError> {
    let ledger = Ledger::for_lake(lake);
    let mut trend = RunsTrend {
        pipeline: pipeline.to_string(),
        ledger: ledger.uri().to_string(),
        ledger_exists: false,
        days: Vec::new(),
    };
    if crate::lake::open_if_exists(ledger.uri()).await?.is_none() {
        return Ok(trend);
    }
    trend.ledger_exists = true;
    // Every row (DataFusion takes the limit as an i64: usize::MAX would be -1).
    let rows = ledger.recent(None, u32::MAX as usize).await?;
    let mut days: BTreeMap<String, RunsDay> = BTreeMap::new();
    let succeeded = TaskStatus::Succeeded.as_str();
    for r in rows
        .iter()
        .filter(|r| r.pipeline.as_deref() == Some(pipeline) && r.attempt > 0)
    {
        let day = r.started_at.format("%Y-%m-%d").to_string();
        let d = days.entry(day.clone()).or_insert_with(|| RunsDay {
            day,
            runs: 0,
            not_succeeded: 0,
            rows_read: 0,
            late_rows: 0,
            late_pct: 0.0,
        });
        if r.status != succeeded {
            d.not_succeeded += 1;
            continue;
        }
        let n = |v: Option<i64>| v.unwrap_or(0).max(0) as u64;
        d.runs += 1;
        d.rows_read += n(r.num_source_rows_read);
        d.late_rows += n(r.num_late_rows);
    }
    for d in days.values_mut() {
        d.late_pct = if d.rows_read == 0 {
            0.0
        } else {
            100.0 * d.late_rows as f64 / d.rows_read as f64
        };
    }
    trend.days = days.into_values().collect();
    Ok(trend)
}

impl RunsTrend {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        if !self.ledger_exists {
            return format!(
                "no run ledger at {}: it is written by `tidemark job run`, `tidemark scheduler` and `tidemark demo` (not by a bare `tidemark run`); run pipeline {} through a bundle job (e.g. `tidemark job run payments_hourly`) to start one\n",
                self.ledger, self.pipeline
            );
        }
        if self.days.is_empty() {
            return format!(
                "the run ledger at {} has no runs of pipeline {} yet\n",
                self.ledger, self.pipeline
            );
        }
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header(vec![
            "day (UTC)",
            "runs",
            "not succeeded",
            "rows read",
            "late rows",
            "late %",
        ]);
        for d in &self.days {
            t.add_row(vec![
                d.day.clone(),
                d.runs.to_string(),
                d.not_succeeded.to_string(),
                d.rows_read.to_string(),
                d.late_rows.to_string(),
                format!("{:.2}%", d.late_pct),
            ]);
        }
        for i in 1..6 {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        format!(
            "late rows per day of pipeline {} (run ledger {}): rows each run found behind its overlap — the overlap alone would have missed them; a rising count means the overlap is too small (see `tidemark lateness {}`)\n{t}\n",
            self.pipeline, self.ledger, self.pipeline
        )
    }
}
