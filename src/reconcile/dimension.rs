//! `tidemark reconcile` for `kind: dimension`: is the table what a fresh fold of the whole
//! source gives?
//!
//! The dimension's own full reload is run as a dry run — every record of the source folded into
//! versions (SCD2) or rows (SCD1), placeholders for keys the facts name first, compared with the
//! table key by key — and nothing is written. The runs that built the table folded the same
//! records a few keys at a time, in whatever order they landed; a key whose rows differ from
//! the fold of all its records at once is a wrong answer, listed by name.

use serde::Serialize;

use super::ReconcileError;
use crate::clock::Clock;
use crate::config::pipeline::Dimension;
use crate::config::Pipeline;
use crate::dimension::DimensionCounters;
use crate::lake;
use crate::run::{Engine, Phase, RunError, RunOptions};

/// What `reconcile` found for a dimension.
#[derive(Debug, Clone, Serialize)]
pub struct DimensionReport {
    pub pipeline: String,
    pub kind: &'static str,
    pub target_uri: String,
    pub target_version: Option<u64>,
    pub source_uri: String,
    pub source_version: Option<u64>,
    /// Keys in the table or the source.
    pub num_keys_read: u64,
    /// Rows of the table, and of the fresh fold.
    pub num_rows_table: u64,
    pub num_rows_fold: u64,
    /// Keys whose rows differ from the fold (missing, extra or different versions).
    pub num_keys_differing: u64,
    /// The first `--limit` of them.
    pub keys_differing: Vec<String>,
    pub notes: Vec<String>,
    pub identical: bool,
}

/// Compares the dimension table of `p` with a fresh fold of its whole source.
pub async fn reconcile(
    p: &Pipeline,
    d: &Dimension,
    limit: usize,
    var_args: &str,
    clock: &dyn Clock,
    engine: &Engine,
) -> Result<DimensionReport, ReconcileError> {
    let Some(table) = lake::open_if_exists(&d.target_uri)
        .await
        .map_err(RunError::from)?
    else {
        return Err(ReconcileError::NoTarget {
            target: d.target_uri.clone(),
            pipeline: format!("{}{var_args}", p.path.display()),
        });
    };
    let mut notes = Vec::new();
    let source = lake::open_required(&d.source_uri, "source")
        .await
        .map_err(RunError::from)?;
    let read = lake::record::read(&table, &p.app_id())
        .await
        .map_err(RunError::delta(Phase::Reconcile, &d.target_uri))?
        .version;
    let latest = source.version();
    if read.and_then(|v| u64::try_from(v).ok()) != latest {
        notes.push(format!(
            "the table's last run read source version {}, the source is at {}: the keys of records landed since differ until the next run (run the pipeline, then reconcile, for a check of everything)",
            read.map_or("-".into(), |v| v.to_string()),
            latest.map_or("-".into(), |v| v.to_string())
        ));
    }
    let opts = RunOptions {
        full_reload: true,
        dry_run: true,
        var_args: var_args.to_string(),
        ..RunOptions::default()
    };
    let summary = crate::pipeline::run(p, &opts, clock, engine).await?;
    let c = summary
        .counters
        .get::<DimensionCounters>()
        .cloned()
        .unwrap_or_default();
    Ok(DimensionReport {
        pipeline: p.name.clone(),
        kind: "dimension",
        target_uri: d.target_uri.clone(),
        target_version: table.version(),
        source_uri: d.source_uri.clone(),
        source_version: summary.source_version,
        num_keys_read: c.num_keys_read,
        num_rows_table: c.num_rows_before,
        num_rows_fold: c.num_rows_after,
        num_keys_differing: c.num_keys_changed,
        keys_differing: c.changed_keys.into_iter().take(limit).collect(),
        notes,
        identical: c.num_keys_changed == 0,
    })
}

impl DimensionReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "reconcile {} (dimension): {} (version {}, {} rows) against a fold of every record of {} (version {}: {} rows)\n",
            self.pipeline,
            self.target_uri,
            self.target_version.map_or("-".into(), |v| v.to_string()),
            self.num_rows_table,
            self.source_uri,
            self.source_version.map_or("-".into(), |v| v.to_string()),
            self.num_rows_fold,
        );
        match self.identical {
            true => out.push_str(&format!(
                "identical: all {} keys have the rows a fold of their records gives\n",
                self.num_keys_read
            )),
            false => {
                out.push_str(&format!(
                    "{} key(s) differ (missing, extra or different versions); the first:\n",
                    self.num_keys_differing
                ));
                for k in &self.keys_differing {
                    out.push_str(&format!("  {k}\n"));
                }
            }
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }

    /// `Ok(rendered)` when the table is right, else the error carrying the rendered report.
    pub fn into_result(self, rendered: String, pipeline: &str) -> Result<String, ReconcileError> {
        if self.identical {
            return Ok(rendered);
        }
        Err(ReconcileError::Mismatch(Box::new(super::Mismatch {
            summary: format!(
                "dimension {} is not what its source says: {} key(s) differ from a fold of every record",
                self.target_uri, self.num_keys_differing
            ),
            advice: format!("Rebuild it with `tidemark run {pipeline} --full-reload` (placeholders kept), or find the last good version with `tidemark history {pipeline}` and `tidemark restore` (docs/operations/runbook.md)"),
            stdout: rendered,
        })))
    }
}
