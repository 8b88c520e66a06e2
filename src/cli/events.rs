//! `htfaas events publish|replay|backfill`: storage events into JetStream, functions run again
//! over the recorded ones, and fired on files whose events were lost. Must not know: how reports are printed ([`super::output`]).

use super::args::{DirArg, client, parse_header, parse_time_arg};
use super::output;
use anyhow::Context as _;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum EventsCommand {
    /// Publish a raw event (JSON file) through JetStream: a dCache billing message on the
    /// default subject, or a CloudEvent on `storage.cloudevents.<producer>` (structured: the file
    /// is the event; binary: `--header ce-specversion=1.0 --header ce-id=… …`, the file is data).
    Publish {
        #[command(flatten)]
        dir: DirArg,
        /// The event file.
        file: PathBuf,
        /// Subject.
        #[arg(long, default_value = htfaas_functions::proto::EVENTS_SUBJECT)]
        subject: String,
        /// A NATS header NAME=VALUE, e.g. `ce-type=org.example.closed` (repeatable).
        #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
        headers: Vec<(String, String)>,
    },
    /// Run functions again over recorded events (admin), or with --dry-run list the (event,
    /// function) pairs that would fire. A replay's jobs have dedupe keys of their own: it runs
    /// again what already ran, once per replay id.
    Replay {
        #[command(flatten)]
        dir: DirArg,
        /// First recording time read: RFC 3339 (2026-11-22T10:00:00Z), Unix seconds, or before
        /// now (-2h, -30m, -7d).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: String,
        /// Last recording time read (default: the last event recorded).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
        /// Only this function (default: every registered function).
        #[arg(long)]
        function: Option<String>,
        /// List the pairs that would fire; start nothing.
        #[arg(long)]
        dry_run: bool,
        /// Most recorded messages read (default 10000, at most 100000).
        #[arg(long)]
        limit: Option<u64>,
        /// Continue or retry the replay with this id (what it already started is not started
        /// again). Default: a fresh id.
        #[arg(long, conflicts_with = "dry_run")]
        replay_id: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fire a function (its live version), exactly once, on each file under a directory that
    /// never fired it: for events lost before they reached the stream (a bridge that was down,
    /// a stream past its retention). Lists the storage through WebDAV PROPFIND (the built-in
    /// storage, dCache's WebDAV door, XrdHttp); files the trigger does not fire on, files with a
    /// job or a firing of the function, and files changed in the last --min-age are left.
    Backfill {
        #[command(flatten)]
        dir: DirArg,
        /// The function.
        #[arg(long)]
        function: String,
        /// The directory whose tree is listed (in the function's owner's read namespace).
        #[arg(long, value_name = "DIR")]
        prefix: String,
        /// List what would fire; fire nothing.
        #[arg(long)]
        dry_run: bool,
        /// Leave files changed less than this many seconds ago (their event may be on the way).
        #[arg(long, value_name = "SECONDS", default_value_t = htfaas_functions::proto::DEFAULT_BACKFILL_MIN_AGE_S)]
        min_age: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `htfaas events …`.
pub async fn run(command: EventsCommand) -> anyhow::Result<()> {
    match command {
        EventsCommand::Publish { dir, file, subject, headers } => {
            let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
            let seq = client(&dir)?.publish_event_with_headers(&subject, &headers, bytes).await?;
            output::published(&subject, seq);
            Ok(())
        }
        EventsCommand::Replay { dir, since, until, function, dry_run, limit, replay_id, json } => {
            use htfaas_functions::proto::{ReplayRequest, TimeArg};
            let request = ReplayRequest {
                since: TimeArg::Text(since),
                until: until.map(TimeArg::Text),
                function,
                dry_run,
                limit,
                replay_id,
            };
            let report = client(&dir)?.replay(&request).await?;
            output::replay(&report, json)
        }
        EventsCommand::Backfill { dir, function, prefix, dry_run, min_age, json } => {
            let request =
                htfaas_functions::proto::BackfillRequest { function, prefix, dry_run, min_age_s: Some(min_age) };
            let report = client(&dir)?.backfill(&request).await?;
            output::backfill(&report, json)
        }
    }
}
