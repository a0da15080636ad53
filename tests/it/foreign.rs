//! Foreign changes: the source recreated, restored, rewritten or compacted by someone
//! else, and clocks that jump between runs. Each ends in a correct target or a loud refusal
//! (exit 65, naming what happened and the `--full-reload` that repairs it) — never exit 0 with
//! a wrong table. Driven through the real binary; the target is compared with the oracle.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use deltalake::protocol::SaveMode;
use serde_json::Value;

use common::tidemark_at as tidemark;

/// Figures for the reliability scoreboard's "foreign changes" row.
static COMMANDS: AtomicU64 = AtomicU64::new(0);
static EXIT_70: AtomicU64 = AtomicU64::new(0);
static SILENT_WRONG: AtomicU64 = AtomicU64::new(0);

fn counted(out: Out) -> Out {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
    if out.code == 70 {
        EXIT_70.fetch_add(1, Ordering::Relaxed);
    }
    out
}

fn run(pipeline: &Path, now: i64, extra: &[&str]) -> Out {
    counted(exec(
        tidemark(now)
            .current_dir(pipeline.parent().expect("dir"))
            .arg("run")
            .arg(pipeline)
            .args(extra)
            .args(["--output", "json"]),
    ))
}

/// The target after a run that exited 0 must equal the oracle; a difference is a silent wrong
/// result, counted before the test fails.
async fn assert_target(dir: &Path, expected: &[TargetRow]) {
    let actual = read_target(&silver(dir)).await;
    if actual != expected {
        SILENT_WRONG.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(actual, expected);
}

fn run_ok(pipeline: &Path, now: i64, extra: &[&str]) -> Value {
    let out = run(pipeline, now, extra);
    assert_eq!(
        out.code, 0,
        "run {extra:?} failed\nstdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    serde_json::from_str(&out.stdout).expect("summary JSON")
}

fn open_url(path: &Path) -> url::Url {
    deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url")
}

async fn open(path: &Path) -> deltalake::DeltaTable {
    deltalake::open_table(open_url(path)).await.expect("open")
}

/// Three hours of a small history: bootstrap, then two incremental runs.
async fn history(dir: &Path) -> (std::path::PathBuf, Vec<Change>) {
    let pipeline = write_pipeline(dir, "15m", "soft", "");
    let mut landed = Vec::new();
    let batches = [
        vec![
            Change::upsert("a", T0 + 10 * MIN, T0 + 20 * MIN, 1),
            Change::upsert("b", T0 + 20 * MIN, T0 + 30 * MIN, 1),
            Change::upsert("c", T0 + 30 * MIN, T0 + 40 * MIN, 1),
        ],
        vec![
            Change::upsert("a", T0 + 70 * MIN, T0 + 80 * MIN, 2),
            Change::upsert("d", T0 + 75 * MIN, T0 + 85 * MIN, 1),
        ],
        vec![
            Change::upsert("b", T0 + 130 * MIN, T0 + 140 * MIN, 2),
            Change::delete("c", T0 + 135 * MIN, T0 + 145 * MIN),
        ],
    ];
    for (i, b) in batches.iter().enumerate() {
        append(&bronze(dir), b).await;
        landed.extend(b.clone());
        run_ok(&pipeline, T0 + (i as i64 + 1) * HOUR, &[]);
    }
    assert_target(dir, &oracle(&landed, T0 + 3 * HOUR, false)).await;
    (pipeline, landed)
}

/// A run that must refuse. Exit 0 instead is counted as a silent wrong result: in each of these
/// scenarios the target cannot be right without the repair the refusal asks for.
fn assert_refused(out: &Out, fragments: &[&str]) {
    if out.code == 0 {
        SILENT_WRONG.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(
        out.code, 65,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    for f in fragments {
        assert!(out.stderr.contains(f), "stderr lacks {f:?}: {}", out.stderr);
    }
}

/// Deletes the source and writes `rows` as a new table at the same place, in `commits` commits.
async fn recreate_source(dir: &Path, rows: &[Change], commits: usize) {
    std::fs::remove_dir_all(bronze(dir)).expect("remove source");
    let per = rows.len().div_ceil(commits.max(1)).max(1);
    for chunk in rows.chunks(per) {
        append(&bronze(dir), chunk).await;
    }
}

async fn a_recreated_source_is_refused_until_a_full_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, _) = history(dir.path()).await;
    let target_version = version(&silver(dir.path())).await;
    let now = T0 + 4 * HOUR;
    let new_rows = vec![
        Change::upsert("a", T0 + 200 * MIN, T0 + 210 * MIN, 7),
        Change::upsert("e", T0 + 5 * MIN, T0 + 215 * MIN, 1),
    ];
    // Fewer commits than the recorded version (the old check read nothing new), then more.
    for commits in [1, 2] {
        recreate_source(dir.path(), &new_rows, commits).await;
        let out = run(&pipeline, now, &[]);
        assert_refused(
            &out,
            &[
                "not the table the target was built from",
                "--full-reload",
                "on_recreate",
            ],
        );
        assert_eq!(
            version(&silver(dir.path())).await,
            target_version,
            "nothing committed"
        );
    }
    for _ in 0..4 {
        append(&bronze(dir.path()), &new_rows[..1]).await; // the new table passes the old version
    }
    assert_refused(
        &run(&pipeline, now, &[]),
        &["not the table the target was built from"],
    );

    run_ok(&pipeline, now, &["--full-reload"]);
    let all_new: Vec<Change> = std::iter::repeat_n(new_rows[0].clone(), 4)
        .chain(new_rows.clone())
        .collect();
    assert_target(dir.path(), &oracle(&all_new, now, false)).await;
    // The new table is now the recorded one: incremental runs go on.
    let late = Change::upsert("f", T0 + 30 * MIN, now + 5 * MIN, 1);
    append(&bronze(dir.path()), std::slice::from_ref(&late)).await;
    let s = run_ok(&pipeline, now + 10 * MIN, &[]);
    assert_eq!(s["num_inserted"], 1, "{s}");
    let mut all = all_new.clone();
    all.push(late);
    assert_target(dir.path(), &oracle(&all, now + 10 * MIN, false)).await;
}

async fn a_recreated_source_with_read_all_is_merged_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, landed) = history(dir.path()).await;
    let text = std::fs::read_to_string(&pipeline).expect("pipeline");
    let text = text.replace("/bronze\" }", "/bronze\", on_recreate: read_all }");
    std::fs::write(&pipeline, text).expect("write");
    let now = T0 + 4 * HOUR;
    let new_rows = vec![
        Change::upsert("a", T0 + 200 * MIN, T0 + 210 * MIN, 7),
        Change::upsert("e", T0 + 5 * MIN, T0 + 215 * MIN, 1), // far behind the overlap
    ];
    recreate_source(dir.path(), &new_rows, 1).await;
    let out = run(&pipeline, now, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("is a new table"), "{}", out.stderr);
    let s: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(s["num_inserted"], 1, "{s}");
    assert_eq!(s["num_updated"], 1, "{s}");
    assert_eq!(
        s["num_late_rows"], 1,
        "only `e` was behind the overlap and changed something: {s}"
    );
    let mut all = landed;
    all.extend(new_rows);
    assert_target(dir.path(), &oracle(&all, now, false)).await;
    // Recorded: the next run is an ordinary one.
    let again = run(&pipeline, now, &[]);
    assert_eq!(again.code, 0);
    assert!(!again.stderr.contains("is a new table"), "{}", again.stderr);
}

