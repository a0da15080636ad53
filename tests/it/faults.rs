//! The fault suite: crash a run at every phase (failpoints: error, panic, abort ≈ kill -9),
//! inside delta-rs' writes (storage failpoints before data files and before the commit file),
//! and with real SIGKILLs at random moments; after each fault, rerun the same command and check
//! that the target equals the oracle, holds no duplicate key, never saw its watermark go back,
//! and no source version was applied twice. I/O faults — a full disk or a refused permission
//! while writing data files or a commit (the target's or the quarantine's), a refused read of a
//! data file, a full disk under the spill files, a target data file deleted or cut short by hand —
//! must end in their documented exit code (74, 66, 65), never 70; after a damaged target the
//! rerun is the `--full-reload` the error advises. Every exit 70 of any command is counted.
//! Also: concurrent writers. The figures go to `target/reliability/scoreboard.json` (merged with
//! the bad-input corpus's figures when present).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Storage and run failpoints, and the batch/flags each is armed on.
const RUN_POINTS: &[&str] = &[
    "cdc_merge.incremental.after_plan",
    "cdc_merge.incremental.after_read",
    "cdc_merge.incremental.after_validate",
    "cdc_merge.incremental.after_dedup",
    "cdc_merge.incremental.after_compare",
    "cdc_merge.incremental.before_commit",
    "cdc_merge.incremental.after_commit",
];
const RELOAD_POINTS: &[&str] = &[
    "cdc_merge.full_reload.after_plan",
    "cdc_merge.full_reload.after_read",
    "cdc_merge.full_reload.after_validate",
    "cdc_merge.full_reload.after_write",
];
const STORE_POINTS: &[&str] = &["store.put_data", "store.put_commit"];
const ACTIONS: &[&str] = &["error", "panic", "abort"];
const BATCHES: usize = 3;
/// Failpoints and actions that stand for a fault of the OS, with the exit code each must end in:
/// writes refused or out of space are local I/O (74), a refused read is "unavailable" (66).
const IO_FAULTS: &[(&str, &str, i32)] = &[
    ("store.put_data", "enospc", 74),
    ("store.put_data", "eacces", 74),
    ("store.put_commit", "enospc", 74),
    ("store.put_commit", "eacces", 74),
    ("store.get_data", "eacces", 66),
];
/// Exit code of a run over a target whose data file was deleted or cut short: damaged target.
const DAMAGED_TARGET_EXIT: i32 = 65;

#[derive(Debug, Clone)]
enum Fault {
    Point {
        name: &'static str,
        action: &'static str,
        batch: usize,
        full_reload: bool,
    },
    /// A failpoint standing for an OS fault: the faulted run must exit `exit`.
    Io {
        name: &'static str,
        action: &'static str,
        batch: usize,
        full_reload: bool,
        exit: i32,
    },
    /// Every target data file deleted (or cut to half its bytes) before the run of `batch`: the
    /// run must exit 65, and the rerun is `--full-reload`.
    Damage {
        batch: usize,
        truncate: bool,
    },
    Kill {
        batch: usize,
        after_ms: u64,
    },
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    scenarios: u64,
    faults_injected: u64,
    faults_survived: u64,
    rows_lost: u64,
    rows_mismatched: u64,
    duplicate_keys: u64,
    double_applied_batches: u64,
    watermark_regressions: u64,
    /// Commands that exited 70 ("internal: a bug"), faulted or not.
    exit_70_seen: u64,
    /// I/O faults (and damaged targets) that ended in another exit code than documented.
    io_faults_misclassified: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.scenarios += o.scenarios;
        self.faults_injected += o.faults_injected;
        self.faults_survived += o.faults_survived;
        self.rows_lost += o.rows_lost;
        self.rows_mismatched += o.rows_mismatched;
        self.duplicate_keys += o.duplicate_keys;
        self.double_applied_batches += o.double_applied_batches;
        self.watermark_regressions += o.watermark_regressions;
        self.exit_70_seen += o.exit_70_seen;
        self.io_faults_misclassified += o.io_faults_misclassified;
    }
}

/// A small deterministic generator (xorshift) so every scenario is reproducible from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn batch_time(b: usize) -> i64 {
    T0 + (b as i64 + 1) * HOUR
}

