//! Hostile tokens against `sut::token::jwt::verify` (issue #10): `alg: none`, algorithm
//! switches between HMAC and asymmetric algorithms, another key, truncated or padded base64,
//! huge headers, and clock edges (`exp == now`, `nbf` ahead of a skewed verifier). Every
//! rejection must be the specific [`Rejection`], never a panic, never an acceptance.

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
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

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
