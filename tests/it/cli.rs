//! Integration tests through the real binary: every command, the JSON summary, the late-row
//! case (a row landing behind the watermark), and every error path with its exit code and a
//! message that says what to do.
//!
//! The clock of the binary is always pinned with `TIDEMARK_FAKE_NOW`; source tables are written
//! with the shared helpers in `tests/it/common`.

use crate::common;

use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use assert_cmd::Command;
use common::*;
use predicates::prelude::*;
use serde_json::Value;

/// The instant the binary believes it is, unless a test moves it.
const NOW: i64 = T0 + 12 * HOUR;

// ---------------------------------------------------------------------------------------------
// helpers

use common::tidemark_at as tidemark;

/// Stdout must be exactly one JSON value (logs go to stderr).
fn one_json(stdout: &str) -> Value {
    let mut values = serde_json::Deserializer::from_str(stdout).into_iter::<Value>();
    let first = values
        .next()
        .unwrap_or_else(|| panic!("no JSON on stdout: {stdout:?}"))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"));
    assert!(
        values.next().is_none(),
        "stdout holds more than one JSON value: {stdout:?}"
    );
    first
}

/// Runs `tidemark run <pipeline> --output json` with `extra` flags; it must succeed.
fn run_json(pipeline: &Path, now: i64, extra: &[&str]) -> Value {
    let out = exec(
        tidemark(now)
            .current_dir(pipeline.parent().expect("pipeline dir"))
            .arg("run")
            .arg(pipeline)
            .args(extra)
            .args(["--output", "json"]),
    );
    assert_eq!(
        out.code, 0,
        "run {extra:?} failed\nstdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    let v = one_json(&out.stdout);
    assert!(v.is_object(), "summary is not an object: {v}");
    v
}

/// Runs `tidemark run <pipeline>` with `extra` flags, expecting failure; returns (code, stderr).
fn run_fail(pipeline: &Path, now: i64, extra: &[&str]) -> Out {
    let out = exec(
        tidemark(now)
            .current_dir(pipeline.parent().expect("pipeline dir"))
            .arg("run")
            .arg(pipeline)
            .args(extra),
    );
    assert_ne!(out.code, 0, "expected a failure, got stdout {}", out.stdout);
    out
}

fn num(v: &Value, field: &str) -> u64 {
    v.get(field)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("`{field}` is not a number in {v}"))
}

/// An RFC 3339 field in microseconds (None when null).
fn time(v: &Value, field: &str) -> Option<i64> {
    match v.get(field) {
        Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap_or_else(|e| panic!("`{field}`: {s:?} is not RFC 3339: {e}"))
                .timestamp_micros(),
        ),
        other => panic!("`{field}` is missing or not a time: {other:?} in {v}"),
    }
}

/// An upsert ingested one minute after its event time.
fn up(id: &str, seq: i64, val: i64) -> Change {
    Change::upsert(id, seq, seq + MIN, val)
}

/// A row with a null key.
fn null_key(seq: i64, val: i64) -> Change {
    Change {
        id: None,
        seq: Some(seq),
        ing: seq + MIN,
        val: Some(val),
        op: "U".into(),
    }
}

/// A row with a null sequence.
fn null_seq(id: &str, ing: i64, val: i64) -> Change {
    Change {
        id: Some(id.into()),
        seq: None,
        ing,
        val: Some(val),
        op: "U".into(),
    }
}

/// A string column of a Delta table, whatever its physical string type.
async fn string_column(path: &Path, column: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for b in read_all(path).await {
        let col = b
            .column_by_name(column)
            .unwrap_or_else(|| panic!("no column {column} in {}", path.display()));
        let col = arrow::compute::cast(col, &DataType::Utf8).expect("cast to utf8");
        let s = col.as_string::<i32>();
        out.extend((0..s.len()).map(|i| s.is_valid(i).then(|| s.value(i).to_string())));
    }
    out.sort();
    out
}

