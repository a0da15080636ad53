//! Jobs as code, end to end: `bundle validate` on good and bad fixtures, `bundle summary`,
//! `job run` (dependency order, retries, timeouts, the ledger, compute), single flight across
//! real processes (a second run exits 75; a killed run's lease is taken over), and the
//! scheduler driven through DST changes and downtime by a test clock.
//!
//! Processes get a pinned clock (`TIDEMARK_FAKE_NOW`); in-process scheduler tests run on tokio's
//! paused clock, so days pass in milliseconds and nothing depends on timing.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use futures::future::BoxFuture;
use serde_json::Value;
use tidemark::clock::{Clock, TokioClock};
use tidemark::config::bundle::CatchUp;
use tidemark::config::schedule::QuartzSchedule;
use tidemark::jobs::{Executor, Fire, JobsError, ScheduledJob, Scheduler, Trigger};

/// The instant the binary believes it is.
const NOW: i64 = T0 + 12 * HOUR;

// ---------------------------------------------------------------------------------------------
// helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/bundles")
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("RFC 3339")
        .with_timezone(&Utc)
}

/// An upsert ingested one minute after its event time.
fn up(id: &str, seq: i64, val: i64) -> Change {
    Change::upsert(id, seq, seq + MIN, val)
}

/// (task, attempt, trigger, status, error_class) of ledger rows, oldest first.
fn attempts(rows: &[Value]) -> Vec<(String, i64, String, String, String)> {
    let mut v: Vec<_> = rows
        .iter()
        .rev()
        .map(|r| {
            (
                r["task"].as_str().unwrap_or_default().to_string(),
                r["attempt"].as_i64().unwrap_or(-1),
                r["trigger"].as_str().unwrap_or_default().to_string(),
                r["status"].as_str().unwrap_or_default().to_string(),
                r["error_class"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.sort_by_key(|a| (a.0.clone(), a.1));
    v
}

fn tuple(
    task: &str,
    attempt: i64,
    trigger: &str,
    status: &str,
    class: &str,
) -> (String, i64, String, String, String) {
    (
        task.into(),
        attempt,
        trigger.into(),
        status.into(),
        class.into(),
    )
}

// ---------------------------------------------------------------------------------------------
// bundle validate / summary

#[test]
fn the_repository_bundle_is_valid_for_every_target() {
    for target in ["local", "prod"] {
        let out = exec(
            tidemark_at(NOW)
                .current_dir(repo())
                .args(["bundle", "validate", "--target", target]),
        );
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        assert_eq!(
            out.stdout,
            format!("bundle tidemark (target {target}): valid — 3 jobs (payments_debezium_hourly, payments_full_reload, payments_hourly), 0 warnings\n")
        );
    }
}

#[test]
fn a_good_bundle_is_valid_and_warns_about_a_schedule_in_the_dst_hours() {
    let out = exec(
        tidemark_at(NOW)
            .current_dir(fixtures())
            .args(["bundle", "validate", "--bundle", "good"]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout,
        "good/resources/jobs.yml:21: warning: `0 30 1 ? * MON-FRI` fires between 01:00 and 03:00 local time in Europe/London, where DST changes the clock: on the spring-forward day a fire time that does not exist runs once at the end of the gap, and on the fall-back day a repeated time runs once (the first); use timezone_id UTC for strictly periodic runs, or `dst_acknowledged: true` in the schedule to accept this and silence the warning\n\
         bundle good (target local): valid — 2 jobs (hourly, nightly_london), 1 warning\n"
    );
    // JSON says the same
    let out = exec(tidemark_at(NOW).current_dir(fixtures()).args([
        "bundle", "validate", "--bundle", "good", "--target", "prod", "--output", "json",
    ]));
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["valid"], true);
    assert_eq!(v["target"], "prod");
    assert_eq!(v["warnings"][0]["line"], 21);
}

#[test]
fn an_acknowledged_dst_schedule_is_quiet() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixtures(), dir.path());
    let good = dir.path().join("good");
    let jobs = good.join("resources/jobs.yml");
    let text = std::fs::read_to_string(&jobs).expect("jobs.yml");
    let acked = text.replace(
        "        pause_status: PAUSED\n",
        "        pause_status: PAUSED\n        dst_acknowledged: true\n",
    );
    assert_ne!(acked, text, "the fixture has no paused schedule");
    std::fs::write(&jobs, acked).expect("write");
    let out = exec(
        tidemark_at(NOW)
            .current_dir(dir.path())
            .args(["bundle", "validate", "--bundle", "good"]),
    );
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (
            0,
            "bundle good (target local): valid — 2 jobs (hourly, nightly_london), 0 warnings\n",
            ""
        )
    );
    let out = exec(
        tidemark_at(NOW)
            .current_dir(dir.path())
            .args(["bundle", "summary", "--bundle", "good"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("DST"), "{}", out.stderr);
}

#[test]
fn every_wrong_value_of_a_file_is_reported_in_one_pass_in_plain_words() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixtures(), dir.path());
    let jobs = dir.path().join("good/resources/jobs.yml");
    let text = std::fs::read_to_string(&jobs).expect("jobs.yml");
    let edits = [
        ("      timeout_seconds: 600\n", "      timeout_seconds: ten\n"),
        (
            "        - task_key: load\n          job_cluster_key: small\n",
            "        - task_key: load\n          max_retries: two\n          retry_on_timeout: maybe\n          job_cluster_key: small\n          colour: red\n",
        ),
        ("p.yml, mode: incremental }", "p.yml, mode: incremetal }"),
    ];
    let mut bad = text.clone();
    for (from, to) in edits {
        assert!(bad.contains(from), "the fixture has no {from:?}");
        bad = bad.replacen(from, to, 1);
    }
    std::fs::write(&jobs, bad).expect("write");
    let out = exec(
        tidemark_at(NOW)
            .current_dir(dir.path())
            .args(["bundle", "validate", "--bundle", "good"]),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "good/resources/jobs.yml:7: `timeout_seconds` is the text \"ten\"; it must be a whole number, 0 or more",
            "good/resources/jobs.yml:13: `max_retries` is the text \"two\"; it must be a whole number",
            "good/resources/jobs.yml:14: `retry_on_timeout` is the text \"maybe\"; it must be true or false",
            "good/resources/jobs.yml:16: resources.jobs.hourly.tasks[0]: unknown key `colour`; valid keys here: task_key, depends_on, job_cluster_key, pipeline_task, max_retries, min_retry_interval_millis, retry_on_timeout, timeout_seconds",
            "good/resources/jobs.yml:21: `pipeline_task.mode: incremetal` is not one of `incremental` or `full_reload` (did you mean `incremental`?)",
            "bundle good: invalid — 5 errors, 0 warnings",
        ]
    );
}

