//! Configuration: YAML files → validated types.
//!
//! Raw serde structs mirror the files exactly (`deny_unknown_fields`, so a typo is an error and
//! never a silent default); validation turns them into the types the run uses. Every error names
//! the file, the line and the key, because the person reading it has the file open.

pub mod bundle;
mod error;
pub mod location;
pub mod pipeline;
pub mod schedule;
pub mod size;
pub mod vars;

pub use bundle::{Bundle, BundleError, Diagnostic};
pub use error::{ConfigError, PipelineChoices};
pub(crate) use location::nearest;
pub use pipeline::{
    DeleteMode, Deletes, Pipeline, Quarantine, ReconcileSpec, SchemaChange, SourceRecreate,
};
pub use vars::Vars;
