//! Hardening, through the real binary: messages that name the next step, and
//! `tidemark demo` from any directory. (Limits, logs, JSON failures, maintain and counters are
//! in `tests/it/ux.rs`.)

use crate::common;

use common::*;

const NOW: i64 = T0 + 12 * HOUR;

fn up(id: &str, seq: i64, val: i64) -> Change {
    Change::upsert(id, seq, seq + MIN, val)
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// item 12: messages

#[tokio::test]
async fn messages_name_the_thing_to_do_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // a missing table on the command line: no pipeline key, no kernel ERROR line above
    std::fs::create_dir_all(d.join("empty/_delta_log")).expect("mkdir");
    for (args, path) in [
        (vec!["history"], "nowhere"),
        (vec!["restore", "--version", "0"], "nowhere"),
        (vec!["maintain"], "nowhere"),
        (vec!["history"], "empty"),
    ] {
        let out = exec(
            tidemark_default_logs(NOW)
                .current_dir(d)
                .args(&args)
                .arg(path),
        );
        assert_eq!(out.code, 66, "{args:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains(".uri`"),
            "{args:?} names a pipeline key: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("ERROR"), "{args:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("table table"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("check the path"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // gs:// is a scheme tidemark does not support, not a missing table
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .args(["history", "gs://bucket/t"]),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("scheme is not supported"),
        "{}",
        out.stderr
    );

    // reconcile before the first run says to run the pipeline, with the user's --var
    let lake = d.join("lake");
    append(&bronze(d), &[up("a", T0 + HOUR, 1)]).await;
    let p = write_pipeline(d, "15m", "soft", "");
    let text = std::fs::read_to_string(&p).expect("read");
    let with_var = d.join("with_var.yml");
    std::fs::write(
        &with_var,
        text.replace(&lake.display().to_string(), "${var.lake}"),
    )
    .expect("write");
    let var = format!("lake={}", lake.display());
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .arg("reconcile")
            .arg(&with_var)
            .args(["--var", &var]),
    );
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert!(
        out.stderr.contains("Run the pipeline first"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("--var {var}")),
        "the --var is dropped: {}",
        out.stderr
    );

    // bundle validate: every error of a schedule, the bundle's own name
    let b = d.join("b");
    std::fs::create_dir_all(b.join("resources")).expect("mkdir");
    std::fs::write(
        b.join("tidemark.yml"),
        "bundle: { name: payments_bundle }\ninclude: [resources/*.yml]\nvariables:\n  lake: { default: ./lake }\ntargets:\n  local: { default: true }\n",
    )
    .expect("write");
    std::fs::write(
        b.join("resources/j.yml"),
        format!(
            "resources:\n  jobs:\n    j:\n      schedule: {{ quartz_cron_expression: \"0 99 * * * ?\", timezone_id: \"Mars/Base\" }}\n      tasks:\n        - task_key: t\n          pipeline_task: {{ pipeline: \"{}\" }}\n",
            p.display()
        ),
    )
    .expect("write");
    let out = exec(
        tidemark_default_logs(NOW)
            .current_dir(d)
            .args(["bundle", "validate", "--bundle", "b"]),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stdout.contains("Mars/Base"), "{}", out.stdout);
    assert!(
        out.stdout.contains("0 99 * * * ?"),
        "the cron error is hidden: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains("bundle payments_bundle (b): invalid"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("tidemark bundle validate --bundle b"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// item 14: getting started

#[test]
fn demo_works_from_any_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("time")
        .timestamp_micros();
    // No ./bundle here: the demo finds the checkout's bundle (whose own lake, beside it, is left
    // alone: --lake puts this one here, relative to the working directory).
    let out = exec(
        tidemark_default_logs(now)
            .current_dir(dir.path())
            .args(["demo", "--lake", "./mine"]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(dir.path().join("mine/silver/payments/_delta_log").exists());
    let demo_out = out.stdout.clone();
    // the command it suggests works from here
    let runs = suggested(&out.stdout, "tidemark runs");
    let args: Vec<&str> = runs.split_whitespace().skip(1).collect();
    let out = exec(
        tidemark_default_logs(now)
            .current_dir(dir.path())
            .args(&args),
    );
    assert_eq!(out.code, 0, "`{runs}`: {}", out.stderr);
    assert!(out.stdout.contains("payments_hourly"), "{}", out.stdout);
    // and so does the lateness profile it suggests, on the lake it wrote
    let lateness = suggested(&demo_out, "tidemark lateness");
    let args: Vec<&str> = lateness.split_whitespace().skip(1).collect();
    let out = exec(
        tidemark_default_logs(now)
            .current_dir(dir.path())
            .args(&args),
    );
    assert_eq!(out.code, 0, "`{lateness}`: {}", out.stderr);
    assert!(
        out.stdout.contains("mine/bronze/payments_raw"),
        "{}",
        out.stdout
    );
    // an explicit bundle that is not there says how to point at one
    let out = exec(
        tidemark_default_logs(now)
            .current_dir(dir.path())
            .args(["demo", "--bundle", "nowhere"]),
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("--bundle"), "{}", out.stderr);
}

/// A target that holds a key twice (another writer appended its rows again) cannot be merged
/// into: the hourly run stops before any commit, exit 65, naming the key and both files and
/// saying what to do; the full reload it names repairs the table.
#[tokio::test]
async fn a_target_holding_a_key_twice_stops_the_run_and_names_the_way_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_pipeline(dir.path(), "15m", "soft", "");
    let (b, s) = (bronze(dir.path()), silver(dir.path()));
    let mut all = vec![up("a", T0 + HOUR, 1), up("b", T0 + HOUR, 2)];
    append(&b, &all).await;
    let boot = exec(tidemark_default_logs(NOW).arg("run").arg(&p));
    assert_eq!(boot.code, 0, "{}", boot.stderr);
    for batch in read_all(&s).await {
        append_batch(&s, batch).await;
    }
    let before = version(&s).await;
    let late = up("a", T0 + 2 * HOUR, 3);
    append(&b, std::slice::from_ref(&late)).await;
    all.push(late);

    let out = exec(tidemark_default_logs(NOW).arg("run").arg(&p));
    assert_eq!(
        out.code, 65,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    // (both keys are in the run's overlap, both twice: either may be named first)
    for needle in [
        "duplicate key",
        "first: id=\"",
        "\" (in part-",
        " and part-",
        "--full-reload",
    ] {
        assert!(
            out.stderr.contains(needle),
            "{needle:?} not in: {}",
            out.stderr
        );
    }
    assert_eq!(version(&s).await, before, "a failed run commits nothing");

    let fixed = exec(
        tidemark_default_logs(NOW)
            .arg("run")
            .arg(&p)
            .arg("--full-reload"),
    );
    assert_eq!(fixed.code, 0, "{}", fixed.stderr);
    assert_eq!(read_target(&s).await, oracle(&all, NOW, false));
}

/// A command given a pipeline of the wrong kind (`status` of a merge; `reconcile` now takes
/// every kind): exit 64, usage, at the pipeline's `kind:` line.
#[tokio::test]
async fn the_wrong_kind_of_pipeline_is_a_usage_error_for_every_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let merge = write_pipeline(d, "15m", "soft", "");
    let out = exec(
        tidemark_default_logs(NOW)
            .arg("status")
            .arg(&merge)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 64, "status: {}", out.stderr);
    assert!(
        out.stderr.contains(":2:"),
        "status: at its kind line: {}",
        out.stderr
    );
}

/// The command the demo's "Next:" list suggests that starts with `start`, its `\`-continued
/// lines joined as a shell would.
fn suggested(out: &str, start: &str) -> String {
    let mut lines = out.lines().skip_while(|l| *l != "Next:");
    let mut command = String::new();
    for l in lines.by_ref() {
        if !command.is_empty() || l.trim_start().starts_with(start) {
            command.push_str(l.trim().trim_end_matches('\\'));
            command.push(' ');
            if !l.ends_with('\\') {
                break;
            }
        }
    }
    assert!(
        !command.is_empty(),
        "no `{start}` in the demo's Next: {out}"
    );
    command.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A pipeline run before the one that writes its source says which pipeline(s) to run first,
/// with the command — from the repository's own pipelines, on an empty lake.
#[test]
fn a_source_not_written_yet_names_the_pipeline_to_run_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    copy_dir(&root.join("pipelines"), &d.join("pipelines"));
    copy_dir(&root.join("bundle"), &d.join("bundle"));
    let lake = format!("lake={}", d.join("lake").display());
    let run = |pipeline: &str| {
        exec(
            tidemark_default_logs(NOW)
                .current_dir(d)
                .args(["run", pipeline, "--var", &lake]),
        )
    };
    let out = run("pipelines/daily_payments.yml");
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("pipeline `payments` writes it and has not run on this lake yet")
            && out.stderr.contains(&format!(
                "Run it first: `tidemark run pipelines/payments.yml --var {lake}`"
            )),
        "{}",
        out.stderr
    );
    // two ingests land into one bronze: both are named
    let out = run("pipelines/payments.yml");
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("pipelines `payments_events` and `payments_partner` write it")
            && out
                .stderr
                .contains("Run them first: `tidemark run pipelines/payments_events.yml"),
        "{}",
        out.stderr
    );
    // a table no pipeline writes keeps the plain "not found" advice
    let text = std::fs::read_to_string(d.join("pipelines/daily_payments.yml")).expect("read");
    let text = text.replace("/silver/payments\"", "/silver/nobody_writes_this\"");
    std::fs::write(d.join("pipelines/orphan.yml"), text).expect("write");
    let out = run("pipelines/orphan.yml");
    assert_eq!(out.code, 66, "{}", out.stderr);
    assert!(
        out.stderr.contains("source table not found at")
            && out.stderr.contains("check `source.uri`"),
        "{}",
        out.stderr
    );
}
