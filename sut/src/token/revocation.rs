//! The revocation list: a Bloom filter in front of the exact set, the ID, token and lottery
//! design §3.1 (docs/sources.md).
//!
//! The design's flow: "布隆过滤器 contains jti?" — false: accept without touching the exact list;
//! true: ask the exact list (the filter can say yes wrongly, never no wrongly). Here:
//!
//! - The filter is the `bloomfilter` crate's, built with `new_for_fp_rate_with_seed` from
//!   [`RevocationConfig::seed`] and without the crate's `random` feature: the same config gives
//!   the same bits on every node and every run (simulator replay, model hashing).
//! - [`RevocationFilter::capacity`] items keep the false-positive rate at or under the
//!   configured one. A Bloom filter cannot forget, so after the store purges expired
//!   revocations, and whenever more than `capacity` jtis were added since the last rebuild, the
//!   filter is rebuilt from the store's exact set ([`Revocations::rebuild`]).
//! - **Every node's filter must see every revocation its store holds.** A filter that misses one
//!   (e.g. one filter per server node over a shared store, fed only by that node's revokes)
//!   turns into a false negative and lets a revoked token through; `tokens.revoked_rejected`
//!   catches that. Keep the filter next to the store, as the design keeps it in Redis beside the
//!   exact list, or rebuild it before trusting it.
//! - A store failure during the exact lookup fails closed ([`Rejection::StoreUnavailable`]).

use super::jwt::{Claims, Rejection};
use super::rows::{RevokeOutcome, TokenStoreError};
use super::store::TokenStore;
use crate::edge::{Edges, Observed};
use bloomfilter::Bloom;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::hash::{Hash, Hasher};

/// One in a million, the unit of [`RevocationConfig::fp_rate_per_million`].
pub const PER_MILLION: u32 = 1_000_000;

/// Bloom filter settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RevocationConfig {
    /// Items the filter is sized for; keep it equal to the store's `revocations_max`.
    pub capacity: u64,
    /// Target false-positive rate at `capacity` items, per million (the design: 0.1% = 1000).
    pub fp_rate_per_million: u32,
    /// Hash seed: deterministic, never OS randomness.
    pub seed: [u8; 32],
}

impl Default for RevocationConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            fp_rate_per_million: 1_000,
            seed: *b"sut::token::revocation bloom 001",
        }
    }
}

/// A bad [`RevocationConfig`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RevocationConfigError {
    /// `capacity` is zero or does not fit in memory.
    #[error("bloom capacity {0} must be in 1..=2^32")]
    Capacity(u64),
    /// The seed's two 16-byte halves are equal. They key the filter's two SipHash functions;
    /// equal keys make both hashes equal, every probe position `h1 + i*h2` a multiple of one
    /// hash, and the false-positive rate collapses (measured: 2.4% at a configured 0.1%).
    #[error("bloom seed halves must differ")]
    WeakSeed,
    /// The rate is not strictly between 0 and 1.
    #[error("bloom false-positive rate {0} per million must be in 1..1000000")]
    FpRate(u32),
}

/// The deterministic Bloom filter. Equality and hashing are over its bytes (header with seed
/// and hash count, then the bitmap).
pub struct RevocationFilter {
    cfg: RevocationConfig,
    bloom: Bloom<str>,
    added: u64,
}

impl RevocationFilter {
    /// An empty filter.
    pub fn new(cfg: RevocationConfig) -> Result<Self, RevocationConfigError> {
        if cfg.capacity == 0 || cfg.capacity > 1 << 32 {
            return Err(RevocationConfigError::Capacity(cfg.capacity));
        }
        if cfg.fp_rate_per_million == 0 || cfg.fp_rate_per_million >= PER_MILLION {
            return Err(RevocationConfigError::FpRate(cfg.fp_rate_per_million));
        }
        if cfg.seed[..16] == cfg.seed[16..] {
            return Err(RevocationConfigError::WeakSeed);
        }
        let items = usize::try_from(cfg.capacity)
            .map_err(|_| RevocationConfigError::Capacity(cfg.capacity))?;
        let rate = f64::from(cfg.fp_rate_per_million) / f64::from(PER_MILLION);
        let bloom = Bloom::new_for_fp_rate_with_seed(items, rate, &cfg.seed)
            .map_err(|_| RevocationConfigError::Capacity(cfg.capacity))?;
        Ok(Self {
            cfg,
            bloom,
            added: 0,
        })
    }

