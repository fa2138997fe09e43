//! Segment allocation: allocators ([`sut::segment::SegmentAllocator`]) and one ID store
//! ([`sut::id_store::MemoryIdStore`]) over an unordered network with bounded duplication (optionally
//! lossy; see [`crate::runner`]), with allocator crashes and restarts (segment-ID design §1 and
//! §3, docs/sources.md; Tinyid's version CAS; Gray & Cheriton leases).
//!
//! Actors:
//!
//! - `store` (actor 0) answers every [`StoreCall`] by [`StoreCall::execute`] on its
//!   `MemoryIdStore`, after stamping its own lease clock into the call
//!   ([`StoreCall::set_store_now`]). Its clock is a nondeterministic input: a `StoreClock` timer
//!   may jump it to the earliest lease expiry at any moment, and then expired leases are
//!   reclaimed ([`IdStore::reclaim_expired`]). Nothing ties it to the allocators' clocks: the
//!   model lets clocks disagree without bound, which is exactly the zombie case the claims
//!   must survive.
//! - `alloc-N` (actors 1..) wrap a `SegmentAllocator` and its monotonic clock. A `Client` timer
//!   asks for one ID ([`SegmentAllocator::next_id`]); a `Deadline` timer advances the clock to
//!   [`SegmentAllocator::poll_timeout`] and calls `handle_timeout` (so a timeout can fire before
//!   or after any reply: time is nondeterministic). Store answers go to `handle_reply`; after
//!   every input the driver drains `poll_request` into messages. A client told `Pending` waits
//!   for the next reply or timeout that changes the allocator (the documented driver contract).
//!   A restart (stateright `Recover`) builds a *new* allocator with a new [`InstanceId`] and a
//!   monotonic clock from zero, as a restarted process would.
//!
//! Ghost state: each allocator slot keeps, in stateright's non-volatile `Storage`, every ID any
//! of its incarnations issued (with the incarnation), and how many restarts it has had. The
//! properties read those records, so IDs issued by dead incarnations still count.
//!
//! Properties: `ids.unique` and `ids.monotonic` (always); sometimes: a buffer switch, a CAS
//! conflict retried, a reclaimed tail granted again from the pool, a lease lost, an ID issued
//! after a restart.

use std::borrow::Cow;

use stateright::Expectation;
use stateright::actor::{Actor, ActorModel, Id, LossyNetwork, Out, model_timeout};
use sut::clock::Now;
use sut::flaw::Flaw;
use sut::id_store::{
    IdStore, InstanceId, MemoryIdStore, StoreCall, StoreError, StoreReply, TagSpec,
};
use sut::segment::{AllocatorConfig, Request, SegmentAllocator, StepPolicy, Take};

use crate::ModelError;
use crate::edges::observe;
use crate::hashed::{HashedActor, Stored, stored};
use crate::runner::{Brief, Cast, NetModel, ord_by_total_cmp};

/// Catalog name.
pub const NAME: &str = "segment";
/// Catalog description.
pub const DESCRIPTION: &str = "2 segment allocators + 1 ID store; reordering, duplicating \
     network, allocator crash/restart, store clock jumps (depth 14): ids.unique, ids.monotonic";
/// The edge states this model owns (reported as `sometimes` properties).
pub const EDGES: &[&str] = &[
    "segment.version_conflict",
    "segment.pool_grant",
    "segment.zombie_tail_reclaimed",
    "segment.last_id_while_next_unloaded",
];

/// The `sut::flaw::Flaw` switches of `sut::segment` this model can turn on.
pub const FLAWS: &[Flaw] = &[Flaw::SegmentNoVersionCheck, Flaw::CounterNoPersist];

/// The default depth bound: the bounded state space of two allocators with time, crashes and
/// duplicates is too large to exhaust in seconds (see `docs/models.md`), so the catalog run
/// explores every path up to this many steps.
pub const DEPTH_DEFAULT: usize = 14;

/// The `always` property that runs [`MemoryIdStore::check_invariants`] on the store.
pub const STORE_INVARIANTS: &str = "store.invariants";

/// The `always` property that runs [`SegmentAllocator::check_invariants`] on every allocator.
pub const ALLOCATOR_INVARIANTS: &str = "allocator.invariants";

/// The tag every allocator draws from.
pub const TAG: &str = "t";

