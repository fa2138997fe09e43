//! Token routes over [`TokenService`] (`sut::token`): JWT issue, verify and revoke, one-time
//! submit tokens. Handlers only parse, call the service and map its typed answers to HTTP.
//!
//! The service and its store (SQLite or PostgreSQL) sit behind one mutex and run on the blocking
//! pool: each revocation is its own `synchronous=FULL` transaction, so a 2xx revoke is on disk
//! when it is answered. One-time tokens go through their own writer ([`crate::once`]) with group
//! commit: a 2xx issue or consume is answered only after its batch is durable.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::db::TokenStoreBox;
use super::error::{ApiError, ErrorBody};
use super::extract::JsonBody;
use super::ids::lock;
use super::openapi::{ClaimsSchema, RevokeOutcomeSchema};
use sut::token::{
    ActivityKey, OnceToken, Rejection, RevokeOutcome, TokenService, TokenStoreError, UserId,
    service::RevokeError,
};

/// The server's token service.
pub type Tokens = Arc<Mutex<TokenService<TokenStoreBox>>>;

/// 128 bits from the OS.
pub fn nonce() -> Result<u128, ApiError> {
    let mut buf = [0u8; 16];
    getrandom::fill(&mut buf).map_err(|e| ApiError::internal(format!("randomness: {e}")))?;
    Ok(u128::from_le_bytes(buf))
}

/// The value of the next one-time token: [`nonce`], or under the planted weakness
/// `sequential_tokens` one more than the last.
fn once_nonce(state: &AppState) -> Result<u128, ApiError> {
    match &state.sequential_tokens {
        Some(last) => {
            let mut last = lock(last);
            *last += 1;
            Ok(*last)
        }
        None => nonce(),
    }
}

fn store_error(e: &TokenStoreError) -> ApiError {
    match e {
        TokenStoreError::Full { .. } => ApiError::unavailable(e.to_string(), 5),
        TokenStoreError::TokenCollision => ApiError::unavailable(e.to_string(), 1),
        // The clock is behind an earlier purge: the window is over once it catches up.
        TokenStoreError::WindowOver { .. } => ApiError::unavailable(e.to_string(), 1),
        TokenStoreError::Backend(_) => ApiError::internal(e.to_string()),
    }
}

fn rejection(r: &Rejection) -> ApiError {
    match r {
        Rejection::StoreUnavailable(_) => ApiError::unavailable(r.to_string(), 1),
        _ => ApiError::field(StatusCode::UNAUTHORIZED, "token", r.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker task: {e}")))?
}

/// `POST /tokens` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueBody {
    /// The subject.
    pub user: u64,
}

/// A JWT and its claims.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct IssuedBody {
    /// The compact JWS.
    pub token: String,
    /// Its claims.
    #[schema(value_type = ClaimsSchema)]
    pub claims: sut::token::Claims,
}

/// `POST /tokens`.
#[utoipa::path(
    post,
    path = "/tokens",
    tag = "tokens",
    summary = "Issue an HS256 JWT (the identity provider's route: admin secret)",
    request_body = IssueBody,
    params(("Authorization" = String, Header, description = "`Bearer <admin secret>`")),
    responses(
        (status = 200, description = "Issued", body = IssuedBody),
        (status = 401, description = "No or a wrong admin secret (`field: authorization`)", body = ErrorBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
pub async fn issue(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<IssueBody>,
) -> Result<Json<IssuedBody>, ApiError> {
    let nonce = nonce()?;
    let now = state.clock.now();
    let issued = lock(state.tokens()?)
        .issue(UserId(body.user), nonce, now)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(IssuedBody {
        token: issued.token,
        claims: issued.claims,
    }))
}

/// A body naming a token.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The JWT.
    pub token: String,
}

/// `POST /tokens/verify` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct VerifiedBody {
    /// Always true (a rejection is a 401).
    pub valid: bool,
    /// The claims.
    #[schema(value_type = ClaimsSchema)]
    pub claims: sut::token::Claims,
}

