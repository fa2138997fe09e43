//! `scenario`: runs a named scenario of the bench (`scenario list` shows them).
//!
//! Exit codes: 0 every invariant held, 1 an invariant was violated, 2 bad usage, a bad scenario
//! file, or a scenario this build cannot run.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "scenario",
    about = "Chaos and verification bench: run a named scenario"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The scenario to run (see `scenario list`).
    name: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print one scenario per line: name, then a one-line description.
    List,
}

const NOT_AVAILABLE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { NOT_AVAILABLE } else { 0 });
        }
    };
    if !cfg!(madsim) {
        eprintln!(
            "scenario: this build lacks `--cfg madsim`, so the simulator cannot run.\n\
             The flag is set in .cargo/config.toml; an environment RUSTFLAGS replaces it.\n\
             Unset RUSTFLAGS and rebuild: `cargo run --bin scenario clock_skew`."
        );
        return ExitCode::from(NOT_AVAILABLE);
    }
    match (cli.command, cli.name) {
        (Some(Command::List), _) => {
            for entry in scenarios::CATALOG {
                let status = entry
                    .missing
                    .map(|m| format!("  [not available: {m}]"))
                    .unwrap_or_default();
                println!("{:<20} {}{}", entry.name, entry.description, status);
            }
            ExitCode::SUCCESS
        }
        (None, Some(name)) => match scenarios::find(&name) {
            None => {
                eprintln!(
                    "scenario: unknown scenario `{name}`; `scenario list` shows the known ones"
                );
                ExitCode::from(NOT_AVAILABLE)
            }
            Some(entry) => match entry.missing {
                Some(missing) => {
                    eprintln!(
                        "scenario `{name}` is not available in this build: {missing}.\n\
                         Nothing was run. What exists today: the reference implementation in `sut` \
                         and its tests (`cargo test --workspace`)."
                    );
                    ExitCode::from(NOT_AVAILABLE)
                }
                None => {
                    eprintln!(
                        "scenario `{name}` is catalogued as runnable but has no runner wired in"
                    );
                    ExitCode::from(NOT_AVAILABLE)
                }
            },
        },
        (None, None) => {
            eprintln!("scenario: name a scenario (`scenario list` shows them)");
            ExitCode::from(NOT_AVAILABLE)
        }
    }
}
