//! Part 4 of `htfaas bench`: the figures of the components' own benches (scheduler dispatch,
//! EP instantiate, compute and data path, gateway ingest), gathered into [`super::Figure`]s.
//!
//! Each bench in [`BENCHES`] runs as `cargo bench -p <package> --bench <name> [-- --quick]`, a
//! child process in the workspace root: its stdout (one JSON line per figure, see each bench's
//! `//!` docs) is read line by line and turned into figures by [`figures_from_line`]; its stderr
//! (cargo's build output, the bench's narration) goes straight to ours, so progress shows. The
//! environment passes through (`HTFAAS_NATS_SERVER` for ingest's JetStream cases,
//! `HTFAAS_BENCH_QUICK`). A bench that fails is recorded in the [`Summary`]; the others still run.
//!
//! How long it takes, on the shared 2-core development machine, measured bench by bench (their
//! run alone; a first run adds the benches' release build, 2 to 9 minutes per package): dispatch
//! about 3 min with `--quick` (1,000 and 100,000 queued; not measured in full, where seeding and
//! holding a million jobs makes it longer); instantiate 2 min; compute 30 s; data path 10 s with
//! `--quick` (64 and 256 MiB; 1 GiB in full, about four times that); ingest 20 s. So about 6 min
//! with `--quick` once built.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use serde_json::{Map, Value};

use super::Figure;

/// One component bench: a `[[bench]]` target of a workspace package.
#[derive(Debug, Clone, Copy)]
pub struct ComponentBench {
    /// The bench target's name (`--bench`), also the first part of its figures' metrics.
    pub name: &'static str,
    /// Its package (`-p`).
    pub package: &'static str,
    /// Whether it knows `--quick` (smaller sizes); the others always run in full.
    pub quick: bool,
}

/// The benches gathered, in the order they run.
pub const BENCHES: &[ComponentBench] = &[
    ComponentBench { name: "dispatch", package: "htfaas-scheduler", quick: true },
    ComponentBench { name: "instantiate", package: "htfaas-ep", quick: false },
    ComponentBench { name: "compute", package: "htfaas-ep", quick: false },
    ComponentBench { name: "datapath", package: "htfaas-ep", quick: true },
    ComponentBench { name: "ingest", package: "htfaas-gateway", quick: false },
];

/// What to gather, and where.
#[derive(Debug, Clone)]
pub struct ComponentOptions {
    /// The workspace root, where `cargo bench` runs.
    pub root: PathBuf,
    /// Pass `--quick` to the benches that know it (dispatch: 100,000 queued instead of a
    /// million; data path: 64 and 256 MiB instead of 256 MiB and 1 GiB).
    pub quick: bool,
    /// Names from [`BENCHES`] to run; empty runs them all.
    pub only: Vec<String>,
}

/// How each bench went.
#[derive(Debug, Default)]
pub struct Summary {
    /// One entry per bench run, in the order they ran.
    pub runs: Vec<BenchRun>,
}

/// One bench's run.
#[derive(Debug)]
pub struct BenchRun {
    /// The bench's name.
    pub name: &'static str,
    /// How many figures it gave.
    pub figures: usize,
    /// Its wall time, build included.
    pub seconds: f64,
    /// Lines of its stdout that were no figures: skipped cases, errors, other messages.
    pub notes: Vec<String>,
    /// Why it failed (cargo not started, exit status, no figure at all); `None` when it did not.
    pub failure: Option<String>,
}

impl Summary {
    /// The runs that failed.
    pub fn failed(&self) -> impl Iterator<Item = &BenchRun> {
        self.runs.iter().filter(|r| r.failure.is_some())
    }
}

impl fmt::Display for Summary {
    /// One line per bench: `dispatch: 16 figures in 182 s`, or its failure.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.runs {
            match &r.failure {
                None => writeln!(f, "{}: {} figures in {:.0} s", r.name, r.figures, r.seconds)?,
                Some(why) => writeln!(f, "{}: FAILED after {:.0} s ({} figures): {why}", r.name, r.seconds, r.figures)?,
            }
        }
        Ok(())
    }
}