/// The model's bounds and protocol settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSetup {
    /// Allocator actors (2–3).
    pub allocators: usize,
    /// IDs each allocator slot's clients ask for, over all its incarnations.
    pub ids_per_allocator: u32,
    /// Restarts per allocator slot.
    pub restarts_max: u32,
    /// Crashed allocators at once (stateright `max_crashes`).
    pub crashes_max: usize,
    /// The tag's database step (IDs per segment).
    pub step: u64,
    /// Claim size, percent of the segment.
    pub claim_pct: u8,
    /// The first allocator's claim size when it differs from `claim_pct`. One allocator that
    /// claims whole segments issues them without a claim renewal, which brings a buffer switch
    /// within the depth bound; the other still leaves unclaimed tails for the store to reclaim
    /// and grant again. Allocators of one fleet may well be configured differently.
    pub first_claim_pct: Option<u8>,
    /// Prefetch threshold, percent of the segment used.
    pub prefetch_used_pct: u8,
    /// Lease length (ms).
    pub lease_ms: u64,
    /// Allocators' monotonic clocks do not pass this (ms): bounds renewals and retries.
    pub horizon_ms: u64,
    /// Segments the store grants at most (a boundary: without it a store that keeps reclaiming
    /// could feed allocators fresh segments forever).
    pub grants_max: u32,
    /// Times the store's lease clock jumps at most.
    pub store_clock_jumps_max: u32,
    /// Whether the network loses messages.
    pub lossy: bool,
    /// In-flight messages the network duplicates, per run.
    pub duplicates_max: u8,
    /// A documented flaw switched on in the allocators (`None`: the correct code).
    pub flaw: Option<sut::flaw::Flaw>,
}

impl Default for SegmentSetup {
    fn default() -> Self {
        Self {
            allocators: 2,
            ids_per_allocator: 3,
            restarts_max: 1,
            crashes_max: 1,
            step: 2,
            claim_pct: 50,
            first_claim_pct: Some(100),
            prefetch_used_pct: 50,
            lease_ms: 10,
            horizon_ms: 4,
            grants_max: 4,
            store_clock_jumps_max: 1,
            lossy: false,
            duplicates_max: 1,
            flaw: None,
        }
    }
}

impl SegmentSetup {
    /// The default setup with the named flaw (one of [`FLAWS`]) switched on.
    #[must_use]
    pub fn with_flaw(flaw: Option<Flaw>) -> Self {
        Self {
            flaw,
            ..Self::default()
        }
    }

    fn allocator_config(&self, instance: InstanceId) -> AllocatorConfig {
        let mut cfg = AllocatorConfig::new(TAG, instance);
        cfg.step = StepPolicy::Fixed { step: 0 };
        cfg.prefetch_used_pct = self.prefetch_used_pct;
        // instance ids are `slot * 100 + incarnation`; allocator slots start at 1
        cfg.claim_pct = match self.first_claim_pct {
            Some(pct) if instance.0 / 100 == 1 => pct,
            _ => self.claim_pct,
        };
        cfg.lease_ms = self.lease_ms;
        cfg.drift_ms_max = 2;
        cfg.renew_interval_ms = 4;
        cfg.request_timeout_ms = 3;
        cfg.cas_retries_max = 2;
        cfg.backoff_ms = 1;
        cfg.backoff_ms_max = 2;
        cfg.failures_before_unavailable = 2;
        cfg.flaw = self.flaw;
        cfg
    }
}

impl Cast for SegmentSetup {
    fn actor_name(&self, id: Id) -> String {
        match usize::from(id) {
            0 => "store".to_owned(),
            n => format!("alloc-{n}"),
        }
    }
}

/// A message between an allocator and the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SegMsg {
    /// Allocator → store: a store call and its request id.
    Call(Request),
    /// Store → allocator: the answer to request `id`.
    Reply {
        /// The request id.
        id: u64,
        /// The answer.
        reply: StoreReply,
    },
}
ord_by_total_cmp!(SegMsg);

fn short_err(err: &StoreError) -> String {
    match err {
        StoreError::VersionConflict {
            expected, actual, ..
        } => format!("VersionConflict{{expected={expected}, actual={actual}}}"),
        StoreError::LeaseLost { segment_start, .. } => format!("LeaseLost{{seg={segment_start}}}"),
        other => format!("{other}"),
    }
}

