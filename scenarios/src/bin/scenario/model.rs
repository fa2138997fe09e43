//! `scenario model NAME`: a stateright model, exhaustive within its bounds.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::USAGE;
use crate::output::write_reports;
use crate::simulate::write_atomic;

// The options of the longer subcommands (their help text is the variant's doc comment).

#[derive(Debug, clap::Args)]
pub(crate) struct ModelArgs {
    /// The model (`scenario model --list` shows them).
    pub(crate) name: Option<String>,
    /// List the models.
    #[arg(long)]
    pub(crate) list: bool,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,
    /// Depth bound (default: exhaust the model).
    #[arg(long)]
    pub(crate) depth: Option<usize>,
    /// Switch on a documented flaw of the reference implementation.
    #[arg(long)]
    pub(crate) flaw: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write a self-contained HTML report, summary.json and junit.xml into this folder.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
}

pub(crate) fn model(args: &ModelArgs) -> ExitCode {
    let Some(name) = args.name.as_deref().filter(|_| !args.list) else {
        print_model_list();
        return if args.list {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(USAGE)
        };
    };
    let options = models::ModelOptions {
        threads: args.threads.max(1),
        depth: args.depth,
        flaw: args.flaw.clone(),
        progress: std::io::stderr().is_terminal(),
    };
    let report = match models::check(name, options) {
        Ok(r) => r,
        Err(err) => {
            eprintln!("scenario model: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let failed = print_model_report(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(std::io::Error::other);
        if let Err(err) = text.and_then(|t| write_atomic(path, &t)) {
            eprintln!("scenario model: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    if let Some(dir) = &args.report {
        let summary = reports::model::Summary::new(format!("model: {name}"))
            .with(scenarios::report::model(&report));
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario model: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One model per line: name, description, and the flaws it can switch on.
pub(crate) fn print_model_list() {
    for info in models::catalog() {
        let flaws = if info.flaws.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = info.flaws.iter().map(|f| f.name()).collect();
            format!("  [flaws: {}]", names.join(", "))
        };
        println!("{:<20} {}{flaws}", info.name, info.description);
    }
}

/// The model check on stdout: states, speed, and each property's verdict (with the
/// counterexample of a failed one). Returns whether a property failed.
pub(crate) fn print_model_report(report: &models::ModelReport) -> bool {
    println!("model           {}", report.model);
    if let Some(flaw) = &report.flaw {
        println!("flaw            {flaw}");
    }
    println!(
        "states          {} ({} unique), max depth {}",
        report.states, report.unique_states, report.max_depth
    );
    println!(
        "wall            {:.2} s, {:.0} states/s on {} thread(s){}",
        report.wall_seconds,
        report.states_per_second,
        report.threads,
        if report.exhaustive {
            ", exhaustive"
        } else {
            ", depth-bounded"
        }
    );
    println!("properties:");
    let mut failed = false;
    for p in &report.properties {
        println!(
            "  {:<10} {:<45} {}",
            format!("{:?}", p.kind).to_lowercase(),
            p.name,
            p.verdict.label()
        );
        let bad = matches!(
            p.verdict,
            models::PropertyVerdict::Violated | models::PropertyVerdict::NotFound
        );
        failed |= bad;
        if let (true, Some(steps)) = (bad, &p.counterexample) {
            println!("    counterexample ({} steps):", steps.len());
            for step in steps {
                println!("      {step}");
            }
        }
    }
    let others: Vec<String> = report
        .edges
        .iter()
        .filter(|(name, _)| {
            !report
                .properties
                .iter()
                .any(|p| p.name == format!("edge: {name}"))
        })
        .map(|(name, n)| format!("{name} ({n})"))
        .collect();
    if !others.is_empty() {
        println!(
            "other edge states the search passed through: {}",
            others.join(", ")
        );
    }
    failed
}
