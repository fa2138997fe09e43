//! The segment ("号段") allocator, Leaf/Tinyid style, as a sans-IO state machine per tag.
//!
//! **Double buffer.** The allocator issues from its current segment and starts fetching the
//! next one once `prefetch_used_pct` of the current one is used (Leaf: 10%), so issuance never
//! waits for the database in steady state. When both buffers are empty it says so
//! ([`Take::Pending`] or [`Take::Unavailable`]); the driver decides whether to wait or fail.
//!
//! **Fetching** is Tinyid's optimistic lock: read the tag (its version), then "allocate if the
//! version is still V"; a conflict re-reads, at most `cas_retries_max` times, then backs off
//! (bounded exponential). Every store call is an output ([`SegmentAllocator::poll_request`]);
//! its answer is an input ([`SegmentAllocator::handle_reply`]). Lost, late, duplicated answers
//! are harmless: answers are matched by request id and a timeout retries.
//!
//! **Claims and leases** (segment-ID design §3, docs/sources.md: 租约驱动分配, 状态快照,
//! 故障自愈). A grant carries a lease and an initial *claim*: the allocator issues only IDs
//! strictly below a claim the store has acknowledged, and raises the claim (with the lease) by
//! renewing ahead of need. When a lease expires unrenewed, the store returns the unclaimed tail
//! to the tag's pool — never an ID the holder may have issued, whatever the clocks say. On top
//! of that the holder stops using a segment whose lease it cannot prove valid by its *own
//! monotonic clock*: the lease is timed from when the request was sent, minus `drift_ms_max`
//! (Gray & Cheriton's leases).
//!
//! **Monotonic per instance.** Each request carries `min_id` (above every ID this instance may
//! have issued), so pooled tails below it are never granted to it.
//!
//! **Malformed replies** (outside the store's contract) are never issued from: a grant with a
//! zero `delta`, a reversed segment, one reaching past 2^62 or starting below the `min_id` asked
//! for is refused like a failed fetch; a claim outside its segment (a grant's or a renewal's) is
//! clamped into it. Both are counted ([`AllocatorStats::malformed_replies`]).
//!
//! **Degraded mode** (segment-ID design §6, off by default): with both buffers empty and the store
//! unreachable, issue Snowflake IDs with bit 62 set ([`DEGRADED_FLAG`]). Segment IDs stay below
//! 2^62, so the two can never collide. The degraded worker keeps a time reservation persisted
//! ahead while the store is reachable.
//!
//! Call order: `take_block`/`next_id` to issue; after any call, drain `poll_request` and perform
//! each call (see [`crate::id_store::StoreCall::execute`]); feed answers to `handle_reply`; sleep
//! until `poll_timeout` and call `handle_timeout`.

mod step;

pub use step::{LEAF_FAST_MS, LEAF_SLOW_MS, StepPolicy};

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::clock::Now;
use crate::edge::{Edges, Observed};
use crate::flaw::Flaw;
use crate::id_store::{
    AllocRequest, Grant, InstanceId, ReleaseRequest, RenewRequest, SEGMENT_ID_LIMIT, Segment,
    StoreCall, StoreError, StoreReply, Tag,
};
use crate::snowflake::{NextId, SnowflakeWorker, WorkerConfig};

/// The segment allocator's edge states, and the ID store's re-exported (see [`crate::edge`]);
/// each is reached where its doc says.
pub mod edges {
    use crate::edge::{Edge, Machine};

    pub use crate::id_store::edges::{VERSION_CONFLICT, ZOMBIE_TAIL_RECLAIMED};

    /// [`super::SegmentAllocator::take_block`] hands out the last ID of the current segment.
    pub const LAST_ID_WHILE_NEXT_UNLOADED: Edge = Edge::new(
        Machine::Segment,
        "segment.last_id_while_next_unloaded",
        "the last ID of the current segment is handed out while the next segment is not yet \
         loaded: the double buffer ran dry and the next ID must wait for (never invent) a grant",
    );
    /// [`super::SegmentAllocator::take_block`] finds both buffers empty.
    pub const EMPTY_WHILE_GRANTING: Edge = Edge::new(
        Machine::Segment,
        "segment.empty_while_granting",
        "an ID is asked for with both buffers empty between the read of max_id and the \
         acknowledged grant: issuing from what was read here is the counter_no_persist flaw",
    );
    /// [`super::SegmentAllocator::take_block`] answers `Pending` inside a segment.
    pub const CLAIM_EXHAUSTED: Edge = Edge::new(
        Machine::Segment,
        "segment.claim_exhausted",
        "the acknowledged claim is used up before the segment: the allocator must wait for the \
         renewal that raises it, since the store may reclaim everything above the claim",
    );
    /// [`super::SegmentAllocator::handle_reply`] gives up re-reading after conflicts.
    pub const CAS_RETRIES_SPENT: Edge = Edge::new(
        Machine::Segment,
        "segment.cas_retries_spent",
        "a fetch lost the version race cas_retries_max + 1 times in a row and backs off: the \
         retry budget is spent under contention",
    );
    /// [`super::SegmentAllocator::take_block`] answers `Unavailable` after failures.
    pub const UNAVAILABLE_AFTER_FAILURES: Edge = Edge::new(
        Machine::Segment,
        "segment.unavailable_after_failures",
        "both buffers are empty and failures_before_unavailable fetches in a row failed: the \
         allocator must refuse (or go degraded) rather than guess an ID",
    );
    /// [`super::SegmentAllocator`] drops a segment whose lease it can no longer prove.
    pub const LEASE_EXPIRED_UNISSUED: Edge = Edge::new(
        Machine::Segment,
        "segment.lease_expired_unissued",
        "a segment with unissued IDs outlives its lease by the holder's own clock (minus the \
         drift margin) and is dropped: a zombie that kept issuing would overlap the reclaimed \
         tail (reclaim_no_drift_margin)",
    );
    /// [`super::SegmentAllocator`] installs a grant drawn from the reclaim pool.
    pub const POOL_GRANT: Edge = Edge::new(
        Machine::Segment,
        "segment.pool_grant",
        "an allocator is granted a zombie's reclaimed tail instead of fresh IDs: safe only if \
         the tail holds nothing the zombie claimed and lies above this allocator's own IDs",
    );
    /// [`super::SegmentAllocator::handle_reply`] reads a tag others have already granted from.
    pub const FRESH_ALLOCATOR_FINDS_GRANTS: Edge = Edge::new(
        Machine::Segment,
        "segment.fresh_allocator_finds_grants",
        "a newly started allocator (a restart or a newcomer) reads a tag that earlier grants \
         already moved: it rebuilds its position from the store alone and must not reuse what \
         its predecessors issued",
    );
}

