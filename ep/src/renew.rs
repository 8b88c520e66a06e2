//! A job's macaroons, kept valid for as long as the job needs them.
//!
//! The macaroons of an assignment were obtained when the job's event fired: a job that waited
//! in the queue past their validity, or that runs longer than it, would fail on its input or
//! its outputs. Their expiry is the earliest `before:` caveat of either ([`expiry`]); a job
//! whose assignment has `renew_until` (the scheduler renews it, up to that instant: the job's
//! run time plus grace) asks for fresh ones over the attach link ([`Renewer`], sent by
//! [`crate::link`] as `EpMsg::Renew`, answered `Renewed` or `RenewRefused`):
//!
//! - before a use (the input fetch, the upload of the outputs: [`Credentials::input`],
//!   [`Credentials::output`]) when they expire within the margin;
//! - while the job runs ([`Credentials::keep`]), at the margin before each expiry, as long as
//!   the expiry comes before `renew_until` (past it, no renewal can help: the scheduler cuts
//!   every macaroon there).
//!
//! The margin is a third of the validity the macaroons had when they came (at least one second,
//! at most [`MAX_MARGIN`]). One renewal at a time per job; a refusal or no answer within
//! [`ANSWER_TIMEOUT`] leaves the current macaroons in place (the storage then decides), and the
//! keeper tries again, backing off, until they expire. A job without `renew_until` (a scheduler
//! that does not renew, a job without a renewal grant) never asks.
//!
//! A job without an input (a run on no file) holds a write macaroon alone: an answer carrying a
//! read macaroon for it is not believed (refused, the current one kept), nor is an answer
//! without one for a job that has an input.
//!
//! Macaroons go from here into `Authorization` headers only, never into logs.
//!
//! Must not know: the WebSocket, the scheduler's checks, what a job does with the macaroons.

use htfaas_functions::proto::JobAssignment;
use htfaas_functions::time::{now_s, parse_utc_timestamp};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Longest margin before an expiry at which the macaroons are renewed.
pub(crate) const MAX_MARGIN: Duration = Duration::from_secs(600);
/// How long an answer to one `Renew` may take before the job goes on without it.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// First wait before the keeper asks again after a refusal; doubled each time.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// Fresh macaroons of one job, as the scheduler answered a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fresh {
    /// Read macaroon; none for a job without an input.
    pub(crate) input: Option<String>,
    /// Write macaroon.
    pub(crate) output: String,
    /// The checkpoint area's macaroon; none for a job without one.
    pub(crate) checkpoint: Option<String>,
    /// The reference files' read macaroons, in the assignment's order; empty for a job without.
    pub(crate) refs: Vec<String>,
}

/// Fresh macaroons, or why none came.
pub(crate) type Answer = Result<Fresh, String>;

/// One request for fresh macaroons, for the link to send.
#[derive(Debug)]
pub(crate) struct Ask {
    /// The job.
    pub(crate) job_id: String,
    /// Where the answer goes (dropped when the link's session ends).
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// Asks the link for fresh macaroons of a job.
#[derive(Debug, Clone)]
pub(crate) struct Renewer {
    tx: mpsc::UnboundedSender<Ask>,
}

impl Renewer {
    /// A renewer and the receiving end the link reads.
    pub(crate) fn channel() -> (Renewer, mpsc::UnboundedReceiver<Ask>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Renewer { tx }, rx)
    }

    async fn ask(&self, job_id: &str) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Ask { job_id: job_id.to_owned(), reply }).map_err(|_| "the link is gone".to_owned())?;
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err("the link to the scheduler was lost".into()),
            Err(_) => Err(format!("no answer within {ANSWER_TIMEOUT:?}")),
        }
    }
}

/// The earliest `before:` caveat of `macaroon`, Unix seconds; `None` when it has none that
/// parses (or the token does not parse).
pub(crate) fn expiry(macaroon: &str) -> Option<u64> {
    let caveats = htfaas_functions::macaroon::inspect(macaroon).ok()?;
    caveats.iter().filter_map(|c| c.strip_prefix("before:")).filter_map(parse_utc_timestamp).min()
}

