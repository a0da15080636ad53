//! Every application transaction (`txn` action) of a table under an app-id prefix, read in one
//! pass over the log.
//!
//! delta-rs answers "the version of app id X" one id at a time, each answer a replay of the log;
//! an ingest wants all of its pipeline's at once (its run number and, on bronze written before
//! the ingest record's index, the one `txn` per landing file it migrates). This reads the newest checkpoint's `txn` column (a projection of
//! one column of a Parquet file) and the JSON commits after it, up to the snapshot's version:
//! the same replay the kernel does, once. The cost is the checkpoint's txn column plus at most a
//! checkpoint interval of commits, whatever the number of commits in the table's past.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, Int64Array, StringArray, StructArray};
use deltalake::logstore::ObjectStoreRef;
use deltalake::{DeltaTable, DeltaTableError};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
// Deprecated in favour of hand-written readers; it does exactly what is needed (ranged gets of
// one column), as in `datafile.rs`.
#[allow(deprecated)]
use parquet::arrow::async_reader::{ParquetObjectReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::ProjectionMask;

/// What the log says of one app id: its newest `txn`'s version and `lastUpdated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Txn {
    pub version: i64,
    pub last_updated: Option<i64>,
}

/// The newest `txn` per app id starting with `prefix`, as of `table`'s loaded version, keyed by
/// the rest of the app id (the prefix stripped: one allocation per entry).
pub async fn with_prefix(
    table: &DeltaTable,
    prefix: &str,
) -> Result<HashMap<String, Txn>, DeltaTableError> {
    let Some(version) = table.version() else {
        return Ok(HashMap::new());
    };
    let version = version as i64;
    let store = table.object_store();
    let log = Path::from("_delta_log");
    let names: Vec<(String, u64)> = store
        .list(Some(&log))
        .map_ok(|m| {
            (
                m.location.filename().unwrap_or_default().to_string(),
                m.size,
            )
        })
        .try_collect()
        .await
        .map_err(|e| DeltaTableError::GenericError { source: e.into() })?;
    let checkpoint = newest_checkpoint(&names, version);
    let mut out = HashMap::new();
    let first_commit = match &checkpoint {
        Some((v, parts)) => {
            for (name, size) in parts {
                let path = log.clone().join(name.as_str());
                if name.ends_with(".json") {
                    let generic =
                        |e: object_store::Error| DeltaTableError::GenericError { source: e.into() };
                    let bytes = store
                        .get(&path)
                        .await
                        .map_err(generic)?
                        .bytes()
                        .await
                        .map_err(generic)?;
                    json_txns(&bytes, prefix, &mut out)?;
                } else {
                    parquet_txns(store.clone(), path, *size, prefix, &mut out).await?;
                }
            }
            v + 1
        }
        None => 0,
    };
    let commits: Vec<i64> = (first_commit..=version).collect();
    let bodies: Vec<bytes::Bytes> = futures::stream::iter(commits)
        .map(|v| {
            let store = store.clone();
            let path = log.clone().join(format!("{v:020}.json").as_str());
            async move {
                let r = store.get(&path).await?;
                r.bytes().await
            }
        })
        .buffered(16)
        .try_collect()
        .await
        .map_err(|e| DeltaTableError::GenericError { source: e.into() })?;
    for body in bodies {
        json_txns(&body, prefix, &mut out)?;
    }
    Ok(out)
}

/// The newest complete checkpoint at or below `version`: its version and its files.
fn newest_checkpoint(names: &[(String, u64)], version: i64) -> Option<(i64, Vec<(String, u64)>)> {
    // version -> (parts it announces, files found)
    type Parts = (Option<u32>, Vec<(String, u64)>);
    let mut by_version: HashMap<i64, Parts> = HashMap::new();
    for (name, size) in names {
        let Some((v, rest)) = name.split_once(".checkpoint") else {
            continue;
        };
        let Ok(v) = v.parse::<i64>() else { continue };
        if v > version || !(rest.ends_with(".parquet") || rest.ends_with(".json")) {
            continue;
        }
        // `.parquet` (single), `.<part>.<parts>.parquet` (multi-part), `.<uuid>.<ext>` (v2).
        let pieces: Vec<&str> = rest.trim_start_matches('.').split('.').collect();
        let parts = match pieces.as_slice() {
            [p, n, "parquet"] if p.len() == 10 && n.len() == 10 => n.parse::<u32>().ok(),
            _ => Some(1),
        };
        let entry = by_version.entry(v).or_insert((parts, Vec::new()));
        entry.1.push((name.clone(), *size));
    }
    let mut complete: Vec<(i64, Vec<(String, u64)>)> = by_version
        .into_iter()
        .filter(|(_, (parts, files))| {
            parts.is_some_and(|n| n == 1 && !files.is_empty() || files.len() as u32 == n)
        })
        .map(|(v, (parts, mut files))| {
            if parts == Some(1) {
                // A v1 and a v2 checkpoint of one version say the same: read one.
                files.sort();
                files.truncate(1);
            }
            (v, files)
        })
        .collect();
    complete.sort_by_key(|(v, _)| *v);
    complete.pop()
}

fn json_txns(
    body: &[u8],
    prefix: &str,
    out: &mut HashMap<String, Txn>,
) -> Result<(), DeltaTableError> {
    for line in body.split(|b| *b == b'\n') {
        if line.is_empty() || !contains(line, b"\"txn\"") {
            continue;
        }
        let action: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| DeltaTableError::GenericError { source: e.into() })?;
        let Some(txn) = action.get("txn") else {
            continue;
        };
        let (Some(app), Some(version)) = (
            txn.get("appId").and_then(|v| v.as_str()),
            txn.get("version").and_then(|v| v.as_i64()),
        ) else {
            continue;
        };
        if let Some(rest) = app.strip_prefix(prefix) {
            let last_updated = txn.get("lastUpdated").and_then(|v| v.as_i64());
            out.insert(
                rest.to_string(),
                Txn {
                    version,
                    last_updated,
                },
            );
        }
    }
    Ok(())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn parquet_txns(
    store: ObjectStoreRef,
    path: Path,
    size: u64,
    prefix: &str,
    out: &mut HashMap<String, Txn>,
) -> Result<(), DeltaTableError> {
    #[allow(deprecated)]
    let reader = ParquetObjectReader::new(store, path).with_file_size(size);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let Some(index) = builder
        .parquet_schema()
        .root_schema()
        .get_fields()
        .iter()
        .position(|f| f.name() == "txn")
    else {
        return Ok(());
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let mut stream = builder.with_projection(mask).build()?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let Some(txn) = batch.column(0).as_struct_opt() else {
            continue;
        };
        read_struct(txn, prefix, out);
    }
    Ok(())
}

fn read_struct(txn: &StructArray, prefix: &str, out: &mut HashMap<String, Txn>) {
    let app = txn
        .column_by_name("appId")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>());
    let version = txn
        .column_by_name("version")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>());
    let last = txn
        .column_by_name("lastUpdated")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>());
    let (Some(app), Some(version)) = (app, version) else {
        return;
    };
    for i in 0..txn.len() {
        if txn.is_null(i) || app.is_null(i) || version.is_null(i) {
            continue;
        }
        if let Some(rest) = app.value(i).strip_prefix(prefix) {
            let last_updated = last.and_then(|l| (!l.is_null(i)).then(|| l.value(i)));
            out.insert(
                rest.to_string(),
                Txn {
                    version: version.value(i),
                    last_updated,
                },
            );
        }
    }
}
