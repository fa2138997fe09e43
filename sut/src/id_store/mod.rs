//! The ID store: the database the segment allocator and the Snowflake workers lean on.
//!
//! The trait is at the level of domain operations, never SQL or key-value primitives:
//!
//! - **tags and segment grants** — create a tag, read it, and allocate the next range of a tag
//!   *only if its version is still the one read* (Tinyid's optimistic lock
//!   `UPDATE ... SET max_id = max_id + step, version = version + 1 WHERE biz_tag = ? AND
//!   version = ?`). A grant names its holder and carries a lease (the segment-ID design's
//!   "租约驱动分配", §3.1 in docs/sources.md).
//! - **claims and leases** — a holder may issue IDs of a granted segment only below its
//!   *claim*, a high-water mark it records in the store *before* using the IDs beneath it (the
//!   design's "状态快照", §3.3, done write-ahead). Renewing extends the lease and may raise the
//!   claim.
//! - **zombie reclaim** — when a holder's lease expires unrenewed, the unclaimed tail of its
//!   segment returns to the tag's pool, and later grants draw from the pool first (segment-ID
//!   design §3.4 "故障自愈"). Because the holder never issues at or above its recorded claim,
//!   the tail is never issued twice, whatever the clocks do.
//! - **worker leases** — Snowflake worker ids (and semantic-ID machine numbers) come from a
//!   lease, never from a hash of the IP, and carry the holder's *time reservation*: the largest
//!   timestamp it may issue without writing again. A new holder of the same worker id starts
//!   only after that reservation (Leaf issue #216 and #104 are what happens without it).
//! - **the counter engine** — Redis `INCRBY` as an alternative to segments, with a durability
//!   policy (every write synced; synced every second like `appendfsync everysec`; snapshots),
//!   so the bench can show what each policy re-issues after a crash.
//!
//! [`MemoryIdStore`] (the simulator's database node, the models) is the implementation here;
//! the real server's `SqliteIdStore` lives in the `sut-server` crate, and a conformance property
//! test there keeps the two identical. Both only read rows and persist what the pure decision
//! functions of [`rules`] decide (validation, version check, fresh and pooled grants, claims,
//! tails, the reclaim sweep, worker choice, counter syncs, refusals), so that each rule is
//! written once.

mod memory;
pub mod rules;

pub use memory::MemoryIdStore;
pub use rules::{
    check_alloc, fresh_segment, initial_claim, lease_taken, pool_taken, take_from_pool,
};

use serde::{Deserialize, Serialize};

/// The ID store's edge states (see [`crate::edge`]), part of [`crate::edge::Machine::Segment`]:
/// listed in [`crate::segment::EDGES`].
pub mod edges {
    use crate::edge::{Edge, Machine};

    /// [`super::rules::allocate`] sees a version other than the one read.
    pub const VERSION_CONFLICT: Edge = Edge::new(
        Machine::Segment,
        "segment.version_conflict",
        "a segment grant asks for the tag row at a version another allocator already moved: \
         only the optimistic lock keeps the two from taking the same range \
         (segment_no_version_check)",
    );
    /// [`super::rules::reclaim_expired`] pools an expired lease's tail.
    pub const ZOMBIE_TAIL_RECLAIMED: Edge = Edge::new(
        Machine::Segment,
        "segment.zombie_tail_reclaimed",
        "the store reclaims the unclaimed tail of a lease that expired unrenewed, while its \
         holder may still be alive: everything below the recorded claim must stay out of the \
         pool",
    );
}

/// IDs handed out by segments stay below this bound, so that bit 62 can mark degraded-mode
/// Snowflake IDs (see [`crate::segment::DEGRADED_FLAG`]) and the sign bit stays clear.
pub const SEGMENT_ID_LIMIT: u64 = 1 << 62;

/// The name of an ID sequence ("biz_tag").
pub type Tag = String;

/// Who holds a segment or a worker id: one process incarnation. A restarted process is a new
/// instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceId(pub u64);

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance-{}", self.0)
    }
}

/// A run of IDs: `start, start + delta, start + 2·delta, …` strictly below `end`.
///
/// With `delta > 1` and `start ≡ remainder (mod delta)` this is Tinyid's multi-database scheme:
/// store k of K only ever issues IDs ≡ k (mod K), so stores never collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Segment {
    /// First ID of the run.
    pub start: u64,
    /// Exclusive upper bound.
    pub end: u64,
    /// Distance between consecutive IDs (1 for a single store).
    pub delta: u64,
}