impl Brief for SegMsg {
    fn brief(&self) -> String {
        match self {
            Self::Call(Request { id, call }) => {
                let id = id & 0xffff_ffff;
                match call {
                    StoreCall::Read { .. } => format!("Read#{id}"),
                    StoreCall::Allocate(r) => format!(
                        "Allocate#{id}{{v={}, ids={}, min_id={}, claim={}}}",
                        r.expected_version, r.ids, r.min_id, r.claim_ids
                    ),
                    StoreCall::Renew(r) => format!(
                        "Renew#{id}{{seg={}, claim_end={}}}",
                        r.segment_start, r.claim_end
                    ),
                    StoreCall::Release(r) => format!(
                        "Release#{id}{{seg={}, used_end={}}}",
                        r.segment_start, r.used_end
                    ),
                    StoreCall::RenewWorker { reserve_ts, .. } => {
                        format!("RenewWorker#{id}{{reserve_ts={reserve_ts}}}")
                    }
                    StoreCall::AcquireWorker(r) => {
                        format!("AcquireWorker#{id}{{ns={}}}", r.namespace)
                    }
                }
            }
            Self::Reply { id, reply } => {
                let id = id & 0xffff_ffff;
                let body = match reply {
                    StoreReply::Read(Ok(row)) => format!(
                        "Tag{{v={}, max_id={}, pool={:?}}}",
                        row.version,
                        row.max_id,
                        row.pool
                            .iter()
                            .map(|s| (s.start, s.end))
                            .collect::<Vec<_>>()
                    ),
                    StoreReply::Allocate(Ok(g)) => format!(
                        "Grant{{[{}, {}), claim_end={}, expiry={}{}}}",
                        g.segment.start,
                        g.segment.end,
                        g.claim_end,
                        g.lease_expiry_ms,
                        if g.from_pool { ", from pool" } else { "" }
                    ),
                    StoreReply::Renew(Ok(l)) => format!(
                        "Lease{{claim_end={}, expiry={}}}",
                        l.claim_end, l.lease_expiry_ms
                    ),
                    StoreReply::Release(Ok(())) => "Released".to_owned(),
                    StoreReply::Worker(Ok(w)) => {
                        format!("WorkerLease{{reserved_ts={}}}", w.reserved_ts)
                    }
                    StoreReply::Read(Err(e))
                    | StoreReply::Allocate(Err(e))
                    | StoreReply::Renew(Err(e))
                    | StoreReply::Release(Err(e))
                    | StoreReply::Worker(Err(e)) => short_err(e),
                };
                format!("#{id} {body}")
            }
        }
    }
}

/// Timers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegTimer {
    /// A client asks this allocator for an ID.
    Client,
    /// The allocator's next deadline (`poll_timeout`) is reached.
    Deadline,
    /// The store's lease clock jumps to the earliest lease expiry.
    StoreClock,
}

/// The actors.
#[derive(Clone, Debug)]
pub enum SegActor {
    /// The ID store.
    Store {
        /// The store as it starts: the tag created (built by [`model`], which reports a setup
        /// the store refuses).
        initial: Box<MemoryIdStore>,
    },
    /// An allocator slot.
    Allocator {
        /// The model's settings.
        setup: Box<SegmentSetup>,
    },
}

/// The store node: the store and its lease clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreNode {
    /// The database.
    pub store: MemoryIdStore,
    /// Its lease clock (ms).
    pub now_ms: u64,
    /// Segments granted so far.
    pub grants: u32,
    /// Clock jumps so far.
    pub clock_jumps: u32,
    /// Reclaim sweeps the store refused (all or nothing). A correct allocator never causes one;
    /// after the blind-write flaw handed a range out twice, a reclaim can collide with a pooled
    /// range and the store refuses it unchanged, as SQLite's primary key does. A refusal is an
    /// outcome the model records, not a reason to stop: `ids.unique` judges the flaw.
    pub reclaims_refused: u32,
}

/// An allocator process: the state machine and its monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllocNode {
    /// `None` once the slot's restarts are used up (the process stays down).
    pub alloc: Option<SegmentAllocator>,
    /// The process's clock (wall = monotonic here; the store owns lease time).
    pub now: Now,
    /// A client was told `Pending` and waits for a reply or timeout that changes the allocator.
    pub waiting: bool,
    /// The ghost record, mirrored into `Storage`.
    pub ghost: Ghost,
}

