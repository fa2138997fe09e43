//! The held-connections check (`--held-clients N` of `scenario ids`, `tcc` and `tokens`): can
//! clients that merely hold keep-alive connections lock a new client out?
//!
//! `held` connections, spread over many source addresses on a loopback target (127.0.0.2,
//! 127.0.0.3, …, [`PER_SOURCE`] each, so that a per-address cap does not stop them before the
//! service is full), each send the measured request once every [`HOLD_INTERVAL`] and otherwise
//! sit idle, as a keep-alive pool does; one whose connection is closed connects again at its
//! next turn. A new client from an address of its own (the system's) asks at a steady
//! [`NEW_CLIENT_PER_S`] requests a second, well below what the service can answer, before they
//! connect, while they are held, and after they are gone (each window on new connections). A
//! paced client measures whether it is served, not how much the machine has left: the held
//! connections' own requests take a share of a small machine, which a client that asks as fast
//! as it can would read as a loss.
//!
//! - `service.new_client_when_full`: the new client's answers per second while the connections
//!   are held are at least `rate_ratio_min` (0.9) of the mean of its rates before and after. A
//!   service that refuses new connections once full, and lets idle ones keep their places,
//!   answers it nothing. Not checked when the service held every connection (it was never
//!   full: ask for more), and said so.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::Uri;
use rand::{Rng, SeedableRng};
use reports::model::{InvariantResult, Judgement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::probe::{Probe, closed_now};
use load::conn::Target;

/// `service.new_client_when_full`
pub const NEW_CLIENT_WHEN_FULL: &str = "service.new_client_when_full";

/// Held connections per source address on a loopback target.
pub const PER_SOURCE: usize = 256;
/// Each held connection sends one request this often.
pub const HOLD_INTERVAL: Duration = Duration::from_secs(8);
/// At most this many held connections.
pub const HELD_MAX: usize = 30_000;
/// Held connections opening at once (the listen queue must not overflow).
const CONNECT_BATCH: usize = 64;
/// The new client's requests per second.
pub const NEW_CLIENT_PER_S: u32 = 200;
/// The new client's connections (each asks at an equal share of [`NEW_CLIENT_PER_S`]).
const NEW_CLIENT_CONNECTIONS: u32 = 4;
/// The least share of its rate without the held connections the new client must get.
pub const RATIO_MIN: f64 = 0.9;

/// What the check measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HeldRun {
    /// Connections asked for.
    pub asked: usize,
    /// Source addresses they came from (0: the system's, the target is not loopback).
    pub sources: usize,
    /// The most of them open at once, counted while the rate was measured.
    pub connected_max: usize,
    /// Their requests answered (below 500).
    pub answered: u64,
    /// Their connections the service refused or closed (at once, or to make room).
    pub closed_by_service: u64,
    /// The new client's answers per second before the connections were held.
    pub rate_before_per_s: f64,
    /// Its answers per second while they were held.
    pub rate_during_per_s: f64,
    /// Its answers per second after they were gone.
    pub rate_after_per_s: f64,
    /// Its requests of the second window that got no answer (refused, broken, timed out).
    pub failed_during: u64,
    /// The least share of its rate without them.
    pub rate_ratio_min: f64,
}

impl HeldRun {
    /// The rate while held, as a share of the mean of the rates before and after.
    #[must_use]
    pub fn ratio(&self) -> f64 {
        let without = f64::midpoint(self.rate_before_per_s, self.rate_after_per_s);
        if without > 0.0 {
            self.rate_during_per_s / without
        } else {
            0.0
        }
    }

    /// Whether the service was ever full: it refused or closed a held connection.
    #[must_use]
    pub fn was_full(&self) -> bool {
        self.closed_by_service > 0
    }

    /// `service.new_client_when_full`.
    #[must_use]
    pub fn check(&self) -> InvariantResult {
        let ratio = self.ratio();
        let detail = format!(
            "{:.0}/s before, {:.0}/s with {} connections held ({} open at most, from {} \
             addresses; {} of them refused or closed by the service), {:.0}/s after (ratio \
             {ratio:.3}, at least {:.2}; {} requests failed)",
            self.rate_before_per_s,
            self.rate_during_per_s,
            self.asked,
            self.connected_max,
            self.sources.max(1),
            self.closed_by_service,
            self.rate_after_per_s,
            self.rate_ratio_min,
            self.failed_during
        );
        let (verdict, first) = if ratio < self.rate_ratio_min {
            (
                Judgement::Violated,
                Some(format!(
                    "with {} keep-alive connections held by other addresses, a new client got \
                     {:.0} answers/s, {ratio:.2} of its {:.0}/s without them: idle connections \
                     keep their places and a new one gets none",
                    self.connected_max,
                    self.rate_during_per_s,
                    f64::midpoint(self.rate_before_per_s, self.rate_after_per_s)
                )),
            )
        } else if !self.was_full() {
            (
                Judgement::NotChecked,
                Some(format!(
                    "the service held all {} connections and was never full, so a lock-out \
                     could not show: ask for more (--held-clients)",
                    self.connected_max
                )),
            )
        } else {
            (Judgement::Held, None)
        };
        InvariantResult {
            name: NEW_CLIENT_WHEN_FULL.into(),
            verdict,
            seed: None,
            first_offending_event: first,
            detail: Some(detail),
        }
    }
}

