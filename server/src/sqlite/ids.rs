//! The SQLite ID store: the real server's database.
//!
//! WAL journal, `synchronous = FULL`: a committed operation is on disk before it returns. Every
//! domain operation is one `IMMEDIATE` transaction, so the version check and the update of an
//! allocation cannot interleave with another process's (Tinyid's optimistic lock, with SQLite's
//! writer lock underneath).
//!
//! The store decides nothing: each operation reads the rows its rule in [`sut::id_store::rules`]
//! names, calls the rule, and writes what the rule returns in the same transaction (the memory
//! store does the same, so the two cannot drift).
//!
//! The counter engine honours its durability policy for real: with `Periodic`/`Snapshot` the
//! live values sit in process memory and are written only every interval, so a `kill -9`
//! re-issues the tail exactly as Redis with `appendfsync everysec` would.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use sut::edge::Edges;
use sut::id_store::rules::{self, AllocWrite, Counter, WorkerRenewal, WorkerRow};
use sut::id_store::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, Segment, StoreError, TagRow, TagSpec, WorkerLease, WorkerRequest,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS id_tag (
    tag       TEXT PRIMARY KEY,
    max_id    INTEGER NOT NULL,
    step      INTEGER NOT NULL,
    delta     INTEGER NOT NULL,
    remainder INTEGER NOT NULL,
    version   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS id_pool (
    tag   TEXT NOT NULL,
    start INTEGER NOT NULL,
    end   INTEGER NOT NULL,
    delta INTEGER NOT NULL,
    PRIMARY KEY (tag, start)
);
CREATE TABLE IF NOT EXISTS id_lease (
    tag             TEXT NOT NULL,
    seg_start       INTEGER NOT NULL,
    seg_end         INTEGER NOT NULL,
    delta           INTEGER NOT NULL,
    instance        INTEGER NOT NULL,
    claim_end       INTEGER NOT NULL,
    lease_expiry_ms INTEGER NOT NULL,
    PRIMARY KEY (tag, seg_start)
);
CREATE TABLE IF NOT EXISTS id_worker (
    namespace       TEXT NOT NULL,
    worker_id       INTEGER NOT NULL,
    holder          INTEGER,
    lease_expiry_ms INTEGER NOT NULL,
    reserved_ts     INTEGER NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);
CREATE TABLE IF NOT EXISTS id_counter (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
";

/// The SQLite ID store.
#[derive(Debug)]
pub struct SqliteIdStore {
    conn: Connection,
    durability: CounterDurability,
    /// Counters held in memory between syncs (non-`EveryWrite` durability).
    live_counters: BTreeMap<String, Counter>,
}

fn backend(err: rusqlite::Error) -> StoreError {
    StoreError::Backend(err.to_string())
}

/// SQLite stores `INTEGER` as i64; IDs stay below 2^62 and times below 2^63, so the casts are
/// exact. Values read back are checked rather than trusted.
fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Backend(format!("corrupt row: negative {what} {v}")))
}

impl SqliteIdStore {
    /// Opens (creating if needed) a store at `path`.
    pub fn open(path: &Path, durability: CounterDurability) -> Result<Self, StoreError> {
        Self::init(
            crate::db::open_private(path).map_err(StoreError::Backend)?,
            durability,
        )
    }

    /// A private in-memory database (tests).
    pub fn open_in_memory(durability: CounterDurability) -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(backend)?, durability)
    }

    fn init(conn: Connection, durability: CounterDurability) -> Result<Self, StoreError> {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(backend)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(backend)?;
        conn.execute_batch(SCHEMA).map_err(backend)?;
        Ok(Self {
            conn,
            durability,
            live_counters: BTreeMap::new(),
        })
    }

    fn begin(&mut self) -> Result<Transaction<'_>, StoreError> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)
    }
}

fn write_counter(tx: &Transaction<'_>, key: &str, value: u64) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO id_counter (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![key, to_sql(value)],
    )
    .map_err(backend)?;
    Ok(())
}