/// Column names of a Delta table.
async fn column_names(path: &Path) -> Vec<String> {
    let batches = read_all(path).await;
    let b = batches.first().expect("a non-empty table");
    b.schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every field the run summary must carry.
const SUMMARY_FIELDS: &[&str] = &[
    "run_id",
    "pipeline",
    "mode",
    "dry_run",
    "watermark_before",
    "watermark_after",
    "source_version",
    "target_version",
    "num_source_rows_read",
    "num_quarantined",
    "num_deferred",
    "num_superseded",
    "num_duplicates",
    "num_conflicts",
    "num_late_rows",
    "num_inserted",
    "num_updated",
    "num_deleted",
    "num_unchanged",
    "num_files_added",
    "num_files_removed",
    "duration_ms",
    "phases_ms",
];

// ---------------------------------------------------------------------------------------------
// 1. bootstrap, no-op rerun, JSON fields

#[tokio::test]
async fn bootstrap_then_rerun_without_new_rows_commits_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let rows = vec![
        up("a", T0 + HOUR, 1),
        up("a", T0 + 2 * HOUR, 2),
        up("b", T0 + 3 * HOUR, 10),
        up("c", T0 + 4 * HOUR, 20),
    ];
    append(&bronze(dir.path()), &rows).await;

    let first = run_json(&p, NOW, &[]);
    for f in SUMMARY_FIELDS {
        assert!(first.get(*f).is_some(), "summary lacks `{f}`: {first}");
    }
    assert!(
        first["run_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{first}"
    );
    assert_eq!(first["pipeline"], "test");
    assert_eq!(first["mode"], "bootstrap");
    assert_eq!(first["dry_run"], false);
    assert_eq!(time(&first, "watermark_before"), None);
    assert_eq!(time(&first, "watermark_after"), Some(T0 + 4 * HOUR));
    assert_eq!(num(&first, "source_version"), 0);
    assert_eq!(num(&first, "num_source_rows_read"), 4);
    assert_eq!(num(&first, "num_inserted"), 3);
    assert_eq!(num(&first, "num_updated"), 0);
    assert_eq!(num(&first, "num_deleted"), 0);
    assert_eq!(num(&first, "num_quarantined"), 0);
    assert_eq!(num(&first, "num_deferred"), 0);
    assert_eq!(num(&first, "num_conflicts"), 0);
    assert_eq!(num(&first, "num_late_rows"), 0);
    assert_eq!(num(&first, "num_superseded"), 1, "a's older version");
    assert_eq!(num(&first, "num_duplicates"), 0, "{first}");
    assert!(num(&first, "num_files_added") >= 1, "{first}");
    assert_eq!(num(&first, "num_files_removed"), 0);
    num(&first, "duration_ms");
    assert!(
        first["phases_ms"]
            .as_object()
            .is_some_and(|m| !m.is_empty() && m.values().all(Value::is_u64)),
        "phases_ms: {first}"
    );
    let v1 = version(&silver(dir.path())).await.expect("target created");
    assert_eq!(first["target_version"].as_u64(), Some(v1));
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&rows, NOW, false));

    let second = run_json(&p, NOW, &[]);
    for f in SUMMARY_FIELDS {
        assert!(second.get(*f).is_some(), "summary lacks `{f}`: {second}");
    }
    assert_eq!(second["mode"], "incremental");
    assert_ne!(second["run_id"], first["run_id"]);
    assert_eq!(second["target_version"], Value::Null, "{second}");
    assert_eq!(time(&second, "watermark_before"), Some(T0 + 4 * HOUR));
    assert_eq!(time(&second, "watermark_after"), Some(T0 + 4 * HOUR));
    assert_eq!(num(&second, "source_version"), 0);
    assert_eq!(num(&second, "num_inserted"), 0);
    assert_eq!(num(&second, "num_updated"), 0);
    assert_eq!(num(&second, "num_deleted"), 0);
    assert_eq!(num(&second, "num_late_rows"), 0);
    assert_eq!(
        num(&second, "num_unchanged"),
        1,
        "c is re-read by the overlap"
    );
    assert_eq!(num(&second, "num_files_added"), 0);
    assert_eq!(num(&second, "num_files_removed"), 0);
    assert_eq!(version(&silver(dir.path())).await, Some(v1));
    assert_eq!(read_target(&silver(dir.path())).await, content);
}

// ---------------------------------------------------------------------------------------------
// 2. late rows (issue 2: "a row landing two hours after its updated_at ... merged and counted")

#[tokio::test]
async fn rows_landing_behind_the_overlap_are_merged_and_counted_as_late() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let w = T0 + 6 * HOUR;
    let mut all = vec![
        up("a", T0 + 3 * HOUR, 1),
        up("b", T0 + HOUR, 2),
        up("z", w, 9),
    ];
    append(&bronze(dir.path()), &all).await;
    let boot = run_json(&p, NOW, &[]);
    assert_eq!(boot["mode"], "bootstrap");
    assert_eq!(time(&boot, "watermark_after"), Some(w));
    let v_boot = version(&silver(dir.path())).await.expect("target");

    // Everything below lands at W + 10m, with updated_at far behind W - 15m.
    let landed = w + 10 * MIN;
    let late = vec![
        // a new key, two hours late
        Change::upsert("n", w - 2 * HOUR, w, 3),
        // newer than b's current version (T0+1h): must update it
        Change::upsert("b", T0 + 2 * HOUR, landed, 5),
        // older than a's current version (T0+3h): late, but must not overwrite
        Change::upsert("a", T0 + 2 * HOUR, landed, 7),
    ];
    append(&bronze(dir.path()), &late).await;
    all.extend(late);

    let inc = run_json(&p, NOW, &[]);
    assert_eq!(inc["mode"], "incremental");
    assert_eq!(time(&inc, "watermark_before"), Some(w));
    assert_eq!(num(&inc, "source_version"), 1);
    assert_eq!(num(&inc, "num_late_rows"), 3, "{inc}");
    assert_eq!(num(&inc, "num_inserted"), 1, "n: {inc}");
    assert_eq!(num(&inc, "num_updated"), 1, "b: {inc}");
    assert_eq!(
        num(&inc, "num_unchanged"),
        2,
        "a (older late row) and z (overlap): {inc}"
    );
    assert_eq!(num(&inc, "num_source_rows_read"), 4, "{inc}");
    assert_eq!(inc["target_version"].as_u64(), Some(v_boot + 1));
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&all, NOW, false));
    assert!(content
        .iter()
        .any(|r| r.id == "n" && r.seq == w - 2 * HOUR && r.val == Some(3)));
    assert!(content
        .iter()
        .any(|r| r.id == "a" && r.seq == T0 + 3 * HOUR && r.val == Some(1)));

    // The late rows were read once: a rerun neither counts nor commits them again.
    let rerun = run_json(&p, NOW, &[]);
    assert_eq!(num(&rerun, "num_late_rows"), 0, "{rerun}");
    assert_eq!(rerun["target_version"], Value::Null, "{rerun}");
    assert_eq!(read_target(&silver(dir.path())).await, content);
}

// ---------------------------------------------------------------------------------------------
// 3. updates, out-of-order arrival, duplicates, conflicts

