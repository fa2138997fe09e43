//! `scenario search`: a minimal failing fault schedule, found and shrunk by proptest, written as a scenario file.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use sim::scenario::Scenario;

use crate::USAGE;
use crate::simulate::violation_text;

#[derive(Debug, clap::Args)]
pub(crate) struct SearchArgs {
    /// The scenario (default with --flaw: the scenario the flaw catalog uses for it).
    pub(crate) name: Option<String>,
    /// New cases (one simulated run each) before giving up.
    #[arg(long, default_value_t = 64)]
    pub(crate) cases: u32,
    /// Switch on a documented flaw of the reference implementation.
    #[arg(long)]
    pub(crate) flaw: Option<sut::flaw::Flaw>,
    /// Seed of the search (the same seed generates the same cases).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Write the shrunk scenario file here (default: a new file under `target/search/`; an
    /// existing file is never overwritten).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Also keep the finding as a regression file in `--regressions` (a new file there; an
    /// existing one is never overwritten), so that later searches replay it first.
    #[arg(long)]
    pub(crate) keep: bool,
    /// Most fault events in a generated schedule.
    #[arg(long, default_value_t = 10)]
    pub(crate) events_max: usize,
    /// Most shrink steps (one simulated run each).
    #[arg(long, default_value_t = 96)]
    pub(crate) shrink_max: u32,
    /// Regression files, replayed first (read; written only with `--keep`).
    #[arg(long, default_value = "scenarios/regressions")]
    pub(crate) regressions: PathBuf,
    /// Do not replay the regression files first (a failure found is still kept).
    #[arg(long)]
    pub(crate) fresh: bool,
    /// Look for a violation of this invariant only (default: whichever fails first).
    #[arg(long)]
    pub(crate) invariant: Option<String>,
    /// Safety-phase length in simulated seconds (overrides the scenario).
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Strike this crash point in every case (`NODE:SITE:LABEL#N`, as a failing crash point's
    /// replay line names it): the search shrinks the other faults around it, and the file it
    /// writes strikes it too (`[run] crash_at`).
    #[arg(long, value_name = "POINT")]
    pub(crate) crash_at: Option<String>,
}

pub(crate) fn search(args: &SearchArgs) -> ExitCode {
    use scenarios::search::SearchOutcome;
    if let Some(name) = args
        .invariant
        .as_deref()
        .filter(|i| !sim::checkers::INVARIANTS.contains(i))
    {
        eprintln!(
            "scenario search: no invariant is called `{name}` (they are: {})",
            sim::checkers::INVARIANTS.join(", ")
        );
        return ExitCode::from(USAGE);
    }
    let opts = scenarios::search::SearchOptions {
        cases: args.cases,
        seed: args.seed,
        events_max: args.events_max,
        shrink_iters_max: args.shrink_max,
        regressions: Some(args.regressions.clone()),
        fresh: args.fresh,
        invariant: args.invariant.clone(),
        ..scenarios::search::SearchOptions::default()
    };
    let mut scenario = match search_scenario(args.name.as_deref(), args.flaw, args.duration) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(spec) = &args.crash_at {
        if let Err(err) = sim::crashpoints::CrashPlan::parse(spec, 1) {
            eprintln!("scenario search: --crash-at {err}");
            return ExitCode::from(USAGE);
        }
        scenario.run.crash_at = Some(spec.clone());
    }
    eprintln!(
        "search {}{}: up to {} cases of up to {} fault events ({}), search seed {}",
        scenario.name,
        scenario
            .run
            .flaw
            .map(|f| format!(" with FLAW {f}"))
            .unwrap_or_default(),
        opts.cases,
        opts.events_max,
        scenario
            .faults
            .kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        opts.seed
    );
    let found = match search_with_progress(&scenario, &opts) {
        Err(err) => {
            eprintln!("scenario search: {err}");
            return ExitCode::from(USAGE);
        }
        Ok(SearchOutcome::Nothing {
            cases_run,
            wall_seconds,
        }) => {
            println!(
                "search {}: no violation in {cases_run} case(s) ({wall_seconds:.1} s)",
                scenario.name
            );
            return ExitCode::SUCCESS;
        }
        Ok(SearchOutcome::Found(found)) => found,
    };
    print_found(&scenario, &opts, &found);
    write_found(&scenario, &opts, &found, args)
}

/// The scenario to search: named, or the one the flaw catalog uses for `flaw`; with the flaw
/// switched on, the duration applied, and no schedule (a file that has one is searched over
/// its fault kinds).
pub(crate) fn search_scenario(
    name: Option<&str>,
    flaw: Option<sut::flaw::Flaw>,
    duration: Option<f64>,
) -> Result<Scenario, ExitCode> {
    let catalog = flaw.and_then(|f| {
        scenarios::flaws::CATALOG
            .iter()
            .find(|(c, _)| *c == f)
            .map(|(_, s)| *s)
    });
    let Some(name) = name.or(catalog) else {
        eprintln!("scenario search: name a scenario, or a flaw with --flaw");
        return Err(ExitCode::from(USAGE));
    };
    let mut scenario = match scenarios::load(name) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("scenario search: {err}");
            return Err(ExitCode::from(USAGE));
        }
    };
    if flaw.is_some() {
        scenario.run.flaw = flaw;
    }
    if let Some(secs) = duration {
        if !(secs > 0.0 && secs <= 3_600.0) {
            eprintln!("scenario search: --duration {secs} is not within (0, 3600] seconds");
            return Err(ExitCode::from(USAGE));
        }
        scenario.run.safety_ms = (secs * 1_000.0).round() as u64;
    }
    // A file that already has a schedule is searched over its scenario's fault kinds.
    scenario.schedule = None;
    // A case is one run of its seed: crash points tried in reruns would make each case many.
    scenario.run.crash_points = 0;
    Ok(scenario)
}

