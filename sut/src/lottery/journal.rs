//! The lottery's command journal: every mutating store operation as a record, applied to the
//! in-memory store, so that replaying the records in order rebuilds exactly the state that was
//! on disk (every operation is a deterministic function of the state it runs on).
//!
//! [`Journaled`] is a [`LotteryStore`] in front of a [`MemoryStore`]: each mutating operation is
//! applied and its record queued; the driver drains the records with
//! [`Journaled::take_records`] and makes them durable before it acknowledges anything that
//! depends on them. The real server writes them to a SQLite table and commits a batch with one
//! fsync (group commit); the simulator appends them to a participant node's crash-faithful disk.
//! Both recover by [`replay`]. Read-only operations (`read_branch`, `log_load`, `snapshot`) are
//! not journaled.
//!
//! A journal that only grows makes every restart slower. A **checkpoint** record
//! ([`JournalOp::Checkpoint`], from [`Journaled::checkpoint`]) holds the whole state; replay
//! starts from the last one, so a driver may delete every record before it in the same durable
//! write that adds it. A restart then replays one checkpoint and at most the records written
//! since (the server writes one every `checkpoint_every` records).

use crate::edge::{Edges, Observed};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::participant::ParticipantReply;
use super::rows::{BranchOutcome, FenceStatus};
use super::rules::{BranchOp, BranchView};
use super::store::{LotteryStore, MemoryStore};
use super::{ActivityId, CoordLog, Flaws, Ledger, LogEntry, UserId};

/// One journal record: a mutating store operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JournalOp {
    /// Open accounts `first..first + count` with `balance_minor` each (existing ones are kept).
    OpenAccounts {
        /// The first user.
        first: u64,
        /// How many.
        count: u64,
        /// Opening balance of each.
        balance_minor: u64,
    },
    /// Add prize stock.
    AddStock {
        /// The activity.
        activity: ActivityId,
        /// Units added.
        units: u64,
    },
    /// A branch operation through the fence ([`LotteryStore::execute`]).
    Execute {
        /// The operation.
        op: BranchOp,
        /// The flaws in force.
        flaws: Flaws,
    },
    /// The second half of a flawed two-step operation ([`LotteryStore::execute_checked`]),
    /// with what its first half read.
    ExecuteChecked {
        /// The operation.
        op: BranchOp,
        /// What the first half read.
        checked: BranchView,
        /// The flaws in force.
        flaws: Flaws,
    },
    /// An entry of the coordinator's log.
    LogAppend(LogEntry),
    /// The whole state at this point of the journal: replay restarts from it, and the records
    /// before it are no longer needed.
    Checkpoint(Box<Ledger>),
}

/// What applying a record answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum JournalAnswer {
    /// A record with nothing to answer.
    Done,
    /// [`JournalOp::OpenAccounts`]: opened, and already existing.
    Opened {
        /// Accounts opened.
        opened: u64,
        /// Accounts that existed already.
        existing: u64,
    },
    /// A branch operation's outcome.
    Outcome(BranchOutcome),
}

