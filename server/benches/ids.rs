//! Hot paths of ID issuance, each measured beside a bare `AtomicU64::fetch_add` loop in the
//! same run (the baseline: one uncontended atomic increment is the least any shared counter can
//! cost). Read the results as ratios to `baseline/atomic_fetch_add`.
//!
//! The pure state machines come from `sut`, the lock-free front (`ConcurrentIds`) from this
//! crate. `cargo bench -p sut-server --bench ids`

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sut::clock::Now;
use sut::id_store::{IdStore, InstanceId, MemoryIdStore, StoreCall, TagSpec};
use sut::segment::{AllocatorConfig, SegmentAllocator, StepPolicy, Take};
use sut::snowflake::{NextId, SnowflakeWorker, WorkerConfig};
use sut_server::front::ConcurrentIds;

const STEP: u64 = 1_000_000;

fn store() -> MemoryIdStore {
    let mut store = MemoryIdStore::new();
    store
        .create_tag("bench", &TagSpec::simple(STEP))
        .expect("create tag");
    store
}

fn allocator() -> SegmentAllocator {
    let cfg = AllocatorConfig {
        step: StepPolicy::Fixed { step: STEP },
        claim_pct: 100,
        ..AllocatorConfig::new("bench", InstanceId(1))
    };
    SegmentAllocator::new(cfg, Now::both(0)).expect("valid config")
}

fn pump(alloc: &mut SegmentAllocator, store: &mut MemoryIdStore) {
    while let Some(req) = alloc.poll_request() {
        let reply = StoreCall::execute(&req.call, store);
        alloc.handle_reply(req.id, reply, Now::both(0));
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("ids");
    group.throughput(Throughput::Elements(1));

    let counter = AtomicU64::new(0);
    group.bench_function("baseline/atomic_fetch_add", |b| {
        b.iter(|| black_box(counter.fetch_add(1, Ordering::Relaxed)))
    });

    let front = ConcurrentIds::new(allocator(), store(), || Now::both(0), 1 << 16);
    group.bench_function("segment/concurrent_next_id", |b| {
        b.iter(|| black_box(front.next_id().expect("id")))
    });

    let mut alloc = allocator();
    let mut st = store();
    group.bench_function("segment/sans_io_next_id", |b| {
        b.iter(|| match alloc.next_id(Now::both(0)) {
            Take::Block(block) => black_box(block.start),
            _ => {
                pump(&mut alloc, &mut st);
                0
            }
        })
    });

    let mut worker =
        SnowflakeWorker::new(WorkerConfig::default(), 1, 0, 1_700_000_000_000).expect("worker");
    let mut wall_ms = 1_700_000_000_000u64;
    let mut calls = 0u64;
    group.bench_function("snowflake/next_id", |b| {
        b.iter(|| {
            // The wall clock advances one millisecond every 4,096 calls (the sequence's capacity).
            calls += 1;
            if calls.is_multiple_of(4_096) {
                wall_ms += 1;
            }
            let next = worker.next_id(wall_ms).expect("id");
            if let Some(ts) = worker.poll_reservation() {
                worker.handle_reserved(ts);
            }
            match next {
                NextId::Id(id) => black_box(id),
                NextId::WaitUntil { .. } | NextId::WaitReservation => {
                    wall_ms += 1;
                    0
                }
            }
        })
    });

    group.throughput(Throughput::Elements(100));
    let batch_front = ConcurrentIds::new(allocator(), store(), || Now::both(0), 1 << 16);
    group.bench_function("segment/concurrent_next_ids_100", |b| {
        b.iter(|| black_box(batch_front.next_ids(100).expect("ids")))
    });
    group.finish();
    let mut st = store();
    assert!(st.read_tag("bench").is_ok());
}

criterion_group!(benches, bench);
criterion_main!(benches);
