//! BUGGIFY (FoundationDB's name for it): per seed, knobs that make the protocols' rare paths
//! common. Random faults at random times rarely land where a protocol is fragile: at a lease's
//! margin, between a durable write and the message that depends on it, when a retry budget
//! runs out. A buggified seed moves the system there on purpose:
//!
//! - **timers and budgets shrunk** within their valid ranges: the coordinator's reply timeout,
//!   attempts, backoff cap, park delay and compensation retries; the compensation wheel's tick
//!   (coarse) and shape (few slots and levels, so that tasks cascade and overflow); the segment
//!   lease at a small multiple of the drift margin, prefetching late, short store timeouts;
//!   the Snowflake reservation reach; the token service's table bounds (so that tables fill)
//!   and JWT lifetime (so that tokens expire and revocations are purged within a run);
//!   balances that buy only a few draws (so that wallets reach exactly zero);
//! - **clocks at their bounds**: drift at its configured bound instead of anywhere below it; a
//!   clock bump of the token node back by about the JWT leeway (just within, or just past it);
//!   a clock bump of an ID node landed a millisecond before, at or after one of its generators'
//!   decision boundaries (`sut::boundary`: the rollback bound, the reservation's end, a fresh
//!   generator's floor), at its next ID decision, and an ID node restarted with its clock
//!   stepped back landed at its new generator's persisted floor;
//! - **a crash placed at a durable step** ([`CrashSite`]): on a node with a log, just before a
//!   group commit's fsync (what was sent already went, what was appended is lost) or just after
//!   it (the log is durable, the answers and messages it releases are not yet out) — only in
//!   seeds whose fault kinds include `kill`;
//! - **stragglers**: messages of one class (a TCC phase, a participant's reply, a store call)
//!   now and then held back past the deadline their sender waits on, so that a Cancel overtakes
//!   its Try and a store call answers after its caller gave up.
//!
//! Everything is drawn once per seed from a generator of its own seeded by the seed
//! ([`Buggify::for_seed`]), so a seed replays its BUGGIFY exactly, and drawing it takes nothing
//! from the run's RNG: a knob added here, or `--no-buggify`, leaves every seed's fault schedule
//! and workload as they were. `[run] buggify = false` or `--no-buggify` turns it off. The knobs
//! that act during the run (stragglers, the token clock bumps) draw from the run's RNG when
//! they are on. Nothing
//! here changes a protocol: the drivers hand the state machines other (valid) configurations
//! and other timings.

use madsim::rand::Rng;
use serde::{Deserialize, Serialize};
use sut::lottery::wheel::WheelConfig;
use sut::lottery::{CoordinatorConfig, Phase};
use sut::segment::AllocatorConfig;
use sut::snowflake::WorkerConfig;

use crate::scenario::{FaultKind, Scenario};

/// Where a placed crash strikes, relative to a node's durable step (its log's fsync).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CrashSite {
    /// Records appended, the fsync not yet begun: messages sent before it already left; the
    /// records are lost.
    BeforeSync,
    /// The fsync done: the records are durable; the answers and messages waiting for them are
    /// not sent.
    AfterSync,
}

impl CrashSite {
    /// A short name for reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::BeforeSync => "before its log sync",
            Self::AfterSync => "after its log sync, before the answers",
        }
    }
}

/// A crash placed at a durable step of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashPoint {
    /// The node (one with a log: `coord`, `wallet`, `inventory`, `token`, `db`).
    pub node: String,
    /// Where.
    pub site: CrashSite,
    /// At which arrival at the site the crash comes (1 = the first).
    pub nth: u64,
    /// How long the node stays down.
    pub down_ms: u64,
}

/// A class of messages that may straggle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StragglerClass {
    /// Coordinator → participant messages of one phase.
    Tcc(Phase),
    /// Participant → coordinator replies.
    TccReply,
    /// ID node → database store calls.
    Store,
}

/// Messages of one class held back now and then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stragglers {
    /// Which messages.
    pub class: StragglerClass,
    /// Per message of the class, the chance in parts per million that it is held back.
    pub ppm: u32,
    /// How long it is held back (past the deadline its sender waits on).
    pub delay_ms: u64,
}

/// The compensation wheel's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WheelKnobs {
    /// Tick, ms (firing is late by up to one tick).
    pub tick_ms: u64,
    /// Slots per level.
    pub slots_per_level: u32,
    /// Levels.
    pub levels: u8,
    /// Wait before the first retry round, ms (doubling per failed round).
    pub backoff_base_ms: u64,
    /// Longest wait between rounds, ms.
    pub backoff_cap_ms: u64,
}