fn read_counter(tx: &Transaction<'_>, key: &str) -> Result<u64, StoreError> {
    let value: Option<i64> = tx
        .query_row("SELECT value FROM id_counter WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()
        .map_err(backend)?;
    value.map_or(Ok(0), |v| from_sql(v, "counter"))
}

/// Persists an allocation the rule decided: the tag's `max_id` and version (the correct path
/// re-checks the version it read in the WHERE clause, Tinyid's optimistic lock; the blind-write
/// flaw writes without it), the pool if it changed, and the lease (the flaw's replaces another
/// holder's lease of the same range).
fn persist_allocation(
    tx: &Transaction<'_>,
    read_version: u64,
    write: &AllocWrite,
) -> Result<(), StoreError> {
    let row = &write.row;
    let updated = if write.replace_lease {
        tx.execute(
            "UPDATE id_tag SET max_id = ?1, version = ?2 WHERE tag = ?3",
            params![to_sql(row.max_id), to_sql(row.version), &row.tag],
        )
    } else {
        tx.execute(
            "UPDATE id_tag SET max_id = ?1, version = ?2 WHERE tag = ?3 AND version = ?4",
            params![
                to_sql(row.max_id),
                to_sql(row.version),
                &row.tag,
                to_sql(read_version)
            ],
        )
    }
    .map_err(backend)?;
    if updated != 1 {
        return Err(StoreError::Backend(format!(
            "version of `{}` changed inside a write transaction",
            row.tag
        )));
    }
    if write.pool_changed {
        tx.execute("DELETE FROM id_pool WHERE tag = ?1", [&row.tag])
            .map_err(backend)?;
        for range in &row.pool {
            insert_pool(tx, &row.tag, range)?;
        }
    }
    insert_lease(tx, &write.lease, write.replace_lease)
}

/// Records a lease; `replace` (the blind-write flaw only) overwrites another holder's lease of
/// the same range.
fn insert_lease(tx: &Transaction<'_>, lease: &LeaseRow, replace: bool) -> Result<(), StoreError> {
    let verb = if replace {
        "INSERT OR REPLACE"
    } else {
        "INSERT"
    };
    tx.execute(
        &format!(
            "{verb} INTO id_lease (tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ),
        params![
            &lease.tag,
            to_sql(lease.segment.start),
            to_sql(lease.segment.end),
            to_sql(lease.segment.delta),
            to_sql(lease.instance.0),
            to_sql(lease.claim_end),
            to_sql(lease.lease_expiry_ms)
        ],
    )
    .map_err(backend)?;
    Ok(())
}

fn delete_lease(tx: &Transaction<'_>, tag: &str, segment_start: u64) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM id_lease WHERE tag = ?1 AND seg_start = ?2",
        params![tag, to_sql(segment_start)],
    )
    .map_err(backend)?;
    Ok(())
}

/// The segment starts of `tag`'s leases.
fn lease_starts(tx: &Transaction<'_>, tag: &str) -> Result<BTreeSet<u64>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT seg_start FROM id_lease WHERE tag = ?1")
        .map_err(backend)?;
    stmt.query_map([tag], |r| r.get::<_, i64>(0))
        .map_err(backend)?
        .map(|start| from_sql(start.map_err(backend)?, "seg_start"))
        .collect()
}

/// The tag row with its pool, if the tag exists.
fn find_tag(tx: &Transaction<'_>, tag: &str) -> Result<Option<TagRow>, StoreError> {
    match read_tag_tx(tx, tag) {
        Ok(row) => Ok(Some(row)),
        Err(StoreError::UnknownTag(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_tag_tx(tx: &Transaction<'_>, tag: &str) -> Result<TagRow, StoreError> {
    let row: Option<(i64, i64, i64, i64, i64)> = tx
        .query_row(
            "SELECT max_id, step, delta, remainder, version FROM id_tag WHERE tag = ?1",
            [tag],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()
        .map_err(backend)?;
    let Some((max_id, step, delta, remainder, version)) = row else {
        return Err(StoreError::UnknownTag(tag.to_owned()));
    };
    let pool = read_pool(tx, tag)?;
    Ok(TagRow {
        tag: tag.to_owned(),
        max_id: from_sql(max_id, "max_id")?,
        step: from_sql(step, "step")?,
        delta: from_sql(delta, "delta")?,
        remainder: from_sql(remainder, "remainder")?,
        version: from_sql(version, "version")?,
        pool,
    })
}

/// `tag`'s pooled ranges, lowest first.
fn read_pool(tx: &Transaction<'_>, tag: &str) -> Result<Vec<Segment>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT start, end, delta FROM id_pool WHERE tag = ?1 ORDER BY start")
        .map_err(backend)?;
    stmt.query_map([tag], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })
    .map_err(backend)?
    .map(|row| {
        let (start, end, delta) = row.map_err(backend)?;
        Ok(Segment {
            start: from_sql(start, "pool start")?,
            end: from_sql(end, "pool end")?,
            delta: from_sql(delta, "pool delta")?,
        })
    })
    .collect()
}

fn insert_pool(tx: &Transaction<'_>, tag: &str, tail: &Segment) -> Result<(), StoreError> {
    if !tail.is_empty() {
        tx.execute(
            "INSERT INTO id_pool (tag, start, end, delta) VALUES (?1, ?2, ?3, ?4)",
            params![
                tag,
                to_sql(tail.start),
                to_sql(tail.end),
                to_sql(tail.delta)
            ],
        )
        .map_err(backend)?;
    }
    Ok(())
}

type LeaseSqlRow = (String, i64, i64, i64, i64, i64, i64);

fn lease_from_sql(row: LeaseSqlRow) -> Result<LeaseRow, StoreError> {
    let (tag, start, end, delta, instance, claim_end, expiry) = row;
    Ok(LeaseRow {
        tag,
        instance: InstanceId(from_sql(instance, "instance")?),
        segment: Segment {
            start: from_sql(start, "seg_start")?,
            end: from_sql(end, "seg_end")?,
            delta: from_sql(delta, "delta")?,
        },
        claim_end: from_sql(claim_end, "claim_end")?,
        lease_expiry_ms: from_sql(expiry, "lease_expiry_ms")?,
    })
}

/// The leases `filter` (a WHERE and/or ORDER BY clause over `params`) selects.
fn query_leases(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<LeaseRow>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease {filter}"
        ))
        .map_err(backend)?;
    stmt.query_map(params, |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ))
    })
    .map_err(backend)?
    .map(|row| lease_from_sql(row.map_err(backend)?))
    .collect()
}

