#![no_main]
//! `sut::token::jwt::verify` with an arbitrary token, secret, clock and leeway: a typed
//! rejection or claims inside their validity window, never a panic.

use libfuzzer_sys::fuzz_target;
use sut::clock::Now;
use sut::token::jwt::{JwtConfig, SigningKey, verify};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let (head, rest) = data.split_at(10);
    let now_ms = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
    let leeway_ms = u64::from(u16::from_le_bytes([head[8], head[9]]));
    // The rest: secret bytes, then 0xFF, then the token (an honest secret when none is given).
    let (secret, token) = match rest.iter().position(|&b| b == 0xFF) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"0123456789abcdef0123456789abcdef"[..], rest),
    };
    let mut secret = secret.to_vec();
    secret.resize(secret.len().max(32), 0);
    let Ok(key) = SigningKey::new("k1", secret) else {
        return;
    };
    let Ok(token) = std::str::from_utf8(token) else {
        return;
    };
    let cfg = JwtConfig {
        leeway_ms,
        ..JwtConfig::default()
    };
    if let Ok(claims) = verify(&key, &cfg, token, Now::both(now_ms)) {
        assert!(now_ms < claims.exp_ms().saturating_add(leeway_ms));
        assert!(now_ms.saturating_add(leeway_ms) >= claims.nbf_ms());
        assert_eq!(claims.iss, cfg.issuer);
    }
});
