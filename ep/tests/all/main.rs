//! htfaas-ep tests: one binary (runtime limits, sandbox, data path, attach protocol, cancel,
//! lifecycle).

mod cancel;
mod common;
mod fake;
mod lifecycle;
mod link;
mod runtime;
mod sandbox;
