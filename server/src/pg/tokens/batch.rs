//! A batch of one-time token operations in a few round trips instead of a few per operation.
//!
//! [`PgTokenStore::batch_once`] reads, in two statements, every row the batch's operations will
//! look at (by token and by key, from the caller's hints) and the table's row counter; the
//! operations then run against that snapshot, through the same rules of `sut::token::rules` as
//! every other store, and their writes are kept; at the end the inserts go out as one statement
//! and the consumes as another. All of it is one SERIALIZABLE transaction, so what the snapshot
//! read is what the writes were decided on, and the consumes keep their guard: the bulk
//! `UPDATE … WHERE consumed_at_ms IS NULL` must change exactly the rows the rules accepted, or
//! the batch fails and nothing commits.
//!
//! Anything the hints did not name is read on demand; any other operation (revocations, purges,
//! the flawed two-step consume) first writes out what is kept, forgets the snapshot, and runs as
//! in [`PgTokenStore`]'s own methods.

use std::cell::RefCell;
use std::collections::HashMap;

use sut::edge::Edges;
use sut::token::UserId;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};

use super::{
    ActivityKey, PgTokenStore, Tx, check_once_in, column, corrupt, counter, forgotten_in, get_u64,
    is_revoked_in, make_room_counted, mark_once_consumed_in, once_row, purge_expired_in,
    purge_once, read_once, revoke_in, revoked_jtis_in, to_sql, user_from_sql, user_to_sql,
};

/// What a batch will look at, as far as the caller knows.
#[derive(Clone, Debug, Default)]
pub struct OnceHints {
    /// Token values the batch issues or consumes.
    pub tokens: Vec<OnceToken>,
    /// Keys the batch issues for.
    pub keys: Vec<OnceKey>,
}

impl PgTokenStore {
    /// Runs `ops` against a store whose every operation happens inside **one** serializable
    /// transaction, committed when `ops` returns `Ok` (group commit: one WAL flush for the lot),
    /// the one-time token operations served from a snapshot read up front (see the module
    /// documentation). A serialization failure rolls all of it back and runs `ops` again from
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
        self.transact(|tx| {
            let mut view = OnceView::read(tx, limits, hints)?;
            ops(&mut view)?;
            view.write_out()
        })
    }
}

/// The snapshot and the writes kept.
struct OnceView<'t, 'c> {
    tx: RefCell<&'t mut Tx<'c>>,
    limits: TokenStoreLimits,
    /// Rows by token; `None`: known absent.
    by_token: HashMap<OnceToken, Option<OnceRow>>,
    /// Token by key; `None`: known absent.
    by_key: HashMap<OnceKey, Option<OnceToken>>,
    /// Rows in `tok_once`, counting the inserts kept, and the table's horizon.
    counter: Option<(u64, u64)>,
    inserts: Vec<(OnceToken, OnceRow)>,
    /// Accepted consumes: token and time.
    consumes: Vec<(OnceToken, u64)>,
}

impl<'t, 'c> OnceView<'t, 'c> {
    fn read(
        tx: &'t mut Tx<'c>,
        limits: TokenStoreLimits,
        hints: &OnceHints,
    ) -> Result<Self, TokenStoreError> {
        let counter = counter(tx, Table::OnceTokens)?;
        let mut view = Self {
            tx: RefCell::new(tx),
            limits,
            by_token: hints.tokens.iter().map(|t| (*t, None)).collect(),
            by_key: hints.keys.iter().map(|k| (k.clone(), None)).collect(),
            counter: Some(counter),
            inserts: Vec::new(),
            consumes: Vec::new(),
        };
        view.prefetch(hints)?;
        Ok(view)
    }

