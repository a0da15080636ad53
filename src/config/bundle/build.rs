//! Raw bundle files → a validated [`Bundle`], collecting every problem on the way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::raw::{RawJob, RawResourceFile, RawRoot, Scalar};
use super::source::{Diags, Source};
use super::{Bundle, BundleError, Diagnostic, Loaded, Variable, BUNDLE_FILE, LAKE_VARIABLE};
use crate::config::location::{line_of_key, line_of_key_from, line_of_text_from, nearest};
use crate::config::vars::relative_to;
use crate::config::Vars;

/// Prefix of the environment variables that set bundle variables.
pub const ENV_PREFIX: &str = "BUNDLE_VAR_";

pub(super) fn load(
    path: &Path,
    target: Option<&str>,
    cli_vars: &Vars,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, BundleError> {
    let mut d = Diags::default();
    let file = super::bundle_file(path);
    let root_dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let root = match Source::read(&file) {
        Ok(s) => s,
        Err(e) => {
            d.errors.push(Diagnostic::general(format!(
                "{}; pass --bundle with a directory holding {BUNDLE_FILE} (or the file itself)",
                e.message
            )));
            return Err(d.fail());
        }
    };
    let raw: RawRoot = match root.parse() {
        Ok(r) => r,
        Err(e) => {
            d.errors.extend(e);
            return Err(d.fail());
        }
    };
    if raw.bundle.name.trim().is_empty() {
        d.error(
            &file,
            line_of_key(&root.text, "name"),
            "`bundle.name` is empty; name the bundle",
        );
    }
    let (target, vars, variables) = resolve_variables(&root, &raw, target, cli_vars, env, &mut d);

    let root = std::rc::Rc::new(root);
    let mut job_sources = Vec::new();
    if let Some(res) = raw.resources {
        job_sources.push((root.clone(), res.jobs));
    }
    job_sources.extend(included(&root, &raw.include, &root_dir, &mut d));
    let jobs = built_jobs(job_sources, &vars, &mut d);
    if vars.get(LAKE_VARIABLE).is_none() && !variables.iter().any(|v| v.name == LAKE_VARIABLE) {
        d.error(
            &file,
            line_of_key(&root.text, "variables"),
            format!("the bundle declares no `{LAKE_VARIABLE}` variable; declare it under `variables`: it is the lake root where the run ledger and the job leases live"),
        );
    } else if vars.get(LAKE_VARIABLE).is_none() {
        d.error(
            &file,
            line_of_key(&root.text, LAKE_VARIABLE),
            format!(
                "variable `{LAKE_VARIABLE}` has no value for target `{target}`; {}",
                vars.how_to_set(LAKE_VARIABLE)
            ),
        );
    }
    if !d.errors.is_empty() {
        return Err(d.fail());
    }
    Ok(Loaded {
        bundle: Bundle {
            name: raw.bundle.name,
            file,
            target,
            vars,
            variables,
            jobs,
        },
        warnings: d.warnings,
    })
}

/// The job files `include:` names, in name order (each pattern matching at least one file).
fn included(
    root: &Source,
    include: &[String],
    root_dir: &Path,
    d: &mut Diags,
) -> Vec<(std::rc::Rc<Source>, BTreeMap<String, RawJob>)> {
    let mut out = Vec::new();
    for pattern in include {
        let line = line_of_text_from(&root.text, pattern, line_of_key(&root.text, "include"));
        let full = root_dir.join(pattern);
        let matches = match glob::glob(&full.to_string_lossy()) {
            Ok(paths) => {
                let mut v: Vec<PathBuf> = paths.filter_map(Result::ok).collect();
                v.sort();
                v
            }
            Err(e) => {
                d.error(
                    &root.path,
                    line,
                    format!("`include: {pattern}` is not a valid glob: {e}"),
                );
                continue;
            }
        };
        if matches.is_empty() {
            d.error(
                &root.path,
                line,
                format!(
                    "`include: {pattern}` matches no file (paths are relative to {})",
                    display_dir(root_dir)
                ),
            );
        }
        for m in matches {
            let src = match Source::read(&m) {
                Ok(s) => s,
                Err(e) => {
                    d.errors.push(e);
                    continue;
                }
            };
            match src.parse::<RawResourceFile>() {
                Ok(r) => out.push((std::rc::Rc::new(src), r.resources.jobs)),
                Err(e) => d.errors.extend(e),
            }
        }
    }
    out
}

/// Every job of every resource file, validated (a name defined twice is an error).
fn built_jobs(
    job_sources: Vec<(std::rc::Rc<Source>, BTreeMap<String, RawJob>)>,
    vars: &Vars,
    d: &mut Diags,
) -> BTreeMap<String, super::Job> {
    let mut jobs = BTreeMap::new();
    let mut defined_in: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (src, raw_jobs) in job_sources {
        let jobs_line = line_of_key(&src.text, "jobs");
        for (name, raw_job) in raw_jobs {
            let line = line_of_key_from(&src.text, &name, jobs_line);
            if let Some(first) = defined_in.get(&name) {
                d.error(
                    &src.path,
                    line,
                    format!("job `{name}` is already defined in {}", first.display()),
                );
                continue;
            }
            defined_in.insert(name.clone(), src.path.clone());
            let mut ctx = super::job::JobCtx {
                src: &src,
                job_line: line,
                vars,
                d,
            };
            if let Some(job) = ctx.build(&name, raw_job) {
                jobs.insert(name, job);
            }
        }
    }
    jobs
}

fn display_dir(dir: &Path) -> String {
    if dir.as_os_str().is_empty() {
        ".".to_string()
    } else {
        dir.display().to_string()
    }
}

/// Picks the target and merges the variable layers: `--var`, `BUNDLE_VAR_<name>`, the target,
/// the default.
fn resolve_variables(
    root: &Source,
    raw: &RawRoot,
    target: Option<&str>,
    cli: &Vars,
    env: &dyn Fn(&str) -> Option<String>,
    d: &mut Diags,
) -> (String, Vars, Vec<Variable>) {
    let file = &root.path;
    let chosen = chosen_target(root, raw, target, d);
    let target_name = chosen.clone().unwrap_or_default();
    let target_raw = chosen.as_ref().and_then(|t| raw.targets.get(t));

    let declared: Vec<String> = raw.variables.keys().cloned().collect();
    let mut vars = Vars::new().in_bundle(file, declared.clone());
    // Relative paths are relative to where they are written: the shell's working directory for
    // `--var` (made absolute when parsed) and `BUNDLE_VAR_*`, the bundle root for this file.
    let cwd = std::env::current_dir().unwrap_or_default();
    let bundle_root = vars
        .bundle_root()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut variables = Vec::new();
    undeclared(root, raw, cli, chosen.as_deref(), d);
    for (name, decl) in &raw.variables {
        let from_target = target_raw
            .and_then(|t| t.variables.get(name))
            .map(Scalar::to_string);
        let (value, source) = if let Some(v) = cli.get(name) {
            (Some(v.to_string()), Some("--var".to_string()))
        } else if let Some(v) = env(&format!("{ENV_PREFIX}{name}")) {
            (
                Some(relative_to(&v, &cwd)),
                Some(format!("{ENV_PREFIX}{name}")),
            )
        } else if let Some(v) = from_target {
            (
                Some(relative_to(&v, &bundle_root)),
                Some(format!("target {target_name}")),
            )
        } else if let Some(v) = &decl.default {
            (
                Some(relative_to(&v.to_string(), &bundle_root)),
                Some("default".to_string()),
            )
        } else {
            (None, None)
        };
        if let Some(v) = &value {
            vars.set(name, v);
        }
        variables.push(Variable {
            name: name.clone(),
            description: decl.description.clone(),
            value,
            source,
        });
    }
    (target_name, vars, variables)
}

/// The target to use: `--target`, else the one marked `default: true` (exactly one).
fn chosen_target(
    root: &Source,
    raw: &RawRoot,
    target: Option<&str>,
    d: &mut Diags,
) -> Option<String> {
    let file = &root.path;
    let defaults: Vec<&String> = raw
        .targets
        .iter()
        .filter(|(_, t)| t.default)
        .map(|(n, _)| n)
        .collect();
    if defaults.len() > 1 {
        let names: Vec<&str> = defaults.iter().map(|s| s.as_str()).collect();
        d.error(
            file,
            line_of_key(&root.text, "targets"),
            format!(
                "targets {} are all marked `default: true`; mark one",
                names.join(" and ")
            ),
        );
    }
    let names: Vec<&str> = raw.targets.keys().map(String::as_str).collect();
    match target {
        Some(t) if raw.targets.contains_key(t) => Some(t.to_string()),
        Some(t) => {
            let hint = nearest(t, names.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            d.errors.push(Diagnostic::general(format!(
                "--target {t}: no such target in {}{hint}; the targets are: {}",
                file.display(),
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            )));
            None
        }
        None => match defaults.first() {
            Some(t) => Some((*t).clone()),
            None if raw.targets.is_empty() => {
                d.error(
                    file,
                    1,
                    "the bundle has no `targets`; add one (e.g. `local` with `default: true`)",
                );
                None
            }
            None => {
                d.error(
                    file,
                    line_of_key(&root.text, "targets"),
                    format!("no target is marked `default: true`; mark one or pass --target (one of: {})", names.join(", ")),
                );
                None
            }
        },
    }
}

/// Variables `--var` or the target sets that the bundle does not declare.
fn undeclared(root: &Source, raw: &RawRoot, cli: &Vars, chosen: Option<&str>, d: &mut Diags) {
    let file = &root.path;
    let declared: Vec<&str> = raw.variables.keys().map(String::as_str).collect();
    for name in cli.names() {
        if !raw.variables.contains_key(name) {
            let hint = nearest(name, declared.iter().copied())
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            d.errors.push(Diagnostic::general(format!(
                "--var {name}: no variable `{name}` is declared in {}{hint}; declare it under `variables`",
                file.display()
            )));
        }
    }
    if let Some((tname, t)) = chosen.and_then(|c| raw.targets.get_key_value(c)) {
        let tline = line_of_key(&root.text, tname);
        for name in t.variables.keys() {
            if !raw.variables.contains_key(name) {
                let hint = nearest(name, declared.iter().copied())
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                d.error(
                    file,
                    line_of_key_from(&root.text, name, tline),
                    format!("target `{tname}` sets variable `{name}`, which is not declared under `variables`{hint}"),
                );
            }
        }
    }
}
