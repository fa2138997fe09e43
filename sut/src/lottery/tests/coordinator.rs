//! Coordinator behaviour on a perfect network and under crafted losses.

use super::super::{
    ActivityId, CancelReason, CoordLog, Coordinator, CoordinatorConfig, CoordinatorError,
    DrawEvent, DrawOutcome, LogEntry, LotteryStore, MemoryStore, Participant, ParticipantMsg,
    Phase, Refusal, UserId, Verdict, Xid, coordinator::DrawStage, invariants,
};
use super::{draw, send};
use crate::clock::Now;
use crate::lottery::wheel::WheelConfig;

fn store(balance: u64, stock: u64) -> MemoryStore {
    let mut s = MemoryStore::new();
    s.open_account(UserId(1), balance).unwrap();
    s.open_account(UserId(2), balance).unwrap();
    s.add_stock(ActivityId(1), stock).unwrap();
    s
}

/// Drives `c` over a perfect network and log until nothing moves; returns the events.
fn pump(c: &mut Coordinator, s: &mut MemoryStore, log: &mut CoordLog, now: Now) -> Vec<DrawEvent> {
    let mut events = Vec::new();
    for _ in 0..1000 {
        let mut moved = false;
        while let Some(e) = c.poll_log_write() {
            log.append(&e).unwrap();
            c.handle_log_written(&e, now);
            moved = true;
        }
        while let Some((p, msg)) = c.poll_send() {
            let r = send(s, p, msg.phase, msg.draw);
            c.handle_reply(p, &r, now);
            moved = true;
        }
        while let Some(e) = c.poll_event() {
            events.push(e);
        }
        if !moved {
            return events;
        }
    }
    panic!("pump did not settle");
}

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        inflight_max: 2,
        reply_timeout_ms: 100,
        backoff_ms_max: 400,
        attempts_max: 4,
        events_max: 16,
        park_delay_ms: 1_000,
        compensation_retries_max: 2,
        wheel: WheelConfig {
            tasks_max: 4,
            backoff_base_ms: 500,
            backoff_cap_ms: 2_000,
            ..WheelConfig::default()
        },
        flaw: None,
    }
}

#[test]
fn the_flawed_coordinator_tries_before_its_begin_is_durable() {
    let now = Now::both(0);
    let mut correct = Coordinator::new(config()).unwrap();
    correct.start_draw(draw(1, true), now).unwrap();
    assert!(matches!(correct.poll_log_write(), Some(LogEntry::Begin(_))));
    assert_eq!(
        correct.poll_send(),
        None,
        "nothing sent before Begin is durable"
    );

    let mut flawed = Coordinator::new(CoordinatorConfig {
        flaw: Some(crate::flaw::Flaw::CoordTryBeforeBegin),
        ..config()
    })
    .unwrap();
    flawed.start_draw(draw(1, true), now).unwrap();
    assert!(matches!(flawed.poll_log_write(), Some(LogEntry::Begin(_))));
    let (_, msg) = flawed.poll_send().expect("a Try before Begin is durable");
    assert_eq!(msg.phase, Phase::Try);
}

#[test]
fn a_round_lasts_at_most_a_tick_plus_every_attempts_timeout() {
    // Timeouts 100, 200, 400 (the cap), 400 after the wheel's 1 ms tick.
    assert_eq!(config().round_ms_max(), 1 + 100 + 200 + 400 + 400);
    let coarse = CoordinatorConfig {
        attempts_max: 1,
        wheel: WheelConfig {
            tick_ms: 50,
            ..config().wheel
        },
        ..config()
    };
    assert_eq!(coarse.round_ms_max(), 50 + 100);
    let huge = CoordinatorConfig {
        reply_timeout_ms: u64::MAX,
        backoff_ms_max: u64::MAX,
        ..config()
    };
    assert_eq!(huge.round_ms_max(), u64::MAX, "saturates");
}

