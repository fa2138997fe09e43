//! The result model: one serde data model for every kind of result the bench produces.
//!
//! Producers (`sim`, `models`, `load`, the known-flaws catalog) convert their own results into
//! these plain types; everything downstream (HTML, JSON, JUnit, the gate) reads only these.
//! The types are self-describing: units are in the field names (`_ms` = simulated
//! milliseconds, `_s` = seconds, `_us` = microseconds), and a [`Summary`] carries a
//! [`SCHEMA_VERSION`] so a reader can refuse a file written by an incompatible version.
//!
//! JSON is the interchange format (`summary.json`); every type round-trips through it.
//! Floats must be finite: JSON has no NaN, and [`Summary::validate`] rejects them before anything
//! is written (see `crate::write`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Version of this data model. Bump on any change a reader of an older version would misread.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything one run of the bench produced: any mix of results (a gate run holds many).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// Human title of the run, e.g. "gate run" or the scenario name.
    pub title: String,
    /// Free-form provenance: git commit, host, command line. Shown in the report header.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The results, in the order they were produced.
    pub results: Vec<RunResult>,
    /// A gate run's comparison with its baseline (every check, expected, actual, status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateOutcome>,
}

impl Summary {
    /// An empty summary at the current schema version.
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            title: title.into(),
            meta: BTreeMap::new(),
            results: Vec::new(),
            gate: None,
        }
    }

    /// Appends a result; returns `self` for chaining.
    pub fn with(mut self, result: impl Into<RunResult>) -> Self {
        self.results.push(result.into());
        self
    }

    /// True when every result passed (see [`RunResult::passed`]) and, in a gate run, the
    /// comparison with the baseline passed.
    pub fn passed(&self) -> bool {
        self.results.iter().all(RunResult::passed) && self.gate.as_ref().is_none_or(|g| g.passed)
    }

    /// Checks what JSON cannot represent faithfully: the schema version, and that every float
    /// is finite. The error names the offending field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(ValidationError::SchemaVersion {
                found: self.schema_version,
                expected: SCHEMA_VERSION,
            });
        }
        for (index, result) in self.results.iter().enumerate() {
            let prefix = format!("results[{index}] ({} {})", result.kind(), result.name());
            result.check_finite(&mut |field, value| {
                if value.is_finite() {
                    Ok(())
                } else {
                    Err(ValidationError::NonFinite {
                        field: format!("{prefix}.{field}"),
                        value: value.to_string(),
                    })
                }
            })?;
        }
        Ok(())
    }
}

/// Why a [`Summary`] cannot be written or read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidationError {
    /// The summary was written by another version of this model.
    #[error("summary schema_version is {found}, this build reads version {expected}")]
    SchemaVersion { found: u32, expected: u32 },
    /// A float is NaN or infinite; JSON would turn it into `null` and break the round trip.
    #[error("field {field} is {value}; every number in a report must be finite")]
    NonFinite { field: String, value: String },
}

/// One result of any kind. Serialized with a `"kind"` tag. (A report holds a handful of them,
/// built once per run: the variants' sizes do not matter.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)]
pub enum RunResult {
    Simulation(SimulationReport),
    Model(ModelReport),
    Load(LoadReport),
    Flaws(FlawCatalogReport),
}

impl From<SimulationReport> for RunResult {
    fn from(r: SimulationReport) -> Self {
        Self::Simulation(r)
    }
}
impl From<ModelReport> for RunResult {
    fn from(r: ModelReport) -> Self {
        Self::Model(r)
    }
}
impl From<LoadReport> for RunResult {
    fn from(r: LoadReport) -> Self {
        Self::Load(r)
    }
}
impl From<FlawCatalogReport> for RunResult {
    fn from(r: FlawCatalogReport) -> Self {
        Self::Flaws(r)
    }
}

