//! Running a scenario: one seed in its own madsim runtime, a sweep of seeds on several
//! threads, and the determinism check (the same seed twice must give the same history hash).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use madsim::rand::{Rng, thread_rng};
use madsim::runtime::{Handle, Runtime};
use serde::{Deserialize, Serialize};
use sut::id_store::TagSpec;
use sut::lottery::journal::{self, JournalOp};
use sut::lottery::{CoordLog, Ledger, LotteryStore, ParticipantReply};

use crate::checkers::{FinalState, Violation, check_all, gap_bound};
use crate::crashpoints::{self, CrashPlan, PointKey, Probe, SeedCrashPoints, Struck, Tried};
use crate::history::{Event, EventKind, Outcome};
use crate::net::{Ctx, Inbox, PORT};
use crate::nodes;
use crate::scenario::{FaultKind, Scenario};
use crate::wire::Transport;
use crate::world::{DbRec, FaultSpan, RunSpec, World};

/// One bucket of the operations-over-time series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsBucket {
    /// Start of the bucket, simulated ms.
    pub t_ms: u64,
    /// Operations that succeeded.
    pub ok: u64,
    /// Operations that definitely failed.
    pub failed: u64,
    /// Operations with no answer in time.
    pub indeterminate: u64,
}

/// What one seed did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeedOutcome {
    /// The seed.
    pub seed: u64,
    /// Fault kinds enabled for this seed, with weights.
    pub enabled_faults: Vec<(FaultKind, u32)>,
    /// This seed's BUGGIFY knobs, one line each (empty: off).
    #[serde(default)]
    pub buggify: Vec<String>,
    /// Per invariant: `None` held, `Some` violated.
    pub results: Vec<(String, Option<Violation>)>,
    /// What each fault actually did.
    pub coverage: BTreeMap<String, u64>,
    /// How often each edge state (`sut::edge`) was reached.
    #[serde(default)]
    pub edges: BTreeMap<String, u64>,
    /// History length.
    pub events: u64,
    /// Simulated ms.
    pub sim_ms: u64,
    /// madsim datagrams the network carried (several messages each: see `net`).
    #[serde(default)]
    pub datagrams: u64,
    /// Hash of the full history (determinism).
    pub trace_hash: u64,
    /// Segment IDs lost (never issued below the highest issued).
    pub ids_lost: u64,
    /// Faults as they happened.
    pub faults: Vec<FaultSpan>,
    /// Clock skew samples (node, sim ms, skew ms).
    pub clock_samples: Vec<(String, u64, i64)>,
    /// Operations over time, 500 ms buckets.
    pub ops: Vec<OpsBucket>,
    /// Per operation kind: `[ok, failed, indeterminate]`.
    pub op_outcomes: BTreeMap<String, [u64; 3]>,
    /// Per operation kind, why operations failed: the refusal's text with every number as `N`
    /// (so that "user 12 has 5 …" and "user 40 has 0 …" count as one reason), and how often.
    #[serde(default)]
    pub op_failures: BTreeMap<String, BTreeMap<String, u64>>,
    /// Node names.
    pub nodes: Vec<String>,
    /// Crash points (`--crash-points`, `--crash-at`): the points the seed reached and those
    /// tried, each a run of the seed again with a crash there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_points: Option<SeedCrashPoints>,
    /// The history itself, when asked for.
    pub history: Option<Vec<Event>>,
    /// Wall-clock seconds this seed took.
    pub wall_seconds: f64,
}

impl SeedOutcome {
    /// The violations of the seed's own run.
    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.results.iter().filter_map(|(_, v)| v.as_ref())
    }

    /// The violations of the crash points tried, each with its point.
    pub fn crash_violations(&self) -> impl Iterator<Item = (&Tried, &Violation)> {
        self.crash_points
            .iter()
            .flat_map(|c| &c.tried)
            .flat_map(|t| t.violations.iter().map(move |v| (t, v)))
    }
}

/// Node names of a topology, in a fixed order.
#[must_use]
pub fn node_names(scenario: &Scenario) -> Vec<String> {
    let mut names = vec!["db".to_owned()];
    names.extend((1..=scenario.topology.id_nodes).map(|i| format!("id{i}")));
    names.extend(["token", "coord", "wallet", "inventory"].map(String::from));
    names.extend((1..=scenario.topology.clients).map(|i| format!("client{i}")));
    names
}

