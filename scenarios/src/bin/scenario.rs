//! `scenario`: runs a named scenario of the bench (`scenario list` shows them).
//!
//! Exit codes: 0 every invariant held, 1 an invariant was violated (or a fault never took
//! effect, or a run was not deterministic), 2 bad usage, a bad scenario file, or something this
//! build cannot run, 3 the bench itself failed (a panic anywhere: reported with the command and
//! a replay line, never mistaken for a verdict).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use sim::run::{SeedOutcome, Sweep};
use sim::scenario::Scenario;

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
    /// Run only shard I of N of the seed range, as `I/N` (0-based).
    #[arg(long, value_parser = parse_shard)]
    shard: Option<(u64, u64)>,
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
    /// Run a scenario file once (its own seed) and say whether it reproduces the violation it
    /// expects (`[run] expect`, set in the files `scenario search` writes).
    Replay {
        /// The scenario file.
        file: PathBuf,
    },
    /// Test your own ID service, black box: Leaf, Tinyid, any HTTP API, Redis INCR or a
    /// PostgreSQL sequence at one or more URLs, optionally started by the bench and put under
    /// faults; the clients' history is judged (unique, monotonic if promised, gaps, errors).
    Ids(scenarios::ids::IdsArgs),
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

// The options of the longer subcommands (their help text is the variant's doc comment).

