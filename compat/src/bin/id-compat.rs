//! `id-compat`: TEST ONLY. A small ID service that speaks Meituan Leaf's, Didi Tinyid's or Baidu
//! uid-generator's way over one SQLite file or one MySQL/MariaDB database (`--db mysql://…`), so
//! that `scenario ids` can be shown catching real bug classes in a service that is not ours
//! (docs/own-service.md). Several instances may share one file or database, as Leaf and Tinyid
//! servers share one MySQL. On MySQL the SQL is Leaf's own: `UPDATE leaf_alloc SET max_id =
//! max_id + step WHERE biz_tag = ?` then `SELECT max_id, step …`, in one transaction.
//!
//! Each `--planted-*` switch carries the mechanism of a known bug, its window widened so that a
//! short run hits it:
//!
//! - `--planted-race`, Leaf: the `UPDATE … SET max_id = max_id + step` commits on its own and the
//!   `SELECT max_id` runs in a second transaction, as the unmerged Leaf PR #156 rewrote
//!   `updateMaxIdAndGetLeafAlloc`. An instance whose UPDATE is followed by another instance's
//!   before its SELECT reads the other's `max_id`: both take the same segment.
//! - `--planted-race`, Tinyid: the optimistic lock left out (`UPDATE … WHERE biz_type = ?`
//!   without `AND version = ?`): two instances that read the same row take the same segment.
//! - `--planted-reorder`, Tinyid (Tinyid issue #47): the next segment is fetched in the
//!   background when the current one is 80% used; when the current one runs out first, a second
//!   segment is fetched synchronously, and the background one lands afterwards as "next": the
//!   instance hands out ① then ③ then ②, and its IDs go backwards.
//! - `--planted-borrow`, uid (uid-generator issue #85): `CachedUidGenerator` fills its ring with
//!   the IDs of "the next second" whenever it runs low, whatever the clock says, so under load the
//!   time field runs ahead of the wall clock; after a restart (a new worker id, the time field
//!   back at the real second) IDs are lower than those handed out before it.
//! - `--planted-nosync`, any: the database acknowledges before it is durable (SQLite
//!   `synchronous=OFF`, as a MySQL with `innodb_flush_log_at_trx_commit=0`; on MySQL the
//!   session's `innodb_flush_log_at_trx_commit` cannot be set, so the switch is refused there:
//!   start the database so instead): after a power loss the segment table is behind the
//!   segments already handed out.
//!
//! Without them: one `BEGIN IMMEDIATE` transaction for Leaf; the version check, a retry, and a
//! wait for a background fetch in flight for Tinyid; the real second (waiting out a full one)
//! for uid.
//!
//! `--latency-ms N` delays every Leaf and Tinyid answer by N ms outside the instance's lock (a
//! server far from its clients): a few clients then keep few requests in flight, as against a
//! distant production server.
//!
//! Routes: `GET /api/segment/get/{key}` (Leaf; `/api/snowflake/get/{key}` answers 0, Leaf's
//! switched-off mode), `GET /tinyid/id/nextIdSimple` and `/tinyid/id/nextId` (Tinyid), `GET /uid`
//! (uid, the ID as text). Prints `listening on ADDR` when it serves.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use mysql_async::prelude::Queryable;
use rusqlite::{Connection, OptionalExtension};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "id-compat",
    about = "TEST ONLY: Leaf-, Tinyid- or uid-generator-compatible ID service over one SQLite \
             file or one MySQL/MariaDB database"
)]
struct Args {
    /// Which API to speak.
    #[arg(long, value_enum)]
    api: Api,
    /// The SQLite file, or `mysql://USER[:PASSWORD]@HOST:PORT/DATABASE` (the database is
    /// created if missing); shared by every instance.
    #[arg(long)]
    db: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Keys (Leaf biz tags, Tinyid biz types) to create if missing.
    #[arg(long = "tag", default_values_t = ["orders".to_owned()])]
    tags: Vec<String>,
    /// IDs per segment.
    #[arg(long, default_value_t = 100)]
    step: i64,
    /// The token Tinyid's routes ask for.
    #[arg(long, default_value = "0f673adf80504e2eaa552f5d791b644c")]
    token: String,
    /// Leaf, Tinyid: take segments without the database's protection (see the documentation).
    #[arg(long)]
    planted_race: bool,
    /// Tinyid: the background fetch of the next segment races the synchronous one (issue #47).
    #[arg(long)]
    planted_reorder: bool,
    /// uid: borrow future seconds under load (uid-generator issue #85).
    #[arg(long)]
    planted_borrow: bool,
    /// Acknowledge before the database is durable (SQLite `synchronous=OFF`).
    #[arg(long)]
    planted_nosync: bool,
    /// How long a planted race's window is held open, ms.
    #[arg(long, default_value_t = 20)]
    race_window_ms: u64,
    /// Every Leaf or Tinyid answer this much later, ms: half before the ID is taken, half after
    /// (a server far from its clients, or busy elsewhere). Outside the instance's lock: requests in flight at
    /// once are delayed together, so more clients get more answers a second.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// uid: bits of the sequence (IDs per second per worker: 2^bits); uid-generator's default
    /// is 13.
    #[arg(long, default_value_t = 13)]
    seq_bits: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Api {
    Leaf,
    Tinyid,
    Uid,
}

/// The planted bugs and their window.
#[derive(Clone, Copy, Debug)]
struct Plants {
    race: bool,
    reorder: bool,
    borrow: bool,
    window: Duration,
}

/// The IDs `next..end` of a segment that began at `start`.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: i64,
    next: i64,
    end: i64,
}

