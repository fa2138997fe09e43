//! The bench's one checker library: every invariant as a function (or a streaming checker) over
//! what was observed, used by the simulator, the real-process runs, the black-box testers of a
//! user's service and the models alike (docs/architecture.md, "The invariants, and where each is
//! checked"). A driver turns its own record of a run into the observations these take and words
//! the result for its report; the rule itself is here, once.
//!
//! - [`AtMostOnce`]: each key observed at most once — `ids.unique` (a key is an ID within its ID
//!   space) and `tokens.single_use` (a key is an accepted one-time token).
//! - [`Rising`]: per group, each value above every value of the group before it —
//!   `ids.monotonic` per generator, allocator incarnation or user.
//! - [`ids`]: `ids.monotonic` in real-time order over concurrent answers (Jepsen's order: an
//!   answer above every answer that completed before it was asked) and the IDs lost to gaps.
//! - [`tokens`]: `tokens.single_use` and `tokens.revoked_rejected` over a token history.
//! - [`lottery`]: conservation, no over-issue, `lottery.paid`, agreement, no hanging branch,
//!   no duplicate participation, settled.

pub mod ids;

pub use crate::lottery::invariants as lottery;
pub use crate::token::check as tokens;

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;

/// A state machine's own invariants, asserted after each of its steps in debug builds
/// (TIGER_STYLE: the assertions that document an invariant also run). Release builds leave the
/// whole-state checks to the drivers' self-checks (the simulator's, the mutation gate's).
#[track_caller]
pub(crate) fn debug_holds(machine: &str, invariants: impl FnOnce() -> Result<(), String>) {
    if cfg!(debug_assertions)
        && let Err(violation) = invariants()
    {
        panic!("{machine}: {violation}");
    }
}

/// Each key observed at most once, streaming: [`AtMostOnce::observe`] every key as it is seen,
/// with a witness `W` (a position in the history, the generator that issued it, ...) that the
/// caller needs to name the first observation when a key comes again.
#[derive(Clone, Debug)]
pub struct AtMostOnce<K, W> {
    first: HashMap<K, W>,
    /// The first key observed again, and the witness of that second observation.
    first_repeat: Option<(K, W)>,
    observed: u64,
    repeats: u64,
}

