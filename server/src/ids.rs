//! ID issuing for the server: one lock-free [`ConcurrentIds`] front per tag over its own
//! SQLite connection, and one leased Snowflake worker.
//!
//! - **Segments** (Leaf/Tinyid, `sut::segment`): a tag's allocator is created on its first
//!   request (so a restarted server picks its tags up from the database without a listing).
//!   Every process incarnation has its own [`InstanceId`], drawn from the store's durable
//!   counter, so leases, claims and reclaim sweeps tell incarnations apart. Segment grants and
//!   lease renewals run inline on the slow path (a mutex per tag) with `synchronous=FULL`: they
//!   are rare (one per step of IDs, one per renew interval).
//! - **Snowflake** (`sut::snowflake`): the worker id comes from a worker lease in the store
//!   (`acquire_worker`), never a hash of the IP; the time reservation the sequencer asks for is
//!   persisted with `renew_worker` before any ID above it is issued, so a restarted server (or
//!   the next holder of the id) starts above everything issued before (Leaf issues #104, #216).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use axum::http::StatusCode;
use serde::Serialize;

use super::clock::RealClock;
use super::error::ApiError;
use super::front::{ConcurrentIds, IdError};
use super::sqlite::SqliteIdStore;
use sut::clock::Now;
use sut::segment::{AllocatorConfig, Health, SegmentAllocator, Unavailable};
use sut::snowflake::{
    Decoded, NextId, SequencerError, SequencerStats, SnowflakeWorker, WorkerConfig,
};
use sut::store::{
    CounterDurability, IdStore, InstanceId, StoreError, TagRow, TagSpec, WorkerRequest,
};

/// Longest tag name, in bytes.
pub const TAG_LEN_MAX_BYTES: usize = 64;
/// Most tags one server serves (each has its own SQLite connection).
pub const TAGS_MAX: usize = 256;
/// Namespace of the server's Snowflake worker leases.
pub const SNOWFLAKE_NAMESPACE: &str = "snowflake";
/// Key of the durable counter that numbers process incarnations.
pub const INSTANCE_COUNTER: &str = "sut-server/instance";
/// Rounds of waiting (clock, reservation) before a Snowflake request gives up with 503.
const SNOWFLAKE_ROUNDS_MAX: usize = 64;
/// A backward clock (or a restart below the inherited reservation) up to this far behind is
/// waited out inside the request; further behind is a 503 with `Retry-After`.
pub const SNOWFLAKE_WAIT_MS_MAX: u64 = 1_500;
/// Reach of each persisted Snowflake reservation: what a restart on the same worker id must
/// wait out at most (Leaf writes every 3 s; shorter here, the write is one fsync).
pub const SNOWFLAKE_RESERVE_AHEAD_MS: u64 = 1_000;

/// Locks a mutex, ignoring poisoning (a panicked holder left consistent state: every state
/// machine call is atomic with respect to its own invariants).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks a tag name: 1..=64 bytes of `[A-Za-z0-9_.-]`.
pub fn validate_tag(tag: &str) -> Result<(), ApiError> {
    if tag.is_empty() || tag.len() > TAG_LEN_MAX_BYTES {
        return Err(ApiError::bad(
            "tag",
            format!("tag must be 1..={TAG_LEN_MAX_BYTES} bytes"),
        ));
    }
    if !tag
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(ApiError::bad(
            "tag",
            "tag may contain only A-Z a-z 0-9 _ - .",
        ));
    }
    Ok(())
}

/// Maps a store error to an answer.
pub fn store_error(err: &StoreError) -> ApiError {
    match err {
        StoreError::UnknownTag(tag) => {
            ApiError::field(StatusCode::NOT_FOUND, "tag", format!("unknown tag `{tag}`"))
        }
        StoreError::TagExists(tag) => ApiError::field(
            StatusCode::CONFLICT,
            "tag",
            format!("tag `{tag}` already exists"),
        ),
        StoreError::InvalidSpec { field, reason } => ApiError::bad(field, reason.clone()),
        StoreError::Exhausted(tag) => ApiError::field(
            StatusCode::CONFLICT,
            "tag",
            format!("tag `{tag}` has exhausted its ID space"),
        ),
        other => ApiError::unavailable(format!("store: {other}"), 1),
    }
}

