//! The run contract every kind keeps, through the binary: its commits name their kind (and
//! `history` reads it), its failpoints carry its kind, a recreated source is refused, and a
//! changed definition is refused with exit 65 until `--full-reload`.

use std::ffi::OsStr;
use std::path::Path;

use crate::common::*;

fn edit(p: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(p).expect("read");
    assert!(text.contains(from), "{from} not in {text}");
    std::fs::write(p, text.replacen(from, to, 1)).expect("write");
}

fn history_json(table: &Path) -> serde_json::Value {
    let out = exec(
        tidemark_at(T0)
            .arg("history")
            .arg(table)
            .args(["--limit", "1", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

fn merge_run(p: &Path, now: i64, extra: &[&str]) -> Out {
    exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"])
            .args(extra),
    )
}

/// Each setting that gives silver's rows their meaning, changed, is refused with 65 naming it
/// (a dry run too) and nothing is written; `--full-reload` rebuilds under the new one, and the
/// runs after it go on.
#[tokio::test]
async fn a_changed_merge_definition_is_refused_until_a_full_reload() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0, T0 + MIN, 1),
            Change::upsert("b", T0 + MIN, T0 + 2 * MIN, 2),
        ],
    )
    .await;
    let now = T0 + HOUR;
    assert_eq!(merge_run(&p, now, &[]).code, 0);
    append(&bronze(d), &[Change::upsert("a", T0 + 5 * MIN, now, 3)]).await;
    let before = version(&silver(d)).await;
    for (from, to, setting) in [
        ("keys: [id]", "keys: [id, val]", "keys"),
        ("tie_breakers: [_ingested_at]\n", "", "tie_breakers"),
        ("mode: soft", "mode: hard", "deletes"),
    ] {
        edit(&p, from, to);
        for extra in [&[][..], &["--dry-run"][..]] {
            let out = merge_run(&p, now + MIN, extra);
            assert_eq!(
                out.code, 65,
                "{setting} {extra:?}: {}\n{}",
                out.stdout, out.stderr
            );
            assert!(
                out.stderr.contains(&format!("`{setting}`"))
                    && out.stderr.contains("--full-reload"),
                "{setting}: {}",
                out.stderr
            );
        }
        assert_eq!(
            version(&silver(d)).await,
            before,
            "{setting}: nothing written"
        );
        edit(&p, to, from);
    }
    edit(&p, "mode: soft", "mode: hard");
    let rebuilt = merge_run(&p, now + MIN, &["--full-reload"]);
    assert_eq!(rebuilt.code, 0, "{}", rebuilt.stderr);
    append(
        &bronze(d),
        &[Change::upsert("b", T0 + 6 * MIN, now + MIN, 4)],
    )
    .await;
    let next = merge_run(&p, now + 2 * MIN, &[]);
    assert_eq!(next.code, 0, "{}", next.stderr);
    let rows = read_target(&silver(d)).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
}

/// An aggregate's source deleted and written again (a new table id) is refused: its version
/// numbers say nothing about which changes gold has seen. `--full-reload` rebuilds from it.
#[tokio::test]
async fn a_recreated_source_of_an_aggregate_is_refused_until_a_full_reload() {
    use crate::aggregate::{pipeline, six_days, write_source};
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    write_source(d, &six_days()).await;
    let p = pipeline(d, "recompute: { lookback: 2d }\n");
    let daily = |extra: &[&str]| {
        exec(
            tidemark_at(crate::aggregate::at(2024, 4, 10, 12, 0))
                .arg("run")
                .arg(&p)
                .args(["--logical-date", "2024-04-06", "--output", "json"])
                .args(extra),
        )
    };
    assert_eq!(daily(&[]).code, 0);
    std::fs::remove_dir_all(d.join("silver")).expect("rm");
    write_source(d, &six_days()).await;
    let gold = version(&d.join("gold")).await;
    let out = daily(&[]);
    assert_eq!(out.code, 65, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("not the table the target was built from")
            && out.stderr.contains("--full-reload")
            && !out.stderr.contains("on_recreate"),
        "{}",
        out.stderr
    );
    assert_eq!(version(&d.join("gold")).await, gold, "nothing written");
    let reload = daily(&["--full-reload"]);
    assert_eq!(reload.code, 0, "{}", reload.stderr);
    assert_eq!(daily(&[]).code, 0);
}

