//! `sut-server`: the real HTTP driver of the `sut` state machines (tokio + axum + SQLite; see
//! docs/architecture.md, "The rule"). `sut` is the pure, sans-IO core (no runtime, no
//! database); everything here does the I/O it leaves out, as quinn does for quinn-proto.
//!
//! Besides the HTTP server, this crate holds:
//!
//! - [`sqlite`]: the SQLite stores ([`sqlite::SqliteIdStore`], [`sqlite::SqliteTokenStore`],
//!   [`sqlite::SqliteLotteryStore`]), each implementing a `sut` store trait with the rules `sut`
//!   shares with its memory store, and kept identical to that store by a conformance property
//!   test beside it; their twins on a shared database server, in [`pg`] (PostgreSQL) and
//!   [`mysql`] (MariaDB, MySQL), with what those share in [`sqldb`];
//! - [`front`]: [`front::ConcurrentIds`], the lock-free front of a segment allocator that
//!   performs its store calls inline;
//! - [`openapi`]: the OpenAPI description (`GET /openapi.json`, `docs/openapi.json`);
//! - the `sut-server` binary (`src/bin/sut-server.rs`).
//!
//! Handlers are thin: they parse, call a state machine or store through its driver here, and
//! map typed answers to HTTP. The drivers:
//!
//! - [`ids`]: segment IDs per tag through [`front::ConcurrentIds`] (lock-free hot
//!   path), a Snowflake worker on a leased worker id with persisted time reservations;
//! - [`tokens`]: [`sut::token::TokenService`] over the SQLite token store;
//! - [`lottery`]: the TCC coordinator and participants on one writer thread with group commit;
//! - [`admission`]: bounded concurrency and queueing, 503 + `Retry-After` beyond;
//! - [`metrics`]: Prometheus counters; [`clock`]: the one place clocks are read.
//!
//! Files: the ID store is the `--db` file; tokens and the lottery journal live beside it
//! (`<db>.tokens`, `<db>.lottery`) so that a lottery group commit never holds the write lock a
//! token or segment write waits for.
//!
//! Routes: `GET /id/{tag}`, `GET /id/{tag}/batch?n=`, `GET /snowflake`,
//! `GET /snowflake/decode/{id}`, `GET /semantic/{biz}`, `GET /health`, `POST /tokens`, `POST /tokens/verify`,
//! `POST /tokens/revoke`, `POST /tokens/once`, `POST /tokens/once/consume`,
//! `POST /lottery/draw`, `GET /lottery/draws/{xid}`, `GET /ledger`, `GET /admin/dead-letters`, `POST /admin/dead-letters/{xid}/retry`, `GET /metrics`, `POST /admin/tags`,
//! `POST /admin/accounts`, `POST /admin/stock`, and `GET /noop` (an empty handler: the
//! baseline for throughput ratios; `?delay_ms=` holds the request, for overload tests).

pub mod activities;
pub mod admission;
pub mod auth;
pub mod clock;
pub mod conns;
pub mod db;
pub mod error;
pub mod extract;
pub mod front;
pub mod ids;
pub mod listen;
pub mod lottery;
pub mod metrics;
pub mod mysql;
pub mod once;
pub mod openapi;
pub mod pg;
pub mod remote;
pub mod sqldb;
pub mod sqlite;
pub mod test_hooks;
pub mod tls;
pub mod tokens;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path as UrlPath, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::ToSchema;

use self::activities::Activities;
use self::admission::{Admission, AdmissionConfig};
use self::clock::RealClock;
use self::db::{Db, IdStoreBox};
use self::error::{ApiError, ErrorBody};
use self::extract::JsonBody;
use self::ids::{Snowflake, Tags, lock};
use self::lottery::{Lottery, LotteryStoreKind};
use self::metrics::Metrics;
use self::remote::{BranchRequest, RemoteParticipants};
use self::tokens::Tokens;
use sut::id_store::{CounterDurability, IdStore, TagSpec};
use sut::lottery::{ActivityId, DrawArgs, Xid};
use sut::snowflake::WorkerConfig;
use sut::token::{SigningKey, TokenConfig, TokenService};

/// Largest request body, in bytes.
pub const BODY_MAX_BYTES: usize = 16 * 1024;
/// Largest `n` of `/id/{tag}/batch`.
pub const BATCH_IDS_MAX: u64 = 1000;
/// Longest `delay_ms` of `/noop`.
pub const NOOP_DELAY_MS_MAX: u64 = 5_000;
/// The tag draws take their xids from.
pub const XID_TAG: &str = "lottery.xid";
/// Users the per-user draw limiter tracks at once.
pub const DRAW_LIMITER_USERS_MAX: usize = 100_000;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The database: an SQLite file (tokens and lottery beside it) or a PostgreSQL URL.
    pub db: Db,
    /// Fail-stop: when a lottery commit fails (the database went away mid-batch), answer what
    /// waited with 503 and exit the process with [`lottery::EXIT_STORE_FAILED`], for a
    /// supervisor to restart it on its log. `false` (in-process tests): refuse every later
    /// request instead. The `sut-server` binary sets it.
    pub exit_on_store_failure: bool,
    /// Admission limits.
    pub admission: AdmissionConfig,
    /// What one client may hold: connections (per process, per peer), head and body read
    /// timeouts.
    pub conn_limits: listen::ConnLimits,
    /// A planted weakness (TEST ONLY; `None`: the correct server).
    pub weakness: Option<listen::Weakness>,
    /// IDs published to the lock-free front at a time.
    pub block_ids: u64,
    /// Snowflake worker lease length.
    pub worker_lease_ms: u64,
    /// The semantic IDs served (`GET /semantic/{biz}`).
    pub semantic: ids::SemanticSpec,
    /// Allocator upkeep period (`ConcurrentIds::tick`, Snowflake lease renewal).
    pub tick_ms: u64,
    /// Reclaim sweep period.
    pub reclaim_ms: u64,
    /// HMAC secret for JWTs (at least 32 bytes); random per start when `None`.
    pub jwt_secret: Option<Vec<u8>>,
    /// The odds of an activity registered without its own (`POST /admin/activities` with no
    /// `win_per_mille`, `--activity ID:PRICE`), in winning draws per thousand.
    pub win_per_mille: u32,
    /// The lottery's store.
    pub lottery_store: LotteryStoreKind,
    /// A documented flaw switched on in the allocators, the Snowflake worker, the token
    /// service and the lottery participants (each takes the flaws that are its own; see
    /// [`sut::flaw`]). `None`: the correct paths.
    pub flaw: Option<sut::flaw::Flaw>,
    /// Cap of the allocators' dynamic step (`None`: Leaf's 1,000,000). The lost-ID bound of a
    /// crash is a multiple of it.
    pub step_max: Option<u64>,
    /// The lottery coordinator's timing, limits and compensation schedule.
    pub coordinator: sut::lottery::CoordinatorConfig,
    /// Test hook (the `test-hooks` feature only): messages to in-process participants to lose
    /// (see [`lottery::ParticipantFaults`]). Empty by default.
    pub participant_faults: lottery::ParticipantFaults,
    /// What this process serves.
    pub role: Role,
    /// The wallet participant's base URL (role `coordinator`).
    pub wallet_url: Option<String>,
    /// The inventory participant's base URL (role `coordinator`).
    pub inventory_url: Option<String>,
    /// The operator's secret (`Authorization: Bearer …` on `/admin/*`, issuing JWTs, the
    /// ledger and raw state, any draw's status). `None`: those routes refuse everything.
    pub admin_token: Option<String>,
    /// The service-to-service credential: what the coordinator presents to the participants'
    /// routes (`/tcc/branch`, `/tcc/branches`), which accept nothing else (not the operator's
    /// secret). `None`: those routes refuse everything.
    pub service_token: Option<String>,
    /// How long the coordinator waits for one participant call.
    pub participant_timeout_ms: u64,
    /// TLS on the listener: the certificate chain and its key (PEM files). `None`: plain HTTP.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The CA (or self-signed certificate, PEM) to trust on calls to the other processes (the
    /// participants, the token service): with it their `https://` URLs work.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Test knob: let a draw's body choose its luck (`won`). Off by default; the binary logs
    /// loudly when it is on.
    pub forced_outcomes: bool,
    /// Test knob: let `GET /noop?delay_ms=` hold a request (and its admission slot) for the
    /// overload tests. Off by default: a client cannot hold slots for free.
    pub noop_delay: bool,
    /// `GET /metrics` without a credential (off: it takes the operator's secret, since its
    /// counters tell the business's volume).
    pub metrics_public: bool,
    /// The token service's base URL (role `coordinator`: it consumes the draws' one-time
    /// tokens there).
    pub token_url: Option<String>,
    /// Draws per second a user may start (refill of the per-user bucket).
    pub draw_rate_per_s: f64,
    /// Draws a user may start at once (the bucket's size).
    pub draw_burst: u32,
    /// One-time tokens per second one user may be issued (refill of the per-user bucket).
    pub once_rate_per_s: f64,
    /// One-time tokens one user may be issued at once.
    pub once_burst: u32,
    /// Segment tags to create at start when missing (name, step), as `POST /admin/tags` would:
    /// a black-box run (`scenario ids`) then needs no admin call.
    pub tags: Vec<(String, u64)>,
    /// Activities to register at start (id, terms), as `POST /admin/activities` would; terms
    /// that conflict with the registered ones are a start-up error.
    pub activities: Vec<(u64, sut::lottery::Terms)>,
}

impl ServerConfig {
    /// Defaults for an SQLite database file.
    #[must_use]
    pub fn new(db: &Path) -> Self {
        Self::with_db(Db::Sqlite(db.to_owned()))
    }

    /// Defaults for a database of either kind.
    #[must_use]
    pub fn with_db(db: Db) -> Self {
        Self {
            db,
            admission: AdmissionConfig::default(),
            conn_limits: listen::ConnLimits::default(),
            weakness: None,
            block_ids: 4096,
            worker_lease_ms: 30_000,
            semantic: ids::SemanticSpec::default(),
            tick_ms: 200,
            reclaim_ms: 5_000,
            jwt_secret: None,
            win_per_mille: 100,
            lottery_store: LotteryStoreKind::Journal,
            flaw: None,
            step_max: None,
            coordinator: sut::lottery::CoordinatorConfig::default(),
            participant_faults: lottery::ParticipantFaults::default(),
            role: Role::All,
            wallet_url: None,
            inventory_url: None,
            admin_token: None,
            service_token: None,
            participant_timeout_ms: 1_000,
            tls: None,
            tls_ca_file: None,
            forced_outcomes: false,
            noop_delay: false,
            metrics_public: false,
            token_url: None,
            draw_rate_per_s: 10.0,
            draw_burst: 20,
            once_rate_per_s: 2.0,
            once_burst: 20,
            exit_on_store_failure: false,
            tags: Vec::new(),
            activities: Vec::new(),
        }
    }

