//! The token node: [`TokenService`] over an in-memory token store behind a write-ahead log.
//! Mutating calls (revoke, one-time issue and consume, purge) are applied, logged with their
//! inputs, made durable, and only then acknowledged — and only then recorded as acknowledged in
//! the history (`RevokeAck`, `OnceConsumeOk`), which is what the `tokens.*` checkers judge.

use std::sync::{Arc, Mutex};

use madsim::rand::Rng;
use madsim::task::spawn;
use sut::clock::Now;
use sut::token::check::TokenEvent;
use sut::token::jwt::{Rejection, SigningKey};
use sut::token::once::{OnceConsume, OnceKey, OnceRejection, OnceToken};
use sut::token::store::MemoryTokenStore;
use sut::token::store::TokenStoreError;
use sut::token::{ActivityId, TokenConfig, TokenService, UserId};

use super::{commit, sleep_ms};
use crate::history::{Answer, EventKind, Op, Outcome};
use crate::net::{Ctx, Inbox, Msg};
use crate::world::TokenRec;

/// One-time token window in the simulation (seed: one hour; shortened so windows turn over
/// within a run).
pub const ONCE_WINDOW_MS: u64 = 2_000;

type Service = TokenService<MemoryTokenStore>;

fn service(flaw: Option<sut::flaw::Flaw>) -> Service {
    let mut cfg = TokenConfig::default();
    cfg.once.window_ms = ONCE_WINDOW_MS;
    cfg.flaws = sut::flaw::token_flaws(flaw);
    let key = SigningKey::new("sim", b"simulation-signing-key-32-bytes!!".to_vec())
        .expect("a 33-byte key");
    TokenService::new(cfg.clone(), key, MemoryTokenStore::new(cfg.limits))
        .expect("default token config")
}

