//! The `ingest` kind's file: landing files (a local folder or an object-store prefix, with a
//! glob) appended to a bronze table with their arrival time. The raw struct, the validated
//! [`Ingest`], and the checks between them.

use serde::Deserialize;

use super::common::{Ctx, RawQuarantine};
use super::kafka::{KafkaSource, RawKafka};
use super::{Quarantine, SchemaChange};
use crate::config::size::parse_size;
use crate::config::{ConfigError, Vars};

/// Column tidemark adds to every ingested row: when the run that committed it ran (one value
/// per run, the commit's time). Lateness is measured from it.
pub const INGESTED_AT: &str = "_ingested_at";
/// Column tidemark adds to every ingested row: the landing file it came from (its full URI).
pub const SOURCE_FILE: &str = "_source_file";
/// Column holding, as JSON text, the fields of a record that did not fit the schema (unknown
/// fields, values of the wrong type) when `rescue: true`.
pub const RESCUED: &str = "_rescued_data";

/// Default longest record (a JSON line, a CSV row) accepted; a longer one is quarantined
/// (truncated in the quarantine table) instead of being parsed.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 16 << 20;

/// The format of the landing files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// One JSON object per line (`.jsonl`, `.ndjson`).
    Json,
    /// Comma- (or `csv.delimiter`-) separated values.
    Csv,
    /// Parquet files.
    Parquet,
    /// Debezium change events, one JSON event per line (with or without the schema envelope):
    /// the row is `after` (`before` for a delete), with the change's metadata columns.
    Debezium,
}

/// What a run does with a landing file recorded as ingested whose size or modification time
/// (ETag on object stores) changed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileChange {
    /// Stop (exit 65) naming the file: its rows are in bronze as they were, and a changed file
    /// usually means a producer rewrote what it had delivered.
    #[default]
    Fail,
    /// Ingest the file again as it is now (its earlier rows stay in bronze: bronze is a log,
    /// and the merge keeps the newest version per key).
    Reingest,
}

/// A column type in `schema:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    String,
    Long,
    Int,
    Double,
    Boolean,
    /// Microseconds, UTC. Text is RFC 3339 (`2024-01-05T10:00:00Z`, any offset) or
    /// `YYYY-MM-DD HH:MM:SS[.fff]` read as UTC; a JSON number is epoch microseconds.
    Timestamp,
    Date,
    /// Exact: `precision` digits in all (1 to 38), `scale` of them after the point (0 to
    /// `precision`). Arrow `Decimal128(precision, scale)`.
    Decimal {
        precision: u8,
        scale: i8,
    },
}

/// The largest precision of `decimal(p, s)`: what Arrow's `Decimal128` (and Delta) hold.
pub const MAX_DECIMAL_PRECISION: u8 = 38;

impl ColumnType {
    /// The type named in a pipeline file (`string`, `long`/`bigint`, `decimal(12, 2)`, ...):
    /// `Ok(None)` when it names no type, `Err` when a `decimal(p, s)` breaks its rule.
    pub fn parse(name: &str) -> Result<Option<ColumnType>, String> {
        match decimal_spec(name) {
            Some(spec) => spec.map(Some),
            None => Ok(ColumnType::from_name(name)),
        }
    }

    /// A type named without parameters (`string`, `long`/`bigint`, ...).
    pub fn from_name(name: &str) -> Option<ColumnType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "string" | "str" | "text" => ColumnType::String,
            "long" | "bigint" | "int64" => ColumnType::Long,
            "int" | "integer" | "int32" => ColumnType::Int,
            "double" | "float" | "float64" => ColumnType::Double,
            "boolean" | "bool" => ColumnType::Boolean,
            "timestamp" => ColumnType::Timestamp,
            "date" => ColumnType::Date,
            _ => return None,
        })
    }

    pub const NAMES: &'static str =
        "string, long, int, double, boolean, timestamp, date, decimal(p, s)";
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            ColumnType::String => "string",
            ColumnType::Long => "long",
            ColumnType::Int => "int",
            ColumnType::Double => "double",
            ColumnType::Boolean => "boolean",
            ColumnType::Timestamp => "timestamp",
            ColumnType::Date => "date",
            ColumnType::Decimal { precision, scale } => {
                return write!(f, "decimal({precision}, {scale})")
            }
        };
        f.write_str(name)
    }
}