/// What clients of one allocator slot observed, over all its incarnations (non-volatile).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The running incarnation (0 = first start).
    pub incarnation: u32,
    /// `(incarnation, id)` in issue order.
    pub issued: Vec<(u32, u64)>,
}

/// Actor states.
// Each state already sits behind stateright's `Arc`; boxing a variant would add an allocation
// to every step.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SegState {
    /// The store.
    Store(StoreNode),
    /// An allocator.
    Allocator(AllocNode),
}

const STORE: usize = 0;

/// What a waiting client cares about: the allocator's buffers (segment, next ID, claim). A
/// client told `Pending` asks again only once these change (a grant, a raised claim, a dropped
/// buffer): asking earlier would only count another `Pending`.
fn buffers(alloc: &SegmentAllocator, now: Now) -> [Option<(u64, u64, u64)>; 2] {
    let health = alloc.health(now);
    [health.current, health.next].map(|b| b.map(|b| (b.segment.start, b.next, b.claim_end)))
}

fn arm_store(node: &StoreNode, o: &mut Out<SegActor>) {
    let mut store = node.store.clone();
    let live = store.leases().map(|l| !l.is_empty()).unwrap_or(false);
    if live {
        o.set_timer(SegTimer::StoreClock, model_timeout());
    } else {
        o.cancel_timer(SegTimer::StoreClock);
    }
}

impl SegActor {
    /// After any input: send what the allocator wants sent, arm what it waits for.
    fn drive(setup: &SegmentSetup, node: &mut AllocNode, o: &mut Out<Self>) {
        let Some(alloc) = node.alloc.as_mut() else {
            return;
        };
        while let Some(req) = alloc.poll_request() {
            o.send(Id::from(STORE), SegMsg::Call(req));
        }
        let budget_left = node.ghost.issued.len() < setup.ids_per_allocator as usize;
        if budget_left && !node.waiting {
            o.set_timer(SegTimer::Client, model_timeout());
        } else {
            o.cancel_timer(SegTimer::Client);
        }
        match alloc.poll_timeout() {
            Some(at) if at <= setup.horizon_ms => o.set_timer(SegTimer::Deadline, model_timeout()),
            _ => o.cancel_timer(SegTimer::Deadline),
        }
    }
}

impl Actor for SegActor {
    type Msg = SegMsg;
    type Timer = SegTimer;
    type State = SegState;
    type Storage = Stored<Ghost>;
    type Random = ();

    fn on_start(&self, id: Id, storage: &Option<Stored<Ghost>>, o: &mut Out<Self>) -> SegState {
        match self {
            Self::Store { initial } => SegState::Store(StoreNode {
                store: (**initial).clone(),
                now_ms: 0,
                grants: 0,
                clock_jumps: 0,
                reclaims_refused: 0,
            }),
            Self::Allocator { setup } => {
                let mut ghost = storage
                    .as_ref()
                    .map(|g| g.get().clone())
                    .unwrap_or_default();
                if storage.is_some() {
                    // Saturates: a slot whose restarts are used up stays down.
                    ghost.incarnation = (ghost.incarnation + 1).min(setup.restarts_max + 1);
                }
                let slot = usize::from(id) as u64;
                let alloc = (ghost.incarnation <= setup.restarts_max).then(|| {
                    // Instance ids unique across slots and incarnations.
                    let instance = InstanceId(slot * 100 + u64::from(ghost.incarnation));
                    SegmentAllocator::new(setup.allocator_config(instance), Now::both(0))
                        .expect("the model's allocator settings are valid")
                });
                o.save(stored(ghost.clone()));
                let mut node = AllocNode {
                    alloc,
                    now: Now::both(0),
                    waiting: false,
                    ghost,
                };
                Self::drive(setup, &mut node, o);
                SegState::Allocator(node)
            }
        }
    }

