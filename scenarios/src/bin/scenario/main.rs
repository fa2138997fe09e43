//! `scenario`: runs a named scenario of the bench (`scenario list` shows them).
//!
//! Exit codes: 0 every invariant held, 1 an invariant was violated (or a fault never took
//! effect, or a run was not deterministic), 2 bad usage, a bad scenario file, or something this
//! build cannot run, 3 the bench itself failed (a panic anywhere: reported with the command and
//! a replay line, never mistaken for a verdict).

mod bench;
mod flaws;
mod gate;
mod list;
mod load;
mod merge;
mod model;
mod named;
mod output;
mod real;
mod replay;
mod search;
mod simulate;
mod sweepfile;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::bench::bench;
use crate::flaws::{FlawsArgs, flaws};
use crate::gate::{GateArgs, gate};
use crate::list::{edges, list};
use crate::merge::{MergeArgs, merge};
use crate::model::{ModelArgs, model};
use crate::named::named;
use crate::output::write_reports;
use crate::replay::replay;
use crate::search::{SearchArgs, search};

/// mimalloc instead of glibc's malloc: the simulator and the model checker allocate and free
/// small objects at a high rate (messages, cloned states; malloc and free were ~25 % of a model
/// check's cycles and ~15 % of a simulation's instructions under glibc). Measured in
/// `docs/models.md` and `docs/simulation.md`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "scenario",
    about = "Chaos and verification bench: run a named scenario",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// A named scenario (see `scenario list`) or a scenario file (`path.toml`).
    name: Option<String>,
    /// First seed (default: the scenario file's `[run] seed`, else 0).
    #[arg(long)]
    seed: Option<u64>,
    /// Number of seeds (default: the scenario's own sweep size).
    #[arg(long)]
    seeds: Option<u64>,
    /// Threads running seeds (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run only shard I of N of the seed range, as `I/N`, counted from 1 (`1/4` … `4/4`).
    #[arg(long, value_parser = parse_shard)]
    shard: Option<(u64, u64)>,
    /// Simulations: where fault and edge coverage is judged: on this sweep (`sweep`, the
    /// default), or on the union of the shards by `scenario merge` (`union`: this run records
    /// its coverage in its `--json` file, and its exit code reflects violations only).
    #[arg(long, value_enum)]
    coverage: Option<sweepfile::CoverageMode>,
    /// How long the workload runs under measurement, in seconds: for a simulation the safety
    /// phase (simulated seconds, faults on; the liveness phase follows), for a load run the
    /// measured seconds (the warm-up comes before). Overrides the scenario file.
    #[arg(long)]
    duration: Option<f64>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run every seed twice and compare the hashes of the full histories.
    #[arg(long)]
    check_determinism: bool,
    /// Write a self-contained HTML report, `summary.json` and `junit.xml` into this folder.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Load runs: total operations per second (constant-rate open model), overriding the
    /// scenario file's; 0: closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Load runs: concurrent users (overrides the scenario file's).
    #[arg(long)]
    users: Option<u64>,
    /// Load runs: the base URL of a running sut-server (default: start a fresh one).
    #[arg(long)]
    host: Option<String>,
    /// Write the full history of the first seed to this file, one event per line.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Switch on a documented flaw of the reference implementation (`scenario flaws` lists
    /// them): in the simulated cluster (overrides the scenario file's `[run] flaw`), or in the
    /// `sut-server` a load run starts.
    #[arg(long)]
    flaw: Option<sut::flaw::Flaw>,
    /// Simulations: no BUGGIFY (the per-seed knobs that shrink timers and budgets, put drift at
    /// its bound, place crashes at durable steps and hold messages back past their deadline).
    #[arg(long)]
    no_buggify: bool,
    /// Simulations: crash points. Each seed finds the steps its nodes reach (a message read or
    /// sent, a log sync about to begin or done) and tries at most N of them, each a run of the
    /// seed again with that node crashed right there and restarted. 0: off. Overrides the
    /// scenario's `[run] crash_points`.
    #[arg(long, value_name = "N")]
    crash_points: Option<u32>,
    /// Simulations: strike one crash point in every seed, `NODE:SITE:LABEL#N` as a failing
    /// crash point's replay line names it (e.g. `coord:send:tcc.try.wallet#1`).
    #[arg(long, value_name = "POINT")]
    crash_at: Option<String>,
    /// Deployment runs (`cluster_pg`, `cluster_mariadb`, a file with `[load.cluster]`):
    /// contention mode instead of the load: the deployment's ID servers on its database with
    /// segments of 1 ID, --users clients (default 32) asking for IDs for --duration seconds
    /// (default 5), so that every request reloads a segment and the servers race on the tag's
    /// row; judged by ids.unique and ids.monotonic.
    #[arg(long)]
    contention: bool,
    /// Deployment runs: plant a weakness of the deployed server in every sut-server process
    /// (TEST ONLY: `sut-server --weakness`, e.g. unguarded_fallback).
    #[arg(long, value_name = "W")]
    weakness: Option<String>,
    /// Real-system runs (`scenarios/real/`): write the clients' history to this file as
    /// Jepsen's EDN (`:type :invoke/:ok/:fail/:info`, `:f :generate`, `:value`, `:process`,
    /// `:time`, `:index`), for Elle, Knossos or Jepsen's `unique-ids` checker.
    #[arg(long)]
    history_edn: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print one scenario per line: name, then a one-line description.
    List,
    /// Print every declared edge state (the rare situations the protocols hinge on, which
    /// scenarios own in `[edges] expect`): name, then what it is.
    Edges,
    /// Model-check NAME with stateright (exhaustive within the model's bounds).
    Model(ModelArgs),
    /// Serve stateright's Explorer web UI for a model.
    Explore {
        /// The model.
        name: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: String,
        /// Switch on a documented flaw.
        #[arg(long)]
        flaw: Option<String>,
    },
    /// The CI regression gate: every named scenario over a fixed seed range (and every model),
    /// compared with the committed baseline. Prints a table, writes the reports, exits 0/1.
    Gate(GateArgs),
    /// Run the known-flaws catalog: each flaw switched on in the scenario that should catch it,
    /// swept until a generic invariant fails (and in the model that covers it, if any).
    Flaws(FlawsArgs),
    /// Search for a minimal failing fault schedule (proptest generates schedules and shrinks
    /// the first failure); prints it as a timeline and writes it as a scenario file that
    /// replays it. Exit 0 nothing found, 1 a violation found (and shrunk), 2 bad usage.
    Search(SearchArgs),
    /// Merge the JSON files of a sweep's shards (`scenario NAME --shard I/N --json FILE`) into
    /// one verdict: one summary, report and JUnit file, every violation with its replay line,
    /// fault and edge coverage judged on the union. Refuses shards of different builds or
    /// scenarios and seeds run twice; names the seeds of the range no shard ran (exit 2 unless
    /// `--allow-missing`). Exit 0 all held, 1 a violation or coverage not met, 2 bad input.
    Merge(MergeArgs),
    /// Run a scenario file once (its own seed) and say whether it reproduces the violation it
    /// expects (`[run] expect`, set in the files `scenario search` writes).
    Replay {
        /// The scenario file.
        file: PathBuf,
    },
    /// Test your own ID service, black box: Leaf, Tinyid, any HTTP API, Redis INCR or a
    /// PostgreSQL sequence at one or more URLs, optionally started by the bench and put under
    /// faults with their database; the clients' history is judged (unique, monotonic if
    /// promised, gaps, errors).
    Ids(Box<scenarios::ids::IdsArgs>),
    /// Test your own TCC participant, black box, against a hostile coordinator: Try, Confirm
    /// and Cancel of fresh draws in any order, repeated, two at once, across kill -9 and
    /// restarts; every answer is judged against the participant's promises and its books.
    Tcc(scenarios::tcc::TccArgs),
    /// Test your own one-time-token service, black box: each token consumed by several clients
    /// at once over every instance, again after its round and after restarts; at most one
    /// consume may win, and exactly one when every answer came.
    Tokens(scenarios::tokens::TokensArgs),
    /// Measure the simulator's speed against a bare madsim ping-pong of the same node count.
    Bench {
        /// The scenario to measure.
        #[arg(default_value = "clock_skew")]
        name: String,
        /// Seeds to run (single-threaded).
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// Write the figures as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    let (i, n) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not I/N (shards count from 1: 1/4 … 4/4)"))?;
    let (i, n): (u64, u64) = (
        i.parse().map_err(|_| format!("bad shard number `{i}`"))?,
        n.parse().map_err(|_| format!("bad shard count `{n}`"))?,
    );
    if n == 0 {
        return Err(format!("shard {i}/{n}: a sweep of 0 shards"));
    }
    if i == 0 {
        return Err(format!(
            "shard 0/{n}: shards count from 1, as Jest's, Playwright's and nextest's do: \
             write 1/{n} … {n}/{n} (0/{n} was the first shard of earlier builds, which counted \
             from 0)"
        ));
    }
    if i > n {
        return Err(format!("shard {i}/{n}: need 1 <= I <= N"));
    }
    Ok((i, n))
}

