//! The Snowflake worker and its lease holder against a hostile clock and a hostile lease store.
//! The wall clock jumps back and forward arbitrarily (within and beyond the rollback window,
//! across the end of the time field); the store answers each call honestly, with a larger
//! reservation than asked, with none, with a stale one, with an error, with "lease lost", with a
//! reply of another kind — or never, late, twice, or to a request never made; the process
//! restarts and the next incarnation leases the worker id again on the reservation the store
//! persisted. The properties are the worker's own promises (`sut::snowflake`'s docs), checked by
//! a referee after every step:
//!
//! - IDs strictly increase, across leases and incarnations (never one twice);
//! - every ID carries the leased worker id, nothing above its layout, and a time unit strictly
//!   above the reservation its lease carried (a predecessor may have issued up to it) and at or
//!   below the largest reservation the store acknowledged (the next holder starts above it);
//! - in `Refuse` mode every ID is of the wall clock's own unit; in `Logical` mode it is at or
//!   ahead of it by at most `borrow_ms_max`;
//! - a wait is a wait for a later wall-clock time;
//! - the counters ([`SequencerStats`], what the health view and the simulator's fault coverage
//!   read) count exactly what happened: an ID issued, a logical issue (an ID ahead of the wall
//!   clock's unit), a wait for the reservation, a wait for the clock, a refusal;
//! - `check_invariants` holds after every step, and nothing panics.
//!
//! The correct worker keeps them for every sequence; the three documented Snowflake flaws break
//! them and a random search finds each; a coverage test shows every Snowflake edge state reached.

use std::collections::BTreeMap;

use leased_ids::LeaseView;
use panics::unpanicked;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use sut::clock::Now;
use sut::edge::{Edges, Observed as _};
use sut::flaw::Flaw;
use sut::id_store::{InstanceId, StoreCall, StoreError, StoreReply, WorkerLease};
use sut::snowflake::holder::{HolderConfig, HolderEvent, WorkerLeaseHolder};
use sut::snowflake::{
    EDGES, Layout, NextId, RollbackPolicy, SequencerError, SequencerStats, WorkerConfig,
};

#[path = "support/leased_ids.rs"]
mod leased_ids;
#[path = "support/panics.rs"]
mod panics;

const CASES: u32 = 256;
const NAMESPACE: &str = "snowflake";
/// The worker id the store leases.
const WORKER: u32 = 5;
const LEASE_MS: u64 = 1_000;
const TIMEOUT_MS: u64 = 100;
const EPOCH_MS: u64 = 1_600_000_000_000;
const TIME_BITS: u8 = 20;

/// The worker's knobs, per case.
#[derive(Clone, Copy, Debug)]
struct Setup {
    seq_bits: u8,
    unit_ms: u64,
    rollback: RollbackPolicy,
    rollback_ms_max: u64,
    reserve_ahead_ms: u64,
    /// Start a few seconds before the end of the 20-bit time field.
    near_end: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        1_u8..=3,
        prop::sample::select(vec![1_u64, 10]),
        prop_oneof![
            Just(RollbackPolicy::Refuse),
            (1_u64..200).prop_map(|borrow_ms_max| RollbackPolicy::Logical { borrow_ms_max }),
        ],
        0_u64..20,
        prop::sample::select(vec![10_u64, 100, 2_000]),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(seq_bits, unit_ms, rollback, rollback_ms_max, reserve_ahead_ms, near_end)| Setup {
                seq_bits,
                unit_ms,
                rollback,
                rollback_ms_max,
                reserve_ahead_ms,
                near_end,
            },
        )
}

impl Setup {
    fn layout(&self) -> Layout {
        Layout {
            time_bits: TIME_BITS,
            worker_bits: 3,
            seq_bits: self.seq_bits,
            epoch_ms: EPOCH_MS,
            unit_ms: self.unit_ms,
        }
    }

    fn worker(&self, flaw: Option<Flaw>) -> WorkerConfig {
        WorkerConfig {
            layout: self.layout(),
            rollback_ms_max: self.rollback_ms_max,
            rollback: self.rollback,
            reserve_ahead_ms: self.reserve_ahead_ms,
            flaw,
        }
    }

