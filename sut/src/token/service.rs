//! [`TokenService`]: JWT issue/verify, the revocation list and one-time tokens bundled over one
//! [`TokenStore`], the way a server node (or the simulator's token node) uses them.
//!
//! It adds no protocol of its own; it wires [`jwt`], [`Revocations`] and
//! [`once`] together so that the Bloom filter and the exact set it fronts always
//! belong to the same store. For a driver that interleaves the store operations of concurrent
//! consumes (the simulator, the models), use [`OnceConsume`] directly.

use super::jwt::{
    self, CheckedTokens, Claims, IssuedJwt, JwtConfig, JwtError, Rejection, SigningKey,
};
use super::once::{self, OnceConfig, OnceConsume};
use super::revocation::{RevocationConfig, RevocationConfigError, RevocationStats, Revocations};
use super::rows::{OnceIssue, OnceKey, OnceRejection, OnceToken};
use super::rows::{RevokeOutcome, TokenStoreError};
use super::store::{PurgeCounts, TokenStore, TokenStoreLimits};
use super::{ActivityKey, TokenFlaws, UserId};
use crate::clock::Now;
use crate::edge::{Edges, Observed};
use serde::{Deserialize, Serialize};

/// Everything the token service is configured with (the signing key is separate, so configs
/// can be printed and serialized).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenConfig {
    /// JWT settings.
    pub jwt: JwtConfig,
    /// Bloom filter settings (its `capacity` should equal `limits.revocations_max`).
    pub revocation: RevocationConfig,
    /// One-time token settings.
    pub once: OnceConfig,
    /// Store bounds (for constructing the store).
    pub limits: TokenStoreLimits,
    /// Documented flaws, all off by default.
    pub flaws: TokenFlaws,
}

/// The token service over store `S`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenService<S> {
    cfg: TokenConfig,
    key: SigningKey,
    store: S,
    revocations: Revocations,
    /// Arrivals at the JWT checks' edge states since its driver last took them (a ghost).
    edges: Edges,
    /// The tokens whose signature the key has checked, or which it issued (a ghost: it only
    /// spares a verification the decoding and the HMAC it would repeat).
    checked: CheckedTokens,
}

impl<S: TokenStore + Observed> Observed for TokenService<S> {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
        self.revocations.take_edges(into);
        self.store.take_edges(into);
    }
}

