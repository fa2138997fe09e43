//! Issuing and verifying JWTs (RFC 7519, JWS compact form), the ID, token and lottery design
//! §3.1 (docs/sources.md).
//!
//! The signature itself is checked by the `jsonwebtoken` crate (pure-Rust `rust_crypto`
//! backend). Everything else is checked here, because the library's own `exp`/`nbf` validation
//! reads the system clock and because the bench wants a distinct [`Rejection`] per attack:
//!
//! 1. length bound ([`JwtConfig::token_len_max_bytes`]) before any parsing;
//! 2. shape (three non-empty segments) and base64url of each segment;
//! 3. header: `alg: none` in any letter case is [`Rejection::AlgNone`]; any other algorithm than
//!    the configured one (e.g. `RS256` or `HS384` against an HS256 key: "algorithm confusion")
//!    is [`Rejection::AlgMismatch`]; a `kid` other than the key's is [`Rejection::UnknownKey`];
//! 4. signature (library) — a tampered token, or one signed by another secret under the same
//!    `kid`, is [`Rejection::BadSignature`]: HMAC cannot tell those two apart;
//! 5. claims (all seven required), then issuer, audience, `exp`, `nbf`.
//!
//! Times: JWT `NumericDate`s are whole seconds; comparisons happen in milliseconds against
//! `now.wall_ms` with [`JwtConfig::leeway_ms`]. A token is **expired when
//! `now_ms >= exp_ms + leeway_ms`** — so with zero leeway `exp == now` is expired, as RFC 7519
//! §4.1.4 says ("the current date/time MUST be before the expiration date/time") — and **not yet
//! valid when `now_ms + leeway_ms < nbf_ms`** (RFC 7519 §4.1.5: valid "on or after" `nbf`).

use crate::clock::Now;
use crate::edge::Edges;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Shortest accepted HMAC secret, in bytes (RFC 7518 §3.2: at least the hash output size; 32
/// bytes for HS256, and we ask it of every algorithm).
pub const SECRET_LEN_MIN_BYTES: usize = 32;

/// The signing algorithms the bench configures: HMAC with a shared secret.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum JwtAlgorithm {
    /// HMAC-SHA-256 (the default).
    #[default]
    HS256,
    /// HMAC-SHA-384.
    HS384,
    /// HMAC-SHA-512.
    HS512,
}

impl JwtAlgorithm {
    /// The header's `alg` value.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::HS256 => "HS256",
            Self::HS384 => "HS384",
            Self::HS512 => "HS512",
        }
    }

    const fn library(self) -> jsonwebtoken::Algorithm {
        match self {
            Self::HS256 => jsonwebtoken::Algorithm::HS256,
            Self::HS384 => jsonwebtoken::Algorithm::HS384,
            Self::HS512 => jsonwebtoken::Algorithm::HS512,
        }
    }
}

impl fmt::Display for JwtAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An HMAC secret with its key id (`kid`). `Debug` prints the key id only: the secret never
/// reaches a log.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SigningKey {
    kid: String,
    secret: Vec<u8>,
}

impl SigningKey {
    /// A key, or an error if the secret is shorter than [`SECRET_LEN_MIN_BYTES`], the key id is
    /// empty, or the build has no usable crypto backend (which would otherwise panic inside the
    /// library at the first signature).
    pub fn new(kid: impl Into<String>, secret: impl Into<Vec<u8>>) -> Result<Self, JwtError> {
        let kid = kid.into();
        let secret = secret.into();
        if kid.is_empty() {
            return Err(JwtError::EmptyKeyId);
        }
        if secret.len() < SECRET_LEN_MIN_BYTES {
            return Err(JwtError::SecretTooShort {
                len_bytes: secret.len(),
                min_bytes: SECRET_LEN_MIN_BYTES,
            });
        }
        if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
            return Err(JwtError::NoCryptoBackend);
        }
        Ok(Self { kid, secret })
    }

    /// The key id written into each token's header.
    #[must_use]
    pub fn kid(&self) -> &str {
        &self.kid
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// How tokens are issued and what verification accepts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JwtConfig {
    /// The one algorithm accepted (and used to sign).
    pub algorithm: JwtAlgorithm,
    /// `iss` written and required.
    pub issuer: String,
    /// `aud` written and required (a single string; a token with an audience array is rejected
    /// as malformed).
    pub audience: String,
    /// Lifetime of an issued token, in whole seconds (`exp = iat + ttl_s`).
    pub ttl_s: u64,
    /// Clock-skew allowance for `exp` and `nbf`, in milliseconds.
    pub leeway_ms: u64,
    /// Longest token accepted, in bytes, checked before any decoding.
    pub token_len_max_bytes: usize,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            algorithm: JwtAlgorithm::HS256,
            issuer: "sut".to_owned(),
            audience: "sut".to_owned(),
            ttl_s: 3600,
            leeway_ms: 5_000,
            token_len_max_bytes: 4096,
        }
    }
}

