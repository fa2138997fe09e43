//! Idempotency tokens: signed JWTs with a revocation list, one-time submit tokens, a renewing
//! token cache, and the invariant checkers that judge histories of all of them.
//!
//! This follows chapter 3 ("幂等令牌机制") of the ID, token and lottery design
//! (docs/sources.md), with its gaps closed:
//!
//! - **§3.1 JWT + Bloom filter** ([`jwt`], [`revocation`]): tokens carry `jti`, `exp`, `nbf`,
//!   `iat`, issuer, audience and subject, signed with HS256 by default. Verification rejects
//!   `alg: none`, algorithm confusion, bad signatures, foreign keys, wrong issuer/audience,
//!   expired and not-yet-valid tokens, malformed base64 and oversized tokens, each with its own
//!   [`Rejection`]. Time is a parameter: `exp`/`nbf` are checked against the node's
//!   [`Now::wall_ms`](crate::clock::Now) with an explicit leeway, never the system clock.
//!   Revocations go through a deterministic (seeded) Bloom filter in front of an exact set kept
//!   by a [`TokenStore`]; a Bloom negative skips the exact lookup, as in the design's flow chart.
//!   Unlike the design, a revocation is remembered until the token's `exp` plus the leeway (not a
//!   fixed 3600 s), and the set is bounded.
//! - **§3.2 renewing cache** ([`cache`]): renews 30 s before expiry, at most one renewal in
//!   flight per key, bounded in size. Sans-IO: the cache says "renew", the driver renews.
//! - **§3.3 one-time submit tokens** ([`once`]): one token per (user, activity, hour window),
//!   issued idempotently, consumed by **one** atomic store operation. The design's own code
//!   (`GET` then `SET`) is a check-then-act; the bench keeps it as the off-by-default flaw
//!   [`TokenFlaws::once_check_then_delete`].
//! - **rows** ([`rows`]): the token store's rows and answers (one-time token keys, values and
//!   rejections, revocation outcomes, store errors) as plain data, below every other module.
//! - **rules** ([`rules`]): the store's decisions as pure functions, called by every store.
//! - **stores** ([`store`]): the [`TokenStore`] trait at the level of domain operations, with
//!   [`MemoryTokenStore`] (simulator, models); the real server's `SqliteTokenStore` (WAL,
//!   `synchronous=FULL`) lives in `sut-server`, kept identical by a conformance property test
//!   there.
//! - **invariants** ([`check`]): `tokens.single_use` and `tokens.revoked_rejected` as plain
//!   functions over a [`TokenEvent`] history.
//! - [`service`]: [`TokenService`], everything above bundled for a server node.
//!
//! State machines here never read a clock, draw no randomness (nonces are arguments) and do no
//! I/O except through the store trait the caller hands in.

pub mod cache;
pub mod check;
pub mod jwt;
pub mod once;
pub mod revocation;
pub mod rows;
pub mod rules;
pub mod service;
pub mod store;

use crate::edge::{Edge, Machine};

