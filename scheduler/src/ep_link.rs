//! One EP session over the attach WebSocket (HTCondor's direct attach, without a central
//! manager): the EP dials in with an attach token, says [`EpMsg::Hello`], gets
//! [`SchedulerMsg::Welcome`], then receives [`SchedulerMsg::Assign`] and answers each with
//! [`EpMsg::Finished`]; a [`SchedulerMsg::Cancel`] asks it to stop a job early. One JSON text
//! frame per message.
//!
//! The token (checked before the upgrade, in `crate::api`) decides which jobs the EP may run
//! (its `owner` and `annex`); the EP's own messages never widen that. The Hello's `name` and
//! `labels` are self-asserted (an attach token names no EP): they are shown to admins, recorded
//! with attempts and select admin settings (drain, disable, pause by name), but decide nothing
//! an EP may do; an EP that renames itself to escape a `disable` is stopped by revoking its
//! attach token. What an EP reports is doubted ([`crate::doubt`]): usage clamped to what the
//! scheduler saw, outputs only under the job's output directory, else the report is refused;
//! a job it turns away unrun counts as a lost attempt, with the backoff. A Hello naming another
//! annex than the token's is refused (close [`CLOSE_FORBIDDEN`]) so that an operator's mistake
//! shows at once. An EP of an annex the scheduler keeps a record of is told the annex's end
//! ([`SchedulerMsg::Lifetime`], `crate::annex`) right after its Welcome, and every EP the
//! modules on the warm list that it may run ([`SchedulerMsg::Warm`], `crate::warm`). The session is
//! closed when its token expires ([`CLOSE_EXPIRED`], at `exp`
//! itself, without leeway) or is revoked ([`CLOSE_FORBIDDEN`]). A bad frame is logged and
//! counted, and the session goes on (up to [`MAX_BAD_FRAMES`]). A `Finished` for a job that is
//! not running on this session is ignored. Every frame from the EP renews the session's lease
//! ([`crate::Config::lease_s`]; EPs ping every 15 s): an EP silent for longer (vanished host,
//! half-open connection) is treated as gone. When the session ends, for whatever reason, its
//! running jobs lose it: each runs again after a backoff, or is held past the retry limit
//! ([`crate::queue::Queue::lose_session`]); jobs removed or held meanwhile keep their state. At
//! scheduler shutdown they just go back to idle.
//!
//! The `Finished` reports of one frame are recorded in one write, in a task of their own (at
//! most [`MAX_REPORTS_IN_FLIGHT`] tasks per session), so that a burst of reports shares the
//! store's commits instead of waiting for one fsync each; when the session ends, every report
//! it read is recorded before its jobs lose it.
//! A report the store cannot take (a full disk) is kept and tried again until it can, or the
//! scheduler stops; so is the requeue of a departed session's jobs (else they would stay
//! `running` on a session that is gone, until their run time removed them). A report of [`htfaas_functions::proto::Outcome::StorageUnavailable`] counts
//! as a lost attempt ([`crate::queue::Queue::finish`]), with the same retry rule.
//!
//! Prefetch: an EP whose Hello asks for it ([`Hello::prefetch`]) is granted
//! [`crate::policy::SitePolicy::prefetch`] in its Welcome: the dispatcher then assigns it up to
//! that many jobs beyond its free resources (see `crate::matching`), the session sends the
//! Assigns waiting for it in one array frame, and takes array frames from it. Such an EP may hand
//! a job back unstarted ([`EpMsg::NotStarted`]): a job assigned to this session goes back to
//! idle at once with no loss counted ([`crate::queue::Queue::hand_back`]) while the EP is
//! draining, and outside a drain for as many hand-backs as it was granted prefetched jobs; the
//! first such hand-back also ends prefetching to the session (its jobs outlast the prefetch
//! wait). Past that budget a hand-back is a return (a lost attempt, as
//! [`Outcome::Cancelled`](htfaas_functions::proto::Outcome::Cancelled) unasked for), so an EP
//! cannot bounce jobs for free. A hand-back for a job not assigned to this session is ignored like
//! such a `Finished`. A session that ends takes its queued jobs with it: they are `running` on it
//! in the store, and run again elsewhere like its running ones (the EP drops its queue when the
//! connection goes).
//!
//! Attach renewal: an EP that says it renews ([`Hello::renews_attach`]) is told its token's
//! time left in its `Welcome` and, when the site renews (`renew_attach`) and its annex outlasts
//! the token, when to ask. A `RenewAttach` is answered by the session itself
//! (`crate::attach::renewed_claims`): the same credential with a later expiry, unless it was
//! revoked (checked here, against the store's revocations) or its annex ended; the session's
//! expiry moves with it. A refusal is counted as a bad frame. Placement follows: an EP whose
//! token will not be renewed takes no job that would outlast the token, nor (any EP of an
//! annex on record) one that would outlast its annex (`EpSlot::token_ends_ms`,
//! `EpSlot::annex_leaves_ms`).
//!
//! Renewal: a `Renew` for a job this session holds starts a renewal of its
//! macaroons (`crate::renew`) in a task beside the reports (the session awaits it before
//! its jobs lose it); one for a job it does not hold, or one already being renewed, is answered
//! `RenewRefused`, recorded, and counted as a bad frame.
//!
//! Cancel safety: `WebSocket::recv`, `mpsc::recv`, `JoinSet::join_next` and a pinned `Sleep`
//! are all cancel-safe, so the session loop can `select!` on them and on shutdown without
//! losing a message.

