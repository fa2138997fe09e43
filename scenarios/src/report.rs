//! Turns simulation sweeps into the `reports` data model (HTML, JSON, JUnit).

use std::collections::BTreeMap;

use reports::model::{
    ClockSeries, CrashPointRow, CrashPointsReport, EdgeRow, FaultSpan, InvariantResult, Judgement,
    OpsBucket, Phase, Seeds, SimulationReport, Violation,
};
use sim::run::{SeedOutcome, Sweep};
use sim::scenario::Scenario;

/// The command that replays `seed` of `scenario` exactly.
#[must_use]
pub fn replay_command(scenario: &Scenario, seed: u64, duration: Option<f64>) -> String {
    let duration = duration
        .map(|d| format!(" --duration {d}"))
        .unwrap_or_default();
    let flaw = scenario
        .run
        .flaw
        .map(|f| format!(" --flaw {f}"))
        .unwrap_or_default();
    let buggify = if scenario.run.buggify {
        ""
    } else {
        " --no-buggify"
    };
    let crash_at = scenario
        .run
        .crash_at
        .as_ref()
        .map(|spec| format!(" --crash-at {spec}"))
        .unwrap_or_default();
    format!(
        "cargo run --release --bin scenario -- {} --seed {seed} --seeds 1{duration}{flaw}{buggify}{crash_at}",
        scenario.name
    )
}

/// The line that replays a crash point tried in a seed: the seed's replay line (`replay`) with
/// `--crash-at` naming the point.
#[must_use]
pub fn crash_replay(replay: &str, plan: &sim::crashpoints::CrashPlan) -> String {
    format!("{replay} --crash-at {}", plan.spec())
}

/// The seed whose timeline the report shows: the first failing seed, re-run with its history
/// kept (so the first offending event can be printed), else the first seed.
#[must_use]
pub fn shown_seed(scenario: &Scenario, sweep: &Sweep) -> Option<SeedOutcome> {
    let failing = sweep.seeds.iter().find(|s| s.violations().next().is_some());
    match failing.or(sweep.seeds.first()) {
        Some(seed) if failing.is_some() => Some(sim::run::run_seed(scenario, seed.seed, true)),
        Some(seed) => Some(seed.clone()),
        None => None,
    }
}

/// Each invariant: held, or violated with its first failing seed (and, when that is the shown
/// seed, its first offending event); then whether every fault took effect.
fn invariant_results(sweep: &Sweep, shown: Option<&SeedOutcome>) -> Vec<InvariantResult> {
    let event_text = |seq: Option<u64>| -> Option<String> {
        let history = shown?.history.as_ref()?;
        history
            .get(usize::try_from(seq?).ok()?)
            .map(ToString::to_string)
    };
    sim::checkers::INVARIANTS
        .iter()
        .map(|name| {
            let first = sweep
                .seeds
                .iter()
                .find_map(|s| {
                    s.results
                        .iter()
                        .find(|(n, v)| n == name && v.is_some())
                        .map(|(_, v)| (s.seed, v.clone()))
                })
                .or_else(|| {
                    // A crash point's run (whose history is not the one shown).
                    sweep
                        .crash_violations()
                        .find(|(_, _, v)| v.invariant == *name)
                        .map(|(seed, tried, v)| {
                            let mut v = v.clone();
                            v.detail =
                                format!("at crash point {}: {}", tried.plan.spec(), v.detail);
                            v.event = None;
                            (seed, Some(v))
                        })
                });
            match first {
                None => InvariantResult::held(*name),
                Some((seed, violation)) => {
                    let violation = violation.expect("filtered on Some");
                    let same_seed = shown.is_some_and(|s| s.seed == seed);
                    InvariantResult {
                        name: (*name).to_owned(),
                        verdict: Judgement::Violated,
                        seed: Some(seed),
                        first_offending_event: if same_seed {
                            event_text(violation.event)
                        } else {
                            None
                        },
                        detail: Some(violation.detail),
                    }
                }
            }
        })
        .chain(std::iter::once(faults_took_effect(sweep)))
        .chain(std::iter::once(edges_reached(sweep)))
        .collect()
}

