//! The lottery's edge states (`crate::edge`): every state the coordinator, the participants and
//! the compensation wheel declare is driven here, on the real code paths, and counted; and the
//! counting stays honest (a journal replay or a settled restart counts nothing, the happy path
//! reaches no rare state, a flawed two-step operation counts the situation it mishandles).
//!
//! Each machine counts its own arrivals; a test takes them from the machines it drove.

use std::collections::BTreeSet;

use super::super::journal::{self, Journaled};
use super::super::wheel::{self, FailOutcome, TaskSpec, TimingWheel, WheelConfig};
use super::super::{
    ActivityId, CoordLog, Coordinator, CoordinatorConfig, DrawArgs, DrawOutcome, DrawStage,
    FenceMode, Flaws, Handled, LogEntry, LotteryStore, MemoryStore, Participant, ParticipantConfig,
    ParticipantMsg, Phase, UserId, Verdict, coordinator, participant,
};
use super::{draw, send};
use crate::clock::Now;
use crate::edge::{Edge, EdgeCounts, Edges, Machine, Observed};

// ----- helpers -------------------------------------------------------------------------------

/// The arrivals at edge states of `machines`, taken.
fn tally(machines: &mut [&mut dyn Observed]) -> EdgeCounts {
    let mut all = Edges::new();
    for machine in machines {
        machine.take_edges(&mut all);
    }
    all.take()
}

/// Runs `drive` (which returns what its machines reached) and asserts it reached `edge`.
fn assert_reaches(edge: &Edge, drive: fn() -> EdgeCounts) {
    let counts = drive();
    assert!(
        counts.get(edge.name).is_some_and(|n| *n > 0),
        "{} not reached; reached: {counts:?}",
        edge.name
    );
}

/// User 1 (and 2) with `balance`, activity 1 with `stock` units.
fn store(balance: u64, stock: u64) -> MemoryStore {
    let mut s = MemoryStore::new();
    s.open_account(UserId(1), balance).unwrap();
    s.open_account(UserId(2), balance).unwrap();
    s.add_stock(ActivityId(1), stock).unwrap();
    s
}

/// Two attempts per message, one compensation retry: every give-up comes quickly.
fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        inflight_max: 4,
        reply_timeout_ms: 100,
        backoff_ms_max: 200,
        attempts_max: 2,
        events_max: 16,
        park_delay_ms: 100,
        compensation_retries_max: 1,
        wheel: WheelConfig {
            tasks_max: 8,
            backoff_base_ms: 100,
            backoff_cap_ms: 200,
            ..WheelConfig::default()
        },
        flaw: None,
    }
}

/// Writes and acknowledges every pending log entry.
fn write_log(c: &mut Coordinator, log: &mut CoordLog, now: Now) {
    while let Some(e) = c.poll_log_write() {
        log.append(&e).unwrap();
        c.handle_log_written(&e, now);
    }
}

/// Starts `d` and makes its `Begin` durable: the Tries are in the outbox.
fn begin(c: &mut Coordinator, log: &mut CoordLog, d: DrawArgs, now: Now) {
    c.start_draw(d, now).unwrap();
    write_log(c, log, now);
}

/// Takes the outbox without delivering it.
fn lose_sends(c: &mut Coordinator) -> Vec<(Participant, ParticipantMsg)> {
    std::iter::from_fn(|| c.poll_send()).collect()
}

/// Delivers the outbox to `s` and the replies back.
fn deliver(c: &mut Coordinator, s: &mut MemoryStore, now: Now) {
    for (p, m) in lose_sends(c) {
        let r = send(s, p, m.phase, m.draw);
        c.handle_reply(p, &r, now);
    }
}

/// Moves to the next deadline and handles it.
fn expire(c: &mut Coordinator) -> Now {
    let t = Now::both(c.poll_timeout().expect("a timer"));
    c.handle_timeout(t);
    c.check_invariants().unwrap();
    t
}

