//! Tables written by other engines, through the real binary: sources
//! and targets with **deletion vectors** on some files but not others (the normal state after
//! another engine's `DELETE`), a source written with **column mapping**, and a bootstrap that
//! fails leaving nothing at the target location.
//!
//! delta-rs 1.1 reads deletion vectors but never writes them, so the DVs here come from the
//! protocol-level generator in `tests/it/common/delta_fixture.rs` (its doc comment says how its
//! tables were checked with the Python `deltalake` package). Column-mapped sources are written by
//! delta-rs itself (`delta.columnMapping.mode = name`), and the test checks that their Parquet
//! files really use physical column names.

use crate::common;
use crate::common::delta_fixture;

use std::path::Path;

use common::*;
use delta_fixture::{delete_where, enable_deletion_vectors, has_deletion_vectors, DvStorage};
use serde_json::Value;

/// The instant the binary believes it is.
const NOW: i64 = T0 + 12 * HOUR;

/// `tidemark run` that must succeed; its JSON summary.
fn run_ok(dir: &Path, pipeline: &Path) -> Value {
    let out = exec(
        tidemark_in(dir, NOW)
            .arg("run")
            .arg(pipeline)
            .args(["--output", "json"]),
    );
    assert_eq!(
        out.code, 0,
        "run failed\nstdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", out.stdout))
}

/// `tidemark reconcile --output json`; its exit code and report.
fn reconcile(dir: &Path, pipeline: &Path) -> (i32, Value, String) {
    let out = exec(
        tidemark_in(dir, NOW)
            .arg("reconcile")
            .arg(pipeline)
            .args(["--output", "json"]),
    );
    let report = serde_json::from_str(out.stdout.trim()).unwrap_or(Value::Null);
    (out.code, report, out.stderr)
}

/// `all` without the changes of the keys in `ids` at the sequences in `seqs` (the rows a DV
/// deleted from the source).
fn without(all: &[Change], deleted: &[(&str, i64)]) -> Vec<Change> {
    all.iter()
        .filter(|c| {
            !deleted
                .iter()
                .any(|(id, seq)| c.id.as_deref() == Some(*id) && c.seq == Some(*seq))
        })
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------------
// deletion vectors

/// A source whose older files carry DVs (one file `u` with a random prefix, one inline) next to
/// files without: the bootstrap and the next incremental run succeed, and no deleted source row
/// reaches the target — neither through the overlap slice nor through the newly-landed files
/// read behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_with_deletion_vectors_on_some_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = write_pipeline(d, "15m", "soft", "");
    let bronze = bronze(d);
    let first = vec![
        Change::upsert("a", T0 + HOUR, T0 + HOUR, 1),
        Change::upsert("b", T0 + HOUR, T0 + HOUR, 1),
    ];
    let second = vec![
        Change::upsert("a", T0 + 2 * HOUR, T0 + 2 * HOUR, 2),
        Change::upsert("c", T0 + 2 * HOUR, T0 + 2 * HOUR, 1),
    ];
    let third = vec![Change::upsert("d", T0 + 3 * HOUR, T0 + 3 * HOUR, 1)];
    append(&bronze, &first).await;
    append(&bronze, &second).await;
    append(&bronze, &third).await;
    enable_deletion_vectors(&bronze);
    // `b` lives in the first file only: one file with a DV, two without.
    assert_eq!(
        delete_where(&bronze, "id", &["b"], DvStorage::File { prefix: "xy" }),
        1
    );
    assert!(has_deletion_vectors(&bronze));
    let mut all: Vec<Change> = [first, second, third].concat();
    let deleted = [("b", T0 + HOUR)];

    let v = run_ok(d, &pipeline);
    assert_eq!(v["mode"], "bootstrap", "{v}");
    assert_eq!(
        v["num_source_rows_read"], 4,
        "the deleted row is not counted: {v}"
    );
    assert_eq!(
        read_target(&silver(d)).await,
        oracle(&without(&all, &deleted), NOW, false),
        "the DV-deleted `b` must not be in the target"
    );

    // New rows land: two late ones (behind watermark − overlap, found only through the files
    // added since the last run) and two in the overlap slice; one of each is deleted by an
    // inline DV before the next run.
    let late = T0 + 30 * MIN;
    let fourth = vec![
        Change::upsert("e", late, NOW - MIN, 1),
        Change::upsert("f", late, NOW - MIN, 1),
        Change::upsert("g", T0 + 3 * HOUR + 10 * MIN, NOW - MIN, 1),
        Change::upsert("h", T0 + 3 * HOUR + 10 * MIN, NOW - MIN, 1),
    ];
    append(&bronze, &fourth).await;
    assert_eq!(
        delete_where(&bronze, "id", &["f", "h"], DvStorage::Inline),
        2
    );
    all.extend(fourth);
    let deleted = [
        ("b", T0 + HOUR),
        ("f", late),
        ("h", T0 + 3 * HOUR + 10 * MIN),
    ];

    let v = run_ok(d, &pipeline);
    assert_eq!(v["mode"], "incremental", "{v}");
    assert_eq!(v["num_late_rows"], 1, "only `e` is late and alive: {v}");
    assert_eq!(v["num_inserted"], 2, "`e` and `g`: {v}");
    assert_eq!(
        read_target(&silver(d)).await,
        oracle(&without(&all, &deleted), NOW, false)
    );

    let (code, report, stderr) = reconcile(d, &pipeline);
    assert_eq!(code, 0, "report: {report}\nstderr: {stderr}");
    assert_eq!(report["identical"], true, "{report}");
}

