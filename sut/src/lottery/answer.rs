//! What a client is told about its draw: the first answer to the draw request, and the status a
//! poll of the draw returns. Written once, so that `sut-server` (which encodes them as HTTP
//! status codes and bodies) and the simulator (which hands them to its clients) give the same
//! answer in the same situation.

use std::collections::{BTreeMap, BTreeSet};

use super::coordinator::{CancelReason, Coordinator, DrawEvent, DrawOutcome, DrawStage};
use super::log::Verdict;
use super::{UserId, Xid};
use crate::flaw::Flaw;

/// The first answer to a draw request, from the coordinator's outcome event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAnswer<'a> {
    /// Final: every branch confirmed.
    Confirmed {
        /// Whether a prize was issued.
        won: bool,
    },
    /// The verdict is durable and compensation is delivering it: the client is told so (HTTP
    /// 202) and follows the draw by polling its status until it is final.
    Pending,
    /// Compensation gave up until an operator retries; never a first answer (a draw is parked,
    /// and its client answered, before it can be dead-lettered), but a status can say it.
    DeadLettered,
    /// Final: cancelled, and why.
    Cancelled(&'a CancelReason),
}

impl<'a> ClientAnswer<'a> {
    /// The answer for `outcome`.
    #[must_use]
    pub const fn of(outcome: &'a DrawOutcome) -> Self {
        match outcome {
            DrawOutcome::Confirmed { won } => Self::Confirmed { won: *won },
            DrawOutcome::Parked { .. } => Self::Pending,
            DrawOutcome::DeadLettered { .. } => Self::DeadLettered,
            DrawOutcome::Cancelled { reason } => Self::Cancelled(reason),
        }
    }

    /// Whether nothing follows for the draw (confirmed or cancelled).
    #[must_use]
    pub const fn is_final(&self) -> bool {
        matches!(self, Self::Confirmed { .. } | Self::Cancelled(_))
    }
}

/// Where a draw is, as a poll of its status reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrawStatus {
    /// Begun, no verdict delivered yet and its client not yet told `pending`.
    InProgress,
    /// Its verdict is durable and being delivered (its client was told `pending`, or it is
    /// parked for compensation).
    Pending,
    /// Compensation gave up until an operator retries it.
    DeadLettered,
    /// Final: confirmed.
    Confirmed,
    /// Final: cancelled.
    Cancelled,
}

impl DrawStatus {
    /// The status of a draw in flight at `stage`; `told_pending` when its client was answered
    /// [`ClientAnswer::Pending`] and the draw has not ended since.
    #[must_use]
    pub const fn in_flight(stage: DrawStage, told_pending: bool) -> Self {
        match stage {
            DrawStage::DeadLettered(_) => Self::DeadLettered,
            DrawStage::Parked(_) => Self::Pending,
            _ if told_pending => Self::Pending,
            _ => Self::InProgress,
        }
    }

    /// The status of a draw that ended with `outcome` (a final one; a parked or dead-lettered
    /// outcome is reported as such).
    #[must_use]
    pub const fn ended(outcome: &DrawOutcome) -> Self {
        match outcome {
            DrawOutcome::Confirmed { .. } => Self::Confirmed,
            DrawOutcome::Cancelled { .. } => Self::Cancelled,
            DrawOutcome::Parked { .. } => Self::Pending,
            DrawOutcome::DeadLettered { .. } => Self::DeadLettered,
        }
    }

    /// Its name on the wire.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Pending => "pending",
            Self::DeadLettered => "dead_lettered",
            Self::Confirmed => "confirmed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The verdict a final status stands for.
    #[must_use]
    pub const fn final_verdict(self) -> Option<Verdict> {
        match self {
            Self::Confirmed => Some(Verdict::Confirm),
            Self::Cancelled => Some(Verdict::Cancel),
            Self::InProgress | Self::Pending | Self::DeadLettered => None,
        }
    }
}

impl DrawStage {
    /// The verdict decided for a draw at this stage (`None` before it is decided).
    #[must_use]
    pub const fn verdict(self) -> Option<Verdict> {
        match self {
            Self::LoggingBegin | Self::Trying => None,
            Self::LoggingVerdict(v)
            | Self::Finishing(v)
            | Self::Parked(v)
            | Self::DeadLettered(v)
            | Self::LoggingFinished(v) => Some(v),
        }
    }
}

