//! `htfaas storage|scheduler|gateway|ep --config F`: one component from its JSON config, until
//! a signal. Must not know: the other commands, or the stack's layout on disk.

use super::signals::{on_ep_signals, on_signals};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))
}

/// `htfaas storage --config F`.
pub async fn storage(config: &Path) -> anyhow::Result<()> {
    let settings = read_config::<htfaas_storage::Config>(config)?.resolve().await?;
    htfaas_storage::run(settings, on_signals()).await
}

/// `htfaas scheduler --config F`.
pub async fn scheduler(config: &Path) -> anyhow::Result<()> {
    let settings = read_config::<htfaas_scheduler::Config>(config)?.resolve().await?;
    htfaas_scheduler::run(settings, on_signals()).await
}

/// `htfaas gateway --config F`.
pub async fn gateway(config: &Path) -> anyhow::Result<()> {
    let settings = read_config::<htfaas_gateway::Config>(config)?.resolve().await?;
    htfaas_gateway::run(settings, on_signals()).await
}

/// The environment variable `htfaas ep` takes its attach token from, over the config file's
/// `attach_token`: an annex's batch job passes the token so, in no file and no argument.
pub const ATTACH_TOKEN_ENV: &str = "HTFAAS_ATTACH_TOKEN";

/// `htfaas ep --config F`: run an execution point.
pub async fn ep(
    config: Option<PathBuf>,
    lifetime: Option<u64>,
    idle_shutdown: Option<u64>,
    annex: Option<String>,
    drain_timeout: u64,
) -> anyhow::Result<()> {
    let config = config.context("--config is required to run an EP")?;
    let mut config = read_config::<htfaas_ep::Config>(&config)?;
    config.annex = annex.or(config.annex);
    config.lifetime_s = lifetime.or(config.lifetime_s);
    config.idle_shutdown_s = idle_shutdown.or(config.idle_shutdown_s);
    if let Ok(token) = std::env::var(ATTACH_TOKEN_ENV)
        && !token.trim().is_empty()
    {
        config.attach_token = token.trim().to_owned();
    }
    let mut settings = config.resolve().await?;
    settings.drain_timeout = Duration::from_secs(drain_timeout);
    let (drain, stop) = on_ep_signals();
    htfaas_ep::run_with(settings, drain, stop).await
}
