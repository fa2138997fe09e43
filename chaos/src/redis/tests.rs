//! What a kill -9 of Redis keeps, by persistence mode: the mechanism behind the duplicate IDs a
//! Redis-`INCR` ID generator hands out after a crash.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{Redis, RedisPersistence};

/// `INCR key` over a plain connection; the new value.
fn incr(conn: &mut BufReader<TcpStream>, key: &str) -> i64 {
    let cmd = format!("*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n", key.len());
    conn.get_mut().write_all(cmd.as_bytes()).unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).unwrap();
    line.trim_end()
        .strip_prefix(':')
        .unwrap_or_else(|| panic!("INCR answered {line:?}"))
        .parse()
        .unwrap()
}

fn connect(redis: &Redis) -> BufReader<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", redis.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    BufReader::new(s)
}

/// Acknowledged INCRs, a kill -9 and a restart: the first value handed out afterwards.
fn first_value_after_a_crash(persistence: RedisPersistence, acknowledged: i64) -> i64 {
    let mut redis = Redis::start(persistence).unwrap();
    let mut conn = connect(&redis);
    for expected in 1..=acknowledged {
        assert_eq!(incr(&mut conn, "ids"), expected);
    }
    redis.kill9().unwrap();
    redis.restart().unwrap();
    assert_eq!(redis.starts(), 2);
    incr(&mut connect(&redis), "ids")
}

#[test]
#[cfg_attr(not(has_redis), ignore = "redis-server not installed")]
fn with_rdb_snapshots_only_a_crash_hands_out_acknowledged_ids_again() {
    // No snapshot within the hour: every acknowledged INCR is lost, and 1 comes out again.
    let next = first_value_after_a_crash(RedisPersistence::Rdb { after_s: 3_600 }, 200);
    assert_eq!(next, 1, "a duplicate of the first ID handed out");
}

#[test]
#[cfg_attr(not(has_redis), ignore = "redis-server not installed")]
fn with_the_append_only_file_a_process_crash_loses_nothing_even_unsynced() {
    // `everysec` has not fsynced the last second, yet a killed process loses nothing: the
    // writes are in the kernel's page cache. Only a power loss (lost unsynced writes) shows
    // the difference from `always`, which is why a kill -9 alone cannot test it.
    for persistence in [RedisPersistence::AofEverysec, RedisPersistence::AofAlways] {
        assert_eq!(
            first_value_after_a_crash(persistence, 200),
            201,
            "{persistence:?}"
        );
    }
}

#[test]
fn a_missing_binary_is_a_clear_error() {
    // What a machine without Redis is told: the package to install.
    let message = super::super::ProcessError::RedisMissing.to_string();
    assert!(
        message.contains("apt-get install redis-server"),
        "{message}"
    );
}

#[test]
#[cfg_attr(not(has_redis), ignore = "redis-server not installed")]
fn a_paused_server_answers_nothing_until_resumed() {
    let redis = Redis::start(RedisPersistence::AofAlways).unwrap();
    let mut conn = connect(&redis);
    assert_eq!(incr(&mut conn, "k"), 1);
    redis.pause().unwrap();
    conn.get_mut()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    conn.get_mut()
        .write_all(b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n")
        .unwrap();
    let mut line = String::new();
    assert!(
        conn.read_line(&mut line).is_err(),
        "answered while paused: {line:?}"
    );
    redis.resume().unwrap();
    conn.get_mut()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    line.clear();
    conn.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), ":2", "the request waited, then ran");
}

#[test]
#[cfg_attr(
    not(all(has_redis, has_fuse)),
    ignore = "redis-server or /dev/fuse missing"
)]
fn a_power_loss_takes_what_everysec_had_not_synced_and_nothing_from_always() {
    // A burst of INCRs, then at once a power loss: `everysec` had not fsynced the last of them
    // (up to a second's worth), `always` had fsynced every one before answering.
    let after = |persistence| {
        let mut redis = Redis::start_with(persistence, true).unwrap();
        let mut conn = connect(&redis);
        for expected in 1..=2_000 {
            assert_eq!(incr(&mut conn, "ids"), expected);
        }
        let lost = redis.power_loss().unwrap();
        redis.restart().unwrap();
        (incr(&mut connect(&redis), "ids"), lost.lost_bytes)
    };
    let (next, lost_bytes) = after(RedisPersistence::AofEverysec);
    assert!(
        next <= 2_000,
        "everysec handed out {next}: nothing acknowledged was lost"
    );
    assert!(lost_bytes > 0);
    let (next, lost_bytes) = after(RedisPersistence::AofAlways);
    assert_eq!((next, lost_bytes), (2_001, 0));
}