#[test]
fn a_bad_bundle_reports_every_problem_with_file_and_line() {
    let out = exec(
        tidemark_at(NOW)
            .current_dir(fixtures())
            .args(["bundle", "validate", "--bundle", "bad"]),
    );
    assert_eq!(out.code, 78, "{}\n{}", out.stdout, out.stderr);
    let expected = [
        "bad/resources/broken.yml:6: pipeline file `../../pipelines/nope.yml` not found (looked for pipelines/nope.yml; paths are relative to this file)",
        "bad/resources/broken.yml:10: task `a` depends on `b`, which is not a task of job `bad_deps`",
        "bad/resources/broken.yml:17: tasks depend on each other in a cycle: x -> y -> x; remove one `depends_on`",
        "bad/resources/broken.yml:24: `0 61 * * * ?` is not a valid Quartz cron expression: Component error: Number out of bounds. Quartz has 6 or 7 fields: seconds minutes hours day-of-month month day-of-week [year], e.g. \"0 5 * * * ?\" (hourly at :05)",
        "bad/resources/broken.yml:31: `Europe/Lodnon` is not a time zone; use an IANA name such as UTC, Europe/London or America/New_York",
        "bad/resources/broken.yml:39: `worker_threads: 0` is out of range; use 1 to 1024",
        "bad/resources/broken.yml:40: `memory_limit: 2 gigs` is not a size; write it like 512MiB or 4GiB (units B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)",
        "bad/resources/broken.yml:43: `memory_limit: 4096` has no unit; write it like 512MiB or 4GiB",
        "bad/resources/broken.yml:55: ${var.scratch} in `spill_directory` has no value; pass --var scratch=VALUE, export BUNDLE_VAR_scratch, or give it a value in the target's `variables` (or a `default`) in bad/tidemark.yml",
        "bad/resources/broken.yml:61: `max_concurrent_runs: 2` is not supported; use 1: a job's pipelines are the single writer of their Delta targets, so a second concurrent run could only lose its commit race (a fire while the job runs is skipped and recorded)",
        "bad/resources/broken.yml:62: warning: `0 15 2 * * ?` fires between 01:00 and 03:00 local time in America/New_York, where DST changes the clock: on the spring-forward day a fire time that does not exist runs once at the end of the gap, and on the fall-back day a repeated time runs once (the first); use timezone_id UTC for strictly periodic runs, or `dst_acknowledged: true` in the schedule to accept this and silence the warning",
        "bad/resources/typo.yml:7: resources.jobs.typo.tasks[0]: unknown key `max_retrys` (did you mean `max_retries`?)",
        "bad/tidemark.yml:5: `include: extra/*.yml` matches no file (paths are relative to bad)",
        "bad/tidemark.yml:15: target `local` sets variable `laek`, which is not declared under `variables` (did you mean `lake`?)",
        "bundle bad: invalid — 13 errors, 1 warning",
    ];
    let got: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(got, expected);
    assert!(
        out.stderr.contains("fix the 13 problems listed"),
        "{}",
        out.stderr
    );

    // an unresolved variable in a pipeline file names the pipeline's own line; a --var for a
    // variable the bundle does not declare is refused
    let out = exec(
        tidemark_at(NOW)
            .current_dir(fixtures())
            .env_remove("BUNDLE_VAR_lake")
            .args(["bundle", "validate", "--bundle", "good", "--var", "laek=/x"]),
    );
    assert_eq!(out.code, 78);
    assert!(out.stdout.contains("--var laek: no variable `laek` is declared in good/tidemark.yml (did you mean `lake`?)"), "{}", out.stdout);
    let out = exec(tidemark_at(NOW).current_dir(fixtures()).args([
        "bundle", "validate", "--bundle", "good", "--target", "staging",
    ]));
    assert_eq!(out.code, 78);
    assert!(
        out.stdout.contains("--target staging: no such target"),
        "{}",
        out.stdout
    );
}

