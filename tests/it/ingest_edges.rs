//! `kind: ingest` at its edges, through the binary: compressed landing files, a file cut while
//! its producer writes it, numbers that must keep their digits, names that are not UTF-8.

use crate::common::*;
use crate::ingest::*;
use crate::ingest::{bronze, run};

use std::io::Write;

/// `.jsonl.gz`, `.jsonl.zst` and `.jsonl.bz2` files are decompressed and ingested; a gzip file
/// cut short is refused by name (65), nothing written and the file not recorded, so once it is
/// replaced by a complete one the next run ingests it.
#[tokio::test]
async fn compressed_landing_files_are_read_and_a_broken_one_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let text = |id: &str| {
        format!("{{\"id\":\"{id}\",\"amount\":1,\"updated_at\":\"2025-01-06T10:00:00Z\"}}\n")
    };
    let l = landing(d);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text("g1").as_bytes()).expect("gz");
    let gz = gz.finish().expect("gz");
    std::fs::write(l.join("a.jsonl.gz"), &gz).expect("write");
    std::fs::write(
        l.join("b.jsonl.zst"),
        zstd::encode_all(text("z1").as_bytes(), 3).expect("zstd"),
    )
    .expect("write");
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    bz.write_all(text("b1").as_bytes()).expect("bz2");
    std::fs::write(l.join("c.jsonl.bz2"), bz.finish().expect("bz2")).expect("write");
    let p = pipeline(d, "");
    let yml = std::fs::read_to_string(&p).expect("read");
    std::fs::write(&p, yml.replace("glob: \"*.jsonl\"", "glob: \"*.jsonl*\"")).expect("write");
    let out = run(d, T0 + HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ids: Vec<String> = bronze(d).await.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, vec!["b1", "g1", "z1"]);
    // A cut gzip file: refused by name, not recorded.
    let mut gz2 = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz2.write_all(text("g2").as_bytes()).expect("gz");
    let gz = gz2.finish().expect("gz");
    std::fs::write(l.join("d.jsonl.gz"), &gz[..gz.len() / 2]).expect("write");
    let out = run(d, T0 + 2 * HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("d.jsonl.gz") && out.stderr.contains("gzip"),
        "{}",
        out.stderr
    );
    assert_eq!(bronze(d).await.len(), 3, "nothing written");
    std::fs::write(l.join("d.jsonl.gz"), &gz).expect("write");
    let out = run(d, T0 + 3 * HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(bronze(d).await.len(), 4, "the complete file is ingested");
}

