//! The core run against a real S3-compatible server (s3s-fs, started here on loopback):
//! incremental runs with late rows converge to the oracle, two runs at once commit once (Delta
//! commits use S3 conditional put: `If-None-Match: *`), and the credentials never appear in
//! anything tidemark prints. `scripts/test.sh` installs s3s-fs; set `S3S_FS` to use another
//! binary.

use crate::common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use deltalake::protocol::SaveMode;

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");
const ACCESS_KEY: &str = "AKIDTIDEMARKTEST";
const SECRET_KEY: &str = "tidemark-secret-never-printed-7f3a9c";

struct Server {
    child: Child,
    endpoint: String,
    _root: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn s3s_fs_binary() -> PathBuf {
    if let Ok(p) = std::env::var("S3S_FS") {
        return PathBuf::from(p);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/s3s-fs");
    if local.exists() {
        return local;
    }
    PathBuf::from("s3s-fs") // on PATH
}

fn start_server() -> Server {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(root.path().join("lake")).expect("bucket dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let child = Command::new(s3s_fs_binary())
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--access-key",
            ACCESS_KEY,
            "--secret-key",
            SECRET_KEY,
        ])
        .arg(root.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start s3s-fs ({e}); run the tests with scripts/test.sh, which installs it"
            )
        });
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "s3s-fs did not start listening on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        _root: root,
    }
}

fn storage_options(server: &Server) -> HashMap<String, String> {
    HashMap::from([
        ("AWS_ENDPOINT_URL".to_string(), server.endpoint.clone()),
        ("AWS_ACCESS_KEY_ID".to_string(), ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), SECRET_KEY.to_string()),
        ("AWS_REGION".to_string(), "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP".to_string(), "true".to_string()),
    ])
}

async fn open_or_new(url: &str, opts: &HashMap<String, String>) -> deltalake::DeltaTable {
    let url = url::Url::parse(url).expect("url");
    let builder = || {
        deltalake::DeltaTableBuilder::from_url(url.clone())
            .expect("builder")
            .with_storage_options(opts.clone())
    };
    match builder().load().await {
        Ok(t) => t,
        Err(_) => builder().build().expect("table"),
    }
}

async fn append_s3(url: &str, opts: &HashMap<String, String>, changes: &[Change]) {
    open_or_new(url, opts)
        .await
        .write(vec![batch(changes)])
        .with_save_mode(SaveMode::Append)
        .await
        .expect("append to s3 source");
}

async fn read_target_s3(url: &str, opts: &HashMap<String, String>) -> Vec<TargetRow> {
    let table = open_or_new(url, opts).await;
    let ctx = datafusion::prelude::SessionContext::new();
    table
        .update_datafusion_session(&ctx.state())
        .expect("register store");
    let provider = table.table_provider().await.expect("provider");
    let batches = ctx
        .read_table(provider)
        .expect("read")
        .collect()
        .await
        .expect("collect");
    rows_of(&batches)
}

fn pipeline(dir: &Path) -> PathBuf {
    let text = "name: s3test\nkind: cdc_merge\nsource: { uri: \"s3://lake/bronze\" }\ntarget: { uri: \"s3://lake/silver\" }\nkeys: [id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 10m\ndeletes: { column: op, values: [D] }\ncolumns: { exclude: [op] }\nquarantine: { uri: \"s3://lake/quarantine\" }\n";
    let path = dir.join("s3.yml");
    std::fs::write(&path, text).expect("write pipeline");
    path
}

