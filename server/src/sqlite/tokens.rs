//! The SQLite token store (the real server's), WAL mode with `synchronous=FULL`.
//!
//! Each trait method is one transaction (`BEGIN IMMEDIATE` where it writes, so nothing can
//! change between its reads and its writes). The store decides nothing: it reads the rows the
//! rules of [`sut::token::rules`] name, calls the rule, and writes what the rule returns, as the
//! memory store does. The one-time consume writes its acceptance with a conditional statement,
//!
//! ```sql
//! UPDATE token_once SET consumed_at_ms = :now WHERE token = :token AND consumed_at_ms IS NULL
//! ```
//!
//! which must change exactly the row the rule accepted (belt and braces on top of the writer
//! lock: a second consumer can never mark it too).
//!
//! Integers: SQLite's are signed 64-bit. User ids are stored bit-for-bit (compared only for
//! equality); times saturate at `i64::MAX` ms (year 292 million), the only place where this
//! store could differ from [`MemoryTokenStore`](sut::token::MemoryTokenStore).

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use std::path::Path;
use sut::edge::Edges;
use sut::token::ActivityKey;
use sut::token::UserId;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, RevokeStep, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS token_revoked (
    jti           TEXT    PRIMARY KEY NOT NULL,
    keep_until_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS token_revoked_keep_until ON token_revoked (keep_until_ms);
CREATE TABLE IF NOT EXISTS token_once (
    token           TEXT    PRIMARY KEY NOT NULL,
    user_id         INTEGER NOT NULL,
    activity        TEXT    NOT NULL,
    window_start_ms INTEGER NOT NULL,
    expires_at_ms   INTEGER NOT NULL,
    consumed_at_ms  INTEGER,
    UNIQUE (user_id, activity, window_start_ms)
);
CREATE INDEX IF NOT EXISTS token_once_expires_at ON token_once (expires_at_ms);
CREATE TABLE IF NOT EXISTS token_forgotten (
    tbl      TEXT    PRIMARY KEY NOT NULL,
    until_ms INTEGER NOT NULL CHECK (until_ms >= 0)
) WITHOUT ROWID;
INSERT OR IGNORE INTO token_forgotten (tbl, until_ms) VALUES ('token_revoked', 0), ('token_once', 0);
";

/// The SQLite token store.
#[derive(Debug)]
pub struct SqliteTokenStore {
    conn: Connection,
    limits: TokenStoreLimits,
}

fn backend(err: rusqlite::Error) -> TokenStoreError {
    TokenStoreError::Backend(err.to_string())
}

fn ms_to_sql(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn ms_from_sql(v: i64, what: &str) -> Result<u64, TokenStoreError> {
    u64::try_from(v)
        .map_err(|_| TokenStoreError::Backend(format!("corrupt row: negative {what} {v}")))
}

const fn user_to_sql(user: UserId) -> i64 {
    i64::from_ne_bytes(user.0.to_ne_bytes())
}

const fn user_from_sql(v: i64) -> UserId {
    UserId(u64::from_ne_bytes(v.to_ne_bytes()))
}

fn token_from_sql(text: &str) -> Result<OnceToken, TokenStoreError> {
    OnceToken::parse(text)
        .ok_or_else(|| TokenStoreError::Backend("corrupt row: bad one-time token text".to_owned()))
}

fn key_from_sql(
    user: i64,
    activity: String,
    window_start_ms: i64,
) -> Result<OnceKey, TokenStoreError> {
    Ok(OnceKey {
        user: user_from_sql(user),
        activity: ActivityKey::new(activity)
            .ok_or_else(|| TokenStoreError::Backend("corrupt row: bad activity id".to_owned()))?,
        window_start_ms: ms_from_sql(window_start_ms, "window_start_ms")?,
    })
}

fn count(tx: &Transaction<'_>, table: &str) -> Result<u64, TokenStoreError> {
    let n: i64 = tx
        .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .map_err(backend)?;
    ms_from_sql(n, "count")
}

/// Deletes the rows of `table` whose `column` is at most `now_ms`, and raises the table's
/// horizon in `token_forgotten` to the latest of them ([`rules::forget_until`]); how many. The
/// caller's transaction makes the two one step.
fn purge(
    conn: &Connection,
    table: &str,
    column: &str,
    now_ms: u64,
) -> Result<u64, TokenStoreError> {
    let now = ms_to_sql(now_ms);
    let latest: Option<i64> = conn
        .query_row(
            &format!("SELECT MAX({column}) FROM {table} WHERE {column} <= ?1"),
            params![now],
            |r| r.get(0),
        )
        .map_err(backend)?;
    let latest_ms = latest.map(|ms| ms_from_sql(ms, column)).transpose()?;
    let until_ms = rules::forget_until(forgotten_until(conn, table)?, latest_ms);
    conn.execute(
        "UPDATE token_forgotten SET until_ms = ?2 WHERE tbl = ?1",
        params![table, ms_to_sql(until_ms)],
    )
    .map_err(backend)?;
    let n = conn
        .execute(
            &format!("DELETE FROM {table} WHERE {column} <= ?1"),
            params![now],
        )
        .map_err(backend)?;
    Ok(n as u64)
}

/// `table`'s horizon.
fn forgotten_until(conn: &Connection, table: &str) -> Result<u64, TokenStoreError> {
    let ms: i64 = conn
        .query_row(
            "SELECT until_ms FROM token_forgotten WHERE tbl = ?1",
            params![table],
            |r| r.get(0),
        )
        .map_err(backend)?;
    ms_from_sql(ms, "until_ms")
}

/// `DELETE` where [`rules::revocation_expired`] holds (the predicate, as SQL over the index).
fn purge_revocations(conn: &Connection, now_ms: u64) -> Result<u64, TokenStoreError> {
    purge(conn, "token_revoked", "keep_until_ms", now_ms)
}

/// `DELETE` where [`rules::once_expired`] holds (the predicate, as SQL over the index).
fn purge_once(conn: &Connection, now_ms: u64) -> Result<u64, TokenStoreError> {
    purge(conn, "token_once", "expires_at_ms", now_ms)
}

fn once_row_from_sql(
    key: OnceKey,
    expires_at_ms: i64,
    consumed_at_ms: Option<i64>,
) -> Result<OnceRow, TokenStoreError> {
    Ok(OnceRow {
        key,
        expires_at_ms: ms_from_sql(expires_at_ms, "expires_at_ms")?,
        consumed_at_ms: consumed_at_ms
            .map(|at| ms_from_sql(at, "consumed_at_ms"))
            .transpose()?,
    })
}

/// The row of one-time token `token`, if stored.
fn read_once(conn: &Connection, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
    let row = conn
        .query_row(
            "SELECT user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms FROM token_once WHERE token = ?1",
            params![token.to_string()],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?, r.get::<_, Option<i64>>(4)?)),
        )
        .optional()
        .map_err(backend)?;
    let Some((user, activity, window_start_ms, expires_at_ms, consumed_at_ms)) = row else {
        return Ok(None);
    };
    let key = key_from_sql(user, activity, window_start_ms)?;
    once_row_from_sql(key, expires_at_ms, consumed_at_ms).map(Some)
}

