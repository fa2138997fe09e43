//! Every classic TCC anomaly, through the participant message handler, on both stores.

use sut::lottery::{
    ActivityId, Effect, FenceStatus, Ledger, LotteryStore, MemoryStore, Participant, Phase,
    Refusal, UserId, Xid, invariants,
};
use sut::testkit::lottery::{draw, send};

use super::SqliteLotteryStore;

fn setup<S: LotteryStore>(mut s: S) -> S {
    s.open_account(UserId(1), 100).unwrap();
    s.add_stock(ActivityId(1), 1).unwrap();
    s
}

fn sqlite() -> (tempfile::TempDir, SqliteLotteryStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteLotteryStore::open(dir.path().join("fence.db")).unwrap();
    (dir, s)
}

fn each_store(f: impl Fn(&mut dyn LotteryStore)) {
    let mut m = setup(MemoryStore::new());
    f(&mut m);
    let (_dir, s) = sqlite();
    let mut s = setup(s);
    f(&mut s);
}

fn ledger(s: &mut dyn LotteryStore) -> Ledger {
    s.snapshot().unwrap()
}

#[test]
fn duplicate_confirm_is_an_idempotent_no_op() {
    each_store(|s| {
        let d = draw(1, true);
        for p in d.branches() {
            assert_eq!(send(s, p, Phase::Try, d).outcome, Ok(Effect::Applied));
        }
        for p in d.branches() {
            assert_eq!(send(s, p, Phase::Confirm, d).outcome, Ok(Effect::Applied));
        }
        let once = ledger(s);
        for p in d.branches() {
            assert_eq!(
                send(s, p, Phase::Confirm, d).outcome,
                Ok(Effect::AlreadyDone)
            );
        }
        let l = ledger(s);
        assert_eq!(l, once, "a repeated Confirm changes nothing");
        assert_eq!(l.collected_minor, 10, "collected once");
        assert_eq!(l.stock[&ActivityId(1)].issued, 1, "issued once");
        invariants::settled(&l).unwrap();
    });
}

#[test]
fn duplicate_cancel_is_an_idempotent_no_op() {
    each_store(|s| {
        let d = draw(1, true);
        for p in d.branches() {
            assert_eq!(send(s, p, Phase::Try, d).outcome, Ok(Effect::Applied));
        }
        for p in d.branches() {
            assert_eq!(send(s, p, Phase::Cancel, d).outcome, Ok(Effect::Applied));
        }
        let once = ledger(s);
        for p in d.branches() {
            assert_eq!(
                send(s, p, Phase::Cancel, d).outcome,
                Ok(Effect::AlreadyDone)
            );
        }
        let l = ledger(s);
        assert_eq!(l, once);
        assert_eq!(
            l.accounts[&UserId(1)].balance_minor,
            100,
            "unfrozen exactly once"
        );
        assert_eq!(
            l.stock[&ActivityId(1)].available,
            1,
            "returned exactly once"
        );
        invariants::settled(&l).unwrap();
    });
}

#[test]
fn empty_rollback_records_suspended_and_changes_no_business_row() {
    each_store(|s| {
        let d = draw(1, true);
        let before = ledger(s);
        for p in d.branches() {
            assert_eq!(
                send(s, p, Phase::Cancel, d).outcome,
                Ok(Effect::EmptyRollback)
            );
        }
        let l = ledger(s);
        assert_eq!(l.accounts, before.accounts);
        assert_eq!(l.stock, before.stock);
        assert_eq!(l.participations, before.participations);
        for p in d.branches() {
            assert_eq!(l.fences[&(Xid(1), p)], FenceStatus::Suspended);
        }
        // And a repeat of the empty rollback is a no-op.
        assert_eq!(
            send(s, Participant::Wallet, Phase::Cancel, d).outcome,
            Ok(Effect::AlreadyDone)
        );
    });
}

#[test]
fn hanging_try_after_empty_rollback_is_blocked() {
    each_store(|s| {
        let d = draw(1, true);
        let mut history = Vec::new();
        for p in d.branches() {
            history.push(send(s, p, Phase::Cancel, d));
        }
        for p in d.branches() {
            let r = send(s, p, Phase::Try, d);
            assert_eq!(
                r.outcome,
                Err(Refusal::TryFenced {
                    existing: FenceStatus::Suspended
                })
            );
            history.push(r);
        }
        let l = ledger(s);
        assert_eq!(
            l.accounts[&UserId(1)].frozen_minor,
            0,
            "nothing frozen by the late Try"
        );
        assert_eq!(l.stock[&ActivityId(1)].reserved, 0);
        assert!(l.participations.is_empty());
        invariants::no_hanging(&history).unwrap();
        invariants::settled(&l).unwrap();
    });
}