fn run(server: &Server, pipeline: &Path, now: i64, failpoint: Option<&str>) -> Command {
    let mut cmd = tidemark_process(now);
    cmd.arg("run").arg(pipeline).args(["--output", "json"]);
    for (k, v) in storage_options(server) {
        cmd.env(k, v);
    }
    cmd.env("RUST_LOG", "debug");
    if let Some(fp) = failpoint {
        cmd.env("TIDEMARK_FAILPOINTS", fp);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn assert_no_secret(out: &Output) {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains(SECRET_KEY),
        "the secret key was printed:\n{all}"
    );
}

fn ok(out: Output) -> serde_json::Value {
    assert_no_secret(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json summary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_runs_on_s3_converge_commit_once_and_never_print_secrets() {
    let server = start_server();
    let opts = storage_options(&server);
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pipeline(dir.path());
    let batches = [
        vec![
            Change::upsert("a", T0 + 40 * MIN, T0 + 41 * MIN, 1),
            Change::upsert("b", T0 + 50 * MIN, T0 + 51 * MIN, 1),
        ],
        vec![
            Change::upsert("c", T0 - HOUR, T0 + 2 * HOUR, 1),
            Change::delete("a", T0 + 90 * MIN, T0 + 2 * HOUR),
        ],
        vec![
            Change::upsert("b", T0 + 150 * MIN, T0 + 3 * HOUR, 2),
            Change::upsert("a", T0 + 30 * MIN, T0 + 3 * HOUR, 9),
        ],
    ];
    let mut landed = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        append_s3("s3://lake/bronze", &opts, b).await;
        landed.extend(b.clone());
        let now = T0 + (i as i64 + 1) * HOUR;
        let s = ok(run(&server, &p, now, None).output().expect("run"));
        if i == 1 {
            assert_eq!(s["num_late_rows"], 1, "{s}");
        }
        assert_eq!(
            read_target_s3("s3://lake/silver", &opts).await,
            oracle(&landed, now, false),
            "after batch {i}: {s}"
        );
    }

    // Two runs at once: the slow one finds the target moved, re-plans, commits nothing.
    let now = T0 + 4 * HOUR;
    let more = vec![Change::upsert("d", now - MIN, now, 1)];
    append_s3("s3://lake/bronze", &opts, &more).await;
    landed.extend(more);
    let pause = Pause::new();
    // The slow run logs at debug level to a file (a full pipe would block it at its pause).
    let slow_log = dir.path().join("slow.log");
    let slow = run(
        &server,
        &p,
        now,
        Some(&pause.at("cdc_merge.incremental.before_commit")),
    )
    .stderr(std::fs::File::create(&slow_log).expect("log file"))
    .spawn()
    .expect("spawn");
    pause.wait_reached();
    let fast = ok(run(&server, &p, now, None).output().expect("run"));
    pause.release();
    let slow = slow.wait_with_output().expect("wait");
    let slow_log = std::fs::read_to_string(&slow_log).expect("read log");
    assert!(!slow_log.contains(SECRET_KEY), "the secret key was logged");
    let slow = ok(slow);
    assert!(fast["target_version"].is_u64(), "{fast}");
    assert!(
        slow["target_version"].is_null() && slow["num_replans"] == 1,
        "{slow}"
    );
    assert_eq!(
        read_target_s3("s3://lake/silver", &opts).await,
        oracle(&landed, now, false)
    );

    // A failing run (a bucket that does not exist) still keeps the secret out of its error.
    let bad = dir.path().join("bad.yml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&p)
            .expect("read")
            .replace("s3://lake/bronze", "s3://missing-bucket/bronze"),
    )
    .expect("write");
    let out = run(&server, &bad, now, None).output().expect("run");
    assert_no_secret(&out);
    assert!(!out.status.success());
}

/// The reads an object store makes cheap (`lake::remote`): a source log with a checkpoint and
/// commits after it (read once, whole), footers fetched with their tail, and the probe's row
/// groups fetched in one go. Both apply modes, then `maintain` (checkpoint and log clean-up)
/// and more runs: every target equals the oracle after every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_logs_and_both_apply_modes_on_s3_match_the_oracle() {
    let server = start_server();
    let opts = storage_options(&server);
    let dir = tempfile::tempdir().expect("tempdir");
    let cow = pipeline(dir.path());
    let dv = dir.path().join("dv.yml");
    std::fs::write(
        &dv,
        std::fs::read_to_string(&cow)
            .expect("read")
            .replace("name: s3test", "name: s3dv")
            .replace(
                "target: { uri: \"s3://lake/silver\" }",
                "target: { uri: \"s3://lake/silver_dv\", apply: deletion_vectors }",
            )
            .replace("s3://lake/quarantine", "s3://lake/quarantine_dv"),
    )
    .expect("write");
    let mut landed = Vec::new();
    // A source whose log has a checkpoint with commits after it.
    for i in 0..6i64 {
        let b: Vec<Change> = (0..40)
            .map(|k| Change::upsert(&format!("k{k:03}"), T0 + i * MIN, T0 + i * MIN + 1, i))
            .collect();
        append_s3("s3://lake/bronze", &opts, &b).await;
        landed.extend(b);
        if i == 3 {
            let t = open_or_new("s3://lake/bronze", &opts).await;
            deltalake::checkpoints::create_checkpoint(&t, None)
                .await
                .expect("checkpoint");
        }
    }
    for hour in 1..=4i64 {
        let now = T0 + hour * HOUR;
        if hour > 1 {
            let b = vec![
                Change::upsert(
                    &format!("k{:03}", hour * 7),
                    now - 20 * MIN,
                    now - MIN,
                    hour * 10,
                ),
                Change::delete(&format!("k{:03}", hour * 3), now - 10 * MIN, now - MIN),
                Change::upsert(&format!("new{hour}"), now - 5 * MIN, now - MIN, 1),
            ];
            append_s3("s3://lake/bronze", &opts, &b).await;
            landed.extend(b);
        }
        for p in [&cow, &dv] {
            let s = ok(run(&server, p, now, None).output().expect("run"));
            assert!(s["target_version"].is_u64(), "{s}");
        }
        for target in ["s3://lake/silver", "s3://lake/silver_dv"] {
            assert_eq!(
                read_target_s3(target, &opts).await,
                oracle(&landed, now, false),
                "{target} after hour {hour}"
            );
        }
        if hour == 2 {
            for p in [&cow, &dv] {
                let mut m = Command::new(BIN);
                m.arg("maintain").arg(p).args(["--output", "json"]);
                for (k, v) in storage_options(&server) {
                    m.env(k, v);
                }
                let out = m
                    .env("TIDEMARK_FAKE_NOW", rfc3339(now))
                    .output()
                    .expect("maintain");
                let report = ok(out);
                assert!(report["checkpoint_version"].is_u64(), "{report}");
            }
        }
    }
}

/// `tidemark ARGS` against `endpoint` with the given secret, at the default log level.
fn tidemark_at(endpoint: &str, secret: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .env("TIDEMARK_FAKE_NOW", rfc3339(T0 + 2 * HOUR))
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("TIDEMARK_FAILPOINTS")
        .env_remove("AWS_PROFILE")
        // No instance metadata service: its absence must read as "no credentials".
        .env("AWS_EC2_METADATA_DISABLED", "true");
    match secret {
        Some(s) => {
            cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", s);
        }
        None => {
            cmd.env_remove("AWS_ACCESS_KEY_ID")
                .env_remove("AWS_SECRET_ACCESS_KEY");
        }
    }
    cmd.output().expect("run tidemark")
}

/// What a store fault must look like: its exit code, a one-line cause, and never the advice
/// for a damaged log (moving the table aside) nor the store client's request dump.
fn assert_store_fault(out: &Output, code: i32, says: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}:\n{stderr}");
    assert!(
        stderr.contains(says),
        "{what} should say {says:?}:\n{stderr}"
    );
    for never in [
        "damaged",
        "move the table",
        "Error performing",
        "retry_timeout",
    ] {
        assert!(!stderr.contains(never), "{what} says {never:?}:\n{stderr}");
    }
}

