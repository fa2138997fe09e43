//! The goose workloads (one scenario, one transaction per workload; each transaction is one
//! *operation* of the schedule) and their setup through the server's admin routes.
//!
//! An operation may be several requests (issue then verify a token; issue then consume a
//! one-time token). The schedule (see [`crate::stats::Schedule`]) paces operations. An
//! operation sent late because its user was still waiting for its previous answer is charged
//! that wait ([`Origin::server_lag`], coordinated-omission correction); every request of the
//! operation is, so a follow-up's corrected latency is its own time plus that lag. Lateness of
//! the client itself (timer granularity, scheduling) is not the server's and is reported apart
//! ([`Shared::send_lateness`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use goose::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::conn;
use crate::stats::{EndpointRecorder, LatenessRecorder, Schedule};

/// A workload and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `GET /id/{tag}`.
    Id,
    /// `GET /id/{tag}/batch?n=10`.
    Batch,
    /// `GET /snowflake`.
    Snowflake,
    /// `POST /tokens` then `POST /tokens/verify`.
    Tokens,
    /// `POST /tokens/once` then `POST /tokens/once/consume` (every fourth consumed twice).
    Once,
    /// `POST /lottery/draw`.
    Lottery,
}

/// Workload names and descriptions ([`crate::catalog`]).
pub const CATALOG: &[(&str, &str)] = &[
    (
        "id",
        "segment IDs: GET /id/{tag} (4 of 5 operations) and GET /id/{tag}/batch?n=10 (1 of 5)",
    ),
    (
        "id-single",
        "segment IDs, single only: GET /id/{tag} (for comparisons with wrk/oha on one URL)",
    ),
    ("snowflake", "Snowflake IDs: GET /snowflake"),
    (
        "tokens",
        "JWT issue then verify: POST /tokens, POST /tokens/verify",
    ),
    (
        "once",
        "one-time token issue then consume: POST /tokens/once, POST /tokens/once/consume \
         (every 4th consumed a second time, which must be refused)",
    ),
    (
        "lottery",
        "TCC lottery draws: POST /lottery/draw, each on a fresh (user, activity) pair",
    ),
    (
        "crash",
        "what survives kill -9, per 10 operations: 5 id, 1 batch, 2 snowflake, 2 lottery",
    ),
    (
        "mixed",
        "weighted mix per 10 operations: 4 id, 1 batch, 2 snowflake, 1 tokens, 1 once, 1 lottery",
    ),
];

/// How many of every `total()` consecutive operations are of each kind. Slots are dealt in
/// this order (`slot % total`): `id`, `batch`, `snowflake`, `tokens`, `once`, `lottery`, so
/// the mix `4/1/2/1/1/1` sends slots 0-3 single IDs, 4 a batch, 5-6 Snowflake, and so on.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// `GET /id/{tag}`.
    pub id: u32,
    /// `GET /id/{tag}/batch?n=10`.
    pub batch: u32,
    /// `GET /snowflake`.
    pub snowflake: u32,
    /// `POST /tokens` then `POST /tokens/verify`.
    pub tokens: u32,
    /// `POST /tokens/once` then consume (every fourth twice).
    pub once: u32,
    /// `POST /lottery/draw`.
    pub lottery: u32,
}

/// Largest sum of a [`Mix`]'s weights.
pub const MIX_TOTAL_MAX: u64 = 10_000;

impl Mix {
    /// The mix of a catalog workload; `None` for an unknown name.
    #[must_use]
    pub fn named(workload: &str) -> Option<Self> {
        let m = |id, batch, snowflake, tokens, once, lottery| Self {
            id,
            batch,
            snowflake,
            tokens,
            once,
            lottery,
        };
        Some(match workload {
            "id" => m(4, 1, 0, 0, 0, 0),
            "id-single" => m(1, 0, 0, 0, 0, 0),
            "snowflake" => m(0, 0, 1, 0, 0, 0),
            "tokens" => m(0, 0, 0, 1, 0, 0),
            "once" => m(0, 0, 0, 0, 1, 0),
            "lottery" => m(0, 0, 0, 0, 0, 1),
            "crash" => m(5, 1, 2, 0, 0, 2),
            "mixed" => m(4, 1, 2, 1, 1, 1),
            _ => return None,
        })
    }

    fn weights(&self) -> [(u32, Kind); 6] {
        [
            (self.id, Kind::Id),
            (self.batch, Kind::Batch),
            (self.snowflake, Kind::Snowflake),
            (self.tokens, Kind::Tokens),
            (self.once, Kind::Once),
            (self.lottery, Kind::Lottery),
        ]
    }

