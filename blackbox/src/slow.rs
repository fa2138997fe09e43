//! The slow-clients check (`--slow-clients N` of `scenario ids`, `tcc` and `tokens`): can a few
//! hundred connections that never finish their request take a service down?
//!
//! The check measures the service's answer rate to one request (closed loop, `workers`
//! keep-alive connections, each sending the next request as soon as the last is answered; an
//! answer below 500 counts, a 5xx, a refusal or a timeout is a request not served) for `window`; then opens `stalled` connections that send part
//! of a request and then nothing — half stop inside the request head (a header that never ends,
//! as Slowloris does), the others after the head, 5 bytes into a body of 1,000 — and measures the rate
//! again, side by side, while they are open. Then it waits for the service to close each of them,
//! and measures the rate a third time: the rate with them open is compared with the mean of the
//! rates before and after, so that a machine that speeds up or slows down over the run (a
//! shared one does) biases neither way.
//! (Seven in eight stop in the body: a service that admits a request before its body has arrived
//! lets those hold its admission slots, the failure that takes a service down; the others stop
//! in the head, which costs a service without a head timeout a descriptor each, forever.)
//!
//! - `service.slow_clients`: the rate with the stalled connections open is at least
//!   `rate_ratio_min` of the rate without them (a service that lets a client hold its admission
//!   slots, or a thread per connection, falls to near zero);
//! - `service.stalled_closed`: every stalled connection is closed by the service within
//!   `closed_within` (a service without a read timeout keeps them, and their descriptors, until
//!   the client goes away).
//!
//! On a loopback target the stalled connections come from 127.0.0.2, 127.0.0.3, … (a few dozen
//! each), so that a per-address connection limit, which a service should have, does not refuse
//! them before they are open: the check is about what they cost once open.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Uri;
use reports::model::{InvariantResult, Judgement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use load::conn::{Conn, Target};

pub use crate::probe::Probe;
use crate::probe::{closed_now, loopback_source, socket_from};

/// `service.slow_clients`
pub const SLOW_CLIENTS: &str = "service.slow_clients";
/// `service.stalled_closed`
pub const STALLED_CLOSED: &str = "service.stalled_closed";

/// Stalled connections per source address on a loopback target.
const PER_SOURCE: usize = 50;

/// The slow-clients check a black-box run asks for (`--slow-clients N` of `scenario ids`,
/// `tcc` and `tokens`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowSpec {
    /// Stalled connections to open (0: no slow-clients check).
    pub stalled: usize,
    /// Keep-alive connections to hold from many addresses (0: no held-connections check,
    /// [`crate::held`]).
    pub held: usize,
    /// How long the server may keep one open.
    pub closed_within: Duration,
    /// Where the ones that stall in a body `POST` it (`None`: the measured request's path).
    pub stall_path: Option<String>,
}

impl SlowSpec {
    /// Whether the spec makes a check: a message naming `--slow-clients` otherwise.
    ///
    /// # Errors
    /// More than 10,000 stalled connections, more than [`crate::held::HELD_MAX`] held ones, or
    /// neither.
    pub fn validate(&self) -> Result<(), String> {
        if self.stalled > 10_000 {
            return Err(format!("--slow-clients {}: give 1 to 10000", self.stalled));
        }
        if self.held > crate::held::HELD_MAX {
            return Err(format!(
                "--held-clients {}: give 1 to {}",
                self.held,
                crate::held::HELD_MAX
            ));
        }
        if self.stalled == 0 && self.held == 0 {
            return Err("--slow-clients 0 --held-clients 0: give at least one connection".into());
        }
        Ok(())
    }

    /// The check against `url` (a base URL, plain HTTP), measuring `probe`: what it measured
    /// and its two checks.
    ///
    /// # Errors
    /// The URL is not plain HTTP, or the service answered nothing before the check.
    pub fn run(
        &self,
        url: &str,
        probe: Probe,
    ) -> Result<(SlowRun, Vec<InvariantResult>), SlowError> {
        let slow = run(&SlowOptions {
            closed_within: self.closed_within,
            stall_path: self.stall_path.clone(),
            held: self.held,
            ..SlowOptions::new(url, probe, self.stalled)
        })?;
        let checks = slow.checks();
        Ok((slow, checks))
    }
}