impl JournalOp {
    /// The record's kind and, for a branch operation, its phase (`execute_try`, ...) or, for a
    /// coordinator entry, the entry's kind: the protocol step a crash point at this record
    /// names.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::OpenAccounts { .. } => "open_accounts",
            Self::AddStock { .. } => "add_stock",
            Self::Execute { op, .. } | Self::ExecuteChecked { op, .. } => match op.phase {
                super::Phase::Try => "execute_try",
                super::Phase::Confirm => "execute_confirm",
                super::Phase::Cancel => "execute_cancel",
            },
            Self::LogAppend(entry) => entry.kind(),
            Self::Checkpoint(_) => "checkpoint",
        }
    }

    /// Applies the record to `store`.
    ///
    /// # Errors
    /// What the store refused (the same answer the first time and on every replay).
    pub fn apply<S: LotteryStore + ?Sized>(
        &self,
        store: &mut S,
    ) -> Result<JournalAnswer, StoreError> {
        Ok(match self {
            Self::OpenAccounts {
                first,
                count,
                balance_minor,
            } => {
                let (opened, existing) = open_range(store, *first, *count, *balance_minor)?;
                JournalAnswer::Opened { opened, existing }
            }
            Self::AddStock { activity, units } => {
                store.add_stock(*activity, *units)?;
                JournalAnswer::Done
            }
            Self::Execute { op, flaws } => JournalAnswer::Outcome(store.execute(op, *flaws)?),
            Self::ExecuteChecked { op, checked, flaws } => {
                JournalAnswer::Outcome(store.execute_checked(op, checked, *flaws)?)
            }
            Self::LogAppend(entry) => {
                store.log_append(entry)?;
                JournalAnswer::Done
            }
            // A state to restart from, not an operation: `replay` takes it in place of everything
            // before it.
            Self::Checkpoint(_) => {
                return Err(StoreError::Backend {
                    message: "a checkpoint is restored by replay, not applied to a store".into(),
                });
            }
        })
    }

    /// The participant's reply a branch record produced, given its answer (`None` for other
    /// records): what the record's participant told the coordinator.
    #[must_use]
    pub fn reply(&self, answer: &JournalAnswer) -> Option<ParticipantReply> {
        let (Self::Execute { op, .. } | Self::ExecuteChecked { op, .. }, JournalAnswer::Outcome(o)) =
            (self, answer)
        else {
            return None;
        };
        Some(ParticipantReply {
            branch: op.branch,
            phase: op.phase,
            draw: op.draw,
            outcome: o.clone(),
        })
    }
}

/// Replays `records` in order onto a fresh memory store; returns the store and the replies the
/// branch records produced, in the order they took effect. A record the store refused is
/// skipped (it was refused the first time too, so it changed nothing then either). A checkpoint
/// replaces the state built so far with the one it holds (the replies before it are dropped:
/// they are in the state).
#[must_use]
pub fn replay<'a>(
    records: impl IntoIterator<Item = &'a JournalOp>,
) -> (MemoryStore, Vec<ParticipantReply>) {
    crate::journal::replay((MemoryStore::new(), Vec::new()), records)
}

impl crate::journal::Record for JournalOp {
    type State = (MemoryStore, Vec<ParticipantReply>);

    fn replay_onto(&self, (store, replies): &mut Self::State) {
        if let Self::Checkpoint(ledger) = self {
            *store = MemoryStore::from_ledger((**ledger).clone());
            replies.clear();
        } else if let Ok(answer) = self.apply(store) {
            replies.extend(self.reply(&answer));
        }
    }
}

/// Whether `ledger` holds a reservation that awaits its verdict: frozen money, reserved stock,
/// an unconfirmed participation or a `tried` fence row.
fn in_doubt(ledger: &Ledger) -> bool {
    ledger.accounts.values().any(|a| a.frozen_minor > 0)
        || ledger.stock.values().any(|s| s.reserved > 0)
        || ledger.participations.values().any(|p| !p.confirmed)
        || ledger.fences.values().any(|f| *f == FenceStatus::Tried)
}

/// Opens accounts `first..first + count` one by one; returns how many were opened and how many
/// existed already.
///
/// # Errors
/// The first error other than "exists".
pub fn open_range<S: LotteryStore + ?Sized>(
    store: &mut S,
    first: u64,
    count: u64,
    balance_minor: u64,
) -> Result<(u64, u64), StoreError> {
    let (mut opened, mut existing) = (0, 0);
    // Up to `u64::MAX` included: a range ending at the last id still opens it.
    for user in (0..count).map_while(|i| first.checked_add(i)) {
        match store.open_account(UserId(user), balance_minor) {
            Ok(()) => opened += 1,
            Err(StoreError::AccountExists { .. }) => existing += 1,
            Err(e) => return Err(e),
        }
    }
    Ok((opened, existing))
}