    /// Add a jti.
    pub fn insert(&mut self, jti: &str) {
        self.bloom.set(jti);
        self.added = self.added.saturating_add(1);
    }

    /// False: certainly never inserted. True: maybe.
    #[must_use]
    pub fn might_contain(&self, jti: &str) -> bool {
        self.bloom.check(jti)
    }

    /// Empty the filter and insert `jtis`.
    pub fn rebuild<'a>(&mut self, jtis: impl IntoIterator<Item = &'a str>) {
        self.bloom.clear();
        self.added = 0;
        for jti in jtis {
            self.insert(jti);
        }
    }

    /// Insertions since the last rebuild (repeats counted).
    #[must_use]
    pub const fn added(&self) -> u64 {
        self.added
    }

    /// Items the filter is sized for.
    #[must_use]
    pub const fn capacity(&self) -> u64 {
        self.cfg.capacity
    }

    /// Size of the bitmap, in bits.
    #[must_use]
    pub fn bits(&self) -> u64 {
        self.bloom.len()
    }

    /// Number of hash functions.
    #[must_use]
    pub fn hash_count(&self) -> u32 {
        self.bloom.number_of_hash_functions()
    }
}

impl fmt::Debug for RevocationFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RevocationFilter")
            .field("capacity", &self.cfg.capacity)
            .field("fp_rate_per_million", &self.cfg.fp_rate_per_million)
            .field("bits", &self.bits())
            .field("hash_count", &self.hash_count())
            .field("added", &self.added)
            .finish_non_exhaustive()
    }
}

impl Clone for RevocationFilter {
    fn clone(&self) -> Self {
        // `Bloom<str>` is not `Clone` (its derive wants `str: Clone`); its bytes carry the seed,
        // hash count and bitmap, so a round trip through them is an exact copy.
        let bloom = Bloom::from_slice(self.bloom.as_slice()).expect("a filter's own bytes parse");
        Self {
            cfg: self.cfg,
            bloom,
            added: self.added,
        }
    }
}

impl PartialEq for RevocationFilter {
    fn eq(&self, other: &Self) -> bool {
        self.cfg == other.cfg
            && self.added == other.added
            && self.bloom.as_slice() == other.bloom.as_slice()
    }
}

impl Eq for RevocationFilter {}

impl Hash for RevocationFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.cfg.hash(state);
        self.added.hash(state);
        self.bloom.as_slice().hash(state);
    }
}

/// Counters that show what the filter saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RevocationStats {
    /// Checks the filter answered alone ("certainly not revoked").
    pub bloom_negatives: u64,
    /// Checks that went on to the exact set.
    pub exact_lookups: u64,
    /// Exact lookups that found the jti (revoked).
    pub exact_hits: u64,
    /// Filter rebuilds from the store.
    pub rebuilds: u64,
}

/// The revocation list: the filter plus counters, used with a [`TokenStore`] passed to each
/// call (the store holds the exact set).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Revocations {
    filter: RevocationFilter,
    leeway_ms: u64,
    /// The store's revocation horizon ([`super::Forgotten::revocations_until_ms`]) as last read:
    /// at start-up, after a purge, after each revocation (whose room-making may purge). Only
    /// this list's own calls purge the revocation table, so it is current.
    forgotten_until_ms: u64,
    stats: RevocationStats,
    /// Arrivals at its edge states since its driver last took them (a ghost: not its state).
    edges: Edges,
}

impl Observed for Revocations {
    fn take_edges(&mut self, into: &mut Edges) {
        into.absorb(&mut self.edges);
    }
}

