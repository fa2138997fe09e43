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
//!
//! Both tables are bounded ([`TokenStoreLimits`]): when full, expired rows are purged first,
//! and if it is still full the write is refused with [`TokenStoreError::Full`] — never by
//! forgetting a live revocation, which would let a revoked token through.
//!
//! [`MemoryTokenStore`] and `sut-server`'s `SqliteTokenStore` are kept identical by the
//! conformance property test beside the latter.

use super::UserId;
use super::once::{OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, judge_consume};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// Which bounded table is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Table {
    /// The revocation set.
    Revocations,
    /// The one-time tokens.
    OnceTokens,
}

/// Store failures (not protocol rejections).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenStoreError {
    /// The table is at its bound even after purging expired rows.
    #[error("{table:?} table full ({max} rows)")]
    Full {
        /// The table.
        table: Table,
        /// Its bound.
        max: u64,
    },
    /// A fresh one-time token value is already used by another key (a repeated nonce).
    #[error("one-time token value already in use")]
    TokenCollision,
    /// The backend failed (SQLite error text, or a corrupt row).
    #[error("token store backend: {0}")]
    Backend(String),
}

/// What a revocation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum RevokeOutcome {
    /// Newly remembered.
    Revoked,
    /// Already remembered; its `keep_until_ms` is now the later of the two.
    AlreadyRevoked,
    /// `keep_until_ms <= now_ms`: the token can no longer verify, nothing to remember.
    NotNeeded,
}

/// Rows removed by [`TokenStore::purge_expired`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PurgeCounts {
    /// Revocations whose `keep_until_ms <= now_ms`.
    pub revocations: u64,
    /// One-time tokens whose `expires_at_ms <= now_ms` (consumed or not).
    pub once_tokens: u64,
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
        &self,
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
    /// `expires_at_ms <= now_ms`.
    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError>;
}

/// A stored one-time token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct OnceRow {
    key: OnceKey,
    expires_at_ms: u64,
    consumed_at_ms: Option<u64>,
}

/// The in-memory token store (simulator database node, models). Ordered collections only, so
/// it can be hashed and compared as state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemoryTokenStore {
    limits: TokenStoreLimits,
    revoked: BTreeMap<String, u64>,
    once_by_token: BTreeMap<OnceToken, OnceRow>,
    once_by_key: BTreeMap<OnceKey, OnceToken>,
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
        }
    }

    fn purge_revocations(&mut self, now_ms: u64) -> u64 {
        let before = self.revoked.len();
        self.revoked
            .retain(|_, keep_until_ms| *keep_until_ms > now_ms);
        (before - self.revoked.len()) as u64
    }

    fn purge_once(&mut self, now_ms: u64) -> u64 {
        let before = self.once_by_token.len();
        self.once_by_token
            .retain(|_, row| row.expires_at_ms > now_ms);
        let live = &self.once_by_token;
        self.once_by_key.retain(|_, token| live.contains_key(token));
        debug_assert_eq!(self.once_by_key.len(), self.once_by_token.len());
        (before - self.once_by_token.len()) as u64
    }

    fn judge(&self, token: OnceToken, user: UserId, now_ms: u64) -> Result<OnceKey, OnceRejection> {
        let Some(row) = self.once_by_token.get(&token) else {
            return Err(OnceRejection::Unknown);
        };
        match judge_consume(
            Some(row.key.user),
            row.consumed_at_ms.is_some(),
            row.expires_at_ms,
            user,
            now_ms,
        ) {
            Some(rejection) => Err(rejection),
            None => Ok(row.key.clone()),
        }
    }
}

impl TokenStore for MemoryTokenStore {
    fn revoke(
        &mut self,
        jti: &str,
        keep_until_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        if keep_until_ms <= now_ms {
            return Ok(RevokeOutcome::NotNeeded);
        }
        if let Some(existing) = self.revoked.get_mut(jti) {
            *existing = (*existing).max(keep_until_ms);
            return Ok(RevokeOutcome::AlreadyRevoked);
        }
        if self.revoked.len() as u64 >= self.limits.revocations_max {
            self.purge_revocations(now_ms);
            if self.revoked.len() as u64 >= self.limits.revocations_max {
                return Err(TokenStoreError::Full {
                    table: Table::Revocations,
                    max: self.limits.revocations_max,
                });
            }
        }
        self.revoked.insert(jti.to_owned(), keep_until_ms);
        Ok(RevokeOutcome::Revoked)
    }

    fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
        Ok(self.revoked.contains_key(jti))
    }

    fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
        Ok(self.revoked.keys().cloned().collect())
    }

    fn issue_once(&mut self, grant: &OnceGrant, now_ms: u64) -> Result<OnceIssue, TokenStoreError> {
        if let Some(token) = self.once_by_key.get(&grant.key) {
            let row = &self.once_by_token[token];
            return Ok(OnceIssue {
                token: *token,
                expires_at_ms: row.expires_at_ms,
                fresh: false,
                consumed: row.consumed_at_ms.is_some(),
            });
        }
        if self.once_by_token.contains_key(&grant.token) {
            return Err(TokenStoreError::TokenCollision);
        }
        if self.once_by_token.len() as u64 >= self.limits.once_tokens_max {
            self.purge_once(now_ms);
            if self.once_by_token.len() as u64 >= self.limits.once_tokens_max {
                return Err(TokenStoreError::Full {
                    table: Table::OnceTokens,
                    max: self.limits.once_tokens_max,
                });
            }
        }
        self.once_by_token.insert(
            grant.token,
            OnceRow {
                key: grant.key.clone(),
                expires_at_ms: grant.expires_at_ms,
                consumed_at_ms: None,
            },
        );
        self.once_by_key.insert(grant.key.clone(), grant.token);
        Ok(OnceIssue {
            token: grant.token,
            expires_at_ms: grant.expires_at_ms,
            fresh: true,
            consumed: false,
        })
    }

    fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let verdict = self.judge(token, user, now_ms);
        if verdict.is_ok() {
            let row = self
                .once_by_token
                .get_mut(&token)
                .expect("accepted token exists");
            assert!(
                row.consumed_at_ms.is_none(),
                "accepted token was unconsumed"
            );
            row.consumed_at_ms = Some(now_ms);
        }
        Ok(verdict)
    }

    fn check_once(
        &self,
        token: OnceToken,
        user: UserId,
        now_ms: u64,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        Ok(self.judge(token, user, now_ms))
    }

    fn mark_once_consumed(
        &mut self,
        token: OnceToken,
        now_ms: u64,
    ) -> Result<bool, TokenStoreError> {
        Ok(self
            .once_by_token
            .get_mut(&token)
            .map(|row| row.consumed_at_ms = Some(now_ms))
            .is_some())
    }

    fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
        Ok(PurgeCounts {
            revocations: self.purge_revocations(now_ms),
            once_tokens: self.purge_once(now_ms),
        })
    }
}
