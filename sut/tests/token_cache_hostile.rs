//! The renewing token cache against hostile callers and renewers: callers ask for any of a few
//! keys at any time; renewers report new tokens late, twice, for keys that never asked or were
//! evicted meanwhile, tokens already expired or older than the one cached, or failures; a renewal
//! may never report at all; the wall clock jumps both ways, the monotonic one only forwards;
//! the cache is smaller than the set of keys. The properties are the cache's own promises
//! (`sut::token::cache`'s docs), checked by a referee after every call:
//!
//! - `Fresh` hands out the newest token reported for the key, with more than `renew_before_ms`
//!   left; `Renew` and `Pending` hand out that token as `still_valid` exactly while it has not
//!   expired, and only when it is not fresh;
//! - at most one renewal per key is in flight: a `Renew` is answered only when none is, or the
//!   one in flight was handed out `renew_timeout_ms` or more ago; otherwise `Pending`; and never
//!   `Pending` when no renewal is in flight;
//! - at most `entries_max` keys; to admit a key a full cache evicts exactly one, the least
//!   recently used one with no renewal in flight (else the least recently used);
//! - the counters count exactly the answers, evictions and timed-out renewals.
//!
//! Deliberately wrong caches show each check firing; a coverage test shows the callers reaching
//! what the properties are about.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use sut::clock::Now;
use sut::token::cache::{CacheStats, CachedToken};
use sut::token::{CacheAnswer, CacheConfig, TokenCache};

const CASES: u32 = 256;
const KEYS: u8 = 5;

#[derive(Clone, Copy, Debug)]
enum Op {
    Get(u8),
    /// A renewal of key reports a token expiring `exp_in_ms` after the wall clock (before it when
    /// negative).
    Renewed {
        key: u8,
        exp_in_ms: i64,
    },
    Failed(u8),
    /// Both clocks move ahead.
    Advance(u64),
    /// The wall clock jumps (back when negative).
    WallJump(i64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        8 => key.clone().prop_map(Op::Get),
        4 => (key.clone(), prop_oneof![-1_000_i64..0, 0_i64..40_000, 0_i64..200_000])
            .prop_map(|(key, exp_in_ms)| Op::Renewed { key, exp_in_ms }),
        1 => key.prop_map(Op::Failed),
        4 => prop_oneof![0_u64..100, 0_u64..10_000, 0_u64..60_000].prop_map(Op::Advance),
        1 => (-60_000_i64..60_000).prop_map(Op::WallJump),
    ]
}

fn config() -> impl Strategy<Value = CacheConfig> {
    (
        prop::sample::select(vec![0_u64, 1_000, 30_000]),
        prop::sample::select(vec![1_u64, 5_000, 50_000]),
        1_usize..=4,
    )
        .prop_map(
            |(renew_before_ms, renew_timeout_ms, entries_max)| CacheConfig {
                renew_before_ms,
                renew_timeout_ms,
                entries_max,
            },
        )
}

/// What the referee knows of a held key.
#[derive(Clone, Debug, Default)]
struct KeyView {
    /// The newest token reported while the key was held (and not expired when reported).
    best: Option<CachedToken>,
    /// When the renewal in flight was handed out (monotonic ms).
    renewing_since_ms: Option<u64>,
    /// Recency: the referee's own counter at the last get (or the admission).
    last_used: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Correct,
    /// Answers `Renew` to every caller (two renewals in flight).
    RenewAlways,
    /// Hands out the cached token as fresh until it expires.
    NoRenewMargin,
    /// Forgets every key when full, instead of evicting one.
    ForgetAllWhenFull,
}

struct Bench {
    cfg: CacheConfig,
    variant: Variant,
    cache: TokenCache<u8>,
    now: Now,
    held: BTreeMap<u8, KeyView>,
    clock: u64,
    want: CacheStats,
    coverage: BTreeMap<&'static str, u64>,
}

impl Bench {
    fn new(cfg: CacheConfig, variant: Variant) -> Self {
        Self {
            cfg,
            variant,
            cache: TokenCache::new(cfg),
            now: Now {
                wall_ms: 1_700_000_000_000,
                mono_ms: 0,
            },
            held: BTreeMap::new(),
            clock: 0,
            want: CacheStats::default(),
            coverage: BTreeMap::new(),
        }
    }

