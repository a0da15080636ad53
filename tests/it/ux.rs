//! Hardening, the user-facing part, through the real binary: limits, logs, JSON
//! output on failure, maintain's numbers, counter names, messages, getting started.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::Value;

const NOW: i64 = T0 + 12 * HOUR;

/// Stdout must be exactly one JSON value.
fn one_json(stdout: &str) -> Value {
    let mut values = serde_json::Deserializer::from_str(stdout).into_iter::<Value>();
    let first = values
        .next()
        .unwrap_or_else(|| panic!("no JSON on stdout: {stdout:?}"))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"));
    assert!(
        values.next().is_none(),
        "more than one JSON value: {stdout:?}"
    );
    first
}

fn up(id: &str, seq: i64, val: i64) -> Change {
    Change::upsert(id, seq, seq + MIN, val)
}

fn run_ok(dir: &Path, pipeline: &Path, now: i64) {
    let out = exec(
        tidemark_default_logs(now)
            .current_dir(dir)
            .arg("run")
            .arg(pipeline),
    );
    assert_eq!(out.code, 0, "run failed: {}\n{}", out.stdout, out.stderr);
}

// ---------------------------------------------------------------------------------------------
// item 8: --limit 0

#[tokio::test]
async fn limit_zero_is_a_usage_error_naming_the_minimum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    append(&bronze(d), &[up("b", T0 + HOUR, 2)]).await;
    for args in [
        vec!["history".to_string(), bronze(d).display().to_string()],
        vec!["runs".to_string()],
    ] {
        let out = exec(
            tidemark_default_logs(NOW)
                .current_dir(d)
                .args(&args)
                .args(["--limit", "0"]),
        );
        assert_eq!(out.code, 64, "{args:?}: {}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.is_empty(), "{args:?} printed {}", out.stdout);
        assert!(
            out.stderr.contains("at least 1"),
            "{args:?}: the message does not name the minimum: {}",
            out.stderr
        );
    }
    // 1 still works and shows exactly one commit
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("history")
            .arg(bronze(d))
            .args(["--limit", "1", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = one_json(&out.stdout);
    let n = v
        .as_array()
        .or_else(|| v.get("commits").and_then(Value::as_array))
        .map(Vec::len);
    assert_eq!(n, Some(1), "{v}");
}

// ---------------------------------------------------------------------------------------------
// item 9: logs

#[tokio::test]
async fn logs_default_to_warnings_without_colour_and_print_plain_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;

    // default: no INFO lines, and no colour on a pipe even without NO_COLOR
    let out = exec(
        tidemark_default_logs(NOW)
            .env_remove("NO_COLOR")
            .current_dir(d)
            .arg("run")
            .arg(&p),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        !out.stderr.contains("INFO"),
        "INFO by default: {}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\u{1b}'),
        "ANSI codes on a pipe: {:?}",
        out.stderr
    );

    // -v: INFO lines, still no colour, plain values
    append(&bronze(d), &[up("b", T0 + 2 * HOUR, 2)]).await;
    let out = exec(
        tidemark_default_logs(NOW)
            .env_remove("NO_COLOR")
            .current_dir(d)
            .args(["-v", "run"])
            .arg(&p),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("INFO"),
        "-v shows no INFO: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("planned incremental run"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\u{1b}'),
        "ANSI codes on a pipe: {:?}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("Some("),
        "debug text in logs: {}",
        out.stderr
    );

    // JSON logs at info: every line is JSON, no debug text in any value
    append(&bronze(d), &[up("c", T0 + 3 * HOUR, 3)]).await;
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .args(["--log-format", "json", "--log-level", "info", "run"])
            .arg(&p),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut planned = None;
    for line in out.stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(!line.contains("Some("), "debug text in a JSON log: {line}");
        if v["fields"]["message"] == "planned incremental run" {
            planned = Some(v);
        }
    }
    let planned = planned.unwrap_or_else(|| panic!("no plan line in {}", out.stderr));
    let w = planned["fields"]["watermark"]
        .as_str()
        .unwrap_or_else(|| panic!("watermark is not a string: {planned}"));
    assert!(
        chrono::DateTime::parse_from_rfc3339(w).is_ok(),
        "watermark {w:?} is not a plain RFC 3339 time"
    );
}

#[test]
fn an_invalid_log_level_is_a_usage_error_naming_the_levels() {
    let out = exec(tidemark_default_logs(NOW).args(["--log-level", "loud", "runs"]));
    assert_eq!(out.code, 64, "{}\n{}", out.stdout, out.stderr);
    for level in ["error", "warn", "info", "debug", "trace"] {
        assert!(
            out.stderr.contains(level),
            "{level} not named: {}",
            out.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------------
// item 10: --output json prints one JSON object whatever the outcome

/// A failed command with `--output json`: exactly one JSON object on stdout with
/// `error: {class, exit_code, message}` matching the exit code.
fn json_error(out: &Out, code: i32, class: &str) -> Value {
    assert_eq!(
        out.code, code,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    let v = one_json(&out.stdout);
    let e = &v["error"];
    assert_eq!(e["class"], class, "{v}");
    assert_eq!(e["exit_code"], code, "{v}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "no message: {v}"
    );
    v
}

#[tokio::test]
async fn every_json_command_prints_one_object_on_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    let json = ["--output", "json"];
    // run: the source does not exist
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("run")
            .arg(&p)
            .args(json),
    );
    let v = json_error(&out, 66, "unavailable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("bronze"),
        "{v}"
    );
    // history / maintain / restore of a missing table, runs without a ledger, reconcile
    for args in [
        vec!["history", "nowhere"],
        vec!["maintain", "nowhere"],
        vec!["restore", "nowhere", "--version", "0"],
        vec!["reconcile", "pipeline.yml"],
        vec!["job", "run", "no_such_job"],
    ] {
        let out = exec(
            tidemark_default_logs(NOW)
                .current_dir(d)
                .args(&args)
                .args(json),
        );
        assert_ne!(out.code, 0, "{args:?}");
        json_error(&out, out.code, class_of(out.code));
    }
    // a usage error found by the parser
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("run")
            .arg(&p)
            .args(json)
            .arg("--bogus"),
    );
    json_error(&out, 64, "usage");
    // a report that failed keeps its fields and gains `error`
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bundles/bad");
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .args(["bundle", "validate", "--bundle"])
            .arg(&bad)
            .args(json),
    );
    let v = json_error(&out, 78, "config");
    assert_eq!(v["valid"], false, "{v}");
}

fn class_of(code: i32) -> &'static str {
    match code {
        64 => "usage",
        65 => "bad_data",
        66 => "unavailable",
        70 => "internal",
        74 => "io",
        75 => "retryable",
        78 => "config",
        _ => "unknown",
    }
}

