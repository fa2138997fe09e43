//! The PostgreSQL token store: [`SqlTokenStore`] (the store written once for every database
//! server) on a [`PgConn`], with the rows read and written by PostgreSQL's SQL ([`TokenRows`]):
//! an issue's reads in one statement, a purge's delete and summary in one, the one-time writer's
//! snapshot and bulk writes with arrays (`unnest`).
//!
//! Encoding, as in the SQLite store: user ids are stored bit-for-bit in a `BIGINT` (compared only
//! for equality); times saturate at `i64::MAX` ms. The jti column is collated `"C"`, so that
//! [`revoked_jtis`](sut::token::TokenStore::revoked_jtis) comes back in byte order whatever the
//! database's locale. PostgreSQL text cannot hold a NUL byte: such a jti is a backend error here.

use sut::token::ActivityKey;
use sut::token::rows::{OnceGrant, OnceKey, OnceToken, Table, TokenStoreError};
use sut::token::rules::OnceRow;
use sut::token::store::TokenStoreLimits;
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use super::{DbError, Param, PgConn, Tx, from_sql, get_u64, to_sql};
use crate::sqldb::tokens::{
    IssueReads, SqlTokenStore, TokenRows, corrupt, expiry_column, table_name, token_text,
    user_from_sql, user_to_sql,
};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tok_revoked (
    jti           TEXT COLLATE "C" PRIMARY KEY,
    keep_until_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS tok_revoked_keep_until ON tok_revoked (keep_until_ms);
CREATE TABLE IF NOT EXISTS tok_once (
    token           TEXT   PRIMARY KEY,
    user_id         BIGINT NOT NULL,
    activity        TEXT   NOT NULL,
    window_start_ms BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL,
    consumed_at_ms  BIGINT,
    CONSTRAINT tok_once_key UNIQUE (user_id, activity, window_start_ms)
);
CREATE INDEX IF NOT EXISTS tok_once_expires_at ON tok_once (expires_at_ms);
CREATE TABLE IF NOT EXISTS tok_rows (
    tbl TEXT   PRIMARY KEY,
    n   BIGINT NOT NULL CHECK (n >= 0),
    forgotten_until_ms BIGINT NOT NULL DEFAULT 0 CHECK (forgotten_until_ms >= 0)
);
INSERT INTO tok_rows SELECT 'tok_revoked', COUNT(*) FROM tok_revoked ON CONFLICT (tbl) DO NOTHING;
INSERT INTO tok_rows SELECT 'tok_once', COUNT(*) FROM tok_once ON CONFLICT (tbl) DO NOTHING;
-- A database from before the horizon gets its column. Only then: an ALTER TABLE takes an
-- exclusive lock even when the column exists, and two stores opening at once would deadlock.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_name = 'tok_rows' AND column_name = 'forgotten_until_ms') THEN
        ALTER TABLE tok_rows ADD COLUMN forgotten_until_ms BIGINT NOT NULL DEFAULT 0
            CHECK (forgotten_until_ms >= 0);
    END IF;
END $$;
"#;

/// The PostgreSQL token store.
pub type PgTokenStore = SqlTokenStore<PgConn>;

impl SqlTokenStore<PgConn> {
    /// Connects to the database at `url` (`postgres://user@host:port/db`) and creates the
    /// `tok_` tables if needed.
    ///
    /// # Errors
    /// Connection or DDL failures, as [`TokenStoreError::Backend`].
    pub fn open(url: &str, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Ok(Self::on(PgConn::open(url, SCHEMA)?, limits))
    }
}

/// Column `index` of `row`.
fn column<'r, T: FromSql<'r>>(row: &'r Row, index: usize, what: &str) -> Result<T, DbError> {
    row.try_get(index)
        .map_err(|e| DbError::fatal(format!("column {what}: {e}")))
}

/// The `user_id, activity, window_start_ms` columns from `first` on.
fn once_key(row: &Row, first: usize) -> Result<OnceKey, TokenStoreError> {
    Ok(OnceKey {
        user: user_from_sql(column(row, first, "user_id")?),
        activity: ActivityKey::new(column::<String>(row, first + 1, "activity")?)
            .ok_or_else(|| corrupt("activity id"))?,
        window_start_ms: get_u64(row, first + 2, "window_start_ms")?,
    })
}

/// The `expires_at_ms, consumed_at_ms` columns from `first` on, with `key`.
fn once_row(key: OnceKey, row: &Row, first: usize) -> Result<OnceRow, TokenStoreError> {
    let consumed_at_ms: Option<i64> = column(row, first + 1, "consumed_at_ms")?;
    Ok(OnceRow {
        key,
        expires_at_ms: get_u64(row, first, "expires_at_ms")?,
        consumed_at_ms: consumed_at_ms
            .map(|at| from_sql(at, "consumed_at_ms"))
            .transpose()?,
    })
}

/// The token, key and row of a `tok_once` row read as `token, user_id, activity,
/// window_start_ms, expires_at_ms, consumed_at_ms`.
fn named_row(row: &Row) -> Result<(OnceToken, OnceRow), TokenStoreError> {
    let token = token_text(&column::<String>(row, 0, "token")?)?;
    let key = once_key(row, 1)?;
    Ok((token, once_row(key, row, 4)?))
}

