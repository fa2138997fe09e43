//! Real processes the bench owns (docs/deployment.md): a throwaway PostgreSQL
//! ([`Postgres`]) and MariaDB ([`MariaDb`]), service processes that print `listening on ADDR` ([`Service`]), and the
//! multi-process deployment of `sut-server` roles on one PostgreSQL ([`Deployment`]).
//!
//! Everything started here runs in its own process group and is SIGKILLed when its owner is
//! dropped (on success, on error and on panic); temporary directories go with it. A runner
//! calls [`clean_up_on_interrupt`] once: then Ctrl-C, SIGTERM or SIGHUP kill every process group
//! and remove every directory this crate owns at that moment before the process exits.

mod clock;
mod command;
mod dbserver;
mod deployment;
pub mod lostfs;
mod mariadb;
pub mod nemesis;
mod netlab;
mod postgres;
pub mod proxy;
mod redis;
mod server;
mod service;

pub use clock::{FakeClock, libfaketime_path};
pub use command::{COMMAND_START_TIMEOUT, CommandService, CommandSpec};
pub use dbserver::DbServer;
pub use deployment::{Backend, Deployment, DeploymentSpec, Link, RoleProcess};
pub use lostfs::{LostFs, LostFsEffects};
pub use mariadb::{MARIADB_DATABASE, MARIADB_START_TIMEOUT, MariaDb, MariaDbSpec, mariadb_bin};
pub use netlab::{End, InNetns, NetLab};
pub use postgres::{PG_START_TIMEOUT, PG_USER, Postgres, free_port, postgres_bin_dir};
pub use proxy::{Direction, LinkFault, LinkSwitch, Proxy, ProxyEffects};
pub use redis::{REDIS_START_TIMEOUT, Redis, RedisPersistence, redis_server_bin};
pub use service::{Service, ServiceSpec};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// What went wrong while starting or driving a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The PostgreSQL binaries were not found.
    #[error(
        "PostgreSQL not found: no `initdb` on PATH or in /usr/lib/postgresql/*/bin \
         (Debian: apt-get install postgresql)"
    )]
    PostgresMissing,
    /// libfaketime was not found.
    #[error("libfaketime not found (Debian: apt-get install faketime)")]
    FaketimeMissing,
    /// `redis-server` was not found.
    #[error("redis-server not found on PATH (Debian: apt-get install redis-server)")]
    RedisMissing,
    /// Running as root, but there is no `postgres` user to run the server as.
    #[error("running as root and there is no `postgres` user to run PostgreSQL as")]
    NoPostgresUser,
    /// MariaDB's programs were not found.
    #[error(
        "MariaDB not found: no `mariadbd`, `mariadb-install-db`, `mariadb-admin` and `mariadb` \
         on PATH or in /usr/sbin (Debian: apt-get install mariadb-server)"
    )]
    MariaDbMissing,
    /// Running as root, but there is no `mysql` user to run the server as.
    #[error("running as root and there is no `mysql` user to run MariaDB as")]
    NoMariaDbUser,
    /// What IP-level partitions need is missing.
    #[error("IP-level partitions need {what}")]
    NetLabMissing {
        /// What is missing.
        what: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its exit status and the end of its output.
        detail: String,
    },
    /// A process did not become ready in time.
    #[error("{what} was not ready within {timeout_s} s; log tail:\n{log_tail}")]
    NotReady {
        /// The process.
        what: String,
        /// The limit.
        timeout_s: u64,
        /// The end of its log.
        log_tail: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProcessError {
    let what = what.into();
    move |source| ProcessError::Io { what, source }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a sudden end of this process must not leave behind: the process groups and
/// directories this crate owns right now.
struct Owned {
    groups: BTreeSet<i32>,
    dirs: BTreeSet<PathBuf>,
    /// Network namespaces of [`NetLab`]s.
    netns: BTreeSet<String>,
}

static OWNED: Mutex<Owned> = Mutex::new(Owned {
    groups: BTreeSet::new(),
    dirs: BTreeSet::new(),
    netns: BTreeSet::new(),
});

fn owned() -> MutexGuard<'static, Owned> {
    OWNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records the process group a freshly spawned `child` leads.
fn own_group(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        owned().groups.insert(pid);
    }
}

/// Records a directory to remove if the process is interrupted (`false`: forget it).
fn own_dir(dir: &Path, own: bool) {
    let mut owned = owned();
    if own {
        owned.dirs.insert(dir.to_owned());
    } else {
        owned.dirs.remove(dir);
    }
}

/// Records a network namespace to delete if the process is interrupted (`false`: forget it).
fn own_netns(name: &str, own: bool) {
    let mut owned = owned();
    if own {
        owned.netns.insert(name.to_owned());
    } else {
        owned.netns.remove(name);
    }
}

/// Raises this process's soft limit of open files to its hard limit (as Go's runtime does at
/// start): the hostile checks hold a thousand connections and more, and the services the bench
/// starts inherit the limit. Returns the soft limit now (`None`: it could not be read).
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    // An unlimited hard limit is not a soft one the kernel takes (it caps at `nr_open`).
    let wanted = hard.min(1 << 20);
    if soft < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        return Some(wanted);
    }
    Some(soft)
}

/// Installs (once) a thread that, on SIGINT, SIGTERM or SIGHUP, SIGKILLs every process group
/// and removes every directory this crate owns, then exits with 128 + the signal.
///
/// # Errors
/// The signal handlers could not be installed.
pub fn clean_up_on_interrupt() -> Result<(), ProcessError> {
    static INSTALLED: Once = Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(mut signals) => {
                std::thread::spawn(move || {
                    if let Some(signal) = signals.forever().next() {
                        eprintln!("cluster: interrupted: stopping every process it started");
                        kill_everything_owned();
                        std::process::exit(128 + signal);
                    }
                });
            }
            Err(e) => {
                result = Err(ProcessError::Io {
                    what: "install the interrupt handler".into(),
                    source: e,
                });
            }
        }
    });
    result
}

