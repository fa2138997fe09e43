//! The regression gate: passes a matching run, flags each kind of regression, reads baselines
//! with precise errors.

mod common;

use std::path::Path;

use common::sample;
use reports::gate::{self, Baseline, BaselineError, GateOutcome, GateStatus};
use reports::model::*;

/// The sample gate run with its deliberate failures fixed. (The model is of a flawed variant:
/// its `ids.unique` is expected `violated`, and the baseline pins that.)
fn passing_summary() -> Summary {
    let mut s = sample::sample_summary();
    for r in &mut s.results {
        match r {
            RunResult::Simulation(sim) => {
                sim.violations.clear();
                for i in &mut sim.invariants {
                    if i.verdict == Judgement::Violated {
                        *i = InvariantResult::held(i.name.clone());
                    }
                }
            }
            RunResult::Flaws(f) => {
                for x in &mut f.flaws {
                    x.caught_by.get_or_insert_with(|| "sim:ids.unique".into());
                }
            }
            _ => {}
        }
    }
    assert!(
        s.results
            .iter()
            .filter(|r| r.kind() != "model")
            .all(RunResult::passed)
    );
    s
}

fn sim(s: &mut Summary) -> &mut SimulationReport {
    s.results
        .iter_mut()
        .find_map(|r| {
            if let RunResult::Simulation(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .unwrap()
}
fn model(s: &mut Summary) -> &mut ModelReport {
    s.results
        .iter_mut()
        .find_map(|r| {
            if let RunResult::Model(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .unwrap()
}
fn load(s: &mut Summary) -> &mut LoadReport {
    s.results
        .iter_mut()
        .find_map(|r| {
            if let RunResult::Load(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .unwrap()
}
fn flaws(s: &mut Summary) -> &mut FlawCatalogReport {
    s.results
        .iter_mut()
        .find_map(|r| {
            if let RunResult::Flaws(x) = r {
                Some(x)
            } else {
                None
            }
        })
        .unwrap()
}

/// Rows with `status` whose check contains `needle`.
fn rows_with<'a>(o: &'a GateOutcome, status: GateStatus, needle: &str) -> Vec<&'a str> {
    o.rows
        .iter()
        .filter(|r| r.status == status && r.check.contains(needle))
        .map(|r| r.check.as_str())
        .collect()
}

/// Asserts the gate fails and exactly the rows matching `needle` regressed.
fn assert_regressed(o: &GateOutcome, status: GateStatus, needle: &str) {
    assert!(!o.passed, "gate should fail on {needle}:\n{}", o.table());
    let hits = rows_with(o, status, needle);
    assert!(
        !hits.is_empty(),
        "no {status:?} row for {needle}:\n{}",
        o.table()
    );
    let others: Vec<_> = o
        .rows
        .iter()
        .filter(|r| !r.status.ok() && !r.check.contains(needle))
        .collect();
    assert!(others.is_empty(), "unexpected failing rows {others:#?}");
}

fn baseline() -> (Baseline, Summary) {
    let s = passing_summary();
    (Baseline::from_summary(&s, None), s)
}

#[test]
fn a_matching_run_passes_with_every_row_pass() {
    let (b, s) = baseline();
    let o = gate::compare(&b, &s);
    assert!(o.passed, "{}", o.table());
    assert!(
        o.rows.iter().all(|r| r.status == GateStatus::Pass),
        "{}",
        o.table()
    );
    // All four kinds of results are checked.
    for kind in ["simulation ", "model ", "flaws ", "load "] {
        assert!(o.rows.iter().any(|r| r.check.starts_with(kind)), "{kind}");
    }
    let table = o.table();
    assert!(table.starts_with("check"));
    assert!(
        table.trim_end().ends_with("0 regressed, 0 new, 0 missing"),
        "{table}"
    );
    assert!(table.contains("gate PASSED"));
}

#[test]
fn the_html_report_shows_the_comparison_with_what_did_not_pass_first() {
    let (b, mut s) = baseline();
    sim(&mut s).invariants[0].verdict = Judgement::Violated;
    let outcome = gate::compare(&b, &s);
    assert!(!outcome.passed);
    s.gate = Some(outcome);
    assert!(!s.passed(), "a failed comparison fails the summary");
    let html = reports::html::render(&s);
    let section = html
        .split("Gate: comparison with the baseline")
        .nth(1)
        .expect("the gate section");
    let first_row = section.split("<td>").nth(1).unwrap_or_default();
    assert!(
        first_row.starts_with("simulation clock_skew"),
        "the regression is listed before the passing checks: {first_row}"
    );
    assert!(section.contains("regressed"), "{section}");
    assert!(
        section.contains("<details>"),
        "every check, folded: {section}"
    );
    // The summary round-trips through JSON with its comparison.
    let json = serde_json::to_string(&s).expect("json");
    let back: Summary = serde_json::from_str(&json).expect("parse");
    assert_eq!(back.gate, s.gate);
}

#[test]
fn simulation_violation_regresses() {
    let (b, mut s) = baseline();
    let x = sim(&mut s);
    x.violations.push(Violation {
        seed: 7,
        invariant: "ids.unique".into(),
        detail: "id 5 twice".into(),
        replay: None,
        crash_point: None,
    });
    x.invariants[0].verdict = Judgement::Violated;
    let o = gate::compare(&b, &s);
    assert_regressed(&o, GateStatus::Regressed, "simulation clock_skew");
    assert_eq!(
        rows_with(&o, GateStatus::Regressed, "").len(),
        2,
        "{}",
        o.table()
    );
    assert!(o.rows.iter().any(|r| r.actual.contains("seeds 7")));
}

#[test]
fn an_invariant_that_stops_being_checked_regresses_and_a_vanished_one_is_missing() {
    let (b, mut s) = baseline();
    sim(&mut s).invariants[0].verdict = Judgement::NotChecked;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "invariant ids.unique",
    );
    let (b, mut s) = baseline();
    sim(&mut s).invariants.remove(0);
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Missing,
        "invariant ids.unique",
    );
}

#[test]
fn fault_coverage_dropping_to_zero_regresses() {
    let (b, mut s) = baseline();
    sim(&mut s)
        .fault_effects
        .insert("crash.lost_pending_writes".into(), 0);
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "fault effect crash.lost_pending_writes",
    );
    let (b, mut s) = baseline();
    for v in sim(&mut s).fault_effects.values_mut() {
        *v = 0;
    }
    let o = gate::compare(&b, &s);
    assert_regressed(&o, GateStatus::Regressed, "fault");
    assert!(!rows_with(&o, GateStatus::Regressed, "fault coverage (all effects)").is_empty());
}

#[test]
fn model_state_count_and_verdicts_are_pinned() {
    let (b, mut s) = baseline();
    model(&mut s).unique_states += 1;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "unique states",
    );
    let (b, mut s) = baseline();
    // The flawed model's checker no longer finds the duplicate: a regression of the bench.
    model(&mut s).properties[0].verdict = PropertyVerdict::Holds;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "property ids.unique",
    );
    let (b, mut s) = baseline();
    model(&mut s).properties.remove(2);
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Missing,
        "property segment reload happens",
    );
}

#[test]
fn an_uncaught_flaw_regresses() {
    let (b, mut s) = baseline();
    flaws(&mut s).flaws[1].caught_by = None;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "counter_not_persisted_before_use",
    );
}