/// Loses every message and lets the timers run until `xid` is in `stage`.
fn lose_until(c: &mut Coordinator, xid: u64, stop: impl Fn(DrawStage) -> bool) -> Now {
    let mut t = Now::both(0);
    for _ in 0..100 {
        let _ = lose_sends(c);
        if c.stage(super::super::Xid(xid)).is_some_and(&stop) {
            return t;
        }
        t = expire(c);
    }
    panic!("draw {xid} never reached the stage");
}

/// A losing draw whose Tries succeeded and whose Confirm verdict is durable; the Confirms are
/// in the outbox.
fn decided(c: &mut Coordinator, s: &mut MemoryStore, log: &mut CoordLog) {
    let now = Now::both(0);
    begin(c, log, draw(1, false), now);
    deliver(c, s, now);
    write_log(c, log, now);
    assert_eq!(
        c.stage(super::super::Xid(1)),
        Some(DrawStage::Finishing(Verdict::Confirm))
    );
}

fn handle(p: Participant, s: &mut MemoryStore, flaws: Flaws, phase: Phase, d: DrawArgs) -> Handled {
    p.handle(
        s,
        &ParticipantConfig { flaws },
        &crate::testkit::lottery::registry(),
        &ParticipantMsg { phase, draw: d },
    )
}

// ----- coordinator ---------------------------------------------------------------------------

fn recovered_undecided() -> EdgeCounts {
    let mut log = CoordLog::default();
    log.append(&LogEntry::Begin(draw(1, true))).unwrap();
    let mut c = Coordinator::recover(config(), &log, Now::both(0)).unwrap();
    assert_eq!(
        c.stage(super::super::Xid(1)),
        Some(DrawStage::LoggingVerdict(Verdict::Cancel))
    );
    tally(&mut [&mut c])
}

fn recovered_decided() -> EdgeCounts {
    let mut log = CoordLog::default();
    log.append(&LogEntry::Begin(draw(1, true))).unwrap();
    log.append(&LogEntry::Decided {
        xid: super::super::Xid(1),
        verdict: Verdict::Confirm,
    })
    .unwrap();
    let mut c = Coordinator::recover(config(), &log, Now::both(0)).unwrap();
    assert!(
        lose_sends(&mut c)
            .iter()
            .all(|(_, m)| m.phase == Phase::Confirm)
    );
    tally(&mut [&mut c])
}

fn try_timed_out() -> EdgeCounts {
    let mut c = Coordinator::new(config()).unwrap();
    begin(
        &mut c,
        &mut CoordLog::default(),
        draw(1, false),
        Now::both(0),
    );
    lose_until(&mut c, 1, |s| {
        s == DrawStage::LoggingVerdict(Verdict::Cancel)
    });
    tally(&mut [&mut c])
}

fn duplicate_try_landed() -> EdgeCounts {
    let (mut c, mut s, now) = (
        Coordinator::new(config()).unwrap(),
        store(100, 1),
        Now::both(0),
    );
    begin(&mut c, &mut CoordLog::default(), draw(1, false), now);
    // The Tries land; their replies are lost.
    for (p, m) in lose_sends(&mut c) {
        let _ = send(&mut s, p, m.phase, m.draw);
    }
    let t = expire(&mut c);
    // The resent Tries are refused as `tried`: the first ones landed.
    deliver(&mut c, &mut s, t);
    assert_eq!(
        c.stage(super::super::Xid(1)),
        Some(DrawStage::LoggingVerdict(Verdict::Confirm))
    );
    tally(&mut [&mut c, &mut s])
}

fn reply_after_verdict() -> EdgeCounts {
    let (mut c, mut s) = (Coordinator::new(config()).unwrap(), store(100, 1));
    begin(
        &mut c,
        &mut CoordLog::default(),
        draw(1, false),
        Now::both(0),
    );
    let first = lose_sends(&mut c);
    let t = lose_until(&mut c, 1, |s| {
        s == DrawStage::LoggingVerdict(Verdict::Cancel)
    });
    // The first Tries arrive after the timeout-cancel: they succeed, too late.
    for (p, m) in first {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, t);
    }
    assert_eq!(
        c.stage(super::super::Xid(1)),
        Some(DrawStage::LoggingVerdict(Verdict::Cancel))
    );
    tally(&mut [&mut c, &mut s])
}

