//! The job store's sealed fields: a request's two macaroons, its renewal grant (issue 23) and
//! its secret environment are sealed ([`htfaas_functions::seal`]) before the store keeps them,
//! and opened only to hand the job to its EP or to renew its macaroons. The slots: `input`,
//! `output`, `renewal`, `secret:<NAME>`, so no sealed value can be moved into another slot.
//!
//! This module knows nothing of SQL, jobs' states or the wire beyond the request.

use htfaas_functions::proto::SubmitRequest;
pub use htfaas_functions::seal::{PREFIX, SealError, Sealer, default_key_file};

/// Sealing and opening whole requests.
pub trait SealRequest {
    /// `r` with both macaroons and every secret value sealed (what the store keeps).
    fn seal_request(&self, r: &SubmitRequest) -> Result<SubmitRequest, SealError>;
    /// `r` as stored, opened (what dispatch attenuates and hands an EP).
    fn open_request(&self, r: SubmitRequest) -> Result<SubmitRequest, SealError>;
}

impl SealRequest for Sealer {
    fn seal_request(&self, r: &SubmitRequest) -> Result<SubmitRequest, SealError> {
        let mut r = r.clone();
        r.input.macaroon = self.seal("input", &r.input.macaroon)?;
        r.output.macaroon = self.seal("output", &r.output.macaroon)?;
        if let Some(grant) = &mut r.renewal {
            grant.0 = self.seal("renewal", &grant.0)?;
        }
        for (name, value) in r.secrets.0.iter_mut() {
            *value = self.seal(&format!("secret:{name}"), value)?;
        }
        Ok(r)
    }

    fn open_request(&self, mut r: SubmitRequest) -> Result<SubmitRequest, SealError> {
        r.input.macaroon = self.open("input", &r.input.macaroon)?;
        r.output.macaroon = self.open("output", &r.output.macaroon)?;
        if let Some(grant) = &mut r.renewal {
            grant.0 = self.open("renewal", &grant.0)?;
        }
        for (name, value) in r.secrets.0.iter_mut() {
            *value = self.open(&format!("secret:{name}"), value)?;
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::SecretEnv;

    /// A request's secrets are sealed with its macaroons, each bound to its name: the stored
    /// form holds no value, and a value moved under another name does not open.
    #[test]
    fn secrets_are_sealed_by_name_with_the_macaroons() {
        let sealer = Sealer::from_key(&[3u8; 32]);
        let mut r = crate::testing::request("k");
        r.secrets = SecretEnv(vec![("DB_PASSWORD".into(), "hunter2".into()), ("TOKEN".into(), "t0k".into())]);
        let sealed = sealer.seal_request(&r).expect("seal");
        let stored = serde_json::to_string(&sealed).expect("json");
        assert!(!stored.contains("hunter2") && !stored.contains("t0k"), "{stored}");
        assert!(sealed.secrets.0.iter().all(|(_, v)| v.starts_with(PREFIX)));
        assert_eq!(sealer.open_request(sealed.clone()).expect("open"), r);
        let mut swapped = sealed;
        swapped.secrets.0.swap(0, 1);
        let names: Vec<String> = r.secrets.0.iter().map(|(n, _)| n.clone()).collect();
        for (i, (name, _)) in swapped.secrets.0.iter_mut().enumerate() {
            *name = names[i].clone();
        }
        assert!(sealer.open_request(swapped).is_err(), "a value under another name does not open");
    }
}
