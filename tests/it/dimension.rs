//! `kind: dimension` through the binary: SCD2 history from change records — tracked changes open
//! versions, untracked ones update in place, deletes close, late changes split the history where
//! they belong — checked against an independent fold of every source record (a property test
//! over random deliveries, batches and runs), plus SCD1, idempotent reruns and full reloads.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use common::*;
use proptest::prelude::*;

/// One merchant change record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rec {
    pub(crate) id: Option<String>,
    seq: i64,
    ing: i64,
    segment: String,
    name: String,
    delete: bool,
}

pub(crate) fn rec(id: &str, seq: i64, segment: &str, name: &str) -> Rec {
    Rec {
        id: Some(id.into()),
        seq,
        ing: seq,
        segment: segment.into(),
        name: name.into(),
        delete: false,
    }
}

pub(crate) fn del(id: &str, seq: i64) -> Rec {
    Rec {
        delete: true,
        ..rec(id, seq, "", "")
    }
}

pub(crate) async fn land(dir: &Path, recs: &[Rec]) {
    let ts = |f: &dyn Fn(&Rec) -> i64| {
        TimestampMicrosecondArray::from(recs.iter().map(f).collect::<Vec<_>>()).with_timezone("UTC")
    };
    let tsf = |n: &str| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("merchant_id", DataType::Utf8, true),
        tsf("updated_at"),
        tsf("_ingested_at"),
        Field::new("segment", DataType::Utf8, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("op", DataType::Utf8, false),
    ]));
    let s = |f: &dyn Fn(&Rec) -> Option<String>| {
        StringArray::from(recs.iter().map(f).collect::<Vec<_>>())
    };
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(s(&|r| r.id.clone())),
            Arc::new(ts(&|r| r.seq)),
            Arc::new(ts(&|r| r.ing)),
            Arc::new(s(&|r| (!r.delete).then(|| r.segment.clone()))),
            Arc::new(s(&|r| (!r.delete).then(|| r.name.clone()))),
            Arc::new(s(&|r| Some(if r.delete { "D" } else { "U" }.to_string()))),
        ],
    )
    .expect("batch");
    append_batch(&dir.join("lake/merchants_raw"), b).await;
}

pub(crate) fn pipeline(dir: &Path, history: &str) -> PathBuf {
    let l = dir.join("lake");
    let track = if history == "scd2" {
        "track_history: [segment]\n"
    } else {
        ""
    };
    let text = format!(
        "name: merchants\nkind: dimension\nsource: {{ uri: \"{l}/merchants_raw\" }}\ntarget: {{ uri: \"{l}/merchants\" }}\nkeys: [merchant_id]\nsequence_by: updated_at\ntie_breakers: [_ingested_at]\ndeletes: {{ column: op, values: [D] }}\ncolumns: {{ exclude: [op] }}\nhistory: {history}\n{track}quarantine: {{ uri: \"{l}/quarantine\" }}\n",
        l = l.display()
    );
    let p = dir.join("merchants.yml");
    std::fs::write(&p, text).expect("write");
    p
}

/// `target.apply: deletion_vectors` on the pipeline at `p` when `dv`.
fn with_apply(p: &Path, dv: bool) {
    if dv {
        let text = std::fs::read_to_string(p)
            .expect("read")
            .replace("/merchants\" }", "/merchants\", apply: deletion_vectors }");
        assert!(text.contains("apply: deletion_vectors"), "{text}");
        std::fs::write(p, text).expect("write");
    }
}

fn run(p: &Path, now: i64, extra: &[&str]) -> serde_json::Value {
    let out = exec(
        tidemark_at(now)
            .arg("run")
            .arg(p)
            .args(["--output", "json"])
            .args(extra),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("json")
}

/// A dimension row: (key, segment, name, valid_from, valid_to, is_current).
pub(crate) type Row = (String, String, String, i64, Option<i64>, bool);

pub(crate) async fn table(dir: &Path, scd2: bool) -> Vec<Row> {
    let mut out = Vec::new();
    for b in read_all(&dir.join("lake/merchants")).await {
        let s = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect(c), &DataType::Utf8).expect("cast")
        };
        let (id, seg, name) = (s("merchant_id"), s("segment"), s("name"));
        let ts = |c: &str| {
            arrow::compute::cast(
                b.column_by_name(c).expect(c),
                &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            )
            .expect("cast")
        };
        for i in 0..b.num_rows() {
            let text = |a: &arrow::array::ArrayRef| a.as_string::<i32>().value(i).to_string();
            let (from, to, current) = if scd2 {
                let (f, t) = (ts("valid_from"), ts("valid_to"));
                let (f, t) = (
                    f.as_primitive::<TimestampMicrosecondType>(),
                    t.as_primitive::<TimestampMicrosecondType>(),
                );
                let cur = b.column_by_name("is_current").expect("is_current");
                (
                    f.value(i),
                    t.is_valid(i).then(|| t.value(i)),
                    cur.as_boolean().value(i),
                )
            } else {
                (0, None, true)
            };
            out.push((text(&id), text(&seg), text(&name), from, to, current));
        }
    }
    out.sort();
    out
}

