use proptest::prelude::*;

use super::semantic::{self, NextSemantic, SemanticConfig, SemanticGenerator};
use super::*;
use crate::edge::Observed;

const EPOCH: u64 = 1_577_836_800_000;
const T0: u64 = EPOCH + 1_000_000;

fn worker(cfg: WorkerConfig, reserved_ts: u64) -> SnowflakeWorker {
    SnowflakeWorker::new(cfg, 3, reserved_ts, T0).expect("valid worker")
}

/// Drives a worker like a driver would: persists reservations at once and retries.
fn issue(w: &mut SnowflakeWorker, wall_ms: u64) -> Result<NextId, SequencerError> {
    for _ in 0..3 {
        let next = w.next_id(wall_ms)?;
        if let Some(ts) = w.poll_reservation() {
            w.handle_reserved(ts);
        }
        if next != NextId::WaitReservation {
            return Ok(next);
        }
    }
    Ok(NextId::WaitReservation)
}

#[test]
fn layout_errors_are_typed() {
    let bad = Layout {
        time_bits: 41,
        worker_bits: 12,
        seq_bits: 12,
        ..Layout::default()
    };
    assert!(matches!(
        bad.validate(63),
        Err(LayoutError::TooWide { total: 65, .. })
    ));
    let zero = Layout {
        seq_bits: 0,
        ..Layout::default()
    };
    assert!(matches!(
        zero.validate(63),
        Err(LayoutError::FieldTooNarrow { .. })
    ));
    let unit = Layout {
        unit_ms: 0,
        ..Layout::default()
    };
    assert_eq!(unit.validate(63), Err(LayoutError::ZeroUnit));
    let future = WorkerConfig {
        layout: Layout {
            epoch_ms: T0 + 1,
            ..Layout::default()
        },
        ..WorkerConfig::default()
    };
    assert!(matches!(
        SnowflakeWorker::new(future, 0, 0, T0),
        Err(LayoutError::EpochInFuture { .. })
    ));
    assert!(matches!(
        SnowflakeWorker::new(WorkerConfig::default(), 1024, 0, T0),
        Err(LayoutError::WorkerTooLarge {
            worker_id: 1024,
            bits: 10
        })
    ));
    // The message says what is wrong.
    assert!(
        bad.validate(63)
            .unwrap_err()
            .to_string()
            .contains("41 + worker 12 + sequence 12 = 65")
    );
}

#[test]
fn decode_inverts_compose() {
    let layout = Layout::default();
    let id = layout.compose(123_456, 789, 4_000);
    assert_eq!(
        layout.decode(id),
        Decoded {
            time_ms: EPOCH + 123_456,
            ts: 123_456,
            worker: 789,
            seq: 4_000
        }
    );
    assert!(id < 1 << 63);
}

#[test]
fn ids_increase_and_decode_to_the_worker() {
    let mut w = worker(WorkerConfig::default(), 0);
    let mut last = 0;
    for i in 0..10_000u64 {
        let NextId::Id(id) = issue(&mut w, T0 + i / 7).expect("issue") else {
            panic!("no wait expected")
        };
        assert!(id > last);
        assert_eq!(w.layout().decode(id).worker, 3);
        last = id;
    }
}

#[test]
fn sequence_overflow_waits_for_the_next_millisecond() {
    let cfg = WorkerConfig {
        layout: Layout {
            seq_bits: 2,
            ..Layout::default()
        },
        ..WorkerConfig::default()
    };
    let mut w = worker(cfg, 0);
    for _ in 0..4 {
        assert!(matches!(issue(&mut w, T0), Ok(NextId::Id(_))));
    }
    assert_eq!(issue(&mut w, T0), Ok(NextId::WaitUntil { wall_ms: T0 + 1 }));
    assert_eq!(w.sequencer().stats().overflow_waits, 1);
    assert!(matches!(issue(&mut w, T0 + 1), Ok(NextId::Id(_))));
}

