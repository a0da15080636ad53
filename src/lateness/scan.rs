//! The one pass over the table: a projected scan of the two time columns (and the `--by`
//! column), one stream per DataFusion partition, each consumed by its own task into its own
//! accumulator; the accumulators are merged at the end.

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, PrimitiveArray, RecordBatch};
use arrow::buffer::{NullBuffer, ScalarBuffer};
use arrow::compute::kernels::arity::unary;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Int64Type, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;
use deltalake::DeltaTable;
use futures::StreamExt;

use super::acc::{Acc, Bounds, Shape, DAY};
use super::LatenessError;

/// Most `--by` groups a profile holds (each keeps exact counts of its own).
pub const MAX_GROUPS: usize = 1000;

/// Whether lateness can be measured on a column of this type.
pub fn is_time(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64
    )
}

/// A time column as microseconds since the epoch (UTC; a timestamp without time zone is read
/// as UTC, a date as its midnight), with its nulls. Microsecond columns are not copied;
/// nanoseconds are floored to the microsecond.
pub fn micros(col: &ArrayRef) -> (ScalarBuffer<i64>, Option<NullBuffer>) {
    let nulls = col.logical_nulls().filter(|n| n.null_count() > 0);
    let values: ScalarBuffer<i64> = match col.data_type() {
        DataType::Timestamp(TimeUnit::Microsecond, _) => col
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .clone(),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            convert(col.as_primitive::<TimestampNanosecondType>(), |v: i64| {
                v.div_euclid(1_000)
            })
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            convert(col.as_primitive::<TimestampMillisecondType>(), |v: i64| {
                v.saturating_mul(1_000)
            })
        }
        DataType::Timestamp(TimeUnit::Second, _) => {
            convert(col.as_primitive::<TimestampSecondType>(), |v: i64| {
                v.saturating_mul(1_000_000)
            })
        }
        DataType::Date32 => convert(col.as_primitive::<Date32Type>(), |v: i32| {
            i64::from(v) * DAY
        }),
        DataType::Date64 => convert(col.as_primitive::<Date64Type>(), |v: i64| {
            v.saturating_mul(1_000)
        }),
        // Checked against the schema before the scan starts.
        _ => ScalarBuffer::from(vec![0i64; col.len()]),
    };
    (values, nulls)
}

fn convert<T, F>(a: &PrimitiveArray<T>, f: F) -> ScalarBuffer<i64>
where
    T: arrow::datatypes::ArrowPrimitiveType,
    F: Fn(T::Native) -> i64,
{
    unary::<T, _, Int64Type>(a, f).values().clone()
}

/// The table as a DataFrame of all its columns (nothing is read until it is executed).
pub async fn frame(
    table: &DeltaTable,
    ctx: &SessionContext,
    uri: &str,
) -> Result<DataFrame, LatenessError> {
    let delta = |source| LatenessError::Delta {
        uri: uri.to_string(),
        source: Box::new(source),
    };
    table
        .update_datafusion_session(&ctx.state())
        .map_err(delta)?;
    let provider = table.table_provider().await.map_err(|e| query(uri, e))?;
    ctx.read_table(provider)
        .map_err(|source| query(uri, source))
}

pub fn query(uri: &str, source: datafusion::error::DataFusionError) -> LatenessError {
    LatenessError::Query {
        uri: uri.to_string(),
        source: Box::new(source),
    }
}

/// What the scan produced: the whole table, and per `--by` value (`None`: null).
pub struct Scanned {
    pub table: Acc,
    pub groups: Vec<(Option<String>, Acc)>,
}

/// One pass: `df` projected to `[event, arrival]` or `[event, arrival, by]`.
pub async fn scan(
    df: DataFrame,
    bounds: Bounds,
    by: Option<&str>,
    uri: &str,
) -> Result<Scanned, LatenessError> {
    let streams = df
        .execute_stream_partitioned()
        .await
        .map_err(|e| query(uri, e))?;
    let mut tasks = tokio::task::JoinSet::new();
    for stream in streams {
        let by = by.map(str::to_string);
        let uri = uri.to_string();
        tasks.spawn(async move { consume(stream, bounds, by, &uri).await });
    }
    let mut parts = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(part) => parts.push(part?),
            Err(e) => {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
                return Err(LatenessError::Task {
                    uri: uri.to_string(),
                    message: e.to_string(),
                });
            }
        }
    }
    let mut table = Acc::new(Shape::TABLE);
    let mut groups: HashMap<Option<String>, Acc> = HashMap::new();
    for part in parts {
        table.merge(part.table);
        if let Some(g) = part.groups {
            for (name, acc) in g.accs {
                match groups.get_mut(&name) {
                    Some(mine) => mine.merge(acc),
                    None => {
                        groups.insert(name, acc);
                    }
                }
            }
        }
    }
    if let Some(column) = by {
        if groups.len() > MAX_GROUPS {
            return Err(LatenessError::TooManyGroups {
                column: column.to_string(),
                max: MAX_GROUPS,
            });
        }
    }
    Ok(Scanned {
        table,
        groups: groups.into_iter().collect(),
    })
}

struct Part {
    table: Acc,
    groups: Option<Groups>,
}

/// One partition's `--by` groups.
struct Groups {
    column: String,
    index: HashMap<String, usize>,
    null: Option<usize>,
    accs: Vec<(Option<String>, Acc)>,
}

