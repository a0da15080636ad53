//! Raw bundle files → a validated [`Bundle`], collecting every problem on the way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::raw::{RawJob, RawResourceFile, RawRoot, RawTask, Scalar};
use super::{
    compute, Bundle, BundleError, Diagnostic, Job, Loaded, Schedule, Task, Variable, BUNDLE_FILE,
    LAKE_VARIABLE,
};
use crate::config::location::{
    explain_serde_message, line_of_key, line_of_key_from, line_of_text_from, nearest,
};
use crate::config::{ConfigError, Pipeline, Vars};
use crate::jobs::cron::QuartzSchedule;

/// Prefix of the environment variables that set bundle variables.
pub const ENV_PREFIX: &str = "BUNDLE_VAR_";

/// Largest `max_retries`: a bound, so a failing job cannot retry for days.
const MAX_RETRIES: i64 = 100;

/// A file with its text, for locating keys.
struct Source {
    path: PathBuf,
    text: String,
}

impl Source {
    fn read(path: &Path) -> Result<Self, Diagnostic> {
        std::fs::read_to_string(path)
            .map(|text| Source {
                path: path.to_path_buf(),
                text,
            })
            .map_err(|e| {
                Diagnostic::general(format!("cannot read bundle file {}: {e}", path.display()))
            })
    }

    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, Diagnostic> {
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
struct Diags {
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Diags {
    fn error(&mut self, file: &Path, line: usize, message: impl Into<String>) {
        self.errors.push(Diagnostic::error(file, line, message));
    }

    fn warning(&mut self, file: &Path, line: usize, message: impl Into<String>) {
        self.warnings.push(Diagnostic::warning(file, line, message));
    }

    fn fail(self) -> BundleError {
        BundleError {
            errors: self.errors,
            warnings: self.warnings,
        }
    }
}

pub(super) fn load(
    path: &Path,
    target: Option<&str>,
    cli_vars: &Vars,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, BundleError> {
    let mut d = Diags::default();
    let file = if path.is_dir() {
        path.join(BUNDLE_FILE)
    } else {
        path.to_path_buf()
    };
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
            d.errors.push(e);
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

    // Every resource file: the root's own `resources`, then the includes in name order.
    let mut job_sources: Vec<(std::rc::Rc<Source>, BTreeMap<String, RawJob>)> = Vec::new();
    let root = std::rc::Rc::new(root);
    if let Some(res) = raw.resources {
        job_sources.push((root.clone(), res.jobs));
    }
    for pattern in &raw.include {
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
                    &file,
                    line,
                    format!("`include: {pattern}` is not a valid glob: {e}"),
                );
                continue;
            }
        };
        if matches.is_empty() {
            d.error(
                &file,
                line,
                format!(
                    "`include: {pattern}` matches no file (paths are relative to {})",
                    display_dir(&root_dir)
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
                Ok(r) => job_sources.push((std::rc::Rc::new(src), r.resources.jobs)),
                Err(e) => d.errors.push(e),
            }
        }
    }

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
            let mut ctx = JobCtx {
                src: &src,
                job_line: line,
                vars: &vars,
                d: &mut d,
            };
            if let Some(job) = ctx.build(&name, raw_job) {
                jobs.insert(name, job);
            }
        }
    }
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
    let chosen: Option<String> = match target {
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
    };
    let target_name = chosen.clone().unwrap_or_default();
    let target_raw = chosen.as_ref().and_then(|t| raw.targets.get(t));

