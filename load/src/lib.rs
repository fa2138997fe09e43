//! goose load generation against the real `sut-server` (docs/architecture.md, "The rule": this
//! is the client of the real driver).
//!
//! [`run`] sets a workload up through the admin routes, runs a goose 0.19 attack (built with
//! `GooseAttack::initialize_with_config`, never from process arguments), measures every
//! request itself into per-endpoint microsecond HdrHistograms ([`stats`]), optionally on a
//! constant-rate open-model schedule with coordinated-omission correction (wrk2 style), samples
//! the server's CPU and RSS from `/proc` ([`target`]), and verifies afterwards that every ID
//! was unique, the ledger's checks hold and no one-time token was accepted twice ([`verify`]).
//! The result is a [`reports::model::LoadReport`]; a violated check makes
//! [`reports::model::LoadReport::passed`] false (callers must fail the run on it).

pub mod cluster;
pub mod conn;
pub mod crash;
pub mod stats;
pub mod target;
pub mod verify;
pub mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use goose::config::GooseConfiguration;
use goose::prelude::*;
use reports::model::{InvariantResult, Judgement, LoadReport};
use serde_json::{Value, json};

pub use crate::cluster::{ClusterOptions, cluster_run};
pub use crate::crash::{CrashOptions, crash_under_load};
use crate::stats::Schedule;
use crate::target::{Sampler, ServerProcess};
pub use crate::workload::Mix;
use crate::workload::{Kind, LotteryPlan, Shared};
pub use chaos::nemesis::{ChaosFault, ChaosOptions};
pub use sut::flaw::Flaw;

/// Most users of one run.
pub const USERS_MAX: u64 = 10_000;
/// Longest run (warm-up plus measurement), in seconds.
pub const RUN_MAX_S: u64 = 24 * 3600;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadOptions {
    /// One of [`catalog`]: `id`, `id-single`, `snowflake`, `tokens`, `once`, `lottery`,
    /// `mixed`, `crash`.
    pub workload: String,
    /// Concurrent goose users (1..=[`USERS_MAX`]).
    pub users: u64,
    /// Total operations per second over all users (constant-rate open model); `None`:
    /// closed loop, each user sends its next operation when the previous one is answered.
    pub rate: Option<f64>,
    /// Measured seconds (after the warm-up).
    pub duration_s: u64,
    /// Warm-up seconds: run but not measured (IDs received in it are verified all the same).
    pub warmup_s: u64,
    /// Base URL of a running server (`http://127.0.0.1:8080`); `None`: start a fresh
    /// `sut-server` child on a temporary database (see [`target`] for where it is found).
    pub host: Option<String>,
    /// Write one HdrHistogram interval log per endpoint (`<endpoint>.hlog`) into this directory.
    pub hlog_dir: Option<PathBuf>,
    /// Operation weights; `None`: the mix of the catalog workload named by `workload` (with a
    /// mix, `workload` is only the run's label).
    pub mix: Option<Mix>,
    /// Start the child server with this documented flaw switched on (`sut-server --flaw`).
    /// Only with a fresh child server (`host: None`).
    pub flaw: Option<Flaw>,
    /// The admin secret of a `--host` target (its `/admin/*` routes and `POST /tokens`);
    /// `None`: the environment's `SUT_ADMIN_TOKEN`. The servers the bench starts get their own.
    pub admin_token: Option<String>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            workload: "id".to_owned(),
            users: 16,
            rate: None,
            duration_s: 10,
            warmup_s: 2,
            host: None,
            hlog_dir: None,
            mix: None,
            flaw: None,
            admin_token: None,
        }
    }
}

impl LoadOptions {
    /// The operation weights of this run.
    #[must_use]
    pub fn effective_mix(&self) -> Option<Mix> {
        self.mix.or_else(|| Mix::named(&self.workload))
    }
}