fn duplicate_reply() -> EdgeCounts {
    let (mut c, mut s, now) = (
        Coordinator::new(config()).unwrap(),
        store(100, 1),
        Now::both(0),
    );
    begin(&mut c, &mut CoordLog::default(), draw(1, false), now);
    for (p, m) in lose_sends(&mut c) {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, now);
        c.handle_reply(p, &r, now);
    }
    tally(&mut [&mut c, &mut s])
}

fn parked() -> EdgeCounts {
    let (mut c, mut s, mut log) = (
        Coordinator::new(config()).unwrap(),
        store(100, 1),
        CoordLog::default(),
    );
    decided(&mut c, &mut s, &mut log);
    lose_until(&mut c, 1, |s| s == DrawStage::Parked(Verdict::Confirm));
    tally(&mut [&mut c, &mut s])
}

fn parked_draw_completed() -> EdgeCounts {
    let (mut c, mut s, mut log) = (
        Coordinator::new(config()).unwrap(),
        store(100, 1),
        CoordLog::default(),
    );
    decided(&mut c, &mut s, &mut log);
    lose_until(&mut c, 1, |s| s == DrawStage::Parked(Verdict::Confirm));
    // The compensation round comes due and this time the network delivers.
    let mut t = Now::both(0);
    while c.stage(super::super::Xid(1)) == Some(DrawStage::Parked(Verdict::Confirm)) {
        t = expire(&mut c);
    }
    deliver(&mut c, &mut s, t);
    write_log(&mut c, &mut log, t);
    assert_eq!(
        c.poll_event().map(|e| e.outcome),
        Some(DrawOutcome::Parked {
            verdict: Verdict::Confirm
        })
    );
    assert_eq!(
        c.poll_event().map(|e| e.outcome),
        Some(DrawOutcome::Confirmed { won: false })
    );
    tally(&mut [&mut c, &mut s])
}

fn dead_lettered() -> EdgeCounts {
    let (mut c, mut s, mut log) = (
        Coordinator::new(config()).unwrap(),
        store(100, 1),
        CoordLog::default(),
    );
    decided(&mut c, &mut s, &mut log);
    lose_until(&mut c, 1, |s| {
        s == DrawStage::DeadLettered(Verdict::Confirm)
    });
    tally(&mut [&mut c, &mut s])
}

// ----- participant ---------------------------------------------------------------------------

fn empty_rollback() -> EdgeCounts {
    let mut s = store(100, 1);
    let r = send(&mut s, Participant::Wallet, Phase::Cancel, draw(1, false));
    assert_eq!(r.outcome, Ok(super::super::Effect::EmptyRollback));
    tally(&mut [&mut s])
}

fn try_after_cancel() -> EdgeCounts {
    let mut s = store(100, 1);
    let _ = send(&mut s, Participant::Wallet, Phase::Cancel, draw(1, false));
    let r = send(&mut s, Participant::Wallet, Phase::Try, draw(1, false));
    assert!(r.outcome.is_err(), "the hanging Try is refused");
    tally(&mut [&mut s])
}

fn duplicate_try() -> EdgeCounts {
    let mut s = store(100, 1);
    let _ = send(&mut s, Participant::Wallet, Phase::Try, draw(1, false));
    let r = send(&mut s, Participant::Wallet, Phase::Try, draw(1, false));
    assert!(r.outcome.is_err());
    assert_eq!(s.ledger().accounts[&UserId(1)].frozen_minor, 10);
    tally(&mut [&mut s])
}

fn repeated_verdict() -> EdgeCounts {
    let mut s = store(100, 1);
    for phase in [Phase::Try, Phase::Confirm, Phase::Confirm] {
        let _ = send(&mut s, Participant::Wallet, phase, draw(1, false));
    }
    assert_eq!(s.ledger().collected_minor, 10);
    tally(&mut [&mut s])
}

fn last_unit() -> EdgeCounts {
    let mut s = store(100, 1);
    let r = send(&mut s, Participant::Inventory, Phase::Try, draw(1, true));
    assert!(r.outcome.is_ok());
    tally(&mut [&mut s])
}