#[test]
fn small_rollback_waits_large_rollback_refuses() {
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 100), Ok(NextId::Id(_))));
    // 5 ms back: wait until the last millisecond comes round again.
    assert_eq!(
        issue(&mut w, T0 + 95),
        Ok(NextId::WaitUntil { wall_ms: T0 + 100 })
    );
    // 6 ms back: refuse.
    assert_eq!(
        issue(&mut w, T0 + 94),
        Err(SequencerError::ClockBehind {
            behind_ms: 6,
            window_ms: 5
        })
    );
    // Caught up: issue again, above the last ID.
    assert!(matches!(issue(&mut w, T0 + 100), Ok(NextId::Id(_))));
}

#[test]
fn logical_mode_borrows_within_its_bound() {
    let cfg = WorkerConfig {
        layout: Layout {
            seq_bits: 1,
            ..Layout::default()
        },
        rollback: RollbackPolicy::Logical { borrow_ms_max: 20 },
        ..WorkerConfig::default()
    };
    let mut w = worker(cfg, 0);
    let mut ids = Vec::new();
    // The clock jumps 10 ms back (beyond the 5 ms wait window) and stays there: the worker
    // keeps issuing from its last millisecond, then borrows the next ones while it runs at most
    // 20 ms ahead of the wall clock, then refuses.
    let NextId::Id(first) = issue(&mut w, T0 + 1_000).unwrap() else {
        panic!()
    };
    ids.push(first);
    let mut refused = None;
    for _ in 0..100 {
        match issue(&mut w, T0 + 990) {
            Ok(NextId::Id(id)) => ids.push(id),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(err) => {
                refused = Some(err);
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(SequencerError::BorrowExceeded {
            ahead_ms: 21,
            bound_ms: 20
        })
    );
    // One more in the last millisecond, then two per borrowed millisecond 1001..=1010.
    assert_eq!(ids.len(), 1 + 1 + 2 * 10);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(w.sequencer().stats().logical_issues > 0);
}

/// A worker whose 8-bit time field of seconds runs out 256 s after the epoch.
fn narrow_worker(flaw: Option<crate::flaw::Flaw>) -> SnowflakeWorker {
    let layout = Layout {
        time_bits: 8,
        worker_bits: 10,
        seq_bits: 12,
        epoch_ms: EPOCH,
        unit_ms: 1_000,
    };
    SnowflakeWorker::new(
        WorkerConfig {
            layout,
            flaw,
            ..WorkerConfig::default()
        },
        1,
        0,
        EPOCH,
    )
    .unwrap()
}

#[test]
fn time_field_exhaustion_is_refused_not_wrapped() {
    // uid-generator's 28-bit seconds ran out on 2024-11-20 (issue #100).
    let mut w = narrow_worker(None);
    assert!(matches!(issue(&mut w, EPOCH + 255_999), Ok(NextId::Id(_))));
    assert_eq!(
        issue(&mut w, EPOCH + 256_000),
        Err(SequencerError::TimeExhausted {
            ts: 256,
            ts_max: 255
        })
    );
}

#[test]
fn restart_behind_the_reservation_waits_until_caught_up() {
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 10_000), Ok(NextId::Id(_))));
    let persisted = w.sequencer().reserved_ts();
    assert!(
        persisted >= 10_000 + 1_000,
        "the reservation reaches ahead ({persisted})"
    );
    // Restart after the clock went 2 s back (Leaf #216): the new incarnation must refuse.
    let mut restarted = worker(WorkerConfig::default(), persisted);
    assert!(matches!(
        issue(&mut restarted, T0 + 8_000),
        Err(SequencerError::ClockBehind { .. })
    ));
    // Once the clock passes the reservation, it issues above everything before the crash.
    let Ok(NextId::Id(id)) = issue(&mut restarted, EPOCH + persisted + 1) else {
        panic!()
    };
    assert!(restarted.layout().decode(id).ts > persisted);
}

