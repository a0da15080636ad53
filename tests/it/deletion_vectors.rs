//! `target.apply: deletion_vectors` through the binary: an hourly run marks a changed key's old
//! row deleted in its file's deletion vector and writes only the changed rows; the table equals
//! the oracle; a rerun commits nothing; a full reload and `maintain` (the purge) leave no
//! deletion vector behind; an existing copy-on-write target is upgraded once.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

/// The instant the binary believes it is.
const NOW: i64 = T0 + 12 * HOUR;

/// Whether any live file of the table has a deletion vector (read through delta-rs, which
/// also reads checkpoints).
async fn has_dvs(path: &Path) -> bool {
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    let table = deltalake::open_table(url).await.expect("open");
    let snapshot = table.snapshot().expect("snapshot");
    let found = snapshot
        .log_data()
        .iter()
        .any(|f| f.deletion_vector_descriptor().is_some());
    found
}

fn ok_json(out: &Out, what: &str) -> Value {
    assert_eq!(
        out.code, 0,
        "{what} failed\nstdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}): {}", out.stdout))
}

fn run_ok(dir: &Path, pipeline: &Path) -> Value {
    let out = exec(
        tidemark_in(dir, NOW)
            .arg("run")
            .arg(pipeline)
            .args(["--output", "json"]),
    );
    ok_json(&out, "run")
}

/// The test pipeline with `target.apply` set and row groups of 2 rows, so that a file holds
/// several row groups.
fn pipeline(dir: &Path, apply: &str) -> PathBuf {
    let path = write_pipeline(dir, "15m", "soft", "");
    let text = std::fs::read_to_string(&path).expect("read");
    let text = text.replace(
        "target: { uri: \"",
        &format!("target: {{ apply: {apply}, row_group_rows: 2, uri: \""),
    );
    std::fs::write(&path, text).expect("write");
    path
}

/// Ten keys in one file at T0, then an hour that updates k3, deletes k7 and adds k11.
fn first_load() -> Vec<Change> {
    (1..=10)
        .map(|i| Change::upsert(&format!("k{i:02}"), T0 + HOUR, T0 + HOUR, 1))
        .collect()
}

fn next_hour() -> Vec<Change> {
    vec![
        Change::upsert("k03", T0 + 2 * HOUR, NOW - MIN, 2),
        Change::delete("k07", T0 + 2 * HOUR, NOW - MIN),
        Change::upsert("k11", T0 + 2 * HOUR, NOW - MIN, 1),
    ]
}

