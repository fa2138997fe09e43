//! The server against the hostile client of docs/hostile.md ("Attacks on the deployed server"):
//! each finding there has a test here that failed on the server as it was and passes now.
//!
//! - the client chose the price it paid (a draw at price 0 won a prize; `GET /ledger` said
//!   "safe"): the price is the activity's, set by the operator, and `lottery.paid` names a prize
//!   sold below it (shown with the documented flaw `client_price`, the old behaviour);
//! - a draw for the wrong activity burned the user's one-time token for the hour: refused, the
//!   token stays unused;
//! - any activity string got a one-time token: only registered activities do.

use std::net::SocketAddr;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sut_server::{Server, ServerConfig, start};

mod common;
use common::{Api, PRICE_MINOR};

async fn server(db: &Path, tune: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut cfg = common::config(db);
    tune(&mut cfg);
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(cfg, listen).await.unwrap()
}

fn field(v: &Value) -> &str {
    v["field"].as_str().unwrap_or("<none>")
}

fn check<'a>(ledger: &'a Value, name: &str) -> &'a Value {
    ledger["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {ledger}"))
}

/// Users `first..first + count` with `balance_minor` each, and 100 units of activity 1.
async fn seed(api: &Api, first: u64, count: u64, balance_minor: u64) {
    let (s, v) = api
        .post(
            "/admin/accounts",
            &json!({"user": first, "count": count, "balance_minor": balance_minor}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = api
        .post("/admin/stock", &json!({"activity": 1, "units": 100}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// Consumes `once` as `user` for `activity` at the token service: 200 means it was unused.
async fn consume(api: &Api, user: u64, once: &str, activity: &str) -> (StatusCode, Value) {
    api.post(
        "/tokens/once/consume",
        &json!({"user": user, "token": once, "activity": activity}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_price_is_the_operators_not_the_clients() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api, 1, 60, 0).await;
    let once = api.once_token(1, 1).await;
    // The finding: a user with nothing drew at price 0 and won. Now: 403 naming the price.
    let free = json!({"user": 1, "activity": 1, "price_minor": 0, "won": true, "once_token": once});
    let (s, v) = api.post("/lottery/draw", &free).await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::FORBIDDEN, "price_minor"),
        "{v}"
    );
    // Repeating the operator's price is fine; the balance then decides (nothing to pay with).
    let fair = json!({"user": 1, "activity": 1, "price_minor": PRICE_MINOR, "won": true, "once_token": once});
    let (s, v) = api.post("/lottery/draw", &fair).await;
    assert_eq!((s, field(&v)), (StatusCode::CONFLICT, "user"), "{v}");
    let (s, ledger) = api.get("/ledger").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ledger["collected_minor"], 0, "{ledger}");
    assert_eq!(ledger["stock"][0]["issued"], 0, "{ledger}");
    assert_eq!(check(&ledger, "lottery.paid")["ok"], true, "{ledger}");
    assert_eq!(ledger["safe"], true, "{ledger}");
    // The refused draw consumed nothing: the 403 came before the one-time token was used.
    let other = api.once_token(2, 1).await;
    let (s, v) = api
        .post(
            "/lottery/draw",
            &json!({"user": 2, "activity": 1, "price_minor": 0, "once_token": other}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, v) = consume(&api, 2, &other, "1").await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the refused draw's token is still unused: {v}"
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prize_won_for_nothing_is_a_violation_of_lottery_paid() {
    // The old behaviour, as the documented flaw: the price is the request's.
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.flaw = Some(sut::flaw::Flaw::ClientPrice);
    })
    .await;
    let api = Api::new(srv.addr);
    seed(&api, 1, 6, 0).await;
    let mut confirmed = 0;
    for user in 1..=6 {
        let (s, v) = api
            .draw(&json!({"user": user, "activity": 1, "price_minor": 0, "won": true}))
            .await;
        if s == StatusCode::OK {
            confirmed += 1;
        }
        assert!(
            s.is_success(),
            "with the flaw a free draw goes through: {v}"
        );
    }
    assert_eq!(confirmed, 6);
    let (_, ledger) = api.get("/ledger").await;
    assert_eq!(ledger["stock"][0]["issued"], 6, "{ledger}");
    assert_eq!(ledger["collected_minor"], 0, "{ledger}");
    // Money adds up, nothing is open: only the business's own invariant names the loss.
    assert_eq!(check(&ledger, "lottery.conservation")["ok"], true);
    assert_eq!(check(&ledger, "lottery.settled")["ok"], true);
    let paid = check(&ledger, "lottery.paid");
    assert_eq!(paid["ok"], false, "{ledger}");
    assert!(
        paid["violation"]
            .as_str()
            .unwrap()
            .contains("confirmed at 0, but the activity costs 10"),
        "{paid}"
    );
    assert_eq!(ledger["safe"], false, "{ledger}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_for_another_activity_burns_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api, 1, 2, 1_000).await;
    let once = api.once_token(1, 1).await;
    // The finding: presented for activity 2, the token was consumed before the activity was
    // compared, and the draw the user meant was then refused "already used" for the hour.
    let (s, v) = api
        .post(
            "/lottery/draw",
            &json!({"user": 1, "activity": 2, "once_token": once}),
        )
        .await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "once_token"), "{v}");
    let (s, v) = api
        .post(
            "/lottery/draw",
            &json!({"user": 1, "activity": 1, "won": false, "once_token": once}),
        )
        .await;
    assert_eq!(
        (s, v["outcome"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{v}"
    );
    // An activity nobody registered: refused before anything is read or consumed.
    let once = api.once_token(2, 1).await;
    let (s, v) = api
        .post(
            "/lottery/draw",
            &json!({"user": 2, "activity": 77, "once_token": once}),
        )
        .await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "activity"), "{v}");
    let (s, v) = consume(&api, 2, &once, "2").await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "activity"), "{v}");
    let (s, v) = consume(&api, 2, &once, "1").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_registers_activities_and_their_terms_never_change() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    // Only registered activities get one-time tokens (a client filled the table with its own).
    let (s, v) = api
        .post("/tokens/once", &json!({"user": 1, "activity": "A2024"}))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "activity"), "{v}");
    let (s, v) = api
        .post("/tokens/once", &json!({"user": 1, "activity": "30"}))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "activity"), "{v}");
    let terms = json!({"activity": 30, "price_minor": 250, "win_per_mille": 50});
    let (s, v) = api.post("/admin/activities", &terms).await;
    assert_eq!(
        (s, &v),
        (
            StatusCode::CREATED,
            &json!({"registered": "created", "created": 1, "unchanged": 0})
        )
    );
    let (s, v) = api.post("/admin/activities", &terms).await;
    assert_eq!(
        (s, &v),
        (
            StatusCode::OK,
            &json!({"registered": "unchanged", "created": 0, "unchanged": 1})
        )
    );
    // A range in one durable write (what a load generator needs for its many activities).
    let range = json!({"activity": 40, "count": 50, "price_minor": 5});
    let (s, v) = api.post("/admin/activities", &range).await;
    assert_eq!((s, &v["created"]), (StatusCode::CREATED, &json!(50)), "{v}");
    let (s, v) = api
        .post(
            "/admin/activities",
            &json!({"activity": 40, "count": 10_001, "price_minor": 5}),
        )
        .await;
    assert_eq!((s, field(&v)), (StatusCode::BAD_REQUEST, "count"), "{v}");
    // Ids past what the stores' integer columns hold: refused, naming the field, nothing
    // written (schemathesis found the range case answered 503).
    let last = i64::MAX as u64;
    for (body, named) in [
        (json!({"activity": last + 1, "price_minor": 5}), "activity"),
        (
            json!({"activity": last - 1, "count": 362, "price_minor": 5}),
            "count",
        ),
    ] {
        let (s, v) = api.post("/admin/activities", &body).await;
        assert_eq!((s, field(&v)), (StatusCode::BAD_REQUEST, named), "{v}");
    }
    let (s, v) = api
        .post(
            "/admin/activities",
            &json!({"activity": last, "price_minor": 5}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "the last id itself: {v}");
    // A price of 0 is said, never left in: refused without `"free": true`, and `free` with a
    // price.
    let silent = json!({"activity": 32, "price_minor": 0});
    let (s, v) = api.post("/admin/activities", &silent).await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::BAD_REQUEST, "price_minor"),
        "{v}"
    );
    let both = json!({"activity": 32, "price_minor": 5, "free": true});
    let (s, v) = api.post("/admin/activities", &both).await;
    assert_eq!((s, field(&v)), (StatusCode::BAD_REQUEST, "free"), "{v}");
    let (s, v) = api
        .post(
            "/admin/activities",
            &json!({"activity": 32, "price_minor": 0, "free": true}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let cheaper = json!({"activity": 30, "price_minor": 0, "free": true, "win_per_mille": 50});
    let (s, v) = api.post("/admin/activities", &cheaper).await;
    assert_eq!((s, field(&v)), (StatusCode::CONFLICT, "activity"), "{v}");
    let odds = json!({"activity": 31, "price_minor": 1, "win_per_mille": 1001});
    let (s, v) = api.post("/admin/activities", &odds).await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::BAD_REQUEST, "win_per_mille"),
        "{v}"
    );
    // Without the operator's secret: nothing.
    let (s, _) = api
        .post_with("/admin/activities", cheaper.to_string(), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, list) = api.get("/activities").await;
    assert_eq!(s, StatusCode::OK);
    let thirty = list
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["activity"] == 30)
        .expect("listed");
    assert_eq!(thirty["price_minor"], 250, "{list}");
    let (s, v) = api
        .post("/tokens/once", &json!({"user": 1, "activity": "30"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    srv.shutdown().await.unwrap();
    // Registered terms are durable: a restarted server sells at the same price.
    let srv = server(&dir.path().join("ids.db"), |cfg| cfg.activities.clear()).await;
    let api = Api::new(srv.addr);
    let (_, list) = api.get("/activities").await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|a| a["activity"] == 30 && a["price_minor"] == 250),
        "{list}"
    );
    srv.shutdown().await.unwrap();
}

