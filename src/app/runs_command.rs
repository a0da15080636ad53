//! `tidemark runs`: the run ledger as a table that fits 100 columns (`--wide`: every column),
//! or as JSON.

use super::jobs_commands::load_bundle;
use super::AppError;
use crate::cli::{OutputFormat, RunsArgs};
use crate::jobs::Ledger;

fn utc(t: chrono::DateTime<chrono::Utc>) -> String {
    crate::report::rfc3339(&t)
}

/// How much of an error the default `runs` table shows (wrapped over a few lines; `--wide` and
/// `--output json` show it whole): its first words, which say what failed.
const ERROR_CHARS: usize = 160;

/// `tidemark runs`.
pub async fn runs(args: RunsArgs) -> Result<String, AppError> {
    // A bundle gives the lake and the jobs; without one, `--var lake=` is enough.
    let sel = &args.select;
    let bundle = match crate::config::bundle::bundle_file(&sel.bundle).is_file() {
        true => Some(load_bundle(sel)?),
        false => None,
    };
    let lake = match &bundle {
        Some(b) => b.lake(),
        None => super::ledger_lake(
            &sel.vars,
            &sel.bundle,
            sel.target.as_deref(),
            "`tidemark runs`",
        )?,
    };
    let ledger = Ledger::for_lake(&lake);
    let rows = ledger.recent(args.job.as_deref(), args.limit).await?;
    if args.output == OutputFormat::Json {
        return Ok(serde_json::to_string(&rows).unwrap_or_default() + "\n");
    }
    if rows.is_empty() {
        return no_runs(&args, bundle.as_ref(), &ledger).await;
    }
    Ok(match args.wide {
        true => runs_wide(&rows),
        false => runs_narrow(&rows),
    })
}

/// `runs --wide`: every column, errors whole.
fn runs_wide(rows: &[crate::jobs::LedgerRow]) -> String {
    let mut t = super::fit::table(true);
    t.set_header(WIDE_HEADER);
    for r in rows {
        t.add_row(wide_row(r));
    }
    format!("{t}\n")
}

/// `runs`: within 100 columns, newest first in execution order. The job column goes when every
/// row is of one job (it is named above the table instead); an error is not squeezed into a
/// column: its row says `failed [n]` and note `[n]` below the table gives the error's first
/// words, wrapped.
fn runs_narrow(rows: &[crate::jobs::LedgerRow]) -> String {
    let one_job = rows.iter().all(|r| r.job == rows[0].job);
    let mut out = String::new();
    if one_job {
        out.push_str(&format!("job {} (newest first)\n", rows[0].job));
    }
    let mut t = super::fit::table(false);
    let mut header = vec![
        "started (UTC)",
        "job",
        "task",
        "try",
        "status",
        "what it did",
        "ms",
    ];
    if one_job {
        header.remove(1);
    }
    t.set_header(header);
    let mut notes = Vec::new();
    for r in rows {
        let mut status = r.status.clone();
        if let Some(error) = error_text(r) {
            notes.push(format!(
                "[{}] {}, try {}: {}",
                notes.len() + 1,
                r.task,
                r.attempt,
                first_words(&error)
            ));
            status = format!("{status} [{}]", notes.len());
        }
        let mut cells = vec![
            r.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            r.job.clone(),
            r.task.clone(),
            r.attempt.to_string(),
            status,
            did(r),
            r.duration_ms.to_string(),
        ];
        if one_job {
            cells.remove(1);
        }
        t.add_row(cells);
    }
    out.push_str(&format!("{t}\n"));
    for n in notes {
        out.push_str(&super::fit::wrap(&n));
        out.push('\n');
    }
    out
}