/// Building a [`TokenService`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenServiceError {
    /// Bad Bloom settings.
    #[error(transparent)]
    Revocation(#[from] RevocationConfigError),
    /// A setting is out of range.
    #[error("bad token config: {0}")]
    Config(&'static str),
    /// The store could not be read to build the filter.
    #[error(transparent)]
    Store(#[from] TokenStoreError),
}

impl<S: TokenStore> TokenService<S> {
    /// A service over `store`, whose Bloom filter is loaded from the store's revocations.
    pub fn new(cfg: TokenConfig, key: SigningKey, store: S) -> Result<Self, TokenServiceError> {
        if cfg.once.window_ms == 0 {
            return Err(TokenServiceError::Config("once.window_ms must be positive"));
        }
        if cfg.jwt.ttl_s == 0 {
            return Err(TokenServiceError::Config("jwt.ttl_s must be positive"));
        }
        let mut revocations = Revocations::new(cfg.revocation, cfg.jwt.leeway_ms)?;
        revocations.rebuild(&store)?;
        Ok(Self {
            cfg,
            key,
            store,
            revocations,
            edges: Edges::default(),
            checked: CheckedTokens::default(),
        })
    }

    /// Checks the service's invariants: its revocation list's over its store
    /// ([`Revocations::check_invariants`]: every revocation the store holds is in the Bloom
    /// filter, the horizon is the store's).
    ///
    /// # Errors
    /// The first jti the filter does not know, or a store failure, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.revocations.check_invariants(&self.store)
    }

    /// Issue a JWT for `subject` with `jti` from the caller's random `nonce`.
    pub fn issue(&mut self, subject: UserId, nonce: u128, now: Now) -> Result<IssuedJwt, JwtError> {
        let issued = jwt::issue(&self.key, &self.cfg.jwt, subject, nonce, now)?;
        self.checked.issued(&self.key, &self.cfg.jwt, &issued);
        Ok(issued)
    }

    /// Verify a JWT, then check the revocation list.
    pub fn verify(&mut self, token: &str, now: Now) -> Result<Claims, Rejection> {
        let claims = self.verify_counting(token, now)?;
        self.revocations.check(&self.store, claims)
    }

    /// Revoke a token. Only a token that verifies (revocation aside) can be revoked, so its
    /// `exp` is trustworthy; revoking an already-revoked token is fine.
    pub fn revoke(&mut self, token: &str, now: Now) -> Result<RevokeOutcome, RevokeError> {
        let claims = self
            .verify_counting(token, now)
            .map_err(RevokeError::Rejected)?;
        self.revocations
            .revoke(&mut self.store, &claims, now.wall_ms)
            .map_err(RevokeError::Store)
    }

    /// [`jwt::verify_counting`] with this service's key, configuration and checked tokens.
    fn verify_counting(&mut self, token: &str, now: Now) -> Result<Claims, Rejection> {
        self.checked
            .verify_counting(&self.key, &self.cfg.jwt, token, now, &mut self.edges)
    }

    /// Issue (or re-read) the one-time token of `(user, activity, this window)`.
    pub fn issue_once(
        &mut self,
        user: UserId,
        activity: ActivityKey,
        nonce: u128,
        now: Now,
    ) -> Result<OnceIssue, TokenStoreError> {
        once::issue_once(&mut self.store, &self.cfg.once, user, activity, nonce, now)
    }

    /// Consume a one-time token: one atomic store operation, or two with the
    /// `once_check_then_delete` flaw on.
    pub fn consume_once(
        &mut self,
        token: OnceToken,
        user: UserId,
        now: Now,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let (outcome, _ops) =
            OnceConsume::new(token, user, now, self.cfg.flaws).run(&mut self.store)?;
        Ok(outcome)
    }

    /// One store operation of a [`OnceConsume`] step machine, for drivers that interleave other
    /// work between a consume's operations (the simulator; the correct path has one).
    pub fn apply_once_op(
        &mut self,
        op: once::OnceOp,
    ) -> Result<once::OnceOpResult, TokenStoreError> {
        once::apply_once_op(&mut self.store, op)
    }

    /// The documented flaws switched on.
    #[must_use]
    pub fn flaws(&self) -> super::TokenFlaws {
        self.cfg.flaws
    }

    /// Purge expired revocations and one-time tokens, and rebuild the Bloom filter.
    pub fn purge_expired(&mut self, now: Now) -> Result<PurgeCounts, TokenStoreError> {
        self.revocations.purge_expired(&mut self.store, now.wall_ms)
    }

    /// The Bloom filter counters.
    #[must_use]
    pub const fn revocation_stats(&self) -> RevocationStats {
        self.revocations.stats()
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &TokenConfig {
        &self.cfg
    }

    /// The store (read-only).
    #[must_use]
    pub const fn store(&self) -> &S {
        &self.store
    }
}

/// A revocation request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RevokeError {
    /// The token to revoke does not verify.
    #[error("cannot revoke: {0}")]
    Rejected(Rejection),
    /// The store refused or failed.
    #[error(transparent)]
    Store(TokenStoreError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::token::interleaved_double_submit;
    use crate::token::check::{TokenEvent, check_revoked_rejected, check_single_use};
    use crate::token::store::MemoryTokenStore;

    /// 2024-05-30 00:00 UTC, hour-aligned. (The example `1717036800` in the ID, token and
    /// lottery design §3.3 is 02:40 UTC and not a multiple of 3600, so its own
    /// `ts // 3600 * 3600` could never produce it.)
    const T0_MS: u64 = crate::testkit::token::T0_MS;

    use crate::testkit::token::{small_config as cfg, test_key as key};

    fn memory(flaws: TokenFlaws) -> TokenService<MemoryTokenStore> {
        let c = cfg(flaws);
        let store = MemoryTokenStore::new(c.limits);
        TokenService::new(c, key(), store).unwrap()
    }

    fn act(s: &str) -> ActivityKey {
        ActivityKey::new(s).unwrap()
    }

    #[test]
    fn a_revocation_missing_from_the_filter_breaks_the_invariant() {
        let mut svc = memory(TokenFlaws::default());
        let now = Now::both(T0_MS);
        let t = svc.issue(UserId(7), 99, now).unwrap();
        svc.check_invariants().unwrap();
        assert_eq!(svc.revoke(&t.token, now).unwrap(), RevokeOutcome::Revoked);
        svc.check_invariants().unwrap();
        // A filter that lost the revocation (as a rebuild from a stale list would).
        svc.revocations = Revocations::new(svc.cfg.revocation, svc.cfg.jwt.leeway_ms).unwrap();
        let err = svc.check_invariants().unwrap_err();
        assert!(err.contains("missing from the Bloom filter"), "{err}");
    }

    #[test]
    fn revoked_tokens_are_rejected_until_they_expire_and_history_agrees() {
        let mut svc = memory(TokenFlaws::default());
        let now = Now::both(T0_MS);
        let t = svc.issue(UserId(7), 99, now).unwrap();
        let other = svc.issue(UserId(8), 100, now).unwrap();
        let mut history = Vec::new();
        assert!(svc.verify(&t.token, now).is_ok());
        history.push(TokenEvent::VerifyOk {
            jti: t.claims.jti.clone(),
            invoked_at: 1,
            at: 1,
        });
        assert_eq!(svc.revoke(&t.token, now).unwrap(), RevokeOutcome::Revoked);
        history.push(TokenEvent::RevokeAck {
            jti: t.claims.jti.clone(),
            at: 2,
        });
        assert_eq!(
            svc.verify(&t.token, now.plus_ms(1)),
            Err(Rejection::Revoked)
        );
        history.push(TokenEvent::VerifyRejected {
            jti: Some(t.claims.jti.clone()),
            at: 3,
        });
        assert!(
            svc.verify(&other.token, now.plus_ms(1)).is_ok(),
            "other tokens unaffected"
        );
        assert_eq!(
            svc.revoke(&t.token, now.plus_ms(2)).unwrap(),
            RevokeOutcome::AlreadyRevoked
        );
        assert_eq!(check_revoked_rejected(&history), Ok(()));
        // Purging at exp keeps it (leeway); after exp + leeway it is forgotten and expired.
        let exp = Now::both(t.claims.exp_ms());
        assert_eq!(svc.purge_expired(exp).unwrap().revocations, 0);
        assert_eq!(svc.verify(&t.token, exp), Err(Rejection::Revoked));
        let gone = exp.plus_ms(1_000);
        assert_eq!(svc.purge_expired(gone).unwrap().revocations, 1);
        assert!(matches!(
            svc.verify(&t.token, gone),
            Err(Rejection::Expired { .. })
        ));
        assert!(matches!(
            svc.revoke("garbage", now),
            Err(RevokeError::Rejected(Rejection::Malformed(_)))
        ));
    }

    #[test]
    fn the_service_reaches_its_edge_states_on_its_own_paths() {
        use crate::token::{
            FILTER_REBUILT_OVER_REVOCATIONS, JWT_REFUSED_PAST_LEEWAY, JWT_WITHIN_LEEWAY,
            ONCE_CONSUME_RACE, ONCE_EXPIRED_REFUSED, ONCE_REPLAY_REFUSED, REVOKED_REFUSED,
        };
        let mut svc = memory(TokenFlaws::default());
        let _ = svc.edges();
        let now = Now::both(T0_MS + 500);
        let t = svc.issue(UserId(7), 1, now).unwrap();
        // nbf is the issue time rounded down to the second, T0; leeway 1 s. A verifier 0.5 s
        // behind it accepts, one 1.001 s behind refuses.
        assert!(svc.verify(&t.token, Now::both(T0_MS - 500)).is_ok());
        assert!(svc.verify(&t.token, Now::both(T0_MS - 1_001)).is_err());
        assert_eq!(svc.revoke(&t.token, now).unwrap(), RevokeOutcome::Revoked);
        assert_eq!(svc.verify(&t.token, now), Err(Rejection::Revoked));
        svc.purge_expired(now).unwrap();
        let o = svc.issue_once(UserId(7), act("A"), 2, now).unwrap();
        assert!(svc.consume_once(o.token, UserId(7), now).unwrap().is_ok());
        // The twin of a double submit, at the same instant, then a later replay.
        let again = svc.consume_once(o.token, UserId(7), now);
        assert_eq!(again, Ok(Err(OnceRejection::AlreadyConsumed)));
        let later = svc.consume_once(o.token, UserId(7), now.plus_ms(1));
        assert_eq!(later, Ok(Err(OnceRejection::AlreadyConsumed)));
        let unused = svc.issue_once(UserId(8), act("A"), 3, now).unwrap();
        let end = Now::both(unused.expires_at_ms);
        assert_eq!(
            svc.consume_once(unused.token, UserId(8), end),
            Ok(Err(OnceRejection::Expired))
        );
        let edges = svc.edges();
        for edge in [
            JWT_WITHIN_LEEWAY,
            JWT_REFUSED_PAST_LEEWAY,
            REVOKED_REFUSED,
            FILTER_REBUILT_OVER_REVOCATIONS,
            ONCE_CONSUME_RACE,
            ONCE_REPLAY_REFUSED,
            ONCE_EXPIRED_REFUSED,
        ] {
            assert_eq!(edges.get(edge.name), Some(&1), "{}: {edges:?}", edge.name);
        }
        // A restart over the store: the new service's filter is rebuilt over the revocation.
        let mut restarted = TokenService::new(svc.cfg.clone(), key(), svc.store.clone()).unwrap();
        restarted.check_invariants().unwrap();
        assert_eq!(
            restarted.edges().get(FILTER_REBUILT_OVER_REVOCATIONS.name),
            Some(&1)
        );
    }

    #[test]
    fn one_time_tokens_reject_each_misuse_distinctly() {
        let mut svc = memory(TokenFlaws::default());
        let now = Now::both(T0_MS + 10);
        let a = svc
            .issue_once(UserId(10086), act("A2024"), 0xabc, now)
            .unwrap();
        assert!(a.fresh && !a.consumed);
        assert_eq!(
            a.expires_at_ms,
            T0_MS + 3_600_000,
            "expires at the end of the hour window"
        );
        // Idempotent within the window, whatever nonce the second call brings.
        let again = svc
            .issue_once(UserId(10086), act("A2024"), 0xdef, now.plus_ms(1_000))
            .unwrap();
        assert_eq!(again, OnceIssue { fresh: false, ..a });
        // Another activity or user: another token.
        let b = svc.issue_once(UserId(10086), act("B"), 0xb, now).unwrap();
        assert_ne!(a.token, b.token);

        assert_eq!(
            svc.consume_once(a.token, UserId(1), now),
            Ok(Err(OnceRejection::Foreign))
        );
        let key = svc
            .consume_once(a.token, UserId(10086), now)
            .unwrap()
            .unwrap();
        assert_eq!(key.window_start_ms, T0_MS);
        assert_eq!(
            svc.consume_once(a.token, UserId(10086), now),
            Ok(Err(OnceRejection::AlreadyConsumed))
        );
        assert_eq!(
            svc.consume_once(OnceToken(0x5555), UserId(10086), now),
            Ok(Err(OnceRejection::Unknown))
        );
        assert_eq!(
            svc.consume_once(b.token, UserId(10086), Now::both(b.expires_at_ms)),
            Ok(Err(OnceRejection::Expired))
        );
        // Re-issuing after consumption returns the same, consumed token: one submit per window.
        let third = svc
            .issue_once(UserId(10086), act("A2024"), 0x123, now)
            .unwrap();
        assert!(third.consumed && !third.fresh && third.token == a.token);
        // The next window gets a new token.
        let next = svc
            .issue_once(
                UserId(10086),
                act("A2024"),
                0x777,
                Now::both(T0_MS + 3_600_000),
            )
            .unwrap();
        assert!(next.fresh && next.token == OnceToken(0x777));
        // Purged expired tokens become unknown.
        let purged = svc.purge_expired(Now::both(T0_MS + 3_600_000)).unwrap();
        assert_eq!(purged.once_tokens, 2);
        assert_eq!(
            svc.consume_once(b.token, UserId(10086), now),
            Ok(Err(OnceRejection::Unknown))
        );
    }

    #[test]
    fn the_correct_consume_is_one_op_and_survives_interleaving() {
        let mut store = MemoryTokenStore::new(TokenStoreLimits::default());
        let (h, ops) = interleaved_double_submit(&mut store, TokenFlaws::default());
        assert_eq!(ops, 2, "one store operation per consume");
        assert_eq!(check_single_use(&h), Ok(()));
        let edges = store.edges();
        assert_eq!(
            edges.get(crate::token::ONCE_CONSUME_RACE.name),
            Some(&1),
            "the second consume met the race: {edges:?}"
        );
    }

    #[test]
    fn the_check_then_delete_flaw_double_submits_and_the_checker_catches_it() {
        let limits = TokenStoreLimits::default();
        let flaw = TokenFlaws {
            once_check_then_delete: true,
        };
        let mut store = MemoryTokenStore::new(limits);
        let (h, ops) = interleaved_double_submit(&mut store, flaw);
        assert_eq!(ops, 4, "two store operations per consume");
        assert_eq!(
            store.edges().get(crate::token::ONCE_CONSUME_RACE.name),
            Some(&1),
            "the second mark met the race"
        );
        assert!(
            matches!(
                check_single_use(&h),
                Err(crate::token::TokenViolation::SingleUse { index: 2, .. })
            ),
            "{h:?}"
        );
        // Run sequentially, the flawed path still rejects a second consume (it shares the rules).
        let mut svc = memory(flaw);
        let now = Now::both(T0_MS);
        let t = svc.issue_once(UserId(1), act("A"), 1, now).unwrap();
        assert!(svc.consume_once(t.token, UserId(1), now).unwrap().is_ok());
        assert_eq!(
            svc.consume_once(t.token, UserId(1), now),
            Ok(Err(OnceRejection::AlreadyConsumed))
        );
        assert_eq!(
            svc.consume_once(t.token, UserId(2), now),
            Ok(Err(OnceRejection::Foreign))
        );
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let store = || MemoryTokenStore::new(TokenStoreLimits::default());
        let mut c = cfg(TokenFlaws::default());
        c.once.window_ms = 0;
        assert_eq!(
            TokenService::new(c, key(), store()).unwrap_err(),
            TokenServiceError::Config("once.window_ms must be positive")
        );
        let mut c = cfg(TokenFlaws::default());
        c.revocation.seed = [0; 32];
        assert!(matches!(
            TokenService::new(c, key(), store()),
            Err(TokenServiceError::Revocation(_))
        ));
    }

    #[test]
    fn consume_rejects_answers_that_do_not_fit() {
        let mut c = OnceConsume::new(OnceToken(1), UserId(1), Now::both(0), TokenFlaws::default());
        assert!(
            c.handle_op_result(once::OnceOpResult::Marked(true))
                .is_err(),
            "nothing in flight yet"
        );
        let op = c.poll_op().unwrap();
        assert!(matches!(op, once::OnceOp::Consume { .. }));
        assert_eq!(c.poll_op(), None, "one op at a time");
        assert!(
            c.handle_op_result(once::OnceOpResult::Checked(Err(OnceRejection::Unknown)))
                .is_err()
        );
        assert!(c.outcome().is_none());
        c.handle_op_result(once::OnceOpResult::Consumed(Err(OnceRejection::Unknown)))
            .unwrap();
        assert_eq!(c.outcome(), Some(&Err(OnceRejection::Unknown)));
        assert_eq!(c.poll_op(), None);
    }
}