/// What to measure and how hard.
#[derive(Clone, Debug)]
pub struct SlowOptions {
    /// The service's base URL (plain HTTP).
    pub url: String,
    /// The request measured.
    pub probe: Probe,
    /// Where the connections that stall in the body send it (`POST`): a route whose handler
    /// reads a body (`None`: the probe's path).
    pub stall_path: Option<String>,
    /// Stalled connections to open.
    pub stalled: usize,
    /// Closed-loop connections measuring the rate.
    pub workers: usize,
    /// How long each rate is measured.
    pub window: Duration,
    /// The least rate with stalled connections open, as a share of the rate without.
    pub rate_ratio_min: f64,
    /// How long the service may keep a stalled connection open.
    pub closed_within: Duration,
    /// Keep-alive connections to hold from many addresses after the stalled ones are gone (0:
    /// none; [`crate::held`]).
    pub held: usize,
}

impl SlowOptions {
    /// `stalled` connections against `url`, measuring `probe`; 16 workers, 4 s windows, at
    /// least half the rate, each closed within 60 s.
    #[must_use]
    pub fn new(url: &str, probe: Probe, stalled: usize) -> Self {
        Self {
            url: url.to_owned(),
            probe,
            stall_path: None,
            stalled,
            workers: 16,
            window: Duration::from_secs(4),
            rate_ratio_min: 0.5,
            closed_within: Duration::from_secs(60),
            held: 0,
        }
    }
}

/// What the check measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SlowRun {
    /// Answers per second before the stalled connections were opened.
    pub rate_before_per_s: f64,
    /// Answers per second after the service closed them (or `closed_within` passed).
    pub rate_after_per_s: f64,
    /// Answers per second with them open.
    pub rate_during_per_s: f64,
    /// Requests of the second window that got no answer (refused, broken, timed out).
    pub failed_during: u64,
    /// Stalled connections opened.
    pub opened: usize,
    /// Stalled connections the service refused or closed before the second window began.
    pub closed_early: usize,
    /// How long the service took to close each stalled connection, ms (`None`: still open
    /// after `closed_within`).
    pub closed_after_ms: Vec<Option<u64>>,
    /// The options' thresholds, for the report.
    pub rate_ratio_min: f64,
    /// The options' bound, ms.
    pub closed_within_ms: u64,
    /// Whether the stalled connections were opened (`false`: only the held-connections check
    /// ran, and the rates above are not measured).
    pub stalled_checked: bool,
    /// What the held-connections check measured ([`crate::held`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::held::HeldRun>,
}

/// Why the check could not be made (not a verdict).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SlowError(pub String);

impl SlowRun {
    /// The rate without stalled connections: the mean of the rates before and after them.
    #[must_use]
    pub fn rate_without_per_s(&self) -> f64 {
        f64::midpoint(self.rate_before_per_s, self.rate_after_per_s)
    }

    /// The rate with stalled connections open, as a share of the rate without.
    #[must_use]
    pub fn ratio(&self) -> f64 {
        let without = self.rate_without_per_s();
        if without > 0.0 {
            self.rate_during_per_s / without
        } else {
            0.0
        }
    }

    /// The longest time a stalled connection stayed open, ms (`None` when one never closed).
    #[must_use]
    pub fn longest_open_ms(&self) -> Option<u64> {
        self.closed_after_ms
            .iter()
            .try_fold(0, |max, c| c.map(|ms| max.max(ms)))
    }

    /// The checks: the slow-clients two when stalled connections were opened, the
    /// held-connections one when connections were held.
    #[must_use]
    pub fn checks(&self) -> Vec<InvariantResult> {
        let mut checks = if self.stalled_checked {
            self.stalled_checks()
        } else {
            Vec::new()
        };
        checks.extend(self.held.as_ref().map(crate::held::HeldRun::check));
        checks
    }

