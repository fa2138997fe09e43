//! Each invariant of [`MemoryTokenStore::check_invariants`] holds after operations and fires on
//! a store crafted to break it.

use crate::token::rows::{OnceGrant, OnceKey, OnceToken};
use crate::token::rules::OnceRow;
use crate::token::store::{MemoryTokenStore, TokenStore, TokenStoreLimits};
use crate::token::{ActivityKey, UserId};

fn key(user: u64) -> OnceKey {
    OnceKey {
        user: UserId(user),
        activity: ActivityKey::new("A2024").unwrap(),
        window_start_ms: 0,
    }
}

/// Bounds 2 and 2: revocations `a`, `b`; tokens 1 (user 1) and 2 (user 2), token 1 consumed.
fn good() -> MemoryTokenStore {
    let mut s = MemoryTokenStore::new(TokenStoreLimits {
        revocations_max: 2,
        once_tokens_max: 2,
    });
    for jti in ["a", "b"] {
        let _ = s.revoke(jti, 100, 0).unwrap();
    }
    for user in [1, 2] {
        let grant = OnceGrant {
            key: key(user),
            token: OnceToken(u128::from(user)),
            expires_at_ms: 100,
        };
        s.issue_once(&grant, 0).unwrap();
    }
    s.consume_once(OnceToken(1), UserId(1), 5).unwrap().unwrap();
    s.check_invariants().unwrap();
    s
}

fn fires(needle: &str, break_it: impl FnOnce(&mut MemoryTokenStore)) {
    let mut s = good();
    break_it(&mut s);
    let err = s.check_invariants().unwrap_err();
    assert!(err.contains(needle), "`{needle}` not in: {err}");
}

#[test]
fn a_full_store_stays_within_its_bounds() {
    let mut s = good();
    assert!(s.revoke("c", 100, 0).is_err());
    assert!(s.revoke("c", 100, 100).is_ok(), "purged first");
    s.check_invariants().unwrap();
}

#[test]
fn tables_hold_at_most_their_bound() {
    fires("revocations above the bound 2", |s| {
        s.revoked.insert("c".into(), 100);
    });
    fires("3 one-time tokens above the bound 2", |s| {
        let row = OnceRow {
            key: key(3),
            expires_at_ms: 100,
            consumed_at_ms: None,
        };
        s.once_by_key.insert(key(3), OnceToken(3));
        s.once_by_token.insert(OnceToken(3), row);
    });
}

#[test]
fn the_key_index_is_exact() {
    fires("indexes missing token", |s| {
        s.once_by_token.remove(&OnceToken(2));
    });
    fires("indexes token", |s| {
        s.once_by_key.insert(key(2), OnceToken(1));
    });
    fires("is not indexed under its key", |s| {
        s.once_by_key.remove(&key(2));
    });
    fires("is not indexed under its key", |s| {
        s.limits.once_tokens_max = 3;
        let row = OnceRow {
            key: key(1),
            expires_at_ms: 100,
            consumed_at_ms: None,
        };
        s.once_by_token.insert(OnceToken(3), row);
    });
}

#[test]
fn every_row_expires_after_its_tables_horizon() {
    fires(
        "revocation a kept until 100 is at or below the horizon 100",
        |s| {
            s.forgotten.revocations_until_ms = 100;
        },
    );
    fires("expiring at 100 is at or below the horizon 150", |s| {
        s.forgotten.once_until_ms = 150;
    });
    // Just below every row's expiry is fine.
    let mut s = good();
    s.forgotten.revocations_until_ms = 99;
    s.forgotten.once_until_ms = 99;
    s.check_invariants().unwrap();
}
