//! The bench as the test of `sut`, for mutation testing (docs/mutation.md): a short sweep of
//! every named simulation scenario, a check of every model, and the hostile-peer suites (each
//! state machine of `sut` driven by an adversarial counterpart: docs/hostile.md). A mutant of
//! `sut` is killed when any invariant is violated, a fault kind never takes effect, a model
//! property fails or a hostile peer breaks a promise; the score then measures the bench, not
//! `sut`'s unit tests.
//!
//! The hostile-peer suites live beside `sut` (`sut/tests/*_hostile.rs`, where `cargo test -p sut`
//! runs them too) and are compiled in here as modules, so that one test target is the bench.
//! `cargo test … --test mutation_gate -- --skip _hostile::` leaves them out (the figure for the
//! scenarios and models alone).
//!
//! `MUTATION_GATE_SEEDS` sets the seeds per scenario (8 by default, the fewest the sweep judges
//! fault coverage on); `MUTATION_GATE_ONLY` (comma-separated) restricts the scenarios and models
//! to those named. Run alone it is also a quick check of the whole bench:
//! `cargo test --release -p scenarios --test mutation_gate`.

// Each suite includes the helpers in `sut/tests/support/` itself (it is also a test target of
// its own), so the gate holds one copy per suite.
#![allow(clippy::duplicate_mod)]

use std::time::Instant;

#[path = "../../sut/tests/allocator_hostile.rs"]
mod allocator_hostile;
#[path = "../../sut/tests/coordinator_hostile.rs"]
mod coordinator_hostile;
#[path = "../../sut/tests/log_hostile.rs"]
mod log_hostile;
#[path = "../../sut/tests/participant_hostile.rs"]
mod participant_hostile;
#[path = "../../sut/tests/snowflake_hostile.rs"]
mod snowflake_hostile;
#[path = "../../sut/tests/token_cache_hostile.rs"]
mod token_cache_hostile;
#[path = "../../sut/tests/token_hostile.rs"]
mod token_hostile;
#[path = "../../sut/tests/wheel_hostile.rs"]
mod wheel_hostile;

fn seeds() -> Vec<u64> {
    let n = std::env::var("MUTATION_GATE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8_u64);
    (0..n).collect()
}

fn selected(name: &str) -> bool {
    std::env::var("MUTATION_GATE_ONLY")
        .map(|only| only.split(',').any(|n| n.trim() == name))
        .unwrap_or(true)
}

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

// Without `--cfg madsim` (a `RUSTFLAGS` in the environment replaces `.cargo/config.toml`'s,
// and `cargo mutants --cap-lints` sets one) the simulator does not simulate, every run fails,
// and every mutant would look killed: refuse to build instead.
#[cfg(not(madsim))]
compile_error!(
    "built without --cfg madsim: unset RUSTFLAGS, do not pass --cap-lints to cargo mutants"
);

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "minutes in a debug build; CI runs it with `cargo test --release -p scenarios --test mutation_gate`"
)]
fn every_scenario_holds_on_a_short_sweep() {
    let seeds = seeds();
    let mut failures = Vec::new();
    for (name, _) in scenarios::NAMED {
        if !selected(name) {
            continue;
        }
        let started = Instant::now();
        let mut scenario = scenarios::load(name).expect("a named scenario loads");
        // The state machines' own invariants after every step, as a debug build runs them.
        scenario.run.self_checks = true;
        let sweep = sim::run::sweep(&scenario, &seeds, jobs(), &|_| {});
        for (seed, v) in sweep.violations() {
            failures.push(format!("{name} seed {seed}: {}: {}", v.invariant, v.detail));
        }
        for (seed, tried, v) in sweep.crash_violations() {
            failures.push(format!(
                "{name} seed {seed} at crash point {}: {}: {}",
                tried.plan.spec(),
                v.invariant,
                v.detail
            ));
        }
        if sweep.coverage_failed() {
            failures.push(format!(
                "{name}: faults never took effect: {:?}",
                sweep.vacuous_faults
            ));
        }
        if sweep.edges_failed() {
            failures.push(format!(
                "{name}: owned edge states never reached: {:?}",
                sweep.unreached_edges
            ));
        }
        eprintln!(
            "mutation gate: {name} {} seeds in {:.1} s",
            seeds.len(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "minutes in a debug build; CI runs it with `cargo test --release -p scenarios --test mutation_gate`"
)]
fn every_model_holds() {
    let mut failures = Vec::new();
    for info in models::catalog() {
        if !selected(info.name) {
            continue;
        }
        let started = Instant::now();
        let options = models::ModelOptions {
            threads: 1,
            ..models::ModelOptions::default()
        };
        match models::check(info.name, options) {
            Ok(report) => failures.extend(
                report
                    .failures()
                    .iter()
                    .map(|p| format!("model {}: {} {:?}", info.name, p.name, p.verdict)),
            ),
            Err(e) => failures.push(format!("model {}: {e}", info.name)),
        }
        eprintln!(
            "mutation gate: model {} in {:.1} s",
            info.name,
            started.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
