//! The (timestamp, sequence) core shared by Snowflake and semantic IDs.
//!
//! It turns the node's wall clock into a strictly increasing series of `(ts, seq)` pairs and
//! decides what to do when the clock misbehaves:
//!
//! - **sequence overflow** within one time unit → wait for the next unit (returned as a decision
//!   with the wall time to retry at, never a sleep);
//! - **clock behind** the last issued unit by at most `rollback_ms_max` (Leaf: 5 ms) → wait;
//!   by more → refuse with [`SequencerError::ClockBehind`], or, in logical-clock mode (a
//!   hybrid logical clock, ID, token and lottery design §2.5), keep issuing from the last unit
//!   and borrow future units up to `borrow_ms_max` (uid-generator's cached mode, sonyflake),
//!   refusing past that;
//! - **time-field exhaustion** (the epoch ran out; uid-generator issue #100) → refuse, never wrap;
//! - **persisted reservations**: before issuing at a unit beyond its reservation, the sequencer
//!   asks the driver to persist a new one (`reserve_ahead_ms` ahead, Leaf's 3 s cadence turned
//!   into a promise). A restarted node (or a new holder of the same worker id) starts strictly
//!   above the persisted reservation, so a backward jump across a restart cannot repeat a
//!   timestamp — Leaf issues #104 and #216 are what happens with an after-the-fact record.
//!
//! Call order: `next(wall_ms)` for each ID; drain `poll_reservation()` and persist it, then
//! `handle_reserved(ts)` (or `handle_reservation_failed()`); on a lost worker lease,
//! `handle_lease_lost()` stops the sequencer for good.

use serde::{Deserialize, Serialize};

use super::edges;
use crate::boundary::{Boundary, Bounded, ClockKind};
use crate::edge::{Edges, Observed};
use crate::flaw::Flaw;

/// What to do when the wall clock is behind the last issued time unit by more than the wait
/// window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RollbackPolicy {
    /// Refuse (Twitter, Leaf beyond 5 ms).
    Refuse,
    /// Keep issuing from the last unit, borrowing future units up to `borrow_ms_max`.
    Logical {
        /// How far ahead of the wall clock the sequencer may run.
        borrow_ms_max: u64,
    },
}

/// Sequencer parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SequencerConfig {
    /// Wall-clock milliseconds at unit 0 (the custom epoch).
    pub epoch_ms: u64,
    /// Length of one time unit (1 ms for Snowflake, 1000 ms for semantic IDs).
    pub unit_ms: u64,
    /// The largest unit the time field holds.
    pub ts_max: u64,
    /// The largest sequence number within one unit.
    pub seq_max: u64,
    /// A backward clock within this bound is waited out (Leaf: 5 ms).
    pub rollback_ms_max: u64,
    /// Beyond the bound.
    pub rollback: RollbackPolicy,
    /// How far ahead each persisted reservation reaches (Leaf writes every 3 s).
    pub reserve_ahead_ms: u64,
    /// A documented flaw to switch on (off by default): [`Flaw::SnowflakeSeqResetFirst`],
    /// [`Flaw::SnowflakeNoPersistedTs`], [`Flaw::TimeFieldNarrow`] or
    /// [`Flaw::SemanticSeqWrap`]; others are ignored here.
    #[serde(default)]
    pub flaw: Option<Flaw>,
}

/// The next step the caller must take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum Step {
    /// Issue an ID from this pair.
    Issue {
        /// Time unit.
        ts: u64,
        /// Sequence within the unit.
        seq: u64,
    },
    /// Retry when the wall clock reads at least `wall_ms` (sequence overflow or a small
    /// rollback).
    WaitUntil {
        /// Wall-clock time to retry at.
        wall_ms: u64,
    },
    /// Retry after the pending reservation is persisted.
    WaitReservation,
}

