//! `id-compat`: TEST ONLY. A small ID service that speaks Meituan Leaf's or Didi Tinyid's HTTP
//! API over a segment table in one SQLite file, so that `scenario ids --target leaf|tinyid` can be
//! shown catching a real bug class in a service that is not ours (docs/own-service.md). Several
//! instances may share one file, as Leaf and Tinyid servers share one MySQL.
//!
//! With `--planted-race` each API carries the mechanism of a known upstream bug, with its window
//! widened so that a short run hits it:
//!
//! - Leaf (the mechanism of Leaf PR #156): the `UPDATE … SET max_id = max_id + step` commits on
//!   its own, then the `SELECT max_id` runs in a second transaction. An instance whose UPDATE is
//!   followed by another instance's before its SELECT reads the other's `max_id`: both take the
//!   same segment and hand out the same IDs.
//! - Tinyid: the optimistic lock left out (`UPDATE … SET max_id = ? WHERE biz_type = ?` without
//!   `AND version = ?`): two instances that read the same row both write `max_id + step` and take
//!   the same segment.
//!
//! Without it, both take segments correctly (one `BEGIN IMMEDIATE` transaction for Leaf; the
//! version check and a retry for Tinyid).
//!
//! With `--planted-nosync` the database acknowledges commits before they are durable (SQLite
//! `synchronous=OFF`, as a MySQL with `innodb_flush_log_at_trx_commit=0`): after a power loss
//! the segment table is behind the segments already handed out, and they are handed out again.
//!
//! Prints `listening on ADDR` when it serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use rusqlite::{Connection, OptionalExtension, params};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "id-compat",
    about = "TEST ONLY: a Leaf- or Tinyid-compatible segment ID service over one SQLite file"
)]
struct Args {
    /// Which API to speak.
    #[arg(long, value_enum)]
    api: Api,
    /// The SQLite file (shared by every instance).
    #[arg(long)]
    db: PathBuf,
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
    /// Plant the upstream race (see the program's documentation).
    #[arg(long)]
    planted_race: bool,
    /// Acknowledge before the database is durable (SQLite `synchronous=OFF`, as a MySQL with
    /// `innodb_flush_log_at_trx_commit=0`): a power loss forgets segments already handed out.
    #[arg(long)]
    planted_nosync: bool,
    /// How long the planted race's window is held open, ms.
    #[arg(long, default_value_t = 20)]
    race_window_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Api {
    Leaf,
    Tinyid,
}

/// One instance: its connection and the segments it holds, per key.
struct Instance {
    db: Connection,
    segments: std::collections::HashMap<String, Segment>,
    api: Api,
    planted_race: bool,
    race_window: Duration,
}

/// The IDs `next..end` this instance may hand out.
#[derive(Clone, Copy, Debug)]
struct Segment {
    next: i64,
    end: i64,
}

type Shared = Arc<(Mutex<Instance>, String)>;

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
    let db = open(&args.db, args.api, &args.tags, args.step)?;
    if args.planted_nosync {
        db.pragma_update(None, "synchronous", "OFF")
            .map_err(|e| format!("{}: {e}", args.db.display()))?;
    }
    let instance = Instance {
        db,
        segments: std::collections::HashMap::new(),
        api: args.api,
        planted_race: args.planted_race,
        race_window: Duration::from_millis(args.race_window_ms),
    };
    let shared: Shared = Arc::new((Mutex::new(instance), args.token));
    let app = Router::new()
        .route("/api/segment/get/{key}", get(leaf_segment))
        .route("/api/snowflake/get/{key}", get(leaf_snowflake))
        .route("/tinyid/id/nextIdSimple", get(tinyid_simple))
        .route("/tinyid/id/nextId", get(tinyid_next))
        .with_state(shared);
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        axum::serve(listener, app).await.map_err(|e| e.to_string())
    })
}

fn open(
    path: &std::path::Path,
    api: Api,
    tags: &[String],
    step: i64,
) -> Result<Connection, String> {
    let failed = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let db = Connection::open(path).map_err(failed)?;
    db.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
    // A rollback journal, not WAL: WAL's shared memory needs mmap, which a lost-writes
    // filesystem (direct I/O) does not offer. Every commit is synced.
    db.pragma_update(None, "journal_mode", "DELETE")
        .map_err(failed)?;
    db.pragma_update(None, "synchronous", "FULL")
        .map_err(failed)?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS leaf_alloc (biz_tag TEXT PRIMARY KEY, max_id INTEGER NOT NULL, \
           step INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS tiny_id_info (biz_type TEXT PRIMARY KEY, \
           max_id INTEGER NOT NULL, step INTEGER NOT NULL, version INTEGER NOT NULL);",
    )
    .map_err(failed)?;
    for tag in tags {
        let sql = match api {
            Api::Leaf => {
                "INSERT OR IGNORE INTO leaf_alloc (biz_tag, max_id, step) VALUES (?1, 1, ?2)"
            }
            Api::Tinyid => {
                "INSERT OR IGNORE INTO tiny_id_info (biz_type, max_id, step, version) \
                 VALUES (?1, 0, ?2, 0)"
            }
        };
        db.execute(sql, params![tag, step]).map_err(failed)?;
    }
    Ok(db)
}

