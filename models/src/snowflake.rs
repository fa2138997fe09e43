//! Snowflake: one worker ([`sut::snowflake::SnowflakeWorker`]) whose wall clock is a
//! nondeterministic input that steps forward and backward within bounds, and that crashes and
//! restarts (twitter/snowflake #6, Leaf issues #104 and #216).
//!
//! - `store` (actor 0) wraps a [`MemoryIdStore`]: worker-id leases with their persisted time
//!   reservation. It answers `Acquire` with [`IdStore::acquire_worker`] and reservation writes
//!   with [`StoreCall::execute`] of a [`StoreCall::RenewWorker`].
//! - `worker` (actor 1): on start it acquires the worker id and builds a new `SnowflakeWorker`
//!   from the lease's `reserved_ts` (so a restart starts above everything persisted). Timers:
//!   `Issue` asks `next_id(wall_ms)`; `Forward`, `Back` and `BackFar` move the wall clock by
//!   +1, −1 (inside the 1 ms wait window) and −3 ms (beyond it). Reservations the worker asks
//!   for (`poll_reservation`) are written to the store and acknowledged with `handle_reserved`.
//!   After a refusal or a wait, the client asks again once the clock moved or a reservation was
//!   acknowledged.
//!
//! The wall clock belongs to the machine, not the process: it survives a restart (kept in
//! `Storage` with the ghost record of issued IDs). Every acquire uses a zero-length lease, so
//! the dead incarnation's lease is always expired: the model assumes a restarted worker waits
//! the old lease out.
//!
//! Properties: `ids.unique` and `ids.monotonic` across restarts (always); sometimes: an ID
//! issued after a restart, a backward clock waited out or refused, a wait for a reservation.

use std::borrow::Cow;

use stateright::Expectation;
use stateright::actor::{Actor, ActorModel, Id, LossyNetwork, Out, model_timeout};
use sut::clock::Now;
use sut::flaw::Flaw;
use sut::id_store::{InstanceId, MemoryIdStore, StoreCall, StoreReply};
use sut::snowflake::holder::{HolderConfig, HolderEvent, WorkerLeaseHolder};
use sut::snowflake::{Layout, NextId, RollbackPolicy, WorkerConfig};

use crate::edges::observe;
use crate::hashed::{HashedActor, Stored, stored};
use crate::runner::{Brief, Cast, NetModel, ord_by_total_cmp};

/// Catalog name.
pub const NAME: &str = "snowflake";
/// Catalog description.
pub const DESCRIPTION: &str = "1 Snowflake worker + its lease store; wall clock steps forward and \
     backward, crash/restart: ids.unique, ids.monotonic across restarts";
/// The edge states this model owns (reported as `sometimes` properties).
pub const EDGES: &[&str] = &[
    "snowflake.worker_lease_lost",
    "snowflake.rollback_within_window",
    "snowflake.rollback_beyond_window",
    "snowflake.sequence_exhausted",
    "snowflake.restart_behind_reservation",
];

/// The `sut::flaw::Flaw` switches of `sut::snowflake` this model can turn on.
pub const FLAWS: &[Flaw] = &[
    Flaw::SnowflakeSeqResetFirst,
    Flaw::SnowflakeNoPersistedTs,
    Flaw::TimeFieldNarrow,
];

/// The default depth bound (the exhaustive space does not finish in seconds; see
/// `docs/models.md`).
pub const DEPTH_DEFAULT: usize = 18;

/// The `always` property that runs the lease holder's (and its worker's) `check_invariants`.
pub const WORKER_INVARIANTS: &str = "worker.invariants";

const NAMESPACE: &str = "snowflake";
const STORE: usize = 0;