#[tokio::test]
async fn updates_out_of_order_rows_and_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let mut all = vec![
        up("x", T0 + HOUR, 1),
        up("y", T0 + HOUR, 1),
        up("w", T0 + 3 * HOUR, 0),
    ];
    append(&bronze(dir.path()), &all).await;
    run_json(&p, NOW, &[]);

    // x updated (delivered twice, identically); y's older version arrives after its newer one.
    let x2 = up("x", T0 + 4 * HOUR, 2);
    let batch = vec![x2.clone(), x2, up("y", T0 + 30 * MIN, 0)];
    append(&bronze(dir.path()), &batch).await;
    all.extend(batch);
    let s = run_json(&p, NOW, &[]);
    assert_eq!(num(&s, "num_updated"), 1, "x: {s}");
    assert_eq!(num(&s, "num_inserted"), 0, "{s}");
    assert_eq!(num(&s, "num_duplicates"), 1, "the re-delivery of x: {s}");
    assert_eq!(
        num(&s, "num_unchanged"),
        2,
        "w (overlap) and the stale y: {s}"
    );
    assert_eq!(num(&s, "num_conflicts"), 0, "{s}");
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&all, NOW, false));
    assert!(content
        .iter()
        .any(|r| r.id == "y" && r.seq == T0 + HOUR && r.val == Some(1)));
    let v = version(&silver(dir.path())).await;

    // An older version of x inside the overlap, after the newer one: ignored, nothing committed.
    let old_x = up("x", T0 + 4 * HOUR - 5 * MIN, 99);
    append(&bronze(dir.path()), std::slice::from_ref(&old_x)).await;
    all.push(old_x);
    let s = run_json(&p, NOW, &[]);
    assert_eq!(s["target_version"], Value::Null, "{s}");
    assert_eq!(num(&s, "num_updated"), 0, "{s}");
    assert_eq!(version(&silver(dir.path())).await, v);
    assert_eq!(read_target(&silver(dir.path())).await, content);
    assert_eq!(content, oracle(&all, NOW, false));
}

/// Two rows equal on (updated_at, _ingested_at) but with different `val`, in both arrival
/// orders: each lake counts one conflict and both end with the same winner.
#[tokio::test]
async fn equal_tuple_conflicts_resolve_the_same_way_in_any_arrival_order() {
    let seq = T0 + 2 * HOUR;
    let one = Change::upsert("k", seq, seq + MIN, 1);
    let two = Change::upsert("k", seq, seq + MIN, 2);
    let base = up("other", T0 + HOUR, 7);
    let mut targets = Vec::new();
    for (first, second) in [(&one, &two), (&two, &one)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write_pipeline(dir.path(), "15m", "soft", "");
        append(&bronze(dir.path()), &[base.clone(), first.clone()]).await;
        let boot = run_json(&p, NOW, &[]);
        assert_eq!(num(&boot, "num_conflicts"), 0, "{boot}");
        append(&bronze(dir.path()), std::slice::from_ref(second)).await;
        let s = run_json(&p, NOW, &[]);
        let content = read_target(&silver(dir.path())).await;
        assert_eq!(content.len(), 2, "{content:?}");
        targets.push((dir, p, content, s));
    }
    assert_eq!(
        targets[0].2, targets[1].2,
        "the winner depends on arrival order"
    );

    // A full reload (both rows in one read) picks the same winner and counts one conflict.
    let (dir, p, content, _) = &targets[0];
    let full = run_json(p, NOW, &["--full-reload"]);
    assert_eq!(num(&full, "num_conflicts"), 1, "{full}");
    assert_eq!(&read_target(&silver(dir.path())).await, content);

    // One key in conflict is one conflict, whichever version the target already held.
    for (order, (_, _, _, s)) in ["val 1 then 2", "val 2 then 1"].iter().zip(&targets) {
        assert_eq!(num(s, "num_conflicts"), 1, "arrival order {order}: {s}");
    }
}

// ---------------------------------------------------------------------------------------------
// 4. deletes

#[tokio::test]
async fn soft_delete_keeps_a_tombstone_that_older_versions_cannot_resurrect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let mut all = vec![
        up("d", T0 + HOUR, 1),
        up("e", T0 + HOUR, 1),
        up("w", T0 + 2 * HOUR, 0),
    ];
    append(&bronze(dir.path()), &all).await;
    run_json(&p, NOW, &[]);

    let del = Change::delete("d", T0 + 3 * HOUR, T0 + 3 * HOUR + MIN);
    append(&bronze(dir.path()), std::slice::from_ref(&del)).await;
    all.push(del);
    let s = run_json(&p, NOW, &[]);
    assert_eq!(num(&s, "num_deleted"), 1, "{s}");
    assert_eq!(time(&s, "watermark_after"), Some(T0 + 3 * HOUR));
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&all, NOW, false));
    assert!(
        content.contains(&TargetRow {
            id: "d".into(),
            seq: T0 + 3 * HOUR,
            ing: T0 + 3 * HOUR + MIN,
            val: None,
            deleted: Some(true),
        }),
        "no tombstone for d: {content:?}"
    );
    let v = version(&silver(dir.path())).await;

    // An older version of d lands afterwards (behind the overlap): the tombstone stays.
    let old = Change::upsert("d", T0 + 2 * HOUR, T0 + 4 * HOUR, 42);
    append(&bronze(dir.path()), std::slice::from_ref(&old)).await;
    all.push(old);
    let s = run_json(&p, NOW, &[]);
    assert_eq!(s["target_version"], Value::Null, "{s}");
    assert_eq!(num(&s, "num_updated") + num(&s, "num_inserted"), 0, "{s}");
    assert_eq!(version(&silver(dir.path())).await, v);
    assert_eq!(read_target(&silver(dir.path())).await, content);
}

#[tokio::test]
async fn hard_delete_removes_the_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "hard", "");
    let mut all = vec![
        up("d", T0 + HOUR, 1),
        up("e", T0 + HOUR, 1),
        up("w", T0 + 2 * HOUR, 0),
    ];
    append(&bronze(dir.path()), &all).await;
    run_json(&p, NOW, &[]);
    assert_eq!(read_target(&silver(dir.path())).await.len(), 3);
    assert!(
        !column_names(&silver(dir.path()))
            .await
            .contains(&"_deleted".to_string()),
        "hard mode has no tombstone column"
    );

    let del = Change::delete("d", T0 + 3 * HOUR, T0 + 3 * HOUR + MIN);
    append(&bronze(dir.path()), std::slice::from_ref(&del)).await;
    all.push(del);
    let s = run_json(&p, NOW, &[]);
    assert_eq!(num(&s, "num_deleted"), 1, "{s}");
    assert!(s["target_version"].is_u64(), "{s}");
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&all, NOW, true));
    assert!(content.iter().all(|r| r.id != "d"), "{content:?}");

    // A rerun re-reads the delete in the overlap: nothing to remove, nothing committed. (Text
    // output this time: a headline and aligned counts.)
    let v = version(&silver(dir.path())).await;
    let out = exec(tidemark(NOW).arg("run").arg(&p));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("test incremental run ")
            && out.stdout.contains("was already applied: no commit"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("deleted ") && l.trim_end().ends_with(" 0")),
        "{}",
        out.stdout
    );
    assert_eq!(version(&silver(dir.path())).await, v);
    assert_eq!(read_target(&silver(dir.path())).await, content);
}