/// Every kind's commit says its kind, with the counters the run summary printed; `history`
/// shows each kind's rows without guessing.
#[tokio::test]
async fn every_kind_names_itself_in_its_commits() {
    // cdc_merge
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = write_pipeline(d, "15m", "soft", "");
    append(&bronze(d), &[Change::upsert("a", T0, T0 + MIN, 1)]).await;
    let out = merge_run(&p, T0 + HOUR, &[]);
    let summary: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    let run = &history_json(&silver(d))[0]["run"];
    assert_eq!(run["kind"], "cdc_merge", "{run}");
    for k in [
        "run_id",
        "mode",
        "num_inserted",
        "num_source_rows_read",
        "watermark_after",
    ] {
        assert_eq!(run[k], summary[k], "{k}: {run} vs {summary}");
    }
    // ingest
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    crate::ingest::pipeline(d, "");
    crate::ingest::land(d, "a.jsonl", &[("p1", 1), ("p2", 2)]);
    assert_eq!(crate::ingest::run(d, T0, &[]).code, 0);
    let run = &history_json(&d.join("lake/bronze"))[0]["run"];
    assert_eq!(run["kind"], "ingest", "{run}");
    assert_eq!(run["num_rows_written"], 2, "{run}");
    let text = exec(tidemark_at(T0).arg("history").arg(d.join("lake/bronze")));
    assert!(
        text.stdout.contains("2 rows from 1 file"),
        "{}",
        text.stdout
    );
    // aggregate
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    crate::aggregate::write_source(d, &crate::aggregate::six_days()).await;
    let p = crate::aggregate::pipeline(d, "");
    let s = crate::aggregate::run(&p, "2024-04-06", &[]);
    let run = &history_json(&d.join("gold"))[0]["run"];
    assert_eq!(run["kind"], "aggregate", "{run}");
    assert_eq!(run["source_version"], s["source_version"], "{run}");
    let status = &history_json(&d.join("gold_status"))[0]["run"];
    assert_eq!(status["kind"], "aggregate", "{status}");
}

/// A failpoint names its kind: an ingest does not stop at a merge's point of the same phase,
/// and stops at its own.
#[tokio::test]
async fn failpoints_carry_the_kind() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    crate::ingest::pipeline(d, "");
    crate::ingest::land(d, "a.jsonl", &[("p1", 1)]);
    let other = exec(tidemark_at(T0).arg("run").arg(d.join("ingest.yml")).env(
        "TIDEMARK_FAILPOINTS",
        "cdc_merge.full_reload.after_read=error",
    ));
    assert_eq!(
        other.code, 0,
        "a merge's failpoint fired in an ingest: {}",
        other.stderr
    );
    crate::ingest::land(d, "b.jsonl", &[("p2", 2)]);
    let own = exec(
        tidemark_at(T0 + HOUR)
            .arg("run")
            .arg(d.join("ingest.yml"))
            .env("TIDEMARK_FAILPOINTS", "ingest.incremental.after_read=error"),
    );
    assert_eq!(own.code, 75, "{}", own.stderr);
    assert!(
        own.stderr.contains("ingest.incremental.after_read"),
        "{}",
        own.stderr
    );
}

