//! Wire types: what gateway, scheduler and execution points (EPs) say to each other.
//!
//! Every message names its response (garage's habit): a request type documents the endpoint
//! it is sent to and the type that comes back. All are JSON.
//!
//! ```text
//! storage  --TransferMessage (NATS JetStream, EVENTS_SUBJECT)-->  gateway
//! gateway  --SubmitRequest (POST /v1/jobs, Bearer submit token)-->  scheduler  -> SubmitResponse
//! ep       --WebSocket GET /v1/ep/attach (Bearer attach token)-->  scheduler
//!          <-- SchedulerMsg::{Welcome, Assign(JobAssignment)}       EpMsg::{Hello, Finished(JobReport)} -->
//! ```
//!
//! Invariant: a [`JobAssignment`] carries no user identity. The owner stays in the scheduler.
//!
//! One submodule per conversation: [`events`] (storage events), [`submit`] (gateway to
//! scheduler), [`attach`] (EP to scheduler), [`jobs`] and [`admin`] (the scheduler's API),
//! [`annex`] (annexes: EPs provisioned through a batch system),
//! [`api`] (the gateway's API), [`lineage`] (the gateway's audit routes), [`notify`]
//! (job-end notifications on NATS), [`dlq`] (the gateway's dead-letter list), [`renew`]
//! (renewing a running job's macaroons, scheduler to gateway), [`rerun`] (re-deriving a file) and
//! [`backfill`] (firing on files whose events were lost). Every item is
//! re-exported here: callers name `proto::X`.
//!
//! Must not know: how anything is stored, decided or enforced; it carries audit records but
//! knows nothing of their chain or store.

pub mod admin;
pub mod annex;
pub mod api;
pub mod attach;
pub mod backfill;
pub mod dlq;
pub mod events;
pub mod jobs;
pub mod lineage;
pub mod notify;
pub mod renew;
pub mod rerun;
pub mod submit;
#[cfg(test)]
mod tests;

pub use crate::resources::JobLimits;
pub use admin::*;
pub use annex::*;
pub use api::*;
pub use attach::*;
pub use backfill::*;
pub use dlq::*;
pub use events::*;
pub use jobs::*;
pub use lineage::*;
pub use notify::*;
pub use renew::*;
pub use rerun::{Rerun, RerunRequest, RerunVerdict};
pub use submit::*;

use serde::{Deserialize, Serialize};

/// Error body of every htfaas HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Human-readable reason, naming the check that failed.
    pub error: String,
}
