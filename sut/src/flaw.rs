//! The catalog of known flaws: broken designs the bench must catch (docs/flaws.md).
//!
//! Each flaw is a named, off-by-default switch of the reference implementation. Correct and
//! flawed code share everything but the switch: a component's config carries an
//! `Option<Flaw>` (or the component's own flaw struct, built from a [`Flaw`] by
//! [`Flaw::lottery_flaws`] / [`Flaw::token_flaws`]) and takes the flawed branch only where the
//! broken design differs. No checker anywhere looks for a particular flaw: the bench must catch
//! each one through its generic invariants (`ids.unique`, `lottery.conservation`, ...).
//!
//! The rows come from the source designs' own anti-pattern table and sections and from bugs
//! that the anchors' users hit (both summarised in docs/sources.md); [`Flaw::source`] cites
//! each.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::lottery::{FenceMode, Flaws as LotteryFlaws};
use crate::token::TokenFlaws;

/// One known flaw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flaw {
    /// Segment reload writes `max_id = read + step` without the version check: two instances
    /// that read the same row take the same range.
    SegmentNoVersionCheck,
    /// A reloading instance starts issuing from the `max_id` it read before its own write of
    /// the new `max_id` is acknowledged (a local counter ahead of the database).
    CounterNoPersist,
    /// The database acknowledges before its log is durable and syncs once a second (a Redis
    /// `INCRBY` counter with `appendfsync everysec`): a crash forgets acknowledged grants.
    CounterEverysec,
    /// The segment-ID design's zombie reclaim as written: the holder reports its usage after
    /// the fact and times its lease by its wall clock against the store's expiry, with no drift
    /// margin; the store reclaims everything above the last report.
    ReclaimNoDriftMargin,
    /// Snowflake resets the sequence before checking for a backward clock, so a refused or
    /// waited-out rollback restarts the last millisecond's sequence.
    SnowflakeSeqResetFirst,
    /// Snowflake persists its last timestamp after the fact (every 3 s) and does not wait for
    /// it: a restart after a backward jump repeats timestamps.
    SnowflakeNoPersistedTs,
    /// Machine id = hash(IP) % 1000 instead of a leased worker id.
    MachineIdHashIp,
    /// Semantic IDs with second-level time and `seq % capacity`: the sequence wraps within a
    /// second instead of waiting.
    SemanticSeqWrap,
    /// TCC participants without a fence: empty rollback, hanging Try, double Confirm.
    TccNoFence,
    /// The fence row checked in one store operation and changed in a second.
    FenceCheckThenAct,
    /// Stock checked and decremented as two store operations.
    StockTwoStep,
    /// One-time token checked, then deleted, as two store operations.
    OnceCheckThenDelete,
    /// A time field too narrow and never checked: when the epoch runs out the timestamp wraps.
    TimeFieldNarrow,
    /// The TCC coordinator sends a draw's Try before the draw's Begin record is durable (the
    /// write-ahead rule broken): a crash after the Try left and before the fsync leaves money
    /// frozen and stock reserved for a draw that no recovered coordinator knows.
    CoordTryBeforeBegin,
    /// The coordinator's status table books a draw's end only on the path that answers its
    /// client: a draw answered `pending` and finished later by compensation is never booked,
    /// and its client's polls find nothing, for ever.
    StatusLostAfterCompensation,
    /// Snowflake tests a clock that moved back as `behind < window` (wait) and
    /// `behind > window` (refuse): a clock exactly `rollback_ms_max` behind falls between the
    /// two and issues from its own, earlier, unit.
    SnowflakeRollbackBoundGap,
    /// The draw's ticket price is taken from the request (checked only against an upper bound)
    /// and the participants charge whatever the coordinator sends: a client that names price 0
    /// draws for nothing.
    ClientPrice,
}

impl Flaw {
    /// Every flaw, in catalog order.
    pub const ALL: [Self; 17] = [
        Self::SegmentNoVersionCheck,
        Self::CounterNoPersist,
        Self::CounterEverysec,
        Self::ReclaimNoDriftMargin,
        Self::SnowflakeSeqResetFirst,
        Self::SnowflakeNoPersistedTs,
        Self::MachineIdHashIp,
        Self::SemanticSeqWrap,
        Self::TccNoFence,
        Self::FenceCheckThenAct,
        Self::StockTwoStep,
        Self::OnceCheckThenDelete,
        Self::TimeFieldNarrow,
        Self::ClientPrice,
        Self::CoordTryBeforeBegin,
        Self::StatusLostAfterCompensation,
        Self::SnowflakeRollbackBoundGap,
    ];

