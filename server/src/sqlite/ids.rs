//! The SQLite ID store: the real server's database.
//!
//! WAL journal, `synchronous = FULL`: a committed operation is on disk before it returns. Every
//! domain operation is one `IMMEDIATE` transaction, so the version check and the update of an
//! allocation cannot interleave with another process's (Tinyid's optimistic lock, with SQLite's
//! writer lock underneath).
//!
//! The counter engine honours its durability policy for real: with `Periodic`/`Snapshot` the
//! live values sit in process memory and are written only every interval, so a `kill -9`
//! re-issues the tail exactly as Redis with `appendfsync everysec` would.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use sut::store::{
    AllocRequest, CounterDurability, Grant, IdStore, InstanceId, Lease, LeaseRow, Reclaimed,
    ReleaseRequest, RenewRequest, Segment, StoreError, TagRow, TagSpec, WorkerLease, WorkerRequest,
    align_up, check_alloc, fresh_segment, initial_claim, lease_taken, pool_taken, take_from_pool,
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

/// A counter held in memory between syncs (non-`EveryWrite` durability).
#[derive(Clone, Debug)]
struct LiveCounter {
    value: u64,
    synced_at_ms: u64,
}

/// The SQLite ID store.
#[derive(Debug)]
pub struct SqliteIdStore {
    conn: Connection,
    durability: CounterDurability,
    live_counters: BTreeMap<String, LiveCounter>,
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
        Self::init(Connection::open(path).map_err(backend)?, durability)
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

    /// Writes every counter held in memory (graceful shutdown).
    pub fn flush_counters(&mut self) -> Result<(), StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        for (key, counter) in &self.live_counters {
            write_counter(&tx, key, counter.value)?;
        }
        tx.commit().map_err(backend)
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

/// FLAW [`sut::flaw::Flaw::SegmentNoVersionCheck`]: `UPDATE id_tag SET max_id = ?` with the
/// requester's stale read and no version in the WHERE clause; the lease row replaces any other
/// holder's of the same range.
fn allocate_blind(
    tx: Transaction<'_>,
    req: &AllocRequest,
    row: &TagRow,
    read_max_id: u64,
) -> Result<Grant, StoreError> {
    let read = TagRow {
        max_id: read_max_id,
        ..row.clone()
    };
    let segment = fresh_segment(&read, req.ids)?;
    tx.execute(
        "UPDATE id_tag SET max_id = ?1, version = version + 1 WHERE tag = ?2",
        params![to_sql(segment.end), &req.tag],
    )
    .map_err(backend)?;
    let grant = Grant {
        tag: req.tag.clone(),
        segment,
        version: row.version + 1,
        claim_end: initial_claim(&segment, req.claim_ids),
        lease_expiry_ms: req.now_ms.saturating_add(req.lease_ms),
        from_pool: false,
        tag_step: row.step,
    };
    insert_lease(&tx, req, &grant, true)?;
    tx.commit().map_err(backend)?;
    Ok(grant)
}

/// Records the lease of `grant`; `replace` (the blind-write flaw only) overwrites another
/// holder's lease of the same range instead of failing on it.
fn insert_lease(
    tx: &Transaction<'_>,
    req: &AllocRequest,
    grant: &Grant,
    replace: bool,
) -> Result<(), StoreError> {
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
            &req.tag,
            to_sql(grant.segment.start),
            to_sql(grant.segment.end),
            to_sql(grant.segment.delta),
            to_sql(req.instance.0),
            to_sql(grant.claim_end),
            to_sql(grant.lease_expiry_ms)
        ],
    )
    .map_err(|e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => {
            lease_taken(&req.tag, grant.segment.start)
        }
        _ => backend(e),
    })?;
    Ok(())
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
    let mut stmt = tx
        .prepare_cached("SELECT start, end, delta FROM id_pool WHERE tag = ?1 ORDER BY start")
        .map_err(backend)?;
    let pool = stmt
        .query_map([tag], |r| {
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
        .collect::<Result<Vec<_>, StoreError>>()?;
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
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => pool_taken(tag, tail.start),
            _ => backend(e),
        })?;
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

fn read_lease(
    tx: &Transaction<'_>,
    tag: &str,
    segment_start: u64,
) -> Result<Option<LeaseRow>, StoreError> {
    tx.query_row(
        "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease WHERE tag = ?1 AND seg_start = ?2",
        params![tag, to_sql(segment_start)],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
    )
    .optional()
    .map_err(backend)?
    .map(lease_from_sql)
    .transpose()
}

