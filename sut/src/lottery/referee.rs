//! The participants' promises, as a referee any driver can hold them to.
//!
//! A participant (ours in a property test, a user's behind `POST /tcc/branch` in
//! `scenario tcc`) is sent coordinator messages in any order: out of order, repeated, after
//! crashes. It must keep these promises whatever it is sent:
//!
//! - a Try takes effect only on a branch nothing was accepted for yet (never after its
//!   Cancel: no hanging Try);
//! - a Confirm takes effect only after that branch's Try did, and once;
//! - a Cancel undoes a Try that took effect, records an empty rollback when there was none,
//!   and never undoes a Confirm;
//! - a repeat answers "already done" and a refusal changes nothing; a Confirm after a Try that
//!   took effect and a Cancel before a Confirm are never refused (else the coordinator could
//!   never finish the draw);
//! - the books match what the branches went through: frozen money and reserved stock are the
//!   Tries still open, collected money and issued stock the Confirms, participation records
//!   the open or confirmed Tries.
//!
//! The [`Referee`] follows each branch through its replies ([`Referee::judge`]) and says what
//! the books must hold ([`Referee::books`]); the driver compares them with what the
//! participant's store (or its `GET /ledger`) says.

use std::collections::BTreeMap;
use std::fmt;

use super::{
    ActivityId, DrawArgs, Effect, Participant, ParticipantMsg, ParticipantReply, Phase, Xid,
};

/// What one branch went through, as its replies said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BranchState {
    /// Nothing accepted yet.
    #[default]
    Fresh,
    /// Its Try took effect.
    Tried,
    /// Its Confirm took effect.
    Confirmed,
    /// Cancelled after its Try took effect.
    Cancelled,
    /// Cancelled with no Try before it (an empty rollback).
    Suspended,
}

/// The kind of an answer, as far as the promises care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// The business effect ran.
    Applied,
    /// A repeat of a Confirm or Cancel that already ran.
    AlreadyDone,
    /// A Cancel with no Try before it, recorded.
    EmptyRollback,
    /// Refused: nothing may have changed.
    Refused,
}

impl Answer {
    /// The kind of a participant's outcome.
    #[must_use]
    pub fn of(reply: &ParticipantReply) -> Self {
        match reply.outcome {
            Ok(Effect::Applied) => Self::Applied,
            Ok(Effect::AlreadyDone) => Self::AlreadyDone,
            Ok(Effect::EmptyRollback) => Self::EmptyRollback,
            Err(_) => Self::Refused,
        }
    }
}

/// What a reply says: the branch, phase and draw it names, and its answer's kind (a black-box
/// driver parses it from the wire; [`Said::of`] takes it from a [`ParticipantReply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Said {
    /// The branch the reply names.
    pub branch: Participant,
    /// The phase the reply names.
    pub phase: Phase,
    /// The draw the reply names.
    pub draw: DrawArgs,
    /// The answer.
    pub answer: Answer,
}

impl Said {
    /// What `reply` says.
    #[must_use]
    pub fn of(reply: &ParticipantReply) -> Self {
        Self {
            branch: reply.branch,
            phase: reply.phase,
            draw: reply.draw,
            answer: Answer::of(reply),
        }
    }
}

/// One judged answer: a (phase, state before, answer) the promises allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transition {
    /// The phase sent.
    pub phase: Phase,
    /// The branch's state before.
    pub was: BranchState,
    /// The answer.
    pub answer: Answer,
    /// The branch's state after.
    pub now: BranchState,
}

impl Transition {
    /// True when the promises say this answer changed nothing (a repeat or a refusal): a
    /// driver that can see the books before and after checks that they are equal.
    #[must_use]
    pub const fn changes_nothing(&self) -> bool {
        matches!(self.answer, Answer::AlreadyDone | Answer::Refused)
    }
}

/// A broken promise.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// The answer is not one the promises allow from the branch's state.
    #[error(
        "a broken promise: {phase:?} of draw {xid} on {branch:?} answered {answer:?} after the \
         branch was {was:?}"
    )]
    Transition {
        /// The draw.
        xid: u64,
        /// The branch.
        branch: Participant,
        /// The phase sent.
        phase: Phase,
        /// The branch's state before.
        was: BranchState,
        /// The answer.
        answer: Answer,
    },
    /// The reply names another branch, phase or draw than the message it answers.
    #[error("the reply does not echo its message: sent {sent}, the reply says {said}")]
    Echo {
        /// The message sent.
        sent: String,
        /// What the reply names.
        said: String,
    },
    /// An answer that must change nothing changed the books.
    #[error("a {what} changed the books: {phase:?} of draw {xid} on {branch:?} ({detail})")]
    Changed {
        /// `repeat` or `refusal`.
        what: &'static str,
        /// The draw.
        xid: u64,
        /// The branch.
        branch: Participant,
        /// The phase.
        phase: Phase,
        /// What changed.
        detail: String,
    },
    /// The books do not match what the branches went through.
    #[error("{what} is {got}, the branches say {want}")]
    Books {
        /// Which figure.
        what: String,
        /// What the participant's books say.
        got: u64,
        /// What the branches' answers say.
        want: u64,
    },
}

