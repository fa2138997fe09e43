//! The draw gate: who may start a draw, decided before the coordinator sees it.
//!
//! A draw is started by a user proving who they are (a JWT whose `sub` is the user) and
//! presenting the one-time submit token of (user, activity, this hour), which is consumed
//! before the draw begins; a user may not draw faster than a per-user rate; and the draw's luck
//! is the server's, never the client's, unless the server was started to let tests force it.
//! The drivers (the single server, a coordinator of a deployment) verify the JWT and consume the
//! one-time token with the token service; the rules of what those answers mean live here.
//!
//! The one-time token admits at most one draw: it is consumed first, then the draw begins. A
//! crash between the two loses that token's draw (nothing is frozen or charged) and the user
//! asks for the next hour's token; the other order could run a draw twice.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod handle;

use crate::UserId;
use crate::lottery;
use crate::token::{self, Claims, OnceKey};

/// Why a draw is refused at the gate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GateRefusal {
    /// The token's subject is not a user id.
    #[error("the token's subject `{sub}` is not a user id")]
    BadSubject {
        /// The subject.
        sub: String,
    },
    /// The body names another user than the token.
    #[error("the token is user {token_user}'s, the draw names user {body_user}")]
    OtherUser {
        /// The token's user.
        token_user: u64,
        /// The body's user.
        body_user: u64,
    },
    /// The one-time token belongs to another user.
    #[error("the one-time token is user {owner}'s")]
    ForeignOnceToken {
        /// Its owner.
        owner: u64,
    },
    /// The one-time token is for another activity.
    #[error("the one-time token is for activity {token_activity}, the draw for {draw_activity}")]
    OtherActivity {
        /// The token's activity.
        token_activity: String,
        /// The draw's.
        draw_activity: u64,
    },
    /// The client tried to choose the draw's luck on a server that decides it.
    #[error(
        "`won` is a test knob: this server decides the luck (start it with --test-forced-outcomes to allow it)"
    )]
    ForcedOutcome,
    /// The activity is not in the operator's registry.
    #[error("activity {activity} is not registered")]
    UnknownActivity {
        /// The activity named.
        activity: u64,
    },
    /// A one-time token asked for something that is not a registered activity's id.
    #[error("`{activity}` is not a registered activity (its decimal id)")]
    UnknownOnceActivity {
        /// What was asked for (at most 64 characters).
        activity: String,
    },
    /// The activity does not accept draws now.
    #[error(
        "activity {activity} is open from {opens_at_ms} to {closes_at_ms} (ms since the epoch), not at {now_ms}"
    )]
    Closed {
        /// The activity.
        activity: u64,
        /// When it opens.
        opens_at_ms: u64,
        /// When it closes.
        closes_at_ms: u64,
        /// Now, on the server's clock.
        now_ms: u64,
    },
    /// The body names a price other than the activity's (the price is the operator's).
    #[error(
        "activity {activity} costs {price_minor}: a draw cannot name another price ({offered_minor})"
    )]
    OtherPrice {
        /// The activity.
        activity: u64,
        /// Its registered price.
        price_minor: u64,
        /// The price the body named.
        offered_minor: u64,
    },
}

/// The lottery activity a one-time token is asked for: the decimal id of a registered activity
/// (the one spelling [`once_activity`] gives it). Tokens exist only for the operator's
/// activities, so a client cannot fill the token table with keys of its own invention.
///
/// # Errors
/// [`GateRefusal::UnknownOnceActivity`].
pub fn once_token_activity(
    registry: &lottery::Registry,
    activity: &token::ActivityKey,
) -> Result<lottery::ActivityId, GateRefusal> {
    activity
        .as_str()
        .parse::<u64>()
        .ok()
        .map(lottery::ActivityId)
        .filter(|id| once_activity(*id) == *activity && registry.get(*id).is_some())
        .ok_or_else(|| GateRefusal::UnknownOnceActivity {
            activity: activity.as_str().chars().take(64).collect(),
        })
}