/// The check that every fault kind of the scenario took effect in the sweep.
pub const FAULTS_TOOK_EFFECT: &str = "faults.took_effect";

/// The check that every edge state the scenario owns was reached in the sweep.
pub const EDGES_REACHED: &str = "edges.reached";

/// Marks the sweep's coverage checks ([`FAULTS_TOOK_EFFECT`], [`EDGES_REACHED`]) as not checked
/// in `report`: a shard run with `--coverage union` records its coverage and leaves the
/// judgement to `scenario merge`, which makes it on the union of the shards.
pub fn defer_coverage(report: &mut SimulationReport) {
    for check in &mut report.invariants {
        if check.name == FAULTS_TOOK_EFFECT || check.name == EDGES_REACHED {
            check.verdict = Judgement::NotChecked;
            check.seed = None;
            check.detail = Some(
                "judged by `scenario merge` on the union of the shards (this shard ran with \
                 --coverage union)"
                    .to_owned(),
            );
        }
    }
}

/// `edges.reached`: violated when an edge state the scenario owns was never reached in a sweep
/// large enough to judge it; not checked when the sweep is too small to judge any.
fn edges_reached(sweep: &Sweep) -> InvariantResult {
    coverage_result(
        EDGES_REACHED,
        sweep,
        format!(" (rare edge states: {})", sim::run::RARE_EDGE_SEEDS_MIN),
        (!sweep.unreached_edges.is_empty()).then(|| {
            format!(
                "owned but never reached in the sweep: {}",
                sweep.unreached_edges.join(", ")
            )
        }),
    )
}

/// A coverage check's result: not checked in a sweep too small to judge it (a replay), else
/// held, or violated with `failure`.
fn coverage_result(
    name: &str,
    sweep: &Sweep,
    also_judged: String,
    failure: Option<String>,
) -> InvariantResult {
    let result = |verdict, detail| InvariantResult {
        name: name.into(),
        verdict,
        seed: None,
        first_offending_event: None,
        detail: Some(detail),
    };
    if !sweep.coverage_judged() {
        result(
            Judgement::NotChecked,
            format!(
                "judged over sweeps of {} seeds or more{also_judged}; this run had {}",
                sim::run::COVERAGE_SEEDS_MIN,
                sweep.seeds.len()
            ),
        )
    } else if let Some(failure) = failure {
        result(Judgement::Violated, failure)
    } else {
        InvariantResult::held(name)
    }
}

/// Every declared edge state with how often (and in how many seeds) the sweep reached it, and
/// from which sweep size the scenario's ownership judges it.
#[must_use]
pub fn edge_rows(scenario: &Scenario, sweep: &Sweep) -> Vec<EdgeRow> {
    const PARSED: &str = "`[edges]` is checked when the scenario is parsed";
    let owned = scenario.edges.owned().expect(PARSED);
    let rare = scenario.edges.owned_rare().expect(PARSED);
    sut::edge_registry::all()
        .map(|e| EdgeRow {
            name: e.name.to_owned(),
            about: e.about.to_owned(),
            reached: sweep.edges.get(e.name).copied().unwrap_or(0),
            seeds_reached: sweep.edge_seeds.get(e.name).copied().unwrap_or(0),
            owned_from_seeds: if owned.contains(&e) {
                Some(sim::run::COVERAGE_SEEDS_MIN as u64)
            } else if rare.contains(&e) {
                Some(sim::run::RARE_EDGE_SEEDS_MIN as u64)
            } else {
                None
            },
        })
        .collect()
}

