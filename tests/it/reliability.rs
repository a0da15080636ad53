//! Reliability tests through the real binary: `tidemark reconcile` and the
//! bad-input corpus in `tests/fixtures/bad_inputs/` (item 6).
//!
//! Each corpus case is a directory with a `case.yml` describing the input (source rows, the
//! pipeline, corruptions) and the outcome a production user should get. The corpus test
//! materializes every case in a temporary directory, drives `tidemark`, checks the outcome and the
//! invariants every failure must keep (no panic, no "internal" exit for a user error, nothing
//! committed by a failed run, the source never written), and writes a summary to
//! `target/reliability/bad_inputs.json` for the reliability scoreboard. The format of `case.yml`
//! is described in `tests/fixtures/bad_inputs/README.md`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder,
    Decimal128Builder, Float64Builder, Int32Builder, Int64Builder, RecordBatch, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use common::{exec, tidemark_in, Out, HOUR, T0};
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::DeltaTable;
use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml::{Mapping, Value as Yaml};

/// The instant the binary believes it is: 2025-01-06T12:00:00Z.
const NOW: i64 = T0 + 12 * HOUR;

// ---------------------------------------------------------------------------------------------
// the binary

// ---------------------------------------------------------------------------------------------
// tables from YAML rows

/// Parses `"id string, updated_at timestamp, val long"` into an Arrow schema (every column
/// nullable). Types: string, long, int, double, boolean, timestamp (µs, UTC), timestamp_ntz (µs,
/// no zone), date, binary (hex values), decimal(P;S).
fn parse_schema(spec: &str) -> Result<SchemaRef, String> {
    let mut fields = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, ty) = part
            .split_once(' ')
            .ok_or_else(|| format!("schema entry {part:?} is not `name type`"))?;
        fields.push(Field::new(name.trim(), parse_type(ty.trim())?, true));
    }
    Ok(Arc::new(Schema::new(fields)))
}

fn parse_type(ty: &str) -> Result<DataType, String> {
    Ok(match ty {
        "string" => DataType::Utf8,
        "long" => DataType::Int64,
        "int" => DataType::Int32,
        "double" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "timestamp_ntz" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "date" => DataType::Date32,
        "binary" => DataType::Binary,
        other => {
            let inner = other
                .strip_prefix("decimal(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("unknown column type {other:?}"))?;
            let (p, s) = inner
                .split_once(';')
                .ok_or_else(|| format!("write decimals as decimal(P;S), not {other:?}"))?;
            DataType::Decimal128(
                p.trim().parse().map_err(|e| format!("{other}: {e}"))?,
                s.trim().parse().map_err(|e| format!("{other}: {e}"))?,
            )
        }
    })
}

/// A timestamp value: RFC 3339, or an offset from 2025-01-06T00:00:00Z like `+90m`, `-2h`.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Some(rest) = s.strip_prefix('+').or_else(|| s.strip_prefix('-')) {
        let d = humantime::parse_duration(rest).map_err(|e| format!("{s:?}: {e}"))?;
        let us = i64::try_from(d.as_micros()).map_err(|e| e.to_string())?;
        return Ok(if s.starts_with('-') { T0 - us } else { T0 + us });
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_micros())
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S")
                .map(|t| t.and_utc().timestamp_micros())
        })
        .map_err(|e| format!("{s:?} is not a time: {e}"))
}

/// A string value: a YAML scalar, or `{repeat: "ab", times: 1000}`.
fn string_value(v: &Yaml) -> Result<String, String> {
    match v {
        Yaml::String(s) => Ok(s.clone()),
        Yaml::Number(n) => Ok(n.to_string()),
        Yaml::Bool(b) => Ok(b.to_string()),
        Yaml::Mapping(m) => {
            let text = m
                .get("repeat")
                .and_then(Yaml::as_str)
                .ok_or("a string spec needs `repeat`")?;
            let times = m
                .get("times")
                .and_then(Yaml::as_u64)
                .ok_or("a string spec needs `times`")?;
            Ok(text.repeat(times as usize))
        }
        other => Err(format!("{other:?} is not a string value")),
    }
}

fn hex_bytes(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("hex {s:?} has an odd length"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("{s:?}: {e}")))
        .collect()
}