    fn on_msg(
        &self,
        _id: Id,
        state: &mut Cow<'_, SegState>,
        src: Id,
        msg: SegMsg,
        o: &mut Out<Self>,
    ) {
        match (self, &**state, msg) {
            (Self::Store { .. }, SegState::Store(node), SegMsg::Call(req)) => {
                let mut call = req.call;
                call.set_store_now(node.now_ms);
                let mut store = node.store.clone();
                let reply = call.execute(&mut store);
                observe(&mut store);
                let granted = matches!(reply, StoreReply::Allocate(Ok(_)));
                o.send(src, SegMsg::Reply { id: req.id, reply });
                if store != node.store {
                    // built anew: `Cow::to_mut` would first clone the old store
                    let next = StoreNode {
                        store,
                        now_ms: node.now_ms,
                        grants: node.grants + u32::from(granted),
                        clock_jumps: node.clock_jumps,
                        reclaims_refused: node.reclaims_refused,
                    };
                    arm_store(&next, o);
                    *state = Cow::Owned(SegState::Store(next));
                }
            }
            (Self::Allocator { setup }, SegState::Allocator(node), SegMsg::Reply { id, reply }) => {
                let Some(alloc) = &node.alloc else { return };
                let mut next = alloc.clone();
                next.handle_reply(id, reply, node.now);
                observe(&mut next);
                if &next == alloc {
                    return; // an answer the allocator ignores (late, duplicate, foreign)
                }
                let buffers_changed = buffers(&next, node.now) != buffers(alloc, node.now);
                // built anew: `Cow::to_mut` would first clone the old allocator
                let mut node = AllocNode {
                    alloc: Some(next),
                    now: node.now,
                    waiting: node.waiting && !buffers_changed,
                    ghost: node.ghost.clone(),
                };
                Self::drive(setup, &mut node, o);
                *state = Cow::Owned(SegState::Allocator(node));
            }
            _ => {}
        }
    }

    fn on_timeout(
        &self,
        _id: Id,
        state: &mut Cow<'_, SegState>,
        timer: &SegTimer,
        o: &mut Out<Self>,
    ) {
        match (self, timer) {
            (Self::Store { .. }, SegTimer::StoreClock) => {
                let SegState::Store(node) = state.to_mut() else {
                    return;
                };
                let earliest = node
                    .store
                    .leases()
                    .ok()
                    .and_then(|ls| ls.iter().map(|l| l.lease_expiry_ms).min());
                if let Some(at) = earliest {
                    node.now_ms = node.now_ms.max(at);
                    node.clock_jumps += 1;
                    // A refusal leaves the store unchanged (all or nothing): recorded, and the
                    // allocators carry on against the unchanged store.
                    if node.store.reclaim_expired(node.now_ms).is_err() {
                        node.reclaims_refused += 1;
                    }
                    observe(&mut node.store);
                }
                arm_store(node, o);
            }
            (Self::Allocator { setup }, SegTimer::Client) => {
                let SegState::Allocator(node) = state.to_mut() else {
                    return;
                };
                let now = node.now;
                let Some(alloc) = node.alloc.as_mut() else {
                    return;
                };
                let take = alloc.next_id(now);
                observe(alloc);
                match take {
                    Take::Block(block) => {
                        for id in block.ids() {
                            node.ghost.issued.push((node.ghost.incarnation, id));
                        }
                        o.save(stored(node.ghost.clone()));
                    }
                    Take::Degraded(id) => {
                        node.ghost.issued.push((node.ghost.incarnation, id));
                        o.save(stored(node.ghost.clone()));
                    }
                    Take::Pending | Take::Unavailable(_) => node.waiting = true,
                }
                Self::drive(setup, node, o);
            }
            (Self::Allocator { setup }, SegTimer::Deadline) => {
                let SegState::Allocator(node) = state.to_mut() else {
                    return;
                };
                let Some(alloc) = node.alloc.as_mut() else {
                    return;
                };
                if let Some(at) = alloc.poll_timeout() {
                    let before = buffers(alloc, node.now);
                    let ms = node.now.mono_ms.max(at);
                    node.now = Now::both(ms);
                    alloc.handle_timeout(node.now);
                    observe(alloc);
                    node.waiting &= buffers(alloc, node.now) == before;
                }
                Self::drive(setup, node, o);
            }
            _ => {}
        }
    }
}

fn ghosts(
    state: &stateright::actor::ActorModelState<HashedActor<SegActor>>,
) -> impl Iterator<Item = &Ghost> {
    state.actor_storages.iter().flatten().map(|g| g.get())
}