#[derive(Debug, clap::Args)]
struct ModelArgs {
    /// The model (`scenario model --list` shows them).
    name: Option<String>,
    /// List the models.
    #[arg(long)]
    list: bool,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Depth bound (default: exhaust the model).
    #[arg(long)]
    depth: Option<usize>,
    /// Switch on a documented flaw of the reference implementation.
    #[arg(long)]
    flaw: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report, summary.json and junit.xml into this folder.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct GateArgs {
    /// The baseline file.
    #[arg(long, default_value = "scenarios/baseline.toml")]
    baseline: PathBuf,
    /// Write the observed results as the new baseline instead of comparing.
    #[arg(long)]
    update_baseline: bool,
    /// Where to write index.html, summary.json and junit.xml.
    #[arg(long, default_value = "target/gate-report")]
    report: PathBuf,
    /// Seeds per scenario (the fixed range 0..N). Sixteen, so that every fault effect the
    /// baseline expects occurs in more than one or two seeds (with eight, the torn writes of
    /// `crash_restart` and `tcc_storm` hung on single seeds; with six, `chaos`'s swarm never chose
    /// `latency`).
    #[arg(long, default_value_t = 16)]
    seeds: u64,
    /// Threads running seeds.
    #[arg(long)]
    jobs: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct FlawsArgs {
    /// Print the catalog (name, source, description) and the process-mode entries (name,
    /// origin, mechanism) without running them.
    #[arg(long)]
    list: bool,
    /// Run the process-mode entries instead: real bugs of Leaf, Tinyid and uid-generator planted
    /// in `id-compat` (a test-only service speaking their API) and the catalogued flaws with a
    /// real-server form switched on in `sut-server` processes, each caught through its HTTP API
    /// by `scenario ids`; each also runs without the bug, and that run must pass.
    #[arg(long)]
    process: bool,
    /// Only these flaws (repeat the option); default all.
    #[arg(long)]
    only: Vec<sut::flaw::Flaw>,
    /// Disjoint sweeps per flaw; the median of their seeds-to-failure is reported.
    #[arg(long, default_value_t = 3)]
    sweeps: u64,
    /// Seeds per sweep before a flaw counts as not caught.
    #[arg(long, default_value_t = 100)]
    seeds_max: u64,
    /// Threads running seeds.
    #[arg(long)]
    jobs: Option<usize>,
    /// Skip the model checks.
    #[arg(long)]
    no_models: bool,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report, summary.json and junit.xml into this folder.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct SearchArgs {
    /// The scenario (default with --flaw: the scenario the flaw catalog uses for it).
    name: Option<String>,
    /// New cases (one simulated run each) before giving up.
    #[arg(long, default_value_t = 64)]
    cases: u32,
    /// Switch on a documented flaw of the reference implementation.
    #[arg(long)]
    flaw: Option<sut::flaw::Flaw>,
    /// Seed of the search (the same seed generates the same cases).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the shrunk scenario file here (default: a new file under `target/search/`; an
    /// existing file is never overwritten).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also keep the finding as a regression file in `--regressions` (a new file there; an
    /// existing one is never overwritten), so that later searches replay it first.
    #[arg(long)]
    keep: bool,
    /// Most fault events in a generated schedule.
    #[arg(long, default_value_t = 10)]
    events_max: usize,
    /// Most shrink steps (one simulated run each).
    #[arg(long, default_value_t = 96)]
    shrink_max: u32,
    /// Regression files, replayed first (read; written only with `--keep`).
    #[arg(long, default_value = "scenarios/regressions")]
    regressions: PathBuf,
    /// Do not replay the regression files first (a failure found is still kept).
    #[arg(long)]
    fresh: bool,
    /// Look for a violation of this invariant only (default: whichever fails first).
    #[arg(long)]
    invariant: Option<String>,
    /// Safety-phase length in simulated seconds (overrides the scenario).
    #[arg(long)]
    duration: Option<f64>,
}

fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    let (i, n) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not I/N"))?;
    let (i, n): (u64, u64) = (
        i.parse().map_err(|_| format!("bad shard index `{i}`"))?,
        n.parse().map_err(|_| format!("bad shard count `{n}`"))?,
    );
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= I < N"));
    }
    Ok((i, n))
}

const USAGE: u8 = 2;
/// The bench failed: a panic, in any thread. Not a verdict on the code under test.
const BENCH_FAILURE: i32 = 3;

/// A panic anywhere (the main thread, a sweep thread, a model checker thread, a load task)
/// ends the process with [`BENCH_FAILURE`] after saying what ran and how to run it again:
/// without this, a checker thread's panic surfaces as a second panic in the main thread and
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
    let verdict = if code == ExitCode::SUCCESS {
        "PASS"
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

/// `scenario list`: the load scenarios, then the simulated ones.
fn list() -> ExitCode {
    for (name, description) in scenarios::load_list() {
        println!("{name:<20} {description}");
    }
    for (name, _) in scenarios::NAMED {
        let description = scenarios::load(name)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(broken: {e})"));
        println!("{name:<20} {description}");
    }
    for (name, text) in scenarios::realfile::NAMED {
        let description = scenarios::realfile::RealScenario::parse(name, text)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(broken: {e})"));
        println!("{name:<20} {description}");
    }
    ExitCode::SUCCESS
}

/// `scenario edges`: every declared edge state, what it is, and the named scenarios and models
/// that own it. Stops quietly when stdout is closed (`| head`).
fn edges() -> ExitCode {
    use std::io::Write;
    let owners = scenarios::edge_owners();
    let mut out = std::io::stdout().lock();
    for edge in sut::edge_registry::all() {
        let mut by: Vec<String> = owners
            .get(edge.name)
            .map(|names| names.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        by.extend(
            models::catalog()
                .iter()
                .filter(|m| m.edges.contains(&edge.name))
                .map(|m| format!("model {}", m.name)),
        );
        let by = if by.is_empty() {
            "owned by no scenario or model".to_owned()
        } else {
            format!("owned by {}", by.join(", "))
        };
        if writeln!(out, "{:<40} {}\n{:<40} {by}", edge.name, edge.about, "").is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// `scenario NAME`: a load scenario, or a simulated one (named, or a file).
fn named(args: &RunArgs) -> ExitCode {
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
enum RunKind {
    Simulation,
    Load,
    Real,
}

/// The flags given that do not apply to a run of `kind`. `None` when every flag given applies.
fn foreign_flags(args: &RunArgs, kind: RunKind) -> Option<Vec<&'static str>> {
    use RunKind::{Load, Real, Simulation};
    let flags: [(&'static str, bool, &[RunKind]); 13] = [
        ("--seed", args.seed.is_some(), &[Simulation, Load]),
        ("--seeds", args.seeds.is_some(), &[Simulation]),
        ("--jobs", args.jobs.is_some(), &[Simulation]),
        ("--shard", args.shard.is_some(), &[Simulation]),
        ("--check-determinism", args.check_determinism, &[Simulation]),
        ("--history", args.history.is_some(), &[Simulation]),
        ("--no-buggify", args.no_buggify, &[Simulation]),
        ("--rate", args.rate.is_some(), &[Load]),
        ("--users", args.users.is_some(), &[Load]),
        ("--host", args.host.is_some(), &[Load]),
        ("--report", args.report.is_some(), &[Simulation, Load, Real]),
        ("--flaw", args.flaw.is_some(), &[Simulation, Load]),
        ("--history-edn", args.history_edn.is_some(), &[Real]),
    ];
    let foreign: Vec<&'static str> = flags
        .iter()
        .filter(|(_, given, applies)| *given && !applies.contains(&kind))
        .map(|(flag, _, _)| *flag)
        .collect();
    (!foreign.is_empty()).then_some(foreign)
}

fn refuse_flags(name: &str, what: &str, flags: &[&str]) -> ExitCode {
    eprintln!(
        "scenario: `{name}` is {what}; {} do{} not apply to it (`scenario --help` says which \
         flags apply to which runs)",
        flags.join(", "),
        if flags.len() == 1 { "es" } else { "" }
    );
    ExitCode::from(USAGE)
}

/// `scenario NAME` for a real-system scenario (`scenarios/real/`): starts the system, runs the
/// clients under the nemesis, judges the history. Exit 0 when every check held, 1 when one was
/// violated, 2 on bad usage or when the system cannot be started.
fn real(name: &str, args: &RunArgs) -> ExitCode {
    if let Some(flags) = foreign_flags(args, RunKind::Real) {
        return refuse_flags(name, "a real-system run", &flags);
    }
    let mut scenario = match scenarios::realfile::load(name) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("scenario: `{name}` is not a real-system scenario");
            return ExitCode::from(USAGE);
        }
        Err(e) => {
            eprintln!("scenario: {e}");
            return ExitCode::from(USAGE);
        }
    };
    if let Some(s) = args.duration {
        if !(s.is_finite() && s >= 1.0) {
            eprintln!("scenario: --duration must be at least 1 second, not {s}");
            return ExitCode::from(USAGE);
        }
        scenario.options.duration = std::time::Duration::from_secs_f64(s);
    }
    let o = &scenario.options;
    let system = match o.system {
        loadgen::real::IdSystem::RedisIncr(p) => format!("Redis INCR ({p:?})"),
        loadgen::real::IdSystem::PostgresSequence => "PostgreSQL nextval (fsync on)".to_owned(),
        loadgen::real::IdSystem::PostgresSequenceStored => {
            "PostgreSQL nextval stored by an INSERT in its transaction (fsync on)".to_owned()
        }
    };
    let fault = match o.fault {
        loadgen::real::Fault::Kill => "kill -9",
        loadgen::real::Fault::Pause => "SIGSTOP",
        loadgen::real::Fault::Partition => "a black-holed link",
        loadgen::real::Fault::PowerLoss => "a power loss",
    };
    println!(
        "real {}: {system}, {} clients for {:.1} s, {fault} every {} ms for {} ms",
        scenario.name,
        o.clients,
        o.duration.as_secs_f64(),
        o.every.as_millis(),
        o.down_for.as_millis()
    );
    let run = match loadgen::real::ids_under_kills(o) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("scenario: {}: {e}", scenario.name);
            return ExitCode::from(USAGE);
        }
    };
    let c = run.history.completions();
    println!(
        "  requests: {} ok, {} failed (certainly not run), {} unknown outcome (info)",
        c.ok, c.fail, c.info
    );
    let healed = match o.fault {
        loadgen::real::Fault::Kill => "a restart on the same files",
        loadgen::real::Fault::Pause => "SIGCONT",
        loadgen::real::Fault::Partition => "the link healed",
        loadgen::real::Fault::PowerLoss => "a restart on what was synced",
    };
    println!("  faults: {} (each followed by {healed})", run.faults);
    if let Some(l) = &run.lost_writes {
        println!("{}", scenarios::ids::lost_writes_line(l));
    }
    if let Some(p) = &run.proxy {
        println!(
            "  proxy: {} connections, {} bytes up, {} down, {} bytes held by the partitions",
            p.connections, p.bytes_up, p.bytes_down, p.held_bytes
        );
    }
    let checks = [&run.unique, &run.took_effect];
    for check in checks {
        println!("{}", scenarios::ids::check_line(check));
    }
    let violated: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == reports::model::Verdict::Violated)
        .map(|c| c.name.as_str())
        .collect();
    if let Some(path) = &args.history_edn {
        if let Err(e) = std::fs::write(path, run.history.to_edn()) {
            eprintln!("scenario: cannot write {}: {e}", path.display());
            return ExitCode::from(USAGE);
        }
        println!(
            "  history: {} ({} records, EDN)",
            path.display(),
            run.history.ops.len()
        );
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "scenario": scenario.name,
            "requests": {"ok": c.ok, "fail": c.fail, "info": c.info},
            "faults": run.faults,
            "invariants": [&run.unique, &run.took_effect],
            "passed": violated.is_empty(),
        });
        if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
            eprintln!("scenario: cannot write {}: {e}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    if let Some(dir) = &args.report {
        let summary = reports::model::Summary::new(format!("scenario {}", scenario.name))
            .with(run.load_report(&scenario.name, o));
        if let Err(e) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {e}");
            return ExitCode::from(USAGE);
        }
        println!("  report: {}", dir.join("index.html").display());
    }
    if !violated.is_empty() {
        println!("FAIL: {}: {} violated", scenario.name, violated.join(", "));
        ExitCode::from(1)
    } else {
        println!("PASS: {}", scenario.name);
        ExitCode::SUCCESS
    }
}

