//! Semantic IDs: `BB` + 10-digit seconds + 3-digit machine + 5-digit sequence (ID, token and
//! lottery design §2.3, docs/sources.md), e.g. `OD171702345612700042`.
//!
//! The design's version takes the machine number from `hash(IP) % 1000` (collisions) and the
//! sequence from `seq % 100000` (wraps within a busy second): both duplicate. Here the machine
//! number is a lease from the store (namespace `semantic`, 1,000 ids) and the sequence is the
//! shared [`Sequencer`] with one-second units and at most 100,000 IDs per second per machine:
//! the 100,001st waits for the next second (or is refused), it never wraps. Clock rollback and
//! persisted reservations behave exactly as for Snowflake.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::edge::{Edges, Observed};

use super::holder::WorkerLeaseHolder;
use super::{RollbackPolicy, Sequencer, SequencerConfig, SequencerError, SnowflakeWorker, Step};
use crate::clock::Now;

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

impl SemanticParts {
    /// The 18 digits as a number: seconds · 10⁸ + machine · 10⁵ + sequence (the IDs of one
    /// business order as their numbers do).
    #[must_use]
    pub fn number(&self) -> u64 {
        debug_assert!(self.seconds <= SECONDS_MAX && self.machine < MACHINE_COUNT);
        debug_assert!(self.seq <= SEQ_MAX);
        self.seconds * 100_000_000 + u64::from(self.machine) * 100_000 + self.seq
    }
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

/// What [`LeasedSemantic::next_id`] decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum LeasedStep {
    /// The ID, and its 18 digits as a number (ordered as the IDs of one business are).
    Id {
        /// `BB` + 18 digits.
        text: String,
        /// The digits: seconds · 10⁸ + machine · 10⁵ + sequence.
        number: u64,
        /// The machine number in it: the worker id the generator was built on.
        machine: u32,
    },
    /// Retry when the wall clock reads `wall_ms`.
    WaitUntil {
        /// When to retry.
        wall_ms: u64,
        /// Why.
        cause: SemanticWait,
    },
    /// Retry once the worker's reservation is persisted (the worker was asked to reserve
    /// further ahead).
    WaitReservation,
    /// No worker lease yet (or it was lost): retry once the holder has one.
    WaitLease,
}

/// Why a semantic ID has to wait for the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SemanticWait {
    /// This second's sequence is used up: the per-second limit (never a wrap).
    SequenceUsedUp,
    /// Nothing issued yet, and the clock is still within the seconds the worker had reserved
    /// when the generator was built (an earlier holder of the worker id may have issued in
    /// them).
    AboveReservation,
    /// The clock stepped back, within the wait window.
    ClockBehind,
}

/// Why [`LeasedSemantic::next_id`] issued nothing and waiting will not help.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum LeasedError {
    /// The business prefix or the leased machine number cannot make a semantic ID.
    #[error(transparent)]
    Config(#[from] SemanticError),
    /// The sequencer refused (a clock behind beyond the window, the lease lost, ...).
    #[error(transparent)]
    Sequencer(#[from] SequencerError),
}

impl Observed for SemanticGenerator {
    fn take_edges(&mut self, into: &mut Edges) {
        self.sequencer.take_edges(into);
    }
}

impl Observed for LeasedSemantic {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.dropped);
        for (_, generator) in self.generators.values_mut() {
            generator.take_edges(into);
        }
    }
}

/// Semantic generators living on a Snowflake worker lease, one per business prefix: the
/// machine number is the worker id, the floor the worker's persisted reservation when the
/// generator is built (every earlier holder's IDs are at or below it), and a generator issues
/// only in seconds the worker has persisted a reservation for (so the next holder's floor is
/// above them). The one binding
/// of semantic IDs to the lease: the server and the simulator both drive it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasedSemantic {
    cfg: SemanticConfig,
    /// Prefix → (machine number it was built on, generator).
    generators: BTreeMap<String, (u32, SemanticGenerator)>,
    /// The arrivals of generators it dropped (a ghost: not its state).
    #[serde(skip)]
    dropped: Edges,
}

/// Most business prefixes one [`LeasedSemantic`] serves (two capital letters).
pub const PREFIXES_MAX: usize = 26 * 26;

/// The boundaries of every generator's sequencer.
impl crate::boundary::Bounded for LeasedSemantic {
    fn boundaries(&self, into: &mut Vec<crate::boundary::Boundary>) {
        for (_, generator) in self.generators.values() {
            generator.sequencer().boundaries(into);
        }
    }
}