    fn cover(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_insert(0) += 1;
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Get(key) => self.get(key)?,
            Op::Renewed { key, exp_in_ms } => {
                let token = CachedToken {
                    token: format!("t{}", self.clock),
                    exp_ms: self.now.wall_ms.saturating_add_signed(exp_in_ms),
                };
                if !self.held.contains_key(&key) {
                    self.cover("renewal reported for a key not held");
                }
                self.admit(key, false, |c, now| {
                    c.handle_renewed(&key, token.clone(), now);
                });
                let view = self.held.get_mut(&key).expect("admitted");
                view.renewing_since_ms = None;
                let newer = view.best.as_ref().is_none_or(|b| b.exp_ms <= token.exp_ms);
                if self.now.wall_ms < token.exp_ms && newer {
                    view.best = Some(token);
                } else {
                    self.cover("expired or older token reported");
                }
            }
            Op::Failed(key) => {
                self.cache.handle_renew_failed(&key);
                if let Some(view) = self.held.get_mut(&key) {
                    view.renewing_since_ms = None;
                }
            }
            Op::Advance(ms) => self.now = self.now.plus_ms(ms),
            Op::WallJump(ms) => self.now.wall_ms = self.now.wall_ms.saturating_add_signed(ms),
        }
        self.agree()
    }

    /// Calls `call` (a `get` or a renewal report for `key`) and applies the admission to the
    /// referee's view (`agree` compares the two): a key not held is added, evicting from a full cache the least recently used key with no renewal in
    /// flight (else the least recently used). `touch`: the call counts as a use of a held key.
    fn admit(&mut self, key: u8, touch: bool, call: impl FnOnce(&mut TokenCache<u8>, Now)) {
        if self.variant == Variant::ForgetAllWhenFull
            && !self.cache.contains(&key)
            && self.cache.len() >= self.cfg.entries_max
        {
            self.cache = TokenCache::new(self.cfg);
        }
        call(&mut self.cache, self.now);
        self.clock += 1;
        if let Some(view) = self.held.get_mut(&key) {
            if touch {
                view.last_used = self.clock;
            }
            return;
        }
        if self.held.len() >= self.cfg.entries_max {
            let idle = self
                .held
                .iter()
                .filter(|(_, v)| v.renewing_since_ms.is_none())
                .min_by_key(|(_, v)| v.last_used);
            let victim = idle
                .or_else(|| self.held.iter().min_by_key(|(_, v)| v.last_used))
                .map(|(k, _)| *k)
                .expect("a full cache holds a key");
            if idle.is_none() {
                self.cover("evicted a key with a renewal in flight");
            }
            self.held.remove(&victim);
            self.want.evictions += 1;
            self.cover("eviction");
        }
        let view = KeyView {
            last_used: self.clock,
            ..KeyView::default()
        };
        self.held.insert(key, view);
    }

    fn get(&mut self, key: u8) -> Result<(), String> {
        let mut answer = None;
        self.admit(key, true, |c, now| answer = Some(c.get(&key, now)));
        let mut answer = answer.expect("called");
        let (now, cfg) = (self.now, self.cfg);
        let view = self.held.get_mut(&key).expect("admitted");
        match self.variant {
            Variant::RenewAlways if matches!(answer, CacheAnswer::Pending { .. }) => {
                answer = CacheAnswer::Renew {
                    still_valid: view.best.clone().filter(|t| now.wall_ms < t.exp_ms),
                };
            }
            Variant::NoRenewMargin => {
                if let Some(t) = view.best.clone().filter(|t| now.wall_ms < t.exp_ms)
                    && !matches!(answer, CacheAnswer::Fresh(_))
                {
                    answer = CacheAnswer::Fresh(t);
                }
            }
            _ => {}
        }
        let still_valid = view.best.clone().filter(|t| now.wall_ms < t.exp_ms);
        let fresh = still_valid
            .clone()
            .filter(|t| t.exp_ms - now.wall_ms > cfg.renew_before_ms);
        let in_flight = view
            .renewing_since_ms
            .is_some_and(|since| now.mono_ms.saturating_sub(since) < cfg.renew_timeout_ms);
        let expected = match (fresh, in_flight) {
            (Some(t), _) => CacheAnswer::Fresh(t),
            (None, true) => CacheAnswer::Pending { still_valid },
            (None, false) => CacheAnswer::Renew { still_valid },
        };
        if answer != expected {
            return Err(format!(
                "get({key}) at {now:?} answered {answer:?}, expected {expected:?} (cached {:?}, \
                 renewal in flight since {:?})",
                view.best, view.renewing_since_ms
            ));
        }
        let timed_out = view.renewing_since_ms.is_some();
        match answer {
            CacheAnswer::Fresh(_) => self.want.hits += 1,
            CacheAnswer::Pending { .. } => {
                self.want.pending += 1;
                self.cover("pending");
            }
            CacheAnswer::Renew { still_valid } => {
                view.renewing_since_ms = Some(now.mono_ms);
                self.want.renewals_started += 1;
                if timed_out {
                    self.want.renew_timeouts += 1;
                    self.cover("renewal timed out");
                }
                if still_valid.is_some() {
                    self.cover("renew while the old token serves");
                }
            }
        }
        Ok(())
    }

    /// After every call: the keys held, the renewals in flight and the counters are the
    /// referee's.
    fn agree(&self) -> Result<(), String> {
        if self.cache.len() > self.cfg.entries_max || self.cache.len() != self.held.len() {
            return Err(format!(
                "the cache holds {} keys (at most {}), the referee {:?}",
                self.cache.len(),
                self.cfg.entries_max,
                self.held.keys().collect::<Vec<_>>()
            ));
        }
        for key in 0..KEYS {
            let view = self.held.get(&key);
            if self.cache.contains(&key) != view.is_some() {
                return Err(format!(
                    "key {key} held: {}, the referee: {}",
                    self.cache.contains(&key),
                    view.is_some()
                ));
            }
            let renewing = view.is_some_and(|v| v.renewing_since_ms.is_some());
            if self.cache.is_renewing(&key) != renewing {
                return Err(format!(
                    "key {key} renewing: {}, the referee: {renewing}",
                    self.cache.is_renewing(&key)
                ));
            }
        }
        if self.cache.is_empty() != self.held.is_empty() {
            return Err("is_empty disagrees with the keys held".to_owned());
        }
        if self.cache.stats() != self.want {
            return Err(format!(
                "counters {:?}, expected {:?}",
                self.cache.stats(),
                self.want
            ));
        }
        Ok(())
    }
}