use crate::matching::{EpSlot, Pool, ToEp};
use crate::metrics::{Reason, Token};
use crate::queue::{Loss, now_ms};
use crate::reports::{finished_many, not_started, until_stored};
use crate::revocation::Credential;
use crate::state::Shared;
use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use htfaas_functions::manifest::MAX_RUNTIME_S;
use htfaas_functions::proto::{
    EpMsg, Hello, JobReport, LabelError, MAX_FRAME_MESSAGES, SchedulerMsg, check_labels, decode_frame, encode_frame,
};
use htfaas_functions::token::AttachClaims;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::attach::{CLOSE_EXPIRED, CLOSE_FORBIDDEN, MAX_CLOSE_REASON_BYTES, MAX_MESSAGE_BYTES, PROTOCOL};

/// Most reports of one session being recorded at once. Reports are recorded concurrently, so
/// that the reports of many jobs share one commit of the store (group commit); past this many,
/// the session reads no further frame until one is done.
pub const MAX_REPORTS_IN_FLIGHT: usize = 256;

/// Longest job id a `Renew` may name (ids are UUIDs); a longer one is a bad frame.
pub const MAX_JOB_ID_BYTES: usize = 128;

/// How long an EP has to say Hello after the upgrade.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Bad frames tolerated in one session before it is closed.
pub const MAX_BAD_FRAMES: u32 = 64;
/// Largest EP an Hello may describe: cores.
pub const MAX_EP_CPUS: u32 = 65_536;
/// Largest EP an Hello may describe: memory, MiB (64 TiB).
pub const MAX_EP_MEMORY_MB: u64 = 64 * 1024 * 1024;
/// Largest EP an Hello may describe: GPUs.
pub const MAX_EP_GPUS: u32 = 1024;
/// Largest EP an Hello may describe: disk, MiB (1 PiB).
pub const MAX_EP_DISK_MB: u64 = 1024 * 1024 * 1024;

/// Why a Hello is refused ([`check_hello`], [`check_annex`]); the message is the close
/// frame's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The EP speaks another attach protocol than [`PROTOCOL`].
    #[error("unsupported protocol {0} (this scheduler speaks {PROTOCOL})")]
    Protocol(u32),
    /// The name is empty, longer than 128 bytes or holds a control character.
    #[error("name must be 1-128 printable characters")]
    Name,
    /// `slots.cpus` is 0 or over [`MAX_EP_CPUS`].
    #[error("slots.cpus must be 1..={MAX_EP_CPUS}")]
    Cpus,
    /// `slots.memory_mb` is 0 or over [`MAX_EP_MEMORY_MB`].
    #[error("slots.memory_mb must be 1..={MAX_EP_MEMORY_MB}")]
    MemoryMb,
    /// `slots.runtime_s` is 0 or over 100 times [`MAX_RUNTIME_S`].
    #[error("slots.runtime_s must be 1..={}", 100 * MAX_RUNTIME_S)]
    RuntimeS,
    /// The labels are refused ([`check_labels`]).
    #[error(transparent)]
    Labels(#[from] LabelError),
    /// `slots.gpus` is over [`MAX_EP_GPUS`].
    #[error("slots.gpus must be 0..={MAX_EP_GPUS}")]
    Gpus,
    /// `slots.disk_mb` is over [`MAX_EP_DISK_MB`].
    #[error("slots.disk_mb must be 0..={MAX_EP_DISK_MB}")]
    DiskMb,
    /// The Hello names another annex than its attach token.
    #[error("annex mismatch: the attach token is {}, the EP asked for {asked:?}", for_annex(token.as_deref()))]
    AnnexMismatch {
        /// The token's annex (none: the site's pool).
        token: Option<String>,
        /// The annex the Hello asked for.
        asked: String,
    },
}