/// What the held connections share.
#[derive(Default)]
struct Counters {
    connected: AtomicUsize,
    answered: AtomicU64,
    closed_by_service: AtomicU64,
    stop: AtomicBool,
}

/// The source address of held connection `i` on a loopback target.
fn source(target: SocketAddr, i: usize) -> Option<std::net::IpAddr> {
    crate::probe::loopback_source(target, i, PER_SOURCE)
}

/// The request bytes of `probe` to `host`, as a keep-alive HTTP/1.1 request.
fn request_bytes(probe: &Probe, host: &str) -> Vec<u8> {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\n",
        probe.method, probe.path
    );
    if let Some(bearer) = &probe.bearer {
        head.push_str(&format!("Authorization: Bearer {bearer}\r\n"));
    }
    let body = probe.json.as_deref().unwrap_or_default();
    if probe.json.is_some() {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Reads one answer: its status when it came whole, `None` when the service closed the
/// connection first (or it broke).
async fn read_status(tcp: &mut TcpStream) -> Option<u16> {
    let mut got = Vec::with_capacity(512);
    let mut buf = [0u8; 2048];
    loop {
        let n = tcp.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let Some(head_end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            if got.len() > 64 * 1024 {
                return None;
            }
            continue;
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
        let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())?;
        if got.len() >= head_end + 4 + length {
            return Some(status);
        }
    }
}

/// One held connection: a request every [`HOLD_INTERVAL`] (the first at `offset`), again on a
/// new connection when the service closed the last, until `stop`.
async fn hold(
    target: SocketAddr,
    from: Option<std::net::IpAddr>,
    request: Arc<Vec<u8>>,
    offset: Duration,
    counters: Arc<Counters>,
    opened: tokio::sync::oneshot::Sender<()>,
) {
    let mut opened = Some(opened);
    let mut next = tokio::time::Instant::now() + offset;
    while !counters.stop.load(Ordering::Relaxed) {
        let connected = connect(target, from).await;
        if let Some(tx) = opened.take() {
            let _ = tx.send(());
        }
        let Some(mut tcp) = connected else {
            counters.closed_by_service.fetch_add(1, Ordering::Relaxed);
            next = tokio::time::Instant::now() + HOLD_INTERVAL;
            tokio::time::sleep_until(next).await;
            continue;
        };
        counters.connected.fetch_add(1, Ordering::Relaxed);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                // Closed by the service while idle.
                closed = tcp.readable() => {
                    if closed.is_err() || closed_now(&tcp) {
                        break;
                    }
                    continue;
                }
            }
            if counters.stop.load(Ordering::Relaxed) {
                break;
            }
            next += HOLD_INTERVAL;
            if tcp.write_all(&request).await.is_err() {
                break;
            }
            match read_status(&mut tcp).await {
                Some(status) if status < 500 => {
                    counters.answered.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => {}
                None => break,
            }
        }
        counters.connected.fetch_sub(1, Ordering::Relaxed);
        if counters.stop.load(Ordering::Relaxed) {
            return;
        }
        counters.closed_by_service.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep_until(next).await;
    }
}

/// A connection to `target` from `from`, within 2 s; `None` when refused or closed at once.
async fn connect(target: SocketAddr, from: Option<std::net::IpAddr>) -> Option<TcpStream> {
    let socket = crate::probe::socket_from(target, from).ok()?;
    tokio::time::timeout(Duration::from_secs(2), socket.connect(target))
        .await
        .ok()?
        .ok()
}

/// What to measure: the service, its request, how many to hold, how to judge.
#[derive(Debug)]
pub struct HeldOptions<'a> {
    /// The service (plain HTTP).
    pub target: &'a Target,
    /// Its socket address.
    pub addr: SocketAddr,
    /// Its `Host`.
    pub host: &'a str,
    /// The measured request and its parsed path.
    pub probe: (&'a Probe, &'a Uri),
    /// Connections to hold.
    pub held: usize,
    /// Each rate's window.
    pub window: Duration,
}

