//! What the HTTP tests share: a server configuration with known secrets, and a client that
//! authenticates as the bench would — the admin secret on service routes, a user's JWT (from
//! `POST /tokens`) on the routes a user calls, and a fresh one-time token for each draw.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sut::lottery::Terms;
use sut_server::ServerConfig;

/// The admin secret of the test servers.
pub const ADMIN: &str = "test-admin-secret-0123456789";
/// The service credential of the test servers (the coordinator's, on the participant routes).
pub const SERVICE: &str = "test-service-credential-9876543210";
/// The JWT secret of the test servers.
pub const JWT_SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// The ticket price of the test servers' activities 1, 2 and 9 (activity 5 costs
/// [`PRICE_5_MINOR`]).
pub const PRICE_MINOR: u64 = 10;
/// The ticket price of activity 5.
pub const PRICE_5_MINOR: u64 = 100;

/// The activities the test servers register at start.
pub fn activities() -> Vec<(u64, Terms)> {
    vec![
        (1, Terms::always_open(PRICE_MINOR, 100)),
        (2, Terms::always_open(PRICE_MINOR, 100)),
        (5, Terms::always_open(PRICE_5_MINOR, 100)),
        (9, Terms::always_open(PRICE_MINOR, 100)),
    ]
}

/// A server configuration with the secrets above, the activities of [`activities`], forced
/// outcomes allowed (the tests choose draws' luck) and no practical per-user draw limit.
pub fn config(db: &Path) -> ServerConfig {
    let mut cfg = ServerConfig::new(db);
    cfg.activities = activities();
    cfg.jwt_secret = Some(JWT_SECRET.to_vec());
    cfg.admin_token = Some(ADMIN.to_owned());
    cfg.service_token = Some(SERVICE.to_owned());
    cfg.forced_outcomes = true;
    cfg.noop_delay = true;
    cfg.draw_rate_per_s = 1e6;
    cfg.draw_burst = 1_000_000;
    cfg.once_rate_per_s = 1e6;
    cfg.once_burst = 1_000_000;
    cfg
}

/// A client of one server.
pub struct Api {
    pub client: Client,
    pub base: String,
    jwts: Mutex<HashMap<u64, String>>,
}

/// Routes that take the admin secret.
fn admin_route(path: &str) -> bool {
    path.starts_with("/admin/")
        || path == "/tokens"
        || path == "/ledger"
        || path.starts_with("/lottery/draws/")
        || path == "/lottery/state"
        || path == "/metrics"
}

/// Routes that take the service credential.
fn service_route(path: &str) -> bool {
    path.starts_with("/tcc/branch")
}

/// Routes that take the JWT of the body's `user`.
fn user_route(path: &str) -> bool {
    path.starts_with("/tokens/once") || path == "/lottery/draw"
}

impl Api {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            // No idle connection is reused: the server may close one after answering early
            // (a 413 before the oversized body was read), and a request written onto it in
            // that instant fails with a broken pipe -- a client race, not the server's answer.
            client: Client::builder()
                .timeout(Duration::from_secs(20))
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            base: format!("http://{addr}"),
            jwts: Mutex::new(HashMap::new()),
        }
    }

    async fn call(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let r = req.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let mut req = self.client.get(format!("{}{path}", self.base));
        if admin_route(path) {
            req = req.bearer_auth(ADMIN);
        }
        self.call(req).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// Posts `body` with the credential its route takes (none if it names no user).
    pub async fn post_raw(&self, path: &str, body: String) -> (StatusCode, Value) {
        let bearer = if admin_route(path) {
            Some(ADMIN.to_owned())
        } else if service_route(path) {
            Some(SERVICE.to_owned())
        } else if user_route(path) {
            match serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["user"].as_u64())
            {
                Some(user) => Some(self.jwt(user).await),
                None => None,
            }
        } else {
            None
        };
        self.post_with(path, body, bearer.as_deref()).await
    }

    /// Posts `body` with exactly this bearer credential (or none).
    pub async fn post_with(
        &self,
        path: &str,
        body: String,
        bearer: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        self.call(req).await
    }

    /// A JWT for `user` (issued once per client).
    pub async fn jwt(&self, user: u64) -> String {
        if let Some(jwt) = self.jwts.lock().unwrap().get(&user) {
            return jwt.clone();
        }
        let (s, v) = self
            .post_with("/tokens", json!({"user": user}).to_string(), Some(ADMIN))
            .await;
        assert_eq!(s, StatusCode::OK, "POST /tokens: {v}");
        let jwt = v["token"].as_str().expect("token").to_owned();
        self.jwts.lock().unwrap().insert(user, jwt.clone());
        jwt
    }

    /// A fresh one-time token of `user` for lottery activity `activity`.
    pub async fn once_token(&self, user: u64, activity: u64) -> String {
        let (s, v) = self
            .post(
                "/tokens/once",
                &json!({"user": user, "activity": activity.to_string()}),
            )
            .await;
        assert!(s.is_success(), "POST /tokens/once: {v}");
        v["token"].as_str().expect("token").to_owned()
    }

    /// A draw as a real client makes it: the user's JWT, a one-time token for the activity.
    /// `body` has `user` and `activity` (and `price_minor`, maybe `won`).
    pub async fn draw(&self, body: &Value) -> (StatusCode, Value) {
        let user = body["user"].as_u64().expect("user");
        let activity = body["activity"].as_u64().expect("activity");
        let mut body = body.clone();
        body["once_token"] = json!(self.once_token(user, activity).await);
        self.post("/lottery/draw", &body).await
    }
}
