//! Renewing a running job's macaroons, the scheduler to the gateway:
//! `POST /v1/renewals` with `Authorization: Bearer <renewal grant>` ([`RenewRequest`] →
//! [`RenewResponse`]), and the grant itself ([`RenewalGrant`]), which the gateway hands the
//! scheduler with each job ([`SubmitRequest::renewal`](super::SubmitRequest::renewal)) and the
//! scheduler keeps sealed with the job.
//!
//! The EP's side of the same renewal is [`EpMsg::Renew`](super::EpMsg::Renew), answered by
//! [`SchedulerMsg::Renewed`](super::SchedulerMsg::Renewed) or
//! [`SchedulerMsg::RenewRefused`](super::SchedulerMsg::RenewRefused).
//!
//! Must not know: how the grant is checked, the storage's dialect, the audit trail.

use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// The gateway's route for renewals.
pub const RENEWALS_PATH: &str = "/v1/renewals";

/// A renewal grant: a JWT the gateway signs for one job
/// ([`RenewClaims`](crate::token::RenewClaims), audience
/// [`RENEW_AUDIENCE`](crate::token::RENEW_AUDIENCE)), naming the owner, the submit token's
/// `jti`, the function and the exact input file and output directory. A bearer credential: its
/// `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RenewalGrant(pub String);

impl std::fmt::Debug for RenewalGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RenewalGrant(<secret>)")
    }
}

/// `POST /v1/renewals` on the gateway, with `Authorization: Bearer <renewal grant>`: the job as
/// the scheduler knows it. The gateway refuses (403) a request whose facts differ from the
/// grant's, so a grant moved to another job gets nothing. Response: [`RenewResponse`], or an
/// [`ApiError`](super::ApiError) with 401 (grant), 403 (revoked, namespace, mismatch, unknown
/// function version), 400 (body) or 503/502 (the storage or the scheduler's revocations).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// The job's id (for the audit trail).
    pub job_id: String,
    /// The EP running it, as it named itself (for the audit trail).
    pub ep: String,
    /// The job's owner (its submit token's `sub`).
    pub owner: String,
    /// Its submit token's `jti`.
    pub token_jti: String,
    /// Its function's digest.
    pub digest: Digest,
    /// Its input's storage URL; none for a job without an input (the gateway refuses a
    /// request that claims one when the grant names none, and the other way round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_url: Option<String>,
    /// Its output directory's storage URL.
    pub output_url: String,
    /// Its checkpoint area's storage URL, for a job that keeps checkpoints (the gateway refuses
    /// a request whose area is not the grant's, or names one the grant does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_url: Option<String>,
    /// Its reference files' storage URLs, in the job's order (the gateway refuses a list whose
    /// [`refs_digest`] is not the grant's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ref_urls: Vec<String>,
}

/// The digest a renewal grant names a job's reference files by: the sha256 of their storage
/// URLs, each ended by a line feed (a URL holds none), in order.
pub fn refs_digest<'a>(urls: impl IntoIterator<Item = &'a str>) -> Digest {
    let mut joined = String::new();
    for url in urls {
        joined.push_str(url);
        joined.push('\n');
    }
    Digest::of(joined.as_bytes())
}

/// Answer to [`RenewRequest`]: fresh macaroons for exactly the same input file and output
/// directory (bearer; never logged), before the scheduler attenuates them for the EP; the write
/// macaroon alone for a job without an input.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewResponse {
    /// Read macaroon for the input file; none for a job without an input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_macaroon: Option<String>,
    /// Write macaroon for the output directory.
    pub output_macaroon: String,
    /// Macaroon for the job's checkpoint area; none for a job without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_macaroon: Option<String>,
    /// Read macaroons for the reference files, in the request's order; none for a job without.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ref_macaroons: Vec<String>,
}

impl std::fmt::Debug for RenewResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RenewResponse(<macaroons>)")
    }
}
