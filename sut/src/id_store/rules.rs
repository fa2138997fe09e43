//! The ID store's rules, in ONE place: pure functions from a request and the rows it reads to
//! the refusal, or to the rows to write and the answer.
//!
//! Both stores ([`super::MemoryIdStore`], `sut-server`'s `SqliteIdStore`) run every mutating
//! [`super::IdStore`] operation as: read the rows named here, call the rule, persist what it
//! returns, in one atomic step (`&mut self` / one `IMMEDIATE` transaction). A refusal writes
//! nothing. The conformance property test beside the SQLite store keeps the two identical.
//!
//! | operation | reads | rule |
//! |---|---|---|
//! | `create_tag` | whether the tag exists | [`create_tag`] |
//! | `allocate` | the tag row with its pool, the starts of the tag's leases | [`allocate`] |
//! | `renew` | the lease row | [`renew`] |
//! | `release` | the lease row, the tag's pool | [`release`] |
//! | `reclaim_expired` | the leases (the expired ones at least), the tag rows with their pools | [`reclaim_expired`] |
//! | `acquire_worker` | the namespace's worker rows below `worker_count` | [`acquire_worker`] |
//! | `renew_worker` | the worker row | [`renew_worker`] |
//! | `release_worker` | the worker row | [`release_worker`] |
//! | `incr_by` | the counter | [`incr_by`] |
//!
//! Two refusals exist only because of the documented blind-write flaw
//! ([`crate::flaw::Flaw::SegmentNoVersionCheck`]), which can give one range out twice: a grant
//! starting where a lease starts ([`lease_taken`]) and a tail returned where a pooled range
//! starts ([`pool_taken`]). SQLite's primary keys refuse those writes; the rules refuse them
//! first, in the same order, so both stores answer alike.

use crate::edge::Edges;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{
    AllocRequest, CounterDurability, Grant, InstanceId, Lease, LeaseRow, Reclaimed, ReleaseRequest,
    RenewRequest, SEGMENT_ID_LIMIT, Segment, StoreError, Tag, TagRow, TagSpec, WorkerLease,
    WorkerRequest, align_up,
};

/// `create_tag`: the new tag row, unless the spec is invalid or the tag exists.
///
/// # Errors
/// [`StoreError::InvalidSpec`] (checked first), [`StoreError::TagExists`].
pub fn create_tag(tag: &str, spec: &TagSpec, exists: bool) -> Result<TagRow, StoreError> {
    spec.validate()?;
    if exists {
        return Err(StoreError::TagExists(tag.to_owned()));
    }
    let max_id = align_up(spec.first_id, spec.remainder, spec.delta);
    debug_assert!(max_id < SEGMENT_ID_LIMIT, "validate bounds the first ID");
    Ok(TagRow {
        tag: tag.to_owned(),
        max_id,
        step: spec.step,
        delta: spec.delta,
        remainder: spec.remainder,
        version: 0,
        pool: Vec::new(),
    })
}

/// What an accepted allocation writes, and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocWrite {
    /// The tag row after the grant: `max_id`, `version` and `pool`.
    pub row: TagRow,
    /// The pool changed (a pooled grant): rewrite the tag's pool rows from `row.pool`.
    pub pool_changed: bool,
    /// The lease to record.
    pub lease: LeaseRow,
    /// FLAW (blind write only): the lease replaces any lease starting at the same ID.
    pub replace_lease: bool,
    /// The answer.
    pub grant: Grant,
}