/// The model's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnowflakeSetup {
    /// IDs clients ask for, over all incarnations.
    pub ids_max: u32,
    /// Restarts of the worker.
    pub restarts_max: u32,
    /// The wall clock stays within `wall_min_ms..=wall_max_ms`.
    pub wall_min_ms: u64,
    /// See `wall_min_ms`.
    pub wall_max_ms: u64,
    /// In-flight messages the network duplicates, per run.
    pub duplicates_max: u8,
    /// Whether the network loses messages.
    pub lossy: bool,
    /// A documented flaw switched on in the worker (`None`: the correct code).
    pub flaw: Option<sut::flaw::Flaw>,
}

impl Default for SnowflakeSetup {
    fn default() -> Self {
        Self {
            ids_max: 4,
            restarts_max: 1,
            wall_min_ms: 10,
            wall_max_ms: 14,
            duplicates_max: 1,
            lossy: false,
            flaw: None,
        }
    }
}

impl SnowflakeSetup {
    /// The default setup with the named flaw (one of [`FLAWS`]) switched on.
    #[must_use]
    pub fn with_flaw(flaw: Option<Flaw>) -> Self {
        let mut setup = Self {
            flaw,
            ..Self::default()
        };
        if flaw == Some(Flaw::TimeFieldNarrow) {
            // The end-of-life variant (as the simulator's `epoch_end`): the clock moves
            // across the end of the 8-bit time field (unit 256).
            setup.wall_min_ms = 254;
            setup.wall_max_ms = 258;
        }
        setup
    }

    fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            // Two IDs per millisecond, so sequence overflow happens too.
            layout: Layout {
                time_bits: 8,
                worker_bits: 1,
                seq_bits: 1,
                epoch_ms: 0,
                unit_ms: 1,
            },
            rollback_ms_max: 1,
            rollback: RollbackPolicy::Refuse,
            reserve_ahead_ms: 4,
            flaw: self.flaw,
        }
    }
}

impl Cast for SnowflakeSetup {
    fn actor_name(&self, id: Id) -> String {
        match usize::from(id) {
            STORE => "store".to_owned(),
            _ => "worker".to_owned(),
        }
    }
}

/// Messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SnowMsg {
    /// Worker → store: a call of the lease holder (acquire a worker id, or persist a
    /// reservation with a [`StoreCall::RenewWorker`]).
    Call {
        /// Request id (the incarnation in the high 32 bits).
        id: u64,
        /// The call.
        call: StoreCall,
    },
    /// Store → worker.
    Answer {
        /// Request id.
        id: u64,
        /// The answer.
        reply: StoreReply,
    },
}
ord_by_total_cmp!(SnowMsg);

impl Brief for SnowMsg {
    fn brief(&self) -> String {
        let n = |id: &u64| id & 0xffff_ffff;
        match self {
            Self::Call {
                call: StoreCall::AcquireWorker(req),
                ..
            } => format!("Acquire{{{}}}", req.instance),
            Self::Call {
                id,
                call: StoreCall::RenewWorker { reserve_ts, .. },
            } => format!("Reserve#{}{{ts={reserve_ts}}}", n(id)),
            Self::Call { call, .. } => format!("{call:?}"),
            Self::Answer {
                id,
                reply: StoreReply::Worker(Ok(lease)),
            } => format!("Lease#{}{{reserved_ts={}}}", n(id), lease.reserved_ts),
            Self::Answer {
                reply: StoreReply::Worker(Err(err)),
                ..
            } => format!("{err}"),
            Self::Answer { id, reply } => format!("#{} {reply:?}", n(id)),
        }
    }
}

/// Timers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SnowTimer {
    /// A client asks for an ID.
    Issue,
    /// The wall clock steps forward 1 ms.
    Forward,
    /// The wall clock steps back 1 ms (inside the wait window).
    Back,
    /// The wall clock steps back 3 ms (beyond the wait window).
    BackFar,
}

/// The machine's non-volatile record: its wall clock and the ghost record of issued IDs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Machine {
    /// The running incarnation.
    pub incarnation: u32,
    /// The wall clock (ms).
    pub wall_ms: u64,
    /// `(incarnation, id)` in issue order.
    pub issued: Vec<(u32, u64)>,
}

