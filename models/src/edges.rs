//! How the models gather what their machines reached: each actor step hands the arrivals at edge
//! states of every machine it stepped (kept or thrown away after the step: a reply a machine
//! ignores still passed through the state) to this checker thread's scratch ([`observe`]), and
//! the runner moves the scratch into the model's shared counts after each step. The scratch is
//! the driver's plumbing for one step, not state of `sut`'s: the machines keep their own counts
//! ([`sut::edge::Edges`], no part of their state), and nothing here is read by a protocol.

use std::cell::RefCell;

use sut::edge::{Edges, Observed};

thread_local! {
    static STEP: RefCell<Edges> = const { RefCell::new(Edges::new()) };
}

/// Takes `machine`'s arrivals into this thread's scratch for the step running.
pub(crate) fn observe(machine: &mut impl Observed) {
    STEP.with(|step| machine.take_edges(&mut step.borrow_mut()));
}

/// The arrivals the step observed, leaving none.
pub(crate) fn take_step() -> Edges {
    STEP.with(|step| std::mem::take(&mut *step.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sut::lottery::{
        ActivityId, DrawArgs, LotteryStore, MemoryStore, Participant, ParticipantConfig,
        ParticipantMsg, Phase, Registry, Terms, UserId, Xid,
    };

    #[test]
    fn a_step_takes_what_it_observed_once() {
        let mut store = MemoryStore::new();
        store.open_account(UserId(1), 100).unwrap();
        let registry =
            Registry::from_entries([(ActivityId(1), Terms::always_open(10, 100))]).unwrap();
        let cancel = ParticipantMsg {
            phase: Phase::Cancel,
            draw: DrawArgs {
                xid: Xid(1),
                user: UserId(1),
                activity: ActivityId(1),
                price_minor: 10,
                won: false,
            },
        };
        let _ = take_step();
        let _ = Participant::Wallet.handle(
            &mut store,
            &ParticipantConfig::default(),
            &registry,
            &cancel,
        );
        observe(&mut store);
        let mut step = take_step();
        assert!(
            step.take().contains_key("participant.empty_rollback"),
            "a Cancel with no Try is an empty rollback"
        );
        observe(&mut store);
        assert!(take_step().is_empty(), "taken once");
    }
}
