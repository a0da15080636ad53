//! Which column plays which part, checked against the real source schema.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::logical_expr::{cast, lit, Expr, SortExpr};
use datafusion::prelude::ident;

use crate::config::pipeline::DELETED_COLUMN;
use crate::config::{ConfigError, DeleteMode, Deletes, Pipeline};

/// The roles of the columns in a run, in the order the target stores them.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Business key columns.
    pub keys: Vec<String>,
    /// The sequence column followed by the tie-breakers: the tuple that orders versions.
    pub order: Vec<String>,
    /// Every other column of the canonical row (including `_deleted` when deletes are on): the
    /// last, deterministic tie-break between two versions with the same tuple.
    pub content: Vec<String>,
    /// The canonical row: source columns minus `columns.exclude`, plus `_deleted` when a
    /// `deletes` block exists (also in hard mode, where it only steers the merge).
    pub canonical: SchemaRef,
    /// Columns written to the target (the canonical row, minus `_deleted` in hard mode).
    pub target_columns: Vec<String>,
    pub deletes: Option<Deletes>,
}

impl Layout {
    /// Checks the pipeline's columns against the source schema and fixes the roles.
    pub fn new(p: &Pipeline, source: &Schema) -> Result<Self, ConfigError> {
        let has = |c: &str| source.field_with_name(c).is_ok();
        let available = || {
            source
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let missing = |key: &str, col: &str| {
            p.error_at(
                key,
                format!(
                    "column `{col}` (in `{key}`) is not in the source table {}; its columns are: {}",
                    p.source_uri,
                    available()
                ),
            )
        };
        for k in &p.keys {
            if !has(k) {
                return Err(missing("keys", k));
            }
        }
        if !has(&p.sequence_by) {
            return Err(missing("sequence_by", &p.sequence_by));
        }
        for t in &p.tie_breakers {
            if !has(t) {
                return Err(missing("tie_breakers", t));
            }
        }
        for e in &p.exclude {
            if !has(e) {
                return Err(missing("exclude", e));
            }
        }
        if let Some(d) = &p.deletes {
            if !has(&d.column) {
                return Err(missing("column", &d.column));
            }
        }
        if has(DELETED_COLUMN) && p.deletes.is_some() {
            return Err(p.error_at(
                "deletes",
                format!("the source already has a `{DELETED_COLUMN}` column, which tidemark adds for deletes; exclude it with `columns.exclude` or rename it upstream"),
            ));
        }
        let seq_type = source
            .field_with_name(&p.sequence_by)
            .map(|f| f.data_type().clone())
            .unwrap_or(DataType::Null);
        if !matches!(seq_type, DataType::Timestamp(_, _)) {
            return Err(p.error_at(
                "sequence_by",
                format!(
                    "`sequence_by: {}` has type {seq_type}; it must be a timestamp (the overlap and future-skew rules are durations)",
                    p.sequence_by
                ),
            ));
        }

        let mut fields: Vec<Field> = source
            .fields()
            .iter()
            .filter(|f| !p.exclude.contains(f.name()))
            .map(|f| f.as_ref().clone())
            .collect();
        if p.deletes.is_some() {
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
        }
        let order = p.order_columns();
        let content = fields
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !p.keys.contains(n) && !order.contains(n))
            .collect();
        let target_columns = fields
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| {
                !(n == DELETED_COLUMN
                    && matches!(
                        p.deletes,
                        Some(Deletes {
                            mode: DeleteMode::Hard,
                            ..
                        })
                    ))
            })
            .collect();
        Ok(Layout {
            keys: p.keys.clone(),
            order,
            content,
            canonical: Arc::new(Schema::new(fields)),
            target_columns,
            deletes: p.deletes.clone(),
        })
    }

    /// The sequence column.
    pub fn sequence(&self) -> &str {
        &self.order[0]
    }

    /// Whether the target keeps `_deleted` tombstones.
    pub fn soft_deletes(&self) -> bool {
        matches!(
            self.deletes,
            Some(Deletes {
                mode: DeleteMode::Soft,
                ..
            })
        )
    }

    /// Whether deleted winners are removed from the target.
    pub fn hard_deletes(&self) -> bool {
        matches!(
            self.deletes,
            Some(Deletes {
                mode: DeleteMode::Hard,
                ..
            })
        )
    }

    /// Projection from a source row to the canonical row.
    pub fn canonical_exprs(&self) -> Vec<Expr> {
        self.canonical
            .fields()
            .iter()
            .map(|f| match (&self.deletes, f.name().as_str()) {
                (Some(d), DELETED_COLUMN) => {
                    let values: Vec<Expr> = d.values.iter().map(|v| lit(v.clone())).collect();
                    datafusion::functions::expr_fn::coalesce(vec![
                        cast(ident(&d.column), DataType::Utf8).in_list(values, false),
                        lit(false),
                    ])
                    .alias(DELETED_COLUMN)
                }
                _ => ident(f.name()),
            })
            .collect()
    }

    /// Projection from a target row to the canonical row: hard-delete targets have no
    /// `_deleted`, every row in them is live.
    pub fn target_exprs(&self) -> Vec<Expr> {
        self.canonical
            .fields()
            .iter()
            .map(|f| {
                if f.name() == DELETED_COLUMN && self.hard_deletes() {
                    lit(false).alias(DELETED_COLUMN)
                } else {
                    ident(f.name())
                }
            })
            .collect()
    }

    /// The dedup order: key ascending, then the newest version first (greatest tuple, then
    /// greatest content, nulls lowest). The choice among equal tuples therefore depends only on
    /// the rows' values: the same on every run and every machine.
    pub fn dedup_sort(&self) -> Vec<SortExpr> {
        let keys = self.keys.iter().map(|k| ident(k).sort(true, true));
        let newest_first = self
            .order
            .iter()
            .chain(self.content.iter())
            .filter(|c| sortable(self.canonical.field_with_name(c).map(|f| f.data_type())))
            .map(|c| ident(c).sort(false, false));
        keys.chain(newest_first).collect()
    }

    /// Indices of the named columns in the canonical schema.
    pub fn indices(&self, names: &[String]) -> Vec<usize> {
        names
            .iter()
            .filter_map(|n| self.canonical.index_of(n).ok())
            .collect()
    }

    /// Content columns the row comparison can order (nested types are left out of the
    /// tie-break; they still travel with the row).
    pub fn comparable_content(&self) -> Vec<String> {
        self.content
            .iter()
            .filter(|c| sortable(self.canonical.field_with_name(c).map(|f| f.data_type())))
            .cloned()
            .collect()
    }
}

fn sortable<E>(dt: Result<&DataType, E>) -> bool {
    match dt {
        Ok(dt) => !dt.is_nested(),
        Err(_) => false,
    }
}

/// A timestamp literal of the sequence column's unit and zone, so comparisons need no cast and
/// prune files by statistics.
pub fn timestamp_lit(dt: &DataType, micros: i64) -> Expr {
    use datafusion::scalar::ScalarValue as S;
    match dt {
        DataType::Timestamp(unit, tz) => {
            let tz = tz.clone();
            let v = match unit {
                TimeUnit::Second => S::TimestampSecond(Some(micros.div_euclid(1_000_000)), tz),
                TimeUnit::Millisecond => {
                    S::TimestampMillisecond(Some(micros.div_euclid(1_000)), tz)
                }
                TimeUnit::Microsecond => S::TimestampMicrosecond(Some(micros), tz),
                TimeUnit::Nanosecond => {
                    S::TimestampNanosecond(Some(micros.saturating_mul(1_000)), tz)
                }
            };
            lit(v)
        }
        _ => lit(S::TimestampMicrosecond(Some(micros), Some("UTC".into()))),
    }
}
