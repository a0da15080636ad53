//! `tidemark demo`: the whole chain on local folders, one simulated hour per call.
//!
//! The first call backfills the history straight into bronze (30 days of payments, with the
//! arrival times of the generated world, as a migration from an older system would); every call
//! then delivers the next hour as landing files (the event stream as JSON lines, the partner's
//! day-late file as CSV) and runs the bundle's hourly job: ingest both into bronze, merge bronze
//! into silver. The job runs on the simulated clock of that hour (its end plus five minutes),
//! so `_ingested_at` and the ledger tell the same story as the data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::Duration;

use super::{jobs_commands, render_generate, render_landing, shell_var_args, AppError, Output};
use crate::cli::{DemoArgs, OutputFormat};
use crate::clock::{Clock, FixedClock};
use crate::config::pipeline::Spec;
use crate::generate::{self, GenerateMode, GenerateOptions};
use crate::lake;

/// Sample size of the demo: large enough to show late rows and deletes, small enough for a
/// debug build to generate in seconds.
const DEMO_PAYMENTS: u64 = 20_000;
const DEMO_DAYS: u32 = 30;

/// `dir`'s hidden sibling `.<name>.<what>` (listings and the ingest skip names starting with `.`).
fn hidden_sibling(dir: &Path, what: &str) -> std::path::PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.{what}"))
}

/// The job the demo runs.
const DEMO_JOB: &str = "payments_hourly";
/// The job the demo runs on the Debezium feed (`--feed debezium`).
const DEMO_DEBEZIUM_JOB: &str = "payments_debezium_hourly";

/// The demo's bundle: `--bundle`, else `./bundle`, else the `bundle/` of the checkout this
/// binary was built from (so `tidemark demo` works from any directory after `cargo install
/// --path .`), else the one above the binary (`target/debug/tidemark` in a checkout).
fn demo_bundle(given: Option<&Path>) -> Result<std::path::PathBuf, AppError> {
    if let Some(b) = given {
        return Ok(b.to_path_buf());
    }
    let mut candidates = vec![
        std::path::PathBuf::from("bundle"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle"),
    ];
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).map(|d| d.join("bundle")));
    }
    candidates
        .into_iter()
        .find(|b| b.join("tidemark.yml").is_file())
        .ok_or_else(|| {
            AppError::Usage(format!(
                "no bundle found for the demo: looked for ./bundle/tidemark.yml and the checkout this binary was built from ({}). Run `tidemark demo` in the tidemark checkout, or pass `--bundle <checkout>/bundle`",
                env!("CARGO_MANIFEST_DIR")
            ))
        })
}

