//! The concurrent front of a segment allocator, for the real server: many threads take IDs
//! with one atomic `fetch_add` and two plain loads, no lock on the hot path. A driver, not
//! protocol: it drives `sut`'s sans-IO [`SegmentAllocator`] and performs its store calls inline.
//!
//! IDs of a tag are `index · delta + remainder` (delta = 1 for a single store). The front keeps
//! a cursor over indexes and a *window* `[start, end)` of indexes it may issue: the current
//! block the sans-IO [`SegmentAllocator`] handed out (at most `block_ids` IDs, always within
//! the acknowledged claim). Taking an ID is:
//!
//! 1. `v = cursor.fetch_add(1)`: each value goes to exactly one thread;
//! 2. read `end` (acquire), then `start`;
//! 3. `start <= v < end` → the ID is `v · delta + remainder`.
//!
//! Why this is safe without a lock: windows only move up and never overlap, and the slow path
//! writes `start` before it publishes `end`. A thread that reads the new `end` therefore reads
//! the new (or a later) `start`; a thread that reads an old `end` and a new `start` sees an
//! empty window. So an accepted `v` always lies in one window that this instance was granted,
//! and no value is accepted twice because no value is handed out twice. Values that miss
//! (`v >= end`) send their thread to the slow path, which, under a mutex, asks the allocator for
//! the next block (performing store calls inline), publishes it and moves the cursor up to its
//! start. A thread whose value lies past the block another thread just published takes the
//! next block itself, until its value is in one or below one: a value of a granted block is
//! never dropped. A block that continues the window (it starts at the window's end, as a lone
//! server's next block does) extends it, `start` kept, so that a thread that drew a value of the
//! old block and reads the window only after the refill still finds it in. Only values that
//! fell between two blocks that do not touch (another server's range lies between) are skipped:
//! they were never this instance's, and skipping them is a gap, never a duplicate. So a lone
//! server hands out every ID of its segments, with no gap, within one incarnation.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sut::clock::Now;
use sut::id_store::IdStore;
use sut::segment::{IdBlock, SegmentAllocator, Take, Unavailable};

/// Slow-path rounds (allocator step + store calls) before giving up with `Busy`.
const SLOW_ROUNDS_MAX: usize = 16;
/// Hot-path retries after refills before giving up with `Busy`.
const HOT_RETRIES_MAX: usize = 64;
/// The largest block.
pub const BLOCK_IDS_MAX: u64 = 1 << 30;

/// Why no ID could be taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The allocator cannot issue (store unreachable or a permanent error).
    #[error("IDs unavailable: {0}")]
    Unavailable(Unavailable),
    /// The allocator is waiting (backoff or a claim renewal); retry shortly.
    #[error("IDs temporarily unavailable: the allocator is waiting for its store")]
    Busy,
}

/// The published window, alone on its cache line (it is read by every take, written rarely).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Window {
    end: AtomicU64,
    start: AtomicU64,
    delta: AtomicU64,
    remainder: AtomicU64,
}

/// Keeps the cursor alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Debug)]
struct Slow<S> {
    alloc: SegmentAllocator,
    store: S,
}

impl<S: IdStore> Slow<S> {
    /// Performs queued store calls inline; returns how many.
    fn pump(&mut self, now: Now) -> usize {
        let mut calls = 0;
        while let Some(req) = self.alloc.poll_request() {
            calls += 1;
            let reply = req.call.execute(&mut self.store);
            self.alloc.handle_reply(req.id, reply, now);
        }
        calls
    }

    fn tick(&mut self, now: Now) {
        if self
            .alloc
            .poll_timeout()
            .is_some_and(|due| due <= now.mono_ms)
        {
            self.alloc.handle_timeout(now);
        }
        self.pump(now);
    }