/// A memory store whose mutating operations are journaled. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Journaled {
    mem: MemoryStore,
    /// Records applied and not yet taken by the driver.
    records: Vec<JournalOp>,
    /// Arrivals at edge states of its own (the rebuild) since its driver last took them.
    edges: Edges,
}

impl Observed for Journaled {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
        self.mem.take_edges(into);
    }
}

impl Journaled {
    /// A journaled store over `mem` (usually the result of [`replay`]: a participant starting
    /// up; one that rebuilt reservations awaiting their verdict reaches
    /// [`super::participant::REBUILT_IN_DOUBT`]).
    #[must_use]
    pub fn new(mem: MemoryStore) -> Self {
        let mut edges = Edges::new();
        edges.reach_if(
            in_doubt(mem.ledger()),
            &super::participant::REBUILT_IN_DOUBT,
        );
        Self {
            mem,
            records: Vec::new(),
            edges,
        }
    }

    /// The records applied since the last call, in order: make them durable, in this order.
    #[must_use]
    pub fn take_records(&mut self) -> Vec<JournalOp> {
        std::mem::take(&mut self.records)
    }

    /// Whether records wait to be taken.
    #[must_use]
    pub fn has_records(&self) -> bool {
        !self.records.is_empty()
    }

    /// The store itself.
    #[must_use]
    pub const fn memory(&self) -> &MemoryStore {
        &self.mem
    }

    /// A checkpoint of the state as it is now (every record taken so far included): a driver
    /// that makes it durable after those records may delete them.
    ///
    /// # Panics
    /// When records wait to be taken (the checkpoint would hold state no record on disk has).
    #[must_use]
    pub fn checkpoint(&self) -> JournalOp {
        assert!(
            self.records.is_empty(),
            "a checkpoint follows the records it covers"
        );
        JournalOp::Checkpoint(Box::new(self.mem.ledger().clone()))
    }

    /// Applies `record` and queues it. A record the store refuses changed nothing and is not
    /// queued.
    ///
    /// # Errors
    /// What the store refused.
    pub fn record(&mut self, record: JournalOp) -> Result<JournalAnswer, StoreError> {
        let answer = record.apply(&mut self.mem)?;
        self.records.push(record);
        Ok(answer)
    }

    /// [`JournalOp::OpenAccounts`].
    ///
    /// # Errors
    /// As [`open_range`].
    pub fn open_accounts(
        &mut self,
        first: u64,
        count: u64,
        balance_minor: u64,
    ) -> Result<(u64, u64), StoreError> {
        let op = JournalOp::OpenAccounts {
            first,
            count,
            balance_minor,
        };
        match self.record(op)? {
            JournalAnswer::Opened { opened, existing } => Ok((opened, existing)),
            other => unreachable!("OpenAccounts answers Opened, not {other:?}"),
        }
    }

    fn outcome(&mut self, record: JournalOp) -> Result<BranchOutcome, StoreError> {
        match self.record(record)? {
            JournalAnswer::Outcome(outcome) => Ok(outcome),
            other => unreachable!("a branch record answers an outcome, not {other:?}"),
        }
    }
}

