//! `tidemark lateness`: resolves the command line (a pipeline or a table, the lake for
//! `--runs`) into [`crate::lateness`]'s inputs; the work is there.

use super::{load_pipeline, AppError};
use crate::cli::{LatenessArgs, OutputFormat};
use crate::config::pipeline::ingest::INGESTED_AT;
use crate::config::pipeline::{with_spec, Settings};

/// `tidemark lateness`: a pipeline's source (event time = its `sequence_by`, with its overlap)
/// or a table URI; the work is in [`crate::lateness`].
pub async fn lateness(args: LatenessArgs) -> Result<String, AppError> {
    use crate::lateness::{self as l, LatenessInputs, LatenessOptions};
    crate::failpoint::hit_async("lateness.start")
        .await
        .map_err(crate::run::RunError::from)?;
    let inputs = match super::pipeline_or_table(&args.table, &args.from)? {
        Some(_) => {
            let p = load_pipeline(&args.table, &args.from)?;
            let c = with_spec!(&p.spec, k => k.clocks());
            // `--arrival` given wins over the settings' arrival column.
            let arrival = match (c.arrival, args.arrival == INGESTED_AT) {
                (Some(a), true) => a.to_string(),
                _ => args.arrival.clone(),
            };
            LatenessInputs {
                table_uri: c.table.to_string(),
                role: c.role,
                pipeline: Some(p.name.clone()),
                event_time: args.event_time.clone().or(c.event_time.map(str::to_string)),
                arrival,
                overlap: c.overlap,
            }
        }
        None => LatenessInputs {
            table_uri: args.table.clone(),
            role: "table",
            pipeline: None,
            event_time: args.event_time.clone(),
            arrival: args.arrival.clone(),
            overlap: None,
        },
    };
    if args.runs {
        let Some(pipeline) = &inputs.pipeline else {
            return Err(AppError::Usage(format!(
                "--runs reads the run ledger, which records runs per pipeline: name a pipeline, not the table {}",
                args.table
            )));
        };
        let trend = l::runs_trend(
            &super::ledger_lake(
                &args.from.vars,
                &args.from.bundle,
                args.from.target.as_deref(),
                "--runs",
            )?,
            pipeline,
        )
        .await?;
        return Ok(match args.output {
            OutputFormat::Json => trend.to_json() + "\n",
            OutputFormat::Text => trend.to_text(),
        });
    }
    let opts = LatenessOptions {
        settled: args.settled,
        now: args.now,
        budget: args.budget,
        target_pct: args.target_completeness,
        by: args.by.clone(),
        unit: args.unit,
    };
    // (the engine's spill directory goes when it is dropped, however the profile ends)
    let engine = super::engine_of(&args.engine)?;
    let report = l::profile(&inputs, &opts, engine.context()).await?;
    if let Some(path) = &args.plot {
        l::write_plot(&report, path)?;
    }
    Ok(match args.output {
        OutputFormat::Json => report.to_json() + "\n",
        OutputFormat::Text => {
            let mut text = report.to_text();
            if let Some(path) = &args.plot {
                text.push_str(&format!("plot: {}\n", path.display()));
            }
            super::fit::wrap(&text)
        }
    })
}