/// A CSV file listed while its producer is still writing it (`p2,12` of `p2,12345`, no line
/// end yet): left for a later run, with a warning, and not recorded; once complete it is
/// ingested whole. One that stays cut for over an hour is read without its last line, which goes
/// to the quarantine — never ingested as a valid row.
#[tokio::test]
async fn a_csv_file_cut_mid_line_waits_for_its_line_end() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let text = format!(
        "name: partner\nkind: ingest\nlanding: {{ uri: \"{d}/landing\", glob: \"*.csv\" }}\nformat: csv\nschema:\n  id: string not null\n  amount: long\ntarget: {{ uri: \"{d}/lake/bronze\" }}\nquarantine: {{ uri: \"{d}/lake/quarantine\" }}\n",
        d = d.display()
    );
    std::fs::write(d.join("ingest.yml"), text).expect("pipeline");
    let now = chrono::Utc::now().timestamp_micros();
    let file = landing(d).join("a.csv");
    std::fs::write(&file, "id,amount\np1,10\np2,12").expect("land");
    let amounts = || async {
        let b = read_all(&d.join("lake/bronze")).await;
        let mut v = strings(&b, "id");
        v.extend(strings(&b, "amount"));
        v.sort();
        v
    };
    let out = run(d, now, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(s["num_files_ingested"], 0, "{s}");
    assert!(s["warnings"].to_string().contains("a.csv"), "{s}");
    // ... (the first run creates bronze empty) and commits nothing, run after run, while the
    // file stays cut
    let again = json(&run(d, now + 1, &["--output", "json"]));
    assert!(
        s["target_version"] == 0 && again["target_version"].is_null(),
        "{s}\n{again}"
    );
    assert!(amounts().await.is_empty());
    std::fs::write(&file, "id,amount\np1,10\np2,12345\n").expect("complete");
    let out = run(d, now + MIN, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(amounts().await, vec!["10", "12345", "p1", "p2"]);
    // Cut and left so for over an hour: its complete lines only.
    std::fs::write(landing(d).join("b.csv"), "id,amount\np3,30\np4,4").expect("land");
    let out = run(d, now + 2 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(s["num_quarantined"], 1, "{s}");
    assert_eq!(amounts().await, vec!["10", "12345", "30", "p1", "p2", "p3"]);
}

/// Numbers keep their information: a JSON number for a `string` column keeps its digits as
/// written (two 23-digit ids stay two ids, `1e2` stays `1e2`); a Parquet double or decimal for a
/// `long` column that is not a whole number is quarantined (never truncated 4.7 → 4, 3.99 → 3),
/// as the same values are from JSON.
#[tokio::test]
async fn numbers_keep_their_digits_or_are_quarantined() {
    use arrow::array::{Decimal128Array, Float64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let l = landing(d);
    std::fs::write(
        l.join("ids.jsonl"),
        "{\"id\":12345678901234567890123,\"amount\":1}\n{\"id\":12345678901234567890124,\"amount\":2}\n{\"id\":1e2,\"amount\":3}\n{\"id\":1.50,\"amount\":4}\n",
    )
    .expect("land");
    let p = pipeline(d, "");
    let out = run(d, T0 + HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let mut ids = strings(&read_all(&d.join("lake/bronze")).await, "id");
    ids.sort();
    assert_eq!(
        ids,
        vec![
            "1.50",
            "12345678901234567890123",
            "12345678901234567890124",
            "1e2"
        ]
    );
    // Parquet: doubles and decimals into `long`.
    let pq = d.join("pq");
    std::fs::create_dir_all(pq.join("landing")).expect("mkdir");
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace(&d.display().to_string(), &pq.display().to_string())
        .replace("glob: \"*.jsonl\"", "glob: \"*.parquet\"")
        .replace("format: json", "format: parquet");
    std::fs::write(pq.join("ingest.yml"), text).expect("write");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("amount", DataType::Float64, true),
        Field::new("fee", DataType::Decimal128(10, 2), true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["whole", "fraction", "cents"])),
            Arc::new(Float64Array::from(vec![Some(4.0), Some(4.7), Some(1.0)])),
            Arc::new(
                Decimal128Array::from(vec![Some(500), Some(500), Some(399)])
                    .with_precision_and_scale(10, 2)
                    .expect("decimal"),
            ),
        ],
    )
    .expect("batch");
    let file = std::fs::File::create(pq.join("landing/a.parquet")).expect("create");
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
    let with_fee = std::fs::read_to_string(pq.join("ingest.yml"))
        .expect("read")
        .replace("  amount: long\n", "  amount: long\n  fee: long\n");
    std::fs::write(pq.join("ingest.yml"), with_fee).expect("write");
    let out = run(&pq, T0 + HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let s = json(&out);
    assert_eq!(s["num_quarantined"], 2, "4.7 and 3.99: {s}");
    let b = read_all(&pq.join("lake/bronze")).await;
    assert_eq!(strings(&b, "id"), vec!["whole"]);
    assert_eq!(strings(&b, "amount"), vec!["4"]);
    assert_eq!(strings(&b, "fee"), vec!["5"]);
}

/// A landing file whose name is not UTF-8 (a Latin-1 name from a Windows share) is listed and
/// ingested under a stable text of its name (`caf%E9.jsonl`), once — and a full reload sees it
/// too.
#[cfg(unix)]
#[tokio::test]
async fn a_file_whose_name_is_not_utf8_is_ingested_once() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.jsonl");
    std::fs::write(
        landing(d).join(name),
        "{\"id\":\"p1\",\"amount\":1,\"updated_at\":\"2025-01-06T10:00:00Z\"}\n",
    )
    .expect("land");
    let out = run(d, T0 + HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["num_files_ingested"], 1, "{}", out.stdout);
    let rows = bronze(d).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, "caf%E9.jsonl");
    let again = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(json(&again)["num_files_ingested"], 0, "{}", again.stdout);
    let reload = run(d, T0 + 3 * HOUR, &["--full-reload", "--output", "json"]);
    assert_eq!(reload.code, 0, "{}", reload.stderr);
    assert_eq!(bronze(d).await.len(), 1);
}