impl Segment {
    /// Number of IDs in the run.
    #[must_use]
    pub fn len(&self) -> u64 {
        if self.end <= self.start {
            0
        } else {
            (self.end - self.start).div_ceil(self.delta)
        }
    }

    /// True when the run holds no ID.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `k`-th ID of the run (`k < len()`).
    #[must_use]
    pub fn nth(&self, k: u64) -> u64 {
        debug_assert!(k < self.len(), "index {k} outside a run of {}", self.len());
        self.start + k * self.delta
    }

    /// Smallest member of the run's residue class that is `>= x` (may be `>= end`).
    #[must_use]
    pub fn align_up(&self, x: u64) -> u64 {
        align_up(x, self.start % self.delta, self.delta)
    }
}

/// Smallest `y >= x` with `y ≡ remainder (mod delta)`.
#[must_use]
pub fn align_up(x: u64, remainder: u64, delta: u64) -> u64 {
    debug_assert!(delta > 0 && remainder < delta);
    let r = x % delta;
    if r <= remainder {
        x - r + remainder
    } else {
        x - r + delta + remainder
    }
}

/// How a tag is created.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TagSpec {
    /// The first ID the tag may issue (rounded up to the tag's residue class).
    pub first_id: u64,
    /// The database's step, in IDs: the default grant size and the floor of dynamic steps.
    pub step: u64,
    /// Multi-store pools: number of stores (1 for a single store).
    pub delta: u64,
    /// Multi-store pools: this store's residue, `0 <= remainder < delta`.
    pub remainder: u64,
}

impl TagSpec {
    /// A single-store tag starting at 1 with the given step.
    #[must_use]
    pub fn simple(step: u64) -> Self {
        Self {
            first_id: 1,
            step,
            delta: 1,
            remainder: 0,
        }
    }

    /// Checks the spec, naming the offending field.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |field: &str, reason: String| {
            Err(StoreError::InvalidSpec {
                field: field.to_owned(),
                reason,
            })
        };
        if self.step == 0 {
            return invalid("step", "must be at least 1".into());
        }
        if self.delta == 0 {
            return invalid("delta", "must be at least 1".into());
        }
        if self.remainder >= self.delta {
            return invalid(
                "remainder",
                format!("{} must be below delta {}", self.remainder, self.delta),
            );
        }
        let first = align_up(self.first_id, self.remainder, self.delta);
        if first >= SEGMENT_ID_LIMIT {
            return invalid(
                "first_id",
                format!("{} is not below the segment ID limit 2^62", self.first_id),
            );
        }
        if self
            .step
            .checked_mul(self.delta)
            .is_none_or(|span| span >= SEGMENT_ID_LIMIT)
        {
            return invalid(
                "step",
                format!(
                    "step {} × delta {} overflows the ID space",
                    self.step, self.delta
                ),
            );
        }
        Ok(())
    }
}

/// A tag as stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TagRow {
    /// The tag's name.
    pub tag: Tag,
    /// The next ID never granted (Leaf's `max_id`), aligned to the residue class.
    pub max_id: u64,
    /// The database's step in IDs.
    pub step: u64,
    /// Multi-store pools: distance between IDs.
    pub delta: u64,
    /// Multi-store pools: this store's residue.
    pub remainder: u64,
    /// Incremented by every successful allocation (the optimistic lock).
    pub version: u64,
    /// Reclaimed tails, lowest first, granted before fresh IDs.
    pub pool: Vec<Segment>,
}

/// "Grant the next segment of `tag` if its version is still `expected_version`."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocRequest {
    /// The tag.
    pub tag: Tag,
    /// The version the requester read; a different current version is a conflict.
    pub expected_version: u64,
    /// How many IDs the requester wants (its current step).
    pub ids: u64,
    /// The smallest ID the requester may still issue (its last ID + 1): pooled ranges below
    /// it are not granted to it, so each holder's IDs keep increasing.
    pub min_id: u64,
    /// How many IDs the holder claims at once (the claim is raised by renewals).
    pub claim_ids: u64,
    /// The requester.
    pub instance: InstanceId,
    /// Lease length granted from `now_ms`.
    pub lease_ms: u64,
    /// The store's lease clock.
    pub now_ms: u64,
    /// FLAW [`crate::flaw::Flaw::SegmentNoVersionCheck`]: the `max_id` the requester read. When
    /// set, the store skips the version check and the pool and blindly writes
    /// `max_id = blind_max_id + ids`, granting `[blind_max_id, blind_max_id + ids)`. `None` on
    /// the correct path.
    #[serde(default)]
    pub blind_max_id: Option<u64>,
}

