//! The TCC fence: Seata's `tcc_fence_log` rules (`TCCFenceHandler.java`; docs/sources.md,
//! "Anchors", "Seata TCC fence") as a pure function of the phase and the branch's fence row.
//!
//! The table is keyed by `(xid, branch)`; a row is in one of four states. The rules:
//!
//! | phase | no row | tried | committed | rollbacked | suspended |
//! |---|---|---|---|---|---|
//! | Try | insert tried, run | refuse | refuse | refuse | refuse |
//! | Confirm | error | → committed, run | no-op | refuse | refuse |
//! | Cancel | insert suspended (empty rollback) | → rollbacked, undo | refuse | no-op | no-op |
//!
//! A Try that finds any row is refused: in Seata a duplicate key "means a rollback already
//! happened", which is exactly what blocks a hanging Try after an empty rollback. (A Try that
//! finds its own `tried` row is a duplicate delivery; the participant still refuses it, and the
//! coordinator reads that particular refusal as "your Try landed".)
//!
//! The fence row and the business effect must change in one atomic step; see [`crate::lottery::rules`].

use serde::{Deserialize, Serialize};

use super::Phase;
use super::rows::{Effect, FenceStatus, Refusal};

/// How participants apply the fence. Only [`FenceMode::Atomic`] is correct.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum FenceMode {
    /// The fence row is read, decided on and written in the same transaction as the business
    /// effect (Seata: same local transaction; DTM: insert-ignore in the business transaction).
    #[default]
    Atomic,
    /// FLAW (Seata TCC fence / DTM barrier motivation): no fence at all. Every message runs its
    /// business effect, so empty rollbacks undo what was never done, a Try arriving after its
    /// Cancel hangs, and a duplicated Confirm collects twice.
    Unfenced,
    /// FLAW (DTM's argument against "check then change"): the fence row is checked in one store
    /// operation and changed in a second one, deciding on what the first one saw. A Cancel that
    /// runs in between (a process pause) records its empty rollback, then the paused Try
    /// overwrites it and freezes the money: a hanging Try.
    CheckThenAct,
}

/// What the fence says about one message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FenceStep {
    /// Run the business effect and set the fence row to `write`.
    Proceed {
        /// The new state of the fence row.
        write: FenceStatus,
    },
    /// Do not touch the business; reply `effect`, and write `write` if any (empty rollback).
    NoOp {
        /// What the reply reports.
        effect: Effect,
        /// The fence row to insert, if any.
        write: Option<FenceStatus>,
    },
    /// Refuse the message; nothing changes.
    Refuse(Refusal),
}

/// Seata's fence rules: what a message of `phase` does given the branch's fence row.
#[must_use]
pub fn fence_step(phase: Phase, row: Option<FenceStatus>) -> FenceStep {
    use FenceStatus::{Committed, Rollbacked, Suspended, Tried};
    match (phase, row) {
        (Phase::Try, None) => FenceStep::Proceed { write: Tried },
        (Phase::Try, Some(existing)) => FenceStep::Refuse(Refusal::TryFenced { existing }),
        (Phase::Confirm, None) => FenceStep::Refuse(Refusal::ConfirmWithoutTry),
        (Phase::Confirm, Some(Tried)) => FenceStep::Proceed { write: Committed },
        (Phase::Confirm, Some(Committed)) => FenceStep::NoOp {
            effect: Effect::AlreadyDone,
            write: None,
        },
        (Phase::Confirm, Some(existing @ (Rollbacked | Suspended))) => {
            FenceStep::Refuse(Refusal::ConfirmAfterCancel { existing })
        }
        (Phase::Cancel, None) => FenceStep::NoOp {
            effect: Effect::EmptyRollback,
            write: Some(Suspended),
        },
        (Phase::Cancel, Some(Tried)) => FenceStep::Proceed { write: Rollbacked },
        (Phase::Cancel, Some(Committed)) => FenceStep::Refuse(Refusal::CancelAfterConfirm),
        (Phase::Cancel, Some(Rollbacked | Suspended)) => FenceStep::NoOp {
            effect: Effect::AlreadyDone,
            write: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_ROWS: [Option<FenceStatus>; 5] = [
        None,
        Some(FenceStatus::Tried),
        Some(FenceStatus::Committed),
        Some(FenceStatus::Rollbacked),
        Some(FenceStatus::Suspended),
    ];

    #[test]
    fn codes_round_trip() {
        for s in ALL_ROWS.into_iter().flatten() {
            assert_eq!(FenceStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(FenceStatus::from_code(0), None);
        assert_eq!(FenceStatus::from_code(5), None);
    }

    #[test]
    fn try_only_runs_without_a_row() {
        assert_eq!(
            fence_step(Phase::Try, None),
            FenceStep::Proceed {
                write: FenceStatus::Tried
            }
        );
        for row in ALL_ROWS.into_iter().flatten() {
            assert_eq!(
                fence_step(Phase::Try, Some(row)),
                FenceStep::Refuse(Refusal::TryFenced { existing: row })
            );
        }
    }

    #[test]
    fn confirm_rules() {
        assert_eq!(
            fence_step(Phase::Confirm, None),
            FenceStep::Refuse(Refusal::ConfirmWithoutTry)
        );
        assert_eq!(
            fence_step(Phase::Confirm, Some(FenceStatus::Tried)),
            FenceStep::Proceed {
                write: FenceStatus::Committed
            }
        );
        assert_eq!(
            fence_step(Phase::Confirm, Some(FenceStatus::Committed)),
            FenceStep::NoOp {
                effect: Effect::AlreadyDone,
                write: None
            }
        );
        for s in [FenceStatus::Rollbacked, FenceStatus::Suspended] {
            assert_eq!(
                fence_step(Phase::Confirm, Some(s)),
                FenceStep::Refuse(Refusal::ConfirmAfterCancel { existing: s })
            );
        }
    }

    #[test]
    fn cancel_rules() {
        assert_eq!(
            fence_step(Phase::Cancel, None),
            FenceStep::NoOp {
                effect: Effect::EmptyRollback,
                write: Some(FenceStatus::Suspended)
            }
        );
        assert_eq!(
            fence_step(Phase::Cancel, Some(FenceStatus::Tried)),
            FenceStep::Proceed {
                write: FenceStatus::Rollbacked
            }
        );
        assert_eq!(
            fence_step(Phase::Cancel, Some(FenceStatus::Committed)),
            FenceStep::Refuse(Refusal::CancelAfterConfirm)
        );
        for s in [FenceStatus::Rollbacked, FenceStatus::Suspended] {
            assert_eq!(
                fence_step(Phase::Cancel, Some(s)),
                FenceStep::NoOp {
                    effect: Effect::AlreadyDone,
                    write: None
                }
            );
        }
    }
}
