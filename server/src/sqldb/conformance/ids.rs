//! The ID stores: the SQLite store's random operation sequences agree with the memory store,
//! and several ID servers allocating segments of one tag at once never get overlapping
//! segments.

use proptest::prelude::*;
use sut::id_store::{AllocRequest, CounterDurability, IdStore, InstanceId, StoreError, TagSpec};

use super::Backend;
use crate::sqlite::ids_conformance::{agrees_with_memory, durability, op};

pub(super) fn stores_agree<B: Backend>() {
    let server = B::start();
    let case = std::cell::Cell::new(0);
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
            case.set(case.get() + 1);
            let url = B::database(&server, &format!("ids_case_{}", case.get()));
            agrees_with_memory(&mut B::ids(&url, durability), durability, &ops)
        })
        .expect("the server's store agrees with the memory store");
}

/// One ID server's loop: read the tag, allocate at the version read, retry on a conflict.
fn allocate_segments<B: Backend>(url: &str, instance: u64, segments: usize) -> Vec<(u64, u64)> {
    let mut store = B::ids(url, CounterDurability::EveryWrite);
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

pub(super) fn no_overlapping_segments<B: Backend>() {
    let server = B::start();
    let url = B::database(&server, "ids_race");
    let mut setup = B::ids(&url, CounterDurability::EveryWrite);
    setup
        .create_tag("order", &TagSpec::simple(10))
        .expect("create");
    let servers = 4;
    let each = 40;
    let mut all: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..servers)
            .map(|i| {
                let url = url.clone();
                s.spawn(move || allocate_segments::<B>(&url, i + 1, each))
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