// ---------------------------------------------------------------------------------------------
// item 7: maintain's numbers

/// Data files on disk that the table's current version does not reference.
async fn unreferenced_on_disk(table: &Path) -> usize {
    let t = deltalake::open_table(url::Url::from_directory_path(table).expect("url"))
        .await
        .expect("open");
    let active = t.snapshot().expect("snapshot").log_data().num_files();
    let on_disk = std::fs::read_dir(table)
        .expect("list")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".parquet"))
        .count();
    on_disk - active
}

fn maintain_json(d: &Path, target: &Path, dry: bool) -> Value {
    let mut c = tidemark_default_logs(NOW);
    c.current_dir(d)
        .arg("maintain")
        .arg(target)
        .args(["--output", "json"]);
    if dry {
        c.arg("--dry-run");
    }
    let out = exec(&mut c);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    one_json(&out.stdout)
}

fn assert_dry_predicts_real(dry: &Value, real: &Value) {
    for f in [
        "version_before",
        "version_after",
        "files_before",
        "files_compacted",
        "files_written",
        "checkpoint_version",
        "files_vacuumed",
        "files_unreferenced_within_retention",
    ] {
        assert_eq!(dry[f], real[f], "`{f}`: dry run {dry}\nreal run {real}");
    }
}

#[tokio::test]
async fn maintain_dry_run_predicts_the_real_run_and_counts_files_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    for h in 1..=4 {
        // new keys and an update of an old one: small files, and rewritten (removed) ones
        append(
            &bronze(d),
            &[
                up(&format!("k{h}"), T0 + h * HOUR, h),
                up("k1", T0 + h * HOUR, 10 + h),
            ],
        )
        .await;
        run_ok(d, &p, NOW);
    }
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("restore")
            .arg(silver(d))
            .args(["--version", "2"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    // an unreferenced file that is gone already (an earlier vacuum, a hand clean-up): its
    // tombstone is still in the log, but it is not on disk and must not be counted
    let active: Vec<String> = {
        let t = deltalake::open_table(url::Url::from_directory_path(silver(d)).expect("url"))
            .await
            .expect("open");
        t.snapshot()
            .expect("snapshot")
            .log_data()
            .iter()
            .map(|f| f.path().to_string())
            .collect()
    };
    let gone = std::fs::read_dir(silver(d))
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".parquet") && !active.contains(n))
        .expect("an unreferenced file");
    std::fs::remove_file(silver(d).join(gone)).expect("remove");

    // by pipeline (clustered compaction)
    let dry = maintain_json(d, &p, true);
    let real = maintain_json(d, &p, false);
    assert!(real["files_compacted"].as_u64() >= Some(2), "{real}");
    assert!(real["files_written"].as_u64() >= Some(1), "{real}");
    assert_dry_predicts_real(&dry, &real);
    assert_eq!(
        real["files_unreferenced_within_retention"].as_u64(),
        Some(unreferenced_on_disk(&silver(d)).await as u64),
        "{real}"
    );
    // text says "would" in a dry run
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("maintain")
            .arg(&p)
            .arg("--dry-run"),
    );
    assert!(out.stdout.contains("would"), "{}", out.stdout);

    // by table URI (no keys): the same promise
    for h in 5..=7 {
        append(&bronze(d), &[up(&format!("k{h}"), T0 + h * HOUR, h)]).await;
        run_ok(d, &p, NOW);
    }
    let dry = maintain_json(d, &silver(d), true);
    let real = maintain_json(d, &silver(d), false);
    assert!(real["files_compacted"].as_u64() >= Some(2), "{real}");
    assert_dry_predicts_real(&dry, &real);
}

