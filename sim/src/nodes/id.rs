//! An ID-service node: a [`SegmentAllocator`] for tag `order` and a [`SnowflakeWorker`] on a
//! leased worker id, both talking to the database node. Requests the state machines cannot
//! answer yet (`Pending`, `WaitUntil`, `WaitReservation`) are parked and retried; the client's
//! timeout bounds how long.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use madsim::rand::Rng;
use madsim::task::spawn;
use sut::boundary::Bounded;
use sut::clock::Now;
use sut::edge::{Edges, Observed};
use sut::flaw::Flaw;
use sut::id_store::InstanceId;
use sut::segment::{AllocatorConfig, AllocatorStats, SegmentAllocator, StepPolicy, Take};
use sut::snowflake::holder::{HolderConfig, HolderEvent};
use sut::snowflake::leased::{IdAnswer, LeasedIds, RequestWaits, WhyUnavailable};
use sut::snowflake::semantic::SemanticConfig;
use sut::snowflake::{RollbackPolicy, WorkerConfig};

use crate::clock::sleep_ms;
use crate::history::{Answer, EventKind, IdSpace, Op, Outcome};
use crate::net::{Ctx, Inbox, Msg};

/// The tag every ID node serves.
pub const TAG: &str = "order";
const WORKER_NAMESPACE: &str = "snowflake";
const WORKER_LEASE_MS: u64 = 3_000;
/// A worker-lease call with no answer after this long counts as failed (ms).
const WORKER_REQUEST_TIMEOUT_MS: u64 = 501;
const PARKED_MAX: usize = 2_000;

#[derive(Debug)]
struct Parked {
    client: Arc<str>,
    op_id: u64,
    since_ms: u64,
}

#[derive(Debug)]
struct State {
    instance: InstanceId,
    alloc: SegmentAllocator,
    /// The Snowflake worker's lease (and, under the `machine_id_hash_ip` flaw, no lease) and
    /// the semantic generator on it (`sut`'s binding, as the server's; what each request is
    /// answered is decided there).
    ids: LeasedIds,
    parked_segment: VecDeque<Parked>,
    parked_snowflake: VecDeque<Parked>,
    parked_semantic: VecDeque<Parked>,
    /// The business prefix of the semantic IDs served.
    semantic_prefix: String,
    timeout_ms: u64,
    reported: AllocatorStats,
}

impl Observed for State {
    fn take_edges(&mut self, into: &mut Edges) {
        self.alloc.take_edges(into);
        self.ids.take_edges(into);
    }
}

/// What to send after a state change.
type Outbox = Vec<(Arc<str>, Msg)>;

impl State {
    fn generator(&self) -> String {
        format!("alloc-{}", self.instance.0)
    }

    /// Adds what the allocator did since the last report to the run's counters (the ID-gap
    /// bound and the fault-coverage table read them).
    fn report_stats(&mut self, ctx: &Ctx) {
        let now = self.alloc.stats();
        let was = std::mem::replace(&mut self.reported, now);
        ctx.world.with(|w| {
            w.count(
                "segment.fetch_failures",
                now.fetch_failures - was.fetch_failures,
            );
            w.count(
                "segment.leases_expired",
                now.leases_expired - was.leases_expired,
            );
            w.count("segment.leases_lost", now.leases_lost - was.leases_lost);
            w.count("segment.cas_conflicts", now.conflicts - was.conflicts);
            w.count("segment.pool_grants", now.pool_grants - was.pool_grants);
            w.count("segment.reloads", now.reloads - was.reloads);
            w.count(
                "segment.ids_abandoned",
                now.ids_abandoned - was.ids_abandoned,
            );
        });
    }

    fn pump_allocator(&mut self, out: &mut Outbox) {
        while let Some(req) = self.alloc.poll_request() {
            out.push((
                "db".into(),
                Msg::Store {
                    req: req.id,
                    call: req.call,
                },
            ));
        }
    }

