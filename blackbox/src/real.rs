//! Real systems nobody here wrote, as ID sources under faults: Redis `INCR` with its persistence
//! set as asked, or a PostgreSQL sequence (`nextval`, fsync on), killed with SIGKILL and restarted
//! on the same files, or paused with SIGSTOP and resumed, while clients keep asking for IDs. Every request is recorded
//! ([`crate::history`]): `ok` with the ID, `fail` when it certainly did not run (no connection,
//! or the server answered with an error), `info` when the outcome is unknown (the connection
//! broke after the request left). `ids.unique` then judges the `ok` IDs: an ID handed out twice
//! is a duplicate a user of that ID source would have stored twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use chaos::{
    MARIADB_DATABASE, MariaDb, MariaDbSpec, Postgres, ProcessError, Redis, RedisPersistence,
};
use reports::model::InvariantResult;

use crate::history::{History, OpType, Recorder};
use load::verify;

/// The ID source under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSystem {
    /// Redis `INCR` on one key.
    RedisIncr(RedisPersistence),
    /// `SELECT nextval(…)` of a PostgreSQL sequence, one session per client.
    PostgresSequence,
    /// The same sequence, each value stored by an `INSERT` in the transaction that takes it
    /// (the transaction writes, so its commit waits for the WAL flush).
    PostgresSequenceStored,
    /// Meituan Leaf's segment SQL on MariaDB, one segment per request: in one transaction
    /// `UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?` then `SELECT max_id`; the
    /// segment's end is the value handed out (two requests given one segment get one value).
    /// `flush` is `innodb_flush_log_at_trx_commit` (1: synced at every commit; 2: about once a
    /// second).
    MariaDbLeafSegment {
        /// `innodb_flush_log_at_trx_commit`.
        flush: u8,
    },
    /// An `AUTO_INCREMENT` column on MariaDB: an empty row inserted (autocommitted), then
    /// `LAST_INSERT_ID()`.
    MariaDbAutoIncrement {
        /// `innodb_flush_log_at_trx_commit`.
        flush: u8,
    },
}

/// What the nemesis does to the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then a restart on the same files after `down_for`.
    Kill,
    /// SIGSTOP, then SIGCONT after `down_for`: connections stay open, nothing is answered.
    Pause,
    /// The clients reach the system through a fault proxy ([`chaos::Proxy`]) that black-holes
    /// every byte for `down_for`: connections stay open, requests and answers vanish.
    Partition,
    /// A power loss: SIGKILL, then every write the system had not synced is dropped (its data
    /// directory is a [`chaos::LostFs`] mount), then a restart after `down_for`.
    PowerLoss,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Self; 4] = [Self::Kill, Self::Pause, Self::Partition, Self::PowerLoss];

    /// Its kind in the fault vocabulary ([`sut::fault::FaultKind`]).
    #[must_use]
    pub const fn kind(self) -> sut::fault::FaultKind {
        use sut::fault::FaultKind as K;
        match self {
            Self::Kill => K::Kill,
            Self::Pause => K::Pause,
            Self::Partition => K::Partition,
            Self::PowerLoss => K::PowerLoss,
        }
    }

    /// The fault named `word`, as the real-system files take it.
    ///
    /// # Errors
    /// An unknown name, or a fault real-system runs do not inject (saying where it is).
    pub fn parse(word: &str) -> Result<Self, String> {
        sut::fault::parse_into(word, sut::fault::Runner::RealSystem, &Self::ALL, Self::kind)
    }
}

/// A run of an ID source under faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdRunOptions {
    /// The system.
    pub system: IdSystem,
    /// The nemesis's fault.
    pub fault: Fault,
    /// Client threads, one request at a time each.
    pub clients: u64,
    /// How long the clients run.
    pub duration: Duration,
    /// Time between the end of one fault and the next.
    pub every: Duration,
    /// How long each fault lasts (down after a kill, stopped by a pause).
    pub down_for: Duration,
}

