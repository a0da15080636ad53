//! `${var.NAME}` and `${env.NAME}` substitution.
//!
//! Variables come from the command line (`--var NAME=VALUE`) and, for bundles, from
//! `BUNDLE_VAR_<NAME>` environment variables, the selected target and the declared defaults, in
//! that order of precedence; the bundle loader merges those layers into one [`Vars`].
//! `${env.NAME}` reads the process environment and is meant for secrets: resolved values are
//! never logged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Variable values, already merged by precedence.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    values: BTreeMap<String, String>,
    /// Set when the values come from a bundle: the bundle file (for messages) and the declared
    /// variable names, so a reference to an undeclared one says so.
    bundle: Option<BundleScope>,
}

#[derive(Debug, Clone)]
struct BundleScope {
    file: String,
    declared: BTreeSet<String>,
    /// The bundle root (the folder holding `tidemark.yml`): relative locations resolve here.
    root: PathBuf,
}

/// Why a reference could not be resolved: the reference as written and how to supply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub reference: String,
    pub how: String,
}

/// Warns when a relative location resolved against the bundle root names nothing, while the
/// same text read from the working directory (as `tidemark run` without the bundle reads it)
/// names something: the two commands would read different tables.
fn warn_if_elsewhere(location: &str, root: &Path, resolved: &Path) {
    let Ok(cwd) = std::env::current_dir() else {
        return;
    };
    let here = crate::config::location::normalize(&cwd.join(location));
    if here != resolved && here.exists() && !resolved.exists() {
        tracing::warn!(
            "`{location}` is a relative location: in the bundle it is {} (relative to the bundle root {}), which does not exist, while {} (relative to the working directory, where `tidemark run` without the bundle reads it) does. Write it as an absolute path or as `${{var.lake}}/…`, so the job and the run read the same table",
            resolved.display(),
            root.display(),
            here.display()
        );
    }
}

