//! Contention mode for the deployments (`scenario cluster_pg --contention`, and the same for
//! `cluster_mariadb` and a deployment on SQLite files; a row of `scenario flaws --process`):
//! N ID servers on one database, segments of a few IDs and many clients, so that every
//! request reloads a segment and the servers race on the tag's row.
//!
//! The default deployments take segments of 2,000 IDs (doubling with Leaf's dynamic step) for a
//! handful of clients: a server reloads a few times a run, almost never at the same moment as
//! another, and an allocation that is not isolated (its read and its write in two
//! transactions, no version compare) passes them all. Here the tag's step is `step` (1–10, the
//! dynamic step capped at it), and `clients` clients spread their requests over the servers in
//! turn: reloads overlap all the time, and an isolation anomaly shows as an ID handed out
//! twice (`ids.unique`, as `scenario ids` judges it; each server's IDs must also rise,
//! `ids.monotonic`).

use std::path::Path;
use std::time::Duration;

use blackbox::ids::{BlackBoxOptions, BlackBoxRun, Monotonic, Target};
use reports::model::{InvariantResult, Judgement};

/// The tag's step (and the dynamic step's cap) of a contention run: every request reloads.
pub const CONTENTION_STEP: u64 = 1;
/// Clients of a contention run unless told otherwise.
pub const CONTENTION_CLIENTS: u64 = 32;
/// The tag the clients ask for.
pub const TAG: &str = "orders";

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentionOptions {
    /// PostgreSQL, MariaDB or an SQLite file.
    pub backend: chaos::Backend,
    /// ID servers on the database.
    pub id_servers: usize,
    /// The tag's step; with `step_max`, the dynamic step's cap.
    pub step: u64,
    /// Cap the dynamic step at `step` (contention); `false`: Leaf's doubling, as the default
    /// deployments run.
    pub step_max: bool,
    /// Clients, one request at a time each.
    pub clients: u64,
    /// How long they run.
    pub duration: Duration,
    /// More flags for every server (`--weakness W`, `--flaw F`).
    pub server_flags: String,
    /// Half the clients ask for batches (`GET /id/{tag}/batch?n=7`), so that batches cross
    /// block boundaries; `paths.reached` then requires that some did.
    pub batches: bool,
}

impl ContentionOptions {
    /// Contention on `backend`: 3 ID servers, step [`CONTENTION_STEP`], [`CONTENTION_CLIENTS`]
    /// clients for 5 s.
    #[must_use]
    pub fn new(backend: chaos::Backend) -> Self {
        Self {
            backend,
            id_servers: 3,
            step: CONTENTION_STEP,
            step_max: true,
            clients: CONTENTION_CLIENTS,
            duration: Duration::from_secs(5),
            server_flags: String::new(),
            batches: true,
        }
    }

    /// Whether the options make a run: a message naming what is wrong otherwise.
    ///
    /// # Errors
    /// No server or too many, a step of 0, no client.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=load::cluster::ID_SERVERS_MAX).contains(&self.id_servers) {
            return Err(format!(
                "id_servers {}: give 1 to {}",
                self.id_servers,
                load::cluster::ID_SERVERS_MAX
            ));
        }
        if self.step == 0 {
            return Err("the step must be at least 1".into());
        }
        if !(1..=1_000).contains(&self.clients) {
            return Err(format!("--users {}: give 1 to 1000", self.clients));
        }
        Ok(())
    }

    /// What is run, in one line.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{} ID server(s) on {}, segments of {} ID(s){}, {} clients for {:.0} s{}",
            self.id_servers,
            backend_name(self.backend),
            self.step,
            if self.step_max {
                " (dynamic step capped)"
            } else {
                " (Leaf's doubling)"
            },
            self.clients,
            self.duration.as_secs_f64(),
            if self.server_flags.is_empty() {
                String::new()
            } else {
                format!(", servers with `{}`", self.server_flags.trim())
            }
        )
    }
}

/// The database's name for messages.
#[must_use]
pub const fn backend_name(backend: chaos::Backend) -> &'static str {
    match backend {
        chaos::Backend::Postgres => "PostgreSQL (fsync on)",
        chaos::Backend::MariaDb => "MariaDB (every commit synced)",
        chaos::Backend::Sqlite => "one SQLite file",
    }
}

/// The database of a run, kept until the run is over.
enum Database {
    Server(Box<chaos::DbServer>),
    File(tempfile::TempDir),
}

