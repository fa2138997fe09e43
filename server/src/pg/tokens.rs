//! The PostgreSQL token store, the twin of [`SqliteTokenStore`](crate::sqlite::SqliteTokenStore).
//!
//! Each trait method is one SERIALIZABLE transaction ([`PgConn::transact`], retried on a
//! serialization failure): it reads the rows the rules of [`sut::token::rules`] name, calls the
//! rule, and writes what the rule returns, as the memory and SQLite stores do. The one-time
//! consume writes its acceptance with the same conditional statement as the SQLite store,
//!
//! ```sql
//! UPDATE tok_once SET consumed_at_ms = $1 WHERE token = $2 AND consumed_at_ms IS NULL
//! ```
//!
//! and two servers consuming one token at once cannot both get through: the later transaction
//! fails to serialize, is retried, and then reads the token consumed.
//!
//! [`PgTokenStore::batch_once`] runs many operations in one transaction, each decided by the same
//! rules on rows read up front for the whole batch: the server's one-time-token writer uses it
//! for group commit (one WAL flush per batch instead of one per token). The table limits count rows with a counter per table (`tok_rows`), kept in
//! the same transaction as every insert and purge, instead of a `COUNT(*)` per insert.
//!
//! Encoding, as in the SQLite store: user ids are stored bit-for-bit in a `BIGINT` (compared only
//! for equality); times saturate at `i64::MAX` ms. The jti column is collated `"C"`, so that
//! [`revoked_jtis`](TokenStore::revoked_jtis) comes back in byte order whatever the database's
//! locale. PostgreSQL text cannot hold a NUL byte: such a jti is a backend error here.

use std::sync::{Mutex, PoisonError};

use sut::edge::Edges;
use sut::token::ActivityKey;
use sut::token::UserId;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, RevokeStep, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use super::{DbError, Param, PgConn, Tx, from_sql, get_u64, to_sql};

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

/// The PostgreSQL token store: one connection, used by one operation (or one
/// [`batch_once`](PgTokenStore::batch_once)) at a time.
#[derive(Debug)]
pub struct PgTokenStore {
    conn: Mutex<PgConn>,
    limits: TokenStoreLimits,
}

/// An answer to return after committing: a `Full` refusal keeps the purge made before it.
type Committed<T> = Result<T, TokenStoreError>;

const fn user_to_sql(user: UserId) -> i64 {
    i64::from_ne_bytes(user.0.to_ne_bytes())
}

const fn user_from_sql(v: i64) -> UserId {
    UserId(u64::from_ne_bytes(v.to_ne_bytes()))
}

fn corrupt(what: &str) -> TokenStoreError {
    TokenStoreError::Backend(format!("corrupt row: bad {what}"))
}

/// Column `index` of `row`.
fn column<'r, T: FromSql<'r>>(row: &'r Row, index: usize, what: &str) -> Result<T, DbError> {
    row.try_get(index)
        .map_err(|e| DbError::fatal(format!("column {what}: {e}")))
}

/// The name of `table`, as `tok_rows` and the SQL know it.
const fn table_name(table: Table) -> &'static str {
    match table {
        Table::Revocations => "tok_revoked",
        Table::OnceTokens => "tok_once",
    }
}

/// The rows `table` holds, from its counter in `tok_rows` (kept in the transaction of every
/// insert and delete: a `COUNT(*)` would read the whole table on every insert, and under
/// SERIALIZABLE make every two inserts conflict).
fn count(tx: &mut Tx<'_>, table: Table) -> Result<u64, TokenStoreError> {
    Ok(counter(tx, table)?.0)
}

/// The rows `table` holds and its horizon ([`sut::token::Forgotten`]), both kept in `tok_rows`.
fn counter(tx: &mut Tx<'_>, table: Table) -> Result<(u64, u64), TokenStoreError> {
    let sql = "SELECT n, forgotten_until_ms FROM tok_rows WHERE tbl = $1";
    let row = tx.query_opt(sql, &[&table_name(table)])?;
    let row = row.ok_or_else(|| corrupt("tok_rows counter"))?;
    Ok((
        get_u64(&row, 0, "row count")?,
        get_u64(&row, 1, "forgotten_until_ms")?,
    ))
}

/// Adds `delta` to `table`'s row counter.
fn add_rows(tx: &mut Tx<'_>, table: Table, delta: i64) -> Result<(), TokenStoreError> {
    if delta == 0 {
        return Ok(());
    }
    let sql = "UPDATE tok_rows SET n = n + $2 WHERE tbl = $1";
    let changed = tx.execute(sql, &[&table_name(table), &delta])?;
    assert_eq!(changed, 1, "the schema creates every counter row");
    Ok(())
}