/// The renewal margin for macaroons valid `validity_s` when they came.
pub(crate) fn margin_s(validity_s: u64) -> u64 {
    (validity_s / 3).clamp(1, MAX_MARGIN.as_secs())
}

/// A job's current macaroons.
#[derive(Debug)]
struct Current {
    macaroons: Fresh,
    /// The earliest expiry of them.
    expires_s: Option<u64>,
    /// The margin before it at which they are renewed.
    margin_s: u64,
}

impl Current {
    fn new(macaroons: Fresh, now_s: u64) -> Current {
        let m = &macaroons;
        let all = [m.input.as_deref(), Some(m.output.as_str()), m.checkpoint.as_deref()];
        let refs = m.refs.iter().map(String::as_str);
        let expires_s = all.into_iter().flatten().chain(refs).filter_map(expiry).min();
        let margin_s = margin_s(expires_s.map_or(0, |e| e.saturating_sub(now_s)));
        Current { macaroons, expires_s, margin_s }
    }
}

/// One job's macaroons and their renewal.
#[derive(Debug)]
pub(crate) struct Credentials {
    job_id: String,
    renewer: Renewer,
    /// Renewable up to this instant (Unix s), when the scheduler renews at all.
    renew_until: Option<u64>,
    current: Mutex<Current>,
    /// One renewal at a time.
    renewing: tokio::sync::Mutex<()>,
}

