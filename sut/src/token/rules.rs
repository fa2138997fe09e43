//! The token store's rules, in ONE place: pure functions from a request and the rows it reads
//! to the answer and the rows to write.
//!
//! Both stores ([`super::MemoryTokenStore`], `sut-server`'s `SqliteTokenStore`) run every
//! [`super::TokenStore`] operation as: read the rows named here, call the rule, persist what it
//! returns, in one atomic step (`&mut self` / one `IMMEDIATE` transaction). The conformance
//! property test beside the SQLite store keeps the two identical.
//!
//! | operation | reads | rule |
//! |---|---|---|
//! | `revoke` | the jti's `keep_until_ms`, the table's horizon; to insert, the row count | [`revoke`], then [`room`] |
//! | `issue_once` | the key's token row, whether the new token value is taken, the table's horizon; to insert, the row count | [`issue_once`], then [`room`] |
//! | `consume_once` | the token's row | [`consume_once`] |
//! | `check_once` | the token's row | [`judge`] |
//! | `mark_once_consumed` | the token's row | [`mark_once_consumed`] |
//! | `purge_expired` | every row's expiry | [`revocation_expired`], [`once_expired`], then [`forget_until`] |
//!
//! Every purge (the explicit one and those that make room) raises its table's horizon
//! ([`super::Forgotten`]) with [`forget_until`] in the same atomic step: a clock stepped back
//! below a purge must not take a purged row's absence for "never written" ([`forgotten`]).
//!
//! Both tables are bounded ([`super::TokenStoreLimits`]): an insert into a full table first
//! purges the table's expired rows ([`Room::PurgeFirst`]), then is refused with
//! [`TokenStoreError::Full`] if it is still full ([`after_purge`]); the purge stays done.

use crate::edge::Edges;
use serde::{Deserialize, Serialize};

use super::UserId;
use super::rows::{
    OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, Table, TokenStoreError,
};

/// A stored one-time token (its value is the row's key).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OnceRow {
    /// What it was issued for (unique among rows).
    pub key: OnceKey,
    /// End of its window, ms.
    pub expires_at_ms: u64,
    /// When it was consumed; `None` while unused.
    pub consumed_at_ms: Option<u64>,
}

/// Whether a revocation kept until `keep_until_ms` can be forgotten at `now_ms` (the token
/// fails verification on its own from then on).
#[must_use]
pub const fn revocation_expired(keep_until_ms: u64, now_ms: u64) -> bool {
    keep_until_ms <= now_ms
}

/// Whether a one-time token expiring at `expires_at_ms` can be purged at `now_ms` (consumed or
/// not).
#[must_use]
pub const fn once_expired(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms <= now_ms
}

/// Whether a row expiring at `expiry_ms` may have been purged from a table whose horizon is
/// `forgotten_until_ms` (see [`super::Forgotten`]): then its absence proves nothing, and what
/// depended on it is treated as expired, whatever the clock reads now.
#[must_use]
pub const fn forgotten(expiry_ms: u64, forgotten_until_ms: u64) -> bool {
    expiry_ms <= forgotten_until_ms
}

/// A table's new horizon after a purge whose latest deleted expiry is `purged_latest_ms`
/// (`None`: it deleted nothing). Never lowers it.
#[must_use]
pub fn forget_until(forgotten_until_ms: u64, purged_latest_ms: Option<u64>) -> u64 {
    forgotten_until_ms.max(purged_latest_ms.unwrap_or(0))
}

/// Whether a bounded table has room for one more row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Room {
    /// Insert.
    Free,
    /// Purge the table's expired rows, then ask [`after_purge`].
    PurgeFirst,
}

/// Room in a table holding `rows` rows of at most `max`.
#[must_use]
pub fn room(rows: u64, max: u64, edges: &mut Edges) -> Room {
    if rows >= max {
        edges.reach(&super::TABLE_FULL_AT_INSERT);
        Room::PurgeFirst
    } else {
        Room::Free
    }
}

/// After [`Room::PurgeFirst`]: insert if the `rows` left are below `max`.
///
/// # Errors
/// [`TokenStoreError::Full`] naming `table` (the purge stays done).
pub const fn after_purge(table: Table, rows: u64, max: u64) -> Result<(), TokenStoreError> {
    if rows >= max {
        Err(TokenStoreError::Full { table, max })
    } else {
        Ok(())
    }
}

