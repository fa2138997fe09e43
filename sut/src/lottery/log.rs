//! The coordinator's durable log: a draw is logged before its first Try (`Begin`), its verdict
//! is logged before the first Confirm/Cancel is sent (`Decided`), and it is forgotten once every
//! branch acknowledged (`Finished`). This is the classic 2PC/TCC coordinator log: after a crash
//! an undecided draw is cancelled (its Tries may or may not have landed; the fence's empty
//! rollback covers the ones that did not) and a decided one is driven to completion.
//!
//! [`apply_entry`] is the one place that says what an entry does to a record; both stores use it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rows::AMOUNT_MAX;
use super::{DrawArgs, Phase, Xid};

/// A draw's global verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Verdict {
    /// Every Try succeeded: Confirm all branches.
    Confirm,
    /// Some Try failed or timed out, or the coordinator restarted undecided: Cancel all.
    Cancel,
}

impl Verdict {
    /// The phase of the messages that carry this verdict out.
    #[must_use]
    pub const fn phase(self) -> Phase {
        match self {
            Self::Confirm => Phase::Confirm,
            Self::Cancel => Phase::Cancel,
        }
    }

    /// Stable code (SQLite column value).
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Confirm => 1,
            Self::Cancel => 2,
        }
    }

    /// Inverse of [`Verdict::code`].
    #[must_use]
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Confirm),
            2 => Some(Self::Cancel),
            _ => None,
        }
    }
}

/// One write to the coordinator log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LogEntry {
    /// A draw begins; no Try is sent before this is durable.
    Begin(DrawArgs),
    /// The verdict; no Confirm/Cancel is sent before this is durable.
    Decided {
        /// The draw.
        xid: Xid,
        /// Its verdict.
        verdict: Verdict,
    },
    /// Every branch acknowledged the verdict; the record can go.
    Finished {
        /// The draw.
        xid: Xid,
    },
}

impl LogEntry {
    /// The entry's kind (`begin`, `decided_confirm`, `decided_cancel`, `finished`): the
    /// protocol step a crash point at this record names.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Begin(_) => "begin",
            Self::Decided {
                verdict: Verdict::Confirm,
                ..
            } => "decided_confirm",
            Self::Decided {
                verdict: Verdict::Cancel,
                ..
            } => "decided_cancel",
            Self::Finished { .. } => "finished",
        }
    }

    /// The draw this entry is about.
    #[must_use]
    pub const fn xid(&self) -> Xid {
        match self {
            Self::Begin(draw) => draw.xid,
            Self::Decided { xid, .. } | Self::Finished { xid } => *xid,
        }
    }
}

/// A draw the log knows about (begun, not finished).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LogRecord {
    /// The draw.
    pub draw: DrawArgs,
    /// Its verdict, once decided. Never changes once set.
    pub verdict: Option<Verdict>,
}

/// Why a log entry was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum LogError {
    /// `Begin` for an xid that is logged with different arguments.
    #[error("draw {xid:?} is already logged with other arguments")]
    BeginConflict {
        /// The draw.
        xid: Xid,
    },
    /// `Decided` or `Finished` for a draw that is not logged.
    #[error("draw {xid:?} is not in the log")]
    UnknownDraw {
        /// The draw.
        xid: Xid,
    },
    /// A second, different verdict.
    #[error("draw {xid:?} was decided {logged:?}, refusing {requested:?}")]
    VerdictConflict {
        /// The draw.
        xid: Xid,
        /// The verdict already logged.
        logged: Verdict,
        /// The verdict refused.
        requested: Verdict,
    },
    /// A draw whose price exceeds `AMOUNT_MAX`.
    #[error("draw {xid:?} has a price {amount_minor} above the maximum")]
    AmountTooLarge {
        /// The draw.
        xid: Xid,
        /// The price.
        amount_minor: u64,
    },
    /// `Finished` before a verdict.
    #[error("draw {xid:?} cannot finish before it is decided")]
    NotDecided {
        /// The draw.
        xid: Xid,
    },
}

/// What `entry` does to the draw's record (`None` = absent). Repeats of the same entry are
/// idempotent; a conflicting verdict is refused.
///
/// # Errors
/// [`LogError`] when the entry does not fit the record.
pub fn apply_entry(
    record: Option<LogRecord>,
    entry: &LogEntry,
) -> Result<Option<LogRecord>, LogError> {
    let xid = entry.xid();
    if let LogEntry::Begin(draw) = entry
        && draw.price_minor > AMOUNT_MAX
    {
        return Err(LogError::AmountTooLarge {
            xid,
            amount_minor: draw.price_minor,
        });
    }
    match (*entry, record) {
        (LogEntry::Begin(draw), None) => Ok(Some(LogRecord {
            draw,
            verdict: None,
        })),
        (LogEntry::Begin(draw), Some(r)) if r.draw == draw => Ok(Some(r)),
        (LogEntry::Begin(_), Some(_)) => Err(LogError::BeginConflict { xid }),
        (LogEntry::Decided { .. }, None) => Err(LogError::UnknownDraw { xid }),
        (LogEntry::Decided { verdict, .. }, Some(r)) => match r.verdict {
            None => Ok(Some(LogRecord {
                verdict: Some(verdict),
                ..r
            })),
            Some(logged) if logged == verdict => Ok(Some(r)),
            Some(logged) => Err(LogError::VerdictConflict {
                xid,
                logged,
                requested: verdict,
            }),
        },
        // Finishing a forgotten draw again is a harmless repeat.
        (LogEntry::Finished { .. }, None) => Ok(None),
        (LogEntry::Finished { .. }, Some(r)) if r.verdict.is_none() => {
            Err(LogError::NotDecided { xid })
        }
        (LogEntry::Finished { .. }, Some(_)) => Ok(None),
    }
}

