//! Shared test helpers: a tiny change-record schema, writing source batches to Delta, reading
//! a target back, and pipeline files.
#![allow(dead_code)]

pub mod debezium;
pub mod delta_fixture;
pub mod held;
pub mod kafka;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use datafusion::prelude::SessionContext;
use deltalake::protocol::SaveMode;

/// Microseconds in a minute / an hour.
pub const MIN: i64 = 60_000_000;
pub const HOUR: i64 = 60 * MIN;
/// 2025-01-06T00:00:00Z in microseconds: the tests' time origin.
pub const T0: i64 = 1_736_121_600_000_000;

/// One source change record: `id` key, `seq` sequence (updated_at), `ing` tie-breaker
/// (_ingested_at), `val` payload, `op` ("U" or "D").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: Option<String>,
    pub seq: Option<i64>,
    pub ing: i64,
    pub val: Option<i64>,
    pub op: String,
}

impl Change {
    pub fn upsert(id: &str, seq: i64, ing: i64, val: i64) -> Self {
        Change {
            id: Some(id.to_string()),
            seq: Some(seq),
            ing,
            val: Some(val),
            op: "U".into(),
        }
    }
    pub fn delete(id: &str, seq: i64, ing: i64) -> Self {
        Change {
            id: Some(id.to_string()),
            seq: Some(seq),
            ing,
            val: None,
            op: "D".into(),
        }
    }
}

/// A target row as tidemark writes it for the test pipeline.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TargetRow {
    pub id: String,
    pub seq: i64,
    pub ing: i64,
    pub val: Option<i64>,
    pub deleted: Option<bool>,
}

fn ts_field(name: &str, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        nullable,
    )
}

pub fn source_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        ts_field("updated_at", true),
        ts_field("_ingested_at", false),
        Field::new("val", DataType::Int64, true),
        Field::new("op", DataType::Utf8, false),
    ]))
}

pub fn batch(changes: &[Change]) -> RecordBatch {
    let ts = |v: Vec<Option<i64>>| TimestampMicrosecondArray::from(v).with_timezone("UTC");
    RecordBatch::try_new(
        source_schema(),
        vec![
            Arc::new(StringArray::from(
                changes.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
            )),
            Arc::new(ts(changes.iter().map(|c| c.seq).collect())),
            Arc::new(ts(changes.iter().map(|c| Some(c.ing)).collect())),
            Arc::new(Int64Array::from(
                changes.iter().map(|c| c.val).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                changes.iter().map(|c| c.op.clone()).collect::<Vec<_>>(),
            )),
        ],
    )
    .expect("valid test batch")
}

/// Appends `changes` to the Delta table at `path` as one commit (creating it if needed).
pub async fn append(path: &Path, changes: &[Change]) {
    append_batch(path, batch(changes)).await;
}

/// Appends `batch` to the Delta table at `path` as one commit (creating it if needed).
pub async fn append_batch(path: &Path, batch: RecordBatch) {
    let url = deltalake::ensure_table_uri(path.to_str().expect("utf8 path")).expect("table url");
    let table = match deltalake::open_table(url.clone()).await {
        Ok(t) => t,
        Err(_) => deltalake::DeltaTableBuilder::from_url(url)
            .expect("builder")
            .build()
            .expect("table"),
    };
    table
        .write(vec![batch])
        .with_save_mode(SaveMode::Append)
        .await
        .expect("append to source");
}

/// The Delta table at `path`, opened at its latest version (panics when there is none).
pub async fn open_table(path: &Path) -> deltalake::DeltaTable {
    let url = deltalake::ensure_table_uri(path.to_str().expect("utf8 path")).expect("table url");
    deltalake::open_table(url).await.expect("open table")
}

/// Current Delta version of the table at `path`, or None when there is no table.
pub async fn version(path: &Path) -> Option<u64> {
    let url = deltalake::table::builder::parse_table_uri(path.to_str()?).ok()?;
    deltalake::open_table(url).await.ok()?.version()
}

/// All rows of a target written by the test pipeline, sorted.
pub async fn read_target(path: &Path) -> Vec<TargetRow> {
    rows_of(&read_all(path).await)
}

