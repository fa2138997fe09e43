//! The documented flaws are real: each breaks an invariant in a crafted interleaving, and the
//! same interleaving on the correct path keeps every invariant.

use super::super::invariants::{self, LotteryViolation, Unsettled};
use super::super::{
    ActivityId, DrawArgs, Effect, FenceMode, Flaws, Handled, LotteryStore, MemoryStore,
    Participant, ParticipantConfig, ParticipantMsg, ParticipantReply, Phase, Refusal, Resume,
    UserId, Xid,
};

fn store() -> MemoryStore {
    let mut s = MemoryStore::new();
    s.open_account(UserId(1), 100).unwrap();
    s.open_account(UserId(2), 100).unwrap();
    s.add_stock(ActivityId(1), 1).unwrap();
    s
}

/// Activities 1 and 2, at 10 (the price of every draw here).
fn registry() -> super::super::Registry {
    super::super::Registry::from_entries(
        [1, 2].map(|a| (ActivityId(a), super::super::Terms::always_open(10, 100))),
    )
    .unwrap()
}

fn cfg(flaws: Flaws) -> ParticipantConfig {
    ParticipantConfig { flaws }
}

fn d(xid: u64, user: u64, activity: u64, won: bool) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(user),
        activity: ActivityId(activity),
        price_minor: 10,
        won,
    }
}

/// One step; a two-step operation comes back as `Err(resume)`.
fn step(
    s: &mut MemoryStore,
    c: &ParticipantConfig,
    p: Participant,
    phase: Phase,
    draw: DrawArgs,
) -> Result<ParticipantReply, Resume> {
    match p.handle(s, c, &registry(), &ParticipantMsg { phase, draw }) {
        Handled::Reply(r) => Ok(r),
        Handled::Resume(r) => Err(r),
    }
}

/// Runs a message to completion (both halves back to back).
fn full(
    s: &mut MemoryStore,
    c: &ParticipantConfig,
    p: Participant,
    phase: Phase,
    draw: DrawArgs,
) -> ParticipantReply {
    step(s, c, p, phase, draw).unwrap_or_else(|r| p.handle_resume(s, c, &r))
}

/// Unfenced, a Cancel that overtakes its Try "undoes" another draw's freeze, and the late Try
/// then hangs.
fn empty_rollback_then_late_try(flaws: Flaws) -> (Vec<ParticipantReply>, MemoryStore) {
    let c = cfg(flaws);
    let mut s = store();
    let mut h = Vec::new();
    let (d1, d2) = (d(1, 1, 1, false), d(2, 1, 2, false));
    h.push(full(&mut s, &c, Participant::Wallet, Phase::Try, d1));
    h.push(full(&mut s, &c, Participant::Wallet, Phase::Cancel, d2)); // overtakes d2's Try
    h.push(full(&mut s, &c, Participant::Wallet, Phase::Try, d2)); // the late Try
    (h, s)
}

#[test]
fn unfenced_allows_empty_rollback_and_hanging_try() {
    let (h, s) = empty_rollback_then_late_try(Flaws::NONE);
    invariants::no_hanging(&h).unwrap();
    assert_eq!(h[1].outcome, Ok(Effect::EmptyRollback));
    assert_eq!(
        s.ledger().accounts[&UserId(1)].frozen_minor,
        10,
        "only draw 1 is frozen"
    );

    let flawed = Flaws {
        fence: FenceMode::Unfenced,
        ..Flaws::NONE
    };
    let (h, _) = empty_rollback_then_late_try(flawed);
    assert_eq!(
        h[1].outcome,
        Ok(Effect::Applied),
        "the empty rollback undid draw 1's freeze"
    );
    assert_eq!(
        invariants::no_hanging(&h),
        Err(LotteryViolation::Hanging {
            xid: Xid(2),
            branch: Participant::Wallet,
            cancel_index: 1,
            try_index: 2
        })
    );
}

/// Unfenced, a duplicated Confirm collects twice; the other draw's Cancel then cannot unfreeze.
fn double_confirm(flaws: Flaws) -> MemoryStore {
    let c = cfg(flaws);
    let mut s = store();
    let (d1, d2) = (d(1, 1, 1, false), d(2, 1, 2, false));
    for draw in [d1, d2] {
        for p in draw.branches() {
            assert_eq!(
                full(&mut s, &c, p, Phase::Try, draw).outcome,
                Ok(Effect::Applied)
            );
        }
    }
    for _ in 0..2 {
        for p in d1.branches() {
            let _ = full(&mut s, &c, p, Phase::Confirm, d1);
        }
    }
    for p in d2.branches() {
        let _ = full(&mut s, &c, p, Phase::Cancel, d2);
    }
    s
}

#[test]
fn unfenced_allows_double_confirm() {
    let s = double_confirm(Flaws::NONE);
    invariants::settled(s.ledger()).unwrap();
    assert_eq!(s.ledger().accounts[&UserId(1)].balance_minor, 90);

    let s = double_confirm(Flaws {
        fence: FenceMode::Unfenced,
        ..Flaws::NONE
    });
    assert_eq!(
        invariants::settled(s.ledger()),
        Err(LotteryViolation::Unsettled(Unsettled::CollectedMismatch {
            collected_minor: 20,
            confirmed_minor: 10
        }))
    );
    assert_eq!(
        s.ledger().accounts[&UserId(1)].balance_minor,
        80,
        "the user paid for a cancelled draw"
    );
}