/// Swarm testing: which fault kinds this seed enables, with which weights.
/// A scripted schedule decides instead: its kinds, weighted by their event counts (no draw).
fn resolve_faults(scenario: &Scenario) -> Vec<(FaultKind, u32)> {
    if let Some(schedule) = &scenario.schedule {
        let mut counts: BTreeMap<FaultKind, u32> = BTreeMap::new();
        for event in schedule {
            *counts.entry(event.fault).or_default() += 1;
        }
        return counts.into_iter().collect();
    }
    let kinds = &scenario.faults.kinds;
    if kinds.is_empty() {
        return Vec::new();
    }
    let mut rng = thread_rng();
    if !scenario.faults.swarm {
        return kinds.iter().map(|k| (*k, 1)).collect();
    }
    let mut enabled = Vec::new();
    for kind in kinds {
        if rng.gen_bool(0.7) {
            enabled.push((*kind, rng.gen_range(1..=10)));
        }
    }
    if enabled.is_empty() {
        enabled.push((kinds[rng.gen_range(0..kinds.len())], 1));
    }
    enabled
}

fn setup_disks(world: &World) {
    world.with(|w| {
        let s = w.spec.scenario.clone();
        w.disks.db.append(DbRec::CreateTag(
            nodes::id::TAG.into(),
            TagSpec::simple(s.ids.step),
        ));
        w.disks.db.sync();
        let wallet = w.disks.parts.entry("wallet".into()).or_default();
        for user in 1..=u64::from(s.workload.users) {
            wallet.append(JournalOp::OpenAccounts {
                first: user,
                count: 1,
                balance_minor: s.workload.balance,
            });
        }
        wallet.sync();
        let inventory = w.disks.parts.entry("inventory".into()).or_default();
        for activity in 1..=u64::from(s.workload.activities) {
            inventory.append(JournalOp::AddStock {
                activity: sut::lottery::ActivityId(activity),
                units: s.workload.stock,
            });
        }
        inventory.sync();
    });
}

fn hash_history(history: &[Event]) -> u64 {
    // FxHash: deterministic (no random keys) and several times cheaper than SipHash over a
    // history of tens of thousands of events.
    let mut hasher = rustc_hash::FxHasher::default();
    history.hash(&mut hasher);
    hasher.finish()
}

fn ops_series(history: &[Event]) -> Vec<OpsBucket> {
    let mut buckets: BTreeMap<u64, OpsBucket> = BTreeMap::new();
    for e in history {
        if let EventKind::Complete { outcome, .. } = &e.kind {
            let t_ms = e.sim_ms / 500 * 500;
            let b = buckets.entry(t_ms).or_insert(OpsBucket {
                t_ms,
                ..OpsBucket::default()
            });
            match outcome {
                Outcome::Ok(_) => b.ok += 1,
                Outcome::Fail(_) => b.failed += 1,
                Outcome::Timeout => b.indeterminate += 1,
            }
        }
    }
    buckets.into_values().collect()
}

/// Per operation kind, how its operations ended (`[ok, failed, indeterminate]`), and why they
/// failed: the reasons with their numbers as `N` (so that "user 12 has 5 …" and "user 40 has
/// 0 …" count as one reason), with counts. One pass over the history; each distinct reason is
/// rewritten once.
type OpSummaries = (
    BTreeMap<String, [u64; 3]>,
    BTreeMap<String, BTreeMap<String, u64>>,
);