fn named_simulation(name: &str, args: &RunArgs) -> ExitCode {
    match scenarios::load(name) {
        Err(err) => {
            eprintln!("scenario: {err}");
            ExitCode::from(USAGE)
        }
        Ok(scenario) => run(scenario, args),
    }
}

/// The threads to run seeds on: `jobs`, else the machine's cores.
fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// A load run's size: the scenario's, overridden by the command line.
struct LoadPlan {
    users: u64,
    rate: Option<f64>,
    duration_s: u64,
}

fn load(name: &str, args: &RunArgs) -> ExitCode {
    let scenario = match scenarios::load_scenario(name) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("scenario: `{name}` is not a load scenario");
            return ExitCode::from(USAGE);
        }
        Err(err) => {
            eprintln!("scenario: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let flaw = args.flaw;
    let spec = &scenario.load;
    let plan = LoadPlan {
        duration_s: args
            .duration
            .map_or(spec.duration_s, |d| d.round().max(1.0) as u64),
        users: args.users.unwrap_or(spec.users),
        rate: match args.rate {
            Some(r) => (r != 0.0).then_some(r),
            None => spec.rate,
        },
    };
    let name = scenario.name.as_str();
    eprintln!(
        "scenario {name}: {} users, {} s measured, rate {}{}",
        plan.users,
        plan.duration_s,
        plan.rate.map_or("closed loop".into(), |r| format!("{r}/s")),
        flaw.map(|f| format!(", FLAW {f} switched on in the server"))
            .unwrap_or_default()
    );
    let clock = load_clock(plan.duration_s + spec.warmup_s);
    let result = run_load(name, spec, args, &plan);
    if let Some(bar) = clock {
        bar.finish_and_clear();
    }
    let mut report = match result {
        Ok(r) => r,
        Err(code) => return code,
    };
    report.scenario = name.to_owned();
    let slos = spec.thresholds.check(&report);
    report.verification.extend(slos);
    print_load_report(&report, flaw);
    let passed = report.passed();
    if let Some(path) = &args.json {
        let text = serde_json::to_value(&report)
            .map(|mut doc| {
                doc["meta"] = serde_json::json!(run_metadata());
                doc
            })
            .and_then(|doc| serde_json::to_string_pretty(&doc))
            .map_err(std::io::Error::other);
        if let Err(err) = text.and_then(|t| write_atomic(path, &t)) {
            eprintln!("scenario: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    if let Some(dir) = &args.report {
        let mut summary = reports::model::Summary::new(format!("load: {name}"));
        summary.meta.insert(
            "flaw".into(),
            flaw.map_or_else(|| "none".to_owned(), |f| f.name().to_owned()),
        );
        let summary = summary.with(report);
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// On a terminal, a bar of the load run's planned seconds (warm-up included) that fills as they
/// pass; `None` elsewhere. The load itself is measured by the run, not by this clock.
fn load_clock(seconds: u64) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(seconds.max(1));
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} s of load  {elapsed_precise}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let ticker = bar.clone();
        std::thread::spawn(move || {
            while !ticker.is_finished() && ticker.position() < ticker.length().unwrap_or(0) {
                std::thread::sleep(std::time::Duration::from_secs(1));
                ticker.inc(1);
            }
        });
        bar
    })
}

/// Runs the load: a crash run (which starts and kills its own server) when the scenario has
/// kills, else a load against `--host` or a fresh server.
fn run_load(
    name: &str,
    spec: &scenarios::loadfile::LoadSpec,
    args: &RunArgs,
    plan: &LoadPlan,
) -> Result<reports::model::LoadReport, ExitCode> {
    if let Some(host) = &args.host
        && !(host.starts_with("http://") || host.starts_with("https://"))
    {
        eprintln!(
            "scenario {name}: --host `{host}` has no scheme: give a base URL such as http://{host}"
        );
        return Err(ExitCode::from(USAGE));
    }
    let chaos = spec.cluster.as_ref().and_then(|c| c.chaos.as_ref());
    if args.seed.is_some() && chaos.is_none() {
        eprintln!("scenario {name}: --seed applies to simulations and chaos runs only");
        return Err(ExitCode::from(USAGE));
    }
    let result = if let Some(cluster) = &spec.cluster {
        if args.host.is_some() {
            eprintln!("scenario {name}: a deployment run starts its own processes: no --host");
            return Err(ExitCode::from(USAGE));
        }
        let chaos = match chaos.map(|c| c.options(args.seed)).transpose() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("scenario {name}: {e}");
                return Err(ExitCode::from(USAGE));
            }
        };
        loadgen::cluster_run(loadgen::ClusterOptions {
            load: loadgen::LoadOptions {
                workload: name.to_owned(),
                users: plan.users,
                rate: plan.rate,
                duration_s: plan.duration_s,
                warmup_s: spec.warmup_s,
                host: None,
                hlog_dir: args.report.clone(),
                mix: Some(spec.mix),
                flaw: args.flaw,
                admin_token: None,
            },
            id_servers: cluster.id_servers,
            kill: cluster.kill.clone(),
            backend: cluster.database.backend(),
            chaos,
        })
    } else if spec.kills > 0 {
        if args.host.is_some() {
            eprintln!("scenario {name}: a crash run starts and kills its own server: no --host");
            return Err(ExitCode::from(USAGE));
        }
        loadgen::crash_under_load(loadgen::CrashOptions {
            users: plan.users,
            rate: plan.rate,
            duration_s: plan.duration_s,
            kills: spec.kills,
            hlog_dir: args.report.clone(),
            mix: Some(spec.mix),
            flaw: args.flaw,
        })
    } else {
        loadgen::run(loadgen::LoadOptions {
            workload: name.to_owned(),
            users: plan.users,
            rate: plan.rate,
            duration_s: plan.duration_s,
            warmup_s: spec.warmup_s,
            host: args.host.clone(),
            hlog_dir: args.report.clone(),
            mix: Some(spec.mix),
            flaw: args.flaw,
            admin_token: None,
        })
    };
    result.map_err(|err| {
        eprintln!("scenario {name}: {err}");
        ExitCode::from(USAGE)
    })
}