    /// Where a coordinator's participants are (`None` for other roles).
    ///
    /// # Errors
    /// A coordinator without both participant URLs or without the service credential.
    pub fn remote_participants(&self) -> Result<Option<RemoteParticipants>, String> {
        if self.role != Role::Coordinator {
            return Ok(None);
        }
        let need = |v: &Option<String>, flag: &str| {
            v.clone()
                .ok_or_else(|| format!("--role coordinator needs {flag}"))
        };
        Ok(Some(RemoteParticipants {
            wallet_url: need(&self.wallet_url, "--wallet-url")?,
            inventory_url: need(&self.inventory_url, "--inventory-url")?,
            secret: need(
                &self.service_token,
                "the service credential (--service-token-file)",
            )?,
            timeout_ms: self.participant_timeout_ms,
            tls_ca_file: self.tls_ca_file.clone(),
        }))
    }
}

/// What one server process serves (`--role`). `all` is the single-process server; the other
/// roles split it into the processes of a real deployment (docs/deployment.md).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything in one process (the default).
    #[default]
    All,
    /// Segment and Snowflake IDs (`/id/*`, `/snowflake*`, `/admin/tags`); run several on one
    /// PostgreSQL database.
    Id,
    /// JWTs and one-time tokens (`/tokens*`).
    Token,
    /// The TCC coordinator (`/lottery/*`, `/admin/dead-letters`): calls the wallet and
    /// inventory participants over HTTP and compensates.
    Coordinator,
    /// The wallet and participation-log participant (`/tcc/branch`, `/admin/accounts`).
    Wallet,
    /// The prize-stock participant (`/tcc/branch`, `/admin/stock`).
    Inventory,
}

impl Role {
    /// Whether this role runs the ID allocators (the coordinator takes its xids from them).
    #[must_use]
    pub const fn has_ids(self) -> bool {
        matches!(self, Self::All | Self::Id | Self::Coordinator)
    }

    /// Whether this role runs the token service.
    #[must_use]
    pub const fn has_tokens(self) -> bool {
        matches!(self, Self::All | Self::Token)
    }

    /// Whether this role keeps an activity registry (every role but `id`: the draw gate, the
    /// participants' terms rule, one-time tokens for registered activities only).
    #[must_use]
    pub const fn has_activities(self) -> bool {
        !matches!(self, Self::Id)
    }

    /// Whether this role runs a lottery writer (coordinator, participants, or both).
    #[must_use]
    pub const fn has_lottery(self) -> bool {
        matches!(
            self,
            Self::All | Self::Coordinator | Self::Wallet | Self::Inventory
        )
    }

    /// The role's name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Id => "id",
            Self::Token => "token",
            Self::Coordinator => "coordinator",
            Self::Wallet => "wallet",
            Self::Inventory => "inventory",
        }
    }
}

/// The ID side of a server: allocators per tag, the Snowflake worker and the control
/// connection (admin calls and sweeps).
#[derive(Clone, Debug)]
pub struct IdService {
    /// Segment IDs.
    pub tags: Arc<Tags>,
    /// Snowflake.
    pub snowflake: Arc<Snowflake>,
    /// The ID store connection for admin calls and sweeps.
    pub control: Arc<Mutex<IdStoreBox>>,
}

/// Everything the handlers share. A service the process's role does not run is `None`, and
/// its routes are not mounted.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The clock.
    pub clock: RealClock,
    /// What this process serves.
    pub role: Role,
    /// IDs (roles `all`, `id`, `coordinator`).
    pub ids: Option<IdService>,
    /// Tokens (roles `all`, `token`).
    pub tokens: Option<Tokens>,
    /// The lottery writer (roles `all`, `coordinator`, `wallet`, `inventory`).
    pub lottery: Option<Arc<Lottery>>,
    /// The operator's activities (every role but `id`).
    pub activities: Option<Arc<Activities>>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Admission gate.
    pub admission: Arc<Admission>,
    pub(crate) admin_token: Option<Arc<str>>,
    /// The service-to-service credential (participant routes).
    pub(crate) service_token: Option<Arc<str>>,
    /// How users' JWTs are checked (roles `all`, `token`, `coordinator`).
    pub(crate) verifier: Option<auth::Verifier>,
    /// How draws' one-time tokens are consumed (roles `all`, `coordinator`).
    pub(crate) once: Option<auth::OnceConsumer>,
    /// The one-time token writer (roles `all`, `token`).
    pub(crate) once_desk: Option<once::OnceDesk>,
    /// Per-user draw rate.
    pub(crate) limiter: auth::Limiter,
    /// Per-user rate of one-time token issues.
    pub(crate) once_limiter: auth::Limiter,
    /// Wrong secrets per peer address.
    pub(crate) secret_throttle: auth::SecretThrottle,
    /// The planted weakness `sequential_tokens`: the last one-time token value issued, the
    /// next is one more (`None`: values are 128 random bits, as they must be).
    pub(crate) sequential_tokens: Option<Arc<Mutex<u128>>>,
    forced_outcomes: bool,
    win_per_mille: u32,
    /// The documented flaw [`sut::flaw::Flaw::ClientPrice`]: the draw gate takes the body's price.
    client_price: bool,
    /// How long a request body may take to arrive (see [`listen::ConnLimits`]).
    body_read_ms: u64,
    /// The planted weakness `body_before_auth`: every admitted route's body read (up to the
    /// largest any route takes) before its credential is looked at.
    body_before_auth: bool,
    /// How draws are named to clients.
    handles: sut::gate::handle::HandleKey,
    /// `GET /noop?delay_ms=` allowed (a test knob).
    noop_delay: bool,
    /// `GET /metrics` without a credential.
    metrics_public: bool,
}

fn not_served(what: &str, role: Role) -> ApiError {
    ApiError::field(
        StatusCode::NOT_FOUND,
        "path",
        format!(
            "{what} are not served by this process (role `{}`)",
            role.name()
        ),
    )
}

impl AppState {
    /// The ID side, or 404 for a role without it.
    ///
    /// # Errors
    /// The role does not run IDs.
    pub fn ids(&self) -> Result<&IdService, ApiError> {
        self.ids
            .as_ref()
            .ok_or_else(|| not_served("IDs", self.role))
    }

    /// The token service, or 404 for a role without it.
    ///
    /// # Errors
    /// The role does not run tokens.
    pub fn tokens(&self) -> Result<&Tokens, ApiError> {
        self.tokens
            .as_ref()
            .ok_or_else(|| not_served("tokens", self.role))
    }

    /// The one-time token writer, or 404 for a role without the token service.
    ///
    /// # Errors
    /// 404 naming the role.
    pub fn once_desk(&self) -> Result<&once::OnceDesk, ApiError> {
        self.once_desk
            .as_ref()
            .ok_or_else(|| not_served("tokens", self.role))
    }

    /// The activity registry, or 404 for a role without it.
    ///
    /// # Errors
    /// The role keeps no registry (`id`).
    pub fn activities(&self) -> Result<&Arc<Activities>, ApiError> {
        self.activities
            .as_ref()
            .ok_or_else(|| not_served("activities", self.role))
    }