/// Why no ID can be issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum SequencerError {
    /// The wall clock is before the epoch.
    #[error("wall clock {wall_ms} ms is before the epoch {epoch_ms} ms")]
    BeforeEpoch {
        /// The reading.
        wall_ms: u64,
        /// The epoch.
        epoch_ms: u64,
    },
    /// The clock is behind the last issued (or reserved at start-up) time by more than the
    /// wait window.
    #[error(
        "clock moved backwards: {behind_ms} ms behind the last issued time (wait window {window_ms} ms)"
    )]
    ClockBehind {
        /// How far behind.
        behind_ms: u64,
        /// The wait window.
        window_ms: u64,
    },
    /// Logical-clock mode would have to run further ahead of the wall clock than allowed.
    #[error("logical clock would run {ahead_ms} ms ahead of the wall clock (bound {bound_ms} ms)")]
    BorrowExceeded {
        /// How far ahead it would be.
        ahead_ms: u64,
        /// The bound.
        bound_ms: u64,
    },
    /// The time field is used up: the epoch ran out. Never wrapped.
    #[error("time field exhausted: unit {ts} exceeds the maximum {ts_max}")]
    TimeExhausted {
        /// The unit the clock reached.
        ts: u64,
        /// The field's maximum.
        ts_max: u64,
    },
    /// The worker lease was lost; this sequencer never issues again.
    #[error("worker lease lost: this generator is stopped")]
    LeaseLost,
}

/// Counters for the health view and for fault coverage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SequencerStats {
    /// Pairs issued.
    pub issued: u64,
    /// Waits for a small rollback.
    pub rollback_waits: u64,
    /// Refusals for a large rollback (or before catching up with a reservation).
    pub rollback_refusals: u64,
    /// Pairs issued from a logical (borrowed or held) unit while the clock was behind.
    pub logical_issues: u64,
    /// Waits for sequence overflow.
    pub overflow_waits: u64,
    /// Waits for a reservation to be persisted.
    pub reservation_waits: u64,
}

/// The state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sequencer {
    cfg: SequencerConfig,
    /// The unit of the last pair issued (or the start-up floor).
    pub(super) last_ts: u64,
    /// The sequence of the last pair issued (`seq_max` at start-up: the floor unit is full).
    last_seq: u64,
    /// Persisted: no pair above this unit may be issued.
    pub(super) reserved_ts: u64,
    /// A reservation handed to the driver and not yet acknowledged.
    pub(super) reservation_in_flight: Option<u64>,
    /// A reservation waiting to be polled.
    pub(super) reservation_wanted: Option<u64>,
    stopped: bool,
    stats: SequencerStats,
    /// Arrivals at its edge states since its driver last took them (a ghost: not its state).
    #[serde(skip)]
    edges: Edges,
}

impl Observed for Sequencer {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
}

/// Where the sequencer's decision changes, by the node's wall clock: the first reading at which
/// a clock moved back is refused rather than waited out (`snowflake.rollback_bound`, once it has
/// issued), the first unit above the persisted reservation (`snowflake.reservation_end`), and,
/// for a sequencer that has issued nothing yet, the first reading above its floor
/// (`snowflake.floor`).
impl Bounded for Sequencer {
    fn boundaries(&self, into: &mut Vec<Boundary>) {
        if self.stopped {
            return;
        }
        let wall = |name, at_ms| Boundary {
            name,
            clock: ClockKind::Wall,
            at_ms,
        };
        if self.stats.issued == 0 {
            // A never-used worker id (floor 0) has no floor worth landing on: its first unit
            // is the epoch's.
            if self.last_ts > 0 {
                into.push(wall("snowflake.floor", self.wall_of(self.last_ts + 1)));
            }
        } else {
            // A reading `rollback_ms_max` behind the last unit is the last one waited out.
            let bound = self
                .wall_of(self.last_ts)
                .saturating_sub(self.cfg.rollback_ms_max);
            into.push(wall("snowflake.rollback_bound", bound));
        }
        if self.reserved_ts > 0 {
            into.push(wall(
                "snowflake.reservation_end",
                self.wall_of(self.reserved_ts.saturating_add(1)),
            ));
        }
    }
}

