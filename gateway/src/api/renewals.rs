//! `POST /v1/renewals`: the scheduler renews a running job's macaroons with the
//! job's renewal grant ([`htfaas_functions::token::RenewClaims`], minted by this gateway with
//! the job, kept sealed by the scheduler, never seen by an EP).
//!
//! Checks, in order, each refusal with its status:
//! 1. the grant verifies (its MAC, or an older grant's signature; `kid`, issuer, audience
//!    `htfaas-gateway/renew`, expiry): else 401; an API or submit token is no grant (another
//!    audience);
//! 2. the body is a [`RenewRequest`]: else 400;
//! 3. no revocation names the grant's `jti` (the job's submit token), owner or issuer, read from
//!    the scheduler's list ([`crate::auth::RevocationCache`], as for API tokens): else 403
//!    (503 when the list is stale and the scheduler does not answer);
//! 4. the request's job is the grant's: owner, token `jti`, digest, input URL and output URL all
//!    equal the grant's: else 403 (a grant moved to another job gets nothing; a request claiming
//!    an input for a job whose grant names none, a run on no file, gets nothing either);
//! 5. the grant's function version is in the registry with the grant's digest and output
//!    directory: else 403;
//! 6. the namespace still allows it ([`crate::jobs::confine`]: the function owner may read the
//!    input, write the output directory, charge its group, use its annex; and the job's owner,
//!    when another one ran it with its own token, may read and write there too): else 403, so a
//!    grant taken back since the job started stops its renewals.
//!
//! A job that keeps checkpoints names its area too, which must be the grant's (check 4), and is
//! renewed that area's macaroon beside the other two. A job that reads reference files names
//! their URLs, whose digest must be the grant's (check 4), each still readable by the job's
//! principal (check 6), and is renewed a read macaroon for exactly each.
//!
//! Disabling or deleting the function does not stop renewals: those decide what new events
//! fire, not what runs; jobs are stopped by removing them or revoking their token.
//!
//! Then the storage is asked, as at firing, for a read macaroon of exactly the input file (none
//! for a job without an input) and a write macaroon of exactly the output directory (replace
//! only as the manifest and namespace allow now), with the configured validities (`read_validity`, `write_validity`; the storage
//! caps them at its own maximum); unavailable: 503, refused: 502. Each renewal, and each
//! refusal after step 2, is recorded in the gateway's trail (`macaroons.renewal`, actor
//! `scheduler`, with the EP that asked and the new macaroons' caveats, never the macaroons).
//!
//! Must not know: the firing table's types, the scheduler's queue, the attach link.

use crate::auth::bearer;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::audit::{AuditDraft, MacaroonFacts, Subject};
use htfaas_functions::proto::{RenewRequest, RenewResponse};
use htfaas_functions::token::RenewClaims;
use std::sync::Arc;

/// The actor of the gateway's renewal records: the scheduler presents the grant.
pub const RENEWAL_ACTOR: &str = "scheduler";

/// `POST /v1/renewals`.
pub(super) async fn renew(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<RenewResponse>, HttpError> {
    let Some(token) = bearer(&headers) else {
        return Err(HttpError(StatusCode::UNAUTHORIZED, "renewal grant required (Authorization: Bearer)".into()));
    };
    let claims = shared
        .submitter
        .verify_grant(token)
        .map_err(|e| HttpError(StatusCode::UNAUTHORIZED, format!("renewal grant refused: {e}")))?;
    let req: RenewRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("body is not a RenewRequest: {e}")))?;
    let subject = subject(&claims, &req);
    match issue(&shared, &claims, &req).await {
        Ok((reply, facts)) => {
            record(&shared, AuditDraft::macaroons_renewal(subject, RENEWAL_ACTOR, &req.ep, None, &facts)).await;
            tracing::info!(job.id = %req.job_id, ep = %req.ep, "macaroons renewed");
            Ok(Json(reply))
        }
        Err(refused) => {
            let draft = AuditDraft::macaroons_renewal(subject, RENEWAL_ACTOR, &req.ep, Some(&refused.1), &[]);
            record(&shared, draft).await;
            tracing::warn!(job.id = %req.job_id, ep = %req.ep, status = %refused.0, "renewal refused: {}", refused.1);
            Err(refused)
        }
    }
}

