//! The lottery store: a trait at the level of domain operations (set up accounts and stock, run
//! one participant operation atomically, the two halves of a flawed two-step operation, the
//! coordinator log, a ledger snapshot) and its in-memory implementation.
//!
//! Every implementation runs a participant operation as ONE atomic step: read the fence row and
//! the business row, call [`super::rules::decide`], write what it returns. The SQLite store
//! (`SqliteLotteryStore` in `sut-server`) does it in one transaction; the in-memory store in one
//! `&mut self` call. A conformance property test there keeps the two identical.

use super::error::StoreError;
use super::ledger::Ledger;
use super::log::{CoordLog, LogEntry};
use super::rows::BranchOutcome;
use super::rules::{self, BranchOp, BranchView};
use super::{ActivityId, Flaws, UserId};
use crate::edge::{Edges, Observed};

/// The lottery store. All methods take `&mut self`: one call is one atomic step.
pub trait LotteryStore {
    /// Opens `user`'s account with `balance_minor` (adds it to the minted total).
    ///
    /// # Errors
    /// [`StoreError::AccountExists`], [`StoreError::AmountTooLarge`], backend failures.
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError>;

    /// Adds `units` of prize stock to `activity`.
    ///
    /// # Errors
    /// [`StoreError::StockTooLarge`], backend failures.
    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError>;

    /// Runs one participant operation atomically: read fence row and business row, decide
    /// ([`rules::decide`] with the same view as `checked` and `fresh`), write both.
    ///
    /// # Errors
    /// Backend failures only; refusals are in the [`BranchOutcome`].
    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError>;

    /// First half of a flawed two-step operation: read what `op` would read, change nothing.
    ///
    /// # Errors
    /// Backend failures.
    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError>;

    /// Second half of a flawed two-step operation: atomically read the rows again and write
    /// what [`rules::decide`] says given the earlier view `checked`.
    ///
    /// # Errors
    /// Backend failures only.
    fn execute_checked(
        &mut self,
        op: &BranchOp,
        checked: &BranchView,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError>;

    /// Appends one coordinator log entry durably (see [`super::log::apply_entry`]).
    ///
    /// # Errors
    /// [`StoreError::Log`] when the entry conflicts, backend failures.
    fn log_append(&mut self, entry: &LogEntry) -> Result<(), StoreError>;

    /// Reads the coordinator log (what a restarted coordinator recovers from).
    ///
    /// # Errors
    /// Backend failures.
    fn log_load(&mut self) -> Result<CoordLog, StoreError>;

    /// The whole state, for the checkers.
    ///
    /// # Errors
    /// Backend failures.
    fn snapshot(&mut self) -> Result<Ledger, StoreError>;
}

/// The in-memory store: a [`Ledger`]. Used by the simulator's database node, the stateright
/// models and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryStore {
    ledger: Ledger,
    /// Arrivals at the rules' edge states since its driver last took them (a ghost).
    edges: Edges,
}

impl Observed for MemoryStore {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The state (without copying it).
    #[must_use]
    pub const fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// A store holding `ledger` (what a journal checkpoint restores).
    #[must_use]
    pub const fn from_ledger(ledger: Ledger) -> Self {
        Self {
            ledger,
            edges: Edges::new(),
        }
    }
}

impl LotteryStore for MemoryStore {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        self.ledger.open_account(user, balance_minor)
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        self.ledger.add_stock(activity, units)
    }

    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError> {
        let view = self.ledger.view(op);
        let decision = rules::decide(op, &view, &view, flaws, &mut self.edges);
        self.ledger.write(op, &decision);
        Ok(decision.outcome)
    }

    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError> {
        Ok(self.ledger.view(op))
    }

    fn execute_checked(
        &mut self,
        op: &BranchOp,
        checked: &BranchView,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        let fresh = self.ledger.view(op);
        let decision = rules::decide(op, checked, &fresh, flaws, &mut self.edges);
        self.ledger.write(op, &decision);
        Ok(decision.outcome)
    }

    fn log_append(&mut self, entry: &LogEntry) -> Result<(), StoreError> {
        Ok(self.ledger.coord_log.append(entry)?)
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        Ok(self.ledger.coord_log.clone())
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        Ok(self.ledger.clone())
    }
}