impl RunResult {
    /// "simulation", "model", "load" or "flaws".
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Simulation(_) => "simulation",
            Self::Model(_) => "model",
            Self::Load(_) => "load",
            Self::Flaws(_) => "flaws",
        }
    }

    /// The scenario or model name.
    pub fn name(&self) -> &str {
        match self {
            Self::Simulation(r) => &r.scenario,
            Self::Model(r) => &r.model,
            Self::Load(r) => &r.scenario,
            Self::Flaws(r) => &r.catalog,
        }
    }

    /// Whether this result, on its own, is a pass:
    /// - simulation: no violation and no invariant `Violated`;
    /// - model: every property `holds` or `found`;
    /// - load: no verification check `Violated`;
    /// - flaws: every flaw caught.
    pub fn passed(&self) -> bool {
        match self {
            Self::Simulation(r) => r.passed(),
            Self::Model(r) => r.passed(),
            Self::Load(r) => r.passed(),
            Self::Flaws(r) => r.passed(),
        }
    }

    fn check_finite<E>(&self, check: &mut impl FnMut(&str, f64) -> Result<(), E>) -> Result<(), E> {
        match self {
            Self::Simulation(r) => {
                check("sim_seconds", r.sim_seconds)?;
                check("wall_seconds", r.wall_seconds)
            }
            Self::Model(r) => {
                check("wall_seconds", r.wall_seconds)?;
                check("states_per_second", r.states_per_second)
            }
            Self::Load(r) => {
                check("duration_s", r.duration_s)?;
                check("warmup_s", r.warmup_s)?;
                if let Some(rate) = r.rate {
                    check("rate", rate)?;
                }
                for e in &r.endpoints {
                    check(
                        &format!("endpoints[{}].throughput_rps", e.name),
                        e.throughput_rps,
                    )?;
                    for (q, _) in &e.distribution {
                        check(&format!("endpoints[{}].distribution.quantile", e.name), *q)?;
                    }
                    for i in &e.over_time {
                        check(&format!("endpoints[{}].over_time.t_s", e.name), i.t_s)?;
                        check(&format!("endpoints[{}].over_time.rps", e.name), i.rps)?;
                    }
                }
                for s in &r.server {
                    check("server.t_s", s.t_s)?;
                    check("server.cpu_pct", s.cpu_pct)?;
                }
                for w in &r.fault_windows {
                    check("fault_windows.start_s", w.start_s)?;
                    check("fault_windows.end_s", w.end_s)?;
                }
                for step in r.ramp.iter().flat_map(|ramp| &ramp.steps) {
                    check("ramp.steps.rate_rps", step.rate_rps)?;
                }
                Ok(())
            }
            Self::Flaws(_) => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// Outcome of one invariant check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// Checked, and it held on every history.
    Held,
    /// Checked, and at least one history broke it.
    Violated,
    /// Not checked in this run (e.g. the scenario does not exercise it).
    NotChecked,
}

impl Judgement {
    /// Lower-case label used in tables and the gate: "held", "violated", "not checked".
    pub fn label(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Violated => "violated",
            Self::NotChecked => "not checked",
        }
    }
}

/// Result of one named invariant (simulation) or verification check (load run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvariantResult {
    /// Invariant name as in docs/architecture.md, e.g. `ids.unique`.
    pub name: String,
    pub verdict: Judgement,
    /// The seed of the (first) violating run, if any.
    #[serde(default)]
    pub seed: Option<u64>,
    /// The first event of the history that made the invariant fail, rendered as text.
    #[serde(default)]
    pub first_offending_event: Option<String>,
    /// Anything else worth showing (counts, the offending values).
    #[serde(default)]
    pub detail: Option<String>,
}