/// Checks 3 to 6 of the module docs, then the storage's two macaroons and what the trail keeps
/// of them.
async fn issue(
    shared: &Arc<Shared>,
    claims: &RenewClaims,
    req: &RenewRequest,
) -> Result<(RenewResponse, Vec<MacaroonFacts>), HttpError> {
    let forbidden = |why: String| HttpError(StatusCode::FORBIDDEN, why);
    if let Some(reason) =
        shared.api_revocations.reason_for(&shared.scheduler(), &claims.jti, &claims.sub, &claims.iss).await?
    {
        return Err(forbidden(format!("the job's token is revoked: {reason}")));
    }
    check_facts(claims, req, |path| shared.storage.url_of(path)).map_err(forbidden)?;
    let (name, version) = (claims.function.clone(), claims.version);
    let registry = shared.clone();
    let versions = super::blocking(move || registry.registry.versions(&name)).await?;
    let Some(function) = versions.into_iter().find(|f| f.version == version) else {
        return Err(forbidden(format!("function {} has no version {version}", claims.function)));
    };
    let m = &function.manifest;
    if m.module != claims.digest || m.outputs.dir != claims.output {
        return Err(forbidden(format!("version {version} of {} is not the grant's function", m.name)));
    }
    // The job acts as its owner (the grant's subject): the function's owner, or the bearer who
    // ran it by hand, whose own namespace (without a group's) must allow it too.
    let runs_as = if claims.sub == m.owner {
        crate::jobs::RunsAs::Owner
    } else {
        crate::jobs::RunsAs::Bearer { name: &claims.sub, group: None }
    };
    let input = claims.input.as_deref();
    let replace = crate::jobs::confine_run(&shared.namespaces, &function, runs_as, input).map_err(|e| match e {
        crate::jobs::JobError::Permanent(why) | crate::jobs::JobError::Transient(why) => forbidden(why),
    })?;
    let writer = crate::storage_client::writer_of_run(&claims.sub, &m.name);
    let storage_err = |e: crate::storage_client::StorageError| {
        let status = if e.is_transient() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::BAD_GATEWAY };
        HttpError(status, e.to_string())
    };
    // A job without an input is renewed its write macaroon alone; one that keeps checkpoints
    // its area's macaroon too (the area the gateway chose and put into the grant).
    let area = match &claims.checkpoint {
        Some(url) => Some(
            shared
                .storage
                .path_of(url)
                .ok_or_else(|| forbidden("the grant's checkpoint area is not on this storage".into()))?,
        ),
        None => None,
    };
    let checkpoint = async {
        match &area {
            Some(dir) => shared.storage.checkpoint_macaroon(dir, &writer).await.map(Some),
            None => Ok(None),
        }
    };
    let (read, write, checkpoint) = tokio::join!(
        shared.storage.read_macaroon_of(input),
        shared.storage.write_macaroon(&claims.output, replace, &writer),
        checkpoint
    );
    let (read, write) = (read.map_err(storage_err)?, write.map_err(storage_err)?);
    let checkpoint = checkpoint.map_err(storage_err)?;
    // Each reference file: on this storage, still in the principal's read namespace, and a read
    // macaroon for exactly it (derived from its directory's base, as at firing).
    let mut refs = Vec::with_capacity(req.ref_urls.len());
    for url in &req.ref_urls {
        let path = shared.storage.path_of(url).ok_or_else(|| forbidden(format!("{url} is not on this storage")))?;
        crate::jobs::confine_run(&shared.namespaces, &function, runs_as, Some(&path)).map_err(|e| match e {
            crate::jobs::JobError::Permanent(why) | crate::jobs::JobError::Transient(why) => forbidden(why),
        })?;
        refs.push(shared.storage.read_macaroon(&path).await.map_err(storage_err)?);
    }
    // What the trail keeps: identifiers and caveats; a macaroon that does not parse is kept
    // out of the record, not out of the answer (the storage issued it).
    let facts = read
        .iter()
        .map(|m| ("read", m))
        .chain([("write", &write)])
        .chain(checkpoint.iter().map(|m| ("checkpoint", m)))
        .chain(refs.iter().map(|m| ("reference", m)))
        .filter_map(|(role, m)| MacaroonFacts::from_bearer(role, m).ok())
        .collect();
    let reply = RenewResponse {
        input_macaroon: read,
        output_macaroon: write,
        checkpoint_macaroon: checkpoint,
        ref_macaroons: refs,
    };
    Ok((reply, facts))
}

/// Check 4: the request names the grant's job (owner, token, digest, input and output URLs,
/// the URLs as `url_of` writes a storage path; no input URL when the grant names no input, and
/// the other way round). `Err` says which fact differs.
pub(crate) fn check_facts(
    claims: &RenewClaims,
    req: &RenewRequest,
    url_of: impl Fn(&str) -> String,
) -> Result<(), String> {
    let differs = |what: &str| Err(format!("the request's {what} is not the grant's"));
    if req.owner != claims.sub {
        return differs("owner");
    }
    if req.token_jti != claims.jti {
        return differs("token");
    }
    if req.digest != claims.digest {
        return differs("function digest");
    }
    if req.input_url != claims.input.as_deref().map(&url_of) {
        return differs("input");
    }
    if req.output_url != url_of(&claims.output) {
        return differs("output directory");
    }
    if req.checkpoint_url != claims.checkpoint {
        return differs("checkpoint area");
    }
    let refs = (!req.ref_urls.is_empty())
        .then(|| htfaas_functions::proto::refs_digest(req.ref_urls.iter().map(String::as_str)));
    if refs != claims.refs {
        return differs("reference files");
    }
    Ok(())
}

