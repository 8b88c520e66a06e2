//! The example functions beyond `checksum`, each on the real stack: an upload fires it, its
//! output lands in storage and is checked against values this test computes from the same
//! input; a malformed input makes the job fail with the guest's exit status, and the guest's
//! message is checked by running the same module in the EP's runtime alone (the stack keeps
//! the job's log but serves no API for it yet).
//!
//! - `calibrate` (Rust, compute-bound): compared with its own kernel compiled natively here,
//!   byte for byte, and its pedestals with plain means of the pre-trigger samples;
//! - `convert` (C, clang + wasi-libc): column statistics, histograms and the binary table
//!   compared with a computation in this file.

#[path = "../../examples/calibrate/src/kernel.rs"]
#[allow(dead_code)]
pub(crate) mod kernel;

use htfaas::client::Client;
use htfaas::stack::demo_manifest;
use htfaas_functions::Resources;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_tests::{guest_wasm, guest_wasm_c, run_guest_alone, start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Registers the module at `wasm` as `name`, fired by `<trigger>/**`, writing to `outputs`.
async fn register(client: &Client, wasm: &std::path::Path, name: &str, trigger: &str, outputs: &str, args: &[&str]) {
    let module = client.upload_module(std::fs::read(wasm).expect("read the module")).await.expect("upload");
    let mut m = demo_manifest(module);
    m.name = name.into();
    m.trigger.path = format!("{trigger}/**");
    m.outputs.dir = outputs.into();
    m.args = args.iter().map(|a| a.to_string()).collect();
    m.resources = Resources::new(1, 256, 60);
    client.register(&m).await.expect("register");
}

/// Waits for the output at `path` to land in storage.
async fn output(client: &Client, path: &str) -> Vec<u8> {
    wait_for(path, LIMIT, || async { client.get_bytes(path).await.ok().flatten() }).await
}

/// Waits for the job fired by `input` to fail and returns it.
async fn failed_job(client: &Client, input: &str) -> JobRecord {
    let job = wait_for(&format!("the job on {input} to end"), LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.event.path == input && matches!(j.state, JobState::Failed | JobState::Completed))
    })
    .await;
    assert_eq!(job.state, JobState::Failed, "{job:#?}");
    assert_eq!(job.exit_code, Some(1), "{job:#?}");
    assert_eq!(job.reason, "exited with status 1", "{job:#?}");
    assert!(job.outputs.is_empty(), "a failed conversion stores nothing: {job:#?}");
    job
}

