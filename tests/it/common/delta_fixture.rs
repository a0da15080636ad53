//! Test-only writers of Delta tables in shapes delta-rs 1.1 cannot produce: **deletion
//! vectors** (delta-rs reads them but never writes them), as another engine's `DELETE` leaves
//! them. Everything here follows the Delta protocol (PROTOCOL.md, "Deletion Vectors" and
//! "Deletion Vector Format"):
//!
//! * [`enable_deletion_vectors`] commits a `protocol` (reader 3 / writer 7, `readerFeatures` and
//!   `writerFeatures` `["deletionVectors"]`) and the table's `metaData` with
//!   `delta.enableDeletionVectors = true`.
//! * [`delete_where`] is a DV-based `DELETE WHERE column IN (values)`: for every live data file
//!   holding such rows it finds their positions (0-based row index in the Parquet file), builds a
//!   64-bit `RoaringTreemap` of them and commits a `remove` + `add` pair for the same path, the
//!   `add` carrying `deletionVector: {storageType, pathOrInlineDv, offset, sizeInBytes,
//!   cardinality}` and its statistics marked `tightBounds: false`.
//!   - `DvStorage::File { prefix }` (`"u"`): one `deletion_vector_<uuid>.bin` per commit (under
//!     `<prefix>/` when the prefix is not empty) holding every DV of the commit: a version byte
//!     (1), then per DV a 4-byte big-endian size, the DV bytes (4-byte little-endian magic
//!     1681511377, then the RoaringTreemap portable serialization: 8-byte LE bucket count, per
//!     bucket a 4-byte LE high key and a standard 32-bit portable roaring bitmap) and a 4-byte
//!     big-endian CRC-32 of those DV bytes. `pathOrInlineDv` is the prefix followed by the Z85
//!     encoding (20 characters) of the file's UUID; `offset` is where the DV's size field starts.
//!   - `DvStorage::Inline` (`"i"`): `pathOrInlineDv` is the Z85 encoding of the DV bytes (padded
//!     with zeros to a multiple of 4, as Z85 requires; `sizeInBytes` is the unpadded length).
//!
//! The log is read from its JSON commit files (these test tables have no checkpoint; the
//! helpers panic if one exists). A file that already carries a DV is not deleted from again
//! (panics): the tests never need to merge two DVs.
//!
//! Checked outside the test run (which must not need Python) with the Python `deltalake`
//! package 1.6.6 (PyPI) on tables written here — a file DV with a prefix next to files without
//! DVs plus inline DVs on two files, a file DV without prefix holding two DVs (offsets 1
//! and beyond), and 10,086 deleted positions across several roaring containers in a 70,000-row
//! file: `QueryBuilder().register("t", DeltaTable(path)).execute("select id from t")` returned
//! exactly the rows not deleted, and `DeltaTable.deletion_vectors()` the expected positions.
//! (`DeltaTable.to_pyarrow_table()` refuses any table with the `deletionVectors` reader
//! feature in that version; and that package shares delta-rs' reader, so it is a check of the
//! format, not an independent engine.) DuckDB's `delta` extension could not be tried: `pip
//! install duckdb` works, but the extension is downloaded from extensions.duckdb.org, which this
//! machine cannot reach.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use roaring::RoaringTreemap;
use serde_json::{json, Value};

/// Where the DVs of one [`delete_where`] commit are stored.
#[derive(Debug, Clone, Copy)]
pub enum DvStorage {
    /// Storage type `u`: a `deletion_vector_<uuid>.bin` file, in `<prefix>/` when not empty.
    File { prefix: &'static str },
    /// Storage type `i`: the DV is inline in the log.
    Inline,
}

fn log_dir(table: &Path) -> PathBuf {
    table.join("_delta_log")
}

/// The table's commit files, by version. Panics if the log has a checkpoint.
fn commits(table: &Path) -> BTreeMap<u64, Vec<Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(log_dir(table)).expect("read _delta_log") {
        let name = entry.expect("log entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            !name.contains("checkpoint"),
            "delta_fixture reads JSON commits only; {name} is a checkpoint"
        );
        let Some(version) = name
            .strip_suffix(".json")
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        let text = std::fs::read_to_string(entry_path(table, &name)).expect("read commit");
        let actions = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("commit line is JSON"))
            .collect();
        out.insert(version, actions);
    }
    out
}