/// `decimal(p, s)` / `numeric(p,s)` (any spacing): `None` when `name` is not one, `Err` with the
/// rule it breaks when it is one that Arrow cannot hold.
fn decimal_spec(name: &str) -> Option<Result<ColumnType, String>> {
    let lower = name.trim().to_ascii_lowercase();
    let rest = ["decimal", "numeric"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))?
        .trim_start();
    const RULE: &str = "write it as decimal(p, s): p digits in all (1 to 38), s of them after the point (0 to p), like decimal(12, 2)";
    let Some(args) = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')) else {
        return Some(Err(RULE.to_string()));
    };
    let parts: Vec<&str> = args.split(',').map(str::trim).collect();
    let (Some(p), Some(s), 2) = (parts.first(), parts.get(1), parts.len()) else {
        return Some(Err(RULE.to_string()));
    };
    let (Ok(precision), Ok(scale)) = (p.parse::<u8>(), s.parse::<i8>()) else {
        return Some(Err(RULE.to_string()));
    };
    if precision == 0 || precision > MAX_DECIMAL_PRECISION {
        return Some(Err(format!(
            "the precision {precision} is out of range; {RULE}"
        )));
    }
    if scale < 0 || scale as u8 > precision {
        return Some(Err(format!(
            "the scale {scale} is out of range (negative, or more than the precision {precision}); {RULE}"
        )));
    }
    Some(Ok(ColumnType::Decimal { precision, scale }))
}

/// One declared column: `name: type` or `name: type not null` (a record without it is
/// quarantined).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredColumn {
    pub name: String,
    pub ty: ColumnType,
    pub required: bool,
}

/// How CSV files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvOptions {
    /// The first row names the columns (default true). Without a header the columns are the
    /// declared schema's, in order.
    pub header: bool,
    pub delimiter: u8,
    pub quote: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            header: true,
            delimiter: b',',
            quote: b'"',
        }
    }
}

