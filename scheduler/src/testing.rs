//! Fixtures the scheduler's unit tests share: a submit request with real macaroons, a new job,
//! the default retry rule. Test-only (`#[cfg(test)]`); no module's production code uses it.

use crate::queue::{Loss, NewJob};
use htfaas_functions::Digest;
use htfaas_functions::Resources;
use htfaas_functions::macaroon::{RootKey, mint};
use htfaas_functions::proto::{EventRef, FunctionRef, InputSpec, JobAssignment, OutputSpec, SubmitRequest};

/// A real macaroon, as the storage would mint it.
pub(crate) fn macaroon(activity: &str, path: &str) -> String {
    let caveats = [format!("activity:{activity}"), format!("path:{path}")];
    mint(&RootKey::derive(b"queue-test-root"), "loc", "id", &caveats).expect("mint")
}

pub(crate) fn request(key: &str) -> SubmitRequest {
    SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: "checksum".into(),
            version: 1,
            digest: Digest::of(b"m"),
            module_url: "http://registry/v1/modules/x".into(),
            native: None,
        },
        resources: Resources::new(1, 64, 60),
        input: Some(InputSpec::new("http://storage/data/raw/a", "a", macaroon("DOWNLOAD", "/data/raw/a"))),
        output: OutputSpec {
            url: "http://storage/data/out/".into(),
            macaroon: macaroon("UPLOAD", "/data/out"),
            on_failure: Default::default(),
        },
        args: vec![],
        env: vec![],
        event: EventRef::new("dcache", key, "/data/raw/a"),
        dedupe_key: key.into(),
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    }
}

pub(crate) fn new_job(key: &str, jti: &str, jobs: u32) -> NewJob {
    NewJob {
        request: request(key),
        owner: "alice".into(),
        jti: jti.into(),
        issuer: "gw".into(),
        group: None,
        jobs,
        exp: u64::MAX,
        max_idle: None,
        class: None,
        hold: None,
    }
}

/// The retry rule of the tests that do not look at it.
pub(crate) const LOSS: Loss = Loss::Ep { max_retries: 2, backoff_ms: 0 };

pub(crate) fn ok(a: JobAssignment, _bind: bool) -> Result<JobAssignment, String> {
    Ok(a)
}
