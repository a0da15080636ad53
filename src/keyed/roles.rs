//! Which column plays which part, checked against the real source schema.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::logical_expr::{cast, lit, Expr, SortExpr};
use datafusion::prelude::ident;

use crate::config::pipeline::CdcMerge;
use crate::config::pipeline::DELETED_COLUMN;
use crate::config::{ConfigError, DeleteMode, Deletes, Pipeline};

/// The roles of the columns in a run, in the order the target stores them.
#[derive(Debug, Clone)]
pub struct ColumnRoles {
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
    /// Partial updates (`ignore_null_updates`, `unavailable_marker`) over the canonical row;
    /// `None` when off.
    pub partial: Option<super::partial::Carrier>,
}

impl ColumnRoles {
    /// Checks the pipeline's columns against the source schema and fixes the roles.
    pub fn new(p: &Pipeline, m: &CdcMerge, source: &Schema) -> Result<Self, ConfigError> {
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
                    m.source_uri,
                    available()
                ),
            )
        };
        for k in &m.keys {
            if !has(k) {
                return Err(missing("keys", k));
            }
        }
        if !has(&m.sequence_by) {
            return Err(missing("sequence_by", &m.sequence_by));
        }
        for t in &m.tie_breakers {
            if !has(t) {
                return Err(missing("tie_breakers", t));
            }
        }
        for e in &m.exclude {
            if !has(e) {
                return Err(missing("exclude", e));
            }
        }
        if let Some(d) = &m.deletes {
            if !has(&d.column) {
                return Err(missing("column", &d.column));
            }
        }
        // The source's own `_deleted` would collide with the tombstone column tidemark adds
        // (in both delete modes: hard deletes use it to steer the merge). Excluded, it is still
        // read — so it can be the `deletes.column` itself — but never copied.
        if has(DELETED_COLUMN)
            && m.deletes.is_some()
            && !m.exclude.iter().any(|e| e == DELETED_COLUMN)
        {
            return Err(p.error_at(
                "deletes",
                format!("the source already has a `{DELETED_COLUMN}` column, which tidemark adds to the target for deletes; add it to `columns.exclude` (e.g. `columns: {{ exclude: [{}] }}`: the target's `{DELETED_COLUMN}` is then tidemark's, and `deletes.column: {DELETED_COLUMN}` may still read the source's), or rename it upstream", m.exclude.iter().map(String::as_str).chain([DELETED_COLUMN]).collect::<Vec<_>>().join(", ")),
            ));
        }
        let seq_type = source
            .field_with_name(&m.sequence_by)
            .map(|f| f.data_type().clone())
            .unwrap_or(DataType::Null);
        if !matches!(seq_type, DataType::Timestamp(_, _)) {
            return Err(p.error_at(
                "sequence_by",
                format!(
                    "`sequence_by: {}` has type {seq_type}; it must be a timestamp (the overlap and future-skew rules are durations)",
                    m.sequence_by
                ),
            ));
        }
        check_reconcile(p, m, source, &missing)?;

        let mut fields: Vec<Field> = source
            .fields()
            .iter()
            .filter(|f| !m.exclude.contains(f.name()))
            .map(|f| f.as_ref().clone().with_metadata(Default::default()))
            .collect();
        if m.deletes.is_some() {
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
        }
        let order = m.order_columns();
        let content = fields
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !m.keys.contains(n) && !order.contains(n))
            .collect();
        let target_columns = fields
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| {
                !(n == DELETED_COLUMN
                    && matches!(
                        m.deletes,
                        Some(Deletes {
                            mode: DeleteMode::Hard,
                            ..
                        })
                    ))
            })
            .collect();
        let canonical = Arc::new(Schema::new(fields));
        let mut fixed: Vec<&str> = m.keys.iter().chain(&order).map(String::as_str).collect();
        fixed.push(DELETED_COLUMN);
        fixed.extend(m.deletes.as_ref().map(|d| d.column.as_str()));
        let partial = super::partial::Carrier::new(&m.partial, &canonical, &fixed);
        Ok(ColumnRoles {
            keys: m.keys.clone(),
            order,
            content,
            canonical,
            target_columns,
            deletes: m.deletes.clone(),
            partial,
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
                // A float key's -0.0 is the key 0.0 (`-0.0 + 0.0` is `0.0`): one key, as a
                // reader comparing numbers expects, not two by their bits.
                (_, name) if self.keys.iter().any(|k| k == name) && f.data_type().is_floating() => {
                    (ident(name) + cast(lit(0.0f64), f.data_type().clone())).alias(name)
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

    /// [`Self::target_exprs`] for a target that may lack columns the pipeline now produces
    /// (`on_schema_change: add_new_columns` before the run that adds them): those read as null.
    pub fn target_exprs_for(&self, target: &arrow::datatypes::Schema) -> Vec<Expr> {
        self.target_exprs()
            .into_iter()
            .zip(self.canonical.fields().iter())
            .map(|(e, f)| {
                let stored = f.name() == DELETED_COLUMN && self.hard_deletes();
                if stored || target.field_with_name(f.name()).is_ok() {
                    e
                } else {
                    datafusion::logical_expr::cast(
                        lit(datafusion::scalar::ScalarValue::Null),
                        f.data_type().clone(),
                    )
                    .alias(f.name())
                }
            })
            .collect()
    }

    /// The dedup order: key ascending, then the newest version first (greatest tuple, nulls
    /// lowest). Among equal tuples the dedup itself keeps the greatest content, so the choice
    /// depends only on the rows' values — the same on every run and every machine — without
    /// carrying every column through the sort's comparisons.
    pub fn dedup_sort(&self) -> Vec<SortExpr> {
        let keys = self.key_sort();
        let newest_first = self
            .order
            .iter()
            .filter(|c| sortable(self.canonical.field_with_name(c).map(|f| f.data_type())))
            .map(|c| ident(c).sort(false, false));
        keys.into_iter().chain(newest_first).collect()
    }

    /// Whether every ordering column can be sorted (the dedup sort leaves out those that
    /// cannot, so their rows' order is the sort's, not the tuple's).
    pub fn order_sortable(&self) -> bool {
        self.order
            .iter()
            .all(|c| sortable(self.canonical.field_with_name(c).map(|f| f.data_type())))
    }

    /// Key order: every key column ascending, nulls first — the order the dedup emits winners
    /// in, and in which `reconcile` reads the target to merge-join the two.
    pub fn key_sort(&self) -> Vec<SortExpr> {
        self.keys
            .iter()
            .map(|k| ident(k).sort(true, true))
            .collect()
    }

    /// How an existing target's columns differ from the ones this pipeline writes, in words;
    /// `None` when they are the same set. A run and `reconcile` refuse such a target alike.
    pub fn target_schema_diff(&self, target: &Schema) -> Option<String> {
        let have: Vec<&str> = target.fields().iter().map(|f| f.name().as_str()).collect();
        let want: Vec<&str> = self.target_columns.iter().map(String::as_str).collect();
        let missing: Vec<&str> = want.iter().filter(|c| !have.contains(c)).copied().collect();
        let extra: Vec<&str> = have.iter().filter(|c| !want.contains(c)).copied().collect();
        let mut diff = Vec::new();
        if !missing.is_empty() {
            diff.push(format!("the target lacks {}", missing.join(", ")));
        }
        if !extra.is_empty() {
            diff.push(format!(
                "the target has {} which the pipeline does not produce",
                extra.join(", ")
            ));
        }
        (!diff.is_empty()).then(|| diff.join("; "))
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

/// The `reconcile:` columns must exist in the source, reach the target (not excluded), and have
/// a type their role can use; checked with the pipeline's other columns so a typo surfaces on the
/// next hourly run, not during an incident.
fn check_reconcile(
    p: &Pipeline,
    m: &CdcMerge,
    source: &Schema,
    missing: &dyn Fn(&str, &str) -> ConfigError,
) -> Result<(), ConfigError> {
    let r = &m.reconcile;
    let roles = std::iter::once(("day", &r.day))
        .chain(r.group_by.iter().map(|c| ("group_by", c)))
        .chain(r.sum.iter().map(|c| ("sum", c)))
        .chain(r.count_by.iter().map(|c| ("count_by", c)));
    for (key, col) in roles {
        let Ok(field) = source.field_with_name(col) else {
            return Err(missing(key, col));
        };
        if m.exclude.contains(col) {
            return Err(p.error_at(
                key,
                format!("`reconcile.{key}` names `{col}`, which `columns.exclude` keeps out of the target; reconcile compares target columns, so pick another column or stop excluding it"),
            ));
        }
        let dt = field.data_type();
        let fits = match key {
            "day" => matches!(
                dt,
                DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64
            ),
            "sum" => {
                dt.is_integer() || dt.is_floating() || matches!(dt, DataType::Decimal128(_, _))
            }
            _ => !dt.is_nested(),
        };
        if !fits {
            let want = match key {
                "day" => "a timestamp or a date",
                "sum" => "an integer, floating-point or decimal(≤38) number",
                _ => "a plain (not nested) value",
            };
            return Err(p.error_at(
                key,
                format!("`reconcile.{key}` column `{col}` has type {dt}; it must be {want}"),
            ));
        }
    }
    Ok(())
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
