//! The MariaDB token store, the twin of [`SqliteTokenStore`](crate::sqlite::SqliteTokenStore)
//! and [`PgTokenStore`](crate::pg::PgTokenStore).
//!
//! Each trait method is one SERIALIZABLE transaction ([`MyConn::transact`], retried after a
//! deadlock): it reads the rows the rules of [`sut::token::rules`] name, calls the rule, and
//! writes what the rule returns, as the other stores do. The one-time consume writes its
//! acceptance with the same conditional statement,
//!
//! ```sql
//! UPDATE tok_once SET consumed_at_ms = ? WHERE token = ? AND consumed_at_ms IS NULL
//! ```
//!
//! and two servers consuming one token at once cannot both get through: both read the row
//! under a shared lock, the second to write deadlocks and is rolled back, and its retry reads
//! the token consumed.
//!
//! [`MyTokenStore::batch_once`] runs many operations in one transaction (one redo-log flush for
//! the lot: the one-time-token writer's group commit), each through the same functions as a
//! single operation. The table limits count rows with a counter per table (`tok_rows`), kept in
//! the same transaction as every insert and purge.
//!
//! Encoding: user ids are stored bit-for-bit in a `BIGINT` (compared only for equality); times
//! saturate at `i64::MAX` ms; jtis, tokens and activity ids are `VARBINARY`, so that they
//! compare and sort byte by byte ([`revoked_jtis`](TokenStore::revoked_jtis) in byte order, as
//! the other stores give it) whatever the server's collation. A jti longer than the column
//! (3,072 bytes) is a backend error here.

use std::sync::{Mutex, PoisonError};

use mysql_async::{Row, Value};
use sut::edge::Edges;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, RevokeStep, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};
use sut::token::{ActivityKey, UserId};

use super::{MyConn, MyTx as Tx, col, get_opt_text, get_text, get_u64, params};
use crate::sqldb::once_view::{Committed, OnceHints, OnceTx, run_batch};
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

/// The MariaDB token store: one connection, used by one operation (or one
/// [`batch_once`](MyTokenStore::batch_once)) at a time.
#[derive(Debug)]
pub struct MyTokenStore {
    conn: Mutex<MyConn>,
    limits: TokenStoreLimits,
}

const fn user_to_sql(user: UserId) -> i64 {
    i64::from_ne_bytes(user.0.to_ne_bytes())
}

const fn user_from_sql(v: i64) -> UserId {
    UserId(u64::from_ne_bytes(v.to_ne_bytes()))
}

fn corrupt(what: &str) -> TokenStoreError {
    TokenStoreError::Backend(format!("corrupt row: bad {what}"))
}

/// The name of `table`, as `tok_rows` and the SQL know it.
const fn table_name(table: Table) -> &'static str {
    match table {
        Table::Revocations => "tok_revoked",
        Table::OnceTokens => "tok_once",
    }
}

/// The column of `table` a row expires by.
const fn expiry_column(table: Table) -> &'static str {
    match table {
        Table::Revocations => "keep_until_ms",
        Table::OnceTokens => "expires_at_ms",
    }
}

/// The rows `table` holds and its horizon ([`sut::token::Forgotten`]), both kept in `tok_rows`
/// (a `COUNT(*)` would read the whole table on every insert, and lock all of it).
fn counter(tx: &mut Tx<'_>, table: Table) -> Result<(u64, u64), TokenStoreError> {
    let sql = "SELECT n, forgotten_until_ms FROM tok_rows WHERE tbl = ?";
    let row = tx.query_opt(sql, params![table_name(table)])?;
    let row = row.ok_or_else(|| corrupt("tok_rows counter"))?;
    Ok((
        get_u64(&row, 0, "row count")?,
        get_u64(&row, 1, "forgotten_until_ms")?,
    ))
}