/// This machine's edge states (see [`crate::edge`]).
pub const EDGES: &[crate::edge::Edge] = &[
    edges::LAST_ID_WHILE_NEXT_UNLOADED,
    edges::EMPTY_WHILE_GRANTING,
    edges::CLAIM_EXHAUSTED,
    edges::VERSION_CONFLICT,
    edges::CAS_RETRIES_SPENT,
    edges::UNAVAILABLE_AFTER_FAILURES,
    edges::LEASE_EXPIRED_UNISSUED,
    edges::POOL_GRANT,
    edges::ZOMBIE_TAIL_RECLAIMED,
    edges::FRESH_ALLOCATOR_FINDS_GRANTS,
];

/// Bit 62: set on every degraded-mode ID, never on a segment ID.
pub const DEGRADED_FLAG: u64 = 1 << 62;

/// Namespace of degraded-mode worker leases.
pub const DEGRADED_NAMESPACE: &str = "degraded";

/// Degraded-mode settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DegradedConfig {
    /// The Snowflake worker (its layout must fit in 62 bits).
    pub worker: WorkerConfig,
    /// A worker id leased in [`DEGRADED_NAMESPACE`].
    pub worker_id: u32,
    /// The reservation that lease carried.
    pub reserved_ts: u64,
}

/// Allocator settings. Names carry their unit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocatorConfig {
    /// The tag.
    pub tag: Tag,
    /// This process incarnation.
    pub instance: InstanceId,
    /// Step policy.
    pub step: StepPolicy,
    /// Start fetching the next segment when this share (percent) of the current one is used.
    pub prefetch_used_pct: u8,
    /// Each claim covers this share (percent) of the segment.
    pub claim_pct: u8,
    /// Lease length asked of the store.
    pub lease_ms: u64,
    /// The most the holder's clock may run slow against the store's over a lease.
    pub drift_ms_max: u64,
    /// Renew each held segment's lease this often.
    pub renew_interval_ms: u64,
    /// An unanswered store call is given up after this long.
    pub request_timeout_ms: u64,
    /// Version conflicts retried before backing off.
    pub cas_retries_max: u32,
    /// First backoff after a failure; doubles per consecutive failure.
    pub backoff_ms: u64,
    /// Backoff cap.
    pub backoff_ms_max: u64,
    /// Consecutive failed fetches after which an empty allocator answers `Unavailable`
    /// instead of `Pending`.
    pub failures_before_unavailable: u32,
    /// Degraded mode, off by default.
    pub degraded: Option<DegradedConfig>,
    /// A documented flaw to switch on (off by default): [`Flaw::SegmentNoVersionCheck`],
    /// [`Flaw::CounterNoPersist`] or [`Flaw::ReclaimNoDriftMargin`]; others are ignored here.
    #[serde(default)]
    pub flaw: Option<Flaw>,
}

impl AllocatorConfig {
    /// Defaults after Leaf and the segment-ID design: 10% prefetch, 30 s leases, 3 conflict
    /// retries, 50 ms backoff.
    #[must_use]
    pub fn new(tag: &str, instance: InstanceId) -> Self {
        Self {
            tag: tag.to_owned(),
            instance,
            step: StepPolicy::default(),
            prefetch_used_pct: 10,
            claim_pct: 25,
            lease_ms: 30_000,
            drift_ms_max: 1_000,
            renew_interval_ms: 5_000,
            request_timeout_ms: 1_000,
            cas_retries_max: 3,
            backoff_ms: 50,
            backoff_ms_max: 2_000,
            failures_before_unavailable: 3,
            degraded: None,
            flaw: None,
        }
    }

    /// Checks the settings, naming the offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &str, reason: String| {
            Err(ConfigError {
                field: field.to_owned(),
                reason,
            })
        };
        if self.tag.is_empty() {
            return bad("tag", "must not be empty".into());
        }
        if !(1..=100).contains(&self.prefetch_used_pct) {
            return bad(
                "prefetch_used_pct",
                format!("{} is not within 1..=100", self.prefetch_used_pct),
            );
        }
        if !(1..=100).contains(&self.claim_pct) {
            return bad(
                "claim_pct",
                format!("{} is not within 1..=100", self.claim_pct),
            );
        }
        if self.lease_ms <= self.drift_ms_max.saturating_mul(2) {
            return bad(
                "lease_ms",
                format!(
                    "{} must exceed twice drift_ms_max ({})",
                    self.lease_ms, self.drift_ms_max
                ),
            );
        }
        if self.renew_interval_ms == 0
            || self.renew_interval_ms >= self.lease_ms - self.drift_ms_max
        {
            return bad(
                "renew_interval_ms",
                format!(
                    "{} must be positive and below the usable lease",
                    self.renew_interval_ms
                ),
            );
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms", "must be positive".into());
        }
        if let StepPolicy::Fixed { step }
        | StepPolicy::Leaf { step_max: step }
        | StepPolicy::SeedLog { step_max: step, .. } = self.step
            && step >= SEGMENT_ID_LIMIT
        {
            return bad("step", format!("{step} exceeds the ID space"));
        }
        if let Some(degraded) = &self.degraded
            && let Err(err) = degraded.worker.layout.validate(62)
        {
            return bad("degraded.worker.layout", err.to_string());
        }
        Ok(())
    }
}

/// A configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
#[error("invalid allocator config `{field}`: {reason}")]
pub struct ConfigError {
    /// The field.
    pub field: String,
    /// Why.
    pub reason: String,
}

/// A store call with the id its answer must carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Request {
    /// Matches the answer to the call.
    pub id: u64,
    /// The call.
    pub call: StoreCall,
}

/// IDs handed out at once: `start, start + delta, …` (`count` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdBlock {
    /// First ID.
    pub start: u64,
    /// How many.
    pub count: u64,
    /// Distance between IDs.
    pub delta: u64,
}

