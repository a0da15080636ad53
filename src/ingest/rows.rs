//! Parsed records becoming Arrow columns, and the records that could not be.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder,
    Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow::error::ArrowError;

use super::schema::{data_schema, Cell, Col};
use crate::config::pipeline::ingest::ColumnType;

/// Longest text of a rejected record kept in the quarantine table.
const MAX_KEPT_RECORD: usize = 4096;

/// A record that could not be ingested.
#[derive(Debug, Clone, PartialEq)]
pub struct Reject {
    /// Line (JSON, CSV) or row (Parquet) number in the file, from 1; `None` for the whole file.
    pub line: Option<u64>,
    /// The record as delivered (lossy UTF-8, cut at 4 KiB).
    pub record: String,
    pub reason: String,
}

impl Reject {
    pub fn new(line: Option<u64>, raw: &[u8], reason: String) -> Self {
        let cut = &raw[..raw.len().min(MAX_KEPT_RECORD)];
        let mut record = String::from_utf8_lossy(cut).into_owned();
        if raw.len() > MAX_KEPT_RECORD {
            record.push_str(&format!("… ({} bytes)", raw.len()));
        }
        Reject {
            line,
            record,
            reason,
        }
    }
}

/// What parsing one file gave.
#[derive(Debug)]
pub struct Parsed {
    /// The rows, in [`data_schema`] order.
    pub batch: RecordBatch,
    pub rejects: Vec<Reject>,
    /// Records seen: rows plus rejects.
    pub records: u64,
    /// Rows that carry something in `_rescued_data`.
    pub rescued: u64,
    /// Fields outside the schema (when not rescuing), with the type their values suggest.
    pub unknown: BTreeMap<String, ColumnType>,
    /// The line of a Debezium truncate event, which stops the run (the file is not ingested).
    pub truncate_at: Option<u64>,
    /// Every record of a `format: debezium` file is a plain row (an unwrapped feed): the run
    /// stops instead of quarantining the whole file.
    pub not_debezium: bool,
}

impl Parsed {
    /// No rows, rejects or records: what a re-delivered copy of an ingested file delivers.
    pub fn empty(&mut self) {
        self.batch = RecordBatch::new_empty(self.batch.schema());
        self.rejects.clear();
        self.records = 0;
        self.rescued = 0;
        self.unknown.clear();
    }
}

enum ColBuilder {
    Str(StringBuilder),
    I64(Int64Builder),
    I32(Int32Builder),
    F64(Float64Builder),
    Bool(BooleanBuilder),
    Ts(TimestampMicrosecondBuilder),
    Date(Date32Builder),
    Dec(Decimal128Builder, u8, i8),
}

impl ColBuilder {
    fn new(ty: ColumnType) -> Self {
        match ty {
            ColumnType::String => ColBuilder::Str(StringBuilder::new()),
            ColumnType::Long => ColBuilder::I64(Int64Builder::new()),
            ColumnType::Int => ColBuilder::I32(Int32Builder::new()),
            ColumnType::Double => ColBuilder::F64(Float64Builder::new()),
            ColumnType::Boolean => ColBuilder::Bool(BooleanBuilder::new()),
            ColumnType::Timestamp => ColBuilder::Ts(TimestampMicrosecondBuilder::new()),
            ColumnType::Date => ColBuilder::Date(Date32Builder::new()),
            ColumnType::Decimal { precision, scale } => {
                ColBuilder::Dec(Decimal128Builder::new(), precision, scale)
            }
        }
    }

    /// Appends `cell`, which [`super::schema`] produced for this column's type.
    fn push(&mut self, cell: Cell) {
        match (self, cell) {
            (ColBuilder::Str(b), Cell::Str(s)) => b.append_value(s),
            (ColBuilder::I64(b), Cell::I64(v)) => b.append_value(v),
            (ColBuilder::I32(b), Cell::I32(v)) => b.append_value(v),
            (ColBuilder::F64(b), Cell::F64(v)) => b.append_value(v),
            (ColBuilder::Bool(b), Cell::Bool(v)) => b.append_value(v),
            (ColBuilder::Ts(b), Cell::Ts(v)) => b.append_value(v),
            (ColBuilder::Date(b), Cell::Date(v)) => b.append_value(v),
            (ColBuilder::Dec(b, _, _), Cell::Dec(v)) => b.append_value(v),
            (b, _) => b.push_null(),
        }
    }

