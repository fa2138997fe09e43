//! A user's own service, started from a shell command line: the bench owns it (its process
//! group, SIGKILLed when dropped), restarts it with the same command, pauses it, and can run it
//! on a [`crate::FakeClock`]. It is ready when its port accepts a TCP connection: the command
//! knows its own port (the bench does not pass one).

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ProcessError, io, kill_group, tail};

/// How long a start may take before it is an error.
pub const COMMAND_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one readiness probe waits for the port.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// How to start a user's service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    /// A short name for messages and reports (`server-1`).
    pub name: String,
    /// The command line, run by `sh -c` (so it may set variables, `cd`, `exec …`).
    pub command: String,
    /// The loopback port it listens on once ready.
    pub port: u16,
    /// Extra environment variables (a fake clock's, for one).
    pub env: Vec<(String, String)>,
    /// Where its standard output and error go (appended across restarts).
    pub log: PathBuf,
    /// The network namespace it runs in (`ip netns exec`; a [`crate::NetLab`] node), listening
    /// on that node's address; `None`: this machine's, on loopback.
    pub netns: Option<crate::InNetns>,
}

/// A running (or killed) user's service.
#[derive(Debug)]
pub struct CommandService {
    spec: CommandSpec,
    child: Option<Child>,
    starts: u32,
}

impl CommandService {
    /// Runs the command and waits until its port accepts connections.
    ///
    /// # Errors
    /// It cannot be spawned, or exits or does not listen within [`COMMAND_START_TIMEOUT`].
    pub fn start(spec: CommandSpec) -> Result<Self, ProcessError> {
        let mut service = Self {
            spec,
            child: None,
            starts: 0,
        };
        service.spawn()?;
        Ok(service)
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The pid of the shell that runs the command, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts so far (1 after [`CommandService::start`]).
    #[must_use]
    pub const fn starts(&self) -> u32 {
        self.starts
    }

    /// Its log file.
    #[must_use]
    pub fn log(&self) -> &std::path::Path {
        &self.spec.log
    }

    /// SIGKILLs it and everything it started, and reaps it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        match self.child.take() {
            Some(mut child) => kill_group(&mut child, &self.spec.name),
            None => Ok(()),
        }
    }

    /// SIGSTOPs it and everything it started.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), true, &self.spec.name)
    }

    /// SIGCONTs what [`CommandService::pause`] stopped.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn resume(&self) -> Result<(), ProcessError> {
        crate::pause_or_resume(self.child.as_ref(), false, &self.spec.name)
    }

    /// Whether the process has exited on its own or was killed and not restarted.
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

    /// Runs the command again (after a kill) and waits until it listens.
    ///
    /// # Errors
    /// As [`CommandService::start`].
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill9()?;
        self.spawn()
    }

    /// Whether every process it started is stopped (state `T` in `/proc/PID/stat`): what
    /// [`CommandService::pause`] must leave behind.
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) else {
            return false;
        };
        std::iter::once(pid)
            .chain(crate::descendants(pid))
            .all(|p| crate::state_of(p).is_none_or(|state| state == 'T'))
    }

    /// Whether any process of its group has `library` mapped (a preloaded libfaketime).
    #[must_use]
    pub fn maps_library(&self, library: &std::path::Path) -> bool {
        let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) else {
            return false;
        };
        let name = library.display().to_string();
        std::iter::once(pid)
            .chain(crate::descendants(pid))
            .any(|p| fs::read_to_string(format!("/proc/{p}/maps")).is_ok_and(|m| m.contains(&name)))
    }

    fn spawn(&mut self) -> Result<(), ProcessError> {
        let open_log = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.spec.log)
                .map_err(io(format!("open {}", self.spec.log.display())))
        };
        let (out, err) = (open_log()?, open_log()?);
        let mut cmd = match &self.spec.netns {
            Some(place) => {
                let mut cmd = Command::new("ip");
                cmd.args([
                    "netns",
                    "exec",
                    &place.netns,
                    "sh",
                    "-c",
                    &self.spec.command,
                ]);
                cmd
            }
            None => {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", &self.spec.command]);
                cmd
            }
        };
        let child = cmd
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(io(format!("start {} (sh -c …)", self.spec.name)))?;
        crate::own_group(&child);
        self.child = Some(child);
        match self.wait_listening() {
            Ok(()) => {
                self.starts += 1;
                Ok(())
            }
            Err(why) => {
                let _ = self.kill9();
                Err(ProcessError::NotReady {
                    what: format!(
                        "{} (`{}`, port {}: {why})",
                        self.spec.name, self.spec.command, self.spec.port
                    ),
                    timeout_s: COMMAND_START_TIMEOUT.as_secs(),
                    log_tail: tail(&self.spec.log, 15),
                })
            }
        }
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let host = self
            .spec
            .netns
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |place| place.addr);
        let addr = SocketAddr::from((host, self.spec.port));
        let deadline = Instant::now() + COMMAND_START_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("exited with {status} before listening"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("not listening in time".to_owned())
    }
}

impl Drop for CommandService {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str, port: u16, dir: &std::path::Path) -> CommandSpec {
        CommandSpec {
            name: "user-service".into(),
            command: command.into(),
            port,
            env: Vec::new(),
            log: dir.join("service.log"),
            netns: None,
        }
    }

    #[test]
    fn a_command_that_never_listens_is_refused_with_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::free_port().expect("port");
        let err = CommandService::start(spec("echo booting; exit 3", port, dir.path()))
            .expect_err("it exits before listening");
        let text = err.to_string();
        assert!(text.contains("exited with"), "{text}");
        assert!(text.contains("booting"), "the log's tail is shown: {text}");
    }

    #[test]
    fn a_listening_command_is_ready_and_comes_back_after_a_kill() {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::free_port().expect("port");
        // Readiness is the port accepting connections: the test holds the port, the command
        // only has to live (no listener program is needed on the machine).
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        let mut service =
            CommandService::start(spec("exec sleep 30", port, dir.path())).expect("ready");
        assert_eq!(service.starts(), 1);
        assert!(!service.is_down());
        service.kill9().expect("kill");
        assert!(service.is_down());
        service.restart().expect("restart");
        assert_eq!(service.starts(), 2);
        drop(listener);
    }
}
