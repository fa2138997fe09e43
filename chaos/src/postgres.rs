//! A throwaway PostgreSQL.
//!
//! [`Postgres::start`] runs `initdb` into a fresh temporary directory, starts `postgres` on a free
//! loopback port with **fsync on** (`fsync`, `synchronous_commit` and `full_page_writes` all on,
//! unlike test helpers that switch them off), and waits until it accepts connections
//! (`pg_isready`). [`Postgres::kill9`] SIGKILLs the whole server (postmaster and backends, one
//! process group) and [`Postgres::restart`] starts it again on the same data directory, so a
//! test sees exactly what a crash of the database keeps. Dropping the value kills the server and
//! removes the directory.
//!
//! PostgreSQL refuses to run as root. When this process is root, the data directory is given to
//! the `postgres` user and the server runs under that user's uid and gid (no `sudo`,
//! `runuser` or `setpriv` involved).

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::unistd::{Gid, Uid, User, chown};

use crate::server::ServerProcess;
use crate::{ProcessError, io, own_dir};

/// The role and database every throwaway server has.
pub const PG_USER: &str = "bench";
/// How long a start may take before it is an error.
pub const PG_START_TIMEOUT: Duration = Duration::from_secs(60);

pub use hostprobe::postgres_bin_dir;

/// A free TCP port on 127.0.0.1 (free when asked; a start retries if it is taken meanwhile).
///
/// # Errors
/// The bind failed.
pub fn free_port() -> Result<u16, ProcessError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind 127.0.0.1:0"))?;
    Ok(listener.local_addr().map_err(io("local_addr"))?.port())
}

/// Who the server runs as: `None` is this process's own user.
fn run_as() -> Result<Option<(Uid, Gid)>, ProcessError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres")
        .ok()
        .flatten()
        .ok_or(ProcessError::NoPostgresUser)?;
    Ok(Some((user.uid, user.gid)))
}