/// `tidemark demo`: backfill bronze when absent; land the next hour as files; run the bundle's
/// `payments_hourly` job (ingest → merge) on its default (`local`) target, as `tidemark job run`
/// would, on the clock of the hour landed.
pub async fn demo(args: DemoArgs, _clock: Arc<dyn Clock>) -> Result<Output, AppError> {
    let (var_args, bundle_dir, bundle_flag, demo_again) = demo_flags(&args)?;
    let select = crate::cli::BundleSelect {
        bundle: bundle_dir.clone(),
        target: None,
        vars: var_args,
    };
    let (bundle, warnings) = jobs_commands::load_bundle_quietly(&select)?;
    let debezium = args.feed == generate::Feed::Debezium;
    let job_name = if debezium {
        DEMO_DEBEZIUM_JOB
    } else {
        DEMO_JOB
    };
    let job = bundle.job(job_name).map_err(AppError::Usage)?;
    let merge = job
        .tasks
        .iter()
        .find(|t| matches!(t.pipeline.spec, Spec::CdcMerge(_)))
        .ok_or_else(|| AppError::Usage(format!("job `{job_name}` has no cdc_merge task")))?;
    let landing = job
        .tasks
        .iter()
        .find_map(|t| match &t.pipeline.spec {
            Spec::Ingest(i) => Some(i.landing_uri.clone()),
            _ => None,
        })
        .ok_or_else(|| AppError::Usage(format!("job `{job_name}` has no ingest task")))?;
    let landing = landing
        .strip_prefix("file://")
        .unwrap_or(&landing)
        .to_string();
    if landing.contains("://") {
        return Err(AppError::Usage(format!(
            "the demo writes landing files into a local folder; the ingest task reads {landing}"
        )));
    }
    let bronze_uri = merge.pipeline.source_uri().to_string();
    // The pipeline file, as the suggested `lateness` command can find it from here.
    // (a Debezium bronze's lateness: the database's commit to when Debezium read the change)
    let profiled = match debezium {
        true => super::demo_debezium::ingest_pipeline(job).unwrap_or(&merge.pipeline.path),
        false => &merge.pipeline.path,
    };
    let lateness_target = if bundle_dir == Path::new("bundle") {
        profiled.to_path_buf()
    } else {
        std::path::absolute(profiled).unwrap_or_else(|_| profiled.to_path_buf())
    };
    let text = args.output == OutputFormat::Text;
    let mut out = String::new();
    if !debezium && lake::open_if_exists(&bronze_uri).await?.is_none() {
        match backfill(&bronze_uri, &demo_again).await? {
            Step::Done(report) if text => {
                out.push_str("backfill: ");
                out.push_str(&render_generate(&report, args.output));
            }
            Step::Done(_) => {}
            Step::Stopped(output) => return Ok(output),
        }
    }
    let landed = match debezium {
        true => {
            super::demo_debezium::land(&landing, DEMO_PAYMENTS, DEMO_DAYS, demo_start(), text)
                .await?
        }
        false => land_hour(job, &landing, &bronze_uri, text, args.output).await?,
    };
    let (landed, said) = match landed {
        Step::Done(done) => done,
        Step::Stopped(failure) => {
            return Ok(Output {
                stdout: out,
                failure: Some((
                    failure,
                    format!(
                        "{} received: the demo stopped while it landed the next hour, before the job ran; nothing is half-written (a landing file or merchants' commit that completed is taken up by the next run). Run `{demo_again}` again to continue",
                        crate::signal::name(failure)
                    ),
                )),
            })
        }
    };
    out.push_str(&said);
    // The hour just landed is "now" for the job: files arrive, the job runs five minutes later.
    let clock: Arc<dyn Clock> = Arc::new(FixedClock(landed.frontier + Duration::minutes(5)));
    let mut result =
        jobs_commands::run_job(&bundle, job_name, false, args.output, clock, warnings).await?;
    out.push_str(&result.stdout);
    let gold = job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Aggregate(a) if a.window.is_none() => Some((t.pipeline.name.clone(), a.clone())),
        _ => None,
    });
    if let (true, None, Some((name, spec))) = (text, &result.failure, gold) {
        out.push_str(&gold_story(&name, &spec).await?);
    }
    let windowed = job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Aggregate(a) if a.window.is_some() => Some((t.pipeline.clone(), a.clone())),
        _ => None,
    });
    if let (true, None, Some((p, spec))) = (text, &result.failure, windowed) {
        out.push_str(&super::status_command::windows_story(&p, &spec).await?);
    }
    let dimension = job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Dimension(d) => Some(d.target_uri.clone()),
        _ => None,
    });
    let by_segment = job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Aggregate(a) if !a.lookups.is_empty() => Some(a.target_uri.clone()),
        _ => None,
    });
    if let (true, None, Some(dim)) = (text, &result.failure, dimension) {
        let silver = merge.pipeline.target_uri().to_string();
        out.push_str(&merchants_story(&dim, by_segment.as_deref(), &silver).await?);
    }
    if text && result.failure.is_none() {
        let lateness = format!(
            "tidemark lateness {}{bundle_flag}{}",
            lateness_target.display(),
            if debezium { " --arrival _event_ts" } else { "" }
        );
        out.push_str(&format!(
            "\nNext:\n{}{}{}",
            suggest(
                &demo_again,
                "the next hour: land it, ingest it, merge it incrementally"
            ),
            suggest(
                &format!("tidemark runs{bundle_flag}"),
                "the run ledger: every task attempt"
            ),
            suggest(
                &lateness,
                "how late the data runs (add --plot lateness.svg for the curve)"
            ),
        ));
    }
    // Everything fits 100 columns, like `status` and `runs`.
    result.stdout = match text {
        true => super::fit::wrap(&out),
        false => out,
    };
    Ok(result)
}

/// A command to run next, on lines a shell takes as one when pasted (a long one is continued
/// with `\` before its flags), and what it does.
fn suggest(command: &str, what: &str) -> String {
    let width = super::fit::WIDTH as usize - 2;
    let mut lines = vec![String::from("  ")];
    for (i, word) in command.split(" --").enumerate() {
        let word = if i == 0 {
            word.to_string()
        } else {
            format!(" --{word}")
        };
        let last = lines.last_mut().expect("one line");
        if last.len() + word.len() > width && !last.trim().is_empty() {
            last.push_str(" \\");
            lines.push(format!("     {}", word.trim_start()));
        } else {
            last.push_str(&word);
        }
    }
    format!("{}\n      # {what}\n", lines.join("\n"))
}

