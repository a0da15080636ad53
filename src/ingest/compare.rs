//! What a dry-run full reload would change (`tidemark reconcile` reads it): bronze's rows of
//! the files the reload replaces against the rows those files give when parsed again, as
//! multisets per file — a row changed, lost or added behind the pipeline's back differs.

use std::collections::{BTreeSet, HashMap};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::prelude::{col, lit, SessionContext};
use deltalake::DeltaTable;

use super::landing::LandingFile;
use super::rows::Parsed;
use crate::config::pipeline::ingest::SOURCE_FILE;
use crate::run::{Phase, RunError};

/// Files named in the result (the count is exact).
const FILES_LISTED: usize = 100;

/// Rows that differ (in bronze but not in its file now, or the other way round, counted once
/// each) and the first files they are in.
pub(super) async fn differing(
    ctx: &SessionContext,
    bronze: &DeltaTable,
    uri: &str,
    scope: &[String],
    parsed: &[(LandingFile, Parsed)],
) -> Result<(u64, Vec<String>), RunError> {
    let arrow_err = |e| RunError::arrow(Phase::Compare)(e);
    let Some(schema) = parsed.first().map(|(_, p)| p.batch.schema()) else {
        // nothing parsed: every row bronze holds for the scope differs
        return held_rows_only(ctx, bronze, uri, scope).await;
    };
    let conv = RowConverter::new(
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(arrow_err)?;
    let mut balance: HashMap<(String, Vec<u8>), i64> = HashMap::new();
    for (f, p) in parsed {
        let rows = conv.convert_columns(p.batch.columns()).map_err(arrow_err)?;
        for r in rows.iter() {
            *balance
                .entry((f.uri.clone(), r.as_ref().to_vec()))
                .or_default() += 1;
        }
    }
    for b in held(ctx, bronze, uri, scope, &schema).await? {
        let files = b.column(0).as_string::<i32>();
        let data: Vec<_> = b.columns()[1..].to_vec();
        let rows = conv.convert_columns(&data).map_err(arrow_err)?;
        for (i, r) in rows.iter().enumerate() {
            let key = (files.value(i).to_string(), r.as_ref().to_vec());
            *balance.entry(key).or_default() -= 1;
        }
    }
    let mut total = 0u64;
    let mut files = BTreeSet::new();
    for ((file, _), n) in balance {
        if n != 0 {
            total += n.unsigned_abs();
            files.insert(file);
        }
    }
    Ok((total, files.into_iter().take(FILES_LISTED).collect()))
}

/// Bronze's rows of the `scope` files: `_source_file`, then the parsed columns in `schema`'s
/// order and types (a column bronze lacks is null).
async fn held(
    ctx: &SessionContext,
    bronze: &DeltaTable,
    uri: &str,
    scope: &[String],
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>, RunError> {
    let q = |e| RunError::query(Phase::Compare)(e);
    let df = crate::run::frame(ctx, bronze, uri, Phase::Compare).await?;
    let has = |name: &str| df.schema().has_column_with_unqualified_name(name);
    let mut cols =
        vec![datafusion::logical_expr::cast(col(SOURCE_FILE), DataType::Utf8).alias(SOURCE_FILE)];
    for f in schema.fields() {
        let value = match has(f.name()) {
            true => datafusion::logical_expr::cast(col(f.name()), f.data_type().clone()),
            false => datafusion::logical_expr::cast(
                lit(datafusion::scalar::ScalarValue::Null),
                f.data_type().clone(),
            ),
        };
        cols.push(value.alias(f.name()));
    }
    let scope: Vec<_> = scope.iter().map(|s| lit(s.as_str())).collect();
    df.filter(col(SOURCE_FILE).in_list(scope, false))
        .and_then(|df| df.select(cols))
        .map_err(q)?
        .collect()
        .await
        .map_err(q)
}

/// With no file parsed: bronze's rows of the scope, each a difference.
async fn held_rows_only(
    ctx: &SessionContext,
    bronze: &DeltaTable,
    uri: &str,
    scope: &[String],
) -> Result<(u64, Vec<String>), RunError> {
    let q = |e| RunError::query(Phase::Compare)(e);
    let df = crate::run::frame(ctx, bronze, uri, Phase::Compare).await?;
    let scope_lits: Vec<_> = scope.iter().map(|s| lit(s.as_str())).collect();
    let n = df
        .filter(col(SOURCE_FILE).in_list(scope_lits, false))
        .map_err(q)?
        .count()
        .await
        .map_err(q)? as u64;
    let files = match n {
        0 => Vec::new(),
        _ => scope.iter().take(FILES_LISTED).cloned().collect(),
    };
    Ok((n, files))
}