/// The oracle, written apart from tidemark's fold: per key, the records sorted by (sequence,
/// arrival; a delete after an upsert of the same instant; then content), a record delivered
/// twice counted once, then walked: a segment change opens a version, a name change updates
/// the open one, a delete closes it.
pub(crate) fn oracle(recs: &[Rec], scd2: bool) -> Vec<Row> {
    let mut by_key: BTreeMap<String, Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        if let Some(id) = &r.id {
            by_key.entry(id.clone()).or_default().push(r);
        }
    }
    let mut out = Vec::new();
    for (id, mut rs) in by_key {
        rs.sort_by(|a, b| {
            (a.seq, a.ing, a.delete, &a.segment, &a.name)
                .cmp(&(b.seq, b.ing, b.delete, &b.segment, &b.name))
        });
        // Of records with the same order and kind, the last (greatest content) wins.
        let mut kept: Vec<&Rec> = Vec::new();
        for r in rs {
            if let Some(last) = kept.last() {
                if (last.seq, last.ing, last.delete) == (r.seq, r.ing, r.delete) {
                    kept.pop();
                }
            }
            kept.push(r);
        }
        let mut open: Option<(String, String, i64)> = None;
        let mut versions: Vec<Row> = Vec::new();
        for r in kept {
            if r.delete {
                if let Some((seg, name, from)) = open.take() {
                    versions.push((id.clone(), seg, name, from, Some(r.seq), false));
                }
                continue;
            }
            open = match open.take() {
                Some((seg, _, from)) if seg == r.segment => Some((seg, r.name.clone(), from)),
                Some((seg, name, from)) => {
                    versions.push((id.clone(), seg, name, from, Some(r.seq), false));
                    Some((r.segment.clone(), r.name.clone(), r.seq))
                }
                None => Some((r.segment.clone(), r.name.clone(), r.seq)),
            };
        }
        if let Some((seg, name, from)) = open {
            versions.push((id.clone(), seg, name, from, None, true));
        }
        if scd2 {
            out.extend(versions);
        } else {
            out.extend(
                versions
                    .into_iter()
                    .filter(|v| v.5)
                    .map(|(k, s, n, _, _, c)| (k, s, n, 0, None, c)),
            );
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scd2_history_with_in_place_updates_deletes_and_a_late_split() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let h = HOUR;
    let mut all = vec![
        rec("m1", T0 + h, "small", "Acme"),
        rec("m2", T0 + h, "large", "Bolt"),
    ];
    land(d, &all).await;
    let s = run(&p, T0 + 2 * h, &[]);
    assert_eq!(s["mode"], "bootstrap", "{s}");
    assert_eq!(table(d, true).await, oracle(&all, true));
    assert_eq!(table(d, true).await.len(), 2);

    // A name change (untracked: in place), a segment change (a new version), a delete.
    let batch = vec![
        rec("m1", T0 + 3 * h, "small", "Acme Ltd"),
        rec("m1", T0 + 5 * h, "mid", "Acme Ltd"),
        del("m2", T0 + 4 * h),
    ];
    land(d, &batch).await;
    all.extend(batch);
    let s = run(&p, T0 + 6 * h, &[]);
    assert_eq!(s["mode"], "incremental", "{s}");
    assert_eq!(s["num_keys_changed"], 2, "{s}");
    assert_eq!(s["num_updated_in_place"], 1, "{s}");
    let rows = table(d, true).await;
    assert_eq!(rows, oracle(&all, true));
    assert_eq!(
        rows,
        vec![
            (
                "m1".into(),
                "mid".into(),
                "Acme Ltd".into(),
                T0 + 5 * h,
                None,
                true
            ),
            (
                "m1".into(),
                "small".into(),
                "Acme Ltd".into(),
                T0 + h,
                Some(T0 + 5 * h),
                false
            ),
            (
                "m2".into(),
                "large".into(),
                "Bolt".into(),
                T0 + h,
                Some(T0 + 4 * h),
                false
            ),
        ]
    );
    // Nothing new: no commit.
    let again = run(&p, T0 + 7 * h, &[]);
    assert!(again["target_version"].is_null(), "{again}");

    // A late segment change at 2h lands inside the first version and splits it; the name change
    // at 3h belongs to the new piece. A record delivered again changes nothing; a record without
    // a key is quarantined.
    let late = vec![
        rec("m1", T0 + 2 * h, "large", "Acme"),
        rec("m1", T0 + 3 * h, "small", "Acme Ltd"),
        Rec {
            id: None,
            ..rec("x", T0 + 2 * h, "small", "Nobody")
        },
    ];
    land(d, &late).await;
    all.extend(late);
    let s = run(&p, T0 + 8 * h, &[]);
    assert_eq!(s["num_quarantined"], 1, "{s}");
    let rows = table(d, true).await;
    assert_eq!(rows, oracle(&all, true));
    assert_eq!(
        rows.iter()
            .filter(|r| r.0 == "m1")
            .map(|r| (r.1.as_str(), r.3, r.4))
            .collect::<Vec<_>>(),
        vec![
            ("large", T0 + 2 * h, Some(T0 + 3 * h)),
            ("mid", T0 + 5 * h, None),
            ("small", T0 + h, Some(T0 + 2 * h)),
            ("small", T0 + 3 * h, Some(T0 + 5 * h)),
        ],
        "{rows:?}"
    );

    // A full reload rebuilds the same table, and commits nothing new when it equals it.
    let incremental = table(d, true).await;
    let s = run(&p, T0 + 9 * h, &["--full-reload"]);
    assert_eq!(s["mode"], "full_reload", "{s}");
    assert!(s["target_version"].is_null(), "{s}");
    assert_eq!(table(d, true).await, incremental);

    // The surrogate keys: one durable key per merchant, one version key per version.
    let batches = read_all(&d.join("lake/merchants")).await;
    let mut durable: BTreeMap<String, std::collections::BTreeSet<i64>> = BTreeMap::new();
    let mut versions = std::collections::BTreeSet::new();
    for b in &batches {
        let id = arrow::compute::cast(
            b.column_by_name("merchant_id").expect("id"),
            &DataType::Utf8,
        )
        .expect("cast");
        let dk = b.column_by_name("durable_key").expect("durable_key");
        let vk = b.column_by_name("version_key").expect("version_key");
        for i in 0..b.num_rows() {
            durable
                .entry(id.as_string::<i32>().value(i).to_string())
                .or_default()
                .insert(dk.as_primitive::<arrow::datatypes::Int64Type>().value(i));
            versions.insert(vk.as_primitive::<arrow::datatypes::Int64Type>().value(i));
        }
    }
    assert!(durable.values().all(|s| s.len() == 1), "{durable:?}");
    assert_eq!(versions.len(), incremental.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scd1_keeps_the_newest_row_of_each_live_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd1");
    let h = HOUR;
    let all = vec![
        rec("m1", T0 + h, "small", "Acme"),
        rec("m1", T0 + 3 * h, "mid", "Acme Ltd"),
        rec("m2", T0 + h, "large", "Bolt"),
        del("m2", T0 + 2 * h),
    ];
    land(d, &all).await;
    run(&p, T0 + 4 * h, &[]);
    assert_eq!(table(d, false).await, oracle(&all, false));
    assert_eq!(table(d, false).await.len(), 1);
}

/// A composite key (merchant and name here): an hourly run replaces exactly the changed key's
/// rows — not every row sharing its first column, and without failing — in both apply modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_key_is_replaced_exactly_in_both_modes() {
    for dv in [false, true] {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let p = pipeline(d, "scd2");
        let text = std::fs::read_to_string(&p)
            .expect("read")
            .replace("keys: [merchant_id]", "keys: [merchant_id, name]");
        std::fs::write(&p, text).expect("write");
        with_apply(&p, dv);
        let h = HOUR;
        land(
            d,
            &[
                rec("m1", T0 + h, "small", "Acme"),
                rec("m1", T0 + h, "small", "Acme EU"),
                rec("m2", T0 + h, "large", "Bolt"),
            ],
        )
        .await;
        run(&p, T0 + 4 * h, &[]);
        land(d, &[rec("m1", T0 + 2 * h, "mid", "Acme")]).await;
        let v = run(&p, T0 + 4 * h, &[]);
        assert_eq!(v["num_keys_changed"], 1, "dv: {dv}: {v}");
        let s = |x: &str| x.to_string();
        assert_eq!(
            table(d, true).await,
            vec![
                (s("m1"), s("mid"), s("Acme"), T0 + 2 * h, None, true),
                (
                    s("m1"),
                    s("small"),
                    s("Acme"),
                    T0 + h,
                    Some(T0 + 2 * h),
                    false
                ),
                (s("m1"), s("small"), s("Acme EU"), T0 + h, None, true),
                (s("m2"), s("large"), s("Bolt"), T0 + h, None, true),
            ],
            "dv: {dv}"
        );
        assert_eq!(v["num_rows_marked_deleted"], if dv { 1 } else { 0 }, "{v}");
    }
}

#[test]
fn a_dimension_pipeline_that_cannot_work_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd1");
    let text = std::fs::read_to_string(&p).expect("read") + "track_history: [segment]\n";
    std::fs::write(&p, text).expect("write");
    let out = exec(tidemark_at(T0).arg("run").arg(&p));
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(out.stderr.contains("history: scd2"), "{}", out.stderr);
}