#[test]
fn lease_loss_stops_the_worker() {
    let mut w = worker(WorkerConfig::default(), 0);
    w.handle_lease_lost();
    assert_eq!(w.next_id(T0), Err(SequencerError::LeaseLost));
}

#[derive(Clone, Debug)]
enum ClockStep {
    Tick(u64),
    Back(u64),
    Forward(u64),
    Burst(u16),
    Restart,
    ReservationLost,
}

fn clock_step() -> impl Strategy<Value = ClockStep> {
    prop_oneof![
        4 => (0..3u64).prop_map(ClockStep::Tick),
        1 => (1..20_000u64).prop_map(ClockStep::Back),
        1 => (1..20_000u64).prop_map(ClockStep::Forward),
        2 => (1..40u16).prop_map(ClockStep::Burst),
        1 => Just(ClockStep::Restart),
        1 => Just(ClockStep::ReservationLost),
    ]
}

proptest! {
    /// For any sequence of wall-clock readings with backward and forward jumps and restarts
    /// (which lose everything but what the store acknowledged), one worker id never issues a
    /// duplicate or a smaller ID.
    #[test]
    fn one_worker_never_repeats_or_goes_back(
        steps in proptest::collection::vec(clock_step(), 1..200),
        logical in any::<bool>(),
        seq_bits in 1u8..4,
    ) {
        let cfg = WorkerConfig {
            layout: Layout { seq_bits, ..Layout::default() },
            rollback: if logical { RollbackPolicy::Logical { borrow_ms_max: 50 } } else { RollbackPolicy::Refuse },
            reserve_ahead_ms: 500,
            ..WorkerConfig::default()
        };
        let mut wall = T0 + 100_000;
        let mut persisted = 0;
        let mut w = worker(cfg, persisted);
        let mut last = 0u64;
        let mut issued = 0u64;
        for step in steps {
            let burst = match step {
                ClockStep::Tick(ms) => { wall += ms; 1 }
                ClockStep::Back(ms) => { wall -= ms; 1 }
                ClockStep::Forward(ms) => { wall += ms; 1 }
                ClockStep::Burst(n) => n,
                ClockStep::Restart => { w = worker(cfg, persisted); 1 }
                ClockStep::ReservationLost => {
                    // A reservation request that never reached the store.
                    if w.poll_reservation().is_some() { w.handle_reservation_failed(); }
                    1
                }
            };
            for _ in 0..burst {
                if let Ok(NextId::Id(id)) = w.next_id(wall) {
                    prop_assert!(id > last, "id {} after {} at wall {}", id, last, wall);
                    last = id;
                    issued += 1;
                }
                if let Some(ts) = w.poll_reservation() {
                    persisted = persisted.max(ts);
                    w.handle_reserved(persisted);
                }
            }
        }
        prop_assert!(issued > 0 || last == 0);
    }
}

#[test]
fn semantic_ids_have_the_seed_shape_and_never_wrap() {
    let cfg = SemanticConfig {
        prefix: "OD".into(),
        rollback_ms_max: 5,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: 3_000,
        per_second: 100_000,
        flaw: None,
    };
    let mut generator = SemanticGenerator::new(&cfg, 127, 0).unwrap();
    let wall = 1_717_023_456_000;
    let mut ids = std::collections::BTreeSet::new();
    let mut waited = None;
    for _ in 0..100_010 {
        match generator.next_id(wall).unwrap() {
            NextSemantic::Id(id) => assert!(ids.insert(id)),
            NextSemantic::WaitReservation => {
                let ts = generator
                    .poll_reservation()
                    .expect("a reservation is pending");
                generator.handle_reserved(ts);
            }
            NextSemantic::WaitUntil { wall_ms } => {
                waited = Some(wall_ms);
                break;
            }
        }
    }
    assert_eq!(ids.len(), 100_000, "at most 100,000 per second per machine");
    assert_eq!(
        waited,
        Some(1_717_023_457_000),
        "the 100,001st waits for the next second"
    );
    let first = ids.iter().next().unwrap();
    assert_eq!(first, "OD171702345612700000");
    let parts = semantic::parse(first).unwrap();
    assert_eq!(
        (parts.seconds, parts.machine, parts.seq),
        (1_717_023_456, 127, 0)
    );
}

