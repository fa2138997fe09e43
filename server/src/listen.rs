//! The accept loop: what a client can hold on this server, and for how long.
//!
//! A connection is a resource a hostile client holds for free unless something bounds it. Here:
//!
//! - **at most `connections_max` connections** at once, and **at most `per_peer_max` from one
//!   address**; a new connection beyond either takes the place of an idle one ([`crate::conns`]:
//!   the longest idle of the largest holder, counted in `sut_connections_evicted_total`), or is
//!   closed at once when no connection is idle (`sut_connections_refused_*_total`), before a
//!   byte of it is read;
//! - **the request head within `header_read_ms`** of the connection becoming idle (hyper's
//!   `header_read_timeout`, which also runs between two requests of a keep-alive connection: an
//!   idle connection is closed after it, and a head dribbled a byte at a time is cut off by it);
//! - **the request body within `body_read_ms`**, read whole before the request is admitted
//!   ([`read_body`]: the admission slot is taken only for a complete request; a body that does
//!   not arrive in time is answered 408 and the connection closed).
//!
//! So stalled connections cost a file descriptor and a little memory each, up to the bounds,
//! and never an admission slot (`crate::admission`), which only complete requests take.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use http_body_util::{BodyExt, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::conns::{Book, Caps, Place, Refused};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// A planted weakness of the deployed server (`sut-server --weakness`): TEST ONLY, what the
/// bench's hostile-client checks must catch (docs/hostile.md). Not a flaw of the protocol
/// (`sut::flaw`): what it breaks (the accept loop, the randomness of token values, the quota of
/// one client) is the server's, which the simulator does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Weakness {
    /// The accept loop as it was: no head or body read timeout, and the admission slot taken
    /// before the body is read.
    #[value(name = "no_read_timeout")]
    NoReadTimeout,
    /// One-time token values from a counter instead of 128 random bits: a client that holds
    /// one can name its neighbours (`scenario tokens`: `tokens.unguessable`).
    #[value(name = "sequential_tokens")]
    SequentialTokens,
    /// No per-user rate on issuing one-time tokens: one user can fill the table for everyone
    /// (`scenario tokens`: `tokens.quota`).
    #[value(name = "no_token_quota")]
    NoTokenQuota,
    /// A connection's slots (the process's and its peer address's) given back only when the
    /// connection ends cleanly: one the client broke off (a reset, a close mid-request) or
    /// that timed out keeps them, so every client that gives up costs capacity for good
    /// (`service.capacity_after_overload`).
    #[value(name = "conn_slot_leak")]
    ConnSlotLeak,
    /// A segment allocation of the PostgreSQL and MariaDB stores that lost a serialization
    /// race falls back to an unguarded one: the tag row read in one
    /// transaction, `max_id = read + step` written in the next with no version compare (the
    /// lease written over another's), and two servers reloading at once take the same range.
    /// Contention makes allocations lose races in a row all the time (`scenario cluster_pg
    /// --contention`).
    #[value(name = "unguarded_fallback")]
    UnguardedFallback,
    /// The thread whose take found the published block used up refills it, then takes a fresh
    /// value instead of issuing the one it already drew: one segment ID skipped at every
    /// refill (`ids.gaps`).
    #[value(name = "skip_on_refill")]
    SkipOnRefill,
    /// A take whose value lies past the block another thread has just published answers that
    /// block's last ID (another thread's) instead of taking the next block: only blocks smaller
    /// than the takes racing for them reach it (`take_past_block`, which `paths.reached` of the
    /// contention mode names).
    #[value(name = "past_block_repeat")]
    PastBlockRepeat,
    /// Every admitted route's body read whole (up to 256 KiB, the largest any route takes)
    /// before its credential is looked at, as it was: a client with no credential makes the
    /// server hold a quarter of a megabyte per request, and a stalled body on an admin route
    /// waits for the body timeout instead of an immediate 401.
    #[value(name = "body_before_auth")]
    BodyBeforeAuth,
    /// A full server refuses every new connection, as it did: idle keep-alive connections
    /// never give way, so clients that hold connections from a few addresses lock every other
    /// address out (`service.new_client_when_full`).
    #[value(name = "no_eviction")]
    NoEviction,
}

impl Weakness {
    /// The name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoReadTimeout => "no_read_timeout",
            Self::SequentialTokens => "sequential_tokens",
            Self::NoTokenQuota => "no_token_quota",
            Self::ConnSlotLeak => "conn_slot_leak",
            Self::UnguardedFallback => "unguarded_fallback",
            Self::SkipOnRefill => "skip_on_refill",
            Self::PastBlockRepeat => "past_block_repeat",
            Self::BodyBeforeAuth => "body_before_auth",
            Self::NoEviction => "no_eviction",
        }
    }
}

