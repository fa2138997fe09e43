//! Every `lottery.*` checker fires on a crafted bad ledger or history and passes on a good one.

use super::super::invariants::{self, LotteryViolation, Unsettled};
use super::super::{
    Account, ActivityId, CancelReason, DrawEvent, DrawOutcome, Effect, FenceStatus, Ledger,
    LogEntry, Participant, ParticipantReply, ParticipationRow, Phase, Refusal, Stock, UserId, Xid,
};
use super::draw;

fn reply(
    xid: u64,
    branch: Participant,
    phase: Phase,
    outcome: Result<Effect, Refusal>,
) -> ParticipantReply {
    ParticipantReply {
        branch,
        phase,
        draw: draw(xid, true),
        outcome,
    }
}

/// A settled ledger: one confirmed winning draw (price 10) out of 100 minted, 2 units stocked.
fn good_ledger() -> Ledger {
    let mut l = Ledger::default();
    l.open_account(UserId(1), 100).unwrap();
    l.add_stock(ActivityId(1), 2).unwrap();
    let a = l.accounts.get_mut(&UserId(1)).unwrap();
    a.balance_minor = 90;
    l.collected_minor = 10;
    let s = l.stock.get_mut(&ActivityId(1)).unwrap();
    s.available = 1;
    s.issued = 1;
    l.participations.insert(
        (UserId(1), ActivityId(1)),
        ParticipationRow {
            xid: Xid(1),
            price_minor: 10,
            won: true,
            confirmed: true,
        },
    );
    for p in Participant::ALL {
        l.fences.insert((Xid(1), p), FenceStatus::Committed);
    }
    l
}

#[test]
fn the_good_ledger_passes_everything() {
    let l = good_ledger();
    invariants::conservation(&l).unwrap();
    invariants::no_over_issue(&l).unwrap();
    invariants::settled(&l).unwrap();
}

fn registry(price_minor: u64) -> super::super::Registry {
    super::super::Registry::from_entries([(
        ActivityId(1),
        super::super::Terms::always_open(price_minor, 100),
    )])
    .unwrap()
}

#[test]
fn paid_passes_a_draw_at_the_registered_price() {
    invariants::paid(&good_ledger(), &registry(10)).unwrap();
}

#[test]
fn paid_fires_on_a_prize_won_for_nothing() {
    // What a client that names its own price gets: a confirmed winning draw at 0. Every sum
    // adds up (conservation, settled), only `lottery.paid` says the business lost a prize.
    let mut l = good_ledger();
    l.collected_minor = 0;
    l.accounts.get_mut(&UserId(1)).unwrap().balance_minor = 100;
    l.participations
        .get_mut(&(UserId(1), ActivityId(1)))
        .unwrap()
        .price_minor = 0;
    invariants::conservation(&l).unwrap();
    invariants::settled(&l).unwrap();
    let v = invariants::paid(&l, &registry(10)).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::Unpaid {
            xid: Xid(1),
            user: UserId(1),
            activity: ActivityId(1),
            paid_minor: 0,
            price_minor: Some(10)
        }
    );
    assert_eq!(v.invariant(), "lottery.paid");
    // An activity nobody registered is paid for by nobody.
    let v = invariants::paid(&good_ledger(), &super::super::Registry::new()).unwrap_err();
    assert!(v.to_string().contains("not registered"), "{v}");
}

#[test]
fn paid_fires_on_a_prize_without_a_paying_draw() {
    // A pending winning draw at the wrong price holds no confirmed row yet, but the prize was
    // already issued for it.
    let mut l = good_ledger();
    l.participations
        .get_mut(&(UserId(1), ActivityId(1)))
        .unwrap()
        .confirmed = false;
    invariants::paid(&l, &registry(10)).unwrap();
    let v = invariants::paid(&l, &registry(11)).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::PrizeNotPaidFor {
            activity: ActivityId(1),
            issued: 1,
            paid_wins: 0
        }
    );
}

#[test]
fn conservation_fires_on_created_money() {
    let mut l = good_ledger();
    l.accounts.get_mut(&UserId(1)).unwrap().balance_minor += 1;
    let v = invariants::conservation(&l).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::Conservation {
            minted_minor: 100,
            held_minor: 101
        }
    );
    assert_eq!(v.invariant(), "lottery.conservation");
}

