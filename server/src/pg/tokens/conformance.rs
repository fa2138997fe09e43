//! Conformance: the random operation sequences of the SQLite token store's conformance test,
//! applied to [`MemoryTokenStore`](sut::token::MemoryTokenStore) and [`PgTokenStore`], must give
//! identical results, step by step. One PostgreSQL server for the test, a fresh database per
//! case.

use std::cell::Cell;

use chaos::Postgres;
use proptest::prelude::*;

use super::PgTokenStore;
use crate::pg::{create_database, url_with_database};
use crate::sqlite::tokens_conformance::{LIMITS, agree, op};

/// One PostgreSQL server for a test, a fresh database for each proptest case.
struct Databases {
    server: Postgres,
    prefix: &'static str,
    case: Cell<u32>,
}

impl Databases {
    fn start(prefix: &'static str) -> Self {
        Self {
            server: Postgres::start().expect("start PostgreSQL"),
            prefix,
            case: Cell::new(0),
        }
    }

    /// The URL of a new, empty database.
    fn fresh(&self) -> String {
        let name = format!("{}_{}", self.prefix, self.case.get());
        self.case.set(self.case.get() + 1);
        create_database(&self.server.url(), &name).expect("create database");
        url_with_database(&self.server.url(), &name)
    }
}

/// Whether the row counters the limits use equal the rows really in `tables`.
fn counters_match(url: &str, tables: &[&str]) -> bool {
    let client = crate::pg::connect(url).expect("connect");
    tables.iter().all(|table| {
        let sql = format!(
            "SELECT (SELECT n FROM tok_rows WHERE tbl = '{table}') = (SELECT COUNT(*) FROM {table})"
        );
        let row = futures_executor::block_on(client.query_one(&sql, &[])).expect("count");
        row.get::<_, bool>(0)
    })
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn memory_and_postgres_token_stores_agree() {
    let databases = Databases::start("tok_case");
    let config = ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let url = databases.fresh();
        agree(&mut PgTokenStore::open(&url, LIMITS).expect("open"), &ops)?;
    });
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn a_postgres_batch_agrees_with_the_memory_store_and_commits_once() {
    // The same sequences, every operation inside one batch with no hints (every row read on
    // demand, every write kept to the end): each step must answer as the memory store does, and
    // the counters must match the tables after the commit.
    let databases = Databases::start("tok_batch");
    let config = ProptestConfig {
        cases: 16,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let url = databases.fresh();
        let mut store = PgTokenStore::open(&url, LIMITS).expect("open");
        let mut agreed = Ok(());
        store
            .batch_once(&super::OnceHints::default(), &mut |batch| {
                agreed = agree(batch, &ops);
                Ok(())
            })
            .expect("the batch commits");
        agreed?;
        // Committed, and the row counters the limits use equal the rows really there.
        prop_assert!(
            counters_match(&url, &["tok_once", "tok_revoked"]),
            "counters drifted from the tables"
        );
    });
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn an_abandoned_batch_commits_nothing() {
    use sut::token::rows::{OnceGrant, OnceKey, OnceRejection, OnceToken, TokenStoreError};
    use sut::token::{ActivityKey, TokenStore, UserId};
    let server = Postgres::start().expect("start PostgreSQL");
    create_database(&server.url(), "tok_abandon").expect("create database");
    let url = url_with_database(&server.url(), "tok_abandon");
    let mut store = PgTokenStore::open(&url, LIMITS).expect("open");
    let grant = OnceGrant {
        key: OnceKey {
            user: UserId(7),
            activity: ActivityKey::new("A1").unwrap(),
            window_start_ms: 0,
        },
        token: OnceToken(42),
        expires_at_ms: 3_600_000,
    };
    let abandoned = store.batch_once(&super::OnceHints::default(), &mut |b| {
        assert!(b.issue_once(&grant, 0)?.fresh);
        Err(TokenStoreError::Backend("a later job failed".into()))
    });
    assert!(abandoned.is_err());
    assert_eq!(
        store.consume_once(OnceToken(42), UserId(7), 1).unwrap(),
        Err(OnceRejection::Unknown),
        "the issue of an abandoned batch was rolled back"
    );
}

/// Hints naming every token value and key the generators use (`all`), or only some, so that the
/// rest are read on demand.
fn hints(all: bool) -> super::OnceHints {
    use sut::token::rows::{OnceKey, OnceToken};
    use sut::token::{ActivityKey, UserId};
    let every = |i: u128| all || i.is_multiple_of(2);
    let mut hints = super::OnceHints {
        tokens: (0u128..10).filter(|&n| every(n)).map(OnceToken).collect(),
        keys: Vec::new(),
    };
    for user in 0u64..3 {
        for activity in 0u8..2 {
            for window in 0u64..4 {
                if every(u128::from(user + window)) {
                    hints.keys.push(OnceKey {
                        user: UserId(user),
                        activity: ActivityKey::new(format!("act{activity}")).unwrap(),
                        window_start_ms: window * 100,
                    });
                }
            }
        }
    }
    hints
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
fn a_prefetched_batch_agrees_with_the_memory_store() {
    // The one-time-token writer's batch: rows read up front (all or some of them), writes kept
    // and sent in bulk at the end. Each step must answer as the memory store does, and the
    // bulk writes must leave the tables and their counters as the memory store's.
    let databases = Databases::start("tok_view");
    let config = ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60), all in any::<bool>())| {
        let url = databases.fresh();
        let mut store = PgTokenStore::open(&url, LIMITS).expect("open");
        let mut agreed = Ok(());
        store
            .batch_once(&hints(all), &mut |view| {
                agreed = agree(view, &ops);
                Ok(())
            })
            .expect("the batch commits");
        agreed?;
        // What the batch wrote, read by a plain store afterwards, still agrees: replaying no
        // operation, the final states must match the memory store's after the same ops.
        use sut::token::TokenStore;
        let mut plain = PgTokenStore::open(&url, LIMITS).expect("reopen");
        let mut mem = sut::token::MemoryTokenStore::new(LIMITS);
        for op in &ops {
            let _ = crate::sqlite::tokens_conformance::apply(&mut mem, op);
        }
        for nonce in 0u128..10 {
            for user in 0u64..3 {
                let token = sut::token::rows::OnceToken(nonce);
                let who = sut::token::UserId(user);
                prop_assert_eq!(
                    mem.check_once(token, who, 0),
                    plain.check_once(token, who, 0),
                    "token {} user {} after commit", nonce, user
                );
            }
        }
        prop_assert!(
            counters_match(&url, &["tok_once"]),
            "the counter drifted from the table"
        );
    });
}
