use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::edge::Observed;
use crate::id_store::{IdStore, MemoryIdStore, TagSpec};

const TAG: &str = "order";

fn cfg(instance: u64) -> AllocatorConfig {
    AllocatorConfig {
        lease_ms: 1_000,
        drift_ms_max: 50,
        renew_interval_ms: 300,
        request_timeout_ms: 100,
        ..AllocatorConfig::new(TAG, InstanceId(instance))
    }
}

/// Performs every queued call at once, as a driver next to its store would.
fn pump(alloc: &mut SegmentAllocator, store: &mut MemoryIdStore, now: Now) -> usize {
    let mut calls = 0;
    while let Some(req) = alloc.poll_request() {
        calls += 1;
        let reply = req.call.execute(store);
        alloc.handle_reply(req.id, reply, now);
    }
    calls
}

/// Takes one ID, pumping the store until it is there (bounded).
fn take(alloc: &mut SegmentAllocator, store: &mut MemoryIdStore, now: Now) -> Take {
    for _ in 0..8 {
        let take = alloc.next_id(now);
        pump(alloc, store, now);
        if take != Take::Pending {
            return take;
        }
    }
    Take::Pending
}

fn id_of(take: Take) -> u64 {
    match take {
        Take::Block(block) => {
            assert_eq!(block.count, 1);
            block.start
        }
        other => panic!("expected an ID, got {other:?}"),
    }
}

fn store_with(step: u64) -> MemoryIdStore {
    let mut store = MemoryIdStore::new();
    store.create_tag(TAG, &TagSpec::simple(step)).unwrap();
    store
}

#[test]
fn double_buffer_prefetches_at_ten_percent() {
    let mut store = store_with(100);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let now = Now::both(0);
    assert_eq!(id_of(take(&mut alloc, &mut store, now)), 1);
    assert_eq!(alloc.health(now).next, None, "1% used: no prefetch yet");
    for expected in 2..=10 {
        assert_eq!(id_of(take(&mut alloc, &mut store, now)), expected);
    }
    let health = alloc.health(now);
    assert!(
        health.next.is_some(),
        "10% used: the next segment is fetched: {health:?}"
    );
    assert_eq!(health.stats.reloads, 2);
    // The switch to the next buffer costs no store round trip.
    for expected in 11..=100 {
        assert_eq!(id_of(take(&mut alloc, &mut store, now)), expected);
    }
    let id = alloc.next_id(now);
    assert!(
        matches!(id, Take::Block(IdBlock { start: 101, .. })),
        "{id:?}"
    );
    assert_eq!(alloc.stats().buffer_switches, 1);
}

#[test]
fn both_buffers_empty_says_pending_then_unavailable() {
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let mut now = Now::both(0);
    assert_eq!(alloc.next_id(now), Take::Pending);
    let read = alloc.poll_request().expect("a read is queued");
    assert!(matches!(read.call, StoreCall::Read { .. }));
    // The store never answers: after three timed-out fetches the allocator says Unavailable.
    let mut answer = Take::Pending;
    for _ in 0..10 {
        now = Now::both(alloc.poll_timeout().expect("a timeout is armed"));
        alloc.handle_timeout(now);
        while alloc.poll_request().is_some() {}
        answer = alloc.next_id(now);
        if answer != Take::Pending {
            break;
        }
    }
    assert!(
        matches!(
            answer,
            Take::Unavailable(Unavailable::StoreUnreachable { failures: 3, .. })
        ),
        "{answer:?}"
    );
    assert_eq!(alloc.stats().fetch_failures, 3);
}

#[test]
fn unknown_tag_is_a_permanent_error() {
    let mut store = MemoryIdStore::new();
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let take = take(&mut alloc, &mut store, Now::both(0));
    assert_eq!(
        take,
        Take::Unavailable(Unavailable::Permanent(StoreError::UnknownTag(TAG.into())))
    );
}

#[test]
fn version_conflict_is_retried() {
    let mut store = store_with(10);
    let mut a = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let mut b = SegmentAllocator::new(cfg(2), Now::both(0)).unwrap();
    let now = Now::both(0);
    assert_eq!(a.next_id(now), Take::Pending);
    assert_eq!(b.next_id(now), Take::Pending);
    // Both read version 0.
    let (ra, rb) = (a.poll_request().unwrap(), b.poll_request().unwrap());
    a.handle_reply(ra.id, ra.call.execute(&mut store), now);
    b.handle_reply(rb.id, rb.call.execute(&mut store), now);
    // A wins the optimistic lock, B conflicts and re-reads.
    pump(&mut a, &mut store, now);
    pump(&mut b, &mut store, now);
    assert_eq!(b.stats().conflicts, 1);
    let (ia, ib) = (
        id_of(take(&mut a, &mut store, now)),
        id_of(take(&mut b, &mut store, now)),
    );
    assert_ne!(ia, ib);
    assert_eq!((ia, ib), (1, 11));
}

