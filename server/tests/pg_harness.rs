//! The throwaway PostgreSQL of the `cluster` crate, as the PostgreSQL tests use it: it starts
//! with fsync on, keeps committed rows across a kill -9 and a restart on the same data, and
//! leaves no process and no directory behind, also when its owner is interrupted (Ctrl-C).
//!
//! Ignored (and reported so) on machines without PostgreSQL; `.ci/run` installs it.

use chaos::Postgres;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use sut_server::pg;

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(i32::try_from(pid).expect("pid")), None).is_ok()
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn throwaway_postgres_keeps_commits_across_kill9_and_cleans_up() {
    let mut server = Postgres::start().expect("start PostgreSQL");
    let data_dir = server.data_dir();
    let first_pid = server.pid().expect("running");
    let client = pg::connect(&server.url()).expect("connect");
    let fsync = futures_executor::block_on(client.query_one("SHOW fsync", &[])).expect("show");
    assert_eq!(fsync.get::<_, String>(0), "on", "fsync must stay on");
    futures_executor::block_on(
        client.batch_execute("CREATE TABLE kept (v BIGINT); INSERT INTO kept VALUES (42);"),
    )
    .expect("write");
    drop(client);

    server.kill9().expect("kill -9");
    assert!(!alive(first_pid), "the postmaster is gone after kill -9");
    server.restart().expect("restart on the same data");
    assert_eq!(server.starts(), 2);
    let client = pg::connect(&server.url()).expect("reconnect");
    let row =
        futures_executor::block_on(client.query_one("SELECT v FROM kept", &[])).expect("read");
    assert_eq!(row.get::<_, i64>(0), 42, "a committed row survives kill -9");
    drop(client);

    let pid = server.pid().expect("running");
    drop(server);
    assert!(!alive(pid), "dropping the server kills it");
    assert!(
        !data_dir.exists(),
        "dropping the server removes its directory"
    );
}

/// Set in the child of the interrupt test: the process to interrupt.
const CHILD_ENV: &str = "PG_HARNESS_INTERRUPT_CHILD";

/// In the interrupt test's child only: holds a PostgreSQL, says where, and waits to be
/// interrupted. Elsewhere it returns at once.
#[test]
fn interrupt_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    chaos::clean_up_on_interrupt().expect("handler");
    let server = Postgres::start().expect("start PostgreSQL");
    println!(
        "HOLDING {} {}",
        server.pid().expect("running"),
        server.data_dir().display()
    );
    std::thread::sleep(std::time::Duration::from_secs(60));
    drop(server);
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn an_interrupted_owner_leaves_no_postgres_and_no_directory() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "interrupt_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    // libtest prints `test interrupt_child ... ` before the child's own line.
    let holding = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("HOLDING ").map(|(_, rest)| rest.to_owned()))
        .expect("the child started PostgreSQL");
    let mut parts = holding.split_whitespace();
    let pid: u32 = parts.next().unwrap().parse().unwrap();
    let data_dir = std::path::PathBuf::from(parts.next().unwrap());
    assert!(alive(pid) && data_dir.exists());
    let child_pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    kill(child_pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "exit 128 + SIGINT: {status:?}");
    assert!(!alive(pid), "the child's PostgreSQL is gone after Ctrl-C");
    assert!(!data_dir.exists(), "and so is its directory");
}

/// A connection left half-open (PostgreSQL saw the client leave; the client's side stays open
/// and nothing ever answers) is given up after `ROUND_TRIP_TIMEOUT`, with an error that says so,
/// and the store's next operation runs on a new connection. Before, the store waited forever,
/// holding its lock: `cluster_chaos`'s `link_break` fault on a database link.
#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn a_half_open_connection_is_given_up_and_the_store_reconnects() {
    use chaos::{LinkFault, Proxy};
    let server = Postgres::start().expect("start PostgreSQL");
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], server.port()));
    let proxy = Proxy::start(upstream, 7).expect("proxy");
    let url = server.url_via("postgres", proxy.addr().port());
    let mut conn = pg::PgConn::open(&url, "CREATE TABLE IF NOT EXISTS t (v BIGINT)").expect("open");
    conn.execute_alone("INSERT INTO t VALUES (1)", &[])
        .expect("a statement before the fault");

    proxy.set(LinkFault::HalfOpen);
    let began = std::time::Instant::now();
    let e = conn
        .execute_alone("INSERT INTO t VALUES (2)", &[])
        .expect_err("no answer on a half-open connection");
    let waited = began.elapsed();
    assert!(e.connection_lost, "{e}");
    assert!(e.message.contains("no answer"), "{e}");
    assert!(
        waited >= pg::ROUND_TRIP_TIMEOUT && waited < pg::ROUND_TRIP_TIMEOUT * 3,
        "gave up after {waited:?}"
    );
    assert!(proxy.effects().half_opened >= 1, "{:?}", proxy.effects());

    proxy.set(LinkFault::None);
    conn.execute_alone("INSERT INTO t VALUES (3)", &[])
        .expect("a new connection once healed");
    let direct = pg::connect(&server.url()).expect("connect");
    let rows =
        futures_executor::block_on(direct.query("SELECT v FROM t ORDER BY v", &[])).expect("read");
    let values: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    // The statement sent into the half-open connection never reached PostgreSQL.
    assert_eq!(values, vec![1, 3]);
}
