//! A store-generic check of the one-time consume: two consumes of one token whose store
//! operations a driver interleaves. `sut`'s tests run it over the memory store, `sut-server`'s
//! over its SQLite store.

use crate::clock::Now;
use crate::token::check::TokenEvent;
use crate::token::once::{self, OnceConfig, OnceConsume};
use crate::token::store::TokenStore;
use crate::token::{ActivityKey, TokenFlaws, UserId};

/// 2024-05-30 00:00 UTC, hour-aligned: the clock of [`interleaved_double_submit`].
pub const T0_MS: u64 = 1_717_027_200_000;

/// Two consumes of one token, their store operations interleaved as a driver may: A's first
/// op, B's first op, then the rest. Returns the history of acceptances (for
/// [`check_single_use`](crate::token::check_single_use)) and the store operations both issued.
///
/// # Panics
/// If the store refuses to issue the token or fails an operation, or a consume refuses an
/// answer.
pub fn interleaved_double_submit<S: TokenStore>(
    store: &mut S,
    flaws: TokenFlaws,
) -> (Vec<TokenEvent>, u32) {
    let o = OnceConfig::default();
    let now = Now::both(T0_MS);
    let activity = ActivityKey::new("A").unwrap();
    let issued = once::issue_once(store, &o, UserId(1), activity, 77, now).unwrap();
    let mut a = OnceConsume::new(issued.token, UserId(1), now, flaws);
    let mut b = OnceConsume::new(issued.token, UserId(1), now, flaws);
    let mut at = 0;
    let mut history = vec![TokenEvent::OnceIssued {
        token: issued.token,
        at,
    }];
    for _ in 0..2 {
        for c in [&mut a, &mut b] {
            if let Some(op) = c.poll_op() {
                let r = once::apply_once_op(store, op).unwrap();
                c.handle_op_result(r).unwrap();
            }
        }
    }
    for c in [&a, &b] {
        at += 1;
        let token = issued.token;
        history.push(match c.outcome().unwrap() {
            Ok(_) => TokenEvent::OnceConsumeOk { token, at },
            Err(_) => TokenEvent::OnceConsumeRejected { token, at },
        });
    }
    (history, a.ops_issued() + b.ops_issued())
}

/// A small token service configuration for tests: JWTs of 60 s with 1 s of leeway, a
/// revocation filter and store tables of 1,000 entries, and `flaws`.
#[must_use]
pub fn small_config(flaws: TokenFlaws) -> crate::token::TokenConfig {
    use crate::token::{JwtConfig, RevocationConfig, TokenConfig, TokenStoreLimits};
    TokenConfig {
        jwt: JwtConfig {
            leeway_ms: 1_000,
            ttl_s: 60,
            ..JwtConfig::default()
        },
        revocation: RevocationConfig {
            capacity: 1000,
            ..RevocationConfig::default()
        },
        limits: TokenStoreLimits {
            revocations_max: 1000,
            once_tokens_max: 1000,
        },
        flaws,
        ..TokenConfig::default()
    }
}

/// The signing key of the tests: id `k1`, 32 bytes of 42.
///
/// # Panics
/// Never (the key is valid).
#[must_use]
pub fn test_key() -> crate::token::SigningKey {
    crate::token::SigningKey::new("k1", vec![42u8; 32]).expect("a valid test key")
}