impl Groups {
    fn slot(&mut self, key: Option<&str>) -> Result<usize, LatenessError> {
        let found = match key {
            Some(k) => self.index.get(k).copied(),
            None => self.null,
        };
        if let Some(i) = found {
            return Ok(i);
        }
        if self.accs.len() >= MAX_GROUPS {
            return Err(LatenessError::TooManyGroups {
                column: self.column.clone(),
                max: MAX_GROUPS,
            });
        }
        let i = self.accs.len();
        self.accs
            .push((key.map(str::to_string), Acc::new(Shape::GROUP)));
        match key {
            Some(k) => {
                self.index.insert(k.to_string(), i);
            }
            None => self.null = Some(i),
        }
        Ok(i)
    }
}

async fn consume(
    mut stream: SendableRecordBatchStream,
    bounds: Bounds,
    by: Option<String>,
    uri: &str,
) -> Result<Part, LatenessError> {
    let mut part = Part {
        table: Acc::new(Shape::TABLE),
        groups: by.map(|column| Groups {
            column,
            index: HashMap::new(),
            null: None,
            accs: Vec::new(),
        }),
    };
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| query(uri, e))?;
        ingest(&mut part, &batch, &bounds)?;
    }
    Ok(part)
}

/// One batch into the partition's accumulators: the time columns are normalised with arrow
/// kernels, the null counts and the latest arrival come from the null buffers and the `max`
/// kernel, and one tight loop over the two value slices does the bucketing.
fn ingest(part: &mut Part, batch: &RecordBatch, b: &Bounds) -> Result<(), LatenessError> {
    let (ev, ev_nulls) = micros(batch.column(0));
    let (ar, ar_nulls) = micros(batch.column(1));
    let t = &mut part.table;
    t.rows += batch.num_rows() as u64;
    t.null_event += ev_nulls.as_ref().map_or(0, |n| n.null_count() as u64);
    t.null_arrival += ar_nulls.as_ref().map_or(0, |n| n.null_count() as u64);
    let latest = arrow::compute::max(&Int64Array::new(ar.clone(), ar_nulls.clone()));
    if let Some(m) = latest {
        t.max_arrival = Some(t.max_arrival.map_or(m, |x| x.max(m)));
    }
    let both = NullBuffer::union(ev_nulls.as_ref(), ar_nulls.as_ref());
    match &both {
        None => {
            for (&e, &a) in ev.iter().zip(ar.iter()) {
                t.add(e, a, b);
            }
        }
        Some(valid) => {
            for i in valid.valid_indices() {
                t.add(ev[i], ar[i], b);
            }
        }
    }
    let Some(groups) = part.groups.as_mut() else {
        return Ok(());
    };
    let keys = arrow::compute::cast(batch.column(2), &DataType::Utf8).map_err(|e| {
        LatenessError::Usage(format!(
            "--by {}: its values cannot be read as text: {e}",
            groups.column
        ))
    })?;
    let keys = keys.as_string::<i32>();
    let mut last: Option<(Option<&str>, usize)> = None;
    for i in 0..batch.num_rows() {
        let key = keys.is_valid(i).then(|| keys.value(i));
        let slot = match last {
            Some((k, s)) if k == key => s,
            _ => {
                let s = groups.slot(key)?;
                last = Some((key, s));
                s
            }
        };
        let acc = &mut groups.accs[slot].1;
        acc.rows += 1;
        let ev_ok = ev_nulls.as_ref().is_none_or(|n| n.is_valid(i));
        let ar_ok = ar_nulls.as_ref().is_none_or(|n| n.is_valid(i));
        acc.null_event += u64::from(!ev_ok);
        acc.null_arrival += u64::from(!ar_ok);
        if ar_ok {
            acc.max_arrival = Some(acc.max_arrival.map_or(ar[i], |x| x.max(ar[i])));
        }
        if ev_ok && ar_ok {
            acc.add(ev[i], ar[i], b);
        }
    }
    Ok(())
}

/// The latest arrival by reading the arrival column alone (when the log has no statistics
/// for it): `None` when every arrival is null or the table is empty.
pub async fn max_arrival(df: DataFrame, uri: &str) -> Result<Option<i64>, LatenessError> {
    let mut streams = df
        .execute_stream_partitioned()
        .await
        .map_err(|e| query(uri, e))?;
    let mut best: Option<i64> = None;
    for stream in streams.iter_mut() {
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| query(uri, e))?;
            let (values, nulls) = micros(batch.column(0));
            if let Some(m) = arrow::compute::max(&Int64Array::new(values, nulls)) {
                best = Some(best.map_or(m, |b| b.max(m)));
            }
        }
    }
    Ok(best)
}

/// The range of a time column's values from the log's statistics (no data file is read);
/// `None` when a file lacks them.
pub fn range_from_stats(table: &DeltaTable, column: &str) -> Option<(i64, i64)> {
    let files = crate::lake::live_files(table).ok()?.files;
    if files.num_rows() == 0 {
        return None;
    }
    let read = |prefix: &str| -> Option<ArrayRef> {
        let c = files.column_by_name(&format!("{prefix}.{column}"))?;
        arrow::compute::cast(c, &DataType::Timestamp(TimeUnit::Microsecond, None)).ok()
    };
    let (min, min_nulls) = micros(&read("min")?);
    let (max, max_nulls) = micros(&read("max")?);
    // A file without statistics for the column (or with only nulls in it): unknown.
    if min_nulls.is_some() || max_nulls.is_some() {
        return None;
    }
    let lo = min.iter().copied().min()?;
    let hi = max.iter().copied().max()?;
    Some((lo, hi))
}

/// Column names of a DataFrame, in order.
pub fn column_names(df: &DataFrame) -> Vec<String> {
    df.schema()
        .fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect()
}

/// The type of column `name` (exact name match).
pub fn column_type(df: &DataFrame, name: &str) -> Option<DataType> {
    df.schema()
        .fields()
        .iter()
        .find(|f| f.name() == name)
        .map(|f| f.data_type().clone())
}