    fn push_null(&mut self) {
        match self {
            ColBuilder::Str(b) => b.append_null(),
            ColBuilder::I64(b) => b.append_null(),
            ColBuilder::I32(b) => b.append_null(),
            ColBuilder::F64(b) => b.append_null(),
            ColBuilder::Bool(b) => b.append_null(),
            ColBuilder::Ts(b) => b.append_null(),
            ColBuilder::Date(b) => b.append_null(),
            ColBuilder::Dec(b, _, _) => b.append_null(),
        }
    }

    fn finish(self) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            ColBuilder::Str(mut b) => Arc::new(b.finish()),
            ColBuilder::I64(mut b) => Arc::new(b.finish()),
            ColBuilder::I32(mut b) => Arc::new(b.finish()),
            ColBuilder::F64(mut b) => Arc::new(b.finish()),
            ColBuilder::Bool(mut b) => Arc::new(b.finish()),
            ColBuilder::Ts(mut b) => Arc::new(b.finish().with_timezone("UTC")),
            ColBuilder::Date(mut b) => Arc::new(b.finish()),
            ColBuilder::Dec(mut b, precision, scale) => {
                Arc::new(b.finish().with_precision_and_scale(precision, scale)?)
            }
        })
    }
}

/// Rows being built from records, cell by cell.
pub struct Rows<'c> {
    cols: &'c [Col],
    rescue: bool,
    builders: Vec<ColBuilder>,
    rescued_col: StringBuilder,
    pub rejects: Vec<Reject>,
    pub records: u64,
    pub rescued: u64,
    pub unknown: BTreeMap<String, ColumnType>,
}

impl<'c> Rows<'c> {
    pub fn new(cols: &'c [Col], rescue: bool) -> Self {
        Rows {
            cols,
            rescue,
            builders: cols.iter().map(|c| ColBuilder::new(c.ty)).collect(),
            rescued_col: StringBuilder::new(),
            rejects: Vec::new(),
            records: 0,
            rescued: 0,
            unknown: BTreeMap::new(),
        }
    }

    /// Appends one record's cells (in column order) and what was rescued from it.
    pub fn push(&mut self, cells: Vec<Cell>, rescued: Option<String>) {
        self.records += 1;
        for (b, c) in self.builders.iter_mut().zip(cells) {
            b.push(c);
        }
        if self.rescue {
            match rescued {
                Some(r) => {
                    self.rescued += 1;
                    self.rescued_col.append_value(r);
                }
                None => self.rescued_col.append_null(),
            }
        }
    }

    /// Counts one record that is quarantined instead.
    pub fn reject(&mut self, reject: Reject) {
        self.records += 1;
        self.rejects.push(reject);
    }

    /// The first required column without a value among `cells`, if any.
    pub fn missing_required(&self, cells: &[Cell]) -> Option<&'c str> {
        self.cols
            .iter()
            .zip(cells)
            .find(|(c, v)| c.required && **v == Cell::Null)
            .map(|(c, _)| c.name.as_str())
    }

    pub fn finish(self) -> Result<Parsed, ArrowError> {
        let schema = data_schema(self.cols, self.rescue);
        let mut columns: Vec<ArrayRef> = self
            .builders
            .into_iter()
            .map(ColBuilder::finish)
            .collect::<Result<_, _>>()?;
        if self.rescue {
            let mut r = self.rescued_col;
            columns.push(Arc::new(r.finish()));
        }
        let batch = if columns.is_empty() {
            RecordBatch::new_empty(schema)
        } else {
            RecordBatch::try_new(schema, columns)?
        };
        Ok(Parsed {
            batch,
            rejects: self.rejects,
            records: self.records,
            rescued: self.rescued,
            unknown: self.unknown,
            truncate_at: None,
            not_debezium: false,
        })
    }
}