    /// The state machines' own invariants, after every tick when self-checks are on
    /// ([`super::self_checks`]).
    fn check_own_invariants(&self, self_checks: bool) {
        if self_checks {
            let checks = [
                ("segment allocator", self.alloc.check_invariants()),
                ("leased IDs", self.ids.check_invariants()),
            ];
            for (name, check) in checks {
                if let Err(violation) = check {
                    panic!("{name} of {}: {violation}", self.generator());
                }
            }
        }
    }

    /// Performs what the worker-lease holder asks for: its calls go to the database node.
    fn worker_upkeep(&mut self, ctx: &Ctx, now: Now, out: &mut Outbox) {
        if self
            .ids
            .poll_timeout()
            .is_some_and(|due| due <= now.mono_ms)
        {
            let event = self.ids.handle_timeout(now);
            on_holder_event(ctx, &event);
        }
        if let Some((req, call)) = self.ids.poll_request(now) {
            out.push(("db".into(), Msg::Store { req, call }));
        }
    }

    fn serve_segment(
        &mut self,
        ctx: &Ctx,
        (client, op_id, since_ms): (Arc<str>, u64, u64),
        now: Now,
        out: &mut Outbox,
    ) -> Option<Parked> {
        let take = self.alloc.next_id(now);
        self.pump_allocator(out);
        let outcome = match take {
            Take::Block(block) => {
                let generator = self.generator();
                ctx.record(|_| EventKind::Issued {
                    space: IdSpace::Segment,
                    generator,
                    id: block.start,
                });
                Outcome::Ok(Answer::Id(block.start))
            }
            Take::Degraded(id) => {
                let generator = self.generator();
                ctx.record(|_| EventKind::Issued {
                    space: IdSpace::Degraded,
                    generator,
                    id,
                });
                Outcome::Ok(Answer::Id(id))
            }
            Take::Pending => {
                return Some(Parked {
                    client,
                    op_id,
                    since_ms,
                });
            }
            Take::Unavailable(why) => Outcome::Fail(why.to_string()),
        };
        out.push((client, Msg::Response { op_id, outcome }));
        None
    }

    fn serve_snowflake(
        &mut self,
        ctx: &Ctx,
        (client, op_id, since_ms): (Arc<str>, u64, u64),
        now: Now,
        out: &mut Outbox,
    ) -> Option<Parked> {
        let now = self.landed(ctx).unwrap_or(now);
        let instance = self.instance.0;
        let stats = |ids: &LeasedIds| ids.holder().worker().map(|w| w.sequencer().stats());
        let before = stats(&self.ids);
        let answer = self
            .ids
            .next_snowflake(now, now.mono_ms.saturating_sub(since_ms));
        if let (Some(before), Some(after)) = (before, stats(&self.ids)) {
            ctx.world.count(
                "clock.rollback_waits",
                after.rollback_waits - before.rollback_waits,
            );
            ctx.world.count(
                "clock.rollback_refusals",
                after.rollback_refusals - before.rollback_refusals,
            );
            ctx.world.count(
                "clock.logical_issues",
                after.logical_issues - before.logical_issues,
            );
        }
        let outcome = match answer {
            IdAnswer::Id(id) => {
                let worker_id = self.ids.holder().worker().map_or(0, |w| w.worker_id());
                ctx.record(|_| EventKind::Issued {
                    space: IdSpace::Snowflake,
                    generator: format!("worker-{worker_id}@{instance}"),
                    id,
                });
                Outcome::Ok(Answer::Id(id))
            }
            IdAnswer::WaitUntil { .. } | IdAnswer::Drive => {
                return Some(Parked {
                    client,
                    op_id,
                    since_ms,
                });
            }
            IdAnswer::Unavailable { why, .. } => {
                let fresh = stats(&self.ids).is_some_and(|s| s.issued == 0);
                if fresh && why.clock_behind_ms().is_some() {
                    // A fresh incarnation whose clock is behind the persisted reservation.
                    ctx.world.count("clock.restart_behind_reservation", 1);
                }
                Outcome::Fail(why.to_string())
            }
        };
        out.push((client, Msg::Response { op_id, outcome }));
        None
    }

