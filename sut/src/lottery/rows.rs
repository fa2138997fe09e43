//! The rows a participant's store holds and the replies a participant gives: plain data that
//! every other lottery module reads. This module depends on no other module of the lottery
//! (only on the shared types of [`super`]), so the modules that decide ([`super::fence`],
//! [`super::rules`]), store ([`super::ledger`], [`super::store`]) and drive
//! ([`super::participant`], [`super::coordinator`]) form layers, not cycles.

use serde::{Deserialize, Serialize};

use super::{ActivityId, Participant, UserId, Xid};

/// The largest amount or count any row may hold: `i64::MAX`, so that every value fits a SQLite
/// INTEGER. Larger inputs and results are refused with a typed error, in both stores alike.
pub const AMOUNT_MAX: u64 = i64::MAX as u64;

/// What an accepted operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Effect {
    /// The business effect ran (Try reserved, Confirm made final, Cancel undid).
    Applied,
    /// A repeat of a Confirm or Cancel that already ran: nothing changed.
    AlreadyDone,
    /// A Cancel with no Try before it: nothing to undo; `suspended` was recorded.
    EmptyRollback,
}

/// Which quantity over- or underflowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Quantity {
    /// An account's balance.
    Balance,
    /// An account's frozen amount.
    Frozen,
    /// The house's collected total.
    Collected,
    /// An activity's available stock.
    Available,
    /// An activity's reserved stock.
    Reserved,
    /// An activity's issued prizes.
    Issued,
}

/// Why a participant refused an operation. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    /// Seata: Try found a fence row (duplicate key): a Cancel already ran, or this is a repeat.
    #[error("fence: Try refused, the branch already has a fence row in state {existing:?}")]
    TryFenced {
        /// The row found.
        existing: FenceStatus,
    },
    /// Seata: Confirm found no fence row.
    #[error("fence: Confirm refused, no Try was recorded for this branch")]
    ConfirmWithoutTry,
    /// Seata: Confirm after the branch was rolled back or suspended.
    #[error("fence: Confirm refused, the branch was already cancelled ({existing:?})")]
    ConfirmAfterCancel {
        /// The row found.
        existing: FenceStatus,
    },
    /// Seata: Cancel after the branch was committed.
    #[error("fence: Cancel refused, the branch was already confirmed")]
    CancelAfterConfirm,
    /// No such account.
    #[error("user {user} has no account")]
    UnknownAccount {
        /// The user.
        user: UserId,
    },
    /// The balance cannot pay the ticket.
    #[error("user {user} has {balance_minor} but the ticket costs {price_minor}")]
    InsufficientBalance {
        /// The user.
        user: UserId,
        /// Their available balance.
        balance_minor: u64,
        /// The ticket price.
        price_minor: u64,
    },
    /// No stock row for the activity.
    #[error("activity {activity} has no prize stock")]
    UnknownActivity {
        /// The activity.
        activity: ActivityId,
    },
    /// The activity is not in the operator's registry.
    #[error("activity {activity} is not registered")]
    UnregisteredActivity {
        /// The activity.
        activity: ActivityId,
    },
    /// A Try's amount is not the activity's price.
    #[error("activity {activity} costs {price_minor}, the Try carries {offered_minor}")]
    WrongPrice {
        /// The activity.
        activity: ActivityId,
        /// Its registered price.
        price_minor: u64,
        /// The amount the Try carried.
        offered_minor: u64,
    },
    /// No unit left to reserve.
    #[error("activity {activity} is out of stock")]
    OutOfStock {
        /// The activity.
        activity: ActivityId,
    },
    /// The user already has a (pending or confirmed) draw in this activity.
    #[error("user {user} already takes part in activity {activity} (draw {holder})")]
    AlreadyParticipated {
        /// The user.
        user: UserId,
        /// The activity.
        activity: ActivityId,
        /// The draw holding the participation record.
        holder: Xid,
    },
    /// Confirm or Cancel of a participation record this draw does not hold.
    #[error("draw {xid} holds no participation record for user {user} in activity {activity}")]
    NotParticipating {
        /// The draw.
        xid: Xid,
        /// The user.
        user: UserId,
        /// The activity.
        activity: ActivityId,
    },
    /// The draw has no branch on this participant (inventory for a losing draw).
    #[error("the draw has no branch on the {branch} participant")]
    NotInDraw {
        /// The participant.
        branch: Participant,
    },
    /// An amount above [`AMOUNT_MAX`].
    #[error("amount {amount_minor} exceeds the maximum {AMOUNT_MAX}")]
    AmountTooLarge {
        /// The amount.
        amount_minor: u64,
    },
    /// A quantity would go below zero (only reachable through a flaw or corrupt state).
    #[error("{quantity:?} would go below zero")]
    Underflow {
        /// Which one.
        quantity: Quantity,
    },
    /// A quantity would exceed [`AMOUNT_MAX`].
    #[error("{quantity:?} would exceed {AMOUNT_MAX}")]
    Overflow {
        /// Which one.
        quantity: Quantity,
    },
    /// A view handed back (e.g. in a resumed two-step operation) does not belong to this branch.
    #[error("the view does not match the operation's participant ({branch})")]
    MalformedView {
        /// The operation's participant.
        branch: Participant,
    },
    /// A participant sent a message meant for another participant.
    #[error("a message for the {expected} participant was delivered to the {actual} participant")]
    WrongParticipant {
        /// Where the operation belongs.
        expected: Participant,
        /// Who handled it.
        actual: Participant,
    },
    /// The store failed (I/O, SQLite); nothing is known to have changed. Transient.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// The store's error message.
        message: String,
    },
}

/// A participant's answer to one operation.
pub type BranchOutcome = Result<Effect, Refusal>;

/// The state of a fence row (`tcc_fence_log.status`: 1 tried, 2 committed, 3 rollbacked,
/// 4 suspended).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FenceStatus {
    /// Try ran (status 1).
    Tried,
    /// Confirm ran (status 2).
    Committed,
    /// Cancel undid a Try (status 3).
    Rollbacked,
    /// Cancel found no Try: empty rollback recorded, a late Try is blocked (status 4).
    Suspended,
}

impl FenceStatus {
    /// Seata's status code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Tried => 1,
            Self::Committed => 2,
            Self::Rollbacked => 3,
            Self::Suspended => 4,
        }
    }

    /// Inverse of [`FenceStatus::code`].
    #[must_use]
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Tried),
            2 => Some(Self::Committed),
            3 => Some(Self::Rollbacked),
            4 => Some(Self::Suspended),
            _ => None,
        }
    }
}

/// A user's wallet, in minor units.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Account {
    /// Spendable money.
    pub balance_minor: u64,
    /// Money frozen by Tries that are neither confirmed nor cancelled yet.
    pub frozen_minor: u64,
}

/// An activity's prize stock, in units. `available + reserved + issued == total` always holds on
/// the correct path (checked by `lottery.no_over_issue`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Stock {
    /// Units ever added.
    pub total: u64,
    /// Units free to reserve.
    pub available: u64,
    /// Units reserved by winning Tries, not yet confirmed or cancelled.
    pub reserved: u64,
    /// Units handed out by confirmed winning draws.
    pub issued: u64,
}

/// A participation record, unique per (user, activity).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ParticipationRow {
    /// The draw that holds the record.
    pub xid: Xid,
    /// Its ticket price.
    pub price_minor: u64,
    /// Whether it is a winning draw.
    pub won: bool,
    /// Whether it was confirmed (otherwise pending).
    pub confirmed: bool,
}
