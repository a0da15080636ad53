//! When a run stops because a table it reads does not exist yet — a source or a dimension that
//! another pipeline writes — the error names that pipeline and the command to run it first,
//! instead of asking the user to check a path that is right.

use std::path::{Path, PathBuf};

use crate::cli::PipelineVars;
use crate::config::Pipeline;
use crate::lake::LakeError;
use crate::run::RunError;

use super::AppError;

/// `err`, or — when it is a missing table that a pipeline beside this one (or in the bundle's
/// jobs) writes — the error that says to run that pipeline first.
pub(super) fn explain_missing(err: AppError, pipeline: &Pipeline, from: &PipelineVars) -> AppError {
    let Some((role, uri)) = missing_table(&err) else {
        return err;
    };
    let producers = producers_of(&uri, pipeline, from);
    if producers.is_empty() {
        return err;
    }
    let names: Vec<String> = producers.iter().map(|p| format!("`{}`", p.name)).collect();
    let commands: Vec<String> = producers
        .iter()
        .map(|p| {
            let path = shown(&p.path);
            let vars = super::shell_var_args(&from.vars);
            format!("`tidemark run {}{vars}`", path.display())
        })
        .collect();
    let (writers, advice) = match names.len() {
        1 => (
            format!(
                "pipeline {} writes it and has not run on this lake yet (or this is not the lake it ran on: check `--var`)",
                names[0]
            ),
            format!("Run it first: {}", commands[0]),
        ),
        _ => (
            format!(
                "pipelines {} write it and have not run on this lake yet (or this is not the lake they ran on: check `--var`)",
                names.join(" and ")
            ),
            format!("Run them first: {}", commands.join(" and ")),
        ),
    };
    AppError::Lake(LakeError::NotYetWritten {
        role,
        uri,
        writers,
        advice,
    })
}

/// The role and location of the table `err` says is not there.
fn missing_table(err: &AppError) -> Option<(&'static str, String)> {
    let lake = match err {
        AppError::Lake(e) | AppError::Run(RunError::Lake(e)) => e,
        _ => return None,
    };
    match lake {
        LakeError::NotFound { role, uri, .. } if matches!(*role, "source" | "dimension") => {
            Some((role, uri.clone()))
        }
        _ => None,
    }
}

/// The pipelines whose target is `uri`: among the files beside `pipeline` and the pipelines of
/// the bundle's jobs (each loaded with the same variables; one that does not load is skipped).
fn producers_of(uri: &str, pipeline: &Pipeline, from: &PipelineVars) -> Vec<Pipeline> {
    candidates(pipeline, from)
        .into_iter()
        .filter(|p| p != &pipeline.path)
        .filter_map(|p| super::load_pipeline(&p.to_string_lossy(), from).ok())
        .filter(|p| same_location(p.target_uri(), uri))
        .collect()
}

/// Pipeline files beside `pipeline`, then those the bundle's jobs run.
fn candidates(pipeline: &Pipeline, from: &PipelineVars) -> Vec<PathBuf> {
    let dir = pipeline.path.parent().unwrap_or(Path::new("."));
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yml" | "yaml")))
        .collect();
    found.sort();
    if crate::config::bundle::bundle_file(&from.bundle).is_file() {
        let vars = crate::config::Vars::new();
        if let Ok(loaded) =
            crate::config::bundle::Bundle::load(&from.bundle, from.target.as_deref(), &vars)
        {
            let tasks = loaded.bundle.jobs.values().flat_map(|j| j.tasks.iter());
            found.extend(tasks.map(|t| t.pipeline.path.clone()));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    found.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
    found
}

/// Two spellings of one table location (a trailing `/`, a `file://` prefix).
fn same_location(a: &str, b: &str) -> bool {
    let plain = |s: &str| {
        s.trim_start_matches("file://")
            .trim_end_matches('/')
            .to_string()
    };
    plain(a) == plain(b)
}

/// `path` relative to the working directory when it is under it (as a user would type it).
fn shown(path: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(&cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_compare_without_their_spelling() {
        assert!(same_location(
            "/l/silver/payments/",
            "file:///l/silver/payments"
        ));
        assert!(!same_location("/l/silver/payments", "/l/silver/payment"));
    }
}
