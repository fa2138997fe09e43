//! Holding a Snowflake worker lease, sans-IO: acquire a worker id from the store, build the
//! [`SnowflakeWorker`] above the reservation the lease carries, persist every time reservation
//! the worker asks for (which also renews the lease), renew the lease while nothing else does,
//! and stop the worker for good when the store says the lease is gone (then acquire anew).
//!
//! The one implementation of the worker-lease reply handling: the simulator's ID node, the
//! real server and the model all drive it. Driver loop:
//!
//! 1. drain [`WorkerLeaseHolder::poll_request`] and perform each store call;
//! 2. feed each answer to [`WorkerLeaseHolder::handle_reply`] (late, duplicate and foreign
//!    answers are ignored) and act on the [`HolderEvent`] (count it, reset what depended on the
//!    lease);
//! 3. wake at [`WorkerLeaseHolder::poll_timeout`] and call [`WorkerLeaseHolder::handle_timeout`]
//!    (a call with no answer in time counts as failed: the worker keeps waiting for its
//!    reservation and the call is made again).
//!
//! At most one call is in flight: a reservation persisted out of order could lower what a
//! restart trusts. The worker issues only below what the store acknowledged
//! ([`SnowflakeWorker::handle_reserved`]).

use serde::{Deserialize, Serialize};

use crate::edge::{Edges, Observed};

use super::{LayoutError, SnowflakeWorker, WorkerConfig, machine_id_from_ip};
use crate::clock::Now;
use crate::id_store::{InstanceId, StoreCall, StoreError, StoreReply, WorkerRequest};

/// How a holder leases and renews.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HolderConfig {
    /// The store's lease namespace.
    pub namespace: String,
    /// This process.
    pub instance: InstanceId,
    /// The worker to build on the leased id.
    pub worker: WorkerConfig,
    /// Lease length (ms).
    pub lease_ms: u64,
    /// The lease is renewed when this long (monotonic ms) passed since the last acknowledged
    /// call, even if no reservation is due. `u64::MAX`: only reservations renew.
    pub renew_interval_ms: u64,
    /// A call with no answer for this long (monotonic ms) counts as failed. `u64::MAX`: never.
    pub request_timeout_ms: u64,
    /// Request ids are `request_id_base + n` (`n` from 1), so that a driver sharing one store
    /// channel with other state machines can tell the answers apart.
    pub request_id_base: u64,
    /// FLAW `machine_id_hash_ip` ([`crate::flaw::Flaw::MachineIdHashIp`]): no lease; the worker
    /// id is `hash(ip) % 1000` and reservations are acknowledged without being persisted.
    /// `None` on the correct path.
    pub unleased_ip: Option<[u8; 4]>,
}

impl HolderConfig {
    /// A holder of a lease in `namespace` for `instance`, renewed every third of `lease_ms`,
    /// calls timing out after `request_timeout_ms`.
    #[must_use]
    pub fn new(
        namespace: &str,
        instance: InstanceId,
        worker: WorkerConfig,
        lease_ms: u64,
        request_timeout_ms: u64,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            instance,
            worker,
            lease_ms,
            renew_interval_ms: lease_ms / 3,
            request_timeout_ms,
            request_id_base: 0,
            unleased_ip: None,
        }
    }
}

/// What an answer (or a timeout) did.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum HolderEvent {
    /// Not an answer to the call in flight: nothing changed.
    Ignored,
    /// A worker id was leased and the worker built.
    Acquired {
        /// The leased id.
        worker_id: u32,
    },
    /// A worker lease could not be used: the layout rejects it (a configuration error).
    Unusable(LayoutError),
    /// A reservation was persisted (the lease renewed).
    Renewed,
    /// The store says the lease is gone: the worker stopped for good; a new lease is asked
    /// for next.
    LeaseLost,
    /// The call failed (a store error, or no answer in time); it is made again.
    Failed,
}

