//! The binary's edge: one module per command group, each with its clap arguments and what the
//! command does through the library ([`htfaas::client`], [`htfaas::stack`], …); [`output`] prints
//! everything. `main.rs` parses the command line and dispatches here. Must not know: the
//! components' insides (only their libraries' `run` and the client).

pub mod accounting;
pub mod annex;
pub mod args;
pub mod audit;
pub mod bridge;
pub mod dlq;
pub mod ep;
pub mod events;
pub mod files;
pub mod fn_cmd;
pub mod fn_dev;
pub mod harness;
pub mod image;
pub mod jobs;
pub mod login;
pub mod logs;
pub mod map;
pub mod ns;
pub mod output;
pub mod serve;
pub mod signals;
pub mod submit;
pub mod token;
pub mod trace;
pub mod up;