#[test]
fn winning_and_losing_draws_confirm_and_settle() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 1), CoordLog::default());
    let now = Now::both(0);
    c.start_draw(draw(1, true), now).unwrap();
    let mut d2 = draw(2, false);
    d2.user = UserId(2);
    c.start_draw(d2, now).unwrap();
    let events = pump(&mut c, &mut s, &mut log, now);
    assert_eq!(events.len(), 2);
    assert!(
        events
            .iter()
            .any(|e| e.draw.xid == Xid(1) && e.outcome == DrawOutcome::Confirmed { won: true })
    );
    assert!(
        events
            .iter()
            .any(|e| e.draw.xid == Xid(2) && e.outcome == DrawOutcome::Confirmed { won: false })
    );
    assert_eq!(c.inflight(), 0);
    assert!(log.is_empty());
    assert_eq!(c.poll_timeout(), None, "no timer left armed");
    let l = s.ledger();
    assert_eq!(l.collected_minor, 20);
    assert_eq!(l.stock[&ActivityId(1)].issued, 1);
    invariants::settled(l).unwrap();
}

#[test]
fn no_stock_left_cancels_the_draw_and_refunds() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 0), CoordLog::default());
    let now = Now::both(0);
    c.start_draw(draw(1, true), now).unwrap();
    let events = pump(&mut c, &mut s, &mut log, now);
    assert_eq!(
        events,
        vec![DrawEvent {
            draw: draw(1, true),
            outcome: DrawOutcome::Cancelled {
                reason: CancelReason::TryRefused {
                    branch: Participant::Inventory,
                    refusal: Refusal::OutOfStock {
                        activity: ActivityId(1)
                    }
                }
            }
        }]
    );
    let l = s.ledger();
    assert_eq!(l.accounts[&UserId(1)].balance_minor, 100);
    assert_eq!(l.collected_minor, 0);
    invariants::settled(l).unwrap();
}

#[test]
fn second_draw_of_a_user_in_an_activity_cancels() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 5), CoordLog::default());
    let now = Now::both(0);
    c.start_draw(draw(1, false), now).unwrap();
    let _ = pump(&mut c, &mut s, &mut log, now);
    c.start_draw(draw(2, true), now).unwrap();
    let events = pump(&mut c, &mut s, &mut log, now);
    assert!(matches!(
        &events[0].outcome,
        DrawOutcome::Cancelled {
            reason: CancelReason::TryRefused {
                refusal: Refusal::AlreadyParticipated { .. },
                ..
            }
        }
    ));
    let l = s.ledger();
    assert_eq!(l.collected_minor, 10);
    assert_eq!(l.stock[&ActivityId(1)].available, 5);
    invariants::settled(l).unwrap();
}

#[test]
fn input_errors_are_typed() {
    let bad = CoordinatorConfig {
        attempts_max: 0,
        ..config()
    };
    assert!(matches!(
        Coordinator::new(bad),
        Err(CoordinatorError::InvalidConfig { .. })
    ));
    let bad = CoordinatorConfig {
        backoff_ms_max: 10,
        ..config()
    };
    assert!(matches!(
        Coordinator::new(bad),
        Err(CoordinatorError::InvalidConfig { .. })
    ));
    let mut c = Coordinator::new(config()).unwrap();
    let now = Now::both(0);
    c.start_draw(draw(1, false), now).unwrap();
    assert_eq!(
        c.start_draw(draw(1, false), now),
        Err(CoordinatorError::DuplicateXid { xid: Xid(1) })
    );
    let mut big = draw(3, false);
    big.price_minor = u64::MAX;
    assert_eq!(
        c.start_draw(big, now),
        Err(CoordinatorError::AmountTooLarge {
            amount_minor: u64::MAX
        })
    );
    c.start_draw(draw(2, false), now).unwrap();
    assert_eq!(
        c.start_draw(draw(3, false), now),
        Err(CoordinatorError::Busy { inflight_max: 2 })
    );
    assert_eq!(
        c.handle_retry_dead_letter(Xid(1), now),
        Err(CoordinatorError::NotDeadLettered { xid: Xid(1) })
    );
    let small_wheel = CoordinatorConfig {
        wheel: WheelConfig {
            tasks_max: 1,
            ..WheelConfig::default()
        },
        ..config()
    };
    assert!(matches!(
        Coordinator::new(small_wheel),
        Err(CoordinatorError::InvalidConfig { .. })
    ));
}

