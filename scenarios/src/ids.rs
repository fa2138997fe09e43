//! `scenario ids`: test your own ID service, black box (docs/own-service.md). The options name
//! the kind of API, its URLs and key, the load, what the target promises, and optionally the
//! commands that start its servers and the faults to inject; [`load::blackbox`] runs it.

use std::path::PathBuf;
use std::time::Duration;

use blackbox::ids::{
    BlackBoxError, BlackBoxFault, BlackBoxNemesis, BlackBoxOptions, BlackBoxRun, CutShape,
    Monotonic, RampSpec, TARGET_KINDS, Target,
};
use blackbox::slow::SlowSpec;
use reports::model::Judgement;

/// The options of `scenario ids`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    scenario ids --target leaf --url http://127.0.0.1:8080 --key orders --monotonic server\n  \
    scenario ids --target tinyid --url http://127.0.0.1:9999 --key test --token T --batch 10\n  \
    scenario ids --target http --url 'http://127.0.0.1:8000/ids/{key}' --key orders \\\n      \
    --json-pointer /data/id\n  \
    scenario ids --target redis --url redis://127.0.0.1:6379/ --key ids --monotonic global\n  \
    scenario ids --target leaf --url http://127.0.0.1:8080 --key orders \\\n      \
    --server-cmd 'exec java -jar leaf-server.jar' --nemesis kill,pause --duration 60\n  \
    scenario ids --target leaf --url http://127.0.0.1:8080 --key orders --monotonic server \\\n      \
    --db-init 'mariadb-install-db --user=mysql --datadir={dbdata} --skip-test-db' \\\n      \
    --db-cmd 'exec mariadbd --no-defaults --user=mysql --datadir={dbdata} --port={dbport} \
    --bind-address=127.0.0.1 --socket={dbrun}/s --innodb-flush-method=fsync' \\\n      \
    --db-user mysql --db-url 'mysql://root@{db_addr}/bench' \\\n      \
    --server-cmd 'exec leaf-server --db {db_url} --port 8080' \\\n      \
    --nemesis db_kill,db_pause,db_power_loss,db_partition\n\n\
