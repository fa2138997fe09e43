//! The segment allocator against a hostile ID store: every store call may be answered with any
//! reply the store's contract allows — version conflicts, stale rows (an older version, a lower
//! `max_id`), stale leases (a lower claim than acknowledged before), short and pooled grants,
//! nothing claimed, errors, lost leases — or never, late (after the request timeout), twice, out
//! of order, misrouted to a request of another kind, or under a request id that was never asked
//! (a future id, another incarnation's); time jumps arbitrarily, past leases and timeouts; the
//! process shuts down and restarts. The properties are the allocator's own promises
//! (`sut::segment`'s docs), checked after every step by a referee that sees only what crosses
//! its boundary (store calls asked for, replies delivered, IDs handed out, each at its monotonic
//! time):
//!
//! - no ID twice, and IDs strictly increasing, within one incarnation ("monotonic per
//!   instance");
//! - every ID lies in a segment granted by a store reply to an `Allocate` this incarnation asked
//!   for (its residue class included), strictly below the claim acknowledged for that segment
//!   (by the grant or a renewal it asked for), and is handed out while that segment's lease is
//!   provable by the allocator's own clock: strictly before `sent + lease_ms - drift_ms_max`
//!   of the grant or a renewal (Gray & Cheriton);
//! - each `Allocate` carries a `min_id` above every ID already issued; each `Release` promises
//!   truthfully that nothing at or above its `used_end` was issued, and the released segment is
//!   not issued from again; request ids are never reused;
//! - each `Allocate` asks for the step Leaf's rule gives from the lifetimes of the segments used
//!   up before it (under 15 minutes: doubled, under 30: kept, otherwise halved; between the
//!   tag's step and the cap), its thresholds checked to the millisecond by a directed test;
//! - it never panics on any reply, and `check_invariants()` holds after every step;
//! - its counters (`AllocatorStats`, what the server's health view reports) only grow within
//!   an incarnation, never wrap, and `issued`, `degraded_issued`, `pending` and `unavailable`
//!   count exactly the IDs handed out and the answers given.
//!
//! The correct allocator keeps them for every sequence; the flaws and a few deliberately wrong
//! wrappers break them, and the tests below show each check firing. A coverage test shows that
//! the adversary reaches what it claims to (conflicts, stale replies, timeouts, duplicates,
//! unknown ids, lease expiry, …).
//!
//! Replies *outside* the store's contract (a grant below `min_id` or misrouted to another
//! `Allocate`, a claim outside its segment, a zero `delta`, a reversed segment, one past 2^62, a
//! huge step) are a different adversary ([`How::Malformed`]): the allocator keeps the same
//! promises against it, refusing such grants (counted like failed fetches) and clamping such
//! claims into their segment; the tests at the end show each.

use std::collections::{BTreeMap, BTreeSet};

use leased_ids::LeaseView;
use panics::unpanicked;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use sut::clock::Now;
use sut::edge::{Edges, Observed as _};
use sut::flaw::Flaw;
use sut::id_store::{
    AllocRequest, Grant, InstanceId, Lease, SEGMENT_ID_LIMIT, Segment, StoreCall, StoreError,
    StoreReply, TagRow, WorkerLease, align_up, fresh_segment,
};
use sut::segment::{
    AllocatorConfig, AllocatorStats, DEGRADED_FLAG, DEGRADED_NAMESPACE, DegradedConfig, IdBlock,
    Request, SegmentAllocator, StepPolicy, Take, edges,
};
use sut::snowflake::{Layout, WorkerConfig};

#[path = "support/leased_ids.rs"]
mod leased_ids;
#[path = "support/panics.rs"]
mod panics;

const TAG: &str = "order";
const LEASE_MS: u64 = 1_000;
const DRIFT_MS: u64 = 50;
const TIMEOUT_MS: u64 = 100;
const CASES: u32 = 256;

/// The tag and the allocator's knobs, per case.
#[derive(Clone, Copy, Debug)]
struct Setup {
    delta: u64,
    remainder: u64,
    tag_step: u64,
    step_max: u64,
    claim_pct: u8,
    prefetch_used_pct: u8,
    /// Degraded mode on (a Snowflake worker of [`DEGRADED_LAYOUT`] leased as `WORKER_ID`).
    degraded: bool,
    /// The tag starts a few segments before the end of the ID space (2^62).
    near_end: bool,
}

impl Setup {
    /// Where the tag starts: at 1, or 10 steps of its delta before 2^62.
    fn first_id(&self) -> u64 {
        if self.near_end {
            SEGMENT_ID_LIMIT - 10 * self.delta
        } else {
            1
        }
    }

    const SMALL: Self = Self {
        delta: 1,
        remainder: 0,
        tag_step: 4,
        step_max: 16,
        claim_pct: 25,
        prefetch_used_pct: 50,
        degraded: false,
        near_end: false,
    };
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        1u64..=3,
        0u64..3,
        1u64..=8,
        // Below the tag's step at times: the tag's step is then the cap.
        2u64..=32,
        prop::sample::select(vec![1u8, 25, 50, 100]),
        prop::sample::select(vec![10u8, 50, 100]),
        prop::bool::ANY,
        prop::bool::weighted(0.25),
    )
        .prop_map(
            |(
                delta,
                remainder,
                tag_step,
                step_max,
                claim_pct,
                prefetch_used_pct,
                degraded,
                near_end,
            )| Setup {
                delta,
                remainder: remainder % delta,
                tag_step,
                step_max,
                claim_pct,
                prefetch_used_pct,
                degraded,
                near_end,
            },
        )
}

/// The degraded worker's layout: 2 bits of sequence, so that a few IDs in one millisecond
/// overflow it (62 bits in all would fit; 52 leave the flag's room plainly visible).
const DEGRADED_LAYOUT: Layout = Layout {
    time_bits: 41,
    worker_bits: 9,
    seq_bits: 2,
    epoch_ms: 1_577_836_800_000,
    unit_ms: 1,
};
/// The degraded worker's id in [`DEGRADED_NAMESPACE`].
const WORKER_ID: u32 = 7;
/// How far ahead the degraded worker keeps its time reservation.
const RESERVE_AHEAD_MS: u64 = 400;

/// The allocator's configuration; with degraded mode on, its worker starts strictly above
/// `floor_ts`, the reservation its worker id carried in the store.
fn config(setup: &Setup, instance: u64, flaw: Option<Flaw>, floor_ts: u64) -> AllocatorConfig {
    let degraded = setup.degraded.then(|| DegradedConfig {
        worker: WorkerConfig {
            layout: DEGRADED_LAYOUT,
            reserve_ahead_ms: RESERVE_AHEAD_MS,
            ..WorkerConfig::default()
        },
        worker_id: WORKER_ID,
        reserved_ts: floor_ts,
    });
    AllocatorConfig {
        degraded,
        step: StepPolicy::Leaf {
            step_max: setup.step_max,
        },
        prefetch_used_pct: setup.prefetch_used_pct,
        claim_pct: setup.claim_pct,
        lease_ms: LEASE_MS,
        drift_ms_max: DRIFT_MS,
        renew_interval_ms: 300,
        request_timeout_ms: TIMEOUT_MS,
        cas_retries_max: 1,
        backoff_ms: 20,
        backoff_ms_max: 200,
        failures_before_unavailable: 3,
        flaw,
        ..AllocatorConfig::new(TAG, InstanceId(instance))
    }
}

// ---------------------------------------------------------------------------------------------
// The referee: the allocator's promises, on its boundary traffic.

/// What crossed the allocator's boundary, at its monotonic time.
#[derive(Clone, Debug)]
enum Seen {
    /// It asked for this store call.
    Sent { req: Request, mono: u64 },
    /// This reply was delivered to it under request id `id`.
    Delivered {
        id: u64,
        reply: StoreReply,
        mono: u64,
    },
    /// It handed out these IDs.
    Issued { block: IdBlock, mono: u64 },
    /// It handed out a degraded-mode ID.
    Degraded { id: u64 },
}

/// A segment granted to this incarnation, with the best claim and lease it was told of.
#[derive(Clone, Copy, Debug)]
struct Credit {
    segment: Segment,
    claim_end: u64,
    /// Strictly before this monotonic instant the lease is provable.
    deadline_mono: u64,
    /// When the grant was delivered: the segment's lifetime counts from here.
    granted_mono: u64,
    /// A Release of its start was sent since it was granted.
    released: bool,
}

fn contains(segment: &Segment, x: u64) -> bool {
    segment.delta > 0
        && x >= segment.start
        && x < segment.end
        && (x - segment.start).is_multiple_of(segment.delta)
}

/// Checks one incarnation's promises, one observation at a time. Where the boundary is
/// ambiguous (two grants of one start, a renewal reply the allocator may have ignored) it
/// credits the allocator with the most it could know, so it never blames a correct one.
struct Referee {
    drift_ms_max: u64,
    calls: BTreeMap<u64, (StoreCall, u64)>,
    credits: Vec<Credit>,
    issued: BTreeSet<u64>,
    last: Option<u64>,
    /// With degraded mode on: what the referee knows of the degraded worker.
    degraded: Option<DegradedView>,
    /// Leaf's step rule, when checked.
    steps: Option<Steps>,
}

/// Leaf's dynamic step as seen from outside: the first `Allocate` asks for the tag's step; each
/// segment used up changes the step for the `Allocate`s that follow by its lifetime (from the
/// delivery of its grant to the `Release` of all of it, sent once every one of its IDs was handed
/// out): under 15 minutes the step doubles (at most `step_max`), under 30 it stays, otherwise it
/// halves (never below the tag's step).
#[derive(Clone, Debug)]
struct Steps {
    tag_step: u64,
    step_max: u64,
    /// The step of the last `Allocate` and the lifetimes of the segments used up since
    /// (`None`: nothing asked yet; `Some(None)`: unknown, after a shutdown).
    last: Option<Option<(u64, Vec<u64>)>>,
}

/// Leaf's thresholds, as its documentation states them.
const LEAF_FAST_MS: u64 = 15 * 60 * 1000;
const LEAF_SLOW_MS: u64 = 30 * 60 * 1000;

impl Steps {
    fn after(&self, step: u64, lasted_ms: u64) -> u64 {
        let floor = self.tag_step.max(1);
        if lasted_ms < LEAF_FAST_MS {
            step.saturating_mul(2).min(self.step_max.max(floor))
        } else if lasted_ms < LEAF_SLOW_MS {
            step.max(floor)
        } else {
            (step / 2).max(floor)
        }
    }

    fn asked(&mut self, ids: u64) -> Result<(), String> {
        let expected = match &self.last {
            None => Some(self.tag_step),
            Some(None) => None,
            Some(Some((step, lifetimes))) => Some(
                lifetimes
                    .iter()
                    .fold(*step, |step, lasted_ms| self.after(step, *lasted_ms)),
            ),
        };
        if let Some(expected) = expected
            && ids != expected
        {
            return Err(format!(
                "an Allocate for {ids} IDs where Leaf's rule gives {expected} (the tag's step \
                 {}, at most {}, after segments that lasted {:?} ms)",
                self.tag_step,
                self.step_max,
                self.last
                    .clone()
                    .flatten()
                    .map(|(_, l)| l)
                    .unwrap_or_default()
            ));
        }
        self.last = Some(Some((ids, Vec::new())));
        Ok(())
    }

    fn used_up(&mut self, lasted_ms: u64) {
        if let Some(Some((_, lifetimes))) = self.last.as_mut() {
            lifetimes.push(lasted_ms);
        }
    }
}

/// The degraded worker's promises rest on its time reservation ([`LeaseView`]).
#[derive(Clone, Copy, Debug)]
struct DegradedView {
    lease: LeaseView,
    last: Option<u64>,
    issued: u64,
}