fn allocators(
    state: &stateright::actor::ActorModelState<HashedActor<SegActor>>,
) -> impl Iterator<Item = &SegmentAllocator> {
    state.actor_states.iter().filter_map(|s| match &***s {
        SegState::Allocator(node) => node.alloc.as_ref(),
        SegState::Store(_) => None,
    })
}

/// `ids.unique`: no ID issued twice, across allocators and incarnations.
#[must_use]
pub fn ids_unique(ghosts: &[&Ghost]) -> bool {
    let mut once = sut::check::AtMostOnce::new();
    ghosts
        .iter()
        .flat_map(|g| g.issued.iter())
        .all(|(_, id)| once.observe(*id, ()).is_none())
}

/// `ids.monotonic`: each allocator instance's IDs strictly increase.
#[must_use]
pub fn ids_monotonic(ghost: &Ghost) -> bool {
    let mut rising = sut::check::Rising::new();
    ghost
        .issued
        .iter()
        .all(|(incarnation, id)| rising.observe(*incarnation, *id, ()).is_none())
}

/// The store as the model starts it: the tag created with the setup's step.
fn initial_store(setup: &SegmentSetup) -> Result<MemoryIdStore, ModelError> {
    let mut store = MemoryIdStore::new();
    store
        .create_tag(TAG, &TagSpec::simple(setup.step))
        .map_err(|e| ModelError::InvalidOptions(format!("segment model: tag `{TAG}`: {e}")))?;
    Ok(store)
}

/// The model, or why its setup cannot be modelled.
pub fn model(
    setup: &SegmentSetup,
) -> Result<NetModel<HashedActor<SegActor>, SegmentSetup>, ModelError> {
    if !(1..=3).contains(&setup.allocators) {
        return Err(ModelError::InvalidOptions(format!(
            "segment model: {} allocators (1 to 3 keep the model small)",
            setup.allocators
        )));
    }
    let initial = Box::new(initial_store(setup)?);
    let actors = ActorModel::new(setup.clone(), ())
        .actor(HashedActor(SegActor::Store { initial }))
        .actors((0..setup.allocators).map(|_| {
            HashedActor(SegActor::Allocator {
                setup: Box::new(setup.clone()),
            })
        }))
        .lossy_network(if setup.lossy {
            LossyNetwork::Yes
        } else {
            LossyNetwork::No
        })
        .max_crashes(setup.crashes_max)
        // The store is the database: its durability is not what this model checks.
        .within_boundary(|setup, state| {
            let SegState::Store(store) = &**state.actor_states[STORE] else {
                unreachable!("actor 0 is the store")
            };
            !state.crashed[STORE]
                && store.grants <= setup.grants_max
                && store.clock_jumps <= setup.store_clock_jumps_max
        });
    Ok(NetModel::new(with_properties(actors), setup.duplicates_max))
}

type SegModel = ActorModel<HashedActor<SegActor>, SegmentSetup>;