fn chown_tree(path: &Path, uid: Uid, gid: Gid) -> Result<(), ProcessError> {
    chown(path, Some(uid), Some(gid)).map_err(|e| ProcessError::Io {
        what: format!("chown {}", path.display()),
        source: e.into(),
    })?;
    if path.is_dir() {
        for entry in fs::read_dir(path).map_err(io(format!("read {}", path.display())))? {
            let entry = entry.map_err(io(format!("read {}", path.display())))?;
            chown_tree(&entry.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// A throwaway PostgreSQL server (see the module documentation).
#[derive(Debug)]
pub struct Postgres {
    bin_dir: PathBuf,
    run_as: Option<(Uid, Gid)>,
    /// The server's process and the lost-writes filesystem under the data directory, when
    /// asked for (declared before `root`: it unmounts before the directory goes).
    server: ServerProcess,
    /// Kept for its `Drop`: removes the data directory.
    root: tempfile::TempDir,
    port: u16,
    starts: u32,
    /// TLS on (`ssl=on`, with the certificate written by [`Postgres::enable_tls`]).
    tls: bool,
}

impl Postgres {
    /// Initialises a new data directory and starts the server on it.
    ///
    /// # Errors
    /// [`ProcessError::PostgresMissing`] when the binaries are absent; `initdb` or start failures.
    pub fn start() -> Result<Self, ProcessError> {
        Self::start_with(false)
    }

    /// [`Postgres::start`]; with `lose_unsynced`, the data directory is a [`crate::LostFs`]
    /// mount, so that [`Postgres::power_loss`] can drop what the server wrote and did not sync.
    ///
    /// # Errors
    /// As [`Postgres::start`]; the mount failed.
    pub fn start_with(lose_unsynced: bool) -> Result<Self, ProcessError> {
        let bin_dir = postgres_bin_dir().ok_or(ProcessError::PostgresMissing)?;
        let run_as = run_as()?;
        let root = tempfile::Builder::new()
            .prefix("bench-pg-")
            .tempdir()
            .map_err(io("create a temporary directory"))?;
        own_dir(root.path(), true);
        fs::create_dir(root.path().join("sock")).map_err(io("create the socket directory"))?;
        let lostfs = if lose_unsynced {
            let (backing, data) = (root.path().join("disk"), root.path().join("data"));
            fs::create_dir(&backing).map_err(io("create the backing directory"))?;
            fs::create_dir(&data).map_err(io("create the data directory"))?;
            if let Some((uid, gid)) = run_as {
                chown_tree(root.path(), uid, gid)?;
            }
            Some(crate::LostFs::mount(&backing, &data)?)
        } else {
            if let Some((uid, gid)) = run_as {
                chown_tree(root.path(), uid, gid)?;
            }
            None
        };
        let mut pg = Self {
            bin_dir,
            run_as,
            server: ServerProcess::new("postgres", "PostgreSQL", lostfs),
            root,
            port: 0,
            starts: 0,
            tls: false,
        };
        pg.initdb()?;
        pg.start_server()?;
        Ok(pg)
    }

    /// The data directory.
    #[must_use]
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The server log (appended to across restarts).
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("postgres.log")
    }

    /// The loopback port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// How many times the server was started (1 after [`Postgres::start`]).
    #[must_use]
    pub const fn starts(&self) -> u32 {
        self.starts
    }

    /// A connection URL for database `postgres` as the superuser [`PG_USER`] (trust auth on
    /// loopback; the server listens on nothing else).
    #[must_use]
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// A connection URL for another database of this server.
    #[must_use]
    pub fn url_for(&self, database: &str) -> String {
        self.url_via(database, self.port)
    }

    /// [`Postgres::url_for`] through another port (a fault proxy in front of this server).
    #[must_use]
    pub fn url_via(&self, database: &str, port: u16) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{port}/{database}?connect_timeout=5")
    }

    /// Creates database `name` (an existing one is kept).
    ///
    /// # Errors
    /// `createdb` failed for another reason.
    pub fn create_database(&self, name: &str) -> Result<(), ProcessError> {
        let out = self
            .command("createdb")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
                name,
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(io("run createdb"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || stderr.contains("already exists") {
            return Ok(());
        }
        Err(ProcessError::Command {
            what: format!("createdb {name}"),
            detail: format!("{}: {}", out.status, stderr.trim()),
        })
    }

    /// Pauses the server (SIGSTOP to its process group): it keeps its connections and its
    /// memory, and answers nothing until [`Self::resume`].
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

    /// SIGKILLs the postmaster and every backend (one process group) and waits for them.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        self.server.kill9()
    }

    /// A power loss: the server is killed, then every write it had not synced is dropped (it
    /// must have been started with `lose_unsynced`). Restart it with [`Postgres::restart`].
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

    /// Turns TLS on: writes the certificate and its key (PEM) into the data directory as the
    /// server's own (`server.crt`, `server.key`, the key readable by its owner alone) and
    /// restarts the server with `ssl=on`. Clients may then connect with `sslmode=require`.
    ///
    /// # Errors
    /// A file cannot be written, or the restart failed.
    pub fn enable_tls(&mut self, cert_pem: &str, key_pem: &str) -> Result<(), ProcessError> {
        use std::os::unix::fs::PermissionsExt;
        let data = self.data_dir();
        let (cert, key) = (data.join("server.crt"), data.join("server.key"));
        fs::write(&cert, cert_pem).map_err(io("write server.crt"))?;
        fs::write(&key, key_pem).map_err(io("write server.key"))?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600))
            .map_err(io("make server.key private"))?;
        if let Some((uid, gid)) = self.run_as {
            for file in [&cert, &key] {
                nix::unistd::chown(file.as_path(), Some(uid), Some(gid)).map_err(|e| {
                    ProcessError::Command {
                        what: "chown the TLS files".into(),
                        detail: e.to_string(),
                    }
                })?;
            }
        }
        self.tls = true;
        self.restart()
    }

    /// Starts the server again on the same data directory (after [`Postgres::kill9`] it runs
    /// crash recovery), on the same port when it is still free.
    ///
    /// # Errors
    /// The start failed.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill9()?;
        self.start_server()
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd.current_dir(self.root.path()).env("LC_ALL", "C");
        cmd
    }

    fn initdb(&self) -> Result<(), ProcessError> {
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", PG_USER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            .stdin(Stdio::null())
            .output()
            .map_err(io("run initdb"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(ProcessError::Command {
            what: "initdb".into(),
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
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io("open the server log"))?;
        let log_err = log.try_clone().map_err(io("open the server log"))?;
        let socket_dir = self.root.path().join("sock");
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("port={}", self.port)])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", socket_dir.display()))
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "full_page_writes=on", "-c", "max_connections=200"])
            .args(["-c", if self.tls { "ssl=on" } else { "ssl=off" }])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let mut probe = self.command("pg_isready");
        probe
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
            ])
            .args(["-d", "postgres", "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let ready = move || {
            probe
                .status()
                .map(|s| s.success())
                .map_err(io("run pg_isready"))
        };
        let log = self.log_path();
        self.server.spawn_and_wait(
            &mut cmd,
            ready,
            (PG_START_TIMEOUT, Duration::from_millis(50)),
            &log,
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGKILL, not a clean shutdown: nothing of a throwaway server needs to survive, and the
        // temporary directory goes with it.
        let _ = self.kill9();
        own_dir(self.root.path(), false);
    }
}