#[test]
fn semantic_bad_input_is_typed() {
    let cfg = SemanticConfig {
        prefix: "od".into(),
        rollback_ms_max: 5,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: 1,
        per_second: 100_000,
        flaw: None,
    };
    assert!(matches!(
        SemanticGenerator::new(&cfg, 1, 0),
        Err(semantic::SemanticError::BadPrefix(_))
    ));
    let cfg = SemanticConfig {
        prefix: "OD".into(),
        ..cfg
    };
    assert!(matches!(
        SemanticGenerator::new(&cfg, 1000, 0),
        Err(semantic::SemanticError::MachineTooLarge(1000))
    ));
    for bad in [
        "",
        "OD1",
        "od171702345612700000",
        "OD17170234561270000x",
        "OD1717023456127000000",
    ] {
        assert!(semantic::parse(bad).is_err(), "{bad}");
    }
}

fn flawed(flaw: crate::flaw::Flaw) -> WorkerConfig {
    WorkerConfig {
        flaw: Some(flaw),
        ..WorkerConfig::default()
    }
}

/// Two IDs in one millisecond, a 2 ms step back (waited out), then the clock returns.
fn step_back_and_return(cfg: WorkerConfig) -> Vec<u64> {
    let mut w = worker(cfg, 0);
    let mut ids = Vec::new();
    for wall in [T0, T0, T0 - 2, T0, T0] {
        if let Ok(NextId::Id(id)) = issue(&mut w, wall) {
            ids.push(id);
        }
    }
    ids
}