/// "for annex "a"" or "for no annex", for [`HelloError::AnnexMismatch`].
fn for_annex(annex: Option<&str>) -> String {
    annex.map_or_else(|| "for no annex".to_owned(), |t| format!("for annex {t:?}"))
}

/// Why a Hello is refused.
pub fn check_hello(h: &Hello) -> Result<(), HelloError> {
    if h.protocol != PROTOCOL {
        return Err(HelloError::Protocol(h.protocol));
    }
    if h.name.is_empty() || h.name.len() > 128 || h.name.chars().any(char::is_control) {
        return Err(HelloError::Name);
    }
    let s = &h.slots;
    if s.cpus == 0 || s.cpus > MAX_EP_CPUS {
        return Err(HelloError::Cpus);
    }
    if s.memory_mb == 0 || s.memory_mb > MAX_EP_MEMORY_MB {
        return Err(HelloError::MemoryMb);
    }
    if s.runtime_s == 0 || s.runtime_s > 100 * MAX_RUNTIME_S {
        return Err(HelloError::RuntimeS);
    }
    check_labels(&h.labels)?;
    if s.gpus > MAX_EP_GPUS {
        return Err(HelloError::Gpus);
    }
    if s.disk_mb > MAX_EP_DISK_MB {
        return Err(HelloError::DiskMb);
    }
    Ok(())
}

/// Why a Hello is refused for the token it came with: it names another annex than the token's.
/// An absent annex in the Hello takes the token's.
pub fn check_annex(h: &Hello, claims: &AttachClaims) -> Result<(), HelloError> {
    match (&h.annex, &claims.annex) {
        (Some(asked), token) if Some(asked) != token.as_ref() => {
            Err(HelloError::AnnexMismatch { token: token.clone(), asked: asked.clone() })
        }
        _ => Ok(()),
    }
}

/// Time left until Unix second `exp`, from the wall clock.
fn until(exp: u64) -> Duration {
    Duration::from_millis(exp.saturating_mul(1000).saturating_sub(now_ms()))
}

/// Runs one session to its end, for an EP that attached from `peer` (the connection's remote
/// address).
#[tracing::instrument(name = "scheduler.attach", skip_all,
    fields(ep.sub = %claims.sub, ep.owner = ?claims.owner, ep.annex = ?claims.annex, token.jti = %claims.jti,
           ep.addr = %peer, ep.id = tracing::field::Empty, ep.name = tracing::field::Empty))]