    /// Sum of the weights.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.weights().iter().map(|(w, _)| u64::from(*w)).sum()
    }

    /// The kind of the `slot`-th operation (global slot number); `None` if every weight is 0.
    #[must_use]
    pub fn kind_of(&self, slot: u64) -> Option<Kind> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let mut at = slot % total;
        for (w, kind) in self.weights() {
            if at < u64::from(w) {
                return Some(kind);
            }
            at -= u64::from(w);
        }
        None
    }

    /// Whether the mix sends operations of `kind`.
    #[must_use]
    pub fn has(&self, kind: Kind) -> bool {
        self.weights().iter().any(|(w, k)| *k == kind && *w > 0)
    }

    /// Checks the weights: at least one positive, sum at most [`MIX_TOTAL_MAX`].
    ///
    /// # Errors
    /// Why not, in words.
    pub fn validate(&self) -> Result<(), String> {
        match self.total() {
            0 => Err("every weight is 0".to_owned()),
            t if t > MIX_TOTAL_MAX => Err(format!("weights sum to {t}, over {MIX_TOTAL_MAX}")),
            _ => Ok(()),
        }
    }

    /// Which setups the mix needs: (a segment tag, lottery accounts and stock).
    #[must_use]
    pub fn needs(&self) -> (bool, bool) {
        (
            self.has(Kind::Id) || self.has(Kind::Batch),
            self.has(Kind::Lottery),
        )
    }
}

/// The kind of the `slot`-th operation (global slot number) of a catalog workload; `None` for
/// an unknown workload name.
#[must_use]
pub fn kind_of(workload: &str, slot: u64) -> Option<Kind> {
    Mix::named(workload)?.kind_of(slot)
}

/// Accounts opened for a lottery run; draw `n` uses user `user_base + n % LOTTERY_USERS` and
/// activity `activity_base + n / LOTTERY_USERS`, so no pair is drawn twice. Each user logs in
/// once and keeps its JWT, as a real client does, and draws once every `LOTTERY_USERS` draws
/// (well under the servers' per-user draw rate at the rates this machine reaches).
pub const LOTTERY_USERS: u64 = 2_000;
/// Draw price.
pub const PRICE_MINOR: u64 = 1;
/// Upper bound on the draw rate planned for (durable draws measured at ~15-19k/s here).
pub const LOTTERY_RATE_MAX: f64 = 40_000.0;

/// The lottery's plan for one run.
#[derive(Clone, Copy, Debug)]
pub struct LotteryPlan {
    pub user_base: u64,
    pub activity_base: u64,
    pub activities: u64,
}

/// Everything the users share.
#[derive(Debug)]
pub struct Shared {
    /// What the operations are.
    pub mix: Mix,
    pub users: u64,
    pub schedule: Option<Schedule>,
    /// Origin of [`Shared::last_done`] (before `t0`).
    pub epoch: Instant,
    /// Slot 0 of the schedule.
    pub t0: Instant,
    /// Warm-up ends: latency counts from here.
    pub measure_start: Instant,
    /// No operation is started after this.
    pub end: Instant,
    pub tag: String,
    pub lottery: Option<LotteryPlan>,
    /// The registered activity the one-time token operations ask tokens for.
    pub once_activity: u64,
    /// Per-user operation counter.
    pub iters: Vec<AtomicU64>,
    /// Per user: when its last request was answered, in ns since `epoch` plus 1 (0: none).
    pub last_done: Vec<AtomicU64>,
    pub recorders: Mutex<BTreeMap<&'static str, EndpointRecorder>>,
    /// Constant rate only: how late the client itself sent operations (measured send minus
    /// intended send, minus the part spent waiting for the user's previous answer), in us.
    pub send_lateness: Mutex<LatenessRecorder>,
    pub segment_ids: Mutex<Vec<u64>>,
    pub snowflake_ids: Mutex<Vec<u64>>,
    /// The next ID operation's turn (round robin over the ID servers).
    pub id_turn: AtomicU64,
    /// Whether each user's IDs from each server went up (see [`IdOrder`]).
    pub id_order: Mutex<IdOrder>,
    /// The admin secret: `POST /tokens` (the bench plays the identity provider that issues
    /// users' JWTs) takes it.
    pub admin_token: Option<String>,
    /// Each lottery user's JWT, issued on its first draw.
    pub jwts: Mutex<BTreeMap<u64, String>>,
    pub once_accepted: Mutex<sut::check::AtMostOnce<String, u64>>,
    /// Unique number per token/once/draw operation.
    pub seq: AtomicU64,
    /// Base for token users (distinct per run).
    pub user_base: u64,
    /// Draws answered 200 (confirmed) to a client.
    pub draws_confirmed: AtomicU64,
    /// The request URLs, parsed once.
    pub urls: Urls,
    /// Plain-HTTP target: every timed request goes on the user's raw connection
    /// ([`Shared::conns`]). `None` (https): through the user's reqwest client.
    pub target: Option<conn::Target>,
    /// Per user: its raw HTTP/1.1 keep-alive connection (with [`Shared::target`]).
    pub conns: Vec<Mutex<conn::Conn>>,
    /// Per user: its HTTP client ([`user_client`]), installed as the goose user's
    /// `GooseUser::client` before its first operation (https targets only).
    pub clients: Vec<reqwest::Client>,
}

/// Timeout of every request of the load (answer and body).
pub const REQUEST_TIMEOUT_S: u64 = 10;

