//! The MariaDB ID store: tags, segment grants, leases, the reclaim pool, Snowflake worker
//! leases and the counter engine, shared by every ID server on one database.
//!
//! The twin of `SqliteIdStore` and `PgIdStore` (same rules of [`sut::id_store::rules`], same
//! rows), with each domain operation one SERIALIZABLE transaction (see [`super`]). Two ID
//! servers allocating for one tag at once both read version `v` under a shared lock; the first
//! to write waits for the second, the second's write closes the cycle and InnoDB rolls it back
//! as a deadlock; it is retried from the read, sees `v + 1` and takes the next segment. The
//! allocation's `UPDATE … WHERE version = ?` is a second guard.

use std::collections::{BTreeMap, BTreeSet};

use mysql_async::Row;
use sut::edge::Edges;
use sut::id_store::rules::{self, AllocWrite, Counter, WorkerRenewal, WorkerRow};
use sut::id_store::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, Segment, StoreError, TagRow, TagSpec, WorkerLease, WorkerRequest,
};

use super::{MyConn, MyTx as Tx, get_text, get_u64, params};
use crate::sqldb::{DbError, to_sql};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS id_tag (
    tag       VARBINARY(255) PRIMARY KEY,
    max_id    BIGINT NOT NULL,
    step      BIGINT NOT NULL,
    delta     BIGINT NOT NULL,
    remainder BIGINT NOT NULL,
    version   BIGINT NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS id_pool (
    tag     VARBINARY(255) NOT NULL,
    start   BIGINT NOT NULL,
    "end"   BIGINT NOT NULL,
    delta   BIGINT NOT NULL,
    PRIMARY KEY (tag, start)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS id_lease (
    tag             VARBINARY(255) NOT NULL,
    seg_start       BIGINT NOT NULL,
    seg_end         BIGINT NOT NULL,
    delta           BIGINT NOT NULL,
    instance        BIGINT NOT NULL,
    claim_end       BIGINT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL,
    PRIMARY KEY (tag, seg_start),
    KEY id_lease_expiry (lease_expiry_ms)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS id_worker (
    namespace       VARBINARY(255) NOT NULL,
    worker_id       BIGINT NOT NULL,
    holder          BIGINT NULL,
    lease_expiry_ms BIGINT NOT NULL,
    reserved_ts     BIGINT NOT NULL,
    PRIMARY KEY (namespace, worker_id)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS id_counter (
    "key" VARBINARY(255) PRIMARY KEY,
    value BIGINT NOT NULL
) ENGINE = InnoDB;
"#;

/// The MariaDB ID store.
#[derive(Debug)]
pub struct MyIdStore {
    conn: MyConn,
    durability: CounterDurability,
    /// Counters held in memory between syncs (non-`EveryWrite` durability).
    live_counters: BTreeMap<String, Counter>,
}

impl MyIdStore {
    /// Connects to `url` and creates the tables if missing.
    ///
    /// # Errors
    /// Connection or schema failures.
    pub fn open(url: &str, durability: CounterDurability) -> Result<Self, StoreError> {
        Ok(Self {
            conn: MyConn::open(url, SCHEMA)?,
            durability,
            live_counters: BTreeMap::new(),
        })
    }
}

fn write_counter(tx: &mut Tx<'_>, key: &str, value: u64) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO id_counter (\"key\", value) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE value = VALUES(value)",
        params![key, to_sql(value)],
    )?;
    Ok(())
}

fn read_counter(tx: &mut Tx<'_>, key: &str) -> Result<u64, DbError> {
    let row = tx.query_opt(
        "SELECT value FROM id_counter WHERE \"key\" = ?",
        params![key],
    )?;
    row.map_or(Ok(0), |r| get_u64(&r, 0, "counter"))
}

/// Persists an allocation the rule decided (see the SQLite twin): the tag's `max_id` and
/// version, compared with the version read unless the blind-write flaw writes without it.
fn persist_allocation(
    tx: &mut Tx<'_>,
    read_version: u64,
    write: &AllocWrite,
) -> Result<(), StoreError> {
    let row = &write.row;
    let updated = if write.replace_lease {
        tx.execute(
            "UPDATE id_tag SET max_id = ?, version = ? WHERE tag = ?",
            params![to_sql(row.max_id), to_sql(row.version), row.tag.as_str()],
        )
    } else {
        tx.execute(
            "UPDATE id_tag SET max_id = ?, version = ? WHERE tag = ? AND version = ?",
            params![
                to_sql(row.max_id),
                to_sql(row.version),
                row.tag.as_str(),
                to_sql(read_version),
            ],
        )
    }?;
    if updated != 1 {
        return Err(StoreError::Backend(format!(
            "version of `{}` changed inside a write transaction",
            row.tag
        )));
    }
    if write.pool_changed {
        tx.execute(
            "DELETE FROM id_pool WHERE tag = ?",
            params![row.tag.as_str()],
        )?;
        for range in &row.pool {
            insert_pool(tx, &row.tag, range)?;
        }
    }
    insert_lease(tx, &write.lease, write.replace_lease)?;
    Ok(())
}

/// Records a lease; `replace` (the blind-write flaw only) overwrites another holder's lease of
/// the same range.
fn insert_lease(tx: &mut Tx<'_>, lease: &LeaseRow, replace: bool) -> Result<(), DbError> {
    let insert = "INSERT INTO id_lease (tag, seg_start, seg_end, delta, instance, claim_end, \
                  lease_expiry_ms) VALUES (?, ?, ?, ?, ?, ?, ?)";
    let sql = if replace {
        format!(
            "{insert} ON DUPLICATE KEY UPDATE seg_end = VALUES(seg_end), \
             delta = VALUES(delta), instance = VALUES(instance), \
             claim_end = VALUES(claim_end), lease_expiry_ms = VALUES(lease_expiry_ms)"
        )
    } else {
        insert.to_owned()
    };
    tx.execute(
        &sql,
        params![
            lease.tag.as_str(),
            to_sql(lease.segment.start),
            to_sql(lease.segment.end),
            to_sql(lease.segment.delta),
            to_sql(lease.instance.0),
            to_sql(lease.claim_end),
            to_sql(lease.lease_expiry_ms),
        ],
    )?;
    Ok(())
}

fn delete_lease(tx: &mut Tx<'_>, tag: &str, segment_start: u64) -> Result<(), DbError> {
    tx.execute(
        "DELETE FROM id_lease WHERE tag = ? AND seg_start = ?",
        params![tag, to_sql(segment_start)],
    )?;
    Ok(())
}

/// The segment starts of `tag`'s leases.
fn lease_starts(tx: &mut Tx<'_>, tag: &str) -> Result<BTreeSet<u64>, DbError> {
    tx.query("SELECT seg_start FROM id_lease WHERE tag = ?", params![tag])?
        .iter()
        .map(|r| get_u64(r, 0, "seg_start"))
        .collect()
}

/// The tag row with its pool, if the tag exists.
fn find_tag(tx: &mut Tx<'_>, tag: &str) -> Result<Option<TagRow>, StoreError> {
    match read_tag_tx(tx, tag) {
        Ok(row) => Ok(Some(row)),
        Err(StoreError::UnknownTag(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_tag_tx(tx: &mut Tx<'_>, tag: &str) -> Result<TagRow, StoreError> {
    let row = tx.query_opt(
        "SELECT max_id, step, delta, remainder, version FROM id_tag WHERE tag = ?",
        params![tag],
    )?;
    let Some(row) = row else {
        return Err(StoreError::UnknownTag(tag.to_owned()));
    };
    let pool = read_pool(tx, tag)?;
    Ok(TagRow {
        tag: tag.to_owned(),
        max_id: get_u64(&row, 0, "max_id")?,
        step: get_u64(&row, 1, "step")?,
        delta: get_u64(&row, 2, "delta")?,
        remainder: get_u64(&row, 3, "remainder")?,
        version: get_u64(&row, 4, "version")?,
        pool,
    })
}

/// `tag`'s pooled ranges, lowest first.
fn read_pool(tx: &mut Tx<'_>, tag: &str) -> Result<Vec<Segment>, DbError> {
    tx.query(
        "SELECT start, \"end\", delta FROM id_pool WHERE tag = ? ORDER BY start",
        params![tag],
    )?
    .iter()
    .map(|r| {
        Ok(Segment {
            start: get_u64(r, 0, "pool start")?,
            end: get_u64(r, 1, "pool end")?,
            delta: get_u64(r, 2, "pool delta")?,
        })
    })
    .collect()
}

fn insert_pool(tx: &mut Tx<'_>, tag: &str, tail: &Segment) -> Result<(), DbError> {
    if !tail.is_empty() {
        tx.execute(
            "INSERT INTO id_pool (tag, start, \"end\", delta) VALUES (?, ?, ?, ?)",
            params![
                tag,
                to_sql(tail.start),
                to_sql(tail.end),
                to_sql(tail.delta),
            ],
        )?;
    }
    Ok(())
}

const LEASE_COLUMNS: &str =
    "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease";

fn lease_from_row(r: &Row) -> Result<LeaseRow, DbError> {
    Ok(LeaseRow {
        tag: get_text(r, 0, "tag")?,
        segment: Segment {
            start: get_u64(r, 1, "seg_start")?,
            end: get_u64(r, 2, "seg_end")?,
            delta: get_u64(r, 3, "delta")?,
        },
        instance: InstanceId(get_u64(r, 4, "instance")?),
        claim_end: get_u64(r, 5, "claim_end")?,
        lease_expiry_ms: get_u64(r, 6, "lease_expiry_ms")?,
    })
}

fn read_lease(tx: &mut Tx<'_>, tag: &str, segment_start: u64) -> Result<Option<LeaseRow>, DbError> {
    let sql = format!("{LEASE_COLUMNS} WHERE tag = ? AND seg_start = ?");
    tx.query_opt(&sql, params![tag, to_sql(segment_start)])?
        .as_ref()
        .map(lease_from_row)
        .transpose()
}

fn worker_from_row(r: &Row, first: usize) -> Result<WorkerRow, DbError> {
    let holder: Option<i64> = super::col(r, first, "holder")?;
    Ok(WorkerRow {
        holder: holder
            .map(|h| crate::sqldb::from_sql(h, "holder").map(InstanceId))
            .transpose()?,
        lease_expiry_ms: get_u64(r, first + 1, "lease_expiry_ms")?,
        reserved_ts: get_u64(r, first + 2, "reserved_ts")?,
    })
}

fn worker_id_of(r: &Row) -> Result<u32, DbError> {
    let id = get_u64(r, 0, "worker_id")?;
    u32::try_from(id).map_err(|_| DbError::fatal(format!("corrupt row: worker id {id}")))
}

/// The worker rows of `namespace` with ids below `worker_count`.
fn read_workers(
    tx: &mut Tx<'_>,
    namespace: &str,
    worker_count: u32,
) -> Result<BTreeMap<u32, WorkerRow>, DbError> {
    tx.query(
        "SELECT worker_id, holder, lease_expiry_ms, reserved_ts FROM id_worker \
         WHERE namespace = ? AND worker_id < ?",
        params![namespace, i64::from(worker_count)],
    )?
    .iter()
    .map(|r| Ok((worker_id_of(r)?, worker_from_row(r, 1)?)))
    .collect()
}

fn read_worker(
    tx: &mut Tx<'_>,
    namespace: &str,
    worker_id: u32,
) -> Result<Option<WorkerRow>, DbError> {
    tx.query_opt(
        "SELECT holder, lease_expiry_ms, reserved_ts FROM id_worker \
         WHERE namespace = ? AND worker_id = ?",
        params![namespace, i64::from(worker_id)],
    )?
    .map(|r| worker_from_row(&r, 0))
    .transpose()
}

fn write_worker(
    tx: &mut Tx<'_>,
    namespace: &str,
    worker_id: u32,
    row: &WorkerRow,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO id_worker (namespace, worker_id, holder, lease_expiry_ms, reserved_ts) \
         VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         holder = VALUES(holder), lease_expiry_ms = VALUES(lease_expiry_ms), \
         reserved_ts = VALUES(reserved_ts)",
        params![
            namespace,
            i64::from(worker_id),
            row.holder.map(|h| to_sql(h.0)),
            to_sql(row.lease_expiry_ms),
            to_sql(row.reserved_ts),
        ],
    )?;
    Ok(())
}

/// The leases expired at `now_ms`, by tag then segment start. The WHERE clause only narrows
/// the read; [`rules::reclaim_expired`] decides which leases are expired.
fn expired_leases(tx: &mut Tx<'_>, now_ms: u64) -> Result<Vec<LeaseRow>, DbError> {
    let sql = format!("{LEASE_COLUMNS} WHERE lease_expiry_ms <= ? ORDER BY tag, seg_start");
    tx.query(&sql, params![to_sql(now_ms)])?
        .iter()
        .map(lease_from_row)
        .collect()
}

impl MyIdStore {
    /// Runs the counter rule on a counter loaded from (or to be synced to) the database.
    fn incr_synced(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let durability = self.durability;
        self.conn.transact(|tx| {
            let counter = Counter::loaded(read_counter(tx, key)?, now_ms);
            let write = rules::incr_by(key, counter, n, now_ms, durability)?;
            assert!(write.sync, "every write is synced");
            write_counter(tx, key, write.counter.value)?;
            Ok(write.counter.value)
        })
    }

    /// Runs the counter rule on a counter held in memory, syncing when the rule says so.
    fn incr_live(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        if !self.live_counters.contains_key(key) {
            let durable = self
                .conn
                .transact(|tx| read_counter(tx, key).map_err(StoreError::from))?;
            self.live_counters
                .insert(key.to_owned(), Counter::loaded(durable, now_ms));
        }
        let counter = self.live_counters[key];
        let write = rules::incr_by(key, counter, n, now_ms, self.durability)?;
        if write.sync {
            self.conn.transact(|tx| {
                write_counter(tx, key, write.counter.value).map_err(StoreError::from)
            })?;
        }
        self.live_counters.insert(key.to_owned(), write.counter);
        Ok(write.counter.value)
    }
}

impl IdStore for MyIdStore {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        spec.validate()?;
        self.conn.transact(|tx| {
            let exists = tx.query_opt("SELECT 1 FROM id_tag WHERE tag = ?", params![tag])?;
            let row = rules::create_tag(tag, spec, exists.is_some())?;
            tx.execute(
                "INSERT INTO id_tag (tag, max_id, step, delta, remainder, version) \
                 VALUES (?, ?, ?, ?, ?, ?)",
                params![
                    tag,
                    to_sql(row.max_id),
                    to_sql(row.step),
                    to_sql(row.delta),
                    to_sql(row.remainder),
                    to_sql(row.version),
                ],
            )?;
            Ok(row)
        })
    }

    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError> {
        self.conn.transact(|tx| read_tag_tx(tx, tag))
    }

    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        rules::check_alloc(req)?;
        self.conn.transact(|tx| {
            let row = find_tag(tx, &req.tag)?;
            let write = rules::allocate(
                req,
                row.as_ref(),
                &lease_starts(tx, &req.tag)?,
                &mut Edges::new(),
            )?;
            let read_version = row.map_or(0, |row| row.version);
            persist_allocation(tx, read_version, &write)?;
            Ok(write.grant)
        })
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        self.conn.transact(|tx| {
            let lease = read_lease(tx, &req.tag, req.segment_start)?;
            let renewed = rules::renew(req, lease.as_ref())?;
            tx.execute(
                "UPDATE id_lease SET claim_end = ?, lease_expiry_ms = ? \
                 WHERE tag = ? AND seg_start = ?",
                params![
                    to_sql(renewed.claim_end),
                    to_sql(renewed.lease_expiry_ms),
                    req.tag.as_str(),
                    to_sql(req.segment_start),
                ],
            )?;
            Ok(renewed)
        })
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let lease = read_lease(tx, &req.tag, req.segment_start)?;
            let pool = read_pool(tx, &req.tag)?;
            let tail = rules::release(req, lease.as_ref(), &pool)?;
            delete_lease(tx, &req.tag, req.segment_start)?;
            if let Some(tail) = tail {
                insert_pool(tx, &req.tag, &tail)?;
            }
            Ok(())
        })
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        self.conn.transact(|tx| {
            let leases = expired_leases(tx, now_ms)?;
            let mut tags = BTreeMap::new();
            for lease in &leases {
                if !tags.contains_key(&lease.tag) {
                    tags.insert(lease.tag.clone(), read_tag_tx(tx, &lease.tag)?);
                }
            }
            let expired = rules::reclaim_expired(now_ms, &leases, &tags, &mut Edges::new())?;
            let mut reclaimed = Vec::with_capacity(expired.len());
            for rules::Expired {
                segment_start,
                reclaimed: entry,
            } in expired
            {
                delete_lease(tx, &entry.tag, segment_start)?;
                insert_pool(tx, &entry.tag, &entry.tail)?;
                reclaimed.push(entry);
            }
            Ok(reclaimed)
        })
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        let sql = format!("{LEASE_COLUMNS} ORDER BY tag, seg_start");
        self.conn.transact(|tx| {
            tx.query(&sql, Vec::new())?
                .iter()
                .map(|r| lease_from_row(r).map_err(StoreError::from))
                .collect()
        })
    }

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        self.conn.transact(|tx| {
            let rows = read_workers(tx, &req.namespace, req.worker_count)?;
            let (worker_id, row) = rules::acquire_worker(req, &rows)?;
            write_worker(tx, &req.namespace, worker_id, &row)?;
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
            let current = read_worker(tx, namespace, worker_id)?;
            let row = rules::renew_worker(&req, current.as_ref())?;
            write_worker(tx, namespace, worker_id, &row)?;
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
            let row = read_worker(tx, namespace, worker_id)?;
            let row = rules::release_worker(namespace, worker_id, instance, row.as_ref())?;
            write_worker(tx, namespace, worker_id, &row)?;
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
                write_counter(tx, key, counter.value)?;
            }
            Ok(())
        })
    }
}
