//! A throwaway Redis.
//!
//! [`Redis::start`] runs `redis-server` (Debian package `redis-server`) on a free loopback port
//! with its own data directory and the persistence asked for ([`RedisPersistence`]), in its own
//! process group, and waits until it answers `PING`. [`Redis::kill9`] SIGKILLs it and
//! [`Redis::restart`] starts it again on the same directory, so that a test sees exactly what a
//! crash keeps: with RDB snapshots only, every write since the last snapshot is gone; with the
//! append-only file, what reached the file survives a crash of the process (the kernel's page
//! cache keeps it), whether or not it was fsynced. Losing the unsynced part takes a power loss,
//! which a process crash is not. Dropping the value kills the server and removes the directory.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::server::ServerProcess;
use crate::{LostFs, LostFsEffects, ProcessError, io, own_dir};

/// How long a start may take before it is an error.
pub const REDIS_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How the server persists writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisPersistence {
    /// RDB snapshots only: one after `after_s` seconds with at least one change (`save after_s
    /// 1`); no append-only file. A crash loses every write since the last snapshot.
    Rdb {
        /// Seconds between a change and the snapshot that keeps it.
        after_s: u32,
    },
    /// The append-only file, `appendfsync everysec`: written on every command, fsynced about
    /// once a second. A process crash loses nothing written; a power loss up to a second.
    AofEverysec,
    /// The append-only file, `appendfsync always`: fsynced before every reply.
    AofAlways,
}

impl RedisPersistence {
    fn args(self) -> Vec<String> {
        let strings = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        match self {
            Self::Rdb { after_s } => {
                let mut a = strings(&["--appendonly", "no", "--save"]);
                a.push(format!("{after_s} 1"));
                a
            }
            Self::AofEverysec => strings(&["--appendonly", "yes", "--appendfsync", "everysec"]),
            Self::AofAlways => strings(&["--appendonly", "yes", "--appendfsync", "always"]),
        }
    }
}

pub use hostprobe::redis_server_bin;

/// A throwaway Redis server (see the module documentation).
#[derive(Debug)]
pub struct Redis {
    bin: PathBuf,
    persistence: RedisPersistence,
    /// The server's process and the lost-writes filesystem under the data directory, when
    /// asked for (declared before `root`: it unmounts before the directory goes).
    server: ServerProcess,
    /// Kept for its `Drop`: removes the data directory.
    root: tempfile::TempDir,
    port: u16,
    starts: u32,
}

impl Redis {
    /// Starts a server on a fresh data directory.
    ///
    /// # Errors
    /// [`ProcessError::RedisMissing`] when `redis-server` is absent; start failures.
    pub fn start(persistence: RedisPersistence) -> Result<Self, ProcessError> {
        Self::start_with(persistence, false)
    }

    /// Starts a server on a fresh data directory; with `lose_unsynced`, the data directory is a
    /// [`LostFs`] mount, so that [`Redis::power_loss`] can drop what Redis wrote and did not
    /// sync.
    ///
    /// # Errors
    /// As [`Redis::start`]; the mount failed.
    pub fn start_with(
        persistence: RedisPersistence,
        lose_unsynced: bool,
    ) -> Result<Self, ProcessError> {
        let bin = redis_server_bin().ok_or(ProcessError::RedisMissing)?;
        let root = tempfile::Builder::new()
            .prefix("bench-redis-")
            .tempdir()
            .map_err(io("create a temporary directory"))?;
        own_dir(root.path(), true);
        let data = root.path().join("data");
        fs::create_dir(&data).map_err(io("create the data directory"))?;
        let lostfs = if lose_unsynced {
            let backing = root.path().join("disk");
            fs::create_dir(&backing).map_err(io("create the backing directory"))?;
            Some(LostFs::mount(&backing, &data)?)
        } else {
            None
        };
        let mut redis = Self {
            bin,
            persistence,
            server: ServerProcess::new("redis-server", "Redis", lostfs),
            root,
            port: 0,
            starts: 0,
        };
        redis.start_server()?;
        Ok(redis)
    }

    /// The data directory (`dump.rdb`, `appendonlydir/`).
    #[must_use]
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The server log (appended to across restarts).
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("redis.log")
    }

    /// The loopback port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// A `redis://` URL of the server.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// How it persists.
    #[must_use]
    pub const fn persistence(&self) -> RedisPersistence {
        self.persistence
    }

    /// How many times the server was started (1 after [`Redis::start`]).
    #[must_use]
    pub const fn starts(&self) -> u32 {
        self.starts
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

    /// SIGKILLs the server and waits for it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        self.server.kill9()
    }

    /// A power loss: the server is killed, then every write it had not synced is dropped (it
    /// must have been started with `lose_unsynced`). Restart it with [`Redis::restart`].
    ///
    /// # Errors
    /// The kill failed, or the data directory is not a lost-writes mount.
    pub fn power_loss(&mut self) -> Result<LostFsEffects, ProcessError> {
        self.server.power_loss()
    }

    /// What the lost-writes filesystem under the data directory did, if there is one.
    #[must_use]
    pub fn lost_writes(&self) -> Option<LostFsEffects> {
        self.server.lost_writes()
    }

    /// Starts the server again on the same data directory and port (after [`Redis::kill9`] it
    /// loads what its files kept).
    ///
    /// # Errors
    /// The start failed.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill9()?;
        self.start_server()
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
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.data_dir())
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(["--save", ""])
            .args(self.persistence.args())
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let port = self.port;
        // Loading a large file answers `-LOADING`: not ready yet.
        let ready = move || Ok(ping(port).is_ok_and(|reply| reply.starts_with("+PONG")));
        let log = self.log_path();
        self.server.spawn_and_wait(
            &mut cmd,
            ready,
            (REDIS_START_TIMEOUT, Duration::from_millis(20)),
            &log,
        )
    }
}

/// Sends `PING` and returns the first reply line.
fn ping(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0_u8; 64];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.kill9();
        own_dir(self.root.path(), false);
    }
}

#[cfg(test)]
mod tests;
