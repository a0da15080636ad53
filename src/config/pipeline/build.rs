//! Validation: a raw pipeline file becomes a [`Pipeline`], or an error naming the file, the line
//! and the key.

use super::common::Ctx;
use super::raw::RawTag;
use super::{Kind, Pipeline};
use crate::config::location::{lines_of_key, nearest};
use crate::config::{ConfigError, Vars};

impl Ctx<'_> {
    /// Parses the file as the kind it declares and validates it.
    pub(super) fn pipeline(&self, vars: &Vars) -> Result<Pipeline, ConfigError> {
        let (name, spec) = self.spec(self.kind()?, vars)?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(self.invalid(
                "name",
                format!("`name: {name:?}` must be non-empty letters, digits, `_` or `-`"),
            ));
        }
        Ok(Pipeline {
            name,
            path: self.path.to_path_buf(),
            spec,
            text: self.text.to_string(),
        })
    }

    /// The kind the file declares (it is then parsed again as that kind's raw struct).
    fn kind(&self) -> Result<Kind, ConfigError> {
        let tag: RawTag = self.parse_as()?;
        let Some(kind) = tag.kind else {
            return Err(ConfigError::Invalid {
                path: self.path.to_path_buf(),
                line: 1,
                message: format!(
                    "missing `kind`; add `kind: cdc_merge` (the kinds are: {})",
                    Kind::names()
                ),
            });
        };
        match Kind::from_name(kind.trim()) {
            Some(k) => Ok(k),
            None => {
                let hint = nearest(kind.trim(), Kind::ALL.iter().map(|k| k.as_str()))
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                Err(self.invalid(
                    "kind",
                    format!(
                        "`kind: {kind}` is not a pipeline kind{hint}; the kinds are: {}",
                        Kind::names()
                    ),
                ))
            }
        }
    }

    pub(super) fn parse_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        serde_yaml::from_str(self.text).map_err(|e| {
            let message = e.to_string();
            // serde locates a repeated key at the start of its mapping: point at the repeat.
            let repeated = message
                .strip_prefix("duplicate field `")
                .and_then(|r| r.split('`').next())
                .and_then(|key| lines_of_key(self.text, key).nth(1));
            ConfigError::Invalid {
                path: self.path.to_path_buf(),
                line: repeated.or(e.location().map(|l| l.line())).unwrap_or(1),
                message: crate::config::location::explain_yaml_error(&e, self.text),
            }
        })
    }
}