/// The claims every token carries (all required). Times are RFC 7519 `NumericDate`s: seconds
/// since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Claims {
    /// Token id, unique per token: the revocation key.
    pub jti: String,
    /// Subject: the user, as decimal text of a [`UserId`](super::UserId).
    pub sub: String,
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// Expiry, seconds.
    pub exp: u64,
    /// Not before, seconds.
    pub nbf: u64,
    /// Issued at, seconds.
    pub iat: u64,
}

impl Claims {
    /// `exp` in milliseconds.
    #[must_use]
    pub const fn exp_ms(&self) -> u64 {
        self.exp.saturating_mul(1000)
    }

    /// `nbf` in milliseconds.
    #[must_use]
    pub const fn nbf_ms(&self) -> u64 {
        self.nbf.saturating_mul(1000)
    }
}

/// A freshly issued token and its claims. `Debug` shows the claims and the token's length, not
/// the token: it is a bearer credential.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IssuedJwt {
    /// The compact JWS: `header.payload.signature`.
    pub token: String,
    /// What it says.
    pub claims: Claims,
}

impl fmt::Debug for IssuedJwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedJwt")
            .field(
                "token",
                &format_args!("<redacted {} bytes>", self.token.len()),
            )
            .field("claims", &self.claims)
            .finish()
    }
}

/// Failures to build a key or to issue a token (never a rejection of someone else's token).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// The HMAC secret is too short.
    #[error("secret of {len_bytes} bytes is shorter than the {min_bytes} bytes required")]
    SecretTooShort {
        /// Its length.
        len_bytes: usize,
        /// The minimum.
        min_bytes: usize,
    },
    /// The key id is empty.
    #[error("empty key id")]
    EmptyKeyId,
    /// `jsonwebtoken` was built without exactly one crypto backend feature.
    #[error("jsonwebtoken has no crypto backend (enable exactly one of rust_crypto/aws_lc_rs)")]
    NoCryptoBackend,
    /// The library failed to sign (its message, never the secret).
    #[error("signing failed: {0}")]
    Signing(String),
    /// The issued token would exceed the configured length bound, so nobody could verify it.
    #[error("issued token of {len_bytes} bytes exceeds the bound of {max_bytes} bytes")]
    TooLong {
        /// Its length.
        len_bytes: usize,
        /// The bound.
        max_bytes: usize,
    },
}

/// Which part of a token failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MalformedPart {
    /// Not three non-empty dot-separated segments.
    Shape,
    /// The header segment is not base64url.
    HeaderBase64,
    /// The header is not a JSON object with a string `alg`.
    HeaderJson,
    /// The payload segment is not base64url.
    PayloadBase64,
    /// The payload is not a JSON object with all seven claims of the right types.
    Claims,
    /// The signature segment is not base64url.
    SignatureBase64,
}

impl fmt::Display for MalformedPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Shape => "shape (want three dot-separated segments)",
            Self::HeaderBase64 => "header base64url",
            Self::HeaderJson => "header JSON",
            Self::PayloadBase64 => "payload base64url",
            Self::Claims => "claims",
            Self::SignatureBase64 => "signature base64url",
        })
    }
}

/// Why a token was not accepted. One variant per attack the bench tries; the messages never
/// include the token or a secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Rejection {
    /// Longer than [`JwtConfig::token_len_max_bytes`]; nothing was decoded.
    #[error("token of {len_bytes} bytes exceeds the bound of {max_bytes} bytes")]
    TooLong {
        /// Its length.
        len_bytes: usize,
        /// The bound.
        max_bytes: usize,
    },
    /// A part failed to decode.
    #[error("malformed token: {0}")]
    Malformed(MalformedPart),
    /// The header says `alg: none` (unsigned token).
    #[error("unsigned token (alg none)")]
    AlgNone,
    /// The header names another algorithm than the configured one (algorithm confusion).
    #[error("algorithm {found:?} is not the configured {expected}")]
    AlgMismatch {
        /// The configured algorithm.
        expected: JwtAlgorithm,
        /// The header's `alg`, truncated to 16 bytes.
        found: String,
    },
    /// The header's `kid` is missing or names another key.
    #[error("unknown key id {found:?}")]
    UnknownKey {
        /// The header's `kid`, truncated to 64 bytes.
        found: Option<String>,
    },
    /// The signature does not match (tampered token, or another secret under the same key id).
    #[error("bad signature")]
    BadSignature,
    /// `iss` is not the configured issuer.
    #[error("wrong issuer")]
    WrongIssuer,
    /// `aud` is not the configured audience.
    #[error("wrong audience")]
    WrongAudience,
    /// `now_ms >= exp_ms + leeway_ms`.
    #[error("expired at {exp_ms} ms (now {now_ms} ms)")]
    Expired {
        /// The token's `exp`, in ms.
        exp_ms: u64,
        /// The node's wall clock.
        now_ms: u64,
    },
    /// Its revocation window (`exp_ms + leeway_ms`) ended at or before a time up to which the
    /// revocation list has already purged revocations: the clock is behind an earlier purge,
    /// and the token's revocation, if it had one, may be among those forgotten. Refused as
    /// expired.
    #[error(
        "expired: valid until {keep_until_ms} ms, and the revocation list has purged up to \
         {forgotten_until_ms} ms (the clock is behind an earlier purge)"
    )]
    Forgotten {
        /// `exp_ms + leeway_ms`.
        keep_until_ms: u64,
        /// The store's [`Forgotten::revocations_until_ms`](super::store::Forgotten).
        forgotten_until_ms: u64,
    },
    /// `now_ms + leeway_ms < nbf_ms`.
    #[error("not valid before {nbf_ms} ms (now {now_ms} ms)")]
    NotYetValid {
        /// The token's `nbf`, in ms.
        nbf_ms: u64,
        /// The node's wall clock.
        now_ms: u64,
    },
    /// Valid, but its `jti` is on the revocation list.
    #[error("revoked")]
    Revoked,
    /// The revocation store could not be read; the token is refused (fail closed).
    #[error("revocation store unavailable: {0}")]
    StoreUnavailable(String),
}

