//! What the bundle loader and the job checks share: a file with its text (for locating keys),
//! the problems collected so far, and lexical path normalization.

use std::path::{Path, PathBuf};

use super::{BundleError, Diagnostic};
use crate::config::location::explain_serde_message;

/// A file with its text, for locating keys.
pub(super) struct Source {
    pub(super) path: PathBuf,
    pub(super) text: String,
}

impl Source {
    pub(super) fn read(path: &Path) -> Result<Self, Diagnostic> {
        std::fs::read_to_string(path)
            .map(|text| Source {
                path: path.to_path_buf(),
                text,
            })
            .map_err(|e| {
                Diagnostic::general(format!("cannot read bundle file {}: {e}", path.display()))
            })
    }

    pub(super) fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, Diagnostic> {
        serde_yaml::from_str(&self.text).map_err(|e| {
            Diagnostic::error(
                &self.path,
                e.location().map(|l| l.line()).unwrap_or(1),
                explain_serde_message(&e.to_string()),
            )
        })
    }
}

#[derive(Default)]
pub(super) struct Diags {
    pub(super) errors: Vec<Diagnostic>,
    pub(super) warnings: Vec<Diagnostic>,
}

impl Diags {
    pub(super) fn error(&mut self, file: &Path, line: usize, message: impl Into<String>) {
        self.errors.push(Diagnostic::error(file, line, message));
    }

    pub(super) fn warning(&mut self, file: &Path, line: usize, message: impl Into<String>) {
        self.warnings.push(Diagnostic::warning(file, line, message));
    }

    pub(super) fn fail(self) -> BundleError {
        BundleError {
            errors: self.errors,
            warnings: self.warnings,
        }
    }
}

pub use crate::config::location::normalize;
