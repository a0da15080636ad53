//! Continuous runs through the binary (issue 33 item 4): `job run --every` for ten minutes of a
//! sped-up clock (`TIDEMARK_TIME_SCALE`) while landing files arrive — several runs, each in the
//! ledger with trigger `continuous`; the live file count of every table stays bounded because
//! compaction keeps in step; gold ends equal to one run over all the data; SIGINT lets the
//! current run finish and exits 0. `run --every` finishes the run under way on SIGTERM. The
//! flags that make no sense on every tick are refused (64).

use crate::common::held::wait_for;
use crate::common::*;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The clock runs this many times faster than the wall clock: 30 s ticks every 0.75 s.
const SCALE: u32 = 40;
/// Where the sped-up clock starts: after every generated arrival (a day from 2024-01-01, then
/// a few hours more).
const ORIGIN: &str = "2024-01-03T00:00:00Z";
/// Live files a table may gain before compaction in step (small, so ten minutes compact).
const COMPACT_AFTER: usize = 4;

fn send(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: sends a signal to the child this test spawned and has not reaped yet.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill failed");
}

/// The three pipelines of the continuous job (landing → bronze → silver → gold by 5-minute
/// windows, final by the watermark) and a bundle whose job `stream` runs them, lake `d/lake`.
fn setup(d: &Path) -> PathBuf {
    let lake = d.join("lake");
    let p = d.join("pipelines");
    std::fs::create_dir_all(&p).expect("mkdir");
    let l = lake.display();
    std::fs::write(p.join("events.yml"), format!(
        "name: events\nkind: ingest\nlanding: {{ uri: \"{l}/landing/payments\", glob: \"events/*.jsonl\" }}\nformat: json\ntarget: {{ uri: \"{l}/bronze\" }}\nschema:\n  payment_id: string not null\n  customer_id: string\n  merchant_id: string\n  amount_cents: long\n  currency: string\n  status: string\n  created_at: timestamp\n  updated_at: timestamp not null\n  op: string not null\nquarantine: {{ uri: \"{l}/quarantine/landing\" }}\n"
    )).expect("write");
    std::fs::write(p.join("payments.yml"), format!(
        "name: payments\nkind: cdc_merge\nsource: {{ uri: \"{l}/bronze\" }}\ntarget: {{ uri: \"{l}/silver\" }}\nkeys: [payment_id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\noverlap: 15m\ndeletes: {{ column: op, values: [D], mode: soft }}\ncolumns: {{ exclude: [op] }}\nquarantine: {{ uri: \"{l}/quarantine/payments\" }}\n"
    )).expect("write");
    std::fs::write(p.join("windowed.yml"), format!(
        "name: windowed\nkind: aggregate\nsource: {{ uri: \"{l}/silver\" }}\ntarget: {{ uri: \"{l}/gold\" }}\nevent_date: {{ column: created_at, time_zone: UTC }}\nwindow: 5m\ngroup_by: [currency]\nmeasures:\n  - {{ name: payments, agg: count }}\n  - {{ name: amount_cents, agg: sum, column: amount_cents }}\nwatermark: {{ delay: 30m, allowed_lateness: 10m }}\n"
    )).expect("write");
    let bundle = d.join("bundle");
    std::fs::create_dir_all(bundle.join("resources")).expect("mkdir");
    std::fs::write(bundle.join("tidemark.yml"), format!(
        "bundle: {{ name: continuous }}\ninclude: [resources/*.yml]\nvariables:\n  lake: {{ description: the lake }}\ntargets:\n  local:\n    default: true\n    variables: {{ lake: \"{l}\" }}\n"
    )).expect("write");
    let task = |key: &str, dep: &str, file: &str| {
        let dep = match dep {
            "" => String::new(),
            d => format!("          depends_on: [{{ task_key: {d} }}]\n"),
        };
        format!(
            "        - task_key: {key}\n{dep}          pipeline_task: {{ pipeline: \"{}\" }}\n",
            p.join(file).display()
        )
    };
    std::fs::write(
        bundle.join("resources/jobs.yml"),
        format!(
            "resources:\n  jobs:\n    stream:\n      tasks:\n{}{}{}",
            task("ingest", "", "events.yml"),
            task("merge", "ingest", "payments.yml"),
            task("gold", "merge", "windowed.yml"),
        ),
    )
    .expect("write");
    bundle
}

fn landing(d: &Path) -> PathBuf {
    d.join("lake/landing/payments")
}

