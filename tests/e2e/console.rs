//! The web console, driven in headless Chromium over the DevTools protocol.
//!
//! A real stack processes an upload; the console (served by the gateway) is opened in Debian's
//! chromium ([`htfaas_tests::cdp::Browser`]), a wrong token is refused plainly, then the admin
//! token is pasted and the DOM must show: the event-flow chart started from the gateway's own
//! history (`GET /v1/stats/history`); the function with its version, state (following a
//! disable), trigger and last run; the attached EP with its slots; a failed job's dead letter;
//! the job, completed, with its
//! input and output; a history; the event-flow chart with points; the owner's usage chart (or, on a gateway without
//! the report, a plain "not available"); and the audit search's lineage of the file, from the
//! input and back from the output. A file whose name is markup (`<img src=x onerror=…>`) is
//! shown as text and runs nothing. No CSP violation or exception is logged. The screenshot is
//! kept in `target/test-artifacts/console.png`.

use htfaas_functions::proto::JobState;
use htfaas_tests::cdp::{Browser, VIEWPORT};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
/// Longest wait for anything the page shows.
const WAIT: Duration = Duration::from_secs(20);
/// A file name that is markup: it must be shown as text and never run.
const XSS_PATH: &str = "/data/raw/<img src=x onerror=window.__xss=1>.dat";