    /// The lottery writer, or 404 for a role without it.
    ///
    /// # Errors
    /// The role does not run the lottery.
    pub fn lottery(&self) -> Result<&Arc<Lottery>, ApiError> {
        self.lottery
            .as_ref()
            .ok_or_else(|| not_served("lottery routes", self.role))
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// The bound address.
    pub addr: SocketAddr,
    state: AppState,
    shutdown: watch::Sender<bool>,
    serve: tokio::task::JoinHandle<std::io::Result<()>>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

fn secret(cfg: &ServerConfig) -> Result<Vec<u8>, String> {
    if let Some(s) = &cfg.jwt_secret {
        return Ok(s.clone());
    }
    let mut buf = vec![0u8; 32];
    getrandom::fill(&mut buf).map_err(|e| format!("randomness: {e}"))?;
    Ok(buf)
}

/// Shortest operator secret and service credential accepted.
pub const SECRET_LEN_MIN: usize = 16;

/// The credentials are separate and not weak: the service credential is not the operator's
/// secret (the participants must not take the operator's word for a coordinator's), each is at
/// least [`SECRET_LEN_MIN`] characters, and a JWT key at least 32 bytes.
///
/// # Errors
/// What is wrong, naming the credential (never its value).
pub fn check_credentials(cfg: &ServerConfig) -> Result<(), String> {
    let short = |what: &str, v: &Option<String>| {
        v.as_ref()
            .filter(|s| s.chars().count() < SECRET_LEN_MIN)
            .map(|_| format!("{what} is shorter than {SECRET_LEN_MIN} characters"))
    };
    if let Some(e) = short("the operator secret", &cfg.admin_token)
        .or_else(|| short("the service credential", &cfg.service_token))
    {
        return Err(e);
    }
    for (what, secret) in [
        ("the operator secret", &cfg.admin_token),
        ("the service credential", &cfg.service_token),
    ] {
        if let Some(why) = secret.as_deref().and_then(weak_secret) {
            return Err(format!("{what} {why}"));
        }
    }
    if cfg.service_token.is_some() && cfg.service_token == cfg.admin_token {
        return Err(
            "the service credential is the operator's secret: give the participants' routes a \
             credential of their own"
                .into(),
        );
    }
    if cfg.jwt_secret.as_ref().is_some_and(|k| k.len() < 32) {
        return Err("the JWT key is shorter than 32 bytes".into());
    }
    if matches!(cfg.role, Role::Coordinator | Role::Wallet | Role::Inventory)
        && cfg.service_token.is_none()
    {
        return Err(format!(
            "--role {} needs the service credential (--service-token-file)",
            cfg.role.name()
        ));
    }
    Ok(())
}

/// Bits a secret must have at least, estimated from its length and the kinds of characters it
/// uses.
pub const SECRET_BITS_MIN: f64 = 128.0;

/// Why `secret` is too weak to be a credential, if it is: one character in more than half of
/// its places, or fewer than [`SECRET_BITS_MIN`] bits estimated as its length times the bits of
/// an alphabet made of the kinds it uses (26 lower-case letters, 26 upper-case, 10 digits, 33
/// others). An estimate from above: a word or a pattern has far fewer.
#[must_use]
pub fn weak_secret(secret: &str) -> Option<String> {
    let chars: Vec<char> = secret.chars().collect();
    let most = chars
        .iter()
        .map(|c| chars.iter().filter(|d| *d == c).count())
        .max()
        .unwrap_or(0);
    if most * 2 > chars.len() {
        return Some(format!(
            "repeats one character in {most} of its {} places",
            chars.len()
        ));
    }
    /// A kind of character, and how many there are.
    type Kind = (fn(&char) -> bool, u32);
    let kinds: [Kind; 4] = [
        (char::is_ascii_lowercase, 26),
        (char::is_ascii_uppercase, 26),
        (char::is_ascii_digit, 10),
        (|c| !c.is_ascii_alphanumeric(), 33),
    ];
    let alphabet: u32 = kinds
        .iter()
        .filter(|(is, _)| chars.iter().any(is))
        .map(|(_, n)| n)
        .sum();
    let bits = chars.len() as f64 * f64::from(alphabet.max(1)).log2();
    (bits < SECRET_BITS_MIN).then(|| {
        format!(
            "has about {bits:.0} bits by its length and kinds of characters, fewer than \
             {SECRET_BITS_MIN:.0}: use a random one, e.g. 32 hex digits (`openssl rand -hex 16`)"
        )
    })
}

/// The key of the draw handles clients see (derived from the JWT key, which every process that
/// answers clients about draws holds).
fn handle_key(cfg: &ServerConfig) -> Result<sut::gate::handle::HandleKey, String> {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&secret(cfg)?)
        .map_err(|e| format!("draw handle key: {e}"))?;
    // A label of its own: the JWT key is never used as it is for a second purpose.
    mac.update(b"sut-server draw handles v1");
    let mut key = [0u8; 16];
    key.copy_from_slice(&mac.finalize().into_bytes()[..16]);
    Ok(sut::gate::handle::HandleKey::new(key))
}

/// The stores and drivers [`start`] opens before it serves (those of the role).
struct Stores {
    ids: Option<IdService>,
    tokens: Option<(Tokens, once::OnceDesk)>,
    lottery: Option<Arc<Lottery>>,
    activities: Option<Arc<Activities>>,
}

/// Opens what the role runs (blocking): the ID store (a new instance id, the xid tag), the
/// tags and the Snowflake worker; the token service; the lottery.
fn open_stores(
    cfg: &ServerConfig,
    clock: RealClock,
    metrics: &Arc<Metrics>,
) -> Result<Stores, String> {
    let ids = if cfg.role.has_ids() {
        Some(open_ids(cfg, clock, metrics)?)
    } else {
        None
    };
    let tokens = if cfg.role.has_tokens() {
        Some(open_tokens(cfg)?)
    } else {
        None
    };
    let activities = if cfg.role.has_activities() {
        Some(Arc::new(open_activities(cfg)?))
    } else {
        None
    };
    let lottery = if cfg.role.has_lottery() {
        Some(Arc::new(lottery::open_with(
            cfg.lottery_store,
            &cfg.db,
            clock,
            Arc::clone(metrics),
            lottery::LotteryOptions {
                coordinator: cfg.coordinator,
                participants: sut::lottery::ParticipantConfig {
                    flaws: sut::flaw::lottery_flaws(cfg.flaw),
                },
                faults: cfg.participant_faults.clone(),
                remote: cfg.remote_participants()?,
                partial: cfg.role != Role::All,
                exit_on_store_failure: cfg.exit_on_store_failure,
                activities: activities.clone(),
                handles: Some(handle_key(cfg)?),
            },
        )?))
    } else {
        None
    };
    Ok(Stores {
        ids,
        tokens,
        lottery,
        activities,
    })
}

/// The registry, with the activities of `--activity` registered (blocking).
fn open_activities(cfg: &ServerConfig) -> Result<Activities, String> {
    let activities = Activities::open(&cfg.db)?;
    for (id, terms) in &cfg.activities {
        activities
            .register(ActivityId(*id), *terms)
            .map_err(|e| format!("--activity {id}: {e}"))?;
    }
    Ok(activities)
}

fn open_ids(
    cfg: &ServerConfig,
    clock: RealClock,
    metrics: &Arc<Metrics>,
) -> Result<IdService, String> {
    let db = &cfg.db;
    let mut control = db.open_ids(CounterDurability::EveryWrite)?;
    let instance =
        ids::next_instance(&mut *control, clock.now()).map_err(|e| format!("instance id: {e}"))?;
    match control.create_tag(XID_TAG, &TagSpec::simple(1000)) {
        Ok(_) | Err(sut::id_store::StoreError::TagExists(_)) => {}
        Err(e) => return Err(format!("xid tag: {e}")),
    }
    for (tag, step) in &cfg.tags {
        ids::validate_tag(tag).map_err(|e| format!("--tag {tag}: {}", e.error))?;
        match control.create_tag(tag, &TagSpec::simple(*step)) {
            Ok(_) | Err(sut::id_store::StoreError::TagExists(_)) => {}
            Err(e) => return Err(format!("--tag {tag}:{step}: {e}")),
        }
    }
    let control = Arc::new(Mutex::new(control));
    let tags = Arc::new(
        Tags::new(db, instance, clock, cfg.block_ids, Arc::clone(&control))
            .with_flaw(cfg.flaw)
            .with_step_max(cfg.step_max)
            .with_weakness(cfg.weakness),
    );
    let snowflake = Arc::new(Snowflake::start(
        (
            WorkerConfig {
                reserve_ahead_ms: ids::SNOWFLAKE_RESERVE_AHEAD_MS,
                flaw: cfg.flaw,
                ..WorkerConfig::default()
            },
            &cfg.semantic,
        ),
        Arc::clone(&control),
        instance,
        cfg.worker_lease_ms,
        clock,
        Arc::clone(metrics),
    )?);
    Ok(IdService {
        control,
        tags,
        snowflake,
    })
}

/// How this process verifies JWTs and consumes one-time tokens: with its own token service, or
/// (a coordinator) with the shared JWT key and the deployment's token service.
fn gate_io(
    cfg: &ServerConfig,
    tokens: Option<&(Tokens, once::OnceDesk)>,
) -> Result<(Option<auth::Verifier>, Option<auth::OnceConsumer>), String> {
    if let Some((tokens, desk)) = tokens {
        let once = (cfg.role == Role::All).then(|| auth::OnceConsumer::Local(desk.clone()));
        return Ok((Some(auth::Verifier::Service(Arc::clone(tokens))), once));
    }
    if cfg.role != Role::Coordinator {
        return Ok((None, None));
    }
    let secret = cfg
        .jwt_secret
        .clone()
        .ok_or("--role coordinator needs --jwt-secret-file (the token service's)")?;
    let key = SigningKey::new("sut-server", secret).map_err(|e| e.to_string())?;
    let url = cfg
        .token_url
        .clone()
        .ok_or("--role coordinator needs --token-url (the token service)")?;
    let client = tls::http_client(
        cfg.tls_ca_file.as_deref(),
        Duration::from_millis(cfg.participant_timeout_ms.max(1)),
        usize::MAX,
    )?;
    Ok((
        Some(auth::Verifier::Key(Arc::new((
            key,
            TokenConfig::default().jwt,
        )))),
        Some(auth::OnceConsumer::Remote {
            url: url.trim_end_matches('/').to_owned(),
            client,
        }),
    ))
}

/// The token service over its store (beside the ID store, or in the same PostgreSQL database).
fn open_tokens(cfg: &ServerConfig) -> Result<(Tokens, once::OnceDesk), String> {
    let key = SigningKey::new("sut-server", secret(cfg)?).map_err(|e| e.to_string())?;
    let token_cfg = TokenConfig {
        flaws: sut::flaw::token_flaws(cfg.flaw),
        ..TokenConfig::default()
    };
    let token_store = cfg.db.open_tokens(token_cfg.limits)?;
    let desk = once::OnceDesk::start(
        cfg.db.open_once_store(token_cfg.limits)?,
        once::OnceRules {
            once: token_cfg.once,
            flaws: token_cfg.flaws,
        },
    )?;
    let service = TokenService::new(token_cfg, key, token_store).map_err(|e| e.to_string())?;
    Ok((Arc::new(Mutex::new(service)), desk))
}

/// Opens the stores, leases the Snowflake worker, binds `listen` and serves until
/// [`Server::shutdown`].
///
/// # Errors
/// A store cannot be opened, the worker lease cannot be had, or the address cannot be bound.
pub async fn start(mut cfg: ServerConfig, listen: SocketAddr) -> Result<Server, String> {
    check_credentials(&cfg)?;
    if let (Db::Postgres(_), Some(ca)) = (&cfg.db, &cfg.tls_ca_file) {
        // Process-wide: every later PostgreSQL connection of this process speaks TLS (a second
        // server started in the same process keeps the first one's).
        let _ = pg::use_tls(tls::client_config(ca)?);
    }
    if cfg.weakness == Some(listen::Weakness::NoReadTimeout) {
        cfg.conn_limits.header_read_ms = 0;
        cfg.conn_limits.body_read_ms = 0;
    }
    let clock = RealClock::new();
    let metrics = Arc::new(Metrics::default());
    // One JWT key for the whole process (random when none is configured: its tokens then die
    // with it); draw handles are derived from it.
    cfg.jwt_secret = Some(secret(&cfg)?);
    let setup = {
        let cfg = cfg.clone();
        let metrics = Arc::clone(&metrics);
        tokio::task::spawn_blocking(move || open_stores(&cfg, clock, &metrics))
    };
    let Stores {
        ids,
        tokens,
        lottery,
        activities,
    } = setup.await.map_err(|e| format!("setup task: {e}"))??;
    let (verifier, once) = gate_io(&cfg, tokens.as_ref())?;
    let (tokens, once_desk) = tokens.map_or((None, None), |(t, d)| (Some(t), Some(d)));
    let state = AppState {
        clock,
        role: cfg.role,
        ids,
        tokens,
        lottery,
        activities,
        metrics,
        admission: Arc::new(Admission::new(cfg.admission)),
        admin_token: cfg.admin_token.as_deref().map(Arc::from),
        service_token: cfg.service_token.as_deref().map(Arc::from),
        verifier,
        once,
        once_desk,
        limiter: Arc::new(Mutex::new(sut::gate::RateLimiter::new(
            cfg.draw_rate_per_s,
            cfg.draw_burst,
            DRAW_LIMITER_USERS_MAX,
        ))),
        secret_throttle: auth::secret_throttle(),
        once_limiter: Arc::new(Mutex::new(
            if cfg.weakness == Some(listen::Weakness::NoTokenQuota) {
                sut::gate::RateLimiter::new(f64::INFINITY, u32::MAX, DRAW_LIMITER_USERS_MAX)
            } else {
                sut::gate::RateLimiter::new(
                    cfg.once_rate_per_s,
                    cfg.once_burst,
                    DRAW_LIMITER_USERS_MAX,
                )
            },
        )),
        sequential_tokens: (cfg.weakness == Some(listen::Weakness::SequentialTokens))
            .then(|| Arc::new(Mutex::new(u128::from(clock.now().wall_ms) << 32))),
        forced_outcomes: cfg.forced_outcomes,
        win_per_mille: cfg
            .win_per_mille
            .min(sut::lottery::activity::WIN_PER_MILLE_MAX),
        client_price: sut::flaw::lottery_flaws(cfg.flaw).client_price,
        body_read_ms: cfg.conn_limits.body_read_ms,
        body_before_auth: cfg.weakness == Some(listen::Weakness::BodyBeforeAuth),
        handles: handle_key(&cfg)?,
        noop_delay: cfg.noop_delay,
        metrics_public: cfg.metrics_public,
    };
    let listener = listen::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (shutdown, rx) = watch::channel(false);
    let app = router(state.clone());
    // Room for the stores' own descriptors (database files, connections, the client pool).
    let limits = cfg.conn_limits.within_open_files(256);
    let tls = match &cfg.tls {
        Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(
            cert, key,
        )?)),
        None => None,
    };
    let serve = tokio::spawn(listen::serve(
        listener,
        app,
        listen::Listener {
            limits,
            tls,
            metrics: Arc::clone(&state.metrics),
            conn_slot_leak: cfg.weakness == Some(listen::Weakness::ConnSlotLeak),
            evict_idle: cfg.weakness != Some(listen::Weakness::NoEviction),
        },
        rx,
    ));
    let background = spawn_background(&state, &cfg, &shutdown);
    Ok(Server {
        addr,
        state,
        shutdown,
        serve,
        background,
    })
}

