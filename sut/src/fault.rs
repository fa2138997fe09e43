//! The one fault vocabulary: every kind of fault the bench injects, by one name, with where it
//! can be injected. The simulator's scenario files, the deployment's chaos, the tests of a
//! user's own service (`--nemesis`) and the real-system files all parse their fault names here,
//! so a fault has the same name in a simulated scenario and a real one, and a name a runner
//! cannot inject is refused with where it can.
//!
//! Pure data: the runners own how each fault is done (madsim's network and clocks, signals,
//! libfaketime, the fault proxy, the lost-writes filesystem).

use std::fmt;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// A process killed (SIGKILL; unsynced writes lost), restarted later.
    Kill,
    /// A process paused (SIGSTOP, a GC stall), resumed later.
    Pause,
    /// A network partition: links cut (symmetric, one-way, majority/minority), healed later.
    Partition,
    /// The machine's power: every process killed and every write not yet synced dropped.
    PowerLoss,
    /// The database process killed and restarted.
    DbKill,
    /// The database process paused (SIGSTOP), resumed later: every query waits.
    DbPause,
    /// The database machine's power: the database killed and every write it had not yet synced
    /// dropped, then restarted.
    DbPowerLoss,
    /// The link between the service and its database cut (a black hole), healed later.
    DbPartition,
    /// A wall clock stepped forward or backward, then back.
    ClockBump,
    /// A wall clock flipping between two offsets.
    ClockStrobe,
    /// Every process's wall clock at an offset of its own.
    ClockSkew,
    /// A clock's rate changed (drift).
    ClockDrift,
    /// An ID node's clock stepped back, then the node restarted (Leaf issue #216).
    ClockRestart,
    /// Nodes clogged one by one, healed in random order (FoundationDB's swizzle).
    Swizzle,
    /// Messages lost.
    Loss,
    /// Latency spikes.
    Latency,
    /// A link delayed or throttled.
    LinkSlow,
    /// A link's connections reset mid-stream or left half-open.
    LinkBreak,
}

/// Where faults are injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runner {
    /// The simulated cluster (scenario files with `[faults] kinds`).
    Simulation,
    /// The multi-process deployment's chaos (`scenario cluster_chaos`, `[chaos] faults`).
    Deployment,
    /// A user's own service under test (`scenario ids|tcc|tokens --nemesis`).
    OwnService,
    /// Real systems in `scenarios/real/` (`[nemesis] fault`).
    RealSystem,
}

impl Runner {
    /// Every runner.
    pub const ALL: [Self; 4] = [
        Self::Simulation,
        Self::Deployment,
        Self::OwnService,
        Self::RealSystem,
    ];

