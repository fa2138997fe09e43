//! Scenario files: TOML describing topology, workload, faults, duration and invariants.
//!
//! Every field has a default, so a scenario names only what it changes. Unknown fields are
//! errors (a typo must not silently run a different scenario), and every error names the file,
//! line, column and field.

use serde::{Deserialize, Serialize};
use sut::flaw::Flaw;

/// A fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Symmetric, one-way or majority/minority partitions.
    Partition,
    /// Clog nodes one by one, heal in random order (FoundationDB).
    Swizzle,
    /// Packet loss.
    Loss,
    /// Latency spikes.
    Latency,
    /// Kill a node (losing unsynced writes), restart it later.
    Kill,
    /// Pause a node (a GC stall), resume it later.
    Pause,
    /// Bump a node's wall clock forward or backward (up to ±288 s, as Jepsen).
    ClockBump,
    /// Strobe a node's wall clock back and forth.
    ClockStrobe,
    /// Change a node's clock drift.
    ClockDrift,
    /// Jump an ID node's clock backward, then restart it (Leaf issue #216).
    ClockRestart,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [Self; 10] = [
        Self::Partition,
        Self::Swizzle,
        Self::Loss,
        Self::Latency,
        Self::Kill,
        Self::Pause,
        Self::ClockBump,
        Self::ClockStrobe,
        Self::ClockDrift,
        Self::ClockRestart,
    ];

    /// The snake_case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::Swizzle => "swizzle",
            Self::Loss => "loss",
            Self::Latency => "latency",
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::ClockBump => "clock_bump",
            Self::ClockStrobe => "clock_strobe",
            Self::ClockDrift => "clock_drift",
            Self::ClockRestart => "clock_restart",
        }
    }

    /// The coverage counters that show this fault took effect (any one of them non-zero).
    #[must_use]
    pub fn effect_counters(self) -> &'static [&'static str] {
        match self {
            Self::Partition | Self::Swizzle => &["net.dropped_by_partition"],
            Self::Loss => &["net.dropped_by_loss"],
            Self::Latency => &["net.delayed_by_spike"],
            Self::Kill => &["crash.lost_pending_writes", "crash.lost_id_buffers"],
            Self::Pause => &["pause.outlived_lease", "pause.stalled_ms"],
            Self::ClockBump | Self::ClockStrobe => &[
                "clock.rollback_waits",
                "clock.rollback_refusals",
                "clock.logical_issues",
                "token.skewed_rejections",
            ],
            Self::ClockDrift => &["clock.drifted_ms"],
            Self::ClockRestart => &[
                "clock.restart_behind_reservation",
                "clock.rollback_refusals",
            ],
        }
    }
}

/// `[run]`: duration and sweep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Safety phase (faults on, workload running), simulated ms.
    pub safety_ms: u64,
    /// Liveness phase (faults healed), simulated ms. It must outlast the slowest recovery the
    /// protocols allow once the network is whole again: a TCC attempt's timer (at most 1 s with
    /// the simulator's backoff cap), the remaining phase, and a parked draw's retry (0.5 s).
    /// 6 s was too short with the default 3.2 s cap: 2 seeds in 1,000 of `swizzle` ended
    /// with a draw still open.
    pub liveness_ms: u64,
    /// Seeds in the default sweep.
    pub seeds: u64,
    /// A documented flaw of the reference implementation to switch on (`sut::flaw::Flaw`
    /// names; `--flaw` overrides). Absent: the correct implementation.
    pub flaw: Option<Flaw>,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            safety_ms: 6_000,
            liveness_ms: 8_000,
            seeds: 8,
            flaw: None,
        }
    }
}

/// `[topology]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Topology {
    /// ID-service nodes (segment allocator + Snowflake worker each).
    pub id_nodes: u32,
    /// Client nodes.
    pub clients: u32,
}

impl Default for Topology {
    fn default() -> Self {
        Self {
            id_nodes: 3,
            clients: 2,
        }
    }
}

/// `[workload.mix]`: relative weights.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// Segment IDs.
    pub segment: u32,
    /// Snowflake IDs.
    pub snowflake: u32,
    /// Semantic IDs.
    pub semantic: u32,
    /// JWT issue / verify / revoke.
    pub jwt: u32,
    /// One-time token issue / consume (including concurrent double consumes).
    pub once: u32,
    /// Lottery draws.
    pub draw: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            segment: 35,
            snowflake: 25,
            semantic: 0,
            jwt: 10,
            once: 15,
            draw: 15,
        }
    }
}