/// A granted segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// The tag.
    pub tag: Tag,
    /// The IDs granted.
    pub segment: Segment,
    /// The tag's version after this grant.
    pub version: u64,
    /// The holder may issue IDs strictly below this bound (within the segment).
    pub claim_end: u64,
    /// The lease, by the store's lease clock.
    pub lease_expiry_ms: u64,
    /// The segment came from the reclaim pool.
    pub from_pool: bool,
    /// The tag's database step (the floor of dynamic steps).
    pub tag_step: u64,
}

/// "I still hold segment `segment_start` of `tag`; extend my lease and raise my claim."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RenewRequest {
    /// The tag.
    pub tag: Tag,
    /// The holder.
    pub instance: InstanceId,
    /// Identifies the segment.
    pub segment_start: u64,
    /// The claim wanted (never lowers the recorded one; clamped to the segment's end).
    pub claim_end: u64,
    /// Lease length granted from `now_ms`.
    pub lease_ms: u64,
    /// The store's lease clock.
    pub now_ms: u64,
}

/// The state of a lease after a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The recorded claim.
    pub claim_end: u64,
    /// The new expiry, by the store's lease clock.
    pub lease_expiry_ms: u64,
}

/// "I stop using segment `segment_start`; I issued nothing at or above `used_end`."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The tag.
    pub tag: Tag,
    /// The holder.
    pub instance: InstanceId,
    /// Identifies the segment.
    pub segment_start: u64,
    /// Everything from here (aligned) to the segment's end returns to the pool.
    pub used_end: u64,
}

/// A held segment as the store sees it (for reclaim and for health pages).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseRow {
    /// The tag.
    pub tag: Tag,
    /// The holder.
    pub instance: InstanceId,
    /// The segment.
    pub segment: Segment,
    /// The recorded claim.
    pub claim_end: u64,
    /// Expiry by the store's lease clock.
    pub lease_expiry_ms: u64,
}

/// A tail returned to a pool by [`IdStore::reclaim_expired`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reclaimed {
    /// The tag.
    pub tag: Tag,
    /// The zombie holder.
    pub instance: InstanceId,
    /// The tail that went back to the pool (possibly empty when the claim covered it all).
    pub tail: Segment,
}

/// A Snowflake worker id (or semantic machine number) lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerLease {
    /// The worker id.
    pub worker_id: u32,
    /// Expiry by the store's lease clock.
    pub lease_expiry_ms: u64,
    /// The largest timestamp (in the generator's own units) any holder of this id may have
    /// issued. A new holder must not issue at or below it.
    pub reserved_ts: u64,
}

/// "Give `instance` a worker id of `namespace` below `worker_count`."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerRequest {
    /// Separate id spaces (e.g. "snowflake", "semantic", "degraded").
    pub namespace: String,
    /// Ids `0..worker_count` are available.
    pub worker_count: u32,
    /// The requester.
    pub instance: InstanceId,
    /// Lease length.
    pub lease_ms: u64,
    /// The store's lease clock.
    pub now_ms: u64,
}

/// How durable the counter engine is: what a crash can lose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CounterDurability {
    /// Every increment is synced before it is acknowledged.
    #[default]
    EveryWrite,
    /// Synced at most every `interval_ms` (Redis `appendfsync everysec` is 1000).
    Periodic {
        /// Sync interval.
        interval_ms: u64,
    },
    /// Only snapshots every `interval_ms` survive (Redis RDB).
    Snapshot {
        /// Snapshot interval.
        interval_ms: u64,
    },
}

impl CounterDurability {
    /// The interval after which unsynced increments are made durable (0 = every write).
    #[must_use]
    pub fn interval_ms(self) -> u64 {
        match self {
            Self::EveryWrite => 0,
            Self::Periodic { interval_ms } | Self::Snapshot { interval_ms } => interval_ms,
        }
    }
}

