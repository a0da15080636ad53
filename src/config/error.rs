use std::path::PathBuf;

use crate::error::{Classify, ErrorClass};

/// The pipelines a name could have named, for [`ConfigError::PipelineNotFound`].
#[derive(Debug)]
pub struct PipelineChoices {
    /// The pipelines of the pipelines folder, by name.
    pub available: Vec<String>,
    pub pipelines_dir: PathBuf,
    /// The bundle's pipelines not in that folder, by name.
    pub in_bundle: Vec<String>,
    /// The bundle's pipeline the name is nearest to.
    pub near: Option<String>,
}

impl std::fmt::Display for PipelineChoices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.available.is_empty() {
            write!(f, "(none in {})", self.pipelines_dir.display())?;
        } else {
            write!(f, "{}", self.available.join(", "))?;
        }
        if !self.in_bundle.is_empty() {
            write!(f, "; the bundle's: {}", self.in_bundle.join(", "))?;
        }
        if let Some(n) = &self.near {
            write!(f, " (did you mean `{n}`?)")?;
        }
        Ok(())
    }
}

/// A configuration problem, located in its file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not UTF-8 text (saved in a legacy encoding, or not a text file at all).
    #[error("cannot read {path}: it is not UTF-8 text; save it as UTF-8 (YAML files must be)")]
    NotUtf8 { path: PathBuf },
    /// No pipeline file matches the name given on the command line.
    #[error("no pipeline named {name:?}: looked for {tried}; pass a path to a YAML file or one of: {choices}")]
    PipelineNotFound {
        name: String,
        tried: String,
        choices: Box<PipelineChoices>,
    },
    /// Invalid YAML or a key that does not belong there.
    #[error("{path}:{line}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A command given a pipeline of a kind it does not work on (a usage error, 64, for every
    /// command alike: the file is fine, the command is not for it).
    #[error("{path}:{line}: {message}")]
    WrongKind {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// `${var.X}` or `${env.X}` has no value.
    #[error("{path}:{line}: {reference} in `{key}` has no value; {how}")]
    Unresolved {
        path: PathBuf,
        line: usize,
        key: String,
        reference: String,
        how: String,
    },
    /// The bundle has problems; every one is listed.
    #[error(transparent)]
    Bundle(#[from] super::bundle::BundleError),
    /// A `--var` argument that is not `NAME=VALUE`.
    #[error("--var {0:?} is not NAME=VALUE (example: --var lake=./lake)")]
    BadVarArg(String),
    /// A `--var NAME=...` that the pipeline never references: most likely a typo, which would
    /// otherwise be ignored silently.
    #[error("--var {name}: {path} has no ${{var.{name}}}{hint}; remove it or fix its name")]
    UnusedVar {
        name: String,
        path: PathBuf,
        hint: String,
    },
}

impl Classify for ConfigError {
    fn class(&self) -> ErrorClass {
        match self {
            ConfigError::BadVarArg(_)
            | ConfigError::UnusedVar { .. }
            | ConfigError::WrongKind { .. } => ErrorClass::Usage,
            _ => ErrorClass::Config,
        }
    }
}
