//! Snowflake IDs that survive clock jumps, and the semantic IDs of the ID, token and lottery
//! design (docs/sources.md) done right.
//!
//! A Snowflake ID packs `time | worker | sequence` into the low 63 bits of a `u64` (default:
//! 41 bits of milliseconds since a custom epoch, 10 bits of worker id, 12 bits of sequence —
//! Twitter's layout, 4,096 IDs per millisecond per worker). The layout is configurable and
//! checked: the fields must fit in 63 bits, the epoch must not lie in the future.
//!
//! Worker ids come from a lease in the store ([`crate::id_store::IdStore::acquire_worker`]), never
//! from a hash of the IP (the `hash(IP) % 1000` of the ID, token and lottery design §2.3
//! collides). The time logic — waits, rollback policies, reservations, exhaustion — lives in
//! [`Sequencer`], shared with [`semantic`].

pub mod holder;
pub mod leased;
pub mod semantic;
mod sequencer;

pub use sequencer::{
    RollbackPolicy, Sequencer, SequencerConfig, SequencerError, SequencerStats, Step,
};

use serde::{Deserialize, Serialize};

use crate::edge::Observed;

/// The Snowflake and semantic generators' edge states (see [`crate::edge`]): the sequencer's
/// ([`Sequencer`]) and the worker-lease holder's ([`holder::WorkerLeaseHolder`]).
pub mod edges {
    use crate::edge::{Edge, Machine};

    /// [`super::Sequencer::next`]: the unit's sequence is used up.
    pub const SEQUENCE_EXHAUSTED: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.sequence_exhausted",
        "every sequence number of the current time unit has been issued and the clock is still \
         in it: the next ID must wait for the next unit, never wrap (semantic_seq_wrap)",
    );
    /// [`super::Sequencer::next`]: the clock is behind the last issued unit, within the window.
    pub const ROLLBACK_WITHIN_WINDOW: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.rollback_within_window",
        "the clock moved back behind the last issued unit by no more than rollback_ms_max: the \
         generator waits it out and must resume with the old unit's sequence, not a reset one \
         (snowflake_seq_reset_first)",
    );
    /// [`super::Sequencer::next`]: the clock is behind the last issued unit, beyond the window.
    pub const ROLLBACK_BEYOND_WINDOW: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.rollback_beyond_window",
        "the clock moved back behind the last issued unit by more than rollback_ms_max: the \
         generator must refuse (or borrow within its bound), never issue from the past",
    );
    /// [`super::Sequencer::next`]: a fresh sequencer's clock is at or behind its floor.
    pub const RESTART_BEHIND_RESERVATION: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.restart_behind_reservation",
        "a freshly started generator's clock is at or behind the reservation its worker id \
         carried from a previous holder: only that persisted floor keeps it from repeating the \
         predecessor's timestamps (snowflake_no_persisted_ts, Leaf #104/#216)",
    );
    /// [`super::Sequencer::next`]: the clock is behind the last issued unit by the wait window,
    /// give or take a millisecond.
    pub const ROLLBACK_AT_BOUND: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.rollback_at_bound",
        "the clock moved back behind the last issued unit by rollback_ms_max give or take 1 ms: \
         the reading where waiting it out turns into refusing, which only a clock landed on the \
         bound reaches (snowflake_rollback_bound_gap)",
    );
    /// [`super::Sequencer::next`]: a fresh sequencer's clock reads its floor, give or take a
    /// millisecond.
    pub const RESTART_AT_FLOOR: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.restart_at_floor",
        "a freshly started generator's clock reads the first instant above its persisted floor, \
         give or take 1 ms: the reading where refusing or waiting turns into issuing",
    );
    /// [`super::Sequencer::next`]: the unit to issue lies beyond the persisted reservation.
    pub const RESERVATION_WAIT: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.reservation_wait",
        "the next ID's time unit lies beyond the persisted reservation: the generator is between \
         choosing a time and making it durable, and must not issue until the store acknowledges",
    );
    /// [`super::Sequencer::next`]: the time unit passed the time field's end.
    pub const TIME_FIELD_EXHAUSTED: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.time_field_exhausted",
        "the clock passed the last time unit the layout's time field can hold (the epoch ran \
         out): IDs must be refused, never wrapped (time_field_narrow)",
    );
    /// [`super::holder::WorkerLeaseHolder::handle_reply`]: a lease on a used worker id.
    pub const WORKER_REACQUIRED: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.worker_reacquired",
        "a starting holder leases a worker id that an earlier holder used (its lease carries a \
         reservation): two processes share the id over time, and the new one must start above \
         the old one's reservation (machine_id_hash_ip shares ids without a lease)",
    );
    /// [`super::holder::WorkerLeaseHolder::handle_reply`]: the store says the lease is gone.
    pub const WORKER_LEASE_LOST: Edge = Edge::new(
        Machine::Snowflake,
        "snowflake.worker_lease_lost",
        "the store answers that this holder's worker lease is gone (another instance took the \
         id after it expired): the worker must stop for good before the new holder's IDs \
         collide with its own",
    );
}