fn out_of_stock() -> EdgeCounts {
    let mut s = store(100, 0);
    let r = send(&mut s, Participant::Inventory, Phase::Try, draw(1, true));
    assert!(r.outcome.is_err());
    tally(&mut [&mut s])
}

fn balance_exact() -> EdgeCounts {
    let mut s = store(10, 1);
    let r = send(&mut s, Participant::Wallet, Phase::Try, draw(1, false));
    assert!(r.outcome.is_ok());
    assert_eq!(s.ledger().accounts[&UserId(1)].balance_minor, 0);
    tally(&mut [&mut s])
}

fn already_participated() -> EdgeCounts {
    let mut s = store(100, 1);
    let _ = send(
        &mut s,
        Participant::Participation,
        Phase::Try,
        draw(1, false),
    );
    let r = send(
        &mut s,
        Participant::Participation,
        Phase::Try,
        draw(2, false),
    );
    assert!(r.outcome.is_err());
    tally(&mut [&mut s])
}

/// A participant's journal with one Try awaiting its verdict.
fn journal_with_a_pending_try() -> Vec<journal::JournalOp> {
    let mut j = Journaled::default();
    j.open_accounts(1, 1, 100).unwrap();
    let _ = send(&mut j, Participant::Wallet, Phase::Try, draw(1, false));
    j.take_records()
}

fn rebuilt_in_doubt() -> EdgeCounts {
    let records = journal_with_a_pending_try();
    let mut j = Journaled::new(journal::replay(&records).0);
    assert_eq!(j.memory().ledger().accounts[&UserId(1)].frozen_minor, 10);
    tally(&mut [&mut j])
}

// ----- wheel ---------------------------------------------------------------------------------

fn new_wheel() -> TimingWheel<u64> {
    TimingWheel::new(WheelConfig::default(), 0).unwrap()
}

fn fired_late() -> EdgeCounts {
    let mut w = new_wheel();
    let _ = w.schedule(TaskSpec::new(10, 1)).unwrap();
    w.handle_timeout(50);
    assert_eq!(w.poll_ready().map(|f| f.payload), Some(1));
    tally(&mut [&mut w])
}

fn cascaded() -> EdgeCounts {
    let mut w = new_wheel();
    // 500 ms is beyond level 0 (64 ticks of 1 ms): it waits on level 1 and cascades down.
    let _ = w.schedule(TaskSpec::new(500, 1)).unwrap();
    while let Some(at) = w.poll_timeout().filter(|at| *at < 500) {
        w.handle_timeout(at);
        assert!(w.poll_ready().is_none(), "not before its deadline");
    }
    w.handle_timeout(500);
    assert_eq!(w.poll_ready().map(|f| f.payload), Some(1));
    tally(&mut [&mut w])
}

fn cancelled_waiting() -> EdgeCounts {
    let mut w = new_wheel();
    let h = w.schedule(TaskSpec::new(100, 1)).unwrap();
    assert_eq!(w.cancel(h), Ok(1));
    w.handle_timeout(200);
    assert!(w.poll_ready().is_none());
    tally(&mut [&mut w])
}

fn same_tick_tie() -> EdgeCounts {
    let mut w = new_wheel();
    let _ = w.schedule(TaskSpec::new(10, 1)).unwrap();
    let _ = w.schedule(TaskSpec::new(10, 2).with_priority(1)).unwrap();
    w.handle_timeout(10);
    assert_eq!(w.poll_ready().map(|f| f.payload), Some(2), "priority first");
    assert_eq!(w.poll_ready().map(|f| f.payload), Some(1));
    tally(&mut [&mut w])
}

/// A task with one retry, fired once and failed: rescheduled.
fn failed_once(w: &mut TimingWheel<u64>) -> wheel::TaskHandle {
    let h = w
        .schedule(TaskSpec::new(10, 1).with_retries_max(1))
        .unwrap();
    w.handle_timeout(10);
    let fired = w.poll_ready().unwrap();
    assert!(matches!(
        w.handle_failed(fired.handle, 10),
        Ok(FailOutcome::Retrying { attempt: 1, .. })
    ));
    h
}

