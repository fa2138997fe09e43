//! Who is calling: the operator's secret (`/admin/*`, issuing JWTs, the ledger), the service
//! credential (the coordinator's calls to the participants), a user's JWT (one-time tokens,
//! draws, a draw's status), and the draw gate's I/O — verifying the JWT and
//! consuming the one-time token, here or at the deployment's token service. What the answers
//! mean is `sut::gate`'s.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode, header};
use sut::gate::GateRefusal;
use sut::token::jwt::{JwtConfig, SigningKey};
use sut::token::{ActivityKey, Claims, OnceKey, OnceRejection, OnceToken, Rejection, UserId};

use crate::AppState;
use crate::error::ApiError;
use crate::ids::lock;
use crate::tokens::Tokens;

/// How a process checks a user's JWT.
#[derive(Clone, Debug)]
pub enum Verifier {
    /// Its own token service: signature, claims and the revocation list.
    Service(Tokens),
    /// The shared key alone (a coordinator of a deployment): signature and claims; revocation
    /// is checked by the token service when the draw's one-time token is consumed there.
    Key(Arc<(SigningKey, JwtConfig)>),
}

/// How a process consumes a draw's one-time token.
#[derive(Clone, Debug)]
pub enum OnceConsumer {
    /// With its own token service's one-time token writer.
    Local(crate::once::OnceDesk),
    /// At the deployment's token service (`POST {url}/tokens/once/consume`, the user's JWT).
    Remote {
        /// The token service's base URL.
        url: String,
        /// The client.
        client: reqwest::Client,
    },
}

fn unauthorized(why: impl Into<String>) -> ApiError {
    ApiError::field(StatusCode::UNAUTHORIZED, "authorization", why)
}

/// The bearer credential of `headers` (the scheme's name in any case, RFC 7235 §2.1).
#[must_use]
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credential) = value.split_once(' ')?;
    let credential = credential.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_only_itself_whatever_its_length() {
        assert!(same_secret(b"an-admin-secret", b"an-admin-secret"));
        for other in [
            &b""[..],
            b"an-admin-secre",
            b"an-admin-secret!",
            b"An-admin-secret",
        ] {
            assert!(!same_secret(other, b"an-admin-secret"), "{other:?}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer(&h).map(str::to_owned)
        };
        for v in ["Bearer abc", "bearer abc", "BEARER abc", "BeArEr  abc"] {
            assert_eq!(with(v).as_deref(), Some("abc"), "{v}");
        }
        for v in ["Basic abc", "Bearer", "Bearer ", "Bearerabc", "abc"] {
            assert_eq!(with(v), None, "{v}");
        }
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}

/// Whether a presented credential is the secret, in a time that tells nothing of either: both
/// are hashed (SHA-256) and the digests compared byte by byte without an early exit, so neither
/// a matching prefix nor the secret's length shows in the answer's timing.
fn same_secret(presented: &[u8], secret: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(presented), Sha256::digest(secret));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Requires `Authorization: Bearer <the admin secret>` (compared in constant time). A server
/// without a secret accepts no one.
///
/// # Errors
/// 401 naming `authorization`.
pub fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(secret) = state.admin_token.as_deref() else {
        return Err(unauthorized(
            "this server has no admin secret: start it with --admin-token-file",
        ));
    };
    let presented = bearer(headers)
        .ok_or_else(|| unauthorized("missing `Authorization: Bearer <admin secret>`"))?;
    if same_secret(presented.as_bytes(), secret.as_bytes()) {
        Ok(())
    } else {
        Err(unauthorized("wrong admin secret"))
    }
}

