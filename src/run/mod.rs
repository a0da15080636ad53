//! Running a pipeline, whatever its kind: the one entry point (`run`) that `tidemark run`,
//! `tidemark job run`, the scheduler and the demo all call, and the stages every kind shares —
//! the engine session, column roles, validation, quarantine, dedup, errors and phases.
//!
//! What a kind does lives in its own module (`crate::merge` for `cdc_merge`); adding a kind
//! adds an arm to [`run`] and touches nothing inside another kind.

pub(crate) mod dedup;
pub mod definition;
mod error;
pub mod expect;
pub(crate) mod once;
pub mod phase;
pub(crate) mod quarantine;
pub(crate) mod render;
pub mod roles;
mod session;
mod spill;
pub(crate) mod tally;
pub(crate) mod validate;

use tracing::{info_span, warn, Instrument};

pub use dedup::{winners as dedup_winners, DedupCounts, Deduper};
pub use error::RunError;
pub use phase::Phase;
pub use roles::ColumnRoles;
pub(crate) use session::frame;
pub use session::{default_spill_base, sweep_spill_dirs, Engine, EngineError};

use crate::clock::Clock;
use crate::config::pipeline::Spec;
use crate::config::Pipeline;
use crate::report::RunSummary;

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rebuild the target from the whole source in one overwrite commit.
    pub full_reload: bool,
    /// Plan and count everything, write nothing.
    pub dry_run: bool,
    /// `aggregate`: the run's logical date (default: today in the pipeline's time zone).
    pub logical_date: Option<chrono::NaiveDate>,
    /// `aggregate`: restate exactly these event days (inclusive), on purpose.
    pub restate_from: Option<chrono::NaiveDate>,
    pub restate_to: Option<chrono::NaiveDate>,
    /// The run's `--var` arguments as a shell would take them back (` --var k=v`), for the
    /// commands a message suggests.
    pub var_args: String,
}

/// How often a run that lost a commit race is planned again before it gives up with the
/// retryable exit code. Each re-plan reads the winner's commit, so the loser never overwrites it.
pub const MAX_REPLANS: u32 = 3;

/// Runs `pipeline` once. On success its target has at most one new commit; on error nothing was
/// committed to it. A run that lost a commit race to another writer is planned again from the
/// new snapshot, up to [`MAX_REPLANS`] times.
pub async fn run(
    pipeline: &Pipeline,
    opts: &RunOptions,
    clock: &dyn Clock,
    engine: &Engine,
) -> Result<RunSummary, RunError> {
    let run_id = uuid::Uuid::now_v7().to_string();
    let span =
        info_span!("run", run_id = %run_id, pipeline = %pipeline.name, kind = %pipeline.kind());
    let mut replans = 0;
    let started = std::time::Instant::now();
    loop {
        let attempt = match &pipeline.spec {
            Spec::CdcMerge(m) => {
                crate::merge::run_once(pipeline, m, opts, clock.now(), engine, run_id.clone())
                    .instrument(span.clone())
                    .await
            }
            Spec::Ingest(i) => {
                crate::ingest::run_once(pipeline, i, opts, clock.now(), engine, run_id.clone())
                    .instrument(span.clone())
                    .await
            }
            Spec::Aggregate(a) => {
                crate::aggregate::run_once(pipeline, a, opts, clock.now(), engine, run_id.clone())
                    .instrument(span.clone())
                    .await
            }
            Spec::Dimension(d) => {
                crate::dimension::run_once(pipeline, d, opts, clock.now(), engine, run_id.clone())
                    .instrument(span.clone())
                    .await
            }
        };
        match attempt {
            Err(e) if e.is_commit_conflict() && replans < MAX_REPLANS => {
                replans += 1;
                warn!(parent: &span, cause = %e.race_cause(), replans, "another writer committed first; planning the run again from the new snapshot");
            }
            Ok(mut summary) => {
                summary.num_replans = replans;
                // The whole run, the attempts that lost a commit race included.
                summary.duration_ms = started.elapsed().as_millis() as u64;
                return Ok(summary);
            }
            Err(e) => return Err(e),
        }
    }
}
