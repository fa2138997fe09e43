//! An ID server's leased identity, as every driver runs it: the Snowflake worker-lease holder
//! and the semantic generators living on its lease ([`LeasedIds`]), and the answer each request
//! for a Snowflake or semantic ID gets ([`IdAnswer`]). `sut-server` and the simulator's ID node
//! both hold a [`LeasedIds`]; neither decides how long a request waits, when a clock behind is a
//! refusal, or what a lost lease means for the semantic generators: that is written here once.
//!
//! A request asks [`LeasedIds::next_snowflake`] or [`LeasedIds::next_semantic`] with how long it
//! has waited so far, and does what the answer says: hand out the ID; wait until a wall-clock
//! time and ask again; perform the holder's store calls ([`LeasedIds::poll_request`]) and ask
//! again; or answer the client "unavailable, retry after" (HTTP 503 with `Retry-After`). The
//! waits a request sits out inside itself are bounded by [`RequestWaits`], per cause and in all.

use serde::{Deserialize, Serialize};

use super::holder::{HolderConfig, HolderEvent, WorkerLeaseHolder};
use super::semantic::{LeasedError, LeasedSemantic, LeasedStep, SemanticConfig, SemanticError};
use super::{NextId, SequencerError};
use crate::clock::Now;
use crate::edge::{Edges, Observed};
use crate::id_store::{StoreCall, StoreReply};

/// How long one request for an ID may wait inside itself before it is answered unavailable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestWaits {
    /// A clock behind the last issued time by more than the sequencer's own rollback window,
    /// and by at most this much (a backward step, or a restart below the reservation the lease
    /// carried), is waited out; further behind is answered unavailable.
    pub clock_behind_ms_max: u64,
    /// A semantic generator's second used up: the next second is waited for only this close;
    /// otherwise the per-second limit is the client's to wait out.
    pub sequence_used_up_ms_max: u64,
    /// A semantic generator's start in the second after the reservation its worker carried
    /// (at most the reservation's reach and one second away).
    pub above_reservation_ms_max: u64,
    /// Most one request waits in all; then it is answered unavailable.
    pub request_ms_max: u64,
}

impl RequestWaits {
    /// The bench's waits: a clock up to 1.5 s behind is waited out, the per-second limit is
    /// waited 10 ms at most, a start above the reservation up to 2 s, and no request waits
    /// longer than 2.5 s.
    pub const DEFAULT: Self = Self {
        clock_behind_ms_max: 1_500,
        sequence_used_up_ms_max: 10,
        above_reservation_ms_max: 2_000,
        request_ms_max: 2_500,
    };
}

impl Default for RequestWaits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A semantic ID handed out.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SemanticId {
    /// `BB` + 18 digits.
    pub text: String,
    /// The digits: seconds · 10⁸ + machine · 10⁵ + sequence.
    pub number: u64,
    /// The machine number in it: the worker id its generator was built on.
    pub machine: u32,
}

/// What a request for one ID gets, or what its driver does first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum IdAnswer<T> {
    /// The ID.
    Id(T),
    /// Wait until the wall clock reads `wall_ms`, then ask again.
    WaitUntil {
        /// When to ask again.
        wall_ms: u64,
    },
    /// Perform the holder's store calls ([`LeasedIds::poll_request`]: a lease, a reservation),
    /// then ask again.
    Drive,
    /// Not now: the client is answered unavailable, to retry after `retry_after_ms`.
    Unavailable {
        /// When a retry can succeed (ms from now; at least 1).
        retry_after_ms: u64,
        /// Why.
        why: WhyUnavailable,
    },
}

/// Why a request for an ID is answered unavailable.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum WhyUnavailable {
    /// The sequencer refused: a clock behind beyond the waits, a lost lease, the epoch.
    #[error(transparent)]
    Sequencer(#[from] SequencerError),
    /// The business prefix or the leased machine number cannot make a semantic ID.
    #[error(transparent)]
    Config(#[from] SemanticError),
    /// This second's sequence is used up ([`RequestWaits::sequence_used_up_ms_max`]).
    #[error("this second's sequence is used up ({per_second} a second)")]
    SequenceUsedUp {
        /// The generator's per-second limit.
        per_second: u64,
    },
    /// The worker has reserved this second already (a start above its reservation).
    #[error("the worker has reserved this second already")]
    AboveReservation,
    /// The clock stepped back further than the waits allow.
    #[error("the clock stepped back")]
    ClockBehind,
    /// The request waited as long as it may ([`RequestWaits::request_ms_max`]).
    #[error("still waiting after {waited_ms} ms, retry")]
    StillWaiting {
        /// How long it waited.
        waited_ms: u64,
    },
}

impl WhyUnavailable {
    /// How far behind the clock was, when that is why.
    #[must_use]
    pub const fn clock_behind_ms(&self) -> Option<u64> {
        match self {
            Self::Sequencer(SequencerError::ClockBehind { behind_ms, .. }) => Some(*behind_ms),
            _ => None,
        }
    }
}

/// The Snowflake worker-lease holder and the semantic generators on its lease. The holder's
/// events reach the generators here: a lost lease drops them, so the next holder's floor
/// rebuilds them (no driver forwards that).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasedIds {
    holder: WorkerLeaseHolder,
    semantic: LeasedSemantic,
    waits: RequestWaits,
}