/// What [`revoke`] decided from the jti's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RevokeStep {
    /// Answer [`RevokeOutcome::NotNeeded`]; write nothing.
    NotNeeded,
    /// Answer [`RevokeOutcome::AlreadyRevoked`]; write this `keep_until_ms` (the later one).
    Raise {
        /// The row's new value.
        keep_until_ms: u64,
    },
    /// Insert the jti with this `keep_until_ms` if the table has [`room`]; answer
    /// [`RevokeOutcome::Revoked`].
    Insert {
        /// The new row's value.
        keep_until_ms: u64,
    },
}

impl RevokeStep {
    /// The answer once the step is persisted.
    pub const fn outcome(self) -> RevokeOutcome {
        match self {
            Self::NotNeeded => RevokeOutcome::NotNeeded,
            Self::Raise { .. } => RevokeOutcome::AlreadyRevoked,
            Self::Insert { .. } => RevokeOutcome::Revoked,
        }
    }
}

/// `revoke`: nothing to remember once the token cannot verify anyway (expired by the clock, or
/// [`forgotten`] by the table: the verifier refuses it then); a remembered jti keeps the later
/// of the two times; a new one is inserted.
///
/// `existing` is the jti's `keep_until_ms`, if it is remembered; `forgotten_until_ms` the
/// table's horizon.
#[must_use]
pub const fn revoke(
    existing: Option<u64>,
    keep_until_ms: u64,
    now_ms: u64,
    forgotten_until_ms: u64,
) -> RevokeStep {
    if revocation_expired(keep_until_ms, now_ms) || forgotten(keep_until_ms, forgotten_until_ms) {
        return RevokeStep::NotNeeded;
    }
    match existing {
        Some(existing) if existing >= keep_until_ms => RevokeStep::Raise {
            keep_until_ms: existing,
        },
        Some(_) => RevokeStep::Raise { keep_until_ms },
        None => RevokeStep::Insert { keep_until_ms },
    }
}

/// What [`issue_once`] decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IssueStep {
    /// The key already has a token: answer it, write nothing.
    Existing(OnceIssue),
    /// Insert `row` under `answer.token` if the table has [`room`]; then answer `answer`.
    Insert {
        /// The new row.
        row: OnceRow,
        /// The answer (`fresh`, unconsumed).
        answer: OnceIssue,
    },
}

/// `issue_once`: a key with a token gets it back unchanged, whatever `grant.token` says; else
/// the grant's token is stored unless its window may have been forgotten or the value is taken.
///
/// `existing` is the key's token and row, if any; `token_taken` whether any row has the value
/// `grant.token`; `forgotten_until_ms` the table's horizon.
///
/// # Errors
/// [`TokenStoreError::WindowOver`] when the key has no row and its window ended by the horizon
/// (its first token may have been purged, consumed) or by `now_ms` (only where the window's end
/// saturates at the clock's end; so the purge that makes room never reaches the new row);
/// [`TokenStoreError::TokenCollision`] when a new token's value is taken (a repeated nonce).
pub fn issue_once(
    existing: Option<(OnceToken, &OnceRow)>,
    token_taken: bool,
    grant: &OnceGrant,
    now_ms: u64,
    forgotten_until_ms: u64,
    edges: &mut Edges,
) -> Result<IssueStep, TokenStoreError> {
    if let Some((token, row)) = existing {
        assert_eq!(row.key, grant.key, "the row read is the key's");
        return Ok(IssueStep::Existing(OnceIssue {
            token,
            expires_at_ms: row.expires_at_ms,
            fresh: false,
            consumed: row.consumed_at_ms.is_some(),
        }));
    }
    let seen_ms = now_ms.max(forgotten_until_ms);
    if forgotten(grant.expires_at_ms, seen_ms) {
        edges.reach_if(
            forgotten(grant.expires_at_ms, forgotten_until_ms),
            &super::FORGOTTEN_REFUSED,
        );
        return Err(TokenStoreError::WindowOver {
            expires_at_ms: grant.expires_at_ms,
            seen_ms,
        });
    }
    if token_taken {
        return Err(TokenStoreError::TokenCollision);
    }
    Ok(IssueStep::Insert {
        row: OnceRow {
            key: grant.key.clone(),
            expires_at_ms: grant.expires_at_ms,
            consumed_at_ms: None,
        },
        answer: OnceIssue {
            token: grant.token,
            expires_at_ms: grant.expires_at_ms,
            fresh: true,
            consumed: false,
        },
    })
}