    /// Reads every row named by a hint (absent ones stay known absent).
    fn prefetch(&mut self, hints: &OnceHints) -> Result<(), TokenStoreError> {
        if hints.tokens.is_empty() && hints.keys.is_empty() {
            return Ok(());
        }
        let tokens: Vec<String> = hints.tokens.iter().map(ToString::to_string).collect();
        let users: Vec<i64> = hints.keys.iter().map(|k| user_to_sql(k.user)).collect();
        let activities: Vec<&str> = hints.keys.iter().map(|k| k.activity.as_str()).collect();
        let windows: Vec<i64> = hints
            .keys
            .iter()
            .map(|k| to_sql(k.window_start_ms))
            .collect();
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
        let found = self
            .tx
            .get_mut()
            .query(sql, &[&tokens, &users, &activities, &windows])?;
        for row in &found {
            let token = OnceToken::parse(&column::<String>(row, 0, "token")?)
                .ok_or_else(|| corrupt("one-time token text"))?;
            let key = OnceKey {
                user: user_from_sql(column(row, 1, "user_id")?),
                activity: ActivityKey::new(column::<String>(row, 2, "activity")?)
                    .ok_or_else(|| corrupt("activity id"))?,
                window_start_ms: get_u64(row, 3, "window_start_ms")?,
            };
            let once = once_row(key.clone(), row, 4)?;
            self.by_key.insert(key, Some(token));
            self.by_token.insert(token, Some(once));
        }
        Ok(())
    }

    /// The row of `token`, from the snapshot or read now.
    fn row(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
        if let Some(known) = self.by_token.get(&token) {
            return Ok(known.clone());
        }
        let row = read_once(self.tx.get_mut(), token)?;
        self.by_token.insert(token, row.clone());
        Ok(row)
    }

    /// The token and row of `key`, from the snapshot or read now.
    fn keyed(&mut self, key: &OnceKey) -> Result<Option<(OnceToken, OnceRow)>, TokenStoreError> {
        let token = match self.by_key.get(key) {
            Some(None) => return Ok(None),
            Some(Some(token)) => *token,
            None => {
                let sql = "SELECT token FROM tok_once \
                           WHERE user_id = $1 AND activity = $2 AND window_start_ms = $3";
                let params = [
                    &user_to_sql(key.user) as super::Param<'_>,
                    &key.activity.as_str(),
                    &to_sql(key.window_start_ms),
                ];
                let found = self.tx.get_mut().query_opt(sql, &params)?;
                let Some(found) = found else {
                    self.by_key.insert(key.clone(), None);
                    return Ok(None);
                };
                let token = OnceToken::parse(&column::<String>(&found, 0, "token")?)
                    .ok_or_else(|| corrupt("one-time token text"))?;
                self.by_key.insert(key.clone(), Some(token));
                token
            }
        };
        let row = self
            .row(token)?
            .ok_or_else(|| corrupt("a key's token has no row"))?;
        Ok(Some((token, row)))
    }

    /// Writes out what is kept and forgets the snapshot (before an operation it does not serve).
    fn settle(&mut self) -> Result<(), TokenStoreError> {
        self.write_out()?;
        self.by_token.clear();
        self.by_key.clear();
        self.counter = None;
        Ok(())
    }

    /// The kept inserts in one statement (with their count), then the kept consumes in one.
    fn write_out(&mut self) -> Result<(), TokenStoreError> {
        let tx = self.tx.get_mut();
        if !self.inserts.is_empty() {
            let inserts = std::mem::take(&mut self.inserts);
            let tokens: Vec<String> = inserts.iter().map(|(t, _)| t.to_string()).collect();
            let users: Vec<i64> = inserts
                .iter()
                .map(|(_, r)| user_to_sql(r.key.user))
                .collect();
            let activities: Vec<&str> = inserts
                .iter()
                .map(|(_, r)| r.key.activity.as_str())
                .collect();
            let windows: Vec<i64> = inserts
                .iter()
                .map(|(_, r)| to_sql(r.key.window_start_ms))
                .collect();
            let expiries: Vec<i64> = inserts
                .iter()
                .map(|(_, r)| to_sql(r.expires_at_ms))
                .collect();
            let sql = "WITH inserted AS ( \
                         INSERT INTO tok_once \
                         (token, user_id, activity, window_start_ms, expires_at_ms, consumed_at_ms) \
                         SELECT t, u, a, w, e, NULL FROM unnest($1::text[], $2::bigint[], \
                                $3::text[], $4::bigint[], $5::bigint[]) AS x(t, u, a, w, e) \
                         RETURNING 1) \
                       UPDATE tok_rows SET n = n + (SELECT COUNT(*) FROM inserted) \
                       WHERE tbl = 'tok_once'";
            let counted = tx.execute(sql, &[&tokens, &users, &activities, &windows, &expiries])?;
            assert_eq!(counted, 1, "the schema creates every counter row");
        }
        if !self.consumes.is_empty() {
            let consumes = std::mem::take(&mut self.consumes);
            let tokens: Vec<String> = consumes.iter().map(|(t, _)| t.to_string()).collect();
            let times: Vec<i64> = consumes.iter().map(|(_, at)| to_sql(*at)).collect();
            // Each accepted consume must still find its row unconsumed.
            let sql = "UPDATE tok_once SET consumed_at_ms = x.at \
                       FROM unnest($1::text[], $2::bigint[]) AS x(token, at) \
                       WHERE tok_once.token = x.token AND tok_once.consumed_at_ms IS NULL";
            let changed = tx.execute(sql, &[&tokens, &times])?;
            if changed != consumes.len() as u64 {
                return Err(TokenStoreError::Backend(format!(
                    "consume: {changed} of {} accepted tokens were still unconsumed",
                    consumes.len()
                )));
            }
        }
        Ok(())
    }