/// The HTTP client of one goose user for an https target (a plain-HTTP target gets raw
/// connections instead, [`crate::conn`]): one keep-alive connection pool per user (as
/// `oha -c N` has N connections), no proxy lookup, no redirects, no retries, no decompression, and no
/// root certificates loaded (the target is plain HTTP; loading the system's roots took ~5 ms
/// of CPU per client). goose still schedules the users and runs the transactions; the timed
/// requests go straight to this client (see [`call`]) instead of through `GooseUser::request`,
/// whose per-request bookkeeping (URL joined and re-parsed, a `GooseRequestMetric` with its
/// strings) served only goose's own metrics, which this crate does not use.
///
/// # Errors
/// reqwest cannot build the client (no TLS provider, say).
pub fn user_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(REQUEST_TIMEOUT_S))
        .no_proxy()
        .no_gzip()
        .redirect(reqwest::redirect::Policy::none())
        .retry(reqwest::retry::never())
        .tls_certs_only(std::iter::empty())
        .tcp_nodelay(true)
        .build()
}

/// One request target: the full URL (reqwest) and its path and query (raw connections).
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub url: reqwest::Url,
    pub path: http::Uri,
}

/// The ID endpoints of one ID server.
#[derive(Clone, Debug)]
pub struct IdEndpoints {
    pub id: Endpoint,
    pub batch: Endpoint,
    pub snowflake: Endpoint,
}

/// The URLs of the workload's requests, parsed once per run.
#[derive(Clone, Debug)]
pub struct Urls {
    /// The base URL (`http://host:port`; in a deployment, the coordinator's).
    pub base: reqwest::Url,
    /// Each ID server's endpoints; operations take them in turn, as a round-robin load
    /// balancer would.
    pub id_servers: Vec<IdEndpoints>,
    pub tokens: Endpoint,
    pub tokens_verify: Endpoint,
    pub once: Endpoint,
    pub once_consume: Endpoint,
    pub draw: Endpoint,
}

/// `base` + `path` as an [`Endpoint`].
fn endpoint(base: &str, path: &str) -> Result<Endpoint, String> {
    let text = format!("{}{path}", base.trim_end_matches('/'));
    let url = reqwest::Url::parse(&text).map_err(|e| format!("`{text}`: {e}"))?;
    let mut origin_form = url.path().to_owned();
    if let Some(q) = url.query() {
        origin_form.push('?');
        origin_form.push_str(q);
    }
    let path = origin_form
        .parse::<http::Uri>()
        .map_err(|e| format!("`{text}`: path `{origin_form}`: {e}"))?;
    Ok(Endpoint { url, path })
}

impl IdEndpoints {
    fn new(base: &str, tag: &str) -> Result<Self, String> {
        Ok(Self {
            id: endpoint(base, &format!("/id/{tag}"))?,
            batch: endpoint(base, &format!("/id/{tag}/batch?n=10"))?,
            snowflake: endpoint(base, "/snowflake")?,
        })
    }
}

impl Urls {
    /// The URLs under `base` (`http://host:port`) for segment tag `tag`.
    ///
    /// # Errors
    /// `base` with `tag` does not make a URL (the message names the failing one).
    pub fn new(base: &str, tag: &str) -> Result<Self, String> {
        Self::deployment(&[base.to_owned()], base, base, tag)
    }

    /// The URLs of a deployment: IDs spread over `id_servers`, tokens from `tokens`, draws
    /// through `coordinator`.
    ///
    /// # Errors
    /// A base with `tag` does not make a URL (the message names the failing one), or there is
    /// no ID server.
    pub fn deployment(
        id_servers: &[String],
        tokens: &str,
        coordinator: &str,
        tag: &str,
    ) -> Result<Self, String> {
        if id_servers.is_empty() {
            return Err("no ID server".to_owned());
        }
        let coordinator = coordinator.trim_end_matches('/');
        Ok(Self {
            base: reqwest::Url::parse(coordinator).map_err(|e| format!("`{coordinator}`: {e}"))?,
            id_servers: id_servers
                .iter()
                .map(|b| IdEndpoints::new(b, tag))
                .collect::<Result<_, _>>()?,
            tokens: endpoint(tokens, "/tokens")?,
            tokens_verify: endpoint(tokens, "/tokens/verify")?,
            once: endpoint(tokens, "/tokens/once")?,
            once_consume: endpoint(tokens, "/tokens/once/consume")?,
            draw: endpoint(coordinator, "/lottery/draw")?,
        })
    }

    /// The ID server the `n`-th ID operation goes to (round robin) and its endpoints.
    #[must_use]
    pub fn id_server(&self, n: u64) -> (usize, &IdEndpoints) {
        let i = usize::try_from(n % self.id_servers.len() as u64).unwrap_or(0);
        (i, &self.id_servers[i])
    }
}

/// Marks a goose user whose client has been replaced by its [`user_client`].
#[derive(Clone, Copy, Debug)]
struct ClientInstalled;

/// How much earlier than its intended time an operation may be sent (timer granularity).
pub const TIMER_SLACK_MS: u64 = 1;

