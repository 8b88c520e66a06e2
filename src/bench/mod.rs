//! `htfaas bench`: the whole path measured on the real stack, with the peer (Parsl's
//! HighThroughputExecutor) measured on the same machine in the same run, and the components'
//! own benches gathered. One JSON line per figure on stdout ([`Figure`]); progress on stderr.
//!
//! See `BENCHMARKS.md` for what each figure means and the last results.

pub mod components;
pub mod costs;
pub mod e2e;
pub mod native;
pub mod peer;

use serde::{Deserialize, Serialize};

/// One measured figure: `{system, metric, value, unit, n}` plus optional context fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Who was measured: `htfaas`, `parsl-htex`, or `ratio` for htfaas/peer comparisons.
    pub system: String,
    /// What was measured (`event_to_output_p50`, `dispatch.queued_1000000.jobs_per_s`, ...).
    pub metric: String,
    /// The figure.
    pub value: f64,
    /// Its unit (`ms`, `us`, `events/s`, `bytes`, `ratio`, ...).
    pub unit: String,
    /// How many samples (events, jobs, runs) it is computed from.
    pub n: u64,
    /// Context (mode, target, queue size, ...).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Figure {
    /// A figure without context fields.
    pub fn new(system: &str, metric: impl Into<String>, value: f64, unit: &str, n: u64) -> Figure {
        Figure {
            system: system.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
            n,
            extra: serde_json::Map::new(),
        }
    }

    /// Adds a context field.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Figure {
        self.extra.insert(key.into(), value.into());
        self
    }
}

/// Tokio workers in each component process of the bench's stack, unless `TOKIO_WORKER_THREADS`
/// is set for the bench (then each component inherits that).
///
/// The bench runs the four components, nats-server and itself on one machine (two cores here),
/// as a single small site would. A runtime per process with a worker per core puts eight
/// workers on two cores, and every job's wake-ups then bounce between them: with one worker
/// each, the stack switched 24 % fewer times per event and spent 15 % less CPU on it, in every
/// process (BENCHMARKS.md). A host that runs one component keeps tokio's default.
pub const COMPONENT_ASYNC_THREADS: usize = 1;

/// [`COMPONENT_ASYNC_THREADS`], or `None` when the bench's own environment chooses.
pub(crate) fn component_async_threads() -> Option<usize> {
    std::env::var_os("TOKIO_WORKER_THREADS").is_none().then_some(COMPONENT_ASYNC_THREADS)
}

/// What `htfaas bench` runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Fewer events and shorter windows: the whole run under a minute.
    pub quick: bool,
    /// Run the peer (Parsl HTEX) and print the ratios.
    pub peer: bool,
    /// Also run with every acknowledgement fsynced (JetStream `sync_interval: always`, SQLite
    /// `synchronous=FULL`, uploads fsynced).
    pub fsync: bool,
    /// Gather the components' own benches ([`components`]).
    pub components: bool,
    /// EP cores, and Parsl workers: the same number on both sides.
    pub workers: u32,
    /// Latency samples, on both sides (default 1,000; quick 150).
    pub events: Option<usize>,
    /// Throughput window (default 60 s; quick 3 s).
    pub window: Option<std::time::Duration>,
    /// Throughput with other EP shapes of the same cores: 2 EPs of `workers` cores, and
    /// `2 × workers` EPs of 1 core (the scheduler and gateway must not be the wall).
    pub scaling: bool,
    /// What a job's end costs: notifications and OTLP export, A/B on three stacks ([`costs`]).
    pub end_costs: bool,
    /// The fair-ingest run ([`crate::overload`]): one owner's flood of this many events, then
    /// another owner's one event (default 100,000; quick 10,000; 0 skips it).
    pub flood: Option<u64>,
    /// The `htfaas` binary that runs each component as its own process.
    pub htfaas: std::path::PathBuf,
    /// The workspace root (`bench/peer/`, `examples/`, `cargo bench`).
    pub root: std::path::PathBuf,
    /// nats-server binary (default: [`crate::nats::find_binary`]).
    pub nats_binary: Option<std::path::PathBuf>,
    /// The native guests' figures ([`native`]) with this numpy base image; `None` skips them.
    pub numpy_image: Option<std::path::PathBuf>,
    /// Only the native guests' figures (and their peer).
    pub native_only: bool,
}

