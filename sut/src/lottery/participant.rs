//! Participants as message handlers: [`Participant::handle`] turns one [`ParticipantMsg`] into
//! one [`ParticipantReply`] by running one atomic store operation, so the simulator and the
//! stateright models can put the wallet, the inventory and the participation log on separate
//! nodes (each with its own store) or share one store.
//!
//! On the correct path a message is handled in one store operation. The two flaws that split an
//! operation ([`super::FenceMode::CheckThenAct`], [`super::Flaws::two_step_stock`]) return
//! [`Handled::Resume`] after the first (read-only) half; the driver feeds the [`Resume`] back
//! through [`Participant::handle_resume`] later, and whatever it delivers in between interleaves
//! (a stateright actor sends it to itself; the simulator may pause the node first).

use serde::{Deserialize, Serialize};

use super::activity::{self, Registry};
use super::error::StoreError;
use super::rows::{BranchOutcome, Refusal};
use super::rules::{BranchOp, BranchView};
use super::store::LotteryStore;
use super::{DrawArgs, Flaws, Participant, Phase};

// The participant's edge states (see [`crate::edge`]) are declared beside the rules that
// decide them ([`super::rules::edges`]): the rules count them.
pub use super::rules::edges::*;

/// A coordinator-to-participant message: run `phase` of the draw's branch on the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ParticipantMsg {
    /// Try, Confirm or Cancel.
    pub phase: Phase,
    /// The draw.
    pub draw: DrawArgs,
}

/// A participant's reply. It names the branch, the phase and the draw, so a history of replies
/// is self-describing (the `lottery.no_hanging` and `lottery.no_duplicate_participation`
/// checkers read such histories).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParticipantReply {
    /// The participant that handled the message.
    pub branch: Participant,
    /// The phase handled.
    pub phase: Phase,
    /// The draw.
    pub draw: DrawArgs,
    /// What happened.
    pub outcome: BranchOutcome,
}

/// The first half of a flawed two-step operation, to be resumed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resume {
    /// The operation.
    pub op: BranchOp,
    /// What its first half read.
    pub checked: BranchView,
}

/// What handling a message produced.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Handled {
    /// The reply to send back.
    Reply(ParticipantReply),
    /// (Flawed two-step paths only) the operation is half done; call
    /// [`Participant::handle_resume`] with this later.
    Resume(Resume),
}

/// A participant's configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParticipantConfig {
    /// The documented flaws (all off by default).
    pub flaws: Flaws,
}

fn unavailable(e: &StoreError) -> Refusal {
    Refusal::Unavailable {
        message: e.to_string(),
    }
}

impl Participant {
    /// Handles one message over `store`, for the activities of `registry`. Duplicates,
    /// reorderings and messages for finished draws are all safe: the fence decides. A Try the
    /// activity's terms refuse ([`activity::check_branch`]: unregistered, or not its price) is
    /// answered without touching the store: a refusal changes nothing.
    #[must_use]
    pub fn handle<S: LotteryStore + ?Sized>(
        self,
        store: &mut S,
        config: &ParticipantConfig,
        registry: &Registry,
        msg: &ParticipantMsg,
    ) -> Handled {
        let op = BranchOp {
            branch: self,
            phase: msg.phase,
            draw: msg.draw,
        };
        let terms = registry.get(op.draw.activity);
        if let Err(refusal) = activity::check_branch(&op, terms, config.flaws) {
            return Handled::Reply(self.reply(&op, Err(refusal)));
        }
        if config.flaws.is_two_step(&op) {
            return match store.read_branch(&op) {
                Ok(checked) => Handled::Resume(Resume { op, checked }),
                Err(e) => Handled::Reply(self.reply(&op, Err(unavailable(&e)))),
            };
        }
        let outcome = store
            .execute(&op, config.flaws)
            .unwrap_or_else(|e| Err(unavailable(&e)));
        Handled::Reply(self.reply(&op, outcome))
    }

    /// Finishes a two-step operation begun by [`Participant::handle`].
    #[must_use]
    pub fn handle_resume<S: LotteryStore + ?Sized>(
        self,
        store: &mut S,
        config: &ParticipantConfig,
        resume: &Resume,
    ) -> ParticipantReply {
        let op = resume.op;
        if op.branch != self {
            let refusal = Refusal::WrongParticipant {
                expected: op.branch,
                actual: self,
            };
            return self.reply(&op, Err(refusal));
        }
        let outcome = store
            .execute_checked(&op, &resume.checked, config.flaws)
            .unwrap_or_else(|e| Err(unavailable(&e)));
        self.reply(&op, outcome)
    }

    fn reply(self, op: &BranchOp, outcome: BranchOutcome) -> ParticipantReply {
        ParticipantReply {
            branch: self,
            phase: op.phase,
            draw: op.draw,
            outcome,
        }
    }
}
