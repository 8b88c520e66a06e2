//! `htfaas bench`, `htfaas crash-test` (`--long`: [`htfaas::crash::long`]) and `htfaas overload`:
//! the measuring and checking harnesses of the library ([`htfaas::bench`], [`htfaas::crash`],
//! [`htfaas::overload`]), each on a stack of its own. Must not know: how their figures and reports are printed ([`super::output`]).

use super::output;
use anyhow::Context as _;
use htfaas_functions::store::Durability;
use std::path::PathBuf;
use std::time::Duration;

// The flags of `htfaas bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Fewer events, 3 s windows, a shorter peer run, no component benches: under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Skip the peer (and the ratios).
    #[arg(long)]
    pub no_peer: bool,
    /// Skip the run with an fsync behind every acknowledgement.
    #[arg(long)]
    pub no_fsync: bool,
    /// Also gather the components' own benches (`cargo bench`; the default without --quick).
    #[arg(long, conflicts_with = "no_components")]
    pub components: bool,
    /// Skip the components' own benches.
    #[arg(long)]
    pub no_components: bool,
    /// EP cores and Parsl workers.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Latency samples, htfaas and peer (default 1000; --quick 150).
    #[arg(long)]
    pub events: Option<usize>,
    /// Throughput window in seconds (default 60; --quick 3).
    #[arg(long)]
    pub window_s: Option<u64>,
    /// Skip the throughput runs with other EP shapes (2 EPs; one EP per core, twice over).
    #[arg(long)]
    pub no_scaling: bool,
    /// Skip what a job's end costs (notifications, OTLP export: three stacks, twice each).
    #[arg(long)]
    pub no_end_costs: bool,
    /// The fair-ingest run's flood: one owner's events before another owner's one (default
    /// 100000; --quick 10000; 0 skips it).
    #[arg(long)]
    pub flood: Option<u64>,
    /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
    /// The native guests' numpy base image (default: .tools/images/python3-numpy.tar, which
    /// the test command builds; the native figures are skipped without one, or with --no-native).
    #[arg(long)]
    pub numpy_image: Option<PathBuf>,
    /// Skip the native guests' figures.
    #[arg(long, conflicts_with = "native_only")]
    pub no_native: bool,
    /// Only the native guests' figures (as root: bubblewrap, cgroups) and the peer's numpy task.
    #[arg(long)]
    pub native_only: bool,
}

// The flags of `htfaas crash-test`.
#[derive(clap::Args)]
pub struct CrashTestArgs {
    /// Events in the stream.
    #[arg(long, default_value_t = 10_000)]
    pub events: u64,
    /// Events published per second.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
    /// Rounds of kills (each kills every component once).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Seed of the kill order, moments and down times (default: the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Instead of the stream, one long job through a scheduler restart, an EP link cut,
    /// attach-token renewals and a move to another EP from its checkpoint; its output is
    /// checked against an uninterrupted run's. Prints each interruption and what it cost.
    #[arg(long, conflicts_with_all = ["events", "rate", "rounds", "seed", "workers"])]
    pub long: bool,
    /// With --long: the job's steps, one a second (default 150).
    #[arg(long, requires = "long")]
    pub steps: Option<u64>,
    /// fsync behind every acknowledgement, instead of JetStream's own `log` durability.
    #[arg(long)]
    pub fsync: bool,
    /// EP cores.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Keep the state in this directory (default: a temporary one, kept only on failure).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
}

// The flags of `htfaas cluster-test`.
#[derive(clap::Args)]
pub struct ClusterTestArgs {
    /// Events in the stream.
    #[arg(long, default_value_t = 2_000)]
    pub events: u64,
    /// Events published per second.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
    /// Seconds the stream may take to drain after the last event.
    #[arg(long, default_value_t = 180)]
    pub drain_timeout_s: u64,
    /// Keep the state in this directory (default: a temporary one, kept only on failure).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
}

// The flags of `htfaas overload`.
#[derive(clap::Args)]
pub struct OverloadArgs {
    /// Events in the flood.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// EP cores.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Seconds to go on measuring after the other owner's job ended.
    #[arg(long, default_value_t = 20)]
    pub after_s: u64,
    /// Keep the state in this directory.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
}

