//! Each token rule's refusals and writes, on hand-made rows (no store involved).

use super::*;
use crate::edge::Observed as _;
use crate::token::ActivityKey;

fn key(user: u64) -> OnceKey {
    OnceKey {
        user: UserId(user),
        activity: ActivityKey::new("A2024").unwrap(),
        window_start_ms: 0,
    }
}

fn row(user: u64, consumed_at_ms: Option<u64>) -> OnceRow {
    OnceRow {
        key: key(user),
        expires_at_ms: 100,
        consumed_at_ms,
    }
}

fn grant(user: u64, nonce: u128) -> OnceGrant {
    OnceGrant {
        key: key(user),
        token: OnceToken(nonce),
        expires_at_ms: 100,
    }
}

#[test]
fn expiry_is_inclusive_of_now() {
    assert!(revocation_expired(10, 10) && !revocation_expired(11, 10));
    assert!(once_expired(10, 10) && !once_expired(11, 10));
}

#[test]
fn a_full_table_purges_first_and_refuses_only_if_still_full() {
    assert_eq!(room(3, 4, &mut Edges::new()), Room::Free);
    assert_eq!(room(4, 4, &mut Edges::new()), Room::PurgeFirst);
    assert_eq!(after_purge(Table::Revocations, 3, 4), Ok(()));
    assert_eq!(
        after_purge(Table::OnceTokens, 4, 4),
        Err(TokenStoreError::Full {
            table: Table::OnceTokens,
            max: 4
        })
    );
}

#[test]
fn revoke_forgets_the_expired_keeps_the_later_time_and_inserts_the_new() {
    let not_needed = revoke(None, 10, 10, 0);
    assert_eq!(not_needed, RevokeStep::NotNeeded);
    assert_eq!(not_needed.outcome(), RevokeOutcome::NotNeeded);
    assert_eq!(revoke(Some(50), 10, 10, 0), RevokeStep::NotNeeded);
    let later = revoke(Some(50), 80, 10, 0);
    assert_eq!(later, RevokeStep::Raise { keep_until_ms: 80 });
    assert_eq!(later.outcome(), RevokeOutcome::AlreadyRevoked);
    assert_eq!(
        revoke(Some(50), 20, 10, 0),
        RevokeStep::Raise { keep_until_ms: 50 },
        "never shortened"
    );
    let new = revoke(None, 20, 10, 0);
    assert_eq!(new, RevokeStep::Insert { keep_until_ms: 20 });
    assert_eq!(new.outcome(), RevokeOutcome::Revoked);
}

#[test]
fn a_horizon_only_rises_and_covers_what_expired_by_it() {
    assert_eq!(forget_until(0, None), 0);
    assert_eq!(forget_until(0, Some(40)), 40);
    assert_eq!(forget_until(40, Some(30)), 40, "never lowered");
    assert_eq!(forget_until(40, None), 40);
    assert!(forgotten(40, 40));
    assert!(forgotten(0, 0), "expiry 0 is gone from the start");
    assert!(!forgotten(41, 40));
}

#[test]
fn below_the_horizon_a_revocation_is_not_needed_and_a_window_is_refused() {
    // The clock (10) is behind the table's horizon (50): what ended by 50 may have been purged.
    assert_eq!(revoke(None, 50, 10, 50), RevokeStep::NotNeeded);
    assert_eq!(
        revoke(None, 51, 10, 50),
        RevokeStep::Insert { keep_until_ms: 51 }
    );
    assert_eq!(
        issue_once(None, false, &grant(1, 9), 0, 100, &mut Edges::new()),
        Err(TokenStoreError::WindowOver {
            expires_at_ms: 100,
            seen_ms: 100
        })
    );
    // A window over by the clock itself (only where its end saturates at the clock's end).
    assert!(matches!(
        issue_once(None, false, &grant(1, 9), 100, 0, &mut Edges::new()),
        Err(TokenStoreError::WindowOver { seen_ms: 100, .. })
    ));
    assert!(matches!(
        issue_once(None, false, &grant(1, 9), 0, 99, &mut Edges::new()),
        Ok(IssueStep::Insert { .. })
    ));
    // A key that still has its row gets it back: the row proves what happened in the window.
    let held = row(1, Some(5));
    assert!(matches!(
        issue_once(
            Some((OnceToken(7), &held)),
            false,
            &grant(1, 9),
            0,
            100,
            &mut Edges::new()
        ),
        Ok(IssueStep::Existing(_))
    ));
}

