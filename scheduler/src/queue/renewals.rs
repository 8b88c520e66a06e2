//! A running job as a renewal of its macaroons reads it ([`crate::renew`]): whether
//! it runs on the asking EP's session, since when and for how long, whose token it has, and its
//! request opened (the renewal grant, the input and output URLs, `bind_ep_address`); and the
//! renewal's record in the trail.
//!
//! Must not know: the gateway, the EP table, the WebSocket, what is decided from these facts.

use super::Queue;
use crate::error::QueueError;
use crate::revocation::Credential;
use crate::seal::SealRequest as _;
use htfaas_functions::audit::{self, AuditDraft, Subject};
use htfaas_functions::proto::SubmitRequest;
use htfaas_functions::store::from_db;
use htfaas_functions::store::row;
use rusqlite::{OptionalExtension as _, params};

/// A job running on the session that asks to renew its macaroons.
#[derive(Debug, Clone)]
pub struct RenewalFacts {
    /// Its submit token as revocation sees it.
    pub credential: Credential,
    /// When its current attempt was dispatched, Unix ms.
    pub started_at_ms: u64,
    /// Its run time, seconds (its request's, bounded at submit by its token's and its class's).
    pub runtime_s: u64,
    /// Its request, opened: the renewal grant, the URLs, `bind_ep_address`.
    pub request: SubmitRequest,
    /// The audit subject: job, token, owner, function, digest, event, input path.
    pub subject: Subject,
}

impl Queue {
    /// The facts of `job_id` when it is running on `ep_session`; `Ok(Err(why))` when it is not
    /// (unknown, another EP's, not running) or its stored request does not open.
    pub async fn renewal_facts(
        &self,
        job_id: String,
        ep_session: String,
    ) -> Result<Result<RenewalFacts, String>, QueueError> {
        let sealer = self.sealer.clone();
        self.call(move |conn| {
            type Row = (String, Option<String>, Option<i64>, i64, String, String, String, String);
            let row: Option<Row> = row(
                conn,
                "SELECT state, ep_session, started_at_ms, runtime_s, owner, token_jti, token_issuer, request \
                     FROM jobs JOIN job_requests USING (seq) WHERE id = ?1",
                params![job_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?)),
            )
            .optional()?;
            let not_here = || Ok(Err(format!("job {job_id} is not running on this EP")));
            let Some((state, session, started, runtime_s, owner, jti, issuer, request)) = row else {
                return not_here();
            };
            let (Some(started), Some(session)) = (started, session) else { return not_here() };
            if state != "running" || session != ep_session {
                return not_here();
            }
            let opened = serde_json::from_str::<SubmitRequest>(&request)
                .map_err(|e| format!("stored request is corrupt: {e}"))
                .and_then(|r| sealer.open_request(&job_id, r).map_err(|e| e.to_string()));
            let request = match opened {
                Ok(r) => r,
                Err(why) => return Ok(Err(why)),
            };
            let subject = Subject {
                job: Some(job_id.clone()),
                token_jti: Some(jti.clone()),
                owner: Some(owner.clone()),
                function: Some(request.function.name.clone()),
                digest: Some(request.function.digest.as_str().to_owned()),
                event_id: Some(request.event.id.clone()),
                paths: vec![request.event.path.clone()],
            };
            Ok(Ok(RenewalFacts {
                credential: Credential { jti, owner: Some(owner), issuer },
                started_at_ms: from_db(started),
                runtime_s: from_db(runtime_s),
                request,
                subject,
            }))
        })
        .await
    }

    /// Appends a renewal's record (`macaroons.renewal`) to the trail.
    pub async fn record_renewal(&self, draft: AuditDraft) -> Result<(), QueueError> {
        self.write(move |tx| {
            audit::append_in(tx, draft)?;
            Ok(())
        })
        .await
    }
}
