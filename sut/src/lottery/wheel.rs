//! The compensation scheduler of the ID, token and lottery design §4.4 (docs/sources.md): a
//! hierarchical timing wheel with priorities and per-task retry budgets, sans-IO.
//!
//! # What it is for
//!
//! TCC compensation (Cancel/Confirm retries) must run at a given time, again and again with
//! backoff while it fails, until it succeeds or a budget runs out, and never be lost. The design
//! asks for a timing wheel (O(1) insert and expiry detection) combined with a priority queue so
//! that urgent tasks due in the same tick run first. This module is that scheduler as a
//! deterministic state machine: it never reads a clock, never sleeps, never spawns.
//!
//! # Anchors and how this follows (and departs from) them
//!
//! - **Kafka's `TimingWheel`** (`kafka.utils.timer`; docs/sources.md, "Anchors"): tick 1 ms,
//!   20 slots per level; a task that does not fit the range of a level (`tick * slots`) goes to
//!   the next, coarser level whose tick is the whole range of the one below, so level `k` has a
//!   slot span of `tick * slots^k` and covers `tick * slots^(k+1)`. Each slot is a doubly linked
//!   list (O(1) insert and cancel). When a coarse bucket expires, its tasks are re-inserted and
//!   *cascade* down into finer levels. Kafka keeps the non-empty buckets in a `DelayQueue` so
//!   that idle time costs nothing; here the same role is played by `expiries`, an ordered set of
//!   the non-empty buckets keyed by their expiry tick (at most `levels * slots` entries, so its
//!   O(log) is bounded by the configuration, not by the number of tasks). The driver sleeps
//!   until [`TimingWheel::poll_timeout`], which is the first entry of that set.
//! - **Netty's `HashedWheelTimer`**: a single level whose slots carry a "remaining rounds"
//!   counter, ticked by a worker thread every tick whether or not anything is due, and late by
//!   up to one tick. The design's own sketch (`slot = (triggerTime / tickMs) % wheelSize`, 64
//!   slots of 100 ms) is that single-level design without the rounds counter: a task 6.4 s
//!   ahead would alias into a slot that fires now. Here nothing is ticked while idle (a jump of
//!   hours visits only non-empty buckets), and aliasing is impossible: the invariant checker
//!   proves every bucket holds tasks of one virtual slot only.
//!
//! # Semantics
//!
//! - Time is `u64` milliseconds from a monotonic source (drivers pass `Now::mono_ms` from
//!   [`crate::clock::Now`]). A task with deadline `d` is due at tick `D = ceil(d / tick_ms)` and
//!   becomes ready at the first [`TimingWheel::handle_timeout`] whose `now_ms >= D * tick_ms`.
//!   So a task **never fires before its deadline** and, for a driver that wakes at
//!   `poll_timeout`, **fires less than one tick late** (`D * tick_ms - d < tick_ms`). Kafka fires
//!   a bucket at its start, i.e. up to one tick *early*; this wheel rounds up instead.
//! - **Priority**: ready tasks are handed out by [`TimingWheel::poll_ready`] in the order
//!   `(due tick, higher priority first, insertion order)`. Priority therefore orders tasks due
//!   in the same tick; a late driver still gets older ticks first (earliest deadline first).
//!   The design's per-slot heap is replaced by one ordered ready queue: the priority order only
//!   matters once tasks are due.
//! - Tasks scheduled in the past (or in the current tick) fire at the next `handle_timeout`
//!   (`poll_timeout` then returns the wheel's current time, which is `<=` any `now`).
//! - Tasks beyond the top level's range wait in an ordered **overflow** list (O(log n) insert,
//!   far-future tasks only) and move into the wheel when the top level reaches them. Nothing is
//!   dropped; the only refused deadlines are those within one tick of `u64::MAX` ms, whose due
//!   instant cannot be represented ([`ScheduleError::DeadlineTooFar`]).
//! - **Retries**: after `poll_ready`, a task is *in flight* until the driver reports
//!   [`TimingWheel::handle_succeeded`] (removed) or [`TimingWheel::handle_failed`]: the task is
//!   rescheduled at `now + min(backoff_cap_ms, backoff_base_ms * 2^(failures - 1))` while
//!   `failures <= retries_max`, and otherwise moved to the visible dead-letter list
//!   ([`TimingWheel::dead_letters`], [`TimingWheel::take_dead_letters`]). A retry counts as a
//!   new insertion for tie-breaking.
//! - **Bounds**: at most `tasks_max` tasks are held, *including* dead letters, so moving a task
//!   to the dead-letter list can never overflow and a full dead-letter list pushes back on
//!   [`TimingWheel::schedule`] ([`ScheduleError::Full`]) instead of dropping anything. One
//!   `handle_timeout` call moves at most `work_max_per_call` tasks; if it stops early,
//!   `poll_timeout` returns a time `<= now` and the driver simply calls again (quinn's
//!   `drive_bounded` habit). Each task cascades at most once per level.
//!
//! # Costs
//!
//! `schedule`: O(levels) plus, when a bucket becomes non-empty, O(log(levels * slots)); overflow
//! tasks O(log n). `cancel`: O(1) unlink (plus the same bounded set update; overflow and ready
//! tasks O(log n)). `poll_ready`: O(log ready). `handle_timeout`: O(tasks moved), never
//! O(elapsed ticks).
//!
//! # Driver loop
//!
//! ```
//! use sut::lottery::wheel::{TaskSpec, TimingWheel, WheelConfig};
//! let mut wheel = TimingWheel::new(WheelConfig::default(), 0).unwrap();
//! let handle = wheel.schedule(TaskSpec::new(25, "cancel branch 7").with_retries_max(2)).unwrap();
//! // Sleep until the timeout, then hand the time in and drain what is ready.
//! let wake_ms = wheel.poll_timeout().unwrap();
//! assert_eq!(wake_ms, 25);
//! wheel.handle_timeout(wake_ms);
//! let fired = wheel.poll_ready().unwrap();
//! assert_eq!(fired.handle, handle);
//! let _payload = wheel.handle_succeeded(fired.handle).unwrap();
//! assert!(wheel.is_empty());
//! ```
//!
//! All state derives `Clone, Debug, PartialEq, Eq, Hash` (where `T` does) and uses only ordered
//! collections and a slab, so two runs with the same inputs are identical.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use crate::edge::{Edge, Edges, Machine, Observed};

/// A task handed out a tick or more after its due tick.
pub const FIRED_LATE: Edge = Edge::new(
    Machine::Wheel,
    "wheel.fired_late",
    "a task is handed out one tick or more after it was due (the driver woke late: a pause, a \
     coarse timer; or it was scheduled in the past): it must still fire, once, in deadline \
     order, never be skipped",
);
/// A task moved from a coarse level down to a finer one.
pub const CASCADED: Edge = Edge::new(
    Machine::Wheel,
    "wheel.cascaded",
    "a coarse bucket expires and its task is re-inserted into a finer level: it must land in \
     the slot of its own due tick (no aliasing) and neither fire early nor be lost",
);
/// A task cancelled before it ran.
pub const CANCELLED_WAITING: Edge = Edge::new(
    Machine::Wheel,
    "wheel.cancelled_waiting",
    "a task is cancelled while waiting or ready (a parked draw completed by a late \
     acknowledgement): it must leave its bucket or the ready queue and never fire",
);
/// Two tasks ready in the same tick.
pub const SAME_TICK_TIE: Edge = Edge::new(
    Machine::Wheel,
    "wheel.same_tick_tie",
    "a task is handed out while another task due in the same tick is still ready: the tie is \
     broken by priority (a Cancel round before a Confirm round), then insertion order",
);
/// A failed task rescheduled with backoff.
pub const RETRY_BACKOFF: Edge = Edge::new(
    Machine::Wheel,
    "wheel.retry_backoff",
    "an in-flight task fails and is rescheduled with exponential backoff: it must come back at \
     its new deadline with the failure counted against its retry budget",
);
/// A task that failed before succeeds.
pub const SUCCEEDED_AFTER_RETRY: Edge = Edge::new(
    Machine::Wheel,
    "wheel.succeeded_after_retry",
    "a task that failed at least once succeeds on a retry: it must be removed exactly once, \
     with no retry of it left scheduled",
);
/// A task's retry budget ran out.
pub const DEAD_LETTERED: Edge = Edge::new(
    Machine::Wheel,
    "wheel.dead_lettered",
    "a task fails with its retry budget spent: it must move to the visible dead-letter list, \
     still counted against capacity, never be dropped",
);

/// This machine's edge states (see [`crate::edge`]).
pub const EDGES: &[Edge] = &[
    FIRED_LATE,
    CASCADED,
    CANCELLED_WAITING,
    SAME_TICK_TIE,
    RETRY_BACKOFF,
    SUCCEEDED_AFTER_RETRY,
    DEAD_LETTERED,
];