#[test]
fn nothing_is_sent_before_begin_and_verdict_are_durable() {
    let mut c = Coordinator::new(config()).unwrap();
    let mut s = store(100, 1);
    let now = Now::both(0);
    c.start_draw(draw(1, false), now).unwrap();
    assert_eq!(c.poll_send(), None, "no Try before Begin is durable");
    let begin = c.poll_log_write().unwrap();
    assert_eq!(begin, LogEntry::Begin(draw(1, false)));
    c.handle_log_written(&begin, now);
    let mut replies = Vec::new();
    while let Some((p, m)) = c.poll_send() {
        assert_eq!(m.phase, Phase::Try);
        replies.push((p, send(&mut s, p, m.phase, m.draw)));
    }
    assert_eq!(replies.len(), 2, "losing draw: wallet and participation");
    for (p, r) in &replies {
        c.handle_reply(*p, r, now);
        c.handle_reply(*p, r, now); // duplicates are harmless
    }
    assert_eq!(
        c.poll_send(),
        None,
        "no Confirm before the verdict is durable"
    );
    assert_eq!(
        c.poll_timeout(),
        None,
        "nothing to time out while the log writes"
    );
    let decided = c.poll_log_write().unwrap();
    assert_eq!(
        decided,
        LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Confirm
        }
    );
    // A stale Begin acknowledgement changes nothing.
    c.handle_log_written(&begin, now);
    assert_eq!(c.poll_send(), None);
    c.handle_log_written(&decided, now);
    let mut sent = 0;
    while let Some((_, m)) = c.poll_send() {
        assert_eq!(m.phase, Phase::Confirm);
        sent += 1;
    }
    assert_eq!(sent, 2);
}

#[test]
fn stale_and_misaddressed_replies_are_ignored() {
    let mut c = Coordinator::new(config()).unwrap();
    let mut s = store(100, 1);
    let now = Now::both(0);
    c.start_draw(draw(1, false), now).unwrap();
    let begin = c.poll_log_write().unwrap();
    c.handle_log_written(&begin, now);
    let (p, m) = c.poll_send().unwrap();
    let r = send(&mut s, p, m.phase, m.draw);
    // From the wrong participant, for an unknown draw, a Confirm reply while trying, other args.
    c.handle_reply(Participant::Inventory, &r, now);
    let mut unknown = r.clone();
    unknown.draw.xid = Xid(99);
    c.handle_reply(p, &unknown, now);
    let mut wrong_phase = r.clone();
    wrong_phase.phase = Phase::Confirm;
    c.handle_reply(p, &wrong_phase, now);
    let mut other_args = r;
    other_args.draw.price_minor = 11;
    other_args.outcome = Err(Refusal::OutOfStock {
        activity: ActivityId(1),
    });
    c.handle_reply(p, &other_args, now);
    assert_eq!(c.stage(Xid(1)), Some(DrawStage::Trying));
    assert_eq!(c.poll_log_write(), None);
}

#[test]
fn retries_back_off_exponentially_then_a_silent_try_cancels() {
    let mut c = Coordinator::new(config()).unwrap();
    let start = Now::both(1_000);
    c.start_draw(draw(1, false), start).unwrap();
    let begin = c.poll_log_write().unwrap();
    c.handle_log_written(&begin, start);
    while c.poll_send().is_some() {}
    // Attempt k waits 100 << k ms, capped at 400: deadlines at +100, +300, +700, +1100.
    let mut now = start;
    let mut waits = Vec::new();
    for _ in 0..3 {
        let deadline = c.poll_timeout().unwrap();
        // A spurious early timeout is a no-op.
        c.handle_timeout(Now::both(deadline - 1));
        assert_eq!(c.poll_send(), None);
        waits.push(deadline - now.mono_ms);
        now = Now::both(deadline);
        c.handle_timeout(now);
        let mut resent = 0;
        while let Some((_, m)) = c.poll_send() {
            assert_eq!(m.phase, Phase::Try);
            resent += 1;
        }
        assert_eq!(resent, 2);
    }
    let deadline = c.poll_timeout().unwrap();
    waits.push(deadline - now.mono_ms);
    assert_eq!(waits, vec![100, 200, 400, 400]);
    c.handle_timeout(Now::both(deadline));
    assert_eq!(c.poll_send(), None, "attempts exhausted: no more Try");
    assert_eq!(
        c.poll_log_write(),
        Some(LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel
        })
    );
    assert_eq!(
        c.stage(Xid(1)),
        Some(DrawStage::LoggingVerdict(Verdict::Cancel))
    );
}

