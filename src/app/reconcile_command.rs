//! `tidemark reconcile`: a pipeline's table against an independent computation over its
//! source, for each kind (`crate::reconcile`).

use super::*;

/// `tidemark reconcile`: prints the report; fails with exit 65 (after printing it) when the
/// target differs from the newest rows of its source.
pub async fn reconcile_command(args: ReconcileArgs, clock: &dyn Clock) -> Result<String, AppError> {
    let pipeline = load_pipeline(&args.pipeline, &args.from)?;
    crate::failpoint::hit_async("reconcile.start")
        .await
        .map_err(RunError::from)?;
    let var_args = shell_var_args(&args.from.vars);
    let opts = ReconcileOptions {
        limit: args.limit,
        var_args: var_args.clone(),
    };
    // (the engine's spill directory goes when it is dropped, however the comparison ends)
    let engine = engine_of(&args.engine)?;
    let m = match &pipeline.spec {
        Spec::CdcMerge(m) => m,
        Spec::Aggregate(a) => {
            let report =
                reconcile::aggregate::reconcile(&pipeline, a, args.limit, &var_args, &engine)
                    .await?;
            let rendered = match args.output {
                OutputFormat::Json => report.to_json() + "\n",
                OutputFormat::Text => fit::wrap(&report.to_text()),
            };
            let file = format!("{}{var_args}", pipeline.path.display());
            return Ok(report.into_result(rendered, &file)?);
        }
        Spec::Dimension(d) => {
            let report = reconcile::dimension::reconcile(
                &pipeline, d, args.limit, &var_args, clock, &engine,
            )
            .await?;
            let rendered = match args.output {
                OutputFormat::Json => report.to_json() + "\n",
                OutputFormat::Text => fit::wrap(&report.to_text()),
            };
            let file = format!("{}{var_args}", pipeline.path.display());
            return Ok(report.into_result(rendered, &file)?);
        }
        Spec::Ingest(i) => {
            let report =
                reconcile::ingest::reconcile(&pipeline, i, args.limit, &var_args, clock, &engine)
                    .await?;
            let rendered = match args.output {
                OutputFormat::Json => report.to_json() + "\n",
                OutputFormat::Text => fit::wrap(&report.to_text()),
            };
            let file = format!("{}{var_args}", pipeline.path.display());
            return Ok(report.into_result(rendered, &file)?);
        }
    };
    let report = reconcile::reconcile(&pipeline, m, &opts, clock, &engine).await?;
    let rendered = match args.output {
        OutputFormat::Json => report.to_json() + "\n",
        OutputFormat::Text => fit::wrap(&report.to_text()),
    };
    Ok(report.into_result(rendered, &var_args)?)
}