/// The lease holder. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerLeaseHolder {
    /// Shared, not copied: a model checker clones the holder with every state it explores.
    cfg: std::sync::Arc<HolderConfig>,
    worker: Option<SnowflakeWorker>,
    /// The call in flight: its id and when it was sent (monotonic ms).
    in_flight: Option<(u64, u64)>,
    /// Calls made so far.
    requests: u64,
    /// When the store last acknowledged a call (monotonic ms).
    renewed_mono_ms: u64,
    /// The lease's expiry as the store last reported it (store clock, ms).
    lease_expiry_ms: u64,
    /// Arrivals at its edge states, and its dropped workers', since its driver last took them
    /// (a ghost: not its state).
    #[serde(skip)]
    edges: Edges,
}

impl Observed for WorkerLeaseHolder {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
        if let Some(worker) = self.worker.as_mut() {
            worker.take_edges(into);
        }
    }
}

impl WorkerLeaseHolder {
    /// A holder with no lease yet.
    #[must_use]
    pub fn new(cfg: HolderConfig) -> Self {
        Self {
            cfg: std::sync::Arc::new(cfg),
            worker: None,
            in_flight: None,
            requests: 0,
            renewed_mono_ms: 0,
            lease_expiry_ms: 0,
            edges: Edges::default(),
        }
    }

    /// The worker, once leased (and until the lease is lost).
    #[must_use]
    pub fn worker(&self) -> Option<&SnowflakeWorker> {
        self.worker.as_ref()
    }

    /// The worker, to issue IDs.
    pub fn worker_mut(&mut self) -> Option<&mut SnowflakeWorker> {
        self.worker.as_mut()
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &HolderConfig {
        &self.cfg
    }

    /// The lease's expiry as the store last reported it (store clock, ms; 0 before any).
    #[must_use]
    pub const fn lease_expiry_ms(&self) -> u64 {
        self.lease_expiry_ms
    }

    /// Whether [`Self::poll_request`] would make a call at `now` (cheap: no state changes).
    #[must_use]
    pub fn wants_call(&self, now: Now) -> bool {
        if self.in_flight.is_some() || self.cfg.unleased_ip.is_some() {
            return false;
        }
        self.worker.as_ref().is_none_or(|w| {
            w.sequencer().wants_reservation()
                || now.mono_ms.saturating_sub(self.renewed_mono_ms) >= self.cfg.renew_interval_ms
        })
    }

    /// Checks the holder's invariants: call ids stay below the next one it would use, and the
    /// worker's ([`SnowflakeWorker::check_invariants`]).
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if let Some((id, _)) = self.in_flight {
            let last = self.cfg.request_id_base.wrapping_add(self.requests);
            if id != last {
                return Err(format!(
                    "call {id} in flight, but the last call made was {last}"
                ));
            }
        }
        self.worker
            .as_ref()
            .map_or(Ok(()), SnowflakeWorker::check_invariants)
    }

    /// Whether a call is in flight.
    #[must_use]
    pub const fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The next store call to perform, if one is due: acquire a lease when there is no worker,
    /// persist a reservation the worker asks for, or renew the lease when `renew_interval_ms`
    /// passed. `(request id, call)`.
    pub fn poll_request(&mut self, now: Now) -> Option<(u64, StoreCall)> {
        let out = self.poll_request_step(now);
        crate::check::debug_holds("worker-lease holder", || self.check_invariants());
        out
    }

    fn poll_request_step(&mut self, now: Now) -> Option<(u64, StoreCall)> {
        if self.in_flight.is_some() {
            return None;
        }
        if let Some(ip) = self.cfg.unleased_ip {
            self.run_unleased(ip, now);
            return None;
        }
        let call = match self.worker.as_mut() {
            None => StoreCall::AcquireWorker(WorkerRequest {
                namespace: self.cfg.namespace.clone(),
                worker_count: self.cfg.worker.layout.worker_count(),
                instance: self.cfg.instance,
                lease_ms: self.cfg.lease_ms,
                now_ms: now.wall_ms,
            }),
            Some(worker) => {
                let reservation = worker.poll_reservation();
                let idle_ms = now.mono_ms.saturating_sub(self.renewed_mono_ms);
                if reservation.is_none() && idle_ms < self.cfg.renew_interval_ms {
                    return None;
                }
                StoreCall::RenewWorker {
                    namespace: self.cfg.namespace.clone(),
                    worker_id: worker.worker_id(),
                    instance: self.cfg.instance,
                    reserve_ts: reservation.unwrap_or(worker.sequencer().reserved_ts()),
                    lease_ms: self.cfg.lease_ms,
                    now_ms: now.wall_ms,
                }
            }
        };
        self.requests += 1;
        let id = self.cfg.request_id_base.wrapping_add(self.requests);
        self.in_flight = Some((id, now.mono_ms));
        Some((id, call))
    }

