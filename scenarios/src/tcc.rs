//! `scenario tcc`: test your own TCC participant against a hostile coordinator, black box
//! (docs/own-service.md); [`load::participant`] runs it.

use std::path::PathBuf;

use blackbox::tcc::{ContractError, ParticipantOptions, ParticipantRun};
use reports::model::Judgement;

use crate::ids::{IdsExit, check_line};

/// The options of `scenario tcc`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    scenario tcc --url http://127.0.0.1:7001 --admin-token-file secret.txt\n  \
    scenario tcc --url http://127.0.0.1:7001 --admin-token-file secret.txt \\\n      \
    --server-cmd 'exec sut-server --db {data}/p.db --listen 127.0.0.1:7001 \\\n      \
    --admin-token-file secret.txt' --kill-every 25\n\n\
The participant implements POST /admin/accounts, POST /admin/stock, POST /tcc/branch and \
GET /ledger as docs/own-service.md says (sut-server does). It must be the tester's alone \
during the run.\n\n\
Exit status: 0 every promise kept, 1 a promise broken (with the sequence that breaks it), 2 bad \
usage, or the participant could not be started or reached or did not answer in the contract's \
form.")]
pub struct TccArgs {
    /// The participant's base URL.
    #[arg(long)]
    pub url: String,
    /// File holding the admin secret, sent as `Authorization: Bearer …` on `/admin/*` and
    /// `GET /ledger` (also read from the environment variable SUT_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// File holding the coordinator's credential, sent on `POST /tcc/branch` (also read from
    /// SUT_SERVICE_TOKEN; default: the admin secret, for a participant with one secret).
    #[arg(long)]
    pub service_token_file: Option<PathBuf>,
    /// Hostile sequences to run.
    #[arg(long, default_value_t = 200)]
    pub sequences: u64,
    /// Messages per sequence.
    #[arg(long, default_value_t = 40)]
    pub steps: u64,
    /// The seed of the sequences (the same seed sends the same sequences).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The command that starts the participant (run by `sh -c`; `{data}` is replaced by a fresh
    /// data directory). The tester then owns it and can restart it (--kill-every).
    #[arg(long)]
    pub server_cmd: Option<String>,
    /// kill -9 the participant and start it again on its data after every this many messages
    /// (needs --server-cmd): a participant must remember its branches across crashes.
    #[arg(long, default_value_t = 0)]
    pub kill_every: u64,
    /// The database the service keeps its state in, started by the bench (`{db_url}` in
    /// --server-cmd; see `scenario ids --help`).
    #[command(flatten)]
    pub db: crate::ids::DbArgs,
    /// With --db-cmd: at every --kill-every point this fault of the database instead of the
    /// restart: db_kill (SIGKILL, then --db-cmd again) or db_power_loss (also every write under
    /// {dbdata} it had not synced dropped); the bench then waits until the service answers
    /// again, and what it acknowledged before must still hold.
    #[arg(long, value_parser = blackbox::db::DbFault::parse_between_messages)]
    pub db_fault: Option<blackbox::db::DbFault>,
    /// The slow-clients check measures `GET /ledger`; stalled bodies go to `POST /tcc/branch`.
    #[command(flatten)]
    pub slow: crate::ids::SlowArgs,
    /// After the sequences, N connections at once each `POST /tcc/branch` with no service
    /// credential, announcing a 256 KiB body and sending all of it but the last byte: each must
    /// be refused from its head within 5 s (`service.refused_from_head`), and with --server-cmd
    /// (write `exec` in it) the participant's resident memory may grow by at most half the
    /// bytes sent meanwhile (`service.unauthenticated_memory`). Up to 8000; from 127.0.0.2,
    /// 127.0.0.3, … (1,000 each) on a loopback URL.
    #[arg(long, value_name = "N")]
    pub unauth_bodies: Option<usize>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl TccArgs {
    /// The run these options ask for.
    ///
    /// # Errors
    /// A message naming the option that is wrong.
    pub fn options(&self) -> Result<ParticipantOptions, String> {
        let admin_token = admin_token(self.admin_token_file.as_deref())?;
        if self.sequences == 0 || self.steps == 0 {
            return Err("--sequences and --steps must be at least 1".into());
        }
        if self.kill_every > 0 && self.server_cmd.is_none() {
            return Err(
                "--kill-every needs --server-cmd (the tester must own the participant)".into(),
            );
        }
        let service_token = secret(self.service_token_file.as_deref(), "SUT_SERVICE_TOKEN")?;
        Ok(ParticipantOptions {
            url: self.url.clone(),
            admin_token,
            service_token,
            sequences: self.sequences,
            steps: self.steps,
            seed: self.seed,
            command: self.server_cmd.clone(),
            kill_every: self.kill_every,
            db: self.db.options(),
            db_fault: self.db_fault,
            slow: self.slow.spec(),
            bodies: self.unauth_bodies.map(blackbox::bodies::BodiesSpec::new),
        })
    }
}

/// The admin secret: the file's first line, or `SUT_ADMIN_TOKEN`.
///
/// # Errors
/// The file cannot be read.
pub fn admin_token(file: Option<&std::path::Path>) -> Result<Option<String>, String> {
    secret(file, "SUT_ADMIN_TOKEN")
}

/// A secret from `file`, else from the environment variable `env`.
///
/// # Errors
/// The file cannot be read (the message names it, never the secret).
pub fn secret(file: Option<&std::path::Path>, env: &str) -> Result<Option<String>, String> {
    match file {
        Some(path) => Ok(Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .trim()
                .to_owned(),
        )),
        None => Ok(std::env::var(env).ok()),
    }
}

