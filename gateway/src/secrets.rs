//! Function secrets at the gateway: values sealed under the gateway's secret key
//! ([`htfaas_functions::seal`]) before the registry keeps them, and opened only to put them into
//! a job's request ([`Secrets::for_job`]), which travels to the scheduler over its (TLS) link and
//! is sealed again in its store. No value is ever logged, audited or answered: the API shows
//! names.
//!
//! Two kinds, decided when a value is set: a run secret (slot `secret:<function>:<name>`), and a
//! failure webhook's signing key (slot `webhook-key:<function>:<name>`, for a name some version
//! of the function signs its webhook with), which only the gateway's webhook delivery opens
//! ([`Secrets::webhook_key`]): no run can be handed it, whatever a later manifest lists.
//! Secrets are their function's owner's: a manifest of another owner opens none.
//!
//! Must not know: HTTP, NATS, jobs beyond the request's secret environment.

use htfaas_functions::manifest::is_env_name;
use htfaas_functions::proto::SecretEnv;
use htfaas_functions::seal::{SealError, Sealer};
use htfaas_functions::{FunctionManifest, Registry, RegistryError};
use std::collections::BTreeMap;

/// Most secrets per function.
pub const MAX_SECRETS: usize = 64;
/// Largest secret value, bytes.
pub const MAX_SECRET_BYTES: usize = 4096;

/// Why secrets could not be set or opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A name or value the guest's environment cannot take, or too many.
    #[error("secrets: {0}")]
    Invalid(String),
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Sealing or opening failed (another key, an altered value).
    #[error(transparent)]
    Seal(#[from] SealError),
    /// The manifest's owner is not the owner of the function's name.
    #[error("function {function} belongs to another owner than {owner}: its secrets are not {owner}'s")]
    NotOwner {
        /// The function.
        function: String,
        /// The manifest's owner.
        owner: String,
    },
    /// A secret the manifest names has no value yet.
    #[error("secret {name} of function {function} has no value yet (htfaas fn secrets set)")]
    Missing {
        /// The function.
        function: String,
        /// The secret's name.
        name: String,
    },
}

/// The gateway's sealer for function secrets.
#[derive(Debug)]
pub struct Secrets {
    sealer: Sealer,
}

fn slot(function: &str, name: &str) -> String {
    format!("secret:{function}:{name}")
}

fn key_slot(function: &str, name: &str) -> String {
    format!("webhook-key:{function}:{name}")
}

impl Secrets {
    /// Secrets sealed with `sealer`.
    pub fn new(sealer: Sealer) -> Secrets {
        Secrets { sealer }
    }

    /// Replaces every secret of `owner`'s `function` with `values`, sealed (a name one of its
    /// versions signs webhooks with as a webhook key, the others as run secrets); returns their
    /// names.
    pub fn set(
        &self,
        registry: &Registry,
        owner: &str,
        function: &str,
        values: &BTreeMap<String, String>,
    ) -> Result<Vec<String>, SecretError> {
        if values.len() > MAX_SECRETS {
            return Err(SecretError::Invalid(format!("at most {MAX_SECRETS} per function")));
        }
        let keys = registry.webhook_key_names(function)?;
        let mut sealed = Vec::with_capacity(values.len());
        for (name, value) in values {
            if !is_env_name(name) {
                return Err(SecretError::Invalid(format!("{name:?} cannot name an environment variable")));
            }
            if value.len() > MAX_SECRET_BYTES || value.contains('\0') {
                return Err(SecretError::Invalid(format!(
                    "the value of {name} must be at most {MAX_SECRET_BYTES} bytes without NUL"
                )));
            }
            let slot = if keys.contains(name) { key_slot(function, name) } else { slot(function, name) };
            sealed.push((name.clone(), self.sealer.seal(&slot, value)?));
        }
        registry.set_secrets(owner, function, &sealed)?;
        Ok(values.keys().cloned().collect())
    }

    /// The signing key `name` of `owner`'s `function`'s failure webhook, for the gateway's own
    /// use: never a run's. `None` when it has no value. A value set as a run secret (before a
    /// version named it as its webhook's key) does not open: set the secrets again.
    pub fn webhook_key(
        &self,
        registry: &Registry,
        owner: &str,
        function: &str,
        name: &str,
    ) -> Result<Option<String>, SecretError> {
        let stored = registry.sealed_secrets(owner, function)?;
        let Some((_, sealed)) = stored.iter().find(|(k, _)| k == name) else { return Ok(None) };
        Ok(Some(self.sealer.open(&key_slot(function, name), sealed)?))
    }

