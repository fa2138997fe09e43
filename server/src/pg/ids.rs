//! The PostgreSQL ID store: [`SqlIdStore`] (the store written once for every database server)
//! on a [`PgConn`], with the rows read and written by PostgreSQL's SQL ([`IdRows`]).

use std::collections::{BTreeMap, BTreeSet};

use sut::id_store::rules::WorkerRow;
use sut::id_store::{
    CounterDurability, InstanceId, Lease, LeaseRow, RenewRequest, Segment, StoreError, TagRow,
};
use tokio_postgres::Row;

use super::{DbError, PgConn, Tx, get_u64, to_sql};
use crate::sqldb::ids::{IdRows, SqlIdStore};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS id_tag (
    tag       TEXT PRIMARY KEY,
    max_id    BIGINT NOT NULL,
    step      BIGINT NOT NULL,
    delta     BIGINT NOT NULL,
    remainder BIGINT NOT NULL,
    version   BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS id_pool (
    tag    TEXT NOT NULL,
    start  BIGINT NOT NULL,
    \"end\"  BIGINT NOT NULL,
    delta  BIGINT NOT NULL,
    PRIMARY KEY (tag, start)
);
CREATE TABLE IF NOT EXISTS id_lease (
    tag             TEXT NOT NULL,
    seg_start       BIGINT NOT NULL,
    seg_end         BIGINT NOT NULL,
    delta           BIGINT NOT NULL,
    instance        BIGINT NOT NULL,
    claim_end       BIGINT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL,
    PRIMARY KEY (tag, seg_start)
);
CREATE TABLE IF NOT EXISTS id_worker (
    namespace       TEXT NOT NULL,
    worker_id       BIGINT NOT NULL,
    holder          BIGINT,
    lease_expiry_ms BIGINT NOT NULL,
    reserved_ts     BIGINT NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);
CREATE TABLE IF NOT EXISTS id_counter (
    key   TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
";

/// The PostgreSQL ID store.
pub type PgIdStore = SqlIdStore<PgConn>;

impl SqlIdStore<PgConn> {
    /// Connects to `url` and creates the tables if missing.
    ///
    /// # Errors
    /// Connection or schema failures.
    pub fn open(url: &str, durability: CounterDurability) -> Result<Self, StoreError> {
        Ok(Self::on(PgConn::open(url, SCHEMA)?, durability))
    }
}

const LEASE_COLUMNS: &str =
    "SELECT tag, seg_start, seg_end, delta, instance, claim_end, lease_expiry_ms FROM id_lease";

fn lease_from_row(r: &Row) -> Result<LeaseRow, DbError> {
    Ok(LeaseRow {
        tag: r
            .try_get(0)
            .map_err(|e| DbError::fatal(format!("column tag: {e}")))?,
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

fn worker_from_row(r: &Row, first: usize) -> Result<WorkerRow, DbError> {
    let holder: Option<i64> = r
        .try_get(first)
        .map_err(|e| DbError::fatal(format!("column holder: {e}")))?;
    Ok(WorkerRow {
        holder: holder
            .map(|h| super::from_sql(h, "holder").map(InstanceId))
            .transpose()?,
        lease_expiry_ms: get_u64(r, first + 1, "lease_expiry_ms")?,
        reserved_ts: get_u64(r, first + 2, "reserved_ts")?,
    })
}

fn worker_id_of(r: &Row) -> Result<u32, DbError> {
    let id = get_u64(r, 0, "worker_id")?;
    u32::try_from(id).map_err(|_| DbError::fatal(format!("corrupt row: worker id {id}")))
}

impl IdRows for Tx<'_> {
    fn tag_exists(&mut self, tag: &str) -> Result<bool, DbError> {
        Ok(self
            .query_opt("SELECT 1 FROM id_tag WHERE tag = $1", &[&tag])?
            .is_some())
    }

    fn insert_tag(&mut self, row: &TagRow) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_tag (tag, max_id, step, delta, remainder, version) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &row.tag,
                &to_sql(row.max_id),
                &to_sql(row.step),
                &to_sql(row.delta),
                &to_sql(row.remainder),
                &to_sql(row.version),
            ],
        )?;
        Ok(())
    }

    fn tag_row(&mut self, tag: &str) -> Result<Option<TagRow>, DbError> {
        let row = self.query_opt(
            "SELECT max_id, step, delta, remainder, version FROM id_tag WHERE tag = $1",
            &[&tag],
        )?;
        row.map(|row| {
            Ok(TagRow {
                tag: tag.to_owned(),
                max_id: get_u64(&row, 0, "max_id")?,
                step: get_u64(&row, 1, "step")?,
                delta: get_u64(&row, 2, "delta")?,
                remainder: get_u64(&row, 3, "remainder")?,
                version: get_u64(&row, 4, "version")?,
                pool: Vec::new(),
            })
        })
        .transpose()
    }

    fn pool(&mut self, tag: &str) -> Result<Vec<Segment>, DbError> {
        self.query(
            "SELECT start, \"end\", delta FROM id_pool WHERE tag = $1 ORDER BY start",
            &[&tag],
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

    fn set_tag(&mut self, row: &TagRow, read_version: Option<u64>) -> Result<u64, DbError> {
        match read_version {
            None => self.execute(
                "UPDATE id_tag SET max_id = $1, version = $2 WHERE tag = $3",
                &[&to_sql(row.max_id), &to_sql(row.version), &row.tag],
            ),
            Some(read) => self.execute(
                "UPDATE id_tag SET max_id = $1, version = $2 WHERE tag = $3 AND version = $4",
                &[
                    &to_sql(row.max_id),
                    &to_sql(row.version),
                    &row.tag,
                    &to_sql(read),
                ],
            ),
        }
    }

    fn clear_pool(&mut self, tag: &str) -> Result<(), DbError> {
        self.execute("DELETE FROM id_pool WHERE tag = $1", &[&tag])?;
        Ok(())
    }

    fn insert_pool(&mut self, tag: &str, range: &Segment) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_pool (tag, start, \"end\", delta) VALUES ($1, $2, $3, $4)",
            &[
                &tag,
                &to_sql(range.start),
                &to_sql(range.end),
                &to_sql(range.delta),
            ],
        )?;
        Ok(())
    }

    fn lease_starts(&mut self, tag: &str) -> Result<BTreeSet<u64>, DbError> {
        self.query("SELECT seg_start FROM id_lease WHERE tag = $1", &[&tag])?
            .iter()
            .map(|r| get_u64(r, 0, "seg_start"))
            .collect()
    }

    fn insert_lease(&mut self, lease: &LeaseRow, replace: bool) -> Result<(), DbError> {
        let insert = "INSERT INTO id_lease (tag, seg_start, seg_end, delta, instance, claim_end, \
                      lease_expiry_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)";
        let sql = if replace {
            format!(
                "{insert} ON CONFLICT (tag, seg_start) DO UPDATE SET seg_end = excluded.seg_end, \
                 delta = excluded.delta, instance = excluded.instance, \
                 claim_end = excluded.claim_end, lease_expiry_ms = excluded.lease_expiry_ms"
            )
        } else {
            insert.to_owned()
        };
        self.execute(
            &sql,
            &[
                &lease.tag,
                &to_sql(lease.segment.start),
                &to_sql(lease.segment.end),
                &to_sql(lease.segment.delta),
                &to_sql(lease.instance.0),
                &to_sql(lease.claim_end),
                &to_sql(lease.lease_expiry_ms),
            ],
        )?;
        Ok(())
    }

    fn lease(&mut self, tag: &str, segment_start: u64) -> Result<Option<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} WHERE tag = $1 AND seg_start = $2");
        self.query_opt(&sql, &[&tag, &to_sql(segment_start)])?
            .as_ref()
            .map(lease_from_row)
            .transpose()
    }

    fn renew_lease(&mut self, renewed: &Lease, req: &RenewRequest) -> Result<(), DbError> {
        self.execute(
            "UPDATE id_lease SET claim_end = $1, lease_expiry_ms = $2 \
             WHERE tag = $3 AND seg_start = $4",
            &[
                &to_sql(renewed.claim_end),
                &to_sql(renewed.lease_expiry_ms),
                &req.tag,
                &to_sql(req.segment_start),
            ],
        )?;
        Ok(())
    }

    fn delete_lease(&mut self, tag: &str, segment_start: u64) -> Result<(), DbError> {
        self.execute(
            "DELETE FROM id_lease WHERE tag = $1 AND seg_start = $2",
            &[&tag, &to_sql(segment_start)],
        )?;
        Ok(())
    }

    fn expired_leases(&mut self, now_ms: u64) -> Result<Vec<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} WHERE lease_expiry_ms <= $1 ORDER BY tag, seg_start");
        self.query(&sql, &[&to_sql(now_ms)])?
            .iter()
            .map(lease_from_row)
            .collect()
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} ORDER BY tag, seg_start");
        self.query(&sql, &[])?.iter().map(lease_from_row).collect()
    }

    fn workers(
        &mut self,
        namespace: &str,
        worker_count: u32,
    ) -> Result<BTreeMap<u32, WorkerRow>, DbError> {
        self.query(
            "SELECT worker_id, holder, lease_expiry_ms, reserved_ts FROM id_worker \
             WHERE namespace = $1 AND worker_id < $2",
            &[&namespace, &i64::from(worker_count)],
        )?
        .iter()
        .map(|r| Ok((worker_id_of(r)?, worker_from_row(r, 1)?)))
        .collect()
    }

    fn worker(&mut self, namespace: &str, worker_id: u32) -> Result<Option<WorkerRow>, DbError> {
        self.query_opt(
            "SELECT holder, lease_expiry_ms, reserved_ts FROM id_worker \
             WHERE namespace = $1 AND worker_id = $2",
            &[&namespace, &i64::from(worker_id)],
        )?
        .map(|r| worker_from_row(&r, 0))
        .transpose()
    }

    fn set_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        row: &WorkerRow,
    ) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_worker (namespace, worker_id, holder, lease_expiry_ms, reserved_ts) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (namespace, worker_id) DO UPDATE SET \
             holder = excluded.holder, lease_expiry_ms = excluded.lease_expiry_ms, \
             reserved_ts = excluded.reserved_ts",
            &[
                &namespace,
                &i64::from(worker_id),
                &row.holder.map(|h| to_sql(h.0)),
                &to_sql(row.lease_expiry_ms),
                &to_sql(row.reserved_ts),
            ],
        )?;
        Ok(())
    }

    fn counter(&mut self, key: &str) -> Result<u64, DbError> {
        let row = self.query_opt("SELECT value FROM id_counter WHERE key = $1", &[&key])?;
        row.map_or(Ok(0), |r| get_u64(&r, 0, "counter"))
    }

    fn set_counter(&mut self, key: &str, value: u64) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_counter (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&key, &to_sql(value)],
        )?;
        Ok(())
    }
}
