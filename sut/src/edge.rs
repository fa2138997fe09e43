//! Edge states: the rare situations a state machine's correctness hinges on, declared as named
//! "sometimes" points (Antithesis's `sometimes` assertions; FoundationDB's `TEST()` macros).
//!
//! A state machine counts an arrival at the instant it is in one of its edge states: the last ID
//! of a segment handed out while the next one is still loading, a Cancel that finds no Try (an
//! empty rollback), a clock that moved back by less than the tolerance, a node rebuilding its
//! state after a restart. Nothing changes in the protocol; the point only counts.
//!
//! The counts are the machine's own ([`Edges`]: a ghost beside its state, never part of it: two
//! machines that differ only in their counts are equal and hash alike, and a clone starts with
//! none, so a model checker's states do not multiply by them). A store counts the arrivals of
//! the rules it runs. Drivers take the counts ([`Observed::take_edges`]): the simulator after
//! each step of each node, into the seed's tally, and a sweep fails when an edge state that the
//! scenario owns was never reached, exactly like a fault that never took effect; the models after
//! each step of each actor, reporting which of their machines' edge states the exhaustive search
//! passed through. A run that never reached an edge state proves nothing about it, however many
//! seeds it ran. The HTTP server never reads them. There is no global counter: nothing in `sut`
//! is shared between machines, threads or runs.
//!
//! The list of every declared edge state is [`crate::edge_registry`]'s, so that this counter,
//! which every machine imports, imports none of them.

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

/// What a run reached: edge state name to arrivals.
pub type EdgeCounts = BTreeMap<String, u64>;

/// Arrivals at edge states, kept beside the machine (or store) that reached them until its
/// driver takes them. A ghost: it is never part of the machine's state (every two are equal,
/// none hashes anything, a clone starts empty and it is not serialized), so equality, hashing
/// and the model checkers' state spaces are those of the state alone.
///
/// A short list of (name, arrivals), in the order first reached (a machine reaches a handful
/// between two takes): counting and taking allocate nothing once the list has room, which a
/// take keeps. Whatever reads the counts gets them by name ([`Edges::take`]).
#[derive(Default)]
pub struct Edges(Vec<(&'static str, u64)>);

/// Whether `a` and `b` name the same edge state (the same literal, as a rule, hence the
/// pointer check first).
fn same_name(a: &'static str, b: &'static str) -> bool {
    std::ptr::eq(a, b) || a == b
}

impl Edges {
    /// None yet.
    #[must_use]
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// Counts one arrival at `edge`.
    pub fn reach(&mut self, edge: &Edge) {
        debug_assert!(
            edge.name.starts_with(edge.machine.name()),
            "edge {} is named after another machine",
            edge.name
        );
        self.add(edge.name, 1);
    }

    fn add(&mut self, name: &'static str, n: u64) {
        match self.0.iter_mut().find(|(known, _)| same_name(known, name)) {
            Some((_, count)) => *count += n,
            None => self.0.push((name, n)),
        }
    }

    /// Counts one arrival at `edge` when `condition` holds; returns `condition` (so that it can
    /// stand in an `if`).
    pub fn reach_if(&mut self, condition: bool, edge: &Edge) -> bool {
        if condition {
            self.reach(edge);
        }
        condition
    }

    /// Whether nothing was reached since the last take.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Moves the arrivals into `into`, leaving none.
    pub fn drain_into(&mut self, into: &mut EdgeCounts) {
        for (name, n) in self.0.drain(..) {
            *into.entry(name.to_owned()).or_insert(0) += n;
        }
    }

    /// Moves `other`'s arrivals into these (a machine taking a part's before dropping it).
    pub fn absorb(&mut self, other: &mut Self) {
        for (name, n) in other.0.drain(..) {
            self.add(name, n);
        }
    }

    /// The arrivals so far, leaving none.
    #[must_use]
    pub fn take(&mut self) -> EdgeCounts {
        let mut out = EdgeCounts::new();
        self.drain_into(&mut out);
        out
    }
}

impl Clone for Edges {
    /// Empty: a clone is a new machine, its arrivals its own.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Edges {
    /// Always: the counts are no part of the state.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Edges {}

impl std::hash::Hash for Edges {
    /// Nothing: the counts are no part of the state.
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl PartialOrd for Edges {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Edges {
    /// Equal: the counts are no part of the state.
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl std::fmt::Debug for Edges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by_name: BTreeMap<_, _> = self.0.iter().copied().collect();
        f.debug_map().entries(by_name.iter()).finish()
    }
}

impl serde::Serialize for Edges {
    /// As nothing: a serialized machine carries its state, not its counts.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

impl<'de> serde::Deserialize<'de> for Edges {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer)?;
        Ok(Self::default())
    }
}

/// A machine or store that counts its own arrivals at edge states (and its parts').
pub trait Observed {
    /// Moves every arrival since the last take (the machine's and its parts') into `into` (a
    /// driver's tally, or the counts of a machine that is about to drop this part).
    fn take_edges(&mut self, into: &mut Edges);

    /// The arrivals since the last take, by name.
    fn edges(&mut self) -> EdgeCounts {
        let mut out = Edges::default();
        self.take_edges(&mut out);
        out.take()
    }
}

impl<T: Observed + ?Sized> Observed for Box<T> {
    fn take_edges(&mut self, into: &mut Edges) {
        (**self).take_edges(into);
    }
}

impl<A: Observed, B> Observed for (A, B) {
    /// The first part's (a state and what was gathered beside it).
    fn take_edges(&mut self, into: &mut Edges) {
        self.0.take_edges(into);
    }
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
    fn counts_are_the_machines_own_and_no_part_of_its_state() {
        let edge = all().next().expect("some edge");
        let mut edges = Edges::default();
        edges.reach(edge);
        edges.reach(edge);
        assert!(!edges.reach_if(false, edge));
        let copy = edges.clone();
        assert!(copy.is_empty(), "a clone's arrivals are its own");
        assert_eq!(copy, edges, "equal whatever they counted");
        let hash = |e: &Edges| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            e.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&copy), hash(&edges));
        let mut other = Edges::default();
        other.reach(edge);
        edges.absorb(&mut other);
        assert!(other.is_empty());
        assert_eq!(edges.take().get(edge.name), Some(&3));
        assert!(edges.take().is_empty());
        assert_eq!(serde_json::to_string(&edges).unwrap(), "null");
    }
    #[test]
    fn arrivals_are_counted_by_name_whatever_the_order_and_the_copy_of_the_name() {
        let mut named = all();
        let (a, b) = (
            named.next().expect("an edge"),
            named.next().expect("another"),
        );
        // The same name in another place in memory (as a literal of another crate may be).
        let a_copy = Edge {
            name: String::leak(a.name.to_owned()),
            ..*a
        };
        let mut edges = Edges::default();
        edges.reach(b);
        edges.reach(a);
        let mut part = Edges::default();
        part.reach(&a_copy);
        part.reach(b);
        edges.absorb(&mut part);
        assert!(part.is_empty());
        assert_eq!(
            format!("{edges:?}"),
            format!("{:?}", BTreeMap::from([(a.name, 2), (b.name, 2)])),
            "debug output in name order"
        );
        let counts = edges.take();
        assert_eq!(counts.len(), 2);
        assert_eq!(counts[a.name], 2);
        assert_eq!(counts[b.name], 2);
    }
}