/// "No task" in the intrusive lists.
const NIL: u32 = u32::MAX;

/// Largest slot count per level (keeps the bucket array bounded: `levels * slots`).
pub const SLOTS_PER_LEVEL_MAX: u32 = 1 << 16;

/// Largest `tasks_max` (task indices are `u32`, one value is reserved for "none").
pub const TASKS_MAX_LIMIT: u32 = 1 << 30;

/// Configuration of a [`TimingWheel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct WheelConfig {
    /// Length of one tick of the finest level, in ms. Firing is late by less than one tick.
    pub tick_ms: u64,
    /// Slots per level (Kafka: 20; the ID, token and lottery design: 64). At least 2.
    pub slots_per_level: u32,
    /// Number of levels. Level `k` covers `tick_ms * slots_per_level^(k+1)`; later tasks wait
    /// in the overflow list. `slots_per_level^levels` ticks must fit in a `u64`.
    pub levels: u8,
    /// Most tasks held at once: waiting, ready, in flight and dead letters together.
    pub tasks_max: u32,
    /// Most tasks one `handle_timeout` call moves (cascades, migrations, firings).
    pub work_max_per_call: u32,
    /// Backoff before the first retry, in ms.
    pub backoff_base_ms: u64,
    /// Longest backoff between retries, in ms.
    pub backoff_cap_ms: u64,
}

impl Default for WheelConfig {
    /// 1 ms tick, 64 slots, 4 levels (64^4 ms ≈ 4.7 h before overflow), 65,536 tasks,
    /// 10,000 moves per call, backoff 100 ms doubling up to 60 s.
    fn default() -> Self {
        Self {
            tick_ms: 1,
            slots_per_level: 64,
            levels: 4,
            tasks_max: 65_536,
            work_max_per_call: 10_000,
            backoff_base_ms: 100,
            backoff_cap_ms: 60_000,
        }
    }
}

impl WheelConfig {
    /// The wait before retry number `failures` (1: the first): `backoff_base_ms` doubling with
    /// each failure, capped at `backoff_cap_ms`.
    #[must_use]
    pub fn backoff_ms(&self, failures: u32) -> u64 {
        debug_assert!(failures >= 1);
        let doubling = 1_u64.checked_shl(failures.saturating_sub(1)).unwrap_or(0);
        match self.backoff_base_ms.checked_mul(doubling) {
            Some(ms) if doubling != 0 => ms.min(self.backoff_cap_ms),
            _ => self.backoff_cap_ms,
        }
    }

    /// The fewest retries whose backoffs add up to at least `horizon_ms`: a task that fails
    /// from its first firing on still has a retry left once `horizon_ms` has passed.
    #[must_use]
    pub fn retries_to_outlast(&self, horizon_ms: u64) -> u32 {
        assert!(
            self.backoff_base_ms > 0 && self.backoff_cap_ms >= self.backoff_base_ms,
            "a backoff that grows"
        );
        let (mut waited_ms, mut retries) = (0_u64, 0_u32);
        while waited_ms < horizon_ms {
            retries += 1;
            waited_ms = waited_ms.saturating_add(self.backoff_ms(retries));
        }
        retries
    }

    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tick_ms == 0 {
            return Err(ConfigError::TickZero);
        }
        if !(2..=SLOTS_PER_LEVEL_MAX).contains(&self.slots_per_level) {
            return Err(ConfigError::Slots {
                slots: self.slots_per_level,
            });
        }
        if self.levels == 0 {
            return Err(ConfigError::NoLevels);
        }
        if u64::from(self.slots_per_level)
            .checked_pow(u32::from(self.levels))
            .is_none()
        {
            return Err(ConfigError::RangeTooLarge {
                slots: self.slots_per_level,
                levels: self.levels,
            });
        }
        if !(1..=TASKS_MAX_LIMIT).contains(&self.tasks_max) {
            return Err(ConfigError::Capacity {
                tasks_max: self.tasks_max,
            });
        }
        if self.work_max_per_call == 0 {
            return Err(ConfigError::NoWork);
        }
        if self.backoff_cap_ms < self.backoff_base_ms {
            return Err(ConfigError::BackoffCapBelowBase {
                base_ms: self.backoff_base_ms,
                cap_ms: self.backoff_cap_ms,
            });
        }
        Ok(())
    }
}

/// A rejected [`WheelConfig`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Error)]
pub enum ConfigError {
    /// `tick_ms` is zero.
    #[error("tick_ms must be at least 1")]
    TickZero,
    /// `slots_per_level` is out of range.
    #[error("slots_per_level must be between 2 and {SLOTS_PER_LEVEL_MAX}, got {slots}")]
    Slots {
        /// The configured value.
        slots: u32,
    },
    /// `levels` is zero.
    #[error("levels must be at least 1")]
    NoLevels,
    /// `slots_per_level^levels` ticks overflow a `u64`.
    #[error("slots_per_level^levels = {slots}^{levels} ticks does not fit in a u64")]
    RangeTooLarge {
        /// The configured slots per level.
        slots: u32,
        /// The configured levels.
        levels: u8,
    },
    /// `tasks_max` is out of range.
    #[error("tasks_max must be between 1 and {TASKS_MAX_LIMIT}, got {tasks_max}")]
    Capacity {
        /// The configured value.
        tasks_max: u32,
    },
    /// `work_max_per_call` is zero.
    #[error("work_max_per_call must be at least 1")]
    NoWork,
    /// The backoff cap is below the base.
    #[error("backoff_cap_ms ({cap_ms}) is below backoff_base_ms ({base_ms})")]
    BackoffCapBelowBase {
        /// The configured base.
        base_ms: u64,
        /// The configured cap.
        cap_ms: u64,
    },
}

/// A refused [`TimingWheel::schedule`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Error)]
pub enum ScheduleError {
    /// The wheel already holds `tasks_max` tasks (dead letters included).
    #[error(
        "timing wheel is full: it holds tasks_max = {tasks_max} tasks (dead letters count; take them to make room)"
    )]
    Full {
        /// The configured capacity.
        tasks_max: u32,
    },
    /// The deadline's due instant (rounded up to a tick) does not fit in a `u64`.
    #[error("deadline {deadline_ms} ms is beyond the last representable tick ({max_ms} ms)")]
    DeadlineTooFar {
        /// The requested deadline.
        deadline_ms: u64,
        /// The latest accepted deadline.
        max_ms: u64,
    },
}

/// A refused operation on a task handle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Error)]
pub enum TaskError {
    /// No task with this handle is held (never scheduled, finished, cancelled or dead).
    #[error(
        "unknown task handle {handle:?} (finished, cancelled, dead-lettered or never scheduled)"
    )]
    Unknown {
        /// The handle given.
        handle: TaskHandle,
    },
    /// The task exists but was not handed out by `poll_ready`, so it cannot succeed or fail.
    #[error("task {handle:?} is not in flight (it has not been handed out by poll_ready)")]
    NotInFlight {
        /// The handle given.
        handle: TaskHandle,
    },
}

/// A broken internal invariant, found by [`TimingWheel::check_invariants`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Error)]
#[error("timing wheel invariant violated: {0}")]
pub struct InvariantViolation(pub String);

/// Names a scheduled task. Stays valid (and unique: ids are never reused) until the task
/// succeeds, is cancelled or is dead-lettered, and keeps its value across retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskHandle {
    index: u32,
    id: u64,
}

impl TaskHandle {
    /// The task's unique id (the order of scheduling, starting at 0).
    #[must_use]
    pub const fn id(self) -> u64 {
        self.id
    }
}

/// What to schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskSpec<T> {
    /// Earliest time to run, in ms (monotonic).
    pub deadline_ms: u64,
    /// Higher runs first among tasks due in the same tick.
    pub priority: u32,
    /// Retries allowed after failures: the task runs at most `1 + retries_max` times.
    pub retries_max: u32,
    /// The caller's data, handed back in [`Fired`] and [`DeadLetter`].
    pub payload: T,
}

impl<T> TaskSpec<T> {
    /// A task with priority 0 and no retries.
    #[must_use]
    pub const fn new(deadline_ms: u64, payload: T) -> Self {
        Self {
            deadline_ms,
            priority: 0,
            retries_max: 0,
            payload,
        }
    }

    /// Sets the priority.
    #[must_use]
    pub const fn with_priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the retry budget.
    #[must_use]
    pub const fn with_retries_max(mut self, retries_max: u32) -> Self {
        self.retries_max = retries_max;
        self
    }
}

/// A task handed out by [`TimingWheel::poll_ready`]; it is now in flight.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fired<T> {
    /// The task; report [`TimingWheel::handle_succeeded`] or [`TimingWheel::handle_failed`].
    pub handle: TaskHandle,
    /// A copy of the payload (the wheel keeps the original for retries).
    pub payload: T,
    /// The deadline of this attempt, in ms.
    pub deadline_ms: u64,
    /// The priority.
    pub priority: u32,
    /// 0 for the first run, `n` for the `n`-th retry.
    pub attempt: u32,
}