/// An ingest of `a.jsonl` (run 1), then of `b.jsonl` and `c.jsonl` (run 2).
fn two_ingest_runs(d: &Path) {
    use crate::ingest::{land, pipeline, run};
    pipeline(d, "max_files_per_run: 2\n");
    land(d, "a.jsonl", &[("p1", 1)]);
    assert_eq!(run(d, T0, &[]).code, 0);
    land(d, "b.jsonl", &[("p2", 2)]);
    land(d, "c.jsonl", &[("p3", 3)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
}

/// A pipeline's tables are restored together: an ingest's record index goes back with bronze,
/// so files the undone runs ingested are ingested again — also when the next run takes only
/// some of them (its run number is one the undone runs used).
#[tokio::test]
async fn restoring_an_ingest_restores_its_record_and_loses_no_file() {
    use crate::ingest::{held_sorted, oracle_sorted, pipeline, run};
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    two_ingest_runs(d);
    let restored = exec(
        tidemark_at(T0 + 2 * HOUR)
            .arg("restore")
            .arg(d.join("ingest.yml"))
            .args(["--version", "0", "--output", "json"]),
    );
    assert_eq!(restored.code, 0, "{}", restored.stderr);
    let v: serde_json::Value = serde_json::from_str(restored.stdout.trim()).expect("json");
    assert_eq!(v["also_restored"][0]["role"], "record", "{v}");
    // an ingest reads no source table: what comes back is its run number, not a source version
    assert_eq!(v["source_versions"], serde_json::json!([]), "{v}");
    assert_eq!(v["ingest_runs"], serde_json::json!([["events", 1]]), "{v}");
    // The next run takes one file (the run number the undone run had), the one after the rest.
    pipeline(d, "max_files_per_run: 1\n");
    for h in 3..6 {
        assert_eq!(run(d, T0 + h * HOUR, &[]).code, 0);
    }
    assert_eq!(
        held_sorted(d).await,
        oracle_sorted(d),
        "every landing record once"
    );
}

/// Bronze restored alone (by its URI, the record index left ahead of it): the next run drops
/// the index's rows of the undone runs before it commits, and no file is lost.
#[tokio::test]
async fn an_ingest_record_ahead_of_a_restored_bronze_loses_no_file() {
    use crate::ingest::{held_sorted, oracle_sorted, pipeline, run};
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    two_ingest_runs(d);
    let restored = exec(
        tidemark_at(T0 + 2 * HOUR)
            .arg("restore")
            .arg(d.join("lake/bronze"))
            .args(["--version", "0"]),
    );
    assert_eq!(restored.code, 0, "{}", restored.stderr);
    pipeline(d, "max_files_per_run: 1\n");
    let first = run(d, T0 + 3 * HOUR, &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    // (the warning is in the run's summary)
    assert!(
        first.stdout.contains("held runs bronze no longer has"),
        "{}",
        first.stdout
    );
    for h in 4..6 {
        assert_eq!(run(d, T0 + h * HOUR, &[]).code, 0);
    }
    assert_eq!(
        held_sorted(d).await,
        oracle_sorted(d),
        "every landing record once"
    );
}

/// The ledger row of every task names its kind and keeps all its counters (as the run summary
/// has them), beside the typed columns every kind fills.
#[test]
fn the_ledger_keeps_each_kinds_counters() {
    let dir = tempfile::tempdir().expect("tmp");
    let lake = dir.path().join("lake");
    let bundle = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle");
    let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("time")
        .timestamp_micros();
    let demo = exec(
        tidemark_in(dir.path(), now)
            .arg("demo")
            .arg("--lake")
            .arg(&lake)
            .arg("--bundle")
            .arg(&bundle),
    );
    assert_eq!(demo.code, 0, "{}", demo.stderr);
    let var = format!("lake={}", lake.display());
    let rows = held::ledger(
        tidemark_in(dir.path(), now),
        [
            OsStr::new("--var"),
            OsStr::new(&var),
            OsStr::new("--bundle"),
            bundle.as_os_str(),
        ],
    );
    let by_task = |task: &str| {
        rows.iter()
            .find(|r| r["task"] == task)
            .cloned()
            .unwrap_or_else(|| panic!("no {task} in {rows:?}"))
    };
    for (task, kind, counter) in [
        ("ingest_events", "ingest", "num_files_ingested"),
        ("merge_payments", "cdc_merge", "num_superseded"),
        ("daily_payments", "aggregate", "num_days_changed"),
        ("merchants", "dimension", "num_keys_changed"),
    ] {
        let row = by_task(task);
        assert_eq!(row["kind"], kind, "{row}");
        let counters: serde_json::Value =
            serde_json::from_str(row["counters"].as_str().expect("counters")).expect("json");
        assert!(counters.get(counter).is_some(), "{task}: {counters}");
    }
}
