//! A submit request checked on its own, before its URLs, its token's limits and the site
//! policy ([`validate`], 400 [`SubmitInvalid`]): names, URLs and field sizes, arguments, the
//! environment and the secrets, the retry policy's bounds; a job without an input (a run on no
//! file) runs no handler, which serves one file per run.
//!
//! Must not know: tokens, the store, HTTP beyond the rule each refusal names.

use htfaas_functions::manifest::{
    MAX_CPUS, MAX_DISK_MB, MAX_GPUS, MAX_MEMORY_MB, MAX_RUNTIME_S, NameError, check_name, is_clean_abs_path,
};
use htfaas_functions::proto::SubmitRequest;

/// Longest URL, macaroon, event field or dedupe key accepted, bytes.
pub const MAX_FIELD_BYTES: usize = 8192;

fn http_url(u: &str) -> bool {
    let rest = u.strip_prefix("https://").or_else(|| u.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
        && u.len() <= MAX_FIELD_BYTES
        && !u.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Whether `s` is at most [`MAX_FIELD_BYTES`] without NUL.
pub fn bounded(s: &str) -> bool {
    s.len() <= MAX_FIELD_BYTES && !s.contains('\0')
}

/// Why a submit request is refused on its own ([`validate`], 400): the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitInvalid {
    /// `function.name` is empty, over 128 bytes or holds a control character.
    #[error("function.name must be 1-128 printable characters")]
    FunctionName,
    /// `function.module_url` is not an http(s) URL.
    #[error("function.module_url must be an http or https URL")]
    ModuleUrl,
    /// `function.native.command` is empty, longer than 64 words, or has a word over 4096 bytes
    /// or with NUL.
    #[error("function.native.command must be 1-64 words of at most 4096 bytes, no NUL, the first not empty")]
    Command,
    /// `resources.cpus` is 0 or over [`MAX_CPUS`].
    #[error("resources.cpus must be 1..={MAX_CPUS}")]
    Cpus,
    /// `resources.memory_mb` is 0 or over [`MAX_MEMORY_MB`].
    #[error("resources.memory_mb must be 1..={MAX_MEMORY_MB}")]
    MemoryMb,
    /// `resources.runtime_s` is over [`MAX_RUNTIME_S`].
    #[error("resources.runtime_s must be 0..={MAX_RUNTIME_S} (0: the job class's default)")]
    RuntimeS,
    /// `resources.gpus` is over [`MAX_GPUS`].
    #[error("resources.gpus must be 0..={MAX_GPUS}")]
    Gpus,
    /// `resources.disk_mb` is over [`MAX_DISK_MB`].
    #[error("resources.disk_mb must be 0..={MAX_DISK_MB}")]
    DiskMb,
    /// `class` is not a name.
    #[error("class {0}")]
    Class(NameError),
    /// `input.name` is not one path segment (the name).
    #[error("input.name {0:?} must be one path segment, not . or ..")]
    InputName(String),
    /// `input.url` is not an http(s) URL.
    #[error("input.url must be an http or https URL")]
    InputUrl,
    /// A job without an input for a native handler, which serves one file per run.
    #[error("a job without an input cannot run a handler (function.native.handler): a handler serves one file per run")]
    HandlerWithoutInput,
    /// The input's expected sha256 is not 64 hex digits.
    #[error("input.sha256 must be 64 hex digits")]
    InputSha256,
    /// `output.url` is not an http(s) URL ending in `/`.
    #[error("output.url must be an http or https URL ending in '/'")]
    OutputUrl,
    /// A macaroon is over [`MAX_FIELD_BYTES`] or holds a NUL.
    #[error("macaroons must be at most {MAX_FIELD_BYTES} bytes without NUL")]
    Macaroons,
    /// Too many or too long arguments, or one with a NUL.
    #[error("args: at most 64 arguments of at most 4096 bytes, no NUL")]
    Args,
    /// Too many environment variables, or a bad name or value.
    #[error("env: at most 64 variables; names non-empty without '=' or NUL; values at most 4096 bytes")]
    Env,
    /// More than 64 secrets, a bad name or value (as `env`), or a name also in `env`.
    #[error(
        "secrets: at most 64; names non-empty without '=' or NUL, none also in env; values under 4 KiB without NUL"
    )]
    Secrets,
    /// An event field is over [`MAX_FIELD_BYTES`] or holds a NUL.
    #[error("event fields must be at most {MAX_FIELD_BYTES} bytes without NUL")]
    EventFields,
    /// `event.producer_span` is not a span id.
    #[error("event.producer_span must be 16 hex digits")]
    ProducerSpan,
    /// `event.trace` is not a W3C `traceparent`.
    #[error("event.trace must be a W3C traceparent: {0}")]
    Trace(htfaas_functions::trace::TraceError),
    /// `dedupe_key` is empty, over 1024 bytes or holds a NUL.
    #[error("dedupe_key must be 1-1024 bytes without NUL")]
    DedupeKey,
    /// `annex` is not a name.
    #[error("annex {0}")]
    Annex(NameError),
    /// `retry` asks for more retries or a longer backoff than a manifest may, or names no
    /// outcome.
    #[error("{0}")]
    Retry(htfaas_functions::on_failure::RetryPolicyError),
    /// `max_concurrent` is 0 or above the most a manifest may ask.
    #[error("max_concurrent must be 1..={}", htfaas_functions::manifest::MAX_CONCURRENT)]
    MaxConcurrent,
    /// A reference input has a bad URL, macaroon or guest path, or there are too many.
    #[error(
        "refs: at most {} files, each with an http(s) URL, a macaroon, a distinct clean relative path and, if \
         any, a sha256 of 64 hex digits",
        htfaas_functions::proto::MAX_REFERENCE_FILES
    )]
    References,
}

