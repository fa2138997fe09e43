//! Hostile tokens against `sut::token::jwt::verify` (issue #10): `alg: none`, algorithm
//! switches between HMAC and asymmetric algorithms, another key, truncated or padded base64,
//! huge headers, and clock edges (`exp == now`, `nbf` ahead of a skewed verifier). Every
//! rejection must be the specific [`Rejection`], never a panic, never an acceptance.
//!
//! Module `service` drives the whole token service (JWTs, revocations, one-time tokens, purges,
//! restarts) against hostile clients and clocks, checking its promises after every step.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use proptest::prelude::*;
use sut::clock::Now;
use sut::token::UserId;
use sut::token::jwt::{
    Claims, JwtAlgorithm, JwtConfig, MalformedPart, Rejection, SigningKey, issue, verify,
};

const T0_MS: u64 = 1_717_036_800_000;
const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

fn key() -> SigningKey {
    SigningKey::new("k1", *SECRET).unwrap()
}

fn cfg(leeway_ms: u64) -> JwtConfig {
    JwtConfig {
        leeway_ms,
        ttl_s: 60,
        ..JwtConfig::default()
    }
}

fn good() -> String {
    issue(&key(), &cfg(0), UserId(7), 0xbeef, Now::both(T0_MS))
        .unwrap()
        .token
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn claims(nbf_s: u64, exp_s: u64) -> Claims {
    Claims {
        jti: "00000000000000000000000000000001".to_owned(),
        sub: "7".to_owned(),
        iss: "sut".to_owned(),
        aud: "sut".to_owned(),
        exp: exp_s,
        nbf: nbf_s,
        iat: nbf_s,
    }
}

/// Signs `header_json.payload` with HMAC-SHA-256 over `secret`, whatever the header says.
fn hs256(header_json: &str, claims: &Claims, secret: &[u8]) -> String {
    let signing_input = format!(
        "{}.{}",
        b64(header_json),
        b64(serde_json::to_vec(claims).unwrap())
    );
    let key = jsonwebtoken::EncodingKey::from_secret(secret).unwrap();
    let sig = jsonwebtoken::crypto::sign(
        signing_input.as_bytes(),
        &key,
        jsonwebtoken::Algorithm::HS256,
    )
    .unwrap();
    format!("{signing_input}.{sig}")
}

fn check(token: &str, now_ms: u64, leeway_ms: u64) -> Result<Claims, Rejection> {
    verify(&key(), &cfg(leeway_ms), token, Now::both(now_ms))
}

#[test]
fn the_honest_token_verifies() {
    assert!(check(&good(), T0_MS, 0).is_ok());
}

#[test]
fn alg_none_is_refused_with_or_without_a_signature() {
    let c = claims(T0_MS / 1000, T0_MS / 1000 + 60);
    let payload = b64(serde_json::to_vec(&c).unwrap());
    for alg in ["none", "None", "NONE", "nOnE"] {
        let header = format!(r#"{{"alg":"{alg}","kid":"k1"}}"#);
        // Unsigned (empty signature, the RFC 7519 §6.1 form), and with a real HMAC signature.
        let unsigned = format!("{}.{payload}.", b64(&header));
        assert_eq!(check(&unsigned, T0_MS, 0), Err(Rejection::AlgNone), "{alg}");
        let signed = hs256(&header, &c, SECRET);
        assert_eq!(check(&signed, T0_MS, 0), Err(Rejection::AlgNone), "{alg}");
        // Two segments only.
        let short = format!("{}.{payload}", b64(&header));
        assert!(matches!(
            check(&short, T0_MS, 0),
            Err(Rejection::Malformed(MalformedPart::Shape))
        ));
    }
}

#[test]
fn switching_alg_between_hmac_and_asymmetric_is_refused() {
    let c = claims(T0_MS / 1000, T0_MS / 1000 + 60);
    // The classic confusion: an asymmetric `alg` over an HMAC signature made with the secret
    // (as if the attacker used a public key as the HMAC secret), and other HMAC sizes.
    for alg in [
        "RS256", "RS512", "PS256", "ES256", "ES384", "EdDSA", "HS384", "HS512", "hs256",
    ] {
        let token = hs256(&format!(r#"{{"alg":"{alg}","kid":"k1"}}"#), &c, SECRET);
        assert_eq!(
            check(&token, T0_MS, 0),
            Err(Rejection::AlgMismatch {
                expected: JwtAlgorithm::HS256,
                found: alg.to_owned(),
            }),
            "{alg}"
        );
    }
    // A verifier configured for HS384 refuses the HS256 token, and the reverse.
    let hs384 = JwtConfig {
        algorithm: JwtAlgorithm::HS384,
        ..cfg(0)
    };
    assert!(matches!(
        verify(&key(), &hs384, &good(), Now::both(T0_MS)),
        Err(Rejection::AlgMismatch { .. })
    ));
    let t384 = issue(&key(), &hs384, UserId(7), 1, Now::both(T0_MS))
        .unwrap()
        .token;
    assert!(matches!(
        check(&t384, T0_MS, 0),
        Err(Rejection::AlgMismatch { .. })
    ));
    // A missing, non-string or duplicated alg is a header that does not parse.
    for header in [
        r#"{"alg":"HS256","alg":"none","kid":"k1"}"#,
        r#"{"alg":"none","alg":"HS256","kid":"k1"}"#,
        r#"{"alg":"HS256","kid":"k1","kid":"k1"}"#,
        r#"{"kid":"k1"}"#,
        r#"{"alg":256,"kid":"k1"}"#,
        r#"{"alg":null}"#,
        "[]",
        "null",
    ] {
        let token = hs256(header, &c, SECRET);
        assert_eq!(
            check(&token, T0_MS, 0),
            Err(Rejection::Malformed(MalformedPart::HeaderJson)),
            "{header}"
        );
    }
}

#[test]
fn another_key_is_refused() {
    let other = b"ffffffffffffffffffffffffffffffff";
    let c = claims(T0_MS / 1000, T0_MS / 1000 + 60);
    // Same kid, other secret: HMAC cannot tell this from tampering.
    let token = hs256(r#"{"alg":"HS256","kid":"k1","typ":"JWT"}"#, &c, other);
    assert_eq!(check(&token, T0_MS, 0), Err(Rejection::BadSignature));
    // Another kid (even signed with the right secret), and no kid.
    let token = hs256(r#"{"alg":"HS256","kid":"k2"}"#, &c, SECRET);
    assert_eq!(
        check(&token, T0_MS, 0),
        Err(Rejection::UnknownKey {
            found: Some("k2".to_owned())
        })
    );
    let token = hs256(r#"{"alg":"HS256"}"#, &c, SECRET);
    assert_eq!(
        check(&token, T0_MS, 0),
        Err(Rejection::UnknownKey { found: None })
    );
    // A token issued under another key (other kid and secret) verifies only under that key.
    let k2 = SigningKey::new("k2", *other).unwrap();
    let t2 = issue(&k2, &cfg(0), UserId(7), 2, Now::both(T0_MS))
        .unwrap()
        .token;
    assert!(matches!(
        check(&t2, T0_MS, 0),
        Err(Rejection::UnknownKey { .. })
    ));
    assert!(verify(&k2, &cfg(0), &t2, Now::both(T0_MS)).is_ok());
    // The signature of one token on the claims of another.
    let mine = good();
    let theirs = issue(&key(), &cfg(0), UserId(8), 3, Now::both(T0_MS))
        .unwrap()
        .token;
    let (head, _) = mine.rsplit_once('.').unwrap();
    let (_, sig) = theirs.rsplit_once('.').unwrap();
    assert_eq!(
        check(&format!("{head}.{sig}"), T0_MS, 0),
        Err(Rejection::BadSignature)
    );
}

#[test]
fn truncated_or_padded_base64_is_refused() {
    let token = good();
    let parts: Vec<&str> = token.split('.').collect();
    let (h, p, s) = (parts[0], parts[1], parts[2]);
    // Padding: '=' is not in the base64url alphabet of a JWS segment.
    for (i, bad) in [
        format!("{h}=.{p}.{s}"),
        format!("{h}.{p}==.{s}"),
        format!("{h}.{p}.{s}="),
    ]
    .iter()
    .enumerate()
    {
        assert!(
            matches!(check(bad, T0_MS, 0), Err(Rejection::Malformed(_))),
            "padded segment {i}: {:?}",
            check(bad, T0_MS, 0)
        );
    }
    // Re-encoding a segment with padding (URL_SAFE) or the standard alphabet.
    let header = URL_SAFE_NO_PAD.decode(h).unwrap();
    let padded = format!("{}.{p}.{s}", URL_SAFE.encode(&header));
    if padded != token {
        assert!(matches!(
            check(&padded, T0_MS, 0),
            Err(Rejection::Malformed(_))
        ));
    }
    let sig = URL_SAFE_NO_PAD.decode(s).unwrap();
    let std_sig = format!("{h}.{p}.{}", STANDARD.encode(&sig));
    assert!(check(&std_sig, T0_MS, 0).is_err());
    // Truncation of every segment by one or more characters never verifies.
    for cut in 1..4 {
        for (seg, bad) in [
            (0, format!("{}.{p}.{s}", &h[..h.len() - cut])),
            (1, format!("{h}.{}.{s}", &p[..p.len() - cut])),
            (2, format!("{h}.{p}.{}", &s[..s.len() - cut])),
        ] {
            let r = check(&bad, T0_MS, 0);
            assert!(r.is_err(), "segment {seg} cut by {cut} verified");
        }
    }
    // The whole token cut at every length is refused, never a panic.
    for len in 0..token.len() {
        assert!(
            check(&token[..len], T0_MS, 0).is_err(),
            "prefix of {len} bytes verified"
        );
    }
    // Whitespace and trailing garbage.
    for bad in [
        format!(" {token}"),
        format!("{token} "),
        format!("{token}\n"),
        format!("{token}."),
    ] {
        assert!(check(&bad, T0_MS, 0).is_err());
    }
}

#[test]
fn huge_headers_are_refused_before_decoding_or_bounded() {
    let c = claims(T0_MS / 1000, T0_MS / 1000 + 60);
    // Over the length bound: refused before any base64 or JSON work.
    let big = format!(
        r#"{{"alg":"HS256","kid":"k1","x":"{}"}}"#,
        "a".repeat(1 << 20)
    );
    let token = hs256(&big, &c, SECRET);
    assert!(matches!(
        check(&token, T0_MS, 0),
        Err(Rejection::TooLong { .. })
    ));
    // Just under the bound, with a huge kid: the echoed kid is truncated to 64 bytes.
    let kid = "é".repeat(1000);
    let token = hs256(&format!(r#"{{"alg":"HS256","kid":"{kid}"}}"#), &c, SECRET);
    assert!(token.len() < 4096);
    match check(&token, T0_MS, 0) {
        Err(Rejection::UnknownKey { found: Some(found) }) => {
            assert!(found.len() <= 64 && kid.starts_with(&found));
        }
        other => panic!("{other:?}"),
    }
    // A huge alg is echoed truncated too.
    let alg = "X".repeat(2000);
    let token = hs256(&format!(r#"{{"alg":"{alg}","kid":"k1"}}"#), &c, SECRET);
    match check(&token, T0_MS, 0) {
        Err(Rejection::AlgMismatch { found, .. }) => assert_eq!(found.len(), 16),
        other => panic!("{other:?}"),
    }
    // Deeply nested JSON in the header: a parse error, not a stack overflow.
    let nested = format!(
        r#"{{"alg":"HS256","kid":"k1","x":{}1{}}}"#,
        "[".repeat(1500),
        "]".repeat(1500)
    );
    let token = format!("{}.e30.c2ln", b64(&nested));
    assert!(token.len() <= 4096);
    assert_eq!(
        check(&token, T0_MS, 0),
        Err(Rejection::Malformed(MalformedPart::HeaderJson))
    );
    // Many extra header fields, within the bound, signed right: accepted (unknown header
    // fields are ignored, as RFC 7515 allows), and the claims are the signed ones.
    let fields: String = (0..100).map(|i| format!(r#","f{i}":{i}"#)).collect();
    let token = hs256(
        &format!(r#"{{"alg":"HS256","kid":"k1"{fields}}}"#),
        &c,
        SECRET,
    );
    assert_eq!(check(&token, T0_MS, 0), Ok(c));
}

#[test]
fn exp_equal_to_now_is_expired() {
    let exp_s = T0_MS / 1000 + 60;
    let token = hs256(
        r#"{"alg":"HS256","kid":"k1"}"#,
        &claims(T0_MS / 1000, exp_s),
        SECRET,
    );
    let exp_ms = exp_s * 1000;
    assert!(check(&token, exp_ms - 1, 0).is_ok());
    assert_eq!(
        check(&token, exp_ms, 0),
        Err(Rejection::Expired {
            exp_ms,
            now_ms: exp_ms
        })
    );
    // With leeway L the last good millisecond is exp + L - 1.
    assert!(check(&token, exp_ms + 4_999, 5_000).is_ok());
    assert!(matches!(
        check(&token, exp_ms + 5_000, 5_000),
        Err(Rejection::Expired { .. })
    ));
    // exp at the far end of the range neither overflows nor panics.
    let token = hs256(
        r#"{"alg":"HS256","kid":"k1"}"#,
        &claims(0, u64::MAX),
        SECRET,
    );
    assert!(check(&token, u64::MAX - 1, u64::MAX).is_ok());
    let token = hs256(
        r#"{"alg":"HS256","kid":"k1"}"#,
        &claims(u64::MAX, u64::MAX),
        SECRET,
    );
    assert!(matches!(
        check(&token, T0_MS, 5_000),
        Err(Rejection::NotYetValid { .. })
    ));
}

#[test]
fn nbf_ahead_of_a_skewed_verifier() {
    // The issuer's clock is 3 s ahead of the verifier's: nbf is 3 s in the verifier's future.
    let issued_at = T0_MS + 3_000;
    let token = issue(&key(), &cfg(0), UserId(7), 9, Now::both(issued_at))
        .unwrap()
        .token;
    // No leeway: not yet valid until the verifier's clock reaches nbf.
    assert_eq!(
        check(&token, T0_MS, 0),
        Err(Rejection::NotYetValid {
            nbf_ms: issued_at,
            now_ms: T0_MS
        })
    );
    assert!(check(&token, issued_at, 0).is_ok());
    // A 5 s leeway covers a 3 s skew, not a 6 s one; the boundary is nbf - leeway, inclusive.
    assert!(check(&token, T0_MS, 5_000).is_ok());
    assert!(check(&token, issued_at - 5_000, 5_000).is_ok());
    assert!(matches!(
        check(&token, issued_at - 5_001, 5_000),
        Err(Rejection::NotYetValid { .. })
    ));
    // A verifier whose clock is far ahead sees the token expired, leeway or not.
    assert!(matches!(
        check(&token, issued_at + 3_600_000, 5_000),
        Err(Rejection::Expired { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x1a7_0e11),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Arbitrary text is refused (or, with overwhelming probability, never accepted) and never panics.
    #[test]
    fn arbitrary_text_never_verifies(token in ".{0,300}") {
        prop_assert!(check(&token, T0_MS, 5_000).is_err());
    }

    /// One changed byte anywhere in an honest token makes it fail.
    #[test]
    fn any_single_byte_change_is_refused(pos in 0usize..200, byte in any::<u8>()) {
        let token = good();
        let mut bytes = token.clone().into_bytes();
        let pos = pos % bytes.len();
        prop_assume!(bytes[pos] != byte);
        bytes[pos] = byte;
        let Ok(text) = String::from_utf8(bytes) else { return Ok(()); };
        // Base64url has slack in the last character of a segment; non-canonical encodings
        // are refused too (the base64 engine rejects non-zero trailing bits).
        prop_assert!(check(&text, T0_MS, 0).is_err(), "accepted a change at byte {}", pos);
    }
}

/// The token service ([`sut::token::TokenService`]) against hostile clients and clocks.
///
/// A client replays every token it was ever given (JWTs and one-time tokens), presents one-time
/// tokens as another user and twice at one instant, tampers with JWTs (flipped signature bits
/// and characters, altered claims, `alg: none`, other algorithms, other keys and key ids, the
/// signature of another token, truncation, garbage) and re-presents revoked ones. The service's
/// clock jumps back and forth around every bound (`exp`, `exp + leeway - 1`, `exp + leeway`,
/// `nbf - leeway`, the ends and starts of one-time windows, the clock's extremes, and
/// anywhere), its tables are tiny (two revocations, four one-time tokens), purges come at any
/// reading, and it restarts over its store at any point. After every step the bench checks the
/// service's own promises:
///
/// - `tokens.single_use` ([`check_single_use`] over the history): a one-time token is accepted at
///   most once, ever: across restarts, purges and two consumes at one instant;
/// - `once.one_per_window`: one accepted submit per (user, activity, window)
///   (sut/src/token/once.rs);
/// - `tokens.revoked_rejected` ([`check_revoked_rejected`] over the history): a JWT is never
///   accepted after its revocation was acknowledged;
/// - `jwt.window`: a JWT is accepted only while `nbf - leeway <= now < exp + leeway` by the
///   service's clock, and refused outside as `Expired`/`NotYetValid`;
/// - `jwt.authentic`: an accepted JWT is byte for byte one the service issued, with the claims it
///   issued: no tampered claim, no other key, no `alg: none`;
/// - `jwt.honoured`: an honest JWT inside its window and not revoked is accepted, unless its
///   window ended by the revocation table's horizon (then it is refused as `Forgotten`);
/// - `once.owner` / `once.window` / `once.consume`: a one-time token is accepted only for its own
///   user, before its window's end, unconsumed, and every refusal is the store contract's
///   (unknown, foreign, already consumed, expired, in that precedence); a window that ended by
///   the one-time table's horizon is not issued again (`WindowForgotten`);
/// - `tables.*`: a write into a full table is refused with `Full` only when every row is live at
///   that reading (expired rows are purged first), an acknowledged revocation or a live one-time
///   token is never silently forgotten, a purge removes exactly the expired rows, the store's
///   own invariants hold (rows within bounds, key index exact, every row past its table's
///   horizon), each horizon is the latest expiry purged, and the service's invariant (every
///   stored revocation is in the Bloom filter) holds, across restarts;
/// - `revocation.counted`: each verification that reaches the revocation list is counted once
///   (a filter negative or an exact lookup), each refusal as revoked once as an exact hit;
/// - `revocation.filter_capacity`: no more revocations are added to the Bloom filter than it
///   is sized for without reloading it from the exact set (a filter that only fills answers
///   "maybe" to everything);
/// - `no_panic`: no input panics.
///
/// The bench mirrors the store contract (sut/src/token/store.rs: what each table holds, given
/// the rows the service wrote and the readings of its purges), which is what lets it tell a
/// forgotten live row from an expired one.
///
/// A wall clock stepped back below a reading at which the service already forgot a row once
/// broke two promises (a revoked JWT accepted again, a second submit in one window); the
/// horizons fixed it, and `a_clock_stepped_back_below_a_purge_*` keep it fixed.
mod service {
    use std::cell::Cell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::fmt::Debug;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{
        Config, RngAlgorithm, RngSeed, TestCaseError, TestRng, TestRunner,
    };
    use sut::clock::Now;
    use sut::edge::{Edges, Observed};
    use sut::flaw::Flaw;
    use sut::token::jwt::{self, unverified_jti};
    use sut::token::once::OnceConsume;
    use sut::token::rows::{OnceGrant, Table};
    use sut::token::service::RevokeError;
    use sut::token::{
        ActivityKey, Claims, Forgotten, JwtConfig, MemoryTokenStore, OnceConfig, OnceIssue,
        OnceKey, OnceRejection, OnceToken, PurgeCounts, Rejection, RevocationConfig,
        RevocationStats, RevokeOutcome, SigningKey, TokenConfig, TokenEvent, TokenService,
        TokenStore, TokenStoreError, TokenStoreLimits, UserId, check_revoked_rejected,
        check_single_use,
    };

    /// 2024-05-30 00:00 UTC: a multiple of every window and second.
    const T0_MS: u64 = 1_717_027_200_000;
    const LEEWAY_MS: u64 = 1_000;
    const TTL_S: u64 = 3;
    const WINDOW_MS: u64 = 4_000;
    const REVOCATIONS_MAX: u64 = 2;
    const ONCE_TOKENS_MAX: u64 = 4;
    const SECRET: [u8; 32] = [42; 32];
    const OTHER_SECRET: [u8; 32] = [7; 32];
    const USERS: u64 = 3;
    /// Readings at the clock's ends (`Clock::Abs`).
    const EXTREMES: [u64; 6] = [0, 1, 999, u64::MAX / 1000 * 1000, u64::MAX - 1, u64::MAX];
    /// Characters a flipped token character becomes (the base64url alphabet's edges, the
    /// separator and padding).
    const FLIP_CHARS: &str = "AQgw_-09zZ.=";

    fn key() -> SigningKey {
        SigningKey::new("k1", SECRET).expect("a valid key")
    }

    /// A JWT's window by the docs (sut/src/token/jwt.rs): accepted while
    /// `nbf - leeway <= now < exp + leeway`, saturating at both ends of the clock.
    fn window(claims: &Claims) -> (u64, u64) {
        (
            claims.nbf_ms().saturating_sub(LEEWAY_MS),
            claims.exp_ms().saturating_add(LEEWAY_MS),
        )
    }

    /// Tiny tables (the Bloom filter sized like the revocation table), 3 s JWTs with 1 s of
    /// leeway, 4 s one-time windows.
    fn config(mutant: Mutant) -> TokenConfig {
        TokenConfig {
            jwt: JwtConfig {
                leeway_ms: LEEWAY_MS,
                ttl_s: TTL_S,
                ..JwtConfig::default()
            },
            revocation: RevocationConfig {
                capacity: REVOCATIONS_MAX,
                ..RevocationConfig::default()
            },
            once: OnceConfig {
                window_ms: WINDOW_MS,
            },
            limits: TokenStoreLimits {
                revocations_max: REVOCATIONS_MAX,
                once_tokens_max: ONCE_TOKENS_MAX,
            },
            flaws: sut::flaw::token_flaws(
                (mutant == Mutant::CheckThenDelete).then_some(Flaw::OnceCheckThenDelete),
            ),
        }
    }

    /// A deliberately broken variant of the service, to show that each check fires.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Mutant {
        /// The service as it is.
        None,
        /// The documented flaw `once_check_then_delete` (check, then mark, as two store
        /// operations).
        CheckThenDelete,
        /// Verification that never consults the revocation list.
        IgnoreRevocation,
        /// The leeway bounds off by one: accepts at `exp + leeway` and at `nbf - leeway - 1`.
        LeewayOffByOne,
        /// Verification that does not check the signature (as if it re-signed what it got).
        NoSignatureCheck,
        /// A store whose consume ignores who asks.
        IgnoreOwner,
        /// A store whose consume accepts at the window's end (`<=` for `<`).
        OnceExpiryInclusive,
        /// A store that swallows `Full` on a revocation and acknowledges it unstored.
        SwallowFull,
        /// A restart that rebuilds the Bloom filter from a stale (empty) revocation list.
        StaleRebuild,
        /// A verifier that unwraps its rejections.
        PanicOnRejection,
        /// A store that reports no horizon, so the verifier trusts a purged revocation's
        /// absence below it.
        BlindHorizon,
    }

    /// [`MemoryTokenStore`], passed through unchanged unless a store mutant is on.
    #[derive(Clone, Debug)]
    struct Store {
        inner: MemoryTokenStore,
        mutant: Mutant,
        /// Each one-time token's owner, for [`Mutant::IgnoreOwner`].
        owners: BTreeMap<OnceToken, UserId>,
        /// The next `revoked_jtis` answers empty ([`Mutant::StaleRebuild`]).
        blind_once: Cell<bool>,
    }

    impl Observed for Store {
        fn take_edges(&mut self, into: &mut Edges) {
            self.inner.take_edges(into);
        }
    }

    impl TokenStore for Store {
        fn revoke(
            &mut self,
            jti: &str,
            keep_until_ms: u64,
            now_ms: u64,
        ) -> Result<RevokeOutcome, TokenStoreError> {
            match self.inner.revoke(jti, keep_until_ms, now_ms) {
                Err(TokenStoreError::Full { .. }) if self.mutant == Mutant::SwallowFull => {
                    Ok(RevokeOutcome::Revoked)
                }
                other => other,
            }
        }

        fn is_revoked(&self, jti: &str) -> Result<bool, TokenStoreError> {
            self.inner.is_revoked(jti)
        }

        fn revoked_jtis(&self) -> Result<Vec<String>, TokenStoreError> {
            if self.blind_once.replace(false) {
                return Ok(Vec::new());
            }
            self.inner.revoked_jtis()
        }

        fn issue_once(
            &mut self,
            grant: &OnceGrant,
            now_ms: u64,
        ) -> Result<OnceIssue, TokenStoreError> {
            let issued = self.inner.issue_once(grant, now_ms)?;
            self.owners.insert(issued.token, grant.key.user);
            Ok(issued)
        }

        fn consume_once(
            &mut self,
            token: OnceToken,
            user: UserId,
            now_ms: u64,
        ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
            let (user, now_ms) = match self.mutant {
                Mutant::IgnoreOwner => (self.owners.get(&token).copied().unwrap_or(user), now_ms),
                Mutant::OnceExpiryInclusive => (user, now_ms.saturating_sub(1)),
                _ => (user, now_ms),
            };
            self.inner.consume_once(token, user, now_ms)
        }

        fn check_once(
            &mut self,
            token: OnceToken,
            user: UserId,
            now_ms: u64,
        ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
            self.inner.check_once(token, user, now_ms)
        }

        fn mark_once_consumed(
            &mut self,
            token: OnceToken,
            now_ms: u64,
        ) -> Result<bool, TokenStoreError> {
            self.inner.mark_once_consumed(token, now_ms)
        }

        fn purge_expired(&mut self, now_ms: u64) -> Result<PurgeCounts, TokenStoreError> {
            self.inner.purge_expired(now_ms)
        }

        fn forgotten(&self) -> Result<Forgotten, TokenStoreError> {
            if self.mutant == Mutant::BlindHorizon {
                return Ok(Forgotten::default());
            }
            self.inner.forgotten()
        }
    }

    /// The service under test, with the verification mutants applied around it. Its store is
    /// boxed, as the server's is (`Box<dyn TokenStore>`): the box's forwarding is on the path.
    struct Sut {
        svc: TokenService<Box<Store>>,
        mutant: Mutant,
        /// Filter rebuilds seen (`revocation_stats().rebuilds`), and revocations added to the
        /// filter since the last one.
        rebuilds_seen: u64,
        added_since_rebuild: u64,
        /// The arrivals at edge states of every incarnation before this one.
        edges: Edges,
    }

    impl Sut {
        fn new(mutant: Mutant) -> Self {
            let cfg = config(mutant);
            let store = Store {
                inner: MemoryTokenStore::new(cfg.limits),
                mutant,
                owners: BTreeMap::new(),
                blind_once: Cell::new(false),
            };
            let svc = TokenService::new(cfg, key(), Box::new(store)).expect("a valid config");
            let rebuilds_seen = svc.revocation_stats().rebuilds;
            Self {
                svc,
                mutant,
                rebuilds_seen,
                added_since_rebuild: 0,
                edges: Edges::new(),
            }
        }

        /// The Bloom filter is sized for `capacity` revocations: once that many were added
        /// since it was last loaded from the exact set, the next revocation reloads it first
        /// (a filter that only fills up answers "maybe revoked" to everything and every check
        /// becomes a store lookup). `added`: this call added a revocation to the filter.
        fn filter_within_capacity(&mut self, added: bool) -> Result<(), String> {
            let rebuilds = self.svc.revocation_stats().rebuilds;
            if rebuilds > self.rebuilds_seen {
                self.rebuilds_seen = rebuilds;
                self.added_since_rebuild = 0;
            }
            self.added_since_rebuild += u64::from(added);
            let capacity = self.svc.config().revocation.capacity;
            if self.added_since_rebuild > capacity {
                return Err(format!(
                    "revocation.filter_capacity: {} revocations added to a filter sized for \
                     {capacity} without reloading it",
                    self.added_since_rebuild
                ));
            }
            Ok(())
        }

        fn verify(&mut self, token: &str, now_ms: u64) -> Result<Claims, Rejection> {
            let now = Now::both(now_ms);
            match self.mutant {
                Mutant::IgnoreRevocation => jwt::verify(&key(), &self.svc.config().jwt, token, now),
                Mutant::NoSignatureCheck => self.svc.verify(&resign(token), now),
                Mutant::LeewayOffByOne => match self.svc.verify(token, now) {
                    Err(Rejection::Expired { exp_ms, now_ms })
                        if now_ms == exp_ms.saturating_add(LEEWAY_MS) =>
                    {
                        self.svc.verify(token, Now::both(now_ms.saturating_sub(1)))
                    }
                    Err(Rejection::NotYetValid { nbf_ms, now_ms })
                        if now_ms.saturating_add(LEEWAY_MS + 1) == nbf_ms =>
                    {
                        self.svc.verify(token, Now::both(now_ms.saturating_add(1)))
                    }
                    other => other,
                },
                Mutant::PanicOnRejection => match self.svc.verify(token, now) {
                    Err(rejection) => panic!("a verifier that unwraps: {rejection}"),
                    ok => ok,
                },
                _ => self.svc.verify(token, now),
            }
        }

        /// A restart: a new service over the store as it is.
        fn restart(&mut self) -> Result<(), String> {
            let store = self.svc.store().clone();
            if self.mutant == Mutant::StaleRebuild {
                store.blind_once.set(true);
            }
            self.svc.take_edges(&mut self.edges);
            self.svc = TokenService::new(config(self.mutant), key(), store)
                .map_err(|e| format!("restart: {e}"))?;
            self.rebuilds_seen = self.svc.revocation_stats().rebuilds;
            self.added_since_rebuild = 0;
            Ok(())
        }
    }

    /// `revocation.counted`: a verification that reached the revocation list (accepted, or
    /// refused as revoked) is counted once, as a filter negative or an exact lookup, and a
    /// refusal as revoked once as an exact hit; anything refused before the list is not
    /// counted, and no verification rebuilds the filter.
    fn revocation_counted(
        before: &RevocationStats,
        after: &RevocationStats,
        result: &Result<Claims, Rejection>,
    ) -> Result<(), String> {
        let revoked = matches!(result, Err(Rejection::Revoked));
        let reached = u64::from(result.is_ok() || revoked);
        let moved = |a: u64, b: u64| b.checked_sub(a);
        let deltas = (
            moved(before.bloom_negatives, after.bloom_negatives),
            moved(before.exact_lookups, after.exact_lookups),
            moved(before.exact_hits, after.exact_hits),
        );
        let counted = match deltas {
            (Some(negatives), Some(lookups), Some(hits)) => {
                negatives + lookups == reached
                    && hits == u64::from(revoked)
                    && hits <= lookups
                    && after.rebuilds == before.rebuilds
            }
            _ => false,
        };
        if counted {
            Ok(())
        } else {
            Err(format!(
                "revocation.counted: a verification answering {result:?} moved the counters \
                 from {before:?} to {after:?}"
            ))
        }
    }

    /// `header.payload` signed again with the service's secret: what a verifier that does not
    /// check the signature accepts.
    fn resign(token: &str) -> String {
        let Some((input, _)) = token.rsplit_once('.') else {
            return token.to_owned();
        };
        let enc = jsonwebtoken::EncodingKey::from_secret(&SECRET).expect("a key");
        let sig =
            jsonwebtoken::crypto::sign(input.as_bytes(), &enc, jsonwebtoken::Algorithm::HS256)
                .expect("signs");
        format!("{input}.{sig}")
    }

    /// `claims` signed with HS256 under `kid` with `secret`.
    fn sign(claims: &Claims, kid: &str, secret: &[u8]) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(kid.to_owned());
        let enc = jsonwebtoken::EncodingKey::from_secret(secret).expect("a key");
        jsonwebtoken::encode(&header, claims, &enc).expect("signs")
    }

    fn b64(bytes: impl AsRef<[u8]>) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The variant name of a value's `Debug` form (`Malformed(Shape)` → `Malformed`).
    fn variant(value: &impl Debug) -> String {
        let text = format!("{value:?}");
        let end = text.find(['(', ' ', '{']).unwrap_or(text.len());
        text[..end].to_owned()
    }

    /// A small index into whatever list it is applied to (modulo its length).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Ix(u16);

    impl Ix {
        fn of(self, len: usize) -> Option<usize> {
            (len > 0).then(|| usize::from(self.0) % len)
        }
    }

    /// A bound a clock reading is placed around.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Bound {
        /// A JWT's `exp`.
        Exp,
        /// A JWT's `exp + leeway`.
        ExpLeeway,
        /// A JWT's `nbf`.
        Nbf,
        /// A JWT's `nbf - leeway`.
        NbfLeeway,
        /// A one-time token's window end (its expiry).
        OnceEnd,
        /// A one-time token's window start.
        OnceStart,
    }

    /// The service's clock reading for a step.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Clock {
        /// `T0 + ms`.
        At(u64),
        /// Exactly `ms` since the epoch: the clock's extremes.
        Abs(u64),
        /// The previous step's reading.
        Same,
        /// `delta` ms from a bound of the token this step presents (for a bound of the other
        /// kind of token, or a step without one: of the newest token of that kind).
        Own(Bound, i64),
        /// `delta` ms from a bound of any token issued so far.
        Of(Ix, Bound, i64),
    }

    /// An altered claim (the signature kept).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Claim {
        /// Another user.
        Sub,
        /// An hour later.
        Exp,
        /// An hour earlier.
        Nbf,
        /// The `jti` of another issued token.
        Jti(Ix),
        /// Another issuer.
        Iss,
        /// Another audience.
        Aud,
    }

    /// How a presented JWT is forged from an issued one.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Forgery {
        /// One bit of the decoded signature flipped.
        FlipSigBit(Ix, u8),
        /// One character of the token replaced.
        FlipChar(Ix, char),
        /// A claim altered.
        Claim(Claim),
        /// `alg: none`, with the original signature or none.
        AlgNone { keep_sig: bool },
        /// Another `alg` in the header.
        HeaderAlg(&'static str),
        /// The claims signed with another secret under the service's key id.
        OtherSecret,
        /// The claims signed with the service's secret under another key id.
        OtherKid,
        /// Signed with the service's key, for another issuer (another service sharing the key).
        OtherIssuer,
        /// The signature of another issued token.
        SwapSig(Ix),
        /// Cut short.
        Truncate(Ix),
        /// Not derived from any token.
        Garbage(String),
    }

    /// The JWT a step presents.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Pick {
        /// One the service issued, unchanged (a replay).
        Honest(Ix),
        /// Forged from one it issued.
        Forged(Ix, Forgery),
    }

    /// The one-time token a step presents.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum OncePick {
        /// One the service issued (a replay, if it was used).
        Issued(Ix),
        /// A value never issued.
        Unknown(u64),
    }

    /// Who presents a one-time token.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum UserPick {
        Owner,
        /// Another user (user `n`, or the next one if `n` is the owner).
        Other(u64),
    }

    /// What a hostile client (or the node's operator) does next.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Step {
        /// Issue a JWT for `user`.
        Issue { user: u64, clock: Clock },
        /// Present a JWT for verification.
        Verify { pick: Pick, clock: Clock },
        /// Ask to revoke a JWT.
        Revoke { pick: Pick, clock: Clock },
        /// Issue (or re-read) the one-time token of `user` for activity A or B.
        IssueOnce { user: u64, b: bool, clock: Clock },
        /// Consume a one-time token.
        Consume {
            token: OncePick,
            user: UserPick,
            clock: Clock,
        },
        /// Two consumes of one token at the same instant, their store operations interleaved
        /// (the first by the owner, the second by `second`).
        ConsumePair {
            token: OncePick,
            second: UserPick,
            clock: Clock,
        },
        /// Purge expired rows.
        Purge { clock: Clock },
        /// Restart the service over its store.
        Restart,
    }

    fn ix() -> impl Strategy<Value = Ix> {
        (0u16..8).prop_map(Ix)
    }

    fn bound() -> impl Strategy<Value = Bound> {
        prop_oneof![
            Just(Bound::Exp),
            Just(Bound::ExpLeeway),
            Just(Bound::Nbf),
            Just(Bound::NbfLeeway),
            Just(Bound::OnceEnd),
            Just(Bound::OnceStart),
        ]
    }

    fn delta() -> impl Strategy<Value = i64> {
        prop_oneof![3 => -1i64..=1, 1 => -1_500i64..1_500]
    }

    fn clock() -> impl Strategy<Value = Clock> {
        prop_oneof![
            3 => (0u64..10_000).prop_map(Clock::At),
            1 => Just(Clock::Same),
            4 => (bound(), delta()).prop_map(|(b, d)| Clock::Own(b, d)),
            2 => (ix(), bound(), delta()).prop_map(|(i, b, d)| Clock::Of(i, b, d)),
            1 => prop::sample::select(EXTREMES.to_vec()).prop_map(Clock::Abs),
        ]
    }

    fn forgery() -> impl Strategy<Value = Forgery> {
        let flip = prop::sample::select(FLIP_CHARS.chars().collect::<Vec<_>>());
        let alg = prop::sample::select(vec!["HS384", "HS512", "RS256", "ES256", "hs256", "NONE"]);
        let claim = prop_oneof![
            Just(Claim::Sub),
            Just(Claim::Exp),
            Just(Claim::Nbf),
            ix().prop_map(Claim::Jti),
            Just(Claim::Iss),
            Just(Claim::Aud),
        ];
        prop_oneof![
            (ix(), any::<u8>()).prop_map(|(i, bit)| Forgery::FlipSigBit(i, bit)),
            ((0u16..400).prop_map(Ix), flip).prop_map(|(i, c)| Forgery::FlipChar(i, c)),
            claim.prop_map(Forgery::Claim),
            any::<bool>().prop_map(|keep_sig| Forgery::AlgNone { keep_sig }),
            alg.prop_map(Forgery::HeaderAlg),
            Just(Forgery::OtherSecret),
            Just(Forgery::OtherKid),
            Just(Forgery::OtherIssuer),
            ix().prop_map(Forgery::SwapSig),
            (0u16..400).prop_map(|i| Forgery::Truncate(Ix(i))),
            "[A-Za-z0-9_.=-]{0,60}".prop_map(Forgery::Garbage),
        ]
    }

    fn pick() -> impl Strategy<Value = Pick> {
        prop_oneof![
            2 => ix().prop_map(Pick::Honest),
            1 => (ix(), forgery()).prop_map(|(i, f)| Pick::Forged(i, f)),
        ]
    }

    fn once_pick() -> impl Strategy<Value = OncePick> {
        prop_oneof![
            6 => ix().prop_map(OncePick::Issued),
            1 => any::<u64>().prop_map(OncePick::Unknown),
        ]
    }

    fn user_pick() -> impl Strategy<Value = UserPick> {
        prop_oneof![
            3 => Just(UserPick::Owner),
            1 => (1..=USERS).prop_map(UserPick::Other),
        ]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (1..=USERS, clock()).prop_map(|(user, clock)| Step::Issue { user, clock }),
            6 => (pick(), clock()).prop_map(|(pick, clock)| Step::Verify { pick, clock }),
            3 => (pick(), clock()).prop_map(|(pick, clock)| Step::Revoke { pick, clock }),
            3 => (1..=USERS, any::<bool>(), clock())
                .prop_map(|(user, b, clock)| Step::IssueOnce { user, b, clock }),
            4 => (once_pick(), user_pick(), clock())
                .prop_map(|(token, user, clock)| Step::Consume { token, user, clock }),
            2 => (once_pick(), user_pick(), clock())
                .prop_map(|(token, second, clock)| Step::ConsumePair { token, second, clock }),
            2 => clock().prop_map(|clock| Step::Purge { clock }),
            1 => Just(Step::Restart),
        ]
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(step(), 1..50)
    }

    /// An issued JWT.
    #[derive(Clone, Debug)]
    struct Jwt {
        token: String,
        claims: Claims,
    }

    /// An issued one-time token.
    #[derive(Clone, Debug)]
    struct Once {
        token: OnceToken,
        key: OnceKey,
        expires_at_ms: u64,
    }

    /// A one-time token row, as the store contract says the store holds it.
    #[derive(Clone, Debug)]
    struct Row {
        key: OnceKey,
        expires_at_ms: u64,
        consumed: bool,
    }

    /// Drives one service through hostile steps and checks its promises after each.
    struct Bench {
        sut: Sut,
        /// The history's sequence stamp (one per step).
        at: u64,
        /// The previous step's reading.
        now_ms: u64,
        nonce: u128,
        history: Vec<TokenEvent>,
        jwts: Vec<Jwt>,
        onces: Vec<Once>,
        /// The revocations the store must hold: jti to `keep_until_ms`.
        revoked: BTreeMap<String, u64>,
        /// Every acknowledged revocation.
        acked: BTreeSet<String>,
        /// The one-time tokens the store must hold.
        rows: BTreeMap<OnceToken, Row>,
        /// The first accepted token of each (user, activity, window).
        submitted: BTreeMap<OnceKey, OnceToken>,
        /// Each table's horizon, as the store contract says: the latest expiry purged.
        forgotten: Forgotten,
        /// What the steps went through (for the coverage test).
        seen: BTreeSet<String>,
    }

    impl Bench {
        fn new(mutant: Mutant) -> Self {
            Self {
                sut: Sut::new(mutant),
                forgotten: Forgotten::default(),
                at: 0,
                now_ms: T0_MS,
                nonce: 0,
                history: Vec::new(),
                jwts: Vec::new(),
                onces: Vec::new(),
                revoked: BTreeMap::new(),
                acked: BTreeSet::new(),
                rows: BTreeMap::new(),
                submitted: BTreeMap::new(),
                seen: BTreeSet::new(),
            }
        }

        fn see(&mut self, what: impl Into<String>) {
            self.seen.insert(what.into());
        }

        fn fresh_nonce(&mut self) -> u128 {
            self.nonce += 1;
            self.nonce
        }

        /// The reading `clock` gives, relative to the step's own JWT and one-time token.
        fn resolve(&mut self, clock: Clock, jwt: Option<usize>, once: Option<usize>) -> u64 {
            let from = |b: Bound, jwt: Option<usize>, once: Option<usize>| -> Option<u64> {
                match b {
                    Bound::Exp | Bound::ExpLeeway | Bound::Nbf | Bound::NbfLeeway => {
                        let c = &self.jwts[jwt.or(self.jwts.len().checked_sub(1))?].claims;
                        Some(match b {
                            Bound::Exp => c.exp_ms(),
                            Bound::ExpLeeway => window(c).1,
                            Bound::Nbf => c.nbf_ms(),
                            _ => window(c).0,
                        })
                    }
                    Bound::OnceEnd | Bound::OnceStart => {
                        let o = &self.onces[once.or(self.onces.len().checked_sub(1))?];
                        Some(match b {
                            Bound::OnceEnd => o.expires_at_ms,
                            _ => o.key.window_start_ms,
                        })
                    }
                }
            };
            let now = match clock {
                Clock::At(ms) => Some(T0_MS + ms),
                Clock::Abs(ms) => Some(ms),
                Clock::Same => Some(self.now_ms),
                Clock::Own(b, delta) => {
                    from(b, jwt, once).map(|ms| ms.saturating_add_signed(delta))
                }
                Clock::Of(i, b, delta) => from(b, i.of(self.jwts.len()), i.of(self.onces.len()))
                    .map(|ms| ms.saturating_add_signed(delta)),
            };
            self.now_ms = now.unwrap_or(self.now_ms);
            self.now_ms
        }

        /// The token a pick presents, the issued JWT it is (or is forged from), and what it is.
        fn present(&self, pick: &Pick) -> (String, Option<usize>, String) {
            match pick {
                Pick::Honest(i) => match i.of(self.jwts.len()) {
                    Some(i) => (self.jwts[i].token.clone(), Some(i), "a replay".to_owned()),
                    None => ("x.y.z".to_owned(), None, "garbage".to_owned()),
                },
                Pick::Forged(i, forgery) => match i.of(self.jwts.len()) {
                    Some(i) => (
                        self.forge(&self.jwts[i], forgery),
                        Some(i),
                        format!("{forgery:?}"),
                    ),
                    None => ("x.y.z".to_owned(), None, "garbage".to_owned()),
                },
            }
        }

        fn forge(&self, base: &Jwt, forgery: &Forgery) -> String {
            let token = &base.token;
            let mut parts = token.splitn(3, '.');
            let (head, payload, sig) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            match forgery {
                Forgery::FlipSigBit(i, bit) => {
                    let mut bytes = URL_SAFE_NO_PAD.decode(sig).expect("an issued signature");
                    let at = i.of(bytes.len()).expect("a signature has bytes");
                    bytes[at] ^= 1 << (bit % 8);
                    format!("{head}.{payload}.{}", b64(bytes))
                }
                Forgery::FlipChar(i, c) => {
                    let mut chars: Vec<char> = token.chars().collect();
                    let at = i.of(chars.len()).expect("a token has characters");
                    chars[at] = *c;
                    chars.into_iter().collect()
                }
                Forgery::Claim(claim) => {
                    let json = URL_SAFE_NO_PAD.decode(payload).expect("an issued payload");
                    let mut v: serde_json::Value = serde_json::from_slice(&json).expect("claims");
                    let c = &base.claims;
                    match claim {
                        Claim::Sub => {
                            let sub: u64 = c.sub.parse().expect("a user id");
                            v["sub"] = (sub % USERS + 1).to_string().into();
                        }
                        Claim::Exp => v["exp"] = (c.exp + 3_600).into(),
                        Claim::Nbf => v["nbf"] = c.nbf.saturating_sub(3_600).into(),
                        Claim::Jti(j) => {
                            let other = j.of(self.jwts.len()).expect("some JWT");
                            v["jti"] = self.jwts[other].claims.jti.clone().into();
                        }
                        Claim::Iss => v["iss"] = "evil".into(),
                        Claim::Aud => v["aud"] = "evil".into(),
                    }
                    let json = serde_json::to_vec(&v).expect("serializes");
                    format!("{head}.{}.{sig}", b64(json))
                }
                Forgery::AlgNone { keep_sig } => {
                    let head = b64(r#"{"alg":"none","kid":"k1","typ":"JWT"}"#);
                    let sig = if *keep_sig { sig } else { "" };
                    format!("{head}.{payload}.{sig}")
                }
                Forgery::HeaderAlg(alg) => {
                    let head = b64(format!(r#"{{"alg":"{alg}","kid":"k1","typ":"JWT"}}"#));
                    format!("{head}.{payload}.{sig}")
                }
                Forgery::OtherSecret => sign(&base.claims, "k1", &OTHER_SECRET),
                Forgery::OtherKid => sign(&base.claims, "k2", &SECRET),
                Forgery::OtherIssuer => {
                    let claims = Claims {
                        iss: "other-service".to_owned(),
                        ..base.claims.clone()
                    };
                    sign(&claims, "k1", &SECRET)
                }
                Forgery::SwapSig(j) => {
                    let other = &self.jwts[j.of(self.jwts.len()).expect("some JWT")].token;
                    let (_, other_sig) = other.rsplit_once('.').expect("three segments");
                    format!("{head}.{payload}.{other_sig}")
                }
                Forgery::Truncate(i) => token[..i.of(token.len()).expect("non-empty")].to_owned(),
                Forgery::Garbage(text) => text.clone(),
            }
        }

        /// One step, then every check.
        fn act(&mut self, step: &Step) -> Result<(), String> {
            self.at += 1;
            match step {
                Step::Issue { user, clock } => self.issue(*user, *clock)?,
                Step::Verify { pick, clock } => self.verify(pick, *clock)?,
                Step::Revoke { pick, clock } => self.revoke(pick, *clock)?,
                Step::IssueOnce { user, b, clock } => self.issue_once(*user, *b, *clock)?,
                Step::Consume { token, user, clock } => self.consume(*token, *user, *clock)?,
                Step::ConsumePair {
                    token,
                    second,
                    clock,
                } => self.consume_pair(*token, *second, *clock)?,
                Step::Purge { clock } => self.purge(*clock)?,
                Step::Restart => {
                    if !self.revoked.is_empty() {
                        self.see("restart over live revocations");
                    }
                    self.sut.restart()?;
                }
            }
            self.check_state()
        }

        fn issue(&mut self, user: u64, clock: Clock) -> Result<(), String> {
            let now = self.resolve(clock, None, None);
            let nonce = self.fresh_nonce();
            let issued = self
                .sut
                .svc
                .issue(UserId(user), nonce, Now::both(now))
                .map_err(|e| format!("issue failed: {e}"))?;
            let iat = now / 1000;
            if issued.claims.sub != user.to_string()
                || issued.claims.nbf != iat
                || issued.claims.exp != iat.saturating_add(TTL_S)
            {
                return Err(format!("issue: claims {:?} at {now}", issued.claims));
            }
            self.jwts.push(Jwt {
                token: issued.token,
                claims: issued.claims,
            });
            Ok(())
        }

        fn verify(&mut self, pick: &Pick, clock: Clock) -> Result<(), String> {
            let (token, base, what) = self.present(pick);
            let now = self.resolve(clock, base, None);
            let stats_before = self.sut.svc.revocation_stats();
            let result = self.sut.verify(&token, now);
            if self.sut.mutant == Mutant::None {
                revocation_counted(&stats_before, &self.sut.svc.revocation_stats(), &result)?;
            }
            let at = self.at;
            let honest = self.jwts.iter().position(|j| j.token == token);
            let Some(i) = honest else {
                if let Ok(claims) = result {
                    return Err(format!(
                        "jwt.authentic: accepted a forged token ({what}) as {claims:?}"
                    ));
                }
                let rejection = result.expect_err("refused");
                self.see(format!("forged JWT refused: {}", variant(&rejection)));
                self.history.push(TokenEvent::VerifyRejected {
                    jti: unverified_jti(&token),
                    at,
                });
                return Ok(());
            };
            let jwt = self.jwts[i].clone();
            let (nbf, exp) = (jwt.claims.nbf_ms(), jwt.claims.exp_ms());
            let (from, until) = window(&jwt.claims);
            let window = format!("[{from}, {until})");
            match result {
                Ok(claims) => {
                    if claims != jwt.claims {
                        return Err(format!(
                            "jwt.authentic: accepted with claims {claims:?}, issued {:?}",
                            jwt.claims
                        ));
                    }
                    if now < from || now >= until {
                        return Err(format!(
                            "jwt.window: accepted at {now}, outside its window {window}"
                        ));
                    }
                    if now >= exp {
                        self.see("JWT accepted past exp, within leeway");
                    }
                    if now < nbf {
                        self.see("JWT accepted before nbf, within leeway");
                    }
                    self.history.push(TokenEvent::VerifyOk {
                        jti: claims.jti,
                        invoked_at: at,
                        at,
                    });
                }
                Err(rejection) => {
                    let jti = jwt.claims.jti.clone();
                    let expected = if now >= until {
                        Rejection::Expired {
                            exp_ms: exp,
                            now_ms: now,
                        }
                    } else if now < from {
                        Rejection::NotYetValid {
                            nbf_ms: nbf,
                            now_ms: now,
                        }
                    } else if until <= self.forgotten.revocations_until_ms {
                        Rejection::Forgotten {
                            keep_until_ms: until,
                            forgotten_until_ms: self.forgotten.revocations_until_ms,
                        }
                    } else if self.revoked.contains_key(&jti) {
                        Rejection::Revoked
                    } else {
                        return Err(format!(
                            "jwt.honoured: refused its own unrevoked token at {now}, inside its \
                             window {window}: {rejection:?}"
                        ));
                    };
                    if rejection != expected {
                        return Err(format!(
                            "jwt.window: refused with {rejection:?}, expected {expected:?}"
                        ));
                    }
                    if now == until {
                        self.see("JWT refused at exactly exp + leeway");
                    }
                    if now.checked_add(1) == Some(from) {
                        self.see("JWT refused at exactly nbf - leeway - 1");
                    }
                    self.see(format!("honest JWT refused: {}", variant(&rejection)));
                    self.history
                        .push(TokenEvent::VerifyRejected { jti: Some(jti), at });
                }
            }
            Ok(())
        }

        /// The store contract's answer to a revocation, applied to the mirror.
        fn mirror_revoke(
            &mut self,
            jti: &str,
            keep_until_ms: u64,
            now: u64,
        ) -> Result<RevokeOutcome, TokenStoreError> {
            if keep_until_ms <= self.forgotten.revocations_until_ms {
                return Ok(RevokeOutcome::NotNeeded);
            }
            if let Some(keep) = self.revoked.get_mut(jti) {
                *keep = (*keep).max(keep_until_ms);
                return Ok(RevokeOutcome::AlreadyRevoked);
            }
            if self.revoked.len() as u64 >= REVOCATIONS_MAX {
                self.purge_revocations(now);
                if self.revoked.len() as u64 >= REVOCATIONS_MAX {
                    return Err(TokenStoreError::Full {
                        table: Table::Revocations,
                        max: REVOCATIONS_MAX,
                    });
                }
            }
            self.revoked.insert(jti.to_owned(), keep_until_ms);
            Ok(RevokeOutcome::Revoked)
        }

        fn revoke(&mut self, pick: &Pick, clock: Clock) -> Result<(), String> {
            let (token, base, what) = self.present(pick);
            let now = self.resolve(clock, base, None);
            let result = self.sut.svc.revoke(&token, Now::both(now));
            let added = matches!(
                result,
                Ok(_) | Err(RevokeError::Store(TokenStoreError::Full { .. }))
            );
            self.sut.filter_within_capacity(added)?;
            let Some(i) = self.jwts.iter().position(|j| j.token == token) else {
                return match result {
                    Err(RevokeError::Rejected(rejection)) => {
                        self.see(format!(
                            "forged JWT's revocation refused: {}",
                            variant(&rejection)
                        ));
                        Ok(())
                    }
                    other => Err(format!(
                        "jwt.authentic: revoking with a forged token ({what}) answered {other:?}"
                    )),
                };
            };
            let claims = self.jwts[i].claims.clone();
            let (from, keep_until_ms) = window(&claims);
            if now < from || now >= keep_until_ms {
                return match result {
                    Err(RevokeError::Rejected(
                        Rejection::Expired { .. } | Rejection::NotYetValid { .. },
                    )) => Ok(()),
                    other => Err(format!(
                        "jwt.window: revoking a token outside its window at {now} answered \
                         {other:?}"
                    )),
                };
            }
            let expected = self.mirror_revoke(&claims.jti, keep_until_ms, now);
            match (result, expected) {
                (Ok(got), Ok(want)) if got == want => {
                    self.acked.insert(claims.jti.clone());
                    self.history.push(TokenEvent::RevokeAck {
                        jti: claims.jti,
                        at: self.at,
                    });
                    self.see(format!("revocation {got:?}"));
                    Ok(())
                }
                (Err(RevokeError::Store(got)), Err(want)) if got == want => {
                    self.see("revocation refused: table full of live revocations");
                    Ok(())
                }
                (Ok(got), Err(full)) => Err(format!(
                    "tables.full_refuses: acknowledged a revocation ({got:?}) at {now} although \
                     the table held {REVOCATIONS_MAX} live revocations ({full}): it is not stored"
                )),
                (Err(RevokeError::Store(TokenStoreError::Full { .. })), Ok(want)) => Err(format!(
                    "tables.full_refuses: refused as full at {now} although expired rows or \
                         room would let it in ({want:?})"
                )),
                (got, want) => Err(format!(
                    "revoke: answered {got:?} at {now}, the store contract says {want:?}"
                )),
            }
        }

        fn issue_once(&mut self, user: u64, b: bool, clock: Clock) -> Result<(), String> {
            let now = self.resolve(clock, None, None);
            let activity = ActivityKey::new(if b { "B" } else { "A" }).expect("an activity id");
            let window_start_ms = now - now % WINDOW_MS;
            let key = OnceKey {
                user: UserId(user),
                activity: activity.clone(),
                window_start_ms,
            };
            let nonce = self.fresh_nonce();
            let got = self
                .sut
                .svc
                .issue_once(UserId(user), activity, nonce, Now::both(now));
            // The store contract: the key's token if it has one; else purge if full, refuse if
            // still full, insert.
            let existing = self.rows.iter().find(|(_, row)| row.key == key);
            let want = if let Some((token, row)) = existing {
                Ok(OnceIssue {
                    token: *token,
                    expires_at_ms: row.expires_at_ms,
                    fresh: false,
                    consumed: row.consumed,
                })
            } else if window_start_ms.saturating_add(WINDOW_MS)
                <= now.max(self.forgotten.once_until_ms)
            {
                Err(TokenStoreError::WindowOver {
                    expires_at_ms: window_start_ms.saturating_add(WINDOW_MS),
                    seen_ms: now.max(self.forgotten.once_until_ms),
                })
            } else {
                if self.rows.len() as u64 >= ONCE_TOKENS_MAX {
                    self.purge_once(now);
                }
                if self.rows.len() as u64 >= ONCE_TOKENS_MAX {
                    Err(TokenStoreError::Full {
                        table: Table::OnceTokens,
                        max: ONCE_TOKENS_MAX,
                    })
                } else {
                    let expires_at_ms = window_start_ms.saturating_add(WINDOW_MS);
                    self.rows.insert(
                        OnceToken(nonce),
                        Row {
                            key: key.clone(),
                            expires_at_ms,
                            consumed: false,
                        },
                    );
                    Ok(OnceIssue {
                        token: OnceToken(nonce),
                        expires_at_ms,
                        fresh: true,
                        consumed: false,
                    })
                }
            };
            if got != want {
                let promise = match (&got, &want) {
                    (Ok(_), Err(_)) | (Err(TokenStoreError::Full { .. }), Ok(_)) => {
                        "tables.full_refuses"
                    }
                    _ => "once.issue",
                };
                return Err(format!(
                    "{promise}: issuing for {key:?} at {now} answered {got:?}, the store \
                     contract says {want:?}"
                ));
            }
            match got {
                Ok(issued) => {
                    self.history.push(TokenEvent::OnceIssued {
                        token: issued.token,
                        at: self.at,
                    });
                    if issued.fresh {
                        self.onces.push(Once {
                            token: issued.token,
                            key,
                            expires_at_ms: issued.expires_at_ms,
                        });
                    } else {
                        self.see(format!(
                            "one-time token re-read (consumed: {})",
                            issued.consumed
                        ));
                    }
                }
                Err(TokenStoreError::WindowOver { seen_ms, .. }) if seen_ms > now => {
                    self.see("one-time issue refused: window forgotten");
                }
                Err(TokenStoreError::WindowOver { .. }) => {
                    self.see("one-time issue refused: window over by the clock's end");
                }
                Err(_) => self.see("one-time issue refused: table full of live tokens"),
            }
            Ok(())
        }

        /// The store contract's purge of expired revocations at `now`, horizon raised.
        fn purge_revocations(&mut self, now: u64) -> u64 {
            let expired: Vec<u64> = self
                .revoked
                .values()
                .copied()
                .filter(|k| *k <= now)
                .collect();
            self.revoked.retain(|_, keep| *keep > now);
            if let Some(latest) = expired.iter().max() {
                let until = &mut self.forgotten.revocations_until_ms;
                *until = (*until).max(*latest);
            }
            expired.len() as u64
        }

        /// The store contract's purge of expired one-time tokens at `now`, horizon raised.
        fn purge_once(&mut self, now: u64) -> u64 {
            let expired: Vec<u64> = self
                .rows
                .values()
                .map(|row| row.expires_at_ms)
                .filter(|e| *e <= now)
                .collect();
            self.rows.retain(|_, row| row.expires_at_ms > now);
            if let Some(latest) = expired.iter().max() {
                let until = &mut self.forgotten.once_until_ms;
                *until = (*until).max(*latest);
            }
            expired.len() as u64
        }

        /// The token, its owner and its index among the issued ones.
        fn once_token(&self, pick: OncePick) -> (OnceToken, Option<UserId>, Option<usize>) {
            match pick {
                OncePick::Issued(i) => match i.of(self.onces.len()) {
                    Some(i) => (self.onces[i].token, Some(self.onces[i].key.user), Some(i)),
                    None => (OnceToken(1 << 127), None, None),
                },
                OncePick::Unknown(v) => (OnceToken(1 << 127 | u128::from(v)), None, None),
            }
        }

        fn user(pick: UserPick, owner: Option<UserId>) -> UserId {
            let owner = owner.unwrap_or(UserId(1));
            match pick {
                UserPick::Owner => owner,
                UserPick::Other(u) if UserId(u) == owner => UserId(u % USERS + 1),
                UserPick::Other(u) => UserId(u),
            }
        }

        fn consume(&mut self, pick: OncePick, user: UserPick, clock: Clock) -> Result<(), String> {
            let (token, owner, i) = self.once_token(pick);
            let user = Self::user(user, owner);
            let now = self.resolve(clock, None, i);
            let got = self
                .sut
                .svc
                .consume_once(token, user, Now::both(now))
                .map_err(|e| format!("consume: store error {e}"))?;
            self.judge_consume(token, user, now, got)
        }

        fn consume_pair(
            &mut self,
            pick: OncePick,
            second: UserPick,
            clock: Clock,
        ) -> Result<(), String> {
            let (token, owner, i) = self.once_token(pick);
            let (first, second) = (
                Self::user(UserPick::Owner, owner),
                Self::user(second, owner),
            );
            let now = self.resolve(clock, None, i);
            let flaws = self.sut.svc.flaws();
            let mut a = OnceConsume::new(token, first, Now::both(now), flaws);
            let mut b = OnceConsume::new(token, second, Now::both(now), flaws);
            // A's first operation, B's first, then A's and B's second (the flawed path's marks).
            for _ in 0..2 {
                for c in [&mut a, &mut b] {
                    if let Some(op) = c.poll_op() {
                        let answer = self
                            .sut
                            .svc
                            .apply_once_op(op)
                            .map_err(|e| format!("consume: store error {e}"))?;
                        c.handle_op_result(answer).map_err(|e| e.to_string())?;
                    }
                }
            }
            let unfinished = || "a consume did not finish in two operations".to_owned();
            let got_a = a.outcome().cloned().ok_or_else(unfinished)?;
            let got_b = b.outcome().cloned().ok_or_else(unfinished)?;
            // Each correct consume is one atomic operation, A's first.
            self.judge_consume(token, first, now, got_a)?;
            self.judge_consume(token, second, now, got_b)
        }

        /// A consume's answer against the store contract and the promises.
        fn judge_consume(
            &mut self,
            token: OnceToken,
            user: UserId,
            now: u64,
            got: Result<OnceKey, OnceRejection>,
        ) -> Result<(), String> {
            let at = self.at;
            self.history.push(match got {
                Ok(_) => TokenEvent::OnceConsumeOk { token, at },
                Err(_) => TokenEvent::OnceConsumeRejected { token, at },
            });
            check_single_use(&self.history).map_err(|v| v.to_string())?;
            let row = self.rows.get(&token).cloned();
            let want = match self.rows.get_mut(&token) {
                None => Err(OnceRejection::Unknown),
                Some(row) if row.key.user != user => Err(OnceRejection::Foreign),
                Some(row) if row.consumed => Err(OnceRejection::AlreadyConsumed),
                Some(row) if now >= row.expires_at_ms => Err(OnceRejection::Expired),
                Some(row) => {
                    row.consumed = true;
                    Ok(row.key.clone())
                }
            };
            let said = format!("consume of {token:?} by {user:?} at {now} (row {row:?})");
            if got != want {
                return Err(match (&got, &want) {
                    (Ok(_), Err(OnceRejection::Foreign)) => {
                        format!("once.owner: accepted another user's token: {said}")
                    }
                    (Ok(_), Err(OnceRejection::Expired)) => {
                        format!("once.window: accepted at or past its window's end: {said}")
                    }
                    (Ok(_), Err(OnceRejection::AlreadyConsumed)) => {
                        format!("tokens.single_use: accepted a consumed token: {said}")
                    }
                    (Err(OnceRejection::Unknown), Ok(_) | Err(_)) => format!(
                        "tables.no_silent_loss: the store forgot a live one-time token: {said}"
                    ),
                    _ => format!(
                        "once.consume: answered {got:?}, the store contract says {want:?}: {said}"
                    ),
                });
            }
            match got {
                Ok(key) => {
                    if now < key.window_start_ms {
                        self.see("one-time token accepted before its window's start");
                    }
                    if row.is_some_and(|r| now.saturating_add(1) == r.expires_at_ms) {
                        self.see("one-time token accepted in its window's last millisecond");
                    }
                    match self.submitted.get(&key) {
                        None => {
                            self.submitted.insert(key, token);
                        }
                        Some(first) => {
                            return Err(format!(
                                "once.one_per_window: {key:?} accepted {token:?} after {first:?}"
                            ));
                        }
                    }
                }
                Err(rejection) => self.see(format!("one-time consume refused: {rejection:?}")),
            }
            Ok(())
        }

        fn purge(&mut self, clock: Clock) -> Result<(), String> {
            let now = self.resolve(clock, None, None);
            let got = self
                .sut
                .svc
                .purge_expired(Now::both(now))
                .map_err(|e| format!("purge: store error {e}"))?;
            self.sut.filter_within_capacity(false)?;
            let want = PurgeCounts {
                revocations: self.purge_revocations(now),
                once_tokens: self.purge_once(now),
            };
            if got != want {
                return Err(format!(
                    "tables.purge: purging at {now} removed {got:?}, the expired rows are {want:?}"
                ));
            }
            if got.revocations > 0 {
                self.see("purge removed revocations");
            }
            if got.once_tokens > 0 {
                self.see("purge removed one-time tokens");
            }
            Ok(())
        }

        /// The checks after every step.
        fn check_state(&self) -> Result<(), String> {
            check_single_use(&self.history).map_err(|v| v.to_string())?;
            check_revoked_rejected(&self.history).map_err(|v| v.to_string())?;
            self.sut
                .svc
                .check_invariants()
                .map_err(|e| format!("tables.filter_covers_store: {e}"))?;
            let store = &self.sut.svc.store().inner;
            store
                .check_invariants()
                .map_err(|e| format!("tables.bounded: {e}"))?;
            let held: BTreeSet<String> = store
                .revoked_jtis()
                .map_err(|e| format!("store error {e}"))?
                .into_iter()
                .collect();
            if let Some((jti, keep)) = self.revoked.iter().find(|(jti, _)| !held.contains(*jti)) {
                return Err(format!(
                    "tables.no_silent_loss: the store forgot revocation {jti}, live until {keep}"
                ));
            }
            let horizon = store.forgotten().map_err(|e| format!("store error {e}"))?;
            if horizon != self.forgotten {
                return Err(format!(
                    "tables.horizon: the store's horizons are {horizon:?}, the latest expiries \
                     purged {:?}",
                    self.forgotten
                ));
            }
            if let Some(jti) = held.iter().find(|jti| !self.revoked.contains_key(*jti)) {
                return Err(format!(
                    "tables.revocations: the store holds {jti}, which was never acknowledged or \
                     has expired and been purged"
                ));
            }
            Ok(())
        }
    }

    fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    }

    /// Runs `steps` against the service (broken by `mutant`); the first broken promise, or what
    /// the steps went through.
    fn run_seen(mutant: Mutant, steps: &[Step]) -> Result<BTreeSet<String>, String> {
        run_seen_edges(mutant, steps, &mut Edges::new())
    }

    /// [`run_seen`], moving every arrival at an edge state into `edges`.
    fn run_seen_edges(
        mutant: Mutant,
        steps: &[Step],
        edges: &mut Edges,
    ) -> Result<BTreeSet<String>, String> {
        let mut bench = Bench::new(mutant);
        for (i, step) in steps.iter().enumerate() {
            match catch_unwind(AssertUnwindSafe(|| bench.act(step))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("step {i} ({step:?}): {e}")),
                Err(panic) => {
                    return Err(format!(
                        "step {i} ({step:?}): no_panic: {}",
                        panic_message(panic.as_ref())
                    ));
                }
            }
        }
        edges.absorb(&mut bench.sut.edges);
        bench.sut.svc.take_edges(edges);
        Ok(bench.seen)
    }

    fn run(mutant: Mutant, steps: &[Step]) -> Result<(), String> {
        run_seen(mutant, steps).map(|_| ())
    }

    proptest! {
        // A fixed seed: the same 256 sequences on every run.
        #![proptest_config(Config {
            cases: 256,
            rng_seed: RngSeed::Fixed(0x70c3_5e41),
            failure_persistence: None,
            ..Config::default()
        })]

        #[test]
        fn the_token_service_keeps_its_promises_against_hostile_clients_and_clocks(
            steps in steps()
        ) {
            prop_assert_eq!(run(Mutant::None, &steps), Ok(()));
        }
    }

    // Hand-written traces. `Ix(n)` is the n-th token issued (JWTs and one-time tokens counted
    // separately).

    fn issue(user: u64, ms: u64) -> Step {
        Step::Issue {
            user,
            clock: Clock::At(ms),
        }
    }

    fn verify(n: u16, clock: Clock) -> Step {
        Step::Verify {
            pick: Pick::Honest(Ix(n)),
            clock,
        }
    }

    fn revoke(n: u16, ms: u64) -> Step {
        Step::Revoke {
            pick: Pick::Honest(Ix(n)),
            clock: Clock::At(ms),
        }
    }

    fn issue_once(user: u64, ms: u64) -> Step {
        Step::IssueOnce {
            user,
            b: false,
            clock: Clock::At(ms),
        }
    }

    fn consume(n: u16, user: UserPick, clock: Clock) -> Step {
        Step::Consume {
            token: OncePick::Issued(Ix(n)),
            user,
            clock,
        }
    }

    /// Fires, naming `promise`, on `mutant` and not on the service.
    fn fires(mutant: Mutant, steps: &[Step], promise: &str) {
        assert_eq!(run(Mutant::None, steps), Ok(()), "the service passes");
        let broken = run(mutant, steps).expect_err("the broken variant fails");
        assert!(broken.contains(promise), "{mutant:?}: {broken}");
    }

    #[test]
    fn single_use_fires_on_the_check_then_delete_double_submit() {
        // Two consumes by the owner at one instant: both checks pass before either mark.
        let steps = [
            issue_once(1, 0),
            Step::ConsumePair {
                token: OncePick::Issued(Ix(0)),
                second: UserPick::Owner,
                clock: Clock::At(10),
            },
        ];
        fires(Mutant::CheckThenDelete, &steps, "tokens.single_use");
        // Run one after the other, the flawed consume still refuses the replay.
        let sequential = [
            issue_once(1, 0),
            consume(0, UserPick::Owner, Clock::At(10)),
            consume(0, UserPick::Owner, Clock::Same),
            Step::Restart,
            consume(0, UserPick::Owner, Clock::At(11)),
        ];
        assert_eq!(run(Mutant::CheckThenDelete, &sequential), Ok(()));
    }

    #[test]
    fn revoked_rejected_fires_when_verification_skips_the_revocation_list() {
        let steps = [issue(1, 0), revoke(0, 100), verify(0, Clock::At(200))];
        fires(Mutant::IgnoreRevocation, &steps, "tokens.revoked_rejected");
        // The history checker itself, on a crafted history.
        let h = [
            TokenEvent::RevokeAck {
                jti: "j".to_owned(),
                at: 1,
            },
            TokenEvent::VerifyOk {
                jti: "j".to_owned(),
                invoked_at: 2,
                at: 2,
            },
        ];
        assert!(check_revoked_rejected(&h).is_err());
    }

    #[test]
    fn the_window_check_fires_on_a_leeway_off_by_one_at_either_bound() {
        for bound in [Bound::ExpLeeway, Bound::NbfLeeway] {
            let steps = [issue(1, 500), verify(0, Clock::Own(bound, -1))];
            // exp + leeway - 1 and nbf - leeway - 1: the service accepts the first and refuses
            // the second; at exp + leeway and nbf - leeway, the reverse.
            assert_eq!(run(Mutant::None, &steps), Ok(()));
            let steps = [
                issue(1, 500),
                verify(0, Clock::Own(bound, 0)),
                verify(0, Clock::Own(bound, -1)),
            ];
            fires(Mutant::LeewayOffByOne, &steps, "jwt.window: accepted");
        }
    }

    #[test]
    fn the_authenticity_check_fires_when_the_signature_is_not_checked() {
        for claim in [Claim::Sub, Claim::Exp, Claim::Jti(Ix(1))] {
            let steps = [
                issue(1, 0),
                issue(2, 0),
                Step::Verify {
                    pick: Pick::Forged(Ix(0), Forgery::Claim(claim)),
                    clock: Clock::At(10),
                },
            ];
            fires(Mutant::NoSignatureCheck, &steps, "jwt.authentic");
        }
    }

    #[test]
    fn the_owner_and_window_checks_fire_on_a_careless_store() {
        let foreign = [
            issue_once(1, 0),
            consume(0, UserPick::Other(2), Clock::At(10)),
        ];
        fires(Mutant::IgnoreOwner, &foreign, "once.owner");
        let at_the_end = [
            issue_once(1, 0),
            consume(0, UserPick::Owner, Clock::Own(Bound::OnceEnd, 0)),
        ];
        fires(Mutant::OnceExpiryInclusive, &at_the_end, "once.window");
    }

    #[test]
    fn the_table_checks_fire_when_a_full_table_swallows_a_revocation() {
        // Three live revocations into a table of two: the third must be refused. Swallowed, it
        // is acknowledged but never stored, and its token would pass.
        let mut steps: Vec<Step> = (0..3).map(|n| issue(1, n)).collect();
        steps.extend((0..3).map(|n| revoke(n, 100)));
        fires(Mutant::SwallowFull, &steps, "tables.full_refuses");
        let seen = run_seen(Mutant::None, &steps).unwrap();
        assert!(seen.contains("revocation refused: table full of live revocations"));
    }

    #[test]
    fn the_filter_check_fires_on_a_restart_that_rebuilds_from_a_stale_list() {
        let steps = [issue(1, 0), revoke(0, 100), Step::Restart];
        fires(
            Mutant::StaleRebuild,
            &steps,
            "tables.filter_covers_store: revoked jti",
        );
    }

    #[test]
    fn a_panic_is_reported_as_a_broken_promise() {
        let steps = [Step::Verify {
            pick: Pick::Forged(Ix(0), Forgery::Garbage("..".to_owned())),
            clock: Clock::At(0),
        }];
        fires(
            Mutant::PanicOnRejection,
            &steps,
            "no_panic: a verifier that unwraps",
        );
    }

    #[test]
    fn the_mirror_check_fires_on_a_history_of_a_forgotten_one_time_token() {
        // The store contract itself, on a crafted case: a live token that comes back unknown.
        let mut bench = Bench::new(Mutant::None);
        bench.act(&issue_once(1, 0)).unwrap();
        let token = bench.onces[0].token;
        let err = bench
            .judge_consume(token, UserId(1), T0_MS + 10, Err(OnceRejection::Unknown))
            .unwrap_err();
        assert!(err.contains("tables.no_silent_loss"), "{err}");
        // And a crafted double acceptance.
        let h = [
            TokenEvent::OnceConsumeOk { token, at: 1 },
            TokenEvent::OnceConsumeOk { token, at: 1 },
        ];
        assert!(check_single_use(&h).is_err());
    }

    /// A revocation is forgotten at `exp + leeway` by the reading of the purge (or of a
    /// revocation into a full table), on the assumption that the token fails verification on its
    /// own from then on. A wall clock stepped back below that reading (NTP, an operator, a
    /// restart on another clock) once verified the token again with its revocation gone. The
    /// revocation table's horizon refuses it as `Forgotten`; a verifier blind to the horizon
    /// (`Mutant::BlindHorizon`) accepts the revoked token, and the bench says so.
    #[test]
    fn a_clock_stepped_back_below_a_purge_does_not_revive_a_revoked_jwt() {
        let purge_then_back = [
            issue(1, 0),
            revoke(0, 0),
            Step::Purge {
                clock: Clock::Own(Bound::ExpLeeway, 0),
            },
            verify(0, Clock::Own(Bound::ExpLeeway, -1)),
        ];
        let seen = run_seen(Mutant::None, &purge_then_back).unwrap();
        assert!(seen.contains("honest JWT refused: Forgotten"), "{seen:?}");
        let blind = run_seen(Mutant::BlindHorizon, &purge_then_back).unwrap_err();
        assert!(blind.contains("step 3"), "{blind}");
        assert!(blind.contains("tokens.revoked_rejected"), "{blind}");
        // The same through a full table: the third revocation, at a reading past the first
        // token's exp + leeway, purges the first; the clock steps back and it is refused.
        let mut full_then_back = vec![issue(1, 0), revoke(0, 0)];
        full_then_back.extend((0..2).map(|n| issue(2, 10_000 + n)));
        full_then_back.extend((1..3).map(|n| revoke(n, 10_000)));
        full_then_back.push(verify(0, Clock::At(10)));
        let seen = run_seen(Mutant::None, &full_then_back).unwrap();
        assert!(seen.contains("honest JWT refused: Forgotten"), "{seen:?}");
        let blind = run_seen(Mutant::BlindHorizon, &full_then_back).unwrap_err();
        assert!(blind.contains("tokens.revoked_rejected"), "{blind}");
    }

    /// Same cause: a window's consumed one-time token is purged at a reading at or past the
    /// window's end; a clock stepped back into the window once issued a fresh token for the same
    /// (user, activity, window), and it was accepted: two submits in one window. The one-time
    /// table's horizon refuses the issue.
    #[test]
    fn a_clock_stepped_back_below_a_purge_allows_no_second_submit_in_a_window() {
        let steps = [
            issue_once(1, 0),
            consume(0, UserPick::Owner, Clock::At(10)),
            Step::Purge {
                clock: Clock::Own(Bound::OnceEnd, 0),
            },
            issue_once(1, 20),
            consume(0, UserPick::Owner, Clock::At(30)),
        ];
        let seen = run_seen(Mutant::None, &steps).unwrap();
        assert!(
            seen.contains("one-time issue refused: window forgotten"),
            "{seen:?}"
        );
        assert!(
            seen.contains("one-time consume refused: Unknown"),
            "{seen:?}"
        );
    }

    #[test]
    fn random_hostile_sequences_find_each_broken_variant() {
        // The property above, run as a search: each broken variant is found within 256 cases.
        for mutant in [
            Mutant::CheckThenDelete,
            Mutant::IgnoreRevocation,
            Mutant::LeewayOffByOne,
            Mutant::NoSignatureCheck,
            Mutant::IgnoreOwner,
            Mutant::OnceExpiryInclusive,
            Mutant::SwallowFull,
            Mutant::StaleRebuild,
            Mutant::PanicOnRejection,
            Mutant::BlindHorizon,
        ] {
            let config = Config {
                cases: 256,
                failure_persistence: None,
                ..Config::default()
            };
            let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
            let mut runner = TestRunner::new_with_rng(config, rng);
            let found = runner.run(&steps(), |steps| {
                run(mutant, &steps).map_err(TestCaseError::fail)
            });
            assert!(found.is_err(), "{mutant:?} survived 256 hostile sequences");
        }
    }

    #[test]
    fn the_hostile_sequences_reach_every_token_edge_state() {
        // Not vacuous: 256 generated sequences against the service reach each of the token
        // machine's edge states and the hostile situations the promises are about.
        let mut runner = TestRunner::deterministic();
        let strategy = steps();
        let mut reached = Edges::new();
        let mut seen = BTreeSet::new();
        for _ in 0..256 {
            let steps = strategy.new_tree(&mut runner).unwrap().current();
            seen.extend(run_seen_edges(Mutant::None, &steps, &mut reached).unwrap());
        }
        let edges = reached.take();
        for edge in sut::token::EDGES {
            assert!(
                edges.get(edge.name).copied().unwrap_or(0) > 0,
                "never reached {}: {edges:?}",
                edge.name
            );
        }
        for what in [
            "JWT accepted past exp, within leeway",
            "JWT accepted before nbf, within leeway",
            "JWT refused at exactly exp + leeway",
            "JWT refused at exactly nbf - leeway - 1",
            "honest JWT refused: Revoked",
            "honest JWT refused: Expired",
            "honest JWT refused: NotYetValid",
            "honest JWT refused: Forgotten",
            "forged JWT refused: BadSignature",
            "forged JWT refused: AlgNone",
            "forged JWT refused: AlgMismatch",
            "forged JWT refused: UnknownKey",
            "forged JWT refused: WrongIssuer",
            "forged JWT refused: Malformed",
            "forged JWT's revocation refused: BadSignature",
            "revocation Revoked",
            "revocation AlreadyRevoked",
            "revocation refused: table full of live revocations",
            "one-time issue refused: table full of live tokens",
            "one-time issue refused: window forgotten",
            "one-time token re-read (consumed: true)",
            "one-time consume refused: Unknown",
            "one-time consume refused: Foreign",
            "one-time consume refused: AlreadyConsumed",
            "one-time consume refused: Expired",
            "one-time token accepted in its window's last millisecond",
            "purge removed revocations",
            "purge removed one-time tokens",
            "restart over live revocations",
        ] {
            assert!(seen.contains(what), "never reached: {what}\n{seen:#?}");
        }
    }

    /// The filter-capacity check fires on a filter that keeps filling without a reload, and
    /// counts from zero again after one.
    #[test]
    fn the_filter_capacity_check_catches_a_filter_never_reloaded() {
        let mut sut = Sut::new(Mutant::None);
        let capacity = sut.svc.config().revocation.capacity;
        for _ in 0..capacity {
            assert_eq!(sut.filter_within_capacity(true), Ok(()));
        }
        let e = sut.filter_within_capacity(true).unwrap_err();
        assert!(e.contains("revocation.filter_capacity"), "{e}");
        sut.rebuilds_seen -= 1;
        assert_eq!(
            sut.filter_within_capacity(true),
            Ok(()),
            "a reload was seen"
        );
        assert_eq!(sut.added_since_rebuild, 1);
    }

    #[test]
    fn the_revocation_counter_check_catches_a_lookup_counted_wrong() {
        let before = RevocationStats::default();
        let accepted: Result<Claims, Rejection> = Err(Rejection::BadSignature);
        assert_eq!(revocation_counted(&before, &before, &accepted), Ok(()));
        let looked = RevocationStats {
            exact_lookups: 1,
            ..before
        };
        let e = revocation_counted(&before, &looked, &accepted).unwrap_err();
        assert!(e.contains("revocation.counted"), "{e}");
        let revoked = Err(Rejection::Revoked);
        let e = revocation_counted(&before, &looked, &revoked).unwrap_err();
        assert!(e.contains("revocation.counted"), "no hit counted: {e}");
        let hit = RevocationStats {
            exact_hits: 1,
            ..looked
        };
        assert_eq!(revocation_counted(&before, &hit, &revoked), Ok(()));
    }

    /// Once found by the property test above (kept in its regressions file while it had one):
    /// a verification at the far end of the clock, then one-time tokens issued around it.
    #[test]
    fn a_verification_at_the_end_of_time_then_one_time_tokens() {
        let steps = [
            Step::Verify {
                pick: Pick::Honest(Ix(0)),
                clock: Clock::Abs(18_446_744_073_709_551_000),
            },
            Step::Issue {
                user: 1,
                clock: Clock::Same,
            },
            issue_once(1, 0),
            Step::IssueOnce {
                user: 2,
                b: false,
                clock: Clock::Own(Bound::Exp, 0),
            },
            Step::IssueOnce {
                user: 1,
                b: true,
                clock: Clock::Same,
            },
            issue_once(1, 4_000),
            Step::IssueOnce {
                user: 3,
                b: false,
                clock: Clock::Own(Bound::Exp, 0),
            },
        ];
        assert_eq!(run(Mutant::None, &steps), Ok(()));
    }
}