/// Target rows of batches read from a target of the test pipeline, sorted.
pub fn rows_of(batches: &[RecordBatch]) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    for b in batches {
        let id = arrow::compute::cast(b.column_by_name("id").expect("id"), &DataType::Utf8)
            .expect("cast");
        let id = id.as_string::<i32>();
        let seq = b
            .column_by_name("updated_at")
            .expect("updated_at")
            .as_primitive::<TimestampMicrosecondType>();
        let ing = b
            .column_by_name("_ingested_at")
            .expect("_ingested_at")
            .as_primitive::<TimestampMicrosecondType>();
        let val = b
            .column_by_name("val")
            .expect("val")
            .as_primitive::<arrow::datatypes::Int64Type>();
        let del = b.column_by_name("_deleted").map(|c| c.as_boolean().clone());
        for i in 0..b.num_rows() {
            rows.push(TargetRow {
                id: id.value(i).to_string(),
                seq: seq.value(i),
                ing: ing.value(i),
                val: val.is_valid(i).then(|| val.value(i)),
                deleted: del.as_ref().map(|d: &BooleanArray| d.value(i)),
            });
        }
    }
    rows.sort();
    rows
}

/// The non-null values of `column` across `batches`, as text, in order.
pub fn strings(batches: &[RecordBatch], column: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = arrow::compute::cast(b.column_by_name(column).expect(column), &DataType::Utf8)
                .expect("cast to text");
            c.as_string::<i32>()
                .iter()
                .flatten()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every row of the Delta table at `path`.
pub async fn read_all(path: &Path) -> Vec<RecordBatch> {
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url).await.expect("open table");
    let ctx = SessionContext::new();
    table
        .update_datafusion_session(&ctx.state())
        .expect("register store");
    let provider = table.table_provider().await.expect("provider");
    ctx.read_table(provider)
        .expect("read")
        .collect()
        .await
        .expect("collect")
}

/// Number of rows in the Delta table at `path` (0 when there is none).
pub async fn count_rows(path: &Path) -> usize {
    if version(path).await.is_none() {
        return 0;
    }
    read_all(path).await.iter().map(|b| b.num_rows()).sum()
}

/// Writes the test pipeline into `dir/pipeline.yml`, tables under `dir/lake`.
/// `extra` is appended verbatim (e.g. "quarantine_limit" lines are not allowed: use `quarantine`).
pub fn write_pipeline(
    dir: &Path,
    overlap: &str,
    delete_mode: &str,
    quarantine_extra: &str,
) -> PathBuf {
    let lake = dir.join("lake");
    let text = format!(
        "name: test\nkind: cdc_merge\nsource: {{ uri: \"{l}/bronze\" }}\ntarget: {{ uri: \"{l}/silver\" }}\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: {overlap}\nmax_future_skew: 5m\ndeletes: {{ column: op, values: [D], mode: {delete_mode} }}\ncolumns: {{ exclude: [op] }}\nquarantine: {{ uri: \"{l}/quarantine\"{quarantine_extra} }}\n",
        l = lake.display()
    );
    let path = dir.join("pipeline.yml");
    std::fs::write(&path, text).expect("write pipeline");
    path
}

pub fn bronze(dir: &Path) -> PathBuf {
    dir.join("lake/bronze")
}
pub fn silver(dir: &Path) -> PathBuf {
    dir.join("lake/silver")
}
pub fn quarantine(dir: &Path) -> PathBuf {
    dir.join("lake/quarantine")
}

/// RFC 3339 of a microsecond timestamp, for TIDEMARK_FAKE_NOW.
pub fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .expect("in range")
        .to_rfc3339()
}

/// `max_future_skew` of the test pipeline, in microseconds.
pub const SKEW: i64 = 5 * MIN;

