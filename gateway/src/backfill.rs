//! Back-fill: a function fired, exactly once, on each file of a storage directory
//! tree that never fired it — for events lost before they reached the stream (a bridge that was
//! down, a stream past its retention).
//!
//! The tree is listed through the storage ([`crate::listing`]). Each file becomes a storage
//! event of source `backfill` (kind write, its size and modification time as the storage says,
//! no owner or storage class), and fires when the function's trigger is true for it and it lies
//! outside the function's own outputs (as a replay's, [`crate::replay::Target`]); quarantine and
//! re-run directories are never fired on. A file is left when the function already fired on it
//! — a job of the function on that path in the scheduler (`POST /v1/fired`), or a firing in the
//! table, in any state — or when it changed within the last `min_age_s` seconds (its event may
//! be on its way). The event's id is derived from the path, size and modification time, so a
//! second back-fill of an unchanged file is the same event, dropped by the firing table and the
//! scheduler's dedupe key. What fires goes through the firing table, as the ingest's firings do
//! (one transaction per chunk, recorded in the audit trail as `event.matched`).
//!
//! Must not know: HTTP routes, the consumer loop.

use crate::auth::Scheduler;
use crate::firing::{Firings, NewFirings};
use crate::listing::{ListError, Listed};
use crate::replay::Target;
use crate::stats::Stats;
use crate::storage_client::StorageClient;
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::proto::{BackfillReport, FiredPaths, FiredQuery, MAX_FIRED_QUERY};
use sha2::{Digest as _, Sha256};

/// Most files one back-fill lists.
pub const MAX_FILES: usize = 100_000;
/// Most files a report names.
const MAX_NAMED: usize = 1000;

/// What a back-fill uses of the gateway.
#[derive(Clone, Copy)]
pub struct BackfillContext<'a> {
    /// Lists the tree.
    pub storage: &'a StorageClient,
    /// The firing table: fired already, and where new firings go.
    pub firings: &'a Firings,
    /// Counters of the firings made.
    pub stats: &'a Stats,
    /// Which files have a job of the function.
    pub scheduler: Scheduler<'a>,
}

/// Why a back-fill stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    /// The storage could not list the tree.
    #[error(transparent)]
    List(#[from] ListError),
    /// The scheduler could not say which files have a job.
    #[error("the scheduler could not say which files have a job: {0}")]
    Scheduler(String),
    /// The firing table could not be read or written.
    #[error("the firing table: {0}")]
    Firings(String),
}

/// Whether a listed file may fire at all: not in a quarantine or re-run directory, whose files
/// never fire a function.
pub fn may_fire(file: &Listed) -> bool {
    !htfaas_functions::on_failure::is_quarantined(&file.path) && !htfaas_functions::proto::rerun::in_scratch(&file.path)
}

/// The event a back-fill fires for `file`: its id derived from the path, size and modification
/// time, so the same unchanged file is the same event.
pub fn event_for(file: &Listed) -> StorageEvent {
    let mut h = Sha256::new();
    h.update(file.path.as_bytes());
    h.update(format!("\n{:?}\n{:?}", file.size, file.modified_s).as_bytes());
    let id = format!("{}:{}", SourceKind::Backfill.as_str(), &hex::encode(h.finalize())[..32]);
    StorageEvent {
        source: EventSource { kind: SourceKind::Backfill, producer: "htfaas".into(), message: None },
        kind: EventKind::Write,
        msg_type: "backfill".into(),
        path: file.path.clone(),
        size: file.size,
        storage_class: None,
        owner: None,
        macaroon: None,
        id,
        time: file.modified_s.map(htfaas_functions::time::utc_timestamp),
        traceparent: None,
    }
}