/// `allocate`: validate, then either the blind write of the flaw or the correct grant (the
/// version check, then pooled tails at or above `min_id` first, else fresh IDs from `max_id`).
///
/// `row` is the tag row with its pool (`None`: no such tag); `lease_starts` holds the segment
/// starts of the tag's live leases.
///
/// # Errors
/// In this order: [`StoreError::InvalidSpec`] (`ids`, `claim_ids`), [`StoreError::UnknownTag`],
/// [`StoreError::VersionConflict`], [`StoreError::Exhausted`], [`pool_taken`] and
/// [`lease_taken`] (the last two only after the blind-write flaw).
pub fn allocate(
    req: &AllocRequest,
    row: Option<&TagRow>,
    lease_starts: &BTreeSet<u64>,
    edges: &mut Edges,
) -> Result<AllocWrite, StoreError> {
    check_alloc(req)?;
    let row = row.ok_or_else(|| StoreError::UnknownTag(req.tag.clone()))?;
    assert_eq!(row.tag, req.tag, "the row read is the requested tag's");
    // The situation, whichever branch handles it: someone allocated since the read.
    edges.reach_if(
        row.version != req.expected_version,
        &super::edges::VERSION_CONFLICT,
    );
    match req.blind_max_id {
        Some(read_max_id) => allocate_blind(req, row, read_max_id),
        None => allocate_checked(req, row, lease_starts),
    }
}

/// FLAW [`crate::flaw::Flaw::SegmentNoVersionCheck`]: no version check, no pool, a blind write
/// of `max_id = read_max_id + ids`; the lease replaces another holder's of the same range.
fn allocate_blind(
    req: &AllocRequest,
    row: &TagRow,
    read_max_id: u64,
) -> Result<AllocWrite, StoreError> {
    let read = TagRow {
        max_id: read_max_id,
        ..row.clone()
    };
    let segment = fresh_segment(&read, req.ids)?;
    let after = TagRow {
        max_id: segment.end,
        version: row.version + 1,
        ..row.clone()
    };
    Ok(written(req, after, segment, false))
}

/// The correct grant (Tinyid's optimistic lock, then the pool, then fresh IDs).
fn allocate_checked(
    req: &AllocRequest,
    row: &TagRow,
    lease_starts: &BTreeSet<u64>,
) -> Result<AllocWrite, StoreError> {
    if row.version != req.expected_version {
        return Err(StoreError::VersionConflict {
            tag: req.tag.clone(),
            expected: req.expected_version,
            actual: row.version,
        });
    }
    let mut after = row.clone();
    let (segment, from_pool) = match take_from_pool(&row.pool, req.min_id, req.ids) {
        Some((segment, rest)) => {
            // SQLite rewrites the pool rows (primary key: start) before it inserts the lease:
            // the same checks, in the same order (both fail only after the blind-write flaw).
            if let Some(start) = first_repeated_start(&rest) {
                return Err(pool_taken(&req.tag, start));
            }
            after.pool = rest.into_iter().filter(|s| !s.is_empty()).collect();
            (segment, true)
        }
        None => {
            let segment = fresh_segment(row, req.ids)?;
            after.max_id = segment.end;
            (segment, false)
        }
    };
    if lease_starts.contains(&segment.start) {
        return Err(lease_taken(&req.tag, segment.start));
    }
    after.version += 1;
    Ok(written(req, after, segment, from_pool))
}

/// The write of a grant of `segment` leaving the tag at `after`.
fn written(req: &AllocRequest, after: TagRow, segment: Segment, from_pool: bool) -> AllocWrite {
    assert!(!segment.is_empty(), "a grant holds at least one ID");
    assert!(segment.end <= SEGMENT_ID_LIMIT);
    let grant = Grant {
        tag: req.tag.clone(),
        segment,
        version: after.version,
        claim_end: initial_claim(&segment, req.claim_ids),
        lease_expiry_ms: req.now_ms.saturating_add(req.lease_ms),
        from_pool,
        tag_step: after.step,
    };
    let lease = LeaseRow {
        tag: req.tag.clone(),
        instance: req.instance,
        segment,
        claim_end: grant.claim_end,
        lease_expiry_ms: grant.lease_expiry_ms,
    };
    AllocWrite {
        row: after,
        pool_changed: from_pool,
        lease,
        replace_lease: req.blind_max_id.is_some(),
        grant,
    }
}

/// The first start shared by two non-empty ranges of `ranges` (in order).
fn first_repeated_start(ranges: &[Segment]) -> Option<u64> {
    let mut starts = BTreeSet::new();
    ranges
        .iter()
        .find(|s| !s.is_empty() && !starts.insert(s.start))
        .map(|s| s.start)
}

/// The error of a lease operation by someone who does not hold it.
fn lease_lost(tag: &str, segment_start: u64, instance: InstanceId) -> StoreError {
    StoreError::LeaseLost {
        tag: tag.to_owned(),
        segment_start,
        instance,
    }
}