#[test]
fn no_over_issue_fires_on_over_issue_and_on_lost_units() {
    let mut l = good_ledger();
    l.stock.insert(
        ActivityId(2),
        Stock {
            total: 1,
            available: 0,
            reserved: 0,
            issued: 2,
        },
    );
    let v = invariants::no_over_issue(&l).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::OverIssue {
            activity: ActivityId(2),
            total: 1,
            issued: 2
        }
    );
    assert_eq!(v.invariant(), "lottery.no_over_issue");
    let mut l = good_ledger();
    let bad = Stock {
        total: 1,
        available: 0,
        reserved: 2,
        issued: 0,
    };
    l.stock.insert(ActivityId(3), bad);
    assert_eq!(
        invariants::no_over_issue(&l),
        Err(LotteryViolation::StockMismatch {
            activity: ActivityId(3),
            stock: bad
        })
    );
}

#[test]
fn no_hanging_fires_when_a_try_takes_effect_after_its_cancel() {
    let good = vec![
        reply(
            1,
            Participant::Wallet,
            Phase::Cancel,
            Ok(Effect::EmptyRollback),
        ),
        reply(
            1,
            Participant::Wallet,
            Phase::Try,
            Err(Refusal::TryFenced {
                existing: FenceStatus::Suspended,
            }),
        ),
        // Another branch of the same draw, and another draw, are independent.
        reply(1, Participant::Inventory, Phase::Try, Ok(Effect::Applied)),
        reply(2, Participant::Wallet, Phase::Try, Ok(Effect::Applied)),
    ];
    invariants::no_hanging(&good).unwrap();
    let mut bad = good;
    bad.push(reply(
        1,
        Participant::Wallet,
        Phase::Try,
        Ok(Effect::Applied),
    ));
    let v = invariants::no_hanging(&bad).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::Hanging {
            xid: Xid(1),
            branch: Participant::Wallet,
            cancel_index: 0,
            try_index: 4
        }
    );
    assert_eq!(v.invariant(), "lottery.no_hanging");
}

#[test]
fn no_duplicate_participation_fires_on_two_confirmed_draws() {
    let mut history = vec![
        reply(
            1,
            Participant::Participation,
            Phase::Confirm,
            Ok(Effect::Applied),
        ),
        reply(
            1,
            Participant::Participation,
            Phase::Confirm,
            Ok(Effect::AlreadyDone),
        ),
        reply(
            2,
            Participant::Participation,
            Phase::Confirm,
            Err(Refusal::ConfirmWithoutTry),
        ),
        reply(3, Participant::Wallet, Phase::Confirm, Ok(Effect::Applied)),
    ];
    invariants::no_duplicate_participation(&history).unwrap();
    history.push(reply(
        4,
        Participant::Participation,
        Phase::Confirm,
        Ok(Effect::Applied),
    ));
    let v = invariants::no_duplicate_participation(&history).unwrap_err();
    assert_eq!(
        v,
        LotteryViolation::DuplicateParticipation {
            stream: invariants::Stream::Replies,
            user: UserId(1),
            activity: ActivityId(1),
            first: Xid(1),
            second: Xid(4),
            event_index: 4
        }
    );
    assert_eq!(v.invariant(), "lottery.no_duplicate_participation");
    // Numbered by the caller: its event number where it has one, the place in the list where
    // it has none.
    assert_eq!(v.offending(), Some((invariants::Stream::Replies, 4)));
    let numbered =
        v.numbered(&|stream, i| (stream == invariants::Stream::Replies && i == 4).then_some(1_234));
    assert!(numbered.ends_with("(the second at #1234)"), "{numbered}");
    let unnumbered = v.numbered(&|_, _| None);
    assert!(
        unnumbered.contains("reply 4 of the participants' durable logs, never recorded"),
        "{unnumbered}"
    );

    let ev = |xid, outcome| DrawEvent {
        draw: draw(xid, false),
        outcome,
    };
    let mut events = vec![
        ev(1, DrawOutcome::Confirmed { won: false }),
        ev(
            2,
            DrawOutcome::Cancelled {
                reason: CancelReason::Recovered,
            },
        ),
    ];
    invariants::no_duplicate_confirmed_draws(&events).unwrap();
    events.push(ev(3, DrawOutcome::Confirmed { won: false }));
    assert!(matches!(
        invariants::no_duplicate_confirmed_draws(&events),
        Err(LotteryViolation::DuplicateParticipation {
            second: Xid(3),
            event_index: 2,
            ..
        })
    ));
}

