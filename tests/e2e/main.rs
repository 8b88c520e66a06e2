//! End-to-end tests: real nats-server, real storage, scheduler, gateway and EP, real wasm.
//! One test binary (`cargo test -p htfaas-tests`), one module per concern.

mod accounting;
mod annex;
mod annex_slurm;
mod attacks;
mod audit;
mod bridges;
mod configs;
mod console;
mod exactly_once;
mod examples;
mod faults;
mod jobs;
mod js;
mod kafka;
mod kafka_support;
mod lineage;
mod loop_guard;
mod metrics;
mod overload;
mod path;
mod python;
mod replay;
mod revoke;
mod scopes;
mod security;
mod slurm_support;
mod sources;
mod tls;
mod tokens;
mod triggers;
mod xrootd;
mod xrootd_support;
