//! Exact decimals: the text of a number (`12.34`, `-0.5`, `1.5e2`) as the unscaled `i128` of a
//! `decimal(p, s)`, never through an `f64`. A value that needs more decimal places than `s`, or
//! more digits before the point than `p - s`, does not fit: it is not rounded.

use std::fmt;

/// The most digits a decimal holds (Arrow `Decimal128`).
pub const MAX_PRECISION: u8 = crate::config::pipeline::ingest::MAX_DECIMAL_PRECISION;

/// Exponents beyond this are clamped: any such value is zero or has far more than 38 digits.
const EXPONENT_CLAMP: i64 = 1_000_000;

/// Why a text is not a value of a `decimal(p, s)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// Not a number at all (`abc`, `NaN`, `Infinity`, `1,5`).
    NotANumber,
    /// It needs `places` decimal places; the column keeps `scale`.
    Places { places: i64, scale: i8 },
    /// It has `digits` digits before the point; the column keeps `precision - scale`.
    IntegerDigits { digits: i64, max: i64 },
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::NotANumber => f.write_str("not a number"),
            Misfit::Places { places, scale } => {
                write!(f, "{places} decimal places, at most {scale}")
            }
            Misfit::IntegerDigits { digits, max } => {
                write!(f, "{digits} digits before the point, at most {max}")
            }
        }
    }
}

