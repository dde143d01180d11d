//! `GET /husk/v1/openapi.json`: the OpenAPI 3.1 description of husk's native API
//! (`docs/openapi.json`, compiled in), served without a key.
//!
//! The tests below read the server's source and fail when a `/husk/v1` route or method is not
//! documented, or a documented one does not exist: the document cannot drift from the routers.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::AppState;

/// Where the document is served (spelled out in [`router`] too: the tests read route literals).
pub const PATH: &str = "/husk/v1/openapi.json";

/// The document itself.
pub const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

/// The route needs no state (nor a key).
pub fn router(_state: AppState) -> Router {
    routes()
}

fn routes() -> Router {
    Router::new().route("/husk/v1/openapi.json", get(document))
}

async fn document() -> Response {
    let mut resp = DOCUMENT.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// Methods axum's routing functions name, as OpenAPI spells them.
    const METHODS: [&str; 7] = ["get", "post", "put", "delete", "patch", "head", "options"];

    fn doc() -> Value {
        serde_json::from_str(DOCUMENT).expect("docs/openapi.json is not valid JSON")
    }

    /// A Rust token, as far as finding routes needs: literals' text is kept raw (escapes are not
    /// decoded: route paths have none).
    #[derive(Debug, Clone, PartialEq)]
    enum Tok {
        Str(String),
        Ident(String),
        Punct(char),
    }

    /// A small Rust lexer: skips comments (line, and nested block ones), reads strings (with
    /// escapes; raw `r#"..."#` and byte ones too), tells char literals from lifetimes.
    fn lex(src: &str) -> Vec<Tok> {
        let c: Vec<char> = src.chars().collect();
        let (mut i, mut out) = (0, Vec::new());
        let at = |i: usize| c.get(i).copied().unwrap_or('\0');
        // A quoted string whose opening quote is at `i`; the index after its closing quote.
        let quoted = |mut i: usize| -> (String, usize) {
            let start = i + 1;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            let end = i.min(c.len());
            (c[start..end].iter().collect(), end + 1)
        };
        while i < c.len() {
            let ch = c[i];
            if ch.is_whitespace() {
                i += 1;
            } else if ch == '/' && at(i + 1) == '/' {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            } else if ch == '/' && at(i + 1) == '*' {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            } else if ch == '"' {
                let (text, next) = quoted(i);
                out.push(Tok::Str(text));
                i = next;
            } else if ch == '\'' {
                if at(i + 1) == '\\' {
                    // An escaped char literal: up to its closing quote.
                    i += 2;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    // A lifetime.
                    out.push(Tok::Punct('\''));
                    i += 1;
                }
            } else if ch.is_alphanumeric() || ch == '_' {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let raw = matches!(word.as_str(), "r" | "br") && matches!(at(i), '"' | '#');
                if raw {
                    let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
                    let open = i + hashes;
                    if at(open) != '"' {
                        out.push(Tok::Ident(word));
                        continue;
                    }
                    let close: String = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', hashes))
                        .collect();
                    let body: String = c[open + 1..].iter().collect();
                    let len = body.find(&close).unwrap_or(body.len());
                    out.push(Tok::Str(body[..len].to_string()));
                    i = open + 1 + body[..len].chars().count() + close.chars().count();
                } else if word == "b" && at(i) == '"' {
                    let (text, next) = quoted(i);
                    out.push(Tok::Str(text));
                    i = next;
                } else if word == "b" && at(i) == '\'' {
                    // A byte literal: as a char literal.
                    i += if at(i + 1) == '\\' { 4 } else { 3 };
                } else {
                    out.push(Tok::Ident(word));
                }
            } else {
                out.push(Tok::Punct(ch));
                i += 1;
            }
        }
        out
    }

    /// The methods of a method router expression (`get(a).post(b)`,
    /// `axum::routing::put(c)`): each function called at the top level of the expression.
    /// Anything else called at that level (`on(..)`, `any(..)`, a helper) is an error, so a
    /// route this scanner cannot read fails the test instead of passing unnoticed.
    fn methods_of(expr: &[Tok], path: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut depth = 0i32;
        for (i, t) in expr.iter().enumerate() {
            match t {
                Tok::Punct('(' | '[' | '{') => {
                    if depth == 0 {
                        if let Some(Tok::Ident(name)) = i.checked_sub(1).map(|p| &expr[p]) {
                            assert!(
                                METHODS.contains(&name.as_str()),
                                "route {path}: cannot read its method router \
                                 (`{name}(..)` is not get/post/put/delete/...)"
                            );
                            out.insert(name.clone());
                        }
                    }
                    depth += 1;
                }
                Tok::Punct(')' | ']' | '}') => depth -= 1,
                _ => {}
            }
        }
        out
    }

    /// Every `.route("/husk/v1...", METHODS)` in `tokens`: (axum path, methods).
    fn routes_in(tokens: &[Tok]) -> Vec<(String, BTreeSet<String>)> {
        let mut out = Vec::new();
        for (i, w) in tokens.windows(4).enumerate() {
            let [Tok::Punct('.'), Tok::Ident(route), Tok::Punct('('), Tok::Str(path)] = w else {
                continue;
            };
            if route != "route" || !path.starts_with("/husk/v1") {
                continue;
            }
            // The second argument: after the comma, up to the call's closing parenthesis.
            let rest = &tokens[i + 4..];
            assert_eq!(rest.first(), Some(&Tok::Punct(',')), "route {path}");
            let mut depth = 0i32;
            let mut end = rest.len();
            for (j, t) in rest.iter().enumerate().skip(1) {
                match t {
                    Tok::Punct('(' | '[' | '{') => depth += 1,
                    Tok::Punct(')' | ']' | '}') if depth == 0 => {
                        end = j;
                        break;
                    }
                    Tok::Punct(')' | ']' | '}') => depth -= 1,
                    _ => {}
                }
            }
            let methods = methods_of(&rest[1..end], path);
            assert!(!methods.is_empty(), "route {path}: no method found");
            out.push((path.clone(), methods));
        }
        out
    }

    /// axum's `{param}` and `{*param}` as OpenAPI's `{param}`.
    fn openapi_path(axum: &str) -> String {
        axum.replace("{*", "{")
    }

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read the source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every `.route("/husk/v1...", METHODS)` in the server's source: OpenAPI path → methods.
    fn source_routes() -> BTreeMap<String, BTreeSet<String>> {
        let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src_dir, &mut files);
        files.sort();
        let mut routes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read a source file");
            for (path, methods) in routes_in(&lex(&text)) {
                let entry = routes.entry(openapi_path(&path)).or_default();
                for m in methods {
                    assert!(
                        entry.insert(m.clone()),
                        "{}: {m} {path} is registered twice",
                        file.display()
                    );
                }
            }
        }
        routes
    }

    fn doc_routes(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
        let paths = doc["paths"].as_object().expect("paths is an object");
        paths
            .iter()
            .map(|(path, item)| {
                let methods = item
                    .as_object()
                    .expect("a path item is an object")
                    .keys()
                    .filter(|k| METHODS.contains(&k.as_str()))
                    .cloned()
                    .collect();
                (path.clone(), methods)
            })
            .collect()
    }

    #[test]
    fn the_document_is_openapi_3_1_json() {
        let doc = doc();
        let version = doc["openapi"].as_str().expect("an `openapi` string");
        assert!(
            version.starts_with("3.1."),
            "openapi is {version}, not 3.1.x"
        );
        assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
        assert_eq!(doc["servers"][0]["url"], "http://127.0.0.1:3000");
        let scheme = &doc["components"]["securitySchemes"]["ApiKey"];
        assert_eq!(scheme["type"], "apiKey");
        assert_eq!(scheme["in"], "header");
        assert_eq!(scheme["name"], "X-API-Key");
    }

    #[test]
    fn the_source_scanner_reads_routes() {
        let src = r##"
            // .route("/husk/v1/commented", get(x))
            /* .route("/husk/v1/block", get(x)) */
            let q = '"'; let s = r#".route("/husk/v1/raw", get(x))"#; let l: &'static str = "";
            Router::new()
                .route("/husk/v1/a", get(list).post(b::c))
                .route(
                    "/husk/v1/a/{name}/files/{*p}",
                    // get(nope) in a comment
                    axum::routing::put(up).delete(del),
                )
                .route("/elsewhere", get(e))
        "##;
        let found = routes_in(&lex(src));
        let set = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            found,
            vec![
                ("/husk/v1/a".to_string(), set(&["get", "post"])),
                (
                    "/husk/v1/a/{name}/files/{*p}".to_string(),
                    set(&["put", "delete"])
                ),
            ]
        );
        assert_eq!(openapi_path(&found[1].0), "/husk/v1/a/{name}/files/{p}");
        let odd = lex(r#".route("/husk/v1/x", on(MethodFilter::GET, h))"#);
        assert!(
            std::panic::catch_unwind(|| routes_in(&odd)).is_err(),
            "an unreadable method router must fail"
        );
    }

    #[test]
    fn every_husk_route_is_documented_and_nothing_else() {
        let source = source_routes();
        assert!(
            source.len() >= 10 && source.contains_key(PATH),
            "the scan found too few routes: {source:?}"
        );
        let documented = doc_routes(&doc());
        let mut problems = Vec::new();
        for (path, methods) in &source {
            match documented.get(path) {
                None => problems.push(format!("{path} is served but not documented")),
                Some(doc_methods) => {
                    for m in methods.difference(doc_methods) {
                        problems.push(format!("{} {path} is served but not documented", m));
                    }
                    for m in doc_methods.difference(methods) {
                        problems.push(format!("{} {path} is documented but not served", m));
                    }
                }
            }
        }
        for path in documented.keys() {
            if !path.starts_with("/husk/v1/") {
                problems.push(format!("{path} is not husk's native API"));
            } else if !source.contains_key(path) {
                problems.push(format!("{path} is documented but not served"));
            }
        }
        assert!(problems.is_empty(), "docs/openapi.json: {problems:#?}");
    }

    /// The value a local `$ref` (`#/a/b`) points at.
    fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        doc.pointer(pointer)
    }

    fn refs<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    match (k.as_str(), child) {
                        ("$ref", Value::String(r)) => out.push((at.clone(), r)),
                        ("mapping", Value::Object(m)) => {
                            for (tag, target) in m {
                                if let Value::String(r) = target {
                                    out.push((format!("{at}/mapping/{tag}"), r));
                                }
                            }
                        }
                        _ => refs(child, format!("{at}/{k}"), out),
                    }
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    refs(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_ref_resolves() {
        let doc = doc();
        let mut found = Vec::new();
        refs(&doc, String::new(), &mut found);
        assert!(found.len() > 50, "too few $refs found: {}", found.len());
        let broken: Vec<_> = found
            .iter()
            .filter(|(_, r)| resolve(&doc, r).is_none())
            .map(|(at, r)| format!("{at}: {r}"))
            .collect();
        assert!(broken.is_empty(), "unresolved $refs: {broken:#?}");
        assert!(resolve(&doc, "#/components/schemas/Nope").is_none());
    }

    #[test]
    fn operations_are_complete() {
        let doc = doc();
        let mut ids = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            // Every `{param}` of the path is declared, on the path or on each operation.
            let declared = |op: &Value| -> BTreeSet<String> {
                [&item["parameters"], &op["parameters"]]
                    .into_iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .map(|p| match p.get("$ref").and_then(Value::as_str) {
                        Some(r) => resolve(&doc, r).expect("a parameter $ref resolves"),
                        None => p,
                    })
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str().map(str::to_owned))
                    .collect()
            };
            let wanted: BTreeSet<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(str::to_owned)
                .collect();
            for (method, op) in item.as_object().unwrap() {
                if !METHODS.contains(&method.as_str()) {
                    continue;
                }
                let id = op["operationId"].as_str().expect("an operationId");
                assert!(ids.insert(id.to_owned()), "operationId {id} used twice");
                assert!(
                    op["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{method} {path}: no description"
                );
                let responses = op["responses"].as_object().expect("responses");
                assert!(
                    responses.keys().any(|c| c.starts_with('2')),
                    "{method} {path}: no success response"
                );
                assert_eq!(declared(op), wanted, "{method} {path}: path parameters");
                // Keys are needed everywhere but here, and at E2B template uploads' signed
                // URLs (the signature is the authority: any HTTP client uploads there).
                let public = op["security"].as_array().is_some_and(|s| s.is_empty());
                let keyless = path == PATH || path == "/husk/v1/template-files/{hash}";
                assert_eq!(public, keyless, "{method} {path}: security");
                if !public {
                    assert!(
                        responses.contains_key("401"),
                        "{method} {path}: no 401 answer"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn the_document_is_served_without_a_key() {
        use tower::ServiceExt;
        let app = routes();
        let req = axum::http::Request::get(PATH)
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), axum::http::StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body, DOCUMENT.as_bytes());
    }
}
