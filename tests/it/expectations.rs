//! `expectations:` through the binary: `quarantine` sets failing rows aside (once, with the rule
//! in the reason), `warn` keeps and counts them, `fail` stops the run before any commit naming
//! the rule, the count and example keys; a NULL result is a failure; per-rule counts in the
//! summary and the commit; a rule over an unknown column or with bad syntax is a config error at
//! its line.

use crate::common;

use std::path::Path;

use common::*;

fn pipeline(dir: &Path, rules: &str) -> std::path::PathBuf {
    let p = write_pipeline(dir, "15m", "soft", "");
    let mut text = std::fs::read_to_string(&p).expect("read");
    text.push_str("expectations:\n");
    text.push_str(rules);
    std::fs::write(&p, text).expect("write");
    p
}

fn run(p: &Path, now: i64) -> Out {
    exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"]),
    )
}

fn summary(out: &Out) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn failed(s: &serde_json::Value, rule: &str) -> u64 {
    s["expectations"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["name"] == rule))
        .and_then(|o| o["failed"].as_u64())
        .unwrap_or_else(|| panic!("no rule {rule} in {s}"))
}

#[tokio::test]
async fn quarantine_warn_and_null_results() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(
        d,
        "  - { name: val_non_negative, sql: \"val >= 0\", on_fail: quarantine }\n  - { name: small, sql: \"val < 1000\" }\n",
    );
    let mut rows = vec![
        Change::upsert("a", T0, T0, 5),
        Change::upsert("b", T0, T0, -1),
        Change::upsert("c", T0, T0, 5000),
    ];
    let mut null_val = Change::upsert("d", T0, T0, 0);
    null_val.val = None;
    rows.push(null_val);
    append(&bronze(d), &rows).await;
    let out = run(&p, T0 + HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = summary(&out);
    // `val >= 0` is NULL for d: a failure, like b. `val < 1000` fails for c and (NULL) d.
    assert_eq!(failed(&s, "val_non_negative"), 2, "{s}");
    assert_eq!(failed(&s, "small"), 2, "{s}");
    assert_eq!(failed(&s, "key_not_null"), 0, "{s}");
    assert_eq!(s["num_quarantined"], 2);
    assert!(
        s["warnings"]
            .to_string()
            .contains("expectation `small` failed for 2 row(s)"),
        "{s}"
    );
    let target: Vec<String> = read_target(&silver(d))
        .await
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(target, vec!["a", "c"]);
    let reasons = strings(&read_all(&quarantine(d)).await, "_quarantine_reason");
    assert_eq!(reasons, vec!["expectation `val_non_negative` failed"; 2]);
    // The commit carries the counts; a rerun over the same rows quarantines nothing new.
    let text = std::fs::read_to_string(silver(d).join("_delta_log/00000000000000000000.json"))
        .expect("log");
    assert!(text.contains("\"expectations\":[{"), "{text}");
    // (the first run is a bootstrap: its `warn` rule is counted inside the write's stream, and
    // the commit carries that count, not the placeholder of the counting pass)
    assert!(
        text.contains("\"failed\":2,\"name\":\"small\",\"on_fail\":\"warn\""),
        "{text}"
    );
    let again = run(&p, T0 + 2 * HOUR);
    assert_eq!(summary(&again)["num_quarantined_new"], 0);
}

#[tokio::test]
async fn a_fail_rule_stops_the_run_naming_rule_count_and_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(
        d,
        "  - { name: no_test_ids, sql: \"id NOT LIKE 'test%'\", on_fail: fail }\n",
    );
    append(&bronze(d), &[Change::upsert("a", T0, T0, 1)]).await;
    assert_eq!(run(&p, T0 + HOUR).code, 0);
    append(
        &bronze(d),
        &[
            Change::upsert("test1", T0 + HOUR, T0 + HOUR, 1),
            Change::upsert("b", T0 + HOUR, T0 + HOUR, 2),
        ],
    )
    .await;
    let before = version(&silver(d)).await;
    let out = run(&p, T0 + 2 * HOUR);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("expectation `no_test_ids`")
            && out.stderr.contains("failed for 1 row(s)")
            && out.stderr.contains("id=\"test1\""),
        "{}",
        out.stderr
    );
    assert_eq!(version(&silver(d)).await, before, "nothing committed");
}

#[tokio::test]
async fn bad_rules_are_config_errors_at_their_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    append(&bronze(d), &[Change::upsert("a", T0, T0, 1)]).await;
    let p = pipeline(d, "  - { name: typo, sql: \"amount_cents >= 0\" }\n");
    let out = run(&p, T0 + HOUR);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("pipeline.yml:14:") && out.stderr.contains("amount_cents"),
        "{}",
        out.stderr
    );
    let p = pipeline(d, "  - { name: syntax, sql: \"val >=\" }\n");
    let out = run(&p, T0 + HOUR);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("not a SQL expression"),
        "{}",
        out.stderr
    );
    let p = pipeline(d, "  - { name: number, sql: \"val + 1\" }\n");
    let out = run(&p, T0 + HOUR);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stderr.contains("not a condition"), "{}", out.stderr);
    let p = pipeline(d, "  - { name: key_not_null, sql: \"val > 0\" }\n");
    let out = run(&p, T0 + HOUR);
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert_eq!(version(&silver(d)).await, None, "nothing was created");
}

#[tokio::test]
async fn the_ledger_keeps_each_rules_count() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let bundle = write_bundle(d, "    j:\n      tasks:\n        - task_key: t\n          pipeline_task: { pipeline: \"${PIPELINE}\" }\n");
    // write_bundle wrote the plain pipeline: add a rule to it.
    let p = d.join("pipeline.yml");
    let mut text = std::fs::read_to_string(&p).expect("read");
    text.push_str("expectations:\n  - { name: positive, sql: \"val > 0\", on_fail: quarantine }\n");
    std::fs::write(&p, text).expect("write");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0, T0, 1),
            Change::upsert("b", T0, T0, -2),
        ],
    )
    .await;
    let job = exec(
        tidemark_at(T0 + HOUR)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(job.code, 0, "{}", job.stderr);
    let rows = held::bundle_ledger(tidemark_at(T0 + HOUR), &bundle);
    let e: serde_json::Value =
        serde_json::from_str(rows[0]["expectations"].as_str().expect("expectations"))
            .expect("json");
    assert_eq!(
        e[2],
        serde_json::json!({"name": "positive", "on_fail": "quarantine", "failed": 1}),
        "{e}"
    );
}
