//! The generated payments as the Debezium events a PostgreSQL connector sends for them
//! (`tidemark generate --landing DIR --feed debezium`): one event per change, no schema
//! envelope, `decimal.handling.mode: string` (the amount as text, exact), the payment's first
//! version a create (`c`), later ones updates (`u`) whose TOASTed `note` did not change (so it
//! arrives as `__debezium_unavailable_value`), a delete (`d`) holding only the key. The LSN is
//! the commit's place in the log: commit time, then the payment number.

use std::fmt::Write as _;

use super::landing::fields;
use super::world::{Op, Row, Status};

/// What Debezium sends for an unchanged TOASTed column.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// Appends `r` as one Debezium event line to `out`.
pub(super) fn event_line(out: &mut String, r: &Row) {
    let f = fields(r);
    let op = match (r.op, r.status) {
        (Op::Delete, _) => "d",
        (Op::Upsert, Status::Created) => "c",
        (Op::Upsert, _) => "u",
    };
    let cents = r.payment.amount;
    let amount = format!(
        "{}{}.{:02}",
        if cents < 0 { "-" } else { "" },
        cents.abs() / 100,
        cents.abs() % 100
    );
    let note = match op {
        "c" => format!("order reference {}", r.payment.pnum),
        _ => UNAVAILABLE.to_string(),
    };
    let row = match op {
        "d" => format!("{{\"payment_id\":\"{}\"}}", f[0]),
        _ => format!(
            "{{\"payment_id\":\"{}\",\"customer_id\":\"{}\",\"merchant_id\":\"{}\",\"amount\":\"{amount}\",\"currency\":\"{}\",\"status\":\"{}\",\"note\":\"{note}\",\"created_at\":\"{}\",\"updated_at\":\"{}\"}}",
            f[0], f[1], f[2], f[4], f[5], f[6], f[7]
        ),
    };
    let (before, after) = match op {
        "d" => (row.as_str(), "null"),
        _ => ("null", row.as_str()),
    };
    let lsn = r.updated.max(0) as u64 * 1_000 + r.payment.pnum % 1_000;
    let _ = writeln!(
        out,
        "{{\"before\":{before},\"after\":{after},\"source\":{{\"version\":\"2.7.0.Final\",\"connector\":\"postgresql\",\"name\":\"payments\",\"ts_us\":{},\"snapshot\":\"false\",\"db\":\"payments\",\"schema\":\"public\",\"table\":\"payments\",\"lsn\":{lsn}}},\"op\":\"{op}\",\"ts_ms\":{}}}",
        r.updated,
        r.ingested / 1_000,
    );
}
