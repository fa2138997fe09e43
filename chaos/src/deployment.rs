//! The deployment a user of this field runs, as real processes: one PostgreSQL (fsync on) or
//! MariaDB (every commit synced), N ID servers sharing its `ids` database, a token service, and the TCC lottery split into a
//! coordinator, a wallet participant and an inventory participant, each with its own database
//! (`tokens`, `coord`, `wallet`, `inventory`). The coordinator reaches the participants and the
//! token service over HTTP; every process shares one admin secret and one JWT key (files in
//! the deployment's directory).

use std::path::PathBuf;

use crate::{DbServer, FakeClock, Postgres, ProcessError, Proxy, Service, ServiceSpec, io};

/// One process of a [`Deployment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoleProcess {
    /// The i-th ID server (from 0).
    Id(usize),
    /// The token service.
    Token,
    /// The TCC coordinator.
    Coordinator,
    /// The wallet (and participation log) participant.
    Wallet,
    /// The inventory participant.
    Inventory,
}

impl RoleProcess {
    /// `id-1`, `token`, `coordinator`, …
    #[must_use]
    pub fn name(self) -> String {
        match self {
            Self::Id(i) => format!("id-{}", i + 1),
            Self::Token => "token".into(),
            Self::Coordinator => "coordinator".into(),
            Self::Wallet => "wallet".into(),
            Self::Inventory => "inventory".into(),
        }
    }

    const fn role(self) -> &'static str {
        match self {
            Self::Id(_) => "id",
            Self::Token => "token",
            Self::Coordinator => "coordinator",
            Self::Wallet => "wallet",
            Self::Inventory => "inventory",
        }
    }

    const fn database(self) -> &'static str {
        match self {
            Self::Id(_) => "ids",
            Self::Token => "tokens",
            Self::Coordinator => "coord",
            Self::Wallet => "wallet",
            Self::Inventory => "inventory",
        }
    }
}

/// Where the processes keep their state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// One throwaway PostgreSQL server, a database per store (the ID servers share one).
    #[default]
    Postgres,
    /// SQLite files in the deployment's directory, a file per store (the ID servers share one,
    /// through SQLite's file locks): nothing to install.
    Sqlite,
    /// One throwaway MariaDB server (InnoDB, every commit synced), a database per store, as
    /// PostgreSQL.
    MariaDb,
}

/// What to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentSpec {
    /// PostgreSQL, MariaDB or SQLite files.
    pub backend: Backend,
    /// The `sut-server` binary.
    pub server_bin: PathBuf,
    /// ID servers on the shared `ids` database (at least 1).
    pub id_servers: usize,
    /// Arguments every server process gets besides its role's (e.g. `--flaw NAME`,
    /// `--test-forced-outcomes`).
    pub extra_args: Vec<String>,
    /// How long the coordinator waits for one participant call, in ms.
    pub participant_timeout_ms: u64,
    /// Chaos hooks (a database server only, not SQLite files): every process on its own
    /// libfaketime clock, every process→database and coordinator→participant link through a
    /// fault proxy, and the database's data directory on the lost-writes filesystem.
    pub chaos: bool,
    /// The operator's activities, `ID:PRICE` or `ID:PRICE:WIN_PER_MILLE`, registered at start in
    /// every process that keeps a registry (all but the ID servers: `sut-server --activity`).
    pub activities: Vec<String>,
}

/// A network link of a chaos [`Deployment`], each behind its own fault proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// A process's connections to the database server (PostgreSQL or MariaDB, its name).
    Database(RoleProcess, &'static str),
    /// The coordinator's calls to a participant or the token service.
    FromCoordinator(RoleProcess),
    /// The load's clients to a process they call (an ID server, the token service, the
    /// coordinator).
    FromClients(RoleProcess),
}

impl Link {
    /// `id-1→postgres`, `id-1→mariadb`, `coordinator→wallet`, …
    #[must_use]
    pub fn name(self) -> String {
        match self {
            Self::Database(w, server) => format!("{}→{server}", w.name()),
            Self::FromCoordinator(w) => format!("coordinator→{}", w.name()),
            Self::FromClients(w) => format!("clients→{}", w.name()),
        }
    }
}

impl DeploymentSpec {
    /// Three ID servers, no extra arguments, 1 s participant calls.
    #[must_use]
    pub fn new(server_bin: PathBuf) -> Self {
        Self {
            backend: Backend::Postgres,
            server_bin,
            id_servers: 3,
            extra_args: Vec::new(),
            participant_timeout_ms: 1_000,
            chaos: false,
            activities: Vec::new(),
        }
    }
}

/// A running deployment; dropping it kills every process and removes every directory.
#[derive(Debug)]
pub struct Deployment {
    // Field order is drop order: the servers go before the links and the database they use.
    services: Vec<(RoleProcess, Service)>,
    links: Vec<(Link, Proxy)>,
    database: Option<DbServer>,
    clocks: Vec<(RoleProcess, FakeClock)>,
    admin_token: String,
    dir: tempfile::TempDir,
}