/// One column of `rows` as an Arrow array of type `dt` (a missing or null value is null).
fn column(dt: &DataType, name: &str, rows: &[Mapping]) -> Result<ArrayRef, String> {
    let values: Vec<Option<&Yaml>> = rows
        .iter()
        .map(|r| r.get(name).filter(|v| !v.is_null()))
        .collect();
    let err = |v: &Yaml| format!("column {name}: {v:?} does not fit {dt}");
    Ok(match dt {
        DataType::Utf8 => {
            let mut b = StringBuilder::new();
            for v in values {
                b.append_option(v.map(string_value).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Int64 => {
            let mut b = Int64Builder::new();
            for v in values {
                b.append_option(v.map(|v| v.as_i64().ok_or_else(|| err(v))).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Int32 => {
            let mut b = Int32Builder::new();
            for v in values {
                let v = v.map(|v| v.as_i64().ok_or_else(|| err(v))).transpose()?;
                b.append_option(v.map(|v| v as i32));
            }
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::new();
            for v in values {
                b.append_option(v.map(|v| v.as_f64().ok_or_else(|| err(v))).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Boolean => {
            let mut b = BooleanBuilder::new();
            for v in values {
                b.append_option(v.map(|v| v.as_bool().ok_or_else(|| err(v))).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Timestamp(_, tz) => {
            let mut b = TimestampMicrosecondBuilder::new();
            for v in values {
                let t = v
                    .map(|v| v.as_str().ok_or_else(|| err(v)).and_then(parse_time))
                    .transpose()?;
                b.append_option(t);
            }
            let a = b.finish();
            match tz {
                Some(tz) => Arc::new(a.with_timezone(tz.clone())),
                None => Arc::new(a),
            }
        }
        DataType::Date32 => {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
            let mut b = Date32Builder::new();
            for v in values {
                let d = v
                    .map(|v| {
                        let s = v.as_str().ok_or_else(|| err(v))?;
                        let d = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
                            .map_err(|e| format!("{s:?}: {e}"))?;
                        Ok::<_, String>((d - epoch).num_days() as i32)
                    })
                    .transpose()?;
                b.append_option(d);
            }
            Arc::new(b.finish())
        }
        DataType::Binary => {
            let mut b = BinaryBuilder::new();
            for v in values {
                let bytes = v
                    .map(|v| v.as_str().ok_or_else(|| err(v)).and_then(hex_bytes))
                    .transpose()?;
                b.append_option(bytes);
            }
            Arc::new(b.finish())
        }
        DataType::Decimal128(p, s) => {
            let mut b = Decimal128Builder::new();
            for v in values {
                let n = v
                    .map(|v| {
                        let text = string_value(v)?;
                        let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
                        let frac = format!("{frac:0<width$}", width = *s as usize);
                        format!("{int}{frac}")
                            .parse::<i128>()
                            .map_err(|e| format!("{text}: {e}"))
                    })
                    .transpose()?;
                b.append_option(n);
            }
            Arc::new(
                b.finish()
                    .with_precision_and_scale(*p, *s)
                    .map_err(|e| e.to_string())?,
            )
        }
        other => return Err(format!("no test builder for {other}")),
    })
}

/// Rows (column → YAML value) as a batch of `schema`; a row naming an unknown column is an
/// error in the case file, not a silently dropped value.
fn build_batch(schema: &SchemaRef, rows: &[Mapping]) -> Result<RecordBatch, String> {
    for r in rows {
        for k in r.keys() {
            let k = k.as_str().unwrap_or_default();
            if schema.field_with_name(k).is_err() {
                return Err(format!("row names column {k:?}, which the schema lacks"));
            }
        }
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| column(f.data_type(), f.name(), rows))
        .collect::<Result<Vec<_>, _>>()?;
    if rows.is_empty() {
        let columns = schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), 0))
            .collect();
        return RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string());
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

async fn open(path: &Path) -> Option<DeltaTable> {
    let url = deltalake::table::builder::parse_table_uri(path.to_str()?).ok()?;
    deltalake::open_table(url).await.ok()
}

/// Writes `batch` to the Delta table at `path` (created if needed) as one commit.
async fn write_table(
    path: &Path,
    batch: RecordBatch,
    mode: SaveMode,
    schema_mode: Option<SchemaMode>,
) -> Result<(), String> {
    let url =
        deltalake::ensure_table_uri(path.to_str().ok_or("path")?).map_err(|e| e.to_string())?;
    let table = match deltalake::open_table(url.clone()).await {
        Ok(t) => t,
        Err(_) => deltalake::DeltaTableBuilder::from_url(url)
            .and_then(|b| b.build())
            .map_err(|e| e.to_string())?,
    };
    let mut w = table.write(vec![batch]).with_save_mode(mode);
    if let Some(m) = schema_mode {
        w = w.with_schema_mode(m);
    }
    w.await.map(|_| ()).map_err(|e| e.to_string())
}

/// Creates a Delta table with `schema` and no data file: version 0 holds only metadata.
async fn create_empty_table(path: &Path, schema: &SchemaRef) -> Result<(), String> {
    use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
    let kernel: deltalake::kernel::StructType = schema
        .as_ref()
        .try_into_kernel()
        .map_err(|e| e.to_string())?;
    let url =
        deltalake::ensure_table_uri(path.to_str().ok_or("path")?).map_err(|e| e.to_string())?;
    let table = deltalake::DeltaTableBuilder::from_url(url)
        .and_then(|b| b.build())
        .map_err(|e| e.to_string())?;
    table
        .create()
        .with_columns(kernel.fields().cloned())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every row of the Delta table at `path`, or None when there is no readable table.
async fn read_rows(path: &Path) -> Option<Vec<RecordBatch>> {
    let table = open(path).await?;
    let ctx = datafusion::prelude::SessionContext::new();
    table.update_datafusion_session(&ctx.state()).ok()?;
    let provider = table.table_provider().await.ok()?;
    ctx.read_table(provider).ok()?.collect().await.ok()
}

/// Renders a value as tidemark's tests compare it (null as `None`).
fn render(col: &dyn Array, row: usize) -> Option<String> {
    if col.is_null(row) {
        return None;
    }
    let f = ArrayFormatter::try_new(col, &FormatOptions::default()).ok()?;
    Some(f.value(row).to_string())
}

/// The rows of a table as column → rendered value.
fn rendered_rows(batches: &[RecordBatch]) -> Vec<BTreeMap<String, Option<String>>> {
    let mut out = Vec::new();
    for b in batches {
        let schema = b.schema();
        for row in 0..b.num_rows() {
            out.push(
                schema
                    .fields()
                    .iter()
                    .zip(b.columns())
                    .map(|(f, c)| (f.name().clone(), render(c.as_ref(), row)))
                    .collect(),
            );
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// the corpus: case files

const BASE_SCHEMA: &str =
    "id string, updated_at timestamp, _ingested_at timestamp, val long, op string";

/// The pipeline every case starts from (`LAKE` is the case's lake directory). Its line numbers
/// are quoted by cases: keys on line 5, overlap on line 8.
const BASE_PIPELINE: &str = r#"name: test
kind: cdc_merge
source: { uri: "LAKE/bronze" }
target: { uri: "LAKE/silver" }
keys: [id]
sequence_by: updated_at
tie_breakers: [_ingested_at]
overlap: 15m
max_future_skew: 5m
deletes: { column: op, values: [D], mode: soft }
columns: { exclude: [op] }
quarantine: { uri: "LAKE/quarantine" }
"#;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// Must equal the directory name.
    name: String,
    /// What the case is about, in a sentence.
    about: String,
    /// Why the case may still fail: it is counted as failed in the summary without failing the
    /// test, and the test fails once it passes (so the marker is removed).
    pending: Option<String>,
    #[serde(default)]
    pipeline: PipelineSpec,
    /// Schema of the source rows of `append` steps (default: BASE_SCHEMA).
    schema: Option<String>,
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    steps: Vec<Step>,
    /// The command under test, after `tidemark` (default: `run pipeline.yml`). `PIPELINE` and
    /// `LAKE` are replaced.
    command: Option<Vec<String>>,
    /// `TIDEMARK_FAILPOINTS` for the command under test only (not for `run` steps): faults
    /// the OS would cause but root cannot (a file it may not read, a read-only `_delta_log`).
    failpoints: Option<String>,
    expect: Expect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineSpec {
    /// The whole pipeline text instead of the base one.
    raw: Option<String>,
    /// A file of the case directory copied byte for byte as the pipeline.
    file: Option<String>,
    /// `[from, to]` replacements applied to the base (or raw) text; each must match.
    #[serde(default)]
    replace: Vec<(String, String)>,
    /// Text appended to the pipeline.
    append: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Role {
    #[default]
    Source,
    Target,
    Quarantine,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Damage {
    /// Remove the log entry.
    DeleteLog,
    /// Keep the first half of the log entry's bytes.
    TruncateLog,
    /// Replace the log entry with text that is not JSON.
    GarbleLog,
    /// Remove every data file.
    DeleteDataFiles,
    /// Overwrite every data file with bytes that are not Parquet.
    GarbleDataFiles,
    /// Keep the first half of every data file's bytes (its footer is gone).
    TruncateDataFiles,
    /// Put a directory where the next commit's log entry must go.
    BlockNextCommit,
    /// Remove `_delta_log`, leaving the data files.
    DeleteLogDir,
    /// Replace the whole table directory with a regular file.
    ReplaceWithFile,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Step {
    /// One commit of rows appended to the source (schema: the case's `schema`).
    Append(Vec<Mapping>),
    /// One source commit with its own schema: `merge` adds columns, `overwrite` replaces the
    /// table's schema and rows (a drifting source).
    AppendSchema {
        schema: String,
        rows: Vec<Mapping>,
        #[serde(default)]
        overwrite: bool,
    },
    /// Creates the source table with no data file (schema: the case's `schema`).
    CreateSource,
    /// Rows written straight into the target, as a foreign writer would (a new commit).
    WriteTarget { schema: String, rows: Vec<Mapping> },
    /// `tidemark run pipeline.yml` plus these arguments; must succeed.
    Run(Vec<String>),
    /// Damages a table.
    Corrupt {
        #[serde(default)]
        table: Role,
        damage: Damage,
        /// Log version for log damage (default: the latest).
        version: Option<u64>,
    },
    /// A regular file at this path under the lake (to block a directory).
    MakeFile(String),
    /// A landing file at `lake/landing/<path>`: `text`, then the bytes of `hex`, then `repeat`
    /// repeated `times` times, then `tail`.
    Land {
        path: String,
        #[serde(default)]
        text: String,
        hex: Option<String>,
        repeat: Option<String>,
        #[serde(default)]
        times: usize,
        #[serde(default)]
        tail: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    exit: i32,
    /// ok, usage, config, bad_data, unavailable, io, retryable (never internal).
    class: String,
    /// Fragments that must all appear on stderr / stdout.
    #[serde(default)]
    stderr: Vec<String>,
    #[serde(default)]
    stdout: Vec<String>,
    /// Rows in the quarantine table by `_quarantine_reason` after the command (omitted: none).
    #[serde(default)]
    quarantined: BTreeMap<String, u64>,
    #[serde(with = "serde_yaml::with::singleton_map_recursive")]
    target: TargetExpect,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum TargetExpect {
    /// The target's version is the same before and after the command (or still absent).
    Unchanged,
    /// There is no target table.
    Absent,
    /// Exactly these rows (listed columns compared, rendered like the table's values).
    Rows(Vec<Mapping>),
}

fn class_exit(class: &str) -> Option<i32> {
    Some(match class {
        "ok" => 0,
        "usage" => 64,
        "bad_data" => 65,
        "unavailable" => 66,
        "io" => 74,
        "retryable" => 75,
        "config" => 78,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// the corpus: running a case

struct Ctx {
    case_dir: PathBuf,
    dir: PathBuf,
    lake: PathBuf,
    pipeline: PathBuf,
    schema: SchemaRef,
}

impl Ctx {
    fn subst(&self, s: &str) -> String {
        s.replace("LAKE", &self.lake.display().to_string())
            .replace("PIPELINE", &self.pipeline.display().to_string())
    }

    fn table(&self, role: Role) -> PathBuf {
        self.lake.join(match role {
            Role::Source => "bronze",
            Role::Target => "silver",
            Role::Quarantine => "quarantine",
        })
    }
}

/// The files a case directory references (besides `case.yml`).
fn referenced_files(case: &Case) -> BTreeSet<String> {
    case.pipeline.file.iter().cloned().collect()
}

fn write_pipeline(ctx: &Ctx, spec: &PipelineSpec) -> Result<(), String> {
    if let Some(file) = &spec.file {
        let bytes = std::fs::read(ctx.case_dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        return std::fs::write(&ctx.pipeline, bytes).map_err(|e| e.to_string());
    }
    let mut text = spec
        .raw
        .clone()
        .unwrap_or_else(|| BASE_PIPELINE.to_string());
    for (from, to) in &spec.replace {
        if !text.contains(from.as_str()) {
            return Err(format!("pipeline replace: {from:?} is not in the pipeline"));
        }
        text = text.replace(from.as_str(), to);
    }
    if let Some(extra) = &spec.append {
        text.push_str(extra);
    }
    std::fs::write(&ctx.pipeline, ctx.subst(&text)).map_err(|e| e.to_string())
}

fn log_dir(table: &Path) -> PathBuf {
    table.join("_delta_log")
}

fn latest_log_version(table: &Path) -> Result<u64, String> {
    std::fs::read_dir(log_dir(table))
        .map_err(|e| format!("{}: {e}", table.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".json")?.parse::<u64>().ok()
        })
        .max()
        .ok_or_else(|| format!("{} has no log entries", table.display()))
}

fn data_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() && e.file_name() != "_delta_log" {
            out.extend(data_files(&p));
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
    out
}

fn corrupt(table: &Path, damage: Damage, version: Option<u64>) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: {e}", table.display());
    let entry = |v: Option<u64>| -> Result<PathBuf, String> {
        let v = match v {
            Some(v) => v,
            None => latest_log_version(table)?,
        };
        Ok(log_dir(table).join(format!("{v:020}.json")))
    };
    match damage {
        Damage::DeleteLog => std::fs::remove_file(entry(version)?).map_err(io)?,
        Damage::TruncateLog => {
            let p = entry(version)?;
            let bytes = std::fs::read(&p).map_err(io)?;
            std::fs::write(&p, &bytes[..bytes.len() / 2]).map_err(io)?;
        }
        Damage::GarbleLog => {
            std::fs::write(entry(version)?, "this is not a delta log entry {\n").map_err(io)?
        }
        Damage::DeleteDataFiles | Damage::GarbleDataFiles | Damage::TruncateDataFiles => {
            let files = data_files(table);
            if files.is_empty() {
                return Err(format!("{} has no data files to damage", table.display()));
            }
            for f in files {
                match damage {
                    Damage::DeleteDataFiles => std::fs::remove_file(&f).map_err(io)?,
                    Damage::TruncateDataFiles => {
                        let bytes = std::fs::read(&f).map_err(io)?;
                        std::fs::write(&f, &bytes[..bytes.len() / 2]).map_err(io)?;
                    }
                    _ => std::fs::write(&f, b"PAR1 this is not parquet").map_err(io)?,
                }
            }
        }
        Damage::BlockNextCommit => {
            let next = latest_log_version(table)? + 1;
            std::fs::create_dir_all(log_dir(table).join(format!("{next:020}.json"))).map_err(io)?;
        }
        Damage::DeleteLogDir => std::fs::remove_dir_all(log_dir(table)).map_err(io)?,
        Damage::ReplaceWithFile => {
            if table.exists() {
                std::fs::remove_dir_all(table).map_err(io)?;
            }
            std::fs::write(table, "not a table\n").map_err(io)?;
        }
    }
    Ok(())
}

/// Every file under `dir` with its size and content hash: the source must come out of any
/// command exactly as it went in.
fn fingerprint(dir: &Path) -> BTreeMap<PathBuf, (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            if let Ok(bytes) = std::fs::read(&d) {
                out.insert(d.clone(), (bytes.len() as u64, fnv(&bytes)));
            }
            continue;
        };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p.clone());
                out.insert(p, (0, 0));
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.insert(p, (bytes.len() as u64, fnv(&bytes)));
            }
        }
    }
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn table_version(path: &Path) -> Option<u64> {
    open(path).await?.version()
}

async fn apply_step(ctx: &Ctx, step: &Step) -> Result<(), String> {
    match step {
        Step::Append(rows) => {
            let batch = build_batch(&ctx.schema, rows)?;
            write_table(&ctx.table(Role::Source), batch, SaveMode::Append, None).await
        }
        Step::AppendSchema {
            schema,
            rows,
            overwrite,
        } => {
            let batch = build_batch(&parse_schema(schema)?, rows)?;
            let (mode, schema_mode) = if *overwrite {
                (SaveMode::Overwrite, SchemaMode::Overwrite)
            } else {
                (SaveMode::Append, SchemaMode::Merge)
            };
            write_table(&ctx.table(Role::Source), batch, mode, Some(schema_mode)).await
        }
        Step::CreateSource => create_empty_table(&ctx.table(Role::Source), &ctx.schema).await,
        Step::WriteTarget { schema, rows } => {
            let batch = build_batch(&parse_schema(schema)?, rows)?;
            write_table(&ctx.table(Role::Target), batch, SaveMode::Append, None).await
        }
        Step::Run(args) => {
            let out = exec(
                tidemark_in(&ctx.dir, NOW)
                    .arg("run")
                    .arg(&ctx.pipeline)
                    .args(args.iter().map(|a| ctx.subst(a))),
            );
            if out.code != 0 {
                return Err(format!(
                    "setup run {args:?} exited {}: {}",
                    out.code, out.stderr
                ));
            }
            Ok(())
        }
        Step::Corrupt {
            table,
            damage,
            version,
        } => corrupt(&ctx.table(*table), *damage, *version),
        Step::Land {
            path,
            text,
            hex,
            repeat,
            times,
            tail,
        } => {
            let p = ctx.lake.join("landing").join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            let mut bytes = text.as_bytes().to_vec();
            if let Some(h) = hex {
                bytes.extend(hex_bytes(h)?);
            }
            if let Some(r) = repeat {
                bytes.extend(r.repeat(*times).into_bytes());
            }
            bytes.extend(tail.as_bytes());
            std::fs::write(&p, bytes).map_err(|e| e.to_string())
        }
        Step::MakeFile(rel) => {
            let p = ctx.lake.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            std::fs::write(&p, "a regular file\n").map_err(|e| e.to_string())
        }
    }
}

/// Checks the target against the expected rows; returns what does not match.
fn compare_rows(
    expected: &[Mapping],
    actual: &[BTreeMap<String, Option<String>>],
    schema: Option<SchemaRef>,
) -> Vec<String> {
    let mut failures = Vec::new();
    if expected.len() != actual.len() {
        failures.push(format!(
            "target has {} rows, expected {}: {actual:?}",
            actual.len(),
            expected.len()
        ));
    }
    let Some(schema) = schema else {
        return failures;
    };
    let mut unmatched: Vec<&BTreeMap<String, Option<String>>> = actual.iter().collect();
    for want in expected {
        // Render each expected value through the target column's type, so `+1h` and
        // `{repeat: ...}` compare like the stored values.
        let mut rendered = BTreeMap::new();
        for (k, v) in want {
            let k = k.as_str().unwrap_or_default().to_string();
            let Ok(field) = schema.field_with_name(&k) else {
                failures.push(format!("expected column {k:?} is not in the target"));
                continue;
            };
            let row = Mapping::from_iter([(Yaml::from(k.clone()), v.clone())]);
            let dt = match field.data_type() {
                DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
                DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
                other => other.clone(),
            };
            match column(&dt, &k, &[row]) {
                Ok(a) => {
                    rendered.insert(k, render(a.as_ref(), 0));
                }
                Err(e) => failures.push(e),
            }
        }
        match unmatched
            .iter()
            .position(|got| rendered.iter().all(|(k, v)| got.get(k) == Some(v)))
        {
            Some(i) => {
                unmatched.remove(i);
            }
            None => failures.push(format!("no target row matches {rendered:?}")),
        }
    }
    failures
}

async fn quarantine_reasons(path: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for row in rendered_rows(&read_rows(path).await.unwrap_or_default()) {
        let reason = row
            .get("_quarantine_reason")
            .cloned()
            .flatten()
            .unwrap_or_default();
        *out.entry(reason).or_default() += 1;
    }
    out
}

/// One case's outcome.
#[derive(Debug)]
struct Outcome {
    name: String,
    passed: bool,
    pending: bool,
    expected_exit: Option<i32>,
    exit: Option<i32>,
    /// The `error: ...` line the user saw, if any.
    message: Option<String>,
    failures: Vec<String>,
}

async fn run_case(case_dir: &Path) -> Outcome {
    let name = case_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut outcome = Outcome {
        name: name.clone(),
        passed: false,
        pending: false,
        expected_exit: None,
        exit: None,
        message: None,
        failures: Vec::new(),
    };
    match try_case(case_dir, &name, &mut outcome).await {
        Ok(()) => outcome.passed = outcome.failures.is_empty(),
        Err(e) => outcome.failures.push(e),
    }
    outcome
}

async fn try_case(case_dir: &Path, name: &str, outcome: &mut Outcome) -> Result<(), String> {
    let text = std::fs::read_to_string(case_dir.join("case.yml"))
        .map_err(|e| format!("no expectation: {}/case.yml: {e}", case_dir.display()))?;
    let case: Case =
        serde_yaml::from_str(&text).map_err(|e| format!("case.yml does not parse: {e}"))?;
    outcome.pending = case.pending.is_some();
    outcome.expected_exit = Some(case.expect.exit);
    if case.name != name {
        return Err(format!(
            "case.yml names case {:?}, but lives in directory {name:?}",
            case.name
        ));
    }
    if case.about.trim().is_empty() {
        return Err("`about` is empty: say what the case is about".into());
    }
    let referenced = referenced_files(&case);
    for e in std::fs::read_dir(case_dir).map_err(|e| e.to_string())? {
        let f = e
            .map_err(|e| e.to_string())?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if f != "case.yml" && !referenced.contains(&f) {
            return Err(format!(
                "{f} is in the case directory but the case does not use it"
            ));
        }
    }
    let e = &case.expect;
    match class_exit(&e.class) {
        Some(code) if code == e.exit => {}
        Some(code) => {
            return Err(format!(
                "class {} means exit {code}, but the case expects {}",
                e.class, e.exit
            ))
        }
        None => {
            return Err(format!(
                "class {:?} is not one a user error may have (internal is a bug)",
                e.class
            ))
        }
    }
    if e.stderr.is_empty() && e.stdout.is_empty() {
        return Err("the expectation names no message fragment".into());
    }

    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ctx = Ctx {
        case_dir: case_dir.to_path_buf(),
        dir: tmp.path().to_path_buf(),
        lake: tmp.path().join("lake"),
        pipeline: tmp.path().join("pipeline.yml"),
        schema: parse_schema(case.schema.as_deref().unwrap_or(BASE_SCHEMA))?,
    };
    std::fs::create_dir_all(&ctx.lake).map_err(|e| e.to_string())?;
    write_pipeline(&ctx, &case.pipeline)?;
    for step in &case.steps {
        apply_step(&ctx, step).await?;
    }

    let source = ctx.table(Role::Source);
    let target = ctx.table(Role::Target);
    let source_before = fingerprint(&source);
    let target_before = table_version(&target).await;
    let command = case
        .command
        .clone()
        .unwrap_or_else(|| vec!["run".into(), "PIPELINE".into()]);
    let mut cmd = tidemark_in(&ctx.dir, NOW);
    if let Some(fp) = &case.failpoints {
        cmd.env("TIDEMARK_FAILPOINTS", fp);
    }
    let out = exec(cmd.args(command.iter().map(|a| ctx.subst(a))));
    outcome.exit = Some(out.code);
    outcome.message = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .map(str::to_string);
    let f = &mut outcome.failures;

    if out.code != e.exit {
        f.push(format!(
            "exit {} (expected {})\nstdout: {}\nstderr: {}",
            out.code, e.exit, out.stdout, out.stderr
        ));
    }
    for frag in &e.stderr {
        if !out.stderr.contains(&ctx.subst(frag)) {
            f.push(format!("stderr lacks {frag:?}: {}", out.stderr));
        }
    }
    for frag in &e.stdout {
        if !out.stdout.contains(&ctx.subst(frag)) {
            f.push(format!("stdout lacks {frag:?}: {}", out.stdout));
        }
    }
    if out.stderr.contains("panicked") {
        f.push(format!("tidemark panicked: {}", out.stderr));
    }
    if out.code == 70 {
        f.push("exit 70 (internal) for an input a user can get wrong".into());
    }
    let target_after = table_version(&target).await;
    if out.code != 0 && target_after != target_before {
        f.push(format!(
            "a failed command changed the target: version {target_before:?} -> {target_after:?}"
        ));
    }
    if fingerprint(&source) != source_before {
        f.push("the command wrote to the source table".into());
    }
    match &e.target {
        TargetExpect::Unchanged => {
            if target_after != target_before {
                f.push(format!(
                    "target changed: version {target_before:?} -> {target_after:?}"
                ));
            }
        }
        TargetExpect::Absent => {
            if target_after.is_some() {
                f.push(format!("a target table exists (version {target_after:?})"));
            }
        }
        TargetExpect::Rows(rows) => match read_rows(&target).await {
            Some(batches) => {
                let schema = match open(&target).await {
                    Some(t) => t.table_provider().await.ok().map(|p| p.schema()),
                    None => None,
                };
                f.extend(compare_rows(rows, &rendered_rows(&batches), schema));
            }
            None => f.push("the target cannot be read".into()),
        },
    }
    let quarantined = quarantine_reasons(&ctx.table(Role::Quarantine)).await;
    let want_quarantined: BTreeMap<String, u64> =
        e.quarantined.iter().map(|(k, v)| (k.clone(), *v)).collect();
    if quarantined != want_quarantined {
        f.push(format!(
            "quarantined {quarantined:?}, expected {want_quarantined:?}"
        ));
    }
    Ok(())
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad_inputs")
}

fn summary_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("reliability/bad_inputs.json")
}

/// Least number of cases the corpus must hold (at least 40 bad inputs).
const MIN_CASES: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_corpus() {
    let root = corpus_dir();
    let mut case_dirs = Vec::new();
    let mut stray = Vec::new();
    for e in std::fs::read_dir(&root).expect("tests/fixtures/bad_inputs") {
        let e = e.expect("dir entry");
        let p = e.path();
        if p.is_dir() {
            case_dirs.push(p);
        } else if e.file_name() != "README.md" {
            // An expectation outside a case directory names no case.
            stray.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    case_dirs.sort();
    let only = std::env::var("BAD_INPUT_CASE").ok();
    let mut outcomes = Vec::new();
    for dir in &case_dirs {
        if only.as_deref().is_some_and(|o| !dir.ends_with(o)) {
            continue;
        }
        outcomes.push(run_case(dir).await);
    }

    let summary = serde_json::json!({
        "bad_inputs_tried": outcomes.len(),
        "bad_inputs_rejected_cleanly": outcomes.iter().filter(|o| o.passed).count(),
        "cases": outcomes.iter().map(|o| serde_json::json!({
            "name": o.name,
            "passed": o.passed,
            "pending": o.pending,
            "expected_exit": o.expected_exit,
            "exit": o.exit,
            "message": o.message,
            "failures": o.failures,
        })).collect::<Vec<Json>>(),
    });
    // The scoreboard reads the summary of the whole corpus only: a run of one case writes none.
    let path = summary_path();
    if only.is_none() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("summary dir");
        }
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&summary).expect("summary json") + "\n",
        )
        .expect("write summary");
    }

    let mut problems = Vec::new();
    if !stray.is_empty() {
        problems.push(format!(
            "files in {} that belong to no case directory: {stray:?}",
            root.display()
        ));
    }
    if only.is_none() && outcomes.len() < MIN_CASES {
        problems.push(format!(
            "the corpus holds {} cases, fewer than {MIN_CASES}",
            outcomes.len()
        ));
    }
    for o in &outcomes {
        match (o.passed, o.pending) {
            (true, false) | (false, true) => {}
            (true, true) => problems.push(format!(
                "{}: passes now; remove its `pending` marker",
                o.name
            )),
            (false, false) => problems.push(format!("{}:\n  {}", o.name, o.failures.join("\n  "))),
        }
    }
    let pending: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.pending && !o.passed)
        .map(|o| o.name.as_str())
        .collect();
    eprintln!(
        "bad inputs: {} tried, {} handled as expected, pending: {pending:?}; summary in {}",
        outcomes.len(),
        outcomes.iter().filter(|o| o.passed).count(),
        path.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

// ---------------------------------------------------------------------------------------------
// reconcile

const PAYMENTS_SCHEMA: &str = "payment_id string, currency string, amount_cents long, status string, created_at timestamp, updated_at timestamp, _ingested_at timestamp, op string";
const PAYMENTS_TARGET_SCHEMA: &str = "payment_id string, currency string, amount_cents long, status string, created_at timestamp, updated_at timestamp, _ingested_at timestamp, _deleted boolean";

/// Rows written as a YAML flow sequence of mappings.
fn rows(yaml: &str) -> Vec<Mapping> {
    serde_yaml::from_str(yaml).expect("test rows")
}

async fn append_payments(lake: &Path, yaml: &str) {
    let schema = parse_schema(PAYMENTS_SCHEMA).expect("schema");
    let batch = build_batch(&schema, &rows(yaml)).expect("batch");
    write_table(&lake.join("bronze"), batch, SaveMode::Append, None)
        .await
        .expect("append to the source");
}

/// A payments pipeline with a reconcile block, and a source history: a bootstrap, one
/// incremental run (an update, a soft delete, a late row), a null-key row, a future row, and a
/// commit that landed after the last run. Returns the pipeline path.
async fn reconciled_history(dir: &Path, delete_mode: &str) -> PathBuf {
    let lake = dir.join("lake");
    let pipeline = dir.join("payments.yml");
    let text = BASE_PIPELINE
        .replace("keys: [id]", "keys: [payment_id]")
        .replace("mode: soft", &format!("mode: {delete_mode}"))
        .replace("LAKE", &lake.display().to_string())
        + "reconcile: { day: created_at, group_by: [currency], sum: [amount_cents], count_by: [status] }\n";
    std::fs::write(&pipeline, text).expect("pipeline");
    append_payments(
        &lake,
        "[
        {payment_id: p1, currency: EUR, amount_cents: 1000, status: created, created_at: +1h, updated_at: +1h, _ingested_at: +1h},
        {payment_id: p2, currency: EUR, amount_cents: 2000, status: created, created_at: +2h, updated_at: +2h, _ingested_at: +2h},
        {payment_id: p3, currency: USD, amount_cents: 500, status: authorized, created_at: -20h, updated_at: -20h, _ingested_at: -20h},
        {payment_id: p4, currency: USD, amount_cents: 700, status: captured, created_at: +3h, updated_at: +3h, _ingested_at: +3h},
        {payment_id: null, currency: USD, amount_cents: 1, status: created, created_at: +3h, updated_at: +3h, _ingested_at: +3h},
        {payment_id: p5, currency: EUR, amount_cents: 100, status: created, created_at: +36h, updated_at: +36h, _ingested_at: +3h}]",
    )
    .await;
    let run = |extra: &[&str]| {
        let out = exec(tidemark_in(dir, NOW).arg("run").arg(&pipeline).args(extra));
        assert_eq!(out.code, 0, "run failed: {}", out.stderr);
    };
    run(&[]);
    append_payments(
        &lake,
        "[
        {payment_id: p1, currency: EUR, amount_cents: 1000, status: captured, created_at: +1h, updated_at: +4h, _ingested_at: +4h},
        {payment_id: p4, currency: USD, amount_cents: 700, status: captured, created_at: +3h, updated_at: +5h, _ingested_at: +5h, op: D},
        {payment_id: p3, currency: USD, amount_cents: 500, status: captured, created_at: -20h, updated_at: -19h, _ingested_at: +5h}]",
    )
    .await;
    run(&[]);
    // Landed after the last run: reconcile compares with the source version that run read.
    append_payments(
        &lake,
        "[{payment_id: p6, currency: EUR, amount_cents: 300, status: created, created_at: +6h, updated_at: +6h, _ingested_at: +6h}]",
    )
    .await;
    pipeline
}

fn reconcile_json(dir: &Path, pipeline: &Path, expected_exit: i32) -> (Json, Out) {
    let out = exec(
        tidemark_in(dir, NOW)
            .arg("reconcile")
            .arg(pipeline)
            .args(["--output", "json"]),
    );
    assert_eq!(
        out.code, expected_exit,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    let v: Json = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", out.stdout));
    (v, out)
}

/// The bucket of `day` and `currency` in a report.
fn bucket<'a>(report: &'a Json, day: &str, currency: &str) -> &'a Json {
    report["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .find(|b| b["day"] == day && b["group"]["currency"] == currency)
        .unwrap_or_else(|| panic!("no bucket {day} {currency} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_after_runs_finds_the_target_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = reconciled_history(d, "soft").await;

    let (v, _) = reconcile_json(d, &pipeline, 0);
    assert_eq!(v["identical"], true, "{v}");
    assert_eq!(
        v["source_version"], 1,
        "pinned to the version the last run read: {v}"
    );
    assert_eq!(
        v["source_version_basis"],
        "recorded by the target's last run"
    );
    assert_eq!(
        (v["expected_rows"].as_u64(), v["target_rows"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(v["differing_keys"]["different"], 0);
    assert_eq!(v["keys"], serde_json::json!([]));
    assert_eq!(v["buckets_compared"], 3);
    assert_eq!(v["buckets_differing"], 0);
    // p1 captured + p2 created on the 6th in EUR; p3 (its late update merged) on the 5th in USD;
    // p4 is a soft-deleted tombstone; the null key, the future p5 and the unread p6 are absent.
    let eur = bucket(&v, "2025-01-06", "EUR");
    assert_eq!(eur["matches"], true);
    assert_eq!(
        eur["expected"],
        serde_json::json!({"rows": 2, "deleted": 0, "sum": {"amount_cents": 3000},
            "count": {"status": {"captured": 1, "created": 1}}, "key_hash": eur["expected"]["key_hash"]})
    );
    assert_eq!(eur["actual"], eur["expected"]);
    let usd5 = bucket(&v, "2025-01-05", "USD");
    assert_eq!(usd5["actual"]["sum"]["amount_cents"], 500);
    assert_eq!(usd5["actual"]["count"]["status"]["captured"], 1);
    let usd6 = bucket(&v, "2025-01-06", "USD");
    assert_eq!(
        (
            usd6["actual"]["rows"].as_u64(),
            usd6["actual"]["deleted"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(v["totals"]["matches"], true);
    assert_eq!(v["totals"]["actual"]["sum"]["amount_cents"], 3500);

    // The text report says the same, and exits 0.
    let out = exec(tidemark_in(d, NOW).arg("reconcile").arg(&pipeline));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("identical: 4 rows, 3 day/group buckets match"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_lists_exactly_the_tampered_keys_and_buckets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = reconciled_history(d, "soft").await;
    let silver = d.join("lake/silver");

    // Tamper with the target directly, as a careless manual fix would.
    let t = open(&silver).await.expect("target");
    let (t, _) = t
        .delete()
        .with_predicate("payment_id = 'p2'")
        .await
        .expect("delete p2");
    let (_, _) = t
        .update()
        .with_predicate("payment_id = 'p3'")
        .with_update("amount_cents", "999")
        .await
        .expect("update p3");
    let extra = build_batch(
        &parse_schema(PAYMENTS_TARGET_SCHEMA).expect("schema"),
        &rows("[{payment_id: p9, currency: EUR, amount_cents: 50, status: created, created_at: +34h, updated_at: +34h, _ingested_at: +34h, _deleted: false}]"),
    )
    .expect("batch");
    write_table(&silver, extra, SaveMode::Append, Some(SchemaMode::Merge))
        .await
        .expect("append p9");
    let tampered_version = table_version(&silver).await;

    let (v, out) = reconcile_json(d, &pipeline, 65);
    assert!(out.stderr.contains("3 key(s) differ (1 missing in target, 1 unexpected in target, 1 different content, 0 duplicated in target)"), "{}", out.stderr);
    assert!(
        out.stderr.contains("--full-reload") && out.stderr.contains("tidemark restore"),
        "{}",
        out.stderr
    );
    assert_eq!(v["identical"], false);
    let keys: Vec<(String, String)> = v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["kind"].as_str().unwrap_or_default().to_string(),
                k["key"]["payment_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            ("missing_in_target".to_string(), "p2".to_string()),
            ("different".to_string(), "p3".to_string()),
            ("unexpected_in_target".to_string(), "p9".to_string()),
        ]
    );
    assert_eq!(
        v["keys"][1]["columns"],
        serde_json::json!([{"column": "amount_cents", "expected": "500", "actual": "999"}])
    );
    assert_eq!(v["keys"][0]["day"], "2025-01-06");
    assert_eq!(v["keys"][0]["group"]["currency"], "EUR");

    // Exactly the three affected day/currency buckets disagree, by exactly the tampered amounts.
    assert_eq!(v["buckets_differing"], 3, "{v}");
    let eur6 = bucket(&v, "2025-01-06", "EUR");
    assert_eq!(eur6["matches"], false);
    assert_eq!(
        (
            eur6["expected"]["rows"].as_u64(),
            eur6["actual"]["rows"].as_u64()
        ),
        (Some(2), Some(1))
    );
    assert_eq!(eur6["expected"]["sum"]["amount_cents"], 3000);
    assert_eq!(eur6["actual"]["sum"]["amount_cents"], 1000);
    assert_eq!(
        eur6["actual"]["count"]["status"],
        serde_json::json!({"captured": 1})
    );
    assert_ne!(eur6["expected"]["key_hash"], eur6["actual"]["key_hash"]);
    let usd5 = bucket(&v, "2025-01-05", "USD");
    assert_eq!(usd5["matches"], false);
    assert_eq!(
        (
            usd5["expected"]["sum"]["amount_cents"].as_i64(),
            usd5["actual"]["sum"]["amount_cents"].as_i64()
        ),
        (Some(500), Some(999))
    );
    assert_eq!(
        usd5["expected"]["key_hash"], usd5["actual"]["key_hash"],
        "same keys, different amount"
    );
    let eur7 = bucket(&v, "2025-01-07", "EUR");
    assert_eq!(
        (
            eur7["expected"]["rows"].as_u64(),
            eur7["actual"]["rows"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(bucket(&v, "2025-01-06", "USD")["matches"], true);
    assert_eq!(
        (
            v["totals"]["expected"]["sum"]["amount_cents"].as_i64(),
            v["totals"]["actual"]["sum"]["amount_cents"].as_i64()
        ),
        (Some(3500), Some(2049))
    );

    // Text: the report on stdout (limited keys), the verdict and the remedy on stderr.
    let out = exec(
        tidemark_in(d, NOW)
            .arg("reconcile")
            .arg(&pipeline)
            .args(["--limit", "1"]),
    );
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stdout.contains("differing keys (first 1 of 3):"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(r#"missing in target     payment_id="p2"  [2025-01-06 currency=EUR]"#),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains(r#"payment_id="p3""#),
        "--limit 1 lists one key: {}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("2025-01-05 currency=USD: sum amount_cents 500 → 999"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("error: target"), "{}", out.stderr);
    assert_eq!(
        table_version(&silver).await,
        tampered_version,
        "reconcile writes nothing"
    );

    // The remedy it names works: after a full reload, reconcile agrees again.
    let out = exec(
        tidemark_in(d, NOW)
            .arg("run")
            .arg(&pipeline)
            .arg("--full-reload"),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (v, _) = reconcile_json(d, &pipeline, 0);
    assert_eq!(v["identical"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_leaves_hard_deleted_keys_out_like_a_full_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = reconciled_history(d, "hard").await;
    let (v, _) = reconcile_json(d, &pipeline, 0);
    assert_eq!(v["identical"], true, "{v}");
    // p4 was deleted: no row, not even a tombstone, on either side.
    assert_eq!(
        (v["expected_rows"].as_u64(), v["target_rows"].as_u64()),
        (Some(3), Some(3))
    );
    assert!(
        v["buckets"]
            .as_array()
            .expect("buckets")
            .iter()
            .all(|b| b["group"]["currency"] != "USD" || b["day"] != "2025-01-06"),
        "{v}"
    );
}

/// A summed double column holding NaN (and a negative zero) is no difference: the target is
/// identical right after a run and right after a full reload (NaN used to make every such target
/// "DIFFERENT", exit 65). A real change of such a value is still found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_compares_nan_as_nan_and_negative_zero_as_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    let pipeline = d.join("amounts.yml");
    let text = BASE_PIPELINE.replace("LAKE", &lake.display().to_string())
        + "reconcile: { day: updated_at, sum: [amount] }\n";
    std::fs::write(&pipeline, text).expect("pipeline");
    let schema = parse_schema(
        "id string, updated_at timestamp, _ingested_at timestamp, amount double, op string",
    )
    .expect("schema");
    let batch = build_batch(
        &schema,
        &rows(
            "[
        {id: a, updated_at: +1h, _ingested_at: +1h, amount: .nan},
        {id: b, updated_at: +1h, _ingested_at: +1h, amount: -0.0},
        {id: c, updated_at: +1h, _ingested_at: +1h, amount: 1.5},
        {id: d, updated_at: +2h, _ingested_at: +2h, amount: 2.5}]",
        ),
    )
    .expect("batch");
    write_table(&lake.join("bronze"), batch, SaveMode::Append, None)
        .await
        .expect("source");
    for extra in [&[][..], &["--full-reload"][..]] {
        let out = exec(tidemark_in(d, NOW).arg("run").arg(&pipeline).args(extra));
        assert_eq!(out.code, 0, "run {extra:?}: {}", out.stderr);
        let (v, out) = reconcile_json(d, &pipeline, 0);
        assert_eq!(
            v["identical"], true,
            "after run {extra:?}: {v}\n{}",
            out.stderr
        );
        assert_eq!(v["buckets_differing"], 0, "{v}");
        assert_eq!(v["totals"]["matches"], true, "{v}");
        assert_eq!(
            v["totals"]["actual"]["sum"]["amount"], "NaN",
            "NaN is named, not null: {v}"
        );
        assert_eq!(v["differing_keys"]["different"], 0, "{v}");
    }

    // A NaN replaced by a number by hand is a difference, in the content and in the sum.
    let t = open(&lake.join("silver")).await.expect("target");
    t.update()
        .with_predicate("id = 'a'")
        .with_update("amount", "7.0")
        .await
        .expect("update a");
    let (v, _) = reconcile_json(d, &pipeline, 65);
    assert_eq!(v["differing_keys"]["different"], 1, "{v}");
    assert_eq!(v["keys"][0]["key"]["id"], "a", "{v}");
    assert_eq!(v["buckets_differing"], 1, "{v}");
}

/// The real fault behind the corpus case `source_data_file_unreadable`: a source data file with
/// mode 000 is "unavailable" (exit 66), not bad data. Root reads such a file anyway (these tests
/// run as root on CI), so there the test says so and stops: the corpus case covers the
/// classification with the `store.get_data=eacces` failpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_data_file_with_mode_000_is_unavailable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    let pipeline = d.join("p.yml");
    std::fs::write(
        &pipeline,
        BASE_PIPELINE.replace("LAKE", &lake.display().to_string()),
    )
    .expect("pipeline");
    let batch = build_batch(
        &parse_schema(BASE_SCHEMA).expect("schema"),
        &rows("[{id: a, updated_at: +1h, val: 1}]"),
    )
    .expect("batch");
    write_table(&lake.join("bronze"), batch, SaveMode::Append, None)
        .await
        .expect("source");
    let files = data_files(&lake.join("bronze"));
    for f in &files {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o000)).expect("chmod 000");
    }
    let readable = files.iter().any(|f| std::fs::read(f).is_ok());
    if !readable {
        let out = exec(tidemark_in(d, NOW).arg("run").arg(&pipeline));
        assert_eq!(out.code, 66, "{}", out.stderr);
        assert!(out.stderr.contains("Permission denied"), "{}", out.stderr);
    }
    for f in &files {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod back");
    }
    if readable {
        eprintln!("skipped: this process reads files with mode 000 (it runs as root), so the OS cannot refuse the read; the corpus case source_data_file_unreadable covers it with a failpoint");
    }
}

/// The real fault behind the corpus case `target_log_read_only`: the target's `_delta_log` is
/// read-only, so the commit cannot be written — a failed write (exit 74), not a failed read,
/// and nothing committed. Root writes into such a directory anyway: there the test says so and
/// stops (the corpus case covers it with the `store.put_commit=eacces` failpoint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_target_log_is_a_failed_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    let pipeline = d.join("p.yml");
    std::fs::write(
        &pipeline,
        BASE_PIPELINE.replace("LAKE", &lake.display().to_string()),
    )
    .expect("pipeline");
    let schema = parse_schema(BASE_SCHEMA).expect("schema");
    for (i, row) in [
        "[{id: a, updated_at: +1h, val: 1}]",
        "[{id: a, updated_at: +2h, val: 2}]",
    ]
    .iter()
    .enumerate()
    {
        let batch = build_batch(&schema, &rows(row)).expect("batch");
        write_table(&lake.join("bronze"), batch, SaveMode::Append, None)
            .await
            .expect("source");
        if i == 0 {
            let out = exec(tidemark_in(d, NOW).arg("run").arg(&pipeline));
            assert_eq!(out.code, 0, "{}", out.stderr);
        }
    }
    let log = lake.join("silver/_delta_log");
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o555)).expect("chmod 555");
    let probe = log.join("probe");
    let writable = std::fs::write(&probe, "x").is_ok();
    let _ = std::fs::remove_file(&probe);
    let before = table_version(&lake.join("silver")).await;
    let out = (!writable).then(|| exec(tidemark_in(d, NOW).arg("run").arg(&pipeline)));
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
    match out {
        Some(out) => {
            assert_eq!(out.code, 74, "{}", out.stderr);
            assert!(out.stderr.contains("cannot write to"), "{}", out.stderr);
            assert_eq!(table_version(&lake.join("silver")).await, before);
        }
        None => eprintln!("skipped: this process writes into a read-only directory (it runs as root), so the OS cannot refuse the commit; the corpus case target_log_read_only covers it with a failpoint"),
    }
}