/// Three batches of changes with updates, late rows behind the overlap, re-deliveries,
/// deletes and a null key.
fn history(seed: u64) -> Vec<Vec<Change>> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..BATCHES)
        .map(|b| {
            let now = batch_time(b);
            let mut rows = Vec::new();
            for _ in 0..(6 + rng.below(6)) {
                let id = format!("k{}", rng.below(12));
                let late = rng.below(5) == 0;
                let seq = if late {
                    now - HOUR - (rng.below(120) as i64) * MIN
                } else {
                    now - (rng.below(50) as i64) * MIN
                };
                let ing = now - (rng.below(3) as i64) * MIN;
                let c = if rng.below(10) == 0 {
                    Change::delete(&id, seq, ing)
                } else {
                    Change::upsert(&id, seq, ing, rng.below(100) as i64)
                };
                if rng.below(8) == 0 {
                    rows.push(c.clone());
                }
                rows.push(c);
            }
            if b == 1 {
                rows.push(Change {
                    id: None,
                    seq: Some(now - MIN),
                    ing: now,
                    val: Some(1),
                    op: "U".into(),
                });
            }
            rows
        })
        .collect()
}

fn command(pipeline: &Path, now: i64, full_reload: bool, failpoint: Option<String>) -> Command {
    let mut cmd = tidemark_process(now);
    cmd.arg("run").arg(pipeline).arg("--output").arg("json");
    if full_reload {
        cmd.arg("--full-reload");
    }
    cmd.env("RUST_LOG", "error");
    if let Some(fp) = failpoint {
        cmd.env("TIDEMARK_FAILPOINTS", fp);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn tidemark")
}

/// Runs a command, counting an exit 70 in `tally` — unless `panic_injected`: a panic injected
/// inside delta-rs' writer (`store.put_*=panic`) is caught there and reported as what it stands
/// for, a bug (70); every outside-world fault must end in another code.
fn counted_unless(cmd: &mut Command, tally: &mut Tally, panic_injected: bool) -> Output {
    let out = output(cmd);
    if out.status.code() == Some(70) && !panic_injected {
        tally.exit_70_seen += 1;
        eprintln!(
            "exit 70 (internal) from {cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn counted(cmd: &mut Command, tally: &mut Tally) -> Output {
    counted_unless(cmd, tally, false)
}

/// Every data file of the table at `dir` deleted, or cut to the first half of its bytes.
fn damage_data_files(dir: &Path, truncate: bool) {
    for e in std::fs::read_dir(dir).expect("target dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "parquet") {
            if truncate {
                let bytes = std::fs::read(&p).expect("read data file");
                std::fs::write(&p, &bytes[..bytes.len() / 2]).expect("truncate data file");
            } else {
                std::fs::remove_file(&p).expect("delete data file");
            }
        }
    }
}

fn summary(out: &Output) -> Option<Value> {
    serde_json::from_slice(&out.stdout).ok()
}

/// Runs one scenario; returns its tally (one fault injected at most).
fn scenario(seed: u64, fault: &Fault, rt: &tokio::runtime::Runtime) -> Tally {
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "10m", "soft", "");
    let mut tally = Tally {
        scenarios: 1,
        ..Tally::default()
    };
    let mut landed = Vec::new();
    let mut last_wm: Option<String> = None;
    let mut fault_fired = false;
    let mut converged = true;
    for (b, rows) in history(seed).into_iter().enumerate() {
        rt.block_on(append(&bronze(dir.path()), &rows));
        landed.extend(rows);
        let now = batch_time(b);
        let full_reload = matches!(fault,
            Fault::Point { batch, full_reload: true, .. } | Fault::Io { batch, full_reload: true, .. }
                if *batch == b);
        // After a damaged target the repair the error advises is a full reload.
        let mut rerun_full_reload = full_reload;
        match fault {
            Fault::Point {
                name,
                action,
                batch,
                ..
            } if *batch == b => {
                let out = counted_unless(
                    &mut command(
                        &pipeline,
                        now,
                        full_reload,
                        Some(format!("{name}={action}")),
                    ),
                    &mut tally,
                    *action == "panic",
                );
                fault_fired = !out.status.success();
            }
            Fault::Io {
                name,
                action,
                batch,
                exit,
                ..
            } if *batch == b => {
                let out = counted(
                    &mut command(
                        &pipeline,
                        now,
                        full_reload,
                        Some(format!("{name}={action}")),
                    ),
                    &mut tally,
                );
                fault_fired = !out.status.success();
                if fault_fired && out.status.code() != Some(*exit) {
                    tally.io_faults_misclassified += 1;
                    eprintln!(
                        "seed {seed} {fault:?}: exit {:?}, expected {exit}: {}",
                        out.status.code(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            Fault::Damage { batch, truncate } if *batch == b => {
                damage_data_files(&silver(dir.path()), *truncate);
                let out = counted(&mut command(&pipeline, now, false, None), &mut tally);
                // A run whose slice touches no damaged file has nothing to report; either way
                // the rerun is the full reload that repairs the target.
                fault_fired = !out.status.success();
                rerun_full_reload = true;
                let stderr = String::from_utf8_lossy(&out.stderr);
                if fault_fired
                    && (out.status.code() != Some(DAMAGED_TARGET_EXIT)
                        || !stderr.contains("--full-reload"))
                {
                    tally.io_faults_misclassified += 1;
                    eprintln!(
                        "seed {seed} {fault:?}: exit {:?}, expected {DAMAGED_TARGET_EXIT} advising --full-reload: {stderr}",
                        out.status.code()
                    );
                }
            }
            Fault::Kill { batch, after_ms } if *batch == b => {
                let mut child = command(&pipeline, now, false, None).spawn().expect("spawn");
                std::thread::sleep(Duration::from_millis(*after_ms));
                let killed = child.try_wait().ok().flatten().is_none();
                let _ = child.kill(); // SIGKILL
                let _ = child.wait();
                fault_fired = killed;
            }
            _ => {}
        }
        let out = counted(
            &mut command(&pipeline, now, rerun_full_reload, None),
            &mut tally,
        );
        if !out.status.success() {
            converged = false;
            eprintln!(
                "seed {seed} {fault:?}: rerun failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        if let Some(wm) =
            summary(&out).and_then(|s| s["watermark_after"].as_str().map(str::to_string))
        {
            // RFC 3339 in UTC with the same format sorts like time.
            if last_wm
                .as_ref()
                .is_some_and(|l| wm.as_str() < l.as_str() && wm.len() == l.len())
            {
                tally.watermark_regressions += 1;
            }
            last_wm = Some(wm);
        }
        let expected = oracle(&landed, now, false);
        let actual = rt.block_on(read_target(&silver(dir.path())));
        let mut ids: Vec<&str> = actual.iter().map(|r| r.id.as_str()).collect();
        let n = ids.len();
        ids.dedup();
        tally.duplicate_keys += (n - ids.len()) as u64;
        tally.rows_lost += expected
            .iter()
            .filter(|e| !actual.iter().any(|a| a.id == e.id))
            .count() as u64;
        tally.rows_mismatched += expected.iter().filter(|e| !actual.contains(e)).count() as u64;
        if actual != expected {
            converged = false;
            eprintln!("seed {seed} {fault:?}: batch {b}: target differs from the oracle\n  expected {expected:?}\n  actual   {actual:?}");
        }
    }
    tally.double_applied_batches += rt.block_on(double_applied(&silver(dir.path())));
    if fault_fired {
        tally.faults_injected += 1;
        if converged {
            tally.faults_survived += 1;
        }
    }
    tally
}

/// Source versions recorded by more than one data commit of the target (a batch applied twice).
async fn double_applied(target: &Path) -> u64 {
    let url =
        deltalake::table::builder::parse_table_uri(target.to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url).await.expect("open target");
    let commits = tidemark::lake::read_commits(&table, 10_000)
        .await
        .expect("commits");
    let mut seen = std::collections::BTreeMap::<u64, u64>::new();
    for c in commits {
        if let Some(v) = c.run.as_ref().and_then(|r| r["source_version"].as_u64()) {
            if c.operation.as_deref() == Some("MERGE") {
                *seen.entry(v).or_default() += 1;
            }
        }
    }
    seen.values().filter(|n| **n > 1).count() as u64
}

fn scenarios() -> Vec<(u64, Fault)> {
    let mut out = Vec::new();
    for seed in 0..2u64 {
        for action in ACTIONS {
            for name in RUN_POINTS {
                out.push((
                    seed,
                    Fault::Point {
                        name,
                        action,
                        batch: 1,
                        full_reload: false,
                    },
                ));
            }
            for name in RELOAD_POINTS {
                // seed 0: the bootstrap; seed 1: an explicit --full-reload over a live target
                out.push((
                    seed,
                    Fault::Point {
                        name,
                        action,
                        batch: seed as usize,
                        full_reload: seed == 1,
                    },
                ));
            }
            for name in STORE_POINTS {
                out.push((
                    seed,
                    Fault::Point {
                        name,
                        action,
                        batch: seed as usize,
                        full_reload: false,
                    },
                ));
            }
        }
    }
    // OS faults: on the bootstrap (seed 0), on an incremental run (seed 1: its first write is to
    // the quarantine table, batch 1 holding a null key) and on a full reload over a live target
    // (seed 2: the quarantine first again, then the target).
    for (name, action, exit) in IO_FAULTS {
        for (seed, batch, full_reload) in [(0u64, 0usize, false), (1, 1, false), (2, 1, true)] {
            out.push((
                seed,
                Fault::Io {
                    name,
                    action,
                    batch,
                    full_reload,
                    exit: *exit,
                },
            ));
        }
    }
    for (seed, batch, truncate) in [
        (3u64, 1usize, false),
        (3, 2, true),
        (4, 1, true),
        (4, 2, false),
    ] {
        out.push((seed, Fault::Damage { batch, truncate }));
    }
    // A third history for the incremental points, armed on the second incremental run.
    for action in ACTIONS {
        for name in RUN_POINTS {
            out.push((
                2,
                Fault::Point {
                    name,
                    action,
                    batch: 2,
                    full_reload: false,
                },
            ));
        }
    }
    for k in 0..12u64 {
        out.push((
            100 + k,
            Fault::Kill {
                batch: 1 + (k as usize % 2),
                after_ms: 20 + k * 25,
            },
        ));
    }
    out
}

/// The disk holding the spill files fills up during a full reload that spills (the payments
/// generator's 60,000 payments sorted under a 16 MiB memory limit), a spill file passes the
/// file-size limit, and the whole run runs under `ulimit -f`: exit 74 saying to free space or
/// raise the limit, nothing committed; the rerun succeeds and `reconcile` finds the target
/// identical to its source.
fn spill_scenario() -> Tally {
    let mut tally = Tally {
        scenarios: 1,
        ..Tally::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let spill = dir.path().join("spill");
    let pipeline = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pipelines/payments.yml");
    let tm = |args: &[&str], failpoint: Option<&str>| {
        let mut cmd = process();
        cmd.args(args)
            .env("TIDEMARK_FAKE_NOW", "2025-03-01T00:00:00Z")
            .env("RUST_LOG", "error");
        if let Some(fp) = failpoint {
            cmd.env("TIDEMARK_FAILPOINTS", fp);
        }
        cmd
    };
    let bronze = lake.join("bronze/payments_raw");
    let generated = output(&mut tm(
        &[
            "generate",
            "--out",
            bronze.to_str().expect("utf8"),
            "--payments",
            "60000",
            "--days",
            "5",
            "--seed",
            "1",
            "--start",
            "2025-02-20",
        ],
        None,
    ));
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let var = format!("lake={}", lake.display());
    let run = [
        "run",
        pipeline.to_str().expect("utf8"),
        "--var",
        &var,
        "--full-reload",
        "--threads",
        "1",
        "--memory-limit",
        "16MiB",
        "--spill-dir",
        spill.to_str().expect("utf8"),
    ];
    // The spill disk fills up, a spill file passes the process's file-size limit (EFBIG, as a
    // container's RLIMIT_FSIZE makes it), and a real `ulimit -f` under the whole run: each is
    // exit 74 saying what to free or raise, with nothing committed.
    let limited = |args: &[&str]| {
        let cmd = tm(args, None);
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg("ulimit -f 256 && exec \"$0\" \"$@\"")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env_remove("TIDEMARK_FAILPOINTS");
        sh
    };
    let faults: [(&str, Command, &str); 3] = [
        (
            "spill disk full",
            tm(&run, Some("spill.write=enospc")),
            "free space",
        ),
        (
            "spill file too large",
            tm(&run, Some("spill.write=efbig")),
            "file-size limit",
        ),
        ("ulimit -f", limited(&run), "file-size limit"),
    ];
    for (name, mut cmd, says) in faults {
        tally.scenarios += 1;
        let out = counted(&mut cmd, &mut tally);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            eprintln!("{name}: the run did not spill, no fault injected");
            continue;
        }
        tally.faults_injected += 1;
        if out.status.code() != Some(74) || !stderr.contains(says) {
            tally.io_faults_misclassified += 1;
            eprintln!(
                "{name}: exit {:?}, expected 74 saying `{says}`: {stderr}",
                out.status.code()
            );
        }
    }
    tally.scenarios -= 1;
    let rerun = counted(&mut tm(&run, None), &mut tally);
    let reconciled = counted(
        &mut tm(
            &["reconcile", pipeline.to_str().expect("utf8"), "--var", &var],
            None,
        ),
        &mut tally,
    );
    let converged = rerun.status.success() && reconciled.status.success();
    if !converged {
        eprintln!(
            "spill disk full: rerun or reconcile failed: {}{}",
            String::from_utf8_lossy(&rerun.stderr),
            String::from_utf8_lossy(&reconciled.stdout)
        );
    }
    if converged {
        tally.faults_survived = tally.faults_injected;
    }
    tally
}

fn report_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability")
}

#[test]
fn every_fault_converges_after_a_rerun() {
    let work = Mutex::new(scenarios());
    let total = Mutex::new(Tally::default());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                loop {
                    let next = work.lock().expect("queue").pop();
                    let Some((seed, fault)) = next else { break };
                    let t = scenario(seed, &fault, &rt);
                    total.lock().expect("tally").add(&t);
                }
            });
        }
    });
    total.lock().expect("tally").add(&spill_scenario());
    let t = *total.lock().expect("tally");
    let faults = json!({
        "scenarios": t.scenarios,
        "faults_injected": t.faults_injected,
        "faults_survived": t.faults_survived,
        "rows_lost": t.rows_lost,
        "rows_mismatched_vs_oracle": t.rows_mismatched,
        "duplicate_keys": t.duplicate_keys,
        "double_applied_batches": t.double_applied_batches,
        "watermark_regressions": t.watermark_regressions,
        "exit_70_seen": t.exit_70_seen,
        "io_faults_misclassified": t.io_faults_misclassified,
    });
    std::fs::create_dir_all(report_dir()).expect("report dir");
    std::fs::write(
        report_dir().join("faults.json"),
        serde_json::to_string_pretty(&faults).expect("json"),
    )
    .expect("write");
    let mut board = faults.clone();
    if let Ok(text) = std::fs::read_to_string(report_dir().join("bad_inputs.json")) {
        if let Ok(bad) = serde_json::from_str::<Value>(&text) {
            board["bad_inputs_tried"] = bad["bad_inputs_tried"].clone();
            board["bad_inputs_rejected_cleanly"] = bad["bad_inputs_rejected_cleanly"].clone();
        }
    }
    // Ingest faults (tests/it/ingest.rs), when that suite already ran.
    if let Ok(text) = std::fs::read_to_string(report_dir().join("ingest_faults.json")) {
        if let Ok(Value::Object(ingest)) = serde_json::from_str::<Value>(&text) {
            for (k, v) in ingest {
                board[k] = v;
            }
        }
    }
    // The aggregate's and the dimension's faults (tests/it/kind_faults.rs), when they ran.
    for (kind, file) in [
        ("aggregate", "aggregate_faults"),
        ("dimension", "dimension_faults"),
        ("aggregate", "aggregate_foreign"),
        ("dimension", "dimension_foreign"),
        ("ingest", "ingest_foreign"),
    ] {
        let path = report_dir().join(format!("{file}.json"));
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(Value::Object(figures)) = serde_json::from_str::<Value>(&text) {
                for (k, v) in figures {
                    board[format!("{kind}_{k}")] = v;
                }
            }
        }
    }
    // Foreign changes (tests/it/foreign.rs), when that suite already ran.
    if let Ok(text) = std::fs::read_to_string(report_dir().join("foreign.json")) {
        if let Ok(Value::Object(foreign)) = serde_json::from_str::<Value>(&text) {
            for (k, v) in foreign {
                board[k] = v;
            }
        }
    }
    std::fs::write(
        report_dir().join("scoreboard.json"),
        serde_json::to_string_pretty(&board).expect("json"),
    )
    .expect("write");
    println!(
        "reliability scoreboard: {}",
        serde_json::to_string_pretty(&board).expect("json")
    );
    assert!(t.faults_injected >= 80, "too few faults fired: {t:?}");
    assert_eq!(t.faults_survived, t.faults_injected, "{t:?}");
    assert_eq!(
        (
            t.rows_lost,
            t.rows_mismatched,
            t.duplicate_keys,
            t.double_applied_batches,
            t.watermark_regressions
        ),
        (0, 0, 0, 0, 0),
        "{t:?}"
    );
    assert_eq!(
        (t.exit_70_seen, t.io_faults_misclassified),
        (0, 0),
        "an outside-world fault ended in the wrong exit code: {t:?}"
    );
}