/// A task whose retry budget ran out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeadLetter<T> {
    /// The handle it had (no longer valid).
    pub handle: TaskHandle,
    /// The payload.
    pub payload: T,
    /// The priority.
    pub priority: u32,
    /// How many times it ran (and failed).
    pub attempts: u32,
    /// When the last failure was reported, in ms.
    pub failed_at_ms: u64,
}

/// What [`TimingWheel::handle_failed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum FailOutcome {
    /// Rescheduled with backoff.
    Retrying {
        /// The new deadline, in ms.
        deadline_ms: u64,
        /// Which retry this will be (1 for the first).
        attempt: u32,
    },
    /// Budget exhausted: moved to the dead-letter list.
    DeadLettered,
}

/// Where a held task is, as seen from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Waiting for its deadline (in the wheel, the overflow list, or due at the next
    /// `handle_timeout`).
    Waiting,
    /// Due; will be returned by `poll_ready`.
    Ready,
    /// Handed out; waiting for `handle_succeeded` or `handle_failed`.
    InFlight,
}

/// Where a task is stored (exactly one place).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    /// In the bucket list `level * slots + slot`.
    Bucket { level: u8, slot: u32 },
    /// In the overdue list: due at the next `handle_timeout`.
    Overdue,
    /// In the overflow map, beyond the top level's range.
    Overflow,
    /// In the ready map.
    Ready,
    /// Handed out by `poll_ready`.
    InFlight,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Task<T> {
    id: u64,
    /// Insertion order for ties; renewed on each retry.
    seq: u64,
    payload: T,
    deadline_ms: u64,
    /// `ceil(deadline_ms / tick_ms)`.
    due_tick: u64,
    priority: u32,
    failures: u32,
    retries_max: u32,
    place: Place,
    prev: u32,
    next: u32,
}

/// An intrusive doubly linked list of tasks (Kafka's `TimerTaskList`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
    /// For wheel buckets: `due_tick / slots^level` shared by all tasks in it.
    virtual_id: u64,
}

impl List {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
        virtual_id: 0,
    };
}

/// What the wheel must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Bucket { level: u8, slot: u32 },
    Overflow,
}

/// `(due tick, higher priority first, insertion order)`.
type ReadyKey = (u64, Reverse<u32>, u64);

/// The hierarchical timing wheel. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TimingWheel<T> {
    config: WheelConfig,
    /// Every tick `<= current_tick` has been processed.
    current_tick: u64,
    /// Slab of tasks; `None` entries are on `free`.
    tasks: Vec<Option<Task<T>>>,
    free: Vec<u32>,
    /// `levels * slots` bucket lists, level-major.
    buckets: Vec<List>,
    /// Non-empty buckets by expiry tick: `(virtual_id * slots^level, level, slot)`.
    expiries: BTreeSet<(u64, u8, u32)>,
    /// Tasks due at the next `handle_timeout` (scheduled in the past).
    overdue: List,
    /// Tasks beyond the top level's range, by `(due_tick, seq)`.
    overflow: BTreeMap<(u64, u64), u32>,
    ready: BTreeMap<ReadyKey, u32>,
    dead: Vec<DeadLetter<T>>,
    /// Tasks in the slab (not dead letters).
    live: u32,
    id_next: u64,
    seq_next: u64,
    /// Arrivals at its edge states since its driver last took them (a ghost: not its state).
    edges: Edges,
}

impl<T> Observed for TimingWheel<T> {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
}

impl<T> TimingWheel<T> {
    /// An empty wheel whose clock starts at `now_ms`.
    ///
    /// # Errors
    ///
    /// The configuration is invalid.
    pub fn new(config: WheelConfig, now_ms: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let bucket_count = usize::from(config.levels) * config.slots_per_level as usize;
        Ok(Self {
            config,
            current_tick: now_ms / config.tick_ms,
            tasks: Vec::new(),
            free: Vec::new(),
            buckets: vec![List::EMPTY; bucket_count],
            expiries: BTreeSet::new(),
            overdue: List::EMPTY,
            overflow: BTreeMap::new(),
            ready: BTreeMap::new(),
            dead: Vec::new(),
            live: 0,
            id_next: 0,
            seq_next: 0,
            edges: Edges::new(),
        })
    }

    // ----- inputs -------------------------------------------------------------------------

    /// Schedules a task.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Full`] at capacity; [`ScheduleError::DeadlineTooFar`] for a deadline in
    /// the last tick of the `u64` range.
    pub fn schedule(&mut self, spec: TaskSpec<T>) -> Result<TaskHandle, ScheduleError> {
        let max_ms = self.deadline_max_ms();
        if spec.deadline_ms > max_ms {
            return Err(ScheduleError::DeadlineTooFar {
                deadline_ms: spec.deadline_ms,
                max_ms,
            });
        }
        if self.held() >= u64::from(self.config.tasks_max) {
            return Err(ScheduleError::Full {
                tasks_max: self.config.tasks_max,
            });
        }
        let id = self.id_next;
        self.id_next += 1;
        let seq = self.next_seq();
        let task = Task {
            id,
            seq,
            payload: spec.payload,
            deadline_ms: spec.deadline_ms,
            due_tick: spec.deadline_ms.div_ceil(self.config.tick_ms),
            priority: spec.priority,
            failures: 0,
            retries_max: spec.retries_max,
            place: Place::InFlight, // replaced by `place` below
            prev: NIL,
            next: NIL,
        };
        let index = if let Some(index) = self.free.pop() {
            assert!(
                self.tasks[index as usize].is_none(),
                "free list names a live task"
            );
            self.tasks[index as usize] = Some(task);
            index
        } else {
            let index =
                u32::try_from(self.tasks.len()).expect("slab length is bounded by tasks_max");
            assert!(index < NIL, "slab index collides with NIL");
            self.tasks.push(Some(task));
            index
        };
        self.live += 1;
        self.place(index, Due::Overdue);
        Ok(TaskHandle { index, id })
    }

    /// Cancels a task wherever it is (waiting, ready or in flight) and returns its payload.
    ///
    /// # Errors
    ///
    /// [`TaskError::Unknown`] if the handle names no held task.
    pub fn cancel(&mut self, handle: TaskHandle) -> Result<T, TaskError> {
        let waiting = self.lookup(handle)?.place != Place::InFlight;
        self.edges.reach_if(waiting, &CANCELLED_WAITING);
        self.detach(handle.index);
        Ok(self.release(handle.index).payload)
    }