/// `htfaas bench`.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let BenchArgs {
        quick,
        no_peer,
        no_fsync,
        components,
        no_components,
        workers,
        events,
        window_s,
        no_scaling,
        no_end_costs,
        flood,
        nats_server,
        numpy_image,
        no_native,
        native_only,
    } = args;
    let exe = std::env::current_exe().context("find this binary")?;
    let mut opts = htfaas::bench::BenchOptions::new(env!("CARGO_MANIFEST_DIR"), exe, quick);
    let default_image = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/images/python3-numpy.tar");
    opts.numpy_image = match numpy_image {
        Some(image) => Some(image),
        None if no_native => None,
        None if default_image.is_file() => Some(default_image),
        None if native_only => anyhow::bail!("--native-only needs --numpy-image (or {})", default_image.display()),
        None => {
            eprintln!("bench: no numpy image at {}: native figures skipped", default_image.display());
            None
        }
    };
    opts.native_only = native_only;
    opts.scaling = !no_scaling;
    opts.end_costs = !no_end_costs;
    opts.flood = flood;
    opts.peer = !no_peer;
    opts.fsync = !no_fsync;
    opts.components = (components || !quick) && !no_components;
    opts.workers = workers;
    opts.events = events;
    opts.window = window_s.map(std::time::Duration::from_secs);
    opts.nats_binary = nats_server;
    let started = std::time::Instant::now();
    // A SIGINT or SIGTERM drops the run, and with it each stack it started: its components
    // are killed, nats-server stopped, its directory removed (the peer's Python, read
    // synchronously, is waited for first).
    let stop = super::signals::on_signals();
    let mut emit = |f: &htfaas::bench::Figure| output::bench_figure(f);
    let figures = tokio::select! {
        figures = htfaas::bench::run(&opts, &mut emit) => figures?,
        () = stop.cancelled() => anyhow::bail!("interrupted; the stacks the bench started are stopped"),
    };
    output::bench_done(figures.len(), started.elapsed());
    Ok(())
}

/// `htfaas crash-test`.
pub async fn crash_test(args: CrashTestArgs) -> anyhow::Result<()> {
    let CrashTestArgs { events, rate, rounds, seed, long, steps, fsync, workers, keep, nats_server } = args;
    let exe = std::env::current_exe().context("find this binary")?;
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release");
    let durability = if fsync { Durability::Fsync } else { Durability::Log };
    if long {
        let mut opts = htfaas::crash::long::LongOptions::new(exe, wasm);
        opts.steps = steps.unwrap_or(opts.steps);
        opts.durability = durability;
        opts.dir = keep;
        opts.nats_binary = nats_server;
        let stop = super::signals::on_signals();
        let report = tokio::select! {
            report = htfaas::crash::long::run(opts) => report?,
            () = stop.cancelled() => anyhow::bail!("interrupted; the stack the harness started is stopped"),
        };
        output::report(&report);
        anyhow::ensure!(report.passed(), "the long-job harness found a problem (above)");
        return Ok(());
    }
    let mut opts = htfaas::crash::CrashOptions::new(exe, wasm);
    opts.events = events;
    opts.rate = rate;
    opts.rounds = rounds;
    opts.seed = seed.unwrap_or(opts.seed);
    opts.durability = durability;
    opts.workers = workers;
    opts.dir = keep;
    opts.nats_binary = nats_server;
    // As in `bench`: a signal drops the run and the stack it started.
    let stop = super::signals::on_signals();
    let report = tokio::select! {
        report = htfaas::crash::run(opts) => report?,
        () = stop.cancelled() => anyhow::bail!("interrupted; the stack the harness started is stopped"),
    };
    output::report(&report);
    anyhow::ensure!(report.passed(), "the crash harness found a problem (above)");
    Ok(())
}

/// `htfaas cluster-test`.
pub async fn cluster_test(args: ClusterTestArgs) -> anyhow::Result<()> {
    let ClusterTestArgs { events, rate, drain_timeout_s, keep, nats_server } = args;
    let opts = htfaas::cluster::ClusterOptions {
        htfaas: std::env::current_exe().context("find this binary")?,
        nats_binary: nats_server,
        wasm_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release"),
        events,
        rate,
        dir: keep,
        drain_timeout: Duration::from_secs(drain_timeout_s),
    };
    let report = tokio::task::spawn_blocking(move || htfaas::cluster::run(opts)).await??;
    output::report(&report);
    anyhow::ensure!(report.passed(), "the multi-host harness found a problem (above)");
    Ok(())
}

/// `htfaas overload`.
pub async fn overload(args: OverloadArgs) -> anyhow::Result<()> {
    let OverloadArgs { events, workers, after_s, keep, nats_server } = args;
    let report = htfaas::overload::run(htfaas::overload::OverloadOptions {
        htfaas: std::env::current_exe().context("find this binary")?,
        nats_binary: nats_server,
        wasm_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release"),
        flood: events,
        workers,
        after: Duration::from_secs(after_s),
        dir: keep,
    })
    .await?;
    output::report(&report);
    Ok(())
}
