//! The regression gate: compares a [`Summary`] against a committed baseline file, k6-thresholds
//! style, and says per check whether it passed, regressed, is new, or went missing.
//!
//! # Baseline file
//!
//! TOML (or JSON when the file name ends in `.json`; same structure). Produced by
//! [`Baseline::from_summary`] (`--update-baseline`) and committed; edit tolerances by hand.
//!
//! ```toml
//! schema_version = 1
//!
//! [[simulation]]
//! scenario = "clock_skew"
//! invariants = ["ids.unique", "ids.monotonic"]      # each must be `held`; no violation at all
//! fault_effects = ["partition.dropped_messages"]    # each must have taken effect (count > 0)
//!
//! [[model]]
//! model = "segment_alloc"
//! unique_states = 18342                             # pinned exactly: any change is flagged
//! [model.properties]
//! "ids.unique" = "holds"                            # holds | violated | found | not_found
//!
//! [[flaws]]
//! catalog = "known-flaws"
//! caught = ["segment_reload_without_version_check"] # each must be caught
//!
//! [[load]]
//! scenario = "steady"
//! reference_endpoint = "health"   # ratios are relative to this endpoint, measured in the same run
//! tolerance = 0.25                # relative slack on every ratio
//! verification = ["ids.unique"]   # each must be `held`
//! [load.endpoints.allocate]
//! throughput_ratio = 0.8          # rps(allocate) / rps(health): regressed if < 0.8 × (1 − tolerance)
//! p99_ratio = 3.5                 # corrected P99(allocate) / P99(health): regressed if > 3.5 × (1 + tolerance)
//! error_rate_max = 0.001          # errors / requests: regressed if above
//! ```
//!
//! Load checks are **ratios** within one run, never absolute times: machines differ.
//!
//! # Statuses
//!
//! - `pass`: as expected (a ratio better than the baseline also passes);
//! - `regressed`: worse than expected, or a check that is not in the baseline fails on its own;
//! - `new`: in the summary, not in the baseline, and passing (run `--update-baseline` to pin it);
//! - `missing`: in the baseline, absent from the summary.
//!
//! The gate passes when no row is `regressed` or `missing`: a check that silently stopped
//! running is a regression of the gate itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::model::{GateOutcome, GateRow, GateStatus};

use crate::model::{
    FlawCatalogReport, Judgement, LoadReport, ModelReport, PropertyVerdict, RunResult,
    SimulationReport, Summary,
};

/// Version of the baseline file format.
pub const BASELINE_VERSION: u32 = 1;

/// Default relative tolerance on load ratios for a new baseline.
pub const TOLERANCE_DEFAULT: f64 = 0.25;

/// Smallest `error_rate_max` written by [`Baseline::from_summary`].
pub const ERROR_RATE_FLOOR: f64 = 0.001;

/// The committed expectations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulation: Vec<SimulationBaseline>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model: Vec<ModelBaseline>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flaws: Vec<FlawsBaseline>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load: Vec<LoadBaseline>,
}

/// Expectations for one simulation scenario: no violation, these invariants held, these fault
/// effects observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulationBaseline {
    pub scenario: String,
    #[serde(default)]
    pub invariants: Vec<String>,
    #[serde(default)]
    pub fault_effects: Vec<String>,
}

/// Expectations for one model: the pinned unique-state count and property verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBaseline {
    pub model: String,
    pub unique_states: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, PropertyVerdict>,
}

/// Expectations for the known-flaws catalog: every listed flaw caught.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlawsBaseline {
    pub catalog: String,
    #[serde(default)]
    pub caught: Vec<String>,
}

/// Expectations for one load scenario, as ratios against a reference endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBaseline {
    pub scenario: String,
    pub reference_endpoint: String,
    pub tolerance: f64,
    #[serde(default)]
    pub verification: Vec<String>,
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointBaseline>,
}

/// Ratios of one endpoint against the reference endpoint of the same run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointBaseline {
    /// rps(endpoint) / rps(reference). Absent for the reference endpoint itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_ratio: Option<f64>,
    /// corrected P99(endpoint) / corrected P99(reference). Absent for the reference itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ratio: Option<f64>,
    /// errors / requests must not exceed this.
    pub error_rate_max: f64,
}

