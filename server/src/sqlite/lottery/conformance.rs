//! The conformance property: random operation sequences (several xids interleaved, duplicates,
//! out-of-order Confirm/Cancel, flawed two-step operations, setup mistakes, coordinator log
//! entries) applied to the in-memory store, to the SQLite store and to the server's default
//! store (the journaled memory store, `crate::lottery::JournaledStore`, committed after every
//! step) give identical results and identical snapshots after every step; reopening either file
//! gives the same state.
//!
//! The operations ([`Op`], [`op`]) and [`apply`] are shared with the PostgreSQL store's
//! conformance test (`crate::pg::lottery`).

use proptest::prelude::*;

use sut::lottery::{
    AMOUNT_MAX, ActivityId, BranchOp, BranchView, DrawArgs, FenceMode, Flaws, LogEntry,
    LotteryStore, MemoryStore, Participant, Phase, UserId, Verdict, Xid,
};

use super::SqliteLotteryStore;
use crate::lottery::{DurableLottery, JournaledStore};

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Open { user: u64, balance_minor: u64 },
    Stock { activity: u64, units: u64 },
    Exec { op: BranchOp, flaws: Flaws },
    Read { slot: usize, op: BranchOp },
    Finish { slot: usize, flaws: Flaws },
    Log(LogEntry),
}

fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..40u64, 1 => Just(AMOUNT_MAX), 1 => Just(AMOUNT_MAX + 1)]
}

fn draw_args() -> impl Strategy<Value = DrawArgs> {
    (0..4u64, 0..3u64, 0..2u64, amount(), any::<bool>()).prop_map(
        |(xid, user, activity, price_minor, won)| DrawArgs {
            xid: Xid(xid),
            user: UserId(user),
            activity: ActivityId(activity),
            price_minor,
            won,
        },
    )
}

fn branch_op() -> impl Strategy<Value = BranchOp> {
    let branch = prop_oneof![
        Just(Participant::Wallet),
        Just(Participant::Inventory),
        Just(Participant::Participation)
    ];
    let phase = prop_oneof![Just(Phase::Try), Just(Phase::Confirm), Just(Phase::Cancel)];
    (branch, phase, draw_args()).prop_map(|(branch, phase, draw)| BranchOp {
        branch,
        phase,
        draw,
    })
}

fn flaws() -> impl Strategy<Value = Flaws> {
    let fence = prop_oneof![6 => Just(FenceMode::Atomic), 1 => Just(FenceMode::Unfenced), 1 => Just(FenceMode::CheckThenAct)];
    (fence, prop::bool::weighted(0.2)).prop_map(|(fence, two_step_stock)| Flaws {
        fence,
        two_step_stock,
        // The stores never read it (the participants' terms rule does, before the store).
        client_price: false,
    })
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    let verdict = prop_oneof![Just(Verdict::Confirm), Just(Verdict::Cancel)];
    prop_oneof![
        2 => (0..3u64, amount()).prop_map(|(user, balance_minor)| Op::Open { user, balance_minor }),
        1 => (0..2u64, prop_oneof![0..3u64, Just(AMOUNT_MAX)]).prop_map(|(activity, units)| Op::Stock { activity, units }),
        10 => (branch_op(), flaws()).prop_map(|(op, flaws)| Op::Exec { op, flaws }),
        2 => (0..2usize, branch_op()).prop_map(|(slot, op)| Op::Read { slot, op }),
        2 => (0..2usize, flaws()).prop_map(|(slot, flaws)| Op::Finish { slot, flaws }),
        1 => draw_args().prop_map(|d| Op::Log(LogEntry::Begin(d))),
        1 => (0..4u64, verdict).prop_map(|(x, verdict)| Op::Log(LogEntry::Decided { xid: Xid(x), verdict })),
        1 => (0..4u64).prop_map(|x| Op::Log(LogEntry::Finished { xid: Xid(x) })),
    ]
}

pub(crate) type Slots = [Option<(BranchOp, BranchView)>; 2];

/// Applies `op`, returning a comparable rendering of the result.
pub(crate) fn apply(store: &mut dyn LotteryStore, slots: &mut Slots, op: &Op) -> String {
    match op {
        Op::Open {
            user,
            balance_minor,
        } => format!("{:?}", store.open_account(UserId(*user), *balance_minor)),
        Op::Stock { activity, units } => {
            format!("{:?}", store.add_stock(ActivityId(*activity), *units))
        }
        Op::Exec { op, flaws } => format!("{:?}", store.execute(op, *flaws)),
        Op::Read { slot, op } => {
            let view = store.read_branch(op);
            if let Ok(v) = &view {
                slots[*slot] = Some((*op, v.clone()));
            }
            format!("{view:?}")
        }
        Op::Finish { slot, flaws } => match slots[*slot].take() {
            Some((op, checked)) => format!("{:?}", store.execute_checked(&op, &checked, *flaws)),
            None => "empty slot".to_owned(),
        },
        Op::Log(entry) => format!("{:?}", store.log_append(entry)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_sqlite_stores_agree(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut sql = SqliteLotteryStore::open(dir.path().join("conf.db")).unwrap();
        let mut journaled = JournaledStore::open(&dir.path().join("journal.db")).unwrap();
        let mut mem = MemoryStore::new();
        let (mut mem_slots, mut sql_slots, mut journal_slots): (Slots, Slots, Slots) =
            Default::default();
        for (i, op) in ops.iter().enumerate() {
            let m = apply(&mut mem, &mut mem_slots, op);
            let s = apply(&mut sql, &mut sql_slots, op);
            let j = apply(&mut journaled, &mut journal_slots, op);
            journaled.commit().unwrap();
            prop_assert_eq!(&m, &s, "step {} {:?}", i, op);
            prop_assert_eq!(&m, &j, "journaled, step {} {:?}", i, op);
            prop_assert!(!m.contains("Backend"), "no backend error: {}", m);
            let mem_snapshot = mem.snapshot().unwrap();
            prop_assert_eq!(&mem_snapshot, &sql.snapshot().unwrap(), "snapshot after step {} {:?}", i, op);
            prop_assert_eq!(&mem_snapshot, &journaled.snapshot().unwrap(), "journaled snapshot after step {} {:?}", i, op);
            prop_assert_eq!(mem.log_load().unwrap(), sql.log_load().unwrap());
            prop_assert_eq!(mem.log_load().unwrap(), journaled.log_load().unwrap());
        }
        // Reopening either file gives the same state (durability of committed steps).
        drop(sql);
        drop(journaled);
        let mut reopened = SqliteLotteryStore::open(dir.path().join("conf.db")).unwrap();
        prop_assert_eq!(mem.snapshot().unwrap(), reopened.snapshot().unwrap());
        let mut replayed = JournaledStore::open(&dir.path().join("journal.db")).unwrap();
        prop_assert_eq!(mem.snapshot().unwrap(), replayed.snapshot().unwrap());
    }
}