/// A store that is down, and credentials that are missing or wrong, are not a damaged Delta log:
/// a refused connection is transient (75, so a job's retries fire), credentials are unavailable
/// (66), for `run` and for `job run` alike, named in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_or_credentials_wrong_are_not_a_damaged_log() {
    let server = start_server();
    let opts = storage_options(&server);
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pipeline(dir.path());
    append_s3(
        "s3://lake/bronze",
        &opts,
        &[Change::upsert("a", T0, T0 + MIN, 1)],
    )
    .await;
    let pipeline_arg = p.display().to_string();
    let run_args = ["run", pipeline_arg.as_str()];
    let out = tidemark_at(&server.endpoint, Some(SECRET_KEY), &run_args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A job on the same store: its lease and ledger live there too.
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(
        bundle.join("tidemark.yml"),
        "bundle: { name: s3 }\ninclude: [resources/*.yml]\nvariables:\n  lake: { default: \"s3://lake\" }\ntargets:\n  local: { default: true }\n",
    )
    .expect("write bundle");
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n    hourly:\n      tasks:\n        - task_key: merge\n          max_retries: 1\n          pipeline_task: {{ pipeline: \"{pipeline_arg}\" }}\n"
        ),
    )
    .expect("write jobs");
    let bundle_arg = bundle.display().to_string();
    let job_args = ["job", "run", "hourly", "--bundle", bundle_arg.as_str()];
    let out = tidemark_at(&server.endpoint, Some(SECRET_KEY), &job_args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Wrong secret: the server answers 403.
    for args in [&run_args[..], &job_args[..]] {
        let out = tidemark_at(&server.endpoint, Some("not-the-secret"), args);
        assert_store_fault(&out, 66, "credentials", &format!("wrong secret, {args:?}"));
        assert_no_secret(&out);
    }
    // The generator's next hour on the same store, with the wrong secret: the same one line.
    let out = tidemark_at(
        &server.endpoint,
        Some("not-the-secret"),
        &["generate", "--out", "s3://lake/bronze", "--next-hour"],
    );
    assert_store_fault(
        &out,
        66,
        "credentials",
        "generate --next-hour, wrong secret",
    );
    assert_no_secret(&out);
    // No credentials at all.
    let out = tidemark_at(&server.endpoint, None, &run_args);
    assert_store_fault(&out, 66, "no credentials", "no credentials");

    // A location that is wrong, not damaged: a bucket that does not exist (66), a name no
    // bucket can have (78), a plain-HTTP endpoint without AWS_ALLOW_HTTP (78), a malformed URI
    // (78; `generate`: 64).
    let history = |uri: &str| tidemark_at(&server.endpoint, Some(SECRET_KEY), &["history", uri]);
    let out = history("s3://nosuchbucket/silver");
    assert_store_fault(
        &out,
        66,
        "does not exist (404 NoSuchBucket)",
        "missing bucket",
    );
    let out = history("s3://Lake/silver");
    assert_store_fault(&out, 78, "InvalidBucketName", "bucket name");
    let mut no_http = Command::new(BIN);
    no_http
        .args(["history", "s3://lake/silver"])
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env_remove("AWS_ALLOW_HTTP")
        .env_remove("RUST_LOG");
    let out = no_http.output().expect("run tidemark");
    assert_store_fault(&out, 78, "AWS_ALLOW_HTTP=true", "plain HTTP not allowed");
    for uri in ["s3:/lake/silver", "s3://"] {
        let out = history(uri);
        assert_store_fault(&out, 78, "s3://<bucket>/<path>", uri);
    }
    let out = tidemark_at(
        &server.endpoint,
        Some(SECRET_KEY),
        &[
            "generate",
            "--out",
            "s3:/lake/b",
            "--payments",
            "10",
            "--days",
            "1",
        ],
    );
    assert_store_fault(
        &out,
        64,
        "s3://<bucket>/<path>",
        "generate to a malformed URI",
    );

    // The store is down: nothing listens on its port any more.
    let endpoint = server.endpoint.clone();
    drop(server);
    for args in [&run_args[..], &job_args[..]] {
        let out = tidemark_at(&endpoint, Some(SECRET_KEY), args);
        assert_store_fault(&out, 75, "cannot connect", &format!("store down, {args:?}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&endpoint), "names the store:\n{stderr}");
    }
}

/// `kind: ingest` from an S3 prefix into an S3 bronze: each file once (its ETag and size in the
/// record), a rewritten file (a new ETag) refused, the secret never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_from_an_s3_prefix_is_exactly_once_and_sees_a_rewritten_file() {
    let server = start_server();
    let dir = tempfile::tempdir().expect("tempdir");
    // s3s-fs serves the bucket `lake` from this folder: producers' files appear under the prefix.
    let landing = server._root.path().join("lake/landing/events");
    std::fs::create_dir_all(&landing).expect("landing");
    std::fs::write(
        landing.join("a.jsonl"),
        "{\"id\":\"p1\",\"v\":1}\n{\"id\":\"p2\",\"v\":2}\n",
    )
    .expect("a");
    let p = dir.path().join("ingest.yml");
    std::fs::write(
        &p,
        "name: s3ingest\nkind: ingest\nlanding: { uri: \"s3://lake/landing\", glob: \"events/*.jsonl\" }\nformat: json\ntarget: { uri: \"s3://lake/bronze_ingest\" }\nschema: { id: string not null, v: long }\nquarantine: { uri: \"s3://lake/quarantine_ingest\" }\n",
    )
    .expect("pipeline");
    let first = ok(run(&server, &p, T0, None).output().expect("run"));
    assert_eq!(first["num_files_ingested"], 1, "{first}");
    assert_eq!(first["num_rows_written"], 2, "{first}");
    std::fs::write(landing.join("b.jsonl"), "{\"id\":\"p3\",\"v\":3}\n").expect("b");
    let second = ok(run(&server, &p, T0 + HOUR, None).output().expect("run"));
    assert_eq!(
        (
            second["num_files_ingested"].as_u64(),
            second["num_files_skipped"].as_u64()
        ),
        (Some(1), Some(1)),
        "{second}"
    );
    let opts = storage_options(&server);
    let table = open_or_new("s3://lake/bronze_ingest", &opts).await;
    let ctx = datafusion::prelude::SessionContext::new();
    table
        .update_datafusion_session(&ctx.state())
        .expect("register store");
    let n: usize = ctx
        .read_table(table.table_provider().await.expect("provider"))
        .expect("read")
        .collect()
        .await
        .expect("collect")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(n, 3);
    // Same size, other bytes: only the ETag tells.
    std::fs::write(landing.join("b.jsonl"), "{\"id\":\"p3\",\"v\":4}\n").expect("rewrite");
    let out = run(&server, &p, T0 + 2 * HOUR, None).output().expect("run");
    assert_no_secret(&out);
    assert_eq!(
        out.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("s3://lake/landing/events/b.jsonl"));
}
