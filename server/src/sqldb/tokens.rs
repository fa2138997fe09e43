//! The token store on a database server, written once for PostgreSQL and MariaDB: the twin of
//! [`SqliteTokenStore`](crate::sqlite::SqliteTokenStore).
//!
//! Each trait method is one SERIALIZABLE transaction ([`SqlConn::transact`], retried after a
//! serialization failure or deadlock): it reads the rows the rules of [`sut::token::rules`]
//! name, calls the rule, and writes what the rule returns, as the memory and SQLite stores do.
//! The one-time consume writes its acceptance with the same conditional statement as the SQLite
//! store,
//!
//! ```sql
//! UPDATE tok_once SET consumed_at_ms = ? WHERE token = ? AND consumed_at_ms IS NULL
//! ```
//!
//! and two servers consuming one token at once cannot both get through: the later transaction is
//! rolled back, retried, and then reads the token consumed.
//!
//! [`SqlTokenStore::batch_once`] runs many operations in one transaction, each decided by the
//! same rules on rows read up front for the whole batch ([`super::once_view`]): the server's
//! one-time-token writer uses it for group commit (one log flush per batch instead of one per
//! token). The table limits count rows with a counter per table (`tok_rows`), kept in the same
//! transaction as every insert and purge, instead of a `COUNT(*)` per insert (which would read
//! the whole table, and make every two inserts conflict).
//!
//! What differs between the servers is only how a row is read or written ([`TokenRows`]).

use std::sync::{Mutex, PoisonError};

use sut::edge::Edges;
use sut::token::UserId;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, RevokeStep, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};

use super::SqlConn;
use super::once_view::{OnceHints, run_batch};

/// An answer to return after committing: a `Full` refusal keeps the purge made before it.
pub(crate) type Committed<T> = Result<T, TokenStoreError>;

/// A user id as stored: bit for bit in a `BIGINT` (compared only for equality).
pub(crate) const fn user_to_sql(user: UserId) -> i64 {
    i64::from_ne_bytes(user.0.to_ne_bytes())
}

/// A user id read back.
pub(crate) const fn user_from_sql(v: i64) -> UserId {
    UserId(u64::from_ne_bytes(v.to_ne_bytes()))
}

/// A corrupt row, named.
pub(crate) fn corrupt(what: &str) -> TokenStoreError {
    TokenStoreError::Backend(format!("corrupt row: bad {what}"))
}

/// The name of `table`, as `tok_rows` and the SQL know it.
pub(crate) const fn table_name(table: Table) -> &'static str {
    match table {
        Table::Revocations => "tok_revoked",
        Table::OnceTokens => "tok_once",
    }
}

/// The column of `table` a row expires by.
pub(crate) const fn expiry_column(table: Table) -> &'static str {
    match table {
        Table::Revocations => "keep_until_ms",
        Table::OnceTokens => "expires_at_ms",
    }
}

/// A token's text read back.
pub(crate) fn token_text(text: &str) -> Result<OnceToken, TokenStoreError> {
    OnceToken::parse(text).ok_or_else(|| corrupt("one-time token text"))
}

/// What issuing one grant depends on: the token and row of its key, whether its token value is
/// taken, how many rows `tok_once` holds and its horizon.
#[derive(Debug)]
pub struct IssueReads {
    /// The token issued for the grant's key, and its row.
    pub existing: Option<(OnceToken, OnceRow)>,
    /// The grant's token value is another key's.
    pub taken: bool,
    /// Rows in `tok_once`.
    pub rows: u64,
    /// `tok_once`'s horizon.
    pub forgotten_until_ms: u64,
}

