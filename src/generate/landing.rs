//! The same world delivered as landing files, the way producers deliver them: each row lands in
//! the file of the hour it arrives (its `_ingested_at` in the generated world), by channel:
//!
//! * `events/<YYYY-MM-DDTHH>.jsonl` — the event stream, JSON lines: most rows within seconds,
//!   plus the mobile clients' offline queue and queue backlogs, hours late;
//! * `partner/<YYYY-MM-DDTHH>.csv` — the partner's settlement file, CSV: the rows that arrive a
//!   day or more after they happened.
//!
//! The records carry the event's own columns only; the arrival time is the ingest's to add.
//! The world and the frontier live in `_generator.json` in the landing folder (ingest skips
//! names starting with `_`), so `--next-hour` continues where the last call stopped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::world::{gen_window, Row, World};
use super::{advance, invalid, to_utc, GenerateError, GenerateOptions, CURRENCIES, DAY, HOUR};

/// The state file in the landing folder.
const STATE_FILE: &str = "_generator.json";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct State {
    #[serde(flatten)]
    world: World,
    frontier_us: i64,
    /// The files' shape (folders generated before it existed hold `files`).
    #[serde(default)]
    feed: Feed,
}

/// The shape of generated landing files.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Feed {
    /// The event stream as JSON lines, the partner's day-late file as CSV.
    #[default]
    Files,
    /// Every change as a Debezium event (PostgreSQL connector, no schema envelope).
    Debezium,
}

/// What a landing generation wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LandingReport {
    pub landing: String,
    /// Files written by this call.
    pub files: u64,
    /// Records written (one per row).
    pub rows: u64,
    /// Of those, records in partner (CSV) files: a day or more late.
    pub partner_rows: u64,
    pub window_start: Option<DateTime<Utc>>,
    /// End (exclusive) of the arrivals now in the landing folder.
    pub frontier: DateTime<Utc>,
}

fn io(path: &Path, e: std::io::Error) -> GenerateError {
    invalid(format!("cannot write {}: {e}", path.display()))
}

/// Whether `dir` holds generated landing files (their state file).
pub fn landing_has_state(dir: &Path) -> bool {
    dir.join(STATE_FILE).exists()
}

/// Writes the whole initial range of the world as landing files into a new (or empty) folder.
pub fn landing_full(
    dir: &Path,
    feed: Feed,
    opts: &GenerateOptions,
) -> Result<LandingReport, GenerateError> {
    if dir.join(STATE_FILE).exists() {
        return Err(invalid(format!(
            "{} already holds generated landing files; use --next-hour to add the next hour",
            dir.display()
        )));
    }
    let (world, hi) = super::initial_world(opts)?;
    write_window(dir, world, feed, None, hi)
}

/// Continues a landing folder from another world's frontier (the demo: its history went
/// straight into bronze, the hours after it arrive as files).
pub async fn landing_from(
    dir: &Path,
    bronze: &str,
    hours: u32,
) -> Result<LandingReport, GenerateError> {
    if !dir.join(STATE_FILE).exists() {
        let table = super::open_existing(bronze).await?;
        let meta = super::find_meta(&table, bronze).await?;
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        save(
            dir,
            &State {
                world: meta.world,
                frontier_us: meta.frontier_us,
                feed: Feed::Files,
            },
        )?;
    }
    landing_next(dir, hours)
}

/// Writes the `hours` of arrivals after the folder's frontier and advances it.
pub fn landing_next(dir: &Path, hours: u32) -> Result<LandingReport, GenerateError> {
    if hours == 0 {
        return Err(invalid("hours must be at least 1"));
    }
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|_| {
        invalid(format!(
            "{} holds no generated landing files ({STATE_FILE} is missing); generate them first with `tidemark generate --landing {}`",
            dir.display(),
            dir.display()
        ))
    })?;
    let state: State = serde_json::from_str(&text).map_err(|e| {
        invalid(format!(
            "{} is unusable ({e}); regenerate the folder",
            path.display()
        ))
    })?;
    state.world.check().map_err(invalid)?;
    let hi = advance(state.frontier_us, hours.into(), HOUR)?;
    write_window(dir, state.world, state.feed, Some(state.frontier_us), hi)
}