#[test]
fn a_waited_out_rollback_keeps_the_sequence() {
    let ids = step_back_and_return(WorkerConfig::default());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn flaw_snowflake_seq_reset_first_repeats_an_id() {
    let ids = step_back_and_return(flawed(crate::flaw::Flaw::SnowflakeSeqResetFirst));
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert!(unique.len() < ids.len(), "a duplicate: {ids:?}");
}

#[test]
fn flaw_snowflake_no_persisted_ts_repeats_after_a_restart() {
    let cfg = flawed(crate::flaw::Flaw::SnowflakeNoPersistedTs);
    let mut w = worker(cfg, 0);
    let mut before = std::collections::BTreeSet::new();
    for t in 0..2_000 {
        if let Ok(NextId::Id(id)) = issue(&mut w, T0 + t) {
            before.insert(id);
        }
    }
    // The record lags up to `reserve_ahead_ms` behind; restart with the clock 1 s back.
    let persisted = w.sequencer().reserved_ts();
    let mut restarted = worker(cfg, persisted);
    let Ok(NextId::Id(id)) = issue(&mut restarted, T0 + 1_500) else {
        panic!("the flawed restart issues at once")
    };
    assert!(
        before.contains(&id),
        "ID {id} repeats one issued before the crash"
    );
}

#[test]
fn flaw_time_field_narrow_wraps_the_timestamp() {
    let mut w = narrow_worker(Some(crate::flaw::Flaw::TimeFieldNarrow));
    let Ok(NextId::Id(last)) = issue(&mut w, EPOCH + 255_999) else {
        panic!()
    };
    let Ok(NextId::Id(wrapped)) = issue(&mut w, EPOCH + 256_000) else {
        panic!("the flaw issues past the field's end")
    };
    assert!(
        wrapped < last,
        "the ID went backwards: {wrapped} after {last}"
    );
}

#[test]
fn flaw_semantic_seq_wrap_repeats_within_a_second() {
    let cfg = |flaw| SemanticConfig {
        prefix: "OD".into(),
        rollback_ms_max: 5,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: 3_000,
        per_second: 100,
        flaw,
    };
    let run = |flaw| {
        let mut generator = SemanticGenerator::new(&cfg(flaw), 7, 0).unwrap();
        let mut ids = Vec::new();
        for _ in 0..150 {
            match generator.next_id(1_717_023_456_000).unwrap() {
                NextSemantic::Id(id) => ids.push(id),
                NextSemantic::WaitReservation => {
                    let ts = generator.poll_reservation().unwrap();
                    generator.handle_reserved(ts);
                }
                NextSemantic::WaitUntil { .. } => break,
            }
        }
        let unique: std::collections::BTreeSet<_> = ids.iter().cloned().collect();
        (ids.len(), unique.len())
    };
    assert_eq!(run(None), (100, 100), "the 101st waits");
    let (issued, unique) = run(Some(crate::flaw::Flaw::SemanticSeqWrap));
    assert!(
        issued > unique,
        "the sequence wrapped: {issued} IDs, {unique} distinct"
    );
}

#[test]
fn flaw_machine_id_hash_ip_collides_between_hosts() {
    // Java's "10.0.0.1".hashCode() is 511_552_166 (the same fold, computed independently).
    assert_eq!(machine_id_from_ip([10, 0, 0, 1]), 166);
    let mut seen = std::collections::BTreeMap::new();
    let collision = (0..=255u8)
        .flat_map(|c| (1..=254u8).map(move |d| [10, 0, c, d]))
        .find_map(|ip| {
            seen.insert(machine_id_from_ip(ip), ip)
                .map(|other| (other, ip))
        });
    let (a, b) = collision.expect("two hosts of one /16 share a machine id");
    assert_ne!(a, b);
    assert!(seen.len() <= 1_000);
}

/// [`Sequencer::check_invariants`] and [`SnowflakeWorker::check_invariants`] hold along a
/// correct run and fire on crafted states.
#[test]
fn worker_invariants_hold_on_a_run_and_fire_on_crafted_states() {
    let mut w = worker(WorkerConfig::default(), 0);
    for t in 0..50 {
        let _ = issue(&mut w, T0 + t);
        w.check_invariants().unwrap();
    }
    let mut bad = w.clone();
    bad.sequencer.last_ts = bad.sequencer.reserved_ts + 1;
    assert!(
        bad.check_invariants()
            .unwrap_err()
            .contains("above the persisted reservation")
    );
    let mut bad = w.clone();
    bad.worker_id = bad.layout.worker_count();
    assert!(bad.check_invariants().unwrap_err().contains("worker id"));
    let mut bad = w.clone();
    bad.sequencer.reservation_in_flight = Some(10);
    bad.sequencer.reservation_wanted = Some(10);
    assert!(
        bad.check_invariants()
            .unwrap_err()
            .contains("wanted reservation")
    );
    // The flaw that issues above the reservation on purpose is exempt.
    let mut flawed = worker(
        WorkerConfig {
            flaw: Some(crate::flaw::Flaw::SnowflakeNoPersistedTs),
            ..WorkerConfig::default()
        },
        0,
    );
    flawed.sequencer.last_ts = flawed.sequencer.reserved_ts + 1;
    flawed.check_invariants().unwrap();
}

/// Whether `machine` reached `edge` since its counts were last taken (and takes them).
fn reached(machine: &mut impl Observed, edge: &crate::edge::Edge) -> bool {
    machine.edges().contains_key(edge.name)
}

#[test]
fn edge_sequence_exhausted() {
    let cfg = WorkerConfig {
        layout: Layout {
            seq_bits: 2,
            ..Layout::default()
        },
        ..WorkerConfig::default()
    };
    let mut w = worker(cfg, 0);
    let _ = w.edges();
    for _ in 0..4 {
        assert!(matches!(issue(&mut w, T0), Ok(NextId::Id(_))));
    }
    assert!(!reached(&mut w, &edges::SEQUENCE_EXHAUSTED));
    assert_eq!(issue(&mut w, T0), Ok(NextId::WaitUntil { wall_ms: T0 + 1 }));
    assert!(reached(&mut w, &edges::SEQUENCE_EXHAUSTED));
}

#[test]
fn edge_semantic_sequence_exhausted() {
    let cfg = SemanticConfig {
        prefix: "OD".into(),
        rollback_ms_max: 5,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: 3_000,
        per_second: 2,
        flaw: None,
    };
    let mut g = SemanticGenerator::new(&cfg, 7, 0).unwrap();
    let _ = g.edges();
    let mut ids = 0;
    for _ in 0..10 {
        match g.next_id(T0).unwrap() {
            NextSemantic::Id(_) => ids += 1,
            NextSemantic::WaitReservation => {
                let ts = g.poll_reservation().unwrap();
                g.handle_reserved(ts);
            }
            NextSemantic::WaitUntil { .. } => break,
        }
    }
    assert_eq!(ids, 2);
    assert!(reached(&mut g, &edges::SEQUENCE_EXHAUSTED));
}

#[test]
fn edge_rollback_within_window() {
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 100), Ok(NextId::Id(_))));
    let _ = w.edges();
    assert_eq!(
        issue(&mut w, T0 + 95),
        Ok(NextId::WaitUntil { wall_ms: T0 + 100 })
    );
    let counts = w.edges();
    assert!(counts.contains_key(edges::ROLLBACK_WITHIN_WINDOW.name));
    assert!(!counts.contains_key(edges::ROLLBACK_BEYOND_WINDOW.name));
}

