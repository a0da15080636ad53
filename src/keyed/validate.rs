//! Validation: which rows may be merged now, which are rejected, which must wait.

use arrow::datatypes::DataType;
use chrono::{DateTime, Utc};
use datafusion::logical_expr::{lit, when, Expr};
use datafusion::prelude::{ident, DataFrame};

use super::roles::{timestamp_lit, ColumnRoles};
use crate::run::quarantine::{rejection, REASON_COLUMN};
use crate::run::{Phase, RunError};

/// The rule name of a row rejected because it would bring back a key whose tombstone
/// `maintain` removed, at or before that key's delete.
pub const RESURRECTION: &str = "deleted_key_resurrection";

/// What bounded tombstones add to validation (built by the merge that knows which tombstones
/// were removed): the conditions over a helper column the source rows were annotated with.
pub struct Guard {
    /// A live version at or before its key's removed delete: rejected.
    pub resurrected: Expr,
    /// A delete record at or before its key's removed delete: already applied, skipped.
    pub superseded: Expr,
    /// The helper column to drop from the rows that go on.
    pub column: &'static str,
}

/// The three ways out of validation.
pub struct Split {
    /// Rows with every key and the sequence present, not in the future: mergeable now.
    pub valid: DataFrame,
    /// Rows that can never be merged, with a `_quarantine_reason` column.
    pub rejected: DataFrame,
    /// Every row validation saw, and the condition that defers one (a valid row whose sequence
    /// lies beyond `now + max_future_skew`: merged by a later run); [`summary`] counts over them
    /// in one pass.
    pub input: DataFrame,
    pub deferred_when: Expr,
    /// The latest sequence (µs) merged now: rows after it are deferred.
    pub due_micros: i64,
    /// With bounded tombstones: the condition of a rejected resurrection (counted in the
    /// report).
    pub resurrected: Option<Expr>,
    /// `valid` for when the counts show that no row is rejected: without the rejection
    /// conditions, which expectations make costly to evaluate over a whole source.
    valid_when_none_rejected: DataFrame,
    /// The condition that makes `valid` out of `input` (and the one once none is rejected),
    /// and the helper column to drop after it.
    valid_when: Expr,
    clean_when: Expr,
    helper: Option<&'static str>,
    clean: bool,
}

impl Split {
    /// Once the counts say that no row is rejected: the valid rows are every row that is due
    /// (no rule evaluated again) and the rejected ones need no scan.
    pub fn none_rejected(&mut self) -> Result<(), RunError> {
        self.clean = true;
        self.valid = self.valid_when_none_rejected.clone();
        self.rejected = self
            .rejected
            .clone()
            .limit(0, Some(0))
            .map_err(RunError::query(Phase::Validate))?;
        Ok(())
    }

    /// `valid`, with `counted` counted over every row of `input` inside the same scan (see
    /// [`super::tally`]): the counts are complete once the returned rows have been read.
    pub fn valid_tallied(
        &self,
        counted: Vec<Expr>,
    ) -> Result<(DataFrame, super::tally::Tally), RunError> {
        let q = RunError::query(Phase::Validate);
        let keep = if self.clean {
            self.clean_when.clone()
        } else {
            self.valid_when.clone()
        };
        let (filter, tally) = super::tally::Tally::filter(counted, keep);
        let mut df = self.input.clone().filter(filter);
        if let Some(c) = self.helper {
            df = df.and_then(|df| df.drop_columns(&[c]));
        }
        Ok((df.map_err(q)?, tally))
    }
}

/// The latest sequence value (µs) a run starting at `now` merges: later rows are deferred.
pub fn due_micros(now: DateTime<Utc>, max_future_skew: std::time::Duration) -> i64 {
    let skew = i64::try_from(max_future_skew.as_micros()).unwrap_or(i64::MAX);
    now.timestamp_micros().saturating_add(skew)
}

