//! Test your own ID service: black-box targets that need none of this project's routes
//! (docs/own-service.md).
//!
//! A target is a kind of ID API ([`Target`]: any HTTP API by template, Leaf, Tinyid, Redis
//! `INCR`, a PostgreSQL sequence) at one or more URLs, spread over the way a load balancer would
//! (round robin, request by request). Client threads ask for IDs; every request is recorded in a
//! Jepsen-style history ([`crate::history`]): `ok` with the IDs, `fail` when it certainly did not
//! issue an ID (refused connection, an error answer), `info` when the outcome is unknown
//! (timeout, connection broken after the request left). Then:
//!
//! - `ids.unique`: no ID handed out twice, over every server (the promise of every ID service);
//! - `ids.monotonic` (when the target promises it: `--monotonic server` or `global`): an ID is
//!   larger than every ID whose request completed before its request began, at the same server
//!   or anywhere (real-time order, as a linearizable counter would give);
//! - gaps (IDs never handed out between the smallest and the largest) are reported, not judged;
//! - errors are classified (refused, error answer, timeout, unknown outcome).
//!
//! With the commands that start the user's servers (one per URL), the bench owns them and its
//! nemesis can kill -9 and restart them, pause them, step their clocks (libfaketime) or partition
//! the clients' links (a fault proxy in front of every URL).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use chaos::{CommandService, CommandSpec, End, FakeClock, LinkFault, NetLab, ProcessError, Proxy};
use reports::model::{InvariantResult, Judgement};

use crate::db::{Database, DbFault, DbOptions};
use crate::history::{History, OpType, Recorder};
use crate::real::{Outcome, REQUEST_TIMEOUT, postgres_ask, redis_incr};
use load::stats::EndpointRecorder;
use load::verify;

/// A kind of ID API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Any HTTP API: `GET` on the URL with `{key}` replaced by the key. A 2xx answer carries
    /// the ID as the body (a plain integer, or several separated by commas) or, with a JSON
    /// pointer, at that place of a JSON body (a number, a numeric string or an array of them).
    /// Any other status is an error answer.
    Http {
        /// RFC 6901 pointer to the ID in a JSON answer (`/data/id`).
        pointer: Option<String>,
    },
    /// Meituan Leaf: `GET /api/segment/get/{key}` (or `/api/snowflake/get/{key}`), the ID as
    /// plain text; errors are HTTP 500, and a Leaf whose mode is switched off answers `0` with
    /// 200, so an ID of 0 or less is an error answer.
    Leaf {
        /// Ask the Snowflake route instead of the segment route.
        snowflake: bool,
    },
    /// Didi Tinyid: `GET /tinyid/id/nextIdSimple?bizType={key}&token=…[&batchSize=N]`, plain
    /// `3` or `4,5,6`. Every error is HTTP 200: an empty body from the Simple route, a JSON
    /// `code` other than 200 from `nextId`.
    Tinyid {
        /// The `token` parameter Tinyid checks.
        token: String,
        /// IDs per request (`batchSize`, 1 leaves it out).
        batch: u32,
    },
    /// Redis `INCR {key}` (`redis://host:port/`).
    Redis,
    /// `SELECT nextval('{key}')` in its own transaction, counted after `COMMIT`
    /// (`postgres://user@host:port/db`).
    Postgres,
}

/// The names of the kinds, as `--target` takes them.
pub const TARGET_KINDS: [&str; 5] = ["http", "leaf", "tinyid", "redis", "postgres"];

impl Target {
    /// The kind's name.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Http { .. } => "http",
            Self::Leaf { .. } => "leaf",
            Self::Tinyid { .. } => "tinyid",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
        }
    }

    /// Whether requests go over HTTP.
    #[must_use]
    pub const fn is_http(&self) -> bool {
        matches!(
            self,
            Self::Http { .. } | Self::Leaf { .. } | Self::Tinyid { .. }
        )
    }

    /// The URL one request for `key` goes to, given a server's `base` URL.
    #[must_use]
    pub fn request_url(&self, base: &str, key: &str) -> String {
        let base = base.trim_end_matches('/');
        match self {
            Self::Http { .. } => base.replace("{key}", key),
            Self::Leaf { snowflake: false } => format!("{base}/api/segment/get/{key}"),
            Self::Leaf { snowflake: true } => format!("{base}/api/snowflake/get/{key}"),
            Self::Tinyid { token, batch } => {
                let size = if *batch > 1 {
                    format!("&batchSize={batch}")
                } else {
                    String::new()
                };
                format!("{base}/tinyid/id/nextIdSimple?bizType={key}&token={token}{size}")
            }
            Self::Redis | Self::Postgres => base.to_owned(),
        }
    }

    /// The IDs in an HTTP answer, or why it is an error answer (the protocol of each kind).
    ///
    /// # Errors
    /// The answer is an error by the kind's convention, or carries no ID.
    pub fn parse_answer(&self, status: u16, body: &str) -> Result<Vec<i64>, String> {
        let text = body.trim();
        let shown = || shorten(text);
        match self {
            Self::Http { pointer } => {
                if !(200..300).contains(&status) {
                    return Err(format!("HTTP {status}: {}", shown()));
                }
                match pointer {
                    None => integers(text),
                    Some(p) => json_ids(text, p),
                }
            }
            Self::Leaf { .. } => {
                if status != 200 {
                    return Err(format!("HTTP {status}: {}", shown()));
                }
                let ids = integers(text)?;
                match ids.as_slice() {
                    [id] if *id > 0 => Ok(ids),
                    [id] => Err(format!(
                        "Leaf answered {id}: an ID of 0 or less is Leaf's error (mode off, or \
                         an exception)"
                    )),
                    _ => Err(format!("Leaf answers one ID, not `{}`", shown())),
                }
            }
            Self::Tinyid { .. } => {
                if status != 200 {
                    return Err(format!("HTTP {status}: {}", shown()));
                }
                if text.is_empty() {
                    return Err("empty body: Tinyid's Simple routes answer an error so".into());
                }
                if text.starts_with('{') {
                    return tinyid_json(text);
                }
                integers(text)
            }
            Self::Redis | Self::Postgres => Err("not an HTTP target".into()),
        }
    }
}

fn shorten(text: &str) -> String {
    const SHOWN_MAX: usize = 120;
    match text.char_indices().nth(SHOWN_MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// `3` or `4,5,6`.
fn integers(text: &str) -> Result<Vec<i64>, String> {
    let ids: Result<Vec<i64>, _> = text.split(',').map(|p| p.trim().parse::<i64>()).collect();
    match ids {
        Ok(ids) if !ids.is_empty() => Ok(ids),
        _ => Err(format!("not an ID: `{}`", shorten(text))),
    }
}

fn json_ids(text: &str, pointer: &str) -> Result<Vec<i64>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): `{}`", shorten(text)))?;
    let at = doc
        .pointer(pointer)
        .ok_or_else(|| format!("no `{pointer}` in `{}`", shorten(text)))?;
    let one = |v: &serde_json::Value| match v {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let ids: Option<Vec<i64>> = match at {
        serde_json::Value::Array(items) => items.iter().map(one).collect(),
        v => one(v).map(|id| vec![id]),
    };
    match ids {
        Some(ids) if !ids.is_empty() => Ok(ids),
        _ => Err(format!(
            "`{pointer}` is not an ID: `{}`",
            shorten(&at.to_string())
        )),
    }
}

/// Tinyid's `nextId` answer: `{"data":[…],"code":200,"message":""}`.
fn tinyid_json(text: &str) -> Result<Vec<i64>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): `{}`", shorten(text)))?;
    let code = doc.get("code").and_then(serde_json::Value::as_i64);
    if code != Some(200) {
        return Err(format!("Tinyid code {code:?}: {}", shorten(text)));
    }
    json_ids(text, "/data")
}

/// What the target promises about the order of its IDs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Monotonic {
    /// Nothing: only uniqueness is judged.
    #[default]
    None,
    /// Each server's IDs increase (Leaf and Tinyid segments within one instance).
    Server,
    /// IDs increase across every server (one Redis or PostgreSQL counter).
    Global,
}

impl Monotonic {
    /// Parses `none`, `server` or `global`.
    ///
    /// # Errors
    /// Any other word.
    pub fn parse(word: &str) -> Result<Self, String> {
        match word {
            "none" => Ok(Self::None),
            "server" => Ok(Self::Server),
            "global" => Ok(Self::Global),
            other => Err(format!("`{other}`: expected none, server or global")),
        }
    }
}

/// A fault the nemesis applies to one server at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlackBoxFault {
    /// SIGKILL of the server's command, restarted with the same command `down` later.
    Kill,
    /// SIGSTOP, SIGCONT `down` later.
    Pause,
    /// The clients' link to the server black-holed by the fault proxy, healed `down` later.
    Partition,
    /// The server's wall clock stepped by `clock_step_ms` (backwards, then forwards on the next
    /// fault, in turn), stepped home `down` later.
    Clock,
    /// The machine's power: every server SIGKILLed, every write to `{data}` that was not synced
    /// dropped (a lost-unsynced-writes filesystem), every server restarted `down` later.
    PowerLoss,
    /// A fault of the user's database (`--db-cmd`; [`crate::db`]).
    Db(DbFault),
}