fn apply(svc: &mut Service, rec: &TokenRec) {
    match rec {
        TokenRec::Revoke { token, now } => {
            let _ = svc.revoke(token, *now);
        }
        TokenRec::IssueOnce {
            user,
            activity,
            nonce,
            now,
        } => {
            if let Some(activity) = ActivityId::new(activity.clone()) {
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

/// Runs the token node.
pub async fn run(ctx: Ctx, mut inbox: Inbox) {
    let (records, torn, flaw) = ctx.world.with(|w| {
        let (records, torn) = w.disks.token.recover();
        (records, torn, w.spec.scenario.run.flaw)
    });
    ctx.world.count("crash.torn_records_discarded", torn);
    let mut svc = service(flaw);
    for rec in &records {
        apply(&mut svc, rec);
    }
    let svc = Arc::new(Mutex::new(svc));

    let purger = {
        let (ctx, svc) = (ctx.clone(), Arc::clone(&svc));
        async move {
            loop {
                sleep_ms(1_000).await;
                let now = ctx.now();
                let pos = {
                    let mut s = svc.lock().expect("token service");
                    let rec = TokenRec::Purge { now };
                    apply(&mut s, &rec);
                    ctx.world.with(|w| w.disks.token.append(rec))
                };
                commit(&ctx.world, |d| &mut d.token, pos).await;
            }
        }
    };
    spawn(purger);

    while let Some((msg, from)) = inbox.recv().await {
        let Msg::Request { op_id, op } = msg else {
            continue;
        };
        let (ctx, svc) = (ctx.clone(), Arc::clone(&svc));
        spawn(async move {
            let outcome = handle(&ctx, &svc, op).await;
            ctx.send(&from, Msg::Response { op_id, outcome });
        });
    }
}

/// Applies `rec`, logs it, and returns its log position.
fn log(ctx: &Ctx, rec: TokenRec) -> u64 {
    ctx.world.with(|w| w.disks.token.append(rec))
}

async fn handle(ctx: &Ctx, svc: &Arc<Mutex<Service>>, op: Op) -> Outcome {
    let now: Now = ctx.now();
    match op {
        Op::JwtIssue { user } => {
            let nonce: u128 = madsim::rand::thread_rng().r#gen();
            let issued = svc
                .lock()
                .expect("token service")
                .issue(UserId(user), nonce, now);
            match issued {
                Ok(jwt) => Outcome::Ok(Answer::Jwt {
                    token: jwt.token,
                    jti: jwt.claims.jti,
                }),
                Err(err) => Outcome::Fail(err.to_string()),
            }
        }
        Op::JwtVerify { token } => {
            let invoked_at = ctx.world.with(|w| w.history.len() as u64);
            let verdict = svc.lock().expect("token service").verify(&token, now);
            match verdict {
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
                        Rejection::Expired { .. } | Rejection::NotYetValid { .. }
                    ) {
                        ctx.world.count("token.skewed_rejections", 1);
                    }
                    ctx.record(|at| EventKind::Token(TokenEvent::VerifyRejected { jti: None, at }));
                    Outcome::Fail(rejection.to_string())
                }
            }
        }
        Op::JwtRevoke { token } => {
            let (result, pos) = {
                let mut s = svc.lock().expect("token service");
                let result = s.revoke(&token, now);
                let pos = if result.is_ok() {
                    log(
                        ctx,
                        TokenRec::Revoke {
                            token: token.clone(),
                            now,
                        },
                    )
                } else {
                    0
                };
                (result, pos)
            };
            match result {
                Ok(_) => {
                    commit(&ctx.world, |d| &mut d.token, pos).await;
                    let jti = sut::token::jwt::unverified_jti(&token).unwrap_or_default();
                    ctx.record(|at| EventKind::Token(TokenEvent::RevokeAck { jti, at }));
                    Outcome::Ok(Answer::Revoked)
                }
                Err(err) => Outcome::Fail(err.to_string()),
            }
        }
        Op::OnceIssue { user, activity } => {
            let Some(activity_id) = ActivityId::new(activity.clone()) else {
                return Outcome::Fail(format!("bad activity `{activity}`"));
            };
            let nonce: u128 = madsim::rand::thread_rng().r#gen();
            let (result, pos) = {
                let mut s = svc.lock().expect("token service");
                let result = s.issue_once(UserId(user), activity_id, nonce, now);
                let fresh = result.as_ref().is_ok_and(|issue| issue.fresh);
                let pos = if fresh {
                    log(
                        ctx,
                        TokenRec::IssueOnce {
                            user,
                            activity,
                            nonce,
                            now,
                        },
                    )
                } else {
                    0
                };
                (result, pos)
            };
            match result {
                Ok(issue) => {
                    if pos > 0 {
                        commit(&ctx.world, |d| &mut d.token, pos).await;
                    }
                    ctx.record(|at| {
                        EventKind::Token(TokenEvent::OnceIssued {
                            token: issue.token,
                            at,
                        })
                    });
                    Outcome::Ok(Answer::Once(issue.token.0))
                }
                Err(err) => Outcome::Fail(err.to_string()),
            }
        }
        Op::OnceConsume { token, user } => {
            let result = consume_once(ctx, svc, OnceToken(token), UserId(user), now).await;
            let (result, pos) = {
                let accepted = matches!(result, Ok(Ok(_)));
                let pos = if accepted {
                    log(ctx, TokenRec::ConsumeOnce { token, user, now })
                } else {
                    0
                };
                (result, pos)
            };
            match result {
                Ok(Ok(_)) => {
                    commit(&ctx.world, |d| &mut d.token, pos).await;
                    ctx.record(|at| {
                        EventKind::Token(TokenEvent::OnceConsumeOk {
                            token: OnceToken(token),
                            at,
                        })
                    });
                    Outcome::Ok(Answer::Consumed)
                }
                Ok(Err(rejection)) => {
                    ctx.record(|at| {
                        EventKind::Token(TokenEvent::OnceConsumeRejected {
                            token: OnceToken(token),
                            at,
                        })
                    });
                    Outcome::Fail(format!("{rejection:?}"))
                }
                Err(err) => Outcome::Fail(err.to_string()),
            }
        }
        other => Outcome::Fail(format!("the token node does not serve {other:?}")),
    }
}

/// Drives one consume's store operations; a flawed two-step consume lets other requests run
/// between its check and its delete (a store round trip), the correct one-step path does not.
async fn consume_once(
    ctx: &Ctx,
    svc: &Arc<Mutex<Service>>,
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
        let answer = svc.lock().expect("token service").apply_once_op(op)?;
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
