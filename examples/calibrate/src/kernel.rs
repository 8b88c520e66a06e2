//! The calibration kernel of the `calibrate` example, std only, so that the very same source
//! also compiles natively: `ep/benches/compute.rs` and the end-to-end tests include this file
//! with `#[path]` and compare the guest against it.
//!
//! Input: little-endian f32 samples, a sequence of waveforms of [`WINDOW`] samples each;
//! waveform `i` belongs to channel `i % channels`. The first [`PRETRIGGER`] samples of each
//! waveform come before any pulse.
//!
//! The work, per channel:
//! 1. pedestal and noise: mean and rms of the pre-trigger samples, refined over `passes`
//!    passes of 3-sigma clipping (pass 1 takes every sample);
//! 2. per sample: pedestal subtraction, then the channel's cubic gain correction
//!    `y = x (g1 + g2 x + g3 x²)`;
//! 3. amplitude and time: a matched filter (a CR-RC² pulse template of [`TAPS`] taps at
//!    [`PHASES`] sub-sample phases) slid over the waveform; the largest filter output is the
//!    amplitude, its position (plus the phase) the time;
//! 4. amplitude mean, rms, min and max per channel, and one histogram of all amplitudes.
//!
//! Built for wasm32, the hot functions enable the SIMD proposal (`simd128`, 128-bit lanes,
//! on in wasmtime by default), as x86-64 builds have SSE2: both sides vectorise the same loops
//! at the same width. The arithmetic, and so the result, is the same bit for bit.

/// Samples per waveform.
pub const WINDOW: usize = 64;
/// Leading samples of each waveform that hold no pulse (the pedestal region).
pub const PRETRIGGER: usize = 16;
/// Length of the pulse template.
pub const TAPS: usize = 16;
/// Sub-sample phases of the template tried at each position.
pub const PHASES: usize = 4;
/// Bins of the amplitude histogram.
pub const BINS: usize = 256;
/// Upper edge of the amplitude histogram (the lower edge is 0).
pub const HIST_MAX: f64 = 4096.0;
/// Positions of the template inside one waveform.
const POSITIONS: usize = WINDOW - TAPS + 1;
/// Rise time of the CR-RC² template, in samples.
const TAU: f32 = 2.5;

/// Results for one channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Pedestal: clipped mean of the pre-trigger samples.
    pub pedestal: f64,
    /// Noise: clipped rms of the pre-trigger samples around the pedestal.
    pub noise: f64,
    /// Waveforms of this channel.
    pub waveforms: u64,
    /// Mean amplitude (calibrated units).
    pub amp_mean: f64,
    /// Rms of the amplitude around its mean.
    pub amp_rms: f64,
    /// Smallest amplitude.
    pub amp_min: f64,
    /// Largest amplitude.
    pub amp_max: f64,
    /// Mean peak time, in samples from the start of the waveform.
    pub time_mean: f64,
}

/// Results for one input.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Waveforms in the input.
    pub waveforms: u64,
    /// Pedestal passes done.
    pub passes: u32,
    /// One entry per channel.
    pub channels: Vec<Channel>,
    /// Amplitudes in `[0, HIST_MAX)`, [`BINS`] equal bins.
    pub histogram: Vec<u64>,
    /// Amplitudes below 0.
    pub underflow: u64,
    /// Amplitudes at or above [`HIST_MAX`].
    pub overflow: u64,
}

/// The cubic gain correction of `channel`: `(g1, g2, g3)`, when no constants are given. A real
/// site reads these from its calibration database (the example's `--gains FILE`, a reference
/// input); here they are a fixed function of the channel number.
pub fn gains(channel: usize) -> (f32, f32, f32) {
    let c = channel as f32;
    (1.0 + 0.01 * (c % 7.0), 2.0e-5 * (1.0 + c % 3.0), -1.0e-9 * (1.0 + c % 5.0))
}

/// The matched-filter templates, one per phase, each scaled so that a pulse `A * shape`
/// filters to `A`.
fn templates() -> [[f32; TAPS]; PHASES] {
    let mut t = [[0.0f32; TAPS]; PHASES];
    for (p, row) in t.iter_mut().enumerate() {
        let mut energy = 0.0f32;
        for (j, w) in row.iter_mut().enumerate() {
            *w = pulse_shape(j as f32 - p as f32 / PHASES as f32);
            energy += *w * *w;
        }
        for w in row.iter_mut() {
            *w /= energy;
        }
    }
    t
}