    /// BUGGIFY `clock_at_boundary`: a clock bump armed for this node lands at one of its
    /// generators' decision boundaries now, before they decide; the clock's new reading.
    fn landed(&self, ctx: &Ctx) -> Option<Now> {
        let armed = ctx
            .world
            .with(|w| w.landing.as_ref().is_some_and(|l| l.node == ctx.name));
        if !armed {
            return None;
        }
        let mut boundaries = Vec::new();
        self.ids.boundaries(&mut boundaries);
        crate::nemesis::land_clock(&ctx.world, &ctx.name, &boundaries).then(|| ctx.now())
    }

    /// Retries parked requests (in order; stops at the first that still waits).
    fn retry_parked(&mut self, ctx: &Ctx, now: Now, out: &mut Outbox) {
        for kind in [Kind::Segment, Kind::Snowflake, Kind::Semantic] {
            for _ in 0..PARKED_MAX {
                let Some(parked) = self.parked(kind).pop_front() else {
                    break;
                };
                if now.mono_ms.saturating_sub(parked.since_ms) > self.timeout_ms {
                    continue; // the client has given up
                }
                let asked = (parked.client, parked.op_id, parked.since_ms);
                if let Some(again) = self.serve(kind, ctx, asked, now, out) {
                    self.parked(kind).push_front(again);
                    break;
                }
            }
        }
    }

    fn parked(&mut self, kind: Kind) -> &mut VecDeque<Parked> {
        match kind {
            Kind::Segment => &mut self.parked_segment,
            Kind::Snowflake => &mut self.parked_snowflake,
            Kind::Semantic => &mut self.parked_semantic,
        }
    }

    /// Serves (or parks again) the request of `(client, op_id)` that arrived at `since_ms`.
    fn serve(
        &mut self,
        kind: Kind,
        ctx: &Ctx,
        (client, op_id, since_ms): (Arc<str>, u64, u64),
        now: Now,
        out: &mut Outbox,
    ) -> Option<Parked> {
        let asked = (client, op_id, since_ms);
        match kind {
            Kind::Segment => self.serve_segment(ctx, asked, now, out),
            Kind::Snowflake => self.serve_snowflake(ctx, asked, now, out),
            Kind::Semantic => self.serve_semantic(ctx, asked, now, out),
        }
    }

    fn serve_semantic(
        &mut self,
        ctx: &Ctx,
        (client, op_id, since_ms): (Arc<str>, u64, u64),
        now: Now,
        out: &mut Outbox,
    ) -> Option<Parked> {
        let now = self.landed(ctx).unwrap_or(now);
        let instance = self.instance.0;
        let waited_ms = now.mono_ms.saturating_sub(since_ms);
        let outcome = match self
            .ids
            .next_semantic(&self.semantic_prefix, now, waited_ms)
        {
            IdAnswer::Id(id) => {
                debug_assert!(id.text.len() == sut::snowflake::semantic::ID_LEN);
                ctx.record(|_| EventKind::Issued {
                    space: IdSpace::Semantic,
                    generator: format!("machine-{}@{instance}", id.machine),
                    id: id.number,
                });
                Outcome::Ok(Answer::Id(id.number))
            }
            IdAnswer::WaitUntil { .. } | IdAnswer::Drive => {
                return Some(Parked {
                    client,
                    op_id,
                    since_ms,
                });
            }
            IdAnswer::Unavailable { why, .. } => {
                if let WhyUnavailable::Config(err) = &why {
                    ctx.world.count(&format!("config.error.{err}"), 1);
                }
                Outcome::Fail(why.to_string())
            }
        };
        out.push((client, Msg::Response { op_id, outcome }));
        None
    }
}