pub async fn serve(
    mut ws: WebSocket,
    claims: AttachClaims,
    peer: IpAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let Some(hello) = read_hello(&mut ws, &shutdown).await else { return };
    if let Err((code, why)) = admit(&hello, &claims) {
        match code {
            CLOSE_FORBIDDEN => shared.metrics.refused(Token::Attach, Reason::WrongAnnex),
            CLOSE_EXPIRED => shared.metrics.refused(Token::Attach, Reason::Expired),
            _ => {}
        }
        tracing::warn!("refusing hello: {why}");
        return close(ws, code, &why).await;
    }
    let ep_id = uuid::Uuid::new_v4().to_string();
    let span = tracing::Span::current();
    span.record("ep.id", ep_id.as_str());
    span.record("ep.name", hello.name.as_str());
    let (tx, rx) = mpsc::unbounded_channel();
    // An annex's EP learns the annex's end right after its Welcome (the session sends what
    // waits in `rx` once welcomed).
    let annex = crate::annex::on_attach(&shared, claims.annex.as_deref());
    let renews = hello.renews_attach && shared.policy.renew_attach;
    let attach_lease = crate::attach::lease(&claims, now_ms(), renews, annex.as_ref().map(|a| a.ends_ms));
    let annex_leaves_ms = annex.map(|a| {
        let _ = tx.send(ToEp::Send(a.lifetime));
        a.leaves_ms
    });
    let warm_tx = tx.clone();
    let pool = Pool { annex: claims.annex.clone(), owner: claims.owner.clone() };
    let credential = Credential::of_attach(&claims);
    let mut slot = EpSlot::new(ep_id.clone(), hello.name.clone(), peer, pool, credential, hello.slots, tx);
    slot.labels = hello.labels.clone();
    slot.native = hello.runtimes.contains(&htfaas_functions::manifest::RuntimeKind::Native);
    slot.images =
        hello.images.iter().take(htfaas_functions::proto::MAX_HELLO_IMAGES).map(|d| d.as_str().to_owned()).collect();
    let prefetch = hello.prefetch.map(|asked| shared.policy.prefetch(asked));
    slot.prefetch = prefetch.map_or(0, |p| p.jobs);
    slot.extension = prefetch.is_some();
    slot.annex_leaves_ms = annex_leaves_ms;
    slot.token_ends_ms = attach_lease.renew_in_ms.is_none().then(|| claims.exp.saturating_mul(1000));
    if let Err(reason) = register(&shared, slot) {
        shared.metrics.refused(Token::Attach, Reason::Revoked);
        tracing::info!("attach token revoked meanwhile: {reason}");
        return close(ws, CLOSE_FORBIDDEN, &format!("attach token revoked: {reason}")).await;
    }
    // The modules on the warm list it may run, to compile ahead; read once it is in
    // the table, so a module announced meanwhile reaches it one way or the other (twice at
    // worst, which the EP ignores).
    for warm in crate::warm::on_attach(&shared, claims.owner.as_deref()) {
        let _ = warm_tx.send(ToEp::Send(warm));
    }
    drop(warm_tx);
    tracing::info!(
        cpus = hello.slots.cpus,
        memory_mb = hello.slots.memory_mb,
        runtime_s = hello.slots.runtime_s,
        prefetch = prefetch.map(|p| p.jobs),
        "EP attached"
    );
    let welcome =
        SchedulerMsg::Welcome { ep_id: ep_id.clone(), prefetch, attach: hello.renews_attach.then_some(attach_lease) };
    let why = if send(&mut ws, &welcome).await.is_ok() {
        shared.wake.notify_one();
        let mut reports = tokio::task::JoinSet::new();
        let ext = Extension { on: prefetch.is_some(), free_handbacks: prefetch.map_or(0, |p| p.jobs) };
        let token = SessionToken { claims, renews };
        let why = session(&mut ws, rx, &shared, &ep_id, token, &shutdown, &mut reports, ext).await;
        // Every report read is recorded (or refused) before the session's jobs lose it.
        while let Some(done) = reports.join_next().await {
            report_ended(done);
        }
        why
    } else {
        drop(rx);
        "the EP left before its welcome".to_owned()
    };

    // The receiver is gone, so a late Assign fails and the dispatcher reverts its job; leave
    // the table (no new Assigns), then requeue (or hold, past the retry limit) whatever was
    // running here.
    shared.eps().remove(&ep_id);
    let loss = if shutdown.is_cancelled() { Loss::Shutdown } else { shared.policy.loss() };
    let lost = until_stored(&shared.shutdown, &shared.metrics, "requeue the departed EP's jobs", || {
        shared.queue.lose_session(ep_id.clone(), loss, why.clone())
    });
    match lost.await {
        Ok(lost) => {
            if !lost.requeued.is_empty() {
                tracing::info!(jobs = lost.requeued.len(), "jobs of the departed EP will run again");
            }
            if !lost.held.is_empty() {
                tracing::warn!(jobs = ?lost.held, "jobs held: they lost their EP too often");
            }
        }
        Err(e) => tracing::error!("failed to requeue the departed EP's jobs: {e}"),
    }
    tracing::info!(why = %why, "EP detached");
    shared.wake.notify_one();
}