/// Adds one row to `table`'s counter.
fn count_insert(tx: &mut Tx<'_>, table: Table) -> Result<(), TokenStoreError> {
    let sql = "UPDATE tok_rows SET n = n + 1 WHERE tbl = ?";
    let changed = tx.execute(sql, params![table_name(table)])?;
    assert_eq!(changed, 1, "the schema creates every counter row");
    Ok(())
}

/// Deletes the rows of `table` that have expired at `now_ms`; then lowers the table's counter
/// by as many and raises its horizon to the latest of them ([`rules::forget_until`]), in the
/// caller's transaction; how many.
fn purge(tx: &mut Tx<'_>, table: Table, now_ms: u64) -> Result<u64, TokenStoreError> {
    let (name, expiry) = (table_name(table), expiry_column(table));
    // Read under the transaction's locks: what the DELETE below removes, no more, no less.
    let sql = format!("SELECT MAX({expiry}) FROM {name} WHERE {expiry} <= ?");
    let latest: Option<i64> = match tx.query_opt(&sql, params![to_sql(now_ms)])? {
        Some(row) => col(&row, 0, "latest expiry")?,
        None => None,
    };
    let latest_ms = latest.map(|ms| from_sql(ms, "latest expiry")).transpose()?;
    let sql = format!("DELETE FROM {name} WHERE {expiry} <= ?");
    let deleted = tx.execute(&sql, params![to_sql(now_ms)])?;
    let (_, until_ms) = counter(tx, table)?;
    let until_ms = rules::forget_until(until_ms, latest_ms);
    let sql = "UPDATE tok_rows SET n = n - ?, forgotten_until_ms = ? WHERE tbl = ?";
    let changed = tx.execute(sql, params![to_sql(deleted), to_sql(until_ms), name])?;
    assert_eq!(changed, 1, "the schema creates every counter row");
    Ok(deleted)
}

/// Makes room for one row in `table`, holding `rows` rows, purging its expired rows when the
/// rules say so. `Ok(Err)` is the refusal after the purge, to be committed with it (the memory
/// store keeps it too).
fn make_room(
    tx: &mut Tx<'_>,
    table: Table,
    max: u64,
    now_ms: u64,
    rows: u64,
) -> Result<Committed<()>, TokenStoreError> {
    if rules::room(rows, max, &mut Edges::new()) == Room::PurgeFirst {
        purge(tx, table, now_ms)?;
        return Ok(rules::after_purge(table, counter(tx, table)?.0, max));
    }
    Ok(Ok(()))
}

/// What issuing `grant` depends on, read in one round trip: the token and row of its key,
/// whether its token value is taken, and how many rows `tok_once` holds.
fn read_for_issue(tx: &mut Tx<'_>, grant: &OnceGrant) -> Result<IssueReads, TokenStoreError> {
    let sql = "SELECT r.n, o.token, o.user_id, o.activity, o.window_start_ms, \
                      o.expires_at_ms, o.consumed_at_ms, r.forgotten_until_ms \
               FROM tok_rows r LEFT JOIN tok_once o \
                 ON (o.user_id = ? AND o.activity = ? AND o.window_start_ms = ?) \
                 OR o.token = ? \
               WHERE r.tbl = 'tok_once'";
    let rows = tx.query(
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
        let token = OnceToken::parse(&text).ok_or_else(|| corrupt("one-time token text"))?;
        reads.taken |= token == grant.token;
        let key = once_key(row, 2)?;
        if key == grant.key {
            reads.existing = Some((token, once_row(key, row, 5)?));
        }
    }
    Ok(reads)
}

