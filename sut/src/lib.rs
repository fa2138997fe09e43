//! The reference implementation the bench holds to "zero duplicates, zero over-issue, zero fund
//! loss".
//!
//! Every protocol here is a synchronous, deterministic, I/O-free ("sans-IO") state machine: it
//! never reads a clock (time is a parameter), never spawns, never does I/O and draws no
//! randomness of its own. The same code is driven by the madsim simulator (`sim`), the stateright
//! models (`models`) and the real HTTP server (`sut-server`). Stores are traits at the level of
//! domain operations with an in-memory and a SQLite implementation that a conformance test keeps
//! identical.
//!
//! Modules, in the order data flows through them:
//!
//! - [`clock`]: the time types every state machine takes as a parameter.
//! - [`store`]: the ID store trait (tags and segment grants with version CAS, leases, the
//!   reclaim pool, Snowflake worker leases, the counter engine) and its memory/SQLite impls.
//! - [`segment`]: the Leaf/Tinyid-style segment allocator (double buffer, step policies,
//!   claims and leases, zombie reclaim, degraded mode) and its lock-free concurrent front.
//! - [`snowflake`]: Snowflake IDs with clock-rollback policies and persisted time reservations,
//!   and the seed's semantic IDs done right.
//! - [`token`]: JWT, revocation, one-time submit tokens, the renewing token cache.
//! - [`lottery`]: the TCC lottery: fence, participants, coordinator, compensation scheduler.
//! - [`flaw`]: the catalog of known broken designs, each an off-by-default switch of the above.

pub mod clock;
pub mod flaw;
pub mod segment;
pub mod snowflake;
pub mod store;

pub mod lottery;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod token;