/// Requires `Authorization: Bearer <the service credential>` (the coordinator's, compared in
/// constant time). The operator's secret is not it: the participants take TCC messages only
/// from the coordinator.
///
/// # Errors
/// 401 naming `authorization`.
pub fn service(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(secret) = state.service_token.as_deref() else {
        return Err(unauthorized(
            "this server has no service credential: start it with --service-token-file",
        ));
    };
    let presented = bearer(headers)
        .ok_or_else(|| unauthorized("missing `Authorization: Bearer <service credential>`"))?;
    if same_secret(presented.as_bytes(), secret.as_bytes()) {
        Ok(())
    } else {
        Err(unauthorized(
            "not the service credential (the participants' routes take the coordinator's, not \
             the operator's)",
        ))
    }
}

fn rejection(r: &Rejection) -> ApiError {
    match r {
        Rejection::StoreUnavailable(_) => ApiError::unavailable(r.to_string(), 1),
        _ => unauthorized(format!("the JWT is not accepted: {r}")),
    }
}

/// The verified claims of the caller's JWT (`Authorization: Bearer <JWT>`).
///
/// # Errors
/// 401 naming `authorization` (missing, malformed, forged, expired, `alg: none`, revoked), or
/// 404 on a process that verifies no JWTs.
pub async fn user(state: &AppState, headers: &HeaderMap) -> Result<(Claims, String), ApiError> {
    let token = bearer(headers)
        .ok_or_else(|| unauthorized("missing `Authorization: Bearer <JWT>`"))?
        .to_owned();
    let now = state.clock.now();
    let verifier = state.verifier.clone().ok_or_else(|| {
        ApiError::field(
            StatusCode::NOT_FOUND,
            "path",
            "this process verifies no JWTs",
        )
    })?;
    let claims = match verifier {
        Verifier::Key(key) => {
            sut::token::jwt::verify(&key.0, &key.1, &token, now).map_err(|r| rejection(&r))?
        }
        Verifier::Service(tokens) => {
            let jwt = token.clone();
            tokio::task::spawn_blocking(move || lock(&tokens).verify(&jwt, now))
                .await
                .map_err(|e| ApiError::internal(format!("worker task: {e}")))?
                .map_err(|r| rejection(&r))?
        }
    };
    Ok((claims, token))
}

/// Whether a user's JWT is still good where revocations are kept: a coordinator of a
/// deployment verifies JWTs by the shared key alone, so before it answers a read it asks the
/// token service (`POST {url}/tokens/verify`). A process with its own token service checked
/// revocation already ([`user`]); a draw is checked by the token service when its one-time token
/// is consumed there.
///
/// # Errors
/// 401 naming `authorization` when the token service refuses the JWT (revoked), 503 when it
/// cannot be reached or answers otherwise.
pub async fn not_revoked(state: &AppState, jwt: &str) -> Result<(), ApiError> {
    let (Some(Verifier::Key(_)), Some(OnceConsumer::Remote { url, client })) =
        (&state.verifier, &state.once)
    else {
        return Ok(());
    };
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::unavailable(format!("token service {url}: {e}"), 1);
    let response = client
        .post(format!("{url}/tokens/verify"))
        .json(&serde_json::json!({ "token": jwt }))
        .send()
        .await
        .map_err(|e| unreachable(&e))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    if status == StatusCode::UNAUTHORIZED {
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let why = body
            .get("error")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("refused");
        return Err(unauthorized(format!(
            "the JWT is not accepted by the token service: {why}"
        )));
    }
    Err(unreachable(&format!("answered {status}")))
}

/// The caller's user id, which must be `user` (a body naming the user it acts for).
///
/// # Errors
/// 401 for a JWT that names no user, 403 naming `user` when the JWT is another user's.
pub fn acting_for(caller: &crate::Caller, user: u64) -> Result<UserId, ApiError> {
    sut::gate::drawer(&caller.claims, Some(user)).map_err(|r| gate_error(&r))
}

