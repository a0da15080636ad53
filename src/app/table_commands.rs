//! Commands on a pipeline's target table: `history`, `restore`, `maintain`.

use super::*;

/// `tidemark history`: a table's commits, newest first; for a pipeline, every table it owns
/// that exists (the target first), each under its own title. Times are the commits' own (wall
/// clock, UTC), not the run's clock a ledger row or a demo's simulated hour carries.
pub async fn history(args: HistoryArgs) -> Result<String, AppError> {
    let tables: Vec<(Option<&'static str>, String)> =
        match pipeline_or_table(&args.table, &args.from)? {
            Some(_) => {
                let p = load_pipeline(&args.table, &args.from)?;
                crate::pipeline::tables(&p)
                    .into_iter()
                    .map(|(t, uri)| (Some(t.as_str()), uri))
                    .collect()
            }
            None => vec![(None, args.table.clone())],
        };
    let mut sections = Vec::new();
    for (i, (role, uri)) in tables.iter().enumerate() {
        // (the target must exist; a companion not written yet is left out)
        let table = match (i, lake::open_if_exists(uri).await?) {
            (_, Some(t)) => t,
            (0, None) => lake::open_required(uri, "table").await?,
            (_, None) => continue,
        };
        let entries = lake::read_commits(&table, args.limit)
            .await
            .map_err(|source| AppError::Delta {
                action: "cannot read the log of",
                uri: uri.clone(),
                source: Box::new(source),
            })?;
        sections.push((*role, uri.clone(), entries));
    }
    if args.output == OutputFormat::Json {
        return Ok(history_json(&sections) + "\n");
    }
    let mut out = String::new();
    for (role, uri, entries) in &sections {
        if let Some(role) = role {
            out.push_str(&format!("{role}: {uri}\n"));
        }
        out.push_str(&format!("{}\n", history_table(entries)));
    }
    out.push_str("committed: when each commit was written, by the wall clock (UTC); a run's scheduled or simulated time is in `tidemark runs`\n");
    Ok(super::fit::wrap(&out))
}

/// The commits as one JSON array, newest first per table; with a pipeline each entry names its
/// table (`table`: target, status, adjustments, quarantine, record; `uri`).
fn history_json(sections: &[(Option<&'static str>, String, Vec<lake::CommitEntry>)]) -> String {
    let mut all = Vec::new();
    for (role, uri, entries) in sections {
        for e in entries {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            if let (Some(role), Some(map)) = (role, v.as_object_mut()) {
                map.insert("table".into(), serde_json::Value::from(*role));
                map.insert("uri".into(), serde_json::Value::from(uri.as_str()));
            }
            all.push(v);
        }
    }
    serde_json::to_string(&all).unwrap_or_default()
}

/// One table's commits as text: what each run wrote, in its kind's words.
fn history_table(entries: &[lake::CommitEntry]) -> Table {
    let mut t = super::fit::table(false);
    t.set_header(vec![
        "v",
        "committed (UTC)",
        "run",
        "mode",
        "what it wrote",
        "files +/-",
    ]);
    for e in entries {
        let field = |k: &str| {
            e.run
                .as_ref()
                .and_then(|r| r.get(k))
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .unwrap_or_default()
        };
        let run_id = field("run_id");
        t.add_row(vec![
            e.version.to_string(),
            // (to the second: `--output json` has the microseconds)
            e.time
                .as_deref()
                .map(|t| t.get(..19).unwrap_or(t).replace('T', " "))
                .unwrap_or_default(),
            run_id.get(..13).unwrap_or(&run_id).to_string(),
            // (a commit tidemark did not make: its operation, WRITE, OPTIMIZE, …)
            match field("mode") {
                m if m.is_empty() => e.operation.clone().unwrap_or_default(),
                m => m,
            },
            wrote(e, &field),
            format!("{}/{}", e.files_added, e.files_removed),
        ]);
    }
    t
}

/// What a commit's run wrote, in its kind's words (the same as `runs`).
fn wrote(e: &lake::CommitEntry, field: &dyn Fn(&str) -> String) -> String {
    let has = |k: &str| e.run.as_ref().is_some_and(|r| r.get(k).is_some());
    // Commits carry their kind; older ones (written before it was recorded) are known by
    // their counters.
    let kind = match field("kind") {
        k if !k.is_empty() => k,
        _ if has("num_days_changed") => "aggregate".into(),
        _ if has("num_keys_changed") => "dimension".into(),
        _ if has("num_files_ingested") => "ingest".into(),
        _ if has("num_inserted") => "cdc_merge".into(),
        _ => String::new(),
    };
    match kind.as_str() {
        "cdc_merge" => format!(
            "{} in, {} upd, {} del",
            field("num_inserted"),
            field("num_updated"),
            field("num_deleted")
        ),
        // the rows of the days it replaced, and how many days
        "aggregate" => {
            let (rows, days) = (field("num_rows_written"), field("num_days_changed"));
            let r = if rows == "1" { "" } else { "s" };
            let d = if days == "1" { "" } else { "s" };
            format!("{rows} row{r}, {days} day{d} changed")
        }
        "ingest" => {
            let files = field("num_files_ingested");
            let s = if files == "1" { "" } else { "s" };
            let rows = field("num_rows_written");
            let r = if rows == "1" { "" } else { "s" };
            format!("{rows} row{r} from {files} file{s}")
        }
        // the changed keys, and their rows before and after
        "dimension" => format!(
            "{} keys, rows {}→{}",
            field("num_keys_changed"),
            field("num_rows_before"),
            field("num_rows_after")
        ),
        _ => String::new(),
    }
}

/// `tidemark restore`. A pipeline's tables are restored together: an aggregate's status and
/// adjustments tables go back to the versions they had when gold had the restored version.
pub async fn restore(mut args: RestoreArgs) -> Result<String, AppError> {
    let (companions, keys) = companions_of(&args)?;
    // The undo restores what this command restores: the pipeline's tables when given one.
    let given = match super::pipeline_or_table(&args.table, &args.from)? {
        Some(_) => format!("{}{}", args.table, super::shell_var_args(&args.from.vars)),
        None => String::new(),
    };
    args.table = table_or_pipeline_target(&args.table, &args.from)?;
    let table = lake::open_required(&args.table, "table").await?;
    let latest = table.version().unwrap_or(0);
    if args.version >= latest {
        return Err(AppError::Usage(format!(
            "cannot restore {} to version {}: choose a version from 0 to {} (the current version is {latest}; see `tidemark history {}`)",
            args.table,
            args.version,
            latest.saturating_sub(1),
            args.table
        )));
    }
    let mut plans = Vec::new();
    for (role, uri) in companions {
        if let Some(t) = lake::open_if_exists(&uri).await? {
            let to = lake::companion_version(&table, args.version, &t)
                .await
                .map_err(delta_error("cannot read the log of", &uri))?;
            if to != t.version() {
                plans.push((role, uri, t, to));
            }
        }
    }
    let outcome = lake::restore(table, args.version, &keys)
        .await
        .map_err(delta_error("cannot restore", &args.table))?;
    let mut also = Vec::new();
    for (role, uri, t, to) in plans {
        also.push(restore_companion(role, uri, t, to).await?);
    }
    let undo = format!(
        "tidemark restore {} --version {}",
        if given.is_empty() {
            &args.table
        } else {
            &given
        },
        outcome.new_version.saturating_sub(1)
    );
    Ok(match args.output {
        OutputFormat::Json => {
            let mut v = serde_json::to_value(&outcome).unwrap_or_default();
            v["table"] = args.table.clone().into();
            v["undo"] = undo.into();
            v["also_restored"] = serde_json::to_value(&also).unwrap_or_default();
            v.to_string() + "\n"
        }
        OutputFormat::Text => {
            let mut out = format!(
                "restored {} to version {} as new version {} ({} files restored, {} removed)\n",
                args.table,
                outcome.restored_version,
                outcome.new_version,
                outcome.files_restored,
                outcome.files_removed
            );
            for a in &also {
                out.push_str(&a.line());
            }
            for (app, v) in &outcome.source_versions {
                out.push_str(&format!(
                    "{app}: the next run re-reads source rows landed after source version {v}\n"
                ));
            }
            for (pipeline, run) in &outcome.ingest_runs {
                let after = match run {
                    0 => "every landing file is ingested again by its next run".to_string(),
                    n => format!("the files its runs after run {n} ingested are ingested again by its next run"),
                };
                out.push_str(&format!("ingest `{pipeline}`: {after}\n"));
            }
            out.push_str(&format!("to undo: {undo}\n"));
            out
        }
    })
}

/// A companion table restored with its pipeline's main table.
#[derive(Debug, serde::Serialize)]
struct AlsoRestored {
    role: &'static str,
    table: String,
    /// The version restored (`None`: the table had no commit then, so it was emptied).
    restored_version: Option<u64>,
    new_version: Option<u64>,
}

impl AlsoRestored {
    fn line(&self) -> String {
        match self.restored_version {
            Some(v) => format!(
                "restored its {} table {} to version {v} as new version {}, to match\n",
                self.role,
                self.table,
                self.new_version.unwrap_or_default()
            ),
            None => format!(
                "emptied its {} table {} (it had no rows then) as new version {}\n",
                self.role,
                self.table,
                self.new_version.unwrap_or_default()
            ),
        }
    }
}

/// The tables restored with a pipeline's target (an aggregate's status and adjustments tables),
/// and the target's keys when each names one row (a `cdc_merge`: its restore's feed pairs a
/// key's rows as an update).
type Companions = (Vec<(&'static str, String)>, Vec<String>);

fn companions_of(args: &RestoreArgs) -> Result<Companions, AppError> {
    if super::pipeline_or_table(&args.table, &args.from)?.is_none() {
        return Ok((Vec::new(), Vec::new()));
    }
    let p = load_pipeline(&args.table, &args.from)?;
    let keys = match &p.spec {
        Spec::CdcMerge(m) => m.keys.clone(),
        _ => Vec::new(),
    };
    let companions = crate::pipeline::companions(&p)
        .into_iter()
        .map(|(t, uri)| (t.as_str(), uri))
        .collect();
    Ok((companions, keys))
}

async fn restore_companion(
    role: &'static str,
    uri: String,
    table: deltalake::DeltaTable,
    to: Option<u64>,
) -> Result<AlsoRestored, AppError> {
    let (restored_version, new_version) = match to {
        Some(v) => {
            let o = lake::restore(table, v, &[])
                .await
                .map_err(delta_error("cannot restore", &uri))?;
            (Some(v), Some(o.new_version))
        }
        None => {
            let (t, _) = table
                .delete()
                .await
                .map_err(delta_error("cannot empty", &uri))?;
            (None, t.version())
        }
    };
    Ok(AlsoRestored {
        role,
        table: uri,
        restored_version,
        new_version,
    })
}

fn delta_error<'a>(
    action: &'static str,
    uri: &'a str,
) -> impl FnOnce(deltalake::DeltaTableError) -> AppError + 'a {
    move |source| AppError::Delta {
        action,
        uri: uri.to_string(),
        source: Box::new(source),
    }
}

/// What `maintain` acts on: a pipeline's tables, or a table by URI.
fn maintain_target(args: &MaintainArgs) -> Result<crate::pipeline::maintain::Tables, AppError> {
    use crate::pipeline::maintain::Tables;
    if super::pipeline_or_table(&args.table, &args.from)?.is_none() {
        return Ok(Tables::table(&args.table));
    }
    Ok(Tables::of(&load_pipeline(&args.table, &args.from)?))
}

/// `tidemark maintain`.
pub async fn maintain(args: MaintainArgs, clock: &dyn Clock) -> Result<String, AppError> {
    let tables = maintain_target(&args)?;
    let options = crate::pipeline::maintain::Options {
        compact: !args.no_compact,
        retention: args.retention,
        dry_run: args.dry_run,
    };
    let m = crate::pipeline::maintain::maintain(&tables, options, clock.now()).await?;
    let spill_base = args
        .spill_dir
        .clone()
        .unwrap_or_else(run::default_spill_base);
    let spill_dirs = run::sweep_spill_dirs(&spill_base, args.dry_run);
    let done = Maintained {
        uri: m.uri,
        report: m.report,
        tombstones: m.tombstones,
        maintained: m.companions,
        spill_dirs,
        spill_base,
    };
    Ok(match args.output {
        OutputFormat::Json => maintain_json(&done),
        OutputFormat::Text => maintain_text(&done),
    })
}

/// What `maintain` did to a pipeline's (or a table's) tables.
struct Maintained {
    uri: String,
    report: lake::MaintainReport,
    tombstones: Option<(
        crate::merge::tombstones::Expired,
        Option<std::time::Duration>,
    )>,
    maintained: Vec<(crate::run::Table, String, lake::MaintainReport)>,
    spill_dirs: Vec<std::path::PathBuf>,
    spill_base: std::path::PathBuf,
}

/// `maintain --output json`: the target's report, with its tombstones, companions and stale
/// spill directories.
fn maintain_json(m: &Maintained) -> String {
    let Maintained {
        report,
        tombstones,
        maintained,
        spill_dirs,
        ..
    } = m;
    let mut v = serde_json::to_value(report).unwrap_or_default();
    v["tombstones"] = tombstones
        .as_ref()
        .map(|(e, _)| serde_json::to_value(e).unwrap_or_default())
        .unwrap_or_default();
    v["ingest_record"] = maintained
        .iter()
        .find(|(role, _, _)| *role == crate::run::Table::Record)
        .map(|(_, _, r)| serde_json::to_value(r).unwrap_or_default())
        .unwrap_or_default();
    v["companions"] = maintained
        .iter()
        .map(|(role, uri, r)| {
            let mut c = serde_json::to_value(r).unwrap_or_default();
            c["role"] = role.as_str().into();
            c["table"] = uri.clone().into();
            c
        })
        .collect::<Vec<_>>()
        .into();
    v["stale_spill_dirs"] = spill_dirs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .into();
    serde_json::to_string(&v).unwrap_or_default() + "\n"
}

/// `maintain`'s text: a line per step and per companion table.
fn maintain_text(m: &Maintained) -> String {
    let Maintained {
        uri,
        report,
        tombstones,
        maintained,
        spill_dirs,
        spill_base,
    } = m;
    let mut out = format!(
        "{}{uri}: version {} -> {}\n",
        if report.dry_run { "dry run: " } else { "" },
        report.version_before.map_or("-".into(), |v| v.to_string()),
        report.version_after.map_or("-".into(), |v| v.to_string()),
    );
    let (would, kept) = if report.dry_run {
        ("would be ", "would keep")
    } else {
        ("", "kept")
    };
    if let Some((e, retain)) = tombstones {
        out.push_str(&format!(
            "  tombstones (deletes.retain {}): {} older than {} {would}removed (in a commit of their own; the files it rewrites are not counted below); {} key(s) {would}recorded in {}\n",
            retain.map_or("-".into(), |r| humantime::format_duration(r).to_string()),
            e.tombstones,
            e.horizon,
            e.recorded,
            e.removed_keys_uri
        ));
    }
    let purged = match report.files_purged {
        0 => String::new(),
        n => format!(
            " ({n} of them for their deletion vectors: at least {:.0}% of their rows deleted)",
            100.0 * lake::PURGE_DELETED_SHARE
        ),
    };
    out.push_str(&format!(
        "  compaction: {} files {would}compacted into {}{purged}; checkpoint {would}written at version {}\n",
        report.files_compacted,
        report.files_written,
        report
            .checkpoint_version
            .map_or("-".into(), |v| v.to_string())
    ));
    out.push_str(&format!(
        "  vacuum (retention {} h): {} files {would}deleted; {kept} {} unreferenced files inside the retention (removed by recent commits, or orphans of recent crashes; a later maintain removes them)\n",
        report.retention_hours,
        report.files_vacuumed,
        report.files_unreferenced_within_retention
    ));
    for (role, uri, r) in maintained.iter() {
        let role = match role {
            crate::run::Table::Record => "ingest record",
            other => other.as_str(),
        };
        out.push_str(&format!(
            "  {role} {uri}: version {} -> {}; {} small files {would}compacted into {}; {} files {would}deleted\n",
            r.version_before.map_or("-".into(), |v| v.to_string()),
            r.version_after.map_or("-".into(), |v| v.to_string()),
            r.files_compacted,
            r.files_written,
            r.files_vacuumed,
        ));
    }
    out.push_str(&format!(
        "  spill: {} stale spill director{} of processes that no longer exist {}under {}\n",
        spill_dirs.len(),
        if spill_dirs.len() == 1 { "y" } else { "ies" },
        if report.dry_run {
            "would be removed "
        } else {
            "removed "
        },
        spill_base.display()
    ));
    out
}
