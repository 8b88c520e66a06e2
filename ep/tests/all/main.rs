//! htfaas-ep tests: one binary (runtime limits, sandbox, data path, attach protocol, cancel,
//! lifecycle, TLS to the scheduler and storage, what an EP survives of its guests).

mod cancel;
mod checkpoint;
mod common;
mod components;
mod datapath;
mod fake;
mod guests;
mod lifecycle;
mod limits;
mod link;
mod ops;
mod prefetch;
mod runtime;
mod sandbox;
mod tls;
mod warm;