/// The coordinator log's content: every begun, unfinished draw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CoordLog {
    /// Records by xid.
    pub records: BTreeMap<Xid, LogRecord>,
}

impl CoordLog {
    /// Applies one entry (see [`apply_entry`]).
    ///
    /// # Errors
    /// [`LogError`] when the entry does not fit; the log is unchanged then.
    pub fn append(&mut self, entry: &LogEntry) -> Result<(), LogError> {
        let xid = entry.xid();
        match apply_entry(self.records.get(&xid).copied(), entry)? {
            Some(record) => {
                debug_assert_eq!(check_record(xid, &record), Ok(()));
                self.records.insert(xid, record)
            }
            None => self.records.remove(&xid),
        };
        Ok(())
    }

    /// Whether no draw is open.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The log's invariants: every record is filed under its own draw's xid, and no draw costs
    /// more than [`AMOUNT_MAX`] (what [`apply_entry`] lets in).
    ///
    /// # Errors
    /// The first record that breaks one, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (xid, record) in &self.records {
            check_record(*xid, record)?;
        }
        Ok(())
    }
}

fn check_record(xid: Xid, record: &LogRecord) -> Result<(), String> {
    if record.draw.xid != xid {
        return Err(format!(
            "coordinator log: the record under {xid:?} is of draw {:?}",
            record.draw.xid
        ));
    }
    if record.draw.price_minor > AMOUNT_MAX {
        return Err(format!(
            "coordinator log: draw {xid:?} costs {} minor units, above the maximum",
            record.draw.price_minor
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lottery::{ActivityId, UserId};

    fn draw(xid: u64) -> DrawArgs {
        DrawArgs {
            xid: Xid(xid),
            user: UserId(1),
            activity: ActivityId(1),
            price_minor: 5,
            won: true,
        }
    }

    #[test]
    fn lifecycle_and_repeats() {
        let mut log = CoordLog::default();
        log.append(&LogEntry::Begin(draw(1))).unwrap();
        log.append(&LogEntry::Begin(draw(1))).unwrap();
        assert_eq!(log.records[&Xid(1)].verdict, None);
        assert_eq!(
            log.append(&LogEntry::Finished { xid: Xid(1) }),
            Err(LogError::NotDecided { xid: Xid(1) })
        );
        log.append(&LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel,
        })
        .unwrap();
        log.append(&LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel,
        })
        .unwrap();
        assert_eq!(
            log.append(&LogEntry::Decided {
                xid: Xid(1),
                verdict: Verdict::Confirm
            }),
            Err(LogError::VerdictConflict {
                xid: Xid(1),
                logged: Verdict::Cancel,
                requested: Verdict::Confirm
            })
        );
        log.append(&LogEntry::Finished { xid: Xid(1) }).unwrap();
        assert!(log.is_empty());
        log.append(&LogEntry::Finished { xid: Xid(1) }).unwrap();
        assert_eq!(
            log.append(&LogEntry::Decided {
                xid: Xid(2),
                verdict: Verdict::Cancel
            }),
            Err(LogError::UnknownDraw { xid: Xid(2) })
        );
        assert_eq!(log.check_invariants(), Ok(()));
        let mut other = draw(3);
        log.append(&LogEntry::Begin(other)).unwrap();
        other.price_minor = 6;
        assert_eq!(
            log.append(&LogEntry::Begin(other)),
            Err(LogError::BeginConflict { xid: Xid(3) })
        );
    }

    #[test]
    fn invariants_fire_on_a_misfiled_or_overpriced_record() {
        let mut log = CoordLog::default();
        log.append(&LogEntry::Begin(draw(1))).unwrap();
        assert_eq!(log.check_invariants(), Ok(()));
        let mut misfiled = log.clone();
        let record = misfiled.records.remove(&Xid(1)).unwrap();
        misfiled.records.insert(Xid(2), record);
        assert!(misfiled.check_invariants().unwrap_err().contains("of draw"));
        let mut overpriced = log;
        overpriced
            .records
            .get_mut(&Xid(1))
            .unwrap()
            .draw
            .price_minor = AMOUNT_MAX + 1;
        assert!(
            overpriced
                .check_invariants()
                .unwrap_err()
                .contains("above the maximum")
        );
    }
}