/// A request retried without waiting (a reservation write of another request in flight)
/// asks again this soon.
const RETRY_SOON_MS: u64 = 1;
/// A refusal that waiting does not cure is retried after this long.
const RETRY_LATER_MS: u64 = 1_000;

impl LeasedIds {
    /// A holder with no lease yet, semantic generators of `semantic` (its `prefix` is the
    /// default business; each request names its own), and `waits`.
    #[must_use]
    pub fn new(holder: HolderConfig, semantic: SemanticConfig, waits: RequestWaits) -> Self {
        Self {
            holder: WorkerLeaseHolder::new(holder),
            semantic: LeasedSemantic::new(semantic),
            waits,
        }
    }

    /// The lease holder (its worker, configuration, lease expiry).
    #[must_use]
    pub const fn holder(&self) -> &WorkerLeaseHolder {
        &self.holder
    }

    /// The semantic generators.
    #[must_use]
    pub const fn semantic(&self) -> &LeasedSemantic {
        &self.semantic
    }

    /// The waits requests sit out.
    #[must_use]
    pub const fn waits(&self) -> RequestWaits {
        self.waits
    }

    /// Whether [`Self::poll_request`] would make a call at `now`.
    #[must_use]
    pub fn wants_call(&self, now: Now) -> bool {
        self.holder.wants_call(now)
    }

    /// The next store call of the holder (see [`WorkerLeaseHolder::poll_request`]).
    pub fn poll_request(&mut self, now: Now) -> Option<(u64, StoreCall)> {
        self.holder.poll_request(now)
    }

    /// The answer to call `id`; a lost lease drops the semantic generators.
    pub fn handle_reply(&mut self, id: u64, reply: StoreReply, now: Now) -> HolderEvent {
        let event = self.holder.handle_reply(id, reply, now);
        self.on_event(&event);
        event
    }

