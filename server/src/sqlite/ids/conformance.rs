//! The two ID stores must never drift: random operation sequences from several interleaved
//! clients are applied to both, and every result must be identical.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use sut::id_store::{
    AllocRequest, CounterDurability, IdStore, InstanceId, MemoryIdStore, ReleaseRequest,
    RenewRequest, StoreError, TagSpec, WorkerRequest,
};

use super::SqliteIdStore;

pub(crate) const TAGS: [&str; 2] = ["order", "user"];

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Create {
        tag: usize,
        step: u64,
        delta: u64,
        remainder: u64,
        first_id: u64,
    },
    Read {
        tag: usize,
    },
    Allocate {
        client: u64,
        tag: usize,
        current_version: bool,
        version: u64,
        ids: u64,
        min_id: u64,
        claim_ids: u64,
        /// The segment-no-version-check flaw's blind write, now and then.
        blind_max_id: Option<u64>,
    },
    Renew {
        client_is_holder: bool,
        lease: usize,
        claim_extra: u64,
    },
    Release {
        client_is_holder: bool,
        lease: usize,
        used: u64,
    },
    Reclaim,
    Acquire {
        client: u64,
        namespace: usize,
        worker_count: u32,
    },
    RenewWorker {
        client: u64,
        namespace: usize,
        worker_id: u32,
        reserve_ts: u64,
    },
    ReleaseWorker {
        client: u64,
        namespace: usize,
        worker_id: u32,
    },
    Incr {
        key: usize,
        n: u64,
    },
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2usize, 0..40u64, 1..4u64, 0..4u64, 0..20u64).prop_map(
            |(tag, step, delta, remainder, first_id)| Op::Create {
                tag,
                step,
                delta,
                remainder,
                first_id
            }
        ),
        (0..2usize).prop_map(|tag| Op::Read { tag }),
        (
            0..3u64,
            0..2usize,
            proptest::bool::weighted(0.8),
            0..4u64,
            0..30u64,
            0..200u64,
            0..10u64,
            proptest::option::weighted(0.1, 0..100u64),
        )
            .prop_map(
                |(client, tag, current_version, version, ids, min_id, claim_ids, blind_max_id)| {
                    Op::Allocate {
                        client,
                        tag,
                        current_version,
                        version,
                        ids,
                        min_id,
                        claim_ids,
                        blind_max_id,
                    }
                }
            ),
        (proptest::bool::weighted(0.9), 0..6usize, 0..20u64).prop_map(
            |(client_is_holder, lease, claim_extra)| Op::Renew {
                client_is_holder,
                lease,
                claim_extra
            }
        ),
        (proptest::bool::weighted(0.9), 0..6usize, 0..40u64).prop_map(
            |(client_is_holder, lease, used)| Op::Release {
                client_is_holder,
                lease,
                used
            }
        ),
        Just(Op::Reclaim),
        (0..3u64, 0..2usize, 0..4u32).prop_map(|(client, namespace, worker_count)| Op::Acquire {
            client,
            namespace,
            worker_count
        }),
        (0..3u64, 0..2usize, 0..4u32, 0..1000u64).prop_map(
            |(client, namespace, worker_id, reserve_ts)| {
                Op::RenewWorker {
                    client,
                    namespace,
                    worker_id,
                    reserve_ts,
                }
            }
        ),
        (0..3u64, 0..2usize, 0..4u32).prop_map(|(client, namespace, worker_id)| {
            Op::ReleaseWorker {
                client,
                namespace,
                worker_id,
            }
        }),
        (0..2usize, 0..5u64).prop_map(|(key, n)| Op::Incr { key, n }),
    ]
}

