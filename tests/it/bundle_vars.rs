//! Single-pipeline commands take their `${var.NAME}` values from the bundle:
//! after `tidemark demo`, `tidemark run payments`, `reconcile payments`, `history payments` and
//! `maintain payments` work as the README shows, without `--var`; `--target` picks the bundle
//! target; `--var` still wins; a `--var` the pipeline never uses is refused.

use crate::common;

use std::path::PathBuf;

use common::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn pipeline_commands_take_variables_from_the_bundle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    copy_dir(&root().join("bundle"), &d.join("bundle"));
    copy_dir(&root().join("pipelines"), &d.join("pipelines"));
    let demo = exec(tidemark_from(d).arg("demo"));
    assert_eq!(demo.code, 0, "{}\n{}", demo.stdout, demo.stderr);

    let run = exec(tidemark_from(d).args(["run", "payments", "--output", "json"]));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let summary: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json");
    assert!(
        summary["target_uri"]
            .as_str()
            .is_some_and(|u| u.contains("lake/silver/payments")),
        "{summary}"
    );
    let reconcile = exec(tidemark_from(d).args(["reconcile", "payments"]));
    assert_eq!(
        reconcile.code, 0,
        "{}\n{}",
        reconcile.stdout, reconcile.stderr
    );
    let history = exec(tidemark_from(d).args(["history", "payments", "--limit", "1"]));
    assert_eq!(history.code, 0, "{}", history.stderr);
    assert!(history.stdout.contains("bootstrap"), "{}", history.stdout);
    let maintain = exec(tidemark_from(d).args(["maintain", "payments", "--dry-run"]));
    assert_eq!(maintain.code, 0, "{}", maintain.stderr);

    // The local target explicitly; an unknown target is the bundle's error (78).
    let local = exec(tidemark_from(d).args(["history", "payments", "--target", "local"]));
    assert_eq!(local.code, 0, "{}", local.stderr);
    let unknown = exec(tidemark_from(d).args(["run", "payments", "--target", "nope"]));
    assert_eq!(unknown.code, 78, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("nope"), "{}", unknown.stderr);

    // --var wins over the bundle: a lake with no source is "not found" there.
    let elsewhere = d.join("elsewhere");
    let other = exec(
        tidemark_from(d)
            .args(["run", "payments", "--var"])
            .arg(format!("lake={}", elsewhere.display())),
    );
    assert_eq!(other.code, 66, "{}", other.stderr);
    assert!(other.stderr.contains("elsewhere"), "{}", other.stderr);

    // A --var the pipeline never references is a typo, refused with the nearest name.
    let typo = exec(tidemark_from(d).args(["run", "payments", "--var", "lkae=./lake"]));
    assert_eq!(typo.code, 64, "{}", typo.stderr);
    assert!(
        typo.stderr.contains("did you mean `lake`"),
        "{}",
        typo.stderr
    );

    // Without a bundle, --target says how to point at one.
    let no_bundle = exec(tidemark_from(d).args([
        "run", "payments", "--target", "local", "--bundle", "missing",
    ]));
    assert_eq!(no_bundle.code, 64, "{}", no_bundle.stderr);
    assert!(
        no_bundle.stderr.contains("--bundle DIR"),
        "{}",
        no_bundle.stderr
    );
    let _ = rfc3339(T0); // shared helpers
}

