//! Dimensions (issue 15): SCD type 2 history from a CDC source.
//!
//! [`history`] is the core every dimension run applies per business key: the fold that defines
//! the table (tracked changes open versions, untracked ones update in place, deletes close).
//! [`fold`] applies it to source rows, [`run`] is the `kind: dimension` pipeline: the keys whose
//! records landed since the previous run are rebuilt from all their records, so a late change
//! lands inside the history where its sequence puts it.

mod compare;
pub mod fold;
pub mod history;
mod infer;
mod plan;
mod run;

pub(crate) use run::run_once;