/// What the books must hold after the answers judged so far (of the draws this referee saw).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Books {
    /// Money frozen by Tries still open.
    pub frozen_minor: u64,
    /// Money collected by Confirms.
    pub collected_minor: u64,
    /// Stock reserved by open Tries, per activity.
    pub reserved: BTreeMap<ActivityId, u64>,
    /// Stock issued by Confirms, per activity.
    pub issued: BTreeMap<ActivityId, u64>,
    /// Participation records held open (Tried).
    pub participations_open: u64,
    /// Participation records confirmed.
    pub participations_confirmed: u64,
}

impl Books {
    /// Reserved units of `activity`.
    #[must_use]
    pub fn reserved(&self, activity: ActivityId) -> u64 {
        self.reserved.get(&activity).copied().unwrap_or(0)
    }

    /// Issued units of `activity`.
    #[must_use]
    pub fn issued(&self, activity: ActivityId) -> u64 {
        self.issued.get(&activity).copied().unwrap_or(0)
    }
}

/// Compares one figure of the books.
///
/// # Errors
/// [`Broken::Books`] when `got` differs from `want`.
pub fn expect(what: impl fmt::Display, got: u64, want: u64) -> Result<(), Broken> {
    if got == want {
        return Ok(());
    }
    Err(Broken::Books {
        what: what.to_string(),
        got,
        want,
    })
}

/// Follows every branch through its answers.
#[derive(Clone, Debug, Default)]
pub struct Referee {
    branches: BTreeMap<(Xid, Participant), (DrawArgs, BranchState)>,
}

impl Referee {
    /// A referee that has seen nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The state of `branch` of draw `xid`.
    #[must_use]
    pub fn state(&self, xid: Xid, branch: Participant) -> BranchState {
        self.branches
            .get(&(xid, branch))
            .map_or(BranchState::Fresh, |(_, s)| *s)
    }