    fn start_wall_ms(&self) -> u64 {
        let ts_max = self.layout().ts_max();
        let units = if self.near_end {
            ts_max - 3_000 / self.unit_ms
        } else {
            1_000
        };
        EPOCH_MS + units * self.unit_ms
    }
}

// ---------------------------------------------------------------------------------------------
// The referee.

struct Referee {
    layout: Layout,
    rollback: RollbackPolicy,
    lease: Option<LeaseView>,
    last: Option<u64>,
    /// IDs issued under the current lease.
    issued: u64,
}

impl Referee {
    fn new(layout: Layout, rollback: RollbackPolicy) -> Self {
        Self {
            layout,
            rollback,
            lease: None,
            last: None,
            issued: 0,
        }
    }

    /// The holder built a worker on a lease carrying `floor_ts`.
    fn acquired(&mut self, worker_id: u32, floor_ts: u64) {
        self.lease = Some(LeaseView::new(worker_id, floor_ts));
        self.issued = 0;
    }

    /// The store acknowledged a reservation of `ts`.
    fn renewed(&mut self, ts: u64) {
        if let Some(lease) = self.lease.as_mut() {
            lease.acknowledged(ts);
        }
    }

    fn lost(&mut self) {
        self.lease = None;
    }

    fn now_ts(&self, wall_ms: u64) -> u64 {
        (wall_ms - self.layout.epoch_ms) / self.layout.unit_ms
    }

    /// ID `id` handed out at `wall_ms`.
    fn issued(&mut self, id: u64, wall_ms: u64) -> Result<(), String> {
        let Some(lease) = self.lease else {
            return Err(format!("ID {id:#x} handed out with no lease"));
        };
        lease.check(&self.layout, 0, id, self.last)?;
        let d = self.layout.decode(id);
        let now_ts = self.now_ts(wall_ms);
        match self.rollback {
            RollbackPolicy::Refuse if d.ts != now_ts => {
                return Err(format!(
                    "ID {id:#x} in unit {} while the wall clock reads unit {now_ts} (refuse mode)",
                    d.ts
                ));
            }
            RollbackPolicy::Logical { borrow_ms_max } => {
                let ahead_ms =
                    (self.layout.epoch_ms + d.ts * self.layout.unit_ms).saturating_sub(wall_ms);
                if d.ts < now_ts || ahead_ms > borrow_ms_max {
                    return Err(format!(
                        "ID {id:#x} in unit {}, the wall clock in unit {now_ts}: more than \
                         {borrow_ms_max} ms ahead, or behind it",
                        d.ts
                    ));
                }
            }
            RollbackPolicy::Refuse => {}
        }
        self.last = Some(id);
        self.issued += 1;
        Ok(())
    }
}

