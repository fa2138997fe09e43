//! Conformance: random sequences of token-store operations, several users interleaved, applied
//! to [`MemoryTokenStore`] and [`SqliteTokenStore`] must give identical results, step by step
//! (docs/architecture.md, "The state machines"). The PostgreSQL store's conformance test reuses
//! [`op`] and [`agree`].

use proptest::prelude::*;
use sut::token::rows::{OnceGrant, OnceKey, OnceToken};
use sut::token::store::{MemoryTokenStore, TokenStore, TokenStoreLimits};
use sut::token::{ActivityKey, UserId};

use super::SqliteTokenStore;

/// One token-store operation, over small domains.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Revoke {
        jti: u8,
        keep_until_ms: u64,
        now_ms: u64,
    },
    IsRevoked {
        jti: u8,
    },
    RevokedJtis,
    Issue {
        user: u64,
        activity: u8,
        window: u64,
        nonce: u128,
        now_ms: u64,
    },
    Consume {
        nonce: u128,
        user: u64,
        now_ms: u64,
    },
    Check {
        nonce: u128,
        user: u64,
        now_ms: u64,
    },
    Mark {
        nonce: u128,
        now_ms: u64,
    },
    Purge {
        now_ms: u64,
    },
}

const WINDOW_MS: u64 = 100;

/// A random operation.
pub(crate) fn op() -> impl Strategy<Value = Op> {
    // Small domains so that collisions, repeats, foreign users and full tables all happen.
    let jti = 0u8..6;
    let user = 0u64..3;
    let nonce = 0u128..10;
    // Times on a 25 ms grid, so "now == expiry" boundaries (multiples of WINDOW_MS) are common.
    let t = (0u64..18).prop_map(|x| x * 25);
    prop_oneof![
        3 => (jti.clone(), t.clone(), t.clone()).prop_map(|(jti, keep_until_ms, now_ms)| Op::Revoke { jti, keep_until_ms, now_ms }),
        2 => jti.prop_map(|jti| Op::IsRevoked { jti }),
        1 => Just(Op::RevokedJtis),
        4 => (user.clone(), 0u8..2, 0u64..4, nonce.clone(), t.clone())
            .prop_map(|(user, activity, window, nonce, now_ms)| Op::Issue { user, activity, window, nonce, now_ms }),
        4 => (nonce.clone(), user.clone(), t.clone()).prop_map(|(nonce, user, now_ms)| Op::Consume { nonce, user, now_ms }),
        1 => (nonce.clone(), user, t.clone()).prop_map(|(nonce, user, now_ms)| Op::Check { nonce, user, now_ms }),
        1 => (nonce, t.clone()).prop_map(|(nonce, now_ms)| Op::Mark { nonce, now_ms }),
        1 => t.prop_map(|now_ms| Op::Purge { now_ms }),
    ]
}

/// Applies `op` to `s`; its answer, printed.
pub(crate) fn apply<S: TokenStore + ?Sized>(s: &mut S, op: &Op) -> String {
    let r = match op {
        Op::Revoke {
            jti,
            keep_until_ms,
            now_ms,
        } => format!(
            "{:?}",
            s.revoke(&format!("j{jti}"), *keep_until_ms, *now_ms)
        ),
        Op::IsRevoked { jti } => format!("{:?}", s.is_revoked(&format!("j{jti}"))),
        Op::RevokedJtis => format!("{:?}", s.revoked_jtis()),
        Op::Issue {
            user,
            activity,
            window,
            nonce,
            now_ms,
        } => {
            let window_start_ms = window * WINDOW_MS;
            let grant = OnceGrant {
                key: OnceKey {
                    user: UserId(*user),
                    activity: ActivityKey::new(format!("act{activity}")).unwrap(),
                    window_start_ms,
                },
                token: OnceToken(*nonce),
                expires_at_ms: window_start_ms + WINDOW_MS,
            };
            format!("{:?}", s.issue_once(&grant, *now_ms))
        }
        Op::Consume {
            nonce,
            user,
            now_ms,
        } => format!(
            "{:?}",
            s.consume_once(OnceToken(*nonce), UserId(*user), *now_ms)
        ),
        Op::Check {
            nonce,
            user,
            now_ms,
        } => format!(
            "{:?}",
            s.check_once(OnceToken(*nonce), UserId(*user), *now_ms)
        ),
        Op::Mark { nonce, now_ms } => {
            format!("{:?}", s.mark_once_consumed(OnceToken(*nonce), *now_ms))
        }
        Op::Purge { now_ms } => format!("{:?}", s.purge_expired(*now_ms)),
    };
    assert!(!r.contains("Backend"), "backend failure: {r}");
    r
}

