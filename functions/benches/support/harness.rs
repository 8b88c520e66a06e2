//! The timing loop shared by htfaas's benches (`functions/benches/tokens.rs`,
//! `storage/benches/macaroons.rs`, which includes this file by path): warm-up, then samples
//! until a time budget or a sample cap, one JSON line per figure. In smoke mode (without
//! `--bench`, as `cargo test --benches` runs it) each case runs once and nothing is timed.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Untimed calls before measuring (caches, branch predictors, lazy statics, allocator).
const WARMUP: Duration = Duration::from_millis(200);
/// Measuring stops after this long (once `MIN_SAMPLES` are in) ...
const BUDGET: Duration = Duration::from_millis(1000);
/// ... or after this many samples.
const MAX_SAMPLES: usize = 10_000;
const MIN_SAMPLES: usize = 100;
/// A sample lasts at least about this long, so the clock's own cost stays below 1%.
const MIN_SAMPLE_NS: u128 = 5_000;

/// Runs and times the cases named on the command line (all when none is named).
pub struct Harness {
    timed: bool,
    filters: Vec<String>,
}

impl Harness {
    /// Reads `--bench` and name filters from the arguments.
    pub fn from_args() -> Harness {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Harness {
            timed: args.iter().any(|a| a == "--bench"),
            filters: args.into_iter().filter(|a| !a.starts_with('-')).collect(),
        }
    }

    /// Times `f` and prints one JSON line; in smoke mode calls it once.
    pub fn run<T>(&self, name: &str, mut f: impl FnMut() -> T) {
        if !self.filters.is_empty() && !self.filters.iter().any(|p| name.contains(p.as_str())) {
            return;
        }
        if !self.timed {
            black_box(f());
            println!("{name}: ok (smoke; run `cargo bench` to time)");
            return;
        }
        let start = Instant::now();
        let mut calls: u128 = 0;
        while calls < 10 || start.elapsed() < WARMUP {
            black_box(f());
            calls += 1;
        }
        let per_call = (start.elapsed().as_nanos() / calls).max(1);
        let batch = MIN_SAMPLE_NS.div_ceil(per_call).clamp(1, 100_000) as u32;

        let mut samples = Vec::with_capacity(MAX_SAMPLES);
        let t0 = Instant::now();
        while samples.len() < MAX_SAMPLES && (samples.len() < MIN_SAMPLES || t0.elapsed() < BUDGET) {
            let s = Instant::now();
            for _ in 0..batch {
                black_box(f());
            }
            samples.push(s.elapsed().as_nanos() as f64 / f64::from(batch) / 1000.0);
        }
        samples.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            // Nearest rank.
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            let us = samples[rank.clamp(1, samples.len()) - 1];
            format!("{us:.3}")
        };
        // Keys in a fixed order for people; it is JSON for tools.
        let name = serde_json::Value::from(name);
        let (p50, p90, p99, n) = (pct(50.0), pct(90.0), pct(99.0), samples.len());
        println!(r#"{{"bench":{name},"unit":"us","p50":{p50},"p90":{p90},"p99":{p99},"n":{n},"batch":{batch}}}"#);
    }
}