/// Two runs of `pipeline` at `now`: the slow one paused at `point` while the fast one runs
/// whole, then released. Both must succeed; their summaries (fast, slow).
fn race(pipeline: &Path, now: i64, point: &str) -> (Value, Value, String) {
    let pause = Pause::new();
    let slow = command(pipeline, now, false, Some(pause.at(point)))
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn");
    pause.wait_reached();
    let fast = output(&mut command(pipeline, now, false, None));
    assert!(
        fast.status.success(),
        "{}",
        String::from_utf8_lossy(&fast.stderr)
    );
    pause.release();
    let slow = slow.wait_with_output().expect("wait");
    assert!(
        slow.status.success(),
        "{}",
        String::from_utf8_lossy(&slow.stderr)
    );
    (
        summary(&fast).expect("json"),
        summary(&slow).expect("json"),
        String::from_utf8_lossy(&slow.stderr).into_owned(),
    )
}

/// The loser of a commit race says so in one warning line: what happened and that it plans
/// again — not the advice to rerun the command (or delta-rs' to rerun the query), which the
/// run is already doing.
fn lost_race_said_once(log: &str) {
    let said: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.contains("another writer committed first"))
        .take_while(|l| !l.contains("failed validation"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("replans=1"), "{log}");
    assert!(!said[0].to_lowercase().contains("rerun"), "{log}");
}

