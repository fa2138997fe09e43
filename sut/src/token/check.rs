//! Token invariants as plain functions over a history (docs/architecture.md, "The invariants,
//! and where each is checked"), for the unit tests, the simulator, the models and the load
//! verifier alike.
//!
//! - `tokens.single_use` ([`check_single_use`]): a one-time token is accepted at most once.
//! - `tokens.revoked_rejected` ([`check_revoked_rejected`]): a token is never accepted after its
//!   revocation was acknowledged.
//!
//! A history is a slice of [`TokenEvent`]s, each stamped `at` from **one** monotone sequence
//! (the simulator's global step or time, the load generator's receive order). `at` must not
//! decrease along the slice; a history that goes back is itself reported
//! ([`TokenViolation::OutOfOrder`]) rather than judged. A violation names the index and `at` of
//! the first offending event.
//!
//! Concurrency: a verification that *started* before the revocation's acknowledgement may
//! still succeed after it (it raced), so [`TokenEvent::VerifyOk`] carries when it was invoked,
//! and only one invoked after the acknowledgement is a violation (Jepsen's real-time order).

use super::rows::OnceToken;
use serde::{Deserialize, Serialize};

/// One observed token event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TokenEvent {
    /// A one-time token was issued (fresh or re-read).
    OnceIssued {
        /// The token.
        token: OnceToken,
        /// Sequence stamp.
        at: u64,
    },
    /// A consume of a one-time token was accepted.
    OnceConsumeOk {
        /// The token.
        token: OnceToken,
        /// Sequence stamp.
        at: u64,
    },
    /// A consume of a one-time token was rejected.
    OnceConsumeRejected {
        /// The token.
        token: OnceToken,
        /// Sequence stamp.
        at: u64,
    },
    /// A revocation of `jti` was acknowledged to its requester.
    RevokeAck {
        /// The revoked token's id.
        jti: String,
        /// Sequence stamp.
        at: u64,
    },
    /// A verification of the token `jti` succeeded.
    VerifyOk {
        /// The token's id.
        jti: String,
        /// Sequence stamp when the verification was invoked (`<= at`).
        invoked_at: u64,
        /// Sequence stamp when it answered.
        at: u64,
    },
    /// A verification was rejected.
    VerifyRejected {
        /// The token's id, if it could be read.
        jti: Option<String>,
        /// Sequence stamp.
        at: u64,
    },
}

impl TokenEvent {
    /// The event's sequence stamp.
    #[must_use]
    pub const fn at(&self) -> u64 {
        match self {
            Self::OnceIssued { at, .. }
            | Self::OnceConsumeOk { at, .. }
            | Self::OnceConsumeRejected { at, .. }
            | Self::RevokeAck { at, .. }
            | Self::VerifyOk { at, .. }
            | Self::VerifyRejected { at, .. } => *at,
        }
    }
}

/// A broken invariant, naming the first offending event. Its messages print the events' stamps
/// as `#N`: a caller whose stamps are its history's event numbers (the simulator's are) gets
/// messages a reader can follow to the history's lines.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum TokenViolation {
    /// `tokens.single_use`: a one-time token was accepted a second time.
    #[error(
        "tokens.single_use: token {token} accepted again (#{at}); first accepted at #{first_at}"
    )]
    SingleUse {
        /// The token.
        token: OnceToken,
        /// Index of the second acceptance in the history.
        index: usize,
        /// Its stamp.
        at: u64,
        /// Stamp of the first acceptance.
        first_at: u64,
    },
    /// `tokens.revoked_rejected`: a verification invoked after the revocation was acknowledged
    /// accepted the token.
    #[error(
        "tokens.revoked_rejected: jti {jti} accepted (#{at}, invoked at #{invoked_at}) after its revocation was acknowledged (#{revoked_at})"
    )]
    RevokedAccepted {
        /// The token's id.
        jti: String,
        /// Index of the acceptance.
        index: usize,
        /// Its stamp.
        at: u64,
        /// When the verification was invoked.
        invoked_at: u64,
        /// When the revocation was acknowledged.
        revoked_at: u64,
    },
    /// The history is not in `at` order (or a verify claims to be invoked after it answered).
    #[error(
        "history out of order: #{at} comes after #{previous_at} (its place {index} in the token events)"
    )]
    OutOfOrder {
        /// Index of the offending event.
        index: usize,
        /// Its stamp.
        at: u64,
        /// The stamp it should not be below.
        previous_at: u64,
    },
}

fn check_order(history: &[TokenEvent]) -> Result<(), TokenViolation> {
    let mut previous_at = 0;
    for (index, event) in history.iter().enumerate() {
        let at = event.at();
        if at < previous_at {
            return Err(TokenViolation::OutOfOrder {
                index,
                at,
                previous_at,
            });
        }
        if let TokenEvent::VerifyOk { invoked_at, .. } = event
            && *invoked_at > at
        {
            return Err(TokenViolation::OutOfOrder {
                index,
                at,
                previous_at: *invoked_at,
            });
        }
        previous_at = at;
    }
    Ok(())
}