impl Referee {
    fn new(drift_ms_max: u64) -> Self {
        Self {
            drift_ms_max,
            calls: BTreeMap::new(),
            credits: Vec::new(),
            issued: BTreeSet::new(),
            last: None,
            degraded: None,
            steps: None,
        }
    }

    /// Also checks Leaf's step rule for a tag of step `tag_step`.
    fn with_steps(self, tag_step: u64, step_max: u64) -> Self {
        Self {
            steps: Some(Steps {
                tag_step,
                step_max,
                last: None,
            }),
            ..self
        }
    }

    /// A referee for an allocator in degraded mode whose worker starts above `floor_ts`.
    fn degraded(drift_ms_max: u64, floor_ts: u64) -> Self {
        Self {
            degraded: Some(DegradedView {
                lease: LeaseView::new(WORKER_ID, floor_ts),
                last: None,
                issued: 0,
            }),
            ..Self::new(drift_ms_max)
        }
    }

    /// Degraded IDs handed out this incarnation.
    fn degraded_issued(&self) -> u64 {
        self.degraded.map_or(0, |d| d.issued)
    }

    fn issued_degraded(&mut self, id: u64) -> Result<(), String> {
        let Some(view) = self.degraded.as_mut() else {
            return Err(format!("degraded-mode ID {id} with degraded mode off"));
        };
        view.lease
            .check(&DEGRADED_LAYOUT, DEGRADED_FLAG, id, view.last)
            .map_err(|e| format!("degraded mode: {e}"))?;
        view.last = Some(id);
        view.issued += 1;
        Ok(())
    }

    fn see(&mut self, seen: &Seen) -> Result<(), String> {
        match seen {
            Seen::Sent { req, mono } => self.sent(req, *mono),
            Seen::Delivered { id, reply, mono } => {
                self.delivered(*id, reply, *mono);
                Ok(())
            }
            Seen::Issued { block, mono } => block.ids().try_for_each(|x| self.issued(x, *mono)),
            Seen::Degraded { id } => self.issued_degraded(*id),
        }
    }

    fn sent(&mut self, req: &Request, mono: u64) -> Result<(), String> {
        if self.calls.contains_key(&req.id) {
            return Err(format!("request id {} used twice", req.id));
        }
        match &req.call {
            StoreCall::Allocate(alloc) => {
                if let Some(last) = self.last
                    && alloc.min_id <= last
                {
                    return Err(format!(
                        "an Allocate with min_id {} though {last} was already issued",
                        alloc.min_id
                    ));
                }
                if let Some(steps) = self.steps.as_mut() {
                    steps.asked(alloc.ids)?;
                }
            }
            StoreCall::Release(release) => {
                let s = release.segment_start;
                // IDs issued from the credit at or above `used_end`, for each grant of start
                // `s` (a malformed store may grant one start twice): the Release is false only
                // if it is false of each.
                let above = |c: &Credit| -> Vec<u64> {
                    self.issued
                        .iter()
                        .copied()
                        .filter(|x| *x >= release.used_end && contains(&c.segment, *x))
                        .collect()
                };
                let each: Vec<Vec<u64>> = self
                    .credits
                    .iter()
                    .filter(|c| c.segment.start == s)
                    .map(above)
                    .collect();
                if let Some(above) = each.iter().min_by_key(|a| a.len())
                    && !above.is_empty()
                {
                    return Err(format!(
                        "a Release of segment {s} promising nothing issued from {} on, though \
                         {above:?} were",
                        release.used_end
                    ));
                }
                // When each grant of this segment, used up, was delivered.
                let granted: BTreeSet<u64> = self
                    .credits
                    .iter()
                    .filter(|c| {
                        c.segment.start == s
                            && c.segment.end == release.used_end
                            && c.segment.delta > 0
                            && (c.segment.start..c.segment.end)
                                .step_by(c.segment.delta as usize)
                                .all(|x| self.issued.contains(&x))
                    })
                    .map(|c| c.granted_mono)
                    .collect();
                if let Some(steps) = self.steps.as_mut() {
                    match granted.iter().collect::<Vec<_>>()[..] {
                        [] => {}
                        [granted_mono] => steps.used_up(mono - granted_mono),
                        // The same segment granted twice at different times: which grant the
                        // allocator kept, and so the lifetime, is not visible.
                        _ => steps.last = Some(None),
                    }
                }
                for c in &mut self.credits {
                    c.released |= c.segment.start == s;
                }
            }
            _ => {}
        }
        self.calls.insert(req.id, (req.call.clone(), mono));
        Ok(())
    }

    /// Credits a grant or a renewal only when it answers a call of its kind this incarnation
    /// made.
    fn delivered(&mut self, id: u64, reply: &StoreReply, mono: u64) {
        let Some((call, sent_mono)) = self.calls.get(&id) else {
            return;
        };
        let drift = self.drift_ms_max;
        match (call, reply) {
            (StoreCall::Allocate(req), StoreReply::Allocate(Ok(grant))) => {
                self.credits.push(Credit {
                    segment: grant.segment,
                    claim_end: grant.claim_end,
                    deadline_mono: (sent_mono + req.lease_ms).saturating_sub(drift),
                    granted_mono: mono,
                    released: false,
                });
            }
            (StoreCall::RenewWorker { worker_id, .. }, StoreReply::Worker(Ok(lease))) => {
                if let Some(view) = self.degraded.as_mut()
                    && lease.worker_id == *worker_id
                {
                    view.lease.acknowledged(lease.reserved_ts);
                }
            }
            (StoreCall::Renew(req), StoreReply::Renew(Ok(lease))) => {
                let deadline = (sent_mono + req.lease_ms).saturating_sub(drift);
                for c in &mut self.credits {
                    if c.segment.start == req.segment_start {
                        c.claim_end = c.claim_end.max(lease.claim_end.min(c.segment.end));
                        c.deadline_mono = c.deadline_mono.max(deadline);
                    }
                }
            }
            _ => {}
        }
    }

