//! The phases of a run, named once: a timing, an error's phase and a failpoint name cannot
//! disagree (a misspelt phase does not compile, and so cannot silently disable a fault test).

/// A step of a run. The first seven are timed (`phases_ms` in the summary, in this order); the
/// others only name where an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Open the tables, choose the mode, decide what to read.
    Plan,
    /// Read the source rows the plan selected.
    Read,
    /// Split rows into valid, rejected (quarantined) and deferred (sequence in the future).
    Validate,
    /// Keep the newest version per key.
    Dedup,
    /// Compare the winners with the target and prepare the files a commit would add.
    Compare,
    /// Commit to the target (incremental runs).
    Commit,
    /// Write and commit the whole target (bootstrap, full reload).
    Write,
    /// Read the target's watermark (part of planning).
    Watermark,
    /// Store rejected rows in the quarantine table (part of validation).
    Quarantine,
    /// Recompute the target for `tidemark reconcile`.
    Reconcile,
}

impl Phase {
    /// The timed phases in the order a run executes them (the text summary lists them so).
    pub const TIMED: &'static [Phase] = &[
        Phase::Plan,
        Phase::Read,
        Phase::Validate,
        Phase::Dedup,
        Phase::Compare,
        Phase::Commit,
        Phase::Write,
    ];

    /// The name in summaries, error messages and failpoint names.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Read => "read",
            Phase::Validate => "validate",
            Phase::Dedup => "dedup",
            Phase::Compare => "compare",
            Phase::Commit => "commit",
            Phase::Write => "write",
            Phase::Watermark => "watermark",
            Phase::Quarantine => "quarantine",
            Phase::Reconcile => "reconcile",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
