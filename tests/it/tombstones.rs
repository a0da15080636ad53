//! Bounded tombstones through the binary (`deletes.retain`): `maintain` removes the tombstones
//! older than the horizon and records their keys first; a late version of such a key at or
//! before its delete is quarantined as `deleted_key_resurrection` (never re-inserted), a
//! re-delivered delete is skipped, a newer version is a real re-creation; a rerun of
//! `maintain` is harmless; a full reload and reconcile agree with the incremental target.

use crate::common;

use std::path::Path;

use common::*;

const DAY: i64 = 24 * HOUR;

fn pipeline(dir: &Path, deletes: &str) -> std::path::PathBuf {
    let p = write_pipeline(dir, "15m", "soft", "");
    let text = std::fs::read_to_string(&p).expect("read");
    let text = text.replace(
        "deletes: { column: op, values: [D], mode: soft }",
        &format!("deletes: {{ column: op, values: [D], mode: soft{deletes} }}"),
    );
    std::fs::write(&p, text).expect("write");
    p
}

fn json(out: &Out) -> serde_json::Value {
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn run(p: &Path, now: i64, extra: &[&str]) -> serde_json::Value {
    json(&exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"])
            .args(extra),
    ))
}

fn maintain(p: &Path, now: i64) -> serde_json::Value {
    json(&exec(
        tidemark_at(now)
            .arg("maintain")
            .arg(p)
            .args(["--output", "json"]),
    ))
}

fn resurrections(s: &serde_json::Value) -> u64 {
    s["expectations"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["name"] == "deleted_key_resurrection"))
        .and_then(|o| o["failed"].as_u64())
        .unwrap_or_else(|| panic!("no deleted_key_resurrection count in {s}"))
}

/// (id, deleted) of every target row.
async fn held(d: &Path) -> Vec<(String, bool)> {
    read_target(&silver(d))
        .await
        .into_iter()
        .map(|r| (r.id, r.deleted == Some(true)))
        .collect()
}

#[tokio::test]
async fn expired_tombstones_go_and_their_keys_stay_deleted() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, ", retain: 1d");
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0, T0, 1),
            Change::upsert("b", T0, T0, 2),
            Change::upsert("c", T0, T0, 3),
            Change::delete("a", T0 + HOUR, T0 + HOUR),
        ],
    )
    .await;
    run(&p, T0 + 2 * HOUR, &[]);
    append(
        &bronze(d),
        &[Change::delete("b", T0 + 47 * HOUR, T0 + 47 * HOUR)],
    )
    .await;
    run(&p, T0 + 2 * DAY, &[]);
    assert_eq!(
        held(d).await,
        vec![("a".into(), true), ("b".into(), true), ("c".into(), false)]
    );

    // Two days in: a's tombstone (an hour in) is past the 1-day horizon, b's (47 h) is not.
    let m = maintain(&p, T0 + 2 * DAY);
    assert_eq!(m["tombstones"]["tombstones"], 1, "{m}");
    assert_eq!(m["tombstones"]["recorded"], 1, "{m}");
    assert_eq!(held(d).await, vec![("b".into(), true), ("c".into(), false)]);
    let removed_uri = format!("{}_removed_keys", silver(d).display());
    assert_eq!(
        m["tombstones"]["removed_keys_uri"].as_str(),
        Some(removed_uri.as_str())
    );
    let removed = read_all(Path::new(&removed_uri)).await;
    assert_eq!(strings(&removed, "id"), vec!["a"]);
    // A rerun finds nothing more to remove.
    let again = maintain(&p, T0 + 2 * DAY);
    assert_eq!(again["tombstones"]["tombstones"], 0, "{again}");

    // A late version of a from before its delete: quarantined, not re-inserted. The delete
    // record delivered again: skipped (no tombstone comes back). c changes as usual.
    append(
        &bronze(d),
        &[
            Change::upsert("a", T0 + 30 * MIN, T0 + 2 * DAY + 10 * MIN, 10),
            Change::delete("a", T0 + HOUR, T0 + 2 * DAY + 10 * MIN),
            Change::upsert("c", T0 + 2 * DAY, T0 + 2 * DAY + 10 * MIN, 30),
        ],
    )
    .await;
    let s = run(&p, T0 + 2 * DAY + HOUR, &[]);
    assert_eq!(resurrections(&s), 1, "{s}");
    assert_eq!(s["num_quarantined"], 1, "{s}");
    assert!(
        s["warnings"]
            .to_string()
            .contains("deleted_key_resurrection"),
        "{s}"
    );
    assert_eq!(held(d).await, vec![("b".into(), true), ("c".into(), false)]);
    let reasons = strings(&read_all(&quarantine(d)).await, "_quarantine_reason");
    assert_eq!(reasons, vec!["deleted_key_resurrection"]);
    // The commit carries the count.
    let log = std::fs::read_dir(silver(d).join("_delta_log"))
        .expect("log")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .max()
        .expect("a commit");
    let text = std::fs::read_to_string(log).expect("commit");
    assert!(text.contains("deleted_key_resurrection"), "{text}");

    // Reconcile and a full reload agree: the removed key stays deleted.
    let r = exec(
        tidemark_at(T0 + 2 * DAY + HOUR)
            .arg("reconcile")
            .arg(&p)
            .args(["--output", "json"]),
    );
    assert_eq!(r.code, 0, "reconcile: {}\n{}", r.stdout, r.stderr);
    let incremental = held(d).await;
    // (a full reload reads a's whole past: superseded by its delete, skipped, not counted)
    let full = run(&p, T0 + 2 * DAY + HOUR, &["--full-reload"]);
    assert_eq!(resurrections(&full), 0, "{full}");
    assert_eq!(full["num_quarantined_new"], 0, "{full}");
    assert_eq!(held(d).await, incremental);

    // A version newer than the delete is a real re-creation.
    append(
        &bronze(d),
        &[Change::upsert(
            "a",
            T0 + 2 * DAY + HOUR,
            T0 + 2 * DAY + HOUR,
            11,
        )],
    )
    .await;
    let s = run(&p, T0 + 2 * DAY + 2 * HOUR, &[]);
    assert_eq!(s["num_inserted"], 1, "{s}");
    assert_eq!(
        held(d).await,
        vec![("a".into(), false), ("b".into(), true), ("c".into(), false)]
    );
}

#[tokio::test]
async fn retain_is_checked_at_load() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    for (deletes, says) in [
        (", retain: soon", "retain"),
        (", removed_keys: /tmp/x", "retain"),
    ] {
        let p = pipeline(d, deletes);
        let out = exec(tidemark_at(T0).arg("run").arg(&p));
        assert_eq!(out.code, 78, "{deletes}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{deletes}: {}", out.stderr);
        assert!(
            out.stderr.contains("pipeline.yml:10"),
            "{deletes}: {}",
            out.stderr
        );
    }
    let p = write_pipeline(d, "15m", "hard", "");
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace("mode: hard }", "mode: hard, retain: 30d }");
    std::fs::write(&p, text).expect("write");
    let out = exec(tidemark_at(T0).arg("run").arg(&p));
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stderr.contains("mode: hard"), "{}", out.stderr);
}
