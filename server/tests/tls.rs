//! TLS between the processes of a deployment: the participants and the token service listen
//! with a certificate, the coordinator calls them over `https://` trusting it (`--tls-ca-file`),
//! and a draw crosses all of them. Plain HTTP to a TLS listener is refused, and a coordinator
//! that does not trust the certificate cannot reach the participants (its draws cancel or wait
//! for compensation, never confirm).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sut_server::{Role, Server, ServerConfig, start};

mod common;
use common::{ADMIN, JWT_SECRET, SERVICE};

/// A self-signed certificate for 127.0.0.1 and localhost: (certificate file, key file).
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let generated =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("a self-signed certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

async fn role(dir: &Path, role: Role, tune: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut cfg = common::config(&dir.join(format!("{}.db", role.name())));
    cfg.role = role;
    tune(&mut cfg);
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(cfg, listen).await.unwrap()
}

async fn post(client: &reqwest::Client, url: String, bearer: &str, body: Value) -> (u16, Value) {
    let r = client
        .post(url)
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The wallet, inventory and token service over TLS, and a coordinator calling them; the
/// coordinator trusts the certificate when `trusted`.
async fn deployment(dir: &Path, cert: &Path, key: &Path, trusted: bool) -> Vec<Server> {
    let tls = |c: &mut ServerConfig| c.tls = Some((cert.to_owned(), key.to_owned()));
    let wallet = role(dir, Role::Wallet, tls).await;
    let inventory = role(dir, Role::Inventory, tls).await;
    let token = role(dir, Role::Token, tls).await;
    let https = |s: &Server| format!("https://{}", s.addr);
    let (w, i, t) = (https(&wallet), https(&inventory), https(&token));
    let coordinator = role(dir, Role::Coordinator, |c| {
        c.wallet_url = Some(w);
        c.inventory_url = Some(i);
        c.token_url = Some(t);
        c.participant_timeout_ms = 300;
        c.tls_ca_file = trusted.then(|| cert.to_owned());
    })
    .await;
    vec![wallet, inventory, token, coordinator]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_crosses_every_process_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let servers = deployment(dir.path(), &cert, &key, true).await;
    let (wallet, inventory, token, coordinator) =
        (&servers[0], &servers[1], &servers[2], &servers[3]);
    let pem = std::fs::read(&cert).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let https = |s: &Server, path: &str| format!("https://{}{path}", s.addr);
    let (s, v) = post(
        &client,
        https(wallet, "/admin/accounts"),
        ADMIN,
        json!({"user": 1, "count": 2, "balance_minor": 100}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = post(
        &client,
        https(inventory, "/admin/stock"),
        ADMIN,
        json!({"activity": 1, "units": 5}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(&client, https(token, "/tokens"), ADMIN, json!({"user": 1})).await;
    assert_eq!(s, 200, "{v}");
    let jwt = v["token"].as_str().unwrap().to_owned();
    let (s, v) = post(
        &client,
        https(token, "/tokens/once"),
        &jwt,
        json!({"user": 1, "activity": "1"}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let once = v["token"].as_str().unwrap().to_owned();
    // The coordinator listens in plain HTTP here; its calls out go over TLS.
    let (s, v) = post(
        &reqwest::Client::new(),
        format!("http://{}/lottery/draw", coordinator.addr),
        &jwt,
        json!({"activity": 1, "won": true, "once_token": once}),
    )
    .await;
    assert_eq!((s, v["outcome"].as_str()), (200, Some("confirmed")), "{v}");
    // Plain HTTP to a TLS listener gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/health", wallet.addr))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != StatusCode::OK);
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_does_not_trust_the_certificate_confirms_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let servers = deployment(dir.path(), &cert, &key, false).await;
    let coordinator = &servers[3];
    // Its gate cannot even reach the token service: the draw is refused as unavailable.
    let jwt = {
        let key = sut::token::jwt::SigningKey::new("sut-server", JWT_SECRET.to_vec()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        sut::token::jwt::issue(
            &key,
            &sut::token::jwt::JwtConfig::default(),
            sut::token::UserId(1),
            1,
            sut::clock::Now::both(u64::try_from(now).unwrap()),
        )
        .unwrap()
        .token
    };
    let (s, v) = post(
        &reqwest::Client::new(),
        format!("http://{}/lottery/draw", coordinator.addr),
        &jwt,
        json!({"activity": 1, "won": false, "once_token": "0123456789abcdef0123456789abcdef"}),
    )
    .await;
    assert_eq!(
        s, 503,
        "an untrusted certificate is an unreachable service: {v}"
    );
    let _ = SERVICE;
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

/// Sessions of database `db` that use TLS, and all of them.
async fn ssl_sessions(admin_url: &str, db: &str) -> (i64, i64) {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .expect("connect as the admin");
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.datname = $1",
            &[&db],
        )
        .await
        .expect("pg_stat_ssl");
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
async fn the_server_speaks_tls_to_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let generated =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let ca = dir.path().join("pg-ca.pem");
    std::fs::write(&ca, generated.cert.pem()).unwrap();
    let (cert_pem, key_pem) = (generated.cert.pem(), generated.signing_key.serialize_pem());
    let pg = tokio::task::spawn_blocking(move || {
        let mut pg = chaos::Postgres::start().expect("start PostgreSQL");
        pg.enable_tls(&cert_pem, &key_pem).expect("TLS on");
        pg.create_database("tls").expect("create database");
        pg
    })
    .await
    .unwrap();
    let url = format!("{}&sslmode=require", pg.url_for("tls"));
    let mut cfg = common::config(&dir.path().join("unused.db"));
    cfg.db = url.parse().unwrap();
    cfg.tls_ca_file = Some(ca);
    let srv = start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let api = common::Api::new(srv.addr);
    let (s, v) = api
        .post("/admin/accounts", &json!({"user": 1, "balance_minor": 50}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = api
        .post("/admin/stock", &json!({"activity": 1, "units": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = api
        .draw(&json!({"user": 1, "activity": 1, "won": true}))
        .await;
    assert_eq!(
        (s, v["outcome"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{v}"
    );
    let (encrypted, sessions) = ssl_sessions(&pg.url_for("postgres"), "tls").await;
    assert!(sessions > 0, "the server holds sessions to its database");
    assert_eq!(encrypted, sessions, "every one of them over TLS");
    srv.shutdown().await.unwrap();
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}