/// Says why a contract run could not be made: exit 2.
#[must_use]
pub fn not_run(command: &str, e: &ContractError) -> IdsExit {
    let hint = match e {
        ContractError::Unreachable(_) => {
            " (is it running, is the admin secret right, does it implement the contract of \
             docs/own-service.md?)"
        }
        ContractError::Usage(_) => "",
    };
    eprintln!("scenario {command}: {e}{hint}");
    IdsExit::Usage
}

/// Prints that every check held or which were violated (the verdict line, PASS or FAIL, follows
/// on stderr); the exit that says so.
#[must_use]
pub fn verdict(checks: &[reports::model::InvariantResult]) -> IdsExit {
    let violated: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == Judgement::Violated)
        .map(|c| c.name.as_str())
        .collect();
    if violated.is_empty() {
        println!("every check held");
        IdsExit::Passed
    } else {
        println!("violated: {}", violated.join(", "));
        IdsExit::Violated
    }
}

/// Runs `scenario tcc`, printing what it does and finds.
#[must_use]
pub fn run(args: &TccArgs) -> IdsExit {
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scenario tcc: {e}");
            return IdsExit::Usage;
        }
    };
    println!(
        "tcc: participant at {}, {} hostile sequences of {} messages, seed {}{}",
        opts.url,
        opts.sequences,
        opts.steps,
        opts.seed,
        if let (true, Some(fault)) = (opts.kill_every > 0, opts.db_fault) {
            format!(
                ", {} of the database every {} messages",
                fault.kind().name(),
                opts.kill_every
            )
        } else if opts.kill_every > 0 {
            format!(", kill -9 and restart every {} messages", opts.kill_every)
        } else {
            String::new()
        }
    );
    let run = match blackbox::tcc::run(&opts) {
        Ok(run) => run,
        Err(e) => return not_run("tcc", &e),
    };
    print_run(&run);
    if let Some(path) = &args.json
        && let Err(e) = write_json(path, args, &run)
    {
        eprintln!("scenario tcc: {e}");
        return IdsExit::Usage;
    }
    verdict(&run.checks())
}