const USAGE: u8 = 2;

/// The bench failed: a panic, in any thread. Not a verdict on the code under test.
const BENCH_FAILURE: i32 = 3;

/// Whether `info` is `println!`'s panic on a closed stdout (the reader of a pipe has gone).
fn stdout_closed(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let message = info
        .payload()
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| info.payload().downcast_ref::<&str>().copied())
        .unwrap_or_default();
    message.starts_with("failed printing to stdout") && message.contains("Broken pipe")
}

/// A panic anywhere (the main thread, a sweep thread, a model checker thread, a load task)
/// ends the process with [`BENCH_FAILURE`] after saying what ran and how to run it again:
/// without this, a checker thread's panic surfaces as a second panic in the main thread and
/// exit code 101, which scripts cannot tell from a crash of anything else.
fn report_panics_as_bench_failures() {
    let command = std::env::args()
        .map(|a| shell_word(&a))
        .collect::<Vec<_>>()
        .join(" ");
    std::panic::set_hook(Box::new(move |info| {
        if stdout_closed(info) {
            // `scenario list | head`: the reader has gone, as a shell pipeline means it to.
            // Quit quietly, as a process killed by SIGPIPE would.
            std::process::exit(0);
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        eprintln!("\nscenario: BENCH FAILURE (exit code {BENCH_FAILURE}): a panic, not a verdict");
        eprintln!("  command: {command}");
        eprintln!("  thread:  {thread}");
        eprintln!("  panic:   {info}");
        match sim::run::running_seed() {
            Some(run) => {
                let flaw = run.flaw.map(|f| format!(" --flaw {f}")).unwrap_or_default();
                eprintln!("  seed:    {} of scenario {}", run.seed, run.scenario);
                eprintln!(
                    "  replay:  cargo run --release --bin scenario -- {} --seed {} --seeds 1 --jobs 1{flaw}",
                    run.scenario, run.seed
                );
            }
            None => eprintln!("  replay:  {command}"),
        }
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("{backtrace}");
        } else {
            eprintln!("  (RUST_BACKTRACE=1 prints a backtrace)");
        }
        std::process::exit(BENCH_FAILURE);
    }));
}

