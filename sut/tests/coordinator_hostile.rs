//! The coordinator against hostile participants and a hostile log: replies late, twice, for
//! the wrong phase or draw, misaddressed, contradicting themselves; log writes acknowledged in
//! any order, and entries acknowledged that it never asked to write (a stale record with other
//! arguments, a verdict it did not decide, a `Finished` it did not reach); time jumping ahead. The properties are the coordinator's own promises, checked by
//! a referee that sees only what crosses its boundary (log writes asked for and acknowledged,
//! messages sent, replies delivered, outcome events):
//!
//! - no Try before the draw's `Begin` is durable;
//! - one verdict per draw; Confirm only when every branch answered its Try with success;
//! - no Confirm or Cancel before the verdict is durable, and only the verdict's phase;
//! - `Finished` only when every branch acknowledged the verdict; a final outcome only after
//!   `Finished` is durable, at most one per draw, and the outcome the verdict says;
//! - `draws()` lists exactly the draws `stage` knows, never one with a final outcome;
//! - `poll_timeout` announces every timeout's work no later than it is due, and never a
//!   deadline already served;
//! - the pacing: at most `attempts_max` sends per branch and round, each after the previous
//!   one's reply timeout; a round runs out only once a branch's last attempt timed out; a parked
//!   draw's next round starts when due (park delay, then the wheel's backoff) and no later than
//!   the first timeout after it, Cancels first within a tick; dead-lettered exactly past the
//!   retry budget; a round the driver slept through fails within `round_ms_max` of being due;
//! - the coordinator's edge states counted exactly when the step reached them (a duplicate or
//!   late reply, a repeated Try that landed, a timed-out Try, a park, a parked draw completed, a
//!   dead letter), so that a sweep's coverage report can be trusted;
//! - the coordinator's own invariants after every step.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use sut::clock::Now;
use sut::edge::{Edge, EdgeCounts, Observed as _};
use sut::lottery::coordinator::{
    DEAD_LETTERED, DUPLICATE_REPLY, DUPLICATE_TRY_LANDED, PARKED, PARKED_DRAW_COMPLETED,
    REPLY_AFTER_VERDICT, TRY_TIMED_OUT,
};
use sut::lottery::{
    ActivityId, CancelReason, Coordinator, CoordinatorConfig, CoordinatorError, DrawArgs,
    DrawEvent, DrawOutcome, DrawStage, Effect, FenceStatus, LogEntry, Participant, ParticipantMsg,
    ParticipantReply, Phase, Refusal, UserId, Verdict, Xid,
};

const DRAWS: u64 = 4;

fn draw(xid: u64) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(xid),
        activity: ActivityId(1),
        price_minor: 10,
        won: xid.is_multiple_of(2),
    }
}

fn at(mono_ms: u64) -> Now {
    Now {
        wall_ms: 1_000_000 + mono_ms,
        mono_ms,
    }
}

/// What the referee saw cross the coordinator's boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// The coordinator asked for this entry to be written.
    LogAsked(LogEntry),
    /// The driver acknowledged this entry as durable.
    LogDurable(LogEntry),
    /// The coordinator sent this message.
    Sent(Participant, ParticipantMsg),
    /// This reply was delivered to it (as coming from the first participant).
    Delivered(Participant, ParticipantReply),
    /// It reported this outcome.
    Event(DrawEvent),
}

/// Checks the promises on the boundary traffic, one observation at a time.
#[derive(Default)]
struct Referee {
    /// Every entry the coordinator asked to write: only those count when acknowledged.
    asked_entries: BTreeSet<LogEntry>,
    begun: BTreeSet<u64>,
    verdicts_asked: BTreeMap<u64, Verdict>,
    verdicts: BTreeMap<u64, Verdict>,
    /// Branches whose Try succeeded, as delivered replies said.
    tried: BTreeSet<(u64, Participant)>,
    /// Branches that acknowledged the phase of the durable verdict.
    acknowledged: BTreeSet<(u64, Participant)>,
    finished: BTreeSet<u64>,
    final_events: BTreeSet<u64>,
}

impl Referee {
    fn see(&mut self, seen: &Seen) -> Result<(), String> {
        match seen {
            Seen::LogAsked(entry) => {
                self.asked_entries.insert(*entry);
                self.asked(entry)
            }
            Seen::LogDurable(entry) => {
                if !self.asked_entries.contains(entry) {
                    // Acknowledged but never asked for: the coordinator must ignore it.
                    return Ok(());
                }
                match *entry {
                    LogEntry::Begin(d) => {
                        self.begun.insert(d.xid.0);
                    }
                    LogEntry::Decided { xid, verdict } => {
                        self.verdicts.insert(xid.0, verdict);
                    }
                    LogEntry::Finished { xid } => {
                        self.finished.insert(xid.0);
                    }
                }
                Ok(())
            }
            Seen::Sent(to, msg) => self.sent(*to, msg),
            Seen::Delivered(from, reply) => {
                self.delivered(*from, reply);
                Ok(())
            }
            Seen::Event(event) => self.event(event),
        }
    }

    fn asked(&mut self, entry: &LogEntry) -> Result<(), String> {
        match *entry {
            LogEntry::Begin(_) => Ok(()),
            LogEntry::Decided { xid, verdict } => {
                let x = xid.0;
                if let Some(first) = self.verdicts_asked.insert(x, verdict)
                    && first != verdict
                {
                    return Err(format!("draw {x}: verdict {verdict:?} after {first:?}"));
                }
                let untried: Vec<_> = draw(x)
                    .branches()
                    .filter(|b| !self.tried.contains(&(x, *b)))
                    .collect();
                if verdict == Verdict::Confirm && !untried.is_empty() {
                    return Err(format!(
                        "draw {x}: Confirm decided though {untried:?} never answered its Try with \
                         success"
                    ));
                }
                Ok(())
            }
            LogEntry::Finished { xid } => {
                let x = xid.0;
                let missing: Vec<_> = draw(x)
                    .branches()
                    .filter(|b| !self.acknowledged.contains(&(x, *b)))
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "draw {x}: Finished though {missing:?} never acknowledged the verdict"
                    ))
                }
            }
        }
    }

    fn sent(&self, to: Participant, msg: &ParticipantMsg) -> Result<(), String> {
        let x = msg.draw.xid.0;
        if !msg.draw.has_branch(to) {
            return Err(format!(
                "draw {x}: a message to {to:?}, which it has no branch on"
            ));
        }
        if msg.phase == Phase::Try {
            return if self.begun.contains(&x) {
                Ok(())
            } else {
                Err(format!("draw {x}: a Try before its Begin was durable"))
            };
        }
        match self.verdicts.get(&x) {
            Some(v) if v.phase() == msg.phase => Ok(()),
            Some(v) => Err(format!("draw {x}: a {:?} after verdict {v:?}", msg.phase)),
            None => Err(format!(
                "draw {x}: a {:?} before its verdict was durable",
                msg.phase
            )),
        }
    }

    fn delivered(&mut self, from: Participant, reply: &ParticipantReply) {
        let x = reply.draw.xid.0;
        let genuine = from == reply.branch && reply.draw == draw(x);
        if !genuine {
            return;
        }
        let success = match &reply.outcome {
            Ok(_) => true,
            Err(Refusal::TryFenced { existing }) => *existing == FenceStatus::Tried,
            Err(_) => false,
        };
        if reply.phase == Phase::Try && success && !self.verdicts_asked.contains_key(&x) {
            self.tried.insert((x, from));
        }
        let acknowledges = self
            .verdicts
            .get(&x)
            .is_some_and(|v| v.phase() == reply.phase && reply.outcome.is_ok());
        if acknowledges {
            self.acknowledged.insert((x, from));
        }
    }

    fn event(&mut self, event: &DrawEvent) -> Result<(), String> {
        let x = event.draw.xid.0;
        let want = match event.outcome {
            DrawOutcome::Confirmed { .. } => Verdict::Confirm,
            DrawOutcome::Cancelled { ref reason } => {
                explained(x, reason)?;
                Verdict::Cancel
            }
            DrawOutcome::Parked { verdict } | DrawOutcome::DeadLettered { verdict } => {
                return match self.verdicts.get(&x) {
                    Some(v) if *v == verdict => Ok(()),
                    other => Err(format!(
                        "draw {x}: parked with {verdict:?}, logged {other:?}"
                    )),
                };
            }
        };
        if !self.final_events.insert(x) {
            return Err(format!(
                "draw {x}: a second final outcome {:?}",
                event.outcome
            ));
        }
        if !self.finished.contains(&x) {
            return Err(format!(
                "draw {x}: outcome {:?} before Finished was durable",
                event.outcome
            ));
        }
        match self.verdicts.get(&x) {
            Some(v) if *v == want => Ok(()),
            other => Err(format!(
                "draw {x}: outcome {:?} but the verdict logged is {other:?}",
                event.outcome
            )),
        }
    }
}

