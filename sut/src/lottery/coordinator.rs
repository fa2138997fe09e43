//! The sans-IO TCC coordinator for draws (seed 002 ch. 4): Try on every branch, log the verdict
//! durably, then Confirm all or Cancel all; per-message timeouts, bounded retries with
//! exponential backoff, a bound on draws in flight, and recovery from the coordinator log.
//!
//! The shape is quinn-proto's: inputs are `handle_*` calls that take `now`; outputs are drained
//! with `poll_*`; nothing here reads a clock, sends, sleeps or writes. A driver loop is:
//!
//! 1. feed one input: [`Coordinator::start_draw`], [`Coordinator::handle_log_written`],
//!    [`Coordinator::handle_reply`], [`Coordinator::handle_timeout`] or
//!    [`Coordinator::handle_resume_parked`];
//! 2. drain [`Coordinator::poll_log_write`] (write each entry durably, then call
//!    `handle_log_written` with it; entries may be written in any order, and a lost one is
//!    simply never acknowledged), [`Coordinator::poll_send`] (send each message) and
//!    [`Coordinator::poll_event`] (draw outcomes);
//! 3. arm a timer for [`Coordinator::poll_timeout`] (a monotonic deadline in ms).
//!
//! Per draw: `Begin` is logged before any Try is sent; the verdict is logged before any Confirm
//! or Cancel is sent; `Finished` is logged once every branch acknowledged, and only then is the
//! outcome reported. A Try that is refused or runs out of attempts makes the verdict Cancel.
//! A Confirm/Cancel that runs out of attempts parks the draw and reports
//! [`DrawOutcome::GaveUp`]: the draw stays in the log and in flight until the compensation
//! scheduler calls [`Coordinator::handle_resume_parked`] (or a restart resumes it).
//! [`Coordinator::recover`] rebuilds a coordinator from its log: undecided draws are cancelled
//! (their Tries may or may not have landed; the fence turns the missing ones into empty
//! rollbacks and blocks late ones), decided ones are driven to completion.
//!
//! Replies may be lost, duplicated, reordered or stale (from a previous incarnation): a reply
//! only counts when its draw, participant and phase match what is awaited, and counting twice is
//! impossible (per-branch `done` flags). A spurious `handle_timeout` is a no-op.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::fence::FenceStatus;
use super::log::{CoordLog, LogEntry, Verdict};
use super::participant::{ParticipantMsg, ParticipantReply};
use super::rules::{AMOUNT_MAX, Refusal};
use super::{DrawArgs, Participant, Phase, Xid};
use crate::clock::Now;

/// Coordinator limits and timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CoordinatorConfig {
    /// Draws begun and not finished (including parked ones) before new draws are refused.
    pub inflight_max: u32,
    /// Timeout of a message's first attempt; attempt `k` waits `reply_timeout_ms << k`.
    pub reply_timeout_ms: u64,
    /// Cap on the exponential backoff.
    pub backoff_ms_max: u64,
    /// Attempts per message (first send included), 1..=32.
    pub attempts_max: u32,
    /// Undrained outcome events before new draws are refused.
    pub events_max: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            inflight_max: 1024,
            reply_timeout_ms: 100,
            backoff_ms_max: 3_200,
            attempts_max: 6,
            events_max: 4096,
        }
    }
}