fn read_lease(
    tx: &Transaction<'_>,
    tag: &str,
    segment_start: u64,
) -> Result<Option<LeaseRow>, StoreError> {
    let filter = "WHERE tag = ?1 AND seg_start = ?2";
    let mut leases = query_leases(tx, filter, params![tag, to_sql(segment_start)])?;
    assert!(leases.len() <= 1, "(tag, seg_start) is the primary key");
    Ok(leases.pop())
}

fn worker_from_sql(
    holder: Option<i64>,
    expiry: i64,
    reserved: i64,
) -> Result<WorkerRow, StoreError> {
    Ok(WorkerRow {
        holder: holder
            .map(|h| from_sql(h, "holder").map(InstanceId))
            .transpose()?,
        lease_expiry_ms: from_sql(expiry, "lease_expiry_ms")?,
        reserved_ts: from_sql(reserved, "reserved_ts")?,
    })
}

/// The worker rows of `namespace` with ids below `worker_count`.
fn read_workers(
    tx: &Transaction<'_>,
    namespace: &str,
    worker_count: u32,
) -> Result<BTreeMap<u32, WorkerRow>, StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT worker_id, holder, lease_expiry_ms, reserved_ts FROM id_worker WHERE namespace = ?1 AND worker_id < ?2",
        )
        .map_err(backend)?;
    stmt.query_map(params![namespace, i64::from(worker_count)], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, Option<i64>>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })
    .map_err(backend)?
    .map(|row| {
        let (id, holder, expiry, reserved) = row.map_err(backend)?;
        let id = u32::try_from(id)
            .map_err(|_| StoreError::Backend(format!("corrupt row: worker id {id}")))?;
        Ok((id, worker_from_sql(holder, expiry, reserved)?))
    })
    .collect()
}