/// This machine's edge states (see [`crate::edge`]).
pub const EDGES: &[crate::edge::Edge] = &[
    edges::SEQUENCE_EXHAUSTED,
    edges::ROLLBACK_WITHIN_WINDOW,
    edges::ROLLBACK_BEYOND_WINDOW,
    edges::ROLLBACK_AT_BOUND,
    edges::RESTART_BEHIND_RESERVATION,
    edges::RESTART_AT_FLOOR,
    edges::RESERVATION_WAIT,
    edges::TIME_FIELD_EXHAUSTED,
    edges::WORKER_REACQUIRED,
    edges::WORKER_LEASE_LOST,
];

/// Bit layout of a Snowflake ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Bits of time units since the epoch.
    pub time_bits: u8,
    /// Bits of worker id.
    pub worker_bits: u8,
    /// Bits of sequence.
    pub seq_bits: u8,
    /// Wall-clock milliseconds at time unit 0.
    pub epoch_ms: u64,
    /// Milliseconds per time unit (Sonyflake uses 10).
    pub unit_ms: u64,
}

impl Default for Layout {
    /// Twitter's layout with the epoch 2020-01-01T00:00:00Z.
    fn default() -> Self {
        Self {
            time_bits: 41,
            worker_bits: 10,
            seq_bits: 12,
            epoch_ms: 1_577_836_800_000,
            unit_ms: 1,
        }
    }
}

/// A layout that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum LayoutError {
    /// A field has no bits (or the time field too few to be useful).
    #[error("layout field `{field}` must have at least {min} bits, has {bits}")]
    FieldTooNarrow {
        /// The field.
        field: String,
        /// Its width.
        bits: u8,
        /// The minimum.
        min: u8,
    },
    /// The fields do not fit in the 63 bits below the sign bit (or below the degraded flag).
    #[error(
        "layout bits do not add up: time {time} + worker {worker} + sequence {seq} = {total} > {limit}"
    )]
    TooWide {
        /// Time bits.
        time: u8,
        /// Worker bits.
        worker: u8,
        /// Sequence bits.
        seq: u8,
        /// Their sum.
        total: u16,
        /// The bits available.
        limit: u8,
    },
    /// A time unit of zero milliseconds.
    #[error("layout unit_ms must be at least 1")]
    ZeroUnit,
    /// The epoch is later than the node's clock at start-up.
    #[error("epoch {epoch_ms} ms is in the future (the clock reads {wall_ms} ms)")]
    EpochInFuture {
        /// The epoch.
        epoch_ms: u64,
        /// The clock.
        wall_ms: u64,
    },
    /// The worker id does not fit the worker field.
    #[error("worker id {worker_id} does not fit in {bits} bits")]
    WorkerTooLarge {
        /// The id.
        worker_id: u32,
        /// The field's width.
        bits: u8,
    },
}

/// The parts of a Snowflake ID (Leaf's `/decodeSnowflakeId`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Decoded {
    /// Wall-clock milliseconds of the ID's time unit.
    pub time_ms: u64,
    /// Time units since the epoch.
    pub ts: u64,
    /// Worker id.
    pub worker: u64,
    /// Sequence.
    pub seq: u64,
}