fn print_run(run: &ParticipantRun) {
    println!(
        "  messages: {} answered in {} sequences ({} pairs sent at once, {} restarts)",
        run.messages, run.sequences, run.races, run.restarts
    );
    if run.db_faults.0 > 0 {
        println!(
            "  database faults: {} ({} seen in place); the participant stopped itself after {} \
             of them and was started again",
            run.db_faults.0, run.db_faults.1, run.exits_after_db_faults
        );
    }
    if run.finding.is_none() {
        // A run stopped at a finding met only what came before it: not worth a line.
        println!("{}", coverage_line(run));
    }
    if let blackbox::tcc::Registry::Absent(status) = run.registry {
        println!(
            "  price list: none (POST /admin/activities answered {status}): the price check is \
             not applicable, every other promise is judged"
        );
    }
    if let Some((slow, _)) = &run.slow {
        println!("{}", crate::ids::slow_line(slow));
    }
    if let Some(bodies) = &run.bodies {
        println!("  unauthenticated bodies: {}", bodies.answers_line());
    }
    for check in run.checks() {
        // The breaking sequence is printed once, below, not in its check's line.
        let mut line = check.clone();
        if let (Some(f), Judgement::Violated) = (&run.finding, check.verdict) {
            line.detail = Some(format!("sequence {}, below", f.sequence));
        }
        println!("{}", check_line(&line));
    }
    if let Some(f) = &run.finding {
        // The sequence once: cut down to the offending draws when that still breaks the
        // promise, whole otherwise.
        match &f.shrunk {
            Some(s) => println!(
                "  sequence {}, cut down to the offending draws ({} of its {} actions): {}",
                f.sequence,
                s.len(),
                f.actions.len(),
                blackbox::tcc::render(s)
            ),
            None => println!(
                "  sequence {} ({} actions; no shorter one of only the offending draws breaks it): {}",
                f.sequence,
                f.actions.len(),
                blackbox::tcc::render(&f.actions)
            ),
        }
        println!("  replay: {}", replay_line(f.sequence));
    }
}

/// The command line that sends the same sequences again up to the failing one (the same seed
/// sends the same sequences): this run's, with `--sequences` set to stop there.
fn replay_line(sequence: u64) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut args = std::env::args();
    while let Some(word) = args.next() {
        if word == "--sequences" {
            let _ = args.next();
        } else if !word.starts_with("--sequences=") {
            words.push(word);
        }
    }
    words.push("--sequences".into());
    words.push((sequence + 1).to_string());
    words
        .iter()
        .map(|w| {
            if w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which answers the promises allow the sequences met.
fn coverage_line(run: &ParticipantRun) -> String {
    let allowed = blackbox::tcc::allowed().len();
    let unreached = run.unreached();
    let never = unreached
        .iter()
        .map(|(p, w, a)| format!("{p:?} after {w:?} answered {a:?}"))
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "  answers met: {} of the {allowed} the promises allow{}",
        allowed - unreached.len(),
        if never.is_empty() {
            String::new()
        } else {
            format!(" (never met: {never})")
        }
    )
}

fn write_json(path: &std::path::Path, args: &TccArgs, run: &ParticipantRun) -> Result<(), String> {
    let doc = serde_json::json!({
        "url": args.url,
        "seed": args.seed,
        "sequences": run.sequences,
        "messages": run.messages,
        "races": run.races,
        "restarts": run.restarts,
        "answers_met": run.seen.len(),
        "answers_allowed": blackbox::tcc::allowed().len(),
        "price_registry": run.registry,
        "slow_clients": run.slow.as_ref().map(|(s, _)| s),
        "unauthenticated_bodies": run.bodies,
        "invariants": run.checks(),
        "finding": run.finding.as_ref().map(|f| serde_json::json!({
            "check": f.check,
            "sequence": f.sequence,
            "what": f.what,
            "actions": blackbox::tcc::render(&f.actions),
            "shrunk": f.shrunk.as_deref().map(blackbox::tcc::render),
        })),
        "passed": run.passed(),
    });
    std::fs::write(path, format!("{doc:#}\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