/// Pause of a user after a refused connection (not counted in any latency).
pub const CONNECT_BACKOFF_MS: u64 = 10;

/// Error class of a status code (`None` for success).
#[must_use]
pub fn status_class(status: u16) -> Option<&'static str> {
    match status {
        200..=299 => None,
        100..=199 => Some("http_1xx"),
        300..=399 => Some("http_3xx"),
        400..=499 => Some("http_4xx"),
        _ => Some("http_5xx"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Body<'a> {
    Get,
    Post(&'a Value),
    /// A POST with `Authorization: Bearer <credential>`.
    PostAs(&'a Value, &'a str),
}

/// When an operation was due and how much of its lateness the server caused.
#[derive(Clone, Copy, Debug)]
pub struct Origin {
    /// The user (index into [`Shared::last_done`]).
    pub user: usize,
    /// The intended send time of the operation (closed loop: when the user got to it).
    pub intended: Instant,
    /// The part of the operation's lateness spent waiting for this user's previous answer
    /// (zero when it was early or on time, and in closed loop): the coordinated-omission lag
    /// that the corrected latency adds to each of the operation's requests.
    pub server_lag: Duration,
}

impl Origin {
    /// The origin of an operation intended at `intended` and sent at `sent` by a user whose
    /// previous answer came at `busy_until`: of the lateness `sent - intended`, only the part
    /// before `busy_until` was caused by the server (the user was waiting for it); the rest is
    /// the client's own (timer granularity, scheduling, a starved CPU) and is not latency of
    /// the server.
    #[must_use]
    pub fn new(user: usize, intended: Instant, sent: Instant, busy_until: Option<Instant>) -> Self {
        let server_lag = busy_until.map_or(Duration::ZERO, |b| {
            b.min(sent).saturating_duration_since(intended)
        });
        Self {
            user,
            intended,
            server_lag,
        }
    }
}

/// An ID that did not exceed the one the same user got from the same server before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdRegression {
    /// `segment` or `snowflake`.
    pub kind: &'static str,
    /// The user.
    pub user: usize,
    /// Segment IDs: the server (index into [`Urls::id_servers`]); Snowflake IDs: the worker
    /// id decoded from the ID.
    pub server: usize,
    /// Segment IDs: the allocator incarnation that issued them, when the server says.
    pub incarnation: Option<u64>,
    /// The earlier ID.
    pub before: u64,
    /// The ID that did not exceed it.
    pub after: u64,
}

/// Regressions kept for the report.
pub const ID_REGRESSIONS_KEPT: usize = 16;

/// Where IDs come from, for their order: a server and the allocator incarnation it names
/// (segment IDs), or a Snowflake worker id and `None`.
pub type IdSource = (usize, Option<u64>);

/// Each (kind, user, server)'s highest ID so far, and the IDs that did not exceed it.
#[derive(Clone, Debug, Default)]
pub struct IdOrder {
    rising: sut::check::Rising<(&'static str, usize, IdSource), u64, ()>,
    /// The first [`ID_REGRESSIONS_KEPT`] IDs that did not go up.
    pub regressions: Vec<IdRegression>,
}

impl IdOrder {
    /// Checks that `ids` (in answer order) exceed every ID user `user` got from `source` before
    /// (a server and the allocator incarnation it names, or a Snowflake worker id; a user's
    /// requests are sequential, so a source that keeps its promise answers each higher).
    pub fn note(&mut self, kind: &'static str, user: usize, source: IdSource, ids: &[u64]) {
        let (server, incarnation) = source;
        for &id in ids {
            if let Some(back) = self.rising.observe((kind, user, source), id, ())
                && self.regressions.len() < ID_REGRESSIONS_KEPT
            {
                self.regressions.push(IdRegression {
                    kind,
                    user,
                    server,
                    incarnation,
                    before: back.highest,
                    after: id,
                });
            }
        }
    }
}

impl Shared {
    /// [`IdOrder::note`] on the run's record.
    pub fn note_id_order(&self, kind: &'static str, user: usize, source: IdSource, ids: &[u64]) {
        lock(&self.id_order).note(kind, user, source, ids);
    }

    /// When user `k`'s last request was answered.
    #[must_use]
    pub fn last_done_at(&self, k: usize) -> Option<Instant> {
        let ns = self.last_done.get(k)?.load(Ordering::Relaxed);
        (ns > 0).then(|| self.epoch + Duration::from_nanos(ns - 1))
    }

    fn set_last_done(&self, k: usize, at: Instant) {
        if let Some(slot) = self.last_done.get(k) {
            let ns = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
                .unwrap_or(u64::MAX - 1);
            slot.store(ns + 1, Ordering::Relaxed);
        }
    }
}

/// One timed request, sent on the user's raw connection ([`crate::conn`]; with an https
/// target, with the goose user's client, see [`user_client`]). Returns the
/// status and the body decoded as `T` (`None` if it does not decode), or `None` on a
/// transport error. Latency is recorded three ways: uncorrected (from this request's actual
/// send), corrected (plus the operation's `server_lag`), and from the schedule (from the
/// intended time: the strict wrk2 figure, which also counts the client's own lateness).
async fn call<T: DeserializeOwned>(
    user: &mut GooseUser,
    sh: &Shared,
    name: &'static str,
    endpoint: &Endpoint,
    body: Body<'_>,
    origin: &Origin,
    ok_statuses: &[u16],
) -> Option<(u16, Option<T>)> {
    // serialized before the clock starts (as reqwest's `.json` did, but outside the timing)
    let (value, bearer) = match body {
        Body::Get => (None, None),
        Body::Post(v) => (Some(v), None),
        Body::PostAs(v, credential) => (Some(v), Some(credential)),
    };
    let json = match value.map(serde_json::to_vec) {
        None => None,
        Some(Ok(bytes)) => Some(bytes::Bytes::from(bytes)),
        Some(Err(_)) => return None, // a `Value` always serializes
    };
    let start = Instant::now();
    let answer = send(user, sh, endpoint, (json, bearer), origin.user).await;
    let (result, class) = match answer {
        Ok((status, bytes)) => {
            let v: Option<T> = serde_json::from_slice(&bytes).ok();
            let class = if ok_statuses.contains(&status) {
                None
            } else {
                status_class(status).or(Some("http_unexpected"))
            };
            (Some((status, v)), class)
        }
        Err(class) => (None, Some(class)),
    };
    let done = Instant::now();
    sh.set_last_done(origin.user, done);
    record_latency(sh, name, origin, (start, done), class);
    if class == Some("connect") {
        // the server is down (killed, restarting): do not spin on refused connections
        tokio::time::sleep(Duration::from_millis(CONNECT_BACKOFF_MS)).await;
    }
    result
}

/// Sends on user `k`'s raw connection (plain HTTP), else through its reqwest client: the
/// status and body, or the error class.
async fn send(
    user: &GooseUser,
    sh: &Shared,
    endpoint: &Endpoint,
    (json, bearer): (Option<bytes::Bytes>, Option<&str>),
    k: usize,
) -> Result<(u16, bytes::Bytes), &'static str> {
    match (&sh.target, sh.conns.get(k)) {
        (Some(target), Some(slot)) => {
            // the user's connection, out of its slot while in use (one operation at a time
            // per user, so nobody else waits for it)
            let mut c = std::mem::take(&mut *lock(slot));
            let method = if json.is_some() {
                http::Method::POST
            } else {
                http::Method::GET
            };
            let timeout = Duration::from_secs(REQUEST_TIMEOUT_S);
            let r = c
                .send(target, method, &endpoint.path, (json, bearer), timeout)
                .await
                .map_err(conn::Failure::class);
            *lock(slot) = c;
            r
        }
        _ => reqwest_call(user, &endpoint.url, json, bearer).await,
    }
}

/// Records an operation intended within the measured window: uncorrected (from its send at
/// `start`), corrected (plus the server's lag) and from the schedule, until `done`.
fn record_latency(
    sh: &Shared,
    name: &'static str,
    origin: &Origin,
    (start, done): (Instant, Instant),
    class: Option<&'static str>,
) {
    let intended = origin.intended;
    if intended >= sh.measure_start && intended < sh.end {
        let at_ms = intended.duration_since(sh.measure_start).as_millis() as u64;
        let uncorrected = done.duration_since(start).as_micros() as u64;
        let corrected = uncorrected + origin.server_lag.as_micros() as u64;
        let from_schedule = done.saturating_duration_since(intended).as_micros() as u64;
        lock(&sh.recorders).entry(name).or_default().record(
            at_ms,
            corrected,
            uncorrected,
            from_schedule,
            class,
        );
    }
}

/// One request through the goose user's reqwest client (https targets): the status and body,
/// or the error class.
async fn reqwest_call(
    user: &GooseUser,
    url: &reqwest::Url,
    json: Option<bytes::Bytes>,
    bearer: Option<&str>,
) -> Result<(u16, bytes::Bytes), &'static str> {
    let mut request = match json {
        None => user.client.get(url.clone()),
        Some(b) => user
            .client
            .post(url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(b),
    };
    if let Some(credential) = bearer {
        request = request.bearer_auth(credential);
    }
    match request.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            match resp.bytes().await {
                Ok(bytes) => Ok((status, bytes)),
                Err(e) if e.is_timeout() => Err("timeout"),
                Err(_) => Err("body"),
            }
        }
        Err(e) if e.is_timeout() => Err("timeout"),
        Err(e) if e.is_connect() => Err("connect"),
        Err(e) if e.is_builder() => Err("client"),
        Err(_) => Err("transport"),
    }
}