/// What one client may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once.
    pub connections_max: usize,
    /// Connections open at once from one peer address.
    pub per_peer_max: usize,
    /// How long a request head may take to arrive, from the moment the connection is idle (a
    /// keep-alive connection idle for longer is closed); 0: no limit (the planted weakness).
    pub header_read_ms: u64,
    /// How long a request body may take to arrive once its head has; 0: no limit, and the body
    /// is read only after admission (the planted weakness).
    pub body_read_ms: u64,
    /// How long a connection must have been idle (connected or answered, with no request in
    /// flight) before it gives way to a new one when the server or its address is full.
    pub idle_grace_ms: u64,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            connections_max: 8_192,
            per_peer_max: 512,
            header_read_ms: 10_000,
            body_read_ms: 10_000,
            idle_grace_ms: 1_000,
        }
    }
}

impl ConnLimits {
    /// These limits, with `connections_max` lowered to what the process's open-file limit
    /// leaves room for (with `reserve` descriptors kept for its stores and clients), once that
    /// limit is raised as far as the process may.
    #[must_use]
    pub fn within_open_files(self, reserve: u64) -> Self {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
            return self;
        };
        // The soft limit is first raised to the hard one, as Go's runtime does at start (the
        // kernel takes at most `nr_open`, so an unlimited hard limit is not asked for).
        let wanted = hard.min(1 << 20);
        let soft = if soft < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
            wanted
        } else {
            soft
        };
        let room = usize::try_from(soft.saturating_sub(reserve)).unwrap_or(usize::MAX);
        Self {
            connections_max: self.connections_max.min(room.max(1)),
            ..self
        }
    }
}

/// Connections the kernel may hold for the accept loop (its listen queue; the kernel caps it
/// at `net.core.somaxconn`). The usual 128 overflowed whenever a few hundred clients connected
/// at once: the kernel dropped their handshakes, and each such client waited a second to try
/// again.
pub const LISTEN_BACKLOG: u32 = 4_096;

