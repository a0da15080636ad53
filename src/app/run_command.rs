//! `tidemark run`: one run of a pipeline, or (`--every`) one run per period until stopped.

use std::future::Future;
use std::sync::Arc;

use super::{engine_of, load_pipeline, shell_var_args, upstream, AppError};
use crate::cli::{OutputFormat, PipelineVars, RunArgs};
use crate::clock::Clock;
use crate::config::Pipeline;
use crate::error::ErrorClass;
use crate::report::RunSummary;
use crate::run::{Engine, RunOptions};

/// The run's options from its arguments; the aggregate-only ones are refused for other kinds.
fn run_options(args: &RunArgs, pipeline: &Pipeline) -> Result<RunOptions, AppError> {
    let dated = args.logical_date.is_some() || args.restate_from.is_some();
    if dated && pipeline.kind() != crate::config::pipeline::Kind::Aggregate {
        return Err(AppError::Usage(format!(
            "--logical-date, --from and --to apply to aggregate pipelines; `{}` is {}",
            pipeline.name,
            pipeline.kind()
        )));
    }
    if let (Some(_), crate::config::pipeline::Spec::Aggregate(a)) =
        (args.logical_date, &pipeline.spec)
    {
        if a.watermark.is_some() {
            return Err(AppError::Usage(format!(
                "`{}` closes windows by its watermark (the data's own clock, `watermark:`), so --logical-date does not apply: run it without one, or restate days on purpose with --from/--to",
                pipeline.name
            )));
        }
    }
    if let (Some(from), Some(to)) = (args.restate_from, args.restate_to) {
        if from > to {
            return Err(AppError::Usage(format!(
                "--from {from} is after --to {to}: give the first day, then the last"
            )));
        }
        if args.full_reload {
            return Err(AppError::Usage(
                "--from/--to restate some days and --full-reload all of them: give one".into(),
            ));
        }
    }
    Ok(RunOptions {
        full_reload: args.full_reload,
        dry_run: args.dry_run,
        logical_date: args.logical_date,
        restate_from: args.restate_from,
        restate_to: args.restate_to,
        var_args: shell_var_args(&args.from.vars),
    })
}

/// `tidemark run`.
///
/// SIGINT/SIGTERM stop the run (nothing is committed unless its commit had already landed,
/// whole), remove its spill files and end it with exit 130/143. With `--every`, see
/// the `every` module.
pub async fn run_command(args: RunArgs, clock: Arc<dyn Clock>) -> Result<super::Output, AppError> {
    if args.every.every.is_some() {
        super::every::refuse_run_flags(&args)?;
    }
    let pipeline = Arc::new(load_pipeline(&args.pipeline, &args.from)?);
    let engine = engine_of(&args.engine)?;
    let opts = run_options(&args, &pipeline)?;
    if let Some(every) = args.every.every {
        let run = super::every::PipelineLoop {
            pipeline,
            engine,
            opts,
            from: args.from.clone(),
            compact_after: args
                .every
                .compact_after
                .unwrap_or(crate::config::bundle::DEFAULT_COMPACT_AFTER),
        };
        return Ok(run.start(every, args.output, clock).await);
    }
    let signal = crate::signal::stop_signal();
    let summary = run_once(&pipeline, opts, &engine, clock, &args.from, signal).await?;
    Ok(render(&summary, args.output).into())
}

/// Runs `pipeline` once on `engine`; `stop` completing (a signal) stops the run, removes its
/// spill files and ends it with [`AppError::Stopped`].
pub(super) async fn run_once(
    pipeline: &Arc<Pipeline>,
    opts: RunOptions,
    engine: &Engine,
    clock: Arc<dyn Clock>,
    from: &PipelineVars,
    stop: impl Future<Output = ErrorClass>,
) -> Result<RunSummary, AppError> {
    let on_engine = engine.clone();
    let run = pipeline.clone();
    let mut handle = engine
        .spawn(async move { crate::pipeline::run(&run, &opts, clock.as_ref(), &on_engine).await });
    let result = tokio::select! {
        joined = &mut handle => joined,
        signal = stop => {
            handle.abort();
            // Let the run unwind (its destructors drop its spill files) when it next yields.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut handle).await;
            engine.remove_spill_dir();
            return Err(AppError::Stopped { signal });
        }
    };
    engine.remove_spill_dir();
    match result {
        Ok(outcome) => outcome.map_err(|e| upstream::explain_missing(e.into(), pipeline, from)),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(AppError::Usage(format!(
            "the run was stopped before it finished: {e}"
        ))),
    }
}

/// A run's summary as `--output` asks: text, or one line of JSON.
pub(super) fn render(summary: &RunSummary, output: OutputFormat) -> String {
    match output {
        OutputFormat::Json => {
            // the text summary lists its warnings; a JSON reader's person reads stderr
            for w in &summary.warnings {
                tracing::warn!("{w}");
            }
            summary.to_json() + "\n"
        }
        OutputFormat::Text => summary.to_text(),
    }
}