/// A target in which another tool deleted a row with a DV (one file with a DV, one without):
/// the next incremental run succeeds (watermark from the log included) on tidemark's own
/// copy-on-write path, which skips the rows the DV deletes and leaves them out of the file it
/// rewrites, so the deleted row stays deleted and the table is left with the DV feature but no
/// DV. `reconcile` reports the deleted key as missing (exit 65) instead of crashing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_with_a_deletion_vector_from_another_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = write_pipeline(d, "15m", "soft", "");
    let src = bronze(d);
    let tgt = silver(d);
    let mut all = vec![
        Change::upsert("k1", T0 + HOUR, T0 + HOUR, 1),
        Change::upsert("k2", T0 + HOUR, T0 + HOUR, 1),
        Change::upsert("k3", T0 + HOUR, T0 + HOUR, 1),
    ];
    append(&src, &all).await;
    assert_eq!(run_ok(d, &pipeline)["mode"], "bootstrap");
    let more = vec![Change::upsert("k4", T0 + 2 * HOUR, T0 + 2 * HOUR, 1)];
    append(&src, &more).await;
    all.extend(more);
    let v = run_ok(d, &pipeline);
    assert_eq!(v["num_inserted"], 1, "{v}");
    assert_eq!(delta_fixture::live_files(&tgt), 2);

    enable_deletion_vectors(&tgt);
    assert_eq!(
        delete_where(&tgt, "id", &["k2"], DvStorage::File { prefix: "" }),
        1
    );
    let mut expected = oracle(&all, NOW, false);
    expected.retain(|r| r.id != "k2");
    assert_eq!(read_target(&tgt).await, expected, "the fixture's DV");

    // k3 (in the file with the DV) is updated, k5 is new; k2 gets no new version.
    let next = vec![
        Change::upsert("k3", T0 + 3 * HOUR, NOW - MIN, 2),
        Change::upsert("k5", T0 + 3 * HOUR, NOW - MIN, 1),
    ];
    append(&src, &next).await;
    all.extend(next);
    let v = run_ok(d, &pipeline);
    assert_eq!(v["mode"], "incremental", "{v}");
    assert_eq!(
        v["watermark_before"], "2025-01-06T02:00:00.000000Z",
        "the watermark comes from the log: {v}"
    );
    assert_eq!(
        (v["num_inserted"].as_u64(), v["num_updated"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(
        (
            v["num_rows_copied"].as_u64(),
            v["num_rows_written"].as_u64()
        ),
        (Some(1), Some(3)),
        "the rewrite of the file with the DV carried k1 alone (not k2), wrote k3, and k5: {v}"
    );
    let mut expected = oracle(&all, NOW, false);
    expected.retain(|r| r.id != "k2");
    assert_eq!(
        read_target(&tgt).await,
        expected,
        "k2 stays deleted, k3 updated, k5 inserted"
    );

    // The rewrite dropped the DV with the file: the table supports DVs but has none.
    assert!(!has_deletion_vectors(&tgt));
    let last = vec![Change::upsert("k1", T0 + 4 * HOUR, NOW - MIN, 2)];
    append(&src, &last).await;
    all.extend(last);
    let v = run_ok(d, &pipeline);
    assert_eq!(v["num_updated"], 1, "{v}");
    let mut expected = oracle(&all, NOW, false);
    expected.retain(|r| r.id != "k2");
    assert_eq!(read_target(&tgt).await, expected);

    // reconcile on a target with a DV: k2 is missing, which is a difference (65), not a crash.
    let dv_dir = tempfile::tempdir().expect("tempdir");
    let d2 = dv_dir.path();
    let pipeline2 = write_pipeline(d2, "15m", "soft", "");
    append(&bronze(d2), &all[..3]).await;
    run_ok(d2, &pipeline2);
    append(&bronze(d2), &all[3..4]).await;
    run_ok(d2, &pipeline2);
    enable_deletion_vectors(&silver(d2));
    delete_where(&silver(d2), "id", &["k2"], DvStorage::Inline);
    let (code, report, stderr) = reconcile(d2, &pipeline2);
    assert_eq!(code, 65, "report: {report}\nstderr: {stderr}");
    assert_eq!(report["differing_keys"]["missing_in_target"], 1, "{report}");
    assert_eq!(report["keys"][0]["key"]["id"], "k2", "{report}");
    assert_eq!(report["target_rows"], 3, "{report}");
}

// ---------------------------------------------------------------------------------------------
// column mapping

/// Creates the test source at `path` with `delta.columnMapping.mode = name` (delta-rs assigns
/// every column a `col-<uuid>` physical name and an id) and appends `changes` as one commit.
async fn create_column_mapped_source(path: &Path, changes: &[Change]) {
    use deltalake::kernel::DataType;
    std::fs::create_dir_all(path).expect("source dir");
    let url = deltalake::ensure_table_uri(path.to_str().expect("utf8")).expect("url");
    let table = deltalake::DeltaTableBuilder::from_url(url)
        .expect("builder")
        .build()
        .expect("table")
        .create()
        .with_column("id", DataType::STRING, true, None)
        .with_column("updated_at", DataType::TIMESTAMP, true, None)
        .with_column("_ingested_at", DataType::TIMESTAMP, false, None)
        .with_column("val", DataType::LONG, true, None)
        .with_column("op", DataType::STRING, false, None)
        .with_configuration([("delta.columnMapping.mode", Some("name"))])
        .await
        .expect("create column-mapped source");
    table
        .write(vec![batch(changes)])
        .with_save_mode(deltalake::protocol::SaveMode::Append)
        .await
        .expect("append to the column-mapped source");
}

/// The first Parquet file under `dir` (data files may sit in sub-folders: delta-rs puts a
/// column-mapped table's files under random prefixes).
fn first_parquet(dir: &Path) -> Option<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| !p.ends_with("_delta_log"))
        .collect();
    entries.sort();
    entries.iter().find_map(|p| {
        if p.is_dir() {
            first_parquet(p)
        } else {
            p.extension()
                .is_some_and(|x| x == "parquet")
                .then(|| p.clone())
        }
    })
}

