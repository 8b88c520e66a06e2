//! The web console: static pages served by the gateway, reading the HTTP API with the caller's token.
//!
//! Three files under `gateway/console/` (`index.html`, `app.js`, `style.css`) are compiled into
//! the binary with `include_str!`: no build step, no CDN, nothing fetched from elsewhere. The
//! pages themselves need no credential; the page asks for a bearer token, keeps it in
//! `sessionStorage` only, and sends it as `Authorization: Bearer` to the same API every other
//! client uses, so the console can do nothing its user could not do with `curl`.
//!
//! **Invariant:** no inline script and no inline style, anywhere in the console. Every answer
//! carries a strict `Content-Security-Policy` (`default-src 'self'`, no `'unsafe-inline'`), so
//! markup that reaches the page from an event (a file path, a function name) cannot run even if
//! it were inserted as HTML; `app.js` inserts it with `textContent` only, so it never is.
//!
//! | route | what |
//! |---|---|
//! | `GET /console`, `GET /console/` | `index.html` |
//! | `GET /console/app.js` | the page's script |
//! | `GET /console/style.css` | its style sheet |

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};
use axum::response::IntoResponse;
use axum::routing::get;

/// The console's page.
const INDEX_HTML: &str = include_str!("../console/index.html");
/// Its script: all of its behaviour.
const APP_JS: &str = include_str!("../console/app.js");
/// Its style sheet.
const STYLE_CSS: &str = include_str!("../console/style.css");

/// The policy every console answer carries: only this origin's script, style, images (inline
/// SVG is part of the document) and API; no plugins, no framing, no `<base>` rewriting.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The console's routes, merged into the gateway API's router; they need no state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(|| async { page("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/console/", get(|| async { page("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/console/app.js", get(|| async { page("text/javascript; charset=utf-8", APP_JS) }))
        .route("/console/style.css", get(|| async { page("text/css; charset=utf-8", STYLE_CSS) }))
}

/// One embedded file with its type and the console's headers. `no-cache`: the browser may keep
/// a copy but asks again each time, so a new gateway binary's console is seen at once.
fn page(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static("content-security-policy"), CONTENT_SECURITY_POLICY),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
            (HeaderName::from_static("referrer-policy"), "no-referrer"),
            (HeaderName::from_static("x-frame-options"), "DENY"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_has_no_inline_script_or_style_and_loads_only_its_own_files() {
        // The CSP would block them anyway; this keeps the page working under it.
        let lower = INDEX_HTML.to_ascii_lowercase();
        assert_eq!(lower.matches("<script").count(), 1, "one script element");
        assert!(lower.contains(r#"<script src="/console/app.js" defer></script>"#), "the one script is app.js");
        assert!(!lower.contains("<style") && !lower.contains(" style="), "inline style");
        let handler = lower.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
            !name.is_empty() && rest[name.len()..].trim_start().starts_with('=')
        });
        assert!(!handler, "an inline event handler attribute");
        assert!(!lower.contains("http://") && !lower.contains("https://"), "a foreign URL in index.html");
        for text in [APP_JS, STYLE_CSS] {
            assert!(!text.contains("innerHTML") && !text.contains("insertAdjacentHTML") && !text.contains("eval("));
            assert!(!text.contains("//cdn") && !text.contains("https://"), "a foreign URL");
        }
        assert!(CONTENT_SECURITY_POLICY.contains("default-src 'self'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }
}