impl LeasedSemantic {
    /// Generators configured by `cfg` (its `prefix` is the default business; each call names
    /// its own).
    #[must_use]
    pub fn new(cfg: SemanticConfig) -> Self {
        Self {
            cfg,
            generators: BTreeMap::new(),
            dropped: Edges::default(),
        }
    }

    /// The next ID of business `prefix` on `holder`'s worker at `now`. A generator is built
    /// on first use and again whenever the worker id changed; waits ask the worker to reserve
    /// further ahead when its persisted reservation does not cover the generator's.
    ///
    /// # Errors
    /// A prefix or machine number that cannot make an ID, or the sequencer's refusal (a lost
    /// lease drops every generator).
    pub fn next_id(
        &mut self,
        prefix: &str,
        holder: &mut WorkerLeaseHolder,
        now: Now,
    ) -> Result<LeasedStep, LeasedError> {
        let unleased = holder.config().unleased_ip.is_some();
        let Some(worker) = holder.worker_mut() else {
            self.drop_generators();
            return Ok(LeasedStep::WaitLease);
        };
        let generator = self.generator(prefix, worker, unleased)?;
        let before = generator.sequencer().stats();
        let step = match generator.next_id(now.wall_ms) {
            Ok(step) => step,
            Err(err) => {
                if err == SequencerError::LeaseLost {
                    self.drop_generators();
                }
                return Err(err.into());
            }
        };
        Ok(match step {
            NextSemantic::Id(text) => {
                let parts = parse(&text)?;
                debug_assert_eq!(parts.prefix, prefix);
                LeasedStep::Id {
                    number: parts.number(),
                    machine: parts.machine,
                    text,
                }
            }
            NextSemantic::WaitUntil { wall_ms } => {
                let after = generator.sequencer().stats();
                // A fresh sequencer starts with its floor's unit used up: nothing issued yet
                // is always the floor, whichever path the sequencer took to say so.
                let cause = if after.issued == 0 {
                    SemanticWait::AboveReservation
                } else if after.overflow_waits > before.overflow_waits {
                    SemanticWait::SequenceUsedUp
                } else {
                    SemanticWait::ClockBehind
                };
                upkeep(generator, worker, unleased, now.wall_ms);
                LeasedStep::WaitUntil { wall_ms, cause }
            }
            NextSemantic::WaitReservation => {
                upkeep(generator, worker, unleased, now.wall_ms);
                LeasedStep::WaitReservation
            }
        })
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &SemanticConfig {
        &self.cfg
    }

    /// Drops every generator, keeping their arrivals at edge states.
    fn drop_generators(&mut self) {
        for (_, generator) in self.generators.values_mut() {
            generator.sequencer.take_edges(&mut self.dropped);
        }
        self.generators.clear();
    }

    /// The worker lease was lost: every generator goes with it.
    pub fn handle_lease_lost(&mut self) {
        self.drop_generators();
    }

    /// The generator of `prefix`, if one was built.
    #[must_use]
    pub fn generator_of(&self, prefix: &str) -> Option<&SemanticGenerator> {
        self.generators.get(prefix).map(|(_, g)| g)
    }

    /// Checks every generator's invariants, and that each sits on a machine number it was
    /// built for.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.generators.len() > PREFIXES_MAX {
            return Err(format!("{} generators", self.generators.len()));
        }
        for (prefix, (machine, generator)) in &self.generators {
            if generator.machine != *machine || generator.prefix != *prefix {
                return Err(format!(
                    "generator of {prefix} on machine {machine} is {}'s on {}",
                    generator.prefix, generator.machine
                ));
            }
            generator
                .check_invariants()
                .map_err(|e| format!("{prefix}: {e}"))?;
        }
        Ok(())
    }

    /// The generator of `prefix` on `worker`, built when missing or built on another worker id.
    fn generator(
        &mut self,
        prefix: &str,
        worker: &SnowflakeWorker,
        unleased: bool,
    ) -> Result<&mut SemanticGenerator, SemanticError> {
        let machine = worker.worker_id();
        let current = self
            .generators
            .get(prefix)
            .is_some_and(|(built_on, _)| *built_on == machine);
        if !current {
            // Above every second an earlier holder of the worker id could have issued in (they
            // are within the reservation the lease carried, which the worker's persisted
            // reservation only extends), and above any second a dropped generator of this
            // holder could have. The hash(IP) flaw has no lease.
            let floor_s = if unleased {
                0
            } else {
                reserved_wall_ms(worker) / 1_000
            };
            let cfg = SemanticConfig {
                prefix: prefix.to_owned(),
                ..self.cfg.clone()
            };
            let generator = SemanticGenerator::new(&cfg, machine, floor_s)?;
            if let Some((_, mut old)) = self
                .generators
                .insert(prefix.to_owned(), (machine, generator))
            {
                old.sequencer.take_edges(&mut self.dropped);
            }
        }
        let (_, generator) = self
            .generators
            .get_mut(prefix)
            .expect("inserted above when missing");
        Ok(generator)
    }
}

