//! The compensation wheel against a hostile driver. The wheel's peer is the coordinator that
//! drives it; a driver may call anything in any order: schedule in the past, at the end of
//! time or beyond capacity; cancel a task waiting, ready, in flight, finished or never
//! scheduled; report success or failure of a task it was never handed, twice, or after
//! cancelling it; fail a task at any time of its own clock; hand `handle_timeout` a stale time;
//! leave fired tasks in the ready queue while scheduling more; sleep until `poll_timeout` or
//! wake arbitrarily late. The properties are the wheel's own promises (`sut::lottery::wheel`'s
//! docs), checked after every call against a reference model (a sorted map of
//! `(due tick, higher priority first, insertion order)`):
//!
//! - a task never fires before its deadline, and a driver that sleeps until `poll_timeout`
//!   gets it less than one tick late; `poll_timeout` never sleeps past a waiting task;
//! - ready tasks come out in `(due tick, priority, insertion)` order, each attempt once, with
//!   its payload, deadline, priority and attempt number;
//! - a failure reschedules the task at exactly `now + min(cap, base * 2^(failures - 1))`
//!   while its budget lasts, then moves it to the dead letters (handle, payload, priority,
//!   attempts, time of failure), nothing lost and nothing invented;
//! - the edge states (a hand-out fired late or tied, a cancel, a retry, a dead letter, a
//!   success after a retry) counted exactly when they happen, so the coverage reports built on
//!   them do not lie;
//! - one `handle_timeout` that moved fewer tasks than its budget leaves no work due;
//! - one `handle_timeout` moves at most `work_max_per_call` tasks (no more become ready, no
//!   more leave the overflow list);
//! - capacity counts dead letters; errors name the misuse (`Unknown`, `NotInFlight`, `Full`,
//!   `DeadlineTooFar`) and change nothing;
//! - the wheel's clock never goes back and reaches the driver's time; `status` and `payload`
//!   agree with the model; `check_invariants` holds after every call;
//! - everything left waiting fires in the end.
//!
//! Deliberately wrong wheels (a wrapper firing a tick early, one retrying without backoff, one
//! swapping two ready tasks, one whose cancel forgets, one ignoring the work budget) show each
//! check firing; a coverage test
//! shows the driver reaching what the properties are about.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use sut::edge::{Edge, Observed as _};
use sut::lottery::wheel::{
    self, DeadLetter, FailOutcome, Fired, ScheduleError, TaskError, TaskHandle, TaskSpec,
    TaskStatus, TimingWheel, WheelConfig,
};

const CASES: u32 = 256;

/// Firing order: due tick, higher priority first, insertion order (renewed on each retry).
type Key = (u64, Reverse<u32>, u64);

// ---------------------------------------------------------------------------------------------
// The driver's steps.

#[derive(Clone, Copy, Debug)]
enum Op {
    /// A task at the driver's time plus `offset_ms` (in the past when negative).
    Schedule {
        offset_ms: i64,
        priority: u32,
        retries_max: u32,
    },
    /// A task in the last representable tick or beyond it.
    ScheduleAtEnd {
        past_ms: u64,
    },
    /// Cancel the `n`-th task ever scheduled (modulo), wherever it is.
    Cancel(usize),
    /// The clock moves ahead; drive to completion, then take every ready task.
    Drive(u64),
    /// Sleep until `poll_timeout`; drive; take every ready task.
    DriveToTimeout,
    /// The clock moves ahead; drive to completion but leave the ready tasks waiting.
    TimeoutOnly(u64),
    /// One `handle_timeout` with a stale time, `ms` before the driver's.
    Stale(u64),
    /// Take one ready task.
    PollOne,
    /// Report a failure of the `n`-th task in flight, or (`any`) of the `n`-th ever scheduled.
    Fail {
        n: usize,
        any: bool,
    },
    /// Report success of the `n`-th task ever scheduled.
    Succeed(usize),
    TakeDead,
}

fn op() -> impl Strategy<Value = Op> {
    let offset = prop_oneof![-60_i64..=0, 0_i64..40, 0_i64..3_000, 0_i64..3_000_000];
    let ahead = prop_oneof![0_u64..5, 0_u64..100, 0_u64..10_000, 0_u64..5_000_000];
    prop_oneof![
        6 => (offset, 0_u32..3, 0_u32..3).prop_map(|(offset_ms, priority, retries_max)| {
            Op::Schedule { offset_ms, priority, retries_max }
        }),
        1 => (0_u64..12).prop_map(|past_ms| Op::ScheduleAtEnd { past_ms }),
        1 => any::<usize>().prop_map(Op::Cancel),
        3 => ahead.clone().prop_map(Op::Drive),
        3 => Just(Op::DriveToTimeout),
        1 => ahead.prop_map(Op::TimeoutOnly),
        1 => (0_u64..100).prop_map(Op::Stale),
        2 => Just(Op::PollOne),
        3 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(n, any)| Op::Fail { n, any }),
        2 => any::<usize>().prop_map(Op::Succeed),
        1 => Just(Op::TakeDead),
    ]
}

