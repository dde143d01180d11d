//! A cluster gateway's routing of hostile requests (`husk-server` `gateway::routes` and
//! `app::sandbox_target`): the method, path and headers a client sends decide which node a
//! request goes to, before anything is authenticated.
//!
//! Checks: a route to a sandbox names an id as nodes make them (`[a-z0-9]`, longer than a
//! node's code, at most 64 characters), whose code is its first characters; a create or a
//! list is only ever `POST` or `GET`; the sandbox a request names by header or host has an id
//! of `[a-z0-9]` when it comes from the host.
#![no_main]

use arbitrary::Unstructured;
use axum::body::Body;
use axum::http::{Method, Request};
use husk_server::gateway::routes::{code_of, is_id, route, Route};
use libfuzzer_sys::fuzz_target;

struct Input<'a> {
    method: u8,
    path: &'a str,
    host: Option<&'a str>,
    sandbox_id: Option<&'a str>,
    sandbox_port: Option<&'a str>,
}

fn input<'a>(u: &mut Unstructured<'a>) -> arbitrary::Result<Input<'a>> {
    Ok(Input {
        method: u.arbitrary()?,
        path: u.arbitrary()?,
        host: u.arbitrary()?,
        sandbox_id: u.arbitrary()?,
        sandbox_port: u.arbitrary()?,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = input(&mut Unstructured::new(data)) else {
        return;
    };
    let method = [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH]
        [usize::from(input.method) % 5]
        .clone();
    match route(&method, input.path) {
        Route::Sandbox(id) => {
            assert!(is_id(&id), "{id:?}");
            let code = code_of(&id).expect("an id has a code");
            assert!(id.starts_with(code));
            assert_eq!(code.len(), husk_core::store::cluster::NODE_CODE_LEN);
        }
        Route::Create => assert_eq!(method, Method::POST),
        Route::List { .. } => assert_eq!(method, Method::GET),
        Route::Template(_) | Route::Any => {}
    }
    // The sandbox a request names, as the gateway finds it before it routes.
    let mut b = Request::builder().method(method);
    b = match axum::http::Uri::try_from(input.path) {
        Ok(uri) if uri.path_and_query().is_some() && uri.scheme().is_none() => b.uri(uri),
        _ => b.uri("/"),
    };
    if let Some(h) = input.host {
        b = b.header("host", h);
    }
    if let Some(id) = input.sandbox_id {
        b = b.header("e2b-sandbox-id", id);
    }
    if let Some(p) = input.sandbox_port {
        b = b.header("e2b-sandbox-port", p);
    }
    let Ok(req) = b.body(Body::empty()) else {
        return;
    };
    if let Some(target) = husk_server::app::sandbox_target(&req) {
        if input.sandbox_id.is_none() {
            assert!(
                target.id.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{target:?}"
            );
        }
        // A target with an id no node made is not routed anywhere.
        if let Some(code) = code_of(&target.id) {
            assert!(target.id.starts_with(code));
        }
    }
});