/// The token and row of one-time key `key`, if it has one.
fn read_once_by_key(
    conn: &Connection,
    key: &OnceKey,
) -> Result<Option<(OnceToken, OnceRow)>, TokenStoreError> {
    let row = conn
        .query_row(
            "SELECT token, expires_at_ms, consumed_at_ms FROM token_once WHERE user_id = ?1 AND activity = ?2 AND window_start_ms = ?3",
            params![user_to_sql(key.user), key.activity.as_str(), ms_to_sql(key.window_start_ms)],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<i64>>(2)?)),
        )
        .optional()
        .map_err(backend)?;
    let Some((token, expires_at_ms, consumed_at_ms)) = row else {
        return Ok(None);
    };
    let row = once_row_from_sql(key.clone(), expires_at_ms, consumed_at_ms)?;
    Ok(Some((token_from_sql(&token)?, row)))
}

/// Sets the `consumed_at_ms` of token `token`; `only_unconsumed` adds the condition that it
/// was not consumed yet. Whether a row changed.
fn set_consumed(
    conn: &Connection,
    token: OnceToken,
    consumed_at_ms: u64,
    only_unconsumed: bool,
) -> Result<bool, TokenStoreError> {
    let condition = if only_unconsumed {
        " AND consumed_at_ms IS NULL"
    } else {
        ""
    };
    let n = conn
        .execute(
            &format!("UPDATE token_once SET consumed_at_ms = ?1 WHERE token = ?2{condition}"),
            params![ms_to_sql(consumed_at_ms), token.to_string()],
        )
        .map_err(backend)?;
    Ok(n == 1)
}