fn spawn_background(
    state: &AppState,
    cfg: &ServerConfig,
    shutdown: &watch::Sender<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let every = |period_ms: u64, work: Arc<dyn Fn() + Send + Sync>| {
        let mut stop = shutdown.subscribe();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(period_ms.max(1)));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = interval.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let work = Arc::clone(&work);
                if tokio::task::spawn_blocking(move || work()).await.is_err() {
                    return;
                }
            }
        })
    };
    let Some(ids) = state.ids.clone() else {
        return Vec::new();
    };
    let upkeep = {
        let ids = ids.clone();
        Arc::new(move || {
            for (_, tag) in ids.tags.all() {
                tag.tick();
            }
            if let Err(e) = ids.snowflake.tick() {
                eprintln!("snowflake upkeep: {e}");
            }
        })
    };
    let sweep = {
        let (clock, metrics) = (state.clock, Arc::clone(&state.metrics));
        Arc::new(
            move || match lock(&ids.control).reclaim_expired(clock.now().wall_ms) {
                Ok(tails) => {
                    metrics.reclaim_sweeps.fetch_add(1, Ordering::Relaxed);
                    metrics
                        .reclaimed_tails
                        .fetch_add(tails.len() as u64, Ordering::Relaxed);
                }
                Err(e) => eprintln!("reclaim sweep: {e}"),
            },
        )
    };
    vec![every(cfg.tick_ms, upkeep), every(cfg.reclaim_ms, sweep)]
}

impl Server {
    /// The shared state (tests).
    #[must_use]
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops at once without releasing anything: segment leases, the Snowflake worker lease and
    /// unflushed state are left as a crash would leave them (the lottery writer stops after the
    /// commands it holds; what it committed is on disk either way). For restart tests.
    pub fn abort(self) {
        self.serve.abort();
        for task in &self.background {
            task.abort();
        }
        if let Some(lottery) = &self.state.lottery {
            lottery.stop();
        }
    }

    /// Graceful shutdown: stop accepting, finish in-flight requests, stop the background
    /// tasks, return unissued segment IDs to their pools, release the Snowflake worker (its
    /// reservation is persisted already), flush counters and stop the lottery writer after
    /// the commands it holds.
    ///
    /// # Errors
    /// The server task failed, or a release failed (listed).
    pub async fn shutdown(self) -> Result<(), String> {
        let _ = self.shutdown.send(true);
        let served = self.serve.await;
        for task in self.background {
            let _ = task.await;
        }
        let state = self.state;
        let released = tokio::task::spawn_blocking(move || {
            let mut errors = Vec::new();
            if let Some(ids) = &state.ids {
                for (_, tag) in ids.tags.all() {
                    tag.shutdown();
                }
                if let Err(e) = ids.snowflake.release() {
                    errors.push(format!("snowflake release: {e}"));
                }
                if let Err(e) = lock(&ids.control).flush_counters() {
                    errors.push(format!("flush counters: {e}"));
                }
            }
            if let Some(lottery) = &state.lottery {
                lottery.stop();
            }
            errors
        })
        .await
        .map_err(|e| format!("shutdown task: {e}"))?;
        match served {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("server: {e}")),
            Err(e) => return Err(format!("server task: {e}")),
        }
        if released.is_empty() {
            Ok(())
        } else {
            Err(released.join("; "))
        }
    }
}

/// The routes whose credential is a secret (the operator's, the coordinator's service
/// credential) and the draw status read, where a neither-secret-nor-JWT is a guess: an address
/// that presented too many wrong secrets is refused on each of them (429), the right secret
/// too. The OpenAPI description says so on each (`openapi`), and a test holds this list to what
/// the router does (`tests/hostile.rs`).
pub const THROTTLED_ROUTES: &[(&str, &str)] = &[
    ("post", "/tokens"),
    ("get", "/lottery/draws/{draw}"),
    ("get", "/ledger"),
    ("get", "/lottery/state"),
    ("post", "/tcc/branch"),
    ("post", "/tcc/branches"),
    ("get", "/admin/dead-letters"),
    ("post", "/admin/dead-letters/{xid}/retry"),
    ("post", "/admin/tags"),
    ("post", "/admin/accounts"),
    ("post", "/admin/stock"),
    ("post", "/admin/activities"),
    ("get", "/admin/health"),
    ("get", "/metrics"),
];