impl Deployment {
    /// Starts PostgreSQL, creates the databases, then the participants, the coordinator, the
    /// token service and the ID servers, each waited for.
    ///
    /// # Errors
    /// Any start failed (whatever was started is stopped again).
    pub fn start(spec: &DeploymentSpec) -> Result<Self, ProcessError> {
        let dir = tempfile::Builder::new()
            .prefix("bench-cluster-")
            .tempdir()
            .map_err(io("create the deployment directory"))?;
        crate::own_dir(dir.path(), true);
        let database = match spec.backend {
            Backend::Postgres => Some(DbServer::postgres(spec.chaos)?),
            Backend::MariaDb => Some(DbServer::mariadb(spec.chaos)?),
            Backend::Sqlite if spec.chaos => {
                return Err(ProcessError::Command {
                    what: "start a chaos deployment".into(),
                    detail: "the chaos hooks need a database server (PostgreSQL or MariaDB), \
                             not SQLite files"
                        .into(),
                });
            }
            Backend::Sqlite => None,
        };
        let admin_token = random_token()?;
        let token_file = dir.path().join("admin-token");
        std::fs::write(&token_file, &admin_token).map_err(io("write the admin secret"))?;
        // The coordinator's credential on the participants' routes: not the operator's.
        std::fs::write(dir.path().join("service-token"), random_token()?)
            .map_err(io("write the service credential"))?;
        // The JWT key the token service signs with and the coordinator verifies with.
        std::fs::write(dir.path().join("jwt-secret"), random_token()?)
            .map_err(io("write the JWT secret"))?;
        let mut deployment = Self {
            services: Vec::new(),
            links: Vec::new(),
            database,
            clocks: Vec::new(),
            admin_token,
            dir,
        };
        let mut order = vec![
            RoleProcess::Wallet,
            RoleProcess::Inventory,
            RoleProcess::Token,
            RoleProcess::Coordinator,
        ];
        order.extend((0..spec.id_servers.max(1)).map(RoleProcess::Id));
        for which in order {
            deployment.start_role(spec, which, &token_file)?;
        }
        if spec.chaos {
            deployment.proxy_clients()?;
        }
        Ok(deployment)
    }

    fn start_role(
        &mut self,
        spec: &DeploymentSpec,
        which: RoleProcess,
        token_file: &std::path::Path,
    ) -> Result<(), ProcessError> {
        let db = match &self.database {
            Some(server) if spec.chaos => {
                server.create_database(which.database())?;
                let proxy = Proxy::start(loopback(server.port()), link_seed(which))?;
                let url = server.url_via(which.database(), proxy.addr().port());
                self.links
                    .push((Link::Database(which, server.name()), proxy));
                url
            }
            Some(server) => {
                server.create_database(which.database())?;
                server.url_for(which.database())
            }
            None => format!(
                "sqlite:{}",
                self.dir
                    .path()
                    .join(format!("{}.db", which.database()))
                    .display()
            ),
        };
        let mut args = vec![
            "--db".to_owned(),
            db,
            "--role".to_owned(),
            which.role().to_owned(),
            "--admin-token-file".to_owned(),
            token_file.display().to_string(),
            "--service-token-file".to_owned(),
            self.dir.path().join("service-token").display().to_string(),
            "--jwt-secret-file".to_owned(),
            self.dir.path().join("jwt-secret").display().to_string(),
        ];
        if which == RoleProcess::Coordinator {
            let [wallet, inventory, token] = [
                RoleProcess::Wallet,
                RoleProcess::Inventory,
                RoleProcess::Token,
            ]
            .map(|to| self.coordinator_url(spec, to));
            args.extend([
                "--wallet-url".to_owned(),
                wallet?,
                "--inventory-url".to_owned(),
                inventory?,
                "--token-url".to_owned(),
                token?,
                "--participant-timeout-ms".to_owned(),
                spec.participant_timeout_ms.to_string(),
            ]);
        }
        if !matches!(which, RoleProcess::Id(_)) {
            for activity in &spec.activities {
                args.extend(["--activity".to_owned(), activity.clone()]);
            }
        }
        args.extend(spec.extra_args.iter().cloned());
        let env = if spec.chaos {
            let clock = FakeClock::new()?;
            let env = clock.env();
            self.clocks.push((which, clock));
            env
        } else {
            Vec::new()
        };
        let service = Service::start(ServiceSpec {
            name: which.name(),
            program: spec.server_bin.clone(),
            args,
            env,
            log: self.dir.path().join(format!("{}.log", which.name())),
        })?;
        self.services.push((which, service));
        Ok(())
    }

