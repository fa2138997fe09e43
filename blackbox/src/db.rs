//! The user's own database under faults (`--db-cmd`): where a Leaf or Tinyid cluster keeps its
//! durability (its servers keep nothing on disk), started by the bench so that its nemesis can
//! kill it, pause it, cut its power or cut the service's link to it.
//!
//! The bench runs `--db-init` once (if given), then `--db-cmd`, with `{dbdata}` replaced by a
//! fresh data directory (on the lost-writes filesystem when the nemesis cuts the database's
//! power), `{dbrun}` by a directory beside it for sockets and pid files (never on that
//! filesystem, which takes no Unix sockets) and `{dbport}` by a free loopback port; the database is ready when that port accepts
//! a connection. A fault proxy stands in front of it, and the services reach the database
//! through the proxy: `{db_url}` in a `--server-cmd` is `--db-url` with `{db_addr}` (the
//! proxy's `127.0.0.1:PORT`) and `{db_port}` (its port) filled in; `{db_addr}` and `{db_port}`
//! work in a `--server-cmd` too.
//!
//! Each fault's effect is checked where it is made: after `db_kill` and `db_power_loss` the
//! database's port refuses; after `db_pause` every one of its processes is stopped; a
//! `db_partition` held back bytes of the service's link while it lasted.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chaos::{CommandService, CommandSpec, LinkFault, LostFs, ProcessError, Proxy, ProxyEffects};

/// A fault of the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DbFault {
    /// SIGKILL of the database's command, restarted with the same command when it heals.
    Kill,
    /// SIGSTOP of every process of the database, SIGCONT when it heals.
    Pause,
    /// The database killed and every write under `{dbdata}` not yet synced dropped, restarted
    /// when it heals.
    PowerLoss,
    /// The link between the services and the database black-holed by the fault proxy.
    Partition,
}

impl DbFault {
    /// Every database fault.
    pub const ALL: [Self; 4] = [Self::Kill, Self::Pause, Self::PowerLoss, Self::Partition];

    /// The database fault named `word`, between two messages of a contract tester (`scenario
    /// tcc`, `scenario tokens` `--db-fault`): `db_kill` or `db_power_loss`.
    ///
    /// # Errors
    /// Another name, saying why: a pause or a partition between two messages changes nothing
    /// the tester can see, and during one it leaves the message's outcome unknown, which a
    /// tester that judges every answer cannot take (`scenario ids` takes them).
    pub fn parse_between_messages(word: &str) -> Result<Self, String> {
        let fault =
            sut::fault::parse_into(word, sut::fault::Runner::OwnService, &Self::ALL, Self::kind)
                .map_err(|_| format!("--db-fault `{word}`: db_kill or db_power_loss"))?;
        match fault {
            Self::Kill | Self::PowerLoss => Ok(fault),
            Self::Pause | Self::Partition => Err(format!(
                "--db-fault {word}: between two messages it changes nothing the tester sees, and \
                 during one it leaves the answer unknown; use db_kill or db_power_loss here \
                 (scenario ids takes db_pause and db_partition)"
            )),
        }
    }

    /// Its kind in the fault vocabulary.
    #[must_use]
    pub const fn kind(self) -> sut::fault::FaultKind {
        use sut::fault::FaultKind as K;
        match self {
            Self::Kill => K::DbKill,
            Self::Pause => K::DbPause,
            Self::PowerLoss => K::DbPowerLoss,
            Self::Partition => K::DbPartition,
        }
    }
}

/// How to start the user's database.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DbOptions {
    /// The command that runs the database in the foreground (`{dbdata}`, `{dbrun}`,
    /// `{dbport}`), run by `sh -c`, again after every kill and power loss.
    pub command: String,
    /// A command run once before the first start, to completion (`mariadb-install-db`,
    /// `initdb`; the same placeholders).
    pub init: Option<String>,
    /// A command that succeeds once the database serves queries (`pg_isready -h 127.0.0.1 -p
    /// {dbport}`, `mariadb-admin … ping`), run after every start until it does: a port that
    /// accepts is not always a database that answers (PostgreSQL accepts while it recovers and
    /// refuses queries with 57P03 meanwhile).
    pub ready: Option<String>,
    /// What `{db_url}` is in a `--server-cmd`: `{db_addr}` and `{db_port}` filled in with the
    /// fault proxy's (`mysql://root@{db_addr}/bench`); empty: `{db_addr}`.
    pub url: String,
    /// The user `{dbdata}` is handed to before the database starts (a MariaDB or PostgreSQL
    /// that refuses to run as root and drops to `mysql` or `postgres`).
    pub user: Option<String>,
}