/// Deletes a table's expired rows; how many.
type Purge = fn(&Connection, u64) -> Result<u64, TokenStoreError>;

/// Makes room for one row in `table`, purging its expired rows when the rules say so. A
/// refusal after the purge commits the purge (the memory store keeps it too).
fn make_room(
    tx: Transaction<'_>,
    table: Table,
    max: u64,
    now_ms: u64,
) -> Result<Transaction<'_>, TokenStoreError> {
    let (name, purge): (&str, Purge) = match table {
        Table::Revocations => ("token_revoked", purge_revocations),
        Table::OnceTokens => ("token_once", purge_once),
    };
    if rules::room(count(&tx, name)?, max, &mut Edges::new()) == Room::PurgeFirst {
        purge(&tx, now_ms)?;
        if let Err(full) = rules::after_purge(table, count(&tx, name)?, max) {
            tx.commit().map_err(backend)?;
            return Err(full);
        }
    }
    Ok(tx)
}

impl SqliteTokenStore {
    /// Open (creating if needed) the store in the database file at `path`.
    pub fn open(path: &Path, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Self::init(
            crate::db::open_private(path).map_err(TokenStoreError::Backend)?,
            limits,
        )
    }

    /// A private in-memory database (tests).
    pub fn open_in_memory(limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        Self::init(Connection::open_in_memory().map_err(backend)?, limits)
    }

    fn init(conn: Connection, limits: TokenStoreLimits) -> Result<Self, TokenStoreError> {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(backend)?;
        // The token service and the one-time-token writer each hold a connection to the file.
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(backend)?;
        conn.execute_batch(SCHEMA).map_err(backend)?;
        Ok(Self { conn, limits })
    }

    fn begin(&mut self) -> Result<Transaction<'_>, TokenStoreError> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)
    }
}

