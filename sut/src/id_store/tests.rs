//! Unit tests of the ID store rules through the memory store alone (the memory-vs-SQLite
//! conformance test lives with the SQLite store in `sut-server`).

use super::{AllocRequest, CounterDurability, IdStore, InstanceId, MemoryIdStore, TagSpec};
use crate::edge::Observed as _;

#[test]
fn periodic_counter_loses_the_unsynced_tail_on_crash() {
    // What `appendfsync everysec` costs: increments within the last interval are lost, so a
    // counter-engine ID generator re-issues them after a crash.
    let mut store =
        MemoryIdStore::with_counter_durability(CounterDurability::Periodic { interval_ms: 1000 });
    let mut issued = Vec::new();
    for t in 0..1500 {
        issued.push(store.incr_by("id", 1, t).expect("incr"));
    }
    let lost = store.crash_counters();
    assert_eq!(
        lost.get("id"),
        Some(&499),
        "synced at t=1000 (value 1001); 499 increments after it are lost"
    );
    let reissued = store.incr_by("id", 1, 1600).expect("incr");
    assert!(
        issued.contains(&reissued),
        "the crash made the engine hand out {reissued} a second time"
    );

    let mut durable = MemoryIdStore::with_counter_durability(CounterDurability::EveryWrite);
    for t in 0..1500 {
        durable.incr_by("id", 1, t).expect("incr");
    }
    assert!(durable.crash_counters().is_empty());
}

#[test]
fn the_id_space_ends_with_exhausted_never_a_wrap() {
    let mut store = MemoryIdStore::new();
    let first_id = super::SEGMENT_ID_LIMIT - 15;
    store
        .create_tag(
            "t",
            &TagSpec {
                first_id,
                ..TagSpec::simple(10)
            },
        )
        .unwrap();
    let mut req = AllocRequest {
        tag: "t".into(),
        expected_version: 0,
        ids: 10,
        min_id: 0,
        claim_ids: 10,
        instance: InstanceId(1),
        lease_ms: 10,
        now_ms: 0,
        blind_max_id: None,
    };
    assert_eq!(store.allocate(&req).unwrap().segment.len(), 10);
    req.expected_version = 1;
    let last = store.allocate(&req).unwrap();
    assert_eq!(
        last.segment.end,
        super::SEGMENT_ID_LIMIT,
        "a short final segment up to the limit"
    );
    req.expected_version = 2;
    assert_eq!(
        store.allocate(&req).unwrap_err(),
        super::StoreError::Exhausted("t".into())
    );
}

fn alloc_request(expected_version: u64) -> AllocRequest {
    AllocRequest {
        tag: "t".into(),
        expected_version,
        ids: 10,
        min_id: 0,
        claim_ids: 2,
        instance: InstanceId(1),
        lease_ms: 100,
        now_ms: 0,
        blind_max_id: None,
    }
}

#[test]
fn edge_version_conflict() {
    use super::edges::VERSION_CONFLICT;
    let mut store = MemoryIdStore::new();
    store.create_tag("t", &TagSpec::simple(10)).unwrap();
    let _ = store.edges();
    store.allocate(&alloc_request(0)).unwrap();
    assert!(!store.edges().contains_key(VERSION_CONFLICT.name));
    // A second requester that read version 0 too.
    assert!(matches!(
        store.allocate(&alloc_request(0)),
        Err(super::StoreError::VersionConflict { .. })
    ));
    assert!(store.edges().contains_key(VERSION_CONFLICT.name));
    // The blind write of the flaw meets the same situation (and ignores it).
    let blind = AllocRequest {
        blind_max_id: Some(1),
        ..alloc_request(0)
    };
    let _ = store.allocate(&blind);
    assert!(store.edges().contains_key(VERSION_CONFLICT.name));
}

#[test]
fn edge_zombie_tail_reclaimed() {
    use super::edges::ZOMBIE_TAIL_RECLAIMED;
    let mut store = MemoryIdStore::new();
    store.create_tag("t", &TagSpec::simple(10)).unwrap();
    // One lease claimed whole (nothing to give back), one with an unclaimed tail.
    store
        .allocate(&AllocRequest {
            claim_ids: 10,
            ..alloc_request(0)
        })
        .unwrap();
    let _ = store.edges();
    assert_eq!(store.reclaim_expired(100).unwrap().len(), 1);
    assert!(
        !store.edges().contains_key(ZOMBIE_TAIL_RECLAIMED.name),
        "a fully claimed lease returns nothing"
    );
    store.allocate(&alloc_request(1)).unwrap();
    assert!(store.reclaim_expired(99).unwrap().is_empty(), "still live");
    assert!(!store.edges().contains_key(ZOMBIE_TAIL_RECLAIMED.name));
    let reclaimed = store.reclaim_expired(100).unwrap();
    assert_eq!(reclaimed[0].tail.len(), 8);
    assert!(store.edges().contains_key(ZOMBIE_TAIL_RECLAIMED.name));
}