impl IdBlock {
    /// The IDs, lowest first.
    pub fn ids(&self) -> impl Iterator<Item = u64> + use<> {
        let Self {
            start,
            count,
            delta,
        } = *self;
        (0..count).map(move |k| start + k * delta)
    }

    /// The last ID.
    #[must_use]
    pub fn last(&self) -> u64 {
        self.start + (self.count - 1) * self.delta
    }
}

/// Why an empty allocator cannot issue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum Unavailable {
    /// The store failed this many times in a row; the last error is attached.
    #[error("store unreachable after {failures} failed fetches: {last_error}")]
    StoreUnreachable {
        /// Consecutive failures.
        failures: u32,
        /// The last error.
        last_error: String,
    },
    /// The store answered with a permanent error (unknown tag, ID space exhausted).
    #[error("{0}")]
    Permanent(StoreError),
}

/// What [`SegmentAllocator::take_block`] decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[must_use]
pub enum Take {
    /// IDs to hand out.
    Block(IdBlock),
    /// A degraded-mode Snowflake ID (bit 62 set).
    Degraded(u64),
    /// Both buffers are empty (or the claim is exhausted) and a store call is in flight:
    /// retry after the next reply or timeout.
    Pending,
    /// Both buffers are empty and the store is failing.
    Unavailable(Unavailable),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct InFlight {
    id: u64,
    sent_mono: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Fetch {
    Idle,
    Backoff {
        until_mono: u64,
    },
    Reading {
        flight: InFlight,
        conflicts: u32,
    },
    Allocating {
        flight: InFlight,
        conflicts: u32,
        /// The `min_id` the Allocate asked for: a grant below it is refused.
        min_id: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Held {
    segment: Segment,
    /// Next ID to issue; `>= segment.end` once used up.
    next: u64,
    /// Acknowledged claim: IDs strictly below may be issued.
    claim_end: u64,
    /// The lease as this holder can prove it, on its own monotonic clock.
    lease_deadline_mono: u64,
    granted_mono: u64,
    renew_due_mono: u64,
    renewing: Option<InFlight>,
}

impl Held {
    fn used_up(&self) -> bool {
        self.next >= self.segment.end
    }

    /// The last ID issued from this buffer (`next` steps by `delta` from the start, and may end
    /// past the claim or the segment's end when either is off the residue class).
    fn last_issued(&self) -> Option<u64> {
        (self.next > self.segment.start).then(|| self.next - self.segment.delta)
    }

    fn used_pct(&self) -> u64 {
        let used =
            (self.next.min(self.segment.end) - self.segment.start).div_ceil(self.segment.delta);
        percent(used, self.segment.len().max(1))
    }
}

/// `part` as a whole percentage of `whole` (rounded down), for any `part <= whole`: the product
/// is taken in `u128`, so a segment of up to 2^62 IDs cannot overflow it.
fn percent(part: u64, whole: u64) -> u64 {
    assert!(whole > 0 && part <= whole, "{part} of {whole}");
    let pct = u128::from(part) * 100 / u128::from(whole);
    u64::try_from(pct).expect("at most 100")
}

/// `pct` percent of `n` (rounded down), for any `n` and `pct <= 100`: the product is taken in
/// `u128`, so a legal step near 2^62 cannot overflow it, and the result is at most `n`.
fn pct_of(n: u64, pct: u8) -> u64 {
    assert!(pct <= 100, "{pct}%");
    let share = u128::from(n) * u128::from(pct) / 100;
    u64::try_from(share).expect("at most n")
}

/// Counters for the health view and fault coverage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocatorStats {
    /// IDs issued from segments.
    pub issued: u64,
    /// IDs issued in degraded mode.
    pub degraded_issued: u64,
    /// Segments granted.
    pub reloads: u64,
    /// Segments granted from the reclaim pool.
    pub pool_grants: u64,
    /// Switches from an exhausted segment to the next buffer.
    pub buffer_switches: u64,
    /// Version conflicts seen (each retried or backed off).
    pub conflicts: u64,
    /// Fetches that failed (error or timeout).
    pub fetch_failures: u64,
    /// Segments dropped because the store said the lease was lost.
    pub leases_lost: u64,
    /// Segments dropped because the lease could no longer be proven valid locally.
    pub leases_expired: u64,
    /// IDs given up with dropped segments (claimed but never issued: a gap, never a duplicate).
    pub ids_abandoned: u64,
    /// Store replies outside the store's contract: grants refused (each also a failed fetch)
    /// and claims clamped into their segment.
    #[serde(default)]
    pub malformed_replies: u64,
    /// The largest jump between consecutive issued IDs, beyond the normal `delta`.
    pub largest_gap: u64,
    /// Times an empty allocator answered `Pending`.
    pub pending: u64,
    /// Times an empty allocator answered `Unavailable`.
    pub unavailable: u64,
}

/// One buffer in the health view.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferView {
    /// The segment.
    pub segment: Segment,
    /// Next ID to issue.
    pub next: u64,
    /// Acknowledged claim.
    pub claim_end: u64,
    /// Share of the segment still unissued, in percent.
    pub remaining_pct: u64,
    /// Milliseconds of provable lease left (0 if expired).
    pub lease_left_ms: u64,
}

/// The health snapshot of one tag (Leaf's `/cache`, the segment-ID design's `/id/health`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Health {
    /// The tag.
    pub tag: Tag,
    /// The holder.
    pub instance: InstanceId,
    /// The buffer being issued from.
    pub current: Option<BufferView>,
    /// The prefetched buffer.
    pub next: Option<BufferView>,
    /// The step the next fetch asks for.
    pub step: u64,
    /// `fetching`, `backoff` or `idle`.
    pub fetch: String,
    /// The last ID issued from a segment.
    pub last_issued: Option<u64>,
    /// Counters.
    pub stats: AllocatorStats,
    /// The last store error, if the last fetch failed.
    pub last_error: Option<String>,
}

/// The allocator of one tag in one process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SegmentAllocator {
    cfg: AllocatorConfig,
    current: Option<Held>,
    next: Option<Held>,
    fetch: Fetch,
    /// Step of the next fetch (0 until the tag's database step is known).
    step: u64,
    tag_step: u64,
    consecutive_failures: u32,
    last_error: Option<StoreError>,
    last_issued: Option<u64>,
    next_request_id: u64,
    outbox: VecDeque<Request>,
    degraded: Option<SnowflakeWorker>,
    degraded_reservation: Option<InFlight>,
    stats: AllocatorStats,
    /// Arrivals at its edge states since its driver last took them (a ghost: not its state).
    #[serde(skip)]
    edges: Edges,
}

