//! The in-memory ID store: the simulator's database node and the models use it.
//!
//! Everything is an ordered collection so that the whole store can be cloned, hashed and
//! compared (stateright), and so that iteration order never depends on a hasher.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, Segment, StoreError, Tag, TagRow, TagSpec, WorkerLease,
    WorkerRequest, align_up, check_alloc, fresh_segment, initial_claim, pool_insert,
    take_from_pool,
};

/// A worker id's row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct WorkerRow {
    /// `None` once released.
    holder: Option<InstanceId>,
    lease_expiry_ms: u64,
    reserved_ts: u64,
}

/// A counter of the counter engine: its live value and what would survive a crash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Counter {
    value: u64,
    durable: u64,
    synced_at_ms: u64,
}

/// The in-memory ID store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryIdStore {
    tags: BTreeMap<Tag, TagRow>,
    leases: BTreeMap<(Tag, u64), LeaseRow>,
    workers: BTreeMap<(String, u32), WorkerRow>,
    counters: BTreeMap<String, Counter>,
    durability: CounterDurability,
}

impl MemoryIdStore {
    /// An empty store whose counter engine syncs every write.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store with the given counter durability.
    #[must_use]
    pub fn with_counter_durability(durability: CounterDurability) -> Self {
        Self {
            durability,
            ..Self::default()
        }
    }

    /// Simulates a crash of the counter engine: every counter falls back to its last synced
    /// value. (Tags, leases and workers are always durable in this store; the simulator's disk
    /// model decides what of *them* survives.) Returns, per counter, how many increments' worth
    /// of value were lost.
    pub fn crash_counters(&mut self) -> BTreeMap<String, u64> {
        let mut lost = BTreeMap::new();
        for (key, counter) in &mut self.counters {
            let delta = counter.value - counter.durable;
            if delta > 0 {
                lost.insert(key.clone(), delta);
            }
            counter.value = counter.durable;
        }
        lost
    }
}