#[test]
fn check_then_act_fence_lets_a_paused_try_hang() {
    let d1 = d(1, 1, 1, false);
    // Correct: the Try is one atomic step, so the Cancel is either before it (the Try is then
    // fenced) or after it (a real rollback).
    let c = cfg(Flaws::NONE);
    let mut s = store();
    let cancel = full(&mut s, &c, Participant::Wallet, Phase::Cancel, d1);
    let late = full(&mut s, &c, Participant::Wallet, Phase::Try, d1);
    assert_eq!(
        late.outcome,
        Err(Refusal::TryFenced {
            existing: super::super::FenceStatus::Suspended
        })
    );
    invariants::no_hanging(&[cancel, late]).unwrap();

    // Flawed: the Try checks (no row), pauses; the Cancel runs (empty rollback, `suspended`);
    // the Try resumes and acts on its stale check.
    let c = cfg(Flaws {
        fence: FenceMode::CheckThenAct,
        ..Flaws::NONE
    });
    let mut s = store();
    let paused = step(&mut s, &c, Participant::Wallet, Phase::Try, d1).expect_err("two steps");
    let cancel = full(&mut s, &c, Participant::Wallet, Phase::Cancel, d1);
    assert_eq!(cancel.outcome, Ok(Effect::EmptyRollback));
    let late = Participant::Wallet.handle_resume(&mut s, &c, &paused);
    assert_eq!(late.outcome, Ok(Effect::Applied));
    assert!(matches!(
        invariants::no_hanging(&[cancel, late]),
        Err(LotteryViolation::Hanging { .. })
    ));
    assert_eq!(
        invariants::settled(s.ledger()),
        Err(LotteryViolation::Unsettled(Unsettled::FenceTried {
            xid: Xid(1),
            branch: Participant::Wallet
        }))
    );
}

#[test]
fn two_step_stock_over_issues() {
    let (d1, d2) = (d(1, 1, 1, true), d(2, 2, 1, true));
    // Correct: the second reservation of the last unit is refused.
    let c = cfg(Flaws::NONE);
    let mut s = store();
    assert_eq!(
        full(&mut s, &c, Participant::Inventory, Phase::Try, d1).outcome,
        Ok(Effect::Applied)
    );
    assert_eq!(
        full(&mut s, &c, Participant::Inventory, Phase::Try, d2).outcome,
        Err(Refusal::OutOfStock {
            activity: ActivityId(1)
        })
    );
    invariants::no_over_issue(s.ledger()).unwrap();

    // Flawed: both check (1 left), then both write "1 - 1".
    let c = cfg(Flaws {
        two_step_stock: true,
        ..Flaws::NONE
    });
    let mut s = store();
    let r1 = step(&mut s, &c, Participant::Inventory, Phase::Try, d1).expect_err("two steps");
    let r2 = step(&mut s, &c, Participant::Inventory, Phase::Try, d2).expect_err("two steps");
    for r in [r1, r2] {
        assert_eq!(
            Participant::Inventory.handle_resume(&mut s, &c, &r).outcome,
            Ok(Effect::Applied)
        );
    }
    assert!(matches!(
        invariants::no_over_issue(s.ledger()),
        Err(LotteryViolation::StockMismatch { .. })
    ));
    for draw in [d1, d2] {
        assert_eq!(
            full(&mut s, &c, Participant::Inventory, Phase::Confirm, draw).outcome,
            Ok(Effect::Applied)
        );
    }
    assert_eq!(
        invariants::no_over_issue(s.ledger()),
        Err(LotteryViolation::OverIssue {
            activity: ActivityId(1),
            total: 1,
            issued: 2
        })
    );
}

/// With the price from the request, a Try at 0 freezes nothing and the draw confirms: a prize for
/// nothing, which only `lottery.paid` names. On the correct path the wallet and the
/// participation log refuse the Try.
#[test]
fn client_price_lets_a_draw_pay_nothing() {
    let free = DrawArgs {
        price_minor: 0,
        ..d(1, 1, 1, true)
    };
    let run = |flaws: Flaws| {
        let c = cfg(flaws);
        let mut s = store();
        let tries: Vec<ParticipantReply> = free
            .branches()
            .map(|p| full(&mut s, &c, p, Phase::Try, free))
            .collect();
        (tries, s)
    };
    let (tries, s) = run(Flaws::NONE);
    for branch in [Participant::Wallet, Participant::Participation] {
        let reply = tries.iter().find(|r| r.branch == branch).unwrap();
        assert_eq!(
            reply.outcome,
            Err(Refusal::WrongPrice {
                activity: ActivityId(1),
                price_minor: 10,
                offered_minor: 0
            })
        );
    }
    assert!(
        s.ledger().participations.is_empty(),
        "a refusal changes nothing"
    );

    let (tries, mut s) = run(Flaws {
        client_price: true,
        ..Flaws::NONE
    });
    assert!(tries.iter().all(|r| r.outcome == Ok(Effect::Applied)));
    let c = cfg(Flaws {
        client_price: true,
        ..Flaws::NONE
    });
    for p in free.branches() {
        assert_eq!(
            full(&mut s, &c, p, Phase::Confirm, free).outcome,
            Ok(Effect::Applied)
        );
    }
    let ledger = s.ledger().clone();
    invariants::conservation(&ledger).unwrap();
    invariants::no_over_issue(&ledger).unwrap();
    assert!(matches!(
        invariants::paid(&ledger, &registry()),
        Err(LotteryViolation::Unpaid { paid_minor: 0, .. })
    ));
}
