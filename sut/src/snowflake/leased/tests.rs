use super::*;
use crate::id_store::{InstanceId, MemoryIdStore};
use crate::snowflake::semantic::parse;
use crate::snowflake::{RollbackPolicy, WorkerConfig};

/// 2024-06-01T00:00:00.250Z: a quarter into a second.
const WALL_MS: u64 = 1_717_200_000_250;

fn ids(instance: u64, per_second: u64) -> LeasedIds {
    let holder = HolderConfig::new(
        "snowflake",
        InstanceId(instance),
        WorkerConfig {
            reserve_ahead_ms: 1_000,
            ..WorkerConfig::default()
        },
        3_000,
        500,
    );
    let semantic = SemanticConfig {
        prefix: "OD".into(),
        rollback_ms_max: 0,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: 1_000,
        per_second,
        flaw: None,
    };
    LeasedIds::new(holder, semantic, RequestWaits::DEFAULT)
}

fn at(offset_ms: u64) -> Now {
    Now {
        wall_ms: WALL_MS + offset_ms,
        mono_ms: offset_ms,
    }
}

/// Performs every store call the holder asks for at `t`; returns its events.
fn pump(ids: &mut LeasedIds, store: &mut MemoryIdStore, t: Now) -> Vec<HolderEvent> {
    let mut events = Vec::new();
    while let Some((id, mut call)) = ids.poll_request(t) {
        call.set_store_now(t.wall_ms);
        events.push(ids.handle_reply(id, call.execute(store), t));
    }
    events
}

/// Asks as a driver does: performs the calls a `Drive` asks for, and returns the first other
/// answer.
fn ask<T>(
    ids: &mut LeasedIds,
    store: &mut MemoryIdStore,
    t: Now,
    mut next: impl FnMut(&mut LeasedIds) -> IdAnswer<T>,
) -> IdAnswer<T> {
    for _ in 0..8 {
        match next(ids) {
            IdAnswer::Drive => {
                let _ = pump(ids, store, t);
            }
            other => {
                ids.check_invariants().unwrap();
                return other;
            }
        }
    }
    panic!("still driving after 8 rounds");
}

fn snowflake(
    ids: &mut LeasedIds,
    store: &mut MemoryIdStore,
    t: Now,
    waited_ms: u64,
) -> IdAnswer<u64> {
    ask(ids, store, t, |ids| ids.next_snowflake(t, waited_ms))
}

fn semantic(
    ids: &mut LeasedIds,
    store: &mut MemoryIdStore,
    t: Now,
    waited_ms: u64,
) -> IdAnswer<SemanticId> {
    ask(ids, store, t, |ids| ids.next_semantic("OD", t, waited_ms))
}

fn id(answer: IdAnswer<u64>) -> u64 {
    match answer {
        IdAnswer::Id(id) => id,
        other => panic!("no ID: {other:?}"),
    }
}

#[test]
fn no_lease_is_a_drive_and_then_ids_rise() {
    let mut store = MemoryIdStore::new();
    let mut ids = ids(1, 100_000);
    assert_eq!(ids.next_snowflake(at(0), 0), IdAnswer::Drive);
    let first = id(snowflake(&mut ids, &mut store, at(0), 0));
    let second = id(snowflake(&mut ids, &mut store, at(1), 0));
    assert!(first < second);
}