fn op_summaries(history: &[Event]) -> OpSummaries {
    let mut kinds: rustc_hash::FxHashMap<(&str, u64), &'static str> =
        rustc_hash::FxHashMap::with_capacity_and_hasher(history.len() / 2, Default::default());
    // A handful of kinds, each a literal of `Op::kind`: a short list, put in order at the end.
    let mut outcomes: Vec<(&'static str, [u64; 3])> = Vec::new();
    let mut reasons: rustc_hash::FxHashMap<(&'static str, &str), u64> =
        rustc_hash::FxHashMap::default();
    for e in history {
        match &e.kind {
            EventKind::Invoke { op_id, op } => {
                kinds.insert((&*e.node, *op_id), op.kind());
            }
            EventKind::Complete { op_id, outcome } => {
                let kind = kinds.get(&(&*e.node, *op_id)).copied().unwrap_or("unknown");
                let slot = match outcome {
                    Outcome::Ok(_) => 0,
                    Outcome::Fail(reason) => {
                        *reasons.entry((kind, reason.as_str())).or_default() += 1;
                        1
                    }
                    Outcome::Timeout => 2,
                };
                match outcomes
                    .iter_mut()
                    .find(|(k, _)| std::ptr::eq(*k, kind) || *k == kind)
                {
                    Some((_, counts)) => counts[slot] += 1,
                    None => {
                        let mut counts = [0; 3];
                        counts[slot] = 1;
                        outcomes.push((kind, counts));
                    }
                }
            }
            _ => {}
        }
    }
    let mut failures: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for ((kind, reason), n) in reasons {
        *failures
            .entry(kind.to_owned())
            .or_default()
            .entry(numbers_as_n(reason))
            .or_default() += n;
    }
    let outcomes = outcomes
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    (outcomes, failures)
}

/// `text` with every run of digits replaced by `N`.
fn numbers_as_n(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// Replays the participants' durable logs: their replies in the order they took effect.
fn effective_replies(world: &World) -> Vec<ParticipantReply> {
    world.with(|w| {
        w.disks
            .parts
            .values()
            .flat_map(|wal| journal::replay(wal.durable()).1)
            .collect()
    })
}

fn final_ledger(world: &World) -> Result<Ledger, String> {
    let (stores, log) = world.with(|w| {
        let stores: Vec<_> = w.published.ledgers.values().cloned().collect();
        // Built here, where the log is read in place; its error (if any) is reported after
        // the stores', as before.
        let mut log = CoordLog::default();
        let log = w
            .disks
            .coord
            .durable()
            .try_for_each(|entry| log.append(entry).map_err(|e| e.to_string()))
            .map(|()| log);
        (stores, log)
    });
    let mut parts = Vec::new();
    for store in stores {
        let mut s = store
            .lock()
            .map_err(|_| "a participant store is poisoned".to_owned())?;
        parts.push(s.snapshot().map_err(|e| e.to_string())?);
    }
    let mut ledger = Ledger::merge(parts.iter()).map_err(|e| e.to_string())?;
    ledger.coord_log = log?;
    Ok(ledger)
}

/// Gives every node its address and clock, then creates the madsim nodes, in `names` order.
fn create_nodes(world: &World, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let ip = IpAddr::V4(Ipv4Addr::new(
            10,
            0,
            0,
            u8::try_from(i + 1).expect("at most 40 nodes"),
        ));
        world.with(|w| w.add_node(name, SocketAddr::new(ip, PORT)));
    }
    for name in names {
        let ip = world.with(|w| w.addrs[name].ip());
        let (node_world, node_name) = (world.clone(), name.clone());
        let node = Handle::current()
            .create_node()
            .name(name.as_str())
            .ip(ip)
            .init(move || {
                let (world, name) = (node_world.clone(), node_name.clone());
                async move {
                    let (ctx, inbox) = Ctx::bind(world, &name).await;
                    node_main(ctx, inbox).await;
                }
            })
            .build();
        world.with(|w| w.node_ids.insert(name.clone(), node.id()));
    }
}

/// The safety phase (workload and nemesis), then the liveness phase (every fault healed). A
/// crash point's run ends its safety phase [`crashpoints::TAIL_MS`] after the crashed node is
/// back (the run up to the crash is the seed's own; what follows is judged as any run).
async fn run_phases(world: &World, scenario: &Scenario) {
    world.record("nemesis", |_| EventKind::Phase("safety".into()));
    let safety_ms = scenario.run.safety_ms;
    crate::nemesis::supervise(world, move |world| crate::nemesis::run(world, safety_ms));
    let crashed = world.with(|w| {
        w.probe
            .as_mut()
            .and_then(|p| p.plan().is_some().then(|| p.on_crash()))
    });
    match crashed {
        // (No other timer and no other wake-up than a plain run's until the crash: the run is
        // the seed's own up to there.)
        Some(crashed) => {
            let safety_end_ms = world.sim_ms() + safety_ms;
            let safety = madsim::time::sleep(Duration::from_millis(safety_ms));
            if let futures::future::Either::Right((Ok(at_ms), _)) =
                futures::future::select(safety, crashed).await
            {
                let down_ms = world.with(|w| {
                    w.probe
                        .as_ref()
                        .and_then(|p| p.plan())
                        .map_or(0, |p| p.down_ms)
                });
                let end_ms = (at_ms + down_ms + crashpoints::TAIL_MS).min(safety_end_ms);
                let now_ms = world.sim_ms();
                madsim::time::sleep(Duration::from_millis(end_ms.saturating_sub(now_ms))).await;
            }
        }
        None => madsim::time::sleep(Duration::from_millis(safety_ms)).await,
    }
    world.with(|w| {
        w.workload_stopped = true;
        w.record("nemesis", |_| EventKind::Phase("liveness".into()));
    });
    crate::nemesis::heal_all(world);
    madsim::time::sleep(Duration::from_millis(scenario.run.liveness_ms)).await;
}

/// Events that can strand segment IDs: ID-node boots, failed fetches, expired or lost leases.
fn stranding_events(history: &[Event], coverage: &BTreeMap<String, u64>) -> u64 {
    let id_boots = history
        .iter()
        .filter(|e| e.node.starts_with("id") && matches!(e.kind, EventKind::Boot { .. }))
        .count() as u64;
    id_boots
        + [
            "segment.fetch_failures",
            "segment.leases_expired",
            "segment.leases_lost",
        ]
        .iter()
        .map(|k| coverage.get(*k).copied().unwrap_or(0))
        .sum::<u64>()
}

/// What `ids.progress` checks in this scenario: every ID node issues segment IDs again within
/// two leases and a client timeout of the heal (a lease lost in the faults runs out, the
/// allocator's backoff of at most 2 s ends, a call in flight times out), and within the
/// liveness phase less one client timeout (at most half the phase), so that the last probe can
/// be answered; nothing when the workload asks for no segment IDs.
fn progress_spec(scenario: &Scenario) -> Option<crate::checkers::Progress> {
    let run = &scenario.run;
    let timeout_ms = scenario.workload.timeout_ms;
    let in_phase_ms = run.liveness_ms - timeout_ms.min(run.liveness_ms / 2);
    (scenario.workload.mix.segment > 0).then(|| crate::checkers::Progress {
        nodes: (1..=scenario.topology.id_nodes)
            .map(|i| format!("id{i}"))
            .collect(),
        bound_ms: (2 * scenario.ids.lease_ms + timeout_ms).min(in_phase_ms),
    })
}

/// Runs the checkers; a ledger that could not be read is a violation of its own.
fn judge(
    history: &[Event],
    state: &FinalState,
    ledger_error: Option<String>,
) -> (Vec<(String, Option<Violation>)>, u64) {
    let (checked, ids_lost) = check_all(history, state);
    let mut results: Vec<(String, Option<Violation>)> =
        checked.into_iter().map(|(n, r)| (n, r.err())).collect();
    if let Some(err) = ledger_error {
        results.push((
            "lottery.ledger".into(),
            Some(Violation {
                invariant: "lottery.ledger".into(),
                event: None,
                detail: err,
            }),
        ));
    }
    (results, ids_lost)
}

async fn simulate(
    scenario: Scenario,
    seed: u64,
    keep_history: bool,
    transport: Transport,
    probe: Option<Probe>,
) -> (SeedOutcome, Option<Probe>) {
    let enabled_faults = resolve_faults(&scenario);
    let buggify = crate::buggify::Buggify::for_seed(seed, &scenario, &enabled_faults);
    let scenario = buggify.scenario(scenario);
    let names = node_names(&scenario);
    let world = World::new(RunSpec {
        scenario: scenario.clone(),
        seed,
        faults: enabled_faults.clone(),
        buggify: buggify.clone(),
    });
    world.with(|w| {
        w.transport = transport;
        w.probe = probe;
    });
    setup_disks(&world);
    create_nodes(&world, &names);
    run_phases(&world, &scenario).await;

    let ledger = final_ledger(&world);
    let (history, coverage, faults, clock_samples, sim_ms, edges) = world.with(|w| {
        (
            std::mem::take(&mut w.history),
            w.coverage(),
            w.faults.clone(),
            w.clock_samples.clone(),
            w.sim_ms(),
            w.edges.take(),
        )
    });
    let datagrams = match world.with(|w| w.transport) {
        Transport::Wire => world.with(|w| w.wire.datagrams()),
        Transport::MadsimUdp => madsim::net::NetSim::current().stat().msg_count,
    };
    let stranding = stranding_events(&history, &coverage);
    let state = FinalState {
        ledger: ledger.clone().unwrap_or_default(),
        replies: effective_replies(&world),
        gap_bound_ids: gap_bound(scenario.ids.step_max, stranding),
        progress: progress_spec(&scenario),
        round_grace_ms: nodes::tcc::coordinator_config(&buggify, scenario.run.flaw).round_ms_max(),
        registry: nodes::tcc::registry(&scenario.workload),
    };
    let (results, ids_lost) = judge(&history, &state, ledger.err());
    let (op_outcomes, op_failures) = op_summaries(&history);
    let outcome = SeedOutcome {
        seed,
        enabled_faults,
        buggify: buggify.describe(),
        results,
        coverage,
        edges,
        events: history.len() as u64,
        sim_ms,
        datagrams,
        trace_hash: hash_history(&history),
        ids_lost,
        faults,
        clock_samples,
        ops: ops_series(&history),
        op_outcomes,
        op_failures,
        nodes: names,
        crash_points: None,
        history: keep_history.then_some(history),
        wall_seconds: 0.0,
    };
    let probe = world.with(|w| w.probe.take());
    release(&world).await;
    (outcome, probe)
}

/// Lets the seed's memory go once its outcome is known (nothing of the run is read after this).
/// madsim keeps a runtime's pending tasks alive after the runtime is dropped (its timers hold the
/// tasks' wakers, the tasks' sleeps hold the timers), and with them the world: every seed of a
/// sweep would leave its nodes, disks and stores behind, and the next one would run on fresh
/// memory (the kernel zeroing its pages, the caches cold). Killing the nodes and aborting the
/// supervisor's tasks has the executor drop them at its next turn.
async fn release(world: &World) {
    let (nodes, supervised) = world.with(|w| {
        (
            w.node_ids.values().copied().collect::<Vec<_>>(),
            std::mem::take(&mut w.supervisor_tasks),
        )
    });
    let handle = madsim::runtime::Handle::current();
    for id in nodes {
        handle.kill(id);
    }
    for task in supervised {
        task.abort();
    }
    madsim::time::sleep(Duration::from_millis(1)).await;
}

/// The seed a thread is simulating: what a panic report names so that the seed can be
/// replayed alone (`scenario` reports a panic as a bench failure, exit code 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningSeed {
    /// The scenario's name.
    pub scenario: String,
    /// The flaw switched on, if any.
    pub flaw: Option<sut::flaw::Flaw>,
    /// The seed.
    pub seed: u64,
}

thread_local! {
    static RUNNING: std::cell::RefCell<Option<RunningSeed>> = const { std::cell::RefCell::new(None) };
}

/// The seed this thread is simulating right now, if any (for a panic report).
#[must_use]
pub fn running_seed() -> Option<RunningSeed> {
    RUNNING.with(|r| r.borrow().clone())
}

/// Clears the thread's [`RunningSeed`] when a seed ends (not when it panics: the panic report
/// reads it after unwinding has begun).
struct RunningGuard;

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            RUNNING.with(|r| r.borrow_mut().take());
        }
    }
}

