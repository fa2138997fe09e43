//! Scenario files: TOML describing topology, workload, faults, duration and invariants.
//!
//! Every field has a default, so a scenario names only what it changes. Unknown fields are
//! errors (a typo must not silently run a different scenario), and every error names the file,
//! line, column and field.

use serde::{Deserialize, Serialize};
use sut::fault::MsRange;
use sut::flaw::Flaw;

/// A fault the nemesis can inject: the simulated kinds of the one fault vocabulary
/// ([`sut::fault::FaultKind`]), whose names scenario files use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
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

    /// Its name in the fault vocabulary.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.kind().name()
    }

    /// Its kind in the fault vocabulary.
    #[must_use]
    pub const fn kind(self) -> sut::fault::FaultKind {
        use sut::fault::FaultKind as K;
        match self {
            Self::Partition => K::Partition,
            Self::Swizzle => K::Swizzle,
            Self::Loss => K::Loss,
            Self::Latency => K::Latency,
            Self::Kill => K::Kill,
            Self::Pause => K::Pause,
            Self::ClockBump => K::ClockBump,
            Self::ClockStrobe => K::ClockStrobe,
            Self::ClockDrift => K::ClockDrift,
            Self::ClockRestart => K::ClockRestart,
        }
    }

    /// The simulated kind named `word`.
    ///
    /// # Errors
    /// An unknown name, or a fault the simulator does not inject (saying where it is injected).
    pub fn parse(word: &str) -> Result<Self, String> {
        sut::fault::parse_into(word, sut::fault::Runner::Simulation, &Self::ALL, Self::kind)
    }

    /// The coverage counters that show this fault took effect (any one of them non-zero).
    #[must_use]
    pub fn effect_counters(self) -> &'static [&'static str] {
        match self {
            Self::Partition | Self::Swizzle => &["net.dropped_by_partition"],
            Self::Loss => &["net.dropped_by_loss"],
            Self::Latency => &["net.delayed_by_spike"],
            Self::Kill => &[
                "crash.lost_pending_writes",
                "crash.lost_id_buffers",
                "crash.after_durable_step",
            ],
            // What a pause does is hold up the messages sent to the paused node (and, on an ID
            // node, outlive its lease); its length alone is no effect.
            Self::Pause => &["pause.outlived_lease", "pause.delayed_messages"],
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

impl TryFrom<String> for FaultKind {
    type Error = String;

    fn try_from(word: String) -> Result<Self, String> {
        Self::parse(&word)
    }
}

impl From<FaultKind> for String {
    fn from(kind: FaultKind) -> Self {
        kind.name().to_owned()
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
    /// First seed of a sweep when the command line gives none (`--seed` overrides); a file
    /// written by `scenario search` names the seed that replays its failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The invariant this scenario is expected to violate: set in the files `scenario search`
    /// writes, so that `scenario replay` can tell "reproduced" from "a different failure".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect: Option<String>,
    /// BUGGIFY (`sim::buggify`): per seed, shrunk timers and budgets, drift at its bound,
    /// crashes placed at durable steps, stragglers. On by default; `--no-buggify` overrides.
    pub buggify: bool,
    /// Run every state machine's own `check_invariants` after each of its steps (the
    /// allocator, the worker-lease holder, the semantic generator, the coordinator, the token
    /// service and the ID store), failing the run on the first violation. Always on in debug
    /// builds; the mutation gate turns it on in its release build.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub self_checks: bool,
    /// Crash points (`sim::crashpoints`): per seed, the points found in its run are tried, at
    /// most this many, each as the same seed run again with a crash of that node right there.
    /// 0: off. `--crash-points N` overrides.
    #[serde(skip_serializing_if = "is_zero")]
    pub crash_points: u32,
    /// One crash point to strike in every seed, as `NODE:SITE:LABEL#N`
    /// (`sim::crashpoints::CrashPlan`): how a failing crash point replays. `--crash-at`
    /// overrides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crash_at: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            safety_ms: 6_000,
            liveness_ms: 8_000,
            seeds: 8,
            flaw: None,
            seed: None,
            expect: None,
            buggify: true,
            self_checks: false,
            crash_points: 0,
            crash_at: None,
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
    /// Percent of users who are hostile: every draw of theirs names its own ticket price, 0
    /// (users whose id modulo 100 is below it). A correct coordinator refuses those draws
    /// before anything is consumed; one that takes the request's price
    /// (`--flaw client_price`) sells them prizes for nothing, which `lottery.paid` names.
    pub tampered_price_pct: u32,
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
            tampered_price_pct: 0,
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
    /// Time between fault injections, ms: `[min, max]` or one number (the vocabulary's
    /// `every_ms`, as real scenario files; the older name `interval_ms` is still read).
    #[serde(alias = "interval_ms")]
    pub every_ms: MsRange,
    /// How long a fault holds before it heals, ms: `[min, max]` or one number (the
    /// vocabulary's `down_ms`; the older name `duration_ms` is still read).
    #[serde(alias = "duration_ms")]
    pub down_ms: MsRange,
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
            every_ms: MsRange::between(150, 900),
            down_ms: MsRange::between(100, 2_500),
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
    /// A scripted fault schedule (`[[schedule]]` entries). When present (even empty:
    /// `schedule = []`), the nemesis plays exactly these events and injects no random fault;
    /// `[faults] kinds`, `swarm` and the intervals are then ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<ScheduledFault>>,
    /// The edge states this scenario owns (`[edges] expect`): a sweep in which one of them was
    /// never reached fails, like a fault that never took effect.
    #[serde(default, skip_serializing_if = "EdgesSection::is_empty")]
    pub edges: EdgesSection,
}

/// `[edges]`: the edge states (`sut::edge`) a scenario is there to reach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdgesSection {
    /// Edge states every judged sweep (`run::COVERAGE_SEEDS_MIN` seeds or more) must reach:
    /// names (`participant.empty_rollback`) or machine names (`wheel`: all of its edge states).
    pub expect: Vec<String>,
    /// Edge states reached in only some seeds: judged over sweeps of `run::RARE_EDGE_SEEDS_MIN`
    /// seeds or more.
    pub rare: Vec<String>,
}

impl EdgesSection {
    /// Whether the scenario owns no edge state.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.expect.is_empty() && self.rare.is_empty()
    }

    /// The edge states every judged sweep must reach, each once, in declaration order; the
    /// first entry that names neither an edge state nor a machine is the error.
    pub fn owned(&self) -> Result<Vec<&'static sut::edge::Edge>, String> {
        resolve_edges(&self.expect)
    }

    /// The rare edge states, as [`Self::owned`].
    pub fn owned_rare(&self) -> Result<Vec<&'static sut::edge::Edge>, String> {
        resolve_edges(&self.rare)
    }

    /// Checks both lists, and that no edge state is in both.
    fn validate(&self) -> Result<(), String> {
        let common = self.owned()?;
        let rare = self.owned_rare()?;
        match common.iter().find(|e| rare.contains(e)) {
            Some(both) => Err(format!("`{}` is both expected and rare", both.name)),
            None => Ok(()),
        }
    }
}

