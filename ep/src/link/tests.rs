//! The link's close frames read as refusals or not, and refusal snippets bounded.

use super::*;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

fn frame(code: u16, reason: &str) -> Option<CloseFrame> {
    Some(CloseFrame { code: CloseCode::from(code), reason: reason.to_owned().into() })
}

#[test]
fn final_close_codes_are_refusals_and_others_are_not() {
    for code in FINAL_CLOSE_CODES {
        let e = closed(frame(code, "attach token revoked"));
        let r = e.downcast_ref::<Refused>().expect("refusal");
        assert_eq!(r.0, format!("scheduler closed the session with code {code}: attach token revoked"));
    }
    for code in [1000, 1001, 1008, 1011, 4000, 4404] {
        assert!(closed(frame(code, "x")).downcast_ref::<Refused>().is_none(), "{code}");
    }
    assert!(closed(None).downcast_ref::<Refused>().is_none());
}

#[test]
fn snippets_are_bounded_one_line_text() {
    assert_eq!(snippet(b" token\nrevoked\r\n"), "token revoked");
    assert_eq!(snippet(&[0xff, b'a']), "\u{fffd}a");
    assert_eq!(snippet(&[b'x'; 1000]).len(), REFUSAL_SNIPPET);
}