/// The lease `lease` if `instance` holds it.
fn held_by<'a>(
    lease: Option<&'a LeaseRow>,
    tag: &str,
    segment_start: u64,
    instance: InstanceId,
) -> Result<&'a LeaseRow, StoreError> {
    match lease {
        Some(lease) if lease.instance == instance => {
            assert_eq!(
                (lease.tag.as_str(), lease.segment.start),
                (tag, segment_start)
            );
            Ok(lease)
        }
        _ => Err(lease_lost(tag, segment_start, instance)),
    }
}

/// `renew`: the lease's new claim (raised, never lowered, at most the segment's end) and
/// expiry (extended, never shortened). Write both into the lease row.
///
/// # Errors
/// [`StoreError::LeaseLost`] when there is no such lease or another instance holds it.
pub fn renew(req: &RenewRequest, lease: Option<&LeaseRow>) -> Result<Lease, StoreError> {
    let lease = held_by(lease, &req.tag, req.segment_start, req.instance)?;
    let claim_end = lease.claim_end.max(req.claim_end.min(lease.segment.end));
    let lease_expiry_ms = lease
        .lease_expiry_ms
        .max(req.now_ms.saturating_add(req.lease_ms));
    assert!(claim_end >= lease.claim_end && lease_expiry_ms >= lease.lease_expiry_ms);
    Ok(Lease {
        claim_end,
        lease_expiry_ms,
    })
}

/// `release`: the tail of the lease's segment from `used_end` (aligned) on, to be added to
/// the tag's pool (`None` when empty). Delete the lease row, insert the tail.
///
/// `pool` is the tag's pool.
///
/// # Errors
/// [`StoreError::LeaseLost`]; [`pool_taken`] when the tail starts where a pooled range starts
/// (only after the blind-write flaw).
pub fn release(
    req: &ReleaseRequest,
    lease: Option<&LeaseRow>,
    pool: &[Segment],
) -> Result<Option<Segment>, StoreError> {
    let lease = held_by(lease, &req.tag, req.segment_start, req.instance)?;
    let segment = lease.segment;
    let from = segment
        .align_up(req.used_end.clamp(segment.start, segment.end))
        .min(segment.end);
    let tail = Segment {
        start: from,
        end: segment.end,
        delta: segment.delta,
    };
    if tail.is_empty() {
        return Ok(None);
    }
    if pool_has_start(pool, tail.start) {
        return Err(pool_taken(&req.tag, tail.start));
    }
    Ok(Some(tail))
}

/// Whether a lease has expired by the store's lease clock `now_ms`.
#[must_use]
pub fn lease_expired(lease: &LeaseRow, now_ms: u64) -> bool {
    lease.lease_expiry_ms <= now_ms
}

/// The unclaimed tail of a lease: from its claim (aligned) to its segment's end.
#[must_use]
pub fn unclaimed_tail(lease: &LeaseRow) -> Segment {
    let segment = lease.segment;
    Segment {
        start: segment.align_up(lease.claim_end).min(segment.end),
        end: segment.end,
        delta: segment.delta,
    }
}

/// One expired lease as [`reclaim_expired`] decided it: delete the lease at
/// `(reclaimed.tag, segment_start)` and, if `reclaimed.tail` is not empty, pool the tail.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Expired {
    /// The start of the expired lease's segment (its key with the tag).
    pub segment_start: u64,
    /// The answer's entry (the tail, possibly empty).
    pub reclaimed: Reclaimed,
}

