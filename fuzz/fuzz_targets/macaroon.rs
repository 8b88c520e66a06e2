//! Fuzz target: the macaroon codec, `htfaas_functions::macaroon` (our layer over the
//! unmaintained `macaroon` 0.3 crate: base64 in any alphabet, V1/V2/V2JSON parsing, the HMAC
//! chain check, attenuation), and the storage's checker on top of it
//! (`htfaas_storage::macaroons`: dCache's caveat grammar). The input is the token text.
//!
//! Checked beyond "no panic": whatever `authenticate` accepts, `inspect` and `identifier`
//! agree with; an attenuated token still authenticates, with exactly the caveats appended;
//! a token is never accepted under another key.
//!
//! The codec runs the crate's parser under `catch_unwind` (the crate is known to panic on
//! some inputs), but libFuzzer's panic hook aborts on *any* panic, caught or not. By default
//! this target replaces that hook with one that lets a panic *inside the crate* unwind to the
//! codec's `catch_unwind` (and prints where it happened, once per location); a panic anywhere
//! else, or one that escapes, still aborts. Set `HTFAAS_FUZZ_STRICT_MACAROON=1` to abort on
//! the crate's panics too (to collect them as findings).
#![no_main]

use htfaas_functions::macaroon::{RootKey, attenuate, authenticate, identifier, inspect};
use htfaas_storage::macaroons::{Access, Activity, Restrictions, verify};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex, Once};

/// The key the seed corpus's tokens are minted with (`RootKey::derive(KEY_SECRET)`).
pub const KEY_SECRET: &[u8] = b"htfaas-fuzz-macaroon-key";

static KEY: LazyLock<RootKey> = LazyLock::new(|| RootKey::derive(KEY_SECRET));
static OTHER: LazyLock<RootKey> = LazyLock::new(|| RootKey::derive(b"another key"));

fn tolerate_crate_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        if std::env::var_os("HTFAAS_FUZZ_STRICT_MACAROON").is_some() {
            return;
        }
        let seen: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            if at.contains("/macaroon-0.3") {
                if seen.lock().map(|mut s| s.insert(at.clone())).unwrap_or(false) {
                    eprintln!("macaroon crate panicked (caught by the codec) at {at}: {info}");
                }
                return;
            }
            eprintln!("{info}");
            std::process::abort();
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    tolerate_crate_panics();
    let Ok(token) = std::str::from_utf8(data) else { return };
    let inspected = inspect(token);
    let id = identifier(token);
    assert_eq!(inspected.is_ok(), id.is_ok(), "inspect and identifier parse alike");
    if let Ok(a) = authenticate(token, &KEY) {
        assert_eq!(inspected.as_ref().ok(), Some(&a.caveats), "inspect shows what authenticate checked");
        assert_eq!(id.as_ref().ok(), Some(&a.identifier));
        assert!(authenticate(token, &OTHER).is_err(), "accepted under two keys");
        let more = attenuate(token, &["activity:DOWNLOAD", "before:2100-01-01T00:00:00Z"]).expect("attenuates");
        let b = authenticate(&more, &KEY).expect("an attenuated token authenticates");
        assert_eq!(b.identifier, a.identifier);
        assert_eq!(b.caveats[..a.caveats.len()], a.caveats[..]);
        assert_eq!(&b.caveats[a.caveats.len()..], ["activity:DOWNLOAD", "before:2100-01-01T00:00:00Z"]);
        // The storage's view: the caveats fold, and a grant never exceeds them.
        let now = time::OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000);
        let access = Access { path: "/data/raw/run42.h5", activities: &[Activity::Download], now, client: None };
        if let Ok(grant) = verify(token, &KEY, &access) {
            let r = Restrictions::from_caveats(a.caveats.iter().map(String::as_str)).expect("verified caveats fold");
            assert_eq!(grant.restrictions, r);
            assert!(r.allows(Activity::Download));
        }
    } else if let Ok(caveats) = &inspected {
        // Unauthenticated caveat text still goes through the storage's grammar.
        let _ = Restrictions::from_caveats(caveats.iter().map(String::as_str));
    }
});