    fn issued(&mut self, x: u64, mono: u64) -> Result<(), String> {
        if !self.issued.insert(x) {
            return Err(format!("ID {x} handed out twice"));
        }
        if let Some(last) = self.last
            && x <= last
        {
            return Err(format!("ID {x} handed out after {last}: not increasing"));
        }
        self.last = Some(x);
        if x >= SEGMENT_ID_LIMIT {
            return Err(format!("segment ID {x} at or above 2^62"));
        }
        let inside: Vec<&Credit> = self
            .credits
            .iter()
            .filter(|c| contains(&c.segment, x))
            .collect();
        if inside.is_empty() {
            return Err(format!(
                "ID {x} lies in no segment a store reply granted to this incarnation"
            ));
        }
        let live: Vec<&&Credit> = inside.iter().filter(|c| !c.released).collect();
        if live.is_empty() {
            return Err(format!(
                "ID {x} handed out from segment {:?} after its Release",
                inside[0].segment
            ));
        }
        let claimed: Vec<&&&Credit> = live.iter().filter(|c| x < c.claim_end).collect();
        if claimed.is_empty() {
            return Err(format!(
                "ID {x} at or beyond the acknowledged claim {} of its segment",
                live.iter().map(|c| c.claim_end).max().unwrap_or(0)
            ));
        }
        if !claimed.iter().any(|c| mono < c.deadline_mono) {
            return Err(format!(
                "ID {x} handed out at {mono} ms, after its lease ended at {} ms by the \
                 allocator's own clock minus the drift margin",
                claimed.iter().map(|c| c.deadline_mono).max().unwrap_or(0)
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The hostile store.

/// How the store answers one call (each reply stays within the store's contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// As the memory store would.
    Honest,
    /// A competitor moved the tag first: a conflict for a grant, a newer row for a read.
    Conflict,
    /// An older answer: an old row, a pooled grant from an earlier segment, a lower claim.
    Stale,
    /// An error (a lost lease for a renewal).
    Fail,
    /// A grant ignoring the version, all of it claimed; a renewal claiming the whole segment.
    Generous,
    /// A short grant with (almost) nothing claimed; a renewal that does not raise the claim.
    Stingy,
    /// Outside the store's contract (the `malformed` tests only): a grant below `min_id`, a
    /// claim outside its segment, a zero `delta`, an empty or reversed segment, one past 2^62,
    /// a huge step, a claim renewed past the segment's end.
    Malformed,
}

/// The hostile store's own memory: what it granted and answered.
struct HostileStore {
    setup: Setup,
    max_id: u64,
    version: u64,
    /// Every row answered (for stale ones).
    rows: Vec<TagRow>,
    /// Every segment granted, lowest start first per grant (for pooled ones).
    granted: Vec<Segment>,
    /// The claim recorded per segment start.
    claims: BTreeMap<u64, (Segment, u64)>,
    /// What was answered, per request id (for duplicates and misrouted replies).
    answers: BTreeMap<u64, StoreReply>,
    /// The degraded worker id's persisted time reservation (what a new holder starts above).
    worker_reserved_ts: u64,
}

impl HostileStore {
    fn new(setup: Setup) -> Self {
        Self {
            setup,
            max_id: align_up(setup.first_id(), setup.remainder, setup.delta),
            version: 0,
            rows: Vec::new(),
            granted: Vec::new(),
            claims: BTreeMap::new(),
            answers: BTreeMap::new(),
            worker_reserved_ts: 0,
        }
    }

    fn row(&self) -> TagRow {
        TagRow {
            tag: TAG.to_owned(),
            max_id: self.max_id,
            step: self.setup.tag_step,
            delta: self.setup.delta,
            remainder: self.setup.remainder,
            version: self.version,
            pool: Vec::new(),
        }
    }

    /// Someone else allocated.
    fn competitor(&mut self) {
        self.max_id += self.setup.tag_step * self.setup.delta;
        self.version += 1;
    }

    fn grant(&mut self, req: &AllocRequest, segment: Segment, claim_end: u64, pool: bool) -> Grant {
        self.version += 1;
        if !pool {
            self.max_id = self.max_id.max(segment.end);
        }
        self.granted.push(segment);
        self.claims.insert(segment.start, (segment, claim_end));
        Grant {
            tag: TAG.to_owned(),
            segment,
            version: self.version,
            claim_end,
            lease_expiry_ms: req.now_ms + req.lease_ms,
            from_pool: pool,
            tag_step: self.setup.tag_step,
        }
    }

    /// Fresh IDs at or above `min_id`, at most `ids` of them, by the store's own rule
    /// ([`fresh_segment`]): a short final segment up to 2^62, then `Exhausted` (a tag started
    /// near the end, a huge step, a `max_id` a malformed grant moved past 2^62).
    fn fresh(&self, req: &AllocRequest, ids: u64) -> Result<Segment, StoreError> {
        let (delta, remainder) = (self.setup.delta, self.setup.remainder);
        let row = TagRow {
            max_id: align_up(self.max_id.max(req.min_id), remainder, delta),
            ..self.row()
        };
        fresh_segment(&row, ids.max(1))
    }

    fn conflict(&self, req: &AllocRequest) -> StoreError {
        StoreError::VersionConflict {
            tag: TAG.to_owned(),
            expected: req.expected_version,
            actual: self.version,
        }
    }

    fn answer(&mut self, call: &StoreCall, how: How, k: u64) -> StoreReply {
        match call {
            StoreCall::Read { .. } => StoreReply::Read(self.read(how, k)),
            StoreCall::Allocate(req) => StoreReply::Allocate(self.allocate(req, how, k)),
            StoreCall::Renew(req) => {
                let Some(&(segment, recorded)) = self.claims.get(&req.segment_start) else {
                    return StoreReply::Renew(Err(lease_lost(req.segment_start, req.instance)));
                };
                let expiry = req.now_ms + req.lease_ms;
                let lease = |claim_end| {
                    Ok(Lease {
                        claim_end,
                        lease_expiry_ms: expiry,
                    })
                };
                let result = match how {
                    How::Honest => {
                        let claim = recorded.max(req.claim_end.min(segment.end));
                        self.claims.insert(segment.start, (segment, claim));
                        lease(claim)
                    }
                    How::Generous => {
                        self.claims.insert(segment.start, (segment, segment.end));
                        lease(segment.end)
                    }
                    How::Stingy => lease(recorded),
                    How::Stale => {
                        // Lower than recorded, on the segment's residue class like every claim
                        // the store computes (a malformed grant's claim may lie below its
                        // segment, its delta may be 0: then as recorded).
                        let half = segment.start + recorded.saturating_sub(segment.start) / 2;
                        let aligned = if segment.delta > 0 {
                            segment.align_up(half)
                        } else {
                            half
                        };
                        lease(aligned.min(recorded))
                    }
                    How::Conflict | How::Fail if k % 2 == 1 => {
                        self.claims.remove(&segment.start);
                        Err(lease_lost(req.segment_start, req.instance))
                    }
                    How::Conflict | How::Fail => Err(StoreError::Backend("renew failed".into())),
                    How::Malformed => lease(segment.end + 100 * segment.delta),
                };
                StoreReply::Renew(result)
            }
            StoreCall::Release(req) => StoreReply::Release(match how {
                How::Fail => Err(StoreError::Backend("release failed".into())),
                How::Stale => Err(lease_lost(req.segment_start, req.instance)),
                _ => {
                    self.claims.remove(&req.segment_start);
                    Ok(())
                }
            }),
            StoreCall::RenewWorker {
                worker_id,
                instance,
                reserve_ts,
                now_ms,
                lease_ms,
                ..
            } => StoreReply::Worker(
                self.renew_worker(*worker_id, *instance, *reserve_ts, how, k)
                    .map(|reserved_ts| WorkerLease {
                        worker_id: *worker_id,
                        lease_expiry_ms: now_ms + lease_ms,
                        reserved_ts,
                    }),
            ),
            StoreCall::AcquireWorker(_) => {
                StoreReply::Worker(Err(StoreError::Backend("no workers here".into())))
            }
        }
    }

    /// The degraded worker's reservation: persisted, then reported (the store may report more
    /// than asked; a stale or stingy answer reports less and persists nothing).
    fn renew_worker(
        &mut self,
        worker_id: u32,
        instance: InstanceId,
        reserve_ts: u64,
        how: How,
        k: u64,
    ) -> Result<u64, StoreError> {
        let persisted = self.worker_reserved_ts;
        match how {
            How::Honest | How::Malformed => {
                self.worker_reserved_ts = persisted.max(reserve_ts);
                Ok(self.worker_reserved_ts)
            }
            How::Generous => {
                self.worker_reserved_ts = persisted.max(reserve_ts + 1 + k);
                Ok(self.worker_reserved_ts)
            }
            How::Stingy => Ok(persisted),
            How::Stale => Ok(persisted / 2),
            How::Conflict | How::Fail if k % 2 == 1 => Err(StoreError::WorkerLeaseLost {
                namespace: DEGRADED_NAMESPACE.to_owned(),
                worker_id,
                instance,
            }),
            How::Conflict | How::Fail => Err(StoreError::Backend("renew worker failed".into())),
        }
    }

    fn read(&mut self, how: How, k: u64) -> Result<TagRow, StoreError> {
        match how {
            How::Fail if k.is_multiple_of(8) => Err(StoreError::UnknownTag(TAG.to_owned())),
            How::Fail => Err(StoreError::Backend("read failed".into())),
            How::Stale => {
                // An earlier answer, or (none yet, or no older one) the current row set back.
                let old = self.rows.get(k as usize % self.rows.len().max(1)).cloned();
                let mut row = old.unwrap_or_else(|| self.row());
                if row.version == self.version {
                    row.version = row.version.saturating_sub(1 + k % 2);
                    let back = (k % 3) * self.setup.delta;
                    let first = align_up(
                        self.setup.first_id(),
                        self.setup.remainder,
                        self.setup.delta,
                    );
                    row.max_id = row.max_id.saturating_sub(back).max(first);
                }
                Ok(row)
            }
            How::Conflict => {
                self.competitor();
                let row = self.row();
                self.rows.push(row.clone());
                Ok(row)
            }
            How::Malformed => {
                let mut row = self.row();
                match k % 3 {
                    0 => row.step = 0,
                    // Legal for a tag (step × delta below 2^62), but beyond the allocator's
                    // arithmetic.
                    1 => row.step = (SEGMENT_ID_LIMIT - 1) / self.setup.delta,
                    _ => row.max_id = SEGMENT_ID_LIMIT + 1,
                }
                Ok(row)
            }
            How::Honest | How::Generous | How::Stingy => {
                let row = self.row();
                self.rows.push(row.clone());
                Ok(row)
            }
        }
    }

    fn allocate(&mut self, req: &AllocRequest, how: How, k: u64) -> Result<Grant, StoreError> {
        let delta = self.setup.delta;
        match how {
            How::Honest if req.expected_version != self.version => Err(self.conflict(req)),
            How::Honest => {
                let segment = self.fresh(req, req.ids)?;
                let claim = sut::id_store::initial_claim(&segment, req.claim_ids);
                Ok(self.grant(req, segment, claim, false))
            }
            How::Generous => {
                let segment = self.fresh(req, req.ids)?;
                Ok(self.grant(req, segment, segment.end, false))
            }
            How::Stingy => {
                let segment = self.fresh(req, 1 + k % req.ids.max(1))?;
                let claim = if k.is_multiple_of(2) {
                    segment.start
                } else {
                    segment.start + delta
                };
                Ok(self.grant(req, segment, claim, false))
            }
            How::Stale => {
                // A pooled tail of an earlier grant, at or above min_id (never below: the
                // store's contract), never of a malformed one.
                let earlier: Vec<Segment> = self
                    .granted
                    .iter()
                    .copied()
                    .filter(|s| s.delta > 0 && s.start <= s.end && s.end <= SEGMENT_ID_LIMIT)
                    .collect();
                let pooled = (!earlier.is_empty())
                    .then(|| earlier[k as usize % earlier.len()])
                    .map(|old| {
                        let start = old.align_up(old.start.max(req.min_id));
                        let end = old
                            .end
                            .min(start.saturating_add(req.ids.saturating_mul(delta)));
                        Segment {
                            start,
                            end,
                            delta: old.delta,
                        }
                    })
                    .filter(|s| !s.is_empty());
                match pooled {
                    Some(segment) => {
                        let claim = sut::id_store::initial_claim(&segment, req.claim_ids);
                        Ok(self.grant(req, segment, claim, true))
                    }
                    None => Err(self.conflict(req)),
                }
            }
            How::Conflict => {
                self.competitor();
                Err(self.conflict(req))
            }
            How::Fail if k.is_multiple_of(8) => Err(StoreError::Exhausted(TAG.to_owned())),
            How::Fail => Err(StoreError::Backend("allocate failed".into())),
            How::Malformed => Ok(self.malformed_grant(req, k)),
        }
    }
}

impl HostileStore {
    /// A grant outside the store's contract, by `k`.
    fn malformed_grant(&mut self, req: &AllocRequest, k: u64) -> Grant {
        let delta = self.setup.delta;
        // Past the end of the space: a one-ID segment at `max_id` to start the damage from.
        let fresh = self.fresh(req, req.ids).unwrap_or(Segment {
            start: self.max_id,
            end: self.max_id.saturating_add(delta),
            delta,
        });
        let (segment, claim_end) = match k % 7 {
            // The first segment ever granted again (below min_id once anything was issued).
            0 => {
                let first = self.granted.first().copied().unwrap_or(fresh);
                (first, first.end)
            }
            1 => (fresh, fresh.end + 3 * delta),
            2 => (fresh, fresh.start.saturating_sub(1)),
            3 => (Segment { delta: 0, ..fresh }, fresh.end),
            4 => (
                Segment {
                    end: fresh.start,
                    ..fresh
                },
                fresh.start,
            ),
            5 => (
                Segment {
                    start: fresh.end,
                    end: fresh.start,
                    delta,
                },
                fresh.start,
            ),
            _ => {
                let start = SEGMENT_ID_LIMIT - delta;
                let segment = Segment {
                    start,
                    end: start + 10 * delta,
                    delta,
                };
                (segment, segment.end)
            }
        };
        self.grant(req, segment, claim_end, k.is_multiple_of(2))
    }
}

fn lease_lost(segment_start: u64, instance: InstanceId) -> StoreError {
    StoreError::LeaseLost {
        tag: TAG.to_owned(),
        segment_start,
        instance,
    }
}

/// The kind of reply `call` expects (as [`kind`] numbers them).
fn call_kind(call: &StoreCall) -> u8 {
    match call {
        StoreCall::Read { .. } => 0,
        StoreCall::Allocate(_) => 1,
        StoreCall::Renew(_) => 2,
        StoreCall::Release(_) => 3,
        StoreCall::AcquireWorker(_) | StoreCall::RenewWorker { .. } => 4,
    }
}

fn kind(reply: &StoreReply) -> u8 {
    match reply {
        StoreReply::Read(_) => 0,
        StoreReply::Allocate(_) => 1,
        StoreReply::Renew(_) => 2,
        StoreReply::Release(_) => 3,
        StoreReply::Worker(_) => 4,
    }
}

// ---------------------------------------------------------------------------------------------
// The adversary's steps.

/// Which request a reply goes to.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// The `n`-th still unanswered one (modulo): any order.
    Pending(usize),
    /// The `n`-th ever sent (modulo), answered or not: the same reply again if it was.
    Any(usize),
    /// An id never asked, with the reply to the `n`-th call ever sent.
    Unknown(usize),
}

#[derive(Clone, Copy, Debug)]
enum Action {
    /// `take_block` of up to this many IDs.
    Take(u64),
    /// Answer a request; `misroute` delivers a reply given earlier to a call of another kind.
    Answer {
        pick: Pick,
        how: How,
        k: u64,
        misroute: bool,
    },
    /// Time passes (both clocks), nothing is called.
    Advance(u64),
    /// The wall clock jumps (back when negative); the monotonic one does not.
    WallJump(i64),
    /// `handle_timeout` now.
    Timeout,
    /// Sleep until `poll_timeout` and call `handle_timeout`.
    SleepUntilDue,
    /// Graceful shutdown (the allocator stays usable).
    Shutdown,
    /// A new incarnation (a new instance id, the monotonic clock from zero); the old one's
    /// requests can still be answered.
    Restart,
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![
        5 => Just(How::Honest),
        2 => Just(How::Conflict),
        2 => Just(How::Stale),
        2 => Just(How::Fail),
        1 => Just(How::Generous),
        1 => Just(How::Stingy),
    ]
}

fn malformed_how() -> impl Strategy<Value = How> {
    prop_oneof![4 => how(), 1 => Just(How::Malformed)]
}

fn action() -> impl Strategy<Value = Action> {
    action_with(how().boxed())
}

fn action_with(how: BoxedStrategy<How>) -> impl Strategy<Value = Action> {
    let pick = prop_oneof![
        6 => (0usize..16).prop_map(Pick::Pending),
        2 => (0usize..64).prop_map(Pick::Any),
        1 => (0usize..64).prop_map(Pick::Unknown),
    ];
    prop_oneof![
        8 => prop_oneof![4 => 1u64..=2, 1 => 3u64..=40].prop_map(Action::Take),
        10 => (pick, how, 0u64..16, prop::bool::weighted(0.08)).prop_map(
            |(pick, how, k, misroute)| Action::Answer { pick, how, k, misroute }
        ),
        5 => prop_oneof![
            4 => 0u64..60,
            2 => 60u64..400,
            1 => 400u64..3_000,
        ]
        .prop_map(Action::Advance),
        1 => (-5_000i64..5_000).prop_map(Action::WallJump),
        1 => Just(Action::Timeout),
        3 => Just(Action::SleepUntilDue),
        1 => Just(Action::Shutdown),
        1 => Just(Action::Restart),
    ]
}

fn actions() -> impl Strategy<Value = Vec<Action>> {
    proptest::collection::vec(action(), 1..120)
}

fn malformed_actions() -> impl Strategy<Value = Vec<Action>> {
    proptest::collection::vec(action_with(malformed_how().boxed()), 1..120)
}

// ---------------------------------------------------------------------------------------------
// The bench.

/// Deliberately wrong allocators, each breaking one promise the referee must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutant {
    /// Hands the previous block out once more.
    Repeat,
    /// Holds a block back and hands it out after the next one.
    Swap,
    /// Panics on a reply to a request it never made.
    PanicOnUnknown,
    /// Reports a broken invariant once it has issued anything.
    BadInvariants,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Correct,
    Flawed(Flaw),
    Mutant(Mutant),
}

impl Variant {
    fn flaw(self) -> Option<Flaw> {
        match self {
            Self::Flawed(flaw) => Some(flaw),
            _ => None,
        }
    }
}

/// Rare situations met, for the coverage test.
type Coverage = BTreeMap<&'static str, u64>;

struct Bench {
    variant: Variant,
    setup: Setup,
    instance: u64,
    alloc: SegmentAllocator,
    now: Now,
    store: HostileStore,
    /// Every request of every incarnation: id, call, sent at (its incarnation's clock).
    sent: Vec<(u64, StoreCall, u64)>,
    answered: BTreeSet<u64>,
    referee: Referee,
    /// Every degraded-mode ID of every incarnation.
    degraded_ids: BTreeSet<u64>,
    /// Mutant state.
    stash: Option<IdBlock>,
    owed: Option<IdBlock>,
    coverage: Coverage,
    /// The stats of the incarnations before this one.
    past_stats: Vec<AllocatorStats>,
    /// `Pending` and `Unavailable` answers this incarnation.
    waits: (u64, u64),
    /// Every incarnation's arrivals at edge states.
    edges: Edges,
}

impl Bench {
    fn new(setup: Setup, variant: Variant) -> Self {
        let now = Now {
            wall_ms: 1_700_000_000_000,
            mono_ms: 0,
        };
        Self {
            variant,
            setup,
            instance: 1,
            alloc: SegmentAllocator::new(config(&setup, 1, variant.flaw(), 0), now).unwrap(),
            now,
            store: HostileStore::new(setup),
            sent: Vec::new(),
            answered: BTreeSet::new(),
            referee: referee_for(&setup, 0),
            degraded_ids: BTreeSet::new(),
            stash: None,
            owed: None,
            coverage: Coverage::new(),
            past_stats: Vec::new(),
            waits: (0, 0),
            edges: Edges::new(),
        }
    }

    fn cover(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_insert(0) += 1;
    }

    /// One step; a panic is a broken promise like any other.
    fn step(&mut self, action: &Action) -> Result<(), String> {
        unpanicked(|| self.act(action))
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        let now = self.now;
        let before = self.alloc.stats();
        match *action {
            Action::Take(max) => match self.take(now, max) {
                Take::Block(block) => self.referee.see(&Seen::Issued {
                    block,
                    mono: now.mono_ms,
                })?,
                Take::Degraded(id) => {
                    self.referee.see(&Seen::Degraded { id })?;
                    if !self.degraded_ids.insert(id) {
                        return Err(format!("degraded-mode ID {id:#x} handed out twice"));
                    }
                    self.cover("degraded ID");
                }
                Take::Pending => {
                    self.waits.0 += 1;
                    self.cover("pending");
                }
                Take::Unavailable(_) => {
                    self.waits.1 += 1;
                    self.cover("unavailable");
                }
            },
            Action::Answer {
                pick,
                how,
                k,
                misroute,
            } => self.answer(pick, how, k, misroute)?,
            Action::Advance(ms) => {
                if ms >= LEASE_MS && self.alloc.health(now).current.is_some() {
                    self.cover("time jumps past a lease");
                }
                self.now = now.plus_ms(ms);
            }
            Action::WallJump(ms) => {
                self.now.wall_ms = self.now.wall_ms.saturating_add_signed(ms);
            }
            Action::Timeout => self.alloc.handle_timeout(now),
            Action::SleepUntilDue => {
                if let Some(due) = self.alloc.poll_timeout() {
                    self.now = now.plus_ms(due.saturating_sub(now.mono_ms));
                }
                self.alloc.handle_timeout(self.now);
            }
            Action::Shutdown => {
                // A used-up segment still held is released whole: not a step change.
                if let Some(steps) = self.referee.steps.as_mut() {
                    steps.last = Some(None);
                }
                self.alloc.shutdown();
            }
            Action::Restart => {
                self.past_stats.push(self.alloc.stats());
                self.waits = (0, 0);
                self.instance += 1;
                self.now.mono_ms = 0;
                let floor_ts = self.store.worker_reserved_ts;
                let cfg = config(&self.setup, self.instance, self.variant.flaw(), floor_ts);
                self.alloc.take_edges(&mut self.edges);
                self.alloc = SegmentAllocator::new(cfg, self.now).unwrap();
                self.referee = referee_for(&self.setup, floor_ts);
                self.stash = None;
                self.owed = None;
            }
        }
        let after = self.alloc.stats();
        if after.fetch_failures > before.fetch_failures
            && self.alloc.health(self.now).last_error.as_deref()
                == Some("store backend: store call timed out")
        {
            self.cover("fetch timed out");
        }
        if after.malformed_replies > before.malformed_replies {
            let refused = self
                .alloc
                .health(self.now)
                .last_error
                .is_some_and(|e| e.contains("malformed grant refused"))
                && after.fetch_failures > before.fetch_failures;
            self.cover(if refused {
                "malformed grant refused"
            } else {
                "malformed claim clamped"
            });
        }
        if after.leases_expired > before.leases_expired {
            self.cover("lease expired");
        }
        if !matches!(action, Action::Restart) {
            counters_only_grow(&before, &after)?;
        }
        if self.variant == Variant::Correct {
            let degraded = self.referee.degraded_issued();
            issued_as_counted(&after, self.referee.issued.len() as u64, degraded)?;
            waits_as_counted(&after, self.waits)?;
        }
        self.drain()
    }

    fn take(&mut self, now: Now, max: u64) -> Take {
        match self.variant {
            Variant::Mutant(Mutant::Repeat) => {
                if let Some(again) = self.stash.take() {
                    return Take::Block(again);
                }
                let take = self.alloc.take_block(now, max);
                if let Take::Block(block) = take {
                    self.stash = Some(block);
                }
                take
            }
            Variant::Mutant(Mutant::Swap) => {
                if let Some(owed) = self.owed.take() {
                    return Take::Block(owed);
                }
                match self.alloc.take_block(now, max) {
                    Take::Block(block) => match self.stash.take() {
                        None => {
                            self.stash = Some(block);
                            Take::Pending
                        }
                        Some(first) => {
                            self.owed = Some(first);
                            Take::Block(block)
                        }
                    },
                    other => other,
                }
            }
            _ => self.alloc.take_block(now, max),
        }
    }

    fn answer(&mut self, pick: Pick, how: How, k: u64, misroute: bool) -> Result<(), String> {
        if self.sent.is_empty() {
            return Ok(());
        }
        let n_sent = self.sent.len();
        let (id, call, sent_mono, unknown) = match pick {
            Pick::Pending(n) => {
                let pending: Vec<_> = self
                    .sent
                    .iter()
                    .filter(|(id, ..)| !self.answered.contains(id))
                    .collect();
                if pending.is_empty() {
                    return Ok(());
                }
                let (id, call, at) = pending[n % pending.len()].clone();
                (id, call, at, false)
            }
            Pick::Any(n) => {
                let (id, call, at) = self.sent[n % n_sent].clone();
                (id, call, at, false)
            }
            Pick::Unknown(n) => {
                let (_, call, at) = self.sent[n % n_sent].clone();
                // Never asked: id 0, a future id of this incarnation, an unborn incarnation's.
                let next = self.sent.last().map_or(0, |(id, ..)| *id);
                let id = match n % 3 {
                    0 => 0,
                    1 => next + 1 + (n as u64 % 4),
                    _ => ((self.instance + 10) << 32) | (1 + n as u64),
                };
                (id, call, at, true)
            }
        };
        let duplicate = self.answered.contains(&id);
        if how == How::Malformed {
            // A malformed row may carry another step: the step rule is no longer knowable.
            self.referee.steps = None;
        }
        let mut reply = match self.store.answers.get(&id) {
            Some(again) if duplicate => again.clone(),
            _ => self.store.answer(&call, how, k),
        };
        if misroute {
            // A reply given earlier to a call of another kind (the store's contract still holds:
            // a grant never reaches another Allocate).
            // (Malformed: any reply, a grant to another Allocate included.)
            let mine = if how == How::Malformed {
                u8::MAX
            } else {
                call_kind(&call)
            };
            let other = self
                .store
                .answers
                .values()
                .filter(|r| kind(r) != mine)
                .nth(k as usize % 4)
                .cloned();
            if let Some(other) = other {
                reply = other;
                self.cover("misrouted reply");
            }
        }
        if duplicate {
            self.cover("duplicate reply");
        }
        if unknown {
            self.cover("reply to an id never asked");
        } else if !self.referee.calls.contains_key(&id) {
            self.cover("reply to a previous incarnation");
        } else if self.now.mono_ms >= sent_mono + TIMEOUT_MS {
            self.cover("reply after the request timeout");
        }
        if !duplicate && !unknown && self.referee.calls.contains_key(&id) {
            match (&call, &reply, how) {
                (StoreCall::Read { .. }, StoreReply::Read(Ok(_)), How::Stale) => {
                    self.cover("stale row");
                }
                (StoreCall::Renew(_), StoreReply::Renew(Ok(_)), How::Stale) => {
                    self.cover("stale claim");
                }
                (StoreCall::Allocate(_), StoreReply::Allocate(Ok(g)), _) if g.from_pool => {
                    self.cover("pooled grant");
                }
                (StoreCall::Allocate(req), StoreReply::Allocate(Ok(g)), How::Honest)
                    if g.segment.end == SEGMENT_ID_LIMIT
                        && (1..req.ids).contains(&g.segment.len()) =>
                {
                    // Short but not empty: the IDs left below 2^62, not a grant of nothing.
                    self.cover("final short segment");
                }
                (
                    StoreCall::Allocate(_),
                    StoreReply::Allocate(Err(StoreError::Exhausted(_))),
                    How::Honest | How::Generous | How::Stingy,
                ) => {
                    self.cover("ID space exhausted");
                }
                (_, StoreReply::Allocate(Err(StoreError::VersionConflict { .. })), _) => {
                    self.cover("version conflict");
                }
                (_, StoreReply::Renew(Err(StoreError::LeaseLost { .. })), _) => {
                    self.cover("lease lost");
                }
                (_, StoreReply::Worker(Err(StoreError::WorkerLeaseLost { .. })), _) => {
                    self.cover("worker lease lost");
                }
                _ => {}
            }
        }
        if !unknown {
            self.answered.insert(id);
            self.store
                .answers
                .entry(id)
                .or_insert_with(|| reply.clone());
        }
        if self.variant == Variant::Mutant(Mutant::PanicOnUnknown)
            && !self.referee.calls.contains_key(&id)
        {
            panic!("mutant: a reply to request {id}, which I never made");
        }
        self.referee.see(&Seen::Delivered {
            id,
            mono: self.now.mono_ms,
            reply: reply.clone(),
        })?;
        self.alloc.handle_reply(id, reply, self.now);
        Ok(())
    }

    /// Takes every queued call (they are performed whenever the adversary likes) and checks the
    /// invariants.
    fn drain(&mut self) -> Result<(), String> {
        while let Some(req) = self.alloc.poll_request() {
            self.referee.see(&Seen::Sent {
                req: req.clone(),
                mono: self.now.mono_ms,
            })?;
            self.sent.push((req.id, req.call, self.now.mono_ms));
        }
        if self.variant == Variant::Mutant(Mutant::BadInvariants) && self.alloc.stats().issued > 0 {
            return Err("invariant: mutant says no".to_owned());
        }
        self.alloc
            .check_invariants()
            .map_err(|e| format!("invariant: {e}"))
    }

    /// The stats of every incarnation, summed where it matters here.
    fn total_stats(&self) -> AllocatorStats {
        let mut total = AllocatorStats::default();
        for s in self.past_stats.iter().chain([&self.alloc.stats()]) {
            total.issued += s.issued;
            total.conflicts += s.conflicts;
            total.fetch_failures += s.fetch_failures;
            total.leases_expired += s.leases_expired;
            total.leases_lost += s.leases_lost;
            total.pool_grants += s.pool_grants;
            total.buffer_switches += s.buffer_switches;
            total.unavailable += s.unavailable;
            total.degraded_issued += s.degraded_issued;
        }
        total
    }
}

/// The allocator's counters are counts of events within one incarnation: none goes backwards
/// or wraps around (a count past 2^62 is a wrapped subtraction: no run here comes near it).
fn counters_only_grow(before: &AllocatorStats, after: &AllocatorStats) -> Result<(), String> {
    for ((name, was), (_, is)) in counts(before).into_iter().zip(counts(after)) {
        if is < was || is >= SEGMENT_ID_LIMIT {
            return Err(format!("counter {name} went from {was} to {is}"));
        }
    }
    Ok(())
}

/// Every counter of `AllocatorStats`, by name.
fn counts(s: &AllocatorStats) -> [(&'static str, u64); 14] {
    [
        ("issued", s.issued),
        ("degraded_issued", s.degraded_issued),
        ("reloads", s.reloads),
        ("pool_grants", s.pool_grants),
        ("buffer_switches", s.buffer_switches),
        ("conflicts", s.conflicts),
        ("fetch_failures", s.fetch_failures),
        ("leases_lost", s.leases_lost),
        ("leases_expired", s.leases_expired),
        ("ids_abandoned", s.ids_abandoned),
        ("malformed_replies", s.malformed_replies),
        ("largest_gap", s.largest_gap),
        ("pending", s.pending),
        ("unavailable", s.unavailable),
    ]
}

/// The allocator counts every ID it handed out this incarnation, and only those: segment IDs
/// and degraded-mode IDs apart.
fn issued_as_counted(stats: &AllocatorStats, handed_out: u64, degraded: u64) -> Result<(), String> {
    if stats.issued != handed_out {
        return Err(format!(
            "stats count {} IDs issued, {handed_out} were handed out",
            stats.issued
        ));
    }
    if stats.degraded_issued != degraded {
        return Err(format!(
            "stats count {} degraded-mode IDs issued, {degraded} were handed out",
            stats.degraded_issued
        ));
    }
    Ok(())
}

/// The allocator counts every `Pending` and every `Unavailable` answer it gave this
/// incarnation (what the health view reports as waits and refusals).
fn waits_as_counted(
    stats: &AllocatorStats,
    (pending, unavailable): (u64, u64),
) -> Result<(), String> {
    if (stats.pending, stats.unavailable) == (pending, unavailable) {
        Ok(())
    } else {
        Err(format!(
            "stats count {} pending and {} unavailable answers, {pending} and {unavailable} \
             were given",
            stats.pending, stats.unavailable
        ))
    }
}

fn referee_for(setup: &Setup, floor_ts: u64) -> Referee {
    let referee = if setup.degraded {
        Referee::degraded(DRIFT_MS, floor_ts)
    } else {
        Referee::new(DRIFT_MS)
    };
    referee.with_steps(setup.tag_step, setup.step_max)
}

fn run_bench(setup: Setup, variant: Variant, actions: &[Action]) -> Result<Bench, String> {
    let mut bench = Bench::new(setup, variant);
    for (i, action) in actions.iter().enumerate() {
        bench
            .step(action)
            .map_err(|e| format!("step {i} ({action:?}): {e}"))?;
    }
    bench.alloc.take_edges(&mut bench.edges);
    Ok(bench)
}

fn run(setup: Setup, variant: Variant, actions: &[Action]) -> Result<(), String> {
    run_bench(setup, variant, actions).map(|_| ())
}

fn fixed(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5e9_a110c),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(fixed(CASES))]

    #[test]
    fn the_allocator_keeps_its_promises_whatever_the_store_answers(
        setup in setup(),
        actions in actions(),
    ) {
        prop_assert_eq!(run(setup, Variant::Correct, &actions), Ok(()));
    }
}

// ---------------------------------------------------------------------------------------------
// Coverage: the adversary reaches what the properties are about.

#[test]
fn the_hostile_store_reaches_every_rare_situation() {
    let mut runner = TestRunner::new(fixed(CASES));
    let strategy = (setup(), actions());
    let mut edges = Edges::new();
    let mut seen = Coverage::new();
    let mut stats = AllocatorStats::default();
    for _ in 0..CASES {
        let (setup, actions) = strategy.new_tree(&mut runner).unwrap().current();
        let mut bench = run_bench(setup, Variant::Correct, &actions).unwrap();
        edges.absorb(&mut bench.edges);
        for (what, n) in &bench.coverage {
            *seen.entry(what).or_insert(0) += n;
        }
        let s = bench.total_stats();
        stats.issued += s.issued;
        stats.conflicts += s.conflicts;
        stats.leases_lost += s.leases_lost;
        stats.pool_grants += s.pool_grants;
        stats.buffer_switches += s.buffer_switches;
        stats.degraded_issued += s.degraded_issued;
    }
    let edges_reached = edges.take();
    for want in [
        "version conflict",
        "stale row",
        "stale claim",
        "pooled grant",
        "fetch timed out",
        "reply after the request timeout",
        "duplicate reply",
        "reply to an id never asked",
        "reply to a previous incarnation",
        "misrouted reply",
        "lease expired",
        "lease lost",
        "time jumps past a lease",
        "pending",
        "unavailable",
        "degraded ID",
        "worker lease lost",
        "final short segment",
        "ID space exhausted",
    ] {
        assert!(seen.contains_key(want), "never reached: {want} ({seen:?})");
    }
    // Accepted, not only sent: the allocator acted on them.
    for (what, n) in [
        ("IDs issued", stats.issued),
        ("conflicts taken", stats.conflicts),
        ("leases lost", stats.leases_lost),
        ("pooled grants installed", stats.pool_grants),
        ("buffer switches", stats.buffer_switches),
        ("degraded-mode IDs", stats.degraded_issued),
    ] {
        assert!(n > 0, "never: {what} ({stats:?})");
    }
    for edge in [
        &edges::LAST_ID_WHILE_NEXT_UNLOADED,
        &edges::EMPTY_WHILE_GRANTING,
        &edges::CLAIM_EXHAUSTED,
        &edges::CAS_RETRIES_SPENT,
        &edges::UNAVAILABLE_AFTER_FAILURES,
        &edges::LEASE_EXPIRED_UNISSUED,
        &edges::POOL_GRANT,
        &edges::FRESH_ALLOCATOR_FINDS_GRANTS,
    ] {
        assert!(
            edges_reached.contains_key(edge.name),
            "edge never reached: {} ({edges_reached:?})",
            edge.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Firing: each check catches a broken allocator.

fn referee_over(history: &[Seen]) -> Result<(), String> {
    let mut referee = Referee::new(DRIFT_MS);
    history.iter().try_for_each(|s| referee.see(s))
}

fn alloc_req(id: u64, min_id: u64) -> Seen {
    Seen::Sent {
        req: Request {
            id,
            call: StoreCall::Allocate(AllocRequest {
                tag: TAG.to_owned(),
                expected_version: 0,
                ids: 10,
                min_id,
                claim_ids: 5,
                instance: InstanceId(1),
                lease_ms: LEASE_MS,
                now_ms: 0,
                blind_max_id: None,
            }),
        },
        mono: 0,
    }
}

fn granted(id: u64, start: u64, end: u64, claim_end: u64) -> Seen {
    Seen::Delivered {
        id,
        mono: 0,
        reply: StoreReply::Allocate(Ok(Grant {
            tag: TAG.to_owned(),
            segment: Segment {
                start,
                end,
                delta: 1,
            },
            version: 1,
            claim_end,
            lease_expiry_ms: LEASE_MS,
            from_pool: false,
            tag_step: 10,
        })),
    }
}

fn issued(start: u64, count: u64, mono: u64) -> Seen {
    Seen::Issued {
        block: IdBlock {
            start,
            count,
            delta: 1,
        },
        mono,
    }
}

fn renewed(id: u64, segment_start: u64, claim_end: u64, mono: u64) -> [Seen; 2] {
    [
        Seen::Sent {
            req: Request {
                id,
                call: StoreCall::Renew(sut::id_store::RenewRequest {
                    tag: TAG.to_owned(),
                    instance: InstanceId(1),
                    segment_start,
                    claim_end,
                    lease_ms: LEASE_MS,
                    now_ms: mono,
                }),
            },
            mono,
        },
        Seen::Delivered {
            id,
            mono,
            reply: StoreReply::Renew(Ok(Lease {
                claim_end,
                lease_expiry_ms: mono + LEASE_MS,
            })),
        },
    ]
}

#[test]
fn the_referee_accepts_a_correct_history() {
    let mut history = vec![alloc_req(1, 0), granted(1, 1, 11, 6), issued(1, 5, 10)];
    history.extend(renewed(2, 1, 11, 500));
    history.extend([issued(6, 5, 1_400), alloc_req(3, 11)]);
    assert_eq!(referee_over(&history), Ok(()));
}

#[test]
fn the_referee_catches_an_id_handed_out_twice() {
    let history = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(1, 3, 0),
        issued(3, 1, 0),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("ID 3 handed out twice"), "{e}");
}

#[test]
fn the_referee_catches_ids_that_do_not_increase() {
    let history = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(5, 1, 0),
        issued(2, 1, 0),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("not increasing"), "{e}");
}

#[test]
fn the_referee_catches_an_invented_id() {
    // Outside every grant; and a grant delivered under a Read's id, or under an id never
    // asked, grants nothing.
    let outside = [alloc_req(1, 0), granted(1, 1, 11, 11), issued(11, 1, 0)];
    let e = referee_over(&outside).unwrap_err();
    assert!(e.contains("ID 11 lies in no segment"), "{e}");
    let read = Seen::Sent {
        req: Request {
            id: 1,
            call: StoreCall::Read {
                tag: TAG.to_owned(),
            },
        },
        mono: 0,
    };
    let misrouted = [read, granted(1, 1, 11, 11), issued(1, 1, 0)];
    let e = referee_over(&misrouted).unwrap_err();
    assert!(e.contains("ID 1 lies in no segment"), "{e}");
    let never_asked = [alloc_req(1, 0), granted(2, 1, 11, 11), issued(1, 1, 0)];
    let e = referee_over(&never_asked).unwrap_err();
    assert!(e.contains("ID 1 lies in no segment"), "{e}");
    let off_residue = [
        alloc_req(1, 0),
        Seen::Delivered {
            id: 1,
            mono: 0,
            reply: StoreReply::Allocate(Ok(Grant {
                tag: TAG.to_owned(),
                segment: Segment {
                    start: 1,
                    end: 31,
                    delta: 3,
                },
                version: 1,
                claim_end: 31,
                lease_expiry_ms: LEASE_MS,
                from_pool: false,
                tag_step: 10,
            })),
        },
        issued(2, 1, 0),
    ];
    let e = referee_over(&off_residue).unwrap_err();
    assert!(e.contains("ID 2 lies in no segment"), "{e}");
}

#[test]
fn the_referee_catches_an_id_beyond_the_acknowledged_claim() {
    let history = [alloc_req(1, 0), granted(1, 1, 11, 4), issued(1, 4, 0)];
    let e = referee_over(&history).unwrap_err();
    assert!(
        e.contains("ID 4 at or beyond the acknowledged claim 4"),
        "{e}"
    );
    // A renewal raises it; a renewal this incarnation did not ask for does not.
    let mut raised = vec![alloc_req(1, 0), granted(1, 1, 11, 4)];
    raised.extend(renewed(2, 1, 8, 10));
    raised.push(issued(1, 7, 20));
    assert_eq!(referee_over(&raised), Ok(()));
    let unasked = [
        alloc_req(1, 0),
        granted(1, 1, 11, 4),
        Seen::Delivered {
            id: 9,
            mono: 0,
            reply: StoreReply::Renew(Ok(Lease {
                claim_end: 11,
                lease_expiry_ms: LEASE_MS,
            })),
        },
        issued(1, 5, 0),
    ];
    let e = referee_over(&unasked).unwrap_err();
    assert!(e.contains("acknowledged claim 4"), "{e}");
}

#[test]
fn the_referee_catches_an_id_issued_after_the_lease() {
    // Sent at 0: provable strictly before 0 + 1000 - 50.
    let edge = LEASE_MS - DRIFT_MS;
    let just_in = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(1, 1, edge - 1),
    ];
    assert_eq!(referee_over(&just_in), Ok(()));
    let late = [alloc_req(1, 0), granted(1, 1, 11, 11), issued(1, 1, edge)];
    let e = referee_over(&late).unwrap_err();
    assert!(e.contains("after its lease ended at 950 ms"), "{e}");
    // A renewal sent at 500 extends it to 1450, not further.
    let mut renewed_once = vec![alloc_req(1, 0), granted(1, 1, 11, 11)];
    renewed_once.extend(renewed(2, 1, 11, 500));
    renewed_once.push(issued(1, 1, 1_449));
    renewed_once.push(issued(2, 1, 1_450));
    let e = referee_over(&renewed_once).unwrap_err();
    assert!(e.contains("ID 2 handed out at 1450 ms"), "{e}");
}

#[test]
fn the_referee_catches_a_min_id_below_what_was_issued() {
    let history = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(1, 5, 0),
        alloc_req(2, 5),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("min_id 5 though 5 was already issued"), "{e}");
}