/// Runs one seed.
#[must_use]
pub fn run_seed(scenario: &Scenario, seed: u64, keep_history: bool) -> SeedOutcome {
    run_seed_on(scenario, seed, keep_history, Transport::default())
}

/// Runs one seed, its datagrams carried by `transport` (the same run either way: see `net`).
#[must_use]
pub fn run_seed_on(
    scenario: &Scenario,
    seed: u64,
    keep_history: bool,
    transport: Transport,
) -> SeedOutcome {
    run_probed(scenario, seed, keep_history, transport, None).0
}

/// Runs one seed as the scenario's `[run]` says: with its crash points tried
/// (`crash_points`), with one crash point struck (`crash_at`), or plainly. With crash points,
/// `keep_history` keeps the seed's own run's history.
///
/// # Panics
/// If `crash_at` is not a valid plan (the scenario's validation refuses it).
#[must_use]
pub fn run_seed_as_set(scenario: &Scenario, seed: u64, keep_history: bool) -> SeedOutcome {
    if let Some(spec) = &scenario.run.crash_at {
        let plan = CrashPlan::parse(spec, crash_down_ms(scenario))
            .expect("a validated scenario's crash_at");
        return run_seed_crashed(scenario, seed, &plan, keep_history);
    }
    match scenario.run.crash_points {
        0 => run_seed(scenario, seed, keep_history),
        budget => run_seed_with_crash_points(scenario, seed, budget, keep_history),
    }
}

