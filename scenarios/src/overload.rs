//! The capacity check (`--overload N` of `scenario ids`; rows of `scenario flaws --process`):
//! does a service come back after an overload?
//!
//! A short, gentle run never shows what a service loses when it is pushed past its limits: a
//! slot, permit or connection taken on a path that only a client that gives up reaches (a
//! cancelled request, a timeout, a reset) and never given back. Such a service answers every
//! request of the run correctly and is smaller after every overload, until it answers nothing.
//!
//! The check measures the service's answer rate to one request (closed loop, `workers`
//! keep-alive connections, the next request as soon as the last is answered; an answer below
//! 500 counts) for `window`; then `clients` clients overload it for `overload_for`, each sending
//! the request on a fresh connection and giving up after `client_timeout`: a client that gives
//! up resets its connection (`SO_LINGER` 0, as a client does whose answer is still unread), and
//! tries again; at the end of the overload every client still waiting gives up. After
//! `settle`, the rate is measured again, side by side with the first, up to
//! `after_windows_max` windows: the best one is judged, since noise passes and lost capacity
//! does not.
//!
//! The rate alone misses a leak that leaves the service a few free connections: a few are
//! enough to answer as fast as before. So the check also counts the **connections served at
//! once** before the overload and after it (`probe_connections` connections opened together and
//! held, each sending the request: how many get an answer below 500): a service that gives every
//! connection back serves as many after as before, whatever its limits; one that keeps what
//! clients that gave up held serves fewer.
//!
//! - `service.capacity_after_overload`: the rate after is at least `ratio_min` of the rate
//!   before, and so are the connections served at once. Not checked (and said so) when the
//!   overload overloaded nothing: every request of it answered within the client timeout, so no
//!   client gave up and no limit was reached.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Method, Uri};
use reports::model::{InvariantResult, Judgement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use load::conn::{Conn, Target};

/// `service.capacity_after_overload`
pub const CAPACITY_AFTER_OVERLOAD: &str = "service.capacity_after_overload";

/// The most connections the count of those served at once opens.
pub const PROBE_CONNECTIONS_MAX: usize = 4_096;

/// The pause between a window and the next count, for its connections to go.
const PROBE_SETTLE: Duration = Duration::from_millis(250);

/// How long the connections of one count wait for their answers, in all, once all are open.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How long one connection of a count may take to open, and all of them.
const PROBE_CONNECT_WAIT: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(30));

/// Connections opened at once while a count opens its connections (the service's listen queue
/// must not overflow).
const PROBE_CONNECT_BATCH: usize = 64;

/// What to measure and how hard to push.
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadOptions {
    /// The service's base URL (plain HTTP): `http://HOST:PORT`.
    pub url: String,
    /// The request measured and sent by the overload: `GET path` (with its query).
    pub path: String,
    /// Overload clients at once.
    pub clients: usize,
    /// How long an overload client waits for its answer before it gives up.
    pub client_timeout: Duration,
    /// How long the overload lasts.
    pub overload_for: Duration,
    /// Closed-loop connections measuring the rate.
    pub workers: usize,
    /// How long each rate is measured.
    pub window: Duration,
    /// The pause between the overload and the first window after it.
    pub settle: Duration,
    /// The least rate after, as a share of the rate before.
    pub ratio_min: f64,
    /// Windows after the overload at most (the best is judged; the first that reaches
    /// `ratio_min` ends the measurement).
    pub after_windows_max: u32,
    /// Connections opened together and held to count those served at once (more than the
    /// service's limit for one address, so that the limit is what is counted).
    pub probe_connections: usize,
}

impl OverloadOptions {
    /// `clients` overload clients against `url`, measuring `GET path`: 20 ms client timeout,
    /// 3 s of overload, 64 workers, 2 s windows, 1 s to settle, at least 0.9 of the rate
    /// before, up to 6 windows after (the first at or above it ends them), twice `clients`
    /// connections (at most 4,096) to count those served at once.
    #[must_use]
    pub fn new(url: &str, path: &str, clients: usize) -> Self {
        Self {
            url: url.to_owned(),
            path: path.to_owned(),
            clients,
            client_timeout: Duration::from_millis(20),
            overload_for: Duration::from_secs(3),
            workers: 64,
            window: Duration::from_secs(2),
            settle: Duration::from_secs(1),
            ratio_min: 0.9,
            after_windows_max: 6,
            probe_connections: clients.saturating_mul(2).clamp(1, PROBE_CONNECTIONS_MAX),
        }
    }