/// The landing folder and the lake move (`mv`, modification times kept), and the pipeline is
/// pointed at the new places: a full reload replaces the rows bronze holds under the old
/// location by the same files' rows under the new one (one copy of each record, each file
/// keeping its first arrival), and says bronze was rewritten.
#[tokio::test]
async fn a_full_reload_after_the_landing_folder_and_lake_moved_keeps_one_copy() {
    let dir = tempfile::tempdir().expect("tmp");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir_all(&old).expect("mkdir");
    pipeline(&old, "");
    land(&old, "a.jsonl", &[("p1", 1), ("p2", 2)]);
    assert_eq!(run(&old, T0 + HOUR, &[]).code, 0);
    land(&old, "b.jsonl", &[("p3", 3)]);
    assert_eq!(run(&old, T0 + 2 * HOUR, &[]).code, 0);
    let before = bronze(&old).await;
    std::fs::rename(&old, &new).expect("move");
    pipeline(&new, "");
    let out = run(&new, T0 + 3 * HOUR, &["--full-reload", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        json(&out)["warnings"]
            .to_string()
            .contains("bronze was rewritten"),
        "{}",
        out.stdout
    );
    let after = bronze(&new).await;
    let ids: Vec<&str> = after.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, vec!["p1", "p2", "p3"], "one copy: {after:?}");
    let arrivals = |rows: &[Row]| rows.iter().map(|r| r.3).collect::<Vec<_>>();
    assert_eq!(
        arrivals(&after),
        arrivals(&before),
        "each file keeps its first arrival"
    );
}

/// A producer's at-least-once retry delivers a file again under a new name: recorded, its rows
/// not appended again (bronze would hold each record twice, with new arrivals, and the merge
/// would update rows for no business change). A copied landing folder (every file with a new
/// modification time, the same bytes) is not a change either: no exit 65, nothing re-ingested.
#[tokio::test]
async fn a_redelivered_file_and_a_copied_folder_change_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("p1", 1), ("p2", 2)]);
    assert_eq!(run(d, T0 + HOUR, &[]).code, 0);
    let before = bronze(d).await;
    // The same bytes under a new name, next to a genuinely new file.
    std::fs::copy(landing(d).join("a.jsonl"), landing(d).join("a-retry.jsonl")).expect("copy");
    land(d, "b.jsonl", &[("p3", 3)]);
    let out = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = json(&out);
    assert_eq!(s["num_files_duplicate"], 1, "{s}");
    assert!(s["warnings"].to_string().contains("a-retry.jsonl"), "{s}");
    let after = bronze(d).await;
    assert_eq!(after.len(), before.len() + 1, "only p3 is new: {after:?}");
    // The retry is recorded: not read again.
    let s = json(&run(d, T0 + 3 * HOUR, &["--output", "json"]));
    assert_eq!(s["num_files_ingested"], 0, "{s}");
    // A copied folder: new modification times, the same bytes.
    let copy = d.join("landing-copy");
    std::fs::create_dir_all(&copy).expect("mkdir");
    for e in std::fs::read_dir(landing(d)).expect("ls") {
        let p = e.expect("entry").path();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::copy(&p, copy.join(p.file_name().expect("name"))).expect("copy");
    }
    std::fs::remove_dir_all(landing(d)).expect("rm");
    std::fs::rename(&copy, d.join("landing")).expect("mv");
    let out = run(d, T0 + 4 * HOUR, &["--output", "json"]);
    assert_eq!(
        out.code, 0,
        "identical contents are not a change: {}",
        out.stderr
    );
    let s = json(&out);
    assert_eq!(
        (
            s["num_files_ingested"].as_u64(),
            s["num_files_changed"].as_u64()
        ),
        (Some(0), Some(0)),
        "{s}"
    );
    assert_eq!(bronze(d).await, after);
    // A full reload of the copied folder keeps each file's arrival and one copy of each row.
    let out = run(d, T0 + 5 * HOUR, &["--full-reload", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(bronze(d).await, after);
}

mod redelivery_oracle {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]

        /// Hours of new files and at-least-once retries (an earlier file delivered again under a
        /// new name), ingested hour by hour or by a full reload: bronze holds the records of
        /// each distinct file once, whatever the order.
        #[test]
        fn bronze_holds_each_delivered_file_once(
            steps in prop::collection::vec((prop::option::of(0usize..8), 1usize..4, any::<bool>()), 1..6)
        ) {
            let rt = tokio::runtime::Runtime::new().expect("rt");
            rt.block_on(async {
                let dir = tempfile::tempdir().expect("tmp");
                let d = dir.path();
                pipeline(d, "");
                let mut originals: Vec<Vec<(String, i64)>> = Vec::new();
                for (h, (retry, n, full)) in steps.iter().enumerate() {
                    match retry.filter(|_| !originals.is_empty()) {
                        Some(i) => {
                            let i = i % originals.len();
                            std::fs::copy(
                                landing(d).join(format!("f{i}.jsonl")),
                                landing(d).join(format!("f{i}-retry{h}.jsonl")),
                            )
                            .expect("copy");
                        }
                        None => {
                            let recs: Vec<(String, i64)> =
                                (0..*n).map(|k| (format!("h{h}k{k}"), k as i64)).collect();
                            let refs: Vec<(&str, i64)> =
                                recs.iter().map(|(a, b)| (a.as_str(), *b)).collect();
                            land(d, &format!("f{}.jsonl", originals.len()), &refs);
                            originals.push(recs);
                        }
                    }
                    let args: &[&str] = if *full { &["--full-reload"] } else { &[] };
                    let out = run(d, T0 + (h as i64 + 1) * HOUR, args);
                    prop_assert_eq!(out.code, 0, "{}", out.stderr);
                    let mut got: Vec<String> = bronze(d).await.into_iter().map(|r| r.0).collect();
                    got.sort();
                    let mut want: Vec<String> =
                        originals.iter().flatten().map(|(id, _)| id.clone()).collect();
                    want.sort();
                    prop_assert_eq!(got, want, "after hour {}", h);
                }
                Ok(())
            })?;
        }
    }
}

