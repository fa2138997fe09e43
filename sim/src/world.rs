//! The omniscient side of a run: everything that outlives a node incarnation or that the
//! checkers and the nemesis must see. Nodes reach it only through narrow methods; it never
//! holds protocol state a real node could not have (each node's disk, clock and published
//! store snapshot are its own).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use madsim::task::NodeId;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use sut::clock::Now;
use sut::id_store::{StoreCall, TagSpec};
use sut::lottery::LogEntry;
use sut::lottery::journal::{JournalOp, Journaled};

use crate::buggify::Buggify;
use crate::clock::{NodeClock, SimClock};
use crate::crashpoints::{Label, Labeled};
use crate::disk::Wal;
use crate::history::{Event, EventKind};
use crate::scenario::{FaultKind, Scenario};
use crate::wire::{Transport, Wire};

/// One seed's resolved parameters: the scenario plus what the seed decided (swarm testing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The scenario.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// The fault kinds enabled for this seed, with their weights.
    pub faults: Vec<(FaultKind, u32)>,
    /// This seed's BUGGIFY.
    pub buggify: Buggify,
}

/// A database-node log record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DbRec {
    /// Setup: a tag.
    CreateTag(String, TagSpec),
    /// A mutating store call, with the store's clock stamped in.
    Call(StoreCall),
    /// A reclaim sweep at this lease-clock time.
    Reclaim(u64),
}

/// A token-node log record: the mutating calls, with their inputs, replayed on recovery.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TokenRec {
    /// A revocation.
    Revoke {
        /// The token.
        token: String,
        /// The node's clock then.
        now: Now,
    },
    /// A one-time token issue.
    IssueOnce {
        /// The user.
        user: u64,
        /// The activity.
        activity: String,
        /// The random nonce drawn then.
        nonce: u128,
        /// The node's clock then.
        now: Now,
    },
    /// A purge of expired rows.
    Purge {
        /// The node's clock then.
        now: Now,
    },
    /// A one-time token consume.
    ConsumeOnce {
        /// The token.
        token: u128,
        /// The presenting user.
        user: u64,
        /// The node's clock then.
        now: Now,
    },
}

impl Labeled for DbRec {
    fn label(&self) -> Label {
        match self {
            Self::CreateTag(..) => Label::new("create_tag", "", ""),
            Self::Call(call) => Label::new(call.kind(), "", ""),
            Self::Reclaim(_) => Label::new("reclaim", "", ""),
        }
    }
}

impl Labeled for TokenRec {
    fn label(&self) -> Label {
        Label::new(
            match self {
                Self::Revoke { .. } => "revoke",
                Self::IssueOnce { .. } => "issue_once",
                Self::Purge { .. } => "purge",
                Self::ConsumeOnce { .. } => "consume_once",
            },
            "",
            "",
        )
    }
}

/// A clock bump armed to land at a decision boundary of `node` (`sut::boundary`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    /// The node.
    pub node: String,
    /// Which of the node's boundaries (in order), modulo how many it has then.
    pub pick: u32,
    /// Where the clock lands relative to it: -1, 0 or +1 ms.
    pub offset_ms: i64,
    /// Only a boundary of this name (it waits for the node to have one).
    pub want: Option<&'static str>,
}

/// The simulated disks.
#[derive(Clone, Debug, Default)]
pub struct Disks {
    /// The database node's log.
    pub db: Wal<DbRec>,
    /// The token node's log.
    pub token: Wal<TokenRec>,
    /// The coordinator's log.
    pub coord: Wal<LogEntry>,
    /// Participant nodes' command journals (`sut::lottery::journal`), by node name.
    pub parts: BTreeMap<String, Wal<JournalOp>>,
}

/// A fault as it happened (for reports).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpan {
    /// The node (or `net`).
    pub node: String,
    /// The fault kind.
    pub kind: String,
    /// When it started (simulated ms).
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: Option<u64>,
    /// Details.
    pub detail: String,
}

/// State published by live node incarnations for the final checks.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// Participant stores by node name.
    pub ledgers: BTreeMap<String, Arc<Mutex<Journaled>>>,
}