#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

fn truncated(s: &str, max_bytes: usize) -> String {
    let mut end = s.len().min(max_bytes);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Issue a token for `subject` whose `jti` is the caller's random `nonce` (hex, 32 digits),
/// valid from `now` (rounded down to the second) for [`JwtConfig::ttl_s`].
pub fn issue(
    key: &SigningKey,
    cfg: &JwtConfig,
    subject: super::UserId,
    nonce: u128,
    now: Now,
) -> Result<IssuedJwt, JwtError> {
    let iat = now.wall_ms / 1000;
    let claims = Claims {
        jti: format!("{nonce:032x}"),
        sub: subject.to_string(),
        iss: cfg.issuer.clone(),
        aud: cfg.audience.clone(),
        exp: iat.saturating_add(cfg.ttl_s),
        nbf: iat,
        iat,
    };
    let mut header = jsonwebtoken::Header::new(cfg.algorithm.library());
    header.kid = Some(key.kid.clone());
    let enc = jsonwebtoken::EncodingKey::from_secret(&key.secret)
        .map_err(|e| JwtError::Signing(e.to_string()))?;
    let token = jsonwebtoken::encode(&header, &claims, &enc)
        .map_err(|e| JwtError::Signing(e.to_string()))?;
    if token.len() > cfg.token_len_max_bytes {
        return Err(JwtError::TooLong {
            len_bytes: token.len(),
            max_bytes: cfg.token_len_max_bytes,
        });
    }
    Ok(IssuedJwt { token, claims })
}

/// Verify a token's form, algorithm, key, signature, issuer, audience and validity window at
/// `now`. Does **not** consult the revocation list (see
/// [`Revocations`](super::Revocations) and [`TokenService::verify`](super::TokenService::verify)).
pub fn verify(
    key: &SigningKey,
    cfg: &JwtConfig,
    token: &str,
    now: Now,
) -> Result<Claims, Rejection> {
    verify_counting(key, cfg, token, now, &mut Edges::default())
}

/// [`verify`], counting its edge states (a token let through by the leeway alone, one refused
/// past it) into `edges`.
pub fn verify_counting(
    key: &SigningKey,
    cfg: &JwtConfig,
    token: &str,
    now: Now,
    edges: &mut Edges,
) -> Result<Claims, Rejection> {
    let claims = signed_token_claims(key, cfg, token)?;
    check_claims(cfg, claims, now, edges)
}

/// What [`verify_counting`] checks before the clock: the token's length, form, header and
/// signature, and the claims it carries. A pure function of its arguments.
fn signed_token_claims(
    key: &SigningKey,
    cfg: &JwtConfig,
    token: &str,
) -> Result<Claims, Rejection> {
    if token.len() > cfg.token_len_max_bytes {
        return Err(Rejection::TooLong {
            len_bytes: token.len(),
            max_bytes: cfg.token_len_max_bytes,
        });
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(sig_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Rejection::Malformed(MalformedPart::Shape));
    };
    if header_b64.is_empty() {
        return Err(Rejection::Malformed(MalformedPart::Shape));
    }
    let header = checked_header(key, cfg, header_b64)?;
    if payload_b64.is_empty() || sig_b64.is_empty() {
        return Err(Rejection::Malformed(MalformedPart::Shape));
    }
    URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| Rejection::Malformed(MalformedPart::SignatureBase64))?;
    URL_SAFE_NO_PAD
        .decode(payload_b64)
        .map_err(|_| Rejection::Malformed(MalformedPart::PayloadBase64))?;
    signed_claims(key, cfg, token, &header)
}

/// The claims of tokens whose form, header and signature this key has already checked (or which
/// it issued itself), by token: [`verify_counting`] without the decoding and the HMAC for a
/// token seen before. That part of a verification is a pure function of the key, the
/// configuration and the token's bytes, so a hit answers exactly what a full verification would;
/// the checks against the clock ([`check_claims`]) run every time.
///
/// A ghost, like [`Edges`]: never part of the owner's state (every two are equal, none hashes
/// anything, a clone starts empty). Holds at most [`CheckedTokens::ENTRIES_MAX`] tokens and
/// forgets them all when full. Only accepted tokens are kept: a rejected one is checked again.
#[derive(Default)]
pub struct CheckedTokens(std::collections::HashMap<String, Claims>);