// ---------------------------------------------------------------------------------------------
// 5. quarantine

#[tokio::test]
async fn bad_rows_are_quarantined_once_and_the_run_succeeds_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let mut all = vec![up("a", T0 + HOUR, 1), up("b", T0 + 2 * HOUR, 2)];
    append(&bronze(dir.path()), &all).await;
    run_json(&p, NOW, &[]);
    assert_eq!(version(&quarantine(dir.path())).await, None);

    let w = T0 + 2 * HOUR + 30 * MIN;
    let bad = vec![
        null_key(w, 3),
        null_seq("q", w, 4),
        up("c", w, 5), // the new watermark: the null-key row stays inside the overlap
    ];
    append(&bronze(dir.path()), &bad).await;
    all.extend(bad);
    let out = exec(tidemark(NOW).arg("run").arg(&p).args(["--output", "json"]));
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("WARN") && out.stderr.contains("failed validation"),
        "no warning on stderr: {}",
        out.stderr
    );
    let s = one_json(&out.stdout);
    assert_eq!(num(&s, "num_quarantined"), 2, "{s}");
    assert_eq!(num(&s, "num_inserted"), 1, "c: {s}");
    assert_eq!(
        read_target(&silver(dir.path())).await,
        oracle(&all, NOW, false)
    );

    let q = quarantine(dir.path());
    assert_eq!(count_rows(&q).await, 2);
    let reasons = string_column(&q, "_quarantine_reason").await;
    assert_eq!(reasons.len(), 2);
    assert!(
        reasons.iter().flatten().any(|r| r.contains("`id`"))
            && reasons.iter().flatten().any(|r| r.contains("`updated_at`")),
        "reasons: {reasons:?}"
    );
    let ids = string_column(&q, "id").await;
    assert_eq!(ids, vec![None, Some("q".to_string())]);
    let run_ids = string_column(&q, "_run_id").await;
    assert!(
        run_ids.iter().all(|r| r.as_deref() == s["run_id"].as_str()),
        "{run_ids:?}"
    );

    // The rerun reads the null-key row again (it is inside the overlap) but stores it once.
    let again = run_json(&p, NOW, &[]);
    assert!(num(&again, "num_quarantined") >= 1, "{again}");
    assert_eq!(count_rows(&q).await, 2, "quarantined twice");
    assert_eq!(again["target_version"], Value::Null, "{again}");
    // In text, the warning is said once: in the summary, not also on stderr.
    let out = exec(tidemark_default_logs(NOW).arg("run").arg(&p));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let said = out.stdout.matches("failed validation").count();
    assert_eq!(said, 1, "{}", out.stdout);
    assert!(out.stdout.contains("warning: "), "{}", out.stdout);
    assert!(!out.stderr.contains("failed validation"), "{}", out.stderr);
}

#[tokio::test]
async fn over_the_quarantine_limit_the_run_fails_commits_nothing_but_keeps_the_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", ", max_rows: 0");
    let good = vec![up("a", T0 + HOUR, 1), up("b", T0 + 2 * HOUR, 2)];
    append(&bronze(dir.path()), &good).await;
    run_json(&p, NOW, &[]);
    let v = version(&silver(dir.path())).await;
    let content = read_target(&silver(dir.path())).await;

    append(
        &bronze(dir.path()),
        &[
            null_key(T0 + 3 * HOUR, 3),
            null_seq("q", T0 + 3 * HOUR, 4),
            up("c", T0 + 3 * HOUR, 5),
        ],
    )
    .await;
    let out = run_fail(&p, NOW, &[]);
    assert_eq!(out.code, 65, "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("max_rows") && out.stderr.contains("quarantine"),
        "{}",
        out.stderr
    );
    assert_eq!(version(&silver(dir.path())).await, v, "committed anyway");
    assert_eq!(read_target(&silver(dir.path())).await, content);
    assert_eq!(count_rows(&quarantine(dir.path())).await, 2);
}

// ---------------------------------------------------------------------------------------------
// 6. future rows

#[tokio::test]
async fn future_rows_are_deferred_until_their_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let future = up("f", NOW + HOUR, 7);
    let all = vec![
        up("a", T0 + HOUR, 1),
        future.clone(),
        up("b", T0 + 2 * HOUR, 2),
    ];
    append(&bronze(dir.path()), &all).await;

    let boot = run_json(&p, NOW, &[]);
    assert_eq!(num(&boot, "num_deferred"), 1, "{boot}");
    assert_eq!(num(&boot, "num_inserted"), 2, "{boot}");
    assert_eq!(
        time(&boot, "watermark_after"),
        Some(T0 + 2 * HOUR),
        "a future row must not move the watermark"
    );
    let content = read_target(&silver(dir.path())).await;
    assert!(content.iter().all(|r| r.id != "f"), "{content:?}");
    assert_eq!(content, oracle(&all, NOW, false));

    // Still in the future: deferred again, nothing committed.
    let s = run_json(&p, NOW + 30 * MIN, &[]);
    assert_eq!(num(&s, "num_deferred"), 1, "{s}");
    assert_eq!(s["target_version"], Value::Null, "{s}");

    // Two hours later it is due.
    let later = NOW + 2 * HOUR;
    let s = run_json(&p, later, &[]);
    assert_eq!(num(&s, "num_deferred"), 0, "{s}");
    assert_eq!(num(&s, "num_inserted"), 1, "{s}");
    assert_eq!(time(&s, "watermark_after"), future.seq);
    let content = read_target(&silver(dir.path())).await;
    assert_eq!(content, oracle(&all, later, false));
    assert!(content.iter().any(|r| r.id == "f"));
}