    let declared: Vec<String> = raw.variables.keys().cloned().collect();
    let mut vars = Vars::new().in_bundle(&file.display().to_string(), declared.clone());
    let mut variables = Vec::new();
    for name in cli.names() {
        if !raw.variables.contains_key(name) {
            let hint = nearest(name, declared.iter().map(String::as_str))
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            d.errors.push(Diagnostic::general(format!(
                "--var {name}: no variable `{name}` is declared in {}{hint}; declare it under `variables`",
                file.display()
            )));
        }
    }
    if let Some((tname, t)) = chosen.as_ref().zip(target_raw) {
        let tline = line_of_key(&root.text, tname);
        for name in t.variables.keys() {
            if !raw.variables.contains_key(name) {
                let hint = nearest(name, declared.iter().map(String::as_str))
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
    for (name, decl) in &raw.variables {
        let from_target = target_raw
            .and_then(|t| t.variables.get(name))
            .map(Scalar::to_string);
        let (value, source) = if let Some(v) = cli.get(name) {
            (Some(v.to_string()), Some("--var".to_string()))
        } else if let Some(v) = env(&format!("{ENV_PREFIX}{name}")) {
            (Some(v), Some(format!("{ENV_PREFIX}{name}")))
        } else if let Some(v) = from_target {
            (Some(v), Some(format!("target {target_name}")))
        } else if let Some(v) = &decl.default {
            (Some(v.to_string()), Some("default".to_string()))
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

/// Builds one job, reporting problems located in its file.
struct JobCtx<'a> {
    src: &'a Source,
    job_line: usize,
    vars: &'a Vars,
    d: &'a mut Diags,
}

impl JobCtx<'_> {
    fn line(&self, key: &str) -> usize {
        line_of_key_from(&self.src.text, key, self.job_line)
    }

    fn error(&mut self, line: usize, message: impl Into<String>) {
        self.d.error(&self.src.path, line, message);
    }

    /// Substitutes variables in the value of `key` found at or after line `from`.
    fn sub(&mut self, key: &str, value: &str, from: usize) -> Option<String> {
        match self.vars.substitute(value) {
            Ok(v) => Some(v),
            Err(u) => {
                let line = line_of_text_from(&self.src.text, &u.reference, from);
                self.error(
                    line,
                    format!("{} in `{key}` has no value; {}", u.reference, u.how),
                );
                None
            }
        }
    }

    fn build(&mut self, name: &str, raw: RawJob) -> Option<Job> {
        let errors_before = self.d.errors.len();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.error(self.job_line, format!("job name `{name}` must be letters, digits, `_` or `-` (it names the job's lease file)"));
        }
        let max_concurrent_runs = match raw.max_concurrent_runs {
            None | Some(1) => 1,
            Some(n) => {
                let line = self.line("max_concurrent_runs");
                self.error(line, format!("`max_concurrent_runs: {n}` is not supported; use 1: a job's pipelines are the single writer of their Delta targets, so a second concurrent run could only lose its commit race (a fire while the job runs is skipped and recorded)"));
                1
            }
        };
        let schedule = raw.schedule.as_ref().and_then(|s| {
            let line = self.line("schedule");
            let expr = self.sub("quartz_cron_expression", &s.quartz_cron_expression, line)?;
            let tz = self.sub("timezone_id", &s.timezone_id, line)?;
            match QuartzSchedule::parse(&expr, &tz) {
                Ok(cron) => {
                    if cron.observes_dst() && (cron.may_fire_in_hour(1) || cron.may_fire_in_hour(2)) {
                        let line = line_of_key_from(&self.src.text, "quartz_cron_expression", line);
                        self.d.warning(&self.src.path, line, format!(
                            "`{expr}` fires between 01:00 and 03:00 local time in {tz}, where DST changes the clock: on the spring-forward day a fire time that does not exist runs once at the end of the gap, and on the fall-back day a repeated time runs once (the first); use timezone_id UTC for strictly periodic runs"
                        ));
                    }
                    Some(Schedule { cron, pause_status: s.pause_status })
                }
                Err(e) => {
                    let key = match e {
                        crate::jobs::cron::CronError::TimeZone { .. } => "timezone_id",
                        _ => "quartz_cron_expression",
                    };
                    let line = line_of_key_from(&self.src.text, key, line);
                    self.error(line, e.to_string());
                    None
                }
            }
        });

        let mut clusters = BTreeMap::new();
        for c in &raw.job_clusters {
            let line = line_of_text_from(
                &self.src.text,
                &format!("job_cluster_key: {}", c.job_cluster_key),
                self.job_line,
            );
            if clusters.contains_key(&c.job_cluster_key) {
                self.error(
                    line,
                    format!("job cluster `{}` is defined twice", c.job_cluster_key),
                );
                continue;
            }
            let mut problems: Vec<(String, String)> = Vec::new();
            let mut subs: Vec<(String, String)> = Vec::new();
            let vars = self.vars;
            let compute = compute::build(
                &c.new_cluster,
                &mut |key, value| match vars.substitute(value) {
                    Ok(v) => Some(v),
                    Err(u) => {
                        subs.push((
                            key.to_string(),
                            format!("{} in `{key}` has no value; {}", u.reference, u.how),
                        ));
                        None
                    }
                },
                &mut |key, message| problems.push((key.to_string(), message)),
            );
            for (key, message) in subs.into_iter().chain(problems) {
                let l = line_of_key_from(&self.src.text, &key, line);
                self.error(l, message);
            }
            clusters.insert(c.job_cluster_key.clone(), compute);
        }

        if raw.tasks.is_empty() {
            let line = self.line("tasks");
            self.error(
                line,
                format!("job `{name}` has no tasks; add at least one pipeline task"),
            );
        }
        let mut tasks = Vec::new();
        let mut seen = BTreeSet::new();
        for t in &raw.tasks {
            let line = self.task_line(&t.task_key);
            if !seen.insert(t.task_key.clone()) {
                self.error(
                    line,
                    format!("task `{}` is defined twice in job `{name}`", t.task_key),
                );
                continue;
            }
            if let Some(task) = self.task(t, line, &clusters) {
                tasks.push(task);
            }
        }
        let used: BTreeSet<&str> = raw
            .tasks
            .iter()
            .filter_map(|t| t.job_cluster_key.as_deref())
            .collect();
        for key in clusters.keys() {
            if !used.contains(key.as_str()) {
                let line = line_of_text_from(
                    &self.src.text,
                    &format!("job_cluster_key: {key}"),
                    self.job_line,
                );
                self.d.warning(
                    &self.src.path,
                    line,
                    format!("job cluster `{key}` is not used by any task of `{name}`"),
                );
            }
        }
        let known: BTreeSet<&str> = raw.tasks.iter().map(|t| t.task_key.as_str()).collect();
        for t in &raw.tasks {
            for dep in &t.depends_on {
                if !known.contains(dep.task_key.as_str()) {
                    let line =
                        self.value_line("task_key", &dep.task_key, self.task_line(&t.task_key));
                    let hint = nearest(&dep.task_key, known.iter().copied())
                        .map(|n| format!(" (did you mean `{n}`?)"))
                        .unwrap_or_default();
                    self.error(
                        line,
                        format!(
                            "task `{}` depends on `{}`, which is not a task of job `{name}`{hint}",
                            t.task_key, dep.task_key
                        ),
                    );
                }
            }
        }
        let order = match topological_order(&raw.tasks) {
            Ok(order) => order,
            Err(cycle) => {
                let line = self.task_line(&cycle[0]);
                self.error(
                    line,
                    format!(
                        "tasks depend on each other in a cycle: {}; remove one `depends_on`",
                        cycle.join(" -> ")
                    ),
                );
                Vec::new()
            }
        };
        if self.d.errors.len() > errors_before {
            return None;
        }
        let mut by_key: BTreeMap<String, Task> =
            tasks.into_iter().map(|t| (t.key.clone(), t)).collect();
        let tasks = order.iter().filter_map(|k| by_key.remove(k)).collect();
        Some(Job {
            name: name.to_string(),
            description: raw.description,
            file: self.src.path.clone(),
            line: self.job_line,
            schedule,
            max_concurrent_runs,
            timeout: raw
                .timeout_seconds
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
            catch_up: raw.catch_up.unwrap_or_default(),
            clusters,
            tasks,
        })
    }

    fn task_line(&self, key: &str) -> usize {
        self.value_line("task_key", key, self.job_line)
    }

    /// Line of `key: value` (value possibly quoted, in block or flow style) at or after `from`.
    fn value_line(&self, key: &str, value: &str, from: usize) -> usize {
        for (i, line) in self
            .src
            .text
            .lines()
            .enumerate()
            .skip(from.saturating_sub(1))
        {
            let mut rest = line;
            while let Some(pos) = rest.find(&format!("{key}:")) {
                let after = &rest[pos + key.len() + 1..];
                let v = after
                    .trim_start()
                    .split([',', '}', ']', '#'])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'');
                if v == value {
                    return i + 1;
                }
                rest = after;
            }
        }
        line_of_key_from(&self.src.text, key, from)
    }

    fn task(
        &mut self,
        t: &RawTask,
        line: usize,
        clusters: &BTreeMap<String, compute::Compute>,
    ) -> Option<Task> {
        let errors_before = self.d.errors.len();
        let key = &t.task_key;
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.error(
                line,
                format!("task_key `{key}` must be letters, digits, `_` or `-`"),
            );
        }
        if let Some(c) = &t.job_cluster_key {
            if !clusters.contains_key(c) {
                let l = self.value_line("job_cluster_key", c, line);
                let hint = nearest(c, clusters.keys().map(String::as_str))
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                self.error(l, format!("task `{key}` uses job cluster `{c}`, which is not in the job's `job_clusters`{hint}"));
            }
        }
        let max_retries = match t.max_retries.unwrap_or(0) {
            n if (0..=MAX_RETRIES).contains(&n) => n as u32,
            n => {
                let l = line_of_key_from(&self.src.text, "max_retries", line);
                self.error(l, format!("`max_retries: {n}` is out of range; use 0 to {MAX_RETRIES} (unlimited retries, -1 in Databricks, are not supported: a job must end)"));
                0
            }
        };
        let pipeline_line = line_of_key_from(&self.src.text, "pipeline", line);
        let pipeline = self.sub("pipeline", &t.pipeline_task.pipeline, line).and_then(|p| {
            let base = self.src.path.parent().unwrap_or(Path::new(""));
            let path = normalize(&base.join(&p));
            if !path.is_file() {
                self.error(pipeline_line, format!("pipeline file `{p}` not found (looked for {}; paths are relative to this file)", path.display()));
                return None;
            }
            match Pipeline::load(&path, self.vars) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.d.errors.push(pipeline_diagnostic(e, &self.src.path, pipeline_line));
                    None
                }
            }
        });
        if self.d.errors.len() > errors_before {
            return None;
        }
        Some(Task {
            key: key.clone(),
            depends_on: t.depends_on.iter().map(|d| d.task_key.clone()).collect(),
            cluster: t.job_cluster_key.clone(),
            pipeline: pipeline?,
            mode: t.pipeline_task.mode,
            max_retries,
            min_retry_interval: Duration::from_millis(t.min_retry_interval_millis.unwrap_or(0)),
            retry_on_timeout: t.retry_on_timeout.unwrap_or(false),
            timeout: t
                .timeout_seconds
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
        })
    }
}