#[test]
fn edge_rollback_beyond_window() {
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 100), Ok(NextId::Id(_))));
    let _ = w.edges();
    assert!(matches!(
        issue(&mut w, T0 + 94),
        Err(SequencerError::ClockBehind { .. })
    ));
    let counts = w.edges();
    assert!(counts.contains_key(edges::ROLLBACK_BEYOND_WINDOW.name));
    assert!(!counts.contains_key(edges::ROLLBACK_WITHIN_WINDOW.name));
    assert!(!counts.contains_key(edges::RESTART_BEHIND_RESERVATION.name));
}

#[test]
fn edge_restart_behind_reservation() {
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 10_000), Ok(NextId::Id(_))));
    let persisted = w.sequencer().reserved_ts();
    let _ = w.edges();
    // Restart after the clock went 2 s back (Leaf #216).
    let mut restarted = worker(WorkerConfig::default(), persisted);
    assert!(matches!(
        issue(&mut restarted, T0 + 8_000),
        Err(SequencerError::ClockBehind { .. })
    ));
    let counts = restarted.edges();
    assert!(counts.contains_key(edges::RESTART_BEHIND_RESERVATION.name));
    assert!(
        !counts.contains_key(edges::ROLLBACK_BEYOND_WINDOW.name),
        "a floor, not a clock that moved back under a running worker"
    );
    // A restart whose clock is past the reservation is no edge.
    let mut ahead = worker(WorkerConfig::default(), persisted);
    assert!(matches!(
        issue(&mut ahead, EPOCH + persisted + 1),
        Ok(NextId::Id(_))
    ));
    assert!(!reached(&mut ahead, &edges::RESTART_BEHIND_RESERVATION));
}

#[test]
fn edge_reservation_wait() {
    let mut w = worker(WorkerConfig::default(), 0);
    let _ = w.edges();
    assert_eq!(w.next_id(T0), Ok(NextId::WaitReservation));
    assert!(reached(&mut w, &edges::RESERVATION_WAIT));
    let ts = w.poll_reservation().unwrap();
    w.handle_reserved(ts);
    assert!(matches!(w.next_id(T0), Ok(NextId::Id(_))));
    assert!(!reached(&mut w, &edges::RESERVATION_WAIT));
}