    /// The URL the coordinator is given for `to`: through a fault proxy in a chaos deployment.
    fn coordinator_url(
        &mut self,
        spec: &DeploymentSpec,
        to: RoleProcess,
    ) -> Result<String, ProcessError> {
        let Some(port) = self
            .services()
            .find(|(w, _)| *w == to)
            .map(|(_, s)| s.port())
        else {
            return Ok(String::new());
        };
        if !spec.chaos {
            return Ok(format!("http://127.0.0.1:{port}"));
        }
        let proxy = Proxy::start(loopback(port), link_seed(to) ^ 0x9e37)?;
        let url = format!("http://{}", proxy.addr());
        self.links.push((Link::FromCoordinator(to), proxy));
        Ok(url)
    }

    /// The supervisor's round (what systemd's `Restart=always` does): tries to restart every
    /// process that is down (it exited on its own, or an earlier restart failed: its database
    /// was unreachable, say); returns each process found down and whether it runs again.
    pub fn revive(&mut self) -> Vec<(RoleProcess, bool)> {
        let mut found = Vec::new();
        for (which, service) in &mut self.services {
            if service.is_down() {
                found.push((*which, service.restart().is_ok()));
            }
        }
        found
    }

    /// A fault proxy in front of every process the load's clients call.
    fn proxy_clients(&mut self) -> Result<(), ProcessError> {
        let called: Vec<(RoleProcess, u16)> = self
            .services()
            .filter(|(w, _)| {
                matches!(
                    w,
                    RoleProcess::Id(_) | RoleProcess::Token | RoleProcess::Coordinator
                )
            })
            .map(|(w, s)| (w, s.port()))
            .collect();
        for (which, port) in called {
            let proxy = Proxy::start(loopback(port), link_seed(which) ^ 0x5bd1)?;
            self.links.push((Link::FromClients(which), proxy));
        }
        Ok(())
    }

    /// The URL the load's clients use for a process: through its fault proxy in a chaos
    /// deployment, else [`Deployment::url`].
    #[must_use]
    pub fn client_url(&self, which: RoleProcess) -> String {
        self.links
            .iter()
            .find(|(l, _)| *l == Link::FromClients(which))
            .map_or_else(|| self.url(which), |(_, p)| format!("http://{}", p.addr()))
    }

    /// Every ID server's URL for the load's clients ([`Deployment::client_url`]).
    #[must_use]
    pub fn client_id_urls(&self) -> Vec<String> {
        self.services()
            .filter(|(w, _)| matches!(w, RoleProcess::Id(_)))
            .map(|(w, _)| self.client_url(w))
            .collect()
    }

    /// Every fault-proxied link (none unless [`DeploymentSpec::chaos`]).
    #[must_use]
    pub fn links(&self) -> &[(Link, Proxy)] {
        &self.links
    }

    /// A process's libfaketime clock (`None` unless [`DeploymentSpec::chaos`]).
    #[must_use]
    pub fn clock(&mut self, which: RoleProcess) -> Option<&mut FakeClock> {
        self.clocks
            .iter_mut()
            .find(|(w, _)| *w == which)
            .map(|(_, c)| c)
    }

    /// The base URL of a process (empty if it is not part of the deployment).
    #[must_use]
    pub fn url(&self, which: RoleProcess) -> String {
        self.services
            .iter()
            .find(|(w, _)| *w == which)
            .map(|(_, s)| s.url())
            .unwrap_or_default()
    }

    /// Every ID server's base URL.
    #[must_use]
    pub fn id_urls(&self) -> Vec<String> {
        self.services
            .iter()
            .filter(|(w, _)| matches!(w, RoleProcess::Id(_)))
            .map(|(_, s)| s.url())
            .collect()
    }

    /// A process, to kill or restart.
    #[must_use]
    pub fn service(&mut self, which: RoleProcess) -> Option<&mut Service> {
        self.services
            .iter_mut()
            .find(|(w, _)| *w == which)
            .map(|(_, s)| s)
    }

    /// Every process, in start order.
    pub fn services(&self) -> impl Iterator<Item = (RoleProcess, &Service)> {
        self.services.iter().map(|(w, s)| (*w, s))
    }

    /// The database server, to kill or restart (`None` on SQLite files).
    pub const fn database(&mut self) -> Option<&mut DbServer> {
        self.database.as_mut()
    }

    /// The PostgreSQL server (`None` on MariaDB or SQLite files).
    pub const fn postgres(&mut self) -> Option<&mut Postgres> {
        match &mut self.database {
            Some(DbServer::Postgres(pg)) => Some(pg),
            _ => None,
        }
    }

    /// The admin secret every process shares.
    #[must_use]
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The deployment's directory (process logs, the admin secret).
    #[must_use]
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        // The fields drop after this: the servers, PostgreSQL, then the directory.
        crate::own_dir(self.dir.path(), false);
    }
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// A fixed jitter seed per link (the proxies' jitter is not used by the chaos nemesis).
fn link_seed(which: RoleProcess) -> u64 {
    which.name().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn random_token() -> Result<String, ProcessError> {
    use std::io::Read;
    let mut buf = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(io("read /dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
