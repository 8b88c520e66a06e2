//! A small Chrome DevTools Protocol driver for the console test: Debian's `chromium`, headless,
//! on a throwaway profile, reachable only from loopback, driven over one WebSocket.
//!
//! [`Browser::launch`] starts chromium with `--remote-debugging-port=0`, reads the port it chose
//! from `DevToolsActivePort` in the profile directory, connects to the browser endpoint, opens one
//! page and attaches to it in flat mode (every page command carries the session id). It offers
//! what the test needs: [`Browser::navigate`], [`Browser::evaluate`] (`Runtime.evaluate` with
//! `awaitPromise`), [`Browser::wait_for`] (a JS condition polled until true, bounded) and
//! [`Browser::screenshot`] (`Page.captureScreenshot` to a PNG file). Every command is bounded by
//! [`COMMAND_TIMEOUT`]. The page's console messages, uncaught exceptions and browser log entries
//! (CSP violations among them) are kept: [`Browser::log`].
//!
//! Chromium is killed and its profile deleted when the [`Browser`] drops. Names resolve to
//! nothing but loopback (`--host-resolver-rules`), and everything but loopback goes to a proxy
//! that is not there, so a page cannot reach the network.

use anyhow::{Context as _, bail};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Longest wait for any one DevTools command (a screenshot included).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for chromium to write `DevToolsActivePort`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Viewport of the page: the console must work at this size.
pub const VIEWPORT: (u32, u32) = (1280, 800);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, String>>>>>;

/// A headless chromium with one page, driven over DevTools. Killed on drop.
pub struct Browser {
    /// The chromium process; killed (and reaped) on drop.
    child: Child,
    /// Its profile (`--user-data-dir`), removed after the process is gone.
    profile: Option<tempfile::TempDir>,
    /// Outgoing frames, written by the writer task.
    outgoing: mpsc::UnboundedSender<Message>,
    /// Answers awaited, by command id.
    pending: Pending,
    /// Next command id.
    next_id: std::sync::atomic::AtomicU64,
    /// The page's flat-mode session.
    session: String,
    /// Console messages, exceptions and log entries of the page, in order.
    log: Arc<Mutex<Vec<String>>>,
    /// The reader and writer of the WebSocket; aborted on drop.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The chromium binary: `HTFAAS_CHROMIUM`, else `chromium` or `chromium-browser` on `PATH`.
pub fn find_chromium() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HTFAAS_CHROMIUM") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("HTFAAS_CHROMIUM={} is not a file", p.display());
    }
    find_chromium_in(&std::env::var_os("PATH").unwrap_or_default())
}

/// `chromium` or `chromium-browser` in the directories of `path` (a `PATH` value).
fn find_chromium_in(path: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    for dir in std::env::split_paths(path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "chromium not found (neither HTFAAS_CHROMIUM nor chromium/chromium-browser on PATH): \
         run scripts/install-deps.sh (it installs Debian's chromium) or set HTFAAS_CHROMIUM"
    )
}