fn read_worker(
    tx: &Transaction<'_>,
    namespace: &str,
    worker_id: u32,
) -> Result<Option<WorkerRow>, StoreError> {
    tx.query_row(
        "SELECT holder, lease_expiry_ms, reserved_ts FROM id_worker WHERE namespace = ?1 AND worker_id = ?2",
        params![namespace, i64::from(worker_id)],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .optional()
    .map_err(backend)?
    .map(|(holder, expiry, reserved)| worker_from_sql(holder, expiry, reserved))
    .transpose()
}

fn write_worker(
    tx: &Transaction<'_>,
    namespace: &str,
    worker_id: u32,
    row: &WorkerRow,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO id_worker (namespace, worker_id, holder, lease_expiry_ms, reserved_ts) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT(namespace, worker_id) DO UPDATE SET holder = excluded.holder, \
         lease_expiry_ms = excluded.lease_expiry_ms, reserved_ts = excluded.reserved_ts",
        params![
            namespace,
            i64::from(worker_id),
            row.holder.map(|h| to_sql(h.0)),
            to_sql(row.lease_expiry_ms),
            to_sql(row.reserved_ts)
        ],
    )
    .map_err(backend)?;
    Ok(())
}

/// The leases expired at `now_ms`, by tag then segment start. The WHERE clause only narrows
/// the read; [`rules::reclaim_expired`] decides which leases are expired.
fn expired_leases(tx: &Transaction<'_>, now_ms: u64) -> Result<Vec<LeaseRow>, StoreError> {
    let filter = "WHERE lease_expiry_ms <= ?1 ORDER BY tag, seg_start";
    query_leases(tx, filter, [to_sql(now_ms)])
}

impl SqliteIdStore {
    /// Runs the counter rule on a counter loaded from (or to be synced to) the database.
    fn incr_synced(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let durability = self.durability;
        let tx = self.begin()?;
        let counter = Counter::loaded(read_counter(&tx, key)?, now_ms);
        let write = rules::incr_by(key, counter, n, now_ms, durability)?;
        assert!(write.sync, "every write is synced");
        write_counter(&tx, key, write.counter.value)?;
        tx.commit().map_err(backend)?;
        Ok(write.counter.value)
    }

    /// Runs the counter rule on a counter held in memory, syncing when the rule says so.
    fn incr_live(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        if !self.live_counters.contains_key(key) {
            let tx = self.begin()?;
            let durable = read_counter(&tx, key)?;
            tx.commit().map_err(backend)?;
            let loaded = Counter::loaded(durable, now_ms);
            self.live_counters.insert(key.to_owned(), loaded);
        }
        let counter = self.live_counters[key];
        let write = rules::incr_by(key, counter, n, now_ms, self.durability)?;
        if write.sync {
            let tx = self.begin()?;
            write_counter(&tx, key, write.counter.value)?;
            tx.commit().map_err(backend)?;
        }
        self.live_counters.insert(key.to_owned(), write.counter);
        Ok(write.counter.value)
    }
}