#[derive(Debug, Clone)]
struct Ev {
    key: u8,
    seq: u8,
    segment: u8,
    name: u8,
    delete: bool,
    batch: usize,
    twice: bool,
}

fn ev() -> impl Strategy<Value = Ev> {
    (
        0u8..4,
        0u8..12,
        0u8..3,
        0u8..3,
        prop::bool::weighted(0.15),
        0usize..4,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(key, seq, segment, name, delete, batch, twice)| Ev {
            key,
            seq,
            segment,
            name,
            delete,
            batch,
            twice,
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        max_shrink_iters: 32,
        .. ProptestConfig::default()
    })]

    /// Any records, delivered in any order and batches (late ones included, some twice), with a
    /// run after each batch and a full reload at the end: the table is the oracle's fold of
    /// everything delivered so far.
    #[test]
    fn the_table_is_the_fold_of_every_record_after_any_runs(
        evs in prop::collection::vec(ev(), 1..24),
        dv in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tmp");
            let d = dir.path();
            let p = pipeline(d, "scd2");
            with_apply(&p, dv);
            let mut landed: Vec<Rec> = Vec::new();
            for b in 0..4 {
                let mut batch = Vec::new();
                for e in evs.iter().filter(|e| e.batch == b) {
                    // Arrival: the batch's hour (so later batches carry older sequences: late).
                    let ing = T0 + 100 * HOUR + b as i64 * HOUR;
                    let r = Rec {
                        id: Some(format!("m{}", e.key)),
                        seq: T0 + e.seq as i64 * HOUR,
                        ing,
                        segment: format!("s{}", e.segment),
                        name: format!("n{}", e.name),
                        delete: e.delete,
                    };
                    if e.twice {
                        batch.push(r.clone());
                    }
                    batch.push(r);
                }
                if batch.is_empty() {
                    continue;
                }
                land(d, &batch).await;
                landed.extend(batch);
                run(&p, T0 + 200 * HOUR, &[]);
                prop_assert_eq!(table(d, true).await, oracle(&landed, true), "after batch {}", b);
                // and `reconcile` says so
                let r = exec(tidemark_at(T0 + 200 * HOUR).arg("reconcile").arg(&p));
                prop_assert_eq!(r.code, 0, "reconcile after batch {}: {}\n{}", b, r.stdout, r.stderr);
            }
            let before = table(d, true).await;
            run(&p, T0 + 200 * HOUR, &["--full-reload"]);
            prop_assert_eq!(table(d, true).await, before);
            Ok(())
        })?;
    }
}