/// The edge states named by `entries` (edge or machine names), each once, in declaration order.
fn resolve_edges(entries: &[String]) -> Result<Vec<&'static sut::edge::Edge>, String> {
    let mut names = std::collections::BTreeSet::new();
    for entry in entries {
        if let Some(machine) = sut::edge::Machine::from_name(entry) {
            names.extend(machine.edges().map(|e| e.name));
        } else if let Some(edge) = sut::edge_registry::find(entry) {
            names.insert(edge.name);
        } else {
            return Err(format!(
                "`{entry}` is neither an edge state nor a machine (`scenario edges` lists them)"
            ));
        }
    }
    Ok(sut::edge_registry::all()
        .filter(|e| names.contains(e.name))
        .collect())
}

/// One scripted fault: what happens at `at_ms` of the safety phase, to which node(s), with
/// every parameter the random nemesis would otherwise draw. Fields that do not apply to the
/// fault are errors (a typo must not silently script a different fault).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledFault {
    /// When, in simulated ms from the start of the run (within the safety phase).
    pub at_ms: u64,
    /// What.
    pub fault: FaultKind,
    /// The node a node fault hits (`kill`, `pause`, `clock_*`): a server node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The nodes a network fault hits: for `partition` one side (the rest is the other), for
    /// `swizzle` the nodes clogged one by one (and healed in this order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// How long the fault holds before it heals, ms (the vocabulary's `down_ms`; the older
    /// name `duration_ms` is still read); absent: until the liveness phase heals everything.
    /// For `clock_restart`, how long the node stays down. Not for `clock_bump` (instantaneous;
    /// the offset stays until the liveness phase resets clocks).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "duration_ms"
    )]
    pub down_ms: Option<u64>,
    /// `partition`: one-way (only the side's messages to the rest are dropped).
    #[serde(default, skip_serializing_if = "is_false")]
    pub one_way: bool,
    /// `clock_bump`: the signed jump, ms; `clock_strobe`: the amplitude (> 0);
    /// `clock_restart`: how far the clock jumps back (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_ms: Option<i64>,
    /// `clock_strobe`: ms between flips; `swizzle`: ms between clogging (and healing) nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// `clock_drift`: parts per million (signed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppm: Option<i64>,
    /// `loss`: percent of messages dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_pct: Option<u32>,
    /// `latency`: the spike's largest latency, ms (latencies are drawn from half of it to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// `kill`, `clock_restart`: the crash tears the last pending record.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tear: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

