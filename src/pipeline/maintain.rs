//! Maintaining a pipeline's tables: expired tombstones removed (a merge with `deletes.retain`),
//! small files compacted, a checkpoint written and unreferenced files vacuumed within the
//! retention — the target and its companion tables together. `tidemark maintain` runs it on
//! request; continuous runs ([`crate::jobs::continuous`]) run it whenever a pipeline's tables
//! grew by enough files.

use chrono::{DateTime, Utc};

use crate::config::pipeline::{CdcMerge, Spec, DEFAULT_ROW_GROUP_ROWS};
use crate::config::Pipeline;
use crate::error::{Classify, ErrorClass};
use crate::lake::{self, LakeError, MaintainError, MaintainOptions, MaintainReport};
use crate::merge::tombstones::Expired;
use crate::run::{RunError, Table};

/// Why maintaining a pipeline's tables failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Lake(#[from] LakeError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Maintain(#[from] MaintainError),
}

impl Classify for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Error::Lake(e) => e.class(),
            Error::Run(e) => e.class(),
            Error::Maintain(e) => e.class(),
        }
    }
}

/// What is maintained: a pipeline's target (a merge's with its file size, keys and tombstones)
/// and its companion tables, or one table by URI.
#[derive(Debug, Clone)]
pub struct Tables {
    pub uri: String,
    merge: Option<CdcMerge>,
    companions: Vec<(Table, String)>,
    file_size: Option<u64>,
    cluster_keys: Option<Vec<String>>,
    row_group_rows: usize,
}

impl Tables {
    /// One table by URI, with no pipeline's settings.
    pub fn table(uri: &str) -> Self {
        Tables {
            uri: uri.to_string(),
            merge: None,
            companions: Vec::new(),
            file_size: None,
            cluster_keys: None,
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
        }
    }

    /// `pipeline`'s target and companion tables.
    pub fn of(pipeline: &Pipeline) -> Self {
        let mut t = Tables::table(pipeline.target_uri());
        t.companions = super::companions(pipeline);
        if let Spec::CdcMerge(m) = &pipeline.spec {
            t.file_size = Some(m.target_file_size);
            t.cluster_keys = Some(m.keys.clone());
            t.row_group_rows = m.target_row_group_rows;
            t.merge = Some(m.clone());
        }
        t
    }

    /// Every table maintained, the target first.
    pub fn uris(&self) -> Vec<&str> {
        std::iter::once(self.uri.as_str())
            .chain(self.companions.iter().map(|(_, u)| u.as_str()))
            .collect()
    }

    /// Whether the target is a pipeline's (a missing one is then a missing target).
    pub fn is_pipeline_target(&self) -> bool {
        self.file_size.is_some()
    }
}

/// How to maintain.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Compact small files (else checkpoint and vacuum only).
    pub compact: bool,
    /// Vacuum files unreferenced for longer than this; `None` = the table's retention.
    pub retention: Option<std::time::Duration>,
    /// Report what would be done; change nothing.
    pub dry_run: bool,
}

/// What maintaining did.
#[derive(Debug)]
pub struct Maintained {
    pub uri: String,
    /// The target's report.
    pub report: MaintainReport,
    /// Tombstones removed from a merge's target, and its `deletes.retain`.
    pub tombstones: Option<(Expired, Option<std::time::Duration>)>,
    /// Each companion table that exists, with its report.
    pub companions: Vec<(Table, String, MaintainReport)>,
}

/// Maintains `tables`; `now` dates the tombstones' horizon.
pub async fn maintain(
    tables: &Tables,
    opts: Options,
    now: DateTime<Utc>,
) -> Result<Maintained, Error> {
    let role = if tables.is_pipeline_target() {
        "target"
    } else {
        "table"
    };
    let uri = &tables.uri;
    let mut table = lake::open_required(uri, role).await?;
    let version_before = table.version();
    // Expired tombstones first (`deletes.retain`): the compaction then packs what they leave.
    let tombstones = match &tables.merge {
        Some(m) => {
            let ctx = lake::session::context();
            let expired =
                crate::merge::tombstones::expire(&ctx, table.clone(), m, now, opts.dry_run).await?;
            if expired.as_ref().is_some_and(|e| e.target_version.is_some()) {
                table = lake::open_required(uri, role).await?;
            }
            expired.map(|e| (e, m.deletes.as_ref().and_then(|d| d.retain)))
        }
        None => None,
    };
    let mut report = lake::maintain(
        table,
        &MaintainOptions {
            compact: opts.compact,
            target_file_size: tables.file_size,
            cluster_keys: tables.cluster_keys.clone(),
            row_group_rows: tables.row_group_rows,
            retention: opts.retention,
            dry_run: opts.dry_run,
        },
    )
    .await?;
    // The tombstone removal is a commit of its own, before the compaction's: the versions say
    // so (a dry run predicts it; the files it rewrites are not in the prediction).
    report.version_before = version_before;
    if tombstones
        .as_ref()
        .is_some_and(|(e, _)| opts.dry_run && e.tombstones > 0)
    {
        report.version_after = report.version_after.map(|v| v + 1);
        report.checkpoint_version = report.checkpoint_version.map(|v| v + 1);
    }
    // The pipeline's other tables (an ingest's record index, an aggregate's status and
    // adjustments) get a file per run: compacted and checkpointed with the target.
    let mut companions = Vec::new();
    for (role, uri) in &tables.companions {
        if let Some(t) = lake::open_if_exists(uri).await? {
            let options = MaintainOptions {
                compact: opts.compact,
                target_file_size: None,
                cluster_keys: None,
                row_group_rows: DEFAULT_ROW_GROUP_ROWS,
                retention: opts.retention,
                dry_run: opts.dry_run,
            };
            companions.push((*role, uri.clone(), lake::maintain(t, &options).await?));
        }
    }
    Ok(Maintained {
        uri: uri.clone(),
        report,
        tombstones,
        companions,
    })
}
