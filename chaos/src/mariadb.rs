//! A throwaway MariaDB (the MySQL that Leaf and Tinyid keep their segments in).
//!
//! [`MariaDb::start_with`] runs `mariadb-install-db` into a fresh temporary directory and starts
//! `mariadbd` on a free loopback port with InnoDB durable as asked ([`MariaDbSpec`]; by default
//! `innodb_flush_log_at_trx_commit=1`, the binary log on with `sync_binlog=1`: every commit
//! synced), and waits until it answers (`mariadb-admin ping`). [`MariaDb::kill9`] SIGKILLs it
//! and [`MariaDb::restart`] starts it again on the same files (InnoDB crash recovery);
//! with `lose_unsynced` the data directory is a [`crate::LostFs`] mount and
//! [`MariaDb::power_loss`] drops every write the server had not synced. Dropping the value kills
//! the server and removes the directory.
//!
//! MariaDB refuses to run as root: when this process is root, the data directory is given to
//! the `mysql` user (Debian's package creates it) and the server drops to it (`--user=mysql`).
//! Clients connect as `root` over TCP with no password (the server listens on loopback only):
//! [`MariaDb::url`].

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::unistd::{Gid, Uid, User};

use crate::server::ServerProcess;
use crate::{ProcessError, io, own_dir};

/// How long a start (crash recovery included) may take before it is an error.
pub const MARIADB_START_TIMEOUT: Duration = Duration::from_secs(60);
/// The database every throwaway server has.
pub const MARIADB_DATABASE: &str = "bench";

pub use hostprobe::mariadb_bin;

/// How durable a commit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MariaDbSpec {
    /// `innodb_flush_log_at_trx_commit`: 1 the redo log is synced at every commit (the
    /// default), 2 it is written at commit and synced about once a second (a common production
    /// tuning), 0 written and synced about once a second.
    pub flush_log_at_trx_commit: u8,
    /// `sync_binlog`: the binary log is synced every this many commits (1: every one; 0: when
    /// the OS likes).
    pub sync_binlog: u32,
    /// The data directory is a lost-writes mount, for [`MariaDb::power_loss`].
    pub lose_unsynced: bool,
}

impl Default for MariaDbSpec {
    fn default() -> Self {
        Self {
            flush_log_at_trx_commit: 1,
            sync_binlog: 1,
            lose_unsynced: false,
        }
    }
}

/// A throwaway MariaDB server (see the module documentation).
#[derive(Debug)]
pub struct MariaDb {
    spec: MariaDbSpec,
    /// `mysql`'s ids when this process is root.
    run_as: Option<(Uid, Gid)>,
    /// The server's process and the lost-writes filesystem under the data directory, when
    /// asked for (declared before `root`: it unmounts before the directory goes).
    server: ServerProcess,
    /// Kept for its `Drop`: removes the data directory.
    root: tempfile::TempDir,
    port: u16,
    starts: u32,
}

/// Who the server runs as: `None` is this process's own user.
fn run_as() -> Result<Option<(Uid, Gid)>, ProcessError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("mysql")
        .ok()
        .flatten()
        .ok_or(ProcessError::NoMariaDbUser)?;
    Ok(Some((user.uid, user.gid)))
}

impl MariaDb {
    /// A server with every commit synced ([`MariaDbSpec::default`]).
    ///
    /// # Errors
    /// As [`MariaDb::start_with`].
    pub fn start() -> Result<Self, ProcessError> {
        Self::start_with(MariaDbSpec::default())
    }

