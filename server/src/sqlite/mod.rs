//! The SQLite stores of the real server: WAL journal, `synchronous=FULL`, every domain operation
//! one transaction. Each implements a store trait of `sut` and shares its rules with the memory
//! store there: it reads the rows a rule of `sut` (`store::rules`, `token::rules`,
//! `lottery::rules`) names, calls it, and persists what it decided; a conformance property
//! test beside each store applies random operation sequences to both and requires identical
//! results.
//!
//! - [`SqliteIdStore`]: [`sut::id_store::IdStore`] (tags, segment grants, leases, the reclaim pool,
//!   worker leases, the counter engine);
//! - [`SqliteTokenStore`]: [`sut::token::TokenStore`] (revocations, one-time tokens);
//! - [`SqliteLotteryStore`]: [`sut::lottery::LotteryStore`] (fence rows, wallets, stock,
//!   participations, the coordinator log).

mod ids;
mod lottery;
mod tokens;

pub use ids::SqliteIdStore;
#[cfg(test)]
pub(crate) use ids::conformance as ids_conformance;
pub use lottery::SqliteLotteryStore;
pub use tokens::SqliteTokenStore;

/// The lottery conformance test's operations, for the PostgreSQL store's conformance test.
#[cfg(test)]
pub(crate) use lottery::conformance as lottery_conformance;
/// The token-store conformance test's operations, which the PostgreSQL store's test reuses.
#[cfg(test)]
pub(crate) use tokens::conformance as tokens_conformance;