/// Most events a schedule may hold.
pub const SCHEDULE_EVENTS_MAX: usize = 1_000;
/// Largest clock jump or strobe amplitude a schedule may script, ms (an hour).
pub const SCHEDULE_DELTA_MS_MAX: i64 = 3_600_000;

impl ScheduledFault {
    /// A `fault` at `at_ms` with no parameter set yet (fill in what the kind needs).
    #[must_use]
    pub fn new(at_ms: u64, fault: FaultKind) -> Self {
        Self {
            at_ms,
            fault,
            node: None,
            nodes: Vec::new(),
            down_ms: None,
            one_way: false,
            delta_ms: None,
            period_ms: None,
            ppm: None,
            loss_pct: None,
            latency_ms: None,
            tear: false,
        }
    }

    /// One line of a human-readable timeline, e.g. `1200 ms  kill token for 800 ms (torn)`.
    #[must_use]
    pub fn describe(&self) -> String {
        let node = self.node.as_deref().unwrap_or("?");
        let lasting = lasting(self.down_ms);
        let what = match self.fault {
            FaultKind::Partition => format!(
                "partition {}{:?} | rest{lasting}",
                if self.one_way { "one-way " } else { "" },
                self.nodes,
            ),
            FaultKind::Swizzle => format!(
                "swizzle {:?} one by one every {} ms{lasting}",
                self.nodes,
                self.period_ms.unwrap_or(100),
            ),
            FaultKind::Loss => format!("loss {}%{lasting}", self.loss_pct.unwrap_or(0)),
            FaultKind::Latency => {
                format!("latency up to {} ms{lasting}", self.latency_ms.unwrap_or(0))
            }
            FaultKind::Kill => format!(
                "kill {node}{}{}",
                self.tear_note(),
                self.down_ms.map_or_else(
                    || ", restart at the liveness phase".to_owned(),
                    |ms| format!(", restart after {ms} ms")
                )
            ),
            FaultKind::Pause => format!("pause {node}{lasting}"),
            FaultKind::ClockBump => {
                format!("clock_bump {node} by {:+} ms", self.delta_ms.unwrap_or(0))
            }
            FaultKind::ClockStrobe => format!(
                "clock_strobe {node} ±{} ms every {} ms{lasting}",
                self.delta_ms.unwrap_or(0),
                self.period_ms.unwrap_or(0),
            ),
            FaultKind::ClockDrift => {
                format!(
                    "clock_drift {node} {:+} ppm{lasting}",
                    self.ppm.unwrap_or(0)
                )
            }
            FaultKind::ClockRestart => format!(
                "clock_restart {node}: clock -{} ms, killed{}, restart after {} ms",
                self.delta_ms.unwrap_or(0),
                self.tear_note(),
                self.down_ms.unwrap_or(50)
            ),
        };
        format!("{:>6} ms  {what}", self.at_ms)
    }