impl CheckedTokens {
    /// Most tokens held.
    pub const ENTRIES_MAX: usize = 4096;

    /// [`verify_counting`], the signed part answered from the tokens checked before.
    pub fn verify_counting(
        &mut self,
        key: &SigningKey,
        cfg: &JwtConfig,
        token: &str,
        now: Now,
        edges: &mut Edges,
    ) -> Result<Claims, Rejection> {
        let claims = match self.0.get(token) {
            Some(claims) => claims.clone(),
            None => {
                let claims = signed_token_claims(key, cfg, token)?;
                self.remember(token, &claims);
                claims
            }
        };
        check_claims(cfg, claims, now, edges)
    }

    /// Remembers a token this key has just issued: it verifies (revocation aside) to its claims.
    pub fn issued(&mut self, key: &SigningKey, cfg: &JwtConfig, jwt: &IssuedJwt) {
        debug_assert_eq!(
            signed_token_claims(key, cfg, &jwt.token).as_ref(),
            Ok(&jwt.claims),
            "an issued token verifies to its claims"
        );
        self.remember(&jwt.token, &jwt.claims);
    }

    /// How many tokens are held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn remember(&mut self, token: &str, claims: &Claims) {
        if self.0.len() >= Self::ENTRIES_MAX {
            self.0.clear();
        }
        self.0.insert(token.to_owned(), claims.clone());
    }
}

impl Clone for CheckedTokens {
    /// Empty: a clone checks its own tokens.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for CheckedTokens {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for CheckedTokens {}

impl std::hash::Hash for CheckedTokens {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl fmt::Debug for CheckedTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CheckedTokens({} tokens)", self.0.len())
    }
}

/// The decoded header, if it names the configured algorithm and this key.
fn checked_header(
    key: &SigningKey,
    cfg: &JwtConfig,
    header_b64: &str,
) -> Result<RawHeader, Rejection> {
    let header_json = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| Rejection::Malformed(MalformedPart::HeaderBase64))?;
    // Through `Value` first: its parser bounds nesting (128 levels) as the library's header
    // parser does, so a header nested too deep is a header error here rather than passing
    // this check and failing later inside the library (found by tests/token_hostile.rs).
    // A duplicate `alg` or `kid` is refused by the typed parse (which `Value` would hide).
    serde_json::from_slice::<serde_json::Value>(&header_json)
        .map_err(|_| Rejection::Malformed(MalformedPart::HeaderJson))?;
    let header: RawHeader = serde_json::from_slice(&header_json)
        .map_err(|_| Rejection::Malformed(MalformedPart::HeaderJson))?;
    if header.alg.eq_ignore_ascii_case("none") {
        return Err(Rejection::AlgNone);
    }
    if header.alg != cfg.algorithm.name() {
        return Err(Rejection::AlgMismatch {
            expected: cfg.algorithm,
            found: truncated(&header.alg, 16),
        });
    }
    if header.kid.as_deref() != Some(key.kid.as_str()) {
        return Err(Rejection::UnknownKey {
            found: header.kid.as_deref().map(|k| truncated(k, 64)),
        });
    }
    Ok(header)
}

/// The claims, once the library has checked the signature (and parsed them).
fn signed_claims(
    key: &SigningKey,
    cfg: &JwtConfig,
    token: &str,
    header: &RawHeader,
) -> Result<Claims, Rejection> {
    // The library checks the signature before it parses the claims; its clock-based checks
    // are all off (`check_claims` checks times against `now`).
    let mut validation = jsonwebtoken::Validation::new(cfg.algorithm.library());
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.leeway = 0;
    let dec =
        jsonwebtoken::DecodingKey::from_secret(&key.secret).map_err(|_| Rejection::BadSignature)?;
    let data = jsonwebtoken::decode::<Claims>(token, &dec, &validation).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidSignature => Rejection::BadSignature,
            K::InvalidAlgorithm => Rejection::AlgMismatch {
                expected: cfg.algorithm,
                found: truncated(&header.alg, 16),
            },
            K::Base64(_) => Rejection::Malformed(MalformedPart::PayloadBase64),
            K::InvalidToken => Rejection::Malformed(MalformedPart::Shape),
            // JSON, UTF-8 and claim-format errors: the signature was good, the claims are not.
            _ => Rejection::Malformed(MalformedPart::Claims),
        }
    })?;
    Ok(data.claims)
}

