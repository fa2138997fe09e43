//! A TCP fault proxy: one listening port in front of one upstream address, forwarding bytes both
//! ways until told to misbehave. `tc netem` is not available on the machines this bench runs on,
//! and Jepsen's iptables rules need root and a network per node; a proxy on every client→server
//! and server→database link gives the same faults to processes on one host.
//!
//! Faults ([`LinkFault`]), switched at any time with [`Proxy::set`] and applied to new and
//! existing connections alike:
//!
//! - **partition, refusing**: the listening port is closed (new connections get `ECONNREFUSED`)
//!   and every open connection is reset (RST both ways);
//! - **partition, black hole**: connections are accepted and kept open, and no byte gets through
//!   either way until the link heals (clients see timeouts, not errors). As on a real network,
//!   where TCP retransmits what a partition dropped, nothing is lost: what was sent is held and
//!   delivered, in order, after the partition (the sender's buffers fill meanwhile);
//! - **one way**: the same for the bytes of one direction; the other direction flows;
//! - **latency** with jitter: each chunk is delivered `delay ± jitter` after it was read, never
//!   before an earlier one (order kept, as TCP keeps it);
//! - **bandwidth**: each direction is paced to a byte rate;
//! - **reset mid-stream**: a connection is reset once this many bytes went through it;
//! - **half-open**: the upstream side is closed (the server sees the client leave) while the
//!   client's side stays open and its bytes are swallowed (the client thinks it is connected).
//!
//! Every fault's observable effect is counted ([`ProxyEffects`]): a fault that never touched a
//! byte or a connection has not taken effect, and a run can say so.
//!
//! The proxy runs on its own tokio runtime thread, so synchronous owners (the cluster runner)
//! drive it through the handle; dropping the handle stops it and closes every connection.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ProcessError;

/// Bytes read at once from either side.
const CHUNK_BYTES: usize = 16 * 1024;

pub use sut::fault::{Direction, LinkFault};

/// What the faults did: each counter moves only when a fault touched a byte or a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyEffects {
    /// Connections accepted.
    pub connections: u64,
    /// Bytes forwarded client to upstream.
    pub bytes_up: u64,
    /// Bytes forwarded upstream to client.
    pub bytes_down: u64,
    /// Times the port was closed by a refusing partition.
    pub refusals: u64,
    /// Connections reset (by a refusing partition or a reset mid-stream).
    pub resets: u64,
    /// Bytes swallowed (half-open).
    pub dropped_bytes: u64,
    /// Bytes held back by a partition (black hole, one way), delivered once it healed.
    pub held_bytes: u64,
    /// Chunks held back by latency or bandwidth.
    pub delayed_chunks: u64,
    /// Connections left half-open.
    pub half_opened: u64,
}

impl std::ops::AddAssign for ProxyEffects {
    /// Sums the effects of several links.
    fn add_assign(&mut self, other: Self) {
        self.connections += other.connections;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
        self.refusals += other.refusals;
        self.resets += other.resets;
        self.dropped_bytes += other.dropped_bytes;
        self.held_bytes += other.held_bytes;
        self.delayed_chunks += other.delayed_chunks;
        self.half_opened += other.half_opened;
    }
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    refusals: AtomicU64,
    resets: AtomicU64,
    dropped_bytes: AtomicU64,
    held_bytes: AtomicU64,
    delayed_chunks: AtomicU64,
    half_opened: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ProxyEffects {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProxyEffects {
            connections: get(&self.connections),
            bytes_up: get(&self.bytes_up),
            bytes_down: get(&self.bytes_down),
            refusals: get(&self.refusals),
            resets: get(&self.resets),
            dropped_bytes: get(&self.dropped_bytes),
            held_bytes: get(&self.held_bytes),
            delayed_chunks: get(&self.delayed_chunks),
            half_opened: get(&self.half_opened),
        }
    }
}

/// Switches a [`Proxy`]'s fault from another thread ([`Proxy::switch`]); once the proxy is
/// dropped, switching does nothing.
#[derive(Clone, Debug)]
pub struct LinkSwitch(watch::Sender<LinkFault>);

impl LinkSwitch {
    /// Switches the link's fault.
    pub fn set(&self, fault: LinkFault) {
        self.0.send_replace(fault);
    }
}

