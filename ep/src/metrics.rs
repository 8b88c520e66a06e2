//! Prometheus metrics of the EP, served in the OpenMetrics text format at `GET /metrics` on
//! [`crate::config::Config::metrics_listen`] when set (default: off).
//!
//! The listener asks for no token: bind it to loopback (or a monitoring network) only; it takes
//! at most [`METRICS_LIMITS`]`.max_connections` at once and cuts off a client slow to send its
//! request (`htfaas_functions::serve`). What it
//! serves carries no secret, no path, no job id and no function name: counts, durations and the
//! slots the EP advertises, nothing else.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `htfaas_ep_slot_cpus`, `htfaas_ep_slot_gpus` | gauge | | cores and GPUs advertised |
//! | `htfaas_ep_slot_memory_bytes`, `htfaas_ep_slot_disk_bytes` | gauge | | memory and scratch disk advertised |
//! | `htfaas_ep_slot_runtime_seconds` | gauge | | longest job accepted |
//! | `htfaas_ep_jobs_running` | gauge | | jobs assigned and not yet reported |
//! | `htfaas_ep_runs_total` | counter | `outcome` (`exited`, `trapped`, `memory_exceeded`, `time_exceeded`, `input_failed`, `output_failed`, `module_failed`, `cancelled`, `fuel_exhausted`, `output_exceeded`, `storage_unavailable`, `checkpointed`) | jobs ended, by outcome |
//! | `htfaas_ep_job_duration_seconds` | histogram | | from Assign to report (module, input, run, outputs) |
//! | `htfaas_ep_instantiations_total` | counter | | guest runs started (one instance each, in a fresh store) |
//! | `htfaas_ep_modules_compiled_total` | counter | | modules compiled with cranelift |
//! | `htfaas_ep_modules_loaded_from_disk_total` | counter | | modules deserialized from verified artifacts |
//! | `htfaas_ep_modules_rejected_from_disk_total` | counter | | artifacts on disk refused (and compiled again) |
//! | `htfaas_ep_modules_cached` | gauge | | compiled modules held in memory |
//! | `htfaas_ep_modules_warmed_total` | counter | | modules compiled ahead of their first job |
//! | `htfaas_ep_warm_refused_total` | counter | `reason` (`origin`, `digest`) | warm messages refused: a module URL outside the allowed origins, bytes that do not hash to the digest |
//! | `htfaas_ep_warm_failed_total` | counter | | warm messages that failed otherwise (fetch, compile) or were dropped (queue full) |
//! | `htfaas_ep_reference_files_total` | counter | `from` (`cache`, `storage`) | jobs' reference files linked from the EP's cache, or downloaded |
//! | `htfaas_ep_checkpoints_total` | counter | `event` (`restored`, `saved`, `over_bound`, `failed`) | jobs' checkpoints restored before a run, stored after one, refused for their bound, or failed otherwise |
//! | `htfaas_ep_attach_renewals_total` | counter | `result` (`renewed`, `refused`) | renewals of the EP's attach token the scheduler answered |
//!
//! Every counter is an atomic: a job's end costs a few relaxed additions, no lock.

use crate::config::Settings;
use crate::counters::{CHECKPOINT_EVENTS, OUTCOMES};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use htfaas_functions::metrics::CONTENT_TYPE;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;

/// The metrics listener's limits: a scraper or two, each request a bodiless `GET`; a slow
/// or flooding client is cut off or waits without holding the EP's descriptors.
pub const METRICS_LIMITS: htfaas_functions::serve::Limits =
    htfaas_functions::serve::Limits { header_read_timeout_s: 10, body_idle_timeout_s: 10, max_connections: 64 };

/// Serves `GET /metrics` on `listener` until `shutdown`, under [`METRICS_LIMITS`].
pub(crate) async fn serve(listener: tokio::net::TcpListener, settings: Arc<Settings>, shutdown: CancellationToken) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let settings = settings.clone();
            async move { render(&settings) }
        }),
    );
    if let Err(e) = htfaas_functions::serve::serve(listener, app, METRICS_LIMITS, shutdown).await {
        tracing::warn!("the metrics listener failed: {e}");
    }
}

