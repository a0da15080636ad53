//! The fault suite for the kinds the merge's suite (`faults.rs`) and the ingest's
//! (`ingest.rs`) do not cover: an aggregate and a dimension crashed at every phase of an
//! incremental run and of a full reload (error, panic, abort ≈ kill -9), then run again with the
//! same command. Each rerun must converge on the independent oracle of the kind's tests —
//! nothing lost, nothing booked twice — and no exit 70 but an injected panic's. The figures go
//! to `target/reliability/<kind>_faults.json`, which the scoreboard merges.

use std::path::PathBuf;

use crate::common::*;

const ACTIONS: &[&str] = &["error", "panic", "abort"];

/// What a kind's fault suite counted.
#[derive(Debug, Default, serde::Serialize)]
struct Board {
    faults_injected: u64,
    faults_survived: u64,
    rows_different_from_oracle: u64,
    exit_70_seen: u64,
}

impl Board {
    /// Counts one faulted run and its rerun; `converged` compares the result with the oracle.
    fn count(&mut self, action: &str, faulted: &Out, rerun: &Out, differs: u64) {
        self.faults_injected += 1;
        if rerun.code == 0 && differs == 0 {
            self.faults_survived += 1;
        }
        self.rows_different_from_oracle += differs;
        // (an injected panic stands for a bug: its 70 is expected)
        let seventy = [faulted, rerun].iter().filter(|o| o.code == 70).count() as u64;
        if action != "panic" || rerun.code == 70 {
            self.exit_70_seen += seventy;
        }
    }

    fn write(&self, kind: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let text = serde_json::to_string_pretty(self).expect("json");
        std::fs::write(dir.join(format!("{kind}_faults.json")), text).expect("write");
        println!("{kind} faults: {self:?}");
    }
}

fn faulted(cmd: &mut assert_cmd::Command, point: &str, action: &str) -> Out {
    exec(cmd.env("TIDEMARK_FAILPOINTS", format!("{point}={action}")))
}

/// An aggregate: six days published, then late rows (one for a closed day: an adjustment, one
/// for an open day: a restatement); the incremental run and then a full reload crashed at each
/// point, and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_converges_after_a_crash_at_every_phase() {
    use crate::aggregate::{
        at, oracle, pay, pipeline, replace_source, six_days, with_adjustments, write_source,
    };
    const INCREMENTAL: &[&str] = &[
        "aggregate.incremental.after_plan",
        "aggregate.incremental.after_read",
        "aggregate.incremental.after_compare",
        "aggregate.incremental.committed_adjustments",
        "aggregate.incremental.committed_target",
        "aggregate.incremental.after_write",
        "store.put_data",
        "store.put_commit",
    ];
    const RELOAD: &[&str] = &[
        "aggregate.full_reload.after_plan",
        "aggregate.full_reload.after_write",
        "store.put_data",
        "store.put_commit",
    ];
    let mut board = Board::default();
    for (points, reload) in [(INCREMENTAL, false), (RELOAD, true)] {
        for point in points {
            for action in ACTIONS {
                let dir = tempfile::tempdir().expect("tmp");
                let d = dir.path();
                let mut pays = six_days();
                write_source(d, &pays).await;
                let p = pipeline(d, "recompute: { lookback: 2d }\nafter_close: adjust\n");
                let run = |extra: &[&str]| {
                    let mut c = tidemark_at(at(2024, 4, 10, 12, 0));
                    c.arg("run")
                        .arg(&p)
                        .args(["--logical-date", "2024-04-06", "--output", "json"])
                        .args(extra);
                    c
                };
                assert_eq!(exec(&mut run(&[])).code, 0);
                pays.push(pay("late2", at(2024, 4, 2, 15, 0), "m1", 55));
                pays.push(pay("late5", at(2024, 4, 5, 15, 0), "m2", 66));
                replace_source(d, &pays).await;
                let extra: &[&str] = if reload { &["--full-reload"] } else { &[] };
                let crashed = faulted(&mut run(extra), point, action);
                assert_ne!(crashed.code, 0, "{point}={action}: the failpoint fired");
                let rerun = exec(&mut run(extra));
                let got = with_adjustments(d).await;
                let want = oracle(&pays);
                let differs = want.iter().filter(|(k, v)| got.get(k) != Some(v)).count()
                    + got.keys().filter(|k| !want.contains_key(k)).count();
                board.count(action, &crashed, &rerun, differs as u64);
                assert_eq!(rerun.code, 0, "{point}={action}: {}", rerun.stderr);
                assert_eq!(
                    got, want,
                    "{point}={action}: gold + adjustments vs the recompute"
                );
            }
        }
    }
    board.write("aggregate");
    assert_eq!(board.faults_survived, board.faults_injected, "{board:?}");
    assert_eq!(board.exit_70_seen, 0, "{board:?}");
}

/// A dimension (SCD2): merchants with history, then a late change and a delete; the incremental
/// run and then a full reload crashed at each point, and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dimension_converges_after_a_crash_at_every_phase() {
    use crate::dimension::{del, land, oracle, pipeline, rec, table};
    const INCREMENTAL: &[&str] = &[
        "dimension.incremental.after_plan",
        "dimension.incremental.after_read",
        "dimension.incremental.after_compare",
        "dimension.incremental.after_write",
        "store.put_data",
        "store.put_commit",
    ];
    const RELOAD: &[&str] = &[
        "dimension.full_reload.after_plan",
        "dimension.full_reload.after_read",
        "dimension.full_reload.after_compare",
        "dimension.full_reload.after_write",
        "store.put_data",
        "store.put_commit",
    ];
    let mut board = Board::default();
    for (points, reload) in [(INCREMENTAL, false), (RELOAD, true)] {
        for point in points {
            for action in ACTIONS {
                let dir = tempfile::tempdir().expect("tmp");
                let d = dir.path();
                let p: PathBuf = pipeline(d, "scd2");
                let mut recs = vec![
                    rec("m1", T0, "retail", "Anna"),
                    rec("m2", T0 + MIN, "travel", "Bo"),
                    rec("m1", T0 + 2 * HOUR, "travel", "Anna"),
                ];
                land(d, &recs).await;
                let run = |now: i64, extra: &[&str]| {
                    let mut c = tidemark_at(now);
                    c.arg("run").arg(&p).args(["--output", "json"]).args(extra);
                    c
                };
                assert_eq!(exec(&mut run(T0 + 3 * HOUR, &[])).code, 0);
                let late = vec![
                    rec("m1", T0 + HOUR, "food", "Anna"),
                    del("m2", T0 + 4 * HOUR),
                ];
                land(d, &late).await;
                recs.extend(late);
                let extra: &[&str] = if reload { &["--full-reload"] } else { &[] };
                let now = T0 + 5 * HOUR;
                let crashed = faulted(&mut run(now, extra), point, action);
                assert_ne!(crashed.code, 0, "{point}={action}: the failpoint fired");
                let rerun = exec(&mut run(now, extra));
                let got = table(d, true).await;
                let want = oracle(&recs, true);
                let differs = want.iter().filter(|r| !got.contains(r)).count()
                    + got.iter().filter(|r| !want.contains(r)).count();
                board.count(action, &crashed, &rerun, differs as u64);
                assert_eq!(rerun.code, 0, "{point}={action}: {}", rerun.stderr);
                assert_eq!(got, want, "{point}={action}: the table vs the fold");
            }
        }
    }
    board.write("dimension");
    assert_eq!(board.faults_survived, board.faults_injected, "{board:?}");
    assert_eq!(board.exit_70_seen, 0, "{board:?}");
}