async fn delete_from_source(dir: &Path, predicate: &str) {
    open(&bronze(dir))
        .await
        .delete()
        .with_predicate(predicate)
        .await
        .expect("delete");
}

/// `reconcile` compares with the source as it is now (version `v`), finds the difference (65)
/// and says which version it used.
fn reconciled_differently_at(dir: &Path, pipeline: &Path, now: i64, v: u64) {
    let rec = counted(exec(
        tidemark(now)
            .current_dir(dir)
            .args(["reconcile"])
            .arg(pipeline)
            .args(["--output", "json"]),
    ));
    assert_eq!(rec.code, 65, "{}\n{}", rec.stdout, rec.stderr);
    let report: Value = serde_json::from_str(&rec.stdout).expect("report");
    assert_eq!(report["source_version"], v, "{report}");
    // the source was rewritten: the advice points at it, not at rebuilding the target from it
    assert!(
        rec.stderr
            .contains("was rewritten or replaced since the target's last run")
            && rec.stderr.contains("check it first"),
        "{}",
        rec.stderr
    );
}

async fn a_delete_on_the_source_is_refused_naming_the_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, landed) = history(dir.path()).await;
    let before = version(&silver(dir.path())).await;
    delete_from_source(dir.path(), "id = 'b'").await;
    let v = version(&bronze(dir.path())).await.expect("source version");
    let now = T0 + 4 * HOUR;
    let out = run(&pipeline, now, &[]);
    assert_refused(
        &out,
        &[
            "no longer append-only",
            &format!("commit {v} (DELETE)"),
            "--full-reload",
        ],
    );
    assert_eq!(version(&silver(dir.path())).await, before);

    // reconcile compares with the source as it is now, and says which version it used.
    reconciled_differently_at(dir.path(), &pipeline, now, v);

    run_ok(&pipeline, now, &["--full-reload"]);
    let kept: Vec<Change> = landed
        .into_iter()
        .filter(|c| c.id.as_deref() != Some("b"))
        .collect();
    assert_target(dir.path(), &oracle(&kept, now, false)).await;
    let rec = counted(exec(
        tidemark(now)
            .current_dir(dir.path())
            .args(["reconcile"])
            .arg(&pipeline),
    ));
    assert_eq!(rec.code, 0, "{}\n{}", rec.stdout, rec.stderr);
    // And incremental runs go on from the rebuilt target.
    append(&bronze(dir.path()), &[Change::upsert("g", now, now, 1)]).await;
    run_ok(&pipeline, now + 5 * MIN, &[]);
}