/// What a run did and found.
#[derive(Debug)]
pub struct IdRun {
    /// Every request and its outcome.
    pub history: History,
    /// Faults injected (each followed by a restart or a resume).
    pub faults: u32,
    /// `ids.unique` over the `ok` IDs.
    pub unique: InvariantResult,
    /// `faults.took_effect`: a fault happened and disturbed at least one request (failed, of
    /// unknown outcome, or held up for at least half the fault). A run whose faults touched
    /// nothing proves nothing about them.
    pub took_effect: InvariantResult,
    /// What the fault proxy did (partition runs).
    pub proxy: Option<chaos::ProxyEffects>,
    /// What the lost-writes filesystem did (power-loss runs).
    pub lost_writes: Option<chaos::LostFsEffects>,
    /// Each fault: when, on what, which kind (times since the history started).
    pub fault_windows: Vec<reports::model::FaultWindow>,
}

impl IdRun {
    /// The run as a load report (for the HTML report): the latency of `generate` over time,
    /// the fault windows on the system's (or the link's) lane, the checks.
    #[must_use]
    pub fn load_report(&self, scenario: &str, opts: &IdRunOptions) -> reports::model::LoadReport {
        let duration_s = opts.duration.as_secs_f64();
        reports::model::LoadReport {
            scenario: scenario.to_owned(),
            target: opts.system.name().to_owned(),
            duration_s,
            warmup_s: 0.0,
            rate: None,
            users: opts.clients,
            endpoints: vec![self.history.endpoint_stats("generate", duration_s)],
            server: Vec::new(),
            fault_windows: self.fault_windows.clone(),
            verification: vec![self.unique.clone(), self.took_effect.clone()],
            concurrency: None,
            ramp: None,
        }
    }
}

impl IdSystem {
    /// Its name in reports (`redis`, `postgres`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::RedisIncr(_) => "redis",
            Self::PostgresSequence | Self::PostgresSequenceStored => "postgres",
            Self::MariaDbLeafSegment { .. } | Self::MariaDbAutoIncrement { .. } => "mariadb",
        }
    }
}

impl IdSystem {
    /// What it is, in words.
    #[must_use]
    pub fn describe(self) -> String {
        match self {
            Self::RedisIncr(p) => format!("Redis INCR ({p:?})"),
            Self::PostgresSequence => "PostgreSQL nextval (fsync on)".to_owned(),
            Self::PostgresSequenceStored => {
                "PostgreSQL nextval stored by an INSERT in its transaction (fsync on)".to_owned()
            }
            Self::MariaDbLeafSegment { flush } => format!(
                "Leaf's segment SQL on MariaDB (UPDATE max_id = max_id + step, then SELECT, in \
                 one transaction; innodb_flush_log_at_trx_commit={flush}, sync_binlog=1)"
            ),
            Self::MariaDbAutoIncrement { flush } => format!(
                "MariaDB AUTO_INCREMENT (an autocommitted INSERT, then LAST_INSERT_ID(); \
                 innodb_flush_log_at_trx_commit={flush}, sync_binlog=1)"
            ),
        }
    }
}

impl Fault {
    /// Its name in the fault vocabulary, as scenario files and reports say it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.kind().name()
    }

    /// What it does, in words.
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Kill => "kill -9",
            Self::Pause => "SIGSTOP",
            Self::Partition => "a black-holed link",
            Self::PowerLoss => "a power loss",
        }
    }
}

/// The key every Redis client increments.
const REDIS_KEY: &str = "bench:ids";
/// The PostgreSQL sequence.
const SEQUENCE: &str = "bench_ids";
/// The table [`IdSystem::PostgresSequenceStored`] stores every value in.
const STORED: &str = "bench_used";
/// Leaf's table ([`IdSystem::MariaDbLeafSegment`]), its one key and its step (Leaf's default).
const LEAF_TABLE: &str = "leaf_alloc";
const LEAF_KEY: &str = "bench";
const LEAF_STEP: u64 = 1_000;
/// The table of [`IdSystem::MariaDbAutoIncrement`].
const AUTO_TABLE: &str = "bench_auto";
/// A request's longest wait for its answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The running system, as the nemesis sees it.
enum Server {
    Redis(Redis),
    Postgres(Postgres),
    MariaDb(MariaDb),
}