/// How long a crash point's node stays down: the shortest downtime of the scenario's faults.
#[must_use]
pub fn crash_down_ms(scenario: &Scenario) -> u64 {
    scenario.faults.down_ms.bounds()[0].max(1)
}

/// Runs one seed with the crash `plan` (`--crash-at`): the seed's own run up to the planned
/// arrival, the node crashed there and restarted, then judged as any run. Its outcome names the
/// plan (and when the crash came: never, if the run did not reach that arrival).
#[must_use]
pub fn run_seed_crashed(
    scenario: &Scenario,
    seed: u64,
    plan: &CrashPlan,
    keep_history: bool,
) -> SeedOutcome {
    let (mut outcome, probe) = run_probed(
        scenario,
        seed,
        keep_history,
        Transport::default(),
        Some(Probe::crash(plan.clone())),
    );
    outcome.crash_points = Some(SeedCrashPoints {
        struck: Some(Struck {
            plan: plan.clone(),
            crashed_at_ms: probe.and_then(|p| p.crashed_at_ms()),
        }),
        ..SeedCrashPoints::default()
    });
    outcome
}

/// Runs one seed with crash points: the seed's own run, probed for the points it reaches
/// (its outcome is that of a plain run of the seed), then at most `budget` of those points
/// ([`crashpoints::choose`]), each a run of the seed with a crash there.
#[must_use]
pub fn run_seed_with_crash_points(
    scenario: &Scenario,
    seed: u64,
    budget: u32,
    keep_history: bool,
) -> SeedOutcome {
    let started = Instant::now();
    let (mut outcome, probe) = run_probed(
        scenario,
        seed,
        keep_history,
        Transport::default(),
        Some(Probe::record()),
    );
    let found = probe.map(|p| p.found().to_vec()).unwrap_or_default();
    let down_ms = crash_down_ms(scenario);
    let tried = crashpoints::choose(&found, usize::try_from(budget).unwrap_or(usize::MAX), seed)
        .into_iter()
        .map(|point| {
            let plan = point.plan(down_ms);
            let (crashed, probe) = run_probed(
                scenario,
                seed,
                false,
                Transport::default(),
                Some(Probe::crash(plan.clone())),
            );
            Tried {
                key: point.key.clone(),
                plan,
                crashed_at_ms: probe.and_then(|p| p.crashed_at_ms()),
                violations: crashed.violations().cloned().collect(),
                events: crashed.events,
                trace_hash: crashed.trace_hash,
            }
        })
        .collect();
    outcome.crash_points = Some(SeedCrashPoints {
        found,
        tried,
        struck: None,
    });
    outcome.wall_seconds = started.elapsed().as_secs_f64();
    outcome
}

