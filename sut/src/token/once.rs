//! One-time submit tokens keyed by (user, activity, hour window), the ID, token and lottery
//! design §3.3 (docs/sources.md).
//!
//! The design's key is `{uid}_{activity_id}_{window_start}` with `window_start = ts // 3600 *
//! 3600`: one token per user, activity and hour. Here:
//!
//! - **issue** ([`issue_once`]) is idempotent: issuing again for the same key returns the same
//!   token (with [`OnceIssue::fresh`] false and [`OnceIssue::consumed`] telling whether it was
//!   already used), so a user gets at most one accepted submission per window. The token value
//!   is the caller's random `u128` nonce — unguessable as long as the nonce is — never drawn
//!   here. A token expires at the end of its window.
//! - **consume** is **one** atomic store operation, [`TokenStore::consume_once`]: "mark consumed
//!   if present, unconsumed, unexpired and owned by this user". A second consume, an expired,
//!   unknown or foreign (another user's) token each get their own [`OnceRejection`].
//! - The **flaw** [`TokenFlaws::once_check_then_delete`] splits consume into a check
//!   ([`TokenStore::check_once`]) and an unconditional mark
//!   ([`TokenStore::mark_once_consumed`]): two store operations a driver may interleave with
//!   other clients' operations. [`OnceConsume`] is the step machine both paths share; a
//!   simulator feeds it one store result at a time.

use super::rows::{OnceGrant, OnceIssue, OnceKey, OnceRejection, OnceToken, TokenStoreError};
use super::store::TokenStore;
use super::{ActivityKey, TokenFlaws, UserId};
use crate::clock::Now;
use serde::{Deserialize, Serialize};

/// One-time token settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OnceConfig {
    /// Window length in ms (the design: one hour). Must be positive.
    pub window_ms: u64,
}

impl Default for OnceConfig {
    fn default() -> Self {
        Self {
            window_ms: 3_600_000,
        }
    }
}

impl OnceConfig {
    /// Start of the window holding `wall_ms` (the design: `timestamp // 3600 * 3600`, in ms here).
    #[must_use]
    pub const fn window_start_ms(&self, wall_ms: u64) -> u64 {
        assert!(self.window_ms > 0, "window_ms must be positive");
        wall_ms - wall_ms % self.window_ms
    }
}

/// Issue (or re-read) the one-time token of `(user, activity, window of now)`. `nonce` must be
/// fresh randomness; it becomes the token only if the key has none yet.
pub fn issue_once<S: TokenStore + ?Sized>(
    store: &mut S,
    cfg: &OnceConfig,
    user: UserId,
    activity: ActivityKey,
    nonce: u128,
    now: Now,
) -> Result<OnceIssue, TokenStoreError> {
    let window_start_ms = cfg.window_start_ms(now.wall_ms);
    let grant = OnceGrant {
        key: OnceKey {
            user,
            activity,
            window_start_ms,
        },
        token: OnceToken(nonce),
        expires_at_ms: window_start_ms.saturating_add(cfg.window_ms),
    };
    store.issue_once(&grant, now.wall_ms)
}

/// A store operation a consume asks its driver to perform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnceOp {
    /// The correct path: [`TokenStore::consume_once`].
    Consume {
        /// The token.
        token: OnceToken,
        /// The caller.
        user: UserId,
        /// The node's wall clock, ms.
        now_ms: u64,
    },
    /// Flaw, step 1: [`TokenStore::check_once`].
    Check {
        /// The token.
        token: OnceToken,
        /// The caller.
        user: UserId,
        /// The node's wall clock, ms.
        now_ms: u64,
    },
    /// Flaw, step 2: [`TokenStore::mark_once_consumed`].
    Mark {
        /// The token.
        token: OnceToken,
        /// The node's wall clock, ms.
        now_ms: u64,
    },
}

/// The store's answer to a [`OnceOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OnceOpResult {
    /// Answer to [`OnceOp::Consume`].
    Consumed(Result<OnceKey, OnceRejection>),
    /// Answer to [`OnceOp::Check`].
    Checked(Result<OnceKey, OnceRejection>),
    /// Answer to [`OnceOp::Mark`]: whether the row existed.
    Marked(bool),
}