/// Two runs of the same pipeline at once (as if on two hosts): the one that commits second
/// finds the target moved, plans again, and finds nothing left to do. One commit, no loss.
#[test]
fn concurrent_runs_commit_once_and_the_loser_replans() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "10m", "soft", "");
    let rows = history(7);
    rt.block_on(append(&bronze(dir.path()), &rows[0]));
    assert!(output(&mut command(&pipeline, batch_time(0), false, None))
        .status
        .success());
    rt.block_on(append(&bronze(dir.path()), &rows[1]));
    let now = batch_time(1);
    let (fast_summary, slow_summary, slow_log) =
        race(&pipeline, now, "cdc_merge.incremental.before_commit");
    assert!(fast_summary["target_version"].is_u64(), "{fast_summary}");
    assert_eq!(slow_summary["num_replans"], 1, "{slow_summary}");
    lost_race_said_once(&slow_log);
    assert!(
        slow_summary["target_version"].is_null(),
        "the loser must not commit again: {slow_summary}"
    );
    let landed: Vec<Change> = rows[..2].concat();
    assert_eq!(
        rt.block_on(read_target(&silver(dir.path()))),
        oracle(&landed, now, false)
    );
    assert_eq!(rt.block_on(double_applied(&silver(dir.path()))), 0);
}