/// `reconcile` on a dimension: right after runs with late records, a tampered version is exit
/// 65 naming its key (and only it), and a full reload puts it right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_names_the_keys_whose_versions_are_not_the_fold() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let mut late = rec("m1", T0 + HOUR, "small", "Ann");
    late.ing = T0 + 30 * HOUR;
    land(
        d,
        &[
            rec("m1", T0 + 2 * HOUR, "large", "Ann"),
            rec("m2", T0, "mid", "Bo"),
        ],
    )
    .await;
    run(&p, T0 + 40 * HOUR, &[]);
    land(d, &[late]).await;
    run(&p, T0 + 40 * HOUR, &[]);
    let reconcile = || exec(tidemark_at(T0 + 40 * HOUR).arg("reconcile").arg(&p));
    let ok = reconcile();
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("identical"), "{}", ok.stdout);
    // m2's segment is changed by hand
    let rows = read_all(&d.join("lake/merchants")).await;
    let tampered: Vec<arrow::array::RecordBatch> = rows
        .iter()
        .map(|b| {
            let i = b.schema().index_of("segment").expect("segment");
            let ids = arrow::compute::cast(
                b.column(b.schema().index_of("merchant_id").expect("id")),
                &arrow::datatypes::DataType::Utf8,
            )
            .expect("ids");
            let ids = ids.as_string::<i32>();
            let seg =
                arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Utf8).expect("seg");
            let seg = seg.as_string::<i32>();
            let new: arrow::array::StringArray = (0..b.num_rows())
                .map(|r| match ids.value(r) {
                    "m2" => Some("enterprise".to_string()),
                    _ => seg.is_valid(r).then(|| seg.value(r).to_string()),
                })
                .collect();
            let new = arrow::compute::cast(&new, b.column(i).data_type()).expect("cast");
            let mut cols = b.columns().to_vec();
            cols[i] = new;
            arrow::array::RecordBatch::try_new(b.schema(), cols).expect("batch")
        })
        .collect();
    let url =
        deltalake::ensure_table_uri(d.join("lake/merchants").to_str().expect("utf8")).expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .write(tampered)
        .with_save_mode(deltalake::protocol::SaveMode::Overwrite)
        .await
        .expect("overwrite");
    let bad = reconcile();
    assert_eq!(bad.code, 65, "{}\n{}", bad.stdout, bad.stderr);
    assert!(bad.stdout.contains("1 key(s) differ"), "{}", bad.stdout);
    assert!(
        bad.stdout.contains("m2") && !bad.stdout.contains("m1"),
        "{}",
        bad.stdout
    );
    assert!(bad.stderr.contains("--full-reload"), "{}", bad.stderr);
    run(&p, T0 + 40 * HOUR, &["--full-reload"]);
    assert_eq!(reconcile().code, 0);
}

/// What the table is built from changes — a new source column, another `track_history`, a
/// column excluded — and the next run rebuilds every key with a warning and writes the table
/// again (even with no new record). Two versions opening at one instant (ordered by the
/// tie-breaker) get their own version keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_layout_rebuilds_every_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let h = HOUR;
    let mut same_instant = rec("m3", T0 + h, "b", "Cato");
    same_instant.ing = T0 + 2 * h;
    let all = vec![
        rec("m1", T0 + h, "small", "Acme"),
        rec("m1", T0 + 2 * h, "small", "Acme Ltd"),
        rec("m3", T0 + h, "a", "Cato"),
        same_instant,
    ];
    land(d, &all).await;
    run(&p, T0 + 3 * h, &[]);
    let keys: std::collections::BTreeSet<i64> = read_all(&d.join("lake/merchants"))
        .await
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("version_key").expect("version_key");
            let c = c.as_primitive::<arrow::datatypes::Int64Type>();
            (0..b.num_rows()).map(|i| c.value(i)).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        keys.len(),
        3,
        "m1 one version, m3 two (one instant): {keys:?}"
    );

    // Track every column now: the name change opens a version; no new record is needed.
    let text = std::fs::read_to_string(&p)
        .expect("read")
        .replace("track_history: [segment]\n", "");
    std::fs::write(&p, &text).expect("write");
    let s = run(&p, T0 + 4 * h, &[]);
    assert!(s["target_version"].is_u64(), "{s}");
    assert!(s["warnings"].to_string().contains("rules changed"), "{s}");
    let m1: Vec<String> = table(d, true)
        .await
        .into_iter()
        .filter(|r| r.0 == "m1")
        .map(|r| r.2)
        .collect();
    assert_eq!(m1, vec!["Acme", "Acme Ltd"]);
    // The rerun is quiet again.
    assert!(run(&p, T0 + 5 * h, &[])["target_version"].is_null());

    // Exclude `name`: the column goes.
    let text = text.replace("exclude: [op]", "exclude: [op, name]");
    std::fs::write(&p, &text).expect("write");
    let s = run(&p, T0 + 6 * h, &[]);
    assert!(s["target_version"].is_u64(), "{s}");
    let b = read_all(&d.join("lake/merchants")).await;
    assert!(
        b.iter().all(|b| b.column_by_name("name").is_none()),
        "name is gone"
    );
    assert!(run(&p, T0 + 7 * h, &[])["target_version"].is_null());
}

/// Payments naming merchants (`merchant_id`), as the facts table of `infer_from`.
async fn facts(dir: &Path, merchants: &[&str]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("payment_id", DataType::Utf8, false),
        Field::new("merchant_id", DataType::Utf8, true),
    ]));
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(
                (0..merchants.len())
                    .map(|i| format!("p{i}"))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(merchants.to_vec())),
        ],
    )
    .expect("batch");
    append_batch(&dir.join("lake/payments"), b).await;
}