#[test]
fn try_after_rollback_and_duplicate_try_are_refused() {
    each_store(|s| {
        let d = draw(1, false);
        assert_eq!(
            send(s, Participant::Wallet, Phase::Try, d).outcome,
            Ok(Effect::Applied)
        );
        assert_eq!(
            send(s, Participant::Wallet, Phase::Try, d).outcome,
            Err(Refusal::TryFenced {
                existing: FenceStatus::Tried
            }),
            "a duplicate Try does not freeze twice"
        );
        assert_eq!(ledger(s).accounts[&UserId(1)].frozen_minor, 10);
        assert_eq!(
            send(s, Participant::Wallet, Phase::Cancel, d).outcome,
            Ok(Effect::Applied)
        );
        assert_eq!(
            send(s, Participant::Wallet, Phase::Try, d).outcome,
            Err(Refusal::TryFenced {
                existing: FenceStatus::Rollbacked
            })
        );
        assert_eq!(ledger(s).accounts[&UserId(1)].frozen_minor, 0);
    });
}

#[test]
fn confirm_after_cancel_is_refused_and_cancel_after_confirm_too() {
    each_store(|s| {
        let d = draw(1, true);
        for p in d.branches() {
            let _ = send(s, p, Phase::Try, d);
            assert_eq!(send(s, p, Phase::Cancel, d).outcome, Ok(Effect::Applied));
            assert_eq!(
                send(s, p, Phase::Confirm, d).outcome,
                Err(Refusal::ConfirmAfterCancel {
                    existing: FenceStatus::Rollbacked
                })
            );
        }
        let l = ledger(s);
        assert_eq!(l.collected_minor, 0);
        assert_eq!(l.stock[&ActivityId(1)].issued, 0);
        // After an empty rollback too.
        let e = draw(2, false);
        let _ = send(s, Participant::Wallet, Phase::Cancel, e);
        assert_eq!(
            send(s, Participant::Wallet, Phase::Confirm, e).outcome,
            Err(Refusal::ConfirmAfterCancel {
                existing: FenceStatus::Suspended
            })
        );
        // Cancel after Confirm.
        let f = draw(3, false);
        for p in f.branches() {
            let _ = send(s, p, Phase::Try, f);
            assert_eq!(send(s, p, Phase::Confirm, f).outcome, Ok(Effect::Applied));
            assert_eq!(
                send(s, p, Phase::Cancel, f).outcome,
                Err(Refusal::CancelAfterConfirm)
            );
        }
        assert_eq!(ledger(s).collected_minor, 10);
    });
}

#[test]
fn confirm_without_try_is_an_error() {
    each_store(|s| {
        let d = draw(1, true);
        for p in d.branches() {
            assert_eq!(
                send(s, p, Phase::Confirm, d).outcome,
                Err(Refusal::ConfirmWithoutTry)
            );
        }
        assert!(
            ledger(s).fences.is_empty(),
            "a refused Confirm writes no fence row"
        );
    });
}

#[test]
fn business_refusals_leave_no_fence_row_so_a_later_cancel_is_an_empty_rollback() {
    each_store(|s| {
        // Out of stock: the only unit goes to draw 1.
        let d1 = draw(1, true);
        assert_eq!(
            send(s, Participant::Inventory, Phase::Try, d1).outcome,
            Ok(Effect::Applied)
        );
        let mut d2 = draw(2, true);
        d2.user = UserId(2);
        assert_eq!(
            send(s, Participant::Inventory, Phase::Try, d2).outcome,
            Err(Refusal::OutOfStock {
                activity: ActivityId(1)
            })
        );
        assert_eq!(
            send(s, Participant::Inventory, Phase::Cancel, d2).outcome,
            Ok(Effect::EmptyRollback)
        );
        // Unknown account, then already participated.
        assert_eq!(
            send(s, Participant::Wallet, Phase::Try, d2).outcome,
            Err(Refusal::UnknownAccount { user: UserId(2) })
        );
        assert_eq!(
            send(s, Participant::Participation, Phase::Try, d1).outcome,
            Ok(Effect::Applied)
        );
        let d3 = draw(3, false);
        assert_eq!(
            send(s, Participant::Participation, Phase::Try, d3).outcome,
            Err(Refusal::AlreadyParticipated {
                user: UserId(1),
                activity: ActivityId(1),
                holder: Xid(1)
            })
        );
        // Insufficient balance: user 3 has less than the ticket's price.
        s.open_account(UserId(3), 5).unwrap();
        let mut rich = draw(4, false);
        rich.user = UserId(3);
        assert!(matches!(
            send(s, Participant::Wallet, Phase::Try, rich).outcome,
            Err(Refusal::InsufficientBalance { .. })
        ));
        let l = ledger(s);
        assert!(!l.fences.contains_key(&(Xid(4), Participant::Wallet)));
        invariants::conservation(&l).unwrap();
        invariants::no_over_issue(&l).unwrap();
    });
}