/// `[workload]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Operations per simulated second, all clients together.
    pub rate_per_s: u32,
    /// The mix.
    pub mix: Mix,
    /// Users.
    pub users: u32,
    /// Lottery activities.
    pub activities: u32,
    /// Prize stock per activity (scarce on purpose).
    pub stock: u64,
    /// Each user's starting balance.
    pub balance: u64,
    /// Ticket price.
    pub price: u64,
    /// Percent of draws whose randomness says "win".
    pub win_pct: u32,
    /// Client timeout per operation, ms.
    pub timeout_ms: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            rate_per_s: 1_000,
            mix: Mix::default(),
            users: 300,
            activities: 3,
            stock: 25,
            balance: 10_000,
            price: 10,
            win_pct: 40,
            timeout_ms: 1_000,
        }
    }
}

/// `[faults]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// The kinds this scenario injects.
    pub kinds: Vec<FaultKind>,
    /// Swarm testing: each seed enables a random non-empty subset of `kinds` with random
    /// weights (TigerBeetle's VOPR, "swarm testing").
    pub swarm: bool,
    /// Time between fault injections, ms: `[min, max]`.
    pub interval_ms: [u64; 2],
    /// How long a fault lasts before it heals, ms: `[min, max]`.
    pub duration_ms: [u64; 2],
    /// Largest clock bump, ms (Jepsen: 288,000).
    pub bump_ms_max: u64,
    /// Largest drift, parts per million.
    pub drift_ppm_max: i64,
    /// Largest packet loss, percent.
    pub loss_pct_max: u32,
    /// Nodes that node-level faults (kill, pause, clock) may hit; empty: every server node.
    pub targets: Vec<String>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            kinds: Vec::new(),
            swarm: true,
            interval_ms: [150, 900],
            duration_ms: [100, 2_500],
            bump_ms_max: 288_000,
            drift_ppm_max: 20_000,
            loss_pct_max: 30,
            targets: Vec::new(),
        }
    }
}

/// `[ids]`: the ID service's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ids {
    /// The tag's database step.
    pub step: u64,
    /// Largest dynamic step.
    pub step_max: u64,
    /// Segment lease, ms.
    pub lease_ms: u64,
    /// Drift margin, ms.
    pub drift_ms_max: u64,
    /// Snowflake rollback wait window, ms.
    pub rollback_ms_max: u64,
    /// Snowflake reservation reach, ms.
    pub reserve_ahead_ms: u64,
    /// End-of-life test: the Snowflake layout's time field runs out this long after the run
    /// starts (its epoch is moved back accordingly). Absent: Twitter's layout from 2020.
    pub snowflake_time_left_ms: Option<u64>,
    /// Width of the Snowflake time field in ms units (Twitter: 41; the end-of-life test needs
    /// an epoch after 1970, so at most 40 there).
    pub snowflake_time_bits: u8,
    /// Semantic IDs per second per machine (the seed: 100,000; shrunk so the overflow is
    /// reachable at simulated rates).
    pub semantic_per_second: u64,
}

impl Default for Ids {
    fn default() -> Self {
        Self {
            step: 50,
            step_max: 400,
            lease_ms: 2_000,
            drift_ms_max: 200,
            rollback_ms_max: 5,
            reserve_ahead_ms: 1_000,
            snowflake_time_left_ms: None,
            snowflake_time_bits: 41,
            semantic_per_second: 100,
        }
    }
}

/// A scenario file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name (`scenario NAME`).
    pub name: String,
    /// One line.
    pub description: String,
    /// Duration and sweep.
    #[serde(default)]
    pub run: RunSection,
    /// Nodes.
    #[serde(default)]
    pub topology: Topology,
    /// Workload.
    #[serde(default)]
    pub workload: Workload,
    /// Faults.
    #[serde(default)]
    pub faults: Faults,
    /// ID service settings.
    #[serde(default)]
    pub ids: Ids,
}

/// A scenario file that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ScenarioError {
    /// The file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong (naming the field).
    pub message: String,
}

