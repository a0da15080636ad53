//! The DataFusion session every query of a run shares.

use std::collections::HashMap;

use datafusion::prelude::SessionContext;
use deltalake::delta_datafusion::DeltaSessionContext;

/// Compute settings a run honours.
#[derive(Debug, Clone)]
pub struct Engine {
    /// DataFusion partitions (and so the parallelism of scans and sorts).
    pub target_partitions: usize,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            target_partitions: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
        }
    }
}

impl Engine {
    /// A fresh session with these settings, on delta-rs' defaults (its query planner is
    /// needed for streamed writes, and identifiers stay case-sensitive).
    pub fn context(&self) -> SessionContext {
        let overrides = HashMap::from([(
            "datafusion.execution.target_partitions".to_string(),
            self.target_partitions.max(1).to_string(),
        )]);
        match DeltaSessionContext::new_with_session_overrides(&overrides) {
            Ok(ctx) => ctx.into_inner(),
            Err(_) => DeltaSessionContext::new().into_inner(),
        }
    }
}
