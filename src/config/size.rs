//! Byte sizes as settings and flags write them (`64MB`, `1GiB`, `1048576`).

/// Parses sizes like `8MiB`, `64MB`, `1GiB`, `1048576`. Sizes under 1 MiB are refused: Delta
/// files that small only add log and listing overhead.
pub fn parse_bytes(s: &str) -> Option<u64> {
    parse_size(s).filter(|b| *b >= 1 << 20)
}

/// Parses a byte size with an optional unit: `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000),
/// `KiB`/`MiB`/`GiB`/`TiB` or `K`/`M`/`G`/`T` (powers of 1024), case-insensitive.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        "tb" => 1_000_000_000_000,
        "tib" | "t" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}