/// A gate refusal as HTTP: 401 for a token that names no user; 404 naming `activity` for an
/// unregistered activity and 409 for a closed one; 403 naming the field at fault otherwise
/// (another user, another user's or activity's one-time token, a price or a luck the client may
/// not choose).
#[must_use]
pub fn gate_error(r: &GateRefusal) -> ApiError {
    let (status, field) = match r {
        GateRefusal::BadSubject { .. } => return unauthorized(r.to_string()),
        GateRefusal::UnknownActivity { .. } | GateRefusal::UnknownOnceActivity { .. } => {
            (StatusCode::NOT_FOUND, "activity")
        }
        GateRefusal::Closed { .. } => (StatusCode::CONFLICT, "activity"),
        GateRefusal::OtherUser { .. } => (StatusCode::FORBIDDEN, "user"),
        GateRefusal::ForeignOnceToken { .. } | GateRefusal::OtherActivity { .. } => {
            (StatusCode::FORBIDDEN, "once_token")
        }
        GateRefusal::ForcedOutcome => (StatusCode::FORBIDDEN, "won"),
        GateRefusal::OtherPrice { .. } => (StatusCode::FORBIDDEN, "price_minor"),
    };
    ApiError::field(status, field, r.to_string())
}

/// A one-time token refusal as HTTP, naming `field`.
#[must_use]
pub fn once_rejection(r: OnceRejection, field: &str) -> ApiError {
    let status = match r {
        OnceRejection::Unknown => StatusCode::NOT_FOUND,
        OnceRejection::Foreign => StatusCode::FORBIDDEN,
        OnceRejection::AlreadyConsumed => StatusCode::CONFLICT,
        OnceRejection::Expired => StatusCode::GONE,
        OnceRejection::OtherActivity => StatusCode::FORBIDDEN,
    };
    let field = match r {
        OnceRejection::Foreign => "user",
        OnceRejection::OtherActivity if field == "token" => "activity",
        _ => field,
    };
    ApiError::field(status, field, r.to_string())
}

/// `POST /tokens/once/consume`'s answer, as the coordinator reads it.
#[derive(serde::Deserialize)]
struct Consumed {
    activity: String,
    window_start_ms: u64,
}

/// Consumes `token` for `user` (whose JWT is `jwt`) and `activity`: here, or at the token
/// service. A token of another activity is refused and stays unused.
///
/// # Errors
/// The token's refusal (naming `once_token`), or 503 when the token service cannot be reached.
pub async fn consume_once(
    state: &AppState,
    jwt: &str,
    user: UserId,
    token: OnceToken,
    activity: &ActivityKey,
) -> Result<OnceKey, ApiError> {
    let now = state.clock.now();
    let consumer = state.once.clone().ok_or_else(|| {
        ApiError::field(
            StatusCode::NOT_FOUND,
            "path",
            "this process consumes no one-time tokens",
        )
    })?;
    match consumer {
        OnceConsumer::Local(desk) => desk
            .consume(token, user, Some(activity.clone()), now)
            .await
            .map_err(|e| ApiError::unavailable(format!("token store: {e}"), 1))?
            .map_err(|r| once_rejection(r, "once_token")),
        OnceConsumer::Remote { url, client } => {
            consume_remote(&client, &url, jwt, user, token, activity).await
        }
    }
}

async fn consume_remote(
    client: &reqwest::Client,
    url: &str,
    jwt: &str,
    user: UserId,
    token: OnceToken,
    activity: &ActivityKey,
) -> Result<OnceKey, ApiError> {
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::unavailable(format!("token service {url}: {e}"), 1);
    let response = client
        .post(format!("{url}/tokens/once/consume"))
        .bearer_auth(jwt)
        .json(&serde_json::json!({
            "user": user.0,
            "token": token.to_string(),
            "activity": activity.to_string(),
        }))
        .send()
        .await
        .map_err(|e| unreachable(&e))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.map_err(|e| unreachable(&e))?;
    if status.is_success() {
        let consumed: Consumed = serde_json::from_value(body).map_err(|e| unreachable(&e))?;
        let activity = ActivityKey::new(consumed.activity)
            .ok_or_else(|| ApiError::internal("token service: an empty activity"))?;
        return Ok(OnceKey {
            user,
            activity,
            window_start_ms: consumed.window_start_ms,
        });
    }
    let error = body
        .get("error")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("refused")
        .to_owned();
    if status.is_server_error() {
        return Err(ApiError::unavailable(format!("token service: {error}"), 1));
    }
    let field = match body.get("field").and_then(serde_json::Value::as_str) {
        Some("token" | "activity") | None => "once_token",
        Some("authorization") => "authorization",
        Some(_) => "user",
    };
    Err(ApiError::field(
        status,
        field,
        format!("token service: {error}"),
    ))
}