impl BenchOptions {
    /// Defaults for the workspace at `root`.
    pub fn new(
        root: impl Into<std::path::PathBuf>,
        htfaas: impl Into<std::path::PathBuf>,
        quick: bool,
    ) -> BenchOptions {
        BenchOptions {
            quick,
            scaling: true,
            end_costs: true,
            flood: None,
            htfaas: htfaas.into(),
            peer: true,
            fsync: true,
            components: !quick,
            workers: 2,
            events: None,
            window: None,
            root: root.into(),
            nats_binary: None,
            numpy_image: None,
            native_only: false,
        }
    }
}

/// The 1-minute load average and the number of cores, as context of the run.
fn machine() -> (f64, u64) {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
    (load, cpus)
}

/// A figure of `figures` by system and metric.
fn find(figures: &[Figure], system: &str, metric: &str) -> Option<f64> {
    figures.iter().find(|f| f.system == system && f.metric == metric).map(|f| f.value)
}

/// htfaas/peer ratios, each with its target: `(metric, htfaas figure, peer figure, target,
/// whether the target is an upper bound)`.
const RATIOS: [(&str, &str, &str, f64, bool); 4] = [
    ("event_to_output_p50_vs_parsl_noop_p50", "event_to_output_p50", "noop_latency_p50", 1.0, true),
    ("event_to_output_1mib_p50_vs_parsl_file_task_p50", "event_to_output_1mib_p50", "file_task_latency_p50", 1.0, true),
    ("throughput_noop_vs_parsl_noop", "throughput_noop", "noop_throughput", 5.0, false),
    ("throughput_checksum_vs_parsl_noop", "throughput_checksum", "noop_throughput", 3.0, false),
];

/// Ratios of htfaas figures to each other, each with its target: `(metric, figure, base
/// figure, target, whether the target is an upper bound)`. fsync durability within 2× of
/// `log`; the throughput holds with other EP shapes of the same cores.
const SELF_RATIOS: [(&str, &str, &str, f64, bool); 3] = [
    ("throughput_noop_log_vs_fsync", "throughput_noop", "throughput_noop_fsync", 2.0, true),
    ("throughput_noop_eps_2x_vs_1", "throughput_noop_eps_2x", "throughput_noop", 0.9, false),
    ("throughput_noop_eps_1core_vs_1", "throughput_noop_eps_1core", "throughput_noop", 0.9, false),
];

/// Absolute targets: `(metric, figure, target, whether it is an upper bound, unit)`.
const ABSOLUTE: [(&str, &str, f64, bool, &str); 5] = [
    ("event_to_output_p99_le_10ms", "event_to_output_p99", 10.0, true, "ms"),
    ("cpu_ms_per_noop_event_le_1ms", "throughput_noop.cpu_ms_per_event.htfaas", 1.0, true, "ms"),
    ("fair_ingest_other_owner_start_le_1s", "overload.other_owner_event_to_start", 1000.0, true, "ms"),
    ("api_p99_under_flood_le_50ms", "overload.api_registry_p99", 50.0, true, "ms"),
    ("api_proxied_p99_under_flood_le_50ms", "overload.api_accounting_p99", 50.0, true, "ms"),
];

/// The native guests' numpy figures against the peer's same function (no target: what a
/// sandbox per run costs, against workers that keep numpy imported).
fn native_ratios(figures: &[Figure]) -> Vec<Figure> {
    let mut out = Vec::new();
    for (metric, ours, theirs) in [
        (
            "native.numpy_event_to_output_p50_vs_parsl_numpy_task_p50",
            "native.numpy_event_to_output_p50",
            "numpy_task_latency_p50",
        ),
        (
            "native.numpy_handler_event_to_output_p50_vs_parsl_numpy_task_p50",
            "native.numpy_handler_event_to_output_p50",
            "numpy_task_latency_p50",
        ),
        (
            "native.numpy_event_to_output_cold_vs_parsl_numpy_task_first",
            "native.numpy_event_to_output_cold",
            "numpy_task_first",
        ),
    ] {
        let (Some(a), Some(b)) = (find(figures, "htfaas", ours), find(figures, "parsl-htex", theirs)) else { continue };
        if b > 0.0 {
            out.push(
                Figure::new("ratio", metric, (a / b * 1000.0).round() / 1000.0, "ratio", 1)
                    .with("htfaas", a)
                    .with("peer", b),
            );
        }
    }
    out
}