    /// Installs a new data directory and starts the server on it, durable as `spec` says.
    ///
    /// # Errors
    /// [`ProcessError::MariaDbMissing`] when the programs are absent; the install, the mount
    /// or the start failed.
    pub fn start_with(spec: MariaDbSpec) -> Result<Self, ProcessError> {
        if mariadb_bin("mariadbd").is_none() {
            return Err(ProcessError::MariaDbMissing);
        }
        let run_as = run_as()?;
        let root = tempfile::Builder::new()
            .prefix("bench-mariadb-")
            .tempdir()
            .map_err(io("create a temporary directory"))?;
        own_dir(root.path(), true);
        // Its own temporary directory: two servers bootstrapping at once in one /tmp clash.
        fs::create_dir(root.path().join("tmp")).map_err(io("create the tmp directory"))?;
        let data = root.path().join("data");
        let lostfs = if spec.lose_unsynced {
            let backing = root.path().join("disk");
            fs::create_dir(&backing).map_err(io("create the backing directory"))?;
            fs::create_dir(&data).map_err(io("create the data directory"))?;
            if let Some((uid, gid)) = run_as {
                crate::chown_tree(root.path(), uid, gid)?;
            }
            Some(crate::LostFs::mount(&backing, &data)?)
        } else {
            fs::create_dir(&data).map_err(io("create the data directory"))?;
            if let Some((uid, gid)) = run_as {
                crate::chown_tree(root.path(), uid, gid)?;
            }
            None
        };
        let mut db = Self {
            spec,
            run_as,
            server: ServerProcess::new("mariadbd", "MariaDB", lostfs),
            root,
            port: 0,
            starts: 0,
        };
        db.install()?;
        db.start_server()?;
        db.sql(&format!("CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE}"))?;
        Ok(db)
    }