/// Endpoint names (the report's `EndpointStats::name`).
pub mod names {
    pub const ID: &str = "GET /id/{tag}";
    pub const BATCH: &str = "GET /id/{tag}/batch?n=10";
    pub const SNOWFLAKE: &str = "GET /snowflake";
    pub const TOKEN_ISSUE: &str = "POST /tokens";
    pub const TOKEN_VERIFY: &str = "POST /tokens/verify";
    pub const ONCE_ISSUE: &str = "POST /tokens/once";
    pub const ONCE_CONSUME: &str = "POST /tokens/once/consume";
    pub const ONCE_REPLAY: &str = "POST /tokens/once/consume (replay, 409 expected)";
    pub const DRAW: &str = "POST /lottery/draw";
    pub const LOGIN: &str = "POST /tokens (login)";
    pub const DRAW_ONCE: &str = "POST /tokens/once (draw)";
}

/// `{"id": N}` of `GET /id/{tag}` and `GET /snowflake`.
#[derive(serde::Deserialize)]
struct IdAnswer {
    id: u64,
    /// The issuing allocator's incarnation (absent from servers that do not say).
    #[serde(default)]
    instance: Option<u64>,
}

/// `{"ids": [..]}` of `GET /id/{tag}/batch`.
#[derive(serde::Deserialize)]
struct IdsAnswer {
    ids: Vec<u64>,
    #[serde(default)]
    instance: Option<u64>,
}