/// Runs one seed with `probe` (none: a plain run).
fn run_probed(
    scenario: &Scenario,
    seed: u64,
    keep_history: bool,
    transport: Transport,
    probe: Option<Probe>,
) -> (SeedOutcome, Option<Probe>) {
    RUNNING.with(|r| {
        *r.borrow_mut() = Some(RunningSeed {
            scenario: scenario.name.clone(),
            flaw: scenario.run.flaw,
            seed,
        });
    });
    let _running = RunningGuard;
    let started = Instant::now();
    let runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
    let (mut outcome, probe) = runtime.block_on(simulate(
        scenario.clone(),
        seed,
        keep_history,
        transport,
        probe,
    ));
    outcome.wall_seconds = started.elapsed().as_secs_f64();
    (outcome, probe)
}

/// Runs seed `seed` twice and compares the history hashes.
#[must_use]
pub fn check_determinism(scenario: &Scenario, seed: u64) -> (u64, u64) {
    let a = run_seed(scenario, seed, false).trace_hash;
    let b = run_seed(scenario, seed, false).trace_hash;
    (a, b)
}

/// Whether fault `kind` took effect according to `coverage` (one of its effect counters moved).
#[must_use]
pub fn took_effect(kind: FaultKind, coverage: &BTreeMap<String, u64>) -> bool {
    kind.effect_counters()
        .iter()
        .any(|c| coverage.get(*c).copied().unwrap_or(0) > 0)
}

/// The fewest seeds over which fault coverage is judged. Swarm testing switches each fault kind
/// off in about a third of the seeds, and a kind that is on may still not land on anything in a
/// short run, so one seed (a replay) proves nothing about coverage. Over this many seeds a
/// correct build leaves a kind unexercised only by a small chance (measured per scenario in
/// docs/simulation.md); the gate's sweeps are exactly this size.
pub const COVERAGE_SEEDS_MIN: usize = 8;

/// What a sweep did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sweep {
    /// Per seed, in seed order.
    pub seeds: Vec<SeedOutcome>,
    /// Coverage summed over the sweep.
    pub coverage: BTreeMap<String, u64>,
    /// Fault kinds of the scenario that never took effect in the whole sweep.
    pub vacuous_faults: Vec<FaultKind>,
    /// How often each edge state was reached, summed over the sweep.
    #[serde(default)]
    pub edges: BTreeMap<String, u64>,
    /// In how many seeds each edge state was reached.
    #[serde(default)]
    pub edge_seeds: BTreeMap<String, u64>,
    /// Edge states the scenario owns that no seed reached, among those the sweep's size judges
    /// ([`unreached_edges`]).
    #[serde(default)]
    pub unreached_edges: Vec<String>,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
}