/// What a task's run did, in its kind's words (`--wide` and `--output json` have every
/// counter): a merge's rows inserted, updated and deleted; an ingest's rows and files; an
/// aggregate's days recomputed and rows written; a dimension's keys changed and their rows.
fn did(r: &crate::jobs::LedgerRow) -> String {
    let counters: Option<serde_json::Value> = r
        .counters
        .as_deref()
        .and_then(|c| serde_json::from_str(c).ok());
    let n = |key: &str| counters.as_ref().and_then(|c| c[key].as_u64());
    let text = match r.kind.as_deref() {
        Some("ingest") => n("num_rows_written")
            .zip(n("num_files_ingested"))
            .map(|(rows, files)| format!("{} from {}", plural(rows, "row"), plural(files, "file"))),
        Some("dimension") => match (
            n("num_keys_changed"),
            n("num_rows_before"),
            n("num_rows_after"),
        ) {
            (Some(k), Some(b), Some(a)) => Some(format!("{k} keys, rows {b}→{a}")),
            _ => None,
        },
        _ => None,
    };
    text.unwrap_or_else(|| match (r.num_inserted, r.num_updated, r.num_deleted) {
        (Some(i), Some(u), Some(d)) => format!("{i} in, {u} upd, {d} del"),
        _ => String::new(),
    })
}

/// An error's first [`ERROR_CHARS`] characters, on one line.
fn first_words(error: &str) -> String {
    let flat = error.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.chars().count() > ERROR_CHARS {
        true => {
            let cut: String = flat.chars().take(ERROR_CHARS - 1).collect();
            format!("{cut}… (--wide or --output json: whole)")
        }
        false => flat,
    }
}

/// What `runs` says when the ledger has no row to show (for this job, or at all).
async fn no_runs(
    args: &RunsArgs,
    bundle: Option<&crate::config::Bundle>,
    ledger: &Ledger,
) -> Result<String, AppError> {
    Ok(match &args.job {
        Some(job) if !ledger.recent(None, 1).await?.is_empty() => {
            let hint = match bundle {
                Some(b) if !b.jobs.contains_key(job) => {
                    let known: Vec<&str> = b.jobs.keys().map(String::as_str).collect();
                    format!(
                        " (the bundle has no job `{job}`; its jobs: {})",
                        known.join(", ")
                    )
                }
                _ => String::new(),
            };
            format!(
                "no runs of job `{job}` recorded in {}{hint}; other jobs have runs: `tidemark runs` lists them\n",
                ledger.uri()
            )
        }
        _ => format!("no runs recorded yet in {}\n", ledger.uri()),
    })
}

/// The ledger table's columns with `--wide`.
const WIDE_HEADER: [&str; 12] = [
    "started (UTC)",
    "job",
    "task",
    "try",
    "trigger",
    "status",
    "scheduled (UTC)",
    "mode",
    "rows in/upd/del",
    "target v",
    "ms",
    "error",
];

/// A ledger row's counts as `in/upd/del` (blank for a task that records none).
fn counts(r: &crate::jobs::LedgerRow) -> String {
    match (r.num_inserted, r.num_updated, r.num_deleted) {
        (Some(i), Some(u), Some(d)) => format!("{i}/{u}/{d}"),
        _ => String::new(),
    }
}

/// A ledger row's error with its class, `[class] message`.
fn error_text(r: &crate::jobs::LedgerRow) -> Option<String> {
    let m = r.error_message.as_deref()?;
    let class = r
        .error_class
        .as_deref()
        .map(|c| format!("[{c}] "))
        .unwrap_or_default();
    Some(format!("{class}{m}"))
}

/// One ledger row's cells with `--wide`.
fn wide_row(r: &crate::jobs::LedgerRow) -> Vec<String> {
    vec![
        utc(r.started_at),
        r.job.clone(),
        r.task.clone(),
        r.attempt.to_string(),
        r.trigger.clone(),
        r.status.clone(),
        r.scheduled_at.map(utc).unwrap_or_default(),
        r.mode.clone().unwrap_or_default(),
        counts(r),
        r.target_version.map(|v| v.to_string()).unwrap_or_default(),
        r.duration_ms.to_string(),
        error_text(r).unwrap_or_default(),
    ]
}

/// `1 row`, `2 rows`.
fn plural(n: u64, word: &str) -> String {
    match n {
        1 => format!("1 {word}"),
        _ => format!("{n} {word}s"),
    }
}