/// The holder's events, as counters (a lost lease drops the semantic generators inside `sut`).
fn on_holder_event(ctx: &Ctx, event: &HolderEvent) {
    match event {
        HolderEvent::LeaseLost => ctx.world.count("snowflake.worker_leases_lost", 1),
        HolderEvent::Unusable(err) => ctx.world.count(&format!("config.error.{err}"), 1),
        HolderEvent::Ignored
        | HolderEvent::Acquired { .. }
        | HolderEvent::Renewed
        | HolderEvent::Failed => {}
    }
}

/// Which request queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Segment,
    Snowflake,
    Semantic,
}

fn flush(ctx: &Ctx, out: Outbox) {
    for (to, msg) in out {
        ctx.send(&to, msg);
    }
}

/// The ID settings and flaw of the run, and this incarnation's instance id.
struct Setup {
    ids: crate::scenario::Ids,
    buggify: crate::buggify::Buggify,
    instance: InstanceId,
    flaw: Option<Flaw>,
}

/// The segment allocator's configuration for this node.
fn allocator_config(setup: &Setup) -> AllocatorConfig {
    let ids = &setup.ids;
    setup.buggify.allocator(AllocatorConfig {
        step: StepPolicy::Leaf {
            step_max: ids.step_max,
        },
        lease_ms: ids.lease_ms,
        drift_ms_max: ids.drift_ms_max,
        renew_interval_ms: ids.lease_ms / 4,
        request_timeout_ms: crate::buggify::STORE_TIMEOUT_MS,
        flaw: setup.flaw,
        ..AllocatorConfig::new(TAG, setup.instance)
    })
}

/// The Snowflake worker's configuration (its layout moved for the end-of-life test).
fn worker_config(setup: &Setup) -> WorkerConfig {
    let ids = &setup.ids;
    let mut worker_cfg = WorkerConfig {
        rollback_ms_max: ids.rollback_ms_max,
        rollback: RollbackPolicy::Refuse,
        reserve_ahead_ms: ids.reserve_ahead_ms,
        flaw: setup.flaw,
        ..WorkerConfig::default()
    };
    worker_cfg = setup.buggify.worker(worker_cfg);
    worker_cfg.layout.time_bits = ids.snowflake_time_bits;
    if let Some(left_ms) = ids.snowflake_time_left_ms {
        // The end-of-life test: the time field runs out `left_ms` after simulated time 0.
        let layout = &mut worker_cfg.layout;
        let span_ms = (layout.ts_max() + 1).saturating_mul(layout.unit_ms);
        layout.epoch_ms = (crate::clock::WALL_EPOCH_MS + left_ms).saturating_sub(span_ms);
    }
    worker_cfg
}

/// The worker-lease holder's configuration; under the `machine_id_hash_ip` flaw it draws this
/// incarnation's address from the RNG.
fn holder_config(setup: &Setup, worker_cfg: WorkerConfig) -> HolderConfig {
    let instance = setup.instance;
    // FLAW `machine_id_hash_ip`: this incarnation's address, as a container would get one.
    let host_ip = (setup.flaw == Some(Flaw::MachineIdHashIp)).then(|| {
        let mut rng = madsim::rand::thread_rng();
        [10, 0, rng.gen_range(0..=255u8), rng.gen_range(1..=254u8)]
    });
    let mut holder = HolderConfig::new(
        WORKER_NAMESPACE,
        instance,
        worker_cfg,
        WORKER_LEASE_MS,
        WORKER_REQUEST_TIMEOUT_MS,
    );
    holder.request_id_base = (instance.0 << 32) | (1 << 31);
    holder.unleased_ip = host_ip;
    holder
}

