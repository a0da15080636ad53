//! Expectations at run time: each rule compiled against the source's columns, its failures
//! counted in one aggregate, `fail` rules enforced before anything is written.

use arrow::datatypes::DataType;
use datafusion::logical_expr::{lit, not, Expr, ExprSchemable};
use datafusion::prelude::{coalesce, DataFrame};

use super::roles::ColumnRoles;
use crate::config::pipeline::expect::Expectation;
pub use crate::config::pipeline::expect::{OnFail, BUILT_IN};
use crate::config::Pipeline;
use crate::run::{Phase, RunError};

/// A rule ready to evaluate: `fails` is true for a failing row (a NULL result fails).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub name: String,
    pub sql: String,
    pub on_fail: OnFail,
    pub fails: Expr,
}

pub use crate::report::ExpectationOutcome as Outcome;

/// The report of rules some of which (`streamed`, by name) are counted inside the write's
/// stream ([`super::tally`]): `base` with their counts filled in from the tally.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub base: Vec<Outcome>,
    pub names: Vec<String>,
    pub tally: super::tally::Tally,
}

impl Streamed {
    pub fn outcomes(&self) -> Vec<Outcome> {
        let counts = self.tally.counts();
        let mut out = self.base.clone();
        for (name, n) in self.names.iter().zip(counts) {
            if let Some(o) = out.iter_mut().find(|o| &o.name == name) {
                o.failed = n;
            }
        }
        out
    }
}

/// Compiles the pipeline's rules against `input`'s columns. A rule naming an unknown column, or
/// not boolean, is a config error at its line in the pipeline file.
pub fn compile(
    p: &Pipeline,
    rules: &[Expectation],
    input: &DataFrame,
) -> Result<Vec<Compiled>, RunError> {
    let schema = input.schema();
    rules
        .iter()
        .map(|r| {
            let bad = |why: String| {
                RunError::Config(
                    p.error_at_text(&r.sql, format!("expectation `{}`: {why}", r.name)),
                )
            };
            let expr = input
                .parse_sql_expr(&r.sql)
                .map_err(|e| bad(crate::run::sql::explain(&e, &r.sql)))?;
            let ty = expr
                .get_type(schema)
                .map_err(|e| bad(crate::run::sql::explain(&e, &r.sql)))?;
            if ty != DataType::Boolean {
                return Err(bad(format!(
                    "`{}` is {ty}, not a condition (true for a good row)",
                    r.sql
                )));
            }
            Ok(Compiled {
                name: r.name.clone(),
                sql: r.sql.clone(),
                on_fail: r.on_fail,
                fails: not(coalesce(vec![expr, lit(false)])),
            })
        })
        .collect()
}

/// The built-in rules as conditions, with the reasons their rows are quarantined under.
pub fn built_in(roles: &ColumnRoles) -> Vec<(Expr, String)> {
    built_in_for(&roles.keys, roles.sequence(), &roles.canonical)
}

/// The built-in rules over `keys` and the sequence column `seq` of `schema`: each key column
/// must not be null, nor NaN when it is a float (a NaN never equals itself, so its versions
/// could never be matched), and the sequence must not be null (every kind that reads change
/// records checks these).
pub fn built_in_for(
    keys: &[String],
    seq: &str,
    schema: &arrow::datatypes::Schema,
) -> Vec<(Expr, String)> {
    let mut out: Vec<(Expr, String)> = keys
        .iter()
        .map(|k| {
            (
                datafusion::prelude::ident(k).is_null(),
                format!("null key column `{k}`"),
            )
        })
        .collect();
    for k in keys {
        let float = schema
            .field_with_name(k)
            .is_ok_and(|f| f.data_type().is_floating());
        if float {
            out.push((
                datafusion::functions::math::expr_fn::isnan(datafusion::prelude::ident(k)),
                format!(
                    "NaN in key column `{k}` (a NaN key never equals itself; fix the row upstream)"
                ),
            ));
        }
    }
    out.push((
        datafusion::prelude::ident(seq).is_null(),
        format!("null sequence column `{seq}`"),
    ));
    out
}

/// The conditions whose rows are counted for the report: the built-in rules (a null key, a
/// null sequence), then each rule's failure.
pub fn conditions(roles: &ColumnRoles, rules: &[Compiled]) -> Vec<Expr> {
    // built_in: one condition per key column, then the sequence's.
    let mut built_in: Vec<Expr> = built_in(roles).into_iter().map(|(c, _)| c).collect();
    let seq_null = built_in.pop().unwrap_or_else(|| lit(false));
    let key_null = built_in
        .into_iter()
        .reduce(Expr::or)
        .unwrap_or_else(|| lit(false));
    [key_null, seq_null]
        .into_iter()
        .chain(rules.iter().map(|r| r.fails.clone()))
        .collect()
}

/// The report of each rule from the counts of [`conditions`].
pub fn outcomes(rules: &[Compiled], counts: &[u64]) -> Vec<Outcome> {
    let at = |i: usize| counts.get(i).copied().unwrap_or(0);
    let mut out: Vec<Outcome> = BUILT_IN
        .iter()
        .enumerate()
        .map(|(i, name)| Outcome {
            name: name.to_string(),
            on_fail: OnFail::Quarantine.as_str(),
            failed: at(i),
        })
        .collect();
    out.extend(rules.iter().enumerate().map(|(i, r)| Outcome {
        name: r.name.clone(),
        on_fail: r.on_fail.as_str(),
        failed: at(i + BUILT_IN.len()),
    }));
    out
}

/// Stops the run when a `fail` rule has failing rows: the first such rule, its count and the
/// keys of three of its rows.
pub async fn enforce(
    input: DataFrame,
    roles: &ColumnRoles,
    rules: &[Compiled],
    outcomes: &[Outcome],
) -> Result<(), RunError> {
    for r in rules.iter().filter(|r| r.on_fail == OnFail::Fail) {
        let failed = outcomes
            .iter()
            .find(|o| o.name == r.name)
            .map_or(0, |o| o.failed);
        if failed == 0 {
            continue;
        }
        let keys: Vec<Expr> = roles.keys.iter().map(datafusion::prelude::ident).collect();
        let rows = input
            .filter(r.fails.clone())
            .and_then(|df| df.select(keys))
            .and_then(|df| df.limit(0, Some(3)))
            .map_err(RunError::query(Phase::Validate))?
            .collect()
            .await
            .map_err(RunError::query(Phase::Validate))?;
        let examples: Vec<String> = rows
            .iter()
            .flat_map(|b| {
                (0..b.num_rows()).map(move |i| crate::run::render::render_key(b, &roles.keys, i))
            })
            .collect();
        return Err(RunError::ExpectationFailed {
            rule: r.name.clone(),
            sql: r.sql.clone(),
            failed,
            examples: examples.join("; "),
        });
    }
    Ok(())
}
