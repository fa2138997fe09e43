//! The ID store on a database server, written once for PostgreSQL and MariaDB: tags, segment
//! grants, leases, the reclaim pool, Snowflake worker leases and the counter engine, shared by
//! every ID server on one database.
//!
//! The twin of `SqliteIdStore`: each operation is one SERIALIZABLE transaction
//! ([`SqlConn::transact`]) that reads the rows a rule of [`sut::id_store::rules`] names, calls the
//! rule and writes what it decided. What differs between the servers is only how a row is read
//! or written ([`IdRows`], implemented by each server's transaction). Two ID servers allocating
//! for one tag at once both read version `v`; one commits, the other is rolled back (a
//! serialization failure, or InnoDB's deadlock) and retried from the read, so it sees `v + 1`
//! and takes the next segment. The allocation's `UPDATE … WHERE version = ?` is a second guard.

use std::collections::{BTreeMap, BTreeSet};

use sut::edge::Edges;
use sut::id_store::rules::{self, AllocWrite, Counter, WorkerRenewal, WorkerRow};
use sut::id_store::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, Segment, StoreError, TagRow, TagSpec, WorkerLease, WorkerRequest,
};

use super::{DbError, SqlConn};

/// Lost serialization races of one allocation after which the planted weakness
/// `unguarded_fallback` writes it unguarded.
pub const UNGUARDED_AFTER_TRIES: u32 = 1;

/// How an ID store's rows are read and written in one server's transaction.
pub trait IdRows {
    /// Whether tag `tag` exists.
    fn tag_exists(&mut self, tag: &str) -> Result<bool, DbError>;
    /// Inserts the new tag `row` (its pool is empty).
    fn insert_tag(&mut self, row: &TagRow) -> Result<(), DbError>;
    /// The tag row of `tag` without its pool, if the tag exists.
    fn tag_row(&mut self, tag: &str) -> Result<Option<TagRow>, DbError>;
    /// `tag`'s pooled ranges, lowest first.
    fn pool(&mut self, tag: &str) -> Result<Vec<Segment>, DbError>;
    /// Sets the tag's `max_id` and version, where its version is `read_version` (any version
    /// when `None`: the blind-write flaw); the rows it matched.
    fn set_tag(&mut self, row: &TagRow, read_version: Option<u64>) -> Result<u64, DbError>;
    /// Deletes every pooled range of `tag`.
    fn clear_pool(&mut self, tag: &str) -> Result<(), DbError>;
    /// Pools the (non-empty) range `range` of `tag`.
    fn insert_pool(&mut self, tag: &str, range: &Segment) -> Result<(), DbError>;
    /// The segment starts of `tag`'s leases.
    fn lease_starts(&mut self, tag: &str) -> Result<BTreeSet<u64>, DbError>;
    /// Records a lease; `replace` (the blind-write flaw only) overwrites another holder's lease
    /// of the same range.
    fn insert_lease(&mut self, lease: &LeaseRow, replace: bool) -> Result<(), DbError>;
    /// The lease of `tag` starting at `segment_start`, if any.
    fn lease(&mut self, tag: &str, segment_start: u64) -> Result<Option<LeaseRow>, DbError>;
    /// Sets a lease's claim end and expiry.
    fn renew_lease(&mut self, renewed: &Lease, req: &RenewRequest) -> Result<(), DbError>;
    /// Deletes the lease of `tag` starting at `segment_start`.
    fn delete_lease(&mut self, tag: &str, segment_start: u64) -> Result<(), DbError>;
    /// The leases expired at `now_ms`, by tag then segment start (the rule decides which are;
    /// this only narrows the read).
    fn expired_leases(&mut self, now_ms: u64) -> Result<Vec<LeaseRow>, DbError>;
    /// Every lease, by tag then segment start.
    fn leases(&mut self) -> Result<Vec<LeaseRow>, DbError>;
    /// The worker rows of `namespace` with ids below `worker_count`.
    fn workers(
        &mut self,
        namespace: &str,
        worker_count: u32,
    ) -> Result<BTreeMap<u32, WorkerRow>, DbError>;
    /// The worker row `worker_id` of `namespace`, if any.
    fn worker(&mut self, namespace: &str, worker_id: u32) -> Result<Option<WorkerRow>, DbError>;
    /// Writes the worker row `worker_id` of `namespace`.
    fn set_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        row: &WorkerRow,
    ) -> Result<(), DbError>;
    /// The durable value of counter `key` (0 if never written).
    fn counter(&mut self, key: &str) -> Result<u64, DbError>;
    /// Writes counter `key`.
    fn set_counter(&mut self, key: &str, value: u64) -> Result<(), DbError>;
}

