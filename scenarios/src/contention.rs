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
        }
    }

    /// The default deployment's ID settings on `backend`, for comparison: segments of 2,000 IDs
    /// with Leaf's doubling, 4 clients.
    #[must_use]
    pub fn deployment_default(backend: chaos::Backend) -> Self {
        Self {
            step: load::cluster::CLUSTER_STEP,
            step_max: false,
            clients: 4,
            ..Self::new(backend)
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

/// Runs it: starts the database and the servers (`server_bin --role id`), runs the clients,
/// judges the IDs, stops everything.
///
/// # Errors
/// Bad options, the database or a server did not start, a server gave no ID before the run.
pub fn run(opts: &ContentionOptions, server_bin: &Path) -> Result<BlackBoxRun, String> {
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
    let url = match &database {
        Database::Server(server) => {
            server
                .create_database("ids")
                .map_err(|e| format!("create the ids database: {e}"))?;
            server.url_for("ids")
        }
        Database::File(dir) => format!("sqlite:{}", dir.path().join("ids.db").display()),
    };
    let step_max = if opts.step_max {
        format!(" --step-max {}", opts.step)
    } else {
        String::new()
    };
    let (mut urls, mut commands) = (Vec::new(), Vec::new());
    for _ in 0..opts.id_servers {
        let port = chaos::free_port().map_err(|e| e.to_string())?;
        urls.push(format!("http://127.0.0.1:{port}/id/{{key}}"));
        commands.push(format!(
            "exec env SUT_ADMIN_TOKEN={} {} --role id --db '{url}' --listen 127.0.0.1:{port} \
             --tag {TAG}:{}{step_max} {}",
            load::target::bench_admin_token(),
            server_bin.display(),
            opts.step,
            opts.server_flags
        ));
    }
    let ran = blackbox::ids::run(&BlackBoxOptions {
        target: Target::Http {
            pointer: Some("/id".into()),
        },
        urls,
        key: TAG.into(),
        clients: opts.clients,
        rate: None,
        duration: opts.duration,
        monotonic: Monotonic::Server,
        commands,
        nemesis: None,
        slow_clients: None,
        db: None,
        netns: false,
    })
    .map_err(|e| e.to_string());
    drop(database);
    ran
}