/// `paths.reached`
pub const PATHS_REACHED: &str = "paths.reached";
/// `ids.unique` over the singles and the batches together.
pub const UNIQUE_ACROSS: &str = "ids.unique[singles+batches]";
/// The paths of `sut-server`'s segment front a contention run must reach (`GET /metrics`,
/// `sut_id_paths_total`): blocks published, takes whose value lay past the block another
/// thread had just published (blocks smaller than the takes racing for them: the default
/// deployments' blocks of thousands never are), and (when it asks for batches) batches that go
/// on in another block.
pub const PATHS_REQUIRED: [&str; 3] = ["block_refill", "take_past_block", "batch_across_blocks"];

/// What a contention run found.
#[derive(Debug)]
pub struct ContentionRun {
    /// The clients asking for one ID at a time (`GET /id/{tag}`).
    pub singles: BlackBoxRun,
    /// The clients asking for batches (`GET /id/{tag}/batch?n=`), when any.
    pub batches: Option<BatchRun>,
    /// Each path of the servers' fronts, with how often the servers took it (summed).
    pub paths: Vec<(String, u64)>,
    /// The checks over both: IDs unique across singles and batches, the paths reached.
    pub checks: Vec<InvariantResult>,
}

impl ContentionRun {
    /// Every check: the singles', and those over singles and batches.
    #[must_use]
    pub fn all_checks(&self) -> Vec<&InvariantResult> {
        let mut all = self.singles.checks();
        all.extend(&self.checks);
        all
    }

    /// Whether no check was violated.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.all_checks()
            .iter()
            .all(|c| c.verdict != Judgement::Violated)
    }

    /// IDs handed out, singles and batches.
    #[must_use]
    pub fn ids(&self) -> u64 {
        self.singles.ids + self.batches.as_ref().map_or(0, |b| b.ids.len() as u64)
    }
}

/// `ids.unique` over the IDs of both runs: an ID a batch and a single request both got.
#[must_use]
pub fn unique_across(singles: &[i64], batches: &[i64]) -> InvariantResult {
    let mut seen = std::collections::HashSet::with_capacity(singles.len());
    let mut repeated = None;
    let mut repeats = 0u64;
    for id in singles.iter().chain(batches) {
        if !seen.insert(*id) {
            repeats += 1;
            repeated.get_or_insert(*id);
        }
    }
    InvariantResult {
        name: UNIQUE_ACROSS.into(),
        verdict: if repeats == 0 {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: repeated.map(|id| {
            format!("ID {id} handed out twice over single and batch requests ({repeats} repeats)")
        }),
        detail: Some(format!(
            "{} IDs from single requests and {} from batches, {} distinct",
            singles.len(),
            batches.len(),
            seen.len()
        )),
    }
}

/// `paths.reached`: each required path taken at least once; a path never taken means the run
/// proved nothing about it, and the run says so (violated, naming it) rather than pass.
#[must_use]
pub fn paths_check(paths: &[(String, u64)], required: &[&str]) -> InvariantResult {
    let count = |name: &str| paths.iter().find(|(p, _)| p == name).map_or(0, |(_, n)| *n);
    let missing: Vec<&str> = required.iter().copied().filter(|p| count(p) == 0).collect();
    let all: Vec<String> = paths.iter().map(|(p, n)| format!("{p} {n}")).collect();
    InvariantResult {
        name: PATHS_REACHED.into(),
        verdict: if missing.is_empty() {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: (!missing.is_empty()).then(|| {
            format!(
                "never reached: {} (the run proved nothing about them)",
                missing.join(", ")
            )
        }),
        detail: Some(if all.is_empty() {
            "no path counted (the servers' /metrics had no sut_id_paths_total)".to_owned()
        } else {
            format!("reached: {}", all.join(", "))
        }),
    }
}

/// The `sut_id_paths_total` lines of one `/metrics` page, by path (tags summed).
#[must_use]
pub fn paths_of_metrics(page: &str) -> Vec<(String, u64)> {
    let mut paths: Vec<(String, u64)> = Vec::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("sut_id_paths_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(path) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("path=\""))
            .and_then(|p| p.strip_suffix('"'))
        else {
            continue;
        };
        let n: u64 = value.trim().parse().unwrap_or(0);
        match paths.iter_mut().find(|(p, _)| p == path) {
            Some((_, total)) => *total += n,
            None => paths.push((path.to_owned(), n)),
        }
    }
    paths
}