#[test]
fn claims_bound_what_a_zombie_can_issue_and_the_tail_is_reclaimed() {
    let mut store = store_with(100);
    let mut zombie = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let now = Now::both(0);
    let first = id_of(take(&mut zombie, &mut store, now));
    assert_eq!(first, 1);
    // Partitioned from the store: keep issuing, renewals go nowhere.
    let mut issued = vec![first];
    let mut t = 0;
    loop {
        t += 10;
        let now = Now::both(t);
        zombie.handle_timeout(now);
        while zombie.poll_request().is_some() {}
        match zombie.next_id(now) {
            Take::Block(block) => issued.extend(block.ids()),
            Take::Pending | Take::Unavailable(_) => break,
            Take::Degraded(_) => unreachable!(),
        }
    }
    // It stopped at its claim (25% of 100 IDs), well before the lease could expire.
    assert_eq!(issued.len(), 25);
    assert!(t < 1_000);
    // The store reclaims the unclaimed tail once the lease expires on its clock.
    let reclaimed = store.reclaim_expired(1_000).unwrap();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(
        reclaimed[0].tail,
        Segment {
            start: 26,
            end: 101,
            delta: 1
        }
    );
    // A fresh instance is granted the tail first.
    let mut fresh = SegmentAllocator::new(cfg(2), Now::both(1_000)).unwrap();
    let id = id_of(take(&mut fresh, &mut store, Now::both(1_000)));
    assert_eq!(id, 26);
    assert_eq!(fresh.stats().pool_grants, 1);
    assert!(!issued.contains(&id));
    // The zombie, even with its clock far behind, cannot issue: its claim is used up and the
    // lease deadline passed on its monotonic clock.
    let late = zombie.next_id(Now {
        wall_ms: 0,
        mono_ms: 2_000,
    });
    assert!(!matches!(late, Take::Block(_)), "{late:?}");
}

#[test]
fn lease_expiry_by_the_holders_own_clock_drops_the_segment() {
    let mut store = store_with(1_000);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    id_of(take(&mut alloc, &mut store, Now::both(0)));
    // No renewal gets through; at 1000 - 50 ms (drift margin) the lease cannot be proven.
    let now = Now {
        wall_ms: 0,
        mono_ms: 950,
    };
    assert!(!matches!(alloc.next_id(now), Take::Block(_)));
    assert_eq!(alloc.stats().leases_expired, 1);
    assert!(alloc.stats().ids_abandoned > 0);
}