    fn stalled_checks(&self) -> Vec<InvariantResult> {
        let ratio = self.ratio();
        let rate = InvariantResult {
            name: SLOW_CLIENTS.into(),
            verdict: if ratio >= self.rate_ratio_min {
                Judgement::Held
            } else {
                Judgement::Violated
            },
            seed: None,
            first_offending_event: (ratio < self.rate_ratio_min).then(|| {
                format!(
                    "with {} stalled connections open the service answered {:.0}/s, {:.2} of \
                     its {:.0}/s without them (at least {:.2} expected)",
                    self.opened,
                    self.rate_during_per_s,
                    ratio,
                    self.rate_before_per_s,
                    self.rate_ratio_min
                )
            }),
            detail: Some(format!(
                "{:.0}/s before, {:.0}/s with {} stalled connections open, {:.0}/s after (ratio \
                 {ratio:.3}, {} requests failed)",
                self.rate_before_per_s,
                self.rate_during_per_s,
                self.opened,
                self.rate_after_per_s,
                self.failed_during
            )),
        };
        let still_open = self.closed_after_ms.iter().filter(|c| c.is_none()).count();
        let closed = InvariantResult {
            name: STALLED_CLOSED.into(),
            verdict: if still_open == 0 {
                Judgement::Held
            } else {
                Judgement::Violated
            },
            seed: None,
            first_offending_event: (still_open > 0).then(|| {
                format!(
                    "{still_open} of {} stalled connections were still open {} ms after they \
                     stopped sending: the service has no read timeout",
                    self.opened, self.closed_within_ms
                )
            }),
            detail: self
                .longest_open_ms()
                .map(|ms| format!("every stalled connection closed, the last after {ms} ms")),
        };
        vec![rate, closed]
    }
}

/// The source address of stalled connection `i` on a loopback target (127.0.0.2 on, a few
/// dozen each); `None` elsewhere (the system picks).
fn source(target: SocketAddr, i: usize) -> Option<IpAddr> {
    loopback_source(target, i, PER_SOURCE)
}

/// Opens stalled connection `i`: part of a request (a head to `path`, or a body to
/// `post_path`), then nothing.
async fn stall(
    target: SocketAddr,
    host: &str,
    (path, post_path): (&str, &str),
    i: usize,
) -> std::io::Result<TcpStream> {
    let socket = socket_from(target, source(target, i))?;
    let mut tcp = socket.connect(target).await?;
    let part = if i.is_multiple_of(8) {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Slow: ")
    } else {
        format!(
            "POST {post_path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{\"sl"
        )
    };
    tcp.write_all(part.as_bytes()).await?;
    Ok(tcp)
}

