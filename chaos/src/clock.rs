//! A clock per process: libfaketime (Debian package `faketime`) preloaded into one process,
//! reading its offset from a control file this value rewrites. Jumps forward and back, skew and
//! strobe are rewrites of that file; the process's wall clock (`clock_gettime(CLOCK_REALTIME)`,
//! `gettimeofday`, `time`) follows at its next reading, its monotonic clock does not
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as with a real NTP step.
//!
//! The recipe that works with multithreaded servers: the `MT` library, `FAKETIME_NO_CACHE=1` (read
//! the file at every call), and a file rewritten atomically (a temporary file, then a rename), so
//! that a reading never sees half an offset.

use std::path::{Path, PathBuf};

use crate::{ProcessError, io};

pub use hostprobe::libfaketime_path;

/// One process's clock (see the module documentation).
#[derive(Debug)]
pub struct FakeClock {
    library: PathBuf,
    dir: tempfile::TempDir,
    offset_ms: i64,
    steps: u64,
}

impl FakeClock {
    /// A clock at offset zero.
    ///
    /// # Errors
    /// [`ProcessError::FaketimeMissing`] when libfaketime is not installed; the control file
    /// could not be written.
    pub fn new() -> Result<Self, ProcessError> {
        let library = libfaketime_path().ok_or(ProcessError::FaketimeMissing)?;
        let dir = tempfile::Builder::new()
            .prefix("bench-clock-")
            .tempdir()
            .map_err(io("create the clock's directory"))?;
        let clock = Self {
            library,
            dir,
            offset_ms: 0,
            steps: 0,
        };
        clock.write(0)?;
        Ok(clock)
    }

    /// The control file libfaketime reads.
    #[must_use]
    pub fn control_file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// The environment a process needs to run on this clock.
    #[must_use]
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.library.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.control_file().display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// The offset from the real clock now, ms.
    #[must_use]
    pub const fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// Steps taken (every [`FakeClock::set_offset_ms`] that changed the offset).
    #[must_use]
    pub const fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the offset from the real clock (negative: behind).
    ///
    /// # Errors
    /// The control file could not be rewritten.
    pub fn set_offset_ms(&mut self, offset_ms: i64) -> Result<(), ProcessError> {
        self.write(offset_ms)?;
        if offset_ms != self.offset_ms {
            self.steps += 1;
        }
        self.offset_ms = offset_ms;
        Ok(())
    }

    /// Steps the clock by `delta_ms` (negative: back).
    ///
    /// # Errors
    /// The control file could not be rewritten.
    pub fn jump_ms(&mut self, delta_ms: i64) -> Result<(), ProcessError> {
        self.set_offset_ms(self.offset_ms.saturating_add(delta_ms))
    }

    fn write(&self, offset_ms: i64) -> Result<(), ProcessError> {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let abs = offset_ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}\n", abs / 1000, abs % 1000);
        let tmp = self.dir.path().join("offset.tmp");
        write_then_rename(&tmp, &self.control_file(), &text)
    }
}

fn write_then_rename(tmp: &Path, to: &Path, text: &str) -> Result<(), ProcessError> {
    std::fs::write(tmp, text).map_err(io(format!("write {}", tmp.display())))?;
    std::fs::rename(tmp, to).map_err(io(format!("rename to {}", to.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `date +%s%3N` under `clock`: the process's wall clock, ms.
    fn date_ms(clock: &FakeClock) -> i64 {
        let out = Command::new("date")
            .arg("+%s%3N")
            .envs(clock.env())
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn real_ms() -> i64 {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    }

    #[test]
    #[cfg_attr(not(has_faketime), ignore = "libfaketime not installed")]
    fn a_process_reads_the_offset_and_follows_every_step() {
        let mut clock = FakeClock::new().unwrap();
        let near = |ms: i64, want: i64| (ms - want).abs() < 2_000;
        assert!(near(date_ms(&clock), real_ms()));
        clock.jump_ms(3_600_000).unwrap();
        assert!(near(date_ms(&clock), real_ms() + 3_600_000));
        clock.jump_ms(-3_630_000).unwrap();
        assert!(near(date_ms(&clock), real_ms() - 30_000));
        clock.set_offset_ms(-1_500).unwrap();
        assert_eq!(
            std::fs::read_to_string(clock.control_file()).unwrap(),
            "-1.500\n"
        );
        assert_eq!((clock.offset_ms(), clock.steps()), (-1_500, 3));
    }
}