    /// The next block, and whether it had to wait for the store (the allocator had none ready:
    /// its buffers empty or its claim used up, so the grant or renewal was made inline).
    fn take(&mut self, now: Now, max: u64) -> Result<(Take, bool), IdError> {
        let mut waited = false;
        for _ in 0..SLOW_ROUNDS_MAX {
            self.tick(now);
            match self.alloc.take_block(now, max) {
                take @ (Take::Block(_) | Take::Degraded(_)) => {
                    self.pump(now);
                    return Ok((take, waited));
                }
                Take::Unavailable(why) => return Err(IdError::Unavailable(why)),
                Take::Pending => {
                    waited = true;
                    if self.pump(now) == 0 {
                        return Err(IdError::Busy);
                    }
                }
            }
        }
        Err(IdError::Busy)
    }
}

/// A segment allocator shared by many threads.
#[derive(Debug)]
pub struct ConcurrentIds<S, C> {
    cursor: Padded<AtomicU64>,
    window: Window,
    slow: Mutex<Slow<S>>,
    clock: C,
    block_ids: u64,
    /// The planted weakness `skip_on_refill` (TEST ONLY; see [`ConcurrentIds::skip_on_refill`]).
    skip_on_refill: bool,
    /// The planted weakness `past_block_repeat` (TEST ONLY; see
    /// [`ConcurrentIds::past_block_repeat`]).
    past_block_repeat: bool,
    /// How often each of its paths was taken.
    paths: PathCounts,
}

/// How often the front took each of its paths: what a run reached ([`FrontPaths`]).
#[derive(Debug, Default)]
struct PathCounts {
    refills: AtomicU64,
    takes_past_block: AtomicU64,
    batches_across_blocks: AtomicU64,
    refills_waited: AtomicU64,
    batches_waited: AtomicU64,
}

/// The paths of a front a run reached, with how often (`GET /metrics`:
/// `sut_id_paths_total{tag, path}`): a run that never took one proved nothing about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontPaths {
    /// Blocks published (`block_refill`).
    pub refills: u64,
    /// Takes whose value lay past the block another thread had just published, which took the
    /// next block themselves (`take_past_block`).
    pub takes_past_block: u64,
    /// Batches that took their IDs from more than one block (`batch_across_blocks`).
    pub batches_across_blocks: u64,
    /// Refills that found no block ready and waited for the store's grant or claim renewal
    /// (`refill_waited_for_store`; the allocator's prefetch keeps a segment ready ahead of need,
    /// so only segments used up faster than a grant comes reach it).
    pub refills_waited: u64,
    /// Batches that, having taken some IDs, waited for the store before the rest
    /// (`batch_waited_for_store`).
    pub batches_waited: u64,
}

impl FrontPaths {
    /// Each path by its name on `/metrics`, with its count.
    #[must_use]
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("block_refill", self.refills),
            ("take_past_block", self.takes_past_block),
            ("batch_across_blocks", self.batches_across_blocks),
            ("refill_waited_for_store", self.refills_waited),
            ("batch_waited_for_store", self.batches_waited),
        ]
    }
}

/// What one hot-path attempt found.
enum Attempt {
    /// Index `from`, with the window's delta and remainder.
    Hit {
        from: u64,
        delta: u64,
        remainder: u64,
    },
    /// Below the window: the cursor is being moved up; just retry.
    Behind,
    /// At or past the window's end: refill (unless someone else already did). The values
    /// `[v, v + n)` are this thread's and may fall in the next window.
    Past { seen_end: u64, v: u64, n: u64 },
}

impl<S: IdStore, C: Fn() -> Now> ConcurrentIds<S, C> {
    /// Wraps an allocator and its store. `block_ids` IDs are published at a time (at most
    /// [`BLOCK_IDS_MAX`]); `clock` is read on the slow path only.
    pub fn new(alloc: SegmentAllocator, store: S, clock: C, block_ids: u64) -> Self {
        Self {
            // An empty window: the first take goes to the slow path.
            cursor: Padded(AtomicU64::new(0)),
            window: Window::default(),
            slow: Mutex::new(Slow { alloc, store }),
            clock,
            block_ids: block_ids.clamp(1, BLOCK_IDS_MAX),
            skip_on_refill: false,
            past_block_repeat: false,
            paths: PathCounts::default(),
        }
    }

