//! What the kinds' settings share: the file being validated ([`Ctx`], with its errors at the
//! line of the key), and the blocks every kind writes the same way (`source`, `columns`,
//! `quarantine`). A leaf: it imports no kind's settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{Pipeline, Quarantine, SourceRecreate};
use crate::config::location::{line_of_key, line_of_text};
use crate::config::{ConfigError, Vars};

thread_local! {
    /// The pipeline files being loaded because another one names them (`infer_from`,
    /// `lookups`): a file met again refers back to itself.
    static REFERRING: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) struct Ctx<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Ctx<'_> {
    pub(super) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: line_of_key(self.text, key),
            message: message.into(),
        }
    }

    /// Loads the pipeline `file` that this one names at `key`; refuses one that leads back to
    /// this file (directly or through the pipelines it names in turn).
    pub(super) fn load_referenced(
        &self,
        file: &Path,
        vars: &Vars,
        key: &str,
    ) -> Result<Pipeline, ConfigError> {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let (me, other) = (canon(self.path), canon(file));
        let back = other == me || REFERRING.with(|r| r.borrow().contains(&other));
        if back {
            return Err(self.invalid(
                key,
                format!(
                    "`{key}` names {}, which leads back to this pipeline ({}): a pipeline cannot read a table that depends on its own; name the facts table (e.g. the payments pipeline) or the dimension itself",
                    file.display(),
                    self.path.display()
                ),
            ));
        }
        REFERRING.with(|r| r.borrow_mut().push(me));
        let loaded = Pipeline::load(file, vars);
        REFERRING.with(|r| {
            r.borrow_mut().pop();
        });
        loaded
    }

    pub(super) fn substitute(
        &self,
        key: &str,
        value: &str,
        vars: &Vars,
    ) -> Result<String, ConfigError> {
        let out = vars
            .substitute(value)
            .map_err(|u| ConfigError::Unresolved {
                path: self.path.to_path_buf(),
                line: line_of_text(self.text, &u.reference),
                key: key.to_string(),
                reference: u.reference,
                how: u.how,
            })?;
        if out.trim().is_empty() {
            return Err(self.invalid(
                key.rsplit('.').next().unwrap_or(key),
                format!("`{key}` is empty; give a table path or URI"),
            ));
        }
        Ok(vars.locate(&out))
    }

    pub(super) fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        let v = value.trim();
        if v.starts_with('-') {
            return Err(self.invalid(
                key,
                format!("`{key}: {value}` is negative; use a duration of zero or more, like 15m"),
            ));
        }
        humantime::parse_duration(v).map_err(|e| {
            self.invalid(
                key,
                format!("`{key}: {value}` is not a duration ({e}); write it like 15m, 2h or 1h30m"),
            )
        })
    }

    /// An error at the line where `fragment` is written (an expectation's name or SQL).
    pub(super) fn invalid_at_text(
        &self,
        fragment: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: line_of_text(self.text, fragment),
            message: message.into(),
        }
    }
}

impl Ctx<'_> {
    /// `ignore_null_updates` and `unavailable_marker`, checked.
    pub(super) fn partial_updates(
        &self,
        ignore_nulls: bool,
        marker: Option<String>,
    ) -> Result<super::PartialUpdates, ConfigError> {
        if let Some(m) = marker.as_deref().filter(|m| m.trim().is_empty()) {
            let what = if m.is_empty() { "empty" } else { "blank" };
            return Err(self.invalid(
                "unavailable_marker",
                format!("`unavailable_marker` is {what}; give the text the feed sends for a value it did not send, e.g. __debezium_unavailable_value, or remove the setting"),
            ));
        }
        Ok(super::PartialUpdates {
            ignore_nulls,
            marker,
        })
    }

    /// The `quarantine:` block: its location substituted, its limits checked.
    pub(super) fn quarantine(
        &self,
        raw: RawQuarantine,
        vars: &Vars,
    ) -> Result<Quarantine, ConfigError> {
        if let Some(f) = raw.max_fraction {
            if !(0.0..=1.0).contains(&f) {
                return Err(self.invalid(
                    "max_fraction",
                    format!("`quarantine.max_fraction: {f}` must be between 0 and 1"),
                ));
            }
        }
        Ok(Quarantine {
            uri: self.substitute("quarantine.uri", &raw.uri, vars)?,
            max_rows: raw.max_rows,
            max_fraction: raw.max_fraction,
        })
    }

    /// No two of a pipeline's locations (`(setting, uri)`: what it reads, what it writes) the same
    /// or one inside the other; the error is at the later setting's line.
    pub(super) fn separate(&self, locations: &[(&str, &str)]) -> Result<(), ConfigError> {
        // (an ingest's landing is a folder of files: its places are locations, others tables)
        let noun = match locations.iter().any(|(s, _)| s.starts_with("landing")) {
            true => "location",
            false => "table",
        };
        for (i, (setting, uri)) in locations.iter().enumerate() {
            for (other_setting, other) in &locations[..i] {
                if overlapping(uri, other) {
                    // (`target.uri` is written under `target:`, `deletes.removed_keys` as `removed_keys:`)
                    let key = match setting.strip_suffix(".uri") {
                        Some(block) => block,
                        None => setting.rsplit('.').next().unwrap_or(setting),
                    };
                    return Err(self.invalid(
                        key,
                        format!("`{setting}` ({uri}) is the same {noun} as `{other_setting}` ({other}), or inside it: writing it would overwrite or mix with what is there. Give each its own location"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether two table URIs name the same location or one lies inside the other (compared by path
/// components, after `file://` is dropped and local paths are made absolute).
pub(super) fn overlapping(a: &str, b: &str) -> bool {
    fn normal(uri: &str) -> PathBuf {
        let s = uri.strip_prefix("file://").unwrap_or(uri);
        let p = if s.contains("://") {
            PathBuf::from(s)
        } else {
            std::path::absolute(s).unwrap_or_else(|_| PathBuf::from(s))
        };
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => {
                    out.pop();
                }
                other => out.push(other),
            }
        }
        out
    }
    let (a, b) = (normal(a), normal(b));
    a.starts_with(&b) || b.starts_with(&a)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    pub(super) uri: String,
    #[serde(default)]
    pub(super) on_recreate: SourceRecreate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawColumns {
    #[serde(default)]
    pub(super) exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuarantine {
    pub(super) uri: String,
    pub(super) max_rows: Option<u64>,
    pub(super) max_fraction: Option<f64>,
}