impl Scenario {
    /// Parses a scenario from TOML text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let at = |offset: usize, message: String| {
            let before = &text[..offset.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            ScenarioError {
                file: file.to_owned(),
                line,
                column,
                message,
            }
        };
        let scenario: Self = toml::from_str(text).map_err(|err| {
            let offset = err.span().map_or(0, |span| span.start);
            at(offset, err.message().to_owned())
        })?;
        scenario.validate().map_err(|(field, message)| {
            let offset = text
                .find(&format!("{field} ="))
                .or_else(|| text.find(field))
                .unwrap_or(0);
            at(offset, format!("field `{field}`: {message}"))
        })?;
        Ok(scenario)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let w = &self.workload;
        let m = &w.mix;
        if self.name.is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        if self.run.safety_ms == 0 {
            return Err(("safety_ms", "must be positive".into()));
        }
        if self.topology.id_nodes == 0 || self.topology.id_nodes > 64 {
            return Err((
                "id_nodes",
                format!("{} is not within 1..=64", self.topology.id_nodes),
            ));
        }
        if self.topology.clients == 0 || self.topology.clients > 16 {
            return Err((
                "clients",
                format!("{} is not within 1..=16", self.topology.clients),
            ));
        }
        if w.rate_per_s == 0 || w.rate_per_s > 100_000 {
            return Err((
                "rate_per_s",
                format!("{} is not within 1..=100000", w.rate_per_s),
            ));
        }
        if m.segment + m.snowflake + m.semantic + m.jwt + m.once + m.draw == 0 {
            return Err(("mix", "all weights are zero".into()));
        }
        if w.users == 0 || w.activities == 0 {
            return Err(("users", "users and activities must be positive".into()));
        }
        if w.win_pct > 100 {
            return Err(("win_pct", format!("{} is over 100", w.win_pct)));
        }
        if w.timeout_ms == 0 {
            return Err(("timeout_ms", "must be positive".into()));
        }
        let f = &self.faults;
        if f.interval_ms[0] == 0 || f.interval_ms[0] > f.interval_ms[1] {
            return Err((
                "interval_ms",
                format!("{:?} must be [min, max] with 0 < min <= max", f.interval_ms),
            ));
        }
        if f.duration_ms[0] == 0 || f.duration_ms[0] > f.duration_ms[1] {
            return Err((
                "duration_ms",
                format!("{:?} must be [min, max] with 0 < min <= max", f.duration_ms),
            ));
        }
        if let Some(unknown) = f.targets.iter().find(|t| !known_node(t, &self.topology)) {
            return Err(("targets", format!("no node is called `{unknown}`")));
        }
        if f.loss_pct_max > 100 {
            return Err(("loss_pct_max", format!("{} is over 100", f.loss_pct_max)));
        }
        let ids = &self.ids;
        if ids.step == 0 || ids.step_max < ids.step {
            return Err(("step", "step must be positive and at most step_max".into()));
        }
        if ids.lease_ms <= 2 * ids.drift_ms_max {
            return Err(("lease_ms", "must exceed twice drift_ms_max".into()));
        }
        Ok(())
    }
}

/// Whether `name` is a server node of `topology`.
fn known_node(name: &str, topology: &Topology) -> bool {
    matches!(name, "db" | "token" | "coord" | "wallet" | "inventory")
        || name
            .strip_prefix("id")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| (1..=topology.id_nodes).contains(&n))
}

/// One seed's resolved parameters: the scenario plus what the seed decided (swarm testing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The scenario.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// The fault kinds enabled for this seed, with their weights.
    pub faults: Vec<(FaultKind, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_a_file_leaves_out() {
        let s = Scenario::parse(
            "x.toml",
            "name = \"x\"\ndescription = \"d\"\n[faults]\nkinds = [\"kill\"]\n",
        )
        .unwrap();
        assert_eq!(s.faults.kinds, vec![FaultKind::Kill]);
        assert_eq!(s.workload.rate_per_s, 1_000);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let err = Scenario::parse(
            "bad.toml",
            "name = \"x\"\ndescription = \"d\"\n[workload]\nrate = 5\n",
        )
        .unwrap_err();
        assert_eq!((err.file.as_str(), err.line), ("bad.toml", 4));
        assert!(err.message.contains("unknown field `rate`"), "{err}");
        let err = Scenario::parse(
            "bad.toml",
            "name = \"x\"\ndescription = \"d\"\n[faults]\nkinds = [\"meteor\"]\n",
        )
        .unwrap_err();
        assert_eq!(err.line, 4);
        assert!(err.message.contains("meteor"), "{err}");
        let err = Scenario::parse(
            "bad.toml",
            "name = \"x\"\ndescription = \"d\"\n\n[workload]\nrate_per_s = 0\n",
        )
        .unwrap_err();
        assert_eq!(err.line, 5);
        assert!(
            err.to_string()
                .starts_with("bad.toml:5:1: field `rate_per_s`"),
            "{err}"
        );
        let err = Scenario::parse(
            "bad.toml",
            "name = \"x\"\ndescription = \"d\"\n[faults]\ntargets = [\"id9\"]\n",
        )
        .unwrap_err();
        assert!(err.message.contains("`id9`") && err.line == 4, "{err}");
        let err = Scenario::parse("bad.toml", "description = \"d\"\n").unwrap_err();
        assert!(err.message.contains("name"), "{err}");
    }
}
