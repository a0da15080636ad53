//! Candidates: which target files and row groups can hold one of the slice's keys, from the
//! log's and the footers' statistics alone (no data read).

use super::*;

pub(super) fn key_converter(
    roles: &ColumnRoles,
    names: &[String],
) -> Result<RowConverter, RunError> {
    RowConverter::new(
        names
            .iter()
            .map(|n| {
                roles
                    .canonical
                    .field_with_name(n)
                    .map(|f| SortField::new(f.data_type().clone()))
                    .map_err(|e| RunError::arrow(Phase::Compare)(e))
            })
            .collect::<Result<Vec<_>, _>>()?,
    )
    .map_err(RunError::arrow(Phase::Compare))
}

pub(super) fn sub_schema(roles: &ColumnRoles, names: &[String]) -> Result<SchemaRef, RunError> {
    Ok(Arc::new(Schema::new(
        names
            .iter()
            .map(|n| {
                roles
                    .canonical
                    .field_with_name(n)
                    .map(|f| f.as_ref().clone())
                    .map_err(|e| RunError::arrow(Phase::Compare)(e))
            })
            .collect::<Result<Vec<Field>, _>>()?,
    )))
}

/// Whether a key range `[lo, hi]` (encoded; `None`: unbounded on that side) holds at least one
/// of the ascending `sorted` keys. Files (from the log) and row groups (from their footers) are
/// pruned by the same rule.
pub(super) fn admits(sorted: &[Box<[u8]>], lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    let start = lo.map_or(0, |lo| sorted.partition_point(|k| k.as_ref() < lo));
    start < sorted.len() && hi.is_none_or(|hi| sorted[start].as_ref() <= hi)
}

/// Files whose statistics for the first key column admit at least one of the slice's keys
/// (`keys`, see [`sorted_first_keys`]). Files without usable statistics are candidates.
pub(super) fn candidates(
    target: &DeltaTable,
    uri: &str,
    roles: &ColumnRoles,
    keys: &SortedKeys,
) -> Result<Vec<FileInfo>, RunError> {
    let (key_type, sorted) = keys;
    let adds = crate::lake::live_files(target)
        .map_err(RunError::delta(Phase::Compare, uri))?
        .files;
    let first = &roles.keys[0];
    let paths = adds
        .column_by_name("path")
        .map(|c| arrow::compute::cast(c, &DataType::Utf8))
        .transpose()
        .map_err(RunError::arrow(Phase::Compare))?;
    let Some(paths) = paths else {
        return Ok(Vec::new());
    };
    let paths = paths.as_string::<i32>();
    let sizes = adds
        .column_by_name("size_bytes")
        .map(|c| arrow::compute::cast(c, &DataType::UInt64))
        .transpose()
        .map_err(RunError::arrow(Phase::Compare))?;
    let sizes = sizes
        .as_ref()
        .map(|s| s.as_primitive::<arrow::datatypes::UInt64Type>());
    let conv = RowConverter::new(vec![SortField::new(key_type.clone())])
        .map_err(RunError::arrow(Phase::Compare))?;
    let bound = |name: String| -> Result<Option<Rows>, RunError> {
        let Some(col) = adds.column_by_name(&name) else {
            return Ok(None);
        };
        let col = arrow::compute::cast(col, key_type).map_err(RunError::arrow(Phase::Compare))?;
        Ok(Some(
            conv.convert_columns(&[col])
                .map_err(RunError::arrow(Phase::Compare))?,
        ))
    };
    let mins = bound(format!("min.{first}"))?;
    let maxs = bound(format!("max.{first}"))?;
    let raw_max = adds.column_by_name(&format!("max.{first}")).cloned();
    let mut out = Vec::new();
    for i in 0..adds.num_rows() {
        let lo = mins
            .as_ref()
            .filter(|_| stat_valid(&adds, &format!("min.{first}"), i))
            .map(|m| m.row(i));
        let hi = maxs
            .as_ref()
            .filter(|_| {
                stat_valid(&adds, &format!("max.{first}"), i)
                    && !possibly_truncated(raw_max.as_ref(), i)
            })
            .map(|m| m.row(i));
        if admits(
            sorted,
            lo.as_ref().map(|r| r.as_ref()),
            hi.as_ref().map(|r| r.as_ref()),
        ) {
            let size = sizes.filter(|s| s.is_valid(i)).map(|s| s.value(i));
            out.push(FileInfo {
                path: paths.value(i).to_string(),
                size: size.ok_or_else(|| {
                    RunError::delta(Phase::Compare, uri)(deltalake::DeltaTableError::Generic(
                        format!("the log gives no size for {}", paths.value(i)),
                    ))
                })?,
            });
        }
    }
    Ok(out)
}

pub(super) fn stat_valid(adds: &RecordBatch, name: &str, i: usize) -> bool {
    adds.column_by_name(name).is_some_and(|c| c.is_valid(i))
}

