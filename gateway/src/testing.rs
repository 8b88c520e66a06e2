//! Fixtures the gateway's unit tests share: a registered function and a storage event.
//! Test-only (`#[cfg(test)]`); no module's production code uses it.

use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::manifest::{Outputs, RateLimit, Resources, Trigger};
use htfaas_functions::{Digest, FunctionManifest, FunctionRecord};

/// Function `name` (version 3, owner alice) on `/data/**`, writing into `/out/<name>/`.
pub(crate) fn function(name: &str, rate: Option<RateLimit>, debounce_s: Option<u64>) -> FunctionRecord {
    FunctionRecord {
        schema: 1,
        version: 3,
        registered_at: 0,
        manifest: FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: name.into(),
            owner: "alice".into(),
            module: Digest::of(name.as_bytes()),
            trigger: Trigger { rate, debounce_s, ..Trigger::on_path("/data/**") },
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
        },
    }
}

/// A dCache `transfer` of 7 bytes to `path`.
pub(crate) fn event(id: &str, path: &str) -> StorageEvent {
    StorageEvent {
        source: EventSource { kind: SourceKind::DcacheBilling, producer: "pool@d".into(), message: None },
        kind: EventKind::Write,
        msg_type: "transfer".into(),
        path: path.into(),
        size: Some(7),
        storage_class: None,
        owner: None,
        id: id.into(),
        time: None,
        macaroon: None,
        traceparent: None,
    }
}
