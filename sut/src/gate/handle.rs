//! What a client sees of a draw: an opaque handle, never its xid.
//!
//! Xids come from a segment allocator: consecutive, so a client that sees its own can walk to
//! everybody else's (OWASP API1, broken object-level authorisation) and read the business's
//! volume off them. A [`DrawHandle`] is the xid through a keyed permutation of the 64-bit
//! integers: a four-round Feistel network whose round function is SipHash-2-4 (a keyed
//! pseudorandom function) under the server's 128-bit [`HandleKey`] (Luby and Rackoff: four
//! rounds of a pseudorandom function make a strong pseudorandom permutation). The server derives
//! the key from a secret of its own. Without the key, the handle of one draw says nothing about
//! any other's; with it, the server turns a handle back into its xid, with no table to keep.
//! The status of a draw is still shown only to its owner or the operator: the handle hides, the
//! ownership check decides.

use std::hash::Hasher;

use siphasher::sip::SipHasher24;

use crate::lottery::Xid;

/// Feistel rounds (four: a strong pseudorandom permutation from a pseudorandom function).
const ROUNDS: u8 = 4;

/// The key of the permutation.
#[derive(Clone)]
pub struct HandleKey {
    key: [u8; 16],
}

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

/// A draw's name as clients see it: 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrawHandle(pub u64);

impl std::fmt::Display for DrawHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl DrawHandle {
    /// Parses exactly 16 hex digits.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(text, 16).ok().map(Self))
            .flatten()
    }
}

impl HandleKey {
    /// The key of the permutation: 128 secret bits (the server's, derived from a secret).
    #[must_use]
    pub const fn new(key: [u8; 16]) -> Self {
        Self { key }
    }

    /// The round function: 32 pseudorandom bits of (round, half).
    fn round(&self, round: u8, half: u32) -> u32 {
        let mut sip = SipHasher24::new_with_key(&self.key);
        sip.write_u8(round);
        sip.write_u32(half);
        let out = sip.finish();
        (out >> 32) as u32 ^ out as u32
    }

    /// The handle of `xid`.
    #[must_use]
    pub fn seal(&self, xid: Xid) -> DrawHandle {
        let (mut left, mut right) = split(xid.0);
        for round in 0..ROUNDS {
            (left, right) = (right, left ^ self.round(round, right));
        }
        DrawHandle(join(left, right))
    }

    /// The xid of `handle` (the inverse of [`HandleKey::seal`]; every handle opens to some xid,
    /// and the server then finds that xid's draw, or none).
    #[must_use]
    pub fn open(&self, handle: DrawHandle) -> Xid {
        let (mut left, mut right) = split(handle.0);
        for round in (0..ROUNDS).rev() {
            (left, right) = (right ^ self.round(round, left), left);
        }
        Xid(join(left, right))
    }
}

const fn split(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

const fn join(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opens_to_its_xid_and_hides_its_neighbours() {
        let key = HandleKey::new(*b"0123456789abcdef");
        let mut handles = std::collections::BTreeSet::new();
        for xid in (0..2_000).chain([u64::MAX - 1, u64::MAX]) {
            let h = key.seal(Xid(xid));
            assert_eq!(key.open(h), Xid(xid));
            assert_eq!(DrawHandle::parse(&h.to_string()), Some(h));
            assert!(
                handles.insert(h),
                "a permutation: no two xids share a handle"
            );
        }
        // Consecutive xids do not give close handles: on average half the bits differ.
        let flips: u32 = (1..1_000u64)
            .map(|x| (key.seal(Xid(x)).0 ^ key.seal(Xid(x + 1)).0).count_ones())
            .sum();
        let mean = f64::from(flips) / 999.0;
        assert!((24.0..40.0).contains(&mean), "mean bits flipped {mean}");
        // Another key names the same draw differently.
        let other = HandleKey::new(*b"another 16 bytes");
        assert_ne!(other.seal(Xid(7)), key.seal(Xid(7)));
        assert_ne!(key.seal(Xid(7)), DrawHandle(7));
    }

    #[test]
    fn only_sixteen_hex_digits_parse() {
        assert_eq!(DrawHandle::parse("00000000000000ff"), Some(DrawHandle(255)));
        for bad in [
            "ff",
            "00000000000000fg",
            "000000000000000ff",
            "+0000000000000ff",
            "",
        ] {
            assert_eq!(DrawHandle::parse(bad), None, "{bad}");
        }
    }
}