    /// The planted weakness `past_block_repeat` (`sut-server --weakness past_block_repeat`,
    /// TEST ONLY): a take whose value lies past the block another thread has just published
    /// answers the last ID of that block, taken for one nobody issued, rather than taking the
    /// next block for its own value; the thread that drew that ID hands it out too. Only blocks
    /// smaller than the takes racing for them reach it (`take_past_block`).
    #[must_use]
    pub fn past_block_repeat(mut self, on: bool) -> Self {
        self.past_block_repeat = on;
        self
    }

    /// The paths taken so far.
    #[must_use]
    pub fn paths(&self) -> FrontPaths {
        FrontPaths {
            refills: self.paths.refills.load(Ordering::Relaxed),
            takes_past_block: self.paths.takes_past_block.load(Ordering::Relaxed),
            batches_across_blocks: self.paths.batches_across_blocks.load(Ordering::Relaxed),
            refills_waited: self.paths.refills_waited.load(Ordering::Relaxed),
            batches_waited: self.paths.batches_waited.load(Ordering::Relaxed),
        }
    }

    /// The planted weakness `skip_on_refill` (`sut-server --weakness skip_on_refill`, TEST
    /// ONLY): a take that found the window used up refills it and then draws a fresh value
    /// from the cursor, never issuing the value it had drawn, which the refill put at the
    /// window's start: one ID skipped at every refill, never a duplicate.
    #[must_use]
    pub fn skip_on_refill(mut self, on: bool) -> Self {
        self.skip_on_refill = on;
        self
    }

    #[inline]
    fn attempt(&self) -> Attempt {
        let n = 1;
        let v = self.cursor.0.fetch_add(n, Ordering::Relaxed);
        let end = self.window.end.load(Ordering::Acquire);
        let start = self.window.start.load(Ordering::Relaxed);
        if v >= end {
            return Attempt::Past {
                seen_end: end,
                v,
                n,
            };
        }
        if v < start {
            return Attempt::Behind;
        }
        Attempt::Hit {
            from: v,
            delta: self.window.delta.load(Ordering::Relaxed),
            remainder: self.window.remainder.load(Ordering::Relaxed),
        }
    }

    /// One ID.
    #[inline]
    pub fn next_id(&self) -> Result<u64, IdError> {
        for _ in 0..HOT_RETRIES_MAX {
            match self.attempt() {
                Attempt::Hit {
                    from,
                    delta,
                    remainder,
                } => return Ok(from * delta + remainder),
                Attempt::Behind => {}
                Attempt::Past { seen_end, v, n } => {
                    if self.skip_on_refill {
                        // The planted weakness: the value drawn is given up after the refill.
                        let _ = self.refill(seen_end, v, 0)?;
                        continue;
                    }
                    if let Some(id) = self.refill_for(seen_end, v, n)?.first() {
                        return Ok(*id);
                    }
                }
            }
        }
        Err(IdError::Busy)
    }