    /// Whether the options make a check: a message naming the option otherwise.
    ///
    /// # Errors
    /// No clients or too many, a client timeout of 0 or over 60 s, an overload of 0 or over
    /// 10 minutes, a least ratio outside (0, 1].
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=20_000).contains(&self.clients) {
            return Err(format!("--overload {}: give 1 to 20000", self.clients));
        }
        let ms = self.client_timeout.as_millis();
        if !(1..=60_000).contains(&ms) {
            return Err(format!(
                "--overload-timeout-ms {ms}: give 1 to 60000 (ms a client waits before it gives up)"
            ));
        }
        let s = self.overload_for.as_secs_f64();
        if !(s > 0.0 && s <= 600.0) {
            return Err(format!(
                "--overload-s {s}: give more than 0 and at most 600"
            ));
        }
        let r = self.ratio_min;
        if !(1..=PROBE_CONNECTIONS_MAX).contains(&self.probe_connections) {
            return Err(format!(
                "probe_connections {}: give 1 to {PROBE_CONNECTIONS_MAX}",
                self.probe_connections
            ));
        }
        if !(r > 0.0 && r <= 1.0) {
            return Err(format!(
                "--overload-ratio-min {r}: give more than 0 and at most 1 (the least rate after \
                 the overload, as a share of the rate before)"
            ));
        }
        Ok(())
    }
}

/// What the check measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OverloadRun {
    /// Answers per second before the overload.
    pub rate_before_per_s: f64,
    /// Answers per second in each window after it.
    pub rates_after_per_s: Vec<f64>,
    /// Requests of the windows after it that got no answer below 500 (refused, reset, timed
    /// out, 5xx), and the first one's error: what a rate of 0 was made of.
    pub after_failed: u64,
    /// The first of them, in words.
    pub after_first_failure: Option<String>,
    /// Connections opened together to count those served at once.
    pub probe_connections: usize,
    /// Of them, served at once before the overload.
    pub served_at_once_before: u64,
    /// Served at once in each count after it.
    pub served_at_once_after: Vec<u64>,
    /// Overload requests tried (each on a fresh connection).
    pub attempts: u64,
    /// Of them, connections the service accepted.
    pub connected: u64,
    /// Overload requests answered below 500 within the client timeout.
    pub answered: u64,
    /// Overload requests answered 500 or above (503: refused by admission) within it.
    pub refused: u64,
    /// Overload requests whose client gave up (and reset the connection).
    pub gave_up: u64,
    /// Overload connections refused, or closed by the service before an answer.
    pub not_served: u64,
    /// Overload clients.
    pub clients: usize,
    /// Their timeout, ms.
    pub client_timeout_ms: u64,
    /// The options' threshold, for the report.
    pub ratio_min: f64,
}

/// Why the check could not be made (not a verdict).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OverloadError(pub String);

impl OverloadRun {
    /// The best rate measured after the overload.
    #[must_use]
    pub fn rate_after_per_s(&self) -> f64 {
        self.rates_after_per_s.iter().copied().fold(0.0, f64::max)
    }

    /// The rate after as a share of the rate before.
    #[must_use]
    pub fn ratio(&self) -> f64 {
        if self.rate_before_per_s > 0.0 {
            self.rate_after_per_s() / self.rate_before_per_s
        } else {
            0.0
        }
    }

    /// The most connections served at once after the overload.
    #[must_use]
    pub fn served_at_once_after_max(&self) -> u64 {
        self.served_at_once_after.iter().copied().max().unwrap_or(0)
    }

    /// The connections served at once after, as a share of those before; 1 when none were
    /// counted before (nothing to compare with).
    #[must_use]
    pub fn served_ratio(&self) -> f64 {
        if self.served_at_once_before > 0 {
            self.served_at_once_after_max() as f64 / self.served_at_once_before as f64
        } else {
            1.0
        }
    }

    /// Whether both measures came back to at least `ratio_min`.
    #[must_use]
    pub fn came_back(&self) -> bool {
        self.ratio() >= self.ratio_min && self.served_ratio() >= self.ratio_min
    }