/// A running proxy. Dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    listen: SocketAddr,
    upstream: SocketAddr,
    fault: watch::Sender<LinkFault>,
    counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream`. `seed` draws the jitter.
    ///
    /// # Errors
    /// The runtime or the listening socket could not be set up.
    pub fn start(upstream: SocketAddr, seed: u64) -> Result<Self, ProcessError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(crate::io("start the fault proxy's runtime"))?;
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .map_err(crate::io("bind the fault proxy"))?;
        let listen = listener
            .local_addr()
            .map_err(crate::io("read the fault proxy's address"))?;
        let (fault, faults) = watch::channel(LinkFault::None);
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let link = Link {
            upstream,
            faults,
            counters: Arc::clone(&counters),
            seed,
        };
        let thread = std::thread::Builder::new()
            .name(format!("proxy {listen}->{upstream}"))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = serve(listener, listen, link) => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(crate::io("start the fault proxy's thread"))?;
        Ok(Self {
            listen,
            upstream,
            fault,
            counters,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    #[must_use]
    pub const fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Where the bytes go.
    #[must_use]
    pub const fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the link's fault (at once, for open connections too).
    pub fn set(&self, fault: LinkFault) {
        self.fault.send_replace(fault);
    }

    /// A handle that switches the link's fault from another thread, as [`Proxy::set`] does.
    #[must_use]
    pub fn switch(&self) -> LinkSwitch {
        LinkSwitch(self.fault.clone())
    }

    /// The fault in force.
    #[must_use]
    pub fn fault(&self) -> LinkFault {
        *self.fault.borrow()
    }

    /// What the faults did so far.
    #[must_use]
    pub fn effects(&self) -> ProxyEffects {
        self.counters.snapshot()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What every connection task shares.
#[derive(Clone, Debug)]
struct Link {
    upstream: SocketAddr,
    faults: watch::Receiver<LinkFault>,
    counters: Arc<Counters>,
    seed: u64,
}

/// Accepts connections while the link is not refusing; closes the port while it is.
async fn serve(listener: TcpListener, listen: SocketAddr, mut link: Link) {
    let mut listener = Some(listener);
    let mut connection_no = 0_u64;
    loop {
        let refusing = *link.faults.borrow_and_update() == LinkFault::Refuse;
        if refusing {
            if let Some(open) = listener.take() {
                Counters::add(&link.counters.refusals, 1);
                drop(open);
            }
            if link.faults.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(open) = listener.as_ref() else {
            // Healed: the same port again (on loopback, nobody took it meanwhile, or we retry).
            match TcpListener::bind(listen).await {
                Ok(l) => listener = Some(l),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
            continue;
        };
        tokio::select! {
            accepted = open.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connection_no += 1;
                Counters::add(&link.counters.connections, 1);
                let link = link.clone();
                tokio::spawn(connection(client, link, connection_no));
            }
            changed = link.faults.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// One proxied connection: connects upstream and pumps both directions.
async fn connection(client: TcpStream, link: Link, connection_no: u64) {
    let Ok(server) = TcpStream::connect(link.upstream).await else {
        // The upstream refused: the client sees its connection closed.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (closing, closed) = watch::channel(Ending::Open);
    let state = Arc::new(ConnState {
        through_bytes: AtomicU64::new(0),
        closing,
    });
    let jitter = link.seed ^ connection_no.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let up = Pump {
        direction: Direction::Up,
        link: link.clone(),
        state: Arc::clone(&state),
        closed: closed.clone(),
        rng: jitter,
    };
    let down = Pump {
        direction: Direction::Down,
        link,
        state,
        closed,
        rng: jitter.rotate_left(17) ^ 1,
    };
    let up = tokio::spawn(up.run(client_read, server_write));
    let down = tokio::spawn(down.run(server_read, client_write));
    let _ = tokio::join!(up, down);
}

/// How a connection ends when a fault ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Open,
    /// Reset both ways (RST).
    Reset,
    /// Upstream closed, client left hanging.
    HalfOpen,
    /// The half-open client went away: the client side can close too.
    ClientGone,
}

#[derive(Debug)]
struct ConnState {
    through_bytes: AtomicU64,
    closing: watch::Sender<Ending>,
}

/// One direction of a connection.
struct Pump {
    direction: Direction,
    link: Link,
    state: Arc<ConnState>,
    closed: watch::Receiver<Ending>,
    /// xorshift state for the jitter.
    rng: u64,
}

/// What to do with a chunk just read.
enum ChunkFate {
    Deliver(Instant),
    /// Held until the partition heals.
    Hold,
    End(Ending),
}

impl Pump {
    async fn run(mut self, mut src: OwnedReadHalf, mut dst: OwnedWriteHalf) {
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut paced_until = Instant::now();
        let mut buf = vec![0_u8; CHUNK_BYTES];
        let mut src_open = true;
        loop {
            let due = queue.front().map(|(at, _)| *at);
            if !src_open && due.is_none() {
                let _ = dst.shutdown().await;
                return;
            }
            tokio::select! {
                biased;
                ending = self.closed.changed() => {
                    let ending = if ending.is_ok() { *self.closed.borrow() } else { Ending::Reset };
                    return self.end(ending, src, dst).await;
                }
                // A partition or a half-open close reaches idle connections too (the up
                // direction watches for both).
                changed = self.link.faults.changed(), if self.direction == Direction::Up => {
                    let ending = match *self.link.faults.borrow_and_update() {
                        _ if changed.is_err() => Ending::Reset,
                        LinkFault::Refuse => Ending::Reset,
                        LinkFault::HalfOpen => Ending::HalfOpen,
                        _ => continue,
                    };
                    self.state.closing.send_replace(ending);
                }
                () = sleep_until(due), if due.is_some() => {
                    // Every chunk that is due by now, in order.
                    let now = Instant::now();
                    while let Some((_, chunk)) = queue.pop_front_if(|(at, _)| *at <= now) {
                        if !self.forward(&mut dst, &chunk).await {
                            break;
                        }
                    }
                }
                read = src.read(&mut buf), if src_open => {
                    let n = match read {
                        Ok(0) => { src_open = false; continue; }
                        Ok(n) => n,
                        Err(_) => {
                            self.state.closing.send_replace(Ending::Reset);
                            continue;
                        }
                    };
                    match self.judge(n, &mut paced_until) {
                        // The common case, no fault: straight through, no timer (a timer
                        // fires on the runtime's next millisecond).
                        ChunkFate::Deliver(at) if queue.is_empty() && at <= Instant::now() => {
                            self.forward(&mut dst, &buf[..n]).await;
                        }
                        ChunkFate::Deliver(at) => queue.push_back((at, buf[..n].to_vec())),
                        ChunkFate::Hold => {
                            // Nothing more is read meanwhile: the sender's buffers fill, as
                            // behind a real partition.
                            Counters::add(&self.link.counters.held_bytes, n as u64);
                            if let Some(ending) = self.held_until_healed().await {
                                return self.end(ending, src, dst).await;
                            }
                            queue.push_back((Instant::now(), buf[..n].to_vec()));
                        }
                        ChunkFate::End(ending) => {
                            if ending == Ending::HalfOpen {
                                Counters::add(&self.link.counters.dropped_bytes, n as u64);
                            }
                            self.state.closing.send_replace(ending);
                        }
                    }
                }
            }
        }
    }

    /// Ends this direction as a fault ends the connection.
    ///
    /// - Reset: a zero linger on both sockets, so that their close sends RST (and no FIN).
    /// - Half-open: the upstream socket closes (the server sees the client leave); the client's
    ///   stays open, its bytes swallowed, until the client goes away.
    async fn end(mut self, ending: Ending, mut src: OwnedReadHalf, dst: OwnedWriteHalf) {
        let up = self.direction == Direction::Up;
        match ending {
            Ending::Open | Ending::ClientGone => {}
            Ending::Reset => {
                let _ = src.as_ref().set_zero_linger();
                let _ = dst.as_ref().set_zero_linger();
                // Dropping a write half would send FIN first; forgotten, the socket closes
                // when its read half goes, with the RST alone.
                dst.forget();
                if up {
                    Counters::add(&self.link.counters.resets, 1);
                }
            }
            Ending::HalfOpen if up => {
                Counters::add(&self.link.counters.half_opened, 1);
                drop(dst);
                self.swallow(&mut src).await;
                self.state.closing.send_replace(Ending::ClientGone);
            }
            Ending::HalfOpen => {
                // Keep the client's write side open until the client goes away.
                drop(src);
                while *self.closed.borrow_and_update() != Ending::ClientGone {
                    if self.closed.changed().await.is_err() {
                        break;
                    }
                }
                drop(dst);
            }
        }
    }

    /// Waits while the link's fault cuts this direction; `Some` when the connection ends
    /// meanwhile (a refusing partition, a half-open close, the other direction's reset).
    async fn held_until_healed(&mut self) -> Option<Ending> {
        loop {
            let fault = *self.link.faults.borrow_and_update();
            let cut = match fault {
                LinkFault::Blackhole => true,
                LinkFault::OneWay { stall } => stall == self.direction,
                _ => false,
            };
            if !cut {
                return None;
            }
            tokio::select! {
                biased;
                ending = self.closed.changed() => {
                    return Some(if ending.is_ok() { *self.closed.borrow() } else { Ending::Reset });
                }
                changed = self.link.faults.changed() => {
                    if changed.is_err() {
                        return Some(Ending::Reset);
                    }
                    // As in the main loop, the up direction ends the connection for both.
                    if self.direction == Direction::Up {
                        match *self.link.faults.borrow() {
                            LinkFault::Refuse => {
                                self.state.closing.send_replace(Ending::Reset);
                            }
                            LinkFault::HalfOpen => {
                                self.state.closing.send_replace(Ending::HalfOpen);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// The fault in force decides what happens to `n` bytes just read.
    fn judge(&mut self, n: usize, paced_until: &mut Instant) -> ChunkFate {
        let now = Instant::now();
        let fault = *self.link.faults.borrow();
        let through = self
            .state
            .through_bytes
            .fetch_add(n as u64, Ordering::Relaxed)
            + n as u64;
        match fault {
            LinkFault::None => ChunkFate::Deliver(now),
            LinkFault::Refuse => ChunkFate::End(Ending::Reset),
            LinkFault::HalfOpen => ChunkFate::End(Ending::HalfOpen),
            LinkFault::Blackhole => ChunkFate::Hold,
            LinkFault::OneWay { stall } if stall == self.direction => ChunkFate::Hold,
            LinkFault::OneWay { .. } => ChunkFate::Deliver(now),
            LinkFault::ResetAfter { bytes } if through > bytes => ChunkFate::End(Ending::Reset),
            LinkFault::ResetAfter { .. } => ChunkFate::Deliver(now),
            LinkFault::Latency {
                delay_ms,
                jitter_ms,
            } => {
                let ms = delay_ms
                    .saturating_sub(jitter_ms)
                    .saturating_add(self.draw(jitter_ms.saturating_mul(2)));
                Counters::add(&self.link.counters.delayed_chunks, 1);
                // Never before an earlier chunk of this direction.
                let at = (now + Duration::from_millis(ms)).max(*paced_until);
                *paced_until = at;
                ChunkFate::Deliver(at)
            }
            LinkFault::Bandwidth { bytes_per_s } => {
                let rate = bytes_per_s.max(1);
                let send_us = (n as u64).saturating_mul(1_000_000) / rate;
                let start = now.max(*paced_until);
                *paced_until = start + Duration::from_micros(send_us);
                Counters::add(&self.link.counters.delayed_chunks, 1);
                ChunkFate::Deliver(*paced_until)
            }
        }
    }

    /// A number in `0..=max` (xorshift64*).
    fn draw(&mut self, max: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        if max == 0 {
            0
        } else {
            self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % (max + 1)
        }
    }

    /// Writes `chunk` on; a failed write resets the connection (`false`).
    async fn forward(&self, dst: &mut OwnedWriteHalf, chunk: &[u8]) -> bool {
        if dst.write_all(chunk).await.is_err() {
            self.state.closing.send_replace(Ending::Reset);
            return false;
        }
        let counter = match self.direction {
            Direction::Up => &self.link.counters.bytes_up,
            Direction::Down => &self.link.counters.bytes_down,
        };
        Counters::add(counter, chunk.len() as u64);
        true
    }

    /// Reads and discards the client's bytes until it goes away (half-open).
    async fn swallow(&self, src: &mut OwnedReadHalf) {
        let mut buf = vec![0_u8; CHUNK_BYTES];
        while let Ok(n) = src.read(&mut buf).await {
            if n == 0 {
                return;
            }
            Counters::add(&self.link.counters.dropped_bytes, n as u64);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests;
