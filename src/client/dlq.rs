//! The dead-letter list's calls: list, show, re-drive, drop, with the profile's
//! token (a developer's own entries, an admin's all). Must not know: how they are printed.

use super::{Client, check};
use anyhow::Context as _;

impl Client {
    /// The dead-letter list, newest first: the caller's own entries (an admin's:
    /// all), of `function` only and made since `since` (RFC 3339, Unix seconds, `-2h`) when
    /// given, dropped ones too with `dropped`.
    pub async fn dead_letters(
        &self,
        function: Option<&str>,
        since: Option<&str>,
        dropped: bool,
    ) -> anyhow::Result<Vec<htfaas_functions::proto::DeadLetter>> {
        let mut url = reqwest::Url::parse(&self.gateway("/v1/dlq")).context("gateway URL")?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(f) = function {
                q.append_pair("function", f);
            }
            if let Some(s) = since {
                q.append_pair("since", s);
            }
            if dropped {
                q.append_pair("dropped", "true");
            }
        }
        let resp = self.http.get(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "list the dead letters").await?.json().await?)
    }

    /// One dead-letter entry, with its re-drives and its drop.
    pub async fn dead_letter(&self, id: u64) -> anyhow::Result<htfaas_functions::proto::DeadLetter> {
        self.admin_get(&format!("/v1/dlq/{id}")).await
    }

    /// Re-drives dead-letter entry `id`: re-drive number `n` (the entry's re-drives + 1 when
    /// `None`: read first, so that a retried command starts nothing more).
    pub async fn redrive(&self, id: u64, n: Option<u32>) -> anyhow::Result<htfaas_functions::proto::RedriveResponse> {
        let n = match n {
            Some(n) => n,
            None => u32::try_from(self.dead_letter(id).await?.redrives.len()).unwrap_or(u32::MAX).saturating_add(1),
        };
        let body = htfaas_functions::proto::RedriveRequest { n: Some(n) };
        self.admin_post(&format!("/v1/dlq/{id}/redrive"), "re-drive the dead letter", &body).await
    }

    /// Drops dead-letter entry `id`, for `reason`.
    pub async fn drop_dead_letter(&self, id: u64, reason: &str) -> anyhow::Result<htfaas_functions::proto::DeadLetter> {
        let body = htfaas_functions::proto::DropRequest { reason: reason.to_owned() };
        self.admin_post(&format!("/v1/dlq/{id}/drop"), "drop the dead letter", &body).await
    }
}