/// Begins draw `xid`, delivers Begin, the Tries and the verdict: the Confirms are left in the
/// outbox for the caller.
fn decide_and_hold_confirms(
    c: &mut Coordinator,
    s: &mut MemoryStore,
    log: &mut CoordLog,
    xid: u64,
    now: Now,
) {
    let mut d = draw(xid, false);
    d.user = UserId(xid);
    c.start_draw(d, now).unwrap();
    let e = c.poll_log_write().unwrap();
    log.append(&e).unwrap();
    c.handle_log_written(&e, now);
    while let Some((p, m)) = c.poll_send() {
        let r = send(s, p, m.phase, m.draw);
        c.handle_reply(p, &r, now);
    }
    let e = c.poll_log_write().unwrap();
    log.append(&e).unwrap();
    c.handle_log_written(&e, now);
}

/// Runs the coordinator's timers until it has a message to send; returns the time.
fn run_until_sent(c: &mut Coordinator, mut t: Now) -> Now {
    for _ in 0..100 {
        t = Now::both(c.poll_timeout().expect("a timer").max(t.mono_ms));
        c.handle_timeout(t);
        c.check_invariants().unwrap();
        if c.armed().next().is_some() {
            return t;
        }
    }
    panic!("nothing was sent");
}

/// Runs the coordinator's timers until `stop` holds for an event, dropping every message;
/// returns the time and the last batch of messages sent.
fn drop_all_until(
    c: &mut Coordinator,
    mut t: Now,
    stop: impl Fn(&DrawOutcome) -> bool,
) -> (Now, Vec<(Participant, ParticipantMsg)>, DrawEvent) {
    let mut last = Vec::new();
    for _ in 0..100 {
        let batch: Vec<_> = std::iter::from_fn(|| c.poll_send()).collect();
        if !batch.is_empty() {
            last = batch;
        }
        if let Some(event) = c.poll_event()
            && stop(&event.outcome)
        {
            return (t, last, event);
        }
        c.check_invariants().unwrap();
        let deadline = c
            .poll_timeout()
            .expect("a timer while the draw is in flight");
        t = Now::both(deadline.max(t.mono_ms));
        c.handle_timeout(t);
    }
    panic!("no such event");
}

#[test]
fn compensation_parks_an_undelivered_verdict_and_a_later_round_completes_it() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 1), CoordLog::default());
    let now = Now::both(0);
    decide_and_hold_confirms(&mut c, &mut s, &mut log, 1, now);
    let (t, last_confirms, parked) =
        drop_all_until(&mut c, now, |o| matches!(o, DrawOutcome::Parked { .. }));
    assert_eq!(
        parked.outcome,
        DrawOutcome::Parked {
            verdict: Verdict::Confirm
        }
    );
    assert_eq!(c.parked().collect::<Vec<_>>(), vec![Xid(1)]);
    assert_eq!(c.inflight(), 1, "a parked draw still counts");
    assert!(
        c.poll_timeout()
            .is_some_and(|at| at > t.mono_ms && at <= t.mono_ms + config().park_delay_ms),
        "the compensation schedule's wakeup is the only timer"
    );
    c.check_invariants().unwrap();
    // A late acknowledgement of the last attempt still counts.
    assert_eq!(
        last_confirms.len(),
        2,
        "the last attempt went to both branches"
    );
    let (p, m) = last_confirms[0];
    let r = send(&mut s, p, m.phase, m.draw);
    c.handle_reply(p, &r, t);
    // The round comes due `park_delay_ms` after the park (the wheel may wake earlier to
    // cascade): only the unacknowledged branch is resent.
    let round = run_until_sent(&mut c, t);
    assert_eq!(round.mono_ms, t.mono_ms + config().park_delay_ms);
    assert_eq!(
        c.stage(Xid(1)),
        Some(DrawStage::Finishing(Verdict::Confirm))
    );
    c.check_invariants().unwrap();
    let resent: Vec<_> = std::iter::from_fn(|| c.poll_send()).collect();
    assert_eq!(resent.len(), 1);
    assert_ne!(resent[0].0, p);
    for (p, m) in resent {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, round);
    }
    let events = pump(&mut c, &mut s, &mut log, round);
    assert_eq!(
        events,
        vec![DrawEvent {
            draw: draw(1, false),
            outcome: DrawOutcome::Confirmed { won: false }
        }]
    );
    assert_eq!(c.poll_timeout(), None, "the compensation task is released");
    c.check_invariants().unwrap();
    invariants::settled(s.ledger()).unwrap();
}

