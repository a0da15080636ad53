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
    let SortedKeys {
        key_type, sorted, ..
    } = keys;
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
    keys: &SortedKeys,
) -> Result<Vec<Admitted>, RunError> {
    let sorted = &keys.sorted;
    let all = || {
        (0..file.row_groups().len())
            .map(|group| Admitted {
                group,
                keys: 0..sorted.len(),
            })
            .collect::<Vec<_>>()
    };
    let Ok((mins, maxs)) = file.bounds(first_key) else {
        return Ok(all());
    };
    let a = |e| RunError::arrow(Phase::Compare)(e);
    let (Ok(mins), Ok(maxs)) = (
        arrow::compute::cast(&mins, &keys.key_type),
        arrow::compute::cast(&maxs, &keys.key_type),
    ) else {
        return Ok(all());
    };
    let exact = file.exact_bounds(first_key);
    let conv = RowConverter::new(vec![SortField::new(keys.key_type.clone())]).map_err(&a)?;
    let lo = conv
        .convert_columns(std::slice::from_ref(&mins))
        .map_err(&a)?;
    let hi = conv
        .convert_columns(std::slice::from_ref(&maxs))
        .map_err(&a)?;
    Ok((0..file.row_groups().len())
        .filter_map(|group| {
            let lo = mins.is_valid(group).then(|| lo.row(group));
            let hi = maxs.is_valid(group).then(|| hi.row(group));
            let (lo, hi) = (
                lo.as_ref().map(|r| r.as_ref()),
                hi.as_ref().map(|r| r.as_ref()),
            );
            if !admits(sorted, lo, hi) {
                return None;
            }
            // The slice keys inside the bounds; bounds a writer shortened (long strings) are
            // not trusted to say which, any of them may be there
            let keys = match (lo, hi) {
                (Some(lo), Some(hi)) if exact.get(group) == Some(&true) => {
                    sorted.partition_point(|k| k.as_ref() < lo)
                        ..sorted.partition_point(|k| k.as_ref() <= hi)
                }
                _ => 0..sorted.len(),
            };
            Some(Admitted { group, keys })
        })
        .collect())
}

/// A row group whose key statistics admit a slice key, and which of the slice's sorted first
/// keys (`SortedKeys::sorted`, by index) its rows can hold.
pub(super) struct Admitted {
    pub(super) group: usize,
    pub(super) keys: std::ops::Range<usize>,
}

/// The slice's first key column in its storage type: its values encoded and sorted, for
/// pruning files and row groups by their key statistics, and the same values as an array in
/// the same order, for finding them in a row group's decoded keys.
pub(super) struct SortedKeys {
    pub(super) key_type: DataType,
    pub(super) sorted: Vec<Box<[u8]>>,
    pub(super) values: ArrayRef,
}

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
    let keys = match winners.column_by_name(first) {
        Some(c) => arrow::compute::cast(c, &key_type).map_err(&a)?,
        None => arrow::array::new_empty_array(&key_type),
    };
    let encoded = conv.convert_columns(&[keys]).map_err(&a)?;
    let mut sorted: Vec<Box<[u8]>> = encoded.iter().map(|r| r.as_ref().into()).collect();
    sorted.sort_unstable();
    let parser = conv.parser();
    let values = conv
        .convert_rows(sorted.iter().map(|k| parser.parse(k)))
        .map_err(&a)?
        .pop()
        .unwrap_or_else(|| arrow::array::new_empty_array(&key_type));
    Ok(SortedKeys {
        key_type,
        sorted,
        values,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, StringArray};

    use super::*;
    use crate::lake::datafile::FastPath;

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

    /// A one-file Delta table of string keys in row groups of two, and that file's footer.
    async fn key_file(dir: &std::path::Path, keys: &[&str]) -> DataFile {
        let batch = RecordBatch::try_from_iter([(
            "id",
            Arc::new(StringArray::from(keys.to_vec())) as ArrayRef,
        )])
        .unwrap();
        let table = crate::lake::datafile::tests::one_file_table(dir, batch, 2).await;
        let fast = FastPath::check(&table).unwrap().unwrap();
        let view = table.snapshot().unwrap().log_data().iter().next().unwrap();
        DataFile::open(&fast.store, &view.path(), view.size() as u64)
            .await
            .unwrap()
    }

    fn slice_keys(ks: &[&str]) -> SortedKeys {
        let values: ArrayRef = Arc::new(StringArray::from(ks.to_vec()));
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8)]).unwrap();
        let rows = conv.convert_columns(std::slice::from_ref(&values)).unwrap();
        SortedKeys {
            key_type: DataType::Utf8,
            sorted: rows.iter().map(|r| r.as_ref().into()).collect(),
            values,
        }
    }

    #[tokio::test]
    async fn a_row_group_says_which_slice_keys_it_can_hold_when_its_bounds_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let file = key_file(dir.path(), &["a", "c", "d", "f", "g", "i"]).await;
        let keys = slice_keys(&["b", "e", "f", "z"]);
        let admitted = admitted_row_groups(&file, "id", &keys).unwrap();
        let got: Vec<(usize, std::ops::Range<usize>)> =
            admitted.iter().map(|a| (a.group, a.keys.clone())).collect();
        // [a, c] holds b; [d, f] holds e and f; [g, i] none
        assert_eq!(got, vec![(0, 0..1), (1, 1..3)]);

        // Strings longer than the statistics keep (64 bytes): shortened bounds are not exact,
        // and every slice key is looked for.
        let long = |c: &str| format!("{}{c}", "k".repeat(70));
        let (a, b, c, d) = (long("a"), long("b"), long("c"), long("d"));
        let dir = tempfile::tempdir().unwrap();
        let file = key_file(dir.path(), &[&a, &c]).await;
        let keys = slice_keys(&[&b, &d]);
        let admitted = admitted_row_groups(&file, "id", &keys).unwrap();
        let got: Vec<(usize, std::ops::Range<usize>)> =
            admitted.iter().map(|a| (a.group, a.keys.clone())).collect();
        assert_eq!(got, vec![(0, 0..2)]);
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