/// The most store calls that can be queued at once: one fetch, a renewal and a release per
/// buffer, a degraded reservation.
const OUTBOX_MAX: usize = 8;

impl Observed for SegmentAllocator {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
        if let Some(degraded) = self.degraded.as_mut() {
            degraded.take_edges(into);
        }
    }
}

impl SegmentAllocator {
    /// A new, empty allocator. `now` is the process's clock at start-up.
    pub fn new(cfg: AllocatorConfig, now: Now) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let degraded = match &cfg.degraded {
            None => None,
            Some(d) => Some(
                SnowflakeWorker::with_flag(
                    d.worker,
                    d.worker_id,
                    d.reserved_ts,
                    now.wall_ms,
                    DEGRADED_FLAG,
                    62,
                )
                .map_err(|err| ConfigError {
                    field: "degraded".into(),
                    reason: err.to_string(),
                })?,
            ),
        };
        Ok(Self {
            current: None,
            next: None,
            fetch: Fetch::Idle,
            step: 0,
            tag_step: 0,
            consecutive_failures: 0,
            last_error: None,
            last_issued: None,
            // Request ids are unique across incarnations (a restarted process may receive
            // answers meant for its predecessor): the instance id is the high half.
            next_request_id: (cfg.instance.0 << 32) | 1,
            outbox: VecDeque::new(),
            degraded,
            degraded_reservation: None,
            stats: AllocatorStats::default(),
            edges: Edges::default(),
            cfg,
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &AllocatorConfig {
        &self.cfg
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// The last ID issued from a segment.
    #[must_use]
    pub fn last_issued(&self) -> Option<u64> {
        self.last_issued
    }

    /// Checks the allocator's invariants: each buffer's segment is one the store could grant
    /// (a positive `delta`, below 2^62), its claim lies inside it, every ID issued from it lies
    /// strictly below the claim the store acknowledged, the prefetched buffer lies above
    /// everything issued, at most one store call per purpose is queued, every call in flight has
    /// an id below the next one, and the degraded worker's
    /// ([`SnowflakeWorker::check_invariants`]). For simulators (after every step in debug
    /// builds), models (an `always` property) and tests.
    ///
    /// # Errors
    /// The first violation, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (name, held) in [("current", &self.current), ("next", &self.next)] {
            if let Some(held) = held {
                self.check_held(name, held)?;
            }
        }
        if let (Some(next), Some(last)) = (&self.next, self.last_issued)
            && next.next <= last
            && self.cfg.flaw.is_none()
        {
            return Err(format!(
                "the prefetched buffer would issue {} after {last} was issued",
                next.next
            ));
        }
        if self.outbox.len() > OUTBOX_MAX {
            return Err(format!(
                "{} store calls queued (most {OUTBOX_MAX})",
                self.outbox.len()
            ));
        }
        let flights = [self.fetch_flight(), self.degraded_reservation.as_ref()];
        if let Some(f) = flights
            .into_iter()
            .flatten()
            .find(|f| f.id >= self.next_request_id)
        {
            return Err(format!(
                "call {} in flight, next id {}",
                f.id, self.next_request_id
            ));
        }
        self.degraded
            .as_ref()
            .map_or(Ok(()), SnowflakeWorker::check_invariants)
    }

    fn fetch_flight(&self) -> Option<&InFlight> {
        match &self.fetch {
            Fetch::Reading { flight, .. } | Fetch::Allocating { flight, .. } => Some(flight),
            Fetch::Idle | Fetch::Backoff { .. } => None,
        }
    }

    fn check_held(&self, name: &str, held: &Held) -> Result<(), String> {
        let segment = held.segment;
        if segment.delta == 0 || segment.end > SEGMENT_ID_LIMIT {
            return Err(format!(
                "{name} buffer: {segment:?} was granted outside the store's contract"
            ));
        }
        if held.claim_end < segment.start || held.claim_end > segment.end {
            return Err(format!(
                "{name} buffer: claim {} outside {segment:?}",
                held.claim_end
            ));
        }
        if held.next < segment.start {
            return Err(format!(
                "{name} buffer: next {} below {segment:?}",
                held.next
            ));
        }
        if let Some(last) = held.last_issued()
            && last >= held.claim_end
            && self.cfg.flaw.is_none()
        {
            return Err(format!(
                "{name} buffer: issued {last} beyond the acknowledged claim {}",
                held.claim_end
            ));
        }
        if let Some(renewing) = &held.renewing
            && renewing.id >= self.next_request_id
        {
            return Err(format!(
                "{name} buffer: renewal {} not yet made",
                renewing.id
            ));
        }
        Ok(())
    }

    /// One ID (see [`Self::take_block`]).
    pub fn next_id(&mut self, now: Now) -> Take {
        self.take_block(now, 1)
    }

    /// Up to `max` IDs from the current segment (fewer at a segment or claim boundary).
    pub fn take_block(&mut self, now: Now, max: u64) -> Take {
        let take = self.take_block_step(now, max);
        self.debug_holds();
        take
    }

    fn debug_holds(&self) {
        crate::check::debug_holds("segment allocator", || self.check_invariants());
    }

    fn take_block_step(&mut self, now: Now, max: u64) -> Take {
        debug_assert!(max > 0);
        self.expire(now);
        // Each pass either issues or retires a buffer; two buffers bound the loop.
        for _ in 0..3 {
            let Some(cur) = self.current.as_mut() else {
                if let Some(next) = self.next.take() {
                    self.current = Some(next);
                    self.stats.buffer_switches += 1;
                    continue;
                }
                break;
            };
            if cur.used_up() {
                self.retire_current(now);
                continue;
            }
            let limit = if issues_beyond_claim(self.cfg.flaw) {
                cur.segment.end
            } else {
                cur.claim_end
            };
            if cur.next < limit {
                let delta = cur.segment.delta;
                let count = ((limit - cur.next).div_ceil(delta)).min(max);
                let block = IdBlock {
                    start: cur.next,
                    count,
                    delta,
                };
                cur.next = cur.next.saturating_add(count * delta);
                let ran_dry = cur.used_up() && self.next.is_none();
                self.edges
                    .reach_if(ran_dry, &edges::LAST_ID_WHILE_NEXT_UNLOADED);
                self.note_issued(&block);
                self.maybe_prefetch(now);
                self.maybe_extend_claims(now);
                return Take::Block(block);
            }
            // Claim exhausted before the segment: wait for the renewal that raises it.
            self.edges.reach(&edges::CLAIM_EXHAUSTED);
            self.maybe_extend_claims(now);
            self.stats.pending += 1;
            return Take::Pending;
        }
        self.edges.reach_if(
            matches!(self.fetch, Fetch::Allocating { .. }),
            &edges::EMPTY_WHILE_GRANTING,
        );
        self.start_fetch_if_needed(now);
        self.empty_answer(now)
    }

    fn empty_answer(&mut self, now: Now) -> Take {
        let permanent = matches!(
            self.last_error,
            Some(
                StoreError::UnknownTag(_)
                    | StoreError::Exhausted(_)
                    | StoreError::InvalidSpec { .. }
            )
        );
        let failing =
            permanent || self.consecutive_failures >= self.cfg.failures_before_unavailable;
        if !failing {
            self.stats.pending += 1;
            return Take::Pending;
        }
        self.edges
            .reach_if(!permanent, &edges::UNAVAILABLE_AFTER_FAILURES);
        if let Some(worker) = self.degraded.as_mut()
            && let Ok(NextId::Id(id)) = worker.next_id(now.wall_ms)
        {
            debug_assert!(id & DEGRADED_FLAG != 0);
            self.stats.degraded_issued += 1;
            return Take::Degraded(id);
        }
        self.stats.unavailable += 1;
        let last_error = self
            .last_error
            .clone()
            .unwrap_or(StoreError::Backend("timeout".into()));
        Take::Unavailable(if permanent {
            Unavailable::Permanent(last_error)
        } else {
            Unavailable::StoreUnreachable {
                failures: self.consecutive_failures,
                last_error: last_error.to_string(),
            }
        })
    }

    fn note_issued(&mut self, block: &IdBlock) {
        if let Some(last) = self.last_issued {
            debug_assert!(
                block.start > last || self.cfg.flaw.is_some(),
                "IDs of one allocator must increase: {} after {last}",
                block.start
            );
            let gap = block.start.saturating_sub(last).saturating_sub(block.delta);
            self.stats.largest_gap = self.stats.largest_gap.max(gap);
        }
        self.last_issued = Some(block.last());
        self.stats.issued += block.count;
    }

    /// The current segment is used up: release its lease, learn from its lifetime, switch.
    fn retire_current(&mut self, now: Now) {
        let Some(done) = self.current.take() else {
            return;
        };
        let lasted_ms = now.mono_ms.saturating_sub(done.granted_mono);
        self.step = self.cfg.step.next(
            self.step.max(1),
            self.tag_step,
            done.segment.len(),
            lasted_ms,
        );
        self.push(StoreCall::Release(ReleaseRequest {
            tag: self.cfg.tag.clone(),
            instance: self.cfg.instance,
            segment_start: done.segment.start,
            used_end: done.segment.end,
        }));
        if let Some(next) = self.next.take() {
            self.current = Some(next);
            self.stats.buffer_switches += 1;
        }
    }

    /// Drops buffers whose lease can no longer be proven valid.
    fn expire(&mut self, now: Now) {
        for slot in [&mut self.current, &mut self.next] {
            if let Some(held) = slot
                && held.lease_deadline_mono <= now.mono_ms
            {
                self.edges
                    .reach_if(!held.used_up(), &edges::LEASE_EXPIRED_UNISSUED);
                self.stats.leases_expired += 1;
                self.stats.ids_abandoned += Self::unissued(held);
                *slot = None;
            }
        }
    }

    fn unissued(held: &Held) -> u64 {
        if held.next >= held.claim_end {
            0
        } else {
            (held.claim_end - held.next).div_ceil(held.segment.delta)
        }
    }

    fn needs_fetch(&self) -> bool {
        match (&self.current, &self.next) {
            (None, None) => true,
            (Some(cur), None) => cur.used_pct() >= u64::from(self.cfg.prefetch_used_pct),
            (_, Some(_)) => false,
        }
    }

    fn maybe_prefetch(&mut self, now: Now) {
        if self.needs_fetch() {
            self.start_fetch_if_needed(now);
        }
    }

    fn start_fetch_if_needed(&mut self, now: Now) {
        if matches!(self.fetch, Fetch::Idle) && self.needs_fetch() {
            let id = self.push(StoreCall::Read {
                tag: self.cfg.tag.clone(),
            });
            self.fetch = Fetch::Reading {
                flight: InFlight {
                    id,
                    sent_mono: now.mono_ms,
                },
                conflicts: 0,
            };
        }
    }

    /// Raises a claim running low and renews leases that are due.
    fn maybe_extend_claims(&mut self, now: Now) {
        let mut calls = Vec::new();
        for held in [&mut self.current, &mut self.next].into_iter().flatten() {
            if held.renewing.is_some() {
                continue;
            }
            let chunk = pct_of(held.segment.len(), self.cfg.claim_pct)
                .max(1)
                .saturating_mul(held.segment.delta);
            if issues_beyond_claim(self.cfg.flaw) {
                // The flaw: the claim is an after-the-fact usage report, sent on the renewal
                // schedule.
                if held.renew_due_mono <= now.mono_ms {
                    calls.push((held.segment.start, held.next.min(held.segment.end)));
                }
                continue;
            }
            let low = held.claim_end < held.segment.end
                && held.claim_end.saturating_sub(held.next) < chunk / 2 + 1;
            if low || held.renew_due_mono <= now.mono_ms {
                let claim_end = if low {
                    held.claim_end.saturating_add(chunk).min(held.segment.end)
                } else {
                    held.claim_end
                };
                calls.push((held.segment.start, claim_end));
            }
        }
        for (segment_start, claim_end) in calls {
            let id = self.push(StoreCall::Renew(RenewRequest {
                tag: self.cfg.tag.clone(),
                instance: self.cfg.instance,
                segment_start,
                claim_end,
                lease_ms: self.cfg.lease_ms,
                now_ms: now.wall_ms,
            }));
            if let Some(held) = self.held_mut(segment_start) {
                held.renewing = Some(InFlight {
                    id,
                    sent_mono: now.mono_ms,
                });
            }
        }
    }

    fn held_mut(&mut self, segment_start: u64) -> Option<&mut Held> {
        [self.current.as_mut(), self.next.as_mut()]
            .into_iter()
            .flatten()
            .find(|h| h.segment.start == segment_start)
    }

    fn push(&mut self, call: StoreCall) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        if self.outbox.len() >= OUTBOX_MAX {
            // The driver is not draining; the oldest call's answer would be ignored anyway
            // once its timeout passes, so dropping it is the same as losing it on the wire.
            self.outbox.pop_front();
        }
        self.outbox.push_back(Request { id, call });
        id
    }