impl<K: Hash + Eq, W> Default for AtMostOnce<K, W> {
    fn default() -> Self {
        Self {
            first: HashMap::default(),
            first_repeat: None,
            observed: 0,
            repeats: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, W> AtMostOnce<K, W> {
    /// An empty checker.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Observes `key`, witnessed by `who`. Returns the witness of its first observation when the
    /// key was observed before (a violation); the first witness is kept.
    pub fn observe(&mut self, key: K, who: W) -> Option<&W> {
        self.observed += 1;
        match self.first.entry(key) {
            Entry::Occupied(first) => {
                self.repeats += 1;
                if self.first_repeat.is_none() {
                    self.first_repeat = Some((first.key().clone(), who));
                }
                Some(first.into_mut())
            }
            Entry::Vacant(slot) => {
                slot.insert(who);
                None
            }
        }
    }

    /// Keys observed, repeats included.
    #[must_use]
    pub const fn observed(&self) -> u64 {
        self.observed
    }

    /// Observations of a key seen before.
    #[must_use]
    pub const fn repeats(&self) -> u64 {
        self.repeats
    }

    /// The first key observed again: the key, the witness of its first observation and that of
    /// the second.
    #[must_use]
    pub fn first_repeat(&self) -> Option<(&K, &W, &W)> {
        let (key, again) = self.first_repeat.as_ref()?;
        let first = self
            .first
            .get(key)
            .expect("a repeated key was observed first");
        Some((key, first, again))
    }

    /// Distinct keys observed.
    #[must_use]
    pub fn distinct(&self) -> u64 {
        debug_assert_eq!(self.first.len() as u64 + self.repeats, self.observed);
        self.first.len() as u64
    }
}

/// A value that was not above the highest of its group before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAbove<'a, V, W> {
    /// The highest value of the group before.
    pub highest: V,
    /// The witness of that value.
    pub highest_by: &'a W,
}

/// Per group, each value above every value observed in the group before it, streaming. A value
/// that is not (a regression) leaves the group's highest as it was, so that every later value
/// is judged against the highest one seen, not the last.
#[derive(Clone, Debug)]
pub struct Rising<G, V, W> {
    highest: HashMap<G, (V, W)>,
    observed: u64,
    regressions: u64,
}

impl<G: Hash + Eq, V, W> Default for Rising<G, V, W> {
    fn default() -> Self {
        Self {
            highest: HashMap::default(),
            observed: 0,
            regressions: 0,
        }
    }
}

impl<G: Hash + Eq, V: Ord + Copy, W> Rising<G, V, W> {
    /// An empty checker.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Observes `value` in `group`, witnessed by `who`. Returns the group's highest value before
    /// and its witness when `value` is not above it (a violation).
    pub fn observe(&mut self, group: G, value: V, who: W) -> Option<NotAbove<'_, V, W>> {
        self.observed += 1;
        match self.highest.entry(group) {
            Entry::Occupied(slot) if value <= slot.get().0 => {
                self.regressions += 1;
                let (highest, highest_by) = slot.into_mut();
                Some(NotAbove {
                    highest: *highest,
                    highest_by,
                })
            }
            Entry::Occupied(mut slot) => {
                debug_assert!(value > slot.get().0);
                slot.insert((value, who));
                None
            }
            Entry::Vacant(slot) => {
                slot.insert((value, who));
                None
            }
        }
    }

    /// Values observed.
    #[must_use]
    pub const fn observed(&self) -> u64 {
        self.observed
    }

    /// Values that were not above their group's highest.
    #[must_use]
    pub const fn regressions(&self) -> u64 {
        self.regressions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_once_fires_on_the_second_observation_and_names_the_first() {
        let mut once = AtMostOnce::new();
        assert_eq!(once.observe(7_u64, "a"), None);
        assert_eq!(once.observe(8, "b"), None);
        assert_eq!(once.observe(7, "c"), Some(&"a"));
        assert_eq!(
            once.observe(7, "d"),
            Some(&"a"),
            "the first witness is kept"
        );
        assert_eq!(
            (once.observed(), once.repeats(), once.distinct()),
            (4, 2, 2)
        );
    }

    #[test]
    fn at_most_once_holds_on_distinct_keys() {
        let mut once = AtMostOnce::new();
        assert!((0..1_000_u64).all(|k| once.observe(k, ()).is_none()));
        assert_eq!((once.repeats(), once.distinct()), (0, 1_000));
        assert_eq!(once.first_repeat(), None);
    }

    #[test]
    fn rising_fires_on_a_value_not_above_the_highest_and_keeps_the_highest() {
        let mut rising = Rising::new();
        assert!(rising.observe("g", 1_u64, 0).is_none());
        assert!(rising.observe("g", 5, 1).is_none());
        let v = rising.observe("g", 3, 2).expect("3 after 5");
        assert_eq!((v.highest, *v.highest_by), (5, 1));
        // Judged against the highest (5), not the last (3).
        assert_eq!(rising.observe("g", 4, 3).map(|v| v.highest), Some(5));
        assert_eq!(
            rising.observe("g", 5, 4).map(|v| v.highest),
            Some(5),
            "equal is no rise"
        );
        assert!(rising.observe("g", 6, 5).is_none());
        assert_eq!((rising.observed(), rising.regressions()), (6, 3));
    }

    #[test]
    fn rising_judges_each_group_apart() {
        let mut rising = Rising::new();
        assert!(rising.observe(1, 10_u64, ()).is_none());
        assert!(
            rising.observe(2, 3, ()).is_none(),
            "another group starts afresh"
        );
        assert!(rising.observe(1, 11, ()).is_none());
        assert!(rising.observe(2, 3, ()).is_some());
    }
}