#[test]
fn degraded_mode_issues_flagged_snowflake_ids_when_the_store_is_gone() {
    let mut store = store_with(10);
    let lease = store
        .acquire_worker(&crate::id_store::WorkerRequest {
            namespace: DEGRADED_NAMESPACE.into(),
            worker_count: 512,
            instance: InstanceId(1),
            lease_ms: 60_000,
            now_ms: 0,
        })
        .unwrap();
    let t0 = 1_700_000_000_000;
    let worker = WorkerConfig {
        layout: crate::snowflake::Layout {
            time_bits: 41,
            worker_bits: 9,
            seq_bits: 12,
            ..Default::default()
        },
        reserve_ahead_ms: 60_000,
        ..WorkerConfig::default()
    };
    let config = AllocatorConfig {
        degraded: Some(DegradedConfig {
            worker,
            worker_id: lease.worker_id,
            reserved_ts: lease.reserved_ts,
        }),
        ..cfg(1)
    };
    let mut alloc = SegmentAllocator::new(
        config,
        Now {
            wall_ms: t0,
            mono_ms: 0,
        },
    )
    .unwrap();
    // While the store is reachable, the degraded reservation is kept ahead.
    let now = Now {
        wall_ms: t0,
        mono_ms: 0,
    };
    id_of(take(&mut alloc, &mut store, now));
    alloc.handle_timeout(now);
    pump(&mut alloc, &mut store, now);
    // Now the store disappears: let the segment's lease lapse and fetches fail.
    let mut t = 0;
    let mut degraded = Vec::new();
    while degraded.len() < 10 && t < 20_000 {
        t += 50;
        let now = Now {
            wall_ms: t0 + t,
            mono_ms: t,
        };
        alloc.handle_timeout(now);
        while alloc.poll_request().is_some() {}
        match alloc.next_id(now) {
            Take::Degraded(id) => degraded.push(id),
            Take::Block(_) | Take::Pending | Take::Unavailable(_) => {}
        }
    }
    assert_eq!(
        degraded.len(),
        10,
        "health: {:?}",
        alloc.health(Now {
            wall_ms: t0 + t,
            mono_ms: t
        })
    );
    assert!(
        degraded
            .iter()
            .all(|id| id & DEGRADED_FLAG != 0 && *id < 1 << 63)
    );
    assert!(degraded.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(alloc.stats().degraded_issued, 10);
}

#[test]
fn config_errors_name_the_field() {
    let bad = AllocatorConfig {
        claim_pct: 0,
        ..cfg(1)
    };
    let err = SegmentAllocator::new(bad, Now::both(0)).unwrap_err();
    assert_eq!(err.field, "claim_pct");
    let bad = AllocatorConfig {
        lease_ms: 100,
        drift_ms_max: 50,
        ..cfg(1)
    };
    assert_eq!(
        SegmentAllocator::new(bad, Now::both(0)).unwrap_err().field,
        "lease_ms"
    );
    let bad = AllocatorConfig {
        tag: String::new(),
        ..cfg(1)
    };
    assert_eq!(
        SegmentAllocator::new(bad, Now::both(0)).unwrap_err().field,
        "tag"
    );
}

#[test]
fn health_reports_buffers_and_gaps() {
    let mut store = store_with(50);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    for _ in 0..20 {
        id_of(take(&mut alloc, &mut store, Now::both(0)));
    }
    let health = alloc.health(Now::both(0));
    let current = health.current.expect("a current buffer");
    assert_eq!(
        current.segment,
        Segment {
            start: 1,
            end: 51,
            delta: 1
        }
    );
    assert_eq!(current.remaining_pct, 60);
    assert_eq!(health.last_issued, Some(20));
    assert_eq!(health.stats.largest_gap, 0);
    assert_eq!(health.fetch, "idle");
}

// ---------------------------------------------------------------------------------------------
// Many allocators, one store, an adversarial network.

#[derive(Clone, Debug)]
enum Action {
    /// Allocator `i` takes up to `n` IDs.
    Take { i: usize, n: u64 },
    /// Deliver the in-flight message at this index (modulo the queue length).
    Deliver { k: usize, duplicate: bool },
    /// Lose the in-flight message at this index.
    Drop { k: usize },
    /// Time passes; due timeouts fire.
    Advance { ms: u64 },
    /// The store reclaims expired leases.
    Reclaim,
    /// Allocator `i` crashes and restarts as a new instance.
    Restart { i: usize },
}

fn action(allocators: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..allocators, 1..8u64).prop_map(|(i, n)| Action::Take { i, n }),
        6 => (any::<usize>(), proptest::bool::weighted(0.1)).prop_map(|(k, duplicate)| Action::Deliver { k, duplicate }),
        1 => any::<usize>().prop_map(|k| Action::Drop { k }),
        3 => (0..120u64).prop_map(|ms| Action::Advance { ms }),
        1 => Just(Action::Reclaim),
        1 => (0..allocators).prop_map(|i| Action::Restart { i }),
    ]
}

fn step_policy() -> impl Strategy<Value = StepPolicy> {
    prop_oneof![
        (1..30u64).prop_map(|step| StepPolicy::Fixed { step }),
        (10..200u64).prop_map(|step_max| StepPolicy::Leaf { step_max }),
        (1..20u64, 20..100u64).prop_map(|(base, step_max)| StepPolicy::SeedLog { base, step_max }),
    ]
}

enum Message {
    ToStore {
        from: InstanceId,
        req: Request,
    },
    ToAllocator {
        to: InstanceId,
        id: u64,
        reply: StoreReply,
    },
}

