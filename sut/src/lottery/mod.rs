//! The TCC lottery of the ID, token and lottery design (chapters 1 and 4, docs/sources.md): a
//! draw freezes the ticket price in the user's wallet, reserves one unit of the activity's prize
//! stock (winning draws only) and records that the user took part; a coordinator then confirms
//! or cancels all three branches.
//!
//! Every participant operation passes a **fence** that follows Seata's `tcc_fence_log`
//! (`TCCFenceHandler.java`; docs/sources.md, "Anchors"): one row per `(xid, branch)` in state
//! tried / committed / rollbacked / suspended, changed in the same local transaction as the
//! business effect. That rules out the three classic TCC anomalies: empty rollback (a Cancel with
//! no Try records `suspended`), hanging Try (a Try after a Cancel finds the row and is refused)
//! and double Confirm/Cancel (idempotent no-ops).
//!
//! Layout, in the order data flows (each module uses only those above it, never one below: no
//! import cycles; the one exception is the participant's edge-state declarations,
//! `participant::EDGES`, which [`rules`] counts where the fence and the business decide):
//!
//! - [`rows`]: the rows a participant's store holds (fence status, account, stock,
//!   participation) and a participant's replies (effects, refusals); plain data.
//! - [`log`]: the coordinator's durable log (begin, verdict, finished) and its rules.
//! - [`error`]: how a store operation fails (as opposed to a participant's refusal).
//! - [`fence`]: the Seata fence rules as a pure function of the phase and the fence row.
//! - [`rules`]: the ONE place where participant decisions are made: a pure function from an
//!   operation plus the fence row and business row it reads to the reply and the rows to write.
//!   Both stores call it; so do the documented flaws, which differ only in what they read when.
//! - [`activity`]: the operator's activities and their terms (price, odds, opening hours), the
//!   registration rule and the participants' terms rule (a Try pays the registered price).
//! - [`ledger`]: the business state (wallets, stock, participations, fence rows, coordinator
//!   log) as plain ordered data; the in-memory store *is* a ledger.
//! - [`store`]: the store trait at the level of domain operations and the in-memory store (the
//!   SQLite store, WAL, `synchronous=FULL`, one transaction per operation, lives in
//!   `sut-server` and calls the same [`rules`]).
//! - [`participant`]: participants as message handlers over a store.
//! - [`journal`]: the command journal: every mutating store operation as a record, replayed
//!   to recover (the server's SQLite journal and the simulator's participant disks).
//! - [`wheel`]: the timing wheel the coordinator's compensation schedule runs on (parked draws,
//!   retry rounds with backoff, dead letters; see [`coordinator`]).
//! - [`coordinator`]: the sans-IO coordinator: Try all, durable verdict, Confirm/Cancel all,
//!   timeouts, bounded retries with exponential backoff, recovery from its log.
//! - [`answer`]: what a client is told of its draw (the first answer, a poll's status), for
//!   the server and the simulator alike.
//! - [`node`]: the coordinator role as every driver runs it: the drive loop, timeouts, branch
//!   placement ([`Host`]) and the waiting clients' answers, behind one I/O trait.
//! - [`invariants`]: the `lottery.*` checkers shared by tests, the simulator, the models and the
//!   load verifier.
//!
//! ## Known flaws (off by default, see [`Flaws`])
//!
//! Each is an option that shares all other code with the correct path:
//!
//! - [`FenceMode::Unfenced`]: TCC without a fence (Seata TCC fence and DTM barrier docs): empty
//!   rollback, hanging Try and double Confirm become possible.
//! - [`FenceMode::CheckThenAct`]: the fence row is checked in one store operation and changed in
//!   a second one (DTM's argument against "check then change": a pause between the two lets a
//!   Cancel slip in, and the Try then hangs).
//! - [`Flaws::two_step_stock`]: the stock check and the decrement are two steps (the ID, token
//!   and lottery design, ch. 1, insists "查-扣-判" must be indivisible; split, two draws both
//!   see the last unit: over-issue).
//! - [`Flaws::client_price`]: the ticket price comes from the request (OWASP API6): a client
//!   that names price 0 wins for nothing, and conservation still holds; `lottery.paid` catches it.

use serde::{Deserialize, Serialize};

pub mod activity;
pub mod answer;
pub mod coordinator;
pub mod error;
pub mod fence;
pub mod invariants;
pub mod journal;
pub mod ledger;
pub mod log;
pub mod node;
pub mod participant;
pub mod referee;
pub mod rows;
pub mod rules;
pub mod store;
pub mod wheel;

#[cfg(test)]
mod tests;