fn generate(d: &Path, next_hour: bool) {
    let mut c = tidemark();
    c.args(["generate", "--landing"]).arg(landing(d));
    if next_hour {
        c.arg("--next-hour");
    } else {
        c.args(["--payments", "1500", "--days", "1"]);
    }
    let out = exec(&mut c);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// The binary on the sped-up clock.
fn sped_up() -> std::process::Command {
    let mut c = process();
    c.env("TIDEMARK_FAKE_NOW", ORIGIN)
        .env("TIDEMARK_TIME_SCALE", SCALE.to_string());
    c
}

/// Collects a child's stdout lines as they come.
fn lines_of(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().expect("stdout");
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().expect("lines").push(line);
        }
    });
    lines
}

fn count(lines: &Arc<Mutex<Vec<String>>>) -> usize {
    lines.lock().expect("lines").len()
}

/// A table's live files, from its JSON commits (all kept: a checkpoint never replaces them
/// here).
fn live_files(table: &Path) -> usize {
    files(table).0
}

/// A table's live files, and every file its commits ever added.
fn files(table: &Path) -> (usize, usize) {
    let log = table.join("_delta_log");
    let mut commits: Vec<PathBuf> = std::fs::read_dir(&log)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| {
            p.file_stem()
                .is_some_and(|s| s.to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    commits.sort();
    let mut live = std::collections::BTreeSet::new();
    let mut added = 0;
    for c in commits {
        let Ok(text) = std::fs::read_to_string(&c) else {
            continue;
        };
        for line in text.lines() {
            let Ok(action) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(p) = action["add"]["path"].as_str() {
                added += 1;
                live.insert(p.to_string());
            }
            if let Some(p) = action["remove"]["path"].as_str() {
                live.remove(p);
            }
        }
    }
    (live.len(), added)
}

/// A first plain run of the ingest, then an hour more of landing files: the loop's first run
/// is an incremental one (where the tests hold it).
fn first_run(d: &Path) {
    let out = exec(
        tidemark_at(0)
            .env("TIDEMARK_FAKE_NOW", ORIGIN)
            .arg("run")
            .arg(d.join("pipelines/events.yml")),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    generate(d, true);
}

/// Every Delta table under the lake but the ledger (the job's companion tables included,
/// whatever they are named).
fn tables(d: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        if p.join("_delta_log").is_dir() {
            out.push(p.to_path_buf());
            return;
        }
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            if e.path().is_dir() && e.file_name() != "_tidemark" && e.file_name() != "landing" {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&d.join("lake"), &mut out);
    out.sort();
    out
}

/// Gold's rows as sorted text lines (every column but when it was computed).
async fn gold_rows(d: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    for b in read_all(&d.join("lake/gold")).await {
        let schema = b.schema();
        let cols: Vec<usize> = (0..schema.fields().len())
            .filter(|i| {
                let n = schema.field(*i).name();
                !n.contains("computed") && !n.contains("as_of") && !n.contains("run")
            })
            .collect();
        let fmt = arrow::util::display::FormatOptions::default();
        let formatters: Vec<_> = cols
            .iter()
            .map(|i| {
                arrow::util::display::ArrayFormatter::try_new(b.column(*i).as_ref(), &fmt)
                    .expect("fmt")
            })
            .collect();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = cols
                .iter()
                .zip(&formatters)
                .map(|(i, f)| format!("{}={}", schema.field(*i).name(), f.value(r)))
                .collect();
            rows.push(cells.join(" "));
        }
    }
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn job_every_runs_ten_minutes_with_bounded_files_and_stops_on_sigint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let bundle = setup(d);
    generate(d, false);
    let mut child = sped_up()
        .args(["job", "run", "stream", "--every", "30s", "--compact-after"])
        .arg(COMPACT_AFTER.to_string())
        .args(["--output", "json", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = lines_of(&mut child);
    let started = Instant::now();
    let ten_minutes = Duration::from_secs(600 / u64::from(SCALE));
    let mut most: std::collections::BTreeMap<PathBuf, usize> = Default::default();
    let sample = |most: &mut std::collections::BTreeMap<PathBuf, usize>| {
        for t in tables(d) {
            let n = live_files(&t);
            let m = most.entry(t).or_default();
            *m = (*m).max(n);
        }
    };
    // New landing files while the loop runs, each ingested by a run of its own: after each
    // landing, two more runs end (the first may have started before the files landed).
    for _ in 0..8 {
        generate(d, true);
        let seen = count(&lines);
        wait_for("two runs after a landing", || {
            sample(&mut most);
            count(&lines) >= seen + 2
        });
    }
    wait_for("ten minutes of the clock", || {
        sample(&mut most);
        started.elapsed() >= ten_minutes
    });
    send(&child, libc::SIGINT);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines = lines.lock().expect("lines").clone();
    let (last, reports) = lines.split_last().expect("output");
    let last: Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(last["stopped"]["signal"], "SIGINT", "{last}");
    let runs = last["stopped"]["runs"].as_u64().expect("runs");
    assert_eq!(runs as usize, reports.len(), "one JSON line per run");
    assert!(
        runs >= 5,
        "ten clock-minutes of 30 s ticks ran {runs} times: {stderr}"
    );
    let reports: Vec<Value> = reports
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON report per line"))
        .collect();
    for r in &reports {
        assert_eq!(r["status"], "succeeded", "{r}");
        assert_eq!(r["trigger"], "continuous", "{r}");
    }
    let compactions = reports
        .iter()
        .filter(|r| r.get("compactions").is_some())
        .count();
    assert!(compactions >= 1, "compaction kept in step: {reports:?}");

    // Every attempt is in the ledger, as a continuous run.
    let rows = crate::common::held::bundle_ledger(tidemark(), &bundle);
    let run_ids: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r["run_id"].as_str()).collect();
    assert_eq!(run_ids.len() as u64, runs, "{rows:?}");
    assert_eq!(rows.len() as u64, runs * 3, "three tasks per run: {rows:?}");
    for r in &rows {
        assert_eq!(r["trigger"], "continuous", "{r}");
        assert_eq!(r["status"], "succeeded", "{r}");
    }

    // The live file count of every table stayed bounded — what compaction leaves (1), plus
    // compact_after — although bronze got a commit from each of 8 landings.
    sample(&mut most);
    assert!(most.len() >= 5, "{most:?}");
    let (_, added) = files(&d.join("lake/bronze"));
    assert!(added > COMPACT_AFTER + 1, "bronze got {added} files in all");
    for (table, n) in &most {
        assert!(
            *n <= COMPACT_AFTER + 1,
            "{} reached {n} live files (compact_after {COMPACT_AFTER}): {most:?}",
            table.display()
        );
    }

    // Gold equals one run over all the data.
    let again = tempfile::tempdir().expect("tempdir");
    let a = again.path();
    let bundle_a = setup(a);
    copy_dir(&landing(d), &landing(a));
    let once = output(
        tidemark_process(0)
            .env("TIDEMARK_FAKE_NOW", "2024-01-03T00:10:00Z")
            .args(["job", "run", "stream", "--bundle"])
            .arg(&bundle_a),
    );
    assert_eq!(once.code, 0, "{}", once.stderr);
    let (continuous, single) = (gold_rows(d).await, gold_rows(a).await);
    assert!(!single.is_empty());
    assert_eq!(continuous, single);
}

#[tokio::test(flavor = "multi_thread")]
async fn run_every_finishes_the_run_under_way_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    setup(d);
    generate(d, false);
    first_run(d);
    let pipeline = d.join("pipelines/events.yml");
    let pause = Pause::new();
    let mut child = sped_up()
        .env(
            "TIDEMARK_FAILPOINTS",
            pause.at("ingest.incremental.before_commit"),
        )
        .arg("run")
        .arg(&pipeline)
        .args(["--every", "1m", "--output", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = lines_of(&mut child);
    // The first run is held before its commit when SIGTERM arrives: it still commits.
    pause.wait_reached();
    send(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    pause.release();
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("SIGTERM received"), "{stderr}");
    let lines = lines.lock().expect("lines").clone();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let run: Value = serde_json::from_str(&lines[0]).expect("the run's summary");
    assert_eq!(run["pipeline"], "events", "{run}");
    let stop: Value = serde_json::from_str(&lines[1]).expect("the stop line");
    assert_eq!(stop["stopped"]["signal"], "SIGTERM");
    assert_eq!(stop["stopped"]["runs"], 1);
    assert_eq!(
        live_files(&d.join("lake/bronze")),
        2,
        "the run under way committed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn run_every_text_reports_each_run_and_a_second_signal_stops_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    setup(d);
    generate(d, false);
    first_run(d);
    let rows_before = count_rows(&d.join("lake/bronze")).await;
    let pause = Pause::new();
    let mut child = sped_up()
        .env(
            "TIDEMARK_FAILPOINTS",
            pause.at("ingest.incremental.before_commit"),
        )
        .arg("run")
        .arg(d.join("pipelines/events.yml"))
        .args(["--every", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let _lines = lines_of(&mut child);
    pause.wait_reached();
    send(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    send(&child, libc::SIGINT);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("received twice"), "{stderr}");
    pause.release();
    assert_eq!(
        count_rows(&d.join("lake/bronze")).await,
        rows_before,
        "the stopped run committed nothing"
    );
}

#[test]
fn every_refuses_one_off_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let bundle = setup(d);
    let gold = d.join("pipelines/windowed.yml");
    for flags in [
        &["--full-reload"][..],
        &["--dry-run"],
        &["--logical-date", "2024-01-01"],
        &["--from", "2024-01-01", "--to", "2024-01-02"],
    ] {
        let out = exec(
            tidemark()
                .arg("run")
                .arg(&gold)
                .args(["--every", "30s"])
                .args(flags),
        );
        assert_eq!(out.code, 64, "{flags:?}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("--every runs the pipeline incrementally"),
            "{}",
            out.stderr
        );
    }
    let out = exec(
        tidemark()
            .args([
                "job",
                "run",
                "stream",
                "--every",
                "30s",
                "--full-reload",
                "--bundle",
            ])
            .arg(&bundle),
    );
    assert_eq!(out.code, 64, "{}", out.stderr);
    assert!(out.stderr.contains("--every"), "{}", out.stderr);
    for bad in ["500ms", "soon"] {
        let out = exec(tidemark().arg("run").arg(&gold).args(["--every", bad]));
        assert_eq!(out.code, 64, "{bad}: {}", out.stderr);
    }
    let out =
        exec(
            tidemark()
                .arg("run")
                .arg(&gold)
                .args(["--compact-after", "0", "--every", "1m"]),
        );
    assert_eq!(out.code, 64, "{}", out.stderr);
}

#[test]
fn a_continuous_job_is_validated_and_summarised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let bundle = setup(d);
    let jobs = bundle.join("resources/jobs.yml");
    let text = std::fs::read_to_string(&jobs).expect("read");
    // `tidemark bundle <command>` with the job `stream` given `settings` (its indented lines)
    let with = |settings: &str, command: &str| {
        let job = text.replace("    stream:\n", &format!("    stream:\n{settings}"));
        std::fs::write(&jobs, job).expect("write");
        exec(
            tidemark()
                .args(["bundle", command, "--bundle"])
                .arg(&bundle),
        )
    };
    let out = with(
        "      continuous: { every: 30s, compact_after: 16 }\n",
        "summary",
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("continuous: every 30s (UNPAUSED)"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("after 16 new files"), "{}", out.stdout);
    let out = with(
        "      schedule: { quartz_cron_expression: \"0 * * * * ?\", timezone_id: UTC }\n      continuous: { every: 30s }\n",
        "validate",
    );
    assert_eq!(out.code, 78, "{}", out.stdout);
    assert!(out.stdout.contains("jobs.yml:5:"), "{}", out.stdout);
    assert!(
        out.stdout.contains("both `schedule:` and `continuous:`"),
        "{}",
        out.stdout
    );
    let out = with("      continuous: { every: 10ms }\n", "validate");
    assert_eq!(out.code, 78, "{}", out.stdout);
    assert!(
        out.stdout.contains("shorter than a second"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scheduler_runs_a_continuous_job_back_to_back_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let bundle = setup(d);
    let jobs = bundle.join("resources/jobs.yml");
    let text = std::fs::read_to_string(&jobs).expect("read");
    std::fs::write(
        &jobs,
        text.replace(
            "    stream:\n",
            "    stream:\n      continuous: { every: 30s, compact_after: 4 }\n",
        ),
    )
    .expect("write");
    generate(d, false);
    let mut child = sped_up()
        .args(["scheduler", "--bundle"])
        .arg(&bundle)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = lines_of(&mut child);
    let ledger = || {
        let out = exec(
            tidemark()
                .args(["runs", "--limit", "100", "--output", "json", "--bundle"])
                .arg(&bundle),
        );
        serde_json::from_str::<Value>(out.stdout.trim())
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    };
    for _ in 0..3 {
        generate(d, true);
        let before = ledger().len();
        wait_for("two more runs", || ledger().len() >= before + 6);
    }
    send(&child, libc::SIGTERM);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let said = lines.lock().expect("lines").join("\n");
    assert!(said.contains("continuous runs"), "{said}");
    let rows = ledger();
    assert!(rows.len() >= 18, "{rows:?}");
    for r in &rows {
        assert_eq!(r["trigger"], "continuous", "{r}");
        assert!(
            r["status"] == "succeeded" || r["status"] == "cancelled",
            "no skip rows for ticks inside a run: {r}"
        );
    }
}
