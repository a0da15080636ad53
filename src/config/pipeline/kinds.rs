//! The pipeline kinds, one line each: [`kinds!`] turns the list into the [`Kind`] a file's
//! `kind:` names, the [`Spec`] holding a kind's validated settings, the parse that checks a file
//! as its kind, and [`with_spec!`], which runs code on a spec's settings whatever its kind (how
//! the dispatcher above the kinds calls each kind's `RunKind`). Adding a kind adds a line here;
//! nothing else in `config/` or the dispatcher names the kinds one by one.

use super::aggregate::RawAggregate;
use super::cdc_merge::RawCdcMerge;
use super::common::Ctx;
use super::dimension::RawDimension;
use super::ingest::RawIngest;
use super::{Aggregate, CdcMerge, Dimension, Ingest};
use crate::config::{ConfigError, Vars};

/// What every kind's validated settings say about the tables it reads and writes (each kind's
/// file in this folder implements it).
pub trait Settings {
    /// The table the pipeline writes (what `history`, `restore` and `maintain` act on).
    fn target_uri(&self) -> &str;
    /// What it reads: a table, or a landing location.
    fn source_uri(&self) -> &str;
    /// The table `tidemark lateness` profiles for the pipeline, with its two clocks as far as
    /// the settings know them; by default its target, the event time given on the command line.
    fn clocks(&self) -> Clocks<'_> {
        Clocks {
            table: self.target_uri(),
            role: "target",
            event_time: None,
            arrival: None,
            overlap: None,
        }
    }
    /// The columns that name a row of the target in `tidemark changes` (none: rows are listed
    /// by their content).
    fn row_keys(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Where a pipeline's two clocks are (see [`Settings::clocks`]).
#[derive(Debug, Clone)]
pub struct Clocks<'a> {
    pub table: &'a str,
    /// `source` or `target`, for messages.
    pub role: &'static str,
    /// The event-time column, when the settings name one.
    pub event_time: Option<&'a str>,
    /// The arrival column, when it is not `_ingested_at`.
    pub arrival: Option<&'a str>,
    /// The pipeline's own lookback (a merge's `overlap`), to rate.
    pub overlap: Option<std::time::Duration>,
}

macro_rules! kinds {
    ($d:tt $( $(#[$doc:meta])* $variant:ident($name:literal, $raw:ty => $settings:ty, $check:ident) ),+ $(,)?) => {
        /// The kinds of pipeline tidemark runs: `kind:` in a pipeline file names one.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub enum Kind {
            $( $(#[$doc])* #[serde(rename = $name)] $variant, )+
        }

        impl Kind {
            /// Every kind, in the order messages list them.
            pub const ALL: &'static [Kind] = &[ $( Kind::$variant ),+ ];

            /// The name written in `kind:`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Kind::$variant => $name, )+
                }
            }
        }

        /// What a pipeline does, by kind: its validated settings.
        #[derive(Debug, Clone)]
        // One per pipeline, loaded once per run: boxing the larger variant would buy nothing.
        #[allow(clippy::large_enum_variant)]
        pub enum Spec {
            $( $variant($settings), )+
        }

        impl Spec {
            /// The kind of these settings.
            pub fn kind(&self) -> Kind {
                match self {
                    $( Spec::$variant(_) => Kind::$variant, )+
                }
            }
        }

        impl Ctx<'_> {
            /// The file parsed as `kind`'s raw struct and validated: its name and settings.
            pub(super) fn spec(&self, kind: Kind, vars: &Vars) -> Result<(String, Spec), ConfigError> {
                match kind {
                    $( Kind::$variant => {
                        let raw: $raw = self.parse_as()?;
                        let name = raw.name.clone();
                        Ok((name, Spec::$variant(self.$check(raw, vars)?)))
                    } )+
                }
            }
        }

        /// Evaluates `body` with `k` bound to the settings of `spec`, whatever its kind (the
        /// body is compiled once per kind: generic code over the kinds' common traits).
        macro_rules! with_spec {
            ($d spec:expr, $d k:ident => $d body:expr) => {
                match $d spec {
                    $( $crate::config::pipeline::Spec::$variant($d k) => $d body, )+
                }
            };
        }
        pub(crate) use with_spec;
    };
}

kinds! { $
    /// Change records (bronze) merged into one row per key (silver).
    CdcMerge("cdc_merge", RawCdcMerge => CdcMerge, cdc_merge),
    /// Landing files appended to a bronze table with their arrival time.
    Ingest("ingest", RawIngest => Ingest, ingest),
    /// Per-event-day measures (gold), restated by whole days, with finality and day status.
    Aggregate("aggregate", RawAggregate => Aggregate, aggregate),
    /// A dimension (e.g. merchants) from change records: current rows or SCD2 history.
    Dimension("dimension", RawDimension => Dimension, dimension),
}

impl Kind {
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