impl Revocations {
    /// An empty list whose revocations are kept until `exp + leeway_ms` (use the verifier's
    /// [`JwtConfig::leeway_ms`](super::JwtConfig)). Call [`rebuild`](Self::rebuild) before use
    /// over a store that already holds revocations.
    pub fn new(cfg: RevocationConfig, leeway_ms: u64) -> Result<Self, RevocationConfigError> {
        Ok(Self {
            filter: RevocationFilter::new(cfg)?,
            leeway_ms,
            forgotten_until_ms: 0,
            stats: RevocationStats::default(),
            edges: Edges::default(),
        })
    }

    /// Whether the filter may hold `jti` (false: it certainly does not).
    #[must_use]
    pub fn might_contain(&self, jti: &str) -> bool {
        self.filter.might_contain(jti)
    }

    /// Reload the filter from the store's exact set, and the store's horizon (start-up, after a
    /// purge).
    pub fn rebuild<S: TokenStore + ?Sized>(&mut self, store: &S) -> Result<(), TokenStoreError> {
        self.forgotten_until_ms = store.forgotten()?.revocations_until_ms;
        let jtis = store.revoked_jtis()?;
        self.edges
            .reach_if(!jtis.is_empty(), &super::FILTER_REBUILT_OVER_REVOCATIONS);
        self.filter.rebuild(jtis.iter().map(String::as_str));
        self.stats.rebuilds += 1;
        Ok(())
    }

    /// Revoke the token with these claims at `now_ms`. The filter learns the jti before the
    /// store does, so there is no moment where the store has it and the filter does not.
    pub fn revoke<S: TokenStore + ?Sized>(
        &mut self,
        store: &mut S,
        claims: &Claims,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        self.revoke_jti(store, &claims.jti, claims.exp_ms(), now_ms)
    }

    /// Revoke `jti` of a token that expires at `exp_ms`.
    pub fn revoke_jti<S: TokenStore + ?Sized>(
        &mut self,
        store: &mut S,
        jti: &str,
        exp_ms: u64,
        now_ms: u64,
    ) -> Result<RevokeOutcome, TokenStoreError> {
        if self.filter.added() >= self.filter.capacity() {
            // Over design capacity since the last rebuild: reload from the exact set, which the
            // store keeps within `revocations_max` (purging expired revocations when full).
            // Costs O(set size), and only once per `capacity` revocations unless the set is full.
            self.rebuild(store)?;
        }
        self.filter.insert(jti);
        let outcome = store.revoke(jti, exp_ms.saturating_add(self.leeway_ms), now_ms);
        // Making room may have purged, even when the revocation was then refused as full.
        self.forgotten_until_ms = store.forgotten()?.revocations_until_ms;
        debug_assert!(
            self.filter.might_contain(jti),
            "the filter knows what it revoked"
        );
        outcome
    }

    /// The list's invariants over `store` (the exact set it fronts): every revocation the store
    /// holds is in the filter (a filter miss would let a revoked token through without a store
    /// lookup), the horizon is the store's, and no more lookups hit than were made.
    ///
    /// # Errors
    /// The first that breaks, or a store failure, in words.
    pub fn check_invariants<S: TokenStore + ?Sized>(&self, store: &S) -> Result<(), String> {
        self.check_counters()?;
        let jtis = store.revoked_jtis().map_err(|e| e.to_string())?;
        if let Some(jti) = jtis.iter().find(|jti| !self.filter.might_contain(jti)) {
            return Err(format!(
                "revoked jti {jti} is missing from the Bloom filter"
            ));
        }
        let horizon_ms = store
            .forgotten()
            .map_err(|e| e.to_string())?
            .revocations_until_ms;
        if horizon_ms != self.forgotten_until_ms {
            return Err(format!(
                "revocations: horizon read as {} ms, the store's is {horizon_ms} ms",
                self.forgotten_until_ms
            ));
        }
        Ok(())
    }