struct Node {
    alloc: SegmentAllocator,
    born_ms: u64,
    issued: Vec<u64>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// For any interleaving of several allocators over one store — answers delayed, lost,
    /// duplicated and reordered, random steps, leases expiring and being reclaimed, allocators
    /// crashing and restarting — no ID is issued twice and each allocator instance's IDs increase.
    #[test]
    fn allocators_never_issue_an_id_twice(
        actions in proptest::collection::vec(action(3), 1..400),
        policies in proptest::collection::vec(step_policy(), 3),
        tag_step in 1..40u64,
        claim_pct in 1..=100u8,
        prefetch_used_pct in 1..=100u8,
    ) {
        let mut store = MemoryIdStore::new();
        store.create_tag(TAG, &TagSpec::simple(tag_step)).unwrap();
        let make = |instance: u64, policy: StepPolicy, now_ms: u64| {
            let config = AllocatorConfig { step: policy, claim_pct, prefetch_used_pct, ..cfg(instance) };
            Node { alloc: SegmentAllocator::new(config, Now::both(0)).unwrap(), born_ms: now_ms, issued: Vec::new() }
        };
        let mut nodes: Vec<Node> = (0..3).map(|i| make(i as u64 + 1, policies[i], 0)).collect();
        let mut next_instance = 4;
        let mut network: Vec<Message> = Vec::new();
        let mut t = 0u64;
        let mut owner: BTreeMap<u64, InstanceId> = BTreeMap::new();
        let now_of = |node: &Node, t: u64| Now { wall_ms: t, mono_ms: t - node.born_ms };
        for act in actions {
            match act {
                Action::Take { i, n } => {
                    let node = &mut nodes[i];
                    let now = now_of(node, t);
                    if let Take::Block(block) = node.alloc.take_block(now, n) {
                        for id in block.ids() {
                            let instance = node.alloc.config().instance;
                            if let Some(previous) = owner.insert(id, instance) {
                                prop_assert!(false, "ID {} issued by {} and again by {}", id, previous, instance);
                            }
                            if let Some(last) = node.issued.last() {
                                prop_assert!(id > *last, "{} issued {} after {}", instance, id, last);
                            }
                            node.issued.push(id);
                        }
                    }
                }
                Action::Deliver { k, duplicate } if !network.is_empty() => {
                    let k = k % network.len();
                    let message = network.remove(k);
                    match message {
                        Message::ToStore { from, mut req } => {
                            req.call.set_store_now(t);
                            let reply = req.call.execute(&mut store);
                            if duplicate {
                                // The request is delivered twice (a retransmission).
                                let again = req.call.execute(&mut store);
                                network.push(Message::ToAllocator { to: from, id: req.id, reply: again });
                            }
                            network.push(Message::ToAllocator { to: from, id: req.id, reply });
                        }
                        Message::ToAllocator { to, id, reply } => {
                            if let Some(node) = nodes.iter_mut().find(|n| n.alloc.config().instance == to) {
                                let now = now_of(node, t);
                                if duplicate {
                                    node.alloc.handle_reply(id, reply.clone(), now);
                                }
                                node.alloc.handle_reply(id, reply, now);
                            }
                        }
                    }
                }
                Action::Deliver { .. } => {}
                Action::Drop { k } if !network.is_empty() => {
                    let k = k % network.len();
                    network.remove(k);
                }
                Action::Drop { .. } => {}
                Action::Advance { ms } => {
                    t += ms;
                    for node in &mut nodes {
                        let now = now_of(node, t);
                        if node.alloc.poll_timeout().is_some_and(|due| due <= now.mono_ms) {
                            node.alloc.handle_timeout(now);
                        }
                    }
                }
                Action::Reclaim => {
                    store.reclaim_expired(t).unwrap();
                }
                Action::Restart { i } => {
                    nodes[i] = make(next_instance, policies[i], t);
                    next_instance += 1;
                }
            }
            for node in &mut nodes {
                while let Some(req) = node.alloc.poll_request() {
                    network.push(Message::ToStore { from: node.alloc.config().instance, req });
                }
            }
            prop_assert!(network.len() < 10_000);
        }
    }
}

#[test]
fn region_pools_never_collide() {
    // Tinyid's delta/remainder: three stores (regions), store k issues only IDs ≡ k (mod 3).
    let mut all = BTreeSet::new();
    for remainder in 0..3 {
        let mut store = MemoryIdStore::new();
        store
            .create_tag(
                TAG,
                &TagSpec {
                    first_id: 1,
                    step: 7,
                    delta: 3,
                    remainder,
                },
            )
            .unwrap();
        for instance in 0..2 {
            let mut alloc = SegmentAllocator::new(cfg(instance + 1), Now::both(0)).unwrap();
            for _ in 0..100 {
                let id = id_of(take(&mut alloc, &mut store, Now::both(0)));
                assert_eq!(id % 3, remainder);
                assert!(all.insert(id), "{id} issued twice");
            }
        }
    }
    assert_eq!(all.len(), 600);
}

/// Two allocators read the tag row before either writes (the race a version check exists for).
fn racing_reloads(flaw: Option<Flaw>) -> (u64, u64) {
    let mut store = store_with(100);
    let now = Now::both(0);
    let mut a = SegmentAllocator::new(AllocatorConfig { flaw, ..cfg(1) }, now).unwrap();
    let mut b = SegmentAllocator::new(AllocatorConfig { flaw, ..cfg(2) }, now).unwrap();
    assert_eq!(a.next_id(now), Take::Pending);
    assert_eq!(b.next_id(now), Take::Pending);
    let (ra, rb) = (a.poll_request().unwrap(), b.poll_request().unwrap());
    assert!(matches!(ra.call, StoreCall::Read { .. }));
    let (reply_a, reply_b) = (ra.call.execute(&mut store), rb.call.execute(&mut store));
    a.handle_reply(ra.id, reply_a, now);
    b.handle_reply(rb.id, reply_b, now);
    pump(&mut a, &mut store, now);
    pump(&mut b, &mut store, now);
    (
        id_of(take(&mut a, &mut store, now)),
        id_of(take(&mut b, &mut store, now)),
    )
}

#[test]
fn version_check_keeps_racing_reloads_apart() {
    let (a, b) = racing_reloads(None);
    assert_ne!(a, b);
}

#[test]
fn flaw_segment_no_version_check_grants_one_range_twice() {
    let (a, b) = racing_reloads(Some(Flaw::SegmentNoVersionCheck));
    assert_eq!(a, b, "the blind write gives both the same range");
}