/// A fresh incarnation's state.
fn new_state(ctx: &Ctx) -> State {
    let (ids, buggify, timeout_ms, instance, flaw) = ctx.world.with(|w| {
        (
            w.spec.scenario.ids.clone(),
            w.spec.buggify.clone(),
            w.spec.scenario.workload.timeout_ms,
            InstanceId(w.next_instance()),
            w.spec.scenario.run.flaw,
        )
    });
    let setup = Setup {
        ids,
        buggify,
        instance,
        flaw,
    };
    let now = ctx.now();
    let alloc = SegmentAllocator::new(allocator_config(&setup), now)
        .expect("the scenario validated the ID settings");
    let holder = holder_config(&setup, worker_config(&setup));
    let ids = &setup.ids;
    State {
        instance,
        alloc,
        ids: LeasedIds::new(
            holder,
            SemanticConfig {
                prefix: "OD".into(),
                rollback_ms_max: ids.rollback_ms_max,
                rollback: RollbackPolicy::Refuse,
                reserve_ahead_ms: ids.reserve_ahead_ms.max(2_000),
                per_second: ids.semantic_per_second,
                flaw,
            },
            RequestWaits::DEFAULT,
        ),
        parked_segment: VecDeque::new(),
        parked_snowflake: VecDeque::new(),
        parked_semantic: VecDeque::new(),
        semantic_prefix: "OD".to_owned(),
        timeout_ms,
        reported: AllocatorStats::default(),
    }
}

/// Every 5 ms: the allocator's timeouts, the worker lease, the parked requests, the counters.
async fn tick_forever(ctx: Ctx, state: Arc<Mutex<State>>) {
    let self_checks = super::self_checks(&ctx.world);
    loop {
        sleep_ms(5).await;
        let now = ctx.now();
        let mut out = Vec::new();
        {
            let mut s = state.lock().expect("id state");
            if s.alloc.poll_timeout().is_some_and(|due| due <= now.mono_ms) {
                s.alloc.handle_timeout(now);
            }
            s.pump_allocator(&mut out);
            s.worker_upkeep(&ctx, now, &mut out);
            s.retry_parked(&ctx, now, &mut out);
            s.report_stats(&ctx);
            s.check_own_invariants(self_checks);
            ctx.world.take_edges(&mut *s);
        }
        flush(&ctx, out);
    }
}

impl State {
    /// Handles one incoming message; what to send goes to `out`.
    fn on_message(&mut self, ctx: &Ctx, msg: Msg, from: Arc<str>, now: Now, out: &mut Outbox) {
        match msg {
            Msg::Request {
                op_id,
                op: Op::SegmentId,
            } => {
                if let Some(parked) = self.serve_segment(ctx, (from, op_id, now.mono_ms), now, out)
                    && self.parked_segment.len() < PARKED_MAX
                {
                    self.parked_segment.push_back(parked);
                }
            }
            Msg::Request {
                op_id,
                op: Op::SnowflakeId,
            } => {
                if let Some(parked) =
                    self.serve_snowflake(ctx, (from, op_id, now.mono_ms), now, out)
                    && self.parked_snowflake.len() < PARKED_MAX
                {
                    self.parked_snowflake.push_back(parked);
                }
            }
            Msg::Request {
                op_id,
                op: Op::SemanticId,
            } => {
                if let Some(parked) = self.serve_semantic(ctx, (from, op_id, now.mono_ms), now, out)
                    && self.parked_semantic.len() < PARKED_MAX
                {
                    self.parked_semantic.push_back(parked);
                }
            }
            Msg::StoreReply { req, reply } => {
                if req & (1 << 31) != 0 {
                    let event = self.ids.handle_reply(req, reply, now);
                    on_holder_event(ctx, &event);
                } else {
                    self.alloc.handle_reply(req, reply, now);
                }
                self.pump_allocator(out);
                self.worker_upkeep(ctx, now, out);
                self.retry_parked(ctx, now, out);
            }
            _ => {}
        }
    }
}

/// Runs an ID-service node.
pub async fn run(ctx: Ctx, mut inbox: Inbox) {
    let state = Arc::new(Mutex::new(new_state(&ctx)));
    spawn(tick_forever(ctx.clone(), Arc::clone(&state)));

    while let Some((msg, from)) = inbox.recv().await {
        let now = ctx.now();
        let mut out = Vec::new();
        {
            let mut s = state.lock().expect("id state");
            s.on_message(&ctx, msg, from, now, &mut out);
            ctx.world.take_edges(&mut *s);
        }
        flush(&ctx, out);
    }
}