fn config() -> impl Strategy<Value = WheelConfig> {
    (
        prop::sample::select(vec![1_u64, 3, 10]),
        prop::sample::select(vec![2_u32, 4, 20, 64]),
        1_u8..=3,
        prop::sample::select(vec![1_u32, 5, 1_000]),
        prop::sample::select(vec![6_u32, 64]),
        prop::sample::select(vec![1_u64, 7, 50]),
        prop::sample::select(vec![1_u64, 8]),
    )
        .prop_map(
            |(tick_ms, slots_per_level, levels, work_max_per_call, tasks_max, base, factor)| {
                WheelConfig {
                    tick_ms,
                    slots_per_level,
                    levels,
                    tasks_max,
                    work_max_per_call,
                    backoff_base_ms: base,
                    backoff_cap_ms: base * factor,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------
// The reference model.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Ready,
    InFlight,
}

#[derive(Clone, Debug)]
struct ModelTask {
    payload: u64,
    deadline_ms: u64,
    key: Key,
    failures: u32,
    retries_max: u32,
    state: State,
}

struct Model {
    cfg: WheelConfig,
    /// The driver's clock.
    now_ms: u64,
    /// The wheel's clock, in ticks: the furthest time it was driven to.
    wheel_tick: u64,
    seq_next: u64,
    waiting: BTreeMap<Key, TaskHandle>,
    ready: BTreeMap<Key, TaskHandle>,
    live: BTreeMap<TaskHandle, ModelTask>,
    dead: Vec<DeadLetter<u64>>,
}

impl Model {
    fn new(cfg: WheelConfig, start_ms: u64) -> Self {
        Self {
            cfg,
            now_ms: start_ms,
            wheel_tick: start_ms / cfg.tick_ms,
            seq_next: 0,
            waiting: BTreeMap::new(),
            ready: BTreeMap::new(),
            live: BTreeMap::new(),
            dead: Vec::new(),
        }
    }

    fn key(&mut self, deadline_ms: u64, priority: u32) -> Key {
        let seq = self.seq_next;
        self.seq_next += 1;
        (
            deadline_ms.div_ceil(self.cfg.tick_ms),
            Reverse(priority),
            seq,
        )
    }

    /// The wait before retry `failures`, written out independently of the wheel's.
    fn backoff_ms(&self, failures: u32) -> u64 {
        let mut ms = self.cfg.backoff_base_ms;
        for _ in 1..failures {
            ms = ms.saturating_mul(2).min(self.cfg.backoff_cap_ms);
        }
        ms.min(self.cfg.backoff_cap_ms)
    }

    fn deadline_max_ms(&self) -> u64 {
        u64::MAX / self.cfg.tick_ms * self.cfg.tick_ms
    }

    fn wheel_ms(&self) -> u64 {
        self.wheel_tick * self.cfg.tick_ms
    }

    /// Driven to completion at `now_ms`: everything due by then (or by the wheel's own, later
    /// time: a task scheduled in the past) becomes ready.
    fn drive(&mut self, now_ms: u64) {
        self.wheel_tick = self.wheel_tick.max(now_ms / self.cfg.tick_ms);
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > self.wheel_tick {
                break;
            }
            let (key, handle) = entry.remove_entry();
            self.live.get_mut(&handle).unwrap().state = State::Ready;
            self.ready.insert(key, handle);
        }
    }

    /// Waiting tasks in the overflow list: due beyond the top level's window, that is, a tick
    /// whose top-level slot is `slots` or more ahead of the wheel's (they migrate into the top
    /// level at the tick where it is `slots - 1` ahead).
    fn overflowing(&self) -> usize {
        let slots = u64::from(self.cfg.slots_per_level);
        let top = slots.pow(u32::from(self.cfg.levels - 1));
        let window = self.wheel_tick / top;
        self.waiting
            .keys()
            .filter(|key| {
                window
                    .checked_add(slots)
                    .is_some_and(|edge| key.0 / top >= edge)
            })
            .count()
    }

    fn first_due_ms(&self) -> Option<u64> {
        self.waiting
            .first_key_value()
            .map(|(key, _)| key.0 * self.cfg.tick_ms)
    }

    /// The tasks handed out and not yet reported on.
    fn in_flight(&self) -> Vec<TaskHandle> {
        self.live
            .iter()
            .filter(|(_, task)| task.state == State::InFlight)
            .map(|(handle, _)| *handle)
            .collect()
    }

    fn held(&self) -> usize {
        self.live.len() + self.dead.len()
    }

    fn status(&self, handle: TaskHandle) -> Option<TaskStatus> {
        self.live.get(&handle).map(|task| match task.state {
            State::Waiting => TaskStatus::Waiting,
            State::Ready => TaskStatus::Ready,
            State::InFlight => TaskStatus::InFlight,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The wheel under test, correct or deliberately wrong.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Correct,
    /// Every `handle_timeout` is handed a time one tick ahead: tasks fire a tick early.
    Early,
    /// A failed task is retried 1 ms after the failure, whatever the backoff.
    NoBackoff,
    /// The first two tasks ready are handed out in the wrong order.
    Swap,
    /// A cancel of a waiting task answers Ok but leaves it in the wheel.
    ForgetfulCancel,
    /// One `handle_timeout` does all the work due, whatever the budget.
    Unbounded,
    /// Every other `handle_timeout` does nothing (leaves its work due for the next call).
    Skipping,
}

struct Under {
    wheel: TimingWheel<u64>,
    variant: Variant,
    /// `Swap`: done once; the task held back.
    swapped: bool,
    stash: Option<Fired<u64>>,
    /// `Skipping`: the next call is skipped.
    skip: bool,
}

impl Under {
    fn handle_timeout(&mut self, now_ms: u64) {
        let tick_ms = self.wheel.config().tick_ms;
        let now_ms = match self.variant {
            Variant::Early => now_ms.saturating_add(tick_ms),
            _ => now_ms,
        };
        if self.variant == Variant::Skipping {
            self.skip = !self.skip;
            if self.skip {
                return;
            }
        }
        self.wheel.handle_timeout(now_ms);
        while self.variant == Variant::Unbounded
            && self
                .wheel
                .poll_timeout()
                .is_some_and(|at_ms| at_ms <= now_ms)
        {
            self.wheel.handle_timeout(now_ms);
        }
    }

    fn poll_ready(&mut self) -> Option<Fired<u64>> {
        if self.variant == Variant::Swap && !self.swapped && self.wheel.ready_len() >= 2 {
            self.swapped = true;
            let first = self.wheel.poll_ready()?;
            let second = self.wheel.poll_ready();
            // Hand the second out now; the first stays in flight and is handed out next.
            if let Some(second) = second {
                self.stash = Some(first);
                return Some(second);
            }
            return Some(first);
        }
        if let Some(first) = self.stash.take() {
            return Some(first);
        }
        self.wheel.poll_ready()
    }

    fn handle_failed(&mut self, handle: TaskHandle, now_ms: u64) -> Result<FailOutcome, TaskError> {
        match self.variant {
            Variant::NoBackoff => {
                let base = self.wheel.config().backoff_base_ms;
                self.wheel
                    .handle_failed(handle, (now_ms + 1).saturating_sub(base))
            }
            _ => self.wheel.handle_failed(handle, now_ms),
        }
    }

    fn cancel(&mut self, handle: TaskHandle) -> Result<u64, TaskError> {
        if self.variant == Variant::ForgetfulCancel
            && self.wheel.status(handle) == Some(TaskStatus::Waiting)
        {
            return self
                .wheel
                .payload(handle)
                .copied()
                .ok_or(TaskError::Unknown { handle });
        }
        self.wheel.cancel(handle)
    }
}

// ---------------------------------------------------------------------------------------------
// The bench: every call on the wheel and the model side by side.

/// Rare situations met, for the coverage test.
type Coverage = BTreeMap<&'static str, u64>;

struct Bench {
    under: Under,
    model: Model,
    /// Every handle ever returned by `schedule`, in order.
    known: Vec<TaskHandle>,
    fired_once: BTreeSet<(TaskHandle, u32)>,
    coverage: Coverage,
    /// The wheel's edge states reached (`sut::edge`), as counted by the wheel.
    edges: BTreeMap<String, u64>,
}

impl Bench {
    fn new(cfg: WheelConfig, start_ms: u64, variant: Variant) -> Self {
        Self {
            under: Under {
                wheel: TimingWheel::new(cfg, start_ms).unwrap(),
                variant,
                swapped: false,
                stash: None,
                skip: false,
            },
            model: Model::new(cfg, start_ms),
            known: Vec::new(),
            fired_once: BTreeSet::new(),
            coverage: Coverage::new(),
            edges: BTreeMap::new(),
        }
    }

    /// Moves the wheel's arrivals at edge states since the last call into `self.edges`, and
    /// returns them.
    fn take_edges(&mut self) -> BTreeMap<String, u64> {
        let arrived = self.under.wheel.edges();
        for (name, n) in &arrived {
            *self.edges.entry(name.clone()).or_insert(0) += n;
        }
        arrived
    }

    fn cover(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_insert(0) += 1;
    }

    fn nth_known(&self, n: usize) -> Option<TaskHandle> {
        self.known.get(n % self.known.len().max(1)).copied()
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Schedule {
                offset_ms,
                priority,
                retries_max,
            } => {
                let deadline_ms = self.model.now_ms.saturating_add_signed(offset_ms);
                self.schedule(deadline_ms, priority, retries_max)?;
            }
            Op::ScheduleAtEnd { past_ms } => self.schedule(u64::MAX - past_ms, 0, 0)?,
            Op::Cancel(n) => self.cancel(n)?,
            Op::Drive(ms) => {
                let previous_ms = self.model.now_ms;
                self.drive(previous_ms.saturating_add(ms))?;
                self.poll_all(previous_ms, false)?;
            }
            Op::DriveToTimeout => {
                let previous_ms = self.model.now_ms;
                let wake_ms = self.under.wheel.poll_timeout().unwrap_or(previous_ms);
                self.drive(wake_ms.max(previous_ms))?;
                self.poll_all(previous_ms, true)?;
            }
            Op::TimeoutOnly(ms) => self.drive(self.model.now_ms.saturating_add(ms))?,
            Op::Stale(ms) => self.stale(ms)?,
            Op::PollOne => {
                self.poll_one(None)?;
            }
            Op::Fail { n, any } => self.fail(n, any)?,
            Op::Succeed(n) => self.succeed(n)?,
            Op::TakeDead => {
                let taken = self.under.wheel.take_dead_letters();
                let expected = std::mem::take(&mut self.model.dead);
                if taken != expected {
                    return Err(format!(
                        "dead letters taken {taken:?}, the model's {expected:?}"
                    ));
                }
            }
        }
        self.take_edges();
        self.agree()
    }

    fn schedule(
        &mut self,
        deadline_ms: u64,
        priority: u32,
        retries_max: u32,
    ) -> Result<(), String> {
        let payload = self.known.len() as u64;
        let spec = TaskSpec::new(deadline_ms, payload)
            .with_priority(priority)
            .with_retries_max(retries_max);
        let result = self.under.wheel.schedule(spec);
        let max_ms = self.model.deadline_max_ms();
        let expected = if deadline_ms > max_ms {
            self.cover("deadline too far");
            Err(ScheduleError::DeadlineTooFar {
                deadline_ms,
                max_ms,
            })
        } else if self.model.held() >= self.model.cfg.tasks_max as usize {
            self.cover("full");
            Err(ScheduleError::Full {
                tasks_max: self.model.cfg.tasks_max,
            })
        } else {
            let Ok(handle) = result else {
                return Err(format!("schedule at {deadline_ms} ms refused: {result:?}"));
            };
            if handle.id() != self.known.len() as u64 {
                return Err(format!(
                    "task handle id {} for the task scheduled {}-th",
                    handle.id(),
                    self.known.len()
                ));
            }
            if !self.model.ready.is_empty() {
                self.cover("scheduled while tasks wait in the ready queue");
            }
            let key = self.model.key(deadline_ms, priority);
            self.model.waiting.insert(key, handle);
            let task = ModelTask {
                payload,
                deadline_ms,
                key,
                failures: 0,
                retries_max,
                state: State::Waiting,
            };
            self.model.live.insert(handle, task);
            self.known.push(handle);
            Ok(handle)
        };
        if result != expected {
            return Err(format!(
                "schedule at {deadline_ms} ms answered {result:?}, expected {expected:?}"
            ));
        }
        Ok(())
    }

    fn cancel(&mut self, n: usize) -> Result<(), String> {
        let Some(handle) = self.nth_known(n) else {
            return Ok(());
        };
        self.take_edges();
        let result = self.under.cancel(handle);
        let arrived = self.take_edges();
        let waiting = self
            .model
            .live
            .get(&handle)
            .is_some_and(|task| task.state != State::InFlight);
        counted_exactly(
            &arrived,
            &[(wheel::CANCELLED_WAITING, waiting)],
            &format!("the cancel of {handle:?}"),
        )?;
        let expected = match self.model.live.remove(&handle) {
            Some(task) => {
                match task.state {
                    State::Waiting => {
                        self.model.waiting.remove(&task.key);
                        self.cover("cancelled waiting");
                    }
                    State::Ready => {
                        self.model.ready.remove(&task.key);
                        self.cover("cancelled ready");
                    }
                    State::InFlight => self.cover("cancelled in flight"),
                }
                Ok(task.payload)
            }
            None => Err(TaskError::Unknown { handle }),
        };
        if result != expected {
            return Err(format!(
                "cancel of {handle:?} answered {result:?}, expected {expected:?}"
            ));
        }
        Ok(())
    }

    /// Drives to completion at `now_ms`, as a driver that calls again while `poll_timeout` is
    /// not after its time.
    fn drive(&mut self, now_ms: u64) -> Result<(), String> {
        if !self.model.ready.is_empty() {
            self.cover("ready tasks left across a drive");
        }
        self.model.now_ms = now_ms;
        let mut calls = 0_u32;
        loop {
            calls += 1;
            if calls > 100_000 {
                return Err(format!("handle_timeout({now_ms}) makes no progress"));
            }
            self.bounded_timeout(now_ms)?;
            self.under
                .wheel
                .check_invariants()
                .map_err(|e| format!("invariant: {e}"))?;
            match self.under.wheel.poll_timeout() {
                Some(at_ms) if at_ms <= now_ms => {}
                _ => break,
            }
        }
        if calls > 1 {
            self.cover("driven past the work budget");
        }
        self.model.drive(now_ms);
        Ok(())
    }

    /// One `handle_timeout`, which moves at most `work_max_per_call` tasks: no more become
    /// ready, and no more leave the overflow list; and one that moved fewer than that left no
    /// work due (the budget is the only reason to call again).
    fn bounded_timeout(&mut self, now_ms: u64) -> Result<(), String> {
        let wheel = &self.under.wheel;
        let (ready, overflow) = (wheel.ready_len(), wheel.overflow_len());
        self.take_edges();
        self.under.handle_timeout(now_ms);
        let cascaded = self.take_edges().get(wheel::CASCADED.name).copied();
        let wheel = &self.under.wheel;
        let made_ready = wheel.ready_len().saturating_sub(ready);
        let migrated = overflow.saturating_sub(wheel.overflow_len());
        let budget = self.model.cfg.work_max_per_call as usize;
        if made_ready > budget || migrated > budget {
            return Err(format!(
                "handle_timeout({now_ms}) made {made_ready} tasks ready and moved {migrated} out \
                 of the overflow list; work_max_per_call is {budget}"
            ));
        }
        // Each task moved counts once at least (one made ready by a migration counts twice).
        let moved = made_ready + migrated + usize::try_from(cascaded.unwrap_or(0)).unwrap();
        match wheel.poll_timeout() {
            Some(due_ms) if moved < budget && due_ms <= now_ms => Err(format!(
                "handle_timeout({now_ms}) moved {moved} tasks of a budget of {budget} and left \
                 work due at {due_ms} ms"
            )),
            _ => Ok(()),
        }
    }

    /// One `handle_timeout` with a time before the driver's: no clock moves back; only tasks
    /// already due (scheduled or retried into the past) may become ready, some or all of them
    /// (the work budget).
    fn stale(&mut self, ms: u64) -> Result<(), String> {
        let stale_ms = self.model.now_ms.saturating_sub(ms);
        self.bounded_timeout(stale_ms)?;
        let waiting: Vec<(Key, TaskHandle)> =
            self.model.waiting.iter().map(|(k, h)| (*k, *h)).collect();
        for (key, handle) in waiting {
            if self.under.wheel.status(handle) != Some(TaskStatus::Ready) {
                continue;
            }
            if key.0 > self.model.wheel_tick {
                return Err(format!(
                    "{handle:?} made ready by a stale handle_timeout({stale_ms}) before its due \
                     tick {}",
                    key.0
                ));
            }
            self.cover("a stale time readied an overdue task");
            self.model.waiting.remove(&key);
            self.model.ready.insert(key, handle);
            self.model.live.get_mut(&handle).unwrap().state = State::Ready;
        }
        Ok(())
    }

    /// Takes every ready task; `previous_ms` is the driver's time before the drive, `sleeping`
    /// whether it slept until `poll_timeout`.
    fn poll_all(&mut self, previous_ms: u64, sleeping: bool) -> Result<(), String> {
        let mut fired: Vec<Fired<u64>> = Vec::new();
        while !self.model.ready.is_empty() {
            let f = self.poll_one(Some((previous_ms, sleeping)))?;
            fired.extend(f);
        }
        self.poll_one(None)?;
        for pair in fired.windows(2) {
            let tick_ms = self.model.cfg.tick_ms;
            let same_tick =
                pair[0].deadline_ms.div_ceil(tick_ms) == pair[1].deadline_ms.div_ceil(tick_ms);
            if same_tick && pair[0].priority > pair[1].priority {
                self.cover("same-tick priority order");
            }
        }
        Ok(())
    }

    /// One `poll_ready`, compared with the model's next ready task.
    fn poll_one(&mut self, drive: Option<(u64, bool)>) -> Result<Option<Fired<u64>>, String> {
        self.take_edges();
        let polled = self.under.poll_ready();
        let arrived = self.take_edges();
        let expected = self.model.ready.pop_first();
        let (f, key, handle) = match (polled, expected) {
            (None, None) => return Ok(None),
            (Some(f), None) => {
                return Err(format!("handed out {f:?}, the model has no task ready"));
            }
            (None, Some((_, handle))) => {
                return Err(format!(
                    "nothing handed out, the model's {handle:?} is ready"
                ));
            }
            (Some(f), Some((key, handle))) => (f, key, handle),
        };
        if f.handle != handle {
            return Err(format!(
                "handed out {f:?}, the model's next ready task is {handle:?}"
            ));
        }
        // The edge states a hand-out reaches, counted exactly: a task handed out after its due
        // tick (late), and one handed out while another of its tick is still ready (a tie).
        let late = key.0 < self.model.wheel_tick;
        let tie = self
            .model
            .ready
            .first_key_value()
            .is_some_and(|(next, _)| next.0 == key.0);
        counted_exactly(
            &arrived,
            &[(wheel::FIRED_LATE, late), (wheel::SAME_TICK_TIE, tie)],
            &format!("the hand-out of {handle:?}"),
        )?;
        let wheel_ms = self.model.wheel_ms();
        let tick_ms = self.model.cfg.tick_ms;
        let task = self.model.live.get_mut(&handle).unwrap();
        let want = (task.payload, task.deadline_ms, task.key.1.0, task.failures);
        if (f.payload, f.deadline_ms, f.priority, f.attempt) != want {
            return Err(format!(
                "handed out {f:?}: payload, deadline, priority and attempt should be {want:?}"
            ));
        }
        if f.deadline_ms > wheel_ms {
            return Err(format!("fired early: {f:?} at {wheel_ms} ms"));
        }
        task.state = State::InFlight;
        if let Some((previous_ms, true)) = drive
            && f.deadline_ms > previous_ms
        {
            if wheel_ms - f.deadline_ms >= tick_ms {
                return Err(format!(
                    "fired a tick or more late to a driver sleeping until poll_timeout: {f:?} \
                     at {wheel_ms} ms"
                ));
            }
            self.cover("fired to a sleeping driver");
        }
        if !self.fired_once.insert((f.handle, f.attempt)) {
            return Err(format!("attempt fired twice: {f:?}"));
        }
        if f.attempt > 0 {
            self.cover("retry fired");
        }
        Ok(Some(f))
    }

    fn fail(&mut self, n: usize, any: bool) -> Result<(), String> {
        let handle = if any {
            self.nth_known(n)
        } else {
            let in_flight = self.model.in_flight();
            in_flight.get(n % in_flight.len().max(1)).copied()
        };
        let Some(handle) = handle else {
            return Ok(());
        };
        let now_ms = self.model.now_ms;
        self.take_edges();
        let result = self.under.handle_failed(handle, now_ms);
        let arrived = self.take_edges();
        let expected = match self.model.live.get(&handle).map(|task| task.state) {
            None => {
                self.cover("unknown handle");
                Err(TaskError::Unknown { handle })
            }
            Some(State::Waiting | State::Ready) => {
                self.cover("outcome of a task not in flight");
                Err(TaskError::NotInFlight { handle })
            }
            Some(State::InFlight) => Ok(self.model_failed(handle, now_ms)),
        };
        let retried = matches!(expected, Ok(FailOutcome::Retrying { .. }));
        let dead = matches!(expected, Ok(FailOutcome::DeadLettered));
        counted_exactly(
            &arrived,
            &[
                (wheel::RETRY_BACKOFF, retried),
                (wheel::DEAD_LETTERED, dead),
            ],
            &format!("the failure of {handle:?}"),
        )?;
        if result != expected {
            return Err(format!(
                "failure of {handle:?} at {now_ms} ms answered {result:?}, expected {expected:?}"
            ));
        }
        Ok(())
    }

    /// The model's side of a failure of an in-flight task.
    fn model_failed(&mut self, handle: TaskHandle, now_ms: u64) -> FailOutcome {
        let mut task = self.model.live.remove(&handle).unwrap();
        task.failures += 1;
        if task.failures > task.retries_max {
            self.cover("dead-lettered");
            self.model.dead.push(DeadLetter {
                handle,
                payload: task.payload,
                priority: task.key.1.0,
                attempts: task.failures,
                failed_at_ms: now_ms,
            });
            return FailOutcome::DeadLettered;
        }
        let deadline_ms = now_ms
            .saturating_add(self.model.backoff_ms(task.failures))
            .min(self.model.deadline_max_ms());
        task.key = self.model.key(deadline_ms, task.key.1.0);
        task.deadline_ms = deadline_ms;
        task.state = State::Waiting;
        self.model.waiting.insert(task.key, handle);
        let attempt = task.failures;
        self.model.live.insert(handle, task);
        FailOutcome::Retrying {
            deadline_ms,
            attempt,
        }
    }

    fn succeed(&mut self, n: usize) -> Result<(), String> {
        let Some(handle) = self.nth_known(n) else {
            return Ok(());
        };
        self.take_edges();
        let result = self.under.wheel.handle_succeeded(handle);
        let arrived = self.take_edges();
        let after_retry = self
            .model
            .live
            .get(&handle)
            .is_some_and(|t| t.state == State::InFlight && t.failures > 0);
        counted_exactly(
            &arrived,
            &[(wheel::SUCCEEDED_AFTER_RETRY, after_retry)],
            &format!("the success of {handle:?}"),
        )?;
        let expected = match self.model.live.get(&handle).map(|t| (t.state, t.payload)) {
            None => {
                self.cover("unknown handle");
                Err(TaskError::Unknown { handle })
            }
            Some((State::Waiting | State::Ready, _)) => {
                self.cover("outcome of a task not in flight");
                Err(TaskError::NotInFlight { handle })
            }
            Some((State::InFlight, payload)) => {
                self.model.live.remove(&handle);
                Ok(payload)
            }
        };
        if result != expected {
            return Err(format!(
                "success of {handle:?} answered {result:?}, expected {expected:?}"
            ));
        }
        Ok(())
    }

    /// After every call: the wheel's state, as seen from outside, is the model's.
    fn agree(&mut self) -> Result<(), String> {
        let wheel = &self.under.wheel;
        wheel
            .check_invariants()
            .map_err(|e| format!("invariant: {e}"))?;
        let model = &self.model;
        if wheel.current_ms() != model.wheel_ms() {
            return Err(format!(
                "the wheel's clock reads {} ms, driven to {} ms",
                wheel.current_ms(),
                model.wheel_ms()
            ));
        }
        match (wheel.poll_timeout(), model.first_due_ms()) {
            (Some(wake_ms), Some(due_ms)) if wake_ms <= due_ms.max(model.wheel_ms()) => {}
            (None, None) => {}
            (wake, due) => {
                return Err(format!(
                    "poll_timeout {wake:?} ms, but the first waiting task is due at {due:?} ms"
                ));
            }
        }
        let counts = (wheel.len() as usize, wheel.ready_len());
        if counts != (model.live.len(), model.ready.len()) {
            return Err(format!(
                "the wheel holds {} tasks, {} ready; the model {}, {}",
                counts.0,
                counts.1,
                model.live.len(),
                model.ready.len()
            ));
        }
        if wheel.is_empty() != model.live.is_empty() {
            return Err(format!(
                "is_empty() {} with {} tasks held",
                wheel.is_empty(),
                model.live.len()
            ));
        }
        let overflow = model.overflowing();
        if wheel.overflow_len() != overflow {
            return Err(format!(
                "overflow_len() {}, but {overflow} waiting tasks lie beyond the top level",
                wheel.overflow_len()
            ));
        }
        if wheel.dead_letters() != model.dead.as_slice() {
            return Err(format!(
                "dead letters {:?}, the model's {:?}",
                wheel.dead_letters(),
                model.dead
            ));
        }
        for &handle in &self.known {
            let (status, want) = (wheel.status(handle), model.status(handle));
            let payload = wheel.payload(handle).copied();
            let want_payload = model.live.get(&handle).map(|t| t.payload);
            if status != want || payload != want_payload {
                return Err(format!(
                    "{handle:?}: status {status:?} payload {payload:?}, the model's {want:?} \
                     {want_payload:?}"
                ));
            }
        }
        if wheel.overflow_len() > 0 {
            self.cover("overflow list used");
        }
        Ok(())
    }

    /// Liveness: settle everything in flight, then drive to the end of time: all that waits
    /// fires, and the wheel then asks for no wakeup.
    fn settle(&mut self) -> Result<(), String> {
        let in_flight = self.model.in_flight();
        for handle in in_flight {
            self.under
                .wheel
                .handle_succeeded(handle)
                .map_err(|e| format!("settling {handle:?}: {e}"))?;
            self.model.live.remove(&handle);
        }
        self.step(&Op::Drive(u64::MAX))?;
        if !self.model.waiting.is_empty() || self.under.wheel.poll_timeout().is_some() {
            return Err(format!(
                "at the end of time, {} tasks still wait (poll_timeout {:?})",
                self.model.waiting.len(),
                self.under.wheel.poll_timeout()
            ));
        }
        Ok(())
    }
}

fn run_bench(
    cfg: WheelConfig,
    start_ms: u64,
    variant: Variant,
    ops: &[Op],
) -> Result<Bench, String> {
    let mut bench = Bench::new(cfg, start_ms, variant);
    for (i, op) in ops.iter().enumerate() {
        bench
            .step(op)
            .map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    bench.settle().map_err(|e| format!("settling: {e}"))?;
    Ok(bench)
}

fn fixed(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x3_1ee1),
        failure_persistence: None,
        ..Config::default()
    }
}

fn case() -> impl Strategy<Value = (WheelConfig, u64, Vec<Op>)> {
    (
        config(),
        prop_oneof![Just(0_u64), 0_u64..1_000_000],
        prop::collection::vec(op(), 1..120),
    )
}

/// The edge states one call reached, counted exactly: each edge of `edges` once if its flag
/// says the call reached it, otherwise not at all (a coverage report must not count an edge
/// that never happened, nor miss one that did).
fn counted_exactly(
    arrived: &BTreeMap<String, u64>,
    edges: &[(Edge, bool)],
    call: &str,
) -> Result<(), String> {
    for (edge, want) in edges {
        let got = arrived.get(edge.name).copied().unwrap_or(0);
        if got != u64::from(*want) {
            return Err(format!(
                "edge {}: counted {got} for {call}, it was {}reached",
                edge.name,
                if *want { "" } else { "not " }
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(fixed(CASES))]

    #[test]
    fn the_wheel_keeps_its_promises_whatever_the_driver_does(
        (cfg, start_ms, ops) in case(),
    ) {
        let result = run_bench(cfg, start_ms, Variant::Correct, &ops).map(|_| ());
        prop_assert_eq!(result, Ok(()));
    }
}

#[test]
fn the_hostile_driver_reaches_every_rare_situation() {
    let mut runner = TestRunner::new(fixed(CASES));
    let strategy = case();
    let mut seen = Coverage::new();
    let mut edges: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..CASES {
        let (cfg, start_ms, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let bench =
            run_bench(cfg, start_ms, Variant::Correct, &ops).unwrap_or_else(|e| panic!("{e}"));
        for (what, n) in bench.coverage {
            *seen.entry(what).or_insert(0) += n;
        }
        for (edge, n) in bench.edges {
            *edges.entry(edge).or_insert(0) += n;
        }
    }
    for want in [
        "overflow list used",
        "dead-lettered",
        "full",
        "deadline too far",
        "retry fired",
        "driven past the work budget",
        "fired to a sleeping driver",
        "cancelled waiting",
        "cancelled ready",
        "cancelled in flight",
        "same-tick priority order",
        "a stale time readied an overdue task",
        "outcome of a task not in flight",
        "unknown handle",
        "scheduled while tasks wait in the ready queue",
        "ready tasks left across a drive",
    ] {
        assert!(seen.contains_key(want), "never reached: {want} ({seen:?})");
    }
    for edge in wheel::EDGES {
        assert!(
            edges.contains_key(edge.name),
            "edge never reached: {} ({edges:?})",
            edge.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Firing: each check catches a broken wheel.

#[test]
fn random_driving_finds_each_broken_wheel() {
    for (variant, symptom) in [
        (Variant::Early, "clock reads"),
        (Variant::NoBackoff, "expected Ok(Retrying"),
        (Variant::Swap, "the model's next ready task is"),
        (
            Variant::ForgetfulCancel,
            "edge wheel.cancelled_waiting: counted 0",
        ),
        (Variant::Unbounded, "work_max_per_call is"),
        (Variant::Skipping, "and left work due"),
    ] {
        let mut runner = TestRunner::new(fixed(CASES));
        let strategy = case();
        let found = (0..CASES).find_map(|_| {
            let (cfg, start_ms, ops) = strategy.new_tree(&mut runner).unwrap().current();
            run_bench(cfg, start_ms, variant, &ops).err()
        });
        let e = found.unwrap_or_else(|| panic!("{variant:?} never caught"));
        assert!(e.contains(symptom), "{variant:?}: {e}");
    }
}

#[test]
fn a_retry_comes_back_after_exactly_its_backoff_and_a_spent_budget_is_a_dead_letter() {
    let cfg = WheelConfig {
        tick_ms: 1,
        backoff_base_ms: 10,
        backoff_cap_ms: 25,
        ..WheelConfig::default()
    };
    let ops = [
        Op::Schedule {
            offset_ms: 5,
            priority: 0,
            retries_max: 3,
        },
        Op::Drive(5),
        Op::Fail { n: 0, any: false },
        Op::Drive(9),
        Op::Drive(1),
        Op::Fail { n: 0, any: false },
        Op::Drive(19),
        Op::Drive(1),
        Op::Fail { n: 0, any: false },
        Op::Drive(25),
        Op::Fail { n: 0, any: false },
        Op::TakeDead,
    ];
    let bench = run_bench(cfg, 0, Variant::Correct, &ops).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bench.coverage.get("retry fired"), Some(&3));
    assert_eq!(bench.coverage.get("dead-lettered"), Some(&1));
    let Err(e) = run_bench(cfg, 0, Variant::NoBackoff, &ops) else {
        panic!("a wheel retrying without backoff passed");
    };
    assert!(
        e.contains("step 2") && e.contains("expected Ok(Retrying { deadline_ms: 15, attempt: 1 })"),
        "{e}"
    );
}

/// Found by this suite: with one-tick levels, the overflow migration of a task due in the last
/// representable tick computed `v + 1 - slots` and overflowed (a panic in debug builds).
#[test]
fn a_task_due_in_the_last_representable_tick_fires() {
    let cfg = WheelConfig {
        tick_ms: 1,
        slots_per_level: 2,
        levels: 1,
        ..WheelConfig::default()
    };
    let ops = [Op::ScheduleAtEnd { past_ms: 0 }, Op::Drive(u64::MAX)];
    let bench = run_bench(cfg, 0, Variant::Correct, &ops).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bench.known.len(), 1);
    assert!(bench.fired_once.contains(&(bench.known[0], 0)));
}

proptest! {
    #![proptest_config(fixed(CASES))]

    /// The budget an operator (or BUGGIFY) sizes from `retries_to_outlast(horizon)`: the
    /// fewest retries whose backoffs add up to the horizon, so that a task failing from its
    /// first run on still has a retry left once the horizon has passed.
    #[test]
    fn the_retries_to_outlast_a_horizon_are_the_fewest_whose_backoffs_cover_it(
        base in 1_u64..200,
        factor in 1_u64..50,
        random_ms in 0_u64..200_000,
        exactly_after in prop::option::of(0_u32..12),
    ) {
        let cfg = WheelConfig {
            backoff_base_ms: base,
            backoff_cap_ms: base * factor,
            ..WheelConfig::default()
        };
        let waited = |n: u32| (1..=n).map(|f| cfg.backoff_ms(f)).sum::<u64>();
        // Half the horizons are exactly what some number of retries waits (0 among them): the
        // boundary where one retry more or less is wrong.
        let horizon_ms = exactly_after.map_or(random_ms, waited);
        let retries = cfg.retries_to_outlast(horizon_ms);
        prop_assert!(waited(retries) >= horizon_ms, "{} retries wait {} ms", retries, waited(retries));
        prop_assert!(
            retries == 0 || waited(retries - 1) < horizon_ms,
            "{} retries, but {} already wait {} ms", retries, retries - 1, waited(retries - 1)
        );
    }
}