/// Two bootstraps of one pipeline at once: the one that loses the race to create the target
/// plans again (and finds the winner's rows) instead of writing every row a second time.
#[test]
fn concurrent_bootstraps_create_the_target_once() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "10m", "soft", "");
    let rows = history(7);
    rt.block_on(append(&bronze(dir.path()), &rows[0]));
    let now = batch_time(0);
    let (fast_summary, slow_summary, slow_log) =
        race(&pipeline, now, "cdc_merge.full_reload.after_validate");
    lost_race_said_once(&slow_log);
    assert_eq!(fast_summary["mode"], "bootstrap", "{fast_summary}");
    assert_eq!(slow_summary["num_replans"], 1, "{slow_summary}");
    assert!(
        slow_summary["target_version"].is_null(),
        "the loser must not commit its rows on top of the winner's: {slow_summary}"
    );
    assert_eq!(
        rt.block_on(read_target(&silver(dir.path()))),
        oracle(&rows[0], now, false)
    );
    assert_eq!(rt.block_on(double_applied(&silver(dir.path()))), 0);
}

/// An incremental run racing a full reload of the same target, and an appender on the source:
/// the run re-plans after the reload and the appended rows are merged by the next run.
#[test]
fn run_against_reload_and_source_appender() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "10m", "soft", "");
    let rows = history(11);
    rt.block_on(append(&bronze(dir.path()), &rows[0]));
    assert!(output(&mut command(&pipeline, batch_time(0), false, None))
        .status
        .success());
    rt.block_on(append(&bronze(dir.path()), &rows[1]));
    let now = batch_time(1);
    let pause = Pause::new();
    let slow = command(
        &pipeline,
        now,
        false,
        Some(pause.at("cdc_merge.incremental.after_read")),
    )
    .spawn()
    .expect("spawn");
    pause.wait_reached();
    // While the run sleeps with its source version pinned: the source grows and the target is
    // rebuilt by a full reload.
    rt.block_on(append(&bronze(dir.path()), &rows[2]));
    let reload = output(&mut command(&pipeline, now, true, None));
    assert!(
        reload.status.success(),
        "{}",
        String::from_utf8_lossy(&reload.stderr)
    );
    pause.release();
    let slow = slow.wait_with_output().expect("wait");
    assert!(
        slow.status.success(),
        "{}",
        String::from_utf8_lossy(&slow.stderr)
    );
    let landed: Vec<Change> = rows.concat();
    let later = batch_time(2);
    assert!(output(&mut command(&pipeline, later, false, None))
        .status
        .success());
    assert_eq!(
        rt.block_on(read_target(&silver(dir.path()))),
        oracle(&landed, later, false)
    );
}