impl BlackBoxFault {
    /// Every kind.
    pub const ALL: [Self; 9] = [
        Self::Kill,
        Self::Pause,
        Self::Partition,
        Self::Clock,
        Self::PowerLoss,
        Self::Db(DbFault::Kill),
        Self::Db(DbFault::Pause),
        Self::Db(DbFault::PowerLoss),
        Self::Db(DbFault::Partition),
    ];

    /// Its kind in the fault vocabulary ([`sut::fault::FaultKind`]).
    #[must_use]
    pub const fn kind(self) -> sut::fault::FaultKind {
        use sut::fault::FaultKind as K;
        match self {
            Self::Kill => K::Kill,
            Self::Pause => K::Pause,
            Self::Partition => K::Partition,
            Self::Clock => K::ClockBump,
            Self::PowerLoss => K::PowerLoss,
            Self::Db(fault) => fault.kind(),
        }
    }

    /// The fault named `word`, as `--nemesis` takes it (`clock` is `clock_bump`'s older name).
    ///
    /// # Errors
    /// An unknown name, or a fault not injected into a user's service (saying where it is).
    pub fn parse(word: &str) -> Result<Self, String> {
        sut::fault::parse_into(word, sut::fault::Runner::OwnService, &Self::ALL, Self::kind)
    }

    /// Its name in the fault vocabulary.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.kind().name()
    }

    /// Whether the bench must own the servers' processes for it.
    #[must_use]
    pub const fn needs_commands(self) -> bool {
        matches!(
            self,
            Self::Kill | Self::Pause | Self::Clock | Self::PowerLoss | Self::Db(_)
        )
    }

    /// The database fault it is, if it is one.
    #[must_use]
    pub const fn db(self) -> Option<DbFault> {
        match self {
            Self::Db(fault) => Some(fault),
            _ => None,
        }
    }
}

/// The nemesis of a black-box run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlackBoxNemesis {
    /// The faults, taken in turn.
    pub faults: Vec<BlackBoxFault>,
    /// Time between the end of one fault and the next.
    pub every: Duration,
    /// How long each fault lasts.
    pub down_for: Duration,
    /// The size of a clock step, ms.
    pub clock_step_ms: i64,
    /// How `partition` and `db_partition` cut their link.
    pub cut: CutShape,
}

/// How a partition cuts its link (`--cut`), through the proxy or at the IP level alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CutShape {
    /// Nothing gets through, either way.
    #[default]
    Both,
    /// Requests (clients to server, servers to database) are dropped; answers would still
    /// come back.
    OneWay,
    /// Cut and whole in turn, every `every_ms`, while the fault lasts.
    Flap {
        /// How long each state holds, ms (at least 1).
        every_ms: u64,
    },
}

impl CutShape {
    /// `both`, `one-way` or `flap` (then every `flap_ms`).
    ///
    /// # Errors
    /// Another word, or a flap of 0 ms.
    pub fn parse(word: &str, flap_ms: u64) -> Result<Self, String> {
        match word {
            "both" => Ok(Self::Both),
            "one-way" => Ok(Self::OneWay),
            "flap" if flap_ms > 0 => Ok(Self::Flap { every_ms: flap_ms }),
            "flap" => Err("--flap-ms must be at least 1".into()),
            other => Err(format!("--cut {other}: both, one-way or flap")),
        }
    }

    /// The proxy's shape of the cut.
    const fn link_fault(self) -> LinkFault {
        match self {
            Self::Both | Self::Flap { .. } => LinkFault::Blackhole,
            Self::OneWay => LinkFault::OneWay {
                stall: chaos::Direction::Up,
            },
        }
    }
}

/// A black-box run.
#[derive(Clone, Debug, PartialEq)]
pub struct BlackBoxOptions {
    /// The kind of API.
    pub target: Target,
    /// One URL per server (several: spread request by request).
    pub urls: Vec<String>,
    /// The key (business tag, sequence name, Redis key).
    pub key: String,
    /// Client threads, one request at a time each (with `ramp`, the count it starts from is
    /// its own, and this is not used).
    pub clients: u64,
    /// Raise the client count in short steps until the rate stops growing or the latency
    /// doubles, then run the checked phase at the count chosen ([`crate::ramp`]).
    pub ramp: Option<RampSpec>,
    /// Total requests per second over every client; `None`: as fast as answered.
    pub rate: Option<f64>,
    /// How long the clients run.
    pub duration: Duration,
    /// The order the target promises.
    pub monotonic: Monotonic,
    /// The commands that start the servers, one per URL, in the same order; empty when they
    /// already run (then only `partition` applies). `{data}` in a command is replaced by the
    /// run's data directory (fresh, removed afterwards; on the lost-writes filesystem when the
    /// nemesis cuts the power), `{server}` by the server's number (1, 2, …).
    pub commands: Vec<String>,
    /// Faults, if any.
    pub nemesis: Option<BlackBoxNemesis>,
    /// After the run, the slow-clients check against the first server (HTTP targets;
    /// [`crate::slow`]).
    pub slow_clients: Option<SlowSpec>,
    /// The user's database, started by the bench before the servers (`--db-cmd`; `{db_url}`
    /// in a command is its address through the fault proxy).
    pub db: Option<DbOptions>,
    /// With `db`: the servers' link to it slowed in bursts for the whole run, each chunk held
    /// this long ± half of it ([`DB_DELAY_BURST`] slowed, as long whole, in turn), so that a
    /// service's read-then-write windows open at any client count (`--delay-db-ms`).
    pub db_delay: Option<Duration>,
    /// Every server (and the database) in a network namespace of its own, with its own
    /// address (`{ip}` in its `--url` and command; [`chaos::NetLab`]): `partition` and
    /// `db_partition` are then nftables rules, not the proxy, and reach links the bench does
    /// not carry (a server talking to its database directly).
    pub netns: bool,
}

pub use crate::ramp::RampSpec;
pub use crate::slow::SlowSpec;

/// How long each burst of `--delay-db-ms` slows the database link, and how long it is whole
/// between two bursts.
pub const DB_DELAY_BURST: Duration = Duration::from_millis(500);

/// Why a black-box run could not be made (not a verdict on the target).
#[derive(Debug, thiserror::Error)]
pub enum BlackBoxError {
    /// The options do not make a run.
    #[error("{0}")]
    Usage(String),
    /// A server or a proxy could not be started or driven.
    #[error(transparent)]
    Cluster(#[from] ProcessError),
    /// The target did not give one ID before the run.
    #[error("{url}: no ID before the run started: {why}")]
    Unreachable {
        /// The server's URL.
        url: String,
        /// The first request's error.
        why: String,
    },
}

/// How requests that gave no ID ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ErrorCounts {
    /// The connection was refused or could not be made: the request never left (`fail`).
    pub refused: u64,
    /// The target answered an error, by its own convention (`fail`).
    pub answered: u64,
    /// No answer in time (`info`: it may have issued an ID).
    pub timeout: u64,
    /// The connection broke after the request left (`info`).
    pub unknown: u64,
}

impl ErrorCounts {
    fn add(&mut self, other: &Self) {
        self.refused += other.refused;
        self.answered += other.answered;
        self.timeout += other.timeout;
        self.unknown += other.unknown;
    }
}

/// What a black-box run did and found.
#[derive(Debug)]
pub struct BlackBoxRun {
    /// Every request and its outcome (one `ok` per ID).
    pub history: History,
    /// IDs received.
    pub ids: u64,
    /// IDs never handed out between the smallest and the largest received.
    pub gaps: u64,
    /// How the requests that gave no ID ended.
    pub errors: ErrorCounts,
    /// A few error texts, the first of each class.
    pub error_examples: Vec<String>,
    /// Faults injected.
    pub faults: u32,
    /// `ids.unique`.
    pub unique: InvariantResult,
    /// `ids.monotonic`, when the target promises an order.
    pub monotonic: Option<InvariantResult>,
    /// `faults.took_effect`, when there was a nemesis.
    pub took_effect: Option<InvariantResult>,
    /// `faults.db_delayed`, with `--delay-db-ms`: the bursts delayed bytes of the link.
    pub db_delayed: Option<InvariantResult>,
    /// What the fault proxies did (partition runs), summed over the links.
    pub proxy: Option<chaos::ProxyEffects>,
    /// What the lost-writes filesystem did (power-loss runs).
    pub lost_writes: Option<chaos::LostFsEffects>,
    /// What the proxy between the servers and the database did (`--db-cmd` runs).
    pub db_proxy: Option<chaos::ProxyEffects>,
    /// What the lost-writes filesystem under the database's `{dbdata}` did (`db_power_loss`).
    pub db_lost_writes: Option<chaos::LostFsEffects>,
    /// Packets the IP-level cuts dropped (`netns` runs).
    pub dropped_packets: Option<u64>,
    /// Latency of every request (µs; from its intended send time when paced by `--rate`),
    /// errors by class, throughput over time.
    pub latency: reports::model::EndpointStats,
    /// Each fault: when, which server, which kind.
    pub fault_windows: Vec<reports::model::FaultWindow>,
    /// What the slow-clients check measured, and its two checks.
    pub slow: Option<(crate::slow::SlowRun, Vec<InvariantResult>)>,
    /// How many requests were ever in flight at once, the longest request, and whether a
    /// pass is inconclusive for races ([`crate::overlap`]).
    pub concurrency: reports::model::Concurrency,
    /// `races.overlapped`: held when requests of the key overlapped, not checked otherwise.
    pub overlap: InvariantResult,
    /// The ramp's steps and the count it chose (no `--concurrency`).
    pub ramp: Option<reports::model::Ramp>,
    /// Client threads of the checked phase.
    pub clients: u64,
    /// How long the clients ran, the ramp included.
    pub elapsed: Duration,
}