/// The model's properties: the `ids.*` promises, the machines' own invariants, and the
/// `sometimes` edges a run must reach.
fn with_properties(actors: SegModel) -> SegModel {
    actors
        .property(Expectation::Always, "ids.unique", |_, state| {
            ids_unique(&ghosts(state).collect::<Vec<_>>())
        })
        .property(Expectation::Always, "ids.monotonic", |_, state| {
            ghosts(state).all(ids_monotonic)
        })
        // A flaw may break the store's promises on purpose (the blind write overlaps ranges):
        // those runs are judged by the generic `ids.*` properties, which must see them.
        .property(Expectation::Always, STORE_INVARIANTS, |model, state| {
            let SegState::Store(store) = &**state.actor_states[STORE] else {
                unreachable!("actor 0 is the store")
            };
            model.cfg.flaw.is_some() || store.store.check_invariants().is_ok()
        })
        .property(Expectation::Always, ALLOCATOR_INVARIANTS, |_, state| {
            allocators(state).all(|a| a.check_invariants().is_ok())
        })
        .property(Expectation::Sometimes, "buffer switch", |_, state| {
            allocators(state).any(|a| a.stats().buffer_switches > 0)
        })
        .property(
            Expectation::Sometimes,
            "cas conflict retried",
            |_, state| allocators(state).any(|a| a.stats().conflicts > 0 && a.stats().reloads > 0),
        )
        .property(
            Expectation::Sometimes,
            "reclaimed tail regranted",
            |_, state| allocators(state).any(|a| a.stats().pool_grants > 0),
        )
        .property(Expectation::Sometimes, "lease lost", |_, state| {
            allocators(state).any(|a| a.stats().leases_lost > 0)
        })
        .property(
            Expectation::Sometimes,
            "issued after restart",
            |_, state| ghosts(state).any(|g| g.issued.iter().any(|(inc, _)| *inc > 0)),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelOptions, PropertyVerdict, runner};

    fn run(setup: &SegmentSetup, depth: Option<usize>) -> crate::ModelReport {
        let opts = ModelOptions {
            threads: 1,
            depth,
            flaw: None,
            progress: false,
        };
        runner::run(model(setup).unwrap(), NAME, &opts).unwrap()
    }

    /// One allocator, no time, no crash: small enough to exhaust.
    fn solo() -> SegmentSetup {
        SegmentSetup {
            allocators: 1,
            horizon_ms: 0,
            crashes_max: 0,
            duplicates_max: 0,
            first_claim_pct: None,
            ..SegmentSetup::default()
        }
    }

    #[test]
    fn one_allocator_exhausted_holds_switches_buffers_and_loses_leases() {
        let report = run(&solo(), None);
        assert!(report.exhaustive);
        for name in ["ids.unique", "ids.monotonic"] {
            assert_eq!(
                report.property(name).unwrap().verdict,
                PropertyVerdict::Holds,
                "{name}"
            );
        }
        for name in ["buffer switch", "reclaimed tail regranted", "lease lost"] {
            assert_eq!(
                report.property(name).unwrap().verdict,
                PropertyVerdict::Found,
                "{name}"
            );
        }
        assert_eq!(report.unique_states, PINNED_SOLO, "regression guard");
    }

    #[test]
    fn two_allocators_with_crashes_hold_reclaim_and_restart() {
        let report = run(&SegmentSetup::default(), Some(12));
        for name in ["ids.unique", "ids.monotonic"] {
            assert_eq!(
                report.property(name).unwrap().verdict,
                PropertyVerdict::Holds,
                "{name}"
            );
        }
        // A buffer switch needs depth 14 (the catalog run finds it; the gate pins it).
        for name in [
            "cas conflict retried",
            "reclaimed tail regranted",
            "issued after restart",
            "lease lost",
        ] {
            assert_eq!(
                report.property(name).unwrap().verdict,
                PropertyVerdict::Found,
                "{name}"
            );
        }
        assert_eq!(report.unique_states, PINNED_PAIR, "regression guard");
    }

    /// The blind-write flaw gives one range out twice; a later reclaim can then collide with a
    /// pooled range, which the store refuses. The check must go on and report the duplicate as
    /// a violation with its counterexample (it once panicked on the refusal instead).
    #[test]
    fn blind_write_flaw_is_a_violation_with_a_counterexample_not_a_panic() {
        let opts = ModelOptions {
            threads: 1,
            depth: None,
            flaw: Some("segment_no_version_check".to_owned()),
            progress: false,
        };
        let report = crate::check(NAME, opts).unwrap();
        let unique = report.property("ids.unique").unwrap();
        assert_eq!(unique.verdict, PropertyVerdict::Violated);
        assert!(!unique.counterexample.as_ref().unwrap().is_empty());
    }

    const PINNED_SOLO: u64 = 2676;
    const PINNED_PAIR: u64 = 138_650;

    #[test]
    fn checkers_fire_on_bad_records() {
        let a = Ghost {
            incarnation: 1,
            issued: vec![(0, 1), (0, 2), (1, 5)],
        };
        let b = Ghost {
            incarnation: 0,
            issued: vec![(0, 3), (0, 5)],
        };
        assert!(!ids_unique(&[&a, &b]), "5 issued twice");
        assert!(ids_unique(&[&a]));
        let back = Ghost {
            incarnation: 0,
            issued: vec![(0, 3), (0, 2)],
        };
        assert!(!ids_monotonic(&back));
        let restart = Ghost {
            incarnation: 1,
            issued: vec![(0, 3), (1, 2)],
        };
        assert!(ids_monotonic(&restart), "a new incarnation may start lower");
    }
}