impl Layout {
    /// Checks the layout against `bits_available` (63 normally, 62 under the degraded flag).
    pub fn validate(&self, bits_available: u8) -> Result<(), LayoutError> {
        for (field, bits, min) in [
            ("time_bits", self.time_bits, 8),
            ("worker_bits", self.worker_bits, 1),
            ("seq_bits", self.seq_bits, 1),
        ] {
            if bits < min {
                return Err(LayoutError::FieldTooNarrow {
                    field: field.to_owned(),
                    bits,
                    min,
                });
            }
        }
        let total =
            u16::from(self.time_bits) + u16::from(self.worker_bits) + u16::from(self.seq_bits);
        if total > u16::from(bits_available) {
            return Err(LayoutError::TooWide {
                time: self.time_bits,
                worker: self.worker_bits,
                seq: self.seq_bits,
                total,
                limit: bits_available,
            });
        }
        if self.unit_ms == 0 {
            return Err(LayoutError::ZeroUnit);
        }
        Ok(())
    }

    /// Largest time unit.
    #[must_use]
    pub fn ts_max(&self) -> u64 {
        (1u64 << self.time_bits) - 1
    }

    /// Number of worker ids.
    #[must_use]
    pub fn worker_count(&self) -> u32 {
        u32::try_from(1u64 << self.worker_bits).unwrap_or(u32::MAX)
    }

    /// Largest sequence.
    #[must_use]
    pub fn seq_max(&self) -> u64 {
        (1u64 << self.seq_bits) - 1
    }

    /// Packs the parts (each must fit its field).
    #[must_use]
    pub fn compose(&self, ts: u64, worker: u64, seq: u64) -> u64 {
        debug_assert!(
            ts <= self.ts_max() && worker < u64::from(self.worker_count()) && seq <= self.seq_max()
        );
        (ts << (self.worker_bits + self.seq_bits)) | (worker << self.seq_bits) | seq
    }

    /// Unpacks an ID (bits above the layout are ignored: a degraded flag, for instance).
    #[must_use]
    pub fn decode(&self, id: u64) -> Decoded {
        let seq = id & self.seq_max();
        let worker = (id >> self.seq_bits) & (u64::from(self.worker_count()) - 1);
        let ts = (id >> (self.worker_bits + self.seq_bits)) & self.ts_max();
        Decoded {
            time_ms: self
                .epoch_ms
                .saturating_add(ts.saturating_mul(self.unit_ms)),
            ts,
            worker,
            seq,
        }
    }
}

/// FLAW [`crate::flaw::Flaw::MachineIdHashIp`] (ID, token and lottery design §2.3): the
/// machine id as `hash(IP) % 1000`, with Java's `String.hashCode` of the dotted address.
/// Distinct hosts collide (the birthday bound: about 1 in 2 among 38 hosts); the correct path
/// leases worker ids from the store instead.
#[must_use]
pub fn machine_id_from_ip(ip: [u8; 4]) -> u32 {
    let text = format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]);
    let hash = text
        .bytes()
        .fold(0_i32, |h, b| h.wrapping_mul(31).wrapping_add(i32::from(b)));
    hash.unsigned_abs() % 1_000
}

/// Worker behaviour beyond the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// Bit layout.
    pub layout: Layout,
    /// A backward clock within this bound is waited out (Leaf: 5 ms).
    pub rollback_ms_max: u64,
    /// Beyond the bound.
    pub rollback: RollbackPolicy,
    /// Reach of each persisted time reservation (Leaf writes every 3 s).
    pub reserve_ahead_ms: u64,
    /// A documented flaw to switch on (off by default); see [`SequencerConfig::flaw`]. With
    /// [`crate::flaw::Flaw::TimeFieldNarrow`] the time unit is masked into the field.
    #[serde(default)]
    pub flaw: Option<crate::flaw::Flaw>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            layout: Layout::default(),
            rollback_ms_max: 5,
            rollback: RollbackPolicy::Refuse,
            reserve_ahead_ms: 3_000,
            flaw: None,
        }
    }
}

/// What `next_id` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum NextId {
    /// The ID.
    Id(u64),
    /// Retry when the wall clock reads `wall_ms` (sequence overflow, a small rollback).
    WaitUntil {
        /// When to retry.
        wall_ms: u64,
    },
    /// Retry once the pending time reservation has been persisted.
    WaitReservation,
}

impl Observed for SnowflakeWorker {
    fn take_edges(&mut self, into: &mut crate::edge::Edges) {
        self.sequencer.take_edges(into);
    }
}

