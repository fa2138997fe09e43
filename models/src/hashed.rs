//! Actor states that hash in O(1): [`Hashed`] keeps a state's hash, computed once when the state
//! is made, and [`HashedActor`] wraps any actor so that its states are `Hashed`.
//!
//! stateright fingerprints every generated system state by hashing all of it: every actor's
//! state (a whole `sut` state machine or store, with its B-trees), the network, the timers. But
//! a step changes at most one actor's state; the others are shared (`Arc`) with the parent
//! state, and rehashing them is most of the cost of a step. With [`Hashed`], an actor state is
//! hashed once, when a step makes it, and every fingerprint after that feeds one `u64`.
//!
//! [`Stored`] does the same for stateright's non-volatile `Storage`, which is cloned with every
//! system state: behind an `Arc`, a clone is a reference count.
//!
//! Equality stays exact: two `Hashed` values are equal only when their states are equal (the
//! stored hash is compared first, as a fast path). The stored hash uses a fixed-key hasher, so
//! runs are reproducible.

use std::borrow::Cow;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use stateright::actor::{Actor, Id, Out};

/// Fixed keys: the stored hashes (and so the checker's fingerprints) are the same in every run.
const KEYS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

fn hash_of<T: Hash>(value: &T) -> u64 {
    ahash::RandomState::with_seeds(KEYS[0], KEYS[1], KEYS[2], KEYS[3]).hash_one(value)
}

/// A value and its hash, computed once by [`Hashed::new`]. `Hash` feeds only the stored hash.
#[derive(Clone)]
pub struct Hashed<T> {
    hash: u64,
    value: T,
}

impl<T: Hash> Hashed<T> {
    /// Wraps `value`, hashing it once.
    pub fn new(value: T) -> Self {
        Self {
            hash: hash_of(&value),
            value,
        }
    }
}

impl<T> Hashed<T> {
    /// The wrapped value.
    pub const fn get(&self) -> &T {
        &self.value
    }
}

impl<T> Deref for Hashed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Debug> Debug for Hashed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f) // transparent: counterexamples and the Explorer show the state
    }
}

impl<T> Hash for Hashed<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl<T: PartialEq> PartialEq for Hashed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.value == other.value
    }
}

impl<T: Eq> Eq for Hashed<T> {}

/// Non-volatile actor storage that clones and hashes in O(1): stateright clones every actor's
/// storage with each system state and hashes it into each fingerprint.
pub type Stored<T> = std::sync::Arc<Hashed<T>>;

/// Wraps `value` as [`Stored`] (hashing it once).
pub fn stored<T: Hash>(value: T) -> Stored<T> {
    std::sync::Arc::new(Hashed::new(value))
}

/// Wraps an actor so that its states are [`Hashed`]; messages, timers and storage are the
/// inner actor's.
#[derive(Clone, Debug)]
pub struct HashedActor<A>(pub A);

impl<A: Actor> Actor for HashedActor<A>
where
    A::State: Hash,
{
    type Msg = A::Msg;
    type Timer = A::Timer;
    type State = Hashed<A::State>;
    type Storage = A::Storage;
    type Random = A::Random;

    fn on_start(&self, id: Id, storage: &Option<A::Storage>, o: &mut Out<Self>) -> Self::State {
        let mut inner = Out::new();
        let state = self.0.on_start(id, storage, &mut inner);
        o.append(&mut inner);
        Hashed::new(state)
    }

    fn on_msg(
        &self,
        id: Id,
        state: &mut Cow<'_, Self::State>,
        src: Id,
        msg: A::Msg,
        o: &mut Out<Self>,
    ) {
        let mut inner_state = Cow::Borrowed(state.get());
        let mut inner = Out::new();
        self.0.on_msg(id, &mut inner_state, src, msg, &mut inner);
        o.append(&mut inner);
        if let Cow::Owned(next) = inner_state {
            *state = Cow::Owned(Hashed::new(next));
        }
    }

    fn on_timeout(
        &self,
        id: Id,
        state: &mut Cow<'_, Self::State>,
        timer: &A::Timer,
        o: &mut Out<Self>,
    ) {
        let mut inner_state = Cow::Borrowed(state.get());
        let mut inner = Out::new();
        self.0.on_timeout(id, &mut inner_state, timer, &mut inner);
        o.append(&mut inner);
        if let Cow::Owned(next) = inner_state {
            *state = Cow::Owned(Hashed::new(next));
        }
    }

    fn on_random(
        &self,
        id: Id,
        state: &mut Cow<'_, Self::State>,
        random: &A::Random,
        o: &mut Out<Self>,
    ) {
        let mut inner_state = Cow::Borrowed(state.get());
        let mut inner = Out::new();
        self.0.on_random(id, &mut inner_state, random, &mut inner);
        o.append(&mut inner);
        if let Cow::Owned(next) = inner_state {
            *state = Cow::Owned(Hashed::new(next));
        }
    }

    fn name(&self) -> String {
        self.0.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_hash_alike_and_unequal_ones_compare_unequal() {
        let a = Hashed::new(vec![1_u64, 2, 3]);
        let b = Hashed::new(vec![1_u64, 2, 3]);
        let c = Hashed::new(vec![1_u64, 2, 4]);
        assert_eq!(a, b);
        assert_eq!(hash_of(&a), hash_of(&b));
        assert_ne!(a, c);
        assert_ne!(hash_of(&a), hash_of(&c));
        assert_eq!(*a, vec![1, 2, 3], "derefs to the value");
    }

    #[test]
    fn equality_is_exact_even_on_a_forged_hash_tie() {
        // Two different values with the same stored hash must still be unequal.
        let a = Hashed::new(1_u64);
        let forged = Hashed {
            hash: a.hash,
            value: 2_u64,
        };
        assert_ne!(a, forged);
    }
}
