//! Part of `htfaas bench`: what a job's end costs the stack beyond running it — the
//! job-end notification published on JetStream, and the job's spans exported over OTLP.
//!
//! The same no-op throughput run ([`super::e2e::throughput`]) on three stacks, one after the
//! other, each twice in the order A B C A B C (so a drift of the shared machine's load falls on
//! all three alike):
//!
//! - `_ends_quiet`: the scheduler has no NATS to publish on (`nats_url` null). Its outbox row is
//!   still written, by a trigger, in the transaction that ends the job: that part is always paid;
//! - `_ends_told`: the default, every job's end published on `htfaas.jobs.…` (read from the
//!   outbox, published, the PubAck awaited, the row deleted);
//! - `_ends_traced`: the same, and every ended job's spans exported to an OTLP/HTTP collector on
//!   loopback (which answers at once).
//!
//! The figures: each run's throughput and CPU per event per process (as every throughput run
//! emits), then `end_costs.*`: the mean over both runs of each stack of the scheduler's and the
//! whole stack's CPU per event, and the differences (told − quiet: what publishing costs; traced
//! − told: what exporting costs), in microseconds per job. The tracing that is always on
//! (deriving the ids at each hop, the phases) is not toggled; its CPU is in the scheduler's
//! `checks` bench (case `trace`).
//!
//! Must not know: the CLI.

use super::Figure;
use super::e2e::{Bench, Modules, throughput};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What the part needs.
pub struct CostOptions<'a> {
    /// The `htfaas` binary.
    pub htfaas: &'a Path,
    /// nats-server, when not the default.
    pub nats_binary: Option<std::path::PathBuf>,
    /// The EP's cores.
    pub workers: u32,
    /// Warm-up before each window.
    pub warmup: Duration,
    /// Each run's measured window.
    pub window: Duration,
}

/// A collector on loopback that answers every OTLP/HTTP export at once: its URL and the count
/// of exports it received.
async fn collector() -> anyhow::Result<(String, Arc<AtomicU64>)> {
    let got = Arc::new(AtomicU64::new(0));
    let counted = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}/v1/traces"), got))
}

/// Runs the part, emitting each run's figures and then `end_costs.*`.
pub async fn run(opts: &CostOptions<'_>, modules: &Modules, emit: &mut dyn FnMut(Figure)) -> anyhow::Result<()> {
    let (endpoint, exports) = collector().await?;
    let stacks: [(&str, serde_json::Value); 3] = [
        ("_ends_quiet", serde_json::json!({ "nats_url": null })),
        ("_ends_told", serde_json::json!({})),
        ("_ends_traced", serde_json::json!({ "otlp_endpoint": endpoint })),
    ];
    // (label, scheduler ms/event, htfaas ms/event), per run.
    let mut seen: Vec<(&str, f64, f64)> = Vec::new();
    for round in 0..2 {
        for (label, overrides) in &stacks {
            eprintln!("bench: end costs {label} (round {}): no-op throughput for {:?}", round + 1, opts.window);
            let overrides = overrides.as_object().cloned().unwrap_or_default();
            let mut bench = Bench::start_with(
                modules,
                opts.htfaas,
                &[opts.workers],
                htfaas_functions::store::Durability::Log,
                opts.nats_binary.clone(),
                overrides,
            )
            .await?;
            let mut figures = Vec::new();
            let result =
                throughput(&mut bench, "noop", 1024, label, opts.warmup, opts.window, &mut |f| figures.push(f)).await;
            let stopped = bench.stop().await;
            result?;
            stopped?;
            let per = |who: &str| {
                let metric = format!("throughput_noop{label}.cpu_ms_per_event.{who}");
                figures.iter().find(|f| f.metric == metric).map(|f| f.value)
            };
            if let (Some(s), Some(h)) = (per("scheduler"), per("htfaas")) {
                seen.push((label, s, h));
            }
            for f in figures {
                emit(f.with("round", round + 1));
            }
        }
    }
    let runs = |label: &str| seen.iter().filter(|r| r.0 == label).count() as u64;
    for who in ["scheduler", "htfaas"] {
        let mean = |label: &str| {
            let v: Vec<f64> =
                seen.iter().filter(|r| r.0 == label).map(|r| if who == "scheduler" { r.1 } else { r.2 }).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let (Some(quiet), Some(told), Some(traced)) = (mean("_ends_quiet"), mean("_ends_told"), mean("_ends_traced"))
        else {
            continue;
        };
        for (stack, v) in [("quiet", quiet), ("told", told), ("traced", traced)] {
            let n = runs(&format!("_ends_{stack}"));
            emit(Figure::new("htfaas", format!("end_costs.{stack}.cpu_us_per_job.{who}"), v * 1e3, "us", n));
        }
        emit(Figure::new("htfaas", format!("end_costs.notify.cpu_us_per_job.{who}"), (told - quiet) * 1e3, "us", 2));
        emit(Figure::new("htfaas", format!("end_costs.otlp.cpu_us_per_job.{who}"), (traced - told) * 1e3, "us", 2));
    }
    emit(Figure::new(
        "htfaas",
        "end_costs.otlp_exports_received",
        exports.load(Ordering::Relaxed) as f64,
        "requests",
        1,
    ));
    Ok(())
}