/// A Snowflake worker: one leased worker id issuing IDs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnowflakeWorker {
    layout: Layout,
    worker_id: u32,
    sequencer: Sequencer,
    /// OR-ed into every ID (the degraded-mode flag of segment allocators).
    flag: u64,
}

impl SnowflakeWorker {
    /// A worker for a leased id. `reserved_ts` is the reservation the lease carried
    /// ([`crate::id_store::WorkerLease::reserved_ts`]); `wall_ms` is the clock at start-up.
    pub fn new(
        cfg: WorkerConfig,
        worker_id: u32,
        reserved_ts: u64,
        wall_ms: u64,
    ) -> Result<Self, LayoutError> {
        Self::with_flag(cfg, worker_id, reserved_ts, wall_ms, 0, 63)
    }

    /// As [`Self::new`], with `flag` OR-ed into every ID and the layout limited to `bits`.
    pub(crate) fn with_flag(
        cfg: WorkerConfig,
        worker_id: u32,
        reserved_ts: u64,
        wall_ms: u64,
        flag: u64,
        bits: u8,
    ) -> Result<Self, LayoutError> {
        let layout = cfg.layout;
        layout.validate(bits)?;
        if layout.epoch_ms > wall_ms {
            return Err(LayoutError::EpochInFuture {
                epoch_ms: layout.epoch_ms,
                wall_ms,
            });
        }
        if worker_id >= layout.worker_count() {
            return Err(LayoutError::WorkerTooLarge {
                worker_id,
                bits: layout.worker_bits,
            });
        }
        let sequencer = Sequencer::new(
            SequencerConfig {
                epoch_ms: layout.epoch_ms,
                unit_ms: layout.unit_ms,
                ts_max: layout.ts_max(),
                seq_max: layout.seq_max(),
                rollback_ms_max: cfg.rollback_ms_max,
                rollback: cfg.rollback,
                reserve_ahead_ms: cfg.reserve_ahead_ms,
                flaw: cfg.flaw,
            },
            reserved_ts,
        );
        Ok(Self {
            layout,
            worker_id,
            sequencer,
            flag,
        })
    }

    /// The next ID for the node's wall clock `wall_ms`.
    pub fn next_id(&mut self, wall_ms: u64) -> Result<NextId, SequencerError> {
        Ok(match self.sequencer.next(wall_ms)? {
            Step::Issue { ts, seq } => {
                // Only the time-field flaw lets `ts` pass the field's end: it is masked, as an
                // unchecked shift-and-or would.
                let ts = ts & self.layout.ts_max();
                NextId::Id(self.flag | self.layout.compose(ts, u64::from(self.worker_id), seq))
            }
            Step::WaitUntil { wall_ms } => NextId::WaitUntil { wall_ms },
            Step::WaitReservation => NextId::WaitReservation,
        })
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The worker id.
    #[must_use]
    pub fn worker_id(&self) -> u32 {
        self.worker_id
    }

    /// The time logic (stats, reservation state).
    #[must_use]
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// A time reservation to persist (`IdStore::renew_worker` with it as `reserve_ts`).
    #[must_use]
    pub fn poll_reservation(&mut self) -> Option<u64> {
        self.sequencer.poll_reservation()
    }

    /// The store acknowledged a reservation.
    pub fn handle_reserved(&mut self, ts: u64) {
        self.sequencer.handle_reserved(ts);
    }

    /// Keeps the persisted reservation ahead of the clock (see [`Sequencer::reserve_ahead`]).
    pub fn reserve_ahead(&mut self, wall_ms: u64) {
        self.sequencer.reserve_ahead(wall_ms);
    }

    /// Persisting a reservation failed.
    pub fn handle_reservation_failed(&mut self) {
        self.sequencer.handle_reservation_failed();
    }

    /// The worker lease is gone: stop for good.
    pub fn handle_lease_lost(&mut self) {
        self.sequencer.handle_lease_lost();
    }

    /// Checks the worker's invariants: its id fits the layout, and its sequencer's
    /// ([`Sequencer::check_invariants`]).
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.worker_id >= self.layout.worker_count() {
            return Err(format!(
                "worker id {} outside the layout's {} ids",
                self.worker_id,
                self.layout.worker_count()
            ));
        }
        self.sequencer.check_invariants()
    }
}

#[cfg(test)]
mod tests;
