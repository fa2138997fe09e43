//! The token node: [`TokenService`] over an in-memory token store behind a write-ahead log.
//! Mutating calls (revoke, one-time issue and consume, purge) are applied, logged with their
//! inputs, made durable, and only then acknowledged — and only then recorded as acknowledged in
//! the history (`RevokeAck`, `OnceConsumeOk`), which is what the `tokens.*` checkers judge.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use madsim::rand::Rng;
use madsim::task::spawn;
use sut::clock::Now;
use sut::journal::Record;
use sut::token::check::TokenEvent;
use sut::token::jwt::{Rejection, SigningKey};
use sut::token::once::OnceConsume;
use sut::token::rows::TokenStoreError;
use sut::token::rows::{OnceKey, OnceRejection, OnceToken};
use sut::token::store::MemoryTokenStore;
use sut::token::{ActivityKey, TokenConfig, TokenService, UserId};

use super::{GroupCommit, commit};
use crate::clock::sleep_ms;
use crate::history::{Answer, EventKind, Op, Outcome};
use crate::net::{Ctx, Inbox, Msg};
use crate::world::TokenRec;

/// One-time token window in the simulation (seed: one hour; shortened so windows turn over
/// within a run).
pub const ONCE_WINDOW_MS: u64 = 2_000;

type Service = TokenService<MemoryTokenStore>;

fn service(flaw: Option<sut::flaw::Flaw>, buggify: &crate::buggify::Buggify) -> Service {
    let mut cfg = TokenConfig::default();
    cfg.once.window_ms = ONCE_WINDOW_MS;
    cfg.flaws = sut::flaw::token_flaws(flaw);
    if let Some(ttl_s) = buggify.jwt_ttl_s {
        cfg.jwt.ttl_s = ttl_s;
    }
    if let Some(rows_max) = buggify.token_rows_max {
        cfg.limits.revocations_max = rows_max;
        cfg.limits.once_tokens_max = rows_max;
        cfg.revocation.capacity = rows_max;
    }
    let key = SigningKey::new("sim", b"simulation-signing-key-32-bytes!!".to_vec())
        .expect("a 33-byte key");
    TokenService::new(cfg.clone(), key, MemoryTokenStore::new(cfg.limits))
        .expect("the default token config, its bounds perhaps shrunk")
}

/// A record is applied live, then logged; and again, in order, on recovery.
impl Record for TokenRec {
    type State = Service;

    fn replay_onto(&self, svc: &mut Service) {
        match self {
            TokenRec::Revoke { token, now } => {
                let _ = svc.revoke(token, *now);
            }
            TokenRec::IssueOnce {
                user,
                activity,
                nonce,
                now,
            } => {
                if let Some(activity) = ActivityKey::new(activity.clone()) {
                    let _ = svc.issue_once(UserId(*user), activity, *nonce, *now);
                }
            }
            TokenRec::ConsumeOnce { token, user, now } => {
                let _ = svc.consume_once(OnceToken(*token), UserId(*user), *now);
            }
            TokenRec::Purge { now } => {
                let _ = svc.purge_expired(*now);
            }
        }
    }
}

/// Purges expired tokens once a simulated second, durably (and, with self-checks on, checks
/// the service's and its store's invariants).
async fn purge_every_second(ctx: Ctx, svc: Arc<Mutex<Service>>) {
    let self_checks = super::self_checks(&ctx.world);
    loop {
        sleep_ms(1_000).await;
        let now = ctx.now();
        let pos = {
            let mut s = svc.lock().expect("token service");
            let rec = TokenRec::Purge { now };
            rec.replay_onto(&mut s);
            ctx.world.take_edges(&mut *s);
            if self_checks {
                assert_eq!(s.check_invariants(), Ok(()), "token service");
                assert_eq!(s.store().check_invariants(), Ok(()), "token store");
            }
            ctx.world.with(|w| w.disks.token.append(rec))
        };
        commit(&ctx.world, |d| &mut d.token, pos).await;
    }
}

