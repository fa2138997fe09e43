//! Real systems nobody here wrote, as ID sources under faults: Redis `INCR` with its
//! persistence set as asked, killed with SIGKILL and restarted on the same files while clients
//! keep asking for IDs. Every request is recorded ([`crate::history`]): `ok` with the ID, `fail`
//! when it certainly did not run (no connection, or Redis refused it), `info` when the outcome is
//! unknown (the connection broke after the request left). `ids.unique` then judges the `ok` IDs:
//! an ID handed out twice is a duplicate a user of that ID source would have stored twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cluster::{Redis, RedisPersistence};
use reports::model::InvariantResult;

use crate::history::{History, OpType, Recorder};
use crate::verify;

/// A Redis `INCR` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncrOptions {
    /// How Redis persists.
    pub persistence: RedisPersistence,
    /// Client threads, one request at a time each.
    pub clients: u64,
    /// How long the clients run.
    pub duration: Duration,
    /// Time between the end of one crash and the next kill.
    pub kill_every: Duration,
    /// How long Redis stays down after a kill.
    pub down_for: Duration,
}

/// What a run did and found.
#[derive(Debug)]
pub struct IncrRun {
    /// Every request and its outcome.
    pub history: History,
    /// Kills (each followed by a restart).
    pub kills: u32,
    /// `ids.unique` over the `ok` IDs.
    pub unique: InvariantResult,
}

/// The key every client increments.
const KEY: &str = "bench:ids";
/// A request's longest wait for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the clients against a fresh Redis and kills it every `kill_every` (see the module docs).
///
/// # Errors
/// Redis could not be started or restarted.
pub fn redis_incr_under_kills(opts: &IncrOptions) -> Result<IncrRun, cluster::ClusterError> {
    let mut redis = Redis::start(opts.persistence)?;
    let url = redis.url();
    let recorder = Arc::new(Recorder::new());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..opts.clients)
        .map(|process| {
            let (recorder, stop, url) = (Arc::clone(&recorder), Arc::clone(&stop), url.clone());
            thread::spawn(move || client(process, &url, &recorder, &stop))
        })
        .collect();
    let ends = Instant::now() + opts.duration;
    let mut kills = 0;
    let mut result = Ok(());
    while Instant::now() + opts.kill_every < ends {
        thread::sleep(opts.kill_every);
        if let Err(e) = redis.kill9() {
            result = Err(e);
            break;
        }
        kills += 1;
        thread::sleep(opts.down_for);
        if let Err(e) = redis.restart() {
            result = Err(e);
            break;
        }
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
    let ids: Vec<u64> = history
        .ok_values("generate")
        .into_iter()
        .map(|v| u64::try_from(v).unwrap_or(0))
        .collect();
    let unique = verify::ids_unique("redis-incr", &ids);
    Ok(IncrRun {
        history,
        kills,
        unique,
    })
}

/// One client: `INCR` after `INCR`, reconnecting after any error, each recorded.
fn client(process: u64, url: &str, recorder: &Recorder, stop: &AtomicBool) {
    let mut conn: Option<redis::Connection> = None;
    while !stop.load(Ordering::Relaxed) {
        recorder.record(process, OpType::Invoke, "generate", None, None);
        let c = match conn.take() {
            Some(c) => Ok(c),
            None => connect(url),
        };
        let mut c = match c {
            Ok(c) => c,
            Err(e) => {
                // The request never left: it certainly did not run.
                recorder.record(process, OpType::Fail, "generate", None, Some(e.to_string()));
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        match redis::cmd("INCR").arg(KEY).query::<i64>(&mut c) {
            Ok(id) => {
                recorder.record(process, OpType::Ok, "generate", Some(id), None);
                conn = Some(c);
            }
            Err(e) if !e.is_io_error() && !e.is_timeout() => {
                // Redis answered with an error (LOADING while it reads its files back, …):
                // it did not run it.
                recorder.record(process, OpType::Fail, "generate", None, Some(e.to_string()));
                conn = Some(c);
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                // Sent, then the connection broke: it may or may not have run.
                recorder.record(process, OpType::Info, "generate", None, Some(e.to_string()));
            }
        }
    }
}

fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let c = client.get_connection_with_timeout(REQUEST_TIMEOUT)?;
    c.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    c.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    Ok(c)
}
