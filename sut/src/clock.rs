//! Time as a parameter.
//!
//! No state machine in `sut` reads a clock. Drivers pass what the node *believes* the time is:
//! the wall clock (which the nemesis, NTP or an operator can move backward or forward) and a
//! monotonic instant (which never goes backward but may run fast or slow, and restarts from zero
//! when the process restarts). Only the wall clock jumps. (TigerBeetle's `time.zig` keeps the
//! same split between `realtime()` and `monotonic()`.)

use serde::{Deserialize, Serialize};

/// A node's reading of time, in milliseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Now {
    /// Wall clock, milliseconds since the Unix epoch, as this node believes it. May jump.
    pub wall_ms: u64,
    /// Monotonic milliseconds since this process started. Never decreases within a process.
    pub mono_ms: u64,
}

impl Now {
    /// A reading where both clocks say the same thing (tests, models).
    #[must_use]
    pub const fn both(ms: u64) -> Self {
        Self {
            wall_ms: ms,
            mono_ms: ms,
        }
    }

    /// The same reading with the monotonic clock advanced by `ms` and the wall clock by the same.
    #[must_use]
    pub const fn plus_ms(self, ms: u64) -> Self {
        Self {
            wall_ms: self.wall_ms.saturating_add(ms),
            mono_ms: self.mono_ms.saturating_add(ms),
        }
    }
}
