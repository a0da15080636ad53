//! `tidemark reconcile` for `kind: ingest`: does bronze hold exactly what its landing files say?
//!
//! The ingest's own full reload is run as a dry run: every landing file the pipeline ingested
//! (they must all still be there) is parsed again into bronze's columns, and bronze's rows of
//! those files are compared with what the files give, as multisets per file. A row changed,
//! lost or added behind the pipeline's back differs; `_ingested_at` is not compared (a reload
//! keeps each file's first arrival).

use serde::Serialize;

use super::ReconcileError;
use crate::clock::Clock;
use crate::config::pipeline::ingest::Ingest;
use crate::config::Pipeline;
use crate::ingest::IngestCounters;
use crate::lake;
use crate::run::{Engine, RunError, RunOptions};

/// What `reconcile` found for an ingest.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub pipeline: String,
    pub kind: &'static str,
    pub target_uri: String,
    pub target_version: Option<u64>,
    pub landing_uri: String,
    /// Landing files parsed again, and the rows they give.
    pub num_files: u64,
    pub num_rows: u64,
    /// Rows that differ between bronze and the files (each way).
    pub num_rows_differing: u64,
    /// The first files they are in.
    pub files_differing: Vec<String>,
    pub identical: bool,
}

/// Compares bronze of the ingest `p` with its landing files parsed again.
pub async fn reconcile(
    p: &Pipeline,
    spec: &Ingest,
    limit: usize,
    var_args: &str,
    clock: &dyn Clock,
    engine: &Engine,
) -> Result<IngestReport, ReconcileError> {
    let Some(bronze) = lake::open_if_exists(&spec.target_uri)
        .await
        .map_err(RunError::from)?
    else {
        return Err(ReconcileError::NoTarget {
            target: spec.target_uri.clone(),
            pipeline: format!("{}{var_args}", p.path.display()),
        });
    };
    let opts = RunOptions {
        full_reload: true,
        dry_run: true,
        var_args: var_args.to_string(),
        ..RunOptions::default()
    };
    let summary = crate::pipeline::run(p, &opts, clock, engine).await?;
    let c = summary
        .counters
        .get::<IngestCounters>()
        .cloned()
        .unwrap_or_default();
    let differing = c.num_rows_differing.unwrap_or(0);
    Ok(IngestReport {
        pipeline: p.name.clone(),
        kind: "ingest",
        target_uri: spec.target_uri.clone(),
        target_version: bronze.version(),
        landing_uri: spec.landing_uri.clone(),
        num_files: c.num_files_ingested,
        num_rows: c.num_rows_written,
        num_rows_differing: differing,
        files_differing: c.files_differing.into_iter().take(limit).collect(),
        identical: differing == 0,
    })
}

impl IngestReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "reconcile {} (ingest): {} (version {}) against its {} landing file(s) under {} parsed again ({} rows)\n",
            self.pipeline,
            self.target_uri,
            self.target_version.map_or("-".into(), |v| v.to_string()),
            self.num_files,
            self.landing_uri,
            self.num_rows
        );
        match self.identical {
            true => {
                out.push_str("identical: bronze holds every row its files give, and nothing else\n")
            }
            false => {
                out.push_str(&format!(
                    "{} row(s) differ between bronze and its files (changed, lost or added behind the pipeline's back); in:\n",
                    self.num_rows_differing
                ));
                for f in &self.files_differing {
                    out.push_str(&format!("  {f}\n"));
                }
            }
        }
        out
    }

    /// `Ok(rendered)` when bronze is right, else the error carrying the rendered report.
    pub fn into_result(self, rendered: String, pipeline: &str) -> Result<String, ReconcileError> {
        if self.identical {
            return Ok(rendered);
        }
        Err(ReconcileError::Mismatch(Box::new(super::Mismatch {
            summary: format!(
                "bronze {} is not what its landing files say: {} row(s) differ",
                self.target_uri, self.num_rows_differing
            ),
            advice: format!("Rebuild its rows from the files with `tidemark run {pipeline} --full-reload` (each file keeps its first arrival; the pipelines reading bronze then need `--full-reload` too), or find the last good version with `tidemark history {pipeline}` and `tidemark restore` (docs/operations/runbook.md)"),
            stdout: rendered,
        })))
    }
}
