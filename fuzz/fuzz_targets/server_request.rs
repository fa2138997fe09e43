#![no_main]
//! Arbitrary HTTP requests through the real `sut-server` router (extractors, body limit, JSON
//! decoding, handlers, SQLite stores on a temp file): never a 5xx, never a panic, and every
//! non-2xx answer is the JSON error body.
//!
//! Input: first byte picks the method, then the path and query up to the first '\n', then the
//! body.

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt as _;

struct Harness {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
    _server: sut_server::Server,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = sut_server::ServerConfig::new(&dir.path().join("ids.db"));
        let server = runtime
            .block_on(sut_server::start(
                cfg,
                "127.0.0.1:0".parse().expect("addr"),
            ))
            .expect("server");
        let router = sut_server::router(server.state().clone());
        // A tag, accounts and stock, so that the handlers get past "unknown".
        for (path, body) in [
            ("/admin/tags", r#"{"tag":"t","step":10}"#),
            (
                "/admin/accounts",
                r#"{"user":1,"count":10,"balance_minor":100}"#,
            ),
            ("/admin/stock", r#"{"activity":1,"units":3}"#),
        ] {
            let req = Request::post(path).body(Body::from(body)).expect("request");
            runtime.block_on(router.clone().oneshot(req)).expect("seed");
        }
        Harness {
            runtime,
            router,
            _server: server,
            _dir: dir,
        }
    })
}

const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::HEAD,
];

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let (target, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(target) = std::str::from_utf8(target) else {
        return;
    };
    // The path must be a valid request target for the request to exist at all (hyper would
    // refuse anything else before axum sees it).
    let Ok(uri) = format!("/{}", target.trim_start_matches('/')).parse::<axum::http::Uri>() else {
        return;
    };
    // Skip the route that sleeps on purpose.
    if uri.path() == "/noop" {
        return;
    }
    let h = harness();
    let method = METHODS[usize::from(m) % METHODS.len()].clone();
    let req = Request::builder()
        .method(method.clone())
        .uri(uri)
        .body(Body::from(body.to_vec()))
        .expect("request");
    let response = h
        .runtime
        .block_on(h.router.clone().oneshot(req))
        .expect("infallible");
    let status = response.status();
    assert!(!status.is_server_error(), "{status} for {target:?}");
    // A HEAD answer has no body (the harness's first crash: its oracle, not the server).
    if !status.is_success() && method != Method::HEAD {
        let bytes = h
            .runtime
            .block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .expect("body");
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON error body");
        assert!(v["error"].is_string(), "{status}: {v}");
    }
});