impl CoordinatorConfig {
    /// Checks the limits.
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`] naming the bad field.
    pub const fn validate(&self) -> Result<(), CoordinatorError> {
        let reason = if self.inflight_max == 0 {
            "inflight_max must be at least 1"
        } else if self.reply_timeout_ms == 0 {
            "reply_timeout_ms must be at least 1"
        } else if self.backoff_ms_max < self.reply_timeout_ms {
            "backoff_ms_max must be at least reply_timeout_ms"
        } else if self.attempts_max == 0 || self.attempts_max > 32 {
            "attempts_max must be within 1..=32"
        } else if self.events_max == 0 {
            "events_max must be at least 1"
        } else {
            return Ok(());
        };
        Err(CoordinatorError::InvalidConfig { reason })
    }

    /// How long attempt `attempt` (0-based) waits for its reply: exponential, capped.
    #[must_use]
    pub fn timeout_ms(&self, attempt: u32) -> u64 {
        let factor = 1u64.checked_shl(attempt).unwrap_or(u64::MAX);
        self.reply_timeout_ms
            .saturating_mul(factor)
            .min(self.backoff_ms_max)
    }
}

/// Why the coordinator refused an input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum CoordinatorError {
    /// The configuration is unusable.
    #[error("invalid coordinator config: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: &'static str,
    },
    /// Too many draws in flight.
    #[error("{inflight_max} draws already in flight")]
    Busy {
        /// The limit.
        inflight_max: u32,
    },
    /// Too many undrained events (call `poll_event`).
    #[error("{events_max} outcome events are waiting to be drained")]
    EventsFull {
        /// The limit.
        events_max: u32,
    },
    /// The xid is already in flight.
    #[error("draw {xid:?} is already in flight")]
    DuplicateXid {
        /// The draw.
        xid: Xid,
    },
    /// The price exceeds `AMOUNT_MAX`.
    #[error("ticket price {amount_minor} exceeds the maximum")]
    AmountTooLarge {
        /// The price.
        amount_minor: u64,
    },
    /// `handle_resume_parked` on a draw that is not parked.
    #[error("draw {xid:?} is not parked")]
    NotParked {
        /// The draw.
        xid: Xid,
    },
}

/// Why a draw was cancelled.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CancelReason {
    /// A participant refused the Try (no balance, no stock, already took part, fenced, store
    /// failure).
    TryRefused {
        /// Who refused.
        branch: Participant,
        /// Why.
        refusal: Refusal,
    },
    /// A Try got no reply within its attempts.
    TryTimedOut {
        /// Which branch.
        branch: Participant,
    },
    /// The coordinator restarted and found the draw undecided, or decided Cancel.
    Recovered,
}

/// How a draw ended (or stalled).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DrawOutcome {
    /// Every branch confirmed; `won` says whether a prize was issued.
    Confirmed {
        /// Whether the draw won (and so consumed one unit of stock).
        won: bool,
    },
    /// Every branch cancelled (or recorded an empty rollback).
    Cancelled {
        /// Why.
        reason: CancelReason,
    },
    /// The verdict could not be delivered within the attempts; the draw is parked (still in the
    /// log and in flight) until [`Coordinator::handle_resume_parked`] or a restart.
    GaveUp {
        /// The logged verdict still to deliver.
        verdict: Verdict,
    },
}

/// One outcome event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DrawEvent {
    /// The draw.
    pub draw: DrawArgs,
    /// What happened.
    pub outcome: DrawOutcome,
}

/// Where a draw is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DrawStage {
    /// Waiting for `Begin` to be durable.
    LoggingBegin,
    /// Tries sent, waiting for replies.
    Trying,
    /// Waiting for the verdict to be durable.
    LoggingVerdict(Verdict),
    /// Verdict sent, waiting for acknowledgements.
    Finishing(Verdict),
    /// Attempts exhausted delivering the verdict; late acknowledgements still count.
    Parked(Verdict),
    /// Every branch acknowledged; waiting for `Finished` to be durable.
    LoggingFinished(Verdict),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct BranchProgress {
    done: bool,
    attempt: u32,
    deadline_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Draw {
    args: DrawArgs,
    stage: DrawStage,
    cancel_reason: Option<CancelReason>,
    branches: BTreeMap<Participant, BranchProgress>,
}

impl Draw {
    fn new(args: DrawArgs, stage: DrawStage) -> Self {
        let branches = args
            .branches()
            .map(|p| (p, BranchProgress::default()))
            .collect();
        Self {
            args,
            stage,
            cancel_reason: None,
            branches,
        }
    }

    fn all_done(&self) -> bool {
        self.branches.values().all(|b| b.done)
    }
}

/// The coordinator. See the module documentation for the driver loop.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinator {
    config: CoordinatorConfig,
    draws: BTreeMap<Xid, Draw>,
    outbox: VecDeque<(Participant, ParticipantMsg)>,
    log_outbox: VecDeque<LogEntry>,
    /// `(deadline_ms, xid, branch)` for every armed branch; kept exactly in step with the
    /// branches' `deadline_ms`.
    timers: BTreeSet<(u64, Xid, Participant)>,
    events: VecDeque<DrawEvent>,
}

impl Coordinator {
    /// A coordinator with an empty log.
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`].
    pub fn new(config: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        config.validate()?;
        Ok(Self {
            config,
            draws: BTreeMap::new(),
            outbox: VecDeque::new(),
            log_outbox: VecDeque::new(),
            timers: BTreeSet::new(),
            events: VecDeque::new(),
        })
    }

    /// A coordinator restarted from its durable log: undecided draws are decided Cancel (the
    /// verdict is logged first, as always); decided ones resend their verdict to every branch.
    /// Recovered draws are accepted even beyond `inflight_max` (new draws wait until below).
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`].
    pub fn recover(
        config: CoordinatorConfig,
        log: &CoordLog,
        now: Now,
    ) -> Result<Self, CoordinatorError> {
        let mut c = Self::new(config)?;
        for (xid, record) in &log.records {
            debug_assert_eq!(*xid, record.draw.xid, "log record keyed by its own xid");
            match record.verdict {
                None => {
                    c.draws
                        .insert(*xid, Draw::new(record.draw, DrawStage::Trying));
                    c.decide(*xid, Verdict::Cancel, Some(CancelReason::Recovered));
                }
                Some(verdict) => {
                    let mut draw = Draw::new(record.draw, DrawStage::Finishing(verdict));
                    draw.cancel_reason =
                        (verdict == Verdict::Cancel).then_some(CancelReason::Recovered);
                    c.draws.insert(*xid, draw);
                    c.send_phase(*xid, verdict.phase(), now);
                }
            }
        }
        Ok(c)
    }

    /// Begins a draw. `draw.won` is the caller's randomness. Nothing is sent until the `Begin`
    /// entry (from [`Coordinator::poll_log_write`]) is written and acknowledged; `now` is
    /// accepted for symmetry and unused until then.
    ///
    /// # Errors
    /// [`CoordinatorError::Busy`], [`CoordinatorError::EventsFull`],
    /// [`CoordinatorError::DuplicateXid`], [`CoordinatorError::AmountTooLarge`].
    pub fn start_draw(&mut self, draw: DrawArgs, now: Now) -> Result<(), CoordinatorError> {
        let _ = now;
        if draw.price_minor > AMOUNT_MAX {
            return Err(CoordinatorError::AmountTooLarge {
                amount_minor: draw.price_minor,
            });
        }
        if self.draws.contains_key(&draw.xid) {
            return Err(CoordinatorError::DuplicateXid { xid: draw.xid });
        }
        if self.draws.len() >= self.config.inflight_max as usize {
            return Err(CoordinatorError::Busy {
                inflight_max: self.config.inflight_max,
            });
        }
        if self.events.len() >= self.config.events_max as usize {
            return Err(CoordinatorError::EventsFull {
                events_max: self.config.events_max,
            });
        }
        self.draws
            .insert(draw.xid, Draw::new(draw, DrawStage::LoggingBegin));
        self.log_outbox.push_back(LogEntry::Begin(draw));
        Ok(())
    }

    /// The next log entry to write durably; call [`Coordinator::handle_log_written`] with it once
    /// it is.
    #[must_use]
    pub fn poll_log_write(&mut self) -> Option<LogEntry> {
        self.log_outbox.pop_front()
    }

    /// `entry` is durable. Unknown or stale entries are ignored.
    pub fn handle_log_written(&mut self, entry: &LogEntry, now: Now) {
        let xid = entry.xid();
        let Some(draw) = self.draws.get_mut(&xid) else {
            return;
        };
        match (*entry, draw.stage) {
            (LogEntry::Begin(args), DrawStage::LoggingBegin) if args == draw.args => {
                draw.stage = DrawStage::Trying;
                self.send_phase(xid, Phase::Try, now);
            }
            (LogEntry::Decided { verdict, .. }, DrawStage::LoggingVerdict(logging))
                if verdict == logging =>
            {
                draw.stage = DrawStage::Finishing(verdict);
                for b in draw.branches.values_mut() {
                    *b = BranchProgress::default();
                }
                self.send_phase(xid, verdict.phase(), now);
            }
            (LogEntry::Finished { .. }, DrawStage::LoggingFinished(verdict)) => {
                let draw = self.draws.remove(&xid);
                let Some(draw) = draw else { return };
                debug_assert!(
                    draw.all_done(),
                    "finished only when every branch acknowledged"
                );
                debug_assert!(
                    draw.branches.values().all(|b| b.deadline_ms.is_none()),
                    "no armed timer"
                );
                let outcome = match verdict {
                    Verdict::Confirm => DrawOutcome::Confirmed { won: draw.args.won },
                    Verdict::Cancel => DrawOutcome::Cancelled {
                        reason: draw.cancel_reason.unwrap_or(CancelReason::Recovered),
                    },
                };
                self.events.push_back(DrawEvent {
                    draw: draw.args,
                    outcome,
                });
            }
            _ => {}
        }
    }

    /// The next message to send.
    #[must_use]
    pub fn poll_send(&mut self) -> Option<(Participant, ParticipantMsg)> {
        self.outbox.pop_front()
    }

    /// A participant's reply arrived. Stale, duplicate and misaddressed replies are ignored.
    pub fn handle_reply(&mut self, from: Participant, reply: &ParticipantReply, now: Now) {
        let _ = now;
        if from != reply.branch {
            return;
        }
        let xid = reply.draw.xid;
        let Some(draw) = self.draws.get_mut(&xid) else {
            return;
        };
        if draw.args != reply.draw {
            return;
        }
        let Some(progress) = draw.branches.get(&from) else {
            return;
        };
        if progress.done {
            return;
        }
        match draw.stage {
            DrawStage::Trying if reply.phase == Phase::Try => {
                // A repeated Try that finds its own `tried` row is refused by the fence (Seata's
                // rule), but it proves the first one landed.
                match &reply.outcome {
                    Ok(_)
                    | Err(Refusal::TryFenced {
                        existing: FenceStatus::Tried,
                    }) => {
                        self.mark_done(xid, from);
                        if self.draws.get(&xid).is_some_and(Draw::all_done) {
                            self.decide(xid, Verdict::Confirm, None);
                        }
                    }
                    Err(refusal) => {
                        let reason = CancelReason::TryRefused {
                            branch: from,
                            refusal: refusal.clone(),
                        };
                        self.decide(xid, Verdict::Cancel, Some(reason));
                    }
                }
            }
            // A refusal of the verdict is left to the timer: store failures are transient;
            // anything else means the protocol is broken and the draw ends up parked.
            DrawStage::Finishing(verdict) | DrawStage::Parked(verdict)
                if reply.phase == verdict.phase() && reply.outcome.is_ok() =>
            {
                self.mark_done(xid, from);
                if let Some(draw) = self.draws.get_mut(&xid)
                    && draw.all_done()
                {
                    draw.stage = DrawStage::LoggingFinished(verdict);
                    self.log_outbox.push_back(LogEntry::Finished { xid });
                }
            }
            _ => {}
        }
    }

    /// The earliest monotonic deadline (ms) at which [`Coordinator::handle_timeout`] has work.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.first().map(|t| t.0)
    }

    /// Time passed: resend what timed out (with backoff), or give up on it. A call with nothing
    /// due is a no-op.
    pub fn handle_timeout(&mut self, now: Now) {
        // Bounded: each iteration removes one timer; re-armed ones are due strictly later.
        while let Some(&(deadline_ms, xid, branch)) = self.timers.first() {
            if deadline_ms > now.mono_ms {
                break;
            }
            self.timers.pop_first();
            self.on_branch_timeout(xid, branch, deadline_ms, now);
        }
    }

    /// Re-arms a parked draw (the compensation scheduler's retry): its unacknowledged branches
    /// get a fresh round of attempts.
    ///
    /// # Errors
    /// [`CoordinatorError::NotParked`].
    pub fn handle_resume_parked(&mut self, xid: Xid, now: Now) -> Result<(), CoordinatorError> {
        let Some(draw) = self.draws.get_mut(&xid) else {
            return Err(CoordinatorError::NotParked { xid });
        };
        let DrawStage::Parked(verdict) = draw.stage else {
            return Err(CoordinatorError::NotParked { xid });
        };
        draw.stage = DrawStage::Finishing(verdict);
        self.send_phase(xid, verdict.phase(), now);
        Ok(())
    }

    /// The next outcome event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<DrawEvent> {
        self.events.pop_front()
    }

    /// Draws in flight (begun, not finished; parked ones included).
    #[must_use]
    pub fn inflight(&self) -> usize {
        self.draws.len()
    }

    /// Where a draw is, if in flight.
    #[must_use]
    pub fn stage(&self, xid: Xid) -> Option<DrawStage> {
        self.draws.get(&xid).map(|d| d.stage)
    }

    /// Every draw in flight and its stage, in xid order.
    pub fn draws(&self) -> impl Iterator<Item = (Xid, DrawStage)> + '_ {
        self.draws.iter().map(|(x, d)| (*x, d.stage))
    }

    /// Every branch awaiting a reply: `(deadline_ms, xid, branch)`, earliest deadline first
    /// (the timers behind [`Coordinator::poll_timeout`]; a model checker reads them to tell a
    /// timeout that races a reply still in flight from one whose message was lost).
    pub fn armed(&self) -> impl Iterator<Item = (u64, Xid, Participant)> + '_ {
        self.timers.iter().copied()
    }

    /// Parked draws.
    pub fn parked(&self) -> impl Iterator<Item = Xid> + '_ {
        self.draws
            .iter()
            .filter(|(_, d)| matches!(d.stage, DrawStage::Parked(_)))
            .map(|(x, _)| *x)
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    fn set_deadline(&mut self, xid: Xid, branch: Participant, deadline_ms: Option<u64>) {
        let Some(progress) = self
            .draws
            .get_mut(&xid)
            .and_then(|d| d.branches.get_mut(&branch))
        else {
            return;
        };
        if let Some(old) = progress.deadline_ms {
            self.timers.remove(&(old, xid, branch));
        }
        progress.deadline_ms = deadline_ms;
        if let Some(new) = deadline_ms {
            self.timers.insert((new, xid, branch));
        }
    }

    fn mark_done(&mut self, xid: Xid, branch: Participant) {
        self.set_deadline(xid, branch, None);
        if let Some(p) = self
            .draws
            .get_mut(&xid)
            .and_then(|d| d.branches.get_mut(&branch))
        {
            p.done = true;
        }
    }

    fn disarm_all(&mut self, xid: Xid) {
        let branches: Vec<Participant> = self
            .draws
            .get(&xid)
            .map(|d| d.branches.keys().copied().collect())
            .unwrap_or_default();
        for b in branches {
            self.set_deadline(xid, b, None);
        }
    }

    /// Sends `phase` to every unacknowledged branch as attempt 0 and arms their timers.
    fn send_phase(&mut self, xid: Xid, phase: Phase, now: Now) {
        let Some(draw) = self.draws.get_mut(&xid) else {
            return;
        };
        let args = draw.args;
        let pending: Vec<Participant> = draw
            .branches
            .iter_mut()
            .filter(|(_, b)| !b.done)
            .map(|(p, b)| {
                b.attempt = 0;
                *p
            })
            .collect();
        let deadline = now.mono_ms.saturating_add(self.config.timeout_ms(0));
        for p in pending {
            self.outbox
                .push_back((p, ParticipantMsg { phase, draw: args }));
            self.set_deadline(xid, p, Some(deadline));
        }
    }

    /// Records the verdict (durably first: nothing is sent until the log acknowledges it).
    fn decide(&mut self, xid: Xid, verdict: Verdict, cancel_reason: Option<CancelReason>) {
        self.disarm_all(xid);
        let Some(draw) = self.draws.get_mut(&xid) else {
            return;
        };
        debug_assert_eq!(draw.stage, DrawStage::Trying, "decided only while trying");
        draw.stage = DrawStage::LoggingVerdict(verdict);
        debug_assert_eq!(
            verdict == Verdict::Cancel,
            cancel_reason.is_some(),
            "a reason for every cancel"
        );
        draw.cancel_reason = cancel_reason;
        self.log_outbox
            .push_back(LogEntry::Decided { xid, verdict });
    }

    fn on_branch_timeout(&mut self, xid: Xid, branch: Participant, deadline_ms: u64, now: Now) {
        let Some(draw) = self.draws.get_mut(&xid) else {
            return;
        };
        let stage = draw.stage;
        let args = draw.args;
        let Some(progress) = draw.branches.get_mut(&branch) else {
            return;
        };
        if progress.done || progress.deadline_ms != Some(deadline_ms) {
            return;
        }
        // The timer entry is already popped from `timers`.
        progress.deadline_ms = None;
        let phase = match stage {
            DrawStage::Trying => Phase::Try,
            DrawStage::Finishing(verdict) => verdict.phase(),
            _ => return,
        };
        if progress.attempt + 1 < self.config.attempts_max {
            progress.attempt += 1;
            let wait = self.config.timeout_ms(progress.attempt);
            self.outbox
                .push_back((branch, ParticipantMsg { phase, draw: args }));
            self.set_deadline(xid, branch, Some(now.mono_ms.saturating_add(wait)));
            return;
        }
        match stage {
            DrawStage::Trying => self.decide(
                xid,
                Verdict::Cancel,
                Some(CancelReason::TryTimedOut { branch }),
            ),
            DrawStage::Finishing(verdict) => {
                self.disarm_all(xid);
                if let Some(draw) = self.draws.get_mut(&xid) {
                    draw.stage = DrawStage::Parked(verdict);
                }
                self.events.push_back(DrawEvent {
                    draw: args,
                    outcome: DrawOutcome::GaveUp { verdict },
                });
            }
            _ => {}
        }
    }
}