    /// The holder's deadline (see [`WorkerLeaseHolder::poll_timeout`]).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.holder.poll_timeout()
    }

    /// Time passed (see [`WorkerLeaseHolder::handle_timeout`]).
    pub fn handle_timeout(&mut self, now: Now) -> HolderEvent {
        let event = self.holder.handle_timeout(now);
        self.on_event(&event);
        event
    }

    /// Asks the worker to persist a reservation ahead of `now` (background upkeep).
    pub fn reserve_ahead(&mut self, now: Now) {
        if let Some(worker) = self.holder.worker_mut() {
            worker.reserve_ahead(now.wall_ms);
        }
    }

    fn on_event(&mut self, event: &HolderEvent) {
        if *event == HolderEvent::LeaseLost {
            self.semantic.handle_lease_lost();
        }
    }

    /// One Snowflake ID at `now`, for a request that has waited `waited_ms` so far.
    pub fn next_snowflake(&mut self, now: Now, waited_ms: u64) -> IdAnswer<u64> {
        let Some(worker) = self.holder.worker_mut() else {
            // No lease (not acquired yet, or lost): the holder asks for one.
            return self.drive_or_soon(now);
        };
        match worker.next_id(now.wall_ms) {
            Ok(NextId::Id(id)) => IdAnswer::Id(id),
            // Sequence overflow or a step back within the sequencer's own window.
            Ok(NextId::WaitUntil { wall_ms }) => self.wait(now, waited_ms, wall_ms),
            Ok(NextId::WaitReservation) => self.drive_or_soon(now),
            Err(refusal) => self.refused(refusal, now, waited_ms),
        }
    }

    /// One semantic ID of business `prefix` at `now`, for a request that has waited `waited_ms`.
    pub fn next_semantic(
        &mut self,
        prefix: &str,
        now: Now,
        waited_ms: u64,
    ) -> IdAnswer<SemanticId> {
        match self.semantic.next_id(prefix, &mut self.holder, now) {
            Ok(LeasedStep::Id {
                text,
                number,
                machine,
            }) => IdAnswer::Id(SemanticId {
                text,
                number,
                machine,
            }),
            Ok(LeasedStep::WaitUntil { wall_ms, cause }) => {
                use super::semantic::SemanticWait;
                let wait_ms = wall_ms.saturating_sub(now.wall_ms);
                let (limit_ms, why) = match cause {
                    SemanticWait::SequenceUsedUp => (
                        self.waits.sequence_used_up_ms_max,
                        WhyUnavailable::SequenceUsedUp {
                            per_second: self.semantic.config().per_second,
                        },
                    ),
                    SemanticWait::AboveReservation => (
                        self.waits.above_reservation_ms_max,
                        WhyUnavailable::AboveReservation,
                    ),
                    SemanticWait::ClockBehind => {
                        (self.waits.clock_behind_ms_max, WhyUnavailable::ClockBehind)
                    }
                };
                if wait_ms > limit_ms {
                    return unavailable(wait_ms, why);
                }
                self.wait(now, waited_ms, wall_ms)
            }
            Ok(LeasedStep::WaitReservation | LeasedStep::WaitLease) => self.drive_or_soon(now),
            Err(LeasedError::Sequencer(refusal)) => self.refused(refusal, now, waited_ms),
            Err(LeasedError::Config(e)) => unavailable(RETRY_LATER_MS, WhyUnavailable::Config(e)),
        }
    }

    /// A sequencer's refusal: a clock behind within the waits is waited out; a lost lease
    /// drops the semantic generators; anything else is a refusal for now.
    fn refused<T>(&mut self, refusal: SequencerError, now: Now, waited_ms: u64) -> IdAnswer<T> {
        match refusal {
            SequencerError::ClockBehind { behind_ms, .. }
                if behind_ms <= self.waits.clock_behind_ms_max =>
            {
                self.wait(now, waited_ms, now.wall_ms.saturating_add(behind_ms))
            }
            SequencerError::ClockBehind { behind_ms, .. } => {
                unavailable(behind_ms, WhyUnavailable::Sequencer(refusal))
            }
            SequencerError::LeaseLost => {
                self.semantic.handle_lease_lost();
                unavailable(RETRY_LATER_MS, WhyUnavailable::Sequencer(refusal))
            }
            _ => unavailable(RETRY_LATER_MS, WhyUnavailable::Sequencer(refusal)),
        }
    }

    /// Wait until `wall_ms`, unless the request would wait longer in all than it may.
    fn wait<T>(&self, now: Now, waited_ms: u64, wall_ms: u64) -> IdAnswer<T> {
        let wait_ms = wall_ms.saturating_sub(now.wall_ms).max(1);
        if waited_ms.saturating_add(wait_ms) > self.waits.request_ms_max {
            return unavailable(wait_ms, WhyUnavailable::StillWaiting { waited_ms });
        }
        IdAnswer::WaitUntil {
            wall_ms: now.wall_ms.saturating_add(wait_ms),
        }
    }

    /// Perform the holder's calls, unless one is in flight (another request's): then ask again
    /// soon.
    fn drive_or_soon<T>(&self, now: Now) -> IdAnswer<T> {
        let holder = &self.holder;
        if !holder.in_flight() && (holder.worker().is_none() || holder.wants_call(now)) {
            IdAnswer::Drive
        } else {
            IdAnswer::WaitUntil {
                wall_ms: now.wall_ms.saturating_add(RETRY_SOON_MS),
            }
        }
    }

    /// The holder's and the generators' invariants.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.holder
            .check_invariants()
            .map_err(|e| format!("worker-lease holder: {e}"))?;
        self.semantic
            .check_invariants()
            .map_err(|e| format!("semantic generators: {e}"))
    }
}

/// The boundaries of the leased worker's sequencer (none without a lease) and of every
/// semantic generator's.
impl crate::boundary::Bounded for LeasedIds {
    fn boundaries(&self, into: &mut Vec<crate::boundary::Boundary>) {
        if let Some(worker) = self.holder.worker() {
            worker.sequencer().boundaries(into);
        }
        self.semantic.boundaries(into);
    }
}

impl Observed for LeasedIds {
    fn take_edges(&mut self, into: &mut Edges) {
        self.holder.take_edges(into);
        self.semantic.take_edges(into);
    }
}

/// Unavailable for now, to retry after `retry_after_ms` (at least 1).
fn unavailable<T>(retry_after_ms: u64, why: WhyUnavailable) -> IdAnswer<T> {
    IdAnswer::Unavailable {
        retry_after_ms: retry_after_ms.max(1),
        why,
    }
}

#[cfg(test)]
mod tests;