    /// `n` IDs, increasing (possibly from several blocks).
    ///
    /// Batches claim their values with a compare-and-swap bounded by the window's end, so a
    /// batch never grabs values past the window (which would leave a gap at every refill).
    pub fn next_ids(&self, n: u64) -> Result<Vec<u64>, IdError> {
        let mut ids = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1 << 20));
        let rounds_max = HOT_RETRIES_MAX.saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
        // The window this batch last took from, whether it went on in another, and whether it
        // waited for the store after it had taken some.
        let (mut took_from, mut across, mut waited) = (None, false, false);
        for _ in 0..rounds_max {
            let missing = n - ids.len() as u64;
            if missing == 0 {
                if across {
                    self.paths
                        .batches_across_blocks
                        .fetch_add(1, Ordering::Relaxed);
                }
                if waited {
                    self.paths.batches_waited.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(ids);
            }
            let cursor = self.cursor.0.load(Ordering::Relaxed);
            let end = self.window.end.load(Ordering::Acquire);
            let start = self.window.start.load(Ordering::Relaxed);
            if cursor >= end {
                let (more, store, _) = self.refill_waited(end, cursor, 0)?;
                ids.extend(more);
                waited |= store && !ids.is_empty();
                continue;
            }
            let from = cursor.max(start);
            let crossed = took_from.is_some_and(|e| e != end);
            let to = end.min(from.saturating_add(missing));
            if self
                .cursor
                .0
                .compare_exchange(cursor, to, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                let delta = self.window.delta.load(Ordering::Relaxed);
                let remainder = self.window.remainder.load(Ordering::Relaxed);
                ids.extend((from..to).map(|v| v * delta + remainder));
                across |= crossed;
                took_from = Some(end);
            }
        }
        if ids.len() as u64 == n {
            Ok(ids)
        } else {
            Err(IdError::Busy)
        }
    }

    /// [`Self::refill`] for this thread's values `[v, v + n)`, again while they lie past the
    /// window published (another thread's refill took a block that ends below them): the next
    /// block is theirs to take. Returns what falls in a window (empty only when `v` lies below
    /// the window: between two blocks that do not touch, never this instance's).
    fn refill_for(&self, mut seen_end: u64, v: u64, n: u64) -> Result<Vec<u64>, IdError> {
        for _ in 0..HOT_RETRIES_MAX {
            // The window's end as the refill saw it, under the lock: read afterwards, another
            // thread's refill may have moved it past `v` already, and `v` would be given up.
            let (ids, _, end) = self.refill_waited(seen_end, v, n)?;
            if !ids.is_empty() || v < end {
                return Ok(ids);
            }
            self.paths.takes_past_block.fetch_add(1, Ordering::Relaxed);
            if self.past_block_repeat && end > 0 {
                // The planted weakness: the last ID of the block another thread published.
                let delta = self.window.delta.load(Ordering::Relaxed);
                let remainder = self.window.remainder.load(Ordering::Relaxed);
                return Ok(vec![(end - 1) * delta + remainder]);
            }
            seen_end = end;
        }
        Err(IdError::Busy)
    }

    /// Publishes the next block unless another thread already moved the window past
    /// `seen_end`, then returns the IDs of this thread's values `[v, v + n)` that fall in the
    /// window now published (so a refill at a block boundary skips nothing), or a
    /// degraded-mode ID when that is what the allocator gave.
    fn refill(&self, seen_end: u64, v: u64, n: u64) -> Result<Vec<u64>, IdError> {
        self.refill_waited(seen_end, v, n).map(|(ids, _, _)| ids)
    }

    /// [`Self::refill`], whether its block had to wait for the store, and the window's end it
    /// computed the IDs from.
    fn refill_waited(
        &self,
        seen_end: u64,
        v: u64,
        n: u64,
    ) -> Result<(Vec<u64>, bool, u64), IdError> {
        let mut slow = self
            .slow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut waited = false;
        if self.window.end.load(Ordering::Acquire) == seen_end {
            let (take, store) = slow.take((self.clock)(), self.block_ids)?;
            if store {
                waited = true;
                self.paths.refills_waited.fetch_add(1, Ordering::Relaxed);
            }
            match take {
                Take::Block(block) => self.publish(&block),
                Take::Degraded(id) => return Ok((vec![id], waited, seen_end)),
                Take::Pending | Take::Unavailable(_) => {
                    unreachable!("Slow::take answers only blocks or errors")
                }
            }
        }
        // Under the lock the window cannot move: read it plainly.
        let end = self.window.end.load(Ordering::Acquire);
        let start = self.window.start.load(Ordering::Relaxed);
        let (from, to) = (v.max(start), v.saturating_add(n).min(end));
        let delta = self.window.delta.load(Ordering::Relaxed);
        let remainder = self.window.remainder.load(Ordering::Relaxed);
        Ok((
            (from..to.max(from))
                .map(|v| v * delta + remainder)
                .collect(),
            waited,
            end,
        ))
    }

    fn publish(&self, block: &IdBlock) {
        debug_assert!(block.count > 0 && block.count <= BLOCK_IDS_MAX);
        let (delta, remainder) = (block.delta, block.start % block.delta);
        let start = block.start / delta;
        let end = start + block.count;
        let old_end = self.window.end.load(Ordering::Relaxed);
        debug_assert!(
            start >= old_end,
            "windows must move up: {start} < {old_end}"
        );
        // A block that continues the window extends it (see the module doc): the old block's
        // values stay issuable by the threads that drew them.
        let continues = old_end > 0
            && start == old_end
            && self.window.delta.load(Ordering::Relaxed) == delta
            && self.window.remainder.load(Ordering::Relaxed) == remainder;
        self.paths.refills.fetch_add(1, Ordering::Relaxed);
        // Order matters: start (and the constants) before end; see the module doc.
        if !continues {
            self.window.start.store(start, Ordering::Relaxed);
        }
        self.window.delta.store(delta, Ordering::Relaxed);
        self.window.remainder.store(remainder, Ordering::Relaxed);
        self.window.end.store(end, Ordering::Release);
        self.cursor.0.fetch_max(start, Ordering::Relaxed);
    }

    /// Periodic upkeep (lease renewals, claim raises, prefetch), called by a background task.
    pub fn tick(&self) {
        let mut slow = self
            .slow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slow.tick((self.clock)());
    }

    /// Runs `f` on the allocator (health pages), then performs any store calls it queued.
    pub fn with_allocator<R>(&self, f: impl FnOnce(&mut SegmentAllocator) -> R) -> R {
        let mut slow = self
            .slow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = f(&mut slow.alloc);
        let now = (self.clock)();
        slow.pump(now);
        result
    }

    /// Graceful shutdown, once no more IDs will be taken: gives the unissued IDs of both
    /// buffers back to the pool.
    ///
    /// IDs of the published window are never returned (the allocator counts them as issued),
    /// so a straggling thread still finishing that window cannot collide with the pool.
    pub fn shutdown(&self) {
        let mut slow = self
            .slow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slow.alloc.shutdown();
        let now = (self.clock)();
        slow.pump(now);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use sut::id_store::{InstanceId, MemoryIdStore, TagSpec};
    use sut::segment::AllocatorConfig;

    fn front(step: u64, block_ids: u64) -> ConcurrentIds<MemoryIdStore, impl Fn() -> Now> {
        let mut store = MemoryIdStore::new();
        store.create_tag("t", &TagSpec::simple(step)).unwrap();
        let alloc =
            SegmentAllocator::new(AllocatorConfig::new("t", InstanceId(1)), Now::both(0)).unwrap();
        ConcurrentIds::new(alloc, store, || Now::both(0), block_ids)
    }

    #[test]
    fn single_thread_ids_are_consecutive() {
        let ids = front(100, 7);
        let taken: Vec<u64> = (0..1_000).map(|_| ids.next_id().unwrap()).collect();
        assert_eq!(taken, (1..=1_000).collect::<Vec<_>>());
    }

    #[test]
    fn batches_increase_and_cross_blocks() {
        let ids = front(50, 16);
        let a = ids.next_ids(40).unwrap();
        let b = ids.next_ids(100).unwrap();
        assert_eq!(a, (1..=40).collect::<Vec<_>>());
        assert_eq!(b, (41..=140).collect::<Vec<_>>());
    }

    #[test]
    fn threads_never_share_an_id() {
        let ids = Arc::new(front(64, 5));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let ids = Arc::clone(&ids);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..5_000 {
                        if (i + t) % 7 == 0 {
                            mine.extend(ids.next_ids(3).unwrap());
                        } else {
                            mine.push(ids.next_id().unwrap());
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut all = BTreeSet::new();
        let mut total = 0;
        for handle in handles {
            let mine = handle.join().unwrap();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "each thread sees increasing IDs"
            );
            total += mine.len();
            all.extend(mine);
        }
        assert_eq!(all.len(), total, "no ID was handed to two threads");
        // One store, contiguous blocks: racing threads skip nothing (ids.gaps of a lone server).
        let highest = all.iter().next_back().copied().unwrap();
        assert_eq!(highest, total as u64, "no gap: {total} IDs up to {highest}");
    }

    #[test]
    fn a_thread_past_a_small_block_takes_the_next_one_and_skips_nothing() {
        // Blocks of 1: every take past the window finds another thread's refill too small.
        let all = eight_threads_take(&Arc::new(front(3, 1)));
        assert_dense(&all, 16_000);
    }

    /// 2,000 IDs taken by each of eight threads at once from `ids`, sorted.
    fn eight_threads_take<F: Fn() -> Now + Send + Sync + 'static>(
        ids: &Arc<ConcurrentIds<MemoryIdStore, F>>,
    ) -> Vec<u64> {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let ids = Arc::clone(ids);
                std::thread::spawn(move || {
                    (0..2_000)
                        .map(|_| ids.next_id().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        all
    }

    /// `all` (sorted) is exactly 1..=n; the first difference is named, not the whole list.
    fn assert_dense(all: &[u64], n: u64) {
        let first_off = all
            .iter()
            .zip(1..)
            .find(|(got, want)| **got != *want)
            .map(|(got, want)| format!("{got} where {want} was due"));
        assert!(
            first_off.is_none() && all.len() as u64 == n,
            "{} IDs, the last {:?}; first difference: {first_off:?}",
            all.len(),
            all.last()
        );
    }

    #[test]
    fn paths_are_counted() {
        let ids = front(100, 4);
        assert_eq!(ids.next_ids(3).unwrap(), [1, 2, 3]);
        assert_eq!(ids.paths().batches_across_blocks, 0);
        assert_eq!(ids.next_ids(3).unwrap(), [4, 5, 6]);
        let paths = ids.paths();
        assert_eq!((paths.refills, paths.batches_across_blocks), (2, 1));
        // The first refill found no segment and waited for the grant; the next was prefetched.
        assert_eq!(paths.refills_waited, 1);
        assert_eq!(paths.takes_past_block, 0);
    }

    #[test]
    fn a_take_past_a_small_block_is_counted_and_the_planted_repeat_hands_out_its_last_id() {
        // Blocks of 1 and eight threads: takes land past blocks others just published.
        let run = |planted: bool| {
            let ids = Arc::new(front(3, 1).past_block_repeat(planted));
            (eight_threads_take(&ids), ids.paths())
        };
        let (all, paths) = run(false);
        assert_dense(&all, 16_000);
        if paths.takes_past_block > 0 {
            // Reached (as it is on a busy multi-core machine, not on every schedule).
            let (planted, planted_paths) = run(true);
            let mut distinct = planted.clone();
            distinct.dedup();
            assert!(
                distinct.len() < planted.len() || planted_paths.takes_past_block == 0,
                "the planted repeat hands an ID out twice once the path is reached"
            );
        }
    }

    #[test]
    fn the_planted_skip_on_refill_leaves_a_gap_at_every_refill() {
        let ids = front(100, 7).skip_on_refill(true);
        let taken: Vec<u64> = (0..20).map(|_| ids.next_id().unwrap()).collect();
        // Blocks of 7 from 1: the first ID of each block after the first is given up.
        assert_eq!(
            taken,
            [
                1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 23
            ]
        );
    }

    #[test]
    fn region_residues_survive_the_index_space() {
        let mut store = MemoryIdStore::new();
        store
            .create_tag(
                "t",
                &TagSpec {
                    first_id: 1,
                    step: 10,
                    delta: 4,
                    remainder: 3,
                },
            )
            .unwrap();
        let alloc =
            SegmentAllocator::new(AllocatorConfig::new("t", InstanceId(1)), Now::both(0)).unwrap();
        let ids = ConcurrentIds::new(alloc, store, || Now::both(0), 3);
        let taken: Vec<u64> = (0..30).map(|_| ids.next_id().unwrap()).collect();
        assert_eq!(taken, (0..30).map(|k| 3 + 4 * k).collect::<Vec<_>>());
    }

    #[test]
    fn unknown_tag_surfaces_as_unavailable() {
        let alloc =
            SegmentAllocator::new(AllocatorConfig::new("missing", InstanceId(1)), Now::both(0))
                .unwrap();
        let ids = ConcurrentIds::new(alloc, MemoryIdStore::new(), || Now::both(0), 8);
        assert!(matches!(
            ids.next_id(),
            Err(IdError::Unavailable(Unavailable::Permanent(_)))
        ));
    }
}