    /// Rows in `tok_once`, counting the kept inserts, and the table's horizon.
    fn counter(&mut self) -> Result<(u64, u64), TokenStoreError> {
        if let Some(counter) = self.counter {
            return Ok(counter);
        }
        let counter = counter(self.tx.get_mut(), Table::OnceTokens)?;
        self.counter = Some(counter);
        Ok(counter)
    }
}

impl TokenStore for OnceView<'_, '_> {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        self.settle()?;
        let max = self.limits.revocations_max;
        revoke_in(self.tx.get_mut(), max, jti, keep_until_ms, now_ms)?
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        // Revocations are never kept here: the table is as the transaction sees it.
        is_revoked_in(&mut self.tx.borrow_mut(), jti)
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        revoked_jtis_in(&mut self.tx.borrow_mut())
    }

    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        let existing = self.keyed(&grant.key)?;
        let taken = self.row(grant.token)?.is_some();
        let existing_ref = existing.as_ref().map(|(token, row)| (*token, row));
        let (_, horizon_ms) = self.counter()?;
        let (row, answer) = match rules::issue_once(
            existing_ref,
            taken,
            grant,
            now_ms,
            horizon_ms,
            &mut Edges::new(),
        )? {
            IssueStep::Existing(answer) => return Ok(answer),
            IssueStep::Insert { row, answer } => (row, answer),
        };
        let max = self.limits.once_tokens_max;
        if rules::room(self.counter()?.0, max, &mut Edges::new()) == Room::PurgeFirst {
            // Rare: the table is full. Purge in the transaction, then decide as the others do.
            self.settle()?;
            let (rows, _) = self.counter()?;
            let tx = self.tx.get_mut();
            let made = make_room_counted(tx, Table::OnceTokens, max, now_ms, rows, purge_once)?;
            self.settle()?;
            made?;
        }
        self.by_key.insert(row.key.clone(), Some(answer.token));
        self.by_token.insert(answer.token, Some(row.clone()));
        let (rows, horizon_ms) = self.counter()?;
        self.counter = Some((rows + 1, horizon_ms));
        self.inserts.push((answer.token, row));
        Ok(answer)
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let mut row = self.row(token)?;
        let consume = rules::consume_once(row.as_ref(), user, now_ms, &mut Edges::new());
        if let (Some(at), Some(r)) = (consume.consumed_at_ms, row.as_mut()) {
            r.consumed_at_ms = Some(at);
            self.by_token.insert(token, row);
            self.consumes.push((token, at));
        }
        Ok(consume.verdict)
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        if let Some(known) = self.by_token.get(&token) {
            return Ok(rules::judge(
                known.as_ref(),
                user,
                now_ms,
                &mut Edges::new(),
            ));
        }
        check_once_in(&mut self.tx.borrow_mut(), token, user, now_ms)
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        self.settle()?;
        mark_once_consumed_in(self.tx.get_mut(), token, now_ms)
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        self.settle()?;
        purge_expired_in(self.tx.get_mut(), now_ms)
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        // The one-time table's horizon only rises by a purge, which settles the view first.
        forgotten_in(&mut self.tx.borrow_mut())
    }
}
