//! Per-node clocks on top of madsim's single global clock.
//!
//! madsim has one clock and no backward time. Each simulated node here has its own:
//!
//! - **wall** = simulated time + offset + accumulated drift. The nemesis bumps the offset
//!   forward or backward (Jepsen bumps up to ±288 s), strobes it (rapid back-and-forth) and
//!   changes the drift rate. The state lives in the world, not in the node, so a backward jump
//!   survives a restart.
//! - **monotonic** = time since the node (re)started, running at the node's drift rate. It never
//!   goes backward; a restart starts it again from zero.
//!
//! Everything is in integer milliseconds and parts per million, so runs replay exactly.

use serde::{Deserialize, Serialize};
use sut::clock::Now;

/// One node's clock state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeClock {
    /// Wall-clock offset in ms (changes by bumps and strobes).
    offset_ms: i64,
    /// Drift rate in parts per million (positive: the clock runs fast).
    drift_ppm: i64,
    /// Simulated time at which the current drift rate took effect.
    drift_since_ms: u64,
    /// Monotonic ms accumulated before the last drift change since boot.
    mono_base_ms: u64,
    /// Simulated time of the last drift change since boot (or boot itself).
    mono_since_ms: u64,
}

/// Epoch of the simulated wall clock: simulated time 0 is this Unix time (2025-01-01T00:00Z),
/// so Snowflake epochs and token expiries look realistic.
pub const WALL_EPOCH_MS: u64 = 1_735_689_600_000;

fn scaled(elapsed_ms: u64, drift_ppm: i64) -> i64 {
    let elapsed = i64::try_from(elapsed_ms).unwrap_or(i64::MAX);
    elapsed.saturating_mul(drift_ppm) / 1_000_000
}

impl NodeClock {
    /// The node's reading at simulated time `sim_ms`.
    #[must_use]
    pub fn now(&self, sim_ms: u64) -> Now {
        let drift = scaled(sim_ms.saturating_sub(self.drift_since_ms), self.drift_ppm);
        let wall =
            i64::try_from(WALL_EPOCH_MS + sim_ms).unwrap_or(i64::MAX) + self.offset_ms + drift;
        let since = sim_ms.saturating_sub(self.mono_since_ms);
        let mono = self.mono_base_ms as i64 + since as i64 + scaled(since, self.drift_ppm);
        Now {
            wall_ms: u64::try_from(wall.max(0)).unwrap_or(0),
            mono_ms: u64::try_from(mono.max(0)).unwrap_or(0),
        }
    }

    /// The wall clock's current deviation from true time, in ms.
    #[must_use]
    pub fn skew_ms(&self, sim_ms: u64) -> i64 {
        self.offset_ms + scaled(sim_ms.saturating_sub(self.drift_since_ms), self.drift_ppm)
    }

    /// Moves the wall clock by `delta_ms` (negative: backward).
    pub fn bump(&mut self, delta_ms: i64) {
        self.offset_ms = self.offset_ms.saturating_add(delta_ms);
    }

    /// Changes the drift rate, folding what the old rate accumulated into the offsets.
    pub fn set_drift(&mut self, sim_ms: u64, drift_ppm: i64) {
        self.offset_ms += scaled(sim_ms.saturating_sub(self.drift_since_ms), self.drift_ppm);
        self.drift_since_ms = sim_ms;
        let since = sim_ms.saturating_sub(self.mono_since_ms);
        self.mono_base_ms =
            (self.mono_base_ms as i64 + since as i64 + scaled(since, self.drift_ppm)).max(0) as u64;
        self.mono_since_ms = sim_ms;
        self.drift_ppm = drift_ppm;
    }

    /// The drift rate.
    #[must_use]
    pub fn drift_ppm(&self) -> i64 {
        self.drift_ppm
    }

    /// The process restarted: its monotonic clock starts again from zero. The wall clock (a
    /// property of the machine) keeps its offset, so a backward jump survives the restart.
    pub fn reboot(&mut self, sim_ms: u64) {
        self.mono_base_ms = 0;
        self.mono_since_ms = sim_ms;
    }

    /// NTP fixed the clock: no offset, no drift.
    pub fn reset(&mut self, sim_ms: u64) {
        self.set_drift(sim_ms, 0);
        self.offset_ms = 0;
    }
}

/// madsim's clock, read directly. `Instant::now()` reads the same clock, but through madsim's
/// override of libc's `clock_gettime`, which finds the runtime in a thread-local and clones its
/// handles on every call: several times the cost, and the nodes read the time on every step.
#[derive(Clone)]
pub struct SimClock(madsim::time::TimeHandle);

impl SimClock {
    /// The clock of the running simulation (must be called inside it).
    #[must_use]
    pub fn current() -> Self {
        Self(madsim::time::TimeHandle::current())
    }

    /// The simulated instant now: what `Instant::now()` returns inside the simulation.
    #[must_use]
    pub fn now(&self) -> std::time::Instant {
        self.0.now_instant()
    }

    /// Simulated time since the runtime started.
    #[must_use]
    pub fn elapsed(&self) -> std::time::Duration {
        self.0.elapsed()
    }

    /// `madsim::time::sleep(duration)` (the same deadline, the same timer when polled), without
    /// finding the runtime's clock in a thread-local first.
    pub fn sleep(&self, duration: std::time::Duration) -> madsim::time::Sleep {
        self.0.sleep(duration)
    }
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SimClock").field(&self.now()).finish()
    }
}

/// Sleeps `ms` simulated milliseconds.
pub async fn sleep_ms(ms: u64) {
    madsim::time::sleep(std::time::Duration::from_millis(ms)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bumps_and_drift_move_the_wall_clock_but_monotonic_never_goes_back() {
        let mut clock = NodeClock::default();
        assert_eq!(
            clock.now(1_000),
            Now {
                wall_ms: WALL_EPOCH_MS + 1_000,
                mono_ms: 1_000
            }
        );
        clock.bump(-288_000);
        let after = clock.now(1_000);
        assert_eq!(after.wall_ms, WALL_EPOCH_MS + 1_000 - 288_000);
        assert_eq!(
            after.mono_ms, 1_000,
            "a wall-clock bump does not touch the monotonic clock"
        );
        clock.set_drift(1_000, 100_000); // 10% fast
        assert_eq!(clock.now(11_000).mono_ms, 1_000 + 11_000);
        assert_eq!(clock.skew_ms(11_000), -288_000 + 1_000);
        clock.reboot(11_000);
        assert_eq!(clock.now(11_000).mono_ms, 0);
        assert_eq!(
            clock.skew_ms(11_000),
            -288_000 + 1_000,
            "the skew survives a restart"
        );
        clock.reset(12_000);
        assert_eq!(clock.skew_ms(20_000), 0);
    }
}
