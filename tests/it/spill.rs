//! Spill files under a small memory limit: every run and job run removes its own spill
//! directory however it ends (error, retries, panic), a directory left by a killed process is
//! removed by the next start, and the documented smallest memory limit really carries a full
//! reload with two threads.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// 2026-03-01T00:00:00Z
const NOW: i64 = 1_772_323_200_000_000;

/// The binary as the suite runs it: errors-only logs (the tests read stderr for one line).
fn quiet() -> Command {
    let mut c = tidemark_process(NOW);
    c.env("RUST_LOG", "error");
    c
}

fn payments_pipeline() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pipelines/payments.yml")
}

/// Generates `payments` payments over 30 days into `lake/bronze/payments_raw`.
fn generate(lake: &Path, payments: u32) {
    let out = output(
        quiet()
            .arg("generate")
            .arg("--out")
            .arg(lake.join("bronze/payments_raw"))
            .args([
                "--payments",
                &payments.to_string(),
                "--days",
                "30",
                "--seed",
                "7",
            ])
            .args(["--start", "2026-01-15"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
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

/// A full reload that spills under 16 MiB and then fails — as a plain run, after a panic, and as
/// a job whose retries all spill and fail — leaves the spill directory empty; a directory a
/// killed process left there is removed by the next start.
#[test]
fn failed_runs_that_spilled_leave_no_spill_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    let spill = d.join("spill");
    generate(&lake, 60_000);
    let var = format!("lake={}", lake.display());
    // With two threads a failure in one partition's sort used to leave the others' files.
    for (failpoint, threads) in [
        ("cdc_merge.full_reload.after_write=error", "1"),
        ("cdc_merge.full_reload.after_write=panic", "1"),
        ("spill.write=enospc", "2"),
    ] {
        let out = output(
            quiet()
                .env("TIDEMARK_FAILPOINTS", failpoint)
                .arg("run")
                .arg(payments_pipeline())
                .args(["--var", &var, "--full-reload", "--threads", threads])
                .args(["--memory-limit", "16MiB", "--spill-dir"])
                .arg(&spill),
        );
        assert_ne!(out.code, 0, "{failpoint}: {}", out.stderr);
        assert!(
            entries(&spill).is_empty(),
            "{failpoint}: spill files left: {:?}",
            entries(&spill)
        );
    }

    // A job: three attempts, each spills and fails.
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        format!("bundle: {{ name: spill }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ default: \"{}\" }}\ntargets:\n  local: {{ default: true }}\n", lake.display()),
    )
    .expect("write");
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n    reload:\n      job_clusters:\n        - job_cluster_key: c\n          new_cluster: {{ worker_threads: 1, memory_limit: 16MiB, spill_directory: \"{}\" }}\n      tasks:\n        - task_key: t\n          job_cluster_key: c\n          max_retries: 2\n          pipeline_task: {{ pipeline: \"{}\", mode: full_reload }}\n",
            spill.display(),
            payments_pipeline().display()
        ),
    )
    .expect("write");
    let out = output(
        quiet()
            .env(
                "TIDEMARK_FAILPOINTS",
                "cdc_merge.full_reload.after_write=error",
            )
            .args(["job", "run", "reload", "--output", "json", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).expect("json");
    let attempts = report["tasks"][0]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(attempts.len(), 3, "{report}");
    for a in &attempts {
        assert!(
            a["spill_files"].as_u64().unwrap_or(0) > 0,
            "the attempt did not spill: {a}"
        );
    }
    assert!(
        entries(&spill).is_empty(),
        "spill files left after the job: {:?}",
        entries(&spill)
    );

    // Left by a process that no longer exists (pid 2147483632 cannot be running).
    std::fs::create_dir_all(&spill).expect("mkdir");
    let host = String::from_utf8(
        Command::new("hostname")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .unwrap_or_default()
    .trim()
    .to_string();
    let stale = spill.join(format!("tidemark-spill-{host}-2147483632-0123abcd"));
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("leftover.arrow"), vec![0u8; 4096]).expect("write");

    let out = output(
        quiet()
            .env(
                "TIDEMARK_FAILPOINTS",
                "cdc_merge.full_reload.after_read=error",
            )
            .arg("run")
            .arg(payments_pipeline())
            .args([
                "--var",
                &var,
                "--full-reload",
                "--memory-limit",
                "16MiB",
                "--spill-dir",
            ])
            .arg(&spill),
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert!(
        entries(&spill).is_empty(),
        "the dead process's spill directory is still there: {:?}",
        entries(&spill)
    );
}

/// The smallest memory limit (16 MiB) carries a full reload of 100k generated payments (272k
/// rows) on two threads, spilling; so does 64 MiB (which no longer needs to spill since a key's
/// older versions are dropped before the sort). Both ran out of memory when each thread sorted
/// its own partition in its share of the pool.
#[test]
fn the_smallest_memory_limit_carries_a_full_reload_on_two_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let lake = d.join("lake");
    generate(&lake, 100_000);
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        format!("bundle: {{ name: floor }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ default: \"{}\" }}\ntargets:\n  local: {{ default: true }}\n", lake.display()),
    )
    .expect("write");
    let job = |name: &str, memory: &str| {
        format!(
            "    {name}:\n      job_clusters:\n        - job_cluster_key: c\n          new_cluster: {{ worker_threads: 2, memory_limit: {memory}, spill_directory: \"{}\" }}\n      tasks:\n        - task_key: t\n          job_cluster_key: c\n          pipeline_task: {{ pipeline: \"{}\", mode: full_reload }}\n",
            d.join("spill").display(),
            payments_pipeline().display()
        )
    };
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n{}{}",
            job("floor", "16MiB"),
            job("small", "64MiB")
        ),
    )
    .expect("write");
    for name in ["floor", "small"] {
        let out = output(
            quiet()
                .args(["job", "run", name, "--output", "json", "--bundle"])
                .arg(&bundle),
        );
        assert_eq!(out.code, 0, "{name}: {}\n{}", out.stdout, out.stderr);
        let report: Value = serde_json::from_str(&out.stdout).expect("json");
        let attempt = &report["tasks"][0]["attempts"][0];
        assert!(
            name != "floor" || attempt["spill_files"].as_u64().unwrap_or(0) > 0,
            "{name} did not spill: {attempt}"
        );
        assert_eq!(
            attempt["summary"]["num_source_rows_read"], 272_136,
            "{attempt}"
        );
    }
}

/// `tidemark maintain --spill-dir DIR` sweeps the spill directories that killed processes of
/// this host left there (a dry run only lists them); a running process's directory is kept.
#[test]
fn maintain_sweeps_spill_directories_of_dead_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    generate(&lake, 200);
    let spill = dir.path().join("spill");
    let host = String::from_utf8(
        Command::new("hostname")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .unwrap_or_default()
    .trim()
    .to_string();
    let dead = spill.join(format!("tidemark-spill-{host}-2147483632-0123abcd"));
    let alive = spill.join(format!(
        "tidemark-spill-{host}-{}-0123abcd",
        std::process::id()
    ));
    for d in [&dead, &alive] {
        std::fs::create_dir_all(d).expect("mkdir");
        std::fs::write(d.join("leftover.arrow"), vec![0u8; 4096]).expect("write");
    }
    let maintain = |extra: &[&str]| {
        output(
            quiet()
                .arg("maintain")
                .arg(lake.join("bronze/payments_raw"))
                .arg("--spill-dir")
                .arg(&spill)
                .args(extra),
        )
    };
    let dry = maintain(&["--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout
            .contains("1 stale spill directory of processes that no longer exist would be removed"),
        "{}",
        dry.stdout
    );
    assert!(dead.exists(), "a dry run removed a spill directory");
    let real = maintain(&["--output", "json"]);
    assert_eq!(real.code, 0, "{}", real.stderr);
    let report: Value = serde_json::from_str(real.stdout.trim()).expect("json");
    assert_eq!(
        report["stale_spill_dirs"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert!(
        !dead.exists(),
        "the dead process's spill directory is still there"
    );
    assert!(
        alive.exists(),
        "a running process's spill directory was removed"
    );
}

/// `-vv` shows the reload's scan, thinning and sort as they ran, with DataFusion's metrics
/// (what `EXPLAIN ANALYZE` prints): how many rows reached the sort and what it spilled.
#[test]
fn a_verbose_full_reload_shows_what_its_sort_did_and_spilled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    generate(&lake, 100_000);
    let out = output(
        quiet()
            .env_remove("RUST_LOG")
            .arg("run")
            .arg(payments_pipeline())
            .arg("--var")
            .arg(format!("lake={}", lake.display()))
            .args(["--full-reload", "--memory-limit", "16MiB", "--spill-dir"])
            .arg(dir.path().join("spill"))
            .arg("-vv"),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shown = out
        .stderr
        .split("the reload's sort, as executed:")
        .nth(1)
        .unwrap_or_else(|| panic!("no executed plan in: {}", out.stderr));
    for needle in ["SortExec", "output_rows=", "spill_count=", "spilled_rows="] {
        assert!(shown.contains(needle), "{needle:?} not in: {shown}");
    }
    assert!(
        !shown.contains("spill_count=0,"),
        "16 MiB should make the sort spill: {shown}"
    );
}