    /// What [`Self::describe`] says of a torn last write.
    fn tear_note(&self) -> &'static str {
        if self.tear {
            " (tearing its last write)"
        } else {
            ""
        }
    }

    /// The fields this fault kind requires and those it allows, by TOML name.
    fn fields(kind: FaultKind) -> (&'static [&'static str], &'static [&'static str]) {
        match kind {
            FaultKind::Partition => (&["nodes"], &["nodes", "down_ms", "one_way"]),
            FaultKind::Swizzle => (&["nodes"], &["nodes", "down_ms", "period_ms"]),
            FaultKind::Loss => (&["loss_pct"], &["loss_pct", "down_ms"]),
            FaultKind::Latency => (&["latency_ms"], &["latency_ms", "down_ms"]),
            FaultKind::Kill => (&["node"], &["node", "down_ms", "tear"]),
            FaultKind::Pause => (&["node"], &["node", "down_ms"]),
            FaultKind::ClockBump => (&["node", "delta_ms"], &["node", "delta_ms"]),
            FaultKind::ClockStrobe => (
                &["node", "delta_ms", "period_ms"],
                &["node", "delta_ms", "period_ms", "down_ms"],
            ),
            FaultKind::ClockDrift => (&["node", "ppm"], &["node", "ppm", "down_ms"]),
            FaultKind::ClockRestart => (
                &["node", "delta_ms"],
                &["node", "delta_ms", "down_ms", "tear"],
            ),
        }
    }

    /// The optional fields that are set, by TOML name.
    fn present(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        let checks: [(&'static str, bool); 10] = [
            ("node", self.node.is_some()),
            ("nodes", !self.nodes.is_empty()),
            ("down_ms", self.down_ms.is_some()),
            ("one_way", self.one_way),
            ("delta_ms", self.delta_ms.is_some()),
            ("period_ms", self.period_ms.is_some()),
            ("ppm", self.ppm.is_some()),
            ("loss_pct", self.loss_pct.is_some()),
            ("latency_ms", self.latency_ms.is_some()),
            ("tear", self.tear),
        ];
        for (name, is_set) in checks {
            if is_set {
                set.push(name);
            }
        }
        set
    }

    /// Checks one entry against the scenario; the error names the field.
    fn validate(&self, scenario: &Scenario) -> Result<(), (&'static str, String)> {
        let kind = self.fault.name();
        let (required, allowed) = Self::fields(self.fault);
        let present = self.present();
        if let Some(field) = present.iter().find(|f| !allowed.contains(f)) {
            return Err((field, format!("does not apply to a `{kind}` fault")));
        }
        if let Some(field) = required.iter().find(|f| !present.contains(f)) {
            return Err((field, format!("a `{kind}` fault needs it")));
        }
        if self.at_ms >= scenario.run.safety_ms {
            return Err((
                "at_ms",
                format!(
                    "{} is not within the safety phase (0..{})",
                    self.at_ms, scenario.run.safety_ms
                ),
            ));
        }
        self.validate_nodes(&scenario.topology)?;
        self.validate_values()
    }

    /// Checks `node` and `nodes` against the topology.
    fn validate_nodes(&self, topology: &Topology) -> Result<(), (&'static str, String)> {
        if let Some(node) = &self.node
            && !known_node(node, topology)
        {
            return Err(("node", format!("no server node is called `{node}`")));
        }
        if self.fault == FaultKind::ClockRestart
            && !self.node.as_deref().is_some_and(|n| n.starts_with("id"))
        {
            return Err((
                "node",
                "a `clock_restart` hits an ID node (id1, id2, ...)".into(),
            ));
        }
        let is_node = |n: &str| {
            known_node(n, topology)
                || n.strip_prefix("client")
                    .and_then(|i| i.parse::<u32>().ok())
                    .is_some_and(|i| (1..=topology.clients).contains(&i))
        };
        if let Some(unknown) = self.nodes.iter().find(|n| !is_node(n)) {
            return Err(("nodes", format!("no node is called `{unknown}`")));
        }
        let mut distinct = self.nodes.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != self.nodes.len() {
            return Err(("nodes", "lists a node twice".into()));
        }
        // db, the ID nodes, token, coord, wallet, inventory and the clients.
        let node_count = 5 + topology.id_nodes as usize + topology.clients as usize;
        if self.fault == FaultKind::Partition && self.nodes.len() >= node_count {
            return Err((
                "nodes",
                "one side of a partition cannot hold every node".into(),
            ));
        }
        Ok(())
    }

    /// Checks the numeric parameters' ranges.
    fn validate_values(&self) -> Result<(), (&'static str, String)> {
        let kind = self.fault.name();
        if self.down_ms == Some(0) {
            return Err(("down_ms", "must be positive".into()));
        }
        if let Some(d) = self.delta_ms {
            if d.abs() > SCHEDULE_DELTA_MS_MAX {
                return Err((
                    "delta_ms",
                    format!("{d} is beyond ±{SCHEDULE_DELTA_MS_MAX}"),
                ));
            }
            if d <= 0 && matches!(self.fault, FaultKind::ClockStrobe | FaultKind::ClockRestart) {
                return Err(("delta_ms", format!("{d} must be positive for `{kind}`")));
            }
        }
        if self.period_ms == Some(0) {
            return Err(("period_ms", "must be positive".into()));
        }
        if let Some(ppm) = self.ppm
            && ppm.abs() > 1_000_000
        {
            return Err(("ppm", format!("{ppm} is beyond ±1000000")));
        }
        if let Some(pct) = self.loss_pct
            && !(1..=100).contains(&pct)
        {
            return Err(("loss_pct", format!("{pct} is not within 1..=100")));
        }
        if let Some(ms) = self.latency_ms
            && !(2..=60_000).contains(&ms)
        {
            return Err(("latency_ms", format!("{ms} is not within 2..=60000")));
        }
        Ok(())
    }
}

