//! The OpenAPI 3.1 document of the gateway's HTTP API, served at `GET /v1/openapi.json`.
//!
//! The document is hand-written JSON (`gateway/openapi.json`), included at build time. Every
//! operation names the scope it needs (`x-htfaas-scope`: `none`, `submit`, `developer` or
//! `admin`) and the matching `security` requirement; request and response bodies refer to
//! JSON Schemas (2020-12) of the [`htfaas_functions::proto`] wire types under
//! `components/schemas`. The tests below keep it equal to [`crate::api::ROUTES`] (each
//! operation, each scope); the end-to-end tests (`tests/e2e/scopes.rs`) check it against the
//! running server and validate live answers against its schemas.

/// The document, as served.
pub const DOCUMENT: &str = include_str!("../openapi.json");

/// The document's operations: (upper-case method, path, `x-htfaas-scope`), in document order.
/// `None` when the document does not parse (a test makes sure it does).
pub fn operations() -> Option<Vec<(String, String, String)>> {
    let doc: serde_json::Value = serde_json::from_str(DOCUMENT).ok()?;
    let mut ops = Vec::new();
    for (path, item) in doc.get("paths")?.as_object()? {
        for (method, op) in item.as_object()? {
            let scope = op.get("x-htfaas-scope")?.as_str()?.to_owned();
            ops.push((method.to_uppercase(), path.clone(), scope));
        }
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ROUTES;
    use std::collections::BTreeSet;

    #[test]
    fn the_document_lists_exactly_the_routes_with_their_scopes() {
        let documented: BTreeSet<(String, String, String)> =
            operations().expect("the document parses and every operation has x-htfaas-scope").into_iter().collect();
        let routed: BTreeSet<(String, String, String)> =
            ROUTES.iter().map(|r| (r.method.to_owned(), r.path.to_owned(), r.access.as_str().to_owned())).collect();
        let undocumented: Vec<_> = routed.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&routed).collect();
        assert!(undocumented.is_empty(), "routes missing from openapi.json (or with another scope): {undocumented:?}");
        assert!(unrouted.is_empty(), "documented operations that api::ROUTES lacks: {unrouted:?}");
        assert_eq!(routed.len(), ROUTES.len(), "a route listed twice in api::ROUTES");
    }

    #[test]
    fn every_operation_has_security_and_responses_and_every_reference_resolves() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT).expect("json");
        assert_eq!(doc["openapi"], "3.1.0");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("item") {
                let scope = op["x-htfaas-scope"].as_str().expect("scope");
                let security = op["security"].as_array().expect("security");
                assert_eq!(security.is_empty(), scope == "none", "{method} {path}");
                assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
                if scope != "none" {
                    assert!(op["responses"].get("401").is_some(), "{method} {path} documents no 401");
                }
            }
        }
        // Every `$ref` names something in the document.
        fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                        out.push(r.to_owned());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in all {
            let pointer = r.strip_prefix('#').expect("local reference");
            assert!(doc.pointer(pointer).is_some(), "dangling {r}");
        }
    }
}
