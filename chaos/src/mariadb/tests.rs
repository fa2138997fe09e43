//! What a kill -9 and a power loss of MariaDB keep, with every commit synced: the ground the
//! `scenarios/real/mariadb_*` files stand on.

use std::time::{Duration, Instant};

use super::{MARIADB_DATABASE, MariaDb, MariaDbSpec};

const TABLE: &str = "bench.t";

fn count(db: &MariaDb) -> u64 {
    db.query(&format!("SELECT COUNT(*) FROM {TABLE}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn with_rows(spec: MariaDbSpec, rows: u64) -> MariaDb {
    let db = MariaDb::start_with(spec).unwrap();
    db.sql(&format!(
        "CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY AUTO_INCREMENT) ENGINE=InnoDB"
    ))
    .unwrap();
    for _ in 0..rows {
        db.sql(&format!("INSERT INTO {TABLE} () VALUES ()"))
            .unwrap();
    }
    assert_eq!(count(&db), rows);
    db
}

#[test]
fn a_committed_row_survives_a_kill_and_the_restart_recovers() {
    let mut db = with_rows(MariaDbSpec::default(), 5);
    assert_eq!(db.starts(), 1);
    assert!(db.url().ends_with(&format!("/{MARIADB_DATABASE}")));
    db.kill9().unwrap();
    assert!(
        db.query("SELECT 1").is_err(),
        "a killed server answers nothing"
    );
    db.restart().unwrap();
    assert_eq!(db.starts(), 2);
    assert_eq!(count(&db), 5);
    // AUTO_INCREMENT goes on above what was committed (persisted since MariaDB 10.2.4).
    db.sql(&format!("INSERT INTO {TABLE} () VALUES ()"))
        .unwrap();
    let max: u64 = db
        .query(&format!("SELECT MAX(id) FROM {TABLE}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(max, 6);
}

#[test]
fn synced_commits_survive_a_power_loss_and_the_unsynced_rest_is_dropped() {
    let mut db = with_rows(
        MariaDbSpec {
            lose_unsynced: true,
            ..MariaDbSpec::default()
        },
        5,
    );
    let lost = db.power_loss().unwrap();
    db.restart().unwrap();
    assert_eq!(count(&db), 5, "every acknowledged commit was synced first");
    let seen = db.lost_writes().expect("on the lost-writes filesystem");
    assert!(seen.power_losses >= 1, "{seen:?} (at the loss: {lost:?})");
}

#[test]
fn a_paused_server_answers_nothing_until_it_resumes() {
    let db = with_rows(MariaDbSpec::default(), 1);
    db.pause().unwrap();
    let asked = Instant::now();
    assert!(db.query("SELECT 1").is_err(), "a paused server answered");
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "refused rather than held"
    );
    db.resume().unwrap();
    assert_eq!(count(&db), 1);
}