/// A JS string literal of `s` (JSON strings are JS strings).
fn js(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// JS: the jobs table's row of job `id`, or undefined.
fn job_row(id: &str) -> String {
    format!("[...document.querySelectorAll('#jobs tbody tr')].find(tr => tr.dataset.jobId === {})", js(id))
}

async fn sign_in(browser: &Browser, token: &str) {
    let script = format!(
        "document.getElementById('token').value = {}; document.getElementById('login').requestSubmit(); true",
        js(token)
    );
    browser.evaluate(&script).await.expect("submit the token");
}

async fn search(browser: &Browser, path: &str) {
    let script = format!(
        "document.getElementById('audit-file').value = {}; document.getElementById('audit-form').requestSubmit(); true",
        js(path)
    );
    browser.evaluate(&script).await.expect("submit the audit search");
}

/// Whether this gateway answers `GET /v1/accounting/report` (a route, not the router's bare 404).
async fn has_usage_report(base: &str, token: &str) -> bool {
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/accounting/report?by=owner"))
        .bearer_auth(token)
        .send()
        .await
        .expect("ask for the report");
    let status = resp.status();
    let body = resp.bytes().await.expect("body");
    !(status == reqwest::StatusCode::NOT_FOUND && body.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_jobs_flow_usage_and_a_files_lineage_in_headless_chromium() {
    let started = Instant::now();
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas::stack::demo(&client, &guest_wasm("checksum"), LIMIT).await.expect("demo path");
    // The output is stored before the EP's report reaches the scheduler: wait for the record.
    let job = wait_for("a completed job", WAIT, || async {
        client.jobs().await.expect("jobs").into_iter().find(|j| j.state == JobState::Completed)
    })
    .await;
    let input = job.event.path.clone();
    let output = job.outputs.first().expect("an output").path.clone();
    let info = stack.info().clone();
    let base = info.gateway_url.trim_end_matches('/').to_owned();

    // The files: their types, caching and a CSP that allows no inline script.
    let http = reqwest::Client::new();
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/style.css", "text/css"),
    ] {
        let resp = http.get(format!("{base}{path}")).send().await.expect("GET a console file");
        assert_eq!(resp.status(), 200, "{path}");
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(header("content-type").starts_with(kind), "{path}: {}", header("content-type"));
        assert_eq!(header("cache-control"), "no-cache", "{path}");
        let csp = header("content-security-policy");
        assert!(csp.contains("default-src 'self'") && csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{path}: {csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
    let usage_report = has_usage_report(&base, &info.admin_token).await;
    println!("GET /v1/accounting/report is {}", if usage_report { "there" } else { "not there yet" });

    // The gateway's own history of its counters holds the demo's event before the page opens.
    let history = wait_for("two samples of the stats history after the event", WAIT, || async {
        let h: htfaas_functions::proto::StatsHistory = http
            .get(format!("{base}/v1/stats/history"))
            .bearer_auth(&info.admin_token)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let counted = h.samples.iter().filter(|x| x.events_received >= 1).count();
        (counted >= 2).then_some(h)
    })
    .await;
    assert_eq!(history.interval_ms, 2000);
    assert!(history.samples.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "oldest first");
    let refused = http.get(format!("{base}/v1/stats/history")).send().await.expect("GET without a token");
    assert_eq!(refused.status(), 401, "the history needs the admin token");

    let launched = Instant::now();
    let browser = Browser::launch().await.expect("start headless chromium");
    browser.navigate(&format!("{base}/console")).await.expect("open the console");
    browser.wait_for("the script ran", "document.body.dataset.ready === 'true'", WAIT).await.expect("app.js loaded");

    // A wrong token is refused plainly, and the login stays.
    sign_in(&browser, "not-the-admin-token").await;
    let shown = browser
        .wait_for(
            "the refusal",
            "(() => { const e = document.getElementById('error'); return !e.hidden && e.textContent; })()",
            WAIT,
        )
        .await
        .expect("a refused token is shown");
    let shown = shown.as_str().unwrap_or_default().to_owned();
    assert!(shown.contains("401"), "{shown}");
    assert_eq!(browser.evaluate("document.getElementById('login-panel').hidden").await.expect("eval"), false);
    assert_eq!(browser.evaluate("sessionStorage.length").await.expect("eval"), 0, "a refused token is not kept");

    sign_in(&browser, &info.admin_token).await;
    browser.wait_for("the error cleared", "document.getElementById('error').hidden", WAIT).await.expect("signed in");

    // Event flow from the gateway's history: the chart starts with the samples it kept, not
    // empty; its received line already rose.
    let seeded = browser
        .wait_for(
            "the chart seeded from the history",
            "(() => { const n = Number(document.getElementById('flow-chart').dataset.history); return n >= 2 && n; })()",
            WAIT,
        )
        .await
        .expect("the event-flow chart starts from the gateway's history");
    println!("event-flow chart seeded with {seeded} samples");

    // Functions: the demo's function, its live version, enabled, its trigger and last run.
    let fn_row = "document.querySelector('#functions tbody tr[data-function=\"checksum\"]')";
    browser
        .wait_for(
            "the function's row with its completed run",
            &format!(
                "{fn_row}?.dataset.enabled === 'true' && {fn_row}.querySelector('td.runs .state-completed') !== null"
            ),
            WAIT,
        )
        .await
        .expect("the functions panel shows the function and its last run");
    let text = browser.evaluate(&format!("{fn_row}.textContent")).await.expect("row text");
    let text = text.as_str().unwrap_or_default();
    for want in ["alice", "v1", "enabled", "/data/raw/"] {
        assert!(text.contains(want), "{want:?} not in the function row {text:?}");
    }
    // Disabled through the API: the panel follows.
    client.set_function_enabled("checksum", false).await.expect("disable");
    browser
        .wait_for("the function shown disabled", &format!("{fn_row}?.dataset.enabled === 'false'"), WAIT)
        .await
        .expect("the functions panel shows it disabled");
    client.set_function_enabled("checksum", true).await.expect("enable again");

    // EPs: the stack's EP, attached, enabled, with its CPUs.
    let ep_row = "document.querySelector('#eps tbody tr[data-attached=\"true\"]')";
    browser
        .wait_for("an attached EP", &format!("{ep_row}?.dataset.state === 'enabled'"), WAIT)
        .await
        .expect("the EPs panel shows the attached EP");
    let text = browser.evaluate(&format!("{ep_row}.textContent")).await.expect("row text");
    assert!(text.as_str().unwrap_or_default().contains(" / "), "slots shown: {text}");

    // Jobs: the processed file's job, completed, with its input and output.
    let row = job_row(&job.id);
    browser
        .wait_for("the job row, completed", &format!("{row}?.dataset.state === 'completed'"), WAIT)
        .await
        .expect("the job is listed as completed");
    let text = browser.evaluate(&format!("{row}.textContent")).await.expect("row text");
    let text = text.as_str().unwrap_or_default();
    for want in [input.as_str(), output.as_str(), "alice", "checksum", "completed"] {
        assert!(text.contains(want), "{want:?} not in the job row {text:?}");
    }
    // Its history, by its button.
    browser.evaluate(&format!("{row}.querySelector('button.job-id').click(); true")).await.expect("click");
    browser
        .wait_for(
            "the job's history",
            "document.querySelector('#history tbody')?.textContent.includes('completed')",
            WAIT,
        )
        .await
        .expect("the history shows the completed attempt");

    // Event flow: a chart with points for the three series.
    browser
        .wait_for(
            "event-flow points",
            "Number(document.querySelector('#flow-chart svg')?.dataset.points) >= 2 \
             && document.querySelectorAll('#flow-chart polyline').length === 3",
            WAIT,
        )
        .await
        .expect("the event-flow chart has data points");

    // Usage: the owner's chart once the report exists; a plain "not available" before.
    if usage_report {
        browser
            .wait_for(
                "alice's usage chart",
                "document.querySelector('#usage-charts figure[data-owner=\"alice\"] rect.bar')",
                WAIT,
            )
            .await
            .expect("the usage chart shows the owner");
    } else {
        browser
            .wait_for(
                "the usage panel's notice",
                "document.getElementById('usage-status').textContent.includes('not available')",
                WAIT,
            )
            .await
            .expect("the usage panel says it is not available");
    }

    // Audit search: the input's lineage names the input, the job and the output; the output's
    // leads back to the same.
    for path in [&input, &output] {
        search(&browser, path).await;
        let lineage = browser
            .wait_for(
                &format!("the lineage of {path}"),
                &format!(
                    "(() => {{ const t = document.getElementById('lineage').textContent; \
                     return [{}, {}, {}].every(s => t.includes(s)) && t; }})()",
                    js(&input),
                    js(&output),
                    js(&job.id)
                ),
                WAIT,
            )
            .await
            .expect("the lineage shows input, job and output");
        println!("lineage of {path}: {lineage}");
        let upload = browser
            .evaluate(&format!(
                "[...document.querySelectorAll('#lineage .node.file')].some(n => \
                 n.textContent.startsWith('upload') && n.textContent.includes({}))",
                js(&input)
            ))
            .await
            .expect("eval");
        assert_eq!(upload, true, "the input is shown as the upload");
    }

    // A file named with markup: shown as text in the jobs table, the lineage and (a function
    // that fails on it) the dead letters, never run.
    let module = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    let fails = htfaas_functions::FunctionManifest {
        name: "fails".into(),
        args: vec!["exit".into(), "3".into()],
        ..htfaas::stack::demo_manifest(module)
    };
    client.register(&fails).await.expect("register the failing function");
    client.put_bytes(b"xss".to_vec(), XSS_PATH).await.expect("upload the markup-named file");
    let dlq_row = "document.querySelector('#dlq tbody tr[data-function=\"fails\"]')";
    browser
        .wait_for("the failed job's dead letter", &format!("{dlq_row}?.dataset.kind === 'failed'"), WAIT)
        .await
        .expect("the dead letters show the failed job");
    let text = browser.evaluate(&format!("{dlq_row}.textContent")).await.expect("row text");
    let text = text.as_str().unwrap_or_default();
    for want in [XSS_PATH, "fails v1", "alice", "exit"] {
        assert!(text.contains(want), "{want:?} not in the dead letter's row {text:?}");
    }
    let xss_row = format!(
        "[...document.querySelectorAll('#jobs tbody tr')].find(tr => tr.querySelector('td.input')?.textContent === {} \
         && tr.querySelector('td.function')?.textContent.startsWith('checksum'))",
        js(XSS_PATH)
    );
    browser
        .wait_for("the markup-named job", &format!("{xss_row}?.dataset.state === 'completed'"), WAIT)
        .await
        .expect("the markup-named file's job is listed, its path as text");
    search(&browser, XSS_PATH).await;
    browser
        .wait_for(
            "the markup-named lineage",
            &format!("document.getElementById('lineage').textContent.includes({})", js(XSS_PATH)),
            WAIT,
        )
        .await
        .expect("the lineage shows the path as text");
    let injected = browser
        .evaluate("JSON.stringify({imgs: document.querySelectorAll('img').length, xss: window.__xss ?? null})")
        .await
        .expect("eval");
    assert_eq!(injected.as_str(), Some(r#"{"imgs":0,"xss":null}"#), "markup from a path became an element");

    // The upload shows in the event flow as a rate above zero.
    browser
        .wait_for(
            "a received rate above zero",
            "(() => { const l = document.querySelector('#flow-chart polyline[data-series=\"received\"]'); \
             if (!l) return false; const ys = l.getAttribute('points').split(' ').map(p => Number(p.split(',')[1])); \
             return Math.min(...ys) < Math.max(...ys); })()",
            WAIT,
        )
        .await
        .expect("the event flow shows the upload");

    // Nothing was blocked by the CSP and nothing threw.
    let log = browser.log();
    let bad: Vec<&String> = log
        .iter()
        .filter(|l| {
            l.contains("Content Security Policy") || l.starts_with("exception") || l.starts_with("console.error")
        })
        .collect();
    assert!(bad.is_empty(), "the page logged problems: {bad:#?}");

    // The screenshot: back to the top, jobs, flow and usage in view.
    browser.evaluate("window.scrollTo(0, 0); true").await.expect("scroll");
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/console.png");
    let size = browser.screenshot(&shot).await.expect("screenshot");
    let png = std::fs::read(&shot).expect("read the screenshot");
    assert_eq!(png.len(), size);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().expect("4 bytes"));
    let height = u32::from_be_bytes(png[20..24].try_into().expect("4 bytes"));
    assert_eq!((width, height), VIEWPORT, "screenshot size");
    assert!(size > 20_000 && size < 10_000_000, "a {size}-byte screenshot is not a rendered console");
    println!("screenshot: {} ({size} bytes, {width}x{height})", shot.canonicalize().unwrap_or(shot.clone()).display());

    browser.close();
    println!("console test: browser part {:?}, whole test {:?}", launched.elapsed(), started.elapsed());
    stack.stop().await.expect("clean stop");
}