/// `word`, quoted for a POSIX shell when it needs it.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Tests of the panic report set `SCENARIO_TEST_PANIC` to `main` or `thread`: the command then
/// panics there before doing anything (exit code 3 is what they check).
fn panic_if_asked_by_a_test() {
    match std::env::var("SCENARIO_TEST_PANIC").as_deref() {
        Ok("main") => panic!("SCENARIO_TEST_PANIC=main"),
        Ok("thread") => {
            let worker = std::thread::Builder::new()
                .name("test-worker".into())
                .spawn(|| panic!("SCENARIO_TEST_PANIC=thread"));
            let _ = worker.map(std::thread::JoinHandle::join);
        }
        _ => {}
    }
}

fn main() -> ExitCode {
    report_panics_as_bench_failures();
    panic_if_asked_by_a_test();
    // The hostile checks hold a thousand connections and more; the services started here
    // inherit the limit.
    let _ = chaos::raise_open_file_limit();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { USAGE } else { 0 });
        }
    };
    if !cfg!(madsim) {
        eprintln!(
            "scenario: this build lacks `--cfg madsim`, so the simulator cannot run.\n\
             The flag is set in .cargo/config.toml; an environment RUSTFLAGS replaces it.\n\
             Unset RUSTFLAGS and rebuild: `cargo run --bin scenario clock_skew`."
        );
        return ExitCode::from(USAGE);
    }
    let checks = checks_something(&cli);
    let started = std::time::Instant::now();
    let code = match cli.command {
        Some(command) => subcommand(command),
        None => named(&cli.run),
    };
    if checks {
        print_verdict(code, started.elapsed().as_secs_f64());
    }
    code
}

