//! The coordinator as every driver runs it: the one driver-facing API of the TCC coordinator
//! role (quinn-proto's `Connection` is the model). `sut-server`'s lottery writer, the
//! simulator's `coord` node, the stateright model's coordinator actor and `sut`'s own testkit
//! all hold a [`CoordinatorNode`] and call the same methods; what differs between them is only
//! how bytes, time and storage move, which they give as a [`CoordinatorIo`].
//!
//! The node owns what the drivers used to write each for themselves:
//!
//! - **the drive loop** ([`CoordinatorNode::drive`]): log entries to write, then messages to
//!   send, then outcome events, until the coordinator asks for nothing more; an in-process
//!   participant's reply is fed back at once;
//! - **the timeouts** ([`CoordinatorNode::handle_due`]): run when due, never early;
//! - **branch placement** ([`Host`], [`Participant::host`]): which process or node hosts each
//!   branch (the wallet process hosts the wallet and the participation log, the inventory
//!   process the prize stock);
//! - **the client's answer** ([`CoordinatorIo::outcome`]): which outcome releases which waiting
//!   client, with what ([`ClientAnswer`]), and what a status poll reports ([`Statuses`]).
//!
//! A driver encodes: an answer to an HTTP status or a simulated message, a [`Host`] to a URL or
//! a node name. It never matches on the coordinator's stages or outcomes to decide.

use std::collections::BTreeMap;

use super::answer::{ClientAnswer, Polled, Statuses};
use super::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, DrawEvent};
use super::log::{CoordLog, LogEntry};
use super::participant::{ParticipantMsg, ParticipantReply};
use super::{DrawArgs, Participant, Xid};
use crate::clock::Now;

/// Where a draw's branches run: one process (or simulated node, or model actor) per host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// The wallet and the participation log (they change together for every draw).
    Wallet,
    /// The prize stock.
    Inventory,
}

impl Host {
    /// Every host.
    pub const ALL: [Self; 2] = [Self::Wallet, Self::Inventory];

    /// Its name: the simulator's node, the server's `--role`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Wallet => "wallet",
            Self::Inventory => "inventory",
        }
    }

    /// Whether `branch` runs here.
    #[must_use]
    pub const fn hosts(self, branch: Participant) -> bool {
        branch.host() as u8 == self as u8
    }

    /// The branches that run here, in order.
    pub fn branches(self) -> impl Iterator<Item = Participant> {
        Participant::ALL.into_iter().filter(move |p| self.hosts(*p))
    }
}

impl Participant {
    /// The host this branch runs on.
    #[must_use]
    pub const fn host(self) -> Host {
        match self {
            Self::Wallet | Self::Participation => Host::Wallet,
            Self::Inventory => Host::Inventory,
        }
    }
}

/// What became of a log entry a driver was asked to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Written {
    /// Durable already: the node acknowledges it at once.
    Durable,
    /// Durable at the driver's next group commit: the driver calls
    /// [`CoordinatorNode::handle_log_written`] then.
    Later,
    /// Not written (the store refused it): never acknowledged; the coordinator's timeouts
    /// decide what follows.
    Refused,
}

/// How a driver moves a coordinator's bytes, time and storage.
pub trait CoordinatorIo<C> {
    /// Writes `entry` to the coordinator's durable log.
    fn write_log(&mut self, entry: &LogEntry) -> Written;

    /// Delivers `msg` to `branch`, which runs on `host`. An in-process participant answers at
    /// once (its reply is returned); a message that went on a network, or was lost, returns
    /// `None` and its reply (if any) comes back through [`CoordinatorNode::handle_reply`].
    fn send(
        &mut self,
        host: Host,
        branch: Participant,
        msg: ParticipantMsg,
    ) -> Option<ParticipantReply>;

    /// The coordinator's outcome `event`, with what the draw's client is told (`answer`) and
    /// the client, when one is still waiting for its first answer (it is released: it gets no
    /// other).
    fn outcome(&mut self, event: &DrawEvent, answer: ClientAnswer<'_>, client: Option<C>);
}

/// The coordinator role: the [`Coordinator`], the clients waiting for their draw's first
/// answer (`C` is how the driver reaches one: a reply channel, a simulated client's address),
/// and what status polls are answered from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CoordinatorNode<C> {
    coordinator: Coordinator,
    /// `None`: no client ever polls (the models); nothing is remembered for polls.
    statuses: Option<Statuses>,
    waiting: BTreeMap<Xid, C>,
}

impl<C> crate::edge::Observed for CoordinatorNode<C> {
    fn take_edges(&mut self, into: &mut crate::edge::Edges) {
        self.coordinator.take_edges(into);
    }
}

/// Most rounds of one [`CoordinatorNode::drive`]: each round either makes progress or ends the
/// drive, and one draw needs at most a handful; the bound only stops a driver bug from spinning.
const DRIVE_ROUNDS_MAX: usize = 1 << 16;

