//! The link's close frames read as refusals or not, refusal snippets bounded, and when a report
//! is held for the next one.

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

/// A lone report waits for the next one only while other jobs run and more wait in the queue,
/// and at most the linger; two reports, nothing else running, an empty queue or a leaving EP
/// send at once.
#[test]
fn a_lone_report_is_held_only_while_others_run_and_more_wait_and_only_briefly() {
    let since = Instant::now();
    assert_eq!(report_hold(1, 1, 1, false, since), Some(since + REPORT_LINGER));
    assert_eq!(report_hold(1, 3, 2, false, since), Some(since + REPORT_LINGER));
    for (pending, running, queued, leaving) in
        [(2, 1, 1, false), (5, 2, 2, false), (1, 0, 1, false), (1, 1, 0, false), (1, 1, 1, true)]
    {
        assert_eq!(
            report_hold(pending, running, queued, leaving, since),
            None,
            "{pending} {running} {queued} {leaving}"
        );
    }
    assert!(REPORT_LINGER <= Duration::from_millis(5), "a held report delays the scheduler's view of its job's end");
}