impl DbOptions {
    /// Checks the options for a run whose database faults are `faults`.
    ///
    /// # Errors
    /// What is wrong, naming the option.
    pub fn validate(&self, faults: &[DbFault]) -> Result<(), String> {
        if self.command.trim().is_empty() {
            return Err("--db-cmd is empty: give the command that runs the database".into());
        }
        if !self.command.contains("{dbport}") {
            return Err(format!(
                "--db-cmd `{}`: put {{dbport}} where the database's port goes (the bench picks \
                 a free one and puts its fault proxy in front of it)",
                self.command
            ));
        }
        if faults.contains(&DbFault::PowerLoss) && !self.command.contains("{dbdata}") {
            return Err(format!(
                "--nemesis db_power_loss: put {{dbdata}} in --db-cmd `{}` where the database keeps \
                 its files (the bench mounts its lost-writes filesystem there)",
                self.command
            ));
        }
        if let Some(user) = &self.user
            && user.trim().is_empty()
        {
            return Err("--db-user is empty".into());
        }
        Ok(())
    }
}

/// The placeholders a `--server-cmd` may use for the database.
pub const SERVER_PLACEHOLDERS: [&str; 3] = ["{db_url}", "{db_addr}", "{db_port}"];

/// How the services reach the database.
#[derive(Debug)]
enum DbLink {
    /// Through the bench's fault proxy.
    Proxy(Proxy),
    /// Directly, at its address in a network namespace (partitions are the lab's).
    Direct(SocketAddr),
}

impl DbLink {
    /// The address the services are given.
    fn addr(&self) -> SocketAddr {
        match self {
            Self::Proxy(proxy) => proxy.addr(),
            Self::Direct(addr) => *addr,
        }
    }
}

/// A running (or faulted) user's database, behind its fault proxy (or in a namespace).
#[derive(Debug)]
pub struct Database {
    service: CommandService,
    /// `--db-ready`, filled in.
    ready: Option<String>,
    link: DbLink,
    /// Where the database itself listens.
    listen: SocketAddr,
    url: String,
    /// Bytes held by the proxy when the current partition began.
    held_at_cut: u64,
    /// Under `{dbdata}` (power-loss runs); unmounted after the database is gone (fields drop in
    /// order).
    lostfs: Option<LostFs>,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

impl Database {
    /// Makes `{dbdata}` (on the lost-writes filesystem when `lose_unsynced`), runs the init
    /// command, starts the database and its proxy.
    ///
    /// # Errors
    /// A directory, the mount, the init command or the start failed.
    pub fn start(opts: &DbOptions, lose_unsynced: bool) -> Result<Self, ProcessError> {
        Self::start_in(opts, lose_unsynced, None)
    }

    /// As [`Database::start`], in the network namespace `netns` when given (a [`chaos::NetLab`]
    /// node): the database listens on `{dbhost}`, the node's address, the services reach it
    /// there directly (no proxy: `{db_addr}` is that address), and a partition is the lab's.
    ///
    /// # Errors
    /// As [`Database::start`].
    pub fn start_in(
        opts: &DbOptions,
        lose_unsynced: bool,
        netns: Option<chaos::InNetns>,
    ) -> Result<Self, ProcessError> {
        let dir = tempfile::Builder::new()
            .prefix("bench-own-db-")
            .tempdir()
            .map_err(|e| io("make the database's folder", e))?;
        let data = dir.path().join("dbdata");
        std::fs::create_dir(&data).map_err(|e| io("make {dbdata}", e))?;
        let run = dir.path().join("dbrun");
        std::fs::create_dir(&run).map_err(|e| io("make {dbrun}", e))?;
        let backing = dir.path().join("disk");
        if lose_unsynced {
            std::fs::create_dir(&backing).map_err(|e| io("make the backing folder", e))?;
        }
        if let Some(user) = &opts.user {
            // The folder itself too: a server dropping to `user` must reach `{dbdata}`.
            chaos::give_to_user(dir.path(), user)?;
        }
        let lostfs = if lose_unsynced {
            Some(LostFs::mount(&backing, &data)?)
        } else {
            None
        };
        let port = chaos::free_port()?;
        let host = netns
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |place| place.addr);
        let fill = |command: &str| {
            command
                .replace("{dbhost}", &host.to_string())
                .replace("{dbdata}", &data.display().to_string())
                .replace("{dbrun}", &run.display().to_string())
                .replace("{dbport}", &port.to_string())
        };
        if let Some(init) = &opts.init {
            run_init(&fill(init), &dir.path().join("db-init.log"))?;
        }
        let service = CommandService::start(CommandSpec {
            name: "database".into(),
            command: fill(&opts.command),
            port,
            env: Vec::new(),
            log: dir.path().join("database.log"),
            netns: netns.clone(),
        })?;
        let ready = opts.ready.as_deref().map(fill);
        if let Some(ready) = &ready {
            wait_ready(ready, &dir.path().join("db-ready.log"))?;
        }
        let listen = SocketAddr::from((host, port));
        let link = if netns.is_some() {
            DbLink::Direct(listen)
        } else {
            DbLink::Proxy(Proxy::start(listen, 0xdb)?)
        };
        let template = if opts.url.is_empty() {
            "{db_addr}"
        } else {
            &opts.url
        };
        let url = fill_addr(template, link.addr());
        Ok(Self {
            service,
            ready,
            link,
            listen,
            url,
            held_at_cut: 0,
            lostfs,
            data,
            _dir: dir,
        })
    }

