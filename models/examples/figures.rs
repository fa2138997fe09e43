//! Measures every model (or the ones named): states, unique states, wall time, states per
//! second, and every property's verdict. The figures in `docs/models.md` come from
//!
//! ```text
//! cargo run --release -p models --example figures -- [--threads N] [--depth D] [--flaw F] [NAME...]
//! ```

/// The allocator of the `scenario` binary, so that rates compare like for like.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use models::{ModelOptions, catalog, check};

fn main() {
    let mut opts = ModelOptions::default();
    let mut names = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
        };
        match arg.as_str() {
            "--threads" => opts.threads = value("--threads").parse().expect("--threads N"),
            "--depth" => opts.depth = Some(value("--depth").parse().expect("--depth D")),
            "--flaw" => opts.flaw = Some(value("--flaw")),
            name => names.push(name.to_owned()),
        }
    }
    if names.is_empty() {
        names = catalog().iter().map(|m| m.name.to_owned()).collect();
    }
    println!("| model | flaw | threads | states | unique states | max depth | wall s | states/s |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut details = Vec::new();
    for name in &names {
        let report = match check(name, opts.clone()) {
            Ok(report) => report,
            Err(err) => {
                eprintln!("{name}: {err}");
                std::process::exit(2);
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.0} |",
            report.model,
            report.flaw.as_deref().unwrap_or("-"),
            report.threads,
            report.states,
            report.unique_states,
            report.max_depth,
            report.wall_seconds,
            report.states_per_second
        );
        details.push(report);
    }
    for report in details {
        println!(
            "\n{}{}:",
            report.model,
            if report.exhaustive {
                ""
            } else {
                " (depth-bounded)"
            }
        );
        for p in &report.properties {
            println!("  {:?} {} -> {:?}", p.kind, p.name, p.verdict);
            if let Some(steps) = &p.counterexample {
                for step in steps {
                    println!("      {step}");
                }
            }
        }
    }
}
