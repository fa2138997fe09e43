//! The lottery stores: the SQLite store's random operation sequences (its [`op`] generator and
//! [`apply`], shared) give identical results and snapshots after every step on the memory store
//! and on the server's, and a store reopened on the same database has the same state.
//!
//! And what a shared database adds over SQLite: two stores (two servers) on one database running
//! the same participant operation at the same instant. One of the two transactions is rolled
//! back (PostgreSQL: a serialization failure; InnoDB: a deadlock) and retried, and then sees the
//! other's fence row: each fence row is decided once, and the ledger is the one a single store
//! running every operation in some serial order produces.

use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use sut::lottery::{
    ActivityId, BranchOp, BranchOutcome, DrawArgs, Flaws, LogEntry, LotteryStore, MemoryStore,
    Participant, ParticipantReply, Phase, UserId, Xid, invariants,
};

use super::Backend;
use crate::sqlite::lottery_conformance::{Op, Slots, apply, op};

/// One case of the property: `ops` on a memory store and on the server's store at `url` (an
/// empty database).
fn memory_and_server_agree<B: Backend>(url: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut server = B::lottery(url);
    let mut mem = MemoryStore::new();
    let (mut mem_slots, mut server_slots): (Slots, Slots) = Default::default();
    for (i, op) in ops.iter().enumerate() {
        let m = apply(&mut mem, &mut mem_slots, op);
        let p = apply(&mut server, &mut server_slots, op);
        prop_assert_eq!(&m, &p, "step {} {:?}", i, op);
        prop_assert!(!m.contains("Backend"), "no backend error: {}", m);
        prop_assert_eq!(
            mem.snapshot().unwrap(),
            server.snapshot().unwrap(),
            "snapshot after step {} {:?}",
            i,
            op
        );
        prop_assert_eq!(mem.log_load().unwrap(), server.log_load().unwrap());
    }
    // A store reopened on the same database sees every committed step.
    drop(server);
    let mut reopened = B::lottery(url);
    prop_assert_eq!(mem.snapshot().unwrap(), reopened.snapshot().unwrap());
    Ok(())
}

