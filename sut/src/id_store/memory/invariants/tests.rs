//! Each invariant of [`MemoryIdStore::check_invariants`] holds after correct operations and
//! fires on a store crafted to break it.

use crate::id_store::rules::{Counter, WorkerRow};
use crate::id_store::{
    AllocRequest, IdStore, InstanceId, MemoryIdStore, ReleaseRequest, Segment, TagSpec,
    WorkerRequest,
};

fn alloc(version: u64, ids: u64, instance: u64) -> AllocRequest {
    AllocRequest {
        tag: "t".into(),
        expected_version: version,
        ids,
        min_id: 0,
        claim_ids: 2,
        instance: InstanceId(instance),
        lease_ms: 100,
        now_ms: 0,
        blind_max_id: None,
    }
}

/// Tag `t` (first ID 1, max_id 31): a lease of [11, 21), a pooled tail [5, 11) and a lease
/// of [21, 31); worker 0 of `ns` (count 2) held by instance 1; counter `c` at 3.
fn good() -> MemoryIdStore {
    let mut s = MemoryIdStore::new();
    s.create_tag("t", &TagSpec::simple(10)).unwrap();
    s.allocate(&alloc(0, 10, 1)).unwrap();
    s.allocate(&alloc(1, 10, 2)).unwrap();
    s.release(&ReleaseRequest {
        tag: "t".into(),
        instance: InstanceId(1),
        segment_start: 1,
        used_end: 5,
    })
    .unwrap();
    s.allocate(&AllocRequest {
        min_id: 11,
        ..alloc(2, 10, 3)
    })
    .unwrap();
    s.acquire_worker(&WorkerRequest {
        namespace: "ns".into(),
        worker_count: 2,
        instance: InstanceId(1),
        lease_ms: 100,
        now_ms: 0,
    })
    .unwrap();
    s.incr_by("c", 3, 0).unwrap();
    s.check_invariants().unwrap();
    s
}

fn seg(start: u64, end: u64) -> Segment {
    Segment {
        start,
        end,
        delta: 1,
    }
}

/// `break_it` applied to a good store makes the check fail with a message containing `needle`.
fn fires(needle: &str, break_it: impl FnOnce(&mut MemoryIdStore)) {
    let mut s = good();
    break_it(&mut s);
    let err = s.check_invariants().unwrap_err();
    assert!(err.contains(needle), "`{needle}` not in: {err}");
}

#[test]
fn the_good_store_is_what_the_crafted_ones_start_from() {
    let mut s = good();
    let leases = s.leases().unwrap();
    let segments: Vec<_> = leases.iter().map(|l| l.segment).collect();
    assert_eq!(segments, [seg(11, 21), seg(21, 31)]);
    assert_eq!(s.tags["t"].pool, [seg(5, 11)]);
}

#[test]
fn tag_rows_must_be_well_formed() {
    fires("is named", |s| {
        s.tags.get_mut("t").unwrap().tag = "u".into()
    });
    fires("not a valid spec", |s| {
        s.tags.get_mut("t").unwrap().step = 0
    });
    fires("no first ID", |s| {
        s.first_ids.clear();
    });
    fires("is not ≡", |s| {
        let row = s.tags.get_mut("t").unwrap();
        row.delta = 2;
        row.pool.clear();
        s.leases.clear();
    });
    fires("outside [first ID", |s| {
        s.first_ids.insert("t".into(), 40);
    });
    fires("outside [first ID", |s| {
        s.tags.get_mut("t").unwrap().max_id = u64::MAX;
    });
}

#[test]
fn pooled_ranges_must_be_non_empty_sorted_aligned_and_below_max_id() {
    fires("empty pooled range", |s| {
        s.tags.get_mut("t").unwrap().pool.push(seg(40, 40));
    });
    fires("residue class", |s| {
        s.tags.get_mut("t").unwrap().pool[0].delta = 2;
    });
    fires("pooled range", |s| {
        s.tags.get_mut("t").unwrap().pool.push(seg(31, 35));
    });
    fires("not sorted", |s| {
        s.tags.get_mut("t").unwrap().pool.insert(0, seg(3, 4));
        s.tags.get_mut("t").unwrap().pool.swap(0, 1);
    });
}

#[test]
fn leases_must_be_keyed_by_their_segment_known_and_claim_within_it() {
    fires("lease keyed", |s| {
        let lease = s.leases.remove(&("t".into(), 11)).unwrap();
        s.leases.insert(("t".into(), 12), lease);
    });
    fires("unknown tag", |s| {
        let mut lease = s.leases[&("t".to_owned(), 11)].clone();
        lease.tag = "u".into();
        s.leases.insert(("u".into(), 11), lease);
    });
    fires(
        "lease of instance-3 Segment { start: 21, end: 40, delta: 1 } outside",
        |s| {
            let lease = s.leases.get_mut(&("t".to_owned(), 21)).unwrap();
            lease.segment.end = 40;
        },
    );
    fires("outside its segment", |s| {
        s.leases.get_mut(&("t".to_owned(), 11)).unwrap().claim_end = 22;
    });
    fires("outside its segment", |s| {
        s.leases.get_mut(&("t".to_owned(), 11)).unwrap().claim_end = 10;
    });
}

#[test]
fn pooled_and_leased_ranges_must_not_overlap() {
    fires("overlaps", |s| {
        s.tags.get_mut("t").unwrap().pool.push(seg(15, 18));
    });
    fires("overlaps", |s| {
        s.tags.get_mut("t").unwrap().pool = vec![seg(2, 6), seg(5, 11)];
    });
    fires("overlaps", |s| {
        s.leases.get_mut(&("t".to_owned(), 11)).unwrap().segment.end = 22;
    });
}

#[test]
fn the_blind_write_flaw_overlaps_ranges_and_the_check_says_so() {
    // Instance 1 reads max_id 1; instances 2 and 3 are granted [1, 11) and [11, 21); then
    // instance 1 writes blindly from what it read, with a larger step.
    let mut s = MemoryIdStore::new();
    s.create_tag("t", &TagSpec::simple(10)).unwrap();
    s.allocate(&alloc(0, 10, 2)).unwrap();
    s.allocate(&alloc(1, 10, 3)).unwrap();
    s.check_invariants().unwrap();
    let blind = AllocRequest {
        blind_max_id: Some(1),
        ..alloc(0, 15, 1)
    };
    assert_eq!(s.allocate(&blind).unwrap().segment, seg(1, 16));
    let err = s.check_invariants().unwrap_err();
    assert!(
        err.contains("lease of instance-1 Segment { start: 1, end: 16")
            && err.contains("overlaps lease of instance-3"),
        "{err}"
    );
}

#[test]
fn worker_ids_stay_below_a_known_count_and_a_holder_holds_one() {
    let row = |holder: u64| WorkerRow {
        holder: Some(InstanceId(holder)),
        lease_expiry_ms: 100,
        reserved_ts: 0,
    };
    fires("not below its worker count", |s| {
        s.workers.insert(("ns".into(), 2), row(2));
    });
    fires("holds two worker ids", |s| {
        s.workers.insert(("ns".into(), 1), row(1));
    });
    // An unknown count (acquires named two) checks neither.
    let mut s = good();
    s.worker_counts.insert("ns".into(), None);
    s.workers.insert(("ns".into(), 5), row(1));
    s.check_invariants().unwrap();
}

#[test]
fn a_counter_never_claims_more_durable_than_live() {
    fires("durable", |s| {
        s.counters.insert(
            "c".into(),
            Counter {
                value: 2,
                durable: 3,
                synced_at_ms: 0,
            },
        );
    });
}