impl Sequencer {
    /// A sequencer that must issue strictly above `floor_ts`: the reservation its worker id
    /// carried in the store (0 for a never-used id).
    #[must_use]
    pub fn new(cfg: SequencerConfig, floor_ts: u64) -> Self {
        debug_assert!(cfg.unit_ms > 0 && cfg.seq_max > 0);
        Self {
            cfg,
            last_ts: floor_ts,
            last_seq: cfg.seq_max,
            reserved_ts: floor_ts,
            reservation_in_flight: None,
            reservation_wanted: None,
            stopped: false,
            stats: SequencerStats::default(),
            edges: Edges::default(),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &SequencerConfig {
        &self.cfg
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> SequencerStats {
        self.stats
    }

    /// The unit of the last pair issued.
    #[must_use]
    pub fn last_ts(&self) -> u64 {
        self.last_ts
    }

    /// The persisted reservation.
    #[must_use]
    pub fn reserved_ts(&self) -> u64 {
        self.reserved_ts
    }

    fn unit_of(&self, wall_ms: u64) -> Result<u64, SequencerError> {
        if wall_ms < self.cfg.epoch_ms {
            return Err(SequencerError::BeforeEpoch {
                wall_ms,
                epoch_ms: self.cfg.epoch_ms,
            });
        }
        Ok((wall_ms - self.cfg.epoch_ms) / self.cfg.unit_ms)
    }

    fn wall_of(&self, ts: u64) -> u64 {
        self.cfg
            .epoch_ms
            .saturating_add(ts.saturating_mul(self.cfg.unit_ms))
    }

    /// Decides the next `(ts, seq)` pair for a wall-clock reading.
    pub fn next(&mut self, wall_ms: u64) -> Result<Step, SequencerError> {
        let step = self.decide_next(wall_ms);
        self.debug_holds();
        step
    }

    fn debug_holds(&self) {
        crate::check::debug_holds("sequencer", || self.check_invariants());
    }

    fn decide_next(&mut self, wall_ms: u64) -> Result<Step, SequencerError> {
        if self.stopped {
            return Err(SequencerError::LeaseLost);
        }
        let now_ts = self.unit_of(wall_ms)?;
        let (ts, seq) = match self.candidate(now_ts, wall_ms)? {
            Ok(pair) => pair,
            Err(wait) => return Ok(wait),
        };
        if self
            .edges
            .reach_if(ts > self.cfg.ts_max, &edges::TIME_FIELD_EXHAUSTED)
            && self.cfg.flaw != Some(Flaw::TimeFieldNarrow)
        {
            return Err(SequencerError::TimeExhausted {
                ts,
                ts_max: self.cfg.ts_max,
            });
        }
        // Ask for the next reservation half-way through the current one, so that steady
        // issuing never waits for the store.
        let ahead_units = (self.cfg.reserve_ahead_ms / self.cfg.unit_ms).max(1);
        if self.cfg.flaw == Some(Flaw::SnowflakeNoPersistedTs) {
            // The flaw (Leaf): the last timestamp is recorded after the fact, once per
            // `reserve_ahead_ms`, and issuing never waits for it.
            if ts >= self.reserved_ts.saturating_add(ahead_units)
                && self.reservation_in_flight.is_none()
                && self.reservation_wanted.is_none()
            {
                self.reservation_wanted = Some(ts);
            }
        } else if ts.saturating_add(ahead_units / 2) > self.reserved_ts {
            let target = if self.cfg.flaw == Some(Flaw::TimeFieldNarrow) {
                ts.saturating_add(ahead_units)
            } else {
                ts.saturating_add(ahead_units).min(self.cfg.ts_max)
            };
            if self
                .reservation_in_flight
                .is_none_or(|pending| pending < ts)
                && self.reservation_wanted.is_none()
            {
                self.reservation_wanted = Some(target);
            }
        }
        if self
            .edges
            .reach_if(ts > self.reserved_ts, &edges::RESERVATION_WAIT)
            && self.cfg.flaw != Some(Flaw::SnowflakeNoPersistedTs)
        {
            self.stats.reservation_waits += 1;
            return Ok(Step::WaitReservation);
        }
        debug_assert!(
            self.cfg.flaw.is_some()
                || ts > self.last_ts
                || (ts == self.last_ts && seq > self.last_seq),
            "pairs must increase"
        );
        self.last_ts = ts;
        self.last_seq = seq;
        self.stats.issued += 1;
        // Counted when issued, not when chosen: a borrowed unit that then waits for its
        // reservation issued nothing.
        self.stats.logical_issues += u64::from(ts > now_ts);
        Ok(Step::Issue { ts, seq })
    }

    /// The pair to issue, or the wait to return, before reservation checks.
    fn candidate(
        &mut self,
        now_ts: u64,
        wall_ms: u64,
    ) -> Result<Result<(u64, u64), Step>, SequencerError> {
        if now_ts > self.last_ts {
            return Ok(Ok((now_ts, 0)));
        }
        // Nothing issued yet: `last_ts` is the floor the worker id's reservation set.
        let fresh = self.stats.issued == 0;
        self.edges
            .reach_if(fresh, &edges::RESTART_BEHIND_RESERVATION);
        self.edges.reach_if(
            fresh && wall_ms.abs_diff(self.wall_of(self.last_ts + 1)) <= 1,
            &edges::RESTART_AT_FLOOR,
        );
        if now_ts < self.last_ts && self.cfg.flaw == Some(Flaw::SnowflakeSeqResetFirst) {
            // The flaw (twitter/snowflake #6): the sequence is reset for the "new" unit before
            // the clock is found to be behind; the last unit's sequence restarts.
            self.last_seq = 0;
        }
        // Same unit, or the clock is behind.
        let behind_ms = self.wall_of(self.last_ts).saturating_sub(wall_ms);
        let next_in_last =
            (self.last_seq < self.cfg.seq_max).then(|| (self.last_ts, self.last_seq + 1));
        if now_ts == self.last_ts {
            if let Some(pair) = next_in_last {
                return Ok(Ok(pair));
            }
            self.edges.reach_if(!fresh, &edges::SEQUENCE_EXHAUSTED);
            if self.cfg.flaw == Some(Flaw::SemanticSeqWrap) {
                // The flaw (ID, token and lottery design §2.3): `seq % capacity` wraps within
                // the unit.
                return Ok(Ok((self.last_ts, 0)));
            }
            // Sequence overflow: wait for the next unit (or borrow it in logical mode).
            if let RollbackPolicy::Logical { .. } = self.cfg.rollback {
                return self.borrow(wall_ms).map(Ok);
            }
            self.stats.overflow_waits += 1;
            return Ok(Err(Step::WaitUntil {
                wall_ms: self.wall_of(self.last_ts + 1),
            }));
        }
        self.edges.reach_if(
            !fresh && behind_ms.abs_diff(self.cfg.rollback_ms_max) <= 1,
            &edges::ROLLBACK_AT_BOUND,
        );
        if self.cfg.flaw == Some(Flaw::SnowflakeRollbackBoundGap)
            && behind_ms == self.cfg.rollback_ms_max
        {
            // The flaw: the wait and the refusal are tested as `<` and `>`, and a clock exactly
            // `rollback_ms_max` behind falls between them, through to the current unit.
            return Ok(Ok((now_ts, 0)));
        }
        if behind_ms <= self.cfg.rollback_ms_max {
            self.edges.reach_if(!fresh, &edges::ROLLBACK_WITHIN_WINDOW);
            self.stats.rollback_waits += 1;
            let resume_ts = if next_in_last.is_some() {
                self.last_ts
            } else {
                self.last_ts + 1
            };
            return Ok(Err(Step::WaitUntil {
                wall_ms: self.wall_of(resume_ts),
            }));
        }
        self.edges.reach_if(!fresh, &edges::ROLLBACK_BEYOND_WINDOW);
        match self.cfg.rollback {
            RollbackPolicy::Refuse => {
                self.stats.rollback_refusals += 1;
                Err(SequencerError::ClockBehind {
                    behind_ms,
                    window_ms: self.cfg.rollback_ms_max,
                })
            }
            RollbackPolicy::Logical { borrow_ms_max } => {
                if let Some(pair) = next_in_last {
                    if behind_ms > borrow_ms_max {
                        self.stats.rollback_refusals += 1;
                        return Err(SequencerError::BorrowExceeded {
                            ahead_ms: behind_ms,
                            bound_ms: borrow_ms_max,
                        });
                    }
                    return Ok(Ok(pair));
                }
                self.borrow(wall_ms).map(Ok)
            }
        }
    }

    /// Logical mode: issue at the unit after the last one, if that stays within the bound.
    fn borrow(&mut self, wall_ms: u64) -> Result<(u64, u64), SequencerError> {
        let RollbackPolicy::Logical { borrow_ms_max } = self.cfg.rollback else {
            unreachable!("borrow is only called in logical mode")
        };
        let ts = self.last_ts + 1;
        let ahead_ms = self.wall_of(ts).saturating_sub(wall_ms);
        if ahead_ms > borrow_ms_max {
            self.stats.rollback_refusals += 1;
            return Err(SequencerError::BorrowExceeded {
                ahead_ms,
                bound_ms: borrow_ms_max,
            });
        }
        Ok((ts, 0))
    }

    /// Asks for a reservation reaching `reserve_ahead_ms` past `wall_ms` when the current one
    /// reaches less than half that far (for generators that must be able to issue when the
    /// store is unreachable, such as degraded mode).
    pub fn reserve_ahead(&mut self, wall_ms: u64) {
        let Ok(now_ts) = self.unit_of(wall_ms) else {
            return;
        };
        let ahead_units = (self.cfg.reserve_ahead_ms / self.cfg.unit_ms).max(1);
        let base = now_ts.max(self.last_ts);
        if base.saturating_add(ahead_units / 2) > self.reserved_ts
            && self.reservation_in_flight.is_none()
            && self.reservation_wanted.is_none()
        {
            self.reservation_wanted = Some(base.saturating_add(ahead_units).min(self.cfg.ts_max));
        }
        self.debug_holds();
    }

    /// Whether a reservation waits to be taken by [`Self::poll_reservation`].
    #[must_use]
    pub const fn wants_reservation(&self) -> bool {
        self.reservation_wanted.is_some()
    }

    /// A reservation the driver must persist (then call [`Self::handle_reserved`]).
    #[must_use]
    pub fn poll_reservation(&mut self) -> Option<u64> {
        let wanted = self.reservation_wanted.take()?;
        self.reservation_in_flight = Some(wanted);
        self.debug_holds();
        Some(wanted)
    }

    /// The store acknowledged a reservation of at least `ts` (it may report a larger one).
    pub fn handle_reserved(&mut self, ts: u64) {
        self.reserved_ts = self.reserved_ts.max(ts);
        if self
            .reservation_in_flight
            .is_some_and(|pending| pending <= ts)
        {
            self.reservation_in_flight = None;
        }
        self.debug_holds();
    }

    /// Persisting failed (store unreachable); a later `next` asks again.
    pub fn handle_reservation_failed(&mut self) {
        self.reservation_in_flight = None;
        self.debug_holds();
    }

    /// The worker lease is gone: never issue again.
    pub fn handle_lease_lost(&mut self) {
        self.stopped = true;
    }

    /// True once the lease was lost.
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Checks the sequencer's invariants: nothing was issued above the persisted reservation
    /// (the promise a restart relies on), the sequence fits its field, and a reservation in
    /// flight or wanted lies above what is already persisted. The documented flaws that break
    /// the first promise on purpose (`snowflake_no_persisted_ts`, `time_field_narrow`) are
    /// exempt from it. For simulators (after every step in debug builds), models and tests.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        let exempt = matches!(
            self.cfg.flaw,
            Some(Flaw::SnowflakeNoPersistedTs | Flaw::TimeFieldNarrow)
        );
        if !exempt && self.last_ts > self.reserved_ts {
            return Err(format!(
                "issued in unit {} above the persisted reservation {}",
                self.last_ts, self.reserved_ts
            ));
        }
        if self.last_seq > self.cfg.seq_max {
            return Err(format!(
                "sequence {} above {}",
                self.last_seq, self.cfg.seq_max
            ));
        }
        if let (Some(wanted), Some(flight)) = (self.reservation_wanted, self.reservation_in_flight)
            && wanted <= flight
            && !exempt
        {
            return Err(format!(
                "wanted reservation {wanted} not above the one in flight {flight}"
            ));
        }
        Ok(())
    }
}