#[test]
fn compensation_dead_letters_after_its_budget_and_an_operator_retry_completes_the_draw() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 1), CoordLog::default());
    let now = Now::both(0);
    decide_and_hold_confirms(&mut c, &mut s, &mut log, 1, now);
    let (parked_at, _, _) =
        drop_all_until(&mut c, now, |o| matches!(o, DrawOutcome::Parked { .. }));
    let rounds_before = |c: &Coordinator| c.stage(Xid(1));
    assert_eq!(rounds_before(&c), Some(DrawStage::Parked(Verdict::Confirm)));
    let (dead_at, _, dead) = drop_all_until(&mut c, parked_at, |o| {
        matches!(o, DrawOutcome::DeadLettered { .. })
    });
    assert_eq!(
        dead.outcome,
        DrawOutcome::DeadLettered {
            verdict: Verdict::Confirm
        }
    );
    // 1 + compensation_retries_max rounds of attempts_max attempts each, with the wheel's
    // backoff between rounds: 1,000 ms park delay, then 500 and 1,000 ms.
    let round_ms = 100 + 200 + 400 + 400;
    assert_eq!(
        dead_at.mono_ms,
        parked_at.mono_ms + 1_000 + round_ms + 500 + round_ms + 1_000 + round_ms
    );
    assert_eq!(
        c.dead_letters().collect::<Vec<_>>(),
        vec![(c.draw(Xid(1)).unwrap(), Verdict::Confirm)]
    );
    assert_eq!(
        c.poll_timeout(),
        None,
        "a dead letter waits for an operator"
    );
    assert_eq!(c.inflight(), 1);
    c.check_invariants().unwrap();
    // The operator retries it; this time the network delivers.
    c.handle_retry_dead_letter(Xid(1), dead_at).unwrap();
    assert_eq!(c.stage(Xid(1)), Some(DrawStage::Parked(Verdict::Confirm)));
    c.handle_timeout(dead_at);
    let events = pump(&mut c, &mut s, &mut log, dead_at);
    assert_eq!(
        events.last().map(|e| &e.outcome),
        Some(&DrawOutcome::Confirmed { won: false })
    );
    assert_eq!(c.inflight(), 0);
    assert_eq!(c.poll_timeout(), None);
    c.check_invariants().unwrap();
    invariants::settled(s.ledger()).unwrap();
}

#[test]
fn a_late_acknowledgement_completes_a_dead_lettered_draw() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 1), CoordLog::default());
    let now = Now::both(0);
    decide_and_hold_confirms(&mut c, &mut s, &mut log, 1, now);
    let (t, last, _) = drop_all_until(&mut c, now, |o| {
        matches!(o, DrawOutcome::DeadLettered { .. })
    });
    for (p, m) in last {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, t);
    }
    let events = pump(&mut c, &mut s, &mut log, t);
    assert_eq!(
        events.last().map(|e| &e.outcome),
        Some(&DrawOutcome::Confirmed { won: false })
    );
    assert_eq!(c.dead_letters().count(), 0);
    c.check_invariants().unwrap();
}

