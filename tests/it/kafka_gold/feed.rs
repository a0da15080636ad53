//! The feed of `kafka_gold`: a PostgreSQL `payments` table's changes as its Debezium
//! connector sends them to a topic, chosen by a seeded generator, and the oracles — bronze,
//! silver and gold as the produced events say, folded without tidemark's code.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate};
use serde_json::{json, Value};

use crate::common::debezium::{
    self, decimal_field, envelope_schema, precise, text_decimal, MARKER,
};
use crate::common::kafka::{Kafka, Msg};

pub(super) const TOPIC: &str = "pg.public.payments";
pub(super) const PARTITIONS: i32 = 3;
pub(super) const MIN_MS: i64 = 60_000;
pub(super) const H_MS: i64 = 60 * MIN_MS;
pub(super) const DAY_MS: i64 = 24 * H_MS;
/// Europe/Amsterdam in January is UTC+1: gold's days are its local days.
pub(super) const CET_MS: i64 = H_MS;
/// The largest `decimal(18, 2)`, 9999999999999999.99: a dozen of them overflow an i64 sum.
pub(super) const WHALE: i128 = 999_999_999_999_999_999;
/// gold's `recompute.lookback`, in days.
pub(super) const LOOKBACK: i64 = 1;

/// A payment row as one event sends it.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub(super) cents: i128,
    pub(super) currency: &'static str,
    pub(super) status: &'static str,
    /// `None`: sent as the TOAST marker (the note did not change).
    pub(super) note: Option<String>,
    pub(super) created_ms: i64,
}

/// One change event, as produced to the topic.
#[derive(Debug, Clone)]
pub(super) struct Event {
    pub(super) id: i64,
    pub(super) op: &'static str,
    /// The commit time (a snapshot read: when it read the row), ms.
    pub(super) ts_ms: i64,
    pub(super) lsn: u64,
    /// `None` for a delete: its `before` holds only the key (replica identity default).
    pub(super) row: Option<Sent>,
    /// In the schema envelope, the amount precise (base64); else the amount as text.
    pub(super) envelope: bool,
}

