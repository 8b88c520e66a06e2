//! The attach link: one WebSocket to the scheduler at a time, re-dialled with backoff.
//!
//! State that outlives a connection ([`Link`]): the running jobs (id and [`CancelSignal`]) and
//! the reports not yet sent. Job tasks send their reports into one channel; a connected session
//! drains it onto the socket, and a report is dropped from `pending` only once the socket
//! accepted it.
//!
//! `Hello` carries the settings' annex, the operator's intent only: the scheduler decides from
//! the attach token. `Cancel` fires the named job's signal (the job ends as `Cancelled` and
//! reports like any other); a cancel for a job not running here is ignored. `Lifetime` (an
//! annex's end) replaces the EP's lease; the lifecycle watcher leaves by it. `Warm`
//! queues a module to compile ahead of its first job ([`crate::warm`]), never waited
//! for.
//!
//! Renewal: a job's request for fresh macaroons ([`crate::renew`]) goes out at
//! once as `Renew` on the current session (never kept for a later one: that session's
//! scheduler would not know the job as running there); `Renewed` and `RenewRefused` go back to
//! the job that asked, and a session that ends drops the waiting requests (their jobs go on
//! with the macaroons they have).
//!
//! Attach renewal: the `Hello` says the EP renews its attach token; when a `Welcome` (or a
//! renewal) says when to ask, `RenewAttach` goes out then, once, and `AttachRenewed`'s token
//! replaces the one the EP dials with, for this session and every reconnect, so a job longer
//! than the token's first life is not lost when it expires. A refusal is logged; the session
//! then ends at the token's expiry (a final close, as today). The renewed token lives in
//! memory only: an EP process started again dials with the token it was given.
//!
//! Prefetch (the extension of [`htfaas_functions::proto`]'s attach conversation):
//! `Hello` asks for [`Settings::prefetch`] jobs beyond the free resources; when the `Welcome`
//! grants the extension, every `Assign` goes into a local queue, and the queue's head starts as
//! soon as the cpus and memory of the running jobs' assignments leave room for it (or nothing
//! runs), oldest first — the rule the scheduler's table mirrors. A queued job is never started
//! past the granted wait: it is handed back (`NotStarted`) and runs elsewhere; so is every
//! queued job when a drain or stop begins. A `Cancel` of a queued job removes it unstarted and
//! answers `Finished` with `Cancelled`. The queue belongs to its session: when the connection
//! goes, the scheduler requeues what it assigned there, so the queue is dropped unstarted.
//! Within the extension, reports waiting together go out in one array frame, and a lone report
//! waits up to [`REPORT_LINGER`] for the next while other jobs run and more wait in the queue
//! ([`report_hold`]). Without it (an
//! older scheduler), every assignment starts at once, one message per frame, as
//! before.
//!
//! Leaving, in two speeds ([`crate::run_with`]):
//! - drain: `Draining` goes out first on every session (before any report), so the scheduler
//!   assigns nothing more; an `Assign` that crossed it is answered at once with a `Cancelled`
//!   report (`EP draining`), never run; the session stays while running jobs finish and their
//!   reports go out, and closes when none is left or at the drain deadline;
//! - stop (asked for, or the drain deadline passed): running jobs are cancelled and their
//!   `Cancelled` reports dropped (closing the session makes the scheduler run them again, which
//!   a report would have turned into a failure); reports of jobs that ended before are still
//!   sent; a native job gets SIGTERM and its vacate time first ([`crate::native_job`]), so the
//!   link leaves whatever remains after [`stop_grace`] (at least [`crate::config::STOP_GRACE`], longer than
//!   the longest vacate time of the native jobs running); a wasm job is interrupted at once.
//!
//! Failures and what follows:
//! - connection refused, timeouts, HTTP 5xx or other refusals of the upgrade, a dropped socket,
//!   close codes other than below: re-dial with backoff (100 ms doubling to 5 s);
//! - a failed TLS handshake, an untrusted scheduler certificate included: re-dial with backoff
//!   too, with a warning that says the certificate is not trusted. Not final, because it is not
//!   the scheduler's word: whoever answered could not prove to be the scheduler, so it must not
//!   be able to end the EP (anyone on the path could), and a certificate being renewed or a
//!   clock not yet synced heals by itself;
//! - HTTP 401/403 on the upgrade (attach token invalid, expired, revoked) or close code
//!   4401/4403 (token expired or revoked, annex mismatch): the token will never work again, so
//!   the link stops, cancels the jobs still running (their reports could not be delivered) and
//!   [`run`] returns an error naming the refusal.
//!
//! TLS (`wss://`): [`attach_tls_config`](crate::tls::attach_tls_config) trusts the system's roots
//! plus the EP's `tls_ca_file`, the same set as the EP's HTTP client (reqwest's platform
//! verifier), with the ring provider.
//!
//! Cancel safety: in the session loop every `select!` branch is cancel-safe
//! (`StreamExt::next`, `UnboundedReceiver::recv`, `Interval::tick`, `cancelled`); sends happen
//! inside a branch body, never inside the `select!`.

