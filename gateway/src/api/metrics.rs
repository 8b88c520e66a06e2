//! `GET /v1/stats` (JSON) and `GET /v1/stats/history`, `GET /metrics` (OpenMetrics,
//! `crate::metrics`), and the middleware that counts refused bearer tokens
//! ([`count_refusals`]).
//!
//! Must not know: the JetStream consumer (the lanes' pending counts are [`crate::lanes`]'s),
//! the firing table's SQL.

use crate::http_error::HttpError;
use crate::metrics::{REASONS, TOKENS, reason_of};
use crate::state::Shared;
use crate::stats::Stats;
use axum::Json;
use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use htfaas_functions::metrics::CONTENT_TYPE;
use htfaas_functions::token::ApiClaims;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) async fn stats(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
) -> Result<impl IntoResponse, HttpError> {
    shared.require_admin(&headers)?;
    let mut snapshot = shared.stats.snapshot();
    if let Some(Extension(lanes)) = lanes {
        snapshot.events_pending = lanes.pending().await.iter().filter_map(|(_, pending)| *pending).sum();
    }
    Ok(Json(snapshot))
}

/// `GET /v1/stats/history` (admin): [`crate::stats::History`].
pub(super) async fn stats_history(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, HttpError> {
    shared.require_admin(&headers)?;
    Ok(Json(shared.history.history()))
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
    let bearer = authorization.as_ref().and_then(|v| v.to_str().ok()).and_then(htfaas_functions::token::bearer);
    let metrics = &shared.metrics;
    match (runs, bearer) {
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

/// `GET /metrics`: the admin scope only. The firings the rate limits hold are counted from
/// the firing table first, off the async threads.
pub async fn serve(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let rate_waiting = shared.firings.call(|f| f.rate_waiting()).await.unwrap_or_else(|e| {
        tracing::warn!("the metrics go without the firings held by rate limits: {e}");
        Vec::new()
    });
    Ok(render(&shared, rate_waiting))
}

/// The answer of `GET /metrics`, once the caller's admin token is checked, with each
/// rate-limited function's firings held for a token (`rate_waiting`, [`Firings::rate_waiting`]).
///
/// [`Firings::rate_waiting`]: crate::firing::Firings::rate_waiting
pub fn render(shared: &Arc<Shared>, rate_waiting: Vec<(String, u64)>) -> Response {
    match htfaas_functions::metrics::encode(GatewayCollector(shared.clone(), rate_waiting)) {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::error!("failed to encode the metrics: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Reads the gateway's counters at scrape time, with the firings the rate limits hold per
/// function (counted from the table before).
struct GatewayCollector(Arc<Shared>, Vec<(String, u64)>);

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
            ("collected", r(&s.events_collected)),
            ("unmatched", r(&s.events_unmatched)),
            ("disabled", r(&s.events_disabled)),
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
            ("disabled", r(&s.firings_disabled)),
            ("rate_delayed", r(&s.firings_rate_delayed)),
            ("collected", r(&s.firings_collected)),
            ("not_collected", r(&s.firings_not_collected)),
        ];
        family(&mut e, "htfaas_gateway_firings", "Firings (event x function) by outcome.", "outcome", &firings)?;
        let groups = [("quiet", r(&s.groups_quiet)), ("expired", r(&s.groups_expired))];
        family(
            &mut e,
            "htfaas_gateway_groups_closed",
            "Collecting groups closed by the clock: fired after their quiet period, or expired.",
            "outcome",
            &groups,
        )?;
        e.encode_descriptor(
            "htfaas_gateway_firings_pending",
            "Firings waiting to be submitted.",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&self.0.firings.pending())?;
        let mut held = e.encode_descriptor(
            "htfaas_gateway_firings_rate_waiting",
            "Firings a rate-limited trigger holds waiting for their token, per function.",
            None,
            MetricType::Gauge,
        )?;
        for (function, n) in &self.1 {
            held.encode_family(&[("function", function.as_str())])?.encode_gauge(n)?;
        }
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
        e.encode_descriptor(
            "htfaas_gateway_ingest_lanes",
            "Owners' ingest lanes running (one durable consumer each).",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&r(&s.ingest_lanes))?;
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
        let w = &self.0.webhooks;
        let webhooks = [("delivered", r(&w.delivered)), ("given_up", r(&w.failed))];
        family(
            &mut e,
            "htfaas_gateway_webhook_deliveries",
            "Failure webhook deliveries: taken by the receiver, or given up.",
            "outcome",
            &webhooks,
        )?;
        let zero = std::sync::atomic::AtomicU64::new(0);
        let (loaded, refused) = match &self.0.identities {
            Some(ids) => (&ids.reloads[0], &ids.reloads[1]),
            None => (&zero, &zero),
        };
        family(
            &mut e,
            "htfaas_gateway_identity_map_reloads",
            "Changes of the identity map file: loaded, or refused (the previous map kept).",
            "outcome",
            &[("loaded", r(loaded)), ("refused", r(refused))],
        )?;
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
pub(super) fn family(
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
