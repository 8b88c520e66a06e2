//! Prometheus metrics of the gateway, served at `GET /metrics` in the OpenMetrics text format,
//! to the admin scope ([`crate::api::require_admin`]; Prometheus sends it as `authorization:
//! credentials`). Mounted by [`crate::run`] beside [`crate::api::router`], behind the same
//! revocation check ([`crate::api::authenticate`]): not a JSON route, so not in `api::ROUTES`
//! or the OpenAPI document.
//!
//! Nothing here is counted twice: the ingest and dispatch counters are the atomics of
//! [`crate::stats::Stats`] (also served as JSON at `GET /v1/stats`), read at scrape time; the
//! only counters kept here are the refusals of bearer tokens, which the API middleware
//! [`count_refusals`] counts off the hot path (only when an answer is 401).
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `htfaas_gateway_events_received_total` | counter | `source` (`dcache_billing`, `cloudevents`) | messages read from the events stream |
//! | `htfaas_gateway_events_total` | counter | `outcome` | events by what became of them: `fired` (one firing or more queued), `duplicate`, `loop_guarded` (every matching function guarded), `unmatched` (no trigger true), `ignored`, `not_enabled` (a type the site did not enable), `malformed`, `out_of_bounds` (its subject may not speak for its path: `source_paths`) |
//! | `htfaas_gateway_firings_total` | counter | `outcome` | firings (event × function): `queued`, `deduplicated`, `superseded` (debounce), `loop_guarded`, `rate_delayed` (waited for a rate token) |
//! | `htfaas_gateway_firings_pending` | gauge | | firings waiting in the table to be submitted |
//! | `htfaas_gateway_submissions_total` | counter | `outcome` | submissions to the scheduler: `created`, `deduplicated`, `refused`, `transient_failure` (retried later) |
//! | `htfaas_gateway_ingest_batches_total` | counter | | batches the ingest loop committed |
//! | `htfaas_gateway_nats_connection_total` | counter | `event` (`disconnected`, `reconnected`) | the ingest's NATS connection lost and back (the durable consumer resumes) |
//! | `htfaas_gateway_firing_store_full_total` | counter | | batches of events not written for a full disk or database size limit (`SQLITE_FULL`): not acked, redelivered |
//! | `htfaas_gateway_token_refusals_total` | counter | `token` (`api`: the bearer of an API route, `submit`: of a run), `reason` | bearer tokens this API refused (401): `missing`, the failed check of the token (`malformed`, `unknown_key`, `bad_signature`, `expired`, `not_yet_valid`, `wrong_audience`, `wrong_issuer`, `invalid`), or `revoked` (an API token that verifies); a submit token the scheduler refuses is counted by the scheduler |
//!
//! Replays (`POST /v1/events/replay`) count their events like ingested ones, as `/v1/stats` does.