/// What a run measured besides its report: figures that explain the report's latency but are
/// not part of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diagnostics {
    /// Constant rate only: the client's own lateness in sending on schedule (not counted as
    /// latency), over `sends` operations.
    pub send_lateness: reports::model::Percentiles,
    /// Operations whose lateness was recorded.
    pub sends: u64,
    /// Per endpoint: latency from the intended send time regardless of who caused the
    /// lateness (the strict wrk2 figure; its excess over `corrected` is client lateness).
    pub from_schedule: Vec<(String, reports::model::Percentiles)>,
}

/// Why a load run could not be carried out (a run that was carried out but whose
/// verification failed is an `Ok` report that does not pass).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("bad option `{field}`: {reason}")]
    BadOption { field: &'static str, reason: String },
    #[error("sut-server binary: {0}")]
    ServerBinary(String),
    #[error("sut-server: {0}")]
    Server(String),
    #[error("setup request {what} failed: {reason}")]
    Setup { what: String, reason: String },
    #[error("goose: {0}")]
    Goose(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A workload of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub name: &'static str,
    pub description: &'static str,
}

/// The workloads [`run`] accepts.
#[must_use]
pub fn catalog() -> Vec<WorkloadInfo> {
    workload::CATALOG
        .iter()
        .map(|(name, description)| WorkloadInfo { name, description })
        .collect()
}

fn check_options(opts: &LoadOptions) -> Result<(), LoadError> {
    let bad = |field, reason: String| Err(LoadError::BadOption { field, reason });
    match opts.mix {
        None if Mix::named(&opts.workload).is_none() => {
            let known: Vec<_> = workload::CATALOG.iter().map(|(n, _)| *n).collect();
            return bad(
                "workload",
                format!("unknown `{}`; known: {}", opts.workload, known.join(", ")),
            );
        }
        Some(mix) => {
            if let Err(reason) = mix.validate() {
                return bad("mix", reason);
            }
        }
        None => {}
    }
    if let (Some(flaw), Some(host)) = (opts.flaw, &opts.host) {
        return bad(
            "flaw",
            format!("`{flaw}` can only be switched on in a fresh child server, not in {host}"),
        );
    }
    if opts.users == 0 || opts.users > USERS_MAX {
        return bad("users", format!("{} not in 1..={USERS_MAX}", opts.users));
    }
    if let Some(r) = opts.rate
        && Schedule::new(r, opts.users).is_none()
    {
        return bad("rate", format!("{r} is not a positive finite rate"));
    }
    if opts.duration_s == 0 || opts.duration_s + opts.warmup_s > RUN_MAX_S {
        return bad(
            "duration_s",
            format!("need 1..={RUN_MAX_S} s including the warm-up"),
        );
    }
    Ok(())
}

/// Runs one load test and verifies it.
///
/// # Errors
/// Bad options, no server, a failed setup request, or goose failing to run.
pub fn run(opts: LoadOptions) -> Result<LoadReport, LoadError> {
    run_detailed(opts).map(|(report, _)| report)
}

/// [`run`], also returning the [`Diagnostics`].
///
/// # Errors
/// As [`run`].
pub fn run_detailed(opts: LoadOptions) -> Result<(LoadReport, Diagnostics), LoadError> {
    check_options(&opts)?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = client_threads() {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build()?;
    rt.block_on(run_async(opts))
}

/// Environment variable that sets the number of worker threads of the client's tokio
/// runtime (a positive integer; default: one per core, tokio's default). For measurements
/// only: on two cores shared with the server, one worker was no clear gain in a closed loop
/// and fell behind constant rates of 5,000/s and more (docs/load.md, "Figures").
pub const CLIENT_THREADS_ENV: &str = "LOADGEN_CLIENT_THREADS";

/// The worker threads [`CLIENT_THREADS_ENV`] asks for, if it is set to a positive integer.
#[must_use]
pub fn client_threads() -> Option<usize> {
    std::env::var(CLIENT_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
}

/// The `sut-server` arguments that switch `flaw` on.
#[must_use]
pub fn flaw_args(flaw: Option<Flaw>) -> Vec<String> {
    flaw.map(|f| vec!["--flaw".to_owned(), f.name().to_owned()])
        .unwrap_or_default()
}

struct Admin {
    client: reqwest::Client,
    base: String,
    /// The admin secret, sent as `Authorization: Bearer …` when set.
    token: Option<String>,
}

impl Admin {
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), LoadError> {
        self.send_to(&self.base, method, path, body).await
    }

    async fn send_to(
        &self,
        base: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), LoadError> {
        let url = format!("{base}{path}");
        let mut req = match (method, body) {
            ("GET", _) => self.client.get(&url),
            (_, Some(b)) => self.client.post(&url).json(&b),
            (_, None) => self.client.post(&url),
        };
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let what = format!("{method} {path}");
        let resp = req.send().await.map_err(|e| LoadError::Setup {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| LoadError::Setup {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    async fn expect(
        &self,
        base: &str,
        method: &str,
        path: &str,
        body: Value,
        ok: &[u16],
    ) -> Result<Value, LoadError> {
        let (status, v) = self.send_to(base, method, path, Some(body)).await?;
        if ok.contains(&status) {
            Ok(v)
        } else {
            Err(LoadError::Setup {
                what: format!("{method} {path}"),
                reason: format!("status {status}: {v}"),
            })
        }
    }
}

/// Where a run's setup calls and ledger reads go: one server for all of them, or the processes
/// of a deployment.
#[derive(Clone, Debug)]
struct Bases {
    /// Where tags are created.
    ids: String,
    /// Where accounts are opened.
    wallet: String,
    /// Where stock is added.
    inventory: String,
    /// Every process with a `/ledger`, named (the names prefix the checks when there are
    /// several).
    ledgers: Vec<(String, String)>,
    /// Every process that keeps an activity registry (the run's activities are registered in
    /// each: the coordinator's gate, the participants' terms rule, the token service).
    registries: Vec<String>,
}

impl Bases {
    fn single(base: &str) -> Self {
        Self {
            ids: base.to_owned(),
            wallet: base.to_owned(),
            inventory: base.to_owned(),
            ledgers: vec![("server".to_owned(), base.to_owned())],
            registries: vec![base.to_owned()],
        }
    }
}

/// What [`prepare`] set up on the server.
struct Prepared {
    admin: Admin,
    bases: Bases,
    run_id: u64,
    tag: String,
    lottery: Option<LotteryPlan>,
    /// The registered activity the one-time token operations ask tokens for.
    once_activity: u64,
}

fn admin_client(base: &str) -> Result<Admin, LoadError> {
    Ok(Admin {
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| LoadError::Setup {
                what: "client".to_owned(),
                reason: e.to_string(),
            })?,
        base: base.to_owned(),
        token: None,
    })
}

/// Creates the tag, accounts and stock the workload needs (names distinct per run, so that a
/// running server can be targeted repeatedly).
async fn prepare(
    bases: &Bases,
    opts: &LoadOptions,
    step: u64,
    admin_token: Option<String>,
) -> Result<Prepared, LoadError> {
    let mut admin = admin_client(&bases.ledgers[0].1)?;
    admin.token = admin_token;
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
        % 1_000_000_000;
    let tag = format!("loadgen-{run_id}");
    let (need_ids, need_lottery) = opts.effective_mix().unwrap_or_default().needs();
    if need_ids {
        admin
            .expect(
                &bases.ids,
                "POST",
                "/admin/tags",
                json!({"tag": tag, "step": step}),
                &[200, 201, 409],
            )
            .await?;
    }
    let total_s = opts.warmup_s + opts.duration_s;
    let activity_base = run_id * 10_000;
    let lottery_activities = if need_lottery {
        let rate = opts
            .rate
            .unwrap_or(workload::LOTTERY_RATE_MAX)
            .min(workload::LOTTERY_RATE_MAX);
        let draws = (rate * (total_s as f64 + 1.0)).ceil() as u64;
        draws.div_ceil(workload::LOTTERY_USERS).max(1)
    } else {
        0
    };
    // The operator's activities: the lottery's, and one past them for the one-time tokens.
    let once_activity = activity_base + lottery_activities;
    register_activities(&admin, bases, activity_base, lottery_activities + 1).await?;
    let lottery = if need_lottery {
        let activities = lottery_activities;
        let plan = LotteryPlan {
            user_base: run_id * 100_000,
            activity_base,
            activities,
        };
        admin
            .expect(
                &bases.wallet,
                "POST",
                "/admin/accounts",
                json!({
                    "user": plan.user_base,
                    "count": workload::LOTTERY_USERS,
                    "balance_minor": activities * workload::PRICE_MINOR,
                }),
                &[200, 201],
            )
            .await?;
        for a in 0..activities {
            admin
                .expect(
                    &bases.inventory,
                    "POST",
                    "/admin/stock",
                    json!({"activity": plan.activity_base + a, "units": workload::LOTTERY_USERS}),
                    &[200, 201],
                )
                .await?;
        }
        Some(plan)
    } else {
        None
    };
    Ok(Prepared {
        admin,
        bases: bases.clone(),
        run_id,
        tag,
        lottery,
        once_activity,
    })
}

/// Registers activities `first..first + count` at [`workload::PRICE_MINOR`] in every process
/// that keeps a registry (in ranges of at most 10,000 a call).
async fn register_activities(
    admin: &Admin,
    bases: &Bases,
    first: u64,
    count: u64,
) -> Result<(), LoadError> {
    const PER_CALL_MAX: u64 = 10_000;
    for base in &bases.registries {
        let mut at = first;
        while at < first + count {
            let n = (first + count - at).min(PER_CALL_MAX);
            admin
                .expect(
                    base,
                    "POST",
                    "/admin/activities",
                    json!({"activity": at, "count": n, "price_minor": workload::PRICE_MINOR}),
                    &[200, 201],
                )
                .await?;
            at += n;
        }
    }
    Ok(())
}

/// The shared state of an attack on `base` starting 200 ms from now (after the users'
/// clients are built).
///
/// # Errors
/// `base` does not make URLs, or a client cannot be built.
fn shared_state(base: &str, opts: &LoadOptions, prep: &Prepared) -> Result<Arc<Shared>, LoadError> {
    let urls = workload::Urls::new(base, &prep.tag).map_err(|reason| LoadError::BadOption {
        field: "host",
        reason,
    })?;
    shared_state_for(urls, opts, prep)
}

/// The shared state of an attack on `urls`. A single plain-HTTP server gets raw connections
/// (`conn`); https, or several servers, a reqwest client per user.
fn shared_state_for(
    urls: workload::Urls,
    opts: &LoadOptions,
    prep: &Prepared,
) -> Result<Arc<Shared>, LoadError> {
    let single = urls.id_servers.len() == 1
        && prep.bases.ledgers.len() == 1
        && urls.id_servers[0].id.url.origin() == urls.base.origin();
    let target = conn::Target::of(&urls.base).filter(|_| single);
    let conns = (0..opts.users).map(|_| Default::default()).collect();
    let clients = (0..if target.is_some() { 0 } else { opts.users })
        .map(|_| workload::user_client())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LoadError::Setup {
            what: "user client".to_owned(),
            reason: e.to_string(),
        })?;
    let epoch = Instant::now();
    let t0 = epoch + Duration::from_millis(200);
    let measure_start = t0 + Duration::from_secs(opts.warmup_s);
    let end = measure_start + Duration::from_secs(opts.duration_s);
    Ok(Arc::new(Shared {
        mix: opts.effective_mix().unwrap_or_default(),
        users: opts.users,
        schedule: opts.rate.and_then(|r| Schedule::new(r, opts.users)),
        epoch,
        t0,
        measure_start,
        end,
        tag: prep.tag.clone(),
        lottery: prep.lottery,
        once_activity: prep.once_activity,
        iters: (0..opts.users).map(|_| AtomicU64::new(0)).collect(),
        last_done: (0..opts.users).map(|_| AtomicU64::new(0)).collect(),
        recorders: Default::default(),
        send_lateness: Default::default(),
        segment_ids: Default::default(),
        snowflake_ids: Default::default(),
        id_turn: AtomicU64::new(0),
        id_order: Default::default(),
        admin_token: prep.admin.token.clone(),
        jwts: Default::default(),
        once_accepted: Default::default(),
        seq: AtomicU64::new(0),
        user_base: prep.run_id * 1_000_000,
        draws_confirmed: AtomicU64::new(0),
        urls,
        target,
        conns,
        clients,
    }))
}

/// Runs the goose attack to its end.
async fn attack(base: &str, opts: &LoadOptions, shared: &Arc<Shared>) -> Result<(), LoadError> {
    let total_s = opts.warmup_s + opts.duration_s;
    let mut config = GooseConfiguration::default();
    config.host = Some(base.to_owned());
    config.users = Some(opts.users as usize);
    config.increase_rate = Some(opts.users.max(1000).to_string());
    config.run_time = Some(format!("{}", total_s + 1));
    config.timeout = Some(workload::REQUEST_TIMEOUT_S.to_string());
    config.no_telnet = true;
    // goose's own aggregation is not used (every request is timed by the workload)
    config.no_metrics = true;
    config.no_print_metrics = true;
    config.no_error_summary = true;
    config.quiet = 1;
    let sh = Arc::clone(shared);
    let tx = Transaction::new(Arc::new(move |user| {
        let sh = Arc::clone(&sh);
        Box::pin(async move { workload::tick(user, &sh).await })
    }))
    .set_name(&opts.workload);
    // goose would build one client per user (each loading the system's root certificates);
    // one shared client is enough for goose's own use, as every user's timed requests go
    // on its raw connection (`conn`), or with an https target through the client
    // `workload::tick` installs (`workload::user_client`).
    let goose_err = |e: GooseError| LoadError::Goose(e.to_string());
    let attack = GooseAttack::initialize_with_config(config)
        .map_err(goose_err)?
        .set_client_builder_without_cookies(
            goose::client::GooseClientBuilder::new()
                .without_cookies()
                .gzip(false),
        )
        .map_err(goose_err)?
        .register_scenario(scenario!("loadgen").register_transaction(tx));
    attack
        .execute()
        .await
        .map_err(|e| LoadError::Goose(e.to_string()))?;
    Ok(())
}

/// The client-side checks plus the ledger's.
async fn verification(prep: &Prepared, shared: &Shared) -> Result<Vec<InvariantResult>, LoadError> {
    let mix = shared.mix;
    let (need_ids, need_lottery) = mix.needs();
    let mut out = Vec::new();
    if need_ids {
        let ids = workload_lock(&shared.segment_ids).clone();
        out.push(verify::ids_unique(&format!("id:{}", prep.tag), &ids));
    }
    if need_ids || mix.has(Kind::Snowflake) {
        out.push(verify::ids_monotonic_per_server(
            &workload_lock(&shared.id_order).regressions,
            shared.urls.id_servers.len(),
        ));
    }
    if mix.has(Kind::Snowflake) {
        let ids = workload_lock(&shared.snowflake_ids).clone();
        out.push(verify::ids_unique("snowflake", &ids));
    }
    if mix.has(Kind::Once) {
        out.push(verify::once_accepted_once(&workload_lock(
            &shared.once_accepted,
        )));
    }
    if need_lottery {
        let several = prep.bases.ledgers.len() > 1;
        for (process, base) in &prep.bases.ledgers {
            let (status, v) = prep.admin.send_to(base, "GET", "/ledger", None).await?;
            let mut checks = if status == 200 {
                let mut checks = verify::ledger(&v);
                if *base == prep.bases.wallet {
                    checks.push(verify::acknowledged_draws_durable(
                        shared
                            .draws_confirmed
                            .load(std::sync::atomic::Ordering::Relaxed),
                        workload::PRICE_MINOR,
                        &v,
                    ));
                }
                checks
            } else {
                vec![InvariantResult {
                    name: "ledger.answer".to_owned(),
                    verdict: Judgement::Violated,
                    seed: None,
                    first_offending_event: Some(format!("GET /ledger answered {status}")),
                    detail: Some(v.to_string()),
                }]
            };
            if several {
                for c in &mut checks {
                    c.name = format!("{process}: {}", c.name);
                }
            }
            out.extend(checks);
        }
    }
    Ok(out)
}

fn endpoints(
    opts: &LoadOptions,
    shared: &Shared,
    hlog_start: SystemTime,
) -> Result<Vec<reports::model::EndpointStats>, LoadError> {
    let recorders = workload_lock(&shared.recorders).clone();
    if let Some(dir) = &opts.hlog_dir {
        std::fs::create_dir_all(dir)?;
        for (name, rec) in &recorders {
            rec.write_hlog(
                &dir.join(format!("{}.hlog", file_name(name))),
                name,
                hlog_start,
            )?;
        }
    }
    Ok(recorders
        .iter()
        .map(|(name, rec)| rec.stats(name, opts.duration_s as f64))
        .collect())
}

/// The diagnostics of a finished attack.
fn diagnostics(shared: &Shared) -> Diagnostics {
    let lateness = workload_lock(&shared.send_lateness);
    Diagnostics {
        send_lateness: lateness.percentiles(),
        sends: lateness.sends(),
        from_schedule: workload_lock(&shared.recorders)
            .iter()
            .map(|(name, rec)| ((*name).to_owned(), rec.from_schedule()))
            .collect(),
    }
}

/// The environment variable holding the admin secret of a `--host` target (its `/admin/*`
/// routes and `POST /tokens` take it); the servers the bench starts get one of its own.
pub const ADMIN_TOKEN_ENV: &str = "SUT_ADMIN_TOKEN";

/// The report's `target`: where, and which flaw was switched on.
fn target_text(base: &str, host: Option<&str>, flaw: Option<Flaw>) -> String {
    let mut text = match host {
        Some(h) => h.to_owned(),
        None => format!("fresh sut-server child at {base}"),
    };
    if let Some(f) = flaw {
        text.push_str(&format!(", flaw {f} switched on"));
    }
    text
}

async fn run_async(opts: LoadOptions) -> Result<(LoadReport, Diagnostics), LoadError> {
    let started = Instant::now();
    let wall_start = SystemTime::now();
    // The target.
    let _db_dir;
    let mut server: Option<ServerProcess> = None;
    let base = match &opts.host {
        Some(h) => h.trim_end_matches('/').to_owned(),
        None => {
            let bin = target::find_server_binary()?;
            let dir = tempfile::tempdir()?;
            let extra = flaw_args(opts.flaw);
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let s = ServerProcess::start(&bin, &dir.path().join("ids.db"), "127.0.0.1:0", &extra)?;
            _db_dir = dir;
            let b = s.base_url.clone();
            server = Some(s);
            b
        }
    };
    let sampler = server.as_ref().map(|s| Sampler::start(s.pid(), started));
    let admin_token = match &opts.host {
        Some(_) => opts
            .admin_token
            .clone()
            .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok()),
        None => Some(target::bench_admin_token().to_owned()),
    };
    let prep = prepare(&Bases::single(&base), &opts, 100_000, admin_token).await?;
    let shared = shared_state(&base, &opts, &prep)?;
    attack(&base, &opts, &shared).await?;
    let verification = verification(&prep, &shared).await?;
    let server_samples = sampler.map(Sampler::finish).unwrap_or_default();
    if let Some(mut s) = server {
        s.stop();
    }
    let hlog_start = wall_start + shared.measure_start.duration_since(started);
    let mut report = LoadReport {
        scenario: format!("load:{}", opts.workload),
        target: target_text(&base, opts.host.as_deref(), opts.flaw),
        duration_s: opts.duration_s as f64,
        warmup_s: opts.warmup_s as f64,
        rate: opts.rate,
        users: opts.users,
        endpoints: endpoints(&opts, &shared, hlog_start)?,
        server: server_samples,
        fault_windows: Vec::new(),
        verification,
        concurrency: None,
        ramp: None,
    };
    on_measured_clock(&mut report, started, shared.measure_start);
    Ok((report, diagnostics(&shared)))
}

fn workload_lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Puts what was timed from `started` (the server's resource samples, the fault windows) on the
/// clock of the endpoints' intervals, which count from `measure_start` (after the set-up and
/// the warm-up): without it a report shades a fault seconds away from the stall it caused.
/// Samples outside the measured `duration_s` (the set-up, the warm-up, the verification after)
/// are left out; a window that began before the measurement is drawn from its start.
pub(crate) fn on_measured_clock(report: &mut LoadReport, started: Instant, measure_start: Instant) {
    let shift_s = measure_start
        .saturating_duration_since(started)
        .as_secs_f64();
    let end_s = report.duration_s;
    report.server.retain_mut(|s| {
        s.t_s -= shift_s;
        (0.0..=end_s).contains(&s.t_s)
    });
    for w in &mut report.fault_windows {
        w.start_s = (w.start_s - shift_s).max(0.0);
        w.end_s = (w.end_s - shift_s).max(w.start_s);
    }
}

/// A file name for an endpoint name: `POST /tokens/verify` → `POST_tokens_verify`.
#[must_use]
pub fn file_name(endpoint: &str) -> String {
    let mut out = String::new();
    for c in endpoint.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_owned()
}

#[cfg(test)]
mod clock_tests {
    use super::*;
    use reports::model::{FaultWindow, ResourceSample};

    #[test]
    fn samples_and_fault_windows_move_onto_the_endpoints_clock() {
        let started = Instant::now();
        // 1.5 s of set-up and warm-up before the measured 4 s.
        let measure_start = started + Duration::from_millis(1_500);
        let sample = |t_s| ResourceSample {
            t_s,
            cpu_pct: 1.0,
            rss_bytes: 1,
        };
        let window = |start_s, end_s| FaultWindow {
            start_s,
            end_s,
            label: "kill".into(),
            process: None,
            kind: None,
        };
        let mut report = LoadReport {
            scenario: "load:id".into(),
            target: "a test".into(),
            duration_s: 4.0,
            warmup_s: 1.0,
            rate: None,
            users: 1,
            endpoints: Vec::new(),
            server: [1.0, 2.0, 3.5, 5.6, 7.0].into_iter().map(sample).collect(),
            fault_windows: vec![window(2.5, 3.0), window(1.0, 2.0)],
            verification: Vec::new(),
            concurrency: None,
            ramp: None,
        };
        on_measured_clock(&mut report, started, measure_start);
        let times: Vec<f64> = report.server.iter().map(|s| s.t_s).collect();
        // The set-up's sample and those after the measured seconds go.
        assert_eq!(times, vec![0.5, 2.0]);
        let w = &report.fault_windows;
        assert_eq!((w[0].start_s, w[0].end_s), (1.0, 1.5));
        // Begun before the measurement: drawn from its start.
        assert_eq!((w[1].start_s, w[1].end_s), (0.0, 0.5));
    }
}