/// Back-fills `function` (its live version) under `prefix` (a directory, ending in `/`); with
/// `dry_run`, fires nothing and reports what would fire.
pub async fn run(
    cx: BackfillContext<'_>,
    function: FunctionRecord,
    prefix: &str,
    dry_run: bool,
    min_age_s: u64,
    now_s: u64,
) -> Result<BackfillReport, BackfillError> {
    let m = &function.manifest;
    let mut report = BackfillReport {
        function: m.name.clone(),
        version: function.version,
        prefix: prefix.to_owned(),
        dry_run,
        ..BackfillReport::default()
    };
    let listing = crate::listing::list_tree(cx.storage, prefix, MAX_FILES).await?;
    report.listed = listing.files.len() as u64;
    report.truncated = listing.truncated;
    let target = Target::new(function.clone()).map_err(|e| BackfillError::Firings(format!("trigger: {e}")))?;
    let matched: Vec<(Listed, StorageEvent)> = listing
        .files
        .into_iter()
        .filter(may_fire)
        .map(|f| {
            let e = event_for(&f);
            (f, e)
        })
        .filter(|(_, e)| target.fires_on(e))
        .collect();
    report.matched = matched.len() as u64;
    for chunk in matched.chunks(MAX_FIRED_QUERY) {
        let paths: Vec<String> = chunk.iter().map(|(f, _)| f.path.clone()).collect();
        let name = m.name.clone();
        let in_table = {
            let paths = paths.clone();
            cx.firings.call(move |f| f.fired_paths(&name, &paths)).await
        }
        .map_err(|e| BackfillError::Firings(e.to_string()))?;
        let with_job = fired(&cx.scheduler, &m.owner, &m.name, paths).await?;
        let mut batch = Vec::new();
        for (file, event) in chunk {
            if in_table.contains(&file.path) || with_job.contains(&file.path) {
                report.already += 1;
            } else if file.modified_s.is_none_or(|t| now_s.saturating_sub(t) < min_age_s) && min_age_s > 0 {
                report.too_recent += 1;
            } else {
                report.fired_count += 1;
                if report.fired.len() < MAX_NAMED {
                    report.fired.push(file.path.clone());
                }
                batch.push(NewFirings { event: event.clone(), functions: vec![function.clone()], replay: None });
            }
        }
        if !dry_run && crate::ingest::fire_batch(cx.firings, cx.stats, batch).await != crate::ingest::Verdict::Ack {
            return Err(BackfillError::Firings("the firings could not be written; nothing of this chunk fired".into()));
        }
    }
    Ok(report)
}

/// The paths of `paths` that have a job of `function` of `owner` (`POST /v1/fired`).
async fn fired(
    scheduler: &Scheduler<'_>,
    owner: &str,
    function: &str,
    paths: Vec<String>,
) -> Result<Vec<String>, BackfillError> {
    let query = FiredQuery { owner: owner.to_owned(), function: function.to_owned(), paths };
    let resp = scheduler
        .http
        .post(format!("{}/v1/fired", scheduler.url))
        .bearer_auth(scheduler.admin_token)
        .json(&query)
        .send()
        .await
        .map_err(|e| BackfillError::Scheduler(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(BackfillError::Scheduler(resp.status().to_string()));
    }
    let answer: FiredPaths = resp.json().await.map_err(|e| BackfillError::Scheduler(e.to_string()))?;
    Ok(answer.paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_event_is_the_same_while_the_file_is_and_another_once_it_changes() {
        let f = Listed { path: "/data/raw/a.dat".into(), size: Some(3), modified_s: Some(1_795_705_200) };
        let e = event_for(&f);
        assert_eq!(e, event_for(&f.clone()));
        assert!(e.id.starts_with("backfill:") && e.id.len() == "backfill:".len() + 32, "{}", e.id);
        assert_eq!((e.source.kind, e.kind, e.size), (SourceKind::Backfill, EventKind::Write, Some(3)));
        assert_eq!(e.time.as_deref(), Some("2026-11-26T15:00:00Z"));
        for changed in [
            Listed { size: Some(4), ..f.clone() },
            Listed { modified_s: Some(1_795_705_201), ..f.clone() },
            Listed { path: "/data/raw/b.dat".into(), ..f.clone() },
        ] {
            assert_ne!(event_for(&changed).id, e.id, "{changed:?}");
        }
    }
}