    fn check_counters(&self) -> Result<(), String> {
        let s = self.stats;
        if s.exact_hits > s.exact_lookups {
            return Err(format!(
                "revocations: {} exact hits out of {} lookups",
                s.exact_hits, s.exact_lookups
            ));
        }
        Ok(())
    }

    /// Whether `jti` is revoked. A filter negative answers without a store call.
    pub fn is_revoked<S: TokenStore + ?Sized>(
        &mut self,
        store: &S,
        jti: &str,
    ) -> Result<bool, TokenStoreError> {
        if !self.filter.might_contain(jti) {
            self.stats.bloom_negatives += 1;
            return Ok(false);
        }
        self.stats.exact_lookups += 1;
        let hit = store.is_revoked(jti)?;
        if hit {
            self.stats.exact_hits += 1;
        }
        debug_assert_eq!(self.check_counters(), Ok(()));
        Ok(hit)
    }

    /// `Ok(claims)` unless revoked; a store failure is a rejection (fail closed). A token valid
    /// only until the store's horizon is refused as [`Rejection::Forgotten`] before any lookup:
    /// its revocation may have been purged at a later reading than this clock's.
    pub fn check<S: TokenStore + ?Sized>(
        &mut self,
        store: &S,
        claims: Claims,
    ) -> Result<Claims, Rejection> {
        let keep_until_ms = claims.exp_ms().saturating_add(self.leeway_ms);
        if super::rules::forgotten(keep_until_ms, self.forgotten_until_ms) {
            self.edges.reach(&super::FORGOTTEN_REFUSED);
            return Err(Rejection::Forgotten {
                keep_until_ms,
                forgotten_until_ms: self.forgotten_until_ms,
            });
        }
        match self.is_revoked(store, &claims.jti) {
            Ok(false) => Ok(claims),
            Ok(true) => {
                self.edges.reach(&super::REVOKED_REFUSED);
                Err(Rejection::Revoked)
            }
            Err(e) => Err(Rejection::StoreUnavailable(e.to_string())),
        }
    }

    /// Purge the store's expired rows and rebuild the filter from what is left.
    pub fn purge_expired<S: TokenStore + ?Sized>(
        &mut self,
        store: &mut S,
        now_ms: u64,
    ) -> Result<super::PurgeCounts, TokenStoreError> {
        let counts = store.purge_expired(now_ms)?;
        self.rebuild(store)?;
        Ok(counts)
    }

    /// The counters.
    #[must_use]
    pub const fn stats(&self) -> RevocationStats {
        self.stats
    }