// ---------------------------------------------------------------------------------------------
// 7. dry run

/// The counts a dry run must predict exactly.
const COUNTS: &[&str] = &[
    "mode",
    "watermark_before",
    "watermark_after",
    "source_version",
    "num_source_rows_read",
    "num_quarantined",
    "num_deferred",
    "num_superseded",
    "num_duplicates",
    "num_conflicts",
    "num_late_rows",
    "num_inserted",
    "num_updated",
    "num_deleted",
    "num_unchanged",
];

fn assert_same_counts(dry: &Value, real: &Value) {
    for f in COUNTS {
        assert_eq!(
            dry[*f], real[*f],
            "`{f}` differs:\ndry:  {dry}\nreal: {real}"
        );
    }
}

#[tokio::test]
async fn dry_run_writes_nothing_and_predicts_the_real_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    append(
        &bronze(dir.path()),
        &[
            up("a", T0 + HOUR, 1),
            up("a", T0 + 2 * HOUR, 2),
            up("b", T0 + 2 * HOUR, 3),
            null_key(T0 + 2 * HOUR, 4),
        ],
    )
    .await;

    let dry = run_json(&p, NOW, &["--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["mode"], "bootstrap");
    assert_eq!(dry["target_version"], Value::Null);
    assert_eq!(num(&dry, "num_inserted"), 2, "{dry}");
    assert_eq!(num(&dry, "num_quarantined"), 1, "{dry}");
    assert_eq!(version(&silver(dir.path())).await, None, "target created");
    assert_eq!(
        version(&quarantine(dir.path())).await,
        None,
        "quarantine created"
    );
    assert!(!silver(dir.path()).join("_delta_log").exists());
    assert!(!quarantine(dir.path()).join("_delta_log").exists());

    let real = run_json(&p, NOW, &[]);
    assert_eq!(real["dry_run"], false);
    assert_same_counts(&dry, &real);
    let v = version(&silver(dir.path())).await;
    assert!(v.is_some());
    let content = read_target(&silver(dir.path())).await;

    append(
        &bronze(dir.path()),
        &[
            up("b", T0 + 3 * HOUR, 30),
            up("c", T0 + 2 * HOUR + 30 * MIN, 5),
            Change::upsert("l", T0 + 30 * MIN, T0 + 3 * HOUR, 6), // late
            Change::delete("a", T0 + 3 * HOUR, T0 + 3 * HOUR + MIN),
            null_seq("q", T0 + 3 * HOUR, 7),
        ],
    )
    .await;
    let dry = run_json(&p, NOW, &["--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["mode"], "incremental");
    assert_eq!(dry["target_version"], Value::Null);
    assert_eq!(version(&silver(dir.path())).await, v, "dry run committed");
    assert_eq!(read_target(&silver(dir.path())).await, content);
    assert_eq!(
        count_rows(&quarantine(dir.path())).await,
        1,
        "dry run quarantined"
    );

    let real = run_json(&p, NOW, &[]);
    assert_same_counts(&dry, &real);
    assert_eq!(num(&real, "num_late_rows"), 1, "{real}");
    assert_eq!(num(&real, "num_deleted"), 1, "{real}");
    assert_eq!(count_rows(&quarantine(dir.path())).await, 2);
}

// ---------------------------------------------------------------------------------------------
// 8. full reload

#[tokio::test]
async fn full_reload_is_one_commit_equal_to_the_incremental_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let mut all = vec![
        up("a", T0 + HOUR, 1),
        up("b", T0 + HOUR, 1),
        up("c", T0 + 2 * HOUR, 1),
        up("d", T0 + 3 * HOUR, 1),
    ];
    append(&bronze(dir.path()), &all).await;
    run_json(&p, NOW, &[]);
    let dup = up("a", T0 + 4 * HOUR, 2);
    let batch = vec![
        dup.clone(),
        dup,
        Change::delete("b", T0 + 4 * HOUR, T0 + 4 * HOUR + MIN),
        Change::upsert("c", T0 + 2 * HOUR + 30 * MIN, T0 + 4 * HOUR, 3), // late
        Change::upsert("e", T0 + 30 * MIN, T0 + 4 * HOUR, 4),            // late, new
        null_key(T0 + 4 * HOUR, 5),
    ];
    append(&bronze(dir.path()), &batch).await;
    all.extend(batch);
    let inc = run_json(&p, NOW, &[]);
    assert_eq!(num(&inc, "num_late_rows"), 2, "{inc}");
    let incremental = read_target(&silver(dir.path())).await;
    assert_eq!(incremental, oracle(&all, NOW, false));
    let v = version(&silver(dir.path())).await.expect("target");

    let full = run_json(&p, NOW, &["--full-reload"]);
    assert_eq!(full["mode"], "full_reload");
    assert_eq!(full["target_version"].as_u64(), Some(v + 1), "{full}");
    assert_eq!(version(&silver(dir.path())).await, Some(v + 1));
    assert!(time(&full, "watermark_before").is_some(), "{full}");
    assert_eq!(time(&full, "watermark_after"), Some(T0 + 4 * HOUR));
    assert_eq!(num(&full, "num_quarantined"), 1, "{full}");
    assert_eq!(read_target(&silver(dir.path())).await, incremental);
    assert_eq!(count_rows(&quarantine(dir.path())).await, 1);

    // The reload recorded the source version it read: the next hour is incremental again and
    // finds nothing to do.
    let next = run_json(&p, NOW, &[]);
    assert_eq!(next["mode"], "incremental");
    assert_eq!(next["target_version"], Value::Null, "{next}");
    assert_eq!(read_target(&silver(dir.path())).await, incremental);
}

// ---------------------------------------------------------------------------------------------
// 9. history and restore

#[tokio::test]
async fn history_lists_runs_and_restore_brings_back_a_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let target = silver(dir.path());
    let target_arg = target.to_str().expect("utf8 path");
    let mut all = vec![up("a", T0 + HOUR, 1), up("b", T0 + 3 * HOUR, 1)];
    append(&bronze(dir.path()), &all).await;
    let r0 = run_json(&p, NOW, &[]);
    let v0 = r0["target_version"].as_u64().expect("committed");
    let content0 = read_target(&target).await;

    // The next hour brings an update and a row two hours late.
    let batch = vec![
        up("a", T0 + 4 * HOUR, 2),
        Change::upsert("late", T0 + HOUR, T0 + 4 * HOUR, 3),
    ];
    append(&bronze(dir.path()), &batch).await;
    all.extend(batch);
    let r1 = run_json(&p, NOW, &[]);
    let v1 = r1["target_version"].as_u64().expect("committed");
    assert_eq!(num(&r1, "num_late_rows"), 1, "{r1}");
    let content1 = read_target(&target).await;
    assert_ne!(content0, content1);

    // history, text
    let out = exec(tidemark(NOW).args(["history", target_arg]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    for (v, r) in [(v0, &r0), (v1, &r1)] {
        let run_id = r["run_id"].as_str().expect("run id");
        assert!(
            out.stdout.contains(&run_id[..13]),
            "history lacks run {run_id}:\n{}",
            out.stdout
        );
        assert!(
            out.stdout
                .lines()
                .any(|l| l.contains(&run_id[..13]) && l.contains(&v.to_string())),
            "no line with version {v} and run {run_id}:\n{}",
            out.stdout
        );
    }

    // history, JSON
    let out = exec(tidemark(NOW).args(["history", target_arg, "--output", "json"]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let h = one_json(&out.stdout);
    let entries = h.as_array().expect("history JSON is an array");
    assert!(entries.len() >= 2, "{h}");
    for (v, r) in [(v0, &r0), (v1, &r1)] {
        let e = entries
            .iter()
            .find(|e| e["version"].as_u64() == Some(v))
            .unwrap_or_else(|| panic!("no entry for version {v}: {h}"));
        assert!(
            e["operation"].as_str().is_some_and(|o| !o.is_empty()),
            "{e}"
        );
        assert_eq!(e["run"]["run_id"], r["run_id"], "{e}");
    }
    assert_eq!(
        entries[0]["version"].as_u64(),
        Some(v1),
        "newest first: {h}"
    );

    // restore to v0: a new version, and the command that undoes it
    let out = exec(tidemark(NOW).args(["restore", target_arg, "--version", &v0.to_string()]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let new_version = v1 + 1;
    assert!(
        out.stdout.contains(&format!("new version {new_version}")),
        "{}",
        out.stdout
    );
    let undo = out
        .stdout
        .lines()
        .find(|l| l.contains("tidemark restore"))
        .unwrap_or_else(|| panic!("no undo command: {}", out.stdout));
    assert!(
        undo.contains("--version") && undo.contains(&format!("--version {v1}")),
        "{undo}"
    );
    assert_eq!(version(&target).await, Some(new_version));
    assert_eq!(read_target(&target).await, content0);

    // a version that does not exist
    let out = exec(tidemark(NOW).args(["restore", target_arg, "--version", "999"]));
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("from 0 to {}", new_version - 1)),
        "{}",
        out.stderr
    );
    assert_eq!(version(&target).await, Some(new_version));

    // Runbook "bad data merged -> restore, fix, rerun": the rerun after a restore must converge
    // to the full reload of the source, late row included.
    let r = run_json(&p, NOW, &[]);
    assert_eq!(
        read_target(&target).await,
        oracle(&all, NOW, false),
        "rerun after restore lost rows: {r}"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. generate

#[test]
fn generate_writes_a_table_and_appends_the_next_hour() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("bronze");
    let out_arg = out_dir.to_str().expect("utf8");
    let out = exec(tidemark(NOW).args([
        "generate",
        "--out",
        out_arg,
        "--payments",
        "500",
        "--days",
        "3",
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let first = one_json(&out.stdout);
    assert!(num(&first, "rows") >= 500, "{first}");
    let v = first["version"].as_i64().expect("version");

    let out = exec(tidemark(NOW).args([
        "generate",
        "--out",
        out_arg,
        "--next-hour",
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let next = one_json(&out.stdout);
    assert_eq!(next["version"].as_i64(), Some(v + 1), "{next}");

    tidemark(NOW)
        .args([
            "generate",
            "--out",
            out_arg,
            "--payments",
            "500",
            "--days",
            "3",
        ])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--next-hour"));
}

// ---------------------------------------------------------------------------------------------
// 11. demo

#[test]
fn demo_bootstraps_then_runs_incrementally() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    // The demo runs the bundle's payments_hourly job (its local target), like `job run`.
    let demo = |output: &str| {
        let out = exec(
            tidemark(
                chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                    .expect("time")
                    .timestamp_micros(),
            )
            .current_dir(dir.path())
            .arg("demo")
            .arg("--lake")
            .arg(&lake)
            .arg("--bundle")
            .arg(repo_file("bundle"))
            .args(["--output", output]),
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    let job = one_json(&demo("json"));
    assert_eq!(job["job"], "payments_hourly", "{job}");
    assert_eq!(job["status"], "succeeded", "{job}");
    // ingest_events, ingest_partner (landing -> bronze), merge_payments (bronze -> silver), then
    // daily_payments (silver -> gold), hourly_payments (gold by the hour, final by the
    // watermark), merchants (the dimension) and daily_segments (gold by segment, looked up as of
    // each payment).
    let keys: Vec<&str> = job["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task"].as_str())
        .collect();
    assert_eq!(
        keys,
        vec![
            "ingest_events",
            "ingest_partner",
            "merge_payments",
            "daily_payments",
            "hourly_payments",
            "merchants",
            "daily_segments"
        ],
        "{job}"
    );
    let gold = job["tasks"][3]["attempts"][0]["summary"].clone();
    assert_eq!(gold["kind"], "aggregate", "{gold}");
    assert_eq!(gold["mode"], "bootstrap", "{gold}");
    assert_eq!(
        gold["logical_date"], "2024-01-31",
        "the demo's clock: {gold}"
    );
    assert!(num(&gold, "num_days_open") > 0, "{gold}");
    let ingest = job["tasks"][0]["attempts"][0]["summary"].clone();
    assert_eq!(ingest["kind"], "ingest", "{ingest}");
    assert!(num(&ingest, "num_rows_written") > 0, "{ingest}");
    let first = job["tasks"][2]["attempts"][0]["summary"].clone();
    assert_eq!(first["mode"], "bootstrap", "{first}");
    assert!(num(&first, "num_inserted") > 0, "{first}");
    assert!(lake.join("silver/payments/_delta_log").exists());
    assert!(
        lake.join("_tidemark/runs/_delta_log").exists(),
        "the run is in the ledger"
    );
    let text = demo("text");
    assert!(
        text.contains("job payments_hourly on target local — succeeded"),
        "{text}"
    );
    assert!(text.contains("payments incremental run"), "{text}");
    // ... and ends with gold's day status: open days, final days.
    assert!(text.contains("daily_payments: day status"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with('│') && l.contains(" open ")),
        "{text}"
    );
    assert!(text.contains("final"), "{text}");
    // ... and gold by the hour: the data's clock and the newest hour windows.
    assert!(
        text.contains("hourly_payments: gold by the hour, final by the data's own clock"),
        "{text}"
    );
    assert!(text.contains("1h windows (Europe/Amsterdam"), "{text}");
    assert!(text.contains("watermark 2024-01-31T"), "{text}");
    // ... and, like `status` and `runs`, fits 100 columns.
    for line in text.lines() {
        assert!(
            line.chars().count() <= 100,
            "the demo prints a line of {} columns: {line}",
            line.chars().count()
        );
    }
    let job = one_json(&demo("json"));
    let third = &job["tasks"][2]["attempts"][0]["summary"];
    assert_eq!(third["mode"], "incremental", "{third}");
    // Each call's ingest commits the hour it landed to bronze (the partner's file, when one
    // arrived, too): the merge reads a newer bronze version every time.
    assert!(
        num(third, "source_version") >= num(&first, "source_version") + 2,
        "{third}"
    );
    assert!(num(third, "num_source_rows_read") > 0, "{third}");
}

/// `tidemark demo --feed debezium`: the same payments as Debezium events, through their own
/// job — the first call lands the history as event files, later ones the next hour; silver
/// reconciles with bronze (the TOASTed note kept, deletes applied, money exact).
#[test]
fn the_demo_runs_on_a_debezium_feed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let demo = |output: &str| {
        let out = exec(
            tidemark(
                chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                    .expect("time")
                    .timestamp_micros(),
            )
            .current_dir(dir.path())
            .args(["demo", "--feed", "debezium", "--lake"])
            .arg(&lake)
            .arg("--bundle")
            .arg(repo_file("bundle"))
            .args(["--output", output]),
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    let text = demo("text");
    assert!(
        text.contains("history as Debezium events: landing"),
        "{text}"
    );
    assert!(
        text.contains("job payments_debezium_hourly on target local — succeeded"),
        "{text}"
    );
    assert!(
        text.contains("daily_payments_debezium: day status"),
        "{text}"
    );
    assert!(text.contains("tidemark demo --lake"), "{text}");
    assert!(text.contains("--feed debezium"), "{text}");
    assert!(text.contains("--arrival _event_ts"), "{text}");
    let job = one_json(&demo("json"));
    assert_eq!(job["job"], "payments_debezium_hourly", "{job}");
    let merge = &job["tasks"][1]["attempts"][0]["summary"];
    assert_eq!(merge["mode"], "incremental", "{merge}");
    assert!(num(merge, "num_source_rows_read") > 0, "{merge}");
    let reconciled = exec(
        tidemark(
            chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                .expect("time")
                .timestamp_micros(),
        )
        .arg("reconcile")
        .arg(repo_file("pipelines/payments_debezium.yml"))
        .arg("--var")
        .arg(format!("lake={}", lake.display())),
    );
    assert_eq!(reconciled.code, 0, "{reconciled:?}");
    assert!(
        reconciled.stdout.contains("identical"),
        "{}",
        reconciled.stdout
    );
    assert!(
        !lake.join("silver/payments").exists(),
        "the Debezium feed has tables of its own"
    );
}

// ---------------------------------------------------------------------------------------------
// 12. error paths

/// Writes a pipeline with `edit` applied to the test pipeline's text; returns its path.
fn edited_pipeline(dir: &Path, name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let base = write_pipeline(dir, "15m", "soft", "");
    let text = std::fs::read_to_string(&base).expect("read pipeline");
    let edited = edit(&text);
    assert_ne!(edited, text, "the edit changed nothing");
    let path = dir.join(name);
    std::fs::write(&path, edited).expect("write pipeline");
    path
}

fn expect_failure(c: &mut Command, code: i32, fragments: &[&str]) -> String {
    let out = exec(c);
    assert_eq!(
        out.code, code,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    for f in fragments {
        assert!(
            out.stderr.contains(f),
            "stderr lacks {f:?}:\n{}",
            out.stderr
        );
    }
    assert!(out.stdout.is_empty(), "stdout on error: {}", out.stdout);
    out.stderr
}

#[tokio::test]
async fn config_errors_name_the_file_line_and_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let run = |p: &Path| {
        let mut c = tidemark(NOW);
        c.current_dir(d).arg("run").arg(p);
        c
    };

    // unknown key, with the nearest valid one
    let p = edited_pipeline(d, "typo.yml", |t| t.replace("overlap:", "overlaps:"));
    expect_failure(&mut run(&p), 78, &["did you mean `overlap`", "typo.yml:8"]);

    // negative overlap
    let p = edited_pipeline(d, "neg.yml", |t| t.replace("overlap: 15m", "overlap: -15m"));
    expect_failure(&mut run(&p), 78, &["neg.yml:8", "negative"]);

    // key column absent from the source
    let p = edited_pipeline(d, "key.yml", |t| {
        t.replace("keys: [id]", "keys: [payment_id]")
    });
    expect_failure(&mut run(&p), 78, &["key.yml:5", "payment_id"]);

    // sequence column is not a timestamp
    let p = edited_pipeline(d, "seq.yml", |t| {
        t.replace("sequence_by: updated_at", "sequence_by: val")
    });
    expect_failure(&mut run(&p), 78, &["seq.yml:6", "timestamp"]);

    // source table missing
    let p = edited_pipeline(d, "nosource.yml", |t| t.replace("/bronze\"", "/nowhere\""));
    expect_failure(&mut run(&p), 66, &["source.uri", "nowhere"]);
    assert_eq!(version(&silver(d)).await, None);

    // unknown pipeline name: lists the available ones
    expect_failure(
        tidemark(NOW)
            .current_dir(d)
            .args(["run", "no_such_pipeline", "--pipelines-dir"])
            .arg(repo_file("pipelines")),
        78,
        &["no_such_pipeline", "payments"],
    );
}

#[test]
fn variable_errors_say_how_to_pass_the_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let payments = repo_file("pipelines/payments.yml");
    // ${var.lake} without --var
    expect_failure(
        tidemark(NOW)
            .current_dir(dir.path())
            .arg("run")
            .arg(&payments),
        78,
        &["--var lake=", "${var.lake}"],
    );
    // --var without a value
    expect_failure(
        tidemark(NOW)
            .current_dir(dir.path())
            .arg("run")
            .arg(&payments)
            .args(["--var", "novalue"]),
        64,
        &["novalue", "NAME=VALUE"],
    );
}

#[test]
fn usage_errors_exit_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    // a clock that is not RFC 3339
    let mut c = Command::cargo_bin("tidemark").expect("binary");
    c.env("TIDEMARK_FAKE_NOW", "yesterday")
        .env("RUST_LOG", "warn")
        .arg("run")
        .arg(&p);
    expect_failure(&mut c, 64, &["TIDEMARK_FAKE_NOW", "RFC 3339"]);
    // unknown subcommand, unknown flag
    tidemark(NOW)
        .arg("frobnicate")
        .assert()
        .code(64)
        .stderr(predicate::str::contains("frobnicate"));
    tidemark(NOW)
        .arg("run")
        .arg(&p)
        .arg("--bogus")
        .assert()
        .code(64)
        .stderr(predicate::str::contains("--bogus"));
}

#[tokio::test]
async fn target_schema_mismatch_fails_and_full_reload_repairs_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    append(
        &bronze(d),
        &[up("a", T0 + HOUR, 1), up("b", T0 + 2 * HOUR, 2)],
    )
    .await;
    run_json(&p, NOW, &[]);
    assert!(!column_names(&silver(d)).await.contains(&"op".to_string()));
    let v = version(&silver(d)).await;

    // The same pipeline, but `op` is no longer excluded: the target lacks that column.
    let changed = edited_pipeline(d, "keep_op.yml", |t| {
        t.replace("columns: { exclude: [op] }\n", "")
    });
    append(&bronze(d), &[up("c", T0 + 3 * HOUR, 3)]).await;
    expect_failure(
        tidemark(NOW).current_dir(d).arg("run").arg(&changed),
        65,
        &["op", "--full-reload"],
    );
    assert_eq!(version(&silver(d)).await, v, "a failed run committed");

    // What the message suggests works.
    let full = run_json(&changed, NOW, &["--full-reload"]);
    assert_eq!(full["mode"], "full_reload");
    assert!(column_names(&silver(d)).await.contains(&"op".to_string()));
    assert_eq!(read_target(&silver(d)).await.len(), 3);
}

/// `tidemark run` honours the compute a job cluster would: a memory pool with spill, threads.
/// Bad values are usage errors.
#[tokio::test]
async fn run_honours_compute_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let rows: Vec<Change> = (0..300)
        .map(|i| Change::upsert(&format!("k{i:04}"), T0 + i * MIN / 10, T0 + HOUR, i))
        .collect();
    append(&bronze(dir.path()), &rows).await;
    let spill = dir.path().join("spill");
    let s = run_json(
        &p,
        NOW,
        &[
            "--full-reload",
            "--threads",
            "1",
            "--memory-limit",
            "64MiB",
            "--spill-dir",
            spill.to_str().expect("utf8"),
        ],
    );
    assert_eq!(s["num_inserted"], 300, "{s}");
    assert_eq!(
        read_target(&silver(dir.path())).await,
        oracle(&rows, NOW, false)
    );
    // reconcile reads both tables whole: it takes the same settings
    let out = exec(
        tidemark(NOW)
            .arg("reconcile")
            .arg(&p)
            .args(["--threads", "1", "--memory-limit", "64MiB", "--spill-dir"])
            .arg(&spill),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let left: Vec<_> = std::fs::read_dir(&spill).expect("spill").collect();
    assert!(left.is_empty(), "spill directories left behind: {left:?}");
    for command in ["run", "reconcile"] {
        for (flag, value) in [
            ("--memory-limit", "1kb"),
            ("--memory-limit", "lots"),
            ("--threads", "0"),
        ] {
            let out = exec(tidemark(NOW).arg(command).arg(&p).args([flag, value]));
            assert_eq!(out.code, 64, "{command} {flag} {value}: {}", out.stderr);
            assert!(out.stderr.contains(flag), "{}", out.stderr);
        }
    }
}