mod queue;

use crate::config::{Settings, stop_grace};
use crate::job::Jobs;
use crate::renew::{Answer, Ask, Fresh, Renewer};
use crate::runtime::CancelSignal;
use crate::warm::Warmer;
use anyhow::{Context as _, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use htfaas_functions::Resources;
use htfaas_functions::manifest::RuntimeKind;
use htfaas_functions::proto::{
    AttachLease, EpMsg, FINAL_CLOSE_CODES, Hello, JobAssignment, JobReport, MAX_FRAME_MESSAGES, MAX_HELLO_IMAGES,
    Outcome, PROTOCOL, Prefetch, SchedulerMsg, decode_frame,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// First delay before re-dialling.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between dials.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long to wait for the TCP + WebSocket handshake, and then for `Welcome`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a renewal the scheduler asks for (a bound on its word, so a huge number
/// cannot overflow the clock): a year.
const MAX_RENEW_WAIT_MS: u64 = 365 * 24 * 3600 * 1000;
/// Keep-alive ping period.
const PING_EVERY: Duration = Duration::from_secs(15);
/// Most bytes of a refusal's body quoted in the error.
const REFUSAL_SNIPPET: usize = 200;
/// Most bytes of reports sent in one array frame (a single larger report goes alone; the
/// scheduler takes frames up to 4 MiB).
const MAX_FRAME_BYTES: usize = 1 << 20;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What survives a reconnect.
struct Link {
    settings: Arc<Settings>,
    jobs: Arc<Jobs>,
    /// Compiles the modules the scheduler names ahead of their first job (`Warm`).
    warmer: Warmer,
    tracker: TaskTracker,
    report_tx: mpsc::UnboundedSender<JobReport>,
    report_rx: mpsc::UnboundedReceiver<JobReport>,
    /// Jobs started and not yet reported into `pending`, with the signal that cancels each.
    running: HashMap<String, CancelSignal>,
    /// What each started job's assignment reserves, for starting queued jobs.
    reserved: HashMap<String, Resources>,
    /// The vacate time of each started native job, which a stop waits for.
    vacating: HashMap<String, Duration>,
    /// Jobs assigned on this session and not started yet (prefetched), oldest first, with
    /// when each arrived.
    queued: VecDeque<(JobAssignment, Instant)>,
    /// The session's prefetch extension, from its `Welcome`; `None` without it.
    ext: Option<Prefetch>,
    /// Reports (`Finished`, `NotStarted`) the scheduler has not been sent yet.
    pending: VecDeque<EpMsg>,
    /// Frames from the scheduler that did not parse.
    bad_frames: u64,
    /// Set once a drain (or stop) began: no new jobs; leave when `running` and `pending` are
    /// empty, or at this moment.
    drain_deadline: Option<Instant>,
    /// Set once a stop began: the running jobs were cancelled.
    stopping: bool,
    /// Jobs' requests for fresh macaroons, sent as `Renew` on the session.
    renew_rx: mpsc::UnboundedReceiver<Ask>,
    /// Who waits for the answer to each job's `Renew` on this session; dropped (the job goes on
    /// without) when the session ends.
    renewals: HashMap<String, tokio::sync::oneshot::Sender<Answer>>,
    /// Jobs cancelled by the stop, whose `Cancelled` report is dropped rather than sent.
    stopped: HashSet<String>,
    /// The attach token the EP dials with: the settings' one, then each renewal's.
    attach_token: String,
    /// When to ask this session's scheduler for a new attach token; `None`: not (again).
    renew_attach_at: Option<Instant>,
    /// Since when the reports in `pending` wait ([`report_hold`]); `None` when none does.
    reports_since: Option<Instant>,
}

/// How a session ended without an error.
enum SessionEnd {
    /// Shutdown drained everything (or ran out of time); stop.
    Done,
}

/// The scheduler refused this EP in a way retrying cannot change (HTTP 401/403 on attach, close
/// code 4401/4403). Carried inside the session's `anyhow::Error`; [`run`] looks for it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

/// Reason of the hand-back answering an assignment that arrives while draining, and of the
/// queued jobs a drain hands back.
pub(crate) const DRAINING_REASON: &str = "EP draining";
/// Longest a lone report is held for the next one to share its frame ([`report_hold`]).
pub(crate) const REPORT_LINGER: Duration = Duration::from_millis(1);
/// Reason of the hand-back of a queued job that could not start within the granted wait.
pub(crate) const PREFETCH_WAIT_REASON: &str = "prefetched, and no room to start it within the prefetch wait";

pub(crate) async fn run(
    settings: Arc<Settings>,
    drain: CancellationToken,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (report_tx, report_rx) = mpsc::unbounded_channel();
    let (renewer, renew_rx) = Renewer::channel();
    let jobs = Arc::new(Jobs::new(settings.clone(), renewer));
    // The credential renewed before this start, when it is the configured one and lasts longer.
    let settings_token = crate::kept_token::pick(&settings.work_dir, &settings.attach_token);
    let mut link = Link {
        warmer: Warmer::start(settings.clone(), jobs.clone()),
        jobs,
        settings,
        tracker: TaskTracker::new(),
        report_tx,
        report_rx,
        running: HashMap::new(),
        reserved: HashMap::new(),
        vacating: HashMap::new(),
        queued: VecDeque::new(),
        reports_since: None,
        ext: None,
        pending: VecDeque::new(),
        bad_frames: 0,
        drain_deadline: None,
        stopping: false,
        stopped: HashSet::new(),
        renew_rx,
        renewals: HashMap::new(),
        attach_token: settings_token,
        renew_attach_at: None,
    };
    tracing::info!(name = %link.settings.name, url = %link.settings.attach_url, "ep starting");
    let mut backoff = MIN_BACKOFF;
    loop {
        if stop.is_cancelled() {
            link.begin_stop("stop asked for");
        }
        if drain.is_cancelled() {
            link.begin_drain();
        }
        if link.drain_deadline.is_some() {
            link.absorb_finished();
            if link.drained() {
                break;
            }
            if link.drain_expired() {
                if link.stopping {
                    link.warn_abandoned();
                    break;
                }
                link.begin_stop("drain deadline passed");
            }
        }
        let mut welcomed = false;
        match link.session(&drain, &stop, &mut welcomed).await {
            Ok(SessionEnd::Done) => break,
            Err(e) => {
                link.drop_queue();
                if let Some(Refused(reason)) = e.downcast_ref::<Refused>() {
                    tracing::error!("scheduler refused this EP for good; not reconnecting: {reason}");
                    link.abandon(reason);
                    link.tracker.close();
                    return Err(anyhow!("scheduler refused this EP for good: {reason}"));
                }
                tracing::warn!("scheduler link failed: {e:#}");
            }
        }
        if welcomed {
            backoff = MIN_BACKOFF;
        }
        // Wait before re-dialling; during a drain, never past its deadline.
        let mut wake = Instant::now() + backoff;
        if let Some(d) = link.drain_deadline {
            wake = wake.min(d);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = drain.cancelled(), if link.drain_deadline.is_none() => {}
            _ = stop.cancelled(), if !link.stopping => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    link.tracker.close();
    tracing::info!(unparsable_frames = link.bad_frames, "ep stopped");
    Ok(())
}

impl Link {
    fn begin_drain(&mut self) {
        if self.drain_deadline.is_none() {
            tracing::info!(
                running = self.running.len(),
                queued = self.queued.len(),
                deadline = ?self.settings.drain_timeout,
                "draining: no new jobs; running ones finish, queued ones are handed back"
            );
            self.drain_deadline = Some(Instant::now() + self.settings.drain_timeout);
            while let Some((job, _)) = self.queued.pop_front() {
                self.hand_back(job.job_id, DRAINING_REASON);
            }
            self.set_activity();
        }
    }

    fn start(&mut self, job: JobAssignment) {
        let cancel = CancelSignal::new();
        self.running.insert(job.job_id.clone(), cancel.clone());
        self.reserved.insert(job.job_id.clone(), job.resources);
        if let Some(native) = &job.function.native {
            let vacate = htfaas_functions::manifest::vacate_time(native.vacate_s, job.resources.runtime_s);
            self.vacating.insert(job.job_id.clone(), Duration::from_secs(vacate));
        }
        let jobs = self.jobs.clone();
        let tx = self.report_tx.clone();
        self.tracker.spawn(async move {
            let report = jobs.execute(job, cancel).await;
            let _ = tx.send(report);
        });
    }

    /// Cancels every running job (their reports will be dropped) and leaves [`stop_grace`] for
    /// them to clean up (a native job: its vacate time) and for unsent reports to go out.
    fn begin_stop(&mut self, why: &str) {
        if self.stopping {
            return;
        }
        self.begin_drain();
        self.stopping = true;
        let longest = self.vacating.values().max().copied().unwrap_or_default();
        self.drain_deadline = Some(Instant::now() + stop_grace(longest));
        self.absorb_finished();
        let mut ids: Vec<&str> = self.running.keys().map(String::as_str).collect();
        ids.sort_unstable();
        tracing::info!(%why, cancelled = ?ids, "stopping: running jobs cancelled; the scheduler runs them again");
        for (id, signal) in &self.running {
            signal.cancel("EP stopping");
            self.stopped.insert(id.clone());
        }
    }

    fn drained(&self) -> bool {
        self.running.is_empty() && self.pending.is_empty() && self.queued.is_empty()
    }

    fn drain_expired(&self) -> bool {
        self.drain_deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn warn_abandoned(&self) {
        tracing::warn!(
            running = self.running.len(),
            unsent_reports = self.pending.len(),
            "out of time to drain and stop; leaving jobs and reports behind"
        );
    }

    /// The link ends for good while jobs may still run: they are cancelled (their reports could
    /// not be delivered; the scheduler gives them to another EP) and logged with what is lost.
    fn abandon(&mut self, reason: &str) {
        self.absorb_finished();
        if self.running.is_empty() && self.pending.is_empty() {
            return;
        }
        let mut ids: Vec<&str> = self.running.keys().map(String::as_str).collect();
        ids.sort_unstable();
        let unsent: Vec<&str> = self.pending.iter().map(report_job).collect();
        tracing::warn!(running = ?ids, unsent_reports = ?unsent, "abandoning jobs: their reports cannot be delivered");
        for signal in self.running.values() {
            signal.cancel(&format!("EP detached: {reason}"));
        }
    }

    /// Moves reports that arrived on the channel into `pending`.
    fn absorb_finished(&mut self) {
        while let Ok(report) = self.report_rx.try_recv() {
            self.finished(report);
        }
    }

    fn finished(&mut self, report: JobReport) {
        self.running.remove(&report.job_id);
        self.reserved.remove(&report.job_id);
        self.vacating.remove(&report.job_id);
        let stopped = self.stopped.remove(&report.job_id) && matches!(report.outcome, Outcome::Cancelled { .. });
        // A job that stored its checkpoint as it stopped is reported, so the scheduler resumes
        // it from there at once (a vacate, no retry used); any other is left for the scheduler
        // to run again once the session closes.
        let vacated = report.checkpoint.as_ref().is_some_and(|c| c.saved.is_some());
        if stopped && !vacated {
            tracing::info!(job.id = %report.job_id, "job stopped with the EP; not reported, so it runs again elsewhere");
        } else {
            self.pending.push_back(EpMsg::Finished(report));
        }
        // Its room goes to the next queued job at once.
        self.start_ready();
    }

    /// One connection: dial, hello, welcome, then serve until it fails or a drain or stop ends.
    async fn session(
        &mut self,
        drain: &CancellationToken,
        stop: &CancellationToken,
        welcomed: &mut bool,
    ) -> anyhow::Result<SessionEnd> {
        let mut ws = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.dial()).await.context("dial timed out")??;
        let hello = EpMsg::Hello(Hello {
            name: self.settings.name.clone(),
            slots: self.settings.slots,
            protocol: PROTOCOL,
            annex: self.settings.annex.clone(),
            labels: self.settings.labels.clone(),
            prefetch: Some(self.settings.prefetch),
            runtimes: match &self.settings.native {
                Some(_) => vec![RuntimeKind::Wasm, RuntimeKind::Native],
                None => vec![RuntimeKind::Wasm],
            },
            images: self.settings.native.as_ref().map(|n| n.images.held(MAX_HELLO_IMAGES)).unwrap_or_default(),
            renews_attach: true,
        });
        ws.send(Message::text(serde_json::to_string(&hello)?)).await.context("send hello")?;
        let (ep_id, ext, lease) =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, self.welcome(&mut ws)).await.context("no welcome")??;
        self.set_attach_lease(lease);
        *welcomed = true;
        // Hand-backs of an earlier session's queue mean nothing to this one's scheduler.
        if ext.is_none() {
            self.pending.retain(|m| !matches!(m, EpMsg::NotStarted { .. }));
        }
        self.ext = ext;
        // Answers to an earlier session's renewals will not come, and requests made between
        // sessions name jobs this session's scheduler does not run here.
        self.renewals.clear();
        while let Ok(stale) = self.renew_rx.try_recv() {
            let _ = stale.reply.send(Err("the link to the scheduler was lost".into()));
        }
        tracing::info!(%ep_id, pending_reports = self.pending.len(), prefetch = ?ext, "attached to scheduler");

        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        // Whether this session's scheduler has been told `Draining`.
        let mut told_draining = false;
        loop {
            self.absorb_finished();
            if self.drain_deadline.is_some() && !told_draining {
                let text = serde_json::to_string(&EpMsg::Draining)?;
                ws.send(Message::text(text)).await.context("send draining")?;
                told_draining = true;
                tracing::info!(running = self.running.len(), "told the scheduler: draining");
            }
            let hold = self.reports_held_until();
            if hold.is_none() {
                self.flush(&mut ws).await?;
            }
            if self.drain_deadline.is_some() {
                if self.drained() {
                    tracing::info!("drained: every job reported");
                    let _ = ws.close(None).await;
                    return Ok(SessionEnd::Done);
                }
                if self.drain_expired() {
                    if !self.stopping {
                        self.begin_stop("drain deadline passed");
                        continue;
                    }
                    self.warn_abandoned();
                    let _ = ws.close(None).await;
                    return Ok(SessionEnd::Done);
                }
            }
            let drain_wake = self.drain_deadline.unwrap_or_else(|| Instant::now() + PING_EVERY);
            let handback = self.next_handback();
            tokio::select! {
                frame = ws.next() => match frame {
                    None => bail!("scheduler closed the connection"),
                    Some(Err(e)) => return Err(anyhow!(e).context("read from scheduler")),
                    Some(Ok(Message::Text(text))) => self.on_text(text.as_str()),
                    Some(Ok(Message::Binary(_))) => {
                        self.bad_frames += 1;
                        tracing::warn!(total = self.bad_frames, "ignored a binary frame from the scheduler");
                    }
                    Some(Ok(Message::Close(frame))) => return Err(closed(frame)),
                    Some(Ok(_)) => {} // ping/pong: tungstenite answers pings itself
                },
                report = self.report_rx.recv() => {
                    if let Some(report) = report {
                        self.finished(report);
                    }
                }
                _ = tokio::time::sleep_until(self.renew_attach_at.unwrap_or(drain_wake)), if self.renew_attach_at.is_some() => {
                    self.renew_attach_at = None;
                    ws.send(Message::text(serde_json::to_string(&EpMsg::RenewAttach)?)).await.context("send renew_attach")?;
                    tracing::info!("asked the scheduler for a new attach token");
                }
                Some(ask) = self.renew_rx.recv() => {
                    let text = serde_json::to_string(&EpMsg::Renew { job_id: ask.job_id.clone() })?;
                    self.renewals.insert(ask.job_id, ask.reply);
                    ws.send(Message::text(text)).await.context("send renew")?;
                }
                _ = ping.tick() => ws.send(Message::Ping(Default::default())).await.context("send ping")?,
                _ = drain.cancelled(), if self.drain_deadline.is_none() => self.begin_drain(),
                _ = stop.cancelled(), if !self.stopping => self.begin_stop("stop asked for"),
                _ = tokio::time::sleep_until(drain_wake), if self.drain_deadline.is_some() => {}
                _ = tokio::time::sleep_until(handback.unwrap_or(drain_wake)), if handback.is_some() => self.start_ready(),
                _ = tokio::time::sleep_until(hold.unwrap_or(drain_wake)), if hold.is_some() => {}
            }
        }
    }

    async fn dial(&self) -> anyhow::Result<Ws> {
        let mut request = self.settings.attach_url.as_str().into_client_request().context("attach URL")?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", self.attach_token))
            .map_err(|_| anyhow!("attach token is not a valid header value"))?;
        auth.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, auth);
        // `None` for `ws://`, where no TLS happens; `Some` for `wss://` (see `Config::resolve`).
        let connector = self.settings.attach_tls.clone().map(Connector::Rustls);
        let connecting = tokio_tungstenite::connect_async_tls_with_config(request, None, true, connector);
        let (ws, _response) = connecting.await.map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => {
                let status = resp.status();
                let body = resp.body().as_deref().map(snippet).unwrap_or_default();
                let why = if body.is_empty() {
                    format!("attach refused: HTTP {status}")
                } else {
                    format!("attach refused: HTTP {status}: {body}")
                };
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    anyhow!(Refused(why))
                } else {
                    anyhow!(why)
                }
            }
            tokio_tungstenite::tungstenite::Error::Io(e) if untrusted_certificate(&e) => anyhow!(e).context(format!(
                "connect to {}: the scheduler's TLS certificate is not trusted (is tls_ca_file the CA that signed it?)",
                self.settings.attach_url
            )),
            other => anyhow!(other).context(format!("connect to {}", self.settings.attach_url)),
        })?;
        Ok(ws)
    }

    /// When to ask for a new attach token, from what the scheduler said of the current one.
    fn set_attach_lease(&mut self, lease: Option<AttachLease>) {
        self.renew_attach_at = lease
            .and_then(|l| l.renew_in_ms)
            .map(|ms| Instant::now() + Duration::from_millis(ms.min(MAX_RENEW_WAIT_MS)));
        if let Some(l) = lease {
            tracing::debug!(expires_in_ms = l.expires_in_ms, renew_in_ms = ?l.renew_in_ms, "attach token lease");
        }
    }

    /// The session id, the prefetch extension granted and the attach token's lease, from
    /// `Welcome`.
    async fn welcome(&mut self, ws: &mut Ws) -> anyhow::Result<(String, Option<Prefetch>, Option<AttachLease>)> {
        loop {
            match ws.next().await {
                None => bail!("scheduler closed the connection before welcome"),
                Some(Err(e)) => return Err(anyhow!(e).context("read welcome")),
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<SchedulerMsg>(text.as_str()) {
                    Ok(SchedulerMsg::Welcome { ep_id, prefetch, attach }) => return Ok((ep_id, prefetch, attach)),
                    Ok(SchedulerMsg::Assign(job)) => {
                        bail!("scheduler assigned job {} before welcome", job.job_id)
                    }
                    Ok(SchedulerMsg::Cancel { job_id, .. }) => {
                        bail!("scheduler cancelled job {job_id} before welcome")
                    }
                    Ok(SchedulerMsg::Lifetime { .. }) => bail!("scheduler set a lifetime before welcome"),
                    Ok(SchedulerMsg::Warm { .. }) => bail!("scheduler named a module to warm before welcome"),
                    Ok(SchedulerMsg::Retire { .. }) => bail!("scheduler retired handlers before welcome"),
                    Ok(SchedulerMsg::Renewed { job_id, .. } | SchedulerMsg::RenewRefused { job_id, .. }) => {
                        bail!("scheduler answered a renewal of job {job_id} before welcome")
                    }
                    Ok(SchedulerMsg::AttachRenewed { .. } | SchedulerMsg::AttachRenewRefused { .. }) => {
                        bail!("scheduler answered an attach renewal before welcome")
                    }
                    Err(e) => {
                        self.bad_frames += 1;
                        tracing::warn!(total = self.bad_frames, "unparsable frame from the scheduler: {e}");
                    }
                },
                Some(Ok(Message::Close(frame))) => return Err(closed(frame)),
                Some(Ok(_)) => {}
            }
        }
    }

    fn on_text(&mut self, text: &str) {
        match decode_frame::<SchedulerMsg>(text, self.ext.is_some()) {
            Ok(msgs) => {
                for msg in msgs {
                    self.on_msg(msg);
                }
                self.start_ready();
            }
            Err(e) => {
                self.bad_frames += 1;
                tracing::warn!(total = self.bad_frames, "unparsable frame from the scheduler: {e}");
            }
        }
    }

    fn on_msg(&mut self, msg: SchedulerMsg) {
        match msg {
            SchedulerMsg::Assign(job) => {
                if self.running.contains_key(&job.job_id) || self.queued.iter().any(|(q, _)| q.job_id == job.job_id) {
                    tracing::warn!(job.id = %job.job_id, "assignment for a job already held ignored");
                } else if self.drain_deadline.is_some() {
                    tracing::warn!(job.id = %job.job_id, "assignment while draining: handed back, not run");
                    self.hand_back(job.job_id, DRAINING_REASON);
                } else {
                    self.queued.push_back((job, Instant::now()));
                }
            }
            SchedulerMsg::Welcome { ep_id, .. } => tracing::warn!(%ep_id, "unexpected second welcome ignored"),
            SchedulerMsg::Warm { digest, module_url } => self.warmer.warm(digest, module_url),
            SchedulerMsg::Renewed { job_id, input_macaroon, output_macaroon, checkpoint_macaroon, ref_macaroons } => {
                let fresh = Fresh {
                    input: input_macaroon,
                    output: output_macaroon,
                    checkpoint: checkpoint_macaroon,
                    refs: ref_macaroons,
                };
                self.answer_renewal(&job_id, Ok(fresh));
            }
            SchedulerMsg::RenewRefused { job_id, reason } => self.answer_renewal(&job_id, Err(reason)),
            SchedulerMsg::AttachRenewed { token, lease } => {
                tracing::info!(expires_in_s = lease.expires_in_ms / 1000, "attach token renewed");
                self.settings.metrics.attach_renewal(true);
                let (dir, kept) = (self.settings.work_dir.clone(), token.clone());
                drop(tokio::task::spawn_blocking(move || crate::kept_token::keep(&dir, &kept)));
                self.attach_token = token;
                self.set_attach_lease(Some(lease));
            }
            SchedulerMsg::AttachRenewRefused { reason } => {
                tracing::warn!(%reason, "the scheduler did not renew the attach token; the session ends when it expires");
                self.settings.metrics.attach_renewal(false);
                self.renew_attach_at = None;
            }
            SchedulerMsg::Retire { reason } => {
                if let Some(host) = &self.settings.native {
                    let retired = host.handlers.retire_all();
                    tracing::info!(idle = retired.len(), %reason, "retiring every handler");
                    tokio::spawn(crate::native::handlers::retire(retired));
                }
            }
            SchedulerMsg::Lifetime { leave_in_ms } => {
                tracing::info!(leave_in_ms, "the scheduler set this EP's lifetime");
                self.settings.lease.end_in(Duration::from_millis(leave_in_ms));
            }
            SchedulerMsg::Cancel { job_id, reason, ends } => {
                if let Some(signal) = self.running.get(&job_id) {
                    tracing::info!(job.id = %job_id, %reason, ends, "cancelling job");
                    signal.cancel_for(&reason, ends);
                } else if let Some(at) = self.queued.iter().position(|(q, _)| q.job_id == job_id) {
                    tracing::info!(job.id = %job_id, %reason, "cancelling a queued job: it never starts");
                    self.queued.remove(at);
                    self.pending.push_back(EpMsg::Finished(JobReport::unstarted(job_id, reason)));
                    self.set_activity();
                } else {
                    tracing::debug!(job.id = %job_id, "cancel for a job not running here ignored");
                }
            }
        }
    }

    /// Hands the scheduler's answer to a `Renew` to the job that asked; an answer nobody waits
    /// for (the job ended, or it never asked) is ignored.
    fn answer_renewal(&mut self, job_id: &str, answer: Answer) {
        match self.renewals.remove(job_id) {
            Some(waiter) => {
                let _ = waiter.send(answer);
            }
            None => tracing::debug!(job.id = %job_id, "renewal answer nobody waits for ignored"),
        }
    }

    /// Until when the reports waiting in `pending` are held back ([`report_hold`]), if they are.
    fn reports_held_until(&mut self) -> Option<Instant> {
        if self.pending.is_empty() {
            self.reports_since = None;
            return None;
        }
        let since = *self.reports_since.get_or_insert_with(Instant::now);
        let leaving = self.drain_deadline.is_some() || self.stopping;
        report_hold(self.pending.len(), self.running.len(), self.queued.len(), leaving, since)
            .filter(|until| Instant::now() < *until)
    }

    /// Sends every pending report, oldest first (within the extension, those waiting together
    /// in one array frame of at most [`MAX_FRAME_MESSAGES`] and about [`MAX_FRAME_BYTES`]); a
    /// report stays pending until the socket took it.
    async fn flush(&mut self, ws: &mut Ws) -> anyhow::Result<()> {
        while !self.pending.is_empty() {
            let most = if self.ext.is_some() { MAX_FRAME_MESSAGES } else { 1 };
            let mut parts = Vec::new();
            let mut bytes = 0;
            for msg in self.pending.iter().take(most) {
                let text = serde_json::to_string(msg)?;
                if !parts.is_empty() && bytes + text.len() > MAX_FRAME_BYTES {
                    break;
                }
                bytes += text.len() + 1;
                parts.push(text);
            }
            let n = parts.len();
            let frame = if n == 1 { parts.swap_remove(0) } else { format!("[{}]", parts.join(",")) };
            ws.send(Message::text(frame)).await.context("send report")?;
            for msg in self.pending.drain(..n) {
                tracing::debug!(job.id = %report_job(&msg), "report sent");
            }
        }
        Ok(())
    }
}

