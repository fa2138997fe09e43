//! `scenario flaws`: the known-flaws catalog, each flaw in the scenario (and model) that should catch it.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::output::write_reports;
use crate::simulate::write_atomic;
use crate::{USAGE, jobs_or_cores};

#[derive(Debug, clap::Args)]
pub(crate) struct FlawsArgs {
    /// Print the catalog (name, source, description) and the process-mode entries (name,
    /// origin, mechanism) without running them.
    #[arg(long)]
    pub(crate) list: bool,
    /// Run the process-mode entries instead: real bugs of Leaf, Tinyid and uid-generator planted
    /// in `id-compat` (a test-only service speaking their API) and the catalogued flaws with a
    /// real-server form switched on in `sut-server` processes, each caught through its HTTP API
    /// by `scenario ids`; each also runs without the bug, and that run must pass.
    #[arg(long)]
    pub(crate) process: bool,
    /// Only these flaws (repeat the option); default all.
    #[arg(long)]
    pub(crate) only: Vec<sut::flaw::Flaw>,
    /// Disjoint sweeps per flaw; the median of their seeds-to-failure is reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) sweeps: u64,
    /// Seeds per sweep before a flaw counts as not caught.
    #[arg(long, default_value_t = 100)]
    pub(crate) seeds_max: u64,
    /// Threads running seeds.
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    /// Skip the model checks.
    #[arg(long)]
    pub(crate) no_models: bool,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write a self-contained HTML report, summary.json and junit.xml into this folder.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
}

pub(crate) fn flaws(args: FlawsArgs) -> ExitCode {
    if args.list {
        print_flaw_list();
        print_process_list();
        return ExitCode::SUCCESS;
    }
    if args.process {
        return process_flaws();
    }
    let opts = scenarios::flaws::FlawOptions {
        sweeps: args.sweeps,
        seeds_max: args.seeds_max,
        jobs: jobs_or_cores(args.jobs),
        models: !args.no_models,
        only: args.only,
    };
    eprintln!(
        "flaws: {} sweep(s) of at most {} seeds per flaw on {} thread(s){}",
        opts.sweeps,
        opts.seeds_max,
        opts.jobs,
        if opts.models { ", plus the models" } else { "" }
    );
    let progress = |row: &reports::model::FlawResult| {
        eprintln!(
            "  {:<31} {}",
            row.flaw,
            row.caught_by.as_deref().unwrap_or("NOT CAUGHT")
        );
    };
    let catalog = match scenarios::flaws::run_catalog(&opts, &progress) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("scenario flaws: {err}");
            return ExitCode::from(USAGE);
        }
    };
    print_flaw_table(&catalog);
    if let Some(path) = &args.json
        && let Err(err) = write_flaws_json(path, &catalog)
    {
        eprintln!("scenario flaws: cannot write {}: {err}", path.display());
        return ExitCode::from(USAGE);
    }
    let silent_models = scenarios::flaws::models_without_counterexample(&catalog);
    for row in &silent_models {
        println!(
            "MODEL GAVE NO COUNTEREXAMPLE: {} in model {} ({})",
            row.flaw,
            row.model.as_deref().unwrap_or("?"),
            row.detail.as_deref().unwrap_or("")
        );
    }
    let passed = catalog.passed() && silent_models.is_empty();
    if let Some(dir) = &args.report {
        let summary = reports::model::Summary::new("known flaws").with(catalog);
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario flaws: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `scenario flaws --list`: name, source (as wide as the longest) and description.
pub(crate) fn print_flaw_list() {
    let width = sut::flaw::Flaw::ALL
        .iter()
        .map(|f| f.source().chars().count())
        .max()
        .unwrap_or(0);
    for flaw in sut::flaw::Flaw::ALL {
        println!(
            "{:<31} {:<width$} {}",
            flaw.name(),
            flaw.source(),
            flaw.description()
        );
    }
}

pub(crate) fn print_process_list() {
    println!(
        "\nprocess mode (`scenario flaws --process`): real server processes, through their API"
    );
    for bug in &scenarios::process_flaws::ENTRIES {
        println!("{:<44} {}", bug.name, bug.origin);
        let mechanism = bug
            .mechanism
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        println!("{:<44} {mechanism}", "");
    }
}

/// `scenario flaws --process`: every process-mode entry, planted and as the control.
pub(crate) fn process_flaws() -> ExitCode {
    let mut all = true;
    println!(
        "{:<44} {:<10} {:<8} caught by",
        "process-mode entry", "control", "answers"
    );
    for bug in &scenarios::process_flaws::ENTRIES {
        let row = match scenarios::process_flaws::run(bug) {
            Ok(row) => row,
            Err(e) => {
                eprintln!("scenario flaws: {}: {e}", bug.name);
                return ExitCode::from(USAGE);
            }
        };
        all &= row.passed();
        println!(
            "{:<44} {:<10} {:<8} {}",
            bug.name,
            if row.control_passed {
                "passed"
            } else {
                "FAILED"
            },
            row.ids.0,
            row.caught.as_deref().unwrap_or("NOT CAUGHT")
        );
    }
    if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The catalog's rows, the models' counterexamples, and how many flaws were caught.
pub(crate) fn print_flaw_table(catalog: &reports::model::FlawCatalogReport) {
    println!(
        "{:<31} {:<20} {:<35} {:>8} {:<16} {:<12} {:>5}",
        "flaw", "scenario", "caught by", "seeds", "per sweep", "model", "depth"
    );
    for row in &catalog.flaws {
        let per_sweep: Vec<String> = row
            .sweeps
            .iter()
            .map(|s| s.map_or("-".to_owned(), |n| n.to_string()))
            .collect();
        println!(
            "{:<31} {:<20} {:<35} {:>8} {:<16} {:<12} {:>5}",
            row.flaw,
            row.scenario.as_deref().unwrap_or(""),
            row.caught_by.as_deref().unwrap_or("NOT CAUGHT"),
            row.seeds_to_failure
                .map_or("-".to_owned(), |n| format!("{n:.0}")),
            per_sweep.join(","),
            row.model.as_deref().unwrap_or("-"),
            row.model_depth.map_or("-".to_owned(), |d| d.to_string()),
        );
    }
    for row in catalog
        .flaws
        .iter()
        .filter(|r| !r.counterexample.is_empty())
    {
        println!(
            "\n{} in model {}:",
            row.flaw,
            row.model.as_deref().unwrap_or("?")
        );
        for step in &row.counterexample {
            println!("  {step}");
        }
    }
    let caught = catalog
        .flaws
        .iter()
        .filter(|r| r.caught_by.is_some())
        .count();
    println!("\n{caught} of {} flaws caught", catalog.flaws.len());
}

/// The catalog's rows as JSON.
pub(crate) fn write_flaws_json(
    path: &std::path::Path,
    catalog: &reports::model::FlawCatalogReport,
) -> std::io::Result<()> {
    let rows: Vec<serde_json::Value> = catalog
        .flaws
        .iter()
        .map(|r| {
            serde_json::json!({
                "flaw": r.flaw,
                "source": r.source,
                "scenario": r.scenario,
                "caught": r.caught_by.is_some(),
                "caught_by": r.caught_by,
                "seeds_to_failure": r.seeds_to_failure,
                "sweeps": r.sweeps,
                "first_failing_seed": r.seed,
                "detail": r.detail,
                "model": r.model,
                "model_depth": r.model_depth,
                "counterexample": r.counterexample,
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&rows).map_err(std::io::Error::other)?;
    write_atomic(path, &text)
}