#[test]
fn the_referee_catches_a_false_release_and_issuing_after_it() {
    let release = |used_end| Seen::Sent {
        req: Request {
            id: 2,
            call: StoreCall::Release(sut::id_store::ReleaseRequest {
                tag: TAG.to_owned(),
                instance: InstanceId(1),
                segment_start: 1,
                used_end,
            }),
        },
        mono: 0,
    };
    let false_release = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(1, 5, 0),
        release(4),
    ];
    let e = referee_over(&false_release).unwrap_err();
    assert!(e.contains("though [4, 5] were"), "{e}");
    let after = [
        alloc_req(1, 0),
        granted(1, 1, 11, 11),
        issued(1, 5, 0),
        release(6),
        issued(6, 1, 0),
    ];
    let e = referee_over(&after).unwrap_err();
    assert!(e.contains("after its Release"), "{e}");
}

#[test]
fn the_referee_catches_a_reused_request_id_and_an_unasked_degraded_id() {
    let e = referee_over(&[alloc_req(1, 0), alloc_req(1, 0)]).unwrap_err();
    assert!(e.contains("request id 1 used twice"), "{e}");
    let e = referee_over(&[Seen::Degraded { id: 1 << 62 }]).unwrap_err();
    assert!(e.contains("degraded mode off"), "{e}");
}