    /// The name used on command lines and in reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::SegmentNoVersionCheck => "segment_no_version_check",
            Self::CounterNoPersist => "counter_no_persist",
            Self::CounterEverysec => "counter_everysec",
            Self::ReclaimNoDriftMargin => "reclaim_no_drift_margin",
            Self::SnowflakeSeqResetFirst => "snowflake_seq_reset_first",
            Self::SnowflakeNoPersistedTs => "snowflake_no_persisted_ts",
            Self::MachineIdHashIp => "machine_id_hash_ip",
            Self::SemanticSeqWrap => "semantic_seq_wrap",
            Self::TccNoFence => "tcc_no_fence",
            Self::FenceCheckThenAct => "fence_check_then_act",
            Self::StockTwoStep => "stock_two_step",
            Self::OnceCheckThenDelete => "once_check_then_delete",
            Self::TimeFieldNarrow => "time_field_narrow",
            Self::ClientPrice => "client_price",
            Self::CoordTryBeforeBegin => "coord_try_before_begin",
            Self::StatusLostAfterCompensation => "status_lost_after_compensation",
            Self::SnowflakeRollbackBoundGap => "snowflake_rollback_bound_gap",
        }
    }

    /// Where the flaw comes from: a section of a source design or an anchor, both summarised in
    /// docs/sources.md.
    #[must_use]
    pub const fn source(self) -> &'static str {
        match self {
            Self::SegmentNoVersionCheck => {
                "segment-ID design §1, anti-pattern table; Tinyid version CAS (docs/sources.md)"
            }
            Self::CounterNoPersist => {
                "segment-ID design anti-pattern table: AtomicLong without max_id (docs/sources.md)"
            }
            Self::CounterEverysec => {
                "segment-ID design, anti-pattern table: Redis INCRBY; ID, token and lottery \
                 design §2.2 (docs/sources.md)"
            }
            Self::ReclaimNoDriftMargin => {
                "segment-ID design §3.4 zombie reclaim (docs/sources.md); Gray & Cheriton 1989"
            }
            Self::SnowflakeSeqResetFirst => "twitter/snowflake issue #6",
            Self::SnowflakeNoPersistedTs => "Meituan Leaf issues #104, #216",
            Self::MachineIdHashIp => "ID, token and lottery design §2.3 (docs/sources.md)",
            Self::SemanticSeqWrap => "ID, token and lottery design §2.3 (docs/sources.md)",
            Self::TccNoFence => "Seata TCC fence; DTM barrier",
            Self::FenceCheckThenAct => "DTM barrier (against check-then-change)",
            Self::StockTwoStep => "ID, token and lottery design ch. 1 (docs/sources.md)",
            Self::OnceCheckThenDelete => "ID, token and lottery design §3.3 (docs/sources.md)",
            Self::TimeFieldNarrow => "baidu/uid-generator issue #100",
            Self::ClientPrice => {
                "OWASP API Security Top 10 (2023) API6: sensitive business flows (docs/hostile.md)"
            }
            Self::CoordTryBeforeBegin => {
                "the coordinator's write-ahead rule (docs/architecture.md); Seata registers the \
                 global transaction before any branch; CrashTuner (SOSP '19) (docs/sources.md)"
            }
            Self::StatusLostAfterCompensation => {
                "the server's 202 + poll contract (docs/server.md); DTM's queryable global \
                 transaction status (docs/sources.md)"
            }
            Self::SnowflakeRollbackBoundGap => {
                "Leaf's wait window for a clock that moved back (`offset <= 5`) (docs/sources.md); \
                 FCatch (ASPLOS '18)"
            }
        }
    }

    /// One line on what breaks.
    #[must_use]
    pub const fn description(self) -> &'static str {
        match self {
            Self::SegmentNoVersionCheck => {
                "segment reload without a version check: two instances get the same range"
            }
            Self::CounterNoPersist => {
                "local counter used before the new max_id is persisted: concurrent or restarted instances reuse it"
            }
            Self::CounterEverysec => {
                "counter engine acknowledging before its once-a-second sync: a crash re-issues the tail"
            }
            Self::ReclaimNoDriftMargin => {
                "zombie reclaim without a drift margin: a partitioned or skewed holder issues from a reclaimed range"
            }
            Self::SnowflakeSeqResetFirst => {
                "Snowflake sequence reset before the clock-backwards check"
            }
            Self::SnowflakeNoPersistedTs => {
                "Snowflake restart after a backward jump without a persisted last timestamp"
            }
            Self::MachineIdHashIp => "machine id = hash(IP) % 1000: collisions",
            Self::SemanticSeqWrap => {
                "semantic ID with second-level time and seq % capacity: wraps within a second"
            }
            Self::TccNoFence => "TCC without a fence: empty rollback, hanging Try, double Confirm",
            Self::FenceCheckThenAct => "check-then-act fence: a race under a pause",
            Self::StockTwoStep => "stock check and decrement as two steps: over-issue",
            Self::OnceCheckThenDelete => {
                "one-time token check then delete as two steps: double submit"
            }
            Self::TimeFieldNarrow => "time field too narrow and unchecked: the timestamp wraps",
            Self::ClientPrice => {
                "the client names the ticket price and nobody checks it: prizes won for nothing"
            }
            Self::CoordTryBeforeBegin => {
                "TCC Try sent before the draw's Begin is durable: a crash between leaves money frozen"
            }
            Self::StatusLostAfterCompensation => {
                "a draw answered pending and finished by compensation is never reported final to its client"
            }
            Self::SnowflakeRollbackBoundGap => {
                "Snowflake clock exactly at the rollback bound falls between wait and refuse: IDs from the past"
            }
        }
    }

    /// The TCC participants' flaw switches for this flaw (all off for the others).
    #[must_use]
    pub fn lottery_flaws(self) -> LotteryFlaws {
        LotteryFlaws {
            fence: match self {
                Self::TccNoFence => FenceMode::Unfenced,
                Self::FenceCheckThenAct => FenceMode::CheckThenAct,
                _ => FenceMode::Atomic,
            },
            two_step_stock: self == Self::StockTwoStep,
            client_price: self == Self::ClientPrice,
        }
    }

    /// The token service's flaw switches for this flaw (all off for the others).
    #[must_use]
    pub fn token_flaws(self) -> TokenFlaws {
        TokenFlaws {
            once_check_then_delete: self == Self::OnceCheckThenDelete,
        }
    }
}

