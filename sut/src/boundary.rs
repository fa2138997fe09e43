//! Decision boundaries: the instants at which a state machine's answer to the same request
//! changes, declared by the machine itself.
//!
//! A comparison of a clock with a bound (a lease's expiry less its drift margin, a token's
//! expiry plus its leeway, the window within which a clock that moved back is waited out, the
//! end of a persisted reservation) changes an outcome only when a clock reads within a
//! millisecond or so of that bound. A nemesis that steps clocks by random amounts lands there by
//! luck; FCatch (ASPLOS '18) finds time-of-fault bugs by faulting at the points where outcomes
//! change. A machine that implements [`Bounded`] says where its points are, from its current
//! state, so that a driver can land a clock step exactly before, at or after one of them.
//! Nothing here changes a decision: the machines decide as before, and a boundary is only
//! information.

/// Which clock a boundary is read on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClockKind {
    /// The node's wall clock ([`crate::clock::Now::wall_ms`]): a clock step can land on it.
    Wall,
    /// The node's monotonic clock ([`crate::clock::Now::mono_ms`]): only the passing of time
    /// (a pause of the node) can land on it.
    Mono,
}

/// One instant at which a machine's decision changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Boundary {
    /// What changes there (`snowflake.rollback_bound`, ...).
    pub name: &'static str,
    /// The clock it is read on.
    pub clock: ClockKind,
    /// The first reading (ms) at which the decision is the one after the boundary.
    pub at_ms: u64,
}

/// A machine that declares its decision boundaries.
pub trait Bounded {
    /// Appends the boundaries of the machine's current state to `into`.
    fn boundaries(&self, into: &mut Vec<Boundary>);
}