fn retry_backoff() -> EdgeCounts {
    let mut w = new_wheel();
    let _ = failed_once(&mut w);
    tally(&mut [&mut w])
}

fn succeeded_after_retry() -> EdgeCounts {
    let mut w = new_wheel();
    let h = failed_once(&mut w);
    // The retry is 100 ms out: the wheel may wake first to cascade it.
    let fired = loop {
        w.handle_timeout(w.poll_timeout().unwrap());
        if let Some(fired) = w.poll_ready() {
            break fired;
        }
    };
    assert_eq!((fired.handle, fired.attempt), (h, 1));
    assert_eq!(w.handle_succeeded(h), Ok(1));
    tally(&mut [&mut w])
}

fn task_dead_lettered() -> EdgeCounts {
    let mut w = new_wheel();
    let h = w.schedule(TaskSpec::new(10, 1)).unwrap();
    w.handle_timeout(10);
    let _ = w.poll_ready().unwrap();
    assert_eq!(w.handle_failed(h, 10), Ok(FailOutcome::DeadLettered));
    assert_eq!(w.dead_letters().len(), 1);
    tally(&mut [&mut w])
}

// ----- one test per edge state, and the list is complete -------------------------------------

macro_rules! edge_tests {
    ($($test:ident: $edge:expr => $drive:ident,)*) => {
        /// Every lottery edge state and the function that drives it.
        const DRIVERS: &[(&Edge, fn() -> EdgeCounts)] = &[$((&$edge, $drive)),*];
        $(
            #[test]
            fn $test() {
                assert_reaches(&$edge, $drive);
            }
        )*
    };
}

edge_tests! {
    coordinator_recovered_undecided: coordinator::RECOVERED_UNDECIDED => recovered_undecided,
    coordinator_recovered_decided: coordinator::RECOVERED_DECIDED => recovered_decided,
    coordinator_try_timed_out: coordinator::TRY_TIMED_OUT => try_timed_out,
    coordinator_duplicate_try_landed: coordinator::DUPLICATE_TRY_LANDED => duplicate_try_landed,
    coordinator_reply_after_verdict: coordinator::REPLY_AFTER_VERDICT => reply_after_verdict,
    coordinator_duplicate_reply: coordinator::DUPLICATE_REPLY => duplicate_reply,
    coordinator_parked: coordinator::PARKED => parked,
    coordinator_parked_draw_completed: coordinator::PARKED_DRAW_COMPLETED => parked_draw_completed,
    coordinator_dead_lettered: coordinator::DEAD_LETTERED => dead_lettered,
    participant_empty_rollback: participant::EMPTY_ROLLBACK => empty_rollback,
    participant_try_after_cancel: participant::TRY_AFTER_CANCEL => try_after_cancel,
    participant_duplicate_try: participant::DUPLICATE_TRY => duplicate_try,
    participant_repeated_verdict: participant::REPEATED_VERDICT => repeated_verdict,
    participant_last_unit: participant::LAST_UNIT => last_unit,
    participant_out_of_stock: participant::OUT_OF_STOCK => out_of_stock,
    participant_balance_exact: participant::BALANCE_EXACT => balance_exact,
    participant_already_participated: participant::ALREADY_PARTICIPATED => already_participated,
    participant_rebuilt_in_doubt: participant::REBUILT_IN_DOUBT => rebuilt_in_doubt,
    wheel_fired_late: wheel::FIRED_LATE => fired_late,
    wheel_cascaded: wheel::CASCADED => cascaded,
    wheel_cancelled_waiting: wheel::CANCELLED_WAITING => cancelled_waiting,
    wheel_same_tick_tie: wheel::SAME_TICK_TIE => same_tick_tie,
    wheel_retry_backoff: wheel::RETRY_BACKOFF => retry_backoff,
    wheel_succeeded_after_retry: wheel::SUCCEEDED_AFTER_RETRY => succeeded_after_retry,
    wheel_dead_lettered: wheel::DEAD_LETTERED => task_dead_lettered,
}

