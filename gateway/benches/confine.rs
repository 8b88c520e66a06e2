//! What the namespace checks cost a firing: `cargo bench -p htfaas-gateway --bench
//! confine` prints one JSON line per case, `{"bench":"confine","case":..,"owners":O,
//! "grants":G,"ns_per_call":..}`:
//!
//! - `firing`: what `ingest::prepare` adds before it asks for macaroons: the owner's namespace
//!   looked up among every grant of the site ([`Namespaces::of`]) and `ingest::confine` (read
//!   the input, write the outputs), for owners drawn round-robin from a site of 1,000 owners
//!   with 3 grants each, plus 100 groups;
//! - `registration`: [`htfaas_functions::namespace::Namespace::confine`] of a manifest with a
//!   glob and a rule (the rule parsed and its path bound derived), once per registration.
//!
//! Without `--bench` (as `cargo test --benches` runs it) every case runs a few times, untimed.

use htfaas_functions::manifest::{Outputs, Resources, Trigger};
use htfaas_functions::namespace::{Grant, Right};
use htfaas_functions::{FunctionManifest, FunctionRecord, Registry};
use htfaas_gateway::namespaces::Namespaces;
use std::hint::black_box;
use std::time::Instant;

const OWNERS: usize = 1_000;

fn grants() -> Vec<Grant> {
    let mut out = Vec::new();
    for i in 0..OWNERS {
        let owner = format!("owner{i}");
        out.push(Grant { principal: owner.clone(), right: Right::Read, value: format!("/data/{owner}/") });
        out.push(Grant { principal: owner.clone(), right: Right::Write, value: format!("/data/{owner}/out/") });
        out.push(Grant { principal: owner.clone(), right: Right::Annex, value: format!("annex-{i}") });
    }
    for g in 0..100 {
        out.push(Grant { principal: format!("group:g{g}"), right: Right::Read, value: format!("/data/shared/g{g}/") });
    }
    out
}

fn function(i: usize) -> FunctionRecord {
    let owner = format!("owner{i}");
    let mut trigger = Trigger::on_path(format!("/data/{owner}/raw/**"));
    trigger.rule = Some(format!(r#"path prefix "/data/{owner}/" and size > 1kB and not name suffix ".tmp""#));
    FunctionRecord {
        schema: 1,
        version: 1,
        registered_at: 0,
        manifest: FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: format!("f{i}"),
            owner: owner.clone(),
            module: htfaas_functions::Digest::of(b"m"),
            trigger,
            resources: Resources::default(),
            outputs: Outputs::into_dir(format!("/data/{owner}/out/sums/")),
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

fn main() -> anyhow::Result<()> {
    let timed = std::env::args().any(|a| a == "--bench");
    let n = if timed { 1_000_000 } else { 100 };
    let dir = tempfile::tempdir()?;
    let registry = Registry::open(dir.path())?;
    let grants = grants();
    let count = grants.len();
    let namespaces = Namespaces::load(grants, &registry)?;
    let functions: Vec<FunctionRecord> = (0..OWNERS).map(function).collect();
    let paths: Vec<String> = (0..OWNERS).map(|i| format!("/data/owner{i}/raw/run7/f{i}.h5")).collect();

    let started = Instant::now();
    for k in 0..n {
        let i = k % OWNERS;
        let f = &functions[i];
        let ns = namespaces.of(&f.manifest.owner, None);
        let replace = htfaas_gateway::jobs::confine(&ns, &f.manifest.owner, f, Some(paths[i].as_str()))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        black_box(replace);
    }
    let firing = started.elapsed();

    let m = (n / 100).max(10);
    let started = Instant::now();
    for k in 0..m {
        let f = &functions[k % OWNERS];
        let ns = namespaces.of(&f.manifest.owner, None);
        ns.confine(&f.manifest)?;
    }
    let registration = started.elapsed();
    if timed {
        for (case, elapsed, runs) in [("firing", firing, n), ("registration", registration, m)] {
            let line = serde_json::json!({
                "bench": "confine", "case": case, "owners": OWNERS, "grants": count,
                "ns_per_call": (elapsed.as_nanos() as f64 / runs as f64).round(),
            });
            println!("{line}");
        }
    }
    Ok(())
}