pub(super) fn stores_agree<B: Backend>() {
    let server = B::start();
    let cases = AtomicUsize::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 24,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        let n = cases.fetch_add(1, Ordering::Relaxed);
        let url = B::database(&server, &format!("lot_case_{n}"));
        memory_and_server_agree::<B>(&url, &ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Ids and amounts at the ends of their ranges survive a reopen (ids are stored as the bit
/// pattern of a `BIGINT`, as in SQLite).
pub(super) fn extreme_ids_survive_reopen<B: Backend>() {
    let server = B::start();
    let url = B::database(&server, "lot_extremes");
    let draw = DrawArgs {
        xid: Xid(u64::MAX - 1),
        user: UserId(u64::MAX),
        activity: ActivityId(u64::MAX),
        price_minor: 10,
        won: true,
    };
    {
        let mut s = B::lottery(&url);
        s.open_account(draw.user, 100).unwrap();
        s.add_stock(draw.activity, 2).unwrap();
        s.log_append(&LogEntry::Begin(draw)).unwrap();
        for branch in draw.branches() {
            let op = BranchOp {
                branch,
                phase: Phase::Try,
                draw,
            };
            assert_eq!(
                s.execute(&op, Flaws::NONE).unwrap(),
                Ok(sut::lottery::Effect::Applied)
            );
        }
    }
    let mut s = B::lottery(&url);
    let ledger = s.snapshot().unwrap();
    assert_eq!(ledger.accounts[&draw.user].balance_minor, 90);
    assert_eq!(ledger.accounts[&draw.user].frozen_minor, 10);
    assert_eq!(ledger.minted_minor, 100);
    assert_eq!(ledger.stock[&draw.activity].reserved, 1);
    assert_eq!(
        ledger.participations[&(draw.user, draw.activity)].xid,
        draw.xid
    );
    assert_eq!(ledger.fences.len(), 3);
    assert!(ledger.coord_log.records.contains_key(&draw.xid));
    assert_eq!(
        s.open_account(draw.user, 1),
        Err(sut::lottery::StoreError::AccountExists { user: draw.user })
    );
}

/// The draws of the concurrency test.
const RACE_XIDS: u64 = 200;
const RACE_ACTIVITY: ActivityId = ActivityId(1);
const RACE_BALANCE: u64 = 100;

/// One step of the concurrency test: what each of the two stores runs, at the same instant.
type Step = [BranchOp; 2];

/// The steps: per draw, both stores send the same Try of every branch, then the same Confirm
/// (or, one draw in three, Cancel) of every branch. One draw in five instead races a Try on
/// one store against a Cancel on the other (the hanging-Try race), then cancels on both.
fn race_plan() -> Vec<Step> {
    let mut steps = Vec::new();
    for x in 0..RACE_XIDS {
        let draw = DrawArgs {
            xid: Xid(x),
            user: UserId(x),
            activity: RACE_ACTIVITY,
            price_minor: 10 + x % 7,
            won: x % 2 == 0,
        };
        let op = |branch, phase| BranchOp {
            branch,
            phase,
            draw,
        };
        let branches: Vec<Participant> = draw.branches().collect();
        if x % 5 == 4 {
            for &b in &branches {
                steps.push([op(b, Phase::Try), op(b, Phase::Cancel)]);
                steps.push([op(b, Phase::Cancel), op(b, Phase::Cancel)]);
            }
        } else {
            let verdict = if x % 3 == 0 {
                Phase::Cancel
            } else {
                Phase::Confirm
            };
            for &b in &branches {
                steps.push([op(b, Phase::Try), op(b, Phase::Try)]);
            }
            for &b in &branches {
                steps.push([op(b, verdict), op(b, verdict)]);
            }
        }
    }
    steps
}

fn setup(store: &mut dyn LotteryStore) {
    for x in 0..RACE_XIDS {
        store.open_account(UserId(x), RACE_BALANCE).unwrap();
    }
    store.add_stock(RACE_ACTIVITY, RACE_XIDS).unwrap();
}

fn reply(op: &BranchOp, outcome: &BranchOutcome) -> ParticipantReply {
    ParticipantReply {
        branch: op.branch,
        phase: op.phase,
        draw: op.draw,
        outcome: outcome.clone(),
    }
}

/// Two stores on one database run the same branch operation at the same instant (a barrier
/// before every step), 200 draws. Each pair of outcomes must be what one store running the two
/// operations one after the other gives (in one order or the other), and the final ledger the
/// one that serial run produces: no double freeze, no double collect, every fence row decided
/// once; conservation, stock and no-hanging hold.
pub(super) fn racing_branches<B: Backend>() {
    let server = B::start();
    let url = B::database(&server, "lot_race");
    let mut first = B::lottery(&url);
    setup(&mut first);
    let steps = race_plan();
    let barrier = Barrier::new(2);
    // Opened here, not in the racers: a racer that failed to open would leave the other
    // waiting at the barrier.
    let stores: Vec<B::Lottery> = (0..2).map(|_| B::lottery(&url)).collect();
    let outcomes: Vec<Vec<BranchOutcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .into_iter()
            .enumerate()
            .map(|(side, mut store)| {
                let (steps, barrier) = (&steps, &barrier);
                scope.spawn(move || {
                    steps
                        .iter()
                        .map(|step| {
                            // No panic in here: the other side would wait at the barrier
                            // forever. Store errors are judged after the join.
                            barrier.wait();
                            store.execute(&step[side], Flaws::NONE)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap()
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|e| panic!("a store failed: {e}")))
                    .collect()
            })
            .collect()
    });

    // Replay on a memory store in the order the outcomes say the database serialized them.
    let mut mem = MemoryStore::new();
    setup(&mut mem);
    let mut history = Vec::new();
    let mut cancel_first = 0;
    for (i, step) in steps.iter().enumerate() {
        let seen = [&outcomes[0][i], &outcomes[1][i]];
        let mut matched = false;
        for order in [[0, 1], [1, 0]] {
            let mut trial = mem.clone();
            let serial: Vec<BranchOutcome> = order
                .iter()
                .map(|&side| trial.execute(&step[side], Flaws::NONE).unwrap())
                .collect();
            if serial[0] == *seen[order[0]] && serial[1] == *seen[order[1]] {
                for &side in &order {
                    history.push(reply(&step[side], seen[side]));
                }
                if step[0] != step[1] && step[order[0]].phase == Phase::Cancel {
                    cancel_first += 1;
                }
                mem = trial;
                matched = true;
                break;
            }
        }
        assert!(
            matched,
            "step {i} {step:?}: outcomes {seen:?} are not those of any serial order"
        );
    }

    let ledger = first.snapshot().unwrap();
    assert_eq!(
        ledger,
        mem.snapshot().unwrap(),
        "the ledger is that of the serial run"
    );
    invariants::check_safety(&ledger, &history).unwrap();
    invariants::settled(&ledger).unwrap();
    for (user, account) in &ledger.accounts {
        assert_eq!(account.frozen_minor, 0, "user {user} has money frozen");
    }
    let applied = |phase: Phase| {
        history
            .iter()
            .filter(|r| r.phase == phase && r.outcome == Ok(sut::lottery::Effect::Applied))
            .count()
    };
    let fences_done = ledger.fences.len();
    assert_eq!(
        applied(Phase::Try),
        fences_done - cancel_first,
        "each fence row was tried at most once (empty rollbacks excepted)"
    );
    eprintln!(
        "{} steps, {fences_done} fence rows, {cancel_first} Try/Cancel races won by the Cancel",
        steps.len()
    );
}
