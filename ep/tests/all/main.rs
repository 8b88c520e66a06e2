//! htfaas-ep tests: one binary (runtime limits, sandbox, data path, attach protocol, cancel,
//! lifecycle, TLS to the scheduler and storage).

mod cancel;
mod common;
mod fake;
mod lifecycle;
mod link;
mod runtime;
mod sandbox;
mod tls;
