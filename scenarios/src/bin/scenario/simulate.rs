//! A simulated scenario's sweep: the run arguments applied, the seeds run with progress, the history and JSON written, the replay line.

use std::io::IsTerminal;
use std::process::ExitCode;

use sim::run::SeedOutcome;
use sim::run::Sweep;
use sim::scenario::Scenario;

use crate::output::{print_summary, run_metadata, write_reports};
use crate::{RunArgs, USAGE, jobs_or_cores};

pub(crate) fn run(mut scenario: Scenario, args: &RunArgs) -> ExitCode {
    if let Err(code) = apply_run_args(&mut scenario, args) {
        return code;
    }
    let count = args.seeds.unwrap_or(scenario.run.seeds);
    let first_seed = args.seed.or(scenario.run.seed).unwrap_or(0);
    let mut seeds: Vec<u64> = (first_seed..first_seed.saturating_add(count)).collect();
    if let Some((i, n)) = args.shard {
        seeds.retain(|s| s % n == i);
    }
    let jobs = jobs_or_cores(args.jobs);
    eprintln!(
        "scenario {}: {} seed(s) from {} on {jobs} thread(s), {} ms safety + {} ms liveness each",
        scenario.name,
        seeds.len(),
        first_seed,
        scenario.run.safety_ms,
        scenario.run.liveness_ms
    );
    let sweep = sweep_with_progress(&scenario, &seeds, jobs);
    let mut nondeterministic = Vec::new();
    if args.check_determinism {
        for outcome in &sweep.seeds {
            let again = sim::run::run_seed(&scenario, outcome.seed, false);
            if again.trace_hash != outcome.trace_hash {
                nondeterministic.push((outcome.seed, outcome.trace_hash, again.trace_hash));
            }
        }
    }
    print_summary(&scenario, &sweep, args, &nondeterministic);
    if let Some(dir) = &args.report {
        let report = scenarios::report::simulation(&scenario, &sweep, args.duration);
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
    if let Some(path) = &args.json
        && let Err(err) = write_json(path, &scenario, &sweep, &nondeterministic)
    {
        eprintln!("scenario: cannot write {}: {err}", path.display());
        return ExitCode::from(USAGE);
    }
    let failed = sweep.violations().next().is_some()
        || sweep.coverage_failed()
        || sweep.edges_failed()
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
    let outcome = sim::run::run_seed(scenario, seed, true);
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

pub(crate) fn replay_command(scenario: &Scenario, seed: u64, args: &RunArgs) -> String {
    match (&scenario.schedule, &args.name) {
        // A scripted scenario lives in its file: replay the file, not the named scenario.
        (Some(_), Some(path)) => format!(
            "cargo run --release --bin scenario -- {path} --seed {seed} --seeds 1{}",
            args.duration
                .map(|d| format!(" --duration {d}"))
                .unwrap_or_default()
        ),
        _ => scenarios::report::replay_command(scenario, seed, args.duration),
    }
}

pub(crate) fn write_json(
    path: &std::path::Path,
    scenario: &Scenario,
    sweep: &Sweep,
    nondeterministic: &[(u64, u64, u64)],
) -> std::io::Result<()> {
    let violations: Vec<JsonViolation<'_>> = sweep
        .violations()
        .map(|(seed, v)| JsonViolation {
            seed,
            invariant: &v.invariant,
            detail: &v.detail,
            event: v.event,
        })
        .collect();
    let doc = serde_json::json!({
        "scenario": scenario.name,
        "seeds_run": sweep.seeds.len(),
        "seeds": sweep.seeds.iter().map(|s| s.seed).collect::<Vec<_>>(),
        "violations": violations,
        "sim_seconds": sweep.seeds.iter().map(|s| s.sim_ms as f64 / 1_000.0).sum::<f64>(),
        "wall_seconds": sweep.wall_seconds,
        "events": sweep.seeds.iter().map(|s| s.events).sum::<u64>(),
        "fault_effects": sweep.coverage,
        "vacuous_faults": sweep.vacuous_faults.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "coverage_judged": sweep.coverage_judged(),
        "edges": sweep.edges,
        "edge_seeds": sweep.edge_seeds,
        "edges_owned_unreached": sweep.unreached_edges,
        "edges_never_reached": sut::edge_registry::all()
            .filter(|e| !sweep.edges.contains_key(e.name))
            .map(|e| e.name)
            .collect::<Vec<_>>(),
        "nondeterministic_seeds": nondeterministic.iter().map(|(s, _, _)| *s).collect::<Vec<_>>(),
        "ids_lost": sweep.seeds.iter().map(|s| s.ids_lost).sum::<u64>(),
        "meta": run_metadata(),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
    write_atomic(path, &text)
}

#[derive(serde::Serialize)]
pub(crate) struct JsonViolation<'a> {
    pub(crate) seed: u64,
    pub(crate) invariant: &'a str,
    pub(crate) detail: &'a str,
    pub(crate) event: Option<u64>,
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
