//! `tidemark changes`: what a table's change data feed says changed between two versions —
//! per version and change type, how many rows, and which keys — read with delta-rs' CDF reader,
//! so an operator sees what a run did to consumers of the feed.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use futures::StreamExt;
use serde::Serialize;

use super::{load_pipeline, AppError};
use crate::cli::{ChangesArgs, OutputFormat};
use crate::config::pipeline::{with_spec, Kind, Settings};
use crate::lake;

/// The change types of a Delta change data feed, in the order reports list them.
const TYPES: [&str; 4] = ["insert", "update_preimage", "update_postimage", "delete"];

#[derive(Debug, Serialize)]
struct ChangesReport {
    table: String,
    pipeline: Option<String>,
    from_version: u64,
    to_version: u64,
    /// Per version: rows per change type.
    versions: Vec<VersionChanges>,
    totals: BTreeMap<&'static str, u64>,
    key_columns: Vec<String>,
    /// Per change type, the first `limit` keys (rendered `col="value"`).
    keys: BTreeMap<&'static str, Vec<String>>,
    limit: usize,
}

#[derive(Debug, Serialize)]
struct VersionChanges {
    version: i64,
    counts: BTreeMap<&'static str, u64>,
}

/// `Some(v)`: the feed was off at `from` and turned on at version `v` (or later than `to`:
/// `to + 1`).
async fn feed_start(
    table: &deltalake::DeltaTable,
    from: u64,
    to: u64,
) -> Result<Option<u64>, deltalake::DeltaTableError> {
    let mut at_from = table.clone();
    at_from.load_version(from).await?;
    if lake::datafile::change_data_feed(&at_from) {
        return Ok(None);
    }
    for v in (from + 1)..=to {
        let Some(actions) = lake::commit_actions(table, v).await? else {
            continue;
        };
        for action in actions {
            if let deltalake::kernel::Action::Metadata(m) = action {
                let on = m
                    .configuration()
                    .get(lake::datafile::CHANGE_DATA_FEED)
                    .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                if on {
                    return Ok(Some(v));
                }
            }
        }
    }
    Ok(Some(to + 1))
}

/// `tidemark changes`.
pub async fn changes(args: ChangesArgs) -> Result<String, AppError> {
    let mut kind = None;
    let (uri, mut keys, pipeline) = match super::pipeline_or_table(&args.table, &args.from)? {
        Some(_) => {
            let p = load_pipeline(&args.table, &args.from)?;
            kind = Some(p.kind());
            let (uri, keys) = with_spec!(&p.spec, k => (k.target_uri().to_string(), k.row_keys()));
            (uri, keys, Some(p.name.clone()))
        }
        None => (args.table.clone(), Vec::new(), None),
    };
    let is_gold = kind == Some(Kind::Aggregate);
    let is_dimension = kind == Some(Kind::Dimension);
    if !args.keys.is_empty() {
        keys = args.keys.clone();
    }
    let role = if pipeline.is_some() {
        "target"
    } else {
        "table"
    };
    let table = lake::open_required(&uri, role).await?;
    if !lake::datafile::change_data_feed(&table) {
        let how = if is_gold {
            "an aggregate's gold keeps none (each run replaces whole days: `tidemark history` lists them)"
        } else if is_dimension {
            "a dimension keeps none (a run that changes keys writes the table again: `tidemark history` lists the runs, with the keys and rows they changed)"
        } else {
            "set `target.change_data_feed: true` in its pipeline, and the next run turns it on"
        };
        return Err(AppError::Usage(format!(
            "{uri} keeps no change data feed (its `delta.enableChangeDataFeed` is not true): {how}"
        )));
    }
    let latest = table.version().unwrap_or(0);
    let to = args.to_version.unwrap_or(latest);
    if to > latest || args.from_version > to {
        return Err(AppError::Usage(format!(
            "--from-version {} --to-version {to}: the versions must satisfy from <= to <= {latest} (the latest version of {uri})",
            args.from_version
        )));
    }
    let delta = |source| AppError::Delta {
        action: "read the change data feed of",
        uri: uri.clone(),
        source: Box::new(source),
    };
    // Versions from before the feed was turned on have no change files: a reader would take
    // their whole files as inserted and deleted.
    if let Some(start) = feed_start(&table, args.from_version, to)
        .await
        .map_err(delta)?
    {
        return Err(AppError::Usage(format!(
            "the change data feed of {uri} starts at version {start} (it was turned on then): use --from-version {start} or later"
        )));
    }
    let ctx = crate::lake::session::context();
    let plan = table
        .clone()
        .scan_cdf()
        .with_starting_version(args.from_version)
        .with_ending_version(to)
        .build(&ctx.state(), None)
        .await
        .map_err(delta)?;
    let mut stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx())
        .map_err(|e| delta(e.into()))?;
    let mut report = ChangesReport {
        table: uri.clone(),
        pipeline,
        from_version: args.from_version,
        to_version: to,
        versions: Vec::new(),
        totals: TYPES.iter().map(|t| (*t, 0)).collect(),
        key_columns: keys.clone(),
        keys: BTreeMap::new(),
        limit: args.limit,
    };
    let mut per_version: BTreeMap<i64, BTreeMap<&'static str, u64>> = BTreeMap::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| delta(e.into()))?;
        fold(&batch, &keys, args.limit, &mut per_version, &mut report)
            .map_err(|e| delta(e.into()))?;
    }
    report.versions = per_version
        .into_iter()
        .map(|(version, counts)| VersionChanges { version, counts })
        .collect();
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string(&report).unwrap_or_default() + "\n",
        OutputFormat::Text => text(&report),
    })
}

