//! Each rule's refusals and writes, on hand-made rows (no store involved).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::edge::Edges;
use crate::id_store::{
    AllocRequest, CounterDurability, InstanceId, LeaseRow, ReleaseRequest, RenewRequest,
    SEGMENT_ID_LIMIT, Segment, StoreError, TagRow, TagSpec, WorkerRequest,
};

const A: InstanceId = InstanceId(1);
const B: InstanceId = InstanceId(2);

fn seg(start: u64, end: u64) -> Segment {
    Segment {
        start,
        end,
        delta: 1,
    }
}

fn tag(max_id: u64, version: u64, pool: Vec<Segment>) -> TagRow {
    TagRow {
        tag: "t".into(),
        max_id,
        step: 10,
        delta: 1,
        remainder: 0,
        version,
        pool,
    }
}

fn alloc(expected_version: u64, ids: u64, min_id: u64) -> AllocRequest {
    AllocRequest {
        tag: "t".into(),
        expected_version,
        ids,
        min_id,
        claim_ids: 2,
        instance: A,
        lease_ms: 100,
        now_ms: 1000,
        blind_max_id: None,
    }
}

fn lease(segment: Segment, claim_end: u64, expiry: u64) -> LeaseRow {
    LeaseRow {
        tag: "t".into(),
        instance: A,
        segment,
        claim_end,
        lease_expiry_ms: expiry,
    }
}

fn none() -> BTreeSet<u64> {
    BTreeSet::new()
}

#[test]
fn create_tag_refuses_bad_specs_and_existing_tags_and_aligns_the_first_id() {
    let bad = create_tag("t", &TagSpec::simple(0), false).unwrap_err();
    assert!(matches!(bad, StoreError::InvalidSpec { field, .. } if field == "step"));
    assert_eq!(
        create_tag("t", &TagSpec::simple(5), true),
        Err(StoreError::TagExists("t".into()))
    );
    let spec = TagSpec {
        first_id: 5,
        step: 4,
        delta: 3,
        remainder: 1,
    };
    let row = create_tag("t", &spec, false).unwrap();
    assert_eq!((row.max_id, row.version, row.pool.len()), (7, 0, 0));
}

#[test]
fn allocate_refuses_in_order_zero_sizes_unknown_tag_and_stale_version() {
    let row = tag(1, 3, vec![]);
    let zero = |ids, claim_ids| AllocRequest {
        claim_ids,
        ..alloc(3, ids, 0)
    };
    let err = allocate(&zero(0, 0), Some(&row), &none(), &mut Edges::new()).unwrap_err();
    assert!(matches!(err, StoreError::InvalidSpec { field, .. } if field == "ids"));
    let err = allocate(&zero(5, 0), None, &none(), &mut Edges::new()).unwrap_err();
    assert!(matches!(err, StoreError::InvalidSpec { field, .. } if field == "claim_ids"));
    assert_eq!(
        allocate(&alloc(3, 5, 0), None, &none(), &mut Edges::new()),
        Err(StoreError::UnknownTag("t".into()))
    );
    assert_eq!(
        allocate(&alloc(2, 5, 0), Some(&row), &none(), &mut Edges::new()),
        Err(StoreError::VersionConflict {
            tag: "t".into(),
            expected: 2,
            actual: 3
        })
    );
}

#[test]
fn a_fresh_grant_moves_max_id_bumps_the_version_and_records_the_lease() {
    let write = allocate(
        &alloc(3, 5, 0),
        Some(&tag(11, 3, vec![])),
        &none(),
        &mut Edges::new(),
    )
    .unwrap();
    assert_eq!(write.row, tag(16, 4, vec![]));
    assert!(!write.pool_changed && !write.replace_lease);
    let grant = &write.grant;
    assert_eq!(
        (grant.segment, grant.version, grant.claim_end),
        (seg(11, 16), 4, 13)
    );
    assert_eq!(
        (grant.lease_expiry_ms, grant.from_pool, grant.tag_step),
        (1100, false, 10)
    );
    assert_eq!(write.lease, lease(seg(11, 16), 13, 1100));
}