/// The request on its own (400).
pub fn validate(req: &SubmitRequest) -> Result<(), SubmitInvalid> {
    use SubmitInvalid::*;
    let f = &req.function;
    if f.name.is_empty() || f.name.len() > 128 || f.name.chars().any(char::is_control) {
        return Err(FunctionName);
    }
    if !http_url(&f.module_url) {
        return Err(ModuleUrl);
    }
    let r = &req.resources;
    if r.cpus == 0 || r.cpus > MAX_CPUS {
        return Err(Cpus);
    }
    if r.memory_mb == 0 || r.memory_mb > MAX_MEMORY_MB {
        return Err(MemoryMb);
    }
    if r.runtime_s > MAX_RUNTIME_S {
        return Err(RuntimeS);
    }
    if r.gpus > MAX_GPUS {
        return Err(Gpus);
    }
    if r.disk_mb > MAX_DISK_MB {
        return Err(DiskMb);
    }
    if let Some(class) = &req.class {
        check_name(class).map_err(Class)?;
    }
    match &req.input {
        Some(input) => check_input(input)?,
        None if req.function.native.as_ref().is_some_and(|n| n.handler) => return Err(HandlerWithoutInput),
        None => {}
    }
    if !http_url(&req.output.url) || !req.output.url.ends_with('/') {
        return Err(OutputUrl);
    }
    if !bounded(&req.output.macaroon) {
        return Err(Macaroons);
    }
    if req.args.len() > 64 || req.args.iter().any(|a| a.len() > 4096 || a.contains('\0')) {
        return Err(Args);
    }
    if let Some(n) = &req.function.native
        && (n.command.is_empty()
            || n.command.len() > 64
            || n.command[0].is_empty()
            || n.command.iter().any(|a| a.len() > 4096 || a.contains('\0')))
    {
        return Err(Command);
    }
    if req.env.len() > 64
        || req.env.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.len() > 4096 || v.contains('\0'))
    {
        return Err(Env);
    }
    let secrets = &req.secrets.0;
    if secrets.len() > 64
        || secrets.iter().any(|(k, v)| {
            k.is_empty()
                || k.contains(['=', '\0'])
                || v.len() > 4096
                || v.contains('\0')
                || req.env.iter().any(|(e, _)| e == k)
        })
    {
        return Err(Secrets);
    }
    let e = &req.event;
    if !bounded(&e.source) || !bounded(&e.id) || !bounded(&e.path) {
        return Err(EventFields);
    }
    if e.producer_span.as_deref().is_some_and(|p| p.len() != 16 || !p.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(ProducerSpan);
    }
    if let Some(t) = &e.trace {
        htfaas_functions::trace::TraceParent::parse(t).map_err(Trace)?;
    }
    if req.dedupe_key.is_empty() || req.dedupe_key.len() > 1024 || req.dedupe_key.contains('\0') {
        return Err(DedupeKey);
    }
    if let Some(annex) = &req.annex {
        check_name(annex).map_err(Annex)?;
    }
    if let Some(retry) = &req.retry {
        retry.check().map_err(Retry)?;
    }
    if req.max_concurrent.is_some_and(|n| n == 0 || n > htfaas_functions::manifest::MAX_CONCURRENT) {
        return Err(MaxConcurrent);
    }
    let refs = &req.refs;
    if refs.len() > htfaas_functions::proto::MAX_REFERENCE_FILES
        || refs.iter().enumerate().any(|(i, r)| {
            !http_url(&r.url)
                || !bounded(&r.macaroon)
                || !htfaas_functions::proto::ReferenceInput::is_clean_path(&r.path)
                || refs[..i].iter().any(|o| o.path == r.path)
                || r.sha256.as_deref().is_some_and(|h| h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
    {
        return Err(References);
    }
    Ok(())
}

/// A job's input: one clean name, an http(s) URL, a bounded macaroon, a sha256 if any.
fn check_input(input: &htfaas_functions::proto::InputSpec) -> Result<(), SubmitInvalid> {
    let name = &input.name;
    if name.is_empty() || name.len() > 255 || name.contains('/') || !is_clean_abs_path(&format!("/{name}")) {
        return Err(SubmitInvalid::InputName(name.clone()));
    }
    if !http_url(&input.url) {
        return Err(SubmitInvalid::InputUrl);
    }
    if input.sha256.as_deref().is_some_and(|h| h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(SubmitInvalid::InputSha256);
    }
    if !bounded(&input.macaroon) {
        return Err(SubmitInvalid::Macaroons);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_trace_that_is_no_traceparent_is_refused() {
        let mut r = crate::testing::request("k");
        assert!(validate(&r).is_ok());
        r.event.trace = Some("00-not-a-trace".into());
        assert!(matches!(validate(&r), Err(SubmitInvalid::Trace(_))));
        r.event.trace = Some(htfaas_functions::trace::TraceParent::for_event("e").to_string());
        assert!(validate(&r).is_ok());
    }

    #[test]
    fn a_producer_span_must_be_a_span_id() {
        let mut r = crate::testing::request("k");
        for (p, ok) in [("00f067aa0ba902b7", true), ("00f067aa0ba902b", false), ("zzf067aa0ba902b7", false)] {
            r.event.producer_span = Some(p.into());
            assert_eq!(validate(&r).is_ok(), ok, "{p}");
        }
    }

    #[test]
    fn an_expected_input_sha256_must_be_64_hex_digits() {
        let mut r = crate::testing::request("k");
        for (h, ok) in [("ab".repeat(32), true), ("ab".repeat(33), false), ("g".repeat(64), false)] {
            r.input.as_mut().expect("an input").sha256 = Some(h.clone());
            assert_eq!(validate(&r).is_ok(), ok, "{h}");
        }
    }

    /// A job without an input validates, but not for a handler: a handler serves one file per
    /// run, and one without a file is refused (400) rather than handed a run it cannot serve.
    #[test]
    fn a_job_without_an_input_runs_no_handler() {
        let mut r = crate::testing::request("k");
        r.input = None;
        r.event.path = String::new();
        assert_eq!(validate(&r), Ok(()));
        r.function.native = Some(htfaas_functions::proto::NativeCode {
            command: vec!["/bin/run".into()],
            handler: false,
            vacate_s: None,
        });
        assert_eq!(validate(&r), Ok(()), "a command started per run may run on no file");
        r.function.native =
            Some(htfaas_functions::proto::NativeCode { command: vec!["/bin/h".into()], handler: true, vacate_s: None });
        let e = validate(&r).expect_err("a handler on no file");
        assert_eq!(e, SubmitInvalid::HandlerWithoutInput);
        assert!(e.to_string().contains("cannot run a handler"), "{e}");
    }
}