#[test]
fn flaw_counter_no_persist_issues_before_the_write() {
    let (a, b) = racing_reloads(Some(Flaw::CounterNoPersist));
    assert_eq!(a, b, "both issue from the max_id they read");
}

/// A holder partitioned from its store after its first renewal: how far does it issue, and
/// what does the store hand out once the lease has expired?
fn zombie(flaw: Option<Flaw>) -> (Vec<u64>, u64) {
    let mut store = store_with(1_000);
    let mut a = SegmentAllocator::new(AllocatorConfig { flaw, ..cfg(1) }, Now::both(0)).unwrap();
    let mut issued = vec![id_of(take(&mut a, &mut store, Now::both(0)))];
    // Connected for a while: renewals reach the store.
    for t in (10..400).step_by(10) {
        issued.push(id_of(take(&mut a, &mut store, Now::both(t))));
    }
    // Partitioned: the holder keeps issuing while it believes its lease holds.
    for t in (400..3_000).step_by(10) {
        let now = Now::both(t);
        if let Take::Block(block) = a.next_id(now) {
            issued.extend(block.ids());
        }
        while a.poll_request().is_some() {}
    }
    store.reclaim_expired(5_000).unwrap();
    let mut b = SegmentAllocator::new(cfg(2), Now::both(5_000)).unwrap();
    let first_of_b = id_of(take(&mut b, &mut store, Now::both(5_000)));
    (issued, first_of_b)
}

#[test]
fn write_ahead_claims_keep_a_zombie_out_of_the_reclaimed_range() {
    let (issued, first_of_b) = zombie(None);
    assert!(!issued.contains(&first_of_b));
}

#[test]
fn flaw_reclaim_no_drift_margin_lets_a_zombie_overlap() {
    let (issued, first_of_b) = zombie(Some(Flaw::ReclaimNoDriftMargin));
    assert!(
        issued.contains(&first_of_b),
        "the reclaimed tail starts at the last usage report, below what the zombie issued"
    );
}

/// Every invariant [`SegmentAllocator::check_invariants`] states fires on a crafted state, and
/// holds along a correct run.
#[test]
fn allocator_invariants_hold_on_a_run_and_fire_on_crafted_states() {
    let mut store = store_with(10);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    for t in 0..30 {
        let _ = take(&mut alloc, &mut store, Now::both(t));
        alloc.check_invariants().unwrap();
    }
    let held = alloc
        .current
        .clone()
        .expect("a current buffer after issuing");
    let mut bad = alloc.clone();
    bad.current.as_mut().unwrap().claim_end = held.segment.end + 1;
    assert!(bad.check_invariants().unwrap_err().contains("claim"));
    let mut bad = alloc.clone();
    let current = bad.current.as_mut().unwrap();
    current.claim_end = current.segment.start;
    current.next = current.segment.start + current.segment.delta;
    assert!(
        bad.check_invariants()
            .unwrap_err()
            .contains("beyond the acknowledged claim")
    );
    let mut bad = alloc.clone();
    let mut next = held.clone();
    next.next = alloc.last_issued().unwrap();
    bad.next = Some(next);
    assert!(bad.check_invariants().unwrap_err().contains("prefetched"));
    let mut bad = alloc.clone();
    bad.current.as_mut().unwrap().renewing = Some(InFlight {
        id: bad.next_request_id,
        sent_mono: 0,
    });
    assert!(bad.check_invariants().unwrap_err().contains("renewal"));
    for segment in [
        Segment {
            delta: 0,
            ..held.segment
        },
        Segment {
            end: SEGMENT_ID_LIMIT + 1,
            ..held.segment
        },
    ] {
        let mut bad = alloc.clone();
        bad.current.as_mut().unwrap().segment = segment;
        assert!(
            bad.check_invariants()
                .unwrap_err()
                .contains("outside the store's contract")
        );
    }
}

#[test]
fn the_issued_below_the_claim_invariant_looks_at_the_last_id_issued() {
    // Segment [2, 10) step 2, claim 5: 2 and 4 issued, `next` is 6, past the claim, and no ID
    // issued is. Used up with an unaligned end ([2, 9): `next` is 10), likewise.
    let held = |end, claim_end, next| Held {
        segment: Segment {
            start: 2,
            end,
            delta: 2,
        },
        next,
        claim_end,
        lease_deadline_mono: 1_000,
        granted_mono: 0,
        renew_due_mono: 300,
        renewing: None,
    };
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    alloc.last_issued = Some(4);
    alloc.current = Some(held(10, 5, 6));
    assert_eq!(alloc.check_invariants(), Ok(()));
    alloc.last_issued = Some(8);
    alloc.current = Some(held(9, 9, 10));
    assert_eq!(alloc.check_invariants(), Ok(()));
    alloc.current = Some(held(10, 5, 8));
    assert_eq!(
        alloc.check_invariants(),
        Err("current buffer: issued 6 beyond the acknowledged claim 5".to_owned())
    );
}