    /// The next store call to perform.
    #[must_use]
    pub fn poll_request(&mut self) -> Option<Request> {
        self.outbox.pop_front()
    }

    /// The answer to request `id`.
    pub fn handle_reply(&mut self, id: u64, reply: StoreReply, now: Now) {
        match reply {
            StoreReply::Read(result) => self.on_read(id, result, now),
            StoreReply::Allocate(result) => self.on_allocate(id, result, now),
            StoreReply::Renew(result) => self.on_renew(id, result, now),
            StoreReply::Release(_) => {}
            StoreReply::Worker(result) => self.on_worker(id, result),
        }
        self.debug_holds();
    }

    fn on_read(&mut self, id: u64, result: Result<crate::id_store::TagRow, StoreError>, now: Now) {
        let Fetch::Reading { flight, conflicts } = &self.fetch else {
            return;
        };
        if flight.id != id {
            return;
        }
        let conflicts = *conflicts;
        if let Ok(row) = &result {
            let fresh = self.stats.reloads == 0 && self.last_issued.is_none();
            self.edges.reach_if(
                fresh && row.version > 0,
                &edges::FRESH_ALLOCATOR_FINDS_GRANTS,
            );
        }
        match result {
            Ok(row) if self.cfg.flaw == Some(Flaw::CounterNoPersist) => {
                self.use_before_persist(&row, now);
            }
            Ok(row) => self.send_allocate(&row, conflicts, now),
            Err(err) => self.fetch_failed(err, now),
        }
    }