/// Maps an ID-front error to an answer.
fn id_error(err: &IdError) -> ApiError {
    match err {
        IdError::Busy => ApiError::unavailable("IDs temporarily unavailable, retry", 1),
        IdError::Unavailable(Unavailable::Permanent(e)) => store_error(e),
        IdError::Unavailable(u) => ApiError::unavailable(u.to_string(), 1),
    }
}

type ClockFn = Box<dyn Fn() -> Now + Send + Sync>;

/// One tag's concurrent front.
pub struct TagIds {
    ids: ConcurrentIds<SqliteIdStore, ClockFn>,
    clock: RealClock,
}

impl std::fmt::Debug for TagIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagIds").finish_non_exhaustive()
    }
}

impl TagIds {
    /// One ID.
    pub fn next_id(&self) -> Result<u64, ApiError> {
        self.ids.next_id().map_err(|e| id_error(&e))
    }

    /// `n` increasing IDs.
    pub fn next_ids(&self, n: u64) -> Result<Vec<u64>, ApiError> {
        self.ids.next_ids(n).map_err(|e| id_error(&e))
    }

    /// The allocator's health view.
    pub fn health(&self) -> Health {
        let clock = self.clock;
        self.ids.with_allocator(|a| a.health(clock.now()))
    }

    /// Lease renewals, claim raises, prefetch.
    pub fn tick(&self) {
        self.ids.tick();
    }

    /// Gives unissued IDs back to the pool (graceful shutdown).
    pub fn shutdown(&self) {
        self.ids.shutdown();
    }
}

/// All tags of this server.
#[derive(Debug)]
pub struct Tags {
    map: RwLock<HashMap<String, Arc<TagIds>>>,
    db: PathBuf,
    instance: InstanceId,
    clock: RealClock,
    block_ids: u64,
    control: Arc<Mutex<SqliteIdStore>>,
    flaw: Option<sut::flaw::Flaw>,
    step_max: Option<u64>,
}

impl Tags {
    /// A registry over the database at `db`; `control` is the connection for admin calls.
    #[must_use]
    pub fn new(
        db: &Path,
        instance: InstanceId,
        clock: RealClock,
        block_ids: u64,
        control: Arc<Mutex<SqliteIdStore>>,
    ) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            db: db.to_owned(),
            instance,
            clock,
            block_ids,
            control,
            flaw: None,
            step_max: None,
        }
    }

    /// Switches a documented flaw on in every allocator this registry creates (the
    /// allocator ignores flaws that are not its own).
    #[must_use]
    pub fn with_flaw(mut self, flaw: Option<sut::flaw::Flaw>) -> Self {
        self.flaw = flaw;
        self
    }

    /// Caps the dynamic step (Leaf's doubling) of every allocator this registry creates;
    /// `None` keeps Leaf's 1,000,000.
    #[must_use]
    pub fn with_step_max(mut self, step_max: Option<u64>) -> Self {
        self.step_max = step_max;
        self
    }

    /// This incarnation.
    #[must_use]
    pub fn instance(&self) -> InstanceId {
        self.instance
    }

    fn cached(&self, tag: &str) -> Option<Arc<TagIds>> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tag)
            .cloned()
    }

    /// The front of `tag`, created on first use if the tag exists in the store. Blocking
    /// (may read the store): call from a blocking context on a miss.
    pub fn get(&self, tag: &str) -> Result<Arc<TagIds>, ApiError> {
        if let Some(ids) = self.cached(tag) {
            return Ok(ids);
        }
        validate_tag(tag)?;
        lock(&self.control)
            .read_tag(tag)
            .map_err(|e| store_error(&e))?;
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ids) = map.get(tag) {
            return Ok(Arc::clone(ids));
        }
        if map.len() >= TAGS_MAX {
            return Err(ApiError::field(
                StatusCode::INSUFFICIENT_STORAGE,
                "tag",
                format!("this server serves at most {TAGS_MAX} tags"),
            ));
        }
        let store = SqliteIdStore::open(&self.db, CounterDurability::EveryWrite)
            .map_err(|e| ApiError::unavailable(format!("store: {e}"), 1))?;
        let now = self.clock.now();
        let mut alloc_cfg = AllocatorConfig::new(tag, self.instance);
        alloc_cfg.flaw = self.flaw;
        if let Some(step_max) = self.step_max {
            alloc_cfg.step = sut::segment::StepPolicy::Leaf { step_max };
        }
        let alloc = SegmentAllocator::new(alloc_cfg, now)
            .map_err(|e| ApiError::internal(format!("allocator config: {e}")))?;
        let clock = self.clock;
        let clock_fn: ClockFn = Box::new(move || clock.now());
        let ids = Arc::new(TagIds {
            ids: ConcurrentIds::new(alloc, store, clock_fn, self.block_ids),
            clock,
        });
        map.insert(tag.to_owned(), Arc::clone(&ids));
        Ok(ids)
    }

    /// The front of `tag` if it is loaded already (no store access: the hot path).
    #[must_use]
    pub fn loaded(&self, tag: &str) -> Option<Arc<TagIds>> {
        self.cached(tag)
    }

    /// Creates a tag in the store (and loads it).
    pub fn create(&self, tag: &str, spec: &TagSpec) -> Result<TagRow, ApiError> {
        validate_tag(tag)?;
        let row = lock(&self.control)
            .create_tag(tag, spec)
            .map_err(|e| store_error(&e))?;
        self.get(tag)?;
        Ok(row)
    }

    /// Every loaded tag, by name.
    #[must_use]
    pub fn all(&self) -> Vec<(String, Arc<TagIds>)> {
        let map = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all: Vec<_> = map
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// Draws this incarnation's instance id from the store's durable counter (1, 2, 3, ... per
/// start on the same database), so incarnations never share one.
pub fn next_instance(store: &mut SqliteIdStore, now: Now) -> Result<InstanceId, StoreError> {
    let n = store.incr_by(INSTANCE_COUNTER, 1, now.wall_ms)?;
    if n >= 1 << 32 {
        return Err(StoreError::Exhausted(INSTANCE_COUNTER.to_owned()));
    }
    Ok(InstanceId(n))
}

/// The Snowflake worker state shown by `/health`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SnowflakeView {
    /// The leased worker id.
    pub worker_id: u32,
    /// The persisted time reservation (time units since the epoch).
    pub reserved_ts: u64,
    /// The unit of the last issued ID.
    pub last_ts: u64,
    /// The worker lease's expiry (store clock, ms).
    pub lease_expiry_ms: u64,
    /// True once the lease was lost (the worker never issues again).
    pub stopped: bool,
    /// Sequencer counters.
    #[schema(value_type = Object)]
    pub stats: SequencerStats,
}