/// How a step of the demo ended: done, or stopped by a signal.
pub(super) enum Step<T, S> {
    Done(T),
    Stopped(S),
}

/// The flags the demo was given, as the commands it suggests repeat them: the `--var`s, the
/// bundle, ` --bundle DIR --var ...` for other commands, and `tidemark demo ...` itself.
fn demo_flags(args: &DemoArgs) -> Result<(Vec<String>, PathBuf, String, String), AppError> {
    let mut var_args = Vec::new();
    if let Some(lake) = &args.lake {
        let abs = std::path::absolute(lake)
            .map_err(|e| AppError::Usage(format!("--lake {}: {e}", lake.display())))?;
        var_args.push(format!("lake={}", abs.display()));
    }
    let bundle_dir = demo_bundle(args.bundle.as_deref())?;
    // The commands the demo suggests must work from where it was run, on the lake it wrote.
    let mut bundle_flag = if bundle_dir == Path::new("bundle") {
        String::new()
    } else {
        format!(
            " --bundle {}",
            std::path::absolute(&bundle_dir)
                .unwrap_or_else(|_| bundle_dir.clone())
                .display()
        )
    };
    // `tidemark demo` again, with the flags this call was given.
    let mut demo_again = String::from("tidemark demo");
    if let (Some(_), Some(v)) = (&args.lake, var_args.first()) {
        let lake = v.trim_start_matches("lake=").to_string();
        demo_again.push_str(&shell_var_args(&[lake]).replacen(" --var ", " --lake ", 1));
    }
    if let Some(b) = &args.bundle {
        let abs = std::path::absolute(b).unwrap_or_else(|_| b.clone());
        demo_again.push_str(&format!(" --bundle {}", abs.display()));
    }
    if args.feed == generate::Feed::Debezium {
        demo_again.push_str(" --feed debezium");
    }
    bundle_flag.push_str(&shell_var_args(&var_args));
    Ok((var_args, bundle_dir, bundle_flag, demo_again))
}

/// Backfills bronze. It takes many commits: built beside bronze under a hidden name and renamed
/// into place when whole, so a Ctrl-C leaves no half-written bronze (the next demo starts the
/// backfill over).
async fn backfill(
    bronze_uri: &str,
    demo_again: &str,
) -> Result<Step<generate::GenerateReport, Output>, AppError> {
    let local = lake::local_path(bronze_uri);
    let building = local.as_ref().map(|p| hidden_sibling(p, "backfill"));
    if let Some(b) = &building {
        if b.exists() {
            std::fs::remove_dir_all(b).map_err(|e| {
                AppError::Usage(format!(
                    "cannot remove the unfinished backfill {}: {e}; remove it by hand",
                    b.display()
                ))
            })?;
        }
    }
    let options = GenerateOptions {
        out: building
            .as_ref()
            .map(|b| b.display().to_string())
            .unwrap_or_else(|| bronze_uri.to_string()),
        payments: DEMO_PAYMENTS,
        days: DEMO_DAYS,
        seed: 42,
        start: demo_start(),
        mode: GenerateMode::Full,
    };
    let mut report = tokio::select! {
        r = generate::generate(&options) => r?,
        class = crate::signal::stop_signal() => {
            if let Some(b) = &building {
                let _ = std::fs::remove_dir_all(b);
            }
            return Ok(Step::Stopped(Output {
                stdout: String::new(),
                failure: Some((
                    class,
                    format!(
                        "{} received: the demo stopped while it backfilled bronze ({bronze_uri}); nothing was kept. Run `{demo_again}` again to start over",
                        crate::signal::name(class)
                    ),
                )),
            }));
        }
    };
    if let (Some(b), Some(p)) = (&building, &local) {
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| AppError::Usage(format!("cannot create {}: {e}", parent.display())))?;
        }
        std::fs::rename(b, p).map_err(|e| {
            AppError::Usage(format!(
                "cannot move the backfill {} to {}: {e}",
                b.display(),
                p.display()
            ))
        })?;
    }
    report.table = bronze_uri.to_string();
    Ok(Step::Done(report))
}