/// The first load bootstrapped, then the next hour appended and run: every change so far and
/// the hour's run summary.
async fn load_then_next_hour(d: &Path, p: &Path) -> (Vec<Change>, Value) {
    let mut all = first_load();
    append(&bronze(d), &all).await;
    run_ok(d, p);
    let next = next_hour();
    append(&bronze(d), &next).await;
    all.extend(next);
    (all, run_ok(d, p))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_marks_old_rows_and_writes_only_the_changed_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let mut all = first_load();
    append(&bronze(d), &all).await;
    assert_eq!(run_ok(d, &p)["mode"], "bootstrap");
    assert!(!has_dvs(&silver(d)).await);

    let next = next_hour();
    append(&bronze(d), &next).await;
    all.extend(next);
    let v = run_ok(d, &p);
    assert_eq!(v["mode"], "incremental", "{v}");
    assert_eq!(
        (
            v["num_inserted"].as_u64(),
            v["num_updated"].as_u64(),
            v["num_deleted"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{v}"
    );
    // k03's and k07's old rows are marked; their new versions (k07's tombstone) and k11 are
    // the only rows written, into one new file; the old file is kept, not rewritten.
    assert_eq!(v["num_rows_marked_deleted"], 2, "{v}");
    assert_eq!(v["num_files_marked"], 1, "{v}");
    assert_eq!(v["num_rows_written"], 3, "{v}");
    assert_eq!(v["num_rows_copied"], 0, "{v}");
    assert_eq!(v["num_files_added"], 1, "{v}");
    assert_eq!(v["num_files_removed"], 0, "{v}");
    assert!(has_dvs(&silver(d)).await);
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));

    // A rerun finds nothing to do (the marked rows are not seen again).
    let before = version(&silver(d)).await;
    let again = run_ok(d, &p);
    assert_eq!(again["target_version"], Value::Null, "{again}");
    assert_eq!(version(&silver(d)).await, before);

    // Another hour changes k03 again (now in the new file) and k05 (in the marked file): the
    // marked file's deletion vector grows, the first run's file gets one.
    let more = vec![
        Change::upsert("k03", T0 + 3 * HOUR, NOW - MIN / 2, 3),
        Change::upsert("k05", T0 + 3 * HOUR, NOW - MIN / 2, 3),
    ];
    append(&bronze(d), &more).await;
    all.extend(more);
    let v = run_ok(d, &p);
    assert_eq!(v["num_updated"], 2, "{v}");
    assert_eq!(v["num_rows_marked_deleted"], 2, "{v}");
    assert_eq!(v["num_files_marked"], 2, "{v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));

    // reconcile reads the table as any reader does: identical to the source.
    let out = exec(
        tidemark_in(d, NOW)
            .arg("reconcile")
            .arg(&p)
            .args(["--output", "json"]),
    );
    let report = ok_json(&out, "reconcile");
    assert_eq!(report["identical"], true, "{report}");

    // maintain purges: the files whose deletion vectors delete ≥ 5% of their rows are
    // rewritten without those rows, and the table reads the same.
    let out = exec(
        tidemark_in(d, NOW)
            .arg("maintain")
            .arg(&p)
            .args(["--output", "json"]),
    );
    let m = ok_json(&out, "maintain");
    assert!(m["files_compacted"].as_u64() >= Some(2), "{m}");
    assert!(!has_dvs(&silver(d)).await, "{m}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));

    // And the next hour works on the purged table.
    let last = vec![Change::upsert("k01", T0 + 4 * HOUR, NOW - MIN / 4, 4)];
    append(&bronze(d), &last).await;
    all.extend(last);
    let v = run_ok(d, &p);
    assert_eq!(v["num_rows_marked_deleted"], 1, "{v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));

    // A full reload writes plain files: no deletion vector is left.
    let out =
        exec(
            tidemark_in(d, NOW)
                .arg("run")
                .arg(&p)
                .args(["--full-reload", "--output", "json"]),
        );
    ok_json(&out, "full reload");
    assert!(!has_dvs(&silver(d)).await);
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
}

/// A copy-on-write target switched to `deletion_vectors`: the next run upgrades it once (a
/// warning says so), then marks; switched back, copy-on-write rewrites the marked file and
/// drops the rows its deletion vector deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_upgrades_once_and_back_rewrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let cow = pipeline(d, "copy_on_write");
    let mut all = first_load();
    append(&bronze(d), &all).await;
    run_ok(d, &cow);
    let v0 = version(&silver(d)).await.expect("table");

    let dv = pipeline(d, "deletion_vectors");
    let next = next_hour();
    append(&bronze(d), &next).await;
    all.extend(next);
    let v = run_ok(d, &dv);
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("upgraded") && warnings.contains("deletion vectors"),
        "{v}"
    );
    assert_eq!(v["target_version"], v0 + 2, "upgrade, then the run: {v}");
    assert_eq!(v["num_rows_marked_deleted"], 2, "{v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));

    let again = run_ok(d, &dv);
    assert_eq!(
        again["warnings"],
        serde_json::json!([]),
        "upgraded once: {again}"
    );

    let cow = pipeline(d, "copy_on_write");
    let more = vec![Change::upsert("k05", T0 + 3 * HOUR, NOW - MIN / 2, 3)];
    append(&bronze(d), &more).await;
    all.extend(more);
    let v = run_ok(d, &cow);
    assert_eq!(v["num_rows_marked_deleted"], 0, "{v}");
    assert_eq!(v["num_updated"], 1, "{v}");
    assert!(!has_dvs(&silver(d)).await, "{v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
}

/// With the change data feed, a merge-on-read run's feed is the live change (the pre-image
/// from the marked row, the post-image from the new file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_of_a_marking_run_is_the_live_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let text = std::fs::read_to_string(&p).expect("read").replace(
        "apply: deletion_vectors,",
        "apply: deletion_vectors, change_data_feed: true,",
    );
    std::fs::write(&p, text).expect("write");
    append(&bronze(d), &first_load()).await;
    run_ok(d, &p);
    let before = live_rows(read_target(&silver(d)).await);
    append(&bronze(d), &next_hour()).await;
    let v = run_ok(d, &p);
    let version = v["target_version"].as_u64().expect("committed");
    let out = exec(tidemark_in(d, NOW).arg("changes").arg(&p).args([
        "--from-version",
        &version.to_string(),
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let mut state = before;
    let feed = feed_rows(&silver(d), version, version).await;
    let rows: Vec<(&str, &TargetRow)> = feed.iter().map(|(_, k, r)| (k.as_str(), r)).collect();
    apply_feed_version(&mut state, &rows).expect("a live feed");
    let after = live_rows(read_target(&silver(d)).await);
    assert_eq!(state, after);
    let kinds: Vec<&str> = feed.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(
        kinds.len(),
        4,
        "update pre/post of k03, delete of k07, insert of k11: {kinds:?}"
    );
}

/// Hard deletes in merge-on-read: the deleted key's row is marked and nothing is written for
/// it; an older version landing later brings it back, as in copy-on-write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_deletes_are_marks_without_a_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace("mode: soft", "mode: hard");
    std::fs::write(&p, text).expect("write");
    let (all, v) = load_then_next_hour(d, &p).await;
    assert_eq!(v["num_deleted"], 1, "{v}");
    assert_eq!(v["num_rows_marked_deleted"], 2, "k03 and k07: {v}");
    assert_eq!(v["num_rows_written"], 2, "k03's new version and k11: {v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, true));
    let again = run_ok(d, &p);
    assert_eq!(again["target_version"], Value::Null, "{again}");
}

/// `restore` of a deletion-vector target brings back the files with the vectors they had then:
/// the restored table is the table of that version (no deleted row comes back), and the next
/// hour merges into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_keeps_each_version_s_deletion_vectors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let (mut all, v) = load_then_next_hour(d, &p).await;
    let v1 = v["target_version"].as_u64().expect("committed");
    let at_v1 = read_target(&silver(d)).await;
    assert_eq!(at_v1, oracle(&all, NOW, false));
    let more = vec![
        Change::upsert("k03", T0 + 3 * HOUR, NOW - MIN / 2, 3),
        Change::upsert("k05", T0 + 3 * HOUR, NOW - MIN / 2, 3),
    ];
    append(&bronze(d), &more).await;
    run_ok(d, &p);
    let out = exec(
        tidemark_in(d, NOW)
            .arg("restore")
            .arg(&p)
            .args(["--version", &v1.to_string()]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        read_target(&silver(d)).await,
        at_v1,
        "the table of version {v1}"
    );
    all.extend(more);
    let v = run_ok(d, &p);
    assert_eq!(
        v["num_updated"], 2,
        "the restored hour is merged again: {v}"
    );
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
}

/// `restore` of a deletion-vector target that keeps a change data feed: the restore commit is
/// one the feed readers can read (tidemark's `changes`, delta-rs' CDF scan), and its feed says
/// what the restore changed — the next hour's rows taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_of_a_deletion_vector_target_with_a_feed_keeps_the_feed_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let text = std::fs::read_to_string(&p).expect("read");
    std::fs::write(
        &p,
        text.replacen("/silver\" }", "/silver\", change_data_feed: true }", 1),
    )
    .expect("write");
    let (_, v) = load_then_next_hour(d, &p).await;
    let v1 = v["target_version"].as_u64().expect("committed");
    let more = vec![
        Change::upsert("k03", T0 + 3 * HOUR, NOW - MIN / 2, 3),
        Change::upsert("k05", T0 + 3 * HOUR, NOW - MIN / 2, 3),
    ];
    append(&bronze(d), &more).await;
    run_ok(d, &p);
    let restored = exec(tidemark_in(d, NOW).arg("restore").arg(&p).args([
        "--version",
        &v1.to_string(),
        "--output",
        "json",
    ]));
    assert_eq!(restored.code, 0, "{}\n{}", restored.stdout, restored.stderr);
    let r: Value = serde_json::from_str(restored.stdout.trim()).expect("json");
    let new = r["new_version"].as_u64().expect("new version");
    let out = exec(tidemark_in(d, NOW).arg("changes").arg(&p).args([
        "--from-version",
        &new.to_string(),
        "--output",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let feed = feed_rows(&silver(d), new, new).await;
    let mut changes: Vec<(String, String)> = feed
        .iter()
        .map(|(_, change, row)| (row.id.clone(), change.clone()))
        .collect();
    changes.sort();
    assert_eq!(
        changes,
        vec![
            ("k03".to_string(), "update_postimage".to_string()),
            ("k03".to_string(), "update_preimage".to_string()),
            ("k05".to_string(), "update_postimage".to_string()),
            ("k05".to_string(), "update_preimage".to_string()),
        ],
        "{feed:?}"
    );
}

/// A deletion-vector file cut short or deleted by hand is damage (65), never a bug (70), for
/// `run` and `reconcile`; a `--full-reload` rebuilds the table without reading it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_deletion_vector_file_is_bad_data() {
    for damage in ["cut", "delete"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let p = pipeline(d, "deletion_vectors");
        let mut all: Vec<Change> = (0..200)
            .map(|i| Change::upsert(&format!("k{i:03}"), T0 + HOUR, T0 + HOUR, 1))
            .collect();
        append(&bronze(d), &all).await;
        run_ok(d, &p);
        // 50 keys of the one file change: too many marks to keep inline, so a DV file.
        let next: Vec<Change> = (0..200)
            .step_by(4)
            .map(|i| Change::upsert(&format!("k{i:03}"), T0 + 2 * HOUR, NOW - MIN, 2))
            .collect();
        append(&bronze(d), &next).await;
        all.extend(next);
        assert_eq!(run_ok(d, &p)["num_rows_marked_deleted"], 50);
        let bin = std::fs::read_dir(silver(d))
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("deletion_vector_"))
            })
            .expect("a deletion vector file");
        if damage == "cut" {
            let bytes = std::fs::read(&bin).expect("read");
            std::fs::write(&bin, &bytes[..10]).expect("cut");
        } else {
            std::fs::remove_file(&bin).expect("delete");
        }
        let more = vec![Change::upsert("k004", T0 + 3 * HOUR, NOW - MIN / 2, 3)];
        append(&bronze(d), &more).await;
        all.extend(more);
        let out = exec(tidemark_in(d, NOW).arg("run").arg(&p));
        assert_eq!(
            out.code, 65,
            "{damage}: run\n{}\n{}",
            out.stdout, out.stderr
        );
        assert!(!out.stderr.contains("bug"), "{}", out.stderr);
        let out = exec(tidemark_in(d, NOW).arg("reconcile").arg(&p));
        assert_eq!(
            out.code, 65,
            "{damage}: reconcile\n{}\n{}",
            out.stdout, out.stderr
        );
        assert!(!out.stderr.contains("bug"), "{}", out.stderr);
        let out = exec(tidemark_in(d, NOW).arg("run").arg(&p).arg("--full-reload"));
        assert_eq!(
            out.code, 0,
            "{damage}: full reload\n{}\n{}",
            out.stdout, out.stderr
        );
        assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
    }
}

/// Hourly merge commits leave the deletion of expired log files to checkpoints (no listing of
/// the whole log after every commit, a request or more on an object store); `maintain`
/// checkpoints and then deletes the log files the checkpoint makes unnecessary, once they are
/// older than `delta.logRetentionDuration`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hourly_commits_leave_expired_logs_to_maintain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "copy_on_write");
    let mut all = first_load();
    append(&bronze(d), &all).await;
    run_ok(d, &p);
    let url =
        deltalake::table::builder::parse_table_uri(silver(d).to_str().expect("utf8")).expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            "delta.logRetentionDuration".to_string(),
            "interval 0 seconds".to_string(),
        )]))
        .await
        .expect("set retention");
    let next = next_hour();
    append(&bronze(d), &next).await;
    all.extend(next);
    let v = run_ok(d, &p);
    assert_eq!(v["target_version"], 2, "{v}");
    let log = silver(d).join("_delta_log");
    let commit = |v: u64| log.join(format!("{v:020}.json"));
    for v in 0..=2 {
        assert!(commit(v).exists(), "version {v} kept by the hourly commits");
    }
    let out = exec(
        tidemark_in(d, NOW)
            .args(["maintain", "--no-compact", "--output", "json"])
            .arg(&p),
    );
    let m = ok_json(&out, "maintain");
    assert_eq!(m["checkpoint_version"], 2, "{m}");
    assert!(!commit(0).exists() && !commit(1).exists(), "{m}");
    assert!(commit(2).exists());
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
    // the table still runs from its checkpoint
    let v = run_ok(d, &p);
    assert!(
        v["target_version"].is_null(),
        "a rerun commits nothing: {v}"
    );
}