/// The oracle: newest valid, due version per key — greatest `(seq, ing)`, then greatest
/// content (val with null lowest, then deleted) — computed independently of tidemark.
/// With `hard`, deleted winners are absent and there is no `_deleted` column.
pub fn oracle(all: &[Change], now: i64, hard: bool) -> Vec<TargetRow> {
    let mut best: std::collections::BTreeMap<String, &Change> = std::collections::BTreeMap::new();
    let rank = |c: &Change| (c.seq, c.ing, c.val, c.op == "D");
    for c in all {
        let (Some(id), Some(seq)) = (&c.id, c.seq) else {
            continue;
        };
        if seq > now + SKEW {
            continue;
        }
        match best.get(id) {
            Some(b) if rank(b) >= rank(c) => {}
            _ => {
                best.insert(id.clone(), c);
            }
        }
    }
    best.into_values()
        .filter(|c| !(hard && c.op == "D"))
        .map(|c| TargetRow {
            id: c.id.clone().unwrap_or_default(),
            seq: c.seq.unwrap_or_default(),
            ing: c.ing,
            val: c.val,
            deleted: (!hard).then_some(c.op == "D"),
        })
        .collect()
}

/// What one invocation of the binary printed.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a prepared command and captures its exit code and output.
pub fn exec(c: &mut assert_cmd::Command) -> Out {
    captured(c.output().expect("spawn tidemark"))
}

/// [`exec`] for a `std::process::Command` (tests that also spawn and signal processes).
pub fn output(c: &mut std::process::Command) -> Out {
    captured(c.output().expect("spawn tidemark"))
}

fn captured(out: std::process::Output) -> Out {
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The binary on the machine's clock, warnings-only logs and no colour: the one command
/// builder every suite uses (a failpoint armed in the caller's environment fires only where a
/// test arms it).
pub fn tidemark() -> assert_cmd::Command {
    let mut c = assert_cmd::Command::cargo_bin("tidemark").expect("tidemark binary");
    c.env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .env_remove("RUST_BACKTRACE")
        .env_remove("TIDEMARK_FAILPOINTS");
    c
}

/// [`tidemark`] run from `dir`, on the machine's clock.
pub fn tidemark_from(dir: &Path) -> assert_cmd::Command {
    let mut c = tidemark();
    c.current_dir(dir);
    c
}

/// [`tidemark_at`] with the binary's own default logging (no `RUST_LOG`): what a user sees.
pub fn tidemark_default_logs(now: i64) -> assert_cmd::Command {
    let mut c = tidemark_at(now);
    c.env_remove("RUST_LOG");
    c
}

/// [`tidemark`] with its clock pinned at `now`.
pub fn tidemark_at(now: i64) -> assert_cmd::Command {
    let mut c = tidemark();
    c.env("TIDEMARK_FAKE_NOW", rfc3339(now));
    c
}

/// [`tidemark_at`] run from `dir` (for relative paths in pipelines and bundles).
pub fn tidemark_in(dir: &Path, now: i64) -> assert_cmd::Command {
    let mut c = tidemark_at(now);
    c.current_dir(dir);
    c
}

/// [`tidemark`] as a std command, for processes a test keeps running (signals, races, kills).
pub fn process() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"));
    c.env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .env_remove("RUST_BACKTRACE")
        .env_remove("TIDEMARK_FAILPOINTS");
    c
}

/// [`process`] with its clock pinned at `now`.
pub fn tidemark_process(now: i64) -> std::process::Command {
    let mut c = process();
    c.env("TIDEMARK_FAKE_NOW", rfc3339(now));
    c
}

/// A rendezvous with a process stopped at a `pause(DIR)` failpoint.
pub struct Pause {
    pub dir: tempfile::TempDir,
}

impl Pause {
    pub fn new() -> Self {
        Pause {
            dir: tempfile::tempdir().expect("pause dir"),
        }
    }

    /// The failpoint spec that pauses at `point`.
    pub fn at(&self, point: &str) -> String {
        format!("{point}=pause({})", self.dir.path().display())
    }

