//! Percent-encoding, in one place, on the `percent-encoding` crate: a storage path or one path
//! segment in a URL (RFC 3986's unreserved characters kept, upper-case `%XX` for every other
//! byte of the UTF-8), the NATS subject tokens htfaas derives from directories and names, the
//! strict decoding a server applies to a request's path, and the lenient one for what another
//! server wrote.
//!
//! Must not know: URLs' other parts, subjects' layout, what a path means.

use percent_encoding::{AsciiSet, CONTROLS, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What a path keeps: the unreserved characters and `/`.
const PATH: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');
/// What one path segment keeps: the unreserved characters.
const SEGMENT: &AsciiSet = &PATH.add(b'/');
/// What a subject token derived from a directory keeps: every visible ASCII character but the
/// subject's own `.`, `*`, `>`, and `%` itself.
const DIRECTORY_TOKEN: &AsciiSet = &CONTROLS.add(b' ').add(b'.').add(b'*').add(b'>').add(b'%');
/// What a subject token derived from a name keeps: letters, digits, `-` and `_`.
const NAME_TOKEN: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// `path` for a URL's path: `/` and the unreserved characters stay, e.g.
/// `/data/raw/a b#?.dat` → `/data/raw/a%20b%23%3F.dat`.
pub fn path(path: &str) -> String {
    utf8_percent_encode(path, PATH).to_string()
}

/// `name` as one URL path segment: only the unreserved characters stay (a `/` is `%2F`).
pub fn segment(name: &str) -> String {
    utf8_percent_encode(name, SEGMENT).to_string()
}

/// A directory component as one NATS subject token: visible ASCII stays but `.`, `*`, `>` and
/// `%`; the empty component is `%` alone, which no other component encodes to. Injective and
/// never empty.
pub fn directory_token(component: &str) -> String {
    if component.is_empty() {
        return "%".into();
    }
    utf8_percent_encode(component, DIRECTORY_TOKEN).to_string()
}

/// A name (an owner, a function) as one NATS subject token: ASCII letters, digits, `-` and `_`
/// stay, so `.`, `*`, `>`, white space and `%` never reach the subject; the empty name is `%`.
/// A function name and a plain owner name are unchanged. Injective and never empty.
pub fn name_token(name: &str) -> String {
    if name.is_empty() {
        return "%".into();
    }
    utf8_percent_encode(name, NAME_TOKEN).to_string()
}

/// The text `s` encodes, a `%` not followed by two hex digits passing through as it is;
/// `None` when the bytes are not UTF-8. For what another server wrote (a listing's hrefs, a URL).
pub fn decode_utf8(s: &str) -> Option<String> {
    percent_decode_str(s).decode_utf8().ok().map(std::borrow::Cow::into_owned)
}

/// Why [`decode_strict`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A `%` not followed by two hex digits.
    #[error("a `%` not followed by two hex digits")]
    BadEscape,
}

/// The bytes `s` encodes: every `%` must start two hex digits (a server refuses anything
/// else rather than guess); other characters pass through (`+` stays `+`).
pub fn decode_strict(s: &str) -> Result<Vec<u8>, DecodeError> {
    let b = s.as_bytes();
    let well_formed = b.iter().enumerate().filter(|(_, c)| **c == b'%').all(|(i, _)| {
        b.get(i + 1).is_some_and(u8::is_ascii_hexdigit) && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
    });
    if !well_formed {
        return Err(DecodeError::BadEscape);
    }
    Ok(percent_decode_str(s).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_segments_keep_the_unreserved_characters() {
        assert_eq!(path("/data/raw/a b#?.dat"), "/data/raw/a%20b%23%3F.dat");
        assert_eq!(path("/data/é"), "/data/%C3%A9");
        assert_eq!(path("/a-b_c.d~e/"), "/a-b_c.d~e/");
        assert_eq!(segment("a b#?.txt"), "a%20b%23%3F.txt");
        assert_eq!(segment("x/y"), "x%2Fy");
    }

    #[test]
    fn subject_tokens_are_injective_and_never_empty() {
        assert_eq!(directory_token(""), "%");
        assert_eq!(directory_token("raw"), "raw");
        assert_eq!(directory_token("a.b*c>d%e f"), "a%2Eb%2Ac%3Ed%25e%20f");
        assert_eq!(directory_token("é\u{7f}"), "%C3%A9%7F");
        assert_eq!(directory_token("x+y=(z)"), "x+y=(z)", "other punctuation stands for itself");
        assert_eq!(name_token(""), "%");
        assert_eq!(name_token("calib-2_x"), "calib-2_x");
        assert_eq!(name_token("a.b c"), "a%2Eb%20c");
        assert_ne!(directory_token("%"), directory_token(""));
        assert_ne!(name_token("%"), name_token(""));
    }

    #[test]
    fn strict_decoding_refuses_a_bad_escape_and_round_trips() {
        assert_eq!(decode_strict("/a%20b+c").expect("valid"), b"/a b+c");
        for bad in ["%", "%2", "%zz", "a%2"] {
            assert_eq!(decode_strict(bad), Err(DecodeError::BadEscape), "{bad}");
        }
        for p in ["/data/a b/é.dat", "/x%y/?#", ""] {
            assert_eq!(decode_strict(&path(p)).expect("valid"), p.as_bytes());
            assert_eq!(decode_utf8(&path(p)).as_deref(), Some(p));
        }
        assert_eq!(decode_utf8("/a%zz%20b").as_deref(), Some("/a%zz b"), "lenient: a bad escape stays");
        assert_eq!(decode_utf8("/%FF"), None, "not UTF-8");
    }
}
