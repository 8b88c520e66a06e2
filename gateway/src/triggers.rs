//! Compiled triggers: which registered functions a storage event fires.
//!
//! Each function's trigger (its path glob, its rule, or both: [`htfaas_functions::trigger`]) is
//! compiled once, when the registry changes, into one [`Rule`]; every event is then evaluated
//! against every rule. Rules may overlap: each is evaluated independently, and one event fires
//! every function whose rule is true, once each (fan-out). A rule that is undefined for the
//! event (it tests a size, storage class or owner the event lacks) does not fire. A function
//! scheduled on no file ([`htfaas_functions::Trigger::on_no_file`]) has no rule: no event fires
//! it, and no lane reads for it.

use htfaas_functions::event::StorageEvent;
use htfaas_functions::trigger::Rule;
use htfaas_functions::{FunctionRecord, Registry, RegistryError};
use std::sync::{Arc, RwLock};

/// A function with its compiled trigger.
pub struct Compiled {
    /// The registered function (its live version: pinned, or the latest).
    pub record: FunctionRecord,
    /// Its trigger as one rule; none for a function scheduled on no file.
    rule: Option<Rule>,
    /// Whether it fires: a disabled function's matches are only counted.
    enabled: bool,
}

/// The live version of every function not deleted, compiled, in name order; swapped whole
/// on reload.
#[derive(Default)]
pub struct TriggerCache {
    compiled: RwLock<Arc<Vec<Compiled>>>,
}

impl TriggerCache {
    /// Recompiles from the registry. Called at start and after each change to a function.
    pub fn reload(&self, registry: &Registry) -> Result<(), RegistryError> {
        let mut compiled = Vec::new();
        // `statuses` is in name order, and so is the cache.
        for status in registry.statuses()? {
            let (record, enabled) = (status.record, status.enabled);
            if record.manifest.trigger.on_no_file() {
                compiled.push(Compiled { record, rule: None, enabled });
                continue;
            }
            match record.manifest.trigger.compile() {
                Ok(rule) => compiled.push(Compiled { record, rule: Some(rule), enabled }),
                // Manifests are validated on registration; a stored bad trigger is a bug, not fatal.
                Err(e) => tracing::error!(function = %record.manifest.name, "stored trigger does not compile: {e}"),
            }
        }
        *self.compiled.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(compiled);
        Ok(())
    }

    /// The owners of the registered functions, each with the directories its functions'
    /// triggers are bounded to ([`Rule::bound_dirs`]: every path a trigger can fire on lies
    /// under one), or `None` when one of its triggers bounds
    /// no path. What each owner's ingest lane reads (`crate::lanes`). A function scheduled on
    /// no file is read for by no lane: an owner with only such functions has none.
    pub fn owner_dirs(&self) -> std::collections::BTreeMap<String, Option<Vec<String>>> {
        let all = self.compiled.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut owners: std::collections::BTreeMap<String, Option<Vec<String>>> = Default::default();
        for c in all.iter() {
            let Some(rule) = &c.rule else { continue };
            let dirs = owners.entry(c.record.manifest.owner.clone()).or_insert_with(|| Some(Vec::new()));
            match (rule.bound_dirs(), dirs.as_mut()) {
                (Some(bound), Some(dirs)) => dirs.extend(bound),
                _ => *dirs = None,
            }
        }
        owners
    }

    /// Every enabled function whose trigger is true for `event`, in name order: all of them,
    /// however their rules overlap. A scheduled function fires on its ticks, never on an event.
    pub fn matching(&self, event: &StorageEvent) -> Vec<FunctionRecord> {
        let all = self.compiled.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.iter()
            .filter(|c| c.enabled && c.record.manifest.trigger.schedule.is_none())
            .filter(|c| c.rule.as_ref().is_some_and(|r| r.matches(event)))
            .map(|c| c.record.clone())
            .collect()
    }

    /// The enabled functions with a schedule, in name order (`crate::schedules`).
    pub fn scheduled(&self) -> Vec<FunctionRecord> {
        let all = self.compiled.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.iter()
            .filter(|c| c.enabled && c.record.manifest.trigger.schedule.is_some())
            .map(|c| c.record.clone())
            .collect()
    }

