//! `tidemark status <AGGREGATE>`: the aggregate's day status table, newest day first.

use super::*;
use crate::cli::StatusArgs;
use crate::config::pipeline::Aggregate;
use crate::config::Pipeline;

/// Windows `tidemark status` lists without `--windows`.
const DEFAULT_WINDOWS: usize = 24;

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
    if let (Some(_), None) = (args.windows, spec.window) {
        return Err(AppError::Usage(format!(
            "--windows lists the windows of an aggregate with `window:`; `{}` has rows per day (leave --windows out)",
            p.name
        )));
    }
    let days = crate::aggregate::day_status(spec).await?;
    let clock = clock(spec, &p.app_id()).await;
    // (with `window:`: the windows of the open days, and of the newest one)
    let shown: Vec<chrono::NaiveDate> = days
        .values()
        .filter(|d| !d.is_final())
        .map(|d| d.event_date)
        .chain(days.keys().next_back().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let windows = crate::aggregate::window_status::windows(spec, &shown).await?;
    Ok(match args.output {
        OutputFormat::Text => {
            let mut out = render(&p.name, spec, &days, args.days, args.wide);
            if let Some(c) = &clock {
                out.push_str(&super::fit::wrap(&c.line));
            }
            out.push_str(&render_windows(
                spec,
                &windows,
                args.windows.unwrap_or(DEFAULT_WINDOWS),
            ));
            out
        }
        OutputFormat::Json => {
            let mut v = serde_json::json!({
                "aggregate": p.name,
                "status_uri": spec.status_uri,
                "time_zone": spec.time_zone.name(),
                "lookback_days": spec.lookback_days,
                "days": days.values().rev().collect::<Vec<_>>(),
            });
            if let Some(w) = spec.window {
                v["window"] = w.label().into();
                v["windows"] = serde_json::json!(windows.iter().rev().collect::<Vec<_>>());
            }
            if let Some(c) = clock {
                v["watermark"] = c.json;
            }
            serde_json::to_string(&v).unwrap_or_default() + "\n"
        }
    })
}

/// The demo's view of a windowed gold after the hour: the clock and the newest windows.
pub async fn windows_story(p: &Pipeline, spec: &Aggregate) -> Result<String, AppError> {
    let days = crate::aggregate::day_status(spec).await?;
    let mut newest: Vec<chrono::NaiveDate> = days.keys().rev().take(2).copied().collect();
    newest.reverse();
    let windows = crate::aggregate::window_status::windows(spec, &newest).await?;
    let mut out = format!(
        "\n{}: gold by the hour, final by the data's own clock\n",
        p.name
    );
    if let Some(c) = clock(spec, &p.app_id()).await {
        out.push_str(&super::fit::wrap(&c.line));
    }
    out.push_str(&render_windows(spec, &windows, 6));
    out.push_str(&super::fit::wrap(&format!(
        "an hour is final once the watermark is {} past its end; a payment landing for a final hour is booked in {} (`tidemark status {}` with the lake's --var shows every window)\n",
        humantime::format_duration(std::time::Duration::from_micros(
            spec.watermark.map_or(0, |w| w.allowed_lateness).max(0) as u64
        )),
        spec.adjustments_uri,
        p.name
    )));
    Ok(out)
}

/// Where the data's clock stood at the last run (`watermark:`), as a line and as JSON.
struct ClockView {
    line: String,
    json: serde_json::Value,
}

async fn clock(spec: &Aggregate, app: &str) -> Option<ClockView> {
    let w = spec.watermark?;
    let seen = crate::aggregate::window_status::event_time_seen(spec, app).await;
    let instants = crate::aggregate::watermark::event_instants(spec).await;
    let at = |v: Option<i64>| {
        v.and_then(|v| crate::aggregate::watermark::text(v, instants))
            .unwrap_or_else(|| "-".to_string())
    };
    let watermark = seen.map(|s| s - w.delay);
    let final_before = watermark.map(|m| m - w.allowed_lateness);
    let delay = humantime::format_duration(std::time::Duration::from_micros(w.delay.max(0) as u64));
    let lateness = humantime::format_duration(std::time::Duration::from_micros(
        w.allowed_lateness.max(0) as u64,
    ));
    Some(ClockView {
        line: format!(
            "watermark {} (newest event {} − delay {delay}); final: windows ending by {} (allowed lateness {lateness})\n",
            at(watermark),
            at(seen),
            at(final_before)
        ),
        json: serde_json::json!({
            "event_time_seen": seen.map(|v| at(Some(v))),
            "watermark": watermark.map(|v| at(Some(v))),
            "final_before": final_before.map(|v| at(Some(v))),
            "delay": delay.to_string(),
            "allowed_lateness": lateness.to_string(),
        }),
    })
}

/// The newest `limit` windows (of the open days and the newest day), local times.
fn render_windows(
    spec: &crate::config::pipeline::Aggregate,
    windows: &[crate::aggregate::window_status::WindowStatus],
    limit: usize,
) -> String {
    let Some(w) = spec.window else {
        return String::new();
    };
    if windows.is_empty() {
        return String::new();
    }
    // (an instant in the pipeline's zone, with its offset; a wall-clock time as it reads)
    let local = |v: crate::aggregate::window_status::At| {
        chrono::DateTime::from_timestamp_micros(v.micros).map_or("-".to_string(), |t| {
            match v.wall_clock {
                true => t.naive_utc().format("%Y-%m-%d %H:%M").to_string(),
                false => t
                    .with_timezone(&spec.time_zone)
                    .format("%Y-%m-%d %H:%M %:z")
                    .to_string(),
            }
        })
    };
    let mut t = super::fit::table(false);
    t.set_header(vec![
        "window start",
        "window end",
        "status",
        "groups",
        "data as of (UTC)",
    ]);
    for x in windows.iter().rev().take(limit) {
        t.add_row(vec![
            local(x.window_start),
            local(x.window_end),
            (if x.is_final { "final" } else { "open" }).to_string(),
            x.groups.to_string(),
            x.data_as_of
                .and_then(chrono::DateTime::from_timestamp_micros)
                .map_or("-".to_string(), |t| t.format("%Y-%m-%d %H:%M").to_string()),
        ]);
    }
    let mut out = format!(
        "{} windows ({}, newest first):\n{t}\n",
        w.label(),
        spec.time_zone.name()
    );
    let hidden = windows.len().saturating_sub(limit);
    if hidden > 0 {
        out.push_str(&format!(
            "({hidden} older window(s) not shown: --windows N, or --output json for all)\n"
        ));
    }
    out
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
    let rule = match spec.watermark {
        Some(_) => "final by the watermark".to_string(),
        None => format!("lookback {}d", spec.lookback_days),
    };
    let mut out = format!(
        "{name}: day status ({} days; {rule}; open days may still change) — {}\n",
        spec.time_zone.name(),
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
