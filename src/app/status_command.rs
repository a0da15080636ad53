//! `tidemark status <AGGREGATE>`: the aggregate's day status table, newest day first.

use super::*;
use crate::cli::StatusArgs;

/// `tidemark status`.
pub async fn status(args: StatusArgs) -> Result<String, AppError> {
    let p = load_pipeline(&args.pipeline, &args.from)?;
    let Spec::Aggregate(spec) = &p.spec else {
        return Err(p
            .wrong_kind(format!(
                "`tidemark status` shows an aggregate pipeline's day status; `{}` is {}",
                p.name,
                p.kind()
            ))
            .into());
    };
    let days = crate::aggregate::day_status(spec).await?;
    Ok(match args.output {
        OutputFormat::Text => render(&p.name, spec, &days, args.days, args.wide),
        OutputFormat::Json => {
            let v = serde_json::json!({
                "aggregate": p.name,
                "status_uri": spec.status_uri,
                "time_zone": spec.time_zone.name(),
                "lookback_days": spec.lookback_days,
                "days": days.values().rev().collect::<Vec<_>>(),
            });
            serde_json::to_string(&v).unwrap_or_default() + "\n"
        }
    })
}

/// The status table as text, the newest `limit` days first; `wide` adds the groups and when
/// each day was last recomputed, and lifts the width bound.
pub fn render(
    name: &str,
    spec: &crate::config::pipeline::Aggregate,
    days: &std::collections::BTreeMap<chrono::NaiveDate, crate::aggregate::status::DayStatus>,
    limit: usize,
    wide: bool,
) -> String {
    let mut out = format!(
        "{name}: day status ({} days; lookback {}d; open days may still change) — {}\n",
        spec.time_zone.name(),
        spec.lookback_days,
        spec.status_uri
    );
    if days.is_empty() {
        out.push_str("no day published yet: run the pipeline first\n");
        return out;
    }
    let mut t = super::fit::table(wide);
    t.set_header(header(wide));
    for s in days.values().rev().take(limit) {
        t.add_row(row(s, wide));
    }
    out.push_str(&t.to_string());
    out.push('\n');
    let hidden = days.len().saturating_sub(limit);
    if hidden > 0 {
        out.push_str(&format!(
            "({hidden} older day(s) not shown: --days N, or --output json for all)\n"
        ));
    }
    match wide {
        true => out,
        false => super::fit::wrap(&out),
    }
}

/// The columns: the arrival and recompute times are UTC, to the minute (`--wide`: the second).
fn header(wide: bool) -> Vec<&'static str> {
    let mut h = vec!["event_date", "status", "rows"];
    if wide {
        h.extend(["groups", "last arrival (UTC)", "last recomputed (UTC)"]);
    } else {
        h.push("last arrival\n(UTC)");
    }
    h.extend([
        "final since",
        "late rows\nafter close",
        "restated /\nadjusted",
    ]);
    h
}

fn row(s: &crate::aggregate::status::DayStatus, wide: bool) -> Vec<String> {
    let time =
        |v: Option<i64>| {
            v.and_then(chrono::DateTime::from_timestamp_micros)
                .map_or("-".to_string(), |t| match wide {
                    true => t.to_rfc3339_opts(SecondsFormat::Secs, true),
                    false => t.format("%Y-%m-%d %H:%M").to_string(),
                })
        };
    let status = if s.is_final() { "final" } else { "open" };
    let mut r = vec![
        s.event_date.to_string(),
        status.to_string(),
        s.rows.to_string(),
    ];
    if wide {
        r.extend([
            s.groups.to_string(),
            time(s.last_arrival),
            time(s.last_recomputed),
        ]);
    } else {
        r.push(time(s.last_arrival));
    }
    r.extend([
        s.final_since.map_or("-".into(), |d| d.to_string()),
        s.late_rows_after_close.to_string(),
        format!("{} / {}", s.restated_after_close, s.adjusted_after_close),
    ]);
    r
}