/// Lands the next hour's files, and the merchants' records that landed by then; what it says
/// (text output). A signal stops it (its class); what already landed is taken up by the next
/// demo.
async fn land_hour(
    job: &crate::config::bundle::Job,
    landing: &str,
    bronze_uri: &str,
    text: bool,
    output: OutputFormat,
) -> Result<Step<(generate::LandingReport, String), crate::error::ErrorClass>, AppError> {
    let dimension_source = job.tasks.iter().find_map(|t| match &t.pipeline.spec {
        Spec::Dimension(d) => Some(d.source_uri.clone()),
        _ => None,
    });
    let land_hour = async {
        let landed = generate::landing_from(Path::new(landing), bronze_uri, 1).await?;
        let mut said = String::new();
        if text {
            said.push_str(&render_landing(&landed, output));
        }
        if let Some(uri) = &dimension_source {
            let after = match lake::open_if_exists(uri).await? {
                Some(t) => match lake::max_from_stats(&t, "_ingested_at") {
                    Ok(lake::StatsMax::Max(us)) => Some(us),
                    _ => None,
                },
                None => None,
            };
            let all = generate::merchants::records(42, demo_start(), DEMO_DAYS);
            let n = generate::merchants::land(uri, &all, after, landed.frontier.timestamp_micros())
                .await?;
            if text {
                said.push_str(&format!(
                    "merchants: {n} change record(s) landed in {uri}\n"
                ));
            }
        }
        Ok::<_, AppError>((landed, said))
    };
    tokio::select! {
        r = land_hour => r.map(Step::Done),
        class = crate::signal::stop_signal() => Ok(Step::Stopped(class)),
    }
}

/// Gold after the hour: the last week's day status, and what is open, final and adjusted.
async fn gold_story(
    name: &str,
    spec: &crate::config::pipeline::Aggregate,
) -> Result<String, AppError> {
    let days = crate::aggregate::day_status(spec).await?;
    let mut out = String::from("\n");
    out.push_str(&super::status_command::render(name, spec, &days, 7, false));
    let adjustments = match lake::open_if_exists(&spec.adjustments_uri).await? {
        Some(t) => lake::row_count_from_stats(&t).ok().flatten().unwrap_or(0),
        None => 0,
    };
    let open = days.values().filter(|d| !d.is_final()).count();
    out.push_str(&format!(
        "{open} day(s) open: each hour restates them whole as late payments land (`days changed` above); a day becomes final {lookback} days after it ends, and late data for it is then booked as an adjustment in the open period instead of rewriting it ({booked}).\n",
        lookback = spec.lookback_days,
        booked = if adjustments == 0 {
            format!("none yet; they go to {}", spec.adjustments_uri)
        } else {
            format!("{adjustments} adjustment row(s) so far in {}", spec.adjustments_uri)
        },
    ));
    Ok(out)
}

/// Day 0 of the demo's generated world (its payments and its merchants).
fn demo_start() -> chrono::NaiveDate {
    chrono::NaiveDate::from_ymd_opt(2024, 1, 1).unwrap_or_default()
}

/// The merchants dimension after the hour: merchants, versions, placeholders pending and
/// completed, and gold by segment for the newest days.
async fn merchants_story(
    dim: &str,
    by_segment: Option<&str>,
    silver: &str,
) -> Result<String, AppError> {
    let ctx = lake::session::context();
    if !register(&ctx, "merchants", dim).await? {
        return Ok(String::new());
    }
    let mut out = merchants_line(&ctx, dim).await?;
    // A late payment counted under the segment its merchant had when it was made.
    if register(&ctx, "payments", silver).await? {
        out.push_str(&late_payment_line(&ctx).await?);
    }
    if let Some(gold) = by_segment {
        if register(&ctx, "segments", gold).await? {
            out.push_str(&segments_line(&ctx, gold).await?);
        }
    }
    Ok(out)
}

/// Registers the table at `uri` as `name`, when it exists.
async fn register(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    uri: &str,
) -> Result<bool, AppError> {
    let Some(table) = lake::open_if_exists(uri).await? else {
        return Ok(false);
    };
    table
        .update_datafusion_session(&ctx.state())
        .map_err(|e| AppError::Usage(e.to_string()))?;
    let provider = table.table_provider().await.map_err(summary_query)?;
    ctx.register_table(name, provider).map_err(summary_query)?;
    Ok(true)
}

fn summary_query(e: datafusion::error::DataFusionError) -> AppError {
    AppError::Usage(format!("the demo's summary: {e}"))
}