async fn operation(user: &mut GooseUser, sh: &Shared, kind: Kind, lag: &Origin) {
    let (server, urls) = sh
        .urls
        .id_server(sh.id_turn.fetch_add(1, Ordering::Relaxed));
    match kind {
        Kind::Id => {
            if let Some((200, Some(IdAnswer { id, instance }))) =
                call(user, sh, names::ID, &urls.id, Body::Get, lag, &[200]).await
            {
                lock(&sh.segment_ids).push(id);
                sh.note_id_order("segment", lag.user, (server, instance), &[id]);
            }
        }
        Kind::Batch => {
            if let Some((200, Some(IdsAnswer { ids, instance }))) =
                call(user, sh, names::BATCH, &urls.batch, Body::Get, lag, &[200]).await
            {
                sh.note_id_order("segment", lag.user, (server, instance), &ids);
                lock(&sh.segment_ids).extend(ids);
            }
        }
        Kind::Snowflake => {
            if let Some((200, Some(IdAnswer { id, .. }))) = call(
                user,
                sh,
                names::SNOWFLAKE,
                &urls.snowflake,
                Body::Get,
                lag,
                &[200],
            )
            .await
            {
                lock(&sh.snowflake_ids).push(id);
                // Snowflake promises order per worker id: a server restarted under a new worker
                // id may issue below what its previous incarnation issued on a clock that ran
                // ahead (unique still, as the worker ids differ).
                let worker = sut::snowflake::Layout::default().decode(id).worker;
                let worker = usize::try_from(worker).unwrap_or(usize::MAX);
                sh.note_id_order("snowflake", lag.user, (worker, None), &[id]);
            }
        }
        Kind::Tokens => tokens_operation(user, sh, lag).await,
        Kind::Once => once_operation(user, sh, lag).await,
        Kind::Lottery => lottery_operation(user, sh, lag).await,
    }
}

/// Issues a JWT for a fresh user, then verifies it.
async fn tokens_operation(user: &mut GooseUser, sh: &Shared, lag: &Origin) {
    let urls = &sh.urls;
    let n = sh.seq.fetch_add(1, Ordering::Relaxed);
    let body = json!({"user": sh.user_base + n});
    let issued = call::<Value>(
        user,
        sh,
        names::TOKEN_ISSUE,
        &urls.tokens,
        Body::PostAs(&body, sh.admin_token.as_deref().unwrap_or_default()),
        lag,
        &[200, 201],
    )
    .await;
    if let Some((_, Some(v))) = issued
        && let Some(tok) = v.get("token").and_then(Value::as_str)
    {
        let body = json!({"token": tok});
        let _ = call::<serde::de::IgnoredAny>(
            user,
            sh,
            names::TOKEN_VERIFY,
            &urls.tokens_verify,
            Body::Post(&body),
            lag,
            &[200],
        )
        .await;
    }
}

/// Issues a one-time token for a fresh user and consumes it; every fourth is consumed a
/// second time (a replay, refused with 409). Accepted consumes are counted per token.
async fn once_operation(user: &mut GooseUser, sh: &Shared, lag: &Origin) {
    let urls = &sh.urls;
    let n = sh.seq.fetch_add(1, Ordering::Relaxed);
    let uid = sh.user_base + n;
    let Some(jwt) = login(user, sh, uid, lag).await else {
        return;
    };
    let body = json!({"user": uid, "activity": sh.once_activity.to_string()});
    let issued = call::<Value>(
        user,
        sh,
        names::ONCE_ISSUE,
        &urls.once,
        Body::PostAs(&body, &jwt),
        lag,
        &[200, 201],
    )
    .await;
    let Some((_, Some(v))) = issued else { return };
    let Some(tok) = v.get("token").and_then(Value::as_str).map(str::to_owned) else {
        return;
    };
    let body = json!({"user": uid, "token": tok});
    let tries = if n % 4 == 3 { 2 } else { 1 };
    for t in 0..tries {
        let (name, ok): (&'static str, &[u16]) = if t == 0 {
            (names::ONCE_CONSUME, &[200])
        } else {
            (names::ONCE_REPLAY, &[409])
        };
        let ans = call::<Value>(
            user,
            sh,
            name,
            &urls.once_consume,
            Body::PostAs(&body, &jwt),
            lag,
            ok,
        )
        .await;
        if let Some((_, Some(v))) = ans
            && v.get("accepted").and_then(Value::as_bool) == Some(true)
        {
            let mut accepted = lock(&sh.once_accepted);
            let nth = accepted.observed();
            let _ = accepted.observe(tok.clone(), nth);
        }
    }
}