/// A number's digits and where the point goes: `value = digits × 10^exponent`, `digits` without
/// leading or trailing zeros (empty for zero).
struct Number {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

/// `text` (surrounding whitespace allowed) as the unscaled value of a `decimal(precision,
/// scale)`: `12.3` in `decimal(5, 2)` is 1230. `-0.00` is 0.
pub fn parse(text: &str, precision: u8, scale: i8) -> Result<i128, Misfit> {
    let n = number(text.trim()).ok_or(Misfit::NotANumber)?;
    if n.digits.is_empty() {
        return Ok(0);
    }
    let scale = i64::from(scale);
    let places = (-n.exponent).max(0);
    if places > scale {
        return Err(Misfit::Places {
            places,
            scale: scale as i8,
        });
    }
    // digits before the point: the significant digits plus the zeros the exponent appends
    let before = n.digits.len() as i64 + n.exponent;
    let max = i64::from(precision) - scale;
    if before > max {
        return Err(Misfit::IntegerDigits {
            digits: before,
            max,
        });
    }
    // at most `precision` ≤ 38 digits from here on: an i128 holds them
    let mut v: i128 = 0;
    for d in &n.digits {
        v = v * 10 + i128::from(*d);
    }
    for _ in 0..(n.exponent + scale) {
        v *= 10;
    }
    Ok(if n.negative { -v } else { v })
}

/// `[+-]digits[.digits][(e|E)[+-]digits]`, with digits on at least one side of the point.
fn number(t: &str) -> Option<Number> {
    let (negative, t) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    let exponent = match exp {
        Some(e) => exponent(e)?,
        None => 0,
    };
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    let mut exponent = exponent - frac.len() as i64;
    let lead = digits.iter().take_while(|d| **d == 0).count();
    digits.drain(..lead);
    while digits.last() == Some(&0) {
        digits.pop();
        exponent += 1;
    }
    Some(Number {
        negative,
        digits,
        exponent,
    })
}

/// An exponent's text (`2`, `-3`, `+10`), clamped to ±[`EXPONENT_CLAMP`].
fn exponent(e: &str) -> Option<i64> {
    let (sign, digits) = match e.as_bytes().first()? {
        b'-' => (-1, &e[1..]),
        b'+' => (1, &e[1..]),
        _ => (1, e),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    let magnitude = match significant.len() {
        0 => 0,
        // (more digits than the clamp has: beyond it)
        n if n > 7 => EXPONENT_CLAMP,
        _ => significant.parse::<i64>().ok()?.min(EXPONENT_CLAMP),
    };
    Some(sign * magnitude)
}

/// An unscaled value as text with its point: `(1230, 2)` is `12.30`.
pub fn render(unscaled: i128, scale: i8) -> String {
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = scale.max(0) as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_kept_exactly() {
        assert_eq!(parse("12.34", 12, 2), Ok(1234));
        assert_eq!(parse("0.1", 12, 2), Ok(10));
        assert_eq!(parse("0.10", 12, 2), Ok(10));
        assert_eq!(parse("7", 12, 2), Ok(700));
        assert_eq!(parse("-5.5", 12, 2), Ok(-550));
        assert_eq!(parse("+5.50", 12, 2), Ok(550));
        assert_eq!(parse(".5", 3, 1), Ok(5));
        assert_eq!(parse("5.", 3, 1), Ok(50));
        assert_eq!(parse("  12.30 \t", 12, 2), Ok(1230), "whitespace around");
        assert_eq!(parse("12.3400000", 12, 2), Ok(1234), "trailing zeros fit");
        assert_eq!(parse("0000012.34", 4, 2), Ok(1234), "leading zeros fit");
    }

    #[test]
    fn a_23_digit_value_in_decimal_38_2() {
        let v = parse("12345678901234567890123.45", 38, 2).expect("fits");
        assert_eq!(v, 1_234_567_890_123_456_789_012_345i128);
        assert_eq!(render(v, 2), "12345678901234567890123.45");
        // f64 would give 12345678901234567000000.00
        let max = "9".repeat(36) + ".99";
        assert_eq!(render(parse(&max, 38, 2).expect("fits"), 2), max);
        assert_eq!(parse(&format!("-{max}"), 38, 2), Ok(-(10i128.pow(38) - 1)));
    }

    #[test]
    fn negative_zero_is_zero() {
        assert_eq!(parse("-0.00", 12, 2), Ok(0));
        assert_eq!(parse("-0", 1, 0), Ok(0));
        assert_eq!(parse("0e5", 1, 0), Ok(0));
        assert_eq!(
            parse("-0.000e-9", 3, 2),
            Ok(0),
            "zero fits whatever its places"
        );
    }

    #[test]
    fn exponents_are_exact() {
        assert_eq!(parse("1.5e2", 12, 2), Ok(15000));
        assert_eq!(parse("1.5E+2", 12, 0), Ok(150));
        assert_eq!(parse("1234e-2", 12, 2), Ok(1234));
        assert_eq!(parse("1e-2", 3, 2), Ok(1));
        assert_eq!(
            parse("1e-3", 12, 2),
            Err(Misfit::Places {
                places: 3,
                scale: 2
            })
        );
        assert_eq!(
            parse("1e40", 38, 0),
            Err(Misfit::IntegerDigits {
                digits: 41,
                max: 38
            })
        );
        assert_eq!(
            parse("1e99999999999999999999", 38, 0),
            Err(Misfit::IntegerDigits {
                digits: 1_000_001,
                max: 38
            })
        );
        assert!(parse("1e-99999999999999999999", 38, 2).is_err());
    }

    #[test]
    fn excess_places_are_not_rounded() {
        let e = parse("12.345", 12, 2).unwrap_err();
        assert_eq!(e.to_string(), "3 decimal places, at most 2");
        assert!(parse("0.001", 12, 2).is_err());
        assert!(parse("1.5", 5, 0).is_err());
    }

    #[test]
    fn too_many_digits_before_the_point_overflow() {
        let e = parse("12345678901", 12, 2).unwrap_err();
        assert_eq!(e.to_string(), "11 digits before the point, at most 10");
        assert_eq!(parse("9999999999.99", 12, 2), Ok(999_999_999_999));
        assert!(parse("1", 2, 2).is_err(), "decimal(2, 2) holds less than 1");
        assert_eq!(parse("0.99", 2, 2), Ok(99));
        assert!(parse(&"9".repeat(39), 38, 0).is_err());
    }

    #[test]
    fn what_is_not_a_number() {
        for t in [
            "", " ", "abc", "NaN", "nan", "Infinity", "-inf", "1,5", "1.2.3", "--1", "1e", "e5",
            ".", "-", "1_000", "0x10", "1e+", "1 2",
        ] {
            assert_eq!(parse(t, 12, 2), Err(Misfit::NotANumber), "{t:?}");
        }
    }

    #[test]
    fn rendering_puts_the_point_back() {
        assert_eq!(render(1234, 2), "12.34");
        assert_eq!(render(-5, 2), "-0.05");
        assert_eq!(render(0, 2), "0.00");
        assert_eq!(render(42, 0), "42");
    }

    proptest::proptest! {
        /// Any value of a decimal(p, s) written with its point, with an exponent or with
        /// trailing zeros parses back to itself; one more non-zero place does not fit.
        #[test]
        fn written_values_parse_back_exactly(
            v in proptest::prelude::any::<i64>(),
            p in 19u8..=38,
            s in 0i8..=18,
            extra in 1u8..=9,
        ) {
            let v = i128::from(v);
            let text = render(v, s);
            proptest::prop_assert_eq!(parse(&text, p, s), Ok(v));
            proptest::prop_assert_eq!(parse(&format!("{v}e-{s}"), p, s), Ok(v));
            if s > 0 {
                proptest::prop_assert_eq!(parse(&format!(" {text}000 "), p, s), Ok(v));
            }
            let finer = if s == 0 { format!("{text}.{extra}") } else { format!("{text}{extra}") };
            proptest::prop_assert_eq!(
                parse(&finer, p, s),
                Err(Misfit::Places { places: i64::from(s) + 1, scale: s })
            );
        }
    }
}
