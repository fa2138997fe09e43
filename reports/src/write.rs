//! Writing reports to disk: `index.html` + `summary.json` for a [`Summary`], and JUnit XML for CI.
//!
//! Every file is written atomically: the content is fully rendered in memory first (so a
//! validation or serialization error touches nothing), then written to a temporary file in the
//! same directory, fsynced, renamed over the target, and the directory fsynced. A reader sees
//! the old report or the new one, never a truncated one; no temporary file is left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::atomic::AtomicWriteError;
use crate::model::{
    Judgement, PropertyReport, RunResult, SimulationReport, Summary, ValidationError,
};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("invalid summary: {0}")]
    Invalid(#[from] ValidationError),
    #[error("could not serialize the summary to JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("could not serialize JUnit XML: {0}")]
    Junit(#[from] quick_junit::SerializeError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<AtomicWriteError> for WriteError {
    fn from(e: AtomicWriteError) -> Self {
        Self::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    move |source| WriteError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Name of the HTML file inside the report directory.
pub const INDEX_HTML: &str = "index.html";
/// Name of the JSON file inside the report directory.
pub const SUMMARY_JSON: &str = "summary.json";

/// Writes `dir/index.html` and `dir/summary.json` atomically (creating `dir` if needed).
/// Both are rendered before either is written.
pub fn write_report(dir: &Path, summary: &Summary) -> Result<(), WriteError> {
    summary.validate()?;
    let json = serde_json::to_string_pretty(summary)?;
    let html = crate::html::render(summary);
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    write_atomic(&dir.join(SUMMARY_JSON), json.as_bytes())?;
    write_atomic(&dir.join(INDEX_HTML), html.as_bytes())?;
    Ok(())
}

/// Reads a `summary.json`, checking its schema version and floats.
pub fn read_summary(path: &Path) -> Result<Summary, WriteError> {
    let text = fs::read_to_string(path).map_err(io_err("read", path))?;
    let summary: Summary = serde_json::from_str(&text)?;
    summary.validate()?;
    Ok(summary)
}

/// Writes `bytes` to `path` atomically ([`crate::atomic::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    Ok(crate::atomic::write_atomic(path, bytes)?)
}

fn invariant_case(
    classname: &str,
    name: &str,
    verdict: Judgement,
    message: Option<String>,
    description: Option<String>,
) -> TestCase {
    let status = match verdict {
        Judgement::Held => TestCaseStatus::success(),
        Judgement::NotChecked => {
            let mut s = TestCaseStatus::skipped();
            s.set_message("not checked in this run");
            s
        }
        Judgement::Violated => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_type("violated");
            s.set_message(message.unwrap_or_else(|| "violated".to_owned()));
            if let Some(d) = description {
                s.set_description(d);
            }
            s
        }
    };
    let mut case = TestCase::new(name, status);
    case.set_classname(classname);
    case
}

/// Builds the JUnit report: one testsuite per result, one testcase per invariant, property,
/// verification check or flaw; failures carry the detail.
pub fn junit_report(summary: &Summary) -> Report {
    let mut report = Report::new(summary.title.as_str());
    for result in &summary.results {
        let classname = format!("{}.{}", result.kind(), result.name());
        let mut suite = TestSuite::new(classname.as_str());
        match result {
            RunResult::Simulation(r) => simulation_cases(&mut suite, &classname, r),
            RunResult::Model(r) => {
                suite.set_time(Duration::from_secs_f64(r.wall_seconds.max(0.0)));
                for p in &r.properties {
                    suite.add_test_case(property_case(&classname, p));
                }
            }
            RunResult::Load(r) => {
                suite.set_time(Duration::from_secs_f64(
                    (r.duration_s + r.warmup_s).max(0.0),
                ));
                for v in &r.verification {
                    suite.add_test_case(invariant_case(
                        &classname,
                        &v.name,
                        v.verdict,
                        v.detail.clone(),
                        v.first_offending_event.clone(),
                    ));
                }
            }
            RunResult::Flaws(r) => {
                for f in &r.flaws {
                    let verdict = if f.caught_by.is_some() {
                        Judgement::Held
                    } else {
                        Judgement::Violated
                    };
                    suite.add_test_case(invariant_case(
                        &classname,
                        &f.flaw,
                        verdict,
                        Some(format!("flaw {} was not caught by any check", f.flaw)),
                        f.detail.clone(),
                    ));
                }
            }
        }
        report.add_test_suite(suite);
    }
    report
}

/// A simulation's cases: one per invariant (a violation's seeds and replay in its
/// description), then one per violated invariant the report does not list.
fn simulation_cases(suite: &mut TestSuite, classname: &str, r: &SimulationReport) {
    suite.set_time(Duration::from_secs_f64(r.wall_seconds.max(0.0)));
    for inv in &r.invariants {
        let mut msg = format!("{} violated", inv.name);
        if let Some(seed) = inv.seed {
            msg.push_str(&format!(" (seed {seed})"));
        }
        let mut desc = Vec::new();
        if let Some(e) = &inv.first_offending_event {
            desc.push(format!("first offending event: {e}"));
        }
        if let Some(d) = &inv.detail {
            desc.push(d.clone());
        }
        for v in r.violations.iter().filter(|v| v.invariant == inv.name) {
            match &v.crash_point {
                Some(point) => desc.push(format!(
                    "seed {}, crash point {point}: {}",
                    v.seed, v.detail
                )),
                None => desc.push(format!("seed {}: {}", v.seed, v.detail)),
            }
            if let Some(replay) = &v.replay {
                desc.push(format!("  replay: {replay}"));
            }
        }
        if let Some(c) = &r.replay_command {
            desc.push(format!("replay: {c}"));
        }
        suite.add_test_case(invariant_case(
            classname,
            &inv.name,
            inv.verdict,
            Some(msg),
            (!desc.is_empty()).then(|| desc.join("\n")),
        ));
    }
    // Violations of invariants not listed in `invariants` must still fail the suite.
    for v in r
        .violations
        .iter()
        .filter(|v| !r.invariants.iter().any(|i| i.name == v.invariant))
    {
        suite.add_test_case(invariant_case(
            classname,
            &v.invariant,
            Judgement::Violated,
            Some(format!("{} violated (seed {})", v.invariant, v.seed)),
            Some(match &v.replay {
                Some(replay) => format!("{}\n  replay: {replay}", v.detail),
                None => v.detail.clone(),
            }),
        ));
    }
}

/// A model property's case: a failure carries the counterexample.
fn property_case(classname: &str, p: &PropertyReport) -> TestCase {
    let status = if p.verdict.passed() {
        TestCaseStatus::success()
    } else {
        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
        s.set_type(p.verdict.label());
        s.set_message(
            format!("{:?} property {} {}", p.kind, p.name, p.verdict.label()).to_lowercase(),
        );
        if let Some(c) = &p.counterexample {
            s.set_description(c.join("\n"));
        }
        s
    };
    let mut case = TestCase::new(p.name.as_str(), status);
    case.set_classname(classname);
    case
}

/// Writes the JUnit XML for `summary` to `path`, atomically.
pub fn write_junit(path: &Path, summary: &Summary) -> Result<(), WriteError> {
    summary.validate()?;
    let xml = junit_report(summary).to_string()?;
    write_atomic(path, xml.as_bytes())
}