/// The ratios of `figures` (htfaas against the peer) and the absolute targets.
pub fn ratios(figures: &[Figure]) -> Vec<Figure> {
    let mut out = Vec::new();
    for (metric, ours, theirs, target, upper) in RATIOS {
        let (Some(a), Some(b)) = (find(figures, "htfaas", ours), find(figures, "parsl-htex", theirs)) else { continue };
        out.extend(ratio(metric, ("htfaas", a), ("peer", b), target, upper));
    }
    out.extend(targets(figures));
    out
}

/// The htfaas figures judged against their own targets (no peer needed): `SELF_RATIOS` and
/// `ABSOLUTE`.
pub fn targets(figures: &[Figure]) -> Vec<Figure> {
    let mut out = Vec::new();
    for (metric, ours, base, target, upper) in SELF_RATIOS {
        let (Some(a), Some(b)) = (find(figures, "htfaas", ours), find(figures, "htfaas", base)) else { continue };
        out.extend(ratio(metric, (ours, a), (base, b), target, upper));
    }
    for (metric, figure, target, upper, unit) in ABSOLUTE {
        let Some(v) = find(figures, "htfaas", figure) else { continue };
        out.push(judged(Figure::new("target", metric, v, unit, 1), target, upper));
    }
    out
}

/// The ratio `a ÷ b` as the figure `metric` (both operands named in it), judged against
/// `target`; none when `b` is not positive.
fn ratio(metric: &str, (a_name, a): (&str, f64), (b_name, b): (&str, f64), target: f64, upper: bool) -> Option<Figure> {
    if b <= 0.0 {
        return None;
    }
    let r = (a / b * 1000.0).round() / 1000.0;
    Some(judged(Figure::new("ratio", metric, r, "ratio", 1).with(a_name, a).with(b_name, b), target, upper))
}

/// `f` with its `target` (an upper bound when `upper`, else a lower one) and whether its value
/// `met` it.
fn judged(f: Figure, target: f64, upper: bool) -> Figure {
    let met = if upper { f.value <= target } else { f.value >= target };
    f.with("target", format!("{} {target}", if upper { "<=" } else { ">=" })).with("met", met)
}

