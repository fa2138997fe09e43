//! Semantic IDs: `BB` + 10-digit seconds + 3-digit machine + 5-digit sequence (ID, token and
//! lottery design §2.3, docs/sources.md), e.g. `OD171702345612700042`.
//!
//! The design's version takes the machine number from `hash(IP) % 1000` (collisions) and the
//! sequence from `seq % 100000` (wraps within a busy second): both duplicate. Here the machine
//! number is a lease from the store (namespace `semantic`, 1,000 ids) and the sequence is the
//! shared [`Sequencer`] with one-second units and at most 100,000 IDs per second per machine:
//! the 100,001st waits for the next second (or is refused), it never wraps. Clock rollback and
//! persisted reservations behave exactly as for Snowflake.

use serde::{Deserialize, Serialize};

use super::{RollbackPolicy, Sequencer, SequencerConfig, SequencerError, Step};

/// Machine numbers available (3 decimal digits).
pub const MACHINE_COUNT: u32 = 1_000;
/// Largest sequence within one second (5 decimal digits).
pub const SEQ_MAX: u64 = 99_999;
/// Largest second (10 decimal digits: the year 2286).
pub const SECONDS_MAX: u64 = 9_999_999_999;
/// Length of an ID: 2 + 10 + 3 + 5.
pub const ID_LEN: usize = 20;

/// Bad configuration or input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum SemanticError {
    /// The business prefix must be two ASCII capital letters.
    #[error("business prefix `{0}` must be exactly two ASCII capital letters")]
    BadPrefix(String),
    /// The machine number does not fit in three digits.
    #[error("machine number {0} does not fit in three digits")]
    MachineTooLarge(u32),
    /// A string that is not a semantic ID.
    #[error("`{input}` is not a semantic ID: {reason}")]
    Malformed {
        /// The input.
        input: String,
        /// What is wrong.
        reason: String,
    },
}

/// Generator parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SemanticConfig {
    /// Two capital letters: `OD` orders, `US` users, `PM` products.
    pub prefix: String,
    /// A backward clock within this bound is waited out.
    pub rollback_ms_max: u64,
    /// Beyond the bound.
    pub rollback: RollbackPolicy,
    /// Reach of each persisted time reservation.
    pub reserve_ahead_ms: u64,
    /// IDs per second per machine (the design: 100,000, five digits). Smaller values keep the
    /// five-digit format; the simulator shrinks it to reach the overflow at simulated rates.
    #[serde(default = "default_per_second")]
    pub per_second: u64,
    /// A documented flaw to switch on (off by default); see [`SequencerConfig::flaw`].
    #[serde(default)]
    pub flaw: Option<crate::flaw::Flaw>,
}

const fn default_per_second() -> u64 {
    SEQ_MAX + 1
}

/// The parts of a semantic ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SemanticParts {
    /// Business prefix.
    pub prefix: String,
    /// Unix seconds.
    pub seconds: u64,
    /// Machine number.
    pub machine: u32,
    /// Sequence within the second.
    pub seq: u64,
}

/// What `next_id` decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum NextSemantic {
    /// The ID.
    Id(String),
    /// Retry when the wall clock reads `wall_ms` (100,000 issued this second, or a small rollback).
    WaitUntil {
        /// When to retry.
        wall_ms: u64,
    },
    /// Retry once the pending reservation is persisted.
    WaitReservation,
}

/// A semantic-ID generator on one leased machine number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SemanticGenerator {
    prefix: String,
    machine: u32,
    sequencer: Sequencer,
}

impl SemanticGenerator {
    /// A generator for leased machine number `machine` whose lease carried `reserved_ts`
    /// (seconds).
    pub fn new(
        cfg: &SemanticConfig,
        machine: u32,
        reserved_ts: u64,
    ) -> Result<Self, SemanticError> {
        if cfg.prefix.len() != 2 || !cfg.prefix.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(SemanticError::BadPrefix(cfg.prefix.clone()));
        }
        if machine >= MACHINE_COUNT {
            return Err(SemanticError::MachineTooLarge(machine));
        }
        let sequencer = Sequencer::new(
            SequencerConfig {
                epoch_ms: 0,
                unit_ms: 1_000,
                ts_max: SECONDS_MAX,
                seq_max: cfg.per_second.clamp(2, SEQ_MAX + 1) - 1,
                rollback_ms_max: cfg.rollback_ms_max,
                rollback: cfg.rollback,
                reserve_ahead_ms: cfg.reserve_ahead_ms,
                flaw: cfg.flaw,
            },
            reserved_ts,
        );
        Ok(Self {
            prefix: cfg.prefix.clone(),
            machine,
            sequencer,
        })
    }

    /// The next ID for the node's wall clock.
    pub fn next_id(&mut self, wall_ms: u64) -> Result<NextSemantic, SequencerError> {
        Ok(match self.sequencer.next(wall_ms)? {
            Step::Issue { ts, seq } => NextSemantic::Id(format!(
                "{}{ts:010}{:03}{seq:05}",
                self.prefix, self.machine
            )),
            Step::WaitUntil { wall_ms } => NextSemantic::WaitUntil { wall_ms },
            Step::WaitReservation => NextSemantic::WaitReservation,
        })
    }

    /// A reservation (in seconds) to persist.
    #[must_use]
    pub fn poll_reservation(&mut self) -> Option<u64> {
        self.sequencer.poll_reservation()
    }

    /// The store acknowledged a reservation.
    pub fn handle_reserved(&mut self, ts: u64) {
        self.sequencer.handle_reserved(ts);
    }

    /// Persisting failed (or reached less far than asked); a later `next_id` asks again.
    pub fn handle_reservation_failed(&mut self) {
        self.sequencer.handle_reservation_failed();
    }

    /// The time logic.
    #[must_use]
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// Checks the generator's invariants: its machine number fits three digits, and its
    /// sequencer's ([`Sequencer::check_invariants`]).
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.machine >= MACHINE_COUNT {
            return Err(format!(
                "machine {} outside 0..{MACHINE_COUNT}",
                self.machine
            ));
        }
        self.sequencer.check_invariants()
    }
}

/// Splits a semantic ID into its parts.
pub fn parse(input: &str) -> Result<SemanticParts, SemanticError> {
    let malformed = |reason: &str| SemanticError::Malformed {
        input: input.chars().take(64).collect(),
        reason: reason.into(),
    };
    if input.len() != ID_LEN || !input.is_ascii() {
        return Err(malformed("must be 20 ASCII characters"));
    }
    let (prefix, digits) = input.split_at(2);
    if !prefix.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(malformed("must start with two capital letters"));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed("must end with 18 digits"));
    }
    let number = |range: std::ops::Range<usize>| {
        digits[range]
            .parse::<u64>()
            .map_err(|_| malformed("bad digits"))
    };
    Ok(SemanticParts {
        prefix: prefix.to_owned(),
        seconds: number(0..10)?,
        machine: u32::try_from(number(10..13)?).map_err(|_| malformed("bad machine"))?,
        seq: number(13..18)?,
    })
}
