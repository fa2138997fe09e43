//! The unauthenticated-bodies check (`--unauth-bodies N` of `scenario tokens` and `tcc`): does a
//! service read, and hold, the body of a request whose credential it has not accepted?
//!
//! `requests` connections at once (on a loopback target from 127.0.0.2, 127.0.0.3, …, a thousand
//! each, so that a per-address limit does not refuse them first) each `POST` to a route that
//! takes a credential, presenting none: the head announces a body of `body_bytes` and all of it
//! but the last byte is sent. A service that decides the credential from the head answers at
//! once (401, 403; a 413 decided from the announced length is as good) and never needs the body;
//! one that reads the body first waits for the byte that never comes, until its body timeout
//! (408) or for good, and holds what it has read meanwhile: a quarter of a megabyte per request
//! by default, from a client that proved nothing.
//!
//! - `service.refused_from_head`: every request refused (a 4xx other than 408) within
//!   `answer_within`, before its body was complete. Accepted (2xx) with no credential, 408, a
//!   5xx, a close without an answer or no answer in time violates it; the first is named.
//! - `service.unauthenticated_memory`: when the bench started the service (its pid known; write
//!   `exec` in `--server-cmd` so that the pid is the service's, not a shell's), its resident
//!   memory (`VmRSS` of `/proc/PID/status`) at its peak while the requests are open is at most
//!   `memory_max_bytes` above what it was before them: by default half the bytes the requests
//!   sent, since a service that keeps the bodies grows by at least their size and one that
//!   refuses from the head only by its connections' own cost (1 MiB for a thousand in
//!   `sut-server`'s release build, 66 MiB in its debug build). Not checked otherwise, and said
//!   so.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reports::model::{InvariantResult, Judgement};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `service.refused_from_head`
pub const REFUSED_FROM_HEAD: &str = "service.refused_from_head";
/// `service.unauthenticated_memory`
pub const UNAUTHENTICATED_MEMORY: &str = "service.unauthenticated_memory";

/// Connections per source address on a loopback target.
const PER_SOURCE: usize = 1_000;
/// At most this many requests at once.
pub const REQUESTS_MAX: usize = 8_000;

/// The check a black-box run asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodiesSpec {
    /// Requests at once, each on its own connection.
    pub requests: usize,
    /// The body each announces (all but its last byte sent).
    pub body_bytes: usize,
    /// How long a request may wait for its refusal.
    pub answer_within: Duration,
    /// The most the service's resident memory may grow while the requests are open.
    pub memory_max_bytes: u64,
}

impl BodiesSpec {
    /// `requests` at once, bodies of 256 KiB, refused within 5 s, memory grown by at most half
    /// of what the bodies sent.
    #[must_use]
    pub const fn new(requests: usize) -> Self {
        let body_bytes = 256 * 1024;
        Self {
            requests,
            body_bytes,
            answer_within: Duration::from_secs(5),
            memory_max_bytes: (requests as u64) * (body_bytes as u64) / 2,
        }
    }

    /// Whether the spec makes a check: a message naming `--unauth-bodies` otherwise.
    ///
    /// # Errors
    /// Fewer than 1 or more than [`REQUESTS_MAX`] requests.
    pub fn validate(&self) -> Result<(), String> {
        if (1..=REQUESTS_MAX).contains(&self.requests) {
            Ok(())
        } else {
            Err(format!(
                "--unauth-bodies {}: give 1 to {REQUESTS_MAX}",
                self.requests
            ))
        }
    }
}

/// What the check saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BodiesRun {
    /// The route posted to.
    pub path: String,
    /// Requests made.
    pub requests: usize,
    /// The body each announced, bytes.
    pub body_bytes: usize,
    /// How the requests ended: a status (`401`), `no answer`, `closed` (without an answer) or
    /// `not connected`, and how many of each.
    pub answers: BTreeMap<String, u64>,
    /// The first request that was not refused from the head, in words.
    pub first_bad: Option<String>,
    /// The service's resident memory before the requests, at its peak while they were open
    /// and once they were over, bytes (`None`: its pid not known).
    pub rss_bytes: Option<(u64, u64, u64)>,
    /// The spec's bound on the growth.
    pub memory_max_bytes: u64,
    /// The spec's wait for a refusal, ms.
    pub answer_within_ms: u64,
}

/// How one request ended.
enum Ended {
    Status(u16),
    Closed,
    NoAnswer,
    NotConnected,
}

impl Ended {
    fn key(&self) -> String {
        match self {
            Self::Status(s) => s.to_string(),
            Self::Closed => "closed".into(),
            Self::NoAnswer => "no answer".into(),
            Self::NotConnected => "not connected".into(),
        }
    }