/// `reclaim_expired`: every lease of `leases` expired at `now_ms` ([`lease_expired`]) gives
/// its [`unclaimed_tail`] back to its tag's pool. All or nothing, as SQLite's transaction.
///
/// `leases` must hold every expired lease, ordered by tag then segment start (it may hold live
/// ones too); `tags` the tag rows (with pools) of their tags.
///
/// # Errors
/// [`pool_taken`] for the first tail (in that order) starting where a pooled range, or an
/// earlier tail of this sweep, starts (only after the blind-write flaw): nothing is reclaimed.
pub fn reclaim_expired<'a>(
    now_ms: u64,
    leases: impl IntoIterator<Item = &'a LeaseRow>,
    tags: &BTreeMap<Tag, TagRow>,
    edges: &mut Edges,
) -> Result<Vec<Expired>, StoreError> {
    let mut added: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut expired: Vec<Expired> = Vec::new();
    for lease in leases.into_iter().filter(|l| lease_expired(l, now_ms)) {
        if let Some(last) = expired.last() {
            let key = (&last.reclaimed.tag, last.segment_start);
            assert!(
                key < (&lease.tag, lease.segment.start),
                "leases in key order"
            );
        }
        let tail = unclaimed_tail(lease);
        if !tail.is_empty() {
            let pooled = tags
                .get(&lease.tag)
                .is_some_and(|row| pool_has_start(&row.pool, tail.start));
            if pooled || !added.insert((lease.tag.as_str(), tail.start)) {
                return Err(pool_taken(&lease.tag, tail.start));
            }
        }
        expired.push(Expired {
            segment_start: lease.segment.start,
            reclaimed: Reclaimed {
                tag: lease.tag.clone(),
                instance: lease.instance,
                tail,
            },
        });
    }
    for entry in &expired {
        edges.reach_if(
            !entry.reclaimed.tail.is_empty(),
            &super::edges::ZOMBIE_TAIL_RECLAIMED,
        );
    }
    Ok(expired)
}

/// A worker id's row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerRow {
    /// The holder; `None` once released.
    pub holder: Option<InstanceId>,
    /// Expiry by the store's lease clock.
    pub lease_expiry_ms: u64,
    /// The largest timestamp any holder of this id may have issued.
    pub reserved_ts: u64,
}

impl WorkerRow {
    /// The answer for this row as worker id `worker_id`.
    #[must_use]
    pub const fn lease(&self, worker_id: u32) -> WorkerLease {
        WorkerLease {
            worker_id,
            lease_expiry_ms: self.lease_expiry_ms,
            reserved_ts: self.reserved_ts,
        }
    }
}

/// `acquire_worker`: the id to lease and its row after the lease. The instance's own id comes
/// first (the lowest one it holds), else the lowest id never leased, released, or expired. The
/// reservation stays with the id for the next holder.
///
/// `rows` are the namespace's worker rows with ids below `req.worker_count`.
///
/// # Errors
/// [`StoreError::InvalidSpec`] for a `worker_count` of 0, [`StoreError::NoFreeWorker`].
pub fn acquire_worker(
    req: &WorkerRequest,
    rows: &BTreeMap<u32, WorkerRow>,
) -> Result<(u32, WorkerRow), StoreError> {
    if req.worker_count == 0 {
        return Err(StoreError::InvalidSpec {
            field: "worker_count".into(),
            reason: "must be at least 1".into(),
        });
    }
    let mine = rows
        .iter()
        .find(|(id, row)| **id < req.worker_count && row.holder == Some(req.instance))
        .map(|(id, _)| *id);
    let chosen = mine.or_else(|| {
        (0..req.worker_count).find(|id| match rows.get(id) {
            None => true,
            Some(row) => row.holder.is_none() || row.lease_expiry_ms <= req.now_ms,
        })
    });
    let Some(worker_id) = chosen else {
        return Err(StoreError::NoFreeWorker {
            namespace: req.namespace.clone(),
            worker_count: req.worker_count,
        });
    };
    assert!(worker_id < req.worker_count);
    let row = WorkerRow {
        holder: Some(req.instance),
        lease_expiry_ms: req.now_ms.saturating_add(req.lease_ms),
        reserved_ts: rows.get(&worker_id).map_or(0, |row| row.reserved_ts),
    };
    Ok((worker_id, row))
}

/// `renew_worker`'s request (the arguments of [`super::IdStore::renew_worker`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkerRenewal<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The worker id.
    pub worker_id: u32,
    /// The would-be holder.
    pub instance: InstanceId,
    /// The reservation to persist (raises, never lowers).
    pub reserve_ts: u64,
    /// Lease length from `now_ms`.
    pub lease_ms: u64,
    /// The store's lease clock.
    pub now_ms: u64,
}

