//! The throwaway PostgreSQL of the `cluster` crate, as the PostgreSQL tests use it: it starts
//! with fsync on, keeps committed rows across a kill -9 and a restart on the same data, and
//! leaves no process and no directory behind.
//!
//! Ignored (and reported so) on machines without PostgreSQL; `.ci/run` installs it.

use cluster::Postgres;
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
