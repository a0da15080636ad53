//! Foreign changes for the kinds the merge's suite (`foreign.rs`) does not drive: an
//! aggregate's and a dimension's source deleted and recreated, rows deleted from it, restored
//! to an older version; an ingest's bronze restored by someone else. Each ends in tables equal
//! to the kind's oracle, or in a loud refusal (exit 65 naming the `--full-reload`) after which
//! the reload does — never exit 0 with a wrong table. Figures per kind go to
//! `target/reliability/<kind>_foreign.json`, which the scoreboard merges.

use std::path::{Path, PathBuf};

use crate::common::*;

/// What a kind's foreign-change scenarios saw.
#[derive(Debug, Default, serde::Serialize)]
struct Figures {
    foreign_scenarios: u64,
    foreign_refused: u64,
    foreign_commands: u64,
    foreign_silent_wrong_results: u64,
    foreign_exit_70_seen: u64,
}

impl Figures {
    fn command(&mut self, out: Out) -> Out {
        self.foreign_commands += 1;
        if out.code == 70 {
            self.foreign_exit_70_seen += 1;
        }
        out
    }

    /// The run after a foreign change: 0 with `correct` true, or 65 naming the reload.
    fn judge(&mut self, out: &Out, correct: bool) -> bool {
        self.foreign_scenarios += 1;
        match out.code {
            0 if !correct => {
                self.foreign_silent_wrong_results += 1;
                false
            }
            0 => true,
            65 if out.stderr.contains("--full-reload") => {
                self.foreign_refused += 1;
                true
            }
            _ => false,
        }
    }

    fn write(&self, kind: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let text = serde_json::to_string_pretty(self).expect("json");
        std::fs::write(dir.join(format!("{kind}_foreign.json")), text).expect("write");
        println!("{kind} foreign changes: {self:?}");
    }
}

async fn open(path: &Path) -> deltalake::DeltaTable {
    let url = deltalake::ensure_table_uri(path.to_str().expect("utf8")).expect("url");
    deltalake::open_table(url).await.expect("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_ends_correct_or_refused_after_foreign_changes() {
    use crate::aggregate::{
        at, oracle, pay, pipeline, six_days, with_adjustments, write_source, write_source_as,
    };
    let mut f = Figures::default();
    let now = at(2024, 4, 10, 12, 0);
    let run = |f: &mut Figures, p: &Path, extra: &[&str]| {
        f.command(exec(
            tidemark_at(now)
                .arg("run")
                .arg(p)
                .args(["--logical-date", "2024-04-06", "--output", "json"])
                .args(extra),
        ))
    };
    // Each scenario: the foreign change, and the payments the source holds after it.
    for scenario in ["recreated", "delete", "restore"] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let mut pays = six_days();
        write_source(d, &pays).await;
        let p = pipeline(d, "recompute: { lookback: 2d }\nafter_close: adjust\n");
        assert_eq!(run(&mut f, &p, &[]).code, 0);
        let late = vec![
            pay("late5", at(2024, 4, 5, 15, 0), "m2", 66),
            pay("late6", at(2024, 4, 6, 9, 0), "m1", 77),
        ];
        write_source(d, &late).await;
        assert_eq!(run(&mut f, &p, &[]).code, 0);
        pays.extend(late);
        match scenario {
            "recreated" => {
                std::fs::remove_dir_all(d.join("silver")).expect("rm");
                write_source_as(d, &pays, false).await;
            }
            "delete" => {
                open(&d.join("silver"))
                    .await
                    .delete()
                    .with_predicate("payment_id = 'late6'")
                    .await
                    .expect("delete");
                pays.retain(|p| p.id != "late6");
            }
            _ => {
                open(&d.join("silver"))
                    .await
                    .restore()
                    .with_version_to_restore(0)
                    .await
                    .expect("restore");
                pays.retain(|p| !p.id.starts_with("late"));
            }
        }
        let out = run(&mut f, &p, &[]);
        let correct = out.code == 0 && with_adjustments(d).await == oracle(&pays);
        assert!(
            f.judge(&out, correct),
            "{scenario}: {}\n{}",
            out.stdout,
            out.stderr
        );
        if out.code == 65 {
            assert_eq!(run(&mut f, &p, &["--full-reload"]).code, 0, "{scenario}");
            assert_eq!(
                with_adjustments(d).await,
                oracle(&pays),
                "{scenario}: the reload"
            );
        }
    }
    f.write("aggregate");
    assert_eq!(
        (f.foreign_silent_wrong_results, f.foreign_exit_70_seen),
        (0, 0),
        "{f:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dimension_ends_correct_or_refused_after_foreign_changes() {
    use crate::dimension::{land, oracle, pipeline, rec, table};
    let mut f = Figures::default();
    let run = |f: &mut Figures, p: &Path, now: i64, extra: &[&str]| {
        f.command(exec(
            tidemark_at(now)
                .arg("run")
                .arg(p)
                .args(["--output", "json"])
                .args(extra),
        ))
    };
    for scenario in ["recreated", "delete", "restore"] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let p = pipeline(d, "scd2");
        let first = vec![
            rec("m1", T0, "retail", "Anna"),
            rec("m2", T0 + MIN, "travel", "Bo"),
        ];
        land(d, &first).await;
        assert_eq!(run(&mut f, &p, T0 + HOUR, &[]).code, 0);
        let second = vec![rec("m1", T0 + 2 * HOUR, "food", "Anna")];
        land(d, &second).await;
        assert_eq!(run(&mut f, &p, T0 + 3 * HOUR, &[]).code, 0);
        let mut recs: Vec<_> = first.iter().chain(&second).cloned().collect();
        let raw = d.join("lake/merchants_raw");
        match scenario {
            "recreated" => {
                std::fs::remove_dir_all(&raw).expect("rm");
                land(d, &recs).await;
            }
            "delete" => {
                open(&raw)
                    .await
                    .delete()
                    .with_predicate("merchant_id = 'm2'")
                    .await
                    .expect("delete");
                recs.retain(|r| r.id.as_deref() != Some("m2"));
            }
            _ => {
                open(&raw)
                    .await
                    .restore()
                    .with_version_to_restore(0)
                    .await
                    .expect("restore");
                recs = first.clone();
            }
        }
        let out = run(&mut f, &p, T0 + 4 * HOUR, &[]);
        let correct = out.code == 0 && table(d, true).await == oracle(&recs, true);
        assert!(
            f.judge(&out, correct),
            "{scenario}: {}\n{}",
            out.stdout,
            out.stderr
        );
        if out.code == 65 {
            assert_eq!(run(&mut f, &p, T0 + 4 * HOUR, &["--full-reload"]).code, 0);
            assert_eq!(
                table(d, true).await,
                oracle(&recs, true),
                "{scenario}: the reload"
            );
        }
    }
    f.write("dimension");
    assert_eq!(
        (f.foreign_silent_wrong_results, f.foreign_exit_70_seen),
        (0, 0),
        "{f:?}"
    );
}

