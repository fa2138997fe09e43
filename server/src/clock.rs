//! The real clock: the one place in the server (and in `sut`) where clocks are read.
//!
//! Every state machine takes a [`Now`] as a parameter (docs/architecture.md, "The rule", item
//! 1); this struct is what produces it for the real server: the wall clock from [`SystemTime`]
//! (which NTP or an operator may move) and a monotonic reading from an [`Instant`] taken at
//! start-up (TigerBeetle's `realtime()`/`monotonic()` split, see `sut::clock`).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sut::clock::Now;

/// Reads the process's clocks.
#[derive(Clone, Copy, Debug)]
pub struct RealClock {
    start: Instant,
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl RealClock {
    /// A clock whose monotonic reading starts at zero now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// The current reading. A wall clock before 1970 reads as 0 (the state machines then
    /// refuse, e.g. Snowflake's "before the epoch").
    #[must_use]
    pub fn now(&self) -> Now {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mono_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Now { wall_ms, mono_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mono_starts_near_zero_and_never_decreases() {
        let clock = RealClock::new();
        let a = clock.now();
        assert!(a.mono_ms < 1_000, "mono starts at start-up: {a:?}");
        assert!(
            a.wall_ms > 1_577_836_800_000,
            "wall clock is after 2020: {a:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = clock.now();
        assert!(b.mono_ms >= a.mono_ms + 4, "{a:?} then {b:?}");
    }
}