/// The longest wait between compensation rounds in a buggified wheel: short enough that a round
/// comes soon after the faults heal (the liveness phase is 8 s by default).
const WHEEL_BACKOFF_CAP_MS: u64 = 1_000;

/// One seed's BUGGIFY. `None` fields leave the driver's configuration as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buggify {
    /// The coordinator's reply timeout (first attempt), ms.
    pub reply_timeout_ms: Option<u64>,
    /// The coordinator's attempts per message.
    pub attempts_max: Option<u32>,
    /// The coordinator's backoff cap, ms.
    pub backoff_ms_max: Option<u64>,
    /// How long a parked draw waits before its first compensation round, ms.
    pub park_delay_ms: Option<u64>,
    /// Compensation rounds that may run out of attempts before a dead letter.
    pub compensation_retries_max: Option<u32>,
    /// The compensation wheel's shape and backoff.
    pub wheel: Option<WheelKnobs>,
    /// The segment lease, ms (above twice the drift margin).
    pub lease_ms: Option<u64>,
    /// When the next segment is loaded, as a percentage of the current one used.
    pub prefetch_used_pct: Option<u8>,
    /// The ID nodes' store-call timeout, ms.
    pub store_timeout_ms: Option<u64>,
    /// The Snowflake reservation reach, ms.
    pub reserve_ahead_ms: Option<u64>,
    /// Each user's balance buys exactly this many draws (the wallet's `balance >= price` bound).
    pub balance_draws: Option<u64>,
    /// The token service's table bounds (revocations and one-time tokens), so that tables fill.
    pub token_rows_max: Option<u64>,
    /// The JWT lifetime in seconds, so that tokens expire and their revocations are purged
    /// within a run.
    pub jwt_ttl_s: Option<u64>,
    /// Clock drift is drawn at `[faults] drift_ppm_max` exactly.
    pub drift_at_bound: bool,
    /// A clock bump of the token node goes back by about the JWT leeway (just within it or
    /// just past it), where "not yet valid" begins.
    pub bump_at_leeway: bool,
    /// The seed's clock bumps of ID nodes land at a decision boundary of the node's
    /// generators (`sut::boundary`), a millisecond before, at or after it, at the node's next
    /// ID decision, rather than at a random offset (FCatch-style); an ID node restarted with its
    /// clock stepped back lands at its generator's persisted floor.
    #[serde(default)]
    pub clock_at_boundary: bool,
    /// A crash placed at a durable step.
    pub crash: Option<CrashPoint>,
    /// Messages held back past their deadline.
    pub stragglers: Option<Stragglers>,
}

/// The nodes that keep a log (where a crash can be placed at a durable step).
const LOGGED_NODES: [&str; 5] = ["coord", "wallet", "inventory", "token", "db"];