/// One lottery draw of the plan (a user drawing in its activity); confirmed draws are counted.
async fn lottery_operation(user: &mut GooseUser, sh: &Shared, lag: &Origin) {
    let Some(plan) = sh.lottery else { return };
    let n = sh.seq.fetch_add(1, Ordering::Relaxed);
    let activity = n / LOTTERY_USERS;
    if activity >= plan.activities {
        return; // plan exhausted (bounded by LOTTERY_RATE_MAX)
    }
    let drawer = plan.user_base + n % LOTTERY_USERS;
    let activity = plan.activity_base + activity;
    let cached = lock(&sh.jwts).get(&drawer).cloned();
    let jwt = match cached {
        Some(jwt) => jwt,
        None => {
            let Some(jwt) = login(user, sh, drawer, lag).await else {
                return;
            };
            lock(&sh.jwts).insert(drawer, jwt.clone());
            jwt
        }
    };
    // The draw's one-time submit token, for this user, activity and hour.
    let once = json!({"user": drawer, "activity": activity.to_string()});
    let issued = call::<Value>(
        user,
        sh,
        names::DRAW_ONCE,
        &sh.urls.once,
        Body::PostAs(&once, &jwt),
        lag,
        &[200, 201],
    )
    .await;
    let Some((_, Some(v))) = issued else { return };
    let Some(once_token) = v.get("token").and_then(Value::as_str) else {
        return;
    };
    // No price: the activity's, set by the operator, is what a draw pays.
    let body = json!({
        "activity": activity,
        "once_token": once_token,
    });
    if let Some((200, _)) = call::<serde::de::IgnoredAny>(
        user,
        sh,
        names::DRAW,
        &sh.urls.draw,
        Body::PostAs(&body, &jwt),
        lag,
        &[200],
    )
    .await
    {
        sh.draws_confirmed.fetch_add(1, Ordering::Relaxed);
    }
}

/// A JWT for `uid` from `POST /tokens` (the bench, holding the admin secret, plays the identity
/// provider a real client would log in with).
async fn login(user: &mut GooseUser, sh: &Shared, uid: u64, lag: &Origin) -> Option<String> {
    let body = json!({"user": uid});
    let admin = sh.admin_token.as_deref().unwrap_or_default();
    let issued = call::<Value>(
        user,
        sh,
        names::LOGIN,
        &sh.urls.tokens,
        Body::PostAs(&body, admin),
        lag,
        &[200],
    )
    .await;
    let Some((_, Some(v))) = issued else {
        return None;
    };
    v.get("token").and_then(Value::as_str).map(str::to_owned)
}