/// Everything shared.
#[derive(Debug)]
pub struct WorldState {
    /// The run's parameters.
    pub spec: RunSpec,
    /// When the run started, as simulated time since the runtime started.
    start: Duration,
    clock: SimClock,
    /// Per-node clocks (read on every step of every node: a node's context keeps its slot).
    pub clocks: Clocks,
    /// The history.
    pub history: Vec<Event>,
    /// What each fault actually did (hashed: counted on every send; [`WorldState::coverage`]
    /// gives them in order).
    coverage: FxHashMap<String, u64>,
    /// Clogged directed links, with how many faults clog each.
    pub clogged_links: BTreeMap<(String, String), u32>,
    /// Nodes clogged entirely, with how many faults clog each.
    pub clogged_nodes: BTreeMap<String, u32>,
    /// Packet loss in parts per million.
    pub loss_ppm: u32,
    /// A latency spike is on.
    pub latency_spike: bool,
    /// Disks.
    pub disks: Disks,
    /// Published live state.
    pub published: Published,
    /// Node addresses.
    pub addrs: BTreeMap<String, SocketAddr>,
    /// The same, hashed (looked up on every send).
    addr_index: FxHashMap<String, SocketAddr>,
    /// Node names by IP (the reverse of `addrs`; hashed: looked up for every datagram).
    pub names: FxHashMap<std::net::IpAddr, String>,
    /// madsim node ids.
    pub node_ids: BTreeMap<String, NodeId>,
    /// Incarnation counters.
    pub incarnations: BTreeMap<String, u64>,
    /// Paused nodes and since when.
    pub paused: BTreeMap<String, u64>,
    /// Killed nodes.
    pub killed: BTreeSet<String>,
    next_instance: u64,
    next_xid: u64,
    /// Faults as they happened.
    pub faults: Vec<FaultSpan>,
    /// Clock offset samples (node, sim ms, skew ms).
    pub clock_samples: Vec<(String, u64, i64)>,
    /// The workload stops when this is set (end of the safety phase).
    pub workload_stopped: bool,
    /// Set by `nemesis::heal_all` at the start of the liveness phase: from then on a fault
    /// still in progress (a swizzle clogging its next node, a strobe's next flip) does nothing.
    pub healed: bool,
    /// When `healed` was set (simulated ms).
    pub healed_at_ms: Option<u64>,
    /// The madsim node the run's supervisor (and the nemesis) runs on.
    pub supervisor: NodeId,
    /// The tasks the supervisor spawned (the nemesis and its faults' timers), to abort once the
    /// seed's outcome is known (`run::release`).
    pub supervisor_tasks: Vec<madsim::task::AbortHandle>,
    /// Arrivals at each node's durable steps (`buggify::CrashSite`), counted for a placed crash.
    pub durable_steps: BTreeMap<String, u64>,
    /// Crash points ([`crate::crashpoints`]): the probe of this run, when it finds points or
    /// strikes one; `None` in a plain run (nothing counted, nothing held).
    pub probe: Option<crate::crashpoints::Probe>,
    /// A clock bump of an ID node waiting to land at one of its decision boundaries at its next
    /// ID decision (BUGGIFY `clock_at_boundary`).
    pub landing: Option<Landing>,
    /// The seed's arrivals at edge states: every node moves its machines' here after each step
    /// ([`World::take_edges`]).
    pub edges: sut::edge::Edges,
    /// How datagrams travel (`net`).
    pub transport: Transport,
    /// The network as madsim's UDP path sees it, for [`Transport::Wire`].
    pub wire: Wire,
}