/// The counters move by exactly what `outcome` says happened.
fn counted(
    before: &SequencerStats,
    after: &SequencerStats,
    outcome: &Result<NextId, SequencerError>,
    ahead: bool,
) -> Result<(), String> {
    let mut want = *before;
    match outcome {
        Ok(NextId::Id(_)) => {
            want.issued += 1;
            want.logical_issues += u64::from(ahead);
        }
        Ok(NextId::WaitReservation) => want.reservation_waits += 1,
        Ok(NextId::WaitUntil { .. }) => {
            // A wait for the clock to come back, or for the next unit's sequence: one of them.
            if after.rollback_waits == before.rollback_waits + 1 {
                want.rollback_waits += 1;
            } else {
                want.overflow_waits += 1;
            }
        }
        Err(SequencerError::ClockBehind { .. } | SequencerError::BorrowExceeded { .. }) => {
            want.rollback_refusals += 1;
        }
        Err(_) => {}
    }
    if *after == want {
        Ok(())
    } else {
        Err(format!(
            "after {outcome:?} the counters read {after:?}, expected {want:?}"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// The hostile store and clock.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Honest,
    /// Persists and reports more than asked.
    Generous,
    /// Reports the persisted reservation without raising it.
    Stingy,
    /// Reports half the persisted reservation (an old answer).
    Stale,
    Fail,
    /// "Lease lost" for a renewal (an error for an acquisition).
    LeaseLost,
    /// A reply of another kind.
    Misrouted,
}

#[derive(Clone, Copy, Debug)]
enum Pick {
    /// The latest call.
    Latest,
    /// The `n`-th call ever made (modulo): late or a duplicate.
    Any(usize),
    /// An id never used.
    Unknown(u64),
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Issue,
    Answer {
        pick: Pick,
        how: How,
        k: u64,
    },
    /// Both clocks move ahead.
    Advance(u64),
    /// The wall clock jumps (back when negative).
    WallJump(i64),
    Timeout,
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    let how = prop_oneof![
        6 => Just(How::Honest),
        1 => Just(How::Generous),
        1 => Just(How::Stingy),
        1 => Just(How::Stale),
        1 => Just(How::Fail),
        1 => Just(How::LeaseLost),
        1 => Just(How::Misrouted),
    ];
    let pick = prop_oneof![
        8 => Just(Pick::Latest),
        2 => any::<usize>().prop_map(Pick::Any),
        1 => (0_u64..4).prop_map(Pick::Unknown),
    ];
    prop_oneof![
        10 => Just(Action::Issue),
        8 => (pick, how, 0_u64..8).prop_map(|(pick, how, k)| Action::Answer { pick, how, k }),
        4 => prop_oneof![0_u64..5, 0_u64..200, 0_u64..3_000].prop_map(Action::Advance),
        2 => prop_oneof![-30_i64..30, -3_000_i64..3_000].prop_map(Action::WallJump),
        1 => Just(Action::Timeout),
        1 => Just(Action::Restart),
    ]
}

fn actions() -> impl Strategy<Value = Vec<Action>> {
    prop::collection::vec(action(), 1..150)
}

type Coverage = BTreeMap<&'static str, u64>;

struct Bench {
    setup: Setup,
    flaw: Option<Flaw>,
    incarnation: u64,
    holder: WorkerLeaseHolder,
    referee: Referee,
    wall_ms: u64,
    mono_ms: u64,
    /// The store: the persisted reservation of `WORKER`.
    persisted_ts: u64,
    /// Every call made, by id, and whether it was answered.
    calls: BTreeMap<u64, (StoreCall, bool)>,
    latest: Option<u64>,
    coverage: Coverage,
    /// Every incarnation's arrivals at edge states.
    edges: Edges,
}

impl Bench {
    fn new(setup: Setup, flaw: Option<Flaw>) -> Self {
        let layout = setup.layout();
        let mut bench = Self {
            setup,
            flaw,
            incarnation: 0,
            holder: WorkerLeaseHolder::new(Self::holder_config(&setup, flaw, 0)),
            referee: Referee::new(layout, setup.rollback),
            wall_ms: setup.start_wall_ms(),
            mono_ms: 0,
            persisted_ts: 0,
            calls: BTreeMap::new(),
            latest: None,
            coverage: Coverage::new(),
            edges: Edges::new(),
        };
        bench.drain();
        bench
    }

    fn holder_config(setup: &Setup, flaw: Option<Flaw>, incarnation: u64) -> HolderConfig {
        let mut cfg = HolderConfig::new(
            NAMESPACE,
            InstanceId(incarnation + 1),
            setup.worker(flaw),
            LEASE_MS,
            TIMEOUT_MS,
        );
        cfg.request_id_base = incarnation << 32;
        cfg
    }

    fn now(&self) -> Now {
        Now {
            wall_ms: self.wall_ms,
            mono_ms: self.mono_ms,
        }
    }

    fn cover(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_insert(0) += 1;
    }

    fn step(&mut self, action: &Action) -> Result<(), String> {
        unpanicked(|| self.act(action))
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        match *action {
            Action::Issue => self.issue()?,
            Action::Answer { pick, how, k } => self.answer(pick, how, k)?,
            Action::Advance(ms) => {
                self.wall_ms += ms;
                self.mono_ms += ms;
            }
            Action::WallJump(ms) => {
                let wall_ms = self.wall_ms.saturating_add_signed(ms);
                self.wall_ms = wall_ms.max(EPOCH_MS);
            }
            Action::Timeout => {
                let event = self.holder.handle_timeout(self.now());
                self.on_event(&event, None);
            }
            Action::Restart => {
                self.incarnation += 1;
                self.mono_ms = 0;
                let cfg = Self::holder_config(&self.setup, self.flaw, self.incarnation);
                self.holder.take_edges(&mut self.edges);
                self.holder = WorkerLeaseHolder::new(cfg);
                self.referee.lost();
                self.cover("restart");
            }
        }
        self.drain();
        self.holder
            .check_invariants()
            .map_err(|e| format!("invariant: {e}"))
    }

    fn drain(&mut self) {
        while let Some((id, call)) = self.holder.poll_request(self.now()) {
            self.calls.insert(id, (call, false));
            self.latest = Some(id);
        }
    }

    fn issue(&mut self) -> Result<(), String> {
        let wall_ms = self.wall_ms;
        let now_ts = self.referee.now_ts(wall_ms);
        let Some(worker) = self.holder.worker_mut() else {
            return Ok(());
        };
        let before = worker.sequencer().stats();
        let outcome = worker.next_id(wall_ms);
        let after = worker.sequencer().stats();
        let ahead = match &outcome {
            Ok(NextId::Id(id)) => {
                self.referee.issued(*id, wall_ms)?;
                let ts = self.referee.layout.decode(*id).ts;
                if ts > now_ts {
                    self.cover("ID ahead of the wall clock");
                }
                ts > now_ts
            }
            Ok(NextId::WaitUntil { wall_ms: until }) => {
                if *until <= wall_ms {
                    return Err(format!(
                        "a wait until {until} ms, not after the clock's {wall_ms} ms"
                    ));
                }
                self.cover("wait for the clock");
                false
            }
            Ok(NextId::WaitReservation) => {
                self.cover("wait for the reservation");
                false
            }
            Err(_) => {
                self.cover("refused");
                false
            }
        };
        counted(&before, &after, &outcome, ahead)?;
        if after.issued != self.referee.issued {
            return Err(format!(
                "the worker counts {} IDs issued, {} were handed out",
                after.issued, self.referee.issued
            ));
        }
        Ok(())
    }

    fn answer(&mut self, pick: Pick, how: How, k: u64) -> Result<(), String> {
        let id = match pick {
            Pick::Latest => match self.latest {
                Some(id) => id,
                None => return Ok(()),
            },
            Pick::Any(n) => match self.calls.keys().nth(n % self.calls.len().max(1)) {
                Some(id) => *id,
                None => return Ok(()),
            },
            Pick::Unknown(n) => {
                // Never asked: a future id of this incarnation, or an unborn one's.
                let next = self.latest.unwrap_or(self.incarnation << 32);
                if n % 2 == 0 {
                    next + 1 + n
                } else {
                    ((self.incarnation + 7) << 32) | (1 + n)
                }
            }
        };
        let call = self.calls.get(&id).map(|(call, _)| call.clone());
        let answered = self.calls.get(&id).is_some_and(|(_, answered)| *answered);
        if answered {
            self.cover("duplicate reply");
        }
        let reply = match &call {
            Some(call) => self.store_answer(call, how, k),
            None => {
                self.cover("reply to an id never asked");
                StoreReply::Worker(Ok(WorkerLease {
                    worker_id: WORKER,
                    lease_expiry_ms: 0,
                    reserved_ts: self.persisted_ts,
                }))
            }
        };
        if let Some(entry) = self.calls.get_mut(&id) {
            entry.1 = true;
        }
        let event = self.holder.handle_reply(id, reply.clone(), self.now());
        self.on_event(&event, Some(&reply));
        Ok(())
    }

    fn store_answer(&mut self, call: &StoreCall, how: How, k: u64) -> StoreReply {
        if how == How::Misrouted {
            self.cover("misrouted reply");
            return StoreReply::Read(Err(StoreError::Backend("a reply of another kind".into())));
        }
        let lease = |reserved_ts| {
            Ok(WorkerLease {
                worker_id: WORKER,
                lease_expiry_ms: LEASE_MS,
                reserved_ts,
            })
        };
        match call {
            StoreCall::AcquireWorker(_) => StoreReply::Worker(match how {
                How::Fail | How::LeaseLost => Err(StoreError::Backend("no worker id".into())),
                How::Generous => {
                    self.persisted_ts += 1 + k;
                    lease(self.persisted_ts)
                }
                _ => lease(self.persisted_ts),
            }),
            StoreCall::RenewWorker {
                reserve_ts,
                instance,
                ..
            } => StoreReply::Worker(match how {
                How::Honest | How::Misrouted => {
                    self.persisted_ts = self.persisted_ts.max(*reserve_ts);
                    lease(self.persisted_ts)
                }
                How::Generous => {
                    self.persisted_ts = self.persisted_ts.max(*reserve_ts + 1 + k);
                    lease(self.persisted_ts)
                }
                How::Stingy => lease(self.persisted_ts),
                How::Stale => lease(self.persisted_ts / 2),
                How::Fail => Err(StoreError::Backend("renew failed".into())),
                How::LeaseLost => Err(StoreError::WorkerLeaseLost {
                    namespace: NAMESPACE.to_owned(),
                    worker_id: WORKER,
                    instance: *instance,
                }),
            }),
            _ => StoreReply::Worker(Err(StoreError::Backend("not a worker call".into()))),
        }
    }

    /// What the holder reported it did.
    fn on_event(&mut self, event: &HolderEvent, reply: Option<&StoreReply>) {
        let lease = match reply {
            Some(StoreReply::Worker(Ok(lease))) => Some(*lease),
            _ => None,
        };
        match (event, lease) {
            (HolderEvent::Acquired { worker_id }, Some(lease)) => {
                if lease.reserved_ts > 0 {
                    self.cover("lease reacquired above a reservation");
                }
                self.referee.acquired(*worker_id, lease.reserved_ts);
            }
            (HolderEvent::Renewed, Some(lease)) => self.referee.renewed(lease.reserved_ts),
            (HolderEvent::LeaseLost, _) => {
                self.cover("lease lost");
                self.referee.lost();
            }
            _ => {}
        }
    }
}

fn run_bench(setup: Setup, flaw: Option<Flaw>, actions: &[Action]) -> Result<Bench, String> {
    let mut bench = Bench::new(setup, flaw);
    for (i, action) in actions.iter().enumerate() {
        bench
            .step(action)
            .map_err(|e| format!("step {i} ({action:?}): {e}"))?;
    }
    bench.holder.take_edges(&mut bench.edges);
    Ok(bench)
}

fn fixed(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x50_f1a6),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(fixed(CASES))]

    #[test]
    fn the_worker_keeps_its_promises_whatever_the_clock_and_the_store_do(
        setup in setup(),
        actions in actions(),
    ) {
        let result = run_bench(setup, None, &actions).map(|_| ());
        prop_assert_eq!(result, Ok(()));
    }
}

#[test]
fn the_hostile_clock_and_store_reach_every_rare_situation() {
    let mut runner = TestRunner::new(fixed(CASES));
    let strategy = (setup(), actions());
    let mut reached = Edges::new();
    let mut seen = Coverage::new();
    for _ in 0..CASES {
        let (setup, actions) = strategy.new_tree(&mut runner).unwrap().current();
        let mut bench = run_bench(setup, None, &actions).unwrap_or_else(|e| panic!("{e}"));
        reached.absorb(&mut bench.edges);
        for (what, n) in bench.coverage {
            *seen.entry(what).or_insert(0) += n;
        }
    }
    for want in [
        "ID ahead of the wall clock",
        "wait for the clock",
        "wait for the reservation",
        "refused",
        "duplicate reply",
        "reply to an id never asked",
        "misrouted reply",
        "lease lost",
        "lease reacquired above a reservation",
        "restart",
    ] {
        assert!(seen.contains_key(want), "never reached: {want} ({seen:?})");
    }
    let edges = reached.take();
    for edge in EDGES {
        assert!(
            edges.contains_key(edge.name),
            "edge never reached: {} ({edges:?})",
            edge.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Firing: each check catches a broken worker.

#[test]
fn random_sequences_find_each_snowflake_flaw() {
    // A reset sequence repeats an ID of the last unit: within one lease it is out of order;
    // at a restart's floor unit it is an ID in the unit a predecessor may have filled.
    // A wrapped time field puts an ID in a unit far below the clock and the reservation.
    for (flaw, symptoms) in [
        (
            Flaw::SnowflakeSeqResetFirst,
            &["not increasing", "outside"][..],
        ),
        (Flaw::SnowflakeNoPersistedTs, &["outside"][..]),
        (
            Flaw::TimeFieldNarrow,
            &["not increasing", "wall clock", "outside"][..],
        ),
    ] {
        let mut runner = TestRunner::new(fixed(CASES * 4));
        let strategy = (setup(), actions());
        let found = (0..CASES * 4).find_map(|_| {
            let (setup, actions) = strategy.new_tree(&mut runner).unwrap().current();
            run_bench(setup, Some(flaw), &actions).err()
        });
        let e = found.unwrap_or_else(|| panic!("{flaw:?} never caught"));
        assert!(symptoms.iter().any(|s| e.contains(s)), "{flaw:?}: {e}");
    }
}

fn referee(rollback: RollbackPolicy) -> Referee {
    let setup = Setup {
        seq_bits: 2,
        unit_ms: 1,
        rollback,
        rollback_ms_max: 5,
        reserve_ahead_ms: 100,
        near_end: false,
    };
    let mut referee = Referee::new(setup.layout(), rollback);
    referee.acquired(WORKER, 100);
    referee.renewed(200);
    referee
}

/// The ID of `worker` in unit `ts`, sequence `seq`, and the wall clock at the start of unit
/// `wall_ts`.
fn id_at(referee: &Referee, ts: u64, worker: u32, seq: u64) -> u64 {
    referee.layout.compose(ts, u64::from(worker), seq)
}

fn wall(ts: u64) -> u64 {
    EPOCH_MS + ts
}

#[test]
fn the_referee_catches_ids_outside_the_reservation_repeated_or_of_another_worker() {
    let mut r = referee(RollbackPolicy::Refuse);
    let ok = id_at(&r, 150, WORKER, 0);
    assert_eq!(r.issued(ok, wall(150)), Ok(()));
    let e = r.issued(ok, wall(150)).unwrap_err();
    assert!(e.contains("not increasing"), "{e}");
    let e = r.issued(id_at(&r, 100, WORKER, 3), wall(100)).unwrap_err();
    assert!(e.contains("outside (100, 200]"), "{e}");
    let e = r.issued(id_at(&r, 201, WORKER, 0), wall(201)).unwrap_err();
    assert!(e.contains("outside (100, 200]"), "{e}");
    let e = r
        .issued(id_at(&r, 160, WORKER + 1, 0), wall(160))
        .unwrap_err();
    assert!(e.contains("not the leased 5"), "{e}");
    let e = r
        .issued(id_at(&r, 160, WORKER, 0) | 1 << 40, wall(160))
        .unwrap_err();
    assert!(e.contains("must be exactly the flag 0x0"), "{e}");
    r.lost();
    let e = r.issued(id_at(&r, 170, WORKER, 0), wall(170)).unwrap_err();
    assert!(e.contains("no lease"), "{e}");
}

#[test]
fn the_referee_catches_ids_off_the_wall_clock() {
    let mut r = referee(RollbackPolicy::Refuse);
    let e = r.issued(id_at(&r, 151, WORKER, 0), wall(150)).unwrap_err();
    assert!(e.contains("refuse mode"), "{e}");
    let mut r = referee(RollbackPolicy::Logical { borrow_ms_max: 10 });
    assert_eq!(r.issued(id_at(&r, 160, WORKER, 0), wall(150)), Ok(()));
    let e = r.issued(id_at(&r, 171, WORKER, 0), wall(160)).unwrap_err();
    assert!(e.contains("more than 10 ms ahead"), "{e}");
    let e = r.issued(id_at(&r, 161, WORKER, 0), wall(165)).unwrap_err();
    assert!(e.contains("or behind it"), "{e}");
}

#[test]
fn the_counter_check_catches_a_missing_or_wrong_count() {
    let before = SequencerStats::default();
    let issued = SequencerStats {
        issued: 1,
        ..before
    };
    let id = Ok(NextId::Id(7));
    assert_eq!(counted(&before, &issued, &id, false), Ok(()));
    let e = counted(&before, &issued, &id, true).unwrap_err();
    assert!(e.contains("logical_issues: 1"), "{e}");
    let e = counted(&before, &before, &Ok(NextId::WaitReservation), false).unwrap_err();
    assert!(e.contains("reservation_waits: 1"), "{e}");
    let refused = Err(SequencerError::ClockBehind {
        behind_ms: 9,
        window_ms: 5,
    });
    let e = counted(&before, &before, &refused, false).unwrap_err();
    assert!(e.contains("rollback_refusals: 1"), "{e}");
}
