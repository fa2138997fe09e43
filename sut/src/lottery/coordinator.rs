//! The sans-IO TCC coordinator for draws: Try on every branch, log the verdict durably, then
//! Confirm all or Cancel all; per-message timeouts, bounded retries with exponential backoff, a
//! bound on draws in flight, compensation of draws whose verdict could not be delivered, and
//! recovery from the coordinator log.
//!
//! The shape is quinn-proto's: inputs are `handle_*` calls that take `now`; outputs are drained
//! with `poll_*`; nothing here reads a clock, sends, sleeps or writes. A driver loop is:
//!
//! 1. feed one input: [`Coordinator::start_draw`], [`Coordinator::handle_log_written`],
//!    [`Coordinator::handle_reply`] or [`Coordinator::handle_timeout`] (and, from an operator,
//!    [`Coordinator::handle_retry_dead_letter`]);
//! 2. drain [`Coordinator::poll_log_write`] (write each entry durably, then call
//!    `handle_log_written` with it; entries may be written in any order, and a lost one is
//!    simply never acknowledged), [`Coordinator::poll_send`] (send each message) and
//!    [`Coordinator::poll_event`] (draw outcomes);
//! 3. arm a timer for [`Coordinator::poll_timeout`] (a monotonic deadline in ms) and call
//!    `handle_timeout` when it passes.
//!
//! Per draw: `Begin` is logged before any Try is sent; the verdict is logged before any Confirm
//! or Cancel is sent; `Finished` is logged once every branch acknowledged, and only then is the
//! outcome reported. A Try that is refused or runs out of attempts makes the verdict Cancel.
//!
//! **Compensation.** A Confirm/Cancel that runs out of attempts *parks* the draw and reports
//! [`DrawOutcome::Parked`] (the client can be told "pending"). The coordinator owns the
//! compensation schedule: a [`TimingWheel`] of parked draws, Cancel before Confirm among draws
//! due in the same tick (a Cancel releases frozen funds), first round
//! [`CoordinatorConfig::park_delay_ms`] after the park, then exponential backoff
//! ([`WheelConfig::backoff_base_ms`] doubling to [`WheelConfig::backoff_cap_ms`]). Each round
//! resends the verdict to the unacknowledged branches with a fresh set of attempts; a round that
//! runs out of attempts again spends one unit of the retry budget
//! ([`CoordinatorConfig::compensation_retries_max`]). When the budget is spent the draw is
//! *dead-lettered* ([`DrawOutcome::DeadLettered`]): it stays in the log and in flight, visible in
//! [`Coordinator::dead_letters`], until an operator retries it, a late acknowledgement completes
//! it, or a restart resumes it. Late acknowledgements count in every stage: a parked or
//! dead-lettered draw whose branches all acknowledge finishes normally. The schedule is not
//! durable: a restarted coordinator resends every logged verdict at once and compensates anew.
//!
//! [`Coordinator::recover`] rebuilds a coordinator from its log: undecided draws are cancelled
//! (their Tries may or may not have landed; the fence turns the missing ones into empty
//! rollbacks and blocks late ones), decided ones are driven to completion.
//!
//! Replies may be lost, duplicated, reordered or stale (from a previous incarnation): a reply
//! only counts when its draw, participant and phase match what is awaited, and counting twice is
//! impossible (per-branch `done` flags). A spurious `handle_timeout` is a no-op.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::log::{CoordLog, LogEntry, Verdict};
use super::participant::{ParticipantMsg, ParticipantReply};
use super::rows::{AMOUNT_MAX, FenceStatus, Refusal};
use super::wheel::{FailOutcome, TaskHandle, TaskSpec, TaskStatus, TimingWheel, WheelConfig};
use super::{DrawArgs, Participant, Phase, Xid};
use crate::clock::Now;
use crate::edge::{Edge, Edges, Machine, Observed};
use crate::flaw::Flaw;