    /// The connections served at once, in words.
    #[must_use]
    pub fn served_line(&self) -> String {
        let after: Vec<String> = self
            .served_at_once_after
            .iter()
            .map(u64::to_string)
            .collect();
        format!(
            "connections served at once (of {} opened together): {} before, {} after (ratio \
             {:.3})",
            self.probe_connections,
            self.served_at_once_before,
            after.join(", "),
            self.served_ratio()
        )
    }

    /// Whether the overload reached a limit: some of its requests were refused, given up or
    /// not served.
    #[must_use]
    pub fn overloaded(&self) -> bool {
        self.refused + self.gave_up + self.not_served > 0
    }

    /// What the overload did, in words.
    #[must_use]
    pub fn overload_line(&self) -> String {
        format!(
            "{} clients with a {} ms timeout made {} requests ({} connected): {} answered, {} \
             refused (5xx), {} given up and reset, {} not served",
            self.clients,
            self.client_timeout_ms,
            self.attempts,
            self.connected,
            self.answered,
            self.refused,
            self.gave_up,
            self.not_served
        )
    }

    /// `service.capacity_after_overload`.
    #[must_use]
    pub fn check(&self) -> InvariantResult {
        let ratio = self.ratio();
        let windows: Vec<String> = self
            .rates_after_per_s
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect();
        let detail = format!(
            "{:.0}/s before, {}/s after (best of {} window(s), ratio {ratio:.3}, at least {:.2}); \
             {}; {}",
            self.rate_before_per_s,
            windows.join(", "),
            windows.len(),
            self.ratio_min,
            self.served_line(),
            self.overload_line()
        );
        let served = self.served_ratio();
        let (verdict, first) = if !self.overloaded() {
            (
                Judgement::NotChecked,
                Some(format!(
                    "the overload reached no limit: every one of its {} requests was answered \
                     within {} ms (more clients or a shorter timeout: --overload, \
                     --overload-timeout-ms)",
                    self.attempts, self.client_timeout_ms
                )),
            )
        } else if self.came_back() {
            (Judgement::Held, None)
        } else if ratio >= self.ratio_min {
            (
                Judgement::Violated,
                Some(format!(
                    "after the overload the service served {} connections at once, {served:.2} \
                     of the {} it served before (at least {:.2} expected): capacity lost to \
                     clients that gave up (its rate came back, {ratio:.2}: a few free \
                     connections answer as fast as all of them)",
                    self.served_at_once_after_max(),
                    self.served_at_once_before,
                    self.ratio_min,
                )),
            )
        } else {
            (
                Judgement::Violated,
                Some(format!(
                    "after the overload the service answered {:.0}/s, {ratio:.2} of its {:.0}/s \
                     before (at least {:.2} expected): capacity lost to clients that gave up{}",
                    self.rate_after_per_s(),
                    self.rate_before_per_s,
                    self.ratio_min,
                    self.after_first_failure
                        .as_ref()
                        .map(|e| format!(
                            " ({} request(s) after it unanswered, the first: {e})",
                            self.after_failed
                        ))
                        .unwrap_or_default()
                )),
            )
        };
        InvariantResult {
            name: CAPACITY_AFTER_OVERLOAD.into(),
            verdict,
            seed: None,
            first_offending_event: first,
            detail: Some(detail),
        }
    }
}

/// What one measuring window saw.
struct Window {
    /// Answers below 500 per second.
    rate_per_s: f64,
    /// Requests without one.
    failed: u64,
    /// The first of them, in words.
    first_failure: Option<String>,
}