/// A raw connection that sends `head` and then nothing: what a slow (or hostile) client does.
async fn stall(addr: SocketAddr, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// Reads until an answer's head and its body (a JSON object) have arrived, or `within` passes.
async fn answer_within(
    tcp: &mut tokio::net::TcpStream,
    within: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            let text = String::from_utf8_lossy(&got);
            if text.contains("\r\n\r\n") && text.trim_end().ends_with('}') {
                return Some(text.into_owned());
            }
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Reads until the server closes `tcp` (or `within` passes): what it sent before closing.
async fn closed_within(
    tcp: &mut tokio::net::TcpStream,
    within: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|()| String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_take_no_admission_slot_and_are_closed_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        // Four slots: the finding was that a few hundred stalled connections took every one.
        cfg.admission.in_flight_max = 4;
        cfg.admission.queue_max = 0;
        cfg.conn_limits.header_read_ms = 400;
        cfg.conn_limits.body_read_ms = 400;
    })
    .await;
    let api = Api::new(srv.addr);
    let mut stalled = Vec::new();
    for i in 0..40 {
        let head = if i % 2 == 0 {
            // Headers that never end.
            "GET /id/orders HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_owned()
        } else {
            // A body that never comes: 5 of 1,000 bytes.
            "POST /tokens/verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{\"to"
                .to_owned()
        };
        stalled.push((i, stall(srv.addr, &head).await));
    }
    // Everyone else is served meanwhile: no slot is held by a request still arriving.
    for _ in 0..20 {
        let (s, v) = api.get("/noop").await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (_, metrics) = api.get("/metrics").await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains("sut_admission_in_flight 0") || text.contains("sut_admission_in_flight 1"),
        "{text}"
    );
    // Each is closed within its timeout (and slack for a loaded machine); a stalled body is
    // told why first.
    for (i, tcp) in &mut stalled {
        let sent = closed_within(tcp, std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("stalled connection {i} still open after 10 s"));
        if *i % 2 == 1 {
            assert!(sent.starts_with("HTTP/1.1 408"), "{sent}");
        }
    }
    // An idle keep-alive connection is closed too, after answering what it asked.
    let mut idle = stall(srv.addr, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let sent = closed_within(&mut idle, std::time::Duration::from_secs(10))
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    let (_, metrics) = api.get("/metrics").await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(text.contains("sut_bodies_timed_out_total 20"), "{text}");
    srv.shutdown().await.unwrap();
}

/// Opens a connection from `source` (a loopback address) and sends `head`.
async fn stall_from(addr: SocketAddr, source: &str, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// A stalled body: the head of a POST and 5 of its 1,000 bytes (a request in flight).
const STALLED_BODY: &str = "POST /tokens/verify HTTP/1.1\r\nHost: x\r\nContent-Type: \
                            application/json\r\nContent-Length: 1000\r\n\r\n{\"to";

/// The value of the plain counter `name` on the server's `/metrics`.
async fn counter(api: &Api, name: &str) -> u64 {
    let (_, metrics) = api.get("/metrics").await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_hold_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.conn_limits.per_peer_max = 8;
        cfg.conn_limits.header_read_ms = 60_000;
        cfg.conn_limits.body_read_ms = 60_000;
    })
    .await;
    // Eight requests in flight (bodies that never come) from one address hold its cap.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(stall_from(srv.addr, "127.0.0.5", STALLED_BODY).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The ninth from the same address is closed before a byte of it is read: none of the
    // eight is idle, none gives way.
    let mut ninth = stall_from(
        srv.addr,
        "127.0.0.5",
        "GET /noop HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    let sent = closed_within(&mut ninth, std::time::Duration::from_secs(10))
        .await
        .expect("closed at once");
    assert_eq!(sent, "", "nothing answered on a refused connection");
    // Another address is served.
    let api = Api::new(srv.addr);
    let (s, _) = api.get("/noop").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(counter(&api, "sut_connections_refused_peer_total").await, 1);
    drop(held);
    srv.shutdown().await.unwrap();
}

/// The finding of docs/hostile.md: behind one address, stalled heads dropped a client's new
/// connections to none. Connections that have sent no whole request hold nothing a newcomer
/// must wait for: at its address's cap, the one idle the longest gives way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_heads_behind_one_address_give_way_to_its_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.conn_limits.per_peer_max = 8;
        cfg.conn_limits.header_read_ms = 60_000;
        cfg.conn_limits.idle_grace_ms = 100;
    })
    .await;
    let mut heads = Vec::new();
    for _ in 0..8 {
        heads.push(stall_from(srv.addr, "127.0.0.6", "GET /noop HTTP/1.1\r\nX-Slow: ").await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut fresh = stall_from(
        srv.addr,
        "127.0.0.6",
        "GET /noop HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    let answer = answer_within(&mut fresh, std::time::Duration::from_secs(10))
        .await
        .expect("the new connection is served");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The oldest stalled head gave way, closed without an answer; the others stay.
    let sent = closed_within(&mut heads[0], std::time::Duration::from_secs(5))
        .await
        .expect("the oldest stalled head is closed");
    assert_eq!(sent, "");
    for tcp in &mut heads[1..] {
        assert!(
            closed_within(tcp, std::time::Duration::from_millis(50))
                .await
                .is_none(),
            "only the oldest gives way"
        );
    }
    let api = Api::new(srv.addr);
    assert_eq!(counter(&api, "sut_connections_evicted_total").await, 1);
    drop(heads);
    srv.shutdown().await.unwrap();
}

/// The finding of docs/hostile.md: nine addresses holding keep-alive connections filled the
/// server and every other address got no answer. A full server closes the idle connection of
/// its largest holder for a new peer; under the planted weakness `no_eviction` it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_serves_a_new_peer_in_the_place_of_an_idle_connection() {
    for planted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let srv = server(&dir.path().join("ids.db"), |cfg| {
            cfg.conn_limits.connections_max = 11;
            cfg.conn_limits.per_peer_max = 6;
            cfg.conn_limits.header_read_ms = 60_000;
            cfg.conn_limits.idle_grace_ms = 100;
            if planted {
                cfg.weakness = Some(sut_server::listen::Weakness::NoEviction);
            }
        })
        .await;
        // Two addresses fill the server with keep-alive connections, each answered once.
        let mut holders = Vec::new();
        for (source, n) in [("127.0.0.7", 6), ("127.0.0.8", 5)] {
            for _ in 0..n {
                let mut tcp =
                    stall_from(srv.addr, source, "GET /noop HTTP/1.1\r\nHost: x\r\n\r\n").await;
                let answer = answer_within(&mut tcp, std::time::Duration::from_secs(10))
                    .await
                    .expect("a holder is served");
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
                holders.push(tcp);
            }
        }
        // Idle past their grace.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let mut newcomer = stall_from(
            srv.addr,
            "127.0.0.9",
            "GET /noop HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        let answer = answer_within(&mut newcomer, std::time::Duration::from_secs(5)).await;
        if planted {
            assert_eq!(answer, None, "the planted weakness refuses a new peer");
            continue;
        }
        let answer = answer.expect("a new peer is served when the server is full");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // The connection that gave way is the largest holder's idle the longest.
        assert!(
            closed_within(&mut holders[0], std::time::Duration::from_secs(5))
                .await
                .is_some()
        );
        srv.shutdown().await.unwrap();
    }
}

