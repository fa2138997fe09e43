//! The authenticated draw path and the admin secret, refused the ways an attacker would try:
//! no JWT, a forged one, an expired one, `alg: none`, another user's; a replayed or foreign
//! one-time token; a client choosing its own luck; a user drawing too fast; admin routes without
//! the secret. Every refusal is a 4xx naming what is wrong and changes nothing: the ledger is
//! the same, and the one-time token a refused draw carried still admits a good draw.

use std::net::SocketAddr;
use std::path::Path;

use base64::Engine;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sut::clock::Now;
use sut::token::UserId;
use sut::token::jwt::{JwtConfig, SigningKey};
use sut_server::{Server, ServerConfig, start};

mod common;
use common::{ADMIN, Api, JWT_SECRET};

async fn server(db: &Path, tune: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut cfg = common::config(db);
    tune(&mut cfg);
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(cfg, listen).await.unwrap()
}

fn field(v: &Value) -> &str {
    v["field"].as_str().unwrap_or("<none>")
}

/// Accounts 1..=10 with 1,000 each, 10 units of stock in activity 1.
async fn seed(api: &Api) {
    let (s, v) = api
        .post(
            "/admin/accounts",
            &json!({"user": 1, "count": 10, "balance_minor": 1000}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = api
        .post("/admin/stock", &json!({"activity": 1, "units": 10}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// What a refusal must not change.
async fn ledger_sums(api: &Api) -> (Value, Value, Value) {
    let (s, v) = api.get("/ledger").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    (
        v["collected_minor"].clone(),
        v["participations"].clone(),
        v["accounts"].clone(),
    )
}

fn jwt_with(secret: &[u8], user: u64, now: Now) -> String {
    let key = SigningKey::new("sut-server", secret.to_vec()).unwrap();
    sut::token::jwt::issue(&key, &JwtConfig::default(), UserId(user), 7, now)
        .unwrap()
        .token
}

fn draw_body(once: &str) -> Value {
    json!({"activity": 1, "price_minor": 10, "once_token": once})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_needs_the_drawers_own_valid_jwt() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api).await;
    let before = ledger_sums(&api).await;
    let once = api.once_token(1, 1).await;
    let body = draw_body(&once).to_string();

    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let forged = jwt_with(b"another-secret-another-secret-0000", 1, Now::both(now_ms));
    let expired = jwt_with(JWT_SECRET, 1, Now::both(now_ms - 7_200_000));
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let unsigned = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(
            &json!({"sub": "1", "iss": "sut", "aud": "sut", "exp": now_ms / 1000 + 600,
                    "nbf": 0, "iat": now_ms / 1000, "jti": "x"})
        )
    );
    for (what, bearer) in [
        ("no JWT", None),
        ("a forged JWT", Some(forged.as_str())),
        ("an expired JWT", Some(expired.as_str())),
        ("an alg=none JWT", Some(unsigned.as_str())),
        ("not a JWT", Some("hello")),
    ] {
        let (s, v) = api.post_with("/lottery/draw", body.clone(), bearer).await;
        assert_eq!(
            (s, field(&v)),
            (StatusCode::UNAUTHORIZED, "authorization"),
            "{what}: {v}"
        );
    }
    // User 2's valid JWT drawing with user 1's one-time token, or naming user 1 in the body.
    let other = api.jwt(2).await;
    let (s, v) = api
        .post_with("/lottery/draw", body.clone(), Some(&other))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "user"), "{v}");
    let mut naming_1 = draw_body(&once);
    naming_1["user"] = json!(1);
    let (s, v) = api
        .post_with("/lottery/draw", naming_1.to_string(), Some(&other))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "user"), "{v}");

    assert_eq!(
        ledger_sums(&api).await,
        before,
        "no refusal changed the ledger"
    );
    // None of them consumed the one-time token: user 1's own draw goes through with it.
    let mine = api.jwt(1).await;
    let (s, v) = api.post_with("/lottery/draw", body, Some(&mine)).await;
    assert!(s.is_success(), "{v}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_time_token_admits_one_draw_of_its_user_and_activity() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api).await;
    let jwt = api.jwt(3).await;
    let once = api.once_token(3, 1).await;
    let (s, v) = api
        .post_with("/lottery/draw", draw_body(&once).to_string(), Some(&jwt))
        .await;
    assert!(s.is_success(), "{v}");
    let after_one = ledger_sums(&api).await;

    // Replayed: refused, and nothing more is collected.
    let (s, v) = api
        .post_with("/lottery/draw", draw_body(&once).to_string(), Some(&jwt))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::CONFLICT, "once_token"), "{v}");
    // Another activity's token.
    let (s, v) = api
        .post("/admin/stock", &json!({"activity": 2, "units": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let for_two = api.once_token(3, 2).await;
    let (s, v) = api
        .post_with("/lottery/draw", draw_body(&for_two).to_string(), Some(&jwt))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "once_token"), "{v}");
    // A token that was never issued.
    let made_up = "0123456789abcdef0123456789abcdef";
    let (s, v) = api
        .post_with("/lottery/draw", draw_body(made_up).to_string(), Some(&jwt))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "once_token"), "{v}");
    assert_eq!(ledger_sums(&api).await, after_one);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_luck_is_the_servers_and_a_fast_user_is_slowed() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |cfg| {
        cfg.forced_outcomes = false;
        cfg.draw_rate_per_s = 0.01;
        cfg.draw_burst = 1;
    })
    .await;
    let api = Api::new(srv.addr);
    seed(&api).await;
    let before = ledger_sums(&api).await;
    let jwt = api.jwt(4).await;
    let once = api.once_token(4, 1).await;
    let mut forced = draw_body(&once);
    forced["won"] = json!(true);
    let (s, v) = api
        .post_with("/lottery/draw", forced.to_string(), Some(&jwt))
        .await;
    assert_eq!((s, field(&v)), (StatusCode::FORBIDDEN, "won"), "{v}");
    assert_eq!(ledger_sums(&api).await, before);

    let (s, v) = api
        .post_with("/lottery/draw", draw_body(&once).to_string(), Some(&jwt))
        .await;
    assert!(s.is_success(), "the first draw is within the burst: {v}");
    let again = api.once_token(4, 2).await;
    let r = api
        .client
        .post(format!("{}/lottery/draw", api.base))
        .bearer_auth(&jwt)
        .json(&draw_body(&again))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "{retry_after}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(field(&v), "user", "{v}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_refuse_without_the_secret_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api).await;
    let before = ledger_sums(&api).await;
    let calls = [
        (
            "/admin/accounts",
            json!({"user": 50, "balance_minor": 1_000_000}),
        ),
        ("/admin/stock", json!({"activity": 9, "units": 5})),
        ("/admin/tags", json!({"tag": "stolen", "step": 10})),
        ("/tokens", json!({"user": 1})),
        ("/tcc/branch", json!({"branch": "Wallet", "msg": {}})),
        ("/tcc/branches", json!({"messages": []})),
    ];
    for (path, body) in &calls {
        for bearer in [None, Some("wrong-secret"), Some(&*format!("{ADMIN}x"))] {
            let (s, v) = api.post_with(path, body.to_string(), bearer).await;
            assert_eq!(
                (s, field(&v)),
                (StatusCode::UNAUTHORIZED, "authorization"),
                "POST {path} with {bearer:?}: {v}"
            );
        }
    }
    for path in ["/admin/dead-letters", "/lottery/state"] {
        let r = api
            .client
            .get(format!("{}{path}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "GET {path}");
    }
    assert_eq!(
        ledger_sums(&api).await,
        before,
        "no account or stock was added"
    );
    let (s, v) = api.get("/id/stolen").await;
    assert_eq!((s, field(&v)), (StatusCode::NOT_FOUND, "tag"), "{v}");
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_batch_runs_in_order_and_answers_each_message() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir.path().join("ids.db"), |_| {}).await;
    let api = Api::new(srv.addr);
    seed(&api).await;
    let draw =
        |xid: u64| json!({"xid": xid, "user": 1, "activity": 1, "price_minor": 10, "won": false});
    let msg = |phase: &str, xid: u64| json!({"branch": "Wallet", "msg": {"phase": phase, "draw": draw(xid)}});
    // A Try and its Cancel in one batch (the Cancel must see the Try), and a Cancel with no
    // Try before it (an empty rollback, remembered by the fence).
    let batch = json!({"messages": [msg("Try", 900), msg("Cancel", 900), msg("Cancel", 901)]});
    let (s, v) = api.post("/tcc/branches", &batch).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let replies = v["replies"].as_array().expect("replies");
    let got: Vec<(&str, u64)> = replies
        .iter()
        .map(|r| {
            (
                r["phase"].as_str().unwrap(),
                r["draw"]["xid"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [("Try", 900), ("Cancel", 900), ("Cancel", 901)],
        "one reply per message, in order: {v}"
    );
    let outcomes: Vec<&Value> = replies.iter().map(|r| &r["outcome"]).collect();
    assert_eq!(
        outcomes,
        [
            &json!({"Ok": "Applied"}),
            &json!({"Ok": "Applied"}),
            &json!({"Ok": "EmptyRollback"})
        ],
        "the Cancel undid the Try of its batch; the other was an empty rollback: {v}"
    );
    let (s, ledger) = api.get("/ledger").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        ledger["frozen_minor"], 0,
        "the Cancel released it: {ledger}"
    );
    // A Try for draw 901 now meets the fence of its empty rollback.
    let (s, v) = api
        .post("/tcc/branches", &json!({"messages": [msg("Try", 901)]}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(
        v["replies"][0]["outcome"].get("Err").is_some(),
        "a Try after its Cancel is refused: {v}"
    );
    // Bounds: no message, or more than 48, is refused and runs nothing.
    for n in [0, 49] {
        let messages: Vec<Value> = (0..n).map(|i| msg("Try", 1000 + i)).collect();
        let (s, v) = api
            .post("/tcc/branches", &json!({ "messages": messages }))
            .await;
        assert_eq!(
            (s, field(&v)),
            (StatusCode::BAD_REQUEST, "messages"),
            "{n}: {v}"
        );
    }
    let (_, after) = api.get("/ledger").await;
    assert_eq!(after["frozen_minor"], 0, "{after}");
    srv.shutdown().await.unwrap();
}
