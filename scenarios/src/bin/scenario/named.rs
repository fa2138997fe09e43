//! `scenario NAME`: a named scenario or a scenario file, sent to the runner of its kind (a simulation, a load run, a real-system file), with the flags of another kind refused.

use std::process::ExitCode;

use clap::CommandFactory;

use crate::load::load;
use crate::real::real;
use crate::simulate::run;
use crate::{Cli, RunArgs, USAGE};

/// `scenario NAME`: a load scenario, or a simulated one (named, or a file).
pub(crate) fn named(args: &RunArgs) -> ExitCode {
    match args.name.clone() {
        None => {
            eprintln!("{}", Cli::command().render_help());
            eprintln!("scenario: name a scenario (`scenario list` shows them)");
            ExitCode::from(USAGE)
        }
        Some(name) if scenarios::realfile::is_real_scenario(&name) => real(&name, args),
        Some(name) if scenarios::is_load_scenario(&name) => {
            match foreign_flags(args, RunKind::Load) {
                Some(flags) => refuse_flags(&name, "a load run", &flags),
                None => load(&name, args),
            }
        }
        Some(name) => match foreign_flags(args, RunKind::Simulation) {
            Some(flags) => refuse_flags(&name, "a simulation", &flags),
            None => named_simulation(&name, args),
        },
    }
}

/// What a `scenario NAME` run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunKind {
    Simulation,
    Load,
    Real,
}

/// The flags given that do not apply to a run of `kind`. `None` when every flag given applies.
pub(crate) fn foreign_flags(args: &RunArgs, kind: RunKind) -> Option<Vec<&'static str>> {
    use RunKind::{Load, Real, Simulation};
    let flags: [(&'static str, bool, &[RunKind]); 18] = [
        ("--seed", args.seed.is_some(), &[Simulation, Load]),
        ("--crash-points", args.crash_points.is_some(), &[Simulation]),
        ("--crash-at", args.crash_at.is_some(), &[Simulation]),
        ("--seeds", args.seeds.is_some(), &[Simulation]),
        ("--jobs", args.jobs.is_some(), &[Simulation]),
        ("--shard", args.shard.is_some(), &[Simulation]),
        ("--coverage", args.coverage.is_some(), &[Simulation]),
        ("--check-determinism", args.check_determinism, &[Simulation]),
        ("--history", args.history.is_some(), &[Simulation]),
        ("--no-buggify", args.no_buggify, &[Simulation]),
        ("--rate", args.rate.is_some(), &[Load]),
        ("--users", args.users.is_some(), &[Load]),
        ("--host", args.host.is_some(), &[Load]),
        ("--report", args.report.is_some(), &[Simulation, Load, Real]),
        ("--flaw", args.flaw.is_some(), &[Simulation, Load]),
        ("--history-edn", args.history_edn.is_some(), &[Real]),
        ("--contention", args.contention, &[Load]),
        ("--weakness", args.weakness.is_some(), &[Load]),
    ];
    let foreign: Vec<&'static str> = flags
        .iter()
        .filter(|(_, given, applies)| *given && !applies.contains(&kind))
        .map(|(flag, _, _)| *flag)
        .collect();
    (!foreign.is_empty()).then_some(foreign)
}

pub(crate) fn refuse_flags(name: &str, what: &str, flags: &[&str]) -> ExitCode {
    eprintln!(
        "scenario: `{name}` is {what}; {} do{} not apply to it (`scenario --help` says which \
         flags apply to which runs)",
        flags.join(", "),
        if flags.len() == 1 { "es" } else { "" }
    );
    ExitCode::from(USAGE)
}

pub(crate) fn named_simulation(name: &str, args: &RunArgs) -> ExitCode {
    match scenarios::load(name) {
        Err(err) => {
            eprintln!("scenario: {err}");
            ExitCode::from(USAGE)
        }
        Ok(scenario) => run(scenario, args),
    }
}
