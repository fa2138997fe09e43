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
use sut::snowflake::{Layout, NextId, RollbackPolicy, SnowflakeWorker, WorkerConfig};
use sut::store::{
    IdStore, InstanceId, MemoryIdStore, StoreCall, StoreError, StoreReply, WorkerLease,
    WorkerRequest,
};

use crate::hashed::{HashedActor, Stored, stored};
use crate::runner::{Brief, Cast, NetModel, ord_by_total_cmp};

/// Catalog name.
pub const NAME: &str = "snowflake";
/// Catalog description.
pub const DESCRIPTION: &str = "1 Snowflake worker + its lease store; wall clock steps forward and \
     backward, crash/restart: ids.unique, ids.monotonic across restarts";
/// The `sut::flaw::Flaw` switches of `sut::snowflake` this model can turn on.
pub const FLAWS: &[&str] = &[
    "snowflake_seq_reset_first",
    "snowflake_no_persisted_ts",
    "time_field_narrow",
];

/// The default depth bound (the exhaustive space does not finish in seconds; see
/// `docs/models.md`).
pub const DEPTH_DEFAULT: usize = 18;

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
    pub fn with_flaw(flaw: Option<&str>) -> Self {
        let flaw: Option<sut::flaw::Flaw> = flaw.and_then(|f| f.parse().ok());
        let mut setup = Self {
            flaw,
            ..Self::default()
        };
        if flaw == Some(sut::flaw::Flaw::TimeFieldNarrow) {
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
    /// Worker → store: lease a worker id (`id` names the incarnation's request).
    Acquire {
        /// Request id.
        id: u64,
        /// The request.
        req: WorkerRequest,
    },
    /// Store → worker.
    Acquired {
        /// Request id.
        id: u64,
        /// The lease.
        lease: Result<WorkerLease, StoreError>,
    },
    /// Worker → store: persist a reservation (a [`StoreCall::RenewWorker`]).
    Reserve {
        /// Request id.
        id: u64,
        /// The call.
        call: StoreCall,
    },
    /// Store → worker.
    Reserved {
        /// Request id.
        id: u64,
        /// The answer.
        reply: StoreReply,
    },
}
ord_by_total_cmp!(SnowMsg);

impl Brief for SnowMsg {
    fn brief(&self) -> String {
        match self {
            Self::Acquire { req, .. } => format!("Acquire{{{}}}", req.instance),
            Self::Acquired {
                lease: Ok(lease),
                id,
            } => format!("Lease#{}{{reserved_ts={}}}", id >> 32, lease.reserved_ts),
            Self::Acquired {
                lease: Err(err), ..
            } => format!("{err}"),
            Self::Reserve { id, call } => match call {
                StoreCall::RenewWorker { reserve_ts, .. } => {
                    format!("Reserve#{}{{ts={reserve_ts}}}", id & 0xffff_ffff)
                }
                other => format!("{other:?}"),
            },
            Self::Reserved { id, reply } => match reply {
                StoreReply::Worker(Ok(lease)) => {
                    format!("Reserved#{}{{ts={}}}", id & 0xffff_ffff, lease.reserved_ts)
                }
                other => format!("#{} {other:?}", id & 0xffff_ffff),
            },
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
    /// `None` until the lease arrives (or after the restarts are used up).
    pub worker: Option<SnowflakeWorker>,
    /// Reservation in flight: request id.
    pub reserving: Option<u64>,
    /// Request ids issued so far.
    pub requests: u64,
    /// The client waits for the clock to move or a reservation to be acknowledged.
    pub blocked: bool,
    /// The machine record (mirrored into `Storage`).
    pub machine: Machine,
}

/// Actor states.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

    fn drive(setup: &SnowflakeSetup, node: &mut WorkerNode, o: &mut Out<Self>) {
        let instance = Self::instance(&node.machine);
        if let Some(worker) = node.worker.as_mut()
            && let Some(reserve_ts) = worker.poll_reservation()
        {
            node.requests += 1;
            let id = (u64::from(node.machine.incarnation) << 32) | node.requests;
            node.reserving = Some(id);
            o.send(
                Id::from(STORE),
                SnowMsg::Reserve {
                    id,
                    call: StoreCall::RenewWorker {
                        namespace: NAMESPACE.to_owned(),
                        worker_id: worker.worker_id(),
                        instance,
                        reserve_ts,
                        lease_ms: 0,
                        now_ms: 0,
                    },
                },
            );
        }
        let budget_left = node.machine.issued.len() < setup.ids_max as usize;
        if node.worker.is_some() && budget_left && !node.blocked {
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
                if machine.incarnation <= setup.restarts_max {
                    o.send(
                        Id::from(STORE),
                        SnowMsg::Acquire {
                            id: u64::from(machine.incarnation) << 32,
                            req: WorkerRequest {
                                namespace: NAMESPACE.to_owned(),
                                worker_count: 1,
                                instance: Self::instance(&machine),
                                lease_ms: 0,
                                now_ms: 0,
                            },
                        },
                    );
                }
                for timer in [SnowTimer::Forward, SnowTimer::Back, SnowTimer::BackFar] {
                    o.set_timer(timer, model_timeout());
                }
                let mut node = WorkerNode {
                    worker: None,
                    reserving: None,
                    requests: 0,
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
            (Self::Store, SnowState::Store(store), SnowMsg::Acquire { id, req }) => {
                let mut next = store.clone();
                let lease = next.acquire_worker(&req);
                o.send(src, SnowMsg::Acquired { id, lease });
                if &next != store {
                    *state = Cow::Owned(SnowState::Store(next));
                }
            }
            (Self::Store, SnowState::Store(store), SnowMsg::Reserve { id, call }) => {
                let mut next = store.clone();
                let reply = call.execute(&mut next);
                o.send(src, SnowMsg::Reserved { id, reply });
                if &next != store {
                    *state = Cow::Owned(SnowState::Store(next));
                }
            }
            (
                Self::Worker(setup),
                SnowState::Worker(node),
                SnowMsg::Acquired {
                    id,
                    lease: Ok(lease),
                },
            ) => {
                // Only this incarnation's answer: a late lease meant for a predecessor carries
                // a stale reservation.
                if node.worker.is_some()
                    || node.machine.incarnation > setup.restarts_max
                    || id != u64::from(node.machine.incarnation) << 32
                {
                    return;
                }
                let worker = SnowflakeWorker::new(
                    setup.worker_config(),
                    lease.worker_id,
                    lease.reserved_ts,
                    node.machine.wall_ms,
                )
                .expect("the model's layout is valid");
                let SnowState::Worker(node) = state.to_mut() else {
                    unreachable!()
                };
                node.worker = Some(worker);
                Self::drive(setup, node, o);
            }
            (Self::Worker(setup), SnowState::Worker(node), SnowMsg::Reserved { id, reply }) => {
                if node.reserving != Some(id) {
                    return;
                }
                let SnowState::Worker(node) = state.to_mut() else {
                    unreachable!()
                };
                node.reserving = None;
                node.blocked = false;
                if let Some(worker) = node.worker.as_mut() {
                    match reply {
                        StoreReply::Worker(Ok(lease)) => worker.handle_reserved(lease.reserved_ts),
                        StoreReply::Worker(Err(StoreError::WorkerLeaseLost { .. })) => {
                            worker.handle_lease_lost();
                        }
                        _ => worker.handle_reservation_failed(),
                    }
                }
                Self::drive(setup, node, o);
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
        } else if let Some(worker) = node.worker.as_mut() {
            match worker.next_id(wall) {
                Ok(NextId::Id(id)) => node.machine.issued.push((node.machine.incarnation, id)),
                Ok(NextId::WaitUntil { .. } | NextId::WaitReservation) | Err(_) => {
                    node.blocked = true;
                }
            }
        }
        Self::drive(setup, node, o);
    }
}

fn machine(sys: &stateright::actor::ActorModelState<HashedActor<SnowActor>>) -> Option<&Machine> {
    sys.actor_storages.iter().flatten().next().map(|m| m.get())
}

/// `ids.unique` and `ids.monotonic` across restarts: the issued IDs strictly increase.
#[must_use]
pub fn strictly_increasing(issued: &[(u32, u64)]) -> bool {
    issued.windows(2).all(|w| w[0].1 < w[1].1)
}

fn worker_stats(
    sys: &stateright::actor::ActorModelState<HashedActor<SnowActor>>,
) -> Option<sut::snowflake::SequencerStats> {
    sys.actor_states.iter().find_map(|s| match &***s {
        SnowState::Worker(node) => node.worker.as_ref().map(|w| w.sequencer().stats()),
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
            machine(sys).is_none_or(|m| {
                let mut ids: Vec<u64> = m.issued.iter().map(|(_, id)| *id).collect();
                ids.sort_unstable();
                ids.windows(2).all(|w| w[0] != w[1])
            })
        })
        .property(Expectation::Always, "ids.monotonic", |_, sys| {
            machine(sys).is_none_or(|m| strictly_increasing(&m.issued))
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
    use crate::{ModelOptions, Verdict, runner};

    #[test]
    fn correct_code_holds_and_every_sometimes_is_found() {
        let opts = ModelOptions {
            threads: 1,
            depth: Some(15),
            flaw: None,
        };
        let report = runner::run(model(&SnowflakeSetup::default()), NAME, &opts).unwrap();
        assert!(report.failures().is_empty(), "{:#?}", report.failures());
        assert_eq!(
            report.property("ids.unique").unwrap().verdict,
            Verdict::Holds
        );
        assert_eq!(
            report.property("issued after restart").unwrap().verdict,
            Verdict::Found
        );
        assert_eq!(report.unique_states, PINNED_UNIQUE, "regression guard");
    }

    const PINNED_UNIQUE: usize = 180_809;

    #[test]
    fn the_order_check_fires_on_a_repeat_or_a_step_back() {
        assert!(strictly_increasing(&[(0, 4), (0, 5), (1, 9)]));
        assert!(!strictly_increasing(&[(0, 4), (1, 4)]));
        assert!(!strictly_increasing(&[(0, 6), (1, 5)]));
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
        };
        let report = crate::runner::run(
            model(&SnowflakeSetup::with_flaw(opts.flaw.as_deref())),
            NAME,
            &opts,
        )
        .unwrap();
        let unique = report
            .properties
            .iter()
            .find(|p| p.name == "ids.unique")
            .unwrap();
        assert_eq!(unique.verdict, crate::Verdict::Violated);
        let steps = unique.counterexample.as_ref().unwrap();
        assert!(steps.len() <= 12, "{steps:?}");
    }
}