impl TokenRows for Tx<'_> {
    fn counter(&mut self, table: Table) -> Result<(u64, u64), TokenStoreError> {
        let sql = "SELECT n, forgotten_until_ms FROM tok_rows WHERE tbl = $1";
        let row = self.query_opt(sql, &[&table_name(table)])?;
        let row = row.ok_or_else(|| corrupt("tok_rows counter"))?;
        Ok((
            get_u64(&row, 0, "row count")?,
            get_u64(&row, 1, "forgotten_until_ms")?,
        ))
    }

    /// One statement: the delete and its summary.
    fn delete_expired(
        &mut self,
        table: Table,
        now_ms: u64,
    ) -> Result<(u64, Option<u64>), TokenStoreError> {
        let (name, expiry) = (table_name(table), expiry_column(table));
        let sql = format!(
            "WITH d AS (DELETE FROM {name} WHERE {expiry} <= $1 RETURNING {expiry}) \
             SELECT COUNT(*), MAX({expiry}) FROM d"
        );
        let row = self
            .query_opt(&sql, &[&to_sql(now_ms)])?
            .ok_or_else(|| corrupt("purge summary"))?;
        let deleted = get_u64(&row, 0, "deleted rows")?;
        let latest: Option<i64> = column(&row, 1, "latest expiry")?;
        let latest_ms = latest.map(|ms| from_sql(ms, "latest expiry")).transpose()?;
        Ok((deleted, latest_ms))
    }

    fn forget(&mut self, table: Table, deleted: u64, until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "UPDATE tok_rows SET n = n - $2, forgotten_until_ms = $3 WHERE tbl = $1";
        let params = [
            &table_name(table) as Param<'_>,
            &to_sql(deleted),
            &to_sql(until_ms),
        ];
        let changed = self.execute(sql, &params)?;
        assert_eq!(changed, 1, "the schema creates every counter row");
        Ok(())
    }

    fn revocation(&mut self, jti: &str) -> Result<Option<u64>, TokenStoreError> {
        let sql = "SELECT keep_until_ms FROM tok_revoked WHERE jti = $1";
        Ok(self
            .query_opt(sql, &[&jti])?
            .map(|row| get_u64(&row, 0, "keep_until_ms"))
            .transpose()?)
    }

    fn raise_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "UPDATE tok_revoked SET keep_until_ms = $2 WHERE jti = $1";
        self.execute(sql, &[&jti, &to_sql(keep_until_ms)])?;
        Ok(())
    }

    /// The row and its count in one statement.
    fn insert_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "WITH inserted AS ( \
                     INSERT INTO tok_revoked (jti, keep_until_ms) VALUES ($1, $2) RETURNING 1) \
                   UPDATE tok_rows SET n = n + (SELECT COUNT(*) FROM inserted) \
                   WHERE tbl = 'tok_revoked'";
        let counted = self.execute(sql, &[&jti, &to_sql(keep_until_ms)])?;
        assert_eq!(counted, 1, "the schema creates every counter row");
        Ok(())
    }

    fn jtis(&mut self) -> Result<Vec<String>, TokenStoreError> {
        let rows = self.query("SELECT jti FROM tok_revoked ORDER BY jti", &[])?;
        Ok(rows
            .iter()
            .map(|row| column(row, 0, "jti"))
            .collect::<Result<_, _>>()?)
    }

    /// One round trip: the counter row joined with the rows of the grant's key and token.
    fn issue_reads(&mut self, grant: &OnceGrant) -> Result<IssueReads, TokenStoreError> {
        let sql = "SELECT r.n, o.token, o.user_id, o.activity, o.window_start_ms, \
                          o.expires_at_ms, o.consumed_at_ms, r.forgotten_until_ms \
                   FROM tok_rows r LEFT JOIN tok_once o \
                     ON (o.user_id = $1 AND o.activity = $2 AND o.window_start_ms = $3) \
                     OR o.token = $4 \
                   WHERE r.tbl = 'tok_once'";
        let wanted = grant.token.to_string();
        let params = [
            &user_to_sql(grant.key.user) as Param<'_>,
            &grant.key.activity.as_str(),
            &to_sql(grant.key.window_start_ms),
            &wanted,
        ];
        let rows = self.query(sql, &params)?;
        let first = rows.first().ok_or_else(|| corrupt("tok_rows counter"))?;
        let mut reads = IssueReads {
            existing: None,
            taken: false,
            rows: get_u64(first, 0, "row count")?,
            forgotten_until_ms: get_u64(first, 7, "forgotten_until_ms")?,
        };
        for row in &rows {
            // The one row of an outer join that matched nothing.
            let Some(text) = column::<Option<String>>(row, 1, "token")? else {
                continue;
            };
            let token = token_text(&text)?;
            reads.taken |= token == grant.token;
            let key = once_key(row, 2)?;
            if key == grant.key {
                reads.existing = Some((token, once_row(key, row, 5)?));
            }
        }
        Ok(reads)
    }

    fn read_once(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
        let sql = "SELECT user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms \
                   FROM tok_once WHERE token = $1";
        let Some(row) = self.query_opt(sql, &[&token.to_string()])? else {
            return Ok(None);
        };
        once_row(once_key(&row, 0)?, &row, 3).map(Some)
    }

    fn set_consumed(
        &mut self,
        token: OnceToken,
        consumed_at_ms: u64,
        only_unconsumed: bool,
    ) -> Result<bool, TokenStoreError> {
        let sql = if only_unconsumed {
            "UPDATE tok_once SET consumed_at_ms = $1 WHERE token = $2 AND consumed_at_ms IS NULL"
        } else {
            "UPDATE tok_once SET consumed_at_ms = $1 WHERE token = $2"
        };
        Ok(self.execute(sql, &[&to_sql(consumed_at_ms), &token.to_string()])? == 1)
    }

    fn insert_once(&mut self, token: OnceToken, row: &OnceRow) -> Result<(), TokenStoreError> {
        self.insert_all(&[(token, row.clone())])
    }

    fn read_named(
        &mut self,
        tokens: &[OnceToken],
        keys: &[OnceKey],
    ) -> Result<Vec<(OnceToken, OnceRow)>, TokenStoreError> {
        let tokens: Vec<String> = tokens.iter().map(ToString::to_string).collect();
        let users: Vec<i64> = keys.iter().map(|k| user_to_sql(k.user)).collect();
        let activities: Vec<&str> = keys.iter().map(|k| k.activity.as_str()).collect();
        let windows: Vec<i64> = keys.iter().map(|k| to_sql(k.window_start_ms)).collect();
        // Two index lookups (an `OR` of the two would scan the table).
        let sql = "SELECT token, user_id, activity, window_start_ms, expires_at_ms, \
                          consumed_at_ms \
                   FROM tok_once WHERE token = ANY($1) \
                   UNION ALL \
                   SELECT o.token, o.user_id, o.activity, o.window_start_ms, o.expires_at_ms, \
                          o.consumed_at_ms \
                   FROM unnest($2::bigint[], $3::text[], $4::bigint[]) AS k(u, a, w) \
                   JOIN tok_once o \
                     ON o.user_id = k.u AND o.activity = k.a AND o.window_start_ms = k.w";
        self.query(sql, &[&tokens, &users, &activities, &windows])?
            .iter()
            .map(named_row)
            .collect()
    }

    fn token_of(&mut self, key: &OnceKey) -> Result<Option<OnceToken>, TokenStoreError> {
        let sql = "SELECT token FROM tok_once \
                   WHERE user_id = $1 AND activity = $2 AND window_start_ms = $3";
        let params = [
            &user_to_sql(key.user) as super::Param<'_>,
            &key.activity.as_str(),
            &to_sql(key.window_start_ms),
        ];
        self.query_opt(sql, &params)?
            .map(|found| {
                OnceToken::parse(&column::<String>(&found, 0, "token")?)
                    .ok_or_else(|| corrupt("one-time token text"))
            })
            .transpose()
    }

    fn insert_all(&mut self, rows: &[(OnceToken, OnceRow)]) -> Result<(), TokenStoreError> {
        let tokens: Vec<String> = rows.iter().map(|(t, _)| t.to_string()).collect();
        let users: Vec<i64> = rows.iter().map(|(_, r)| user_to_sql(r.key.user)).collect();
        let activities: Vec<&str> = rows.iter().map(|(_, r)| r.key.activity.as_str()).collect();
        let windows: Vec<i64> = rows
            .iter()
            .map(|(_, r)| to_sql(r.key.window_start_ms))
            .collect();
        let expiries: Vec<i64> = rows.iter().map(|(_, r)| to_sql(r.expires_at_ms)).collect();
        let sql = "WITH inserted AS ( \
                     INSERT INTO tok_once \
                     (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
                     SELECT t, u, a, w, e, NULL FROM unnest($1::text[], $2::bigint[], \
                            $3::text[], $4::bigint[], $5::bigint[]) AS x(t, u, a, w, e) \
                     RETURNING 1) \
                   UPDATE tok_rows SET n = n + (SELECT COUNT(*) FROM inserted) \
                   WHERE tbl = 'tok_once'";
        let counted = self.execute(sql, &[&tokens, &users, &activities, &windows, &expiries])?;
        assert_eq!(counted, 1, "the schema creates every counter row");
        Ok(())
    }

    fn consume_all(&mut self, consumes: &[(OnceToken, u64)]) -> Result<u64, TokenStoreError> {
        let tokens: Vec<String> = consumes.iter().map(|(t, _)| t.to_string()).collect();
        let times: Vec<i64> = consumes.iter().map(|(_, at)| to_sql(*at)).collect();
        let sql = "UPDATE tok_once SET consumed_at_ms = x.at \
                   FROM unnest($1::text[], $2::bigint[]) AS x(token, at) \
                   WHERE tok_once.token = x.token AND tok_once.consumed_at_ms IS NULL";
        Ok(self.execute(sql, &[&tokens, &times])?)
    }
}