/// Perform one [`OnceOp`] against a store.
pub fn apply_once_op<S: TokenStore + ?Sized>(
    store: &mut S,
    op: OnceOp,
) -> Result<OnceOpResult, TokenStoreError> {
    Ok(match op {
        OnceOp::Consume {
            token,
            user,
            now_ms,
        } => OnceOpResult::Consumed(store.consume_once(token, user, now_ms)?),
        OnceOp::Check {
            token,
            user,
            now_ms,
        } => OnceOpResult::Checked(store.check_once(token, user, now_ms)?),
        OnceOp::Mark { token, now_ms } => {
            OnceOpResult::Marked(store.mark_once_consumed(token, now_ms)?)
        }
    })
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Stage {
    /// Nothing sent yet.
    Start,
    /// Waiting for the answer to `op`; on the flawed path's mark, `checked` is what the check
    /// returned.
    Awaiting {
        op: OnceOp,
        checked: Option<OnceKey>,
    },
    /// Flaw path: the check passed, the mark is next.
    CheckPassed(OnceKey),
    /// Finished.
    Done(Result<OnceKey, OnceRejection>),
}

/// One consume of a one-time token, as a step machine: [`poll_op`](Self::poll_op) gives the next
/// store operation, [`handle_op_result`](Self::handle_op_result) takes its answer, until
/// [`outcome`](Self::outcome) is `Some`. The correct path is one operation; with
/// [`TokenFlaws::once_check_then_delete`] it is two, and a driver may run other clients'
/// operations between them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OnceConsume {
    token: OnceToken,
    user: UserId,
    now_ms: u64,
    flawed: bool,
    stage: Stage,
    ops_issued: u32,
}

/// A store answer that does not fit the operation in flight.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unexpected store answer {got:?} while in stage {stage}")]
pub struct UnexpectedAnswer {
    /// The answer.
    pub got: OnceOpResult,
    /// Where the consume was.
    pub stage: &'static str,
}

impl OnceConsume {
    /// Start consuming `token` on behalf of `user` at `now`.
    #[must_use]
    pub const fn new(token: OnceToken, user: UserId, now: Now, flaws: TokenFlaws) -> Self {
        Self {
            token,
            user,
            now_ms: now.wall_ms,
            flawed: flaws.once_check_then_delete,
            stage: Stage::Start,
            ops_issued: 0,
        }
    }

    /// The next store operation to perform, once; `None` while one is in flight or when done.
    #[must_use]
    pub fn poll_op(&mut self) -> Option<OnceOp> {
        let (token, user, now_ms) = (self.token, self.user, self.now_ms);
        let stage = std::mem::replace(&mut self.stage, Stage::Start);
        let (op, checked) = match stage {
            Stage::Start if self.flawed => (
                OnceOp::Check {
                    token,
                    user,
                    now_ms,
                },
                None,
            ),
            Stage::Start => (
                OnceOp::Consume {
                    token,
                    user,
                    now_ms,
                },
                None,
            ),
            Stage::CheckPassed(key) => (OnceOp::Mark { token, now_ms }, Some(key)),
            other @ (Stage::Awaiting { .. } | Stage::Done(_)) => {
                self.stage = other;
                return None;
            }
        };
        self.stage = Stage::Awaiting { op, checked };
        self.ops_issued += 1;
        assert!(
            self.ops_issued <= 2,
            "a consume takes at most two store operations"
        );
        debug_assert_eq!(self.check_invariants(), Ok(()));
        Some(op)
    }

    /// Feed the answer to the operation in flight. An answer that does not fit leaves the
    /// consume unchanged and is reported.
    pub fn handle_op_result(&mut self, result: OnceOpResult) -> Result<(), UnexpectedAnswer> {
        let stage_name = self.stage_name();
        let next = match (&self.stage, result) {
            (
                Stage::Awaiting {
                    op: OnceOp::Consume { .. },
                    ..
                },
                OnceOpResult::Consumed(r),
            ) => Stage::Done(r),
            (
                Stage::Awaiting {
                    op: OnceOp::Check { .. },
                    ..
                },
                OnceOpResult::Checked(Ok(key)),
            ) => Stage::CheckPassed(key),
            (
                Stage::Awaiting {
                    op: OnceOp::Check { .. },
                    ..
                },
                OnceOpResult::Checked(Err(r)),
            ) => Stage::Done(Err(r)),
            (
                Stage::Awaiting {
                    op: OnceOp::Mark { .. },
                    checked: Some(key),
                },
                OnceOpResult::Marked(existed),
            ) => {
                // The flaw: the mark is unconditional, so "existed" is all it learns. A row
                // purged between check and mark is the only way to lose here.
                Stage::Done(if existed {
                    Ok(key.clone())
                } else {
                    Err(OnceRejection::Unknown)
                })
            }
            (_, got) => {
                return Err(UnexpectedAnswer {
                    got,
                    stage: stage_name,
                });
            }
        };
        self.stage = next;
        debug_assert_eq!(self.check_invariants(), Ok(()));
        Ok(())
    }

    /// The result, once finished.
    #[must_use]
    pub const fn outcome(&self) -> Option<&Result<OnceKey, OnceRejection>> {
        match &self.stage {
            Stage::Done(r) => Some(r),
            _ => None,
        }
    }

    /// How many store operations this consume has asked for (1 on the correct path).
    #[must_use]
    pub const fn ops_issued(&self) -> u32 {
        self.ops_issued
    }

