//! What the bundle loader and the job checks share: a file with its text (for locating keys),
//! the problems collected so far, and lexical path normalization.

use std::path::{Path, PathBuf};

use super::{BundleError, Diagnostic};

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

    /// The file as `T`, or every problem it has: after a wrong key or value the file is read
    /// on without that line (blanked, so lines keep their numbers), so one pass lists them all.
    /// A required key that is missing only because its line was blanked is not reported again.
    pub(super) fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, Vec<Diagnostic>> {
        const MAX_PROBLEMS: usize = 50;
        let mut text = self.text.clone();
        let mut problems = Vec::new();
        let mut blanked: Vec<String> = Vec::new();
        loop {
            let e = match serde_yaml::from_str::<T>(&text) {
                Ok(v) if problems.is_empty() => return Ok(v),
                Ok(_) => return Err(problems),
                Err(e) => e,
            };
            let line = e.location().map(|l| l.line()).unwrap_or(1);
            let message = crate::config::location::explain_yaml_error(&e, &text);
            let repeat = missing_key(&message)
                .is_some_and(|k| blanked.iter().any(|b| b.contains(&format!("{k}:"))));
            if !repeat {
                problems.push(Diagnostic::error(&self.path, line, message));
            }
            // Read on only past a problem on its key's own line (a wrong value, an unknown key):
            // a syntax error, a missing or repeated key (located at its mapping's first line),
            // or a line already blanked would only repeat or invent problems.
            if e.location().is_none() || problems.len() >= MAX_PROBLEMS || !on_its_line(&e) {
                return Err(problems);
            }
            let Some(removed) = blank_line(&mut text, line) else {
                return Err(problems);
            };
            blanked.push(removed);
        }
    }
}

/// `text` with line `line` (1-based) made a comment; the line as it was, or None when there is
/// no such line or it is blank already.
fn blank_line(text: &mut String, line: usize) -> Option<String> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let target = lines.get_mut(line.checked_sub(1)?)?;
    if target.trim().is_empty() || target.trim_start().starts_with('#') {
        return None;
    }
    let removed = std::mem::replace(target, "#".to_string());
    *text = lines.join("\n");
    Some(removed)
}

/// The key a "missing field `k`" problem names.
fn missing_key(message: &str) -> Option<&str> {
    message.split("missing field `").nth(1)?.split('`').next()
}

/// Whether `e` is located at the line of the key it is about: a value of the wrong type, an
/// unknown key or variant (not a syntax error, nor a missing or repeated key).
fn on_its_line(e: &serde_yaml::Error) -> bool {
    let m = e.to_string();
    [
        "invalid type: ",
        "invalid value: ",
        "unknown field `",
        "unknown variant `",
    ]
    .iter()
    .any(|s| m.contains(s))
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