thread_local! {
    /// The worlds alive on this thread (a seed runs on one thread, start to end).
    static WORLDS_ALIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many worlds are alive on this thread: 0 between seeds, once a seed has let its memory go
/// (`run::release`).
#[must_use]
pub fn worlds_alive() -> usize {
    WORLDS_ALIVE.with(std::cell::Cell::get)
}

impl Drop for WorldState {
    fn drop(&mut self) {
        WORLDS_ALIVE.with(|n| n.set(n.get() - 1));
    }
}

/// The nodes' clocks by name, each in a slot of its own for as long as the run lasts: a node's
/// context keeps its slot and reads its clock without looking its name up on every step.
#[derive(Debug, Default)]
pub struct Clocks {
    slots: Vec<NodeClock>,
    by_name: FxHashMap<String, usize>,
}

impl Clocks {
    /// `node`'s slot, if it has a clock.
    #[must_use]
    pub fn slot(&self, node: &str) -> Option<usize> {
        self.by_name.get(node).copied()
    }

    /// `node`'s clock, if it has one.
    #[must_use]
    pub fn get(&self, node: &str) -> Option<&NodeClock> {
        self.slot(node).map(|slot| &self.slots[slot])
    }

    /// `node`'s clock, a true one added if it has none.
    pub fn entry(&mut self, node: &str) -> &mut NodeClock {
        let slot = match self.slot(node) {
            Some(slot) => slot,
            None => {
                self.slots.push(NodeClock::default());
                self.by_name.insert(node.to_owned(), self.slots.len() - 1);
                self.slots.len() - 1
            }
        };
        &mut self.slots[slot]
    }

    /// The reading at `sim_ms` of the clock in `slot`, or of a true clock for none.
    #[must_use]
    pub fn reading(&self, slot: Option<usize>, sim_ms: u64) -> Now {
        slot.map_or_else(
            || NodeClock::default().now(sim_ms),
            |slot| self.slots[slot].now(sim_ms),
        )
    }

    /// The names of the nodes with a clock, in no order.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }
}

/// A handle on the shared state.
#[derive(Clone, Debug)]
pub struct World(Arc<Mutex<WorldState>>);

impl World {
    /// A new world for `spec`; must be created inside the simulation (it reads the clock).
    #[must_use]
    pub fn new(spec: RunSpec) -> Self {
        // About 3.5 events per operation of the safety phase (invocation, completion, what the
        // nodes recorded): room for them up front rather than copying the history as it grows.
        let workload = &spec.scenario.workload;
        let expected_events =
            u64::from(workload.rate_per_s).saturating_mul(spec.scenario.run.safety_ms) / 250;
        let clock = SimClock::current();
        let history =
            Vec::with_capacity(usize::try_from(expected_events.min(1 << 22)).unwrap_or(0));
        WORLDS_ALIVE.with(|n| n.set(n.get() + 1));
        Self(Arc::new(Mutex::new(WorldState {
            spec,
            start: clock.elapsed(),
            clock,
            clocks: Clocks::default(),
            history,
            coverage: FxHashMap::default(),
            clogged_links: BTreeMap::new(),
            clogged_nodes: BTreeMap::new(),
            loss_ppm: 0,
            latency_spike: false,
            disks: Disks::default(),
            published: Published::default(),
            addrs: BTreeMap::new(),
            addr_index: FxHashMap::default(),
            names: FxHashMap::default(),
            node_ids: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            paused: BTreeMap::new(),
            killed: BTreeSet::new(),
            next_instance: 1,
            next_xid: 1,
            faults: Vec::new(),
            clock_samples: Vec::new(),
            workload_stopped: false,
            healed: false,
            healed_at_ms: None,
            supervisor: madsim::plugin::node(),
            supervisor_tasks: Vec::new(),
            durable_steps: BTreeMap::new(),
            probe: None,
            landing: None,
            edges: sut::edge::Edges::new(),
            transport: Transport::default(),
            wire: Wire::default(),
        })))
    }

    /// Locks the state. Never hold the guard across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, WorldState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut WorldState) -> R) -> R {
        f(&mut self.lock())
    }

    /// Simulated ms since the start of the run.
    #[must_use]
    pub fn sim_ms(&self) -> u64 {
        self.lock().sim_ms()
    }

    /// `node`'s clock reading now.
    #[must_use]
    pub fn now(&self, node: &str) -> Now {
        self.lock().now(node)
    }

    /// Records an event; `make` receives the event's sequence number.
    pub fn record(&self, node: &str, make: impl FnOnce(u64) -> EventKind) -> u64 {
        self.lock().record(node, make)
    }

    /// [`World::record`] for `node`, whose name its events share and whose clock is in `slot`.
    pub fn record_as(
        &self,
        node: &Arc<str>,
        slot: Option<usize>,
        make: impl FnOnce(u64) -> EventKind,
    ) -> u64 {
        self.lock().record_as(node, slot, make)
    }

    /// The reading now of the clock in `slot` ([`Clocks::slot`]).
    #[must_use]
    pub fn now_at(&self, slot: Option<usize>) -> Now {
        self.lock().now_at(slot)
    }

    /// Adds `n` to a coverage counter.
    pub fn count(&self, key: &str, n: u64) {
        self.lock().count(key, n);
    }

    /// Moves `machine`'s arrivals at edge states into the seed's tally (after each of its steps:
    /// a node killed later loses nothing already reached).
    pub fn take_edges(&self, machine: &mut impl sut::edge::Observed) {
        let mut reached = sut::edge::Edges::new();
        machine.take_edges(&mut reached);
        if !reached.is_empty() {
            self.lock().edges.absorb(&mut reached);
        }
    }
}

impl WorldState {
    /// Simulated ms since the start of the run.
    #[must_use]
    pub fn sim_ms(&self) -> u64 {
        let elapsed = self.clock.elapsed().saturating_sub(self.start);
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    }

    /// `node`'s clock reading now.
    #[must_use]
    pub fn now(&self, node: &str) -> Now {
        self.now_at(self.clocks.slot(node))
    }

    /// The reading now of the clock in `slot` ([`Clocks::slot`]; a true clock for none).
    #[must_use]
    pub fn now_at(&self, slot: Option<usize>) -> Now {
        let sim_ms = self.sim_ms();
        self.clocks.reading(slot, sim_ms)
    }