/// ` for N ms`, or ` until the liveness phase` for a fault without a duration.
fn lasting(down_ms: Option<u64>) -> String {
    down_ms.map_or_else(
        || " until the liveness phase".to_owned(),
        |ms| format!(" for {ms} ms"),
    )
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

impl ScenarioError {
    /// The error `message` at byte `offset` of `text`, the file `file`: its line and column
    /// (the one way every scenario file, simulated or real, names where it is wrong).
    #[must_use]
    pub fn at(file: &str, text: &str, offset: usize, message: String) -> Self {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Self {
            file: file.to_owned(),
            line,
            column,
            message,
        }
    }
}

impl Scenario {
    /// Parses a scenario from TOML text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let at = |offset: usize, message: String| ScenarioError::at(file, text, offset, message);
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
        scenario
            .validate_schedule()
            .map_err(|(index, field, message)| {
                at(
                    schedule_field_offset(text, index, field),
                    format!("schedule entry {}: field `{field}`: {message}", index + 1),
                )
            })?;
        Ok(scenario)
    }

    /// Checks the scripted schedule: each entry, and the count. Errors carry the entry's
    /// 0-based index and the field.
    fn validate_schedule(&self) -> Result<(), (usize, &'static str, String)> {
        let Some(schedule) = &self.schedule else {
            return Ok(());
        };
        if schedule.len() > SCHEDULE_EVENTS_MAX {
            return Err((
                SCHEDULE_EVENTS_MAX,
                "at_ms",
                format!("more than {SCHEDULE_EVENTS_MAX} events"),
            ));
        }
        for (index, entry) in schedule.iter().enumerate() {
            entry
                .validate(self)
                .map_err(|(field, message)| (index, field, message))?;
        }
        Ok(())
    }

    /// The fault kinds this scenario injects: the scripted schedule's (in kind order) when it
    /// has one, otherwise `[faults] kinds`. A sweep in which one of them never took effect is
    /// vacuous.
    #[must_use]
    pub fn fault_kinds(&self) -> Vec<FaultKind> {
        match &self.schedule {
            Some(schedule) => {
                let kinds: std::collections::BTreeSet<FaultKind> =
                    schedule.iter().map(|e| e.fault).collect();
                kinds.into_iter().collect()
            }
            None => self.faults.kinds.clone(),
        }
    }
}