/// Whether the command checks something (and so ends with a verdict line): not the lists and
/// not the Explorer.
fn checks_something(cli: &Cli) -> bool {
    match &cli.command {
        None => cli.run.name.is_some(),
        Some(Command::List | Command::Edges | Command::Explore { .. }) => false,
        Some(Command::Model(args)) => !args.list,
        Some(Command::Flaws(args)) => !args.list,
        Some(_) => true,
    }
}

/// The last line of every checking command, on stderr: PASS or FAIL, what ran, how long.
fn print_verdict(code: ExitCode, seconds: f64) {
    let what = std::env::args()
        .skip(1)
        .map(|w| shell_word(&w))
        .collect::<Vec<_>>()
        .join(" ");
    let note = scenarios::VERDICT_NOTE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let pass = note.map_or_else(|| "PASS".to_owned(), |note| format!("PASS ({note})"));
    let verdict = if code == ExitCode::SUCCESS {
        pass.as_str()
    } else if code == ExitCode::FAILURE
        && replay::REPRODUCED.load(std::sync::atomic::Ordering::Relaxed)
    {
        "REPRODUCED (exit 1: the violation the file expects, see above)"
    } else if code == ExitCode::FAILURE {
        "FAIL (a finding: see above)"
    } else {
        "FAIL (bad usage: see above)"
    };
    eprintln!("{verdict}: scenario {what} ({seconds:.1} s)");
}

fn subcommand(command: Command) -> ExitCode {
    match command {
        Command::List => list(),
        Command::Edges => edges(),
        Command::Bench { name, seeds, json } => bench(&name, seeds, json.as_deref()),
        Command::Search(args) => search(&args),
        Command::Replay { file } => replay(&file),
        Command::Merge(args) => merge(&args),
        Command::Flaws(args) => flaws(args),
        Command::Model(args) => model(&args),
        Command::Explore { name, listen, flaw } => {
            match models::serve_with_flaw(&name, &listen, flaw.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("scenario explore: {err}");
                    ExitCode::from(USAGE)
                }
            }
        }
        Command::Gate(args) => gate(&args),
        Command::Ids(args) => exit_of(scenarios::ids::run(&args, &write_reports)),
        Command::Tcc(args) => exit_of(scenarios::tcc::run(&args)),
        Command::Tokens(args) => exit_of(scenarios::tokens::run(&args)),
    }
}

/// The exit status of a black-box run.
fn exit_of(exit: scenarios::ids::IdsExit) -> ExitCode {
    match exit {
        scenarios::ids::IdsExit::Passed => ExitCode::SUCCESS,
        scenarios::ids::IdsExit::Violated => ExitCode::from(1),
        scenarios::ids::IdsExit::Usage => ExitCode::from(USAGE),
    }
}

/// The threads to run seeds on: `jobs`, else the machine's cores.
fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}
