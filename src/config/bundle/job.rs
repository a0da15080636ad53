//! One job of a resource file → a validated [`Job`]: schedule, compute, tasks in dependency
//! order, each problem located in the file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::raw::{RawContinuous, RawJob, RawJobCluster, RawSchedule, RawTask};
use super::source::{normalize, Diags, Source};
use super::{compute, Continuous, Diagnostic, Job, Schedule, Task};
use crate::config::location::{line_of_key_from, line_of_text_from, nearest};
use crate::config::schedule::QuartzSchedule;
use crate::config::{ConfigError, Pipeline, Vars};

/// Largest `max_retries`: a bound, so a failing job cannot retry for days.
const MAX_RETRIES: i64 = 100;

/// Builds one job, reporting problems located in its file.
pub(super) struct JobCtx<'a> {
    pub(super) src: &'a Source,
    pub(super) job_line: usize,
    pub(super) vars: &'a Vars,
    pub(super) d: &'a mut Diags,
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

    /// The validated job, or None when it has errors (all reported).
    pub(super) fn build(&mut self, name: &str, raw: RawJob) -> Option<Job> {
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
        let schedule = raw.schedule.as_ref().and_then(|s| self.schedule(s));
        let continuous = raw.continuous.as_ref().and_then(|c| self.continuous(c));
        if raw.schedule.is_some() && raw.continuous.is_some() {
            let line = self.line("continuous");
            self.error(line, format!("job `{name}` has both `schedule:` and `continuous:`; keep one: a schedule fires at its cron times, a continuous job runs back to back every period"));
        }
        let clusters = self.clusters(&raw.job_clusters);
        let tasks = self.tasks(name, &raw.tasks, &clusters);
        self.unused_clusters(name, &raw.tasks, &clusters);
        let order = self.task_order(name, &raw.tasks);
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
            continuous,
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

    /// The job's schedule, checked (its expression and zone; a warning for fires in the DST
    /// hours).
    fn schedule(&mut self, s: &RawSchedule) -> Option<Schedule> {
        let line = self.line("schedule");
        let expr = self.sub("quartz_cron_expression", &s.quartz_cron_expression, line)?;
        let tz = self.sub("timezone_id", &s.timezone_id, line)?;
        match QuartzSchedule::parse(&expr, &tz) {
            Ok(cron) => {
                let in_dst_hours = cron.may_fire_in_hour(1) || cron.may_fire_in_hour(2);
                if cron.observes_dst() && in_dst_hours && !s.dst_acknowledged {
                    let line = line_of_key_from(&self.src.text, "quartz_cron_expression", line);
                    self.d.warning(&self.src.path, line, format!(
                        "`{expr}` fires between 01:00 and 03:00 local time in {tz}, where DST changes the clock: on the spring-forward day a fire time that does not exist runs once at the end of the gap, and on the fall-back day a repeated time runs once (the first); use timezone_id UTC for strictly periodic runs, or `dst_acknowledged: true` in the schedule to accept this and silence the warning"
                    ));
                }
                Some(Schedule {
                    cron,
                    pause_status: s.pause_status,
                })
            }
            Err(e) => {
                let key = match e {
                    crate::config::schedule::CronError::TimeZone { .. } => "timezone_id",
                    _ => "quartz_cron_expression",
                };
                let tz_line = line_of_key_from(&self.src.text, key, line);
                self.error(tz_line, e.to_string());
                // A bad time zone must not hide a bad expression: check it alone too.
                if key == "timezone_id" {
                    if let Err(e) = QuartzSchedule::parse(&expr, "UTC") {
                        let line = line_of_key_from(&self.src.text, "quartz_cron_expression", line);
                        self.error(line, e.to_string());
                    }
                }
                None
            }
        }
    }

    /// The job's `continuous:` block, checked (a period of at least a second, `compact_after`
    /// at least 1).
    fn continuous(&mut self, c: &RawContinuous) -> Option<Continuous> {
        let line = self.line("continuous");
        let every_text = self.sub("every", &c.every.to_string(), line)?;
        let every_line = line_of_key_from(&self.src.text, "every", line);
        let every = match humantime::parse_duration(every_text.trim()) {
            Ok(d) if d >= Duration::from_secs(1) => Some(d),
            Ok(_) => {
                self.error(
                    every_line,
                    format!("`every: {every_text}` is shorter than a second; use 1s or more"),
                );
                None
            }
            Err(e) => {
                self.error(
                    every_line,
                    format!("`every: {every_text}` is not a duration ({e}); e.g. 30s, 5m"),
                );
                None
            }
        };
        let compact_after = match &c.compact_after {
            None => Some(super::DEFAULT_COMPACT_AFTER),
            Some(v) => {
                let text = self.sub("compact_after", &v.to_string(), line)?;
                match text.trim().parse::<u64>() {
                    Ok(n) if n >= 1 => Some(n),
                    _ => {
                        let l = line_of_key_from(&self.src.text, "compact_after", line);
                        self.error(l, format!("`compact_after: {text}` must be a whole number of files, 1 or more (default {})", super::DEFAULT_COMPACT_AFTER));
                        None
                    }
                }
            }
        };
        Some(Continuous {
            every: every?,
            compact_after: compact_after?,
            pause_status: c.pause_status,
        })
    }

    /// The job's clusters, each checked once (a duplicate key is an error).
    fn clusters(&mut self, raw: &[RawJobCluster]) -> BTreeMap<String, compute::Compute> {
        let mut clusters = BTreeMap::new();
        for c in raw {
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
                    Ok(v) if key == "spill_directory" => Some(vars.locate(v.trim())),
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
        clusters
    }

    /// The job's tasks, each checked (at least one, each key once).
    fn tasks(
        &mut self,
        name: &str,
        raw: &[RawTask],
        clusters: &BTreeMap<String, compute::Compute>,
    ) -> Vec<Task> {
        if raw.is_empty() {
            let line = self.line("tasks");
            self.error(
                line,
                format!("job `{name}` has no tasks; add at least one pipeline task"),
            );
        }
        let mut tasks = Vec::new();
        let mut seen = BTreeSet::new();
        for t in raw {
            let line = self.task_line(&t.task_key);
            if !seen.insert(t.task_key.clone()) {
                self.error(
                    line,
                    format!("task `{}` is defined twice in job `{name}`", t.task_key),
                );
                continue;
            }
            if let Some(task) = self.task(t, line, clusters) {
                tasks.push(task);
            }
        }
        tasks
    }

    /// Warns about clusters no task uses.
    fn unused_clusters(
        &mut self,
        name: &str,
        raw: &[RawTask],
        clusters: &BTreeMap<String, compute::Compute>,
    ) {
        let used: BTreeSet<&str> = raw
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
    }

    /// The tasks in dependency order (empty after an error: an unknown task or a cycle).
    fn task_order(&mut self, name: &str, raw: &[RawTask]) -> Vec<String> {
        let known: BTreeSet<&str> = raw.iter().map(|t| t.task_key.as_str()).collect();
        for t in raw {
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
        match topological_order(raw) {
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
        }
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
                    // (a pipeline another one names — a dimension a gold looks up — reports
                    // its own error once, not once per pipeline that loads it)
                    let diag = pipeline_diagnostic(e, &self.src.path, pipeline_line);
                    if !self.d.errors.contains(&diag) {
                        self.d.errors.push(diag);
                    }
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