impl IdStore for SqliteIdStore {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        spec.validate()?;
        let tx = self.begin()?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM id_tag WHERE tag = ?1", [tag], |r| r.get(0))
            .optional()
            .map_err(backend)?;
        if exists.is_some() {
            return Err(StoreError::TagExists(tag.to_owned()));
        }
        let max_id = align_up(spec.first_id, spec.remainder, spec.delta);
        tx.execute(
            "INSERT INTO id_tag (tag, max_id, step, delta, remainder, version) VALUES (?1, ?2, ?3, ?4, ?5, 0)",
            params![tag, to_sql(max_id), to_sql(spec.step), to_sql(spec.delta), to_sql(spec.remainder)],
        )
        .map_err(backend)?;
        let row = read_tag_tx(&tx, tag)?;
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
        check_alloc(req)?;
        let tx = self.begin()?;
        let row = read_tag_tx(&tx, &req.tag)?;
        if let Some(read_max_id) = req.blind_max_id {
            return allocate_blind(tx, req, &row, read_max_id);
        }
        if row.version != req.expected_version {
            return Err(StoreError::VersionConflict {
                tag: req.tag.clone(),
                expected: req.expected_version,
                actual: row.version,
            });
        }
        let (segment, from_pool) = match take_from_pool(&row.pool, req.min_id, req.ids) {
            Some((segment, rest)) => {
                tx.execute("DELETE FROM id_pool WHERE tag = ?1", [&req.tag])
                    .map_err(backend)?;
                for range in &rest {
                    insert_pool(&tx, &req.tag, range)?;
                }
                (segment, true)
            }
            None => (fresh_segment(&row, req.ids)?, false),
        };
        let max_id = if from_pool { row.max_id } else { segment.end };
        // The optimistic lock itself: the WHERE clause re-checks the version inside the write.
        let updated = tx
            .execute(
                "UPDATE id_tag SET max_id = ?1, version = version + 1 WHERE tag = ?2 AND version = ?3",
                params![to_sql(max_id), &req.tag, to_sql(req.expected_version)],
            )
            .map_err(backend)?;
        if updated != 1 {
            return Err(StoreError::Backend(format!(
                "version of `{}` changed inside a write transaction",
                req.tag
            )));
        }
        let grant = Grant {
            tag: req.tag.clone(),
            segment,
            version: row.version + 1,
            claim_end: initial_claim(&segment, req.claim_ids),
            lease_expiry_ms: req.now_ms.saturating_add(req.lease_ms),
            from_pool,
            tag_step: row.step,
        };
        insert_lease(&tx, req, &grant, false)?;
        tx.commit().map_err(backend)?;
        Ok(grant)
    }

    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        let lost = || StoreError::LeaseLost {
            tag: req.tag.clone(),
            segment_start: req.segment_start,
            instance: req.instance,
        };
        let tx = self.begin()?;
        let lease = read_lease(&tx, &req.tag, req.segment_start)?.ok_or_else(lost)?;
        if lease.instance != req.instance {
            return Err(lost());
        }
        let claim_end = lease.claim_end.max(req.claim_end.min(lease.segment.end));
        let lease_expiry_ms = lease
            .lease_expiry_ms
            .max(req.now_ms.saturating_add(req.lease_ms));
        tx.execute(
            "UPDATE id_lease SET claim_end = ?1, lease_expiry_ms = ?2 WHERE tag = ?3 AND seg_start = ?4",
            params![to_sql(claim_end), to_sql(lease_expiry_ms), &req.tag, to_sql(req.segment_start)],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(Lease {
            claim_end,
            lease_expiry_ms,
        })
    }

    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        let lost = || StoreError::LeaseLost {
            tag: req.tag.clone(),
            segment_start: req.segment_start,
            instance: req.instance,
        };
        let tx = self.begin()?;
        let lease = read_lease(&tx, &req.tag, req.segment_start)?.ok_or_else(lost)?;
        if lease.instance != req.instance {
            return Err(lost());
        }
        let segment = lease.segment;
        tx.execute(
            "DELETE FROM id_lease WHERE tag = ?1 AND seg_start = ?2",
            params![&req.tag, to_sql(req.segment_start)],
        )
        .map_err(backend)?;
        let from = segment
            .align_up(req.used_end.clamp(segment.start, segment.end))
            .min(segment.end);
        insert_pool(
            &tx,
            &req.tag,
            &Segment {
                start: from,
                end: segment.end,
                delta: segment.delta,
            },
        )?;
        tx.commit().map_err(backend)
    }

    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        let tx = self.begin()?;
        let expired = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease \
                     WHERE lease_expiry_ms <= ?1 ORDER BY tag, seg_start",
                )
                .map_err(backend)?;
            stmt.query_map([to_sql(now_ms)], |r| {
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
            .collect::<Result<Vec<_>, StoreError>>()?
        };
        let mut reclaimed = Vec::with_capacity(expired.len());
        for lease in expired {
            let segment = lease.segment;
            tx.execute(
                "DELETE FROM id_lease WHERE tag = ?1 AND seg_start = ?2",
                params![&lease.tag, to_sql(segment.start)],
            )
            .map_err(backend)?;
            let from = segment.align_up(lease.claim_end).min(segment.end);
            let tail = Segment {
                start: from,
                end: segment.end,
                delta: segment.delta,
            };
            insert_pool(&tx, &lease.tag, &tail)?;
            reclaimed.push(Reclaimed {
                tag: lease.tag,
                instance: lease.instance,
                tail,
            });
        }
        tx.commit().map_err(backend)?;
        Ok(reclaimed)
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease ORDER BY tag, seg_start",
            )
            .map_err(backend)?;
        stmt.query_map([], |r| {
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

    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        if req.worker_count == 0 {
            return Err(StoreError::InvalidSpec {
                field: "worker_count".into(),
                reason: "must be at least 1".into(),
            });
        }
        let tx = self.begin()?;
        let rows: BTreeMap<u32, (Option<u64>, u64, u64)> = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT worker_id, holder, lease_expiry_ms, reserved_ts FROM id_worker WHERE namespace = ?1 AND worker_id < ?2",
                )
                .map_err(backend)?;
            stmt.query_map(params![&req.namespace, i64::from(req.worker_count)], |r| {
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
                let holder = holder.map(|h| from_sql(h, "holder")).transpose()?;
                Ok((
                    id,
                    (
                        holder,
                        from_sql(expiry, "lease_expiry_ms")?,
                        from_sql(reserved, "reserved_ts")?,
                    ),
                ))
            })
            .collect::<Result<_, StoreError>>()?
        };
        let mine = rows
            .iter()
            .find(|(_, (holder, _, _))| *holder == Some(req.instance.0))
            .map(|(id, _)| *id);
        let chosen = mine.or_else(|| {
            (0..req.worker_count).find(|id| match rows.get(id) {
                None => true,
                Some((holder, expiry, _)) => holder.is_none() || *expiry <= req.now_ms,
            })
        });
        let Some(worker_id) = chosen else {
            return Err(StoreError::NoFreeWorker {
                namespace: req.namespace.clone(),
                worker_count: req.worker_count,
            });
        };
        let reserved_ts = rows.get(&worker_id).map_or(0, |(_, _, reserved)| *reserved);
        let lease_expiry_ms = req.now_ms.saturating_add(req.lease_ms);
        tx.execute(
            "INSERT INTO id_worker (namespace, worker_id, holder, lease_expiry_ms, reserved_ts) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT(namespace, worker_id) DO UPDATE SET holder = excluded.holder, lease_expiry_ms = excluded.lease_expiry_ms",
            params![&req.namespace, i64::from(worker_id), to_sql(req.instance.0), to_sql(lease_expiry_ms), to_sql(reserved_ts)],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(WorkerLease {
            worker_id,
            lease_expiry_ms,
            reserved_ts,
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
        let tx = self.begin()?;
        let row: Option<(Option<i64>, i64, i64)> = tx
            .query_row(
                "SELECT holder, lease_expiry_ms, reserved_ts FROM id_worker WHERE namespace = ?1 AND worker_id = ?2",
                params![namespace, i64::from(worker_id)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(backend)?;
        let Some((holder, expiry, reserved)) = row else {
            return Err(lost());
        };
        if holder != Some(to_sql(instance.0)) {
            return Err(lost());
        }
        let reserved_ts = from_sql(reserved, "reserved_ts")?.max(reserve_ts);
        let lease_expiry_ms =
            from_sql(expiry, "lease_expiry_ms")?.max(now_ms.saturating_add(lease_ms));
        tx.execute(
            "UPDATE id_worker SET lease_expiry_ms = ?1, reserved_ts = ?2 WHERE namespace = ?3 AND worker_id = ?4",
            params![to_sql(lease_expiry_ms), to_sql(reserved_ts), namespace, i64::from(worker_id)],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(WorkerLease {
            worker_id,
            lease_expiry_ms,
            reserved_ts,
        })
    }

    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        let tx = self.begin()?;
        let updated = tx
            .execute(
                "UPDATE id_worker SET holder = NULL WHERE namespace = ?1 AND worker_id = ?2 AND holder = ?3",
                params![namespace, i64::from(worker_id), to_sql(instance.0)],
            )
            .map_err(backend)?;
        if updated != 1 {
            return Err(StoreError::WorkerLeaseLost {
                namespace: namespace.to_owned(),
                worker_id,
                instance,
            });
        }
        tx.commit().map_err(backend)
    }

    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        let interval_ms = self.durability.interval_ms();
        if interval_ms == 0 {
            let tx = self.begin()?;
            let value = read_counter(&tx, key)?
                .checked_add(n)
                .ok_or_else(|| StoreError::Exhausted(key.to_owned()))?;
            write_counter(&tx, key, value)?;
            tx.commit().map_err(backend)?;
            return Ok(value);
        }
        if !self.live_counters.contains_key(key) {
            let tx = self.begin()?;
            let value = read_counter(&tx, key)?;
            tx.commit().map_err(backend)?;
            self.live_counters.insert(
                key.to_owned(),
                LiveCounter {
                    value,
                    synced_at_ms: now_ms,
                },
            );
        }
        let counter = self.live_counters.get_mut(key).expect("inserted above");
        let value = counter
            .value
            .checked_add(n)
            .ok_or_else(|| StoreError::Exhausted(key.to_owned()))?;
        counter.value = value;
        if now_ms.saturating_sub(counter.synced_at_ms) >= interval_ms {
            counter.synced_at_ms = now_ms;
            let tx = self.begin()?;
            write_counter(&tx, key, value)?;
            tx.commit().map_err(backend)?;
        }
        Ok(value)
    }
}

#[cfg(test)]
mod conformance;