Exit status: 0 every check held, 1 a check was violated, 2 bad usage or the target could not \
be started or reached.")]
pub struct IdsArgs {
    /// The kind of ID API.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGET_KINDS))]
    pub target: String,
    /// A server's URL (repeat for several servers; requests are spread over them in turn).
    /// `http`: the request URL, `{key}` is replaced by the key; `leaf`, `tinyid`: the base URL;
    /// `redis`: redis://HOST:PORT/; `postgres`: postgres://USER@HOST:PORT/DATABASE.
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// The key: Leaf's biz tag, Tinyid's bizType, the Redis key, the PostgreSQL sequence.
    #[arg(long, default_value = "")]
    pub key: String,
    /// `tinyid`: the token parameter.
    #[arg(long, default_value = "")]
    pub token: String,
    /// `tinyid`: IDs per request (batchSize).
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// `leaf`: ask `/api/snowflake/get/{key}` instead of the segment route.
    #[arg(long)]
    pub leaf_snowflake: bool,
    /// `http`: where the ID is in a JSON answer (RFC 6901 pointer, e.g. /data/id); without it the
    /// body is the ID (or several, comma-separated).
    #[arg(long)]
    pub json_pointer: Option<String>,
    /// How long the clients run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Client threads, one request at a time each. Without it the bench ramps: 1, 2, 4, …
    /// clients in short steps until the rate stops growing (less than 10 % more) or the P99
    /// doubles, then runs --duration at the count chosen (at least two per server).
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Without --concurrency: the most clients the ramp tries (default 64).
    #[arg(long, conflicts_with = "concurrency")]
    pub ramp_max: Option<u64>,
    /// Without --concurrency: how long each ramp step lasts, ms (default 1000; its first fifth
    /// is not measured).
    #[arg(long, conflicts_with = "concurrency")]
    pub ramp_step_ms: Option<u64>,
    /// Total requests per second over every client (default: as fast as answered).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The order the target promises: `none` (only uniqueness is judged), `server` (each
    /// server's IDs increase: Leaf and Tinyid segments), `global` (one counter: Redis INCR,
    /// a PostgreSQL sequence without cache).
    #[arg(long, default_value = "none", value_parser = Monotonic::parse)]
    pub monotonic: Monotonic,
    /// The command that starts one server (run by `sh -c`; repeat, one per --url, in the same
    /// order). The bench then starts the servers, owns them and may kill, pause and clock-step
    /// them; it waits until the URL's port accepts connections. `{data}` is replaced by a fresh
    /// data directory of the run, `{server}` by the server's number (1, 2, …).
    #[arg(long = "server-cmd")]
    pub server_cmds: Vec<String>,
    /// Faults, comma-separated, taken in turn, one server at a time (names of the one fault
    /// vocabulary): kill (SIGKILL, then the same command again), pause (SIGSTOP/SIGCONT),
    /// clock_bump (older name: clock; a libfaketime step, back then forward), partition (the
    /// clients' link black-holed by a fault proxy), power_loss (every server killed and the
    /// writes under {data} they had not synced dropped). All but partition need --server-cmd;
    /// power_loss needs {data} in them. The database's (with --db-cmd): db_kill (SIGKILL, then
    /// --db-cmd again), db_pause (SIGSTOP/SIGCONT of every database process), db_power_loss
    /// (the database killed and the writes under {dbdata} it had not synced dropped), and
    /// db_partition (the servers' link to the database black-holed). Each fault's effect is
    /// checked (faults.took_effect): the port refused after a kill, every process stopped by a
    /// pause, bytes held back by a partition.
    #[arg(long, value_delimiter = ',', value_parser = BlackBoxFault::parse)]
    pub nemesis: Vec<BlackBoxFault>,
    /// Time between the end of one fault and the next, ms.
    #[arg(long, default_value_t = 2_000)]
    pub every_ms: u64,
    /// How long each fault lasts, ms.
    #[arg(long, default_value_t = 500)]
    pub down_ms: u64,
    /// The size of a clock step, ms.
    #[arg(long, default_value_t = 30_000)]
    pub clock_step_ms: i64,
    /// How partition and db_partition cut their link: `both` (nothing gets through), `one-way`
    /// (requests dropped: clients to server, servers to database; answers would still come
    /// back) or `flap` (cut and whole in turn every --flap-ms while the fault lasts); through
    /// the proxy or, with --netns, as nftables rules.
    #[arg(long, default_value = "both", value_parser = ["both", "one-way", "flap"])]
    pub cut: String,
    /// With --cut flap: how long each state holds, ms.
    #[arg(long, default_value_t = 100)]
    pub flap_ms: u64,
    /// Every server (and the database) in a network namespace of its own with its own address,
    /// made and removed by the bench (veth pairs on a bridge; needs root, `ip` and `nft`):
    /// `{ip}` in each --url and --server-cmd is its server's address, `{dbhost}` in --db-cmd
    /// the database's. `partition` and `db_partition` are then nftables rules that drop the
    /// packets, as Jepsen's iptables do, and reach a server that talks to its database
    /// directly (no proxy: `{db_addr}` is the database's own address).
    #[arg(long)]
    pub netns: bool,
    #[command(flatten)]
    pub db: DbArgs,
    /// With --db-cmd: the servers' link to the database slowed in bursts for the whole run
    /// (500 ms slowed, 500 ms whole, in turn), each chunk held this many ms ± half, so that a
    /// service's read-then-write windows open at any client count. Checked: faults.db_delayed.
    #[arg(long, requires = "db_cmd")]
    pub delay_db_ms: Option<u64>,
    #[command(flatten)]
    pub slow: SlowArgs,
    #[command(flatten)]
    pub power: PowerArgs,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the clients' history as Jepsen's EDN (one `:generate` op per ID).
    #[arg(long)]
    pub history_edn: Option<PathBuf>,
    /// Write a self-contained HTML report (latency over time and percentiles, the faults on
    /// each server's lane, the checks), `summary.json` and `junit.xml` into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Writes a summary as the HTML report, `summary.json` and `junit.xml` into a folder.
pub type ReportWriter<'a> =
    &'a dyn Fn(&std::path::Path, &reports::model::Summary) -> Result<(), String>;

/// What `scenario ids` exits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdsExit {
    /// Every check held.
    Passed,
    /// A check was violated.
    Violated,
    /// Bad usage, or the target could not be started or reached.
    Usage,
}

