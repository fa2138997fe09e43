//! A service process: started with `--listen 127.0.0.1:PORT` on a port chosen once (so a restart
//! comes back at the same address), ready when it prints `listening on ADDR` on standard output,
//! its standard error appended to a log file.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{ProcessError, free_port, io, kill_group, tail};

/// How long a start may take before it is an error.
pub const SERVICE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// A short name for messages and reports (`id-1`, `wallet`).
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments (`--listen` is added).
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where its standard error goes (appended across restarts).
    pub log: PathBuf,
}

/// A running (or killed) service process.
#[derive(Debug)]
pub struct Service {
    spec: ServiceSpec,
    port: u16,
    child: Option<Child>,
    starts: u32,
    kills: u32,
}

impl Service {
    /// Starts the service on a free loopback port and waits until it listens.
    ///
    /// # Errors
    /// It cannot be spawned, or exits or stays silent before listening.
    pub fn start(spec: ServiceSpec) -> Result<Self, ProcessError> {
        let mut service = Self {
            spec,
            port: free_port()?,
            child: None,
            starts: 0,
            kills: 0,
        };
        service.spawn()?;
        Ok(service)
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its loopback port (kept across restarts).
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The pid while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts so far (1 after [`Service::start`]).
    #[must_use]
    pub const fn starts(&self) -> u32 {
        self.starts
    }

    /// kill -9s so far.
    #[must_use]
    pub const fn kills(&self) -> u32 {
        self.kills
    }

    /// Its log file.
    #[must_use]
    pub fn log(&self) -> &std::path::Path {
        &self.spec.log
    }

    /// SIGKILLs it (nothing unsynced survives in its memory) and reaps it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        self.kills += 1;
        kill_group(&mut child, &self.spec.name)
    }

    /// Whether it is down: never restarted after a kill, a restart that failed, or exited on
    /// its own (a fail-stop, a crash; then reaped).
    pub fn is_down(&mut self) -> bool {
        let exited = self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited {
            self.child = None;
        }
        self.child.is_none()
    }

    /// SIGSTOPs it and every process it started: its connections stay open, nothing is
    /// answered until [`Service::resume`].
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), true, &self.spec.name)
    }

    /// SIGCONTs what [`Service::pause`] stopped.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn resume(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), false, &self.spec.name)
    }

    /// Starts it again at the same address (after [`Service::kill9`] or [`Service::stop`]).
    ///
    /// # Errors
    /// As [`Service::start`].
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        if self.child.is_some() {
            self.kill9()?;
        }
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), ProcessError> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
            .map_err(io(format!("open {}", self.spec.log.display())))?;
        let mut child = Command::new(&self.spec.program)
            .args(&self.spec.args)
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(io(format!(
                "start {} ({})",
                self.spec.name,
                self.spec.program.display()
            )))?;
        crate::own_group(&child);
        let stdout = child.stdout.take();
        self.child = Some(child);
        let ready = stdout.map_or(Err("no standard output".to_owned()), wait_listening);
        match ready {
            Ok(()) => {
                self.starts += 1;
                Ok(())
            }
            Err(why) => {
                let _ = self.kill9();
                self.kills = self.kills.saturating_sub(1);
                Err(ProcessError::NotReady {
                    what: format!("{} ({why})", self.spec.name),
                    timeout_s: SERVICE_START_TIMEOUT.as_secs(),
                    log_tail: tail(&self.spec.log, 15),
                })
            }
        }
    }
}

/// Waits for the `listening on` line; keeps draining standard output afterwards so that the
/// child never blocks on a full pipe.
fn wait_listening(stdout: std::process::ChildStdout) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next();
        let _ = tx.send(first);
        for _ in lines {}
    });
    match rx.recv_timeout(SERVICE_START_TIMEOUT) {
        Ok(Some(Ok(line))) if line.starts_with("listening on ") => Ok(()),
        Ok(Some(Ok(line))) => Err(format!("unexpected first line {line:?}")),
        Ok(_) => Err("exited before listening".to_owned()),
        Err(_) => Err("no `listening on` line in time".to_owned()),
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}
