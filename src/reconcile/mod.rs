//! `tidemark reconcile`: is the target exactly the newest version per key of its source?
//!
//! This is the check a finance team runs after an incident, and the oracle our own tests lean
//! on. The expected side is computed the way a full reload computes it — the same validation
//! (with the same clock, so future-dated rows are left out alike), the same canonical projection
//! and sort, the same streaming [`Deduper`] — from the source version the target's last run
//! recorded when the source only appended since (rows that landed later are not "missing"), and
//! from its current version when it was rewritten or replaced since, so rows another writer
//! deleted upstream show as differences; the report says which version it used. The target is read sorted by
//! key, and the two sorted streams are merge-joined on encoded keys: memory holds one batch per
//! side and the per-day aggregates, never a whole table.

pub mod aggregate;
mod differs;
pub mod dimension;
pub mod ingest;
mod join;
mod report;
mod stats;

use join::{live_only, Join};

use std::cmp::Ordering;
use std::pin::Pin;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::row::{OwnedRow, Row, RowConverter, Rows, SortField};
use futures::{Stream, StreamExt};

pub use report::{DiffCounts, DiffKind, ReconcileReport};

use self::report::{CellDiff, DiffKey};
use self::stats::{Aggregator, Side};
use crate::clock::Clock;
use crate::config::pipeline::CdcMerge;
use crate::config::pipeline::DELETED_COLUMN;
use crate::config::Pipeline;
use crate::error::{Classify, ErrorClass};
use crate::keyed::{dedup_winners, validate, ColumnRoles, Deduper};
use crate::lake;
use crate::lake::storage::cast_to;
use crate::run::render::{render_key, render_value};
use crate::run::Phase;
use crate::run::{Engine, RunError};
use deltalake::DeltaTable;

/// What the caller asked for.
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// How many differing keys to list (all of them are counted).
    pub limit: usize,
    /// The `--var` arguments the user passed, as they go on a command line (` --var lake=/x`):
    /// the commands a message suggests carry them, so they can be pasted.
    pub var_args: String,
}

/// Default of `--limit`: enough keys to start an investigation, few enough to read.
pub const DEFAULT_LIMIT: usize = 20;

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            limit: DEFAULT_LIMIT,
            var_args: String::new(),
        }
    }
}