impl Vars {
    /// An empty set of variables.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses repeated `NAME=VALUE` arguments; later ones win, as on most command lines. A
    /// value written as a relative path (`./x`, `../x`) is the shell's: it is made absolute
    /// against the working directory, so it means the same wherever the bundle is.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Self, String> {
        let cwd = std::env::current_dir().unwrap_or_default();
        let mut vars = Vars::new();
        for arg in args {
            let arg = arg.as_ref();
            match arg.split_once('=') {
                Some((name, value)) if is_name(name.trim()) => {
                    vars.set(name.trim(), &relative_to(value, &cwd));
                }
                _ => return Err(arg.to_string()),
            }
        }
        Ok(vars)
    }

    /// Marks these values as resolved from the bundle `file` declaring `declared`: messages about
    /// a missing value then list every way a bundle variable can be given.
    /// Relative locations substituted with these values resolve against the bundle root, the
    /// folder holding `file`.
    pub fn in_bundle(mut self, file: &Path, declared: impl IntoIterator<Item = String>) -> Self {
        let root = file.parent().unwrap_or(Path::new("."));
        self.bundle = Some(BundleScope {
            file: file.display().to_string(),
            declared: declared.into_iter().collect(),
            root: std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()),
        });
        self
    }

    /// The bundle root when these values come from a bundle.
    pub fn bundle_root(&self) -> Option<&Path> {
        self.bundle.as_ref().map(|b| b.root.as_path())
    }

    /// A table location as the process opens it: a URI (`s3://…`, `file://…`) or an absolute
    /// path as written; a relative path against the bundle root when these values come from a
    /// bundle (whatever the working directory), else as written (the working directory's).
    pub fn locate(&self, location: &str) -> String {
        match self.bundle_root() {
            Some(root) if is_relative_path(location) => {
                let resolved = crate::config::location::normalize(&root.join(location));
                warn_if_elsewhere(location, root, &resolved);
                resolved.display().to_string()
            }
            _ => location.to_string(),
        }
    }

    /// How to give variable `name` a value, for error messages.
    pub fn how_to_set(&self, name: &str) -> String {
        let typo = match crate::config::location::nearest(name, self.names()) {
            Some(given) => format!(" (`{given}` has a value: a typo for `{name}`?)"),
            None => String::new(),
        };
        format!("{}{typo}", self.how_to_set_plain(name))
    }

    fn how_to_set_plain(&self, name: &str) -> String {
        match &self.bundle {
            None => format!("pass --var {name}=VALUE"),
            Some(b) if !b.declared.contains(name) => format!(
                "`{name}` is not declared: add it under `variables` in {} (with a `default` or a value in each target)",
                b.file
            ),
            Some(b) => format!(
                "pass --var {name}=VALUE, export BUNDLE_VAR_{name}, or give it a value in the target's `variables` (or a `default`) in {}",
                b.file
            ),
        }
    }

    /// Sets (or replaces) one variable.
    pub fn set(&mut self, name: &str, value: &str) {
        self.values.insert(name.to_string(), value.to_string());
    }

    /// Sets a variable only when it has no value yet (used for lower-precedence layers).
    pub fn set_default(&mut self, name: &str, value: &str) {
        self.values
            .entry(name.to_string())
            .or_insert_with(|| value.to_string());
    }

    /// The names that have a value.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// The value of one variable.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Replaces every `${var.X}` and `${env.X}` in `text`.
    pub fn substitute(&self, text: &str) -> Result<String, Unresolved> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(Unresolved {
                    reference: rest[start..].to_string(),
                    how: "close the reference with `}`".to_string(),
                });
            };
            let inner = &after[..end];
            let reference = format!("${{{inner}}}");
            let value = match inner.split_once('.') {
                Some(("var", name)) if is_name(name) => self
                    .get(name)
                    .map(str::to_string)
                    .ok_or_else(|| Unresolved {
                        reference: reference.clone(),
                        how: self.how_to_set(name),
                    })?,
                Some(("env", name)) if is_name(name) => {
                    std::env::var(name).map_err(|_| Unresolved {
                        reference: reference.clone(),
                        how: format!("export the environment variable {name}"),
                    })?
                }
                _ => {
                    return Err(Unresolved {
                        reference,
                        how: "only ${var.NAME} and ${env.NAME} are supported".to_string(),
                    })
                }
            };
            out.push_str(&value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// `value` made absolute against `base` when it is written as a relative path (`.`, `..`, or
/// starting with `./` or `../`); anything else (a URI, an absolute path, a word, a cron
/// expression, a time zone) unchanged.
pub fn relative_to(value: &str, base: &Path) -> String {
    let v = value.trim();
    let dotted = v == "." || v == ".." || v.starts_with("./") || v.starts_with("../");
    if dotted {
        crate::config::location::normalize(&base.join(v))
            .display()
            .to_string()
    } else {
        value.to_string()
    }
}

/// A local path that is not absolute (no URI scheme, no leading `/`).
pub fn is_relative_path(location: &str) -> bool {
    !location.contains("://") && Path::new(location).is_relative()
}

/// The names `text` references as `${var.NAME}`.
pub fn referenced(text: &str) -> BTreeSet<String> {
    text.match_indices("${var.")
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let end = rest.find('}')?;
            Some(rest[..end].to_string())
        })
        .filter(|n| is_name(n))
        .collect()
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_vars_and_env() {
        let vars = Vars::from_args(&["lake=/data/lake", "x=1", "x=2"]).unwrap();
        assert_eq!(
            vars.substitute("${var.lake}/bronze").unwrap(),
            "/data/lake/bronze"
        );
        assert_eq!(vars.get("x"), Some("2"));
        std::env::set_var("TIDEMARK_TEST_SECRET_VAR", "s3cr3t");
        assert_eq!(
            vars.substitute("k=${env.TIDEMARK_TEST_SECRET_VAR}")
                .unwrap(),
            "k=s3cr3t"
        );
    }

    #[test]
    fn reports_missing_values_with_a_remedy() {
        let err = Vars::new().substitute("${var.lake}/x").unwrap_err();
        assert_eq!(err.reference, "${var.lake}");
        assert!(err.how.contains("--var lake=VALUE"), "{}", err.how);
        let err = Vars::new().substitute("${oops}").unwrap_err();
        assert!(err.how.contains("only ${var.NAME}"));
        assert!(Vars::new().substitute("${var.lake").is_err());
    }

    #[test]
    fn a_missing_value_names_a_given_variable_it_may_be_a_typo_of() {
        let vars = Vars::from_args(&["lak=/data/lake"]).unwrap();
        let err = vars.substitute("${var.lake}/x").unwrap_err();
        assert!(err.how.contains("--var lake=VALUE"), "{}", err.how);
        assert!(
            err.how.contains("`lak` has a value: a typo for `lake`?"),
            "{}",
            err.how
        );
        let err = Vars::from_args(&["region=eu"])
            .unwrap()
            .substitute("${var.lake}")
            .unwrap_err();
        assert!(!err.how.contains("typo"), "{}", err.how);
    }

    #[test]
    fn bundle_messages_list_every_source_of_a_value() {
        let vars = Vars::new().in_bundle(Path::new("bundle/tidemark.yml"), ["lake".to_string()]);
        let err = vars.substitute("${var.lake}").unwrap_err();
        assert!(err.how.contains("--var lake=VALUE"), "{}", err.how);
        assert!(err.how.contains("BUNDLE_VAR_lake"), "{}", err.how);
        assert!(err.how.contains("bundle/tidemark.yml"), "{}", err.how);
        let err = vars.substitute("${var.nope}").unwrap_err();
        assert!(err.how.contains("`nope` is not declared"), "{}", err.how);
    }

    #[test]
    fn rejects_malformed_args() {
        assert_eq!(Vars::from_args(&["novalue"]).unwrap_err(), "novalue");
        assert!(Vars::from_args(&["=x"]).is_err());
        assert_eq!(Vars::from_args(&["a=b=c"]).unwrap().get("a"), Some("b=c"));
    }

    #[test]
    fn relative_paths_resolve_where_they_are_written() {
        let base = Path::new("/b/bundle");
        assert_eq!(relative_to("./lake", base), "/b/bundle/lake");
        assert_eq!(relative_to("../lake", base), "/b/lake");
        assert_eq!(relative_to(".", base), "/b/bundle");
        for unchanged in [
            "s3://x/lake",
            "/abs",
            "Europe/Berlin",
            "0 5 * * * ?",
            "64MiB",
        ] {
            assert_eq!(relative_to(unchanged, base), unchanged);
        }
        let vars = Vars::new().in_bundle(Path::new("/b/bundle/tidemark.yml"), []);
        assert_eq!(vars.locate("data/bronze"), "/b/bundle/data/bronze");
        assert_eq!(vars.locate("../lake/x"), "/b/lake/x");
        assert_eq!(vars.locate("/abs/x"), "/abs/x");
        assert_eq!(vars.locate("file:///abs/x"), "file:///abs/x");
        // Outside a bundle a relative location stays the working directory's.
        assert_eq!(Vars::new().locate("data/bronze"), "data/bronze");
    }
}