fn entry_path(table: &Path, name: &str) -> PathBuf {
    log_dir(table).join(name)
}

/// The latest `metaData` and the live `add` actions (by path) of the table.
fn state(table: &Path) -> (u64, Value, BTreeMap<String, Value>) {
    let mut metadata = Value::Null;
    let mut live = BTreeMap::new();
    let mut latest = 0;
    for (version, actions) in commits(table) {
        latest = version;
        for a in actions {
            if let Some(m) = a.get("metaData") {
                metadata = m.clone();
            }
            if let Some(r) = a.get("remove") {
                live.remove(r["path"].as_str().expect("remove.path"));
            }
            if let Some(add) = a.get("add") {
                live.insert(
                    add["path"].as_str().expect("add.path").to_string(),
                    add.clone(),
                );
            }
        }
    }
    assert!(!metadata.is_null(), "no metaData in {}", table.display());
    (latest, metadata, live)
}

/// Writes commit `version` (must not exist: a concurrent writer would make this a test bug).
fn write_commit(table: &Path, version: u64, actions: &[Value]) {
    let path = log_dir(table).join(format!("{version:020}.json"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("commit file must be new");
    for a in actions {
        writeln!(f, "{a}").expect("write commit line");
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn commit_info(operation: &str, parameters: Value) -> Value {
    json!({"commitInfo": {
        "timestamp": now_ms(),
        "operation": operation,
        "operationParameters": parameters,
        "engineInfo": "tidemark-tests delta_fixture",
    }})
}

/// Upgrades the table to the `deletionVectors` feature: one commit with the new `protocol`
/// (reader 3 / writer 7) and the `metaData` with `delta.enableDeletionVectors = true`. Returns
/// the version committed.
pub fn enable_deletion_vectors(table: &Path) -> u64 {
    let (latest, mut metadata, _) = state(table);
    let config = metadata
        .as_object_mut()
        .expect("metaData is an object")
        .entry("configuration")
        .or_insert_with(|| json!({}));
    config["delta.enableDeletionVectors"] = json!("true");
    let version = latest + 1;
    write_commit(
        table,
        version,
        &[
            json!({"protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }}),
            json!({ "metaData": metadata }),
            commit_info(
                "SET TBLPROPERTIES",
                json!({"properties": "{\"delta.enableDeletionVectors\":\"true\"}"}),
            ),
        ],
    );
    version
}

/// Row positions (0-based, across row groups) of the Parquet file whose `column` (a string
/// column, stored under that name) holds one of `values`.
fn positions(file: &Path, column: &str, values: &BTreeSet<&str>) -> RoaringTreemap {
    let f = std::fs::File::open(file).expect("open data file");
    let builder = ParquetRecordBatchReaderBuilder::try_new(f).expect("parquet footer");
    let index = builder
        .schema()
        .index_of(column)
        .unwrap_or_else(|_| panic!("{} has no column {column}", file.display()));
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder.with_projection(mask).build().expect("reader");
    let mut out = RoaringTreemap::new();
    let mut row = 0u64;
    for batch in reader {
        let batch = batch.expect("read batch");
        let col = arrow::compute::cast(batch.column(0), &DataType::Utf8).expect("cast to utf8");
        let col = col.as_string::<i32>();
        for i in 0..col.len() {
            if col.is_valid(i) && values.contains(col.value(i)) {
                out.insert(row);
            }
            row += 1;
        }
    }
    out
}

/// The DV bytes: little-endian magic, then the RoaringTreemap portable serialization (the same
/// encoder tidemark writes its own deletion vectors with, `tidemark::lake::dv`).
fn dv_bytes(rows: &RoaringTreemap) -> Vec<u8> {
    tidemark::lake::dv::to_bytes(rows).expect("serialize roaring treemap")
}

/// Marks as deleted, with deletion vectors, every row whose `column` is one of `values`, in one
/// commit (like another engine's `DELETE`). The table must have the `deletionVectors` feature
/// ([`enable_deletion_vectors`]). Returns the number of rows deleted (0: nothing committed).
pub fn delete_where(table: &Path, column: &str, values: &[&str], storage: DvStorage) -> u64 {
    let wanted: BTreeSet<&str> = values.iter().copied().collect();
    let (latest, metadata, live) = state(table);
    assert_eq!(
        metadata["configuration"]["delta.enableDeletionVectors"],
        json!("true"),
        "enable deletion vectors first"
    );
    let mut per_file: Vec<(Value, RoaringTreemap)> = Vec::new();
    for (path, add) in &live {
        assert!(
            !path.contains('%') && !path.contains("://"),
            "delta_fixture handles plain relative paths only: {path}"
        );
        let rows = positions(&table.join(path), column, &wanted);
        if rows.is_empty() {
            continue;
        }
        assert!(
            add.get("deletionVector").is_none_or(Value::is_null),
            "{path} already has a deletion vector"
        );
        per_file.push((add.clone(), rows));
    }
    if per_file.is_empty() {
        return 0;
    }

    // The DV file of this commit (storage `u`): version byte, then each DV at its offset.
    let uuid = uuid::Uuid::new_v4();
    let mut file = vec![1u8];
    let mut actions = Vec::new();
    let mut deleted = 0;
    for (add, rows) in per_file {
        let bytes = dv_bytes(&rows);
        let cardinality = rows.len();
        deleted += cardinality;
        let dv = match storage {
            DvStorage::File { prefix } => {
                let offset = file.len();
                file.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
                file.extend_from_slice(&bytes);
                file.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
                json!({
                    "storageType": "u",
                    "pathOrInlineDv": format!("{prefix}{}", z85::encode(uuid.as_bytes())),
                    "offset": offset,
                    "sizeInBytes": bytes.len(),
                    "cardinality": cardinality,
                })
            }
            DvStorage::Inline => {
                let mut padded = bytes.clone();
                padded.resize(bytes.len().div_ceil(4) * 4, 0);
                json!({
                    "storageType": "i",
                    "pathOrInlineDv": z85::encode(&padded),
                    "sizeInBytes": bytes.len(),
                    "cardinality": cardinality,
                })
            }
        };
        let mut remove = json!({
            "path": add["path"],
            "deletionTimestamp": now_ms(),
            "dataChange": true,
            "extendedFileMetadata": true,
            "partitionValues": add.get("partitionValues").cloned().unwrap_or(json!({})),
            "size": add["size"],
        });
        if let Some(tags) = add.get("tags").filter(|t| !t.is_null()) {
            remove["tags"] = tags.clone();
        }
        let mut new_add = add.clone();
        new_add["dataChange"] = json!(true);
        new_add["deletionVector"] = dv;
        if let Some(stats) = add.get("stats").and_then(Value::as_str) {
            let mut stats: HashMap<String, Value> =
                serde_json::from_str(stats).expect("stats are JSON");
            stats.insert("tightBounds".into(), json!(false));
            new_add["stats"] = json!(serde_json::to_string(&stats).expect("stats JSON"));
        }
        actions.push(json!({ "remove": remove }));
        actions.push(json!({ "add": new_add }));
    }
    if let DvStorage::File { prefix } = storage {
        let dir = if prefix.is_empty() {
            table.to_path_buf()
        } else {
            table.join(prefix)
        };
        std::fs::create_dir_all(&dir).expect("DV directory");
        std::fs::write(dir.join(format!("deletion_vector_{uuid}.bin")), &file)
            .expect("write DV file");
    }
    actions.push(commit_info(
        "DELETE",
        json!({"predicate": format!("{column} IN ({})", values.join(", "))}),
    ));
    write_commit(table, latest + 1, &actions);
    deleted
}

/// Whether any live file of the table carries a deletion vector.
pub fn has_deletion_vectors(table: &Path) -> bool {
    let (_, _, live) = state(table);
    live.values()
        .any(|a| a.get("deletionVector").is_some_and(|d| !d.is_null()))
}

/// Number of live data files.
pub fn live_files(table: &Path) -> usize {
    state(table).2.len()
}