/// The bounds of the stores compared: small, so that full tables happen.
pub(crate) const LIMITS: TokenStoreLimits = TokenStoreLimits {
    revocations_max: 4,
    once_tokens_max: 6,
};

/// Applies `ops` to a fresh [`MemoryTokenStore`] and to `store` (fresh, with [`LIMITS`]):
/// every step must answer the same and leave the same horizons, and every token and the
/// revocation set must end the same.
pub(crate) fn agree<S: TokenStore + ?Sized>(
    store: &mut S,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut mem = MemoryTokenStore::new(LIMITS);
    for (i, op) in ops.iter().enumerate() {
        let m = apply(&mut mem, op);
        let q = apply(store, op);
        prop_assert_eq!(&m, &q, "step {} {:?}", i, op);
        prop_assert_eq!(
            mem.forgotten(),
            store.forgotten(),
            "horizons after step {} {:?}",
            i,
            op
        );
        let checked = mem.check_invariants();
        prop_assert!(checked.is_ok(), "step {} {:?}: {:?}", i, op, checked);
    }
    // Every token ends in the same state, for every user.
    for nonce in 0u128..10 {
        for user in 0u64..3 {
            let op = Op::Check {
                nonce,
                user,
                now_ms: 0,
            };
            prop_assert_eq!(apply(&mut mem, &op), apply(store, &op));
        }
    }
    prop_assert_eq!(mem.revoked_jtis(), store.revoked_jtis());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn memory_and_sqlite_token_stores_agree(ops in proptest::collection::vec(op(), 1..60)) {
        agree(&mut SqliteTokenStore::open_in_memory(LIMITS).unwrap(), &ops)?;
    }
}

#[test]
fn conformance_domain_reaches_every_outcome() {
    // Guard against a vacuous property: the small domain must produce each interesting result.
    let limits = TokenStoreLimits {
        revocations_max: 1,
        once_tokens_max: 1,
    };
    let mut s = MemoryTokenStore::new(limits);
    let issue = |user, nonce, now_ms| Op::Issue {
        user,
        activity: 0,
        window: 0,
        nonce,
        now_ms,
    };
    let mut seen = Vec::new();
    for op in [
        issue(0, 1, 0),
        issue(1, 1, 0), // collision
        Op::Issue {
            user: 1,
            activity: 1,
            window: 0,
            nonce: 2,
            now_ms: 0,
        }, // full
        Op::Consume {
            nonce: 1,
            user: 1,
            now_ms: 0,
        }, // foreign
        Op::Consume {
            nonce: 1,
            user: 0,
            now_ms: 0,
        }, // ok
        Op::Consume {
            nonce: 1,
            user: 0,
            now_ms: 0,
        }, // already
        Op::Consume {
            nonce: 3,
            user: 0,
            now_ms: 0,
        }, // unknown
        Op::Revoke {
            jti: 0,
            keep_until_ms: 10,
            now_ms: 0,
        },
        Op::Revoke {
            jti: 1,
            keep_until_ms: 10,
            now_ms: 0,
        }, // full
        Op::Purge { now_ms: 100 },
        issue(0, 4, 0), // the window ended by the horizon
    ] {
        seen.push(apply(&mut s, &op));
    }
    let all = seen.join("\n");
    for needle in [
        "TokenCollision",
        "OnceTokens",
        "Foreign",
        "Ok(Ok(",
        "AlreadyConsumed",
        "Unknown",
        "Revocations",
        "WindowOver",
    ] {
        assert!(all.contains(needle), "{needle} missing from {all}");
    }
}
