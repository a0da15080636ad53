//! SIGINT and SIGTERM to `job run` and `tidemark run`, with real processes held at a `pause`
//! failpoint: the attempt is stopped (nothing committed: a Delta commit lands whole or not at
//! all), `job run` writes a ledger row with status `cancelled` and releases the job's lease, and
//! both exit 130 (SIGINT) / 143 (SIGTERM) leaving no spill files.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::Value;

const NOW: i64 = T0 + 12 * HOUR;

fn send(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: sends a signal to the child this test spawned and has not reaped yet.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill failed");
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn job_run_stopped_by(signal: libc::c_int, code: i32) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(
        &bronze(d),
        &[Change::upsert("a", T0 + HOUR, T0 + HOUR + MIN, 1)],
    )
    .await;
    // Job `j` runs the test pipeline on a job cluster with a spill directory.
    let bundle = write_bundle(
        d,
        &format!(
            "    j:\n      job_clusters:\n        - job_cluster_key: c\n          new_cluster: {{ worker_threads: 2, memory_limit: 64MiB, spill_directory: \"{}\" }}\n      tasks:\n        - task_key: t\n          job_cluster_key: c\n          max_retries: 2\n          pipeline_task: {{ pipeline: \"${{PIPELINE}}\" }}\n",
            d.join("spill").display()
        ),
    );
    let first = output(
        tidemark_process(NOW)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(first.code, 0, "{}", first.stderr);
    let before = version(&silver(d)).await;
    append(
        &bronze(d),
        &[Change::upsert("b", NOW - MIN, NOW - MIN / 2, 2)],
    )
    .await;

    let pause = Pause::new();
    let child = tidemark_process(NOW)
        .env(
            "TIDEMARK_FAILPOINTS",
            pause.at("cdc_merge.incremental.before_commit"),
        )
        .args(["job", "run", "j", "--output", "json", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    pause.wait_reached();
    send(&child, signal);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains("cancelled"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("job report");
    assert_eq!(report["status"], "cancelled", "{report}");
    assert_eq!(report["tasks"][0]["status"], "cancelled", "{report}");
    assert_eq!(
        report["tasks"][0]["attempts"].as_array().map(Vec::len),
        Some(1),
        "a cancelled attempt is not retried: {report}"
    );

    // The attempt is in the ledger, the lease was given back, nothing was committed.
    let rows = held::bundle_ledger(tidemark_at(NOW), &bundle);
    assert_eq!(rows[0]["status"], "cancelled", "{rows:?}");
    assert_eq!(rows[0]["attempt"], 1, "{rows:?}");
    assert_eq!(held::newest_lease(d, "j").expect("lease")["released"], true);
    assert_eq!(version(&silver(d)).await, before, "nothing was committed");
    assert!(
        entries(&d.join("spill")).is_empty(),
        "spill files left: {:?}",
        entries(&d.join("spill"))
    );

    // The next run starts at once (no stale lease to take over) and merges the row.
    let next = output(
        tidemark_process(NOW)
            .env("RUST_LOG", "tidemark=info")
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(next.code, 0, "{}", next.stderr);
    assert!(!next.stderr.contains("stale lease"), "{}", next.stderr);
    assert_eq!(read_target(&silver(d)).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_cancels_a_job_run_records_it_and_releases_the_lease() {
    job_run_stopped_by(libc::SIGINT, 130).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_a_job_run_records_it_and_releases_the_lease() {
    job_run_stopped_by(libc::SIGTERM, 143).await;
}

/// A plain `tidemark run` stopped by a signal commits nothing and leaves no spill directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_exits_by_its_signal_and_leaves_no_spill_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(
        &bronze(d),
        &[Change::upsert("a", T0 + HOUR, T0 + HOUR + MIN, 1)],
    )
    .await;
    let p = write_pipeline(d, "15m", "soft", "");
    let spill = d.join("spill");
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let pause = Pause::new();
        let child = tidemark_process(NOW)
            .env(
                "TIDEMARK_FAILPOINTS",
                pause.at("cdc_merge.full_reload.after_read"),
            )
            .arg("run")
            .arg(&p)
            .args(["--full-reload", "--memory-limit", "64MiB", "--spill-dir"])
            .arg(&spill)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        pause.wait_reached();
        assert!(
            !entries(&spill).is_empty(),
            "the run has its spill directory"
        );
        send(&child, signal);
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains("the run was stopped"), "{stderr}");
        assert!(entries(&spill).is_empty(), "left: {:?}", entries(&spill));
        assert_eq!(version(&silver(d)).await, None, "nothing was committed");
    }
}

/// Ctrl-C while the first `tidemark demo` backfills bronze: exit 130 with one JSON error, no
/// half-written bronze left behind (the backfill is built under a hidden name and moved into
/// place whole), and the next demo starts over and succeeds.
#[test]
fn a_demo_stopped_during_its_backfill_leaves_nothing_half_written() {
    let dir = tempfile::tempdir().expect("tmp");
    let lake = dir.path().join("lake");
    let building = lake.join("bronze/.payments_raw.backfill/_delta_log");
    let child = tidemark_process(NOW)
        .args(["demo", "--output", "json", "--lake"])
        .arg(&lake)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    let started = std::time::Instant::now();
    while !building.exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "the backfill never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    send(&child, libc::SIGINT);
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["error"]["exit_code"], 130, "{v}");
    assert!(
        !lake.join("bronze/payments_raw").exists(),
        "no half-written bronze"
    );
    let again = output(
        tidemark_process(NOW)
            .args(["demo", "--lake"])
            .arg(&lake)
            .current_dir(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(again.stdout.contains("backfill: full"), "{}", again.stdout);
}

/// SIGINT or SIGTERM to `reconcile`, `lateness` and `generate` with `--output json`: exit 130 /
/// 143 with one JSON object saying what happened; an interrupted `generate` is replaced by the
/// same command run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_stopped_by_a_signal_print_their_json_and_generate_starts_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(
        &bronze(d),
        &[Change::upsert("a", T0 + HOUR, T0 + HOUR + MIN, 1)],
    )
    .await;
    let p = write_pipeline(d, "15m", "soft", "");
    let ran = output(tidemark_process(NOW).arg("run").arg(&p));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let generated = d.join("generated");
    let generate = |c: &mut Command| {
        c.arg("generate").arg("--out").arg(&generated).args([
            "--payments",
            "200",
            "--days",
            "3",
            "--seed",
            "5",
        ]);
    };
    type Args<'a> = Box<dyn Fn(&mut Command) + 'a>;
    let cases: Vec<(&str, Args)> = vec![
        (
            "reconcile.start",
            Box::new(|c: &mut Command| {
                c.arg("reconcile").arg(&p);
            }),
        ),
        (
            "lateness.start",
            Box::new(|c: &mut Command| {
                c.arg("lateness").arg(&p);
            }),
        ),
        ("generate.between_commits", Box::new(generate)),
    ];
    for (i, (point, args)) in cases.iter().enumerate() {
        let (signal, code) = if i % 2 == 0 {
            (libc::SIGINT, 130)
        } else {
            (libc::SIGTERM, 143)
        };
        let pause = Pause::new();
        let mut cmd = tidemark_process(NOW);
        cmd.env("TIDEMARK_FAILPOINTS", pause.at(point));
        args(&mut cmd);
        let child = cmd
            .args(["--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        pause.wait_reached();
        send(&child, signal);
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{point}: {stderr}");
        let json: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{point}: one JSON object ({e}): {stderr}"));
        assert_eq!(json["error"]["exit_code"], code, "{point}: {json}");
    }
    // The interrupted generation left a table; the same command replaces it and finishes.
    assert!(version(&generated).await.is_some(), "a partial table");
    let mut again = tidemark_process(NOW);
    generate(&mut again);
    let out = output(&mut again);
    assert_eq!(out.code, 0, "{}", out.stderr);
}