    /// Where this is, in words.
    #[must_use]
    pub const fn about(self) -> &'static str {
        match self {
            Self::Simulation => "simulated scenarios",
            Self::Deployment => "the deployment's chaos (scenario cluster_chaos)",
            Self::OwnService => "tests of your own service (--nemesis)",
            Self::RealSystem => "real-system files (scenarios/real/)",
        }
    }
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [Self; 18] = [
        Self::Kill,
        Self::Pause,
        Self::Partition,
        Self::PowerLoss,
        Self::DbKill,
        Self::DbPause,
        Self::DbPowerLoss,
        Self::DbPartition,
        Self::ClockBump,
        Self::ClockStrobe,
        Self::ClockSkew,
        Self::ClockDrift,
        Self::ClockRestart,
        Self::Swizzle,
        Self::Loss,
        Self::Latency,
        Self::LinkSlow,
        Self::LinkBreak,
    ];

    /// Older names still accepted: `clock` (the real runs' name of a clock bump).
    const ALIASES: [(&'static str, Self); 1] = [("clock", Self::ClockBump)];

    /// Its name in scenario files, on the command line and in reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Partition => "partition",
            Self::PowerLoss => "power_loss",
            Self::DbKill => "db_kill",
            Self::DbPause => "db_pause",
            Self::DbPowerLoss => "db_power_loss",
            Self::DbPartition => "db_partition",
            Self::ClockBump => "clock_bump",
            Self::ClockStrobe => "clock_strobe",
            Self::ClockSkew => "clock_skew",
            Self::ClockDrift => "clock_drift",
            Self::ClockRestart => "clock_restart",
            Self::Swizzle => "swizzle",
            Self::Loss => "loss",
            Self::Latency => "latency",
            Self::LinkSlow => "link_slow",
            Self::LinkBreak => "link_break",
        }
    }

    /// Where it can be injected.
    #[must_use]
    pub const fn runners(self) -> &'static [Runner] {
        use Runner::{Deployment, OwnService, RealSystem, Simulation};
        match self {
            Self::Kill | Self::Pause | Self::Partition => {
                &[Simulation, Deployment, OwnService, RealSystem]
            }
            Self::PowerLoss => &[Deployment, OwnService, RealSystem],
            Self::ClockBump => &[Simulation, Deployment, OwnService],
            Self::ClockStrobe => &[Simulation, Deployment],
            Self::DbKill => &[Deployment, OwnService],
            Self::DbPause | Self::DbPowerLoss | Self::DbPartition => &[OwnService],
            Self::ClockSkew | Self::LinkSlow | Self::LinkBreak => &[Deployment],
            Self::ClockDrift | Self::ClockRestart | Self::Swizzle | Self::Loss | Self::Latency => {
                &[Simulation]
            }
        }
    }

    /// Whether `runner` can inject it.
    #[must_use]
    pub fn runs_in(self, runner: Runner) -> bool {
        self.runners().contains(&runner)
    }

    /// The kinds `runner` can inject, in [`Self::ALL`] order.
    pub fn of(runner: Runner) -> impl Iterator<Item = Self> {
        Self::ALL.into_iter().filter(move |k| k.runs_in(runner))
    }

    /// The kind named `word` (or an older name of it).
    ///
    /// # Errors
    /// An unknown name, with the known ones.
    pub fn parse(word: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == word)
            .or_else(|| {
                Self::ALIASES
                    .iter()
                    .find(|(alias, _)| *alias == word)
                    .map(|(_, k)| *k)
            })
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault `{word}` (known: {})", known.join(", "))
            })
    }

    /// The kind named `word`, if `runner` can inject it.
    ///
    /// # Errors
    /// An unknown name, or one `runner` cannot inject (saying where it can, and what `runner`
    /// takes).
    pub fn parse_for(word: &str, runner: Runner) -> Result<Self, String> {
        let kind = Self::parse(word)?;
        if kind.runs_in(runner) {
            return Ok(kind);
        }
        let elsewhere: Vec<&str> = kind.runners().iter().map(|r| r.about()).collect();
        let here: Vec<&str> = Self::of(runner).map(Self::name).collect();
        Err(format!(
            "fault `{word}` is injected in {}, not in {}; these take: {}",
            elsewhere.join(" and "),
            runner.about(),
            here.join(", ")
        ))
    }
}

/// A runner's own fault named `word`: the kind of the vocabulary, if `runner` injects it, as
/// the first of `all` (the runner's kinds) whose `kind` it is.
///
/// # Errors
/// As [`FaultKind::parse_for`]; or `runner` lists the kind but `all` has none of it (a runner
/// out of step with the vocabulary, which its test catches).
pub fn parse_into<T: Copy>(
    word: &str,
    runner: Runner,
    all: &[T],
    kind: impl Fn(T) -> FaultKind,
) -> Result<T, String> {
    let wanted = FaultKind::parse_for(word, runner)?;
    all.iter()
        .copied()
        .find(|t| kind(*t) == wanted)
        .ok_or_else(|| format!("fault `{word}`: {} list it but inject none", runner.about()))
}

/// A direction of a link (a proxied connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to upstream (requests).
    Up,
    /// Upstream to client (responses).
    Down,
}