/// Whether chromium must run without its sandbox: as root it refuses to start otherwise
/// (containers, CI), and `HTFAAS_CHROMIUM_NO_SANDBOX=1` asks for it where user namespaces are off.
fn needs_no_sandbox() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::env::var_os("HTFAAS_CHROMIUM_NO_SANDBOX").is_some_and(|v| v == "1")
        || std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl Browser {
    /// Starts chromium headless and attaches to a blank page of [`VIEWPORT`] size.
    pub async fn launch() -> anyhow::Result<Browser> {
        let binary = find_chromium()?;
        let profile = tempfile::Builder::new().prefix("htfaas-chromium-").tempdir().context("create a profile dir")?;
        let stderr = std::fs::File::create(profile.path().join("chromium.stderr")).context("create the stderr file")?;
        let mut cmd = Command::new(&binary);
        cmd.arg("--headless=new")
            .arg("--remote-debugging-port=0")
            .arg("--remote-debugging-address=127.0.0.1")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1))
            .args(["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"])
            .args(["--disable-extensions", "--disable-background-networking", "--disable-component-update"])
            .args(["--disable-sync", "--disable-default-apps", "--mute-audio", "--metrics-recording-only"])
            .args(["--password-store=basic", "--use-mock-keychain"])
            // Loopback only: no name resolves (except to the refusal), and anything that is not
            // loopback goes to a proxy on a port where nothing listens.
            .arg("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
            .arg("--proxy-server=http://127.0.0.1:9")
            .arg("--proxy-bypass-list=127.0.0.1")
            .arg("about:blank")
            // Its helpers (zygote, renderer, GPU) are killed with it as one process group, and
            // its scratch directories (`org.chromium.Chromium.*`) go into the profile, removed
            // after: nothing of it is left in /tmp.
            .env("TMPDIR", profile.path())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if needs_no_sandbox() {
            cmd.arg("--no-sandbox");
        }
        let mut child = cmd.spawn().with_context(|| format!("start {}", binary.display()))?;
        let ws_url = match wait_for_port(&mut child, profile.path()).await {
            Ok(url) => url,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = std::fs::read_to_string(profile.path().join("chromium.stderr")).unwrap_or_default();
                let tail: String =
                    err.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                return Err(e.context(format!("chromium ({}) did not start; its stderr:\n{tail}", binary.display())));
            }
        };
        let connected = tokio::time::timeout(COMMAND_TIMEOUT, tokio_tungstenite::connect_async(ws_url.as_str())).await;
        let (ws, _) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(anyhow::Error::from(e).context(format!("connect to {ws_url}")));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("connecting to {ws_url} took more than {COMMAND_TIMEOUT:?}");
            }
        };
        let (mut sink, mut stream) = ws.split();
        let (outgoing, mut rx) = mpsc::unbounded_channel::<Message>();
        let pending: Pending = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let reader = {
            let pending = pending.clone();
            let log = log.clone();
            tokio::spawn(async move {
                while let Some(Ok(m)) = stream.next().await {
                    let Message::Text(text) = m else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else { continue };
                    if let Some(id) = v.get("id").and_then(Value::as_u64) {
                        let answer = match v.get("error") {
                            Some(e) => Err(e.to_string()),
                            None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                        };
                        let waiter = pending.lock().expect("pending lock").remove(&id);
                        if let Some(tx) = waiter {
                            let _ = tx.send(answer);
                        }
                    } else if let Some(line) = describe_event(&v) {
                        log.lock().expect("log lock").push(line);
                    }
                }
                // The browser went away: fail whatever still waits.
                for (_, tx) in pending.lock().expect("pending lock").drain() {
                    let _ = tx.send(Err("the DevTools connection closed".into()));
                }
            })
        };
        let mut browser = Browser {
            child,
            profile: Some(profile),
            outgoing,
            pending,
            next_id: std::sync::atomic::AtomicU64::new(1),
            session: String::new(),
            log,
            tasks: vec![writer, reader],
        };
        let target = browser.call(None, "Target.createTarget", json!({"url": "about:blank"})).await?;
        let target_id = target["targetId"].as_str().context("Target.createTarget: no targetId")?.to_owned();
        let attached =
            browser.call(None, "Target.attachToTarget", json!({"targetId": target_id, "flatten": true})).await?;
        browser.session = attached["sessionId"].as_str().context("Target.attachToTarget: no sessionId")?.to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.send(domain, json!({})).await?;
        }
        let (w, h) = VIEWPORT;
        browser
            .send(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": w, "height": h, "deviceScaleFactor": 1, "mobile": false}),
            )
            .await?;
        Ok(browser)
    }

    /// One DevTools command, to the browser (`session` None) or a page session; its `result`.
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut frame = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            frame["sessionId"] = Value::String(s.to_owned());
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        self.outgoing
            .send(Message::Text(frame.to_string().into()))
            .map_err(|_| anyhow::anyhow!("{method}: the DevTools connection is closed"))?;
        match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => bail!("{method}: {e}"),
            Ok(Err(_)) => bail!("{method}: the DevTools connection closed"),
            Err(_) => {
                self.pending.lock().expect("pending lock").remove(&id);
                bail!("{method}: no answer within {COMMAND_TIMEOUT:?}")
            }
        }
    }

    /// A command to the page.
    pub async fn send(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.call(Some(&self.session), method, params).await
    }

    /// Loads `url` and waits (bounded) until the document has loaded.
    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        let answer = self.send("Page.navigate", json!({"url": url})).await?;
        if let Some(e) = answer.get("errorText").and_then(Value::as_str) {
            bail!("navigate to {url}: {e}");
        }
        self.wait_for(&format!("{url} loaded"), "document.readyState === 'complete'", COMMAND_TIMEOUT).await?;
        Ok(())
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value as JSON; a
    /// thrown exception is an error carrying its description.
    pub async fn evaluate(&self, expression: &str) -> anyhow::Result<Value> {
        let answer = self
            .send(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true, "userGesture": true}),
            )
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            let text = details["exception"]["description"].as_str().or_else(|| details["text"].as_str()).unwrap_or("?");
            bail!("evaluating {expression:?} threw: {text}");
        }
        Ok(answer["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Polls `condition` (a JS expression) every 100 ms until it is truthy and returns its value;
    /// an error naming `what`, the last value and the page's log after `limit`.
    pub async fn wait_for(&self, what: &str, condition: &str, limit: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.evaluate(condition).await {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(v) => v,
                Err(e) => Value::String(format!("{e:#}")),
            };
            if Instant::now() >= deadline {
                bail!(
                    "timed out after {limit:?} waiting for {what} ({condition}); last value {last}; page log:\n{}",
                    self.log().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Captures the viewport as a PNG into `path` (its directory created); returns the byte count.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<usize> {
        use base64::Engine as _;
        let answer =
            self.send("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": false})).await?;
        let data = answer["data"].as_str().context("Page.captureScreenshot: no data")?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(data).context("decode the screenshot")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(path, &bytes).with_context(|| format!("write {}", path.display()))?;
        Ok(bytes.len())
    }

    /// The page's console messages, uncaught exceptions and log entries so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log lock").clone()
    }

    /// Kills chromium now (also done on drop).
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // The whole group: chromium's helpers outlive a kill of chromium alone. The `--` is
        // needed: procps-ng 4.0's `kill -KILL -PGID` signals every process (`kill(-1)`).
        let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{}", self.child.id())]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.profile.take() {
            let _ = dir.close();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until chromium names its DevTools endpoint in `DevToolsActivePort` (port, then path).
async fn wait_for_port(child: &mut Child, profile: &Path) -> anyhow::Result<String> {
    let file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next())
                && let Ok(port) = port.trim().parse::<u16>()
                && path.starts_with("/devtools/")
            {
                return Ok(format!("ws://127.0.0.1:{port}{}", path.trim()));
            }
        }
        if let Some(status) = child.try_wait().context("check chromium")? {
            bail!("chromium exited with {status} before naming its DevTools port");
        }
        if Instant::now() >= deadline {
            bail!("no {} after {START_TIMEOUT:?}", file.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// JavaScript truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// One line for the page log, from the DevTools events worth keeping.
fn describe_event(v: &Value) -> Option<String> {
    let params = &v["params"];
    match v["method"].as_str()? {
        "Runtime.consoleAPICalled" => {
            let args: Vec<String> = params["args"]
                .as_array()
                .map(|a| {
                    a.iter().map(|x| x.get("value").map_or_else(|| x["type"].to_string(), |v| v.to_string())).collect()
                })
                .unwrap_or_default();
            Some(format!("console.{}: {}", params["type"].as_str().unwrap_or("log"), args.join(" ")))
        }
        "Runtime.exceptionThrown" => {
            let d = &params["exceptionDetails"];
            Some(format!(
                "exception: {}",
                d["exception"]["description"].as_str().or_else(|| d["text"].as_str()).unwrap_or("?")
            ))
        }
        "Log.entryAdded" => {
            let e = &params["entry"];
            Some(format!(
                "log.{} ({}): {}",
                e["level"].as_str().unwrap_or("?"),
                e["source"].as_str().unwrap_or("?"),
                e["text"].as_str().unwrap_or("")
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthiness_follows_javascript() {
        assert!(!truthy(&json!(null)) && !truthy(&json!(false)) && !truthy(&json!(0)) && !truthy(&json!("")));
        assert!(truthy(&json!(true)) && truthy(&json!(2)) && truthy(&json!("x")) && truthy(&json!([])));
    }

    #[test]
    fn a_missing_chromium_names_the_install_script() {
        let err = format!("{:#}", find_chromium_in(std::ffi::OsStr::new("/nonexistent")).expect_err("nothing there"));
        assert!(err.contains("scripts/install-deps.sh"), "{err}");
    }
}
