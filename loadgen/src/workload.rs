//! The goose workloads (one scenario, one transaction per workload; each transaction is one
//! *operation* of the schedule) and their setup through the server's admin routes.
//!
//! An operation may be several requests (issue then verify a token; issue then consume a
//! one-time token). The schedule (see [`crate::stats::Schedule`]) paces operations; the
//! follow-up request of an operation is charged the same lag behind the schedule as the first
//! one, so its corrected latency is its own time plus that lag.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use goose::prelude::*;
use serde_json::{Value, json};

use crate::stats::{EndpointRecorder, Schedule};

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

/// The kind of the `slot`-th operation (global slot number) of a workload; `None` for an
/// unknown workload name.
#[must_use]
pub fn kind_of(workload: &str, slot: u64) -> Option<Kind> {
    Some(match workload {
        "id" => {
            if slot % 5 == 4 {
                Kind::Batch
            } else {
                Kind::Id
            }
        }
        "id-single" => Kind::Id,
        "snowflake" => Kind::Snowflake,
        "tokens" => Kind::Tokens,
        "once" => Kind::Once,
        "lottery" => Kind::Lottery,
        "crash" => match slot % 10 {
            0..=4 => Kind::Id,
            5 => Kind::Batch,
            6 | 7 => Kind::Snowflake,
            _ => Kind::Lottery,
        },
        "mixed" => match slot % 10 {
            0..=3 => Kind::Id,
            4 => Kind::Batch,
            5 | 6 => Kind::Snowflake,
            7 => Kind::Tokens,
            8 => Kind::Once,
            _ => Kind::Lottery,
        },
        _ => return None,
    })
}

/// Which setups a workload needs.
#[must_use]
pub fn needs(workload: &str) -> (bool, bool) {
    let ids = matches!(workload, "id" | "id-single" | "mixed" | "crash");
    let lottery = matches!(workload, "lottery" | "mixed" | "crash");
    (ids, lottery)
}

/// Accounts opened for a lottery run; draw `n` uses user `user_base + n % LOTTERY_USERS` and
/// activity `activity_base + n / LOTTERY_USERS`, so no pair is drawn twice.
pub const LOTTERY_USERS: u64 = 10_000;
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
    pub workload: String,
    pub users: u64,
    pub schedule: Option<Schedule>,
    /// Slot 0 of the schedule.
    pub t0: Instant,
    /// Warm-up ends: latency counts from here.
    pub measure_start: Instant,
    /// No operation is started after this.
    pub end: Instant,
    pub tag: String,
    pub lottery: Option<LotteryPlan>,
    /// Per-user operation counter.
    pub iters: Vec<AtomicU64>,
    pub recorders: Mutex<BTreeMap<&'static str, EndpointRecorder>>,
    pub segment_ids: Mutex<Vec<u64>>,
    pub snowflake_ids: Mutex<Vec<u64>>,
    pub once_accepted: Mutex<BTreeMap<String, u32>>,
    /// Unique number per token/once/draw operation.
    pub seq: AtomicU64,
    /// Base for token users (distinct per run).
    pub user_base: u64,
    /// Draws answered 200 (confirmed) to a client.
    pub draws_confirmed: AtomicU64,
}

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
}

/// One timed request. Returns the status and decoded JSON body, or `None` on a transport
/// error. `lag`: how far behind its intended send time this operation started.
async fn call(
    user: &mut GooseUser,
    sh: &Shared,
    name: &'static str,
    path: &str,
    body: Body<'_>,
    lag: Duration,
    ok_statuses: &[u16],
) -> Option<(u16, Value)> {
    let start = Instant::now();
    let res = match body {
        Body::Get => user.get(path).await,
        Body::Post(v) => user.post_json(path, v).await,
    };
    let (result, class) = match res {
        Err(_) => (None, Some("client")),
        Ok(gr) => match gr.response {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.bytes().await {
                    Ok(bytes) => {
                        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let class = if ok_statuses.contains(&status) {
                            None
                        } else {
                            status_class(status).or(Some("http_unexpected"))
                        };
                        (Some((status, v)), class)
                    }
                    Err(e) if e.is_timeout() => (None, Some("timeout")),
                    Err(_) => (None, Some("body")),
                }
            }
            Err(e) if e.is_timeout() => (None, Some("timeout")),
            Err(e) if e.is_connect() => (None, Some("connect")),
            Err(_) => (None, Some("transport")),
        },
    };
    let done = Instant::now();
    let intended = start.checked_sub(lag).unwrap_or(start);
    if intended >= sh.measure_start && intended < sh.end {
        let at_ms = intended.duration_since(sh.measure_start).as_millis() as u64;
        let corrected = done.duration_since(intended).as_micros() as u64;
        let uncorrected = done.duration_since(start).as_micros() as u64;
        lock(&sh.recorders)
            .entry(name)
            .or_default()
            .record(at_ms, corrected, uncorrected, class);
    }
    if class == Some("connect") {
        // the server is down (killed, restarting): do not spin on refused connections
        tokio::time::sleep(Duration::from_millis(CONNECT_BACKOFF_MS)).await;
    }
    result
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
}