/// Applies one op to a store and renders the result, so results of both stores compare as text.
pub(crate) fn apply(
    store: &mut dyn IdStore,
    op: &Op,
    now_ms: u64,
    reference: &mut MemoryIdStore,
) -> String {
    const NAMESPACES: [&str; 2] = ["snowflake", "semantic"];
    match op {
        Op::Create {
            tag,
            step,
            delta,
            remainder,
            first_id,
        } => {
            let spec = TagSpec {
                first_id: *first_id,
                step: *step,
                delta: *delta,
                remainder: *remainder,
            };
            format!("{:?}", store.create_tag(TAGS[*tag], &spec))
        }
        Op::Read { tag } => format!("{:?}", store.read_tag(TAGS[*tag])),
        Op::Allocate {
            client,
            tag,
            current_version,
            version,
            ids,
            min_id,
            claim_ids,
            blind_max_id,
        } => {
            let expected_version = if *current_version {
                reference
                    .read_tag(TAGS[*tag])
                    .map_or(*version, |row| row.version)
            } else {
                *version
            };
            let req = AllocRequest {
                tag: TAGS[*tag].to_owned(),
                expected_version,
                ids: *ids,
                min_id: *min_id,
                claim_ids: *claim_ids,
                instance: InstanceId(*client),
                lease_ms: 50,
                now_ms,
                blind_max_id: *blind_max_id,
            };
            format!("{:?}", store.allocate(&req))
        }
        Op::Renew {
            client_is_holder,
            lease,
            claim_extra,
        } => {
            let leases = reference.leases().expect("memory store never fails");
            let Some(row) = leases.get(lease % leases.len().max(1)) else {
                return "no lease".into();
            };
            let instance = if *client_is_holder {
                row.instance
            } else {
                InstanceId(row.instance.0 + 1)
            };
            let req = RenewRequest {
                tag: row.tag.clone(),
                instance,
                segment_start: row.segment.start,
                claim_end: row.claim_end + claim_extra,
                lease_ms: 50,
                now_ms,
            };
            format!("{:?}", store.renew(&req))
        }
        Op::Release {
            client_is_holder,
            lease,
            used,
        } => {
            let leases = reference.leases().expect("memory store never fails");
            let Some(row) = leases.get(lease % leases.len().max(1)) else {
                return "no lease".into();
            };
            let instance = if *client_is_holder {
                row.instance
            } else {
                InstanceId(row.instance.0 + 1)
            };
            let req = ReleaseRequest {
                tag: row.tag.clone(),
                instance,
                segment_start: row.segment.start,
                used_end: row.segment.start + used,
            };
            format!("{:?}", store.release(&req))
        }
        Op::Reclaim => format!("{:?}", store.reclaim_expired(now_ms)),
        Op::Acquire {
            client,
            namespace,
            worker_count,
        } => {
            let req = WorkerRequest {
                namespace: NAMESPACES[*namespace].to_owned(),
                worker_count: *worker_count,
                instance: InstanceId(*client),
                lease_ms: 50,
                now_ms,
            };
            format!("{:?}", store.acquire_worker(&req))
        }
        Op::RenewWorker {
            client,
            namespace,
            worker_id,
            reserve_ts,
        } => format!(
            "{:?}",
            store.renew_worker(
                NAMESPACES[*namespace],
                *worker_id,
                InstanceId(*client),
                *reserve_ts,
                50,
                now_ms
            )
        ),
        Op::ReleaseWorker {
            client,
            namespace,
            worker_id,
        } => {
            format!(
                "{:?}",
                store.release_worker(NAMESPACES[*namespace], *worker_id, InstanceId(*client))
            )
        }
        Op::Incr { key, n } => format!("{:?}", store.incr_by(["a", "b"][*key], *n, now_ms)),
    }
}

/// Applies `ops` to a memory store and to `store` (both empty, with `durability`) and requires
/// identical results, the memory store's invariants after every op (until the blind-write flaw
/// runs) and identical leases and tags at the end.
pub(crate) fn agrees_with_memory(
    store: &mut dyn IdStore,
    durability: CounterDurability,
    ops: &[(Op, u64)],
) -> Result<(), TestCaseError> {
    let mut memory = MemoryIdStore::with_counter_durability(durability);
    let mut now_ms = 0;
    // The store's invariants hold until the blind-write flaw runs (it may overlap ranges).
    let mut flawed = false;
    for (i, (op, advance_ms)) in ops.iter().enumerate() {
        now_ms += advance_ms;
        // The reference view (for choosing versions and leases) is taken before either
        // store applies the op, so both see the same request.
        let mut reference = memory.clone();
        let from_store = apply(store, op, now_ms, &mut reference.clone());
        let from_memory = apply(&mut memory, op, now_ms, &mut reference);
        prop_assert_eq!(
            &from_memory,
            &from_store,
            "op #{} {:?} at {} ms",
            i,
            op,
            now_ms
        );
        flawed |= matches!(
            op,
            Op::Allocate {
                blind_max_id: Some(_),
                ..
            }
        );
        if !flawed {
            let checked = memory.check_invariants();
            prop_assert!(checked.is_ok(), "op #{} {:?}: {:?}", i, op, checked);
        }
    }
    prop_assert_eq!(memory.leases().unwrap(), store.leases().unwrap());
    for tag in TAGS {
        prop_assert_eq!(
            format!("{:?}", memory.read_tag(tag)),
            format!("{:?}", store.read_tag(tag))
        );
    }
    Ok(())
}