impl IdsArgs {
    /// The run these options ask for.
    ///
    /// # Errors
    /// A message naming the option that is wrong.
    pub fn options(&self) -> Result<BlackBoxOptions, String> {
        let target = match self.target.as_str() {
            "http" => Target::Http {
                pointer: self.json_pointer.clone(),
            },
            "leaf" => Target::Leaf {
                snowflake: self.leaf_snowflake,
            },
            "tinyid" => Target::Tinyid {
                token: self.token.clone(),
                batch: self.batch,
            },
            "redis" => Target::Redis,
            "postgres" => Target::Postgres,
            other => return Err(format!("--target {other}: not a kind")),
        };
        if self.key.is_empty() && self.target != "http" {
            return Err(format!("--target {}: give the --key", self.target));
        }
        if self.json_pointer.is_some() && self.target != "http" {
            return Err("--json-pointer applies to --target http only".into());
        }
        if !(self.duration.is_finite() && self.duration >= 1.0) {
            return Err(format!(
                "--duration must be at least 1 second, not {}",
                self.duration
            ));
        }
        let cut = CutShape::parse(&self.cut, self.flap_ms)?;
        let nemesis = (!self.nemesis.is_empty()).then(|| BlackBoxNemesis {
            faults: self.nemesis.clone(),
            every: Duration::from_millis(self.every_ms),
            down_for: Duration::from_millis(self.down_ms),
            clock_step_ms: self.clock_step_ms,
            cut,
        });
        Ok(BlackBoxOptions {
            target,
            urls: self.urls.clone(),
            key: self.key.clone(),
            clients: self.concurrency.unwrap_or(1),
            ramp: self.concurrency.is_none().then(|| RampSpec {
                max: self.ramp_max.unwrap_or(RampSpec::MAX),
                step: self
                    .ramp_step_ms
                    .map_or(RampSpec::STEP, Duration::from_millis),
            }),
            rate: self.rate,
            duration: Duration::from_secs_f64(self.duration),
            monotonic: self.monotonic,
            commands: self.server_cmds.clone(),
            nemesis,
            slow_clients: self.slow.spec(),
            db: self.db.options(),
            db_delay: self.delay_db_ms.map(Duration::from_millis),
            netns: self.netns,
        })
    }