/// What went wrong in a store operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum StoreError {
    /// The tag does not exist.
    #[error("unknown tag `{0}`")]
    UnknownTag(Tag),
    /// `create_tag` on an existing tag.
    #[error("tag `{0}` already exists")]
    TagExists(Tag),
    /// A field of a request or spec is out of range.
    #[error("invalid {field}: {reason}")]
    InvalidSpec {
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// The optimistic lock failed: someone else allocated since the read.
    #[error("version conflict on `{tag}`: expected {expected}, found {actual}")]
    VersionConflict {
        /// The tag.
        tag: Tag,
        /// The version the requester read.
        expected: u64,
        /// The current version.
        actual: u64,
    },
    /// The lease is gone (expired and reclaimed, released, or never held).
    #[error("lease lost: `{tag}` segment {segment_start} is not held by {instance}")]
    LeaseLost {
        /// The tag.
        tag: Tag,
        /// The segment.
        segment_start: u64,
        /// The would-be holder.
        instance: InstanceId,
    },
    /// The worker lease is gone.
    #[error("worker lease lost: {namespace}/{worker_id} is not held by {instance}")]
    WorkerLeaseLost {
        /// The namespace.
        namespace: String,
        /// The worker id.
        worker_id: u32,
        /// The would-be holder.
        instance: InstanceId,
    },
    /// The tag's ID space is used up (never wrapped).
    #[error("tag `{0}` has exhausted its ID space")]
    Exhausted(Tag),
    /// Every worker id of the namespace is leased.
    #[error("no free worker id in `{namespace}` (all {worker_count} leased)")]
    NoFreeWorker {
        /// The namespace.
        namespace: String,
        /// Ids available.
        worker_count: u32,
    },
    /// The backend failed (I/O, corruption); the operation may or may not have happened.
    #[error("store backend: {0}")]
    Backend(String),
}

/// The ID store's domain operations. Both implementations must behave identically.
pub trait IdStore {
    /// Creates a tag.
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError>;
    /// Reads a tag.
    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError>;
    /// Grants the next segment if the tag's version is still `expected_version`; pooled tails
    /// at or above `min_id` first.
    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError>;
    /// Extends a lease and raises its claim.
    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError>;
    /// Ends a lease, returning the unused tail to the pool.
    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError>;
    /// Returns the unclaimed tails of every lease expired at `now_ms` to their pools.
    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError>;
    /// Every live lease, ordered by tag then segment start.
    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError>;

    /// Acquires the lowest free (never leased, expired, or already ours) worker id.
    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError>;
    /// Renews a worker lease and raises its time reservation to at least `reserve_ts`.
    fn renew_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
        reserve_ts: u64,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<WorkerLease, StoreError>;
    /// Gives a worker id back (its reservation stays for the next holder).
    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError>;

    /// The counter engine: adds `n` to `key` (created at 0) and returns the new value.
    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError>;

    /// Makes every counter's live value durable (a graceful shutdown; a crash skips it).
    fn flush_counters(&mut self) -> Result<(), StoreError>;
}