/// `maintain --dry-run` predicts the real run on a deletion-vector target too: a compacted
/// file's deletion-vector file (one too large to be inline) becomes unreferenced with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintain_dry_run_counts_the_deletion_vector_files_compaction_releases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = pipeline(d, "deletion_vectors");
    let mut all: Vec<Change> = (0..100)
        .map(|i| Change::upsert(&format!("k{i:03}"), T0 + HOUR, T0 + HOUR, 1))
        .collect();
    append(&bronze(d), &all).await;
    run_ok(d, &p);
    // 40 keys of the one file change: its vector (40 positions) is too large to be inline.
    let next: Vec<Change> = (0..40)
        .map(|i| Change::upsert(&format!("k{:03}", i * 2), T0 + 2 * HOUR, NOW - MIN, 2))
        .collect();
    append(&bronze(d), &next).await;
    all.extend(next);
    let v = run_ok(d, &p);
    assert_eq!(v["num_rows_marked_deleted"], 40, "{v}");
    let dv_files = || {
        std::fs::read_dir(silver(d))
            .expect("read silver")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("deletion_vector_")
            })
            .count()
    };
    assert_eq!(dv_files(), 1, "the vector is in a file of its own");
    let maintain = |dry: bool| {
        let mut c = tidemark_in(d, NOW);
        c.args(["maintain", "--output", "json"]).arg(&p);
        if dry {
            c.arg("--dry-run");
        }
        ok_json(&exec(&mut c), "maintain")
    };
    let predicted = maintain(true);
    let real = maintain(false);
    assert!(real["files_compacted"].as_u64() >= Some(1), "{real}");
    assert_eq!(
        predicted["files_unreferenced_within_retention"],
        real["files_unreferenced_within_retention"],
        "dry run {predicted}\nreal {real}"
    );
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
}

