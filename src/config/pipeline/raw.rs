//! The pipeline file as written: `kind:` picks one raw struct per pipeline kind, each mirroring
//! its file exactly (`deny_unknown_fields`: a typo is an error, never a silent default).
//!
//! The kind is read first and the file is then parsed again as that kind's struct, so every
//! error serde reports keeps its line (an internally tagged serde enum buffers the mapping and
//! loses positions).

use serde::{Deserialize, Serialize};

pub(super) use super::common::{RawColumns, RawQuarantine, RawSource};
use super::{DeleteMode, SchemaChange};

/// The kinds of pipeline tidemark runs: `kind:` in a pipeline file names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Change records (bronze) merged into one row per key (silver).
    CdcMerge,
    /// Landing files appended to a bronze table with their arrival time.
    Ingest,
    /// Per-event-day measures (gold), restated by whole days, with finality and day status.
    Aggregate,
    /// A dimension (e.g. merchants) from change records: current rows or SCD2 history.
    Dimension,
}

impl Kind {
    /// Every kind, in the order messages list them.
    pub const ALL: &'static [Kind] = &[
        Kind::CdcMerge,
        Kind::Ingest,
        Kind::Aggregate,
        Kind::Dimension,
    ];

    /// The name written in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::CdcMerge => "cdc_merge",
            Kind::Ingest => "ingest",
            Kind::Aggregate => "aggregate",
            Kind::Dimension => "dimension",
        }
    }

    /// The kind named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// The kinds' names, for messages: `cdc_merge, ...`.
    pub fn names() -> String {
        Kind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Only the tag: what kind the file declares.
#[derive(Debug, Deserialize)]
pub(super) struct RawTag {
    pub(super) kind: Option<String>,
}

/// A pipeline file as written, one variant per [`Kind`].
#[derive(Debug)]
// One per file, parsed once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum RawPipeline {
    CdcMerge(RawCdcMerge),
    Ingest(super::ingest::RawIngest),
    Aggregate(super::aggregate::RawAggregate),
    Dimension(super::dimension::RawDimension),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCdcMerge {
    pub(super) name: String,
    /// The tag, already read by [`RawTag`].
    #[serde(rename = "kind")]
    pub(super) _kind: serde::de::IgnoredAny,
    pub(super) source: RawSource,
    pub(super) target: RawTarget,
    pub(super) keys: Vec<String>,
    pub(super) sequence_by: String,
    #[serde(default)]
    pub(super) tie_breakers: Vec<String>,
    pub(super) overlap: String,
    pub(super) max_future_skew: Option<String>,
    pub(super) deletes: Option<RawDeletes>,
    pub(super) columns: Option<RawColumns>,
    pub(super) quarantine: RawQuarantine,
    #[serde(default)]
    pub(super) on_schema_change: SchemaChange,
    pub(super) reconcile: Option<RawReconcile>,
    #[serde(default)]
    pub(super) expectations: Vec<super::expect::RawExpectation>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) uri: String,
    pub(super) file_size: Option<String>,
    pub(super) row_group_rows: Option<u64>,
    #[serde(default)]
    pub(super) apply: super::Apply,
    #[serde(default)]
    pub(super) change_data_feed: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeletes {
    pub(super) column: String,
    pub(super) values: Vec<String>,
    #[serde(default)]
    pub(super) mode: DeleteMode,
    /// How long tombstones are kept (`maintain` removes older ones), e.g. `30d`.
    #[serde(default)]
    pub(super) retain: Option<String>,
    /// Where the removed tombstones' keys are recorded (default: beside the target).
    #[serde(default)]
    pub(super) removed_keys: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReconcile {
    pub(super) day: Option<String>,
    #[serde(default)]
    pub(super) group_by: Vec<String>,
    #[serde(default)]
    pub(super) sum: Vec<String>,
    #[serde(default)]
    pub(super) count_by: Vec<String>,
}