/// Runs the benches `opts` asks for, one after the other, and hands each figure to `emit` as it
/// comes. Errs only when `opts.only` names an unknown bench (before running anything); a failing
/// bench is recorded in the [`Summary`] and the next one runs.
pub fn gather(opts: &ComponentOptions, emit: &mut dyn FnMut(Figure)) -> anyhow::Result<Summary> {
    if let Some(unknown) = opts.only.iter().find(|o| !BENCHES.iter().any(|b| b.name == o.as_str())) {
        let known: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
        anyhow::bail!("no component bench {unknown:?} (known: {})", known.join(", "));
    }
    let mut summary = Summary::default();
    for bench in BENCHES.iter().filter(|b| opts.only.is_empty() || opts.only.iter().any(|o| o == b.name)) {
        let started = Instant::now();
        let mut run = BenchRun { name: bench.name, figures: 0, seconds: 0.0, notes: Vec::new(), failure: None };
        let result = run_bench(bench, opts, emit, &mut run);
        run.seconds = started.elapsed().as_secs_f64();
        run.failure = match result {
            Err(e) => Some(format!("{e:#}")),
            Ok(()) if run.figures == 0 => Some("it printed no figure".into()),
            Ok(()) => None,
        };
        if let Some(why) = &run.failure {
            eprintln!("bench: {} failed: {why}", bench.name);
        }
        summary.runs.push(run);
    }
    Ok(summary)
}

/// Runs one bench's `cargo bench`, emitting its figures and noting its other lines.
fn run_bench(
    bench: &ComponentBench,
    opts: &ComponentOptions,
    emit: &mut dyn FnMut(Figure),
    run: &mut BenchRun,
) -> anyhow::Result<()> {
    // `CARGO` is set when we run under cargo (tests, `cargo run`); otherwise the one on PATH.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let quick = opts.quick && bench.quick;
    let mut args = vec!["bench", "-p", bench.package, "--bench", bench.name];
    if quick {
        args.extend(["--", "--quick"]);
    }
    let shown = format!("cargo {}", args.join(" "));
    eprintln!("bench: running `{shown}` in {}", opts.root.display());
    let mut child = Command::new(&cargo)
        .args(&args)
        .current_dir(&opts.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("start `{shown}` ({})", cargo.to_string_lossy()))?;
    let stdout = child.stdout.take().context("the child's stdout is not piped")?;
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                // Do not leave the bench running unread.
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).with_context(|| format!("read the output of `{shown}`"));
            }
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text.trim();
        if line.is_empty() {
            continue;
        }
        let figures = figures_from_line(line);
        if figures.is_empty() {
            eprintln!("bench: {}: {line}", bench.name);
            run.notes.push(line.to_owned());
        }
        for figure in figures {
            run.figures += 1;
            emit(if quick { figure.with("quick", true) } else { figure });
        }
    }
    let status = child.wait().with_context(|| format!("wait for `{shown}`"))?;
    anyhow::ensure!(status.success(), "`{shown}` failed: {status}");
    Ok(())
}

/// Numeric fields that say what was measured, not a measurement: they go into each figure's
/// context. (`n` and `unit` become the figure's own `n` and `unit`.)
const CONTEXT: &[&str] = &[
    "queued",
    "size_mib",
    "input_mib",
    "small_mib",
    "large_mib",
    "wasm_bytes",
    "target",
    "rounds",
    "runs",
    "events",
    "firings",
    "retries",
];

/// Keys of [`Figure`] itself, which the context must not repeat.
const RESERVED: &[&str] = &["system", "metric", "value", "unit", "n"];