/// (key, is_inferred, durable_key, version_key, inferred_at) of every row.
async fn inferred_rows(dir: &Path) -> Vec<(String, bool, i64, i64, Option<i64>)> {
    let mut out = Vec::new();
    for b in read_all(&dir.join("lake/merchants")).await {
        let id = arrow::compute::cast(
            b.column_by_name("merchant_id").expect("id"),
            &DataType::Utf8,
        )
        .expect("cast");
        let flag = b.column_by_name("is_inferred").expect("is_inferred");
        let i64s = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect(c), &DataType::Int64).expect("cast")
        };
        let (dk, vk, at) = (
            i64s("durable_key"),
            i64s("version_key"),
            i64s("inferred_at"),
        );
        for i in 0..b.num_rows() {
            let at_i = at.as_primitive::<arrow::datatypes::Int64Type>();
            out.push((
                id.as_string::<i32>().value(i).to_string(),
                flag.as_boolean().value(i),
                dk.as_primitive::<arrow::datatypes::Int64Type>().value(i),
                vk.as_primitive::<arrow::datatypes::Int64Type>().value(i),
                at_i.is_valid(i).then(|| at_i.value(i)),
            ));
        }
    }
    out.sort();
    out
}

/// 1900-01-01T00:00:00Z in microseconds: where an inferred member's history starts.
const BEGINNING: i64 = -2_208_988_800_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_that_come_first_get_a_placeholder_completed_in_place() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let text = std::fs::read_to_string(&p).expect("read")
        + &format!(
            "infer_from: [{{ source: \"{}/lake/payments\", key: merchant_id }}]\nplaceholder: {{ name: \"Unknown (pending)\", segment: unknown }}\nalert_after: 1d\nfail_after: 3d\n",
            d.display()
        );
    std::fs::write(&p, text).expect("write");
    let h = HOUR;
    land(d, &[rec("m1", T0 + h, "small", "Acme")]).await;
    facts(d, &["m1", "m9", "m1"]).await;
    let s = run(&p, T0 + 2 * h, &[]);
    assert_eq!(
        (
            s["num_inferred_new"].as_u64(),
            s["num_inferred_pending"].as_u64()
        ),
        (Some(1), Some(1)),
        "{s}"
    );
    let rows = table(d, true).await;
    assert_eq!(
        rows,
        vec![
            (
                "m1".into(),
                "small".into(),
                "Acme".into(),
                T0 + h,
                None,
                true
            ),
            (
                "m9".into(),
                "unknown".into(),
                "Unknown (pending)".into(),
                BEGINNING,
                None,
                true
            ),
        ]
    );
    let placeholder = inferred_rows(d).await[1].clone();
    assert!(placeholder.1, "m9 is inferred: {placeholder:?}");
    assert_eq!(
        placeholder.4,
        Some(T0 + 2 * h),
        "inferred at the run's time"
    );
    // Nothing new: no commit, the placeholder stays as it is.
    assert!(run(&p, T0 + 3 * h, &[])["target_version"].is_null());

    // Two days on, still pending: past alert_after, a warning and a count; the run succeeds.
    let s = run(&p, T0 + 50 * h, &[]);
    assert_eq!(s["num_inferred_overdue"], 1, "{s}");
    assert!(s["warnings"].to_string().contains("still pending"), "{s}");

    // m9's record arrives: the placeholder is completed in place — the same keys, not inferred,
    // valid from 1900 so the payments from before the record find it.
    land(
        d,
        &[
            rec("m9", T0 + 40 * h, "mid", "Nine"),
            rec("m9", T0 + 45 * h, "large", "Nine"),
        ],
    )
    .await;
    let s = run(&p, T0 + 51 * h, &[]);
    assert_eq!(s["num_inferred_completed"], 1, "{s}");
    assert_eq!(s["num_inferred_pending"], 0, "{s}");
    let rows = table(d, true).await;
    assert_eq!(
        rows.iter()
            .filter(|r| r.0 == "m9")
            .cloned()
            .collect::<Vec<_>>(),
        vec![
            (
                "m9".into(),
                "large".into(),
                "Nine".into(),
                T0 + 45 * h,
                None,
                true
            ),
            (
                "m9".into(),
                "mid".into(),
                "Nine".into(),
                BEGINNING,
                Some(T0 + 45 * h),
                false
            ),
        ]
    );
    let m9: Vec<_> = inferred_rows(d)
        .await
        .into_iter()
        .filter(|r| r.0 == "m9")
        .collect();
    let first = m9
        .iter()
        .find(|r| r.3 == placeholder.3)
        .expect("the placeholder's version key lives on");
    assert_eq!(
        (first.1, first.2, first.4),
        (false, placeholder.2, placeholder.4),
        "{m9:?}"
    );

    // A full reload keeps it so (the placeholder's mark is read from the table it replaces).
    let before = inferred_rows(d).await;
    run(&p, T0 + 52 * h, &["--full-reload"]);
    assert_eq!(inferred_rows(d).await, before);

    // A new unknown merchant, left pending past fail_after: the run stops, nothing written.
    facts(d, &["m7"]).await;
    assert_eq!(run(&p, T0 + 53 * h, &[])["num_inferred_new"], 1);
    let planned = version(&d.join("lake/merchants")).await;
    let out = exec(tidemark_at(T0 + 53 * h + 4 * 24 * h).arg("run").arg(&p));
    assert_eq!(out.code, 65, "{}", out.stderr);
    assert!(
        out.stderr.contains("m7") && out.stderr.contains("fail_after"),
        "{}",
        out.stderr
    );
    assert_eq!(version(&d.join("lake/merchants")).await, planned);
}