async fn a_restore_or_overwrite_of_the_source_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, _) = history(dir.path()).await;
    let now = T0 + 4 * HOUR;
    let (_, _) = open(&bronze(dir.path()))
        .await
        .restore()
        .with_version_to_restore(0)
        .await
        .expect("restore source");
    assert_refused(&run(&pipeline, now, &[]), &["(RESTORE)", "--full-reload"]);

    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, _) = history(dir.path()).await;
    open(&bronze(dir.path()))
        .await
        .write(vec![batch(&[Change::upsert("z", T0, T0, 1)])])
        .with_save_mode(SaveMode::Overwrite)
        .await
        .expect("overwrite source");
    assert_refused(&run(&pipeline, now, &[]), &["(WRITE)", "--full-reload"]);
}

async fn compaction_of_the_source_without_data_change_is_fine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, mut landed) = history(dir.path()).await;
    let late = Change::upsert("h", T0 + 5 * MIN, T0 + 3 * HOUR + 10 * MIN, 1);
    append(&bronze(dir.path()), std::slice::from_ref(&late)).await;
    landed.push(late);
    let (_, metrics) = open(&bronze(dir.path()))
        .await
        .optimize()
        .await
        .expect("optimize source");
    assert!(
        metrics.num_files_removed > 0,
        "the compaction rewrote files"
    );
    let now = T0 + 4 * HOUR;
    let s = run_ok(&pipeline, now, &[]);
    assert_eq!(s["num_late_rows"], 1, "{s}");
    assert_target(dir.path(), &oracle(&landed, now, false)).await;
}

/// A compaction (`dataChange = false`) moves rows merged long ago into a new file; a DELETE of
/// that file by another writer takes rows away all the same, and must be refused like any other.
async fn a_delete_after_a_compaction_of_the_source_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, _) = history(dir.path()).await;
    let before = version(&silver(dir.path())).await;
    open(&bronze(dir.path()))
        .await
        .optimize()
        .await
        .expect("optimize source");
    delete_from_source(dir.path(), "id = 'b'").await;
    let v = version(&bronze(dir.path())).await.expect("source version");
    let now = T0 + 4 * HOUR;
    assert_refused(
        &run(&pipeline, now, &[]),
        &["no longer append-only", &format!("commit {v} (DELETE)")],
    );
    assert_eq!(version(&silver(dir.path())).await, before);
    reconciled_differently_at(dir.path(), &pipeline, now, v);
}

/// A run whose clock is hours behind defers rows that are due; the run still commits (other
/// rows changed), so the recorded source version moves past their file. They must be merged
/// by the first run with a right clock, even far behind the watermark.
async fn rows_deferred_by_a_clock_that_was_behind_are_not_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, mut landed) = history(dir.path()).await;
    let now = T0 + 14 * HOUR;
    let current = vec![
        Change::upsert("n", T0 + 13 * HOUR + 50 * MIN, now, 1),
        Change::upsert("m", T0 + 13 * HOUR + 55 * MIN, now, 1),
    ];
    append(&bronze(dir.path()), &current).await;
    landed.extend(current);
    run_ok(&pipeline, now, &[]); // watermark 13:55
    let batch2 = vec![
        Change::upsert("x", T0 + 12 * HOUR, now + 5 * MIN, 1), // late, and "future" below
        Change::upsert("y", T0 + 3 * HOUR, now + 5 * MIN, 1),  // very late: due for any clock
    ];
    append(&bronze(dir.path()), &batch2).await;
    landed.extend(batch2);
    let behind = run_ok(&pipeline, now - 10 * HOUR, &[]); // an NTP step back / a replay
                                                          // `x`, and `n` and `m` (merged already) look future to this clock too.
    assert_eq!(behind["num_deferred"], 3, "{behind}");
    assert!(
        behind["target_version"].is_number(),
        "the run committed `y`: {behind}"
    );
    let right = run_ok(&pipeline, now + 10 * MIN, &[]);
    assert_eq!(right["num_inserted"], 1, "`x` is merged now: {right}");
    assert_target(dir.path(), &oracle(&landed, now + 10 * MIN, false)).await;
}

