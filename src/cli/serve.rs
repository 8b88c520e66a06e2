//! `htfaas storage|scheduler|gateway|ep --config F`: one component from its JSON config, until
//! a signal. Must not know: the other commands, or the stack's layout on disk.
//!
//! A config's secret may stand in a file of its own: wherever a string goes, `{"secret_file":
//! "PATH"}` is replaced by that file's contents (trailing newline dropped) before the config is
//! read, so that a site's config files can be kept and shared without its secrets
//! (`examples/site/`). The file must not be readable by others than its owner and group.

use super::signals::{on_ep_signals, on_signals};
use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let mut value: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))?;
    read_secret_files(&mut value, "").with_context(|| format!("read the secrets of {}", path.display()))?;
    serde_json::from_value(value).with_context(|| format!("parse {}", path.display()))
}

/// Replaces each `{"secret_file": "PATH"}` in `value` (at `at`, for errors) with the file's
/// contents. A relative path is taken from the working directory, as every path of a config.
fn read_secret_files(value: &mut serde_json::Value, at: &str) -> anyhow::Result<()> {
    use serde_json::Value;
    match value {
        Value::Object(map) if map.len() == 1 && map.contains_key("secret_file") => {
            let Some(Value::String(file)) = map.get("secret_file") else {
                bail!("{at}: secret_file must be a path");
            };
            *value = Value::String(read_secret(Path::new(file)).with_context(|| format!("{at}: secret_file"))?);
        }
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                read_secret_files(v, &format!("{at}.{key}"))?;
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                read_secret_files(v, &format!("{at}[{i}]"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// One secret file's contents, without trailing whitespace; refused when empty, not UTF-8, or
/// readable by others.
fn read_secret(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path).with_context(|| format!("read {}", path.display()))?.permissions().mode();
    if mode & 0o007 != 0 {
        bail!("{} is readable by others (mode {:o}): chmod o-rwx it", path.display(), mode & 0o777);
    }
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not UTF-8", path.display()))?;
    let secret = text.trim_end();
    if secret.is_empty() {
        bail!("{} is empty", path.display());
    }
    Ok(secret.to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn secret(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }

    #[test]
    fn secret_files_are_read_in_place_of_their_reference_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = secret(dir.path(), "token", "s3cret\n", 0o600);
        let mut v = serde_json::json!({
            "admin_token": {"secret_file": token},
            "list": [{"secret_file": token}, {"secret_file": token, "other": 1}],
            "plain": "x",
        });
        read_secret_files(&mut v, "").expect("read");
        assert_eq!(v["admin_token"], "s3cret");
        assert_eq!(v["list"][0], "s3cret");
        // An object with more than the one key is left alone (no field of a config is such).
        assert_eq!(v["list"][1]["other"], 1);
        assert_eq!(v["plain"], "x");

        let err = |v: serde_json::Value| format!("{:#}", read_secret_files(&mut v.clone(), "").expect_err("refused"));
        let open = secret(dir.path(), "open", "s3cret", 0o644);
        assert!(err(serde_json::json!({"t": {"secret_file": open}})).contains("readable by others"));
        let empty = secret(dir.path(), "empty", "\n", 0o600);
        assert!(err(serde_json::json!({"t": {"secret_file": empty}})).contains("is empty"));
        let e = err(serde_json::json!({"t": {"secret_file": dir.path().join("missing")}}));
        assert!(e.contains(".t: secret_file") && e.contains("missing"), "{e}");
        assert!(err(serde_json::json!({"t": {"secret_file": 7}})).contains("must be a path"));
    }
}