/// Deletes the rows of `table` whose `expiry` column is at most `now_ms`; then lowers the table's
/// counter by as many and raises its horizon to the latest of them ([`rules::forget_until`]),
/// in the caller's transaction; how many.
fn purge(tx: &mut Tx<'_>, table: Table, expiry: &str, now_ms: u64) -> Result<u64, TokenStoreError> {
    let name = table_name(table);
    let sql = format!(
        "WITH d AS (DELETE FROM {name} WHERE {expiry} <= $1 RETURNING {expiry}) \
         SELECT COUNT(*), MAX({expiry}), \
                (SELECT forgotten_until_ms FROM tok_rows WHERE tbl = $2) FROM d"
    );
    let row = tx
        .query_opt(&sql, &[&to_sql(now_ms), &name])?
        .ok_or_else(|| corrupt("purge summary"))?;
    let deleted = get_u64(&row, 0, "deleted rows")?;
    let latest: Option<i64> = column(&row, 1, "latest expiry")?;
    let latest_ms = latest.map(|ms| from_sql(ms, "latest expiry")).transpose()?;
    let until: Option<i64> = column(&row, 2, "forgotten_until_ms")?;
    let until_ms = from_sql(until.ok_or_else(|| corrupt("tok_rows counter"))?, "horizon")?;
    let until_ms = rules::forget_until(until_ms, latest_ms);
    let sql = "UPDATE tok_rows SET n = n - $2, forgotten_until_ms = $3 WHERE tbl = $1";
    let changed = tx.execute(sql, &[&name, &to_sql(deleted), &to_sql(until_ms)])?;
    assert_eq!(changed, 1, "the schema creates every counter row");
    Ok(deleted)
}

/// `DELETE` where [`rules::revocation_expired`] holds.
fn purge_revocations(tx: &mut Tx<'_>, now_ms: u64) -> Result<u64, TokenStoreError> {
    purge(tx, Table::Revocations, "keep_until_ms", now_ms)
}

/// `DELETE` where [`rules::once_expired`] holds.
fn purge_once(tx: &mut Tx<'_>, now_ms: u64) -> Result<u64, TokenStoreError> {
    purge(tx, Table::OnceTokens, "expires_at_ms", now_ms)
}