    /// The data directory.
    #[must_use]
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The server log (appended to across restarts).
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("mariadb.log")
    }

    /// The loopback port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// How durable its commits are.
    #[must_use]
    pub const fn spec(&self) -> MariaDbSpec {
        self.spec
    }

    /// How many times the server was started (1 after [`MariaDb::start`]).
    #[must_use]
    pub const fn starts(&self) -> u32 {
        self.starts
    }

    /// A connection URL for database [`MARIADB_DATABASE`] as `root`.
    #[must_use]
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// [`MariaDb::url`] through another port (a fault proxy in front of this server).
    #[must_use]
    pub fn url_via(&self, port: u16) -> String {
        self.url_of(MARIADB_DATABASE, port)
    }

    /// The URL of database `database` as `root`, reached on `port` (this server's own, or a
    /// fault proxy's in front of it).
    #[must_use]
    pub fn url_of(&self, database: &str, port: u16) -> String {
        format!("mysql://root@127.0.0.1:{port}/{database}")
    }

    /// Creates database `name` (an existing one is kept).
    ///
    /// # Errors
    /// A name other than letters, digits and `_`, or the server refused.
    pub fn create_database(&self, name: &str) -> Result<(), ProcessError> {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(ProcessError::Command {
                what: format!("create database {name:?}"),
                detail: "use letters, digits and `_`".into(),
            });
        }
        self.sql(&format!("CREATE DATABASE IF NOT EXISTS {name}"))
    }

    /// Runs `sql` (statements separated by `;`) through the `mariadb` client, for set-up.
    ///
    /// # Errors
    /// The client failed or the server refused a statement.
    pub fn sql(&self, sql: &str) -> Result<(), ProcessError> {
        self.query(sql).map(|_| ())
    }

    /// Runs `sql` in database [`MARIADB_DATABASE`] (once it exists) through the `mariadb`
    /// client and returns what it printed: one line per row, tab-separated, no header.
    ///
    /// # Errors
    /// The client failed or the server refused a statement.
    pub fn query(&self, sql: &str) -> Result<String, ProcessError> {
        let out = Command::new(program("mariadb")?)
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
            ])
            .args(["-u", "root", "--connect-timeout=5", "-N", "-B", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(io("run mariadb"))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(ProcessError::Command {
            what: format!("mariadb -e {sql:?}"),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }

    /// Pauses the server (SIGSTOP): it keeps its connections and memory, answers nothing.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self) -> Result<(), ProcessError> {
        self.server.pause()
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn resume(&self) -> Result<(), ProcessError> {
        self.server.resume()
    }

    /// SIGKILLs the server and waits for it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        self.server.kill9()
    }

    /// A power loss: the server is killed, then every write it had not synced is dropped (it
    /// must have been started with `lose_unsynced`). Restart it with [`MariaDb::restart`].
    ///
    /// # Errors
    /// The kill failed, or the data directory is not a lost-writes mount.
    pub fn power_loss(&mut self) -> Result<crate::LostFsEffects, ProcessError> {
        self.server.power_loss()
    }

    /// What the lost-writes filesystem under the data directory did, if there is one.
    #[must_use]
    pub fn lost_writes(&self) -> Option<crate::LostFsEffects> {
        self.server.lost_writes()
    }

    /// Starts the server again on the same data directory (crash recovery after a kill), on
    /// the same port when it is still free.
    ///
    /// # Errors
    /// The start failed.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill9()?;
        self.start_server()
    }

    fn command(&self, name: &str) -> Result<Command, ProcessError> {
        let mut cmd = Command::new(program(name)?);
        cmd.current_dir(self.root.path()).env("LC_ALL", "C");
        Ok(cmd)
    }

    fn install(&self) -> Result<(), ProcessError> {
        let mut cmd = self.command("mariadb-install-db")?;
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!(
                "--tmpdir={}",
                self.root.path().join("tmp").display()
            ))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if self.run_as.is_some() {
            cmd.arg("--user=mysql");
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(io("run mariadb-install-db"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(ProcessError::Command {
            what: "mariadb-install-db".into(),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }

    fn start_server(&mut self) -> Result<(), ProcessError> {
        crate::start_on_free_port(self, |s| &mut s.port, Self::spawn_and_wait)?;
        self.starts += 1;
        Ok(())
    }

    fn spawn_and_wait(&mut self) -> Result<(), ProcessError> {
        let root = self.root.path();
        let mut cmd = self.command("mariadbd")?;
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--socket={}", root.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", root.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", self.log_path().display()))
            .arg(format!("--tmpdir={}", root.join("tmp").display()))
            .args(["--bind-address=127.0.0.1", &format!("--port={}", self.port)])
            .args(["--skip-name-resolve", "--default-storage-engine=InnoDB"])
            .arg(format!(
                "--innodb-flush-log-at-trx-commit={}",
                self.spec.flush_log_at_trx_commit
            ))
            .arg(format!("--sync-binlog={}", self.spec.sync_binlog))
            // The binary log, as replication needs it: every commit is a two-phase one between
            // it and InnoDB.
            .arg(format!(
                "--log-bin={}",
                self.data_dir().join("binlog").display()
            ))
            .arg("--server-id=1")
            // fsync, not O_DIRECT (a FUSE mount takes no O_DIRECT): durability by the calls the
            // lost-writes filesystem sees.
            .args(["--innodb-flush-method=fsync", "--innodb-use-native-aio=0"])
            .args(["--innodb-buffer-pool-size=64M", "--max-connections=200"]);
        if self.run_as.is_some() {
            cmd.arg("--user=mysql");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut probe = self.command("mariadb-admin")?;
        probe
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
            ])
            .args(["-u", "root", "--connect-timeout=2", "ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let ready = move || {
            probe
                .status()
                .map(|s| s.success())
                .map_err(io("run mariadb-admin"))
        };
        let log = self.log_path();
        self.server.spawn_and_wait(
            &mut cmd,
            ready,
            (MARIADB_START_TIMEOUT, Duration::from_millis(50)),
            &log,
        )
    }
}

/// Where MariaDB's `name` is.
fn program(name: &str) -> Result<PathBuf, ProcessError> {
    mariadb_bin(name).ok_or(ProcessError::MariaDbMissing)
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        // SIGKILL, not a clean shutdown: nothing of a throwaway server needs to survive, and the
        // temporary directory goes with it.
        let _ = self.kill9();
        own_dir(self.root.path(), false);
    }
}

#[cfg(all(test, has_mariadb))]
mod tests;