// ---------------------------------------------------------------------------------------------
// item 13: names and numbers

#[tokio::test]
async fn superseded_versions_and_redelivered_duplicates_are_counted_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    let again = up("a", T0 + 2 * HOUR, 2);
    append(&bronze(d), &[up("b", T0 + HOUR, 3)]).await;
    run_ok(d, &p, NOW);
    // a: an old version, the newest, and the newest delivered again
    append(&bronze(d), &[up("a", T0 + HOUR, 1), again.clone(), again]).await;
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("run")
            .arg(&p)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = one_json(&out.stdout);
    assert_eq!(s["num_superseded"], 1, "{s}");
    assert_eq!(s["num_duplicates"], 1, "{s}");
    assert!(s.get("num_duplicates_collapsed").is_none(), "{s}");
    // the commit facts of an incremental run carry both (a bootstrap's facts are written
    // before its counts are known: left to the owner of src/run/mod.rs)
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("history")
            .arg(silver(d))
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let h = one_json(&out.stdout);
    let run = &h[0]["run"];
    assert_eq!(run["num_superseded"], 1, "{h}");
    assert_eq!(run["num_duplicates"], 1, "{h}");
    // the text summary names them
    append(&bronze(d), &[up("c", T0 + 3 * HOUR, 4)]).await;
    let out = exec(tidemark_default_logs(NOW).current_dir(d).arg("run").arg(&p));
    assert!(out.stdout.contains("superseded versions"), "{}", out.stdout);
    assert!(
        out.stdout.contains("duplicates (re-delivered)"),
        "{}",
        out.stdout
    );
}

