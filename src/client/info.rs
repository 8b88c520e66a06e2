//! Where a stack listens and how to authenticate to it ([`StackInfo`]): the local stack's
//! `stack.json` (`htfaas up`), or a remote site's profile (`htfaas login`: the gateway's URL, an
//! API token, its CA), each a file readable by its owner only.
//!
//! Must not know: HTTP, what the client sends.

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where a running stack listens and how to authenticate to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackInfo {
    /// Gateway API.
    pub gateway_url: String,
    /// Scheduler (EPs attach here). Empty in a remote profile ([`StackInfo::remote`]).
    #[serde(default)]
    pub scheduler_url: String,
    /// Built-in storage. Empty in a remote profile: files then go through credentials the
    /// gateway obtains ([`Client::put_file`]).
    #[serde(default)]
    pub storage_url: String,
    /// NATS. Empty in a remote profile.
    #[serde(default)]
    pub nats_url: String,
    /// The site operator's NATS credential, an nkey user seed (a secret): it may publish on
    /// every events subject and read the events stream (`crate::nats::Role::Operator`).
    /// `None`: connect without one (a server without authorization).
    #[serde(default)]
    pub nats_nkey_seed: Option<String>,
    /// The gateway API's credential: the stack's admin token, or an API token (a profile's).
    pub admin_token: String,
    /// Storage user for `put`/`get`; empty in a remote profile.
    #[serde(default)]
    pub user: String,
    /// That user's secret; empty in a remote profile.
    #[serde(default)]
    pub user_secret: String,
    /// Extra CA certificate(s), PEM, trusted for the gateway's, scheduler's and storage's TLS
    /// besides the system's: a site's own CA. `None`: the system's roots only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl StackInfo {
    /// A remote site as `htfaas login` saves it: the gateway's URL, an API token, the CA to
    /// trust; nothing else (files go through the gateway's credentials).
    pub fn remote(gateway_url: &str, token: &str, ca_file: Option<PathBuf>) -> StackInfo {
        StackInfo {
            gateway_url: gateway_url.trim_end_matches('/').to_owned(),
            scheduler_url: String::new(),
            storage_url: String::new(),
            nats_url: String::new(),
            nats_nkey_seed: None,
            admin_token: token.to_owned(),
            user: String::new(),
            user_secret: String::new(),
            ca_file,
        }
    }

    /// Where profile `name` is kept: `$HTFAAS_CONFIG_DIR`, else `$XDG_CONFIG_HOME/htfaas`, else
    /// `~/.config/htfaas`; then `profiles/<name>.json`.
    pub fn profile_path(name: &str) -> anyhow::Result<PathBuf> {
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            || name.starts_with('.')
        {
            bail!("{name:?} is not a profile name (letters, digits, '-', '_', '.')");
        }
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = env("HTFAAS_CONFIG_DIR")
            .or_else(|| env("XDG_CONFIG_HOME").map(|d| d.join("htfaas")))
            .or_else(|| env("HOME").map(|h| h.join(".config/htfaas")))
            .context("no HOME to keep profiles in (set HTFAAS_CONFIG_DIR)")?;
        Ok(dir.join("profiles").join(format!("{name}.json")))
    }

    /// Saves it as profile `name`, readable by its owner only (it holds a token).
    pub fn save_profile(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = Self::profile_path(name)?;
        if let Some(dir) = path.parent() {
            htfaas_functions::store::create_private_dir(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        htfaas_functions::store::write_private(&path, &serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("write {}", path.display()))?;
        Ok(path)
    }

    /// Profile `name`, as `htfaas login` saved it.
    pub fn load_profile(name: &str) -> anyhow::Result<StackInfo> {
        let path = Self::profile_path(name)?;
        let text = std::fs::read(&path)
            .with_context(|| format!("read {} (log in first: htfaas login --gateway URL)", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Whether it is a remote profile (no storage password: files go through the gateway).
    pub fn is_remote(&self) -> bool {
        self.user_secret.is_empty()
    }

    /// `<dir>/stack.json`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("stack.json")
    }

    /// Reads the stack description written by `htfaas up`.
    pub fn load(dir: &Path) -> anyhow::Result<StackInfo> {
        let path = Self::path(dir);
        let text = std::fs::read(&path)
            .with_context(|| format!("read {} (is `htfaas up --dir {}` running?)", path.display(), dir.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Writes it, readable by the owner only.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let path = Self::path(dir);
        htfaas_functions::store::write_private(&path, &serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("write {}", path.display()))
    }
}
