//! Edge states: the rare situations a state machine's correctness hinges on, declared as named
//! "sometimes" points (Antithesis's `sometimes` assertions; FoundationDB's `TEST()` macros).
//!
//! A state machine calls [`reached`] at the instant it is in one of its edge states: the last ID
//! of a segment handed out while the next one is still loading, a Cancel that finds no Try (an
//! empty rollback), a clock that moved back by less than the tolerance, a node rebuilding its
//! state after a restart. Nothing changes in the protocol; the point only counts.
//!
//! Drivers read the counts: the simulator takes them after each seed ([`take`]) and a sweep
//! fails when an edge state that the scenario owns was never reached, exactly like a fault that
//! never took effect; the models report, per model, which of their machines' edge states the
//! exhaustive search passed through. A run that never reached an edge state proves nothing about
//! it, however many seeds it ran.
//!
//! The list of every declared edge state is [`crate::edge_registry`]'s, so that this counter,
//! which every machine imports, imports none of them.
//!
//! Counts are per thread: a madsim run and a model check each run on one thread, so concurrent
//! sweeps on other threads do not mix. The HTTP server never reads them.

use std::cell::RefCell;
use std::collections::BTreeMap;

/// The state machine an edge state belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Machine {
    /// Segment allocation (`segment`, `id_store`).
    Segment,
    /// Snowflake and semantic IDs (`snowflake`).
    Snowflake,
    /// JWT, revocation and one-time tokens (`token`).
    Token,
    /// The TCC coordinator and its log (`lottery::coordinator`, `lottery::log`).
    Coordinator,
    /// Participants and their fences (`lottery::participant`, `lottery::fence`, `lottery::ledger`).
    Participant,
    /// The compensation timing wheel (`lottery::wheel`).
    Wheel,
}

impl Machine {
    /// Every machine.
    pub const ALL: [Self; 6] = [
        Self::Segment,
        Self::Snowflake,
        Self::Token,
        Self::Coordinator,
        Self::Participant,
        Self::Wheel,
    ];

    /// The snake_case name (the prefix of its edge states' names).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Segment => "segment",
            Self::Snowflake => "snowflake",
            Self::Token => "token",
            Self::Coordinator => "coordinator",
            Self::Participant => "participant",
            Self::Wheel => "wheel",
        }
    }

    /// The machine named `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One declared edge state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    /// `machine.what`, unique.
    pub name: &'static str,
    /// Whose edge state it is.
    pub machine: Machine,
    /// What the situation is and why it matters, in one sentence.
    pub about: &'static str,
}

impl Edge {
    /// A declaration (in a `const` list next to the code that reaches it).
    #[must_use]
    pub const fn new(machine: Machine, name: &'static str, about: &'static str) -> Self {
        Self {
            name,
            machine,
            about,
        }
    }
}

thread_local! {
    static REACHED: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one arrival at `edge` on this thread.
pub fn reached(edge: &Edge) {
    debug_assert!(
        edge.name.starts_with(edge.machine.name()),
        "edge {} is named after another machine",
        edge.name
    );
    REACHED.with(|r| *r.borrow_mut().entry(edge.name).or_insert(0) += 1);
}

/// Counts one arrival at `edge` when `condition` holds; returns `condition` (so that it can
/// stand in an `if`).
pub fn reached_if(condition: bool, edge: &Edge) -> bool {
    if condition {
        reached(edge);
    }
    condition
}

/// Runs `f` (a journal replay) without counting edge states again: every replayed operation
/// counted them when it first ran, and a replay is no new arrival. The counts made before `f`
/// are kept; those `f` makes are dropped, even when it panics.
pub fn replaying<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(BTreeMap<&'static str, u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = std::mem::take(&mut self.0);
            REACHED.with(|r| *r.borrow_mut() = before);
        }
    }
    let _restore = Restore(REACHED.with(|r| std::mem::take(&mut *r.borrow_mut())));
    f()
}

/// The counts on this thread since the last `take`, and resets them.
#[must_use]
pub fn take() -> BTreeMap<String, u64> {
    REACHED.with(|r| {
        std::mem::take(&mut *r.borrow_mut())
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge_registry::all;

    #[test]
    fn names_are_unique_and_prefixed_by_their_machine() {
        let mut seen = std::collections::BTreeSet::new();
        for edge in all() {
            assert!(seen.insert(edge.name), "{} declared twice", edge.name);
            let (machine, what) = edge.name.split_once('.').expect("machine.what");
            assert_eq!(machine, edge.machine.name(), "{}", edge.name);
            assert!(!what.is_empty() && !edge.about.is_empty(), "{}", edge.name);
        }
        for machine in Machine::ALL {
            assert!(
                machine.edges().next().is_some(),
                "{} declares no edge state",
                machine.name()
            );
        }
    }

    #[test]
    fn take_counts_and_resets_per_thread() {
        let edge = all().next().expect("some edge");
        let _ = take();
        reached(edge);
        reached(edge);
        assert!(!reached_if(false, edge));
        let elsewhere = std::thread::spawn(take).join().expect("thread");
        assert!(elsewhere.is_empty(), "another thread's counts are its own");
        assert_eq!(take().get(edge.name), Some(&2));
        assert!(take().is_empty());
    }

    #[test]
    fn a_replay_counts_nothing_and_keeps_the_counts_before() {
        let edge = all().next().expect("some edge");
        let _ = take();
        reached(edge);
        let answer = replaying(|| {
            reached(edge);
            reached(edge);
            42
        });
        assert_eq!(answer, 42);
        let panicked = std::panic::catch_unwind(|| {
            replaying(|| -> () {
                reached(edge);
                panic!("replay")
            })
        });
        assert!(panicked.is_err());
        assert_eq!(
            take().get(edge.name),
            Some(&1),
            "only the arrival outside the replays"
        );
    }
}