/// RFC 3339, UTC, `Z`, exactly six fraction digits.
fn is_micros_z(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 27 && s.ends_with('Z') && b[19] == b'.' && b[20..26].iter().all(u8::is_ascii_digit)
}

#[tokio::test]
async fn runs_fits_100_columns_and_times_have_one_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let bundle = write_bundle(
        d,
        "    j:\n      tasks:\n        - task_key: the_only_task_of_this_job\n          pipeline_task: { pipeline: \"${PIPELINE}\" }\n",
    );
    // a failed attempt (no source yet: a long error message), then a successful one
    let out = exec(
        tidemark_default_logs(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_ne!(out.code, 0, "{}", out.stdout);
    append(
        &bronze(d),
        &[up("a", T0 + HOUR, 1), up("a", T0 + 2 * HOUR, 2)],
    )
    .await;
    let out = exec(
        tidemark_default_logs(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    // the summary's phases in execution order (a bootstrap dedups inside its write)
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("phases (ms)"))
        .unwrap_or_else(|| panic!("no phases in {}", out.stdout));
    let order: Vec<usize> = [
        "plan", "read", "validate", "dedup", "compare", "commit", "write",
    ]
    .iter()
    .filter_map(|p| line.find(&format!(" {p} ")))
    .collect();
    assert!(order.len() >= 4, "{line}");
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "phases out of order: {line}"
    );

    let out = exec(
        tidemark_default_logs(NOW)
            .args(["runs", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    for line in out.stdout.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    // the failed try points at a note under the table with the error's first words, whole
    assert!(out.stdout.contains("failed [1]"), "{}", out.stdout);
    let note = out
        .stdout
        .lines()
        .find(|l| l.starts_with("[1] the_only_task_of_this_job, try 1: ["))
        .unwrap_or_else(|| panic!("no error note in {}", out.stdout));
    assert!(note.len() > 60, "{note}");
    assert!(
        out.stdout
            .lines()
            .next()
            .unwrap_or("")
            .starts_with("job j "),
        "{}",
        out.stdout
    );
    let wide = exec(
        tidemark_default_logs(NOW)
            .args(["runs", "--wide", "--bundle"])
            .arg(&bundle),
    );
    assert!(
        wide.stdout.contains("trigger") && !wide.stdout.contains('…'),
        "{}",
        wide.stdout
    );

    // one time format: ledger JSON, job report JSON, run summary, history
    let rows = held::bundle_ledger(tidemark_default_logs(NOW), &bundle);
    for r in &rows {
        for f in ["started_at", "ended_at", "watermark_after"] {
            if let Some(s) = r[f].as_str() {
                assert!(is_micros_z(s), "ledger {f} {s:?}");
            }
        }
    }
    append(&bronze(d), &[up("b", T0 + 3 * HOUR, 1)]).await;
    let out = exec(
        tidemark_default_logs(NOW)
            .args(["job", "run", "j", "--output", "json", "--bundle"])
            .arg(&bundle),
    );
    let job = one_json(&out.stdout);
    let attempt = &job["tasks"][0]["attempts"][0];
    for s in [
        &job["started_at"],
        &attempt["ended_at"],
        &attempt["summary"]["watermark_after"],
    ] {
        let s = s.as_str().unwrap_or_else(|| panic!("not a time: {job}"));
        assert!(is_micros_z(s), "{s:?}");
    }
    let out = exec(
        tidemark_default_logs(NOW)
            .arg("history")
            .arg(silver(d))
            .args(["--output", "json"]),
    );
    let h = one_json(&out.stdout);
    let time = h[0]["time"]
        .as_str()
        .unwrap_or_else(|| panic!("no time: {h}"));
    assert!(is_micros_z(time), "{time:?}");
    let w = h[0]["run"]["watermark_after"]
        .as_str()
        .unwrap_or_else(|| panic!("{h}"));
    assert!(is_micros_z(w), "commit facts: {w:?}");
}