#[test]
fn variables_come_from_var_then_environment_then_target_then_default() {
    let summary = |extra: &[&str], env: Option<&str>| -> Value {
        let mut c = tidemark_at(NOW);
        c.current_dir(fixtures())
            .args(["bundle", "summary", "--bundle", "good", "--output", "json"])
            .args(extra);
        match env {
            Some(v) => c.env("BUNDLE_VAR_lake", v),
            None => c.env_remove("BUNDLE_VAR_lake"),
        };
        let out = exec(&mut c);
        assert_eq!(out.code, 0, "{}", out.stderr);
        serde_json::from_str(&out.stdout).expect("json")
    };
    let lake = |v: &Value| {
        v["variables"]
            .as_array()
            .and_then(|vs| vs.iter().find(|x| x["name"] == "lake"))
            .map(|x| (x["value"].clone(), x["source"].clone()))
            .expect("lake variable")
    };
    // `./lake` in the bundle is the bundle root's, shown resolved.
    let beside = fixtures().join("good/lake").display().to_string();
    assert_eq!(
        lake(&summary(&[], None)),
        (beside.into(), "target local".into())
    );
    assert_eq!(
        lake(&summary(&[], Some("/env"))),
        ("/env".into(), "BUNDLE_VAR_lake".into())
    );
    assert_eq!(
        lake(&summary(&["--var", "lake=/cli"], Some("/env"))),
        ("/cli".into(), "--var".into())
    );
    let prod = summary(&["--target", "prod"], None);
    assert_eq!(
        lake(&prod),
        ("s3://bucket/lake".into(), "target prod".into())
    );
    assert_eq!(
        prod["jobs"][0]["job_clusters"]["small"]["worker_threads"],
        8
    );
    let threads = |v: &Value| {
        v["variables"]
            .as_array()
            .and_then(|vs| vs.iter().find(|x| x["name"] == "threads"))
            .map(|x| x["source"].clone())
    };
    assert_eq!(threads(&summary(&[], None)), Some("default".into()));
}