impl Server {
    fn start(system: IdSystem, fault: Fault) -> Result<Self, ProcessError> {
        let lose_unsynced = fault == Fault::PowerLoss;
        match system {
            IdSystem::RedisIncr(persistence) => {
                Ok(Self::Redis(Redis::start_with(persistence, lose_unsynced)?))
            }
            IdSystem::PostgresSequence | IdSystem::PostgresSequenceStored => {
                let pg = Postgres::start_with(lose_unsynced)?;
                pg.create_database("bench")?;
                create_sequence(&client_url(system, pg.port()))?;
                Ok(Self::Postgres(pg))
            }
            IdSystem::MariaDbLeafSegment { flush } | IdSystem::MariaDbAutoIncrement { flush } => {
                let db = MariaDb::start_with(MariaDbSpec {
                    flush_log_at_trx_commit: flush,
                    sync_binlog: 1,
                    lose_unsynced,
                })?;
                // Leaf's schema (its `leaf_alloc` DDL); no key on the AUTO_INCREMENT values but
                // the column's own, as an application table has.
                db.sql(&format!(
                    "CREATE TABLE {MARIADB_DATABASE}.{LEAF_TABLE} (\
                       biz_tag VARCHAR(128) NOT NULL PRIMARY KEY, \
                       max_id BIGINT NOT NULL DEFAULT 1, step INT NOT NULL, \
                       description VARCHAR(256), update_time TIMESTAMP NOT NULL \
                         DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP) ENGINE=InnoDB; \
                     INSERT INTO {MARIADB_DATABASE}.{LEAF_TABLE} (biz_tag, max_id, step) \
                       VALUES ('{LEAF_KEY}', 1, {LEAF_STEP}); \
                     CREATE TABLE {MARIADB_DATABASE}.{AUTO_TABLE} (\
                       id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB"
                ))?;
                Ok(Self::MariaDb(db))
            }
        }
    }

    const fn port(&self) -> u16 {
        match self {
            Self::Redis(r) => r.port(),
            Self::Postgres(p) => p.port(),
            Self::MariaDb(m) => m.port(),
        }
    }

    /// Begins `fault` (a partition is the proxy's business).
    fn inject(&mut self, fault: Fault, proxy: Option<&chaos::Proxy>) -> Result<(), ProcessError> {
        match (self, fault) {
            (Self::Redis(r), Fault::Kill) => r.kill9(),
            (Self::Postgres(p), Fault::Kill) => p.kill9(),
            (Self::MariaDb(m), Fault::Kill) => m.kill9(),
            (Self::Redis(r), Fault::PowerLoss) => r.power_loss().map(|_| ()),
            (Self::Postgres(p), Fault::PowerLoss) => p.power_loss().map(|_| ()),
            (Self::MariaDb(m), Fault::PowerLoss) => m.power_loss().map(|_| ()),
            (Self::Redis(r), Fault::Pause) => r.pause(),
            (Self::Postgres(p), Fault::Pause) => p.pause(),
            (Self::MariaDb(m), Fault::Pause) => m.pause(),
            (_, Fault::Partition) => {
                if let Some(proxy) = proxy {
                    proxy.set(chaos::LinkFault::Blackhole);
                }
                Ok(())
            }
        }
    }