/// A baseline file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("cannot read baseline {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syntax or type error; `line`/`column` are 1-based, `field` is the path to the value.
    #[error("{path}:{line}:{column}: field `{field}`: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },
    #[error("{path}: schema_version is {found}, this build reads version {expected}")]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{path}: field `{field}`: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("cannot serialize baseline: {0}")]
    Serialize(String),
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn field_or_root(path: &serde_path_to_error::Path) -> String {
    let s = path.to_string();
    if s.is_empty() || s == "." {
        "(document)".to_owned()
    } else {
        s
    }
}

impl Baseline {
    /// Parses baseline text; `path` is only used in error messages and to pick the format
    /// (`.json` → JSON, anything else → TOML).
    pub fn parse(path: &Path, text: &str) -> Result<Self, BaselineError> {
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let baseline: Baseline = if is_json {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de).map_err(|e| BaselineError::Parse {
                path: path.to_owned(),
                line: e.inner().line(),
                column: e.inner().column(),
                field: field_or_root(e.path()),
                message: e.inner().to_string(),
            })?
        } else {
            let parse_err = |field: String, e: &toml::de::Error| {
                let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
                BaselineError::Parse {
                    path: path.to_owned(),
                    line,
                    column,
                    field,
                    message: e.message().to_owned(),
                }
            };
            let de = toml::de::Deserializer::parse(text)
                .map_err(|e| parse_err("(document)".to_owned(), &e))?;
            serde_path_to_error::deserialize(de)
                .map_err(|e| parse_err(field_or_root(e.path()), e.inner()))?
        };
        baseline.check(path)?;
        Ok(baseline)
    }

    /// Reads and parses a baseline file.
    pub fn load(path: &Path) -> Result<Self, BaselineError> {
        let text = std::fs::read_to_string(path).map_err(|source| BaselineError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    fn check(&self, path: &Path) -> Result<(), BaselineError> {
        if self.schema_version != BASELINE_VERSION {
            return Err(BaselineError::Version {
                path: path.to_owned(),
                found: self.schema_version,
                expected: BASELINE_VERSION,
            });
        }
        let invalid = |field: String, message: &str| BaselineError::Invalid {
            path: path.to_owned(),
            field,
            message: message.to_owned(),
        };
        for (i, l) in self.load.iter().enumerate() {
            if !(l.tolerance.is_finite() && (0.0..10.0).contains(&l.tolerance)) {
                return Err(invalid(
                    format!("load[{i}].tolerance"),
                    "must be a finite number in [0, 10)",
                ));
            }
            for (name, e) in &l.endpoints {
                for (field, value) in [
                    ("throughput_ratio", e.throughput_ratio),
                    ("p99_ratio", e.p99_ratio),
                    ("error_rate_max", Some(e.error_rate_max)),
                ] {
                    if let Some(v) = value
                        && !(v.is_finite() && v >= 0.0)
                    {
                        return Err(invalid(
                            format!("load[{i}].endpoints.{name}.{field}"),
                            "must be a finite number ≥ 0",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Serializes to TOML.
    pub fn to_toml(&self) -> Result<String, BaselineError> {
        toml::to_string_pretty(self).map_err(|e| BaselineError::Serialize(e.to_string()))
    }

    /// Writes the baseline atomically, as TOML (or JSON for a `.json` path).
    pub fn save(&self, path: &Path) -> Result<(), BaselineError> {
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let text = if is_json {
            serde_json::to_string_pretty(self)
                .map_err(|e| BaselineError::Serialize(e.to_string()))?
        } else {
            self.to_toml()?
        };
        crate::atomic::write_atomic(path, text.as_bytes())
            .map_err(|e| BaselineError::Serialize(e.to_string()))
    }

    /// The baseline that `summary` would pass (`--update-baseline`). Tolerances and reference
    /// endpoints are kept from `previous` where it has the same load scenario. A failing
    /// simulation, load verification or flaw is still recorded as expected to pass: updating
    /// the baseline never blesses a violation. Model verdicts are pinned as observed (a model of
    /// a broken variant is expected to find its violation).
    pub fn from_summary(summary: &Summary, previous: Option<&Baseline>) -> Baseline {
        let mut b = Baseline {
            schema_version: BASELINE_VERSION,
            ..Baseline::default()
        };
        for result in &summary.results {
            match result {
                RunResult::Simulation(r) => b.simulation.push(SimulationBaseline {
                    scenario: r.scenario.clone(),
                    invariants: r
                        .invariants
                        .iter()
                        .filter(|i| i.verdict != Judgement::NotChecked)
                        .map(|i| i.name.clone())
                        .collect(),
                    fault_effects: r
                        .fault_effects
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(k, _)| k.clone())
                        .collect(),
                }),
                RunResult::Model(r) => b.model.push(ModelBaseline {
                    model: r.model.clone(),
                    unique_states: r.unique_states,
                    properties: r
                        .properties
                        .iter()
                        .map(|p| (p.name.clone(), p.verdict))
                        .collect(),
                }),
                RunResult::Flaws(r) => b.flaws.push(FlawsBaseline {
                    catalog: r.catalog.clone(),
                    caught: r.flaws.iter().map(|f| f.flaw.clone()).collect(),
                }),
                RunResult::Load(r) => b.load.push(LoadBaseline::observed(r, previous)),
            }
        }
        b
    }
}

impl LoadBaseline {
    /// The expectations `r` meets: its ratios against the reference endpoint (kept from
    /// `previous` if it has the scenario, else the first endpoint) and its error rates with
    /// `previous`'s tolerance.
    fn observed(r: &LoadReport, previous: Option<&Baseline>) -> LoadBaseline {
        let prev = previous.and_then(|p| p.load.iter().find(|l| l.scenario == r.scenario));
        let reference = prev
            .map(|p| p.reference_endpoint.clone())
            .filter(|name| r.endpoint(name).is_some())
            .or_else(|| r.endpoints.first().map(|e| e.name.clone()))
            .unwrap_or_default();
        let tolerance = prev.map_or(TOLERANCE_DEFAULT, |p| p.tolerance);
        let ref_stats = r.endpoint(&reference);
        let endpoints = r
            .endpoints
            .iter()
            .map(|e| {
                let is_ref = e.name == reference;
                let ratios = ref_stats
                    .filter(|_| !is_ref)
                    .map(|rs| LoadRatios::of(e, rs));
                let error_rate = error_rate(e.error_count(), e.requests);
                (
                    e.name.clone(),
                    EndpointBaseline {
                        throughput_ratio: ratios.and_then(|r| r.throughput).map(round4),
                        p99_ratio: ratios.and_then(|r| r.p99).map(round4),
                        error_rate_max: round4(
                            (error_rate * (1.0 + tolerance)).max(ERROR_RATE_FLOOR),
                        ),
                    },
                )
            })
            .collect();
        LoadBaseline {
            scenario: r.scenario.clone(),
            reference_endpoint: reference,
            tolerance,
            verification: r
                .verification
                .iter()
                .filter(|v| v.verdict != Judgement::NotChecked)
                .map(|v| v.name.clone())
                .collect(),
            endpoints,
        }
    }
}

/// Rounds to 4 significant digits, for a readable baseline file.
fn round4(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let digits = 3 - v.abs().log10().floor() as i32;
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn error_rate(errors: u64, requests: u64) -> f64 {
    if requests == 0 {
        if errors == 0 { 0.0 } else { 1.0 }
    } else {
        errors as f64 / requests as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct LoadRatios {
    throughput: Option<f64>,
    p99: Option<f64>,
}

impl LoadRatios {
    fn of(e: &crate::model::EndpointStats, reference: &crate::model::EndpointStats) -> Self {
        let div = |a: f64, b: f64| (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b);
        Self {
            throughput: div(e.throughput_rps, reference.throughput_rps),
            p99: div(e.corrected.p99_us as f64, reference.corrected.p99_us as f64),
        }
    }
}

struct Rows(Vec<GateRow>);

impl Rows {
    fn push(
        &mut self,
        check: impl Into<String>,
        expected: impl Into<String>,
        actual: impl Into<String>,
        status: GateStatus,
    ) {
        self.0.push(GateRow {
            check: check.into(),
            expected: expected.into(),
            actual: actual.into(),
            status,
        });
    }
    /// A baseline result absent from the summary.
    fn missing(&mut self, check: String) {
        self.push(check, "present", "absent", GateStatus::Missing);
    }
}

/// Compares `summary` with `baseline`.
pub fn compare(baseline: &Baseline, summary: &Summary) -> GateOutcome {
    let mut rows = Rows(Vec::new());
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for sb in &baseline.simulation {
        seen.insert(("simulation", &sb.scenario));
        match find(summary, |r| match r {
            RunResult::Simulation(s) if s.scenario == sb.scenario => Some(s),
            _ => None,
        }) {
            Some(s) => compare_simulation(&mut rows, sb, s),
            None => rows.missing(format!("simulation {}", sb.scenario)),
        }
    }
    for mb in &baseline.model {
        seen.insert(("model", &mb.model));
        match find(summary, |r| match r {
            RunResult::Model(m) if m.model == mb.model => Some(m),
            _ => None,
        }) {
            Some(m) => compare_model(&mut rows, mb, m),
            None => rows.missing(format!("model {}", mb.model)),
        }
    }
    for fb in &baseline.flaws {
        seen.insert(("flaws", &fb.catalog));
        match find(summary, |r| match r {
            RunResult::Flaws(f) if f.catalog == fb.catalog => Some(f),
            _ => None,
        }) {
            Some(f) => compare_flaws(&mut rows, fb, f),
            None => rows.missing(format!("flaws {}", fb.catalog)),
        }
    }
    for lb in &baseline.load {
        seen.insert(("load", &lb.scenario));
        match find(summary, |r| match r {
            RunResult::Load(l) if l.scenario == lb.scenario => Some(l),
            _ => None,
        }) {
            Some(l) => compare_load(&mut rows, lb, l),
            None => rows.missing(format!("load {}", lb.scenario)),
        }
    }
    compare_unexpected(&mut rows, &seen, summary);
    let rows = rows.0;
    let passed = rows.iter().all(|r| r.status.ok());
    GateOutcome { rows, passed }
}

/// Results the baseline does not know: new when they pass, regressed when they fail.
fn compare_unexpected(rows: &mut Rows, seen: &BTreeSet<(&str, &str)>, summary: &Summary) {
    for r in &summary.results {
        if !seen.contains(&(r.kind(), r.name())) {
            let (status, actual) = if r.passed() {
                (GateStatus::New, "passed")
            } else {
                (GateStatus::Regressed, "failed")
            };
            rows.push(
                format!("{} {}", r.kind(), r.name()),
                "not in baseline",
                actual,
                status,
            );
        }
    }
}

fn find<'a, T>(
    summary: &'a Summary,
    pick: impl Fn(&'a RunResult) -> Option<&'a T>,
) -> Option<&'a T> {
    summary.results.iter().find_map(pick)
}

/// `Pass` if `ok`, else `Regressed`.
fn pass_if(ok: bool) -> GateStatus {
    if ok {
        GateStatus::Pass
    } else {
        GateStatus::Regressed
    }
}

/// `New` if `ok`, else `Regressed` (a check the baseline does not have).
fn new_if(ok: bool) -> GateStatus {
    if ok {
        GateStatus::New
    } else {
        GateStatus::Regressed
    }
}

fn compare_simulation(rows: &mut Rows, b: &SimulationBaseline, s: &SimulationReport) {
    let name = format!("simulation {}", s.scenario);
    let violations = s.violations.len();
    let seeds: Vec<String> = s
        .violations
        .iter()
        .map(|v| v.seed.to_string())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    rows.push(
        format!("{name}: violations"),
        "0",
        if violations == 0 {
            "0".to_owned()
        } else {
            format!("{violations} (seeds {})", seeds.join(", "))
        },
        pass_if(violations == 0),
    );
    for inv in &b.invariants {
        let check = format!("{name}: invariant {inv}");
        match s.invariants.iter().find(|i| &i.name == inv) {
            Some(i) => rows.push(
                check,
                "held",
                i.verdict.label(),
                pass_if(i.verdict == Judgement::Held),
            ),
            None => rows.push(check, "held", "absent", GateStatus::Missing),
        }
    }
    for i in s
        .invariants
        .iter()
        .filter(|i| !b.invariants.contains(&i.name) && i.verdict != Judgement::NotChecked)
    {
        rows.push(
            format!("{name}: invariant {}", i.name),
            "not in baseline",
            i.verdict.label(),
            new_if(i.verdict == Judgement::Held),
        );
    }
    compare_fault_effects(rows, &name, b, s);
}

/// The fault effects: some effect at all, each expected one, and the new ones.
fn compare_fault_effects(
    rows: &mut Rows,
    name: &str,
    b: &SimulationBaseline,
    s: &SimulationReport,
) {
    let total: u64 = s.fault_effects.values().sum();
    rows.push(
        format!("{name}: fault coverage (all effects)"),
        "> 0",
        total.to_string(),
        pass_if(total > 0),
    );
    for effect in &b.fault_effects {
        let check = format!("{name}: fault effect {effect}");
        match s.fault_effects.get(effect) {
            Some(&n) => rows.push(check, "> 0", n.to_string(), pass_if(n > 0)),
            None => rows.push(check, "> 0", "absent", GateStatus::Missing),
        }
    }
    for (effect, n) in s
        .fault_effects
        .iter()
        .filter(|(k, n)| **n > 0 && !b.fault_effects.contains(k))
    {
        rows.push(
            format!("{name}: fault effect {effect}"),
            "not in baseline",
            n.to_string(),
            GateStatus::New,
        );
    }
}

fn compare_model(rows: &mut Rows, b: &ModelBaseline, m: &ModelReport) {
    let name = format!("model {}", m.model);
    rows.push(
        format!("{name}: unique states"),
        b.unique_states.to_string(),
        m.unique_states.to_string(),
        pass_if(b.unique_states == m.unique_states),
    );
    for (prop, expected) in &b.properties {
        let check = format!("{name}: property {prop}");
        match m.properties.iter().find(|p| &p.name == prop) {
            Some(p) => rows.push(
                check,
                expected.label(),
                p.verdict.label(),
                pass_if(p.verdict == *expected),
            ),
            None => rows.push(check, expected.label(), "absent", GateStatus::Missing),
        }
    }
    for p in m
        .properties
        .iter()
        .filter(|p| !b.properties.contains_key(&p.name))
    {
        rows.push(
            format!("{name}: property {}", p.name),
            "not in baseline",
            p.verdict.label(),
            new_if(p.verdict.passed()),
        );
    }
}

fn compare_flaws(rows: &mut Rows, b: &FlawsBaseline, f: &FlawCatalogReport) {
    let name = format!("flaws {}", f.catalog);
    let caught_label = |c: &Option<String>| {
        c.as_ref()
            .map_or_else(|| "not caught".to_owned(), |by| format!("caught by {by}"))
    };
    for flaw in &b.caught {
        let check = format!("{name}: {flaw}");
        match f.flaws.iter().find(|x| &x.flaw == flaw) {
            Some(x) => rows.push(
                check,
                "caught",
                caught_label(&x.caught_by),
                pass_if(x.caught_by.is_some()),
            ),
            None => rows.push(check, "caught", "absent", GateStatus::Missing),
        }
    }
    for x in f.flaws.iter().filter(|x| !b.caught.contains(&x.flaw)) {
        rows.push(
            format!("{name}: {}", x.flaw),
            "not in baseline",
            caught_label(&x.caught_by),
            new_if(x.caught_by.is_some()),
        );
    }
}

fn fmt_ratio(v: f64) -> String {
    format!("{v:.3}")
}

fn compare_load(rows: &mut Rows, b: &LoadBaseline, l: &LoadReport) {
    let name = format!("load {}", l.scenario);
    compare_verification(rows, &name, b, l);
    let reference = l.endpoint(&b.reference_endpoint);
    if reference.is_none() {
        rows.push(
            format!("{name}: reference endpoint {}", b.reference_endpoint),
            "present",
            "absent",
            GateStatus::Missing,
        );
    }
    for (ep, eb) in &b.endpoints {
        let prefix = format!("{name}: {ep}");
        let Some(e) = l.endpoint(ep) else {
            rows.push(
                format!("{prefix}: endpoint"),
                "present",
                "absent",
                GateStatus::Missing,
            );
            continue;
        };
        let rate = error_rate(e.error_count(), e.requests);
        rows.push(
            format!("{prefix}: error rate"),
            format!("≤ {}", eb.error_rate_max),
            format!("{rate:.5}"),
            pass_if(rate <= eb.error_rate_max),
        );
        let Some(reference) = reference else { continue };
        let ratios = LoadRatios::of(e, reference);
        let check = LoadCheck {
            prefix: &prefix,
            reference: &b.reference_endpoint,
            tolerance: b.tolerance,
        };
        if let Some(expected) = eb.throughput_ratio {
            check.throughput(rows, expected, ratios.throughput);
        }
        if let Some(expected) = eb.p99_ratio {
            check.p99(rows, expected, ratios.p99);
        }
    }
    for e in l
        .endpoints
        .iter()
        .filter(|e| !b.endpoints.contains_key(&e.name))
    {
        rows.push(
            format!("{name}: {}: endpoint", e.name),
            "not in baseline",
            format!("{:.1} req/s", e.throughput_rps),
            GateStatus::New,
        );
    }
}

/// The load run's verification checks: each expected one held, and the new ones.
fn compare_verification(rows: &mut Rows, name: &str, b: &LoadBaseline, l: &LoadReport) {
    for v in &b.verification {
        let check = format!("{name}: verification {v}");
        match l.verification.iter().find(|x| &x.name == v) {
            Some(x) => rows.push(
                check,
                "held",
                x.verdict.label(),
                pass_if(x.verdict == Judgement::Held),
            ),
            None => rows.push(check, "held", "absent", GateStatus::Missing),
        }
    }
    for x in l
        .verification
        .iter()
        .filter(|x| !b.verification.contains(&x.name) && x.verdict != Judgement::NotChecked)
    {
        rows.push(
            format!("{name}: verification {}", x.name),
            "not in baseline",
            x.verdict.label(),
            new_if(x.verdict == Judgement::Held),
        );
    }
}

/// The ratio checks of one endpoint against the reference endpoint.
struct LoadCheck<'a> {
    /// `load SCENARIO: ENDPOINT`.
    prefix: &'a str,
    reference: &'a str,
    tolerance: f64,
}

impl LoadCheck<'_> {
    /// Throughput ratio: at least `expected` less the tolerance.
    fn throughput(&self, rows: &mut Rows, expected: f64, actual: Option<f64>) {
        let tol = self.tolerance;
        let floor = expected * (1.0 - tol);
        let check = format!("{}: throughput / {}", self.prefix, self.reference);
        match actual {
            Some(a) => rows.push(
                check,
                format!(
                    "≥ {} ({} − {:.0}%)",
                    fmt_ratio(floor),
                    fmt_ratio(expected),
                    tol * 100.0
                ),
                fmt_ratio(a),
                pass_if(a >= floor),
            ),
            None => rows.push(
                check,
                format!("≥ {}", fmt_ratio(floor)),
                "undefined (reference rps is 0)",
                GateStatus::Regressed,
            ),
        }
    }

    /// P99 ratio: at most `expected` plus the tolerance.
    fn p99(&self, rows: &mut Rows, expected: f64, actual: Option<f64>) {
        let tol = self.tolerance;
        let ceiling = expected * (1.0 + tol);
        let check = format!("{}: P99 / {} P99", self.prefix, self.reference);
        match actual {
            Some(a) => rows.push(
                check,
                format!(
                    "≤ {} ({} + {:.0}%)",
                    fmt_ratio(ceiling),
                    fmt_ratio(expected),
                    tol * 100.0
                ),
                fmt_ratio(a),
                pass_if(a <= ceiling),
            ),
            None => rows.push(
                check,
                format!("≤ {}", fmt_ratio(ceiling)),
                "undefined (reference P99 is 0)",
                GateStatus::Regressed,
            ),
        }
    }
}