/// The server's Snowflake worker.
#[derive(Debug)]
pub struct Snowflake {
    worker: Mutex<SnowflakeWorker>,
    store: Arc<Mutex<SqliteIdStore>>,
    instance: InstanceId,
    lease_ms: u64,
    lease_expiry_ms: Mutex<u64>,
    /// Monotonic time of the last successful renewal.
    renewed_mono_ms: Mutex<u64>,
    clock: RealClock,
    released: AtomicBool,
}

impl Snowflake {
    /// Leases a worker id and builds the worker above the reservation the lease carried.
    pub fn start(
        cfg: WorkerConfig,
        store: Arc<Mutex<SqliteIdStore>>,
        instance: InstanceId,
        lease_ms: u64,
        clock: RealClock,
    ) -> Result<Self, String> {
        let now = clock.now();
        let lease = lock(&store)
            .acquire_worker(&WorkerRequest {
                namespace: SNOWFLAKE_NAMESPACE.to_owned(),
                worker_count: cfg.layout.worker_count(),
                instance,
                lease_ms,
                now_ms: now.wall_ms,
            })
            .map_err(|e| format!("snowflake worker lease: {e}"))?;
        let worker = SnowflakeWorker::new(cfg, lease.worker_id, lease.reserved_ts, now.wall_ms)
            .map_err(|e| format!("snowflake worker: {e}"))?;
        Ok(Self {
            worker: Mutex::new(worker),
            store,
            instance,
            lease_ms,
            lease_expiry_ms: Mutex::new(lease.lease_expiry_ms),
            renewed_mono_ms: Mutex::new(now.mono_ms),
            clock,
            released: AtomicBool::new(false),
        })
    }

    /// The layout's decoding of `id`.
    pub fn decode(&self, id: u64) -> Decoded {
        lock(&self.worker).layout().decode(id)
    }