/// Payments with their time and arrival, for an aggregate that looks merchants up.
async fn payments(dir: &Path, rows: &[(&str, &str, i64)], arrived: i64) {
    let tsf = |n: &str| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("payment_id", DataType::Utf8, false),
        Field::new("merchant_id", DataType::Utf8, true),
        tsf("created_at"),
        tsf("_ingested_at"),
    ]));
    let ts = |v: Vec<i64>| TimestampMicrosecondArray::from(v).with_timezone("UTC");
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(ts(rows.iter().map(|r| r.2).collect())),
            Arc::new(ts(vec![arrived; rows.len()])),
        ],
    )
    .expect("batch");
    append_batch(&dir.join("lake/payments"), b).await;
}

/// gold's (day, segment, payments), sorted.
async fn gold(dir: &Path) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    for b in read_all(&dir.join("lake/gold")).await {
        let s = |c: &str| {
            arrow::compute::cast(b.column_by_name(c).expect(c), &DataType::Utf8).expect("cast")
        };
        let (day, seg) = (s("event_date"), s("segment"));
        let n = arrow::compute::cast(
            b.column_by_name("payments").expect("payments"),
            &DataType::Int64,
        )
        .expect("cast");
        for i in 0..b.num_rows() {
            out.push((
                day.as_string::<i32>().value(i).to_string(),
                seg.as_string::<i32>().value(i).to_string(),
                n.as_primitive::<arrow::datatypes::Int64Type>().value(i),
            ));
        }
    }
    out.sort();
    out
}

/// An aggregate grouped by the segment each payment's merchant had **when it was made**: a
/// merchant that moves segment moves its later payments only; a payment for a merchant the
/// dimension inferred, or from before its merchant's first record, counts under the inferred
/// member's values (never dropped); a late payment lands in the segment of its own time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_look_the_dimension_up_as_of_each_payment() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let text = std::fs::read_to_string(&p).expect("read")
        + &format!(
            "infer_from: [{{ source: \"{}/lake/payments\", key: merchant_id }}]\nplaceholder: {{ name: \"Unknown (pending)\", segment: unknown }}\n",
            d.display()
        );
    std::fs::write(&p, text).expect("write");
    let agg = d.join("by_segment.yml");
    std::fs::write(
        &agg,
        format!(
            "name: by_segment\nkind: aggregate\nsource: {{ uri: \"{l}/payments\" }}\ntarget: {{ uri: \"{l}/gold\" }}\nevent_date: {{ column: created_at }}\ngroup_by: [segment]\nmeasures:\n  - {{ name: payments, agg: count }}\nrecompute: {{ lookback: 3d }}\nlookups:\n  - {{ dimension: merchants, key: merchant_id, as_of: created_at, columns: [segment] }}\n",
            l = d.join("lake").display()
        ),
    )
    .expect("write");
    let h = HOUR;
    land(
        d,
        &[
            rec("m1", T0 + h, "small", "Acme"),
            rec("m1", T0 + 30 * h, "large", "Acme"),
        ],
    )
    .await;
    payments(
        d,
        &[
            ("p1", "m1", T0 + 2 * h),  // day 1: m1 was small
            ("p2", "m1", T0 + 31 * h), // day 2: m1 is large
            ("p3", "m9", T0 + 3 * h),  // unknown merchant: inferred
            ("p4", "m1", T0 + h / 2),  // before m1's first record: the inferred member's values
        ],
        T0 + 32 * h,
    )
    .await;
    run(&p, T0 + 33 * h, &[]);
    let date = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .expect("date")
            .date_naive()
            .to_string()
    };
    let (day1, day2) = (date(T0), date(T0 + 24 * h));
    let out = exec(
        tidemark_at(T0 + 33 * h)
            .arg("run")
            .arg(&agg)
            .args(["--logical-date", &day2]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        gold(d).await,
        vec![
            (day1.clone(), "small".into(), 1),
            (day1.clone(), "unknown".into(), 2),
            (day2.clone(), "large".into(), 1),
        ]
    );

    // An `as_of` that is not a time is a config error at its line (gold untouched).
    let bad = d.join("bad.yml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&agg)
            .expect("read")
            .replace("as_of: created_at", "as_of: payment_id"),
    )
    .expect("write");
    let gold_version = version(&d.join("lake/gold")).await;
    let out = exec(
        tidemark_at(T0 + 33 * h)
            .arg("run")
            .arg(&bad)
            .args(["--logical-date", &day2]),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("bad.yml:11:") && out.stderr.contains("timestamp or date"),
        "{}",
        out.stderr
    );
    assert_eq!(version(&d.join("lake/gold")).await, gold_version);

    // A payment from day 1 arrives late, after m1 moved: it counts as small, as m1 was then.
    payments(d, &[("p5", "m1", T0 + 5 * h)], T0 + 34 * h).await;
    run(&p, T0 + 35 * h, &[]);
    let out = exec(
        tidemark_at(T0 + 35 * h)
            .arg("run")
            .arg(&agg)
            .args(["--logical-date", &day2]),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        gold(d).await.contains(&(day1, "small".into(), 2)),
        "{:?}",
        gold(d).await
    );
}