fn worker_lost(namespace: &str, worker_id: u32, instance: InstanceId) -> StoreError {
    StoreError::WorkerLeaseLost {
        namespace: namespace.to_owned(),
        worker_id,
        instance,
    }
}

/// `renew_worker`: the worker row after raising its reservation and extending its lease.
///
/// # Errors
/// [`StoreError::WorkerLeaseLost`] when the row is absent or `instance` does not hold it.
pub fn renew_worker(
    req: &WorkerRenewal<'_>,
    row: Option<&WorkerRow>,
) -> Result<WorkerRow, StoreError> {
    let row = row
        .filter(|row| row.holder == Some(req.instance))
        .ok_or_else(|| worker_lost(req.namespace, req.worker_id, req.instance))?;
    Ok(WorkerRow {
        holder: row.holder,
        lease_expiry_ms: row
            .lease_expiry_ms
            .max(req.now_ms.saturating_add(req.lease_ms)),
        reserved_ts: row.reserved_ts.max(req.reserve_ts),
    })
}

/// `release_worker`: the worker row with no holder (its reservation stays).
///
/// # Errors
/// [`StoreError::WorkerLeaseLost`] when the row is absent or `instance` does not hold it.
pub fn release_worker(
    namespace: &str,
    worker_id: u32,
    instance: InstanceId,
    row: Option<&WorkerRow>,
) -> Result<WorkerRow, StoreError> {
    let row = row
        .filter(|row| row.holder == Some(instance))
        .ok_or_else(|| worker_lost(namespace, worker_id, instance))?;
    Ok(WorkerRow {
        holder: None,
        ..row.clone()
    })
}

/// A counter of the counter engine: its live value and what survives a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Counter {
    /// The live value (what the last increment answered).
    pub value: u64,
    /// The value a crash falls back to (last synced).
    pub durable: u64,
    /// When it was last synced, by the caller's clock.
    pub synced_at_ms: u64,
}

impl Counter {
    /// A counter first touched at `now_ms`, whose durable value is `durable` (0 when new).
    #[must_use]
    pub const fn loaded(durable: u64, now_ms: u64) -> Self {
        Self {
            value: durable,
            durable,
            synced_at_ms: now_ms,
        }
    }
}

/// What an increment writes: the counter after it, and whether it is synced now (write the
/// value durably).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CounterWrite {
    /// The counter after the increment; its `value` is the answer.
    pub counter: Counter,
    /// The increment is made durable now.
    pub sync: bool,
}

/// `incr_by`: adds `n`; syncs on every write (`EveryWrite`) or once `interval_ms` has passed
/// since the last sync (`Periodic`, `Snapshot`).
///
/// # Errors
/// [`StoreError::Exhausted`] naming `key` when the value would overflow.
pub fn incr_by(
    key: &str,
    counter: Counter,
    n: u64,
    now_ms: u64,
    durability: CounterDurability,
) -> Result<CounterWrite, StoreError> {
    assert!(counter.durable <= counter.value, "a counter only grows");
    let value = counter
        .value
        .checked_add(n)
        .ok_or_else(|| StoreError::Exhausted(key.to_owned()))?;
    let interval_ms = durability.interval_ms();
    let sync = interval_ms == 0 || now_ms.saturating_sub(counter.synced_at_ms) >= interval_ms;
    let counter = if sync {
        Counter {
            value,
            durable: value,
            synced_at_ms: now_ms,
        }
    } else {
        Counter { value, ..counter }
    };
    Ok(CounterWrite { counter, sync })
}

/// A correct grant whose range starts where another holder's lease starts: possible only after
/// the blind-write flaw moved `max_id` back and gave the range out once already. The grant is
/// refused and nothing changes (as SQLite's primary key on the lease row would refuse it).
#[must_use]
pub fn lease_taken(tag: &str, segment_start: u64) -> StoreError {
    StoreError::Backend(format!(
        "a lease of the segment starting at {segment_start} of `{tag}` is already held"
    ))
}

