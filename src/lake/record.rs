//! What a target records about the source it was built from, in its own commits.
//!
//! Three Delta application transactions (`txn` actions) per pipeline, written in the same commit
//! as the data, so they survive checkpoints and log cleanup and are restored by `restore`:
//!
//! - `tidemark/<pipeline>`: the source version the run read. The next run reads every file the
//!   source added after it.
//! - `tidemark/<pipeline>/source_table`: a fingerprint of the source's table id (`metaData.id`).
//!   A source deleted and recreated at the same location (or replaced) gets a new id, and its
//!   version numbers say nothing about what the target has seen: the next run refuses.
//! - `tidemark/<pipeline>/deferred_floor`: the smallest sequence (µs) of the rows the run left
//!   for later because they were dated in the future ([`NO_DEFERRED`] when none). Later runs read
//!   the source from there on whatever the watermark, so a row deferred by a wrong clock is never
//!   lost when the recorded source version moves past its file.
//!
//! A `txn` carries one integer; the table id is a UUID, so its fingerprint is the first 63 bits
//! of a hash of the id's text. Two different ids colliding is a 1 in 2^63 event.

use deltalake::kernel::Transaction;
use deltalake::{DeltaTable, DeltaTableError};

/// The value of the deferred-floor transaction when the run deferred nothing.
pub const NO_DEFERRED: i64 = i64::MAX;

/// What the target's commits recorded for one pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceRecord {
    /// Source version read by the last committed run (`-1`: read nothing yet, after a restore).
    pub version: Option<i64>,
    /// Fingerprint of the source's table id; `None` for targets written before it was recorded.
    pub table: Option<i64>,
    /// Smallest sequence among rows still deferred, in µs; `None` when there are none.
    pub deferred_floor: Option<i64>,
}

/// The application ids under which `pipeline_app` (`tidemark/<name>`) records its facts.
pub fn app_ids(pipeline_app: &str) -> [String; 3] {
    [
        pipeline_app.to_string(),
        format!("{pipeline_app}/source_table"),
        format!("{pipeline_app}/deferred_floor"),
    ]
}

/// The fingerprint of a table id, as recorded.
pub fn table_fingerprint(table_id: &str) -> i64 {
    // FNV-1a, 64 bits, folded to a non-negative i64: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table_id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// The table id of `table` (`metaData.id`).
pub fn table_id(table: &DeltaTable) -> Result<String, DeltaTableError> {
    Ok(table.snapshot()?.metadata().id().to_string())
}

/// Reads what `table` recorded for `pipeline_app`.
pub async fn read(table: &DeltaTable, pipeline_app: &str) -> Result<SourceRecord, DeltaTableError> {
    let snapshot = table.snapshot()?;
    let store = table.log_store();
    let [version_app, table_app, floor_app] = app_ids(pipeline_app);
    // Each look-up replays the log for `txn` actions (off the async threads): run them at once.
    let (version, table_fp, floor) = futures::try_join!(
        snapshot.transaction_version(store.as_ref(), &version_app),
        snapshot.transaction_version(store.as_ref(), &table_app),
        snapshot.transaction_version(store.as_ref(), &floor_app),
    )?;
    let floor = floor.filter(|f| *f != NO_DEFERRED);
    Ok(SourceRecord {
        version,
        table: table_fp,
        deferred_floor: floor,
    })
}

/// The transactions a commit writes for `pipeline_app`.
pub fn transactions(pipeline_app: &str, record: &SourceRecord) -> Vec<Transaction> {
    let [version_app, table_app, floor_app] = app_ids(pipeline_app);
    let mut out = vec![Transaction::new(version_app, record.version.unwrap_or(-1))];
    if let Some(fp) = record.table {
        out.push(Transaction::new(table_app, fp));
    }
    out.push(Transaction::new(
        floor_app,
        record.deferred_floor.unwrap_or(NO_DEFERRED),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable_and_distinct() {
        let a = table_fingerprint("5d8b0a39-2f3c-4e57-9d1a-0c1f6c2b7e11");
        let b = table_fingerprint("5d8b0a39-2f3c-4e57-9d1a-0c1f6c2b7e12");
        assert!(a >= 0 && b >= 0);
        assert_ne!(a, b);
        assert_eq!(a, table_fingerprint("5d8b0a39-2f3c-4e57-9d1a-0c1f6c2b7e11"));
    }

    #[test]
    fn transactions_carry_every_fact() {
        let txns = transactions(
            "tidemark/p",
            &SourceRecord {
                version: Some(7),
                table: Some(42),
                deferred_floor: None,
            },
        );
        let pairs: Vec<(String, i64)> =
            txns.iter().map(|t| (t.app_id.clone(), t.version)).collect();
        assert_eq!(
            pairs,
            vec![
                ("tidemark/p".to_string(), 7),
                ("tidemark/p/source_table".to_string(), 42),
                ("tidemark/p/deferred_floor".to_string(), NO_DEFERRED),
            ]
        );
    }
}
