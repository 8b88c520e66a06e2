//! `htfaas map test`: what the site's identity map makes of an identity, offline, before the
//! map goes live: the rule that matched and the owner, groups and grants, or why none; and
//! `htfaas map identities|unbind` (admin): the identities bound to owners, and freeing one.
//!
//! A rule's mapping program runs as the gateway would run it. `--token FILE` reads the token's
//! claims **without verifying it** (this command has no keys;
//! the gateway verifies every token before mapping it) and says so. Must not know: how the
//! client talks to the gateway.

use super::args::{DirArg, client};
use anyhow::Context as _;
use htfaas_functions::identity_map::{Identity, IdentityMap};
use std::path::PathBuf;

/// `htfaas map …`.
#[derive(clap::Subcommand)]
pub enum MapCommand {
    /// Which rule of a map file matches an identity, and the owner, groups and grants it
    /// gives (exits non-zero when the map does not load or the identity would be refused).
    Test(TestArgs),
    /// The identities bound to owners (admin): owner, issuer, sub, rule, groups, last seen.
    Identities {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Free an owner name for another identity (admin, audited); its map grants leave with it.
    Unbind {
        #[command(flatten)]
        dir: DirArg,
        /// The owner.
        owner: String,
    },
}

#[derive(clap::Args)]
pub struct TestArgs {
    /// The identity map file (JSON), as the gateway's `identity_map` names it.
    #[arg(long)]
    pub mapfile: PathBuf,
    /// The identity as token claims: `{"iss": …, "sub": …, "groups": […]}`.
    #[arg(long, conflicts_with = "token", required_unless_present = "token")]
    pub claims: Option<String>,
    /// A file holding a token (a JWT); its claims are read, not verified.
    #[arg(long)]
    pub token: Option<PathBuf>,
    /// Claims that hold groups, in order (as the issuer's `group_claims`).
    #[arg(long, value_delimiter = ',', default_value = "groups,wlcg.groups,eduperson_entitlement")]
    pub group_claims: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `htfaas map …`.
pub async fn run(command: MapCommand) -> anyhow::Result<()> {
    match command {
        MapCommand::Test(args) => test(args),
        MapCommand::Identities { dir, json } => {
            let all = client(&dir)?.identities().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!("{:<20} {:<24} {:<12} {:<16} ISSUER", "OWNER", "SUB", "RULE", "GROUPS");
                for b in &all {
                    println!("{:<20} {:<24} {:<12} {:<16} {}", b.owner, b.sub, b.rule, b.groups.join(","), b.issuer);
                }
            }
            Ok(())
        }
        MapCommand::Unbind { dir, owner } => {
            let b = client(&dir)?.unbind_identity(&owner).await?;
            println!("unbound {} from {} of {} (rule {})", b.owner, b.sub, b.issuer, b.rule);
            Ok(())
        }
    }
}

fn test(args: TestArgs) -> anyhow::Result<()> {
    let text = std::fs::read(&args.mapfile).with_context(|| format!("read {}", args.mapfile.display()))?;
    let map = IdentityMap::parse(&text).with_context(|| format!("{} does not load", args.mapfile.display()))?;
    let claims: serde_json::Value = match (&args.claims, &args.token) {
        (Some(json), _) => serde_json::from_str(json).context("--claims is not a JSON object")?,
        (None, Some(path)) => {
            let token = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
            eprintln!("note: the token's claims are read, not verified (the gateway verifies before it maps)");
            htfaas_gateway::oidc::unverified_claims(token.trim())?
        }
        (None, None) => anyhow::bail!("give --claims or --token"),
    };
    let identity = Identity::from_claims(&claims, &args.group_claims)?;
    let result = map.map(&identity);
    if args.json {
        let out = match &result {
            Ok(m) => serde_json::json!({ "identity": identity, "mapped": m }),
            Err(e) => serde_json::json!({ "identity": identity, "refused": e.to_string() }),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("identity: issuer {} sub {} groups {:?}", identity.issuer, identity.sub, identity.groups);
        match &result {
            Ok(m) => {
                println!("rule:     {}", m.rule);
                println!("owner:    {}", m.owner);
                println!("groups:   {}", if m.groups.is_empty() { "-".to_owned() } else { m.groups.join(", ") });
                for g in &m.grants {
                    println!("grant:    {} {} {}", g.principal, g.right, g.value);
                }
            }
            Err(e) => println!("refused:  {e}"),
        }
    }
    match result {
        Ok(_) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("the identity would be refused: {e}")),
    }
}