/// Until when a lone report is held back, waiting for the next one to share its frame: up to
/// [`REPORT_LINGER`] from `since` (when it began to wait), and only while other jobs of this EP
/// run and more wait in its queue. The room it freed has its next job already, so the slot
/// does not idle for it; and reports that go together are one frame, one write of the
/// scheduler's store and one dispatch round for the room they free (the scheduler's CPU per
/// job fell by a fifth in the bench, BENCHMARKS.md). `None`: send now — two reports or more,
/// nothing else running (a lone job's report is never delayed), nothing queued (the room would
/// idle), or the EP leaving (`leaving`: a drain or a stop).
fn report_hold(pending: usize, running: usize, queued: usize, leaving: bool, since: Instant) -> Option<Instant> {
    (pending == 1 && running > 0 && queued > 0 && !leaving).then(|| since + REPORT_LINGER)
}

/// The job a pending message is about.
fn report_job(msg: &EpMsg) -> &str {
    match msg {
        EpMsg::Finished(r) => &r.job_id,
        EpMsg::NotStarted { job_id, .. } => job_id,
        EpMsg::Hello(_) | EpMsg::Draining | EpMsg::Renew { .. } | EpMsg::RenewAttach => "",
    }
}

/// The error for a close frame: [`Refused`] for [`FINAL_CLOSE_CODES`], a plain (retried) one
/// otherwise.
fn closed(frame: Option<CloseFrame>) -> anyhow::Error {
    let Some(frame) = frame else {
        return anyhow!("scheduler closed the connection without a close code");
    };
    let code = u16::from(frame.code);
    let reason = snippet(frame.reason.as_bytes());
    if FINAL_CLOSE_CODES.contains(&code) {
        anyhow!(Refused(format!("scheduler closed the session with code {code}: {reason}")))
    } else {
        anyhow!("scheduler closed the connection with code {code}: {reason}")
    }
}

/// Whether a dial failed because the peer's certificate was refused (unknown issuer, wrong
/// name, expired…): tokio-rustls carries rustls' error inside the `io::Error`.
fn untrusted_certificate(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)))
}

/// Up to [`REFUSAL_SNIPPET`] bytes of text from the scheduler, fit for one log line.
fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(REFUSAL_SNIPPET)]);
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_owned()
}

#[cfg(test)]
mod tests;
