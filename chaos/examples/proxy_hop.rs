//! What one fault-proxy hop adds to a request's latency, measured side by side with the direct
//! path: the same echo server, the same paced load (an open model: each request is timed from
//! when it was due, so a stall is not hidden), once straight to the server and once through a
//! [`chaos::Proxy`] with no fault set. Prints P50, P99 and P999 of both and their difference.
//!
//! ```text
//! cargo run --release -p chaos --example proxy_hop -- 10000 5
//! ```
//! (requests per second, seconds per path; defaults 10,000 and 5).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Client connections (each its own thread, each paced at rate / CONNECTIONS).
const CONNECTIONS: u64 = 8;
/// Request (and response) size.
const MESSAGE_BYTES: usize = 64;

fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut buf = [0_u8; MESSAGE_BYTES];
                while s.read_exact(&mut buf).is_ok() {
                    if s.write_all(&buf).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Paced round trips to `target` for `seconds`; latencies in µs from each request's due time.
fn load(target: SocketAddr, rate_per_s: u64, seconds: u64) -> Histogram<u64> {
    let per_connection = (rate_per_s / CONNECTIONS).max(1);
    let interval = Duration::from_nanos(1_000_000_000 / per_connection);
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            thread::spawn(move || {
                let mut h = Histogram::<u64>::new(3).expect("histogram");
                let mut s = TcpStream::connect(target).expect("connect");
                s.set_nodelay(true).expect("nodelay");
                let msg = [42_u8; MESSAGE_BYTES];
                let mut back = [0_u8; MESSAGE_BYTES];
                let start = Instant::now();
                let mut due = start;
                while due < start + Duration::from_secs(seconds) {
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        thread::sleep(wait);
                    }
                    s.write_all(&msg).expect("write");
                    s.read_exact(&mut back).expect("read");
                    let us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                    h.record(us.max(1)).expect("record");
                    due += interval;
                }
                h
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for t in threads {
        all.add(t.join().expect("a client thread")).expect("merge");
    }
    all
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rate: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let server = echo_server();
    let proxy = chaos::Proxy::start(server, 1).expect("start the proxy");
    // Warm both paths, then measure them one after the other.
    let _ = load(server, rate, 1);
    let _ = load(proxy.addr(), rate, 1);
    let direct = load(server, rate, seconds);
    let proxied = load(proxy.addr(), rate, seconds);
    println!(
        "{rate} requests/s over {CONNECTIONS} connections, {seconds} s per path, {MESSAGE_BYTES}-byte messages"
    );
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>10}",
        "path", "requests", "P50 µs", "P99 µs", "P999 µs"
    );
    for (name, h) in [("direct", &direct), ("proxied", &proxied)] {
        println!(
            "{name:<8} {:>10} {:>10} {:>10} {:>10}",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999)
        );
    }
    let added = |q: f64| {
        i64::try_from(proxied.value_at_quantile(q)).unwrap_or(i64::MAX)
            - i64::try_from(direct.value_at_quantile(q)).unwrap_or(i64::MAX)
    };
    println!(
        "one proxy hop adds: P50 {} µs, P99 {} µs, P999 {} µs",
        added(0.5),
        added(0.99),
        added(0.999)
    );
    let e = proxy.effects();
    println!(
        "proxy forwarded {} bytes up, {} down",
        e.bytes_up, e.bytes_down
    );
}