/// The first message, which must be a Hello; `None` (after closing) otherwise.
async fn read_hello(ws: &mut WebSocket, shutdown: &CancellationToken) -> Option<Hello> {
    let frame = tokio::select! {
        _ = shutdown.cancelled() => return None,
        h = tokio::time::timeout(HELLO_TIMEOUT, ws.recv()) => h,
    };
    let refusal = match frame {
        Err(_) => (close_code::POLICY, "no hello in time"),
        Ok(None | Some(Err(_))) => return None,
        Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<EpMsg>(t.as_str()) {
            Ok(EpMsg::Hello(h)) => return Some(h),
            Ok(other) => {
                tracing::warn!(kind = kind(&other), "first message is not a hello");
                (close_code::PROTOCOL, "expected hello")
            }
            Err(e) => {
                tracing::warn!("first frame does not parse: {e}");
                (close_code::PROTOCOL, "expected hello")
            }
        },
        Ok(Some(Ok(_))) => (close_code::PROTOCOL, "expected a text frame with hello"),
    };
    let _ = ws.send(close_frame(refusal.0, refusal.1)).await;
    None
}

/// Whether this Hello may open a session with this token: `Err` has the close code and reason.
fn admit(hello: &Hello, claims: &AttachClaims) -> Result<(), (u16, String)> {
    check_hello(hello).map_err(|why| (close_code::POLICY, why.to_string()))?;
    check_annex(hello, claims).map_err(|why| (CLOSE_FORBIDDEN, why.to_string()))?;
    if until(claims.exp).is_zero() {
        return Err((CLOSE_EXPIRED, "attach token expired".into()));
    }
    Ok(())
}

/// Adds the session to the EP table unless its token was revoked meanwhile. Checked under the
/// table's lock, which a revocation takes after adding to the revoked set: either this sees
/// the revocation, or the revocation sees this session.
fn register(shared: &Shared, slot: EpSlot) -> Result<(), String> {
    let mut eps = shared.eps();
    if let Some(reason) = shared.queue.revoked_reason(&slot.credential) {
        return Err(reason);
    }
    eps.insert(slot);
    Ok(())
}

/// A session's attach token: what it was last renewed to, and whether it is renewed.
struct SessionToken {
    claims: AttachClaims,
    renews: bool,
}

/// Answers an EP's [`EpMsg::RenewAttach`]: a new token for the same credential unless it was
/// revoked, its annex ended, renewal is off, or it is too early; `token` then holds the renewed
/// claims. The slot's placement follows: a refusal means the token ends as it is.
fn renew_attach(shared: &Shared, ep_id: &str, token: &mut SessionToken) -> SchedulerMsg {
    let now = now_ms();
    let answer = (|| {
        if !token.renews {
            return Err("this scheduler does not renew attach tokens".to_owned());
        }
        if let Some(reason) = shared.queue.revoked_reason(&Credential::of_attach(&token.claims)) {
            return Err(format!("attach token revoked: {reason}"));
        }
        let ends = crate::annex::ends_ms(shared, token.claims.annex.as_deref());
        let claims = crate::attach::renewed_claims(&token.claims, now, ends).map_err(|e| e.to_string())?;
        let signed = shared.attach_key.sign(&claims).map_err(|e| format!("could not sign a new token: {e}"))?;
        Ok((signed, claims, ends))
    })();
    match answer {
        Ok((signed, claims, ends)) => {
            token.claims = claims;
            let lease = crate::attach::lease(&token.claims, now, true, ends);
            let token_end = lease.renew_in_ms.is_none().then(|| token.claims.exp.saturating_mul(1000));
            shared.eps().set_token_end(ep_id, token_end);
            tracing::info!(expires_in_s = lease.expires_in_ms / 1000, "attach token renewed");
            SchedulerMsg::AttachRenewed { token: signed, lease }
        }
        Err(reason) => {
            shared.eps().set_token_end(ep_id, Some(token.claims.exp.saturating_mul(1000)));
            tracing::warn!(%reason, "attach token not renewed");
            SchedulerMsg::AttachRenewRefused { reason }
        }
    }
}