/// What [`read_for_issue`] found.
struct IssueReads {
    existing: Option<(OnceToken, OnceRow)>,
    taken: bool,
    rows: u64,
    forgotten_until_ms: u64,
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

/// The row of one-time token `token`, if stored.
fn read_once(tx: &mut Tx<'_>, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
    let sql = "SELECT user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms \
               FROM tok_once WHERE token = ?";
    let Some(row) = tx.query_opt(sql, params![token.to_string()])? else {
        return Ok(None);
    };
    once_row(once_key(&row, 0)?, &row, 3).map(Some)
}

/// Sets the `consumed_at_ms` of token `token`; `only_unconsumed` adds the condition that it
/// was not consumed yet. Whether a row changed.
fn set_consumed(
    tx: &mut Tx<'_>,
    token: OnceToken,
    consumed_at_ms: u64,
    only_unconsumed: bool,
) -> Result<bool, TokenStoreError> {
    let sql = if only_unconsumed {
        "UPDATE tok_once SET consumed_at_ms = ? WHERE token = ? AND consumed_at_ms IS NULL"
    } else {
        "UPDATE tok_once SET consumed_at_ms = ? WHERE token = ?"
    };
    Ok(tx.execute(sql, params![to_sql(consumed_at_ms), token.to_string()])? == 1)
}

impl MyTokenStore {
    /// Connects to the database at `url` (`mysql://user@host:port/db`) and creates the `tok_`
    /// tables if needed.
    ///
    /// # Errors
    /// Connection or DDL failures, as [`TokenStoreError::Backend`].
    pub fn open(url: &str, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Ok(Self {
            conn: Mutex::new(MyConn::open(url, SCHEMA)?),
            limits,
        })
    }

    /// Runs `op` as one serializable transaction (retried whole after a deadlock).
    fn transact<T>(
        &self,
        op: impl FnMut(&mut Tx<'_>) -> Result<T, TokenStoreError>,
    ) -> Result<T, TokenStoreError> {
        // A panic mid-operation left its transaction open; the connection gives itself up
        // before its next use (`MyConn`'s `open_tx`), so nothing of it commits.
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.transact(op)
    }

    /// Runs `ops` against a store whose every operation happens inside **one** serializable
    /// transaction, committed when `ops` returns `Ok` (group commit: one redo-log flush for the
    /// lot), the one-time token operations served from a snapshot read up front (see
    /// [`crate::sqldb::once_view`]). A deadlock rolls all of it back and runs `ops` again from
    /// the start, so `ops` must start from scratch on every call and nothing it computed may
    /// leave before this returns `Ok`.
    ///
    /// # Errors
    /// The first error `ops` returns (nothing committed), or a database failure.
    pub fn batch_once(
        &mut self,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        let limits = self.limits;
        self.transact(|tx| run_batch(tx, limits, hints, ops))
    }
}

impl TokenStore for MyTokenStore {
    /// Its own transaction, committed even when the answer is a refusal (`Full`): the purge
    /// made to find room stays, as in the memory store.
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        let max = self.limits.revocations_max;
        self.transact(|tx| revoke_in(tx, max, jti, keep_until_ms, now_ms))?
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        self.transact(|tx| is_revoked_in(tx, jti))
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        self.transact(revoked_jtis_in)
    }

    /// Committed even when refused, as [`TokenStore::revoke`].
    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        let max = self.limits.once_tokens_max;
        self.transact(|tx| issue_once_in(tx, max, grant, now_ms))?
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        self.transact(|tx| consume_once_in(tx, token, user, now_ms))
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        self.transact(|tx| check_once_in(tx, token, user, now_ms))
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        self.transact(|tx| mark_once_consumed_in(tx, token, now_ms))
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        self.transact(|tx| purge_expired_in(tx, now_ms))
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        self.transact(forgotten_in)
    }
}

/// [`TokenStore::purge_expired`] in `tx`.
fn purge_expired_in(tx: &mut Tx<'_>, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
    Ok(PurgeCounts {
        revocations: purge(tx, Table::Revocations, now_ms)?,
        once_tokens: purge(tx, Table::OnceTokens, now_ms)?,
    })
}

/// [`TokenStore::forgotten`] in `tx`.
fn forgotten_in(tx: &mut Tx<'_>) -> Result<Forgotten, TokenStoreError> {
    Ok(Forgotten {
        revocations_until_ms: counter(tx, Table::Revocations)?.1,
        once_until_ms: counter(tx, Table::OnceTokens)?.1,
    })
}

