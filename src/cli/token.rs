//! `htfaas token submit|api|ep|revoke|revocations`: tokens minted with the local stack's keys,
//! and their revocation (admin). Must not know: how tokens and revocations are printed
//! ([`super::output`]).

use super::args::{DirArg, client, parse_duration_s};
use super::output;
use anyhow::Context as _;
use clap::Subcommand;
use htfaas_functions::Resources;

#[derive(Subcommand)]
pub enum TokenCommand {
    /// A submit token for a person or a service; printed on stdout.
    Submit {
        #[command(flatten)]
        dir: DirArg,
        /// Owner accounted for the jobs.
        #[arg(long)]
        owner: String,
        /// Jobs it may submit.
        #[arg(long, default_value_t = 1)]
        jobs: u32,
        /// Most cores per job.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Most memory per job, MiB.
        #[arg(long, default_value_t = 2048)]
        memory_mb: u64,
        /// Longest run time per job (e.g. 90s, 30m, 2h).
        #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
        runtime: u64,
        /// Only this function digest.
        #[arg(long)]
        function: Option<htfaas_functions::Digest>,
        /// Charge its jobs to this accounting group.
        #[arg(long)]
        group: Option<String>,
        /// Lifetime of the token (e.g. 15m, 1h, 7d).
        #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
        ttl: u64,
    },
    /// An API token for the gateway's HTTP API, signed with the local stack's gateway key;
    /// printed on stdout. `developer`: the owner's own functions, jobs, accounting and audit
    /// records; `admin`: every route. Revocable by its `jti`, its owner or the issuer.
    Api {
        #[command(flatten)]
        dir: DirArg,
        /// The owner the token acts as (its `sub`).
        #[arg(long)]
        owner: String,
        /// `developer` or `admin`.
        #[arg(long)]
        scope: htfaas_functions::token::Scope,
        /// Lifetime of the token (e.g. 1h, 30d).
        #[arg(long, default_value = "30d", value_parser = parse_duration_s)]
        ttl: u64,
    },
    /// Revoke tokens at once, everywhere: by token id, by owner or by issuer. Queued jobs of
    /// the tokens are removed, running ones stopped, EPs attached with them disconnected.
    Revoke {
        #[command(flatten)]
        dir: DirArg,
        /// One token, submit or attach, by its `jti`.
        #[arg(long, group = "target")]
        jti: Option<String>,
        /// Every token of this owner.
        #[arg(long, group = "target")]
        owner: Option<String>,
        /// Every token this issuer signed.
        #[arg(long, group = "target")]
        issuer: Option<String>,
        /// Why; recorded with every job it removes or stops.
        #[arg(long)]
        reason: String,
    },
    /// List recorded revocations.
    Revocations {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// An attach token for an EP; printed on stdout.
    Ep {
        #[command(flatten)]
        dir: DirArg,
        /// Run only this owner's jobs (default: a site EP that may run any job).
        #[arg(long)]
        owner: Option<String>,
        /// Run only jobs that ask for this annex (and be the only place they run).
        #[arg(long)]
        annex: Option<String>,
        /// Lifetime of the token (e.g. 1h, 30d).
        #[arg(long, default_value = "1d", value_parser = parse_duration_s)]
        ttl: u64,
    },
}

/// `htfaas token …`.
pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Submit { dir, owner, jobs, cpus, memory_mb, runtime, function, group, ttl } => {
            let grant = htfaas::stack::SubmitGrant {
                owner,
                jobs,
                limits: Resources::new(cpus, memory_mb, runtime),
                function,
                group,
                ttl_s: ttl,
            };
            output::token(&htfaas::stack::mint_submit_token(&dir.dir, &grant)?);
            Ok(())
        }
        TokenCommand::Api { dir, owner, scope, ttl } => {
            let key =
                htfaas_functions::token::SigningKey::load_or_create(&dir.dir.join("gateway/submit.pem"), "gateway-1")
                    .context("load the gateway's key (run `htfaas up` once to create it)")?;
            let claims = htfaas_functions::token::ApiClaims::new("htfaas-gateway", &owner, scope, ttl);
            output::token(&key.sign(&claims)?);
            Ok(())
        }
        TokenCommand::Ep { dir, owner, annex, ttl } => {
            output::token(&htfaas::stack::mint_ep_token(&dir.dir, owner, annex, ttl)?);
            Ok(())
        }
        TokenCommand::Revoke { dir, jti, owner, issuer, reason } => {
            use htfaas_functions::proto::RevocationTarget;
            let target = match (jti, owner, issuer) {
                (Some(j), None, None) => RevocationTarget::Jti(j),
                (None, Some(o), None) => RevocationTarget::Owner(o),
                (None, None, Some(i)) => RevocationTarget::Issuer(i),
                _ => anyhow::bail!("name exactly one of --jti, --owner, --issuer"),
            };
            let r = client(&dir)?.revoke(target, &reason).await?;
            output::revocation(&r);
            Ok(())
        }
        TokenCommand::Revocations { dir, json } => {
            let list = client(&dir)?.revocations().await?;
            output::revocations(&list, json)
        }
    }
}