/// Answers per second to `GET path` over `workers` closed-loop connections for `window`.
async fn rate(target: &Target, path: &Uri, workers: usize, window: Duration) -> Window {
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_failure: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (target, path) = (target.clone(), path.clone());
            let (answered, failed, first_failure, stop) = (
                Arc::clone(&answered),
                Arc::clone(&failed),
                Arc::clone(&first_failure),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut conn = Conn::default();
                while !stop.load(Ordering::Relaxed) {
                    let r = conn
                        .send(
                            &target,
                            Method::GET,
                            &path,
                            (None, None),
                            Duration::from_secs(2),
                        )
                        .await;
                    let failure = match r {
                        Ok((status, _)) if status < 500 => {
                            answered.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok((status, _)) => format!("answered {status}"),
                        Err(e) => format!("{e:?}"),
                    };
                    failed.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut first) = first_failure.lock() {
                        first.get_or_insert(failure);
                    }
                    // A service that refuses must not be spun on.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed_s = started.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    let first_failure = first_failure.lock().ok().and_then(|f| f.clone());
    Window {
        rate_per_s: answered.load(Ordering::Relaxed) as f64 / elapsed_s.max(1e-9),
        failed: failed.load(Ordering::Relaxed),
        first_failure,
    }
}

/// How many of `n` connections opened together and held, each sending `request`, `addr`
/// serves at once: answers below 500 within [`PROBE_WAIT`] of the last one opening, on
/// connections the service still holds then. Every connection stays open until all have their
/// answer or the wait is over, so the service must hold them all at once; they are then closed
/// as clients close them when done (a connection whose answer did not come whole is reset).
/// No connection is given up while the others open (a service that makes room for a new
/// connection by closing an idle one would lose a place to a connection nobody holds).
async fn served_at_once(addr: SocketAddr, request: Arc<Vec<u8>>, n: usize) -> u64 {
    let (each, all) = PROBE_CONNECT_WAIT;
    let connects_end = tokio::time::Instant::now() + all;
    let mut open = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let batch = left.min(PROBE_CONNECT_BATCH);
        left -= batch;
        let connects: Vec<_> = (0..batch)
            .map(|_| {
                let request = Arc::clone(&request);
                tokio::spawn(async move {
                    let mut tcp = tokio::time::timeout(each, TcpStream::connect(addr))
                        .await
                        .ok()?
                        .ok()?;
                    tcp.write_all(&request).await.ok()?;
                    Some(tcp)
                })
            })
            .collect();
        for c in connects {
            if let Ok(Some(tcp)) = c.await {
                open.push(tcp);
            }
        }
        if tokio::time::Instant::now() >= connects_end {
            break;
        }
    }
    let deadline = tokio::time::Instant::now() + PROBE_WAIT;
    let reads: Vec<_> = open
        .into_iter()
        .map(|mut tcp| {
            tokio::spawn(async move {
                let answer = tokio::time::timeout_at(deadline, read_answer(&mut tcp)).await;
                let served = match answer {
                    Ok(Ok((answer, true))) if status_of(&answer).is_some_and(|s| s < 500) => {
                        Some(says_close(&answer))
                    }
                    _ => {
                        let _ = tcp.set_zero_linger();
                        None
                    }
                };
                (served, tcp)
            })
        })
        .collect();
    let mut answered = Vec::with_capacity(reads.len());
    for r in reads {
        if let Ok(read) = r.await {
            answered.push(read);
        }
    }
    // Served at once: answered, and still held. A service that closes an answered connection
    // to make room for another (an idle one giving way) served them one after the other; one
    // that closes it as its answer said (`Connection: close`) served it.
    let served = answered
        .iter()
        .filter(|(served, tcp)| match served {
            Some(closes) => *closes || !blackbox::probe::closed_now(tcp),
            None => false,
        })
        .count();
    drop(answered); // only now, all together
    served as u64
}

/// Whether an answer's head says the service closes the connection after it.
fn says_close(answer: &[u8]) -> bool {
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    String::from_utf8_lossy(&answer[..head_end])
        .to_ascii_lowercase()
        .lines()
        .any(|l| l.starts_with("connection:") && l.contains("close"))
}

/// Reads one answer from `tcp`: its bytes, and whether it came whole (its length said and
/// reached) rather than cut off by the service closing the connection.
async fn read_answer(tcp: &mut TcpStream) -> std::io::Result<(Vec<u8>, bool)> {
    let mut answer = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Ok((answer, false));
        }
        answer.extend_from_slice(&buf[..n]);
        match answer_end(&answer) {
            Some(end) if answer.len() >= end => return Ok((answer, true)),
            // A head without a length, or one too long: the status is what counts.
            None if answer.len() > 64 * 1024 => return Ok((answer, false)),
            _ => {}
        }
    }
}

/// How one overload request ended.
enum Outcome {
    Answered(u16),
    GaveUp,
    NotServed,
}

