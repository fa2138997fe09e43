//! The rows a token store holds and the answers it gives: plain data that every other token
//! module reads. This module depends on no other module of the token service (only on the
//! shared types of [`super`]), so the rules ([`super::rules`]), the store ([`super::store`]) and
//! the protocols over it ([`super::once`], [`super::revocation`], [`super::service`]) form
//! layers, not cycles.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{ActivityKey, UserId};

/// What a one-time token is issued for: the design's three-dimensional key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OnceKey {
    /// The user.
    pub user: UserId,
    /// The activity.
    pub activity: ActivityKey,
    /// Start of the window, ms since the epoch.
    pub window_start_ms: u64,
}

/// A one-time token value: 128 random bits supplied by the caller. Displayed (and stored in
/// SQLite) as 32 lowercase hex digits. Unlike a JWT it is printed in full by `Debug`: it names
/// the token in histories and violations, and only its owner can consume it (consume checks
/// the user), so a leaked value lets nobody else submit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OnceToken(pub u128);

impl OnceToken {
    /// Parse the 32-hex-digit form; `None` for anything else.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u128::from_str_radix(text, 16).ok().map(Self))
            .flatten()
    }
}

impl fmt::Display for OnceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OnceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OnceToken({:032x})", self.0)
    }
}

/// The result of issuing: the token for the key, fresh or already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OnceIssue {
    /// The key's token.
    pub token: OnceToken,
    /// When it expires (end of its window), ms.
    pub expires_at_ms: u64,
    /// True if this call created it; false if it was issued before in this window.
    pub fresh: bool,
    /// True if it has already been consumed (the user has submitted in this window).
    pub consumed: bool,
}

/// What [`TokenStore::issue_once`] is asked to store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OnceGrant {
    /// The key.
    pub key: OnceKey,
    /// The token to store if the key has none yet.
    pub token: OnceToken,
    /// Its expiry, ms.
    pub expires_at_ms: u64,
}

/// Why a one-time token was not accepted.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    thiserror::Error,
)]
pub enum OnceRejection {
    /// No such token (never issued, or purged after expiry).
    #[error("unknown one-time token")]
    Unknown,
    /// The token belongs to another user. Reported before any other state, so a foreign
    /// caller learns nothing about the token.
    #[error("one-time token belongs to another user")]
    Foreign,
    /// Already consumed.
    #[error("one-time token already used")]
    AlreadyConsumed,
    /// Past its window (`now_ms >= expires_at_ms`) and not consumed.
    #[error("one-time token expired")]
    Expired,
    /// The token is for another activity than the one it was presented for; it stays unused
    /// (a refusal changes nothing). Only [`crate::token::once::consume_for`] answers it.
    #[error("one-time token is for another activity")]
    OtherActivity,
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
    /// The window of a new one-time token is over: it ended at or before the later of the
    /// clock's reading and the time up to which the store has already purged tokens. Past a
    /// purge the clock is behind, the window's first token, consumed perhaps, may be among those
    /// forgotten: refused rather than issued again.
    #[error(
        "the one-time window ending at {expires_at_ms} ms is over: the store has seen \
         {seen_ms} ms (the clock's reading, or an earlier purge the clock is behind)"
    )]
    WindowOver {
        /// The end of the window asked for.
        expires_at_ms: u64,
        /// The later of the reading and the store's
        /// [`Forgotten::once_until_ms`](super::store::Forgotten).
        seen_ms: u64,
    },
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