/// How the token store's rows are read and written in one server's transaction.
pub trait TokenRows {
    /// The rows `table` holds and its horizon ([`sut::token::Forgotten`]), both kept in
    /// `tok_rows`.
    fn counter(&mut self, table: Table) -> Result<(u64, u64), TokenStoreError>;
    /// Deletes the rows of `table` expired at `now_ms`: how many, and the latest expiry among
    /// them.
    fn delete_expired(
        &mut self,
        table: Table,
        now_ms: u64,
    ) -> Result<(u64, Option<u64>), TokenStoreError>;
    /// Lowers `table`'s counter by `deleted` and sets its horizon to `until_ms`.
    fn forget(&mut self, table: Table, deleted: u64, until_ms: u64) -> Result<(), TokenStoreError>;
    /// How long the revocation of `jti` is kept, if it is revoked.
    fn revocation(&mut self, jti: &str) -> Result<Option<u64>, TokenStoreError>;
    /// Keeps the revocation of `jti` until `keep_until_ms`.
    fn raise_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError>;
    /// Inserts the revocation of `jti`, counted.
    fn insert_revocation(&mut self, jti: &str, keep_until_ms: u64) -> Result<(), TokenStoreError>;
    /// Every revoked jti, in byte order.
    fn jtis(&mut self) -> Result<Vec<String>, TokenStoreError>;
    /// What issuing `grant` depends on (one round trip where the server allows).
    fn issue_reads(&mut self, grant: &OnceGrant) -> Result<IssueReads, TokenStoreError>;
    /// The row of one-time token `token`, if stored.
    fn read_once(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError>;
    /// Sets the consume time of `token`; `only_unconsumed` adds the condition that it was not
    /// consumed yet. Whether a row changed.
    fn set_consumed(
        &mut self,
        token: OnceToken,
        consumed_at_ms: u64,
        only_unconsumed: bool,
    ) -> Result<bool, TokenStoreError>;
    /// Inserts one-time token `token`'s row, counted.
    fn insert_once(&mut self, token: OnceToken, row: &OnceRow) -> Result<(), TokenStoreError>;
    /// Every row whose token is one of `tokens` or whose key is one of `keys`.
    fn read_named(
        &mut self,
        tokens: &[OnceToken],
        keys: &[OnceKey],
    ) -> Result<Vec<(OnceToken, OnceRow)>, TokenStoreError>;
    /// The token of `key`, if one was issued.
    fn token_of(&mut self, key: &OnceKey) -> Result<Option<OnceToken>, TokenStoreError>;
    /// Inserts `rows` (new one-time tokens), counted.
    fn insert_all(&mut self, rows: &[(OnceToken, OnceRow)]) -> Result<(), TokenStoreError>;
    /// Sets the consume time of each token that is still unconsumed; how many it set.
    fn consume_all(&mut self, consumes: &[(OnceToken, u64)]) -> Result<u64, TokenStoreError>;
}

/// The token store on a database server whose connection is `C`: one connection, used by one
/// operation (or one [`batch_once`](SqlTokenStore::batch_once)) at a time.
#[derive(Debug)]
pub struct SqlTokenStore<C> {
    conn: Mutex<C>,
    limits: TokenStoreLimits,
}

impl<C: SqlConn> SqlTokenStore<C> {
    /// The store on `conn`, whose schema exists.
    pub(crate) const fn on(conn: C, limits: TokenStoreLimits) -> Self {
        Self {
            conn: Mutex::new(conn),
            limits,
        }
    }

