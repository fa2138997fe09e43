//! JSON round trip, atomic report writes, JUnit XML.

mod common;

use std::fs;

use common::sample;
use quick_xml::Reader;
use quick_xml::events::Event;
use reports::model::*;
use reports::write::{WriteError, read_summary, write_atomic};

#[test]
fn summary_round_trips_through_json() {
    let summary = sample::sample_summary();
    let json = serde_json::to_string(&summary).unwrap();
    let back: Summary = serde_json::from_str(&json).unwrap();
    // Exact floats need serde_json's `float_roundtrip` feature.
    assert!(back == summary, "summary changed in the JSON round trip");
    // Self-describing: the kind tag and schema version are in the file.
    assert!(json.contains(r#""kind":"simulation""#) && json.contains(r#""kind":"load""#));
    assert!(json.contains(&format!(r#""schema_version":{SCHEMA_VERSION}"#)));
    // Seeds as a list also round-trip.
    let mut sim = sample::sample_simulation();
    sim.seeds = Seeds::List(vec![1, 2, u64::MAX]);
    let s = Summary::new("x").with(sim);
    assert_eq!(
        serde_json::from_str::<Summary>(&serde_json::to_string(&s).unwrap()).unwrap(),
        s
    );
}

#[test]
fn optional_fields_may_be_omitted_by_producers() {
    let json = r#"{"schema_version":1,"title":"t","results":[{"kind":"model","model":"m","states":10,"unique_states":5,
        "max_depth":3,"wall_seconds":0.1,"states_per_second":100.0,
        "properties":[{"name":"p","kind":"always","verdict":"holds"}]}]}"#;
    let s: Summary = serde_json::from_str(json).unwrap();
    assert!(s.passed());
    s.validate().unwrap();
}

#[test]
fn validate_rejects_non_finite_numbers_and_other_versions() {
    let mut s = sample::sample_summary();
    if let RunResult::Load(l) = &mut s.results[2] {
        l.endpoints[1].throughput_rps = f64::NAN;
    }
    let err = s.validate().unwrap_err();
    assert!(
        err.to_string()
            .contains("endpoints[allocate].throughput_rps"),
        "{err}"
    );
    let mut s = sample::sample_summary();
    s.schema_version = 99;
    assert!(matches!(
        s.validate(),
        Err(ValidationError::SchemaVersion { found: 99, .. })
    ));
}

fn dir_entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn write_report_writes_both_files_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let summary = sample::sample_summary();
    reports::write_report(&out, &summary).unwrap();
    assert_eq!(dir_entries(&out), vec!["index.html", "summary.json"]);
    assert_eq!(read_summary(&out.join("summary.json")).unwrap(), summary);
    assert!(
        fs::read_to_string(out.join("index.html"))
            .unwrap()
            .starts_with("<!DOCTYPE html>")
    );
    // Overwriting works and still leaves no temp file.
    reports::write_report(&out, &Summary::new("second")).unwrap();
    assert_eq!(dir_entries(&out), vec!["index.html", "summary.json"]);
    assert!(
        fs::read_to_string(out.join("index.html"))
            .unwrap()
            .contains("second")
    );
}

#[test]
fn a_serialization_error_never_touches_the_existing_report() {
    let dir = tempfile::tempdir().unwrap();
    let good = sample::sample_summary();
    reports::write_report(dir.path(), &good).unwrap();
    let html_before = fs::read(dir.path().join("index.html")).unwrap();
    let json_before = fs::read(dir.path().join("summary.json")).unwrap();
    let mut bad = good.clone();
    if let RunResult::Simulation(s) = &mut bad.results[0] {
        s.wall_seconds = f64::INFINITY;
    }
    let err = reports::write_report(dir.path(), &bad).unwrap_err();
    assert!(matches!(err, WriteError::Invalid(_)), "{err}");
    assert_eq!(
        fs::read(dir.path().join("index.html")).unwrap(),
        html_before
    );
    assert_eq!(
        fs::read(dir.path().join("summary.json")).unwrap(),
        json_before
    );
    assert_eq!(dir_entries(dir.path()), vec!["index.html", "summary.json"]);
    let junit = dir.path().join("junit.xml");
    assert!(reports::write_junit(&junit, &bad).is_err());
    assert!(!junit.exists());
}

#[test]
fn a_failed_rename_removes_the_temp_file_and_keeps_the_target() {
    let dir = tempfile::tempdir().unwrap();
    // The target is a non-empty directory: the rename fails after the temp file was written.
    let target = dir.path().join("index.html");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), b"x").unwrap();
    let err = write_atomic(&target, b"new").unwrap_err();
    assert!(err.to_string().contains("rename"), "{err}");
    assert_eq!(dir_entries(dir.path()), vec!["index.html"]);
    assert_eq!(fs::read(target.join("keep")).unwrap(), b"x");
}

/// (suite name, tests, failures, skipped).
type SuiteCounts = (String, usize, usize, usize);

/// Counts per suite, and every failure message.
fn junit_suites(xml: &str) -> (Vec<SuiteCounts>, Vec<String>) {
    let mut reader = Reader::from_str(xml);
    let mut suites = Vec::new();
    let mut messages = Vec::new();
    loop {
        match reader.read_event().unwrap() {
            Event::Start(e) | Event::Empty(e) => {
                let attr = |name: &str| {
                    e.attributes()
                        .map(|a| a.unwrap())
                        .find(|a| a.key.as_ref() == name.as_bytes())
                        .map(|a| {
                            a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                                .unwrap()
                                .into_owned()
                        })
                };
                match e.name().as_ref() {
                    b"testsuite" => suites.push((
                        attr("name").unwrap(),
                        attr("tests").unwrap().parse().unwrap(),
                        attr("failures").unwrap().parse().unwrap(),
                        attr("skipped").unwrap_or_default().parse().unwrap_or(0),
                    )),
                    b"failure" => messages.push(attr("message").unwrap_or_default()),
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    (suites, messages)
}

#[test]
fn junit_has_a_suite_per_result_and_a_case_per_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junit.xml");
    let summary = sample::sample_summary();
    reports::write_junit(&path, &summary).unwrap();
    let xml = fs::read_to_string(&path).unwrap();
    let (suites, messages) = junit_suites(&xml);
    assert_eq!(suites.len(), 4);
    let (sim, model, load, flaws) = (&suites[0], &suites[1], &suites[2], &suites[3]);
    assert_eq!(sim.0, "simulation.clock_skew");
    assert_eq!(
        (sim.1, sim.2, sim.3),
        (7, 1, 1),
        "7 invariants, 1 violated, 1 not checked"
    );
    assert_eq!((model.1, model.2), (4, 1));
    assert_eq!((load.1, load.2), (6, 0));
    assert_eq!((flaws.1, flaws.2), (6, 1));
    assert!(
        messages
            .iter()
            .any(|m| m.contains("ids.monotonic violated (seed 1042)")),
        "{messages:?}"
    );
    assert!(messages.iter().any(|m| m.contains("time_field_too_narrow")));
    // The failure carries the first offending event and the replay command.
    assert!(xml.contains("first offending event: #18231"));
    assert!(xml.contains("replay: cargo run --bin scenario clock_skew -- --seed 1042"));
    // Each violation is listed with the line that replays its own seed.
    assert!(
        xml.contains(
            "  replay: cargo run --release --bin scenario -- clock_skew --seed 1042 --seeds 1"
        ),
        "{xml}"
    );
    // The counterexample is in the model failure.
    assert!(xml.contains("alloc-2 -&gt; client-2: Id{1}"));
}