impl InvariantResult {
    /// A held invariant without detail.
    pub fn held(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Judgement::Held,
            seed: None,
            first_offending_event: None,
            detail: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------------------------

/// The seeds a simulation ran: an explicit list or a half-open range `start..end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seeds {
    List(Vec<u64>),
    Range { start: u64, end: u64 },
}

impl Seeds {
    /// Human form: `42`, `1, 2, 3`, or `1000..2000`.
    pub fn describe(&self) -> String {
        match self {
            Self::List(seeds) => seeds
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            Self::Range { start, end } => format!("{start}..{end}"),
        }
    }
}

/// A phase of a simulation run: safety with faults, then liveness, healed (docs/architecture.md,
/// "The fault model").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    /// `safety` or `liveness`.
    pub name: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// One injected fault, as a span of simulated time on one node (or `net` for the network).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpan {
    /// Node name, or `net` for network-wide faults (loss, latency).
    pub node: String,
    /// `partition`, `kill`, `pause`, `clock_bump`, `clock_strobe`, `drift`, `loss`, `latency`, ...
    pub kind: String,
    pub start_ms: u64,
    /// `None` for an instantaneous fault or one never healed.
    #[serde(default)]
    pub end_ms: Option<u64>,
    /// E.g. "one-way db1 -> alloc1", "-288000 ms".
    #[serde(default)]
    pub detail: String,
}

/// One node's clock offset from true (simulated) time over the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSeries {
    pub node: String,
    /// `(sim_ms, offset_ms)` points, in increasing `sim_ms`.
    pub points: Vec<(u64, i64)>,
}

/// Client operation outcomes in one bucket of simulated time starting at `t_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsBucket {
    pub t_ms: u64,
    pub ok: u64,
    pub failed: u64,
    /// Outcome unknown to the client (timeout, crash while in flight).
    pub indeterminate: u64,
}

/// One kind of client operation over a whole sweep: how many succeeded, were refused (with the
/// refusals' reasons, most frequent first) or got no answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRow {
    pub kind: String,
    pub ok: u64,
    /// Refused: the client was told it failed, and why.
    pub failed: u64,
    /// No answer before the client's timeout: the outcome is unknown.
    pub no_answer: u64,
    /// `(reason, count)`, numbers in the reason written `N`, most frequent first.
    #[serde(default)]
    pub reasons: Vec<(String, u64)>,
}

/// One declared edge state of the system under test (a "sometimes" point) over a whole sweep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRow {
    /// `machine.what`.
    pub name: String,
    /// What the situation is.
    pub about: String,
    /// How often the sweep reached it.
    pub reached: u64,
    /// In how many seeds.
    #[serde(default)]
    pub seeds_reached: u64,
    /// Whether the scenario owns it: a sweep of at least `owned_from_seeds` seeds that never
    /// reaches it fails `edges.reached`. `None`: not owned (reported only).
    #[serde(default)]
    pub owned_from_seeds: Option<u64>,
}

/// A violation found on one seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub seed: u64,
    pub invariant: String,
    pub detail: String,
    /// The command that replays this seed exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    /// The crash point whose run broke the invariant (`node-role site label`), when a crash
    /// point's run did rather than the seed's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_point: Option<String>,
}

/// Crash points over a sweep: each seed's run finds the steps its nodes reach, and at most
/// `budget` of them are tried, each a run of the seed with that node crashed right there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashPointsReport {
    /// Points tried per seed at most.
    pub budget: u32,
    /// Seeds that found and tried points.
    pub seeds: u64,
    /// Runs with a crash (one per point tried in a seed).
    pub runs: u64,
    /// Distinct points found, tried and failed over the sweep.
    pub found: u64,
    /// Distinct points tried.
    pub tried: u64,
    /// Distinct points whose crash broke an invariant in some seed.
    pub failed: u64,
    /// Crashes planned that their run never reached (the node went down first).
    pub unreached: u64,
    /// Every distinct point.
    pub points: Vec<CrashPointRow>,
}

/// One distinct crash point over a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashPointRow {
    /// `node-role site label`, e.g. `coord send tcc.try.wallet`.
    pub point: String,
    /// Seeds that reached it.
    pub found_in_seeds: u64,
    /// Runs that crashed there.
    pub tried: u64,
    /// Of those, runs that broke an invariant.
    pub failed: u64,
}

