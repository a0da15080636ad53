//! The pipeline file's tag: `kind:` picks one raw struct per pipeline kind (see `kinds.rs`),
//! each mirroring its file exactly (`deny_unknown_fields`: a typo is an error, never a silent
//! default).
//!
//! The kind is read first and the file is then parsed again as that kind's struct, so every
//! error serde reports keeps its line (an internally tagged serde enum buffers the mapping and
//! loses positions).

use serde::Deserialize;

/// Only the tag: what kind the file declares.
#[derive(Debug, Deserialize)]
pub(super) struct RawTag {
    pub(super) kind: Option<String>,
}