/// Runs the token node.
pub async fn run(ctx: Ctx, mut inbox: Inbox) {
    let (records, torn, flaw, buggify) = ctx.world.with(|w| {
        let (records, torn) = w.disks.token.recover();
        (
            records,
            torn,
            w.spec.scenario.run.flaw,
            w.spec.buggify.clone(),
        )
    });
    ctx.world.count("crash.torn_records_discarded", torn);
    let svc = sut::journal::replay(service(flaw, &buggify), &records);
    let svc = Arc::new(Mutex::new(svc));

    spawn(purge_every_second(ctx.clone(), Arc::clone(&svc)));

    let group = GroupCommit::new(ctx.world.clone(), |d| &mut d.token);
    while let Some((msg, from)) = inbox.recv().await {
        let Msg::Request { op_id, op } = msg else {
            continue;
        };
        let reply = Reply {
            ctx: ctx.clone(),
            group: group.clone(),
            from,
            op_id,
        };
        if let Op::OnceConsume { token, user } = op {
            // The correct consume is one store operation and finishes here; a flawed
            // two-step one waits a store round trip between its steps, in its own task.
            let now = ctx.now();
            let mut consume = Box::pin(consume_once(
                ctx.clone(),
                Arc::clone(&svc),
                OnceToken(token),
                UserId(user),
                now,
            ));
            match (&mut consume).now_or_never() {
                Some(result) => reply.send(finish_consume(&ctx, token, user, now, result)),
                None => {
                    let ctx = ctx.clone();
                    spawn(async move {
                        let result = consume.await;
                        reply.send(finish_consume(&ctx, token, user, now, result));
                    });
                }
            }
        } else {
            reply.send(handle(&ctx, &svc, op));
        }
        ctx.world
            .take_edges(&mut *svc.lock().expect("token service"));
    }
}

/// An answer, now or once its log record is durable (then it also records the
/// acknowledgement in the history, after the sync and before the answer leaves).
enum Answered {
    Now(Outcome),
    Durable(Box<dyn FnOnce() -> Outcome + Send>),
}

/// Where an answer goes.
struct Reply {
    ctx: Ctx,
    group: GroupCommit,
    from: Arc<str>,
    op_id: u64,
}

impl Reply {
    fn send(self, answered: Answered) {
        let Self {
            ctx,
            group,
            from,
            op_id,
        } = self;
        match answered {
            Answered::Now(outcome) => ctx.send(&from, Msg::Response { op_id, outcome }),
            Answered::Durable(then) => group.then(move || {
                let outcome = then();
                ctx.send(&from, Msg::Response { op_id, outcome });
            }),
        }
    }
}

/// Appends `rec` to the token node's log (pending until the group commit syncs it).
fn log(ctx: &Ctx, rec: TokenRec) {
    ctx.world.with(|w| w.disks.token.append(rec));
}

fn handle(ctx: &Ctx, svc: &Arc<Mutex<Service>>, op: Op) -> Answered {
    let now: Now = ctx.now();
    match op {
        Op::JwtIssue { user } => jwt_issue(svc, user, now),
        Op::JwtVerify { token } => jwt_verify(ctx, svc, &token, now),
        Op::JwtRevoke { token } => jwt_revoke(ctx, svc, token, now),
        Op::OnceIssue { user, activity } => once_issue(ctx, svc, user, activity, now),
        other => Answered::Now(Outcome::Fail(format!(
            "the token node does not serve {other:?}"
        ))),
    }
}

/// Issues a JWT with a nonce from the RNG; answered at once (nothing is logged).
fn jwt_issue(svc: &Arc<Mutex<Service>>, user: u64, now: Now) -> Answered {
    let nonce: u128 = madsim::rand::thread_rng().r#gen();
    let issued = svc
        .lock()
        .expect("token service")
        .issue(UserId(user), nonce, now);
    Answered::Now(match issued {
        Ok(jwt) => Outcome::Ok(Answer::Jwt {
            token: jwt.token,
            jti: jwt.claims.jti,
        }),
        Err(err) => Outcome::Fail(err.to_string()),
    })
}

/// Verifies a JWT and records the verdict (counting rejections for a skewed clock).
fn jwt_verify(ctx: &Ctx, svc: &Arc<Mutex<Service>>, token: &str, now: Now) -> Answered {
    let invoked_at = ctx.world.with(|w| w.history.len() as u64);
    let verdict = svc.lock().expect("token service").verify(token, now);
    Answered::Now(match verdict {
        Ok(claims) => {
            ctx.record(|at| {
                EventKind::Token(TokenEvent::VerifyOk {
                    jti: claims.jti.clone(),
                    invoked_at,
                    at,
                })
            });
            Outcome::Ok(Answer::Verified)
        }
        Err(rejection) => {
            if matches!(
                rejection,
                Rejection::Expired { .. }
                    | Rejection::NotYetValid { .. }
                    | Rejection::Forgotten { .. }
            ) {
                ctx.world.count("token.skewed_rejections", 1);
            }
            ctx.record(|at| EventKind::Token(TokenEvent::VerifyRejected { jti: None, at }));
            Outcome::Fail(rejection.to_string())
        }
    })
}

