//! A pipeline's definition, as its target records it: the settings that give the target's rows
//! their meaning (an aggregate's time zone, measures, `where`, ...), each fingerprinted into a
//! Delta application transaction (`tidemark/<pipeline>/definition/<setting>`) written in the
//! same commit as the data. A later run compares the pipeline file with what the target
//! recorded, and refuses an incremental run when a setting changed: the days it would restate
//! would mean something else than the days it would leave, and one table would hold two
//! meanings. Settings that only steer the runs (lookback, schedule, finality) are not part of it.
//!
//! A target written before definitions were recorded has none: the first run records them.

use deltalake::kernel::Transaction;
use deltalake::{DeltaTable, DeltaTableError};

/// The settings that define a target's rows, each with its canonical text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Definition {
    settings: Vec<(String, String)>,
    /// Settings added to tidemark after others were recorded, whose value before was "off"
    /// (the empty text): on a target that recorded a definition without them, unrecorded means
    /// off, so turning one on is a change.
    newer: Vec<String>,
}

impl Definition {
    /// Adds `setting` (as the pipeline file names it) with its canonical text.
    pub fn with(mut self, setting: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((setting.into(), value.into()));
        self
    }

    /// Adds a setting introduced after targets were already recording definitions; its empty
    /// text means "off", what every target written before it had.
    pub fn with_newer(mut self, setting: impl Into<String>, value: impl Into<String>) -> Self {
        let setting = setting.into();
        self.newer.push(setting.clone());
        self.with(setting, value)
    }

    /// The transactions recording this definition, for a commit of `pipeline_app`'s target.
    pub fn transactions(&self, pipeline_app: &str) -> Vec<Transaction> {
        self.settings
            .iter()
            .map(|(s, v)| Transaction::new(app_id(pipeline_app, s), fingerprint(v)))
            .collect()
    }

    /// The settings whose recorded fingerprint differs from this definition's (a setting the
    /// target never recorded is not a change: it was written before it was recorded).
    pub async fn changed(
        &self,
        table: &DeltaTable,
        pipeline_app: &str,
    ) -> Result<Vec<String>, DeltaTableError> {
        let snapshot = table.snapshot()?;
        let store = table.log_store();
        let recorded = futures::future::try_join_all(self.settings.iter().map(|(s, _)| {
            let id = app_id(pipeline_app, s);
            let store = store.clone();
            async move { snapshot.transaction_version(store.as_ref(), &id).await }
        }))
        .await?;
        let any_recorded = recorded.iter().any(Option::is_some);
        Ok(self
            .settings
            .iter()
            .zip(recorded)
            .filter(|((s, v), r)| match r {
                Some(r) => *r != fingerprint(v),
                None => any_recorded && !v.is_empty() && self.newer.contains(s),
            })
            .map(|((s, _), _)| s.clone())
            .collect())
    }
}

fn app_id(pipeline_app: &str, setting: &str) -> String {
    format!("{pipeline_app}/definition/{setting}")
}

/// FNV-1a over the text, folded to a non-negative i64 (a `txn` version): stable across builds.
fn fingerprint(text: &str) -> i64 {
    crate::lake::record::table_fingerprint(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_has_its_own_transaction_and_fingerprint() {
        let d = Definition::default()
            .with("where", "amount > 0")
            .with("event_date.time_zone", "Europe/Amsterdam");
        let t = d.transactions("tidemark/daily");
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].app_id, "tidemark/daily/definition/where");
        assert_ne!(t[0].version, t[1].version);
        assert_eq!(t[0].version, fingerprint("amount > 0"));
        assert!(t.iter().all(|t| t.version >= 0));
    }
}