/// A session's prefetch extension.
#[derive(Debug, Clone, Copy)]
struct Extension {
    /// The EP speaks it: array frames both ways, `NotStarted`.
    on: bool,
    /// Hand-backs outside a drain still free of a loss (the jobs it was granted).
    free_handbacks: u32,
}

/// The attached session's loop, until the EP leaves, falls silent past its lease, the token
/// expires, the scheduler closes it or shuts down. Returns why it ended (recorded with the
/// attempts of the jobs it was running).
#[allow(clippy::too_many_arguments)]
async fn session(
    ws: &mut WebSocket,
    mut rx: mpsc::UnboundedReceiver<ToEp>,
    shared: &Arc<Shared>,
    ep_id: &str,
    mut token: SessionToken,
    shutdown: &CancellationToken,
    reports: &mut tokio::task::JoinSet<()>,
    mut ext: Extension,
) -> String {
    let expiry = tokio::time::sleep(until(token.claims.exp));
    tokio::pin!(expiry);
    // The lease: renewed by every frame from the EP (it pings every 15 s).
    let lease_len = Duration::from_secs(shared.policy.lease_s);
    let lease = tokio::time::sleep(lease_len);
    tokio::pin!(lease);
    let mut bad_frames = 0u32;
    loop {
        if reports.len() >= MAX_REPORTS_IN_FLIGHT {
            // Back-pressure: read no further frame until a report is recorded.
            if let Some(done) = reports.join_next().await {
                report_ended(done);
            }
        }
        tokio::select! {
            Some(done) = reports.join_next(), if !reports.is_empty() => report_ended(done),
            _ = shutdown.cancelled() => {
                let _ = ws.send(close_frame(close_code::AWAY, "scheduler shutting down")).await;
                return "the scheduler shut down".into();
            }
            _ = &mut expiry => {
                shared.metrics.refused(Token::Attach, Reason::Expired);
                tracing::info!("attach token expired; closing the session");
                let _ = ws.send(close_frame(CLOSE_EXPIRED, "attach token expired")).await;
                return "the EP's attach token expired".into();
            }
            _ = &mut lease => {
                let why = format!("the EP was silent for {} s: its lease expired", lease_len.as_secs());
                tracing::warn!("{why}; ending the session");
                let _ = ws.send(close_frame(close_code::AWAY, "lease expired")).await;
                return why;
            }
            out = rx.recv() => match out {
                Some(ToEp::Send(msg)) => {
                    // Within the extension, what else is waiting goes in the same frame.
                    let mut batch = vec![msg];
                    let mut then = None;
                    while ext.on && batch.len() < MAX_FRAME_MESSAGES {
                        match rx.try_recv() {
                            Ok(ToEp::Send(m)) => batch.push(m),
                            Ok(close) => {
                                then = Some(close);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if send_all(ws, &batch).await.is_err() {
                        return "the connection to the EP broke".into();
                    }
                    if let Some(ToEp::Close { code, reason }) = then {
                        tracing::info!(code, "closing the session: {reason}");
                        let _ = ws.send(close_frame(code, &reason)).await;
                        return format!("the session was closed: {reason}");
                    }
                }
                Some(ToEp::Close { code, reason }) => {
                    tracing::info!(code, "closing the session: {reason}");
                    let _ = ws.send(close_frame(code, &reason)).await;
                    return format!("the session was closed: {reason}");
                }
                None => return "the session was dropped".into(),
            },
            frame = ws.recv() => {
                lease.as_mut().reset(tokio::time::Instant::now() + lease_len);
                let text = match frame {
                    None | Some(Err(_)) => return "the connection to the EP broke".into(),
                    Some(Ok(Message::Close(_))) => return "the EP closed the session".into(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Binary(_))) => {
                        bad_frame(shared, &mut bad_frames, "binary frame");
                        if bad_frames > MAX_BAD_FRAMES { return "too many bad frames".into() }
                        continue;
                    }
                    Some(Ok(Message::Text(t))) => t,
                };
                match decode_frame::<EpMsg>(text.as_str(), ext.on) {
                    Ok(msgs) => {
                        let mut ended = Vec::new();
                        for msg in msgs {
                            if matches!(msg, EpMsg::RenewAttach) {
                                let answer = renew_attach(shared, ep_id, &mut token);
                                expiry.as_mut().reset(tokio::time::Instant::now() + until(token.claims.exp));
                                if let SchedulerMsg::AttachRenewRefused { reason } = &answer {
                                    // An EP asks when told to: a refusal is counted, so
                                    // asking again and again ends the session.
                                    bad_frame(shared, &mut bad_frames, &format!("renew_attach: {reason}"));
                                }
                                if send(ws, &answer).await.is_err() {
                                    return "the connection to the EP broke".into();
                                }
                                continue;
                            }
                            on_message(shared, ep_id, msg, &mut ext, &mut bad_frames, reports, &mut ended);
                        }
                        if !ended.is_empty() {
                            reports.spawn(finished_many(shared.clone(), ep_id.to_owned(), ended));
                        }
                    }
                    Err(e) => bad_frame(shared, &mut bad_frames, &e.to_string()),
                }
                if bad_frames > MAX_BAD_FRAMES {
                    let _ = ws.send(close_frame(close_code::POLICY, "too many bad frames")).await;
                    return "too many bad frames".into();
                }
            }
        }
    }
}

/// Acts on one message from the EP, in the order the EP sent them; a frame's reports are
/// gathered in `ended`, to be recorded together.
fn on_message(
    shared: &Arc<Shared>,
    ep_id: &str,
    msg: EpMsg,
    ext: &mut Extension,
    bad_frames: &mut u32,
    reports: &mut tokio::task::JoinSet<()>,
    ended: &mut Vec<JobReport>,
) {
    match msg {
        EpMsg::Finished(report) => ended.push(report),
        EpMsg::NotStarted { job_id, reason } if ext.on => {
            let free = {
                let mut eps = shared.eps();
                match eps.prefetch_state(ep_id) {
                    Some((true, _)) => true,
                    _ if ext.free_handbacks > 0 => {
                        ext.free_handbacks -= 1;
                        eps.stop_prefetch(ep_id);
                        true
                    }
                    _ => false,
                }
            };
            reports.spawn(not_started(shared.clone(), ep_id.to_owned(), job_id, reason, free));
        }
        EpMsg::NotStarted { .. } => bad_frame(shared, bad_frames, "not_started outside the prefetch extension"),
        // Answered by the session loop, which holds the token.
        EpMsg::RenewAttach => {}
        EpMsg::Renew { job_id } if job_id.len() > MAX_JOB_ID_BYTES => {
            bad_frame(shared, bad_frames, "renew: job id too long");
        }
        EpMsg::Renew { job_id } => {
            // [`crate::renew`]: only for a job this session holds, one at a time; a
            // refusal here counts as a bad frame, so asking for others' jobs ends the session.
            let begun = shared.eps().begin_renewal(ep_id, &job_id);
            match begun {
                Ok((name, ip)) => {
                    reports.spawn(crate::renew::renew(shared.clone(), ep_id.to_owned(), name, ip, job_id));
                }
                Err(why) => {
                    bad_frame(shared, bad_frames, &format!("renew: {why}"));
                    let name = shared.eps().get(ep_id).map(|e| e.name.clone()).unwrap_or_default();
                    reports.spawn(crate::renew::refuse(shared.clone(), ep_id.to_owned(), name, job_id, why));
                }
            }
        }
        EpMsg::Hello(_) => bad_frame(shared, bad_frames, "second hello"),
        EpMsg::Draining => {
            tracing::info!("the EP is draining: no new jobs for it");
            shared.eps().set_draining(ep_id);
        }
    }
}

/// Logs a report's task that panicked (its job is then treated as lost with the session).
fn report_ended(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        tracing::error!("failed to record a finished job: its task ended: {e}");
    }
}

fn bad_frame(shared: &Shared, count: &mut u32, what: &str) {
    *count += 1;
    shared.metrics.bad_frame();
    tracing::warn!(bad_frames = *count, "bad frame from EP: {what}");
}

fn kind(m: &EpMsg) -> &'static str {
    match m {
        EpMsg::Hello(_) => "hello",
        EpMsg::Finished(_) => "finished",
        EpMsg::Draining => "draining",
        EpMsg::NotStarted { .. } => "not_started",
        EpMsg::Renew { .. } => "renew",
        EpMsg::RenewAttach => "renew_attach",
    }
}