#[test]
fn the_memory_store_raises_each_horizon_to_the_latest_expiry_it_purged() {
    use crate::token::{Forgotten, TokenStore as _};
    let mut store = crate::token::MemoryTokenStore::new(crate::token::TokenStoreLimits {
        revocations_max: 1,
        once_tokens_max: 4,
    });
    assert_eq!(store.revoke("a", 30, 0), Ok(RevokeOutcome::Revoked));
    assert!(store.issue_once(&grant(1, 9), 0).is_ok());
    assert_eq!(store.forgotten(), Ok(Forgotten::default()));
    // Making room at 35 purges "a" (kept until 30): the revocation horizon becomes 30, not 35.
    assert_eq!(store.revoke("b", 60, 35), Ok(RevokeOutcome::Revoked));
    let after_room = store.forgotten().unwrap();
    assert_eq!(after_room.revocations_until_ms, 30);
    assert_eq!(
        after_room.once_until_ms, 0,
        "the other table purged nothing"
    );
    // The explicit purge at 1_000 forgets "b" (60) and the one-time token (100).
    store.purge_expired(1_000).unwrap();
    let purged = Forgotten {
        revocations_until_ms: 60,
        once_until_ms: 100,
    };
    assert_eq!(store.forgotten(), Ok(purged));
    // The clock steps back to 20: "a" cannot be revoked into a second life, nor the window
    // reissued; a purge at the stepped-back clock lowers nothing.
    assert_eq!(store.revoke("a", 30, 20), Ok(RevokeOutcome::NotNeeded));
    assert!(matches!(
        store.issue_once(&grant(1, 8), 20),
        Err(TokenStoreError::WindowOver { .. })
    ));
    store.purge_expired(20).unwrap();
    assert_eq!(store.forgotten(), Ok(purged));
    assert_eq!(store.check_invariants(), Ok(()));
}

#[test]
fn issue_returns_the_keys_token_refuses_a_taken_value_and_inserts_a_fresh_one() {
    let held = row(1, Some(5));
    assert_eq!(
        issue_once(
            Some((OnceToken(7), &held)),
            true,
            &grant(1, 9),
            0,
            0,
            &mut Edges::new()
        ),
        Ok(IssueStep::Existing(OnceIssue {
            token: OnceToken(7),
            expires_at_ms: 100,
            fresh: false,
            consumed: true
        })),
        "the key's token wins over the grant's, taken or not"
    );
    assert_eq!(
        issue_once(None, true, &grant(1, 9), 0, 0, &mut Edges::new()),
        Err(TokenStoreError::TokenCollision)
    );
    assert_eq!(
        issue_once(None, false, &grant(1, 9), 0, 0, &mut Edges::new()),
        Ok(IssueStep::Insert {
            row: row(1, None),
            answer: OnceIssue {
                token: OnceToken(9),
                expires_at_ms: 100,
                fresh: true,
                consumed: false
            }
        })
    );
}

#[test]
fn judge_rejects_in_order_unknown_foreign_consumed_expired() {
    assert_eq!(
        judge(None, UserId(1), 0, &mut Edges::new()),
        Err(OnceRejection::Unknown)
    );
    let used_and_old = row(1, Some(5));
    assert_eq!(
        judge(Some(&used_and_old), UserId(2), 200, &mut Edges::new()),
        Err(OnceRejection::Foreign)
    );
    assert_eq!(
        judge(Some(&used_and_old), UserId(1), 200, &mut Edges::new()),
        Err(OnceRejection::AlreadyConsumed)
    );
    assert_eq!(
        judge(Some(&row(1, None)), UserId(1), 100, &mut Edges::new()),
        Err(OnceRejection::Expired)
    );
    assert_eq!(
        judge(Some(&row(1, None)), UserId(1), 99, &mut Edges::new()),
        Ok(key(1))
    );
}

#[test]
fn consume_marks_only_what_it_accepts() {
    let fresh = row(1, None);
    assert_eq!(
        consume_once(Some(&fresh), UserId(1), 30, &mut Edges::new()),
        Consume {
            verdict: Ok(key(1)),
            consumed_at_ms: Some(30)
        }
    );
    let refused = consume_once(Some(&fresh), UserId(2), 30, &mut Edges::new());
    assert_eq!(refused.verdict, Err(OnceRejection::Foreign));
    assert_eq!(refused.consumed_at_ms, None);
    assert_eq!(
        consume_once(None, UserId(1), 30, &mut Edges::new()).consumed_at_ms,
        None
    );
}