/// `check_once` (and the verdict of `consume_once`): accept a token that exists, belongs to
/// `user`, is unconsumed and unexpired; otherwise say why (precedence: unknown, foreign,
/// already consumed, expired).
///
/// # Errors
/// The [`OnceRejection`].
pub fn judge(
    row: Option<&OnceRow>,
    user: UserId,
    now_ms: u64,
    edges: &mut Edges,
) -> Result<OnceKey, OnceRejection> {
    let Some(row) = row else {
        return Err(OnceRejection::Unknown);
    };
    match judge_consume(
        Some(row.key.user),
        row.consumed_at_ms.is_some(),
        row.expires_at_ms,
        user,
        now_ms,
    ) {
        Some(rejection) => {
            match (rejection, row.consumed_at_ms) {
                // Consumed at this very instant or "later" (by this clock): the other consume
                // of a concurrent pair won the row.
                (OnceRejection::AlreadyConsumed, Some(at)) if at >= now_ms => {
                    edges.reach(&super::ONCE_CONSUME_RACE);
                }
                (OnceRejection::AlreadyConsumed, _) => {
                    edges.reach(&super::ONCE_REPLAY_REFUSED);
                }
                (OnceRejection::Expired, _) => edges.reach(&super::ONCE_EXPIRED_REFUSED),
                (
                    OnceRejection::Unknown | OnceRejection::Foreign | OnceRejection::OtherActivity,
                    _,
                ) => {}
            }
            Err(rejection)
        }
        None => Ok(row.key.clone()),
    }
}

/// What [`consume_once`] decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Consume {
    /// The answer.
    pub verdict: Result<OnceKey, OnceRejection>,
    /// Accepted: set the row's `consumed_at_ms` to this (it was unconsumed).
    pub consumed_at_ms: Option<u64>,
}

/// `consume_once`, **one** atomic step: the [`judge`]'s verdict, and on acceptance the row
/// marked consumed at `now_ms`.
#[must_use]
pub fn consume_once(
    row: Option<&OnceRow>,
    user: UserId,
    now_ms: u64,
    edges: &mut Edges,
) -> Consume {
    let verdict = judge(row, user, now_ms, edges);
    let consumed_at_ms = verdict.is_ok().then_some(now_ms);
    assert!(
        consumed_at_ms.is_none() || row.is_some_and(|r| r.consumed_at_ms.is_none()),
        "only an unconsumed token is accepted"
    );
    Consume {
        verdict,
        consumed_at_ms,
    }
}

/// `mark_once_consumed`, the flaw's second half: the `consumed_at_ms` to write, unconditionally
/// (`None`: no such token, answer `false`).
#[must_use]
pub fn mark_once_consumed(row: Option<&OnceRow>, now_ms: u64, edges: &mut Edges) -> Option<u64> {
    match row {
        Some(row) => {
            // Consumed by another consume between this one's check and this mark: the flaw's
            // double submit (the correct path meets the same race in `judge`).
            edges.reach_if(row.consumed_at_ms.is_some(), &super::ONCE_CONSUME_RACE);
            Some(now_ms)
        }
        None => None,
    }
}

/// Decide a consume against a stored row: the one rule both stores implement.
/// Precedence: unknown, foreign, already consumed, expired.
#[must_use]
pub fn judge_consume(
    row_user: Option<UserId>,
    consumed: bool,
    expires_at_ms: u64,
    user: UserId,
    now_ms: u64,
) -> Option<OnceRejection> {
    match row_user {
        None => Some(OnceRejection::Unknown),
        Some(owner) if owner != user => Some(OnceRejection::Foreign),
        Some(_) if consumed => Some(OnceRejection::AlreadyConsumed),
        Some(_) if now_ms >= expires_at_ms => Some(OnceRejection::Expired),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests;