    /// Every branch seen, with its draw and state.
    pub fn branches(&self) -> impl Iterator<Item = (Participant, &DrawArgs, BranchState)> + '_ {
        self.branches
            .iter()
            .map(|((_, branch), (draw, state))| (*branch, draw, *state))
    }

    /// Judges `reply` to `msg` sent to `branch`: the transition it makes, or the promise it
    /// breaks. The reply must name the branch, phase and draw it answers.
    ///
    /// # Errors
    /// The promise broken; the referee's state is then unchanged.
    pub fn judge(
        &mut self,
        branch: Participant,
        msg: &ParticipantMsg,
        reply: &ParticipantReply,
    ) -> Result<Transition, Broken> {
        self.judge_said(branch, msg, &Said::of(reply))
    }

    /// [`Referee::judge`] for what a reply said.
    ///
    /// # Errors
    /// The promise broken; the referee's state is then unchanged.
    pub fn judge_said(
        &mut self,
        branch: Participant,
        msg: &ParticipantMsg,
        said: &Said,
    ) -> Result<Transition, Broken> {
        if said.branch != branch || said.phase != msg.phase || said.draw != msg.draw {
            return Err(Broken::Echo {
                sent: format!("{:?} of {:?} to {branch:?}", msg.phase, msg.draw),
                said: format!("{:?} of {:?} from {:?}", said.phase, said.draw, said.branch),
            });
        }
        self.judge_answer(branch, msg, said.answer)
    }

    /// [`Referee::judge`] for an answer already reduced to its kind (a black-box driver that
    /// parsed it from the wire).
    ///
    /// # Errors
    /// The promise broken; the referee's state is then unchanged.
    pub fn judge_answer(
        &mut self,
        branch: Participant,
        msg: &ParticipantMsg,
        answer: Answer,
    ) -> Result<Transition, Broken> {
        let was = self.state(msg.draw.xid, branch);
        let Some(now) = next(msg.phase, was, answer) else {
            return Err(Broken::Transition {
                xid: msg.draw.xid.0,
                branch,
                phase: msg.phase,
                was,
                answer,
            });
        };
        self.branches
            .insert((msg.draw.xid, branch), (msg.draw, now));
        Ok(Transition {
            phase: msg.phase,
            was,
            answer,
            now,
        })
    }

    /// Judges answers to messages that were in flight at once: they must be explained by some
    /// order of them (each answer a transition the promises allow, in that order). Returns
    /// the transitions in the order found, and takes that order's state.
    ///
    /// # Errors
    /// No order explains them: the promise broken in the last order tried; the referee's state
    /// is then unchanged.
    pub fn judge_concurrent(
        &mut self,
        answers: &[(Participant, ParticipantMsg, Said)],
    ) -> Result<Vec<Transition>, Broken> {
        assert!(
            answers.len() <= CONCURRENT_MAX,
            "{} answers at once: the orders to try grow as n!",
            answers.len()
        );
        let mut order: Vec<usize> = (0..answers.len()).collect();
        loop {
            let mut trial = self.clone();
            let judged: Result<Vec<Transition>, Broken> = order
                .iter()
                .map(|&i| {
                    let (branch, msg, said) = &answers[i];
                    trial.judge_said(*branch, msg, said)
                })
                .collect();
            match judged {
                Ok(transitions) => {
                    *self = trial;
                    return Ok(transitions);
                }
                Err(e) if !next_permutation(&mut order) => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// What the books must hold for the branches judged so far.
    #[must_use]
    pub fn books(&self) -> Books {
        let mut books = Books::default();
        for (branch, draw, state) in self.branches() {
            match (branch, state) {
                (Participant::Wallet, BranchState::Tried) => {
                    books.frozen_minor += draw.price_minor;
                }
                (Participant::Wallet, BranchState::Confirmed) => {
                    books.collected_minor += draw.price_minor;
                }
                (Participant::Inventory, BranchState::Tried) => {
                    *books.reserved.entry(draw.activity).or_default() += 1;
                }
                (Participant::Inventory, BranchState::Confirmed) => {
                    *books.issued.entry(draw.activity).or_default() += 1;
                }
                (Participant::Participation, BranchState::Tried) => {
                    books.participations_open += 1;
                }
                (Participant::Participation, BranchState::Confirmed) => {
                    books.participations_confirmed += 1;
                }
                _ => {}
            }
        }
        books
    }
}

/// The most answers [`Referee::judge_concurrent`] takes at once.
pub const CONCURRENT_MAX: usize = 4;

/// The next permutation in lexicographic order; false after the last.
fn next_permutation(order: &mut [usize]) -> bool {
    let Some(i) = order.windows(2).rposition(|w| w[0] < w[1]) else {
        return false;
    };
    let j = order
        .iter()
        .rposition(|&x| x > order[i])
        .expect("a larger element exists right of the pivot");
    order.swap(i, j);
    order[i + 1..].reverse();
    true
}

/// The state after answering `answer` to `phase` from `was`, when the promises allow it.
#[must_use]
pub const fn next(phase: Phase, was: BranchState, answer: Answer) -> Option<BranchState> {
    use Answer::{AlreadyDone, Applied, EmptyRollback, Refused};
    use BranchState::{Cancelled, Confirmed, Fresh, Suspended, Tried};
    match (phase, was, answer) {
        (Phase::Try, Fresh, Applied) => Some(Tried),
        (Phase::Confirm, Tried, Applied) => Some(Confirmed),
        (Phase::Cancel, Tried, Applied) => Some(Cancelled),
        (Phase::Cancel, Fresh, EmptyRollback) => Some(Suspended),
        (Phase::Confirm, Confirmed, AlreadyDone)
        | (Phase::Cancel, Cancelled | Suspended, AlreadyDone) => Some(was),
        // A Try may be refused for any reason; a Confirm only when its Try never took effect
        // or was cancelled; a Cancel only after a Confirm.
        (Phase::Try, _, Refused)
        | (Phase::Confirm, Fresh | Cancelled | Suspended, Refused)
        | (Phase::Cancel, Confirmed, Refused) => Some(was),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UserId;

    fn draw(xid: u64, won: bool) -> DrawArgs {
        DrawArgs {
            xid: Xid(xid),
            user: UserId(1),
            activity: ActivityId(7),
            price_minor: 10,
            won,
        }
    }

    fn msg(xid: u64, phase: Phase) -> ParticipantMsg {
        ParticipantMsg {
            phase,
            draw: draw(xid, true),
        }
    }

    #[test]
    fn a_try_after_its_cancel_is_a_broken_promise_and_changes_no_state() {
        let mut r = Referee::new();
        let w = Participant::Wallet;
        r.judge_answer(w, &msg(1, Phase::Cancel), Answer::EmptyRollback)
            .unwrap();
        let broken = r
            .judge_answer(w, &msg(1, Phase::Try), Answer::Applied)
            .unwrap_err();
        assert!(
            broken
                .to_string()
                .contains("after the branch was Suspended"),
            "{broken}"
        );
        assert_eq!(r.state(Xid(1), w), BranchState::Suspended);
    }

    #[test]
    fn a_refused_confirm_after_a_try_that_took_effect_is_a_broken_promise() {
        let mut r = Referee::new();
        let w = Participant::Wallet;
        r.judge_answer(w, &msg(1, Phase::Try), Answer::Applied)
            .unwrap();
        assert!(
            r.judge_answer(w, &msg(1, Phase::Confirm), Answer::Refused)
                .is_err()
        );
        let t = r
            .judge_answer(w, &msg(1, Phase::Confirm), Answer::Applied)
            .unwrap();
        assert_eq!(t.now, BranchState::Confirmed);
        assert!(!t.changes_nothing());
        let again = r
            .judge_answer(w, &msg(1, Phase::Confirm), Answer::AlreadyDone)
            .unwrap();
        assert!(again.changes_nothing());
    }

    #[test]
    fn the_books_follow_the_branches() {
        let mut r = Referee::new();
        for (xid, branch, phase) in [
            (1, Participant::Wallet, Phase::Try),
            (1, Participant::Inventory, Phase::Try),
            (2, Participant::Wallet, Phase::Try),
            (2, Participant::Wallet, Phase::Confirm),
            (2, Participant::Inventory, Phase::Try),
            (2, Participant::Inventory, Phase::Confirm),
            (3, Participant::Participation, Phase::Try),
        ] {
            r.judge_answer(branch, &msg(xid, phase), Answer::Applied)
                .unwrap();
        }
        let books = r.books();
        assert_eq!(books.frozen_minor, 10);
        assert_eq!(books.collected_minor, 10);
        assert_eq!(books.reserved(ActivityId(7)), 1);
        assert_eq!(books.issued(ActivityId(7)), 1);
        assert_eq!(books.participations_open, 1);
        assert_eq!(books.participations_confirmed, 0);
        assert!(expect("frozen", 20, books.frozen_minor).is_err());
    }

    fn reply(xid: u64, phase: Phase, outcome: crate::lottery::BranchOutcome) -> Said {
        Said::of(&ParticipantReply {
            branch: Participant::Wallet,
            phase,
            draw: draw(xid, true),
            outcome,
        })
    }

    #[test]
    fn answers_at_once_are_judged_in_the_order_that_explains_them() {
        let w = Participant::Wallet;
        // Listed Cancel first, answered as if the Try ran first: only that order explains it.
        let mut r = Referee::new();
        let answers = [
            (
                w,
                msg(1, Phase::Cancel),
                reply(1, Phase::Cancel, Ok(Effect::Applied)),
            ),
            (
                w,
                msg(1, Phase::Try),
                reply(1, Phase::Try, Ok(Effect::Applied)),
            ),
        ];
        let t = r.judge_concurrent(&answers).unwrap();
        assert_eq!(t[0].phase, Phase::Try, "{t:?}");
        assert_eq!(r.state(Xid(1), w), BranchState::Cancelled);
        // A hanging Try: the Try took effect, yet the Cancel found nothing to undo. No order
        // explains that.
        let mut r = Referee::new();
        let answers = [
            (
                w,
                msg(2, Phase::Try),
                reply(2, Phase::Try, Ok(Effect::Applied)),
            ),
            (
                w,
                msg(2, Phase::Cancel),
                reply(2, Phase::Cancel, Ok(Effect::EmptyRollback)),
            ),
        ];
        assert!(r.judge_concurrent(&answers).is_err());
        assert_eq!(
            r.state(Xid(2), w),
            BranchState::Fresh,
            "a failed judgement changes nothing"
        );
    }

    #[test]
    fn every_permutation_is_visited_once() {
        let mut order = vec![0, 1, 2];
        let mut seen = vec![order.clone()];
        while next_permutation(&mut order) {
            seen.push(order.clone());
        }
        assert_eq!(seen.len(), 6);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn a_reply_that_names_another_draw_is_refused_as_an_echo() {
        let mut r = Referee::new();
        let sent = msg(1, Phase::Try);
        let reply = ParticipantReply {
            branch: Participant::Wallet,
            phase: Phase::Try,
            draw: draw(2, true),
            outcome: Ok(Effect::Applied),
        };
        let broken = r.judge(Participant::Wallet, &sent, &reply).unwrap_err();
        assert!(matches!(broken, Broken::Echo { .. }), "{broken}");
    }
}