/// What a link does now, as the fault proxy carries it out. [`LinkFault::None`] forwards
/// everything; every other shape is one of the vocabulary's kinds ([`LinkFault::kind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkFault {
    /// Forward every byte as it comes.
    #[default]
    None,
    /// Partition, refusing: the port closed, open connections reset.
    Refuse,
    /// Partition, black hole: connections stay open, no byte gets through until it heals.
    Blackhole,
    /// The bytes of one direction are held until it heals.
    OneWay {
        /// The direction that is cut.
        stall: Direction,
    },
    /// Each chunk is held `delay_ms ± jitter_ms` (order kept).
    Latency {
        /// Mean delay, ms.
        delay_ms: u64,
        /// Largest deviation from it, ms.
        jitter_ms: u64,
    },
    /// Each direction is paced to this many bytes per second.
    Bandwidth {
        /// The rate, bytes per second (at least 1).
        bytes_per_s: u64,
    },
    /// A connection is reset once this many bytes (both directions) went through it.
    ResetAfter {
        /// Bytes let through before the reset.
        bytes: u64,
    },
    /// The upstream side is closed, the client's stays open and is swallowed.
    HalfOpen,
}

impl LinkFault {
    /// The kind of fault this shape is (`None` for [`LinkFault::None`]): a partition refuses,
    /// black-holes or cuts one way; a slow link delays or throttles; a broken one resets or
    /// leaves a connection half-open.
    #[must_use]
    pub const fn kind(self) -> Option<FaultKind> {
        match self {
            Self::None => None,
            Self::Refuse | Self::Blackhole | Self::OneWay { .. } => Some(FaultKind::Partition),
            Self::Latency { .. } | Self::Bandwidth { .. } => Some(FaultKind::LinkSlow),
            Self::ResetAfter { .. } | Self::HalfOpen => Some(FaultKind::LinkBreak),
        }
    }
}

/// How long, in ms, as fault timing is given everywhere: `every_ms` (from the end of one fault
/// to the start of the next) and `down_ms` (how long a fault holds) in simulated and real
/// scenario files alike, and `down_ms` of a scripted fault. One number (always that long) or
/// `[min, max]` (drawn for each fault, where the runner draws).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MsRange {
    /// The shortest.
    pub min_ms: u64,
    /// The longest (at least `min_ms`).
    pub max_ms: u64,
}

impl MsRange {
    /// Always `ms`.
    #[must_use]
    pub const fn fixed(ms: u64) -> Self {
        Self {
            min_ms: ms,
            max_ms: ms,
        }
    }

    /// From `min_ms` to `max_ms`.
    #[must_use]
    pub const fn between(min_ms: u64, max_ms: u64) -> Self {
        Self { min_ms, max_ms }
    }

    /// `[min, max]`.
    #[must_use]
    pub const fn bounds(self) -> [u64; 2] {
        [self.min_ms, self.max_ms]
    }

    /// Checks `0 < min <= max`; the error names `field`.
    ///
    /// # Errors
    /// The range in words.
    pub fn check(self, field: &str) -> Result<(), String> {
        if self.min_ms == 0 || self.min_ms > self.max_ms {
            return Err(format!(
                "{field} = {self} must be positive, and [min, max] with min <= max"
            ));
        }
        Ok(())
    }

    /// The one value of a runner that holds every fault the same time; the error names `field`.
    ///
    /// # Errors
    /// A range, or zero.
    pub fn single(self, field: &str) -> Result<u64, String> {
        self.check(field)?;
        if self.min_ms != self.max_ms {
            return Err(format!(
                "{field} = {self}: this runner holds every fault the same time; give one number"
            ));
        }
        Ok(self.min_ms)
    }
}

impl fmt::Display for MsRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min_ms == self.max_ms {
            write!(f, "{}", self.min_ms)
        } else {
            write!(f, "[{}, {}]", self.min_ms, self.max_ms)
        }
    }
}

impl serde::Serialize for MsRange {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.min_ms == self.max_ms {
            serializer.serialize_u64(self.min_ms)
        } else {
            self.bounds().serialize(serializer)
        }
    }
}

