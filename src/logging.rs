//! Logs on stderr: warnings by default (`-v` or `--log-level info` for progress; the scheduler
//! also says what it schedules and fires), colour only
//! on a terminal without `NO_COLOR`, and plain values in fields — an `Option` logged with `?`
//! shows as its value or `null`, never as Rust's `Some(..)` / `None`.

use std::fmt;
use std::io::IsTerminal;

use chrono::{SecondsFormat, Utc};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, LogLevel};

/// Installs the global subscriber. `RUST_LOG`, when set and valid, wins over `level`. A
/// `service` (the scheduler at the default level) also logs its own progress: what it
/// scheduled, fired and finished.
pub fn init(format: LogFormat, level: LogLevel, service: bool) {
    // delta-rs' kernel logs every failed log read at ERROR with the store's whole request (URL,
    // retry counts, timeouts) before returning the error that tidemark reports itself in one
    // line with what to do: its events are off unless RUST_LOG names the kernel
    // (`RUST_LOG=debug,buoyant_kernel=debug`).
    let filter = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|s| EnvFilter::try_new(s).is_ok())
        .map(|s| {
            if s.contains("buoyant_kernel") {
                s
            } else {
                format!("{s},buoyant_kernel=off")
            }
        })
        .unwrap_or_else(|| match service {
            true => format!(
                "{},tidemark::jobs::scheduler=info,tidemark::app::jobs_commands=info",
                directives(level)
            ),
            false => directives(level),
        });
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().event_format(JsonEvents).init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(use_colour())
            .fmt_fields(format::debug_fn(text_field).delimited(" "))
            .init(),
    }
}

/// tidemark's own events at `level`; other crates at most warnings (RUST_LOG reaches them);
/// delta-rs' MERGE logs its plan at warn, and its replace-where write (an ingest's full reload)
/// how far it could prune, and its commit logs a lost commit race at ERROR (tidemark plans again
/// and says so): noise for tidemark's users.
fn directives(level: LogLevel) -> String {
    let l = level.as_str();
    let others = match level {
        LogLevel::Off | LogLevel::Error => l,
        _ => "warn",
    };
    // delta-kernel logs ERROR "No files in log segment" when it looks for a table that is not
    // there, and whole HTTP requests when a store fails; tidemark reports both itself.
    format!("tidemark={l},deltalake_core::operations::merge=error,deltalake_core::operations::write=error,deltalake_core::kernel::transaction=off,buoyant_kernel=off,{others}")
}

/// Colour only when stderr is a terminal and `NO_COLOR` is unset or empty (no-color.org).
fn use_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `Some(x)` → `x`, `None` → `null`, anything else unchanged.
fn plain(debug: &str) -> &str {
    let mut s = debug;
    while let Some(inner) = s.strip_prefix("Some(").and_then(|r| r.strip_suffix(')')) {
        s = inner;
    }
    if s == "None" {
        "null"
    } else {
        s
    }
}

fn text_field(w: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    let text = format!("{value:?}");
    if field.name() == "message" {
        write!(w, "{text}")
    } else {
        write!(w, "{}={}", field.name(), plain(&text))
    }
}

/// One JSON object per event: `timestamp` (RFC 3339, µs, `Z`), `level`, `target`, `fields`,
/// and `spans` (outermost first, with their fields) — the shape of tracing's own JSON format,
/// with plain values.
struct JsonEvents;

impl<S, N> FormatEvent<S, N> for JsonEvents
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Map::new();
        event.record(&mut JsonVisitor(&mut fields));
        let mut obj = Map::new();
        obj.insert(
            "timestamp".into(),
            Utc::now()
                .to_rfc3339_opts(SecondsFormat::Micros, true)
                .into(),
        );
        obj.insert("level".into(), meta.level().as_str().into());
        obj.insert("target".into(), meta.target().into());
        obj.insert("fields".into(), Value::Object(fields));
        if let Some(scope) = ctx.event_scope() {
            let mut spans = Vec::new();
            for span in scope.from_root() {
                let mut s = Map::new();
                s.insert("name".into(), span.name().into());
                if let Some(f) = span.extensions().get::<FormattedFields<N>>() {
                    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(f.as_str()) {
                        s.extend(m);
                    }
                }
                spans.push(Value::Object(s));
            }
            if !spans.is_empty() {
                obj.insert("spans".into(), Value::Array(spans));
            }
        }
        writeln!(writer, "{}", Value::Object(obj))
    }
}

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let value = if field.name() == "message" {
            Value::String(text)
        } else {
            match plain(&text) {
                "null" => Value::Null,
                p => match serde_json::from_str::<Value>(p) {
                    // a quoted string, a number, a boolean
                    Ok(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => v,
                    _ => Value::String(p.to_string()),
                },
            }
        };
        self.0.insert(field.name().to_string(), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn options_print_as_their_value() {
        assert_eq!(plain("Some(2024-01-06T00:00:00Z)"), "2024-01-06T00:00:00Z");
        assert_eq!(plain("Some(Some(3))"), "3");
        assert_eq!(plain("None"), "null");
        assert_eq!(plain("\"plan\""), "\"plan\"");
    }
}