/// An allocator holding `[1, 11)` of a step-10 tag with ID 1 issued and its prefetch's read
/// answered: the Allocate (`min_id` 11) is in flight. Returns it with the Allocate's id and the
/// grant the store answers it with (`[11, 21)`, claim 13).
fn prefetch_in_flight(now: Now) -> (SegmentAllocator, u64, crate::id_store::Grant) {
    prefetch_in_flight_with(cfg(1), now)
}

fn prefetch_in_flight_with(
    config: AllocatorConfig,
    now: Now,
) -> (SegmentAllocator, u64, crate::id_store::Grant) {
    let mut store = store_with(10);
    let mut alloc = SegmentAllocator::new(config, now).unwrap();
    assert_eq!(alloc.next_id(now), Take::Pending);
    pump(&mut alloc, &mut store, now);
    assert_eq!(id_of(alloc.next_id(now)), 1);
    // The prefetch's read and the claim's renewal are answered, the Allocate is held back.
    let mut allocate = None;
    while let Some(req) = alloc.poll_request() {
        if let StoreCall::Allocate(alloc_req) = &req.call {
            assert_eq!(alloc_req.min_id, 11);
            allocate = Some(req);
        } else {
            alloc.handle_reply(req.id, req.call.execute(&mut store), now);
        }
    }
    let allocate = allocate.expect("the prefetch's Allocate");
    let StoreReply::Allocate(Ok(grant)) = allocate.call.execute(&mut store) else {
        panic!("a grant");
    };
    assert_eq!((grant.segment.start, grant.claim_end), (11, 13));
    (alloc, allocate.id, grant)
}

#[test]
fn malformed_grants_are_refused_like_failed_fetches() {
    let now = Now::both(0);
    let (_, _, honest) = prefetch_in_flight(now);
    let with = |segment| crate::id_store::Grant {
        segment,
        ..honest.clone()
    };
    let s = honest.segment;
    let limit = SEGMENT_ID_LIMIT;
    for (grant, why) in [
        (with(Segment { delta: 0, ..s }), "has delta 0"),
        (
            with(Segment {
                start: s.end,
                end: s.start,
                delta: 1,
            }),
            "ends before it starts",
        ),
        (
            with(Segment {
                start: limit - 5,
                end: limit + 5,
                delta: 1,
            }),
            "reaches past the segment ID limit 2^62",
        ),
        // The first segment again (or another Allocate's grant, misrouted).
        (
            with(Segment {
                start: 1,
                end: 11,
                delta: 1,
            }),
            "starts below 11",
        ),
    ] {
        let (mut alloc, id, _) = prefetch_in_flight(now);
        alloc.handle_reply(id, StoreReply::Allocate(Ok(grant)), now);
        let health = alloc.health(now);
        assert_eq!(health.next, None, "{why}");
        assert_eq!(health.fetch, "backoff", "{why}");
        assert_eq!(health.stats.malformed_replies, 1, "{why}");
        assert_eq!(health.stats.fetch_failures, 1, "{why}");
        assert_eq!(health.stats.reloads, 1, "{why}");
        let error = health.last_error.unwrap();
        assert!(
            error.contains("malformed grant refused") && error.contains(why),
            "{error}"
        );
        alloc.check_invariants().unwrap();
        // The current segment is issued from as before, and nothing from the refused grant.
        let block = alloc.take_block(now, 40);
        assert_eq!(
            block,
            Take::Block(IdBlock {
                start: 2,
                count: 3,
                delta: 1
            }),
            "{why}: up to the claim of [1, 11), 5 since its renewal"
        );
    }
    // The honest grant is installed.
    let (mut alloc, id, grant) = prefetch_in_flight(now);
    alloc.handle_reply(id, StoreReply::Allocate(Ok(grant)), now);
    assert_eq!(alloc.health(now).next.map(|b| b.segment), Some(s));
    assert_eq!(alloc.stats().malformed_replies, 0);
}

#[test]
fn a_grant_below_the_min_id_asked_for_is_refused_after_the_holder_dropped_its_segment() {
    // The Allocate asked for min_id 11 while [1, 11) was held; the lease of [1, 11) expires
    // before the (slow) answer, leaving only ID 1 issued: a grant from 5 is above that, but
    // below what was asked, so outside the store's contract.
    let slow = AllocatorConfig {
        request_timeout_ms: 2_000,
        ..cfg(1)
    };
    let (mut alloc, id, honest) = prefetch_in_flight_with(slow, Now::both(0));
    let later = Now::both(950);
    alloc.handle_timeout(later);
    assert_eq!(alloc.health(later).current, None);
    let grant = crate::id_store::Grant {
        segment: Segment {
            start: 5,
            end: 15,
            delta: 1,
        },
        ..honest
    };
    alloc.handle_reply(id, StoreReply::Allocate(Ok(grant)), later);
    assert_eq!(alloc.health(later).next, None);
    assert_eq!(alloc.stats().malformed_replies, 1);
    let error = alloc.health(later).last_error.unwrap();
    assert!(error.contains("starts below 11"), "{error}");
}

