//! A crash-faithful simulated disk (madsim's file system has no fsync model).
//!
//! Each node has one write-ahead log of typed records. An append is *pending* until a sync;
//! a crash drops every pending record and, with some probability, leaves the last one *torn*
//! (partly on disk, failing its checksum), which recovery must detect and discard. Nothing
//! pending survives a crash, and nothing synced is lost — the two properties "WAL flush"
//! claims rest on. (turmoil's disk keeps writes pending until `sync_all` in the same way.)
//!
//! Records are Rust values, not bytes: the simulator tests protocols, not encodings. A torn
//! record is represented by [`Slot::Torn`], which the reader sees as a checksum failure.

use serde::{Deserialize, Serialize};

/// One slot of a log as it is on the platter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Slot<R> {
    /// A whole record.
    Whole(R),
    /// A record the crash tore: its checksum fails.
    Torn,
}

/// What a crash did to a log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CrashLoss {
    /// Pending records dropped.
    pub lost: u64,
    /// Whether the last of them was left torn on disk.
    pub torn: bool,
}

/// A write-ahead log on the simulated disk.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Wal<R> {
    durable: Vec<Slot<R>>,
    pending: Vec<R>,
    syncs: u64,
}

impl<R> Default for Wal<R> {
    fn default() -> Self {
        Self {
            durable: Vec::new(),
            pending: Vec::new(),
            syncs: 0,
        }
    }
}

impl<R: Clone> Wal<R> {
    /// Appends a record; it is pending until [`Self::sync`].
    pub fn append(&mut self, record: R) -> u64 {
        self.pending.push(record);
        (self.durable.len() + self.pending.len()) as u64
    }

    /// Makes every pending record durable (fsync). Returns how many became durable.
    pub fn sync(&mut self) -> usize {
        let n = self.pending.len();
        self.durable.extend(self.pending.drain(..).map(Slot::Whole));
        self.syncs += 1;
        n
    }

    /// Number of records appended so far, durable or not (a position to wait for).
    #[must_use]
    pub fn appended(&self) -> u64 {
        (self.durable.len() + self.pending.len()) as u64
    }

    /// Number of durable slots (a synced position).
    #[must_use]
    pub fn durable_len(&self) -> u64 {
        self.durable.len() as u64
    }

    /// Pending records.
    #[must_use]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The process crashed: pending records are gone; if `tear` and there were any, the last
    /// one is left torn on disk.
    pub fn crash(&mut self, tear: bool) -> CrashLoss {
        let lost = self.pending.len() as u64;
        self.pending.clear();
        let torn = tear && lost > 0;
        if torn {
            self.durable.push(Slot::Torn);
        }
        CrashLoss { lost, torn }
    }

    /// Recovery: the durable records in order. A torn slot may only be the last one written
    /// before a crash; recovery truncates it (and reports how many it dropped).
    pub fn recover(&mut self) -> (Vec<R>, u64) {
        let slots_before = self.durable.len();
        self.durable.retain(|slot| matches!(slot, Slot::Whole(_)));
        let torn = (slots_before - self.durable.len()) as u64;
        (self.durable().cloned().collect(), torn)
    }
}

impl<R> Wal<R> {
    /// The oldest pending record (the first an fsync now would make durable).
    #[must_use]
    pub fn first_pending(&self) -> Option<&R> {
        self.pending.first()
    }

    /// The records [`Self::recover`] would return now, in order, read in place: what a
    /// checker reads at the end of a run without changing the log or copying it.
    pub fn durable(&self) -> impl Iterator<Item = &R> {
        self.durable.iter().filter_map(|slot| match slot {
            Slot::Whole(record) => Some(record),
            Slot::Torn => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_loses_exactly_the_pending_records() {
        let mut wal = Wal::default();
        wal.append(1);
        wal.append(2);
        assert_eq!(wal.sync(), 2);
        wal.append(3);
        wal.append(4);
        assert_eq!(
            wal.crash(true),
            CrashLoss {
                lost: 2,
                torn: true
            }
        );
        assert_eq!(wal.durable().copied().collect::<Vec<_>>(), vec![1, 2]);
        let (records, torn) = wal.recover();
        assert_eq!(records, vec![1, 2]);
        assert_eq!(torn, 1);
        // After recovery the torn slot is gone and the log continues.
        wal.append(5);
        wal.sync();
        assert_eq!(wal.recover(), (vec![1, 2, 5], 0));
        assert_eq!(
            wal.crash(true),
            CrashLoss {
                lost: 0,
                torn: false
            },
            "nothing pending, nothing torn"
        );
    }
}