/// A per-user limiter of a process (draws, one-time token issues).
pub type Limiter = Arc<Mutex<sut::gate::RateLimiter>>;

/// Wrong secrets (the operator's, the service credential) per peer address: a bucket of
/// [`WRONG_SECRETS_BURST`] refilled at [`WRONG_SECRETS_PER_S`]; an address whose bucket is
/// empty is refused every credential, the right one included, until it refills, so that a
/// guesser learns nothing faster than that.
pub type SecretThrottle = Arc<Mutex<sut::gate::RateLimiter<std::net::IpAddr>>>;
/// Wrong secrets one address may present at once.
pub const WRONG_SECRETS_BURST: u32 = 20;
/// Wrong secrets one address may present per second after that.
pub const WRONG_SECRETS_PER_S: f64 = 1.0;
/// Addresses tracked at most (the idlest half forgotten beyond).
pub const WRONG_SECRETS_ADDRESSES_MAX: usize = 10_000;

/// A new [`SecretThrottle`].
#[must_use]
pub fn secret_throttle() -> SecretThrottle {
    Arc::new(Mutex::new(sut::gate::RateLimiter::new(
        WRONG_SECRETS_PER_S,
        WRONG_SECRETS_BURST,
        WRONG_SECRETS_ADDRESSES_MAX,
    )))
}

/// Refuses a peer that presented too many wrong secrets, before its credential is looked at.
///
/// # Errors
/// 429 naming `authorization`, with `Retry-After`.
pub fn not_throttled(state: &AppState, peer: Option<std::net::IpAddr>) -> Result<(), ApiError> {
    let Some(ip) = peer else {
        return Ok(());
    };
    let now_ms = state.clock.now().wall_ms;
    match lock(&state.secret_throttle).waiting(ip, now_ms) {
        None => Ok(()),
        Some(wait_ms) => Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            error: format!("too many wrong credentials from {ip}: next try in {wait_ms} ms"),
            field: Some("authorization".to_owned()),
            retry_after_s: Some(wait_ms.div_ceil(1000).max(1)),
        }),
    }
}

/// Counts a refused secret against `peer`. Not a guess, and not counted: no credential at all,
/// or another of this server's secrets presented where it is not taken (the operator's on a
/// participant's route).
pub fn wrong_secret(state: &AppState, peer: Option<std::net::IpAddr>, headers: &HeaderMap) {
    let (Some(ip), Some(presented)) = (peer, bearer(headers)) else {
        return;
    };
    let known = [state.admin_token.as_deref(), state.service_token.as_deref()]
        .into_iter()
        .flatten()
        .any(|secret| same_secret(presented.as_bytes(), secret.as_bytes()));
    if !known {
        let now_ms = state.clock.now().wall_ms;
        let _ = lock(&state.secret_throttle).take(ip, now_ms);
    }
}

/// Takes one of `user`'s `what` from `limiter`.
///
/// # Errors
/// 429 naming `user`, with `Retry-After`, when the user is over the rate.
pub fn within_rate(
    limiter: &Limiter,
    user: UserId,
    now_ms: u64,
    what: &str,
) -> Result<(), ApiError> {
    lock(limiter)
        .take(user, now_ms)
        .map_err(|wait_ms| ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            error: format!(
                "user {} asks for {what} too fast: next in {wait_ms} ms",
                user.0
            ),
            field: Some("user".to_owned()),
            retry_after_s: Some(wait_ms.div_ceil(1000).max(1)),
        })
}