#[test]
fn every_lottery_edge_state_is_declared_once_and_driven_here() {
    let declared: BTreeSet<&str> = [Machine::Coordinator, Machine::Participant, Machine::Wheel]
        .into_iter()
        .flat_map(Machine::edges)
        .map(|e| e.name)
        .collect();
    let driven: BTreeSet<&str> = DRIVERS.iter().map(|(e, _)| e.name).collect();
    assert_eq!(declared, driven);
    assert_eq!(driven.len(), DRIVERS.len(), "an edge state driven twice");
    for (e, _) in DRIVERS {
        assert_eq!(
            crate::edge_registry::find(e.name),
            Some(*e),
            "{} is listed in its EDGES",
            e.name
        );
    }
    for machine in [Machine::Coordinator, Machine::Participant, Machine::Wheel] {
        let n = machine.edges().count();
        assert!((5..=10).contains(&n), "{}: {n} edge states", machine.name());
    }
}

// ----- counting stays honest -----------------------------------------------------------------

#[test]
fn a_happy_draw_reaches_no_coordinator_or_wheel_edge_state() {
    let (mut c, mut s, mut log) = (
        Coordinator::new(config()).unwrap(),
        store(100, 5),
        CoordLog::default(),
    );
    let now = Now::both(0);
    begin(&mut c, &mut log, draw(1, true), now);
    deliver(&mut c, &mut s, now);
    write_log(&mut c, &mut log, now);
    deliver(&mut c, &mut s, now);
    write_log(&mut c, &mut log, now);
    assert_eq!(
        c.poll_event().map(|e| e.outcome),
        Some(DrawOutcome::Confirmed { won: true })
    );
    let counts = tally(&mut [&mut c, &mut s]);
    assert!(counts.is_empty(), "{counts:?}");
}

#[test]
fn a_journal_replay_counts_nothing_again_and_a_settled_restart_is_not_in_doubt() {
    let mut j = Journaled::default();
    j.open_accounts(1, 1, 100).unwrap();
    let _ = send(&mut j, Participant::Wallet, Phase::Cancel, draw(1, false));
    assert!(j.edges().contains_key(participant::EMPTY_ROLLBACK.name));
    let records = j.take_records();
    let (mut mem, replies) = journal::replay(&records);
    assert_eq!(replies.len(), 1, "the empty rollback was replayed");
    assert!(mem.edges().is_empty(), "a replay is no new arrival");
    assert!(
        Journaled::new(mem).edges().is_empty(),
        "nothing awaits a verdict"
    );

    let records = journal_with_a_pending_try();
    let (mut mem, _) = journal::replay(&records);
    assert!(mem.edges().is_empty());
    assert!(
        Journaled::new(mem)
            .edges()
            .contains_key(participant::REBUILT_IN_DOUBT.name)
    );
}

/// The flawed check-then-act decides on the row it read before the Cancel; the situation (a Try
/// that arrives after its Cancel) is counted all the same.
#[test]
fn a_flawed_check_then_act_counts_the_try_after_its_cancel() {
    let flaws = Flaws {
        fence: FenceMode::CheckThenAct,
        ..Flaws::NONE
    };
    let cfg = ParticipantConfig { flaws };
    let mut s = store(100, 1);
    let d = draw(1, false);
    let Handled::Resume(paused_try) = handle(Participant::Wallet, &mut s, flaws, Phase::Try, d)
    else {
        panic!("check-then-act is two steps");
    };
    let Handled::Resume(cancel) = handle(Participant::Wallet, &mut s, flaws, Phase::Cancel, d)
    else {
        panic!("check-then-act is two steps");
    };
    let _ = s.edges();
    let _ = Participant::Wallet.handle_resume(&mut s, &cfg, &cancel);
    assert!(s.edges().contains_key(participant::EMPTY_ROLLBACK.name));
    let r = Participant::Wallet.handle_resume(&mut s, &cfg, &paused_try);
    assert!(r.outcome.is_ok(), "the flaw lets the Try hang");
    assert!(s.edges().contains_key(participant::TRY_AFTER_CANCEL.name));
}