impl BlackBoxRun {
    /// The run as a load report (for the HTML report): the latency of `generate`, the fault
    /// windows, the checks.
    #[must_use]
    pub fn load_report(&self, opts: &BlackBoxOptions) -> reports::model::LoadReport {
        reports::model::LoadReport {
            scenario: format!("ids --target {}", opts.target.kind()),
            target: opts.urls.join(" "),
            duration_s: self.elapsed.as_secs_f64(),
            warmup_s: 0.0,
            rate: opts.rate,
            users: self.clients,
            endpoints: vec![self.latency.clone()],
            server: Vec::new(),
            fault_windows: self.fault_windows.clone(),
            verification: self.checks().into_iter().cloned().collect(),
            concurrency: Some(self.concurrency.clone()),
            ramp: self.ramp.clone(),
        }
    }

    /// Every judged check, `races.overlapped` last.
    #[must_use]
    pub fn checks(&self) -> Vec<&InvariantResult> {
        std::iter::once(&self.unique)
            .chain(self.monotonic.as_ref())
            .chain(self.took_effect.as_ref())
            .chain(self.db_delayed.as_ref())
            .chain(self.slow.iter().flat_map(|(_, checks)| checks))
            .chain(std::iter::once(&self.overlap))
            .collect()
    }

    /// Whether every check held.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks()
            .iter()
            .all(|c| c.verdict != Judgement::Violated)
    }
}

/// One `ok` request, for the order checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The client thread.
    pub process: u64,
    /// The server (index into the URLs).
    pub server: usize,
    /// When the request left, ns since the run began.
    pub invoke_ns: u64,
    /// When its answer came, ns since the run began.
    pub complete_ns: u64,
    /// The IDs, in the answer's order.
    pub ids: Vec<i64>,
}

/// The servers a run owns: their processes and clocks (with commands), their proxies
/// (partition runs), and the URLs the clients use.
struct Servers {
    commands: Vec<CommandService>,
    /// The user's database: stopped after the servers that use it.
    db: Option<Database>,
    clocks: Vec<FakeClock>,
    proxies: Vec<Proxy>,
    client_urls: Vec<String>,
    /// The servers' own URLs (`{ip}` filled in).
    server_urls: Vec<String>,
    /// The lost-writes filesystem under `{data}` (power-loss runs); unmounted after the
    /// servers are gone (fields drop in order).
    lostfs: Option<chaos::LostFs>,
    /// The network namespaces (`netns` runs), deleted after every process in them is gone.
    lab: Option<NetLab>,
    /// Packets dropped by the cuts healed so far.
    dropped_packets: u64,
    /// How partitions cut.
    shape: CutShape,
    /// Packets dropped during the partition in force (`netns` runs).
    fault_dropped: u64,
    /// Bytes its proxy had held when the partition in force began.
    held_at_cut: u64,
    /// Logs and `{data}`.
    _dir: Option<tempfile::TempDir>,
}

/// The run's data directory, mounted on a lost-writes filesystem when `lose_unsynced`.
fn data_dir(
    root: &std::path::Path,
    lose_unsynced: bool,
) -> Result<(std::path::PathBuf, Option<chaos::LostFs>), BlackBoxError> {
    let data = root.join("data");
    let made =
        |e: std::io::Error| BlackBoxError::Usage(format!("cannot make {}: {e}", data.display()));
    std::fs::create_dir(&data).map_err(made)?;
    if !lose_unsynced {
        return Ok((data, None));
    }
    let backing = root.join("disk");
    std::fs::create_dir(&backing).map_err(made)?;
    let lostfs = chaos::LostFs::mount(&backing, &data)?;
    Ok((data, Some(lostfs)))
}