/// The text of a scrape.
pub(crate) fn render(settings: &Arc<Settings>) -> Response {
    match htfaas_functions::metrics::encode(EpCollector(settings.clone())) {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::error!("failed to encode the metrics: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Reads the EP's figures at scrape time.
struct EpCollector(Arc<Settings>);

impl std::fmt::Debug for EpCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EpCollector")
    }
}

impl Collector for EpCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let m = &s.metrics;
        let slots = s.slots;
        let mib = 1u64 << 20;
        for (name, help, unit, v) in [
            ("htfaas_ep_slot_cpus", "Cores advertised.", None, u64::from(slots.cpus)),
            ("htfaas_ep_slot_memory", "Memory advertised.", Some(Unit::Bytes), slots.memory_mb.saturating_mul(mib)),
            ("htfaas_ep_slot_gpus", "GPUs advertised.", None, u64::from(slots.gpus)),
            ("htfaas_ep_slot_disk", "Scratch disk advertised.", Some(Unit::Bytes), slots.disk_mb.saturating_mul(mib)),
            ("htfaas_ep_slot_runtime", "Longest job accepted.", Some(Unit::Seconds), slots.runtime_s),
            ("htfaas_ep_jobs_running", "Jobs assigned and not yet reported.", None, s.activity.running() as u64),
            ("htfaas_ep_modules_cached", "Compiled modules held in memory.", None, s.runtime.cached_count() as u64),
        ] {
            e.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?.encode_gauge(&v)?;
        }
        let mut runs = e.encode_descriptor("htfaas_ep_runs", "Jobs ended, by outcome.", None, MetricType::Counter)?;
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            let n = m.runs[i].load(Ordering::Relaxed);
            runs.encode_family(&[("outcome", *outcome)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        m.duration.encode(&mut e, "htfaas_ep_job_duration", "From Assign to report: module, input, run, outputs.")?;
        let rt = &s.runtime;
        for (name, help, v) in [
            ("htfaas_ep_instantiations", "Guest runs started.", m.instantiations.load(Ordering::Relaxed)),
            ("htfaas_ep_modules_compiled", "Modules compiled with cranelift.", rt.compiled_count()),
            (
                "htfaas_ep_modules_loaded_from_disk",
                "Modules deserialized from verified artifacts.",
                rt.loaded_from_disk_count(),
            ),
            (
                "htfaas_ep_modules_rejected_from_disk",
                "Artifacts on disk refused and compiled again.",
                rt.rejected_from_disk_count(),
            ),
            ("htfaas_ep_modules_warmed", "Modules compiled ahead of their first job.", m.warmed()),
            (
                "htfaas_ep_warm_failed",
                "Warm messages that failed (fetch, compile) or were dropped.",
                m.warm_failed.load(Ordering::Relaxed),
            ),
        ] {
            e.encode_descriptor(name, help, None, MetricType::Counter)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
        let (origin, digest) = m.warm_refused();
        let mut refused = e.encode_descriptor(
            "htfaas_ep_warm_refused",
            "Warm messages refused, by reason.",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [("origin", origin), ("digest", digest)] {
            refused.encode_family(&[("reason", reason)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        let (cache, storage) = m.reference_files();
        let mut refs = e.encode_descriptor(
            "htfaas_ep_reference_files",
            "Jobs' reference files, by where they came from.",
            None,
            MetricType::Counter,
        )?;
        for (from, n) in [("cache", cache), ("storage", storage)] {
            refs.encode_family(&[("from", from)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        let mut checkpoints = e.encode_descriptor(
            "htfaas_ep_checkpoints",
            "Jobs' checkpoints restored, saved, refused for their bound, or failed.",
            None,
            MetricType::Counter,
        )?;
        for (i, event) in CHECKPOINT_EVENTS.iter().enumerate() {
            let n = m.checkpoints[i].load(Ordering::Relaxed);
            checkpoints.encode_family(&[("event", *event)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        let mut renewals = e.encode_descriptor(
            "htfaas_ep_attach_renewals",
            "Renewals of the EP's attach token the scheduler answered: renewed or refused.",
            None,
            MetricType::Counter,
        )?;
        for (i, result) in ["renewed", "refused"].iter().enumerate() {
            let n = m.attach_renewals[i].load(Ordering::Relaxed);
            renewals.encode_family(&[("result", *result)])?.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::counters::{DURATION_BUCKETS, Metrics, outcome_label};
    use htfaas_functions::proto::Outcome;
    use std::time::Duration;

    #[test]
    fn outcomes_are_counted_by_kind_and_timed() {
        let m = Metrics::default();
        m.job_finished(&Outcome::Exited { exit_code: 3 }, Duration::from_millis(20));
        m.job_finished(&Outcome::Cancelled { reason: "x".into() }, Duration::from_secs(7200));
        assert_eq!((m.runs("exited"), m.runs("cancelled"), m.runs("trapped")), (1, 1, 0));
        assert_eq!(outcome_label(&Outcome::TimeExceeded { limit_s: 1, vacate: None }), "time_exceeded");
        assert_eq!(m.duration.bucket(2), 1, "0.02 s is in le 0.025");
        assert_eq!(m.duration.bucket(DURATION_BUCKETS.len()), 1, "+Inf");
        assert!((m.duration.sum_s() - 7_200.02).abs() < 1e-9);
    }
}