/// The load report on stdout: per endpoint its corrected latencies, throughput and errors,
/// then the verification, then the flaw if one was on.
fn print_load_report(report: &reports::model::LoadReport, flaw: Option<sut::flaw::Flaw>) {
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}",
        "endpoint", "requests", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us", "rps", "errors"
    );
    for e in &report.endpoints {
        let c = &e.corrected;
        let tail = |us: u64, nines: u32| {
            if e.requests >= reports::model::tail_samples_min(nines) {
                us.to_string()
            } else {
                "-".to_owned()
            }
        };
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12.0} {:>8}",
            e.name,
            e.requests,
            c.p50_us,
            c.p90_us,
            tail(c.p99_us, 2),
            tail(c.p999_us, 3),
            c.max_us,
            e.throughput_rps,
            e.error_count()
        );
    }
    println!("verification:");
    for v in &report.verification {
        println!(
            "  {:<40} {}{}",
            v.name,
            v.verdict.label(),
            v.detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        );
    }
    if let Some(f) = flaw {
        println!("flaw: {f} ({})", f.description());
    }
}

fn model(args: &ModelArgs) -> ExitCode {
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
fn print_model_list() {
    for info in models::catalog() {
        let flaws = if info.flaws.is_empty() {
            String::new()
        } else {
            format!("  [flaws: {}]", info.flaws.join(", "))
        };
        println!("{:<20} {}{flaws}", info.name, info.description);
    }
}

/// The model check on stdout: states, speed, and each property's verdict (with the
/// counterexample of a failed one). Returns whether a property failed.
fn print_model_report(report: &models::ModelReport) -> bool {
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

fn gate(args: &GateArgs) -> ExitCode {
    use reports::gate::compare;
    let (baseline_path, update, report) = (&args.baseline, args.update_baseline, &args.report);
    let jobs = jobs_or_cores(args.jobs);
    let previous = match previous_baseline(baseline_path, update) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let mut summary = match gate_summary(args.seeds, jobs) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if update {
        if let Err(err) = write_reports(report, &summary) {
            eprintln!("scenario gate: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
        return update_baseline(baseline_path, &summary, previous.as_ref());
    }
    let outcome = compare(previous.as_ref().expect("checked above"), &summary);
    summary.gate = Some(outcome.clone());
    if let Err(err) = write_reports(report, &summary) {
        eprintln!("scenario gate: cannot write the report: {err}");
        return ExitCode::from(USAGE);
    }
    println!("{}", outcome.table());
    println!("report: {}", report.join("index.html").display());
    if outcome.passed {
        println!("gate: PASS");
        ExitCode::SUCCESS
    } else {
        println!("gate: FAIL");
        ExitCode::FAILURE
    }
}

/// The committed baseline, if there is one; none is an error unless it is being written.
fn previous_baseline(
    baseline_path: &std::path::Path,
    update: bool,
) -> Result<Option<reports::gate::Baseline>, ExitCode> {
    let previous = if baseline_path.exists() {
        match reports::gate::Baseline::load(baseline_path) {
            Ok(b) => Some(b),
            Err(err) => {
                eprintln!("scenario gate: {err}");
                return Err(ExitCode::from(USAGE));
            }
        }
    } else {
        None
    };
    if previous.is_none() && !update {
        eprintln!(
            "scenario gate: no baseline at {} (create it with --update-baseline)",
            baseline_path.display()
        );
        return Err(ExitCode::from(USAGE));
    }
    Ok(previous)
}

/// Every named scenario swept over seeds `0..seeds`, then the models and the flaws catalog.
fn gate_summary(seeds: u64, jobs: usize) -> Result<reports::model::Summary, ExitCode> {
    let mut summary = reports::model::Summary::new("regression gate");
    summary
        .meta
        .insert("seeds per scenario".into(), format!("0..{seeds}"));
    let seed_list: Vec<u64> = (0..seeds).collect();
    for (name, _) in scenarios::NAMED {
        let scenario = match scenarios::load(name) {
            Ok(s) => s,
            Err(err) => {
                eprintln!("scenario gate: {err}");
                return Err(ExitCode::from(USAGE));
            }
        };
        eprintln!("gate: simulation {name} over seeds 0..{seeds}");
        let sweep = sim::run::sweep(&scenario, &seed_list, jobs, &|_| {});
        summary
            .results
            .push(scenarios::report::simulation(&scenario, &sweep, None).into());
    }
    for result in scenarios::gate_extras(jobs) {
        summary.results.push(result);
    }
    Ok(summary)
}

/// `--update-baseline`: writes what this run observed as the new baseline.
fn update_baseline(
    baseline_path: &std::path::Path,
    summary: &reports::model::Summary,
    previous: Option<&reports::gate::Baseline>,
) -> ExitCode {
    // The baseline expects every simulation, flaw and verification to pass: say loudly
    // which did not, so a failure is not pinned unnoticed (the next gate flags it).
    for result in summary.results.iter().filter(|r| !r.passed()) {
        eprintln!(
            "scenario gate: WARNING: {} {} did not pass in this run; the baseline still expects it to",
            result.kind(),
            result.name()
        );
    }
    let mut baseline = reports::gate::Baseline::from_summary(summary, previous);
    // Latency ratios are reported, not gated: on a shared 2-core machine the P99 of a short
    // run swings by more than any useful tolerance. Throughput ratios of a constant-rate run
    // and error rates are stable, and verification must hold.
    for load in &mut baseline.load {
        for endpoint in load.endpoints.values_mut() {
            endpoint.p99_ratio = None;
        }
    }
    if let Err(err) = baseline.save(baseline_path) {
        eprintln!("scenario gate: {err}");
        return ExitCode::from(USAGE);
    }
    println!(
        "baseline written to {} ({} results)",
        baseline_path.display(),
        summary.results.len()
    );
    ExitCode::SUCCESS
}

fn bench(name: &str, seeds: u64, json: Option<&std::path::Path>) -> ExitCode {
    let scenario = match scenarios::load(name) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("scenario: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let seeds: Vec<u64> = (0..seeds.max(1)).collect();
    let nodes = sim::run::node_names(&scenario).len();
    let sim_ms = (scenario.run.safety_ms + scenario.run.liveness_ms) * seeds.len() as u64;
    eprintln!(
        "bench: {} seeds of {} and a {nodes}-node madsim ping-pong of the same simulated length, one thread",
        seeds.len(),
        scenario.name
    );
    let baseline = sim::bench::ping_pong(nodes, sim_ms, 1);
    let cluster = sim::bench::cluster(&scenario, &seeds);
    let ratio = cluster.per_wall_second() / baseline.per_wall_second().max(1e-9);
    println!(
        "{:<28} {:>14} {:>12} {:>14} {:>12}",
        "run", "messages", "wall s", "messages/s", "sim s/wall s"
    );
    for (label, r) in [
        ("madsim ping-pong (baseline)", &baseline),
        (scenario.name.as_str(), &cluster),
    ] {
        println!(
            "{label:<28} {:>14} {:>12.2} {:>14.0} {:>12.1}",
            r.messages,
            r.wall_seconds,
            r.per_wall_second(),
            r.compression()
        );
    }
    println!("message rate ratio (cluster / baseline): {ratio:.2}");
    println!(
        "time compression of {}: {:.1}x",
        scenario.name,
        cluster.compression()
    );
    if let Some(path) = json {
        let doc = serde_json::json!({
            "scenario": scenario.name,
            "nodes": nodes,
            "baseline": baseline,
            "cluster": cluster,
            "message_rate_ratio": ratio,
            "time_compression": cluster.compression(),
        });
        if let Err(err) = serde_json::to_string_pretty(&doc)
            .map_err(std::io::Error::other)
            .and_then(|t| write_atomic(path, &t))
        {
            eprintln!("scenario: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    ExitCode::SUCCESS
}

fn run(mut scenario: Scenario, args: &RunArgs) -> ExitCode {
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
fn apply_run_args(scenario: &mut Scenario, args: &RunArgs) -> Result<(), ExitCode> {
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
fn sweep_with_progress(scenario: &Scenario, seeds: &[u64], jobs: usize) -> Sweep {
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
fn write_history(path: &std::path::Path, scenario: &Scenario, seed: u64) -> Result<(), ExitCode> {
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

fn replay_command(scenario: &Scenario, seed: u64, args: &RunArgs) -> String {
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

/// Writes the HTML report, `summary.json` and `junit.xml`, with the run's metadata added.
fn write_reports(dir: &std::path::Path, summary: &reports::model::Summary) -> Result<(), String> {
    let mut summary = summary.clone();
    for (key, value) in run_metadata() {
        summary.meta.entry(key).or_insert(value);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    reports::write::write_report(dir, &summary).map_err(|e| e.to_string())?;
    reports::write::write_junit(&dir.join("junit.xml"), &summary).map_err(|e| e.to_string())
}

/// What a report needs to be compared with another: when, which code, on what machine, how.
fn run_metadata() -> std::collections::BTreeMap<String, String> {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map_or_else(
            || "unknown (not a git checkout)".to_owned(),
            |out| String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        );
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|out| out.status.success() && !out.stdout.is_empty());
    let commit = if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    };
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let command = std::env::args()
        .map(|w| shell_word(&w))
        .collect::<Vec<_>>()
        .join(" ");
    [
        (
            "date (UTC)",
            chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string(),
        ),
        ("commit", commit),
        ("host", host),
        ("cores", cores.to_string()),
        ("command", command),
        (
            "bench version",
            format!("{} ({} build)", env!("CARGO_PKG_VERSION"), build_profile()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `release` or `debug`: figures from a debug build are not comparable with release ones.
const fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

fn print_summary(
    scenario: &Scenario,
    sweep: &Sweep,
    args: &RunArgs,
    nondeterministic: &[(u64, u64, u64)],
) {
    let sim_s: f64 = sweep.seeds.iter().map(|s| s.sim_ms as f64 / 1_000.0).sum();
    let events: u64 = sweep.seeds.iter().map(|s| s.events).sum();
    let seed_wall: f64 = sweep.seeds.iter().map(|s| s.wall_seconds).sum();
    println!("scenario        {}", scenario.name);
    println!("seeds run       {}", sweep.seeds.len());
    println!("simulated       {sim_s:.1} s ({events} history events)");
    println!(
        "wall            {:.2} s (time compression {:.0}x per thread)",
        sweep.wall_seconds,
        sim_s / seed_wall.max(1e-9)
    );
    let lost: u64 = sweep.seeds.iter().map(|s| s.ids_lost).sum();
    println!("segment IDs lost to faults (never issued, within the bound): {lost}");
    print_operations(sweep);
    print_counters(&sweep.coverage);
    print_invariants(sweep);
    print_fault_coverage(scenario, sweep);
    print_edges(scenario, sweep);
    for (seed, a, b) in nondeterministic {
        println!("NOT DETERMINISTIC: seed {seed} gave history hashes {a:016x} and {b:016x}");
    }
    for (shown, (seed, v)) in sweep.violations().enumerate() {
        if shown == 5 {
            println!("... and more");
            break;
        }
        println!("VIOLATION seed {seed}: {}: {}", v.invariant, v.detail);
        if let Some(event) = v.event {
            println!("  first offending event: #{event}");
        }
        if let Some(knobs) = sweep
            .seeds
            .iter()
            .find(|s| s.seed == seed)
            .map(|s| &s.buggify)
            && !knobs.is_empty()
        {
            println!("  BUGGIFY: {}", knobs.join("; "));
        }
        println!("  replay: {}", replay_command(scenario, seed, args));
    }
}

/// Fault coverage: judged over a sweep of at least `COVERAGE_SEEDS_MIN` seeds (a kind that never
/// took effect fails it); for fewer seeds (a replay), said per seed as a warning.
fn print_fault_coverage(scenario: &Scenario, sweep: &Sweep) {
    if sweep.coverage_judged() {
        for kind in &sweep.vacuous_faults {
            println!(
                "FAULT NEVER TOOK EFFECT: {} (counters {:?} stayed 0): the sweep proves nothing about it",
                kind.name(),
                kind.effect_counters()
            );
        }
        return;
    }
    for seed in &sweep.seeds {
        let missed: Vec<&str> = scenario
            .fault_kinds()
            .into_iter()
            .filter(|kind| !sim::run::took_effect(*kind, &seed.coverage))
            .map(|kind| kind.name())
            .collect();
        if !missed.is_empty() {
            println!(
                "warning: seed {}: fault kinds that did not occur: {} (coverage is judged over \
                 sweeps of {} seeds or more, not over a replay)",
                seed.seed,
                missed.join(", "),
                sim::run::COVERAGE_SEEDS_MIN
            );
        }
    }
}

/// The edge states: how often each owned one was reached, and which declared ones no seed
/// reached. An owned edge state never reached fails a sweep large enough to judge it.
fn print_edges(scenario: &Scenario, sweep: &Sweep) {
    let rows = scenarios::report::edge_rows(scenario, sweep);
    println!("edge states owned by this scenario (times reached, seeds that reached it):");
    for row in &rows {
        let Some(from) = row.owned_from_seeds else {
            continue;
        };
        let judged = if sweep.seeds.len() as u64 >= from {
            String::new()
        } else {
            format!("  (judged over {from} seeds or more)")
        };
        println!(
            "  {:<40} {:>10} {:>6} of {}{judged}",
            row.name,
            row.reached,
            row.seeds_reached,
            sweep.seeds.len()
        );
    }
    let never: Vec<&str> = rows
        .iter()
        .filter(|r| r.owned_from_seeds.is_none() && r.reached == 0)
        .map(|r| r.name.as_str())
        .collect();
    let others = rows
        .iter()
        .filter(|r| r.owned_from_seeds.is_none() && r.reached > 0)
        .count();
    println!(
        "  ({others} other edge states reached; never reached: {})",
        if never.is_empty() {
            "none".to_owned()
        } else {
            never.join(", ")
        }
    );
    if sweep.edges_failed() {
        println!(
            "EDGE STATE NEVER REACHED: {}: the sweep proves nothing about it",
            sweep.unreached_edges.join(", ")
        );
    }
}

/// The sweep's counters in three groups: the faults the nemesis injected, what they did (the
/// counters fault coverage is judged on), and how the system responded (plus the traffic).
fn print_counters(coverage: &std::collections::BTreeMap<String, u64>) {
    let groups = [
        ("injected", "faults injected:"),
        ("effect", "fault effects (what the faults did):"),
        ("response", "the system's responses and traffic:"),
    ];
    for (group, title) in groups {
        println!("{title}");
        for (key, value) in coverage
            .iter()
            .filter(|(k, _)| scenarios::report::counter_group(k) == group)
        {
            println!("  {key:<40} {value}");
        }
    }
}

/// Per operation kind, over all seeds: ok / failed (with the top reasons) / no answer.
fn print_operations(sweep: &Sweep) {
    println!(
        "operations (ok / failed: refused, with the reason / no answer: timed out, outcome unknown):"
    );
    for row in scenarios::report::operations(sweep) {
        println!(
            "  {:<40} {} / {} / {}",
            row.kind, row.ok, row.failed, row.no_answer
        );
        for (reason, n) in row.reasons.iter().take(3) {
            println!("      {n:>8} × {reason}");
        }
        if row.reasons.len() > 3 {
            println!("      ... and {} other reasons", row.reasons.len() - 3);
        }
    }
}

/// Per invariant: held, or in how many seeds it was violated.
fn print_invariants(sweep: &Sweep) {
    println!("invariants:");
    for name in sim::checkers::INVARIANTS {
        let bad: Vec<u64> = sweep
            .seeds
            .iter()
            .filter(|s| s.results.iter().any(|(n, v)| n == name && v.is_some()))
            .map(|s| s.seed)
            .collect();
        let verdict = if bad.is_empty() {
            "held".to_owned()
        } else {
            format!("VIOLATED in {} seed(s)", bad.len())
        };
        println!("  {name:<40} {verdict}");
    }
}

#[derive(serde::Serialize)]
struct JsonViolation<'a> {
    seed: u64,
    invariant: &'a str,
    detail: &'a str,
    event: Option<u64>,
}

fn write_json(
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

/// Writes `text` to `path` whole or not at all ([`reports::atomic::write_atomic`]).
fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    reports::atomic::write_atomic(path, text.as_bytes()).map_err(std::io::Error::other)
}

fn flaws(args: FlawsArgs) -> ExitCode {
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
            "  {:<28} {}",
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
fn print_flaw_list() {
    let width = sut::flaw::Flaw::ALL
        .iter()
        .map(|f| f.source().chars().count())
        .max()
        .unwrap_or(0);
    for flaw in sut::flaw::Flaw::ALL {
        println!(
            "{:<28} {:<width$} {}",
            flaw.name(),
            flaw.source(),
            flaw.description()
        );
    }
}

fn print_process_list() {
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
fn process_flaws() -> ExitCode {
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
fn print_flaw_table(catalog: &reports::model::FlawCatalogReport) {
    println!(
        "{:<27} {:<20} {:<30} {:>8} {:<16} {:<12} {:>5}",
        "flaw", "scenario", "caught by", "seeds", "per sweep", "model", "depth"
    );
    for row in &catalog.flaws {
        let per_sweep: Vec<String> = row
            .sweeps
            .iter()
            .map(|s| s.map_or("-".to_owned(), |n| n.to_string()))
            .collect();
        println!(
            "{:<27} {:<20} {:<30} {:>8} {:<16} {:<12} {:>5}",
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
fn write_flaws_json(
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

fn search(args: &SearchArgs) -> ExitCode {
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
    let scenario = match search_scenario(args.name.as_deref(), args.flaw, args.duration) {
        Ok(s) => s,
        Err(code) => return code,
    };
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
fn search_scenario(
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
    Ok(scenario)
}

/// Runs the search with a progress bar (cases, then shrink steps) on a terminal, and a line
/// on stderr when the first failure is found otherwise.
fn search_with_progress(
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
fn print_found(
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
fn write_found(
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

fn replay(file: &std::path::Path) -> ExitCode {
    let shown = file.display().to_string();
    let scenario = match std::fs::read_to_string(file) {
        Err(err) => {
            eprintln!("scenario replay: cannot read {shown}: {err}");
            return ExitCode::from(USAGE);
        }
        Ok(text) => match Scenario::parse(&shown, &text) {
            Ok(s) => s,
            Err(err) => {
                eprintln!("scenario replay: {err}");
                return ExitCode::from(USAGE);
            }
        },
    };
    let seed = scenario.run.seed.unwrap_or(0);
    println!("scenario        {} ({shown})", scenario.name);
    if let Some(flaw) = scenario.run.flaw {
        println!("flaw            {flaw}");
    }
    println!(
        "run             seed {seed}, {} operations/s",
        scenario.workload.rate_per_s
    );
    println!("timeline:");
    for line in scenarios::search::timeline(&scenario) {
        println!("  {line}");
    }
    let outcome = sim::run::run_seed(&scenario, seed, false);
    let violations: Vec<_> = outcome.violations().collect();
    for v in &violations {
        println!("VIOLATION {}", violation_text(&v.invariant, &v.detail));
    }
    if violations.is_empty() {
        println!("every invariant held");
    }
    if let Some(expected) = &scenario.run.expect {
        if violations.iter().any(|v| &v.invariant == expected) {
            println!("reproduced      {expected}");
        } else {
            println!("NOT REPRODUCED  {expected} (the file expects it)");
        }
    }
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `invariant: detail`, without repeating the invariant when the detail starts with it.
fn violation_text(invariant: &str, detail: &str) -> String {
    if detail.starts_with(invariant) {
        detail.to_owned()
    } else {
        format!("{invariant}: {detail}")
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
