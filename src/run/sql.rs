//! SQL a pipeline file holds (a measure's `filter`, an aggregate's `where`, an expectation),
//! parsed and typed by DataFusion: its errors said in the pipeline's words — the column that is
//! not there, the one that was meant, the columns there are — without DataFusion's internal
//! table qualifiers (`"?table?".status`).

use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;

/// Why `sql` cannot be used: for a column that is not in the source, which column it names,
/// the nearest one, and the source's columns; else DataFusion's message without its
/// qualifiers and backtrace.
pub fn explain(e: &DataFusionError, sql: &str) -> String {
    if let DataFusionError::SchemaError(inner, _) = e.find_root() {
        if let SchemaError::FieldNotFound {
            field,
            valid_fields,
        } = inner.as_ref()
        {
            let names: Vec<&str> = valid_fields.iter().map(|c| c.name.as_str()).collect();
            let near = crate::config::nearest(&field.name, names.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            return format!(
                "`{sql}` names `{}`, which is not a column of the source{near}; its columns: {}",
                field.name,
                names.join(", ")
            );
        }
    }
    let message = e.find_root().strip_backtrace();
    format!("`{sql}`: {}", unqualified(&message))
}

/// `message` without DataFusion's placeholder table qualifier.
fn unqualified(message: &str) -> String {
    message.replace("\"?table?\".", "").replace("?table?.", "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::*;

    fn parse(sql: &str) -> Result<Expr, DataFusionError> {
        let ctx = SessionContext::new();
        let batch = arrow::record_batch::RecordBatch::try_from_iter([
            (
                "status",
                std::sync::Arc::new(arrow::array::StringArray::from(vec!["paid"])) as _,
            ),
            (
                "amount_cents",
                std::sync::Arc::new(arrow::array::Int64Array::from(vec![1])) as _,
            ),
        ])?;
        let df = ctx.read_batch(batch)?;
        df.parse_sql_expr(sql)
    }

    #[test]
    fn a_misspelt_column_is_named_with_the_one_meant() {
        let e = parse("stauts = 'refunded'").expect_err("no such column");
        let m = explain(&e, "stauts = 'refunded'");
        assert_eq!(
            m,
            "`stauts = 'refunded'` names `stauts`, which is not a column of the source (did you mean `status`?); its columns: status, amount_cents"
        );
    }

    #[test]
    fn other_errors_lose_the_placeholder_qualifier() {
        assert_eq!(unqualified("No field \"?table?\".x"), "No field x");
        let e = parse("status = ").expect_err("not SQL");
        let m = explain(&e, "status = ");
        assert!(m.starts_with("`status = `: "), "{m}");
        assert!(!m.contains("?table?"), "{m}");
    }
}