/// Whether column `name` of every row group of the Parquet file at `path` has a dictionary.
fn dictionary_encoded(path: &Path, name: &str) -> bool {
    use parquet::file::reader::FileReader;
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(
        std::fs::File::open(path).expect("open"),
    )
    .expect("parquet");
    let meta = reader.metadata();
    let col = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == name)
        .unwrap_or_else(|| panic!("{} has no column {name}", path.display()));
    meta.row_groups()
        .iter()
        .all(|g| g.column(col).dictionary_page_offset().is_some())
}

/// The target holds one row per key, so every file tidemark writes for it — the bootstrap's,
/// a copy-on-write rewrite, a marking hour's new file — stores the key column plain (a
/// dictionary would only repeat its values); the other columns keep their dictionaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_written_stores_the_key_column_without_a_dictionary() {
    for apply in ["copy_on_write", "deletion_vectors"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let p = pipeline(d, apply);
        // (copy-on-write rewrites the file and writes k11 into a new one; marking writes the
        // changed rows into one new file)
        let (all, v) = load_then_next_hour(d, &p).await;
        let added = v["num_files_added"].as_u64().expect("files added");
        assert!(added >= 1, "{apply}: {v}");
        assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
        let files: Vec<PathBuf> = std::fs::read_dir(silver(d))
            .expect("silver")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        assert_eq!(
            files.len() as u64,
            1 + added,
            "{apply}: the bootstrap's file and the hour's"
        );
        for f in &files {
            assert!(!dictionary_encoded(f, "id"), "{apply}: {}", f.display());
            assert!(
                dictionary_encoded(f, "updated_at"),
                "{apply}: {}",
                f.display()
            );
        }
    }
}
