//! The renewing token cache of the ID, token and lottery design §3.2 (docs/sources.md),
//! sans-IO.
//!
//! The design keeps one token per process in an `atomic.Value` and starts a goroutine to renew it
//! when fewer than 30 s remain. Here the cache is a plain state machine over many keys; the
//! driver does the renewing:
//!
//! 1. [`TokenCache::get`] answers [`CacheAnswer::Fresh`] (use it), or
//!    [`CacheAnswer::Renew`] (this caller must renew now; the old token, if still valid, can be
//!    used meanwhile), or [`CacheAnswer::Pending`] (someone else is renewing: use the still-valid
//!    old token if there is one, else wait). So **at most one renewal is in flight per key**.
//! 2. The renewer calls [`TokenCache::handle_renewed`] with the new token, or
//!    [`TokenCache::handle_renew_failed`]. A renewal that never reports back stops blocking others
//!    after [`CacheConfig::renew_timeout_ms`] (monotonic clock): the next `get` hands out a new
//!    `Renew`.
//!
//! Expiry is judged on the wall clock (a token's `exp` is a wall time); in-flight timeouts and
//! recency on the monotonic clock. The cache holds at most [`CacheConfig::entries_max`] keys; to
//! admit a new one it evicts the least recently used entry that has no renewal in flight (or,
//! if all are in flight, the least recently used).

use crate::clock::Now;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Cache settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Renew when `exp_ms - now.wall_ms <= renew_before_ms` (the design: 30 s).
    pub renew_before_ms: u64,
    /// A renewal silent for this long (monotonic ms) no longer blocks a new one.
    pub renew_timeout_ms: u64,
    /// Most keys held.
    pub entries_max: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            renew_before_ms: 30_000,
            renew_timeout_ms: 10_000,
            entries_max: 10_000,
        }
    }
}

/// A cached token and its expiry (wall ms). `Debug` hides the token (a bearer credential) and
/// shows only its length.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CachedToken {
    /// The token.
    pub token: String,
    /// When it expires, wall-clock ms.
    pub exp_ms: u64,
}

impl std::fmt::Debug for CachedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedToken")
            .field(
                "token",
                &format_args!("<redacted {} bytes>", self.token.len()),
            )
            .field("exp_ms", &self.exp_ms)
            .finish()
    }
}