/// A degraded-mode ID of `worker` in time unit `ts`, sequence `seq`.
fn degraded_id(ts: u64, worker: u32, seq: u64) -> u64 {
    DEGRADED_FLAG | DEGRADED_LAYOUT.compose(ts, u64::from(worker), seq)
}

/// The store acknowledges a reservation up to unit `reserved_ts` for request `id`.
fn reserved(id: u64, reserved_ts: u64) -> [Seen; 2] {
    let call = StoreCall::RenewWorker {
        namespace: DEGRADED_NAMESPACE.to_owned(),
        worker_id: WORKER_ID,
        instance: InstanceId(1),
        reserve_ts: reserved_ts,
        lease_ms: LEASE_MS,
        now_ms: 0,
    };
    let lease = WorkerLease {
        worker_id: WORKER_ID,
        lease_expiry_ms: LEASE_MS,
        reserved_ts,
    };
    [
        Seen::Sent {
            req: Request { id, call },
            mono: 0,
        },
        Seen::Delivered {
            id,
            mono: 0,
            reply: StoreReply::Worker(Ok(lease)),
        },
    ]
}

fn degraded_referee_over(floor_ts: u64, history: &[Seen]) -> Result<(), String> {
    let mut referee = Referee::degraded(DRIFT_MS, floor_ts);
    history.iter().try_for_each(|seen| referee.see(seen))
}