/// The rows of a summary query.
async fn rows_of(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> Result<Vec<arrow::array::RecordBatch>, AppError> {
    ctx.sql(sql)
        .await
        .map_err(summary_query)?
        .collect()
        .await
        .map_err(summary_query)
}

/// Column `c` of row `i` as text.
fn text_at(b: &arrow::array::RecordBatch, c: usize, i: usize) -> String {
    arrow::util::display::array_value_to_string(b.column(c), i).unwrap_or_default()
}

/// The dimension in numbers: merchants, versions, placeholders pending and completed.
async fn merchants_line(
    ctx: &datafusion::prelude::SessionContext,
    dim: &str,
) -> Result<String, AppError> {
    let rows = rows_of(ctx, "SELECT count(DISTINCT merchant_id) AS merchants, count(*) AS versions, \
              count(*) FILTER (WHERE is_inferred) AS pending, \
              count(DISTINCT merchant_id) FILTER (WHERE NOT is_inferred AND inferred_at IS NOT NULL) AS completed, \
              min(merchant_id) FILTER (WHERE is_inferred) AS example \
              FROM merchants").await?;
    let cell = |c: &str| -> String {
        rows.first()
            .and_then(|b| b.column_by_name(c).cloned())
            .and_then(|a| arrow::util::display::array_value_to_string(&a, 0).ok())
            .unwrap_or_default()
    };
    let done = rows_of(ctx, "SELECT merchant_id, segment, CAST(inferred_at AS VARCHAR) AS inferred FROM merchants \
              WHERE NOT is_inferred AND inferred_at IS NOT NULL AND valid_from < TIMESTAMP '1901-01-01' \
              ORDER BY inferred_at DESC, merchant_id LIMIT 1").await?;
    let completed_example = done
        .first()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            format!(
                " (e.g. {}: inferred {}; its first real version, `{}`, is valid from 1900-01-01, so its earlier payments count under a real segment)",
                text_at(b, 0, 0),
                text_at(b, 2, 0),
                text_at(b, 1, 0)
            )
        })
        .unwrap_or_default();
    Ok(format!(
        "\nmerchants (SCD2, {dim}): {} merchants in {} versions; {} placeholder(s) pending for merchants the payments named before their record (e.g. {}); {} completed in place since their record arrived{completed_example}.\n",
        cell("merchants"),
        cell("versions"),
        cell("pending"),
        if cell("example").is_empty() { "-".to_string() } else { cell("example") },
        cell("completed"),
    ))
}

/// A late payment counted under the segment its merchant had when it was made.
async fn late_payment_line(ctx: &datafusion::prelude::SessionContext) -> Result<String, AppError> {
    let late = rows_of(
        ctx,
        "SELECT p.payment_id AS payment, p.merchant_id AS merchant, \
                  CAST(CAST(p.created_at AS DATE) AS VARCHAR) AS made, \
                  CAST(CAST(p._ingested_at AS DATE) AS VARCHAR) AS landed, \
                  then.segment AS then_segment, now.segment AS now_segment, \
                  p._ingested_at AS arrival \
                  FROM payments p \
                  JOIN merchants then ON then.merchant_id = p.merchant_id \
                    AND then.valid_from <= p.created_at \
                    AND (then.valid_to IS NULL OR p.created_at < then.valid_to) \
                  JOIN merchants now ON now.merchant_id = p.merchant_id AND now.is_current \
                  WHERE then.segment <> now.segment \
                    AND p._ingested_at > p.created_at + INTERVAL '1 day' \
                  ORDER BY arrival DESC, payment LIMIT 1",
    )
    .await?;
    Ok(match late.first().filter(|b| b.num_rows() > 0) {
        Some(b) => format!(
            "a late payment: {} of {}, made {} and landed {}, counts under `{}` — the segment {} had then (it is `{}` now).\n",
            text_at(b, 0, 0),
            text_at(b, 1, 0),
            text_at(b, 2, 0),
            text_at(b, 3, 0),
            text_at(b, 4, 0),
            text_at(b, 1, 0),
            text_at(b, 5, 0)
        ),
        None => String::new(),
    })
}

/// Yesterday's payments by the segment each merchant had at the time.
async fn segments_line(
    ctx: &datafusion::prelude::SessionContext,
    gold: &str,
) -> Result<String, AppError> {
    let batches = rows_of(
        ctx,
        "SELECT event_date, segment, sum(payments) AS payments FROM segments \
                      WHERE event_date = (SELECT max(event_date) - 1 FROM segments) \
                      GROUP BY event_date, segment ORDER BY segment",
    )
    .await?;
    let mut parts = Vec::new();
    let mut day = String::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            day = text_at(b, 0, i);
            parts.push(format!("{} {}", text_at(b, 1, i), text_at(b, 2, i)));
        }
    }
    Ok(match parts.is_empty() {
        true => String::new(),
        false => format!(
            "payments of {day} by the segment each merchant had at the time ({gold}): {}; `unknown`: no version of the merchant at the payment's time (a merchant still pending, a payment before its merchant's first record, or after its closure).\n",
            parts.join(", ")
        ),
    })
}