/// Runs the search with a progress bar (cases, then shrink steps) on a terminal, and a line
/// on stderr when the first failure is found otherwise.
pub(crate) fn search_with_progress(
    scenario: &Scenario,
    opts: &scenarios::search::SearchOptions,
) -> Result<scenarios::search::SearchOutcome, scenarios::search::SearchError> {
    use scenarios::search::Progress;
    let bar = indicatif::ProgressBar::new(u64::from(opts.cases));
    if std::io::stderr().is_terminal() {
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} {prefix}  {elapsed_precise}  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_prefix("cases");
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let progress = |p: &Progress| match p {
        Progress::Regression(path) => bar.set_message(format!("replaying {}", path.display())),
        Progress::Case { n, .. } => bar.set_position(u64::from(*n)),
        Progress::Failed { invariant, events } => {
            bar.set_prefix("shrink steps");
            bar.set_length(u64::from(
                opts.shrink_iters_max + scenarios::search::PRUNE_RUNS_MAX,
            ));
            bar.set_position(0);
            bar.set_message(format!("{invariant} violated with {events} event(s)"));
            if bar.is_hidden() {
                eprintln!("search: {invariant} violated with {events} fault event(s); shrinking");
            }
        }
        Progress::Shrink { step, events } => {
            bar.set_position(u64::from(*step));
            bar.set_message(format!("smallest failing schedule: {events} event(s)"));
        }
    };
    let outcome = scenarios::search::search(scenario, opts, &progress);
    bar.finish_and_clear();
    outcome
}

/// The finding on stdout: the violation, how it was found, the run and the timeline.
pub(crate) fn print_found(
    scenario: &Scenario,
    opts: &scenarios::search::SearchOptions,
    found: &scenarios::search::Found,
) {
    println!("scenario        {}", scenario.name);
    if let Some(flaw) = scenario.run.flaw {
        println!("flaw            {flaw}");
    }
    println!(
        "violated        {}",
        violation_text(&found.invariant, &found.detail)
    );
    match &found.from_regression {
        Some(path) => println!(
            "found by        replaying the regression file {} (use --fresh to search anew)",
            path.display()
        ),
        None => println!(
            "found by        case {} of {}; shrunk from {} to {} fault event(s) in {} step(s)",
            found.cases_run,
            opts.cases,
            found.events_before,
            found.events_after,
            found.shrink_steps
        ),
    }
    println!(
        "run             seed {}, {} operations/s, {} ms safety + {} ms liveness",
        found.scenario.run.seed.unwrap_or(0),
        found.scenario.workload.rate_per_s,
        found.scenario.run.safety_ms,
        found.scenario.run.liveness_ms
    );
    println!("wall            {:.1} s", found.wall_seconds);
    println!("timeline:");
    for line in scenarios::search::timeline(&found.scenario) {
        println!("  {line}");
    }
}

/// Writes a new finding as a scenario file that replays it: to `--out` or a new file under
/// `target/search/`, and with `--keep` as a new regression file (a finding replayed from a
/// regression file is not written again). Never overwrites a file. Exit code 1: a violation
/// was found.
pub(crate) fn write_found(
    scenario: &Scenario,
    opts: &scenarios::search::SearchOptions,
    found: &scenarios::search::Found,
    args: &SearchArgs,
) -> ExitCode {
    let command = format!(
        "scenario search {}{}{} --seed {} --cases {} --events-max {}",
        scenario.name,
        scenario
            .run
            .flaw
            .map(|f| format!(" --flaw {f}"))
            .unwrap_or_default(),
        opts.invariant
            .as_ref()
            .map(|i| format!(" --invariant {i}"))
            .unwrap_or_default(),
        opts.seed,
        opts.cases,
        opts.events_max
    );
    let text = match scenarios::search::replay_text(found, &command) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("scenario search: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let name =
        scenarios::search::regression_name(&scenario.name, scenario.run.flaw, &found.invariant);
    let mut targets = Vec::new();
    if found.from_regression.is_none() {
        targets.push(
            args.out
                .clone()
                .unwrap_or_else(|| PathBuf::from("target/search").join(&name)),
        );
        if args.keep {
            targets.push(args.regressions.join(&name));
        }
    }
    let mut written = Vec::new();
    for path in targets {
        match scenarios::search::write_new(&path, &text) {
            Ok(path) => {
                println!("written         {}", path.display());
                written.push(path);
            }
            Err(err) => {
                eprintln!("scenario search: {err}");
                return ExitCode::from(USAGE);
            }
        }
    }
    if found.from_regression.is_none() && !args.keep {
        println!(
            "keep it         rerun with --keep, or copy it into {}/, to replay it first in later searches",
            args.regressions.display()
        );
    }
    if let Some(path) = written.first().or(found.from_regression.as_ref()) {
        println!("replay          scenario replay {}", path.display());
    }
    ExitCode::FAILURE
}
