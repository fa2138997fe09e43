//! The token stores: the SQLite store's random operation sequences, applied to
//! [`MemoryTokenStore`](sut::token::MemoryTokenStore) and to the server's store, give identical
//! results step by step, alone and inside the one-time-token writer's batch (rows read up front
//! from its hints, all or some of them, or on demand); an abandoned batch
//! commits nothing; two servers consuming one token at once accept it once.

use std::cell::Cell;
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use sut::token::rows::{OnceGrant, OnceKey, OnceRejection, OnceToken, TokenStoreError};
use sut::token::{ActivityKey, TokenStore, TokenStoreLimits, UserId};

use super::Backend;
use crate::sqldb::once_view::OnceHints;
use crate::sqlite::tokens_conformance::{LIMITS, agree, op};

/// One server for a test, a fresh database for each proptest case.
struct Databases<B: Backend> {
    server: B::Server,
    prefix: &'static str,
    case: Cell<u32>,
}

impl<B: Backend> Databases<B> {
    fn start(prefix: &'static str) -> Self {
        Self {
            server: B::start(),
            prefix,
            case: Cell::new(0),
        }
    }

    /// The URL of a new, empty database.
    fn fresh(&self) -> String {
        let name = format!("{}_{}", self.prefix, self.case.get());
        self.case.set(self.case.get() + 1);
        B::database(&self.server, &name)
    }
}

/// Whether the row counters the limits use equal the rows really in `tables`.
fn counters_match<B: Backend>(url: &str, tables: &[&str]) -> bool {
    tables.iter().all(|table| {
        let counted = B::scalar(
            url,
            &format!("SELECT n FROM tok_rows WHERE tbl = '{table}'"),
        );
        let there = B::scalar(url, &format!("SELECT COUNT(*) FROM {table}"));
        counted == there
    })
}

pub(super) fn stores_agree<B: Backend>() {
    let databases = Databases::<B>::start("tok_case");
    let config = ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let url = databases.fresh();
        agree(&mut B::tokens(&url, LIMITS), &ops)?;
        prop_assert!(
            counters_match::<B>(&url, &["tok_once", "tok_revoked"]),
            "counters drifted from the tables"
        );
    });
}

/// The same sequences, every operation inside one batch: each step must answer as the memory
/// store does, and the counters must match the tables after the commit.
pub(super) fn batch_agrees<B: Backend>() {
    let databases = Databases::<B>::start("tok_batch");
    let config = ProptestConfig {
        cases: 16,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60))| {
        let url = databases.fresh();
        let mut store = B::tokens(&url, LIMITS);
        let mut agreed = Ok(());
        B::batch(&mut store, &OnceHints::default(), &mut |batch| {
            agreed = agree(batch, &ops);
            Ok(())
        })
        .expect("the batch commits");
        agreed?;
        prop_assert!(
            counters_match::<B>(&url, &["tok_once", "tok_revoked"]),
            "counters drifted from the tables"
        );
    });
}

pub(super) fn abandoned_batch<B: Backend>() {
    let server = B::start();
    let url = B::database(&server, "tok_abandon");
    let mut store = B::tokens(&url, LIMITS);
    let grant = OnceGrant {
        key: OnceKey {
            user: UserId(7),
            activity: ActivityKey::new("A1").unwrap(),
            window_start_ms: 0,
        },
        token: OnceToken(42),
        expires_at_ms: 3_600_000,
    };
    let abandoned = B::batch(&mut store, &OnceHints::default(), &mut |b| {
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

/// Two connections (as two servers would have) consume each of many tokens at the same
/// moment: exactly one wins each, and the key it returns carries the full 64-bit user.
pub(super) fn racing_consumes<B: Backend>() {
    const TOKENS: u64 = 200;
    let server = B::start();
    let url = B::database(&server, "tok_race");
    let limits = TokenStoreLimits::default();
    let user = UserId(u64::MAX);
    let mut setup = B::tokens(&url, limits);
    let tokens: Vec<OnceToken> = (0..TOKENS)
        .map(|i| {
            let grant = OnceGrant {
                key: OnceKey {
                    user,
                    activity: ActivityKey::new("A2024").unwrap(),
                    window_start_ms: i * 10,
                },
                token: OnceToken(u128::from(i) + 1),
                expires_at_ms: 3_600_000,
            };
            let issued = setup.issue_once(&grant, 0).expect("issue");
            assert!(issued.fresh);
            issued.token
        })
        .collect();
    let barrier = Arc::new(Barrier::new(2));
    // Opened here, not in the racers: a racer that failed to open would leave the other
    // waiting at the barrier.
    let stores: Vec<B::Tokens> = (0..2).map(|_| B::tokens(&url, limits)).collect();
    let results: Vec<Vec<_>> = std::thread::scope(|scope| {
        let racers: Vec<_> = stores
            .into_iter()
            .map(|mut store| {
                let (tokens, barrier) = (&tokens, &barrier);
                scope.spawn(move || {
                    tokens
                        .iter()
                        .map(|&token| {
                            // No panic in here: the other racer would wait at the barrier
                            // forever. Store errors are judged after the join.
                            barrier.wait();
                            store.consume_once(token, user, 1)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (i, (a, b)) in results[0].iter().zip(&results[1]).enumerate() {
        let (Ok(a), Ok(b)) = (a, b) else {
            panic!("token {i}: a store failed: {a:?} / {b:?}");
        };
        match (a, b) {
            (Ok(key), Err(OnceRejection::AlreadyConsumed))
            | (Err(OnceRejection::AlreadyConsumed), Ok(key)) => {
                assert_eq!(key.user, user, "token {i}");
            }
            other => panic!("token {i}: {other:?}"),
        }
    }
}

/// Hints naming every token value and key the generators use (`all`), or only some, so that the
/// rest are read on demand.
fn hints(all: bool) -> OnceHints {
    use sut::token::rows::{OnceKey, OnceToken};
    use sut::token::{ActivityKey, UserId};
    let every = |i: u128| all || i.is_multiple_of(2);
    let mut hints = OnceHints {
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

pub(super) fn prefetched_batch_agrees<B: Backend>() {
    // The one-time-token writer's batch: rows read up front (all or some of them), writes kept
    // and sent in bulk at the end. Each step must answer as the memory store does, and the
    // bulk writes must leave the tables and their counters as the memory store's.
    let databases = Databases::<B>::start("tok_view");
    let config = ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60), all in any::<bool>())| {
        let url = databases.fresh();
        let mut store = B::tokens(&url, LIMITS);
        let mut agreed = Ok(());
        B::batch(&mut store, &hints(all), &mut |view| {
            agreed = agree(view, &ops);
            Ok(())
        })
        .expect("the batch commits");
        agreed?;
        // What the batch wrote, read by a plain store afterwards, still agrees: replaying no
        // operation, the final states must match the memory store's after the same ops.
        let mut plain = B::tokens(&url, LIMITS);
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
            counters_match::<B>(&url, &["tok_once"]),
            "the counter drifted from the table"
        );
    });
}