/// Recovery finds a draw begun and not decided.
pub const RECOVERED_UNDECIDED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.recovered_undecided",
    "a restarted coordinator finds a draw in its log with no verdict: it must decide Cancel \
     (logged first) although some Tries may have landed and others may still arrive",
);
/// Recovery finds a decided, unfinished draw.
pub const RECOVERED_DECIDED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.recovered_decided",
    "a restarted coordinator finds a logged verdict not yet acknowledged by every branch: it must \
     redo phase 2 with exactly that verdict, to branches some of which already applied it",
);
/// A Try ran out of attempts.
pub const TRY_TIMED_OUT: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.try_timed_out",
    "a Try got no reply within its attempts and the draw is cancelled, although that Try may \
     have landed or may land later (the fence must turn it into an empty rollback or refuse it)",
);
/// A repeated Try's `tried` refusal read as success.
pub const DUPLICATE_TRY_LANDED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.duplicate_try_landed",
    "a resent Try is refused because its first delivery landed (`TryFenced { tried }`): the \
     coordinator must count it as done, not cancel a draw whose reservations all hold",
);
/// A Try reply after the verdict.
pub const REPLY_AFTER_VERDICT: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.reply_after_verdict",
    "a branch's Try reply arrives after the draw was decided (typically a late success after a \
     timeout-cancel): it must not change the verdict nor count as an acknowledgement of it",
);
/// A reply for a branch already acknowledged, or for a finished draw.
pub const DUPLICATE_REPLY: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.duplicate_reply",
    "a reply arrives for a branch already acknowledged in this phase or for a draw that is no \
     longer in flight (duplicate or late delivery): counting it twice would finish a draw early",
);
/// A verdict ran out of attempts: the draw is parked.
pub const PARKED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.parked",
    "a logged verdict could not be delivered within its attempts: the draw is parked and handed \
     to the compensation schedule, still in flight, instead of being dropped",
);
/// A draw that was parked finishes.
pub const PARKED_DRAW_COMPLETED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.parked_draw_completed",
    "the last acknowledgement of a parked or dead-lettered draw arrives (from a compensation \
     round or late): the draw must finish once and its compensation task be released",
);
/// Compensation spent its retry budget.
pub const DEAD_LETTERED: Edge = Edge::new(
    Machine::Coordinator,
    "coordinator.dead_lettered",
    "compensation spent its retry budget: the draw must stay logged, in flight and visible as a \
     dead letter (never silently forgotten with money frozen)",
);

/// This machine's edge states (see [`crate::edge`]).
pub const EDGES: &[Edge] = &[
    RECOVERED_UNDECIDED,
    RECOVERED_DECIDED,
    TRY_TIMED_OUT,
    DUPLICATE_TRY_LANDED,
    REPLY_AFTER_VERDICT,
    DUPLICATE_REPLY,
    PARKED,
    PARKED_DRAW_COMPLETED,
    DEAD_LETTERED,
];

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
    /// Compensation: how long a parked draw waits before its first round (ms).
    pub park_delay_ms: u64,
    /// Compensation: rounds after the first that may run out of attempts before the draw is
    /// dead-lettered (the wheel task's retry budget: at most `1 + compensation_retries_max`
    /// rounds per park).
    pub compensation_retries_max: u32,
    /// The compensation schedule's timing wheel (its backoff is the wait between rounds).
    /// `tasks_max` must hold every draw in flight.
    pub wheel: WheelConfig,
    /// A documented flaw (`crate::flaw`) switched on in the coordinator: only
    /// [`Flaw::CoordTryBeforeBegin`] changes it. `None`: the correct coordinator.
    #[serde(default)]
    pub flaw: Option<Flaw>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            inflight_max: 1024,
            reply_timeout_ms: 100,
            backoff_ms_max: 3_200,
            attempts_max: 6,
            events_max: 4096,
            park_delay_ms: 500,
            compensation_retries_max: 8,
            wheel: WheelConfig::default(),
            flaw: None,
        }
    }
}

