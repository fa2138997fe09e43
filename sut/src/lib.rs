//! The reference implementation the bench holds to "zero duplicates, zero over-issue, zero fund
//! loss": its pure core (the quinn-proto to `sut-server`'s quinn).
//!
//! Every protocol here is a synchronous, deterministic, I/O-free ("sans-IO") state machine: it
//! never reads a clock (time is a parameter), never spawns, never does I/O and draws no
//! randomness of its own. The same code is driven by the madsim simulator (`sim`), the stateright
//! models (`models`) and the real HTTP server (the `sut-server` crate). Stores are traits at the
//! level of domain operations; the in-memory implementations live here, the SQLite ones in
//! `sut-server`, where a conformance property test per store keeps the two identical. The rules
//! both share are public functions here, written once.
//!
//! This crate's normal dependencies are serde, serde_json, thiserror and pure algorithm crates
//! (jsonwebtoken, bloomfilter, base64): no async runtime, HTTP, database, command line or
//! OpenAPI crate. `tests/pure_core.rs` runs `cargo tree` to keep it so. The server, the SQLite
//! stores and the lock-free ID front (`ConcurrentIds`) are in `sut-server`.
//!
//! Modules, in the order data flows through them:
//!
//! - [`clock`]: the time types every state machine takes as a parameter.
//! - [`id_store`]: the ID store trait (tags and segment grants with version CAS, leases, the
//!   reclaim pool, Snowflake worker leases, the counter engine), the memory store and the rules
//!   every implementation shares.
//! - [`segment`]: the Leaf/Tinyid-style segment allocator (double buffer, step policies,
//!   claims and leases, zombie reclaim, degraded mode).
//! - [`snowflake`]: Snowflake IDs with clock-rollback policies and persisted time reservations,
//!   and the semantic IDs of the ID, token and lottery design (§2.3) done right.
//! - [`token`]: JWT, revocation, one-time submit tokens, the renewing token cache.
//! - [`lottery`]: the TCC lottery: fence, participants, coordinator, compensation scheduler.
//! - [`check`]: the one checker library: every invariant over what was observed, for every
//!   driver.
//! - [`journal`]: the one journal replay (records applied in order, no edge state counted).
//! - [`edge`]: the declared edge states ("sometimes" points) every driver counts.
//! - [`boundary`]: the instants where a machine's decision changes, declared by the machine, for
//!   drivers that land clock faults on them.
//! - [`fault`]: the one fault vocabulary: every fault kind's name and where it can be injected.
//! - [`flaw`]: the catalog of known broken designs, each an off-by-default switch of the above.
//! - `testkit` (feature `testkit`, and in this crate's tests): store-generic test drivers that
//!   `sut-server`'s tests run over the SQLite stores.

pub mod boundary;
pub mod check;
pub mod clock;
pub mod edge;
pub mod edge_registry;
pub mod fault;
pub mod flaw;
pub mod gate;
pub mod id_store;
pub mod journal;
pub mod segment;
pub mod snowflake;

pub mod lottery;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod token;

/// A user: the owner of one wallet (lottery), the subject of a JWT and the holder of one-time
/// tokens (tokens). One type for both, so that a token's user is the draw's user.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct UserId(pub u64);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An activity the operator registered (its terms: price, odds, opening hours; one prize with
/// its own stock). The one activity type: a draw's, a participation's, and (by its decimal
/// number, [`token::ActivityKey`]) a one-time token's.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ActivityId(pub u64);

impl std::fmt::Display for ActivityId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