#[test]
fn edge_time_field_exhausted() {
    let mut w = narrow_worker(None);
    let _ = w.edges();
    assert!(matches!(issue(&mut w, EPOCH + 255_999), Ok(NextId::Id(_))));
    assert!(!reached(&mut w, &edges::TIME_FIELD_EXHAUSTED));
    assert!(matches!(
        issue(&mut w, EPOCH + 256_000),
        Err(SequencerError::TimeExhausted { .. })
    ));
    assert!(reached(&mut w, &edges::TIME_FIELD_EXHAUSTED));
}

#[test]
fn edge_rollback_at_bound_and_the_flawed_gap_at_it() {
    // Default window: 5 ms. 105 - 100 = 5 behind: the last reading waited out.
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 105), Ok(NextId::Id(_))));
    let _ = w.edges();
    assert_eq!(
        issue(&mut w, T0 + 100),
        Ok(NextId::WaitUntil { wall_ms: T0 + 105 })
    );
    assert!(reached(&mut w, &edges::ROLLBACK_AT_BOUND));
    assert!(matches!(
        issue(&mut w, T0 + 98),
        Err(SequencerError::ClockBehind { .. })
    ));
    assert!(
        !reached(&mut w, &edges::ROLLBACK_AT_BOUND),
        "7 ms behind is 2 ms past the bound"
    );
    // The flaw: exactly at the bound, the current (earlier) unit is issued.
    let flawed = WorkerConfig {
        flaw: Some(crate::flaw::Flaw::SnowflakeRollbackBoundGap),
        ..WorkerConfig::default()
    };
    let mut f = worker(flawed, 0);
    let Ok(NextId::Id(later)) = issue(&mut f, T0 + 105) else {
        panic!("issues at T0 + 105");
    };
    let Ok(NextId::Id(earlier)) = issue(&mut f, T0 + 100) else {
        panic!("the flawed gap issues at the bound");
    };
    assert!(earlier < later, "an ID from the past");
}

#[test]
fn edge_restart_at_floor_and_the_boundaries_a_sequencer_declares() {
    use crate::boundary::{Boundary, Bounded, ClockKind};
    let mut w = worker(WorkerConfig::default(), 0);
    assert!(matches!(issue(&mut w, T0 + 10_000), Ok(NextId::Id(_))));
    let floor = w.sequencer().reserved_ts();
    let mut bounds = Vec::new();
    w.sequencer().boundaries(&mut bounds);
    assert_eq!(
        bounds,
        vec![
            Boundary {
                name: "snowflake.rollback_bound",
                clock: ClockKind::Wall,
                at_ms: T0 + 10_000 - 5,
            },
            Boundary {
                name: "snowflake.reservation_end",
                clock: ClockKind::Wall,
                at_ms: EPOCH + floor + 1,
            },
        ]
    );
    // A restart on that floor: its first issuable reading is the floor's next unit.
    let mut restarted = worker(WorkerConfig::default(), floor);
    let mut bounds = Vec::new();
    restarted.sequencer().boundaries(&mut bounds);
    let first = bounds
        .iter()
        .find(|b| b.name == "snowflake.floor")
        .expect("a fresh sequencer declares its floor");
    assert_eq!(first.at_ms, EPOCH + floor + 1);
    let _ = restarted.edges();
    assert!(matches!(
        issue(&mut restarted, first.at_ms - 1),
        Ok(NextId::WaitUntil { .. })
    ));
    assert!(reached(&mut restarted, &edges::RESTART_AT_FLOOR));
    assert!(matches!(
        issue(&mut restarted, first.at_ms),
        Ok(NextId::Id(_))
    ));
    // Far from the floor: no such edge.
    let mut far = worker(WorkerConfig::default(), floor);
    let _ = issue(&mut far, first.at_ms + 50);
    assert!(!reached(&mut far, &edges::RESTART_AT_FLOOR));
}