/// The ID store on a database server whose connection is `C`.
#[derive(Debug)]
pub struct SqlIdStore<C> {
    conn: C,
    durability: CounterDurability,
    /// Counters held in memory between syncs (non-`EveryWrite` durability).
    live_counters: BTreeMap<String, Counter>,
    /// The planted weakness `unguarded_fallback` (TEST ONLY).
    unguarded_fallback: bool,
}

impl<C: SqlConn> SqlIdStore<C> {
    /// The store on `conn`, whose schema exists.
    pub(crate) fn on(conn: C, durability: CounterDurability) -> Self {
        Self {
            conn,
            durability,
            live_counters: BTreeMap::new(),
            unguarded_fallback: false,
        }
    }

    /// The planted weakness `unguarded_fallback` (`sut-server --weakness unguarded_fallback`,
    /// TEST ONLY) when `on`: an allocation that lost the serialization race
    /// [`UNGUARDED_AFTER_TRIES`] times in a row falls back to an unguarded one, as a store that
    /// must answer under contention might: the tag row (and its leases) read in one transaction
    /// and what the rule decided written in the next, `max_id` set with no version compare and
    /// the lease written over any other of the same range. Two servers that reload at once then
    /// take the same range. Allocations lose races in a row all the time under contention, and
    /// only by chance otherwise (a burst of first allocations as servers start).
    #[must_use]
    pub fn unguarded_fallback(mut self, on: bool) -> Self {
        self.unguarded_fallback = on;
        self
    }

    /// The unguarded allocation of the planted weakness `unguarded_fallback`.
    fn allocate_unguarded(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        let (row, starts) = self.conn.transact(|tx| {
            let row = find_tag(tx, &req.tag)?;
            let starts = tx.lease_starts(&req.tag)?;
            Ok::<_, StoreError>((row, starts))
        })?;
        let write = rules::allocate(req, row.as_ref(), &starts, &mut Edges::new())?;
        self.conn.transact(|tx| {
            tx.set_tag(&write.row, None)?;
            if write.pool_changed {
                tx.clear_pool(&write.row.tag)?;
                for range in &write.row.pool {
                    pool_range(tx, &write.row.tag, range)?;
                }
            }
            tx.insert_lease(&write.lease, true)?;
            Ok::<_, StoreError>(write.grant.clone())
        })
    }

    /// Runs the counter rule on a counter loaded from (or to be synced to) the database.
    fn incr_synced(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let durability = self.durability;
        self.conn.transact(|tx| {
            let counter = Counter::loaded(tx.counter(key)?, now_ms);
            let write = rules::incr_by(key, counter, n, now_ms, durability)?;
            assert!(write.sync, "every write is synced");
            tx.set_counter(key, write.counter.value)?;
            Ok(write.counter.value)
        })
    }

    /// Runs the counter rule on a counter held in memory, syncing when the rule says so.
    fn incr_live(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        if !self.live_counters.contains_key(key) {
            let durable = self
                .conn
                .transact(|tx| tx.counter(key).map_err(StoreError::from))?;
            self.live_counters
                .insert(key.to_owned(), Counter::loaded(durable, now_ms));
        }
        let counter = self.live_counters[key];
        let write = rules::incr_by(key, counter, n, now_ms, self.durability)?;
        if write.sync {
            self.conn.transact(|tx| {
                tx.set_counter(key, write.counter.value)
                    .map_err(StoreError::from)
            })?;
        }
        self.live_counters.insert(key.to_owned(), write.counter);
        Ok(write.counter.value)
    }
}

/// The tag row with its pool, if the tag exists.
fn find_tag<R: IdRows>(tx: &mut R, tag: &str) -> Result<Option<TagRow>, DbError> {
    let Some(mut row) = tx.tag_row(tag)? else {
        return Ok(None);
    };
    row.pool = tx.pool(tag)?;
    Ok(Some(row))
}

/// The tag row with its pool.
fn read_tag<R: IdRows>(tx: &mut R, tag: &str) -> Result<TagRow, StoreError> {
    find_tag(tx, tag)?.ok_or_else(|| StoreError::UnknownTag(tag.to_owned()))
}

/// Pools `range` unless it is empty.
fn pool_range<R: IdRows>(tx: &mut R, tag: &str, range: &Segment) -> Result<(), DbError> {
    if range.is_empty() {
        return Ok(());
    }
    tx.insert_pool(tag, range)
}