    /// The consume's invariants: one store operation on the correct path and at most two on
    /// the flawed one, each for this consume's token, in the order check, mark.
    ///
    /// # Errors
    /// What breaks, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        let ops_max = if self.flawed { 2 } else { 1 };
        let fits = match &self.stage {
            Stage::Start => self.ops_issued == 0,
            Stage::Awaiting { op, checked } => {
                let ours = match op {
                    OnceOp::Consume { token, .. }
                    | OnceOp::Check { token, .. }
                    | OnceOp::Mark { token, .. } => *token == self.token,
                };
                let step = match op {
                    OnceOp::Consume { .. } => {
                        !self.flawed && checked.is_none() && self.ops_issued == 1
                    }
                    OnceOp::Check { .. } => {
                        self.flawed && checked.is_none() && self.ops_issued == 1
                    }
                    OnceOp::Mark { .. } => self.flawed && checked.is_some() && self.ops_issued == 2,
                };
                ours && step
            }
            Stage::CheckPassed(_) => self.flawed && self.ops_issued == 1,
            Stage::Done(_) => (1..=ops_max).contains(&self.ops_issued),
        };
        if fits {
            Ok(())
        } else {
            Err(format!(
                "one-time consume: stage {} after {} store operation(s) on the {} path",
                self.stage_name(),
                self.ops_issued,
                if self.flawed { "flawed" } else { "correct" }
            ))
        }
    }

    const fn stage_name(&self) -> &'static str {
        match self.stage {
            Stage::Start => "start",
            Stage::Awaiting { .. } => "awaiting",
            Stage::CheckPassed(_) => "check-passed",
            Stage::Done(_) => "done",
        }
    }

    /// Drive this consume to completion against `store` (a direct, non-interleaved driver).
    pub fn run<S: TokenStore + ?Sized>(
        mut self,
        store: &mut S,
    ) -> Result<(Result<OnceKey, OnceRejection>, u32), TokenStoreError> {
        // Bounded: at most two operations on any path.
        for _ in 0..2 {
            let Some(op) = self.poll_op() else { break };
            let answer = apply_once_op(store, op)?;
            self.handle_op_result(answer)
                .map_err(|e| TokenStoreError::Backend(e.to_string()))?;
        }
        let outcome = self
            .outcome()
            .cloned()
            .ok_or_else(|| TokenStoreError::Backend("consume did not finish".to_owned()))?;
        Ok((outcome, self.ops_issued))
    }
}

/// Consumes `token` as a [`OnceConsume`] does, but only for `activity` when one is given: a token
/// of another activity is refused ([`OnceRejection::OtherActivity`]) and stays unused, so a draw
/// presented with the wrong activity's token burns nothing. Run inside one transaction of the
/// store (the server's one-time token writer runs a batch as one): the read that compares the
/// activity and the consume see the same row, and a token's activity never changes, so the
/// consume itself stays the one atomic step that accepts a token once. Returns the outcome and
/// the store operations used.
///
/// # Errors
/// Store failures.
pub fn consume_for<S: TokenStore + ?Sized>(
    store: &mut S,
    token: OnceToken,
    user: UserId,
    activity: Option<&ActivityKey>,
    now: Now,
    flaws: TokenFlaws,
) -> Result<(Result<OnceKey, OnceRejection>, u32), TokenStoreError> {
    if let Some(activity) = activity
        && let Ok(key) = store.check_once(token, user, now.wall_ms)?
        && key.activity != *activity
    {
        return Ok((Err(OnceRejection::OtherActivity), 1));
    }
    let (outcome, ops) = OnceConsume::new(token, user, now, flaws).run(store)?;
    Ok((outcome, ops + u32::from(activity.is_some())))
}

#[cfg(test)]
mod invariant_tests {
    use super::*;

    fn consume(flawed: bool) -> OnceConsume {
        let flaws = TokenFlaws {
            once_check_then_delete: flawed,
        };
        OnceConsume::new(OnceToken(7), UserId(1), Now::both(0), flaws)
    }

    #[test]
    fn invariants_hold_along_both_paths() {
        for flawed in [false, true] {
            let mut c = consume(flawed);
            assert_eq!(c.check_invariants(), Ok(()));
            let _ = c.poll_op().expect("first op");
            assert_eq!(c.check_invariants(), Ok(()));
        }
    }

    #[test]
    fn invariants_fire_on_a_third_op_or_another_token() {
        let mut correct = consume(false);
        let _ = correct.poll_op();
        correct.ops_issued = 2;
        assert!(
            correct
                .check_invariants()
                .unwrap_err()
                .contains("correct path")
        );
        let mut other = consume(false);
        other.stage = Stage::Awaiting {
            op: OnceOp::Consume {
                token: OnceToken(8),
                user: UserId(1),
                now_ms: 0,
            },
            checked: None,
        };
        other.ops_issued = 1;
        assert!(other.check_invariants().is_err(), "another token's op");
        let mut unflawed_check = consume(false);
        unflawed_check.stage = Stage::CheckPassed(OnceKey {
            user: UserId(1),
            activity: ActivityKey::new("a".to_owned()).expect("an activity"),
            window_start_ms: 0,
        });
        unflawed_check.ops_issued = 1;
        assert!(unflawed_check.check_invariants().is_err());
    }
}