/// CR-RC² pulse shape at time `t` samples after its start, peaking at 1 for `t = 2 TAU`.
pub fn pulse_shape(t: f32) -> f32 {
    if t <= 0.0 {
        return 0.0;
    }
    let x = t / TAU;
    x * x * (2.0 - x).exp() / 4.0
}

/// Runs the whole kernel over `samples` (see the module docs) with the built-in gains
/// ([`gains`]). Errors name what is wrong with the input.
pub fn calibrate(samples: &[f32], channels: usize, passes: u32) -> Result<Summary, String> {
    let gain: Vec<(f32, f32, f32)> = (0..channels).map(gains).collect();
    calibrate_with(samples, &gain, passes)
}

/// [`calibrate`] with each channel's cubic gain correction given (`gain[c]` for channel `c`:
/// as many channels as gains), as a site's calibration constants give them.
pub fn calibrate_with(samples: &[f32], gain: &[(f32, f32, f32)], passes: u32) -> Result<Summary, String> {
    let channels = gain.len();
    if channels == 0 {
        return Err("channels must be at least 1".into());
    }
    if passes == 0 {
        return Err("passes must be at least 1".into());
    }
    if samples.is_empty() || !samples.len().is_multiple_of(WINDOW) {
        return Err(format!("{} samples is not a whole number of {WINDOW}-sample waveforms", samples.len()));
    }
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        return Err(format!("sample {i} is not a finite number"));
    }
    let waveforms = samples.len() / WINDOW;
    if waveforms < channels {
        return Err(format!("{waveforms} waveforms is fewer than the {channels} channels"));
    }
    let (pedestal, noise) = pedestals(samples, channels, passes);
    let mut acc = vec![Acc::default(); channels];
    let mut histogram = vec![0u64; BINS];
    let (underflow, overflow) = amplitudes(samples, &pedestal, gain, &mut acc, &mut histogram);
    let channels = acc
        .iter()
        .enumerate()
        .map(|(ch, a)| {
            let n = a.n as f64;
            let mean = a.sum / n;
            Channel {
                pedestal: pedestal[ch],
                noise: noise[ch],
                waveforms: a.n,
                amp_mean: mean,
                amp_rms: (a.sumsq / n - mean * mean).max(0.0).sqrt(),
                amp_min: a.min,
                amp_max: a.max,
                time_mean: a.time / n,
            }
        })
        .collect();
    Ok(Summary { waveforms: waveforms as u64, passes, channels, histogram, underflow, overflow })
}

/// Steps 2 to 4 for every waveform: calibrated samples, matched-filter amplitude and time, the
/// running sums in `acc` and the `histogram`. Returns (underflow, overflow).
#[cfg_attr(target_arch = "wasm32", target_feature(enable = "simd128"))]
fn amplitudes(
    samples: &[f32],
    pedestal: &[f64],
    gain: &[(f32, f32, f32)],
    acc: &mut [Acc],
    histogram: &mut [u64],
) -> (u64, u64) {
    let channels = acc.len();
    let templates = templates();
    let (mut underflow, mut overflow) = (0u64, 0u64);
    let mut wave = [0.0f32; WINDOW];
    for (i, raw) in samples.chunks_exact(WINDOW).enumerate() {
        let ch = i % channels;
        let ped = pedestal[ch] as f32;
        let (g1, g2, g3) = gain[ch];
        for (y, &x) in wave.iter_mut().zip(raw) {
            let x = x - ped;
            *y = x * (g1 + x * (g2 + x * g3));
        }
        let (amp, time) = matched_filter(&wave, &templates);
        let a = &mut acc[ch];
        let amp64 = f64::from(amp);
        a.n += 1;
        a.sum += amp64;
        a.sumsq += amp64 * amp64;
        a.time += f64::from(time);
        if amp64 < a.min {
            a.min = amp64;
        }
        if amp64 > a.max {
            a.max = amp64;
        }
        if amp64 < 0.0 {
            underflow += 1;
        } else if amp64 >= HIST_MAX {
            overflow += 1;
        } else {
            histogram[(amp64 * (BINS as f64 / HIST_MAX)) as usize] += 1;
        }
    }
    (underflow, overflow)
}

/// Running sums of one channel's amplitudes.
#[derive(Debug, Clone)]
struct Acc {
    n: u64,
    sum: f64,
    sumsq: f64,
    time: f64,
    min: f64,
    max: f64,
}