    /// Persists `reserve_ts` (and renews the lease); feeds the answer to the worker. Blocking.
    pub fn persist(&self, reserve_ts: u64) -> Result<(), String> {
        let now = self.clock.now();
        let (worker_id, reserve_ts) = {
            let w = lock(&self.worker);
            (w.worker_id(), reserve_ts.max(w.sequencer().reserved_ts()))
        };
        let result = lock(&self.store).renew_worker(
            SNOWFLAKE_NAMESPACE,
            worker_id,
            self.instance,
            reserve_ts,
            self.lease_ms,
            now.wall_ms,
        );
        let mut w = lock(&self.worker);
        match result {
            Ok(lease) => {
                w.handle_reserved(lease.reserved_ts);
                *lock(&self.lease_expiry_ms) = lease.lease_expiry_ms;
                *lock(&self.renewed_mono_ms) = now.mono_ms;
                Ok(())
            }
            Err(e @ StoreError::WorkerLeaseLost { .. }) => {
                w.handle_lease_lost();
                Err(e.to_string())
            }
            Err(e) => {
                w.handle_reservation_failed();
                Err(e.to_string())
            }
        }
    }

    /// Background upkeep: keep the reservation ahead of the clock, and renew the lease every
    /// third of its length. Blocking.
    pub fn tick(&self) -> Result<(), String> {
        if self.released.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = self.clock.now();
        let wanted = {
            let mut w = lock(&self.worker);
            w.reserve_ahead(now.wall_ms);
            w.poll_reservation()
        };
        let renew_due =
            now.mono_ms.saturating_sub(*lock(&self.renewed_mono_ms)) >= self.lease_ms / 3;
        match wanted {
            Some(ts) => self.persist(ts),
            None if renew_due => self.persist(0),
            None => Ok(()),
        }
    }

    /// One ID: waits out short clock waits and reservation writes, at most
    /// `SNOWFLAKE_ROUNDS_MAX` rounds.
    pub async fn next_id(self: &Arc<Self>) -> Result<u64, ApiError> {
        for _ in 0..SNOWFLAKE_ROUNDS_MAX {
            let now = self.clock.now();
            let (step, wanted) = {
                let mut w = lock(&self.worker);
                let step = w.next_id(now.wall_ms);
                (step, w.poll_reservation())
            };
            if let Some(ts) = wanted {
                let me = Arc::clone(self);
                let persisted = tokio::task::spawn_blocking(move || me.persist(ts));
                if matches!(step, Ok(NextId::WaitReservation)) {
                    match persisted.await {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => {
                            return Err(ApiError::unavailable(format!("reservation: {e}"), 1));
                        }
                        Err(e) => return Err(ApiError::internal(format!("reservation task: {e}"))),
                    }
                }
            }
            match step {
                Ok(NextId::Id(id)) => return Ok(id),
                Ok(NextId::WaitUntil { wall_ms }) => {
                    let wait_ms = wall_ms.saturating_sub(now.wall_ms).clamp(1, 10);
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                }
                Ok(NextId::WaitReservation) => {
                    // Someone else's reservation write is in flight.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(SequencerError::ClockBehind { behind_ms, .. })
                    if behind_ms <= SNOWFLAKE_WAIT_MS_MAX =>
                {
                    tokio::time::sleep(Duration::from_millis(behind_ms)).await;
                }
                Err(e @ SequencerError::ClockBehind { behind_ms, .. }) => {
                    return Err(ApiError::unavailable(
                        format!("snowflake: {e}"),
                        behind_ms.div_ceil(1000),
                    ));
                }
                Err(e) => return Err(ApiError::unavailable(format!("snowflake: {e}"), 1)),
            }
        }
        Err(ApiError::unavailable("snowflake: still waiting, retry", 1))
    }

    /// The worker's state.
    pub fn view(&self) -> SnowflakeView {
        let w = lock(&self.worker);
        SnowflakeView {
            worker_id: w.worker_id(),
            reserved_ts: w.sequencer().reserved_ts(),
            last_ts: w.sequencer().last_ts(),
            lease_expiry_ms: *lock(&self.lease_expiry_ms),
            stopped: w.sequencer().is_stopped(),
            stats: w.sequencer().stats(),
        }
    }

    /// Graceful shutdown: the reservation is already persisted (no ID is ever issued above
    /// it); give the worker id back so the next start can take it at once. Blocking.
    pub fn release(&self) -> Result<(), String> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let worker_id = lock(&self.worker).worker_id();
        lock(&self.store)
            .release_worker(SNOWFLAKE_NAMESPACE, worker_id, self.instance)
            .map_err(|e| e.to_string())
    }
}