    /// Advances the wheel to `now_ms`: cascades coarse buckets, migrates overflow tasks and
    /// moves every task due by `now_ms` to the ready queue, at most `work_max_per_call` tasks.
    /// If the budget runs out, [`Self::poll_timeout`] returns a time `<= now_ms`: call again.
    /// A `now_ms` earlier than a previous one moves no clock backwards (only overdue tasks
    /// fire); a spurious call is a no-op.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        let target_tick = now_ms / self.config.tick_ms;
        let mut work = self.config.work_max_per_call;
        while work > 0 {
            let Some(index) = self.pop_overdue() else {
                break;
            };
            self.make_ready(index);
            work -= 1;
        }
        if self.overdue.len > 0 {
            return;
        }
        loop {
            let Some((tick, event)) = self.next_event() else {
                self.current_tick = self.current_tick.max(target_tick);
                return;
            };
            if tick > target_tick {
                self.current_tick = self.current_tick.max(target_tick);
                return;
            }
            if work == 0 {
                return;
            }
            assert!(
                tick >= self.current_tick,
                "an event at tick {tick} was left behind"
            );
            self.current_tick = tick;
            match event {
                Event::Bucket { level, slot } => {
                    let bucket = self.bucket_index(level, slot);
                    while work > 0 && self.buckets[bucket].len > 0 {
                        let index = self.pop_bucket(bucket, level, slot);
                        self.place(index, Due::Ready);
                        let placed = self.task(index).place;
                        if let Place::Bucket {
                            level: new_level, ..
                        } = placed
                        {
                            // Cascading only goes down: no task can loop in one bucket.
                            assert!(new_level < level, "cascade did not move to a finer level");
                            self.edges.reach(&CASCADED);
                        }
                        work -= 1;
                    }
                }
                Event::Overflow => {
                    while work > 0 {
                        let Some((&(due_tick, seq), &index)) = self.overflow.first_key_value()
                        else {
                            break;
                        };
                        if self.migration_tick(due_tick) > self.current_tick {
                            break;
                        }
                        self.overflow.remove(&(due_tick, seq));
                        self.place(index, Due::Ready);
                        debug_assert_ne!(self.task(index).place, Place::Overflow);
                        work -= 1;
                    }
                }
            }
        }
    }

    /// Reports that an in-flight task succeeded: it is removed and its payload returned.
    ///
    /// # Errors
    ///
    /// [`TaskError::Unknown`] or [`TaskError::NotInFlight`].
    pub fn handle_succeeded(&mut self, handle: TaskHandle) -> Result<T, TaskError> {
        self.lookup_in_flight(handle)?;
        let task = self.release(handle.index);
        self.edges
            .reach_if(task.failures > 0, &SUCCEEDED_AFTER_RETRY);
        Ok(task.payload)
    }

    /// Reports that an in-flight task failed at `now_ms`: it is rescheduled with exponential
    /// backoff while its retry budget lasts, otherwise moved to the dead-letter list.
    ///
    /// # Errors
    ///
    /// [`TaskError::Unknown`] or [`TaskError::NotInFlight`].
    pub fn handle_failed(
        &mut self,
        handle: TaskHandle,
        now_ms: u64,
    ) -> Result<FailOutcome, TaskError> {
        self.lookup_in_flight(handle)?;
        let failures = {
            let task = self.task_mut(handle.index);
            task.failures = task.failures.saturating_add(1);
            task.failures
        };
        if failures > self.task(handle.index).retries_max {
            self.edges.reach(&DEAD_LETTERED);
            let task = self.release(handle.index);
            self.dead.push(DeadLetter {
                handle,
                payload: task.payload,
                priority: task.priority,
                attempts: failures,
                failed_at_ms: now_ms,
            });
            return Ok(FailOutcome::DeadLettered);
        }
        let deadline_ms = now_ms
            .saturating_add(self.backoff_ms(failures))
            .min(self.deadline_max_ms());
        let seq = self.next_seq();
        let tick_ms = self.config.tick_ms;
        let task = self.task_mut(handle.index);
        task.deadline_ms = deadline_ms;
        task.due_tick = deadline_ms.div_ceil(tick_ms);
        task.seq = seq;
        self.place(handle.index, Due::Overdue);
        self.edges.reach(&RETRY_BACKOFF);
        Ok(FailOutcome::Retrying {
            deadline_ms,
            attempt: failures,
        })
    }

    /// Removes and returns the dead letters (making room for new tasks).
    #[must_use]
    pub fn take_dead_letters(&mut self) -> Vec<DeadLetter<T>> {
        std::mem::take(&mut self.dead)
    }

    // ----- outputs ------------------------------------------------------------------------

    /// The earliest time, in ms, at which [`Self::handle_timeout`] has work: a bucket to fire
    /// or cascade, overflow tasks to migrate, or (if tasks were scheduled in the past or the
    /// last call ran out of budget) a time `<= now`. `None` when nothing waits: an idle driver
    /// sleeps indefinitely. Never later than any waiting task's due instant, so a driver that
    /// sleeps until this time misses nothing. It may be earlier (the cascade of a coarse
    /// bucket): each task causes at most one such wakeup per level it passes through (measured:
    /// 1.3 to 2.3 wakeups per task for 2,000 tasks spread up to 50,000 s ahead).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.overdue.len > 0 {
            return Some(self.current_ms());
        }
        // tick <= due_tick <= u64::MAX / tick_ms, so the product cannot overflow.
        self.next_event()
            .map(|(tick, _)| tick * self.config.tick_ms)
    }

    /// The next ready task, most urgent first (due tick, then higher priority, then insertion
    /// order). The task is now in flight: report its outcome.
    #[must_use]
    pub fn poll_ready(&mut self) -> Option<Fired<T>>
    where
        T: Clone,
    {
        let ((due_tick, _, _), index) = self.ready.pop_first()?;
        self.edges
            .reach_if(due_tick < self.current_tick, &FIRED_LATE);
        self.edges.reach_if(
            self.ready
                .first_key_value()
                .is_some_and(|(next, _)| next.0 == due_tick),
            &SAME_TICK_TIE,
        );
        let task = self.task_mut(index);
        assert_eq!(
            task.place,
            Place::Ready,
            "ready map names a task that is not ready"
        );
        task.place = Place::InFlight;
        Some(Fired {
            handle: TaskHandle { index, id: task.id },
            payload: task.payload.clone(),
            deadline_ms: task.deadline_ms,
            priority: task.priority,
            attempt: task.failures,
        })
    }

    // ----- getters ------------------------------------------------------------------------

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &WheelConfig {
        &self.config
    }

    /// The wheel's time: the start of the last processed tick, in ms.
    #[must_use]
    pub const fn current_ms(&self) -> u64 {
        self.current_tick * self.config.tick_ms
    }

    /// Tasks held, not counting dead letters.
    #[must_use]
    pub const fn len(&self) -> u32 {
        self.live
    }

    /// No task held (dead letters aside).
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Tasks ready for `poll_ready`.
    #[must_use]
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Tasks beyond the top level's range.
    #[must_use]
    pub fn overflow_len(&self) -> usize {
        self.overflow.len()
    }

    /// The dead letters, oldest first.
    #[must_use]
    pub fn dead_letters(&self) -> &[DeadLetter<T>] {
        &self.dead
    }

    /// Where a task is, or `None` if the handle names no held task.
    #[must_use]
    pub fn status(&self, handle: TaskHandle) -> Option<TaskStatus> {
        let task = self.lookup(handle).ok()?;
        Some(match task.place {
            Place::Bucket { .. } | Place::Overdue | Place::Overflow => TaskStatus::Waiting,
            Place::Ready => TaskStatus::Ready,
            Place::InFlight => TaskStatus::InFlight,
        })
    }

    /// A held task's payload.
    #[must_use]
    pub fn payload(&self, handle: TaskHandle) -> Option<&T> {
        self.lookup(handle).ok().map(|task| &task.payload)
    }

    /// Checks every structural invariant: each held task is stored in exactly one place that
    /// matches its recorded place; list links and counts agree; each bucket holds the tasks of
    /// exactly one virtual slot inside its level's current window; the expiry index names
    /// exactly the non-empty buckets; overflow, overdue and ready entries agree with their
    /// tasks; the slab, free list and capacity agree. O(tasks + buckets): for tests.
    ///
    /// # Errors
    ///
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let mut seen = vec![false; self.tasks.len()];
        self.check_buckets(&mut seen)?;
        self.check_overdue(&mut seen)?;
        self.check_overflow_and_ready(&mut seen)?;
        self.check_slab(&mut seen)
    }

    /// Every bucket of every level, and the expiry index against the non-empty ones.
    fn check_buckets(&self, seen: &mut [bool]) -> Result<(), InvariantViolation> {
        let mut nonempty = 0_usize;
        for level in 0..self.config.levels {
            for slot in 0..self.config.slots_per_level {
                if self.check_bucket(level, slot, seen)? {
                    nonempty += 1;
                }
            }
        }
        if self.expiries.len() != nonempty {
            return Err(InvariantViolation(format!(
                "{} expiries for {nonempty} non-empty buckets",
                self.expiries.len()
            )));
        }
        Ok(())
    }

    /// One bucket: its list, its virtual slot, its expiry entry, its tasks' due ticks.
    /// Returns whether it is non-empty.
    fn check_bucket(
        &self,
        level: u8,
        slot: u32,
        seen: &mut [bool],
    ) -> Result<bool, InvariantViolation> {
        let fail = |message: String| Err(InvariantViolation(message));
        let slots = self.config.slots_per_level;
        let c = self.current_tick;
        let span = self.span(level);
        let list = &self.buckets[self.bucket_index(level, slot)];
        let place = Place::Bucket { level, slot };
        self.check_list(list, place, seen)?;
        if list.len == 0 {
            return Ok(false);
        }
        let v = list.virtual_id;
        if v % u64::from(slots) != u64::from(slot) {
            return fail(format!("bucket {level}/{slot} holds virtual slot {v}"));
        }
        let window_start = c / span;
        if v < window_start || v - window_start >= u64::from(slots) {
            return fail(format!(
                "bucket {level}/{slot}: virtual slot {v} outside window starting {window_start}"
            ));
        }
        if !self.expiries.contains(&(v * span, level, slot)) {
            return fail(format!(
                "non-empty bucket {level}/{slot} missing from expiries"
            ));
        }
        let mut cursor = list.head;
        while cursor != NIL {
            let task = self.task(cursor);
            if task.due_tick / span != v {
                return fail(format!(
                    "task {} due at tick {} in bucket {level}/{slot} of virtual slot {v}",
                    task.id, task.due_tick
                ));
            }
            if task.due_tick < c {
                return fail(format!(
                    "task {} due at {} left behind at tick {c}",
                    task.id, task.due_tick
                ));
            }
            cursor = task.next;
        }
        Ok(true)
    }

    /// The overdue list: linked correctly, and nothing in it due in the future.
    fn check_overdue(&self, seen: &mut [bool]) -> Result<(), InvariantViolation> {
        self.check_list(&self.overdue, Place::Overdue, seen)?;
        let mut cursor = self.overdue.head;
        while cursor != NIL {
            let task = self.task(cursor);
            if task.due_tick > self.current_tick {
                return Err(InvariantViolation(format!(
                    "overdue task {} is due in the future (tick {})",
                    task.id, task.due_tick
                )));
            }
            cursor = task.next;
        }
        Ok(())
    }

    /// The overflow and ready entries agree with their tasks and with the current tick.
    fn check_overflow_and_ready(&self, seen: &mut [bool]) -> Result<(), InvariantViolation> {
        let fail = |message: String| Err(InvariantViolation(message));
        let c = self.current_tick;
        for (&(due_tick, seq), &index) in &self.overflow {
            let task = self.checked_task(index)?;
            if task.place != Place::Overflow || task.due_tick != due_tick || task.seq != seq {
                return fail(format!(
                    "overflow entry ({due_tick}, {seq}) disagrees with task {}",
                    task.id
                ));
            }
            if due_tick <= c {
                return fail(format!("overflow task {} is already due", task.id));
            }
            mark_seen(seen, index)?;
        }
        for (&(due_tick, Reverse(priority), seq), &index) in &self.ready {
            let task = self.checked_task(index)?;
            if task.place != Place::Ready
                || task.due_tick != due_tick
                || task.priority != priority
                || task.seq != seq
            {
                return fail(format!(
                    "ready entry ({due_tick}, {priority}, {seq}) disagrees with task {}",
                    task.id
                ));
            }
            if due_tick > c {
                return fail(format!("ready task {} is not due yet", task.id));
            }
            mark_seen(seen, index)?;
        }
        Ok(())
    }

    /// Every live task is stored somewhere; the live count, free list and capacity agree.
    fn check_slab(&self, seen: &mut [bool]) -> Result<(), InvariantViolation> {
        let fail = |message: String| Err(InvariantViolation(message));
        let mut held = 0_u32;
        for (index, entry) in self.tasks.iter().enumerate() {
            let Some(task) = entry else { continue };
            held += 1;
            if task.id >= self.id_next || task.seq >= self.seq_next {
                return fail(format!("task {} has an id or seq from the future", task.id));
            }
            if task.place == Place::InFlight {
                mark_seen(seen, u32::try_from(index).unwrap_or(NIL))?;
            } else if !seen[index] {
                return fail(format!(
                    "task {} (place {:?}) is stored nowhere",
                    task.id, task.place
                ));
            }
        }
        if held != self.live {
            return fail(format!(
                "live count {} but {held} tasks in the slab",
                self.live
            ));
        }
        let mut free_seen = BTreeSet::new();
        for &index in &self.free {
            if self.tasks.get(index as usize).is_none_or(Option::is_some)
                || !free_seen.insert(index)
            {
                return fail(format!(
                    "free list entry {index} is live, out of range or repeated"
                ));
            }
        }
        if free_seen.len() + held as usize != self.tasks.len() {
            return fail("free list and live tasks do not cover the slab".to_owned());
        }
        if self.held() > u64::from(self.config.tasks_max) {
            return fail(format!(
                "{} tasks held over tasks_max {}",
                self.held(),
                self.config.tasks_max
            ));
        }
        Ok(())
    }

    // ----- internals ----------------------------------------------------------------------

    /// Tasks counted against `tasks_max`.
    fn held(&self) -> u64 {
        u64::from(self.live) + self.dead.len() as u64
    }

    const fn deadline_max_ms(&self) -> u64 {
        (u64::MAX / self.config.tick_ms) * self.config.tick_ms
    }

    const fn next_seq(&mut self) -> u64 {
        let seq = self.seq_next;
        self.seq_next += 1;
        seq
    }

    fn backoff_ms(&self, failures: u32) -> u64 {
        self.config.backoff_ms(failures)
    }

    /// `slots^level` ticks: the slot span of `level` (fits: validated).
    fn span(&self, level: u8) -> u64 {
        u64::from(self.config.slots_per_level).pow(u32::from(level))
    }

    fn bucket_index(&self, level: u8, slot: u32) -> usize {
        usize::from(level) * self.config.slots_per_level as usize + slot as usize
    }

    /// The tick at which an overflow task with `due_tick` fits the top level's window.
    fn migration_tick(&self, due_tick: u64) -> u64 {
        let top = self.span(self.config.levels - 1);
        let v = due_tick / top;
        let slots = u64::from(self.config.slots_per_level);
        debug_assert!(v >= slots, "an overflow task would have fit the top level");
        // `v - slots + 1`, not `v + 1 - slots`: `v` may be `u64::MAX` (a deadline in the last
        // tick, one-tick wide levels).
        (v - slots + 1) * top
    }

    /// The earliest pending event: the first non-empty bucket or the overflow migration.
    fn next_event(&self) -> Option<(u64, Event)> {
        let bucket = self
            .expiries
            .first()
            .map(|&(tick, level, slot)| (tick, Event::Bucket { level, slot }));
        let overflow = self
            .overflow
            .first_key_value()
            .map(|(&(due_tick, _), _)| (self.migration_tick(due_tick), Event::Overflow));
        match (bucket, overflow) {
            (Some(b), Some(o)) => Some(if o.0 < b.0 { o } else { b }),
            (b, o) => b.or(o),
        }
    }

    fn task(&self, index: u32) -> &Task<T> {
        self.tasks[index as usize]
            .as_ref()
            .expect("index names a live task")
    }

    fn task_mut(&mut self, index: u32) -> &mut Task<T> {
        self.tasks[index as usize]
            .as_mut()
            .expect("index names a live task")
    }

    fn checked_task(&self, index: u32) -> Result<&Task<T>, InvariantViolation> {
        self.tasks
            .get(index as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| InvariantViolation(format!("index {index} names no live task")))
    }

    fn lookup(&self, handle: TaskHandle) -> Result<&Task<T>, TaskError> {
        match self.tasks.get(handle.index as usize) {
            Some(Some(task)) if task.id == handle.id => Ok(task),
            _ => Err(TaskError::Unknown { handle }),
        }
    }

    fn lookup_in_flight(&self, handle: TaskHandle) -> Result<(), TaskError> {
        if self.lookup(handle)?.place == Place::InFlight {
            Ok(())
        } else {
            Err(TaskError::NotInFlight { handle })
        }
    }

    /// Stores a detached task according to its due tick and the wheel's current tick.
    /// `due` says where a task that is already due goes.
    fn place(&mut self, index: u32, due: Due) {
        let due_tick = self.task(index).due_tick;
        let c = self.current_tick;
        if due_tick <= c {
            match due {
                Due::Ready => self.make_ready(index),
                Due::Overdue => {
                    self.task_mut(index).place = Place::Overdue;
                    push_back(&mut self.tasks, &mut self.overdue, index);
                }
            }
            return;
        }
        let slots = u64::from(self.config.slots_per_level);
        for level in 0..self.config.levels {
            let span = self.span(level);
            let window_start = c / span;
            let v = due_tick / span;
            assert!(v >= window_start, "a future task maps before the window");
            if v - window_start >= slots {
                continue;
            }
            // Below the top of this window; above its start except at level 0 (v > c there).
            debug_assert!(level == 0 || v > window_start);
            let slot = u32::try_from(v % slots).expect("slot < slots_per_level");
            let bucket = self.bucket_index(level, slot);
            if self.buckets[bucket].len == 0 {
                self.buckets[bucket].virtual_id = v;
                let inserted = self.expiries.insert((v * span, level, slot));
                assert!(inserted, "an empty bucket was in the expiry index");
            } else {
                assert_eq!(
                    self.buckets[bucket].virtual_id, v,
                    "two virtual slots share bucket {level}/{slot}"
                );
            }
            self.task_mut(index).place = Place::Bucket { level, slot };
            push_back(&mut self.tasks, &mut self.buckets[bucket], index);
            return;
        }
        let seq = self.task(index).seq;
        self.task_mut(index).place = Place::Overflow;
        let previous = self.overflow.insert((due_tick, seq), index);
        assert!(previous.is_none(), "overflow key repeated");
    }

    fn make_ready(&mut self, index: u32) {
        let task = self.task_mut(index);
        task.place = Place::Ready;
        let key = (task.due_tick, Reverse(task.priority), task.seq);
        let previous = self.ready.insert(key, index);
        assert!(previous.is_none(), "ready key repeated");
    }

    fn pop_overdue(&mut self) -> Option<u32> {
        let index = self.overdue.head;
        if index == NIL {
            return None;
        }
        unlink(&mut self.tasks, &mut self.overdue, index);
        Some(index)
    }

    fn pop_bucket(&mut self, bucket: usize, level: u8, slot: u32) -> u32 {
        let index = self.buckets[bucket].head;
        assert_ne!(index, NIL, "popped an empty bucket");
        self.unlink_bucket(bucket, level, slot, index);
        index
    }

    fn unlink_bucket(&mut self, bucket: usize, level: u8, slot: u32, index: u32) {
        unlink(&mut self.tasks, &mut self.buckets[bucket], index);
        if self.buckets[bucket].len == 0 {
            let expiry = self.buckets[bucket].virtual_id * self.span(level);
            let removed = self.expiries.remove(&(expiry, level, slot));
            assert!(
                removed,
                "a non-empty bucket was missing from the expiry index"
            );
        }
    }

    /// Removes a task from wherever it is stored; it stays in the slab.
    fn detach(&mut self, index: u32) {
        let task = self.task(index);
        let (place, due_tick, priority, seq) = (task.place, task.due_tick, task.priority, task.seq);
        match place {
            Place::Bucket { level, slot } => {
                let bucket = self.bucket_index(level, slot);
                self.unlink_bucket(bucket, level, slot, index);
            }
            Place::Overdue => unlink(&mut self.tasks, &mut self.overdue, index),
            Place::Overflow => {
                let removed = self.overflow.remove(&(due_tick, seq));
                assert_eq!(removed, Some(index), "overflow entry missing");
            }
            Place::Ready => {
                let removed = self.ready.remove(&(due_tick, Reverse(priority), seq));
                assert_eq!(removed, Some(index), "ready entry missing");
            }
            Place::InFlight => {}
        }
        self.task_mut(index).place = Place::InFlight;
    }

    /// Frees a detached (or in-flight) task's slab entry.
    fn release(&mut self, index: u32) -> Task<T> {
        let task = self.tasks[index as usize]
            .take()
            .expect("released a live task");
        assert_eq!(
            task.place,
            Place::InFlight,
            "released a task still stored somewhere"
        );
        self.free.push(index);
        self.live -= 1;
        task
    }

    fn check_list(
        &self,
        list: &List,
        place: Place,
        seen: &mut [bool],
    ) -> Result<(), InvariantViolation> {
        let mut count = 0_u32;
        let mut previous = NIL;
        let mut cursor = list.head;
        while cursor != NIL {
            let task = self.checked_task(cursor)?;
            if task.place != place {
                return Err(InvariantViolation(format!(
                    "task {} recorded at {:?} is linked in {place:?}",
                    task.id, task.place
                )));
            }
            if task.prev != previous {
                return Err(InvariantViolation(format!(
                    "task {} has a broken prev link in {place:?}",
                    task.id
                )));
            }
            mark_seen(seen, cursor)?;
            count += 1;
            if count > self.live {
                return Err(InvariantViolation(format!(
                    "list {place:?} is longer than the live count (a cycle?)"
                )));
            }
            previous = cursor;
            cursor = task.next;
        }
        if list.tail != previous {
            return Err(InvariantViolation(format!(
                "list {place:?} has a wrong tail"
            )));
        }
        if list.len != count {
            return Err(InvariantViolation(format!(
                "list {place:?} says {} tasks but links {count}",
                list.len
            )));
        }
        Ok(())
    }
}