impl TokenStore for SqliteTokenStore {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        let max = self.limits.revocations_max;
        let tx = self.begin()?;
        let existing: Option<i64> = tx
            .query_row(
                "SELECT keep_until_ms FROM token_revoked WHERE jti = ?1",
                params![jti],
                |r| r.get(0),
            )
            .optional()
            .map_err(backend)?;
        let existing = existing
            .map(|ms| ms_from_sql(ms, "keep_until_ms"))
            .transpose()?;
        let horizon_ms = forgotten_until(&tx, "token_revoked")?;
        let step = rules::revoke(existing, keep_until_ms, now_ms, horizon_ms);
        let tx = match step {
            RevokeStep::NotNeeded => return Ok(step.outcome()),
            RevokeStep::Raise { keep_until_ms } => {
                tx.execute(
                    "UPDATE token_revoked SET keep_until_ms = ?2 WHERE jti = ?1",
                    params![jti, ms_to_sql(keep_until_ms)],
                )
                .map_err(backend)?;
                tx
            }
            RevokeStep::Insert { keep_until_ms } => {
                let tx = make_room(tx, Table::Revocations, max, now_ms)?;
                tx.execute(
                    "INSERT INTO token_revoked (jti, keep_until_ms) VALUES (?1, ?2)",
                    params![jti, ms_to_sql(keep_until_ms)],
                )
                .map_err(backend)?;
                tx
            }
        };
        tx.commit().map_err(backend)?;
        Ok(step.outcome())
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        self.conn
            .query_row(
                "SELECT 1 FROM token_revoked WHERE jti = ?1",
                params![jti],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
            .map_err(backend)
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT jti FROM token_revoked ORDER BY jti")
            .map_err(backend)?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(backend)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(backend)
    }

    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        let max = self.limits.once_tokens_max;
        let tx = self.begin()?;
        let existing = read_once_by_key(&tx, &grant.key)?;
        let taken = read_once(&tx, grant.token)?.is_some();
        let existing = existing.as_ref().map(|(token, row)| (*token, row));
        let horizon_ms = forgotten_until(&tx, "token_once")?;
        let (row, answer) = match rules::issue_once(
            existing,
            taken,
            grant,
            now_ms,
            horizon_ms,
            &mut Edges::new(),
        )? {
            IssueStep::Existing(answer) => {
                tx.commit().map_err(backend)?;
                return Ok(answer);
            }
            IssueStep::Insert { row, answer } => (row, answer),
        };
        let tx = make_room(tx, Table::OnceTokens, max, now_ms)?;
        tx.execute(
            "INSERT INTO token_once (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
            params![
                answer.token.to_string(),
                user_to_sql(row.key.user),
                row.key.activity.as_str(),
                ms_to_sql(row.key.window_start_ms),
                ms_to_sql(row.expires_at_ms)
            ],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(answer)
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let tx = self.begin()?;
        let consume = rules::consume_once(
            read_once(&tx, token)?.as_ref(),
            user,
            now_ms,
            &mut Edges::new(),
        );
        if let Some(at) = consume.consumed_at_ms {
            // The one write that makes the acceptance: it must find the row still unconsumed.
            if !set_consumed(&tx, token, at, true)? {
                return Err(TokenStoreError::Backend(
                    "consume: the accepted token was consumed inside the transaction".to_owned(),
                ));
            }
        }
        tx.commit().map_err(backend)?;
        Ok(consume.verdict)
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        Ok(rules::judge(
            read_once(&self.conn, token)?.as_ref(),
            user,
            now_ms,
            &mut Edges::new(),
        ))
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        let tx = self.begin()?;
        let mark =
            rules::mark_once_consumed(read_once(&tx, token)?.as_ref(), now_ms, &mut Edges::new());
        if let Some(at) = mark {
            let marked = set_consumed(&tx, token, at, false)?;
            assert!(marked, "the row read in this transaction is there");
        }
        tx.commit().map_err(backend)?;
        Ok(mark.is_some())
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        let tx = self.begin()?;
        let counts = PurgeCounts {
            revocations: purge_revocations(&tx, now_ms)?,
            once_tokens: purge_once(&tx, now_ms)?,
        };
        tx.commit().map_err(backend)?;
        Ok(counts)
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        Ok(Forgotten {
            revocations_until_ms: forgotten_until(&self.conn, "token_revoked")?,
            once_until_ms: forgotten_until(&self.conn, "token_once")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sut::token::rows::OnceGrant;

    fn grant(nonce: u128) -> OnceGrant {
        OnceGrant {
            key: OnceKey {
                user: UserId(u64::MAX),
                activity: ActivityKey::new("A2024").unwrap(),
                window_start_ms: 0,
            },
            token: OnceToken(nonce),
            expires_at_ms: 3_600_000,
        }
    }

    #[test]
    fn file_store_runs_in_wal_mode_with_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            SqliteTokenStore::open(&dir.path().join("t.db"), TokenStoreLimits::default()).unwrap();
        let mode: String = s
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let sync: i64 = s
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
    }

    #[test]
    fn concurrent_consumers_on_separate_connections_accept_exactly_once() {
        // Real threads and connections racing on one file: the single conditional UPDATE must
        // let exactly one through. (Threads appear only in this test, never in protocol code.)
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("race.db");
        let limits = TokenStoreLimits::default();
        let mut setup = SqliteTokenStore::open(&path, limits).unwrap();
        for round in 0..5u128 {
            let issued = setup
                .issue_once(
                    &OnceGrant {
                        key: OnceKey {
                            window_start_ms: round as u64 * 10,
                            ..grant(0).key
                        },
                        ..grant(round + 1)
                    },
                    0,
                )
                .unwrap();
            assert!(issued.fresh);
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut s = SqliteTokenStore::open(&path, limits).unwrap();
                        barrier.wait();
                        s.consume_once(issued.token, UserId(u64::MAX), 1).unwrap()
                    })
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(
                results.iter().filter(|r| r.is_ok()).count(),
                1,
                "{results:?}"
            );
            assert!(
                results
                    .iter()
                    .filter(|r| r.is_err())
                    .all(|r| *r == Err(OnceRejection::AlreadyConsumed))
            );
        }
    }

    #[test]
    fn large_user_ids_round_trip() {
        let mut s = SqliteTokenStore::open_in_memory(TokenStoreLimits::default()).unwrap();
        let issued = s.issue_once(&grant(9), 0).unwrap();
        assert_eq!(
            s.consume_once(issued.token, UserId(u64::MAX), 1)
                .unwrap()
                .unwrap()
                .user,
            UserId(u64::MAX)
        );
    }
}

#[cfg(test)]
pub(crate) mod conformance;
#[cfg(test)]
mod service;