/// The worker process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerNode {
    /// The worker's lease holder (`sut`'s, as in the simulator and the server): the worker once
    /// leased.
    pub holder: WorkerLeaseHolder,
    /// The client waits for the clock to move or a reservation to be acknowledged.
    pub blocked: bool,
    /// The machine record (mirrored into `Storage`).
    pub machine: Machine,
}

impl WorkerNode {
    /// The process's time: the machine's wall clock; no monotonic time (the holder's renewals
    /// and call timeouts are off in this model: only reservations make calls).
    const fn now(&self) -> Now {
        Now {
            wall_ms: self.machine.wall_ms,
            mono_ms: 0,
        }
    }
}

/// Actor states.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
// Each state already sits behind stateright's `Arc`; boxing a variant would add an allocation
// to every step.
#[allow(clippy::large_enum_variant)]
pub enum SnowState {
    /// The lease store.
    Store(MemoryIdStore),
    /// The worker.
    Worker(WorkerNode),
}

/// Actors.
#[derive(Clone, Debug)]
pub enum SnowActor {
    /// The lease store.
    Store,
    /// The worker.
    Worker(Box<SnowflakeSetup>),
}

impl SnowActor {
    fn instance(machine: &Machine) -> InstanceId {
        InstanceId(u64::from(machine.incarnation) + 1)
    }

    fn holder(setup: &SnowflakeSetup, machine: &Machine) -> WorkerLeaseHolder {
        let mut cfg = HolderConfig::new(
            NAMESPACE,
            Self::instance(machine),
            setup.worker_config(),
            0,
            u64::MAX,
        );
        cfg.renew_interval_ms = u64::MAX;
        cfg.request_id_base = u64::from(machine.incarnation) << 32;
        WorkerLeaseHolder::new(cfg)
    }

    fn drive(setup: &SnowflakeSetup, node: &mut WorkerNode, o: &mut Out<Self>) {
        if node.machine.incarnation <= setup.restarts_max
            && let Some((id, call)) = node.holder.poll_request(node.now())
        {
            o.send(Id::from(STORE), SnowMsg::Call { id, call });
        }
        observe(&mut node.holder);
        let budget_left = node.machine.issued.len() < setup.ids_max as usize;
        if node.holder.worker().is_some() && budget_left && !node.blocked {
            o.set_timer(SnowTimer::Issue, model_timeout());
        } else {
            o.cancel_timer(SnowTimer::Issue);
        }
        o.save(stored(node.machine.clone()));
    }
}

impl Actor for SnowActor {
    type Msg = SnowMsg;
    type Timer = SnowTimer;
    type State = SnowState;
    type Storage = Stored<Machine>;
    type Random = ();

    fn on_start(&self, _id: Id, storage: &Option<Stored<Machine>>, o: &mut Out<Self>) -> SnowState {
        match self {
            Self::Store => SnowState::Store(MemoryIdStore::new()),
            Self::Worker(setup) => {
                let mut machine = storage
                    .as_ref()
                    .map(|m| m.get().clone())
                    .unwrap_or(Machine {
                        incarnation: 0,
                        wall_ms: setup.wall_min_ms + 2,
                        issued: Vec::new(),
                    });
                if storage.is_some() {
                    machine.incarnation = (machine.incarnation + 1).min(setup.restarts_max + 1);
                }
                for timer in [SnowTimer::Forward, SnowTimer::Back, SnowTimer::BackFar] {
                    o.set_timer(timer, model_timeout());
                }
                let mut node = WorkerNode {
                    holder: Self::holder(setup, &machine),
                    blocked: false,
                    machine,
                };
                Self::drive(setup, &mut node, o);
                SnowState::Worker(node)
            }
        }
    }