    /// Ends `fault`: a restart on the same files, a resume, or the link healed.
    fn heal(&mut self, fault: Fault, proxy: Option<&chaos::Proxy>) -> Result<(), ProcessError> {
        match (self, fault) {
            (Self::Redis(r), Fault::Kill | Fault::PowerLoss) => r.restart(),
            (Self::Postgres(p), Fault::Kill | Fault::PowerLoss) => p.restart(),
            (Self::MariaDb(m), Fault::Kill | Fault::PowerLoss) => m.restart(),
            (Self::Redis(r), Fault::Pause) => r.resume(),
            (Self::Postgres(p), Fault::Pause) => p.resume(),
            (Self::MariaDb(m), Fault::Pause) => m.resume(),
            (_, Fault::Partition) => {
                if let Some(proxy) = proxy {
                    proxy.set(chaos::LinkFault::None);
                }
                Ok(())
            }
        }
    }
}

/// Where a client of `system` listening on `port` connects.
fn client_url(system: IdSystem, port: u16) -> String {
    match system {
        IdSystem::RedisIncr(_) => format!("redis://127.0.0.1:{port}/"),
        IdSystem::PostgresSequence | IdSystem::PostgresSequenceStored => format!(
            "postgres://{}@127.0.0.1:{port}/bench?connect_timeout=2",
            chaos::PG_USER
        ),
        IdSystem::MariaDbLeafSegment { .. } | IdSystem::MariaDbAutoIncrement { .. } => {
            format!("mysql://root@127.0.0.1:{port}/{MARIADB_DATABASE}")
        }
    }
}

fn create_sequence(url: &str) -> Result<(), ProcessError> {
    let failed = |e: tokio_postgres::Error| ProcessError::Command {
        what: format!("CREATE SEQUENCE {SEQUENCE}"),
        detail: e.to_string(),
    };
    let runtime = runtime()?;
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(failed)?;
        let conn = tokio::spawn(conn);
        // No key on the table: a value taken twice must reach the checker, not fail an insert.
        let sql = format!(
            "CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}; \
             CREATE TABLE IF NOT EXISTS {STORED} (id bigint NOT NULL)"
        );
        client.batch_execute(&sql).await.map_err(failed)?;
        drop(client);
        let _ = conn.await;
        Ok(())
    })
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ProcessError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ProcessError::Io {
            what: "start a client runtime".into(),
            source,
        })
}

/// Runs the clients against a fresh system and injects `fault` every `every` for `down_for`
/// (see the module docs).
///
/// # Errors
/// The system could not be started or restarted.
pub fn ids_under_kills(opts: &IdRunOptions) -> Result<IdRun, ProcessError> {
    let mut server = Server::start(opts.system, opts.fault)?;
    // A partition needs a link to cut: the clients go through a fault proxy.
    let proxy = match opts.fault {
        Fault::Partition => Some(chaos::Proxy::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], server.port())),
            1,
        )?),
        Fault::Kill | Fault::Pause | Fault::PowerLoss => None,
    };
    let url = client_url(
        opts.system,
        proxy.as_ref().map_or(server.port(), |p| p.addr().port()),
    );
    let recorder = Arc::new(Recorder::new());
    let began = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients = spawn_clients(
        opts.system,
        opts.clients,
        &url,
        Some(&recorder),
        &stop,
        &done,
    );
    let ends = Instant::now() + opts.duration;
    let mut faults = 0;
    let mut fault_windows = Vec::new();
    let target = match opts.fault {
        Fault::Partition => format!("clients→{}", opts.system.name()),
        Fault::Kill | Fault::Pause | Fault::PowerLoss => opts.system.name().to_owned(),
    };
    let mut result = Ok(());
    while Instant::now() + opts.every < ends {
        thread::sleep(opts.every);
        let start_s = began.elapsed().as_secs_f64();
        if let Err(e) = server.inject(opts.fault, proxy.as_ref()) {
            result = Err(e);
            break;
        }
        faults += 1;
        thread::sleep(opts.down_for);
        if let Err(e) = server.heal(opts.fault, proxy.as_ref()) {
            result = Err(e);
            break;
        }
        fault_windows.push(reports::model::FaultWindow {
            start_s,
            end_s: began.elapsed().as_secs_f64(),
            label: format!("{target}: {}", opts.fault.name()),
            process: Some(target.clone()),
            kind: Some(opts.fault.name().to_owned()),
        });
    }
    if let Some(left) = ends.checked_duration_since(Instant::now()) {
        thread::sleep(left);
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    result?;
    let history = Arc::into_inner(recorder)
        .expect("every client thread has ended")
        .finish();
    let space = match opts.system {
        IdSystem::RedisIncr(_) => "redis-incr",
        IdSystem::PostgresSequence => "postgres-nextval",
        IdSystem::PostgresSequenceStored => "postgres-nextval-stored",
        IdSystem::MariaDbLeafSegment { .. } => "mariadb-leaf-segment-end",
        IdSystem::MariaDbAutoIncrement { .. } => "mariadb-auto-increment",
    };
    let indexed: Vec<(u64, u64)> = history
        .ok_values_indexed("generate")
        .into_iter()
        .map(|(v, index)| (u64::try_from(v).unwrap_or(0), index))
        .collect();
    let unique = verify::ids_unique_in_history(space, &indexed);
    let took_effect = faults_took_effect(faults, opts.down_for / 2, &history);
    Ok(IdRun {
        history,
        faults,
        unique,
        took_effect,
        proxy: proxy.as_ref().map(chaos::Proxy::effects),
        lost_writes: match &server {
            Server::Redis(r) => r.lost_writes(),
            Server::Postgres(p) => p.lost_writes(),
            Server::MariaDb(m) => m.lost_writes(),
        },
        fault_windows,
    })
}

