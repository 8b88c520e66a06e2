//! htfaas, the one binary: the local stack (`htfaas up`), each component on its own, and the
//! commands that talk to a running stack.
//!
//! - [`stack`] starts NATS, storage, scheduler, gateway and an EP in one process, as
//!   `htfaas up` does and as the end-to-end tests do;
//! - [`nats`] runs a real `nats-server` child process;
//! - [`overload`] is `htfaas overload`: one owner's flood against another owner's one event;
//! - [`procs`] runs the stack as five processes (the crash harness kills them);
//! - [`mod@bench`] is `htfaas bench`: the whole path against the peer, side by side;
//! - [`crash`] is `htfaas crash-test`: every component killed at random under a stream of
//!   events, then the checks that nothing was lost, run twice or charged twice;
//! - [`cluster`] is `htfaas cluster-test`: the crash harness's stream and checks on a site of
//!   network namespaces ([`netns`]): a NATS cluster, the components on hosts of their own, EPs
//!   over TLS, a NATS node killed, a link cut, the service host restarted;
//! - [`devkit`] is `htfaas fn new|build`: project templates per language and the toolchain
//!   runs that turn a project into wasm (`fn run` is `htfaas_ep::local`);
//! - [`client`] is what `htfaas put|get|fn|jobs|accounting|events` use.
//! - [`annex`] is `htfaas annex`: EPs provisioned through a batch system (Slurm first) behind a
//!   provider interface.
//! - [`pki`] makes a private CA and a server certificate (the local stack with TLS, the
//!   multi-host harness).
//! - [`relay`] is a loopback TCP relay whose forwarding can be cut and mended (the EP's link
//!   to the scheduler in the long-job harness, [`crash::long`]);
//! - [`traffic`] is what the harnesses share: input files, `transfer` messages, job gauges,
//!   CPU time, percentiles.
//!
//! The binary's command line (`src/main.rs`: parsing and dispatch; `src/cli/`: one module per
//! command group, and everything printed) uses this library and is not part of it.

pub mod annex;
pub mod bench;
pub mod client;
pub mod cluster;
pub mod crash;
pub mod devkit;
pub mod nats;
pub mod netns;
pub mod overload;
pub mod pki;
pub mod procs;
pub mod relay;
pub mod stack;
pub mod traffic;