/// A pipeline file's own problem, located in the pipeline file.
fn pipeline_diagnostic(e: ConfigError, task_file: &Path, task_line: usize) -> Diagnostic {
    match e {
        ConfigError::Invalid {
            path,
            line,
            message,
        } => Diagnostic::error(&path, line, message),
        ConfigError::Unresolved {
            path,
            line,
            key,
            reference,
            how,
        } => Diagnostic::error(
            &path,
            line,
            format!("{reference} in `{key}` has no value; {how}"),
        ),
        other => Diagnostic::error(task_file, task_line, other.to_string()),
    }
}

/// Declaration order, moved so every task follows its dependencies; Err(cycle) when there is
/// none. Unknown dependencies are ignored here (reported by the caller).
fn topological_order(tasks: &[RawTask]) -> Result<Vec<String>, Vec<String>> {
    let known: BTreeSet<&str> = tasks.iter().map(|t| t.task_key.as_str()).collect();
    let deps: BTreeMap<&str, Vec<&str>> = tasks
        .iter()
        .map(|t| {
            (
                t.task_key.as_str(),
                t.depends_on
                    .iter()
                    .map(|d| d.task_key.as_str())
                    .filter(|d| known.contains(d))
                    .collect(),
            )
        })
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut placed = BTreeSet::new();
    while placed.len() < deps.len() {
        let next = tasks
            .iter()
            .map(|t| t.task_key.as_str())
            .find(|k| !placed.contains(k) && deps[k].iter().all(|d| placed.contains(d)));
        match next {
            Some(k) => {
                placed.insert(k);
                done.push(k.to_string());
            }
            None => {
                let start = tasks
                    .iter()
                    .map(|t| t.task_key.as_str())
                    .find(|k| !placed.contains(k))
                    .unwrap_or_default();
                return Err(find_cycle(start, &deps, &placed));
            }
        }
    }
    Ok(done)
}

/// Walks unplaced dependencies from `start` until a task repeats: that loop is a cycle.
fn find_cycle(
    start: &str,
    deps: &BTreeMap<&str, Vec<&str>>,
    placed: &BTreeSet<&str>,
) -> Vec<String> {
    let mut path: Vec<&str> = vec![start];
    let mut current = start;
    loop {
        let Some(next) = deps
            .get(current)
            .and_then(|ds| ds.iter().find(|d| !placed.contains(*d)))
        else {
            return path.iter().map(|s| s.to_string()).collect();
        };
        if let Some(pos) = path.iter().position(|p| p == next) {
            let mut cycle: Vec<String> = path[pos..].iter().map(|s| s.to_string()).collect();
            cycle.push(next.to_string());
            return cycle;
        }
        path.push(next);
        current = next;
    }
}

/// Removes `.` and `..` components lexically, so messages show `pipelines/x.yml`, not
/// `bundle/resources/../../pipelines/x.yml`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let last = out.components().next_back();
                match last {
                    Some(Component::Normal(_)) => {
                        out.pop();
                    }
                    Some(Component::RootDir) => {}
                    _ => out.push(".."),
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}