    /// A refusal decided from the head: a 4xx other than 408 (which says the body was waited
    /// for).
    const fn refused_from_head(&self) -> bool {
        matches!(self, Self::Status(s) if *s >= 400 && *s < 500 && *s != 408)
    }
}

impl BodiesRun {
    /// How many requests were refused from the head.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.answers
            .iter()
            .filter(|(k, _)| {
                k.parse::<u16>()
                    .is_ok_and(|s| Ended::Status(s).refused_from_head())
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// What the requests got, in words: `8000 × 401`.
    #[must_use]
    pub fn answers_line(&self) -> String {
        let parts: Vec<String> = self
            .answers
            .iter()
            .map(|(k, n)| format!("{n} × {k}"))
            .collect();
        format!(
            "{} POST {} with no credential and {} of {} body bytes: {}",
            self.requests,
            self.path,
            self.body_bytes.saturating_sub(1),
            self.body_bytes,
            parts.join(", ")
        )
    }

    /// The two checks.
    #[must_use]
    pub fn checks(&self) -> Vec<InvariantResult> {
        vec![self.refused_check(), self.memory_check()]
    }

    fn refused_check(&self) -> InvariantResult {
        let all = self.refused() == self.requests as u64 && self.requests > 0;
        let not_connected = self.answers.get("not connected").copied().unwrap_or(0);
        let (verdict, first) = if all {
            (Judgement::Held, None)
        } else if not_connected == self.requests as u64 {
            (
                Judgement::NotChecked,
                Some(format!(
                    "none of the {} connections was accepted: nothing was asked",
                    self.requests
                )),
            )
        } else {
            (
                Judgement::Violated,
                Some(self.first_bad.clone().unwrap_or_else(|| {
                    format!(
                        "{} of {} requests were not refused from the head",
                        self.requests as u64 - self.refused(),
                        self.requests
                    )
                })),
            )
        };
        InvariantResult {
            name: REFUSED_FROM_HEAD.into(),
            verdict,
            seed: None,
            first_offending_event: first,
            detail: Some(format!(
                "{} (a refusal within {} ms expected)",
                self.answers_line(),
                self.answer_within_ms
            )),
        }
    }

    fn memory_check(&self) -> InvariantResult {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let (verdict, first, detail) = match self.rss_bytes {
            None => (
                Judgement::NotChecked,
                Some(
                    "the service's pid is not known: the bench reads its memory only when it \
                     started the service (--server-cmd, with exec)"
                        .to_owned(),
                ),
                None,
            ),
            Some((before, peak, after)) => {
                let grown = peak.saturating_sub(before);
                let detail = format!(
                    "resident memory {:.0} MiB before, {:.0} MiB at the peak, {:.0} MiB after \
                     (at most {:.0} MiB more allowed)",
                    mib(before),
                    mib(peak),
                    mib(after),
                    mib(self.memory_max_bytes)
                );
                if grown <= self.memory_max_bytes {
                    (Judgement::Held, None, Some(detail))
                } else {
                    let per_request = grown / (self.requests.max(1) as u64);
                    (
                        Judgement::Violated,
                        Some(format!(
                            "{} requests with no credential made the service {:.0} MiB larger \
                             ({} KiB each, of {} KiB bodies sent): bodies it had not authorised \
                             cost it memory",
                            self.requests,
                            mib(grown),
                            per_request / 1024,
                            self.body_bytes / 1024
                        )),
                        Some(detail),
                    )
                }
            }
        };
        InvariantResult {
            name: UNAUTHENTICATED_MEMORY.into(),
            verdict,
            seed: None,
            first_offending_event: first,
            detail,
        }
    }
}

/// The resident memory of `pid`, bytes (`None`: gone, or no `/proc`).
#[must_use]
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The source address of connection `i` on a loopback target (127.0.0.2 on, a thousand each).
fn source(target: SocketAddr, i: usize) -> Option<IpAddr> {
    crate::probe::loopback_source(target, i, PER_SOURCE)
}

/// Connections being opened at once: a burst of a thousand connects overflows a listen queue
/// (the kernel then resets connections the service never saw), which is not what is judged.
const CONNECTING_MAX: usize = 32;

/// One request: the head, all of the body but its last byte, then the answer's status line.
async fn one(
    target: SocketAddr,
    (head, body): (Arc<Vec<u8>>, Arc<Vec<u8>>),
    connecting: Arc<tokio::sync::Semaphore>,
    i: usize,
) -> Ended {
    let Ok(socket) = crate::probe::socket_from(target, source(target, i)) else {
        return Ended::NotConnected;
    };
    let Ok(turn) = connecting.acquire_owned().await else {
        return Ended::NotConnected;
    };
    let Ok(tcp) = socket.connect(target).await else {
        return Ended::NotConnected;
    };
    // The service has accepted it once it answers or reads: a short pause lets the next
    // connects through without a queue of them.
    tokio::time::sleep(Duration::from_millis(2)).await;
    drop(turn);
    let (mut read, mut write) = tcp.into_split();
    // The body is written beside the read: a service that refuses from the head never reads
    // it, and the write then stalls on full buffers or fails on the close.
    let writer = tokio::spawn(async move {
        if write.write_all(&head).await.is_ok() {
            let _ = write.write_all(&body[..body.len().saturating_sub(1)]).await;
        }
        // Held open (the last byte never sent) until the reader is done.
        std::future::pending::<()>().await;
        drop(write);
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let ended = loop {
        match read.read(&mut buf).await {
            Ok(0) | Err(_) => break status_of(&got).map_or(Ended::Closed, Ended::Status),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if let Some(s) = status_of(&got) {
                    break Ended::Status(s);
                }
            }
        }
    };
    writer.abort();
    ended
}

/// Descriptors the check keeps beyond its connections (the runtime's, the client's own).
const FILES_SPARE: u64 = 64;

/// Makes sure this process may hold `connections` sockets, raising its soft open-file limit
/// where the hard one allows: a connect refused for want of a descriptor would read as a
/// service that closed it.
fn room_for(connections: usize) -> Result<(), String> {
    let need = connections as u64 + FILES_SPARE;
    match chaos::raise_open_file_limit() {
        Some(limit) if limit < need => Err(format!(
            "--unauth-bodies {connections} needs {need} open files and this process may open \
             {limit} (ulimit -n): give fewer, or raise the limit"
        )),
        _ => Ok(()),
    }
}

/// The status of an HTTP/1.x status line at the start of `got`, once it has arrived.
fn status_of(got: &[u8]) -> Option<u16> {
    let line_end = got.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&got[..line_end]).ok()?;
    let mut parts = line.split(' ');
    parts.next().filter(|v| v.starts_with("HTTP/1."))?;
    parts.next()?.parse().ok()
}

/// The check against `url` (a base URL, plain HTTP), posting to `path`; `pid` the service's
/// when the bench started it.
///
/// # Errors
/// The URL is not plain HTTP, or the spec is out of range.
pub fn run(
    spec: &BodiesSpec,
    url: &str,
    path: &str,
    pid: Option<u32>,
) -> Result<BodiesRun, String> {
    spec.validate()?;
    room_for(spec.requests)?;
    let base = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
    if base.scheme() != "http" {
        return Err(format!(
            "--unauth-bodies needs a plain http:// URL, not {base}"
        ));
    }
    let target = load::conn::socket_addr(url).map_err(|e| e.to_string())?;
    let host = format!(
        "{}:{}",
        base.host_str().unwrap_or_default(),
        base.port_or_known_default().unwrap_or(80)
    );
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        spec.body_bytes
    );
    // A JSON string of the announced length: `{"pad":"xxx…"}`.
    let mut body = b"{\"pad\":\"".to_vec();
    body.resize(spec.body_bytes.saturating_sub(2).max(body.len()), b'x');
    body.extend_from_slice(b"\"}");
    let (head, body) = (Arc::new(head.into_bytes()), Arc::new(body));
    let rt = crate::real::runtime().map_err(|e| e.to_string())?;
    let before = pid.and_then(rss_bytes);
    let peak = Arc::new(AtomicU64::new(before.unwrap_or(0)));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = pid.map(|pid| {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(now) = rss_bytes(pid) {
                    peak.fetch_max(now, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    });
    let connecting = Arc::new(tokio::sync::Semaphore::new(CONNECTING_MAX));
    let ended: Vec<(usize, Ended, Duration)> = rt.block_on(async {
        let tasks: Vec<_> = (0..spec.requests)
            .map(|i| {
                let request = (Arc::clone(&head), Arc::clone(&body));
                let connecting = Arc::clone(&connecting);
                let within = spec.answer_within;
                tokio::spawn(async move {
                    // The wait includes the turn to connect (32 at a time, 2 ms each).
                    let t = Instant::now();
                    let ended = tokio::time::timeout(within, one(target, request, connecting, i))
                        .await
                        .unwrap_or(Ended::NoAnswer);
                    (i, ended, t.elapsed())
                })
            })
            .collect();
        let mut ended = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(e) = t.await {
                ended.push(e);
            }
        }
        ended
    });
    done.store(true, Ordering::Relaxed);
    if let Some(s) = sampler {
        let _ = s.join();
    }
    let after = pid.and_then(rss_bytes);
    let mut run = BodiesRun {
        path: path.to_owned(),
        requests: spec.requests,
        body_bytes: spec.body_bytes,
        memory_max_bytes: spec.memory_max_bytes,
        answer_within_ms: u64::try_from(spec.answer_within.as_millis()).unwrap_or(u64::MAX),
        rss_bytes: before
            .zip(after)
            .map(|(b, a)| (b, peak.load(Ordering::Relaxed).max(a), a)),
        ..BodiesRun::default()
    };
    for (i, e, took) in &ended {
        *run.answers.entry(e.key()).or_default() += 1;
        if run.first_bad.is_none() && !e.refused_from_head() {
            let from = source(target, *i).map_or_else(String::new, |ip| format!(" from {ip}"));
            run.first_bad = Some(format!(
                "request {}{from} (POST {path}, no credential, {} of {} body bytes sent): {} after \
                 {} ms{}",
                i + 1,
                spec.body_bytes.saturating_sub(1),
                spec.body_bytes,
                match e {
                    Ended::Status(s) => format!("answered {s}"),
                    Ended::Closed => "closed without an answer".into(),
                    Ended::NoAnswer => "no answer".into(),
                    Ended::NotConnected => "not connected".into(),
                },
                took.as_millis(),
                match e {
                    Ended::Status(s) if (200..300).contains(s) => ": accepted with no credential",
                    Ended::Status(408) | Ended::NoAnswer =>
                        ": the service waited for the body of a request it had not authorised",
                    _ => "",
                }
            ));
        }
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(answers: &[(&str, u64)], rss: Option<(u64, u64, u64)>) -> BodiesRun {
        BodiesRun {
            path: "/admin/accounts".into(),
            requests: usize::try_from(answers.iter().map(|(_, n)| n).sum::<u64>()).unwrap(),
            body_bytes: 256 * 1024,
            answers: answers.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
            first_bad: None,
            rss_bytes: rss,
            memory_max_bytes: 64 << 20,
            answer_within_ms: 5_000,
        }
    }

    #[test]
    fn refusals_from_the_head_hold_and_a_wait_for_the_body_fires() {
        let good = run_of(
            &[("401", 900), ("413", 100)],
            Some((12 << 20, 40 << 20, 30 << 20)),
        );
        let checks = good.checks();
        assert_eq!(checks[0].verdict, Judgement::Held, "{:?}", checks[0]);
        assert_eq!(checks[1].verdict, Judgement::Held, "{:?}", checks[1]);
        // The server that reads the body first: 408 after its body timeout.
        let waited = run_of(&[("401", 10), ("408", 990)], None);
        assert_eq!(waited.checks()[0].verdict, Judgement::Violated);
        // Accepted with no credential, or no answer at all, is no refusal either.
        for bad in ["200", "no answer", "closed", "503"] {
            let run = run_of(&[("401", 5), (bad, 1)], None);
            assert_eq!(run.checks()[0].verdict, Judgement::Violated, "{bad}");
        }
        // Nothing connected: nothing was asked.
        let none = run_of(&[("not connected", 10)], None);
        assert_eq!(none.checks()[0].verdict, Judgement::NotChecked);
    }

    #[test]
    fn memory_kept_for_unauthorised_bodies_fires_and_an_unknown_pid_is_not_a_pass() {
        let fat = run_of(&[("408", 1_000)], Some((12 << 20, 560 << 20, 500 << 20)));
        let check = &fat.checks()[1];
        assert_eq!(check.verdict, Judgement::Violated);
        let first = check.first_offending_event.as_deref().unwrap();
        assert!(first.contains("548 MiB larger"), "{first}");
        assert!(first.contains("561 KiB each"), "{first}");
        let unknown = run_of(&[("401", 10)], None);
        let check = &unknown.checks()[1];
        assert_eq!(check.verdict, Judgement::NotChecked);
        assert!(
            check
                .first_offending_event
                .as_deref()
                .unwrap()
                .contains("pid")
        );
    }

    #[test]
    fn status_lines_are_read_whole() {
        assert_eq!(status_of(b"HTTP/1.1 401 Unauthorized\r\n"), Some(401));
        assert_eq!(status_of(b"HTTP/1.1 401 Unauth"), None);
        assert_eq!(status_of(b"SSH-2.0\r\n"), None);
        assert!(
            BodiesSpec::new(0)
                .validate()
                .unwrap_err()
                .contains("--unauth-bodies 0")
        );
        assert!(BodiesSpec::new(REQUESTS_MAX).validate().is_ok());
    }
}