/// Revokes a JWT; a revocation is logged and acknowledged once durable.
fn jwt_revoke(ctx: &Ctx, svc: &Arc<Mutex<Service>>, token: String, now: Now) -> Answered {
    let result = {
        let mut s = svc.lock().expect("token service");
        let result = s.revoke(&token, now);
        if result.is_ok() {
            log(
                ctx,
                TokenRec::Revoke {
                    token: token.clone(),
                    now,
                },
            );
        }
        result
    };
    match result {
        Ok(_) => {
            let ctx = ctx.clone();
            Answered::Durable(Box::new(move || {
                let jti = sut::token::jwt::unverified_jti(&token).unwrap_or_default();
                ctx.record(|at| EventKind::Token(TokenEvent::RevokeAck { jti, at }));
                Outcome::Ok(Answer::Revoked)
            }))
        }
        Err(err) => Answered::Now(Outcome::Fail(err.to_string())),
    }
}

/// Issues a one-time token with a nonce from the RNG; a fresh issue is logged and
/// acknowledged once durable, a repeated one at once.
fn once_issue(
    ctx: &Ctx,
    svc: &Arc<Mutex<Service>>,
    user: u64,
    activity: String,
    now: Now,
) -> Answered {
    let Some(activity_id) = ActivityKey::new(activity.clone()) else {
        return Answered::Now(Outcome::Fail(format!("bad activity `{activity}`")));
    };
    let nonce: u128 = madsim::rand::thread_rng().r#gen();
    let (result, fresh) = {
        let mut s = svc.lock().expect("token service");
        let result = s.issue_once(UserId(user), activity_id, nonce, now);
        let fresh = result.as_ref().is_ok_and(|issue| issue.fresh);
        if fresh {
            log(
                ctx,
                TokenRec::IssueOnce {
                    user,
                    activity,
                    nonce,
                    now,
                },
            );
        }
        (result, fresh)
    };
    match result {
        Ok(issue) => {
            let ctx = ctx.clone();
            let acknowledge = move || {
                ctx.record(|at| {
                    EventKind::Token(TokenEvent::OnceIssued {
                        token: issue.token,
                        at,
                    })
                });
                Outcome::Ok(Answer::Once(issue.token.0))
            };
            if fresh {
                Answered::Durable(Box::new(acknowledge))
            } else {
                Answered::Now(acknowledge())
            }
        }
        Err(err) => Answered::Now(Outcome::Fail(err.to_string())),
    }
}

/// Logs an accepted consume and answers once it is durable; a rejection is answered at once.
fn finish_consume(
    ctx: &Ctx,
    token: u128,
    user: u64,
    now: Now,
    result: Result<Result<OnceKey, OnceRejection>, TokenStoreError>,
) -> Answered {
    match result {
        Ok(Ok(_)) => {
            log(ctx, TokenRec::ConsumeOnce { token, user, now });
            let ctx = ctx.clone();
            Answered::Durable(Box::new(move || {
                ctx.record(|at| {
                    EventKind::Token(TokenEvent::OnceConsumeOk {
                        token: OnceToken(token),
                        at,
                    })
                });
                Outcome::Ok(Answer::Consumed)
            }))
        }
        Ok(Err(rejection)) => {
            ctx.record(|at| {
                EventKind::Token(TokenEvent::OnceConsumeRejected {
                    token: OnceToken(token),
                    at,
                })
            });
            Answered::Now(Outcome::Fail(rejection.to_string()))
        }
        Err(err) => Answered::Now(Outcome::Fail(err.to_string())),
    }
}

/// Drives one consume's store operations; a flawed two-step consume lets other requests run
/// between its check and its delete (a store round trip), the correct one-step path does not.
async fn consume_once(
    ctx: Ctx,
    svc: Arc<Mutex<Service>>,
    token: OnceToken,
    user: UserId,
    now: Now,
) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
    let flaws = svc.lock().expect("token service").flaws();
    let mut consume = OnceConsume::new(token, user, now, flaws);
    // Bounded: a consume takes at most two operations.
    for step in 0..2 {
        if step > 0 {
            ctx.world.count("token.two_step_gaps", 1);
            sleep_ms(1).await;
        }
        let Some(op) = consume.poll_op() else { break };
        let answer = {
            let mut s = svc.lock().expect("token service");
            let answer = s.apply_once_op(op);
            ctx.world.take_edges(&mut *s);
            answer?
        };
        consume
            .handle_op_result(answer)
            .map_err(|e| TokenStoreError::Backend(e.to_string()))?;
        if consume.outcome().is_some() {
            break;
        }
    }
    consume
        .outcome()
        .cloned()
        .ok_or_else(|| TokenStoreError::Backend("consume did not finish".to_owned()))
}