#[test]
fn claims_outside_their_segment_are_clamped_into_it() {
    let now = Now::both(0);
    for (claim_end, clamped) in [(25, 21), (4, 11)] {
        let (mut alloc, id, grant) = prefetch_in_flight(now);
        let grant = crate::id_store::Grant { claim_end, ..grant };
        alloc.handle_reply(id, StoreReply::Allocate(Ok(grant)), now);
        let next = alloc.health(now).next.expect("installed");
        assert_eq!(next.claim_end, clamped, "{claim_end}");
        assert_eq!(alloc.stats().malformed_replies, 1);
        assert_eq!(alloc.stats().fetch_failures, 0);
        alloc.check_invariants().unwrap();
    }
    // A renewal past the end, likewise (and a stale one never lowers the claim).
    let (mut alloc, id, grant) = prefetch_in_flight(now);
    alloc.handle_reply(id, StoreReply::Allocate(Ok(grant)), now);
    let later = Now::both(300);
    alloc.handle_timeout(later);
    let mut renewals = Vec::new();
    while let Some(req) = alloc.poll_request() {
        if matches!(req.call, StoreCall::Renew(_)) {
            renewals.push(req.id);
        }
    }
    assert_eq!(renewals.len(), 2, "both buffers renew");
    for (id, claim_end) in renewals.into_iter().zip([1_000, 0]) {
        let lease = crate::id_store::Lease {
            claim_end,
            lease_expiry_ms: 1_300,
        };
        alloc.handle_reply(id, StoreReply::Renew(Ok(lease)), later);
    }
    let health = alloc.health(later);
    assert_eq!(health.current.unwrap().claim_end, 11);
    assert_eq!(health.next.unwrap().claim_end, 13);
    assert_eq!(health.stats.malformed_replies, 2);
    alloc.check_invariants().unwrap();
}

#[test]
fn percentages_of_a_segment_near_the_id_space_do_not_overflow() {
    let big = SEGMENT_ID_LIMIT - 1;
    assert_eq!(pct_of(big, 100), big);
    assert_eq!(pct_of(big, 25), big / 4);
    assert_eq!(pct_of(u64::MAX, 100), u64::MAX);
    assert_eq!(pct_of(7, 0), 0);
    assert_eq!(percent(big, big), 100);
    assert_eq!(percent(big / 2, big), 49);
    assert_eq!(percent(0, 1), 0);
}

/// Whether `machine` reached `edge` since its counts were last taken (and takes them).
fn reached(machine: &mut impl Observed, edge: &crate::edge::Edge) -> bool {
    machine.edges().contains_key(edge.name)
}

#[test]
fn edge_last_id_while_next_unloaded() {
    let mut store = store_with(10);
    let config = AllocatorConfig {
        claim_pct: 100,
        ..cfg(1)
    };
    let mut alloc = SegmentAllocator::new(config, Now::both(0)).unwrap();
    let now = Now::both(0);
    assert_eq!(alloc.next_id(now), Take::Pending);
    pump(&mut alloc, &mut store, now);
    assert_eq!(id_of(alloc.next_id(now)), 1);
    let _ = alloc.edges();
    // The prefetch (asked for at 10%) never gets an answer: the store is silent from here on.
    while alloc.poll_request().is_some() {}
    for expected in 2..=9 {
        assert_eq!(id_of(alloc.next_id(now)), expected);
        while alloc.poll_request().is_some() {}
    }
    assert!(!reached(&mut alloc, &edges::LAST_ID_WHILE_NEXT_UNLOADED));
    assert_eq!(id_of(alloc.next_id(now)), 10);
    assert!(reached(&mut alloc, &edges::LAST_ID_WHILE_NEXT_UNLOADED));
    assert_eq!(alloc.next_id(now), Take::Pending);
}

#[test]
fn edge_not_reached_while_the_double_buffer_keeps_up() {
    let mut store = store_with(10);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let _ = alloc.edges();
    for t in 0..50 {
        let _ = id_of(take(&mut alloc, &mut store, Now::both(t)));
    }
    let counts = alloc.edges();
    assert!(!counts.contains_key(edges::LAST_ID_WHILE_NEXT_UNLOADED.name));
    assert!(!counts.contains_key(edges::CLAIM_EXHAUSTED.name));
    assert!(!counts.contains_key(edges::FRESH_ALLOCATOR_FINDS_GRANTS.name));
}