    /// The database of a contract tester's run, if it has one: on the lost-writes filesystem
    /// when its fault is a power loss.
    ///
    /// # Errors
    /// As [`Database::start`].
    pub fn start_for(
        opts: Option<&DbOptions>,
        fault: Option<DbFault>,
    ) -> Result<Option<Self>, ProcessError> {
        opts.map(|spec| Self::start(spec, fault == Some(DbFault::PowerLoss)))
            .transpose()
    }

    /// `command` with `{db_url}`, `{db_addr}` and `{db_port}` filled in (the proxy's, or the
    /// database's own in a namespace).
    #[must_use]
    pub fn fill(&self, command: &str) -> String {
        fill_addr(&command.replace("{db_url}", &self.url), self.link.addr())
    }

    /// The URL the services are given (through the proxy).
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `{dbdata}`.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The database's log (its command's output).
    #[must_use]
    pub fn log(&self) -> &Path {
        self.service.log()
    }

    /// Begins `fault`; whether its effect is in place (a partition's is known when it heals).
    ///
    /// # Errors
    /// A signal could not be sent.
    pub fn inject(&mut self, fault: DbFault) -> Result<bool, ProcessError> {
        match fault {
            DbFault::Kill => {
                self.service.kill9()?;
                Ok(self.service.is_down() && self.refuses())
            }
            DbFault::Pause => {
                self.service.pause()?;
                // A stop signal lands a moment after it is sent.
                Ok(within_a_second(|| self.service.is_stopped()))
            }
            DbFault::PowerLoss => {
                self.service.kill9()?;
                let lostfs = self
                    .lostfs
                    .as_ref()
                    .expect("db_power_loss runs mount {dbdata}");
                lostfs.power_loss();
                Ok(self.service.is_down() && self.refuses())
            }
            DbFault::Partition => {
                self.held_at_cut = self.proxy().effects().held_bytes;
                self.set_link(LinkFault::Blackhole);
                Ok(true)
            }
        }
    }

    /// Sets the shape of the services' link to the database (a black hole, one way, or
    /// whole again), through its proxy.
    ///
    /// # Panics
    /// A database in a namespace: its lab cuts it.
    pub fn set_link(&self, fault: LinkFault) {
        self.proxy().set(fault);
    }

    /// A handle that switches the services' link to the database from another thread
    /// (`None`: a database in a namespace, reached without a proxy).
    #[must_use]
    pub fn link_switch(&self) -> Option<chaos::LinkSwitch> {
        match &self.link {
            DbLink::Proxy(proxy) => Some(proxy.switch()),
            DbLink::Direct(_) => None,
        }
    }

    fn proxy(&self) -> &Proxy {
        match &self.link {
            DbLink::Proxy(proxy) => proxy,
            DbLink::Direct(_) => unreachable!("a database in a namespace is cut by its lab"),
        }
    }

    /// Ends `fault`; whether it took effect, as far as only its end can tell (a partition
    /// held back bytes of the link while it lasted).
    ///
    /// # Errors
    /// The database could not be restarted or resumed.
    pub fn heal(&mut self, fault: DbFault) -> Result<bool, ProcessError> {
        match fault {
            DbFault::Kill | DbFault::PowerLoss => {
                self.service.restart()?;
                if let Some(ready) = &self.ready {
                    let log = self.service.log().with_file_name("db-ready.log");
                    wait_ready(ready, &log)?;
                }
                Ok(true)
            }
            DbFault::Pause => self.service.resume().map(|()| true),
            DbFault::Partition => {
                let held = self.proxy().effects().held_bytes > self.held_at_cut;
                self.set_link(LinkFault::None);
                Ok(held)
            }
        }
    }

    /// `fault`, held `down`, then healed (the contract testers' way: between two messages);
    /// whether it was seen in place.
    ///
    /// # Errors
    /// As [`Database::inject`] and [`Database::heal`].
    pub fn fault_and_heal(&mut self, fault: DbFault, down: Duration) -> Result<bool, ProcessError> {
        let in_place = self.inject(fault)?;
        std::thread::sleep(down);
        Ok(self.heal(fault)? && in_place)
    }

    /// What the proxy in front of the database did (`None` in a namespace: no proxy).
    #[must_use]
    pub fn proxy_effects(&self) -> Option<ProxyEffects> {
        match &self.link {
            DbLink::Proxy(proxy) => Some(proxy.effects()),
            DbLink::Direct(_) => None,
        }
    }

    /// What the lost-writes filesystem under `{dbdata}` did (power-loss runs).
    #[must_use]
    pub fn lost_writes(&self) -> Option<chaos::LostFsEffects> {
        self.lostfs.as_ref().map(LostFs::effects)
    }

    /// Whether the database's own port refuses a connection.
    fn refuses(&self) -> bool {
        TcpStream::connect_timeout(&self.listen, Duration::from_millis(200)).is_err()
    }
}