/// The job's log as the stack keeps it (`htfaas jobs log ID`).
async fn log_of(client: &Client, job: &JobRecord) -> String {
    client.job_log(&job.id).await.expect("job log").log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_fires_on_an_upload_and_matches_the_native_kernel() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let wasm = guest_wasm("calibrate");
    register(&client, &wasm, "calibrate", "/data/waves", "/data/calib/", &["--channels", "8"]).await;

    let samples = kernel::synthesize(2048, 8, 2025);
    client.put_bytes(kernel::to_le_bytes(&samples), "/data/waves/run7.f32").await.expect("put");
    let got = output(&client, "/data/calib/run7.f32.calib.json").await;
    let got = String::from_utf8(got).expect("UTF-8");

    // The same kernel compiled natively gives the same bytes (IEEE arithmetic, same order).
    let native = kernel::calibrate(&samples, 8, 4).expect("valid input");
    assert_eq!(got, kernel::to_json("run7.f32", &native));
    // And independently: each channel's pedestal is the mean of its pre-trigger samples (the
    // noise is uniform within ±4, so 3-sigma clipping drops nothing).
    let v: serde_json::Value = serde_json::from_str(&got).expect("JSON");
    assert_eq!(v["waveforms"], 2048);
    for ch in 0..8 {
        let pre: Vec<f64> = samples
            .chunks_exact(kernel::WINDOW)
            .skip(ch)
            .step_by(8)
            .flat_map(|w| w[..kernel::PRETRIGGER].iter().map(|&x| f64::from(x)))
            .collect();
        let mean = pre.iter().sum::<f64>() / pre.len() as f64;
        let pedestal = v["channels"][ch]["pedestal"].as_f64().expect("pedestal");
        assert!((pedestal - mean).abs() < 1e-3, "channel {ch}: pedestal {pedestal}, mean {mean}");
        assert!((pedestal - (100.0 + 10.0 * ch as f64)).abs() < 0.5, "channel {ch}: pedestal {pedestal}");
    }
    let counts: u64 = v["histogram"]["counts"].as_array().expect("counts").iter().filter_map(|c| c.as_u64()).sum();
    assert_eq!(counts + v["histogram"]["underflow"].as_u64().unwrap_or(0), 2048);

    // Malformed: 25 samples is not a whole waveform.
    let bad = vec![0u8; 100];
    client.put_bytes(bad.clone(), "/data/waves/bad.f32").await.expect("put");
    let job = failed_job(&client, "/data/waves/bad.f32").await;
    let message = "calibrate: 25 samples is not a whole number of 64-sample waveforms\n";
    assert_eq!(log_of(&client, &job).await, message);
    let (run, outputs) = run_guest_alone(&wasm, "bad.f32", &bad, &["--channels", "8"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(stderr, message);
    assert!(outputs.is_empty(), "{outputs:?}");
    stack.stop().await.expect("clean stop");
}

/// A CSV of `rows` rows over the columns `event,adc,temp,hv`, and its values by column.
fn csv(rows: usize) -> (String, Vec<Vec<f64>>) {
    let mut text = String::from("# run 7, detector samples\nevent,adc,temp,hv\r\n");
    let mut cols = vec![Vec::new(); 4];
    for i in 0..rows {
        let x = (i as u64).wrapping_mul(2_654_435_761) % 4096;
        let row = [i as f64, x as f64, 21.25 + (i % 13) as f64 * 0.125, -1500.0 + (x % 7) as f64 * 0.5];
        text.push_str(&format!("{},{},{},{}\r\n", row[0], row[1], row[2], row[3]));
        for (c, v) in row.into_iter().enumerate() {
            cols[c].push(v);
        }
    }
    (text, cols)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn convert_fires_on_an_upload_and_summarises_each_column() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let wasm = guest_wasm_c("convert");
    register(&client, &wasm, "convert", "/data/csv", "/data/converted/", &[]).await;

    let (text, cols) = csv(1000);
    client.put_bytes(text.into_bytes(), "/data/csv/run7.csv").await.expect("put");
    let summary = output(&client, "/data/converted/run7.csv.summary.json").await;
    let v: serde_json::Value = serde_json::from_slice(&summary).expect("JSON");
    assert_eq!(v["file"], "run7.csv");
    assert_eq!(v["rows"], 1000);
    for (c, (name, values)) in ["event", "adc", "temp", "hv"].iter().zip(&cols).enumerate() {
        let col = &v["columns"][c];
        assert_eq!(col["name"], *name);
        let n = values.len() as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = values.iter().sum::<f64>() / n;
        let stddev = (values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt();
        let close = |key: &str, want: f64| {
            let got = col[key].as_f64().expect("number");
            assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{name}.{key}: {got} vs {want}");
        };
        close("min", min);
        close("max", max);
        close("mean", mean);
        close("stddev", stddev);
        let mut hist = vec![0u64; 20];
        for x in values {
            let b = ((x - min) / (max - min) * 20.0) as usize;
            hist[b.min(19)] += 1;
        }
        let got: Vec<u64> = col["histogram"].as_array().expect("histogram").iter().filter_map(|x| x.as_u64()).collect();
        assert_eq!(got, hist, "{name}");
    }

    // The compact table: header, then column after column as f32.
    let table = output(&client, "/data/converted/run7.csv.f32").await;
    let u32_at = |i: usize| u32::from_le_bytes(table[i..i + 4].try_into().expect("4 bytes"));
    assert_eq!(&table[..4], b"HTFC");
    assert_eq!((u32_at(4), u32_at(8), u32_at(12)), (1, 1000, 4));
    assert_eq!(table.len(), 16 + 4 * 1000 * 4);
    let f32_at = |col: usize, row: usize| f32::from_bits(u32_at(16 + 4 * (col * 1000 + row)));
    for row in [0, 1, 499, 999] {
        for (c, values) in cols.iter().enumerate() {
            assert_eq!(f32_at(c, row), values[row] as f32, "column {c}, row {row}");
        }
    }

    // Malformed: a field that is not a number.
    let bad = b"event,adc\n1,2\n2,x7\n".to_vec();
    client.put_bytes(bad.clone(), "/data/csv/bad.csv").await.expect("put");
    let job = failed_job(&client, "/data/csv/bad.csv").await;
    let message = "convert: bad.csv: line 3: field 2 (adc) is not a finite number: \"x7\"\n";
    assert_eq!(log_of(&client, &job).await, message);
    let (run, outputs) = run_guest_alone(&wasm, "bad.csv", &bad, &[]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(stderr, message);
    assert!(outputs.is_empty(), "{outputs:?}");
    stack.stop().await.expect("clean stop");
}

/// The same `calibrate` source built as a WASI preview 2 component takes the whole path too:
/// fired by an upload, input and output through the macaroons, the same bytes as native.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_as_a_preview_2_component_fires_on_an_upload_and_matches_the_native_kernel() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let wasm = htfaas_tests::guest_component("calibrate");
    let bytes = std::fs::read(&wasm).expect("read the component");
    assert_eq!(htfaas_ep::runtime::GuestKind::of(&bytes), htfaas_ep::runtime::GuestKind::Component);
    register(&client, &wasm, "calibrate-p2", "/data/waves-p2", "/data/calib-p2/", &["--channels", "4"]).await;

    let samples = kernel::synthesize(512, 4, 7);
    client.put_bytes(kernel::to_le_bytes(&samples), "/data/waves-p2/run1.f32").await.expect("put");
    let got = output(&client, "/data/calib-p2/run1.f32.calib.json").await;
    let native = kernel::calibrate(&samples, 4, 4).expect("valid input");
    assert_eq!(String::from_utf8(got).expect("UTF-8"), kernel::to_json("run1.f32", &native));
    stack.stop().await.expect("clean stop");
}
