//! A batch of one-time token operations in a few round trips instead of a few per operation,
//! on any database server ([`TokenRows`]: PostgreSQL, MariaDB).
//!
//! `run_batch` reads, in one statement, every row the batch's operations will look at (by token
//! and by key, from the caller's hints) and the table's row counter; the operations then run
//! against that snapshot, through the same rules of `sut::token::rules` as every other store, and
//! their writes are kept; at the end the inserts go out as one statement and the consumes as
//! another. All of it is one SERIALIZABLE transaction, so what the snapshot read is what the
//! writes were decided on, and the consumes keep their guard: the bulk
//! `UPDATE … WHERE consumed_at_ms IS NULL` must change exactly the rows the rules accepted, or
//! the batch fails and nothing commits.
//!
//! Anything the hints did not name is read on demand; any other operation (revocations, purges,
//! the flawed two-step consume) first writes out what is kept, forgets the snapshot, and runs as
//! in the store's own methods ([`super::tokens`]).

use std::cell::RefCell;
use std::collections::HashMap;

use sut::edge::Edges;
use sut::token::UserId;
use sut::token::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use sut::token::rules::{self, IssueStep, OnceRow, Room};
use sut::token::store::{Forgotten, PurgeCounts, TokenStore, TokenStoreLimits};

use super::tokens::{
    TokenRows, check_once, forgotten, make_room, mark_once_consumed, purge_expired, revoke,
};

/// What a batch will look at, as far as the caller knows.
#[derive(Clone, Debug, Default)]
pub struct OnceHints {
    /// Token values the batch issues or consumes.
    pub tokens: Vec<OnceToken>,
    /// Keys the batch issues for.
    pub keys: Vec<OnceKey>,
}

/// Runs `ops` against a snapshot view of `tx` (see the module documentation), then writes out
/// what it kept.
///
/// # Errors
/// The first error `ops` returns, or a database failure: then nothing may be committed.
pub(crate) fn run_batch<T: TokenRows>(
    tx: &mut T,
    limits: TokenStoreLimits,
    hints: &OnceHints,
    ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
) -> Result<(), TokenStoreError> {
    let mut view = OnceView::read(tx, limits, hints)?;
    ops(&mut view)?;
    view.write_out()
}

/// The snapshot and the writes kept.
struct OnceView<'t, T: TokenRows> {
    tx: RefCell<&'t mut T>,
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

impl<'t, T: TokenRows> OnceView<'t, T> {
    fn read(
        tx: &'t mut T,
        limits: TokenStoreLimits,
        hints: &OnceHints,
    ) -> Result<Self, TokenStoreError> {
        let counter = tx.counter(Table::OnceTokens)?;
        let mut view = Self {
            tx: RefCell::new(tx),
            limits,
            by_token: hints.tokens.iter().map(|t| (*t, None)).collect(),
            by_key: hints.keys.iter().map(|k| (k.clone(), None)).collect(),
            counter: Some(counter),
            inserts: Vec::new(),
            consumes: Vec::new(),
        };
        if !hints.tokens.is_empty() || !hints.keys.is_empty() {
            // Every row named by a hint; absent ones stay known absent.
            for (token, row) in view.tx.get_mut().read_named(&hints.tokens, &hints.keys)? {
                view.by_key.insert(row.key.clone(), Some(token));
                view.by_token.insert(token, Some(row));
            }
        }
        Ok(view)
    }

    /// The row of `token`, from the snapshot or read now.
    fn row(&mut self, token: OnceToken) -> Result<Option<OnceRow>, TokenStoreError> {
        if let Some(known) = self.by_token.get(&token) {
            return Ok(known.clone());
        }
        let row = self.tx.get_mut().read_once(token)?;
        self.by_token.insert(token, row.clone());
        Ok(row)
    }

    /// The token and row of `key`, from the snapshot or read now.
    fn keyed(&mut self, key: &OnceKey) -> Result<Option<(OnceToken, OnceRow)>, TokenStoreError> {
        let token = match self.by_key.get(key) {
            Some(None) => return Ok(None),
            Some(Some(token)) => *token,
            None => {
                let found = self.tx.get_mut().token_of(key)?;
                self.by_key.insert(key.clone(), found);
                let Some(token) = found else {
                    return Ok(None);
                };
                token
            }
        };
        let row = self.row(token)?.ok_or_else(|| {
            TokenStoreError::Backend("corrupt row: a key's token has no row".into())
        })?;
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
            tx.insert_all(&std::mem::take(&mut self.inserts))?;
        }
        if !self.consumes.is_empty() {
            let consumes = std::mem::take(&mut self.consumes);
            // Each accepted consume must still find its row unconsumed.
            let changed = tx.consume_all(&consumes)?;
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
        let counter = self.tx.get_mut().counter(Table::OnceTokens)?;
        self.counter = Some(counter);
        Ok(counter)
    }
}

impl<T: TokenRows> TokenStore for OnceView<'_, T> {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        self.settle()?;
        let max = self.limits.revocations_max;
        revoke(*self.tx.get_mut(), max, jti, keep_until_ms, now_ms)?
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        // Revocations are never kept here: the table is as the transaction sees it.
        Ok(self.tx.borrow_mut().revocation(jti)?.is_some())
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        self.tx.borrow_mut().jtis()
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
            let made = make_room(*self.tx.get_mut(), Table::OnceTokens, max, now_ms, rows)?;
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
        check_once(*self.tx.get_mut(), token, user, now_ms)
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        self.settle()?;
        mark_once_consumed(*self.tx.get_mut(), token, now_ms)
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        self.settle()?;
        purge_expired(*self.tx.get_mut(), now_ms)
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        // The one-time table's horizon only rises by a purge, which settles the view first.
        forgotten(*self.tx.borrow_mut())
    }
}