impl IdStore for SqliteIdStore {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        spec.validate()?;
        let tx = self.begin()?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM id_tag WHERE tag = ?1", [tag], |r| r.get(0))
            .optional()
            .map_err(backend)?;
        let row = rules::create_tag(tag, spec, exists.is_some())?;
        tx.execute(
            "INSERT INTO id_tag (tag, max_id, step, delta, remainder, version) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![tag, to_sql(row.max_id), to_sql(row.step), to_sql(row.delta), to_sql(row.remainder), to_sql(row.version)],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(row)
    }

    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        let row = read_tag_tx(&tx, tag)?;
        tx.commit().map_err(backend)?;
        Ok(row)
    }

    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        rules::check_alloc(req)?;
        let tx = self.begin()?;
        let row = find_tag(&tx, &req.tag)?;
        let write = rules::allocate(
            req,
            row.as_ref(),
            &lease_starts(&tx, &req.tag)?,
            &mut Edges::new(),
        )?;
        let read_version = row.map_or(0, |row| row.version);
        persist_allocation(&tx, read_version, &write)?;
        tx.commit().map_err(backend)?;
        Ok(write.grant)
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        let tx = self.begin()?;
        let lease = read_lease(&tx, &req.tag, req.segment_start)?;
        let renewed = rules::renew(req, lease.as_ref())?;
        tx.execute(
            "UPDATE id_lease SET claim_end = ?1, lease_expiry_ms = ?2 WHERE tag = ?3 AND seg_start = ?4",
            params![to_sql(renewed.claim_end), to_sql(renewed.lease_expiry_ms), &req.tag, to_sql(req.segment_start)],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(renewed)
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        let tx = self.begin()?;
        let lease = read_lease(&tx, &req.tag, req.segment_start)?;
        let tail = rules::release(req, lease.as_ref(), &read_pool(&tx, &req.tag)?)?;
        delete_lease(&tx, &req.tag, req.segment_start)?;
        if let Some(tail) = tail {
            insert_pool(&tx, &req.tag, &tail)?;
        }
        tx.commit().map_err(backend)
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        let tx = self.begin()?;
        let leases = expired_leases(&tx, now_ms)?;
        let mut tags = BTreeMap::new();
        for lease in &leases {
            if !tags.contains_key(&lease.tag) {
                tags.insert(lease.tag.clone(), read_tag_tx(&tx, &lease.tag)?);
            }
        }
        let expired = rules::reclaim_expired(now_ms, &leases, &tags, &mut Edges::new())?;
        let mut reclaimed = Vec::with_capacity(expired.len());
        for rules::Expired {
            segment_start,
            reclaimed: entry,
        } in expired
        {
            delete_lease(&tx, &entry.tag, segment_start)?;
            insert_pool(&tx, &entry.tag, &entry.tail)?;
            reclaimed.push(entry);
        }
        tx.commit().map_err(backend)?;
        Ok(reclaimed)
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        query_leases(&self.conn, "ORDER BY tag, seg_start", [])
    }

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        let tx = self.begin()?;
        let rows = read_workers(&tx, &req.namespace, req.worker_count)?;
        let (worker_id, row) = rules::acquire_worker(req, &rows)?;
        write_worker(&tx, &req.namespace, worker_id, &row)?;
        tx.commit().map_err(backend)?;
        Ok(row.lease(worker_id))
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
        let tx = self.begin()?;
        let row = rules::renew_worker(&req, read_worker(&tx, namespace, worker_id)?.as_ref())?;
        write_worker(&tx, namespace, worker_id, &row)?;
        tx.commit().map_err(backend)?;
        Ok(row.lease(worker_id))
    }

    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        let tx = self.begin()?;
        let row = read_worker(&tx, namespace, worker_id)?;
        let row = rules::release_worker(namespace, worker_id, instance, row.as_ref())?;
        write_worker(&tx, namespace, worker_id, &row)?;
        tx.commit().map_err(backend)
    }

    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        if self.durability.interval_ms() == 0 {
            self.incr_synced(key, n, now_ms)
        } else {
            self.incr_live(key, n, now_ms)
        }
    }

    fn flush_counters(&mut self) -> Result<(), StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        for (key, counter) in &self.live_counters {
            write_counter(&tx, key, counter.value)?;
        }
        tx.commit().map_err(backend)
    }
}

#[cfg(test)]
pub(crate) mod conformance;
