//! Every commit carries the run's facts: the counts and watermarks that the
//! run summary prints are the ones `tidemark history` reads from the commit — also for a
//! bootstrap and a full reload, whose rows are streamed and counted only as the last data file
//! is written.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::Value;

fn json(out: Out) -> Value {
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

fn instant(v: &Value) -> Option<i64> {
    v.as_str().map(|s| {
        chrono::DateTime::parse_from_rfc3339(s)
            .expect("rfc3339")
            .timestamp_micros()
    })
}

/// The summary of a run and the facts of the commit it made must agree.
fn assert_commit_matches(dir: &Path, summary: &Value) {
    let history = json(exec(
        tidemark_in(dir, T0)
            .args(["history"])
            .arg(silver(dir))
            .args(["--limit", "1", "--output", "json"]),
    ));
    let run = &history[0]["run"];
    assert_eq!(run["run_id"], summary["run_id"], "{history}");
    for field in [
        "mode",
        "num_source_rows_read",
        "num_inserted",
        "num_updated",
        "num_deleted",
        "num_conflicts",
        "num_deferred",
        "source_version",
    ] {
        assert_eq!(
            run[field], summary[field],
            "`{field}`: commit {run} vs summary {summary}"
        );
    }
    for field in ["watermark_before", "watermark_after"] {
        assert_eq!(
            instant(&run[field]),
            instant(&summary[field]),
            "`{field}`: commit {run} vs summary {summary}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_full_reload_and_incremental_commits_carry_the_summary_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = write_pipeline(d, "15m", "soft", "");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0 + 10 * MIN, T0 + 11 * MIN, 1),
            Change::upsert("a", T0 + 20 * MIN, T0 + 21 * MIN, 2),
            Change::upsert("b", T0 + 20 * MIN, T0 + 21 * MIN, 1),
            Change::delete("c", T0 + 30 * MIN, T0 + 31 * MIN),
        ],
    )
    .await;
    let run = |extra: &[&str], now: i64| {
        json(exec(
            tidemark_in(d, now)
                .arg("run")
                .arg(&pipeline)
                .args(extra)
                .args(["--output", "json"]),
        ))
    };
    let boot = run(&[], T0 + HOUR);
    assert_eq!(boot["mode"], "bootstrap");
    assert_eq!(
        (boot["num_inserted"].as_u64(), boot["num_deleted"].as_u64()),
        (Some(2), Some(1))
    );
    assert_commit_matches(d, &boot);

    append(
        &bronze(d),
        &[Change::upsert("e", T0 + 70 * MIN, T0 + 71 * MIN, 1)],
    )
    .await;
    let inc = run(&[], T0 + 2 * HOUR);
    assert_commit_matches(d, &inc);

    let full = run(&["--full-reload"], T0 + 2 * HOUR);
    assert_eq!(full["num_inserted"], 3, "{full}");
    assert!(full["watermark_after"].is_string(), "{full}");
    assert_commit_matches(d, &full);
}
