//! The stores on a database server (PostgreSQL, MariaDB), held to the memory stores of `sut`
//! by the same random operation sequences as the SQLite stores (their generators and appliers
//! are the SQLite tests', shared), and to what only a shared database adds: several servers
//! at once on one database. Every test body here is written once, for any [`Backend`], and run
//! for each: memory = SQLite = PostgreSQL = MariaDB.
//!
//! Each test starts its own throwaway server (`chaos::Postgres`, `chaos::MariaDb`); each
//! proptest case gets a fresh database on it. Where the server is not installed the tests are
//! reported as ignored, never as passed.

mod ids;
mod lottery;
mod tokens;

use sut::id_store::{CounterDurability, IdStore};
use sut::lottery::LotteryStore;
use sut::token::rows::TokenStoreError;
use sut::token::store::{TokenStore, TokenStoreLimits};

use super::once_view::OnceHints;
use crate::mysql::{MyIdStore, MyLotteryStore, MyTokenStore};
use crate::pg::{PgIdStore, PgLotteryStore, PgTokenStore};

/// A database server the stores can run on, for the tests.
pub(crate) trait Backend {
    /// The throwaway server of one test.
    type Server: Sync;
    type Ids: IdStore + Send;
    type Tokens: TokenStore + Send;
    type Lottery: LotteryStore + Send;

    /// Starts a throwaway server.
    fn start() -> Self::Server;
    /// Creates the empty database `name` on `server`; its URL.
    fn database(server: &Self::Server, name: &str) -> String;
    fn ids(url: &str, durability: CounterDurability) -> Self::Ids;
    fn tokens(url: &str, limits: TokenStoreLimits) -> Self::Tokens;
    fn lottery(url: &str) -> Self::Lottery;
    /// Runs `ops` as the one-time-token writer's batch: one transaction, committed at the end,
    /// with the rows `hints` names read up front.
    fn batch(
        store: &mut Self::Tokens,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError>;
    /// The value of `sql` (one row, one integer) on the database at `url`, read outside the
    /// stores.
    fn scalar(url: &str, sql: &str) -> i64;
}

/// PostgreSQL.
pub(crate) struct Pg;

impl Backend for Pg {
    type Server = chaos::Postgres;
    type Ids = PgIdStore;
    type Tokens = PgTokenStore;
    type Lottery = PgLotteryStore;

    fn start() -> Self::Server {
        chaos::Postgres::start().expect("start PostgreSQL")
    }

    fn database(server: &Self::Server, name: &str) -> String {
        crate::pg::create_database(&server.url(), name).expect("create database");
        super::url_with_database(&server.url(), name)
    }

    fn ids(url: &str, durability: CounterDurability) -> Self::Ids {
        PgIdStore::open(url, durability).expect("open")
    }

    fn tokens(url: &str, limits: TokenStoreLimits) -> Self::Tokens {
        PgTokenStore::open(url, limits).expect("open")
    }

    fn lottery(url: &str) -> Self::Lottery {
        PgLotteryStore::open(url).expect("open")
    }

    fn batch(
        store: &mut Self::Tokens,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        store.batch_once(hints, ops)
    }

    fn scalar(url: &str, sql: &str) -> i64 {
        let client = crate::pg::connect(url).expect("connect");
        let row = futures_executor::block_on(client.query_one(sql, &[])).expect("query");
        row.get::<_, i64>(0)
    }
}

/// MariaDB.
pub(crate) struct My;

impl Backend for My {
    type Server = chaos::MariaDb;
    type Ids = MyIdStore;
    type Tokens = MyTokenStore;
    type Lottery = MyLotteryStore;

    fn start() -> Self::Server {
        chaos::MariaDb::start().expect("start MariaDB")
    }

    fn database(server: &Self::Server, name: &str) -> String {
        crate::mysql::create_database(&server.url(), name).expect("create database");
        super::url_with_database(&server.url(), name)
    }

    fn ids(url: &str, durability: CounterDurability) -> Self::Ids {
        MyIdStore::open(url, durability).expect("open")
    }

    fn tokens(url: &str, limits: TokenStoreLimits) -> Self::Tokens {
        MyTokenStore::open(url, limits).expect("open")
    }

    fn lottery(url: &str) -> Self::Lottery {
        MyLotteryStore::open(url).expect("open")
    }

    fn batch(
        store: &mut Self::Tokens,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        store.batch_once(hints, ops)
    }

    fn scalar(url: &str, sql: &str) -> i64 {
        let mut conn = crate::mysql::MyConn::open(url, "").expect("connect");
        conn.transact(|tx| {
            let row = tx.query_opt(sql, Vec::new())?.expect("one row");
            crate::mysql::col::<i64>(&row, 0, "scalar")
        })
        .expect("query")
    }
}

/// The tests of this module for one backend, in a module of their own.
macro_rules! backend_tests {
    ($name:ident, $backend:ty, $have:meta, $missing:literal) => {
        mod $name {
            use super::*;

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn memory_and_server_id_stores_agree() {
                ids::stores_agree::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn id_servers_sharing_a_database_never_get_overlapping_segments() {
                ids::no_overlapping_segments::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn memory_and_server_token_stores_agree() {
                tokens::stores_agree::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn a_batch_agrees_with_the_memory_store_and_commits_once() {
                tokens::batch_agrees::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn a_prefetched_batch_agrees_with_the_memory_store() {
                tokens::prefetched_batch_agrees::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn an_abandoned_batch_commits_nothing() {
                tokens::abandoned_batch::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn two_stores_racing_consume_accept_each_token_once() {
                tokens::racing_consumes::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn memory_and_server_lottery_stores_agree() {
                lottery::stores_agree::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn extreme_ids_survive_reopen() {
                lottery::extreme_ids_survive_reopen::<$backend>();
            }

            #[test]
            #[cfg_attr(not($have), ignore = $missing)]
            fn two_stores_racing_on_the_same_branch_decide_it_once() {
                lottery::racing_branches::<$backend>();
            }
        }
    };
}

backend_tests!(postgres, Pg, has_postgres, "PostgreSQL not installed");
backend_tests!(mariadb, My, has_mariadb, "MariaDB not installed");