/// Deletes a table's expired rows; how many.
type Purge = fn(&mut Tx<'_>, u64) -> Result<u64, TokenStoreError>;

/// Makes room for one row in `table`, purging its expired rows when the rules say so. `Ok(Err)`
/// is the refusal after the purge, to be committed with it (the memory store keeps it too).
fn make_room(
    tx: &mut Tx<'_>,
    table: Table,
    max: u64,
    now_ms: u64,
) -> Result<Committed<()>, TokenStoreError> {
    let purge: Purge = match table {
        Table::Revocations => purge_revocations,
        Table::OnceTokens => purge_once,
    };
    let rows = count(tx, table)?;
    make_room_counted(tx, table, max, now_ms, rows, purge)
}

/// [`make_room`] for a table known to hold `rows` rows.
fn make_room_counted(
    tx: &mut Tx<'_>,
    table: Table,
    max: u64,
    now_ms: u64,
    rows: u64,
    purge: Purge,
) -> Result<Committed<()>, TokenStoreError> {
    if rules::room(rows, max, &mut Edges::new()) == Room::PurgeFirst {
        purge(tx, now_ms)?;
        return Ok(rules::after_purge(table, count(tx, table)?, max));
    }
    Ok(Ok(()))
}

/// What issuing `grant` depends on, read in one round trip: the token and row of its key, whether
/// its token value is taken, and how many rows `tok_once` holds.
fn read_for_issue(tx: &mut Tx<'_>, grant: &OnceGrant) -> Result<IssueReads, TokenStoreError> {
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
    let rows = tx.query(sql, &params)?;
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
        let token = OnceToken::parse(&text).ok_or_else(|| corrupt("one-time token text"))?;
        reads.taken |= token == grant.token;
        let key = OnceKey {
            user: user_from_sql(column(row, 2, "user_id")?),
            activity: ActivityKey::new(column::<String>(row, 3, "activity")?)
                .ok_or_else(|| corrupt("activity id"))?,
            window_start_ms: get_u64(row, 4, "window_start_ms")?,
        };
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

/// The row of one-time token `token`, if stored.
fn read_once(tx: &mut Tx<'_>, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
    let sql = "SELECT user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms \
               FROM tok_once WHERE token = $1";
    let Some(row) = tx.query_opt(sql, &[&token.to_string()])? else {
        return Ok(None);
    };
    let key = OnceKey {
        user: user_from_sql(column(&row, 0, "user_id")?),
        activity: ActivityKey::new(column::<String>(&row, 1, "activity")?)
            .ok_or_else(|| corrupt("activity id"))?,
        window_start_ms: get_u64(&row, 2, "window_start_ms")?,
    };
    once_row(key, &row, 3).map(Some)
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
        "UPDATE tok_once SET consumed_at_ms = $1 WHERE token = $2 AND consumed_at_ms IS NULL"
    } else {
        "UPDATE tok_once SET consumed_at_ms = $1 WHERE token = $2"
    };
    Ok(tx.execute(sql, &[&to_sql(consumed_at_ms), &token.to_string()])? == 1)
}

impl PgTokenStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`) and creates the
    /// `tok_` tables if needed.
    ///
    /// # Errors
    /// Connection or DDL failures, as [`TokenStoreError::Backend`].
    pub fn open(url: &str, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Ok(Self {
            conn: Mutex::new(PgConn::open(url, SCHEMA)?),
            limits,
        })
    }

    /// Runs `op` as one serializable transaction (retried whole on a serialization failure).
    fn transact<T>(
        &self,
        op: impl FnMut(&mut Tx<'_>) -> Result<T, TokenStoreError>,
    ) -> Result<T, TokenStoreError> {
        // A panic mid-operation left no transaction open (dropping it rolled it back).
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.transact(op)
    }
}

impl TokenStore for PgTokenStore {
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
    let sql = "SELECT keep_until_ms FROM tok_revoked WHERE jti = $1";
    let existing = tx.query_opt(sql, &[&jti])?;
    let existing = existing
        .map(|row| get_u64(&row, 0, "keep_until_ms"))
        .transpose()?;
    let (_, horizon_ms) = counter(tx, Table::Revocations)?;
    let step = rules::revoke(existing, keep_until_ms, now_ms, horizon_ms);
    match step {
        RevokeStep::NotNeeded => {}
        RevokeStep::Raise { keep_until_ms } => {
            let sql = "UPDATE tok_revoked SET keep_until_ms = $2 WHERE jti = $1";
            tx.execute(sql, &[&jti, &to_sql(keep_until_ms)])?;
        }
        RevokeStep::Insert { keep_until_ms } => {
            if let Err(full) = make_room(tx, Table::Revocations, max, now_ms)? {
                return Ok(Err(full));
            }
            let sql = "INSERT INTO tok_revoked (jti, keep_until_ms) VALUES ($1, $2)";
            tx.execute(sql, &[&jti, &to_sql(keep_until_ms)])?;
            add_rows(tx, Table::Revocations, 1)?;
        }
    }
    Ok(Ok(step.outcome()))
}

/// [`TokenStore::is_revoked`] in `tx`.
fn is_revoked_in(tx: &mut Tx<'_>, jti: &str) -> Result<bool, TokenStoreError> {
    let sql = "SELECT 1 FROM tok_revoked WHERE jti = $1";
    Ok(tx.query_opt(sql, &[&jti])?.is_some())
}

/// [`TokenStore::revoked_jtis`] in `tx`.
fn revoked_jtis_in(tx: &mut Tx<'_>) -> Result<Vec<String>, TokenStoreError> {
    let rows = tx.query("SELECT jti FROM tok_revoked ORDER BY jti", &[])?;
    Ok(rows
        .iter()
        .map(|row| column(row, 0, "jti"))
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
    let horizon_ms = reads.forgotten_until_ms;
    let (row, answer) = match rules::issue_once(
        existing,
        reads.taken,
        grant,
        now_ms,
        horizon_ms,
        &mut Edges::new(),
    )? {
        IssueStep::Existing(answer) => return Ok(Ok(answer)),
        IssueStep::Insert { row, answer } => (row, answer),
    };
    let table = Table::OnceTokens;
    if let Err(full) = make_room_counted(tx, table, max, now_ms, reads.rows, purge_once)? {
        return Ok(Err(full));
    }
    // The row and its count in one statement.
    let sql = "WITH inserted AS ( \
                 INSERT INTO tok_once \
                 (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, NULL) RETURNING 1) \
               UPDATE tok_rows SET n = n + (SELECT COUNT(*) FROM inserted) \
               WHERE tbl = 'tok_once'";
    let counted = tx.execute(
        sql,
        &[
            &answer.token.to_string(),
            &user_to_sql(row.key.user),
            &row.key.activity.as_str(),
            &to_sql(row.key.window_start_ms),
            &to_sql(row.expires_at_ms),
        ],
    )?;
    assert_eq!(counted, 1, "the schema creates every counter row");
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

/// [`TokenStore::purge_expired`] in `tx`.
fn purge_expired_in(tx: &mut Tx<'_>, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
    Ok(PurgeCounts {
        revocations: purge_revocations(tx, now_ms)?,
        once_tokens: purge_once(tx, now_ms)?,
    })
}

mod batch;
pub use batch::OnceHints;
