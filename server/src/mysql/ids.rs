//! The MariaDB ID store: [`SqlIdStore`] (the store written once for every database server) on
//! a [`MyConn`], with the rows read and written by MariaDB's SQL ([`IdRows`]). Text keys are
//! `VARBINARY` (compared and sorted byte by byte), `"end"` and `"key"` are quoted as the
//! session's `ANSI_QUOTES` allows, upserts are `ON DUPLICATE KEY UPDATE`.

use std::collections::{BTreeMap, BTreeSet};

use mysql_async::Row;
use sut::id_store::rules::WorkerRow;
use sut::id_store::{
    CounterDurability, InstanceId, Lease, LeaseRow, RenewRequest, Segment, StoreError, TagRow,
};

use super::{MyConn, MyTx as Tx, col, get_text, get_u64, params};
use crate::sqldb::ids::{IdRows, SqlIdStore};
use crate::sqldb::{DbError, from_sql, to_sql};

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
pub type MyIdStore = SqlIdStore<MyConn>;

impl SqlIdStore<MyConn> {
    /// Connects to `url` and creates the tables if missing.
    ///
    /// # Errors
    /// Connection or schema failures.
    pub fn open(url: &str, durability: CounterDurability) -> Result<Self, StoreError> {
        Ok(Self::on(MyConn::open(url, SCHEMA)?, durability))
    }
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

fn worker_from_row(r: &Row, first: usize) -> Result<WorkerRow, DbError> {
    let holder: Option<i64> = col(r, first, "holder")?;
    Ok(WorkerRow {
        holder: holder
            .map(|h| from_sql(h, "holder").map(InstanceId))
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
            .query_opt("SELECT 1 FROM id_tag WHERE tag = ?", params![tag])?
            .is_some())
    }

    fn insert_tag(&mut self, row: &TagRow) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_tag (tag, max_id, step, delta, remainder, version) \
             VALUES (?, ?, ?, ?, ?, ?)",
            params![
                row.tag.as_str(),
                to_sql(row.max_id),
                to_sql(row.step),
                to_sql(row.delta),
                to_sql(row.remainder),
                to_sql(row.version),
            ],
        )?;
        Ok(())
    }

    fn tag_row(&mut self, tag: &str) -> Result<Option<TagRow>, DbError> {
        let row = self.query_opt(
            "SELECT max_id, step, delta, remainder, version FROM id_tag WHERE tag = ?",
            params![tag],
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

    fn set_tag(&mut self, row: &TagRow, read_version: Option<u64>) -> Result<u64, DbError> {
        match read_version {
            None => self.execute(
                "UPDATE id_tag SET max_id = ?, version = ? WHERE tag = ?",
                params![to_sql(row.max_id), to_sql(row.version), row.tag.as_str()],
            ),
            Some(read) => self.execute(
                "UPDATE id_tag SET max_id = ?, version = ? WHERE tag = ? AND version = ?",
                params![
                    to_sql(row.max_id),
                    to_sql(row.version),
                    row.tag.as_str(),
                    to_sql(read),
                ],
            ),
        }
    }

    fn clear_pool(&mut self, tag: &str) -> Result<(), DbError> {
        self.execute("DELETE FROM id_pool WHERE tag = ?", params![tag])?;
        Ok(())
    }

    fn insert_pool(&mut self, tag: &str, range: &Segment) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_pool (tag, start, \"end\", delta) VALUES (?, ?, ?, ?)",
            params![
                tag,
                to_sql(range.start),
                to_sql(range.end),
                to_sql(range.delta),
            ],
        )?;
        Ok(())
    }

    fn lease_starts(&mut self, tag: &str) -> Result<BTreeSet<u64>, DbError> {
        self.query("SELECT seg_start FROM id_lease WHERE tag = ?", params![tag])?
            .iter()
            .map(|r| get_u64(r, 0, "seg_start"))
            .collect()
    }

    fn insert_lease(&mut self, lease: &LeaseRow, replace: bool) -> Result<(), DbError> {
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
        self.execute(
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

    fn lease(&mut self, tag: &str, segment_start: u64) -> Result<Option<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} WHERE tag = ? AND seg_start = ?");
        self.query_opt(&sql, params![tag, to_sql(segment_start)])?
            .as_ref()
            .map(lease_from_row)
            .transpose()
    }

    fn renew_lease(&mut self, renewed: &Lease, req: &RenewRequest) -> Result<(), DbError> {
        self.execute(
            "UPDATE id_lease SET claim_end = ?, lease_expiry_ms = ? \
             WHERE tag = ? AND seg_start = ?",
            params![
                to_sql(renewed.claim_end),
                to_sql(renewed.lease_expiry_ms),
                req.tag.as_str(),
                to_sql(req.segment_start),
            ],
        )?;
        Ok(())
    }

    fn delete_lease(&mut self, tag: &str, segment_start: u64) -> Result<(), DbError> {
        self.execute(
            "DELETE FROM id_lease WHERE tag = ? AND seg_start = ?",
            params![tag, to_sql(segment_start)],
        )?;
        Ok(())
    }

    fn expired_leases(&mut self, now_ms: u64) -> Result<Vec<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} WHERE lease_expiry_ms <= ? ORDER BY tag, seg_start");
        self.query(&sql, params![to_sql(now_ms)])?
            .iter()
            .map(lease_from_row)
            .collect()
    }

    fn leases(&mut self) -> Result<Vec<LeaseRow>, DbError> {
        let sql = format!("{LEASE_COLUMNS} ORDER BY tag, seg_start");
        self.query(&sql, Vec::new())?
            .iter()
            .map(lease_from_row)
            .collect()
    }

    fn workers(
        &mut self,
        namespace: &str,
        worker_count: u32,
    ) -> Result<BTreeMap<u32, WorkerRow>, DbError> {
        self.query(
            "SELECT worker_id, holder, lease_expiry_ms, reserved_ts FROM id_worker \
             WHERE namespace = ? AND worker_id < ?",
            params![namespace, i64::from(worker_count)],
        )?
        .iter()
        .map(|r| Ok((worker_id_of(r)?, worker_from_row(r, 1)?)))
        .collect()
    }

    fn worker(&mut self, namespace: &str, worker_id: u32) -> Result<Option<WorkerRow>, DbError> {
        self.query_opt(
            "SELECT holder, lease_expiry_ms, reserved_ts FROM id_worker \
             WHERE namespace = ? AND worker_id = ?",
            params![namespace, i64::from(worker_id)],
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

    fn counter(&mut self, key: &str) -> Result<u64, DbError> {
        let row = self.query_opt(
            "SELECT value FROM id_counter WHERE \"key\" = ?",
            params![key],
        )?;
        row.map_or(Ok(0), |r| get_u64(&r, 0, "counter"))
    }

    fn set_counter(&mut self, key: &str, value: u64) -> Result<(), DbError> {
        self.execute(
            "INSERT INTO id_counter (\"key\", value) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE value = VALUES(value)",
            params![key, to_sql(value)],
        )?;
        Ok(())
    }
}