/// Why a reconciliation could not say "identical".
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Reading or validating a side failed (missing table, bad config, query error).
    #[error(transparent)]
    Run(#[from] RunError),
    /// A side's rows did not come in key order: the merge-join would give wrong answers.
    #[error("reconcile: the {side} rows did not arrive in key order (at key {key}); this is a bug in tidemark")]
    Unsorted { side: &'static str, key: String },
    /// The target does not exist yet: nothing to compare before the pipeline's first run.
    #[error("target {target} does not exist yet: there is nothing to reconcile before the pipeline's first run. Run the pipeline first (`tidemark run {pipeline}`), then reconcile")]
    NoTarget { target: String, pipeline: String },
    /// The target is not what a full reload of its source would write. `stdout` holds the
    /// rendered report, which the binary prints before this message.
    #[error("target {} differs from the newest row per key of its source: {} key(s) differ ({}) and {} day/group bucket(s) disagree. {}", .0.target, .0.keys, .0.detail, .0.buckets, .0.advice)]
    Differs(Box<Differs>),
    /// An aggregate's or a dimension's table is not what its source says: `summary` says how,
    /// `advice` what to do; `stdout` holds the rendered report.
    #[error("{}. {}", .0.summary, .0.advice)]
    Mismatch(Box<Mismatch>),
}

/// A cdc_merge target that is not what a full reload would write.
#[derive(Debug)]
pub struct Differs {
    pub target: String,
    pub pipeline: String,
    pub keys: u64,
    pub detail: String,
    pub buckets: usize,
    /// What to do: fix the target, or — when the source was rewritten since the target's last
    /// run — look at the source first.
    pub advice: String,
    /// The rendered report, printed before the message.
    pub stdout: String,
}

/// An aggregate's, a dimension's or an ingest's table that is not what its source says.
#[derive(Debug)]
pub struct Mismatch {
    pub summary: String,
    pub advice: String,
    /// The rendered report, printed before the message.
    pub stdout: String,
}

impl Classify for ReconcileError {
    fn class(&self) -> ErrorClass {
        match self {
            ReconcileError::Run(e) => e.class(),
            ReconcileError::Unsorted { .. } => ErrorClass::Internal,
            ReconcileError::Differs(_) | ReconcileError::Mismatch(_) => ErrorClass::BadData,
            ReconcileError::NoTarget { .. } => ErrorClass::Unavailable,
        }
    }
}

impl ReconcileError {
    /// The report to print on stdout even though the command fails.
    pub fn stdout(&self) -> Option<&str> {
        match self {
            ReconcileError::Differs(d) => Some(&d.stdout),
            ReconcileError::Mismatch(m) => Some(&m.stdout),
            _ => None,
        }
    }
}

impl ReconcileReport {
    /// `Ok(rendered)` when the target is identical, else the error carrying the rendered report.
    /// `var_args` are the user's `--var`s, repeated in the suggested commands.
    pub fn into_result(self, rendered: String, var_args: &str) -> Result<String, ReconcileError> {
        if self.identical {
            return Ok(rendered);
        }
        let d = &self.differing_keys;
        let pipeline = format!("{}{var_args}", self.pipeline_file);
        let target = &self.target_uri;
        // (a source rewritten behind the pipeline's back: a full reload would copy that in)
        let upstream = self.notes.iter().any(|n| {
            n.contains("no longer append-only")
                || n.contains("not the table the target was built from")
        });
        let advice = match upstream {
            true => format!("The source {} was rewritten or replaced since the target's last run (see the notes): check it first — `tidemark reconcile` and `tidemark history` of the pipeline that writes it, and `tidemark restore` there if that rewrite was a mistake; a `--full-reload` of this target copies the source as it is now (docs/operations/runbook.md)", self.source_uri),
            false => format!("Find the last good version with `tidemark history {target}` and `tidemark restore {target} --version N`, or rebuild the target with `tidemark run {pipeline} --full-reload` (docs/operations/runbook.md)"),
        };
        Err(ReconcileError::Differs(Box::new(Differs {
            target: self.target_uri.clone(),
            pipeline,
            advice,
            keys: d.total(),
            detail: d.detail(),
            buckets: self.buckets_differing,
            stdout: rendered,
        })))
    }
}

type BatchStream = Pin<Box<dyn Stream<Item = Result<RecordBatch, ReconcileError>> + Send>>;

fn arrow_err(e: ArrowError) -> ReconcileError {
    if let ArrowError::ComputeError(m) = &e {
        if m.contains(stats::SUM_OVERFLOW) {
            return RunError::DecimalOverflow {
                detail: format!("a day's total, as `reconcile` sums it: {m}"),
            }
            .into();
        }
    }
    RunError::Arrow {
        phase: Phase::Reconcile,
        source: e,
    }
    .into()
}

/// Compares the target of the `cdc_merge` pipeline `p` (its settings `m`) with the newest row
/// per key of its source.
pub async fn reconcile(
    p: &Pipeline,
    m: &CdcMerge,
    opts: &ReconcileOptions,
    clock: &dyn Clock,
    engine: &Engine,
) -> Result<ReconcileReport, ReconcileError> {
    let q = RunError::query;
    let now = clock.now();
    let ctx = engine.context();
    let target = match lake::open_if_exists(&m.target_uri)
        .await
        .map_err(RunError::from)?
    {
        Some(t) => t,
        None => {
            return Err(ReconcileError::NoTarget {
                target: m.target_uri.clone(),
                pipeline: format!("{}{}", p.path.display(), opts.var_args),
            })
        }
    };
    let mut source = lake::open_required(&m.source_uri, "source")
        .await
        .map_err(RunError::from)?;
    let mut notes = Vec::new();
    let basis = compared_version(p, m, &target, &mut source, &mut notes).await?;
    let source_version = source.version().unwrap_or(0);

    // Expected: exactly what a full reload would write.
    source
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(Phase::Reconcile, &m.source_uri))?;
    target
        .update_datafusion_session(&ctx.state())
        .map_err(RunError::delta(Phase::Reconcile, &m.target_uri))?;
    let source_provider = source.table_provider().await.map_err(q(Phase::Reconcile))?;
    let source_schema = source_provider.schema();
    let roles = ColumnRoles::new(p, m, &source_schema).map_err(RunError::from)?;
    let seq_type = source_schema
        .field_with_name(roles.sequence())
        .map(|f| f.data_type().clone())
        .map_err(|e| RunError::query(Phase::Reconcile)(e.into()))?;
    let input = ctx
        .read_table(source_provider)
        .map_err(q(Phase::Reconcile))?;
    // The rows a full reload would quarantine for an expectation are left out alike.
    let rules = crate::keyed::expect::compile(p, &m.expectations, &input)?;
    // ... and so are the keys whose tombstones `maintain` removed.
    let (input, guard) =
        crate::merge::tombstones::annotate(&ctx, input, m, &roles, &seq_type, true).await?;
    let split = validate::split(
        input,
        &roles,
        &seq_type,
        validate::due_micros(now, m.max_future_skew),
        &rules,
        guard.as_ref(),
    )?;
    let expected = expected(split.valid, &roles, &m.source_uri).await?;
    let actual = actual(&ctx, &target, &roles, &m.target_uri).await?;

    let mut join = Join::new(&roles, m, opts.limit, &mut notes).map_err(arrow_err)?;
    join.run(expected, actual).await?;
    Ok(report::build(
        p,
        m,
        report::Versions {
            source: source_version,
            basis,
            target: target.version(),
        },
        now,
        join,
        opts.limit,
        notes,
    ))
}