#[test]
fn edge_empty_while_granting() {
    let mut store = store_with(10);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let now = Now::both(0);
    let _ = alloc.edges();
    assert_eq!(alloc.next_id(now), Take::Pending);
    assert!(
        !reached(&mut alloc, &edges::EMPTY_WHILE_GRANTING),
        "the read is out"
    );
    let read = alloc.poll_request().unwrap();
    alloc.handle_reply(read.id, read.call.execute(&mut store), now);
    // The allocate (the write of the new max_id) is in flight, unanswered.
    let allocate = alloc.poll_request().unwrap();
    assert!(matches!(allocate.call, StoreCall::Allocate(_)));
    assert_eq!(alloc.next_id(now), Take::Pending);
    assert!(reached(&mut alloc, &edges::EMPTY_WHILE_GRANTING));
}

#[test]
fn edge_claim_exhausted() {
    let mut store = store_with(100);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let now = Now::both(0);
    id_of(take(&mut alloc, &mut store, now));
    let _ = alloc.edges();
    // Renewals go nowhere: the claim (25 IDs) runs out inside the segment.
    let mut issued = 1;
    while let Take::Block(block) = alloc.next_id(now) {
        issued += block.count;
        while alloc.poll_request().is_some() {}
    }
    assert_eq!(issued, 25);
    assert!(reached(&mut alloc, &edges::CLAIM_EXHAUSTED));
}

#[test]
fn edge_cas_retries_spent() {
    let mut store = store_with(10);
    let now = Now::both(0);
    let mut a = SegmentAllocator::new(cfg(1), now).unwrap();
    let config = AllocatorConfig {
        cas_retries_max: 0,
        ..cfg(2)
    };
    let mut b = SegmentAllocator::new(config, now).unwrap();
    assert_eq!(b.next_id(now), Take::Pending);
    let read = b.poll_request().unwrap();
    b.handle_reply(read.id, read.call.execute(&mut store), now);
    // A allocates between B's read and B's write.
    id_of(take(&mut a, &mut store, now));
    let _ = b.edges();
    pump(&mut b, &mut store, now);
    assert_eq!(b.stats().conflicts, 1);
    assert!(reached(&mut b, &edges::CAS_RETRIES_SPENT));
    assert_eq!(b.health(now).fetch, "backoff");
}

#[test]
fn edge_unavailable_after_failures() {
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let mut now = Now::both(0);
    let _ = alloc.edges();
    let mut answer = alloc.next_id(now);
    while answer == Take::Pending {
        now = Now::both(alloc.poll_timeout().expect("a timeout is armed"));
        alloc.handle_timeout(now);
        while alloc.poll_request().is_some() {}
        if reached(&mut alloc, &edges::UNAVAILABLE_AFTER_FAILURES) {
            panic!("reached before the answer was Unavailable");
        }
        answer = alloc.next_id(now);
    }
    assert!(matches!(answer, Take::Unavailable(_)), "{answer:?}");
    assert!(reached(&mut alloc, &edges::UNAVAILABLE_AFTER_FAILURES));
}

#[test]
fn edge_lease_expired_unissued() {
    let mut store = store_with(1_000);
    let mut alloc = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    id_of(take(&mut alloc, &mut store, Now::both(0)));
    let _ = alloc.edges();
    // No renewal gets through; at 1000 - 50 ms (drift margin) the lease cannot be proven.
    let _ = alloc.next_id(Now::both(949));
    assert!(!reached(&mut alloc, &edges::LEASE_EXPIRED_UNISSUED));
    assert!(!matches!(alloc.next_id(Now::both(950)), Take::Block(_)));
    assert!(reached(&mut alloc, &edges::LEASE_EXPIRED_UNISSUED));
}

#[test]
fn edge_pool_grant() {
    let mut store = store_with(100);
    let mut zombie = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    id_of(take(&mut zombie, &mut store, Now::both(0)));
    assert_eq!(store.reclaim_expired(1_000).unwrap().len(), 1);
    let mut fresh = SegmentAllocator::new(cfg(2), Now::both(1_000)).unwrap();
    let _ = fresh.edges();
    assert_eq!(id_of(take(&mut fresh, &mut store, Now::both(1_000))), 26);
    assert!(reached(&mut fresh, &edges::POOL_GRANT));
}

#[test]
fn edge_fresh_allocator_finds_grants() {
    let mut store = store_with(10);
    let mut first = SegmentAllocator::new(cfg(1), Now::both(0)).unwrap();
    let _ = first.edges();
    id_of(take(&mut first, &mut store, Now::both(0)));
    assert!(
        !reached(&mut first, &edges::FRESH_ALLOCATOR_FINDS_GRANTS),
        "the first allocator of a tag finds it untouched"
    );
    // A restarted process is a new instance reading a tag its predecessor moved.
    let mut restarted = SegmentAllocator::new(cfg(2), Now::both(10)).unwrap();
    assert_eq!(id_of(take(&mut restarted, &mut store, Now::both(10))), 21);
    assert!(reached(
        &mut restarted,
        &edges::FRESH_ALLOCATOR_FINDS_GRANTS
    ));
}
