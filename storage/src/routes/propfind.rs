//! `PROPFIND /<dir>/` (WebDAV, RFC 4918), as dCache's WebDAV door and XRootD's XrdHttp answer
//! it: a `207 Multi-Status` of the directory (`Depth: 0`) or of it and its entries (`Depth: 1`,
//! the default here); `Depth: infinity` is refused (dCache's default too). Each response holds
//! `href` (percent-encoded, a directory's ending in `/`), `resourcetype`, `getcontentlength`
//! and `getlastmodified` (RFC 1123), whatever properties the body asks for. Needs a LIST
//! macaroon or a Basic user within their paths (`htfaas events backfill` lists the
//! namespace it fires on).

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;

use super::AppState;
use crate::error::HttpError;
use crate::fs::Entry;
use crate::macaroons::Activity;

/// Most entries one directory's listing holds.
pub const MAX_ENTRIES: usize = 100_000;

#[tracing::instrument(name = "storage.propfind", skip_all, fields(path = req.uri().path(), principal = tracing::field::Empty))]
pub(super) async fn handle(
    state: &AppState,
    client: std::net::SocketAddr,
    req: Request<Body>,
) -> Result<Response, HttpError> {
    let (path, _) = super::authorized(state, client, &req, Activity::List)?;
    let depth = match req.headers().get("depth").map(|v| v.to_str().unwrap_or("?").trim()) {
        None | Some("1") => 1,
        Some("0") => 0,
        Some(other) => {
            return Err(HttpError::Forbidden(format!("Depth {other:?} is not supported (0 or 1)")));
        }
    };
    let Some((this, entries)) = crate::fs::list_dir(&state.data_dir, &path, MAX_ENTRIES).await? else {
        return Err(HttpError::NotFound(format!("{} is no directory", path.as_str())));
    };
    let dir = if path.is_root() { "/".to_owned() } else { format!("{}/", path.as_str()) };
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<d:multistatus xmlns:d=\"DAV:\">\n");
    push_response(&mut xml, &dir, &this);
    if depth == 1 {
        for e in &entries {
            let href = if e.dir { format!("{dir}{}/", e.name) } else { format!("{dir}{}", e.name) };
            push_response(&mut xml, &href, e);
        }
    }
    xml.push_str("</d:multistatus>\n");
    Response::builder()
        .status(StatusCode::MULTI_STATUS)
        .header(header::CONTENT_TYPE, "application/xml; charset=utf-8")
        .body(Body::from(xml))
        .map_err(|e| HttpError::Internal(format!("build response: {e}")))
}

fn push_response(xml: &mut String, href: &str, e: &Entry) {
    let kind = if e.dir { "<d:resourcetype><d:collection/></d:resourcetype>" } else { "<d:resourcetype/>" };
    let modified = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(e.mtime_s));
    xml.push_str(&format!(
        "<d:response><d:href>{}</d:href><d:propstat><d:prop>{kind}<d:getcontentlength>{}</d:getcontentlength>\
         <d:getlastmodified>{modified}</d:getlastmodified></d:prop><d:status>HTTP/1.1 200 OK</d:status>\
         </d:propstat></d:response>\n",
        encode(href),
        e.size
    ));
}

/// An href: unreserved characters and `/` kept, every other byte percent-encoded, so what is
/// left needs no XML escaping.
fn encode(path: &str) -> String {
    htfaas_functions::percent::path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hrefs_are_percent_encoded_so_no_name_reaches_the_xml_as_markup() {
        assert_eq!(encode("/data/a b/<x>&ü.txt"), "/data/a%20b/%3Cx%3E%26%C3%BC.txt");
        let mut xml = String::new();
        push_response(&mut xml, "/d/<x>", &Entry { name: "<x>".into(), dir: false, size: 3, mtime_s: 0 });
        assert!(xml.contains("<d:href>/d/%3Cx%3E</d:href>"), "{xml}");
        assert!(xml.contains("<d:getcontentlength>3</d:getcontentlength>"), "{xml}");
        assert!(xml.contains("<d:getlastmodified>Thu, 01 Jan 1970 00:00:00 GMT</d:getlastmodified>"), "{xml}");
    }
}