/// The figures of one line of a component bench's stdout; none for a line that is not a JSON
/// object with a `bench`, or that reports a case `skipped` or in `error`.
///
/// A line is either one figure, `{"bench":..,"metric":..,"value":..}` (dispatch), or holds one
/// figure per numeric field that is a measurement (all the others). The metric is
/// `<bench>[.<case>][.queued_<N>][.size_<M>mib].<metric or field>`; the unit follows the
/// field's name (`_us`, `_ms`, `_s`, `_per_s`, `mib_per_s`, `_bytes`, `ratio`, `vs_curl`, ...),
/// else the line's `unit` (instantiate's `p50`, `median`); `n` is the line's `n`, else its
/// `events`, `runs` or `rounds`, else 1. Every other field (strings, booleans and the identifying
/// numbers in `CONTEXT`) is context on each of the line's figures.
pub fn figures_from_line(line: &str) -> Vec<Figure> {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(line.trim()) else {
        return Vec::new();
    };
    if fields.contains_key("skipped") || fields.contains_key("error") {
        return Vec::new();
    }
    let Some(bench) = fields.get("bench").and_then(Value::as_str) else {
        return Vec::new();
    };
    let mut prefix = bench.to_owned();
    if let Some(case) = fields.get("case").and_then(Value::as_str) {
        prefix = format!("{prefix}.{case}");
    }
    if let Some(queued) = fields.get("queued").and_then(Value::as_u64) {
        prefix = format!("{prefix}.queued_{queued}");
    }
    if let Some(mib) = fields.get("size_mib").and_then(Value::as_u64) {
        prefix = format!("{prefix}.size_{mib}mib");
    }
    let n = ["n", "events", "runs", "rounds"].iter().find_map(|k| fields.get(*k).and_then(Value::as_u64)).unwrap_or(1);
    let line_unit = fields.get("unit").and_then(Value::as_str);

    // Dispatch's shape: the line names its one measurement.
    let named = match (fields.get("metric").and_then(Value::as_str), fields.get("value").and_then(Value::as_f64)) {
        (Some(metric), Some(value)) => Some((metric, value)),
        _ => None,
    };
    let mut measured: Vec<(&str, f64)> = named.into_iter().collect();
    let mut extra = Map::new();
    for (key, value) in &fields {
        let key = key.as_str();
        if RESERVED.contains(&key) {
            // A `value` without a `metric` is still a measurement; the rest are the figure's own.
            if let (None, "value", Some(v)) = (named, key, value.as_f64()) {
                measured.push((key, v));
            }
            continue;
        }
        match value.as_f64() {
            Some(v) if !CONTEXT.contains(&key) => measured.push((key, v)),
            _ => {
                extra.insert(key.to_owned(), value.clone());
            }
        }
    }
    measured
        .into_iter()
        .map(|(field, value)| Figure {
            system: "htfaas".into(),
            metric: format!("{prefix}.{field}"),
            value,
            unit: unit_of(field, line_unit),
            n,
            extra: extra.clone(),
        })
        .collect()
}