fn kill_everything_owned() {
    let Owned {
        groups,
        dirs,
        netns,
    } = std::mem::replace(
        &mut *owned(),
        Owned {
            groups: BTreeSet::new(),
            dirs: BTreeSet::new(),
            netns: BTreeSet::new(),
        },
    );
    for &pgid in &groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // Each group's leader is this process's child: reap it (the rest of a group, a
    // postmaster's backends, are the leader's children and go to init).
    for &pgid in &groups {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pgid), None);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while groups
        .iter()
        .any(|&pgid| killpg(Pid::from_raw(pgid), None).is_ok())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    for name in &netns {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", name])
            .status();
    }
}

/// Pauses (`stop`) or resumes the server process `child`, if one runs (see [`signal_group`]).
fn pause_or_resume(child: Option<&Child>, stop: bool, what: &str) -> Result<(), ProcessError> {
    let signal = if stop {
        Signal::SIGSTOP
    } else {
        Signal::SIGCONT
    };
    child.map_or(Ok(()), |child| signal_group(child, signal, what))
}

/// Starts a server with `spawn_and_wait` on `port`, or on a free one when `port` is 0; a start
/// that fails (the port taken meanwhile, among others) is tried again on a fresh port, three
/// times in all.
fn start_on_free_port<S>(
    server: &mut S,
    port: fn(&mut S) -> &mut u16,
    spawn_and_wait: fn(&mut S) -> Result<(), ProcessError>,
) -> Result<(), ProcessError> {
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 || *port(server) == 0 {
            *port(server) = free_port()?;
        }
        match spawn_and_wait(server) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("three attempts were made"))
}

/// Sends `signal` (SIGSTOP to pause, SIGCONT to resume) to the process group `child` leads and
/// to every descendant of `child` in other groups (a PostgreSQL backend makes itself a group
/// leader). Stopping goes parent first (no new children meanwhile), resuming children first.
fn signal_group(child: &Child, signal: Signal, what: &str) -> Result<(), ProcessError> {
    let pid = i32::try_from(child.id()).map_err(|_| ProcessError::Command {
        what: format!("{signal} {what}"),
        detail: format!("pid {} out of range", child.id()),
    })?;
    let failed = |e: nix::errno::Errno| ProcessError::Io {
        what: format!("{signal} {what} (process group {pid})"),
        source: e.into(),
    };
    if signal == Signal::SIGSTOP {
        killpg(Pid::from_raw(pid), signal).map_err(failed)?;
    }
    for descendant in descendants(pid) {
        // One that exited meanwhile is fine.
        let _ = nix::sys::signal::kill(Pid::from_raw(descendant), signal);
    }
    if signal != Signal::SIGSTOP {
        killpg(Pid::from_raw(pid), signal).map_err(failed)?;
    }
    Ok(())
}

/// Every process below `pid` (from `/proc`), children before grandchildren.
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(|p| Some((p, parent_of(p)?)))
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let of = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == of).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent pid in `/proc/PID/stat` (the field after the parenthesised command name).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Hands `path` and everything below it to `uid`:`gid`.
fn chown_tree(
    path: &Path,
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
) -> Result<(), ProcessError> {
    nix::unistd::chown(path, Some(uid), Some(gid)).map_err(|e| ProcessError::Io {
        what: format!("chown {}", path.display()),
        source: e.into(),
    })?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io(format!("read {}", path.display())))? {
            let entry = entry.map_err(io(format!("read {}", path.display())))?;
            chown_tree(&entry.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Hands `path` and everything below it to the user named `user` (and its group): a data
/// directory for a database that refuses to run as root.
///
/// # Errors
/// No such user, or a chown failed.
pub fn give_to_user(path: &Path, user: &str) -> Result<(), ProcessError> {
    let found = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| ProcessError::Command {
            what: format!("hand {} to `{user}`", path.display()),
            detail: format!("there is no user `{user}` on this machine"),
        })?;
    chown_tree(path, found.uid, found.gid)
}

/// The state letter in `/proc/PID/stat` (`R`, `S`, `T` stopped, …); `None` once it is gone.
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// SIGKILLs the process group `child` leads, reaps the leader and waits (up to 5 s) until no
/// member is left.
fn kill_group(child: &mut Child, what: &str) -> Result<(), ProcessError> {
    let pid = i32::try_from(child.id()).map_err(|_| ProcessError::Command {
        what: format!("kill {what}"),
        detail: format!("pid {} out of range", child.id()),
    })?;
    // Every process below it too, whatever its group (a PostgreSQL backend leads its own), and
    // found before the parent dies (its children are then re-parented): a "power loss" that
    // left a backend writing for a moment longer would not be one.
    let below = descendants(pid);
    match killpg(Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            return Err(ProcessError::Io {
                what: format!("kill -9 {what} (process group {pid})"),
                source: e.into(),
            });
        }
    }
    for &p in &below {
        let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    child.wait().map_err(io(format!("wait for {what}")))?;
    owned().groups.remove(&pid);
    let deadline = Instant::now() + Duration::from_secs(5);
    let alive = |p: i32| {
        // A zombie (state Z) is dead; only its parent's reaping is missing.
        std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    };
    while (killpg(Pid::from_raw(pid), None).is_ok() || below.iter().any(|&p| alive(p)))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