impl LotteryStore for Journaled {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        match self.open_accounts(user.0, 1, balance_minor)? {
            (1, _) => Ok(()),
            _ => Err(StoreError::AccountExists { user }),
        }
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        self.record(JournalOp::AddStock { activity, units })
            .map(|_| ())
    }

    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError> {
        self.outcome(JournalOp::Execute { op: *op, flaws })
    }

    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError> {
        self.mem.read_branch(op)
    }

    fn execute_checked(
        &mut self,
        op: &BranchOp,
        checked: &BranchView,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        self.outcome(JournalOp::ExecuteChecked {
            op: *op,
            checked: checked.clone(),
            flaws,
        })
    }

    fn log_append(&mut self, entry: &LogEntry) -> Result<(), StoreError> {
        self.record(JournalOp::LogAppend(*entry)).map(|_| ())
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        self.mem.log_load()
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        self.mem.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lottery::{DrawArgs, Participant, ParticipantConfig, ParticipantMsg, Phase, Xid};

    fn draw() -> DrawArgs {
        DrawArgs {
            xid: Xid(1),
            user: UserId(1),
            activity: ActivityId(1),
            price_minor: 10,
            won: true,
        }
    }

    #[test]
    fn the_last_user_id_opens_as_in_the_memory_store() {
        // A range that ends at u64::MAX opens it (it was an empty range, refused as "exists").
        let mut j = Journaled::default();
        let mut mem = MemoryStore::new();
        assert_eq!(j.open_account(UserId(u64::MAX), 5), Ok(()));
        assert_eq!(mem.open_account(UserId(u64::MAX), 5), Ok(()));
        assert_eq!(
            j.open_accounts(u64::MAX - 1, 5, 1),
            Ok((1, 1)),
            "only two ids exist"
        );
        assert_eq!(
            j.open_account(UserId(u64::MAX), 5),
            Err(StoreError::AccountExists {
                user: UserId(u64::MAX)
            })
        );
    }

    #[test]
    fn replaying_the_records_rebuilds_the_store_and_the_replies() {
        let mut j = Journaled::default();
        assert_eq!(j.open_accounts(1, 2, 100), Ok((2, 0)));
        assert_eq!(j.open_accounts(2, 2, 100), Ok((1, 1)), "user 2 existed");
        j.add_stock(ActivityId(1), 1).unwrap();
        let cfg = ParticipantConfig::default();
        let mut replies = Vec::new();
        for phase in [Phase::Try, Phase::Confirm] {
            for p in [Participant::Wallet, Participant::Inventory] {
                let msg = ParticipantMsg {
                    phase,
                    draw: draw(),
                };
                if let crate::lottery::Handled::Reply(r) =
                    p.handle(&mut j, &cfg, &crate::testkit::lottery::registry(), &msg)
                {
                    replies.push(r);
                }
            }
        }
        let records = j.take_records();
        assert_eq!(
            records.len(),
            3 + 4,
            "three setup records, four branch operations"
        );
        assert!(!j.has_records());
        let (store, replayed) = replay(&records);
        assert_eq!(&store, j.memory());
        assert_eq!(replayed, replies);
    }

    #[test]
    fn replay_restarts_from_the_last_checkpoint() {
        let mut j = Journaled::default();
        j.open_accounts(1, 2, 100).unwrap();
        j.add_stock(ActivityId(1), 1).unwrap();
        let mut journal = j.take_records();
        journal.push(j.checkpoint());
        // What the checkpoint replaced can go: replay from it alone gives the same state.
        let from_checkpoint = journal.split_off(journal.len() - 1);
        j.add_stock(ActivityId(1), 2).unwrap();
        let tail = j.take_records();
        let whole: Vec<JournalOp> = journal
            .iter()
            .chain(&from_checkpoint)
            .chain(&tail)
            .cloned()
            .collect();
        let truncated: Vec<JournalOp> = from_checkpoint.iter().chain(&tail).cloned().collect();
        assert_eq!(replay(&whole).0, *j.memory());
        assert_eq!(replay(&truncated).0, *j.memory());
        assert_eq!(j.memory().ledger().stock[&ActivityId(1)].total, 3);
        // A checkpoint is no operation on a store.
        let mut other = MemoryStore::new();
        assert!(from_checkpoint[0].apply(&mut other).is_err());
    }

    #[test]
    #[should_panic(expected = "a checkpoint follows the records it covers")]
    fn a_checkpoint_never_runs_ahead_of_the_records() {
        let mut j = Journaled::default();
        j.add_stock(ActivityId(1), 1).unwrap();
        let _ = j.checkpoint();
    }

    #[test]
    fn a_refused_record_is_not_journaled() {
        let mut j = Journaled::default();
        j.add_stock(ActivityId(1), 1).unwrap();
        assert!(j.add_stock(ActivityId(1), u64::MAX).is_err());
        assert_eq!(j.take_records().len(), 1);
    }
}