impl<'de> serde::Deserialize<'de> for MsRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged, expecting = "a number of ms, or [min, max]")]
        enum Repr {
            One(u64),
            Two([u64; 2]),
        }
        Ok(match Repr::deserialize(deserializer)? {
            Repr::One(ms) => Self::fixed(ms),
            Repr::Two([min_ms, max_ms]) => Self::between(min_ms, max_ms),
        })
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for kind in FaultKind::ALL {
            assert!(seen.insert(kind.name()), "{} twice", kind.name());
            assert_eq!(FaultKind::parse(kind.name()), Ok(kind));
            assert!(!kind.runners().is_empty(), "{kind} is injected nowhere");
        }
        assert_eq!(FaultKind::parse("clock"), Ok(FaultKind::ClockBump));
        assert!(
            FaultKind::parse("meteor")
                .unwrap_err()
                .contains("known: kill")
        );
    }

    #[test]
    fn every_link_shape_is_a_kind_the_deployment_injects() {
        let shapes = [
            LinkFault::Refuse,
            LinkFault::Blackhole,
            LinkFault::OneWay {
                stall: Direction::Up,
            },
            LinkFault::Latency {
                delay_ms: 5,
                jitter_ms: 1,
            },
            LinkFault::Bandwidth { bytes_per_s: 10 },
            LinkFault::ResetAfter { bytes: 1 },
            LinkFault::HalfOpen,
        ];
        for shape in shapes {
            let kind = shape.kind().expect("a fault");
            assert!(kind.runs_in(Runner::Deployment), "{shape:?}");
        }
        assert_eq!(LinkFault::None.kind(), None);
    }

    #[test]
    fn timing_is_one_number_or_a_range_and_bad_ones_are_named() {
        #[derive(serde::Deserialize)]
        struct File {
            every_ms: MsRange,
            down_ms: MsRange,
        }
        let f: File = toml_like("every_ms = 500\ndown_ms = [100, 2500]");
        assert_eq!(f.every_ms, MsRange::fixed(500));
        assert_eq!(f.down_ms.bounds(), [100, 2_500]);
        assert_eq!(f.every_ms.single("every_ms"), Ok(500));
        let e = f.down_ms.single("nemesis.down_ms").unwrap_err();
        assert!(
            e.contains("nemesis.down_ms = [100, 2500]") && e.contains("one number"),
            "{e}"
        );
        assert!(
            MsRange::between(9, 3)
                .check("x")
                .unwrap_err()
                .contains("min <= max")
        );
        assert!(MsRange::fixed(0).check("x").is_err());
        assert_eq!(serde_json::to_string(&f.down_ms).unwrap(), "[100,2500]");
        assert_eq!(serde_json::to_string(&f.every_ms).unwrap(), "500");
    }

    /// `key = value` lines as JSON, for the test above (sut has no TOML parser).
    fn toml_like<T: serde::de::DeserializeOwned>(text: &str) -> T {
        let fields: Vec<String> = text
            .lines()
            .map(|l| {
                let (k, v) = l.split_once(" = ").unwrap();
                format!("\"{k}\": {v}")
            })
            .collect();
        serde_json::from_str(&format!("{{{}}}", fields.join(", "))).unwrap()
    }

    #[test]
    fn a_runner_refuses_a_kind_it_cannot_inject_and_says_where_it_can() {
        assert_eq!(
            FaultKind::parse_for("kill", Runner::Simulation),
            Ok(FaultKind::Kill)
        );
        let e = FaultKind::parse_for("swizzle", Runner::OwnService).unwrap_err();
        assert!(e.contains("simulated scenarios"), "{e}");
        assert!(
            e.contains(
                "these take: kill, pause, partition, power_loss, db_kill, db_pause, \
                 db_power_loss, db_partition, clock_bump"
            ),
            "{e}"
        );
        for runner in Runner::ALL {
            assert!(FaultKind::of(runner).count() >= 3, "{runner:?}");
        }
    }
}