/// Starts `count` client threads asking `url` for IDs until `stop`, each completed request
/// counted in `done` and, with a recorder, recorded (invoke, then ok, fail or info).
fn spawn_clients(
    system: IdSystem,
    count: u64,
    url: &str,
    recorder: Option<&Arc<Recorder>>,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
) -> Vec<thread::JoinHandle<()>> {
    (0..count)
        .map(|process| {
            let recorder = recorder.map(Arc::clone);
            let (stop, done, url) = (Arc::clone(stop), Arc::clone(done), url.to_owned());
            thread::spawn(move || {
                let mut client = Client::new(system, url);
                let mut history = recorder.as_ref().map(|r| r.client(process));
                while !stop.load(Ordering::Relaxed) {
                    if let Some(h) = &mut history {
                        h.record(OpType::Invoke, "generate", None, None);
                    }
                    let (op_type, value, error) = match client.next_id() {
                        Outcome::Ok(id) => (OpType::Ok, Some(id), None),
                        Outcome::Fail(e) => (OpType::Fail, None, Some(e)),
                        Outcome::Info(e) => (OpType::Info, None, Some(e)),
                    };
                    if let Some(h) = &mut history {
                        h.record(op_type, "generate", value, error);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    if op_type == OpType::Fail {
                        thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        })
        .collect()
}

/// The clients' maximum rate (requests/s) against one fresh, fault-free `system`, in
/// `rounds` pairs of `round`-long runs, alternately with the history recorded and without,
/// side by side on the same server: the cost of recording is the ratio of the two
/// (`examples/history_cost.rs`). Returns `(recorded, rate)` per run, in run order.
///
/// # Errors
/// The system could not be started.
pub fn recording_cost(
    system: IdSystem,
    clients: u64,
    round: Duration,
    rounds: u32,
) -> Result<Vec<(bool, f64)>, ProcessError> {
    let server = Server::start(system, Fault::Kill)?;
    let url = client_url(system, server.port());
    let mut rates = Vec::new();
    for i in 0..rounds * 2 {
        // ABBA order: neither side always runs first (warm caches, a growing key).
        let recorded = matches!(i % 4, 1 | 2);
        let recorder = recorded.then(|| Arc::new(Recorder::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let threads = spawn_clients(system, clients, &url, recorder.as_ref(), &stop, &done);
        thread::sleep(round);
        stop.store(true, Ordering::Relaxed);
        let n = done.load(Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
        rates.push((recorded, n as f64 / round.as_secs_f64()));
    }
    drop(server);
    Ok(rates)
}

/// Requests that failed, ended unknown, or took at least `held_up` from invoke to completion.
fn disturbed(history: &History, held_up: Duration) -> u64 {
    let held_up_ns = u64::try_from(held_up.as_nanos()).unwrap_or(u64::MAX);
    let mut invoked = std::collections::BTreeMap::new();
    let mut n = 0;
    for op in &history.ops {
        match op.op_type {
            OpType::Invoke => {
                invoked.insert(op.process, op.time_ns);
            }
            OpType::Fail | OpType::Info => n += 1,
            OpType::Ok => {
                let since = invoked.get(&op.process).copied().unwrap_or(op.time_ns);
                if op.time_ns.saturating_sub(since) >= held_up_ns {
                    n += 1;
                }
            }
        }
    }
    n
}

/// `faults.took_effect` for `faults` faults over `history`; a request held up `held_up` or more
/// counts as disturbed.
#[must_use]
pub fn faults_took_effect(faults: u32, held_up: Duration, history: &History) -> InvariantResult {
    let name = "faults.took_effect";
    let disturbed = disturbed(history, held_up);
    let detail = format!(
        "{faults} faults; {disturbed} requests failed, of unknown outcome or held up {} ms or more",
        held_up.as_millis()
    );
    if faults > 0 && disturbed > 0 {
        return InvariantResult {
            detail: Some(detail),
            ..InvariantResult::held(name)
        };
    }
    InvariantResult {
        name: name.to_owned(),
        verdict: reports::model::Judgement::Violated,
        seed: None,
        first_offending_event: None,
        detail: Some(format!(
            "{detail}: the nemesis never touched the clients (run longer, or kill more often)"
        )),
    }
}

/// A request's outcome.
pub(crate) enum Outcome {
    Ok(i64),
    /// It certainly did not run.
    Fail(String),
    /// It may or may not have run.
    Info(String),
}

/// One client's connection, made again after any error.
enum Client {
    Redis {
        url: String,
        conn: Option<redis::Connection>,
    },
    Postgres {
        url: String,
        runtime: Option<tokio::runtime::Runtime>,
        client: Option<tokio_postgres::Client>,
        /// The value is stored in the transaction that takes it.
        stored: bool,
    },
    MariaDb {
        url: String,
        runtime: Option<tokio::runtime::Runtime>,
        conn: Option<mysql_async::Conn>,
        /// Leaf's segment SQL (else AUTO_INCREMENT).
        leaf: bool,
    },
}

impl Client {
    fn new(system: IdSystem, url: String) -> Self {
        match system {
            IdSystem::RedisIncr(_) => Self::Redis { url, conn: None },
            IdSystem::PostgresSequence | IdSystem::PostgresSequenceStored => Self::Postgres {
                url,
                runtime: runtime().ok(),
                client: None,
                stored: system == IdSystem::PostgresSequenceStored,
            },
            IdSystem::MariaDbLeafSegment { .. } | IdSystem::MariaDbAutoIncrement { .. } => {
                Self::MariaDb {
                    url,
                    runtime: runtime().ok(),
                    conn: None,
                    leaf: matches!(system, IdSystem::MariaDbLeafSegment { .. }),
                }
            }
        }
    }

    fn next_id(&mut self) -> Outcome {
        match self {
            Self::Redis { url, conn } => redis_incr(url, REDIS_KEY, conn),
            Self::Postgres {
                url,
                runtime,
                client,
                stored,
            } => match runtime {
                Some(rt) => {
                    let sql = if *stored {
                        format!(
                            "INSERT INTO {STORED} (id) VALUES (nextval('{SEQUENCE}')) RETURNING id"
                        )
                    } else {
                        format!("SELECT nextval('{SEQUENCE}')")
                    };
                    postgres_ask(rt, url, client, &sql)
                }
                None => Outcome::Fail("no client runtime".into()),
            },
            Self::MariaDb {
                url,
                runtime,
                conn,
                leaf,
            } => match runtime {
                Some(rt) => mariadb_ask(rt, url, conn, *leaf),
                None => Outcome::Fail("no client runtime".into()),
            },
        }
    }
}

/// `INCR key` on a (re)used connection to `url`.
pub(crate) fn redis_incr(url: &str, key: &str, conn: &mut Option<redis::Connection>) -> Outcome {
    let mut c = match conn.take().map_or_else(|| redis_connect(url), Ok) {
        Ok(c) => c,
        // The request never left: it certainly did not run.
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    match redis::cmd("INCR").arg(key).query::<i64>(&mut c) {
        Ok(id) => {
            *conn = Some(c);
            Outcome::Ok(id)
        }
        Err(e) if !e.is_io_error() && !e.is_timeout() => {
            // Redis answered with an error (LOADING while it reads its files back, …): it did
            // not run it.
            *conn = Some(c);
            Outcome::Fail(e.to_string())
        }
        // Sent, then the connection broke: it may or may not have run.
        Err(e) => Outcome::Info(e.to_string()),
    }
}

fn redis_connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let c = client.get_connection_with_timeout(REQUEST_TIMEOUT)?;
    c.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    c.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    Ok(c)
}

/// `sql` (one row, an `i64` first) in an explicit transaction on a (re)used session to `url`.
pub(crate) fn postgres_ask(
    rt: &tokio::runtime::Runtime,
    url: &str,
    client: &mut Option<tokio_postgres::Client>,
    sql: &str,
) -> Outcome {
    rt.block_on(async {
        let c = match client.take() {
            Some(c) => c,
            None => match tokio::time::timeout(
                REQUEST_TIMEOUT,
                tokio_postgres::connect(url, tokio_postgres::NoTls),
            )
            .await
            {
                Ok(Ok((c, conn))) => {
                    tokio::spawn(conn);
                    c
                }
                Ok(Err(e)) => return Outcome::Fail(e.to_string()),
                Err(_) => return Outcome::Fail("connect timed out".into()),
            },
        };
        // The value counts only once an explicit COMMIT has returned: what an application that
        // uses the value after its transaction sees (PostgreSQL's advice for values used
        // outside the database).
        let asked = async {
            c.batch_execute("BEGIN").await?;
            let row = c.query_one(sql, &[]).await?;
            c.batch_execute("COMMIT").await?;
            Ok::<_, tokio_postgres::Error>(row)
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, asked).await {
            Ok(Ok(row)) => match row.try_get::<_, i64>(0) {
                Ok(id) => {
                    *client = Some(c);
                    Outcome::Ok(id)
                }
                Err(e) => Outcome::Info(e.to_string()),
            },
            // The server answered with an error (shutting down, in recovery, …): not run, or
            // run and not committed — a value never handed out.
            Ok(Err(ref e)) if let Some(db) = e.as_db_error() => {
                Outcome::Fail(format!("db error: {} ({})", db.message(), db.code().code()))
            }
            Ok(Err(e)) => Outcome::Info(e.to_string()),
            Err(_) => Outcome::Info("timed out".into()),
        }
    })
}

/// One ID from MariaDB on a (re)used session to `url`: Leaf's segment SQL in an explicit
/// transaction (the segment's end), or an autocommitted AUTO_INCREMENT insert. The value counts
/// once the commit has returned.
pub(crate) fn mariadb_ask(
    rt: &tokio::runtime::Runtime,
    url: &str,
    conn: &mut Option<mysql_async::Conn>,
    leaf: bool,
) -> Outcome {
    use mysql_async::prelude::Queryable;
    rt.block_on(async {
        let mut c = match conn.take() {
            Some(c) => c,
            None => {
                let opts = match mysql_async::Opts::from_url(url) {
                    // Over TCP, always: by default the driver moves to the server's Unix socket
                    // when it is on this machine, which would go around a fault proxy.
                    Ok(opts) => mysql_async::OptsBuilder::from_opts(opts).prefer_socket(false),
                    Err(e) => return Outcome::Fail(e.to_string()),
                };
                match tokio::time::timeout(REQUEST_TIMEOUT, mysql_async::Conn::new(opts)).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Outcome::Fail(e.to_string()),
                    Err(_) => return Outcome::Fail("connect timed out".into()),
                }
            }
        };
        let asked = async {
            if leaf {
                c.query_drop("BEGIN").await?;
                c.query_drop(format!(
                    "UPDATE {LEAF_TABLE} SET max_id = max_id + step WHERE biz_tag = '{LEAF_KEY}'"
                ))
                .await?;
                let max_id: Option<i64> = c
                    .query_first(format!(
                        "SELECT max_id FROM {LEAF_TABLE} WHERE biz_tag = '{LEAF_KEY}'"
                    ))
                    .await?;
                c.query_drop("COMMIT").await?;
                Ok::<_, mysql_async::Error>(max_id)
            } else {
                c.query_drop(format!("INSERT INTO {AUTO_TABLE} () VALUES ()"))
                    .await?;
                Ok(c.last_insert_id().and_then(|id| i64::try_from(id).ok()))
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, asked).await {
            Ok(Ok(Some(id))) => {
                *conn = Some(c);
                Outcome::Ok(id)
            }
            Ok(Ok(None)) => Outcome::Info("no value came back".into()),
            // The server answered with an error (starting up, read-only, a deadlock …): the
            // statement did not run, or ran and rolled back: no value handed out.
            Ok(Err(mysql_async::Error::Server(e))) => {
                Outcome::Fail(format!("server error: {} ({})", e.message, e.code))
            }
            Ok(Err(e)) => Outcome::Info(e.to_string()),
            Err(_) => Outcome::Info("timed out".into()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Recorder;

    #[test]
    fn a_run_whose_faults_touched_no_request_fails_coverage() {
        let quiet = Recorder::new();
        quiet.record(0, OpType::Invoke, "generate", None, None);
        quiet.record(0, OpType::Ok, "generate", Some(1), None);
        let quiet = quiet.finish();
        let verdict =
            |faults, h: &History| faults_took_effect(faults, Duration::from_millis(100), h).verdict;
        assert_eq!(verdict(0, &quiet), reports::model::Judgement::Violated);
        assert_eq!(verdict(3, &quiet), reports::model::Judgement::Violated);
        let hit = Recorder::new();
        hit.record(0, OpType::Invoke, "generate", None, None);
        hit.record(0, OpType::Info, "generate", None, Some("reset".into()));
        let hit = hit.finish();
        assert_eq!(
            verdict(0, &hit),
            reports::model::Judgement::Violated,
            "no fault"
        );
        assert_eq!(verdict(1, &hit), reports::model::Judgement::Held);
        // A request held up by a pause counts; a quick one does not.
        let slow = History {
            ops: vec![op(0, OpType::Invoke, 0), op(1, OpType::Ok, 150_000_000)],
        };
        let quick = History {
            ops: vec![op(0, OpType::Invoke, 0), op(1, OpType::Ok, 50_000_000)],
        };
        assert_eq!(verdict(1, &slow), reports::model::Judgement::Held);
        assert_eq!(verdict(1, &quick), reports::model::Judgement::Violated);
    }

    fn op(index: u64, op_type: OpType, time_ns: u64) -> crate::history::Op {
        crate::history::Op {
            index,
            process: 0,
            op_type,
            f: "generate".into(),
            value: (op_type == OpType::Ok).then_some(1),
            time_ns,
            error: None,
        }
    }
}
