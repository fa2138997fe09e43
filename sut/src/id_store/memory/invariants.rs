//! The structural invariants of [`MemoryIdStore`]: what the rules promise of its rows after
//! any sequence of correct operations.
//!
//! After the documented blind-write flaw ([`crate::flaw::Flaw::SegmentNoVersionCheck`]) ranges
//! can overlap: that breaks the store's promise, and [`MemoryIdStore::check_invariants`] says
//! so. Call it on correct runs.

use std::collections::BTreeMap;

use super::MemoryIdStore;
use crate::id_store::{SEGMENT_ID_LIMIT, Segment, TagRow};

impl MemoryIdStore {
    /// Checks the store's structural invariants; the first violation found, described.
    ///
    /// - a tag row is keyed by its name, has a valid step, delta and remainder, a first ID in
    ///   its residue class, and `first_id <= max_id <= 2^62`;
    /// - pooled ranges are non-empty, sorted, in the tag's residue class and within
    ///   `[first_id, max_id)`;
    /// - a lease is keyed by its tag and segment start, its tag exists, its segment is
    ///   non-empty, in the tag's residue class and within `[first_id, max_id)`, and its claim
    ///   lies within its segment;
    /// - a tag's pooled ranges and leased segments are pairwise disjoint;
    /// - worker ids lie below their namespace's worker count where it is known, and each
    ///   instance holds at most one worker id of such a namespace;
    /// - a counter's durable value never exceeds its live value.
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (name, row) in &self.tags {
            let first_id = self.first_ids.get(name).copied();
            let first_id = first_id.ok_or_else(|| format!("tag `{name}` has no first ID"))?;
            check_tag(name, row, first_id)?;
            if !row.pool.is_sorted() {
                return Err(format!("the pool of `{name}` is not sorted"));
            }
            let pooled = row.pool.iter().map(|r| (*r, "pooled range".to_owned()));
            let tag_leases = self
                .leases
                .range((name.clone(), 0)..=(name.clone(), u64::MAX));
            let leased = tag_leases.map(|(_, l)| (l.segment, format!("lease of {}", l.instance)));
            let ranges: Vec<(Segment, String)> = pooled.chain(leased).collect();
            for (range, what) in &ranges {
                check_shape(row, range, what)?;
            }
            // Overlaps first: the blind-write flaw's signature (it also moves max_id back).
            check_disjoint(name, &ranges)?;
            for (range, what) in &ranges {
                check_bounds(row, first_id, range, what)?;
            }
        }
        self.check_leases()?;
        self.check_workers()?;
        for (key, counter) in &self.counters {
            if counter.durable > counter.value {
                return Err(format!(
                    "counter `{key}`: durable {} above live {}",
                    counter.durable, counter.value
                ));
            }
        }
        Ok(())
    }

    /// Lease keys, tags and claims.
    fn check_leases(&self) -> Result<(), String> {
        for ((tag, start), lease) in &self.leases {
            if (&lease.tag, lease.segment.start) != (tag, *start) {
                return Err(format!(
                    "lease keyed ({tag}, {start}) holds `{}` segment {:?}",
                    lease.tag, lease.segment
                ));
            }
            if !self.tags.contains_key(tag) {
                return Err(format!("lease of {start} names unknown tag `{tag}`"));
            }
            let segment = lease.segment;
            if lease.claim_end < segment.start || lease.claim_end > segment.end {
                return Err(format!(
                    "lease of `{tag}` at {start}: claim {} outside its segment {segment:?}",
                    lease.claim_end
                ));
            }
        }
        Ok(())
    }

    /// Worker ids below the known count; one id per holder where the count is known.
    fn check_workers(&self) -> Result<(), String> {
        let mut held: BTreeMap<(&str, u64), u32> = BTreeMap::new();
        for ((namespace, id), row) in &self.workers {
            let Some(Some(count)) = self.worker_counts.get(namespace) else {
                continue;
            };
            if id >= count {
                return Err(format!(
                    "worker id {id} of `{namespace}` is not below its worker count {count}"
                ));
            }
            let Some(holder) = row.holder else { continue };
            if let Some(other) = held.insert((namespace.as_str(), holder.0), *id) {
                return Err(format!(
                    "{holder} holds two worker ids of `{namespace}`: {other} and {id}"
                ));
            }
        }
        Ok(())
    }
}

/// A tag row's own fields.
fn check_tag(name: &str, row: &TagRow, first_id: u64) -> Result<(), String> {
    if row.tag != name {
        return Err(format!("tag keyed `{name}` is named `{}`", row.tag));
    }
    if row.step == 0 || row.delta == 0 || row.remainder >= row.delta {
        return Err(format!(
            "tag `{name}`: step {}, delta {}, remainder {} are not a valid spec",
            row.step, row.delta, row.remainder
        ));
    }
    if first_id % row.delta != row.remainder {
        return Err(format!(
            "tag `{name}`: first ID {first_id} is not ≡ {} (mod {})",
            row.remainder, row.delta
        ));
    }
    if first_id > row.max_id || row.max_id > SEGMENT_ID_LIMIT {
        return Err(format!(
            "tag `{name}`: max_id {} outside [first ID {first_id}, 2^62]",
            row.max_id
        ));
    }
    Ok(())
}

/// A pooled range or leased segment of tag `row`: non-empty, in the tag's residue class.
fn check_shape(row: &TagRow, range: &Segment, what: &str) -> Result<(), String> {
    let name = &row.tag;
    if range.is_empty() {
        return Err(format!("`{name}`: empty {what} {range:?}"));
    }
    if range.delta != row.delta || range.start % row.delta != row.remainder {
        return Err(format!(
            "`{name}`: {what} {range:?} outside the residue class {} (mod {})",
            row.remainder, row.delta
        ));
    }
    Ok(())
}

/// A pooled range or leased segment of tag `row` lies within `[first_id, max_id)`.
fn check_bounds(row: &TagRow, first_id: u64, range: &Segment, what: &str) -> Result<(), String> {
    if range.start < first_id || range.end > row.max_id {
        return Err(format!(
            "`{}`: {what} {range:?} outside [first ID {first_id}, max_id {})",
            row.tag, row.max_id
        ));
    }
    Ok(())
}

/// No two of a tag's ranges (pooled or leased) overlap.
fn check_disjoint(name: &str, ranges: &[(Segment, String)]) -> Result<(), String> {
    let mut sorted: Vec<&(Segment, String)> = ranges.iter().collect();
    sorted.sort_by_key(|(range, _)| (range.start, range.end));
    for pair in sorted.windows(2) {
        let [(a, what_a), (b, what_b)] = pair else {
            unreachable!("windows of two")
        };
        if b.start < a.end {
            return Err(format!("`{name}`: {what_a} {a:?} overlaps {what_b} {b:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
