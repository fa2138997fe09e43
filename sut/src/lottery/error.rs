//! How a lottery store operation fails (not how a participant refuses: that is a
//! [`super::rows::Refusal`]).

use serde::{Deserialize, Serialize};

use super::log::LogError;
use super::{ActivityId, UserId};

/// A store operation failed. Participant refusals are not errors (they are
/// [`super::rows::BranchOutcome`]s); these are setup mistakes, log conflicts and backend failures.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum StoreError {
    /// The account already exists.
    #[error("user {user} already has an account")]
    AccountExists {
        /// The user.
        user: UserId,
    },
    /// An amount, or the total money in the system, would exceed `AMOUNT_MAX`.
    #[error("amount {amount_minor} would push the total above the maximum")]
    AmountTooLarge {
        /// The amount.
        amount_minor: u64,
    },
    /// The stock would exceed `AMOUNT_MAX` units.
    #[error("stock of {activity} would exceed the maximum")]
    StockTooLarge {
        /// The activity.
        activity: ActivityId,
    },
    /// The coordinator log refused an entry.
    #[error("coordinator log: {0}")]
    Log(#[from] LogError),
    /// The backend failed (SQLite error, corrupt row). Nothing is known to have changed.
    #[error("store backend: {message}")]
    Backend {
        /// The backend's message.
        message: String,
    },
}
