//! What the security checks cost one job at the scheduler: `cargo bench -p htfaas-scheduler
//! --bench checks` prints one JSON line per case, `{"bench":"checks","case":..,"ns_per_job":..}`:
//!
//! - `trust`: [`UrlTrust::check`] of a submitted job's module, input and output URLs (at submit);
//! - `seal_open`: sealing both macaroons (at submit) and opening them (at dispatch)
//!   (`SealRequest::seal_request`, `SealRequest::open_request`);
//! - `doubt`: [`doubt::doubt`] of a completed report with 4 outputs (at finish);
//! - `trace`: the trace work of one job across its hops: the gateway derives the
//!   event's trace and its firing span, the scheduler parses it (validation) and derives the
//!   attempt's span at dispatch, the EP parses that once for its storage requests.
//!
//! Without `--bench` (as `cargo test --benches` runs it) every case runs a few times, untimed.

use htfaas_functions::proto::{
    EventRef, FunctionRef, InputSpec, JobReport, Outcome, OutputFile, OutputSpec, SubmitRequest, Usage,
};
use htfaas_functions::trace::TraceParent;
use htfaas_functions::{Digest, Resources};
use htfaas_scheduler::doubt::{self, Observed};
use htfaas_scheduler::seal::{SealRequest as _, Sealer};
use htfaas_scheduler::trust::UrlTrust;
use std::hint::black_box;
use std::time::Instant;

const STORAGE: &str = "https://dcache.example.org:2880";
const MODULES: &str = "https://registry.example.org";

fn request() -> SubmitRequest {
    let digest = Digest::of(b"checksum.wasm");
    let input = "/data/experiment/raw/2025/06/run-004211/detector-b/frame-000123.dat";
    // Macaroons of a realistic length (the bytes are what sealing costs, not their meaning).
    let macaroon = |n: usize| "M".repeat(n);
    SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: "checksum".into(),
            version: 3,
            module_url: format!("{MODULES}/v1/modules/{digest}"),
            digest,
            native: None,
        },
        resources: Resources::new(1, 256, 60),
        input: Some(InputSpec::new(format!("{STORAGE}{input}"), "frame-000123.dat", macaroon(340))),
        output: OutputSpec {
            url: format!("{STORAGE}/data/experiment/derived/2025/06/run-004211/"),
            macaroon: macaroon(360),
            on_failure: Default::default(),
        },
        args: vec![],
        env: vec![],
        event: EventRef::new("dcache", "0000A1B2/s1", input),
        dedupe_key: "k".into(),
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

fn report() -> JobReport {
    JobReport {
        input_sha256: None,
        job_id: "j".into(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage: Usage { wall_ms: 900, cpu_ms: 800, peak_memory_bytes: 1 << 20, ..Usage::default() },
        outputs: (0..4)
            .map(|i| OutputFile {
                path: format!("/data/experiment/derived/2025/06/run-004211/frame-000123.{i}.sum"),
                size: 64,
                sha256: "0".repeat(64),
            })
            .collect(),
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    }
}

fn time(case: &str, n: usize, timed: bool, mut f: impl FnMut()) {
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    if timed {
        let ns = started.elapsed().as_nanos() as f64 / n as f64;
        println!("{}", serde_json::json!({"bench": "checks", "case": case, "ns_per_job": ns.round()}));
    }
}

fn main() -> anyhow::Result<()> {
    let timed = std::env::args().any(|a| a == "--bench");
    let n = if timed { 200_000 } else { 10 };
    let trust = UrlTrust::new(&[STORAGE.into()], &[MODULES.into()])?;
    let req = request();
    trust.check(&req).map_err(|e| anyhow::anyhow!("{e}"))?;
    time("trust", n, timed, || {
        black_box(trust.check(black_box(&req)).is_ok());
    });
    let sealer = Sealer::from_key(&[7; 32]);
    time("seal_open", n, timed, || {
        let sealed = sealer.seal_request("job", black_box(&req)).expect("seal");
        black_box(sealer.open_request("job", sealed).expect("open"));
    });
    let seen = Observed {
        started_at_ms: Some(1_000),
        now_ms: 2_500,
        cpus: 1,
        memory_mb: 256,
        output_dir: "/data/experiment/derived/2025/06/run-004211/".into(),
        on_failure: Default::default(),
        refs: Vec::new(),
    };
    let original = report();
    time("doubt", n, timed, || {
        let mut r = original.clone();
        black_box(doubt::doubt(&mut r, &seen).is_ok());
    });
    let event_id = "dcache-billing:write:0000A1B2C3D4E5F6/door:webdav-1@webdavDomain:1795705200123";
    let job_id = "0b8f8a9e-6d3c-4f0e-9a51-3c2b7e1d5f20";
    time("trace", n, timed, || {
        let fired = TraceParent::for_event(black_box(event_id)).child("gateway.fire:checksum").to_string();
        let submitted = TraceParent::parse(black_box(&fired)).expect("parse");
        let assigned = submitted.attempt_span(black_box(job_id), 1).to_string();
        black_box(TraceParent::parse(black_box(&assigned)).expect("parse"));
    });
    Ok(())
}
