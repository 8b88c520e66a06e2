//! Compiled trigger rules: which registered functions a storage event fires.

use htfaas_functions::event::{EventKind, StorageEvent};
use htfaas_functions::{FunctionRecord, Registry, RegistryError};
use std::sync::{Arc, RwLock};

/// A function with its compiled glob.
pub struct Compiled {
    /// The registered function (latest version).
    pub record: FunctionRecord,
    matcher: globset::GlobMatcher,
}

/// The latest version of every function, compiled; swapped whole on reload.
#[derive(Default)]
pub struct TriggerCache {
    compiled: RwLock<Arc<Vec<Compiled>>>,
}

impl TriggerCache {
    /// Recompiles from the registry. Called at start and after each registration.
    pub fn reload(&self, registry: &Registry) -> Result<(), RegistryError> {
        let mut compiled = Vec::new();
        for record in registry.list()? {
            match htfaas_functions::proto::compile_glob(&record.manifest.trigger.path) {
                Ok(matcher) => compiled.push(Compiled { record, matcher }),
                // Manifests are validated on registration; a stored bad glob is a bug, not fatal.
                Err(e) => tracing::error!(function = %record.manifest.name, "stored trigger does not compile: {e}"),
            }
        }
        *self.compiled.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(compiled);
        Ok(())
    }

    /// Every function whose trigger matches `event`, in name order.
    pub fn matching(&self, event: &StorageEvent) -> Vec<FunctionRecord> {
        if event.kind != EventKind::Write {
            return Vec::new();
        }
        let all = self.compiled.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.iter().filter(|c| c.matcher.is_match(&event.path)).map(|c| c.record.clone()).collect()
    }
}