#[test]
fn a_pooled_grant_takes_the_first_range_at_or_above_min_id_and_keeps_max_id() {
    let row = tag(100, 0, vec![seg(10, 20), seg(40, 50)]);
    let write = allocate(&alloc(0, 3, 15), Some(&row), &none(), &mut Edges::new()).unwrap();
    assert_eq!(write.grant.segment, seg(15, 18));
    assert!(write.grant.from_pool && write.pool_changed);
    assert_eq!(
        write.row,
        tag(100, 1, vec![seg(10, 15), seg(18, 20), seg(40, 50)])
    );
    // Nothing in the pool at or above min_id: fresh IDs.
    let write = allocate(&alloc(0, 3, 60), Some(&row), &none(), &mut Edges::new()).unwrap();
    assert_eq!(
        (write.grant.segment, write.pool_changed),
        (seg(100, 103), false)
    );
    assert_eq!(write.row.pool, row.pool);
}

#[test]
fn the_id_space_ends_with_a_short_segment_then_exhausted() {
    let near = tag(SEGMENT_ID_LIMIT - 2, 0, vec![]);
    let write = allocate(&alloc(0, 5, 0), Some(&near), &none(), &mut Edges::new()).unwrap();
    assert_eq!(
        write.grant.segment,
        seg(SEGMENT_ID_LIMIT - 2, SEGMENT_ID_LIMIT)
    );
    assert_eq!(
        allocate(
            &alloc(1, 5, 0),
            Some(&write.row),
            &none(),
            &mut Edges::new()
        ),
        Err(StoreError::Exhausted("t".into()))
    );
}

#[test]
fn overlapping_pools_and_leases_left_by_the_blind_write_refuse_a_grant() {
    // Two pooled ranges starting at 0 (only the blind-write flaw makes that): the rewritten
    // pool would hold two rows with the same primary key.
    let row = tag(100, 0, vec![seg(0, 5), seg(0, 10)]);
    assert_eq!(
        allocate(&alloc(0, 1, 2), Some(&row), &none(), &mut Edges::new()),
        Err(pool_taken("t", 0))
    );
    // A lease already starts where the fresh segment would.
    let held = BTreeSet::from([100]);
    assert_eq!(
        allocate(
            &alloc(0, 5, 0),
            Some(&tag(100, 0, vec![])),
            &held,
            &mut Edges::new()
        ),
        Err(lease_taken("t", 100))
    );
}

#[test]
fn the_blind_write_skips_version_and_pool_and_replaces_the_lease() {
    let row = tag(50, 7, vec![seg(10, 20)]);
    let held = BTreeSet::from([30]);
    let req = AllocRequest {
        blind_max_id: Some(30),
        ..alloc(0, 5, 0)
    };
    let write = allocate(&req, Some(&row), &held, &mut Edges::new()).unwrap();
    assert_eq!(
        write.grant.segment,
        seg(30, 35),
        "what the requester read, not max_id"
    );
    assert_eq!(
        write.row,
        tag(35, 8, vec![seg(10, 20)]),
        "max_id moved back"
    );
    assert!(write.replace_lease && !write.pool_changed && !write.grant.from_pool);
    let spent = AllocRequest {
        blind_max_id: Some(SEGMENT_ID_LIMIT),
        ..req
    };
    assert_eq!(
        allocate(&spent, Some(&row), &held, &mut Edges::new()),
        Err(StoreError::Exhausted("t".into()))
    );
}

fn renewal(instance: InstanceId, claim_end: u64, now_ms: u64) -> RenewRequest {
    RenewRequest {
        tag: "t".into(),
        instance,
        segment_start: 10,
        claim_end,
        lease_ms: 100,
        now_ms,
    }
}

#[test]
fn renew_refuses_a_missing_or_foreign_lease() {
    let lost = Err(StoreError::LeaseLost {
        tag: "t".into(),
        segment_start: 10,
        instance: B,
    });
    assert_eq!(renew(&renewal(B, 15, 0), None), lost);
    let held = lease(seg(10, 20), 12, 500);
    assert_eq!(renew(&renewal(B, 15, 0), Some(&held)), lost);
}