    /// The answer to call `id`.
    pub fn handle_reply(&mut self, id: u64, reply: StoreReply, now: Now) -> HolderEvent {
        let out = self.handle_reply_step(id, reply, now);
        crate::check::debug_holds("worker-lease holder", || self.check_invariants());
        out
    }

    fn handle_reply_step(&mut self, id: u64, reply: StoreReply, now: Now) -> HolderEvent {
        if self.in_flight.is_none_or(|(awaited, _)| awaited != id) {
            return HolderEvent::Ignored;
        }
        self.in_flight = None;
        let StoreReply::Worker(result) = reply else {
            return self.failed();
        };
        match (self.worker.as_mut(), result) {
            (None, Ok(lease)) => {
                self.edges
                    .reach_if(lease.reserved_ts > 0, &super::edges::WORKER_REACQUIRED);
                match SnowflakeWorker::new(
                    self.cfg.worker,
                    lease.worker_id,
                    lease.reserved_ts,
                    now.wall_ms,
                ) {
                    Ok(worker) => {
                        self.worker = Some(worker);
                        self.renewed_mono_ms = now.mono_ms;
                        self.lease_expiry_ms = lease.lease_expiry_ms;
                        HolderEvent::Acquired {
                            worker_id: lease.worker_id,
                        }
                    }
                    Err(err) => HolderEvent::Unusable(err),
                }
            }
            (Some(worker), Ok(lease)) => {
                worker.handle_reserved(lease.reserved_ts);
                self.renewed_mono_ms = now.mono_ms;
                self.lease_expiry_ms = lease.lease_expiry_ms;
                HolderEvent::Renewed
            }
            (Some(worker), Err(StoreError::WorkerLeaseLost { .. })) => {
                self.edges.reach(&super::edges::WORKER_LEASE_LOST);
                worker.handle_lease_lost();
                worker.take_edges(&mut self.edges);
                self.worker = None;
                HolderEvent::LeaseLost
            }
            (_, Err(_)) => self.failed(),
        }
    }