/// A cancelled draw's reason, as an operator or a client reads it, says what happened and names
/// the branch at fault.
fn explained(x: u64, reason: &CancelReason) -> Result<(), String> {
    let text = reason.to_string();
    let names_branch = match reason {
        CancelReason::TryRefused { branch, .. } | CancelReason::TryTimedOut { branch } => {
            text.contains(&branch.to_string())
        }
        CancelReason::Recovered => true,
    };
    if text.len() > 20 && names_branch {
        Ok(())
    } else {
        Err(format!("draw {x}: cancel reason {reason:?} reads {text:?}"))
    }
}

/// What the hostile environment does next.
#[derive(Clone, Debug)]
enum Action {
    /// Acknowledge the `n`-th pending log write (modulo their number) as durable.
    Write(usize),
    /// Answer the `n`-th message ever sent (modulo), maybe as another phase, another
    /// participant or another draw, with `answer`.
    Answer {
        n: usize,
        answer: Answer,
        twist: Twist,
    },
    /// Let `ms` pass and fire what is due.
    Wait(u64),
    /// Sleep until the coordinator's own next deadline and fire it, as a driver does.
    Sleep,
    /// An operator retries draw `n` (modulo): allowed for a dead-lettered draw only.
    RetryDeadLetter(u64),
    /// Acknowledge as durable an entry for draw `n` (modulo) that was never asked for: a Begin
    /// with other arguments, a verdict, or a `Finished`.
    Forge { n: u64, kind: u8 },
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Applied,
    AlreadyDone,
    EmptyRollback,
    Refused,
    FencedTried,
    /// The fence refused the Try because the branch was cancelled first: no success.
    FencedSuspended,
}

#[derive(Clone, Copy, Debug)]
enum Twist {
    None,
    OtherPhase,
    Misaddressed,
    OtherPrice,
}

fn action() -> impl Strategy<Value = Action> {
    let answer = prop_oneof![
        4 => Just(Answer::Applied),
        1 => Just(Answer::AlreadyDone),
        1 => Just(Answer::EmptyRollback),
        2 => Just(Answer::Refused),
        1 => Just(Answer::FencedTried),
        1 => Just(Answer::FencedSuspended),
    ];
    let twist = prop_oneof![
        6 => Just(Twist::None),
        1 => Just(Twist::OtherPhase),
        1 => Just(Twist::Misaddressed),
        1 => Just(Twist::OtherPrice),
    ];
    prop_oneof![
        4 => (0usize..8).prop_map(Action::Write),
        6 => (0usize..64, answer, twist).prop_map(|(n, answer, twist)| Action::Answer { n, answer, twist }),
        2 => (1u64..2_000).prop_map(Action::Wait),
        2 => Just(Action::Sleep),
        1 => (0u64..DRAWS).prop_map(Action::RetryDeadLetter),
        1 => (0u64..DRAWS, 0u8..4).prop_map(|(n, kind)| Action::Forge { n, kind }),
    ]
}

/// `base_ms` doubled `doublings` times, capped at `cap_ms`: the referee's own arithmetic for the
/// reply timeouts and the round backoffs, from the configuration's numbers and not the
/// coordinator's or the wheel's.
fn doubled_capped_ms(base_ms: u64, doublings: u32, cap_ms: u64) -> u64 {
    let doubled = 1_u64
        .checked_shl(doublings)
        .and_then(|factor| base_ms.checked_mul(factor));
    doubled.map_or(cap_ms, |ms| ms.min(cap_ms))
}

/// How long attempt `attempt` (0-based) waits for its reply.
fn reply_timeout_ms(config: &CoordinatorConfig, attempt: u32) -> u64 {
    doubled_capped_ms(config.reply_timeout_ms, attempt, config.backoff_ms_max)
}

/// How long a parked draw waits after its `failures`-th failed round (1-based).
fn round_backoff_ms(config: &CoordinatorConfig, failures: u32) -> u64 {
    let wheel = &config.wheel;
    doubled_capped_ms(wheel.backoff_base_ms, failures - 1, wheel.backoff_cap_ms)
}

/// One branch's current round: the phase it carries and when each of its sends went out (ms).
struct Round {
    phase: Phase,
    sent_ms: Vec<u64>,
}

/// A draw's compensation task as seen from outside: rounds failed since it was scheduled, and
/// when its next round is due (ms).
#[derive(Clone, Copy, Debug)]
struct Schedule {
    failures: u32,
    due_ms: u64,
}

/// The pacing a driver relies on, checked from outside (stage changes and sends): every round
/// gives each branch at most `attempts_max` sends, each no earlier than the previous one's reply
/// timeout; a round runs out only when some branch had all of them and the last one timed out;
/// a parked draw's next round starts when it is due (the park delay, then the wheel's backoff
/// per failed round, at once for a retried dead letter) and at the first timeout after that,
/// the Cancels first among rounds due in the same tick; a draw is dead-lettered exactly when
/// its round fails past the retry budget.
#[derive(Default)]
struct Pacing {
    stages: BTreeMap<Xid, DrawStage>,
    rounds: BTreeMap<(Xid, Participant), Round>,
    scheduled: BTreeMap<Xid, Schedule>,
    /// When each compensation round in progress was due (ms), while the driver has slept until
    /// every deadline since (no `Wait` jumped past one): such a round fails within
    /// `round_ms_max` of being due, the bound the dead-letter-after-heal check allows.
    punctual: BTreeMap<Xid, u64>,
    /// Coverage: punctual compensation rounds that failed.
    punctual_failures: u32,
    /// Coverage: rounds of both verdicts started by one timeout, due in the same tick.
    ties: u32,
    /// Coverage: compensation rounds that failed and were retried after a backoff.
    backoffs: u32,
    /// The branches the coordinator counts as done: answered their Try with success while
    /// trying, then (once the verdict is durable) acknowledged the verdict's phase.
    done: BTreeSet<(Xid, Participant)>,
    /// The coordinator's edge states this step must count, and how often.
    edges: BTreeMap<&'static str, u64>,
}