/// A JWT accepted only thanks to the leeway ([`jwt`]).
pub const JWT_WITHIN_LEEWAY: Edge = Edge::new(
    Machine::Token,
    "token.jwt_within_leeway",
    "a JWT is accepted although the verifier's clock lies outside its [nbf, exp) window, by no \
     more than the leeway (clock skew at the allowed bound): one millisecond further it must be \
     refused",
);
/// A JWT refused as expired or not yet valid ([`jwt`]).
pub const JWT_REFUSED_PAST_LEEWAY: Edge = Edge::new(
    Machine::Token,
    "token.jwt_refused_past_leeway",
    "a correctly signed JWT is refused because the verifier's clock lies outside its [nbf, exp) \
     window by more than the leeway (expired, or skewed back past the bound): accepting it would \
     honour a token outside its lifetime",
);
/// A revoked JWT refused ([`revocation`]).
pub const REVOKED_REFUSED: Edge = Edge::new(
    Machine::Token,
    "token.revoked_refused",
    "a JWT that verifies on its own is refused because the Bloom filter and then the exact set \
     both hold its jti: the only thing between a revoked token and acceptance",
);
/// The Bloom filter rebuilt over live revocations ([`revocation`]).
pub const FILTER_REBUILT_OVER_REVOCATIONS: Edge = Edge::new(
    Machine::Token,
    "token.filter_rebuilt_over_revocations",
    "the Bloom filter is rebuilt from a store that holds live revocations (start-up over a \
     persisted store, after a purge, past its capacity): every one must re-enter the filter, or \
     its token passes as a Bloom negative",
);
/// A replayed one-time token refused ([`rules`]).
pub const ONCE_REPLAY_REFUSED: Edge = Edge::new(
    Machine::Token,
    "token.once_replay_refused",
    "a one-time token presented by its owner again, later than its consumption, is refused as \
     already consumed: one accepted submit per window",
);
/// The second consume of a concurrent pair ([`rules`]; where `once_check_then_delete` lives).
pub const ONCE_CONSUME_RACE: Edge = Edge::new(
    Machine::Token,
    "token.once_consume_race",
    "a consume reaches a one-time token that a concurrent consume marked at the same instant or \
     later by the store's clock (or, under the once_check_then_delete flaw, between this \
     consume's check and its mark): the atomic consume must refuse it, the two-step one accepts \
     it twice",
);
/// A one-time token refused at or past its window's end ([`rules`]).
pub const ONCE_EXPIRED_REFUSED: Edge = Edge::new(
    Machine::Token,
    "token.once_expired_refused",
    "an unconsumed one-time token is presented by its owner at or after the end of its window \
     (expires_at_ms <= now, not yet purged) and must be refused, not accepted into the next \
     window",
);
/// A bounded token table full at an insert ([`rules`]).
pub const TABLE_FULL_AT_INSERT: Edge = Edge::new(
    Machine::Token,
    "token.table_full_at_insert",
    "a revocation or a fresh one-time token meets its table at its bound: expired rows must be \
     purged first and the write refused if still full, never a live revocation forgotten",
);
/// A JWT or a one-time window refused because the clock is behind an earlier purge
/// ([`rules::forgotten`]).
pub const FORGOTTEN_REFUSED: Edge = Edge::new(
    Machine::Token,
    "token.forgotten_refused",
    "the clock reads below a time up to which the store has already purged rows (a purge, then \
     a step back): a JWT valid only until then, or a one-time window that ended by then, must \
     be refused, for its revocation or its consumed token may be among the rows forgotten",
);
/// This machine's edge states (see [`crate::edge`]).
pub const EDGES: &[Edge] = &[
    JWT_WITHIN_LEEWAY,
    JWT_REFUSED_PAST_LEEWAY,
    REVOKED_REFUSED,
    FILTER_REBUILT_OVER_REVOCATIONS,
    ONCE_REPLAY_REFUSED,
    ONCE_CONSUME_RACE,
    ONCE_EXPIRED_REFUSED,
    TABLE_FULL_AT_INSERT,
    FORGOTTEN_REFUSED,
];

pub use cache::{CacheAnswer, CacheConfig, TokenCache};
pub use check::{TokenEvent, TokenViolation, check_revoked_rejected, check_single_use};
pub use jwt::{
    CheckedTokens, Claims, IssuedJwt, JwtAlgorithm, JwtConfig, JwtError, MalformedPart, Rejection,
    SigningKey,
};
pub use once::{OnceConfig, OnceConsume, OnceOp, OnceOpResult};
pub use revocation::{RevocationConfig, RevocationFilter, RevocationStats, Revocations};
pub use rows::{OnceIssue, OnceKey, OnceRejection, OnceToken, RevokeOutcome, TokenStoreError};
pub use service::{TokenConfig, TokenService};
pub use store::{Forgotten, MemoryTokenStore, PurgeCounts, TokenStore, TokenStoreLimits};

use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::UserId;

/// Longest accepted [`ActivityKey`], in bytes.
pub const ACTIVITY_KEY_LEN_MAX_BYTES: usize = 64;

/// How the token service names the activity a one-time token is for (`activity_id` of the ID,
/// token and lottery design §3.3, e.g. `A2024`): any string, as a user's own token service names
/// them. The activity itself is [`crate::ActivityId`]; a lottery activity's key is its decimal
/// number ([`crate::gate::once_activity`]). At most [`ACTIVITY_KEY_LEN_MAX_BYTES`] bytes;
/// construct with [`ActivityKey::new`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ActivityKey(String);

impl TryFrom<String> for ActivityKey {
    type Error = String;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
            .ok_or_else(|| format!("activity id must be 1..={ACTIVITY_KEY_LEN_MAX_BYTES} bytes"))
    }
}

impl From<ActivityKey> for String {
    fn from(id: ActivityKey) -> Self {
        id.0
    }
}

impl ActivityKey {
    /// An activity id, or `None` if it is empty or longer than [`ACTIVITY_KEY_LEN_MAX_BYTES`].
    #[must_use]
    pub fn new(id: impl Into<String>) -> Option<Self> {
        let id = id.into();
        (!id.is_empty() && id.len() <= ACTIVITY_KEY_LEN_MAX_BYTES).then_some(Self(id))
    }

    /// The id as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActivityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Documented flaws of the token protocols, each off by default (docs/flaws.md).
/// Correct and flawed code share everything but the flaw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenFlaws {
    /// Consume a one-time token as **two** store operations: check that it is present,
    /// unconsumed, unexpired and owned by the caller, then mark it consumed unconditionally.
    /// Two requests that both pass the check before either marks it are both accepted (double
    /// submit). Source: the ID, token and lottery design §3.3 (docs/sources.md), whose flow is
    /// `GET key` then `SET key ...` as separate Redis commands; docs/flaws.md lists it as
    /// `once_check_then_delete`.
    pub once_check_then_delete: bool,
}