/// Lottery flaw switches for an optional flaw.
#[must_use]
pub fn lottery_flaws(flaw: Option<Flaw>) -> LotteryFlaws {
    flaw.map(Flaw::lottery_flaws).unwrap_or_default()
}

/// Token flaw switches for an optional flaw.
#[must_use]
pub fn token_flaws(flaw: Option<Flaw>) -> TokenFlaws {
    flaw.map(Flaw::token_flaws).unwrap_or_default()
}

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown flaw name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown flaw `{0}` (known: {known})", known = Flaw::ALL.map(Flaw::name).join(", "))]
pub struct UnknownFlaw(pub String);

impl FromStr for Flaw {
    type Err = UnknownFlaw;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| UnknownFlaw(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut names: Vec<&str> = Flaw::ALL.iter().map(|f| f.name()).collect();
        for flaw in Flaw::ALL {
            assert_eq!(flaw.name().parse::<Flaw>(), Ok(flaw));
            let json = serde_json::to_string(&flaw).unwrap();
            assert_eq!(json, format!("\"{}\"", flaw.name()));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Flaw::ALL.len());
        let err = "meteor".parse::<Flaw>().unwrap_err();
        assert!(err.to_string().contains("tcc_no_fence"), "{err}");
    }

    #[test]
    fn component_switches_follow_the_flaw() {
        assert_eq!(lottery_flaws(None), LotteryFlaws::default());
        assert_eq!(Flaw::TccNoFence.lottery_flaws().fence, FenceMode::Unfenced);
        assert!(Flaw::StockTwoStep.lottery_flaws().two_step_stock);
        assert!(Flaw::ClientPrice.lottery_flaws().client_price);
        assert!(!Flaw::StockTwoStep.lottery_flaws().client_price);
        assert!(
            Flaw::OnceCheckThenDelete
                .token_flaws()
                .once_check_then_delete
        );
        assert_eq!(token_flaws(Some(Flaw::TccNoFence)), TokenFlaws::default());
    }
}