/// Runs everything `opts` asks for, emitting each figure as it is measured; returns them all.
pub async fn run(opts: &BenchOptions, out: &mut dyn FnMut(&Figure)) -> anyhow::Result<Vec<Figure>> {
    use std::time::Duration;
    let figures = std::cell::RefCell::new(Vec::new());
    let mut emit = |f: Figure| {
        out(&f);
        figures.borrow_mut().push(f);
    };
    let (load, cpus) = machine();
    emit(Figure::new("machine", "cpus", cpus as f64, "cores", 1).with("loadavg_1m_at_start", load));
    if let Some(image) = &opts.numpy_image {
        eprintln!("bench: native guests: sandbox start, 2 cores, numpy compute, numpy events");
        let nopts = native::NativeOptions {
            numpy_image: image.clone(),
            events: opts.events.unwrap_or(if opts.quick { 20 } else { 100 }),
            root: opts.root.clone(),
            nats_binary: opts.nats_binary.clone(),
            peer: opts.peer,
        };
        native::run(&nopts, &mut |f| emit(f)).await?;
        let native = native_ratios(&figures.borrow());
        for f in native {
            emit(f);
        }
    }
    if opts.native_only {
        return Ok(figures.into_inner());
    }

    let modules = e2e::Modules::load(&opts.root.join("examples/target/wasm32-wasip1/release"))?;
    let events = opts.events.unwrap_or(if opts.quick { 150 } else { 1000 });
    let window = opts.window.unwrap_or(Duration::from_secs(if opts.quick { 3 } else { 60 }));
    let warmup = if opts.quick { Duration::from_secs(1) } else { Duration::from_secs(5) };
    let big = if opts.quick { 20 } else { 200 };

    // JetStream's default durability: every hop has written the work to its log.
    eprintln!("bench: htfaas, durability log: latency over {events} events, then throughput for {window:?} each");
    let one = [opts.workers];
    let mut bench = e2e::Bench::start(
        &modules,
        &opts.htfaas,
        &one,
        htfaas_functions::store::Durability::Log,
        opts.nats_binary.clone(),
    )
    .await?;
    let result = async {
        e2e::latency(&mut bench, events, 20, 1024, "", &mut emit).await?;
        e2e::latency(&mut bench, big, 3, 1 << 20, "_1mib", &mut emit).await?;
        e2e::throughput(&mut bench, "noop", 1024, "", warmup, window, &mut emit).await?;
        e2e::throughput(&mut bench, "checksum", 1024, "", warmup, window, &mut emit).await?;
        anyhow::Ok(())
    }
    .await;
    let stopped = bench.stop().await;
    result?;
    stopped?;

    if opts.fsync {
        // An fsync behind every acknowledgement, JetStream's included.
        let fsync_events = (events / 4).max(20);
        eprintln!("bench: htfaas, durability fsync: latency over {fsync_events} events, throughput for {window:?}");
        let mut bench = e2e::Bench::start(
            &modules,
            &opts.htfaas,
            &one,
            htfaas_functions::store::Durability::Fsync,
            opts.nats_binary.clone(),
        )
        .await?;
        let result = async {
            e2e::latency(&mut bench, fsync_events, 10, 1024, "_fsync", &mut emit).await?;
            e2e::throughput(&mut bench, "noop", 1024, "_fsync", warmup, window, &mut emit).await?;
            anyhow::Ok(())
        }
        .await;
        let stopped = bench.stop().await;
        result?;
        stopped?;
    }

    if opts.scaling {
        // The same cores in other shapes: two EPs of `workers` cores, then `2 × workers` EPs of
        // one core each (twice the slots of the first run: the EPs are not the wall then).
        let shapes = [("_eps_2x", vec![opts.workers; 2]), ("_eps_1core", vec![1; 2 * opts.workers as usize])];
        for (label, eps) in shapes {
            eprintln!("bench: htfaas, durability log, EPs of {eps:?} cores: no-op throughput for {window:?}");
            let mut bench = e2e::Bench::start(
                &modules,
                &opts.htfaas,
                &eps,
                htfaas_functions::store::Durability::Log,
                opts.nats_binary.clone(),
            )
            .await?;
            let result = e2e::throughput(&mut bench, "noop", 1024, label, warmup, window, &mut emit).await;
            let stopped = bench.stop().await;
            result?;
            stopped?;
        }
    }

    if opts.end_costs {
        let copts = costs::CostOptions {
            htfaas: &opts.htfaas,
            nats_binary: opts.nats_binary.clone(),
            workers: opts.workers,
            warmup,
            window,
        };
        costs::run(&copts, &modules, &mut emit).await?;
    }

    let flood = opts.flood.unwrap_or(if opts.quick { 10_000 } else { 100_000 });
    if flood > 0 {
        eprintln!("bench: fair ingest: one owner's flood of {flood} events, then another owner's one event");
        let r = crate::overload::run(crate::overload::OverloadOptions {
            htfaas: opts.htfaas.clone(),
            nats_binary: opts.nats_binary.clone(),
            wasm_dir: opts.root.join("examples/target/wasm32-wasip1/release"),
            flood,
            workers: opts.workers,
            after: Duration::from_secs(1),
            dir: None,
        })
        .await?;
        for (metric, value, unit, n) in [
            ("overload.other_owner_event_to_submitted", r.bob_submitted_ms as f64, "ms", 1),
            ("overload.other_owner_event_to_start", r.bob_started_ms as f64, "ms", 1),
            ("overload.api_registry_p99", r.api_registry.p99, "ms", r.api_registry.n as u64),
            ("overload.api_accounting_p99", r.api_accounting.p99, "ms", r.api_accounting.n as u64),
        ] {
            emit(Figure::new("htfaas", metric, value, unit, n).with("flood", flood));
        }
    }

    if opts.peer {
        eprintln!("bench: the peer, Parsl HTEX with {} workers", opts.workers);
        let root = opts.root.clone();
        let (workers, quick) = (opts.workers, opts.quick);
        // The same number of latency samples on both sides; quick: a shorter throughput run.
        let n_throughput = opts.quick.then_some(1000);
        let peer = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            peer::run(&root, workers, quick, Some(events), n_throughput, &mut |f| got.push(f)).map(|_| got)
        })
        .await
        .map_err(|e| anyhow::anyhow!("the peer's task: {e}"))??;
        for f in peer {
            emit(f);
        }
        let ratios = ratios(&figures.borrow());
        for f in ratios {
            emit(f);
        }
    } else {
        let targets = targets(&figures.borrow());
        for f in targets {
            emit(f);
        }
    }

    if opts.components {
        eprintln!("bench: the components' own benches (cargo bench)");
        let copts = components::ComponentOptions { root: opts.root.clone(), quick: opts.quick, only: Vec::new() };
        let got = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            components::gather(&copts, &mut |f| got.push(f)).map(|summary| (got, summary))
        })
        .await
        .map_err(|e| anyhow::anyhow!("the components' task: {e}"))??;
        for f in got.0 {
            emit(f);
        }
    }
    Ok(figures.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pair_each_figure_with_the_peer_and_judge_the_target() {
        let figures = vec![
            Figure::new("htfaas", "event_to_output_p50", 3.0, "ms", 1000),
            Figure::new("htfaas", "event_to_output_p99", 12.0, "ms", 1000),
            Figure::new("htfaas", "throughput_noop", 2000.0, "events/s", 100),
            Figure::new("parsl-htex", "noop_latency_p50", 4.0, "ms", 1000),
            Figure::new("parsl-htex", "noop_throughput", 500.0, "tasks/s", 20000),
        ];
        let r = ratios(&figures);
        let get = |m: &str| r.iter().find(|f| f.metric == m).unwrap_or_else(|| panic!("no {m} in {r:?}"));
        let lat = get("event_to_output_p50_vs_parsl_noop_p50");
        assert_eq!(lat.value, 0.75);
        assert_eq!(lat.extra["met"], true);
        let tp = get("throughput_noop_vs_parsl_noop");
        assert_eq!(tp.value, 4.0);
        assert_eq!(tp.extra["met"], false, "4x is short of 5x");
        let p99 = get("event_to_output_p99_le_10ms");
        assert_eq!(p99.extra["met"], false);
        assert!(r.iter().all(|f| f.metric != "throughput_checksum_vs_parsl_noop"), "no figure, no ratio");
    }

    #[test]
    fn targets_judge_htfaas_against_itself_without_the_peer() {
        let figures = vec![
            Figure::new("htfaas", "throughput_noop", 1000.0, "events/s", 100),
            Figure::new("htfaas", "throughput_noop_fsync", 400.0, "events/s", 100),
            Figure::new("htfaas", "throughput_noop_eps_2x", 950.0, "events/s", 100),
            Figure::new("htfaas", "throughput_noop_eps_1core", 800.0, "events/s", 100),
            Figure::new("htfaas", "throughput_noop.cpu_ms_per_event.htfaas", 0.8, "ms", 100),
            Figure::new("htfaas", "overload.other_owner_event_to_start", 1500.0, "ms", 1),
        ];
        let t = targets(&figures);
        let get = |m: &str| t.iter().find(|f| f.metric == m).unwrap_or_else(|| panic!("no {m} in {t:?}"));
        assert_eq!(get("throughput_noop_log_vs_fsync").value, 2.5);
        assert_eq!(get("throughput_noop_log_vs_fsync").extra["met"], false, "fsync more than 2x slower");
        assert_eq!(get("throughput_noop_eps_2x_vs_1").extra["met"], true, "0.95 holds");
        assert_eq!(get("throughput_noop_eps_1core_vs_1").extra["met"], false, "0.8 does not hold");
        assert_eq!(get("cpu_ms_per_noop_event_le_1ms").extra["met"], true);
        assert_eq!(get("fair_ingest_other_owner_start_le_1s").extra["met"], false);
        assert!(t.iter().all(|f| f.metric != "api_p99_under_flood_le_50ms"), "no figure, no target");
    }

    #[test]
    fn a_peer_line_parses_as_a_figure_with_its_context() {
        let line = r#"{"system":"parsl-htex","metric":"workers","value":2,"unit":"workers","n":0,"parsl_version":"2026.10.26"}"#;
        let f: Figure = serde_json::from_str(line).expect("parses");
        assert_eq!(f.value, 2.0);
        assert_eq!(f.extra["parsl_version"], "2026.10.26");
        let back = serde_json::to_value(&f).expect("json");
        assert_eq!(back["parsl_version"], "2026.10.26", "context is flattened back");
    }
}