/// Relative paths are relative to where they are written: in the bundle, to the bundle root
/// (whatever the working directory); on the command line, to the working directory.
#[test]
fn relative_locations_resolve_against_the_bundle_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let checkout = d.join("checkout");
    copy_dir(&root().join("bundle"), &checkout.join("bundle"));
    copy_dir(&root().join("pipelines"), &checkout.join("pipelines"));
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");

    let demo = exec(tidemark_from(&elsewhere).args(["demo", "--bundle", "../checkout/bundle"]));
    assert_eq!(demo.code, 0, "{}\n{}", demo.stdout, demo.stderr);
    assert!(
        checkout.join("lake/silver/payments/_delta_log").is_dir(),
        "the bundle's `lake: ../lake` is beside the bundle"
    );
    let job = exec(tidemark_from(&elsewhere).args([
        "job",
        "run",
        "payments_hourly",
        "--bundle",
        "../checkout/bundle",
    ]));
    assert_eq!(job.code, 0, "{}\n{}", job.stdout, job.stderr);
    let rows = held::ledger(
        tidemark_from(&elsewhere),
        ["--bundle", "../checkout/bundle"],
    );
    // Two runs (the demo's and the job's) of seven tasks: ingest_events, ingest_partner, merge,
    // daily_payments, hourly_payments, merchants, daily_segments.
    assert_eq!(rows.len(), 14, "{rows:?}");
    // A single-pipeline command takes the same lake from the bundle.
    let run = exec(tidemark_from(&elsewhere).args([
        "run",
        "../checkout/pipelines/payments.yml",
        "--bundle",
        "../checkout/bundle",
        "--output",
        "json",
    ]));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let summary: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json");
    let target = checkout.join("lake/silver/payments");
    assert_eq!(
        summary["target_uri"],
        target.display().to_string(),
        "{summary}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&elsewhere)
        .expect("ls")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(
        leftovers.is_empty(),
        "the working directory got {leftovers:?}"
    );

    // On the command line, `./here` is the working directory's (the source is not there: 66).
    for how in ["--var", "env"] {
        let mut cmd = tidemark_from(&elsewhere);
        cmd.args([
            "job",
            "run",
            "payments_hourly",
            "--bundle",
            "../checkout/bundle",
        ]);
        if how == "--var" {
            cmd.args(["--var", "lake=./here"]);
        } else {
            cmd.env("BUNDLE_VAR_lake", "./here");
        }
        let out = exec(&mut cmd);
        assert_eq!(out.code, 66, "{how}: {}\n{}", out.stdout, out.stderr);
        // The first task, the ingest, finds no landing folder there.
        let here = elsewhere.join("here/landing/payments");
        assert!(
            out.stdout.contains(&here.display().to_string())
                || out.stderr.contains(&here.display().to_string()),
            "{how}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

/// From another directory, a pipeline named as the demo names it resolves through `--bundle`
/// (the bundle's jobs name their pipelines), with the bundle's variables; a name no pipeline of
/// the bundle has is still a config error listing what was looked for.
#[test]
fn pipeline_names_resolve_through_the_bundle_from_anywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    copy_dir(&root().join("bundle"), &d.join("checkout/bundle"));
    copy_dir(&root().join("pipelines"), &d.join("checkout/pipelines"));
    let demo = exec(tidemark_from(&d.join("checkout")).arg("demo"));
    assert_eq!(demo.code, 0, "{}\n{}", demo.stdout, demo.stderr);
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let bundle = d.join("checkout/bundle");
    let status = exec(
        tidemark_from(&elsewhere)
            .args(["status", "daily_payments", "--days", "3", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(status.code, 0, "{}\n{}", status.stdout, status.stderr);
    assert!(status.stdout.contains("day status"), "{}", status.stdout);
    let history = exec(
        tidemark_from(&elsewhere)
            .args(["history", "payments", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(history.code, 0, "{}\n{}", history.stdout, history.stderr);
    let typo = exec(
        tidemark_from(&elsewhere)
            .args(["status", "daily_paymnts", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(typo.code, 78, "{}", typo.stderr);
    assert!(
        typo.stderr.contains("did you mean `daily_payments`?"),
        "{}",
        typo.stderr
    );
    // A table-or-pipeline command: a missing table (66) that names the pipeline it was near.
    let typo = exec(
        tidemark_from(&elsewhere)
            .args(["history", "paymnts", "--bundle"])
            .arg(&bundle),
    );
    assert_eq!(typo.code, 66, "{}", typo.stderr);
    assert!(
        typo.stderr
            .contains("did you mean the pipeline `payments`?"),
        "{}",
        typo.stderr
    );
}

/// A pipeline with relative locations, run with `tidemark run` from a folder (its working
/// directory's tables) and then as a bundle job (relative to the bundle root): where the two
/// differ and only the working directory's exists, the job says so, naming both.
#[tokio::test]
async fn a_relative_location_read_differently_by_job_and_run_is_said_out_loud() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    append(&bronze(d), &[Change::upsert("a", T0, T0, 1)]).await;
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        format!(
            "bundle: {{ name: rel }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ default: \"{}\" }}\ntargets:\n  local: {{ default: true }}\n",
            d.join("lake").display()
        ),
    )
    .expect("write");
    let pipeline = "name: rel\nkind: cdc_merge\nsource: { uri: \"lake/bronze\" }\ntarget: { uri: \"lake/silver\" }\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 15m\nmax_future_skew: 5m\ndeletes: { column: op, values: [D], mode: soft }\ncolumns: { exclude: [op] }\nquarantine: { uri: \"lake/quarantine\" }\n";
    std::fs::write(bundle.join("resources/rel.yml"), pipeline).expect("write");
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        "resources:\n  jobs:\n    j:\n      tasks:\n        - task_key: t\n          pipeline_task: { pipeline: rel.yml }\n",
    )
    .expect("write");
    let out = exec(
        tidemark_at(T0 + HOUR)
            .current_dir(d)
            .args(["job", "run", "j", "--bundle"])
            .arg(&bundle),
    );
    assert_ne!(
        out.code, 0,
        "the bundle root has no lake/bronze: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("is a relative location")
            && out
                .stderr
                .contains(&d.join("lake/bronze").display().to_string()),
        "{}",
        out.stderr
    );
}