/// Splits `input` (source rows) for a run that started at `due_micros - max_future_skew`. Rows
/// failing a built-in rule (null key, null sequence) or an expectation with `on_fail:
/// quarantine` are rejected, with the first rule they fail as the reason.
pub fn split(
    input: DataFrame,
    roles: &ColumnRoles,
    seq_type: &DataType,
    due_micros: i64,
    rules: &[super::expect::Compiled],
    guard: Option<&Guard>,
) -> Result<Split, RunError> {
    let q = RunError::query;
    let mut nulls = super::expect::built_in(roles);
    let seq = roles.sequence();
    if let Some(g) = guard {
        nulls.push((g.resurrected.clone(), RESURRECTION.to_string()));
    }
    nulls.extend(
        rules
            .iter()
            .filter(|r| r.on_fail == crate::config::pipeline::expect::OnFail::Quarantine)
            .map(|r| (r.fails.clone(), format!("expectation `{}` failed", r.name))),
    );

    let (any_null, reason) = rejection(&nulls).map_err(q(Phase::Validate))?;
    let reason = reason.alias(REASON_COLUMN);

    let all = input.clone();
    let rejected = input
        .clone()
        .filter(any_null.clone())
        .and_then(|df| df.with_column(REASON_COLUMN, reason))
        .map_err(q(Phase::Validate))?;
    let present = input
        .filter(datafusion::logical_expr::not(any_null.clone()))
        .map_err(q(Phase::Validate))?;
    let due = timestamp_lit(seq_type, due_micros);
    let deferred_when =
        datafusion::logical_expr::not(any_null.clone()).and(ident(seq).gt(due.clone()));
    let mut valid_when = datafusion::logical_expr::not(any_null).and(ident(seq).lt_eq(due.clone()));
    let mut clean_when = ident(seq).lt_eq(due.clone());
    if let Some(g) = guard {
        let not_superseded = datafusion::logical_expr::not(g.superseded.clone());
        valid_when = valid_when.and(not_superseded.clone());
        clean_when = clean_when.and(not_superseded);
    }
    let mut valid = present
        .filter(ident(seq).lt_eq(due.clone()))
        .map_err(q(Phase::Validate))?;
    let mut valid_when_none_rejected = all
        .clone()
        .filter(ident(seq).lt_eq(due))
        .map_err(q(Phase::Validate))?;
    let mut rejected = rejected;
    if let Some(g) = guard {
        let keep = |df: DataFrame| {
            df.filter(datafusion::logical_expr::not(g.superseded.clone()))
                .and_then(|df| df.drop_columns(&[g.column]))
                .map_err(q(Phase::Validate))
        };
        valid = keep(valid)?;
        valid_when_none_rejected = keep(valid_when_none_rejected)?;
        rejected = rejected
            .drop_columns(&[g.column])
            .map_err(q(Phase::Validate))?;
    }
    Ok(Split {
        valid,
        rejected,
        input: all,
        deferred_when,
        due_micros,
        resurrected: guard.map(|g| g.resurrected.clone()),
        valid_when_none_rejected,
        valid_when,
        clean_when,
        helper: guard.map(|g| g.column),
        clean: false,
    })
}