fn save(dir: &Path, state: &State) -> Result<(), GenerateError> {
    let path = dir.join(STATE_FILE);
    let text = serde_json::to_string_pretty(state).map_err(|e| invalid(e.to_string()))?;
    // Written whole then renamed: an interrupted call leaves the previous state.
    let tmp = dir.join(format!(".{STATE_FILE}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

fn hour_name(us: i64) -> String {
    to_utc(us.div_euclid(HOUR) * HOUR)
        .map(|t| t.format("%Y-%m-%dT%H").to_string())
        .unwrap_or_default()
}

fn ts(us: i64) -> String {
    to_utc(us)
        .map(|t| crate::report::rfc3339(&t))
        .unwrap_or_default()
}

fn write_window(
    dir: &Path,
    world: World,
    feed: Feed,
    lo: Option<i64>,
    hi: i64,
) -> Result<LandingReport, GenerateError> {
    let rows = gen_window(&world, lo, hi);
    let mut files: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut partner_rows = 0;
    for r in rows.iter().filter(|_| feed == Feed::Debezium) {
        let hour = hour_name(r.ingested);
        let text = files
            .entry(dir.join("cdc").join(format!("{hour}.json")))
            .or_default();
        super::debezium::event_line(text, r);
    }
    for r in rows.iter().filter(|_| feed == Feed::Files) {
        let partner = r.ingested - r.updated >= DAY;
        let hour = hour_name(r.ingested);
        let path = if partner {
            partner_rows += 1;
            dir.join("partner").join(format!("{hour}.csv"))
        } else {
            dir.join("events").join(format!("{hour}.jsonl"))
        };
        let text = files.entry(path).or_insert_with(|| {
            if partner {
                "payment_id,customer_id,merchant_id,amount_cents,currency,status,created_at,updated_at,op\n".to_string()
            } else {
                String::new()
            }
        });
        if partner {
            csv_line(text, r);
        } else {
            json_line(text, r);
        }
    }
    for (path, text) in &files {
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        // Written under a hidden name, then renamed: ingest never sees half a file.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let tmp = parent.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
    }
    save(
        dir,
        &State {
            world,
            frontier_us: hi,
            feed,
        },
    )?;
    Ok(LandingReport {
        landing: dir.display().to_string(),
        files: files.len() as u64,
        rows: rows.len() as u64,
        partner_rows,
        window_start: lo.and_then(|l| to_utc(l).ok()),
        frontier: to_utc(hi)?,
    })
}

pub(super) fn fields(r: &Row) -> [String; 9] {
    [
        format!("pay_{:012}", r.payment.pnum),
        format!("cus_{:09}", r.payment.customer),
        format!("mch_{:06}", r.payment.merchant),
        r.payment.amount.to_string(),
        CURRENCIES[usize::from(r.payment.currency)].to_string(),
        r.status.name().to_string(),
        ts(r.payment.created),
        ts(r.updated),
        r.op.name().to_string(),
    ]
}

const NAMES: [&str; 9] = [
    "payment_id",
    "customer_id",
    "merchant_id",
    "amount_cents",
    "currency",
    "status",
    "created_at",
    "updated_at",
    "op",
];

fn json_line(out: &mut String, r: &Row) {
    let f = fields(r);
    out.push('{');
    for (i, (name, value)) in NAMES.iter().zip(f.iter()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        if *name == "amount_cents" {
            let _ = write!(out, "\"{name}\":{value}");
        } else {
            let _ = write!(out, "\"{name}\":\"{value}\"");
        }
    }
    out.push_str("}\n");
}

fn csv_line(out: &mut String, r: &Row) {
    out.push_str(&fields(r).join(","));
    out.push('\n');
}