/// Issuer, audience and validity window at `now`.
fn check_claims(
    cfg: &JwtConfig,
    claims: Claims,
    now: Now,
    edges: &mut Edges,
) -> Result<Claims, Rejection> {
    if claims.iss != cfg.issuer {
        return Err(Rejection::WrongIssuer);
    }
    if claims.aud != cfg.audience {
        return Err(Rejection::WrongAudience);
    }
    let now_ms = now.wall_ms;
    if now_ms >= claims.exp_ms().saturating_add(cfg.leeway_ms) {
        edges.reach(&super::JWT_REFUSED_PAST_LEEWAY);
        return Err(Rejection::Expired {
            exp_ms: claims.exp_ms(),
            now_ms,
        });
    }
    if now_ms.saturating_add(cfg.leeway_ms) < claims.nbf_ms() {
        edges.reach(&super::JWT_REFUSED_PAST_LEEWAY);
        return Err(Rejection::NotYetValid {
            nbf_ms: claims.nbf_ms(),
            now_ms,
        });
    }
    // Accepted, but outside [nbf, exp) on this clock: only the leeway let it through.
    edges.reach_if(
        now_ms >= claims.exp_ms() || now_ms < claims.nbf_ms(),
        &super::JWT_WITHIN_LEEWAY,
    );
    Ok(claims)
}