#[test]
fn renew_raises_the_claim_up_to_the_segment_end_and_never_lowers_anything() {
    let held = lease(seg(10, 20), 12, 500);
    let raised = renew(&renewal(A, 15, 450), Some(&held)).unwrap();
    assert_eq!((raised.claim_end, raised.lease_expiry_ms), (15, 550));
    let clamped = renew(&renewal(A, 99, 0), Some(&held)).unwrap();
    assert_eq!((clamped.claim_end, clamped.lease_expiry_ms), (20, 500));
    let lower = renew(&renewal(A, 11, 0), Some(&held)).unwrap();
    assert_eq!(lower.claim_end, 12);
}

fn release_req(instance: InstanceId, used_end: u64) -> ReleaseRequest {
    ReleaseRequest {
        tag: "t".into(),
        instance,
        segment_start: 10,
        used_end,
    }
}

#[test]
fn release_returns_the_aligned_tail_or_nothing() {
    let held = lease(seg(10, 20), 12, 500);
    assert_eq!(
        release(&release_req(A, 14), Some(&held), &[]),
        Ok(Some(seg(14, 20)))
    );
    assert_eq!(release(&release_req(A, 20), Some(&held), &[]), Ok(None));
    assert_eq!(
        release(&release_req(A, 3), Some(&held), &[]),
        Ok(Some(seg(10, 20))),
        "used_end below the segment clamps to its start"
    );
    let odd = LeaseRow {
        segment: Segment {
            start: 10,
            end: 20,
            delta: 3,
        },
        ..held.clone()
    };
    let tail = release(&release_req(A, 11), Some(&odd), &[])
        .unwrap()
        .unwrap();
    assert_eq!(
        (tail.start, tail.end),
        (13, 20),
        "aligned to the residue class"
    );
}