pub use activity::{Registered, Registry, Terms, TermsError};
pub use answer::{ClientAnswer, DrawStatus, Polled, Statuses};
pub use coordinator::{
    CancelReason, Coordinator, CoordinatorConfig, CoordinatorError, DrawEvent, DrawOutcome,
    DrawStage,
};
pub use error::StoreError;
pub use fence::FenceMode;
pub use invariants::{LotteryViolation, Unsettled};
pub use ledger::{Ledger, MergeError};
pub use log::{CoordLog, LogEntry, LogError, LogRecord, Verdict};
pub use node::{CoordinatorIo, CoordinatorNode, Host, Written};
pub use participant::{Handled, ParticipantConfig, ParticipantMsg, ParticipantReply, Resume};
pub use rows::{
    AMOUNT_MAX, Account, BranchOutcome, Effect, FenceStatus, ParticipationRow, Quantity, Refusal,
    Stock,
};
pub use rules::{BranchDecision, BranchOp, BranchView, BusinessRow};
pub use store::{LotteryStore, MemoryStore};

/// A global transaction id: one draw. Must be unique for the lifetime of the fence log (it comes
/// from the ID allocator); reusing one is refused by the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Xid(pub u64);

pub use crate::UserId;

impl std::fmt::Display for Xid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

pub use crate::ActivityId;

/// The three TCC participants of a draw. A draw's branch on a participant is identified by
/// `(xid, participant)`; the participant is also the address messages are sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Participant {
    /// Per-user wallet: Try freezes the ticket price, Confirm collects it, Cancel unfreezes it.
    Wallet,
    /// Per-activity prize stock: Try reserves one unit, Confirm issues it, Cancel returns it.
    /// Only winning draws have an inventory branch.
    Inventory,
    /// Participation log, unique per (user, activity): Try records, Confirm marks confirmed,
    /// Cancel erases the record.
    Participation,
}

impl std::fmt::Display for Participant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Participant {
    /// All participants, in order.
    pub const ALL: [Self; 3] = [Self::Wallet, Self::Inventory, Self::Participation];

    /// The participant's name, as [`std::fmt::Display`] writes it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Wallet => "wallet",
            Self::Inventory => "inventory",
            Self::Participation => "participation",
        }
    }

    /// Stable small code (SQLite column value).
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Wallet => 1,
            Self::Inventory => 2,
            Self::Participation => 3,
        }
    }

    /// Inverse of [`Participant::code`].
    #[must_use]
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Wallet),
            2 => Some(Self::Inventory),
            3 => Some(Self::Participation),
            _ => None,
        }
    }
}

/// The TCC phase of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// Reserve resources (freeze, reserve, record).
    Try,
    /// Make the reservation final.
    Confirm,
    /// Undo the reservation (or record an empty rollback).
    Cancel,
}

impl Phase {
    /// The phase's name (`try`, `confirm`, `cancel`): reports and crash-point labels.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Try => "try",
            Self::Confirm => "confirm",
            Self::Cancel => "cancel",
        }
    }
}

/// Everything a participant needs to know about a draw. Every message carries it (as Seata's
/// `BusinessActionContext` does), so Confirm and Cancel need no lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DrawArgs {
    /// The draw's global transaction id.
    pub xid: Xid,
    /// Who draws.
    pub user: UserId,
    /// In which activity.
    pub activity: ActivityId,
    /// The ticket price in minor units (cents), at most [`AMOUNT_MAX`].
    pub price_minor: u64,
    /// Whether the caller's randomness says this draw wins a prize. A winning draw has an
    /// inventory branch and consumes one unit of stock; with no stock left it cancels.
    pub won: bool,
}

impl DrawArgs {
    /// Whether this draw has a branch on `participant`.
    #[must_use]
    pub const fn has_branch(&self, participant: Participant) -> bool {
        match participant {
            Participant::Wallet | Participant::Participation => true,
            Participant::Inventory => self.won,
        }
    }

    /// The draw's branches, in order.
    pub fn branches(&self) -> impl Iterator<Item = Participant> + '_ {
        Participant::ALL.into_iter().filter(|p| self.has_branch(*p))
    }
}

/// The documented flaws, all off by default. See the module documentation for their sources.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Flaws {
    /// How the fence is applied: atomically with the business effect (correct), not at all, or
    /// checked and changed in two separate store operations.
    pub fence: FenceMode,
    /// Inventory Try checks the stock in one store operation and writes the decremented value
    /// it read in a second one (a lost update: over-issue under concurrency).
    pub two_step_stock: bool,
    /// The draw's price is whatever the request says: the draw gate takes the client's
    /// `price_minor` and the participants do not compare it with the activity's terms (the
    /// design before the activity registry; OWASP API6). Off: the price is the operator's.
    #[serde(default)]
    pub client_price: bool,
}

impl Flaws {
    /// No flaw: the correct path.
    pub const NONE: Self = Self {
        fence: FenceMode::Atomic,
        two_step_stock: false,
        client_price: false,
    };

    /// Whether `op` is executed in two store operations (read, then write) under these flaws.
    #[must_use]
    pub fn is_two_step(&self, op: &BranchOp) -> bool {
        let stock_split =
            self.two_step_stock && op.phase == Phase::Try && op.branch == Participant::Inventory;
        self.fence == FenceMode::CheckThenAct || stock_split
    }
}