#[test]
fn the_referee_catches_degraded_ids_outside_the_reservation_or_of_another_worker() {
    let [sent, acked] = reserved(1, 100);
    let ok = |ts, seq| Seen::Degraded {
        id: degraded_id(ts, WORKER_ID, seq),
    };
    let good = [
        sent.clone(),
        acked.clone(),
        ok(51, 0),
        ok(51, 1),
        ok(100, 0),
    ];
    assert_eq!(degraded_referee_over(50, &good), Ok(()));
    // At the floor: a predecessor may have issued in that unit.
    let e = degraded_referee_over(50, &[sent.clone(), acked.clone(), ok(50, 3)]).unwrap_err();
    assert!(e.contains("outside (50, 100]"), "{e}");
    // Above what the store acknowledged: a successor starts there.
    let e = degraded_referee_over(50, &[sent.clone(), acked.clone(), ok(101, 0)]).unwrap_err();
    assert!(e.contains("outside (50, 100]"), "{e}");
    // A reservation never acknowledged does not count.
    let e = degraded_referee_over(50, &[sent.clone(), ok(60, 0)]).unwrap_err();
    assert!(e.contains("outside (50, 50]"), "{e}");
    let e = degraded_referee_over(50, &[ok(60, 1), ok(60, 0)]).unwrap_err();
    assert!(e.contains("outside"), "{e}");
    let e = degraded_referee_over(50, &[sent.clone(), acked.clone(), ok(60, 1), ok(60, 0)])
        .unwrap_err();
    assert!(e.contains("not increasing"), "{e}");
    let other = Seen::Degraded {
        id: degraded_id(60, WORKER_ID + 1, 0),
    };
    let e = degraded_referee_over(50, &[sent.clone(), acked.clone(), other]).unwrap_err();
    assert!(e.contains("of worker 8, not the leased 7"), "{e}");
    let unflagged = Seen::Degraded {
        id: degraded_id(60, WORKER_ID, 0) & !DEGRADED_FLAG,
    };
    let e = degraded_referee_over(50, &[sent.clone(), acked.clone(), unflagged]).unwrap_err();
    assert!(
        e.contains("must be exactly the flag 0x4000000000000000"),
        "{e}"
    );
    let high = Seen::Degraded {
        id: degraded_id(60, WORKER_ID, 0) | 1 << 55,
    };
    let e = degraded_referee_over(50, &[sent, acked, high]).unwrap_err();
    assert!(e.contains("must be exactly the flag"), "{e}");
}

#[test]
fn the_referee_catches_a_segment_id_in_the_degraded_space() {
    let limit = SEGMENT_ID_LIMIT;
    let history = [
        alloc_req(1, 0),
        granted(1, limit - 1, limit + 9, limit + 9),
        issued(limit - 1, 2, 0),
    ];
    let e = referee_over(&history).unwrap_err();
    assert!(e.contains("at or above 2^62"), "{e}");
}

#[test]
fn the_step_check_catches_a_step_off_leafs_rule() {
    let fresh = Steps {
        tag_step: 4,
        step_max: 16,
        last: None,
    };
    let e = fresh.clone().asked(8).unwrap_err();
    assert!(e.contains("Leaf's rule gives 4"), "{e}");
    let mut steps = fresh;
    assert_eq!(steps.asked(4), Ok(()));
    assert_eq!(
        steps.asked(4),
        Ok(()),
        "a retry after a conflict keeps the step"
    );
    steps.used_up(1_000);
    let e = steps.clone().asked(4).unwrap_err();
    assert!(e.contains("Leaf's rule gives 8"), "{e}");
    steps.used_up(10);
    steps.used_up(LEAF_FAST_MS - 1);
    assert_eq!(
        steps.asked(16),
        Ok(()),
        "4 doubled three times, capped at 16"
    );
    // 16 kept (15 minutes, just under 30), halved (30 minutes), kept, halved (an hour): 4.
    for lasted_ms in [
        LEAF_FAST_MS,
        LEAF_SLOW_MS - 1,
        LEAF_SLOW_MS,
        LEAF_FAST_MS,
        3_600_000,
    ] {
        steps.used_up(lasted_ms);
    }
    let e = steps.clone().asked(8).unwrap_err();
    assert!(e.contains("Leaf's rule gives 4"), "{e}");
    assert_eq!(steps.asked(4), Ok(()));
    // Halving stops at the tag's step.
    steps.used_up(LEAF_SLOW_MS);
    let e = steps.clone().asked(2).unwrap_err();
    assert!(e.contains("Leaf's rule gives 4"), "{e}");
    steps.last = Some(None);
    assert_eq!(steps.asked(5), Ok(()), "unknown after a shutdown");
    let capped_by_tag = Steps {
        tag_step: 8,
        step_max: 2,
        last: Some(Some((8, vec![0]))),
    };
    let e = capped_by_tag.clone().asked(2).unwrap_err();
    assert!(e.contains("gives 8"), "{e}");
}

/// A willing store and a caller that takes the last ID of each segment exactly `lifetimes_ms`
/// after its grant was delivered (the allocator asks for the next segment only once one is used
/// up); every lease is renewed meanwhile. Returns the size of every `Allocate`, in order. The
/// referee checks each against Leaf's rule.
fn leaf_lifetimes(lifetimes_ms: &[u64]) -> Result<Vec<u64>, String> {
    let setup = Setup {
        prefetch_used_pct: 100,
        ..Setup::SMALL
    };
    let mut bench = Bench::new(setup, Variant::Correct);
    // Every call is answered at once, in order: the calls before `answered` are all answered.
    let mut answered = 0;
    let mut answer_all = |bench: &mut Bench| -> Result<bool, String> {
        let mut released = false;
        while answered < bench.sent.len() {
            released |= matches!(bench.sent[answered].1, StoreCall::Release(_));
            bench.step(&answer(Pick::Any(answered), How::Honest, 0))?;
            answered += 1;
        }
        Ok(released)
    };
    bench.step(&Action::Take(1))?;
    answer_all(&mut bench)?;
    for &lifetime_ms in lifetimes_ms {
        let granted = bench.now.mono_ms;
        let end = granted + lifetime_ms;
        while let Some(due) = bench.alloc.poll_timeout().filter(|due| *due < end) {
            bench.step(&Action::Advance(due.saturating_sub(bench.now.mono_ms)))?;
            bench.step(&Action::Timeout)?;
            if answer_all(&mut bench)? {
                return Err(format!(
                    "a Release at {} ms, before {end}",
                    bench.now.mono_ms
                ));
            }
        }
        bench.step(&Action::Advance(end - bench.now.mono_ms))?;
        loop {
            bench.step(&Action::Take(1))?;
            if answer_all(&mut bench)? {
                break;
            }
        }
        if bench.now.mono_ms != end {
            return Err(format!(
                "the segment lasted to {} ms, not {end}",
                bench.now.mono_ms
            ));
        }
    }
    Ok(bench
        .sent
        .iter()
        .filter_map(|(_, call, _)| match call {
            StoreCall::Allocate(a) => Some(a.ids),
            _ => None,
        })
        .collect())
}