/// A listener on `addr` with a listen queue of [`LISTEN_BACKLOG`].
///
/// # Errors
/// The address cannot be bound.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How the accept loop serves: its limits, TLS (or plain HTTP), its counters.
#[derive(Clone)]
pub struct Listener {
    /// What one client may hold.
    pub limits: ConnLimits,
    /// TLS on every connection (`None`: plain HTTP). The handshake must end within the head
    /// timeout.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The planted weakness `conn_slot_leak` (TEST ONLY; `false`: every connection gives its
    /// slots back however it ends).
    pub conn_slot_leak: bool,
    /// Whether idle connections give way to new ones when the server or an address is full
    /// (`false`: the planted weakness `no_eviction`, TEST ONLY).
    pub evict_idle: bool,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("limits", &self.limits)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// Serves `app` on `listener` until `stop` turns true; then stops accepting, lets the requests
/// in progress finish (idle connections close at once) and returns.
///
/// # Errors
/// Never for a failed accept (logged and retried: a full descriptor table must not stop the
/// server); only what a future version might add.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    how: Listener,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Listener {
        limits,
        tls,
        metrics,
        conn_slot_leak,
        evict_idle,
    } = how;
    let book = Book::new(Caps {
        connections_max: limits.connections_max,
        per_peer_max: limits.per_peer_max,
        evict_idle,
        idle_grace: Duration::from_millis(limits.idle_grace_ms),
    });
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE, ECONNABORTED, ...: the listener is still good.
                eprintln!("sut-server: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let place = match book.admit(peer.ip(), Instant::now()) {
            Ok(place) => place,
            Err(why) => {
                let refused = match why {
                    Refused::Full => &metrics.connections_refused_full,
                    Refused::Peer => &metrics.connections_refused_peer,
                };
                refused.fetch_add(1, Ordering::Relaxed);
                continue; // dropped: closed before anything is read
            }
        };
        if place.made_room {
            metrics.connections_evicted.fetch_add(1, Ordering::Relaxed);
        }
        // Answers go out at once: without TCP_NODELAY a response written in two parts can wait
        // for the client's delayed ACK (tens of milliseconds). A socket that refuses the option
        // still serves, only slower.
        let _ = tcp.set_nodelay(true);
        let (app, metrics, stop, tls) =
            (app.clone(), Arc::clone(&metrics), stop.clone(), tls.clone());
        connections.spawn(async move {
            let place = Arc::new(place);
            metrics.connections_open.fetch_add(1, Ordering::Relaxed);
            let conn = (peer, &place);
            let clean = match tls {
                None => serve_connection(tcp, conn, app, limits, &metrics, stop).await,
                Some(acceptor) => {
                    // The handshake is part of the head: it must end within the head timeout.
                    let deadline = Duration::from_millis(match limits.header_read_ms {
                        0 => u64::MAX / 4,
                        ms => ms,
                    });
                    match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, conn, app, limits, &metrics, stop).await
                        }
                        Ok(Err(_)) => false,
                        Err(_) => {
                            metrics
                                .connections_timed_out
                                .fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                }
            };
            // The planted weakness `conn_slot_leak` (TEST ONLY) gives the place back only when
            // the connection ended cleanly, the way a release written at the end of the happy
            // path, after every early return, misses the others.
            if let Ok(place) = Arc::try_unwrap(place) {
                place.release(conn_slot_leak && !clean);
            }
            metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
    // Stop accepting; every connection finishes what it is doing (each saw `stop`).
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// A request of a connection in flight: the connection is busy until this is dropped (its
/// answer made, or the request given up).
struct InFlight(Arc<Place>);

impl InFlight {
    fn begin(place: Arc<Place>) -> Self {
        place.request_began();
        Self(place)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended(Instant::now());
    }
}

/// Returns once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, before anything else awaits.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// A connection's stream that remembers whether a read or a write of it failed (a reset by the
/// peer, a broken pipe): the connection did not end cleanly, whatever hyper answers.
struct Watched<I> {
    io: I,
    failed: Arc<AtomicBool>,
}

impl<I> Watched<I> {
    /// `result`, noting a failure.
    fn noted<T>(&self, result: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(_)) = &result {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        self.noted(result)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.noted(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.noted(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.noted(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_shutdown(cx);
        self.noted(result)
    }
}

/// The most of a request a connection buffers at once: the largest head, and the pieces a body
/// is read in.
pub const READ_BUFFER_MAX_BYTES: usize = 16 * 1024;

/// One HTTP/1.1 connection, with the head timeout; gracefully shut down when `stop` turns true.
/// Whether it ended cleanly (the client closed it between requests, or the server shut down),
/// rather than in an error (a timeout, a reset, a close mid-request).
async fn serve_connection<I>(
    io: I,
    (peer, place): (SocketAddr, &Arc<Place>),
    app: Router,
    limits: ConnLimits,
    metrics: &Metrics,
    mut stop: watch::Receiver<bool>,
) -> bool
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // The peer's address goes into each request as it comes: a layer over the router would
    // copy every route for every connection (about 50 KB each).
    let app = tower::util::MapRequest::new(
        app,
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            req
        },
    );
    // Each request marks the connection busy until its answer is made: only an idle one gives
    // way to a newcomer ([`crate::conns`]).
    let tracked = Arc::clone(place);
    let app = tower::util::MapFuture::new(app, move |answer| {
        let in_flight = InFlight::begin(Arc::clone(&tracked));
        async move {
            let answered = answer.await;
            drop(in_flight);
            answered
        }
    });
    let service = TowerToHyperService::new(app);
    let failed = Arc::new(AtomicBool::new(false));
    let io = Watched {
        io,
        failed: Arc::clone(&failed),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(
            (limits.header_read_ms > 0).then(|| Duration::from_millis(limits.header_read_ms)),
        )
        .keep_alive(true)
        // A connection's read buffer stays small: a head is at most this, and a body (read
        // whole only after its credential, or drained after a refusal) comes in pieces of it
        // (hyper's own bound, 400 KiB, let a thousand connections draining refused bodies
        // take 60 MiB).
        .max_buf_size(READ_BUFFER_MAX_BYTES);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
        () = place.give_way.notified() => {
            if !place.busy() {
                // Idle: closed now (no request of it is running: the service is polled only
                // inside `conn`, which this task is not polling).
                return false;
            }
            // A request began meanwhile: it is answered, then the connection closes.
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    match ended {
        // hyper ends a connection reset before a request's first byte without an error.
        Ok(()) => !failed.load(Ordering::Relaxed),
        Err(e) => {
            if e.is_timeout() {
                metrics
                    .connections_timed_out
                    .fetch_add(1, Ordering::Relaxed);
            }
            false
        }
    }
}

/// Reads `req`'s body whole, at most `max_bytes` of it, within `timeout_ms`: the request handed
/// back is complete (its body in memory), so what follows (admission, the handler) never waits
/// on the client.
///
/// # Errors
/// 408 naming `body` when it does not arrive in time (the connection is then closed), 413 when
/// it is larger than `max_bytes`, 400 when the client broke it off.
pub async fn read_body(
    req: Request,
    max_bytes: usize,
    timeout_ms: u64,
) -> Result<Request, ApiError> {
    let (parts, body) = req.into_parts();
    let limited = Limited::new(body, max_bytes);
    let collected =
        tokio::time::timeout(Duration::from_millis(timeout_ms), limited.collect()).await;
    let bytes: Bytes = match collected {
        Err(_elapsed) => {
            return Err(ApiError::field(
                StatusCode::REQUEST_TIMEOUT,
                "body",
                format!("the request body did not arrive within {timeout_ms} ms"),
            ));
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::field(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body",
                "request body too large",
            ));
        }
        Ok(Err(e)) => {
            return Err(ApiError::bad(
                "body",
                format!("cannot read the request body: {e}"),
            ));
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
