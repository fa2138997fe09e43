//! `TokenService` over the SQLite token store: a restart rebuilds the revocation filter from the
//! file, and the one-time consume (correct and flawed) under interleaving, through
//! `sut::testkit::token` (the same check `sut` runs over the memory store).

use sut::clock::Now;
use sut::testkit::token::{T0_MS, interleaved_double_submit};
use sut::token::{
    Rejection, RevokeOutcome, TokenFlaws, TokenService, TokenStoreLimits, TokenViolation, UserId,
    check_single_use,
};

use super::SqliteTokenStore;

use sut::testkit::token::{small_config as cfg, test_key as key};

#[test]
fn a_restarted_service_rebuilds_its_filter_from_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.db");
    let c = cfg(TokenFlaws::default());
    let now = Now::both(T0_MS);
    let token = {
        let mut svc = TokenService::new(
            c.clone(),
            key(),
            SqliteTokenStore::open(&path, c.limits).unwrap(),
        )
        .unwrap();
        let t = svc.issue(UserId(1), 5, now).unwrap();
        assert_eq!(svc.revoke(&t.token, now).unwrap(), RevokeOutcome::Revoked);
        t.token
    };
    let mut svc = TokenService::new(
        c.clone(),
        key(),
        SqliteTokenStore::open(&path, c.limits).unwrap(),
    )
    .unwrap();
    assert_eq!(svc.verify(&token, now), Err(Rejection::Revoked));
}

#[test]
fn a_purge_horizon_survives_a_restart_and_a_clock_stepped_back_below_it() {
    // Revoke, purge once the token has expired, restart on the file, step the clock back: the
    // revocation is gone, and the horizon read at start-up still refuses the token.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.db");
    let c = cfg(TokenFlaws::default());
    let open = || {
        TokenService::new(
            c.clone(),
            key(),
            SqliteTokenStore::open(&path, c.limits).unwrap(),
        )
        .unwrap()
    };
    let now = Now::both(T0_MS);
    let (token, keep_until_ms) = {
        let mut svc = open();
        let t = svc.issue(UserId(1), 5, now).unwrap();
        assert_eq!(svc.revoke(&t.token, now).unwrap(), RevokeOutcome::Revoked);
        let keep_until_ms = t.claims.exp_ms() + c.jwt.leeway_ms;
        let purged = svc
            .purge_expired(Now::both(keep_until_ms + 60_000))
            .unwrap();
        assert_eq!(purged.revocations, 1);
        (t.token, keep_until_ms)
    };
    let mut svc = open();
    assert_eq!(
        svc.verify(&token, Now::both(keep_until_ms - 1)),
        Err(Rejection::Forgotten {
            keep_until_ms,
            forgotten_until_ms: keep_until_ms
        })
    );
    // A token issued at the stepped-back clock, valid past the horizon, is unaffected.
    let fresh = svc
        .issue(UserId(2), 6, Now::both(keep_until_ms - 1))
        .unwrap();
    assert!(
        svc.verify(&fresh.token, Now::both(keep_until_ms - 1))
            .is_ok()
    );
}

#[test]
fn the_correct_consume_is_one_op_and_survives_interleaving() {
    let limits = TokenStoreLimits::default();
    let (h, _) = interleaved_double_submit(
        &mut SqliteTokenStore::open_in_memory(limits).unwrap(),
        TokenFlaws::default(),
    );
    assert_eq!(check_single_use(&h), Ok(()));
}

#[test]
fn the_check_then_delete_flaw_double_submits_and_the_checker_catches_it() {
    let limits = TokenStoreLimits::default();
    let flaw = TokenFlaws {
        once_check_then_delete: true,
    };
    let (h, ops) =
        interleaved_double_submit(&mut SqliteTokenStore::open_in_memory(limits).unwrap(), flaw);
    assert_eq!(ops, 4, "two store operations per consume");
    assert!(
        matches!(
            check_single_use(&h),
            Err(TokenViolation::SingleUse { index: 2, .. })
        ),
        "{h:?}"
    );
}