/// What a coordinator's driver remembers to answer status polls: the draws whose clients were
/// told [`ClientAnswer::Pending`] and have not ended since, and the final outcomes of the most
/// recent draws (at most `kept_max`: an older draw's status is no longer known).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Statuses {
    told_pending: BTreeSet<Xid>,
    ended: BTreeMap<Xid, (UserId, DrawOutcome)>,
    kept_max: usize,
    /// FLAW `status_lost_after_compensation` switched on.
    lose_compensated: bool,
}

/// A draw's status as a poll reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Polled<'a> {
    /// Whose draw it is (a poll answers its owner and the operator only).
    pub user: UserId,
    /// Where it is.
    pub status: DrawStatus,
    /// The verdict, once decided.
    pub verdict: Option<Verdict>,
    /// The final outcome, once there is one.
    pub outcome: Option<&'a DrawOutcome>,
}

impl Statuses {
    /// Nothing remembered yet; final outcomes of the last `kept_max` draws will be.
    #[must_use]
    pub fn new(kept_max: usize) -> Self {
        Self::with_flaw(kept_max, None)
    }

    /// [`Self::new`], with the coordinator's flaw (only
    /// [`Flaw::StatusLostAfterCompensation`] changes it).
    #[must_use]
    pub fn with_flaw(kept_max: usize, flaw: Option<Flaw>) -> Self {
        assert!(kept_max > 0, "a status must be kept for a while");
        Self {
            told_pending: BTreeSet::new(),
            ended: BTreeMap::new(),
            kept_max,
            lose_compensated: flaw == Some(Flaw::StatusLostAfterCompensation),
        }
    }

