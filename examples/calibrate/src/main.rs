//! htfaas example function: calibrates detector waveforms (compute-bound).
//!
//! `calibrate /input/<name> [--channels N] [--passes P] [--gains FILE]` reads little-endian f32
//! waveforms of 64 samples (channel = waveform index mod N, default 16; with `--gains`, as many
//! channels as the file has lines, each `g1 g2 g3`: the site's calibration constants, given to
//! a run as a reference input under `/input/ref/`), runs [`kernel::calibrate`]
//! (pedestal with P clipping passes, default 4; cubic gain; matched-filter amplitude and time;
//! statistics and a histogram) and writes `/output/<name>.calib.json`.
//!
//! Prints `calibrate: <name>: <W> waveforms, compute_ms=<ms>` on stderr: the kernel's own time,
//! read with the monotonic clock (WASI `clock_time_get`) around the kernel alone, without the
//! file I/O, so `ep/benches/compute.rs` can compare it with the same kernel compiled natively.
//! Bad input or arguments: a message on stderr, exit status 1, no output.

// `synthesize` and `to_le_bytes` serve the tests and the bench that include the kernel too.
#[allow(dead_code)]
mod kernel;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Instant;

/// Bytes read per `read` call.
const CHUNK: usize = 1 << 20;

/// Parsed arguments.
struct Args {
    input: String,
    channels: usize,
    passes: u32,
    gains: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let input = args.next().ok_or("usage: calibrate /input/<file> [--channels N] [--passes P]")?;
    let (mut channels, mut passes, mut gains) = (16usize, 4u32, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--channels" => channels = value.parse().map_err(|e| format!("--channels {value}: {e}"))?,
            "--passes" => passes = value.parse().map_err(|e| format!("--passes {value}: {e}"))?,
            "--gains" => gains = Some(value),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if !(1..=4096).contains(&channels) || !(1..=64).contains(&passes) {
        return Err(format!("--channels must be 1..=4096 and --passes 1..=64 (got {channels}, {passes})"));
    }
    Ok(Args { input, channels, passes, gains })
}

/// A constants file: one line per channel, `g1 g2 g3` (blank lines and `#` comments skipped).
fn read_gains(path: &str) -> Result<Vec<(f32, f32, f32)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {path}: {e}"))?;
    let mut gains = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
        let g: Vec<f32> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        match g[..] {
            [g1, g2, g3] if g.iter().all(|x| x.is_finite()) => gains.push((g1, g2, g3)),
            _ => return Err(format!("{path}:{}: want three finite numbers, g1 g2 g3", n + 1)),
        }
    }
    if !(1..=4096).contains(&gains.len()) {
        return Err(format!("{path}: want 1 to 4096 channels, found {}", gains.len()));
    }
    Ok(gains)
}

/// Reads the whole input as f32 samples, in [`CHUNK`]-sized reads (no second copy of the file).
fn read_samples(path: &str) -> Result<Vec<f32>, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let len = file.metadata().map_err(|e| format!("stat {path}: {e}"))?.len();
    if len % 4 != 0 {
        return Err(format!("{len} bytes is not a whole number of f32 samples"));
    }
    let mut samples = Vec::with_capacity(usize::try_from(len / 4).map_err(|_| "input too large")?);
    let mut buf = vec![0u8; CHUNK];
    let mut have = 0; // bytes at the start of `buf` not converted yet
    loop {
        let n = file.read(&mut buf[have..]).map_err(|e| format!("read {path}: {e}"))?;
        if n == 0 {
            break;
        }
        have += n;
        let whole = have - have % 4;
        samples.extend(buf[..whole].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        buf.copy_within(whole..have, 0);
        have -= whole;
    }
    if have != 0 {
        return Err("the file ends inside a sample".into());
    }
    Ok(samples)
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let name = args.input.rsplit('/').next().filter(|n| !n.is_empty()).ok_or("input path has no file name")?;
    let samples = read_samples(&args.input)?;
    let gains = match &args.gains {
        Some(path) => read_gains(path)?,
        None => (0..args.channels).map(kernel::gains).collect(),
    };
    let started = Instant::now();
    let summary = kernel::calibrate_with(&samples, &gains, args.passes)?;
    let compute = started.elapsed();
    let out = format!("/output/{name}.calib.json");
    let mut f = std::fs::File::create(&out).map_err(|e| format!("create {out}: {e}"))?;
    f.write_all(kernel::to_json(name, &summary).as_bytes()).map_err(|e| format!("write {out}: {e}"))?;
    eprintln!("calibrate: {name}: {} waveforms, compute_ms={:.3}", summary.waveforms, compute.as_secs_f64() * 1000.0);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("calibrate: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kernel::*;

    #[test]
    fn finds_the_injected_pedestals_and_amplitudes() {
        let s = calibrate(&synthesize(4096, 4, 7), 4, 4).expect("valid input");
        assert_eq!(s.waveforms, 4096);
        for (c, ch) in s.channels.iter().enumerate() {
            let want = 100.0 + 10.0 * c as f64;
            assert!((ch.pedestal - want).abs() < 0.2, "channel {c}: {ch:?}");
            assert!((ch.noise - 8.0 / 12f64.sqrt()).abs() < 0.2, "channel {c}: {ch:?}");
            assert!(ch.amp_min > 150.0 && ch.amp_max < HIST_MAX, "channel {c}: {ch:?}");
        }
        assert_eq!(s.histogram.iter().sum::<u64>() + s.underflow + s.overflow, 4096);
    }

    #[test]
    fn refuses_bad_input() {
        assert!(calibrate(&[1.0; 65], 1, 1).expect_err("ragged").contains("whole number"));
        let mut v = vec![1.0; 128];
        v[70] = f32::NAN;
        assert_eq!(calibrate(&v, 1, 1).expect_err("nan"), "sample 70 is not a finite number");
        assert!(calibrate(&[1.0; 64], 2, 1).expect_err("too few").contains("fewer than"));
    }
}