/// What a draw of an activity costs and whether it may start: the activity must be registered
/// and open at `now_ms`, and the price is the activity's. A body may repeat the price
/// (`offered_minor`), never name another one. Decided before anything is consumed.
///
/// With `client_price` (the documented flaw [`crate::flaw::Flaw::ClientPrice`]) the body's price,
/// when it names one, is taken as it is.
///
/// # Errors
/// [`GateRefusal::UnknownActivity`], [`GateRefusal::Closed`], [`GateRefusal::OtherPrice`].
pub fn draw_terms(
    registry: &lottery::Registry,
    activity: lottery::ActivityId,
    offered_minor: Option<u64>,
    now_ms: u64,
    client_price: bool,
) -> Result<(lottery::Terms, u64), GateRefusal> {
    let Some(terms) = registry.get(activity) else {
        return Err(GateRefusal::UnknownActivity {
            activity: activity.0,
        });
    };
    if !terms.is_open(now_ms) {
        return Err(GateRefusal::Closed {
            activity: activity.0,
            opens_at_ms: terms.opens_at_ms,
            closes_at_ms: terms.closes_at_ms,
            now_ms,
        });
    }
    let price_minor = match offered_minor {
        Some(offered) if client_price => offered,
        Some(offered) if offered != terms.price_minor => {
            return Err(GateRefusal::OtherPrice {
                activity: activity.0,
                price_minor: terms.price_minor,
                offered_minor: offered,
            });
        }
        _ => terms.price_minor,
    };
    Ok((*terms, price_minor))
}

/// The user a draw is for: the token's subject, which the body may repeat but not contradict.
///
/// # Errors
/// [`GateRefusal::BadSubject`], [`GateRefusal::OtherUser`].
pub fn drawer(claims: &Claims, body_user: Option<u64>) -> Result<UserId, GateRefusal> {
    let token_user: u64 = claims.sub.parse().map_err(|_| GateRefusal::BadSubject {
        sub: claims.sub.clone(),
    })?;
    match body_user {
        Some(body_user) if body_user != token_user => Err(GateRefusal::OtherUser {
            token_user,
            body_user,
        }),
        _ => Ok(UserId(token_user)),
    }
}

/// The one-time token activity of a lottery activity (its decimal number).
#[must_use]
pub fn once_activity(activity: lottery::ActivityId) -> token::ActivityKey {
    token::ActivityKey::new(activity.0.to_string()).expect("a decimal u64 is a valid activity id")
}

/// Checks that a consumed one-time token was the drawer's, for the draw's activity.
///
/// # Errors
/// [`GateRefusal::ForeignOnceToken`], [`GateRefusal::OtherActivity`].
pub fn check_once_key(
    key: &OnceKey,
    user: UserId,
    activity: lottery::ActivityId,
) -> Result<(), GateRefusal> {
    if key.user != user {
        return Err(GateRefusal::ForeignOnceToken { owner: key.user.0 });
    }
    if key.activity != once_activity(activity) {
        return Err(GateRefusal::OtherActivity {
            token_activity: key.activity.to_string(),
            draw_activity: activity.0,
        });
    }
    Ok(())
}

/// Whether a client-chosen outcome may be used.
///
/// # Errors
/// [`GateRefusal::ForcedOutcome`] when the client chose and the server does not allow it.
pub const fn forced_outcome(won: Option<bool>, allowed: bool) -> Result<Option<bool>, GateRefusal> {
    match (won, allowed) {
        (Some(_), false) => Err(GateRefusal::ForcedOutcome),
        (won, _) => Ok(won),
    }
}