    /// FLAW [`Flaw::CounterNoPersist`]: take `[max_id, max_id + step)` as read and start
    /// issuing from it at once; the write of the new `max_id` follows and its outcome is
    /// ignored (an anti-pattern of the segment-ID design: a local `AtomicLong` never synced
    /// with the database).
    fn use_before_persist(&mut self, row: &crate::id_store::TagRow, now: Now) {
        self.send_allocate(row, self.cfg.cas_retries_max, now);
        if row.delta == 0 {
            // A malformed row: not even the flaw can issue from it.
            return;
        }
        let span = self.step.saturating_mul(row.delta);
        let end = row.max_id.saturating_add(span).min(SEGMENT_ID_LIMIT);
        if end <= row.max_id {
            return;
        }
        let held = Held {
            segment: Segment {
                start: row.max_id,
                end,
                delta: row.delta,
            },
            next: row.max_id,
            claim_end: end,
            lease_deadline_mono: now.mono_ms + self.cfg.lease_ms - self.cfg.drift_ms_max,
            granted_mono: now.mono_ms,
            renew_due_mono: now.mono_ms + self.cfg.renew_interval_ms,
            renewing: None,
        };
        self.stats.reloads += 1;
        if self.current.is_none() {
            self.current = Some(held);
        } else if self.next.is_none() {
            self.next = Some(held);
        }
    }

    fn send_allocate(&mut self, row: &crate::id_store::TagRow, conflicts: u32, now: Now) {
        self.tag_step = row.step;
        if self.step == 0 {
            self.step = self.cfg.step.initial(row.step);
        }
        let claim_ids = if issues_beyond_claim(self.cfg.flaw) {
            // The flaw: nothing is claimed ahead; usage is reported after the fact.
            1
        } else {
            pct_of(self.step, self.cfg.claim_pct).max(1)
        };
        let min_id = self.min_id();
        let id = self.push(StoreCall::Allocate(AllocRequest {
            tag: self.cfg.tag.clone(),
            expected_version: row.version,
            ids: self.step,
            min_id,
            claim_ids,
            instance: self.cfg.instance,
            lease_ms: self.cfg.lease_ms,
            now_ms: now.wall_ms,
            blind_max_id: (self.cfg.flaw == Some(Flaw::SegmentNoVersionCheck))
                .then_some(row.max_id),
        }));
        self.fetch = Fetch::Allocating {
            flight: InFlight {
                id,
                sent_mono: now.mono_ms,
            },
            conflicts,
            min_id,
        };
    }

    /// Above every ID this instance has issued or may issue from what it holds.
    fn min_id(&self) -> u64 {
        let held_end = [&self.current, &self.next]
            .into_iter()
            .flatten()
            .map(|h| h.segment.end)
            .max()
            .unwrap_or(0);
        held_end.max(self.last_issued.map_or(0, |last| last + 1))
    }

    fn on_allocate(&mut self, id: u64, result: Result<Grant, StoreError>, now: Now) {
        let Fetch::Allocating {
            flight,
            conflicts,
            min_id,
        } = &self.fetch
        else {
            return;
        };
        if flight.id != id {
            return;
        }
        let (sent_mono, conflicts, min_id) = (flight.sent_mono, *conflicts, *min_id);
        if self.cfg.flaw == Some(Flaw::CounterNoPersist) {
            // The flaw: the segment is already in use; whatever the write did is not looked at.
            self.fetch = Fetch::Idle;
            if result.is_ok() {
                self.consecutive_failures = 0;
                self.last_error = None;
            }
            return;
        }
        match result {
            Ok(grant) => match self.refusal(&grant, min_id) {
                None => self.install_grant(&grant, sent_mono, now),
                Some(why) => self.refuse_grant(&why, now),
            },
            Err(err @ StoreError::VersionConflict { .. }) => {
                self.stats.conflicts += 1;
                if conflicts < self.cfg.cas_retries_max {
                    // Re-read (Tinyid): the version moved, and so may have `max_id` and the pool.
                    let id = self.push(StoreCall::Read {
                        tag: self.cfg.tag.clone(),
                    });
                    self.fetch = Fetch::Reading {
                        flight: InFlight {
                            id,
                            sent_mono: now.mono_ms,
                        },
                        conflicts: conflicts + 1,
                    };
                } else {
                    self.edges.reach(&edges::CAS_RETRIES_SPENT);
                    self.fetch_failed(err, now);
                }
            }
            Err(err) => self.fetch_failed(err, now),
        }
    }