/// One overload request on a fresh connection: the answer's status, or the client gave up
/// after `timeout` (and reset the connection), or the service refused or closed it first. A
/// request still waiting at `until` is given up then: the overload ends as its clients go away,
/// not as they finish.
async fn one_request(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    until: Instant,
) -> (bool, Outcome) {
    let deadline =
        (tokio::time::Instant::now() + timeout).min(tokio::time::Instant::from_std(until));
    let tcp = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
        Err(_) => return (false, Outcome::GaveUp),
        Ok(Err(_)) => return (false, Outcome::NotServed),
        Ok(Ok(tcp)) => tcp,
    };
    let mut tcp = tcp;
    // A keep-alive request, as clients send them: the service keeps the connection after its
    // answer, and sees how the client leaves it (a close once the answer is read whole, a reset
    // when the client gave up, whether or not the answer had been written).
    let exchange = async {
        tcp.write_all(request).await?;
        read_answer(&mut tcp).await
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Err(_) => {
            // A client that gives up with its answer unread resets the connection.
            let _ = tcp.set_zero_linger();
            drop(tcp);
            (true, Outcome::GaveUp)
        }
        Ok(Err(_)) => (true, Outcome::NotServed),
        Ok(Ok((answer, whole))) => {
            if !whole {
                let _ = tcp.set_zero_linger();
            }
            drop(tcp);
            match status_of(&answer) {
                Some(status) => (true, Outcome::Answered(status)),
                None => (true, Outcome::NotServed),
            }
        }
    }
}

/// Where an HTTP/1.x answer in `got` ends, once its head has arrived and says its length
/// (`Content-Length`); `None` before that, or for an answer framed otherwise.
fn answer_end(got: &[u8]) -> Option<usize> {
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&got[..head_end]).ok()?;
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    })?;
    Some(head_end + length)
}

