//! The pipeline file as written: `kind:` picks one raw struct per pipeline kind, each mirroring
//! its file exactly (`deny_unknown_fields`: a typo is an error, never a silent default).
//!
//! The kind is read first and the file is then parsed again as that kind's struct, so every
//! error serde reports keeps its line (an internally tagged serde enum buffers the mapping and
//! loses positions).

use serde::{Deserialize, Serialize};


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
    CdcMerge(super::cdc_merge::RawCdcMerge),
    Ingest(super::ingest::RawIngest),
    Aggregate(super::aggregate::RawAggregate),
    Dimension(super::dimension::RawDimension),
}