/// Where an already-due task goes when placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    /// Straight to the ready queue (during `handle_timeout`).
    Ready,
    /// To the overdue list, ready at the next `handle_timeout` (on schedule or retry).
    Overdue,
}

fn mark_seen(seen: &mut [bool], index: u32) -> Result<(), InvariantViolation> {
    match seen.get_mut(index as usize) {
        Some(flag) if !*flag => {
            *flag = true;
            Ok(())
        }
        Some(_) => Err(InvariantViolation(format!(
            "task at index {index} is stored in two places"
        ))),
        None => Err(InvariantViolation(format!(
            "index {index} is outside the slab"
        ))),
    }
}

fn push_back<T>(tasks: &mut [Option<Task<T>>], list: &mut List, index: u32) {
    let tail = list.tail;
    {
        let task = tasks[index as usize].as_mut().expect("linked a live task");
        task.prev = tail;
        task.next = NIL;
    }
    if tail == NIL {
        debug_assert_eq!(list.len, 0);
        list.head = index;
    } else {
        tasks[tail as usize].as_mut().expect("tail is live").next = index;
    }
    list.tail = index;
    list.len += 1;
}

fn unlink<T>(tasks: &mut [Option<Task<T>>], list: &mut List, index: u32) {
    let (prev, next) = {
        let task = tasks[index as usize]
            .as_mut()
            .expect("unlinked a live task");
        let links = (task.prev, task.next);
        task.prev = NIL;
        task.next = NIL;
        links
    };
    if prev == NIL {
        assert_eq!(list.head, index, "a task without prev is not the head");
        list.head = next;
    } else {
        tasks[prev as usize].as_mut().expect("prev is live").next = next;
    }
    if next == NIL {
        assert_eq!(list.tail, index, "a task without next is not the tail");
        list.tail = prev;
    } else {
        tasks[next as usize].as_mut().expect("next is live").prev = prev;
    }
    assert!(list.len > 0, "unlinked from an empty list");
    list.len -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(tick_ms: u64, slots_per_level: u32, levels: u8) -> WheelConfig {
        WheelConfig {
            tick_ms,
            slots_per_level,
            levels,
            ..WheelConfig::default()
        }
    }

    fn backoff(base_ms: u64, cap_ms: u64) -> WheelConfig {
        WheelConfig {
            backoff_base_ms: base_ms,
            backoff_cap_ms: cap_ms,
            ..WheelConfig::default()
        }
    }

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        let b = backoff(10, 1_000);
        let waits: Vec<u64> = (1..=9).map(|f| b.backoff_ms(f)).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1_000, 1_000]);
    }

    #[test]
    fn the_retries_to_outlast_a_horizon_are_the_fewest_whose_waits_cover_it() {
        // 10 + 20 + 40 + 80 + 160 + 320 + 640 = 1,270 ms in 7 retries, then 1,000 ms each.
        assert_eq!(backoff(10, 1_000).retries_to_outlast(1_270), 7);
        assert_eq!(backoff(10, 1_000).retries_to_outlast(1_271), 8);
        assert_eq!(backoff(10, 1_000).retries_to_outlast(8_500), 15);
        assert_eq!(backoff(100, 100).retries_to_outlast(1), 1);
        assert_eq!(backoff(100, 100).retries_to_outlast(0), 0);
    }

    /// Drives the wheel to `now_ms` to completion (as a driver would) and drains the ready queue.
    fn drive(wheel: &mut TimingWheel<u64>, now_ms: u64) -> Vec<Fired<u64>> {
        for _ in 1..100_000 {
            wheel.handle_timeout(now_ms);
            wheel.check_invariants().unwrap();
            match wheel.poll_timeout() {
                Some(at_ms) if at_ms <= now_ms => {}
                _ => return std::iter::from_fn(|| wheel.poll_ready()).collect(),
            }
        }
        panic!("handle_timeout made no progress");
    }

    // ----- (1) the reference model: sut/tests/wheel_hostile.rs (the wheel against a hostile
    // driver, compared with a reference model after every call; part of the mutation gate) ---

    // ----- (2) retry budget and dead letters ---------------------------------------------------

    #[test]
    fn failed_task_backs_off_exponentially_then_goes_to_dead_letters() {
        let cfg = WheelConfig {
            backoff_base_ms: 100,
            backoff_cap_ms: 250,
            ..config(1, 20, 3)
        };
        let mut wheel = TimingWheel::new(cfg, 0).unwrap();
        let handle = wheel
            .schedule(
                TaskSpec::new(10, 7_u64)
                    .with_retries_max(3)
                    .with_priority(5),
            )
            .unwrap();
        let mut now_ms = 10;
        let mut retry_deadlines = Vec::new();
        for attempt in 0..4 {
            let fired = drive(&mut wheel, now_ms);
            assert_eq!(fired.len(), 1, "attempt {attempt} fires exactly once");
            assert_eq!(fired[0].attempt, attempt);
            assert_eq!(fired[0].payload, 7);
            assert_eq!(wheel.status(handle), Some(TaskStatus::InFlight));
            match wheel.handle_failed(handle, now_ms + 1).unwrap() {
                FailOutcome::Retrying {
                    deadline_ms,
                    attempt: retry,
                } => {
                    assert_eq!(retry, attempt + 1);
                    retry_deadlines.push(deadline_ms - (now_ms + 1));
                    // Nothing fires before the backoff has elapsed.
                    assert!(drive(&mut wheel, deadline_ms - 1).is_empty());
                    assert_eq!(wheel.status(handle), Some(TaskStatus::Waiting));
                    now_ms = deadline_ms;
                }
                FailOutcome::DeadLettered => {
                    assert_eq!(attempt, 3, "dead only after the budget of 3 retries");
                }
            }
            wheel.check_invariants().unwrap();
        }
        // Backoff 100, 200, then capped at 250.
        assert_eq!(retry_deadlines, vec![100, 200, 250]);
        assert_eq!(wheel.status(handle), None);
        assert!(wheel.is_empty());
        let dead = wheel.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(
            dead[0],
            DeadLetter {
                handle,
                payload: 7,
                priority: 5,
                attempts: 4,
                failed_at_ms: now_ms + 1
            }
        );
        assert_eq!(
            wheel.handle_failed(handle, now_ms),
            Err(TaskError::Unknown { handle })
        );
        assert_eq!(wheel.take_dead_letters().len(), 1);
        assert!(wheel.dead_letters().is_empty());
        assert!(
            drive(&mut wheel, u64::MAX / 2).is_empty(),
            "a dead task never fires again"
        );
        wheel.check_invariants().unwrap();
    }

    #[test]
    fn backoff_saturates_at_the_cap_for_huge_failure_counts() {
        let cfg = WheelConfig {
            backoff_base_ms: 3,
            backoff_cap_ms: u64::MAX,
            ..config(1, 4, 2)
        };
        let wheel = TimingWheel::<u64>::new(cfg, 0).unwrap();
        assert_eq!(wheel.backoff_ms(1), 3);
        assert_eq!(wheel.backoff_ms(3), 12);
        assert_eq!(wheel.backoff_ms(64), u64::MAX, "3 * 2^63 overflows: capped");
        assert_eq!(wheel.backoff_ms(u32::MAX), u64::MAX);
    }

    #[test]
    fn success_removes_and_errors_name_the_misuse() {
        let mut wheel = TimingWheel::new(config(1, 4, 2), 0).unwrap();
        let handle = wheel.schedule(TaskSpec::new(5, 1_u64)).unwrap();
        assert_eq!(
            wheel.handle_succeeded(handle),
            Err(TaskError::NotInFlight { handle })
        );
        assert_eq!(
            wheel.handle_failed(handle, 0),
            Err(TaskError::NotInFlight { handle })
        );
        assert_eq!(drive(&mut wheel, 5).len(), 1);
        assert_eq!(wheel.handle_succeeded(handle), Ok(1));
        assert_eq!(
            wheel.handle_succeeded(handle),
            Err(TaskError::Unknown { handle })
        );
        // The slab slot is reused, but the old handle stays dead.
        let other = wheel.schedule(TaskSpec::new(9, 2_u64)).unwrap();
        assert_eq!(other.index, handle.index);
        assert_eq!(wheel.cancel(handle), Err(TaskError::Unknown { handle }));
        assert_eq!(wheel.payload(other), Some(&2));
        assert_eq!(wheel.cancel(other), Ok(2));
        assert!(wheel.is_empty());
        assert_eq!(wheel.poll_timeout(), None);
        wheel.check_invariants().unwrap();
    }

    // ----- (3) capacity ------------------------------------------------------------------------

    #[test]
    fn capacity_counts_waiting_in_flight_and_dead_tasks() {
        let cfg = WheelConfig {
            tasks_max: 3,
            ..config(1, 4, 2)
        };
        let mut wheel = TimingWheel::new(cfg, 0).unwrap();
        let a = wheel.schedule(TaskSpec::new(1, 0_u64)).unwrap();
        let _b = wheel.schedule(TaskSpec::new(1_000_000, 1_u64)).unwrap(); // overflow
        let _c = wheel.schedule(TaskSpec::new(2, 2_u64)).unwrap();
        let full = Err(ScheduleError::Full { tasks_max: 3 });
        assert_eq!(wheel.schedule(TaskSpec::new(3, 3_u64)), full);
        assert_eq!(wheel.overflow_len(), 1);
        // In flight still counts.
        assert_eq!(drive(&mut wheel, 1).len(), 1);
        assert_eq!(wheel.schedule(TaskSpec::new(3, 3_u64)), full);
        // A dead letter still counts: never dropped to make room.
        assert_eq!(wheel.handle_failed(a, 1), Ok(FailOutcome::DeadLettered));
        assert_eq!(wheel.len(), 2);
        assert_eq!(wheel.schedule(TaskSpec::new(3, 3_u64)), full);
        // Taking the dead letters frees the room.
        assert_eq!(wheel.take_dead_letters().len(), 1);
        let d = wheel.schedule(TaskSpec::new(3, 3_u64)).unwrap();
        assert_eq!(wheel.schedule(TaskSpec::new(3, 4_u64)), full);
        assert_eq!(wheel.cancel(d), Ok(3));
        assert!(wheel.schedule(TaskSpec::new(3, 4_u64)).is_ok());
        wheel.check_invariants().unwrap();
        // The error message says what to do.
        let message = ScheduleError::Full { tasks_max: 3 }.to_string();
        assert!(message.contains("take them to make room"), "{message}");
    }

    #[test]
    fn deadlines_in_the_last_tick_of_u64_are_refused_not_wrapped() {
        let mut wheel = TimingWheel::new(config(10, 4, 2), 0).unwrap();
        let max_ms = u64::MAX / 10 * 10;
        assert_eq!(
            wheel.schedule(TaskSpec::new(max_ms + 1, 0_u64)),
            Err(ScheduleError::DeadlineTooFar {
                deadline_ms: max_ms + 1,
                max_ms
            })
        );
        let handle = wheel.schedule(TaskSpec::new(max_ms, 1_u64)).unwrap();
        assert_eq!(wheel.overflow_len(), 1);
        assert!(drive(&mut wheel, max_ms - 1).is_empty());
        let fired = drive(&mut wheel, u64::MAX);
        assert_eq!(
            fired.iter().map(|f| f.handle).collect::<Vec<_>>(),
            vec![handle]
        );
    }

    #[test]
    fn invalid_configurations_are_typed_errors() {
        let ok = WheelConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let cases = [
            (WheelConfig { tick_ms: 0, ..ok }, ConfigError::TickZero),
            (
                WheelConfig {
                    slots_per_level: 1,
                    ..ok
                },
                ConfigError::Slots { slots: 1 },
            ),
            (WheelConfig { levels: 0, ..ok }, ConfigError::NoLevels),
            (
                WheelConfig {
                    slots_per_level: 64,
                    levels: 11,
                    ..ok
                },
                ConfigError::RangeTooLarge {
                    slots: 64,
                    levels: 11,
                },
            ),
            (
                WheelConfig { tasks_max: 0, ..ok },
                ConfigError::Capacity { tasks_max: 0 },
            ),
            (
                WheelConfig {
                    work_max_per_call: 0,
                    ..ok
                },
                ConfigError::NoWork,
            ),
            (
                WheelConfig {
                    backoff_base_ms: 10,
                    backoff_cap_ms: 9,
                    ..ok
                },
                ConfigError::BackoffCapBelowBase {
                    base_ms: 10,
                    cap_ms: 9,
                },
            ),
        ];
        for (cfg, error) in cases {
            assert_eq!(TimingWheel::<u64>::new(cfg, 0).unwrap_err(), error);
        }
        // 64^10 ticks fit; 2^63 fits with 63 levels of 2 slots.
        assert!(
            WheelConfig {
                slots_per_level: 64,
                levels: 10,
                ..ok
            }
            .validate()
            .is_ok()
        );
        assert!(
            WheelConfig {
                slots_per_level: 2,
                levels: 63,
                ..ok
            }
            .validate()
            .is_ok()
        );
    }

    // ----- (4) poll_timeout is exact enough for a sleeping driver -------------------------------

    /// A driver that only ever sleeps until `poll_timeout` fires every task less than one tick
    /// after its deadline, never before, and wakes at most (levels + 1) times per task.
    #[test]
    fn sleeping_until_poll_timeout_never_misses_a_task() {
        for (tick_ms, slots, levels) in [(1, 20, 3), (10, 4, 2), (7, 64, 1), (1, 2, 4)] {
            let cfg = WheelConfig {
                tasks_max: 10_000,
                ..config(tick_ms, slots, levels)
            };
            let mut wheel = TimingWheel::new(cfg, 1_234).unwrap();
            // A fixed xorshift sequence: deadlines from "now" to far beyond the top level.
            let mut x = 0x9E37_79B9_7F4A_7C15_u64;
            let mut deadlines = BTreeMap::new();
            for i in 0..2_000_u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let deadline_ms = 1_234 + x % [50, 5_000, 500_000, 50_000_000][(i % 4) as usize];
                let handle = wheel
                    .schedule(TaskSpec::new(deadline_ms, i).with_priority((x >> 60) as u32))
                    .unwrap();
                deadlines.insert(handle, deadline_ms);
            }
            assert!(
                wheel.overflow_len() > 0 || levels > 2,
                "the far tasks exercise the overflow list"
            );
            let mut wakeups = 0_u64;
            let mut fired_count = 0;
            let mut last_ms = 0;
            while let Some(wake_ms) = wheel.poll_timeout() {
                wakeups += 1;
                assert!(wake_ms >= last_ms, "time only moves forward");
                last_ms = wake_ms;
                wheel.handle_timeout(wake_ms);
                let mut previous: Option<Fired<u64>> = None;
                while let Some(fired) = wheel.poll_ready() {
                    let deadline_ms = deadlines.remove(&fired.handle).expect("fired once");
                    assert!(deadline_ms <= wake_ms, "early");
                    assert!(wake_ms - deadline_ms < tick_ms, "late by a tick or more");
                    if let Some(p) = &previous {
                        // All due in this tick: higher priority first, ties in insertion order.
                        assert!(
                            (Reverse(p.priority), p.handle.id)
                                < (Reverse(fired.priority), fired.handle.id),
                            "priority order"
                        );
                    }
                    assert_eq!(wheel.handle_succeeded(fired.handle), Ok(fired.payload));
                    previous = Some(fired);
                    fired_count += 1;
                }
            }
            assert!(
                deadlines.is_empty(),
                "{} tasks never fired",
                deadlines.len()
            );
            assert_eq!(fired_count, 2_000);
            eprintln!(
                "tick {tick_ms} ms, {slots} slots, {levels} levels: {wakeups} wakeups for 2000 tasks"
            );
            assert!(
                wakeups <= 2_000 * (u64::from(levels) + 2),
                "{wakeups} wakeups"
            );
            wheel.check_invariants().unwrap();
        }
    }

    #[test]
    fn idle_wheel_asks_for_no_wakeup_and_past_tasks_fire_at_the_next_call() {
        let mut wheel = TimingWheel::new(config(10, 8, 2), 1_000).unwrap();
        assert_eq!(wheel.poll_timeout(), None);
        let late = wheel.schedule(TaskSpec::new(3, 1_u64)).unwrap();
        let now = wheel.schedule(TaskSpec::new(1_000, 2_u64)).unwrap();
        assert_eq!(wheel.status(late), Some(TaskStatus::Waiting));
        assert_eq!(wheel.poll_timeout(), Some(1_000), "overdue: wake now");
        wheel.handle_timeout(1_000);
        assert_eq!(wheel.status(late), Some(TaskStatus::Ready));
        let fired: Vec<_> = std::iter::from_fn(|| wheel.poll_ready())
            .map(|f| f.handle)
            .collect();
        assert_eq!(fired, vec![late, now], "earlier due tick first");
        assert_eq!(wheel.poll_timeout(), None);
    }

    #[test]
    fn priority_orders_tasks_of_one_tick_and_ties_keep_insertion_order() {
        let mut wheel = TimingWheel::new(config(10, 4, 3), 0).unwrap();
        // All in the tick ending at 100 ms (deadlines 91..=100 round up to tick 10).
        let specs = [(91, 1), (95, 3), (100, 1), (99, 3), (92, 0)];
        let handles: Vec<_> = specs
            .iter()
            .map(|&(deadline_ms, priority)| {
                wheel
                    .schedule(TaskSpec::new(deadline_ms, deadline_ms).with_priority(priority))
                    .unwrap()
            })
            .collect();
        let early = wheel.schedule(TaskSpec::new(85, 0_u64)).unwrap();
        assert_eq!(
            wheel.poll_timeout(),
            Some(80),
            "first a cascade point or the 90 ms tick"
        );
        let fired: Vec<_> = drive(&mut wheel, 100)
            .into_iter()
            .map(|f| f.handle)
            .collect();
        assert_eq!(
            fired,
            vec![
                early, handles[1], handles[3], handles[0], handles[2], handles[4]
            ]
        );
    }

    #[test]
    fn bounded_work_per_call_resumes_where_it_stopped() {
        let cfg = WheelConfig {
            work_max_per_call: 3,
            ..config(1, 4, 2)
        };
        let mut wheel = TimingWheel::new(cfg, 0).unwrap();
        for i in 0..10_u64 {
            let _ = wheel.schedule(TaskSpec::new(10 + i % 2, i)).unwrap();
        }
        wheel.handle_timeout(100);
        assert!(wheel.ready_len() <= 3);
        assert!(
            wheel.poll_timeout().unwrap() <= 100,
            "more work: the driver calls again"
        );
        wheel.check_invariants().unwrap();
        let mut calls = 1;
        while wheel.poll_timeout().is_some_and(|at_ms| at_ms <= 100) {
            wheel.handle_timeout(100);
            wheel.check_invariants().unwrap();
            calls += 1;
        }
        assert_eq!(wheel.ready_len(), 10);
        assert!(calls >= 4, "{calls} calls for 10 tasks at 3 per call");
        let order: Vec<u64> = std::iter::from_fn(|| wheel.poll_ready())
            .map(|f| f.payload)
            .collect();
        assert_eq!(order, vec![0, 2, 4, 6, 8, 1, 3, 5, 7, 9]);
    }

    #[test]
    fn spurious_and_backward_timeouts_are_no_ops() {
        let mut wheel = TimingWheel::new(config(1, 4, 2), 50).unwrap();
        let _ = wheel.schedule(TaskSpec::new(70, 0_u64)).unwrap();
        let _ = wheel.schedule(TaskSpec::new(5_000, 1_u64)).unwrap();
        let before = wheel.clone();
        wheel.handle_timeout(50);
        assert_eq!(
            wheel, before,
            "nothing due: a spurious call changes nothing"
        );
        wheel.handle_timeout(10);
        assert_eq!(wheel, before, "a backward clock changes nothing");
        assert_eq!(drive(&mut wheel, 70).len(), 1);
        assert_eq!(wheel.current_ms(), 70);
        wheel.handle_timeout(0);
        assert_eq!(wheel.current_ms(), 70, "the wheel's clock never goes back");
    }

    // ----- the invariant checker fires on bad states -------------------------------------------

    fn populated() -> TimingWheel<u64> {
        let mut wheel = TimingWheel::new(config(1, 4, 2), 0).unwrap();
        for (i, deadline_ms) in [2_u64, 3, 9, 14, 1_000, 0].into_iter().enumerate() {
            let _ = wheel
                .schedule(TaskSpec::new(deadline_ms, i as u64))
                .unwrap();
        }
        wheel.check_invariants().unwrap();
        wheel
    }

    #[test]
    fn check_invariants_detects_corruption() {
        let index_in_bucket = |wheel: &TimingWheel<u64>| {
            wheel
                .buckets
                .iter()
                .find(|b| b.len > 0)
                .map(|b| b.head)
                .unwrap()
        };
        type Corruption = (&'static str, Box<dyn Fn(&mut TimingWheel<u64>)>);
        let mut corruptions: Vec<Corruption> = Vec::new();
        corruptions.push((
            "place mismatch",
            Box::new(move |w| {
                let i = index_in_bucket(w);
                w.task_mut(i).place = Place::Ready;
            }),
        ));
        corruptions.push((
            "list length",
            Box::new(|w| {
                w.buckets.iter_mut().find(|b| b.len > 0).unwrap().len += 1;
            }),
        ));
        corruptions.push((
            "expiry missing",
            Box::new(|w| {
                let first = *w.expiries.first().unwrap();
                w.expiries.remove(&first);
            }),
        ));
        corruptions.push((
            "stale expiry",
            Box::new(|w| {
                w.expiries.insert((1, 0, 1));
            }),
        ));
        corruptions.push((
            "wrong bucket for its due tick",
            Box::new(move |w| {
                let i = index_in_bucket(w);
                w.task_mut(i).due_tick += 1;
            }),
        ));
        corruptions.push(("live count", Box::new(|w| w.live += 1)));
        corruptions.push((
            "overflow key",
            Box::new(|w| {
                let (&key, &index) = w.overflow.first_key_value().unwrap();
                w.overflow.remove(&key);
                w.overflow.insert((key.0 + 1, key.1), index);
            }),
        ));
        corruptions.push((
            "task stored nowhere",
            Box::new(|w| {
                w.overflow.clear();
            }),
        ));
        corruptions.push((
            "stored twice",
            Box::new(|w| {
                let (_, &index) = w.overflow.first_key_value().unwrap();
                let task = w.task(index).clone();
                w.ready.insert((0, Reverse(task.priority), task.seq), index);
            }),
        ));
        corruptions.push((
            "clock ran past a bucket",
            Box::new(|w| w.current_tick = 100),
        ));
        corruptions.push((
            "overdue in the future",
            Box::new(|w| {
                let i = w.overdue.head;
                w.task_mut(i).due_tick = 50;
            }),
        ));
        corruptions.push(("free list names a live task", Box::new(|w| w.free.push(0))));
        corruptions.push(("over capacity", Box::new(|w| w.config.tasks_max = 2)));
        for (name, corrupt) in &corruptions {
            let mut wheel = populated();
            corrupt(&mut wheel);
            assert!(wheel.check_invariants().is_err(), "{name} went unnoticed");
        }
    }
}