/// A validated `ingest` pipeline.
#[derive(Debug, Clone)]
pub struct Ingest {
    /// Folder or prefix holding the landing files (`/data/landing`, `s3://bucket/landing`).
    pub landing_uri: String,
    /// Which files under it are this pipeline's, relative to it (`events/*.jsonl`, `**/*.csv`).
    pub glob: String,
    pub format: Format,
    pub csv: CsvOptions,
    pub target_uri: String,
    /// The ingest record's index (`target.record`, default `<target>_ingest_record`): which
    /// files bronze holds, looked up by the files a run lists.
    pub record_uri: String,
    /// Declared columns, in order; empty when inferred from the first files.
    pub schema: Vec<DeclaredColumn>,
    pub rescue: bool,
    pub on_schema_change: SchemaChange,
    pub on_file_change: FileChange,
    pub max_files_per_run: Option<u64>,
    pub max_bytes_per_run: Option<u64>,
    pub max_record_bytes: u64,
    pub quarantine: Quarantine,
    /// A Kafka topic read instead of landing files (`kafka:`); `landing_uri` is then its
    /// [`KafkaSource::uri`].
    pub kafka: Option<KafkaSource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIngest {
    pub(super) name: String,
    #[serde(rename = "kind")]
    pub(super) _kind: serde::de::IgnoredAny,
    pub(super) landing: Option<RawLanding>,
    pub(super) kafka: Option<RawKafka>,
    pub(super) format: Format,
    pub(super) csv: Option<RawCsv>,
    pub(super) target: RawIngestTarget,
    pub(super) schema: Option<serde_yaml::Mapping>,
    #[serde(default)]
    pub(super) rescue: bool,
    #[serde(default)]
    pub(super) on_schema_change: SchemaChange,
    #[serde(default)]
    pub(super) on_file_change: FileChange,
    pub(super) max_files_per_run: Option<u64>,
    pub(super) max_bytes_per_run: Option<String>,
    pub(super) max_record_bytes: Option<String>,
    pub(super) quarantine: RawQuarantine,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLanding {
    pub(super) uri: String,
    #[serde(default = "all_files")]
    pub(super) glob: String,
}

pub(super) fn all_files() -> String {
    "**/*".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCsv {
    pub(super) header: Option<bool>,
    pub(super) delimiter: Option<String>,
    pub(super) quote: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIngestTarget {
    pub(super) uri: String,
    pub(super) record: Option<String>,
}

impl Ctx<'_> {
    /// The `csv:` block, only for `format: csv`.
    fn csv_options(&self, format: Format, raw: Option<RawCsv>) -> Result<CsvOptions, ConfigError> {
        Ok(match (format, raw) {
            (Format::Csv, Some(c)) => CsvOptions {
                header: c.header.unwrap_or(true),
                delimiter: self.one_byte("delimiter", c.delimiter, b',')?,
                quote: self.one_byte("quote", c.quote, b'"')?,
            },
            (Format::Csv, None) => CsvOptions::default(),
            (_, Some(_)) => {
                return Err(self.invalid(
                    "csv",
                    format!(
                        "`csv:` options apply to `format: csv`; this pipeline reads `{}` files",
                        format_name(format)
                    ),
                ))
            }
            (_, None) => CsvOptions::default(),
        })
    }

    /// A size limit (more than zero bytes), when given.
    fn ingest_size(&self, key: &str, v: &Option<String>) -> Result<Option<u64>, ConfigError> {
        match v {
            None => Ok(None),
            Some(v) => match parse_size(v) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.invalid(
                    key,
                    format!("`{key}: {v}` is not a size; write it like 512MiB or 1GB"),
                )),
            },
        }
    }

    /// Checks an `ingest` file: formats, schema, limits and locations.
    pub(super) fn ingest(&self, mut raw: RawIngest, vars: &Vars) -> Result<Ingest, ConfigError> {
        let (landing, kafka) = self.source(raw.landing.take(), raw.kafka.take(), &raw)?;
        let csv = self.csv_options(raw.format, raw.csv)?;
        let schema = match raw.schema {
            Some(m) => self.declared(m)?,
            None => Vec::new(),
        };
        if raw.format == Format::Csv && !csv.header && schema.is_empty() {
            return Err(self.invalid(
                "header",
                "`csv.header: false` needs a declared `schema:` (the columns, in file order)",
            ));
        }
        if raw.max_files_per_run == Some(0) {
            return Err(self.invalid(
                "max_files_per_run",
                "`max_files_per_run: 0` would ingest nothing; give 1 or more, or leave it out",
            ));
        }
        let max_bytes_per_run = self.ingest_size("max_bytes_per_run", &raw.max_bytes_per_run)?;
        let max_record_bytes = self
            .ingest_size("max_record_bytes", &raw.max_record_bytes)?
            .unwrap_or(DEFAULT_MAX_RECORD_BYTES);
        let landing_uri = match &kafka {
            Some(k) => k.uri(),
            None => self.substitute("landing.uri", &landing.uri, vars)?,
        };
        let target_uri = self.substitute("target.uri", &raw.target.uri, vars)?;
        let quarantine = self.quarantine(raw.quarantine, vars)?;
        let record_uri = match &raw.target.record {
            Some(r) => self.substitute("target.record", r, vars)?,
            None => format!("{}_ingest_record", target_uri.trim_end_matches('/')),
        };
        let mut places = vec![
            ("target.uri", target_uri.as_str()),
            ("quarantine.uri", quarantine.uri.as_str()),
            ("target.record", record_uri.as_str()),
        ];
        if kafka.is_none() {
            places.insert(0, ("landing.uri", landing_uri.as_str()));
        }
        self.separate(&places)?;
        Ok(Ingest {
            landing_uri,
            glob: landing.glob,
            format: raw.format,
            csv,
            target_uri,
            record_uri,
            schema,
            rescue: raw.rescue,
            on_schema_change: raw.on_schema_change,
            on_file_change: raw.on_file_change,
            max_files_per_run: raw.max_files_per_run,
            max_bytes_per_run,
            max_record_bytes,
            quarantine,
            kafka,
        })
    }

    fn one_byte(&self, key: &str, v: Option<String>, default: u8) -> Result<u8, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
            Some(s) if s == "\\t" || s == "\t" => Ok(b'\t'),
            Some(s) => Err(self.invalid(
                key,
                format!("`csv.{key}: {s:?}` must be one ASCII character (or \"\\t\" for a tab)"),
            )),
        }
    }

    /// `schema:` as written: `column: type` or `column: type not null`, in file order.
    fn declared(&self, m: serde_yaml::Mapping) -> Result<Vec<DeclaredColumn>, ConfigError> {
        let mut out: Vec<DeclaredColumn> = Vec::new();
        for (k, v) in m {
            let (Some(name), Some(spec)) = (k.as_str(), v.as_str()) else {
                return Err(self.invalid(
                    "schema",
                    "`schema:` maps column names to types, like `amount_cents: long` or `payment_id: string not null`",
                ));
            };
            let lower = spec.trim().to_ascii_lowercase();
            let (ty_name, required) = match lower.strip_suffix("not null") {
                Some(t) => (t.trim().to_string(), true),
                None => (lower.clone(), false),
            };
            let ty = match ColumnType::parse(&ty_name) {
                Ok(Some(ty)) => ty,
                Ok(None) => {
                    return Err(self.invalid(
                        name,
                        format!(
                            "`{name}: {spec}` is not a column type; the types are {} (add `not null` to require the field)",
                            ColumnType::NAMES
                        ),
                    ))
                }
                Err(rule) => {
                    // `{ amount: decimal(12, 2) }`: in a flow mapping the comma ends the entry
                    let cut = spec.contains('(') && !spec.contains(')');
                    let hint = match cut {
                        true => format!(" (inside `{{ … }}` a comma separates entries: write `{name}: \"decimal(12, 2)\"` in quotes, or the schema one column per line)"),
                        false => String::new(),
                    };
                    return Err(self.invalid(
                        name,
                        format!("`{name}: {spec}` is not a usable decimal: {rule}{hint}"),
                    ));
                }
            };
            if name.is_empty() || name.starts_with("_tidemark") {
                return Err(self.invalid("schema", format!("`{name}` is not a usable column name")));
            }
            if [INGESTED_AT, SOURCE_FILE, RESCUED].contains(&name)
                || name.starts_with(super::kafka::COLUMN_PREFIX)
            {
                return Err(self.invalid(
                    name,
                    format!("`{name}` is a column tidemark adds to every ingested row; leave it out of `schema:`"),
                ));
            }
            out.push(DeclaredColumn {
                name: name.to_string(),
                ty,
                required,
            });
        }
        Ok(out)
    }
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Json => "json",
        Format::Csv => "csv",
        Format::Parquet => "parquet",
        Format::Debezium => "debezium",
    }
}