/// How long a contract tester holds a database fault between two messages.
pub const DOWN_BETWEEN_MESSAGES: Duration = Duration::from_millis(200);

/// The database options of a contract tester (`scenario tcc`, `scenario tokens`): `db` and
/// `db_fault` with the `commands` that start the service and the `kill_every` cadence.
///
/// # Errors
/// What is wrong, naming the option.
pub fn validate_contract(
    db: Option<&DbOptions>,
    db_fault: Option<DbFault>,
    commands: &[String],
    kill_every: u64,
) -> Result<(), String> {
    let uses_db = |c: &String| SERVER_PLACEHOLDERS.iter().any(|p| c.contains(p));
    let Some(db) = db else {
        if db_fault.is_some() {
            return Err("--db-fault needs --db-cmd (the bench must start the database)".into());
        }
        if let Some(c) = commands.iter().find(|c| uses_db(c)) {
            return Err(format!(
                "--server-cmd `{c}` uses the database's address, but there is no --db-cmd"
            ));
        }
        return Ok(());
    };
    db.validate(db_fault.as_slice())?;
    if !commands.iter().any(uses_db) {
        return Err(
            "--db-cmd: give a --server-cmd that uses {db_url}, {db_addr} or {db_port} (the \
             bench starts the service on the database, through its fault proxy)"
                .into(),
        );
    }
    if db_fault.is_some() && kill_every == 0 {
        return Err("--db-fault: say how often with --kill-every N".into());
    }
    Ok(())
}

/// `faults.took_effect` of `made` database faults of which `seen` were seen in place.
#[must_use]
pub fn took_effect(made: u32, seen: u32) -> reports::model::InvariantResult {
    let detail = format!("{made} database faults, {seen} seen in place (the port refused)");
    if seen == made {
        return reports::model::InvariantResult {
            detail: Some(detail),
            ..reports::model::InvariantResult::held("faults.took_effect")
        };
    }
    reports::model::InvariantResult {
        name: "faults.took_effect".into(),
        verdict: reports::model::Judgement::Violated,
        seed: None,
        first_offending_event: None,
        detail: Some(detail),
    }
}

