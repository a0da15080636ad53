//! Running a pipeline, whatever its kind: the one entry point ([`run`]) that `tidemark run`,
//! `tidemark job run`, the scheduler and the demo call. It stands above the kinds: it picks the
//! kind's implementation of [`crate::run::RunKind`] (each kind's folder has one) and runs it in
//! the attempt harness, and plans again when an attempt lost a commit race.
//!
//! Adding a kind: a folder with its `impl RunKind`, and its line in the list of kinds
//! (`config/pipeline/kinds.rs`, with its settings' file beside it); `with_spec!` reaches every
//! kind listed there.

pub mod maintain;

use futures::FutureExt;
use tracing::{info_span, warn, Instrument};

use crate::clock::Clock;
use crate::config::pipeline::with_spec;
use crate::config::Pipeline;
use crate::report::RunSummary;
use crate::run::{attempt, Engine, RunError, RunKind, RunOptions, Table};

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
        let (now, id) = (clock.now(), run_id.clone());
        let once =
            with_spec!(&pipeline.spec, k => attempt(k, pipeline, opts, now, engine, id).boxed());
        let attempt = once.instrument(span.clone()).await;
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

/// The tables `pipeline` writes, with the part each plays (the target first): what `restore`
/// and `maintain` act on together.
pub fn tables(pipeline: &Pipeline) -> Vec<(Table, String)> {
    let owned = with_spec!(&pipeline.spec, k => k.tables());
    owned
        .into_iter()
        .map(|(t, uri)| (t, uri.to_string()))
        .collect()
}

/// The tables that go back with the target in a restore: every table the pipeline writes but
/// the target, the quarantine (which keeps what was rejected, whatever the target's version)
/// and an aggregate's late rows (which keep what arrived late, whatever gold's version).
pub fn companions(pipeline: &Pipeline) -> Vec<(Table, String)> {
    tables(pipeline)
        .into_iter()
        .filter(|(t, _)| !matches!(t, Table::Target | Table::Quarantine | Table::LateRows))
        .collect()
}