fn schema() -> Value {
    envelope_schema(json!([
        {"field": "payment_id", "type": "int64"},
        decimal_field("amount", 18, 2),
        {"field": "currency", "type": "string", "optional": true},
        {"field": "status", "type": "string", "optional": true},
        {"field": "note", "type": "string", "optional": true},
        {"field": "created_at", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"}
    ]))
}

fn value(e: &Event) -> String {
    let mut row = json!({"payment_id": e.id});
    if let Some(s) = &e.row {
        row["amount"] = json!(if e.envelope {
            precise(s.cents)
        } else {
            text_decimal(s.cents, 2)
        });
        row["currency"] = json!(s.currency);
        row["status"] = json!(s.status);
        row["note"] = json!(s.note.as_deref().unwrap_or(MARKER));
        row["created_at"] = json!(s.created_ms * 1_000);
    }
    let schema = e.envelope.then(schema);
    debezium::event(e.op, row, e.ts_ms, e.lsn, schema.as_ref())
}

/// The source database: its live rows and the changes it logs, chosen by a seeded generator.
pub(super) struct Source {
    live: BTreeMap<i64, Sent>,
    deleted: Vec<i64>,
    next_id: i64,
    clock_ms: i64,
    lsn: u64,
    rng: u64,
}

impl Source {
    pub(super) fn new(seed: u64) -> Source {
        Source {
            live: BTreeMap::new(),
            deleted: Vec::new(),
            next_id: 0,
            clock_ms: 0,
            lsn: 0,
            rng: seed,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }

    /// An amount in cents: mostly ordinary, some refunds below zero, 0.10s and 0.20s that a
    /// double would not add exactly, and whales at the type's limit.
    fn amount(&mut self) -> i128 {
        match self.rand(10) {
            0 => WHALE - self.rand(1_000) as i128,
            1 => -(self.rand(50_000) as i128 + 1),
            2 => 10 * (1 + self.rand(2) as i128),
            _ => self.rand(10_000_000) as i128,
        }
    }

    fn emit(&mut self, id: i64, op: &'static str, row: Option<Sent>) -> Event {
        self.clock_ms += 7 * MIN_MS;
        self.lsn += 16;
        let envelope = self.rand(2) == 0;
        Event {
            id,
            op,
            ts_ms: self.clock_ms,
            lsn: self.lsn,
            row,
            envelope,
        }
    }

    fn insert(&mut self, id: i64, cents: i128, currency: &'static str, created_ms: i64) -> Sent {
        let s = Sent {
            cents,
            currency,
            status: "captured",
            note: Some(format!("note {id} at {}", self.lsn)),
            created_ms,
        };
        self.live.insert(id, s.clone());
        s
    }

    /// A new payment (or, with `id`, a deleted one's key again), created 40 minutes before
    /// its commit: the first of a day's are local-midnight payments of the UTC day before.
    fn create(&mut self, id: Option<i64>) -> Event {
        let id = id.unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id
        });
        let cents = self.amount();
        let currency = ["EUR", "USD", "GBP"][self.rand(3) as usize];
        let s = self.insert(id, cents, currency, self.clock_ms - 33 * MIN_MS);
        self.emit(id, "c", Some(s))
    }

    /// An update: a new amount or a refund, now and then a correction of the payment's time
    /// to the day before; the note changed or, half the time, unchanged and so TOASTed.
    fn update(&mut self, id: i64) -> Event {
        let mut s = self.live[&id].clone();
        match self.rand(4) {
            0 => s.status = "refunded",
            _ => s.cents = self.amount(),
        }
        if self.rand(8) == 0 {
            s.created_ms -= DAY_MS;
        }
        let toasted = self.rand(2) == 0;
        if !toasted {
            s.note = Some(format!("note {id} at {}", self.lsn));
        }
        self.live.insert(id, s.clone());
        if toasted {
            s.note = None;
        }
        self.emit(id, "u", Some(s))
    }

    fn delete(&mut self, id: i64) -> Event {
        self.live.remove(&id);
        self.deleted.push(id);
        self.emit(id, "d", None)
    }

    fn any_live(&mut self) -> i64 {
        let ids: Vec<i64> = self.live.keys().copied().collect();
        ids[self.rand(ids.len() as u64) as usize]
    }

    /// A live payment of a day that is final on `logical` (local days).
    fn closed(&mut self, logical: NaiveDate) -> Option<i64> {
        let ids: Vec<i64> = (self.live.iter())
            .filter(|(_, s)| local_day(s.created_ms) < logical - chrono::Days::new(LOOKBACK as u64))
            .map(|(id, _)| *id)
            .collect();
        (!ids.is_empty()).then(|| ids[self.rand(ids.len() as u64) as usize])
    }

    /// Round 0: the table before the connector started, read by the initial snapshot at 10:00
    /// (all at the snapshot's LSN), then changes streamed from 05:00 — committed after the
    /// snapshot began, so newer than its reads though earlier than them by the clock.
    pub(super) fn snapshot_and_stream(&mut self, day0: i64) -> Vec<Event> {
        let mut out = Vec::new();
        for id in 1..=24 {
            // a dozen whales on one day, in one currency; the rest over three days
            let (cents, currency, created) = if id <= 12 {
                (WHALE - id as i128, "EUR", day0 - 2 * DAY_MS + id * H_MS)
            } else {
                let c = ["EUR", "USD", "GBP"][id as usize % 3];
                (
                    self.amount(),
                    c,
                    day0 - 3 * DAY_MS + id * 3 * H_MS - 30 * MIN_MS,
                )
            };
            let s = self.insert(id, cents, currency, created);
            out.push(Event {
                id,
                op: "r",
                ts_ms: day0 + 10 * H_MS + id * 1_000,
                lsn: 1_000,
                row: Some(s),
                envelope: id % 2 == 0,
            });
        }
        self.next_id = 24;
        self.clock_ms = day0 + 5 * H_MS;
        self.lsn = 2_000;
        for id in [3, 14, 15, 16] {
            out.push(self.update(id));
        }
        out.push(self.delete(17));
        out.push(self.create(None));
        out.push(self.create(None));
        out
    }

    /// A round of streamed changes on `logical`'s day: at least one to a closed day and one
    /// delete, the rest random.
    pub(super) fn stream(&mut self, day_ms: i64, logical: NaiveDate) -> Vec<Event> {
        self.clock_ms = day_ms;
        let mut out = Vec::new();
        if let Some(id) = self.closed(logical) {
            out.push(self.update(id));
        }
        let id = self.any_live();
        out.push(self.delete(id));
        for _ in 0..16 {
            let e = match self.rand(10) {
                0..=2 => self.create(None),
                3..=6 => {
                    let id = self.any_live();
                    self.update(id)
                }
                7 => {
                    let id = self.any_live();
                    self.delete(id)
                }
                8 => match self.deleted.pop() {
                    Some(id) => self.create(Some(id)),
                    None => self.create(None),
                },
                _ => match self.closed(logical) {
                    Some(id) => self.update(id),
                    None => self.create(None),
                },
            };
            out.push(e);
        }
        out
    }
}