#[test]
fn bundle_summary_lists_each_job_and_its_next_fires_in_its_zone_and_in_utc() {
    let out = exec(tidemark_at(NOW).current_dir(fixtures()).args([
        "bundle",
        "summary",
        "--bundle",
        "good",
        "--from",
        "2027-03-25T12:00:00Z",
        "--count",
        "3",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lake = format!(
        "  lake = {}  [target local]  lake root",
        fixtures().join("good/lake").display()
    );
    for line in [
        "bundle good — target local (good/tidemark.yml)",
        lake.as_str(),
        "job hourly — every hour, UTC",
        "  schedule: \"0 5 * * * ?\" in UTC (UNPAUSED), catch_up latest, max_concurrent_runs 1",
        "  compute small: 2 worker threads, memory limit 256MiB, spill to the OS temp directory",
        "  task check after load: pipeline p (pipelines/p.yml), incremental, on small; retries 0 (every 0 ms), timeout none",
        "    2027-03-25 13:05:00 UTC      2027-03-25T13:05:00Z",
        "job nightly_london",
        "  schedule: \"0 30 1 ? * MON-FRI\" in Europe/London (PAUSED), catch_up none, max_concurrent_runs 1",
        // Thursday and Friday in GMT, then Monday after the clocks went forward
        "    2027-03-26 01:30:00 GMT      2027-03-26T01:30:00Z",
        "    2027-03-29 01:30:00 BST      2027-03-29T00:30:00Z",
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "missing {line:?} in\n{}", out.stdout);
    }
    // tasks come in dependency order: load before check
    let load = out.stdout.find("task load").expect("load");
    let check = out.stdout.find("task check").expect("check");
    assert!(load < check);
}

// ---------------------------------------------------------------------------------------------
// job run

const TWO_TASKS: &str = r#"    j:
      timeout_seconds: 600
      job_clusters:
        - job_cluster_key: c
          new_cluster: { worker_threads: 1, memory_limit: 256MiB }
      tasks:
        - task_key: second
          depends_on: [{ task_key: first }]
          job_cluster_key: c
          pipeline_task: { pipeline: "${PIPELINE}" }
        - task_key: first
          job_cluster_key: c
          pipeline_task: { pipeline: "${PIPELINE}" }
          max_retries: 2
          min_retry_interval_millis: 10
"#;

#[tokio::test]
async fn job_run_runs_tasks_in_dependency_order_and_records_every_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(
        &bronze(d),
        &[up("a", T0 + HOUR, 1), up("b", T0 + 2 * HOUR, 2)],
    )
    .await;
    let bundle = write_bundle(d, TWO_TASKS);
    let out = exec(
        tidemark_at(NOW)
            .arg("job")
            .arg("run")
            .arg("j")
            .arg("--bundle")
            .arg(&bundle)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).expect("json report");
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["trigger"], "manual");
    let tasks: Vec<&str> = report["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["task"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(tasks, ["first", "second"]);
    let first = &report["tasks"][0]["attempts"][0]["summary"];
    let second = &report["tasks"][1]["attempts"][0]["summary"];
    assert_eq!(first["mode"], "bootstrap");
    assert_eq!(first["num_inserted"], 2);
    assert_eq!(second["mode"], "incremental");
    assert_eq!(
        second["target_version"],
        Value::Null,
        "nothing left to change"
    );

    let rows = held::bundle_ledger(tidemark_at(NOW), &bundle);
    assert_eq!(
        attempts(&rows),
        [
            tuple("first", 1, "manual", "succeeded", ""),
            tuple("second", 1, "manual", "succeeded", "")
        ]
    );
    let first_row = rows.iter().find(|r| r["task"] == "first").expect("row");
    assert_eq!(first_row["run_id"], report["run_id"]);
    assert_eq!(first_row["target"], "local");
    assert_eq!(first_row["mode"], "bootstrap");
    assert_eq!(first_row["num_inserted"], 2);
    assert_eq!(first_row["target_version"], 0);
    assert_eq!(first_row["pipeline_run_id"], first["run_id"]);
    assert_eq!(first_row["scheduled_at"], Value::Null);
    // the ledger is a Delta table any reader can open
    assert_eq!(count_rows(&d.join("lake/_tidemark/runs")).await, 2);

    // the text forms
    let out = exec(
        tidemark_at(NOW)
            .args(["runs", "--job", "j", "--wide", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("bootstrap") && out.stdout.contains("2/0/0"),
        "{}",
        out.stdout
    );
    let out = exec(
        tidemark_at(NOW)
            .args(["job", "run", "j", "--full-reload", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("job j on target local — succeeded"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("test full_reload run"),
        "{}",
        out.stdout
    );
    // Without a bundle, `--var lake=` finds the same ledger; with neither, the message says so.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let lake = format!("lake={}", d.join("lake").display());
    let mut cmd = tidemark_at(NOW);
    cmd.current_dir(elsewhere.path());
    assert_eq!(
        held::ledger(cmd, ["--var", lake.as_str()]),
        held::bundle_ledger(tidemark_at(NOW), &bundle)
    );
    let out = exec(tidemark_at(NOW).current_dir(elsewhere.path()).arg("runs"));
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--var lake=DIR"), "{}", out.stderr);
}

#[tokio::test]
async fn an_injected_retryable_failure_is_retried_and_recorded_with_trigger_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(d, TWO_TASKS);
    let out = exec(
        tidemark_at(NOW)
            .env(
                "TIDEMARK_FAILPOINTS",
                "cdc_merge.full_reload.after_read=error*1",
            )
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("task first (test): succeeded after 2 attempts"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("attempt 1 (manual): failed"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("[retryable]: injected failure"),
        "{}",
        out.stdout
    );
    assert_eq!(
        attempts(&held::bundle_ledger(tidemark_at(NOW), &bundle)),
        [
            tuple("first", 1, "manual", "failed", "retryable"),
            tuple("first", 2, "retry", "succeeded", ""),
            tuple("second", 1, "manual", "succeeded", ""),
        ]
    );
    assert_eq!(read_target(&silver(d)).await.len(), 1);
}

#[tokio::test]
async fn a_config_error_is_not_retried_and_its_dependants_are_upstream_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(d, TWO_TASKS);
    // a key column the source does not have: a config error (78), found only when run
    let pipeline = d.join("pipeline.yml");
    let text = std::fs::read_to_string(&pipeline).expect("read");
    std::fs::write(&pipeline, text.replace("keys: [id]", "keys: [payment_id]")).expect("write");
    let out = exec(
        tidemark_at(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 78, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("job `j` failed"), "{}", out.stderr);
    assert!(out.stderr.contains("task `first` failed"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("task `second` upstream_failed: task `first` did not succeed"),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout
            .contains("task first (test): failed after 1 attempt"),
        "{}",
        out.stdout
    );
    assert_eq!(
        attempts(&held::bundle_ledger(tidemark_at(NOW), &bundle)),
        [
            tuple("first", 1, "manual", "failed", "config"),
            tuple("second", 0, "manual", "upstream_failed", "")
        ]
    );
    assert_eq!(version(&silver(d)).await, None, "nothing was written");
}

#[tokio::test]
async fn a_task_over_its_timeout_is_timed_out_and_not_retried_without_retry_on_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(
        d,
        r#"    j:
      tasks:
        - task_key: slow
          pipeline_task: { pipeline: "${PIPELINE}" }
          timeout_seconds: 1
          max_retries: 3
          retry_on_timeout: false
"#,
    );
    let out = exec(
        tidemark_at(NOW)
            .env(
                "TIDEMARK_FAILPOINTS",
                "cdc_merge.full_reload.after_read=sleep(2500)",
            )
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 75, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("attempt 1 (manual): timed_out"),
        "{}",
        out.stdout
    );
    assert_eq!(
        attempts(&held::bundle_ledger(tidemark_at(NOW), &bundle)),
        [tuple("slow", 1, "manual", "timed_out", "retryable")]
    );
}

#[tokio::test]
async fn a_memory_limit_makes_a_full_reload_spill_instead_of_failing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    let out = exec(
        tidemark_at(NOW)
            .arg("generate")
            .arg("--out")
            .arg(lake.join("bronze/payments_raw"))
            .args(["--payments", "60000", "--days", "30"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        format!("bundle: {{ name: spill }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ default: \"{}\" }}\ntargets:\n  local: {{ default: true }}\n", lake.display()),
    )
    .expect("write");
    let job = |name: &str, memory: &str| {
        format!(
            "    {name}:\n      job_clusters:\n        - job_cluster_key: c\n          new_cluster: {{ worker_threads: 1, memory_limit: {memory}, spill_directory: \"{}\" }}\n      tasks:\n        - task_key: t\n          job_cluster_key: c\n          pipeline_task: {{ pipeline: \"{}\", mode: full_reload }}\n",
            d.join("spill").display(),
            repo().join("pipelines/payments.yml").display()
        )
    };
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n{}{}",
            job("small", "16MiB"),
            job("large", "1GiB")
        ),
    )
    .expect("write");
    let run = |name: &str| -> Value {
        let out = exec(
            tidemark_at(NOW)
                .args(["job", "run", name, "--output", "json", "--bundle"])
                .arg(&bundle),
        );
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        let v: Value = serde_json::from_str(&out.stdout).expect("json");
        v["tasks"][0]["attempts"][0].clone()
    };
    let small = run("small");
    let large = run("large");
    assert!(
        small["spill_files"].as_u64().unwrap_or(0) > 0,
        "16MiB did not spill: {small}"
    );
    assert_eq!(large["spill_files"], 0, "{large}");
    assert!(d.join("spill").is_dir());
    for field in [
        "num_inserted",
        "num_deleted",
        "num_superseded",
        "num_duplicates",
        "num_source_rows_read",
    ] {
        assert_eq!(small["summary"][field], large["summary"][field], "{field}");
    }
}

// ---------------------------------------------------------------------------------------------
// single flight

const ONE_TASK: &str = r#"    j:
      tasks:
        - task_key: t
          pipeline_task: { pipeline: "${PIPELINE}" }
"#;

#[tokio::test]
async fn a_second_run_of_a_running_job_exits_75_naming_the_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(d, ONE_TASK);
    // the first run holds the lease for 4 s before it runs its task
    let mut first = tidemark_process(NOW)
        .env("TIDEMARK_FAILPOINTS", "job.after_lease=sleep(4000)")
        .args(["job", "run", "j", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    held::wait_for("the first run's lease", || {
        held::newest_lease(d, "j").is_some_and(|h| h["released"] == false)
    });
    let second = exec(
        tidemark_at(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(second.code, 75, "{}\n{}", second.stdout, second.stderr);
    let host = held::newest_lease(d, "j").expect("lease")["host"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for fragment in [
        "job `j` is already running".to_string(),
        format!("on host {host} (pid {})", first.id()),
        format!("since {}", rfc3339(NOW).replace("+00:00", "Z")),
        "exit code 75".to_string(),
    ] {
        assert!(
            second.stderr.contains(&fragment),
            "stderr lacks {fragment:?}: {}",
            second.stderr
        );
    }
    let status = first.wait().expect("wait");
    assert!(status.success(), "the first run failed");
    assert_eq!(read_target(&silver(d)).await.len(), 1);
    // exactly one ran; the other is recorded as skipped
    assert_eq!(
        attempts(&held::bundle_ledger(tidemark_at(NOW), &bundle)),
        [
            tuple("t", 0, "manual", "skipped", "retryable"),
            tuple("t", 1, "manual", "succeeded", "")
        ]
    );
    assert_eq!(held::newest_lease(d, "j").expect("lease")["released"], true);
}

#[tokio::test]
async fn a_killed_run_s_lease_is_taken_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(d, ONE_TASK);
    let mut victim = tidemark_process(NOW)
        .env("TIDEMARK_FAILPOINTS", "job.after_lease=sleep(120000)")
        .args(["job", "run", "j", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    held::wait_for("the victim's lease", || {
        held::newest_lease(d, "j").is_some()
    });
    victim.kill().expect("kill -9");
    victim.wait().expect("reap");
    let lease = held::newest_lease(d, "j").expect("lease");
    assert_eq!(
        lease["released"], false,
        "a killed run cannot release its lease"
    );
    // same host, dead pid: taken over at once, without waiting for the expiry
    let out = exec(
        tidemark_at(NOW)
            .env("RUST_LOG", "tidemark=warn")
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("taking over a stale lease (its process no longer exists)"),
        "{}",
        out.stderr
    );
    assert_eq!(read_target(&silver(d)).await.len(), 1);
}

#[tokio::test]
async fn foreign_leases_are_taken_over_only_once_expired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(d, ONE_TASK);
    let plant = |generation: u64, expires: i64| {
        let leases = d.join("lake/_tidemark/leases/j");
        std::fs::create_dir_all(&leases).expect("mkdir");
        let holder = serde_json::json!({
            "job": "j", "run_id": format!("foreign-{generation}"), "host": "elsewhere.example", "pid": 4242,
            "started_at": rfc3339(NOW - HOUR), "expires_at": rfc3339(expires), "released": false,
        });
        std::fs::write(
            leases.join(format!("{generation:020}.json")),
            holder.to_string(),
        )
        .expect("write");
    };
    // a heartbeat that is still fresh: held, whatever the host
    plant(1, NOW + MIN);
    let out = exec(
        tidemark_at(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 75, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("run foreign-1 on host elsewhere.example (pid 4242)"),
        "{}",
        out.stderr
    );
    // its holder stopped renewing it: taken over
    plant(2, NOW - MIN);
    let out = exec(
        tidemark_at(NOW)
            .env("RUST_LOG", "tidemark=warn")
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("taking over a stale lease (expired"),
        "{}",
        out.stderr
    );
    let newest = held::newest_lease(d, "j").expect("lease");
    assert_eq!(newest["released"], true);
    assert_ne!(newest["run_id"], "foreign-2");
}

// ---------------------------------------------------------------------------------------------
// scheduler

/// What the fake executor was asked to do: (job, fire time, trigger, "run" | "skip").
type Calls = Arc<Mutex<Vec<(String, String, Trigger, &'static str)>>>;

/// An executor whose runs take `duration` of the test clock and leave no trace but `calls`
/// (which also plays the ledger for `last_handled`).
struct FakeExecutor {
    clock: TokioClock,
    duration: chrono::TimeDelta,
    calls: Calls,
}

impl Executor for FakeExecutor {
    fn last_handled(&self) -> BoxFuture<'_, Result<BTreeMap<String, DateTime<Utc>>, JobsError>> {
        let mut last: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
        for (job, t, _, _) in self.calls.lock().expect("lock").iter() {
            let t = at(t);
            let e = last.entry(job.clone()).or_insert(t);
            *e = (*e).max(t);
        }
        Box::pin(async move { Ok(last) })
    }

    fn run(&self, fire: Fire) -> BoxFuture<'static, ()> {
        self.calls.lock().expect("lock").push((
            fire.job,
            fire.scheduled_at.to_rfc3339(),
            fire.trigger,
            "run",
        ));
        let clock = self.clock;
        let end = clock.now() + self.duration;
        Box::pin(async move { clock.sleep_until(end).await })
    }

    fn skip(&self, fire: Fire, _reason: String) -> BoxFuture<'static, ()> {
        self.calls.lock().expect("lock").push((
            fire.job,
            fire.scheduled_at.to_rfc3339(),
            fire.trigger,
            "skip",
        ));
        Box::pin(async {})
    }

    fn cancel_all(&self, _reason: &str) {}
}

fn job(name: &str, expr: &str, tz: &str, catch_up: CatchUp) -> ScheduledJob {
    ScheduledJob {
        name: name.to_string(),
        schedule: QuartzSchedule::parse(expr, tz).expect("schedule"),
        catch_up,
    }
}

/// Runs a scheduler on a paused tokio clock from `start` until `stop`.
async fn drive(
    jobs: Vec<ScheduledJob>,
    calls: &Calls,
    start: &str,
    stop: &str,
    duration: chrono::TimeDelta,
) -> tidemark::jobs::SchedulerReport {
    let clock = TokioClock::starting_at(at(start));
    let executor = Arc::new(FakeExecutor {
        clock,
        duration,
        calls: calls.clone(),
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = at(stop);
    let stopper = tokio::spawn(async move {
        clock.sleep_until(stop).await;
        let _ = tx.send(true);
    });
    let report = Scheduler::new(
        jobs,
        Arc::new(clock),
        executor,
        Duration::from_secs(4 * 3600),
    )
    .run(rx)
    .await
    .expect("scheduler");
    stopper.await.expect("stopper");
    report
}

fn taken(calls: &Calls) -> Vec<(String, String, Trigger, &'static str)> {
    std::mem::take(&mut *calls.lock().expect("lock"))
}

fn call(
    job: &str,
    t: &str,
    trigger: Trigger,
    kind: &'static str,
) -> (String, String, Trigger, &'static str) {
    (job.to_string(), at(t).to_rfc3339(), trigger, kind)
}

#[tokio::test(start_paused = true)]
async fn the_scheduler_fires_through_dst_changes_and_catches_up_after_downtime() {
    let calls: Calls = Arc::default();
    let quick = chrono::TimeDelta::minutes(10);

    // London, spring forward on 2027-03-28: 01:30 does not exist and runs at 02:00 BST
    let london = || {
        vec![job(
            "london",
            "0 30 1 * * ?",
            "Europe/London",
            CatchUp::Latest,
        )]
    };
    let report = drive(
        london(),
        &calls,
        "2027-03-27T12:00:00Z",
        "2027-03-29T12:00:00Z",
        quick,
    )
    .await;
    assert_eq!(
        taken(&calls),
        [
            call("london", "2027-03-28T01:00:00Z", Trigger::Schedule, "run"),
            call("london", "2027-03-29T00:30:00Z", Trigger::Schedule, "run"),
        ]
    );
    assert_eq!((report.fires, report.catch_ups, report.skipped), (2, 0, 0));

    // New York, fall back on 2027-11-07: 01:30 happens twice and fires once (05:30Z, EDT)
    let ny = || {
        vec![
            job(
                "ny_latest",
                "0 30 1 * * ?",
                "America/New_York",
                CatchUp::Latest,
            ),
            job("ny_none", "0 30 1 * * ?", "America/New_York", CatchUp::None),
        ]
    };
    drive(
        ny(),
        &calls,
        "2027-11-06T00:00:00Z",
        "2027-11-08T00:00:00Z",
        quick,
    )
    .await;
    let before_downtime = calls.lock().expect("lock").clone();
    assert_eq!(
        before_downtime,
        [
            call(
                "ny_latest",
                "2027-11-06T05:30:00Z",
                Trigger::Schedule,
                "run"
            ),
            call("ny_none", "2027-11-06T05:30:00Z", Trigger::Schedule, "run"),
            call(
                "ny_latest",
                "2027-11-07T05:30:00Z",
                Trigger::Schedule,
                "run"
            ),
            call("ny_none", "2027-11-07T05:30:00Z", Trigger::Schedule, "run"),
        ]
    );

    // down from 2027-11-08 to 2027-11-10 12:00: three fires missed per job. `latest` runs the
    // last one once at start-up; `none` waits for the next fire.
    let report = drive(
        ny(),
        &calls,
        "2027-11-10T12:00:00Z",
        "2027-11-11T12:00:00Z",
        quick,
    )
    .await;
    assert_eq!(
        taken(&calls)[before_downtime.len()..],
        [
            call("ny_latest", "2027-11-10T06:30:00Z", Trigger::CatchUp, "run"),
            call(
                "ny_latest",
                "2027-11-11T06:30:00Z",
                Trigger::Schedule,
                "run"
            ),
            call("ny_none", "2027-11-11T06:30:00Z", Trigger::Schedule, "run"),
        ]
    );
    assert_eq!(
        (report.fires, report.catch_ups, report.missed),
        (2, 1, 2 + 3)
    );
}

/// Collects what the code under test logs on this thread.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_fire_while_the_previous_run_still_runs_is_skipped_and_logged() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let calls: Calls = Arc::default();
    // hourly, but each run takes 90 minutes
    let jobs = vec![job("slow", "0 0 * * * ?", "UTC", CatchUp::Latest)];
    let report = drive(
        jobs,
        &calls,
        "2026-12-31T23:30:00Z",
        "2027-01-01T04:30:00Z",
        chrono::TimeDelta::minutes(90),
    )
    .await;
    assert_eq!(
        taken(&calls),
        [
            call("slow", "2027-01-01T00:00:00Z", Trigger::Schedule, "run"),
            call("slow", "2027-01-01T01:00:00Z", Trigger::Schedule, "skip"),
            call("slow", "2027-01-01T02:00:00Z", Trigger::Schedule, "run"),
            call("slow", "2027-01-01T03:00:00Z", Trigger::Schedule, "skip"),
            call("slow", "2027-01-01T04:00:00Z", Trigger::Schedule, "run"),
        ]
    );
    assert_eq!(
        (report.fires, report.skipped, report.cancelled_at_shutdown),
        (3, 2, false)
    );
    let text = String::from_utf8(logs.0.lock().expect("lock").clone()).expect("utf8");
    let skips: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("fire skipped: the previous run of the job is still running"))
        .collect();
    assert_eq!(skips.len(), 2, "{text}");
    assert!(
        skips[0].contains("scheduled_at=2027-01-01T01:00:00Z")
            && skips[0].contains("previous_fire=2027-01-01T00:00:00Z"),
        "{}",
        skips[0]
    );
    // on shutdown the running 04:00 run was let finish
    assert!(
        text.contains("stopping: no new fires; waiting for running jobs"),
        "{text}"
    );
}

#[tokio::test]
async fn the_scheduler_process_catches_up_then_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let bundle = write_bundle(
        d,
        r#"    j:
      schedule: { quartz_cron_expression: "0 5 * * * ?", timezone_id: UTC }
      catch_up: latest
      tasks:
        - task_key: t
          pipeline_task: { pipeline: "${PIPELINE}" }
"#,
    );
    // the ledger remembers the 09:05 fire; NOW is 12:00, so 10:05 and 11:05 were missed while
    // the scheduler was down: 11:05 runs once, 10:05 counts as missed
    let ledger_uri = d.join("lake").display().to_string();
    let ledger_api = tidemark::jobs::Ledger::for_lake(&ledger_uri);
    let last = at(&rfc3339(NOW - 3 * HOUR)) + chrono::TimeDelta::minutes(5);
    ledger_api
        .append(&[tidemark::jobs::LedgerRow {
            run_id: "earlier".into(),
            job: "j".into(),
            target: "local".into(),
            task: "t".into(),
            attempt: 1,
            trigger: "schedule".into(),
            scheduled_at: Some(last),
            started_at: last,
            ended_at: last,
            status: "succeeded".into(),
            error_class: None,
            error_message: None,
            host: "h".into(),
            pipeline: Some("test".into()),
            pipeline_run_id: None,
            mode: None,
            source_version: None,
            target_version: None,
            watermark_before: None,
            watermark_after: None,
            num_source_rows_read: None,
            num_inserted: None,
            num_updated: None,
            num_deleted: None,
            num_unchanged: None,
            num_quarantined: None,
            num_deferred: None,
            num_late_rows: None,
            num_conflicts: None,
            num_superseded: None,
            num_duplicates: None,
            num_spill_files: None,
            duration_ms: 0,
            expectations: None,
            kind: None,
            counters: None,
        }])
        .await
        .expect("seed the ledger");
    let child = tidemark_process(NOW)
        .env_remove("RUST_LOG")
        .args(["scheduler", "--grace-period", "1m", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn scheduler");
    let pid = child.id();
    let mut caught_up = Vec::new();
    for _ in 0..3600 {
        caught_up = ledger_api.recent(Some("j"), 10).await.expect("ledger");
        if caught_up.iter().any(|r| r.trigger == "catch_up") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = caught_up
        .iter()
        .find(|r| r.trigger == "catch_up")
        .expect("a catch-up run was recorded");
    assert_eq!(
        row.scheduled_at,
        Some(at(&rfc3339(NOW - HOUR)) + chrono::TimeDelta::minutes(5))
    );
    assert_eq!(row.status, "succeeded");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "scheduler stopped: 0 fires, 1 catch-up runs, 0 skipped (still running), 1 missed\n"
    );
    // without -v it says what it does: started, caught up, the next fire
    let stderr = String::from_utf8_lossy(&out.stderr);
    for said in ["scheduler started", "catching up", "scheduled job=j next="] {
        assert!(stderr.contains(said), "no `{said}` in {stderr}");
    }
    assert_eq!(read_target(&silver(d)).await.len(), 1);
}