/// A deterministic simulation run (one scenario over one or many seeds). Timeline fields
/// (`faults`, `clock_offsets`, `ops_over_time`, `phases`) describe the seed named by
/// `timeline_seed` (normally the first failing seed, else the first seed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    pub scenario: String,
    pub seeds: Seeds,
    /// How many seeds actually ran (a run may stop at the first failure).
    pub seeds_run: u64,
    /// The seed the timeline fields describe.
    #[serde(default)]
    pub timeline_seed: Option<u64>,
    /// Command that replays the failing (or shown) seed exactly.
    #[serde(default)]
    pub replay_command: Option<String>,
    /// Simulated time covered, summed over seeds.
    pub sim_seconds: f64,
    pub wall_seconds: f64,
    /// Simulation events processed, summed over seeds.
    pub events: u64,
    pub nodes: Vec<String>,
    #[serde(default)]
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub faults: Vec<FaultSpan>,
    #[serde(default)]
    pub clock_offsets: Vec<ClockSeries>,
    #[serde(default)]
    pub ops_over_time: Vec<OpsBucket>,
    pub invariants: Vec<InvariantResult>,
    #[serde(default)]
    pub violations: Vec<Violation>,
    /// Per fault effect, how often it took effect, summed over seeds, e.g.
    /// `partition.dropped_messages`, `crash.lost_pending_writes`, `clock.rollback_waits`.
    #[serde(default)]
    pub fault_effects: BTreeMap<String, u64>,
    /// What each counter of `fault_effects` is: `injected` (a fault the nemesis injected),
    /// `effect` (what a fault did: the counters fault coverage is judged on) or `response` (how
    /// the system responded, and its traffic). A counter not listed is shown as an effect.
    #[serde(default)]
    pub counter_groups: BTreeMap<String, String>,
    /// Per kind of client operation, over every seed: ok, refused (and why), no answer.
    #[serde(default)]
    pub operations: Vec<OperationRow>,
    /// Every declared edge state: how often the sweep reached it, and whether it is owned.
    #[serde(default)]
    pub edges: Vec<EdgeRow>,
    /// Crash points, when the sweep tried them (boxed: most reports have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_points: Option<Box<CrashPointsReport>>,
}

impl SimulationReport {
    /// No violation and no invariant `Violated`.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
            && self
                .invariants
                .iter()
                .all(|i| i.verdict != Judgement::Violated)
    }
}

// ---------------------------------------------------------------------------------------------
// Model checking
// ---------------------------------------------------------------------------------------------

/// Property kind, as in stateright.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PropertyKind {
    Always,
    Sometimes,
    Eventually,
}

/// Property outcome. `Holds`/`Violated` for `always` and `eventually`; `Found`/`NotFound` for
/// `sometimes` (an example was, or was not, discovered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PropertyVerdict {
    Holds,
    Violated,
    Found,
    NotFound,
    /// Not decided: the check stopped at the first violation before reaching it.
    NotChecked,
}

impl PropertyVerdict {
    /// `holds` and `found` pass; `violated` and `not_found` fail; `not_checked` neither (it
    /// does not fail a run).
    pub fn passed(self) -> bool {
        matches!(self, Self::Holds | Self::Found | Self::NotChecked)
    }

    /// Lower-case label: "holds", "violated", "found", "not found".
    pub fn label(self) -> &'static str {
        match self {
            Self::Holds => "holds",
            Self::Violated => "violated",
            Self::Found => "found",
            Self::NotFound => "not found",
            Self::NotChecked => "not checked (stopped at the first violation)",
        }
    }
}

/// One checked property of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PropertyReport {
    /// The property's name (invariant names follow docs/architecture.md, e.g. `ids.unique`).
    pub name: String,
    /// `always`, `sometimes` or `eventually`.
    pub kind: PropertyKind,
    /// `holds`, `violated`, `found` or `not_found`.
    pub verdict: PropertyVerdict,
    /// The path to the violation, one message per line in the form `from -> to: Message{..}`;
    /// other lines (state notes) are shown as notes. In a summary, also the path to the
    /// discovery of a `sometimes` ([`ModelReport::for_summary`]).
    #[serde(default)]
    pub counterexample: Option<Vec<String>>,
    /// For a `sometimes` found: the path to the example, one step per line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example: Option<Vec<String>>,
}