/// Acknowledges `generator`'s reservation up to what `worker` has persisted, and asks the
/// worker to reserve further ahead when that is not enough.
fn upkeep(
    generator: &mut SemanticGenerator,
    worker: &mut SnowflakeWorker,
    unleased: bool,
    wall_ms: u64,
) {
    let Some(want_s) = generator.poll_reservation() else {
        return;
    };
    if unleased {
        // The hash(IP) flaw has no lease to persist with.
        generator.handle_reserved(want_s);
        return;
    }
    let covered_s = reserved_wall_ms(worker) / 1_000;
    generator.handle_reserved(want_s.min(covered_s));
    if covered_s < want_s {
        generator.handle_reservation_failed();
        worker.reserve_ahead(wall_ms);
    }
}

/// Wall-clock ms up to which `worker`'s persisted reservation reaches.
#[must_use]
pub fn reserved_wall_ms(worker: &SnowflakeWorker) -> u64 {
    let layout = worker.layout();
    layout.epoch_ms.saturating_add(
        worker
            .sequencer()
            .reserved_ts()
            .saturating_mul(layout.unit_ms),
    )
}

#[cfg(test)]
mod leased_tests {
    use super::*;
    use crate::id_store::{IdStore, InstanceId, MemoryIdStore};
    use crate::snowflake::WorkerConfig;
    use crate::snowflake::holder::{HolderConfig, HolderEvent};

    /// 2024-06-01T00:00:00.250Z: a quarter into a second.
    const WALL_MS: u64 = 1_717_200_000_250;

    fn holder(instance: u64) -> WorkerLeaseHolder {
        WorkerLeaseHolder::new(HolderConfig::new(
            "snowflake",
            InstanceId(instance),
            WorkerConfig {
                reserve_ahead_ms: 1_000,
                ..WorkerConfig::default()
            },
            3_000,
            500,
        ))
    }

    fn desk(per_second: u64) -> LeasedSemantic {
        LeasedSemantic::new(SemanticConfig {
            prefix: "OD".into(),
            rollback_ms_max: 0,
            rollback: RollbackPolicy::Refuse,
            reserve_ahead_ms: 1_000,
            per_second,
            flaw: None,
        })
    }

    fn at(offset_ms: u64) -> Now {
        Now {
            wall_ms: WALL_MS + offset_ms,
            mono_ms: offset_ms,
        }
    }

    fn pump(h: &mut WorkerLeaseHolder, store: &mut MemoryIdStore, t: Now) -> Vec<HolderEvent> {
        let mut events = Vec::new();
        while let Some((id, mut call)) = h.poll_request(t) {
            call.set_store_now(t.wall_ms);
            events.push(h.handle_reply(id, call.execute(store), t));
        }
        events
    }

    /// The next step of `prefix` at `t`, performing the store calls the lease asks for.
    fn issue(
        desk: &mut LeasedSemantic,
        h: &mut WorkerLeaseHolder,
        store: &mut MemoryIdStore,
        prefix: &str,
        t: Now,
    ) -> Result<LeasedStep, LeasedError> {
        for _ in 0..8 {
            let _ = pump(h, store, t);
            let step = desk.next_id(prefix, h, t)?;
            if !matches!(step, LeasedStep::WaitLease | LeasedStep::WaitReservation) {
                desk.check_invariants().unwrap();
                return Ok(step);
            }
        }
        panic!("no ID after 8 rounds of store calls");
    }

    fn number(step: &LeasedStep) -> (u64, u32) {
        match step {
            LeasedStep::Id {
                text,
                number,
                machine,
            } => {
                assert_eq!(parse(text).unwrap().number(), *number, "{text}");
                (*number, *machine)
            }
            other => panic!("no ID: {other:?}"),
        }
    }

