//! Per-operation cost of dCache macaroons (`htfaas_storage::macaroons`): issuing one with the
//! gateway's read caveats, verifying it for a GET of that file (the storage's hot path, once per
//! request), refusals (wrong path; wrong root key), a holder's attenuation, and a job's write
//! macaroon verified for an output's PUT with and without the issuer's writer caveat (what naming
//! the writer costs each upload).
//!
//! `cargo bench -p htfaas-storage [--bench macaroons] [-- FILTER]` prints one JSON line per
//! figure: `{"bench":..,"unit":"us","p50":..,"p90":..,"p99":..,"n":..,"batch":..}`, the
//! per-operation time in microseconds over `n` samples, each sample the mean of `batch`
//! consecutive calls (`batch` is 1 unless one call is shorter than a few microseconds). Without
//! `--bench` (as `cargo test --benches` runs it) each case runs once as a smoke test and nothing
//! is timed. No criterion on purpose: it would double the build on a 2-core box.

#[path = "../../functions/benches/support/harness.rs"]
mod harness;

use harness::Harness;
use std::hint::black_box;

use htfaas_storage::macaroons::{
    Access, Activity, IssueRequest, RootKey, VerifyError, attenuate, format_instant, inspect, issue, parse_duration,
    verify,
};
use time::OffsetDateTime;

/// The input file of a triggered job.
const FILE: &str = "/data/in/run42.h5";

/// A GET of `path` as `auth::authorize` checks it: the clock is read per request.
fn get(token: &str, key: &RootKey, path: &str) -> Result<(), VerifyError> {
    let access = Access { path, activities: &[Activity::Download], now: OffsetDateTime::now_utc(), client: None };
    verify(token, key, &access).map(|_| ())
}

fn main() {
    let h = Harness::from_args();

    // As `Config::resolve`: a 32-byte secret, libmacaroons key derivation.
    let key = RootKey::derive(&[0x5a; 32]);
    // As the gateway's `StorageClient::read_macaroon`: POST / with these caveats and validity.
    let req = IssueRequest {
        url_path: Some("/".into()),
        caveats: vec!["activity:DOWNLOAD".into(), format!("path:{FILE}")],
        validity: parse_duration("PT2H"),
        writer: None,
    };
    let issued = issue(&key, "htfaas-storage", &req, OffsetDateTime::now_utc()).expect("issues");
    let token = issued.token;
    // A holder (e.g. the EP) narrows it further: a shorter expiry.
    let soon = format!("before:{}", format_instant(OffsetDateTime::now_utc() + time::Duration::minutes(10)));
    let holder_caveats = [soon.as_str()];
    let wrong_key = RootKey::derive(&[0xa5; 32]);

    get(&token, &key, FILE).expect("reads its file");
    assert!(matches!(get(&token, &key, "/data/in/run43.h5"), Err(VerifyError::Denied(_))));
    assert!(matches!(get(&token, &wrong_key, FILE), Err(VerifyError::Invalid(_))));
    let narrowed = attenuate(&token, &holder_caveats).expect("attenuates");
    get(&narrowed, &key, FILE).expect("narrowed still reads");
    eprintln!("macaroon: {} bytes, caveats {:?}", token.len(), inspect(&token).expect("parses"));

    h.run("macaroon.issue", || {
        issue(&key, "htfaas-storage", black_box(&req), OffsetDateTime::now_utc()).expect("issues")
    });
    h.run("macaroon.verify", || get(black_box(&token), &key, FILE).expect("verifies"));
    h.run("macaroon.verify_wrong_path", || {
        get(black_box(&token), &key, "/data/in/run43.h5").expect_err("outside its path")
    });
    h.run("macaroon.verify_wrong_key", || get(black_box(&token), &wrong_key, FILE).expect_err("forged"));
    h.run("macaroon.attenuate", || attenuate(black_box(&token), &holder_caveats).expect("attenuates"));
    // A job's write macaroon (`StorageClient::write_macaroon`), verified for one output's PUT.
    let write = |writer: Option<&str>| {
        let req = IssueRequest {
            url_path: Some("/".into()),
            caveats: vec!["activity:UPLOAD".into(), "path:/data/out/".into()],
            validity: parse_duration("PT4H"),
            writer: writer.map(str::to_owned),
        };
        issue(&key, "htfaas-storage", &req, OffsetDateTime::now_utc()).expect("issues").token
    };
    let put = |token: &str| {
        let now = OffsetDateTime::now_utc();
        let access = Access { path: "/data/out/run42.h5.sums", activities: &[Activity::Upload], now, client: None };
        verify(token, &key, &access).expect("verifies")
    };
    let (plain, named) = (write(None), write(Some("run:alice/checksum")));
    assert_eq!(put(&named).restrictions.writer.as_deref(), Some("run:alice/checksum"));
    h.run("macaroon.verify_upload", || put(black_box(&plain)));
    h.run("macaroon.verify_upload_writer", || put(black_box(&named)));
    h.run("macaroon.attenuate_verify", || {
        let narrowed = attenuate(black_box(&token), &holder_caveats).expect("attenuates");
        get(&narrowed, &key, FILE).expect("verifies")
    });
}