impl Pacing {
    fn expect(&mut self, edge: &Edge) {
        *self.edges.entry(edge.name).or_insert(0) += 1;
    }

    fn new_round(&mut self, xid: Xid, phase: Phase) {
        for branch in draw(xid.0).branches() {
            self.rounds.insert(
                (xid, branch),
                Round {
                    phase,
                    sent_ms: Vec::new(),
                },
            );
        }
    }

    /// A round of `xid` ran out at `now_ms`: some branch had every attempt, the last timed out.
    fn ran_out(&self, xid: Xid, config: &CoordinatorConfig, now_ms: u64) -> Result<(), String> {
        let last = config.attempts_max - 1;
        let exhausted = draw(xid.0).branches().any(|branch| {
            self.rounds.get(&(xid, branch)).is_some_and(|round| {
                round.sent_ms.len() == config.attempts_max as usize
                    && round
                        .sent_ms
                        .last()
                        .is_some_and(|sent| now_ms >= sent + reply_timeout_ms(config, last))
            })
        });
        if exhausted {
            Ok(())
        } else {
            let rounds: Vec<_> = draw(xid.0)
                .branches()
                .map(|b| (b, self.rounds.get(&(xid, b)).map(|r| r.sent_ms.clone())))
                .collect();
            Err(format!(
                "{xid:?} gave up at {now_ms} ms with no branch out of attempts: {rounds:?}"
            ))
        }
    }

    /// A punctual compensation round of `xid` that failed at `now_ms` did so within
    /// `round_ms_max` of being due.
    fn within_a_round(
        &mut self,
        xid: Xid,
        config: &CoordinatorConfig,
        now_ms: u64,
    ) -> Result<(), String> {
        let Some(due_ms) = self.punctual.remove(&xid) else {
            return Ok(());
        };
        self.punctual_failures += 1;
        let round_ms_max = config.round_ms_max();
        if now_ms - due_ms <= round_ms_max {
            Ok(())
        } else {
            Err(format!(
                "{xid:?}: a round due at {due_ms} ms failed at {now_ms} ms, past round_ms_max \
                 {round_ms_max} ms"
            ))
        }
    }

    /// A round of `xid` failed (`now` stage `after`): the first park waits the park delay, each
    /// later failure the wheel's backoff, and the one past the budget dead-letters the draw.
    fn failed(
        &mut self,
        xid: Xid,
        after: DrawStage,
        config: &CoordinatorConfig,
        now_ms: u64,
    ) -> Result<(), String> {
        let (failures, delay_ms) = match self.scheduled.get(&xid) {
            None => (0, config.park_delay_ms),
            Some(s) => (s.failures + 1, round_backoff_ms(config, s.failures + 1)),
        };
        let dead = failures > config.compensation_retries_max;
        match (after, dead) {
            (DrawStage::Parked(_), false) => {
                if failures == 0 {
                    self.expect(&PARKED);
                }
                self.backoffs += u32::from(failures > 0);
                let due_ms = now_ms + delay_ms;
                self.scheduled.insert(xid, Schedule { failures, due_ms });
                Ok(())
            }
            (DrawStage::DeadLettered(_), true) => {
                self.expect(&DEAD_LETTERED);
                self.scheduled.remove(&xid);
                Ok(())
            }
            _ => Err(format!(
                "{xid:?}: after {failures} failed rounds (budget {}) it is {after:?}",
                config.compensation_retries_max
            )),
        }
    }

    /// Compares the stages after a step with those before it; `timeout` says the step was a
    /// timeout at `now_ms`.
    fn step(
        &mut self,
        coordinator: &Coordinator,
        sends: &[(Participant, ParticipantMsg)],
        timeout: bool,
        now_ms: u64,
    ) -> Result<(), String> {
        let config = *coordinator.config();
        let tick_ms = config.wheel.tick_ms;
        let mut started = Vec::new();
        for xid in (1..=DRAWS).map(Xid) {
            let before = self.stages.get(&xid).copied();
            let after = coordinator.stage(xid);
            match (before, after) {
                (Some(DrawStage::Parked(_)), Some(DrawStage::Finishing(verdict))) => {
                    let due_ms = self.scheduled[&xid].due_ms;
                    if now_ms < due_ms {
                        return Err(format!(
                            "{xid:?}: a round at {now_ms} ms, due at {due_ms} ms"
                        ));
                    }
                    started.push((xid, verdict, due_ms.div_ceil(tick_ms)));
                    // Started in the tick it was due (a `Wait` may jump past that).
                    if now_ms <= due_ms.div_ceil(tick_ms) * tick_ms {
                        self.punctual.insert(xid, due_ms);
                    }
                    self.new_round(xid, verdict.phase());
                }
                (before, Some(DrawStage::Trying)) if before != Some(DrawStage::Trying) => {
                    self.new_round(xid, Phase::Try);
                }
                (before, Some(DrawStage::Finishing(verdict)))
                    if !matches!(before, Some(DrawStage::Finishing(_))) =>
                {
                    // The verdict is durable: every branch is to acknowledge it afresh.
                    self.done.retain(|(x, _)| *x != xid);
                    self.new_round(xid, verdict.phase());
                }
                (Some(DrawStage::Trying), Some(DrawStage::LoggingVerdict(Verdict::Cancel)))
                    if timeout =>
                {
                    self.ran_out(xid, &config, now_ms)?;
                    self.expect(&TRY_TIMED_OUT);
                }
                (
                    Some(DrawStage::Finishing(_)),
                    Some(after @ (DrawStage::Parked(_) | DrawStage::DeadLettered(_))),
                ) => {
                    self.ran_out(xid, &config, now_ms)?;
                    self.within_a_round(xid, &config, now_ms)?;
                    self.failed(xid, after, &config, now_ms)?;
                }
                (Some(DrawStage::DeadLettered(_)), Some(DrawStage::Parked(_))) => {
                    let due_ms = now_ms;
                    self.scheduled.insert(
                        xid,
                        Schedule {
                            failures: 0,
                            due_ms,
                        },
                    );
                }
                (Some(DrawStage::Parked(_)), Some(DrawStage::Parked(_))) if timeout => {
                    let due_ms = self.scheduled[&xid].due_ms;
                    if now_ms >= due_ms.div_ceil(tick_ms) * tick_ms {
                        return Err(format!(
                            "{xid:?}: its round due at {due_ms} ms has not started at {now_ms} ms"
                        ));
                    }
                }
                (_, None) => {
                    self.scheduled.remove(&xid);
                    self.punctual.remove(&xid);
                    self.done.retain(|(x, _)| *x != xid);
                }
                (_, Some(DrawStage::LoggingFinished(_))) => {
                    self.scheduled.remove(&xid);
                    self.punctual.remove(&xid);
                }
                _ => {}
            }
            match after {
                Some(stage) => self.stages.insert(xid, stage),
                None => self.stages.remove(&xid),
            };
        }
        self.cancels_first(&started, sends)?;
        for (to, msg) in sends {
            self.sent(*to, msg, &config, now_ms)?;
        }
        Ok(())
    }