    /// Blocks until the paused process reached its failpoint (panics after 2 minutes).
    pub fn wait_reached(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !self.dir.path().join("reached").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the paused process never reached its failpoint"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Lets the paused process go on.
    pub fn release(&self) {
        std::fs::write(self.dir.path().join("go"), "").expect("release");
    }
}

impl Default for Pause {
    fn default() -> Self {
        Self::new()
    }
}

/// A bundle in `dir/bundle` whose `lake` is `dir/lake`, with the test pipeline (tables under
/// `dir/lake`) at `dir/pipeline.yml` and `jobs` (YAML under `resources.jobs`, indented 4) in
/// `resources/jobs.yml`. `${PIPELINE}` in `jobs` is replaced by the pipeline's path.
pub fn write_bundle(dir: &Path, jobs: &str) -> PathBuf {
    let pipeline = write_pipeline(dir, "15m", "soft", "");
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        format!(
            "bundle: {{ name: test }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ description: the test lake }}\ntargets:\n  local:\n    default: true\n    variables: {{ lake: \"{}\" }}\n",
            dir.join("lake").display()
        ),
    )
    .expect("write bundle");
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n{}",
            jobs.replace("${PIPELINE}", &pipeline.display().to_string())
        ),
    )
    .expect("write jobs");
    bundle
}

/// Applies one version's feed rows to the live rows, strictly: the feed describes the live
/// table, so no row carries a tombstone, a `delete` or `update_preimage` names the live row it
/// removes, and an `insert` or `update_postimage` names a key that is not live (after the
/// version's removals, which are applied first).
pub fn apply_feed_version(
    live: &mut std::collections::BTreeMap<String, TargetRow>,
    rows: &[(&str, &TargetRow)],
) -> Result<(), String> {
    let removal = |k: &str| matches!(k, "delete" | "update_preimage");
    for (kind, row) in rows
        .iter()
        .filter(|r| removal(r.0))
        .chain(rows.iter().filter(|r| !removal(r.0)))
    {
        if row.deleted == Some(true) {
            return Err(format!("the feed carries a tombstone: {kind} {row:?}"));
        }
        match *kind {
            "delete" | "update_preimage" => {
                let held = live.remove(&row.id);
                if held.as_ref() != Some(*row) {
                    return Err(format!("{kind} of {row:?}, but the live row was {held:?}"));
                }
            }
            "insert" | "update_postimage" => {
                if let Some(prev) = live.insert(row.id.clone(), (*row).clone()) {
                    return Err(format!("{kind} of {row:?}, but the key was live: {prev:?}"));
                }
            }
            other => return Err(format!("unknown change type {other}")),
        }
    }
    let pre = rows.iter().filter(|r| r.0 == "update_preimage").count();
    let post = rows.iter().filter(|r| r.0 == "update_postimage").count();
    if pre != post {
        return Err(format!("{pre} preimages but {post} postimages"));
    }
    Ok(())
}

/// The live rows (not tombstones) by key.
pub fn live_rows(rows: Vec<TargetRow>) -> std::collections::BTreeMap<String, TargetRow> {
    rows.into_iter()
        .filter(|r| r.deleted != Some(true))
        .map(|r| (r.id.clone(), r))
        .collect()
}

/// The feed between two versions as (version, change type, row), in version order.
pub async fn feed_rows(path: &Path, from: u64, to: u64) -> Vec<(i64, String, TargetRow)> {
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url).await.expect("open");
    let ctx = datafusion::prelude::SessionContext::new();
    let plan = table
        .scan_cdf()
        .with_starting_version(from)
        .with_ending_version(to)
        .build(&ctx.state(), None)
        .await
        .expect("cdf plan");
    let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .expect("cdf");
    let mut changes: Vec<(i64, String, TargetRow)> = Vec::new();
    for b in &batches {
        let kind = arrow::compute::cast(
            b.column_by_name("_change_type").expect("t"),
            &arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        let version = arrow::compute::cast(
            b.column_by_name("_commit_version").expect("v"),
            &arrow::datatypes::DataType::Int64,
        )
        .expect("cast");
        let version = version.as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..b.num_rows() {
            let one = rows_of(&[b.slice(i, 1)]);
            changes.push((
                version.value(i),
                kind.as_string::<i32>().value(i).to_string(),
                one[0].clone(),
            ));
        }
    }
    // Within a version, removals before additions (a pre-image before its post-image).
    changes.sort_by_key(|(v, kind, _)| (*v, kind != "delete" && kind != "update_preimage"));
    changes
}

/// A copy of the folder `from` (recursively) at `to`.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}