    fn on_msg(
        &self,
        _id: Id,
        state: &mut Cow<'_, SnowState>,
        src: Id,
        msg: SnowMsg,
        o: &mut Out<Self>,
    ) {
        match (self, &**state, msg) {
            (Self::Store, SnowState::Store(store), SnowMsg::Call { id, mut call }) => {
                // The store's lease clock stays at 0: with zero-length leases a dead
                // incarnation's lease is always expired (see the module documentation).
                call.set_store_now(0);
                let mut next = store.clone();
                let reply = call.execute(&mut next);
                observe(&mut next);
                o.send(src, SnowMsg::Answer { id, reply });
                if &next != store {
                    *state = Cow::Owned(SnowState::Store(next));
                }
            }
            (Self::Worker(setup), SnowState::Worker(node), SnowMsg::Answer { id, reply }) => {
                let mut next = node.clone();
                let now = next.now();
                let event = next.holder.handle_reply(id, reply, now);
                observe(&mut next.holder);
                if event == HolderEvent::Ignored {
                    return; // late, duplicate, or meant for a predecessor
                }
                next.blocked = false;
                Self::drive(setup, &mut next, o);
                *state = Cow::Owned(SnowState::Worker(next));
            }
            _ => {}
        }
    }

    fn on_timeout(
        &self,
        _id: Id,
        state: &mut Cow<'_, SnowState>,
        timer: &SnowTimer,
        o: &mut Out<Self>,
    ) {
        let Self::Worker(setup) = self else { return };
        let SnowState::Worker(current) = &**state else {
            return;
        };
        let wall = current.machine.wall_ms;
        let moved = match timer {
            SnowTimer::Forward => (wall + 1).min(setup.wall_max_ms),
            SnowTimer::Back => wall.saturating_sub(1).max(setup.wall_min_ms),
            SnowTimer::BackFar => wall.saturating_sub(3).max(setup.wall_min_ms),
            SnowTimer::Issue => wall,
        };
        if *timer != SnowTimer::Issue {
            // Clock timers stay armed; a step that changes nothing is no step.
            o.set_timer(timer.clone(), model_timeout());
            if moved == wall {
                return;
            }
        }
        let SnowState::Worker(node) = state.to_mut() else {
            unreachable!()
        };
        if *timer != SnowTimer::Issue {
            node.machine.wall_ms = moved;
            node.blocked = false;
        } else if let Some(worker) = node.holder.worker_mut() {
            match worker.next_id(wall) {
                Ok(NextId::Id(id)) => node.machine.issued.push((node.machine.incarnation, id)),
                Ok(NextId::WaitUntil { .. } | NextId::WaitReservation) | Err(_) => {
                    node.blocked = true;
                }
            }
        }
        observe(&mut node.holder);
        Self::drive(setup, node, o);
    }
}

fn machine(sys: &stateright::actor::ActorModelState<HashedActor<SnowActor>>) -> Option<&Machine> {
    sys.actor_storages.iter().flatten().next().map(|m| m.get())
}

/// `ids.unique` and `ids.monotonic` across restarts: the issued IDs strictly increase.
#[must_use]
pub fn strictly_increasing(issued: &[(u32, u64)]) -> bool {
    let mut rising = sut::check::Rising::new();
    issued
        .iter()
        .all(|(_, id)| rising.observe((), *id, ()).is_none())
}

/// `ids.unique`: no ID issued twice, across incarnations.
#[must_use]
pub fn ids_unique(issued: &[(u32, u64)]) -> bool {
    let mut once = sut::check::AtMostOnce::new();
    issued.iter().all(|(_, id)| once.observe(*id, ()).is_none())
}

fn worker_stats(
    sys: &stateright::actor::ActorModelState<HashedActor<SnowActor>>,
) -> Option<sut::snowflake::SequencerStats> {
    sys.actor_states.iter().find_map(|s| match &***s {
        SnowState::Worker(node) => node.holder.worker().map(|w| w.sequencer().stats()),
        SnowState::Store(_) => None,
    })
}

