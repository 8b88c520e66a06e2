//! What many commands share: `--dir` (the local stack's state directory) or `--profile` (a
//! remote site `htfaas login` saved), the client they lead to (with `HTFAAS_API_TOKEN` when
//! set), and the value parsers of durations, times and NATS headers. Must not know: any one
//! command, or how anything is printed.

use htfaas::client::{Client, StackInfo};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DirArg {
    /// State directory of the local stack.
    // Global: where a command has subcommands (`jobs hold`, `accounting set-factor`), it may
    // also be given after them.
    #[arg(long, env = "HTFAAS_DIR", default_value = ".htfaas", global = true)]
    pub dir: PathBuf,
    /// A remote site saved by `htfaas login` (its gateway's URL, an API token, its CA) instead of
    /// the local stack. Without it: the local stack when `--dir` holds one, else the profile
    /// `default` if there is one.
    #[arg(long, env = "HTFAAS_PROFILE", global = true)]
    pub profile: Option<String>,
}

/// The name of the profile `htfaas login` saves when none is given.
pub const DEFAULT_PROFILE: &str = "default";

/// The client of the local stack or the profile ([`DirArg`]): with the stack's admin token or
/// the profile's API token, or with the API token in `HTFAAS_API_TOKEN` (from `htfaas token
/// api`) when it is set.
pub fn client(dir: &DirArg) -> anyhow::Result<Client> {
    let info = match &dir.profile {
        Some(name) => StackInfo::load_profile(name)?,
        None if !StackInfo::path(&dir.dir).exists()
            && StackInfo::profile_path(DEFAULT_PROFILE).is_ok_and(|p| p.exists()) =>
        {
            StackInfo::load_profile(DEFAULT_PROFILE)?
        }
        None => StackInfo::load(&dir.dir)?,
    };
    let client = Client::new(info)?;
    Ok(match std::env::var(API_TOKEN_ENV) {
        Ok(token) if !token.trim().is_empty() => client.with_token(token.trim()),
        _ => client,
    })
}

/// The environment variable `htfaas` takes an API token from.
pub const API_TOKEN_ENV: &str = "HTFAAS_API_TOKEN";

/// `90`, `90s`, `30m`, `2h`, `7d` → seconds.
pub fn parse_duration_s(s: &str) -> Result<u64, String> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number.parse().map_err(|_| format!("{s:?}: want a number with s, m, h or d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h, d)")),
    };
    n.checked_mul(factor).filter(|&v| v > 0).ok_or_else(|| format!("{s:?}: out of range"))
}

/// Checks a time for `--since`/`--until` (the gateway resolves it): RFC 3339, Unix seconds or
/// `-<n><s|m|h|d>`.
pub fn parse_time_arg(s: &str) -> Result<String, String> {
    htfaas_gateway::replay::parse_time(s, htfaas_gateway::replay::now_ms())
        .map(|_| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

/// `NAME=VALUE` → a NATS header (`htfaas events publish --header`).
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_owned(), value.to_owned())),
        _ => Err(format!("{s:?}: want NAME=VALUE")),
    }
}