pub(super) fn local_day(ms: i64) -> NaiveDate {
    DateTime::from_timestamp_millis(ms + CET_MS)
        .expect("in range")
        .date_naive()
}

/// A record on the topic: the event's number, or `None` for the tombstone after a delete.
pub(super) type Produced = (Option<usize>, i32, i64);

/// Produces `events` (numbered from `first`) keyed by payment, so a key stays on one
/// partition; a delete is followed by its tombstone, as Debezium sends it.
pub(super) async fn produce(kafka: &Kafka, events: &[Event], first: usize) -> Vec<Produced> {
    let mut msgs = Vec::new();
    let mut which = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let msg = |value: Option<Vec<u8>>| Msg {
            partition: (e.id % PARTITIONS as i64) as i32,
            key: Some(json!({"payment_id": e.id}).to_string().into_bytes()),
            value,
            headers: BTreeMap::new(),
            timestamp: DateTime::from_timestamp_millis(e.ts_ms).expect("ts"),
        };
        msgs.push(msg(Some(value(e).into_bytes())));
        which.push(Some(first + i));
        if e.op == "d" {
            msgs.push(msg(None));
            which.push(None);
        }
    }
    let offsets = kafka.produce(TOPIC, &msgs).await;
    (which.into_iter().zip(msgs.iter().zip(offsets)))
        .map(|(w, (m, o))| (w, m.partition, o))
        .collect()
}

/// A bronze row: (partition, offset, payment, op, amount in cents).
pub(super) type BronzeRow = (i32, i64, i64, String, Option<i128>);

/// What bronze must hold: each event once, at its partition and offset; no tombstone.
pub(super) fn bronze_oracle(events: &[Event], produced: &[Produced]) -> Vec<BronzeRow> {
    let mut out: Vec<BronzeRow> = produced
        .iter()
        .filter_map(|(w, p, o)| {
            let e = &events[(*w)?];
            Some((
                *p,
                *o,
                e.id,
                e.op.to_string(),
                e.row.as_ref().map(|s| s.cents),
            ))
        })
        .collect();
    out.sort();
    out
}

/// A live silver row: (amount in cents, currency, status, note, created_at ms).
pub(super) type Row = (i128, String, String, String, i64);

/// Silver as the events say, folded in the log's order — the initial snapshot's reads
/// first, then commit time, then LSN: the newest event per key wins, a delete leaves a
/// tombstone (`None`), and the marker keeps the note the row had since its last delete.
pub(super) fn silver_oracle(events: &[Event]) -> BTreeMap<i64, Option<Row>> {
    let mut ordered: Vec<&Event> = events.iter().collect();
    ordered.sort_by_key(|e| (if e.op == "r" { 0 } else { e.ts_ms }, e.lsn));
    let mut out: BTreeMap<i64, Option<Row>> = BTreeMap::new();
    for e in ordered {
        let Some(s) = &e.row else {
            out.insert(e.id, None);
            continue;
        };
        let note = match (&s.note, out.get(&e.id)) {
            (Some(n), _) => n.clone(),
            (None, Some(Some(held))) => held.3.clone(),
            (None, _) => MARKER.to_string(),
        };
        let row = (
            s.cents,
            s.currency.to_string(),
            s.status.to_string(),
            note,
            s.created_ms,
        );
        out.insert(e.id, Some(row));
    }
    out
}

/// A day's totals for a currency: (payments, amount in cents, refunds).
pub(super) type Totals = (i64, i128, i64);

/// Gold as silver's live rows say: per local day of `created_at` and currency.
pub(super) fn gold_oracle(
    silver: &BTreeMap<i64, Option<Row>>,
) -> BTreeMap<(NaiveDate, String), Totals> {
    let mut out: BTreeMap<(NaiveDate, String), Totals> = BTreeMap::new();
    for (cents, currency, status, _, created) in silver.values().flatten() {
        let t = out
            .entry((local_day(*created), currency.clone()))
            .or_default();
        t.0 += 1;
        t.1 += cents;
        t.2 += i64::from(status == "refunded");
    }
    out
}
