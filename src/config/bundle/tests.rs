//! Unit tests of bundle loading; the fixture bundles under tests/fixtures/bundles are checked
//! end to end by tests/it/jobs.rs.

use std::path::Path;

use super::build::load;
use super::source::normalize;
use super::*;

const ROOT: &str = r#"bundle:
  name: t
include:
  - resources/*.yml
variables:
  lake:
    description: lake root
    default: /default/lake
  threads:
    default: 2
targets:
  local:
    default: true
    variables:
      lake: /target/lake
  other:
    variables:
      threads: 3
"#;

const JOB: &str = r#"resources:
  jobs:
    j:
      schedule: { quartz_cron_expression: "0 5 * * * ?", timezone_id: UTC }
      job_clusters:
        - job_cluster_key: c
          new_cluster: { worker_threads: "${var.threads}", memory_limit: 64MiB }
      tasks:
        - task_key: second
          depends_on: [{ task_key: first }]
          job_cluster_key: c
          pipeline_task: { pipeline: ../p.yml }
        - task_key: first
          job_cluster_key: c
          pipeline_task: { pipeline: ../p.yml, mode: full_reload }
          max_retries: 2
          min_retry_interval_millis: 10
"#;

const PIPELINE: &str = r#"name: p
kind: cdc_merge
source: { uri: "${var.lake}/bronze" }
target: { uri: "${var.lake}/silver" }
keys: [id]
sequence_by: updated_at
overlap: 15m
quarantine: { uri: "${var.lake}/quarantine" }
"#;

fn write_bundle(dir: &Path, job: &str) {
    std::fs::create_dir_all(dir.join("resources")).unwrap();
    std::fs::write(dir.join("tidemark.yml"), ROOT).unwrap();
    std::fs::write(dir.join("resources/j.yml"), job).unwrap();
    std::fs::write(dir.join("p.yml"), PIPELINE).unwrap();
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn variables_resolve_from_var_then_env_then_target_then_default() {
    let dir = tempfile::tempdir().unwrap();
    write_bundle(dir.path(), JOB);
    let none = Vars::new();
    let b = load(dir.path(), None, &none, &no_env).unwrap().bundle;
    assert_eq!(b.target, "local");
    assert_eq!(b.lake(), "/target/lake");
    assert_eq!(b.vars.get("threads"), Some("2"));
    let b = load(dir.path(), Some("other"), &none, &no_env)
        .unwrap()
        .bundle;
    assert_eq!(b.lake(), "/default/lake");
    assert_eq!(b.jobs["j"].clusters["c"].worker_threads, Some(3));
    let env = |k: &str| (k == "BUNDLE_VAR_lake").then(|| "/env/lake".to_string());
    let b = load(dir.path(), None, &none, &env).unwrap().bundle;
    assert_eq!(b.lake(), "/env/lake");
    let source = |b: &Bundle| {
        b.variables
            .iter()
            .find(|v| v.name == "lake")
            .and_then(|v| v.source.clone())
    };
    assert_eq!(source(&b).as_deref(), Some("BUNDLE_VAR_lake"));
    let cli = Vars::from_args(&["lake=/cli/lake"]).unwrap();
    let b = load(dir.path(), None, &cli, &env).unwrap().bundle;
    assert_eq!(b.lake(), "/cli/lake");
    assert_eq!(
        b.jobs["j"].tasks[0].pipeline.source_uri(),
        "/cli/lake/bronze"
    );
}

#[test]
fn tasks_come_in_dependency_order_with_their_settings() {
    let dir = tempfile::tempdir().unwrap();
    write_bundle(dir.path(), JOB);
    let b = load(dir.path(), None, &Vars::new(), &no_env)
        .unwrap()
        .bundle;
    let j = &b.jobs["j"];
    let keys: Vec<&str> = j.tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["first", "second"]);
    assert_eq!(j.tasks[0].mode, TaskMode::FullReload);
    assert_eq!(j.tasks[0].max_retries, 2);
    assert_eq!(j.tasks[0].min_retry_interval, Duration::from_millis(10));
    assert_eq!(j.tasks[1].mode, TaskMode::Incremental);
    assert_eq!(j.catch_up, CatchUp::Latest);
    assert_eq!(j.clusters["c"].memory_limit, Some(64 << 20));
    assert_eq!(
        j.schedule.as_ref().map(|s| s.pause_status),
        Some(PauseStatus::Unpaused)
    );
}

#[test]
fn a_cycle_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let job = JOB.replace(
        "          job_cluster_key: c\n          pipeline_task: { pipeline: ../p.yml, mode: full_reload }",
        "          depends_on: [{ task_key: second }]\n          job_cluster_key: c\n          pipeline_task: { pipeline: ../p.yml, mode: full_reload }",
    );
    write_bundle(dir.path(), &job);
    let err = load(dir.path(), None, &Vars::new(), &no_env).unwrap_err();
    let msgs: Vec<String> = err.errors.iter().map(ToString::to_string).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("cycle: second -> first -> second") && m.contains("j.yml:9:")),
        "{msgs:?}"
    );
}

#[test]
fn unknown_target_and_undeclared_cli_variable() {
    let dir = tempfile::tempdir().unwrap();
    write_bundle(dir.path(), JOB);
    let cli = Vars::from_args(&["laek=/x"]).unwrap();
    let err = load(dir.path(), Some("lcoal"), &cli, &no_env).unwrap_err();
    let msgs: Vec<String> = err.errors.iter().map(ToString::to_string).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("--target lcoal") && m.contains("did you mean `local`")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("--var laek") && m.contains("did you mean `lake`")),
        "{msgs:?}"
    );
}

#[test]
fn normalizes_parent_components() {
    assert_eq!(
        normalize(Path::new("bundle/resources/../../pipelines/p.yml")),
        Path::new("pipelines/p.yml")
    );
    assert_eq!(normalize(Path::new("../x/./y")), Path::new("../x/y"));
    assert_eq!(normalize(Path::new("/a/../../b")), Path::new("/b"));
}