#[test]
fn load_ratios_regress_beyond_tolerance_only() {
    // Throughput of allocate relative to health: baseline 4.0, tolerance 25% → floor 3.0.
    let (b, mut s) = baseline();
    load(&mut s).endpoints[1].throughput_rps *= 0.80;
    let o = gate::compare(&b, &s);
    assert!(o.passed, "within tolerance:\n{}", o.table());
    let (b, mut s) = baseline();
    load(&mut s).endpoints[1].throughput_rps *= 0.70;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "allocate: throughput / health",
    );

    let (b, mut s) = baseline();
    let e = &mut load(&mut s).endpoints[4];
    e.corrected.p99_us = e.corrected.p99_us * 13 / 10;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "lottery_draw: P99 / health P99",
    );

    let (b, mut s) = baseline();
    load(&mut s).endpoints[2]
        .errors
        .insert("http_500".into(), 500);
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "token_issue: error rate",
    );
}

#[test]
fn load_gate_ignores_absolute_speed() {
    // A machine twice as slow: every latency doubles and every throughput halves. Ratios
    // are unchanged, so the gate passes.
    let (b, mut s) = baseline();
    for e in &mut load(&mut s).endpoints {
        e.throughput_rps /= 2.0;
        e.corrected.p99_us *= 2;
    }
    let o = gate::compare(&b, &s);
    assert!(o.passed, "{}", o.table());
}

#[test]
fn load_verification_and_reference_endpoint() {
    let (b, mut s) = baseline();
    load(&mut s).verification[0].verdict = Judgement::Violated;
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Regressed,
        "verification ids.unique",
    );
    let (b, mut s) = baseline();
    load(&mut s).endpoints.retain(|e| e.name != "health");
    assert_regressed(&gate::compare(&b, &s), GateStatus::Missing, "health");
}