/// The `jti` a token *claims*, read without checking anything: for logs and histories only,
/// never for a decision. `None` when the token is not even shaped like a JWT.
#[must_use]
pub fn unverified_jti(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct JtiOnly {
        jti: String,
    }
    let payload_b64 = token.split('.').nth(1)?;
    let payload = URL_SAFE_NO_PAD.decode(payload_b64).ok()?;
    serde_json::from_slice::<JtiOnly>(&payload)
        .ok()
        .map(|p| p.jti)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::UserId;

    const T0_MS: u64 = 1_717_036_800_000;

    fn key() -> SigningKey {
        SigningKey::new("k1", *b"0123456789abcdef0123456789abcdef").unwrap()
    }

    fn cfg() -> JwtConfig {
        JwtConfig {
            leeway_ms: 0,
            ttl_s: 60,
            ..JwtConfig::default()
        }
    }

    fn good() -> IssuedJwt {
        issue(&key(), &cfg(), UserId(10086), 0xfeed, Now::both(T0_MS)).unwrap()
    }

    fn b64(json: &str) -> String {
        URL_SAFE_NO_PAD.encode(json)
    }

    fn with_header(token: &str, header_json: &str) -> String {
        let mut parts: Vec<&str> = token.split('.').collect();
        let h = b64(header_json);
        parts[0] = &h;
        parts.join(".")
    }

    #[test]
    fn issued_token_verifies_and_round_trips_claims() {
        let t = good();
        let c = verify(&key(), &cfg(), &t.token, Now::both(T0_MS + 1)).unwrap();
        assert_eq!(c, t.claims);
        assert_eq!(c.jti, "0000000000000000000000000000feed");
        assert_eq!(c.sub, "10086");
        assert_eq!(c.exp, T0_MS / 1000 + 60);
        assert_eq!(c.nbf, T0_MS / 1000);
    }

    #[test]
    fn debug_of_key_redacts_the_secret() {
        let shown = format!("{:?} {:#?}", key(), key());
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert!(shown.contains("k1"));
    }

    #[test]
    fn debug_of_an_issued_token_hides_the_token() {
        let t = good();
        let shown = format!("{t:?}");
        assert!(!shown.contains(&t.token), "{shown}");
        assert!(shown.contains(&t.claims.jti));
    }

    #[test]
    fn short_secret_and_empty_kid_are_refused() {
        assert_eq!(
            SigningKey::new("k", vec![0u8; 31]).unwrap_err(),
            JwtError::SecretTooShort {
                len_bytes: 31,
                min_bytes: 32
            }
        );
        assert_eq!(
            SigningKey::new("", vec![0u8; 32]).unwrap_err(),
            JwtError::EmptyKeyId
        );
    }

    #[test]
    fn alg_none_is_rejected_in_any_case() {
        let t = good();
        for alg in ["none", "None", "NONE"] {
            let forged = with_header(
                &t.token,
                &format!(r#"{{"typ":"JWT","alg":"{alg}","kid":"k1"}}"#),
            );
            assert_eq!(
                verify(&key(), &cfg(), &forged, Now::both(T0_MS)),
                Err(Rejection::AlgNone)
            );
            // The classic form: header `alg: none` and an empty signature segment.
            let unsigned = format!(
                "{}.{}.",
                b64(&format!(r#"{{"alg":"{alg}"}}"#)),
                t.token.split('.').nth(1).unwrap()
            );
            assert_eq!(
                verify(&key(), &cfg(), &unsigned, Now::both(T0_MS)),
                Err(Rejection::AlgNone)
            );
        }
    }

    #[test]
    fn algorithm_confusion_is_rejected() {
        let t = good();
        for alg in ["RS256", "HS384", "HS512", "ES256", "hs256"] {
            let forged = with_header(&t.token, &format!(r#"{{"alg":"{alg}","kid":"k1"}}"#));
            assert_eq!(
                verify(&key(), &cfg(), &forged, Now::both(T0_MS)),
                Err(Rejection::AlgMismatch {
                    expected: JwtAlgorithm::HS256,
                    found: alg.to_owned()
                })
            );
        }
        // A genuine HS384 token under the same secret is refused by an HS256 verifier.
        let c384 = JwtConfig {
            algorithm: JwtAlgorithm::HS384,
            ..cfg()
        };
        let t384 = issue(&key(), &c384, UserId(1), 1, Now::both(T0_MS)).unwrap();
        assert!(verify(&key(), &c384, &t384.token, Now::both(T0_MS)).is_ok());
        assert!(matches!(
            verify(&key(), &cfg(), &t384.token, Now::both(T0_MS)),
            Err(Rejection::AlgMismatch { .. })
        ));
    }

    #[test]
    fn tampered_payload_or_signature_is_a_bad_signature() {
        let t = good();
        let parts: Vec<&str> = t.token.split('.').collect();
        let evil_claims = Claims {
            sub: "1".to_owned(),
            ..t.claims.clone()
        };
        let evil = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&evil_claims).unwrap()),
            parts[2]
        );
        assert_eq!(
            verify(&key(), &cfg(), &evil, Now::both(T0_MS)),
            Err(Rejection::BadSignature)
        );

        let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        sig[0] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(&sig));
        assert_eq!(
            verify(&key(), &cfg(), &flipped, Now::both(T0_MS)),
            Err(Rejection::BadSignature)
        );
    }

    #[test]
    fn another_key_is_rejected() {
        let other_same_kid = SigningKey::new("k1", vec![7u8; 32]).unwrap();
        let t = issue(&other_same_kid, &cfg(), UserId(1), 1, Now::both(T0_MS)).unwrap();
        assert_eq!(
            verify(&key(), &cfg(), &t.token, Now::both(T0_MS)),
            Err(Rejection::BadSignature)
        );

        let other_kid = SigningKey::new("k2", vec![7u8; 32]).unwrap();
        let t = issue(&other_kid, &cfg(), UserId(1), 1, Now::both(T0_MS)).unwrap();
        assert_eq!(
            verify(&key(), &cfg(), &t.token, Now::both(T0_MS)),
            Err(Rejection::UnknownKey {
                found: Some("k2".to_owned())
            })
        );
        let no_kid = with_header(&good().token, r#"{"alg":"HS256"}"#);
        assert_eq!(
            verify(&key(), &cfg(), &no_kid, Now::both(T0_MS)),
            Err(Rejection::UnknownKey { found: None })
        );
    }

    #[test]
    fn wrong_issuer_and_audience_are_rejected() {
        let iss = issue(
            &key(),
            &JwtConfig {
                issuer: "evil".to_owned(),
                ..cfg()
            },
            UserId(1),
            1,
            Now::both(T0_MS),
        )
        .unwrap();
        assert_eq!(
            verify(&key(), &cfg(), &iss.token, Now::both(T0_MS)),
            Err(Rejection::WrongIssuer)
        );
        let aud = issue(
            &key(),
            &JwtConfig {
                audience: "other".to_owned(),
                ..cfg()
            },
            UserId(1),
            1,
            Now::both(T0_MS),
        )
        .unwrap();
        assert_eq!(
            verify(&key(), &cfg(), &aud.token, Now::both(T0_MS)),
            Err(Rejection::WrongAudience)
        );
    }

    #[test]
    fn expiry_is_judged_by_the_given_now_and_exp_equal_now_is_expired() {
        let t = good();
        let exp_ms = t.claims.exp_ms();
        assert!(verify(&key(), &cfg(), &t.token, Now::both(exp_ms - 1)).is_ok());
        assert_eq!(
            verify(&key(), &cfg(), &t.token, Now::both(exp_ms)),
            Err(Rejection::Expired {
                exp_ms,
                now_ms: exp_ms
            })
        );
        // Leeway extends it by exactly leeway_ms.
        let lee = JwtConfig {
            leeway_ms: 2_000,
            ..cfg()
        };
        assert!(verify(&key(), &lee, &t.token, Now::both(exp_ms + 1_999)).is_ok());
        assert!(matches!(
            verify(&key(), &lee, &t.token, Now::both(exp_ms + 2_000)),
            Err(Rejection::Expired { .. })
        ));
        // Only the wall clock counts.
        let now = Now {
            wall_ms: exp_ms,
            mono_ms: 0,
        };
        assert!(matches!(
            verify(&key(), &cfg(), &t.token, now),
            Err(Rejection::Expired { .. })
        ));
    }

    #[test]
    fn not_yet_valid_is_rejected_with_leeway() {
        let t = good();
        let nbf_ms = t.claims.nbf_ms();
        assert_eq!(
            verify(&key(), &cfg(), &t.token, Now::both(nbf_ms - 1)),
            Err(Rejection::NotYetValid {
                nbf_ms,
                now_ms: nbf_ms - 1
            })
        );
        assert!(verify(&key(), &cfg(), &t.token, Now::both(nbf_ms)).is_ok());
        let lee = JwtConfig {
            leeway_ms: 2_000,
            ..cfg()
        };
        assert!(verify(&key(), &lee, &t.token, Now::both(nbf_ms - 2_000)).is_ok());
        assert!(matches!(
            verify(&key(), &lee, &t.token, Now::both(nbf_ms - 2_001)),
            Err(Rejection::NotYetValid { .. })
        ));
    }

    #[test]
    fn the_leeway_bounds_are_edge_states() {
        use crate::token::{JWT_REFUSED_PAST_LEEWAY, JWT_WITHIN_LEEWAY};
        let t = good();
        let (exp_ms, nbf_ms) = (t.claims.exp_ms(), t.claims.nbf_ms());
        let lee = JwtConfig {
            leeway_ms: 2_000,
            ..cfg()
        };
        let at = |now_ms| {
            let mut edges = Edges::new();
            let verdict = verify_counting(&key(), &lee, &t.token, Now::both(now_ms), &mut edges);
            (verdict.is_ok(), edges.take())
        };
        // Inside [nbf, exp): neither.
        let (ok, edges) = at(nbf_ms + 1);
        assert!(ok && edges.is_empty(), "{edges:?}");
        // Accepted only by the leeway, on either side, up to the bound.
        for now_ms in [exp_ms, exp_ms + 1_999, nbf_ms - 1, nbf_ms - 2_000] {
            let (ok, edges) = at(now_ms);
            assert!(ok, "accepted at {now_ms}");
            assert_eq!(edges.get(JWT_WITHIN_LEEWAY.name), Some(&1), "{now_ms}");
            assert!(!edges.contains_key(JWT_REFUSED_PAST_LEEWAY.name));
        }
        // One millisecond past the bound, on either side: refused.
        for now_ms in [exp_ms + 2_000, nbf_ms - 2_001] {
            let (ok, edges) = at(now_ms);
            assert!(!ok, "refused at {now_ms}");
            assert_eq!(
                edges.get(JWT_REFUSED_PAST_LEEWAY.name),
                Some(&1),
                "{now_ms}"
            );
            assert!(!edges.contains_key(JWT_WITHIN_LEEWAY.name));
        }
    }

    #[test]
    fn malformed_and_truncated_tokens_are_rejected_by_part() {
        let t = good();
        let parts: Vec<&str> = t.token.split('.').collect();
        let now = Now::both(T0_MS);
        let m = |p| Err(Rejection::Malformed(p));
        assert_eq!(verify(&key(), &cfg(), "", now), m(MalformedPart::Shape));
        assert_eq!(verify(&key(), &cfg(), "a.b", now), m(MalformedPart::Shape));
        assert_eq!(
            verify(&key(), &cfg(), &format!("{}.x", t.token), now),
            m(MalformedPart::Shape)
        );
        assert_eq!(
            verify(&key(), &cfg(), &format!("{}.{}.", parts[0], parts[1]), now),
            m(MalformedPart::Shape)
        );
        // Truncated: the signature segment cut to a length that is not valid base64url.
        let cut_by = match (parts[2].len() + 3) % 4 {
            0 => 4,
            n => n,
        };
        let cut = &t.token[..t.token.len() - cut_by];
        let cut_sig = cut.rsplit('.').next().unwrap();
        assert_eq!(
            cut_sig.len() % 4,
            1,
            "test needs an impossible base64 length"
        );
        assert_eq!(
            verify(&key(), &cfg(), cut, now),
            m(MalformedPart::SignatureBase64)
        );
        // Truncated to a whole number of base64 quanta: decodes, but the signature is short.
        let whole = &t.token[..t.token.len() - parts[2].len() % 4];
        assert_eq!(whole.rsplit('.').next().unwrap().len() % 4, 0);
        assert_eq!(
            verify(&key(), &cfg(), whole, now),
            Err(Rejection::BadSignature)
        );
        // Cut so the last symbol carries non-zero spare bits: not canonical base64url.
        let cut_more = &t.token[..t.token.len() - 4];
        assert_eq!(
            verify(&key(), &cfg(), cut_more, now),
            m(MalformedPart::SignatureBase64)
        );
        // Cut inside the header.
        assert_eq!(
            verify(&key(), &cfg(), &t.token[..5], now),
            m(MalformedPart::Shape)
        );
        assert_eq!(
            verify(&key(), &cfg(), &format!("*{}", &t.token[1..]), now),
            m(MalformedPart::HeaderBase64)
        );
        assert_eq!(
            verify(
                &key(),
                &cfg(),
                &format!("{}.{}.{}", b64("not json"), parts[1], parts[2]),
                now
            ),
            m(MalformedPart::HeaderJson)
        );
        assert_eq!(
            verify(
                &key(),
                &cfg(),
                &format!("{}.{}*.{}", parts[0], parts[1], parts[2]),
                now
            ),
            m(MalformedPart::PayloadBase64)
        );
        assert_eq!(
            verify(
                &key(),
                &cfg(),
                &format!("{}.{}.{}", parts[0], parts[1], "a+b/"),
                now
            ),
            m(MalformedPart::SignatureBase64)
        );
    }

    #[test]
    fn validly_signed_but_incomplete_claims_are_malformed() {
        #[derive(Serialize)]
        struct Partial {
            jti: String,
            exp: u64,
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".to_owned());
        let enc =
            jsonwebtoken::EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef").unwrap();
        let t = jsonwebtoken::encode(
            &header,
            &Partial {
                jti: "x".to_owned(),
                exp: u64::MAX / 2000,
            },
            &enc,
        )
        .unwrap();
        assert_eq!(
            verify(&key(), &cfg(), &t, Now::both(T0_MS)),
            Err(Rejection::Malformed(MalformedPart::Claims))
        );
    }

    #[test]
    fn oversized_tokens_are_rejected_before_decoding() {
        let huge = "a".repeat(cfg().token_len_max_bytes + 1);
        assert_eq!(
            verify(&key(), &cfg(), &huge, Now::both(T0_MS)),
            Err(Rejection::TooLong {
                len_bytes: 4097,
                max_bytes: 4096
            })
        );
        // Bound exactly at the good token's length accepts it; one byte less refuses it.
        let t = good();
        let exact = JwtConfig {
            token_len_max_bytes: t.token.len(),
            ..cfg()
        };
        assert!(verify(&key(), &exact, &t.token, Now::both(T0_MS)).is_ok());
        let less = JwtConfig {
            token_len_max_bytes: t.token.len() - 1,
            ..cfg()
        };
        assert!(matches!(
            verify(&key(), &less, &t.token, Now::both(T0_MS)),
            Err(Rejection::TooLong { .. })
        ));
        assert!(matches!(
            issue(&key(), &less, UserId(10086), 0xfeed, Now::both(T0_MS)),
            Err(JwtError::TooLong { .. })
        ));
    }

    #[test]
    fn rejection_messages_do_not_echo_the_token() {
        let t = good();
        let forged = with_header(&t.token, r#"{"alg":"RS256","kid":"k1"}"#);
        let msg = verify(&key(), &cfg(), &forged, Now::both(T0_MS))
            .unwrap_err()
            .to_string();
        assert!(!msg.contains(t.token.split('.').nth(1).unwrap()));
    }

    #[test]
    fn unverified_jti_reads_the_claim_without_trusting_it() {
        let key = SigningKey::new("k1", vec![7u8; 32]).unwrap();
        let cfg = JwtConfig::default();
        let t = issue(&key, &cfg, UserId(3), 99, Now::both(1_700_000_000_000)).unwrap();
        assert_eq!(unverified_jti(&t.token), Some(t.claims.jti));
        assert_eq!(unverified_jti("not-a-jwt"), None);
        assert_eq!(unverified_jti("a.%%%.c"), None);
    }
    /// Every token of the test and a range of clock readings around its window, through a
    /// `CheckedTokens` and through a full verification: the same answers and edge arrivals.
    #[test]
    fn checked_tokens_answer_as_a_full_verification() {
        let (k, c) = (key(), cfg());
        let t = good();
        let parts: Vec<&str> = t.token.split('.').collect();
        let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        sig[0] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(&sig));
        let other_key = SigningKey::new("k1", vec![9u8; 32]).unwrap();
        let foreign = issue(&other_key, &c, UserId(10086), 0xfeed, Now::both(T0_MS)).unwrap();
        let never_issued = issue(&k, &c, UserId(5), 0xbeef, Now::both(T0_MS)).unwrap();
        let leeway = JwtConfig {
            leeway_ms: 5_000,
            ..c.clone()
        };
        for cfg in [&c, &leeway] {
            let mut checked = CheckedTokens::default();
            checked.issued(&k, cfg, &t);
            for token in [&t.token, &flipped, &foreign.token, &never_issued.token] {
                for now_ms in [
                    T0_MS - 6_000,
                    T0_MS - 1,
                    T0_MS,
                    T0_MS + 59_999,
                    T0_MS + 60_000,
                ] {
                    let (mut hit, mut full) = (Edges::default(), Edges::default());
                    let now = Now::both(now_ms + 4_000);
                    assert_eq!(
                        checked.verify_counting(&k, cfg, token, now, &mut hit),
                        verify_counting(&k, cfg, token, now, &mut full),
                        "token {token} at {now_ms} ms"
                    );
                    assert_eq!(hit.take(), full.take());
                }
            }
            // The issued token and the one verified since; never a rejected one.
            assert_eq!(checked.len(), 2);
        }
    }

    #[test]
    fn checked_tokens_are_bounded() {
        let (k, c) = (key(), cfg());
        let t = good();
        let mut checked = CheckedTokens::default();
        for n in 0..=CheckedTokens::ENTRIES_MAX {
            let claims = Claims {
                jti: format!("{n:032x}"),
                ..t.claims.clone()
            };
            checked.remember(&format!("token {n}"), &claims);
            assert!(checked.len() <= CheckedTokens::ENTRIES_MAX);
        }
        assert_eq!(checked.len(), 1, "forgotten when full, then the new one");
        checked.issued(&k, &c, &t);
        assert_eq!(
            checked.verify_counting(&k, &c, &t.token, Now::both(T0_MS), &mut Edges::default()),
            Ok(t.claims)
        );
    }
}