/// Batches of a contention run ask for this many IDs.
pub const BATCH_N: u64 = 7;
/// The batch clients start this long after the single ones.
const BATCHES_AFTER: Duration = Duration::from_millis(300);

/// Runs it: starts the database and the servers (`server_bin --role id`), runs the clients
/// (half of them asking for batches of [`BATCH_N`] when `opts.batches`), reads the paths the
/// servers took, judges the IDs, stops everything.
///
/// # Errors
/// Bad options, the database or a server did not start, a server gave no ID before the run.
pub fn run(opts: &ContentionOptions, server_bin: &Path) -> Result<ContentionRun, String> {
    opts.validate()?;
    chaos::clean_up_on_interrupt().map_err(|e| e.to_string())?;
    let database = match opts.backend {
        chaos::Backend::Postgres => Database::Server(Box::new(
            chaos::DbServer::postgres(false).map_err(|e| format!("PostgreSQL: {e}"))?,
        )),
        chaos::Backend::MariaDb => Database::Server(Box::new(
            chaos::DbServer::mariadb(false).map_err(|e| format!("MariaDB: {e}"))?,
        )),
        chaos::Backend::Sqlite => Database::File(
            tempfile::Builder::new()
                .prefix("bench-contention-")
                .tempdir()
                .map_err(|e| format!("a directory for the SQLite file: {e}"))?,
        ),
    };
    let (url, logs) = match &database {
        Database::Server(server) => {
            server
                .create_database("ids")
                .map_err(|e| format!("create the ids database: {e}"))?;
            (server.url_for("ids"), None)
        }
        Database::File(dir) => (
            format!("sqlite:{}", dir.path().join("ids.db").display()),
            Some(dir.path().to_owned()),
        ),
    };
    let logs = match logs {
        Some(dir) => (dir, None),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("bench-contention-")
                .tempdir()
                .map_err(|e| format!("a directory for the logs: {e}"))?;
            (dir.path().to_owned(), Some(dir))
        }
    };
    let step_max = if opts.step_max {
        format!(" --step-max {}", opts.step)
    } else {
        String::new()
    };
    let mut servers = Vec::new();
    let mut bases = Vec::new();
    for i in 0..opts.id_servers {
        let port = chaos::free_port().map_err(|e| e.to_string())?;
        bases.push(format!("http://127.0.0.1:{port}"));
        let command = format!(
            "exec env SUT_ADMIN_TOKEN={} {} --role id --db '{url}' --listen 127.0.0.1:{port} \
             --tag {TAG}:{}{step_max} {}",
            load::target::bench_admin_token(),
            server_bin.display(),
            opts.step,
            opts.server_flags
        );
        servers.push(
            chaos::CommandService::start(chaos::CommandSpec {
                name: format!("id-{}", i + 1),
                command,
                port,
                env: Vec::new(),
                log: logs.0.join(format!("id-{}.log", i + 1)),
                netns: None,
            })
            .map_err(|e| format!("id-{}: {e}", i + 1))?,
        );
    }
    // One server after another takes its first segment (and, with batches, its first batch),
    // as servers started one after another do: what races is the run, not the start-up.
    for (base, server) in bases.iter().zip(&servers) {
        warm_up(base, &format!("/id/{TAG}")).map_err(|e| {
            let log = std::fs::read_to_string(server.log()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            format!(
                "{e}; the end of its log: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        })?;
        if opts.batches {
            // Best effort: a batch of segments of 1 ID takes a grant per ID, which a slow
            // database may not give in time; the batch clients count what they are refused.
            let _ = warm_up(base, &format!("/id/{TAG}/batch?n={BATCH_N}"));
        }
    }
    // Their prefetches of the next segment, made by their upkeep (every 200 ms), land too.
    std::thread::sleep(Duration::from_millis(500));
    let urls: Vec<String> = bases.iter().map(|b| format!("{b}/id/{{key}}")).collect();
    let clients = |n: u64| blackbox_options(urls.clone(), n, opts.duration);
    let (single_clients, batch_clients) = if opts.batches && opts.clients > 1 {
        (opts.clients - opts.clients / 2, opts.clients / 2)
    } else {
        (opts.clients, 0)
    };
    let batches = (batch_clients > 0).then(|| {
        let (bases, duration) = (bases.clone(), opts.duration);
        std::thread::spawn(move || {
            // After the single clients' first request to each server (what `scenario ids` asks
            // before its run, and refuses to start without).
            std::thread::sleep(BATCHES_AFTER);
            batch_clients_run(
                &bases,
                batch_clients,
                duration.saturating_sub(BATCHES_AFTER),
            )
        })
    });
    let singles = blackbox::ids::run(&clients(single_clients)).map_err(|e| e.to_string());
    let batches = batches
        .map(|t| {
            t.join()
                .map_err(|_| "the batch clients panicked".to_owned())
        })
        .transpose()?
        .transpose();
    let paths = read_paths(&bases);
    drop(servers);
    drop(database);
    drop(logs);
    let (singles, batches) = (singles?, batches?);
    let mut checks = Vec::new();
    if let Some(b) = &batches {
        checks.push(unique_across(
            &singles.history.ok_values("generate"),
            &b.ids,
        ));
    }
    // A run without batches does not mean to reach the batch path (it is reported all the same).
    let required = if batches.is_some() {
        &PATHS_REQUIRED[..]
    } else {
        &PATHS_REQUIRED[..2]
    };
    checks.push(paths_check(&paths, required));
    Ok(ContentionRun {
        singles,
        batches,
        paths,
        checks,
    })
}

/// What the batch clients got.
#[derive(Clone, Debug, Default)]
pub struct BatchRun {
    /// Every ID of every batch answered, in the order answered.
    pub ids: Vec<i64>,
    /// Batches answered with IDs.
    pub answered: u64,
    /// Requests answered otherwise (503 under contention) or not answered.
    pub failed: u64,
    /// The first failure, for the printout.
    pub first_failure: Option<String>,
}

impl BatchRun {
    /// What the batch clients did, in one line.
    #[must_use]
    pub fn line(&self) -> String {
        format!(
            "  batches of {BATCH_N}: {} IDs in {} answers; {} failed{}",
            self.ids.len(),
            self.answered,
            self.failed,
            self.first_failure
                .as_deref()
                .map(|f| format!(" (first: {f})"))
                .unwrap_or_default()
        )
    }
}

/// `clients` clients asking `GET /id/{TAG}/batch?n=BATCH_N` of the servers at `bases` in turn,
/// each one request at a time, for `duration`. A batch is judged with the single IDs
/// (`ids.unique[singles+batches]`); a 503 under contention is a refusal, not a finding.
fn batch_clients_run(
    bases: &[String],
    clients: u64,
    duration: Duration,
) -> Result<BatchRun, String> {
    use std::sync::{Arc, Mutex};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime for the batch clients: {e}"))?;
    let targets: Vec<load::conn::Target> = bases
        .iter()
        .map(|b| {
            reqwest::Url::parse(b)
                .ok()
                .and_then(|u| load::conn::Target::of(&u))
                .ok_or_else(|| format!("{b}: not a plain http:// URL"))
        })
        .collect::<Result<_, _>>()?;
    let path: http::Uri = format!("/id/{TAG}/batch?n={BATCH_N}")
        .parse()
        .map_err(|e| format!("the batch path: {e}"))?;
    let out = Arc::new(Mutex::new(BatchRun::default()));
    rt.block_on(async {
        let until = tokio::time::Instant::now() + duration;
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (targets, path, out) = (targets.clone(), path.clone(), Arc::clone(&out));
                tokio::spawn(async move {
                    let mut conns: Vec<load::conn::Conn> = targets
                        .iter()
                        .map(|_| load::conn::Conn::default())
                        .collect();
                    let mut turn = usize::try_from(c).unwrap_or(0);
                    while tokio::time::Instant::now() < until {
                        turn = (turn + 1) % targets.len();
                        let answer = conns[turn]
                            .send(
                                &targets[turn],
                                http::Method::GET,
                                &path,
                                (None, None),
                                Duration::from_secs(5),
                            )
                            .await;
                        let ids = match &answer {
                            Ok((200, body)) => serde_json::from_slice::<serde_json::Value>(body)
                                .ok()
                                .and_then(|v| {
                                    v.get("ids")?
                                        .as_array()?
                                        .iter()
                                        .map(serde_json::Value::as_i64)
                                        .collect::<Option<Vec<i64>>>()
                                }),
                            _ => None,
                        };
                        let failed = {
                            let mut o = out
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            if let Some(ids) = ids {
                                o.answered += 1;
                                o.ids.extend(ids);
                                false
                            } else {
                                o.failed += 1;
                                if o.first_failure.is_none() {
                                    o.first_failure = Some(match answer {
                                        Ok((status, body)) => format!(
                                            "HTTP {status}: {}",
                                            String::from_utf8_lossy(&body)
                                                .chars()
                                                .take(120)
                                                .collect::<String>()
                                        ),
                                        Err(f) => f.class().to_owned(),
                                    });
                                }
                                true
                            }
                        };
                        if failed {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    drop(rt);
    Arc::try_unwrap(out)
        .map_err(|_| "the batch clients still hold their results".to_owned())?
        .into_inner()
        .map_err(|_| "the batch clients' results were poisoned".to_owned())
}

/// Every server's front paths, summed (`GET /metrics`); a page that cannot be read adds none
/// (and `paths.reached` then says what was never reached).
fn read_paths(bases: &[String]) -> Vec<(String, u64)> {
    let mut total: Vec<(String, u64)> = Vec::new();
    for base in bases {
        let Some(page) = get_page(base, "/metrics") else {
            continue;
        };
        for (path, n) in paths_of_metrics(&page) {
            match total.iter_mut().find(|(p, _)| *p == path) {
                Some((_, t)) => *t += n,
                None => total.push((path, n)),
            }
        }
    }
    total
}

/// `GET path` of `base` until it is answered 200 (a server may answer 503 while its first
/// segment is on its way), at most 5 s.
fn warm_up(base: &str, path: &str) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if get_page(base, path).is_some() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{base}{path}: no answer 200 within 5 s of its start"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` of `base` (`http://HOST:PORT`), the body; `None` on any failure.
fn get_page(base: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = load::conn::socket_addr(base).ok()?;
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // The servers' metrics are the operator's: the bench started them with its secret.
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        load::target::bench_admin_token()
    )
    .ok()?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The black-box run of a contention run's single clients: `clients` of them asking `urls` (a
/// `{key}` template each) for the tag's IDs, each server's answers in real-time order.
#[must_use]
pub fn blackbox_options(urls: Vec<String>, clients: u64, duration: Duration) -> BlackBoxOptions {
    BlackBoxOptions {
        target: Target::Http {
            pointer: Some("/id".into()),
        },
        urls,
        key: TAG.into(),
        clients,
        ramp: None,
        rate: None,
        duration,
        monotonic: Monotonic::Server,
        commands: Vec::new(),
        nemesis: None,
        slow_clients: None,
        db: None,
        db_delay: None,
        netns: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_a_batch_and_a_single_request_both_got_are_a_violation() {
        assert_eq!(
            unique_across(&[1, 2, 3], &[4, 5, 6]).verdict,
            Judgement::Held
        );
        let both = unique_across(&[1, 2, 3], &[3, 4, 4]);
        assert_eq!(both.verdict, Judgement::Violated);
        assert!(
            both.first_offending_event
                .unwrap()
                .starts_with("ID 3 handed out twice")
        );
    }

    #[test]
    fn a_path_never_reached_is_named_and_fails_the_run() {
        let page = "# HELP sut_id_paths_total x\n# TYPE sut_id_paths_total counter\n\
                    sut_id_paths_total{tag=\"orders\",path=\"block_refill\"} 12\n\
                    sut_id_paths_total{tag=\"orders\",path=\"take_past_block\"} 4\n\
                    sut_id_paths_total{tag=\"orders\",path=\"batch_across_blocks\"} 0\n\
                    sut_id_paths_total{tag=\"x\",path=\"block_refill\"} 3\n\
                    sut_ids_issued_total 40\n";
        let paths = paths_of_metrics(page);
        assert_eq!(
            paths,
            [
                ("block_refill".to_owned(), 15),
                ("take_past_block".to_owned(), 4),
                ("batch_across_blocks".to_owned(), 0)
            ]
        );
        let check = paths_check(&paths, &PATHS_REQUIRED);
        assert_eq!(check.verdict, Judgement::Violated);
        assert!(
            check
                .first_offending_event
                .unwrap()
                .contains("never reached: batch_across_blocks")
        );
        assert_eq!(
            paths_check(&paths, &PATHS_REQUIRED[..2]).verdict,
            Judgement::Held
        );
        let reached = [
            ("block_refill".to_owned(), 15),
            ("take_past_block".to_owned(), 4),
            ("batch_across_blocks".to_owned(), 2),
        ];
        assert_eq!(
            paths_check(&reached, &PATHS_REQUIRED).verdict,
            Judgement::Held
        );
        // A server whose page had no path at all proves nothing either.
        assert_eq!(
            paths_check(&[], &PATHS_REQUIRED).verdict,
            Judgement::Violated
        );
    }
}
