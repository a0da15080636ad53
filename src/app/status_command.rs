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
        OutputFormat::Text => render(&p.name, spec, &days, args.days),
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

/// The status table as text, the newest `limit` days first.
pub fn render(
    name: &str,
    spec: &crate::config::pipeline::Aggregate,
    days: &std::collections::BTreeMap<chrono::NaiveDate, crate::aggregate::status::DayStatus>,
    limit: usize,
) -> String {
    let mut out = format!(
        "{name}: day status ({} days; lookback {}d) — {}\n",
        spec.time_zone.name(),
        spec.lookback_days,
        spec.status_uri
    );
    if days.is_empty() {
        out.push_str("no day published yet: run the pipeline first\n");
        return out;
    }
    let micros = |v: Option<i64>| {
        v.and_then(chrono::DateTime::from_timestamp_micros)
            .map_or("-".to_string(), |t| {
                t.to_rfc3339_opts(SecondsFormat::Secs, true)
            })
    };
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "event_date",
        "status",
        "rows",
        "groups",
        "last_arrival",
        "last_recomputed",
        "final_since",
        "late rows after close",
        "restated / adjusted after close",
    ]);
    for s in days.values().rev().take(limit) {
        t.add_row(vec![
            s.event_date.to_string(),
            if s.is_final() {
                "final".to_string()
            } else {
                "open (may change)".to_string()
            },
            s.rows.to_string(),
            s.groups.to_string(),
            micros(s.last_arrival),
            micros(s.last_recomputed),
            s.final_since.map_or("-".into(), |d| d.to_string()),
            s.late_rows_after_close.to_string(),
            format!("{} / {}", s.restated_after_close, s.adjusted_after_close),
        ]);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    let hidden = days.len().saturating_sub(limit);
    if hidden > 0 {
        out.push_str(&format!(
            "({hidden} older day(s) not shown: --days N, or --output json for all)\n"
        ));
    }
    out
}