fn fold(
    batch: &RecordBatch,
    keys: &[String],
    limit: usize,
    per_version: &mut BTreeMap<i64, BTreeMap<&'static str, u64>>,
    report: &mut ChangesReport,
) -> Result<(), arrow::error::ArrowError> {
    let kind = arrow::compute::cast(
        batch
            .column_by_name("_change_type")
            .ok_or_else(|| missing("_change_type"))?,
        &DataType::Utf8,
    )?;
    let kind = kind.as_string::<i32>();
    let version = arrow::compute::cast(
        batch
            .column_by_name("_commit_version")
            .ok_or_else(|| missing("_commit_version"))?,
        &DataType::Int64,
    )?;
    let version = version.as_primitive::<arrow::datatypes::Int64Type>();
    for i in 0..batch.num_rows() {
        let Some(t) = TYPES.iter().find(|t| **t == kind.value(i)) else {
            continue;
        };
        let v = if version.is_null(i) {
            -1
        } else {
            version.value(i)
        };
        *per_version
            .entry(v)
            .or_insert_with(|| TYPES.iter().map(|t| (*t, 0)).collect())
            .entry(t)
            .or_default() += 1;
        *report.totals.entry(t).or_default() += 1;
        // A pre-image and its post-image name the same key: list updates once.
        if keys.is_empty() || *t == "update_preimage" {
            continue;
        }
        let listed = report.keys.entry(t).or_default();
        if listed.len() < limit {
            listed.push(crate::run::render::render_key(batch, keys, i));
        }
    }
    Ok(())
}

fn missing(column: &str) -> arrow::error::ArrowError {
    arrow::error::ArrowError::SchemaError(format!("the change data feed has no `{column}` column"))
}

fn text(r: &ChangesReport) -> String {
    let mut out = format!(
        "changes of {}{} from version {} to {}\n",
        r.table,
        r.pipeline
            .as_ref()
            .map(|p| format!(" (target of pipeline {p})"))
            .unwrap_or_default(),
        r.from_version,
        r.to_version
    );
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(["version", "insert", "update (pre/post)", "delete"]);
    for v in &r.versions {
        let c = |k: &str| v.counts.get(k).copied().unwrap_or(0);
        t.add_row(vec![
            v.version.to_string(),
            c("insert").to_string(),
            format!("{}/{}", c("update_preimage"), c("update_postimage")),
            c("delete").to_string(),
        ]);
    }
    let c = |k: &str| r.totals.get(k).copied().unwrap_or(0);
    t.add_row(vec![
        "total".to_string(),
        c("insert").to_string(),
        format!("{}/{}", c("update_preimage"), c("update_postimage")),
        c("delete").to_string(),
    ]);
    out.push_str(&t.to_string());
    out.push('\n');
    for (kind, label) in [
        ("insert", "inserted"),
        ("update_postimage", "updated"),
        ("delete", "deleted"),
    ] {
        if let Some(keys) = r.keys.get(kind).filter(|k| !k.is_empty()) {
            let more = c(kind).saturating_sub(keys.len() as u64);
            out.push_str(&format!(
                "{label}: {}{}\n",
                keys.join("; "),
                if more > 0 {
                    format!(" (and {more} more; --limit to see them)")
                } else {
                    String::new()
                }
            ));
        }
    }
    if r.versions.is_empty() {
        out.push_str("no changes in these versions\n");
    }
    out
}