/// Persists an allocation the rule decided (see the SQLite twin): the tag's `max_id` and
/// version, compared with the version read unless the blind-write flaw writes without it.
fn persist_allocation<R: IdRows>(
    tx: &mut R,
    read_version: u64,
    write: &AllocWrite,
) -> Result<(), StoreError> {
    let row = &write.row;
    let compared = (!write.replace_lease).then_some(read_version);
    if tx.set_tag(row, compared)? != 1 {
        return Err(StoreError::Backend(format!(
            "version of `{}` changed inside a write transaction",
            row.tag
        )));
    }
    if write.pool_changed {
        tx.clear_pool(&row.tag)?;
        for range in &row.pool {
            pool_range(tx, &row.tag, range)?;
        }
    }
    tx.insert_lease(&write.lease, write.replace_lease)?;
    Ok(())
}

impl<C: SqlConn> IdStore for SqlIdStore<C> {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        spec.validate()?;
        self.conn.transact(|tx| {
            let row = rules::create_tag(tag, spec, tx.tag_exists(tag)?)?;
            tx.insert_tag(&row)?;
            Ok(row)
        })
    }

    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError> {
        self.conn.transact(|tx| read_tag(tx, tag))
    }

    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        rules::check_alloc(req)?;
        let tries = if self.unguarded_fallback {
            UNGUARDED_AFTER_TRIES
        } else {
            super::TX_ATTEMPTS_MAX
        };
        let mut attempts = 0;
        let guarded = self.conn.transact_tries(tries, |tx| {
            attempts += 1;
            let row = find_tag(tx, &req.tag)?;
            let starts = tx.lease_starts(&req.tag)?;
            let write = rules::allocate(req, row.as_ref(), &starts, &mut Edges::new())?;
            let read_version = row.map_or(0, |row| row.version);
            persist_allocation(tx, read_version, &write)?;
            Ok(write.grant)
        });
        match guarded {
            Err(StoreError::Backend(_)) if self.unguarded_fallback && attempts >= tries => {
                self.allocate_unguarded(req)
            }
            other => other,
        }
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        self.conn.transact(|tx| {
            let lease = tx.lease(&req.tag, req.segment_start)?;
            let renewed = rules::renew(req, lease.as_ref())?;
            tx.renew_lease(&renewed, req)?;
            Ok(renewed)
        })
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let lease = tx.lease(&req.tag, req.segment_start)?;
            let pool = tx.pool(&req.tag)?;
            let tail = rules::release(req, lease.as_ref(), &pool)?;
            tx.delete_lease(&req.tag, req.segment_start)?;
            if let Some(tail) = tail {
                pool_range(tx, &req.tag, &tail)?;
            }
            Ok(())
        })
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        self.conn.transact(|tx| {
            let leases = tx.expired_leases(now_ms)?;
            let mut tags = BTreeMap::new();
            for lease in &leases {
                if !tags.contains_key(&lease.tag) {
                    tags.insert(lease.tag.clone(), read_tag(tx, &lease.tag)?);
                }
            }
            let expired = rules::reclaim_expired(now_ms, &leases, &tags, &mut Edges::new())?;
            let mut reclaimed = Vec::with_capacity(expired.len());
            for rules::Expired {
                segment_start,
                reclaimed: entry,
            } in expired
            {
                tx.delete_lease(&entry.tag, segment_start)?;
                pool_range(tx, &entry.tag, &entry.tail)?;
                reclaimed.push(entry);
            }
            Ok(reclaimed)
        })
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        self.conn
            .transact(|tx| tx.leases().map_err(StoreError::from))
    }

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        self.conn.transact(|tx| {
            let rows = tx.workers(&req.namespace, req.worker_count)?;
            let (worker_id, row) = rules::acquire_worker(req, &rows)?;
            tx.set_worker(&req.namespace, worker_id, &row)?;
            Ok(row.lease(worker_id))
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
        let req = WorkerRenewal {
            namespace,
            worker_id,
            instance,
            reserve_ts,
            lease_ms,
            now_ms,
        };
        self.conn.transact(|tx| {
            let current = tx.worker(namespace, worker_id)?;
            let row = rules::renew_worker(&req, current.as_ref())?;
            tx.set_worker(namespace, worker_id, &row)?;
            Ok(row.lease(worker_id))
        })
    }

    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let row = tx.worker(namespace, worker_id)?;
            let row = rules::release_worker(namespace, worker_id, instance, row.as_ref())?;
            tx.set_worker(namespace, worker_id, &row)?;
            Ok(())
        })
    }

    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        if self.durability.interval_ms() == 0 {
            self.incr_synced(key, n, now_ms)
        } else {
            self.incr_live(key, n, now_ms)
        }
    }

    fn flush_counters(&mut self) -> Result<(), StoreError> {
        let counters = &self.live_counters;
        self.conn.transact(|tx| {
            for (key, counter) in counters {
                tx.set_counter(key, counter.value)?;
            }
            Ok(())
        })
    }
}
