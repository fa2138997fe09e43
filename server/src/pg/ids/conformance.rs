//! The PostgreSQL ID store against the memory store (the same random operation sequences as
//! the SQLite store's conformance test), and what only a shared database adds: several ID
//! servers allocating segments of one tag at once never get overlapping segments.

use std::sync::atomic::{AtomicU32, Ordering};

use chaos::Postgres;
use proptest::prelude::*;
use sut::id_store::{AllocRequest, CounterDurability, IdStore, InstanceId, StoreError, TagSpec};

use super::PgIdStore;
use crate::pg::{create_database, url_with_database};
use crate::sqlite::ids_conformance::{agrees_with_memory, durability, op};

/// A new empty database on `server` for one test case.
fn fresh_store(server: &Postgres, durability: CounterDurability) -> PgIdStore {
    static CASE: AtomicU32 = AtomicU32::new(0);
    let name = format!("ids_case_{}", CASE.fetch_add(1, Ordering::Relaxed));
    create_database(&server.url(), &name).expect("create database");
    PgIdStore::open(&url_with_database(&server.url(), &name), durability).expect("open")
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn memory_and_postgres_stores_agree() {
    let server = Postgres::start().expect("start PostgreSQL");
    let config = ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    };
    let strategy = (
        proptest::collection::vec((op(), 0..20u64), 1..60),
        durability(),
    );
    proptest::test_runner::TestRunner::new(config)
        .run(&strategy, |(ops, durability)| {
            let mut store = fresh_store(&server, durability);
            agrees_with_memory(&mut store, durability, &ops)
        })
        .expect("the PostgreSQL store agrees with the memory store");
}

/// One ID server's loop: read the tag, allocate at the version read, retry on a conflict.
fn allocate_segments(url: &str, instance: u64, segments: usize) -> Vec<(u64, u64)> {
    let mut store = PgIdStore::open(url, CounterDurability::EveryWrite).expect("open");
    let mut granted = Vec::with_capacity(segments);
    let mut conflicts = 0;
    while granted.len() < segments {
        let row = store.read_tag("order").expect("read");
        let req = AllocRequest {
            tag: "order".into(),
            expected_version: row.version,
            ids: 10,
            min_id: 0,
            claim_ids: 10,
            instance: InstanceId(instance),
            lease_ms: 60_000,
            now_ms: 0,
            blind_max_id: None,
        };
        match store.allocate(&req) {
            Ok(grant) => granted.push((grant.segment.start, grant.segment.end)),
            Err(StoreError::VersionConflict { .. }) => conflicts += 1,
            Err(e) => panic!("allocate: {e}"),
        }
    }
    assert!(conflicts < 100 * segments, "conflicts {conflicts}");
    granted
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn id_servers_sharing_a_database_never_get_overlapping_segments() {
    let server = Postgres::start().expect("start PostgreSQL");
    let mut setup = fresh_store(&server, CounterDurability::EveryWrite);
    setup
        .create_tag("order", &TagSpec::simple(10))
        .expect("create");
    let url = setup.conn.url().to_owned();
    let servers = 4;
    let each = 40;
    let mut all: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..servers)
            .map(|i| {
                let url = url.clone();
                s.spawn(move || allocate_segments(&url, i + 1, each))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("server thread"))
            .collect()
    });
    all.sort_unstable();
    assert_eq!(all.len(), usize::try_from(servers).unwrap() * each);
    for pair in all.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "overlapping segments {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    let row = setup.read_tag("order").expect("read");
    assert_eq!(row.version, u64::try_from(all.len()).unwrap());
}