/// What [`TokenCache::get`] tells a caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CacheAnswer {
    /// A valid token, not due for renewal.
    Fresh(CachedToken),
    /// This caller must renew now and report with `handle_renewed` / `handle_renew_failed`.
    /// `still_valid` is the old token if it has not yet expired.
    Renew {
        /// The old token, if usable meanwhile.
        still_valid: Option<CachedToken>,
    },
    /// Another caller is renewing. `still_valid` as for `Renew`; `None` means wait.
    Pending {
        /// The old token, if usable meanwhile.
        still_valid: Option<CachedToken>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Entry {
    current: Option<CachedToken>,
    /// Monotonic ms when the renewal in flight was handed out.
    renewing_since_ms: Option<u64>,
    /// Recency stamp (a counter, so ties cannot happen).
    last_used: u64,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheStats {
    /// `Fresh` answers.
    pub hits: u64,
    /// `Renew` answers (renewals handed out).
    pub renewals_started: u64,
    /// `Pending` answers.
    pub pending: u64,
    /// Entries evicted to stay within the bound.
    pub evictions: u64,
    /// In-flight renewals abandoned after the timeout.
    pub renew_timeouts: u64,
}

/// The cache. `K` is whatever names a token (a user, a service, an audience).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenCache<K: Ord> {
    cfg: CacheConfig,
    entries: BTreeMap<K, Entry>,
    clock: u64,
    stats: CacheStats,
}

impl<K: Ord + Clone> TokenCache<K> {
    /// An empty cache. `entries_max` must be positive.
    #[must_use]
    pub fn new(cfg: CacheConfig) -> Self {
        assert!(cfg.entries_max > 0, "entries_max must be positive");
        Self {
            cfg,
            entries: BTreeMap::new(),
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn make_room(&mut self, for_key: &K) {
        if self.entries.contains_key(for_key) || self.entries.len() < self.cfg.entries_max {
            return;
        }
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| e.renewing_since_ms.is_none())
            .min_by_key(|(_, e)| e.last_used)
            .or_else(|| self.entries.iter().min_by_key(|(_, e)| e.last_used))
            .map(|(k, _)| k.clone());
        if let Some(victim) = victim {
            self.entries.remove(&victim);
            self.stats.evictions += 1;
        }
        assert!(self.entries.len() < self.cfg.entries_max, "room was made");
    }

    /// Look up `key` at `now`; see the module docs for the three answers.
    pub fn get(&mut self, key: &K, now: Now) -> CacheAnswer {
        self.make_room(key);
        let stamp = self.tick();
        let cfg = self.cfg;
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            current: None,
            renewing_since_ms: None,
            last_used: stamp,
        });
        entry.last_used = stamp;
        let still_valid = entry.current.clone().filter(|t| now.wall_ms < t.exp_ms);
        let answer = if let Some(t) = &still_valid
            && t.exp_ms - now.wall_ms > cfg.renew_before_ms
        {
            self.stats.hits += 1;
            CacheAnswer::Fresh(t.clone())
        } else if let Some(since_ms) = entry.renewing_since_ms
            && now.mono_ms.saturating_sub(since_ms) < cfg.renew_timeout_ms
        {
            self.stats.pending += 1;
            CacheAnswer::Pending { still_valid }
        } else {
            if entry.renewing_since_ms.is_some() {
                self.stats.renew_timeouts += 1;
            }
            entry.renewing_since_ms = Some(now.mono_ms);
            self.stats.renewals_started += 1;
            CacheAnswer::Renew { still_valid }
        };
        self.debug_check_step(key);
        answer
    }

    /// A renewal produced `token`. Stored even if no renewal was recorded in flight (e.g. the
    /// entry was evicted meanwhile, or the renewal had timed out): a newer valid token is never
    /// worse. An older one (earlier `exp_ms`) than the cached token is ignored.
    pub fn handle_renewed(&mut self, key: &K, token: CachedToken, now: Now) {
        self.make_room(key);
        let stamp = self.tick();
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            current: None,
            renewing_since_ms: None,
            last_used: stamp,
        });
        entry.renewing_since_ms = None;
        if now.wall_ms < token.exp_ms
            && entry
                .current
                .as_ref()
                .is_none_or(|c| c.exp_ms <= token.exp_ms)
        {
            entry.current = Some(token);
        }
        self.debug_check_step(key);
    }

    /// The renewal failed: the next `get` may hand out a new one. The old token stays.
    pub fn handle_renew_failed(&mut self, key: &K) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.renewing_since_ms = None;
        }
        self.debug_check_step(key);
    }

    /// Keys held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is held.
    #[must_use]
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Whether a renewal of `key` is in flight.
    #[must_use]
    pub fn is_renewing(&self, key: &K) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.renewing_since_ms.is_some())
    }

    /// The counters.
    #[must_use]
    pub const fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The cache's invariants: it holds at most `entries_max` keys, each stamped by a distinct
    /// tick of its clock, and no more renewals are in flight or timed out than were started.
    ///
    /// # Errors
    /// The first that breaks, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.entries.len() > self.cfg.entries_max {
            return Err(format!(
                "token cache: {} keys, above the bound of {}",
                self.entries.len(),
                self.cfg.entries_max
            ));
        }
        let mut stamps = crate::check::AtMostOnce::new();
        for entry in self.entries.values() {
            self.check_entry(entry)?;
            if stamps.observe(entry.last_used, ()).is_some() {
                return Err(format!(
                    "token cache: two keys stamped {} (each use takes a tick of its own)",
                    entry.last_used
                ));
            }
        }
        let in_flight = self
            .entries
            .values()
            .filter(|e| e.renewing_since_ms.is_some())
            .count() as u64;
        let started = self.stats.renewals_started;
        if in_flight > started || self.stats.renew_timeouts > started {
            return Err(format!(
                "token cache: {in_flight} renewals in flight and {} timed out of {started} started",
                self.stats.renew_timeouts
            ));
        }
        Ok(())
    }

    /// One entry's part of [`Self::check_invariants`]: stamped by a tick the clock has given.
    fn check_entry(&self, entry: &Entry) -> Result<(), String> {
        if entry.last_used == 0 || entry.last_used > self.clock {
            return Err(format!(
                "token cache: a key stamped {}, outside the clock's ticks 1..={}",
                entry.last_used, self.clock
            ));
        }
        Ok(())
    }

    /// After a step that touched `key`: the bound, and the touched entry (debug builds).
    fn debug_check_step(&self, key: &K) {
        debug_assert!(self.entries.len() <= self.cfg.entries_max);
        if let Some(entry) = self.entries.get(key) {
            debug_assert_eq!(self.check_entry(entry), Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(entries_max: usize) -> CacheConfig {
        CacheConfig {
            renew_before_ms: 30_000,
            renew_timeout_ms: 5_000,
            entries_max,
        }
    }

    fn tok(name: &str, exp_ms: u64) -> CachedToken {
        CachedToken {
            token: name.to_owned(),
            exp_ms,
        }
    }

    #[test]
    fn debug_hides_cached_tokens() {
        let shown = format!("{:?}", CacheAnswer::Fresh(tok("secret-bearer-token", 5)));
        assert!(!shown.contains("secret-bearer-token"), "{shown}");
        assert!(shown.contains("exp_ms: 5"));
    }

    #[test]
    fn empty_key_renews_once_and_others_wait() {
        let mut c = TokenCache::new(cfg(4));
        let now = Now::both(1_000);
        assert_eq!(c.get(&"u1", now), CacheAnswer::Renew { still_valid: None });
        assert_eq!(
            c.get(&"u1", now),
            CacheAnswer::Pending { still_valid: None }
        );
        assert_eq!(
            c.get(&"u1", now.plus_ms(10)),
            CacheAnswer::Pending { still_valid: None }
        );
        c.handle_renewed(&"u1", tok("t1", 100_000), now.plus_ms(20));
        assert_eq!(
            c.get(&"u1", now.plus_ms(30)),
            CacheAnswer::Fresh(tok("t1", 100_000))
        );
        assert_eq!(c.stats().renewals_started, 1);
    }

    #[test]
    fn renews_thirty_seconds_before_expiry_and_serves_the_old_token_meanwhile() {
        let mut c = TokenCache::new(cfg(4));
        let _ = c.get(&"u", Now::both(0));
        c.handle_renewed(&"u", tok("old", 100_000), Now::both(0));
        // 30 001 ms left: fresh. 30 000 ms left: renew.
        assert_eq!(
            c.get(&"u", Now::both(69_999)),
            CacheAnswer::Fresh(tok("old", 100_000))
        );
        assert_eq!(
            c.get(&"u", Now::both(70_000)),
            CacheAnswer::Renew {
                still_valid: Some(tok("old", 100_000))
            }
        );
        // A second caller while it is in flight gets the still-valid old token, not a renewal.
        assert_eq!(
            c.get(&"u", Now::both(71_000)),
            CacheAnswer::Pending {
                still_valid: Some(tok("old", 100_000))
            }
        );
        assert!(c.is_renewing(&"u"));
        c.handle_renewed(&"u", tok("new", 200_000), Now::both(72_000));
        assert!(!c.is_renewing(&"u"));
        assert_eq!(
            c.get(&"u", Now::both(72_001)),
            CacheAnswer::Fresh(tok("new", 200_000))
        );
    }

    #[test]
    fn an_expired_old_token_is_never_handed_out() {
        let mut c = TokenCache::new(cfg(4));
        let _ = c.get(&"u", Now::both(0));
        c.handle_renewed(&"u", tok("old", 50_000), Now::both(0));
        assert_eq!(
            c.get(&"u", Now::both(50_000)),
            CacheAnswer::Renew { still_valid: None }
        );
        assert_eq!(
            c.get(&"u", Now::both(50_001)),
            CacheAnswer::Pending { still_valid: None }
        );
    }

    #[test]
    fn a_silent_renewal_times_out_and_a_failed_one_frees_the_slot() {
        let mut c = TokenCache::new(cfg(4));
        assert!(matches!(
            c.get(&"u", Now::both(0)),
            CacheAnswer::Renew { .. }
        ));
        assert!(matches!(
            c.get(&"u", Now::both(4_999)),
            CacheAnswer::Pending { .. }
        ));
        assert!(matches!(
            c.get(&"u", Now::both(5_000)),
            CacheAnswer::Renew { .. }
        ));
        assert_eq!(c.stats().renew_timeouts, 1);
        c.handle_renew_failed(&"u");
        assert!(matches!(
            c.get(&"u", Now::both(5_001)),
            CacheAnswer::Renew { .. }
        ));
        // The timeout is on the monotonic clock: a wall jump does not release it.
        let jumped = Now {
            wall_ms: 900_000,
            mono_ms: 5_002,
        };
        assert!(matches!(c.get(&"u", jumped), CacheAnswer::Pending { .. }));
    }

    #[test]
    fn late_or_stale_renewals_do_not_regress_the_token() {
        let mut c = TokenCache::new(cfg(4));
        let _ = c.get(&"u", Now::both(0));
        c.handle_renewed(&"u", tok("b", 200_000), Now::both(0));
        c.handle_renewed(&"u", tok("a", 100_000), Now::both(0));
        assert_eq!(
            c.get(&"u", Now::both(1)),
            CacheAnswer::Fresh(tok("b", 200_000))
        );
        // An already-expired token is not stored.
        let _ = c.get(&"v", Now::both(0));
        c.handle_renewed(&"v", tok("dead", 10), Now::both(10));
        assert!(matches!(
            c.get(&"v", Now::both(11)),
            CacheAnswer::Renew { still_valid: None }
        ));
    }

    #[test]
    fn size_is_bounded_and_the_least_recently_used_goes_first() {
        let mut c = TokenCache::new(cfg(3));
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            let _ = c.get(k, Now::both(i as u64));
            c.handle_renewed(k, tok(k, 1_000_000), Now::both(i as u64));
        }
        let _ = c.get(&"a", Now::both(10)); // a is now the most recent; b the least.
        let _ = c.get(&"d", Now::both(11));
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&"b"), "least recently used evicted");
        assert!(c.contains(&"a") && c.contains(&"c") && c.contains(&"d"));
        for i in 0..100u64 {
            let _ = c.get(&"x", Now::both(20 + i));
            let _ = c.get(&"y", Now::both(20 + i));
            assert!(c.len() <= 3);
        }
        assert!(c.stats().evictions >= 2);
    }

    #[test]
    fn eviction_prefers_entries_without_a_renewal_in_flight() {
        let mut c = TokenCache::new(cfg(2));
        let _ = c.get(&"inflight", Now::both(0)); // Renew handed out, oldest entry.
        let _ = c.get(&"idle", Now::both(1));
        c.handle_renewed(&"idle", tok("i", 1_000_000), Now::both(1));
        let _ = c.get(&"new", Now::both(2));
        assert!(c.contains(&"inflight") && c.contains(&"new") && !c.contains(&"idle"));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn invariants_hold_over_use_and_fire_on_a_broken_cache() {
        let mut c = TokenCache::new(cfg(2));
        for (i, k) in ["a", "b", "c", "a"].iter().enumerate() {
            let _ = c.get(k, Now::both(i as u64));
            assert_eq!(c.check_invariants(), Ok(()));
        }
        let mut over = c.clone();
        over.cfg.entries_max = 1;
        assert!(
            over.check_invariants()
                .unwrap_err()
                .contains("above the bound")
        );
        let mut same_stamp = c.clone();
        let stamp = same_stamp.entries.values().next().unwrap().last_used;
        for e in same_stamp.entries.values_mut() {
            e.last_used = stamp;
        }
        assert!(
            same_stamp
                .check_invariants()
                .unwrap_err()
                .contains("two keys stamped")
        );
        let mut future = c.clone();
        future.clock = 0;
        assert!(
            future
                .check_invariants()
                .unwrap_err()
                .contains("outside the clock")
        );
        let mut unstarted = c;
        unstarted.stats.renewals_started = 0;
        assert!(
            unstarted
                .check_invariants()
                .unwrap_err()
                .contains("in flight")
        );
    }
}