impl IdStore for MemoryIdStore {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        spec.validate()?;
        if self.tags.contains_key(tag) {
            return Err(StoreError::TagExists(tag.to_owned()));
        }
        let row = TagRow {
            tag: tag.to_owned(),
            max_id: align_up(spec.first_id, spec.remainder, spec.delta),
            step: spec.step,
            delta: spec.delta,
            remainder: spec.remainder,
            version: 0,
            pool: Vec::new(),
        };
        self.tags.insert(tag.to_owned(), row.clone());
        Ok(row)
    }

    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError> {
        self.tags
            .get(tag)
            .cloned()
            .ok_or_else(|| StoreError::UnknownTag(tag.to_owned()))
    }

    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        check_alloc(req)?;
        let row = self
            .tags
            .get_mut(&req.tag)
            .ok_or_else(|| StoreError::UnknownTag(req.tag.clone()))?;
        let (segment, from_pool) = if let Some(read_max_id) = req.blind_max_id {
            // The flaw: no version check, no pool, a blind write of what the requester read.
            let read = TagRow {
                max_id: read_max_id,
                ..row.clone()
            };
            let segment = fresh_segment(&read, req.ids)?;
            row.max_id = segment.end;
            (segment, false)
        } else {
            if row.version != req.expected_version {
                return Err(StoreError::VersionConflict {
                    tag: req.tag.clone(),
                    expected: req.expected_version,
                    actual: row.version,
                });
            }
            let (segment, rest) = match take_from_pool(&row.pool, req.min_id, req.ids) {
                Some((segment, rest)) => (segment, Some(rest)),
                None => (fresh_segment(row, req.ids)?, None),
            };
            // SQLite rewrites the pool rows (primary key: start), then inserts the lease: the
            // same checks, in the same order, before anything changes (both can fail only after
            // the blind-write flaw overlapped ranges).
            if let Some(rest) = &rest {
                let mut starts = BTreeSet::new();
                if let Some(dup) = rest
                    .iter()
                    .find(|s| !s.is_empty() && !starts.insert(s.start))
                {
                    return Err(super::pool_taken(&req.tag, dup.start));
                }
            }
            if self.leases.contains_key(&(req.tag.clone(), segment.start)) {
                return Err(super::lease_taken(&req.tag, segment.start));
            }
            let from_pool = rest.is_some();
            match rest {
                Some(rest) => row.pool = rest,
                None => row.max_id = segment.end,
            }
            (segment, from_pool)
        };
        row.version += 1;
        let grant = Grant {
            tag: req.tag.clone(),
            segment,
            version: row.version,
            claim_end: initial_claim(&segment, req.claim_ids),
            lease_expiry_ms: req.now_ms.saturating_add(req.lease_ms),
            from_pool,
            tag_step: row.step,
        };
        let lease = LeaseRow {
            tag: req.tag.clone(),
            instance: req.instance,
            segment,
            claim_end: grant.claim_end,
            lease_expiry_ms: grant.lease_expiry_ms,
        };
        let replaced = self.leases.insert((req.tag.clone(), segment.start), lease);
        debug_assert!(
            replaced.is_none() || req.blind_max_id.is_some(),
            "segment {segment:?} of `{}` granted twice",
            req.tag
        );
        Ok(grant)
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        let lost = || StoreError::LeaseLost {
            tag: req.tag.clone(),
            segment_start: req.segment_start,
            instance: req.instance,
        };
        let lease = self
            .leases
            .get_mut(&(req.tag.clone(), req.segment_start))
            .ok_or_else(lost)?;
        if lease.instance != req.instance {
            return Err(lost());
        }
        lease.claim_end = lease.claim_end.max(req.claim_end.min(lease.segment.end));
        lease.lease_expiry_ms = lease
            .lease_expiry_ms
            .max(req.now_ms.saturating_add(req.lease_ms));
        Ok(Lease {
            claim_end: lease.claim_end,
            lease_expiry_ms: lease.lease_expiry_ms,
        })
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        let key = (req.tag.clone(), req.segment_start);
        let lost = || StoreError::LeaseLost {
            tag: req.tag.clone(),
            segment_start: req.segment_start,
            instance: req.instance,
        };
        let lease = self.leases.get(&key).ok_or_else(lost)?;
        if lease.instance != req.instance {
            return Err(lost());
        }
        let segment = lease.segment;
        let from = segment
            .align_up(req.used_end.clamp(segment.start, segment.end))
            .min(segment.end);
        let tail = Segment {
            start: from,
            end: segment.end,
            delta: segment.delta,
        };
        if let Some(row) = self.tags.get_mut(&req.tag) {
            if !tail.is_empty() && super::pool_has_start(&row.pool, tail.start) {
                return Err(super::pool_taken(&req.tag, tail.start));
            }
            pool_insert(&mut row.pool, tail);
        }
        self.leases.remove(&key);
        Ok(())
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        let expired: Vec<(Tag, u64)> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.lease_expiry_ms <= now_ms)
            .map(|(key, _)| key.clone())
            .collect();
        let tail_of = |lease: &LeaseRow| {
            let segment = lease.segment;
            Segment {
                start: segment.align_up(lease.claim_end).min(segment.end),
                end: segment.end,
                delta: segment.delta,
            }
        };
        // All or nothing, as SQLite's transaction: a tail starting where a pooled range (or an
        // earlier tail of this sweep) starts refuses the whole sweep (after the blind-write flaw
        // only, see `pool_taken`).
        let mut added: BTreeSet<(&str, u64)> = BTreeSet::new();
        for key in &expired {
            let lease = &self.leases[key];
            let tail = tail_of(lease);
            if tail.is_empty() {
                continue;
            }
            let pooled = self
                .tags
                .get(&lease.tag)
                .is_some_and(|row| super::pool_has_start(&row.pool, tail.start));
            if pooled || !added.insert((lease.tag.as_str(), tail.start)) {
                return Err(super::pool_taken(&lease.tag, tail.start));
            }
        }
        drop(added);
        let mut reclaimed = Vec::with_capacity(expired.len());
        for key in expired {
            let lease = self.leases.remove(&key).expect("key listed above");
            let tail = tail_of(&lease);
            if let Some(row) = self.tags.get_mut(&lease.tag) {
                pool_insert(&mut row.pool, tail);
            }
            reclaimed.push(Reclaimed {
                tag: lease.tag,
                instance: lease.instance,
                tail,
            });
        }
        Ok(reclaimed)
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        Ok(self.leases.values().cloned().collect())
    }

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        if req.worker_count == 0 {
            return Err(StoreError::InvalidSpec {
                field: "worker_count".into(),
                reason: "must be at least 1".into(),
            });
        }
        let ns = &req.namespace;
        let mine = self
            .workers
            .range((ns.clone(), 0)..(ns.clone(), req.worker_count))
            .find(|(_, row)| row.holder == Some(req.instance))
            .map(|((_, id), _)| *id);
        let chosen = mine.or_else(|| {
            (0..req.worker_count).find(|id| match self.workers.get(&(ns.clone(), *id)) {
                None => true,
                Some(row) => row.holder.is_none() || row.lease_expiry_ms <= req.now_ms,
            })
        });
        let Some(worker_id) = chosen else {
            return Err(StoreError::NoFreeWorker {
                namespace: ns.clone(),
                worker_count: req.worker_count,
            });
        };
        let row = self
            .workers
            .entry((ns.clone(), worker_id))
            .or_insert(WorkerRow {
                holder: None,
                lease_expiry_ms: 0,
                reserved_ts: 0,
            });
        row.holder = Some(req.instance);
        row.lease_expiry_ms = req.now_ms.saturating_add(req.lease_ms);
        Ok(WorkerLease {
            worker_id,
            lease_expiry_ms: row.lease_expiry_ms,
            reserved_ts: row.reserved_ts,
        })
    }

    fn renew_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
        reserve_ts: u64,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<WorkerLease, StoreError> {
        let lost = || StoreError::WorkerLeaseLost {
            namespace: namespace.to_owned(),
            worker_id,
            instance,
        };
        let row = self
            .workers
            .get_mut(&(namespace.to_owned(), worker_id))
            .ok_or_else(lost)?;
        if row.holder != Some(instance) {
            return Err(lost());
        }
        row.reserved_ts = row.reserved_ts.max(reserve_ts);
        row.lease_expiry_ms = row.lease_expiry_ms.max(now_ms.saturating_add(lease_ms));
        Ok(WorkerLease {
            worker_id,
            lease_expiry_ms: row.lease_expiry_ms,
            reserved_ts: row.reserved_ts,
        })
    }

    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        let lost = || StoreError::WorkerLeaseLost {
            namespace: namespace.to_owned(),
            worker_id,
            instance,
        };
        let row = self
            .workers
            .get_mut(&(namespace.to_owned(), worker_id))
            .ok_or_else(lost)?;
        if row.holder != Some(instance) {
            return Err(lost());
        }
        row.holder = None;
        Ok(())
    }

    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let interval_ms = self.durability.interval_ms();
        let counter = self.counters.entry(key.to_owned()).or_insert(Counter {
            value: 0,
            durable: 0,
            synced_at_ms: now_ms,
        });
        let value = counter
            .value
            .checked_add(n)
            .ok_or_else(|| StoreError::Exhausted(key.to_owned()))?;
        counter.value = value;
        if interval_ms == 0 || now_ms.saturating_sub(counter.synced_at_ms) >= interval_ms {
            counter.durable = value;
            counter.synced_at_ms = now_ms;
        }
        Ok(value)
    }
}