fn tidemark_out(args: &[&str]) -> Output {
    process()
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("spawn")
}

/// A crash between the data files and the commit leaves an orphan file: harmless, reported by
/// `maintain`, kept while it is inside the retention window (it could be a concurrent writer's
/// in-flight file) and vacuumed once older; unsafe retentions are refused; compaction keeps
/// the content.
#[test]
fn maintain_reports_and_vacuums_orphans_and_refuses_unsafe_retention() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "10m", "soft", "");
    let rows = history(3);
    let mut landed = Vec::new();
    for (b, batch) in rows.iter().enumerate() {
        rt.block_on(append(&bronze(dir.path()), batch));
        landed.extend(batch.clone());
        if b == 2 {
            // (batch 1 has a quarantined row: its commit to the quarantine table would be hit first)
            let crashed = output(&mut command(
                &pipeline,
                batch_time(b),
                false,
                Some("store.put_commit=abort".into()),
            ));
            assert!(!crashed.status.success());
        }
        assert!(output(&mut command(&pipeline, batch_time(b), false, None))
            .status
            .success());
    }
    // Insert-only hours add a new small file each (nothing to rewrite).
    for n in 0..2 {
        let fresh = vec![Change::upsert(
            &format!("new{n}"),
            batch_time(2) - MIN,
            batch_time(2),
            n,
        )];
        rt.block_on(append(&bronze(dir.path()), &fresh));
        landed.extend(fresh);
        assert!(output(&mut command(&pipeline, batch_time(2), false, None))
            .status
            .success());
    }
    let expected = oracle(&landed, batch_time(2), false);
    let target = silver(dir.path());
    let t = target.to_str().expect("utf8");

    let refused = tidemark_out(&["maintain", t, "--retention", "1h"]);
    assert_eq!(refused.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("deletedFileRetentionDuration"));

    // Through the pipeline: compaction sorts the small files by the business key.
    let out = tidemark_out(&[
        "maintain",
        pipeline.to_str().expect("utf8"),
        "--output",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["files_vacuumed"], 0, "{report}");
    assert!(
        report["files_unreferenced_within_retention"].as_u64() >= Some(1),
        "the orphan is reported: {report}"
    );
    assert!(
        report["files_compacted"].as_u64() >= Some(2),
        "small files were compacted: {report}"
    );
    assert_eq!(
        rt.block_on(read_target(&target)),
        expected,
        "compaction keeps the content"
    );

    // Age every data file past the retention: the orphan (and the files compaction removed)
    // are vacuumed; live files stay.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find '{t}' -name '*.parquet' -exec touch -d '10 days ago' {{}} +"
        ))
        .status()
        .expect("touch");
    assert!(status.success());
    let out = tidemark_out(&["maintain", t, "--no-compact", "--output", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        report["files_vacuumed"].as_u64() >= Some(1),
        "the crashed run's orphans: {report}"
    );
    assert_eq!(
        rt.block_on(read_target(&target)),
        expected,
        "vacuum keeps the content"
    );
    assert!(output(&mut command(&pipeline, batch_time(2), false, None))
        .status
        .success());
    assert_eq!(rt.block_on(read_target(&target)), expected);
}