/// A run whose clock was ahead merges rows dated up to its "now"; the watermark lands in the
/// future. A row deferred later by a right clock must still be merged when it is due.
async fn a_watermark_in_the_future_is_clamped_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, mut landed) = history(dir.path()).await;
    let now = T0 + 4 * HOUR;
    let scheduled = vec![Change::upsert("s", now + 2 * HOUR, now, 1)]; // dated 2 h ahead
    append(&bronze(dir.path()), &scheduled).await;
    landed.extend(scheduled);
    run_ok(&pipeline, now + 10 * HOUR, &[]); // clock ahead: `s` merged, watermark now + 2 h
    let next = vec![
        Change::upsert("x", now + HOUR, now + 5 * MIN, 1), // future for a right clock: deferred
        Change::upsert("y", now, now + 5 * MIN, 1),        // due: the run commits
    ];
    append(&bronze(dir.path()), &next).await;
    landed.extend(next);
    let out = run(&pipeline, now + 10 * MIN, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("later than now + max_future_skew"),
        "{}",
        out.stderr
    );
    let s: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(s["num_deferred"], 2, "`x`, and `s` (merged already): {s}");
    assert_eq!(
        s["watermark_before"],
        Value::String(
            chrono::DateTime::from_timestamp_micros(now + 15 * MIN)
                .expect("in range")
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        ),
        "clamped to now + max_future_skew: {s}"
    );
    let due = now + HOUR + 10 * MIN;
    let s = run_ok(&pipeline, due, &[]);
    assert_eq!(s["num_inserted"], 1, "`x` merged once due: {s}");
    // Every row, `s` included: the clock-ahead run merged it.
    assert_target(dir.path(), &oracle(&landed, now + 2 * HOUR, false)).await;
}

/// A foreign writer's row dated years ahead must not stop the slice from finding today's rows.
async fn a_foreign_row_dated_2030_in_the_target_does_not_pin_the_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, mut landed) = history(dir.path()).await;
    // Another writer appends a row dated 2030 straight into silver.
    let target = open(&silver(dir.path())).await;
    let schema = read_all(&silver(dir.path())).await[0].schema();
    let y2030 = chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .expect("time")
        .timestamp_micros();
    let foreign = Change::upsert("zz", y2030, y2030, 1);
    let b = batch(std::slice::from_ref(&foreign));
    let mut cols: Vec<arrow::array::ArrayRef> = (0..4)
        .map(|i| arrow::compute::cast(b.column(i), schema.field(i).data_type()).expect("cast"))
        .collect();
    cols.push(std::sync::Arc::new(arrow::array::BooleanArray::from(vec![
        false,
    ])));
    let row = arrow::array::RecordBatch::try_new(schema, cols).expect("row");
    target
        .write(vec![row])
        .with_save_mode(SaveMode::Append)
        .await
        .expect("foreign append");
    let now = T0 + 4 * HOUR;
    let recent = vec![Change::upsert("r", now - 5 * MIN, now, 1)];
    append(&bronze(dir.path()), &recent).await;
    landed.extend(recent);
    let out = run(&pipeline, now, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("2030-01-01"), "{}", out.stderr);
    let mut expected = oracle(&landed, now, false);
    expected.push(TargetRow {
        id: "zz".into(),
        seq: y2030,
        ing: y2030,
        val: Some(1),
        deleted: Some(false),
    });
    expected.sort();
    assert_target(dir.path(), &expected).await;
}