/// The counter durabilities the conformance tests draw from.
pub(crate) fn durability() -> impl Strategy<Value = CounterDurability> {
    prop_oneof![
        Just(CounterDurability::EveryWrite),
        Just(CounterDurability::Periodic { interval_ms: 30 }),
        Just(CounterDurability::Snapshot { interval_ms: 90 }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_sqlite_stores_agree(
        ops in proptest::collection::vec((op(), 0..20u64), 1..80),
        durability in durability(),
    ) {
        let mut sqlite = SqliteIdStore::open_in_memory(durability).expect("open sqlite");
        agrees_with_memory(&mut sqlite, durability, &ops)?;
    }
}

#[test]
fn sqlite_store_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ids.db");
    let grant = {
        let mut store = SqliteIdStore::open(&path, CounterDurability::EveryWrite).expect("open");
        store
            .create_tag("order", &TagSpec::simple(100))
            .expect("create");
        let req = AllocRequest {
            tag: "order".into(),
            expected_version: 0,
            ids: 100,
            min_id: 0,
            claim_ids: 10,
            instance: InstanceId(7),
            lease_ms: 1000,
            now_ms: 0,
            blind_max_id: None,
        };
        store.allocate(&req).expect("allocate")
    };
    let mut store = SqliteIdStore::open(&path, CounterDurability::EveryWrite).expect("reopen");
    let row = store.read_tag("order").expect("read");
    assert_eq!(row.max_id, grant.segment.end);
    assert_eq!(row.version, 1);
    assert_eq!(store.leases().expect("leases").len(), 1);
}

#[test]
fn sqlite_periodic_counter_loses_the_unsynced_tail_when_the_process_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ids.db");
    let last = {
        let mut store =
            SqliteIdStore::open(&path, CounterDurability::Periodic { interval_ms: 1000 })
                .expect("open");
        let mut last = 0;
        for t in 0..1500 {
            last = store.incr_by("id", 1, t).expect("incr");
        }
        last
        // Dropped without flush_counters: a kill -9.
    };
    let mut store = SqliteIdStore::open(&path, CounterDurability::EveryWrite).expect("reopen");
    let after = store.incr_by("id", 1, 2000).expect("incr");
    assert_eq!(last, 1500);
    assert_eq!(after, 1002, "only the value synced at t=1000 survived");
}

#[test]
fn bad_input_gets_typed_errors_naming_the_field() {
    for store in [
        &mut MemoryIdStore::new() as &mut dyn IdStore,
        &mut SqliteIdStore::open_in_memory(CounterDurability::EveryWrite).unwrap(),
    ] {
        let err = store.create_tag("t", &TagSpec::simple(0)).unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidSpec { field, .. } if field == "step"),
            "{err}"
        );
        let err = store
            .create_tag(
                "t",
                &TagSpec {
                    first_id: 1,
                    step: 5,
                    delta: 3,
                    remainder: 3,
                },
            )
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidSpec { field, .. } if field == "remainder"),
            "{err}"
        );
        let err = store
            .create_tag(
                "t",
                &TagSpec {
                    first_id: 1 << 62,
                    ..TagSpec::simple(5)
                },
            )
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidSpec { field, .. } if field == "first_id"),
            "{err}"
        );
        assert_eq!(
            store.read_tag("nope").unwrap_err(),
            StoreError::UnknownTag("nope".into())
        );
        assert_eq!(
            store.read_tag("nope").unwrap_err().to_string(),
            "unknown tag `nope`"
        );
        store.create_tag("t", &TagSpec::simple(5)).unwrap();
        assert_eq!(
            store.create_tag("t", &TagSpec::simple(5)).unwrap_err(),
            StoreError::TagExists("t".into())
        );
    }
}
