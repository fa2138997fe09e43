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
//! - **Semantic IDs** (`sut::snowflake::semantic`): `BB` + 10-digit seconds + 3-digit machine +
//!   5-digit sequence, on the same worker lease (the machine number is the worker id) through
//!   `sut`'s [`LeasedSemantic`], the binding the simulator drives too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use axum::http::StatusCode;
use serde::Serialize;

use super::clock::RealClock;
use super::db::{Db, IdStoreBox};
use super::error::ApiError;
use super::front::{ConcurrentIds, IdError};
use super::metrics::Metrics;
use sut::clock::Now;
use sut::id_store::{CounterDurability, IdStore, InstanceId, StoreError, TagRow, TagSpec};
use sut::segment::{AllocatorConfig, Health, SegmentAllocator, Unavailable};
use sut::snowflake::holder::{HolderConfig, HolderEvent};
use sut::snowflake::leased::{IdAnswer, LeasedIds, RequestWaits, SemanticId};
use sut::snowflake::semantic::SemanticConfig;
use sut::snowflake::{Decoded, SequencerStats, WorkerConfig};

/// Longest tag name, in bytes.
pub const TAG_LEN_MAX_BYTES: usize = 64;
/// Most tags one server serves (each has its own SQLite connection).
pub const TAGS_MAX: usize = 256;
/// Namespace of the server's Snowflake worker leases.
pub const SNOWFLAKE_NAMESPACE: &str = "snowflake";
/// Key of the durable counter that numbers process incarnations.
pub const INSTANCE_COUNTER: &str = "sut-server/instance";
/// Rounds of asking (each a wait, a store call or an answer) before a Snowflake or semantic
/// request gives up with 503: a guard only, `sut`'s [`RequestWaits`] bound the waits.
const SNOWFLAKE_ROUNDS_MAX: usize = 1_024;
/// The waits a Snowflake or semantic request sits out inside itself ([`RequestWaits::DEFAULT`]:
/// a clock up to 1.5 s behind, the per-second limit 10 ms, a start above the reservation 2 s),
/// the same the simulator's ID nodes use; beyond them a 503 with `Retry-After`.
pub const REQUEST_WAITS: RequestWaits = RequestWaits::DEFAULT;
/// A clock behind by up to this much is waited out inside a request (see [`REQUEST_WAITS`]).
pub const SNOWFLAKE_WAIT_MS_MAX: u64 = REQUEST_WAITS.clock_behind_ms_max;
/// Reach of each persisted Snowflake reservation: what a restart on the same worker id must
/// wait out at most (Leaf writes every 3 s; shorter here, the write is one fsync).
pub const SNOWFLAKE_RESERVE_AHEAD_MS: u64 = 1_000;
/// The business types served by default: orders, users, products (the design's examples).
pub const SEMANTIC_BIZ_DEFAULT: [&str; 3] = ["OD", "US", "PM"];

/// The semantic IDs a server issues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemanticSpec {
    /// The business types served (two capital letters each); any other is a 404.
    pub biz: Vec<String>,
    /// IDs per second per business type and machine (at most 100,000: five digits).
    pub per_second: u64,
}

impl Default for SemanticSpec {
    fn default() -> Self {
        Self {
            biz: SEMANTIC_BIZ_DEFAULT.map(str::to_owned).to_vec(),
            per_second: sut::snowflake::semantic::SEQ_MAX + 1,
        }
    }
}

impl SemanticSpec {
    /// Whether the spec can be served: a message naming what is wrong otherwise.
    ///
    /// # Errors
    /// A business type that is not two capital letters, none, or a rate outside 2..=100,000.
    pub fn validate(&self) -> Result<(), String> {
        if self.biz.is_empty() {
            return Err("--semantic-biz: name at least one business type".to_owned());
        }
        if let Some(bad) = self.biz.iter().find(|b| !is_biz(b)) {
            return Err(format!(
                "--semantic-biz {bad}: a business type is two capital letters (OD, US, PM)"
            ));
        }
        if !(2..=sut::snowflake::semantic::SEQ_MAX + 1).contains(&self.per_second) {
            return Err(format!(
                "--semantic-per-second {}: give 2 to 100000 (five digits of sequence)",
                self.per_second
            ));
        }
        Ok(())
    }
}

/// Two ASCII capital letters.
fn is_biz(biz: &str) -> bool {
    biz.len() == 2 && biz.bytes().all(|b| b.is_ascii_uppercase())
}

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
    ids: ConcurrentIds<IdStoreBox, ClockFn>,
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

    /// The front's paths taken so far.
    #[must_use]
    pub fn paths(&self) -> crate::front::FrontPaths {
        self.ids.paths()
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
    db: Db,
    instance: InstanceId,
    clock: RealClock,
    block_ids: u64,
    control: Arc<Mutex<IdStoreBox>>,
    flaw: Option<sut::flaw::Flaw>,
    step_max: Option<u64>,
    weakness: Option<crate::listen::Weakness>,
}

