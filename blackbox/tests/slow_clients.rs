//! The slow-clients check against a real server: it passes on `sut-server` as it is, and fires on
//! the same server with the planted weakness `no_read_timeout` (no head or body timeout, the
//! admission slot taken before the body is read: the accept loop before docs/hostile.md's fix).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use blackbox::slow::{Probe, SLOW_CLIENTS, STALLED_CLOSED, SlowOptions, run};
use reports::model::Judgement;

/// A server (the library, on its own runtime thread) with a tag `orders`, few admission slots
/// (so that a couple of hundred stalled bodies would take them all) and a 2 s head and body
/// timeout; `weak`: with the planted weakness.
fn server(weak: bool) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("ids.db");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut cfg = sut_server::ServerConfig::new(&db);
            cfg.admin_token = Some("slow-clients-test-admin-secret".to_owned());
            cfg.tags = vec![("orders".to_owned(), 1000)];
            cfg.admission.in_flight_max = 64;
            cfg.admission.queue_max = 0;
            cfg.conn_limits.header_read_ms = 2_000;
            cfg.conn_limits.body_read_ms = 2_000;
            cfg.weakness = weak.then_some(sut_server::listen::Weakness::NoReadTimeout);
            let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let server = sut_server::start(cfg, listen).await.unwrap();
            tx.send(server.addr).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), dir)
}

fn options(url: &str) -> SlowOptions {
    SlowOptions {
        // A route whose handler reads a body (the measured one is a GET).
        stall_path: Some("/tokens/verify".to_owned()),
        workers: 4,
        window: Duration::from_secs(2),
        closed_within: Duration::from_secs(8),
        ..SlowOptions::new(url, Probe::get("/id/orders"), 200)
    }
}

fn verdict(checks: &[reports::model::InvariantResult], name: &str) -> Judgement {
    checks
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.verdict)
        .unwrap_or_else(|| panic!("no {name} in {checks:?}"))
}

#[test]
fn the_server_keeps_answering_and_closes_every_stalled_connection() {
    let (url, _dir) = server(false);
    let slow = run(&options(&url)).unwrap();
    let checks = slow.checks();
    assert_eq!(verdict(&checks, SLOW_CLIENTS), Judgement::Held, "{slow:?}");
    assert_eq!(
        verdict(&checks, STALLED_CLOSED),
        Judgement::Held,
        "{slow:?}"
    );
    assert_eq!(
        slow.opened, 200,
        "every stalled connection was open: {slow:?}"
    );
    assert!(slow.rate_before_per_s > 0.0);
}

#[test]
fn a_server_without_read_timeouts_is_caught() {
    let (url, _dir) = server(true);
    let slow = run(&options(&url)).unwrap();
    let checks = slow.checks();
    // 175 bodies that never arrive hold all 64 slots: nothing else is served.
    assert_eq!(
        verdict(&checks, SLOW_CLIENTS),
        Judgement::Violated,
        "{slow:?}"
    );
    assert_eq!(
        verdict(&checks, STALLED_CLOSED),
        Judgement::Violated,
        "{slow:?}"
    );
    assert!(slow.ratio() < 0.1, "{slow:?}");
}