/// An exhaustive model check: what the model checker found and how fast. The one report type
/// of a model check (the `models` crate produces it; summaries, the HTML and the gate read it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    /// The model's name (in a summary, with its flaw).
    pub model: String,
    /// The flaw switched on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flaw: Option<String>,
    /// Checker threads (0 in a summary: not part of the result).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub threads: usize,
    /// The depth bound asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth_limit: Option<usize>,
    /// True when the whole bounded state space was explored (no depth cut-off was reached).
    #[serde(default, skip_serializing_if = "is_false")]
    pub exhaustive: bool,
    /// States visited (including revisits).
    pub states: u64,
    /// Distinct states: pinned by the gate as a regression guard.
    pub unique_states: u64,
    /// The deepest path explored.
    pub max_depth: u64,
    /// Wall time of the check.
    pub wall_seconds: f64,
    /// `states / wall_seconds`.
    pub states_per_second: f64,
    /// Every property, in declaration order (the owned edge states last).
    pub properties: Vec<PropertyReport>,
    /// How often the search passed through each edge state (`sut::edge`), owned or not.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub edges: BTreeMap<String, u64>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
const fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
const fn is_false(b: &bool) -> bool {
    !*b
}

impl ModelReport {
    /// Every property holds or was found.
    pub fn passed(&self) -> bool {
        self.properties.iter().all(|p| p.verdict.passed())
    }

    /// The report of the named property.
    #[must_use]
    pub fn property(&self, name: &str) -> Option<&PropertyReport> {
        self.properties.iter().find(|p| p.name == name)
    }

    /// Properties that failed: a violated `always`/`eventually`, or a `sometimes` never found.
    #[must_use]
    pub fn failures(&self) -> Vec<&PropertyReport> {
        self.properties
            .iter()
            .filter(|p| {
                matches!(
                    p.verdict,
                    PropertyVerdict::Violated | PropertyVerdict::NotFound
                )
            })
            .collect()
    }

    /// As a run's summary shows it: the flaw in the model's name, each path (violation or
    /// example) as the property's counterexample, and nothing of the run's settings.
    #[must_use]
    pub fn for_summary(&self) -> Self {
        let model = match &self.flaw {
            Some(flaw) => format!("{} (flaw: {flaw})", self.model),
            None => self.model.clone(),
        };
        Self {
            model,
            flaw: None,
            threads: 0,
            depth_limit: None,
            exhaustive: false,
            properties: self
                .properties
                .iter()
                .map(|p| PropertyReport {
                    counterexample: p.counterexample.clone().or_else(|| p.example.clone()),
                    example: None,
                    ..p.clone()
                })
                .collect(),
            edges: BTreeMap::new(),
            ..self.clone()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/// The fewest samples a percentile with `nines` nines (2: P99, 3: P99.9, 4: P99.99) needs to be
/// more than the sample's maximum: `10^nines`. Reports show a percentile only from there on.
#[must_use]
pub const fn tail_samples_min(nines: u32) -> u64 {
    10u64.pow(nines)
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub p9999_us: u64,
    pub max_us: u64,
}

/// Latency and rate in one reporting interval starting at `t_s` (seconds since the run began).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntervalStats {
    pub t_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// The slowest request of the interval (0 in reports written before it was recorded).
    #[serde(default)]
    pub max_us: u64,
    pub rps: f64,
    /// Requests of the interval that failed.
    #[serde(default)]
    pub errors: u64,
}

/// Statistics of one endpoint (request kind) of a load run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointStats {
    pub name: String,
    pub requests: u64,
    /// Error class (e.g. `http_503`, `timeout`) to count.
    #[serde(default)]
    pub errors: BTreeMap<String, u64>,
    pub throughput_rps: f64,
    /// Latency measured from the intended send time (coordinated omission corrected, wrk2 style).
    pub corrected: Percentiles,
    /// Latency measured from the actual send time (what a naive client reports).
    pub uncorrected: Percentiles,
    /// `(quantile, latency_us)` points of the corrected distribution, quantile in `[0, 1)`,
    /// for the percentile plot (e.g. HdrHistogram's `iter_quantiles`).
    #[serde(default)]
    pub distribution: Vec<(f64, u64)>,
    #[serde(default)]
    pub over_time: Vec<IntervalStats>,
}

impl EndpointStats {
    /// Sum of all error counts.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Server resource usage at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResourceSample {
    pub t_s: f64,
    pub cpu_pct: f64,
    pub rss_bytes: u64,
}

/// A window of a load run during which a fault was active (e.g. the server was killed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultWindow {
    pub start_s: f64,
    pub end_s: f64,
    pub label: String,
    /// The process or link it hit, for its lane on the fault timeline (`None`: the run's one
    /// server).
    #[serde(default)]
    pub process: Option<String>,
    /// The fault kind (`kill`, `pause`, `clock`, …), one colour each on the timeline.
    #[serde(default)]
    pub kind: Option<String>,
}