/// The first run with nothing landed yet creates bronze, empty, with the declared columns (a
/// continuous job's merge on its first tick finds a table, not an error); the next empty run
/// commits nothing; the first file is ingested as usual.
#[tokio::test]
async fn a_first_run_with_nothing_landed_creates_an_empty_bronze() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    landing(d);
    pipeline(d, "");
    let out = run(d, T0 + HOUR, &["--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(v["target_version"], 0, "{v}");
    assert!(
        version(&d.join("lake/bronze")).await.is_some(),
        "bronze exists"
    );
    assert!(bronze(d).await.is_empty());
    let again = run(d, T0 + 2 * HOUR, &["--output", "json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let v: serde_json::Value = serde_json::from_str(again.stdout.trim()).expect("json");
    assert!(v["target_version"].is_null(), "{v}");
    std::fs::write(
        landing(d).join("a.jsonl"),
        "{\"id\":\"a1\",\"amount\":1,\"updated_at\":\"2025-01-06T10:00:00Z\"}\n",
    )
    .expect("write");
    let out = run(d, T0 + 3 * HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(bronze(d).await.len(), 1);
}

/// A run streamed a file per wave (`TIDEMARK_INGEST_WAVE_BYTES=1`): killed before its commit
/// it leaves bronze as it was (the data files it wrote are not referenced); the rerun ingests
/// each file's rows once, records a byte-identical copy of a file from an earlier wave without
/// its rows, and quarantines a bad line with its file and line.
#[tokio::test]
async fn a_run_streamed_in_waves_ingests_each_file_once_through_a_kill() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    land(d, "a.jsonl", &[("a0", 1)]);
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    land(d, "b.jsonl", &[("b1", 10), ("b2", 20)]);
    land(d, "c.jsonl", &[("c1", 30)]);
    std::fs::copy(landing(d).join("b.jsonl"), landing(d).join("d.jsonl")).expect("copy");
    std::fs::write(
        landing(d).join("e.jsonl"),
        "{\"id\":\"e1\",\"amount\":40,\"updated_at\":\"2025-01-06T10:00:00Z\"}\n{\"id\":\"e2\",\"amount\":\"forty\"}\n",
    )
    .expect("land");
    let streamed = |point: Option<&str>, now: i64| {
        let mut c = tidemark_at(now);
        c.env("TIDEMARK_INGEST_WAVE_BYTES", "1");
        if let Some(p) = point {
            c.env("TIDEMARK_FAILPOINTS", format!("{p}=abort"));
        }
        exec(
            c.arg("run")
                .arg(d.join("ingest.yml"))
                .args(["--output", "json"]),
        )
    };
    let killed = streamed(Some("ingest.incremental.before_commit"), T0 + 2 * HOUR);
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    let ids = |rows: Vec<Row>| rows.into_iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(
        ids(bronze(d).await),
        vec!["a0"],
        "nothing of the killed run"
    );
    let out = streamed(None, T0 + 3 * HOUR);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(v["num_files_ingested"], 4, "{v}");
    assert_eq!(v["num_files_duplicate"], 1, "{v}");
    assert_eq!(v["num_quarantined"], 1, "{v}");
    let mut got = ids(bronze(d).await);
    got.sort();
    assert_eq!(got, vec!["a0", "b1", "b2", "c1", "e1"]);
    let q = read_all(&d.join("lake/quarantine")).await;
    let b = arrow::compute::concat_batches(&q[0].schema(), &q).expect("concat");
    let text = arrow::util::pretty::pretty_format_batches(&[b])
        .expect("fmt")
        .to_string();
    assert!(text.contains("e.jsonl") && text.contains("| 2 "), "{text}");
    // a rerun finds nothing new
    let again = streamed(None, T0 + 4 * HOUR);
    let v: serde_json::Value = serde_json::from_str(again.stdout.trim()).expect("json");
    assert!(v["target_version"].is_null(), "{v}");
}

/// A JSON-lines file parsed in chunks (`TIDEMARK_INGEST_CHUNK_BYTES=1`: a line per chunk):
/// every record once, a bad line quarantined with its line number in the file, and a last line
/// cut for over an hour quarantined with its own.
#[tokio::test]
async fn a_file_parsed_in_chunks_keeps_its_line_numbers() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    pipeline(d, "");
    let mut text = String::new();
    for i in 1..=40 {
        match i {
            17 => text.push_str("{\"id\":\"bad\",\"amount\":\"x\"}\n"),
            23 => text.push('\n'),
            _ => text.push_str(&format!(
                "{{\"id\":\"r{i}\",\"amount\":{i},\"updated_at\":\"2025-01-06T10:00:00Z\"}}\n"
            )),
        }
    }
    text.push_str("{\"id\":\"cut\",\"amo");
    std::fs::write(landing(d).join("big.jsonl"), text).expect("land");
    let later = chrono::Utc::now().timestamp_micros() + 2 * HOUR;
    let out = exec(
        tidemark_at(later)
            .env("TIDEMARK_INGEST_CHUNK_BYTES", "1")
            .arg("run")
            .arg(d.join("ingest.yml"))
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(v["num_quarantined"], 2, "{v}");
    assert_eq!(v["num_rows_written"], 38, "{v}");
    assert_eq!(v["num_source_rows_read"], 40, "{v}");
    let rows = bronze(d).await;
    let mut sum = 0;
    for r in &rows {
        sum += r.1.unwrap_or(0);
    }
    assert_eq!(rows.len(), 38);
    assert_eq!(sum, (1..=40).sum::<i64>() - 17 - 23);
    let q = read_all(&d.join("lake/quarantine")).await;
    let b = arrow::compute::concat_batches(&q[0].schema(), &q).expect("concat");
    let lines = arrow::compute::cast(
        b.column_by_name("_line").expect("line"),
        &arrow::datatypes::DataType::Int64,
    )
    .expect("int");
    let mut lines: Vec<i64> =
        arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&lines)
            .values()
            .to_vec();
    lines.sort();
    assert_eq!(lines, vec![17, 41]);
}

/// A first run refused after it streamed its rows (over the quarantine's limit) leaves no
/// bronze folder behind: the data files it wrote are removed with it.
#[tokio::test]
async fn a_refused_first_run_leaves_no_data_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "");
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace("/lake/quarantine\" }", "/lake/quarantine\", max_rows: 0 }");
    std::fs::write(&p, text).expect("write");
    land(d, "a.jsonl", &[("a1", 1), ("a2", 2)]);
    std::fs::write(
        landing(d).join("b.jsonl"),
        "{\"id\":\"b1\",\"amount\":\"x\"}\n",
    )
    .expect("land");
    let out = run(d, T0 + HOUR, &[]);
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(!d.join("lake/bronze").exists(), "no bronze folder left");
}