impl Servers {
    fn start(opts: &BlackBoxOptions) -> Result<Self, BlackBoxError> {
        let faults = opts
            .nemesis
            .as_ref()
            .map(|n| n.faults.as_slice())
            .unwrap_or_default();
        let clocked = faults.contains(&BlackBoxFault::Clock);
        let (mut commands, mut clocks, mut logs, mut lostfs) = (Vec::new(), Vec::new(), None, None);
        let lab = opts
            .netns
            .then(|| {
                let mut names: Vec<String> = (1..=opts.urls.len())
                    .map(|i| format!("server-{i}"))
                    .collect();
                if opts.db.is_some() {
                    names.push("database".into());
                }
                NetLab::create(&names.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .transpose()?;
        let place = |i: usize| lab.as_ref().map(|lab| lab.node(i).clone());
        let server_urls: Vec<String> = (0..opts.urls.len())
            .map(|i| fill_ip(&opts.urls[i], place(i).as_ref()))
            .collect();
        let db = match &opts.db {
            Some(spec) => {
                let cut_power = faults.contains(&BlackBoxFault::Db(DbFault::PowerLoss));
                Some(Database::start_in(spec, cut_power, place(opts.urls.len()))?)
            }
            None => None,
        };
        let fill_db = |command: String| match &db {
            Some(db) => db.fill(&command),
            None => command,
        };
        if !opts.commands.is_empty() {
            let dir = tempfile::Builder::new()
                .prefix("bench-own-service-")
                .tempdir()
                .map_err(|e| BlackBoxError::Usage(format!("cannot make a run folder: {e}")))?;
            let (data, mounted) = data_dir(dir.path(), faults.contains(&BlackBoxFault::PowerLoss))?;
            lostfs = mounted;
            for (i, (command, url)) in opts.commands.iter().zip(&server_urls).enumerate() {
                let command = fill_db(fill_ip(
                    &command
                        .replace("{data}", &data.display().to_string())
                        .replace("{server}", &(i + 1).to_string()),
                    place(i).as_ref(),
                ));
                let mut env = Vec::new();
                if clocked {
                    let clock = FakeClock::new()?;
                    env = clock.env();
                    clocks.push(clock);
                }
                commands.push(CommandService::start(CommandSpec {
                    name: format!("server-{}", i + 1),
                    command,
                    port: socket_addr(url)?.port(),
                    env,
                    log: dir.path().join(format!("server-{}.log", i + 1)),
                    netns: place(i),
                })?);
            }
            logs = Some(dir);
        }
        let mut proxies = Vec::new();
        let mut client_urls = server_urls.clone();
        if faults.contains(&BlackBoxFault::Partition) && lab.is_none() {
            for (i, url) in server_urls.iter().enumerate() {
                let proxy = Proxy::start(socket_addr(url)?, i as u64 + 1)?;
                client_urls[i] = via(url, proxy.addr().port())?;
                proxies.push(proxy);
            }
        }
        Ok(Self {
            commands,
            db,
            clocks,
            proxies,
            client_urls,
            server_urls,
            lostfs,
            lab,
            dropped_packets: 0,
            shape: opts.nemesis.as_ref().map_or(CutShape::Both, |n| n.cut),
            fault_dropped: 0,
            held_at_cut: 0,
            _dir: logs,
        })
    }

    /// Begins fault number `n` (of kind `fault`) on its server; whether its effect is in place.
    fn inject(&mut self, fault: BlackBoxFault, n: u32, step_ms: i64) -> Result<bool, ProcessError> {
        if is_partition(fault) {
            self.fault_dropped = 0;
            self.held_at_cut = self.held_bytes(fault, n);
            return self.cut(fault, n, true);
        }
        if let Some(fault) = fault.db() {
            return self.database().inject(fault);
        }
        let server = self.target_of(fault, n);
        match fault {
            BlackBoxFault::Kill => {
                self.commands[server].kill9()?;
                Ok(self.commands[server].is_down())
            }
            BlackBoxFault::Pause => {
                self.commands[server].pause()?;
                Ok(true)
            }
            BlackBoxFault::Partition => unreachable!("partitions are cut above"),
            BlackBoxFault::Clock => {
                let step = if n.is_multiple_of(2) {
                    -step_ms
                } else {
                    step_ms
                };
                self.clocks[server].set_offset_ms(step)?;
                let library = chaos::libfaketime_path();
                Ok(library.is_some_and(|l| self.commands[server].maps_library(&l)))
            }
            BlackBoxFault::PowerLoss => {
                for command in &mut self.commands {
                    command.kill9()?;
                }
                let lostfs = self.lostfs.as_ref().expect("power-loss runs mount {data}");
                lostfs.power_loss();
                Ok(self.commands.iter_mut().all(CommandService::is_down))
            }
            BlackBoxFault::Db(_) => unreachable!("a database fault was handed to the database"),
        }
    }

    /// Ends fault number `n`; whether it took effect, as far as only its end can tell.
    fn heal(&mut self, fault: BlackBoxFault, n: u32) -> Result<bool, ProcessError> {
        if is_partition(fault) {
            let healed = self.mend(fault, n, true)?;
            // It touched the link while it lasted: the rules dropped packets, or the proxy held
            // bytes (the clients' proxies hold whatever comes, so a cut of theirs always does).
            let touched = if self.lab.is_some() {
                self.fault_dropped > 0
            } else {
                fault == BlackBoxFault::Partition || self.held_bytes(fault, n) > self.held_at_cut
            };
            return Ok(healed && touched);
        }
        if let Some(fault) = fault.db() {
            return self.database().heal(fault);
        }
        let server = self.target_of(fault, n);
        match fault {
            BlackBoxFault::Kill => self.commands[server].restart(),
            BlackBoxFault::Pause => self.commands[server].resume(),
            BlackBoxFault::Partition => unreachable!("partitions are mended above"),
            BlackBoxFault::Clock => self.clocks[server].set_offset_ms(0),
            BlackBoxFault::PowerLoss => self
                .commands
                .iter_mut()
                .try_for_each(CommandService::restart),
            BlackBoxFault::Db(_) => unreachable!("a database fault was handed to the database"),
        }
        .map(|()| true)
    }

    /// Cuts the link of partition number `n` in the run's shape; with `probe`, whether the cut
    /// is in place (the IP-level probes; a proxy's cut is in place once set).
    fn cut(&mut self, fault: BlackBoxFault, n: u32, probe: bool) -> Result<bool, ProcessError> {
        if let Some((a, b)) = self.ip_cut(fault, n) {
            let lab = self.lab.as_ref().expect("ip_cut is only for netns runs");
            let mut in_place = true;
            for &x in &a {
                for &y in &b {
                    let mut ways = vec![(x, y)];
                    if self.shape != CutShape::OneWay {
                        ways.push((y, x));
                    }
                    for (from, to) in ways {
                        if probe {
                            in_place &= lab.cut(from, to)?;
                        } else {
                            lab.drop_from(from, to)?;
                        }
                    }
                }
            }
            return Ok(in_place);
        }
        let shape = self.shape.link_fault();
        match fault {
            BlackBoxFault::Partition => {
                let server = self.target_of(fault, n);
                self.proxies[server].set(shape);
            }
            _ => self.database().set_link(shape),
        }
        Ok(true)
    }

    /// Mends the link of partition number `n`; with `probe`, whether every link answers again.
    fn mend(&mut self, fault: BlackBoxFault, n: u32, probe: bool) -> Result<bool, ProcessError> {
        if let Some(lab) = self.lab.as_ref() {
            let dropped = lab.dropped_packets();
            self.fault_dropped += dropped;
            self.dropped_packets += dropped;
            return if probe {
                lab.heal()
            } else {
                lab.flush().map(|()| true)
            };
        }
        match fault {
            BlackBoxFault::Partition => {
                let server = self.target_of(fault, n);
                self.proxies[server].set(LinkFault::None);
            }
            _ => self.database().set_link(LinkFault::None),
        }
        Ok(true)
    }

    /// Bytes the proxy of partition number `n`'s link has held so far (0 at the IP level).
    fn held_bytes(&self, fault: BlackBoxFault, n: u32) -> u64 {
        if self.lab.is_some() {
            return 0;
        }
        match fault {
            BlackBoxFault::Partition => self.proxies[self.target_of(fault, n)].effects().held_bytes,
            _ => self
                .db
                .as_ref()
                .and_then(Database::proxy_effects)
                .map_or(0, |e| e.held_bytes),
        }
    }

    /// The two sides of fault number `n` when it is an IP-level partition (`netns` runs): the
    /// clients and one server, or every server and the database.
    fn ip_cut(&self, fault: BlackBoxFault, n: u32) -> Option<(Vec<End>, Vec<End>)> {
        self.lab.as_ref()?;
        let servers = self.server_urls.len();
        match fault {
            BlackBoxFault::Partition => {
                Some((vec![End::Bench], vec![End::Node(n as usize % servers)]))
            }
            BlackBoxFault::Db(DbFault::Partition) => Some((
                (0..servers).map(End::Node).collect(),
                vec![End::Node(servers)],
            )),
            _ => None,
        }
    }

    /// Partition number `n` (cut now) mended and cut again in turn every `every`, for `down`;
    /// it ends cut, for [`Servers::heal`] to mend.
    fn flap(
        &mut self,
        fault: BlackBoxFault,
        n: u32,
        down: Duration,
        every: Duration,
    ) -> Result<(), ProcessError> {
        let until = Instant::now() + down;
        let mut cut = true;
        while Instant::now() + every < until {
            thread::sleep(every);
            if cut {
                self.mend(fault, n, false)?;
            } else {
                self.cut(fault, n, false)?;
            }
            cut = !cut;
        }
        if !cut {
            self.cut(fault, n, false)?;
        }
        if let Some(left) = until.checked_duration_since(Instant::now()) {
            thread::sleep(left);
        }
        Ok(())
    }

    fn database(&mut self) -> &mut Database {
        self.db
            .as_mut()
            .expect("the options were validated: database faults have --db-cmd")
    }

    /// The lane of fault number `n` on the report's timeline.
    fn name_of(&self, fault: BlackBoxFault, n: u32) -> String {
        match fault {
            BlackBoxFault::Db(DbFault::Partition) => "servers→database".to_owned(),
            BlackBoxFault::Db(_) => "database".to_owned(),
            BlackBoxFault::PowerLoss => "every server".to_owned(),
            BlackBoxFault::Partition => format!("clients→server-{}", self.target_of(fault, n) + 1),
            _ => format!("server-{}", self.target_of(fault, n) + 1),
        }
    }

    /// The server fault number `n` hits: the servers in turn.
    fn target_of(&self, fault: BlackBoxFault, n: u32) -> usize {
        let count = if fault == BlackBoxFault::Partition {
            self.server_urls.len()
        } else {
            self.commands.len()
        };
        assert!(
            count > 0,
            "the options were validated: {} has servers",
            fault.name()
        );
        n as usize % count
    }

    fn proxy_effects(&self) -> Option<chaos::ProxyEffects> {
        if self.proxies.is_empty() {
            return None;
        }
        let mut sum = chaos::ProxyEffects::default();
        for e in self.proxies.iter().map(Proxy::effects) {
            sum += e;
        }
        Some(sum)
    }
}

/// Whether `fault` cuts a link (the clients' or the database's).
fn is_partition(fault: BlackBoxFault) -> bool {
    matches!(
        fault,
        BlackBoxFault::Partition | BlackBoxFault::Db(DbFault::Partition)
    )
}

/// `url` (or a command) with `{ip}` replaced by the address of `place`; with no place (no
/// `netns`) it is left as it is.
fn fill_ip(text: &str, place: Option<&chaos::InNetns>) -> String {
    match place {
        Some(place) => text.replace("{ip}", &place.addr.to_string()),
        None => text.to_owned(),
    }
}

/// [`load::conn::socket_addr`], as a usage error.
fn socket_addr(url: &str) -> Result<SocketAddr, BlackBoxError> {
    load::conn::socket_addr(url).map_err(BlackBoxError::Usage)
}

/// `url` with its host and port replaced by the loopback proxy's.
fn via(url: &str, port: u16) -> Result<String, BlackBoxError> {
    let mut parsed =
        reqwest::Url::parse(url).map_err(|e| BlackBoxError::Usage(format!("--url {url}: {e}")))?;
    let cannot = || BlackBoxError::Usage(format!("--url {url}: cannot route it through a proxy"));
    parsed.set_host(Some("127.0.0.1")).map_err(|_| cannot())?;
    parsed.set_port(Some(port)).map_err(|()| cannot())?;
    // The template's braces must survive: `Url` escapes them in the path.
    Ok(parsed.as_str().replace("%7Bkey%7D", "{key}"))
}

/// Checks the options before anything starts.
///
/// # Errors
/// [`BlackBoxError::Usage`] naming what is wrong.
pub fn validate(opts: &BlackBoxOptions) -> Result<(), BlackBoxError> {
    let usage = |m: String| Err(BlackBoxError::Usage(m));
    if opts.urls.is_empty() {
        return usage("name at least one --url".into());
    }
    if !opts.commands.is_empty() && opts.commands.len() != opts.urls.len() {
        return usage(format!(
            "{} --server-cmd for {} --url: give one command per URL, in the same order",
            opts.commands.len(),
            opts.urls.len()
        ));
    }
    if opts.clients == 0 {
        return usage("--concurrency must be at least 1".into());
    }
    if let Some(ramp) = &opts.ramp {
        ramp.validate().map_err(BlackBoxError::Usage)?;
    }
    if opts.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return usage("--rate must be a positive number of requests per second".into());
    }
    if let Some(spec) = &opts.slow_clients {
        if !opts.target.is_http() {
            return usage(format!(
                "--slow-clients needs an HTTP target, not {}",
                opts.target.kind()
            ));
        }
        spec.validate().map_err(BlackBoxError::Usage)?;
    }
    if let Target::Http { .. } = opts.target {
        for url in &opts.urls {
            match (url.contains("{key}"), opts.key.is_empty()) {
                (true, true) => return usage(format!("--url {url} has {{key}}: give the --key")),
                (false, false) => {
                    return usage(format!(
                        "--url {url}: put {{key}} where the key goes, or give no --key"
                    ));
                }
                _ => {}
            }
        }
    }
    if matches!(opts.target, Target::Postgres) && !is_sql_name(&opts.key) {
        return usage(format!(
            "--key `{}`: a sequence name (letters, digits, `_`, and `.` between a schema and a name)",
            opts.key
        ));
    }
    if let Target::Tinyid { batch: 0, .. } = opts.target {
        return usage("--batch must be at least 1".into());
    }
    for url in &opts.urls {
        // Any address stands for `{ip}` here: only the form is checked.
        socket_addr(&url.replace("{ip}", "10.213.0.1"))?;
    }
    validate_netns(opts)?;
    validate_db(opts)?;
    if let Some(n) = &opts.nemesis {
        if n.faults.is_empty() {
            return usage("--nemesis: name at least one fault".into());
        }
        if let Some(f) = n.faults.iter().find(|f| f.needs_commands())
            && opts.commands.is_empty()
        {
            return usage(format!(
                "--nemesis {}: the bench must start the servers (--server-cmd, one per --url)",
                f.name()
            ));
        }
        if n.faults.contains(&BlackBoxFault::PowerLoss)
            && !opts.commands.iter().all(|c| c.contains("{data}"))
        {
            return usage(
                "--nemesis power_loss: put {data} in every --server-cmd where the service keeps \
                 its files (the bench mounts its lost-writes filesystem there)"
                    .into(),
            );
        }
        if n.faults.contains(&BlackBoxFault::Clock) && chaos::libfaketime_path().is_none() {
            return usage(
                "--nemesis clock needs libfaketime (Debian: apt-get install faketime)".into(),
            );
        }
        if n.every.is_zero() || n.down_for.is_zero() {
            return usage("--every-ms and --down-ms must be at least 1".into());
        }
    }
    Ok(())
}

/// `netns`: the bench starts every server, each `--url` says where its server's address goes,
/// and the machine can make namespaces and rules.
fn validate_netns(opts: &BlackBoxOptions) -> Result<(), BlackBoxError> {
    let usage = |m: String| Err(BlackBoxError::Usage(m));
    if !opts.netns {
        if let Some(url) = opts.urls.iter().find(|u| u.contains("{ip}")) {
            return usage(format!(
                "--url {url}: {{ip}} is a server's address with --netns only"
            ));
        }
        return Ok(());
    }
    if opts.commands.is_empty() {
        return usage(
            "--netns: the bench must start the servers (--server-cmd, one per --url), each in \
             its own network namespace"
                .into(),
        );
    }
    if let Some(url) = opts.urls.iter().find(|u| !u.contains("{ip}")) {
        return usage(format!(
            "--url {url}: with --netns put {{ip}} where the server's address goes (each server \
             has its own), e.g. http://{{ip}}:8080"
        ));
    }
    NetLab::check().map_err(BlackBoxError::Cluster)
}

/// The database's options, and the servers' use of it.
fn validate_db(opts: &BlackBoxOptions) -> Result<(), BlackBoxError> {
    let usage = |m: String| Err(BlackBoxError::Usage(m));
    let db_faults: Vec<DbFault> = opts
        .nemesis
        .iter()
        .flat_map(|n| n.faults.iter().filter_map(|f| f.db()))
        .collect();
    let uses_db = |c: &&String| crate::db::SERVER_PLACEHOLDERS.iter().any(|p| c.contains(p));
    if let Some(delay) = opts.db_delay {
        if opts.db.is_none() {
            return usage(
                "--delay-db-ms: the bench slows the link to a database it starts (--db-cmd)".into(),
            );
        }
        if opts.netns {
            return usage(
                "--delay-db-ms: with --netns the servers reach the database without the bench's \
                 proxy, which slows the link"
                    .into(),
            );
        }
        if db_faults.contains(&DbFault::Partition) {
            return usage(
                "--delay-db-ms and --nemesis db_partition both shape the database link: give one"
                    .into(),
            );
        }
        if delay.is_zero() {
            return usage("--delay-db-ms must be at least 1".into());
        }
    }
    let Some(db) = &opts.db else {
        if let Some(fault) = db_faults.first() {
            return usage(format!(
                "--nemesis {}: the bench must start the database (--db-cmd)",
                fault.kind().name()
            ));
        }
        if let Some(command) = opts.commands.iter().find(uses_db) {
            return usage(format!(
                "--server-cmd `{command}` uses the database's address, but there is no --db-cmd"
            ));
        }
        return Ok(());
    };
    db.validate(&db_faults).map_err(BlackBoxError::Usage)?;
    if opts.netns && !db.command.contains("{dbhost}") {
        return usage(format!(
            "--db-cmd `{}`: with --netns put {{dbhost}} where the database's listening address \
             goes (its namespace's own, which the servers reach it at)",
            db.command
        ));
    }
    if opts.commands.is_empty() {
        return usage(
            "--db-cmd: the bench must start the servers too (--server-cmd, one per --url), to \
             hand them {db_url}"
                .into(),
        );
    }
    if !opts.commands.iter().any(|c| uses_db(&c)) {
        return usage(
            "--db-cmd: no --server-cmd uses {db_url}, {db_addr} or {db_port}, so the servers \
             would not reach the database through the bench's fault proxy"
                .into(),
        );
    }
    Ok(())
}

fn is_sql_name(name: &str) -> bool {
    let part = |p: &str| {
        p.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    !name.is_empty() && name.split('.').count() <= 2 && name.split('.').all(part)
}

/// Runs the clients against the target under the nemesis and judges the history (see the
/// module docs).
///
/// # Errors
/// Bad options, a server that cannot be started or restarted, or a target that gives no ID
/// before the run.
pub fn run(opts: &BlackBoxOptions) -> Result<BlackBoxRun, BlackBoxError> {
    validate(opts)?;
    let mut servers = Servers::start(opts)?;
    for url in &servers.client_urls {
        let mut client = Client::new(&opts.target, url, &opts.key);
        if let Answer::Error(class, why) = client.next_ids() {
            return Err(BlackBoxError::Unreachable {
                url: url.clone(),
                why: format!("{}: {why}", class.name()),
            });
        }
    }
    let bursts = opts
        .db_delay
        .zip(servers.db.as_ref().and_then(Database::link_switch))
        .map(|(delay, switch)| DelayBursts::start(switch, delay));
    let mut ramp = opts
        .ramp
        .map(|spec| crate::ramp::Ramp::new(spec, opts.urls.len()));
    let first = ramp.as_ref().map_or(opts.clients, crate::ramp::Ramp::first);
    let shared = Arc::new(Shared {
        recorder: Recorder::new(),
        began: Instant::now(),
        stop: AtomicBool::new(false),
        active: AtomicU64::new(first),
        ramping: AtomicBool::new(opts.ramp.is_some()),
        next_server: AtomicU64::new(0),
        pace: opts.rate.map(|rate| Pace {
            period: Duration::from_secs_f64(1.0 / rate),
            slots: std::sync::Mutex::new((Instant::now(), 0)),
        }),
        results: std::sync::Mutex::new(ClientResults::default()),
        latency: std::sync::Mutex::new(Live::default()),
    });
    let mut threads = Vec::new();
    let clients_up_to = |count: u64, threads: &mut Vec<thread::JoinHandle<()>>| {
        shared.active.store(count, Ordering::Relaxed);
        shared.pace_from_now();
        while (threads.len() as u64) < count {
            let process = threads.len() as u64;
            let (shared, opts) = (Arc::clone(&shared), opts.clone());
            let urls = servers.client_urls.clone();
            threads.push(thread::spawn(move || {
                client_loop(process, &opts, &urls, &shared);
            }));
        }
    };
    clients_up_to(first, &mut threads);
    let mut chosen = first;
    let mut ramped = None;
    if let Some(ramp) = ramp.as_mut() {
        let step = opts.ramp.map_or(crate::ramp::RampSpec::STEP, |r| r.step);
        let mut clients = first;
        let reason = loop {
            clients_up_to(clients, &mut threads);
            let measured = ramp_step(&shared, clients, step);
            match ramp.next(measured) {
                crate::ramp::Next::Step(next) => clients = next,
                crate::ramp::Next::Done { clients, reason } => {
                    chosen = clients;
                    break reason;
                }
            }
        };
        // Clients numbered from `chosen` up end their loop; the others go on.
        clients_up_to(chosen, &mut threads);
        shared.ramping.store(false, Ordering::Relaxed);
        ramped = Some(reason);
    }
    let ramp = ramp.zip(ramped).map(|(r, why)| r.finish(chosen, why));
    let ends = Instant::now() + opts.duration;
    let nemesis = opts
        .nemesis
        .as_ref()
        .map(|n| run_nemesis(n, &mut servers, shared.began, ends));
    if let Some(left) = ends.checked_duration_since(Instant::now()) {
        thread::sleep(left);
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let faults = nemesis.transpose()?.unwrap_or_default();
    let bursts = bursts.map(DelayBursts::stop);
    let elapsed = shared.began.elapsed();
    let shared = Arc::into_inner(shared).expect("every client thread has ended");
    let history = shared.recorder.finish();
    let results = shared
        .results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let effects = Effects {
        proxy: servers.proxy_effects(),
        lost_writes: servers.lostfs.as_ref().map(chaos::LostFs::effects),
        db_proxy: servers.db.as_ref().and_then(Database::proxy_effects),
        dropped_packets: servers.lab.as_ref().map(|_| servers.dropped_packets),
        db_lost_writes: servers.db.as_ref().and_then(Database::lost_writes),
        latency: shared
            .latency
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .all
            .stats("generate", elapsed.as_secs_f64()),
    };
    let mut run = judge(opts, history, results, faults, effects);
    run.db_delayed = bursts.map(|bursts| {
        let delayed = run.db_proxy.map_or(0, |p| p.delayed_chunks);
        db_delayed(bursts, delayed)
    });
    run.ramp = ramp;
    run.clients = chosen;
    run.elapsed = elapsed;
    if let Some(spec) = &opts.slow_clients {
        // Against the server itself (not through a fault proxy), while the bench still owns it.
        let url = reqwest::Url::parse(&opts.target.request_url(&servers.server_urls[0], &opts.key))
            .map_err(|e| BlackBoxError::Usage(format!("--slow-clients: {e}")))?;
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let slow = spec
            .run(
                url.origin().ascii_serialization().as_str(),
                crate::slow::Probe::get(&path),
            )
            .map_err(|e| BlackBoxError::Usage(e.to_string()))?;
        run.slow = Some(slow);
    }
    Ok(run)
}

/// `--delay-db-ms`'s bursts: a thread that slows the database link for [`DB_DELAY_BURST`],
/// leaves it whole as long, and so on until stopped.
struct DelayBursts {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<u32>,
}

impl DelayBursts {
    fn start(switch: chaos::LinkSwitch, delay: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let thread = thread::spawn(move || {
            let mut bursts = 0;
            // Sleeps `d` unless stopped meanwhile; whether it was.
            let wait = |d: Duration| {
                let until = Instant::now() + d;
                while Instant::now() < until {
                    if stopped.load(Ordering::Relaxed) {
                        return true;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                stopped.load(Ordering::Relaxed)
            };
            loop {
                switch.set(LinkFault::Latency {
                    delay_ms,
                    jitter_ms: delay_ms / 2,
                });
                bursts += 1;
                let ended = wait(DB_DELAY_BURST);
                switch.set(LinkFault::None);
                if ended || wait(DB_DELAY_BURST) {
                    return bursts;
                }
            }
        });
        Self { stop, thread }
    }

    /// Stops the bursts (the link left whole); how many there were.
    fn stop(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// `faults.db_delayed`: the bursts of `--delay-db-ms` held back chunks of the database link. A
/// run whose servers never used their database while a burst lasted widened no window.
#[must_use]
pub fn db_delayed(bursts: u32, delayed_chunks: u64) -> InvariantResult {
    let detail =
        format!("{bursts} bursts slowed the database link; {delayed_chunks} chunks delayed");
    if delayed_chunks > 0 {
        InvariantResult {
            detail: Some(detail),
            ..InvariantResult::held("faults.db_delayed")
        }
    } else {
        InvariantResult {
            name: "faults.db_delayed".into(),
            verdict: Judgement::Violated,
            seed: None,
            first_offending_event: Some(
                "no byte of the database link was delayed: the servers did not use their \
                 database while a burst lasted, and no window was widened"
                    .into(),
            ),
            detail: Some(detail),
        }
    }
}

/// One step of the ramp: `clients` run for `step`, measured after its first fifth (the new
/// clients connect then).
fn ramp_step(shared: &Shared, clients: u64, step: Duration) -> reports::model::RampStep {
    let settle = step / 5;
    thread::sleep(settle);
    let measured_from = Instant::now();
    shared.live().step = EndpointRecorder::default();
    thread::sleep(step - settle);
    let recorded = std::mem::take(&mut shared.live().step);
    let seconds = measured_from.elapsed().as_secs_f64();
    let stats = recorded.stats("generate", seconds);
    reports::model::RampStep {
        clients,
        requests: stats.requests,
        errors: stats.error_count(),
        rate_rps: stats.throughput_rps,
        p50_us: stats.corrected.p50_us,
        p99_us: stats.corrected.p99_us,
    }
}

/// The state the client threads share.
struct Shared {
    recorder: Recorder,
    began: Instant,
    stop: AtomicBool,
    /// Clients numbered below this run; the others end their loop.
    active: AtomicU64,
    /// A ramp step is being measured: latencies go to [`Live::step`] too.
    ramping: AtomicBool,
    next_server: AtomicU64,
    /// The send schedule under `--rate`.
    pace: Option<Pace>,
    results: std::sync::Mutex<ClientResults>,
    latency: std::sync::Mutex<Live>,
}

/// The send schedule of a paced run: slot `k` is due `k` periods after the schedule began,
/// whichever client takes it (wrk2's schedule, shared by however many clients run).
struct Pace {
    period: Duration,
    /// When the schedule began, and the next slot.
    slots: std::sync::Mutex<(Instant, u64)>,
}

/// The latencies recorded while the clients run: the whole run's, and the ramp step's.
#[derive(Default)]
struct Live {
    all: EndpointRecorder,
    step: EndpointRecorder,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.latency
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the send schedule again now (a ramp step's clients are not late for the slots
    /// fewer clients could not keep).
    fn pace_from_now(&self) {
        if let Some(pace) = &self.pace {
            *pace
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = (Instant::now(), 0);
        }
    }

    /// The next slot's due time (paced runs), taken by this client.
    fn next_slot(&self) -> Option<Instant> {
        let pace = self.pace.as_ref()?;
        let mut slots = pace
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let period_ns = u64::try_from(pace.period.as_nanos()).unwrap_or(u64::MAX);
        let due = slots.0 + Duration::from_nanos(period_ns.saturating_mul(slots.1));
        slots.1 += 1;
        Some(due)
    }
}

/// What the clients saw besides the history.
#[derive(Debug, Default)]
struct ClientResults {
    completed: Vec<Completed>,
    /// Every request's interval, answered or not.
    spans: Vec<crate::overlap::Span>,
    errors: ErrorCounts,
    examples: Vec<String>,
}

impl ClientResults {
    fn merge(&mut self, other: Self) {
        self.completed.extend(other.completed);
        self.spans.extend(other.spans);
        self.errors.add(&other.errors);
        for e in other.examples {
            if self.examples.len() < 4 && !self.examples.iter().any(|x| same_class(x, &e)) {
                self.examples.push(e);
            }
        }
    }

    fn error(&mut self, class: ErrorClass, why: &str) {
        class.count(&mut self.errors);
        let example = format!("{}: {why}", class.name());
        if !self.examples.iter().any(|x| same_class(x, &example)) {
            self.examples.push(example);
        }
    }
}

fn same_class(a: &str, b: &str) -> bool {
    a.split(':').next() == b.split(':').next()
}

/// What the fault machinery did.
struct Effects {
    proxy: Option<chaos::ProxyEffects>,
    lost_writes: Option<chaos::LostFsEffects>,
    db_proxy: Option<chaos::ProxyEffects>,
    db_lost_writes: Option<chaos::LostFsEffects>,
    dropped_packets: Option<u64>,
    latency: reports::model::EndpointStats,
}

/// What the nemesis did.
#[derive(Clone, Debug, Default, PartialEq)]
struct FaultCount {
    /// Each fault's window.
    windows: Vec<reports::model::FaultWindow>,
    /// Faults injected.
    injected: u32,
    /// Faults whose effect was seen in place (the port refused after a kill, libfaketime mapped
    /// in the process whose clock stepped).
    seen: u32,
    /// The first few that were not: kind, lane, when.
    unseen: Vec<String>,
}

/// Faults in turn until `ends`.
fn run_nemesis(
    n: &BlackBoxNemesis,
    servers: &mut Servers,
    began: Instant,
    ends: Instant,
) -> Result<FaultCount, ProcessError> {
    let mut count = FaultCount::default();
    while Instant::now() + n.every + n.down_for < ends {
        thread::sleep(n.every);
        let kinds = u32::try_from(n.faults.len()).unwrap_or(u32::MAX);
        let fault = n.faults[(count.injected % kinds) as usize];
        let round = count.injected / kinds;
        let start_s = began.elapsed().as_secs_f64();
        let in_place = servers.inject(fault, round, n.clock_step_ms)?;
        count.injected += 1;
        match n.cut {
            CutShape::Flap { every_ms } if is_partition(fault) => {
                servers.flap(fault, round, n.down_for, Duration::from_millis(every_ms))?;
            }
            _ => thread::sleep(n.down_for),
        }
        if servers.heal(fault, round)? && in_place {
            count.seen += 1;
        } else if count.unseen.len() < 3 {
            count.unseen.push(format!(
                "{} on {} at {start_s:.1} s",
                fault.name(),
                servers.name_of(fault, round)
            ));
        }
        count.windows.push(reports::model::FaultWindow {
            start_s,
            end_s: began.elapsed().as_secs_f64(),
            label: fault.name().to_owned(),
            process: Some(servers.name_of(fault, round)),
            kind: Some(fault.name().to_owned()),
        });
    }
    Ok(count)
}

/// One client thread: requests until stopped, each to the next server in turn.
fn client_loop(process: u64, opts: &BlackBoxOptions, urls: &[String], shared: &Shared) {
    let mut clients: Vec<Client> = urls
        .iter()
        .map(|u| Client::new(&opts.target, u, &opts.key))
        .collect();
    let mut history = shared.recorder.client(process);
    let mut results = ClientResults::default();
    while !shared.stop.load(Ordering::Relaxed) && process < shared.active.load(Ordering::Relaxed) {
        // When paced, a request is late from its intended send time (wrk2's correction for
        // coordinated omission); unpaced, from its actual send.
        let intended = match shared.next_slot() {
            Some(due) => {
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                due
            }
            None => Instant::now(),
        };
        let turn = shared.next_server.fetch_add(1, Ordering::Relaxed);
        let server = usize::try_from(turn % urls.len() as u64).unwrap_or(0);
        let invoke_ns = shared.now_ns();
        let sent = Instant::now();
        history.record(OpType::Invoke, "generate", None, None);
        let answer = clients[server].next_ids();
        record_latency(shared, intended, sent, &answer);
        results.spans.push(crate::overlap::Span {
            key: 0,
            server,
            invoke_ns,
            complete_ns: shared.now_ns(),
        });
        match answer {
            Answer::Ids(ids) => {
                // One `ok` per ID, as Jepsen's unique-ids reads them.
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        history.record(OpType::Invoke, "generate", None, None);
                    }
                    history.record(OpType::Ok, "generate", Some(*id), None);
                }
                results.completed.push(Completed {
                    process,
                    server,
                    invoke_ns,
                    complete_ns: shared.now_ns(),
                    ids,
                });
            }
            Answer::Error(class, why) => {
                let op_type = if class.issued_nothing() {
                    OpType::Fail
                } else {
                    OpType::Info
                };
                results.error(class, &why);
                history.record(op_type, "generate", None, Some(why));
                if op_type == OpType::Fail {
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    shared
        .results
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .merge(results);
}

/// Records one request's latency (µs) and, if it gave no ID, its error class.
fn record_latency(shared: &Shared, intended: Instant, sent: Instant, answer: &Answer) {
    let now = Instant::now();
    let us =
        |from: Instant| u64::try_from(now.duration_since(from).as_micros()).unwrap_or(u64::MAX);
    let at_ms = u64::try_from(intended.saturating_duration_since(shared.began).as_millis())
        .unwrap_or(u64::MAX);
    let error = match answer {
        Answer::Ids(_) => None,
        Answer::Error(class, _) => Some(class.key()),
    };
    let ramping = shared.ramping.load(Ordering::Relaxed);
    let mut live = shared.live();
    live.all
        .record(at_ms, us(intended), us(sent), us(intended), error);
    if ramping {
        live.step
            .record(at_ms, us(intended), us(sent), us(intended), error);
    }
}

/// How a request that gave no ID ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// No connection: the request never left.
    Refused,
    /// An error answer.
    Answered,
    /// No answer in time.
    Timeout,
    /// The connection broke after the request left.
    Unknown,
}

impl ErrorClass {
    /// Its name in reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Answered => "error answer",
            Self::Timeout => "timeout",
            Self::Unknown => "unknown outcome",
        }
    }

    /// Its key in the report's error counts.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Answered => "error_answer",
            Self::Timeout => "timeout",
            Self::Unknown => "unknown_outcome",
        }
    }

    /// Whether the request certainly issued no ID (`fail`; otherwise `info`).
    #[must_use]
    pub const fn issued_nothing(self) -> bool {
        matches!(self, Self::Refused | Self::Answered)
    }

    fn count(self, counts: &mut ErrorCounts) {
        match self {
            Self::Refused => counts.refused += 1,
            Self::Answered => counts.answered += 1,
            Self::Timeout => counts.timeout += 1,
            Self::Unknown => counts.unknown += 1,
        }
    }
}

/// One request's result.
enum Answer {
    Ids(Vec<i64>),
    Error(ErrorClass, String),
}

/// One client's connection to one server, made again after an error.
enum Client {
    Http {
        target: Target,
        url: String,
        runtime: Option<tokio::runtime::Runtime>,
        http: Option<reqwest::Client>,
        /// Plain HTTP: one raw keep-alive connection, as `wrk` keeps ([`load::conn`]); the
        /// reqwest client for `https`.
        raw: Option<RawHttp>,
    },
    Redis {
        url: String,
        key: String,
        conn: Option<redis::Connection>,
    },
    Postgres {
        url: String,
        sql: String,
        runtime: Option<tokio::runtime::Runtime>,
        client: Option<tokio_postgres::Client>,
    },
}

impl Client {
    fn new(target: &Target, url: &str, key: &str) -> Self {
        match target {
            Target::Redis => Self::Redis {
                url: url.to_owned(),
                key: key.to_owned(),
                conn: None,
            },
            Target::Postgres => Self::Postgres {
                url: url.to_owned(),
                sql: format!("SELECT nextval('{key}')"),
                runtime: crate::real::runtime().ok(),
                client: None,
            },
            http => Self::Http {
                target: http.clone(),
                url: http.request_url(url, key),
                raw: RawHttp::of(&http.request_url(url, key)),
                runtime: crate::real::runtime().ok(),
                http: reqwest::Client::builder()
                    .timeout(REQUEST_TIMEOUT)
                    .connect_timeout(REQUEST_TIMEOUT)
                    .build()
                    .ok(),
            },
        }
    }

    fn next_ids(&mut self) -> Answer {
        match self {
            Self::Http {
                target,
                runtime: Some(rt),
                raw: Some(raw),
                ..
            } => raw_http_ids(rt, raw, target),
            Self::Http {
                target,
                url,
                runtime: Some(rt),
                http: Some(http),
                ..
            } => http_ids(rt, http, target, url),
            Self::Http { .. } | Self::Postgres { runtime: None, .. } => {
                Answer::Error(ErrorClass::Refused, "no client runtime".into())
            }
            Self::Redis { url, key, conn } => {
                let connected = conn.is_some();
                let outcome = redis_incr(url, key, conn);
                // A failure with no connection before or after it was the connect itself.
                let refused = !connected && conn.is_none();
                classify(outcome, refused)
            }
            Self::Postgres {
                url,
                sql,
                runtime: Some(rt),
                client,
            } => {
                let outcome = postgres_ask(rt, url, client, sql);
                let refused = matches!(&outcome, Outcome::Fail(e) if !e.starts_with("db error"));
                classify(outcome, refused)
            }
        }
    }
}

/// A Redis or PostgreSQL outcome as an answer.
fn classify(outcome: Outcome, refused: bool) -> Answer {
    match outcome {
        Outcome::Ok(id) => Answer::Ids(vec![id]),
        Outcome::Fail(e) if refused => Answer::Error(ErrorClass::Refused, e),
        Outcome::Fail(e) => Answer::Error(ErrorClass::Answered, e),
        Outcome::Info(e) if e.contains("timed out") => Answer::Error(ErrorClass::Timeout, e),
        Outcome::Info(e) => Answer::Error(ErrorClass::Unknown, e),
    }
}

/// A plain-HTTP request's connection: where to, the path and query, the connection.
struct RawHttp {
    target: load::conn::Target,
    path: http::Uri,
    conn: load::conn::Conn,
}

impl RawHttp {
    /// `None` for `https` (or a URL the raw connection cannot carry): reqwest serves it.
    fn of(url: &str) -> Option<Self> {
        let parsed = reqwest::Url::parse(url).ok()?;
        let target = load::conn::Target::of(&parsed)?;
        let path = match parsed.query() {
            Some(q) => format!("{}?{q}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        Some(Self {
            target,
            path: path.parse().ok()?,
            conn: load::conn::Conn::default(),
        })
    }
}

fn raw_http_ids(rt: &tokio::runtime::Runtime, raw: &mut RawHttp, target: &Target) -> Answer {
    use load::conn::Failure;
    let asked = rt.block_on(raw.conn.send(
        &raw.target,
        http::Method::GET,
        &raw.path,
        (None, None),
        REQUEST_TIMEOUT,
    ));
    match asked {
        Ok((status, body)) => match target.parse_answer(status, &String::from_utf8_lossy(&body)) {
            Ok(ids) => Answer::Ids(ids),
            Err(why) => Answer::Error(ErrorClass::Answered, why),
        },
        // No connection, or a request that could not be built: it never left.
        Err(Failure::Connect) => Answer::Error(
            ErrorClass::Refused,
            "connect: no connection (refused or unreachable)".into(),
        ),
        Err(Failure::Client) => Answer::Error(
            ErrorClass::Refused,
            "client: the request could not be built".into(),
        ),
        Err(Failure::Timeout) => Answer::Error(
            ErrorClass::Timeout,
            format!("no answer within {} ms", REQUEST_TIMEOUT.as_millis()),
        ),
        Err(f @ (Failure::Transport | Failure::Body)) => Answer::Error(
            ErrorClass::Unknown,
            format!("{}: the connection broke after the request left", f.class()),
        ),
    }
}

fn http_ids(
    rt: &tokio::runtime::Runtime,
    http: &reqwest::Client,
    target: &Target,
    url: &str,
) -> Answer {
    let asked = rt.block_on(async {
        let response = http.get(url).send().await?;
        let status = response.status().as_u16();
        let body = response.text().await?;
        Ok::<_, reqwest::Error>((status, body))
    });
    match asked {
        Ok((status, body)) => match target.parse_answer(status, &body) {
            Ok(ids) => Answer::Ids(ids),
            Err(why) => Answer::Error(ErrorClass::Answered, why),
        },
        Err(e) if e.is_connect() => Answer::Error(ErrorClass::Refused, error_chain(&e)),
        Err(e) if e.is_timeout() => Answer::Error(ErrorClass::Timeout, error_chain(&e)),
        Err(e) => Answer::Error(ErrorClass::Unknown, error_chain(&e)),
    }
}

/// An error and its causes, `: `-separated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Judges what the clients saw.
fn judge(
    opts: &BlackBoxOptions,
    history: History,
    mut results: ClientResults,
    faults: FaultCount,
    effects: Effects,
) -> BlackBoxRun {
    results.completed.sort_by_key(|c| c.complete_ns);
    let ids: Vec<u64> = results
        .completed
        .iter()
        .flat_map(|c| c.ids.iter().map(|id| u64::from_ne_bytes(id.to_ne_bytes())))
        .collect();
    let space = if opts.key.is_empty() {
        opts.target.kind().to_owned()
    } else {
        format!("{}:{}", opts.target.kind(), opts.key)
    };
    let took_effect = opts
        .nemesis
        .as_ref()
        .map(|n| faults_took_effect(n, &faults, &history));
    let servers: Vec<String> = (1..=opts.urls.len())
        .map(|i| format!("server {i}"))
        .collect();
    let key_word = if opts.key.is_empty() {
        "the key".to_owned()
    } else {
        format!("key `{}`", opts.key)
    };
    let concurrency = crate::overlap::measure(&results.spans, &servers, &key_word);
    BlackBoxRun {
        db_delayed: None,
        overlap: crate::overlap::check(&concurrency),
        concurrency,
        ramp: None,
        clients: opts.clients,
        elapsed: opts.duration,
        ids: ids.len() as u64,
        gaps: verify::id_gaps(&ids),
        unique: verify::ids_unique_in_history(
            &space,
            &history
                .ok_values_indexed("generate")
                .into_iter()
                .map(|(v, index)| (u64::from_ne_bytes(v.to_ne_bytes()), index))
                .collect::<Vec<_>>(),
        ),
        monotonic: ids_monotonic(&results.completed, opts.monotonic),
        took_effect,
        errors: results.errors,
        error_examples: results.examples,
        faults: faults.injected,
        history,
        proxy: effects.proxy,
        lost_writes: effects.lost_writes,
        db_proxy: effects.db_proxy,
        db_lost_writes: effects.db_lost_writes,
        dropped_packets: effects.dropped_packets,
        latency: effects.latency,
        fault_windows: faults.windows,
        slow: None,
    }
}

/// `faults.took_effect`: every fault's effect was seen in place, and faults that should disturb
/// requests (all but clock steps) disturbed some.
fn faults_took_effect(
    n: &BlackBoxNemesis,
    faults: &FaultCount,
    history: &History,
) -> InvariantResult {
    let only_clocks = n.faults.iter().all(|f| *f == BlackBoxFault::Clock);
    let mut result = if only_clocks {
        if faults.injected > 0 {
            InvariantResult::held("faults.took_effect")
        } else {
            crate::real::faults_took_effect(0, n.down_for / 2, history)
        }
    } else {
        crate::real::faults_took_effect(faults.injected, n.down_for / 2, history)
    };
    let mut seen = format!(
        "{} of {} faults seen in place",
        faults.seen, faults.injected
    );
    if !faults.unseen.is_empty() {
        seen = format!("{seen} (not: {})", faults.unseen.join(", "));
    }
    if faults.seen < faults.injected {
        result.verdict = Judgement::Violated;
    }
    result.detail = Some(match result.detail {
        Some(d) => format!("{d}; {seen}"),
        None => seen,
    });
    result
}

/// `ids.monotonic` (see the module docs): `None` when the target promises no order.
#[must_use]
pub fn ids_monotonic(completed: &[Completed], mode: Monotonic) -> Option<InvariantResult> {
    let name = "ids.monotonic";
    let scope = match mode {
        Monotonic::None => return None,
        Monotonic::Server => "at each server",
        Monotonic::Global => "over every server",
    };
    let group = |c: &Completed| {
        if mode == Monotonic::Server {
            c.server
        } else {
            0
        }
    };
    let mut groups: std::collections::BTreeMap<usize, Vec<&Completed>> = Default::default();
    for c in completed {
        groups.entry(group(c)).or_default().push(c);
    }
    let mut regressions = 0_u64;
    let mut first: Option<String> = None;
    for ops in groups.values() {
        for (what, count) in regressions_in(ops) {
            regressions += count;
            first.get_or_insert(what);
        }
    }
    let checked = completed.len();
    let result = match first {
        None => InvariantResult {
            detail: Some(format!(
                "{checked} answers: every ID above every ID answered before it was asked, {scope}"
            )),
            ..InvariantResult::held(name)
        },
        Some(first) => InvariantResult {
            name: name.to_owned(),
            verdict: Judgement::Violated,
            seed: None,
            first_offending_event: Some(first),
            detail: Some(format!(
                "{checked} answers, {regressions} out of order ({scope})"
            )),
        },
    };
    Some(result)
}

/// The regressions among `ops` of one group, by [`sut::check::ids::realtime_regressions`]: an
/// answer whose smallest ID is not above the largest ID of every answer that completed before
/// it was invoked, or whose IDs do not rise.
fn regressions_in(ops: &[&Completed]) -> Vec<(String, u64)> {
    use sut::check::ids::{Answer, Regression, realtime_regressions};
    let answers: Vec<Answer<'_, i64>> = ops
        .iter()
        .map(|c| Answer {
            invoked: c.invoke_ns,
            completed: c.complete_ns,
            ids: &c.ids,
        })
        .collect();
    realtime_regressions(&answers)
        .into_iter()
        .map(|r| match r {
            Regression::NotRising { answer } => format!(
                "IDs {:?} of one answer do not rise (client {})",
                ops[answer].ids, ops[answer].process
            ),
            Regression::NotAbove {
                answer,
                low,
                above,
                top,
            } => {
                let (op, h) = (ops[answer], ops[above]);
                format!(
                    "ID {low} from server {} (asked at {} ms by client {}) is not above ID {top} \
                     (server {}, answered at {} ms, before it was asked)",
                    op.server + 1,
                    op.invoke_ns / 1_000_000,
                    op.process,
                    h.server + 1,
                    h.complete_ns / 1_000_000,
                )
            }
        })
        .map(|what| (what, 1))
        .collect()
}

#[cfg(test)]
mod tests;