/// A load run against the real server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub scenario: String,
    /// Base URL or description of the system under test (shown as text, never linked).
    pub target: String,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Requests per second in constant-rate mode; `None` for closed-loop users.
    #[serde(default)]
    pub rate: Option<f64>,
    pub users: u64,
    pub endpoints: Vec<EndpointStats>,
    #[serde(default)]
    pub server: Vec<ResourceSample>,
    #[serde(default)]
    pub fault_windows: Vec<FaultWindow>,
    /// Post-run verification (no duplicate IDs, conservation, ...).
    #[serde(default)]
    pub verification: Vec<InvariantResult>,
    /// A black-box run's concurrency, measured from its own history: how many requests were
    /// ever in flight at once (a race between requests needs two), the longest request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// A black-box run's concurrency ramp, when it chose its client count itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<Ramp>,
}

/// How far a black-box run's requests overlapped, measured from its history (each request's
/// interval from its send to its answer, or to the client giving up on it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Concurrency {
    /// Requests measured.
    pub requests: u64,
    /// The most requests in flight at once, over the whole run.
    pub max_in_flight: u64,
    /// The most requests of one key in flight at once (the key, or the busiest one).
    pub max_in_flight_per_key: u64,
    /// Keys whose requests ever overlapped (two or more in flight at once), of `keys`.
    pub keys_overlapped: u64,
    /// Keys requested.
    pub keys: u64,
    /// Per server (URL, instance): the most of its requests in flight at once.
    #[serde(default)]
    pub servers: Vec<LaneConcurrency>,
    /// Time with two or more requests in flight at once, µs.
    pub overlapped_us: u64,
    /// From the first send to the last answer, µs.
    pub span_us: u64,
    /// The longest request, µs.
    pub longest_request_us: u64,
    /// Why a pass says nothing about races between requests (`None`: requests overlapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive: Option<String>,
}

/// One server's share of a run's concurrency.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneConcurrency {
    /// The server's name (`server 1`).
    pub name: String,
    /// Requests sent to it.
    pub requests: u64,
    /// The most of them in flight at once.
    pub max_in_flight: u64,
}

/// A concurrency ramp: client counts tried in short steps before the checked phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ramp {
    /// Each step, in order.
    pub steps: Vec<RampStep>,
    /// The client count of the checked phase.
    pub chosen: u64,
    /// Why the ramp stopped and chose it.
    pub reason: String,
}

/// One step of a [`Ramp`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RampStep {
    /// Client threads.
    pub clients: u64,
    /// Requests answered in the measured part of the step (errors included).
    pub requests: u64,
    /// Of them, errors (refused, error answers, timeouts, unknown outcomes).
    pub errors: u64,
    /// Requests per second.
    pub rate_rps: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// P99 latency, µs.
    pub p99_us: u64,
}