    /// Refuses the checks of what a short run hides where they cannot be made.
    ///
    /// # Errors
    /// A message naming the option.
    pub fn check_power(&self) -> Result<(), String> {
        if self.power.overload.is_some() {
            if !matches!(self.target.as_str(), "http" | "leaf" | "tinyid") {
                return Err(format!(
                    "--overload measures an HTTP service, not --target {}",
                    self.target
                ));
            }
            if self.db.db_cmd.is_some() || self.netns {
                return Err(
                    "--overload starts the first server again on its own, which --db-cmd and \
                     --netns do not allow yet: run it against a service you started"
                        .into(),
                );
            }
        }
        if self.power.gaps_max.is_some() && !self.nemesis.is_empty() {
            return Err(
                "--gaps-max judges a run within one incarnation with no fault: a kill, a power \
                 loss or an expired lease leaves gaps by design; drop --nemesis"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The checks of what a short run hides, made after `run`: the capacity check (on a fresh start
/// of the first server when the bench started the servers) and `ids.gaps`. What the overload
/// measured is printed.
///
/// # Errors
/// The check could not be made (a server that does not start again, no answer before the
/// overload): not a verdict.
pub fn power_checks(
    args: &IdsArgs,
    opts: &BlackBoxOptions,
    run: &BlackBoxRun,
) -> Result<Vec<reports::model::InvariantResult>, String> {
    let mut checks = Vec::new();
    if let Some(gaps_max) = args.power.gaps_max {
        checks.push(crate::power::gaps_check(
            &run.history.ok_values("generate"),
            gaps_max,
        ));
    }
    let first = opts.target.request_url(&opts.urls[0], &opts.key);
    if let Some(overload) = args.power.overload_options(&first)? {
        let _fresh = match args.server_cmds.first() {
            Some(cmd) => Some(crate::power::Fresh::start(cmd, &first)?),
            None => None,
        };
        let measured = crate::overload::run(&overload).map_err(|e| e.to_string())?;
        println!("{}", overload_line(&measured));
        checks.push(measured.check());
    }
    Ok(checks)
}

/// What the capacity check measured, in one line.
#[must_use]
pub fn overload_line(o: &crate::overload::OverloadRun) -> String {
    let after: Vec<String> = o
        .rates_after_per_s
        .iter()
        .map(|r| format!("{r:.0}"))
        .collect();
    format!(
        "  overload: {:.0} answers/s before, {}/s after (ratio {:.3}); {}; {}",
        o.rate_before_per_s,
        after.join(", "),
        o.ratio(),
        o.served_line(),
        o.overload_line()
    )
}

/// The user's database under faults, for `scenario ids`, `tcc` and `tokens`.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// The command that runs the user's database in the foreground (run by `sh -c`, again after
    /// every db_kill and db_power_loss): `{dbdata}` is a fresh data directory (on the
    /// lost-writes filesystem when the nemesis has db_power_loss), `{dbrun}` a directory for its
    /// sockets and pid files (not on that filesystem), `{dbport}` the port it must listen on
    /// and `{dbhost}` the address (127.0.0.1; its namespace's own with --netns). A fault proxy stands in front of it: each --server-cmd gets
    /// `{db_url}` (--db-url through the proxy), `{db_addr}` (127.0.0.1:PORT of the proxy) and
    /// `{db_port}`. MariaDB, PostgreSQL, Redis, anything that listens on TCP.
    #[arg(long)]
    pub db_cmd: Option<String>,
    /// With --db-cmd: a command run once, to completion, before the database first starts
    /// (`mariadb-install-db`, `initdb`), with the same `{dbdata}`, `{dbrun}` and `{dbport}`.
    #[arg(long, requires = "db_cmd")]
    pub db_init: Option<String>,
    /// With --db-cmd: a command that succeeds once the database answers queries, run after
    /// every start until it does (`pg_isready -h 127.0.0.1 -p {dbport}`; PostgreSQL accepts
    /// connections while it recovers and refuses queries meanwhile). Without it the database
    /// is ready when its port accepts.
    #[arg(long, requires = "db_cmd")]
    pub db_ready: Option<String>,
    /// With --db-cmd: what `{db_url}` is, with `{db_addr}` and `{db_port}` (the proxy's) in it,
    /// e.g. `mysql://root@{db_addr}/bench` or `postgres://postgres@{db_addr}/postgres`
    /// (default: `{db_addr}`).
    #[arg(long, requires = "db_cmd", default_value = "")]
    pub db_url: String,
    /// With --db-cmd: hand `{dbdata}` to this user before the database starts (a MariaDB or
    /// PostgreSQL that will not run as root and drops to `mysql` or `postgres`).
    #[arg(long, requires = "db_cmd")]
    pub db_user: Option<String>,
}

impl DbArgs {
    /// The database these options ask for (`None`: no --db-cmd); the runner checks them with
    /// the run's faults.
    #[must_use]
    pub fn options(&self) -> Option<blackbox::db::DbOptions> {
        self.db_cmd.as_ref().map(|command| blackbox::db::DbOptions {
            command: command.clone(),
            init: self.db_init.clone(),
            ready: self.db_ready.clone(),
            url: self.db_url.clone(),
            user: self.db_user.clone(),
        })
    }
}

/// The slow-clients check of `scenario ids`, `tcc` and `tokens`.
#[derive(Debug, Clone, clap::Args)]
pub struct SlowArgs {
    /// After the run, the slow-clients check: N connections that send part of a request and
    /// then nothing, opened against the first server; its answer rate with them open must stay
    /// at least half its rate without (`service.slow_clients`), and it must close each within
    /// --stall-timeout-s (`service.stalled_closed`). Plain HTTP.
    #[arg(long)]
    pub slow_clients: Option<usize>,
    /// With --slow-clients: how long the service may keep a stalled connection open, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub stall_timeout_s: f64,
    /// With --slow-clients: the path the connections that stall in a body POST to (a route of
    /// the service whose handler reads a body; default: the path of the measured request).
    #[arg(long)]
    pub stall_path: Option<String>,
    /// After the run, the held-connections check: N keep-alive connections from many source
    /// addresses (127.0.0.2 on, 256 each, on a loopback URL), each sending the measured request
    /// every 8 s; a new client's answer rate while they are held must stay at least half its
    /// rate without (`service.new_client_when_full`; not checked when the service held them
    /// all). Plain HTTP.
    #[arg(long, value_name = "N")]
    pub held_clients: Option<usize>,
}

/// The checks of what a short, gentle run hides (`--overload`, `--gaps-max`), for `scenario
/// ids`.
#[derive(Debug, Clone, clap::Args)]
pub struct PowerArgs {
    /// After the run, the capacity check: the answer rate of the first server is measured, N
    /// clients then overload it for --overload-s, each giving up after --overload-timeout-ms
    /// and resetting its connection, and its rate after must come back to at least
    /// --overload-ratio-min of the rate before (`service.capacity_after_overload`). With
    /// --server-cmd, on a fresh start of the first server. Plain HTTP targets (http, leaf,
    /// tinyid).
    #[arg(long, value_name = "N")]
    pub overload: Option<usize>,
    /// With --overload: how long an overload client waits for its answer, ms.
    #[arg(long, default_value_t = 20)]
    pub overload_timeout_ms: u64,
    /// With --overload: how long the overload lasts, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub overload_s: f64,
    /// With --overload: the least rate after, as a share of the rate before (lower it on a
    /// machine whose load changes while the check runs: lost capacity reads near 0).
    #[arg(long, default_value_t = 0.9, value_name = "RATIO")]
    pub overload_ratio_min: f64,
    /// Judge gaps (`ids.gaps`): at most N IDs never handed out between the smallest and the
    /// largest received, the bound your service promises within one incarnation (0: none, as a
    /// segment service with one server and no restart). Only in a run without --nemesis.
    #[arg(long, value_name = "N")]
    pub gaps_max: Option<u64>,
}

impl PowerArgs {
    /// The overload check of these options against `url` (a server's request URL), or `None`
    /// without --overload.
    ///
    /// # Errors
    /// A URL that does not parse, or bad overload options.
    pub fn overload_options(
        &self,
        url: &str,
    ) -> Result<Option<crate::overload::OverloadOptions>, String> {
        let Some(clients) = self.overload else {
            return Ok(None);
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
        let path = match parsed.query() {
            Some(q) => format!("{}?{q}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        if !self.overload_s.is_finite() || self.overload_s <= 0.0 {
            return Err(format!(
                "--overload-s {}: give more than 0 seconds",
                self.overload_s
            ));
        }
        let opts = crate::overload::OverloadOptions {
            client_timeout: Duration::from_millis(self.overload_timeout_ms),
            ratio_min: self.overload_ratio_min,
            overload_for: Duration::from_secs_f64(self.overload_s.min(600.0)),
            ..crate::overload::OverloadOptions::new(
                &parsed.origin().ascii_serialization(),
                &path,
                clients,
            )
        };
        opts.validate()?;
        Ok(Some(opts))
    }
}

impl SlowArgs {
    /// The check these options ask for (`None`: no --slow-clients).
    #[must_use]
    pub fn spec(&self) -> Option<SlowSpec> {
        if self.slow_clients.is_none() && self.held_clients.is_none() {
            return None;
        }
        Some(SlowSpec {
            stalled: self.slow_clients.unwrap_or(0),
            held: self.held_clients.unwrap_or(0),
            closed_within: Duration::from_secs_f64(self.stall_timeout_s.max(0.1)),
            stall_path: self.stall_path.clone(),
        })
    }
}

/// Runs `scenario ids`, printing what it does and finds; `--report` goes through
/// `write_report`.
#[must_use]
pub fn run(args: &IdsArgs, write_report: ReportWriter<'_>) -> IdsExit {
    let opts = match args
        .options()
        .and_then(|o| args.check_power().map(|()| o))
        .and_then(|o| {
            args.power
                .overload_options(&o.target.request_url(&o.urls[0], &o.key))
                .map(|_| o)
        }) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scenario ids: {e}");
            return IdsExit::Usage;
        }
    };
    let clients = match opts.ramp {
        Some(r) => format!(
            "clients ramped 1, 2, 4, … up to {} in {} ms steps, then the count chosen",
            r.max,
            r.step.as_millis()
        ),
        None if opts.clients == 1 => "1 client".to_owned(),
        None => format!("{} clients", opts.clients),
    };
    println!(
        "ids: {} at {} server(s), key `{}`, {clients} for {:.1} s{}{}",
        opts.target.kind(),
        opts.urls.len(),
        opts.key,
        opts.duration.as_secs_f64(),
        opts.rate.map(|r| format!(" at {r}/s")).unwrap_or_default(),
        opts.nemesis
            .as_ref()
            .map(|n| format!(
                ", nemesis {} every {} ms for {} ms",
                n.faults
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(","),
                n.every.as_millis(),
                n.down_for.as_millis()
            ))
            .unwrap_or_default()
    );
    let run = match blackbox::ids::run(&opts) {
        Ok(run) => run,
        Err(e) => {
            let hint = match &e {
                BlackBoxError::Unreachable { .. } => unreachable_hint(&opts.target, &opts.key),
                _ => String::new(),
            };
            eprintln!("scenario ids: {e}{hint}");
            return IdsExit::Usage;
        }
    };
    print_run(&run);
    let power = match power_checks(args, &opts, &run) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("scenario ids: {e}");
            return IdsExit::Usage;
        }
    };
    for check in &power {
        println!("{}", check_line(check));
    }
    if let Err(e) = write_outputs(args, &run, &power) {
        eprintln!("scenario ids: {e}");
        return IdsExit::Usage;
    }
    if let Some(dir) = &args.report {
        let mut report = run.load_report(&opts);
        report.verification.extend(power.iter().cloned());
        let summary =
            reports::model::Summary::new(format!("scenario ids --target {}", args.target))
                .with(report);
        if let Err(e) = write_report(dir, &summary) {
            eprintln!("scenario ids: cannot write the report: {e}");
            return IdsExit::Usage;
        }
        println!("  report: {}", dir.join("index.html").display());
    }
    let power_violated = power.iter().any(|c| c.verdict == Judgement::Violated);
    if run.passed() && !power_violated {
        println!("{}", blackbox::overlap::pass_line(Some(&run.concurrency)));
        if let Some(why) = &run.concurrency.inconclusive {
            crate::note_verdict(format!("inconclusive for races: {why}"));
        }
        IdsExit::Passed
    } else {
        let violated: Vec<&str> = run
            .checks()
            .into_iter()
            .chain(&power)
            .filter(|c| c.verdict == Judgement::Violated)
            .map(|c| c.name.as_str())
            .collect();
        println!("violated: {}", violated.join(", "));
        IdsExit::Violated
    }
}

/// Prints what a run did and found, as `scenario ids` does.
pub fn print_run(run: &BlackBoxRun) {
    let c = run.history.completions();
    let e = &run.errors;
    println!(
        "  requests: {} IDs in {} ok answers; {} failed (refused {}, error answers {}), {} unknown \
         outcome (timeouts {}, broken {})",
        run.ids,
        c.ok,
        e.refused + e.answered,
        e.refused,
        e.answered,
        e.timeout + e.unknown,
        e.timeout,
        e.unknown
    );
    for example in &run.error_examples {
        println!("    first {example}");
    }
    if let Some(ramp) = &run.ramp {
        println!("{}", blackbox::ramp::line(ramp));
    }
    let l = &run.latency;
    println!(
        "  latency: P50 {} µs, P99 {} µs, P99.9 {} µs, max {} µs ({} requests, {:.0}/s)",
        l.corrected.p50_us,
        l.corrected.p99_us,
        l.corrected.p999_us,
        l.corrected.max_us,
        l.requests,
        l.throughput_rps
    );
    println!("{}", blackbox::overlap::line(&run.concurrency));
    println!(
        "  gaps: {} IDs never handed out between the smallest and the largest",
        run.gaps
    );
    if run.faults > 0 {
        let mut by_kind: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        for w in &run.fault_windows {
            *by_kind
                .entry(w.kind.as_deref().unwrap_or("fault"))
                .or_default() += 1;
        }
        let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!("  faults: {} ({})", run.faults, kinds.join(", "));
    }
    if let Some(l) = &run.lost_writes {
        println!("{}", lost_writes_line(l));
    }
    if let Some(p) = &run.proxy {
        println!(
            "  proxies: {} connections, {} bytes held by the partitions",
            p.connections, p.held_bytes
        );
    }
    if let Some(dropped) = run.dropped_packets {
        println!("  ip-level cuts: {dropped} packets dropped by the nftables rules");
    }
    if let Some(p) = &run.db_proxy {
        println!(
            "  database link: {} connections, {} bytes to the database, {} back, {} held by \
             the partitions, {} chunks delayed",
            p.connections, p.bytes_up, p.bytes_down, p.held_bytes, p.delayed_chunks
        );
    }
    if let Some(l) = &run.db_lost_writes {
        println!("{} (under {{dbdata}})", lost_writes_line(l));
    }
    if let Some((slow, _)) = &run.slow {
        println!("{}", slow_line(slow));
    }
    for check in run.checks() {
        println!("{}", check_line(check));
    }
}

/// What the slow-clients and held-connections checks measured, a line each.
#[must_use]
pub fn slow_line(slow: &blackbox::slow::SlowRun) -> String {
    let held = slow.held.as_ref().map(|h| {
        format!(
            "  held connections: a new client got {:.0} answers/s before, {:.0}/s with {} \
             keep-alive connections held ({} open at most, from {} addresses; {} refused or \
             closed by the service), {:.0}/s after (ratio {:.3})",
            h.rate_before_per_s,
            h.rate_during_per_s,
            h.asked,
            h.connected_max,
            h.sources.max(1),
            h.closed_by_service,
            h.rate_after_per_s,
            h.ratio()
        )
    });
    if !slow.stalled_checked {
        return held.unwrap_or_default();
    }
    let stalled = format!(
        "  slow clients: {:.0} answers/s before, {:.0}/s with {} stalled connections open, \
         {:.0}/s after (ratio {:.3}); {}",
        slow.rate_before_per_s,
        slow.rate_during_per_s,
        slow.opened,
        slow.rate_after_per_s,
        slow.ratio(),
        slow.longest_open_ms().map_or_else(
            || "some never closed".to_owned(),
            |ms| format!("the last closed after {ms} ms")
        )
    );
    match held {
        Some(held) => format!("{stalled}\n{held}"),
        None => stalled,
    }
}

/// One check's line in a run's printout: name, verdict, first offending event, detail.
#[must_use]
pub fn check_line(check: &reports::model::InvariantResult) -> String {
    let verdict = match check.verdict {
        Judgement::Violated => "VIOLATED",
        Judgement::Held => "held",
        Judgement::NotChecked => "NOT CHECKED",
    };
    format!(
        "  {:<28} {verdict:<9} {}{}",
        check.name,
        check
            .first_offending_event
            .as_deref()
            .map(|f| format!("{f}; "))
            .unwrap_or_default(),
        check.detail.as_deref().unwrap_or_default()
    )
}

/// What the lost-writes filesystem did, as a printout line.
#[must_use]
pub fn lost_writes_line(l: &chaos::LostFsEffects) -> String {
    format!(
        "  lost writes: {} bytes dropped by {} power losses ({} files), {} bytes synced",
        l.lost_bytes, l.power_losses, l.files_lost_data, l.synced_bytes
    )
}

fn write_outputs(
    args: &IdsArgs,
    run: &BlackBoxRun,
    power: &[reports::model::InvariantResult],
) -> Result<(), String> {
    if let Some(path) = &args.history_edn {
        std::fs::write(path, run.history.to_edn())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "  history: {} ({} records, EDN)",
            path.display(),
            run.history.ops.len()
        );
    }
    if let Some(path) = &args.json {
        let c = run.history.completions();
        let doc = serde_json::json!({
            "target": args.target,
            "urls": args.urls,
            "key": args.key,
            "ids": run.ids,
            "gaps": run.gaps,
            "requests": {"ok": c.ok, "fail": c.fail, "info": c.info},
            "errors": run.errors,
            "faults": run.faults,
            "clients": run.clients,
            "ramp": run.ramp,
            "concurrency": run.concurrency,
            "inconclusive_for_races": run.concurrency.inconclusive.is_some(),
            "invariants": run.checks().into_iter().chain(power).collect::<Vec<_>>(),
            "passed": run.passed() && power.iter().all(|c| c.verdict != Judgement::Violated),
        });
        std::fs::write(path, format!("{doc:#}\n"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// What most likely fixes a target that answered nothing usable, naming the flag.
fn unreachable_hint(target: &blackbox::ids::Target, key: &str) -> String {
    use blackbox::ids::Target;
    let specific = match target {
        Target::Tinyid { token, .. } if token.is_empty() => {
            "; Tinyid answers an empty body to a missing or wrong token: give --token with one of \
             its `tinyid_token` rows (none was given)"
        }
        Target::Tinyid { .. } => {
            "; Tinyid answers an empty body to a wrong token or an unknown bizType: check --token \
             against its `tinyid_token` rows and --key against its `tiny_id_info` rows"
        }
        Target::Http { pointer: None } => {
            "; a JSON answer needs --json-pointer to the ID (e.g. /data/id); a plain one is the ID \
             itself"
        }
        Target::Http { pointer: Some(_) } => {
            "; check that --json-pointer points at the ID in its answer"
        }
        Target::Leaf { .. } => "; Leaf needs the key as a `biz_tag` row of `leaf_alloc`",
        Target::Redis | Target::Postgres => "; check the URL's host, port and database",
    };
    format!(" (is it running, is the key `{key}` known{specific})")
}
