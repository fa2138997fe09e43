//! Real processes the bench owns (docs/deployment.md): a throwaway PostgreSQL
//! ([`Postgres`]), service processes that print `listening on ADDR` ([`Service`]), and the
//! multi-process deployment of `sut-server` roles on one PostgreSQL ([`Deployment`]).
//!
//! Everything started here runs in its own process group and is SIGKILLed when its owner is
//! dropped (on success, on error and on panic); temporary directories go with it. A runner that
//! must survive Ctrl-C installs a handler that drops its [`Deployment`].

mod deployment;
mod postgres;
mod service;

pub use deployment::{Backend, Deployment, DeploymentSpec, RoleProcess};
pub use postgres::{PG_START_TIMEOUT, PG_USER, Postgres, free_port, postgres_bin_dir};
pub use service::{Service, ServiceSpec};

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// What went wrong while starting or driving a process.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The PostgreSQL binaries were not found.
    #[error(
        "PostgreSQL not found: no `initdb` on PATH or in /usr/lib/postgresql/*/bin \
         (Debian: apt-get install postgresql)"
    )]
    PostgresMissing,
    /// Running as root, but there is no `postgres` user to run the server as.
    #[error("running as root and there is no `postgres` user to run PostgreSQL as")]
    NoPostgresUser,
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

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// SIGKILLs the process group `child` leads, reaps the leader and waits (up to 5 s) until no
/// member is left.
fn kill_group(child: &mut Child, what: &str) -> Result<(), ClusterError> {
    let pid = i32::try_from(child.id()).map_err(|_| ClusterError::Command {
        what: format!("kill {what}"),
        detail: format!("pid {} out of range", child.id()),
    })?;
    match killpg(Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            return Err(ClusterError::Io {
                what: format!("kill -9 {what} (process group {pid})"),
                source: e.into(),
            });
        }
    }
    child.wait().map_err(io(format!("wait for {what}")))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while killpg(Pid::from_raw(pid), None).is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