/// Leaf's thresholds hold to the millisecond: a segment that lasted just under 15 minutes
/// doubles the step, exactly 15 keeps it, just under 30 keeps it, exactly 30 halves it.
#[test]
fn leafs_step_changes_at_exactly_15_and_30_minutes() {
    // The last segment, used up at once, shows the step the one before left.
    let lifetimes = [
        LEAF_FAST_MS - 1,
        LEAF_FAST_MS,
        LEAF_SLOW_MS - 1,
        LEAF_SLOW_MS,
        0,
    ];
    let asked = leaf_lifetimes(&lifetimes).unwrap();
    // An `Allocate` is sent as the last ID is taken, before the used-up segment changes the
    // step: the tag's step 4 twice; doubled; kept; kept; halved.
    assert_eq!(asked, [4, 4, 8, 8, 8, 4]);
}

fn answer(pick: Pick, how: How, k: u64) -> Action {
    Action::Answer {
        pick,
        how,
        k,
        misroute: false,
    }
}

fn oldest(how: How) -> Action {
    answer(Pick::Pending(0), how, 0)
}

#[test]
fn the_bench_catches_a_lease_timed_from_the_answer_without_margin() {
    // ReclaimNoDriftMargin: the grant, asked at 0 and answered at 900, is used until 1900; the
    // lease is provable only until 950.
    let actions = [
        Action::Take(1),
        oldest(How::Honest),
        Action::Advance(900),
        oldest(How::Generous),
        Action::Advance(100),
        Action::Take(1),
    ];
    assert_eq!(run(Setup::SMALL, Variant::Correct, &actions), Ok(()));
    let flawed = Variant::Flawed(Flaw::ReclaimNoDriftMargin);
    let e = run(Setup::SMALL, flawed, &actions).unwrap_err();
    assert!(e.starts_with("step 5"), "{e}");
    assert!(e.contains("after its lease ended at 950 ms"), "{e}");
}

#[test]
fn the_bench_catches_issuing_beyond_the_claim() {
    // The grant claims nothing (Stingy, k even): the allocator must wait for a renewal.
    let actions = [
        Action::Take(1),
        oldest(How::Honest),
        oldest(How::Stingy),
        Action::Take(1),
    ];
    assert_eq!(run(Setup::SMALL, Variant::Correct, &actions), Ok(()));
    let flawed = Variant::Flawed(Flaw::ReclaimNoDriftMargin);
    let e = run(Setup::SMALL, flawed, &actions).unwrap_err();
    assert!(e.starts_with("step 3"), "{e}");
    assert!(e.contains("at or beyond the acknowledged claim 1"), "{e}");
}

#[test]
fn the_bench_catches_ids_used_before_the_grant() {
    // CounterNoPersist issues from the row as read, before (whatever) the grant.
    let actions = [Action::Take(1), oldest(How::Honest), Action::Take(1)];
    assert_eq!(run(Setup::SMALL, Variant::Correct, &actions), Ok(()));
    let flawed = Variant::Flawed(Flaw::CounterNoPersist);
    let e = run(Setup::SMALL, flawed, &actions).unwrap_err();
    assert!(e.starts_with("step 2"), "{e}");
    assert!(e.contains("ID 1 lies in no segment"), "{e}");
}

/// Gets a segment of [`Setup::SMALL`] and issues two IDs.
const TWO_IDS: [Action; 4] = [
    Action::Take(1),
    Action::Answer {
        pick: Pick::Pending(0),
        how: How::Honest,
        k: 0,
        misroute: false,
    },
    Action::Answer {
        pick: Pick::Pending(0),
        how: How::Generous,
        k: 0,
        misroute: false,
    },
    Action::Take(1),
];

#[test]
fn the_bench_catches_wrong_allocators() {
    let mut actions = TWO_IDS.to_vec();
    actions.push(Action::Take(1));
    assert_eq!(run(Setup::SMALL, Variant::Correct, &actions), Ok(()));
    let e = run(Setup::SMALL, Variant::Mutant(Mutant::Repeat), &actions).unwrap_err();
    assert!(e.contains("ID 1 handed out twice"), "{e}");
    actions.push(Action::Take(1));
    let e = run(Setup::SMALL, Variant::Mutant(Mutant::Swap), &actions).unwrap_err();
    assert!(e.contains("not increasing"), "{e}");
    let e = run(
        Setup::SMALL,
        Variant::Mutant(Mutant::BadInvariants),
        &actions,
    )
    .unwrap_err();
    assert!(e.contains("invariant: mutant says no"), "{e}");
    let mut unknown = TWO_IDS.to_vec();
    unknown.push(answer(Pick::Unknown(0), How::Honest, 0));
    assert_eq!(run(Setup::SMALL, Variant::Correct, &unknown), Ok(()));
    let e = run(
        Setup::SMALL,
        Variant::Mutant(Mutant::PanicOnUnknown),
        &unknown,
    )
    .unwrap_err();
    assert!(e.starts_with("step 4"), "{e}");
    assert!(e.contains("panicked: mutant"), "{e}");
}

#[test]
fn random_hostile_sequences_find_each_broken_allocator() {
    // The property above, run as a search: every flaw and mutant is found within the budget.
    for variant in [
        Variant::Flawed(Flaw::ReclaimNoDriftMargin),
        Variant::Flawed(Flaw::CounterNoPersist),
        Variant::Mutant(Mutant::Repeat),
        Variant::Mutant(Mutant::Swap),
        Variant::Mutant(Mutant::PanicOnUnknown),
        Variant::Mutant(Mutant::BadInvariants),
    ] {
        let mut runner = TestRunner::new(Config {
            max_shrink_iters: 0,
            ..fixed(CASES)
        });
        let found = runner.run(&(setup(), actions()), |(setup, actions)| {
            run(setup, variant, &actions).map_err(TestCaseError::fail)
        });
        assert!(
            found.is_err(),
            "{variant:?} survived {CASES} hostile sequences"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replies outside the store's contract. The allocator checks each grant before installing it:
// a segment with a zero `delta`, reversed, reaching past 2^62 or starting below the `min_id` it
// asked for (or below its own IDs) is refused like a failed fetch (counted in
// `malformed_replies` and `fetch_failures`, backed off, read again) and never issued from; a
// claim outside its segment (a grant's or a renewal's) is clamped into it, and counted.

/// A segment `[1, 5)` of [`Setup::SMALL`], all claimed, IDs 1, 2, 3 issued (the prefetch is
/// due), the prefetch read answered: the next reply answers an `Allocate` with `min_id` 5.
fn prefetch_pending() -> Vec<Action> {
    let mut actions = TWO_IDS.to_vec();
    actions.extend([Action::Take(1), Action::Take(1), oldest(How::Honest)]);
    actions
}

/// [`prefetch_pending`], then malformed grant `k` (see [`HostileStore::malformed_grant`]), then
/// IDs asked for.
fn malformed_prefetch(k: u64) -> Vec<Action> {
    let mut actions = prefetch_pending();
    actions.push(answer(Pick::Pending(0), How::Malformed, k));
    actions.extend([Action::Take(40); 4]);
    actions
}

/// Runs [`malformed_prefetch`] `k` (every promise kept, `check_invariants` included) and
/// returns the allocator's stats and its last error.
fn after_malformed_prefetch(k: u64) -> (AllocatorStats, Option<String>) {
    let bench = run_bench(Setup::SMALL, Variant::Correct, &malformed_prefetch(k))
        .unwrap_or_else(|e| panic!("malformed grant {k}: {e}"));
    let health = bench.alloc.health(bench.now);
    (health.stats, health.last_error)
}

/// Asserts that malformed grant `k` was refused for `why`: counted, a failed fetch, and only
/// ID 4 (the rest of `[1, 5)`) issued after it.
fn assert_refused(k: u64, why: &str) {
    let (stats, last_error) = after_malformed_prefetch(k);
    let last_error = last_error.unwrap_or_default();
    assert!(
        last_error.starts_with("store backend: malformed grant refused: ")
            && last_error.contains(why),
        "{k}: {last_error}"
    );
    assert_eq!(stats.malformed_replies, 1, "{k}: {stats:?}");
    assert_eq!(stats.fetch_failures, 1, "{k}: {stats:?}");
    assert_eq!(stats.reloads, 1, "{k}: only [1, 5) installed: {stats:?}");
    assert_eq!(stats.issued, 4, "{k}: IDs 1 to 4: {stats:?}");
}

#[test]
fn malformed_replies_that_are_shrugged_off() {
    // An empty grant is used up at once (and released).
    assert_eq!(
        run(Setup::SMALL, Variant::Correct, &malformed_prefetch(4)),
        Ok(())
    );
    // A renewal acknowledging a claim past the segment's end is clamped to it (and counted).
    let mut renew = TWO_IDS.to_vec();
    renew.extend([
        Action::Advance(300),
        Action::Timeout,
        answer(Pick::Pending(0), How::Malformed, 0),
        Action::Take(40),
        Action::Take(40),
    ]);
    let bench = run_bench(Setup::SMALL, Variant::Correct, &renew).unwrap();
    assert_eq!(bench.alloc.stats().malformed_replies, 1);
    // A row with step 0 or with max_id past 2^62 leads to no ID outside a grant.
    for k in [0, 2] {
        let actions = [
            Action::Take(1),
            answer(Pick::Pending(0), How::Malformed, k),
            oldest(How::Honest),
            Action::Take(40),
            Action::SleepUntilDue,
            Action::Take(1),
        ];
        assert_eq!(run(Setup::SMALL, Variant::Correct, &actions), Ok(()), "{k}");
    }
}

#[test]
fn a_grant_below_min_id_is_refused() {
    // The prefetch's Allocate (min_id 5) is answered with the first segment again, [1, 5):
    // installed, it would hand 1, 2, 3 out a second time. A misrouted grant (another
    // Allocate's reply) is the same.
    assert_refused(0, "starts below 5");
}

#[test]
fn a_claim_past_the_segment_end_is_clamped_to_it() {
    // The prefetch gets [5, 9) with claim_end 12: the claim is clamped to 9, so 5 to 8 are
    // issued from it and 9, 10, 11 (in no granted segment) never are.
    let (stats, _) = after_malformed_prefetch(1);
    assert_eq!(stats.malformed_replies, 1, "{stats:?}");
    assert_eq!(stats.fetch_failures, 0, "{stats:?}");
    assert_eq!(stats.issued, 8, "IDs 1 to 8: {stats:?}");
}

#[test]
fn a_zero_delta_grant_is_refused() {
    // [5, 9) with delta 0: nothing to step by.
    assert_refused(3, "has delta 0");
}

#[test]
fn a_grant_past_the_segment_id_limit_is_refused() {
    // [2^62 - 1, 2^62 + 9): 2^62 has bit 62 set, like degraded IDs.
    assert_refused(6, "reaches past the segment ID limit 2^62");
}

#[test]
fn a_reversed_segment_is_refused() {
    // [9, 5).
    assert_refused(5, "ends before it starts");
}

#[test]
fn a_claim_below_its_segment_is_clamped_to_its_start() {
    // [5, 9) with claim_end 4 holds the claim 5: nothing claimed yet, so nothing is issued from
    // it until a renewal raises the claim (and the Takes below ask for none).
    let (stats, _) = after_malformed_prefetch(2);
    assert_eq!(stats.malformed_replies, 1, "{stats:?}");
    assert_eq!(stats.fetch_failures, 0, "{stats:?}");
    assert_eq!(stats.issued, 4, "IDs 1 to 4: {stats:?}");
}

#[test]
fn a_huge_but_legal_tag_step_is_served() {
    // TagSpec::validate accepts any step with step × delta below 2^62, and the memory store
    // creates the tag; the allocator's first step is the tag's (Leaf's cap applies only from
    // the second segment on), and its claim (25%) is computed without overflow.
    use sut::id_store::{IdStore, MemoryIdStore, TagSpec};
    let step = 1 << 61;
    let mut store = MemoryIdStore::new();
    store.create_tag(TAG, &TagSpec::simple(step)).unwrap();
    let cfg = AllocatorConfig::new(TAG, InstanceId(1));
    let mut alloc = SegmentAllocator::new(cfg, Now::both(0)).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..4 {
            if let Take::Block(block) = alloc.next_id(Now::both(0)) {
                return Some(block.start);
            }
            while let Some(req) = alloc.poll_request() {
                let reply = req.call.execute(&mut store);
                alloc.handle_reply(req.id, reply, Now::both(0));
            }
        }
        None
    }));
    assert!(matches!(outcome, Ok(Some(1))), "{outcome:?}");
    let current = alloc.health(Now::both(0)).current.expect("a segment");
    assert_eq!(current.segment.end, 1 + step);
    assert_eq!(current.claim_end, 1 + step / 4);
    assert_eq!(current.remaining_pct, 99);
    assert_eq!(alloc.check_invariants(), Ok(()));
}

