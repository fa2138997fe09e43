//! The token store: the exact revocation set and the one-time tokens, at the level of domain
//! operations (docs/architecture.md, "The state machines"), with the in-memory
//! implementation.
//!
//! The operations are exactly what the protocols need, each one atomic:
//!
//! - [`revoke`](TokenStore::revoke) / [`is_revoked`](TokenStore::is_revoked) /
//!   [`revoked_jtis`](TokenStore::revoked_jtis): the exact set behind the Bloom filter (the ID,
//!   token and lottery design §3.1, "Redis精确库"). A revocation is kept until `keep_until_ms`
//!   (the token's `exp` plus the verifier's leeway): after that the token fails verification on
//!   its own.
//! - [`issue_once`](TokenStore::issue_once) / [`consume_once`](TokenStore::consume_once): the
//!   design's §3.3 one-time tokens; consume is **one** conditional update.
//! - [`check_once`](TokenStore::check_once) / [`mark_once_consumed`](TokenStore::mark_once_consumed):
//!   the two halves of the documented flaw (check then delete), used only when
//!   [`TokenFlaws::once_check_then_delete`](super::TokenFlaws) is on.
//! - [`purge_expired`](TokenStore::purge_expired): forget what can no longer matter.
//! - [`forgotten`](TokenStore::forgotten): up to when each table has forgotten rows
//!   ([`Forgotten`]). A purge decides "expired" by the clock reading it is given; a clock that
//!   later steps back below that reading must not find the purged rows' absence meaningful.
//!   Each table therefore remembers, durably and in the purge's own transaction, the latest
//!   expiry among the rows it deleted; a one-time window ending by then is refused
//!   ([`TokenStoreError::WindowOver`]), a revocation kept until then is not needed, and the
//!   verifier refuses a JWT valid only until then
//!   ([`Rejection::Forgotten`](super::jwt::Rejection::Forgotten)).
//!
//! Both tables are bounded ([`TokenStoreLimits`]): when full, expired rows are purged first,
//! and if it is still full the write is refused with [`TokenStoreError::Full`] — never by
//! forgetting a live revocation, which would let a revoked token through.
//!
//! [`MemoryTokenStore`] and `sut-server`'s `SqliteTokenStore` both read rows and persist what
//! the pure rules of [`super::rules`] decide, and are kept identical by the conformance
//! property test beside the latter.

use super::UserId;
use super::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};
use super::rules::{self, IssueStep, OnceRow, RevokeStep, Room};
use crate::edge::{Edges, Observed};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod invariants;

/// Size bounds of a token store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenStoreLimits {
    /// Most revocations remembered at once (also the Bloom filter's design capacity).
    pub revocations_max: u64,
    /// Most one-time tokens stored at once.
    pub once_tokens_max: u64,
}

impl Default for TokenStoreLimits {
    fn default() -> Self {
        // ID, token and lottery design §3.1: "capacity=100000 # 预估最大注销令牌数".
        Self {
            revocations_max: 100_000,
            once_tokens_max: 1_000_000,
        }
    }
}

/// Rows removed by [`TokenStore::purge_expired`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PurgeCounts {
    /// Revocations whose `keep_until_ms <= now_ms`.
    pub revocations: u64,
    /// One-time tokens whose `expires_at_ms <= now_ms` (consumed or not).
    pub once_tokens: u64,
}

/// Up to when each table has forgotten rows: the latest expiry among the rows ever purged from
/// it (0: none yet). Only ever rises; every row a table holds expires after its horizon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Forgotten {
    /// The latest `keep_until_ms` among purged revocations.
    pub revocations_until_ms: u64,
    /// The latest `expires_at_ms` among purged one-time tokens.
    pub once_until_ms: u64,
}

