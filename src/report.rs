//! The run summary: what a run read, rejected, changed and committed.
//!
//! People get a short aligned text; machines get one JSON object on stdout. Logs never go to
//! stdout, so `--output json` can be piped straight into `jq` or a ledger.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::pipeline::Kind;

/// How a run treated the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// The target was missing or empty: built from the whole source.
    Bootstrap,
    /// The normal hourly run: only the slice behind the watermark and the newly landed rows.
    Incremental,
    /// Rebuilt from the whole source on request, in one overwrite commit.
    FullReload,
}

impl std::fmt::Display for RunMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunMode::Bootstrap => "bootstrap",
            RunMode::Incremental => "incremental",
            RunMode::FullReload => "full_reload",
        })
    }
}

/// Everything a run did, as counted while doing it: a header every kind fills, then the
/// kind's own counters (flattened: the JSON is one flat object).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub pipeline: String,
    /// The pipeline's kind (`cdc_merge`).
    pub kind: Kind,
    pub mode: RunMode,
    pub dry_run: bool,
    pub source_uri: String,
    pub target_uri: String,
    /// Source table version this run read (pinned for the whole run); null for an ingest,
    /// which reads landing files.
    pub source_version: Option<u64>,
    /// Target version this run committed; null when nothing was committed.
    pub target_version: Option<u64>,
    pub num_source_rows_read: u64,
    /// Rows rejected by validation in this run's read (each stored in the quarantine table once).
    pub num_quarantined: u64,
    /// Of those, rows not already in the quarantine table (written by this run).
    pub num_quarantined_new: u64,
    pub num_files_added: u64,
    pub num_files_removed: u64,
    /// Times the run lost a commit race to another writer and planned again.
    pub num_replans: u32,
    pub duration_ms: u64,
    /// Milliseconds per phase, in the order they ran.
    pub phases_ms: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    /// What this kind counts.
    #[serde(flatten)]
    pub counters: Counters,
}

/// A kind's counters, whatever the kind: JSON flattened into the summary and the commit's facts,
/// lines of text, and what the ledger's typed columns hold. Each kind's struct lives in its
/// folder and implements [`CounterText`]; this module knows no kind.
#[derive(Debug, Clone)]
pub struct Counters(std::sync::Arc<dyn KindCounters>);

impl Counters {
    pub fn new(c: impl KindCounters) -> Self {
        Counters(std::sync::Arc::new(c))
    }

    /// The counters as the kind's own type, when they are of that kind.
    pub fn get<T: KindCounters>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    pub fn inner(&self) -> &dyn KindCounters {
        self.0.as_ref()
    }
}

impl Serialize for Counters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // (through the kind's own `Serialize`: its fields in their order, not a JSON map's)
        erased_serde::serialize(self.0.erased(), s)
    }
}

/// What the summary needs of a kind's counters ([`CounterText`] gives it to every
/// serializable counter struct).
pub trait KindCounters: std::fmt::Debug + Send + Sync + 'static {
    /// The counters as one JSON object.
    fn to_json(&self) -> serde_json::Value;
    /// The counters' own serialization.
    fn erased(&self) -> &dyn erased_serde::Serialize;
    /// The summary's lines for these counters, given the header.
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)>;
    /// The headline of a run that committed nothing.
    fn no_commit(&self, s: &RunSummary) -> String;
    /// The ledger's typed columns.
    fn ledger(&self) -> LedgerCounts;
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A kind's counters as people read them: implement this, and the struct is a
/// [`KindCounters`].
pub trait CounterText: Serialize + std::fmt::Debug + Send + Sync + 'static {
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)>;
    fn no_commit(&self, _s: &RunSummary) -> String {
        "nothing to change: no commit".to_string()
    }
    fn ledger(&self) -> LedgerCounts;
}