/// Which source version to compare with (loaded into `source`), and why: the one the target's
/// last run read, when the source only appended since (rows that landed later are not
/// "missing"); the current one when the source was rewritten or replaced since — rows another
/// writer deleted upstream must show as differences, not be compared away.
async fn compared_version(
    p: &Pipeline,
    m: &CdcMerge,
    target: &DeltaTable,
    source: &mut DeltaTable,
    notes: &mut Vec<String>,
) -> Result<&'static str, ReconcileError> {
    let latest = source.version().unwrap_or(0);
    let recorded = lake::record::read(target, &p.app_id())
        .await
        .map_err(RunError::delta(Phase::Reconcile, &m.target_uri))?;
    let table_id =
        lake::record::table_id(source).map_err(RunError::delta(Phase::Reconcile, &m.source_uri))?;
    let mut basis = "latest";
    let replaced = recorded
        .table
        .is_some_and(|t| t != lake::record::table_fingerprint(&table_id));
    if replaced {
        notes.push(format!("the source is not the table the target was built from (its table id is now {table_id}): it was recreated or replaced since the target's last run; compared with its latest version"));
    }
    match recorded.version {
        Some(v) if replaced || v < 0 => {}
        Some(v) if (v as u64) == latest => basis = "recorded by the target's last run",
        Some(v) if (v as u64) < latest => {
            let since = lake::files_added_between(source, v as u64, latest).await;
            match since {
                Ok(added) if added.complete && added.rewrites.is_empty() => {
                    match source.load_version(v as u64).await {
                        Ok(()) => basis = "recorded by the target's last run",
                        Err(e) => {
                            *source = lake::open_required(&m.source_uri, "source")
                                .await
                                .map_err(RunError::from)?;
                            notes.push(format!("the source version the target's last run read ({v}) cannot be loaded ({e}); compared with the latest version, so rows landed since that run show as missing"));
                        }
                    }
                }
                Ok(added) if !added.rewrites.is_empty() => {
                    for r in &added.rewrites {
                        notes.push(format!("source commit {} ({}) removed {} data file(s) after version {v}, which the target's last run read: the source is no longer append-only, so the target is compared with the latest version; only `--full-reload` brings it back in line", r.version, r.operation.as_deref().unwrap_or("unknown"), r.files_removed));
                    }
                }
                _ => notes.push(format!("the source commits after version {v} (read by the target's last run) are no longer in the log, so whether they only appended cannot be checked; compared with the latest version, so rows landed since that run show as missing")),
            }
        }
        Some(v) => notes.push(format!(
            "the target records source version {v} for {}, which the source does not have; compared with the latest version",
            p.app_id()
        )),
        None => notes.push(format!("the target records no source version for {} (not written by this pipeline?); compared with the latest source version", p.app_id())),
    }
    Ok(basis)
}

/// The newest row per key of the valid source rows, in key order (live rows only with hard
/// deletes), cast to the canonical columns.
async fn expected(
    valid: datafusion::prelude::DataFrame,
    roles: &ColumnRoles,
    source_uri: &str,
) -> Result<BatchStream, ReconcileError> {
    let q = RunError::query;
    let sorted = valid
        .select(roles.canonical_exprs())
        .and_then(|df| df.sort(roles.dedup_sort()))
        .map_err(q(Phase::Reconcile))?
        .execute_stream()
        .await
        .map_err(q(Phase::Reconcile))?;
    let deduper = Deduper::new(roles).map_err(arrow_err)?;
    let canonical = roles.canonical.clone();
    let hard = roles.hard_deletes();
    let source_uri = source_uri.to_string();
    let sorted = sorted.map(move |batch| {
        let batch = batch.map_err(RunError::scan(Phase::Reconcile, &source_uri))?;
        cast_to(&batch, &canonical).map_err(arrow_err)
    });
    Ok(Box::pin(
        dedup_winners(sorted, deduper, None, arrow_err).map(
            move |winners: Result<RecordBatch, ReconcileError>| {
                let winners = winners?;
                if hard {
                    live_only(&winners).map_err(arrow_err)
                } else {
                    Ok(winners)
                }
            },
        ),
    ))
}

/// The target's rows in key order, cast to the canonical columns (a target whose columns no
/// longer match the pipeline's cannot be compared).
async fn actual(
    ctx: &datafusion::prelude::SessionContext,
    target: &DeltaTable,
    roles: &ColumnRoles,
    target_uri: &str,
) -> Result<BatchStream, ReconcileError> {
    let q = RunError::query;
    let target_provider = target.table_provider().await.map_err(q(Phase::Reconcile))?;
    if let Some(diff) = roles.target_schema_diff(&target_provider.schema()) {
        return Err(RunError::SchemaDrift {
            uri: target_uri.to_string(),
            message: format!(
                "{diff}; the target cannot be compared column by column. If the pipeline changed on purpose, rebuild with `--full-reload`"
            ),
        }
        .into());
    }
    let actual = ctx
        .read_table(target_provider)
        .and_then(|df| df.select(roles.target_exprs()))
        .and_then(|df| df.sort(roles.key_sort()))
        .map_err(q(Phase::Reconcile))?
        .execute_stream()
        .await
        .map_err(q(Phase::Reconcile))?;
    let canonical = roles.canonical.clone();
    Ok(Box::pin(actual.map(move |batch| {
        let batch = batch.map_err(q(Phase::Reconcile))?;
        cast_to(&batch, &canonical).map_err(arrow_err)
    })))
}