impl Sweep {
    /// Whether the sweep is large enough to judge fault coverage ([`COVERAGE_SEEDS_MIN`]). A
    /// smaller run (a replay of one seed) reports the kinds that did not occur as a warning.
    #[must_use]
    pub fn coverage_judged(&self) -> bool {
        self.seeds.len() >= COVERAGE_SEEDS_MIN
    }

    /// Whether the sweep fails fault coverage: judged, and some fault kind never took effect.
    #[must_use]
    pub fn coverage_failed(&self) -> bool {
        self.coverage_judged() && !self.vacuous_faults.is_empty()
    }

    /// Whether the sweep fails edge coverage: an owned edge state that a sweep of this size
    /// judges was never reached.
    #[must_use]
    pub fn edges_failed(&self) -> bool {
        !self.unreached_edges.is_empty()
    }

    /// Every violation of the seeds' own runs, with its seed.
    pub fn violations(&self) -> impl Iterator<Item = (u64, &Violation)> {
        self.seeds
            .iter()
            .flat_map(|s| s.violations().map(move |v| (s.seed, v)))
    }

    /// Every violation of a crash point tried, with its seed and point.
    pub fn crash_violations(&self) -> impl Iterator<Item = (u64, &Tried, &Violation)> {
        self.seeds
            .iter()
            .flat_map(|s| s.crash_violations().map(move |(t, v)| (s.seed, t, v)))
    }

    /// What crash points did in this sweep (`None`: the sweep tried none and found none).
    #[must_use]
    pub fn crash_points(&self) -> Option<CrashPointsSummary> {
        let with: Vec<&SeedOutcome> = self
            .seeds
            .iter()
            .filter(|s| s.crash_points.is_some())
            .collect();
        if with.is_empty() {
            return None;
        }
        let mut summary = CrashPointsSummary {
            seeds: with.len() as u64,
            ..CrashPointsSummary::default()
        };
        for outcome in with {
            let points = outcome.crash_points.as_ref().expect("filtered on Some");
            if let Some(struck) = &points.struck {
                summary.struck.push((outcome.seed, struck.clone()));
            }
            summary.found_in_seeds += points.found.len() as u64;
            summary
                .found
                .extend(points.found.iter().map(|f| f.key.clone()));
            for tried in &points.tried {
                summary.runs += 1;
                summary.found.insert(tried.key.clone());
                summary.tried.insert(tried.key.clone());
                if tried.crashed_at_ms.is_none() {
                    summary.unreached.push((outcome.seed, tried.plan.clone()));
                }
                if !tried.violations.is_empty() {
                    summary.failed.insert(tried.key.clone());
                }
            }
        }
        Some(summary)
    }
}

/// What crash points did over a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashPointsSummary {
    /// Seeds that found (and tried) crash points.
    pub seeds: u64,
    /// Points found, summed over the seeds (each seed's distinct points).
    pub found_in_seeds: u64,
    /// Runs with a crash (one per point tried).
    pub runs: u64,
    /// Distinct points found over the sweep.
    pub found: std::collections::BTreeSet<PointKey>,
    /// Distinct points tried over the sweep.
    pub tried: std::collections::BTreeSet<PointKey>,
    /// Distinct points whose crash broke an invariant in some seed.
    pub failed: std::collections::BTreeSet<PointKey>,
    /// Crashes planned that their run never reached (the node went down first), by seed.
    pub unreached: Vec<(u64, CrashPlan)>,
    /// Replays of one point (`--crash-at`), by seed.
    pub struck: Vec<(u64, Struck)>,
}

/// Runs `seeds` on `jobs` threads; `progress` is called after each seed.
pub fn sweep(
    scenario: &Scenario,
    seeds: &[u64],
    jobs: usize,
    progress: &(dyn Fn(&SeedOutcome) + Sync),
) -> Sweep {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(usize::try_from(index).unwrap_or(usize::MAX))
                    else {
                        return;
                    };
                    let outcome = run_seed_as_set(scenario, seed, false);
                    progress(&outcome);
                    done.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(outcome);
                }
            });
        }
    });
    let outcomes = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    sweep_of(scenario, outcomes, started.elapsed().as_secs_f64())
}