impl<T: CounterText> KindCounters for T {
    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
    fn erased(&self) -> &dyn erased_serde::Serialize {
        self
    }
    fn lines(&self, s: &RunSummary) -> Vec<(&'static str, String)> {
        CounterText::lines(self, s)
    }
    fn no_commit(&self, s: &RunSummary) -> String {
        CounterText::no_commit(self, s)
    }
    fn ledger(&self) -> LedgerCounts {
        CounterText::ledger(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The ledger's typed count columns (what `tidemark runs` shows as in/upd/del): each kind
/// fills those that mean something for it.
#[derive(Debug, Clone, Default)]
pub struct LedgerCounts {
    pub watermark_before: Option<DateTime<Utc>>,
    pub watermark_after: Option<DateTime<Utc>>,
    pub inserted: Option<u64>,
    pub updated: Option<u64>,
    pub deleted: Option<u64>,
    pub unchanged: Option<u64>,
    pub deferred: Option<u64>,
    pub late_rows: Option<u64>,
    pub conflicts: Option<u64>,
    pub superseded: Option<u64>,
    pub duplicates: Option<u64>,
    pub expectations: Vec<ExpectationOutcome>,
}

/// What a rule found in a run's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectationOutcome {
    pub name: String,
    pub on_fail: &'static str,
    /// Rows read by the run that failed the rule.
    pub failed: u64,
}

impl RunSummary {
    /// A run's header before it did anything: every count zero, no commit yet, the kind's
    /// counters empty.
    pub fn new(
        run_id: String,
        pipeline: &str,
        kind: Kind,
        dry_run: bool,
        (source_uri, target_uri): (&str, &str),
        counters: Counters,
    ) -> Self {
        RunSummary {
            run_id,
            pipeline: pipeline.to_string(),
            kind,
            mode: RunMode::Incremental,
            dry_run,
            source_uri: source_uri.to_string(),
            target_uri: target_uri.to_string(),
            source_version: None,
            target_version: None,
            num_source_rows_read: 0,
            num_quarantined: 0,
            num_quarantined_new: 0,
            num_files_added: 0,
            num_files_removed: 0,
            num_replans: 0,
            duration_ms: 0,
            phases_ms: BTreeMap::new(),
            warnings: Vec::new(),
            counters,
        }
    }
}

pub use crate::clock::{rfc3339, rfc3339_ms};

/// Serializes a time as [`rfc3339`].
pub fn ser_time<S: serde::Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(t))
}

/// Serializes an optional time as [`rfc3339`] or null.
pub fn rfc3339_opt<S: serde::Serializer>(
    t: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(t)),
        None => s.serialize_none(),
    }
}

/// `n` with `row` or `rows`, as a count reads: "1 row", "0 rows", "5 rows".
pub fn rows(n: u64) -> String {
    match n {
        1 => "1 row".to_string(),
        n => format!("{n} rows"),
    }
}

/// A time in a summary line, `-` when there is none.
pub fn fmt_time(t: &Option<DateTime<Utc>>) -> String {
    t.map(|t| rfc3339(&t)).unwrap_or_else(|| "-".to_string())
}

impl RunSummary {
    /// The summary as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The line of the source version read, and the one the previous run read.
    pub fn source_version_text(&self, previous: Option<String>) -> String {
        format!(
            "{} (previous run read {})",
            self.source_version.unwrap_or_default(),
            previous.unwrap_or_else(|| "-".to_string())
        )
    }

    /// The line of quarantined rows, as every kind prints it.
    pub fn quarantined_text(&self) -> String {
        format!(
            "{} ({} new)",
            self.num_quarantined, self.num_quarantined_new
        )
    }

    /// The line of files added and removed, as every kind prints it.
    pub fn files_text(&self) -> String {
        format!("{}/{}", self.num_files_added, self.num_files_removed)
    }

    /// The summary for people: a headline and aligned counts.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let outcome = match (self.dry_run, self.target_version) {
            (true, _) => "dry run: nothing written".to_string(),
            (false, Some(v)) => format!("committed target version {v}"),
            (false, None) => self.counters.inner().no_commit(self),
        };
        let _ = writeln!(
            out,
            "{} {} run {} — {} ({} ms)",
            self.pipeline, self.mode, self.run_id, outcome, self.duration_ms
        );
        let rows = self.counters.inner().lines(self);
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        if !self.phases_ms.is_empty() {
            // In the order a run executes them; a phase not named there comes last.
            let rank = |k: &str| {
                crate::phase::Phase::TIMED
                    .iter()
                    .position(|p| p.as_str() == k)
                    .unwrap_or(usize::MAX)
            };
            let mut phases: Vec<(&String, &u64)> = self.phases_ms.iter().collect();
            phases.sort_by_key(|(k, _)| rank(k));
            let phases: Vec<String> = phases
                .into_iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "  {:<width$}  {}", "phases (ms)", phases.join(", "));
        }
        for w in &self.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
        out
    }
}

/// A byte count as people read it: `512MiB` when a unit divides it, else `1.2MiB (1234567
/// bytes)` — never a bare count of bytes in a message.
pub fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (u, n) in UNITS {
        if bytes >= n && bytes.is_multiple_of(n) {
            return format!("{}{u}", bytes / n);
        }
    }
    match UNITS.iter().find(|(_, n)| bytes >= *n) {
        Some((u, n)) => format!("{:.1}{u} ({bytes} bytes)", bytes as f64 / *n as f64),
        None => format!("{bytes}B"),
    }
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn sizes_read_as_units() {
        assert_eq!(super::size(512 << 20), "512MiB");
        assert_eq!(super::size(1_234_567), "1.2MiB (1234567 bytes)");
        assert_eq!(super::size(900), "900B");
    }
}