/// The goose transaction: wait for this user's next slot, run one operation.
pub async fn tick(user: &mut GooseUser, sh: &Shared) -> TransactionResult {
    let k = (user.weighted_users_index as u64) % sh.users.max(1);
    if user.get_session_data::<ClientInstalled>().is_none() {
        if let Some(client) = sh.clients.get(k as usize) {
            user.client = client.clone();
        }
        user.set_session_data(ClientInstalled);
    }
    let i = sh.iters[k as usize].fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let intended = match sh.schedule {
        Some(s) => sh.t0 + s.offset(k, i),
        None => now.max(sh.t0),
    };
    if intended >= sh.end {
        // the run is over for this user: idle until goose stops it
        tokio::time::sleep(Duration::from_millis(50)).await;
        return Ok(());
    }
    // tokio's timer has 1 ms granularity and rounds deadlines up: sleeping to the intended time
    // itself would make every send ~0.5-1 ms late. Waking up to TIMER_SLACK early instead
    // keeps the sends on schedule on average (the client lateness that remains is not counted
    // as latency anyway, see `Origin::new`, but it is reported as send lateness).
    if let Some(wake) = intended.checked_sub(Duration::from_millis(TIMER_SLACK_MS))
        && wake > now
    {
        tokio::time::sleep_until(wake.into()).await;
    }
    let sent = Instant::now();
    let origin = Origin::new(k as usize, intended, sent, sh.last_done_at(k as usize));
    if sh.schedule.is_some() && intended >= sh.measure_start {
        let late = sent
            .saturating_duration_since(intended)
            .saturating_sub(origin.server_lag);
        lock(&sh.send_lateness).record(late.as_micros() as u64);
    }
    let slot = k + i * sh.users;
    if let Some(kind) = sh.mix.kind_of(slot) {
        operation(user, sh, kind, &origin).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_workload_runs_and_mixed_keeps_its_weights() {
        for (name, _) in CATALOG {
            assert!(kind_of(name, 0).is_some(), "{name}");
        }
        assert!(kind_of("nope", 0).is_none());
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        for slot in 0..1000 {
            *counts
                .entry(format!("{:?}", kind_of("mixed", slot).unwrap()))
                .or_default() += 1;
        }
        assert_eq!(counts["Id"], 400);
        assert_eq!(counts["Batch"], 100);
        assert_eq!(counts["Snowflake"], 200);
        assert_eq!(counts["Tokens"], 100);
        assert_eq!(counts["Once"], 100);
        assert_eq!(counts["Lottery"], 100);
        assert_eq!(kind_of("id", 4), Some(Kind::Batch));
        assert_eq!(kind_of("id-single", 4), Some(Kind::Id));
    }

    #[test]
    fn only_lateness_behind_the_previous_answer_is_charged_to_the_server() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // idle user (previous answer long before), woken 0.7 ms late by its timer: the
        // lateness is the client's own, not the server's
        let o = Origin::new(
            0,
            t + ms(10),
            t + ms(10) + Duration::from_micros(700),
            Some(t),
        );
        assert_eq!(o.server_lag, Duration::ZERO);
        // busy user: its previous answer came 5 ms after this operation was due and it sent
        // 0.3 ms after that: 5 ms are the server's
        let o = Origin::new(
            0,
            t,
            t + ms(5) + Duration::from_micros(300),
            Some(t + ms(5)),
        );
        assert_eq!(o.server_lag, ms(5));
        // early send, and a first operation (no previous answer)
        assert_eq!(
            Origin::new(0, t + ms(1), t, Some(t)).server_lag,
            Duration::ZERO
        );
        assert_eq!(
            Origin::new(0, t, t + ms(3), None).server_lag,
            Duration::ZERO
        );
    }

    #[test]
    fn custom_mixes_deal_slots_in_order_and_bad_ones_are_refused() {
        let mix = Mix {
            snowflake: 1,
            lottery: 3,
            ..Mix::default()
        };
        let kinds: Vec<_> = (0..8).map(|s| mix.kind_of(s).unwrap()).collect();
        assert_eq!(kinds[0], Kind::Snowflake);
        assert_eq!(kinds[1..4], [Kind::Lottery; 3]);
        assert_eq!(kinds[4], Kind::Snowflake);
        assert_eq!(mix.needs(), (false, true));
        assert!(mix.has(Kind::Snowflake) && !mix.has(Kind::Id));
        assert!(Mix::default().validate().is_err());
        assert_eq!(Mix::default().kind_of(3), None);
        let huge = Mix {
            id: 20_000,
            ..Mix::default()
        };
        assert!(huge.validate().unwrap_err().contains("over"));
        assert!(mix.validate().is_ok());
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), None);
        assert_eq!(status_class(201), None);
        assert_eq!(status_class(409), Some("http_4xx"));
        assert_eq!(status_class(503), Some("http_5xx"));
    }
}

#[cfg(test)]
mod id_order_tests {
    use super::*;
    use crate::verify::ids_monotonic_per_server;
    use reports::model::Judgement;

    #[test]
    fn ids_that_go_up_per_user_and_server_hold() {
        let mut order = IdOrder::default();
        order.note("segment", 0, (0, Some(1)), &[1, 2, 3]);
        order.note("segment", 0, (1, Some(1)), &[1, 2]); // another server may be lower
        order.note("segment", 1, (0, Some(1)), &[1]); // another user too
        order.note("segment", 0, (0, Some(1)), &[4, 5]);
        // The same server restarted (a new incarnation) may draw a lower, reclaimed range.
        order.note("segment", 0, (0, Some(2)), &[2]);
        assert!(order.regressions.is_empty());
        assert_eq!(
            ids_monotonic_per_server(&order.regressions, 2).verdict,
            Judgement::Held
        );
    }

    #[test]
    fn an_id_that_does_not_go_up_fires_the_check() {
        let mut order = IdOrder::default();
        order.note("segment", 0, (0, Some(1)), &[10, 11]);
        order.note("segment", 0, (0, Some(1)), &[11]);
        order.note("snowflake", 3, (1, None), &[7, 5]);
        assert_eq!(order.regressions.len(), 2);
        let result = ids_monotonic_per_server(&order.regressions, 2);
        assert_eq!(result.verdict, Judgement::Violated);
        let first = result.first_offending_event.unwrap();
        assert!(
            first.contains("segment ID 11 from server 1 (allocator incarnation 1) after 11"),
            "{first}"
        );
        // Snowflake IDs are ordered per worker id (the `server` slot holds it).
        let mut snowflake = IdOrder::default();
        snowflake.note("snowflake", 0, (5, None), &[9]);
        snowflake.note("snowflake", 0, (6, None), &[3]); // another worker: may be lower
        assert!(snowflake.regressions.is_empty());
        snowflake.note("snowflake", 0, (5, None), &[8]);
        let result = ids_monotonic_per_server(&snowflake.regressions, 1);
        let first = result.first_offending_event.unwrap();
        assert!(first.contains("from worker id 5 after 9"), "{first}");
    }
}