/// [`TokenStore::revoke`] in `tx`.
fn revoke_in(
    tx: &mut Tx<'_>,
    max: u64,
    jti: &str,
    keep_until_ms: u64,
    now_ms: u64,
) -> Result<Committed<RevokeOutcome>, TokenStoreError> {
    let sql = "SELECT keep_until_ms FROM tok_revoked WHERE jti = ?";
    let existing = tx.query_opt(sql, params![jti])?;
    let existing = existing
        .map(|row| get_u64(&row, 0, "keep_until_ms"))
        .transpose()?;
    let (rows, horizon_ms) = counter(tx, Table::Revocations)?;
    let step = rules::revoke(existing, keep_until_ms, now_ms, horizon_ms);
    match step {
        RevokeStep::NotNeeded => {}
        RevokeStep::Raise { keep_until_ms } => {
            let sql = "UPDATE tok_revoked SET keep_until_ms = ? WHERE jti = ?";
            tx.execute(sql, params![to_sql(keep_until_ms), jti])?;
        }
        RevokeStep::Insert { keep_until_ms } => {
            if let Err(full) = make_room(tx, Table::Revocations, max, now_ms, rows)? {
                return Ok(Err(full));
            }
            let sql = "INSERT INTO tok_revoked (jti, keep_until_ms) VALUES (?, ?)";
            tx.execute(sql, params![jti, to_sql(keep_until_ms)])?;
            count_insert(tx, Table::Revocations)?;
        }
    }
    Ok(Ok(step.outcome()))
}

/// [`TokenStore::is_revoked`] in `tx`.
fn is_revoked_in(tx: &mut Tx<'_>, jti: &str) -> Result<bool, TokenStoreError> {
    let sql = "SELECT 1 FROM tok_revoked WHERE jti = ?";
    Ok(tx.query_opt(sql, params![jti])?.is_some())
}

/// [`TokenStore::revoked_jtis`] in `tx`.
fn revoked_jtis_in(tx: &mut Tx<'_>) -> Result<Vec<String>, TokenStoreError> {
    let rows = tx.query("SELECT jti FROM tok_revoked ORDER BY jti", Vec::new())?;
    Ok(rows
        .iter()
        .map(|row| get_text(row, 0, "jti"))
        .collect::<Result<_, _>>()?)
}

/// [`TokenStore::issue_once`] in `tx`.
fn issue_once_in(
    tx: &mut Tx<'_>,
    max: u64,
    grant: &OnceGrant,
    now_ms: u64,
) -> Result<Committed<OnceIssue>, TokenStoreError> {
    let reads = read_for_issue(tx, grant)?;
    let existing = reads.existing.as_ref().map(|(token, row)| (*token, row));
    let (row, answer) = match rules::issue_once(
        existing,
        reads.taken,
        grant,
        now_ms,
        reads.forgotten_until_ms,
        &mut Edges::new(),
    )? {
        IssueStep::Existing(answer) => return Ok(Ok(answer)),
        IssueStep::Insert { row, answer } => (row, answer),
    };
    if let Err(full) = make_room(tx, Table::OnceTokens, max, now_ms, reads.rows)? {
        return Ok(Err(full));
    }
    let sql = "INSERT INTO tok_once \
               (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
               VALUES (?, ?, ?, ?, ?, NULL)";
    tx.execute(
        sql,
        params![
            answer.token.to_string(),
            user_to_sql(row.key.user),
            row.key.activity.as_str(),
            to_sql(row.key.window_start_ms),
            to_sql(row.expires_at_ms),
        ],
    )?;
    count_insert(tx, Table::OnceTokens)?;
    Ok(Ok(answer))
}

