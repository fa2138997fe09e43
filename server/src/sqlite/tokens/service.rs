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