/// `faults.took_effect`: violated when a fault kind never took effect in the sweep; not checked
/// in a run too small to judge it (a replay).
fn faults_took_effect(sweep: &Sweep) -> InvariantResult {
    coverage_result(
        FAULTS_TOOK_EFFECT,
        sweep,
        String::new(),
        (!sweep.vacuous_faults.is_empty()).then(|| {
            format!(
                "never took effect in the sweep: {}",
                sweep
                    .vacuous_faults
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }),
    )
}

/// The shown seed's timeline: its faults, clock offsets (of the nodes whose clock moved), and
/// operations over time.
fn timeline(s: &SeedOutcome) -> (Vec<FaultSpan>, Vec<ClockSeries>, Vec<OpsBucket>) {
    let mut series: BTreeMap<String, Vec<(u64, i64)>> = s
        .nodes
        .iter()
        .filter(|n| !n.starts_with("client"))
        .map(|n| (n.clone(), vec![(0, 0)]))
        .collect();
    for (node, t, skew) in &s.clock_samples {
        series.entry(node.clone()).or_default().push((*t, *skew));
    }
    let end_ms = s.sim_ms;
    let clock_offsets = series
        .into_iter()
        .filter(|(_, points)| points.len() > 1)
        .map(|(node, mut points)| {
            let last = points.last().map_or(0, |p| p.1);
            points.push((end_ms, last));
            ClockSeries { node, points }
        })
        .collect();
    let faults = s
        .faults
        .iter()
        .map(|f| FaultSpan {
            node: f.node.clone(),
            kind: f.kind.clone(),
            start_ms: f.start_ms,
            end_ms: f.end_ms.filter(|end| *end > f.start_ms),
            detail: f.detail.clone(),
        })
        .collect();
    let ops = s
        .ops
        .iter()
        .map(|b| OpsBucket {
            t_ms: b.t_ms,
            ok: b.ok,
            failed: b.failed,
            indeterminate: b.indeterminate,
        })
        .collect();
    (faults, clock_offsets, ops)
}

/// Builds the report of a sweep. The timeline shows the first failing seed (re-run with its
/// history kept, so the first offending event can be printed), else the first seed.
#[must_use]
pub fn simulation(scenario: &Scenario, sweep: &Sweep, duration: Option<f64>) -> SimulationReport {
    simulation_showing(scenario, sweep, shown_seed(scenario, sweep), &|seed| {
        replay_command(scenario, seed, duration)
    })
}

/// Builds the report of a sweep whose timeline shows `shown` ([`shown_seed`], or a seed's
/// outcome as a shard recorded it); `replay` gives the command that replays a seed.
#[must_use]
pub fn simulation_showing(
    scenario: &Scenario,
    sweep: &Sweep,
    shown: Option<SeedOutcome>,
    replay: &dyn Fn(u64) -> String,
) -> SimulationReport {
    let invariants = invariant_results(sweep, shown.as_ref());
    let violations = sweep
        .violations()
        .map(|(seed, v)| Violation {
            seed,
            invariant: v.invariant.clone(),
            detail: v.detail.clone(),
            replay: Some(replay(seed)),
            crash_point: None,
        })
        .chain(sweep.crash_violations().map(|(seed, tried, v)| Violation {
            seed,
            invariant: v.invariant.clone(),
            detail: v.detail.clone(),
            replay: Some(crash_replay(&replay(seed), &tried.plan)),
            crash_point: Some(tried.key.to_string()),
        }))
        .collect();
    let (faults, clock_offsets, ops_over_time, nodes, timeline_seed) = match &shown {
        None => (Vec::new(), Vec::new(), Vec::new(), Vec::new(), None),
        Some(s) => {
            let (faults, clock_offsets, ops) = timeline(s);
            (faults, clock_offsets, ops, s.nodes.clone(), Some(s.seed))
        }
    };
    let safety = scenario.run.safety_ms;
    SimulationReport {
        scenario: scenario.name.clone(),
        seeds: Seeds::List(sweep.seeds.iter().map(|s| s.seed).collect()),
        seeds_run: sweep.seeds.len() as u64,
        timeline_seed,
        replay_command: timeline_seed.map(replay),
        sim_seconds: sweep.seeds.iter().map(|s| s.sim_ms as f64 / 1_000.0).sum(),
        wall_seconds: sweep.wall_seconds,
        events: sweep.seeds.iter().map(|s| s.events).sum(),
        nodes,
        phases: vec![
            Phase {
                name: "safety".into(),
                start_ms: 0,
                end_ms: safety,
            },
            Phase {
                name: "liveness".into(),
                start_ms: safety,
                end_ms: safety + scenario.run.liveness_ms,
            },
        ],
        faults,
        clock_offsets,
        ops_over_time,
        invariants,
        violations,
        fault_effects: sweep.coverage.clone(),
        counter_groups: sweep
            .coverage
            .keys()
            .map(|k| (k.clone(), counter_group(k).to_owned()))
            .collect(),
        operations: operations(sweep),
        edges: edge_rows(scenario, sweep),
        crash_points: crash_points(scenario, sweep),
    }
}

/// Crash points over the sweep, per distinct point: the seeds that found it, the runs that
/// crashed there, and how many of them broke an invariant.
fn crash_points(scenario: &Scenario, sweep: &Sweep) -> Option<Box<CrashPointsReport>> {
    let summary = sweep.crash_points()?;
    let mut rows: BTreeMap<&sim::crashpoints::PointKey, CrashPointRow> = BTreeMap::new();
    for points in sweep.seeds.iter().filter_map(|s| s.crash_points.as_ref()) {
        for found in &points.found {
            rows.entry(&found.key).or_default().found_in_seeds += 1;
        }
        for tried in &points.tried {
            let row = rows.entry(&tried.key).or_default();
            row.tried += 1;
            row.failed += u64::from(!tried.violations.is_empty());
        }
    }
    Some(Box::new(CrashPointsReport {
        budget: scenario.run.crash_points,
        seeds: summary.seeds,
        runs: summary.runs,
        found: summary.found.len() as u64,
        tried: summary.tried.len() as u64,
        failed: summary.failed.len() as u64,
        unreached: summary.unreached.len() as u64,
        points: rows
            .into_iter()
            .map(|(key, row)| CrashPointRow {
                point: key.to_string(),
                ..row
            })
            .collect(),
    }))
}

/// Per kind of client operation, over every seed of the sweep: ok, refused with the reasons
/// (most frequent first), no answer.
#[must_use]
pub fn operations(sweep: &Sweep) -> Vec<reports::model::OperationRow> {
    let mut rows: BTreeMap<&str, ([u64; 3], BTreeMap<&str, u64>)> = BTreeMap::new();
    for seed in &sweep.seeds {
        for (kind, counts) in &seed.op_outcomes {
            let (slot, _) = rows.entry(kind.as_str()).or_default();
            for (total, n) in slot.iter_mut().zip(counts) {
                *total += n;
            }
        }
        for (kind, by_reason) in &seed.op_failures {
            let (_, reasons) = rows.entry(kind.as_str()).or_default();
            for (reason, n) in by_reason {
                *reasons.entry(reason.as_str()).or_default() += n;
            }
        }
    }
    rows.into_iter()
        .map(|(kind, ([ok, failed, no_answer], reasons))| {
            let mut reasons: Vec<(String, u64)> = reasons
                .into_iter()
                .map(|(r, n)| (r.to_owned(), n))
                .collect();
            reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            reports::model::OperationRow {
                kind: kind.to_owned(),
                ok,
                failed,
                no_answer,
                reasons,
            }
        })
        .collect()
}

/// What a coverage counter is: `injected` (the nemesis's faults), `effect` (what a fault did,
/// the counters of [`sim::scenario::FaultKind::effect_counters`]) or `response` (how the system
/// responded, and its traffic).
#[must_use]
pub fn counter_group(key: &str) -> &'static str {
    if key.starts_with("fault.") || key.starts_with("buggify.") || key == "crash.kills" {
        "injected"
    } else if sim::scenario::FaultKind::ALL
        .iter()
        .any(|kind| kind.effect_counters().contains(&key))
    {
        "effect"
    } else {
        "response"
    }
}

/// A model check as a summary shows it ([`reports::model::ModelReport::for_summary`]).
#[must_use]
pub fn model(report: &models::ModelReport) -> reports::model::ModelReport {
    report.for_summary()
}
