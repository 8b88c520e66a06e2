//! What `htfaas accounting` and `htfaas map` ask of the stack: reports summed from the job
//! records, the ended jobs of a window, every page, for the accounting export; the OIDC
//! identities bound to owners, and unbinding one.
//!
//! Must not know: how they are printed (the CLI's output).

use super::{Client, check};
use anyhow::Context as _;
use htfaas_functions::proto::{AccountingBy, AccountingQuery, AccountingReport, JobRecord};
use htfaas_functions::registry::identities::Binding;

impl Client {
    /// Jobs by final state, hours, peak memory and bytes per owner, group or function (and per
    /// period), summed from the job records (admin): [`super::report_table`], [`super::report_csv`] print it.
    pub async fn accounting_report(&self, query: &AccountingQuery) -> anyhow::Result<AccountingReport> {
        let by = match query.by {
            AccountingBy::Owner => "owner",
            AccountingBy::Group => "group",
            AccountingBy::Function => "function",
        };
        let mut url = reqwest::Url::parse(&self.gateway("/v1/accounting/report")).context("gateway URL")?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("by", by);
            for (key, value) in
                [("since_ms", query.since_ms), ("until_ms", query.until_ms), ("period_s", query.period_s)]
            {
                if let Some(value) = value {
                    q.append_pair(key, &value.to_string());
                }
            }
        }
        let resp = self.http.get(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "accounting report").await?.json().await?)
    }

    /// The jobs that ended in `[since_ms, until_ms)`, in the order they ended (admin): every
    /// page of the scheduler's answer, for the accounting export.
    pub async fn jobs_ended(&self, since_ms: u64, until_ms: u64) -> anyhow::Result<Vec<JobRecord>> {
        const PAGE: usize = 10_000;
        let (mut since, mut after, mut out) = (since_ms, None::<String>, Vec::new());
        loop {
            let mut url = reqwest::Url::parse(&self.gateway("/v1/jobs")).context("gateway URL")?;
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("ended_since_ms", &since.to_string());
                q.append_pair("ended_until_ms", &until_ms.to_string());
                q.append_pair("limit", &PAGE.to_string());
                if let Some(after) = &after {
                    q.append_pair("after", after);
                }
            }
            let resp = self.http.get(url).bearer_auth(&self.info.admin_token).send().await?;
            let page: Vec<JobRecord> = check(resp, "ended jobs").await?.json().await?;
            let full = page.len() == PAGE;
            if let Some(last) = page.last() {
                since = last.finished_at_ms.unwrap_or(since);
                after = Some(last.id.clone());
            }
            out.extend(page);
            if !full {
                return Ok(out);
            }
        }
    }

    /// The OIDC identities bound to owners (admin).
    pub async fn identities(&self) -> anyhow::Result<Vec<Binding>> {
        self.admin_get("/v1/identities").await
    }

    /// Frees `owner` for another identity (admin); the binding removed.
    pub async fn unbind_identity(&self, owner: &str) -> anyhow::Result<Binding> {
        let url = self.gateway(&format!("/v1/identities/{}", super::segment(owner)?));
        let resp = self.http.delete(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "unbind the identity").await?.json().await?)
    }
}