/// [`TokenStore::consume_once`] in `tx`.
fn consume_once_in(
    tx: &mut Tx<'_>,
    token: OnceToken,
    user: UserId,
    now_ms: u64,
) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
    let consume = rules::consume_once(
        read_once(tx, token)?.as_ref(),
        user,
        now_ms,
        &mut Edges::new(),
    );
    if let Some(at) = consume.consumed_at_ms {
        // The one write that makes the acceptance: it must find the row still unconsumed.
        if !set_consumed(tx, token, at, true)? {
            return Err(TokenStoreError::Backend(
                "consume: the accepted token was consumed inside the transaction".to_owned(),
            ));
        }
    }
    Ok(consume.verdict)
}

/// [`TokenStore::check_once`] in `tx`.
fn check_once_in(
    tx: &mut Tx<'_>,
    token: OnceToken,
    user: UserId,
    now_ms: u64,
) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
    Ok(rules::judge(
        read_once(tx, token)?.as_ref(),
        user,
        now_ms,
        &mut Edges::new(),
    ))
}

/// [`TokenStore::mark_once_consumed`] in `tx`.
fn mark_once_consumed_in(
    tx: &mut Tx<'_>,
    token: OnceToken,
    now_ms: u64,
) -> Result<bool, TokenStoreError> {
    let mark = rules::mark_once_consumed(read_once(tx, token)?.as_ref(), now_ms, &mut Edges::new());
    if let Some(at) = mark {
        let marked = set_consumed(tx, token, at, false)?;
        assert!(marked, "the row read in this transaction is there");
    }
    Ok(mark.is_some())
}

/// The token, key and row of a `tok_once` row read as `token, user_id, activity,
/// window_start_ms, expires_at_ms, consumed_at_ms`.
fn named_row(row: &Row) -> Result<(OnceToken, OnceRow), TokenStoreError> {
    let token = OnceToken::parse(&get_text(row, 0, "token")?)
        .ok_or_else(|| corrupt("one-time token text"))?;
    let key = once_key(row, 1)?;
    Ok((token, once_row(key, row, 4)?))
}

/// `(?, ?, …)` with `n` marks.
fn marks(n: usize) -> String {
    let mut list = String::from("(");
    for i in 0..n {
        list.push_str(if i == 0 { "?" } else { ", ?" });
    }
    list.push(')');
    list
}

/// Rows of one bulk statement at most (a statement takes at most 65,535 parameters).
const BULK_ROWS_MAX: usize = 2_000;

impl OnceTx for Tx<'_> {
    fn revoke(
        &mut self,
        max: u64,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<Committed<RevokeOutcome>, TokenStoreError> {
        revoke_in(self, max, jti, keep_until_ms, now_ms)
    }

    fn is_revoked(&mut self, jti: &str) -> Result<bool, TokenStoreError> {
        is_revoked_in(self, jti)
    }

    fn revoked_jtis(&mut self) -> Result<Vec<String>, TokenStoreError> {
        revoked_jtis_in(self)
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        check_once_in(self, token, user, now_ms)
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        mark_once_consumed_in(self, token, now_ms)
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        purge_expired_in(self, now_ms)
    }

    fn forgotten(&mut self) -> Result<Forgotten, TokenStoreError> {
        forgotten_in(self)
    }

    fn make_room_once(
        &mut self,
        max: u64,
        now_ms: u64,
        rows: u64,
    ) -> Result<Committed<()>, TokenStoreError> {
        make_room(self, Table::OnceTokens, max, now_ms, rows)
    }

    fn once_counter(&mut self) -> Result<(u64, u64), TokenStoreError> {
        counter(self, Table::OnceTokens)
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

    fn read_once(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
        read_once(self, token)
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
        let sql = "UPDATE tok_rows SET n = n + ? WHERE tbl = 'tok_once'";
        let counted = self.execute(sql, params![to_sql(rows.len() as u64)])?;
        assert_eq!(counted, 1, "the schema creates every counter row");
        Ok(())
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
