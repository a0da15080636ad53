//! The ledger row as Arrow columns and back, traced from [`LedgerRow`]'s own serde shape.
//!
//! The columns, their order and their nullability come from the row type (an `Option` field is a
//! nullable column); the only thing the type cannot say is that a time (serialized as RFC 3339
//! text, read back as microseconds) is stored as a UTC timestamp, so those fields are named once
//! in [`TIME_FIELDS`] and the tests check the list against the type. Rows written before a column existed read it back as
//! null (the field's `None`).

use std::sync::{Arc, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, TimeUnit};
use serde_arrow::schema::{SchemaLike, TracingOptions};

use super::LedgerRow;

/// The row's fields that hold a time: serialized as RFC 3339, read back from (and traced as)
/// microseconds, stored as a UTC timestamp.
pub(super) const TIME_FIELDS: &[&str] = &[
    "scheduled_at",
    "started_at",
    "ended_at",
    "watermark_before",
    "watermark_after",
];

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The fields traced from the row type, with the time fields as timestamps.
fn fields() -> &'static [FieldRef] {
    static FIELDS: OnceLock<Vec<FieldRef>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        // The row type is fixed at compile time, and the tests below trace it too: this cannot
        // fail on anything a user or the data holds.
        let options = TracingOptions::default().strings_as_large_utf8(false);
        let traced = Vec::<FieldRef>::from_type::<LedgerRow>(options)
            .expect("LedgerRow traces to Arrow fields");
        traced
            .into_iter()
            .map(|f| match TIME_FIELDS.contains(&f.name().as_str()) {
                true => Arc::new(Field::new(f.name(), ts_type(), f.is_nullable())),
                false => f,
            })
            .collect()
    })
}

/// The ledger table's schema, in column order.
pub fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(fields().to_vec()))
}

pub(super) fn to_batch(rows: &[LedgerRow]) -> Result<RecordBatch, serde_arrow::Error> {
    serde_arrow::to_record_batch(fields(), &rows)
}

pub(super) fn from_batch(b: &RecordBatch) -> Result<Vec<LedgerRow>, serde_arrow::Error> {
    serde_arrow::from_record_batch(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_follows_the_row_type() {
        let schema = schema();
        for name in TIME_FIELDS {
            let f = schema
                .field_with_name(name)
                .expect("a time field is a column");
            assert_eq!(f.data_type(), &ts_type());
        }
        let field = |n: &str| schema.field_with_name(n).unwrap().clone();
        assert_eq!(field("run_id"), Field::new("run_id", DataType::Utf8, false));
        assert_eq!(field("attempt").data_type(), &DataType::Int32);
        assert!(field("scheduled_at").is_nullable());
        assert!(!field("started_at").is_nullable());
        assert_eq!(
            field("num_inserted"),
            Field::new("num_inserted", DataType::Int64, true)
        );
        assert_eq!(
            field("counters"),
            Field::new("counters", DataType::Utf8, true)
        );
        // every non-time column is a string or an integer: a time field missing from the list
        // would show up here as text
        for f in schema.fields() {
            if !TIME_FIELDS.contains(&f.name().as_str()) {
                assert!(
                    matches!(
                        f.data_type(),
                        DataType::Utf8 | DataType::Int32 | DataType::Int64
                    ),
                    "{f:?}"
                );
                assert!(!f.name().ends_with("_at"), "{} looks like a time", f.name());
            }
        }
    }
}