/// A tail returned to the pool where a pooled range already starts: possible only after the
/// blind-write flaw gave one range out twice. Refused with nothing changed, as SQLite's primary
/// key on the pool row would refuse it.
#[must_use]
pub fn pool_taken(tag: &str, start: u64) -> StoreError {
    StoreError::Backend(format!(
        "a pooled range starting at {start} of `{tag}` already exists"
    ))
}

/// Whether `pool` holds a range starting at `start` (see [`pool_taken`]).
fn pool_has_start(pool: &[Segment], start: u64) -> bool {
    pool.iter().any(|s| s.start == start)
}

/// Validation of an allocation request: [`allocate`] checks it first.
///
/// # Errors
/// [`StoreError::InvalidSpec`] naming `ids` or `claim_ids` when it is 0.
pub fn check_alloc(req: &AllocRequest) -> Result<(), StoreError> {
    if req.ids == 0 {
        return Err(StoreError::InvalidSpec {
            field: "ids".into(),
            reason: "must be at least 1".into(),
        });
    }
    if req.claim_ids == 0 {
        return Err(StoreError::InvalidSpec {
            field: "claim_ids".into(),
            reason: "must be at least 1".into(),
        });
    }
    Ok(())
}

/// The segment a fresh (non-pool) allocation of `ids` IDs grants from a tag at `row`: from
/// `max_id` on, cut short at [`SEGMENT_ID_LIMIT`] (a short final segment, never a wrap).
///
/// # Errors
/// [`StoreError::Exhausted`] when the tag's ID space is used up.
pub fn fresh_segment(row: &TagRow, ids: u64) -> Result<Segment, StoreError> {
    let span = ids
        .checked_mul(row.delta)
        .ok_or_else(|| StoreError::Exhausted(row.tag.clone()))?;
    let end = row
        .max_id
        .checked_add(span)
        .filter(|end| *end <= SEGMENT_ID_LIMIT);
    match end {
        Some(end) => Ok(Segment {
            start: row.max_id,
            end,
            delta: row.delta,
        }),
        None if row.max_id < SEGMENT_ID_LIMIT => {
            // A short final segment up to the limit, then Exhausted forever after.
            Ok(Segment {
                start: row.max_id,
                end: SEGMENT_ID_LIMIT,
                delta: row.delta,
            })
        }
        None => Err(StoreError::Exhausted(row.tag.clone())),
    }
}

/// Picks from `pool` the first range with IDs at or above `min_id`, clipped to `ids` IDs.
/// Returns the granted segment and the pool as it must be stored afterwards (`None`: nothing
/// in the pool qualifies, grant a fresh segment).
#[must_use]
pub fn take_from_pool(pool: &[Segment], min_id: u64, ids: u64) -> Option<(Segment, Vec<Segment>)> {
    let mut rest = Vec::with_capacity(pool.len() + 1);
    let mut granted = None;
    for range in pool {
        if granted.is_some() {
            rest.push(*range);
            continue;
        }
        let from = range.align_up(range.start.max(min_id));
        if from >= range.end {
            rest.push(*range);
            continue;
        }
        if from > range.start {
            rest.push(Segment {
                start: range.start,
                end: from,
                delta: range.delta,
            });
        }
        let wanted_end = from.saturating_add(ids.saturating_mul(range.delta));
        let end = wanted_end.min(range.end);
        if end < range.end {
            rest.push(Segment {
                start: end,
                end: range.end,
                delta: range.delta,
            });
        }
        granted = Some(Segment {
            start: from,
            end,
            delta: range.delta,
        });
    }
    rest.sort_unstable();
    granted.map(|segment| (segment, rest))
}

/// The initial claim of a fresh grant: `claim_ids` IDs from the segment's start, at most its
/// end.
#[must_use]
pub fn initial_claim(segment: &Segment, claim_ids: u64) -> u64 {
    segment
        .start
        .saturating_add(claim_ids.saturating_mul(segment.delta))
        .min(segment.end)
}

/// Adds a tail to a pool, keeping it sorted and merging nothing (ranges never overlap).
pub fn pool_insert(pool: &mut Vec<Segment>, tail: Segment) {
    if !tail.is_empty() {
        pool.push(tail);
        pool.sort_unstable();
    }
}

#[cfg(test)]
mod tests;
