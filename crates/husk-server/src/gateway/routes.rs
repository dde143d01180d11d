//! Which node a REST request goes to, by its method and path alone (no body is read to
//! decide, and nothing is looked up).

use axum::http::Method;

/// Where a REST request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A new sandbox: the gateway claims a place in the team's quota and places it.
    Create,
    /// The team's sandboxes: asked of every node, merged.
    List { paged: bool },
    /// About one sandbox: to the node its id names.
    Sandbox(String),
    /// Templates and their builds: to one node chosen by the template, the same for every
    /// request about it while the nodes stay the same (a build's steps, its status).
    Template(String),
    /// Anything else (keys, secrets, volumes, workspaces, runs, snapshots, the OpenAPI
    /// document): state the cluster shares, so any node answers.
    Any,
}

/// The route of `method path`.
pub fn route(method: &Method, path: &str) -> Route {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["sandboxes"] | ["v2", "sandboxes"] if method == Method::POST => Route::Create,
        ["sandboxes"] if method == Method::GET => Route::List { paged: false },
        ["v2", "sandboxes"] if method == Method::GET => Route::List { paged: true },
        ["sandboxes", id, ..]
        | ["v2", "sandboxes", id, ..]
        | ["husk", "v1", "sandboxes", id, ..]
            if is_id(id) =>
        {
            Route::Sandbox((*id).to_owned())
        }
        ["templates", "aliases", alias] => Route::Template((*alias).to_owned()),
        ["templates", id, ..]
        | ["v2", "templates", id, ..]
        | ["husk", "v1", "templates", id, ..]
            if !id.is_empty() && *id != "tags" =>
        {
            Route::Template((*id).to_owned())
        }
        ["templates" | "v3", ..] | ["husk", "v1", "template-files", ..] => {
            Route::Template(String::new())
        }
        _ => Route::Any,
    }
}

/// A sandbox id as nodes make them: `[a-z0-9]`, the node's code first.
pub fn is_id(s: &str) -> bool {
    s.len() > husk_core::store::cluster::NODE_CODE_LEN
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The node code an id begins with.
pub fn code_of(id: &str) -> Option<&str> {
    is_id(id).then(|| &id[..husk_core::store::cluster::NODE_CODE_LEN])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_go_where_their_path_says() {
        let id = "ab12cdefghijklmnopqr";
        let r = |m: Method, p: &str| route(&m, p);
        assert_eq!(r(Method::POST, "/sandboxes"), Route::Create);
        // What the SDKs send.
        assert_eq!(r(Method::POST, "/v2/sandboxes"), Route::Create);
        assert_eq!(r(Method::GET, "/sandboxes"), Route::List { paged: false });
        assert_eq!(r(Method::GET, "/v2/sandboxes"), Route::List { paged: true });
        for p in [
            format!("/sandboxes/{id}"),
            format!("/sandboxes/{id}/timeout"),
            format!("/v2/sandboxes/{id}/connect"),
            format!("/husk/v1/sandboxes/{id}/denials"),
        ] {
            assert_eq!(r(Method::POST, &p), Route::Sandbox(id.into()), "{p}");
        }
        assert_eq!(
            r(Method::DELETE, "/sandboxes/x"),
            Route::Any,
            "an id no node made goes anywhere, to be refused there"
        );
        assert_eq!(
            r(Method::GET, "/templates/my-app/builds/b1/status"),
            Route::Template("my-app".into())
        );
        assert_eq!(
            r(Method::GET, "/templates/aliases/my-app"),
            Route::Template("my-app".into())
        );
        assert_eq!(
            r(Method::POST, "/v3/templates"),
            Route::Template(String::new())
        );
        assert_eq!(r(Method::GET, "/templates"), Route::Template(String::new()));
        for p in [
            "/secrets",
            "/husk/v1/secrets/a",
            "/volumes",
            "/husk/v1/runs",
            "/snapshots",
        ] {
            assert_eq!(r(Method::GET, p), Route::Any, "{p}");
        }
    }

    #[test]
    fn the_node_code_is_the_ids_first_characters() {
        assert_eq!(code_of("ab12cdefghijklmnopqr"), Some("ab12"));
        assert_eq!(code_of("ab12"), None);
        assert_eq!(code_of("AB12cdefghijklmnopqr"), None);
        assert_eq!(code_of("ab12/../x"), None);
    }
}