/// Domain operations on token state. Every method is atomic; times are the caller's wall clock
/// in ms (the store reads no clock).
pub trait TokenStore {
    /// Remember that `jti` is revoked until `keep_until_ms`. If `keep_until_ms <= now_ms` nothing
    /// is stored ([`RevokeOutcome::NotNeeded`]). When the table is full, rows with
    /// `keep_until_ms <= now_ms` are purged first; if it is still full, [`TokenStoreError::Full`].
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError>;

    /// Whether `jti` is in the revocation set (purging, not time, removes rows).
    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError>;

    /// Every remembered jti, in byte order (to rebuild a Bloom filter).
    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError>;

    /// Store `grant` unless its key already has a token, and return the key's token. A key with
    /// a token returns it unchanged (`fresh: false`), whatever `grant.token` says. A new token
    /// value already used by another key is [`TokenStoreError::TokenCollision`]. When full,
    /// expired tokens are purged first, then [`TokenStoreError::Full`].
    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError>;

    /// In **one** atomic step: if `token` exists, belongs to `user`, is unconsumed and
    /// `now_ms < expires_at_ms`, mark it consumed and return its key; otherwise change nothing
    /// and say why (precedence: unknown, foreign, already consumed, expired).
    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError>;

    /// The flaw's first half: what [`consume_once`](Self::consume_once) would answer, changing
    /// nothing.
    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError>;

    /// The flaw's second half: mark `token` consumed unconditionally; returns whether it existed.
    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError>;

    /// Delete revocations with `keep_until_ms <= now_ms` and one-time tokens with
    /// `expires_at_ms <= now_ms`, raising each table's [`Forgotten`] horizon to the latest expiry
    /// it deleted (as every purge does, the ones that make room included).
    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError>;

    /// Up to when each table has forgotten rows.
    fn forgotten(&self) -> Result<Forgotten, TokenStoreError>;
}

/// A boxed store is a store (the server picks SQLite or PostgreSQL at start-up).
impl<T: TokenStore + ?Sized> TokenStore for Box<T> {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        (**self).revoke(jti, keep_until_ms, now_ms)
    }
    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        (**self).is_revoked(jti)
    }
    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        (**self).revoked_jtis()
    }
    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        (**self).issue_once(grant, now_ms)
    }
    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        (**self).consume_once(token, user, now_ms)
    }
    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        (**self).check_once(token, user, now_ms)
    }
    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        (**self).mark_once_consumed(token, now_ms)
    }
    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        (**self).purge_expired(now_ms)
    }
    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        (**self).forgotten()
    }
}

/// The in-memory token store (simulator database node, models). Ordered collections only, so
/// it can be hashed and compared as state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemoryTokenStore {
    pub(crate) limits: TokenStoreLimits,
    pub(crate) revoked: BTreeMap<String, u64>,
    pub(crate) once_by_token: BTreeMap<OnceToken, OnceRow>,
    /// The index of the unique key: each key's token.
    pub(crate) once_by_key: BTreeMap<OnceKey, OnceToken>,
    pub(crate) forgotten: Forgotten,
    /// Arrivals at the rules' edge states since its driver last took them (a ghost).
    pub(crate) edges: Edges,
}

impl Observed for MemoryTokenStore {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
}

impl MemoryTokenStore {
    /// An empty store with these bounds.
    #[must_use]
    pub const fn new(limits: TokenStoreLimits) -> Self {
        Self {
            limits,
            revoked: BTreeMap::new(),
            once_by_token: BTreeMap::new(),
            once_by_key: BTreeMap::new(),
            forgotten: Forgotten {
                revocations_until_ms: 0,
                once_until_ms: 0,
            },
            edges: Edges::new(),
        }
    }

    fn purge_revocations(&mut self, now_ms: u64) -> u64 {
        let before = self.revoked.len();
        let mut latest_ms = None;
        self.revoked.retain(|_, keep_until_ms| {
            let expired = rules::revocation_expired(*keep_until_ms, now_ms);
            if expired {
                latest_ms = latest_ms.max(Some(*keep_until_ms));
            }
            !expired
        });
        let until_ms = &mut self.forgotten.revocations_until_ms;
        *until_ms = rules::forget_until(*until_ms, latest_ms);
        (before - self.revoked.len()) as u64
    }