/// Bronze restored to an older version by another engine (its RESTORE leaves the run number
/// as it was): refused, and the full reload then holds every landing record once. Bronze
/// deleted and recreated empty: the next run ingests every landing record again, exactly once.
/// (Bronze restored by `tidemark restore`, with or without its record index, is in
/// `contract.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_ends_correct_after_foreign_changes() {
    use crate::ingest::{held_sorted, land, oracle_sorted, pipeline};
    let mut f = Figures::default();
    let run = |f: &mut Figures, d: &Path, now: i64, extra: &[&str]| {
        f.command(exec(
            tidemark_at(now)
                .arg("run")
                .arg(d.join("ingest.yml"))
                .args(extra),
        ))
    };
    for scenario in ["restored", "recreated"] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        pipeline(d, "");
        land(d, "a.jsonl", &[("p1", 1)]);
        assert_eq!(run(&mut f, d, T0, &[]).code, 0);
        land(d, "b.jsonl", &[("p2", 2)]);
        assert_eq!(run(&mut f, d, T0 + HOUR, &[]).code, 0);
        let bronze = d.join("lake/bronze");
        if scenario == "restored" {
            open(&bronze)
                .await
                .restore()
                .with_version_to_restore(0)
                .await
                .expect("restore");
        } else {
            std::fs::remove_dir_all(&bronze).expect("rm");
        }
        land(d, "c.jsonl", &[("p3", 3)]);
        let out = run(&mut f, d, T0 + 2 * HOUR, &[]);
        let want = oracle_sorted(d);
        let correct = held_sorted(d).await == want;
        assert!(f.judge(&out, correct), "{scenario}: {}", out.stderr);
        if out.code == 65 {
            let reload = run(&mut f, d, T0 + 3 * HOUR, &["--full-reload"]);
            assert_eq!(reload.code, 0, "{}", reload.stderr);
            assert_eq!(held_sorted(d).await, want, "{scenario}: the reload");
        }
    }
    f.write("ingest");
    assert_eq!(
        (f.foreign_silent_wrong_results, f.foreign_exit_70_seen),
        (0, 0),
        "{f:?}"
    );
}
