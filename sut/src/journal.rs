//! One journal replay for every write-ahead journal of the reference implementation (the
//! lottery participants' in the server and the simulator, the simulated ID store's and token
//! service's): the durable records, applied in order onto a fresh state, rebuild the state as
//! it was acknowledged. A replay counts no edge state: each record counted its own when it first
//! ran, so the rebuilt state's arrivals are dropped ([`crate::edge::Observed`]).

use crate::edge::Observed;

/// One record of a write-ahead journal.
pub trait Record {
    /// What the records rebuild.
    type State: crate::edge::Observed;

    /// Applies this record to `state` as it was applied the first time. A record the state
    /// refuses changes nothing: it was refused the first time too, and changed nothing then
    /// either. A checkpoint record replaces the state it is applied to.
    fn replay_onto(&self, state: &mut Self::State);
}

/// Replays `records` in order onto `state` (a fresh one, or a checkpoint's).
#[must_use]
pub fn replay<'a, R: Record + 'a>(
    state: R::State,
    records: impl IntoIterator<Item = &'a R>,
) -> R::State {
    let mut state = state;
    for record in records {
        record.replay_onto(&mut state);
    }
    // A replay is no new arrival at any edge state.
    state.take_edges(&mut crate::edge::Edges::new());
    state
}