#[test]
fn the_flaws_mark_is_unconditional_on_an_existing_token() {
    assert_eq!(
        mark_once_consumed(Some(&row(1, Some(5))), 30, &mut Edges::new()),
        Some(30)
    );
    assert_eq!(
        mark_once_consumed(Some(&row(1, None)), 30, &mut Edges::new()),
        Some(30)
    );
    assert_eq!(mark_once_consumed(None, 30, &mut Edges::new()), None);
}

#[test]
fn each_refusal_of_a_known_token_counts_its_edge_state() {
    use crate::token::{ONCE_CONSUME_RACE, ONCE_EXPIRED_REFUSED, ONCE_REPLAY_REFUSED};
    let edges_of = |f: &dyn Fn(&mut Edges)| {
        let mut e = Edges::new();
        f(&mut e);
        e.take()
    };
    let only = |name: &str| std::collections::BTreeMap::from([(name.to_owned(), 1)]);
    // Consumed at 5, presented again at 30: a replay.
    let replayed = edges_of(&|e| {
        let c = consume_once(Some(&row(1, Some(5))), UserId(1), 30, e);
        assert_eq!(c.verdict, Err(OnceRejection::AlreadyConsumed));
    });
    assert_eq!(replayed, only(ONCE_REPLAY_REFUSED.name));
    // Consumed at 30, presented at 30 (or earlier by a clock that went back): the other half
    // of a concurrent pair, by the atomic consume and by the flaw's check alike.
    for now_ms in [30, 29] {
        let raced = edges_of(&|e| {
            let c = consume_once(Some(&row(1, Some(30))), UserId(1), now_ms, e);
            assert_eq!(c.verdict, Err(OnceRejection::AlreadyConsumed));
            assert_eq!(
                judge(Some(&row(1, Some(30))), UserId(1), now_ms, e),
                Err(OnceRejection::AlreadyConsumed)
            );
        });
        assert_eq!(
            raced,
            std::collections::BTreeMap::from([(ONCE_CONSUME_RACE.name.to_owned(), 2)])
        );
    }
    // The flaw's mark over a row consumed since its check: the race, won twice.
    let marked = edges_of(&|e| {
        assert_eq!(mark_once_consumed(Some(&row(1, Some(30))), 30, e), Some(30));
    });
    assert_eq!(marked, only(ONCE_CONSUME_RACE.name));
    // Expiry is inclusive: refused at expires_at_ms.
    let expired = edges_of(&|e| {
        assert_eq!(
            judge(Some(&row(1, None)), UserId(1), 100, e),
            Err(OnceRejection::Expired)
        );
    });
    assert_eq!(expired, only(ONCE_EXPIRED_REFUSED.name));
    // Accepted, foreign, unknown and a plain mark count nothing.
    let quiet = edges_of(&|e| {
        assert!(
            consume_once(Some(&row(1, None)), UserId(1), 99, e)
                .verdict
                .is_ok()
        );
        assert_eq!(
            judge(Some(&row(1, Some(5))), UserId(2), 30, e),
            Err(OnceRejection::Foreign)
        );
        assert_eq!(judge(None, UserId(1), 30, e), Err(OnceRejection::Unknown));
        assert_eq!(mark_once_consumed(Some(&row(1, None)), 30, e), Some(30));
    });
    assert!(quiet.is_empty(), "{quiet:?}");
}

#[test]
fn a_full_table_at_an_insert_is_an_edge_state() {
    use crate::token::{TABLE_FULL_AT_INSERT, TokenStore as _};
    let mut e = Edges::new();
    assert_eq!(room(3, 4, &mut e), Room::Free);
    assert!(e.take().is_empty());
    assert_eq!(room(4, 4, &mut e), Room::PurgeFirst);
    assert_eq!(e.take().get(TABLE_FULL_AT_INSERT.name), Some(&1));
    // Through a store: the insert that meets the bound purges, then is admitted or refused.
    let mut store = crate::token::MemoryTokenStore::new(crate::token::TokenStoreLimits {
        revocations_max: 1,
        once_tokens_max: 1,
    });
    assert_eq!(store.revoke("a", 10, 0), Ok(RevokeOutcome::Revoked));
    assert!(matches!(
        store.revoke("b", 10, 0),
        Err(TokenStoreError::Full { .. })
    ));
    assert_eq!(store.revoke("b", 20, 10), Ok(RevokeOutcome::Revoked));
    assert!(store.issue_once(&grant(1, 9), 0).is_ok());
    assert!(matches!(
        store.issue_once(&grant(2, 8), 0),
        Err(TokenStoreError::Full { .. })
    ));
    assert_eq!(store.edges().get(TABLE_FULL_AT_INSERT.name), Some(&3));
}