    /// The edge state a reply delivered in `stage` reaches, seen from outside (a stale,
    /// duplicate or misaddressed reply is ignored; a repeated Try refused as already tried
    /// proves the first landed; the last acknowledgement of a draw holding a compensation task
    /// or dead-lettered completes a parked draw; a Try reply after the verdict is late), and
    /// the branches it makes done.
    fn reply(&mut self, stage: Option<DrawStage>, from: Participant, reply: &ParticipantReply) {
        let xid = reply.draw.xid;
        if from != reply.branch {
            return;
        }
        let Some(stage) = stage else {
            return self.expect(&DUPLICATE_REPLY);
        };
        if reply.draw != draw(xid.0) || !reply.draw.has_branch(from) {
            return;
        }
        if self.done.contains(&(xid, from)) {
            return self.expect(&DUPLICATE_REPLY);
        }
        match stage {
            DrawStage::Trying if reply.phase == Phase::Try => match &reply.outcome {
                Ok(_) => {
                    self.done.insert((xid, from));
                }
                Err(Refusal::TryFenced {
                    existing: FenceStatus::Tried,
                }) => {
                    self.done.insert((xid, from));
                    self.expect(&DUPLICATE_TRY_LANDED);
                }
                Err(_) => {}
            },
            DrawStage::Finishing(v) | DrawStage::Parked(v) | DrawStage::DeadLettered(v)
                if reply.phase == v.phase() && reply.outcome.is_ok() =>
            {
                self.done.insert((xid, from));
                let all_done = draw(xid.0)
                    .branches()
                    .all(|b| self.done.contains(&(xid, b)));
                let held =
                    !matches!(stage, DrawStage::Finishing(_)) || self.scheduled.contains_key(&xid);
                if all_done && held {
                    self.expect(&PARKED_DRAW_COMPLETED);
                }
            }
            DrawStage::LoggingBegin | DrawStage::Trying => {}
            _ if reply.phase == Phase::Try => self.expect(&REPLY_AFTER_VERDICT),
            _ => {}
        }
    }

    /// The coordinator's edge counts since the last call equal what this step expected.
    fn edges_counted(&mut self, reached: &EdgeCounts) -> Result<(), String> {
        let want = std::mem::take(&mut self.edges);
        edges_agree(reached, &want)
    }