    /// Records an event.
    pub fn record(&mut self, node: &str, make: impl FnOnce(u64) -> EventKind) -> u64 {
        self.record_as(&Arc::from(node), self.clocks.slot(node), make)
    }

    /// Records an event of `node`, whose name its events share and whose clock is in `slot`.
    pub fn record_as(
        &mut self,
        node: &Arc<str>,
        slot: Option<usize>,
        make: impl FnOnce(u64) -> EventKind,
    ) -> u64 {
        debug_assert_eq!(slot, self.clocks.slot(node), "{node}'s clock slot");
        let seq = self.history.len() as u64;
        // One clock reading for the event and its node's clock.
        let sim_ms = self.sim_ms();
        let now = self.clocks.reading(slot, sim_ms);
        self.history.push(Event {
            seq,
            sim_ms,
            node: Arc::clone(node),
            wall_ms: now.wall_ms,
            kind: make(seq),
        });
        seq
    }

    /// Crash points: `node` arrives at `site` with `label`; `true` when this run's planned
    /// crash strikes here. Only in the safety phase: a crash in the liveness phase would leave
    /// no time for the recovery the checkers judge.
    pub fn arrive(
        &mut self,
        node: &str,
        site: crate::crashpoints::Site,
        label: crate::crashpoints::Label,
    ) -> bool {
        if self.healed || self.workload_stopped {
            return false;
        }
        let now_ms = self.sim_ms();
        self.probe
            .as_mut()
            .is_some_and(|probe| probe.arrive(node, site, label, now_ms))
    }

    /// The name of the node whose task is running (madsim's current node), if it is one of the
    /// run's nodes.
    #[must_use]
    pub fn current_node(&self) -> Option<&str> {
        let here = madsim::plugin::node();
        self.node_ids
            .iter()
            .find(|(_, id)| **id == here)
            .map(|(name, _)| name.as_str())
    }

    /// Adds node `name` at `addr` (its clock starts true).
    pub fn add_node(&mut self, name: &str, addr: SocketAddr) {
        self.addrs.insert(name.to_owned(), addr);
        self.addr_index.insert(name.to_owned(), addr);
        self.names.insert(addr.ip(), name.to_owned());
        *self.clocks.entry(name) = NodeClock::default();
    }

    /// Node `name`'s address.
    #[must_use]
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.addr_index.get(name).copied()
    }

    /// The coverage counters, in order.
    #[must_use]
    pub fn coverage(&self) -> BTreeMap<String, u64> {
        self.coverage.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Adds `n` to a coverage counter.
    pub fn count(&mut self, key: &str, n: u64) {
        if n == 0 {
            return;
        }
        match self.coverage.get_mut(key) {
            Some(value) => *value += n,
            None => {
                self.coverage.insert(key.to_owned(), n);
            }
        }
    }

    /// A fresh process-incarnation id (allocator instance, worker holder).
    pub fn next_instance(&mut self) -> u64 {
        let id = self.next_instance;
        self.next_instance += 1;
        id
    }

    /// A fresh draw xid (stands in for an ID from the ID service).
    pub fn next_xid(&mut self) -> u64 {
        let id = self.next_xid;
        self.next_xid += 1;
        id
    }

    /// Whether a message from `from` to `to` would be dropped by a partition now.
    #[must_use]
    pub fn partitioned(&self, from: &str, to: &str) -> bool {
        // (Checked on every send: no allocation, and the maps are empty most of the time.)
        (!self.clogged_nodes.is_empty()
            && (self.clogged_nodes.contains_key(from) || self.clogged_nodes.contains_key(to)))
            || (!self.clogged_links.is_empty()
                && self.clogged_links.keys().any(|(a, b)| a == from && b == to))
    }

    /// The server nodes (everything but clients), in a fixed order.
    #[must_use]
    pub fn server_nodes(&self) -> Vec<String> {
        self.addrs
            .keys()
            .filter(|n| !n.starts_with("client"))
            .cloned()
            .collect()
    }

    /// Changes a node's clock, sampling its skew just before and just after (so the report's
    /// clock lane shows jumps as jumps and drift as slopes).
    pub fn adjust_clock(&mut self, node: &str, change: impl FnOnce(&mut NodeClock, u64)) {
        self.sample_clock(node);
        let now = self.sim_ms();
        change(self.clocks.entry(node), now);
        self.sample_clock(node);
    }

    /// Samples a node's clock skew (for the report's clock lane).
    pub fn sample_clock(&mut self, node: &str) {
        let sim_ms = self.sim_ms();
        let skew = self.clocks.get(node).map_or(0, |c| c.skew_ms(sim_ms));
        self.clock_samples.push((node.to_owned(), sim_ms, skew));
    }
}
