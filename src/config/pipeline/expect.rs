//! `expectations:` — row-level data quality rules of a pipeline: a boolean SQL expression over a
//! source row, and what a failing row does. The expression is parsed when the file loads (so
//! `bundle validate` finds a typo); its columns are checked against the source when a run starts.

use serde::Deserialize;

use super::common::Ctx;
use crate::config::ConfigError;

/// What a row failing an expectation does. A NULL result is a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFail {
    /// The row is kept and counted.
    #[default]
    Warn,
    /// The row goes to the quarantine table (reason `expectation <name> failed`), once.
    Quarantine,
    /// The run stops before any commit (exit 65), naming the rule, the count and three keys.
    Fail,
}

impl OnFail {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFail::Warn => "warn",
            OnFail::Quarantine => "quarantine",
            OnFail::Fail => "fail",
        }
    }
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    pub name: String,
    pub sql: String,
    pub on_fail: OnFail,
}

/// The names of the built-in rules every merge applies (rows failing them are quarantined).
pub const BUILT_IN: [&str; 2] = ["key_not_null", "sequence_not_null"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpectation {
    pub(super) name: String,
    pub(super) sql: String,
    #[serde(default)]
    pub(super) on_fail: OnFail,
}

impl Ctx<'_> {
    /// Checks `expectations:`: names unique and plain, each `sql` one expression that parses.
    pub(super) fn expectations(
        &self,
        raw: Vec<RawExpectation>,
    ) -> Result<Vec<Expectation>, ConfigError> {
        let mut out: Vec<Expectation> = Vec::new();
        for e in raw {
            let plain = !e.name.is_empty()
                && e.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !plain {
                return Err(self.invalid_at_text(
                    &e.name,
                    format!(
                        "expectation name {:?} must be non-empty letters, digits, `_` or `-`",
                        e.name
                    ),
                ));
            }
            if BUILT_IN.contains(&e.name.as_str()) || out.iter().any(|o| o.name == e.name) {
                return Err(self.invalid_at_text(
                    &e.name,
                    format!("expectation `{}` is named twice (or after a built-in rule: {}); give each rule its own name", e.name, BUILT_IN.join(", ")),
                ));
            }
            if let Err(why) = parse(&e.sql) {
                return Err(self.invalid_at_text(
                    &e.sql,
                    format!("expectation `{}`: `{}` is not a SQL expression ({why}); write a condition a good row meets, like `amount_cents >= 0`", e.name, e.sql),
                ));
            }
            out.push(Expectation {
                name: e.name,
                sql: e.sql,
                on_fail: e.on_fail,
            });
        }
        Ok(out)
    }
}

/// Parses `sql` as exactly one SQL expression.
pub fn parse_expression(sql: &str) -> Result<(), String> {
    parse(sql)
}

/// Parses `sql` as exactly one SQL expression.
fn parse(sql: &str) -> Result<(), String> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use datafusion::sql::sqlparser::tokenizer::Token;
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect)
        .try_with_sql(sql)
        .map_err(|e| e.to_string())?;
    parser.parse_expr().map_err(|e| e.to_string())?;
    match parser.peek_token().token {
        Token::EOF => Ok(()),
        t => Err(format!("unexpected `{t}` after the expression")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_expression_parses_and_anything_else_does_not() {
        assert!(super::parse("amount_cents >= 0").is_ok());
        assert!(super::parse("currency IN ('EUR','USD') AND length(payment_id) = 20").is_ok());
        assert!(super::parse("amount_cents >=").is_err());
        assert!(super::parse("a > 1 b").is_err());
        assert!(super::parse("").is_err());
    }
}