/// A rate per key (a user's draws, an address's wrong credentials): a token bucket per key
/// (`rate_per_s` refill, `burst` capacity), over the caller's clock. At most `users_max` keys
/// are tracked; beyond that the idlest half is forgotten (a forgotten key starts with a full
/// bucket again).
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimiter<K = UserId> {
    rate_per_s: f64,
    burst: f64,
    users_max: usize,
    buckets: BTreeMap<K, Bucket>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

impl<K: Ord + Copy> RateLimiter<K> {
    /// A limiter; `rate_per_s` and `burst` are clamped to at least one draw.
    #[must_use]
    pub fn new(rate_per_s: f64, burst: u32, users_max: usize) -> Self {
        Self {
            rate_per_s: if rate_per_s.is_finite() {
                rate_per_s.max(f64::MIN_POSITIVE)
            } else {
                f64::MAX
            },
            burst: f64::from(burst.max(1)),
            users_max: users_max.max(1),
            buckets: BTreeMap::new(),
        }
    }

    /// Takes one draw for `user` at `now_ms`; `Err(retry_after_ms)` when the bucket is empty.
    ///
    /// # Errors
    /// The user is over the rate: how long until one draw is available again.
    pub fn take(&mut self, user: K, now_ms: u64) -> Result<(), u64> {
        if !self.buckets.contains_key(&user) && self.buckets.len() >= self.users_max {
            self.forget_idlest();
        }
        let (rate, burst) = (self.rate_per_s, self.burst);
        let bucket = self.buckets.entry(user).or_insert(Bucket {
            tokens: burst,
            at_ms: now_ms,
        });
        let elapsed_s = now_ms.saturating_sub(bucket.at_ms) as f64 / 1000.0;
        bucket.tokens = (bucket.tokens + elapsed_s * rate).min(burst);
        bucket.at_ms = bucket.at_ms.max(now_ms);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(Self::wait_ms(bucket.tokens, rate))
    }

    /// How long until `key` has one draw again at `now_ms` (`None`: it has one now), taking
    /// nothing.
    #[must_use]
    pub fn waiting(&self, key: K, now_ms: u64) -> Option<u64> {
        let bucket = self.buckets.get(&key)?;
        let elapsed_s = now_ms.saturating_sub(bucket.at_ms) as f64 / 1000.0;
        let tokens = (bucket.tokens + elapsed_s * self.rate_per_s).min(self.burst);
        (tokens < 1.0).then(|| Self::wait_ms(tokens, self.rate_per_s))
    }

    /// Milliseconds until a bucket holding `tokens` refills to one at `rate_per_s`.
    fn wait_ms(tokens: f64, rate_per_s: f64) -> u64 {
        let wait_s = (1.0 - tokens) / rate_per_s;
        (wait_s * 1000.0).ceil().min(u64::MAX as f64) as u64
    }

    fn forget_idlest(&mut self) {
        let mut by_age: Vec<(u64, K)> = self.buckets.iter().map(|(u, b)| (b.at_ms, *u)).collect();
        by_age.sort_unstable();
        for (_, user) in by_age.iter().take(by_age.len().div_ceil(2)) {
            self.buckets.remove(user);
        }
    }

    /// Users tracked now.
    #[must_use]
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(sub: &str) -> Claims {
        Claims {
            jti: "j".into(),
            sub: sub.into(),
            iss: "i".into(),
            aud: "a".into(),
            exp: 2,
            nbf: 0,
            iat: 0,
        }
    }

    #[test]
    fn the_drawer_is_the_tokens_subject() {
        assert_eq!(drawer(&claims("7"), None), Ok(UserId(7)));
        assert_eq!(drawer(&claims("7"), Some(7)), Ok(UserId(7)));
        assert_eq!(
            drawer(&claims("7"), Some(8)),
            Err(GateRefusal::OtherUser {
                token_user: 7,
                body_user: 8
            })
        );
        assert!(matches!(
            drawer(&claims("admin"), None),
            Err(GateRefusal::BadSubject { .. })
        ));
    }

    #[test]
    fn the_once_token_must_be_the_drawers_for_the_draws_activity() {
        let key = OnceKey {
            user: UserId(7),
            activity: once_activity(lottery::ActivityId(3)),
            window_start_ms: 0,
        };
        assert_eq!(
            check_once_key(&key, UserId(7), lottery::ActivityId(3)),
            Ok(())
        );
        assert_eq!(
            check_once_key(&key, UserId(8), lottery::ActivityId(3)),
            Err(GateRefusal::ForeignOnceToken { owner: 7 })
        );
        assert!(matches!(
            check_once_key(&key, UserId(7), lottery::ActivityId(4)),
            Err(GateRefusal::OtherActivity { .. })
        ));
    }

    #[test]
    fn the_price_is_the_operators() {
        let a = lottery::ActivityId(3);
        let terms = lottery::Terms {
            opens_at_ms: 100,
            closes_at_ms: 200,
            ..lottery::Terms::always_open(10, 100)
        };
        let registry = lottery::Registry::from_entries([(a, terms)]).unwrap();
        assert_eq!(draw_terms(&registry, a, None, 150, false), Ok((terms, 10)));
        assert_eq!(
            draw_terms(&registry, a, Some(10), 150, false),
            Ok((terms, 10))
        );
        assert_eq!(
            draw_terms(&registry, a, Some(0), 150, false),
            Err(GateRefusal::OtherPrice {
                activity: 3,
                price_minor: 10,
                offered_minor: 0
            })
        );
        assert!(matches!(
            draw_terms(&registry, lottery::ActivityId(4), None, 150, false),
            Err(GateRefusal::UnknownActivity { activity: 4 })
        ));
        for closed_at in [99, 200] {
            assert!(matches!(
                draw_terms(&registry, a, None, closed_at, false),
                Err(GateRefusal::Closed { .. })
            ));
        }
        // The flaw: whatever the client says.
        assert_eq!(draw_terms(&registry, a, Some(0), 150, true), Ok((terms, 0)));
        assert_eq!(draw_terms(&registry, a, None, 150, true), Ok((terms, 10)));
    }

    #[test]
    fn one_time_tokens_only_for_registered_activities() {
        let registry = lottery::Registry::from_entries([(
            lottery::ActivityId(3),
            lottery::Terms::always_open(10, 100),
        )])
        .unwrap();
        let ask = |a: &str| once_token_activity(&registry, &token::ActivityKey::new(a).unwrap());
        assert_eq!(ask("3"), Ok(lottery::ActivityId(3)));
        for other in ["4", "03", "+3", "A2024", "3 "] {
            assert!(
                matches!(ask(other), Err(GateRefusal::UnknownOnceActivity { .. })),
                "{other}"
            );
        }
    }

    #[test]
    fn forced_outcomes_only_where_allowed() {
        assert_eq!(forced_outcome(None, false), Ok(None));
        assert_eq!(forced_outcome(Some(true), true), Ok(Some(true)));
        assert_eq!(
            forced_outcome(Some(false), false),
            Err(GateRefusal::ForcedOutcome)
        );
    }

    #[test]
    fn the_rate_limiter_allows_a_burst_then_the_rate() {
        let mut limiter = RateLimiter::new(2.0, 3, 100);
        let u = UserId(1);
        for _ in 0..3 {
            assert_eq!(limiter.take(u, 1_000), Ok(()));
        }
        assert_eq!(limiter.take(u, 1_000), Err(500), "the next draw in 0.5 s");
        assert_eq!(limiter.take(u, 1_500), Ok(()));
        assert!(limiter.take(u, 1_500).is_err());
        // Another user has a bucket of their own.
        assert_eq!(limiter.take(UserId(2), 1_500), Ok(()));
        // Asking how long takes nothing.
        assert_eq!(limiter.waiting(u, 1_500), Some(500));
        assert_eq!(limiter.waiting(u, 1_500), Some(500));
        assert_eq!(limiter.waiting(u, 2_000), None);
        assert_eq!(
            limiter.waiting(UserId(9), 0),
            None,
            "an unknown key has a full bucket"
        );
    }

    #[test]
    fn the_rate_limiter_takes_any_key() {
        let mut by_address: RateLimiter<[u8; 4]> = RateLimiter::new(1.0, 2, 100);
        assert_eq!(by_address.take([127, 0, 0, 2], 0), Ok(()));
        assert_eq!(by_address.take([127, 0, 0, 2], 0), Ok(()));
        assert_eq!(by_address.take([127, 0, 0, 2], 0), Err(1_000));
        assert_eq!(by_address.take([127, 0, 0, 3], 0), Ok(()));
    }

    #[test]
    fn the_rate_limiter_stays_bounded() {
        let mut limiter = RateLimiter::new(1.0, 1, 10);
        for user in 0..1_000 {
            let _ = limiter.take(UserId(user), user);
        }
        assert!(limiter.tracked() <= 10);
    }
}