/// A boxed store is a store (the server picks SQLite or PostgreSQL at start-up).
impl<T: IdStore + ?Sized> IdStore for Box<T> {
    fn create_tag(&mut self, tag: &str, spec: &TagSpec) -> Result<TagRow, StoreError> {
        (**self).create_tag(tag, spec)
    }
    fn read_tag(&mut self, tag: &str) -> Result<TagRow, StoreError> {
        (**self).read_tag(tag)
    }
    fn allocate(&mut self, req: &AllocRequest) -> Result<Grant, StoreError> {
        (**self).allocate(req)
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Lease, StoreError> {
        (**self).renew(req)
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<(), StoreError> {
        (**self).release(req)
    }
    fn reclaim_expired(&mut self, now_ms: u64) -> Result<Vec<Reclaimed>, StoreError> {
        (**self).reclaim_expired(now_ms)
    }
    fn leases(&mut self) -> Result<Vec<LeaseRow>, StoreError> {
        (**self).leases()
    }
    fn acquire_worker(&mut self, req: &WorkerRequest) -> Result<WorkerLease, StoreError> {
        (**self).acquire_worker(req)
    }
    fn renew_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
        reserve_ts: u64,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<WorkerLease, StoreError> {
        (**self).renew_worker(namespace, worker_id, instance, reserve_ts, lease_ms, now_ms)
    }
    fn release_worker(
        &mut self,
        namespace: &str,
        worker_id: u32,
        instance: InstanceId,
    ) -> Result<(), StoreError> {
        (**self).release_worker(namespace, worker_id, instance)
    }
    fn incr_by(&mut self, key: &str, n: u64, now_ms: u64) -> Result<u64, StoreError> {
        (**self).incr_by(key, n, now_ms)
    }
    fn flush_counters(&mut self) -> Result<(), StoreError> {
        (**self).flush_counters()
    }
}

/// One store operation as data: what the allocator asks a driver to perform.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoreCall {
    /// [`IdStore::read_tag`].
    Read {
        /// The tag.
        tag: Tag,
    },
    /// [`IdStore::allocate`].
    Allocate(AllocRequest),
    /// [`IdStore::renew`].
    Renew(RenewRequest),
    /// [`IdStore::release`].
    Release(ReleaseRequest),
    /// [`IdStore::acquire_worker`].
    AcquireWorker(WorkerRequest),
    /// [`IdStore::renew_worker`].
    RenewWorker {
        /// The namespace.
        namespace: String,
        /// The worker id.
        worker_id: u32,
        /// The holder.
        instance: InstanceId,
        /// The reservation to persist.
        reserve_ts: u64,
        /// Lease length.
        lease_ms: u64,
        /// The store's lease clock.
        now_ms: u64,
    },
}

/// The answer to a [`StoreCall`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoreReply {
    /// Answer to [`StoreCall::Read`].
    Read(Result<TagRow, StoreError>),
    /// Answer to [`StoreCall::Allocate`].
    Allocate(Result<Grant, StoreError>),
    /// Answer to [`StoreCall::Renew`].
    Renew(Result<Lease, StoreError>),
    /// Answer to [`StoreCall::Release`].
    Release(Result<(), StoreError>),
    /// Answer to [`StoreCall::AcquireWorker`] and [`StoreCall::RenewWorker`].
    Worker(Result<WorkerLease, StoreError>),
}

impl StoreReply {
    /// The answer's kind and whether the store accepted the call (`allocate_ok`,
    /// `worker_refused`, ...): the protocol step a crash point at this answer names.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Read(Ok(_)) => "read_ok",
            Self::Read(Err(_)) => "read_refused",
            Self::Allocate(Ok(_)) => "allocate_ok",
            Self::Allocate(Err(_)) => "allocate_refused",
            Self::Renew(Ok(_)) => "renew_ok",
            Self::Renew(Err(_)) => "renew_refused",
            Self::Release(Ok(())) => "release_ok",
            Self::Release(Err(_)) => "release_refused",
            Self::Worker(Ok(_)) => "worker_ok",
            Self::Worker(Err(_)) => "worker_refused",
        }
    }
}

impl StoreCall {
    /// The call's kind (`read`, `allocate`, `renew`, `release`, `acquire_worker`,
    /// `renew_worker`): the protocol step a crash point at this call names.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::Allocate(_) => "allocate",
            Self::Renew(_) => "renew",
            Self::Release(_) => "release",
            Self::AcquireWorker(_) => "acquire_worker",
            Self::RenewWorker { .. } => "renew_worker",
        }
    }

    /// Performs the call against a store: the whole of a driver's store-side work.
    pub fn execute<S: IdStore + ?Sized>(&self, store: &mut S) -> StoreReply {
        match self {
            Self::Read { tag } => StoreReply::Read(store.read_tag(tag)),
            Self::Allocate(req) => StoreReply::Allocate(store.allocate(req)),
            Self::Renew(req) => StoreReply::Renew(store.renew(req)),
            Self::Release(req) => StoreReply::Release(store.release(req)),
            Self::AcquireWorker(req) => StoreReply::Worker(store.acquire_worker(req)),
            Self::RenewWorker {
                namespace,
                worker_id,
                instance,
                reserve_ts,
                lease_ms,
                now_ms,
            } => StoreReply::Worker(store.renew_worker(
                namespace,
                *worker_id,
                *instance,
                *reserve_ts,
                *lease_ms,
                *now_ms,
            )),
        }
    }

    /// Stamps the store's lease clock into a call that carries one (the store side of a
    /// network hop owns that clock, not the requester).
    pub fn set_store_now(&mut self, now_ms: u64) {
        match self {
            Self::Allocate(req) => req.now_ms = now_ms,
            Self::Renew(req) => req.now_ms = now_ms,
            Self::RenewWorker { now_ms: at, .. } => *at = now_ms,
            Self::AcquireWorker(req) => req.now_ms = now_ms,
            Self::Read { .. } | Self::Release(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