/// The demo tells the dimension's story: merchants the payments name first are inferred, and
/// completed in place hours later when their record lands; gold by segment counts the pending
/// ones as `unknown`.
#[test]
fn the_demo_infers_merchants_and_completes_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let lake = dir.path().join("lake");
    let bundle = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bundle");
    let mut last = String::new();
    // (the generated world's first completion lands in the demo's 6th hour)
    for _ in 0..8 {
        let out = exec(
            tidemark_at(T0)
                .current_dir(dir.path())
                .arg("demo")
                .arg("--lake")
                .arg(&lake)
                .arg("--bundle")
                .arg(&bundle),
        );
        assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
        last = out.stdout;
    }
    let line = paragraph(&last, "merchants (SCD2")
        .unwrap_or_else(|| panic!("no merchants story:\n{last}"));
    assert!(line.contains("placeholder(s) pending"), "{line}");
    assert!(
        line.contains("is valid from 1900-01-01"),
        "a completed merchant: {line}"
    );
    let segments =
        paragraph(&last, "payments of ").unwrap_or_else(|| panic!("no segments line:\n{last}"));
    assert!(segments.contains("unknown"), "{segments}");
    let late = paragraph(&last, "a late payment: ")
        .unwrap_or_else(|| panic!("no late payment example:\n{last}"));
    assert!(
        late.contains("the segment") && late.contains("had then"),
        "{late}"
    );
}

/// The paragraph of `out` whose first line starts with `start`: that line and the indented lines
/// that continue it (the demo wraps its prose at 100 columns), joined by spaces.
fn paragraph(out: &str, start: &str) -> Option<String> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(start));
    let first = lines.next()?;
    let rest = lines.take_while(|l| l.starts_with("  ")).map(str::trim);
    Some(
        std::iter::once(first)
            .chain(rest)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// `tidemark generate --merchants` writes the merchants feed the bundle's dimension reads, and
/// `--next-hour` appends what landed in the following hours; both say how many records.
#[test]
fn generate_writes_the_merchants_feed() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = dir.path().join("merchants_raw");
    let out = exec(
        tidemark_at(T0)
            .arg("generate")
            .arg("--merchants")
            .arg(&m)
            .args(["--days", "5", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert!(
        v["merchants"]["records"].as_u64().unwrap_or(0) > 20_000,
        "{v}"
    );
    let out = exec(
        tidemark_at(T0)
            .arg("generate")
            .arg("--merchants")
            .arg(&m)
            .args(["--next-hour", "--hours", "24", "--output", "json"]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert!(v["merchants"]["records"].as_u64().unwrap_or(0) > 0, "{v}");
    let again = exec(tidemark_at(T0).arg("generate").arg("--merchants").arg(&m));
    assert_eq!(again.code, 64, "{}", again.stderr);
    assert!(again.stderr.contains("--next-hour"), "{}", again.stderr);
}

/// The oracle with inferred members: per run (after batch `b`), the keys the facts named that no
/// record had named yet get a placeholder; a key that was one has its first version from 1900
/// once its records give it a version; a key whose records give none loses its row (and the
/// mark). Returns the expected table after the last run.
fn oracle_inferred(recs: &[(usize, Rec)], facts: &[(usize, String)], runs: usize) -> Vec<Row> {
    let mut marked: std::collections::BTreeSet<String> = Default::default();
    let mut rows = Vec::new();
    for b in 0..runs {
        let landed: Vec<Rec> = recs
            .iter()
            .filter(|(rb, _)| *rb <= b)
            .map(|(_, r)| r.clone())
            .collect();
        let recorded: std::collections::BTreeSet<String> =
            landed.iter().filter_map(|r| r.id.clone()).collect();
        let named: std::collections::BTreeSet<String> = facts
            .iter()
            .filter(|(fb, _)| *fb <= b)
            .map(|(_, k)| k.clone())
            .collect();
        let folded = oracle(&landed, true);
        let with_versions: std::collections::BTreeSet<String> =
            folded.iter().map(|r| r.0.clone()).collect();
        // (a marked key whose records give no version loses its row and its mark)
        marked.retain(|k| !recorded.contains(k) || with_versions.contains(k));
        for k in named.iter().filter(|k| !recorded.contains(*k)) {
            marked.insert(k.clone());
        }
        rows = Vec::new();
        let mut seen_first = std::collections::BTreeSet::new();
        let mut sorted = folded;
        // (in time order; of two versions from the same instant, the one already closed — a
        // zero-length version, when two records share a sequence — comes first)
        sorted.sort_by(|a, b| {
            (a.0.as_str(), a.3, a.4.is_none(), a.4).cmp(&(b.0.as_str(), b.3, b.4.is_none(), b.4))
        });
        for mut r in sorted {
            if marked.contains(&r.0) && seen_first.insert(r.0.clone()) {
                r.3 = BEGINNING;
            }
            rows.push(r);
        }
        for k in marked.iter().filter(|k| !recorded.contains(*k)) {
            rows.push((
                k.clone(),
                "unknown".into(),
                "Unknown (pending)".into(),
                BEGINNING,
                None,
                true,
            ));
        }
        rows.sort();
    }
    rows
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(6),
        max_shrink_iters: 32,
        .. ProptestConfig::default()
    })]

    /// Facts naming merchants before, with or after their records, in any batches, a run after
    /// each and a full reload at the end: placeholders appear for unknown keys only, are
    /// completed in place (first version from 1900) when records arrive, and the rest of the
    /// table is the fold.
    #[test]
    fn inferred_members_are_completed_in_place_after_any_runs(
        evs in prop::collection::vec(ev(), 1..16),
        facts in prop::collection::vec((0u8..5, 0usize..4), 1..8),
        dv in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tmp");
            let d = dir.path();
            let p = pipeline(d, "scd2");
            let text = std::fs::read_to_string(&p).expect("read")
                + &format!(
                    "infer_from: [{{ source: \"{}/lake/payments\", key: merchant_id }}]\nplaceholder: {{ name: \"Unknown (pending)\", segment: unknown }}\n",
                    d.display()
                );
            std::fs::write(&p, text).expect("write");
            with_apply(&p, dv);
            let mut recs: Vec<(usize, Rec)> = Vec::new();
            let mut named: Vec<(usize, String)> = Vec::new();
            let mut runs = 0;
            for b in 0..4 {
                let batch: Vec<Rec> = evs
                    .iter()
                    .filter(|e| e.batch == b)
                    .map(|e| Rec {
                        id: Some(format!("m{}", e.key)),
                        seq: T0 + e.seq as i64 * HOUR,
                        ing: T0 + 100 * HOUR + b as i64 * HOUR,
                        segment: format!("s{}", e.segment),
                        name: format!("n{}", e.name),
                        delete: e.delete,
                    })
                    .collect();
                let keys: Vec<String> = facts.iter().filter(|f| f.1 == b).map(|f| format!("m{}", f.0)).collect();
                if batch.is_empty() && keys.is_empty() && b > 0 {
                    continue;
                }
                // (a run needs the source and the facts tables to exist)
                if !batch.is_empty() || b == 0 {
                    let landed = if batch.is_empty() { vec![rec("m_seed", T0, "s0", "n0")] } else { batch };
                    land(d, &landed).await;
                    recs.extend(landed.into_iter().map(|r| (runs, r)));
                }
                let k: Vec<&str> = keys.iter().map(String::as_str).collect();
                facts_at(d, &k).await;
                named.extend(keys.into_iter().map(|k| (runs, k)));
                run(&p, T0 + 200 * HOUR, &[]);
                runs += 1;
                prop_assert_eq!(table(d, true).await, oracle_inferred(&recs, &named, runs), "after run {}", runs);
            }
            let before = table(d, true).await;
            run(&p, T0 + 200 * HOUR, &["--full-reload"]);
            prop_assert_eq!(table(d, true).await, before);
            Ok(())
        })?;
    }
}