impl Tags {
    /// A registry over the database at `db`; `control` is the connection for admin calls.
    #[must_use]
    pub fn new(
        db: &Db,
        instance: InstanceId,
        clock: RealClock,
        block_ids: u64,
        control: Arc<Mutex<IdStoreBox>>,
    ) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            db: db.clone(),
            instance,
            clock,
            block_ids,
            control,
            flaw: None,
            step_max: None,
            weakness: None,
        }
    }

    /// Plants a weakness of the deployed server in every allocator and store this registry
    /// creates (TEST ONLY: `skip_on_refill`, `past_block_repeat`, `unguarded_fallback`; the
    /// others are not theirs).
    #[must_use]
    pub fn with_weakness(mut self, weakness: Option<crate::listen::Weakness>) -> Self {
        self.weakness = weakness;
        self
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
        let unguarded = self.weakness == Some(crate::listen::Weakness::UnguardedFallback);
        let store = self
            .db
            .open_ids_planted(CounterDurability::EveryWrite, unguarded)
            .map_err(|e| ApiError::unavailable(e, 1))?;
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
            ids: ConcurrentIds::new(alloc, store, clock_fn, self.block_ids)
                .skip_on_refill(self.weakness == Some(crate::listen::Weakness::SkipOnRefill))
                .past_block_repeat(self.weakness == Some(crate::listen::Weakness::PastBlockRepeat)),
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
pub fn next_instance(store: &mut dyn IdStore, now: Now) -> Result<InstanceId, StoreError> {
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

/// The server's Snowflake worker: the lease holder of `sut` (the same reply handling the
/// simulator and the model run), its store calls performed inline on the ID store.
#[derive(Debug)]
pub struct Snowflake {
    /// The worker lease and the semantic generators on it (`sut`'s: what each request is
    /// answered is decided there).
    ids: Mutex<LeasedIds>,
    semantic_biz: Vec<String>,
    store: Arc<Mutex<IdStoreBox>>,
    clock: RealClock,
    released: AtomicBool,
    metrics: Arc<Metrics>,
}

/// Most store calls one [`Snowflake::drive`] performs (acquire, then a reservation, then a
/// renewal at most).
const HOLDER_CALLS_MAX: usize = 4;

impl Snowflake {
    /// Leases a worker id and builds the worker above the reservation the lease carried.
    pub fn start(
        (cfg, semantic): (WorkerConfig, &SemanticSpec),
        store: Arc<Mutex<IdStoreBox>>,
        instance: InstanceId,
        lease_ms: u64,
        clock: RealClock,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        semantic.validate()?;
        let semantic_cfg = SemanticConfig {
            prefix: semantic.biz[0].clone(),
            // A backward clock within the request's wait is waited out by the sequencer; further
            // behind is a 503 with `Retry-After`.
            rollback_ms_max: SNOWFLAKE_WAIT_MS_MAX,
            rollback: sut::snowflake::RollbackPolicy::Refuse,
            reserve_ahead_ms: cfg.reserve_ahead_ms,
            per_second: semantic.per_second,
            flaw: cfg.flaw,
        };
        // Calls run inline: an answer is never late, so calls never time out.
        let holder = HolderConfig::new(SNOWFLAKE_NAMESPACE, instance, cfg, lease_ms, u64::MAX);
        let snowflake = Self {
            ids: Mutex::new(LeasedIds::new(holder, semantic_cfg, REQUEST_WAITS)),
            semantic_biz: semantic.biz.clone(),
            store,
            clock,
            released: AtomicBool::new(false),
            metrics,
        };
        snowflake
            .drive()
            .map_err(|e| format!("snowflake worker lease: {e}"))?;
        if lock(&snowflake.ids).holder().worker().is_none() {
            return Err("snowflake worker lease: none acquired".to_owned());
        }
        Ok(snowflake)
    }

    /// The layout's decoding of `id`.
    pub fn decode(&self, id: u64) -> Decoded {
        lock(&self.ids).holder().config().worker.layout.decode(id)
    }

    /// Performs the store calls the lease holder asks for (a lease, a reservation, a renewal),
    /// each outside the holder's lock. Blocking.
    pub fn drive(&self) -> Result<(), String> {
        for _ in 0..HOLDER_CALLS_MAX {
            let now = self.clock.now();
            let Some((id, mut call)) = lock(&self.ids).poll_request(now) else {
                return Ok(());
            };
            call.set_store_now(now.wall_ms);
            let reply = call.execute(&mut *lock(&self.store));
            match lock(&self.ids).handle_reply(id, reply, now) {
                HolderEvent::Failed => return Err("the store refused the call".to_owned()),
                HolderEvent::LeaseLost => return Err("the worker lease was lost".to_owned()),
                HolderEvent::Unusable(e) => return Err(format!("the leased worker: {e}")),
                HolderEvent::Renewed => {
                    self.metrics
                        .snowflake_reservations
                        .fetch_add(1, Ordering::Relaxed);
                }
                HolderEvent::Ignored | HolderEvent::Acquired { .. } => {}
            }
        }
        Ok(())
    }

    /// Background upkeep: keep the reservation ahead of the clock; the holder renews the lease
    /// every third of its length (and acquires a new one after a lost lease). Blocking.
    pub fn tick(&self) -> Result<(), String> {
        if self.released.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = self.clock.now();
        lock(&self.ids).reserve_ahead(now);
        self.drive()
    }

    /// Runs [`Self::drive`] on the blocking pool.
    async fn drive_async(self: &Arc<Self>) -> Result<(), ApiError> {
        let me = Arc::clone(self);
        match tokio::task::spawn_blocking(move || me.drive()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ApiError::unavailable(format!("snowflake: {e}"), 1)),
            Err(e) => Err(ApiError::internal(format!("snowflake task: {e}"))),
        }
    }

    /// One ID: asks `sut`'s [`LeasedIds`] and does what it answers (waits, store calls), until
    /// it answers an ID or unavailable.
    pub async fn next_id(self: &Arc<Self>) -> Result<u64, ApiError> {
        self.ask(|ids, now, waited_ms| ids.next_snowflake(now, waited_ms))
            .await
            .map_err(|(e, retry_after_s)| {
                ApiError::unavailable(format!("snowflake: {e}"), retry_after_s)
            })
    }

    /// One semantic ID of business type `biz` and its 18 digits as a number: what `sut`'s
    /// [`LeasedIds`] answers (the per-second limit or a clock behind beyond its waits is a 503
    /// with `Retry-After`, never a wrap or a repeat).
    ///
    /// # Errors
    /// 400 for a malformed business type, 404 for one not served, 503 as above.
    pub async fn next_semantic(self: &Arc<Self>, biz: &str) -> Result<(String, u64), ApiError> {
        if !is_biz(biz) {
            return Err(ApiError::bad(
                "biz",
                "a business type is two capital letters (OD, US, PM)",
            ));
        }
        if !self.semantic_biz.iter().any(|b| b == biz) {
            return Err(ApiError::field(
                StatusCode::NOT_FOUND,
                "biz",
                format!(
                    "business type {biz} is not served here (served: {})",
                    self.semantic_biz.join(", ")
                ),
            ));
        }
        let SemanticId { text, number, .. } = self
            .ask(|ids, now, waited_ms| ids.next_semantic(biz, now, waited_ms))
            .await
            .map_err(|(e, retry_after_s)| {
                ApiError::unavailable(format!("semantic: no {biz} ID: {e}"), retry_after_s)
            })?;
        Ok((text, number))
    }

    /// Asks `next` until it answers an ID (or unavailable: the reason and `Retry-After` in
    /// seconds), sleeping where it says to wait and performing the store calls it asks for.
    async fn ask<T>(
        self: &Arc<Self>,
        mut next: impl FnMut(&mut LeasedIds, sut::clock::Now, u64) -> IdAnswer<T>,
    ) -> Result<T, (String, u64)> {
        let started = self.clock.now();
        for _ in 0..SNOWFLAKE_ROUNDS_MAX {
            let now = self.clock.now();
            let waited_ms = now.mono_ms.saturating_sub(started.mono_ms);
            let (answer, wants_call) = {
                let mut ids = lock(&self.ids);
                let answer = next(&mut ids, now, waited_ms);
                (answer, ids.wants_call(now))
            };
            match answer {
                IdAnswer::Id(id) => {
                    if wants_call {
                        // Persist ahead in the background; this answer does not depend on it.
                        let me = Arc::clone(self);
                        drop(tokio::task::spawn_blocking(move || me.drive()));
                    }
                    return Ok(id);
                }
                IdAnswer::WaitUntil { wall_ms } => {
                    // In short slices: a clock that steps meanwhile is read again.
                    let wait_ms = wall_ms.saturating_sub(now.wall_ms).clamp(1, 50);
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                }
                IdAnswer::Drive => self
                    .drive_async()
                    .await
                    .map_err(|e| (e.error, e.retry_after_s.unwrap_or(1)))?,
                IdAnswer::Unavailable {
                    retry_after_ms,
                    why,
                } => return Err((why.to_string(), retry_after_ms.div_ceil(1000))),
            }
        }
        Err(("still waiting, retry".to_owned(), 1))
    }

    /// The worker's state.
    pub fn view(&self) -> SnowflakeView {
        let ids = lock(&self.ids);
        let h = ids.holder();
        let Some(w) = h.worker() else {
            return SnowflakeView {
                worker_id: 0,
                reserved_ts: 0,
                last_ts: 0,
                lease_expiry_ms: h.lease_expiry_ms(),
                stopped: true,
                stats: SequencerStats::default(),
            };
        };
        SnowflakeView {
            worker_id: w.worker_id(),
            reserved_ts: w.sequencer().reserved_ts(),
            last_ts: w.sequencer().last_ts(),
            lease_expiry_ms: h.lease_expiry_ms(),
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
        let (worker_id, instance) = {
            let ids = lock(&self.ids);
            let h = ids.holder();
            let Some(w) = h.worker() else {
                return Ok(()); // no lease to give back
            };
            (w.worker_id(), h.config().instance)
        };
        lock(&self.store)
            .release_worker(SNOWFLAKE_NAMESPACE, worker_id, instance)
            .map_err(|e| e.to_string())
    }
}
