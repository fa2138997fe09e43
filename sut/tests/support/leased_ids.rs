//! Shared by the hostile suites (included with `#[path]`): the promises of a Snowflake worker
//! to the lease it issues under, as the allocator's degraded mode and the Snowflake worker
//! both make them.

use sut::snowflake::Layout;

/// What a referee knows of the lease a worker issues under: its worker id, the reservation
/// the lease carried (a predecessor may have issued up to it) and the largest reservation a
/// store reply acknowledged since (a successor starts above it).
#[derive(Clone, Copy, Debug)]
pub struct LeaseView {
    pub worker_id: u32,
    pub floor_ts: u64,
    pub acked_ts: u64,
}

impl LeaseView {
    /// A lease carrying `floor_ts`.
    pub fn new(worker_id: u32, floor_ts: u64) -> Self {
        Self {
            worker_id,
            floor_ts,
            acked_ts: floor_ts,
        }
    }

    /// The store acknowledged a reservation of `ts`.
    pub fn acknowledged(&mut self, ts: u64) {
        self.acked_ts = self.acked_ts.max(ts);
    }

    /// ID `id` of `layout` (with `flag` OR-ed in) handed out after `last` under this lease:
    /// exactly `flag` above the layout, the leased worker, a unit in `(floor_ts, acked_ts]`,
    /// above `last`.
    pub fn check(
        &self,
        layout: &Layout,
        flag: u64,
        id: u64,
        last: Option<u64>,
    ) -> Result<(), String> {
        let bits = layout.time_bits + layout.worker_bits + layout.seq_bits;
        if id >> bits != flag >> bits {
            return Err(format!(
                "ID {id:#x}: its bits above the {bits}-bit layout must be exactly the flag \
                 {flag:#x}"
            ));
        }
        let d = layout.decode(id);
        if d.worker != u64::from(self.worker_id) {
            return Err(format!(
                "ID {id:#x} of worker {}, not the leased {}",
                d.worker, self.worker_id
            ));
        }
        if d.ts <= self.floor_ts || d.ts > self.acked_ts {
            return Err(format!(
                "ID {id:#x} in unit {}, outside ({}, {}]: above the reservation its lease \
                 carried, at or below the one the store acknowledged",
                d.ts, self.floor_ts, self.acked_ts
            ));
        }
        if let Some(last) = last
            && id <= last
        {
            return Err(format!(
                "ID {id:#x} handed out after {last:#x}: not increasing"
            ));
        }
        Ok(())
    }
}