/// `POST /tokens/verify`: 200 with the claims, or 401 naming `token` with the reason.
#[utoipa::path(
    post,
    path = "/tokens/verify",
    tag = "tokens",
    summary = "Verify a JWT",
    request_body = TokenBody,
    responses(
        (status = 200, description = "Valid", body = VerifiedBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 401, description = "Rejected: bad signature, `alg: none`, expired, revoked, malformed ... (`field: token`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
pub async fn verify(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenBody>,
) -> Result<Json<VerifiedBody>, ApiError> {
    let now = state.clock.now();
    let tokens = Arc::clone(state.tokens()?);
    let claims = blocking(move || {
        lock(&tokens)
            .verify(&body.token, now)
            .map_err(|r| rejection(&r))
    })
    .await?;
    Ok(Json(VerifiedBody {
        valid: true,
        claims,
    }))
}

/// `POST /tokens/revoke` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RevokedBody {
    /// What the revocation did.
    #[schema(value_type = RevokeOutcomeSchema)]
    pub outcome: RevokeOutcome,
}

/// `POST /tokens/revoke`: only a token that verifies can be revoked.
#[utoipa::path(
    post,
    path = "/tokens/revoke",
    tag = "tokens",
    summary = "Revoke a JWT",
    request_body = TokenBody,
    responses(
        (status = 200, description = "Revoked", body = RevokedBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 401, description = "The token does not verify (`field: token`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
pub async fn revoke(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenBody>,
) -> Result<Json<RevokedBody>, ApiError> {
    let now = state.clock.now();
    let tokens = Arc::clone(state.tokens()?);
    let outcome = blocking(move || {
        lock(&tokens).revoke(&body.token, now).map_err(|e| match e {
            RevokeError::Rejected(r) => rejection(&r),
            RevokeError::Store(s) => store_error(&s),
        })
    })
    .await?;
    Ok(Json(RevokedBody { outcome }))
}

/// `POST /tokens/once` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OnceIssueBody {
    /// The user.
    pub user: u64,
    /// A registered activity's id, in decimal (`GET /activities`).
    #[schema(min_length = 1, max_length = 64)]
    pub activity: String,
}

/// A one-time token.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OnceBody {
    /// 32 hex digits.
    pub token: String,
    /// End of its window, ms.
    pub expires_at_ms: u64,
    /// Created by this call.
    pub fresh: bool,
    /// Already used.
    pub consumed: bool,
}

/// `POST /tokens/once`: the one-time token of (user, activity, this hour), created once.
#[utoipa::path(
    post,
    path = "/tokens/once",
    tag = "tokens",
    summary = "The one-time token of (user, activity, this hour), for the JWT's user",
    request_body = OnceIssueBody,
    params(("Authorization" = String, Header, description = "`Bearer <JWT>` of `user`")),
    responses(
        (status = 401, description = "No JWT, or one that does not verify (`field: authorization`)", body = ErrorBody),
        (status = 403, description = "The JWT is another user's (`field: user`)", body = ErrorBody),
        (status = 404, description = "The activity is not registered (`field: activity`); nothing is issued", body = ErrorBody),
        (status = 429, description = "This user asks for tokens too fast; retry after `Retry-After` seconds (`field: user`)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 201, description = "Created", body = OnceBody),
        (status = 200, description = "Existing", body = OnceBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
pub async fn once_issue(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<crate::Caller>,
    JsonBody(body): JsonBody<OnceIssueBody>,
) -> Result<(StatusCode, Json<OnceBody>), ApiError> {
    let user = crate::auth::acting_for(&caller, body.user)?;
    let activity = ActivityKey::new(body.activity).ok_or_else(|| {
        ApiError::bad(
            "activity",
            format!(
                "activity must be 1..={} bytes",
                sut::token::ACTIVITY_KEY_LEN_MAX_BYTES
            ),
        )
    })?;
    // Tokens only for the operator's activities: a client cannot fill the table with keys of
    // its own invention.
    sut::gate::once_token_activity(&state.activities()?.snapshot(), &activity)
        .map_err(|r| crate::auth::gate_error(&r))?;
    // A quota per user: one user cannot fill the table for everyone.
    let now = state.clock.now();
    crate::auth::within_rate(&state.once_limiter, user, now.wall_ms, "one-time tokens")?;
    let nonce = once_nonce(&state)?;
    let issued = state
        .once_desk()?
        .issue(user, activity, nonce, now)
        .await
        .map_err(|e| store_error(&e))?;
    let status = if issued.fresh {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(OnceBody {
            token: issued.token.to_string(),
            expires_at_ms: issued.expires_at_ms,
            fresh: issued.fresh,
            consumed: issued.consumed,
        }),
    ))
}

/// `POST /tokens/once/consume` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumeBody {
    /// The user.
    pub user: u64,
    /// The token (32 hex digits).
    #[schema(pattern = "^[0-9a-fA-F]{32}$")]
    pub token: String,
    /// The activity the token is presented for: a token of another activity is refused (403,
    /// `field: activity`) and stays unused. Absent: any activity.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub activity: Option<String>,
}

/// `POST /tokens/once/consume` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConsumedBody {
    /// Always true (a refusal is 4xx).
    pub accepted: bool,
    /// The activity the token was for.
    pub activity: String,
    /// Its window.
    pub window_start_ms: u64,
}

/// `POST /tokens/once/consume`: exactly one consume of a token is accepted.
#[utoipa::path(
    post,
    path = "/tokens/once/consume",
    tag = "tokens",
    summary = "Consume a one-time token, as its user",
    request_body = ConsumeBody,
    params(("Authorization" = String, Header, description = "`Bearer <JWT>` of `user`")),
    responses(
        (status = 401, description = "No JWT, or one that does not verify (`field: authorization`)", body = ErrorBody),
        (status = 200, description = "Accepted", body = ConsumedBody),
        (status = 400, description = "Malformed JSON (`field: body`) or a value out of range (names the field)", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB (`field: body`)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON: its Content-Type is not `application/json` (`field: content-type`)", body = ErrorBody),
        (status = 422, description = "A wrong type, a missing or an unknown field (names it)", body = ErrorBody),
        (status = 403, description = "Another user's token (`field: user`), or a token of another activity than `activity` (`field: activity`; it stays unused)", body = ErrorBody),
        (status = 404, description = "Unknown token (`field: token`)", body = ErrorBody),
        (status = 409, description = "Already used (`field: token`)", body = ErrorBody),
        (status = 410, description = "Expired (`field: token`)", body = ErrorBody),
        (status = 503, description = "Overloaded or a store temporarily unavailable; retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    )
)]
pub async fn once_consume(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<crate::Caller>,
    JsonBody(body): JsonBody<ConsumeBody>,
) -> Result<Json<ConsumedBody>, ApiError> {
    let user = crate::auth::acting_for(&caller, body.user)?;
    let token = OnceToken::parse(&body.token)
        .ok_or_else(|| ApiError::bad("token", "token must be 32 hex digits"))?;
    let activity = body
        .activity
        .map(|a| {
            ActivityKey::new(a).ok_or_else(|| {
                ApiError::bad(
                    "activity",
                    format!(
                        "activity must be 1..={} bytes",
                        sut::token::ACTIVITY_KEY_LEN_MAX_BYTES
                    ),
                )
            })
        })
        .transpose()?;
    let now = state.clock.now();
    let key = match state.once_desk()?.consume(token, user, activity, now).await {
        Ok(Ok(key)) => key,
        Ok(Err(r)) => return Err(crate::auth::once_rejection(r, "token")),
        Err(e) => return Err(store_error(&e)),
    };
    Ok(Json(ConsumedBody {
        accepted: true,
        activity: key.activity.to_string(),
        window_start_ms: key.window_start_ms,
    }))
}