/// One key's segments in an instance: the current one and, Tinyid, the next (fetched in the
/// background).
#[derive(Debug)]
struct KeySegments {
    current: Segment,
    next: Option<Segment>,
    loading: bool,
}

/// uid-generator's state: the worker id this start got, the time field and the sequence.
#[derive(Debug)]
struct Uid {
    worker: i64,
    second: i64,
    seq: i64,
}

/// One instance.
struct Instance {
    store: Store,
    /// `--db`, for the sessions of background fetches.
    db: String,
    api: Api,
    plants: Plants,
    segments: HashMap<String, KeySegments>,
    uid: Uid,
    seq_bits: u32,
}

struct Inner {
    /// Held only on blocking threads: a database call under it may wait on the runtime's I/O,
    /// which an async worker blocked on the lock would never drive.
    instance: Mutex<Instance>,
    api: Api,
    token: String,
    /// Added to every answer (`--latency-ms`).
    latency: Duration,
}

type Shared = Arc<Inner>;

/// uid-generator's epoch (2016-05-20) in Unix seconds.
const UID_EPOCH_S: i64 = 1_463_702_400;
/// uid-generator's worker-id bits.
const UID_WORKER_BITS: u32 = 22;

fn main() -> ExitCode {
    let args = Args::parse();
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("id-compat: {e}");
            ExitCode::from(1)
        }
    }
}

