//! `tidemark demo --feed debezium`: the demo's payments as a PostgreSQL connector's Debezium
//! events. There is no backfill into bronze: the first call lands the whole history as event
//! files (30 days, one file per hour), later calls the next hour, and the bundle's
//! `payments_debezium_hourly` job takes them to bronze, silver and gold.

use std::path::Path;

use super::demo::Step;
use super::{render_landing, AppError};
use crate::cli::OutputFormat;
use crate::config::bundle::Job;
use crate::config::pipeline::Spec;
use crate::generate::{self, Feed, GenerateMode, GenerateOptions};

/// The job's ingest pipeline file (what `lateness` profiles for this feed).
pub(super) fn ingest_pipeline(job: &Job) -> Option<&Path> {
    job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Ingest(_) => Some(t.pipeline.path.as_path()),
        _ => None,
    })
}

/// Lands the history (first call) or the next hour as Debezium event files in `landing`; what
/// it says (text). A signal stops it before anything is half-written (files are renamed into
/// place whole, the generator's state last).
pub(super) async fn land(
    landing: &str,
    payments: u64,
    days: u32,
    start: chrono::NaiveDate,
    text: bool,
) -> Result<Step<(generate::LandingReport, String), crate::error::ErrorClass>, AppError> {
    let dir = Path::new(landing).to_path_buf();
    let first = !generate::landing_has_state(&dir);
    let work = tokio::task::spawn_blocking(move || match first {
        true => generate::landing_full(
            &dir,
            Feed::Debezium,
            &GenerateOptions {
                out: String::new(),
                payments,
                days,
                seed: 42,
                start,
                mode: GenerateMode::Full,
            },
        ),
        false => generate::landing_next(&dir, 1),
    });
    tokio::select! {
        r = work => {
            let report = r
                .map_err(|e| AppError::Usage(format!("generating the Debezium feed stopped: {e}")))??;
            let mut said = String::new();
            if text {
                if first {
                    said.push_str("history as Debezium events: ");
                }
                said.push_str(&render_landing(&report, OutputFormat::Text));
            }
            Ok(Step::Done((report, said)))
        }
        class = crate::signal::stop_signal() => Ok(Step::Stopped(class)),
    }
}