/// An ingest writes the table with both clocks: its arrival is `_ingested_at`, its event time a
/// column of the records (the default [`super::Settings::clocks`]).
impl super::Settings for Ingest {
    fn target_uri(&self) -> &str {
        &self.target_uri
    }
    fn source_uri(&self) -> &str {
        &self.landing_uri
    }
    /// A Debezium feed's event time is the source database's commit time (`_source_ts`).
    fn clocks(&self) -> super::Clocks<'_> {
        super::Clocks {
            table: &self.target_uri,
            role: "target",
            event_time: (self.format == Format::Debezium).then_some("_source_ts"),
            arrival: None,
            overlap: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::pipeline::{Kind, Pipeline, Spec};

    const GOOD: &str = r#"
name: events
kind: ingest
landing: { uri: "${var.lake}/landing", glob: "events/*.jsonl" }
format: json
target: { uri: "${var.lake}/bronze" }
schema:
  id: string not null
  amount: long
  at: Timestamp
quarantine: { uri: "${var.lake}/quarantine" }
"#;

    fn parse(text: &str) -> Result<Pipeline, ConfigError> {
        let vars = Vars::from_args(&["lake=/tmp/lake"]).expect("vars");
        Pipeline::parse(Path::new("p.yml"), text, &vars)
    }

    fn ingest(p: &Pipeline) -> &Ingest {
        match &p.spec {
            Spec::Ingest(i) => i,
            _ => panic!("not an ingest"),
        }
    }

    #[test]
    fn parses_an_ingest_with_defaults_and_the_schema_in_order() {
        let p = parse(GOOD).expect("parses");
        assert_eq!(p.kind(), Kind::Ingest);
        assert_eq!(p.target_uri(), "/tmp/lake/bronze");
        assert_eq!(p.source_uri(), "/tmp/lake/landing");
        let i = ingest(&p);
        let names: Vec<(&str, ColumnType, bool)> = i
            .schema
            .iter()
            .map(|c| (c.name.as_str(), c.ty, c.required))
            .collect();
        assert_eq!(
            names,
            vec![
                ("id", ColumnType::String, true),
                ("amount", ColumnType::Long, false),
                ("at", ColumnType::Timestamp, false)
            ]
        );
        assert_eq!((i.on_file_change, i.rescue), (FileChange::Fail, false));
        assert_eq!(i.max_record_bytes, DEFAULT_MAX_RECORD_BYTES);
        assert!(p
            .cdc_merge("reconcile")
            .unwrap_err()
            .to_string()
            .contains("`events` is ingest"));
    }

    #[test]
    fn mistakes_are_located_and_explained() {
        let err = |text: String| parse(&text).unwrap_err().to_string();
        let e = err(GOOD.replace("amount: long", "amount: money"));
        assert!(
            e.starts_with("p.yml:9:") && e.contains("not a column type"),
            "{e}"
        );
        let e = err(GOOD.replace("format: json", "format: json\ncsv: { delimiter: \";\" }"));
        assert!(e.contains("apply to `format: csv`"), "{e}");
        let e = err(GOOD.replace("format: json", "format: csv\ncsv: { delimiter: \";;\" }"));
        assert!(e.contains("one ASCII character"), "{e}");
        let e = err(GOOD.replace("  at: Timestamp", "  _ingested_at: timestamp"));
        assert!(e.contains("tidemark adds"), "{e}");
        let e = err(format!("{GOOD}max_bytes_per_run: lots\n"));
        assert!(e.contains("not a size"), "{e}");
        let e = err(format!("{GOOD}max_files_per_run: 0\n"));
        assert!(e.contains("would ingest nothing"), "{e}");
        let e = err(GOOD.replace("/bronze\"", "/landing/bronze\""));
        assert!(e.contains("same location as `landing.uri`"), "{e}");
        let e = err(GOOD.replace("glob: \"events/*.jsonl\"", "glob: \"[\""));
        assert!(e.contains("not a glob pattern"), "{e}");
        let e = err(GOOD.replace("landing: {", "landin: {"));
        assert!(e.contains("did you mean `landing`"), "{e}");
        let no_schema = GOOD.split("schema:").next().unwrap_or("").to_string()
            + "quarantine: { uri: \"${var.lake}/q\" }\n";
        let e = err(no_schema.replace("format: json", "format: csv\ncsv: { header: false }"));
        assert!(e.contains("needs a declared `schema:`"), "{e}");
    }

    #[test]
    fn decimals_are_declared_with_precision_and_scale() {
        let p = parse(&GOOD.replace(
            "amount: long",
            "amount: decimal(12, 2) not null\n  fee: NUMERIC(38,0)\n  rate: decimal( 5 , 5 )",
        ))
        .expect("parses");
        let types: Vec<(ColumnType, bool)> = ingest(&p).schema[1..4]
            .iter()
            .map(|c| (c.ty, c.required))
            .collect();
        let dec = |precision, scale| ColumnType::Decimal { precision, scale };
        assert_eq!(
            types,
            vec![(dec(12, 2), true), (dec(38, 0), false), (dec(5, 5), false)]
        );
        assert_eq!(dec(12, 2).to_string(), "decimal(12, 2)");
        for (bad, rule) in [
            ("decimal(39, 2)", "precision 39 is out of range"),
            ("decimal(0, 0)", "precision 0 is out of range"),
            ("decimal(5, 6)", "scale 6 is out of range"),
            ("decimal(5, -1)", "scale -1 is out of range"),
            ("decimal", "write it as decimal(p, s)"),
            ("decimal(12)", "write it as decimal(p, s)"),
            ("numeric(a, b)", "write it as decimal(p, s)"),
        ] {
            let e = parse(&GOOD.replace("amount: long", &format!("amount: {bad}")))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("p.yml:9:") && e.contains("`amount: ") && e.contains(rule),
                "{bad}: {e}"
            );
        }
        let e = parse(&GOOD.replace("amount: long", "amount: money"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("date, decimal(p, s)"), "{e}");
    }
}