fn serve(args: Args) -> Result<(), String> {
    if args.step < 1 {
        return Err(format!("--step {}: must be at least 1", args.step));
    }
    if !(1..=20).contains(&args.seq_bits) {
        return Err(format!("--seq-bits {}: must be 1..=20", args.seq_bits));
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let _entered = runtime.enter();
    let mut store = Store::open(&args.db, &args.tags, args.step)?;
    match &store {
        Store::Sqlite(db) if args.planted_nosync => db
            .pragma_update(None, "synchronous", "OFF")
            .map_err(|e| format!("{}: {e}", args.db))?,
        Store::Mysql { .. } if args.planted_nosync => {
            return Err("--planted-nosync on MySQL: start the database with \
                        innodb_flush_log_at_trx_commit=0 (or 2) instead"
                .into());
        }
        _ => {}
    }
    let worker = store
        .execute(
            "INSERT INTO worker_node (started_ms) VALUES (?)",
            &[now_ms().into()],
        )
        .and_then(|_| store.last_insert_id())
        .map_err(|e| format!("{}: worker id: {e}", args.db))?;
    let instance = Instance {
        store,
        db: args.db.clone(),
        api: args.api,
        plants: Plants {
            race: args.planted_race,
            reorder: args.planted_reorder,
            borrow: args.planted_borrow,
            window: Duration::from_millis(args.race_window_ms),
        },
        segments: HashMap::new(),
        uid: Uid {
            worker,
            second: now_ms() / 1_000 - UID_EPOCH_S,
            seq: -1,
        },
        seq_bits: args.seq_bits,
    };
    let shared: Shared = Arc::new(Inner {
        instance: Mutex::new(instance),
        api: args.api,
        token: args.token,
        latency: Duration::from_millis(args.latency_ms),
    });
    let app = Router::new()
        .route("/api/segment/get/{key}", get(leaf_segment))
        .route("/api/snowflake/get/{key}", get(leaf_snowflake))
        .route("/tinyid/id/nextIdSimple", get(tinyid_simple))
        .route("/tinyid/id/nextId", get(tinyid_next))
        .route("/uid", get(uid))
        .with_state(shared);
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        axum::serve(listener, app).await.map_err(|e| e.to_string())
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A value bound to a `?` of a statement.
#[derive(Clone, Debug)]
enum Value {
    Int(i64),
    Text(String),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}

/// How long one MySQL statement (or a connect) may take before the connection is dropped.
const MYSQL_TIMEOUT: Duration = Duration::from_secs(10);

/// The database the segments are kept in: one SQLite file, or a MySQL/MariaDB database. The
/// segment SQL is written once ([`leaf_segment_from`], [`tinyid_segment_from`]) over it.
enum Store {
    Sqlite(Connection),
    Mysql {
        opts: mysql_async::Opts,
        /// The session, made again after any error (a killed, paused or cut-off database).
        conn: Option<mysql_async::Conn>,
        runtime: tokio::runtime::Handle,
    },
}

impl Store {
    /// Opens `db` (a path or a `mysql://` URL) and makes the tables and `tags` if missing.
    fn open(db: &str, tags: &[String], step: i64) -> Result<Self, String> {
        let mut store = Self::connect(db)?;
        store.create(tags, step).map_err(|e| format!("{db}: {e}"))?;
        Ok(store)
    }

    /// A new session on `db` (the background fetch of Tinyid takes its own).
    fn connect(db: &str) -> Result<Self, String> {
        if !db.starts_with("mysql://") {
            return open_sqlite(std::path::Path::new(db)).map(Self::Sqlite);
        }
        let opts = mysql_async::Opts::from_url(db).map_err(|e| format!("--db {db}: {e}"))?;
        // Over TCP, always: by default the driver moves to the server's Unix socket when it
        // is on this machine, which would go around a fault proxy in front of it.
        let opts = mysql_async::OptsBuilder::from_opts(opts)
            .prefer_socket(false)
            .into();
        Ok(Self::Mysql {
            opts,
            conn: None,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    fn is_mysql(&self) -> bool {
        matches!(self, Self::Mysql { .. })
    }

    fn create(&mut self, tags: &[String], step: i64) -> Result<(), String> {
        let (text, ignore, auto) = if self.is_mysql() {
            self.create_database()?;
            (
                "VARCHAR(128)",
                "INSERT IGNORE",
                "BIGINT PRIMARY KEY AUTO_INCREMENT",
            )
        } else {
            (
                "TEXT",
                "INSERT OR IGNORE",
                "INTEGER PRIMARY KEY AUTOINCREMENT",
            )
        };
        self.batch(&format!(
            "CREATE TABLE IF NOT EXISTS leaf_alloc (biz_tag {text} PRIMARY KEY, \
               max_id BIGINT NOT NULL, step BIGINT NOT NULL)"
        ))?;
        self.batch(&format!(
            "CREATE TABLE IF NOT EXISTS tiny_id_info (biz_type {text} PRIMARY KEY, \
               max_id BIGINT NOT NULL, step BIGINT NOT NULL, version BIGINT NOT NULL)"
        ))?;
        self.batch(&format!(
            "CREATE TABLE IF NOT EXISTS worker_node (id {auto}, started_ms BIGINT NOT NULL)"
        ))?;
        for tag in tags {
            self.execute(
                &format!("{ignore} INTO leaf_alloc (biz_tag, max_id, step) VALUES (?, 1, ?)"),
                &[tag.as_str().into(), step.into()],
            )?;
            self.execute(
                &format!(
                    "{ignore} INTO tiny_id_info (biz_type, max_id, step, version) \
                     VALUES (?, 0, ?, 0)"
                ),
                &[tag.as_str().into(), step.into()],
            )?;
        }
        Ok(())
    }

    /// `CREATE DATABASE IF NOT EXISTS` the URL's database, from a session without one.
    fn create_database(&mut self) -> Result<(), String> {
        let Self::Mysql { opts, runtime, .. } = self else {
            return Ok(());
        };
        let Some(name) = opts.db_name().map(str::to_owned) else {
            return Err("name the database in the URL (mysql://USER@HOST:PORT/DATABASE)".into());
        };
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("database `{name}`: letters, digits and `_` only"));
        }
        let bare = mysql_async::OptsBuilder::from_opts(opts.clone()).db_name(None::<String>);
        runtime.block_on(async {
            let mut c = within(mysql_async::Conn::new(bare)).await?;
            within(c.query_drop(format!("CREATE DATABASE IF NOT EXISTS {name}"))).await?;
            let _ = c.disconnect().await;
            Ok(())
        })
    }

    /// Begins a transaction that holds its rows until it ends (SQLite: the write lock at once).
    fn begin(&mut self) -> Result<(), String> {
        if self.is_mysql() {
            self.batch("BEGIN")
        } else {
            self.batch("BEGIN IMMEDIATE")
        }
    }

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        self.execute(sql, &[]).map(|_| ())
    }

    /// Runs `sql`; the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        match self {
            Self::Sqlite(db) => {
                let bound = sqlite_params(params);
                db.execute(sql, rusqlite::params_from_iter(bound.iter()))
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string())
            }
            Self::Mysql { .. } => self
                .on_mysql(sql, params, Wanted::Affected)
                .map(|row| row.map_or(0, |r| r[0].unsigned_abs())),
        }
    }

    /// The first row of `sql`, its columns as integers; `None` when there is none.
    fn row(&mut self, sql: &str, params: &[Value]) -> Result<Option<Vec<i64>>, String> {
        match self {
            Self::Sqlite(db) => {
                let bound = sqlite_params(params);
                db.query_row(sql, rusqlite::params_from_iter(bound.iter()), |r| {
                    (0..r.as_ref().column_count())
                        .map(|i| r.get::<_, i64>(i))
                        .collect::<rusqlite::Result<Vec<i64>>>()
                })
                .optional()
                .map_err(|e| e.to_string())
            }
            Self::Mysql { .. } => self.on_mysql(sql, params, Wanted::Row),
        }
    }

    /// The id the last `INSERT` gave its row.
    fn last_insert_id(&mut self) -> Result<i64, String> {
        match self {
            Self::Sqlite(db) => Ok(db.last_insert_rowid()),
            Self::Mysql { .. } => self
                .row("SELECT LAST_INSERT_ID()", &[])?
                .and_then(|r| r.first().copied())
                .ok_or_else(|| "no LAST_INSERT_ID()".to_owned()),
        }
    }

    /// Runs `sql` on the MySQL session (connected first if there is none), each step within
    /// [`MYSQL_TIMEOUT`]; the session is dropped on any error, so the next call connects anew.
    /// The first row's columns as integers, or the rows changed (as a one-column row).
    fn on_mysql(
        &mut self,
        sql: &str,
        params: &[Value],
        wanted: Wanted,
    ) -> Result<Option<Vec<i64>>, String> {
        let Self::Mysql {
            opts,
            conn,
            runtime,
        } = self
        else {
            unreachable!("on_mysql is called on a MySQL store");
        };
        let bound: Vec<mysql_async::Value> = params
            .iter()
            .map(|v| match v {
                Value::Int(i) => mysql_async::Value::Int(*i),
                Value::Text(t) => mysql_async::Value::Bytes(t.as_bytes().to_vec()),
            })
            .collect();
        runtime.block_on(async {
            let mut c = match conn.take() {
                Some(c) => c,
                None => within(mysql_async::Conn::new(opts.clone())).await?,
            };
            // Statements without parameters (BEGIN, COMMIT, DDL) go as text: not every one of
            // them may be prepared.
            let done = match wanted {
                Wanted::Affected if bound.is_empty() => {
                    within(c.query_drop(sql)).await?;
                    Some(vec![i64::try_from(c.affected_rows()).unwrap_or(i64::MAX)])
                }
                Wanted::Affected => {
                    within(c.exec_drop(sql, bound)).await?;
                    Some(vec![i64::try_from(c.affected_rows()).unwrap_or(i64::MAX)])
                }
                Wanted::Row => {
                    let row: Option<mysql_async::Row> = if bound.is_empty() {
                        within(c.query_first(sql)).await?
                    } else {
                        within(c.exec_first(sql, bound)).await?
                    };
                    row.map(|r| {
                        (0..r.len())
                            .map(|i| r.get::<i64, usize>(i).unwrap_or(i64::MIN))
                            .collect()
                    })
                }
            };
            *conn = Some(c);
            Ok(done)
        })
    }
}

