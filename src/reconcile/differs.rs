//! Whether one measure of a differing day-and-group row is among its differences, judged on
//! the rendered values (the report lists only the measures that differ): decimals and integers
//! exactly, floats within the order of a sum's rounding.

use arrow::datatypes::DataType;

use crate::ingest::decimal;

/// `values` are the recompute, gold's published value and the adjustments booked (rendered;
/// `None` is null). An additive measure counts a missing side as 0 and, on a final day, is
/// published as gold plus adjustments; any other measure differs when its text does.
pub(super) fn differs_here(
    additive: bool,
    data_type: &DataType,
    is_final: bool,
    values: [&Option<String>; 3],
) -> bool {
    let [r, p, a] = values;
    if !additive {
        return r != p;
    }
    match exact_scale(data_type) {
        Some(scale) => differs_exactly(scale, is_final, [r, p, a]),
        None => differs_as_floats(is_final, [r, p, a]),
    }
}

/// The scale a measure's values are compared at exactly (0 for integers); `None` for floats.
fn exact_scale(data_type: &DataType) -> Option<i8> {
    match data_type {
        DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => Some((*s).max(0)),
        t if t.is_integer() => Some(0),
        _ => None,
    }
}

fn differs_exactly(scale: i8, is_final: bool, [r, p, a]: [&Option<String>; 3]) -> bool {
    let num = |v: &Option<String>| {
        v.as_deref()
            .map_or(Ok(0), |t| decimal::parse(t, decimal::MAX_PRECISION, scale))
    };
    let (Ok(r), Ok(p), Ok(a)) = (num(r), num(p), num(a)) else {
        return true;
    };
    let published = if is_final { p.checked_add(a) } else { Some(p) };
    published != Some(r)
}

fn differs_as_floats(is_final: bool, [r, p, a]: [&Option<String>; 3]) -> bool {
    let num = |v: &Option<String>| v.as_deref().map_or(Some(0.0), |t| t.parse::<f64>().ok());
    let (Some(r), Some(p), Some(a)) = (num(r), num(p), num(a)) else {
        return true;
    };
    let published = if is_final { p + a } else { p };
    if r.is_nan() || published.is_nan() {
        return r.is_nan() != published.is_nan();
    }
    (published - r).abs() > 1e-9 * r.abs().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn decimals_differ_by_one_cent_however_large() {
        let dec = DataType::Decimal128(22, 2);
        let big = s("12345678.91");
        assert!(differs_here(
            true,
            &dec,
            false,
            [&big, &s("12345678.92"), &None]
        ));
        assert!(!differs_here(true, &dec, false, [&big, &big, &s("5.00")]));
        assert!(!differs_here(
            true,
            &dec,
            true,
            [&s("0.30"), &s("0.10"), &s("0.20")]
        ));
        assert!(differs_here(
            true,
            &dec,
            true,
            [&s("0.30"), &s("0.10"), &None]
        ));
        assert!(!differs_here(true, &dec, false, [&None, &s("0.00"), &None]));
        // floats: within 1e-9 of the recompute is the same sum
        let f = DataType::Float64;
        assert!(!differs_here(
            true,
            &f,
            false,
            [&big, &s("12345678.92"), &None]
        ));
        let i = DataType::Int64;
        assert!(differs_here(
            true,
            &i,
            false,
            [&s("9007199254740993"), &s("9007199254740992"), &None]
        ));
    }
}