/// [`facts`], creating the table even with no key (so the pipeline's facts always exist).
async fn facts_at(dir: &Path, merchants: &[&str]) {
    if merchants.is_empty() && dir.join("lake/payments").exists() {
        return;
    }
    facts(dir, merchants).await;
}

/// A mistake in the dimension's file is one error, though two of the job's pipelines load it
/// (its own task, and the gold that looks it up).
#[test]
fn a_broken_dimension_file_is_one_error_for_the_demo() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for sub in ["bundle", "bundle/resources", "pipelines"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        for e in std::fs::read_dir(root.join(sub))
            .expect("read dir")
            .filter_map(Result::ok)
        {
            if e.path().is_file() {
                std::fs::copy(e.path(), dir.path().join(sub).join(e.file_name())).expect("copy");
            }
        }
    }
    let m = dir.path().join("pipelines/merchants.yml");
    let text = std::fs::read_to_string(&m)
        .expect("read")
        .replace("sequence_by: updated_at", "sequence_by: [updated_at]");
    std::fs::write(&m, text).expect("write");
    let out = exec(
        tidemark_at(T0)
            .current_dir(dir.path())
            .arg("demo")
            .arg("--bundle")
            .arg(dir.path().join("bundle"))
            .arg("--lake")
            .arg(dir.path().join("lake")),
    );
    assert_eq!(out.code, 78, "{}", out.stderr);
    assert!(
        out.stderr.contains("the bundle has 1 error"),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.matches("merchants.yml:").count(),
        1,
        "{}",
        out.stderr
    );
}

/// A compaction of the source (`dataChange = false`) and then another writer's DELETE: the
/// deleted rows were merged long ago, so the run refuses (65) instead of saying "nothing to
/// change" — exactly as it does without the compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_after_a_compaction_of_the_source_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd1");
    land(d, &[rec("m1", T0 + HOUR, "small", "Acme")]).await;
    land(d, &[rec("m2", T0 + HOUR, "large", "Bolt")]).await;
    run(&p, T0 + 2 * HOUR, &[]);
    let source = d.join("lake/merchants_raw");
    open_table(&source)
        .await
        .optimize()
        .await
        .expect("optimize");
    open_table(&source)
        .await
        .delete()
        .with_predicate("merchant_id = 'm1'")
        .await
        .expect("delete");
    let out = exec(
        tidemark_at(T0 + 3 * HOUR)
            .arg("run")
            .arg(&p)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 65, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("no longer append-only"),
        "{}",
        out.stderr
    );
}

/// `version_key` is one per version, key and `valid_from`: a late record at the same instant
/// with an earlier tie-breaker — the same values, or values that no point in time selects —
/// leaves the key of the version in force as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_record_at_the_same_instant_keeps_the_version_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let p = pipeline(d, "scd2");
    let t = T0 + HOUR;
    let first = Rec {
        ing: t + 10 * MIN,
        ..rec("m1", t, "small", "Acme")
    };
    land(d, &[first]).await;
    run(&p, T0 + 2 * HOUR, &[]);
    let keys = || async {
        let mut out = Vec::new();
        for b in read_all(&d.join("lake/merchants")).await {
            let seg =
                arrow::compute::cast(b.column_by_name("segment").expect("s"), &DataType::Utf8)
                    .expect("utf8");
            let seg = seg.as_string::<i32>();
            let v = b
                .column_by_name("version_key")
                .expect("version_key")
                .as_primitive::<arrow::datatypes::Int64Type>();
            for i in 0..b.num_rows() {
                out.push((seg.value(i).to_string(), v.value(i)));
            }
        }
        out.sort();
        out
    };
    let before = keys().await;
    assert_eq!(before.len(), 1);
    for (segment, name) in [("small", "Acme"), ("mid", "Acme")] {
        let late = Rec {
            ing: t + 5 * MIN,
            ..rec("m1", t, segment, name)
        };
        land(d, &[late]).await;
        run(&p, T0 + 3 * HOUR, &[]);
        let now = keys().await;
        let small: Vec<i64> = now
            .iter()
            .filter(|(s, _)| s == "small")
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(small, vec![before[0].1], "{segment}: {now:?}");
    }
}