/// The record's subject: the job, its owner, token, function and both paths.
fn subject(claims: &RenewClaims, req: &RenewRequest) -> Subject {
    Subject {
        job: Some(req.job_id.clone()),
        token_jti: Some(claims.jti.clone()),
        owner: Some(claims.sub.clone()),
        function: Some(claims.function.clone()),
        digest: Some(claims.digest.as_str().to_owned()),
        event_id: None,
        paths: claims.input.iter().chain([&claims.output]).cloned().collect(),
    }
}

async fn record(shared: &Shared, draft: AuditDraft) {
    if let Err(e) = shared.firings.append_async(draft).await {
        tracing::error!("failed to record a renewal in the audit trail: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::token::RENEW_AUDIENCE;

    fn claims() -> RenewClaims {
        RenewClaims {
            iss: "gw".into(),
            sub: "alice".into(),
            aud: RENEW_AUDIENCE.into(),
            exp: u64::MAX,
            iat: 0,
            jti: "j1".into(),
            function: "f".into(),
            version: 1,
            digest: htfaas_functions::Digest::of(b"m"),
            input: Some("/data/in/a".into()),
            output: "/data/out/".into(),
            checkpoint: Some("http://s/checkpoints/c1/".into()),
            refs: Some(htfaas_functions::proto::refs_digest(["http://s/data/ref/a", "http://s/data/ref/b"])),
        }
    }

    fn request() -> RenewRequest {
        RenewRequest {
            job_id: "job".into(),
            ep: "ep".into(),
            owner: "alice".into(),
            token_jti: "j1".into(),
            digest: htfaas_functions::Digest::of(b"m"),
            input_url: Some("http://s/data/in/a".into()),
            output_url: "http://s/data/out/".into(),
            checkpoint_url: Some("http://s/checkpoints/c1/".into()),
            ref_urls: vec!["http://s/data/ref/a".into(), "http://s/data/ref/b".into()],
        }
    }

    /// Check 4 refusing: a grant presented for another job (any one fact differs) gets nothing.
    #[test]
    fn a_request_whose_job_is_not_the_grants_is_refused() {
        let url_of = |p: &str| format!("http://s{p}");
        assert_eq!(check_facts(&claims(), &request(), url_of), Ok(()));
        type Change = fn(&mut RenewRequest);
        let cases: [(&str, Change); 12] = [
            ("owner", |r| r.owner = "bob".into()),
            ("token", |r| r.token_jti = "j2".into()),
            ("function digest", |r| r.digest = htfaas_functions::Digest::of(b"other")),
            ("input", |r| r.input_url = Some("http://s/data/in/b".into())),
            ("input", |r| r.input_url = None),
            ("output directory", |r| r.output_url = "http://s/data/".into()),
            ("checkpoint area", |r| r.checkpoint_url = Some("http://s/checkpoints/c2/".into())),
            ("checkpoint area", |r| r.checkpoint_url = None),
            ("reference files", |r| r.ref_urls.push("http://s/data/alice/secret.txt".into())),
            ("reference files", |r| r.ref_urls[1] = "http://s/data/alice/secret.txt".into()),
            ("reference files", |r| r.ref_urls.reverse()),
            ("reference files", |r| r.ref_urls.clear()),
        ];
        for (what, change) in cases {
            let mut r = request();
            change(&mut r);
            let e = check_facts(&claims(), &r, url_of).expect_err(what);
            assert_eq!(e, format!("the request's {what} is not the grant's"));
        }
    }

    /// The grant of a job without an input (a run on no file) names none: a request that
    /// claims an input for it, to be handed a read macaroon, gets nothing.
    #[test]
    fn a_request_claiming_an_input_for_a_job_without_one_is_refused() {
        let url_of = |p: &str| format!("http://s{p}");
        let none = RenewClaims { input: None, ..claims() };
        let request = RenewRequest { input_url: None, ..request() };
        assert_eq!(check_facts(&none, &request, url_of), Ok(()));
        for claimed in ["http://s/data/in/a", "http://s/data/alice/secret.txt", "http://s"] {
            let r = RenewRequest { input_url: Some(claimed.into()), ..request.clone() };
            let e = check_facts(&none, &r, url_of).expect_err(claimed);
            assert_eq!(e, "the request's input is not the grant's");
        }
        assert_eq!(subject(&none, &request).paths, ["/data/out/"], "no input path in the record");
    }
}