/// The status of an HTTP/1.x answer (`HTTP/1.1 503 …`).
fn status_of(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// The overload: `clients` clients, each one request after another until `until`.
async fn overload(
    addr: SocketAddr,
    request: Arc<Vec<u8>>,
    clients: usize,
    timeout: Duration,
    until: Instant,
) -> OverloadRun {
    let counts: Arc<[AtomicU64; 5]> = Arc::new(Default::default());
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (counts, request) = (Arc::clone(&counts), Arc::clone(&request));
            tokio::spawn(async move {
                while Instant::now() < until {
                    let (connected, outcome) = one_request(addr, &request, timeout, until).await;
                    if connected {
                        counts[0].fetch_add(1, Ordering::Relaxed);
                    }
                    let slot = match outcome {
                        Outcome::Answered(status) if status < 500 => 1,
                        Outcome::Answered(_) => 2,
                        Outcome::GaveUp => 3,
                        Outcome::NotServed => {
                            // A refused connection comes back at once: do not spin on it.
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            4
                        }
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let n = |i: usize| counts[i].load(Ordering::Relaxed);
    OverloadRun {
        attempts: n(1) + n(2) + n(3) + n(4),
        connected: n(0),
        answered: n(1),
        refused: n(2),
        gave_up: n(3),
        not_served: n(4),
        clients,
        client_timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        ..OverloadRun::default()
    }
}

/// Runs the check.
///
/// # Errors
/// The URL is not plain HTTP, or the service answered nothing before the overload.
pub fn run(opts: &OverloadOptions) -> Result<OverloadRun, OverloadError> {
    opts.validate().map_err(OverloadError)?;
    let base = reqwest::Url::parse(&opts.url)
        .map_err(|e| OverloadError(format!("--url {}: {e}", opts.url)))?;
    let target = Target::of(&base).ok_or_else(|| {
        OverloadError(format!("--overload needs a plain http:// URL, not {base}"))
    })?;
    let addr = load::conn::socket_addr(&opts.url).map_err(OverloadError)?;
    let host = format!(
        "{}:{}",
        base.host_str().unwrap_or_default(),
        base.port_or_known_default().unwrap_or(80)
    );
    let path: Uri = opts
        .path
        .parse()
        .map_err(|e| OverloadError(format!("path {}: {e}", opts.path)))?;
    let request =
        Arc::new(format!("GET {} HTTP/1.1\r\nHost: {host}\r\n\r\n", opts.path).into_bytes());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| OverloadError(format!("a runtime for the overload: {e}")))?;
    rt.block_on(async {
        // Counted first: the connections of a window just closed could still hold places.
        let served_before =
            served_at_once(addr, Arc::clone(&request), opts.probe_connections).await;
        let before = rate(&target, &path, opts.workers, opts.window)
            .await
            .rate_per_s;
        if before <= 0.0 {
            return Err(OverloadError(format!(
                "GET {}{}: no answer before the overload",
                opts.url, opts.path
            )));
        }
        let until = Instant::now() + opts.overload_for;
        let mut run = overload(
            addr,
            Arc::clone(&request),
            opts.clients,
            opts.client_timeout,
            until,
        )
        .await;
        tokio::time::sleep(opts.settle).await;
        run.rate_before_per_s = before;
        run.ratio_min = opts.ratio_min;
        run.probe_connections = opts.probe_connections;
        run.served_at_once_before = served_before;
        for window in 0..opts.after_windows_max.max(1) {
            if window > 0 {
                // The last window's connections go away first (they are not what is counted).
                tokio::time::sleep(PROBE_SETTLE).await;
            }
            run.served_at_once_after
                .push(served_at_once(addr, Arc::clone(&request), opts.probe_connections).await);
            let after = rate(&target, &path, opts.workers, opts.window).await;
            run.rates_after_per_s.push(after.rate_per_s);
            run.after_failed += after.failed;
            if run.after_first_failure.is_none() {
                run.after_first_failure = after.first_failure;
            }
            if run.came_back() {
                break;
            }
        }
        Ok(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(before: f64, after: &[f64], gave_up: u64) -> OverloadRun {
        OverloadRun {
            rate_before_per_s: before,
            rates_after_per_s: after.to_vec(),
            attempts: 5_000,
            connected: 5_000,
            answered: 5_000 - gave_up,
            gave_up,
            clients: 1_000,
            client_timeout_ms: 20,
            ratio_min: 0.9,
            ..OverloadRun::default()
        }
    }

    #[test]
    fn the_check_fires_on_capacity_lost_and_not_on_a_service_that_comes_back() {
        // Back to its rate (the best window after counts: noise passes, a leak does not).
        let good = run_of(10_000.0, &[8_000.0, 9_500.0], 700);
        assert_eq!(good.check().verdict, Judgement::Held, "{:?}", good.check());
        assert!((good.ratio() - 0.95).abs() < 1e-9);
        // Every connection slot kept by clients that gave up: nothing answered after.
        let leaked = run_of(10_000.0, &[0.0, 0.0, 0.0], 2_400);
        let check = leaked.check();
        assert_eq!(check.name, CAPACITY_AFTER_OVERLOAD);
        assert_eq!(check.verdict, Judgement::Violated);
        let first = check.first_offending_event.unwrap();
        assert!(first.contains("0.00 of its 10000/s"), "{first}");
        // A partial loss below the bound is a loss too.
        let shrunk = run_of(10_000.0, &[6_000.0, 7_000.0, 6_500.0], 900);
        assert_eq!(shrunk.check().verdict, Judgement::Violated);
    }

    #[test]
    fn connections_kept_fire_the_check_even_when_the_rate_comes_back() {
        // A few free connections answer as fast as all of them: the rate passes.
        let few_left = OverloadRun {
            probe_connections: 2_000,
            served_at_once_before: 1_024,
            served_at_once_after: vec![180, 181],
            ..run_of(10_000.0, &[9_900.0, 10_100.0], 900)
        };
        assert!(few_left.ratio() >= 0.9);
        let check = few_left.check();
        assert_eq!(check.verdict, Judgement::Violated, "{check:?}");
        let first = check.first_offending_event.unwrap();
        assert!(
            first.contains("served 181 connections at once, 0.18 of the 1024"),
            "{first}"
        );
        assert!(
            check
                .detail
                .unwrap()
                .contains("1024 before, 180, 181 after"),
            "the counts are reported"
        );
        // All of them back (the best count after is judged): held.
        let back = OverloadRun {
            served_at_once_after: vec![1_000, 1_024],
            ..few_left.clone()
        };
        assert_eq!(back.check().verdict, Judgement::Held);
        // Nothing counted before: only the rate is judged.
        let uncounted = OverloadRun {
            served_at_once_before: 0,
            ..few_left
        };
        assert_eq!(uncounted.check().verdict, Judgement::Held);
    }

    /// A service that serves at most `limit` connections at once and closes the others at once.
    async fn limited_service(limit: usize) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut kept = Vec::new();
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    return;
                };
                if kept.len() >= limit {
                    drop(tcp);
                    continue;
                }
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                kept.push(tcp); // never given back: the count is the limit
            }
        });
        addr
    }

    /// A service that serves every connection but keeps at most `limit` open: at the limit,
    /// the connection it answered first is closed for the new one (an idle one giving way);
    /// with `limit` 0, each answer says `Connection: close` and the connection is closed.
    async fn evicting_service(limit: usize) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut kept = std::collections::VecDeque::new();
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                if limit == 0 {
                    let _ = tcp
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\nok",
                        )
                        .await;
                    continue; // dropped: closed, as the answer said
                }
                if kept.len() >= limit {
                    drop(kept.pop_front());
                }
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                kept.push_back(tcp);
            }
        });
        addr
    }

    #[test]
    fn connections_closed_to_make_room_were_not_served_at_once() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let request = Arc::new(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec());
            // Every one answered, but only 37 held at the end: 37 served at once.
            let addr = evicting_service(37).await;
            assert_eq!(served_at_once(addr, Arc::clone(&request), 100).await, 37);
            // Closed as each answer said: every one served.
            let addr = evicting_service(0).await;
            assert_eq!(served_at_once(addr, request, 50).await, 50);
        });
        assert!(says_close(b"HTTP/1.1 200 OK\r\nConnection: Close\r\n\r\n"));
        assert!(!says_close(b"HTTP/1.1 200 OK\r\n\r\nconnection: close"));
    }

    #[test]
    fn the_count_of_connections_served_at_once_finds_the_limit() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let request = Arc::new(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec());
            let addr = limited_service(37).await;
            assert_eq!(served_at_once(addr, Arc::clone(&request), 100).await, 37);
            // Fewer than the limit: every one of them.
            let addr = limited_service(37).await;
            assert_eq!(served_at_once(addr, request, 20).await, 20);
        });
    }

    #[test]
    fn an_overload_that_reached_no_limit_is_not_a_pass() {
        let gentle = run_of(10_000.0, &[10_000.0], 0);
        let check = gentle.check();
        assert_eq!(check.verdict, Judgement::NotChecked);
        assert!(
            check
                .first_offending_event
                .unwrap()
                .contains("reached no limit")
        );
        // Refusals (503) show a limit reached as much as clients giving up.
        let refused = OverloadRun {
            refused: 10,
            ..run_of(10_000.0, &[10_000.0], 0)
        };
        assert_eq!(refused.check().verdict, Judgement::Held);
    }

    #[test]
    fn statuses_are_read_from_the_status_line_only() {
        assert_eq!(
            status_of(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(status_of(b"HTTP/1.0 200 OK\r\nx: 1\r\n\r\n{}"), Some(200));
        assert_eq!(status_of(b""), None);
        assert_eq!(status_of(b"SSH-2.0-OpenSSH\r\n"), None);
    }

    #[test]
    fn an_answer_ends_where_its_length_says() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
        assert_eq!(answer_end(head), Some(head.len() + 5));
        assert_eq!(answer_end(b"HTTP/1.1 200 OK\r\ncontent-len"), None);
        assert_eq!(
            answer_end(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
            None
        );
    }

    #[test]
    fn bad_options_are_named() {
        let mut o = OverloadOptions::new("http://127.0.0.1:1", "/id/x", 0);
        assert!(o.validate().unwrap_err().contains("--overload 0"));
        o.clients = 10;
        o.client_timeout = Duration::ZERO;
        assert!(o.validate().unwrap_err().contains("--overload-timeout-ms"));
        o.client_timeout = Duration::from_millis(20);
        assert!(o.validate().is_ok());
        for bad in [0.0, 1.5, f64::NAN] {
            o.ratio_min = bad;
            assert!(
                o.validate().unwrap_err().contains("--overload-ratio-min"),
                "{bad}"
            );
        }
        o.ratio_min = 0.5;
        assert!(o.validate().is_ok());
        o.probe_connections = 0;
        assert!(o.validate().unwrap_err().contains("probe_connections 0"));
        assert_eq!(
            OverloadOptions::new("http://127.0.0.1:1", "/", 20_000).probe_connections,
            PROBE_CONNECTIONS_MAX
        );
    }
}
