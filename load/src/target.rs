//! The system under test: a fresh `sut-server` child process on 127.0.0.1 with a temporary
//! database (the default), or a running server given its base URL; and the `/proc` sampler of
//! the server process (CPU % from `/proc/PID/stat` utime+stime, RSS from `/proc/PID/status`
//! `VmRSS`), once per second.
//!
//! Binary lookup (in order): `$SUT_SERVER` if set; `sut-server` in the directory of the current
//! executable or its parent (a binary in `target/{debug,release}/`, a test in
//! `target/{debug,release}/deps/`). It is never built implicitly: build it with
//! `cargo build [--release] -p sut-server --bin sut-server` (`cargo test --workspace` builds it
//! too).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reports::model::ResourceSample;

use crate::LoadError;

/// Clock ticks per second of `/proc/PID/stat` times (`sysconf(_SC_CLK_TCK)`; 100 on every Linux
/// architecture this runs on).
pub const CLK_TCK: f64 = 100.0;
/// How often the sampler samples.
pub const SAMPLE_PERIOD_MS: u64 = 1_000;
/// Longest wait for a started server's `listening on` line.
pub const START_TIMEOUT_MS: u64 = 30_000;

/// Finds the `sut-server` binary (see the module doc).
///
/// # Errors
/// [`LoadError::ServerBinary`] when it is nowhere to be found.
pub fn find_server_binary() -> Result<PathBuf, LoadError> {
    if let Some(p) = std::env::var_os("SUT_SERVER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(LoadError::ServerBinary(format!(
                "$SUT_SERVER={} is not a file",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|e| LoadError::ServerBinary(e.to_string()))?;
    let mut tried = Vec::new();
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let cand = d.join("sut-server");
        if cand.is_file() {
            return Ok(cand);
        }
        tried.push(cand.display().to_string());
        dir = d.parent();
    }
    Err(LoadError::ServerBinary(format!(
        "sut-server not found (tried {}); build it with \
         `cargo build -p sut-server --bin sut-server` (add --release to match a release `load`) \
         or set $SUT_SERVER",
        tried.join(", ")
    )))
}

/// 48 hex digits from the OS (or the clock, where there is no `/dev/urandom`: still unique
/// per run, loopback only).
pub(crate) fn random_hex() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes[..16].copy_from_slice(&nanos.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The admin secret of every server this process starts (random per process).
#[must_use]
pub fn bench_admin_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(random_hex)
}

/// The service credential (coordinator → participants) of every server this process starts:
/// random per process, never the admin secret.
#[must_use]
pub fn bench_service_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut token = random_hex();
        while token == bench_admin_token() {
            token = random_hex();
        }
        token
    })
}

/// A `sut-server` child process on a database file.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// `127.0.0.1:PORT` (a restart listens on it again).
    pub addr: String,
}