    /// Books the coordinator's outcome `event`; returns what the draw's client is told, if it
    /// is still waiting.
    pub fn book<'a>(&mut self, event: &'a DrawEvent) -> ClientAnswer<'a> {
        let xid = event.draw.xid;
        let answer = ClientAnswer::of(&event.outcome);
        match answer {
            ClientAnswer::Pending => {
                self.told_pending.insert(xid);
            }
            ClientAnswer::DeadLettered => {}
            // FLAW `status_lost_after_compensation`: the end of a draw whose client was told
            // `pending` (it ended through compensation) is never booked; its polls find nothing.
            ClientAnswer::Confirmed { .. } | ClientAnswer::Cancelled(_)
                if self.lose_compensated && self.told_pending.remove(&xid) => {}
            ClientAnswer::Confirmed { .. } | ClientAnswer::Cancelled(_) => {
                self.told_pending.remove(&xid);
                self.ended
                    .insert(xid, (event.draw.user, event.outcome.clone()));
                if self.ended.len() > self.kept_max {
                    self.ended.pop_first();
                }
            }
        }
        debug_assert!(self.ended.len() <= self.kept_max);
        answer
    }

    /// Its invariants: within its bound, and no draw both ended and still told pending.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.ended.len() > self.kept_max {
            return Err(format!(
                "{} final outcomes kept, at most {}",
                self.ended.len(),
                self.kept_max
            ));
        }
        if let Some(xid) = self
            .told_pending
            .iter()
            .find(|x| self.ended.contains_key(x))
        {
            return Err(format!("draw {xid} has ended and is still told pending"));
        }
        Ok(())
    }

    /// The status of draw `xid`: in flight at `coordinator`, else its remembered end.
    #[must_use]
    pub fn poll(&self, coordinator: &Coordinator, xid: Xid) -> Option<Polled<'_>> {
        if let (Some(stage), Some(args)) = (coordinator.stage(xid), coordinator.draw(xid)) {
            return Some(Polled {
                user: args.user,
                status: DrawStatus::in_flight(stage, self.told_pending.contains(&xid)),
                verdict: stage.verdict(),
                outcome: None,
            });
        }
        let (user, outcome) = self.ended.get(&xid)?;
        let status = DrawStatus::ended(outcome);
        Some(Polled {
            user: *user,
            status,
            verdict: status.final_verdict(),
            outcome: Some(outcome),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_is_answered_pending_and_polled_pending_until_it_ends() {
        let parked = DrawOutcome::Parked {
            verdict: Verdict::Confirm,
        };
        assert_eq!(ClientAnswer::of(&parked), ClientAnswer::Pending);
        assert!(!ClientAnswer::of(&parked).is_final());
        let stage = DrawStage::Finishing(Verdict::Confirm);
        assert_eq!(DrawStatus::in_flight(stage, true), DrawStatus::Pending);
        assert_eq!(DrawStatus::in_flight(stage, false), DrawStatus::InProgress);
        assert_eq!(
            DrawStatus::in_flight(DrawStage::Parked(Verdict::Cancel), false),
            DrawStatus::Pending
        );
        assert_eq!(stage.verdict(), Some(Verdict::Confirm));
        assert_eq!(DrawStage::Trying.verdict(), None);
    }

    #[test]
    fn final_answers_and_statuses_agree() {
        let confirmed = DrawOutcome::Confirmed { won: true };
        assert_eq!(
            ClientAnswer::of(&confirmed),
            ClientAnswer::Confirmed { won: true }
        );
        assert!(ClientAnswer::of(&confirmed).is_final());
        let cancelled = DrawOutcome::Cancelled {
            reason: CancelReason::Recovered,
        };
        assert!(ClientAnswer::of(&cancelled).is_final());
        assert_eq!(
            DrawStatus::ended(&confirmed).final_verdict(),
            Some(Verdict::Confirm)
        );
        assert_eq!(
            DrawStatus::ended(&cancelled).final_verdict(),
            Some(Verdict::Cancel)
        );
        assert_eq!(DrawStatus::Pending.final_verdict(), None);
        assert_eq!(DrawStatus::InProgress.name(), "in_progress");
    }

    #[test]
    fn the_flawed_table_never_books_the_end_of_a_draw_told_pending() {
        use crate::lottery::{ActivityId, DrawArgs};
        let event = |outcome| DrawEvent {
            draw: DrawArgs {
                xid: Xid(3),
                user: UserId(7),
                activity: ActivityId(1),
                price_minor: 10,
                won: false,
            },
            outcome,
        };
        let coordinator = Coordinator::new(crate::lottery::CoordinatorConfig::default())
            .expect("the default config");
        let parked = event(DrawOutcome::Parked {
            verdict: Verdict::Cancel,
        });
        let cancelled = event(DrawOutcome::Cancelled {
            reason: CancelReason::Recovered,
        });
        let mut correct = Statuses::new(8);
        let mut flawed = Statuses::with_flaw(8, Some(Flaw::StatusLostAfterCompensation));
        for statuses in [&mut correct, &mut flawed] {
            assert_eq!(statuses.book(&parked), ClientAnswer::Pending);
            assert!(statuses.book(&cancelled).is_final());
            assert_eq!(statuses.check_invariants(), Ok(()));
        }
        assert_eq!(
            correct.poll(&coordinator, Xid(3)).map(|p| p.status),
            Some(DrawStatus::Cancelled)
        );
        assert_eq!(flawed.poll(&coordinator, Xid(3)), None, "the end was lost");
        // A draw never told pending is booked as before.
        let mut other = event(DrawOutcome::Confirmed { won: false });
        other.draw.xid = Xid(4);
        assert!(flawed.book(&other).is_final());
        assert!(flawed.poll(&coordinator, Xid(4)).is_some());
    }

    #[test]
    fn statuses_follow_a_parked_draw_to_its_end_and_forget_the_oldest() {
        use crate::lottery::{ActivityId, DrawArgs};
        let draw = |xid| DrawArgs {
            xid: Xid(xid),
            user: UserId(7),
            activity: ActivityId(1),
            price_minor: 10,
            won: false,
        };
        let event = |xid, outcome| DrawEvent {
            draw: draw(xid),
            outcome,
        };
        let coordinator = Coordinator::new(crate::lottery::CoordinatorConfig::default())
            .expect("the default config");
        let mut statuses = Statuses::new(1);
        let parked = event(
            1,
            DrawOutcome::Parked {
                verdict: Verdict::Confirm,
            },
        );
        assert_eq!(statuses.book(&parked), ClientAnswer::Pending);
        assert!(statuses.told_pending.contains(&Xid(1)));
        let confirmed = event(1, DrawOutcome::Confirmed { won: false });
        assert!(statuses.book(&confirmed).is_final());
        let polled = statuses.poll(&coordinator, Xid(1)).expect("remembered");
        assert_eq!(
            (polled.user, polled.status, polled.verdict),
            (UserId(7), DrawStatus::Confirmed, Some(Verdict::Confirm))
        );
        assert!(statuses.told_pending.is_empty());
        let cancelled = event(
            2,
            DrawOutcome::Cancelled {
                reason: CancelReason::Recovered,
            },
        );
        let _ = statuses.book(&cancelled);
        assert_eq!(
            statuses.poll(&coordinator, Xid(1)),
            None,
            "kept_max 1: forgotten"
        );
        assert_eq!(
            statuses.poll(&coordinator, Xid(2)).map(|p| p.status),
            Some(DrawStatus::Cancelled)
        );
    }
}