#[test]
fn a_clock_behind_is_waited_out_within_the_waits_and_refused_beyond() {
    let mut store = MemoryIdStore::new();
    let mut ids = ids(1, 100_000);
    let _ = id(snowflake(&mut ids, &mut store, at(2_000), 0));
    // 1 s back: beyond the sequencer's 5 ms, within the request's 1.5 s.
    assert_eq!(
        snowflake(&mut ids, &mut store, at(1_000), 0),
        IdAnswer::WaitUntil {
            wall_ms: WALL_MS + 2_000
        }
    );
    // ... unless the request has waited too long already.
    assert!(matches!(
        snowflake(&mut ids, &mut store, at(1_000), 2_000),
        IdAnswer::Unavailable {
            why: WhyUnavailable::StillWaiting { waited_ms: 2_000 },
            ..
        }
    ));
    // 2 s back: refused, to retry when the clock has caught up.
    match snowflake(&mut ids, &mut store, at(0), 0) {
        IdAnswer::Unavailable {
            retry_after_ms,
            why: WhyUnavailable::Sequencer(SequencerError::ClockBehind { behind_ms, .. }),
        } => {
            assert_eq!(retry_after_ms, behind_ms);
            assert!(behind_ms >= 2_000, "{behind_ms}");
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn the_per_second_limit_is_waited_only_when_the_next_second_is_close() {
    let mut store = MemoryIdStore::new();
    let mut ids = ids(1, 2);
    // A fresh generator starts in the second after the worker's reservation.
    let start_ms = match semantic(&mut ids, &mut store, at(0), 0) {
        IdAnswer::WaitUntil { wall_ms } => wall_ms - WALL_MS,
        other => panic!("a fresh generator waits for its first second: {other:?}"),
    };
    assert!(
        start_ms <= RequestWaits::DEFAULT.above_reservation_ms_max,
        "{start_ms}"
    );
    let t = |ms| at(start_ms + ms);
    for ms in 0..2 {
        assert!(matches!(
            semantic(&mut ids, &mut store, t(ms), 0),
            IdAnswer::Id(_)
        ));
    }
    // The third in the second: the next second is far, past the 10 ms wait.
    let next_second_ms = ((WALL_MS + start_ms) / 1_000 + 1) * 1_000 - WALL_MS;
    match semantic(&mut ids, &mut store, t(2), 0) {
        IdAnswer::Unavailable {
            retry_after_ms,
            why: WhyUnavailable::SequenceUsedUp { per_second: 2 },
        } => assert_eq!(retry_after_ms, next_second_ms - start_ms - 2),
        other => panic!("not the per-second limit: {other:?}"),
    }
    // 5 ms before the next second it is waited for inside the request.
    assert_eq!(
        semantic(&mut ids, &mut store, at(next_second_ms - 5), 0),
        IdAnswer::WaitUntil {
            wall_ms: WALL_MS + next_second_ms
        }
    );
    match semantic(&mut ids, &mut store, at(next_second_ms), 0) {
        IdAnswer::Id(next) => {
            assert_eq!(parse(&next.text).unwrap().number(), next.number);
            assert_eq!(next.number % 100_000, 0, "the next second starts at 0");
        }
        other => panic!("no ID in the next second: {other:?}"),
    }
}

#[test]
fn a_lost_lease_drops_the_semantic_generators_without_the_driver() {
    let mut store = MemoryIdStore::new();
    let mut ids = ids(1, 100_000);
    let _ = id(snowflake(&mut ids, &mut store, at(0), 0));
    let mut start_ms = 0;
    while !matches!(
        semantic(&mut ids, &mut store, at(start_ms), 0),
        IdAnswer::Id(_)
    ) {
        start_ms += 100;
        assert!(start_ms < 3_000, "no semantic ID");
    }
    assert!(ids.semantic().generator_of("OD").is_some());
    let worker_id = ids.holder().worker().unwrap().worker_id();
    // The lease expires unrenewed (a pause) and another instance takes the worker id.
    let mut other = self::ids(2, 100_000);
    let _ = pump(&mut other, &mut store, at(start_ms + 3_000));
    assert_eq!(other.holder().worker().unwrap().worker_id(), worker_id);
    let events = pump(&mut ids, &mut store, at(start_ms + 3_001));
    assert!(events.contains(&HolderEvent::LeaseLost), "{events:?}");
    assert!(
        ids.semantic().generator_of("OD").is_none(),
        "a generator on a lost lease would repeat the next holder's IDs"
    );
}