#[test]
fn new_checks_pass_when_they_pass_and_fail_when_they_fail() {
    let (b, mut s) = baseline();
    sim(&mut s)
        .invariants
        .push(InvariantResult::held("ids.brand_new"));
    sim(&mut s).fault_effects.insert("disk.torn_tail".into(), 4);
    let o = gate::compare(&b, &s);
    assert!(o.passed, "{}", o.table());
    assert_eq!(rows_with(&o, GateStatus::New, "").len(), 2);
    let mut failing = InvariantResult::held("ids.brand_new");
    failing.verdict = Judgement::Violated;
    let (b, mut s) = baseline();
    sim(&mut s).invariants.push(failing);
    assert!(!gate::compare(&b, &s).passed);
    // A whole result that is not in the baseline.
    let (b, s) = baseline();
    let mut extra = sample::sample_model();
    extra.model = "tokens".into();
    for p in &mut extra.properties {
        p.verdict = if p.kind == PropertyKind::Sometimes {
            PropertyVerdict::Found
        } else {
            PropertyVerdict::Holds
        };
    }
    let o = gate::compare(&b, &s.clone().with(extra.clone()));
    assert!(o.passed);
    assert_eq!(rows_with(&o, GateStatus::New, "model tokens").len(), 1);
    extra.properties[0].verdict = PropertyVerdict::Violated;
    assert!(!gate::compare(&b, &s.with(extra)).passed);
}

#[test]
fn a_result_missing_from_the_run_fails_the_gate() {
    let (b, mut s) = baseline();
    s.results.retain(|r| r.kind() != "model");
    assert_regressed(
        &gate::compare(&b, &s),
        GateStatus::Missing,
        "model segment_alloc",
    );
}

#[test]
fn baseline_round_trips_through_toml_and_json_and_update_keeps_tolerances() {
    let (b, s) = baseline();
    let toml = b.to_toml().unwrap();
    assert_eq!(
        Baseline::parse(Path::new("baseline.toml"), &toml).unwrap(),
        b
    );
    let json = serde_json::to_string(&b).unwrap();
    assert_eq!(
        Baseline::parse(Path::new("baseline.json"), &json).unwrap(),
        b
    );
    let mut edited = b.clone();
    edited.load[0].tolerance = 0.1;
    edited.load[0].reference_endpoint = "allocate".into();
    let updated = Baseline::from_summary(&s, Some(&edited));
    assert_eq!(updated.load[0].tolerance, 0.1);
    assert_eq!(updated.load[0].reference_endpoint, "allocate");
    assert!(
        updated.load[0].endpoints["allocate"]
            .throughput_ratio
            .is_none()
    );
    assert!(gate::compare(&updated, &s).passed);
    // Saving is atomic and readable again.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baseline.toml");
    updated.save(&path).unwrap();
    assert_eq!(Baseline::load(&path).unwrap(), updated);
}

#[test]
fn updating_never_blesses_a_violation() {
    let failing = sample::sample_summary();
    let b = Baseline::from_summary(&failing, None);
    let o = gate::compare(&b, &failing);
    assert!(!o.passed);
    assert!(!rows_with(&o, GateStatus::Regressed, "invariant ids.monotonic").is_empty());
    assert!(!rows_with(&o, GateStatus::Regressed, "time_field_too_narrow").is_empty());
}

fn parse_err(name: &str, text: &str) -> BaselineError {
    Baseline::parse(Path::new(name), text).unwrap_err()
}

#[test]
fn bad_baselines_name_file_line_and_field() {
    let text = "schema_version = 1\n\n[[model]]\nmodel = \"m\"\nunique_states = \"many\"\n";
    match parse_err("ci/baseline.toml", text) {
        BaselineError::Parse {
            path, line, field, ..
        } => {
            assert_eq!(path, Path::new("ci/baseline.toml"));
            assert_eq!(line, 5);
            assert_eq!(field, "model[0].unique_states");
        }
        other => panic!("{other}"),
    }
    let text = "schema_version = 1\n[[simulation]]\nscenario = \"s\"\ninvariant = [\"x\"]\n";
    let err = parse_err("b.toml", text);
    let msg = err.to_string();
    assert!(msg.starts_with("b.toml:4:"), "{msg}");
    assert!(msg.contains("invariant"), "{msg}");
    let err = parse_err("b.toml", "schema_version = 1\n[[load]\n");
    assert!(matches!(err, BaselineError::Parse { line: 2, .. }), "{err}");
    let text = "schema_version = 1\n[[model]]\nunique_states = 3\n";
    let msg = parse_err("b.toml", text).to_string();
    assert!(
        msg.contains("model") && msg.contains("missing field `model`"),
        "{msg}"
    );
    let text = "{\n  \"schema_version\": 1,\n  \"model\": [ { \"model\": \"m\", \"unique_states\": -1 } ]\n}";
    match parse_err("b.json", text) {
        BaselineError::Parse { line, field, .. } => {
            assert_eq!(line, 3);
            assert_eq!(field, "model[0].unique_states");
        }
        other => panic!("{other}"),
    }
    let text = "schema_version = 1\n[[load]]\nscenario = \"l\"\nreference_endpoint = \"h\"\ntolerance = -0.5\n";
    let msg = parse_err("b.toml", text).to_string();
    assert!(msg.contains("load[0].tolerance"), "{msg}");
    assert!(matches!(
        parse_err("b.toml", "schema_version = 2\n"),
        BaselineError::Version { found: 2, .. }
    ));
    assert!(matches!(
        Baseline::load(Path::new("/nonexistent/baseline.toml")),
        Err(BaselineError::Io { .. })
    ));
}