/// The column names of the first data file of the table at `path`.
fn data_file_columns(path: &Path) -> Vec<String> {
    use parquet::file::reader::FileReader;
    let file = first_parquet(path).expect("a data file");
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(
        std::fs::File::open(file).expect("open"),
    )
    .expect("parquet");
    reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect()
}

/// A source written with column mapping (physical names differ from the logical ones) is
/// bootstrapped and merged incrementally: read through the mapping, logical names in the
/// target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_mapped_source_bootstraps_and_merges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = write_pipeline(d, "15m", "soft", "");
    let bronze = bronze(d);
    let mut all = vec![
        Change::upsert("a", T0 + HOUR, T0 + HOUR, 1),
        Change::upsert("b", T0 + HOUR, T0 + HOUR, 1),
        Change::delete("c", T0 + HOUR, T0 + HOUR),
    ];
    create_column_mapped_source(&bronze, &all).await;
    let physical = data_file_columns(&bronze);
    assert!(
        physical.iter().all(|c| c.starts_with("col-")),
        "the fixture must store physical names: {physical:?}"
    );

    let v = run_ok(d, &pipeline);
    assert_eq!(v["mode"], "bootstrap", "{v}");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
    let target_columns = data_file_columns(&silver(d));
    assert_eq!(
        target_columns,
        ["id", "updated_at", "_ingested_at", "val", "_deleted"],
        "the target stores logical names"
    );

    let more = vec![
        Change::upsert("a", T0 + 2 * HOUR, NOW - MIN, 2),
        Change::upsert("d", T0 + 2 * HOUR, NOW - MIN, 1),
    ];
    append(&bronze, &more).await;
    all.extend(more);
    let v = run_ok(d, &pipeline);
    assert_eq!(
        (v["num_inserted"].as_u64(), v["num_updated"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
    let (code, report, stderr) = reconcile(d, &pipeline);
    assert_eq!(code, 0, "report: {report}\nstderr: {stderr}");
}

// ---------------------------------------------------------------------------------------------
// a failed bootstrap leaves nothing behind

/// A bootstrap whose write fails (an injected storage error before the first data file) leaves
/// no folder at the target location, and the rerun bootstraps normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_bootstrap_leaves_no_target_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pipeline = write_pipeline(d, "15m", "soft", "");
    let all = vec![Change::upsert("a", T0 + HOUR, T0 + HOUR, 1)];
    append(&bronze(d), &all).await;

    let out = exec(
        tidemark_in(d, NOW)
            .env("TIDEMARK_FAILPOINTS", "store.put_data=error")
            .arg("run")
            .arg(&pipeline),
    );
    assert_ne!(out.code, 0, "the injected error must fail the run");
    assert!(
        !silver(d).exists(),
        "a failed bootstrap left {} behind",
        silver(d).display()
    );

    assert_eq!(run_ok(d, &pipeline)["mode"], "bootstrap");
    assert_eq!(read_target(&silver(d)).await, oracle(&all, NOW, false));
}