impl ServerProcess {
    /// Starts `bin --db db --listen listen` (e.g. `127.0.0.1:0`; plus `extra` arguments) and
    /// waits for its `listening on ADDR` line.
    ///
    /// # Errors
    /// It cannot be spawned, or exits or stays silent before saying where it listens.
    pub fn start(bin: &Path, db: &Path, listen: &str, extra: &[&str]) -> Result<Self, LoadError> {
        let mut child = Command::new(bin)
            .arg("--db")
            .arg(db)
            .args(["--listen", listen])
            .args(extra)
            .env(crate::ADMIN_TOKEN_ENV, bench_admin_token())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| LoadError::Server(format!("spawn {}: {e}", bin.display())))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| LoadError::Server("no stdout".to_owned()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // keep draining so that the child never blocks on a full pipe
            for _ in lines {}
        });
        let first = rx
            .recv_timeout(Duration::from_millis(START_TIMEOUT_MS))
            .map_err(|_| {
                let _ = child.kill();
                LoadError::Server("no `listening on` line in time".to_owned())
            })?;
        let line = match first {
            Some(Ok(l)) => l,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LoadError::Server(format!(
                    "server exited before listening: {other:?}"
                )));
            }
        };
        let Some(addr) = line.strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LoadError::Server(format!("unexpected first line {line:?}")));
        };
        Ok(Self {
            base_url: format!("http://{}", addr.trim()),
            addr: addr.trim().to_owned(),
            child,
        })
    }

    /// The child's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL (`Child::kill` on Unix) and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (graceful shutdown) via `kill -TERM`, waiting up to 10 s, then SIGKILL.
    pub fn stop(&mut self) {
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if term.is_ok() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// CPU ticks (utime + stime) of a process from the text of `/proc/PID/stat`.
#[must_use]
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // the command name (field 2) is in parentheses and may contain spaces: split after it
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` in bytes from the text of `/proc/PID/status`.
#[must_use]
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Samples a process's CPU % and RSS once per [`SAMPLE_PERIOD_MS`] on its own thread until
/// stopped (or the process is gone).
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<ResourceSample>>,
}

impl Sampler {
    /// Starts sampling `pid`; `t_s` of each sample counts from `start`.
    #[must_use]
    pub fn start(pid: u32, start: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let stat_path = format!("/proc/{pid}/stat");
            let status_path = format!("/proc/{pid}/status");
            let mut out = Vec::new();
            let mut last: Option<(Instant, u64)> = None;
            while !flag.load(Ordering::Relaxed) {
                let now = Instant::now();
                let Some(ticks) = std::fs::read_to_string(&stat_path)
                    .ok()
                    .as_deref()
                    .and_then(parse_stat_ticks)
                else {
                    break;
                };
                let rss = std::fs::read_to_string(&status_path)
                    .ok()
                    .as_deref()
                    .and_then(parse_status_rss)
                    .unwrap_or(0);
                if let Some((t, prev)) = last {
                    let dt = now.duration_since(t).as_secs_f64();
                    if dt > 0.0 {
                        let cpu_pct = (ticks.saturating_sub(prev) as f64 / CLK_TCK) / dt * 100.0;
                        out.push(ResourceSample {
                            t_s: now.duration_since(start).as_secs_f64(),
                            cpu_pct,
                            rss_bytes: rss,
                        });
                    }
                }
                last = Some((now, ticks));
                // sleep in small steps so that stop is prompt
                let until = now + Duration::from_millis(SAMPLE_PERIOD_MS);
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            out
        });
        Self { stop, handle }
    }

    /// Stops and returns the samples.
    #[must_use]
    pub fn finish(self) -> Vec<ResourceSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// For tests: the `sut-server` binary, built now when it is missing. `cargo test --workspace`
/// (and `cargo build`) build it, `cargo test -p load` does not (cargo releases its build lock
/// before running tests, so building here is safe).
///
/// # Panics
/// When the build fails.
#[doc(hidden)]
pub fn ensure_server_binary() {
    if find_server_binary().is_ok() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let exe = std::env::current_exe().unwrap();
    let release = exe.components().any(|c| c.as_os_str() == "release");
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-p", "sut-server", "--bin", "sut-server"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().unwrap();
    assert!(status.success(), "building sut-server failed");
    find_server_binary().unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "1234 (sut server) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 9 0 \
                    100 1000000 300 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(300));
        let status = "Name:\tsut-server\nVmPeak:\t  9000 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(parse_status_rss(status), Some(2048 * 1024));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn samples_this_process() {
        let ticks = || {
            std::fs::read_to_string("/proc/self/stat")
                .ok()
                .as_deref()
                .and_then(parse_stat_ticks)
                .unwrap()
        };
        let s = Sampler::start(std::process::id(), Instant::now());
        // burn 0.3 s of CPU (however long that takes on a busy machine) for at least one period,
        // then idle for one more period so that the sampler has seen all of it
        let (t0, c0) = (Instant::now(), ticks());
        let mut x = 0u64;
        while ticks() < c0 + 30 || t0.elapsed() < Duration::from_millis(1_150) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        assert!(x != 1);
        std::thread::sleep(Duration::from_millis(SAMPLE_PERIOD_MS + 150));
        let samples = s.finish();
        assert!(!samples.is_empty());
        assert!(samples.iter().any(|s| s.cpu_pct > 0.0), "{samples:?}");
        assert!(samples.iter().all(|s| s.rss_bytes > 0), "{samples:?}");
    }
}