impl Instance {
    /// The next `count` IDs for `key`, taking new segments as needed.
    fn next_ids(&mut self, key: &str, count: usize) -> Result<Vec<i64>, String> {
        let mut ids = Vec::with_capacity(count);
        while ids.len() < count {
            let segment = match self.segments.get(key) {
                Some(s) if s.next < s.end => *s,
                _ => self.take_segment(key)?,
            };
            ids.push(segment.next);
            self.segments.insert(
                key.to_owned(),
                Segment {
                    next: segment.next + 1,
                    end: segment.end,
                },
            );
        }
        Ok(ids)
    }

    fn take_segment(&self, key: &str) -> Result<Segment, String> {
        let failed = |e: rusqlite::Error| format!("segment for `{key}`: {e}");
        let taken = match self.api {
            Api::Leaf => self.leaf_segment(key).map_err(failed)?,
            Api::Tinyid => self.tinyid_segment(key)?,
        };
        taken.ok_or_else(|| format!("unknown key `{key}`"))
    }

    /// Leaf's `updateMaxIdAndGetLeafAlloc`: the segment is `max_id - step .. max_id`.
    fn leaf_segment(&self, key: &str) -> rusqlite::Result<Option<Segment>> {
        let update = "UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?1";
        let select = "SELECT max_id, step FROM leaf_alloc WHERE biz_tag = ?1";
        let read = |db: &Connection| {
            db.query_row(select, params![key], |r| {
                Ok(Segment {
                    next: r.get::<_, i64>(0)? - r.get::<_, i64>(1)?,
                    end: r.get(0)?,
                })
            })
            .optional()
        };
        if self.planted_race {
            // The UPDATE commits on its own; the SELECT reads whatever max_id is by then.
            self.db.execute(update, params![key])?;
            std::thread::sleep(self.race_window);
            return read(&self.db);
        }
        self.db.execute_batch("BEGIN IMMEDIATE")?;
        let taken = self
            .db
            .execute(update, params![key])
            .and_then(|_| read(&self.db));
        let end = if taken.is_ok() { "COMMIT" } else { "ROLLBACK" };
        self.db.execute_batch(end)?;
        taken
    }

    /// Tinyid's `getNextSegmentId`: read the row, write `max_id + step` if the version is still
    /// the one read (retried), the segment is `max_id + 1 ..= max_id + step`.
    fn tinyid_segment(&self, key: &str) -> Result<Option<Segment>, String> {
        let failed = |e: rusqlite::Error| format!("segment for `{key}`: {e}");
        const ATTEMPTS: u32 = 10;
        for _ in 0..ATTEMPTS {
            let row: Option<(i64, i64, i64)> = self
                .db
                .query_row(
                    "SELECT max_id, step, version FROM tiny_id_info WHERE biz_type = ?1",
                    params![key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(failed)?;
            let Some((max_id, step, version)) = row else {
                return Ok(None);
            };
            let updated = if self.planted_race {
                std::thread::sleep(self.race_window);
                self.db.execute(
                    "UPDATE tiny_id_info SET max_id = ?1, version = version + 1 WHERE biz_type = ?2",
                    params![max_id + step, key],
                )
            } else {
                self.db.execute(
                    "UPDATE tiny_id_info SET max_id = ?1, version = version + 1 \
                     WHERE biz_type = ?2 AND max_id = ?3 AND version = ?4",
                    params![max_id + step, key, max_id, version],
                )
            }
            .map_err(failed)?;
            if updated == 1 {
                return Ok(Some(Segment {
                    next: max_id + 1,
                    end: max_id + step + 1,
                }));
            }
        }
        Err(format!(
            "segment for `{key}`: {ATTEMPTS} version conflicts in a row"
        ))
    }
}

async fn ids(shared: Shared, key: String, count: usize) -> Result<Vec<i64>, String> {
    tokio::task::spawn_blocking(move || {
        let mut instance = shared
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        instance.next_ids(&key, count)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Leaf: the ID as text; an error is HTTP 500.
async fn leaf_segment(
    State(shared): State<Shared>,
    Path(key): Path<String>,
) -> (StatusCode, String) {
    if shared.0.lock().map(|i| i.api != Api::Leaf).unwrap_or(true) {
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
    if shared
        .0
        .lock()
        .map(|i| i.api != Api::Tinyid)
        .unwrap_or(true)
    {
        return Err("not a Tinyid instance".into());
    }
    if q.token.as_deref() != Some(shared.1.as_str()) {
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

/// `nextId`: `{"data":[…],"code":200,"message":""}`, code 500 on error.
async fn tinyid_next(State(shared): State<Shared>, Query(q): Query<TinyidQuery>) -> String {
    match tinyid_ids(shared, q).await {
        Ok(ids) => serde_json::json!({"data": ids, "code": 200, "message": ""}),
        Err(e) => serde_json::json!({"data": null, "code": 500, "message": e}),
    }
    .to_string()
}