#[test]
fn settled_fires_on_each_kind_of_open_end() {
    let unsettled = |l: &Ledger| match invariants::settled(l) {
        Err(LotteryViolation::Unsettled(u)) => u,
        other => panic!("expected unsettled, got {other:?}"),
    };
    let mut l = good_ledger();
    l.coord_log
        .append(&LogEntry::Begin(draw(9, false)))
        .unwrap();
    assert_eq!(unsettled(&l), Unsettled::OpenDraw { xid: Xid(9) });

    let mut l = good_ledger();
    l.fences
        .insert((Xid(9), Participant::Wallet), FenceStatus::Tried);
    assert_eq!(
        unsettled(&l),
        Unsettled::FenceTried {
            xid: Xid(9),
            branch: Participant::Wallet
        }
    );

    let mut l = good_ledger();
    *l.accounts.get_mut(&UserId(1)).unwrap() = Account {
        balance_minor: 80,
        frozen_minor: 10,
    };
    assert_eq!(
        unsettled(&l),
        Unsettled::Frozen {
            user: UserId(1),
            frozen_minor: 10
        }
    );

    let mut l = good_ledger();
    let s = l.stock.get_mut(&ActivityId(1)).unwrap();
    s.available = 0;
    s.reserved = 1;
    assert_eq!(
        unsettled(&l),
        Unsettled::Reserved {
            activity: ActivityId(1),
            reserved: 1
        }
    );

    let mut l = good_ledger();
    l.participations
        .get_mut(&(UserId(1), ActivityId(1)))
        .unwrap()
        .confirmed = false;
    assert_eq!(
        unsettled(&l),
        Unsettled::PendingParticipation {
            user: UserId(1),
            activity: ActivityId(1),
            xid: Xid(1)
        }
    );

    let mut l = good_ledger();
    l.collected_minor = 20;
    l.accounts.get_mut(&UserId(1)).unwrap().balance_minor = 80;
    invariants::conservation(&l).unwrap();
    assert_eq!(
        unsettled(&l),
        Unsettled::CollectedMismatch {
            collected_minor: 20,
            confirmed_minor: 10
        }
    );

    let mut l = good_ledger();
    let s = l.stock.get_mut(&ActivityId(1)).unwrap();
    s.available = 0;
    s.issued = 2;
    invariants::no_over_issue(&l).unwrap();
    assert_eq!(
        unsettled(&l),
        Unsettled::IssuedMismatch {
            activity: ActivityId(1),
            issued: 2,
            confirmed_wins: 1
        }
    );
    assert_eq!(
        invariants::settled(&l).unwrap_err().invariant(),
        "lottery.settled"
    );
}

#[test]
fn answers_agree_fires_on_a_client_told_what_the_draw_did_not_do() {
    use super::super::Verdict;
    use super::super::invariants::ClientReport;
    let ledger = good_ledger();
    let confirmed = DrawEvent {
        draw: draw(1, true),
        outcome: DrawOutcome::Confirmed { won: true },
    };
    let told = |xid, verdict| ClientReport {
        xid: Xid(xid),
        verdict,
    };
    let events = std::slice::from_ref(&confirmed);
    assert_eq!(
        invariants::answers_agree(events, &[told(1, Verdict::Confirm)], &[&ledger]),
        Ok(())
    );
    let against_the_coordinator =
        invariants::answers_agree(events, &[told(1, Verdict::Cancel)], &[&ledger]).unwrap_err();
    assert!(
        matches!(
            against_the_coordinator,
            LotteryViolation::AnswerDisagrees {
                told: "cancelled",
                ..
            }
        ),
        "{against_the_coordinator}"
    );
    let made_up =
        invariants::answers_agree(events, &[told(2, Verdict::Confirm)], &[&ledger]).unwrap_err();
    assert!(made_up.to_string().contains("never reported"), "{made_up}");
    // Parked, then the client is told confirmed while a branch is still only tried.
    let parked = DrawEvent {
        draw: draw(1, true),
        outcome: DrawOutcome::Parked {
            verdict: Verdict::Confirm,
        },
    };
    let mut tried = ledger.clone();
    tried
        .fences
        .insert((Xid(1), Participant::Inventory), FenceStatus::Tried);
    let early = invariants::answers_agree(
        std::slice::from_ref(&parked),
        &[told(1, Verdict::Confirm)],
        &[&tried],
    )
    .unwrap_err();
    assert_eq!(early.invariant(), "lottery.agreement");
    assert!(
        early.to_string().contains("Inventory branch is Tried"),
        "{early}"
    );
}
