//! The in-memory ID store: the simulator's database node and the models use it.
//!
//! Everything is an ordered collection so that the whole store can be cloned, hashed and
//! compared (stateright), and so that iteration order never depends on a hasher. Every
//! mutating operation reads its rows, calls its rule in [`super::rules`] and stores what the
//! rule decided; [`MemoryIdStore::check_invariants`] states what the rules promise of the rows.

use crate::edge::{Edges, Observed};
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::rules::{self, Counter, WorkerRenewal, WorkerRow};
use super::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, StoreError, Tag, TagRow, TagSpec, WorkerLease, WorkerRequest,
};

mod invariants;

/// The in-memory ID store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryIdStore {
    pub(crate) tags: BTreeMap<Tag, TagRow>,
    /// Each tag's first ID (its `max_id` at creation), the floor of everything it grants.
    #[serde(default)]
    pub(crate) first_ids: BTreeMap<Tag, u64>,
    pub(crate) leases: BTreeMap<(Tag, u64), LeaseRow>,
    pub(crate) workers: BTreeMap<(String, u32), WorkerRow>,
    /// Each namespace's worker count, while every acquire of it has named the same one
    /// (`None` once two differ: the count is then unknown).
    #[serde(default)]
    pub(crate) worker_counts: BTreeMap<String, Option<u32>>,
    pub(crate) counters: BTreeMap<String, Counter>,
    pub(crate) durability: CounterDurability,
    /// Arrivals at the rules' edge states since its driver last took them (a ghost).
    #[serde(skip)]
    pub(crate) edges: Edges,
}

impl Observed for MemoryIdStore {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
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

    /// The segment starts of `tag`'s leases.
    fn lease_starts(&self, tag: &str) -> BTreeSet<u64> {
        let tag = tag.to_owned();
        self.leases
            .range((tag.clone(), 0)..=(tag, u64::MAX))
            .map(|((_, start), _)| *start)
            .collect()
    }

    /// Remembers the worker count an acquire named (unknown once two differ).
    fn note_worker_count(&mut self, namespace: &str, worker_count: u32) {
        let known = self
            .worker_counts
            .entry(namespace.to_owned())
            .or_insert(Some(worker_count));
        if *known != Some(worker_count) {
            *known = None;
        }
    }
}

impl IdStore for MemoryIdStore {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        let row = rules::create_tag(tag, spec, self.tags.contains_key(tag))?;
        self.first_ids.insert(tag.to_owned(), row.max_id);
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
        let lease_starts = self.lease_starts(&req.tag);
        let write = rules::allocate(req, self.tags.get(&req.tag), &lease_starts, &mut self.edges)?;
        let start = write.lease.segment.start;
        self.tags.insert(req.tag.clone(), write.row);
        let replaced = self.leases.insert((req.tag.clone(), start), write.lease);
        assert!(
            replaced.is_none() || write.replace_lease,
            "segment at {start} of `{}` granted twice",
            req.tag
        );
        Ok(write.grant)
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        let key = (req.tag.clone(), req.segment_start);
        let renewed = rules::renew(req, self.leases.get(&key))?;
        let lease = self.leases.get_mut(&key).expect("the rule found the lease");
        lease.claim_end = renewed.claim_end;
        lease.lease_expiry_ms = renewed.lease_expiry_ms;
        Ok(renewed)
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        let key = (req.tag.clone(), req.segment_start);
        let pool = self.tags.get(&req.tag).map_or(&[][..], |row| &row.pool);
        let tail = rules::release(req, self.leases.get(&key), pool)?;
        self.leases.remove(&key);
        if let (Some(tail), Some(row)) = (tail, self.tags.get_mut(&req.tag)) {
            rules::pool_insert(&mut row.pool, tail);
        }
        Ok(())
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        let expired =
            rules::reclaim_expired(now_ms, self.leases.values(), &self.tags, &mut self.edges)?;
        let mut reclaimed = Vec::with_capacity(expired.len());
        for rules::Expired {
            segment_start,
            reclaimed: entry,
        } in expired
        {
            let removed = self.leases.remove(&(entry.tag.clone(), segment_start));
            assert!(removed.is_some(), "the rule reclaims only held leases");
            if let Some(row) = self.tags.get_mut(&entry.tag) {
                rules::pool_insert(&mut row.pool, entry.tail);
            }
            reclaimed.push(entry);
        }
        Ok(reclaimed)
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        Ok(self.leases.values().cloned().collect())
    }

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        let ns = &req.namespace;
        let rows: BTreeMap<u32, WorkerRow> = self
            .workers
            .range((ns.clone(), 0)..(ns.clone(), req.worker_count))
            .map(|((_, id), row)| (*id, row.clone()))
            .collect();
        let chosen = rules::acquire_worker(req, &rows);
        if req.worker_count > 0 {
            self.note_worker_count(ns, req.worker_count);
        }
        let (worker_id, row) = chosen?;
        let lease = row.lease(worker_id);
        self.workers.insert((ns.clone(), worker_id), row);
        Ok(lease)
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
        let req = WorkerRenewal {
            namespace,
            worker_id,
            instance,
            reserve_ts,
            lease_ms,
            now_ms,
        };
        let key = (namespace.to_owned(), worker_id);
        let row = rules::renew_worker(&req, self.workers.get(&key))?;
        let lease = row.lease(worker_id);
        self.workers.insert(key, row);
        Ok(lease)
    }

    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        let key = (namespace.to_owned(), worker_id);
        let row = rules::release_worker(namespace, worker_id, instance, self.workers.get(&key))?;
        self.workers.insert(key, row);
        Ok(())
    }

    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let counter = self
            .counters
            .entry(key.to_owned())
            .or_insert(Counter::loaded(0, now_ms));
        let write = rules::incr_by(key, *counter, n, now_ms, self.durability)?;
        *counter = write.counter;
        Ok(write.counter.value)
    }

    fn flush_counters(&mut self) -> Result<(), StoreError> {
        for counter in self.counters.values_mut() {
            counter.durable = counter.value;
        }
        Ok(())
    }
}