/// Where entry `index` of the schedule sets `field` in `text` (the entry's `[[schedule]]`
/// header when the field is absent; the start of the schedule when the entry is not found).
fn schedule_field_offset(text: &str, index: usize, field: &str) -> usize {
    let mut headers = text.match_indices("[[schedule]]").map(|(at, _)| at);
    let Some(start) = headers.nth(index) else {
        return text.find("schedule").unwrap_or(0);
    };
    let end = text[start + 1..]
        .find("\n[")
        .map_or(text.len(), |rel| start + 1 + rel);
    let entry = &text[start..end];
    entry
        .match_indices(field)
        .map(|(rel, _)| start + rel)
        .find(|&at| {
            let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
            text[line_start..at].trim().is_empty()
        })
        .unwrap_or(start)
}

impl Scenario {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let w = &self.workload;
        let m = &w.mix;
        if self.name.is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        if self.run.safety_ms == 0 {
            return Err(("safety_ms", "must be positive".into()));
        }
        if let Some(spec) = &self.run.crash_at {
            crate::crashpoints::CrashPlan::parse(spec, 1).map_err(|e| ("crash_at", e))?;
            if self.run.crash_points > 0 {
                return Err((
                    "crash_at",
                    "replays one crash point: it does not go with `crash_points`".into(),
                ));
            }
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
        if w.tampered_price_pct > 100 {
            return Err((
                "tampered_price_pct",
                format!("{} is over 100", w.tampered_price_pct),
            ));
        }
        if w.timeout_ms == 0 {
            return Err(("timeout_ms", "must be positive".into()));
        }
        let f = &self.faults;
        f.every_ms.check("every_ms").map_err(|e| ("every_ms", e))?;
        f.down_ms.check("down_ms").map_err(|e| ("down_ms", e))?;
        if let Err(message) = self.edges.validate() {
            return Err(("edges", message));
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

#[cfg(test)]
mod tests {

    #[test]
    fn the_simulated_kinds_are_the_vocabularys_simulated_kinds_by_the_same_names() {
        let ours: Vec<_> = FaultKind::ALL.iter().map(|k| k.kind()).collect();
        let vocabulary: Vec<_> =
            sut::fault::FaultKind::of(sut::fault::Runner::Simulation).collect();
        let mut sorted = ours.clone();
        sorted.sort();
        assert_eq!(sorted, vocabulary);
        for kind in FaultKind::ALL {
            let text = toml::to_string(&std::collections::BTreeMap::from([("k", kind)]))
                .expect("serializes");
            assert_eq!(text.trim(), format!("k = \"{}\"", kind.name()));
            assert_eq!(FaultKind::parse(kind.name()), Ok(kind));
        }
        let e = FaultKind::parse("link_slow").unwrap_err();
        assert!(e.contains("deployment"), "{e}");
    }
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

    const HEAD: &str = "name = \"s\"\ndescription = \"d\"\n";

    fn schedule_error(entries: &str) -> ScenarioError {
        Scenario::parse("s.toml", &format!("{HEAD}{entries}")).unwrap_err()
    }

    #[test]
    fn a_schedule_parses_and_round_trips() {
        let text = format!(
            "{HEAD}[[schedule]]\nat_ms = 100\nfault = \"kill\"\nnode = \"token\"\nduration_ms = 300\ntear = true\n\
             [[schedule]]\nat_ms = 50\nfault = \"partition\"\nnodes = [\"db\", \"client1\"]\none_way = true\n\
             [[schedule]]\nat_ms = 0\nfault = \"clock_bump\"\nnode = \"id2\"\ndelta_ms = -5000\n"
        );
        let s = Scenario::parse("s.toml", &text).unwrap();
        let schedule = s.schedule.clone().unwrap();
        assert_eq!(schedule.len(), 3);
        assert_eq!(schedule[0].node.as_deref(), Some("token"));
        assert!(schedule[0].tear);
        assert_eq!(schedule[1].nodes, vec!["db", "client1"]);
        assert_eq!(schedule[2].delta_ms, Some(-5_000));
        assert_eq!(
            s.fault_kinds(),
            vec![FaultKind::Partition, FaultKind::Kill, FaultKind::ClockBump]
        );
        assert!(schedule[0].describe().contains("kill token"));
        // Written back and read again: the same scenario (what `scenario search` relies on).
        let written = toml::to_string(&s).unwrap();
        assert_eq!(Scenario::parse("again.toml", &written).unwrap(), s);
        // An empty schedule is a schedule: no fault at all, not the random nemesis.
        let none = Scenario::parse("s.toml", &format!("{HEAD}schedule = []\n")).unwrap();
        assert_eq!(none.schedule, Some(Vec::new()));
        assert!(none.fault_kinds().is_empty());
        let written = toml::to_string(&none).unwrap();
        assert_eq!(Scenario::parse("again.toml", &written).unwrap(), none);
    }

    #[test]
    fn schedule_errors_name_the_line_entry_and_field() {
        // Entry 2 (line 7) names a node that does not exist.
        let err = schedule_error(
            "[[schedule]]\nat_ms = 1\nfault = \"pause\"\nnode = \"db\"\n\
             [[schedule]]\nat_ms = 2\nfault = \"kill\"\nnode = \"id7\"\n",
        );
        assert_eq!((err.file.as_str(), err.line), ("s.toml", 10), "{err}");
        assert!(
            err.message.contains("schedule entry 2: field `node`") && err.message.contains("`id7`"),
            "{err}"
        );
        // A field that does not apply to the kind.
        let err =
            schedule_error("[[schedule]]\nat_ms = 1\nfault = \"loss\"\nloss_pct = 10\nppm = 5\n");
        assert_eq!(err.line, 7, "{err}");
        assert!(
            err.message
                .contains("field `ppm`: does not apply to a `loss` fault"),
            "{err}"
        );
        // A field the kind needs.
        let err =
            schedule_error("[[schedule]]\nat_ms = 1\nfault = \"clock_bump\"\nnode = \"id1\"\n");
        assert_eq!(err.line, 3, "{err}");
        assert!(
            err.message
                .contains("field `delta_ms`: a `clock_bump` fault needs it"),
            "{err}"
        );
        // Outside the safety phase.
        let err = schedule_error(
            "[run]\nsafety_ms = 1000\n[[schedule]]\nat_ms = 1000\nfault = \"pause\"\nnode = \"db\"\n",
        );
        assert_eq!(err.line, 6, "{err}");
        assert!(err.message.contains("field `at_ms`"), "{err}");
        // Unknown field and unknown kind: the TOML parser's own errors, with their lines.
        let err = schedule_error("[[schedule]]\nat_ms = 1\nfault = \"pause\"\nnod = \"db\"\n");
        assert_eq!(err.line, 6, "{err}");
        assert!(err.message.contains("unknown field `nod`"), "{err}");
        let err = schedule_error("[[schedule]]\nat_ms = 1\nfault = \"meteor\"\n");
        assert_eq!(err.line, 5, "{err}");
        // Bad values.
        for (entry, field) in [
            ("fault = \"partition\"\nnodes = [\"db\", \"db\"]", "nodes"),
            ("fault = \"partition\"\nnodes = [\"client9\"]", "nodes"),
            (
                "fault = \"clock_restart\"\nnode = \"db\"\ndelta_ms = 5",
                "node",
            ),
            (
                "fault = \"clock_strobe\"\nnode = \"db\"\ndelta_ms = -5\nperiod_ms = 5",
                "delta_ms",
            ),
            ("fault = \"loss\"\nloss_pct = 101", "loss_pct"),
            ("fault = \"pause\"\nnode = \"db\"\ndown_ms = 0", "down_ms"),
        ] {
            let err = schedule_error(&format!("[[schedule]]\nat_ms = 1\n{entry}\n"));
            assert!(
                err.message.contains(&format!("field `{field}`")),
                "{entry}: {err}"
            );
        }
        // Every node of a topology on one side is no partition.
        let every: Vec<String> = [
            "db",
            "id1",
            "id2",
            "id3",
            "token",
            "coord",
            "wallet",
            "inventory",
            "client1",
            "client2",
        ]
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect();
        let err = schedule_error(&format!(
            "[[schedule]]\nat_ms = 1\nfault = \"partition\"\nnodes = [{}]\n",
            every.join(", ")
        ));
        assert!(err.message.contains("every node"), "{err}");
    }
}