/// The sweep made of `outcomes` (seeds of `scenario`, in any order, each once): the counters
/// summed, and fault and edge coverage judged on all of them together. [`sweep`] ends here, and
/// so does `scenario merge`, which rebuilds one sweep from the outcomes of several shards.
#[must_use]
pub fn sweep_of(scenario: &Scenario, mut outcomes: Vec<SeedOutcome>, wall_seconds: f64) -> Sweep {
    outcomes.sort_by_key(|o| o.seed);
    debug_assert!(
        outcomes.windows(2).all(|w| w[0].seed < w[1].seed),
        "a seed appears twice in a sweep"
    );
    let coverage = summed(outcomes.iter().map(|o| &o.coverage));
    let edges = summed(outcomes.iter().map(|o| &o.edges));
    let mut edge_seeds = BTreeMap::new();
    for name in outcomes.iter().flat_map(|o| o.edges.keys()) {
        *edge_seeds.entry(name.clone()).or_insert(0) += 1;
    }
    let vacuous_faults = scenario
        .fault_kinds()
        .into_iter()
        .filter(|kind| !took_effect(*kind, &coverage))
        .collect();
    let unreached_edges = unreached_edges(scenario, &edges, outcomes.len());
    Sweep {
        seeds: outcomes,
        coverage,
        vacuous_faults,
        edges,
        edge_seeds,
        unreached_edges,
        wall_seconds,
    }
}

/// Counters summed key by key.
fn summed<'a>(maps: impl Iterator<Item = &'a BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for map in maps {
        for (k, v) in map {
            *sum.entry(k.clone()).or_insert(0) += v;
        }
    }
    sum
}

/// The fewest seeds over which a scenario's rare edge states (`[edges] rare`) are judged.
pub const RARE_EDGE_SEEDS_MIN: usize = 200;

/// The edge states `scenario` owns that a sweep of `seeds` seeds judges and `edges` never
/// counted: the expected ones over [`COVERAGE_SEEDS_MIN`] seeds or more, the rare ones over
/// [`RARE_EDGE_SEEDS_MIN`] or more.
#[must_use]
pub fn unreached_edges(
    scenario: &Scenario,
    edges: &BTreeMap<String, u64>,
    seeds: usize,
) -> Vec<String> {
    const PARSED: &str = "`[edges]` is checked when the scenario is parsed";
    let mut judged: Vec<&sut::edge::Edge> = Vec::new();
    if seeds >= COVERAGE_SEEDS_MIN {
        judged.extend(scenario.edges.owned().expect(PARSED));
    }
    if seeds >= RARE_EDGE_SEEDS_MIN {
        judged.extend(scenario.edges.owned_rare().expect(PARSED));
    }
    judged
        .into_iter()
        .filter(|e| edges.get(e.name).copied().unwrap_or(0) == 0)
        .map(|e| e.name.to_owned())
        .collect()
}

/// A node's task: its role, from its name.
async fn node_main(ctx: Ctx, inbox: Inbox) {
    let incarnation = ctx.world.with(|w| {
        let n = w.incarnations.entry(ctx.name.clone()).or_insert(0);
        *n += 1;
        *n
    });
    ctx.record(|_| crate::history::EventKind::Boot { incarnation });
    let name = ctx.name.clone();
    if name == "db" {
        nodes::db::run(ctx, inbox).await;
    } else if name.starts_with("id") {
        nodes::id::run(ctx, inbox).await;
    } else if name == "token" {
        nodes::token::run(ctx, inbox).await;
    } else if name == "coord" {
        nodes::tcc::run_coordinator(ctx, inbox).await;
    } else if name == "wallet" || name == "inventory" {
        nodes::tcc::run_participant(ctx, inbox).await;
    } else if name.starts_with("client") {
        nodes::client::run(ctx, inbox).await;
    }
}

#[cfg(test)]
mod tests {
    use super::numbers_as_n;

    #[test]
    fn failure_reasons_group_by_their_words() {
        assert_eq!(
            numbers_as_n("user 12 has 5 but the ticket costs 10"),
            "user N has N but the ticket costs N"
        );
        assert_eq!(
            numbers_as_n("user 40 has 0 but the ticket costs 10"),
            numbers_as_n("user 12 has 5 but the ticket costs 10")
        );
        assert_eq!(numbers_as_n("out of stock"), "out of stock");
        assert_eq!(numbers_as_n("id7x"), "idNx");
    }
}