fn run_bench(cfg: CacheConfig, variant: Variant, ops: &[Op]) -> Result<Bench, String> {
    let mut bench = Bench::new(cfg, variant);
    for (i, op) in ops.iter().enumerate() {
        bench
            .step(op)
            .map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    Ok(bench)
}

fn fixed(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0xCAC4E),
        failure_persistence: None,
        ..Config::default()
    }
}

fn case() -> impl Strategy<Value = (CacheConfig, Vec<Op>)> {
    (config(), prop::collection::vec(op(), 1..120))
}

proptest! {
    #![proptest_config(fixed(CASES))]

    #[test]
    fn the_cache_keeps_its_promises_whatever_callers_and_renewers_do((cfg, ops) in case()) {
        let result = run_bench(cfg, Variant::Correct, &ops).map(|_| ());
        prop_assert_eq!(result, Ok(()));
    }
}

#[test]
fn hostile_callers_reach_every_rare_situation() {
    let mut runner = TestRunner::new(fixed(CASES));
    let strategy = case();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for _ in 0..CASES {
        let (cfg, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let bench = run_bench(cfg, Variant::Correct, &ops).unwrap_or_else(|e| panic!("{e}"));
        for (what, n) in bench.coverage {
            *seen.entry(what).or_insert(0) += n;
        }
    }
    for want in [
        "eviction",
        "evicted a key with a renewal in flight",
        "pending",
        "renewal timed out",
        "renew while the old token serves",
        "renewal reported for a key not held",
        "expired or older token reported",
    ] {
        assert!(
            seen.get(want).is_some_and(|n| *n > 0),
            "never reached: {want} ({seen:?})"
        );
    }
}

#[test]
fn random_callers_find_each_broken_cache() {
    for (variant, symptom) in [
        (Variant::RenewAlways, "expected Pending"),
        (Variant::NoRenewMargin, "answered Fresh"),
        (Variant::ForgetAllWhenFull, "the cache holds"),
    ] {
        let mut runner = TestRunner::new(fixed(CASES));
        let strategy = case();
        let found = (0..CASES).find_map(|_| {
            let (cfg, ops) = strategy.new_tree(&mut runner).unwrap().current();
            run_bench(cfg, variant, &ops).err()
        });
        let e = found.unwrap_or_else(|| panic!("{variant:?} never caught"));
        assert!(e.contains(symptom), "{variant:?}: {e}");
    }
}