    /// The deadline of the call in flight, or of the next renewal (monotonic ms).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        match self.in_flight {
            Some((_, sent_ms)) => Some(sent_ms.saturating_add(self.cfg.request_timeout_ms)),
            None if self.worker.is_some() => Some(
                self.renewed_mono_ms
                    .saturating_add(self.cfg.renew_interval_ms),
            ),
            None => None,
        }
    }

    /// Time passed: a call with no answer in time counts as failed.
    pub fn handle_timeout(&mut self, now: Now) -> HolderEvent {
        let out = self.handle_timeout_step(now);
        crate::check::debug_holds("worker-lease holder", || self.check_invariants());
        out
    }

    fn handle_timeout_step(&mut self, now: Now) -> HolderEvent {
        match self.in_flight {
            Some((_, sent_ms))
                if now.mono_ms.saturating_sub(sent_ms) >= self.cfg.request_timeout_ms =>
            {
                self.in_flight = None;
                self.failed()
            }
            _ => HolderEvent::Ignored,
        }
    }

    fn failed(&mut self) -> HolderEvent {
        if let Some(worker) = self.worker.as_mut() {
            worker.handle_reservation_failed();
        }
        HolderEvent::Failed
    }

    /// The flawed path: a worker id from the address, reservations never persisted.
    fn run_unleased(&mut self, ip: [u8; 4], now: Now) {
        match self.worker.as_mut() {
            None => {
                self.worker =
                    SnowflakeWorker::new(self.cfg.worker, machine_id_from_ip(ip), 0, now.wall_ms)
                        .ok();
            }
            Some(worker) => {
                if let Some(ts) = worker.poll_reservation() {
                    worker.handle_reserved(ts);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id_store::{IdStore, MemoryIdStore};

    const WALL_MS: u64 = 1_700_000_000_000;

    fn holder(instance: u64) -> WorkerLeaseHolder {
        WorkerLeaseHolder::new(HolderConfig::new(
            "snowflake",
            InstanceId(instance),
            WorkerConfig::default(),
            3_000,
            500,
        ))
    }

    fn now(mono_ms: u64) -> Now {
        Now {
            wall_ms: WALL_MS + mono_ms,
            mono_ms,
        }
    }

    /// Performs every due call on `store` at `t`; returns the events.
    fn pump(h: &mut WorkerLeaseHolder, store: &mut MemoryIdStore, t: Now) -> Vec<HolderEvent> {
        let mut events = Vec::new();
        while let Some((id, mut call)) = h.poll_request(t) {
            call.set_store_now(t.wall_ms);
            events.push(h.handle_reply(id, call.execute(store), t));
        }
        events
    }

    /// Whether `machine` reached `edge` since its counts were last taken (and takes them).
    fn reached(machine: &mut impl Observed, edge: &crate::edge::Edge) -> bool {
        machine.edges().contains_key(edge.name)
    }

    #[test]
    fn edge_worker_reacquired() {
        let mut store = MemoryIdStore::new();
        let mut first = holder(1);
        let _ = first.edges();
        let _ = pump(&mut first, &mut store, now(0));
        assert!(
            !reached(&mut first, &crate::snowflake::edges::WORKER_REACQUIRED),
            "a never-used worker id"
        );
        let worker_id = first.worker().unwrap().worker_id();
        let _ = first.worker_mut().unwrap().next_id(WALL_MS);
        let _ = pump(&mut first, &mut store, now(1));
        store
            .release_worker("snowflake", worker_id, InstanceId(1))
            .unwrap();
        let mut second = holder(2);
        let events = pump(&mut second, &mut store, now(2));
        assert_eq!(events, [HolderEvent::Acquired { worker_id }]);
        assert!(reached(
            &mut second,
            &crate::snowflake::edges::WORKER_REACQUIRED
        ));
    }

    #[test]
    fn edge_worker_lease_lost() {
        let mut store = MemoryIdStore::new();
        let mut h = holder(1);
        let _ = pump(&mut h, &mut store, now(0));
        let worker_id = h.worker().unwrap().worker_id();
        // The lease expires unrenewed (a pause) and another instance takes the id.
        let mut other = holder(2);
        let _ = pump(&mut other, &mut store, now(3_000));
        assert_eq!(other.worker().unwrap().worker_id(), worker_id);
        let _ = h.edges();
        let events = pump(&mut h, &mut store, now(3_001));
        assert!(events.contains(&HolderEvent::LeaseLost), "{events:?}");
        assert!(reached(&mut h, &crate::snowflake::edges::WORKER_LEASE_LOST));
        assert_ne!(
            h.worker().map(SnowflakeWorker::worker_id),
            Some(worker_id),
            "the stopped worker is gone; a new lease has another id"
        );
    }

    #[test]
    fn acquires_then_persists_reservations_before_issuing_above_them() {
        let mut store = MemoryIdStore::new();
        let mut h = holder(1);
        assert!(h.worker().is_none());
        let events = pump(&mut h, &mut store, now(0));
        assert!(
            matches!(events[..], [HolderEvent::Acquired { .. }, ..]),
            "{events:?}"
        );
        let worker = h.worker_mut().unwrap();
        assert!(worker.next_id(WALL_MS).is_ok());
        // The first ID asks for a reservation; persisting it renews the lease.
        let events = pump(&mut h, &mut store, now(1));
        assert!(events.contains(&HolderEvent::Renewed), "{events:?}");
        // The next holder of that worker id starts above the persisted reservation.
        let worker_id = h.worker().unwrap().worker_id();
        store
            .release_worker("snowflake", worker_id, InstanceId(1))
            .unwrap();
        let lease = store
            .acquire_worker(&WorkerRequest {
                namespace: "snowflake".into(),
                worker_count: WorkerConfig::default().layout.worker_count(),
                instance: InstanceId(2),
                lease_ms: 3_000,
                now_ms: WALL_MS + 2,
            })
            .unwrap();
        assert_eq!(lease.worker_id, worker_id);
        assert!(lease.reserved_ts > 0, "the reservation reached the store");
    }

    #[test]
    fn renews_when_idle_and_ignores_late_or_foreign_answers() {
        let mut store = MemoryIdStore::new();
        let mut h = holder(1);
        let _ = pump(&mut h, &mut store, now(0));
        assert_eq!(h.poll_request(now(10)), None, "nothing due yet");
        assert_eq!(
            h.poll_timeout(),
            Some(1_000),
            "renewal after a third of the lease"
        );
        let (id, call) = h.poll_request(now(1_000)).expect("renewal due");
        assert!(matches!(call, StoreCall::RenewWorker { .. }));
        assert_eq!(
            h.poll_request(now(1_000)),
            None,
            "one call in flight at a time"
        );
        let reply = call.execute(&mut store);
        assert_eq!(
            h.handle_reply(id + 1, reply.clone(), now(1_001)),
            HolderEvent::Ignored
        );
        assert_eq!(
            h.handle_reply(id, reply.clone(), now(1_001)),
            HolderEvent::Renewed
        );
        assert_eq!(
            h.handle_reply(id, reply, now(1_002)),
            HolderEvent::Ignored,
            "duplicate"
        );
    }

    #[test]
    fn a_silent_store_fails_the_call_and_a_lost_lease_stops_the_worker_then_reacquires() {
        let mut store = MemoryIdStore::new();
        let mut h = holder(1);
        let _ = pump(&mut h, &mut store, now(0));
        let _ = h.worker_mut().unwrap().next_id(WALL_MS);
        let (id, _) = h.poll_request(now(1)).expect("a reservation");
        assert_eq!(h.handle_timeout(now(400)), HolderEvent::Ignored, "not yet");
        assert_eq!(h.handle_timeout(now(501)), HolderEvent::Failed);
        assert!(!h.in_flight());
        // Another instance takes the worker id once the lease expired; ours is then lost.
        let _ = store.release_worker("snowflake", h.worker().unwrap().worker_id(), InstanceId(1));
        let mut other = holder(2);
        let _ = pump(&mut other, &mut store, now(2));
        // The renewal is due a third of the lease after the last acknowledged call.
        assert_eq!(h.poll_request(now(3)), None);
        let (id2, call) = h.poll_request(now(1_000)).expect("the renewal");
        assert_ne!(id, id2);
        let event = h.handle_reply(id2, call.execute(&mut store), now(1_000));
        assert_eq!(event, HolderEvent::LeaseLost);
        assert!(
            h.worker().is_none(),
            "a lost lease stops the worker for good"
        );
        let (_, call) = h
            .poll_request(now(1_001))
            .expect("a new lease is asked for");
        assert!(matches!(call, StoreCall::AcquireWorker(_)));
    }

    #[test]
    fn the_holder_invariants_fire_on_a_call_it_never_made() {
        let mut store = MemoryIdStore::new();
        let mut h = holder(1);
        let _ = pump(&mut h, &mut store, now(0));
        h.check_invariants().unwrap();
        let _ = h.worker_mut().unwrap().next_id(WALL_MS);
        let (id, _) = h.poll_request(now(1)).unwrap();
        h.check_invariants().unwrap();
        h.in_flight = Some((id + 1, 1));
        assert!(h.check_invariants().unwrap_err().contains("in flight"));
    }

    #[test]
    fn the_unleased_flaw_never_calls_the_store() {
        let mut cfg = HolderConfig::new(
            "snowflake",
            InstanceId(1),
            WorkerConfig::default(),
            3_000,
            500,
        );
        cfg.unleased_ip = Some([10, 0, 0, 7]);
        let mut h = WorkerLeaseHolder::new(cfg);
        assert_eq!(h.poll_request(now(0)), None);
        assert_eq!(
            h.worker().unwrap().worker_id(),
            machine_id_from_ip([10, 0, 0, 7])
        );
        let _ = h.worker_mut().unwrap().next_id(WALL_MS);
        assert_eq!(
            h.poll_request(now(1)),
            None,
            "reservations acknowledged locally"
        );
    }
}
