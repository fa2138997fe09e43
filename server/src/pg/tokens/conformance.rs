//! The PostgreSQL batch with its snapshot read up front (rows named by the writer's hints, all
//! or some of them): the SQLite token store's random operation sequences must answer as the
//! memory store does, and leave the tables and their counters as the memory store's. (What every
//! database server's token store must do is in `crate::sqldb::conformance`.)

use proptest::prelude::*;

use super::PgTokenStore;
use crate::sqldb::conformance::{Backend, Pg, counters_match};
use crate::sqlite::tokens_conformance::{LIMITS, agree, op};

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
    let server = Pg::start();
    let case = std::cell::Cell::new(0);
    let config = ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..60), all in any::<bool>())| {
        case.set(case.get() + 1);
        let url = Pg::database(&server, &format!("tok_view_{}", case.get()));
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
            counters_match::<Pg>(&url, &["tok_once"]),
            "the counter drifted from the table"
        );
    });
}