/// What a MySQL statement is run for.
#[derive(Clone, Copy, Debug)]
enum Wanted {
    Affected,
    Row,
}

/// `future` within [`MYSQL_TIMEOUT`], its error as text.
async fn within<T>(
    future: impl std::future::Future<Output = mysql_async::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(MYSQL_TIMEOUT, future).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "no answer from MySQL in {} s",
            MYSQL_TIMEOUT.as_secs()
        )),
    }
}

fn sqlite_params(params: &[Value]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|v| match v {
            Value::Int(i) => rusqlite::types::Value::Integer(*i),
            Value::Text(t) => rusqlite::types::Value::Text(t.clone()),
        })
        .collect()
}

fn open_sqlite(path: &std::path::Path) -> Result<Connection, String> {
    let failed = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let db = Connection::open(path).map_err(failed)?;
    db.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
    // WAL, as most SQLite services run: its index (`-shm`) is a shared mapping, which the
    // lost-writes filesystem must allow (`scenario ids --nemesis power_loss` puts `{data}` on it).
    // Every commit is synced.
    db.pragma_update(None, "journal_mode", "WAL")
        .map_err(failed)?;
    db.pragma_update(None, "synchronous", "FULL")
        .map_err(failed)?;
    Ok(db)
}

/// Leaf's `updateMaxIdAndGetLeafAlloc`: the segment is `max_id - step .. max_id`.
fn leaf_segment_from(
    store: &mut Store,
    key: &str,
    plants: Plants,
) -> Result<Option<Segment>, String> {
    let update = "UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?";
    let select = "SELECT max_id, step FROM leaf_alloc WHERE biz_tag = ?";
    let read = |store: &mut Store| {
        Ok(store.row(select, &[key.into()])?.map(|r| Segment {
            start: r[0] - r[1],
            next: r[0] - r[1],
            end: r[0],
        }))
    };
    if plants.race {
        // The UPDATE commits on its own; the SELECT reads whatever max_id is by then.
        store.execute(update, &[key.into()])?;
        std::thread::sleep(plants.window);
        return read(store);
    }
    store.begin()?;
    let taken = store
        .execute(update, &[key.into()])
        .and_then(|_| read(store));
    match taken {
        Ok(segment) => store.batch("COMMIT").map(|()| segment),
        Err(e) => {
            // A broken session rolls back on its own.
            let _ = store.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Tinyid's `getNextSegmentId`: read the row, write `max_id + step` if the version is still
/// the one read (retried); the segment is `max_id + 1 ..= max_id + step`.
fn tinyid_segment_from(
    store: &mut Store,
    key: &str,
    plants: Plants,
) -> Result<Option<Segment>, String> {
    const ATTEMPTS: u32 = 10;
    let failed = |e: String| format!("segment for `{key}`: {e}");
    for _ in 0..ATTEMPTS {
        let row = store
            .row(
                "SELECT max_id, step, version FROM tiny_id_info WHERE biz_type = ?",
                &[key.into()],
            )
            .map_err(failed)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let [max_id, step, version] =
            <[i64; 3]>::try_from(row.as_slice()).map_err(|_| failed("not three columns".into()))?;
        let updated = if plants.race {
            std::thread::sleep(plants.window);
            store.execute(
                "UPDATE tiny_id_info SET max_id = ?, version = version + 1 WHERE biz_type = ?",
                &[(max_id + step).into(), key.into()],
            )
        } else {
            store.execute(
                "UPDATE tiny_id_info SET max_id = ?, version = version + 1 \
                 WHERE biz_type = ? AND max_id = ? AND version = ?",
                &[
                    (max_id + step).into(),
                    key.into(),
                    max_id.into(),
                    version.into(),
                ],
            )
        }
        .map_err(failed)?;
        if updated == 1 {
            return Ok(Some(Segment {
                start: max_id + 1,
                next: max_id + 1,
                end: max_id + step + 1,
            }));
        }
    }
    Err(format!(
        "segment for `{key}`: {ATTEMPTS} version conflicts in a row"
    ))
}

fn lock(shared: &Shared) -> MutexGuard<'_, Instance> {
    shared
        .instance
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Instance {
    fn take_segment(&mut self, key: &str) -> Result<Segment, String> {
        let taken = match self.api {
            Api::Leaf => leaf_segment_from(&mut self.store, key, self.plants)
                .map_err(|e| format!("segment for `{key}`: {e}"))?,
            Api::Tinyid | Api::Uid => tinyid_segment_from(&mut self.store, key, self.plants)?,
        };
        taken.ok_or_else(|| format!("unknown key `{key}`"))
    }

    /// uid-generator's next ID: `time | worker | sequence`.
    fn next_uid(&mut self) -> Result<i64, String> {
        let seq_max = (1_i64 << self.seq_bits) - 1;
        let real = now_ms() / 1_000 - UID_EPOCH_S;
        let u = &mut self.uid;
        if self.plants.borrow {
            // CachedUidGenerator: a full second's IDs taken, the next second's come, clock or not.
            if u.seq >= seq_max {
                u.second += 1;
                u.seq = -1;
            }
        } else {
            // DefaultUidGenerator: the real second; a full one is waited out.
            if real < u.second {
                return Err(format!("clock moved backwards by {} s", u.second - real));
            }
            if real > u.second {
                u.second = real;
                u.seq = -1;
            } else if u.seq >= seq_max {
                std::thread::sleep(Duration::from_millis(5));
                return self.next_uid();
            }
        }
        u.seq += 1;
        let shift = UID_WORKER_BITS + self.seq_bits;
        Ok((u.second << shift) | (u.worker << self.seq_bits) | u.seq)
    }
}

/// The next `count` IDs for `key` from this instance's segments, taking new ones as needed
/// (Tinyid: the next one fetched in the background once 80% of the current one is used).
fn next_ids(shared: &Shared, key: &str, count: usize) -> Result<Vec<i64>, String> {
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let mut instance = lock(shared);
        let api = instance.api;
        let Some(segments) = instance.segments.get_mut(key) else {
            let current = instance.take_segment(key)?;
            instance.segments.insert(
                key.to_owned(),
                KeySegments {
                    current,
                    next: None,
                    loading: false,
                },
            );
            continue;
        };
        let s = &mut segments.current;
        if s.next < s.end {
            ids.push(s.next);
            s.next += 1;
            let used_most = (s.next - s.start) * 5 >= (s.end - s.start) * 4;
            if api == Api::Tinyid && used_most && segments.next.is_none() && !segments.loading {
                segments.loading = true;
                load_next_in_background(shared, key);
            }
            continue;
        }
        if let Some(next) = segments.next.take() {
            segments.current = next;
            continue;
        }
        if segments.loading && !instance.plants.reorder {
            // The next segment is on its way: wait for it rather than take another.
            drop(instance);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        // Tinyid issue #47: `loadCurrent` takes a segment of its own while `loadNext` is still
        // in flight (or there is no background fetch: Leaf, or nothing started yet).
        let current = instance.take_segment(key)?;
        if let Some(segments) = instance.segments.get_mut(key) {
            segments.current = current;
        }
    }
    Ok(ids)
}

/// Tinyid's `loadNext`: fetches a segment on its own connection, then (after the planted
/// window) makes it the key's next one.
fn load_next_in_background(shared: &Shared, key: &str) {
    let (shared, key) = (Arc::clone(shared), key.to_owned());
    tokio::task::spawn_blocking(move || {
        let (db, plants) = {
            let instance = lock(&shared);
            (instance.db.clone(), instance.plants)
        };
        let fetched =
            Store::connect(&db).and_then(|mut store| tinyid_segment_from(&mut store, &key, plants));
        if plants.reorder {
            std::thread::sleep(plants.window);
        }
        let mut instance = lock(&shared);
        if let Some(segments) = instance.segments.get_mut(&key) {
            segments.loading = false;
            if let Ok(Some(next)) = fetched {
                segments.next = Some(next);
            }
        }
    });
}

async fn ids(shared: Shared, key: String, count: usize) -> Result<Vec<i64>, String> {
    let half = shared.latency / 2;
    if !half.is_zero() {
        tokio::time::sleep(half).await;
    }
    let taken = tokio::task::spawn_blocking(move || next_ids(&shared, &key, count))
        .await
        .map_err(|e| e.to_string())?;
    if !half.is_zero() {
        tokio::time::sleep(half).await;
    }
    taken
}

fn api_of(shared: &Shared) -> Api {
    shared.api
}

/// Leaf: the ID as text; an error is HTTP 500.
async fn leaf_segment(
    State(shared): State<Shared>,
    Path(key): Path<String>,
) -> (StatusCode, String) {
    if api_of(&shared) != Api::Leaf {
        return (StatusCode::NOT_FOUND, String::new());
    }
    match ids(shared, key, 1).await {
        Ok(ids) => (StatusCode::OK, ids[0].to_string()),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"status": 500, "error": e}).to_string(),
        ),
    }
}