/// Every route as (method, path), as the router below serves them: the OpenAPI description
/// must describe exactly these (`openapi` tests), and a route added to the router belongs here.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/noop"),
    ("get", "/id/{tag}"),
    ("get", "/id/{tag}/batch"),
    ("get", "/snowflake"),
    ("get", "/snowflake/decode/{id}"),
    ("get", "/semantic/{biz}"),
    ("post", "/tokens"),
    ("post", "/tokens/verify"),
    ("post", "/tokens/revoke"),
    ("post", "/tokens/once"),
    ("post", "/tokens/once/consume"),
    ("post", "/lottery/draw"),
    ("get", "/lottery/draws/{draw}"),
    ("get", "/ledger"),
    ("get", "/lottery/state"),
    ("post", "/tcc/branch"),
    ("post", "/tcc/branches"),
    ("get", "/admin/dead-letters"),
    ("post", "/admin/dead-letters/{xid}/retry"),
    ("post", "/admin/tags"),
    ("post", "/admin/accounts"),
    ("post", "/admin/stock"),
    ("post", "/admin/activities"),
    ("get", "/activities"),
    ("get", "/health"),
    ("get", "/admin/health"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

/// The router with the routes of the state's role, admission control and request counting.
/// Service-to-service routes (`/admin/*`, issuing JWTs, the participant route, raw state)
/// require the admin secret before anything else is read.
pub fn router(state: AppState) -> Router {
    let role = state.role;
    let mut open = Router::new().route("/noop", get(noop));
    let mut admin = Router::new();
    if matches!(role, Role::All | Role::Id) {
        open = open
            .route("/id/{tag}", get(next_id))
            .route("/id/{tag}/batch", get(next_ids))
            .route("/snowflake", get(snowflake))
            .route("/snowflake/decode/{id}", get(decode))
            .route("/semantic/{biz}", get(semantic_id));
        admin = admin.route("/admin/tags", post(create_tag));
    }
    // Routes a user's JWT opens: it is verified from the head, before the body is read.
    let mut user = Router::new();
    if role.has_tokens() {
        open = open
            .route("/tokens/verify", post(tokens::verify))
            .route("/tokens/revoke", post(tokens::revoke));
        user = user
            .route("/tokens/once", post(tokens::once_issue))
            .route("/tokens/once/consume", post(tokens::once_consume));
        admin = admin.route("/tokens", post(tokens::issue));
    }
    if matches!(role, Role::All | Role::Coordinator) {
        open = open.route("/lottery/draws/{draw}", get(draw_status));
        user = user.route("/lottery/draw", post(draw));
        admin = admin
            .route("/admin/dead-letters", get(dead_letters))
            .route("/admin/dead-letters/{xid}/retry", post(retry_dead_letter));
    }
    if role.has_activities() {
        open = open.route("/activities", get(list_activities));
        admin = admin.route("/admin/activities", post(register_activity));
    }
    if role.has_lottery() {
        admin = admin
            .route("/ledger", get(ledger))
            .route("/lottery/state", get(lottery_state));
    }
    if matches!(role, Role::All | Role::Wallet) {
        admin = admin.route("/admin/accounts", post(open_accounts));
    }
    if matches!(role, Role::All | Role::Inventory) {
        admin = admin.route("/admin/stock", post(add_stock));
    }
    let mut service = Router::new();
    if matches!(role, Role::All | Role::Wallet | Role::Inventory) {
        service = service.route(remote::BRANCH_ROUTE, post(branch)).route(
            remote::BRANCHES_ROUTE,
            post(branches).layer(DefaultBodyLimit::max(remote::BRANCHES_BODY_MAX_BYTES)),
        );
    }
    // Each request, in this order: its credential (from the head), its body (read whole, within
    // the body timeout, at most its route's limit), an admission slot, the handler. A `route_layer`
    // added later runs first.
    // (axum refuses a route layer over no routes: a role may have none of a kind.)
    let admitted = |routes: Router<AppState>, credential: Option<Guard>| {
        if !routes.has_routes() {
            return routes;
        }
        let routes = routes
            .route_layer(middleware::from_fn_with_state(state.clone(), admit))
            .route_layer(middleware::from_fn_with_state(
                state.clone(),
                read_body_first,
            ));
        match credential {
            Some(guard) => routes.route_layer(middleware::from_fn_with_state(state.clone(), guard)),
            None => routes,
        }
    };
    let mut admitted = admitted(open, None)
        .merge(admitted(admin, Some(require_admin)))
        .merge(admitted(service, Some(require_service)))
        .merge(admitted(user, Some(require_user)));
    if state.body_before_auth {
        admitted = admitted.route_layer(middleware::from_fn_with_state(
            state.clone(),
            read_largest_body_first,
        ));
    }
    // The operator's views of the process, outside admission (an overloaded server still
    // answers them): its full health always behind the operator's secret, its metrics too
    // unless `--metrics-public`.
    let mut ops = Router::new().route("/admin/health", get(health_detail));
    let mut metrics_route = Router::new().route("/metrics", get(metrics));
    if !state.metrics_public {
        ops = ops.merge(metrics_route);
        metrics_route = Router::new();
    }
    let ops = ops.route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    Router::new()
        .route("/health", get(health))
        .merge(metrics_route)
        .merge(ops)
        .route("/openapi.json", get(openapi::openapi_route))
        .merge(admitted)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_MAX_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// A middleware that decides a request's credential from its head.
type Guard = fn(State<AppState>, Request, Next) -> BoxedResponse;

/// A middleware's answer, boxed so that the guards share one type.
type BoxedResponse = std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;

fn require_service(State(state): State<AppState>, req: Request, next: Next) -> BoxedResponse {
    Box::pin(require_secret(state, req, next, auth::service))
}

fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> BoxedResponse {
    Box::pin(require_secret(state, req, next, auth::admin))
}

/// A secret decided from the head: a peer that presented too many wrong ones first, then the
/// secret, a wrong one counted against the peer.
async fn require_secret(
    state: AppState,
    req: Request,
    next: Next,
    check: fn(&AppState, &axum::http::HeaderMap) -> Result<(), ApiError>,
) -> Response {
    let peer = peer_ip(&req);
    if let Err(refused) = auth::not_throttled(&state, peer) {
        return refused_before_body(&state, req, refused);
    }
    match check(&state, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refused) => {
            auth::wrong_secret(&state, peer, req.headers());
            refused_before_body(&state, req, refused)
        }
    }
}

/// The peer's address (put into every request by the accept loop).
fn peer_ip(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The caller of a route a user's JWT opens, verified from the request's head by
/// [`require_user`] before its body is read.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The JWT's verified claims.
    pub claims: sut::token::Claims,
    /// The JWT itself (for the deployment's token service).
    pub jwt: String,
}

fn require_user(State(state): State<AppState>, mut req: Request, next: Next) -> BoxedResponse {
    Box::pin(async move {
        match auth::user(&state, req.headers()).await {
            Ok((claims, jwt)) => {
                req.extensions_mut().insert(Caller { claims, jwt });
                next.run(req).await
            }
            Err(refused) => refused_before_body(&state, req, refused),
        }
    })
}

/// The most of an unread body a refusal decided from the head drains (discarding it) so that
/// the client reads the refusal: closing a connection with body bytes still arriving resets it,
/// and a client whose answer is in flight then loses it. A larger or chunked body: closed.
const DRAIN_MAX_BYTES: u64 = 64 * 1024;

/// A refusal decided from the head, answered at once. The body is never kept: one announced up
/// to [`DRAIN_MAX_BYTES`] is read and dropped chunk by chunk, within the body timeout, after
/// the answer has gone (the connection then serves the client's next request); any other is
/// left unread and the connection closed after the answer.
fn refused_before_body(state: &AppState, req: Request, refused: ApiError) -> Response {
    let mut response = refused.into_response();
    if !request_has_body(&req) {
        return response;
    }
    let length = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(n) if n <= DRAIN_MAX_BYTES && state.body_read_ms > 0 => {
            let deadline = Duration::from_millis(state.body_read_ms);
            tokio::spawn(drain(req.into_body(), deadline));
        }
        _ => {
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
    }
    response
}

/// Reads `body` to its end within `deadline`, dropping each chunk as it comes: nothing of it
/// is kept (a body that does not end in time is dropped, and its connection closed).
async fn drain(body: axum::body::Body, deadline: Duration) {
    use http_body_util::BodyExt;
    let mut body = body;
    let _ = tokio::time::timeout(deadline, async {
        while let Some(Ok(_frame)) = body.frame().await {}
    })
    .await;
}

/// Whether the head announces a body (a length above 0, or chunks).
fn request_has_body(req: &Request) -> bool {
    let headers = req.headers();
    headers.contains_key(axum::http::header::TRANSFER_ENCODING)
        || headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

/// The most a route reads of a body: 16 KiB, and the batch of TCC messages 256 KiB.
fn body_max_bytes(req: &Request) -> usize {
    let batch = req
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| p.as_str() == remote::BRANCHES_ROUTE);
    if batch {
        remote::BRANCHES_BODY_MAX_BYTES
    } else {
        BODY_MAX_BYTES
    }
}

async fn count(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let response = next.run(req).await;
    state.metrics.count_request(
        route.as_deref().unwrap_or(metrics::UNMATCHED),
        response.status().as_u16(),
    );
    response
}

/// The body of a request whose credential (if its route takes one) was accepted, read whole
/// (within the body timeout, at most its route's limit) before an admission slot is taken, so a
/// client that stalls mid-body holds a connection but never a slot.
async fn read_body_first(State(state): State<AppState>, req: Request, next: Next) -> Response {
    // The planted weakness reads the body after admission, with no deadline (as it was).
    let read_first = state.body_read_ms > 0;
    let req = if !read_first {
        req
    } else {
        let max_bytes = body_max_bytes(&req);
        match listen::read_body(req, max_bytes, state.body_read_ms).await {
            Ok(req) => req,
            Err(refused) => {
                let timed_out = refused.status == StatusCode::REQUEST_TIMEOUT;
                if timed_out {
                    state
                        .metrics
                        .bodies_timed_out
                        .fetch_add(1, Ordering::Relaxed);
                }
                let mut response = refused.into_response();
                if timed_out {
                    // What is left of the body is not read: the connection cannot be reused.
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                return response;
            }
        }
    };
    next.run(req).await
}

/// The planted weakness `body_before_auth` (TEST ONLY): the body of every admitted request read
/// whole, up to the largest body any route takes, before its credential is looked at.
async fn read_largest_body_first(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let timeout_ms = state.body_read_ms.max(1);
    match listen::read_body(req, remote::BRANCHES_BODY_MAX_BYTES, timeout_ms).await {
        Ok(req) => next.run(req).await,
        Err(refused) => refused.into_response(),
    }
}

/// Admission of a complete request: a slot, or 503 with `Retry-After` when none frees in time.
async fn admit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match state.admission.admit().await {
        Ok((slot, waited)) => {
            if waited {
                state
                    .metrics
                    .overload_queued
                    .fetch_add(1, Ordering::Relaxed);
            }
            let response = next.run(req).await;
            drop(slot);
            response
        }
        Err(why) => {
            state
                .metrics
                .overload_rejected
                .fetch_add(1, Ordering::Relaxed);
            ApiError::unavailable(
                format!("overloaded ({why:?}), retry later"),
                state.admission.config().retry_after_s,
            )
            .into_response()
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::field(StatusCode::NOT_FOUND, "path", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::field(
        StatusCode::METHOD_NOT_ALLOWED,
        "method",
        "method not allowed on this route",
    )
}

/// A path segment as text; a segment that is not valid UTF-8 is a 400 naming `field`.
fn segment(
    path: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
    field: &str,
) -> Result<String, ApiError> {
    path.map(|UrlPath(s)| s)
        .map_err(|e| ApiError::bad(field, format!("bad path segment: {}", e.body_text())))
}

fn query_u64(query: Option<&str>, name: &str) -> Result<Option<u64>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            return v.parse::<u64>().map(Some).map_err(|_| {
                ApiError::bad(name, format!("{name} must be a non-negative integer"))
            });
        }
    }
    Ok(None)
}

#[derive(Serialize, ToSchema)]
struct Ok1 {
    ok: bool,
}

#[utoipa::path(
    get,
    path = "/noop",
    tag = "bench",
    summary = "The empty baseline handler",
    params(("delay_ms" = Option<u64>, Query, description = "Hold the request this long (ms)", maximum = 5000)),
    responses(
        (status = 200, description = "Done", body = Ok1),
        (status = 400, description = "`delay_ms` not an integer in 0..=5000", body = ErrorBody),
        (status = 403, description = "`delay_ms` on a server started without `--test-noop-delay` (`field: delay_ms`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn noop(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Ok1>, ApiError> {
    if let Some(ms) = query_u64(query.as_deref(), "delay_ms")? {
        if !state.noop_delay {
            return Err(ApiError::field(
                StatusCode::FORBIDDEN,
                "delay_ms",
                "this server holds no request on a client's say (a test knob: --test-noop-delay)",
            ));
        }
        if ms > NOOP_DELAY_MS_MAX {
            return Err(ApiError::bad(
                "delay_ms",
                format!("delay_ms must be at most {NOOP_DELAY_MS_MAX}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok(Json(Ok1 { ok: true }))
}

async fn tag_ids(state: &AppState, tag: String) -> Result<Arc<ids::TagIds>, ApiError> {
    let tags = Arc::clone(&state.ids()?.tags);
    if let Some(ids) = tags.loaded(&tag) {
        return Ok(ids);
    }
    tokio::task::spawn_blocking(move || tags.get(&tag))
        .await
        .map_err(|e| ApiError::internal(format!("worker task: {e}")))?
}

#[derive(Serialize, ToSchema)]
struct IdBody {
    id: u64,
    /// Segment IDs: the allocator incarnation that issued it (new at every start): IDs of one
    /// incarnation strictly increase; a restarted server may draw a lower, reclaimed range.
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/id/{tag}",
    tag = "ids",
    summary = "Next segment ID of a tag",
    params(("tag" = String, Path, pattern = "^[A-Za-z0-9_.-]{1,64}$", description = "Tag name: 1..=64 bytes of A-Z a-z 0-9 _ - .")),
    responses(
        (status = 200, description = "An ID", body = IdBody),
        (status = 400, description = "Bad tag name (`field: tag`)", body = ErrorBody),
        (status = 404, description = "Unknown tag (`field: tag`)", body = ErrorBody),
        (status = 409, description = "The tag has exhausted its ID space", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn next_id(
    State(state): State<AppState>,
    tag: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<IdBody>, ApiError> {
    let ids = tag_ids(&state, segment(tag, "tag")?).await?;
    let id = ids.next_id()?;
    state.metrics.ids_issued.fetch_add(1, Ordering::Relaxed);
    let instance = Some(state.ids()?.tags.instance().0);
    Ok(Json(IdBody { id, instance }))
}

#[derive(Serialize, ToSchema)]
struct IdsBody {
    ids: Vec<u64>,
    /// The allocator incarnation that issued them (see `IdBody`).
    instance: u64,
}

#[utoipa::path(
    get,
    path = "/id/{tag}/batch",
    tag = "ids",
    summary = "n increasing segment IDs of a tag",
    params(
        ("tag" = String, Path, pattern = "^[A-Za-z0-9_.-]{1,64}$", description = "Tag name: 1..=64 bytes of A-Z a-z 0-9 _ - ."),
        ("n" = u64, Query, description = "How many IDs", minimum = 1, maximum = 1000),
    ),
    responses(
        (status = 200, description = "IDs, increasing", body = IdsBody),
        (status = 400, description = "Bad tag name or `n` missing/out of 1..=1000 (names the field)", body = ErrorBody),
        (status = 404, description = "Unknown tag (`field: tag`)", body = ErrorBody),
        (status = 409, description = "The tag has exhausted its ID space", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn next_ids(
    State(state): State<AppState>,
    tag: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<IdsBody>, ApiError> {
    let tag = segment(tag, "tag")?;
    let n = query_u64(query.as_deref(), "n")?
        .ok_or_else(|| ApiError::bad("n", "query parameter n is required"))?;
    if n == 0 || n > BATCH_IDS_MAX {
        return Err(ApiError::bad(
            "n",
            format!("n must be within 1..={BATCH_IDS_MAX}"),
        ));
    }
    let ids = tag_ids(&state, tag).await?;
    let ids = ids.next_ids(n)?;
    state.metrics.ids_issued.fetch_add(n, Ordering::Relaxed);
    let instance = state.ids()?.tags.instance().0;
    Ok(Json(IdsBody { ids, instance }))
}

#[utoipa::path(
    get,
    path = "/snowflake",
    tag = "ids",
    summary = "Next Snowflake ID",
    responses(
        (status = 200, description = "An ID", body = IdBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn snowflake(State(state): State<AppState>) -> Result<Json<IdBody>, ApiError> {
    let id = state.ids()?.snowflake.next_id().await?;
    state
        .metrics
        .snowflake_issued
        .fetch_add(1, Ordering::Relaxed);
    Ok(Json(IdBody { id, instance: None }))
}

/// A semantic ID.
#[derive(Serialize, ToSchema)]
struct SemanticBody {
    /// The business type, then 10 digits of Unix seconds, 3 of machine (the worker id), 5 of
    /// sequence: `OD171702345612700042`.
    #[schema(pattern = "^[A-Z]{2}[0-9]{18}$")]
    id: String,
    /// The 18 digits as a number (seconds · 10⁸ + machine · 10⁵ + sequence): the IDs of one
    /// business type from one process increase with it.
    number: u64,
}

#[utoipa::path(
    get,
    path = "/semantic/{biz}",
    tag = "ids",
    summary = "Next semantic ID of a business type",
    params(("biz" = String, Path, description = "The business type: two capital letters served by this server (`--semantic-biz`, default OD, US, PM)")),
    responses(
        (status = 200, description = "An ID", body = SemanticBody),
        (status = 400, description = "Not two capital letters (`field: biz`)", body = ErrorBody),
        (status = 404, description = "A business type this server does not serve (`field: biz`)", body = ErrorBody),
        (status = 503, description = "This second's sequence is used up (`--semantic-per-second`), the clock stepped back, overload or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn semantic_id(
    State(state): State<AppState>,
    biz: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<SemanticBody>, ApiError> {
    let biz = segment(biz, "biz")?;
    let (id, number) = state.ids()?.snowflake.next_semantic(&biz).await?;
    state
        .metrics
        .semantic_issued
        .fetch_add(1, Ordering::Relaxed);
    Ok(Json(SemanticBody { id, number }))
}

#[utoipa::path(
    get,
    path = "/snowflake/decode/{id}",
    tag = "ids",
    summary = "The parts of a Snowflake ID",
    params(("id" = u64, Path, description = "A Snowflake ID")),
    responses(
        (status = 200, description = "The parts", body = openapi::DecodedSchema),
        (status = 400, description = "Not a non-negative 64-bit integer (`field: id`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn decode(
    State(state): State<AppState>,
    id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<sut::snowflake::Decoded>, ApiError> {
    let id: u64 = segment(id, "id")?
        .parse()
        .map_err(|_| ApiError::bad("id", "id must be a non-negative 64-bit integer"))?;
    Ok(Json(state.ids()?.snowflake.decode(id)))
}

#[derive(Serialize, ToSchema)]
struct HealthBody {
    /// What this process serves (`--role`).
    role: Role,
    /// This incarnation's instance id (roles with IDs).
    instance: Option<u64>,
    /// Per-tag allocator health (`sut::segment::Health`).
    #[schema(value_type = Vec<Object>)]
    tags: Vec<sut::segment::Health>,
    /// The Snowflake worker (roles with IDs).
    snowflake: Option<ids::SnowflakeView>,
    in_flight: usize,
    queued: usize,
    /// This process's wall clock when it answered, ms since the Unix epoch (what its Snowflake
    /// IDs, token expiries and deadlines read; a bench that steps the clock checks it here).
    wall_clock_ms: u64,
}

/// What `GET /health` tells anyone: that the process answers, its role, its load and its
/// clock; nothing of the business's volume (the allocators' issued IDs are behind the
/// operator's secret, at `GET /admin/health`).
#[derive(Serialize, ToSchema)]
struct PublicHealthBody {
    /// What this process serves (`--role`).
    role: Role,
    /// Requests running now.
    in_flight: usize,
    /// Requests waiting for an admission slot now.
    queued: usize,
    /// This process's wall clock when it answered, ms since the Unix epoch.
    wall_clock_ms: u64,
}

/// The wall clock now, ms since the Unix epoch (0 before it).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Every loaded tag's allocator health (blocking; none for a role without IDs).
async fn tag_healths(state: &AppState) -> Result<Vec<sut::segment::Health>, ApiError> {
    let Some(ids) = state.ids.clone() else {
        return Ok(Vec::new());
    };
    tokio::task::spawn_blocking(move || {
        ids.tags
            .all()
            .into_iter()
            .map(|(_, tag)| tag.health())
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("worker task: {e}")))
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "ops",
    summary = "The process answers: its role, load and clock (no business figures)",
    responses(
        (status = 200, description = "Health", body = PublicHealthBody),
    )
)]
async fn health(State(state): State<AppState>) -> Json<PublicHealthBody> {
    Json(PublicHealthBody {
        role: state.role,
        in_flight: state.admission.in_flight(),
        queued: state.admission.queued(),
        wall_clock_ms: wall_clock_ms(),
    })
}

#[utoipa::path(
    get,
    path = "/admin/health",
    tag = "ops",
    summary = "Instance, allocators, Snowflake worker, admission (the operator's)",
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 200, description = "Health", body = HealthBody),
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
    )
)]
async fn health_detail(State(state): State<AppState>) -> Result<Json<HealthBody>, ApiError> {
    let tags = tag_healths(&state).await?;
    Ok(Json(HealthBody {
        role: state.role,
        instance: state.ids.as_ref().map(|ids| ids.tags.instance().0),
        tags,
        snowflake: state.ids.as_ref().map(|ids| ids.snowflake.view()),
        in_flight: state.admission.in_flight(),
        queued: state.admission.queued(),
        wall_clock_ms: wall_clock_ms(),
    }))
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "ops",
    summary = "Prometheus metrics (the operator's, unless --metrics-public)",
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>` (none with `--metrics-public`)")),
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"),
        (status = 401, description = "No or a wrong admin secret, on a server without `--metrics-public` (`field: authorization`)", body = ErrorBody),
    )
)]
async fn metrics(State(state): State<AppState>) -> Response {
    let healths = tag_healths(&state).await.unwrap_or_default();
    let mut extra = allocator_lines(&healths);
    extra.extend(path_lines(&state));
    extra.extend(gauge_lines(&state));
    let body = state.metrics.render(&extra);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// A metrics line: series, help, value.
type MetricLine = (String, &'static str, String);

/// The allocators' counters, per tag: reloads, issued, fetch failures (each series together).
fn allocator_lines(healths: &[sut::segment::Health]) -> Vec<MetricLine> {
    let mut extra = Vec::new();
    for h in healths {
        let tag = metrics::escape(&h.tag);
        extra.push((
            format!("sut_allocator_reloads_total{{tag=\"{tag}\"}}"),
            "Segments granted to this server, per tag.",
            h.stats.reloads.to_string(),
        ));
    }
    for h in healths {
        let tag = metrics::escape(&h.tag);
        extra.push((
            format!("sut_allocator_issued_total{{tag=\"{tag}\"}}"),
            "IDs the allocator handed to the front (blocks), per tag.",
            h.stats.issued.to_string(),
        ));
    }
    for h in healths {
        let tag = metrics::escape(&h.tag);
        extra.push((
            format!("sut_allocator_fetch_failures_total{{tag=\"{tag}\"}}"),
            "Failed segment fetches, per tag.",
            h.stats.fetch_failures.to_string(),
        ));
    }
    extra
}

/// The ID fronts' paths taken, per tag and path (`front::FrontPaths`): what a run reached.
fn path_lines(state: &AppState) -> Vec<MetricLine> {
    let Some(ids) = &state.ids else {
        return Vec::new();
    };
    let mut extra = Vec::new();
    for (name, tag) in ids.tags.all() {
        let tag_label = metrics::escape(&name);
        for (path, count) in tag.paths().named() {
            extra.push((
                format!("sut_id_paths_total{{tag=\"{tag_label}\",path=\"{path}\"}}"),
                "Paths of the segment front taken, per tag: blocks published (block_refill), \
                 takes past another thread's block (take_past_block), batches across blocks \
                 (batch_across_blocks), refills and batches that waited for the store \
                 (refill_waited_for_store, batch_waited_for_store).",
                count.to_string(),
            ));
        }
    }
    extra
}

/// Snowflake, admission and revocation figures read at scrape time.
fn gauge_lines(state: &AppState) -> Vec<MetricLine> {
    let mut extra = Vec::new();
    if let Some(ids) = &state.ids {
        let sf = ids.snowflake.view();
        extra.push((
            "sut_snowflake_reserved_ts".to_owned(),
            "The persisted Snowflake time reservation (time units).",
            sf.reserved_ts.to_string(),
        ));
        extra.push((
            "sut_snowflake_rollback_refusals_total".to_owned(),
            "Snowflake refusals for a backward clock.",
            sf.stats.rollback_refusals.to_string(),
        ));
    }
    extra.push((
        "sut_connections_open".to_owned(),
        "Connections open now.",
        state
            .metrics
            .connections_open
            .load(Ordering::Relaxed)
            .to_string(),
    ));
    extra.push((
        "sut_admission_in_flight".to_owned(),
        "Requests running now.",
        state.admission.in_flight().to_string(),
    ));
    extra.push((
        "sut_admission_queued".to_owned(),
        "Requests waiting for a slot now.",
        state.admission.queued().to_string(),
    ));
    if let Some(tokens) = &state.tokens {
        let stats = lock(tokens).revocation_stats();
        extra.push((
            "sut_token_bloom_negatives_total".to_owned(),
            "Revocation checks the Bloom filter answered alone.",
            stats.bloom_negatives.to_string(),
        ));
        extra.push((
            "sut_token_exact_lookups_total".to_owned(),
            "Revocation checks that went on to the exact set.",
            stats.exact_lookups.to_string(),
        ));
    }
    extra
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct TagBody {
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    tag: String,
    #[schema(minimum = 1)]
    step: u64,
    #[serde(default = "one")]
    first_id: u64,
}

const fn one() -> u64 {
    1
}

#[utoipa::path(
    post,
    path = "/admin/tags",
    tag = "admin",
    summary = "Create a tag",
    request_body = TagBody,
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 201, description = "Created", body = openapi::TagRowSchema),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 409, description = "The tag exists (`field: tag`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn create_tag(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TagBody>,
) -> Result<(StatusCode, Json<sut::id_store::TagRow>), ApiError> {
    ids::validate_tag(&body.tag)?;
    let spec = TagSpec {
        first_id: body.first_id,
        ..TagSpec::simple(body.step)
    };
    spec.validate().map_err(|e| ids::store_error(&e))?;
    let tags = Arc::clone(&state.ids()?.tags);
    let row = tokio::task::spawn_blocking(move || tags.create(&body.tag, &spec))
        .await
        .map_err(|e| ApiError::internal(format!("worker task: {e}")))??;
    Ok((StatusCode::CREATED, Json(row)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AccountsBody {
    user: u64,
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    count: u64,
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    balance_minor: u64,
}

#[derive(Serialize, ToSchema)]
struct OpenedBody {
    opened: u64,
    existing: u64,
}

#[utoipa::path(
    post,
    path = "/admin/accounts",
    tag = "admin",
    summary = "Open accounts user..user+count",
    request_body = AccountsBody,
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 201, description = "Opened", body = OpenedBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 409, description = "A single account that exists already (`field: user`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn open_accounts(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AccountsBody>,
) -> Result<(StatusCode, Json<OpenedBody>), ApiError> {
    if body.count == 0 || body.count > lottery::ACCOUNTS_PER_REQUEST_MAX {
        return Err(ApiError::bad(
            "count",
            format!(
                "count must be within 1..={}",
                lottery::ACCOUNTS_PER_REQUEST_MAX
            ),
        ));
    }
    if body.user.checked_add(body.count).is_none() {
        return Err(ApiError::bad("count", "user + count overflows"));
    }
    if body.balance_minor > sut::lottery::AMOUNT_MAX {
        return Err(ApiError::bad(
            "balance_minor",
            "balance exceeds the maximum",
        ));
    }
    let (opened, existing) = state
        .lottery()?
        .open_accounts(body.user, body.count, body.balance_minor)
        .await?;
    if body.count == 1 && existing == 1 {
        return Err(ApiError::field(
            StatusCode::CONFLICT,
            "user",
            format!("user {} already has an account", body.user),
        ));
    }
    Ok((StatusCode::CREATED, Json(OpenedBody { opened, existing })))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StockBody {
    activity: u64,
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    units: u64,
}

#[utoipa::path(
    post,
    path = "/admin/stock",
    tag = "admin",
    summary = "Add prize stock to an activity",
    request_body = StockBody,
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 200, description = "Added", body = Ok1),
        (status = 404, description = "The activity is not registered (`field: activity`)", body = ErrorBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn add_stock(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<StockBody>,
) -> Result<Json<Ok1>, ApiError> {
    if body.units > sut::lottery::AMOUNT_MAX {
        return Err(ApiError::bad("units", "units exceed the maximum"));
    }
    registered(&state, body.activity)?;
    state
        .lottery()?
        .add_stock(body.activity, body.units)
        .await?;
    Ok(Json(Ok1 { ok: true }))
}

/// 404 naming `activity` unless the operator registered it here.
fn registered(state: &AppState, activity: u64) -> Result<(), ApiError> {
    if state
        .activities()?
        .snapshot()
        .get(ActivityId(activity))
        .is_some()
    {
        return Ok(());
    }
    Err(ApiError::field(
        StatusCode::NOT_FOUND,
        "activity",
        format!("activity {activity} is not registered (POST /admin/activities first)"),
    ))
}

/// An activity and its terms (`POST /admin/activities`, `GET /activities`).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ActivityBody {
    /// The activity's id (with `count`: the first of `count` consecutive ids, all with these
    /// terms; the last at most 2^63 - 1, what the stores' integer columns hold).
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    activity: u64,
    /// How many consecutive activities to register (default 1, at most 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000)]
    count: Option<u64>,
    /// The ticket price every draw pays, in minor units; 0 only with `"free": true`.
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    price_minor: u64,
    /// Draws cost nothing: required with a `price_minor` of 0, refused with any other (a price
    /// of 0 left in by mistake would give every prize away).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    free: Option<bool>,
    /// Winning draws per thousand (default: the server's `--win-per-mille`).
    #[serde(default)]
    #[schema(maximum = 1000)]
    win_per_mille: Option<u32>,
    /// When draws open, ms since the Unix epoch (default: always open).
    #[serde(default)]
    opens_at_ms: Option<u64>,
    /// When draws close (exclusive), ms since the Unix epoch (default: never).
    #[serde(default)]
    closes_at_ms: Option<u64>,
}

/// The largest activity id: the stores keep ids in signed 64-bit integer columns.
pub const ACTIVITY_ID_MAX: u64 = i64::MAX as u64;

/// Most activities one `POST /admin/activities` registers.
pub const ACTIVITIES_PER_REQUEST_MAX: u64 = 10_000;

/// What a registration did.
#[derive(Serialize, ToSchema)]
struct RegisteredBody {
    /// `created` (at least one activity is new), or `unchanged` (every one had these terms
    /// already).
    registered: &'static str,
    /// Activities registered by this call.
    created: u64,
    /// Activities that had these terms already.
    unchanged: u64,
}

#[utoipa::path(
    post,
    path = "/admin/activities",
    tag = "admin",
    summary = "Register an activity and its terms (price, odds, opening hours); terms never change once registered",
    request_body = ActivityBody,
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 201, description = "Registered (durable)", body = RegisteredBody),
        (status = 200, description = "The same terms were registered already: nothing changed", body = RegisteredBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 409, description = "The activity is registered with other terms, or the registry is full (`field: activity`); nothing changed", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn register_activity(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ActivityBody>,
) -> Result<(StatusCode, Json<RegisteredBody>), ApiError> {
    use sut::lottery::TermsError;
    match (body.price_minor, body.free.unwrap_or(false)) {
        (0, false) => {
            return Err(ApiError::bad(
                "price_minor",
                "a price_minor of 0 gives every draw away: say \"free\": true if that is meant",
            ));
        }
        (price, true) if price > 0 => {
            return Err(ApiError::bad(
                "free",
                format!("\"free\": true with a price_minor of {price}: give one or the other"),
            ));
        }
        _ => {}
    }
    let terms = sut::lottery::Terms {
        price_minor: body.price_minor,
        win_per_mille: body.win_per_mille.unwrap_or(state.win_per_mille),
        opens_at_ms: body.opens_at_ms.unwrap_or(0),
        closes_at_ms: body.closes_at_ms.unwrap_or(u64::MAX),
    };
    let count = body.count.unwrap_or(1);
    if !(1..=ACTIVITIES_PER_REQUEST_MAX).contains(&count) {
        return Err(ApiError::bad(
            "count",
            format!("count must be within 1..={ACTIVITIES_PER_REQUEST_MAX}"),
        ));
    }
    if body.activity > ACTIVITY_ID_MAX {
        return Err(ApiError::bad(
            "activity",
            format!("activity ids go up to {ACTIVITY_ID_MAX}"),
        ));
    }
    if body.activity + (count - 1) > ACTIVITY_ID_MAX {
        return Err(ApiError::bad(
            "count",
            format!(
                "activities {}..{} would go past the last id, {ACTIVITY_ID_MAX}",
                body.activity,
                u128::from(body.activity) + u128::from(count)
            ),
        ));
    }
    let activities = Arc::clone(state.activities()?);
    let activity = ActivityId(body.activity);
    let (created, unchanged) =
        tokio::task::spawn_blocking(move || activities.register_range(activity, count, terms))
            .await
            .map_err(|e| ApiError::internal(format!("worker task: {e}")))?
            .map_err(|e| match e {
                activities::RegisterError::Terms(t) => {
                    let field = match t {
                        TermsError::PriceTooLarge { .. } => "price_minor",
                        TermsError::OddsOutOfRange { .. } => "win_per_mille",
                        TermsError::EmptyWindow { .. } => "closes_at_ms",
                        TermsError::Conflict { .. } | TermsError::Full => {
                            return ApiError::field(
                                StatusCode::CONFLICT,
                                "activity",
                                t.to_string(),
                            );
                        }
                    };
                    ApiError::bad(field, t.to_string())
                }
                activities::RegisterError::Store(m) => {
                    ApiError::unavailable(format!("activity store: {m}"), 1)
                }
            })?;
    let (status, registered) = if created > 0 {
        (StatusCode::CREATED, "created")
    } else {
        (StatusCode::OK, "unchanged")
    };
    Ok((
        status,
        Json(RegisteredBody {
            registered,
            created,
            unchanged,
        }),
    ))
}

#[utoipa::path(
    get,
    path = "/activities",
    tag = "lottery",
    summary = "The registered activities and their terms: what a draw costs, its odds and when it is open",
    responses(
        (status = 200, description = "Every registered activity, in id order", body = Vec<ActivityBody>),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn list_activities(
    State(state): State<AppState>,
) -> Result<Json<Vec<ActivityBody>>, ApiError> {
    let registry = state.activities()?.snapshot();
    Ok(Json(
        registry
            .iter()
            .map(|(id, t)| ActivityBody {
                activity: id.0,
                count: None,
                price_minor: t.price_minor,
                free: (t.price_minor == 0).then_some(true),
                win_per_mille: Some(t.win_per_mille),
                opens_at_ms: Some(t.opens_at_ms),
                closes_at_ms: Some(t.closes_at_ms),
            })
            .collect(),
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DrawBody {
    /// A registered activity (`GET /activities`).
    activity: u64,
    /// The ticket price: the activity's, set by the operator. A body may repeat it; naming any
    /// other price is refused (403 naming `price_minor`).
    #[serde(default)]
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    price_minor: Option<u64>,
    /// The one-time submit token of (user, activity, this hour), from `POST /tokens/once`
    /// (32 hex digits); consumed before the draw begins.
    #[schema(pattern = "^[0-9a-fA-F]{32}$")]
    once_token: String,
    /// The drawing user: may repeat the JWT's subject, never differ from it.
    #[serde(default)]
    user: Option<u64>,
    /// Test knob: force the draw's luck; refused unless the server was started with
    /// `--test-forced-outcomes`.
    #[serde(default)]
    won: Option<bool>,
}

#[utoipa::path(
    post,
    path = "/lottery/draw",
    tag = "lottery",
    summary = "A TCC lottery draw by the JWT's user, admitted by a one-time submit token",
    request_body = DrawBody,
    params(("Authorization" = String, Header, description = "`Bearer <JWT>` of the drawing user (from `POST /tokens`)")),
    responses(
        (status = 200, description = "Confirmed", body = lottery::DrawAnswer),
        (status = 202, description = "Pending: the verdict is logged and compensation is redelivering it; follow `GET /lottery/draws/{xid}`", body = lottery::DrawAnswer),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 401, description = "No JWT, or one that is forged, expired, revoked, `alg: none` or malformed (`field: authorization`)", body = ErrorBody),
        (status = 403, description = "The body names another user (`field: user`), the one-time token is another user's (`field: user`) or another activity's (`field: once_token`), or it chooses `won` on a server that decides it (`field: won`)", body = ErrorBody),
        (status = 404, description = "Unknown one-time token (`field: once_token`)", body = ErrorBody),
        (status = 409, description = "The one-time token was used (`field: once_token`), or the draw was cancelled: no account, low balance, already took part (`field: user`) or no stock (`field: activity`)", body = ErrorBody),
        (status = 410, description = "The one-time token expired (`field: once_token`)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 429, description = "This user draws too fast; retry after `Retry-After` seconds (`field: user`)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn draw(
    State(state): State<AppState>,
    axum::Extension(Caller { claims, jwt }): axum::Extension<Caller>,
    JsonBody(body): JsonBody<DrawBody>,
) -> Result<(StatusCode, Json<lottery::DrawAnswer>), ApiError> {
    let user = sut::gate::drawer(&claims, body.user).map_err(|r| auth::gate_error(&r))?;
    if body
        .price_minor
        .is_some_and(|p| p > sut::lottery::AMOUNT_MAX)
    {
        return Err(ApiError::bad("price_minor", "price exceeds the maximum"));
    }
    let once = sut::token::OnceToken::parse(&body.once_token)
        .ok_or_else(|| ApiError::bad("once_token", "once_token must be 32 hex digits"))?;
    let forced = sut::gate::forced_outcome(body.won, state.forced_outcomes)
        .map_err(|r| auth::gate_error(&r))?;
    let now_ms = state.clock.now().wall_ms;
    let activity = ActivityId(body.activity);
    // The activity's terms, before anything is consumed: the price is the operator's.
    let (terms, price_minor) = sut::gate::draw_terms(
        &state.activities()?.snapshot(),
        activity,
        body.price_minor,
        now_ms,
        state.client_price,
    )
    .map_err(|r| auth::gate_error(&r))?;
    auth::within_rate(&state.limiter, user, now_ms, "draws")?;
    let key = auth::consume_once(
        &state,
        &jwt,
        user,
        once,
        &sut::gate::once_activity(activity),
    )
    .await?;
    sut::gate::check_once_key(&key, user, activity).map_err(|r| auth::gate_error(&r))?;
    let won = match forced {
        Some(w) => w,
        None => terms
            .wins(getrandom::u32().map_err(|e| ApiError::internal(format!("randomness: {e}")))?),
    };
    let xid = tag_ids(&state, XID_TAG.to_owned()).await?.next_id()?;
    let answer = state
        .lottery()?
        .draw(DrawArgs {
            xid: Xid(xid),
            user,
            activity,
            price_minor,
            won,
        })
        .await?;
    state.metrics.lottery_draws.fetch_add(1, Ordering::Relaxed);
    let status = if answer.outcome == "pending" {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(answer)))
}

#[utoipa::path(
    get,
    path = "/lottery/draws/{draw}",
    tag = "lottery",
    summary = "Where a draw is: in progress, pending (compensation), dead-lettered, confirmed or cancelled; to its owner or the operator",
    params(
        ("draw" = String, Path, pattern = "^[0-9a-f]{16}$", description = "The draw's handle (from its answer)"),
        ("Authorization" = String, Header, description = "`Bearer <JWT>` of the draw's user, or `Bearer <admin secret>`"),
    ),
    responses(
        (status = 200, description = "The draw's status", body = lottery::DrawStatusBody),
        (status = 400, description = "Not 16 hex digits (`field: draw`)", body = ErrorBody),
        (status = 401, description = "No credential, or one that does not verify (`field: authorization`)", body = ErrorBody),
        (status = 404, description = "No such draw of yours (unknown, another user's, or finished long ago and forgotten)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn draw_status(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    connect: Option<axum::Extension<axum::extract::ConnectInfo<SocketAddr>>>,
    draw: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<lottery::DrawStatusBody>, ApiError> {
    let peer = connect.map(|c| c.0.0.ip());
    auth::not_throttled(&state, peer)?;
    let text = segment(draw, "draw")?;
    let handle = sut::gate::handle::DrawHandle::parse(&text).ok_or_else(|| {
        ApiError::bad(
            "draw",
            "draw must be 16 hex digits (from the draw's answer)",
        )
    })?;
    // The operator sees every draw; a user only their own, and learns nothing of the others
    // (another user's draw is as absent as one that never was).
    let owner = if auth::admin(&state, &headers).is_ok() {
        None
    } else {
        // Neither the operator's secret nor a JWT: a guess of the secret, counted.
        let (claims, jwt) = auth::user(&state, &headers).await.inspect_err(|e| {
            if e.status == StatusCode::UNAUTHORIZED {
                auth::wrong_secret(&state, peer, &headers);
            }
        })?;
        auth::not_revoked(&state, &jwt).await?;
        Some(sut::gate::drawer(&claims, None).map_err(|r| auth::gate_error(&r))?)
    };
    let xid = state.handles.open(handle);
    let status = state.lottery()?.status(xid).await?;
    match status {
        Some(body) if owner.is_none_or(|u| u.0 == body.user) => Ok(Json(body)),
        _ => Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "draw",
            format!("no draw {handle} of yours (unknown, or finished long ago and forgotten)"),
        )),
    }
}

#[utoipa::path(
    get,
    path = "/admin/dead-letters",
    tag = "admin",
    summary = "Draws compensation gave up on: each still has a logged verdict to deliver",
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 200, description = "The dead letters, in xid order", body = Vec<lottery::DeadLetterBody>),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn dead_letters(
    State(state): State<AppState>,
) -> Result<Json<Vec<lottery::DeadLetterBody>>, ApiError> {
    state.lottery()?.dead_letters().await.map(Json)
}

/// A draw's xid from the path: a non-negative 64-bit integer, else 400 naming `xid`.
fn xid_param(
    xid: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<u64, ApiError> {
    segment(xid, "xid")?
        .parse()
        .map_err(|_| ApiError::bad("xid", "xid must be a non-negative 64-bit integer"))
}

#[utoipa::path(
    post,
    path = "/admin/dead-letters/{xid}/retry",
    tag = "admin",
    summary = "Retry a dead letter: compensation delivers its logged verdict again, with a fresh retry budget",
    params(
        ("Authorization" = String, Header, description = "`Bearer <admin secret>`"),
        ("xid" = u64, Path, description = "The dead-lettered draw's xid"),
    ),
    responses(
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 202, description = "Parked again, its first round due now: follow it with `GET /lottery/draws/{xid}`", body = lottery::DrawStatusBody),
        (status = 400, description = "Not a non-negative 64-bit integer (`field: xid`)", body = ErrorBody),
        (status = 409, description = "The draw is not dead-lettered (unknown, finished, or still in compensation; `field: xid`); nothing changed", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn retry_dead_letter(
    State(state): State<AppState>,
    xid: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<(StatusCode, Json<lottery::DrawStatusBody>), ApiError> {
    let xid = xid_param(xid)?;
    let status = state.lottery()?.retry_dead_letter(Xid(xid)).await?;
    Ok((StatusCode::ACCEPTED, Json(status)))
}

#[utoipa::path(
    get,
    path = "/ledger",
    tag = "lottery",
    summary = "Ledger summary and invariant checks (the operator's)",
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 200, description = "The ledger", body = lottery::LedgerReport),
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn ledger(State(state): State<AppState>) -> Result<Json<lottery::LedgerReport>, ApiError> {
    state.lottery()?.ledger().await.map(Json)
}

#[utoipa::path(
    post,
    path = "/tcc/branch",
    tag = "lottery",
    summary = "Participant route: one coordinator message (Try, Confirm or Cancel) for a branch this process hosts",
    request_body = BranchRequest,
    responses(
        (status = 200, description = "The participant's reply, durable before it is sent (its fence makes redeliveries idempotent)", body = Object),
        (status = 400, description = "Malformed JSON (`field: body`)", body = ErrorBody),
        (status = 401, description = "No or a wrong service credential: the coordinator's, which the operator's secret is not (`field: authorization`)", body = ErrorBody),
        (status = 404, description = "This process does not host the branch (`field: branch`)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn branch(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<BranchRequest>,
) -> Result<Json<sut::lottery::ParticipantReply>, ApiError> {
    hosted(&state, &body)?;
    let mut replies = state
        .lottery()?
        .branches(vec![(body.branch, body.msg)])
        .await?;
    let reply = replies
        .pop()
        .ok_or_else(|| ApiError::internal("no reply"))?;
    Ok(Json(reply))
}

/// 404 naming the branch unless this process hosts it.
fn hosted(state: &AppState, request: &BranchRequest) -> Result<(), ApiError> {
    if remote::hosts(state.role, request.branch) {
        return Ok(());
    }
    Err(ApiError::field(
        StatusCode::NOT_FOUND,
        "branch",
        format!(
            "branch {} is not hosted by this process (role `{}`)",
            request.branch,
            state.role.name()
        ),
    ))
}

#[utoipa::path(
    post,
    path = "/tcc/branches",
    tag = "lottery",
    summary = "Participant route: many coordinator messages, run in order in one durable batch (what a coordinator in another process sends)",
    request_body = remote::BranchBatch,
    responses(
        (status = 200, description = "One reply per message, in order, durable before they are sent", body = remote::BranchReplies),
        (status = 400, description = "Malformed JSON (`field: body`), or no message or more than 48 (`field: messages`)", body = ErrorBody),
        (status = 401, description = "No or a wrong service credential: the coordinator's, which the operator's secret is not (`field: authorization`)", body = ErrorBody),
        (status = 404, description = "This process does not host a message's branch (`field: branch`); nothing ran", body = ErrorBody),
        (status = 413, description = "Body over 256 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn branches(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<remote::BranchBatch>,
) -> Result<Json<remote::BranchReplies>, ApiError> {
    let count = body.messages.len();
    if !(1..=remote::BRANCHES_MAX).contains(&count) {
        return Err(ApiError::bad(
            "messages",
            format!("{count} messages: send 1 to {}", remote::BRANCHES_MAX),
        ));
    }
    for request in &body.messages {
        hosted(&state, request)?;
    }
    let msgs = body
        .messages
        .into_iter()
        .map(|r| (r.branch, r.msg))
        .collect();
    let replies = state.lottery()?.branches(msgs).await?;
    Ok(Json(remote::BranchReplies { replies }))
}

#[utoipa::path(
    get,
    path = "/lottery/state",
    tag = "lottery",
    summary = "This process's part of the lottery, raw (ledger and the coordinator's outcome events), for a verifier that merges every process of a deployment",
    responses(
        (status = 200, description = "The state", body = lottery::LotteryState),
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
async fn lottery_state(
    State(state): State<AppState>,
) -> Result<Json<lottery::LotteryState>, ApiError> {
    state.lottery()?.state().await.map(Json)
}

#[cfg(test)]
mod tests {
    use super::weak_secret;

    #[test]
    fn weak_secrets_are_named_and_random_ones_pass() {
        for weak in ["aaaaaaaaaaaaaaaa", "abababababababab", "passwordpassword1"] {
            assert!(weak_secret(weak).is_some(), "{weak}");
        }
        assert!(
            weak_secret("aaaaaaaaaaaaaaab")
                .unwrap()
                .contains("15 of its 16")
        );
        // The secrets of this repository's own runs: random hex, and long phrases.
        for fine in [
            "0f3c9a1b7e2d4c6a8b0e1f2d3c4b5a69",
            "an-admin-secret-of-32-bytes-or-more",
            "test-admin-secret-0123456789",
            "slow-clients-test-admin-secret",
        ] {
            assert_eq!(weak_secret(fine), None, "{fine}");
        }
    }
}