#[test]
fn among_rounds_due_together_a_cancel_goes_first() {
    let mut c = Coordinator::new(config()).unwrap();
    let (mut s, mut log) = (store(100, 0), CoordLog::default());
    let now = Now::both(0);
    // Draw 1 confirms (a losing draw needs no stock); draw 2 wins with no stock: cancelled.
    decide_and_hold_confirms(&mut c, &mut s, &mut log, 1, now);
    let mut d2 = draw(2, true);
    d2.user = UserId(2);
    c.start_draw(d2, now).unwrap();
    let e = c.poll_log_write().unwrap();
    log.append(&e).unwrap();
    c.handle_log_written(&e, now);
    let tries: Vec<_> = std::iter::from_fn(|| c.poll_send())
        .filter(|(_, m)| m.phase == Phase::Try)
        .collect();
    for (p, m) in tries {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, now);
    }
    let e = c.poll_log_write().unwrap();
    log.append(&e).unwrap();
    c.handle_log_written(&e, now);
    assert_eq!(c.stage(Xid(2)), Some(DrawStage::Finishing(Verdict::Cancel)));
    // Both verdicts are lost until both draws are parked, in the same tick.
    let mut t = now;
    while c.parked().count() < 2 {
        let _ = std::iter::from_fn(|| c.poll_send()).count();
        t = Now::both(c.poll_timeout().unwrap());
        c.handle_timeout(t);
    }
    let _ = std::iter::from_fn(|| c.poll_send()).count();
    run_until_sent(&mut c, t);
    let first = c.poll_send().unwrap().1;
    assert_eq!(
        first.phase,
        Phase::Cancel,
        "the Cancel round's messages go out first"
    );
}
#[test]
fn recovery_cancels_undecided_draws_and_finishes_decided_ones() {
    let (mut s, mut log) = (store(100, 2), CoordLog::default());
    let now = Now::both(0);
    // Draw 1: Tries landed, crash before the verdict was durable.
    let d1 = draw(1, true);
    log.append(&LogEntry::Begin(d1)).unwrap();
    for p in d1.branches() {
        let _ = send(&mut s, p, Phase::Try, d1);
    }
    // Draw 2: decided Confirm, one Confirm delivered, then the crash.
    let mut d2 = draw(2, true);
    d2.user = UserId(2);
    log.append(&LogEntry::Begin(d2)).unwrap();
    for p in d2.branches() {
        let _ = send(&mut s, p, Phase::Try, d2);
    }
    log.append(&LogEntry::Decided {
        xid: Xid(2),
        verdict: Verdict::Confirm,
    })
    .unwrap();
    let _ = send(&mut s, Participant::Wallet, Phase::Confirm, d2);

    let mut c = Coordinator::recover(config(), &log, now).unwrap();
    assert_eq!(
        c.stage(Xid(1)),
        Some(DrawStage::LoggingVerdict(Verdict::Cancel))
    );
    assert_eq!(
        c.stage(Xid(2)),
        Some(DrawStage::Finishing(Verdict::Confirm))
    );
    assert_eq!(
        c.draws().collect::<Vec<_>>(),
        vec![
            (Xid(1), DrawStage::LoggingVerdict(Verdict::Cancel)),
            (Xid(2), DrawStage::Finishing(Verdict::Confirm)),
        ]
    );
    let sends: Vec<_> = std::iter::from_fn(|| c.poll_send()).collect();
    assert!(
        sends
            .iter()
            .all(|(_, m)| m.draw.xid == Xid(2) && m.phase == Phase::Confirm),
        "{sends:?}"
    );
    assert_eq!(sends.len(), 3);
    for (p, m) in sends {
        let r = send(&mut s, p, m.phase, m.draw);
        c.handle_reply(p, &r, now);
    }
    let mut events = pump(&mut c, &mut s, &mut log, now);
    events.sort_by_key(|e| e.draw.xid);
    assert_eq!(
        events[0].outcome,
        DrawOutcome::Cancelled {
            reason: CancelReason::Recovered
        }
    );
    assert_eq!(events[1].outcome, DrawOutcome::Confirmed { won: true });
    assert!(log.is_empty());
    let l = s.ledger();
    assert_eq!(l.accounts[&UserId(1)].balance_minor, 100);
    assert_eq!(l.accounts[&UserId(2)].balance_minor, 90);
    assert_eq!(l.stock[&ActivityId(1)].issued, 1);
    invariants::settled(l).unwrap();
}
