//! The MariaDB token store: [`SqlTokenStore`] (the store written once for every database
//! server) on a [`MyConn`], with the rows read and written by MariaDB's SQL ([`TokenRows`]):
//! an issue's reads in one statement, the one-time writer's snapshot and bulk writes with `IN`
//! lists, `OR`s of key equalities, multi-row `INSERT`s and `UPDATE … CASE`.
//!
//! Encoding: user ids are stored bit-for-bit in a `BIGINT` (compared only for equality); times
//! saturate at `i64::MAX` ms; jtis, tokens and activity ids are `VARBINARY`, so that they
//! compare and sort byte by byte ([`revoked_jtis`](sut::token::TokenStore::revoked_jtis) in
//! byte order, as the other stores give it) whatever the server's collation. A jti longer than
//! the column (3,072 bytes) is a backend error here.

use mysql_async::{Row, Value};
use sut::token::ActivityKey;
use sut::token::rows::{OnceGrant, OnceKey, OnceToken, Table, TokenStoreError};
use sut::token::rules::OnceRow;
use sut::token::store::TokenStoreLimits;

use super::{MyConn, MyTx as Tx, col, get_opt_text, get_text, get_u64, params};
use crate::sqldb::tokens::{
    IssueReads, SqlTokenStore, TokenRows, corrupt, expiry_column, table_name, token_text,
    user_from_sql, user_to_sql,
};
use crate::sqldb::{from_sql, to_sql};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tok_revoked (
    jti           VARBINARY(3072) PRIMARY KEY,
    keep_until_ms BIGINT NOT NULL,
    KEY tok_revoked_keep_until (keep_until_ms)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS tok_once (
    token           VARBINARY(64) PRIMARY KEY,
    user_id         BIGINT NOT NULL,
    activity        VARBINARY(255) NOT NULL,
    window_start_ms BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL,
    consumed_at_ms  BIGINT NULL,
    UNIQUE KEY tok_once_key (user_id, activity, window_start_ms),
    KEY tok_once_expires_at (expires_at_ms)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS tok_rows (
    tbl                VARBINARY(32) PRIMARY KEY,
    n                  BIGINT NOT NULL CHECK (n >= 0),
    forgotten_until_ms BIGINT NOT NULL DEFAULT 0 CHECK (forgotten_until_ms >= 0)
) ENGINE = InnoDB;
INSERT IGNORE INTO tok_rows (tbl, n) SELECT 'tok_revoked', COUNT(*) FROM tok_revoked;
INSERT IGNORE INTO tok_rows (tbl, n) SELECT 'tok_once', COUNT(*) FROM tok_once;
";

/// The MariaDB token store.
pub type MyTokenStore = SqlTokenStore<MyConn>;

impl SqlTokenStore<MyConn> {
    /// Connects to the database at `url` (`mysql://user@host:port/db`) and creates the `tok_`
    /// tables if needed.
    ///
    /// # Errors
    /// Connection or DDL failures, as [`TokenStoreError::Backend`].
    pub fn open(url: &str, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Ok(Self::on(MyConn::open(url, SCHEMA)?, limits))
    }
}

/// The `user_id, activity, window_start_ms` columns from `first` on.
fn once_key(row: &Row, first: usize) -> Result<OnceKey, TokenStoreError> {
    Ok(OnceKey {
        user: user_from_sql(col(row, first, "user_id")?),
        activity: ActivityKey::new(get_text(row, first + 1, "activity")?)
            .ok_or_else(|| corrupt("activity id"))?,
        window_start_ms: get_u64(row, first + 2, "window_start_ms")?,
    })
}

/// The `expires_at_ms, consumed_at_ms` columns from `first` on, with `key`.
fn once_row(key: OnceKey, row: &Row, first: usize) -> Result<OnceRow, TokenStoreError> {
    let consumed_at_ms: Option<i64> = col(row, first + 1, "consumed_at_ms")?;
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
    let token = token_text(&get_text(row, 0, "token")?)?;
    let key = once_key(row, 1)?;
    Ok((token, once_row(key, row, 4)?))
}

/// `(?, ?, …)` with `n` marks.
fn marks(n: usize) -> String {
    format!("({})", vec!["?"; n].join(", "))
}

/// Rows of one bulk statement at most (a statement takes at most 65,535 parameters).
const BULK_ROWS_MAX: usize = 2_000;

/// Adds one row to `table`'s counter.
fn count_insert(tx: &mut Tx<'_>, rows: u64, table: Table) -> Result<(), TokenStoreError> {
    let sql = "UPDATE tok_rows SET n = n + ? WHERE tbl = ?";
    let changed = tx.execute(sql, params![to_sql(rows), table_name(table)])?;
    assert_eq!(changed, 1, "the schema creates every counter row");
    Ok(())
}

impl TokenRows for Tx<'_> {
    fn counter(&mut self, table: Table) -> Result<(u64, u64), TokenStoreError> {
        let sql = "SELECT n, forgotten_until_ms FROM tok_rows WHERE tbl = ?";
        let row = self.query_opt(sql, params![table_name(table)])?;
        let row = row.ok_or_else(|| corrupt("tok_rows counter"))?;
        Ok((
            get_u64(&row, 0, "row count")?,
            get_u64(&row, 1, "forgotten_until_ms")?,
        ))
    }

    /// The latest expiry read under the transaction's locks (what the `DELETE` then removes,
    /// no more, no less), then the delete: its matched rows are how many.
    fn delete_expired(
        &mut self,
        table: Table,
        now_ms: u64,
    ) -> Result<(u64, Option<u64>), TokenStoreError> {
        let (name, expiry) = (table_name(table), expiry_column(table));
        let sql = format!("SELECT MAX({expiry}) FROM {name} WHERE {expiry} <= ?");
        let latest: Option<i64> = match self.query_opt(&sql, params![to_sql(now_ms)])? {
            Some(row) => col(&row, 0, "latest expiry")?,
            None => None,
        };
        let latest_ms = latest.map(|ms| from_sql(ms, "latest expiry")).transpose()?;
        let sql = format!("DELETE FROM {name} WHERE {expiry} <= ?");
        let deleted = self.execute(&sql, params![to_sql(now_ms)])?;
        Ok((deleted, latest_ms))
    }

    fn forget(&mut self, table: Table, deleted: u64, until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "UPDATE tok_rows SET n = n - ?, forgotten_until_ms = ? WHERE tbl = ?";
        let params = params![to_sql(deleted), to_sql(until_ms), table_name(table)];
        let changed = self.execute(sql, params)?;
        assert_eq!(changed, 1, "the schema creates every counter row");
        Ok(())
    }

    fn revocation(&mut self, jti: &str) -> Result<Option<u64>, TokenStoreError> {
        let sql = "SELECT keep_until_ms FROM tok_revoked WHERE jti = ?";
        Ok(self
            .query_opt(sql, params![jti])?
            .map(|row| get_u64(&row, 0, "keep_until_ms"))
            .transpose()?)
    }

    fn raise_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "UPDATE tok_revoked SET keep_until_ms = ? WHERE jti = ?";
        self.execute(sql, params![to_sql(keep_until_ms), jti])?;
        Ok(())
    }

    fn insert_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError> {
        let sql = "INSERT INTO tok_revoked (jti, keep_until_ms) VALUES (?, ?)";
        self.execute(sql, params![jti, to_sql(keep_until_ms)])?;
        count_insert(self, 1, Table::Revocations)
    }

    fn jtis(&mut self) -> Result<Vec<String>, TokenStoreError> {
        let rows = self.query("SELECT jti FROM tok_revoked ORDER BY jti", Vec::new())?;
        Ok(rows
            .iter()
            .map(|row| get_text(row, 0, "jti"))
            .collect::<Result<_, _>>()?)
    }

    /// One round trip: the counter row joined with the rows of the grant's key and token.
    fn issue_reads(&mut self, grant: &OnceGrant) -> Result<IssueReads, TokenStoreError> {
        let sql = "SELECT r.n, o.token, o.user_id, o.activity, o.window_start_ms, \
                          o.expires_at_ms, o.consumed_at_ms, r.forgotten_until_ms \
                   FROM tok_rows r LEFT JOIN tok_once o \
                     ON (o.user_id = ? AND o.activity = ? AND o.window_start_ms = ?) \
                     OR o.token = ? \
                   WHERE r.tbl = 'tok_once'";
        let rows = self.query(
            sql,
            params![
                user_to_sql(grant.key.user),
                grant.key.activity.as_str(),
                to_sql(grant.key.window_start_ms),
                grant.token.to_string(),
            ],
        )?;
        let first = rows.first().ok_or_else(|| corrupt("tok_rows counter"))?;
        let mut reads = IssueReads {
            existing: None,
            taken: false,
            rows: get_u64(first, 0, "row count")?,
            forgotten_until_ms: get_u64(first, 7, "forgotten_until_ms")?,
        };
        for row in &rows {
            // The one row of an outer join that matched nothing.
            let Some(text) = get_opt_text(row, 1, "token")? else {
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
                   FROM tok_once WHERE token = ?";
        let Some(row) = self.query_opt(sql, params![token.to_string()])? else {
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
            "UPDATE tok_once SET consumed_at_ms = ? WHERE token = ? AND consumed_at_ms IS NULL"
        } else {
            "UPDATE tok_once SET consumed_at_ms = ? WHERE token = ?"
        };
        let params = params![to_sql(consumed_at_ms), token.to_string()];
        Ok(self.execute(sql, params)? == 1)
    }

    fn insert_once(&mut self, token: OnceToken, row: &OnceRow) -> Result<(), TokenStoreError> {
        self.insert_all(&[(token, row.clone())])
    }

    /// Index lookups on the primary key (`token IN (…)`) and on the key's unique index (an
    /// `OR` of equalities, one range each), one statement per chunk.
    fn read_named(
        &mut self,
        tokens: &[OnceToken],
        keys: &[OnceKey],
    ) -> Result<Vec<(OnceToken, OnceRow)>, TokenStoreError> {
        const COLUMNS: &str = "SELECT token, user_id, activity, window_start_ms, \
                               expires_at_ms, consumed_at_ms FROM tok_once";
        let mut found = Vec::new();
        for chunk in tokens.chunks(BULK_ROWS_MAX) {
            let sql = format!("{COLUMNS} WHERE token IN {}", marks(chunk.len()));
            let params = chunk.iter().map(|t| Value::from(t.to_string())).collect();
            for row in self.query(&sql, params)? {
                found.push(named_row(&row)?);
            }
        }
        for chunk in keys.chunks(BULK_ROWS_MAX) {
            let one = "(user_id = ? AND activity = ? AND window_start_ms = ?)";
            let sql = format!("{COLUMNS} WHERE {}", vec![one; chunk.len()].join(" OR "));
            let mut params = Vec::with_capacity(3 * chunk.len());
            for key in chunk {
                params.extend(params![
                    user_to_sql(key.user),
                    key.activity.as_str(),
                    to_sql(key.window_start_ms),
                ]);
            }
            for row in self.query(&sql, params)? {
                found.push(named_row(&row)?);
            }
        }
        Ok(found)
    }

    fn token_of(&mut self, key: &OnceKey) -> Result<Option<OnceToken>, TokenStoreError> {
        let sql = "SELECT token FROM tok_once \
                   WHERE user_id = ? AND activity = ? AND window_start_ms = ?";
        let params = params![
            user_to_sql(key.user),
            key.activity.as_str(),
            to_sql(key.window_start_ms),
        ];
        self.query_opt(sql, params)?
            .map(|found| {
                OnceToken::parse(&get_text(&found, 0, "token")?)
                    .ok_or_else(|| corrupt("one-time token text"))
            })
            .transpose()
    }

    fn insert_all(&mut self, rows: &[(OnceToken, OnceRow)]) -> Result<(), TokenStoreError> {
        for chunk in rows.chunks(BULK_ROWS_MAX) {
            let sql = format!(
                "INSERT INTO tok_once \
                 (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
                 VALUES {}",
                vec!["(?, ?, ?, ?, ?, NULL)"; chunk.len()].join(", ")
            );
            let mut params = Vec::with_capacity(5 * chunk.len());
            for (token, row) in chunk {
                params.extend(params![
                    token.to_string(),
                    user_to_sql(row.key.user),
                    row.key.activity.as_str(),
                    to_sql(row.key.window_start_ms),
                    to_sql(row.expires_at_ms),
                ]);
            }
            self.execute(&sql, params)?;
        }
        count_insert(self, rows.len() as u64, Table::OnceTokens)
    }

    /// One `UPDATE … SET consumed_at_ms = CASE token WHEN … END` per chunk, guarded by
    /// `consumed_at_ms IS NULL`: the rows it matched are the tokens still unconsumed.
    fn consume_all(&mut self, consumes: &[(OnceToken, u64)]) -> Result<u64, TokenStoreError> {
        let mut changed = 0;
        for chunk in consumes.chunks(BULK_ROWS_MAX) {
            let sql = format!(
                "UPDATE tok_once SET consumed_at_ms = CASE token {} END \
                 WHERE token IN {} AND consumed_at_ms IS NULL",
                vec!["WHEN ? THEN ?"; chunk.len()].join(" "),
                marks(chunk.len())
            );
            let mut params = Vec::with_capacity(3 * chunk.len());
            for (token, at) in chunk {
                params.extend(params![token.to_string(), to_sql(*at)]);
            }
            params.extend(chunk.iter().map(|(t, _)| Value::from(t.to_string())));
            changed += self.execute(&sql, params)?;
        }
        Ok(changed)
    }
}
