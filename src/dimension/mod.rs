//! Dimensions (issue 15): SCD type 2 history from a CDC source.
//!
//! [`history`] is the core every dimension run applies per business key: the fold that defines
//! the table (tracked changes open versions, untracked ones update in place, deletes close) and
//! the splice that keeps it exact when changes arrive late, inside versions already written. The
//! pipeline kind around it — reading the changed keys' versions, splicing, one commit — builds
//! on this module.

pub mod history;
