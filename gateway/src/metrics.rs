//! Prometheus metrics of the gateway, served at `GET /metrics` in the OpenMetrics text format,
//! to the admin scope ([`crate::auth::require_admin`]; Prometheus sends it as `authorization:
//! credentials`) by [`crate::api::metrics`], behind the same revocation check as the API
//! (`api::authenticate`): not a JSON route, so not in `api::ROUTES` or the OpenAPI document.
//! This module holds the counters of token refusals and the names of the metrics' labels;
//! must not know: HTTP routes, the gateway's shared state.
//!
//! Nothing here is counted twice: the ingest and dispatch counters are the atomics of
//! [`crate::stats::Stats`] (also served as JSON at `GET /v1/stats`), read at scrape time (the
//! firings the rate limits hold are the table's own count, `Firings::rate_waiting`); the
//! only counters kept here are the refusals of bearer tokens, which the API middleware
//! `api::metrics::count_refusals` counts off the hot path (only when an answer is 401).
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `htfaas_gateway_events_received_total` | counter | `source` (`dcache_billing`, `cloudevents`) | messages read from the events stream |
//! | `htfaas_gateway_events_total` | counter | `outcome` | events by what became of them: `fired` (one firing or more queued), `duplicate`, `loop_guarded` (every matching function guarded), `unmatched` (no trigger true), `ignored`, `not_enabled` (a type the site did not enable), `malformed`, `out_of_bounds` (its subject may not speak for its path: `source_paths`) |
//! | `htfaas_gateway_firings_total` | counter | `outcome` | firings (event × function): `queued`, `deduplicated`, `superseded` (debounce), `loop_guarded`, `rate_delayed` (waited for a rate token) |
//! | `htfaas_gateway_firings_pending` | gauge | | firings waiting in the table to be submitted |
//! | `htfaas_gateway_firings_rate_waiting` | gauge | `function` | a rate-limited trigger's firings held waiting for their token (pending, given their token's time, never tried), counted from the firing table at scrape time off the async threads; a function holding none is not listed |
//! | `htfaas_gateway_submissions_total` | counter | `outcome` | submissions to the scheduler: `created`, `deduplicated`, `refused`, `transient_failure` (retried later) |
//! | `htfaas_gateway_ingest_batches_total` | counter | | batches the ingest loop committed |
//! | `htfaas_gateway_ingest_lanes` | gauge | | owners' ingest lanes running (one durable consumer each) |
//! | `htfaas_gateway_nats_connection_total` | counter | `event` (`disconnected`, `reconnected`) | the ingest's NATS connection lost and back (the durable consumer resumes) |
//! | `htfaas_gateway_firing_store_full_total` | counter | | batches of events not written for a full disk or database size limit (`SQLITE_FULL`): not acked, redelivered |
//! | `htfaas_gateway_webhook_deliveries_total` | counter | `outcome` (`delivered`: a 2xx, `given_up`: refused, no key, host no longer allowed, or tries exhausted) | failed jobs' notifications POSTed to their functions' webhooks |
//! | `htfaas_gateway_identity_map_reloads_total` | counter | `outcome` (`loaded`, `refused`: the file did not load and the previous map stays) | changes of the identity map file (`identity_map`) |
//! | `htfaas_gateway_token_refusals_total` | counter | `token` (`api`: the bearer of an API route, `submit`: of a run), `reason` | bearer tokens this API refused (401): `missing`, the failed check of the token (`malformed`, `unknown_key`, `bad_signature`, `expired`, `not_yet_valid`, `wrong_audience`, `wrong_issuer`, `invalid`), or `revoked` (an API token that verifies); a submit token the scheduler refuses is counted by the scheduler |
//!
//! Replays (`POST /v1/events/replay`) count their events like ingested ones, as `/v1/stats` does.

use htfaas_functions::token::TokenError;
use std::sync::atomic::{AtomicU64, Ordering};

/// Kinds of bearer token the API checks.
pub(crate) const TOKENS: [&str; 2] = ["api", "submit"];
/// Why a token was refused; the index is the position in each row of [`Metrics::refusals`].
pub(crate) const REASONS: [&str; 10] = [
    "missing",
    "revoked",
    "malformed",
    "unknown_key",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "wrong_audience",
    "wrong_issuer",
    "invalid",
];

/// Counters of the gateway that [`crate::stats::Stats`] does not hold: refusals of bearer tokens, by kind and
/// reason (atomics, no lock).
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) refusals: [[AtomicU64; REASONS.len()]; TOKENS.len()],
}

impl Metrics {
    pub(crate) fn refused(&self, token: usize, reason: &str) {
        let r = REASONS.iter().position(|x| *x == reason).unwrap_or(REASONS.len() - 1);
        self.refusals[token][r].fetch_add(1, Ordering::Relaxed);
    }
}

/// The label of a submit token's failed check.
pub fn reason_of(e: &TokenError) -> &'static str {
    match e {
        TokenError::Malformed(_) => "malformed",
        TokenError::UnknownKey(_) => "unknown_key",
        TokenError::InvalidSignature => "bad_signature",
        TokenError::Expired => "expired",
        TokenError::NotYetValid => "not_yet_valid",
        TokenError::WrongAudience => "wrong_audience",
        TokenError::WrongIssuer => "wrong_issuer",
        TokenError::Invalid(_) | TokenError::Key(_) => "invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_error_has_a_reason_listed() {
        for e in [
            TokenError::Malformed("x".into()),
            TokenError::UnknownKey(None),
            TokenError::InvalidSignature,
            TokenError::Expired,
            TokenError::NotYetValid,
            TokenError::WrongAudience,
            TokenError::WrongIssuer,
            TokenError::Invalid("x".into()),
            TokenError::Key("x".into()),
        ] {
            assert!(REASONS.contains(&reason_of(&e)), "{e}");
        }
        let m = Metrics::default();
        m.refused(1, "bad_signature");
        m.refused(0, "no such reason");
        assert_eq!(m.refusals[1][4].load(Ordering::Relaxed), 1);
        assert_eq!(REASONS[4], "bad_signature");
        assert_eq!(m.refusals[0][REASONS.len() - 1].load(Ordering::Relaxed), 1);
    }
}
