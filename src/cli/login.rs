//! `htfaas login` and `htfaas whoami`: a remote site as a profile (its gateway's URL, an API
//! token, or with `--oidc` where the site's OIDC token is read at each command; the CA that
//! signed the gateway's certificate), checked against the gateway before it is saved, and who a
//! credential acts as. Must not know: the local stack's layout.

use super::args::{DEFAULT_PROFILE, DirArg, client};
use anyhow::Context as _;
use htfaas::client::{Client, StackInfo, TokenSource};
use std::path::PathBuf;

/// The arguments of `htfaas login`.
#[derive(clap::Args)]
pub struct LoginArgs {
    /// The site's gateway, e.g. https://htfaas.example.org:8000.
    #[arg(long)]
    pub gateway: String,
    /// A file holding the API token (from the site's admin: `htfaas token api`); default: the
    /// `HTFAAS_API_TOKEN` environment variable.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The CA certificate(s), PEM, that signed the gateway's certificate, when not a system root.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Save as this profile.
    #[arg(long, default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// Accept a plain `http://` gateway: the API token then crosses the network in clear (for a
    /// gateway on this machine, or a network that is trusted end to end).
    #[arg(long)]
    pub insecure_http: bool,
    /// Sign in with the site's OIDC tokens instead of an API token: each command reads the
    /// current token from `--token-file` (a file a token agent keeps fresh), or else by the
    /// WLCG Bearer Token Discovery rules (BEARER_TOKEN, BEARER_TOKEN_FILE,
    /// $XDG_RUNTIME_DIR/bt_u<uid>, /tmp/bt_u<uid>). The profile keeps where, never the token.
    #[arg(long)]
    pub oidc: bool,
    /// With --oidc: get the token by the provider's device login (RFC 8628) instead: the CLI
    /// prints a URL and a code to confirm in any browser, then keeps the access token in a
    /// private file beside the profile (log in again when it expires).
    #[arg(long, requires_all = ["oidc", "issuer", "client_id"], conflicts_with = "token_file")]
    pub device: bool,
    /// With --device: the provider's issuer URL.
    #[arg(long)]
    pub issuer: Option<String>,
    /// With --device: this CLI's public client id at the provider.
    #[arg(long)]
    pub client_id: Option<String>,
    /// With --device: the scopes asked for.
    #[arg(long, default_value = "openid compute.create compute.read")]
    pub scope: String,
    /// With --device: the gateway's audience, sent as `resource` (RFC 8707).
    #[arg(long)]
    pub audience: Option<String>,
}

/// `htfaas login --gateway URL [--token-file F] [--ca-file F] [--profile NAME]`.
pub async fn login(args: LoginArgs) -> anyhow::Result<()> {
    check_gateway_url(&args.gateway, args.insecure_http)?;
    if args.oidc {
        return login_oidc(args).await;
    }
    let token = match &args.token_file {
        Some(file) => std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?,
        None => std::env::var(super::args::API_TOKEN_ENV)
            .context("give the API token with --token-file FILE or in HTFAAS_API_TOKEN")?,
    };
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "the API token is empty");
    let ca_file = args.ca_file.map(|f| std::path::absolute(&f).unwrap_or(f));
    let info = StackInfo::remote(&args.gateway, token, ca_file);
    // Checked before it is saved: a wrong URL, CA or token is an error now, not at the next command.
    let me = Client::new(info.clone())?.whoami().await.with_context(|| format!("log in to {}", args.gateway))?;
    let path = info.save_profile(&args.profile)?;
    logged_in(&info, &me, &args.profile, &path);
    Ok(())
}

/// What `login` says once the profile is saved (the OIDC identity too, for a token of the site's provider).
fn logged_in(info: &StackInfo, me: &htfaas_functions::proto::WhoAmI, profile: &str, path: &std::path::Path) {
    let how =
        me.identity.as_ref().map(|i| format!(" as {} of {} (rule {})", i.sub, i.issuer, i.rule)).unwrap_or_default();
    println!(
        "logged in to {} as {} ({}){how}; profile {profile} in {}",
        info.gateway_url,
        me.name,
        me.scope,
        path.display()
    );
}