/// The source's commits since the last run were cleaned up (a checkpoint, then log cleanup): the
/// run reads the whole source behind the overlap, says it cannot check those commits, and counts
/// as late only the rows that changed something.
async fn a_log_gap_reads_everything_and_counts_only_real_late_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pipeline, mut landed) = history(dir.path()).await;
    let now = T0 + 4 * HOUR;
    let late = vec![Change::upsert("l", T0 + 5 * MIN, now - 30 * MIN, 1)];
    let recent = vec![Change::upsert("r", now - 5 * MIN, now - 2 * MIN, 1)];
    append(&bronze(dir.path()), &late).await;
    append(&bronze(dir.path()), &recent).await;
    landed.extend(late);
    landed.extend(recent);
    let source = open(&bronze(dir.path())).await;
    deltalake::checkpoints::create_checkpoint(&source, None)
        .await
        .expect("checkpoint");
    let latest = source.version().expect("version");
    for v in 0..latest {
        let commit = bronze(dir.path()).join(format!("_delta_log/{v:020}.json"));
        std::fs::remove_file(&commit).expect("remove commit");
    }
    let out = run(&pipeline, now, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("no longer in the log"),
        "{}",
        out.stderr
    );
    let s: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(s["num_inserted"], 2, "{s}");
    assert_eq!(
        s["num_late_rows"], 1,
        "only `l` was behind the overlap and new: {s}"
    );
    assert_target(dir.path(), &oracle(&landed, now, false)).await;
}

fn report_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability")
}

/// Every foreign-change scenario, with the figures of the README's scoreboard row: scenarios
/// tried, commands run, silent wrong results (exit 0 with a target that is not the oracle's),
/// exit 70 seen. Written to `target/reliability/foreign.json` and merged into `scoreboard.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_changes_end_correct_or_refused() {
    use futures::FutureExt;
    type Scenario = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
    let scenarios: Vec<(&str, Scenario)> = vec![
        ("source recreated", || {
            Box::pin(a_recreated_source_is_refused_until_a_full_reload())
        }),
        ("source recreated, read_all", || {
            Box::pin(a_recreated_source_with_read_all_is_merged_whole())
        }),
        ("DELETE on the source", || {
            Box::pin(a_delete_on_the_source_is_refused_naming_the_commit())
        }),
        ("RESTORE / overwrite of the source", || {
            Box::pin(a_restore_or_overwrite_of_the_source_is_refused())
        }),
        ("source compaction (dataChange=false)", || {
            Box::pin(compaction_of_the_source_without_data_change_is_fine())
        }),
        ("DELETE after a compaction of the source", || {
            Box::pin(a_delete_after_a_compaction_of_the_source_is_refused())
        }),
        ("clock behind", || {
            Box::pin(rows_deferred_by_a_clock_that_was_behind_are_not_lost())
        }),
        ("clock ahead", || {
            Box::pin(a_watermark_in_the_future_is_clamped_and_nothing_is_lost())
        }),
        ("source log cleaned up (log gap)", || {
            Box::pin(a_log_gap_reads_everything_and_counts_only_real_late_rows())
        }),
        ("foreign row dated 2030 in the target", || {
            Box::pin(a_foreign_row_dated_2030_in_the_target_does_not_pin_the_watermark())
        }),
    ];
    let mut failed = Vec::new();
    for (name, scenario) in &scenarios {
        if std::panic::AssertUnwindSafe(scenario())
            .catch_unwind()
            .await
            .is_err()
        {
            failed.push(*name);
        }
    }
    let figures = serde_json::json!({
        "foreign_scenarios": scenarios.len(),
        "foreign_scenarios_passed": scenarios.len() - failed.len(),
        "foreign_commands": COMMANDS.load(Ordering::Relaxed),
        "foreign_silent_wrong_results": SILENT_WRONG.load(Ordering::Relaxed),
        "foreign_exit_70_seen": EXIT_70.load(Ordering::Relaxed),
    });
    std::fs::create_dir_all(report_dir()).expect("report dir");
    std::fs::write(report_dir().join("foreign.json"), figures.to_string()).expect("write");
    let board_path = report_dir().join("scoreboard.json");
    if let Some(mut board) = std::fs::read_to_string(&board_path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    {
        for (k, v) in figures.as_object().expect("object") {
            board[k] = v.clone();
        }
        std::fs::write(
            &board_path,
            serde_json::to_string_pretty(&board).expect("json"),
        )
        .expect("write scoreboard");
    }
    println!("foreign changes: {figures}");
    assert!(failed.is_empty(), "scenarios failed: {failed:?}");
    assert_eq!(figures["foreign_silent_wrong_results"], 0);
    assert_eq!(figures["foreign_exit_70_seen"], 0);
}