/// The model.
#[must_use]
pub fn model(setup: &SnowflakeSetup) -> NetModel<HashedActor<SnowActor>, SnowflakeSetup> {
    let actors = ActorModel::new(setup.clone(), ())
        .actor(HashedActor(SnowActor::Store))
        .actor(HashedActor(SnowActor::Worker(Box::new(setup.clone()))))
        .lossy_network(if setup.lossy {
            LossyNetwork::Yes
        } else {
            LossyNetwork::No
        })
        .max_crashes(1)
        .within_boundary(|_, sys| !sys.crashed[STORE])
        .property(Expectation::Always, "ids.unique", |_, sys| {
            machine(sys).is_none_or(|m| ids_unique(&m.issued))
        })
        .property(Expectation::Always, "ids.monotonic", |_, sys| {
            machine(sys).is_none_or(|m| strictly_increasing(&m.issued))
        })
        .property(Expectation::Always, WORKER_INVARIANTS, |_, sys| {
            sys.actor_states.iter().all(|s| match &***s {
                SnowState::Worker(node) => node.holder.check_invariants().is_ok(),
                SnowState::Store(_) => true,
            })
        })
        .property(Expectation::Sometimes, "issued after restart", |_, sys| {
            machine(sys).is_some_and(|m| m.issued.iter().any(|(inc, _)| *inc > 0))
        })
        .property(
            Expectation::Sometimes,
            "backward clock waited or refused",
            |_, sys| worker_stats(sys).is_some_and(|s| s.rollback_waits + s.rollback_refusals > 0),
        )
        .property(
            Expectation::Sometimes,
            "waited for a reservation",
            |_, sys| worker_stats(sys).is_some_and(|s| s.reservation_waits > 0),
        );
    NetModel::new(actors, setup.duplicates_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelOptions, PropertyVerdict, runner};

    #[test]
    fn correct_code_holds_and_every_sometimes_is_found() {
        let opts = ModelOptions {
            threads: 1,
            depth: Some(15),
            flaw: None,
            progress: false,
        };
        let report = runner::run(model(&SnowflakeSetup::default()), NAME, &opts).unwrap();
        assert!(report.failures().is_empty(), "{:#?}", report.failures());
        assert_eq!(
            report.property("ids.unique").unwrap().verdict,
            PropertyVerdict::Holds
        );
        assert_eq!(
            report.property("issued after restart").unwrap().verdict,
            PropertyVerdict::Found
        );
        assert_eq!(report.unique_states, PINNED_UNIQUE, "regression guard");
    }

    const PINNED_UNIQUE: u64 = 226_244;

    #[test]
    fn the_order_check_fires_on_a_repeat_or_a_step_back() {
        assert!(strictly_increasing(&[(0, 4), (0, 5), (1, 9)]));
        assert!(!strictly_increasing(&[(0, 4), (1, 4)]));
        assert!(!strictly_increasing(&[(0, 6), (1, 5)]));
        assert!(ids_unique(&[(0, 4), (1, 5)]));
        assert!(
            !ids_unique(&[(0, 4), (1, 4)]),
            "4 issued twice, across a restart"
        );
    }
}

#[cfg(test)]
mod flaw_tests {
    use super::*;

    #[test]
    fn seq_reset_first_has_a_short_counterexample() {
        let opts = crate::ModelOptions {
            threads: 1,
            depth: Some(DEPTH_DEFAULT),
            flaw: Some("snowflake_seq_reset_first".into()),
            progress: false,
        };
        let report = crate::runner::run(
            model(&SnowflakeSetup::with_flaw(Some(
                Flaw::SnowflakeSeqResetFirst,
            ))),
            NAME,
            &opts,
        )
        .unwrap();
        let unique = report
            .properties
            .iter()
            .find(|p| p.name == "ids.unique")
            .unwrap();
        assert_eq!(unique.verdict, crate::PropertyVerdict::Violated);
        let steps = unique.counterexample.as_ref().unwrap();
        assert!(steps.len() <= 12, "{steps:?}");
    }
}
