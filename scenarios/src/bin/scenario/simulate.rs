//! A simulated scenario's sweep: the run arguments applied, the seeds run with progress, the history and JSON written, the replay line.

use std::io::IsTerminal;
use std::process::ExitCode;

use sim::run::SeedOutcome;
use sim::run::Sweep;
use sim::scenario::Scenario;

use crate::output::{print_summary, run_metadata, write_reports};
use crate::sweepfile::{CoverageMode, Nondeterministic, RunInfo, SeedRange, Shard, SweepFile};
use crate::{RunArgs, USAGE, jobs_or_cores};

pub(crate) fn run(mut scenario: Scenario, args: &RunArgs) -> ExitCode {
    if let Err(code) = apply_run_args(&mut scenario, args) {
        return code;
    }
    let coverage = args.coverage.unwrap_or_default();
    if coverage == CoverageMode::Union && args.json.is_none() {
        eprintln!(
            "scenario: --coverage union leaves the coverage judgement to `scenario merge`, which \
             reads each shard's JSON: give --json FILE"
        );
        return ExitCode::from(USAGE);
    }
    let range = SeedRange {
        first_seed: args.seed.or(scenario.run.seed).unwrap_or(0),
        count: args.seeds.unwrap_or(scenario.run.seeds),
    };
    let shard = args.shard.map(|(number, count)| Shard { number, count });
    let seeds = crate::sweepfile::shard_seeds(range, shard);
    let jobs = jobs_or_cores(args.jobs);
    eprintln!(
        "scenario {}: {} seed(s) from {} on {jobs} thread(s), {} ms safety + {} ms liveness each",
        scenario.name,
        seeds.len(),
        range.first_seed,
        scenario.run.safety_ms,
        scenario.run.liveness_ms
    );
    let sweep = sweep_with_progress(&scenario, &seeds, jobs);
    let mut nondeterministic = Vec::new();
    if args.check_determinism {
        for outcome in &sweep.seeds {
            let again = sim::run::run_seed_as_set(&scenario, outcome.seed, false);
            if again.trace_hash != outcome.trace_hash {
                nondeterministic.push(Nondeterministic {
                    seed: outcome.seed,
                    first_hash: outcome.trace_hash,
                    second_hash: again.trace_hash,
                });
            }
        }
    }
    let given = args.name.as_deref();
    let replay = |seed| replay_command(&scenario, seed, given, args.duration);
    print_summary(&scenario, &sweep, &replay, &nondeterministic, coverage);
    if let Some(dir) = &args.report {
        let mut report = scenarios::report::simulation_showing(
            &scenario,
            &sweep,
            scenarios::report::shown_seed(&scenario, &sweep),
            &replay,
        );
        if coverage == CoverageMode::Union {
            scenarios::report::defer_coverage(&mut report);
        }
        let summary =
            reports::model::Summary::new(format!("simulation: {}", scenario.name)).with(report);
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    if let (Some(path), Some(first)) = (&args.history, sweep.seeds.first())
        && let Err(code) = write_history(path, &scenario, first.seed)
    {
        return code;
    }
    if let Some(path) = &args.json {
        let run = RunInfo {
            given: args.name.clone(),
            duration_s: args.duration,
            range,
            shard,
            coverage,
            seeds_missing: Vec::new(),
            meta: run_metadata(),
        };
        let written = SweepFile::new(&scenario, &sweep, run, &nondeterministic, &replay)
            .and_then(|file| file.write(path).map_err(|e| e.to_string()));
        if let Err(err) = written {
            eprintln!("scenario: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    verdict(&sweep, &nondeterministic, coverage)
}

/// A sweep's exit code: 1 for a violation, a nondeterministic seed, or (unless coverage is left
/// to `scenario merge`) a fault kind that never took effect or an owned edge state never reached.
pub(crate) fn verdict(
    sweep: &Sweep,
    nondeterministic: &[Nondeterministic],
    coverage: CoverageMode,
) -> ExitCode {
    let coverage_failed =
        coverage == CoverageMode::Sweep && (sweep.coverage_failed() || sweep.edges_failed());
    let failed = sweep.violations().next().is_some()
        || sweep.crash_violations().next().is_some()
        || coverage_failed
        || !nondeterministic.is_empty();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Applies `--flaw` (and says a flaw is on) and `--duration` to the scenario.
pub(crate) fn apply_run_args(scenario: &mut Scenario, args: &RunArgs) -> Result<(), ExitCode> {
    if args.flaw.is_some() {
        scenario.run.flaw = args.flaw;
    }
    if args.no_buggify {
        scenario.run.buggify = false;
    }
    if let Some(n) = args.crash_points {
        scenario.run.crash_points = n;
    }
    if let Some(spec) = &args.crash_at {
        if args.crash_points.is_some_and(|n| n > 0) {
            eprintln!(
                "scenario: --crash-at replays one crash point; it does not go with --crash-points"
            );
            return Err(ExitCode::from(USAGE));
        }
        if let Err(err) = sim::crashpoints::CrashPlan::parse(spec, 1) {
            eprintln!("scenario: --crash-at {err}");
            return Err(ExitCode::from(USAGE));
        }
        scenario.run.crash_points = 0;
        scenario.run.crash_at = Some(spec.clone());
    }
    if let Some(flaw) = scenario.run.flaw {
        eprintln!(
            "scenario {}: FLAW `{flaw}` switched on ({}): violations are expected",
            scenario.name,
            flaw.description()
        );
    }
    if let Some(secs) = args.duration {
        if !(secs > 0.0 && secs <= 3_600.0) {
            eprintln!("scenario: --duration {secs} is not within (0, 3600] seconds");
            return Err(ExitCode::from(USAGE));
        }
        scenario.run.safety_ms = (secs * 1_000.0).round() as u64;
    }
    Ok(())
}

/// Sweeps the seeds, with a progress bar on a terminal.
pub(crate) fn sweep_with_progress(scenario: &Scenario, seeds: &[u64], jobs: usize) -> Sweep {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(seeds.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} seeds  {elapsed_precise}  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress = |outcome: &SeedOutcome| {
        if let Some(bar) = &bar {
            bar.inc(1);
            let bad = outcome.violations().count();
            if bad > 0 {
                bar.set_message(format!("seed {} violated {bad} invariant(s)", outcome.seed));
            }
        }
    };
    let sweep = sim::run::sweep(scenario, seeds, jobs, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    sweep
}

/// Runs `seed` again with its history kept and writes the history, one event per line.
pub(crate) fn write_history(
    path: &std::path::Path,
    scenario: &Scenario,
    seed: u64,
) -> Result<(), ExitCode> {
    let outcome = sim::run::run_seed_as_set(scenario, seed, true);
    let lines: Vec<String> = outcome
        .history
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect();
    if let Err(err) = write_atomic(path, &(lines.join("\n") + "\n")) {
        eprintln!("scenario: cannot write {}: {err}", path.display());
        return Err(ExitCode::from(USAGE));
    }
    eprintln!("history of seed {} written to {}", seed, path.display());
    Ok(())
}

/// The command that replays `seed` of `scenario`, given on the command line as `given` (a name
/// or a file) with `--duration duration`.
pub(crate) fn replay_command(
    scenario: &Scenario,
    seed: u64,
    given: Option<&str>,
    duration: Option<f64>,
) -> String {
    match (&scenario.schedule, given) {
        // A scripted scenario lives in its file: replay the file, not the named scenario.
        (Some(_), Some(path)) => format!(
            "cargo run --release --bin scenario -- {path} --seed {seed} --seeds 1{}",
            duration
                .map(|d| format!(" --duration {d}"))
                .unwrap_or_default()
        ),
        _ => scenarios::report::replay_command(scenario, seed, duration),
    }
}

/// Writes `text` to `path` whole or not at all ([`reports::atomic::write_atomic`]).
pub(crate) fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    reports::atomic::write_atomic(path, text.as_bytes()).map_err(std::io::Error::other)
}

/// `invariant: detail`, without repeating the invariant when the detail starts with it.
pub(crate) fn violation_text(invariant: &str, detail: &str) -> String {
    if detail.starts_with(invariant) {
        detail.to_owned()
    } else {
        format!("{invariant}: {detail}")
    }
}