    #[test]
    fn ids_carry_the_worker_id_and_a_restart_starts_above_the_reservation() {
        let mut store = MemoryIdStore::new();
        let (mut first, mut ids) = (holder(1), desk(100_000));
        let mut seen = Vec::new();
        for ms in 0..5 {
            seen.push(number(
                &issue(&mut ids, &mut first, &mut store, "OD", at(ms)).unwrap(),
            ));
        }
        let worker_id = first.worker().unwrap().worker_id();
        assert!(seen.iter().all(|&(_, machine)| machine == worker_id));
        let reserved_s = reserved_wall_ms(first.worker().unwrap()) / 1_000;
        // The process goes; the next one takes the same worker id in the same second.
        store
            .release_worker("snowflake", worker_id, InstanceId(1))
            .unwrap();
        let (mut second, mut again) = (holder(2), desk(100_000));
        // Still inside what the last holder reserved: refused, never a repeat.
        assert!(matches!(
            issue(&mut again, &mut second, &mut store, "OD", at(6)),
            Err(LeasedError::Sequencer(SequencerError::ClockBehind { .. }))
        ));
        assert_eq!(
            second.worker().unwrap().worker_id(),
            worker_id,
            "reacquired"
        );
        let after_ms = (reserved_s + 1) * 1_000 - WALL_MS;
        let (next, machine) =
            number(&issue(&mut again, &mut second, &mut store, "OD", at(after_ms)).unwrap());
        assert_eq!(machine, worker_id);
        let seconds = |n: u64| n / 100_000_000;
        assert!(
            seconds(next) > reserved_s && seen.iter().all(|&(n, _)| n < next),
            "a restart issues above every second the last holder reserved: {next} after {seen:?}"
        );
    }

    #[test]
    fn the_per_second_limit_waits_for_the_next_second_and_never_wraps() {
        let mut store = MemoryIdStore::new();
        let (mut h, mut ids) = (holder(1), desk(3));
        let mut numbers = Vec::new();
        for ms in 0..3 {
            numbers.push(number(&issue(&mut ids, &mut h, &mut store, "OD", at(ms)).unwrap()).0);
        }
        let fourth = issue(&mut ids, &mut h, &mut store, "OD", at(3)).unwrap();
        let next_second_ms = (WALL_MS / 1_000 + 1) * 1_000;
        assert_eq!(
            fourth,
            LeasedStep::WaitUntil {
                wall_ms: next_second_ms,
                cause: SemanticWait::SequenceUsedUp,
            }
        );
        let later = number(
            &issue(
                &mut ids,
                &mut h,
                &mut store,
                "OD",
                at(next_second_ms - WALL_MS),
            )
            .unwrap(),
        )
        .0;
        assert!(numbers.windows(2).all(|w| w[0] < w[1]) && numbers[2] < later);
        assert_eq!(
            later % 100_000,
            0,
            "the next second starts its sequence at 0"
        );
    }

    #[test]
    fn each_business_has_its_generator_and_a_bad_one_is_refused() {
        let mut store = MemoryIdStore::new();
        let (mut h, mut ids) = (holder(1), desk(100_000));
        let _ = number(&issue(&mut ids, &mut h, &mut store, "OD", at(0)).unwrap());
        // A type's first generator starts above what the worker has reserved by then.
        let reserved_s = reserved_wall_ms(h.worker().unwrap()) / 1_000;
        assert!(matches!(
            issue(&mut ids, &mut h, &mut store, "US", at(1)),
            Err(LeasedError::Sequencer(SequencerError::ClockBehind { .. }))
        ));
        let after = (reserved_s + 1) * 1_000 - WALL_MS;
        let us = issue(&mut ids, &mut h, &mut store, "US", at(after)).unwrap();
        let od = issue(&mut ids, &mut h, &mut store, "OD", at(after)).unwrap();
        // Each business type has its own sequence: both start the second at 0.
        assert_eq!(number(&od).0, number(&us).0);
        assert_eq!(number(&us).0 % 100_000, 0);
        assert!(matches!(&us, LeasedStep::Id { text, .. } if text.starts_with("US")));
        assert_eq!(
            ids.next_id("od", &mut h, at(1)),
            Err(LeasedError::Config(SemanticError::BadPrefix("od".into())))
        );
    }

    #[test]
    fn no_lease_no_id_and_a_lost_lease_drops_the_generators() {
        let mut store = MemoryIdStore::new();
        let (mut h, mut ids) = (holder(1), desk(100_000));
        assert_eq!(ids.next_id("OD", &mut h, at(0)), Ok(LeasedStep::WaitLease));
        let _ = number(&issue(&mut ids, &mut h, &mut store, "OD", at(0)).unwrap());
        assert!(ids.generator_of("OD").is_some());
        ids.handle_lease_lost();
        assert!(ids.generator_of("OD").is_none());
    }
}