impl Default for Acc {
    fn default() -> Acc {
        Acc { n: 0, sum: 0.0, sumsq: 0.0, time: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }
}

/// Per-channel pedestal and noise of the pre-trigger samples, 3-sigma clipped over `passes`.
#[cfg_attr(target_arch = "wasm32", target_feature(enable = "simd128"))]
fn pedestals(samples: &[f32], channels: usize, passes: u32) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0f64; channels];
    let mut rms = vec![f64::INFINITY; channels];
    for _ in 0..passes {
        let lo: Vec<f32> = (0..channels).map(|c| (mean[c] - 3.0 * rms[c]) as f32).collect();
        let hi: Vec<f32> = (0..channels).map(|c| (mean[c] + 3.0 * rms[c]) as f32).collect();
        let mut n = vec![0u64; channels];
        let mut sum = vec![0.0f64; channels];
        let mut sumsq = vec![0.0f64; channels];
        for (i, wave) in samples.chunks_exact(WINDOW).enumerate() {
            let ch = i % channels;
            // Sums in f32 over one waveform's pre-trigger (16 values), then in f64.
            let (mut k, mut s, mut s2) = (0u32, 0.0f32, 0.0f32);
            let centre = mean[ch] as f32;
            for &x in &wave[..PRETRIGGER] {
                if x >= lo[ch] && x <= hi[ch] {
                    let d = x - centre;
                    k += 1;
                    s += d;
                    s2 += d * d;
                }
            }
            n[ch] += u64::from(k);
            sum[ch] += f64::from(s);
            sumsq[ch] += f64::from(s2);
        }
        for c in 0..channels {
            if n[c] == 0 {
                continue; // nothing inside the window: keep the previous estimate
            }
            let k = n[c] as f64;
            let shift = sum[c] / k;
            mean[c] += shift;
            rms[c] = (sumsq[c] / k - shift * shift).max(0.0).sqrt();
        }
    }
    (mean, rms)
}

/// Largest output of the templates slid over `wave`: (amplitude, time in samples).
#[cfg_attr(target_arch = "wasm32", target_feature(enable = "simd128"))]
fn matched_filter(wave: &[f32; WINDOW], templates: &[[f32; TAPS]; PHASES]) -> (f32, f32) {
    let (mut best, mut best_time) = (f32::NEG_INFINITY, 0.0f32);
    for (p, t) in templates.iter().enumerate() {
        // Loop order for the vectoriser: each tap updates every position.
        let mut out = [0.0f32; POSITIONS];
        for (j, &w) in t.iter().enumerate() {
            for (o, &x) in out.iter_mut().zip(&wave[j..j + POSITIONS]) {
                *o += w * x;
            }
        }
        for (pos, &o) in out.iter().enumerate() {
            if o > best {
                best = o;
                best_time = pos as f32 + p as f32 / PHASES as f32;
            }
        }
    }
    (best, best_time)
}

/// `summary` as one line of JSON, for the input called `name`.
pub fn to_json(name: &str, summary: &Summary) -> String {
    let mut s = format!(
        "{{\"file\":{},\"waveforms\":{},\"window\":{WINDOW},\"passes\":{},\"channels\":[",
        json_str(name),
        summary.waveforms,
        summary.passes
    );
    for (i, c) in summary.channels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"channel\":{i},\"pedestal\":{},\"noise\":{},\"waveforms\":{},\"amp_mean\":{},\"amp_rms\":{},\
             \"amp_min\":{},\"amp_max\":{},\"time_mean\":{}}}",
            c.pedestal, c.noise, c.waveforms, c.amp_mean, c.amp_rms, c.amp_min, c.amp_max, c.time_mean
        ));
    }
    s.push_str(&format!(
        "],\"histogram\":{{\"lo\":0,\"hi\":{HIST_MAX},\"underflow\":{},\"overflow\":{},\"counts\":[",
        summary.underflow, summary.overflow
    ));
    for (i, n) in summary.histogram.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&n.to_string());
    }
    s.push_str("]}}\n");
    s
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A synthetic input for tests and benches: `waveforms` waveforms over `channels` channels,
/// pedestal `100 + 10 * channel`, uniform noise of ±4 ADC counts, and one pulse per waveform
/// of amplitude 200..3000 starting at sample 20..28. Deterministic in `seed`.
pub fn synthesize(waveforms: usize, channels: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: fast, and good enough for noise.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut out = Vec::with_capacity(waveforms * WINDOW);
    for i in 0..waveforms {
        let pedestal = 100.0 + 10.0 * (i % channels) as f32;
        let amp = 200.0 + 2800.0 * next();
        let start = 20.0 + 8.0 * next();
        for k in 0..WINDOW {
            let noise = 8.0 * next() - 4.0;
            out.push(pedestal + noise + amp * pulse_shape(k as f32 - start));
        }
    }
    out
}

/// Little-endian bytes of `samples`, the input file format.
pub fn to_le_bytes(samples: &[f32]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}
