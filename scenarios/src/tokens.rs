//! `scenario tokens`: test your own one-time-token service, black box (docs/own-service.md);
//! [`load::tokens`] runs it.

use std::path::PathBuf;

use blackbox::tokens::{TokensOptions, TokensRun};

use crate::ids::{IdsExit, check_line};

/// The options of `scenario tokens`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    scenario tokens --url http://127.0.0.1:7001 --admin-token-file secret.txt\n  \
    scenario tokens --url http://127.0.0.1:7001 --url http://127.0.0.1:7002 \\\n      \
    --admin-token-file secret.txt --consumers 8 --tokens 500\n\n\
The service implements POST /tokens, POST /tokens/once and POST /tokens/once/consume as \
docs/own-service.md says (sut-server does).\n\n\
Besides single use, it checks what a hostile client tries: another user's token presented as \
one's own (tokens.owner_only), values next to an issued one (tokens.unguessable), one user \
asking for --exhaust tokens (tokens.quota), with --slow-clients N stalled connections \
(service.slow_clients, service.stalled_closed), and with --unauth-bodies N requests without \
a JWT whose bodies never end (service.refused_from_head, service.unauthenticated_memory).\n\n\
Exit status: 0 every check held, 1 a check was violated, 2 bad usage, or the service could \
not be started or reached or did not issue tokens in the contract's form.")]
pub struct TokensArgs {
    /// An instance's base URL (repeat for several instances on one store; the consumes of a
    /// token are spread over them).
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// File holding the admin secret for `POST /tokens` (also read from the environment
    /// variable SUT_ADMIN_TOKEN).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Tokens to issue and race.
    #[arg(long, default_value_t = 300)]
    pub tokens: u64,
    /// Consumes of each token sent at once.
    #[arg(long, default_value_t = 4)]
    pub consumers: u64,
    /// The command that starts one instance (run by `sh -c`; repeat, one per --url, in the
    /// same order). `{data}` is replaced by one fresh data directory shared by all, `{server}`
    /// by the instance's number.
    #[arg(long = "server-cmd")]
    pub server_cmds: Vec<String>,
    /// kill -9 and restart every instance after every this many tokens (needs --server-cmd):
    /// a used token must stay used.
    #[arg(long, default_value_t = 0)]
    pub kill_every: u64,
    /// After the rounds, one fresh user asks for this many one-time tokens, one per activity,
    /// as fast as it can: the service must refuse it before the last and still issue to
    /// another user (`tokens.quota`); 0: not checked.
    #[arg(long, default_value_t = 100)]
    pub exhaust: u64,
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
    #[command(flatten)]
    pub slow: crate::ids::SlowArgs,
    /// After the rounds, N connections at once each `POST /tokens/once` with no JWT, announcing
    /// a 256 KiB body and sending all of it but the last byte: each must be refused from its
    /// head within 5 s (`service.refused_from_head`), and with --server-cmd (write `exec` in
    /// it) the first instance's resident memory may grow by at most half the bytes sent
    /// meanwhile (`service.unauthenticated_memory`; a service that keeps the bodies grows by
    /// their size). Up to 8000; from 127.0.0.2, 127.0.0.3, … (1,000
    /// each) on a loopback URL.
    #[arg(long, value_name = "N")]
    pub unauth_bodies: Option<usize>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl TokensArgs {
    /// The run these options ask for.
    ///
    /// # Errors
    /// A message naming the option that is wrong.
    pub fn options(&self) -> Result<TokensOptions, String> {
        let admin_token = crate::tcc::admin_token(self.admin_token_file.as_deref())?;
        Ok(TokensOptions {
            urls: self.urls.clone(),
            admin_token,
            tokens: self.tokens,
            consumers: self.consumers,
            commands: self.server_cmds.clone(),
            kill_every: self.kill_every,
            db: self.db.options(),
            db_fault: self.db_fault,
            exhaust: self.exhaust,
            slow: self.slow.spec(),
            bodies: self.unauth_bodies.map(blackbox::bodies::BodiesSpec::new),
        })
    }
}

/// Runs `scenario tokens`, printing what it does and finds.
#[must_use]
pub fn run(args: &TokensArgs) -> IdsExit {
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scenario tokens: {e}");
            return IdsExit::Usage;
        }
    };
    println!(
        "tokens: {} instance(s), {} one-time tokens, {} consumes of each at once{}",
        opts.urls.len(),
        opts.tokens,
        opts.consumers,
        if let (true, Some(fault)) = (opts.kill_every > 0, opts.db_fault) {
            format!(
                ", {} of the database every {} tokens",
                fault.kind().name(),
                opts.kill_every
            )
        } else if opts.kill_every > 0 {
            format!(", kill -9 and restart every {} tokens", opts.kill_every)
        } else {
            String::new()
        }
    );
    let run = match blackbox::tokens::run(&opts) {
        Ok(run) => run,
        Err(e) => return crate::tcc::not_run("tokens", &e),
    };
    println!(
        "  consumes: {} accepted over {} tokens ({} tokens accepted more than once), {} with an \
         unknown outcome, {} restarts",
        run.accepted(),
        run.rounds.len(),
        run.accepted_twice(),
        run.unknown(),
        run.restarts
    );
    let concurrency = run.concurrency();
    println!("{}", blackbox::overlap::line(&concurrency));
    if let Some(e) = &run.exhaustion {
        println!("  quota: {}", e.summary());
    }
    if let Some((slow, _)) = &run.slow {
        println!("{}", crate::ids::slow_line(slow));
    }
    if let Some(bodies) = &run.bodies {
        println!("  unauthenticated bodies: {}", bodies.answers_line());
    }
    for check in run.checks() {
        println!("{}", check_line(&check));
    }
    if let Some(path) = &args.json
        && let Err(e) = write_json(path, args, &run)
    {
        eprintln!("scenario tokens: {e}");
        return IdsExit::Usage;
    }
    let checks = run.checks();
    if checks
        .iter()
        .all(|c| c.verdict != reports::model::Judgement::Violated)
    {
        println!("{}", blackbox::overlap::pass_line(Some(&concurrency)));
        if let Some(why) = &concurrency.inconclusive {
            crate::note_verdict(format!("inconclusive for races: {why}"));
        }
        return IdsExit::Passed;
    }
    crate::tcc::verdict(&checks)
}

fn write_json(path: &std::path::Path, args: &TokensArgs, run: &TokensRun) -> Result<(), String> {
    let doc = serde_json::json!({
        "urls": args.urls,
        "tokens": run.rounds.len(),
        "consumers": args.consumers,
        "accepted": run.accepted(),
        "accepted_twice": run.accepted_twice(),
        "unknown": run.unknown(),
        "restarts": run.restarts,
        "neighbours": run.neighbours.iter().map(|(v, c)| serde_json::json!({ "token": v, "answer": format!("{c:?}") })).collect::<Vec<_>>(),
        "exhaustion": run.exhaustion,
        "slow_clients": run.slow.as_ref().map(|(s, _)| s),
        "unauthenticated_bodies": run.bodies,
        "concurrency": run.concurrency(),
        "invariants": run.checks(),
        "passed": run.passed(),
    });
    std::fs::write(path, format!("{doc:#}\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
