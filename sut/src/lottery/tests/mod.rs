//! Tests of the lottery as a whole: fence anomalies through participants, store conformance,
//! coordinator behaviour and a deterministic lossy-network driver with restarts, the invariant
//! checkers, and the documented flaws.

mod checkers;
mod conformance;
mod coordinator;
mod driver;
mod fence_anomalies;
mod flaws;

use super::Handled;
use super::{
    ActivityId, DrawArgs, LotteryStore, Participant, ParticipantConfig, ParticipantMsg,
    ParticipantReply, Phase, UserId, Xid,
};

/// A draw of user 1 in activity 1 at price 10.
pub(super) fn draw(xid: u64, won: bool) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(1),
        activity: ActivityId(1),
        price_minor: 10,
        won,
    }
}

/// Sends one message to `p` over `store` on the correct path and returns the reply.
pub(super) fn send<S: LotteryStore + ?Sized>(
    store: &mut S,
    p: Participant,
    phase: Phase,
    draw: DrawArgs,
) -> ParticipantReply {
    match p.handle(
        store,
        &ParticipantConfig::default(),
        &ParticipantMsg { phase, draw },
    ) {
        Handled::Reply(r) => r,
        Handled::Resume(_) => panic!("the correct path is one step"),
    }
}