    /// Why `grant`, the answer to an Allocate that asked for `min_id`, lies outside the store's
    /// contract so that nothing may be issued from it (`None`: it may be installed). A store
    /// grants a segment with a positive `delta`, in order, below [`SEGMENT_ID_LIMIT`] (bit 62
    /// marks degraded-mode IDs), at or above `min_id`. Its claim is not looked at here: one
    /// outside the segment is clamped into it ([`clamp_claim`]).
    fn refusal(&self, grant: &Grant, min_id: u64) -> Option<String> {
        let segment = grant.segment;
        if segment.delta == 0 {
            return Some(format!("{segment:?} has delta 0"));
        }
        if segment.end < segment.start {
            return Some(format!("{segment:?} ends before it starts"));
        }
        if segment.end > SEGMENT_ID_LIMIT {
            return Some(format!(
                "{segment:?} reaches past the segment ID limit 2^62"
            ));
        }
        // FLAW [`Flaw::SegmentNoVersionCheck`]: the blind write grants from the `max_id` read,
        // whatever `min_id` said (another holder may have set it back); the flaw installs it.
        let blind = self.cfg.flaw == Some(Flaw::SegmentNoVersionCheck);
        let floor = min_id.max(self.min_id());
        if segment.start < floor && !blind {
            return Some(format!(
                "{segment:?} starts below {floor}, the least ID this instance may still issue"
            ));
        }
        None
    }

    /// A grant outside the store's contract is refused like a failed fetch (counted, backed off,
    /// read again); its lease, if the store recorded one, expires and is reclaimed. No Release is
    /// sent: it could not truthfully promise what was issued from a segment this instance may
    /// already have issued from.
    fn refuse_grant(&mut self, why: &str, now: Now) {
        self.stats.malformed_replies += 1;
        self.fetch_failed(
            StoreError::Backend(format!("malformed grant refused: {why}")),
            now,
        );
    }

    /// Puts a granted segment in the free buffer (current first, then next); the fetch is done.
    /// The grant passed [`Self::refusal`].
    fn install_grant(&mut self, grant: &Grant, sent_mono: u64, now: Now) {
        assert!(grant.segment.delta > 0 && grant.segment.end <= SEGMENT_ID_LIMIT);
        let claim_end = clamp_claim(&mut self.stats, &grant.segment, grant.claim_end);
        let lease_deadline_mono = if self.cfg.flaw == Some(Flaw::ReclaimNoDriftMargin) {
            // The flaw: timed from the answer, with no drift margin.
            now.mono_ms + self.cfg.lease_ms
        } else {
            sent_mono + self.cfg.lease_ms - self.cfg.drift_ms_max
        };
        let held = Held {
            segment: grant.segment,
            next: grant.segment.start,
            claim_end,
            lease_deadline_mono,
            granted_mono: now.mono_ms,
            renew_due_mono: now.mono_ms + self.cfg.renew_interval_ms,
            renewing: None,
        };
        self.stats.reloads += 1;
        self.stats.pool_grants += u64::from(grant.from_pool);
        self.edges.reach_if(grant.from_pool, &edges::POOL_GRANT);
        if self.current.is_none() {
            self.current = Some(held);
        } else if self.next.is_none() {
            self.next = Some(held);
        } else {
            // Both buffers full (cannot happen: fetches start only with a free buffer).
            debug_assert!(false, "grant with both buffers full");
        }
        self.fetch = Fetch::Idle;
        self.consecutive_failures = 0;
        self.last_error = None;
    }

    fn fetch_failed(&mut self, err: StoreError, now: Now) {
        self.stats.fetch_failures += 1;
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.last_error = Some(err);
        let exponent = (self.consecutive_failures - 1).min(16);
        let backoff_ms = self
            .cfg
            .backoff_ms
            .saturating_mul(1 << exponent)
            .min(self.cfg.backoff_ms_max);
        self.fetch = Fetch::Backoff {
            until_mono: now.mono_ms + backoff_ms,
        };
    }

    fn on_renew(&mut self, id: u64, result: Result<crate::id_store::Lease, StoreError>, now: Now) {
        let Some(slot) = [&mut self.current, &mut self.next]
            .into_iter()
            .find(|slot| {
                slot.as_ref()
                    .is_some_and(|h| h.renewing.as_ref().is_some_and(|f| f.id == id))
            })
        else {
            return;
        };
        let held = slot.as_mut().expect("found above");
        let sent_mono = held.renewing.take().map_or(now.mono_ms, |f| f.sent_mono);
        match result {
            Ok(lease) => {
                // Never lowered (a stale lease is older news); past the segment's end, clamped.
                let claim_end = clamp_claim(&mut self.stats, &held.segment, lease.claim_end);
                held.claim_end = held.claim_end.max(claim_end);
                let deadline = if self.cfg.flaw == Some(Flaw::ReclaimNoDriftMargin) {
                    now.mono_ms + self.cfg.lease_ms
                } else {
                    sent_mono + self.cfg.lease_ms - self.cfg.drift_ms_max
                };
                held.lease_deadline_mono = held.lease_deadline_mono.max(deadline);
                held.renew_due_mono = now.mono_ms + self.cfg.renew_interval_ms;
            }
            Err(StoreError::LeaseLost { .. }) => {
                self.stats.leases_lost += 1;
                self.stats.ids_abandoned += Self::unissued(held);
                *slot = None;
            }
            Err(_) => {
                // Try again soon; the lease deadline still bounds how long the segment is used.
                held.renew_due_mono = now.mono_ms + self.cfg.backoff_ms;
            }
        }
    }

