//! Unit tests of [`super`]: caveat parsing and checking, issuing, durations and instants.

use super::*;
use base64::engine::general_purpose::STANDARD;

fn key() -> RootKey {
    RootKey::derive(b"unit-test-secret-unit-test-secret")
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn issue_for(path: &str, caveats: &[&str], validity: &str) -> Issued {
    let req = IssueRequest {
        url_path: Some(path.into()),
        caveats: caveats.iter().map(|c| (*c).to_owned()).collect(),
        validity: parse_duration(validity),
        writer: None,
    };
    issue(&key(), "htfaas-storage", &req, now()).expect("issues")
}

fn check(token: &str, path: &str, acts: &[Activity]) -> Result<Grant, VerifyError> {
    verify(token, &key(), &Access { path, activities: acts, now: now(), client: None })
}

#[test]
fn mint_then_verify_ok() {
    let m = issue_for("/data/raw/x", &["activity:DOWNLOAD"], "PT2H");
    let g = check(&m.token, "/data/raw/x", &[Activity::Download]).expect("verifies");
    assert_eq!(g.identifier, m.identifier);
    assert_eq!(g.restrictions.path, "/data/raw/x");
    let caveats = inspect(&m.token).expect("parses");
    assert!(caveats[0].starts_with("iid:"), "{caveats:?}");
    assert!(caveats[1].starts_with("before:"), "{caveats:?}");
    assert_eq!(&caveats[2..], ["path:/data/raw/x", "activity:DOWNLOAD"]);
}

#[test]
fn output_is_unpadded_v1() {
    // Try several lengths so that some would need padding.
    for extra in ["", "a", "ab", "abc"] {
        let m = issue_for(&format!("/data/{extra}x"), &["activity:DOWNLOAD"], "PT1H");
        assert!(!m.token.contains('='), "{}", m.token);
        let raw = URL_SAFE_NO_PAD.decode(&m.token).expect("base64url without padding");
        // V1 starts with a 4-hex-digit packet length, then "location ".
        assert!(raw[..4].iter().all(u8::is_ascii_hexdigit));
        assert_eq!(&raw[4..13], b"location ");
    }
}

#[test]
fn padded_and_standard_alphabet_are_accepted() {
    let m = issue_for("/data/f", &["activity:DOWNLOAD"], "PT1H");
    let raw = URL_SAFE_NO_PAD.decode(&m.token).expect("decodes");
    let std_padded = STANDARD.encode(&raw);
    check(&std_padded, "/data/f", &[Activity::Download]).expect("standard, padded");
    let url_padded = base64::engine::general_purpose::URL_SAFE.encode(&raw);
    check(&url_padded, "/data/f", &[Activity::Download]).expect("url-safe, padded");
}

#[test]
fn forged_with_other_secret_is_invalid() {
    let other = RootKey::derive(b"some-other-secret");
    let forged = mint(&other, "htfaas-storage", "abc", &["activity:DOWNLOAD".into()]);
    let e = check(&forged, "/data/f", &[Activity::Download]).expect_err("forged");
    assert!(matches!(e, VerifyError::Invalid(ref m) if m.contains("signature")), "{e}");
}

#[test]
fn tampered_signature_byte_is_invalid() {
    let m = issue_for("/data/f", &["activity:DOWNLOAD"], "PT1H");
    let mut raw = URL_SAFE_NO_PAD.decode(&m.token).expect("decodes");
    let n = raw.len();
    raw[n - 2] ^= 0x01; // last signature byte (before the trailing '\n')
    let tampered = URL_SAFE_NO_PAD.encode(&raw);
    let e = check(&tampered, "/data/f", &[Activity::Download]).expect_err("tampered");
    assert!(matches!(e, VerifyError::Invalid(_)), "{e}");
}

#[test]
fn tampered_caveat_is_invalid() {
    // Swapping the caveat text without the key must break the chain.
    let m = issue_for("/data/f", &["activity:DOWNLOAD"], "PT1H");
    let raw = URL_SAFE_NO_PAD.decode(&m.token).expect("decodes");
    let s = raw.windows(8).position(|w| w == b"DOWNLOAD").expect("caveat present");
    let mut raw2 = raw.clone();
    raw2[s..s + 8].copy_from_slice(b"DOWNLOAE");
    let e = check(&URL_SAFE_NO_PAD.encode(&raw2), "/data/f", &[Activity::Download]).expect_err("tampered");
    assert!(matches!(e, VerifyError::Invalid(_)), "{e}");
}

#[test]
fn expired_is_denied() {
    let past = now() - time::Duration::hours(1);
    let token = mint(&key(), "l", "id1", &[format!("before:{}", format_instant(past)), "activity:DOWNLOAD".into()]);
    let e = check(&token, "/data/f", &[Activity::Download]).expect_err("expired");
    assert!(matches!(e, VerifyError::Denied(ref m) if m.contains("expired")), "{e}");
}

/// The scheduler computes `before:` by its clock, this storage checks it by its
/// own. A request up to [`CLOCK_SKEW`] past the instant still passes; past the bound it is
/// denied, and the answer says which instant, which clock reading and which bound.
#[test]
fn before_allows_the_bounded_clock_skew_and_no_more() {
    let before = OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("instant");
    let token = mint(&key(), "l", "id1", &[format!("before:{}", format_instant(before)), "activity:DOWNLOAD".into()]);
    let at = |offset_ms: i64| {
        let now = before + time::Duration::milliseconds(offset_ms);
        verify(&token, &key(), &Access { path: "/f", activities: &[Activity::Download], now, client: None })
    };
    let skew_ms = CLOCK_SKEW.whole_milliseconds() as i64;
    assert_eq!(skew_ms, 5_000, "the tokens' bound");
    for ok in [-60_000, -1, 0, 1, skew_ms / 2, skew_ms - 1] {
        at(ok).unwrap_or_else(|e| panic!("{ok} ms after before: refused: {e}"));
    }
    for late in [skew_ms, skew_ms + 1, 60_000] {
        let e = at(late).expect_err("past the skew");
        assert!(matches!(e, VerifyError::Denied(_)), "{late}: {e}");
    }
    assert_eq!(
        at(skew_ms + 2_000).expect_err("late").to_string(),
        "macaroon does not allow this request: expired at 2027-01-15T08:00:00Z (this storage's clock \
             reads 2027-01-15T08:00:07Z, past the 5 s allowed clock skew)"
    );
}

#[test]
fn every_before_must_hold() {
    let later = now() + time::Duration::hours(1);
    let past = now() - time::Duration::seconds(60);
    let token = mint(&key(), "l", "id1", &[format!("before:{}", format_instant(later))]);
    check(&token, "/x", &[Activity::Download]).expect("in the future");
    let held = attenuate(&token, &[&format!("before:{}", format_instant(past))]).expect("attenuates");
    assert!(matches!(check(&held, "/x", &[Activity::Download]), Err(VerifyError::Denied(_))));
}

#[test]
fn wrong_activity_is_denied() {
    let m = issue_for("/data/f", &["activity:DOWNLOAD"], "PT1H");
    let e = check(&m.token, "/data/f", &[Activity::Upload]).expect_err("upload not allowed");
    assert!(matches!(e, VerifyError::Denied(ref m) if m.contains("UPLOAD")), "{e}");
}

#[test]
fn path_outside_is_denied_segment_aware() {
    let m = issue_for("/data/raw/x", &["activity:DOWNLOAD"], "PT1H");
    for outside in ["/data/raw/xy", "/data/raw", "/etc/passwd", "/data/raw/y"] {
        let e = check(&m.token, outside, &[Activity::Download]).expect_err(outside);
        assert!(matches!(e, VerifyError::Denied(_)), "{outside}: {e}");
    }
    check(&m.token, "/data/raw/x/inner", &[Activity::Download]).expect("below is within");
}

#[test]
fn holder_widening_activity_invalidates() {
    let m = issue_for("/data", &["activity:DOWNLOAD"], "PT1H");
    let widened = attenuate(&m.token, &["activity:DOWNLOAD,UPLOAD"]).expect("attenuates");
    let e = check(&widened, "/data/f", &[Activity::Download]).expect_err("widened");
    assert!(matches!(e, VerifyError::Invalid(ref m) if m.contains("enlarge")), "{e}");
}

#[test]
fn holder_attenuation_narrows() {
    let m = issue_for("/data", &["activity:DOWNLOAD,UPLOAD,DELETE"], "PT1H");
    check(&m.token, "/data/raw/f", &[Activity::Upload]).expect("before attenuation");
    let narrowed = attenuate(&m.token, &["activity:DOWNLOAD", "path:/raw", "max-upload:10"]).expect("attenuates");
    let g = check(&narrowed, "/data/raw/f", &[Activity::Download]).expect("narrowed still reads");
    assert_eq!(g.restrictions.path, "/data/raw");
    assert_eq!(g.restrictions.max_upload, Some(10));
    assert!(matches!(check(&narrowed, "/data/raw/f", &[Activity::Upload]), Err(VerifyError::Denied(_))));
    assert!(matches!(check(&narrowed, "/data/other", &[Activity::Download]), Err(VerifyError::Denied(_))));
}

#[test]
fn unknown_and_third_party_caveats_are_invalid() {
    let m = issue_for("/data", &[], "PT1H");
    let root = attenuate(&m.token, &["root:/data"]).expect("attenuates");
    assert!(matches!(check(&root, "/data/f", &[Activity::Download]), Err(VerifyError::Invalid(_))));
    let junk = attenuate(&m.token, &["no colon here"]).expect("attenuates");
    assert!(matches!(check(&junk, "/data/f", &[Activity::Download]), Err(VerifyError::Invalid(_))));
    // Third-party caveats are refused by the codec (`htfaas_functions::macaroon` tests).
}

#[test]
fn ip_caveats_are_or_within_and_and_across() {
    let m = issue_for("/data", &["ip:10.0.0.0/8,127.0.0.1"], "PT1H");
    let at = |token: &str, client: &str| {
        let access = Access {
            path: "/data/f",
            activities: &[Activity::Download],
            now: now(),
            client: Some(client.parse().expect("address")),
        };
        verify(token, &key(), &access)
    };
    at(&m.token, "127.0.0.1").expect("listed address");
    at(&m.token, "10.20.30.40").expect("inside the listed network");
    assert!(matches!(at(&m.token, "127.0.0.2"), Err(VerifyError::Denied(_))));
    // A holder narrows with a second caveat: both must hold.
    let narrowed = attenuate(&m.token, &["ip:10.1.0.0/16"]).expect("attenuates");
    at(&narrowed, "10.1.2.3").expect("in both");
    assert!(matches!(at(&narrowed, "127.0.0.1"), Err(VerifyError::Denied(_))), "only in the first");
    assert!(matches!(at(&narrowed, "10.2.0.1"), Err(VerifyError::Denied(_))), "only in the first");
    // IPv6, and malformed lists invalidate the macaroon.
    let v6 = attenuate(&m.token, &["ip:::1,2001:db8::/32"]).expect("attenuates");
    assert!(matches!(at(&v6, "127.0.0.1"), Err(VerifyError::Denied(_))), "no v4 in the second caveat");
    let v6only = issue_for("/data", &["ip:2001:db8::/32"], "PT1H");
    at(&v6only.token, "2001:db8:1::9").expect("inside the v6 network");
    for bad in ["ip:", "ip:10.0.0.0/33", "ip:not-an-address", "ip:10.0.0.1,"] {
        let t = attenuate(&m.token, &[bad]).expect("attenuates");
        assert!(matches!(at(&t, "10.0.0.1"), Err(VerifyError::Invalid(_))), "{bad}");
    }
}

#[test]
fn garbage_is_invalid_not_a_panic() {
    for t in ["", "!!!", "MDAx", "e30", "{\"v\":2}", "AAAAAAAAAAAA"] {
        assert!(matches!(check(t, "/x", &[Activity::Download]), Err(VerifyError::Invalid(_))), "{t}");
    }
}

#[test]
fn max_upload_min_wins_and_iid_rules() {
    let r = Restrictions::from_caveats(["iid:x", "id:1;1;a", "max-upload:100", "max-upload:50", "max-upload:70"])
        .expect("valid");
    assert_eq!(r.max_upload, Some(50));
    assert!(Restrictions::from_caveats(["activity:DOWNLOAD", "iid:x"]).is_err());
    assert!(Restrictions::from_caveats(["id:1", "id:2"]).is_err());
    assert!(Restrictions::from_caveats(["max-upload:0"]).is_err());
    assert!(Restrictions::from_caveats(["activity:DOWNLOAD,FLY"]).is_err());
}

/// The writer is the issuer's `id:` right after `iid:`: a request names it, and a holder who
/// appends an `id:` of its own (to pass for a function's runs) gets no writer, or an invalid
/// macaroon when one is there already.
#[test]
fn only_the_issuer_names_a_macaroons_writer() {
    let req = |writer: Option<&str>| IssueRequest {
        url_path: Some("/data/out/".into()),
        caveats: vec!["activity:UPLOAD".into()],
        validity: parse_duration("PT1H"),
        writer: writer.map(str::to_owned),
    };
    let issued = issue(&key(), "l", &req(Some("run:alice/checksum")), now()).expect("issues");
    assert_eq!(issued.restrictions.writer.as_deref(), Some("run:alice/checksum"));
    let grant = check(&issued.token, "/data/out/x", &[Activity::Upload]).expect("verifies");
    assert_eq!(grant.restrictions.writer.as_deref(), Some("run:alice/checksum"));
    let forged = htfaas_functions::macaroon::attenuate(&issued.token, &["id:run:mallory/spy"]).expect("append");
    assert!(matches!(check(&forged, "/data/out/x", &[Activity::Upload]), Err(VerifyError::Invalid(_))));

    let plain = issue(&key(), "l", &req(None), now()).expect("issues");
    assert_eq!(plain.restrictions.writer, None);
    let posing = htfaas_functions::macaroon::attenuate(&plain.token, &["id:run:alice/checksum"]).expect("append");
    let grant = check(&posing, "/data/out/x", &[Activity::Upload]).expect("an informational id");
    assert_eq!(grant.restrictions.writer, None, "an appended id: is no writer");
    for bad in ["", "a\nb"] {
        assert!(matches!(issue(&key(), "l", &req(Some(bad)), now()), Err(IssueError::Writer(_))), "{bad:?}");
    }
}

#[test]
fn issue_rules() {
    let k = key();
    let t0 = now();
    let mk = |caveats: &[&str], validity: Option<&str>| IssueRequest {
        url_path: Some("/data".into()),
        caveats: caveats.iter().map(|c| (*c).to_owned()).collect(),
        validity: validity.and_then(parse_duration),
        writer: None,
    };
    assert!(issue(&k, "l", &mk(&["ip:1.2.3.4"], None), t0).is_ok(), "dCache accepts ip: in a request");
    assert!(matches!(issue(&k, "l", &mk(&["ip:1.2.3.400"], None), t0), Err(IssueError::BadCaveat(_))));
    assert!(matches!(issue(&k, "l", &mk(&["root:/x"], None), t0), Err(IssueError::Unsupported(_))));
    assert!(matches!(issue(&k, "l", &mk(&["activity:NOPE"], None), t0), Err(IssueError::BadCaveat(_))));
    assert!(matches!(
        issue(&k, "l", &mk(&["activity:DOWNLOAD", "activity:UPLOAD"], None), t0),
        Err(IssueError::BadCaveat(_))
    ));
    assert!(matches!(issue(&k, "l", &mk(&["path:/../x"], None), t0), Err(IssueError::BadCaveat(_))));
    assert!(matches!(issue(&k, "l", &mk(&["before:2000-01-01T00:00:00Z"], None), t0), Err(IssueError::Expired)));
    // Validity is capped at 7 days.
    let long = issue(&k, "l", &mk(&[], Some("P30D")), t0).expect("issues");
    let b = long.restrictions.before.expect("has before");
    assert!(b <= t0 + MAX_VALIDITY && b > t0 + MAX_VALIDITY - time::Duration::seconds(2));
    // An earlier body before: wins over the validity.
    let soon = t0 + time::Duration::minutes(5);
    let m = issue(&k, "l", &mk(&[&format!("before:{}", format_instant(soon))], Some("PT2H")), t0).expect("issues");
    assert_eq!(m.restrictions.before.map(format_instant), Some(format_instant(soon)));
    // Body path chains relative to the URL path.
    let m = issue(&k, "l", &mk(&["path:/raw"], None), t0).expect("issues");
    assert_eq!(m.restrictions.path, "/data/raw");
    // Root URL path adds no path caveat.
    let root = IssueRequest { url_path: Some("/".into()), ..IssueRequest::default() };
    let m = issue(&k, "l", &root, t0).expect("issues");
    assert!(!inspect(&m.token).expect("parses").iter().any(|c| c.starts_with("path:")));
}

#[test]
fn durations() {
    let d = |s| parse_duration(s).map(|d: time::Duration| d.whole_seconds());
    assert_eq!(d("PT2H"), Some(7200));
    assert_eq!(d("PT1H30M5S"), Some(5405));
    assert_eq!(d("P1DT12H"), Some(129_600));
    assert_eq!(d("P2D"), Some(172_800));
    assert_eq!(d("P1W"), Some(604_800));
    assert_eq!(d("PT0.5S").map(|_| ()), Some(()));
    for bad in
        ["", "P", "PT", "2H", "PT2X", "PTH", "PT1M2H", "PT1H1H", "P1Y", "P1M", "-PT1H", "PT-1H", "PT1.5H", "garbage"]
    {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

/// dcache.md §3.5: the same macaroon minted with the raw key is byte-identical
/// to the reference (jmacaroons/libmacaroons, no padding), signature included.
#[test]
fn dcache_test_vector() {
    let raw_key: [u8; 32] = *b"test-only-raw-root-key-32-bytes!";
    let expected = "MDAyOWxvY2F0aW9uIE9wdGlvbmFsWy9kYXRhL2luL3J1bjQyLmg1XQowMDE4aWRlbnRpZmllciBBYkNkRWZHaAowMDE1Y2lkIGlpZDpabTl2WW1GeQowMDFiY2lkIGlkOjEwMDA7MTAwMDthbGljZQowMDI0Y2lkIGJlZm9yZToyMDMwLTAxLTAxVDAwOjAwOjAwWgowMDFmY2lkIHBhdGg6L2RhdGEvaW4vcnVuNDIuaDUKMDAxZmNpZCBhY3Rpdml0eTpET1dOTE9BRCxMSVNUCjAwMWFjaWQgYWN0aXZpdHk6RE9XTkxPQUQKMDAyNGNpZCBiZWZvcmU6MjAyOS0wNi0wMVQxMjowMDowMFoKMDAxOGNpZCBpcDoxOTIuMC4yLjAvMjQKMDAyZnNpZ25hdHVyZSA4q0ffn-MupxrT_jAghBKTFbyGOla2BEvZfiY5MhVIcAo";
    // mint() (the crate, padding stripped) reproduces the reference byte for byte, signature
    // `38ab47df…4870` included.
    let caveats: Vec<String> = inspect(expected).expect("parses");
    assert_eq!(mint(&RootKey::raw(raw_key), "Optional[/data/in/run42.h5]", "AbCdEfGh", &caveats), expected);
    // And our verifier accepts it from the subnet its `ip:` caveat names, and only there.
    let at = |client: Option<&str>| {
        let client = client.map(|c| c.parse().expect("address"));
        let access = Access {
            path: "/data/in/run42.h5",
            activities: &[Activity::Download],
            now: OffsetDateTime::UNIX_EPOCH,
            client,
        };
        verify(expected, &RootKey::raw(raw_key), &access)
    };
    at(Some("192.0.2.7")).expect("inside 192.0.2.0/24");
    at(Some("::ffff:192.0.2.200")).expect("IPv4-mapped IPv6 is the same client");
    for outside in [Some("127.0.0.1"), Some("192.0.3.1"), Some("2001:db8::1"), None] {
        let e = at(outside).expect_err("outside the ip: caveat");
        assert!(matches!(e, VerifyError::Denied(ref m) if m.contains("ip:")), "{outside:?}: {e}");
    }
    let e = verify(
        expected,
        &RootKey::raw(*b"test-only-raw-root-key-32-bytes?"),
        &Access {
            path: "/data/in/run42.h5",
            activities: &[Activity::Download],
            now: OffsetDateTime::UNIX_EPOCH,
            client: None,
        },
    )
    .expect_err("wrong key");
    assert!(matches!(e, VerifyError::Invalid(ref m) if m.contains("signature")), "{e}");
}

fn python() -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/python");
    let ok =
        std::process::Command::new(&p).args(["-c", "import pymacaroons"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(p);
    }
    assert!(std::env::var_os("CI").is_none(), "pymacaroons missing at {} and CI is set", p.display());
    eprintln!(
        "NOTICE: skipping pymacaroons interop test: {} cannot import pymacaroons (run scripts/install-deps.sh)",
        p.display()
    );
    None
}

const PY: &str = r#"
import sys
from pymacaroons import Macaroon, Verifier
token, secret_hex, mode = sys.argv[1], sys.argv[2], sys.argv[3]
secret = bytes.fromhex(secret_hex)
m = Macaroon.deserialize(token)
if mode == "verify":
    v = Verifier()
    v.satisfy_general(lambda c: True)
    try:
        ok = v.verify(m, secret)
    except Exception as e:
        ok = False
    print("ok" if ok else "bad")
else:
    for c in sys.argv[4:]:
        m.add_first_party_caveat(c)
    print(m.serialize())
"#;

fn py(python: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(python).arg("-c").arg(PY).args(args).output().expect("python runs");
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8").trim().to_owned()
}

/// pymacaroons (libmacaroons key derivation) verifies what we mint, and what it attenuates
/// we verify or refuse by our rules.
#[test]
fn pymacaroons_interop() {
    let Some(python) = python() else { return };
    let secret = [0x42u8; 32];
    let secret_hex = hex::encode(secret);
    let k = RootKey::derive(&secret);
    let req = IssueRequest {
        url_path: Some("/data".into()),
        caveats: vec!["activity:DOWNLOAD,UPLOAD".into()],
        validity: parse_duration("PT1H"),
        writer: None,
    };
    let m = issue(&k, "htfaas-storage", &req, now()).expect("issues");
    // (a) pymacaroons verifies our token with the secret, and not with another one.
    assert_eq!(py(&python, &[&m.token, &secret_hex, "verify"]), "ok");
    assert_eq!(py(&python, &[&m.token, &hex::encode([0x43u8; 32]), "verify"]), "bad");
    // (b) attenuated in Python: narrowed path and activity.
    let narrowed = py(&python, &[&m.token, &secret_hex, "attenuate", "activity:DOWNLOAD", "path:/raw"]);
    let ctx = |path, acts| verify(&narrowed, &k, &Access { path, activities: acts, now: now(), client: None });
    ctx("/data/raw/f", &[Activity::Download]).expect("narrowed token reads inside");
    assert!(matches!(ctx("/data/raw/f", &[Activity::Upload]), Err(VerifyError::Denied(_))));
    assert!(matches!(ctx("/data/rawx", &[Activity::Download]), Err(VerifyError::Denied(_))));
    // Widened in Python: invalid.
    let widened = py(&python, &[&m.token, &secret_hex, "attenuate", "activity:DOWNLOAD,UPLOAD,DELETE"]);
    let e =
        verify(&widened, &k, &Access { path: "/data/f", activities: &[Activity::Download], now: now(), client: None })
            .expect_err("widened");
    assert!(matches!(e, VerifyError::Invalid(_)), "{e}");
    // An attenuated token still verifies in Python (signature chain intact).
    assert_eq!(py(&python, &[&narrowed, &secret_hex, "verify"]), "ok");
}