    /// The filter.
    #[must_use]
    pub const fn filter(&self) -> &RevocationFilter {
        &self.filter
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::store::{MemoryTokenStore, TokenStoreLimits};

    fn cfg(capacity: u64, fp_rate_per_million: u32) -> RevocationConfig {
        RevocationConfig {
            capacity,
            fp_rate_per_million,
            seed: *b"test seed, two different halves!",
        }
    }

    fn measured_fp_rate(capacity: u64, fp_rate_per_million: u32, probes: u64) -> f64 {
        let mut f = RevocationFilter::new(cfg(capacity, fp_rate_per_million)).unwrap();
        for i in 0..capacity {
            f.insert(&format!("revoked-{i:08}"));
        }
        for i in 0..capacity {
            assert!(
                f.might_contain(&format!("revoked-{i:08}")),
                "no false negatives"
            );
        }
        let fps = (0..probes)
            .filter(|i| f.might_contain(&format!("probe-{i:08}")))
            .count();
        fps as f64 / probes as f64
    }

    #[test]
    fn false_positive_rate_meets_the_configured_rate() {
        // The setting of the ID, token and lottery design §3.1 (0.1%), and a looser 1%. N
        // inserted = capacity, M probes never inserted; the measured rate must be within 2x of
        // the configured one (and not suspiciously far below, which would mean the probes never
        // reach the filter).
        for (n, per_million, m) in [(20_000u64, 1_000u32, 200_000u64), (20_000, 10_000, 100_000)] {
            let target = f64::from(per_million) / 1e6;
            let measured = measured_fp_rate(n, per_million, m);
            eprintln!("bloom n={n} target={target} measured={measured}");
            assert!(
                measured <= 2.0 * target,
                "measured {measured} > 2 x {target}"
            );
            assert!(
                measured >= target / 4.0,
                "measured {measured} implausibly below {target}"
            );
        }
    }

    #[test]
    fn seed_settings_size_the_filter_as_the_seed_says() {
        // ID, token and lottery design §3.1: capacity 100 000 at 0.1% "仅需约180KB".
        let f = RevocationFilter::new(RevocationConfig::default()).unwrap();
        let bytes = f.bits() / 8;
        assert!((175_000..=185_000).contains(&bytes), "{bytes} bytes");
        assert_eq!(f.hash_count(), 10);
    }

    #[test]
    fn rebuild_keeps_the_filter_within_capacity() {
        let mut store = MemoryTokenStore::new(TokenStoreLimits {
            revocations_max: 4,
            once_tokens_max: 10,
        });
        let mut rev = Revocations::new(cfg(4, 1000), 0).unwrap();
        for i in 0..40u64 {
            // Each revocation lives 10 ms; the store purges the expired ones when full.
            let _ = rev
                .revoke_jti(&mut store, &format!("j{i}"), i * 10 + 10, i * 10)
                .unwrap();
            assert!(
                rev.filter().added() <= 5,
                "added {} at {i}",
                rev.filter().added()
            );
        }
        assert!(rev.stats().rebuilds >= 9);
        assert!(rev.is_revoked(&store, "j39").unwrap());
        assert_eq!(rev.check_invariants(&store), Ok(()));
    }

    #[test]
    fn invariants_fire_on_a_revocation_the_filter_missed_or_a_stale_horizon() {
        let limits = TokenStoreLimits {
            revocations_max: 4,
            once_tokens_max: 10,
        };
        let mut store = MemoryTokenStore::new(limits);
        let mut rev = Revocations::new(cfg(100, 1000), 0).unwrap();
        let _ = rev.revoke_jti(&mut store, "seen", 1_000, 0).unwrap();
        assert_eq!(rev.check_invariants(&store), Ok(()));
        // Behind the list's back: the store holds a revocation the filter never saw.
        let _ = store.revoke("unseen", 1_000, 0).unwrap();
        assert!(rev.check_invariants(&store).unwrap_err().contains("unseen"));
        rev.rebuild(&store).unwrap();
        assert_eq!(rev.check_invariants(&store), Ok(()));
        // A purge behind its back moves the store's horizon on.
        let _ = store.purge_expired(5_000).unwrap();
        assert!(
            rev.check_invariants(&store)
                .unwrap_err()
                .contains("horizon")
        );
        let mut counted = rev.clone();
        counted.stats.exact_hits = counted.stats.exact_lookups + 1;
        assert!(counted.check_counters().is_err());
    }

    #[test]
    fn seeded_filters_are_deterministic_and_seed_matters() {
        let mut a = RevocationFilter::new(cfg(1000, 1000)).unwrap();
        let mut b = RevocationFilter::new(cfg(1000, 1000)).unwrap();
        let mut c = RevocationFilter::new(RevocationConfig {
            seed: *b"another seed with distinct halve",
            ..cfg(1000, 1000)
        })
        .unwrap();
        for jti in ["a", "b", "c"] {
            a.insert(jti);
            b.insert(jti);
            c.insert(jti);
        }
        assert_eq!(a, b);
        assert_ne!(a.bloom.as_slice(), c.bloom.as_slice());
    }

    #[test]
    fn bad_configs_are_refused() {
        assert_eq!(
            RevocationFilter::new(cfg(0, 1000)).unwrap_err(),
            RevocationConfigError::Capacity(0)
        );
        assert_eq!(
            RevocationFilter::new(cfg(10, 0)).unwrap_err(),
            RevocationConfigError::FpRate(0)
        );
        assert_eq!(
            RevocationFilter::new(cfg(10, PER_MILLION)).unwrap_err(),
            RevocationConfigError::FpRate(PER_MILLION)
        );
        let weak = RevocationConfig {
            seed: [7; 32],
            ..cfg(10, 1000)
        };
        assert_eq!(
            RevocationFilter::new(weak).unwrap_err(),
            RevocationConfigError::WeakSeed
        );
        assert!(
            RevocationFilter::new(RevocationConfig::default()).is_ok(),
            "the default seed is not weak"
        );
    }

    #[test]
    fn bloom_negative_skips_the_exact_lookup() {
        let mut store = MemoryTokenStore::new(TokenStoreLimits {
            revocations_max: 100,
            once_tokens_max: 10,
        });
        let mut rev = Revocations::new(cfg(100, 1000), 0).unwrap();
        for i in 0..10 {
            assert_eq!(
                rev.revoke_jti(&mut store, &format!("r{i}"), 10_000, 0)
                    .unwrap(),
                RevokeOutcome::Revoked
            );
        }
        for i in 0..10 {
            assert!(rev.is_revoked(&store, &format!("r{i}")).unwrap());
        }
        assert_eq!(rev.stats().exact_lookups, 10);
        assert_eq!(rev.stats().exact_hits, 10);
        let probes = 1000;
        let mut false_positive = 0;
        for i in 0..probes {
            assert!(!rev.is_revoked(&store, &format!("never-{i}")).unwrap());
        }
        let s = rev.stats();
        false_positive += s.exact_lookups - 10;
        assert_eq!(
            s.bloom_negatives + false_positive,
            probes,
            "every probe is a Bloom negative or an exact lookup"
        );
        assert!(
            s.bloom_negatives >= probes - 20,
            "Bloom negatives skipped the store: {s:?}"
        );
        assert_eq!(s.exact_hits, 10, "no probe was revoked");
    }

    #[test]
    fn purge_forgets_expired_revocations_and_rebuilds_the_filter() {
        let mut store = MemoryTokenStore::new(TokenStoreLimits {
            revocations_max: 100,
            once_tokens_max: 10,
        });
        let mut rev = Revocations::new(cfg(100, 1000), 500).unwrap();
        assert_eq!(
            rev.revoke_jti(&mut store, "old", 1_000, 0).unwrap(),
            RevokeOutcome::Revoked
        );
        assert_eq!(
            rev.revoke_jti(&mut store, "new", 9_000, 0).unwrap(),
            RevokeOutcome::Revoked
        );
        // Kept until exp + leeway: still there at exp.
        rev.purge_expired(&mut store, 1_000).unwrap();
        assert!(rev.is_revoked(&store, "old").unwrap());
        let counts = rev.purge_expired(&mut store, 1_500).unwrap();
        assert_eq!(counts.revocations, 1);
        assert!(
            !rev.filter().might_contain("old"),
            "rebuilt filter forgot the purged jti"
        );
        assert!(rev.is_revoked(&store, "new").unwrap());
        // A revocation no longer needed is not stored.
        assert_eq!(
            rev.revoke_jti(&mut store, "late", 1_000, 1_500).unwrap(),
            RevokeOutcome::NotNeeded
        );
    }

    #[test]
    fn a_revoked_jti_refused_and_a_rebuild_over_revocations_are_edge_states() {
        use crate::token::{FILTER_REBUILT_OVER_REVOCATIONS, REVOKED_REFUSED};
        let mut store = MemoryTokenStore::new(TokenStoreLimits {
            revocations_max: 100,
            once_tokens_max: 10,
        });
        let mut rev = Revocations::new(cfg(100, 1000), 0).unwrap();
        let claims = |jti: &str| Claims {
            jti: jti.into(),
            sub: "1".into(),
            iss: "i".into(),
            aud: "a".into(),
            exp: 10,
            nbf: 0,
            iat: 0,
        };
        let _ = rev.edges();
        // A rebuild over an empty store (a fresh start) is not the edge state.
        rev.rebuild(&store).unwrap();
        assert!(rev.check(&store, claims("kept")).is_ok());
        assert!(rev.edges().is_empty());
        assert_eq!(
            rev.revoke(&mut store, &claims("gone"), 0).unwrap(),
            RevokeOutcome::Revoked
        );
        assert_eq!(rev.check(&store, claims("gone")), Err(Rejection::Revoked));
        assert_eq!(rev.edges().get(REVOKED_REFUSED.name), Some(&1));
        // Start-up over a store that holds it: the new filter must relearn it.
        let mut restarted = Revocations::new(cfg(100, 1000), 0).unwrap();
        restarted.rebuild(&store).unwrap();
        assert_eq!(
            restarted.check(&store, claims("gone")),
            Err(Rejection::Revoked)
        );
        // And after a purge that keeps it.
        restarted.purge_expired(&mut store, 1).unwrap();
        let edges = restarted.edges();
        assert_eq!(edges.get(FILTER_REBUILT_OVER_REVOCATIONS.name), Some(&2));
        assert_eq!(edges.get(REVOKED_REFUSED.name), Some(&1));
    }

    #[test]
    fn full_revocation_set_refuses_instead_of_forgetting() {
        let limits = TokenStoreLimits {
            revocations_max: 3,
            once_tokens_max: 10,
        };
        let mut store = MemoryTokenStore::new(limits);
        let mut rev = Revocations::new(cfg(3, 1000), 0).unwrap();
        for jti in ["a", "b", "c"] {
            assert_eq!(
                rev.revoke_jti(&mut store, jti, 5_000, 0).unwrap(),
                RevokeOutcome::Revoked
            );
        }
        assert!(matches!(
            rev.revoke_jti(&mut store, "d", 5_000, 0),
            Err(TokenStoreError::Full { max: 3, .. })
        ));
        for jti in ["a", "b", "c"] {
            assert!(rev.is_revoked(&store, jti).unwrap(), "{jti} still revoked");
        }
        // Once they expire there is room again.
        assert_eq!(
            rev.revoke_jti(&mut store, "d", 9_000, 5_000).unwrap(),
            RevokeOutcome::Revoked
        );
        assert_eq!(store.revoked_jtis().unwrap(), vec!["d".to_owned()]);
    }

    #[test]
    fn failing_store_fails_closed() {
        struct Broken;
        impl TokenStore for Broken {
            fn revoke(
                &mut self,
                _: &str,
                _: u64,
                _: u64,
            ) -> Result<RevokeOutcome, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn is_revoked(&self, _: &str) -> Result<bool, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn issue_once(
                &mut self,
                _: &crate::token::rows::OnceGrant,
                _: u64,
            ) -> Result<crate::token::OnceIssue, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn consume_once(
                &mut self,
                _: crate::token::OnceToken,
                _: crate::token::UserId,
                _: u64,
            ) -> Result<Result<crate::token::OnceKey, crate::token::OnceRejection>, TokenStoreError>
            {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn check_once(
                &mut self,
                _: crate::token::OnceToken,
                _: crate::token::UserId,
                _: u64,
            ) -> Result<Result<crate::token::OnceKey, crate::token::OnceRejection>, TokenStoreError>
            {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn mark_once_consumed(
                &mut self,
                _: crate::token::OnceToken,
                _: u64,
            ) -> Result<bool, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn purge_expired(
                &mut self,
                _: u64,
            ) -> Result<crate::token::PurgeCounts, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
            fn forgotten(&self) -> Result<crate::token::Forgotten, TokenStoreError> {
                Err(TokenStoreError::Backend("down".to_owned()))
            }
        }
        let mut rev = Revocations::new(cfg(10, 1000), 0).unwrap();
        rev.filter.insert("x");
        let claims = Claims {
            jti: "x".into(),
            sub: "1".into(),
            iss: "i".into(),
            aud: "a".into(),
            exp: 1,
            nbf: 0,
            iat: 0,
        };
        assert!(matches!(
            rev.check(&Broken, claims),
            Err(Rejection::StoreUnavailable(_))
        ));
    }
}
