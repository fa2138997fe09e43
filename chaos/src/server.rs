//! The process of a throwaway server the bench starts for real-system runs (PostgreSQL,
//! MariaDB, Redis): spawned in a process group of its own and owned (SIGKILLed with everything
//! below it when dropped or killed), paused and resumed, and power-cut when its data directory
//! is a lost-writes mount. Each server says how to start it and when it is ready.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::{LostFs, LostFsEffects, ProcessError, kill_group, tail};

/// A server's process, while it runs, and the lost-writes filesystem under its data.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    /// Its program, in messages (`postgres`).
    program: &'static str,
    /// Its product, in messages (`PostgreSQL`).
    product: &'static str,
    child: Option<Child>,
    lostfs: Option<LostFs>,
}

impl ServerProcess {
    /// Not started yet; `lostfs` is the mount under its data directory, if any.
    pub(crate) const fn new(
        program: &'static str,
        product: &'static str,
        lostfs: Option<LostFs>,
    ) -> Self {
        Self {
            program,
            product,
            child: None,
            lostfs,
        }
    }

    /// The server's pid while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Spawns `cmd` in a group of its own and waits until `ready` says it serves, polling every
    /// `poll` for at most `timeout`; the process exiting first, or the time running out, is an
    /// error with the end of `log`. A server that did not become ready is killed.
    pub(crate) fn spawn_and_wait(
        &mut self,
        cmd: &mut Command,
        ready: impl FnMut() -> Result<bool, ProcessError>,
        timing: (Duration, Duration),
        log: &Path,
    ) -> Result<(), ProcessError> {
        let child = cmd
            .process_group(0)
            .spawn()
            .map_err(crate::io(format!("start {}", self.program)))?;
        crate::own_group(&child);
        self.child = Some(child);
        let result = self.wait_ready(ready, timing, log);
        if result.is_err() {
            // Never leave a half-started server behind.
            let _ = self.kill9();
        }
        result
    }

    fn wait_ready(
        &mut self,
        mut ready: impl FnMut() -> Result<bool, ProcessError>,
        (timeout, poll): (Duration, Duration),
        log: &Path,
    ) -> Result<(), ProcessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(ProcessError::Command {
                    what: self.program.into(),
                    detail: format!("exited at start ({status}):\n{}", tail(log, 15)),
                });
            }
            if ready()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::NotReady {
                    what: self.product.into(),
                    timeout_s: timeout.as_secs(),
                    log_tail: tail(log, 15),
                });
            }
            std::thread::sleep(poll);
        }
    }

    /// SIGSTOPs the server and everything below it.
    pub(crate) fn pause(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), true, self.program)
    }

    /// SIGCONTs what [`ServerProcess::pause`] stopped.
    pub(crate) fn resume(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), false, self.program)
    }

    /// SIGKILLs the server and everything below it, and waits for them.
    pub(crate) fn kill9(&mut self) -> Result<(), ProcessError> {
        match self.child.take() {
            Some(mut child) => kill_group(&mut child, self.program),
            None => Ok(()),
        }
    }

    /// A power loss: the server killed, then every write it had not synced dropped.
    pub(crate) fn power_loss(&mut self) -> Result<LostFsEffects, ProcessError> {
        self.kill9()?;
        let lostfs = self.lostfs.as_ref().ok_or_else(|| ProcessError::Command {
            what: "power loss".into(),
            detail: format!(
                "{} was not started on a lost-writes filesystem",
                self.product
            ),
        })?;
        Ok(lostfs.power_loss())
    }

    /// What the lost-writes filesystem under the data directory did, if there is one.
    pub(crate) fn lost_writes(&self) -> Option<LostFsEffects> {
        self.lostfs.as_ref().map(LostFs::effects)
    }
}
