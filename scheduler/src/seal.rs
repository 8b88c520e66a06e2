//! The job store's sealed fields: a request's two macaroons, its renewal grant and
//! its secret environment are sealed ([`htfaas_functions::seal`]) before the store keeps them,
//! and opened only to hand the job to its EP or to renew its macaroons. The slots name the job
//! and the field: `job:<id>/input`, `job:<id>/output`, `job:<id>/ref:<path>`, `job:<id>/renewal`,
//! `job:<id>/secret:<NAME>`, so no sealed value can be moved into another slot, nor into another
//! job (a writer of the store moving one job's secrets or macaroons to a job of its own gets a
//! job that does not open). A store of an older build sealed without the job
//! ([`SealRequest::open_request_unbound`]); its unfinished jobs are sealed again, bound, when
//! the store opens.
//!
//! This module knows nothing of SQL, jobs' states or the wire beyond the request.

use htfaas_functions::proto::SubmitRequest;
pub use htfaas_functions::seal::{PREFIX, SealError, Sealer, default_key_file};

/// Sealing and opening whole requests.
pub trait SealRequest {
    /// `r`, the request of job `job`, with both macaroons, its renewal grant and every secret
    /// value sealed for that job (what the store keeps).
    fn seal_request(&self, job: &str, r: &SubmitRequest) -> Result<SubmitRequest, SealError>;
    /// `r` as stored for job `job`, opened (what dispatch attenuates and hands an EP).
    fn open_request(&self, job: &str, r: SubmitRequest) -> Result<SubmitRequest, SealError>;
    /// `r` as an older build stored it, sealed without its job (or plain), opened.
    fn open_request_unbound(&self, r: SubmitRequest) -> Result<SubmitRequest, SealError>;
}

/// Applies `f` (seal or open) to every sealed field of `r`, each with its slot.
fn each_field(
    r: &mut SubmitRequest,
    slot: impl Fn(&str) -> String,
    f: impl Fn(&str, &str) -> Result<String, SealError>,
) -> Result<(), SealError> {
    if let Some(input) = &mut r.input {
        input.macaroon = f(&slot("input"), &input.macaroon)?;
    }
    r.output.macaroon = f(&slot("output"), &r.output.macaroon)?;
    for reference in &mut r.refs {
        reference.macaroon = f(&slot(&format!("ref:{}", reference.path)), &reference.macaroon)?;
    }
    if let Some(grant) = &mut r.renewal {
        grant.0 = f(&slot("renewal"), &grant.0)?;
    }
    for (name, value) in r.secrets.0.iter_mut() {
        *value = f(&slot(&format!("secret:{name}")), value)?;
    }
    Ok(())
}

impl SealRequest for Sealer {
    fn seal_request(&self, job: &str, r: &SubmitRequest) -> Result<SubmitRequest, SealError> {
        let mut r = r.clone();
        each_field(&mut r, |field| format!("job:{job}/{field}"), |slot, v| self.seal(slot, v))?;
        Ok(r)
    }

    fn open_request(&self, job: &str, mut r: SubmitRequest) -> Result<SubmitRequest, SealError> {
        each_field(&mut r, |field| format!("job:{job}/{field}"), |slot, v| self.open(slot, v))?;
        Ok(r)
    }

    fn open_request_unbound(&self, mut r: SubmitRequest) -> Result<SubmitRequest, SealError> {
        each_field(&mut r, str::to_owned, |slot, v| self.open(slot, v))?;
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
        let sealed = sealer.seal_request("job-1", &r).expect("seal");
        let stored = serde_json::to_string(&sealed).expect("json");
        assert!(!stored.contains("hunter2") && !stored.contains("t0k"), "{stored}");
        assert!(sealed.secrets.0.iter().all(|(_, v)| v.starts_with(PREFIX)));
        assert_eq!(sealer.open_request("job-1", sealed.clone()).expect("open"), r);
        // Moved to another job (a writer of the store copying a request to a job of its own),
        // nothing opens: not the secrets, not the macaroons.
        assert!(sealer.open_request("job-2", sealed.clone()).is_err(), "another job's request");
        let mut only_secrets = sealer.seal_request("job-2", &crate::testing::request("k")).expect("seal");
        only_secrets.secrets = sealed.secrets.clone();
        assert!(sealer.open_request("job-2", only_secrets).is_err(), "another job's secrets");
        let mut swapped = sealed;
        swapped.secrets.0.swap(0, 1);
        let names: Vec<String> = r.secrets.0.iter().map(|(n, _)| n.clone()).collect();
        for (i, (name, _)) in swapped.secrets.0.iter_mut().enumerate() {
            *name = names[i].clone();
        }
        assert!(sealer.open_request("job-1", swapped).is_err(), "a value under another name does not open");
    }
}