    fn purge_once(&mut self, now_ms: u64) -> u64 {
        let before = self.once_by_token.len();
        let mut latest_ms = None;
        self.once_by_token.retain(|_, row| {
            let expired = rules::once_expired(row.expires_at_ms, now_ms);
            if expired {
                latest_ms = latest_ms.max(Some(row.expires_at_ms));
            }
            !expired
        });
        let until_ms = &mut self.forgotten.once_until_ms;
        *until_ms = rules::forget_until(*until_ms, latest_ms);
        let live = &self.once_by_token;
        self.once_by_key.retain(|_, token| live.contains_key(token));
        debug_assert_eq!(self.once_by_key.len(), self.once_by_token.len());
        (before - self.once_by_token.len()) as u64
    }
}

impl TokenStore for MemoryTokenStore {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        let existing = self.revoked.get(jti).copied();
        let forgotten_until_ms = self.forgotten.revocations_until_ms;
        let step = rules::revoke(existing, keep_until_ms, now_ms, forgotten_until_ms);
        match step {
            RevokeStep::NotNeeded => {}
            RevokeStep::Raise { keep_until_ms } => {
                self.revoked.insert(jti.to_owned(), keep_until_ms);
            }
            RevokeStep::Insert { keep_until_ms } => {
                let max = self.limits.revocations_max;
                if rules::room(self.revoked.len() as u64, max, &mut self.edges) == Room::PurgeFirst
                {
                    self.purge_revocations(now_ms);
                    rules::after_purge(Table::Revocations, self.revoked.len() as u64, max)?;
                }
                self.revoked.insert(jti.to_owned(), keep_until_ms);
            }
        }
        Ok(step.outcome())
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        Ok(self.revoked.contains_key(jti))
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        Ok(self.revoked.keys().cloned().collect())
    }

    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        let existing = self
            .once_by_key
            .get(&grant.key)
            .map(|token| (*token, &self.once_by_token[token]));
        let taken = self.once_by_token.contains_key(&grant.token);
        let forgotten_until_ms = self.forgotten.once_until_ms;
        let (row, answer) = match rules::issue_once(
            existing,
            taken,
            grant,
            now_ms,
            forgotten_until_ms,
            &mut self.edges,
        )? {
            IssueStep::Existing(answer) => return Ok(answer),
            IssueStep::Insert { row, answer } => (row, answer),
        };
        let max = self.limits.once_tokens_max;
        if rules::room(self.once_by_token.len() as u64, max, &mut self.edges) == Room::PurgeFirst {
            self.purge_once(now_ms);
            rules::after_purge(Table::OnceTokens, self.once_by_token.len() as u64, max)?;
        }
        self.once_by_key.insert(row.key.clone(), answer.token);
        self.once_by_token.insert(answer.token, row);
        Ok(answer)
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let consume = rules::consume_once(
            self.once_by_token.get(&token),
            user,
            now_ms,
            &mut self.edges,
        );
        if let Some(at) = consume.consumed_at_ms {
            let row = self
                .once_by_token
                .get_mut(&token)
                .expect("accepted token exists");
            row.consumed_at_ms = Some(at);
        }
        Ok(consume.verdict)
    }

    fn check_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        Ok(rules::judge(
            self.once_by_token.get(&token),
            user,
            now_ms,
            &mut self.edges,
        ))
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        let mark =
            rules::mark_once_consumed(self.once_by_token.get(&token), now_ms, &mut self.edges);
        if let (Some(at), Some(row)) = (mark, self.once_by_token.get_mut(&token)) {
            row.consumed_at_ms = Some(at);
        }
        Ok(mark.is_some())
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        Ok(PurgeCounts {
            revocations: self.purge_revocations(now_ms),
            once_tokens: self.purge_once(now_ms),
        })
    }

    fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
        Ok(self.forgotten)
    }
}
