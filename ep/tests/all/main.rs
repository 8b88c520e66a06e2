//! htfaas-ep tests: one binary (runtime limits, sandbox, data path and attach protocol).

mod common;
mod lifecycle;
mod link;
mod runtime;
mod sandbox;