/// String statistics may be cut to a prefix by some writers; a long max is then not an upper
/// bound, so such a file is treated as unbounded above.
pub(super) fn possibly_truncated(max: Option<&arrow::array::ArrayRef>, i: usize) -> bool {
    let Some(max) = max else { return false };
    match arrow::compute::cast(max, &DataType::Utf8) {
        Ok(s)
            if matches!(
                max.data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) =>
        {
            let s = s.as_string::<i32>();
            s.is_valid(i) && s.value(i).chars().count() >= 32
        }
        _ => false,
    }
}

/// Which row groups of a candidate file can hold one of the sorted slice keys, by the row
/// groups' own statistics of the first key column (no statistics: every row group).
pub(super) fn admitted_row_groups(
    file: &DataFile,
    first_key: &str,
    key_type: &DataType,
    sorted: &[Box<[u8]>],
) -> Result<Vec<usize>, RunError> {
    let all = || (0..file.row_groups().len()).collect::<Vec<_>>();
    let Ok((mins, maxs)) = file.bounds(first_key) else {
        return Ok(all());
    };
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let (Ok(mins), Ok(maxs)) = (
        arrow::compute::cast(&mins, key_type),
        arrow::compute::cast(&maxs, key_type),
    ) else {
        return Ok(all());
    };
    let conv = RowConverter::new(vec![SortField::new(key_type.clone())]).map_err(&a)?;
    let lo = conv
        .convert_columns(std::slice::from_ref(&mins))
        .map_err(&a)?;
    let hi = conv
        .convert_columns(std::slice::from_ref(&maxs))
        .map_err(&a)?;
    Ok((0..file.row_groups().len())
        .filter(|&g| {
            admits(
                sorted,
                mins.is_valid(g)
                    .then(|| lo.row(g))
                    .as_ref()
                    .map(|r| r.as_ref()),
                maxs.is_valid(g)
                    .then(|| hi.row(g))
                    .as_ref()
                    .map(|r| r.as_ref()),
            )
        })
        .collect())
}

/// The first key column's storage type, and the slice's values of it encoded and sorted.
pub(super) type SortedKeys = (DataType, Vec<Box<[u8]>>);

/// The slice's first key column, encoded in storage type and sorted, for pruning files and
/// row groups by their key statistics.
pub(super) fn sorted_first_keys(
    roles: &ColumnRoles,
    winners: &RecordBatch,
) -> Result<SortedKeys, RunError> {
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let first = &roles.keys[0];
    let key_type = roles
        .canonical
        .field_with_name(first)
        .map(|f| crate::lake::storage::storage_type(f.data_type()))
        .map_err(&a)?;
    let conv = RowConverter::new(vec![SortField::new(key_type.clone())]).map_err(&a)?;
    let keys = winners
        .column_by_name(first)
        .map(|c| arrow::compute::cast(c, &key_type))
        .transpose()
        .map_err(&a)?;
    let Some(keys) = keys else {
        return Ok((key_type, Vec::new()));
    };
    let encoded = conv.convert_columns(&[keys]).map_err(&a)?;
    let mut sorted: Vec<Box<[u8]>> = encoded.iter().map(|r| r.as_ref().into()).collect();
    sorted.sort_unstable();
    Ok((key_type, sorted))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, StringArray};

    use super::*;

    fn keys(ks: &[&str]) -> Vec<Box<[u8]>> {
        ks.iter().map(|k| k.as_bytes().into()).collect()
    }

    #[test]
    fn a_range_admits_a_key_only_when_one_lies_inside_its_bounds() {
        let sorted = keys(&["b", "d", "f"]);
        assert!(
            admits(&sorted, Some(b"a"), Some(b"b")),
            "inclusive upper bound"
        );
        assert!(
            admits(&sorted, Some(b"f"), Some(b"z")),
            "inclusive lower bound"
        );
        assert!(!admits(&sorted, Some(b"g"), Some(b"z")), "above every key");
        assert!(!admits(&sorted, Some(b"a"), Some(b"a")), "below every key");
        assert!(!admits(&sorted, Some(b"c"), Some(b"c")), "between two keys");
    }

    #[test]
    fn open_bounds_are_unbounded_and_no_keys_admit_nothing() {
        let sorted = keys(&["m"]);
        assert!(admits(&sorted, None, None));
        assert!(admits(&sorted, None, Some(b"m")));
        assert!(admits(&sorted, Some(b"m"), None));
        assert!(!admits(&sorted, None, Some(b"l")));
        assert!(!admits(&sorted, Some(b"n"), None));
        assert!(
            !admits(&[], None, None),
            "a slice without keys touches no file"
        );
    }

    #[test]
    fn a_long_string_maximum_may_be_truncated_and_is_no_upper_bound() {
        let long = "p".repeat(32);
        let max: ArrayRef = Arc::new(StringArray::from(vec![
            Some("pay_0001"),
            Some(long.as_str()),
            None,
        ]));
        assert!(!possibly_truncated(Some(&max), 0));
        assert!(
            possibly_truncated(Some(&max), 1),
            "32 characters: a writer may have cut it"
        );
        assert!(
            !possibly_truncated(Some(&max), 2),
            "no statistic is handled as missing"
        );
        let ints: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![i64::MAX]));
        assert!(
            !possibly_truncated(Some(&ints), 0),
            "numbers are never truncated"
        );
        assert!(!possibly_truncated(None, 0));
    }
}