/// How long a service may take to answer again after its database came back.
pub const BACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until `answers` (a harmless request to the service that goes through its database)
/// says the service is back after a database fault.
///
/// # Errors
/// Not back within [`BACK_TIMEOUT`]: what the last attempt said.
pub fn wait_until_back(mut answers: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = std::time::Instant::now() + BACK_TIMEOUT;
    loop {
        match answers() {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!(
                    "the service did not answer within {} s of its database coming back: {e}",
                    BACK_TIMEOUT.as_secs()
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Whether `done` becomes true within a second (polled).
fn within_a_second(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `{db_addr}` and `{db_port}` of `addr`.
fn fill_addr(text: &str, addr: SocketAddr) -> String {
    text.replace("{db_addr}", &addr.to_string())
        .replace("{db_port}", &addr.port().to_string())
}

fn io(what: &str, source: std::io::Error) -> ProcessError {
    ProcessError::Io {
        what: what.to_owned(),
        source,
    }
}

/// How long `--db-ready` may take to succeed after a start.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `command` until it succeeds (every 100 ms), at most [`READY_TIMEOUT`].
fn wait_ready(command: &str, log: &Path) -> Result<(), ProcessError> {
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    loop {
        match run_init(command, log) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(ProcessError::NotReady {
                    what: format!("the database (--db-ready `{command}`)"),
                    timeout_s: READY_TIMEOUT.as_secs(),
                    log_tail: e.to_string(),
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs `command` (by `sh -c`) to completion, its output to `log`.
fn run_init(command: &str, log: &Path) -> Result<(), ProcessError> {
    let out = std::fs::File::create(log).map_err(|e| io("make the init log", e))?;
    let err = out.try_clone().map_err(|e| io("make the init log", e))?;
    let status = std::process::Command::new("sh")
        .args(["-c", command])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| io("run --db-init", e))?;
    if status.success() {
        return Ok(());
    }
    let tail = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = tail.lines().collect();
    Err(ProcessError::Command {
        what: format!("`{command}`"),
        detail: format!(
            "{status}:\n{}",
            lines[lines.len().saturating_sub(15)..].join("\n")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(command: &str) -> DbOptions {
        DbOptions {
            command: command.into(),
            ..DbOptions::default()
        }
    }

    #[test]
    fn the_options_name_what_is_missing() {
        assert!(opts("").validate(&[]).unwrap_err().contains("--db-cmd"));
        let no_port = opts("redis-server --dir {dbdata}")
            .validate(&[])
            .unwrap_err();
        assert!(no_port.contains("{dbport}"), "{no_port}");
        let no_data = opts("redis-server --port {dbport}")
            .validate(&[DbFault::PowerLoss])
            .unwrap_err();
        assert!(no_data.contains("{dbdata}"), "{no_data}");
        assert_eq!(
            opts("redis-server --port {dbport}").validate(&[DbFault::Kill, DbFault::Pause]),
            Ok(())
        );
    }

    #[test]
    fn the_contract_testers_take_the_faults_between_two_messages_and_say_why_not_the_others() {
        assert_eq!(
            DbFault::parse_between_messages("db_kill"),
            Ok(DbFault::Kill)
        );
        assert_eq!(
            DbFault::parse_between_messages("db_power_loss"),
            Ok(DbFault::PowerLoss)
        );
        let pause = DbFault::parse_between_messages("db_pause").unwrap_err();
        assert!(pause.contains("scenario ids takes db_pause"), "{pause}");
        let other = DbFault::parse_between_messages("kill").unwrap_err();
        assert!(other.contains("db_kill or db_power_loss"), "{other}");
    }

    #[test]
    fn a_database_fault_not_seen_in_place_fails_took_effect() {
        use reports::model::Judgement;
        assert_eq!(took_effect(3, 3).verdict, Judgement::Held);
        assert_eq!(took_effect(3, 2).verdict, Judgement::Violated);
    }

    #[test]
    fn a_contract_tester_needs_a_database_a_service_on_it_and_a_cadence() {
        let db = opts("exec db --port {dbport}");
        let on_db = ["exec svc --db {db_url}".to_owned()];
        let fault = Some(DbFault::Kill);
        assert!(
            validate_contract(None, fault, &on_db, 5)
                .unwrap_err()
                .contains("--db-cmd")
        );
        assert!(
            validate_contract(None, None, &on_db, 5)
                .unwrap_err()
                .contains("no --db-cmd")
        );
        let unused = validate_contract(Some(&db), fault, &["exec svc".into()], 5).unwrap_err();
        assert!(unused.contains("{db_url}"), "{unused}");
        let never = validate_contract(Some(&db), fault, &on_db, 0).unwrap_err();
        assert!(never.contains("--kill-every"), "{never}");
        assert_eq!(validate_contract(Some(&db), fault, &on_db, 5), Ok(()));
    }

    #[test]
    fn the_proxy_address_fills_the_templates() {
        assert_eq!(
            fill_addr(
                "mysql://root@{db_addr}/bench?port={db_port}",
                ([127, 0, 0, 1], 4000).into()
            ),
            "mysql://root@127.0.0.1:4000/bench?port=4000"
        );
    }
}