/// Answers per second to `probe` (its path parsed: `path`) over `workers` closed-loop
/// connections for `window`, and the requests that got none.
pub(crate) async fn rate(
    target: &Target,
    (probe, path): (&Probe, &Uri),
    workers: usize,
    window: Duration,
) -> (f64, u64) {
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (target, path, probe) = (target.clone(), path.clone(), probe.clone());
            let (answered, failed, stop) = (
                Arc::clone(&answered),
                Arc::clone(&failed),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut conn = Conn::default();
                while !stop.load(Ordering::Relaxed) {
                    let served = probe
                        .ask(&mut conn, &target, &path, Duration::from_secs(5))
                        .await;
                    let counter = if served { &answered } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
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
    (
        answered.load(Ordering::Relaxed) as f64 / elapsed_s.max(1e-9),
        failed.load(Ordering::Relaxed),
    )
}

/// Waits until the service closes `tcp`, at most `within`; how long that took.
async fn until_closed(mut tcp: TcpStream, since: Instant, within: Duration) -> Option<u64> {
    let mut buf = [0u8; 512];
    let deadline = since + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => {
                return Some(u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX));
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// Runs the check.
///
/// # Errors
/// The URL is not plain HTTP, or the service answered nothing before the check.
pub fn run(opts: &SlowOptions) -> Result<SlowRun, SlowError> {
    let base = reqwest::Url::parse(&opts.url)
        .map_err(|e| SlowError(format!("--url {}: {e}", opts.url)))?;
    let target = Target::of(&base).ok_or_else(|| {
        SlowError(format!(
            "--slow-clients needs a plain http:// URL, not {base}"
        ))
    })?;
    let addr = load::conn::socket_addr(&opts.url).map_err(|e| SlowError(e.to_string()))?;
    let host = format!(
        "{}:{}",
        base.host_str().unwrap_or_default(),
        base.port_or_known_default().unwrap_or(80)
    );
    let path: Uri = opts
        .probe
        .path
        .parse()
        .map_err(|e| SlowError(format!("path {}: {e}", opts.probe.path)))?;
    let probe = (&opts.probe, &path);
    let rt = crate::real::runtime().map_err(|e| SlowError(e.to_string()))?;
    rt.block_on(async {
        let mut slow = if opts.stalled > 0 {
            stalled(opts, &target, addr, &host, probe).await?
        } else {
            SlowRun {
                rate_ratio_min: opts.rate_ratio_min,
                ..SlowRun::default()
            }
        };
        if opts.held > 0 {
            let held = crate::held::run(&crate::held::HeldOptions {
                target: &target,
                addr,
                host: &host,
                probe,
                held: opts.held,
                window: opts.window,
            })
            .await;
            if held.rate_before_per_s <= 0.0 {
                return Err(SlowError(format!(
                    "{} {}{}: no answer before the connections were held",
                    opts.probe.method, opts.url, opts.probe.path
                )));
            }
            slow.held = Some(held);
        }
        Ok(slow)
    })
}

/// The slow-clients part: the rates before, with and after the stalled connections, and when
/// each was closed.
async fn stalled(
    opts: &SlowOptions,
    target: &Target,
    addr: SocketAddr,
    host: &str,
    probe: (&Probe, &Uri),
) -> Result<SlowRun, SlowError> {
    let (before, _) = rate(target, probe, opts.workers, opts.window).await;
    if before <= 0.0 {
        return Err(SlowError(format!(
            "{} {}{}: no answer before the stalled connections were opened",
            opts.probe.method, opts.url, opts.probe.path
        )));
    }
    let mut stalled = Vec::with_capacity(opts.stalled);
    let mut refused = 0;
    let post_path = opts.stall_path.as_deref().unwrap_or(&opts.probe.path);
    for i in 0..opts.stalled {
        match stall(addr, host, (&opts.probe.path, post_path), i).await {
            Ok(tcp) => stalled.push(tcp),
            Err(_) => refused += 1,
        }
    }
    let since = Instant::now();
    // The service takes in the new connections first (a burst of accepts, heads and
    // bodies to read); what is measured is what they cost once open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut closed_early = refused;
    for tcp in &mut stalled {
        closed_early += usize::from(closed_now(tcp));
    }
    let (during, failed_during) = rate(target, probe, opts.workers, opts.window).await;
    let waits: Vec<_> = stalled
        .into_iter()
        .map(|tcp| tokio::spawn(until_closed(tcp, since, opts.closed_within)))
        .collect();
    let mut closed_after_ms = Vec::with_capacity(waits.len());
    for w in waits {
        closed_after_ms.push(w.await.unwrap_or(None));
    }
    let (after, _) = rate(target, probe, opts.workers, opts.window).await;
    Ok(SlowRun {
        rate_before_per_s: before,
        rate_after_per_s: after,
        rate_during_per_s: during,
        failed_during,
        opened: opts.stalled - refused,
        closed_early,
        closed_after_ms,
        rate_ratio_min: opts.rate_ratio_min,
        closed_within_ms: u64::try_from(opts.closed_within.as_millis()).unwrap_or(u64::MAX),
        stalled_checked: true,
        held: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(before: f64, during: f64, closed: Vec<Option<u64>>) -> SlowRun {
        SlowRun {
            rate_before_per_s: before,
            rate_after_per_s: before,
            rate_during_per_s: during,
            opened: closed.len(),
            closed_after_ms: closed,
            rate_ratio_min: 0.5,
            closed_within_ms: 60_000,
            stalled_checked: true,
            ..SlowRun::default()
        }
    }

    #[test]
    fn the_checks_fire_on_a_service_that_falls_or_keeps_stalled_connections() {
        let good = run_of(1000.0, 950.0, vec![Some(10_000), Some(10_200)]);
        assert!(good.checks().iter().all(|c| c.verdict == Judgement::Held));
        assert_eq!(good.longest_open_ms(), Some(10_200));
        // The finding of docs/hostile.md: 1,406 answers/s before, none during, none closed.
        let bad = run_of(1406.0, 0.0, vec![None, Some(5)]);
        let checks = bad.checks();
        assert_eq!(checks[0].name, SLOW_CLIENTS);
        assert_eq!(checks[0].verdict, Judgement::Violated);
        assert!(
            checks[0]
                .first_offending_event
                .as_deref()
                .unwrap()
                .contains("0.00 of its 1406/s"),
            "{checks:?}"
        );
        assert_eq!(checks[1].name, STALLED_CLOSED);
        assert_eq!(checks[1].verdict, Judgement::Violated);
        assert_eq!(bad.longest_open_ms(), None);
    }

    #[test]
    fn stalled_connections_spread_over_loopback_sources() {
        let lo: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(source(lo, 0), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(source(lo, PER_SOURCE), Some("127.0.0.3".parse().unwrap()));
        assert_eq!(source("10.0.0.1:80".parse().unwrap(), 0), None);
    }
}