impl Credentials {
    /// The macaroons of `job`, renewed through `renewer`.
    pub(crate) fn new(job: &JobAssignment, renewer: &Renewer) -> Arc<Credentials> {
        Arc::new(Credentials {
            job_id: job.job_id.clone(),
            renewer: renewer.clone(),
            renew_until: job.renew_until,
            current: Mutex::new(Current::new(
                Fresh {
                    input: job.input.as_ref().map(|i| i.macaroon.clone()),
                    output: job.output.macaroon.clone(),
                    checkpoint: job.checkpoint.as_ref().map(|c| c.macaroon.clone()),
                    refs: job.refs.iter().map(|r| r.macaroon.clone()).collect(),
                },
                now_s(),
            )),
            renewing: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the current macaroons are due for renewal (Unix s): `None` when they never are
    /// (not renewable, no expiry known, or they outlast what the scheduler renews to).
    fn due_s(&self) -> Option<u64> {
        let until = self.renew_until?;
        let c = self.current();
        let expires = c.expires_s?;
        (expires < until).then(|| expires.saturating_sub(c.margin_s))
    }

    /// The read macaroon, renewed first when due (empty for a job without an input, which
    /// reads none).
    pub(crate) async fn input(&self) -> String {
        // A refusal is logged; the current ones are used, and the storage decides.
        let _ = self.renew_if_due().await;
        self.current().macaroons.input.clone().unwrap_or_default()
    }

    /// The write macaroon, renewed first when due.
    pub(crate) async fn output(&self) -> String {
        let _ = self.renew_if_due().await;
        self.current().macaroons.output.clone()
    }

    /// The checkpoint area's macaroon, renewed first when due (empty for a job without one).
    pub(crate) async fn checkpoint(&self) -> String {
        let _ = self.renew_if_due().await;
        self.current().macaroons.checkpoint.clone().unwrap_or_default()
    }

    /// The reference files' read macaroons, renewed first when due, in the assignment's order.
    pub(crate) async fn refs(&self) -> Vec<String> {
        let _ = self.renew_if_due().await;
        self.current().macaroons.refs.clone()
    }

    /// Renews when due now; `Err` is why it could not (the current ones stay).
    async fn renew_if_due(&self) -> Result<(), String> {
        if self.due_s().is_none_or(|due| due > now_s()) {
            return Ok(());
        }
        let _one = self.renewing.lock().await;
        // Another caller may have renewed while this one waited.
        if self.due_s().is_none_or(|due| due > now_s()) {
            return Ok(());
        }
        let answer = self.renewer.ask(&self.job_id).await.and_then(|fresh| self.fits(fresh));
        match answer {
            Ok(fresh) => {
                let fresh = Current::new(fresh, now_s());
                tracing::info!(expires_s = ?fresh.expires_s, "macaroons renewed");
                *self.current() = fresh;
                Ok(())
            }
            Err(why) => {
                tracing::warn!("macaroons not renewed: {why}");
                Err(why)
            }
        }
    }

    /// `fresh` when it has a read macaroon exactly when the job has an input: a read macaroon
    /// for a job without one is not believed (nor is an answer without one for a job with one);
    /// the same for a checkpoint macaroon and a checkpoint area; and a read macaroon for each
    /// reference file (an answer with none, from a scheduler that renews no reference files,
    /// keeps the current ones; one with another count is not believed).
    fn fits(&self, mut fresh: Fresh) -> Answer {
        let (has_input, has_area, refs) = {
            let c = self.current();
            (c.macaroons.input.is_some(), c.macaroons.checkpoint.is_some(), c.macaroons.refs.clone())
        };
        if fresh.refs.is_empty() {
            fresh.refs = refs;
        } else if fresh.refs.len() != refs.len() {
            return Err(format!(
                "the answer carries {} macaroons for the job's {} reference files: not believed",
                fresh.refs.len(),
                refs.len()
            ));
        }
        match (has_input, fresh.input.is_some()) {
            (false, true) => {
                return Err("the answer carries a read macaroon for a job without an input: not believed".into());
            }
            (true, false) => return Err("the answer carries no read macaroon for the job's input".into()),
            _ => {}
        }
        match (has_area, fresh.checkpoint.is_some()) {
            (false, true) => {
                Err("the answer carries a checkpoint macaroon for a job without an area: not believed".into())
            }
            (true, false) => Err("the answer carries no checkpoint macaroon for the job's checkpoint area".into()),
            _ => Ok(fresh),
        }
    }

    /// Renews the macaroons at the margin before each expiry for as long as it is called
    /// (the job drops it when it no longer needs them), or until they outlast what the
    /// scheduler renews to; after a refusal it asks again, backing off, until they expire.
    pub(crate) async fn keep(self: Arc<Self>) {
        let mut retry = RETRY_FIRST;
        while let Some(due) = self.due_s() {
            let now = now_s();
            if due > now {
                tokio::time::sleep(Duration::from_secs(due - now)).await;
                continue;
            }
            if self.renew_if_due().await.is_ok() {
                retry = RETRY_FIRST;
                continue;
            }
            let expired = self.current().expires_s.is_none_or(|e| e <= now_s());
            if expired {
                tracing::warn!("macaroons expired without renewal; the storage will refuse them");
                return;
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(60));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::macaroon::{RootKey, attenuate};

    fn fresh(input: Option<&str>, output: &str) -> Fresh {
        Fresh { input: input.map(str::to_owned), output: output.into(), checkpoint: None, refs: Vec::new() }
    }

    fn macaroon(caveats: &[&str]) -> String {
        let key = RootKey::derive(b"k");
        let m = htfaas_functions::macaroon::mint(&key, "loc", "id", &[]).expect("mint");
        attenuate(&m, caveats).expect("attenuate")
    }

    #[test]
    fn the_expiry_is_the_earliest_before_and_the_margin_a_third_of_the_validity() {
        let m = macaroon(&["before:2030-01-01T00:00:10Z", "path:/x", "before:2030-01-01T00:00:05.5Z"]);
        assert_eq!(expiry(&m), parse_utc_timestamp("2030-01-01T00:00:05Z"));
        assert_eq!(expiry(&macaroon(&["path:/x"])), None);
        assert_eq!(expiry("not a macaroon"), None);
        assert_eq!(margin_s(0), 1);
        assert_eq!(margin_s(6), 2);
        assert_eq!(margin_s(7200), 600);
    }

    /// Job `j` reading `input` (if any), writing with `output`, renewable until `renew_until`.
    fn assignment(
        input: Option<htfaas_functions::proto::InputSpec>,
        output: &str,
        renew_until: Option<u64>,
    ) -> htfaas_functions::proto::JobAssignment {
        htfaas_functions::proto::JobAssignment {
            job_id: "j".into(),
            function: htfaas_functions::proto::FunctionRef {
                name: "f".into(),
                version: 1,
                digest: htfaas_functions::Digest::of(b"m"),
                module_url: "http://m".into(),
                native: None,
            },
            resources: htfaas_functions::Resources::new(1, 1, 1),
            input,
            output: htfaas_functions::proto::OutputSpec::new("http://s/o/", output),
            args: vec![],
            env: vec![],
            secrets: Default::default(),
            limits: Default::default(),
            renew_until,
            traceparent: None,
            refs: Vec::new(),
            checkpoint: None,
        }
    }

    /// A job's reference files' read macaroons count in its expiry and are renewed with the
    /// others: an answer with one for each replaces them; one with another count is not
    /// believed; one with none (a scheduler that renews no reference files) keeps them.
    #[tokio::test]
    async fn reference_files_macaroons_are_renewed_with_the_others() {
        let (renewer, mut asks) = Renewer::channel();
        let now = now_s();
        let soon = htfaas_functions::time::utc_timestamp(now + 1);
        let late = htfaas_functions::time::utc_timestamp(now + 3600);
        let lasting = macaroon(&[&format!("before:{late}")]);
        let expiring = macaroon(&[&format!("before:{soon}")]);
        let mut job = assignment(None, &lasting, Some(now + 7200));
        job.refs = ["a", "b"]
            .map(|p| htfaas_functions::proto::ReferenceInput {
                url: format!("http://s/ref/{p}"),
                path: format!("ref/{p}"),
                macaroon: expiring.clone(),
                sha256: None,
            })
            .to_vec();
        let answers = [
            Fresh { refs: vec!["r1".into()], ..fresh(None, "w1") },
            Fresh { refs: Vec::new(), ..fresh(None, "w2") },
            Fresh { refs: vec!["ra".into(), "rb".into()], ..fresh(None, "w3") },
        ];
        let answering = tokio::spawn(async move {
            for answer in answers {
                let ask = asks.recv().await.expect("an ask");
                let _ = ask.reply.send(Ok(answer));
            }
        });
        let c = Credentials::new(&job, &renewer);
        assert_eq!(c.refs().await, [expiring.clone(), expiring.clone()], "one for two files: not believed");
        assert_eq!(c.refs().await, [expiring.clone(), expiring.clone()], "none: the current ones kept");
        let c = Credentials::new(&job, &renewer);
        assert_eq!(c.refs().await, ["ra", "rb"], "one for each: taken");
        answering.await.expect("answered");
    }

    /// A job renews only when the macaroons expire before what the scheduler renews to, and
    /// then asks over the link before the use; its answer replaces both.
    #[tokio::test]
    async fn renews_before_a_use_only_when_due_and_takes_the_answer() {
        let (renewer, mut asks) = Renewer::channel();
        let now = now_s();
        let soon = htfaas_functions::time::utc_timestamp(now + 1);
        let late = htfaas_functions::time::utc_timestamp(now + 3600);
        let job = |input: &str, until: Option<u64>| {
            let read = htfaas_functions::proto::InputSpec::new("http://s/i", "i", input);
            assignment(Some(read), &macaroon(&[&format!("before:{late}")]), until)
        };
        let expiring = macaroon(&[&format!("before:{soon}")]);
        // Not renewable (an old scheduler): never asks.
        let c = Credentials::new(&job(&expiring, None), &renewer);
        assert_eq!(c.input().await, expiring);
        // Renewable, but the scheduler's deadline comes first: no renewal can help.
        let c = Credentials::new(&job(&expiring, Some(now)), &renewer);
        assert_eq!(c.input().await, expiring);
        assert!(asks.try_recv().is_err(), "nothing asked");
        // Renewable and due: asks, and takes the answer.
        let c = Credentials::new(&job(&expiring, Some(now + 7200)), &renewer);
        let answering = tokio::spawn(async move {
            let ask = asks.recv().await.expect("an ask");
            assert_eq!(ask.job_id, "j");
            let _ = ask.reply.send(Ok(fresh(Some("fresh-in"), "fresh-out")));
            asks
        });
        assert_eq!(c.input().await, "fresh-in");
        assert_eq!(c.output().await, "fresh-out");
        let mut asks = answering.await.expect("answered");
        // A refusal keeps the current ones.
        let c = Credentials::new(&job(&expiring, Some(now + 7200)), &renewer);
        let refusing = tokio::spawn(async move {
            let ask = asks.recv().await.expect("an ask");
            let _ = ask.reply.send(Err("revoked".into()));
            asks
        });
        assert_eq!(c.input().await, expiring);
        let mut asks = refusing.await.expect("refused");
        // An answer without a read macaroon for the job's input is not taken either.
        let c = Credentials::new(&job(&expiring, Some(now + 7200)), &renewer);
        let short = tokio::spawn(async move {
            let ask = asks.recv().await.expect("an ask");
            let _ = ask.reply.send(Ok(fresh(None, "fresh-out")));
        });
        assert_eq!(c.input().await, expiring);
        short.await.expect("answered");
    }

    /// A job without an input holds a write macaroon alone: an answer carrying a read macaroon
    /// for it is not believed, and the current write macaroon stays; one without is taken.
    #[tokio::test]
    async fn a_job_without_an_input_believes_no_read_macaroon() {
        let (renewer, mut asks) = Renewer::channel();
        let now = now_s();
        let expiring = macaroon(&[&format!("before:{}", htfaas_functions::time::utc_timestamp(now + 1))]);
        let job = assignment(None, &expiring, Some(now + 7200));
        let c = Credentials::new(&job, &renewer);
        let answering = tokio::spawn(async move {
            let ask = asks.recv().await.expect("an ask");
            let _ = ask.reply.send(Ok(fresh(Some("a-read-macaroon"), "fresh-out")));
            let ask = asks.recv().await.expect("a second ask");
            let _ = ask.reply.send(Ok(fresh(None, "fresh-out")));
        });
        assert_eq!(c.output().await, expiring, "the answer with a read macaroon is refused");
        assert_eq!(c.current().macaroons.input, None);
        assert_eq!(c.output().await, "fresh-out", "the write macaroon alone is taken");
        assert_eq!(c.current().macaroons.input, None);
        answering.await.expect("answered");
    }

    /// A job with a checkpoint area renews its area's macaroon with the others, and takes an
    /// answer only when it carries one (and none for a job without an area).
    #[tokio::test]
    async fn a_checkpoint_macaroon_is_renewed_with_the_others_and_required_for_an_area() {
        let (renewer, mut asks) = Renewer::channel();
        let now = now_s();
        let expiring = macaroon(&[&format!("before:{}", htfaas_functions::time::utc_timestamp(now + 1))]);
        let mut job = assignment(None, "out", Some(now + 7200));
        job.checkpoint = Some(htfaas_functions::checkpoint::CheckpointSpec {
            url: "http://s/checkpoints/a/".into(),
            macaroon: expiring.clone(),
            max_bytes: 1,
            exit_code: None,
        });
        let c = Credentials::new(&job, &renewer);
        let answering = tokio::spawn(async move {
            let ask = asks.recv().await.expect("an ask");
            let _ = ask.reply.send(Ok(fresh(None, "fresh-out")));
            let ask = asks.recv().await.expect("a second ask");
            let _ = ask.reply.send(Ok(Fresh { checkpoint: Some("fresh-area".into()), ..fresh(None, "fresh-out") }));
        });
        assert_eq!(c.checkpoint().await, expiring, "an answer without the area's macaroon is refused");
        assert_eq!(c.checkpoint().await, "fresh-area", "the expiring area's macaroon is renewed");
        assert_eq!(c.current().macaroons.output, "fresh-out");
        answering.await.expect("answered");
    }
}
