//! Function secrets at the gateway: values sealed under the gateway's secret key
//! ([`htfaas_functions::seal`], slot `secret:<function>:<name>`) before the registry keeps them,
//! and opened only to put them into a job's request ([`Secrets::for_job`]), which travels to the
//! scheduler over its (TLS) link and is sealed again in its store. No value is ever logged,
//! audited or answered: the API shows names.
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

impl Secrets {
    /// Secrets sealed with `sealer`.
    pub fn new(sealer: Sealer) -> Secrets {
        Secrets { sealer }
    }

    /// Replaces every secret of `function` with `values`, sealed; returns their names.
    pub fn set(
        &self,
        registry: &Registry,
        function: &str,
        values: &BTreeMap<String, String>,
    ) -> Result<Vec<String>, SecretError> {
        if values.len() > MAX_SECRETS {
            return Err(SecretError::Invalid(format!("at most {MAX_SECRETS} per function")));
        }
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
            sealed.push((name.clone(), self.sealer.seal(&slot(function, name), value)?));
        }
        registry.set_secrets(function, &sealed)?;
        Ok(values.keys().cloned().collect())
    }

    /// The value of `function`'s secret `name`, for the gateway's own use (a failure
    /// webhook's key, issue 23): never a run's. `None` when it has no value.
    pub fn open_one(&self, registry: &Registry, function: &str, name: &str) -> Result<Option<String>, SecretError> {
        let stored = registry.sealed_secrets(function)?;
        let Some((_, sealed)) = stored.iter().find(|(k, _)| k == name) else { return Ok(None) };
        Ok(Some(self.sealer.open(&slot(function, name), sealed)?))
    }

    /// The secret environment of a run of `m`: each name its manifest lists, opened. A name
    /// without a value is [`SecretError::Missing`] (the firing waits and is tried again).
    pub fn for_job(&self, registry: &Registry, m: &FunctionManifest) -> Result<SecretEnv, SecretError> {
        if m.secrets.is_empty() {
            return Ok(SecretEnv::default());
        }
        let stored: BTreeMap<String, String> = registry.sealed_secrets(&m.name)?.into_iter().collect();
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

    #[test]
    fn secrets_are_sealed_per_function_and_opened_only_for_the_names_a_manifest_lists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::open(dir.path()).expect("registry");
        let secrets = Secrets::new(Sealer::from_key(&[9u8; 32]));
        let values = BTreeMap::from([("DB_PASSWORD".to_owned(), "hunter2".to_owned())]);
        assert_eq!(secrets.set(&registry, "f", &values).expect("set"), ["DB_PASSWORD"]);
        let stored = registry.sealed_secrets("f").expect("stored");
        assert!(stored.iter().all(|(_, v)| !v.contains("hunter2")), "{stored:?}");

        let mut m = crate::testing::function("f", None, None).manifest;
        assert!(secrets.for_job(&registry, &m).expect("none listed").is_empty());
        m.secrets = vec!["DB_PASSWORD".into()];
        assert_eq!(secrets.for_job(&registry, &m).expect("opened").0, [("DB_PASSWORD".into(), "hunter2".into())]);
        m.secrets.push("API_KEY".into());
        assert!(matches!(secrets.for_job(&registry, &m), Err(SecretError::Missing { .. })));

        // Moved to another function's rows, a value does not open.
        registry.set_secrets("g", &stored).expect("copied");
        let mut g = m.clone();
        (g.name, g.secrets) = ("g".into(), vec!["DB_PASSWORD".into()]);
        assert!(matches!(secrets.for_job(&registry, &g), Err(SecretError::Seal(_))));

        for bad in [("A=B", "v"), ("", "v"), ("A", "nul\0")] {
            let values = BTreeMap::from([(bad.0.to_owned(), bad.1.to_owned())]);
            assert!(matches!(secrets.set(&registry, "f", &values), Err(SecretError::Invalid(_))), "{bad:?}");
        }
    }
}