    /// The secret environment of a run of `m`, as its owner's: each name its manifest lists,
    /// opened as a run secret. A name without a value is [`SecretError::Missing`] (the firing
    /// waits and is tried again); a manifest whose owner is not the name's is refused.
    pub fn for_job(&self, registry: &Registry, m: &FunctionManifest) -> Result<SecretEnv, SecretError> {
        if m.secrets.is_empty() {
            return Ok(SecretEnv::default());
        }
        if registry.owner_of(&m.name)?.as_deref() != Some(m.owner.as_str()) {
            return Err(SecretError::NotOwner { function: m.name.clone(), owner: m.owner.clone() });
        }
        let stored: BTreeMap<String, String> = registry.sealed_secrets(&m.owner, &m.name)?.into_iter().collect();
        let mut env = Vec::with_capacity(m.secrets.len());
        for name in &m.secrets {
            let sealed = stored
                .get(name)
                .ok_or_else(|| SecretError::Missing { function: m.name.clone(), name: name.clone() })?;
            env.push((name.clone(), self.sealer.open(&slot(&m.name, name), sealed)?));
        }
        Ok(SecretEnv(env))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::manifest::Webhook;

    /// Registers `name` of alice (so the name is hers) and returns its manifest.
    fn registered(registry: &Registry, name: &str, webhook: Option<&str>) -> FunctionManifest {
        let module = registry.put_module(b"\0asm\x01\0\0\0").expect("module");
        let mut m = crate::testing::function(name, None, None).manifest;
        m.module = module;
        m.webhook = webhook.map(|k| Webhook { url: "https://hooks.example.org/h".into(), key_secret: k.into() });
        registry.register(m.clone()).expect("register");
        m
    }

    #[test]
    fn secrets_are_sealed_per_function_and_opened_only_for_the_names_a_manifest_lists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::open(dir.path()).expect("registry");
        let secrets = Secrets::new(Sealer::from_key(&[9u8; 32]));
        let mut m = registered(&registry, "f", None);
        let values = BTreeMap::from([("DB_PASSWORD".to_owned(), "hunter2".to_owned())]);
        assert_eq!(secrets.set(&registry, "alice", "f", &values).expect("set"), ["DB_PASSWORD"]);
        let stored = registry.sealed_secrets("alice", "f").expect("stored");
        assert!(stored.iter().all(|(_, v)| !v.contains("hunter2")), "{stored:?}");

        assert!(secrets.for_job(&registry, &m).expect("none listed").is_empty());
        m.secrets = vec!["DB_PASSWORD".into()];
        assert_eq!(secrets.for_job(&registry, &m).expect("opened").0, [("DB_PASSWORD".into(), "hunter2".into())]);
        // A manifest of another owner naming alice's function opens none of her secrets.
        let foreign = FunctionManifest { owner: "mallory".into(), ..m.clone() };
        assert!(matches!(secrets.for_job(&registry, &foreign), Err(SecretError::NotOwner { .. })));
        assert!(matches!(
            secrets.set(&registry, "mallory", "f", &values),
            Err(SecretError::Registry(RegistryError::NotOwner(..)))
        ));
        m.secrets.push("API_KEY".into());
        assert!(matches!(secrets.for_job(&registry, &m), Err(SecretError::Missing { .. })));

        // Moved to another function's rows, a value does not open.
        registered(&registry, "g", None);
        registry.set_secrets("alice", "g", &stored).expect("copied");
        let mut g = m.clone();
        (g.name, g.secrets) = ("g".into(), vec!["DB_PASSWORD".into()]);
        assert!(matches!(secrets.for_job(&registry, &g), Err(SecretError::Seal(_))));

        for bad in [("A=B", "v"), ("", "v"), ("A", "nul\0")] {
            let values = BTreeMap::from([(bad.0.to_owned(), bad.1.to_owned())]);
            assert!(matches!(secrets.set(&registry, "alice", "f", &values), Err(SecretError::Invalid(_))), "{bad:?}");
        }
    }

    /// A webhook's key is sealed where no run opens it: a run listing its name (as a manifest
    /// stored behind the registry's back would) gets a refusal, never the value; the webhook
    /// delivery opens it, and does not open a run secret as a key.
    #[test]
    fn a_webhook_key_opens_for_the_delivery_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::open(dir.path()).expect("registry");
        let secrets = Secrets::new(Sealer::from_key(&[9u8; 32]));
        let m = registered(&registry, "f", Some("HOOK"));
        let values = BTreeMap::from([("HOOK".to_owned(), "k3y".to_owned()), ("DB".to_owned(), "pw".to_owned())]);
        secrets.set(&registry, "alice", "f", &values).expect("set");
        assert_eq!(secrets.webhook_key(&registry, "alice", "f", "HOOK").expect("key").as_deref(), Some("k3y"));
        assert!(secrets.webhook_key(&registry, "alice", "f", "DB").is_err(), "a run secret is no key");
        assert!(secrets.webhook_key(&registry, "mallory", "f", "HOOK").expect("none").is_none());
        let leaking = FunctionManifest { secrets: vec!["HOOK".into()], webhook: None, ..m };
        assert!(matches!(secrets.for_job(&registry, &leaking), Err(SecretError::Seal(_))));
    }
}