/// The unit of a measured field, from its name; else the line's `unit`; else `1` (a pure number).
fn unit_of(field: &str, line_unit: Option<&str>) -> String {
    let f = field;
    let unit = if f.contains("ratio") || f == "vs_curl" {
        "ratio"
    } else if f.ends_with("mib_per_s") || f.ends_with("_mib_s") {
        "MiB/s"
    } else if f.ends_with("_per_s") {
        "1/s"
    } else if f.contains("bytes_per_job") {
        "bytes/job"
    } else if f.ends_with("_bytes") {
        "bytes"
    } else if f.ends_with("ms_per_mb") {
        "ms/MB"
    } else if f.ends_with("_us") || f.starts_with("us_") {
        "us"
    } else if f == "ms" || f.ends_with("_ms") || f.starts_with("ms_") {
        "ms"
    } else if f == "seconds" || f.ends_with("_s") {
        "s"
    } else if f == "mib" || f.ends_with("_mib") {
        "MiB"
    } else if f == "mean_batch" {
        "events/batch"
    } else {
        line_unit.unwrap_or("1")
    };
    unit.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figure named `metric` among `figures`.
    fn find<'a>(figures: &'a [Figure], metric: &str) -> &'a Figure {
        figures.iter().find(|f| f.metric == metric).unwrap_or_else(|| {
            let names: Vec<&str> = figures.iter().map(|f| f.metric.as_str()).collect();
            panic!("no figure {metric} among {names:?}")
        })
    }

    fn metrics(figures: &[Figure]) -> Vec<&str> {
        let mut names: Vec<&str> = figures.iter().map(|f| f.metric.as_str()).collect();
        names.sort_unstable();
        names
    }

    // Dispatch's lines, in the exact shape of `scheduler/benches/dispatch.rs` (`bench()`).
    #[test]
    fn dispatch_lines_are_one_figure_each() {
        let f = figures_from_line(
            r#"{"bench":"dispatch","queued":1000000,"metric":"jobs_per_s","value":7712.4,"n":5000,"rounds":3}"#,
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].system, "htfaas");
        assert_eq!(f[0].metric, "dispatch.queued_1000000.jobs_per_s");
        assert_eq!((f[0].value, f[0].unit.as_str(), f[0].n), (7712.4, "1/s", 5000));
        assert_eq!(f[0].extra.get("queued"), Some(&Value::from(1_000_000)));
        assert_eq!(f[0].extra.get("rounds"), Some(&Value::from(3)));
        assert_eq!(f[0].extra.get("bench"), Some(&Value::from("dispatch")));
        // `metric`, `value` and `n` are the figure's own, never repeated as context.
        for key in RESERVED {
            assert!(!f[0].extra.contains_key(*key), "{key} in {:?}", f[0].extra);
        }

        let cases = [
            (
                r#"{"bench":"dispatch","queued":1000,"metric":"redispatch_p99_ms","value":1.204,"n":14000}"#,
                "dispatch.queued_1000.redispatch_p99_ms",
                "ms",
                14000,
            ),
            (
                r#"{"bench":"dispatch","queued":1000000,"metric":"store_bytes_per_job","value":291.3,"n":1021000}"#,
                "dispatch.queued_1000000.store_bytes_per_job",
                "bytes/job",
                1021000,
            ),
            (
                r#"{"bench":"dispatch","queued":1000000,"metric":"rss_growth_bytes","value":52428800,"n":1021000}"#,
                "dispatch.queued_1000000.rss_growth_bytes",
                "bytes",
                1021000,
            ),
            (
                r#"{"bench":"dispatch","queued":1000,"metric":"seed_s","value":0.051,"n":22000}"#,
                "dispatch.queued_1000.seed_s",
                "s",
                22000,
            ),
            (
                r#"{"bench":"dispatch","metric":"rate_ratio_large_vs_small","value":0.968}"#,
                "dispatch.rate_ratio_large_vs_small",
                "ratio",
                1,
            ),
            (
                r#"{"bench":"dispatch","metric":"rss_bytes_per_job_marginal","value":48.17}"#,
                "dispatch.rss_bytes_per_job_marginal",
                "bytes/job",
                1,
            ),
        ];
        for (line, metric, unit, n) in cases {
            let f = figures_from_line(line);
            assert_eq!(f.len(), 1, "{line}: {f:?}");
            assert_eq!((f[0].metric.as_str(), f[0].unit.as_str(), f[0].n), (metric, unit, n), "{line}");
        }
    }

    #[test]
    fn a_figure_serializes_without_repeated_keys() {
        let f = figures_from_line(
            r#"{"bench":"instantiate","case":"first_instruction.pooling","unit":"us","p50":2.950,"p90":3.144,"p99":3.660,"n":10000}"#,
        );
        let json = serde_json::to_string(&find(&f, "instantiate.first_instruction.pooling.p50")).expect("serializes");
        assert_eq!(
            json,
            r#"{"system":"htfaas","metric":"instantiate.first_instruction.pooling.p50","value":2.95,"unit":"us","n":10000,"bench":"instantiate","case":"first_instruction.pooling"}"#
        );
    }

    // Real lines of `cargo bench -p htfaas-ep --bench instantiate`.
    #[test]
    fn instantiate_lines_take_the_unit_of_the_line_for_bare_fields() {
        let f = figures_from_line(
            r#"{"bench":"instantiate","case":"run_job.checksum.component","unit":"us","p50":654.797,"p90":924.801,"p99":2289.703,"n":1417}"#,
        );
        assert_eq!(
            metrics(&f),
            [
                "instantiate.run_job.checksum.component.p50",
                "instantiate.run_job.checksum.component.p90",
                "instantiate.run_job.checksum.component.p99",
            ]
        );
        let p99 = find(&f, "instantiate.run_job.checksum.component.p99");
        assert_eq!((p99.value, p99.unit.as_str(), p99.n), (2289.703, "us", 1417));
        assert!(!p99.extra.contains_key("unit"));

        let f = figures_from_line(
            r#"{"bench":"instantiate","case":"compile.generated","unit":"ms","wasm_bytes":4047415,"median":10594.7,"ms_per_mb":2617.6,"n":5}"#,
        );
        assert_eq!(metrics(&f), ["instantiate.compile.generated.median", "instantiate.compile.generated.ms_per_mb"]);
        assert_eq!(find(&f, "instantiate.compile.generated.median").unit, "ms");
        assert_eq!(find(&f, "instantiate.compile.generated.ms_per_mb").unit, "ms/MB");
        assert!(f.iter().all(|f| f.n == 5 && f.extra.get("wasm_bytes") == Some(&Value::from(4047415))));

        let f = figures_from_line(
            r#"{"bench":"instantiate","case":"disk_cache","unit":"ms","wasm_bytes":4047415,"artifact_bytes":7336088,"compile_and_store":8188.35,"load_from_disk":33.627,"ratio":244,"n":5}"#,
        );
        assert_eq!(
            metrics(&f),
            [
                "instantiate.disk_cache.artifact_bytes",
                "instantiate.disk_cache.compile_and_store",
                "instantiate.disk_cache.load_from_disk",
                "instantiate.disk_cache.ratio",
            ]
        );
        assert_eq!(find(&f, "instantiate.disk_cache.artifact_bytes").unit, "bytes");
        assert_eq!(find(&f, "instantiate.disk_cache.load_from_disk").unit, "ms");
        assert_eq!(find(&f, "instantiate.disk_cache.ratio").unit, "ratio");

        // No `n`: the rounds (min over them) count.
        let f = figures_from_line(
            r#"{"bench":"instantiate","case":"limits.loop","unit":"ms","none_ms":359.4,"epoch_ms":478.5,"fuel_ms":462.5,"epoch_fuel_ms":564.4,"epoch_ratio":1.33,"fuel_ratio":1.29,"epoch_fuel_ratio":1.57,"rounds":7}"#,
        );
        assert_eq!(f.len(), 7, "{f:?}");
        assert_eq!(find(&f, "instantiate.limits.loop.epoch_fuel_ms").unit, "ms");
        let ratio = find(&f, "instantiate.limits.loop.epoch_fuel_ratio");
        assert_eq!((ratio.value, ratio.unit.as_str(), ratio.n), (1.57, "ratio", 7));
        assert_eq!(ratio.extra.get("rounds"), Some(&Value::from(7)));
    }

    // Real lines of `cargo bench -p htfaas-ep --bench compute`.
    #[test]
    fn compute_lines_keep_the_target_and_method_as_context() {
        let f = figures_from_line(
            r#"{"bench":"compute.calibrate","input_mib":64,"runs":5,"native_ms":446.9,"wasm_ms":593.0,"ratio":1.327,"target":1.5,"wasm_job_wall_ms":750.0,"method":"kernel only (guest clock)"}"#,
        );
        assert_eq!(
            metrics(&f),
            [
                "compute.calibrate.native_ms",
                "compute.calibrate.ratio",
                "compute.calibrate.wasm_job_wall_ms",
                "compute.calibrate.wasm_ms",
            ]
        );
        let ratio = find(&f, "compute.calibrate.ratio");
        assert_eq!((ratio.value, ratio.unit.as_str(), ratio.n), (1.327, "ratio", 5));
        assert_eq!(find(&f, "compute.calibrate.wasm_ms").unit, "ms");
        assert_eq!(ratio.extra.get("target"), Some(&Value::from(1.5)));
        assert_eq!(ratio.extra.get("input_mib"), Some(&Value::from(64)));
        assert_eq!(ratio.extra.get("method"), Some(&Value::from("kernel only (guest clock)")));

        let f = figures_from_line(
            r#"{"bench":"compute.convert","input_mib":16,"runs":5,"native_ms":796.5,"wasm_ms":2640.0,"ratio":3.315,"method":"whole run (cc -O2 process vs wasm job; glibc vs wasi-libc strtod)"}"#,
        );
        assert_eq!(metrics(&f), ["compute.convert.native_ms", "compute.convert.ratio", "compute.convert.wasm_ms"]);
        assert!(!f[0].extra.contains_key("target"));
    }

    // Real lines of `cargo bench -p htfaas-ep --bench datapath -- --quick`.
    #[test]
    fn datapath_lines_are_named_by_size() {
        let f = figures_from_line(r#"{"bench":"datapath.curl.download","mib_per_s":182.43,"ms":350,"size_mib":64}"#);
        assert_eq!(
            metrics(&f),
            ["datapath.curl.download.size_64mib.mib_per_s", "datapath.curl.download.size_64mib.ms"]
        );
        let rate = find(&f, "datapath.curl.download.size_64mib.mib_per_s");
        assert_eq!((rate.value, rate.unit.as_str(), rate.n), (182.43, "MiB/s", 1));
        assert_eq!(find(&f, "datapath.curl.download.size_64mib.ms").unit, "ms");

        let f = figures_from_line(
            r#"{"bench":"datapath.ep.upload","mib_per_s":128.9,"ms":1986,"retries":0,"size_mib":256,"vs_curl":0.31}"#,
        );
        assert_eq!(
            metrics(&f),
            [
                "datapath.ep.upload.size_256mib.mib_per_s",
                "datapath.ep.upload.size_256mib.ms",
                "datapath.ep.upload.size_256mib.vs_curl",
            ]
        );
        let vs = find(&f, "datapath.ep.upload.size_256mib.vs_curl");
        assert_eq!((vs.value, vs.unit.as_str()), (0.31, "ratio"));
        assert_eq!(vs.extra.get("retries"), Some(&Value::from(0)));
        assert_eq!(vs.extra.get("size_mib"), Some(&Value::from(256)));

        let f = figures_from_line(
            r#"{"bench":"datapath.ep.peak_rss_growth","hwm_reset":true,"mib":2.27,"size_mib":256,"wall_ms":4163}"#,
        );
        assert_eq!(
            metrics(&f),
            ["datapath.ep.peak_rss_growth.size_256mib.mib", "datapath.ep.peak_rss_growth.size_256mib.wall_ms"]
        );
        let growth = find(&f, "datapath.ep.peak_rss_growth.size_256mib.mib");
        assert_eq!((growth.value, growth.unit.as_str()), (2.27, "MiB"));
        assert_eq!(growth.extra.get("hwm_reset"), Some(&Value::from(true)));

        let f = figures_from_line(
            r#"{"bench":"datapath.ep.peak_rss_flat","flat":true,"growth_large_mib":2.27,"growth_small_mib":10.5,"large_mib":256,"small_mib":64}"#,
        );
        assert_eq!(
            metrics(&f),
            ["datapath.ep.peak_rss_flat.growth_large_mib", "datapath.ep.peak_rss_flat.growth_small_mib"]
        );
        assert!(f.iter().all(|f| f.unit == "MiB" && f.extra.get("flat") == Some(&Value::from(true))));
        assert_eq!(f[0].extra.get("large_mib"), Some(&Value::from(256)));
    }

    // Real lines of `cargo bench -p htfaas-gateway --bench ingest`.
    #[test]
    fn ingest_lines_count_their_events() {
        let f = figures_from_line(
            r#"{"bench":"ingest","case":"jetstream","events":20000,"firings":40000,"seconds":4.708,"events_per_s":4248,"publish_only_per_s":33225,"mean_batch":84.4}"#,
        );
        assert_eq!(
            metrics(&f),
            [
                "ingest.jetstream.events_per_s",
                "ingest.jetstream.mean_batch",
                "ingest.jetstream.publish_only_per_s",
                "ingest.jetstream.seconds",
            ]
        );
        let rate = find(&f, "ingest.jetstream.events_per_s");
        assert_eq!((rate.value, rate.unit.as_str(), rate.n), (4248.0, "1/s", 20000));
        assert_eq!(find(&f, "ingest.jetstream.seconds").unit, "s");
        assert_eq!(find(&f, "ingest.jetstream.mean_batch").unit, "events/batch");
        assert_eq!(rate.extra.get("firings"), Some(&Value::from(40000)));

        let f = figures_from_line(
            r#"{"bench":"ingest","case":"jetstream_lone","events":50,"firings":100,"seconds":0.110,"events_per_s":453,"ms_median":1.93,"ms_max":11.46}"#,
        );
        let median = find(&f, "ingest.jetstream_lone.ms_median");
        assert_eq!((median.value, median.unit.as_str(), median.n), (1.93, "ms", 50));
    }

    #[test]
    fn other_lines_give_no_figure() {
        for line in [
            "",
            "dispatch: ok (smoke; run `cargo bench` to time)",
            "instantiate/run_job.pooling: ok (smoke; run `cargo bench` to time)",
            r#"{"bench":"compute.convert","skipped":"no cc (gcc) installed"}"#,
            r#"{"bench":"datapath.curl","size_mib":256,"error":"curl not on PATH"}"#,
            r#"{"case":"x","p50":1.0}"#,
            r#"[1, 2, 3]"#,
            r#"{"bench":"instantiate","case":"#,
            "{\"bench\":\"x\",\"p50\":\u{fffd}}",
        ] {
            assert_eq!(figures_from_line(line), Vec::new(), "{line}");
        }
    }

    #[test]
    fn units_follow_the_field_names() {
        let cases = [
            ("events_per_s", "1/s"),
            ("mib_per_s", "MiB/s"),
            ("read_mib_s", "MiB/s"),
            ("vs_curl", "ratio"),
            ("ratio", "ratio"),
            ("p50_us", "us"),
            ("ms", "ms"),
            ("ms_median", "ms"),
            ("wasm_job_wall_ms", "ms"),
            ("seconds", "s"),
            ("seed_s", "s"),
            ("growth_large_mib", "MiB"),
            ("mib", "MiB"),
            ("artifact_bytes", "bytes"),
            ("mean_batch", "events/batch"),
        ];
        for (field, unit) in cases {
            assert_eq!(unit_of(field, Some("us")), unit, "{field}");
        }
        assert_eq!(unit_of("p50", Some("us")), "us");
        assert_eq!(unit_of("p50", None), "1");
    }

    #[test]
    fn gather_refuses_an_unknown_bench_before_running_any() {
        let opts = ComponentOptions { root: PathBuf::from("/nonexistent"), quick: true, only: vec!["dispach".into()] };
        let err = gather(&opts, &mut |f| panic!("no figure expected: {f:?}")).expect_err("unknown name");
        assert_eq!(
            err.to_string(),
            r#"no component bench "dispach" (known: dispatch, instantiate, compute, datapath, ingest)"#
        );
    }

    #[test]
    fn a_bench_that_cannot_start_is_a_failure_not_an_error() {
        // A root that does not exist: the child cannot start there, whatever cargo is.
        let opts = ComponentOptions {
            root: PathBuf::from("/nonexistent/htfaas"),
            quick: false,
            only: vec!["ingest".into(), "compute".into()],
        };
        let summary = gather(&opts, &mut |f| panic!("no figure expected: {f:?}")).expect("a summary");
        let names: Vec<&str> = summary.runs.iter().map(|r| r.name).collect();
        assert_eq!(names, ["compute", "ingest"], "in BENCHES order");
        assert_eq!(summary.failed().count(), 2);
        let why = summary.runs[0].failure.as_deref().expect("a failure");
        assert!(why.starts_with("start `cargo bench -p htfaas-ep --bench compute`"), "{why}");
        assert!(summary.to_string().contains("ingest: FAILED after"), "{summary}");
    }
}