/// Sends `msgs` in one frame (an array when more than one: only within the extension).
async fn send_all(ws: &mut WebSocket, msgs: &[SchedulerMsg]) -> Result<(), ()> {
    let text = match encode_frame(msgs) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("failed to encode messages for the EP: {e}");
            return Err(());
        }
    };
    ws.send(Message::Text(text.into())).await.map_err(|e| tracing::info!("EP connection lost: {e}"))
}

async fn send(ws: &mut WebSocket, msg: &SchedulerMsg) -> Result<(), ()> {
    let text = match serde_json::to_string(msg) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("failed to encode a message for the EP: {e}");
            return Err(());
        }
    };
    ws.send(Message::Text(text.into())).await.map_err(|e| tracing::info!("EP connection lost: {e}"))
}

/// A close frame; the reason is cut to [`MAX_CLOSE_REASON_BYTES`] at a character boundary.
fn close_frame(code: u16, reason: &str) -> Message {
    let mut cut = reason.len().min(MAX_CLOSE_REASON_BYTES);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    Message::Close(Some(CloseFrame { code, reason: reason[..cut].to_owned().into() }))
}

async fn close(mut ws: WebSocket, code: u16, reason: &str) {
    let _ = ws.send(close_frame(code, reason)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::Resources;
    use htfaas_functions::proto::{MAX_LABEL_BYTES, MAX_LABELS};

    #[test]
    fn the_hello_may_only_repeat_the_tokens_annex() {
        let claims = |annex: Option<&str>| AttachClaims {
            iss: "s".into(),
            sub: "site".into(),
            aud: "a".into(),
            exp: 0,
            iat: 0,
            jti: "j".into(),
            owner: None,
            annex: annex.map(str::to_owned),
        };
        let hello = |annex: Option<&str>| Hello {
            name: "ep".into(),
            slots: Resources::new(1, 1, 1),
            protocol: PROTOCOL,
            annex: annex.map(str::to_owned),
            labels: Default::default(),
            prefetch: None,
            runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
            images: Vec::new(),
            renews_attach: false,
        };
        assert_eq!(check_annex(&hello(None), &claims(Some("a"))), Ok(()));
        assert_eq!(check_annex(&hello(Some("a")), &claims(Some("a"))), Ok(()));
        assert_eq!(
            check_annex(&hello(Some("b")), &claims(Some("a"))).map_err(|e| e.to_string()),
            Err(r#"annex mismatch: the attach token is for annex "a", the EP asked for "b""#.into())
        );
        assert_eq!(
            check_annex(&hello(Some("b")), &claims(None)).map_err(|e| e.to_string()),
            Err(r#"annex mismatch: the attach token is for no annex, the EP asked for "b""#.into())
        );
    }

    #[test]
    fn hellos_with_too_many_or_too_long_labels_are_refused() {
        let hello = |labels: Vec<(String, String)>| Hello {
            name: "ep".into(),
            slots: Resources::new(1, 1, 1),
            protocol: PROTOCOL,
            annex: None,
            labels: labels.into_iter().collect(),
            prefetch: None,
            runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
            images: Vec::new(),
            renews_attach: false,
        };
        assert_eq!(check_hello(&hello(vec![("site".into(), "desy".into())])), Ok(()));
        let many = (0..=MAX_LABELS).map(|i| (format!("k{i}"), "v".into())).collect();
        let long = vec![("k".into(), "v".repeat(MAX_LABEL_BYTES + 1))];
        for bad in [many, long, vec![(String::new(), "v".into())], vec![("k".into(), "a\nb".into())]] {
            assert!(
                check_hello(&hello(bad))
                    .is_err_and(|e| matches!(e, HelloError::Labels(_)) && e.to_string().starts_with("labels:"))
            );
        }
    }

    #[test]
    fn close_reasons_fit_a_frame() {
        let Message::Close(Some(f)) = close_frame(4403, &"é".repeat(100)) else { panic!("not a close frame") };
        assert!(f.reason.len() <= MAX_CLOSE_REASON_BYTES && f.reason.len() >= MAX_CLOSE_REASON_BYTES - 1);
        assert_eq!(f.code, 4403);
    }
}