/// The new client's answers per second to `probe` over `window`: [`NEW_CLIENT_CONNECTIONS`]
/// keep-alive connections, each asking at its share of [`NEW_CLIENT_PER_S`] (a turn missed
/// while an answer is awaited is skipped), and the requests that got no answer.
async fn paced_rate(
    target: &Target,
    (probe, path): (&Probe, &Uri),
    window: Duration,
) -> (f64, u64) {
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let end = started + window;
    let every = Duration::from_secs(1) * NEW_CLIENT_CONNECTIONS / NEW_CLIENT_PER_S;
    let tasks: Vec<_> = (0..NEW_CLIENT_CONNECTIONS)
        .map(|k| {
            let (target, path, probe) = (target.clone(), path.clone(), probe.clone());
            let (answered, failed) = (Arc::clone(&answered), Arc::clone(&failed));
            tokio::spawn(async move {
                let mut conn = load::conn::Conn::default();
                let first = started + every * k / NEW_CLIENT_CONNECTIONS;
                let mut turns = tokio::time::interval_at(first, every);
                turns.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    if turns.tick().await >= end {
                        return;
                    }
                    let served = probe
                        .ask(&mut conn, &target, &path, Duration::from_secs(2))
                        .await;
                    let counter = if served { &answered } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    (
        answered.load(Ordering::Relaxed) as f64 / window.as_secs_f64().max(1e-9),
        failed.load(Ordering::Relaxed),
    )
}

/// Runs the check (inside a runtime).
pub async fn run(opts: &HeldOptions<'_>) -> HeldRun {
    let (probe, path) = opts.probe;
    let (before, _) = paced_rate(opts.target, (probe, path), opts.window).await;
    let request = Arc::new(request_bytes(probe, opts.host));
    let counters = Arc::new(Counters::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.held as u64);
    let mut tasks = Vec::with_capacity(opts.held);
    let mut first = 0;
    while first < opts.held {
        let batch = (first..opts.held.min(first + CONNECT_BATCH))
            .map(|i| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let offset = HOLD_INTERVAL.mul_f64(rng.gen_range(0.0..1.0));
                tasks.push(tokio::spawn(hold(
                    opts.addr,
                    source(opts.addr, i),
                    Arc::clone(&request),
                    offset,
                    Arc::clone(&counters),
                    tx,
                )));
                rx
            })
            .collect::<Vec<_>>();
        first += batch.len();
        for rx in batch {
            let _ = rx.await;
        }
    }
    // Each has connected (or been refused); the service takes them in.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let watch = {
        let counters = Arc::clone(&counters);
        tokio::spawn(async move {
            let mut most = 0;
            while !counters.stop.load(Ordering::Relaxed) {
                most = most.max(counters.connected.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            most
        })
    };
    let (during, failed_during) = paced_rate(opts.target, (probe, path), opts.window).await;
    counters.stop.store(true, Ordering::Relaxed);
    let connected_max = watch.await.unwrap_or(0);
    for t in tasks {
        t.abort();
    }
    // Their connections go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after, _) = paced_rate(opts.target, (probe, path), opts.window).await;
    let sources = if source(opts.addr, 0).is_some() {
        opts.held.div_ceil(PER_SOURCE)
    } else {
        0
    };
    HeldRun {
        asked: opts.held,
        sources,
        connected_max,
        answered: counters.answered.load(Ordering::Relaxed),
        closed_by_service: counters.closed_by_service.load(Ordering::Relaxed),
        rate_before_per_s: before,
        rate_during_per_s: during,
        rate_after_per_s: after,
        failed_during,
        rate_ratio_min: RATIO_MIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(before: f64, during: f64, closed_by_service: u64) -> HeldRun {
        HeldRun {
            asked: 8_400,
            sources: 33,
            connected_max: 8_191,
            closed_by_service,
            rate_before_per_s: before,
            rate_during_per_s: during,
            rate_after_per_s: before,
            rate_ratio_min: RATIO_MIN,
            ..HeldRun::default()
        }
    }

    #[test]
    fn the_check_fires_on_a_new_client_locked_out_and_says_when_the_service_was_never_full() {
        // The finding of docs/hostile.md: no answer at all to a client from another address.
        let locked = run_of(200.0, 0.0, 209).check();
        assert_eq!(locked.verdict, Judgement::Violated);
        assert!(
            locked
                .first_offending_event
                .as_deref()
                .unwrap()
                .contains("0.00 of its 200/s"),
            "{locked:?}"
        );
        assert_eq!(
            run_of(1_400.0, 1_300.0, 209).check().verdict,
            Judgement::Held
        );
        // Never full: nothing could lock the client out, so nothing is claimed.
        let never = run_of(1_400.0, 1_300.0, 0).check();
        assert_eq!(never.verdict, Judgement::NotChecked);
        assert!(never.first_offending_event.unwrap().contains("never full"));
    }

    #[test]
    fn a_held_request_is_a_keep_alive_request_with_its_credential_and_body() {
        let probe = Probe::post(
            "/tokens/once/consume",
            &serde_json::json!({"a": 1}),
            Some("t"),
        );
        let text = String::from_utf8(request_bytes(&probe, "h:1")).unwrap();
        assert!(text.starts_with("POST /tokens/once/consume HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(text.contains("Authorization: Bearer t\r\n"));
        assert!(
            text.ends_with("Content-Length: 7\r\n\r\n{\"a\":1}"),
            "{text}"
        );
        assert!(
            !String::from_utf8(request_bytes(&Probe::get("/id/x"), "h"))
                .unwrap()
                .contains("Content-Length")
        );
    }
}