/// The schemathesis finding: a body that is a JSON array was read as the struct of its fields in
/// order (`POST /tokens` with `[0]` issued a JWT for user 0). Every body is an object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_an_array_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    for (path, body) in [
        ("/tokens", "[0]"),
        ("/admin/accounts", "[1, 1, 100]"),
        ("/admin/tags", "[\"orders\", 10]"),
    ] {
        let (s, v) = api.post_raw(path, body.to_owned()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {v}");
        assert_eq!(field(&v), "body", "{v}");
    }
    srv.shutdown().await.unwrap();
}

/// The finding of docs/hostile.md: `/metrics` and `/health` told anyone the business's volume
/// (draws made, IDs issued per tag). Both are the operator's now; `/health` without a credential
/// says only that the process answers, and `--metrics-public` opens the metrics on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_the_allocators_health_are_the_operators() {
    for public in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let srv = server(&dir.path().join("ids.db"), |cfg| {
            cfg.metrics_public = public
        })
        .await;
        let api = Api::new(srv.addr);
        let (s, v) = api
            .post("/admin/tags", &json!({"tag": "orders", "step": 10}))
            .await;
        assert!(s.is_success(), "{v}");
        let (s, _) = api.get("/id/orders").await;
        assert_eq!(s, StatusCode::OK);
        let anyone = |path: &str| {
            let url = format!("http://{}{path}", srv.addr);
            async move {
                let r = reqwest::get(url).await.unwrap();
                let status = r.status();
                (status, r.text().await.unwrap())
            }
        };
        let (s, text) = anyone("/metrics").await;
        if public {
            assert_eq!(s, StatusCode::OK, "{text}");
            assert!(text.contains("sut_ids_issued_total"), "{text}");
        } else {
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{text}");
            assert!(!text.contains("sut_"), "{text}");
        }
        let (s, text) = anyone("/health").await;
        assert_eq!(s, StatusCode::OK, "{text}");
        for hidden in ["tags", "instance", "snowflake", "orders"] {
            assert!(
                !text.contains(hidden),
                "{hidden} in the public health: {text}"
            );
        }
        assert!(text.contains("wall_clock_ms"), "{text}");
        let (s, text) = anyone("/admin/health").await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{text}");
        // The operator reads both.
        let (s, v) = api.get("/admin/health").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert!(v["tags"].as_array().is_some_and(|t| !t.is_empty()), "{v}");
        let (s, _) = api.get("/metrics").await;
        assert_eq!(s, StatusCode::OK);
        srv.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_is_its_owners_to_read_and_the_ledger_the_operators() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api, 1, 3, 1_000).await;
    let (s, v) = api
        .draw(&json!({"user": 1, "activity": 1, "won": false}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mine = v["draw"].as_str().unwrap().to_owned();
    assert!(
        v.get("xid").is_none(),
        "the xid never reaches a client: {v}"
    );
    let (_, v) = api
        .draw(&json!({"user": 2, "activity": 1, "won": false}))
        .await;
    let theirs = v["draw"].as_str().unwrap().to_owned();
    // The finding: xids were sequential and every draw's status was open to anyone.
    assert_ne!(
        u64::from_str_radix(&mine, 16)
            .unwrap()
            .abs_diff(u64::from_str_radix(&theirs, 16).unwrap()),
        1,
        "consecutive draws get unrelated handles"
    );
    let status = |bearer: Option<String>, draw: String| {
        let api = &api;
        async move {
            let mut req = api.client.get(format!("{}/lottery/draws/{draw}", api.base));
            if let Some(b) = bearer {
                req = req.bearer_auth(b);
            }
            let r = req.send().await.unwrap();
            let code = r.status();
            (code, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (jwt1, jwt2) = (api.jwt(1).await, api.jwt(2).await);
    let (s, v) = status(Some(jwt1.clone()), mine.clone()).await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{v}"
    );
    assert!(v.get("user").is_none(), "{v}");
    // Another user's draw is as absent as one that never was.
    let (s, v) = status(Some(jwt2), mine.clone()).await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "draw"), "{v}");
    let (s, _) = status(Some(jwt1), "0000000000000001".to_owned()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = status(None, mine.clone()).await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::UNAUTHORIZED, "authorization"),
        "{v}"
    );
    let (s, _) = status(Some(common::ADMIN.to_owned()), theirs).await;
    assert_eq!(s, StatusCode::OK, "the operator reads any draw");
    // The ledger is the operator's.
    let r = api
        .client
        .get(format!("{}/ledger", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let (s, _) = api.get("/ledger").await;
    assert_eq!(s, StatusCode::OK);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_secret_moves_no_money_on_the_participants_routes() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api, 1, 1, 1_000).await;
    let msg = |phase: &str| {
        json!({"branch": "Wallet", "msg": {"phase": phase, "draw": {"xid": 77, "user": 1,
            "activity": 1, "price_minor": PRICE_MINOR, "won": false}}})
    };
    // The finding: with the one admin secret, a wallet Try + Confirm moved money with no draw.
    for phase in ["Try", "Confirm"] {
        let (s, v) = api
            .post_with("/tcc/branch", msg(phase).to_string(), Some(common::ADMIN))
            .await;
        assert_eq!(
            (s, field(&v)),
            (StatusCode::UNAUTHORIZED, "authorization"),
            "{v}"
        );
    }
    let (_, ledger) = api.get("/ledger").await;
    assert_eq!(ledger["collected_minor"], 0, "{ledger}");
    // The service credential is the coordinator's: it moves branches, and runs no operator
    // route.
    let (s, v) = api
        .post_with("/tcc/branch", msg("Try").to_string(), Some(common::SERVICE))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = api
        .post_with(
            "/admin/stock",
            json!({"activity": 1, "units": 5}).to_string(),
            Some(common::SERVICE),
        )
        .await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::UNAUTHORIZED, "authorization"),
        "{v}"
    );
    srv.shutdown().await.unwrap();
    // One secret for both, short ones, a short JWT key, a participant without a credential:
    // each a start-up error that names the credential, never its value.
    type Tune = fn(&mut ServerConfig);
    let cases: [(&str, Tune); 6] = [
        ("the operator's secret", |c| {
            c.service_token = c.admin_token.clone();
        }),
        ("shorter than 16", |c| {
            c.admin_token = Some("short-secret".into())
        }),
        // Long enough, and weak: one character repeated, or few bits for its length.
        ("the operator secret repeats one character in 16", |c| {
            c.admin_token = Some("a".repeat(16))
        }),
        ("the service credential has about 80 bits", |c| {
            c.service_token = Some("abcdefghijklmnopq".into())
        }),
        ("JWT key", |c| c.jwt_secret = Some(b"0123456789".to_vec())),
        ("--service-token-file", |c| {
            c.role = sut_server::Role::Wallet;
            c.service_token = None;
        }),
    ];
    for (says, tune) in cases {
        let mut cfg = common::config(&dir.path().join("other.db"));
        tune(&mut cfg);
        let err = start(cfg, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap_err();
        assert!(err.contains(says), "{err}");
        assert!(
            !err.contains(common::ADMIN) && !err.contains("short-secret"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smaller_findings_each_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.noop_delay = false;
        cfg.once_rate_per_s = 0.001;
        cfg.once_burst = 3;
    })
    .await;
    let api = Api::new(srv.addr);
    // A body that is not JSON is refused as such (415), not read as JSON.
    let r = api
        .client
        .post(format!("{}/admin/accounts", api.base))
        .bearer_auth(common::ADMIN)
        .header("content-type", "text/plain")
        .body(r#"{"user": 1, "balance_minor": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let v: Value = r.json().await.unwrap();
    assert_eq!(field(&v), "content-type", "{v}");
    // `Bearer` in any case (RFC 7235).
    let r = api
        .client
        .get(format!("{}/ledger", api.base))
        .header("authorization", format!("bearer {}", common::ADMIN))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The delay knob is a test flag: a client cannot hold slots for free.
    let (s, v) = api.get("/noop?delay_ms=100").await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "delay_ms"), "{v}");
    // One user cannot fill the one-time token table: a quota per user.
    let (s, _) = api
        .post(
            "/admin/activities",
            &json!({"activity": 60, "count": 10, "price_minor": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let mut refused = None;
    for a in 60..70 {
        let (s, v) = api
            .post(
                "/tokens/once",
                &json!({"user": 9, "activity": a.to_string()}),
            )
            .await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((a, v));
            break;
        }
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (at, v) = refused.expect("the quota stops a user issuing without end");
    assert_eq!(at, 63, "a burst of 3, then the rate");
    assert_eq!(field(&v), "user", "{v}");
    // Another user has a quota of their own.
    let (s, _) = api
        .post("/tokens/once", &json!({"user": 10, "activity": "60"}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    srv.shutdown().await.unwrap();
    // Data files are the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    for file in [
        "ids.db",
        "ids.db.tokens",
        "ids.db.lottery",
        "ids.db.activities",
    ] {
        let mode = std::fs::metadata(dir.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}: {mode:o}");
    }
}

/// The heads of requests whose credential is missing or wrong, each announcing 1,000 body bytes
/// and sending 4: the credentials of the operator, of the coordinator and of a user.
fn unauthenticated_heads() -> Vec<String> {
    let with = |path: &str, auth: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}\
             Content-Length: 1000\r\n\r\n{{\"us"
        )
    };
    vec![
        with("/admin/accounts", ""),
        with(
            "/admin/accounts",
            "Authorization: Bearer not-the-secret\r\n",
        ),
        with(
            "/tcc/branch",
            &format!("Authorization: Bearer {}\r\n", common::ADMIN),
        ),
        with("/tokens/once", ""),
        with("/lottery/draw", "Authorization: Bearer not.a.jwt\r\n"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_its_credential_is_refused_before_its_body_is_read() {
    // The finding: every admitted route read up to 256 KiB of body before looking at the
    // credential (4,000 unauthenticated POSTs took the server from 13 MB to 1.3 GB), and a
    // stalled body on an admin route waited for the body timeout. Now the credential is decided
    // from the head: 401 at once, and the connection (its body unread) closed.
    let dir = tempfile::tempdir().unwrap();
    let body_read_ms = 30_000;
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.conn_limits.body_read_ms = body_read_ms;
    })
    .await;
    for head in unauthenticated_heads() {
        let mut tcp = stall(srv.addr, &head).await;
        // Far below the body timeout: nothing waited for the body.
        let sent = answer_within(&mut tcp, std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|| {
                panic!("no answer after 10 s of a {body_read_ms} ms body timeout: {head}")
            });
        assert!(sent.starts_with("HTTP/1.1 401"), "{head}\n{sent}");
        assert!(sent.contains("\"field\":\"authorization\""), "{sent}");
    }
    // A refused body that does arrive is drained, not kept, and the connection serves the next
    // request (closing it with the body still arriving would reset it, and a client whose
    // refusal was in flight would lose it).
    let mut tcp = stall(srv.addr, &unauthenticated_heads()[0]).await;
    let first = answer_within(&mut tcp, std::time::Duration::from_secs(10))
        .await
        .expect("the refusal");
    assert!(first.starts_with("HTTP/1.1 401"), "{first}");
    {
        use tokio::io::AsyncWriteExt;
        let rest = format!("{}\"}}", "x".repeat(1000 - 4 - 2));
        tcp.write_all(rest.as_bytes()).await.unwrap();
        tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
    }
    let next = answer_within(&mut tcp, std::time::Duration::from_secs(10))
        .await
        .expect("the next answer on the same connection");
    assert!(next.contains("HTTP/1.1 200"), "{next}");
    // With its credential, a route reads at most its own limit: 16 KiB here.
    let api = Api::new(srv.addr);
    let (s, v) = api
        .post("/admin/accounts", &json!({"pad": "x".repeat(20 * 1024)}))
        .await;
    assert_eq!(
        (s, field(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body"),
        "{v}"
    );
    srv.shutdown().await.unwrap();

    // The control: the planted weakness `body_before_auth` (the server as it was) reads the body
    // first, so the same requests wait for it and get 408.
    let weak = server(&dir.path().join("weak.db"), |cfg| {
        cfg.conn_limits.body_read_ms = 300;
        cfg.weakness = Some(sut_server::listen::Weakness::BodyBeforeAuth);
    })
    .await;
    for head in unauthenticated_heads() {
        let mut tcp = stall(weak.addr, &head).await;
        let sent = closed_within(&mut tcp, std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("still open after 10 s: {head}"));
        assert!(sent.starts_with("HTTP/1.1 408"), "{head}\n{sent}");
    }
    weak.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secrets_from_one_address_are_throttled_and_no_other_address_is() {
    // The finding: no throttle on wrong secrets. Now an address that presented 20 wrong ones is
    // refused every credential (429 with Retry-After), the right one included, and gets one
    // more try a second.
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let (guesser, other) = (from("127.0.0.2"), from("127.0.0.3"));
    let stock = format!("http://{}/admin/stock", srv.addr);
    let branch = format!("http://{}/tcc/branch", srv.addr);
    let body = json!({"activity": 1, "units": 1});
    let post = |client: &reqwest::Client, url: &str, secret: Option<&str>| {
        let mut req = client.post(url).json(&body);
        if let Some(secret) = secret {
            req = req.bearer_auth(secret);
        }
        req.send()
    };
    // Not guesses, never counted: no credential, and the operator's secret where the
    // coordinator's is taken.
    for _ in 0..30 {
        let r = post(&guesser, &stock, None).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let r = post(&guesser, &branch, Some(common::ADMIN)).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let r = post(&guesser, &stock, Some(common::ADMIN)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    for i in 0..20 {
        let r = post(&guesser, &stock, Some(&format!("guess-{i}")))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "guess {i}");
    }
    let r = post(&guesser, &stock, Some("guess-20")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(field(&v), "authorization", "{v}");
    // The right secret too: a guesser learns nothing faster.
    let r = post(&guesser, &stock, Some(common::ADMIN)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Reading a draw with neither the secret nor a JWT is a guess as well.
    let status = format!("http://{}/lottery/draws/0123456789abcdef", srv.addr);
    let r = guesser
        .get(&status)
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Which routes refuse the throttled address: those the description says (and no other).
    let description: Value = serde_json::from_str(&sut_server::openapi::openapi_json()).unwrap();
    for (method, path) in sut_server::ROUTES {
        let url = format!(
            "http://{}{}",
            srv.addr,
            path.replace("{tag}", "orders")
                .replace("{id}", "1")
                .replace("{biz}", "OD")
                .replace("{draw}", "0123456789abcdef")
                .replace("{xid}", "1")
        );
        // The address regains one try a second: spend any it has, so that the throttle holds.
        while post(&guesser, &stock, Some("guess"))
            .await
            .unwrap()
            .status()
            != StatusCode::TOO_MANY_REQUESTS
        {}
        let req = match *method {
            "get" => guesser.get(&url),
            _ => guesser.post(&url).json(&json!({})),
        };
        let answer = req.bearer_auth(common::ADMIN).send().await.unwrap();
        let refused = answer.status() == StatusCode::TOO_MANY_REQUESTS;
        let said = description["paths"][path][method]["responses"]["429"]["description"]
            .as_str()
            .is_some_and(|d| d == sut_server::openapi::THROTTLED_429);
        assert_eq!(
            refused,
            said,
            "{method} {path}: answered {} to the throttled address; the description {}",
            answer.status(),
            if said { "says 429" } else { "does not say 429" }
        );
        assert_eq!(
            said,
            sut_server::THROTTLED_ROUTES.contains(&(method, path)),
            "{method} {path}"
        );
    }
    // Another address is not affected.
    let r = post(&other, &stock, Some(common::ADMIN)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // One more try a second.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let r = post(&guesser, &stock, Some(common::ADMIN)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_jwt_reads_no_draw_at_the_coordinator_of_a_deployment() {
    // The finding: the coordinator of a deployment checks a JWT's signature only, so a revoked
    // one still read its owner's draws (new draws were refused: the token service consumes
    // their one-time tokens). Now the coordinator asks the token service before a read.
    let dir = tempfile::tempdir().unwrap();
    let role = |role: sut_server::Role, tune: Box<dyn FnOnce(&mut ServerConfig)>| {
        let mut cfg = common::config(&dir.path().join(format!("{}.db", role.name())));
        cfg.role = role;
        tune(&mut cfg);
        start(cfg, "127.0.0.1:0".parse().unwrap())
    };
    let wallet = role(sut_server::Role::Wallet, Box::new(|_| {}))
        .await
        .unwrap();
    let inventory = role(sut_server::Role::Inventory, Box::new(|_| {}))
        .await
        .unwrap();
    let token = role(sut_server::Role::Token, Box::new(|_| {}))
        .await
        .unwrap();
    let url = |s: &Server| format!("http://{}", s.addr);
    let (w, i, t) = (url(&wallet), url(&inventory), url(&token));
    let coordinator = role(
        sut_server::Role::Coordinator,
        Box::new(move |c| {
            c.wallet_url = Some(w);
            c.inventory_url = Some(i);
            c.token_url = Some(t);
        }),
    )
    .await
    .unwrap();
    let (wallet_api, inventory_api, token_api, coordinator_api) = (
        Api::new(wallet.addr),
        Api::new(inventory.addr),
        Api::new(token.addr),
        Api::new(coordinator.addr),
    );
    let (s, v) = wallet_api
        .post(
            "/admin/accounts",
            &json!({"user": 1, "count": 1, "balance_minor": 100}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = inventory_api
        .post("/admin/stock", &json!({"activity": 1, "units": 5}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let jwt = token_api.jwt(1).await;
    let once = token_api.once_token(1, 1).await;
    let client = reqwest::Client::new();
    let drawn: Value = client
        .post(format!("http://{}/lottery/draw", coordinator.addr))
        .bearer_auth(&jwt)
        .json(&json!({"activity": 1, "won": true, "once_token": once}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let handle = drawn["draw"].as_str().unwrap_or_else(|| panic!("{drawn}"));
    let read = || {
        client
            .get(format!(
                "http://{}/lottery/draws/{handle}",
                coordinator.addr
            ))
            .bearer_auth(&jwt)
            .send()
    };
    assert_eq!(read().await.unwrap().status(), StatusCode::OK);
    let (s, v) = token_api
        .post("/tokens/revoke", &json!({"token": jwt}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r = read().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let v: Value = r.json().await.unwrap();
    assert_eq!(field(&v), "authorization", "{v}");
    assert!(v["error"].as_str().unwrap().contains("revoked"), "{v}");
    // The operator still reads it.
    let (s, v) = coordinator_api
        .get(&format!("/lottery/draws/{handle}"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    drop((wallet_api, inventory_api, token_api, coordinator_api));
    for s in [coordinator, token, inventory, wallet] {
        s.shutdown().await.unwrap();
    }
}
