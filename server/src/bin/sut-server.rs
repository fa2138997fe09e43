//! `sut-server`: the real HTTP server over the `sut` state machines (see `sut_server`).
//!
//! Prints `listening on ADDR` as its first line of standard output, serves until SIGTERM or
//! Ctrl-C, then shuts down gracefully (in-flight requests finish, segment leases and the
//! Snowflake worker are released, counters flushed, the lottery writer drained).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sut_server::admission::AdmissionConfig;
use sut_server::db::Db;
use sut_server::lottery::LotteryStoreKind;
use sut_server::{Role, ServerConfig, start};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "sut-server",
    about = "HTTP server for segment/Snowflake IDs, tokens and the TCC lottery"
)]
struct Args {
    /// The database: `sqlite:PATH` or a bare path (the ID store's file; tokens and the lottery
    /// journal are kept beside it), `postgres://user@host:port/database` or
    /// `mysql://user@host:port/database` (MariaDB or MySQL with InnoDB; every store's tables in
    /// that database; several processes may share it). A server that does not sync every
    /// commit (PostgreSQL `fsync=off`; MariaDB `innodb_flush_log_at_trx_commit` other than 1,
    /// or `sync_binlog` other than 1 with the binary log on) is refused.
    #[arg(long, required_unless_present = "print_openapi", value_parser = parse_db)]
    db: Option<Db>,
    /// What this process serves: `all` (everything, the default), or one part of a deployment:
    /// `id` (IDs; run several on one PostgreSQL or MariaDB), `token`, `coordinator` (the TCC coordinator;
    /// needs --wallet-url, --inventory-url and the admin secret), `wallet`, `inventory`.
    #[arg(long, value_enum, default_value_t = Role::All)]
    role: Role,
    /// Base URL of the wallet participant (role coordinator), e.g. http://127.0.0.1:7001.
    #[arg(long)]
    wallet_url: Option<String>,
    /// Base URL of the inventory participant (role coordinator).
    #[arg(long)]
    inventory_url: Option<String>,
    /// How long the coordinator waits for one participant call, in ms.
    #[arg(long, default_value_t = 1_000)]
    participant_timeout_ms: u64,
    /// The token service's base URL (role coordinator: it consumes the draws' one-time tokens
    /// there; the coordinator also needs the token service's --jwt-secret-file).
    #[arg(long)]
    token_url: Option<String>,
    /// Draws per second one user may start (429 with Retry-After beyond).
    #[arg(long, default_value_t = 10.0)]
    draw_rate_per_user: f64,
    /// Draws one user may start at once before the rate applies.
    #[arg(long, default_value_t = 20)]
    draw_burst: u32,
    /// One-time tokens per second one user may be issued (429 with Retry-After beyond).
    #[arg(long, default_value_t = 2.0)]
    once_rate_per_user: f64,
    /// One-time tokens one user may be issued at once before the rate applies.
    #[arg(long, default_value_t = 20)]
    once_burst: u32,
    /// TEST ONLY: let a draw's body force its luck (`won`). The server says so loudly at start.
    #[arg(long)]
    test_forced_outcomes: bool,
    /// TEST ONLY: let `GET /noop?delay_ms=` hold requests (overload measurements).
    #[arg(long)]
    test_noop_delay: bool,
    /// Serve `GET /metrics` without a credential (by default it takes the operator's secret:
    /// its counters tell the business's volume). For a scraper on a network you trust.
    #[arg(long)]
    metrics_public: bool,
    /// File holding the operator's secret (or the environment variable SUT_ADMIN_TOKEN; at
    /// least 16 characters): `/admin/*`, issuing JWTs, the ledger. Required.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// File holding the service credential (or SUT_SERVICE_TOKEN; at least 16 characters, not
    /// the operator's secret): what the coordinator presents to the participants' routes,
    /// which accept nothing else. Required by --role coordinator, wallet and inventory.
    #[arg(long)]
    service_token_file: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// TLS on the listener: the certificate chain (PEM; with --tls-key-file).
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// TLS on the listener: the certificate's private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// The CA (or self-signed certificate, PEM) to trust on calls to the participants and the
    /// token service, whose `https://` URLs then work (role coordinator).
    #[arg(long)]
    tls_ca_file: Option<PathBuf>,
    /// Connections open at once (lowered to what the open-file limit leaves room for). When
    /// full, a new connection takes the place of an idle one: the longest idle of the address
    /// range and address that hold the most.
    #[arg(long, default_value_t = 8_192)]
    connections_max: usize,
    /// Connections open at once from one address; a new one beyond it takes the place of that
    /// address's longest idle connection.
    #[arg(long, default_value_t = 512)]
    per_address_connections_max: usize,
    /// Requests handled at once.
    #[arg(long, default_value_t = 512)]
    in_flight_max: usize,
    /// Requests allowed to wait for a slot.
    #[arg(long, default_value_t = 1024)]
    queue_max: usize,
    /// Longest wait for a slot, in ms.
    #[arg(long, default_value_t = 100)]
    queue_wait_ms: u64,
    /// Runtime worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// File holding the JWT HMAC secret (at least 32 bytes); random per start if absent.
    #[arg(long)]
    jwt_secret_file: Option<PathBuf>,
    /// The odds of an activity registered without its own, in winning draws per thousand.
    #[arg(long, default_value_t = 100)]
    win_per_mille: u32,
    /// An activity to register at start, `ID:PRICE` or `ID:PRICE:WIN_PER_MILLE` (always open);
    /// repeat for several. Terms never change once registered: other terms for a registered
    /// activity are a start-up error. (`POST /admin/activities` registers them at run time.)
    #[arg(long = "activity", value_parser = parse_activity)]
    activities: Vec<(u64, u64, Option<u32>)>,
    /// The lottery's store: `journal` (a command journal with group commit, in the database)
    /// or `sqlite` (one durable transaction per operation, in SQLite or PostgreSQL alike).
    #[arg(long, value_enum, default_value_t = LotteryStoreKind::Journal)]
    lottery_store: LotteryStoreKind,
    /// Print the OpenAPI description (the text of docs/openapi.json) and exit.
    #[arg(long)]
    print_openapi: bool,
    /// Switch on a documented flaw of the reference implementation (for testing the bench
    /// only: the server is then BROKEN on purpose). Names: sut::flaw::Flaw, e.g. stock_two_step.
    #[arg(long)]
    flaw: Option<sut::flaw::Flaw>,
    /// Plant a weakness of the deployed server (for testing the bench's checks only: the
    /// server is then open to attack or wrong on purpose): `no_read_timeout` (no head or body
    /// read timeout; admission before the body is read), `sequential_tokens` (one-time token
    /// values from a counter), `no_token_quota` (no per-user rate on issuing one-time tokens),
    /// `conn_slot_leak` (a connection's slots given back only when it ends cleanly),
    /// `unguarded_fallback` (a PostgreSQL/MariaDB allocation that lost two races written
    /// unguarded), `past_block_repeat` (a take past another thread's block answers its last
    /// ID), `skip_on_refill` (a refilling take gives its value up).
    #[arg(long, value_enum)]
    weakness: Option<sut_server::listen::Weakness>,
    /// Cap of the segment allocators' dynamic step (default: Leaf's 1,000,000); the IDs a crash
    /// may lose are a multiple of it.
    #[arg(long)]
    step_max: Option<u64>,
    /// A segment tag to create at start if missing, `NAME` or `NAME:STEP` (step 1000 by
    /// default); repeat for several. Lets `scenario ids` test this server with no admin call.
    #[arg(long = "tag", value_parser = parse_tag)]
    tags: Vec<(String, u64)>,
    /// The business types of `GET /semantic/{biz}`, two capital letters each, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = sut_server::ids::SEMANTIC_BIZ_DEFAULT.map(String::from))]
    semantic_biz: Vec<String>,
    /// Semantic IDs per second per business type and process (the sequence has five digits:
    /// at most 100,000); the next in the same second is a 503 with `Retry-After`.
    #[arg(long, default_value_t = 100_000)]
    semantic_per_second: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Every file this process creates (databases, journals, their WAL) is its owner's alone:
    // they hold balances and unconsumed one-time tokens.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    if args.print_openapi {
        print!("{}", sut_server::openapi::openapi_json());
        return ExitCode::SUCCESS;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.threads {
        builder.worker_threads(n.max(1));
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sut-server: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sut-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_db(s: &str) -> Result<Db, String> {
    s.parse()
}

/// A secret from its file, else from the environment variable `env`; `None` when neither is
/// given. Never printed.
fn secret_from(file: Option<&PathBuf>, env: &str, flag: &str) -> Result<Option<String>, String> {
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
        return Ok(Some(text.trim().to_owned()));
    }
    Ok(std::env::var(env).ok().map(|v| v.trim().to_owned()))
}

async fn serve(args: Args) -> Result<(), String> {
    let db = args.db.clone().ok_or("--db is required")?;
    let mut cfg = ServerConfig::with_db(db);
    cfg.role = args.role;
    cfg.exit_on_store_failure = true;
    cfg.wallet_url = args.wallet_url.clone();
    cfg.inventory_url = args.inventory_url.clone();
    cfg.participant_timeout_ms = args.participant_timeout_ms;
    cfg.tls = args.tls_cert_file.clone().zip(args.tls_key_file.clone());
    cfg.tls_ca_file = args.tls_ca_file.clone();
    cfg.admin_token = Some(
        secret_from(
            args.admin_token_file.as_ref(),
            "SUT_ADMIN_TOKEN",
            "--admin-token-file",
        )?
        .ok_or("the operator's secret is required: --admin-token-file, or SUT_ADMIN_TOKEN")?,
    );
    cfg.service_token = secret_from(
        args.service_token_file.as_ref(),
        "SUT_SERVICE_TOKEN",
        "--service-token-file",
    )?;
    cfg.token_url = args.token_url.clone();
    cfg.draw_rate_per_s = args.draw_rate_per_user;
    cfg.draw_burst = args.draw_burst;
    cfg.once_rate_per_s = args.once_rate_per_user;
    cfg.once_burst = args.once_burst;
    cfg.forced_outcomes = args.test_forced_outcomes;
    cfg.noop_delay = args.test_noop_delay;
    cfg.metrics_public = args.metrics_public;
    if args.test_forced_outcomes {
        eprintln!(
            "sut-server: WARNING: --test-forced-outcomes: draws may choose their own luck \
             (`won`). For tests only: never in front of real users."
        );
    }
    cfg.conn_limits.connections_max = args.connections_max.max(1);
    cfg.conn_limits.per_peer_max = args.per_address_connections_max.max(1);
    cfg.admission = AdmissionConfig {
        in_flight_max: args.in_flight_max,
        queue_max: args.queue_max,
        queue_wait_ms: args.queue_wait_ms,
        ..AdmissionConfig::default()
    };
    cfg.win_per_mille = args.win_per_mille;
    cfg.lottery_store = args.lottery_store;
    cfg.flaw = args.flaw;
    cfg.step_max = args.step_max;
    cfg.tags = args.tags;
    cfg.semantic = sut_server::ids::SemanticSpec {
        biz: args.semantic_biz,
        per_second: args.semantic_per_second,
    };
    cfg.activities = args
        .activities
        .iter()
        .map(|&(id, price_minor, odds)| {
            let terms =
                sut::lottery::Terms::always_open(price_minor, odds.unwrap_or(args.win_per_mille));
            terms
                .validate()
                .map(|()| (id, terms))
                .map_err(|e| format!("--activity {id}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    cfg.weakness = args.weakness;
    if let Some(weakness) = args.weakness {
        eprintln!(
            "sut-server: WARNING: WEAKNESS `{}` PLANTED: this server is open to attack on \
             purpose (bench testing only).",
            weakness.name()
        );
    }
    if let Some(flaw) = args.flaw {
        eprintln!(
            "sut-server: WARNING: FLAW `{flaw}` SWITCHED ON: {}. This server is broken on \
             purpose (bench testing only; source: {}).",
            flaw.description(),
            flaw.source()
        );
    }
    if let Some(path) = &args.jwt_secret_file {
        cfg.jwt_secret = Some(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    let server = start(cfg, args.listen).await?;
    println!("listening on {}", server.addr);
    wait_for_signal().await;
    eprintln!("sut-server: shutting down");
    server.shutdown().await
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// `NAME` or `NAME:STEP`.
fn parse_tag(text: &str) -> Result<(String, u64), String> {
    match text.split_once(':') {
        None => Ok((text.to_owned(), 1_000)),
        Some((name, step)) => step
            .parse()
            .map(|step| (name.to_owned(), step))
            .map_err(|_| format!("`{step}` is not a step (NAME:STEP, e.g. orders:1000)")),
    }
}

/// `ID:PRICE` or `ID:PRICE:WIN_PER_MILLE`.
fn parse_activity(text: &str) -> Result<(u64, u64, Option<u32>), String> {
    let usage = || format!("`{text}`: use ID:PRICE or ID:PRICE:WIN_PER_MILLE (e.g. 1:100:50)");
    let mut parts = text.split(':');
    let id = parts
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(usage)?;
    let price = parts
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(usage)?;
    let odds = match parts.next() {
        None => None,
        Some(p) => Some(p.parse().map_err(|_| usage())?),
    };
    if parts.next().is_some() {
        return Err(usage());
    }
    if price == 0 {
        return Err(format!(
            "`{text}`: a price of 0 gives every draw away; register a free activity with `POST \
             /admin/activities` and \"free\": true"
        ));
    }
    Ok((id, price, odds))
}
