//! Each fault of the proxy, observed from a real client against a real server on loopback, and
//! its effect counted. Timing is checked only as lower bounds (a delay is at least what was
//! asked), never as performance.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{Direction, LinkFault, Proxy};

/// A server that echoes every connection's bytes back; reports each connection's end (`true`:
/// it saw EOF, `false`: an error such as a reset).
fn echo_server() -> (std::net::SocketAddr, mpsc::Receiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended, ends) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let ended = ended.clone();
            thread::spawn(move || {
                let mut buf = [0_u8; 4096];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => {
                            let _ = ended.send(true);
                            return;
                        }
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).is_err() {
                                let _ = ended.send(false);
                                return;
                            }
                        }
                        Err(_) => {
                            let _ = ended.send(false);
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, ends)
}

fn connect(proxy: &Proxy) -> TcpStream {
    let s = TcpStream::connect(proxy.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Sends `msg` and reads back as many bytes.
fn round_trip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(msg)?;
    let mut got = vec![0_u8; msg.len()];
    s.read_exact(&mut got)?;
    Ok(got)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn without_a_fault_bytes_flow_both_ways_and_are_counted() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut s = connect(&proxy);
    assert_eq!(round_trip(&mut s, b"hello").unwrap(), b"hello");
    wait_for("the bytes counted", || {
        let e = proxy.effects();
        e.bytes_up == 5 && e.bytes_down == 5
    });
    let e = proxy.effects();
    assert_eq!(e.connections, 1);
    assert_eq!(
        (
            e.refusals,
            e.resets,
            e.dropped_bytes,
            e.delayed_chunks,
            e.half_opened
        ),
        (0, 0, 0, 0, 0),
        "no fault, no effect"
    );
}

#[test]
fn a_refusing_partition_closes_the_port_resets_open_connections_and_heals() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut open = connect(&proxy);
    assert_eq!(round_trip(&mut open, b"a").unwrap(), b"a");
    proxy.set(LinkFault::Refuse);
    wait_for("the port closed", || {
        TcpStream::connect(proxy.addr()).is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused)
    });
    // The idle connection was reset, without sending anything.
    let mut buf = [0_u8; 1];
    let read = open.read(&mut buf);
    assert!(
        read.as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionReset),
        "{read:?}"
    );
    // Every connection open at the partition was reset (a probe above may have got in just
    // before the port closed).
    wait_for("the refusal and the resets counted", || {
        let e = proxy.effects();
        e.refusals == 1 && e.resets >= 1 && e.resets == e.connections
    });
    proxy.set(LinkFault::None);
    wait_for("the port open again", || {
        TcpStream::connect(proxy.addr()).is_ok()
    });
    let mut again = connect(&proxy);
    assert_eq!(round_trip(&mut again, b"b").unwrap(), b"b");
}

#[test]
fn a_black_hole_holds_every_byte_until_it_heals_and_loses_none() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut s = connect(&proxy);
    proxy.set(LinkFault::Blackhole);
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let held = round_trip(&mut s, b"held");
    assert!(
        held.as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "{held:?}"
    );
    wait_for("the bytes held", || proxy.effects().held_bytes == 4);
    assert_eq!(proxy.effects().bytes_up, 0, "nothing got through");
    proxy.set(LinkFault::None);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Healed: the held request arrives first (TCP's order), then the next one, on the same
    // connection.
    s.write_all(b"back").unwrap();
    let mut echo = [0_u8; 8];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"heldback", "nothing lost");
    assert_eq!(proxy.effects().dropped_bytes, 0);
}

#[test]
fn one_way_cuts_one_direction_only() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut s = connect(&proxy);
    proxy.set(LinkFault::OneWay {
        stall: Direction::Down,
    });
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(round_trip(&mut s, b"up").is_err(), "the echo is held");
    // The request itself went through (the echo server answered into the cut direction).
    wait_for("up forwarded, down held", || {
        let e = proxy.effects();
        e.bytes_up == 2 && e.held_bytes == 2
    });
    assert_eq!(proxy.effects().bytes_down, 0);
    proxy.set(LinkFault::None);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut echo = [0_u8; 2];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"up", "the held echo arrives once healed");
}

#[test]
fn latency_holds_each_chunk_at_least_the_delay_minus_the_jitter_and_keeps_order() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 7).unwrap();
    let mut s = connect(&proxy);
    proxy.set(LinkFault::Latency {
        delay_ms: 60,
        jitter_ms: 20,
    });
    let started = Instant::now();
    let mut all = Vec::new();
    for i in 0..5_u8 {
        s.write_all(&[i]).unwrap();
        thread::sleep(Duration::from_millis(2));
    }
    while all.len() < 5 {
        let mut buf = [0_u8; 5];
        let n = s.read(&mut buf).unwrap();
        all.extend_from_slice(&buf[..n]);
    }
    // Two hops (up and down), each at least 60 - 20 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(80),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(all, [0, 1, 2, 3, 4], "order kept");
    assert!(proxy.effects().delayed_chunks >= 2);
}

#[test]
fn bandwidth_paces_a_transfer() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut s = connect(&proxy);
    proxy.set(LinkFault::Bandwidth {
        bytes_per_s: 40_000,
    });
    let msg = vec![7_u8; 20_000];
    let started = Instant::now();
    assert_eq!(round_trip(&mut s, &msg).unwrap(), msg);
    // 20 kB each way at 40 kB/s: at least about half a second (the first chunk goes at once).
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert!(proxy.effects().delayed_chunks >= 2);
}

#[test]
fn a_reset_mid_stream_cuts_the_connection_after_its_bytes() {
    let (upstream, ends) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    proxy.set(LinkFault::ResetAfter { bytes: 10 });
    let mut s = connect(&proxy);
    assert_eq!(
        round_trip(&mut s, b"12345").unwrap(),
        b"12345",
        "10 bytes through"
    );
    let cut = round_trip(&mut s, b"678");
    assert!(
        cut.as_ref().is_err_and(|e| matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof
        )),
        "{cut:?}"
    );
    assert_eq!(
        ends.recv_timeout(Duration::from_secs(5)),
        Ok(false),
        "the server was reset too"
    );
    assert_eq!(proxy.effects().resets, 1);
}

#[test]
fn half_open_closes_the_server_side_while_the_client_thinks_it_is_connected() {
    let (upstream, ends) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let mut s = connect(&proxy);
    assert_eq!(round_trip(&mut s, b"hi").unwrap(), b"hi");
    proxy.set(LinkFault::HalfOpen);
    assert_eq!(
        ends.recv_timeout(Duration::from_secs(5)),
        Ok(true),
        "the server saw EOF"
    );
    // The client can still write, and hears nothing: no EOF, no reset.
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"anyone?").unwrap();
    let mut buf = [0_u8; 8];
    let read = s.read(&mut buf);
    assert!(
        read.as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "{read:?}"
    );
    wait_for("the swallowed bytes counted", || {
        proxy.effects().dropped_bytes == 7
    });
    assert_eq!(proxy.effects().half_opened, 1);
    // When the client leaves, the proxy closes its side too.
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(s.read(&mut buf).unwrap(), 0);
}

#[test]
fn dropping_the_proxy_closes_its_port() {
    let (upstream, _) = echo_server();
    let proxy = Proxy::start(upstream, 1).unwrap();
    let addr = proxy.addr();
    drop(proxy);
    assert!(TcpStream::connect(addr).is_err());
}