    /// Runs `op` as one serializable transaction (retried whole after a conflict).
    fn transact<T>(
        &self,
        mut op: impl FnMut(&mut C::Tx<'_>) -> Result<T, TokenStoreError>,
    ) -> Result<T, TokenStoreError> {
        // A panic mid-operation left no transaction to commit: the connection rolls back (or
        // gives up) an attempt that did not end.
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.transact(|tx| op(tx))
    }

    /// Runs `ops` against a store whose every operation happens inside **one** serializable
    /// transaction, committed when `ops` returns `Ok` (group commit: one log flush for the lot),
    /// the one-time token operations served from a snapshot read up front (see
    /// [`super::once_view`]). A conflict rolls all of it back and runs `ops` again from the
    /// start, so `ops` must start from scratch on every call and nothing it computed may leave
    /// before this returns `Ok`.
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

/// Deletes the expired rows of `table`; then lowers its counter by as many and raises its
/// horizon to the latest of them ([`rules::forget_until`]), in the caller's transaction; how
/// many.
pub(crate) fn purge<R: TokenRows>(
    tx: &mut R,
    table: Table,
    now_ms: u64,
) -> Result<u64, TokenStoreError> {
    let (deleted, latest_ms) = tx.delete_expired(table, now_ms)?;
    let (_, until_ms) = tx.counter(table)?;
    tx.forget(table, deleted, rules::forget_until(until_ms, latest_ms))?;
    Ok(deleted)
}

/// Makes room for one row in `table`, which holds `rows`, purging its expired rows when the
/// rules say so. `Ok(Err)` is the refusal after the purge, to be committed with it (the memory
/// store keeps it too).
pub(crate) fn make_room<R: TokenRows>(
    tx: &mut R,
    table: Table,
    max: u64,
    now_ms: u64,
    rows: u64,
) -> Result<Committed<()>, TokenStoreError> {
    if rules::room(rows, max, &mut Edges::new()) == Room::PurgeFirst {
        purge(tx, table, now_ms)?;
        return Ok(rules::after_purge(table, tx.counter(table)?.0, max));
    }
    Ok(Ok(()))
}

/// [`TokenStore::revoke`] in `tx`.
pub(crate) fn revoke<R: TokenRows>(
    tx: &mut R,
    max: u64,
    jti: &str,
    keep_until_ms: u64,
    now_ms: u64,
) -> Result<Committed<RevokeOutcome>, TokenStoreError> {
    let existing = tx.revocation(jti)?;
    let (rows, horizon_ms) = tx.counter(Table::Revocations)?;
    let step = rules::revoke(existing, keep_until_ms, now_ms, horizon_ms);
    match step {
        RevokeStep::NotNeeded => {}
        RevokeStep::Raise { keep_until_ms } => tx.raise_revocation(jti, keep_until_ms)?,
        RevokeStep::Insert { keep_until_ms } => {
            if let Err(full) = make_room(tx, Table::Revocations, max, now_ms, rows)? {
                return Ok(Err(full));
            }
            tx.insert_revocation(jti, keep_until_ms)?;
        }
    }
    Ok(Ok(step.outcome()))
}

/// [`TokenStore::issue_once`] in `tx`.
fn issue_once<R: TokenRows>(
    tx: &mut R,
    max: u64,
    grant: &OnceGrant,
    now_ms: u64,
) -> Result<Committed<OnceIssue>, TokenStoreError> {
    let reads = tx.issue_reads(grant)?;
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
    tx.insert_once(answer.token, &row)?;
    Ok(Ok(answer))
}

/// [`TokenStore::consume_once`] in `tx`.
fn consume_once<R: TokenRows>(
    tx: &mut R,
    token: OnceToken,
    user: UserId,
    now_ms: u64,
) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
    let row = tx.read_once(token)?;
    let consume = rules::consume_once(row.as_ref(), user, now_ms, &mut Edges::new());
    if let Some(at) = consume.consumed_at_ms {
        // The one write that makes the acceptance: it must find the row still unconsumed.
        if !tx.set_consumed(token, at, true)? {
            return Err(TokenStoreError::Backend(
                "consume: the accepted token was consumed inside the transaction".to_owned(),
            ));
        }
    }
    Ok(consume.verdict)
}

/// [`TokenStore::check_once`] in `tx`.
pub(crate) fn check_once<R: TokenRows>(
    tx: &mut R,
    token: OnceToken,
    user: UserId,
    now_ms: u64,
) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
    let row = tx.read_once(token)?;
    Ok(rules::judge(row.as_ref(), user, now_ms, &mut Edges::new()))
}

/// [`TokenStore::mark_once_consumed`] in `tx`.
pub(crate) fn mark_once_consumed<R: TokenRows>(
    tx: &mut R,
    token: OnceToken,
    now_ms: u64,
) -> Result<bool, TokenStoreError> {
    let row = tx.read_once(token)?;
    let mark = rules::mark_once_consumed(row.as_ref(), now_ms, &mut Edges::new());
    if let Some(at) = mark {
        let marked = tx.set_consumed(token, at, false)?;
        assert!(marked, "the row read in this transaction is there");
    }
    Ok(mark.is_some())
}

/// [`TokenStore::purge_expired`] in `tx`.
pub(crate) fn purge_expired<R: TokenRows>(
    tx: &mut R,
    now_ms: u64,
) -> Result<PurgeCounts, TokenStoreError> {
    Ok(PurgeCounts {
        revocations: purge(tx, Table::Revocations, now_ms)?,
        once_tokens: purge(tx, Table::OnceTokens, now_ms)?,
    })
}

/// [`TokenStore::forgotten`] in `tx`.
pub(crate) fn forgotten<R: TokenRows>(tx: &mut R) -> Result<Forgotten, TokenStoreError> {
    Ok(Forgotten {
        revocations_until_ms: tx.counter(Table::Revocations)?.1,
        once_until_ms: tx.counter(Table::OnceTokens)?.1,
    })
}

impl<C: SqlConn> TokenStore for SqlTokenStore<C> {
    /// Its own transaction, committed even when the answer is a refusal (`Full`): the purge
    /// made to find room stays, as in the memory store.
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        let max = self.limits.revocations_max;
        self.transact(|tx| revoke(tx, max, jti, keep_until_ms, now_ms))?
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        self.transact(|tx| Ok(tx.revocation(jti)?.is_some()))
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        self.transact(|tx| tx.jtis())
    }

    /// Committed even when refused, as [`TokenStore::revoke`].
    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        let max = self.limits.once_tokens_max;
        self.transact(|tx| issue_once(tx, max, grant, now_ms))?
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        self.transact(|tx| consume_once(tx, token, user, now_ms))
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        self.transact(|tx| check_once(tx, token, user, now_ms))
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        self.transact(|tx| mark_once_consumed(tx, token, now_ms))
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        self.transact(|tx| purge_expired(tx, now_ms))
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        self.transact(|tx| forgotten(tx))
    }
}