impl LoadReport {
    /// No verification check `Violated`.
    pub fn passed(&self) -> bool {
        self.verification
            .iter()
            .all(|v| v.verdict != Judgement::Violated)
    }

    /// The endpoint with this name.
    pub fn endpoint(&self, name: &str) -> Option<&EndpointStats> {
        self.endpoints.iter().find(|e| e.name == name)
    }
}

// ---------------------------------------------------------------------------------------------
// Known flaws
// ---------------------------------------------------------------------------------------------

/// Whether one deliberately broken variant was caught, and by what.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlawResult {
    /// Flaw option name, e.g. `segment_reload_without_version_check`.
    pub flaw: String,
    /// The check that caught it (`sim:ids.unique`, `model:fence`), `None` if nothing did.
    #[serde(default)]
    pub caught_by: Option<String>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub detail: Option<String>,
    /// Where the flaw comes from (a seed section, an upstream issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The simulation scenario that is expected to catch it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// Median over the sweeps of the seeds run until the first violation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeds_to_failure: Option<f64>,
    /// Per sweep: seeds run until the first violation (`None`: none within the sweep's limit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweeps: Vec<Option<u64>>,
    /// The model that finds a counterexample, where the flaw is modelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Length of the model's counterexample (its depth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_depth: Option<usize>,
    /// The model's counterexample as a message sequence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counterexample: Vec<String>,
}

/// The known-flaws catalog run: every documented flaw must be caught.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlawCatalogReport {
    pub catalog: String,
    pub flaws: Vec<FlawResult>,
}

impl FlawCatalogReport {
    /// Every flaw was caught.
    pub fn passed(&self) -> bool {
        self.flaws.iter().all(|f| f.caught_by.is_some())
    }
}

/// Outcome of one gate check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateStatus {
    Pass,
    Regressed,
    New,
    Missing,
}

impl GateStatus {
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Regressed => "REGRESSED",
            Self::New => "new",
            Self::Missing => "MISSING",
        }
    }

    /// Whether this status lets the gate pass.
    pub fn ok(self) -> bool {
        matches!(self, Self::Pass | Self::New)
    }
}

/// One row of the gate table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRow {
    /// E.g. `simulation clock_skew: invariant ids.unique`.
    pub check: String,
    pub expected: String,
    pub actual: String,
    pub status: GateStatus,
}

/// The gate's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateOutcome {
    pub rows: Vec<GateRow>,
    pub passed: bool,
}

impl GateOutcome {
    /// Rows with the given status.
    pub fn with_status(&self, status: GateStatus) -> impl Iterator<Item = &GateRow> {
        self.rows.iter().filter(move |r| r.status == status)
    }

    /// A plain-text table for the terminal, with a verdict line at the end.
    pub fn table(&self) -> String {
        let headers = ["check", "expected", "actual", "status"];
        let cells: Vec<[&str; 4]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.check.as_str(),
                    r.expected.as_str(),
                    r.actual.as_str(),
                    r.status.label(),
                ]
            })
            .collect();
        let mut widths = headers.map(|h| h.chars().count());
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, row: [&str; 4]| {
            let parts: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            let _ = writeln!(out, "{}", parts.join("  ").trim_end());
        };
        line(&mut out, headers);
        let rule = widths.map(|w| "-".repeat(w));
        line(
            &mut out,
            [
                rule[0].as_str(),
                rule[1].as_str(),
                rule[2].as_str(),
                rule[3].as_str(),
            ],
        );
        for row in cells {
            line(&mut out, row);
        }
        let count = |s| self.rows.iter().filter(|r| r.status == s).count();
        let _ = writeln!(
            out,
            "gate {}: {} pass, {} regressed, {} new, {} missing",
            if self.passed { "PASSED" } else { "FAILED" },
            count(GateStatus::Pass),
            count(GateStatus::Regressed),
            count(GateStatus::New),
            count(GateStatus::Missing)
        );
        out
    }
}