#[test]
fn an_unaligned_claim_keeps_the_invariants() {
    // Segment [2, 10) with delta 2 and claim_end 5: the allocator issues 2 and 4 (both below 5)
    // and then waits; `next` (6) lies past the claim, but no ID issued does.
    let setup = Setup {
        delta: 2,
        tag_step: 4,
        ..Setup::SMALL
    };
    let cfg = config(&setup, 1, None, 0);
    let mut alloc = SegmentAllocator::new(cfg, Now::both(0)).unwrap();
    let now = Now::both(0);
    assert_eq!(alloc.next_id(now), Take::Pending);
    let read = alloc.poll_request().unwrap();
    let mut store = HostileStore::new(setup);
    alloc.handle_reply(read.id, store.answer(&read.call, How::Honest, 0), now);
    let allocate = alloc.poll_request().unwrap();
    let StoreReply::Allocate(Ok(mut grant)) = store.answer(&allocate.call, How::Generous, 0) else {
        panic!("a grant");
    };
    grant.claim_end = grant.segment.start + 3;
    let reply = StoreReply::Allocate(Ok(grant));
    let mut referee = Referee::new(DRIFT_MS);
    referee
        .see(&Seen::Sent {
            req: allocate.clone(),
            mono: 0,
        })
        .unwrap();
    referee
        .see(&Seen::Delivered {
            id: allocate.id,
            mono: 0,
            reply: reply.clone(),
        })
        .unwrap();
    alloc.handle_reply(allocate.id, reply, now);
    let mut issued = Vec::new();
    for _ in 0..3 {
        if let Take::Block(block) = alloc.take_block(now, 1) {
            issued.extend(block.ids());
            referee.see(&Seen::Issued { block, mono: 0 }).unwrap();
        }
        assert_eq!(alloc.check_invariants(), Ok(()));
    }
    assert_eq!(issued, [2, 4]);
    assert_eq!(
        alloc.stats().malformed_replies,
        0,
        "a claim inside its segment"
    );
}

#[test]
fn malformed_replies_are_refused_or_clamped_along_random_sequences() {
    // The property below reaches both answers to a malformed reply.
    let mut runner = TestRunner::new(fixed(CASES));
    let strategy = (setup(), malformed_actions());
    let mut seen = Coverage::new();
    for _ in 0..CASES {
        let (setup, actions) = strategy.new_tree(&mut runner).unwrap().current();
        let bench = run_bench(setup, Variant::Correct, &actions).unwrap();
        for (what, n) in &bench.coverage {
            *seen.entry(what).or_insert(0) += n;
        }
    }
    for want in ["malformed grant refused", "malformed claim clamped"] {
        assert!(seen.contains_key(want), "never reached: {want} ({seen:?})");
    }
}

proptest! {
    #![proptest_config(fixed(CASES))]

    /// The property above, with malformed replies mixed in.
    #[test]
    fn the_allocator_keeps_its_promises_whatever_the_store_says_even_malformed(
        setup in setup(),
        actions in malformed_actions(),
    ) {
        prop_assert_eq!(run(setup, Variant::Correct, &actions), Ok(()));
    }
}

/// A hostile operator: every limit of the allocator's configuration refused just past its bound
/// and accepted on it, so that no scenario, model or server runs an allocator whose lease,
/// renewal, claims or step are out of range (a renewal at or after the usable lease, for one,
/// would let a lease lapse while its IDs are still handed out).
#[test]
fn a_configuration_past_any_bound_is_refused_and_one_on_it_accepted() {
    type Edit = fn(&mut AllocatorConfig);
    let accepted: [(&str, Edit); 12] = [
        ("prefetch_used_pct 1", |c| c.prefetch_used_pct = 1),
        ("prefetch_used_pct 100", |c| c.prefetch_used_pct = 100),
        ("claim_pct 1", |c| c.claim_pct = 1),
        ("claim_pct 100", |c| c.claim_pct = 100),
        ("lease_ms just above twice drift_ms_max", |c| {
            c.lease_ms = 2 * c.drift_ms_max + 1;
            c.renew_interval_ms = c.lease_ms - c.drift_ms_max - 1;
        }),
        ("renew_interval_ms 1", |c| c.renew_interval_ms = 1),
        ("renew_interval_ms just below the usable lease", |c| {
            c.renew_interval_ms = c.lease_ms - c.drift_ms_max - 1;
        }),
        ("request_timeout_ms 1", |c| c.request_timeout_ms = 1),
        ("fixed step just below 2^62", |c| {
            c.step = StepPolicy::Fixed {
                step: SEGMENT_ID_LIMIT - 1,
            };
        }),
        ("Leaf step_max just below 2^62", |c| {
            c.step = StepPolicy::Leaf {
                step_max: SEGMENT_ID_LIMIT - 1,
            };
        }),
        ("seed-log step_max just below 2^62", |c| {
            c.step = StepPolicy::SeedLog {
                base: 1,
                step_max: SEGMENT_ID_LIMIT - 1,
            };
        }),
        ("degraded worker of 62 bits", |c| {
            c.degraded = Some(degraded_config(40));
        }),
    ];
    let refused: [(&str, &str, Edit); 14] = [
        ("empty tag", "tag", |c| c.tag = String::new()),
        ("prefetch_used_pct 0", "prefetch_used_pct", |c| {
            c.prefetch_used_pct = 0
        }),
        ("prefetch_used_pct 101", "prefetch_used_pct", |c| {
            c.prefetch_used_pct = 101
        }),
        ("claim_pct 0", "claim_pct", |c| c.claim_pct = 0),
        ("claim_pct 101", "claim_pct", |c| c.claim_pct = 101),
        ("lease_ms twice drift_ms_max", "lease_ms", |c| {
            c.lease_ms = 2 * c.drift_ms_max;
            c.renew_interval_ms = 1;
        }),
        ("renew_interval_ms 0", "renew_interval_ms", |c| {
            c.renew_interval_ms = 0
        }),
        (
            "renew_interval_ms the usable lease",
            "renew_interval_ms",
            |c| {
                c.renew_interval_ms = c.lease_ms - c.drift_ms_max;
            },
        ),
        ("request_timeout_ms 0", "request_timeout_ms", |c| {
            c.request_timeout_ms = 0
        }),
        ("fixed step 2^62", "step", |c| {
            c.step = StepPolicy::Fixed {
                step: SEGMENT_ID_LIMIT,
            }
        }),
        ("Leaf step_max 2^62", "step", |c| {
            c.step = StepPolicy::Leaf {
                step_max: SEGMENT_ID_LIMIT,
            };
        }),
        ("seed-log step_max 2^62", "step", |c| {
            c.step = StepPolicy::SeedLog {
                base: 1,
                step_max: SEGMENT_ID_LIMIT,
            };
        }),
        (
            "degraded worker of 63 bits",
            "degraded.worker.layout",
            |c| {
                c.degraded = Some(degraded_config(41));
            },
        ),
        (
            "degraded worker of 61 bits but a zero time unit",
            "degraded.worker.layout",
            |c| {
                let mut d = degraded_config(39);
                d.worker.layout.unit_ms = 0;
                c.degraded = Some(d);
            },
        ),
    ];
    let now = Now {
        wall_ms: 1_700_000_000_000,
        mono_ms: 0,
    };
    let base = || AllocatorConfig::new(TAG, InstanceId(1));
    assert!(base().validate().is_ok(), "the defaults are refused");
    for (what, edit) in accepted {
        let mut config = base();
        edit(&mut config);
        assert!(
            SegmentAllocator::new(config, now).is_ok(),
            "refused: {what}"
        );
    }
    for (what, field, edit) in refused {
        let mut config = base();
        edit(&mut config);
        match SegmentAllocator::new(config, now) {
            Ok(_) => panic!("accepted: {what}"),
            Err(err) => assert_eq!(err.field, field, "{what}: {err}"),
        }
    }
}

/// A degraded-mode worker whose layout has `time_bits` of time beside the default worker and
/// sequence fields (10 + 12 bits).
fn degraded_config(time_bits: u8) -> sut::segment::DegradedConfig {
    sut::segment::DegradedConfig {
        worker: sut::snowflake::WorkerConfig {
            layout: sut::snowflake::Layout {
                time_bits,
                ..sut::snowflake::Layout::default()
            },
            ..sut::snowflake::WorkerConfig::default()
        },
        worker_id: 1,
        reserved_ts: 0,
    }
}

#[test]
fn the_counter_checks_catch_a_count_going_back_wrapping_or_missing_an_id() {
    let before = AllocatorStats {
        ids_abandoned: 3,
        ..AllocatorStats::default()
    };
    let back = AllocatorStats {
        ids_abandoned: 2,
        ..before
    };
    let e = counters_only_grow(&before, &back).unwrap_err();
    assert!(e.contains("ids_abandoned went from 3 to 2"), "{e}");
    let wrapped = AllocatorStats {
        degraded_issued: 0_u64.wrapping_sub(1),
        ..before
    };
    let e = counters_only_grow(&before, &wrapped).unwrap_err();
    assert!(e.contains("degraded_issued"), "{e}");
    let grown = AllocatorStats {
        issued: 4,
        ids_abandoned: 5,
        ..before
    };
    assert_eq!(counters_only_grow(&before, &grown), Ok(()));
    let e = issued_as_counted(&grown, 5, 0).unwrap_err();
    assert!(
        e.contains("stats count 4 IDs issued, 5 were handed out"),
        "{e}"
    );
    assert_eq!(issued_as_counted(&grown, 4, 0), Ok(()));
    assert_eq!(waits_as_counted(&grown, (0, 0)), Ok(()));
    let e = waits_as_counted(&grown, (0, 1)).unwrap_err();
    assert!(
        e.contains("0 unavailable answers, 0 and 1 were given"),
        "{e}"
    );
    let e = issued_as_counted(&grown, 4, 1).unwrap_err();
    assert!(
        e.contains("stats count 0 degraded-mode IDs issued, 1 were handed out"),
        "{e}"
    );
}