/// `tokens.single_use`: every one-time token has at most one [`TokenEvent::OnceConsumeOk`].
pub fn check_single_use(history: &[TokenEvent]) -> Result<(), TokenViolation> {
    check_order(history)?;
    let mut accepted = crate::check::AtMostOnce::new();
    for (index, event) in history.iter().enumerate() {
        if let TokenEvent::OnceConsumeOk { token, at } = event
            && let Some(&first_at) = accepted.observe(*token, *at)
        {
            return Err(TokenViolation::SingleUse {
                token: *token,
                index,
                at: *at,
                first_at,
            });
        }
    }
    Ok(())
}

/// `tokens.revoked_rejected`: no [`TokenEvent::VerifyOk`] invoked strictly after a
/// [`TokenEvent::RevokeAck`] of the same jti.
pub fn check_revoked_rejected(history: &[TokenEvent]) -> Result<(), TokenViolation> {
    check_order(history)?;
    let mut revoked_at = std::collections::BTreeMap::<&str, u64>::new();
    for (index, event) in history.iter().enumerate() {
        match event {
            TokenEvent::RevokeAck { jti, at } => {
                revoked_at.entry(jti.as_str()).or_insert(*at);
            }
            TokenEvent::VerifyOk {
                jti,
                invoked_at,
                at,
            } => {
                if let Some(&r) = revoked_at.get(jti.as_str())
                    && *invoked_at > r
                {
                    return Err(TokenViolation::RevokedAccepted {
                        jti: jti.clone(),
                        index,
                        at: *at,
                        invoked_at: *invoked_at,
                        revoked_at: r,
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenEvent::*;

    const T1: OnceToken = OnceToken(1);
    const T2: OnceToken = OnceToken(2);

    fn verify_ok(jti: &str, invoked_at: u64, at: u64) -> TokenEvent {
        VerifyOk {
            jti: jti.to_owned(),
            invoked_at,
            at,
        }
    }

    fn revoke_ack(jti: &str, at: u64) -> TokenEvent {
        RevokeAck {
            jti: jti.to_owned(),
            at,
        }
    }

    #[test]
    fn single_use_passes_a_good_history() {
        let h = [
            OnceIssued { token: T1, at: 1 },
            OnceIssued { token: T2, at: 2 },
            OnceConsumeOk { token: T1, at: 3 },
            OnceConsumeRejected { token: T1, at: 4 },
            OnceConsumeOk { token: T2, at: 5 },
        ];
        assert_eq!(check_single_use(&h), Ok(()));
        assert_eq!(check_single_use(&[]), Ok(()));
    }

    #[test]
    fn single_use_fires_on_a_double_accept_and_names_the_second() {
        let h = [
            OnceIssued { token: T1, at: 1 },
            OnceConsumeOk { token: T1, at: 3 },
            OnceConsumeOk { token: T2, at: 4 },
            OnceConsumeOk { token: T1, at: 7 },
            OnceConsumeOk { token: T2, at: 8 },
        ];
        assert_eq!(
            check_single_use(&h),
            Err(TokenViolation::SingleUse {
                token: T1,
                index: 3,
                at: 7,
                first_at: 3
            })
        );
    }

    #[test]
    fn revoked_rejected_passes_a_good_history_including_a_race() {
        let h = [
            verify_ok("j1", 1, 2),
            revoke_ack("j1", 4),
            verify_ok("j1", 3, 6), // invoked at 3, before the ack at 4: it raced, allowed
            verify_ok("j1", 4, 6), // invoked in the same step as the ack: still concurrent
            VerifyRejected {
                jti: Some("j1".to_owned()),
                at: 7,
            },
            verify_ok("j2", 8, 9), // another token
        ];
        assert_eq!(check_revoked_rejected(&h), Ok(()));
    }

    #[test]
    fn revoked_rejected_fires_on_an_accept_after_the_ack() {
        let h = [
            verify_ok("j1", 1, 2),
            revoke_ack("j1", 4),
            verify_ok("j2", 5, 5),
            verify_ok("j1", 5, 6),
            verify_ok("j1", 7, 8),
        ];
        assert_eq!(
            check_revoked_rejected(&h),
            Err(TokenViolation::RevokedAccepted {
                jti: "j1".to_owned(),
                index: 3,
                at: 6,
                invoked_at: 5,
                revoked_at: 4
            })
        );
    }

    #[test]
    fn out_of_order_histories_are_reported_not_judged() {
        let h = [
            OnceConsumeOk { token: T1, at: 5 },
            OnceConsumeOk { token: T2, at: 4 },
        ];
        assert_eq!(
            check_single_use(&h),
            Err(TokenViolation::OutOfOrder {
                index: 1,
                at: 4,
                previous_at: 5
            })
        );
        let h = [verify_ok("j", 9, 8)];
        assert!(matches!(
            check_revoked_rejected(&h),
            Err(TokenViolation::OutOfOrder { index: 0, .. })
        ));
    }
}