impl Buggify {
    /// Seed `seed`'s BUGGIFY, from a generator seeded by the seed alone.
    #[must_use]
    pub fn for_seed(seed: u64, scenario: &Scenario, faults: &[(FaultKind, u32)]) -> Self {
        use rand::SeedableRng;
        // A constant apart, so that BUGGIFY's stream is not the run's own stream again.
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xB066_1F1E_D5EE_D000);
        Self::draw(&mut rng, scenario, faults)
    }

    /// This seed's BUGGIFY for `scenario` with the fault kinds the seed enabled: off for a
    /// scenario that turns it off; otherwise on in three seeds out of four, each knob family
    /// then on in one seed out of two.
    pub fn draw(rng: &mut impl Rng, scenario: &Scenario, faults: &[(FaultKind, u32)]) -> Self {
        if !scenario.run.buggify || !rng.gen_bool(0.75) {
            return Self::default();
        }
        let mut b = Self::default();
        let coord = CoordinatorConfig::default();
        if rng.gen_bool(0.5) {
            // The last attempt's timeout (`timeout << (attempts - 1)`) stays above the round
            // trip of a healed network (two sends of at most 10 ms plus an fsync), so that a
            // healed draw can still finish: the knobs shrink the budget to its edge, not past it.
            let timeout = [20, 40, 60][rng.gen_range(0..3)];
            b.reply_timeout_ms = Some(timeout);
            b.attempts_max = Some(rng.gen_range(2..=4));
            b.backoff_ms_max = Some(rng.gen_range(timeout * 2..=timeout * 8));
            b.park_delay_ms = Some(rng.gen_range(10..=coord.park_delay_ms));
        }
        if rng.gen_bool(0.5) {
            // Coarse ticks fire late; 2–4 slots and 1–2 levels make every longer wait cascade
            // or overflow; a small backoff base makes many short compensation rounds.
            let base_ms = [10, 30, 100][rng.gen_range(0..3)];
            b.wheel = Some(WheelKnobs {
                tick_ms: [5, 20, 50][rng.gen_range(0..3)],
                slots_per_level: rng.gen_range(2..=4),
                levels: rng.gen_range(1..=2),
                backoff_base_ms: base_ms,
                backoff_cap_ms: WHEEL_BACKOFF_CAP_MS,
            });
            // Either a budget that runs out under the faults (the draw is dead-lettered, and
            // the operator retries it once the faults have healed), or the fewest rounds that
            // outlast every fault (the budget's edge from the other side).
            b.compensation_retries_max = Some(if rng.gen_bool(0.5) {
                rng.gen_range(0..=2)
            } else {
                // A draw parked at any time of the safety phase then still has a round left
                // once every fault has healed, and is never dead-lettered.
                let backoff = sut::lottery::wheel::WheelConfig {
                    backoff_base_ms: base_ms,
                    backoff_cap_ms: WHEEL_BACKOFF_CAP_MS,
                    ..sut::lottery::wheel::WheelConfig::default()
                };
                backoff.retries_to_outlast(scenario.run.safety_ms + scenario.faults.down_ms.max_ms)
            });
        }
        let ids = &scenario.ids;
        if rng.gen_bool(0.5) {
            let floor = 2 * ids.drift_ms_max + 1;
            b.lease_ms = Some(rng.gen_range(floor..=ids.lease_ms.max(floor)));
            b.prefetch_used_pct = Some([90, 100][rng.gen_range(0..2)]);
            // Above a healed round trip to the database, so that the allocator makes progress.
            b.store_timeout_ms = Some(rng.gen_range(30..=100));
        }
        if rng.gen_bool(0.5) {
            b.reserve_ahead_ms = Some(rng.gen_range(1..=ids.reserve_ahead_ms.max(1)));
        }
        if rng.gen_bool(0.5) {
            b.balance_draws = Some(rng.gen_range(1..=4));
        }
        if rng.gen_bool(0.5) {
            b.token_rows_max = Some(rng.gen_range(16..=256));
        }
        if rng.gen_bool(0.5) {
            b.jwt_ttl_s = Some(rng.gen_range(1..=8));
        }
        b.drift_at_bound = rng.gen_bool(0.5);
        b.bump_at_leeway = rng.gen_bool(0.5);
        if faults.iter().any(|(k, _)| *k == FaultKind::Kill) && rng.gen_bool(0.5) {
            b.crash = Some(CrashPoint {
                node: LOGGED_NODES[rng.gen_range(0..LOGGED_NODES.len())].to_owned(),
                site: if rng.gen_bool(0.5) {
                    CrashSite::BeforeSync
                } else {
                    CrashSite::AfterSync
                },
                nth: rng.gen_range(1..=400),
                down_ms: rng.gen_range(faults_duration(scenario)),
            });
        }
        if rng.gen_bool(0.5) {
            let classes = [
                StragglerClass::Tcc(Phase::Try),
                StragglerClass::Tcc(Phase::Confirm),
                StragglerClass::Tcc(Phase::Cancel),
                StragglerClass::TccReply,
                StragglerClass::Store,
            ];
            let class = classes[rng.gen_range(0..classes.len())];
            let deadline_ms = match class {
                StragglerClass::Store => b.store_timeout_ms.unwrap_or(STORE_TIMEOUT_MS),
                _ => b.reply_timeout_ms.unwrap_or(coord.reply_timeout_ms),
            };
            b.stragglers = Some(Stragglers {
                class,
                ppm: [5_000, 20_000][rng.gen_range(0..2)],
                delay_ms: deadline_ms * rng.gen_range(1..=3) + rng.gen_range(1..=deadline_ms),
            });
        }
        // Drawn last, so that every knob above is what it was before this one existed.
        b.clock_at_boundary = faults
            .iter()
            .any(|(k, _)| matches!(k, FaultKind::ClockBump | FaultKind::ClockRestart))
            && rng.gen_bool(0.75);
        b
    }

    /// Whether any knob is on.
    #[must_use]
    pub fn is_on(&self) -> bool {
        *self != Self::default()
    }

    /// The scenario as this seed runs it (the workload's balances).
    #[must_use]
    pub fn scenario(&self, mut scenario: Scenario) -> Scenario {
        if let Some(draws) = self.balance_draws {
            scenario.workload.balance = scenario.workload.price.saturating_mul(draws);
        }
        scenario
    }

    /// The coordinator's configuration with this seed's knobs.
    #[must_use]
    pub fn coordinator(&self, mut config: CoordinatorConfig) -> CoordinatorConfig {
        set(&mut config.reply_timeout_ms, self.reply_timeout_ms);
        set(&mut config.attempts_max, self.attempts_max);
        set(&mut config.park_delay_ms, self.park_delay_ms);
        set(
            &mut config.compensation_retries_max,
            self.compensation_retries_max,
        );
        if let Some(cap) = self.backoff_ms_max {
            config.backoff_ms_max = cap.max(config.reply_timeout_ms);
        }
        if let Some(w) = self.wheel {
            config.wheel = WheelConfig {
                tick_ms: w.tick_ms,
                slots_per_level: w.slots_per_level,
                levels: w.levels,
                backoff_base_ms: w.backoff_base_ms,
                backoff_cap_ms: w.backoff_cap_ms,
                ..config.wheel
            };
        }
        debug_assert!(config.validate().is_ok(), "buggified {config:?}");
        config
    }

    /// The segment allocator's configuration with this seed's knobs.
    #[must_use]
    pub fn allocator(&self, mut config: AllocatorConfig) -> AllocatorConfig {
        if let Some(lease_ms) = self.lease_ms {
            // Above twice the drift margin (the allocator's own rule), renewed well inside the
            // usable lease.
            config.lease_ms = lease_ms.max(2 * config.drift_ms_max + 1);
            config.renew_interval_ms = ((config.lease_ms - config.drift_ms_max) / 4).max(1);
        }
        set(&mut config.prefetch_used_pct, self.prefetch_used_pct);
        set(&mut config.request_timeout_ms, self.store_timeout_ms);
        debug_assert!(config.validate().is_ok(), "buggified {config:?}");
        config
    }

    /// The Snowflake worker's configuration with this seed's knobs.
    #[must_use]
    pub fn worker(&self, mut config: WorkerConfig) -> WorkerConfig {
        set(&mut config.reserve_ahead_ms, self.reserve_ahead_ms);
        config
    }

    /// One line per knob that is on (for the report and `--verbose`).
    #[must_use]
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut push = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                lines.push(format!("{name} = {v}"));
            }
        };
        push(
            "reply_timeout_ms",
            self.reply_timeout_ms.map(|v| v.to_string()),
        );
        push("attempts_max", self.attempts_max.map(|v| v.to_string()));
        push("backoff_ms_max", self.backoff_ms_max.map(|v| v.to_string()));
        push("park_delay_ms", self.park_delay_ms.map(|v| v.to_string()));
        push(
            "compensation_retries_max",
            self.compensation_retries_max.map(|v| v.to_string()),
        );
        push(
            "wheel",
            self.wheel.map(|w| {
                format!(
                    "{} ms tick, {} slots, {} level(s), backoff {}–{} ms",
                    w.tick_ms, w.slots_per_level, w.levels, w.backoff_base_ms, w.backoff_cap_ms
                )
            }),
        );
        push("lease_ms", self.lease_ms.map(|v| v.to_string()));
        push(
            "prefetch_used_pct",
            self.prefetch_used_pct.map(|v| v.to_string()),
        );
        push(
            "store_timeout_ms",
            self.store_timeout_ms.map(|v| v.to_string()),
        );
        push(
            "reserve_ahead_ms",
            self.reserve_ahead_ms.map(|v| v.to_string()),
        );
        push("balance_draws", self.balance_draws.map(|v| v.to_string()));
        push("token_rows_max", self.token_rows_max.map(|v| v.to_string()));
        push("jwt_ttl_s", self.jwt_ttl_s.map(|v| v.to_string()));
        push(
            "drift",
            self.drift_at_bound.then(|| "at its bound".to_owned()),
        );
        push(
            "token clock bumps",
            self.bump_at_leeway
                .then(|| "back by about the JWT leeway".to_owned()),
        );
        push(
            "ID clock bumps",
            self.clock_at_boundary
                .then(|| "landed at a decision boundary ±1 ms".to_owned()),
        );
        push(
            "crash",
            self.crash.as_ref().map(|c| {
                format!(
                    "{} {} (arrival {}), down {} ms",
                    c.node,
                    c.site.name(),
                    c.nth,
                    c.down_ms
                )
            }),
        );
        push(
            "stragglers",
            self.stragglers
                .as_ref()
                .map(|s| format!("{:?}: {} ppm held back {} ms", s.class, s.ppm, s.delay_ms)),
        );
        lines
    }
}

/// The ID nodes' store-call timeout when not buggified, ms.
pub const STORE_TIMEOUT_MS: u64 = 300;

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// The range a placed crash's downtime is drawn from: the scenario's fault durations.
fn faults_duration(scenario: &Scenario) -> std::ops::RangeInclusive<u64> {
    let [lo, hi] = scenario.faults.down_ms.bounds();
    lo.max(1)..=hi.max(lo.max(1))
}
