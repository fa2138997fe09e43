//! How many IDs to ask for next.
//!
//! - [`StepPolicy::Fixed`]: always the same step.
//! - [`StepPolicy::Leaf`]: Meituan Leaf's dynamic step — if the previous segment lasted less than
//!   15 minutes the step doubles (up to a cap, Leaf's 1,000,000); 15–30 minutes it stays; 30
//!   minutes or more it halves, never below the database's step.
//! - [`StepPolicy::SeedLog`]: the segment-ID design's `step = base * (1 + log2(qps/1000 + 1))`
//!   (§6, docs/sources.md), with the QPS measured over the previous segment.

use serde::{Deserialize, Serialize};

/// Leaf's thresholds.
pub const LEAF_FAST_MS: u64 = 15 * 60 * 1000;
/// Leaf's thresholds.
pub const LEAF_SLOW_MS: u64 = 30 * 60 * 1000;

/// A step policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepPolicy {
    /// Always `step` IDs (0 = the tag's database step).
    Fixed {
        /// IDs per segment.
        step: u64,
    },
    /// Leaf's doubling/halving between the database step and `step_max`.
    Leaf {
        /// The cap (Leaf: 1,000,000).
        step_max: u64,
    },
    /// The segment-ID design's logarithmic formula.
    SeedLog {
        /// The base step.
        base: u64,
        /// The cap.
        step_max: u64,
    },
}

impl Default for StepPolicy {
    fn default() -> Self {
        Self::Leaf {
            step_max: 1_000_000,
        }
    }
}

impl StepPolicy {
    /// The first step, before any segment has been used up.
    #[must_use]
    pub fn initial(&self, tag_step: u64) -> u64 {
        match *self {
            Self::Fixed { step } if step > 0 => step,
            Self::Fixed { .. } | Self::Leaf { .. } => tag_step,
            Self::SeedLog { base, .. } => base.max(1),
        }
    }

    /// The step after a segment of `ids` IDs lasted `duration_ms`.
    #[must_use]
    pub fn next(&self, current: u64, tag_step: u64, ids: u64, duration_ms: u64) -> u64 {
        match *self {
            Self::Fixed { .. } => self.initial(tag_step),
            Self::Leaf { step_max } => {
                let floor = tag_step.max(1);
                if duration_ms < LEAF_FAST_MS {
                    current.saturating_mul(2).min(step_max.max(floor))
                } else if duration_ms < LEAF_SLOW_MS {
                    current.max(floor)
                } else {
                    (current / 2).max(floor)
                }
            }
            Self::SeedLog { base, step_max } => {
                let qps = ids as f64 * 1000.0 / duration_ms.max(1) as f64;
                let step = base as f64 * (1.0 + (qps / 1000.0 + 1.0).log2());
                // Finite and positive by construction; the cast saturates.
                (step.round() as u64).clamp(1, step_max.max(1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_doubles_keeps_and_halves() {
        let leaf = StepPolicy::Leaf { step_max: 1_000 };
        assert_eq!(leaf.next(100, 100, 100, 60_000), 200);
        assert_eq!(leaf.next(800, 100, 800, 60_000), 1_000, "capped");
        assert_eq!(leaf.next(400, 100, 400, 20 * 60_000), 400);
        assert_eq!(leaf.next(400, 100, 400, 40 * 60_000), 200);
        assert_eq!(
            leaf.next(150, 100, 150, 40 * 60_000),
            100,
            "never below the database step"
        );
    }

    #[test]
    fn seed_formula() {
        let seed = StepPolicy::SeedLog {
            base: 1_000,
            step_max: 100_000,
        };
        // 1,000 IDs in 1 s = 1,000 QPS: 1000 * (1 + log2(2)) = 2000.
        assert_eq!(seed.next(1_000, 1, 1_000, 1_000), 2_000);
        // Idle: 1000 * (1 + log2(1)) = 1000.
        assert_eq!(seed.next(1_000, 1, 1, 1_000_000), 1_000);
        // 7,000 QPS: 1000 * (1 + 3) = 4000.
        assert_eq!(seed.next(1_000, 1, 7_000, 1_000), 4_000);
    }

    #[test]
    fn fixed_ignores_history() {
        assert_eq!(StepPolicy::Fixed { step: 50 }.next(7, 10, 1, 1), 50);
        assert_eq!(StepPolicy::Fixed { step: 0 }.initial(10), 10);
    }
}