/// `htfaas login --oidc`: a profile that reads the site's OIDC token at every command.
async fn login_oidc(args: LoginArgs) -> anyhow::Result<()> {
    let source = match (&args.token_file, args.device) {
        (_, true) => TokenSource::File(device_token(&args).await?),
        (Some(f), false) => TokenSource::File(std::path::absolute(f).unwrap_or_else(|_| f.clone())),
        (None, false) => TokenSource::Discovery,
    };
    let token = htfaas::client::current_token(&source)?;
    let ca_file = args.ca_file.map(|f| std::path::absolute(&f).unwrap_or(f));
    let mut info = StackInfo::remote(&args.gateway, &token, ca_file);
    // Checked before it is saved: the gateway must know the issuer and map the identity now.
    let me = Client::new(info.clone())?.whoami().await.with_context(|| format!("log in to {}", args.gateway))?;
    info.oidc_token = Some(source);
    // The profile keeps where the token is read, not the token.
    info.admin_token = String::new();
    let path = info.save_profile(&args.profile)?;
    logged_in(&info, &me, &args.profile, &path);
    Ok(())
}

/// `--device`: the provider's device login; the access token kept in a private file beside
/// the profile (`profiles/<name>.token`), which the profile then reads at every command.
async fn device_token(args: &LoginArgs) -> anyhow::Result<PathBuf> {
    let (Some(issuer), Some(client_id)) = (&args.issuer, &args.client_id) else {
        anyhow::bail!("--device needs --issuer and --client-id");
    };
    let login = htfaas::client::device::DeviceLogin {
        issuer,
        client_id,
        scope: &args.scope,
        audience: args.audience.as_deref(),
    };
    let http = htfaas_gateway::http_client_trusting(args.ca_file.as_deref(), "ca_file")?;
    let token = htfaas::client::device::device_login(&http, &login, |code| {
        match &code.verification_uri_complete {
            Some(uri) => eprintln!("to sign in, open {uri} (code {})", code.user_code),
            None => eprintln!("to sign in, open {} and enter the code {}", code.verification_uri, code.user_code),
        }
        eprintln!("waiting for the confirmation (up to {} s) …", code.expires_in);
    })
    .await?;
    let path = StackInfo::profile_path(&args.profile)?.with_extension("token");
    if let Some(dir) = path.parent() {
        htfaas_functions::store::create_private_dir(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    htfaas_functions::store::write_private(&path, token.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// A gateway URL `login` sends a token to: `https://`, or `http://` only when asked for with
/// `--insecure-http`.
fn check_gateway_url(url: &str, insecure_http: bool) -> anyhow::Result<()> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("https") => Ok(()),
        Some("http") if insecure_http => Ok(()),
        Some("http") => anyhow::bail!(
            "{url} is plain http: the API token would cross the network in clear; use the gateway's https URL, or \
             --insecure-http for a gateway on this machine"
        ),
        _ => anyhow::bail!("{url} is not an https:// URL"),
    }
}

/// `htfaas whoami`.
pub async fn whoami(dir: DirArg) -> anyhow::Result<()> {
    let client = client(&dir)?;
    let me = client.whoami().await?;
    let how = me
        .identity
        .as_ref()
        .map(|i| format!(", OIDC {} of {} by rule {}", i.sub, i.issuer, i.rule))
        .unwrap_or_default();
    println!("{} ({}) at {}{how}", me.name, me.scope, client.info().gateway_url);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn login_refuses_plain_http_unless_asked() {
        assert!(super::check_gateway_url("https://gw.example.org:8000", false).is_ok());
        let e = super::check_gateway_url("http://gw.example.org:8000", false).expect_err("plain http");
        assert!(e.to_string().contains("would cross the network in clear"), "{e}");
        assert!(super::check_gateway_url("HTTP://127.0.0.1:8000", true).is_ok());
        assert!(super::check_gateway_url("ftp://gw", true).is_err());
        assert!(super::check_gateway_url("gw.example.org", true).is_err());
    }
}
