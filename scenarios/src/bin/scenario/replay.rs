//! `scenario replay FILE`: a scenario file run once, and whether it reproduces the violation it expects.

use std::process::ExitCode;

use sim::scenario::Scenario;

use crate::USAGE;
use crate::simulate::violation_text;

/// Set when a replay reproduced the violation its file expects: the verdict line says so
/// (exit code 1 still: a violation).
pub(crate) static REPRODUCED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

pub(crate) fn replay(file: &std::path::Path) -> ExitCode {
    let shown = file.display().to_string();
    let scenario = match std::fs::read_to_string(file) {
        Err(err) => {
            eprintln!("scenario replay: cannot read {shown}: {err}");
            return ExitCode::from(USAGE);
        }
        Ok(text) => match Scenario::parse(&shown, &text) {
            Ok(s) => s,
            Err(err) => {
                eprintln!("scenario replay: {err}");
                return ExitCode::from(USAGE);
            }
        },
    };
    let seed = scenario.run.seed.unwrap_or(0);
    println!("scenario        {} ({shown})", scenario.name);
    if let Some(flaw) = scenario.run.flaw {
        println!("flaw            {flaw}");
    }
    println!(
        "run             seed {seed}, {} operations/s",
        scenario.workload.rate_per_s
    );
    println!("timeline:");
    for line in scenarios::search::timeline(&scenario) {
        println!("  {line}");
    }
    let outcome = sim::run::run_seed_as_set(&scenario, seed, false);
    let violations: Vec<_> = outcome.violations().collect();
    for v in &violations {
        println!("VIOLATION {}", violation_text(&v.invariant, &v.detail));
    }
    if violations.is_empty() {
        println!("every invariant held");
    }
    if let Some(expected) = &scenario.run.expect {
        if violations.iter().any(|v| &v.invariant == expected) {
            println!("reproduced      {expected}");
            REPRODUCED.store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            println!("NOT REPRODUCED  {expected} (the file expects it)");
        }
    }
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