    /// Among rounds that one timeout started, due in the same tick, a Cancel's sends come first.
    fn cancels_first(
        &mut self,
        started: &[(Xid, Verdict, u64)],
        sends: &[(Participant, ParticipantMsg)],
    ) -> Result<(), String> {
        let first_send = |xid: Xid| sends.iter().position(|(_, m)| m.draw.xid == xid);
        for &(cancel, _, tick) in started.iter().filter(|s| s.1 == Verdict::Cancel) {
            for &(confirm, _, _) in started
                .iter()
                .filter(|s| s.1 == Verdict::Confirm && s.2 == tick)
            {
                self.ties += 1;
                if first_send(confirm) < first_send(cancel) {
                    return Err(format!(
                        "rounds due in tick {tick}: Confirm {confirm:?} sent before Cancel \
                         {cancel:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// One send: in its branch's round, of the round's phase, within the attempts, and no
    /// earlier than the previous send's reply timeout.
    fn sent(
        &mut self,
        to: Participant,
        msg: &ParticipantMsg,
        config: &CoordinatorConfig,
        now_ms: u64,
    ) -> Result<(), String> {
        let xid = msg.draw.xid;
        let Some(round) = self.rounds.get_mut(&(xid, to)) else {
            return Err(format!(
                "{xid:?}: a {:?} to {to:?} outside any round",
                msg.phase
            ));
        };
        let attempt = round.sent_ms.len();
        if msg.phase != round.phase || attempt >= config.attempts_max as usize {
            return Err(format!(
                "{xid:?}: {:?} to {to:?} as send {} of a {:?} round of at most {}",
                msg.phase,
                attempt + 1,
                round.phase,
                config.attempts_max
            ));
        }
        if let Some(&previous_ms) = round.sent_ms.last() {
            let timeout_ms = reply_timeout_ms(config, u32::try_from(attempt - 1).unwrap());
            if now_ms < previous_ms + timeout_ms {
                return Err(format!(
                    "{xid:?}: resent to {to:?} at {now_ms} ms, {previous_ms} + {timeout_ms} ms \
                     after the previous send"
                ));
            }
        }
        round.sent_ms.push(now_ms);
        Ok(())
    }
}

/// The coordinator's edge states in `got` (counts on this thread) are exactly `want`.
fn edges_agree(
    got: &BTreeMap<String, u64>,
    want: &BTreeMap<&'static str, u64>,
) -> Result<(), String> {
    let counted: BTreeMap<&str, u64> = got
        .iter()
        .filter(|(name, _)| name.starts_with("coordinator."))
        .map(|(name, n)| (name.as_str(), *n))
        .collect();
    let wanted: BTreeMap<&str, u64> = want.iter().map(|(name, n)| (*name, *n)).collect();
    if counted == wanted {
        Ok(())
    } else {
        Err(format!(
            "edge states counted {counted:?}, reached {wanted:?}"
        ))
    }
}

/// The coordinator, its environment's memory, and the referee.
struct Bench {
    coordinator: Coordinator,
    now_ms: u64,
    pending: Vec<LogEntry>,
    sent: Vec<(Participant, ParticipantMsg)>,
    referee: Referee,
    /// Dead-lettered draws an operator retried (for the coverage test).
    retried_dead_letters: u32,
    pacing: Pacing,
    /// The step being drained is a timeout.
    in_timeout: bool,
    /// The coordinator's edge states reached so far (for the coverage test).
    edges_reached: BTreeMap<&'static str, u64>,
}

impl Bench {
    fn new() -> Self {
        let config = CoordinatorConfig {
            attempts_max: 2,
            park_delay_ms: 50,
            compensation_retries_max: 1,
            ..CoordinatorConfig::default()
        };
        let mut bench = Self {
            coordinator: Coordinator::new(config).unwrap(),
            now_ms: 0,
            pending: Vec::new(),
            sent: Vec::new(),
            referee: Referee::default(),
            retried_dead_letters: 0,
            pacing: Pacing::default(),
            in_timeout: false,
            edges_reached: BTreeMap::new(),
        };
        for xid in 1..=DRAWS {
            bench.coordinator.start_draw(draw(xid), at(0)).unwrap();
        }
        bench
    }

    /// Drains what the coordinator asks for, through the referee; returns how many log writes,
    /// messages and events it produced.
    fn drain(&mut self) -> Result<usize, String> {
        let mut outputs = 0;
        while let Some(entry) = self.coordinator.poll_log_write() {
            self.referee.see(&Seen::LogAsked(entry))?;
            self.pending.push(entry);
            outputs += 1;
        }
        let mut sends = Vec::new();
        while let Some((to, msg)) = self.coordinator.poll_send() {
            self.referee.see(&Seen::Sent(to, msg))?;
            self.sent.push((to, msg));
            sends.push((to, msg));
            outputs += 1;
        }
        self.pacing
            .step(&self.coordinator, &sends, self.in_timeout, self.now_ms)?;
        while let Some(event) = self.coordinator.poll_event() {
            self.referee.see(&Seen::Event(event))?;
            outputs += 1;
        }
        self.coordinator.check_invariants()?;
        Ok(outputs)
    }

    /// Time passes to `now_ms`. The promises of `poll_timeout`, on which a driver that sleeps
    /// until it relies: work that a timeout at `now_ms` does was announced no later than
    /// `now_ms` (a driver sleeping until the deadline misses nothing), and once handled, the
    /// next deadline lies after `now_ms` (a driver never spins on a deadline already served).
    fn wait_until(&mut self, now_ms: u64) -> Result<(), String> {
        let due_ms = self.coordinator.poll_timeout();
        self.now_ms = now_ms;
        self.coordinator.handle_timeout(at(now_ms));
        self.in_timeout = true;
        let outputs = self.drain();
        self.in_timeout = false;
        let outputs = outputs?;
        if outputs > 0 && due_ms.is_none_or(|due| due > now_ms) {
            return Err(format!(
                "a timeout at {now_ms} ms did work ({outputs} outputs) that poll_timeout \
                 announced for {due_ms:?}"
            ));
        }
        match self.coordinator.poll_timeout() {
            Some(next_ms) if next_ms <= now_ms => Err(format!(
                "after a timeout at {now_ms} ms, poll_timeout still says {next_ms} ms"
            )),
            _ => Ok(()),
        }
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        let now = at(self.now_ms);
        match *action {
            Action::Write(n) => {
                if self.pending.is_empty() {
                    return Ok(());
                }
                let entry = self.pending.remove(n % self.pending.len());
                self.referee.see(&Seen::LogDurable(entry))?;
                self.coordinator.handle_log_written(&entry, now);
            }
            Action::Answer { n, answer, twist } => {
                if self.sent.is_empty() {
                    return Ok(());
                }
                let (to, msg) = self.sent[n % self.sent.len()];
                let (from, reply) = hostile_reply(to, &msg, answer, twist);
                self.referee.see(&Seen::Delivered(from, reply.clone()))?;
                let stage = self.coordinator.stage(reply.draw.xid);
                self.pacing.reply(stage, from, &reply);
                self.coordinator.handle_reply(from, &reply, now);
            }
            Action::Wait(ms) => {
                self.pacing.punctual.clear();
                self.wait_until(self.now_ms + ms)?;
            }
            Action::Sleep => {
                if let Some(due_ms) = self.coordinator.poll_timeout() {
                    self.wait_until(due_ms.max(self.now_ms))?;
                }
            }
            Action::RetryDeadLetter(n) => self.retry_dead_letter(Xid(1 + n % DRAWS))?,
            Action::Forge { n, kind } => {
                let xid = Xid(1 + n % DRAWS);
                let entry = match kind {
                    0 => LogEntry::Begin(DrawArgs {
                        price_minor: draw(xid.0).price_minor + 1,
                        ..draw(xid.0)
                    }),
                    1 => LogEntry::Decided {
                        xid,
                        verdict: Verdict::Confirm,
                    },
                    2 => LogEntry::Decided {
                        xid,
                        verdict: Verdict::Cancel,
                    },
                    _ => LogEntry::Finished { xid },
                };
                if self.referee.asked_entries.contains(&entry) {
                    return Ok(());
                }
                self.referee.see(&Seen::LogDurable(entry))?;
                self.coordinator.handle_log_written(&entry, now);
            }
        }
        self.drain()?;
        self.draws_listed()?;
        for (name, n) in &self.pacing.edges {
            *self.edges_reached.entry(name).or_insert(0) += n;
        }
        let reached = self.coordinator.edges();
        self.pacing.edges_counted(&reached)
    }

    /// The operator's retry: accepted exactly for a dead-lettered draw, which is then parked
    /// with the same verdict and its round due within a tick; refused otherwise, changing
    /// nothing.
    fn retry_dead_letter(&mut self, xid: Xid) -> Result<(), String> {
        let before = self.coordinator.stage(xid);
        let got = self
            .coordinator
            .handle_retry_dead_letter(xid, at(self.now_ms));
        let after = self.coordinator.stage(xid);
        match (before, got) {
            (Some(DrawStage::DeadLettered(verdict)), Ok(())) => {
                if after != Some(DrawStage::Parked(verdict)) {
                    return Err(format!("retried dead letter {xid:?} is {after:?}"));
                }
                self.retried_dead_letters += 1;
                let due_by_ms = self.now_ms + self.coordinator.config().wheel.tick_ms;
                match self.coordinator.poll_timeout() {
                    Some(due_ms) if due_ms <= due_by_ms => Ok(()),
                    due => Err(format!(
                        "retried dead letter {xid:?}: next deadline {due:?}, not by {due_by_ms}"
                    )),
                }
            }
            (before, Err(CoordinatorError::NotDeadLettered { xid: refused }))
                if refused == xid && !matches!(before, Some(DrawStage::DeadLettered(_))) =>
            {
                if after == before {
                    Ok(())
                } else {
                    Err(format!(
                        "a refused retry moved {xid:?} from {before:?} to {after:?}"
                    ))
                }
            }
            (before, got) => Err(format!("retry of {xid:?} in {before:?}: {got:?}")),
        }
    }

    /// The other views of the draws in flight agree with `draws()`: their count, their
    /// arguments, the parked and the dead-lettered ones, and the armed reply timers (earliest first, one per branch, only
    /// for draws in flight; the earliest is `poll_timeout` when no round is scheduled).
    fn views_agree(&self, listed: &[(Xid, DrawStage)]) -> Result<(), String> {
        let c = &self.coordinator;
        let parked: Vec<_> = listed
            .iter()
            .filter(|(_, s)| matches!(s, DrawStage::Parked(_)))
            .map(|(x, _)| *x)
            .collect();
        let dead: Vec<_> = listed
            .iter()
            .filter_map(|(x, s)| match s {
                DrawStage::DeadLettered(v) => Some((*x, *v)),
                _ => None,
            })
            .collect();
        let armed: Vec<_> = c.armed().collect();
        let in_flight = |x: &Xid| listed.iter().any(|(y, _)| y == x);
        let branches: BTreeSet<_> = armed.iter().map(|(_, x, b)| (*x, *b)).collect();
        let args_known =
            (1..=DRAWS).all(|x| c.draw(Xid(x)) == in_flight(&Xid(x)).then_some(draw(x)));
        let problem = if c.inflight() != listed.len() {
            format!(
                "inflight() {} for {} draws listed",
                c.inflight(),
                listed.len()
            )
        } else if !args_known {
            format!("draw() disagrees with the draws listed {listed:?}")
        } else if c.parked().collect::<Vec<_>>() != parked {
            format!("parked() disagrees with the stages {listed:?}")
        } else if c
            .dead_letters()
            .map(|(d, v)| (d.xid, v))
            .collect::<Vec<_>>()
            != dead
        {
            format!("dead_letters() disagrees with the stages {listed:?}")
        } else if !armed.is_sorted_by_key(|a| a.0)
            || branches.len() != armed.len()
            || !armed.iter().all(|(_, x, _)| in_flight(x))
        {
            format!("armed() {armed:?} for the draws {listed:?}")
        } else if parked.is_empty() && c.poll_timeout() != armed.first().map(|a| a.0) {
            format!("poll_timeout {:?} but armed() {armed:?}", c.poll_timeout())
        } else {
            return Ok(());
        };
        Err(problem)
    }

    /// `draws()` and `stage` agree, and a draw with a final outcome is no longer in flight.
    fn draws_listed(&self) -> Result<(), String> {
        let listed: Vec<_> = self.coordinator.draws().collect();
        let staged: Vec<_> = (1..=DRAWS)
            .filter_map(|x| self.coordinator.stage(Xid(x)).map(|s| (Xid(x), s)))
            .collect();
        if listed != staged {
            return Err(format!(
                "draws() lists {listed:?}, stage() knows {staged:?}"
            ));
        }
        self.views_agree(&listed)?;
        match listed
            .iter()
            .find(|(x, _)| self.referee.final_events.contains(&x.0))
        {
            Some((x, stage)) => Err(format!(
                "draw {}: still in flight ({stage:?}) after its final outcome",
                x.0
            )),
            None => Ok(()),
        }
    }
}

fn hostile_reply(
    to: Participant,
    msg: &ParticipantMsg,
    answer: Answer,
    twist: Twist,
) -> (Participant, ParticipantReply) {
    let outcome = match answer {
        Answer::Applied => Ok(Effect::Applied),
        Answer::AlreadyDone => Ok(Effect::AlreadyDone),
        Answer::EmptyRollback => Ok(Effect::EmptyRollback),
        Answer::Refused => Err(Refusal::ConfirmWithoutTry),
        Answer::FencedTried => Err(Refusal::TryFenced {
            existing: FenceStatus::Tried,
        }),
        Answer::FencedSuspended => Err(Refusal::TryFenced {
            existing: FenceStatus::Suspended,
        }),
    };
    let mut reply = ParticipantReply {
        branch: to,
        phase: msg.phase,
        draw: msg.draw,
        outcome,
    };
    let mut from = to;
    match twist {
        Twist::None => {}
        Twist::OtherPhase => {
            reply.phase = match msg.phase {
                Phase::Try => Phase::Confirm,
                Phase::Confirm => Phase::Cancel,
                Phase::Cancel => Phase::Try,
            };
        }
        Twist::Misaddressed => {
            from = match to {
                Participant::Wallet => Participant::Participation,
                _ => Participant::Wallet,
            };
        }
        Twist::OtherPrice => reply.draw.price_minor += 1,
    }
    (from, reply)
}

fn run(actions: &[Action]) -> Result<(), String> {
    let mut bench = Bench::new();
    bench.drain()?;
    for (i, action) in actions.iter().enumerate() {
        bench
            .act(action)
            .map_err(|e| format!("step {i} ({action:?}): {e}"))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0xC0_04D0),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn the_coordinator_keeps_its_promises_whatever_participants_and_the_log_do(
        actions in proptest::collection::vec(action(), 1..120)
    ) {
        prop_assert_eq!(run(&actions), Ok(()));
    }
}

#[test]
fn hostile_sequences_reach_both_verdicts_and_the_end_of_draws() {
    // Not vacuous: over the generated sequences, draws are confirmed, cancelled, parked and
    // finished.
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(action(), 1..120);
    let mut outcomes = BTreeSet::new();
    for _ in 0..512 {
        let actions = strategy.new_tree(&mut runner).unwrap().current();
        let mut bench = Bench::new();
        bench.drain().unwrap();
        for action in &actions {
            bench.act(action).unwrap();
        }
        for verdict in bench.referee.verdicts.values() {
            outcomes.insert(format!("verdict {verdict:?}"));
        }
        if !bench.referee.final_events.is_empty() {
            outcomes.insert("final event".to_owned());
        }
        if bench.coordinator.parked().next().is_some() {
            outcomes.insert("parked".to_owned());
        }
        if bench.retried_dead_letters > 0 {
            outcomes.insert("dead letter retried".to_owned());
        }
        if bench.pacing.ties > 0 {
            outcomes.insert("rounds of both verdicts due in one tick".to_owned());
        }
        if bench.pacing.backoffs > 0 {
            outcomes.insert("round retried after a backoff".to_owned());
        }
        if bench.pacing.punctual_failures > 0 {
            outcomes.insert("a punctual round failed".to_owned());
        }
        for name in bench.edges_reached.keys() {
            outcomes.insert((*name).to_owned());
        }
    }
    for want in [
        "verdict Confirm",
        "verdict Cancel",
        "final event",
        "parked",
        "dead letter retried",
        "rounds of both verdicts due in one tick",
        "round retried after a backoff",
        "a punctual round failed",
        DUPLICATE_REPLY.name,
        DUPLICATE_TRY_LANDED.name,
        REPLY_AFTER_VERDICT.name,
        TRY_TIMED_OUT.name,
        PARKED.name,
        PARKED_DRAW_COMPLETED.name,
        DEAD_LETTERED.name,
    ] {
        assert!(
            outcomes.contains(want),
            "never reached: {want} ({outcomes:?})"
        );
    }
}

// The referee fires on bad histories (each one a coordinator bug it must catch).

/// The histories below acknowledge only entries the coordinator asked for (asked before the
/// history starts, unless the history shows the asking).
fn referee_over(history: &[Seen]) -> Result<(), String> {
    let mut referee = Referee::default();
    for seen in history {
        if let Seen::LogDurable(entry) = seen {
            referee.asked_entries.insert(*entry);
        }
    }
    history.iter().try_for_each(|s| referee.see(s))
}

#[test]
fn the_referee_catches_a_try_after_a_begin_acknowledged_but_never_asked() {
    // A stale Begin of draw 1 with another price: the log never wrote what was asked.
    let stale = LogEntry::Begin(DrawArgs {
        price_minor: 11,
        ..draw(1)
    });
    let mut referee = Referee::default();
    let history = [
        Seen::LogAsked(LogEntry::Begin(draw(1))),
        Seen::LogDurable(stale),
        Seen::Sent(Participant::Wallet, try_msg(1)),
    ];
    let e = history.iter().try_for_each(|s| referee.see(s)).unwrap_err();
    assert!(e.contains("before its Begin was durable"), "{e}");
}

#[test]
fn the_draws_check_catches_a_listing_that_disagrees_with_stage() {
    let mut bench = Bench::new();
    bench.drain().unwrap();
    assert_eq!(bench.draws_listed(), Ok(()));
    // Draw 1 reported finished while the coordinator still has it in flight.
    bench.referee.final_events.insert(1);
    let e = bench.draws_listed().unwrap_err();
    assert!(e.contains("still in flight"), "{e}");
}

#[test]
fn the_pacing_check_catches_an_early_resend_an_extra_attempt_and_a_give_up_too_early_or_late() {
    let mut bench = Bench::new();
    bench.drain().unwrap();
    // Acknowledge the Begins until one draw is trying: its Trys went out at 0 ms.
    while bench.sent.is_empty() {
        bench.act(&Action::Write(0)).unwrap();
    }
    let (to, msg) = bench.sent[0];
    let config = *bench.coordinator.config();
    assert_eq!(
        (config.attempts_max, reply_timeout_ms(&config, 0)),
        (2, 100)
    );
    let resend = [(to, msg)];
    let e = bench
        .pacing
        .step(&bench.coordinator, &resend, true, 99)
        .unwrap_err();
    assert!(e.contains("resent to") && e.contains("0 + 100 ms"), "{e}");
    let e = bench
        .pacing
        .ran_out(msg.draw.xid, &config, 100)
        .unwrap_err();
    assert!(e.contains("no branch out of attempts"), "{e}");
    bench
        .pacing
        .step(&bench.coordinator, &resend, true, 100)
        .unwrap();
    let e = bench
        .pacing
        .step(&bench.coordinator, &resend, true, 300)
        .unwrap_err();
    assert!(e.contains("send 3 of a Try round of at most 2"), "{e}");
    // A round the driver slept through may not fail later than round_ms_max after it was due.
    let round_ms_max = config.round_ms_max();
    assert_eq!(round_ms_max, 1 + 100 + 200);
    for (failed_ms, fine) in [(round_ms_max, true), (round_ms_max + 1, false)] {
        bench.pacing.punctual.insert(msg.draw.xid, 0);
        let got = bench
            .pacing
            .within_a_round(msg.draw.xid, &config, failed_ms);
        assert_eq!(got.is_ok(), fine, "{got:?}");
    }
}

#[test]
fn the_edge_check_catches_counts_that_differ_from_what_the_step_reached() {
    let mut pacing = Pacing::default();
    let late = ParticipantReply {
        branch: Participant::Wallet,
        phase: Phase::Try,
        draw: draw(1),
        outcome: Ok(Effect::Applied),
    };
    // A reply for a draw no longer in flight is a duplicate.
    pacing.reply(None, Participant::Wallet, &late);
    let reached = BTreeMap::from([(DUPLICATE_REPLY.name, 1)]);
    assert_eq!(pacing.edges, reached);
    let counted = |n: u64| BTreeMap::from([(DUPLICATE_REPLY.name.to_owned(), n)]);
    assert_eq!(edges_agree(&counted(1), &reached), Ok(()));
    for wrong in [counted(0), counted(2), BTreeMap::new()] {
        let e = edges_agree(&wrong, &reached).unwrap_err();
        assert!(e.contains("coordinator.duplicate_reply"), "{e}");
    }
    let with_wheel = BTreeMap::from([
        (DUPLICATE_REPLY.name.to_owned(), 1),
        ("wheel.fired_late".to_owned(), 3),
    ]);
    assert_eq!(edges_agree(&with_wheel, &reached), Ok(()));
    let parked_too = BTreeMap::from([
        (DUPLICATE_REPLY.name.to_owned(), 1),
        (PARKED.name.to_owned(), 1),
    ]);
    assert!(edges_agree(&parked_too, &reached).is_err());
}

#[test]
fn the_views_check_catches_views_that_disagree_with_the_listing() {
    let mut bench = Bench::new();
    bench.drain().unwrap();
    let listed: Vec<_> = bench.coordinator.draws().collect();
    assert_eq!(bench.views_agree(&listed), Ok(()));
    let e = bench.views_agree(&listed[1..]).unwrap_err();
    assert!(e.contains("inflight()"), "{e}");
    let mut other = listed.clone();
    other[0].0 = Xid(DRAWS + 1);
    let e = bench.views_agree(&other).unwrap_err();
    assert!(e.contains("draw()"), "{e}");
    let mut parked = listed.clone();
    parked[0].1 = DrawStage::Parked(Verdict::Cancel);
    let e = bench.views_agree(&parked).unwrap_err();
    assert!(e.contains("parked()"), "{e}");
    let mut dead = listed;
    dead[0].1 = DrawStage::DeadLettered(Verdict::Cancel);
    let e = bench.views_agree(&dead).unwrap_err();
    assert!(e.contains("dead_letters()"), "{e}");
}

fn try_msg(xid: u64) -> ParticipantMsg {
    ParticipantMsg {
        phase: Phase::Try,
        draw: draw(xid),
    }
}

fn ok_reply(branch: Participant, phase: Phase, xid: u64) -> Seen {
    Seen::Delivered(
        branch,
        ParticipantReply {
            branch,
            phase,
            draw: draw(xid),
            outcome: Ok(Effect::Applied),
        },
    )
}

#[test]
fn the_referee_catches_a_try_sent_before_begin_is_durable() {
    let history = [
        Seen::LogAsked(LogEntry::Begin(draw(1))),
        Seen::Sent(Participant::Wallet, try_msg(1)),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("before its Begin was durable"), "{e}");
}

#[test]
fn the_referee_catches_a_confirm_decided_without_every_try() {
    let decided = LogEntry::Decided {
        xid: Xid(1),
        verdict: Verdict::Confirm,
    };
    let history = [
        Seen::LogDurable(LogEntry::Begin(draw(1))),
        ok_reply(Participant::Wallet, Phase::Try, 1),
        Seen::LogAsked(decided),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("Participation"), "{e}");
}

#[test]
fn the_referee_catches_a_confirm_sent_before_the_verdict_is_durable() {
    let history = [
        Seen::LogDurable(LogEntry::Begin(draw(1))),
        ok_reply(Participant::Wallet, Phase::Try, 1),
        ok_reply(Participant::Participation, Phase::Try, 1),
        Seen::LogAsked(LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Confirm,
        }),
        Seen::Sent(
            Participant::Wallet,
            ParticipantMsg {
                phase: Phase::Confirm,
                draw: draw(1),
            },
        ),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("before its verdict was durable"), "{e}");
}

#[test]
fn the_referee_catches_an_outcome_that_contradicts_the_verdict() {
    let history = [
        Seen::LogDurable(LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel,
        }),
        ok_reply(Participant::Wallet, Phase::Cancel, 1),
        ok_reply(Participant::Participation, Phase::Cancel, 1),
        Seen::LogAsked(LogEntry::Finished { xid: Xid(1) }),
        Seen::LogDurable(LogEntry::Finished { xid: Xid(1) }),
        Seen::Event(DrawEvent {
            draw: draw(1),
            outcome: DrawOutcome::Confirmed { won: false },
        }),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("verdict logged is Some(Cancel)"), "{e}");
}

#[test]
fn the_referee_catches_finished_before_every_acknowledgement_and_a_second_outcome() {
    let early = [
        Seen::LogDurable(LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel,
        }),
        ok_reply(Participant::Wallet, Phase::Cancel, 1),
        Seen::LogAsked(LogEntry::Finished { xid: Xid(1) }),
    ];
    let e = referee_over(&early).unwrap_err();
    assert!(e.contains("never acknowledged"), "{e}");
    let cancelled = || {
        Seen::Event(DrawEvent {
            draw: draw(1),
            outcome: DrawOutcome::Cancelled {
                reason: sut::lottery::CancelReason::Recovered,
            },
        })
    };
    let twice = [
        Seen::LogDurable(LogEntry::Decided {
            xid: Xid(1),
            verdict: Verdict::Cancel,
        }),
        Seen::LogDurable(LogEntry::Finished { xid: Xid(1) }),
        cancelled(),
        cancelled(),
    ];
    let e = referee_over(&twice).unwrap_err();
    assert!(e.contains("a second final outcome"), "{e}");
}

/// A hostile operator: every limit of the coordinator's configuration (and of its compensation
/// wheel's) refused just past its bound and accepted on it, so that a scenario or a server can
/// never run a coordinator whose timers or budgets are out of range.
#[test]
fn a_configuration_past_any_bound_is_refused_and_one_on_it_accepted() {
    use sut::lottery::wheel::{SLOTS_PER_LEVEL_MAX, TASKS_MAX_LIMIT, WheelConfig};
    type Edit = fn(&mut CoordinatorConfig);
    let accepted: [(&str, Edit); 7] = [
        ("inflight_max 1", |c| {
            c.inflight_max = 1;
        }),
        ("backoff_ms_max = reply_timeout_ms", |c| {
            c.backoff_ms_max = c.reply_timeout_ms;
        }),
        ("attempts_max 1", |c| c.attempts_max = 1),
        ("attempts_max 32", |c| c.attempts_max = 32),
        ("events_max 1", |c| c.events_max = 1),
        ("wheel.tasks_max = inflight_max", |c| {
            c.wheel.tasks_max = c.inflight_max;
        }),
        ("wheel: 2 slots", |c| c.wheel.slots_per_level = 2),
    ];
    let refused: [(&str, Edit); 9] = [
        ("inflight_max 0", |c| c.inflight_max = 0),
        ("reply_timeout_ms 0", |c| c.reply_timeout_ms = 0),
        ("backoff_ms_max below reply_timeout_ms", |c| {
            c.backoff_ms_max = c.reply_timeout_ms - 1;
        }),
        ("attempts_max 0", |c| c.attempts_max = 0),
        ("attempts_max 33", |c| c.attempts_max = 33),
        ("events_max 0", |c| c.events_max = 0),
        ("wheel: tick 0", |c| c.wheel.tick_ms = 0),
        ("wheel: 1 slot", |c| c.wheel.slots_per_level = 1),
        ("wheel.tasks_max below inflight_max", |c| {
            c.wheel.tasks_max = c.inflight_max - 1;
        }),
    ];
    for (what, edit) in accepted {
        let mut config = CoordinatorConfig::default();
        edit(&mut config);
        assert!(Coordinator::new(config).is_ok(), "refused: {what}");
    }
    for (what, edit) in refused {
        let mut config = CoordinatorConfig::default();
        edit(&mut config);
        assert!(Coordinator::new(config).is_err(), "accepted: {what}");
    }
    let wheel = |edit: fn(&mut WheelConfig)| {
        let mut w = WheelConfig::default();
        edit(&mut w);
        w.validate().is_ok()
    };
    assert!(wheel(|w| {
        w.slots_per_level = SLOTS_PER_LEVEL_MAX;
        w.levels = 1;
    }));
    assert!(!wheel(|w| {
        w.slots_per_level = SLOTS_PER_LEVEL_MAX + 1;
        w.levels = 1;
    }));
    // 2^16 slots on 4 levels: 2^64 ticks do not fit in a u64.
    assert!(!wheel(|w| w.slots_per_level = SLOTS_PER_LEVEL_MAX));
    assert!(!wheel(|w| w.levels = 0));
    assert!(wheel(|w| w.tasks_max = TASKS_MAX_LIMIT));
    assert!(!wheel(|w| w.tasks_max = TASKS_MAX_LIMIT + 1));
    assert!(!wheel(|w| w.tasks_max = 0));
}

/// Acknowledges every log write and answers every message with success until `xid` is no
/// longer in flight; its outcome event is left undrained.
fn run_to_the_end(coordinator: &mut Coordinator, xid: Xid) {
    for step in 0..64 {
        if coordinator.stage(xid).is_none() {
            return;
        }
        while let Some(entry) = coordinator.poll_log_write() {
            coordinator.handle_log_written(&entry, at(step));
        }
        while let Some((to, msg)) = coordinator.poll_send() {
            let (from, reply) = hostile_reply(to, &msg, Answer::Applied, Twist::None);
            coordinator.handle_reply(from, &reply, at(step));
        }
    }
    panic!("draw {xid:?} still in flight after 64 rounds of willing participants");
}

/// A hostile operator at `start_draw`: every admission bound (price, xid in flight, draws in
/// flight, undrained events) accepts on it and refuses just past it, with the error naming the
/// bound, and a refusal asks for no log write and starts nothing.
#[test]
fn start_draw_admits_on_every_bound_and_a_refusal_past_one_changes_nothing() {
    use sut::lottery::AMOUNT_MAX;
    let config = CoordinatorConfig {
        inflight_max: 2,
        events_max: 1,
        ..CoordinatorConfig::default()
    };
    let mut coordinator = Coordinator::new(config).unwrap();
    let priced = |xid: u64, price_minor: u64| DrawArgs {
        price_minor,
        ..draw(xid)
    };
    let refused = |coordinator: &mut Coordinator, args: DrawArgs, want: CoordinatorError| {
        let before: Vec<_> = coordinator.draws().collect();
        let got = coordinator.start_draw(args, at(0));
        assert_eq!(got, Err(want), "start_draw({args:?})");
        assert_eq!(
            coordinator.poll_log_write(),
            None,
            "a refusal asked for a write"
        );
        assert_eq!(coordinator.draws().collect::<Vec<_>>(), before);
    };

    refused(
        &mut coordinator,
        priced(1, AMOUNT_MAX + 1),
        CoordinatorError::AmountTooLarge {
            amount_minor: AMOUNT_MAX + 1,
        },
    );
    coordinator
        .start_draw(priced(1, AMOUNT_MAX), at(0))
        .unwrap();
    assert_eq!(
        coordinator.poll_log_write(),
        Some(LogEntry::Begin(priced(1, AMOUNT_MAX)))
    );
    refused(
        &mut coordinator,
        draw(1),
        CoordinatorError::DuplicateXid { xid: Xid(1) },
    );
    coordinator.start_draw(draw(2), at(0)).unwrap();
    // Draw 2's `Begin` is never acknowledged: it stays in flight, logging.
    assert_eq!(coordinator.poll_log_write(), Some(LogEntry::Begin(draw(2))));
    refused(
        &mut coordinator,
        draw(3),
        CoordinatorError::Busy { inflight_max: 2 },
    );

    // Draw 1's `Begin` was taken above; write it, and run draw 1 to its outcome.
    coordinator.handle_log_written(&LogEntry::Begin(priced(1, AMOUNT_MAX)), at(0));
    run_to_the_end(&mut coordinator, Xid(1));
    // One draw in flight, one event undrained: the event bound refuses.
    refused(
        &mut coordinator,
        draw(3),
        CoordinatorError::EventsFull { events_max: 1 },
    );
    let event = coordinator.poll_event().expect("draw 1's outcome");
    assert_eq!(event.draw.xid, Xid(1));
    assert!(event.outcome.is_final(), "{event:?}");
    coordinator.start_draw(draw(3), at(0)).unwrap();
}