/// One aggregate over the rows validation saw (`split.input`): how many were deferred, the
/// smallest deferred sequence (µs, rounded down), and for each of `counted` how many rows it is
/// true for (expectations' failures ride along with the pass the deferred rows need anyway).
pub async fn summary(
    split: &Split,
    roles: &ColumnRoles,
    counted: &[Expr],
) -> Result<(u64, Option<i64>, Vec<u64>), datafusion::error::DataFusionError> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int64Type, TimeUnit, TimestampMicrosecondType};
    use datafusion::functions_aggregate::expr_fn::{min, sum};
    let one_if = |c: Expr| -> Result<Expr, datafusion::error::DataFusionError> {
        Ok(sum(when(c, lit(1i64)).otherwise(lit(0i64))?))
    };
    let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
    let mut aggs = vec![
        one_if(split.deferred_when.clone())?.alias("n"),
        min(when(
            split.deferred_when.clone(),
            datafusion::logical_expr::cast(ident(roles.sequence()), micros.clone()),
        )
        .otherwise(lit(datafusion::scalar::ScalarValue::try_from(&micros)?))?)
        .alias("floor"),
    ];
    for (i, c) in counted.iter().enumerate() {
        aggs.push(one_if(c.clone())?.alias(format!("c{i}")));
    }
    let batches = split
        .input
        .clone()
        .aggregate(vec![], aggs)?
        .collect()
        .await?;
    let Some(b) = batches.iter().find(|b| b.num_rows() > 0) else {
        return Ok((0, None, vec![0; counted.len()]));
    };
    let int = |i: usize| -> Result<u64, datafusion::error::DataFusionError> {
        let c = arrow::compute::cast(b.column(i), &DataType::Int64)?;
        let c = c.as_primitive::<Int64Type>();
        Ok(if c.is_valid(0) {
            c.value(0).max(0) as u64
        } else {
            0
        })
    };
    let floor = b.column(1).as_primitive::<TimestampMicrosecondType>();
    let counts = (0..counted.len())
        .map(|i| int(i + 2))
        .collect::<Result<_, _>>()?;
    Ok((int(0)?, floor.is_valid(0).then(|| floor.value(0)), counts))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::config::{Pipeline, Vars};

    const HOUR: i64 = 3_600_000_000;

    async fn ids(df: DataFrame) -> Vec<String> {
        let mut out: Vec<String> = df
            .collect()
            .await
            .expect("collect")
            .iter()
            .flat_map(|b| {
                let c = b
                    .column_by_name("id")
                    .expect("id")
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .expect("strings")
                    .clone();
                (0..c.len())
                    .map(|i| {
                        if c.is_null(i) {
                            "null".to_string()
                        } else {
                            c.value(i).to_string()
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn rows_split_into_valid_rejected_and_deferred() {
        let p = Pipeline::parse(
            std::path::Path::new("p.yml"),
            "name: t\nkind: cdc_merge\nsource: { uri: /tmp/l/b }\ntarget: { uri: /tmp/l/s }\nkeys: [id]\nsequence_by: ts\noverlap: 1h\nquarantine: { uri: /tmp/l/q }\n",
            &Vars::new(),
        )
        .expect("pipeline");
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("ts", ts.clone(), true),
        ]));
        let roles =
            ColumnRoles::new(&p, p.cdc_merge("test").expect("merge"), &schema).expect("roles");
        let due = 10 * HOUR;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("now"),
                    Some("due"),
                    None,
                    Some("noseq"),
                    Some("future"),
                ])),
                Arc::new(TimestampMicrosecondArray::from(vec![
                    Some(due - HOUR),
                    Some(due),
                    Some(due - HOUR),
                    None,
                    Some(due + 1),
                ])),
            ],
        )
        .expect("batch");
        let ctx = SessionContext::new();
        let input = ctx.read_batch(batch).expect("frame");
        let split = split(input, &roles, &ts, due, &[], None).expect("split");
        assert_eq!(
            ids(split.valid).await,
            vec!["due", "now"],
            "up to `due` inclusive"
        );
        assert_eq!(ids(split.rejected.clone()).await, vec!["noseq", "null"]);
        assert_eq!(
            ids(split
                .input
                .clone()
                .filter(split.deferred_when.clone())
                .expect("filter"))
            .await,
            vec!["future"]
        );
        let reasons: Vec<String> = split
            .rejected
            .select_columns(&[REASON_COLUMN])
            .expect("reason")
            .collect()
            .await
            .expect("collect")
            .iter()
            .flat_map(|b| {
                let c = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .expect("strings")
                    .clone();
                (0..c.len())
                    .map(|i| c.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            reasons.contains(&"null key column `id`".to_string()),
            "{reasons:?}"
        );
        assert!(
            reasons.contains(&"null sequence column `ts`".to_string()),
            "{reasons:?}"
        );
    }
}