    /// The disabled functions whose trigger is true for `event` (and which `keep` keeps): what
    /// would have fired. Only disabled functions' rules are evaluated.
    pub fn disabled_matching(&self, event: &StorageEvent, keep: impl Fn(&FunctionRecord) -> bool) -> usize {
        let all = self.compiled.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.iter()
            .filter(|c| !c.enabled && c.record.manifest.trigger.schedule.is_none() && keep(&c.record))
            .filter(|c| c.rule.as_ref().is_some_and(|r| r.matches(event)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::event::{EventKind, EventSource, SourceKind};
    use htfaas_functions::manifest::{Outputs, Resources, Trigger};
    use htfaas_functions::{Digest, FunctionManifest};

    fn manifest(name: &str, module: Digest, trigger: Trigger) -> FunctionManifest {
        FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: name.into(),
            owner: "alice".into(),
            module,
            trigger,
            resources: Resources::default(),
            outputs: Outputs::into_dir(format!("/out/{name}/")),
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
            limits: Default::default(),
            group: None,
            secrets: Default::default(),
            webhook: None,
            max_concurrent: None,
            inputs: Default::default(),
            vacate_s: None,
            checkpoint: None,
        }
    }

    fn event(kind: EventKind, path: &str, size: Option<u64>) -> StorageEvent {
        StorageEvent {
            source: EventSource { kind: SourceKind::DcacheBilling, producer: "pool@d".into(), message: None },
            kind,
            msg_type: "transfer".into(),
            path: path.into(),
            size,
            storage_class: None,
            owner: None,
            macaroon: None,
            id: format!("dcache-billing:transfer:{path}"),
            time: None,
            traceparent: None,
        }
    }

    #[test]
    fn one_event_fires_every_overlapping_rule_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::open(dir.path()).expect("open");
        let module = registry.put_module(b"\0asm\x01\0\0\0").expect("put");
        for (name, trigger) in [
            ("zeta", Trigger::on_path("/data/**")),
            ("alpha", Trigger::on_rule(r#"path suffix ".h5" and size > 1MB"#)),
            ("mid", Trigger { rule: Some(r#"not name glob "*.tmp""#.into()), ..Trigger::on_path("/data/raw/**") }),
            ("removes", Trigger::on_rule(r#"kind == "remove" and path prefix "/data/""#)),
        ] {
            registry.register(manifest(name, module.clone(), trigger)).expect("register");
        }
        let cache = TriggerCache::default();
        cache.reload(&registry).expect("reload");
        let names =
            |e: &StorageEvent| -> Vec<String> { cache.matching(e).into_iter().map(|r| r.manifest.name).collect() };
        let big = event(EventKind::Write, "/data/raw/a.h5", Some(2_000_000));
        assert_eq!(names(&big), ["alpha", "mid", "zeta"]);
        let small = event(EventKind::Write, "/data/raw/a.h5", Some(10));
        assert_eq!(names(&small), ["mid", "zeta"]);
        // Unknown size: `size > 1MB` is undefined, and undefined does not fire.
        assert_eq!(names(&event(EventKind::Write, "/data/raw/a.h5", None)), ["mid", "zeta"]);
        assert_eq!(names(&event(EventKind::Write, "/data/raw/a.tmp", Some(10))), ["zeta"]);
        assert_eq!(names(&event(EventKind::Write, "/elsewhere/a.h5", Some(2_000_000))), ["alpha"]);
        // Rules that name no kind fire only on writes.
        assert_eq!(names(&event(EventKind::Remove, "/data/raw/a.h5", Some(2_000_000))), ["removes"]);
        assert!(names(&event(EventKind::Read, "/data/raw/a.h5", Some(2_000_000))).is_empty());
    }

    /// A function scheduled on no file is in the schedule loop's list, fires on no event (not
    /// even one with no path) and makes its owner no lane.
    #[test]
    fn a_schedule_on_no_file_fires_on_no_event_and_no_lane_reads_for_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::open(dir.path()).expect("open");
        let module = registry.put_module(b"\0asm\x01\0\0\0").expect("put");
        let nightly = Trigger { schedule: Some("0 3 * * *".into()), ..Trigger::on_path("") };
        let mut summary = manifest("summary", module.clone(), nightly);
        summary.owner = "bob".into();
        registry.register(summary).expect("register");
        registry.register(manifest("raw", module, Trigger::on_path("/data/raw/**"))).expect("register");
        let cache = TriggerCache::default();
        cache.reload(&registry).expect("reload");
        let scheduled: Vec<String> = cache.scheduled().into_iter().map(|r| r.manifest.name).collect();
        assert_eq!(scheduled, ["summary"]);
        for path in ["/data/raw/a", "/out/summary/x", ""] {
            let fired: Vec<String> =
                cache.matching(&event(EventKind::Write, path, Some(1))).into_iter().map(|r| r.manifest.name).collect();
            assert!(!fired.contains(&"summary".to_owned()), "{path:?}: {fired:?}");
            assert_eq!(cache.disabled_matching(&event(EventKind::Write, path, Some(1)), |_| true), 0);
        }
        let owners = cache.owner_dirs();
        assert!(!owners.contains_key("bob"), "no lane for an owner scheduled on no file alone: {owners:?}");
        assert_eq!(owners.get("alice"), Some(&Some(vec!["/data/raw/".to_owned()])));
    }
}