/// Leaf with its Snowflake mode switched off answers 0.
async fn leaf_snowflake(Path(_key): Path<String>) -> (StatusCode, String) {
    (StatusCode::OK, "0".to_owned())
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TinyidQuery {
    biz_type: Option<String>,
    token: Option<String>,
    batch_size: Option<usize>,
}

/// Tinyid's IDs, or the error (every error is HTTP 200 in Tinyid).
async fn tinyid_ids(shared: Shared, q: TinyidQuery) -> Result<Vec<i64>, String> {
    if api_of(&shared) != Api::Tinyid {
        return Err("not a Tinyid instance".into());
    }
    if q.token.as_deref() != Some(shared.token.as_str()) {
        return Err("token is error".into());
    }
    let key = q.biz_type.ok_or("bizType is missing")?;
    let count = q.batch_size.unwrap_or(1).clamp(1, 100_000);
    ids(shared, key, count).await
}

/// `nextIdSimple`: `3` or `4,5,6`, an empty body on error.
async fn tinyid_simple(State(shared): State<Shared>, Query(q): Query<TinyidQuery>) -> String {
    tinyid_ids(shared, q)
        .await
        .map(|ids| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// `nextId`: `{"data":[…],"code":200,"message":""}`, code 6 with the message on error.
async fn tinyid_next(State(shared): State<Shared>, Query(q): Query<TinyidQuery>) -> String {
    match tinyid_ids(shared, q).await {
        Ok(ids) => serde_json::json!({"data": ids, "code": 200, "message": ""}),
        Err(e) => serde_json::json!({"data": null, "code": 6, "message": e}),
    }
    .to_string()
}

/// uid: the ID as text; an error is HTTP 500.
async fn uid(State(shared): State<Shared>) -> (StatusCode, String) {
    if api_of(&shared) != Api::Uid {
        return (StatusCode::NOT_FOUND, String::new());
    }
    let next = tokio::task::spawn_blocking(move || lock(&shared).next_uid()).await;
    match next {
        Ok(Ok(id)) => (StatusCode::OK, id.to_string()),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
