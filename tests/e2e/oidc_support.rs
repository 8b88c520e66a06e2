//! The real OpenID provider of the identity tests (`tests/oidc/idp.mjs` on `oidc-provider`,
//! which scripts/install-deps.sh installs into `.tools/oidc`), started on loopback and killed
//! when dropped; and its tokens, fetched as its clients do (client_credentials).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The audience the provider's access tokens name.
pub const AUDIENCE: &str = "https://htfaas.example";

/// A running provider.
pub struct Provider {
    child: Child,
    /// Its issuer (`http://127.0.0.1:<port>`).
    pub issuer: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Provider {
    /// Starts the provider; panics naming the install step when node or the package is missing.
    pub fn start() -> Provider {
        let module = std::env::var_os("HTFAAS_OIDC_PROVIDER")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join(".tools/oidc/node_modules/oidc-provider"));
        assert!(
            module.join("lib/index.js").is_file(),
            "oidc-provider is not installed at {} (scripts/install-deps.sh installs it; or set HTFAAS_OIDC_PROVIDER)",
            module.display()
        );
        let mut child = Command::new("node")
            .arg(root().join("tests/oidc/idp.mjs"))
            .env("OIDC_PROVIDER_MODULE", &module)
            .env("AUDIENCE", AUDIENCE)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start node (scripts/install-deps.sh installs it)");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut issuer = None;
        for line in lines.by_ref() {
            let line = line.expect("the provider's output");
            if let Some(rest) = line.strip_prefix("listening ") {
                issuer = Some(rest.trim().to_owned());
                break;
            }
        }
        let issuer = issuer.expect("the provider printed its issuer");
        // The rest of its output is read and dropped: a closed pipe would end it at its next line.
        std::thread::spawn(move || lines.for_each(drop));
        Provider { child, issuer }
    }

    /// An access token of `client` (its secret is `<client>-secret`) with `scope`.
    pub async fn token(&self, client: &str, scope: &str) -> String {
        let resp = htfaas_gateway::http_client()
            .expect("client")
            .post(format!("{}/token", self.issuer))
            .basic_auth(client, Some(format!("{client}-secret")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&scope={}",
                scope.replace(' ', "+").replace(':', "%3A").replace('/', "%2F")
            ))
            .send()
            .await
            .expect("the token request");
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.expect("a JSON answer");
        assert!(status.is_success(), "token for {client}: {status} {body}");
        body["access_token"].as_str().expect("access_token").to_owned()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
