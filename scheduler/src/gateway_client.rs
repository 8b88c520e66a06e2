//! The gateway's renewal route (`POST /v1/renewals`), and the client the scheduler
//! calls it with: a job's renewal grant as the bearer, the job's facts as the body
//! ([`RenewRequest`]), fresh macaroons back ([`RenewResponse`]).
//!
//! Must not know: `Shared`, the store, sessions, what the answer is used for ([`crate::renew`]).

use htfaas_functions::proto::{ApiError, RENEWALS_PATH, RenewRequest, RenewResponse};
use std::time::Duration;

/// How long the gateway's answer may take.
pub const GATEWAY_TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway's renewal route, and the client that calls it.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    url: String,
}

impl Gateway {
    /// The gateway at `base` (no trailing `/` needed), called with `http`.
    pub fn new(http: reqwest::Client, base: &str) -> Gateway {
        Gateway { http, url: format!("{}{RENEWALS_PATH}", base.trim_end_matches('/')) }
    }

    /// Asks for fresh macaroons with `grant`; `Err` is the gateway's refusal or why it could
    /// not be asked.
    pub async fn renew(&self, grant: &str, req: &RenewRequest) -> Result<RenewResponse, String> {
        let resp = self
            .http
            .post(&self.url)
            .bearer_auth(grant)
            .json(req)
            .timeout(GATEWAY_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("the gateway could not be asked: {e}"))?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(|e| format!("the gateway's answer does not parse: {e}"));
        }
        let reason = match resp.json::<ApiError>().await {
            Ok(e) => e.error,
            Err(_) => String::new(),
        };
        Err(format!("the gateway refused ({status}): {reason}"))
    }
}