impl CoordinatorConfig {
    /// Checks the limits.
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`] naming the bad field.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
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
        } else if self.wheel.validate().is_err() {
            "wheel: invalid timing wheel configuration (see WheelConfig::validate)"
        } else if self.wheel.tasks_max < self.inflight_max {
            "wheel.tasks_max must be at least inflight_max (every draw in flight may park)"
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

    /// The longest one compensation round can take once it is due: the wheel fires it up to a
    /// tick late, then every attempt of a branch times out in turn (branches run side by side).
    /// A round that began while a fault lasted may still fail this long after the fault healed.
    #[must_use]
    pub fn round_ms_max(&self) -> u64 {
        (0..self.attempts_max)
            .map(|attempt| self.timeout_ms(attempt))
            .fold(self.wheel.tick_ms, u64::saturating_add)
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
    /// `handle_retry_dead_letter` on a draw that is not dead-lettered.
    #[error("draw {xid:?} is not dead-lettered")]
    NotDeadLettered {
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

impl std::fmt::Display for CancelReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TryRefused { branch, refusal } => {
                write!(f, "the {branch} participant refused the Try: {refusal}")
            }
            Self::TryTimedOut { branch } => {
                write!(f, "the {branch} participant did not answer the Try in time")
            }
            Self::Recovered => {
                f.write_str("the coordinator restarted and cancelled the undecided draw")
            }
        }
    }
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
    /// The verdict could not be delivered within the attempts: the draw is parked, and the
    /// coordinator's compensation schedule will resend it. Not final: `Confirmed`, `Cancelled`
    /// or `DeadLettered` follows.
    Parked {
        /// The logged verdict still to deliver.
        verdict: Verdict,
    },
    /// Compensation spent its retry budget: the draw stays in the log and in flight, listed by
    /// [`Coordinator::dead_letters`], until an operator retries it
    /// ([`Coordinator::handle_retry_dead_letter`]), late acknowledgements complete it (then
    /// `Confirmed` or `Cancelled` follows) or a restart resumes it.
    DeadLettered {
        /// The logged verdict still to deliver.
        verdict: Verdict,
    },
}

impl DrawOutcome {
    /// Whether the draw ended (confirmed or cancelled): nothing else follows for it.
    #[must_use]
    pub const fn is_final(&self) -> bool {
        matches!(self, Self::Confirmed { .. } | Self::Cancelled { .. })
    }
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
    /// Attempts exhausted delivering the verdict: waiting for the next compensation round.
    /// Late acknowledgements still count.
    Parked(Verdict),
    /// Compensation's retry budget spent: waiting for an operator, a late acknowledgement or a
    /// restart.
    DeadLettered(Verdict),
    /// Every branch acknowledged; waiting for `Finished` to be durable.
    LoggingFinished(Verdict),
}

impl DrawStage {
    /// The phase whose replies a draw at this stage awaits, if any: the Tries while trying,
    /// the verdict's phase while finishing.
    #[must_use]
    pub const fn awaited_phase(self) -> Option<Phase> {
        match self {
            Self::Trying => Some(Phase::Try),
            Self::Finishing(verdict) => Some(verdict.phase()),
            _ => None,
        }
    }
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
    /// The compensation task from the first park until the draw finishes or is dead-lettered.
    compensation: Option<TaskHandle>,
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
            compensation: None,
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
    /// The compensation schedule, made at the first park (most runs never park a draw, and a
    /// model checker clones this state at every step).
    compensation: Option<Box<TimingWheel<Xid>>>,
    /// Arrivals at its edge states since its driver last took them (a ghost: not its state).
    edges: Edges,
}

impl Observed for Coordinator {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
        if let Some(wheel) = self.compensation.as_mut() {
            wheel.take_edges(into);
        }
    }
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
            compensation: None,
            edges: Edges::new(),
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
                    c.edges.reach(&RECOVERED_UNDECIDED);
                    c.draws
                        .insert(*xid, Draw::new(record.draw, DrawStage::Trying));
                    c.decide(*xid, Verdict::Cancel, Some(CancelReason::Recovered));
                }
                Some(verdict) => {
                    c.edges.reach(&RECOVERED_DECIDED);
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
        let started = self.start_draw_step(draw, now);
        self.debug_holds_for(draw.xid);
        started
    }

    fn start_draw_step(&mut self, draw: DrawArgs, now: Now) -> Result<(), CoordinatorError> {
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
        // FLAW `coord_try_before_begin`: the Try goes out with the Begin record, not after it
        // is durable; a crash between the two leaves branches tried for a draw the recovered
        // log does not know.
        let try_at_once = self.config.flaw == Some(Flaw::CoordTryBeforeBegin);
        let stage = if try_at_once {
            DrawStage::Trying
        } else {
            DrawStage::LoggingBegin
        };
        self.draws.insert(draw.xid, Draw::new(draw, stage));
        self.log_outbox.push_back(LogEntry::Begin(draw));
        if try_at_once {
            self.send_phase(draw.xid, Phase::Try, now);
        }
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
        self.log_written_step(entry, now);
        self.debug_holds_for(entry.xid());
    }

    fn log_written_step(&mut self, entry: &LogEntry, now: Now) {
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
                    draw.compensation.is_none(),
                    "released when all acknowledged"
                );
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
        self.reply_step(from, reply, now);
        self.debug_holds_for(reply.draw.xid);
    }

    fn reply_step(&mut self, from: Participant, reply: &ParticipantReply, now: Now) {
        let _ = now;
        if from != reply.branch {
            return;
        }
        let xid = reply.draw.xid;
        let Some(draw) = self.draws.get_mut(&xid) else {
            self.edges.reach(&DUPLICATE_REPLY);
            return;
        };
        if draw.args != reply.draw {
            return;
        }
        let Some(progress) = draw.branches.get(&from) else {
            return;
        };
        if progress.done {
            self.edges.reach(&DUPLICATE_REPLY);
            return;
        }
        let stage = draw.stage;
        match stage {
            DrawStage::Trying if reply.phase == Phase::Try => {
                // A repeated Try that finds its own `tried` row is refused by the fence (Seata's
                // rule), but it proves the first one landed.
                match &reply.outcome {
                    Ok(_)
                    | Err(Refusal::TryFenced {
                        existing: FenceStatus::Tried,
                    }) => {
                        self.edges
                            .reach_if(reply.outcome.is_err(), &DUPLICATE_TRY_LANDED);
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
            DrawStage::Finishing(verdict)
            | DrawStage::Parked(verdict)
            | DrawStage::DeadLettered(verdict)
                if reply.phase == verdict.phase() && reply.outcome.is_ok() =>
            {
                self.mark_done(xid, from);
                if let Some(draw) = self.draws.get_mut(&xid)
                    && draw.all_done()
                {
                    // Parked (a task is held, also during a round) or dead-lettered.
                    self.edges.reach_if(
                        draw.compensation.is_some() || matches!(stage, DrawStage::DeadLettered(_)),
                        &PARKED_DRAW_COMPLETED,
                    );
                    draw.stage = DrawStage::LoggingFinished(verdict);
                    let compensation = draw.compensation.take();
                    self.log_outbox.push_back(LogEntry::Finished { xid });
                    self.release_compensation(compensation);
                }
            }
            _ => {
                self.edges.reach_if(
                    reply.phase == Phase::Try
                        && matches!(
                            stage,
                            DrawStage::LoggingVerdict(_)
                                | DrawStage::Finishing(_)
                                | DrawStage::Parked(_)
                                | DrawStage::DeadLettered(_)
                                | DrawStage::LoggingFinished(_)
                        ),
                    &REPLY_AFTER_VERDICT,
                );
            }
        }
    }

    /// The earliest monotonic deadline (ms) at which [`Coordinator::handle_timeout`] has work:
    /// a message's reply timeout or the next compensation round.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let reply = self.timers.first().map(|t| t.0);
        let compensation = self.compensation.as_ref().and_then(|w| w.poll_timeout());
        match (reply, compensation) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: resend what timed out (with backoff), park what ran out of attempts, and
    /// start the compensation rounds that are due. A call with nothing due is a no-op.
    pub fn handle_timeout(&mut self, now: Now) {
        self.timeout_step(now);
        crate::check::debug_holds("coordinator", || self.check_invariants());
    }

    fn timeout_step(&mut self, now: Now) {
        // Bounded: each iteration removes one timer; re-armed ones are due strictly later.
        while let Some(&(deadline_ms, xid, branch)) = self.timers.first() {
            if deadline_ms > now.mono_ms {
                break;
            }
            self.timers.pop_first();
            self.on_branch_timeout(xid, branch, deadline_ms, now);
        }
        self.run_compensation(now);
    }

    /// An operator's retry of a dead-lettered draw: it is parked again with a fresh retry budget
    /// and its first round due now.
    ///
    /// # Errors
    /// [`CoordinatorError::NotDeadLettered`].
    pub fn handle_retry_dead_letter(&mut self, xid: Xid, now: Now) -> Result<(), CoordinatorError> {
        let Some(DrawStage::DeadLettered(verdict)) = self.stage(xid) else {
            return Err(CoordinatorError::NotDeadLettered { xid });
        };
        self.schedule_compensation(xid, verdict, now.mono_ms, 0);
        self.debug_holds_for(xid);
        Ok(())
    }

    /// The next outcome event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<DrawEvent> {
        self.events.pop_front()
    }

    /// Outcome events not yet taken by [`Coordinator::poll_event`].
    #[must_use]
    pub fn events_queued(&self) -> usize {
        self.events.len()
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

    /// Parked draws (waiting for a compensation round), in xid order.
    pub fn parked(&self) -> impl Iterator<Item = Xid> + '_ {
        self.draws
            .iter()
            .filter(|(_, d)| matches!(d.stage, DrawStage::Parked(_)))
            .map(|(x, _)| *x)
    }

    /// Dead-lettered draws and the verdict each still has to deliver, in xid order.
    pub fn dead_letters(&self) -> impl Iterator<Item = (DrawArgs, Verdict)> + '_ {
        self.draws.values().filter_map(|d| match d.stage {
            DrawStage::DeadLettered(verdict) => Some((d.args, verdict)),
            _ => None,
        })
    }

    /// The draw's arguments, if in flight.
    #[must_use]
    pub fn draw(&self, xid: Xid) -> Option<DrawArgs> {
        self.draws.get(&xid).map(|d| d.args)
    }

    /// Checks the coordinator's invariants: every armed branch timer belongs to an unacknowledged
    /// branch of a draw that waits for replies, and every such branch has one; a compensation
    /// task exists exactly for parked draws and for draws in a compensation round, and the
    /// schedule names exactly those; the schedule itself is sound. O(draws + tasks): for
    /// simulators (after every step in debug builds), models (an `always` property) and tests.
    ///
    /// # Errors
    /// The first violation found, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut armed = 0_usize;
        for (xid, draw) in &self.draws {
            for (branch, progress) in &draw.branches {
                self.check_branch(*xid, draw, *branch, progress)?;
                armed += usize::from(progress.deadline_ms.is_some());
            }
            self.check_compensation(*xid, draw)?;
        }
        if armed != self.timers.len() {
            return Err(format!(
                "{} timers armed but {armed} branches hold a deadline",
                self.timers.len()
            ));
        }
        let tasks = self
            .draws
            .values()
            .filter(|d| d.compensation.is_some())
            .count();
        let held = self.compensation.as_ref().map_or(0, |w| w.len() as usize);
        if tasks != held {
            return Err(format!(
                "{tasks} draws name a compensation task, the wheel holds {held}"
            ));
        }
        if let Some(wheel) = &self.compensation {
            wheel.check_invariants().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The invariants of draw `xid` (its branches, timers and compensation task), when it is
    /// in flight: what one step touched, asserted after the step in debug builds (the whole
    /// check is O(draws), run after timeouts, which can touch every draw).
    fn debug_holds_for(&self, xid: Xid) {
        crate::check::debug_holds("coordinator", || {
            let Some(draw) = self.draws.get(&xid) else {
                return Ok(());
            };
            for (branch, progress) in &draw.branches {
                self.check_branch(xid, draw, *branch, progress)?;
            }
            self.check_compensation(xid, draw)
        });
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
            DrawStage::Trying => {
                self.edges.reach(&TRY_TIMED_OUT);
                self.decide(
                    xid,
                    Verdict::Cancel,
                    Some(CancelReason::TryTimedOut { branch }),
                );
            }
            DrawStage::Finishing(verdict) => self.park(xid, verdict, now),
            _ => {}
        }
    }

    fn check_branch(
        &self,
        xid: Xid,
        draw: &Draw,
        branch: Participant,
        progress: &BranchProgress,
    ) -> Result<(), String> {
        let awaiting = matches!(draw.stage, DrawStage::Trying | DrawStage::Finishing(_));
        match progress.deadline_ms {
            Some(at) if !self.timers.contains(&(at, xid, branch)) => {
                Err(format!("{xid:?}/{branch:?}: deadline {at} has no timer"))
            }
            Some(_) if progress.done || !awaiting => Err(format!(
                "{xid:?}/{branch:?}: armed while done={} in {:?}",
                progress.done, draw.stage
            )),
            None if awaiting && !progress.done => Err(format!(
                "{xid:?}/{branch:?}: awaited in {:?} with no timer",
                draw.stage
            )),
            _ => Ok(()),
        }
    }

    fn check_compensation(&self, xid: Xid, draw: &Draw) -> Result<(), String> {
        let status = match (draw.compensation, &self.compensation) {
            (Some(handle), Some(wheel)) => Some(
                wheel
                    .status(handle)
                    .ok_or_else(|| format!("{xid:?}: its compensation task is gone"))?,
            ),
            (Some(_), None) => return Err(format!("{xid:?}: a task but no schedule")),
            (None, _) => None,
        };
        let fits = matches!(
            (draw.stage, status),
            (
                DrawStage::Parked(_),
                Some(TaskStatus::Waiting | TaskStatus::Ready)
            ) | (DrawStage::Finishing(_), Some(TaskStatus::InFlight))
                | (
                    DrawStage::DeadLettered(_)
                        | DrawStage::LoggingBegin
                        | DrawStage::Trying
                        | DrawStage::LoggingVerdict(_)
                        | DrawStage::Finishing(_)
                        | DrawStage::LoggingFinished(_),
                    None,
                )
        );
        if fits {
            Ok(())
        } else {
            Err(format!(
                "{xid:?}: stage {:?} with compensation task {status:?}",
                draw.stage
            ))
        }
    }

    /// A verdict ran out of attempts: the first park schedules compensation and tells the
    /// client; a compensation round that ran out spends one unit of the retry budget.
    fn park(&mut self, xid: Xid, verdict: Verdict, now: Now) {
        self.disarm_all(xid);
        let Some(draw) = self.draws.get(&xid) else {
            return;
        };
        let args = draw.args;
        let Some(handle) = draw.compensation else {
            self.edges.reach(&PARKED);
            self.schedule_compensation(xid, verdict, now.mono_ms, self.config.park_delay_ms);
            self.events.push_back(DrawEvent {
                draw: args,
                outcome: DrawOutcome::Parked { verdict },
            });
            return;
        };
        let wheel = self
            .compensation
            .as_mut()
            .expect("a task implies a schedule");
        match wheel.handle_failed(handle, now.mono_ms) {
            Ok(FailOutcome::Retrying { .. }) => self.set_stage(xid, DrawStage::Parked(verdict)),
            Ok(FailOutcome::DeadLettered) => {
                self.edges.reach(&DEAD_LETTERED);
                // The coordinator's own list is the draws' stage: drop the wheel's copy.
                let _ = wheel.take_dead_letters();
                if let Some(draw) = self.draws.get_mut(&xid) {
                    draw.compensation = None;
                    draw.stage = DrawStage::DeadLettered(verdict);
                }
                self.events.push_back(DrawEvent {
                    draw: args,
                    outcome: DrawOutcome::DeadLettered { verdict },
                });
            }
            Err(err) => unreachable!("a round in progress is in flight: {err}"),
        }
    }

    /// Parks `xid` with a new compensation task (fresh retry budget) due `delay_ms` from now.
    fn schedule_compensation(&mut self, xid: Xid, verdict: Verdict, now_ms: u64, delay_ms: u64) {
        let (wheel_config, retries_max) = (self.config.wheel, self.config.compensation_retries_max);
        let wheel = self.compensation.get_or_insert_with(|| {
            Box::new(
                TimingWheel::new(wheel_config, now_ms)
                    .expect("validated with the coordinator's config"),
            )
        });
        let due_ms = now_ms.saturating_add(delay_ms).min(u64::MAX / 2);
        let spec = TaskSpec {
            deadline_ms: due_ms,
            // Among rounds due in the same tick, a Cancel first: it releases frozen funds.
            priority: u32::from(verdict == Verdict::Cancel),
            retries_max,
            payload: xid,
        };
        // Cannot fail: tasks_max >= inflight_max (validated), dead letters are taken at once and
        // the deadline is clamped far below the wheel's last representable tick.
        let handle = wheel
            .schedule(spec)
            .expect("the schedule holds every draw in flight");
        if let Some(draw) = self.draws.get_mut(&xid) {
            draw.compensation = Some(handle);
            draw.stage = DrawStage::Parked(verdict);
        }
    }

    /// Starts every compensation round that is due: the parked draw resends its verdict to the
    /// branches that have not acknowledged it, with a fresh set of attempts.
    fn run_compensation(&mut self, now: Now) {
        let Some(wheel) = self.compensation.as_mut() else {
            return;
        };
        wheel.handle_timeout(now.mono_ms);
        while let Some(fired) = self.compensation.as_mut().and_then(|w| w.poll_ready()) {
            let xid = fired.payload;
            let parked = self.draws.get(&xid).and_then(|d| match d.stage {
                DrawStage::Parked(verdict) if d.compensation == Some(fired.handle) => Some(verdict),
                _ => None,
            });
            match parked {
                Some(verdict) => {
                    self.set_stage(xid, DrawStage::Finishing(verdict));
                    self.send_phase(xid, verdict.phase(), now);
                }
                None => {
                    debug_assert!(false, "a compensation task outlived its park: {xid:?}");
                    self.release_compensation(Some(fired.handle));
                }
            }
        }
    }

    /// The draw no longer needs its compensation task (it finished).
    fn release_compensation(&mut self, handle: Option<TaskHandle>) {
        let (Some(handle), Some(wheel)) = (handle, self.compensation.as_mut()) else {
            return;
        };
        let released = match wheel.status(handle) {
            Some(TaskStatus::InFlight) => wheel.handle_succeeded(handle),
            Some(TaskStatus::Waiting | TaskStatus::Ready) => wheel.cancel(handle),
            None => return,
        };
        debug_assert!(released.is_ok(), "a held task is released");
    }

    fn set_stage(&mut self, xid: Xid, stage: DrawStage) {
        if let Some(draw) = self.draws.get_mut(&xid) {
            draw.stage = stage;
        }
    }
}

#[cfg(test)]
mod corruption {
    //! `check_invariants` fires on each way the coordinator's state can disagree with itself
    //! (states a correct coordinator never reaches, made here by hand).

    use super::*;
    use crate::lottery::ActivityId;
    use crate::lottery::rows::Effect;

    fn at(mono_ms: u64) -> Now {
        Now {
            wall_ms: mono_ms,
            mono_ms,
        }
    }

    fn args(xid: u64) -> DrawArgs {
        DrawArgs {
            xid: Xid(xid),
            user: crate::UserId(xid),
            activity: ActivityId(1),
            price_minor: 10,
            won: false,
        }
    }

    /// Draw 2 parked (a compensation task held), then draw 1 trying (its branches armed).
    fn trying_and_parked() -> Coordinator {
        let mut c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        c.start_draw(args(2), at(0)).unwrap();
        c.handle_log_written(&LogEntry::Begin(args(2)), at(0));
        for branch in args(2).branches() {
            let reply = ParticipantReply {
                branch,
                phase: Phase::Try,
                draw: args(2),
                outcome: Ok(Effect::Applied),
            };
            c.handle_reply(branch, &reply, at(0));
        }
        let decided = LogEntry::Decided {
            xid: Xid(2),
            verdict: Verdict::Confirm,
        };
        c.handle_log_written(&decided, at(0));
        // The Confirm goes unanswered until the draw parks.
        let mut now_ms = 0;
        while !matches!(c.stage(Xid(2)), Some(DrawStage::Parked(_))) {
            now_ms += 1_000;
            c.handle_timeout(at(now_ms));
        }
        c.start_draw(args(1), at(now_ms)).unwrap();
        c.handle_log_written(&LogEntry::Begin(args(1)), at(now_ms));
        assert_eq!(c.stage(Xid(1)), Some(DrawStage::Trying));
        c.check_invariants().unwrap();
        c
    }

    fn corrupted(name: &str, corrupt: impl FnOnce(&mut Coordinator)) {
        let mut c = trying_and_parked();
        corrupt(&mut c);
        assert!(c.check_invariants().is_err(), "{name} went unnoticed");
    }

    #[test]
    fn check_invariants_detects_corruption() {
        let parked = Xid(2);
        corrupted("a parked draw that lost its task", |c| {
            c.draws.get_mut(&parked).unwrap().compensation = None;
        });
        corrupted("a trying draw holding a task", |c| {
            c.draws.get_mut(&parked).unwrap().stage = DrawStage::Trying;
        });
        corrupted("a task with no schedule", |c| c.compensation = None);
        corrupted("a parked draw with an armed branch", |c| {
            let at_ms = 5_000_000;
            let branch = args(2).branches().next().unwrap();
            let draw = c.draws.get_mut(&parked).unwrap();
            draw.branches.get_mut(&branch).unwrap().deadline_ms = Some(at_ms);
            c.timers.insert((at_ms, parked, branch));
        });
        corrupted("a timer no branch holds", |c| {
            c.timers.insert((7, parked, Participant::Wallet));
        });
        let trying = Xid(1);
        let branch = args(1).branches().next().unwrap();
        corrupted("an armed branch already done", |c| {
            let draw = c.draws.get_mut(&trying).unwrap();
            draw.branches.get_mut(&branch).unwrap().done = true;
        });
        corrupted("an awaited branch with no timer", |c| {
            let progress = c
                .draws
                .get_mut(&trying)
                .unwrap()
                .branches
                .get_mut(&branch)
                .unwrap();
            let at_ms = progress.deadline_ms.take().unwrap();
            c.timers.remove(&(at_ms, trying, branch));
        });
        corrupted("a deadline whose timer is gone", |c| {
            let first = *c.timers.first().unwrap();
            c.timers.remove(&first);
            c.timers.insert((first.0 + 1, first.1, first.2));
        });
    }
}