impl<C> CoordinatorNode<C> {
    /// A node with an empty log; `statuses_kept_max`: how many final outcomes status polls can
    /// still report (`None`: no polls).
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`].
    pub fn new(
        config: CoordinatorConfig,
        statuses_kept_max: Option<usize>,
    ) -> Result<Self, CoordinatorError> {
        Ok(Self::around(Coordinator::new(config)?, statuses_kept_max))
    }

    /// A node restarted from its durable log (see [`Coordinator::recover`]); no client waits
    /// and no final outcome is remembered (they were in memory).
    ///
    /// # Errors
    /// [`CoordinatorError::InvalidConfig`].
    pub fn recover(
        config: CoordinatorConfig,
        log: &CoordLog,
        now: Now,
        statuses_kept_max: Option<usize>,
    ) -> Result<Self, CoordinatorError> {
        Ok(Self::around(
            Coordinator::recover(config, log, now)?,
            statuses_kept_max,
        ))
    }

    fn around(coordinator: Coordinator, statuses_kept_max: Option<usize>) -> Self {
        let flaw = coordinator.config().flaw;
        Self {
            coordinator,
            statuses: statuses_kept_max.map(|kept_max| Statuses::with_flaw(kept_max, flaw)),
            waiting: BTreeMap::new(),
        }
    }

    /// The coordinator, to read (its stages, dead letters, configuration, invariants).
    #[must_use]
    pub const fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Begins `draw`; `client` (if any) waits for its first answer, which a later
    /// [`Self::drive`] hands to [`CoordinatorIo::outcome`].
    ///
    /// # Errors
    /// The coordinator's refusal ([`Coordinator::start_draw`]), with the client back: it was
    /// not taken, and is to be told why.
    pub fn start_draw(
        &mut self,
        draw: DrawArgs,
        client: Option<C>,
        now: Now,
    ) -> Result<(), (Option<C>, CoordinatorError)> {
        if let Err(e) = self.coordinator.start_draw(draw, now) {
            return Err((client, e));
        }
        if let Some(client) = client {
            let earlier = self.waiting.insert(draw.xid, client);
            debug_assert!(earlier.is_none(), "a begun xid is never begun again");
        }
        Ok(())
    }

    /// A log entry the driver answered [`Written::Later`] for is durable now.
    pub fn handle_log_written(&mut self, entry: &LogEntry, now: Now) {
        self.coordinator.handle_log_written(entry, now);
    }

    /// A participant's reply arrived from `from`.
    pub fn handle_reply(&mut self, from: Participant, reply: &ParticipantReply, now: Now) {
        self.coordinator.handle_reply(from, reply, now);
    }

    /// Runs the coordinator's timeouts if one is due at `now`; returns whether one was.
    pub fn handle_due(&mut self, now: Now) -> bool {
        let due = self
            .coordinator
            .poll_timeout()
            .is_some_and(|at| at <= now.mono_ms);
        if due {
            self.coordinator.handle_timeout(now);
        }
        due
    }

    /// Runs the coordinator's timeouts at `now` (a driver whose time only moves to the next
    /// deadline, as the model's, calls this there).
    pub fn handle_timeout(&mut self, now: Now) {
        self.coordinator.handle_timeout(now);
    }

    /// An operator's retry of dead letter `xid` ([`Coordinator::handle_retry_dead_letter`]).
    ///
    /// # Errors
    /// [`CoordinatorError::NotDeadLettered`].
    pub fn handle_retry_dead_letter(&mut self, xid: Xid, now: Now) -> Result<(), CoordinatorError> {
        self.coordinator.handle_retry_dead_letter(xid, now)
    }

    /// When the driver must call [`Self::handle_due`] next (monotonic ms), if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.coordinator.poll_timeout()
    }

    /// What a poll of draw `xid`'s status reports: in flight (its stage), else its remembered
    /// end; `None` for a draw this node does not know (or when it keeps no statuses).
    #[must_use]
    pub fn status(&self, xid: Xid) -> Option<Polled<'_>> {
        self.statuses.as_ref()?.poll(&self.coordinator, xid)
    }

    /// Clients waiting for their first answer.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Carries out everything the coordinator asks for, through `io`, until it asks for
    /// nothing: each round writes the log entries it asks for (acknowledging those
    /// [`Written::Durable`]), delivers its messages (feeding in-process replies back), then
    /// hands over its outcome events with the answer of each draw's waiting client.
    pub fn drive(&mut self, io: &mut impl CoordinatorIo<C>, now: Now) {
        for _ in 0..DRIVE_ROUNDS_MAX {
            if !self.drive_round(io, now) {
                return;
            }
        }
        debug_assert!(false, "a coordinator that never stops asking");
    }

    /// One round of [`Self::drive`]; whether it did anything.
    fn drive_round(&mut self, io: &mut impl CoordinatorIo<C>, now: Now) -> bool {
        let mut progressed = false;
        while let Some(entry) = self.coordinator.poll_log_write() {
            progressed = true;
            match io.write_log(&entry) {
                Written::Durable => self.coordinator.handle_log_written(&entry, now),
                Written::Later | Written::Refused => {}
            }
        }
        while let Some((branch, msg)) = self.coordinator.poll_send() {
            progressed = true;
            if let Some(reply) = io.send(branch.host(), branch, msg) {
                debug_assert_eq!(reply.branch, branch, "a reply comes from the branch asked");
                self.coordinator.handle_reply(branch, &reply, now);
            }
        }
        while let Some(event) = self.coordinator.poll_event() {
            progressed = true;
            let answer = match self.statuses.as_mut() {
                Some(statuses) => statuses.book(&event),
                None => ClientAnswer::of(&event.outcome),
            };
            let client = self.waiting.remove(&event.draw.xid);
            io.outcome(&event, answer, client);
        }
        progressed
    }

    /// The coordinator's invariants and the node's: every waiting client's draw is known to the
    /// coordinator or has its outcome queued, and the statuses keep within their bound.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.coordinator.check_invariants()?;
        if let Some(statuses) = &self.statuses {
            statuses.check_invariants()?;
        }
        if self.waiting.len() > self.coordinator.inflight() + self.coordinator.events_queued() {
            return Err(format!(
                "{} clients wait, for {} draws in flight and {} outcomes queued",
                self.waiting.len(),
                self.coordinator.inflight(),
                self.coordinator.events_queued()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
