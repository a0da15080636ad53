//! The phases of a run: named once, so a timing, an error's phase and a failpoint name cannot
//! disagree (a misspelt phase does not compile, and so cannot silently disable a fault test).

use std::collections::BTreeMap;
use std::time::Instant;

use tracing::info;

use super::RunError;
use crate::config::pipeline::Kind;
pub use crate::phase::Phase;

/// Which family of failpoints a run hits: `incremental.*` or `full_reload.*` (bootstrap and
/// full reload share the whole-source path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Incremental,
    FullReload,
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Incremental => "incremental",
            Path::FullReload => "full_reload",
        }
    }

    /// The failpoint at the end of `phase`: `<path>.after_<phase>`.
    pub fn after(self, phase: Phase) -> String {
        format!("{}.after_{phase}", self.as_str())
    }

    /// The failpoint just before `phase` starts: `<path>.before_<phase>`.
    pub fn before(self, phase: Phase) -> String {
        format!("{}.before_{phase}", self.as_str())
    }
}

/// Times the phases of one run.
#[derive(Debug)]
pub struct Timer {
    started: Instant,
    phase_started: Instant,
    ms: BTreeMap<String, u64>,
}

impl Default for Timer {
    fn default() -> Self {
        Timer {
            started: Instant::now(),
            phase_started: Instant::now(),
            ms: BTreeMap::new(),
        }
    }
}

impl Timer {
    /// Records `phase`'s time; the end of a phase is where fault-injection tests stop a run
    /// (failpoint `<kind>.<path>.after_<phase>`, e.g. `cdc_merge.incremental.after_read`).
    pub fn end(&mut self, phase: Phase, kind: Kind, path: Path) -> Result<(), RunError> {
        let ms = self.phase_started.elapsed().as_millis() as u64;
        info!(phase = phase.as_str(), ms, "phase done");
        *self.ms.entry(phase.as_str().to_string()).or_default() += ms;
        self.phase_started = Instant::now();
        crate::failpoint::hit(&format!("{}.{}", kind.as_str(), path.after(phase)))?;
        Ok(())
    }

    /// Milliseconds since the run started.
    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The phases' milliseconds, by name.
    pub fn into_ms(self) -> BTreeMap<String, u64> {
        self.ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failpoint_names_are_built_from_phases() {
        assert_eq!(
            Path::Incremental.after(Phase::Read),
            "incremental.after_read"
        );
        assert_eq!(
            Path::FullReload.after(Phase::Write),
            "full_reload.after_write"
        );
        assert_eq!(
            Path::Incremental.before(Phase::Commit),
            "incremental.before_commit"
        );
    }

    #[test]
    fn the_timer_adds_up_a_phase_that_runs_twice() {
        let mut t = Timer::default();
        t.end(Phase::Compare, Kind::CdcMerge, Path::Incremental)
            .expect("no failpoint armed");
        t.end(Phase::Compare, Kind::CdcMerge, Path::Incremental)
            .expect("no failpoint armed");
        let ms = t.into_ms();
        assert_eq!(ms.len(), 1);
        assert!(ms.contains_key("compare"));
    }
}
