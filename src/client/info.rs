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
    /// gateway obtains ([`super::Client::put_file`]).
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
    /// A profile of the site's OIDC tokens (`htfaas login --oidc`): where each command reads
    /// the current token (they expire in minutes; a token agent keeps the file fresh), instead
    /// of a token kept in the profile. Unset: the token is `admin_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc_token: Option<TokenSource>,
}

/// Where a profile's OIDC token is read, at every command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// This file.
    File(PathBuf),
    /// The WLCG Bearer Token Discovery rules ([`discover_bearer_token`]).
    Discovery,
}

/// The WLCG Bearer Token Discovery rules, in order: `BEARER_TOKEN`, the file
/// `BEARER_TOKEN_FILE`, `$XDG_RUNTIME_DIR/bt_u<uid>`, `/tmp/bt_u<uid>`; the token and where
/// it was found. `env` looks a variable up; `read` reads a file.
pub fn discover_bearer_token(
    env: impl Fn(&str) -> Option<String>,
    read: impl Fn(&Path) -> Option<String>,
    uid: u32,
) -> Option<(String, String)> {
    let clean = |t: String| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
    if let Some(t) = env("BEARER_TOKEN").and_then(clean) {
        return Some((t, "BEARER_TOKEN".into()));
    }
    let mut files = Vec::new();
    if let Some(f) = env("BEARER_TOKEN_FILE").filter(|f| !f.is_empty()) {
        files.push(PathBuf::from(f));
    }
    if let Some(d) = env("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        files.push(Path::new(&d).join(format!("bt_u{uid}")));
    }
    files.push(PathBuf::from(format!("/tmp/bt_u{uid}")));
    files.into_iter().find_map(|f| read(&f).and_then(clean).map(|t| (t, f.display().to_string())))
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
            oidc_token: None,
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
        let mut info: StackInfo = serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))?;
        info.admin_token = match &info.oidc_token {
            None => info.admin_token,
            Some(source) => current_token(source)?,
        };
        Ok(info)
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

/// The OIDC token `source` holds now.
pub fn current_token(source: &TokenSource) -> anyhow::Result<String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    match source {
        TokenSource::File(f) => {
            let t = std::fs::read_to_string(f).with_context(|| format!("read the OIDC token in {}", f.display()))?;
            let t = t.trim().to_owned();
            anyhow::ensure!(!t.is_empty(), "{} holds no token", f.display());
            Ok(t)
        }
        TokenSource::Discovery => {
            use std::os::unix::fs::MetadataExt as _;
            let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).context("this process's uid")?;
            let found = discover_bearer_token(|k| std::env::var(k).ok(), read, uid);
            found.map(|(t, _)| t).context(
                "no OIDC token found (BEARER_TOKEN, BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u<uid>, /tmp/bt_u<uid>): get one \
                 from the site's token agent (oidc-agent, htgettoken)",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_discovered_in_the_wlcg_order() {
        let files = |present: &'static [&'static str]| {
            move |p: &Path| present.iter().find(|f| Path::new(f) == p).map(|f| format!("token-of-{f}\n"))
        };
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        let all: &[(&str, &str)] =
            &[("BEARER_TOKEN", " tok "), ("BEARER_TOKEN_FILE", "/f"), ("XDG_RUNTIME_DIR", "/run/user/7")];
        let got = discover_bearer_token(env(all), files(&["/f", "/run/user/7/bt_u7", "/tmp/bt_u7"]), 7);
        assert_eq!(got, Some(("tok".into(), "BEARER_TOKEN".into())));
        let no_var: &[(&str, &str)] =
            &[("BEARER_TOKEN", "  "), ("BEARER_TOKEN_FILE", "/f"), ("XDG_RUNTIME_DIR", "/run/user/7")];
        let got = discover_bearer_token(env(no_var), files(&["/f", "/run/user/7/bt_u7"]), 7);
        assert_eq!(got, Some(("token-of-/f".into(), "/f".into())));
        let got = discover_bearer_token(env(no_var), files(&["/run/user/7/bt_u7", "/tmp/bt_u7"]), 7);
        assert_eq!(got.map(|(_, w)| w), Some("/run/user/7/bt_u7".into()));
        let got = discover_bearer_token(env(&[]), files(&["/tmp/bt_u7", "/tmp/bt_u8"]), 8);
        assert_eq!(got.map(|(_, w)| w), Some("/tmp/bt_u8".into()));
        assert_eq!(discover_bearer_token(env(&[]), files(&[]), 7), None);
    }
}
