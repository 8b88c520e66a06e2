//! The OAuth 2.0 device authorization grant (RFC 8628) against the site's OIDC provider, for
//! `htfaas login --oidc --device`: the CLI asks the provider for a user code, the user confirms
//! it in any browser, and the CLI polls the token endpoint until the provider answers with an
//! access token (for the gateway's audience, RFC 8707 `resource`) or refuses.
//!
//! Bounded: the provider's `expires_in` (at most [`MAX_WAIT`]); `slow_down` adds 5 s to the
//! interval, as the RFC says. Must not know: profiles, the gateway.

use anyhow::{Context as _, bail};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// The longest a device login waits for the user, whatever the provider says.
pub const MAX_WAIT: Duration = Duration::from_secs(15 * 60);
/// The RFC's default polling interval.
const DEFAULT_INTERVAL_S: u64 = 5;
/// The device code grant's type.
const GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// A POST of `pairs` as a form to `url`.
fn post_form(http: &reqwest::Client, url: &str, pairs: &[(&str, &str)]) -> reqwest::RequestBuilder {
    let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    http.post(url).header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded").body(body)
}

/// What the user is asked to do.
#[derive(Debug, Clone, Deserialize)]
pub struct DeviceCode {
    /// The code to poll with (a secret of this CLI).
    device_code: String,
    /// The code the user confirms.
    pub user_code: String,
    /// Where the user goes.
    pub verification_uri: String,
    /// The same with the code filled in, when the provider gives it.
    #[serde(default)]
    pub verification_uri_complete: Option<String>,
    /// Seconds the code is valid.
    pub expires_in: u64,
    /// Seconds between polls.
    #[serde(default)]
    pub interval: Option<u64>,
}

/// What a device login asks for.
#[derive(Debug, Clone)]
pub struct DeviceLogin<'a> {
    /// The provider's issuer URL (its discovery document names the endpoints).
    pub issuer: &'a str,
    /// The CLI's public client id at the provider.
    pub client_id: &'a str,
    /// Scopes asked for (e.g. `openid compute.create storage.read:/data`).
    pub scope: &'a str,
    /// The gateway's audience (`resource`), when the provider needs it to issue a JWT for it.
    pub audience: Option<&'a str>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    device_authorization_endpoint: Option<String>,
    token_endpoint: String,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// Runs the grant: `show` tells the user where to confirm; the access token once they did.
pub async fn device_login(
    http: &reqwest::Client,
    login: &DeviceLogin<'_>,
    show: impl FnOnce(&DeviceCode),
) -> anyhow::Result<String> {
    let issuer = login.issuer.trim_end_matches('/');
    let discovery: Discovery = http
        .get(format!("{issuer}/.well-known/openid-configuration"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("{issuer}: the discovery document"))?
        .json()
        .await
        .context("the discovery document is not JSON")?;
    anyhow::ensure!(
        discovery.issuer.trim_end_matches('/') == issuer,
        "the discovery document names issuer {:?}, not {issuer:?}",
        discovery.issuer
    );
    let endpoint = discovery.device_authorization_endpoint.context("the provider offers no device login")?;
    let mut form = vec![("client_id", login.client_id), ("scope", login.scope)];
    if let Some(aud) = login.audience {
        form.push(("resource", aud));
    }
    let code: DeviceCode = post_form(http, &endpoint, &form)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("{endpoint}: the device authorization request"))?
        .json()
        .await
        .context("the device authorization answer is not JSON")?;
    show(&code);
    let deadline = Instant::now() + Duration::from_secs(code.expires_in).min(MAX_WAIT);
    let mut interval = Duration::from_secs(code.interval.unwrap_or(DEFAULT_INTERVAL_S).max(1));
    let mut poll =
        vec![("grant_type", GRANT), ("device_code", code.device_code.as_str()), ("client_id", login.client_id)];
    if let Some(aud) = login.audience {
        poll.push(("resource", aud));
    }
    loop {
        tokio::time::sleep(interval).await;
        if Instant::now() >= deadline {
            bail!("the device login was not confirmed within {} s", code.expires_in);
        }
        let answer: TokenAnswer = post_form(http, &discovery.token_endpoint, &poll)
            .send()
            .await
            .with_context(|| format!("{}: polling for the token", discovery.token_endpoint))?
            .json()
            .await
            .context("the token endpoint's answer is not JSON")?;
        match (answer.access_token, answer.error.as_deref()) {
            (Some(token), _) => return Ok(token),
            (None, Some("authorization_pending")) => {}
            (None, Some("slow_down")) => interval += Duration::from_secs(5),
            (None, error) => bail!(
                "the provider refused the device login: {} {}",
                error.unwrap_or("(no error)"),
                answer.error_description.unwrap_or_default()
            ),
        }
    }
}