#[test]
fn release_refuses_a_foreign_lease_and_a_tail_on_a_pooled_start() {
    let held = lease(seg(10, 20), 12, 500);
    assert!(matches!(
        release(&release_req(B, 14), Some(&held), &[]),
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        release(&release_req(A, 14), None, &[]),
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(
        release(&release_req(A, 14), Some(&held), &[seg(14, 30)]),
        Err(pool_taken("t", 14))
    );
}

#[test]
fn reclaim_pools_the_unclaimed_tails_of_expired_leases_only() {
    let leases = [
        lease(seg(10, 20), 12, 100),
        lease(seg(20, 30), 30, 100),
        lease(seg(30, 40), 31, 101),
    ];
    let tags = BTreeMap::from([("t".to_owned(), tag(40, 3, vec![]))]);
    let expired = reclaim_expired(100, &leases, &tags, &mut Edges::new()).unwrap();
    let got: Vec<_> = expired
        .iter()
        .map(|e| (e.segment_start, e.reclaimed.instance, e.reclaimed.tail))
        .collect();
    assert_eq!(
        got,
        [(10, A, seg(12, 20)), (20, A, seg(30, 30))],
        "the fully claimed lease reports an empty tail; the live one stays"
    );
    assert!(lease_expired(&leases[0], 100) && !lease_expired(&leases[2], 100));
}

#[test]
fn reclaim_is_all_or_nothing_when_a_tail_start_is_taken() {
    let leases = [lease(seg(10, 20), 12, 100), lease(seg(12, 20), 12, 100)];
    let tags = BTreeMap::from([("t".to_owned(), tag(40, 3, vec![]))]);
    assert_eq!(
        reclaim_expired(100, &leases, &tags, &mut Edges::new()),
        Err(pool_taken("t", 12)),
        "two tails of one sweep start at 12"
    );
    let pooled = BTreeMap::from([("t".to_owned(), tag(40, 3, vec![seg(12, 15)]))]);
    assert_eq!(
        reclaim_expired(100, &leases[..1], &pooled, &mut Edges::new()),
        Err(pool_taken("t", 12))
    );
}

fn worker_req(instance: InstanceId, worker_count: u32, now_ms: u64) -> WorkerRequest {
    WorkerRequest {
        namespace: "ns".into(),
        worker_count,
        instance,
        lease_ms: 100,
        now_ms,
    }
}

fn worker(holder: Option<InstanceId>, lease_expiry_ms: u64, reserved_ts: u64) -> WorkerRow {
    WorkerRow {
        holder,
        lease_expiry_ms,
        reserved_ts,
    }
}

#[test]
fn acquire_worker_refuses_zero_ids_and_a_full_namespace() {
    let err = acquire_worker(&worker_req(A, 0, 0), &BTreeMap::new()).unwrap_err();
    assert!(matches!(err, StoreError::InvalidSpec { field, .. } if field == "worker_count"));
    let rows = BTreeMap::from([(0, worker(Some(B), 500, 0))]);
    assert_eq!(
        acquire_worker(&worker_req(A, 1, 100), &rows),
        Err(StoreError::NoFreeWorker {
            namespace: "ns".into(),
            worker_count: 1
        })
    );
}

#[test]
fn acquire_worker_prefers_its_own_id_then_the_lowest_free_keeping_reservations() {
    let rows = BTreeMap::from([
        (0, worker(Some(B), 500, 7)),
        (1, worker(None, 0, 40)),
        (2, worker(Some(A), 50, 9)),
    ]);
    let (id, row) = acquire_worker(&worker_req(A, 3, 100), &rows).unwrap();
    assert_eq!(
        (id, row),
        (2, worker(Some(A), 200, 9)),
        "its own id, even expired"
    );
    let (id, row) = acquire_worker(&worker_req(InstanceId(3), 3, 100), &rows).unwrap();
    assert_eq!(
        (id, row),
        (1, worker(Some(InstanceId(3)), 200, 40)),
        "released"
    );
    let (id, row) = acquire_worker(&worker_req(InstanceId(3), 3, 500), &rows).unwrap();
    assert_eq!(
        (id, row),
        (0, worker(Some(InstanceId(3)), 600, 7)),
        "expired"
    );
    let (id, row) = acquire_worker(&worker_req(InstanceId(3), 4, 0), &BTreeMap::new()).unwrap();
    assert_eq!((id, row.lease(id).reserved_ts), (0, 0), "never leased");
}

#[test]
fn renew_and_release_worker_refuse_non_holders_and_keep_the_reservation() {
    let req = |instance, reserve_ts, now_ms| WorkerRenewal {
        namespace: "ns",
        worker_id: 4,
        instance,
        reserve_ts,
        lease_ms: 100,
        now_ms,
    };
    let lost = |instance| {
        Err(StoreError::WorkerLeaseLost {
            namespace: "ns".into(),
            worker_id: 4,
            instance,
        })
    };
    let held = worker(Some(A), 500, 70);
    assert_eq!(renew_worker(&req(A, 5, 0), None), lost(A));
    assert_eq!(renew_worker(&req(B, 5, 0), Some(&held)), lost(B));
    assert_eq!(
        renew_worker(&req(A, 90, 450), Some(&held)),
        Ok(worker(Some(A), 550, 90))
    );
    assert_eq!(
        renew_worker(&req(A, 5, 0), Some(&held)),
        Ok(held.clone()),
        "neither lease nor reservation is lowered"
    );
    assert_eq!(release_worker("ns", 4, B, Some(&held)), lost(B));
    assert_eq!(release_worker("ns", 4, A, None), lost(A));
    let released = release_worker("ns", 4, A, Some(&held)).unwrap();
    assert_eq!(released, worker(None, 500, 70));
    assert_eq!(renew_worker(&req(A, 5, 0), Some(&released)), lost(A));
}

#[test]
fn incr_by_syncs_as_its_durability_says_and_refuses_overflow() {
    let every = incr_by(
        "k",
        Counter::loaded(5, 0),
        2,
        10,
        CounterDurability::EveryWrite,
    )
    .unwrap();
    assert!(every.sync);
    assert_eq!(
        every.counter,
        Counter {
            value: 7,
            durable: 7,
            synced_at_ms: 10
        }
    );
    let periodic = CounterDurability::Periodic { interval_ms: 100 };
    let early = incr_by("k", Counter::loaded(5, 0), 2, 99, periodic).unwrap();
    assert!(!early.sync);
    assert_eq!(
        early.counter,
        Counter {
            value: 7,
            durable: 5,
            synced_at_ms: 0
        }
    );
    let due = incr_by("k", early.counter, 1, 100, periodic).unwrap();
    assert!(due.sync);
    assert_eq!(
        due.counter,
        Counter {
            value: 8,
            durable: 8,
            synced_at_ms: 100
        }
    );
    assert_eq!(
        incr_by("k", Counter::loaded(u64::MAX, 0), 1, 0, periodic),
        Err(StoreError::Exhausted("k".into()))
    );
}