use crate::Shared;
use crate::api::{Failure, require_admin};
use crate::stats::Stats;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use htfaas_functions::metrics::CONTENT_TYPE;
use htfaas_functions::token::{ApiClaims, TokenError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Kinds of bearer token the API checks.
const TOKENS: [&str; 2] = ["api", "submit"];
/// Why a token was refused; the index is the position in each row of [`Metrics::refusals`].
const REASONS: [&str; 10] = [
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

/// Counters of the gateway that [`Stats`] does not hold: refusals of bearer tokens, by kind and
/// reason (atomics, no lock).
#[derive(Debug, Default)]
pub struct Metrics {
    refusals: [[AtomicU64; REASONS.len()]; TOKENS.len()],
}

impl Metrics {
    fn refused(&self, token: usize, reason: &str) {
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

/// Middleware of the whole router: counts each 401 answer as a refused bearer token, checking
/// the token again to name the failed check. A run (`POST /v1/functions/{name}/runs`) bears a
/// submit token (one that verifies was refused by the scheduler, which counts it); every other
/// route bears the admin token or an API token (one that verifies was revoked). Costs a header
/// clone per request, and a verification only when the answer is 401.
pub async fn count_refusals(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let runs = request.uri().path().ends_with("/runs");
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let response = next.run(request).await;
    if response.status() != StatusCode::UNAUTHORIZED {
        return response;
    }
    let bearer = authorization.as_ref().and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let metrics = &shared.metrics;
    match (runs, bearer.map(str::trim)) {
        (false, None) => metrics.refused(0, "missing"),
        (false, Some(token)) => match shared.api_verifier.verify::<ApiClaims>(token) {
            Err(e) => metrics.refused(0, reason_of(&e)),
            Ok(_) => metrics.refused(0, "revoked"),
        },
        (true, None) => metrics.refused(1, "missing"),
        (true, Some(token)) => {
            if let Err(e) = shared.submitter.verify(token) {
                metrics.refused(1, reason_of(&e));
            }
        }
    }
    response
}

/// `GET /metrics`: the admin scope only.
pub async fn serve(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    Ok(render(&shared))
}

/// The answer of `GET /metrics`, once the caller's admin token is checked.
pub fn render(shared: &Arc<Shared>) -> Response {
    match htfaas_functions::metrics::encode(GatewayCollector(shared.clone())) {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::error!("failed to encode the metrics: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Reads the gateway's counters at scrape time.
struct GatewayCollector(Arc<Shared>);

impl std::fmt::Debug for GatewayCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayCollector")
    }
}

impl Collector for GatewayCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s: &Stats = &self.0.stats;
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let received = [("dcache_billing", r(&s.events_dcache_billing)), ("cloudevents", r(&s.events_cloudevents))];
        family(&mut e, "htfaas_gateway_events_received", "Messages read from the events stream.", "source", &received)?;
        let events = [
            ("fired", r(&s.events_fired)),
            ("duplicate", r(&s.events_duplicate)),
            ("loop_guarded", r(&s.events_loop_guarded)),
            ("unmatched", r(&s.events_unmatched)),
            ("ignored", r(&s.events_ignored)),
            ("not_enabled", r(&s.events_not_enabled)),
            ("malformed", r(&s.events_malformed)),
            ("out_of_bounds", r(&s.events_out_of_bounds)),
        ];
        family(&mut e, "htfaas_gateway_events", "Events by what became of them.", "outcome", &events)?;
        let firings = [
            ("queued", r(&s.firings_queued)),
            ("deduplicated", r(&s.firings_deduplicated)),
            ("superseded", r(&s.firings_superseded)),
            ("loop_guarded", r(&s.firings_loop_guarded)),
            ("rate_delayed", r(&s.firings_rate_delayed)),
        ];
        family(&mut e, "htfaas_gateway_firings", "Firings (event x function) by outcome.", "outcome", &firings)?;
        e.encode_descriptor(
            "htfaas_gateway_firings_pending",
            "Firings waiting to be submitted.",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&self.0.firings.pending())?;
        let submissions = [
            ("created", r(&s.jobs_submitted)),
            ("deduplicated", r(&s.jobs_deduplicated)),
            ("refused", r(&s.jobs_refused)),
            ("transient_failure", r(&s.transient_failures)),
        ];
        family(
            &mut e,
            "htfaas_gateway_submissions",
            "Submissions to the scheduler by outcome.",
            "outcome",
            &submissions,
        )?;
        e.encode_descriptor(
            "htfaas_gateway_ingest_batches",
            "Batches the ingest loop committed.",
            None,
            MetricType::Counter,
        )?
        .encode_counter::<NoLabelSet, _, u64>(&r(&s.ingest_batches), None)?;
        let nats = [("disconnected", r(&s.nats_disconnects)), ("reconnected", r(&s.nats_reconnects))];
        family(
            &mut e,
            "htfaas_gateway_nats_connection",
            "The ingest's NATS connection lost and back.",
            "event",
            &nats,
        )?;
        e.encode_descriptor(
            "htfaas_gateway_firing_store_full",
            "Batches of events not written because the firing table's disk is full; redelivered.",
            None,
            MetricType::Counter,
        )?
        .encode_counter::<NoLabelSet, _, u64>(&r(&s.firings_store_full), None)?;
        let mut m = e.encode_descriptor(
            "htfaas_gateway_token_refusals",
            "Bearer tokens this API refused, by kind and reason.",
            None,
            MetricType::Counter,
        )?;
        for (t, token) in TOKENS.iter().enumerate() {
            for (i, reason) in REASONS.iter().enumerate() {
                let labels = [("token", *token), ("reason", *reason)];
                m.encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&r(&self.0.metrics.refusals[t][i]), None)?;
            }
        }
        Ok(())
    }
}

/// One counter per value of `label`.
fn family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        m.encode_family(&[(label, *value)])?.encode_counter::<NoLabelSet, _, u64>(n, None)?;
    }
    Ok(())
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