    fn on_worker(&mut self, id: u64, result: Result<crate::id_store::WorkerLease, StoreError>) {
        if self
            .degraded_reservation
            .as_ref()
            .is_none_or(|f| f.id != id)
        {
            return;
        }
        self.degraded_reservation = None;
        let Some(worker) = self.degraded.as_mut() else {
            return;
        };
        match result {
            Ok(lease) => worker.handle_reserved(lease.reserved_ts),
            Err(StoreError::WorkerLeaseLost { .. }) => worker.handle_lease_lost(),
            Err(_) => worker.handle_reservation_failed(),
        }
    }

    /// Keeps the degraded worker's time reservation ahead while the store is reachable.
    fn reserve_degraded(&mut self, now: Now) {
        if self.degraded_reservation.is_some() {
            return;
        }
        let Some(worker) = self.degraded.as_mut() else {
            return;
        };
        worker.reserve_ahead(now.wall_ms);
        let Some(reserve_ts) = worker.poll_reservation() else {
            return;
        };
        let Some(degraded) = &self.cfg.degraded else {
            return;
        };
        let worker_id = degraded.worker_id;
        let id = self.push(StoreCall::RenewWorker {
            namespace: DEGRADED_NAMESPACE.to_owned(),
            worker_id,
            instance: self.cfg.instance,
            reserve_ts,
            lease_ms: self.cfg.lease_ms,
            now_ms: now.wall_ms,
        });
        self.degraded_reservation = Some(InFlight {
            id,
            sent_mono: now.mono_ms,
        });
    }

    /// The earliest monotonic time at which [`Self::handle_timeout`] has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let timeout = self.cfg.request_timeout_ms;
        let fetch = match &self.fetch {
            Fetch::Idle => None,
            Fetch::Backoff { until_mono } => Some(*until_mono),
            Fetch::Reading { flight, .. } | Fetch::Allocating { flight, .. } => {
                Some(flight.sent_mono + timeout)
            }
        };
        let held = [&self.current, &self.next]
            .into_iter()
            .flatten()
            .flat_map(|h| {
                let renew = h
                    .renewing
                    .as_ref()
                    .map_or(h.renew_due_mono, |f| f.sent_mono + timeout);
                [renew, h.lease_deadline_mono]
            });
        let degraded = self
            .degraded_reservation
            .as_ref()
            .map(|f| f.sent_mono + timeout);
        fetch.into_iter().chain(held).chain(degraded).min()
    }

    /// Performs whatever is due at `now`; spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Now) {
        self.expire(now);
        let timeout = self.cfg.request_timeout_ms;
        match &self.fetch {
            Fetch::Reading { flight, .. } | Fetch::Allocating { flight, .. }
                if flight.sent_mono + timeout <= now.mono_ms =>
            {
                self.fetch_failed(StoreError::Backend("store call timed out".into()), now);
            }
            Fetch::Backoff { until_mono } if *until_mono <= now.mono_ms => {
                self.fetch = Fetch::Idle;
                self.start_fetch_if_needed(now);
            }
            _ => {}
        }
        for held in [&mut self.current, &mut self.next].into_iter().flatten() {
            if held
                .renewing
                .as_ref()
                .is_some_and(|f| f.sent_mono + timeout <= now.mono_ms)
            {
                held.renewing = None;
            }
        }
        if self
            .degraded_reservation
            .as_ref()
            .is_some_and(|f| f.sent_mono + timeout <= now.mono_ms)
        {
            self.degraded_reservation = None;
            if let Some(worker) = self.degraded.as_mut() {
                worker.handle_reservation_failed();
            }
        }
        self.maybe_extend_claims(now);
        self.start_fetch_if_needed(now);
        self.reserve_degraded(now);
        self.debug_holds();
    }

    /// Graceful shutdown: give both buffers back (their unissued IDs return to the pool).
    pub fn shutdown(&mut self) {
        for held in [self.current.take(), self.next.take()]
            .into_iter()
            .flatten()
        {
            self.push(StoreCall::Release(ReleaseRequest {
                tag: self.cfg.tag.clone(),
                instance: self.cfg.instance,
                segment_start: held.segment.start,
                used_end: held.next.min(held.segment.end),
            }));
        }
    }

    /// The health snapshot.
    #[must_use]
    pub fn health(&self, now: Now) -> Health {
        let view = |h: &Held| {
            let remaining = h
                .segment
                .end
                .saturating_sub(h.next)
                .div_ceil(h.segment.delta);
            BufferView {
                segment: h.segment,
                next: h.next,
                claim_end: h.claim_end,
                remaining_pct: percent(remaining, h.segment.len().max(1)),
                lease_left_ms: h.lease_deadline_mono.saturating_sub(now.mono_ms),
            }
        };
        Health {
            tag: self.cfg.tag.clone(),
            instance: self.cfg.instance,
            current: self.current.as_ref().map(view),
            next: self.next.as_ref().map(view),
            step: self.step,
            fetch: match self.fetch {
                Fetch::Idle => "idle",
                Fetch::Backoff { .. } => "backoff",
                Fetch::Reading { .. } | Fetch::Allocating { .. } => "fetching",
            }
            .to_owned(),
            last_issued: self.last_issued,
            stats: self.stats,
            last_error: self.last_error.as_ref().map(ToString::to_string),
        }
    }
}

/// `claim_end` as acknowledged for `segment`: clamped into it (below its start nothing may be
/// issued, and nothing at or past its end was granted). A claim outside the segment is a
/// malformed reply, counted in `stats`; the clamp keeps exactly the IDs of the segment the claim
/// allowed.
fn clamp_claim(stats: &mut AllocatorStats, segment: &Segment, claim_end: u64) -> u64 {
    assert!(segment.start <= segment.end, "{segment:?}");
    let clamped = claim_end.clamp(segment.start, segment.end);
    stats.malformed_replies += u64::from(clamped != claim_end);
    clamped
}

/// The flaws under which IDs are issued beyond the acknowledged claim (the claim becomes an
/// after-the-fact usage record, or is not looked at at all).
fn issues_beyond_claim(flaw: Option<Flaw>) -> bool {
    matches!(
        flaw,
        Some(Flaw::CounterNoPersist | Flaw::ReclaimNoDriftMargin)
    )
}

#[cfg(test)]
mod tests;