async fn operation(user: &mut GooseUser, sh: &Shared, kind: Kind, lag: Duration) {
    match kind {
        Kind::Id => {
            let path = format!("/id/{}", sh.tag);
            if let Some((200, v)) = call(user, sh, names::ID, &path, Body::Get, lag, &[200]).await
                && let Some(id) = v.get("id").and_then(Value::as_u64)
            {
                lock(&sh.segment_ids).push(id);
            }
        }
        Kind::Batch => {
            let path = format!("/id/{}/batch?n=10", sh.tag);
            if let Some((200, v)) =
                call(user, sh, names::BATCH, &path, Body::Get, lag, &[200]).await
                && let Some(ids) = v.get("ids").and_then(Value::as_array)
            {
                let mut all = lock(&sh.segment_ids);
                all.extend(ids.iter().filter_map(Value::as_u64));
            }
        }
        Kind::Snowflake => {
            if let Some((200, v)) = call(
                user,
                sh,
                names::SNOWFLAKE,
                "/snowflake",
                Body::Get,
                lag,
                &[200],
            )
            .await
                && let Some(id) = v.get("id").and_then(Value::as_u64)
            {
                lock(&sh.snowflake_ids).push(id);
            }
        }
        Kind::Tokens => {
            let n = sh.seq.fetch_add(1, Ordering::Relaxed);
            let body = json!({"user": sh.user_base + n});
            let issued = call(
                user,
                sh,
                names::TOKEN_ISSUE,
                "/tokens",
                Body::Post(&body),
                lag,
                &[200, 201],
            )
            .await;
            if let Some((_, v)) = issued
                && let Some(tok) = v.get("token").and_then(Value::as_str)
            {
                let body = json!({"token": tok});
                let _ = call(
                    user,
                    sh,
                    names::TOKEN_VERIFY,
                    "/tokens/verify",
                    Body::Post(&body),
                    lag,
                    &[200],
                )
                .await;
            }
        }
        Kind::Once => {
            let n = sh.seq.fetch_add(1, Ordering::Relaxed);
            let uid = sh.user_base + n;
            let body = json!({"user": uid, "activity": "loadgen"});
            let issued = call(
                user,
                sh,
                names::ONCE_ISSUE,
                "/tokens/once",
                Body::Post(&body),
                lag,
                &[200, 201],
            )
            .await;
            let Some((_, v)) = issued else { return };
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
                let ans = call(
                    user,
                    sh,
                    name,
                    "/tokens/once/consume",
                    Body::Post(&body),
                    lag,
                    ok,
                )
                .await;
                if let Some((_, v)) = ans
                    && v.get("accepted").and_then(Value::as_bool) == Some(true)
                {
                    *lock(&sh.once_accepted).entry(tok.clone()).or_insert(0) += 1;
                }
            }
        }
        Kind::Lottery => {
            let Some(plan) = sh.lottery else { return };
            let n = sh.seq.fetch_add(1, Ordering::Relaxed);
            let activity = n / LOTTERY_USERS;
            if activity >= plan.activities {
                return; // plan exhausted (bounded by LOTTERY_RATE_MAX)
            }
            let body = json!({
                "user": plan.user_base + n % LOTTERY_USERS,
                "activity": plan.activity_base + activity,
                "price_minor": PRICE_MINOR,
            });
            if let Some((200, _)) = call(
                user,
                sh,
                names::DRAW,
                "/lottery/draw",
                Body::Post(&body),
                lag,
                &[200],
            )
            .await
            {
                sh.draws_confirmed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The goose transaction: wait for this user's next slot, run one operation.
pub async fn tick(user: &mut GooseUser, sh: &Shared) -> TransactionResult {
    let k = (user.weighted_users_index as u64) % sh.users.max(1);
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
    // itself would make every send ~0.5-1 ms late, and that lateness would count as latency.
    // Waking up to TIMER_SLACK early instead keeps the average rate and inflates nothing (a send
    // ahead of its time is measured from its actual send).
    if let Some(wake) = intended.checked_sub(Duration::from_millis(TIMER_SLACK_MS))
        && wake > now
    {
        tokio::time::sleep_until(wake.into()).await;
    }
    let lag = Instant::now().saturating_duration_since(intended);
    let slot = k + i * sh.users;
    if let Some(kind) = kind_of(&sh.workload, slot) {
        operation(user, sh, kind, lag).await;
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
    fn status_classes() {
        assert_eq!(status_class(200), None);
        assert_eq!(status_class(201), None);
        assert_eq!(status_class(409), Some("http_4xx"));
        assert_eq!(status_class(503), Some("http_5xx"));
    }
}
