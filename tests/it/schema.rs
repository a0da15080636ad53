//! Schema evolution through the binary: with `on_schema_change:
//! add_new_columns`, a source column added after the target was built reaches the target in the
//! run's own commit — old rows read it as null, new rows carry it — and the result equals a full
//! reload of the same source.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use common::*;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;

use common::tidemark_at as tidemark;

fn run(pipeline: &Path, now: i64, extra: &[&str]) -> serde_json::Value {
    let out = exec(
        tidemark(now)
            .current_dir(pipeline.parent().expect("dir"))
            .arg("run")
            .arg(pipeline)
            .args(extra)
            .args(["--output", "json"]),
    );
    assert_eq!(out.code, 0, "run {extra:?}: {}\n{}", out.stdout, out.stderr);
    serde_json::from_str(&out.stdout).expect("summary")
}

/// Appends `changes` with an extra nullable `fee` column (schema merge, as a producer adding a
/// field would).
pub(crate) async fn append_with_fee(path: &Path, changes: &[Change], fees: &[Option<i64>]) {
    let base = batch(changes);
    let mut fields: Vec<Field> = base
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("fee", DataType::Int64, true));
    let mut columns = base.columns().to_vec();
    columns.push(Arc::new(Int64Array::from(fees.to_vec())));
    let b = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
    let url =
        deltalake::table::builder::parse_table_uri(path.to_str().expect("utf8")).expect("url");
    deltalake::open_table(url)
        .await
        .expect("open")
        .write(vec![b])
        .with_save_mode(SaveMode::Append)
        .with_schema_mode(SchemaMode::Merge)
        .await
        .expect("append with fee");
}

/// (id, fee) of every target row, sorted.
async fn fees(path: &Path) -> Vec<(String, Option<i64>)> {
    let mut out = Vec::new();
    for b in read_all(path).await {
        let id = arrow::compute::cast(b.column_by_name("id").expect("id"), &DataType::Utf8)
            .expect("cast");
        let fee = b.column_by_name("fee").expect("target has fee");
        let fee = arrow::compute::cast(fee, &DataType::Int64).expect("cast");
        let fee = fee.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((
                id.as_string::<i32>().value(i).to_string(),
                fee.is_valid(i).then(|| fee.value(i)),
            ));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_new_columns_adds_the_column_and_equals_a_full_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(dir.path(), "15m", "soft", "");
    let text = std::fs::read_to_string(&pipeline).expect("pipeline")
        + "on_schema_change: add_new_columns\n";
    std::fs::write(&pipeline, text).expect("pipeline");
    let first = vec![
        Change::upsert("a", T0 + 10 * MIN, T0 + 11 * MIN, 1),
        Change::upsert("b", T0 + 20 * MIN, T0 + 21 * MIN, 1),
    ];
    append(&bronze(dir.path()), &first).await;
    run(&pipeline, T0 + HOUR, &[]);

    // A new key with the new column, and an update of an old key that carries it too.
    append_with_fee(
        &bronze(dir.path()),
        &[
            Change::upsert("c", T0 + 70 * MIN, T0 + 71 * MIN, 1),
            Change::upsert("b", T0 + 75 * MIN, T0 + 76 * MIN, 2),
        ],
        &[Some(7), Some(3)],
    )
    .await;
    let now = T0 + 2 * HOUR;
    let s = run(&pipeline, now, &[]);
    assert_eq!(
        (s["num_inserted"].as_u64(), s["num_updated"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
    let after = fees(&silver(dir.path())).await;
    assert_eq!(
        after,
        vec![
            ("a".into(), None),
            ("b".into(), Some(3)),
            ("c".into(), Some(7))
        ]
    );

    // A rerun changes nothing; reconcile finds the target identical to a full reload.
    let again = run(&pipeline, now, &[]);
    assert!(
        again["target_version"].is_null(),
        "a rerun committed: {again}"
    );
    let rec = exec(
        tidemark(now)
            .current_dir(dir.path())
            .arg("reconcile")
            .arg(&pipeline),
    );
    assert_eq!(rec.code, 0, "{}\n{}", rec.stdout, rec.stderr);
    let rows = read_target(&silver(dir.path())).await;
    run(&pipeline, now, &["--full-reload"]);
    assert_eq!(read_target(&silver(dir.path())).await, rows);
    assert_eq!(fees(&silver(dir.path())).await, after);

    // And the next hour goes on incrementally with the wider schema.
    append_with_fee(
        &bronze(dir.path()),
        &[Change::upsert("a", T0 + 130 * MIN, T0 + 131 * MIN, 2)],
        &[Some(1)],
    )
    .await;
    let s = run(&pipeline, T0 + 3 * HOUR, &[]);
    assert_eq!(s["num_updated"], 1, "{s}");
    assert_eq!(
        fees(&silver(dir.path())).await,
        vec![
            ("a".into(), Some(1)),
            ("b".into(), Some(3)),
            ("c".into(), Some(7))
        ]
    );
}
