//! As-of lookups (seed 001): each source row gets a dimension's columns from the version that
//! was valid at the row's own time — a February payment is attributed to the segment its
//! merchant had in February, not the one it moved to in October. A row whose key has no version
//! at that instant (the dimension has not heard of the merchant yet, or the payment predates its
//! first record) takes the dimension's inferred-member values: it is never dropped.

use datafusion::common::JoinType;
use datafusion::logical_expr::{cast, lit, when, Expr};
use datafusion::prelude::{ident, DataFrame, SessionContext};

use crate::config::pipeline::aggregate::Lookup;
use crate::config::pipeline::dimension::{VALID_FROM, VALID_TO};
use crate::config::pipeline::{Aggregate, Pipeline};
use crate::lake;
use crate::run::{Phase, RunError};

/// The prefix of the joined dimension's columns (dropped after the lookup).
const PREFIX: &str = "__tidemark_dim_";

/// An error at the line that says `fragment` (e.g. `as_of: created`), else at `lookups:`.
fn at(p: &Pipeline, fragment: &str, message: String) -> RunError {
    if p.mentions(fragment) {
        p.error_at_text(fragment, message).into()
    } else {
        p.error_at("lookups", message).into()
    }
}

/// `df` with every lookup's columns added.
pub async fn apply(
    ctx: &SessionContext,
    p: &Pipeline,
    spec: &Aggregate,
    mut df: DataFrame,
) -> Result<DataFrame, RunError> {
    for (n, l) in spec.lookups.iter().enumerate() {
        df = one(ctx, p, l, n, df).await?;
    }
    Ok(df)
}

/// The lookup's columns are where it says (the dimension's key and columns in the dimension,
/// its key and `as_of` in the source, no column twice), `as_of` only on an SCD2 dimension and
/// over a time; the `as_of` column, when given.
fn checked(
    p: &Pipeline,
    l: &Lookup,
    df: &DataFrame,
    dim_cols: &[String],
    src_cols: &[String],
) -> Result<Option<String>, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let missing =
        |cols: &[String], have: &[String]| cols.iter().find(|c| !have.contains(c)).cloned();
    let mut wanted = vec![l.dimension_key.clone()];
    wanted.extend(l.columns.iter().cloned());
    if let Some(c) = missing(&wanted, dim_cols) {
        return Err(p
            .error_at_text(
                &c,
                format!(
                    "the dimension {} has no column `{c}`; its columns: {}",
                    l.uri,
                    dim_cols.join(", ")
                ),
            )
            .into());
    }
    let mut needed = vec![l.key.clone()];
    needed.extend(l.as_of.iter().cloned());
    if let Some(c) = missing(&needed, src_cols) {
        let fragment = if l.key == c {
            format!("key: {c}")
        } else {
            format!("as_of: {c}")
        };
        return Err(at(
            p,
            &fragment,
            format!(
                "the source has no column `{c}` to look the dimension {} up by; its columns: {}",
                l.uri,
                src_cols.join(", ")
            ),
        ));
    }
    if let Some(c) = l.columns.iter().find(|c| src_cols.contains(c)) {
        return Err(at(
            p,
            "columns: [",
            format!("lookup column `{c}` is already a source column; rename it in the dimension or leave it out of `columns`"),
        ));
    }
    Ok(match &l.as_of {
        Some(t) if !dim_cols.iter().any(|c| c == VALID_FROM) => {
            return Err(at(
                p,
                &format!("as_of: {t}"),
                format!("`as_of: {t}` picks the version valid at a time, and {} has no `{VALID_FROM}` (not an SCD2 dimension); remove `as_of` to use its current rows", l.uri),
            ))
        }
        Some(t) => {
            let ty = df
                .schema()
                .field_with_unqualified_name(t)
                .map(|f| f.data_type().clone())
                .map_err(q)?;
            if !matches!(
                ty,
                arrow::datatypes::DataType::Timestamp(..) | arrow::datatypes::DataType::Date32
            ) {
                return Err(at(
                    p,
                    &format!("as_of: {t}"),
                    format!("`as_of: {t}` is {ty} in the source; the version valid at a row's time needs a timestamp or date column (e.g. created_at)"),
                ));
            }
            Some(t.clone())
        }
        None => None,
    })
}

async fn one(
    ctx: &SessionContext,
    p: &Pipeline,
    l: &Lookup,
    n: usize,
    df: DataFrame,
) -> Result<DataFrame, RunError> {
    let q = |e| RunError::query(Phase::Read)(e);
    let table = lake::open_required(&l.uri, "dimension").await?;
    let dim = crate::run::frame(ctx, &table, &l.uri, Phase::Read).await?;
    let names = |df: &DataFrame| {
        df.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    let (dim_cols, src_cols) = (names(&dim), names(&df));
    let as_of = checked(p, l, &df, &dim_cols, &src_cols)?;
    let at = |c: &str| format!("{PREFIX}{n}_{c}");
    let mut select: Vec<Expr> = vec![ident(&l.dimension_key).alias(at("key"))];
    if as_of.is_some() {
        select.push(ident(VALID_FROM).alias(at("from")));
        select.push(ident(VALID_TO).alias(at("to")));
    }
    select.extend(l.columns.iter().map(|c| ident(c).alias(at(c))));
    let dim = dim.select(select).map_err(q)?;
    let key_type = df
        .schema()
        .field_with_unqualified_name(&l.key)
        .map(|f| f.data_type().clone())
        .map_err(q)?;
    let mut on = vec![cast(ident(at("key")), key_type).eq(ident(&l.key))];
    if let Some(t) = &as_of {
        on.push(ident(at("from")).lt_eq(ident(t)));
        on.push(ident(at("to")).is_null().or(ident(t).lt(ident(at("to")))));
    }
    let joined = df.join_on(dim, JoinType::Left, on).map_err(q)?;
    // The source's columns, then each lookup column: the version's value, or the inferred
    // member's when no version was valid.
    let mut out: Vec<Expr> = src_cols.iter().map(ident).collect();
    for c in &l.columns {
        let value = ident(at(c));
        let placeholder = l.placeholder.iter().find(|(pc, _)| pc == c).map(|(_, v)| v);
        let e = match placeholder {
            Some(v) => {
                let t = joined
                    .schema()
                    .field_with_unqualified_name(&at(c))
                    .map(|f| f.data_type().clone())
                    .map_err(q)?;
                when(ident(at("key")).is_null(), cast(lit(v.clone()), t))
                    .otherwise(value)
                    .map_err(q)?
            }
            None => value,
        };
        out.push(e.alias(c));
    }
    joined.select(out).map_err(q)
}
